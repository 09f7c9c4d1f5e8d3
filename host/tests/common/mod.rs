//! Shared by the GPU test binaries (each uses part of it): a harness that reports skipped
//! tests when there is no GPU, seeded random inputs, and checks against the reference.
#![allow(dead_code)]

pub mod kernels;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use cust::memory::{CopyDestination, DeviceBuffer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::reference::{Deviation, deviation};
use softmax::{Error, Shape, Softmax, Variant};

/// A test: gets the device and a seeded generator, returns a one-line summary or a failure.
pub type Test = (
    &'static str,
    fn(&mut Softmax, &mut StdRng) -> Result<String, String>,
);

/// Runs `tests` (those whose name contains the first argument, if any) and exits non-zero if
/// one fails. Without a device, reports each as skipped with the reason and exits zero.
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
            for (name, _) in &selected {
                println!("test {name} ... skipped: no CUDA device ({reason})");
            }
            println!(
                "\ntest result: 0 passed, 0 failed, {} skipped (no GPU)",
                selected.len()
            );
            return ExitCode::SUCCESS;
        }
        Err(error) => panic!("opening the GPU failed for another reason than its absence: {error}"),
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
