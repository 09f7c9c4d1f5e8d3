//! `host`: the command-line face of the library. `host bench` is the main job.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softmax::bench::{self, BenchConfig, BenchOp, TimingModes};
use softmax::{DType, Shape, Variant};

#[derive(Parser, Debug)]
#[command(
    name = "host",
    version,
    about = "Row-wise softmax on NVIDIA GPUs, every kernel in Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Time every variant on every shape beside a device-to-device copy (the roofline) and,
    /// with --peers, PyTorch and Triton; print a table, write CSV, JSON and charts.
    Bench(BenchArgs),
    /// Time the production kernels on each shape and record the fastest for `auto` in the
    /// tune cache file, so later runs of `auto` use it (auto never tunes by itself).
    Tune {
        /// Shapes as ROWSxCOLS, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = parse_shape, required = true)]
        shapes: Vec<Shape>,
        /// The cache file (default: $SOFTMAX_TUNE_CACHE, else ~/.cache/softmax-rs/tune.json).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: u32,
    },
    /// Seconds for `Softmax::new` and the first call into each kernel module in a fresh
    /// process, with the driver's JIT cache off and warm (each in a child process); writes
    /// `<out>/<device>-coldstart.csv`.
    Coldstart {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// Directory for the CSV.
        #[arg(long, default_value = "bench/results")]
        out: PathBuf,
    },
    /// CPU time per call with plans cached (argument checks, plan lookup, enqueue) for f32
    /// `run`, bf16 `forward` and an f32 operation with options.
    Overhead {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: u32,
    },
    /// Plan every production call kind over a dense sweep of shapes and print the kernel
    /// entries the plans use on this device, for `auto` and for any production variant (what
    /// the instance tables must keep).
    Entries {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: u32,
    },
    /// Redraw the charts of a saved benchmark run (its .json) without a GPU.
    Chart {
        /// The run's JSON, e.g. bench/results/nvidia-h200.json.
        json: PathBuf,
        /// Directory for the charts (default: the JSON's directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Shapes as ROWSxCOLS, comma-separated (default: the seeds' sweep and the LLM shapes).
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    shapes: Vec<Shape>,
    /// Variants, comma-separated (default: all). Names: auto, unfused, thread-naive,
    /// thread-online, block-smem (or `block-smem:THREADS`), block-smem-autotuned, warp-online,
    /// registers, block-registers, row-slices, row-cluster.
    #[arg(long, value_delimiter = ',', value_parser = parse_variant)]
    variants: Vec<Variant>,
    /// Timed samples per measurement (the median is reported).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Launches before timing.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// Directory for the CSV, JSON and charts.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// A few shapes only, for a smoke run.
    #[arg(long, conflicts_with_all = ["shapes", "boundaries", "grid"])]
    quick: bool,
    /// Widths every 64 columns across each dispatch boundary (the no-cliff check).
    #[arg(long, conflicts_with = "shapes")]
    boundaries: bool,
    /// The rows × columns grid: rows 1, 2, 4, … (while a tensor stays within 2 GiB) of
    /// 1000 … 1048576 columns, for the heatmaps of bench/grid_heatmap.py.
    #[arg(long, conflicts_with_all = ["shapes", "boundaries"])]
    grid: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Also run bench/peers.py (needs python3 with PyTorch; Triton optional).
    #[arg(long)]
    peers: bool,
    /// What to time: softmax, log-softmax, or backward (the softmax gradient from y and dy;
    /// bytes: y and dy read, dx written). Anything but f32 softmax times `auto` through the
    /// operation API beside the copy and the peers.
    #[arg(long, default_value = "softmax", value_parser = parse_op)]
    op: BenchOp,
    /// Element type of every tensor, input and output alike: f32, bf16 or f16. The seeds'
    /// sweep keeps about 200 MB per input tensor of that type.
    #[arg(long, default_value = "f32", value_parser = bench::parse_dtype)]
    dtype: DType,
    /// How samples are timed: isolated (the L2 flushed before each launch, each launch alone
    /// between two events; also times the floor, an empty launch plus one device-memory round
    /// trip), back-to-back (about 0.5 ms of consecutive launches per sample), or both.
    #[arg(long, default_value = "both", value_parser = parse_timing)]
    timing: TimingModes,
}

fn parse_shape(text: &str) -> Result<Shape, String> {
    text.parse()
}

fn parse_op(text: &str) -> Result<BenchOp, String> {
    text.parse()
}

fn parse_timing(text: &str) -> Result<TimingModes, String> {
    text.parse()
}

fn parse_variant(text: &str) -> Result<Variant, String> {
    text.parse().map_err(|e: softmax::Error| e.to_string())
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Bench(args) => bench(args),
        Command::Tune {
            shapes,
            cache,
            device,
        } => match tune(&shapes, cache, device) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("host tune: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Coldstart { device, out } => match coldstart(device, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("host coldstart: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Overhead { device } => match bench::overhead::measure(device) {
            Ok(results) => {
                for (what, microseconds) in results {
                    println!("{microseconds:>6.2} µs per call: {what}");
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("host overhead: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Entries { device } => match entries(device) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("host entries: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Chart { json, out } => {
            let dir = out.unwrap_or_else(|| json.parent().map(PathBuf::from).unwrap_or_default());
            match bench::Report::load(&json).and_then(|report| report.draw_charts(&dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("host chart: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn bench(args: BenchArgs) -> ExitCode {
    let default_run = bench::is_default_run(args.op, args.dtype);
    if !default_run && args.variants.iter().any(|&v| v != Variant::Auto) {
        eprintln!(
            "host bench: --variants applies to f32 softmax only; --op {} --dtype {} times `auto` \
             through the operation API",
            args.op,
            args.dtype.name()
        );
        return ExitCode::from(2);
    }
    let shapes = if args.quick {
        bench::quick_shapes()
    } else if args.boundaries {
        bench::boundary_shapes_for(args.dtype)
    } else if args.grid {
        bench::grid_shapes_for(args.dtype)
    } else if args.shapes.is_empty() {
        [
            bench::seed_sweep_shapes_for(args.dtype),
            bench::llm_shapes(),
        ]
        .concat()
    } else {
        args.shapes
    };
    let variants = if args.variants.is_empty() {
        Variant::all().to_vec()
    } else {
        args.variants
    };
    let config = BenchConfig {
        shapes,
        variants,
        iters: args.iters as usize,
        warmup: args.warmup as usize,
        out_dir: args.out,
        device: args.device,
        peers: args.peers,
        op: args.op,
        dtype: args.dtype,
        timing: args.timing,
    };
    match bench::run(&config) {
        Ok(report) => {
            println!(
                "{} ({} SMs, driver {}), kernels: {}, commit {}, {}",
                report.device.name,
                report.device.multiprocessors,
                report.device.driver_version,
                report.kernels,
                report.git_commit,
                report.date
            );
            print!("{}", report.table());
            println!("\nresults written to {}", config.out_dir.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("host bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn coldstart(device: u32, out: &std::path::Path) -> softmax::Result<()> {
    use bench::coldstart;
    if std::env::var_os(coldstart::CHILD_ENV).is_some() {
        return coldstart::child(device);
    }
    let results = coldstart::measure(device)?;
    let name = softmax::Softmax::on_device(device)?.device().slug();
    for row in &results {
        println!(
            "{:<24} JIT cache {:<4} {:>8.3} s",
            row.what, row.jit_cache, row.seconds
        );
    }
    let path = coldstart::write_csv(out, &name, &results)?;
    println!("wrote {}", path.display());
    Ok(())
}

fn tune(shapes: &[Shape], cache: Option<PathBuf>, device: u32) -> softmax::Result<()> {
    use softmax::cust::memory::DeviceBuffer;
    // `tune` writes the cache that `auto` reads: the one named, else the default file.
    let mut softmax = softmax::Softmax::on_device(device)?
        .with_tune_cache(cache.or_else(softmax::autotune::default_path))?;
    for &shape in shapes {
        let values: Vec<f32> = (0..shape.len())
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 5.0)
            .collect();
        let cuda = |source: cust::error::CudaError| softmax::Error::Cuda {
            during: "allocating tuning buffers",
            source: source.into(),
        };
        let input = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let mut output = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let chosen = softmax.tune(&input, &mut output, shape)?;
        println!("{shape}: auto runs {chosen}");
    }
    Ok(())
}

/// `host entries`: the entries `auto` (and the other production variants) plan over rows
/// 1..65536 and widths 1..2^21 (geometric steps of 6%, each with residues 0, 1, 3, 5 and 7),
/// one a line after `auto` or `variants` (an entry, and the block size where the entry takes it
/// at launch).
fn entries(device: u32) -> softmax::Result<()> {
    use softmax::CallKind;
    use std::collections::BTreeSet;

    let mut softmax = softmax::Softmax::on_device(device)?;
    let mut auto_kinds = vec![CallKind::Run(Variant::Auto)];
    for input in DType::ALL {
        for masked in [false, true] {
            auto_kinds.push(CallKind::Forward { input, masked });
            auto_kinds.push(CallKind::RowStates { input, masked });
        }
        auto_kinds.push(CallKind::Backward { input });
    }
    let variant_kinds = Variant::PRODUCTION.map(CallKind::Run);
    let mut widths = BTreeSet::new();
    let mut width = 1.0f64;
    while width <= f64::from(1u32 << 21) {
        let base = width as usize;
        widths.extend([0, 1, 3, 5, 7].map(|residue| base + residue));
        width *= 1.06;
    }
    let rows = [1usize, 2, 3, 8, 16, 32, 64, 128, 256, 1024, 8192, 65536];
    let (mut auto, mut variants) = (BTreeSet::new(), BTreeSet::new());
    for &r in &rows {
        for &c in &widths {
            let Ok(shape) = Shape::new(r, c) else {
                continue;
            };
            for &kind in &auto_kinds {
                auto.extend(softmax.planned_entries(kind, shape)?);
            }
            for &kind in &variant_kinds {
                variants.extend(softmax.planned_entries(kind, shape)?);
            }
        }
    }
    for name in &auto {
        println!("auto {name}");
    }
    for name in variants.difference(&auto) {
        println!("variants {name}");
    }
    eprintln!(
        "{} entries planned by auto, {} more by the other production variants",
        auto.len(),
        variants.difference(&auto).count()
    );
    Ok(())
}
