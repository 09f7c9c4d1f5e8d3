//! The peers, side by side: `bench/peers.py` times `torch.softmax`, the seed's five-op PyTorch
//! softmax and a one-row-per-program Triton kernel on the same shapes, with the same byte
//! count and the same timing method, and writes rows in the benchmark's CSV format. With
//! `--op`/`--dtype` it times `torch.softmax`, `torch.log_softmax` or PyTorch's fused softmax
//! backward (`torch._softmax_backward_data`) in that dtype. `--timing` tells it the modes to
//! time; each of its rows names its mode in the last column.

use std::path::Path;
use std::process::Command;

use super::{BenchConfig, Measurement, Outcome, Timing, is_default_run};
use crate::shape::Shape;

/// Where the script lives, relative to the repository root the benchmark runs from.
const SCRIPT: &str = "bench/peers.py";
/// The script's exit status when PyTorch cannot be imported.
const NO_PYTORCH: i32 = 3;

/// Runs the peers and returns their measurements, with % of copy taken against the copy this
/// run measured for the same shape in the same timing mode. Without Python, PyTorch or the script it says so and
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
        .args(["--timing", config.timing.name()])
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

/// One CSV row of the script (`variant,dtype,rows,cols,median_ms,gbps,pct_of_copy,timing`),
/// re-based on this run's copy: % of copy is the peer's GB/s over the GB/s of the copy this
/// run measured for the same shape in the same timing mode (the same as the ratio of times
/// when both move the same bytes, as forward calls do). A row without the timing column is
/// back-to-back, the only mode there was before it. `None` for a row that does not parse, names
/// a timing mode this build does not know, or has no copy to compare with.
fn parse_row(line: &str, ours: &[Measurement]) -> Option<Measurement> {
    let fields: Vec<&str> = line.trim_end().split(',').collect();
    let timing = match fields.get(7..)? {
        [] => Timing::BackToBack,
        [timing] => timing.parse().ok()?,
        _ => return None,
    };
    let [variant, dtype, rows, cols, median_ms, gbps, _pct] = fields[..7] else {
        return None;
    };
    let (rows, cols): (usize, usize) = (rows.parse().ok()?, cols.parse().ok()?);
    let (median_ms, gbps): (f64, f64) = (median_ms.parse().ok()?, gbps.parse().ok()?);
    let copy = ours
        .iter()
        .find(|m| m.variant == "copy" && m.rows == rows && m.cols == cols && m.timing == timing)?;
    let Outcome::Timed {
        gbps: copy_gbps, ..
    } = copy.outcome
    else {
        return None;
    };
    let library = match variant {
        v if v.starts_with("triton") => "triton",
        v if v.starts_with("quack") => "quack",
        v if v.starts_with("flashinfer") => "flashinfer",
        _ => "pytorch",
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
        timing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timed copy of `rows × cols` at `gbps` in `timing`.
    fn copy(rows: usize, cols: usize, gbps: f64, timing: Timing) -> Measurement {
        crate::bench::fixtures::timed("copy", rows, cols, gbps, timing)
    }

    fn pct(m: &Measurement) -> f64 {
        match m.outcome {
            Outcome::Timed { pct_of_copy, .. } => pct_of_copy,
            _ => f64::NAN,
        }
    }

    #[test]
    fn rows_are_rebased_on_the_copy_of_their_own_mode() {
        let ours = [
            copy(4, 8, 2000.0, Timing::Isolated),
            copy(4, 8, 4000.0, Timing::BackToBack),
        ];
        let isolated = parse_row("torch,f32,4,8,0.01,1000.00,12.00,isolated", &ours).unwrap();
        assert_eq!(isolated.timing, Timing::Isolated);
        assert_eq!(isolated.kernels, ["pytorch"]);
        assert!((pct(&isolated) - 50.0).abs() < 1e-9);
        let back_to_back =
            parse_row("triton,f32,4,8,0.01,1000.00,12.00,back-to-back\n", &ours).unwrap();
        assert_eq!(back_to_back.timing, Timing::BackToBack);
        assert_eq!(back_to_back.kernels, ["triton"]);
        assert!((pct(&back_to_back) - 25.0).abs() < 1e-9);
    }

    #[test]
    fn rows_without_a_timing_column_are_back_to_back() {
        let ours = [copy(4, 8, 4000.0, Timing::BackToBack)];
        let row = parse_row("torch,f32,4,8,0.01,1000.00,12.00", &ours).unwrap();
        assert_eq!(row.timing, Timing::BackToBack);
        assert!((pct(&row) - 25.0).abs() < 1e-9);
    }

    #[test]
    fn unusable_rows_are_skipped() {
        let ours = [copy(4, 8, 4000.0, Timing::BackToBack)];
        for line in [
            // No isolated copy to compare with.
            "torch,f32,4,8,0.01,1000.00,12.00,isolated",
            // No copy of this shape.
            "torch,f32,4,9,0.01,1000.00,12.00,back-to-back",
            "torch,f32,4,8,0.01,1000.00,12.00,sideways",
            "torch,f32,4,8,fast,1000.00,12.00,back-to-back",
            "torch,f32,4,8",
            "",
        ] {
            assert!(parse_row(line, &ours).is_none(), "{line}");
        }
    }
}
