//! Shared by the GPU test binaries (each uses part of it): a harness that reports skipped
//! tests when there is no GPU (and fails them when one is required), seeded random inputs,
//! and checks against the reference.
#![allow(dead_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use cust::memory::{CopyDestination, DeviceBuffer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::reference::{Deviation, deviation};
use softmax::{Error, Shape, Softmax, Variant};

/// Set (to anything but `0` or nothing) on a machine that has a GPU: there, a missing device
/// fails every GPU test instead of skipping it, so a broken driver cannot pass as "no GPU".
pub const REQUIRE_GPU: &str = "SOFTMAX_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU`] is set.
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU).is_some_and(|value| !value.is_empty() && value != "0")
}

/// A test: gets the device and a seeded generator, returns a one-line summary or a failure.
pub type Test = (
    &'static str,
    fn(&mut Softmax, &mut StdRng) -> Result<String, String>,
);

/// Runs `tests` (those whose name contains the first argument, if any) and exits non-zero if
/// one fails. Without a device, reports each as skipped with the reason and exits zero, or,
/// when [`REQUIRE_GPU`] is set, as failed, exiting non-zero.
pub fn run_harness(tests: &[Test]) -> ExitCode {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let selected: Vec<&Test> = tests
        .iter()
        .filter(|(name, _)| name.contains(&filter))
        .collect();
    let seed = std::env::var("SOFTMAX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut softmax = match Softmax::new() {
        Ok(softmax) => softmax,
        Err(Error::NoDevice { reason }) => {
            let names: Vec<&str> = selected.iter().map(|(name, _)| *name).collect();
            return without_a_device(&names, &reason, gpu_required());
        }
        Err(error) => {
            eprintln!("opening the GPU failed for another reason than its absence: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "device: {} (seed {seed}; replay with SOFTMAX_TEST_SEED={seed})",
        softmax.device().name
    );
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in selected {
        let started = std::time::Instant::now();
        let mut rng = StdRng::seed_from_u64(seed);
        let outcome = catch_unwind(AssertUnwindSafe(|| test(&mut softmax, &mut rng)))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "panicked: {:?}",
                    panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or(panic.downcast_ref::<&str>().copied())
                ))
            });
        let seconds = started.elapsed().as_secs_f64();
        match outcome {
            Ok(summary) => {
                passed += 1;
                println!("test {name} ... ok ({seconds:.1} s): {summary}");
            }
            Err(why) => {
                failed += 1;
                println!("test {name} ... FAILED ({seconds:.1} s): {why} [seed {seed}]");
            }
        }
    }
    println!("\ntest result: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The verdict without a device: every test skipped (exit 0), or, when a GPU is `required`,
/// every test failed (exit 1) with the reason on stderr.
fn without_a_device(names: &[&str], reason: &str, required: bool) -> ExitCode {
    let verdict = if required { "FAILED" } else { "skipped" };
    for name in names {
        println!("test {name} ... {verdict}: no CUDA device ({reason})");
    }
    if !required {
        println!(
            "\ntest result: 0 passed, 0 failed, {} skipped (no GPU)",
            names.len()
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "\ntest result: 0 passed, {} failed (no GPU, and {REQUIRE_GPU} is set)",
        names.len()
    );
    eprintln!(
        "{REQUIRE_GPU} is set but there is no CUDA device ({reason}): the GPU tests fail \
         rather than pass without running"
    );
    ExitCode::FAILURE
}

/// Uniform random values in `[-magnitude, magnitude]`.
pub fn random_matrix(rng: &mut StdRng, shape: Shape, magnitude: f32) -> Vec<f32> {
    (0..shape.len())
        .map(|_| rng.random_range(-magnitude..=magnitude))
        .collect()
}

/// A device buffer of `len` NaNs: anything a kernel leaves unwritten stays NaN.
pub fn poisoned(len: usize) -> Result<DeviceBuffer<f32>, String> {
    DeviceBuffer::from_slice(&vec![f32::NAN; len]).map_err(|e| e.to_string())
}

/// Why a variant failed a check.
#[derive(Debug)]
pub enum Failure {
    Refused(Error),
    Wrong(Deviation),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(error) => write!(f, "refused: {error}"),
            Failure::Wrong(deviation) => write!(f, "wrong result: {deviation:?}"),
        }
    }
}

/// Counts checks for a test's summary line.
#[derive(Default)]
pub struct Check {
    pub passed: usize,
    pub refused: usize,
    pub worst: f64,
}

impl Check {
    /// Runs `variant` on `input` into a poisoned output and compares with `expected`.
    pub fn variant(
        &mut self,
        softmax: &mut Softmax,
        variant: Variant,
        input: &[f32],
        expected: &[f64],
        shape: Shape,
        tolerance: f64,
    ) -> Result<(), Failure> {
        let cuda = |e: cust::error::CudaError| {
            Failure::Refused(Error::NoDevice {
                reason: e.to_string(),
            })
        };
        let device_input = DeviceBuffer::from_slice(input).map_err(cuda)?;
        let mut device_output =
            DeviceBuffer::from_slice(&vec![f32::NAN; shape.len()]).map_err(cuda)?;
        softmax
            .run(variant, &device_input, &mut device_output, shape)
            .map_err(Failure::Refused)?;
        softmax.synchronize().map_err(Failure::Refused)?;
        let mut output = vec![0.0; shape.len()];
        device_output.copy_to(&mut output[..]).map_err(cuda)?;
        let deviation = deviation(&output, expected, shape.cols());
        if !deviation.within(tolerance) {
            return Err(Failure::Wrong(deviation));
        }
        self.worst = self
            .worst
            .max(deviation.relative_l2)
            .max(deviation.worst_row_sum);
        self.passed += 1;
        Ok(())
    }

    pub fn summary(&self) -> String {
        format!(
            "{} runs matched the reference (worst error {:.1e}), {} refused as unsupported",
            self.passed, self.worst, self.refused
        )
    }
}
