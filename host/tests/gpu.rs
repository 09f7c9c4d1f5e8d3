//! GPU tests: every variant against the f64 reference. Without a CUDA device each test is
//! reported as skipped, with the reason, and the run passes.
//!
//! `SOFTMAX_TEST_SEED=N` replays a run; a test name as the first argument filters.

mod common;

use common::{Check, poisoned, random_matrix};
use cust::memory::{CopyDestination, DeviceBuffer};
use kernels_gpu::launch::softmax::BLOCK_SMEM_AUTOTUNE_CANDIDATES;
use rand::Rng;
use rand::rngs::StdRng;
use softmax::reference::softmax_f64;
use softmax::{Error, Shape, Softmax, Variant};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    (
        "every_variant_matches_the_reference_on_the_shape_list",
        every_variant_on_the_shape_list,
    ),
    (
        "special_values_follow_pytorch",
        special_values_follow_pytorch,
    ),
    ("llm_and_odd_shapes_match_the_reference", llm_and_odd_shapes),
    ("misaligned_buffers_are_still_correct", misaligned_buffers),
    (
        "bad_input_is_refused_before_any_launch",
        bad_input_is_refused,
    ),
    (
        "autotuned_threads_are_chosen_once_per_shape",
        autotuned_threads_are_cached,
    ),
    ("tuning_auto_is_explicit_persisted_and_correct", tuning_auto),
];

const COLS: [usize; 10] = [1, 2, 31, 32, 33, 127, 1000, 4097, 16384, 65537];
const ROWS: [usize; 3] = [1, 3, 1000];
const TOLERANCE: f64 = 1e-5;

fn main() -> std::process::ExitCode {
    common::run_harness(TESTS)
}

/// Whether `variant` may refuse a shape (the register kernels, for rows too wide for them).
fn may_refuse(variant: Variant, error: &Error) -> bool {
    match (variant, error) {
        (Variant::RowsInRegisters | Variant::BlockRegisters, Error::Unsupported { .. }) => true,
        // Only on a GPU older than Hopper.
        (Variant::RowCluster, Error::Unsupported { why, .. }) => why.contains("compute capability"),
        _ => false,
    }
}

/// Runs every variant on `input` and checks each against `expected`.
fn check_all_variants(
    softmax: &mut Softmax,
    input: &[f32],
    shape: Shape,
    check: &mut Check,
) -> Result<(), String> {
    let expected = softmax_f64(input, shape.rows(), shape.cols());
    for variant in Variant::all() {
        match check.variant(softmax, variant, input, &expected, shape, TOLERANCE) {
            Err(common::Failure::Refused(error)) if may_refuse(variant, &error) => {
                check.refused += 1
            }
            Err(failure) => return Err(format!("{variant} on {shape}: {failure}")),
            Ok(()) => {}
        }
    }
    Ok(())
}

fn every_variant_on_the_shape_list(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut check = Check::default();
    for rows in ROWS {
        for cols in COLS {
            let shape = Shape::new(rows, cols).unwrap();
            let input = random_matrix(rng, shape, 10.0);
            check_all_variants(softmax, &input, shape, &mut check)?;
        }
    }
    Ok(check.summary())
}

fn special_values_follow_pytorch(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut check = Check::default();
    for cols in [1, 2, 33, 1000, 1024, 2048, 4096, 4097, 65536, 65537] {
        let shape = Shape::new(7, cols).unwrap();
        let mut input = random_matrix(rng, shape, 1e4);
        let mut row: Vec<&mut [f32]> = input.chunks_mut(cols).collect();
        for x in row[1].iter_mut().step_by(3) {
            *x = f32::NEG_INFINITY;
        }
        if cols > 1 {
            // Keep one finite entry so the row is not entirely -inf.
            row[1][cols - 1] = 0.5;
        }
        row[2].fill(f32::NEG_INFINITY);
        row[3][rng.random_range(0..cols)] = f32::NAN;
        row[4][rng.random_range(0..cols)] = f32::INFINITY;
        row[5].iter_mut().for_each(|x| *x /= 1e4);
        row[6][rng.random_range(0..cols)] = 3e38;
        check_all_variants(softmax, &input, shape, &mut check)?;
    }
    Ok(check.summary())
}

fn llm_and_odd_shapes(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut check = Check::default();
    let shapes = [
        (1, 32000),
        (1, 128256),
        (8, 128256),
        (32, 151936),
        (64, 151936),
        (16, 262144),
        (56, 262144),
        (1, 1048576),
        // `auto` in row-slices in waves of rows (2×4000001 below too, its rows peeled).
        (8, 1048576),
        (4096, 1000),
        (65536, 100),
        (128, 50257),
        (3, 100003),
        (2, 4_000_001),
    ];
    for (rows, cols) in shapes {
        let shape = Shape::new(rows, cols).unwrap();
        for variant in [
            Variant::Auto,
            Variant::BlockRegisters,
            Variant::RowSlices,
            Variant::RowCluster,
            Variant::RowsInRegisters,
            Variant::WarpPerRowOnline,
        ] {
            // Twice with fresh data: the sliced kernel's barriers must reset themselves.
            for _ in 0..2 {
                let input = random_matrix(rng, shape, 20.0);
                let expected = softmax_f64(&input, rows, cols);
                match check.variant(softmax, variant, &input, &expected, shape, TOLERANCE) {
                    Err(common::Failure::Refused(error)) if may_refuse(variant, &error) => {
                        check.refused += 1
                    }
                    Err(failure) => return Err(format!("{variant} on {shape}: {failure}")),
                    Ok(()) => {}
                }
            }
        }
    }
    Ok(check.summary())
}

fn misaligned_buffers(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut checked = 0;
    for (rows, cols) in [(5, 1000), (3, 4096), (2, 100_000), (64, 64), (300, 4097)] {
        let shape = Shape::new(rows, cols).unwrap();
        let input = random_matrix(rng, shape, 10.0);
        let expected = softmax_f64(&input, rows, cols);
        let mut padded = vec![0.0; shape.len() + 1];
        padded[1..].copy_from_slice(&input);
        let device_input = DeviceBuffer::from_slice(&padded).map_err(|e| e.to_string())?;
        // Output one float (misaligned like the input) or two floats (differently) past a
        // 256-byte aligned allocation.
        for output_offset in [1, 2] {
            for variant in [
                Variant::Auto,
                Variant::BlockRegisters,
                Variant::RowSlices,
                Variant::RowsInRegisters,
            ] {
                let device_output = poisoned(shape.len() + output_offset)?;
                let mut output_view = device_output.index(output_offset..);
                match softmax.run(variant, &device_input.index(1..), &mut output_view, shape) {
                    Err(error) if may_refuse(variant, &error) => continue,
                    Err(error) => return Err(format!("{variant} on misaligned {shape}: {error}")),
                    Ok(()) => {}
                }
                softmax.synchronize().map_err(|e| e.to_string())?;
                let mut result = vec![0.0; shape.len() + output_offset];
                device_output
                    .copy_to(&mut result[..])
                    .map_err(|e| e.to_string())?;
                if !result[..output_offset].iter().all(|v| v.is_nan()) {
                    return Err(format!("{variant} wrote before its misaligned output"));
                }
                let deviation =
                    softmax::reference::deviation(&result[output_offset..], &expected, cols);
                if !deviation.within(TOLERANCE) {
                    return Err(format!(
                        "{variant} on misaligned {shape} (output +{output_offset}): {deviation:?}"
                    ));
                }
                checked += 1;
            }
        }
    }
    Ok(format!("{checked} misaligned runs correct"))
}

fn bad_input_is_refused(softmax: &mut Softmax, _rng: &mut StdRng) -> Outcome {
    let shape = Shape::new(4, 8).unwrap();
    let input = DeviceBuffer::from_slice(&[1.0f32; 32]).map_err(|e| e.to_string())?;
    let short = DeviceBuffer::from_slice(&[1.0f32; 31]).map_err(|e| e.to_string())?;
    let mut output = poisoned(32)?;
    let mut short_output = poisoned(31)?;
    let expect = |result: softmax::Result<()>, wanted: &str, ok: fn(&Error) -> bool| match result {
        Err(error) if ok(&error) => Ok(()),
        other => Err(format!("{wanted}: got {other:?}")),
    };
    for variant in Variant::all() {
        expect(
            softmax.run(variant, &short, &mut output, shape),
            "short input",
            |e| matches!(e, Error::InputLength { .. }),
        )?;
        expect(
            softmax.run(variant, &input, &mut short_output, shape),
            "short output",
            |e| matches!(e, Error::OutputLength { .. }),
        )?;
        let empty = Shape::new(0, 8).unwrap();
        if let Err(error) = softmax.run(variant, &input.index(..0), &mut output.index(..0), empty) {
            return Err(format!("{variant}: an empty shape is a no-op, got {error}"));
        }
    }
    for threads_per_block in [0, 100, 2048] {
        let variant = Variant::BlockPerRowSmem { threads_per_block };
        expect(
            softmax.run(variant, &input, &mut output, shape),
            "bad threads per block",
            |e| matches!(e, Error::ThreadsPerBlock(_)),
        )?;
    }
    softmax.synchronize().map_err(|e| e.to_string())?;
    let mut after = [0.0; 32];
    output.copy_to(&mut after[..]).map_err(|e| e.to_string())?;
    if !after.iter().all(|v| v.is_nan()) {
        return Err("a refused call wrote to the output".into());
    }
    Ok("every bad call refused with its typed error, nothing written".into())
}

fn autotuned_threads_are_cached(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let shape = Shape::new(2048, 4096).unwrap();
    let input = random_matrix(rng, shape, 10.0);
    let expected = softmax_f64(&input, shape.rows(), shape.cols());
    let mut check = Check::default();
    let mut run_checked = |softmax: &mut Softmax| {
        check
            .variant(
                softmax,
                Variant::BlockPerRowAutotuned,
                &input,
                &expected,
                shape,
                TOLERANCE,
            )
            .map_err(|f| f.to_string())
    };
    run_checked(softmax)?;
    let threads = softmax
        .tuned_threads(shape)
        .ok_or("the first call left no tuned entry")?;
    run_checked(softmax)?;
    if softmax.tuned_threads(shape) != Some(threads) {
        return Err("the second call tuned again".into());
    }
    if !BLOCK_SMEM_AUTOTUNE_CANDIDATES.contains(&threads) {
        return Err(format!("tuned to {threads}, not a candidate"));
    }
    Ok(format!(
        "{shape} tuned to {threads} threads per block, reused"
    ))
}

fn tuning_auto(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let cache = std::env::temp_dir().join(format!(
        "softmax-rs-gpu-test-{}/tune.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&cache);
    let mut tuned = Softmax::new()
        .map_err(|e| e.to_string())?
        .with_tune_cache(Some(cache.clone()))
        .map_err(|e| e.to_string())?;
    let mut summary = Vec::new();
    for (rows, cols) in [(32, 151936), (128, 50257), (8, 128256)] {
        let shape = Shape::new(rows, cols).unwrap();
        let input = random_matrix(rng, shape, 20.0);
        let expected = softmax_f64(&input, rows, cols);
        let heuristic = tuned
            .kernels_for(Variant::Auto, shape)
            .map_err(|e| e.to_string())?;
        let device_input = DeviceBuffer::from_slice(&input).map_err(|e| e.to_string())?;
        let mut device_output = poisoned(shape.len())?;
        let chosen = tuned
            .tune(&device_input, &mut device_output, shape)
            .map_err(|e| e.to_string())?;
        let after = tuned
            .kernels_for(Variant::Auto, shape)
            .map_err(|e| e.to_string())?;
        if after
            != tuned
                .kernels_for(chosen, shape)
                .map_err(|e| e.to_string())?
        {
            return Err(format!(
                "{shape}: auto does not run the tuned {chosen}: {after:?}"
            ));
        }
        let mut check = Check::default();
        check
            .variant(
                &mut tuned,
                Variant::Auto,
                &input,
                &expected,
                shape,
                TOLERANCE,
            )
            .map_err(|f| f.to_string())?;
        // A fresh instance reads the choice back from the file.
        let mut reloaded = Softmax::new()
            .map_err(|e| e.to_string())?
            .with_tune_cache(Some(cache.clone()))
            .map_err(|e| e.to_string())?;
        if reloaded
            .kernels_for(Variant::Auto, shape)
            .map_err(|e| e.to_string())?
            != after
        {
            return Err(format!("{shape}: the tuned choice did not persist"));
        }
        summary.push(format!("{shape}: {heuristic:?} -> {chosen}"));
    }
    // The harness's instance keeps its own (default) cache: tuning one instance changes no other.
    let shape = Shape::new(32, 151936).unwrap();
    if softmax
        .kernels_for(Variant::Auto, shape)
        .map_err(|e| e.to_string())?
        == tuned
            .kernels_for(Variant::Auto, shape)
            .map_err(|e| e.to_string())?
    {
        summary.push("(tuned choice equals the heuristic for 32x151936)".into());
    }
    let _ = std::fs::remove_file(&cache);
    Ok(summary.join("; "))
}
