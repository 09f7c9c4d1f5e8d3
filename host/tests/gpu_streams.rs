//! One instance, many streams: safe calls through one `Softmax` issued on several streams
//! without any ordering between them are exact, and never hang, for every kernel family that
//! uses the instance's workspace; beside a kernel that holds most multiprocessors too, which
//! slows the calls the way a busy GPU (or a sanitizer) does. Every test proves from event
//! timestamps that its calls were in flight at once. Also: a workspace growth on one stream
//! while another has work queued, graph replays beside direct calls, reserved plans that
//! survive any number of later shapes, the caller's current context, and cudarc's streams and
//! error slot.

mod common;

use common::{shape, text};

use std::process::ExitCode;
use std::time::Duration;

use common::kernels::{Gate, Holder};
use cust::event::{Event, EventFlags};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::stream::{Stream, StreamFlags};
use cust::sys;
use half::bf16;
use rand::rngs::StdRng;
use softmax::reference::{Scores, deviation, softmax_f64, value_deviation};
use softmax::{
    CallKind, CallStream, DType, Error, Operation, Options, RowState, Rows, RowsMut, Shape,
    Softmax, Variant,
};

type Outcome = Result<String, String>;

const TESTS: &[common::Test] = &[
    ("two_streams_through_one_instance_are_exact", two_streams),
    ("four_streams_through_one_instance_are_exact", four_streams),
    (
        "streams_beside_a_kernel_that_holds_most_multiprocessors_are_exact",
        crowded_streams,
    ),
    (
        "a_growth_on_one_stream_while_another_has_work_queued_is_exact",
        growth_beside_queued_work,
    ),
    (
        "graph_replays_beside_direct_calls_on_another_stream_are_exact",
        graph_beside_direct_calls,
    ),
    (
        "graph_branches_that_share_the_graphs_workspace_are_exact",
        graph_branches,
    ),
    (
        "reserved_plans_survive_any_number_of_later_shapes",
        reserve_is_kept,
    ),
    (
        "calls_leave_the_callers_current_context_current",
        context_restored,
    ),
    #[cfg(feature = "cudarc")]
    (
        "cudarc_buffers_written_on_one_stream_are_read_on_another",
        cudarc_across_streams,
    ),
    #[cfg(feature = "cudarc")]
    (
        "cudarc_errors_of_other_operations_stay_theirs",
        cudarc_foreign_errors,
    ),
];

fn main() -> ExitCode {
    common::run_harness(TESTS)
}

/// Rounds of every case per test: `SOFTMAX_STREAM_ROUNDS`, else 3 (fewer under a sanitizer).
fn rounds() -> usize {
    std::env::var("SOFTMAX_STREAM_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
}

fn to_host<T: DeviceCopy + Default + Clone>(buffer: &DeviceBuffer<T>) -> Result<Vec<T>, String> {
    let mut host = vec![T::default(); buffer.len()];
    buffer.copy_to(&mut host[..]).map_err(text)?;
    Ok(host)
}

fn non_blocking_stream() -> Result<Stream, String> {
    Stream::new(StreamFlags::NON_BLOCKING, None).map_err(text)
}

/// What one case computes. Each kind goes through a different part of the library.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// f32 `run(Auto)`.
    Run,
    /// f32 `run(Auto)` on an instance whose sliced blocks wait no time for their rows, so
    /// nearly every block leaves its slice to its row's last block.
    RunLeaving,
    /// bf16 softmax into bf16 (16-bit row-slices on large tensors).
    Bf16Softmax,
    /// bf16 log-softmax at a temperature into f32 (the operation kernels).
    Bf16LogSoftmax,
    /// f32 log-softmax into f32 (the operation kernels; two launches on rows too many and
    /// too wide to keep resident, more than 16 slices of a cluster in waves).
    F32LogSoftmax,
    /// bf16 row states, then the rows normalized with them into f32.
    Bf16States,
}

/// A case: a call kind on a shape, and the family of kernels it reaches (for the report).
#[derive(Clone, Copy, Debug)]
struct Case {
    kind: Kind,
    shape: Shape,
    family: &'static str,
}

/// Every family that uses the workspace (barrier words, published partials, row states), and
/// a few that do not.
fn cases() -> Vec<Case> {
    let case = |kind, rows, cols, family| Case {
        kind,
        shape: shape(rows, cols),
        family,
    };
    vec![
        case(Kind::Run, 4, 1_048_576, "f32 row-slices"),
        case(Kind::Run, 16, 262_144, "f32 row-slices"),
        case(Kind::Run, 2, 4_194_304, "f32 row-slices"),
        case(Kind::Run, 1, 128_256, "f32 block-registers, cooperative"),
        case(Kind::Run, 4, 8192, "f32 block-registers in clusters"),
        case(Kind::Run, 32, 524_288, "f32 row-cluster"),
        case(
            Kind::Run,
            128,
            128_256,
            "f32 block-registers, clusters in waves",
        ),
        case(Kind::Run, 4096, 1000, "f32 rows in registers"),
        case(
            Kind::RunLeaving,
            16,
            262_144,
            "f32 row-slices, blocks leaving",
        ),
        case(Kind::Bf16Softmax, 16, 262_144, "bf16 row-slices"),
        case(Kind::Bf16Softmax, 1, 128_256, "bf16 operation, cooperative"),
        case(
            Kind::Bf16LogSoftmax,
            8,
            128_256,
            "bf16 operation, cooperative",
        ),
        case(
            Kind::Bf16LogSoftmax,
            2,
            32_000,
            "bf16 operation in clusters",
        ),
        case(
            Kind::F32LogSoftmax,
            300,
            140_000,
            "f32 operation, two launches",
        ),
        case(
            Kind::Bf16LogSoftmax,
            256,
            128_256,
            "bf16 operation, clusters in waves",
        ),
        case(Kind::Bf16States, 1, 128_256, "bf16 row states, cooperative"),
    ]
}

/// One stream's buffers for a case: the input as the host holds it (f32, or bf16 widened) and
/// on the device, and the output.
struct Buffers {
    values: Vec<f32>,
    input32: Option<DeviceBuffer<f32>>,
    input16: Option<DeviceBuffer<bf16>>,
    output32: Option<DeviceBuffer<f32>>,
    output16: Option<DeviceBuffer<bf16>>,
    states: Option<DeviceBuffer<RowState>>,
}

impl Buffers {
    /// Fresh random input, and outputs poisoned with NaN.
    fn new(case: &Case, rng: &mut StdRng) -> Result<Self, String> {
        let n = case.shape.len();
        let raw = common::random_matrix(rng, case.shape, 8.0);
        let sixteen = matches!(
            case.kind,
            Kind::Bf16Softmax | Kind::Bf16LogSoftmax | Kind::Bf16States
        );
        let mut buffers = Buffers {
            values: raw.clone(),
            input32: None,
            input16: None,
            output32: None,
            output16: None,
            states: None,
        };
        if sixteen {
            let halves: Vec<bf16> = raw.iter().map(|&v| bf16::from_f32(v)).collect();
            buffers.values = halves.iter().map(|v| v.to_f32()).collect();
            buffers.input16 = Some(DeviceBuffer::from_slice(&halves).map_err(text)?);
        } else {
            buffers.input32 = Some(DeviceBuffer::from_slice(&raw).map_err(text)?);
        }
        if case.kind == Kind::Bf16Softmax {
            buffers.output16 = Some(DeviceBuffer::from_slice(&vec![bf16::NAN; n]).map_err(text)?);
        } else {
            buffers.output32 = Some(common::poisoned(n)?);
        }
        if case.kind == Kind::Bf16States {
            let unset = RowState {
                max: f32::NAN,
                sum: f32::NAN,
            };
            let states = vec![unset; case.shape.rows()];
            buffers.states = Some(DeviceBuffer::from_slice(&states).map_err(text)?);
        }
        Ok(buffers)
    }
}

/// The options of the temperature case.
fn temperature() -> Options<'static> {
    Options::new().temperature(0.7)
}

/// Issues `case` on `stream` through `softmax` (the impatient instance for the leaving case).
fn issue(
    softmax: &mut Softmax,
    case: &Case,
    buffers: &mut Buffers,
    stream: &Stream,
) -> Result<(), Error> {
    let shape = case.shape;
    let on = Options::new().on(stream);
    match case.kind {
        Kind::Run | Kind::RunLeaving => softmax.forward(
            Operation::Softmax,
            Rows::new(buffers.input32.as_ref().expect("f32 input"), shape)?,
            RowsMut::new(buffers.output32.as_mut().expect("f32 output"), shape)?,
            &on,
        ),
        Kind::Bf16Softmax => softmax.forward(
            Operation::Softmax,
            Rows::new(buffers.input16.as_ref().expect("bf16 input"), shape)?,
            RowsMut::new(buffers.output16.as_mut().expect("bf16 output"), shape)?,
            &on,
        ),
        Kind::Bf16LogSoftmax => softmax.forward(
            Operation::LogSoftmax,
            Rows::new(buffers.input16.as_ref().expect("bf16 input"), shape)?,
            RowsMut::new(buffers.output32.as_mut().expect("f32 output"), shape)?,
            &temperature().on(stream),
        ),
        Kind::F32LogSoftmax => softmax.forward(
            Operation::LogSoftmax,
            Rows::new(buffers.input32.as_ref().expect("f32 input"), shape)?,
            RowsMut::new(buffers.output32.as_mut().expect("f32 output"), shape)?,
            &on,
        ),
        Kind::Bf16States => {
            let input = buffers.input16.as_ref().expect("bf16 input");
            let states = buffers.states.as_mut().expect("states");
            softmax.row_states(Rows::new(input, shape)?, &mut *states, &on)?;
            softmax.normalize_with_states(
                Operation::Softmax,
                Rows::new(input, shape)?,
                &*states,
                RowsMut::new(buffers.output32.as_mut().expect("f32 output"), shape)?,
                &on,
            )
        }
    }
}

/// Checks one stream's output for `case` against the f64 reference of its input.
fn check(case: &Case, buffers: &Buffers) -> Result<(), String> {
    let (rows, cols) = (case.shape.rows(), case.shape.cols());
    let values = &buffers.values;
    match case.kind {
        Kind::Run | Kind::RunLeaving | Kind::Bf16States => {
            let output = to_host(buffers.output32.as_ref().expect("f32 output"))?;
            let deviation = deviation(&output, &softmax_f64(values, rows, cols), cols);
            deviation
                .within(1e-5)
                .then_some(())
                .ok_or(format!("{deviation:?}"))
        }
        Kind::Bf16Softmax => {
            let output = to_host(buffers.output16.as_ref().expect("bf16 output"))?;
            let widened: Vec<f32> = output.iter().map(|v| v.to_f32()).collect();
            let written = common::as_written::<bf16>(&softmax_f64(values, rows, cols));
            let probabilities = common::RowValues::Probabilities;
            common::check_rows(&widened, &written, cols, probabilities, DType::Bf16, 1.5e-2)
                .map(drop)
        }
        Kind::Bf16LogSoftmax | Kind::F32LogSoftmax => {
            let output = to_host(buffers.output32.as_ref().expect("f32 output"))?;
            let scores = if case.kind == Kind::Bf16LogSoftmax {
                Scores {
                    scale: 1.0 / 0.7,
                    ..Scores::default()
                }
            } else {
                Scores::default()
            };
            let deviation = value_deviation(&output, &scores.forward(true, values, rows, cols));
            deviation
                .within(1e-5)
                .then_some(())
                .ok_or(format!("{deviation:?}"))
        }
    }
}

/// The interval one call took on its stream: events recorded before and after it.
struct Interval {
    start: Event,
    end: Event,
}

impl Interval {
    fn begin(stream: &Stream) -> Result<Self, String> {
        let start = Event::new(EventFlags::DEFAULT).map_err(text)?;
        let end = Event::new(EventFlags::DEFAULT).map_err(text)?;
        start.record(stream).map_err(text)?;
        Ok(Interval { start, end })
    }

    fn finish(&self, stream: &Stream) -> Result<(), String> {
        self.end.record(stream).map_err(text)
    }

    /// Whether the two intervals met (both completed): each started before the other ended.
    fn overlaps(&self, other: &Interval) -> Result<bool, String> {
        let a = other.end.elapsed_time_f32(&self.start).map_err(text)?;
        let b = self.end.elapsed_time_f32(&other.start).map_err(text)?;
        Ok(a > 0.0 && b > 0.0)
    }
}

/// Counts the pairs of `intervals` that overlapped.
fn overlapping_pairs(intervals: &[Interval]) -> Result<usize, String> {
    let mut pairs = 0;
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            pairs += usize::from(a.overlaps(b)?);
        }
    }
    Ok(pairs)
}

/// Multiprocessors the holder leaves free.
const FREE_MULTIPROCESSORS: u32 = 8;
/// How long each holder block holds its multiprocessor.
const HOLD: Duration = Duration::from_millis(30);

/// Which calls ran beside a holder: none, or this one.
type Crowd<'a> = Option<&'a Holder>;

/// How long the gate holds every stream's call back: far longer than enqueueing all of them
/// takes, so that the calls start together on the device rather than as the host issues them.
const GATE_NS: u64 = 2_000_000;

/// Runs every case `rounds()` times on `streams` new non-blocking streams through `softmax`,
/// each stream with its own buffers, the calls not ordered with each other (all behind one
/// gate, so that they start together); checks every output; returns a summary with the
/// overlapping pairs seen. Fails unless some calls overlapped; names the cases whose calls
/// never did (the driver ran them in turn).
fn streams_case_by_case(
    softmax: &mut Softmax,
    rng: &mut StdRng,
    streams: usize,
    crowd: Crowd<'_>,
) -> Outcome {
    let mut impatient = Softmax::new().map_err(text)?;
    impatient.set_row_barrier_patience(Duration::ZERO);
    let gate = Gate::new(GATE_NS)?;
    let streams: Vec<Stream> = (0..streams)
        .map(|_| non_blocking_stream())
        .collect::<Result<_, _>>()?;
    let (mut calls, mut overlapped, mut pairs) = (0, 0, 0);
    let (mut families, mut in_turn) = (Vec::new(), Vec::new());
    for case in cases() {
        let instance = if case.kind == Kind::RunLeaving {
            &mut impatient
        } else {
            &mut *softmax
        };
        // The first call of a case plans and loads on its own; the rounds then only enqueue.
        let mut warm = Buffers::new(&case, rng)?;
        issue(instance, &case, &mut warm, &streams[0]).map_err(|e| format!("{case:?}: {e}"))?;
        streams[0].synchronize().map_err(text)?;
        check(&case, &warm).map_err(|why| format!("{case:?} alone: {why}"))?;
        let mut case_overlaps = 0;
        for round in 0..rounds() {
            let mut buffers: Vec<Buffers> = streams
                .iter()
                .map(|_| Buffers::new(&case, rng))
                .collect::<Result<_, _>>()?;
            cust::context::CurrentContext::synchronize().map_err(text)?;
            let record = crowd.map(|h| h.hold(HOLD)).transpose()?;
            let mut intervals = Vec::new();
            gate.close()?;
            for (stream, buffers) in streams.iter().zip(&mut buffers) {
                gate.hold(stream)?;
                let interval = Interval::begin(stream)?;
                issue(instance, &case, buffers, stream).map_err(|e| format!("{case:?}: {e}"))?;
                interval.finish(stream)?;
                intervals.push(interval);
            }
            for stream in &streams {
                stream.synchronize().map_err(text)?;
            }
            if let (Some(holder), Some(record)) = (crowd, record) {
                holder.stream.synchronize().map_err(text)?;
                drop(record);
            }
            for (s, buffers) in buffers.iter().enumerate() {
                check(&case, buffers).map_err(|why| {
                    format!(
                        "{case:?}, round {round}, stream {s} of {}: {why}",
                        streams.len()
                    )
                })?;
            }
            let met = overlapping_pairs(&intervals)?;
            case_overlaps += met;
            pairs += intervals.len() * (intervals.len() - 1) / 2;
            calls += intervals.len();
        }
        overlapped += case_overlaps;
        if case_overlaps == 0 {
            in_turn.push(format!("{} {}", case.family, case.shape));
        }
        families.push(case.family);
    }
    families.dedup();
    if overlapped == 0 {
        return Err("no two calls ever overlapped, so this run proved nothing".into());
    }
    let in_turn = if in_turn.is_empty() {
        String::new()
    } else {
        format!("; never overlapped (run in turn): {}", in_turn.join(", "))
    };
    Ok(format!(
        "{calls} calls on {} streams through one instance, exact; {overlapped} of {pairs} pairs \
         of calls overlapped (event timestamps){in_turn}; families: {}",
        streams.len(),
        families.join(", ")
    ))
}

fn two_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    streams_case_by_case(softmax, rng, 2, None)
}

fn four_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    streams_case_by_case(softmax, rng, 4, None)
}

fn crowded_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let holder = Holder::new(softmax.device(), FREE_MULTIPROCESSORS)?;
    let summary = streams_case_by_case(softmax, rng, 2, Some(&holder))?;
    Ok(format!(
        "beside {} multiprocessors held for {HOLD:?} at a time: {summary}",
        holder.blocks
    ))
}

/// A fresh instance; stream A holds a sliced call queued behind a 20 ms kernel; stream B then
/// makes a call that grows the workspace (the row states of two launches over slices), also
/// queued behind a kernel; then A makes the grown kind of call too; twice, the second growth
/// larger. Every output is exact.
fn growth_beside_queued_work(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut softmax = Softmax::new().map_err(text)?;
    let module = common::kernels::load(0)?;
    let (a, b) = (non_blocking_stream()?, non_blocking_stream()?);
    let sliced = Case {
        kind: Kind::Run,
        shape: shape(16, 262_144),
        family: "",
    };
    let grows = [
        Case {
            kind: Kind::F32LogSoftmax,
            shape: shape(64, 140_000),
            family: "",
        },
        Case {
            kind: Kind::F32LogSoftmax,
            shape: shape(300, 140_000),
            family: "",
        },
    ];
    // Plans first (they may wait for the device); the workspace stays as it started.
    let mut warm = Buffers::new(&sliced, rng)?;
    issue(&mut softmax, &sliced, &mut warm, &a).map_err(text)?;
    a.synchronize().map_err(text)?;
    let mut checked = 0;
    for grow in grows {
        let mut queued = Buffers::new(&sliced, rng)?;
        let mut grown_b = Buffers::new(&grow, rng)?;
        let mut grown_a = Buffers::new(&grow, rng)?;
        cust::context::CurrentContext::synchronize().map_err(text)?;
        let first = Interval::begin(&a)?;
        common::kernels::spin(&module, a.as_inner(), 20_000_000)?;
        issue(&mut softmax, &sliced, &mut queued, &a).map_err(text)?;
        first.finish(&a)?;
        let second = Interval::begin(&b)?;
        common::kernels::spin(&module, b.as_inner(), 10_000_000)?;
        issue(&mut softmax, &grow, &mut grown_b, &b).map_err(text)?;
        second.finish(&b)?;
        let third = Interval::begin(&a)?;
        issue(&mut softmax, &grow, &mut grown_a, &a).map_err(text)?;
        third.finish(&a)?;
        a.synchronize().map_err(text)?;
        b.synchronize().map_err(text)?;
        if !first.overlaps(&second)? {
            return Err("the growth's call did not overlap the queued one".into());
        }
        check(&sliced, &queued).map_err(|why| format!("the queued call: {why}"))?;
        check(&grow, &grown_b).map_err(|why| format!("{grow:?} on B: {why}"))?;
        check(&grow, &grown_a).map_err(|why| format!("{grow:?} on A: {why}"))?;
        checked += 3;
    }
    Ok(format!(
        "{checked} calls exact around two growths on one stream while another had work queued"
    ))
}

/// What the graph tests share: a holder, and sliced f32 softmax of 16×262144 reserved (so a
/// capture of it plans and allocates nothing).
fn graph_setup(softmax: &mut Softmax) -> Result<(Holder, Case), String> {
    let holder = Holder::new(softmax.device(), FREE_MULTIPROCESSORS)?;
    let case = Case {
        kind: Kind::Run,
        shape: shape(16, 262_144),
        family: "",
    };
    softmax
        .reserve(&[(CallKind::Run(Variant::Auto), case.shape)])
        .map_err(text)?;
    Ok((holder, case))
}

/// A graph of sliced f32 softmax, captured on stream A, replayed there while the same
/// instance makes the same kind of call on stream B, both beside the holder: both results
/// exact at every replay.
fn graph_beside_direct_calls(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let (holder, case) = graph_setup(softmax)?;
    let (a, b) = (non_blocking_stream()?, non_blocking_stream()?);
    let mut graphed = Buffers::new(&case, rng)?;
    common::begin_capture(&a)?;
    let captured = issue(softmax, &case, &mut graphed, &a);
    let exec = common::end_capture(&a);
    captured.map_err(|e| format!("the captured call: {e}"))?;
    let exec = exec?;
    let replays = rounds() * 4;
    let mut overlapped = 0;
    for replay in 0..replays {
        let values = common::random_matrix(rng, case.shape, 8.0);
        graphed
            .input32
            .as_mut()
            .expect("f32 input")
            .copy_from(&values[..])
            .map_err(text)?;
        graphed.values = values;
        let mut direct = Buffers::new(&case, rng)?;
        cust::context::CurrentContext::synchronize().map_err(text)?;
        let record = if replay % 2 == 1 {
            Some(holder.hold(HOLD)?)
        } else {
            None
        };
        let first = Interval::begin(&a)?;
        // SAFETY: the executable graph and the stream belong to the current context.
        let status = unsafe { sys::cuGraphLaunch(exec, a.as_inner()) };
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("replay {replay}: launching the graph: {status:?}"));
        }
        first.finish(&a)?;
        let second = Interval::begin(&b)?;
        issue(softmax, &case, &mut direct, &b).map_err(text)?;
        second.finish(&b)?;
        a.synchronize().map_err(text)?;
        b.synchronize().map_err(text)?;
        holder.stream.synchronize().map_err(text)?;
        drop(record);
        overlapped += usize::from(first.overlaps(&second)?);
        check(&case, &graphed).map_err(|why| format!("replay {replay}: {why}"))?;
        check(&case, &direct).map_err(|why| format!("the direct call {replay}: {why}"))?;
    }
    // SAFETY: the executable graph is no longer used.
    unsafe { sys::cuGraphExecDestroy(exec) };
    if overlapped == 0 {
        return Err("no replay overlapped its direct call".into());
    }
    Ok(format!(
        "{replays} replays of {} on one stream beside direct calls on another, exact; \
         {overlapped} overlapped",
        case.shape
    ))
}

/// Records a plain event on `from` and makes `to` wait for it: inside a capture, a fork (or
/// join) of the captured streams.
fn join(from: &Stream, to: &Stream) -> Result<(), String> {
    let mut event = std::ptr::null_mut();
    // SAFETY: a new event, recorded on and waited for by live streams of the current context,
    // destroyed once both calls have taken it (the driver keeps what they need).
    let status = unsafe {
        let mut status = sys::cuEventCreate(&mut event, 2);
        if status == sys::CUresult::CUDA_SUCCESS {
            status = sys::cuEventRecord(event, from.as_inner());
        }
        if status == sys::CUresult::CUDA_SUCCESS {
            status = sys::cuStreamWaitEvent(to.as_inner(), event, 0);
        }
        sys::cuEventDestroy_v2(event);
        status
    };
    (status == sys::CUresult::CUDA_SUCCESS)
        .then_some(())
        .ok_or_else(|| format!("joining two streams: {status:?}"))
}

/// One graph with two sliced calls on parallel branches (stream B forked from A into the
/// capture and joined back): both use the graphs' one workspace, so the graph must order
/// them. Replayed beside the holder, every replay exact.
fn graph_branches(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let (holder, case) = graph_setup(softmax)?;
    let (a, b) = (non_blocking_stream()?, non_blocking_stream()?);
    let (mut first, mut second) = (Buffers::new(&case, rng)?, Buffers::new(&case, rng)?);
    common::begin_capture(&a)?;
    let captured = (|| {
        join(&a, &b)?;
        issue(softmax, &case, &mut first, &a).map_err(text)?;
        issue(softmax, &case, &mut second, &b).map_err(text)?;
        join(&b, &a)
    })();
    let exec = common::end_capture(&a);
    captured?;
    let exec = exec?;
    let replays = rounds() * 4;
    for replay in 0..replays {
        for buffers in [&mut first, &mut second] {
            let values = common::random_matrix(rng, case.shape, 8.0);
            let input = buffers.input32.as_mut().expect("f32 input");
            input.copy_from(&values[..]).map_err(text)?;
            buffers.values = values;
        }
        cust::context::CurrentContext::synchronize().map_err(text)?;
        let held = holder.hold(HOLD)?;
        // SAFETY: the executable graph and the stream belong to the current context.
        let status = unsafe { sys::cuGraphLaunch(exec, a.as_inner()) };
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("replay {replay}: launching the graph: {status:?}"));
        }
        a.synchronize().map_err(text)?;
        holder.stream.synchronize().map_err(text)?;
        drop(held);
        check(&case, &first).map_err(|why| format!("replay {replay}, first branch: {why}"))?;
        check(&case, &second).map_err(|why| format!("replay {replay}, second branch: {why}"))?;
    }
    // SAFETY: the executable graph is no longer used.
    unsafe { sys::cuGraphExecDestroy(exec) };
    Ok(format!(
        "{replays} replays of a graph with two sliced calls on parallel branches, beside the \
         holder, exact"
    ))
}

/// 400 bf16 forward shapes reserved, 1000 other shapes called eagerly, then the first reserved
/// shape captured into a graph: its plan is still there.
fn reserve_is_kept(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut softmax = Softmax::new().map_err(text)?;
    let kind = CallKind::Forward {
        input: DType::Bf16,
        masked: false,
    };
    let reserved: Vec<(CallKind, Shape)> = (0..400).map(|i| (kind, shape(3, 1000 + i))).collect();
    softmax.reserve(&reserved).map_err(text)?;
    let stream = non_blocking_stream()?;
    for i in 0..1000 {
        let case = Case {
            kind: Kind::Bf16LogSoftmax,
            shape: shape(2, 5000 + i),
            family: "",
        };
        let mut buffers = Buffers::new(&case, rng)?;
        issue(&mut softmax, &case, &mut buffers, &stream).map_err(text)?;
        // Without this the 1000 buffers' memory is freed while the calls are queued.
        stream.synchronize().map_err(text)?;
    }
    let case = Case {
        kind: Kind::Bf16Softmax,
        shape: reserved[0].1,
        family: "",
    };
    let mut buffers = Buffers::new(&case, rng)?;
    common::begin_capture(&stream)?;
    let captured = issue(&mut softmax, &case, &mut buffers, &stream);
    let exec = common::end_capture(&stream);
    captured.map_err(|e| format!("the first reserved shape during capture: {e}"))?;
    let exec = exec?;
    // SAFETY: the executable graph and the stream belong to the current context.
    let status = unsafe { sys::cuGraphLaunch(exec, stream.as_inner()) };
    stream.synchronize().map_err(text)?;
    // SAFETY: the executable graph is no longer used.
    unsafe { sys::cuGraphExecDestroy(exec) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("launching the graph: {status:?}"));
    }
    check(&case, &buffers)?;
    Ok(
        "400 reserved bf16 shapes, 1000 eager shapes, then the first reserved one captured and \
        replayed exactly"
            .into(),
    )
}

/// The context current on this thread.
fn current_context() -> Result<sys::CUcontext, String> {
    let mut context = std::ptr::null_mut();
    // SAFETY: writes one handle through a valid pointer.
    let status = unsafe { sys::cuCtxGetCurrent(&mut context) };
    (status == sys::CUresult::CUDA_SUCCESS)
        .then_some(context)
        .ok_or_else(|| format!("cuCtxGetCurrent: {status:?}"))
}

/// With a second context of the same device current, every kind of call (on the instance's
/// stream, on the caller's, the instance's synchronize, and making and dropping an instance)
/// leaves that context current.
fn context_restored(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let case = Case {
        kind: Kind::Run,
        shape: shape(4, 8192),
        family: "",
    };
    let mut buffers = Buffers::new(&case, rng)?;
    let stream = non_blocking_stream()?;
    let primary = current_context()?;
    let mut other = std::ptr::null_mut();
    let mut device = 0;
    // SAFETY: out-pointers are valid; the new context is destroyed below.
    unsafe {
        sys::cuCtxGetDevice(&mut device);
        let status = sys::cuCtxCreate_v2(&mut other, 0, device);
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuCtxCreate: {status:?}"));
        }
        // cuCtxCreate makes the new context current: the buffers below belong to the primary.
        let status = sys::cuCtxSetCurrent(primary);
        if status != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuCtxSetCurrent: {status:?}"));
        }
    }
    let steps = [
        "run",
        "synchronize",
        "a call on the caller's stream",
        "a new instance, dropped",
        "forward",
        "log_sum_exp",
        "backward",
        "forward over raw views",
        "reserve",
    ];
    let mut logs = common::poisoned(case.shape.len())?;
    let mut lse = common::poisoned(case.shape.rows())?;
    let mut dx = common::poisoned(case.shape.len())?;
    let mut wrong = Vec::new();
    for (step, what) in steps.into_iter().enumerate() {
        // SAFETY: `other` is a live context of this process.
        unsafe { sys::cuCtxSetCurrent(other) };
        let input = buffers.input32.as_ref().expect("input");
        let output = buffers.output32.as_mut().expect("output");
        let result = match step {
            0 => softmax.run(Variant::Auto, input, output, case.shape),
            1 => softmax.synchronize(),
            // The stream belongs to the primary context; the call makes that current itself.
            2 => Rows::new(input, case.shape).and_then(|x| {
                let y = RowsMut::new(output, case.shape)?;
                softmax.forward(Operation::Softmax, x, y, &Options::new().on(&stream))
            }),
            3 => Softmax::new().map(drop),
            4 => Rows::new(input, case.shape).and_then(|x| {
                let y = RowsMut::new(&mut logs, case.shape)?;
                softmax.forward(Operation::LogSoftmax, x, y, &temperature())
            }),
            5 => Rows::new(input, case.shape)
                .and_then(|x| softmax.log_sum_exp(x, &mut lse, &Options::new())),
            6 => Rows::new(input, case.shape).and_then(|y| {
                let dy = Rows::new(input, case.shape)?;
                let dx = RowsMut::new(&mut dx, case.shape)?;
                softmax.backward(Operation::Softmax, y, dy, dx, &Options::new())
            }),
            7 => {
                let (x, y) = (
                    input.as_device_ptr().as_raw(),
                    output.as_device_ptr().as_raw(),
                );
                let (rows, cols) = (case.shape, case.shape.cols());
                // SAFETY: both buffers hold the shape's f32 elements and outlive the work,
                // which the synchronize after each step waits for; the stream is the primary
                // context's.
                unsafe {
                    Rows::raw(x, DType::F32, rows, cols).and_then(|x| {
                        let y = RowsMut::raw(y, DType::F32, rows, cols)?;
                        let on = Options::new().on(CallStream::raw(stream.as_inner()));
                        softmax.forward(Operation::Softmax, x, y, &on)
                    })
                }
            }
            _ => softmax.reserve(&[(CallKind::Run(Variant::Auto), shape(3, 70_000))]),
        };
        let now = current_context()?;
        if now != other {
            wrong.push(what);
        }
        // SAFETY: the primary context is live; the stream below belongs to it.
        unsafe { sys::cuCtxSetCurrent(primary) };
        result.map_err(|e| format!("{what}: {e}"))?;
        // Each step's work is done before the next writes the same buffers.
        cust::context::CurrentContext::synchronize().map_err(text)?;
    }
    stream.synchronize().map_err(text)?;
    // SAFETY: nothing uses the second context any more.
    unsafe { sys::cuCtxDestroy_v2(other) };
    check(&case, &buffers)?;
    if !wrong.is_empty() {
        return Err(format!(
            "left the library's context current after: {}",
            wrong.join(", ")
        ));
    }
    Ok(format!(
        "{} kinds of call each left the caller's context current",
        steps.len()
    ))
}

/// cudarc buffers written on one cudarc stream (behind a 20 ms kernel) and read by the library
/// on another; the output read back on the first: cudarc's events order all of it.
#[cfg(feature = "cudarc")]
fn cudarc_across_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    use cudarc::driver::CudaContext;

    let module = common::kernels::load(0)?;
    let context = CudaContext::new(softmax.device().ordinal as usize).map_err(text)?;
    let (writer, reader) = (
        context.new_stream().map_err(text)?,
        context.new_stream().map_err(text)?,
    );
    let mut checked = 0;
    for case in cases()
        .into_iter()
        .filter(|c| c.kind == Kind::Run && c.shape.len() < 8 << 20)
    {
        let values = common::random_matrix(rng, case.shape, 8.0);
        let mut x = writer.alloc_zeros::<f32>(case.shape.len()).map_err(text)?;
        let mut y = writer.alloc_zeros::<f32>(case.shape.len()).map_err(text)?;
        writer.synchronize().map_err(text)?;
        // The upload waits behind a kernel on the writer's stream, so a read not ordered after
        // it would see zeros.
        common::kernels::spin(&module, writer.cu_stream().cast(), 20_000_000)?;
        writer.memcpy_htod(&values, &mut x).map_err(text)?;
        softmax
            .forward(
                Operation::Softmax,
                Rows::cudarc(&x, case.shape).map_err(text)?,
                RowsMut::cudarc(&mut y, case.shape).map_err(text)?,
                &Options::new().on(&reader),
            )
            .map_err(text)?;
        let output = writer.clone_dtoh(&y).map_err(text)?;
        let (rows, cols) = (case.shape.rows(), case.shape.cols());
        let deviation = deviation(&output, &softmax_f64(&values, rows, cols), cols);
        if !deviation.within(1e-5) {
            return Err(format!("{case:?}: {deviation:?}"));
        }
        checked += 1;
    }
    Ok(format!(
        "{checked} cudarc calls read inputs written on another cudarc stream, their outputs \
         read back on the first, exact"
    ))
}

/// An error another operation recorded in cudarc's context is neither reported by a library
/// call nor taken from its owner.
#[cfg(feature = "cudarc")]
fn cudarc_foreign_errors(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    use cudarc::driver::{CudaContext, DriverError, sys as cudarc_sys};

    let context = CudaContext::new(softmax.device().ordinal as usize).map_err(text)?;
    let stream = context.new_stream().map_err(text)?;
    let case_shape = shape(8, 4096);
    let values = common::random_matrix(rng, case_shape, 8.0);
    let x = stream.clone_htod(&values).map_err(text)?;
    let mut y = stream.alloc_zeros::<f32>(case_shape.len()).map_err(text)?;
    let foreign = cudarc_sys::cudaError_enum::CUDA_ERROR_INVALID_HANDLE;
    context.record_err::<()>(Err(DriverError(foreign)));
    let call = Rows::cudarc(&x, case_shape).and_then(|x| {
        let y = RowsMut::cudarc(&mut y, case_shape)?;
        softmax.forward(Operation::Softmax, x, y, &Options::new().on(&stream))
    });
    let left = context.check_err();
    call.map_err(|e| format!("the call reported another operation's error: {e}"))?;
    match left {
        Err(DriverError(code)) if code == foreign => {}
        other => {
            return Err(format!(
                "the other operation's error was taken from its owner: the slot holds {other:?}"
            ));
        }
    }
    let output = stream.clone_dtoh(&y).map_err(text)?;
    let deviation = deviation(
        &output,
        &softmax_f64(&values, case_shape.rows(), case_shape.cols()),
        case_shape.cols(),
    );
    if !deviation.within(1e-5) {
        return Err(format!("{deviation:?}"));
    }
    Ok("a foreign error in cudarc's slot was left to its owner; the call succeeded".into())
}
