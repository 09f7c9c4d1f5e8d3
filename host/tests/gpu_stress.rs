//! GPU fuzzing, concurrency and soak. Without a CUDA device each test is reported skipped.
//! `SOFTMAX_TEST_SEED=N` replays a run; a test name as the first argument filters.

mod common;

use std::thread;

use common::{Check, poisoned};
use cust::memory::{CopyDestination, DeviceBuffer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::reference::{deviation, softmax_f64};
use softmax::{Error, Shape, Softmax, Variant};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    ("fuzz_ten_thousand_random_shapes_and_contents", fuzz),
    (
        "threads_with_their_own_streams_agree_with_the_reference",
        threads,
    ),
    (
        "two_streams_from_one_thread_agree_with_the_reference",
        two_streams,
    ),
    ("soak_one_hundred_thousand_launches_without_growth", soak),
];

const TOLERANCE: f64 = 1e-5;
const FUZZ_CASES: usize = 10_000;
const SOAK_LAUNCHES: usize = 100_000;

fn main() -> std::process::ExitCode {
    common::run_harness(TESTS)
}

/// A random shape: mostly narrow to medium rows, sometimes one very wide row or a column.
fn random_shape(rng: &mut StdRng) -> Shape {
    let (rows, cols) = match rng.random_range(0..10) {
        0 => (rng.random_range(1..=4), rng.random_range(1..=300_000)),
        1 => (rng.random_range(1..=2000), 1),
        2 => (1, rng.random_range(1..=5000)),
        _ => (rng.random_range(1..=64), rng.random_range(1..=5000)),
    };
    Shape::new(rows, cols).unwrap()
}

/// Random contents, now and then with -inf, NaN, +inf or huge magnitudes mixed in.
fn random_contents(rng: &mut StdRng, shape: Shape) -> Vec<f32> {
    let magnitude = [1.0, 30.0, 1e4][rng.random_range(0..3)];
    let mut values: Vec<f32> = (0..shape.len())
        .map(|_| rng.random_range(-magnitude..=magnitude))
        .collect();
    if rng.random_ratio(1, 4) {
        for _ in 0..rng.random_range(1..=4) {
            let at = rng.random_range(0..values.len());
            values[at] =
                [f32::NEG_INFINITY, f32::NAN, f32::INFINITY, 3e38, -3e38][rng.random_range(0..5)];
        }
    }
    values
}

fn fuzz(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let variants = Variant::all();
    let (mut checked, mut refused) = (0, 0);
    for case in 0..FUZZ_CASES {
        let shape = random_shape(rng);
        // Slow seed variants only on small shapes, to keep the run short.
        let variant = loop {
            let v = variants[rng.random_range(0..variants.len())];
            let slow = matches!(
                v,
                Variant::ThreadPerRowNaive | Variant::ThreadPerRowOnline | Variant::Unfused
            );
            if !slow || shape.len() < 200_000 {
                break v;
            }
        };
        let input = random_contents(rng, shape);
        let expected = softmax_f64(&input, shape.rows, shape.cols);
        let (in_offset, out_offset) = (rng.random_range(0..4), rng.random_range(0..4));
        let mut padded = vec![0.0; shape.len() + in_offset];
        padded[in_offset..].copy_from_slice(&input);
        let device_input = DeviceBuffer::from_slice(&padded).map_err(|e| e.to_string())?;
        let device_output = poisoned(shape.len() + out_offset)?;
        let mut output_view = device_output.index(out_offset..);
        match softmax.run(
            variant,
            &device_input.index(in_offset..),
            &mut output_view,
            shape,
        ) {
            Err(Error::Unsupported { .. }) => {
                refused += 1;
                continue;
            }
            Err(error) => return Err(format!("case {case}: {variant} on {shape}: {error}")),
            Ok(()) => {}
        }
        softmax
            .synchronize()
            .map_err(|e| format!("case {case}: {variant} on {shape}: {e}"))?;
        let mut result = vec![0.0; shape.len() + out_offset];
        device_output
            .copy_to(&mut result[..])
            .map_err(|e| e.to_string())?;
        let deviation = deviation(&result[out_offset..], &expected, shape.cols);
        if !deviation.within(TOLERANCE) {
            return Err(format!(
                "case {case}: {variant} on {shape} (input +{in_offset}, output +{out_offset} floats): {deviation:?}"
            ));
        }
        checked += 1;
    }
    Ok(format!(
        "{checked} random cases matched the reference, {refused} refused as unsupported"
    ))
}

/// Runs `count` random small problems on `softmax` and checks each.
fn checked_runs(softmax: &mut Softmax, seed: u64, count: usize) -> Result<usize, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut check = Check::default();
    for _ in 0..count {
        let shape = Shape::new(rng.random_range(1..=256), rng.random_range(1..=20_000)).unwrap();
        let input = random_contents(&mut rng, shape);
        let expected = softmax_f64(&input, shape.rows, shape.cols);
        let variant = [
            Variant::Auto,
            Variant::BlockRegisters,
            Variant::RowSlices,
            Variant::WarpPerRowOnline,
        ][rng.random_range(0..4)];
        match check.variant(softmax, variant, &input, &expected, shape, TOLERANCE) {
            Err(common::Failure::Refused(Error::Unsupported { .. })) => {}
            Err(failure) => return Err(format!("{variant} on {shape}: {failure}")),
            Ok(()) => {}
        }
    }
    Ok(check.passed)
}

fn threads(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let seeds: Vec<u64> = (0..4).map(|_| rng.random()).collect();
    let handles: Vec<_> = seeds
        .into_iter()
        .map(|seed| {
            thread::spawn(move || {
                let mut own = Softmax::new().map_err(|e| e.to_string())?;
                checked_runs(&mut own, seed, 150)
            })
        })
        .collect();
    let mut total = 0;
    for handle in handles {
        total += handle
            .join()
            .map_err(|_| "a thread panicked".to_string())??;
    }
    Ok(format!(
        "4 threads, each with its own Softmax and stream: {total} checked runs correct"
    ))
}

fn two_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // Two instances (two streams) from one thread, launches interleaved without waiting.
    let mut second = Softmax::new().map_err(|e| e.to_string())?;
    let mut pending = Vec::new();
    for i in 0..64 {
        let shape = Shape::new(rng.random_range(1..=64), rng.random_range(1..=50_000)).unwrap();
        let input = random_contents(rng, shape);
        let expected = softmax_f64(&input, shape.rows, shape.cols);
        let device_input = DeviceBuffer::from_slice(&input).map_err(|e| e.to_string())?;
        let mut device_output = poisoned(shape.len())?;
        let instance = if i % 2 == 0 {
            &mut *softmax
        } else {
            &mut second
        };
        instance
            .run(Variant::Auto, &device_input, &mut device_output, shape)
            .map_err(|e| e.to_string())?;
        pending.push((shape, expected, device_input, device_output));
    }
    softmax.synchronize().map_err(|e| e.to_string())?;
    second.synchronize().map_err(|e| e.to_string())?;
    for (shape, expected, _input, output) in &pending {
        let mut result = vec![0.0; shape.len()];
        output.copy_to(&mut result[..]).map_err(|e| e.to_string())?;
        let deviation = deviation(&result, expected, shape.cols);
        if !deviation.within(TOLERANCE) {
            return Err(format!("{shape}: {deviation:?}"));
        }
    }
    Ok(format!(
        "{} launches on two streams from one thread correct",
        pending.len()
    ))
}

fn free_device_memory() -> Result<usize, String> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two sizes through valid pointers; a context is current.
    let status = unsafe { cust::sys::cuMemGetInfo_v2(&mut free, &mut total) };
    if status != cust::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemGetInfo failed: {status:?}"));
    }
    Ok(free)
}

fn soak(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let shapes = [
        (64, 1000),
        (8, 128256),
        (1, 32000),
        (4096, 33),
        (3, 100003),
        (256, 4096),
    ];
    let variants = [
        Variant::Auto,
        Variant::RowsInRegisters,
        Variant::BlockRegisters,
        Variant::RowSlices,
        Variant::SplitRows,
        Variant::WarpPerRowOnline,
    ];
    let mut buffers = Vec::new();
    for (rows, cols) in shapes {
        let shape = Shape::new(rows, cols).unwrap();
        let input = random_contents(rng, shape);
        let device_input = DeviceBuffer::from_slice(&input).map_err(|e| e.to_string())?;
        let device_output = poisoned(shape.len())?;
        buffers.push((shape, input, device_input, device_output));
    }
    // Launches `count` supported (variant, shape) pairs in rotation; refused pairs are skipped.
    let mut launch_mixed = |softmax: &mut Softmax, count: usize| -> Result<(), String> {
        let (mut launched, mut i) = (0, 0);
        while launched < count {
            let (shape, _, input, output) = &mut buffers[i % shapes.len()];
            let variant = variants[(i / shapes.len()) % variants.len()];
            i += 1;
            match softmax.run(variant, input, output, *shape) {
                Err(Error::Unsupported { .. }) => continue,
                Err(error) => {
                    return Err(format!("launch {launched}: {variant} on {shape}: {error}"));
                }
                Ok(()) => launched += 1,
            }
            if launched % 1000 == 0 {
                softmax
                    .synchronize()
                    .map_err(|e| format!("after launch {launched}: {e}"))?;
            }
        }
        softmax.synchronize().map_err(|e| e.to_string())
    };
    // Every plan and workspace exists after one rotation; memory must not grow after that.
    launch_mixed(softmax, shapes.len() * variants.len())?;
    let before = free_device_memory()?;
    launch_mixed(softmax, SOAK_LAUNCHES)?;
    let after = free_device_memory()?;
    for (shape, input, _, output) in &buffers {
        let mut result = vec![0.0; shape.len()];
        output.copy_to(&mut result[..]).map_err(|e| e.to_string())?;
        let deviation = deviation(
            &result,
            &softmax_f64(input, shape.rows, shape.cols),
            shape.cols,
        );
        if !deviation.within(TOLERANCE) {
            return Err(format!("{shape} after the soak: {deviation:?}"));
        }
    }
    if after < before {
        return Err(format!(
            "device memory shrank by {} bytes over the soak",
            before - after
        ));
    }
    Ok(format!(
        "{SOAK_LAUNCHES} launches, free device memory {} MiB before and {} MiB after",
        before >> 20,
        after >> 20
    ))
}
