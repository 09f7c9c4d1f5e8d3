//! The library inside someone else's GPU pipeline: calls on the caller's stream, cudarc
//! buffers, capture into a CUDA graph, overlapping buffers refused, a tuned choice that cannot
//! run a shape, a crowded GPU, and a fault in one of the library's own launches.

mod common;

use common::text;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::stream::{Stream, StreamFlags};
use cust::sys;
use cust::{context::CurrentContext, launch};
use half::bf16;
use rand::rngs::StdRng;
use softmax::reference::{backward_f64, deviation, softmax_f64};
use softmax::{
    CallKind, CallStream, DType, Error, Operation, Options, Rows, RowsMut, Shape, Softmax, Variant,
};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    (
        "calls_on_the_callers_stream_follow_its_late_writer",
        callers_stream,
    ),
    (
        "graph_replays_equal_direct_calls_bit_for_bit",
        graph_capture,
    ),
    ("overlapping_buffers_are_refused", overlap_refused),
    (
        "rows_without_columns_give_the_identity_state",
        zero_width_rows,
    ),
    (
        "a_tuned_choice_that_cannot_run_a_shape_falls_back",
        tuned_fallback,
    ),
    ("sliced_rows_finish_on_a_crowded_gpu", crowded_gpu),
    (
        "a_fault_in_a_library_launch_is_reported_and_recovered_from",
        library_fault,
    ),
    #[cfg(feature = "cudarc")]
    ("cudarc_buffers_match_the_reference", cudarc_buffers),
];

/// The environment variable that makes this binary the faulting child of `library_fault`.
const FAULT_CHILD: &str = "SOFTMAX_TEST_FAULT_CHILD";

fn main() -> ExitCode {
    if std::env::var_os(FAULT_CHILD).is_some() {
        return fault_child();
    }
    common::run_harness(TESTS)
}

fn to_host<T: DeviceCopy + Default + Clone>(buffer: &DeviceBuffer<T>) -> Result<Vec<T>, String> {
    let mut host = vec![T::default(); buffer.len()];
    buffer.copy_to(&mut host[..]).map_err(text)?;
    Ok(host)
}

fn widened(values: &[bf16]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32()).collect()
}

fn non_blocking_stream() -> Result<Stream, String> {
    Stream::new(StreamFlags::NON_BLOCKING, None).map_err(text)
}

/// Checks f32 softmax rows against the reference.
fn check_softmax(output: &[f32], input: &[f32], shape: Shape, what: &str) -> Result<(), String> {
    let expected = softmax_f64(input, shape.rows(), shape.cols());
    let deviation = deviation(output, &expected, shape.cols());
    if !deviation.within(1e-5) {
        return Err(format!("{what} on {shape}: {deviation:?}"));
    }
    Ok(())
}

/// Checks bf16 softmax rows: each element within bf16's rounding of the reference, each row
/// summing to 1 within its elements' rounding.
fn check_softmax_bf16(
    output: &[bf16],
    input: &[bf16],
    shape: Shape,
    what: &str,
) -> Result<(), String> {
    let expected = softmax_f64(&widened(input), shape.rows(), shape.cols());
    for (r, (row, want)) in output
        .chunks(shape.cols())
        .zip(expected.chunks(shape.cols()))
        .enumerate()
    {
        let mut sum = 0.0;
        for (&got, &want) in row.iter().zip(want) {
            let got = f64::from(got.to_f32());
            sum += got;
            if (got - want).abs() > want * (1.0 / 128.0) + 1e-38 {
                return Err(format!("{what} on {shape}: row {r}: {got} where {want}"));
            }
        }
        if (sum - 1.0).abs() > 1.0 / 64.0 {
            return Err(format!("{what} on {shape}: row {r} sums to {sum}"));
        }
    }
    Ok(())
}

/// Calls issued on the caller's stream right after a kernel of the caller's that writes their
/// input 100 µs late (and lets the next grid start at once) read the final input: the work
/// is ordered on that stream, not on the library's.
fn callers_stream(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let module = common::kernels::load(0)?;
    let stream = non_blocking_stream()?;
    let mut checked = 0;
    for (rows, cols) in [(4096, 1000), (32, 151936), (1, 1 << 20)] {
        let shape = Shape::new(rows, cols).map_err(text)?;
        let values = common::random_matrix(rng, shape, 8.0);
        let source = DeviceBuffer::from_slice(&values).map_err(text)?;
        let x = DeviceBuffer::from_slice(&vec![0.0f32; shape.len()]).map_err(text)?;
        let mut y = common::poisoned(shape.len())?;
        let raw_y = common::poisoned(shape.len())?;
        CurrentContext::synchronize().map_err(text)?;
        common::kernels::write_late(&module, &stream, &source, &x)?;
        common::run_on(softmax, &Options::new().on(&stream), &x, &mut y, shape).map_err(text)?;
        // The raw entry point on the same stream, after another late write.
        common::kernels::write_late(&module, &stream, &source, &x)?;
        let address = |b: &DeviceBuffer<f32>| b.as_device_ptr().as_raw();
        // SAFETY: both buffers hold `shape` contiguous f32 of this device and outlive the
        // stream's work (synchronized below); nothing else touches them meanwhile; the stream
        // is the primary context's.
        unsafe {
            let cols = shape.cols();
            Rows::raw(address(&x), DType::F32, shape, cols).and_then(|x| {
                let y = RowsMut::raw(address(&raw_y), DType::F32, shape, cols)?;
                let on = Options::new().on(CallStream::raw(stream.as_inner()));
                softmax.forward(Operation::Softmax, x, y, &on)
            })
        }
        .map_err(text)?;
        stream.synchronize().map_err(text)?;
        check_softmax(&to_host(&y)?, &values, shape, "run on the caller's stream")?;
        check_softmax(
            &to_host(&raw_y)?,
            &values,
            shape,
            "forward_raw on the caller's stream",
        )?;
        checked += 2;
    }
    // bf16 through the operation kernels (8 × 128256: rows sliced, cooperative).
    let shape = Shape::new(8, 128256).map_err(text)?;
    let values: Vec<bf16> = common::random_matrix(rng, shape, 8.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let source = DeviceBuffer::from_slice(&values).map_err(text)?;
    let x = DeviceBuffer::from_slice(&vec![bf16::ZERO; shape.len()]).map_err(text)?;
    let mut y = DeviceBuffer::from_slice(&vec![bf16::NAN; shape.len()]).map_err(text)?;
    CurrentContext::synchronize().map_err(text)?;
    common::kernels::write_late(&module, &stream, &source, &x)?;
    softmax
        .forward(
            Operation::Softmax,
            Rows::new(&x, shape).map_err(text)?,
            RowsMut::new(&mut y, shape).map_err(text)?,
            &Options::new().on(&stream),
        )
        .map_err(text)?;
    stream.synchronize().map_err(text)?;
    check_softmax_bf16(
        &to_host(&y)?,
        &values,
        shape,
        "bf16 forward on the caller's stream",
    )?;
    checked += 1;
    Ok(format!(
        "{checked} calls on the caller's stream read their input as its late writer left it"
    ))
}

/// f32 softmax (row-slices over sliced rows), a bf16 forward (operation kernels, cooperative)
/// and an f32 backward captured into one graph, replayed 100 times on fresh inputs: every
/// replay equals the same calls made directly, bit for bit. A call that was not reserved is
/// refused during the capture, which stays usable.
fn graph_capture(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let a = Shape::new(32, 151936).map_err(text)?;
    let b = Shape::new(8, 128256).map_err(text)?;
    let c = Shape::new(512, 4000).map_err(text)?;
    softmax
        .reserve(&[
            (CallKind::Run(Variant::Auto), a),
            (
                CallKind::Forward {
                    input: DType::Bf16,
                    masked: false,
                },
                b,
            ),
            (CallKind::Backward { input: DType::F32 }, c),
        ])
        .map_err(text)?;
    let zeros = |len| DeviceBuffer::from_slice(&vec![0.0f32; len]).map_err(text);
    let (mut xa, mut ya, mut ya_direct) = (zeros(a.len())?, zeros(a.len())?, zeros(a.len())?);
    let mut xb = DeviceBuffer::from_slice(&vec![bf16::ZERO; b.len()]).map_err(text)?;
    let mut yb = DeviceBuffer::from_slice(&vec![bf16::ZERO; b.len()]).map_err(text)?;
    let mut yb_direct = DeviceBuffer::from_slice(&vec![bf16::ZERO; b.len()]).map_err(text)?;
    let (mut yc, mut dyc, mut dxc, mut dxc_direct) = (
        zeros(c.len())?,
        zeros(c.len())?,
        zeros(c.len())?,
        zeros(c.len())?,
    );
    let unreserved = Shape::new(3, 77_777).map_err(text)?;
    let (xu, mut yu) = (zeros(unreserved.len())?, zeros(unreserved.len())?);
    let stream = non_blocking_stream()?;

    common::begin_capture(&stream)?;
    let captured = (|| -> Result<Option<String>, Error> {
        let on = Options::new().on(&stream);
        common::run_on(softmax, &on, &xa, &mut ya, a)?;
        softmax.forward(
            Operation::Softmax,
            Rows::new(&xb, b)?,
            RowsMut::new(&mut yb, b)?,
            &on,
        )?;
        softmax.backward(
            Operation::Softmax,
            Rows::new(&yc, c)?,
            Rows::new(&dyc, c)?,
            RowsMut::new(&mut dxc, c)?,
            &on,
        )?;
        Ok(
            match common::run_on(softmax, &on, &xu, &mut yu, unreserved) {
                Err(Error::NotReserved { .. }) => None,
                other => Some(format!("an unreserved call during capture gave {other:?}")),
            },
        )
    })();
    let exec = common::end_capture(&stream);
    let unexpected = captured.map_err(|e| format!("a reserved call during capture: {e}"))?;
    let exec = exec?;
    if let Some(why) = unexpected {
        return Err(why);
    }

    let replays = 100;
    for replay in 0..replays {
        let va = common::random_matrix(rng, a, 8.0);
        let vb: Vec<bf16> = common::random_matrix(rng, b, 8.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let vyc = softmax_f64(&common::random_matrix(rng, c, 4.0), c.rows(), c.cols());
        let vyc: Vec<f32> = vyc.iter().map(|&v| v as f32).collect();
        let vdyc = common::random_matrix(rng, c, 1.0);
        xa.copy_from(&va[..]).map_err(text)?;
        xb.copy_from(&vb[..]).map_err(text)?;
        yc.copy_from(&vyc[..]).map_err(text)?;
        dyc.copy_from(&vdyc[..]).map_err(text)?;
        // Pageable uploads may return before their data lands: wait for the device.
        CurrentContext::synchronize().map_err(text)?;
        // SAFETY: the executable graph and the stream belong to the current context.
        let status = unsafe { sys::cuGraphLaunch(exec, stream.as_inner()) };
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("replay {replay}: launching the graph: {status:?}"));
        }
        let on = Options::new().on(&stream);
        common::run_on(softmax, &on, &xa, &mut ya_direct, a).map_err(text)?;
        softmax
            .forward(
                Operation::Softmax,
                Rows::new(&xb, b).map_err(text)?,
                RowsMut::new(&mut yb_direct, b).map_err(text)?,
                &on,
            )
            .map_err(text)?;
        softmax
            .backward(
                Operation::Softmax,
                Rows::new(&yc, c).map_err(text)?,
                Rows::new(&dyc, c).map_err(text)?,
                RowsMut::new(&mut dxc_direct, c).map_err(text)?,
                &on,
            )
            .map_err(text)?;
        stream.synchronize().map_err(text)?;
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let bits16 = |v: Vec<bf16>| v.into_iter().map(bf16::to_bits).collect::<Vec<_>>();
        if bits(to_host(&ya)?) != bits(to_host(&ya_direct)?) {
            return Err(format!(
                "replay {replay}: f32 softmax differs from the direct call"
            ));
        }
        if bits16(to_host(&yb)?) != bits16(to_host(&yb_direct)?) {
            return Err(format!(
                "replay {replay}: bf16 forward differs from the direct call"
            ));
        }
        if bits(to_host(&dxc)?) != bits(to_host(&dxc_direct)?) {
            return Err(format!(
                "replay {replay}: backward differs from the direct call"
            ));
        }
        if replay == 0 {
            check_softmax(&to_host(&ya)?, &va, a, "replayed f32 softmax")?;
            check_softmax_bf16(&to_host(&yb)?, &vb, b, "replayed bf16 forward")?;
            let expected = backward_f64(false, &vyc, &vdyc, c.cols(), &vec![1.0; c.rows()]);
            let deviation = softmax::reference::value_deviation(&to_host(&dxc)?, &expected);
            if !deviation.within(1e-4) {
                return Err(format!("replayed backward: {deviation:?}"));
            }
        }
    }
    // SAFETY: the executable graph is no longer used.
    unsafe { sys::cuGraphExecDestroy(exec) };
    Ok(format!(
        "{replays} replays of a graph of f32 softmax {a}, bf16 forward {b} and backward {c} \
         equal the direct calls bit for bit; an unreserved call during capture was refused"
    ))
}

/// Outputs that overlap an input without being exactly it are refused before anything is
/// launched, in every call; exactly the input runs in place where the call allows it.
fn overlap_refused(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let shape = Shape::new(64, 1000).map_err(text)?;
    let n = shape.len();
    let values = common::random_matrix(rng, shape, 8.0);
    let mut padded = values.clone();
    padded.extend([0.5; 8]);
    let buffer = DeviceBuffer::from_slice(&padded).map_err(text)?;
    let input = buffer.index(0..n);
    let mut shifted = buffer.index(4..n + 4);
    let refused = |result: softmax::Result<()>, what: &str| match result {
        Err(Error::Overlap { .. }) => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    };
    refused(
        softmax.run(Variant::Auto, &input, &mut shifted, shape),
        "run",
    )?;
    refused(
        softmax.forward(
            Operation::Softmax,
            Rows::new(&input, shape).map_err(text)?,
            RowsMut::new(&mut shifted, shape).map_err(text)?,
            &Options::new(),
        ),
        "forward",
    )?;
    let mut lse = buffer.index(8..8 + shape.rows());
    refused(
        softmax.log_sum_exp(
            Rows::new(&input, shape).map_err(text)?,
            &mut lse,
            &Options::new(),
        ),
        "log_sum_exp",
    )?;
    let gradient = DeviceBuffer::from_slice(&values).map_err(text)?;
    refused(
        softmax.backward(
            Operation::Softmax,
            Rows::new(&input, shape).map_err(text)?,
            Rows::new(&gradient, shape).map_err(text)?,
            RowsMut::new(&mut shifted, shape).map_err(text)?,
            &Options::new(),
        ),
        "backward over y",
    )?;
    let mut same = buffer.index(0..n);
    refused(
        softmax.run(Variant::Auto, &input, &mut same, shape),
        "run in place (no in-place path)",
    )?;
    softmax.synchronize().map_err(text)?;
    if to_host(&buffer)? != padded {
        return Err("a refused call wrote to the buffer".into());
    }
    // Exactly the input: forward runs in place.
    softmax
        .forward(
            Operation::Softmax,
            Rows::new(&input, shape).map_err(text)?,
            RowsMut::new(&mut same, shape).map_err(text)?,
            &Options::new(),
        )
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let result = to_host(&buffer)?;
    check_softmax(&result[..n], &values, shape, "forward exactly in place")?;
    if result[n..] != padded[n..] {
        return Err("the in-place forward wrote past its rows".into());
    }
    Ok(
        "5 overlapping calls refused with nothing written; an exact in-place forward is right"
            .into(),
    )
}

/// Row states and log-sum-exp of rows with no columns: the identity state (max `-inf`, sum 0)
/// and `-inf`, written into poisoned buffers; merged with another slice's state, the identity
/// changes nothing.
fn zero_width_rows(softmax: &mut Softmax, _: &mut StdRng) -> Outcome {
    use softmax::RowState;
    let rows = 5;
    let empty = Shape::new(rows, 0).map_err(text)?;
    let no_columns = DeviceBuffer::from_slice(&[0.0f32]).map_err(text)?;
    let poison = RowState {
        max: f32::NAN,
        sum: f32::NAN,
    };
    let mut states = DeviceBuffer::from_slice(&vec![poison; rows]).map_err(text)?;
    let mut lse = common::poisoned(rows)?;
    let view = Rows::strided(&no_columns, empty, 1).map_err(text)?;
    softmax
        .row_states(view, &mut states, &Options::new())
        .map_err(text)?;
    let view = Rows::strided(&no_columns, empty, 1).map_err(text)?;
    softmax
        .log_sum_exp(view, &mut lse, &Options::new())
        .map_err(text)?;
    softmax.synchronize().map_err(text)?;
    let states = to_host(&states)?;
    if let Some(bad) = states
        .iter()
        .find(|s| !(s.max == f32::NEG_INFINITY && s.sum == 0.0))
    {
        return Err(format!("a row without columns has the state {bad:?}"));
    }
    let lse = to_host(&lse)?;
    if let Some(bad) = lse.iter().find(|&&v| v != f32::NEG_INFINITY) {
        return Err(format!("a row without columns has the log-sum-exp {bad}"));
    }
    let other = RowState { max: 2.0, sum: 3.0 };
    let merged = softmax::merge_row_states(states[0], other);
    if merged != other {
        return Err(format!(
            "merging the identity changed {other:?} into {merged:?}"
        ));
    }
    Ok(format!(
        "{rows} rows without columns: identity states and -inf log-sum-exp written"
    ))
}

/// A tune cache naming `registers` for a bucket whose shape registers cannot hold makes `Auto`
/// fall back to the built-in dispatch instead of failing.
fn tuned_fallback(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    // A second instance reads the file; this one only names the device.
    let dir = std::env::temp_dir().join(format!("softmax-tune-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(text)?;
    let path = dir.join("tune.json");
    let slug = softmax.device().slug();
    // 4096 × 2047 in fresh (16-byte aligned) buffers: not aligned (2047 % 4 ≠ 0), peelable.
    let file = format!(
        r#"{{"format": 2, "catalog": "{}", "entries": [{{"device": "{slug}", "rows_bucket": 4096,
            "cols_bucket": 2048, "aligned": false, "peelable": true, "variant": "registers"}}]}}"#,
        softmax::autotune::catalog()
    );
    std::fs::write(&path, file).map_err(text)?;
    let mut tuned = Softmax::new()
        .map_err(text)?
        .with_tune_cache(Some(path.clone()))
        .map_err(text)?;
    let shape = Shape::new(4096, 2047).map_err(text)?;
    let mut check = common::Check::default();
    let values = common::random_matrix(rng, shape, 8.0);
    let expected = softmax_f64(&values, shape.rows(), shape.cols());
    check
        .variant(&mut tuned, Variant::Auto, &values, &expected, shape, 1e-5)
        .map_err(|f| format!("Auto with a tuned choice that cannot run {shape}: {f}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!(
        "Auto on {shape} with `registers` tuned for its bucket: {}",
        check.summary()
    ))
}

/// Multiprocessors the crowded test leaves free: fewer than one row's slices fit there, so the
/// blocks of a row wait for places other kernels hold, and leave.
const FREE_MULTIPROCESSORS: u32 = 3;

/// What one crowded run saw: holders that timed out, when the last holder started, when the
/// release ran, when the first holder ended (globaltimer ns), and how long `between` and the
/// release took on the host.
struct Crowding {
    timed_out: usize,
    last_start: u64,
    released_at: u64,
    first_end: u64,
    elapsed: Duration,
}

/// Launches `holders` blocks of `hold` on `holder_stream`, each taking a multiprocessor, then
/// `between` (work on `stream`), then `release` on `stream`, which lets the holders go.
fn hold_and_release(
    module: &cust::module::Module,
    (holder_stream, stream): (&Stream, &Stream),
    (holders, shared_bytes): (u32, u32),
    between: impl FnOnce(&Stream) -> Result<(), String>,
) -> Result<Crowding, String> {
    let flag = DeviceBuffer::from_slice(&[0u32]).map_err(text)?;
    let record = DeviceBuffer::from_slice(&vec![0u64; 3 * holders as usize]).map_err(text)?;
    let released_at = DeviceBuffer::from_slice(&[0u64]).map_err(text)?;
    CurrentContext::synchronize().map_err(text)?;
    let timeout_ns: u64 = 5_000_000_000;
    // SAFETY: `hold` reads `flag` and writes three words per block of `record`, which holds
    // as many; its dynamic shared memory was allowed when the module was loaded.
    unsafe {
        launch!(module.hold<<<holders, 32, shared_bytes, holder_stream>>>(
            flag.as_device_ptr(),
            record.as_device_ptr(),
            timeout_ns
        ))
    }
    .map_err(|e| format!("launching the holders: {e}"))?;
    // Let the holders take their places first.
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    between(stream)?;
    // SAFETY: `release` writes one word of `released_at` and one of `flag`.
    unsafe {
        launch!(module.release<<<1, 1, 0, stream>>>(
            flag.as_device_ptr(),
            released_at.as_device_ptr()
        ))
    }
    .map_err(|e| format!("launching the release: {e}"))?;
    stream.synchronize().map_err(text)?;
    let elapsed = started.elapsed();
    holder_stream.synchronize().map_err(text)?;
    let record = to_host(&record)?;
    Ok(Crowding {
        timed_out: record.chunks(3).filter(|r| r[2] != 0).count(),
        last_start: record.chunks(3).map(|r| r[0]).max().unwrap_or(0),
        released_at: to_host(&released_at)?[0],
        first_end: record.chunks(3).map(|r| r[1]).min().unwrap_or(0),
        elapsed,
    })
}

/// Sliced rows launched while kernels on another stream hold all but three multiprocessors
/// until a kernel after the sliced launch releases them: the launch finishes (its blocks
/// leave their slices to each row's last block) and is exact, and the holders were released,
/// not timed out, so it ran beside them. A first run without the library checks that two
/// streams' kernels run at once on this machine at all.
fn crowded_gpu(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let info = softmax.device().clone();
    let module = common::kernels::load(info.max_shared_per_block)?;
    let holders = info.multiprocessors - FREE_MULTIPROCESSORS;
    let streams = (&non_blocking_stream()?, &non_blocking_stream()?);
    let crowd = (holders, info.max_shared_per_block);
    let probe = hold_and_release(&module, streams, crowd, |_| Ok(()))?;
    if probe.timed_out > 0 {
        return Err(format!(
            "no crowded case here: a one-thread kernel on another stream never ran beside \
             {holders} holders ({} timed out), so two streams' kernels do not run at once on \
             this machine",
            probe.timed_out
        ));
    }
    let mut summaries = Vec::new();
    for dtype in [DType::F32, DType::Bf16] {
        let shape = Shape::new(32, 151936).map_err(text)?;
        let values = common::random_matrix(rng, shape, 8.0);
        let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let x32 = DeviceBuffer::from_slice(&values).map_err(text)?;
        let mut y32 = common::poisoned(shape.len())?;
        let x16 = DeviceBuffer::from_slice(&halves).map_err(text)?;
        let mut y16 = DeviceBuffer::from_slice(&vec![bf16::NAN; shape.len()]).map_err(text)?;
        let kind = match dtype {
            DType::F32 => CallKind::Run(Variant::Auto),
            _ => CallKind::Forward {
                input: dtype,
                masked: false,
            },
        };
        // Everything that could wait for the device happens before the holders start.
        softmax.reserve(&[(kind, shape)]).map_err(text)?;
        let crowding = hold_and_release(&module, streams, crowd, |stream| {
            let on = Options::new().on(stream);
            match dtype {
                DType::F32 => common::run_on(softmax, &on, &x32, &mut y32, shape),
                _ => softmax.forward(
                    Operation::Softmax,
                    Rows::new(&x16, shape).map_err(text)?,
                    RowsMut::new(&mut y16, shape).map_err(text)?,
                    &on,
                ),
            }
            .map_err(text)
        })?;
        if crowding.timed_out > 0 {
            return Err(format!(
                "{dtype:?}: {} of {holders} holders timed out: the sliced launch did not finish \
                 beside them (the run without the library did)",
                crowding.timed_out
            ));
        }
        let Crowding {
            last_start,
            released_at,
            first_end,
            ..
        } = crowding;
        if !(last_start < released_at && released_at <= first_end) {
            return Err(format!(
                "{dtype:?}: the holders were not all resident while the sliced launch ran \
                 (last start {last_start}, release {released_at}, first end {first_end})"
            ));
        }
        match dtype {
            DType::F32 => check_softmax(&to_host(&y32)?, &values, shape, "crowded f32")?,
            _ => check_softmax_bf16(&to_host(&y16)?, &halves, shape, "crowded bf16")?,
        }
        let ms = crowding.elapsed.as_secs_f64() * 1e3;
        summaries.push(format!("{dtype:?} {shape} in {ms:.1} ms"));
    }
    Ok(format!(
        "beside {holders} multiprocessors held by another stream's kernel: {}, exact",
        summaries.join(", ")
    ))
}

/// A library launch that faults (the raw entry point given a view whose second row lies far
/// outside its buffer) comes back as `Error::Cuda` from the next synchronize; later calls in
/// that process return errors, never numbers, and nothing panics; a new process (this one,
/// after the faulting child exits) computes normally. Runs in a child process, since the
/// fault spoils the device for the rest of the process.
fn library_fault(softmax: &mut Softmax, _: &mut StdRng) -> Outcome {
    let exe = std::env::current_exe().map_err(text)?;
    let output = std::process::Command::new(exe)
        .env(FAULT_CHILD, "1")
        .output()
        .map_err(text)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "the child failed ({}): {stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let shape = Shape::new(4, 1000).map_err(text)?;
    let values: Vec<f32> = (0..shape.len()).map(|i| (i % 17) as f32 * 0.25).collect();
    let result = softmax
        .run_host(Variant::Auto, &values, shape)
        .map_err(|e| format!("this process after the child's fault: {e}"))?;
    check_softmax(
        &result,
        &values,
        shape,
        "this process after the child's fault",
    )?;
    Ok(format!(
        "{}; this process, apart from it, then computed {shape} exactly",
        stdout.trim()
    ))
}

/// The child of `library_fault`.
fn fault_child() -> ExitCode {
    match fault() {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("{why}");
            ExitCode::FAILURE
        }
    }
}

fn fault() -> Result<String, String> {
    let mut softmax = Softmax::new().map_err(text)?;
    // The output first, so that it lies below the input: the input view reaches upward from
    // its buffer, and an output inside that reach would be refused as an overlap.
    let output = DeviceBuffer::from_slice(&[0.0f32; 2048]).map_err(text)?;
    let buffer = DeviceBuffer::from_slice(&[0.5f32; 1024]).map_err(text)?;
    let shape = Shape::new(2, 1024).map_err(text)?;
    // SAFETY: deliberately broken: the input view's second row lies 4 TiB past its buffer,
    // which is what this test wants the device to fault on.
    unsafe {
        let wild =
            Rows::raw(buffer.as_device_ptr().as_raw(), DType::F32, shape, 1 << 40).map_err(text)?;
        let out =
            RowsMut::raw(output.as_device_ptr().as_raw(), DType::F32, shape, 1024).map_err(text)?;
        softmax.forward(Operation::Softmax, wild, out, &Options::new())
    }
    .map_err(|e| format!("the faulting call was refused before launch: {e}"))?;
    let reported = match softmax.synchronize() {
        Err(error @ Error::Cuda { .. }) => error.to_string(),
        other => return Err(format!("the fault was reported as {other:?}")),
    };
    let values = [0.5f32; 1000];
    let later = match softmax.run_host(Variant::Auto, &values, Shape::new(1, 1000).map_err(text)?) {
        Err(error) => error.to_string(),
        Ok(numbers) => {
            return Err(format!(
                "a call after the fault returned numbers: {:?}",
                &numbers[..3]
            ));
        }
    };
    drop((buffer, output, softmax));
    let reopened = match Softmax::new() {
        Err(error) => format!("a new instance in the same process is refused (`{error}`)"),
        Ok(_) => "a new instance in the same process opens".to_owned(),
    };
    Ok(format!(
        "the faulting launch was reported as `{reported}`; a later call as `{later}`; {reopened}"
    ))
}

/// Buffers allocated and a stream made by cudarc: forward, backward and log-sum-exp through
/// the adapter match the f64 reference.
#[cfg(feature = "cudarc")]
fn cudarc_buffers(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    use cudarc::driver::CudaContext;

    let context = CudaContext::new(softmax.device().ordinal as usize).map_err(text)?;
    let stream = context.new_stream().map_err(text)?;
    let shape = Shape::new(64, 32000).map_err(text)?;
    let values = common::random_matrix(rng, shape, 8.0);
    let x = stream.clone_htod(&values).map_err(text)?;
    let mut y = stream.alloc_zeros::<f32>(shape.len()).map_err(text)?;
    let on = Options::new().on(&stream);
    softmax
        .forward(
            Operation::Softmax,
            Rows::cudarc(&x, shape).map_err(text)?,
            RowsMut::cudarc(&mut y, shape).map_err(text)?,
            &on,
        )
        .map_err(text)?;
    let probabilities = stream.clone_dtoh(&y).map_err(text)?;
    check_softmax(&probabilities, &values, shape, "cudarc f32 forward")?;

    let halves: Vec<half2::bf16> = values.iter().map(|&v| half2::bf16::from_f32(v)).collect();
    let xb = stream.clone_htod(&halves).map_err(text)?;
    let mut yb = stream
        .alloc_zeros::<half2::bf16>(shape.len())
        .map_err(text)?;
    softmax
        .forward(
            Operation::Softmax,
            Rows::cudarc(&xb, shape).map_err(text)?,
            RowsMut::cudarc(&mut yb, shape).map_err(text)?,
            &on,
        )
        .map_err(text)?;
    let out: Vec<bf16> = stream
        .clone_dtoh(&yb)
        .map_err(text)?
        .into_iter()
        .map(|v| bf16::from_bits(v.to_bits()))
        .collect();
    let input: Vec<bf16> = halves
        .iter()
        .map(|v| bf16::from_bits(v.to_bits()))
        .collect();
    check_softmax_bf16(&out, &input, shape, "cudarc bf16 forward")?;

    let dy = stream
        .clone_htod(&common::random_matrix(rng, shape, 1.0))
        .map_err(text)?;
    let mut dx = stream.alloc_zeros::<f32>(shape.len()).map_err(text)?;
    softmax
        .backward(
            Operation::Softmax,
            Rows::cudarc(&y, shape).map_err(text)?,
            Rows::cudarc(&dy, shape).map_err(text)?,
            RowsMut::cudarc(&mut dx, shape).map_err(text)?,
            &on,
        )
        .map_err(text)?;
    let expected = backward_f64(
        false,
        &probabilities,
        &stream.clone_dtoh(&dy).map_err(text)?,
        shape.cols(),
        &vec![1.0; shape.rows()],
    );
    let deviation =
        softmax::reference::value_deviation(&stream.clone_dtoh(&dx).map_err(text)?, &expected);
    if !deviation.within(1e-4) {
        return Err(format!("cudarc backward: {deviation:?}"));
    }
    let mut lse = stream.alloc_zeros::<f32>(shape.rows()).map_err(text)?;
    let input = Rows::cudarc(&x, shape).map_err(text)?;
    softmax
        .log_sum_exp(input, softmax::ValuesMut::cudarc(&mut lse), &on)
        .map_err(text)?;
    let lse = stream.clone_dtoh(&lse).map_err(text)?;
    for (r, row) in values.chunks(shape.cols()).enumerate() {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let want = max
            + row
                .iter()
                .map(|&v| (f64::from(v) - max).exp())
                .sum::<f64>()
                .ln();
        if (f64::from(lse[r]) - want).abs() > 1e-5 * want.abs().max(1.0) {
            return Err(format!(
                "cudarc log-sum-exp row {r}: {} where {want}",
                lse[r]
            ));
        }
    }
    Ok(format!(
        "f32 and bf16 forward, backward and log-sum-exp of {shape} in cudarc buffers on a cudarc stream match the reference"
    ))
}
