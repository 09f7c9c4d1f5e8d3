//! The peers, side by side: `bench/peers.py` times `torch.softmax`, the seed's five-op PyTorch
//! softmax and a one-row-per-program Triton kernel on the same shapes, with the same byte
//! count and the same timing method, and writes rows in the benchmark's CSV format. With
//! `--op`/`--dtype` it times `torch.softmax`, `torch.log_softmax` or PyTorch's fused softmax
//! backward (`torch._softmax_backward_data`) in that dtype.

use std::path::Path;
use std::process::Command;

use super::{BenchConfig, Measurement, Outcome, is_default_run};
use crate::shape::Shape;

/// Where the script lives, relative to the repository root the benchmark runs from.
const SCRIPT: &str = "bench/peers.py";
/// The script's exit status when PyTorch cannot be imported.
const NO_PYTORCH: i32 = 3;

/// Runs the peers and returns their measurements, with % of copy taken against the copy this
/// run measured for the same shape. Without Python, PyTorch or the script it says so and
/// returns nothing: the benchmark goes on without peers.
pub(super) fn run(
    shapes: &[Shape],
    config: &BenchConfig,
    ours: &[Measurement],
) -> Vec<Measurement> {
    if !Path::new(SCRIPT).is_file() {
        eprintln!(
            "peers: {SCRIPT} not found (run the benchmark from the repository root); going on without peers"
        );
        return Vec::new();
    }
    let csv = config
        .out_dir
        .join(if is_default_run(config.op, config.dtype) {
            "peers.csv".to_owned()
        } else {
            format!("peers-{}-{}.csv", config.op, config.dtype.name())
        });
    let shape_list: Vec<String> = shapes.iter().map(Shape::to_string).collect();
    let status = Command::new("python3")
        .arg(SCRIPT)
        .args([
            "--shapes",
            &shape_list.join(","),
            "--iters",
            &config.iters.to_string(),
        ])
        .args([
            "--warmup",
            &config.warmup.to_string(),
            "--device",
            &config.device.to_string(),
        ])
        .args(["--op", config.op.name(), "--dtype", config.dtype.name()])
        .arg("--out")
        .arg(&csv)
        .status();
    match status {
        Err(error) => {
            eprintln!("peers: cannot run python3 ({error}); going on without peers");
            return Vec::new();
        }
        Ok(status) if status.code() == Some(NO_PYTORCH) => {
            eprintln!("peers: PyTorch is not installed; going on without peers");
            return Vec::new();
        }
        Ok(status) if !status.success() => {
            eprintln!("peers: {SCRIPT} failed ({status}); going on without peers");
            return Vec::new();
        }
        Ok(_) => {}
    }
    let text = std::fs::read_to_string(&csv).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| parse_row(line, ours))
        .collect()
}

/// One CSV row of the script, re-based on this run's copy: % of copy is the peer's GB/s over
/// the GB/s of the copy this run measured (the same as the ratio of times when both move the
/// same bytes, as forward calls do).
fn parse_row(line: &str, ours: &[Measurement]) -> Option<Measurement> {
    let fields: Vec<&str> = line.split(',').collect();
    let [variant, dtype, rows, cols, median_ms, gbps, _pct] = fields[..] else {
        return None;
    };
    let (rows, cols): (usize, usize) = (rows.parse().ok()?, cols.parse().ok()?);
    let (median_ms, gbps): (f64, f64) = (median_ms.parse().ok()?, gbps.parse().ok()?);
    let copy = ours
        .iter()
        .find(|m| m.variant == "copy" && m.rows == rows && m.cols == cols)?;
    let Outcome::Timed {
        gbps: copy_gbps, ..
    } = copy.outcome
    else {
        return None;
    };
    let library = if variant.starts_with("triton") {
        "triton"
    } else {
        "pytorch"
    };
    Some(Measurement {
        variant: variant.to_owned(),
        dtype: dtype.to_owned(),
        rows,
        cols,
        kernels: vec![library.to_owned()],
        outcome: Outcome::Timed {
            median_ms,
            gbps,
            pct_of_copy: 100.0 * gbps / copy_gbps,
        },
    })
}
