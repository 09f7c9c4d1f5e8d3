//! Cold start: how long `Softmax::new` and the first call into each PTX module take in a fresh
//! process, with the driver's JIT cache off (a new container, a CI runner, a restarted worker)
//! and warm. Each measurement runs in a child process of its own, the same executable
//! re-executed with [`CHILD_ENV`] set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::Softmax;
use crate::cust::memory::DeviceBuffer;
use crate::error::{CudaContext, Error, Result};
use crate::shape::Shape;
use crate::variant::Variant;
use crate::{Element, Operation, Options, Rows, RowsMut};

/// Set in the children: they measure and print `what seconds` lines instead of spawning.
pub const CHILD_ENV: &str = "SOFTMAX_COLDSTART_CHILD";

/// What a child measures, in order: each step is the first use of what it names.
pub const STEPS: [&str; 5] = [
    "Softmax::new",
    "first f32 softmax",
    "first f32 operation",
    "first bf16 operation",
    "first f16 operation",
];

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct ColdStart {
    pub what: String,
    /// `off` (`CUDA_CACHE_DISABLE=1`) or `warm` (a cache the same steps filled just before).
    pub jit_cache: &'static str,
    pub seconds: f64,
}

/// In a child: runs [`STEPS`] on device `ordinal` and prints one `what<TAB>seconds` line each.
pub fn child(ordinal: u32) -> Result<()> {
    let started = Instant::now();
    let mut softmax = Softmax::on_device(ordinal)?;
    println!("{}\t{}", STEPS[0], started.elapsed().as_secs_f64());
    let shape = Shape::new(64, 1000)?;
    let steps: [(&str, Step); 4] = [
        (STEPS[1], |s, shape| {
            let input = upload(&vec![0.5f32; shape.len()])?;
            let mut output = upload(&vec![0.0f32; shape.len()])?;
            s.run(Variant::Auto, &input, &mut output, shape)
        }),
        (STEPS[2], |s, shape| first_operation::<f32>(s, shape)),
        (STEPS[3], |s, shape| first_operation::<half::bf16>(s, shape)),
        (STEPS[4], |s, shape| first_operation::<half::f16>(s, shape)),
    ];
    for (what, step) in steps {
        let started = Instant::now();
        step(&mut softmax, shape)?;
        softmax.synchronize()?;
        println!("{what}\t{}", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// One first call, given the instance and a shape.
type Step = fn(&mut Softmax, Shape) -> Result<()>;

pub(super) fn upload<T: Element>(values: &[T]) -> Result<DeviceBuffer<T>> {
    DeviceBuffer::from_slice(values).during("copying data to the device")
}

/// Log-softmax at a temperature: an operation of the module of `T`.
fn first_operation<T: Element>(softmax: &mut Softmax, shape: Shape) -> Result<()> {
    let input = upload(&vec![T::from_f32(0.5); shape.len()])?;
    let mut output = upload(&vec![T::from_f32(0.0); shape.len()])?;
    softmax.forward(
        Operation::LogSoftmax,
        Rows::new(&input, shape)?,
        RowsMut::new(&mut output, shape)?,
        &Options::new().temperature(0.7),
    )
}

/// Runs the children (JIT cache off, then warm) and returns their measurements.
pub fn measure(ordinal: u32) -> Result<Vec<ColdStart>> {
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        what: "finding this executable".into(),
        source,
    })?;
    let cache = std::env::temp_dir().join(format!("softmax-coldstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut results = Vec::new();
    let off = run_child(&exe, ordinal, &[("CUDA_CACHE_DISABLE", "1".as_ref())])?;
    results.extend(off.into_iter().map(|(what, seconds)| ColdStart {
        what,
        jit_cache: "off",
        seconds,
    }));
    let warm_env = [
        ("CUDA_CACHE_DISABLE", "0".as_ref()),
        ("CUDA_CACHE_PATH", cache.as_os_str()),
    ];
    // The first run fills the cache; the second is measured.
    run_child(&exe, ordinal, &warm_env)?;
    let warm = run_child(&exe, ordinal, &warm_env)?;
    results.extend(warm.into_iter().map(|(what, seconds)| ColdStart {
        what,
        jit_cache: "warm",
        seconds,
    }));
    let _ = std::fs::remove_dir_all(&cache);
    Ok(results)
}

fn run_child(
    exe: &Path,
    ordinal: u32,
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<Vec<(String, f64)>> {
    let mut command = Command::new(exe);
    command
        .args(["coldstart", "--device", &ordinal.to_string()])
        .env(CHILD_ENV, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().map_err(|source| Error::Io {
        what: "running a cold-start child".into(),
        source,
    })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(Error::Io {
            what: format!(
                "a cold-start child failed: {stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            ),
            source: std::io::Error::other(output.status.to_string()),
        });
    }
    Ok(parse_lines(&stdout))
}

/// The `what<TAB>seconds` lines of a child's output.
fn parse_lines(stdout: &str) -> Vec<(String, f64)> {
    stdout
        .lines()
        .filter_map(|line| {
            let (what, seconds) = line.split_once('\t')?;
            Some((what.to_owned(), seconds.trim().parse().ok()?))
        })
        .collect()
}

/// Writes `results` (with one `all of the above` row per cache state) as
/// `<dir>/<device>-coldstart.csv` with the columns `what,jit_cache,seconds`.
pub fn write_csv(dir: &Path, device: &str, results: &[ColdStart]) -> Result<PathBuf> {
    let mut text = String::from("what,jit_cache,seconds\n");
    for cache in ["off", "warm"] {
        let rows: Vec<&ColdStart> = results.iter().filter(|r| r.jit_cache == cache).collect();
        for row in &rows {
            text.push_str(&format!(
                "{},{},{:.4}\n",
                row.what, row.jit_cache, row.seconds
            ));
        }
        let total: f64 = rows.iter().map(|r| r.seconds).sum();
        text.push_str(&format!("new and every first call,{cache},{total:.4}\n"));
    }
    let path = dir.join(format!("{device}-coldstart.csv"));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_lines_parse_and_other_lines_are_ignored() {
        let lines = "Softmax::new\t0.25\nnoise\nfirst f32 softmax\t0.5\nbad\tx\n";
        assert_eq!(
            parse_lines(lines),
            [
                ("Softmax::new".to_owned(), 0.25),
                ("first f32 softmax".to_owned(), 0.5)
            ]
        );
    }

    #[test]
    fn the_csv_has_the_agreed_columns_and_a_total_per_cache_state() {
        let dir =
            std::env::temp_dir().join(format!("softmax-coldstart-csv-{}", std::process::id()));
        let results = [
            ColdStart {
                what: STEPS[0].into(),
                jit_cache: "off",
                seconds: 0.5,
            },
            ColdStart {
                what: STEPS[1].into(),
                jit_cache: "off",
                seconds: 0.25,
            },
            ColdStart {
                what: STEPS[0].into(),
                jit_cache: "warm",
                seconds: 0.125,
            },
        ];
        let path = write_csv(&dir, "nvidia-h200", &results).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("what,jit_cache,seconds\n"));
        assert!(text.contains("Softmax::new,off,0.5000\n"));
        assert!(text.contains("new and every first call,off,0.7500\n"));
        assert!(text.contains("new and every first call,warm,0.1250\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
