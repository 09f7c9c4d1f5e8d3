//! GPU fuzzing, concurrency and soak. Without a CUDA device each test is reported skipped.
//! `SOFTMAX_TEST_SEED=N` replays a run; a test name as the first argument filters.

mod common;

use std::thread;
use std::time::Duration;

use common::{Check, poisoned};
use cust::launch;
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::module::Module;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::half::bf16;
use softmax::reference::{backward_f64, deviation, softmax_f64, value_deviation};
use softmax::{DType, Error, Operation, Options, Rows, RowsMut, Shape, Softmax, Variant};

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
    (
        "chained_launches_read_what_the_previous_launch_wrote",
        chained_launches,
    ),
    (
        "launches_wait_for_a_previous_kernel_that_writes_late",
        late_writer,
    ),
    (
        "sliced_rows_are_exact_when_blocks_leave_their_slices",
        leaving_blocks,
    ),
];

const TOLERANCE: f64 = 1e-5;
/// bf16 outputs, each element and each row's sum: one step of 8 bits of mantissa is 2^-7
/// relative at worst (as gpu_ops states).
const BF16_TOLERANCE: f64 = 1.5e-2;
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
        let expected = softmax_f64(&input, shape.rows(), shape.cols());
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
        let deviation = deviation(&result[out_offset..], &expected, shape.cols());
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
        let expected = softmax_f64(&input, shape.rows(), shape.cols());
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
        let expected = softmax_f64(&input, shape.rows(), shape.cols());
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
        let deviation = deviation(&result, expected, shape.cols());
        if !deviation.within(TOLERANCE) {
            return Err(format!("{shape}: {deviation:?}"));
        }
    }
    Ok(format!(
        "{} launches on two streams from one thread correct",
        pending.len()
    ))
}

/// A variant on a shape for each kernel family that launches with programmatic overlap (the
/// sliced 32×151936 among them).
const DEPENDENT_CASES: [(Variant, usize, usize); 11] = [
    (Variant::Auto, 4096, 1000),
    (Variant::Auto, 65536, 100),
    (Variant::Auto, 64, 16384),
    (Variant::Auto, 128, 50257),
    (Variant::Auto, 32, 151936),
    (Variant::SplitRows, 8, 128256),
    (Variant::RowCluster, 64, 151936),
    (Variant::Unfused, 64, 3000),
    (Variant::ThreadPerRowOnline, 2000, 64),
    (
        Variant::BlockPerRowSmem {
            threads_per_block: 256,
        },
        300,
        5000,
    ),
    (Variant::WarpPerRowOnline, 1000, 700),
];

/// Launches that read the previous launch's output, enqueued back to back: x → y → z for
/// many inputs before one synchronization, each step against the reference of its actual
/// input. Non-cooperative launches may start before the previous kernel's completion is
/// signalled (programmatic dependent launch); this checks that results stay right under that
/// overlap. It is not a reliable detector of a kernel that skipped its wait (the window is
/// the previous kernel's final flush); the CPU test over every entry's PTX is.
fn chained_launches(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    const CHAINS: usize = 12;
    let cuda = |e: cust::error::CudaError| e.to_string();
    let (mut checked, mut refused) = (0, Vec::new());
    for (variant, rows, cols) in DEPENDENT_CASES {
        let shape = Shape::new(rows, cols).unwrap();
        let mut chains = Vec::new();
        for _ in 0..CHAINS {
            let x =
                DeviceBuffer::from_slice(&common::random_matrix(rng, shape, 8.0)).map_err(cuda)?;
            let (mut y, mut z) = (poisoned(shape.len())?, poisoned(shape.len())?);
            match softmax.run(variant, &x, &mut y, shape) {
                Err(Error::Unsupported { .. }) => {
                    refused.push(format!("{variant} on {shape}"));
                    break;
                }
                other => other.map_err(|e| format!("{variant} on {shape}: {e}"))?,
            }
            softmax
                .run(variant, &y, &mut z, shape)
                .map_err(|e| format!("{variant} on {shape}: {e}"))?;
            chains.push((x, y, z));
        }
        softmax.synchronize().map_err(|e| e.to_string())?;
        for (x, y, z) in &chains {
            let mut values = [
                vec![0.0; shape.len()],
                vec![0.0; shape.len()],
                vec![0.0; shape.len()],
            ];
            x.copy_to(&mut values[0][..]).map_err(cuda)?;
            y.copy_to(&mut values[1][..]).map_err(cuda)?;
            z.copy_to(&mut values[2][..]).map_err(cuda)?;
            for stage in 0..2 {
                let expected = softmax_f64(&values[stage], rows, cols);
                let deviation = deviation(&values[stage + 1], &expected, cols);
                if !deviation.within(TOLERANCE) {
                    return Err(format!(
                        "{variant} on {shape}, launch {} of a chain: {deviation:?}",
                        stage + 1
                    ));
                }
            }
            checked += 1;
        }
    }
    let shape = Shape::new(4096, 1000).unwrap();
    let to_bf16 = |values: Vec<f32>| values.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let mut chains = Vec::new();
    for _ in 0..CHAINS {
        let x = DeviceBuffer::from_slice(&to_bf16(common::random_matrix(rng, shape, 8.0)))
            .map_err(cuda)?;
        let poison = to_bf16(vec![f32::NAN; shape.len()]);
        let (mut y, mut z) = (
            DeviceBuffer::from_slice(&poison).map_err(cuda)?,
            DeviceBuffer::from_slice(&poison).map_err(cuda)?,
        );
        let mut bf16_softmax = |input: &DeviceBuffer<bf16>, output: &mut DeviceBuffer<bf16>| {
            let (input, output) = (
                Rows::new(input, shape).map_err(|e| e.to_string())?,
                RowsMut::new(output, shape).map_err(|e| e.to_string())?,
            );
            softmax
                .forward(Operation::Softmax, input, output, &Options::new())
                .map_err(|e| format!("bf16 softmax on {shape}: {e}"))
        };
        bf16_softmax(&x, &mut y)?;
        bf16_softmax(&y, &mut z)?;
        chains.push((x, y, z));
    }
    softmax.synchronize().map_err(|e| e.to_string())?;
    for (x, y, z) in &chains {
        let mut values = [
            vec![bf16::ZERO; shape.len()],
            vec![bf16::ZERO; shape.len()],
            vec![bf16::ZERO; shape.len()],
        ];
        x.copy_to(&mut values[0][..]).map_err(cuda)?;
        y.copy_to(&mut values[1][..]).map_err(cuda)?;
        z.copy_to(&mut values[2][..]).map_err(cuda)?;
        let widened: Vec<Vec<f32>> = values
            .iter()
            .map(|v| v.iter().map(|e| e.to_f32()).collect())
            .collect();
        for stage in 0..2 {
            let expected = softmax_f64(&widened[stage], shape.rows(), shape.cols());
            check_bf16_rows(&widened[stage + 1], &expected, shape.cols()).map_err(|why| {
                format!("bf16 on {shape}, launch {} of a chain: {why}", stage + 1)
            })?;
        }
        checked += 1;
    }
    if checked < CHAINS * 2 {
        return Err(format!("only {checked} chains ran; refused: {refused:?}"));
    }
    Ok(format!(
        "{checked} chains of two dependent launches, enqueued without waiting, match the reference at each step; refused as unsupported: {refused:?}"
    ))
}

/// Runs `variant` on `x` (holding `values`, or about to) into `y` (poisoned by the caller,
/// before anything it enqueued: an allocation or a synchronous copy between two launches
/// would separate them), waits, and checks the result against the reference; `Ok(false)`
/// when the variant refuses the shape.
fn run_f32_checked(
    softmax: &mut Softmax,
    variant: Variant,
    (x, y): (&DeviceBuffer<f32>, &mut DeviceBuffer<f32>),
    values: &[f32],
    shape: Shape,
    what: &str,
) -> Result<bool, String> {
    match softmax.run(variant, x, y, shape) {
        Err(Error::Unsupported { .. }) => return Ok(false),
        other => other.map_err(|e| format!("{variant} on {shape}: {e}"))?,
    }
    softmax.synchronize().map_err(|e| e.to_string())?;
    let mut output = vec![0.0; shape.len()];
    y.copy_to(&mut output[..]).map_err(|e| e.to_string())?;
    let deviation = deviation(
        &output,
        &softmax_f64(values, shape.rows(), shape.cols()),
        shape.cols(),
    );
    if !deviation.within(TOLERANCE) {
        return Err(format!("{variant} on {shape} {what}: {deviation:?}"));
    }
    Ok(true)
}

/// bf16 softmax through the forward call from `x` (holding `values`, or about to) into `y`
/// (poisoned by the caller, as for [`run_f32_checked`]), waits, and checks the result against
/// the reference.
fn forward_bf16_checked(
    softmax: &mut Softmax,
    (x, y): (&DeviceBuffer<bf16>, &mut DeviceBuffer<bf16>),
    values: &[bf16],
    shape: Shape,
    what: &str,
) -> Result<(), String> {
    softmax
        .forward(
            Operation::Softmax,
            Rows::new(x, shape).map_err(|e| e.to_string())?,
            RowsMut::new(y, shape).map_err(|e| e.to_string())?,
            &Options::new(),
        )
        .map_err(|e| format!("bf16 softmax on {shape}: {e}"))?;
    softmax.synchronize().map_err(|e| e.to_string())?;
    let mut output = vec![bf16::ZERO; shape.len()];
    y.copy_to(&mut output[..]).map_err(|e| e.to_string())?;
    let widened = |v: &[bf16]| v.iter().map(|e| e.to_f32()).collect::<Vec<_>>();
    let expected = softmax_f64(&widened(values), shape.rows(), shape.cols());
    check_bf16_rows(&widened(&output), &expected, shape.cols())
        .map_err(|why| format!("bf16 on {shape} {what}: {why}"))
}

/// Checks a bf16 softmax output (widened) row by row against the f64 reference of its input
/// as bf16 holds it: each element and each row's sum ([`common::check_rows`]).
fn check_bf16_rows(output: &[f32], expected: &[f64], cols: usize) -> Result<(), String> {
    let written = common::as_written::<bf16>(expected);
    let values = common::RowValues::Probabilities;
    common::check_rows(output, &written, cols, values, DType::Bf16, BF16_TOLERANCE).map(|_| ())
}

/// A bf16 buffer of `len` NaN.
fn poisoned_bf16(len: usize) -> Result<DeviceBuffer<bf16>, String> {
    DeviceBuffer::from_slice(&vec![bf16::NAN; len]).map_err(|e| e.to_string())
}

/// Random bf16 contents for `shape`.
fn random_bf16(rng: &mut StdRng, shape: Shape) -> Vec<bf16> {
    common::random_matrix(rng, shape, 8.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect()
}

/// A kernel that lets the next grid in its stream start at once
/// (`griddepcontrol.launch_dependents`), spins for `spin_ns` nanoseconds, then copies `words`
/// 32-bit words from `src` to `dst` (grid-stride). `ptxas -arch=sm_90` accepts it.
const LATE_COPY_PTX: &str = ".version 7.8
.target sm_90
.address_size 64

.visible .entry late_copy(
\t.param .u64 late_copy_src,
\t.param .u64 late_copy_dst,
\t.param .u64 late_copy_words,
\t.param .u64 late_copy_spin_ns
)
{
\t.reg .pred \t%p<3>;
\t.reg .b32 \t%r<6>;
\t.reg .b64 \t%rd<16>;

\tgriddepcontrol.launch_dependents;
\tld.param.u64 \t%rd1, [late_copy_src];
\tld.param.u64 \t%rd2, [late_copy_dst];
\tld.param.u64 \t%rd3, [late_copy_words];
\tld.param.u64 \t%rd4, [late_copy_spin_ns];
\tcvta.to.global.u64 \t%rd1, %rd1;
\tcvta.to.global.u64 \t%rd2, %rd2;
\tmov.u64 \t%rd5, %globaltimer;
\tadd.u64 \t%rd6, %rd5, %rd4;
$SPIN:
\tmov.u64 \t%rd7, %globaltimer;
\tsetp.lt.u64 \t%p1, %rd7, %rd6;
\t@%p1 bra \t$SPIN;
\tmov.u32 \t%r1, %ctaid.x;
\tmov.u32 \t%r2, %ntid.x;
\tmov.u32 \t%r3, %tid.x;
\tmov.u32 \t%r4, %nctaid.x;
\tmul.wide.u32 \t%rd8, %r1, %r2;
\tcvt.u64.u32 \t%rd9, %r3;
\tadd.u64 \t%rd8, %rd8, %rd9;
\tmul.wide.u32 \t%rd10, %r4, %r2;
$COPY:
\tsetp.ge.u64 \t%p2, %rd8, %rd3;
\t@%p2 bra \t$DONE;
\tshl.b64 \t%rd11, %rd8, 2;
\tadd.u64 \t%rd12, %rd1, %rd11;
\tld.global.b32 \t%r5, [%rd12];
\tadd.u64 \t%rd13, %rd2, %rd11;
\tst.global.b32 \t[%rd13], %r5;
\tadd.u64 \t%rd8, %rd8, %rd10;
\tbra.uni \t$COPY;
$DONE:
\tret;
}
";

/// How long the late writer spins before it writes.
const LATE_WRITE_NS: u64 = 100_000;

/// Enqueues the late writer copying `source` into `destination` on the library's stream.
fn write_late<T: DeviceCopy>(
    softmax: &Softmax,
    module: &Module,
    source: &DeviceBuffer<T>,
    destination: &DeviceBuffer<T>,
) -> Result<(), String> {
    let words = (source.len() * size_of::<T>() / 4) as u64;
    let stream = softmax.stream();
    // SAFETY: `late_copy` reads `words` 32-bit words of `source` and writes as many of
    // `destination`, two distinct buffers of that many bytes.
    unsafe {
        launch!(module.late_copy<<<132, 256, 0, stream>>>(
            source.as_device_ptr(),
            destination.as_device_ptr(),
            words,
            LATE_WRITE_NS
        ))
    }
    .map_err(|e| format!("launching late_copy: {e}"))
}

/// Each kernel family launched right after a kernel that lets it start at once but writes the
/// family's input only 100 µs later: a kernel that read its input before its
/// `griddepcontrol.wait` (or a launch that skipped the wait's guarantee) would read the NaN
/// poison the input starts with.
fn late_writer(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let module = Module::from_ptx(LATE_COPY_PTX, &[]).map_err(|e| e.to_string())?;
    let cuda = |e: cust::error::CudaError| e.to_string();
    let (mut checked, mut refused) = (0, Vec::new());
    for (variant, rows, cols) in DEPENDENT_CASES {
        let shape = Shape::new(rows, cols).unwrap();
        let values = common::random_matrix(rng, shape, 8.0);
        let source = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let (x, mut y) = (poisoned(shape.len())?, poisoned(shape.len())?);
        write_late(softmax, &module, &source, &x)?;
        let what = "after a late writer";
        if run_f32_checked(softmax, variant, (&x, &mut y), &values, shape, what)? {
            checked += 1;
        } else {
            refused.push(format!("{variant} on {shape}"));
        }
    }
    for (rows, cols) in [(4096, 1000), (128, 50257), (64, 8192)] {
        let shape = Shape::new(rows, cols).unwrap();
        let values = random_bf16(rng, shape);
        // Whole 32-bit words: every shape here has an even number of elements.
        let source = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let (x, mut y) = (poisoned_bf16(shape.len())?, poisoned_bf16(shape.len())?);
        write_late(softmax, &module, &source, &x)?;
        forward_bf16_checked(softmax, (&x, &mut y), &values, shape, "after a late writer")?;
        checked += 1;
    }
    if checked < 10 {
        return Err(format!("only {checked} cases ran; refused: {refused:?}"));
    }
    Ok(format!(
        "{checked} launches right after a kernel that writes their input 100 µs late read it as written; refused as unsupported: {refused:?}"
    ))
}

/// Row-slices shapes (f32, and bf16 through the forward call) on an instance whose blocks wait
/// no time for their rows: nearly every block leaves its slice to its row's last block, which
/// writes it from the input again. The results must be as exact as ever.
fn leaving_blocks(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut impatient = Softmax::new().map_err(|e| e.to_string())?;
    impatient.set_row_barrier_patience(Duration::ZERO);
    let cuda = |e: cust::error::CudaError| e.to_string();
    let mut checked = 0;
    for (rows, cols) in [
        (32, 151936),
        (16, 262144),
        (8, 128256),
        (1, 1048576),
        (3, 100003),
        (17, 50001),
        (2, 65537),
    ] {
        let shape = Shape::new(rows, cols).unwrap();
        let values = common::random_matrix(rng, shape, 8.0);
        let x = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let mut y = poisoned(shape.len())?;
        let (variant, what) = (Variant::RowSlices, "with blocks leaving");
        if !run_f32_checked(&mut impatient, variant, (&x, &mut y), &values, shape, what)? {
            return Err(format!("row-slices refused {shape}"));
        }
        checked += 1;
    }
    for (rows, cols) in [(32, 151936), (16, 262144), (64, 151936), (5, 99999)] {
        let shape = Shape::new(rows, cols).unwrap();
        let values = random_bf16(rng, shape);
        let (x, mut y) = (
            DeviceBuffer::from_slice(&values).map_err(cuda)?,
            poisoned_bf16(shape.len())?,
        );
        forward_bf16_checked(
            &mut impatient,
            (&x, &mut y),
            &values,
            shape,
            "with blocks leaving",
        )?;
        checked += 1;
    }
    Ok(format!(
        "{checked} sliced launches with zero patience (nearly every block leaving) matched the reference"
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

/// One buffer set of the soak: an f32 input and output for the variants, a bf16 copy of
/// the input and a bf16 output for the operation API's forward, and an incoming gradient and
/// its result for the backward pass (from the f32 output).
struct SoakBuffers {
    shape: Shape,
    input: Vec<f32>,
    device_input: DeviceBuffer<f32>,
    device_output: DeviceBuffer<f32>,
    input_bf16: DeviceBuffer<bf16>,
    output_bf16: DeviceBuffer<bf16>,
    gradient: Vec<f32>,
    device_gradient: DeviceBuffer<f32>,
    device_dx: DeviceBuffer<f32>,
}

impl SoakBuffers {
    fn new(rng: &mut StdRng, shape: Shape) -> Result<Self, String> {
        let text = |e: cust::error::CudaError| e.to_string();
        let input = random_contents(rng, shape);
        let gradient = common::random_matrix(rng, shape, 1.0);
        let input_bf16: Vec<bf16> = input.iter().map(|&v| bf16::from_f32(v)).collect();
        Ok(SoakBuffers {
            shape,
            device_input: DeviceBuffer::from_slice(&input).map_err(text)?,
            device_output: poisoned(shape.len())?,
            input_bf16: DeviceBuffer::from_slice(&input_bf16).map_err(text)?,
            output_bf16: DeviceBuffer::from_slice(&vec![bf16::NAN; shape.len()]).map_err(text)?,
            device_gradient: DeviceBuffer::from_slice(&gradient).map_err(text)?,
            device_dx: poisoned(shape.len())?,
            input,
            gradient,
        })
    }

    /// Launch `kind`: a variant of `variants`, then the bf16 forward, then the backward.
    fn launch(
        &mut self,
        softmax: &mut Softmax,
        variants: &[Variant],
        kind: usize,
    ) -> Result<(), Error> {
        let shape = self.shape;
        match kind.checked_sub(variants.len()) {
            None => softmax.run(
                variants[kind],
                &self.device_input,
                &mut self.device_output,
                shape,
            ),
            Some(0) => softmax.forward(
                Operation::Softmax,
                Rows::new(&self.input_bf16, shape)?,
                RowsMut::new(&mut self.output_bf16, shape)?,
                &Options::new(),
            ),
            Some(_) => softmax.backward(
                Operation::Softmax,
                Rows::new(&self.device_output, shape)?,
                Rows::new(&self.device_gradient, shape)?,
                RowsMut::new(&mut self.device_dx, shape)?,
                &Options::new(),
            ),
        }
    }

    /// Every output against the reference after the soak.
    fn check(&self) -> Result<(), String> {
        let (shape, text) = (self.shape, |e: cust::error::CudaError| e.to_string());
        let expected = softmax_f64(&self.input, shape.rows(), shape.cols());
        let mut output = vec![0.0; shape.len()];
        self.device_output.copy_to(&mut output[..]).map_err(text)?;
        let mut output_bf16 = vec![bf16::ZERO; shape.len()];
        self.output_bf16
            .copy_to(&mut output_bf16[..])
            .map_err(text)?;
        let output_bf16: Vec<f32> = output_bf16.into_iter().map(bf16::to_f32).collect();
        let rounded: Vec<f32> = self
            .input
            .iter()
            .map(|&v| bf16::from_f32(v).to_f32())
            .collect();
        let expected_bf16 = softmax_f64(&rounded, shape.rows(), shape.cols());
        let mut dx = vec![0.0; shape.len()];
        self.device_dx.copy_to(&mut dx[..]).map_err(text)?;
        let expected_dx = backward_f64(
            false,
            &output,
            &self.gradient,
            shape.cols(),
            &vec![1.0; shape.rows()],
        );
        let deviation = deviation(&output, &expected, shape.cols());
        if !deviation.within(TOLERANCE) {
            return Err(format!(
                "f32 softmax on {shape} after the soak: {deviation:?}"
            ));
        }
        check_bf16_rows(&output_bf16, &expected_bf16, shape.cols())
            .map_err(|why| format!("bf16 softmax on {shape} after the soak: {why}"))?;
        let deviation = value_deviation(&dx, &expected_dx);
        if !deviation.within(4e-5) {
            return Err(format!("backward on {shape} after the soak: {deviation:?}"));
        }
        Ok(())
    }
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
    // Each variant, then the operation API's bf16 forward and f32 backward.
    let kinds = variants.len() + 2;
    let mut buffers = Vec::new();
    for (rows, cols) in shapes {
        buffers.push(SoakBuffers::new(rng, Shape::new(rows, cols).unwrap())?);
    }
    // Launches `count` supported (kind, shape) pairs in rotation; refused pairs are skipped.
    let mut launch_mixed = |softmax: &mut Softmax, count: usize| -> Result<(), String> {
        let (mut launched, mut i) = (0, 0);
        while launched < count {
            let set = &mut buffers[i % shapes.len()];
            let kind = (i / shapes.len()) % kinds;
            i += 1;
            match set.launch(softmax, &variants, kind) {
                Err(Error::Unsupported { .. }) => continue,
                Err(error) => {
                    return Err(format!(
                        "launch {launched}: kind {kind} on {}: {error}",
                        set.shape
                    ));
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
    launch_mixed(softmax, shapes.len() * kinds)?;
    let before = free_device_memory()?;
    launch_mixed(softmax, SOAK_LAUNCHES)?;
    let after = free_device_memory()?;
    for set in &buffers {
        set.check()?;
    }
    if after < before {
        return Err(format!(
            "device memory shrank by {} bytes over the soak",
            before - after
        ));
    }
    Ok(format!(
        "{SOAK_LAUNCHES} launches (variants, bf16 forward, backward), free device memory {} MiB before and {} MiB after",
        before >> 20,
        after >> 20
    ))
}
