//! GPU fuzzing, concurrency and soak. Without a CUDA device each test is reported skipped
//! (failed, with `SOFTMAX_REQUIRE_GPU=1`).
//! `SOFTMAX_TEST_SEED=N` replays a run; a test name as the first argument filters.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::kernels::Gate;
use common::{Span, poisoned};
use cust::event::{Event, EventFlags};
use cust::memory::{AsyncCopyDestination, CopyDestination, DeviceBuffer, LockedBuffer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softmax::half::bf16;
use softmax::reference::{backward_f64, deviation, softmax_f64, value_deviation};
use softmax::{CallKind, DType, Error, Operation, Options, Rows, RowsMut, Shape, Softmax, Variant};

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
            // Every non-empty shape is valid: `Auto` must run it.
            Err(Error::Unsupported { .. }) if variant != Variant::Auto => {
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

/// How long the gate holds the streams back: far longer than enqueueing a workload takes.
const GATE_NS: u64 = 200_000_000;

/// Streams run together must finish within this fraction of the time they take one after the
/// other: launches that ran in turns (serialized) take as long together as one after another.
const OVERLAP_RATIO: f64 = 0.9;

/// Problems in one stream's workload.
const WORKLOAD_PROBLEMS: usize = 64;

/// One problem of a [`Workload`]: its input and output in pinned host memory and on the
/// device, and its reference.
struct Problem {
    variant: Variant,
    shape: Shape,
    input: LockedBuffer<f32>,
    output: LockedBuffer<f32>,
    device_input: DeviceBuffer<f32>,
    device_output: DeviceBuffer<f32>,
    expected: Vec<f64>,
}

/// One stream's share of a concurrency test: small problems (so that two streams' kernels fit
/// on the GPU side by side), each enqueued without a wait on the host: its input copied in
/// from pinned memory, its output poisoned, the launch, the output copied back to pinned
/// memory. Events after the first problem and after the last time the stream's work.
struct Workload {
    problems: Vec<Problem>,
    first: Event,
    last: Event,
}

impl Workload {
    /// Random problems for `variants`, each planned and run once on `softmax` (so that the
    /// timed runs allocate nothing); problems a variant refuses are drawn again.
    fn new(softmax: &mut Softmax, rng: &mut StdRng, variants: &[Variant]) -> Result<Self, String> {
        let text = |e: cust::error::CudaError| e.to_string();
        let mut problems = Vec::new();
        while problems.len() < WORKLOAD_PROBLEMS {
            let shape = Shape::new(rng.random_range(1..=16), rng.random_range(1..=4096)).unwrap();
            let variant = variants[rng.random_range(0..variants.len())];
            let input = random_contents(rng, shape);
            let device_input = DeviceBuffer::from_slice(&input).map_err(text)?;
            let mut device_output = poisoned(shape.len())?;
            match softmax.run(variant, &device_input, &mut device_output, shape) {
                Err(Error::Unsupported { .. }) => continue,
                other => other.map_err(|e| format!("{variant} on {shape}: {e}"))?,
            }
            problems.push(Problem {
                variant,
                shape,
                expected: softmax_f64(&input, shape.rows(), shape.cols()),
                input: LockedBuffer::from_slice(&input).map_err(text)?,
                output: LockedBuffer::new(&f32::NAN, shape.len()).map_err(text)?,
                device_input,
                device_output,
            });
        }
        softmax.synchronize().map_err(|e| e.to_string())?;
        Ok(Workload {
            problems,
            first: Event::new(EventFlags::DEFAULT).map_err(text)?,
            last: Event::new(EventFlags::DEFAULT).map_err(text)?,
        })
    }

    /// Enqueues every problem on `softmax`'s stream behind `gate`, waiting for nothing.
    fn enqueue(&mut self, softmax: &mut Softmax, gate: &Gate) -> Result<(), String> {
        let text = |e: cust::error::CudaError| e.to_string();
        gate.hold(softmax.stream())?;
        for (i, p) in self.problems.iter_mut().enumerate() {
            p.output.as_mut_slice().fill(f32::NAN);
            // SAFETY: the copies and the memset are ordered on the stream with the launch, and
            // nothing else touches these buffers until `finish` has waited for the stream.
            unsafe {
                p.device_input
                    .async_copy_from(p.input.as_slice(), softmax.stream())
                    .map_err(text)?;
                p.device_output
                    .set_32_async(f32::NAN.to_bits(), softmax.stream())
                    .map_err(text)?;
            }
            softmax
                .run(p.variant, &p.device_input, &mut p.device_output, p.shape)
                .map_err(|e| format!("{} on {}: {e}", p.variant, p.shape))?;
            // SAFETY: as above.
            unsafe {
                p.device_output
                    .async_copy_to(p.output.as_mut_slice(), softmax.stream())
                    .map_err(text)?;
            }
            if i == 0 {
                self.first.record(softmax.stream()).map_err(text)?;
            }
        }
        self.last.record(softmax.stream()).map_err(text)
    }

    /// Waits for the work `enqueue` left, checks every output against the reference, and
    /// returns the span of the work from the gate's opening, and the problems checked.
    fn finish(&self, gate: &Gate) -> Result<(Span, usize), String> {
        let text = |e: cust::error::CudaError| e.to_string();
        self.last.synchronize().map_err(text)?;
        let since_the_gate = |event: &Event| {
            event
                .elapsed_time_f32(&gate.opened)
                .map(f64::from)
                .map_err(text)
        };
        let span = Span {
            first: since_the_gate(&self.first)?,
            last: since_the_gate(&self.last)?,
        };
        for p in &self.problems {
            let deviation = deviation(p.output.as_slice(), &p.expected, p.shape.cols());
            if !deviation.within(TOLERANCE) {
                return Err(format!("{} on {}: {deviation:?}", p.variant, p.shape));
            }
        }
        Ok((span, self.problems.len()))
    }
}

/// Streams with workloads, driven by [`alone_then_together`].
trait Streams {
    fn count(&self) -> usize;
    /// Starts enqueueing stream `i`'s workload behind the gate.
    fn enqueue(&mut self, i: usize) -> Result<(), String>;
    /// Returns once stream `i`'s workload is enqueued.
    fn enqueued(&mut self, i: usize) -> Result<(), String>;
    /// [`Workload::finish`] for stream `i`.
    fn finish(&mut self, i: usize) -> Result<(Span, usize), String>;
}

/// Runs each stream's workload alone, then all of them together, each time behind the gate,
/// checking every result; then checks from the event times that together the streams'
/// launches overlapped.
fn alone_then_together(gate: &Gate, streams: &mut impl Streams) -> Outcome {
    let count = streams.count();
    let phases = (0..count)
        .map(|i| vec![i])
        .chain([(0..count).collect::<Vec<_>>()]);
    let (mut alone, mut checked) = (Vec::new(), 0);
    for phase in phases {
        gate.close()?;
        for &i in &phase {
            streams.enqueue(i)?;
        }
        for &i in &phase {
            streams.enqueued(i)?;
        }
        gate.still_closed()?;
        let mut spans = Vec::new();
        for &i in &phase {
            let (span, problems) = streams.finish(i)?;
            spans.push(span);
            checked += problems;
        }
        if phase.len() < count {
            alone.push(spans[0].last);
        } else {
            let verdict = common::overlapped(&alone, &spans, OVERLAP_RATIO)?;
            return Ok(format!(
                "{checked} launches (alone, then together) matched the reference; {verdict}"
            ));
        }
    }
    Err("no phase ran every stream".into())
}

/// Instances of the library driven from this thread.
struct Instances<'a> {
    instances: Vec<(&'a mut Softmax, Workload)>,
    gate: &'a Gate,
}

impl Streams for Instances<'_> {
    fn count(&self) -> usize {
        self.instances.len()
    }

    fn enqueue(&mut self, i: usize) -> Result<(), String> {
        let (softmax, workload) = &mut self.instances[i];
        workload.enqueue(softmax, self.gate)
    }

    fn enqueued(&mut self, _: usize) -> Result<(), String> {
        Ok(())
    }

    fn finish(&mut self, i: usize) -> Result<(Span, usize), String> {
        self.instances[i].1.finish(self.gate)
    }
}

/// What the main thread asks of a [`Threads`] worker.
enum Command {
    Enqueue,
    Finish,
}

/// A worker's answer: ready or enqueued (`None`), finished (the span and the problems
/// checked), or why not.
type Reply = Result<Option<(Span, usize)>, String>;

/// Worker threads, each with its own instance of the library (and so its own stream) and
/// workload, each answering the main thread's commands: several threads enqueue at once.
struct Threads {
    commands: Vec<mpsc::Sender<Command>>,
    replies: Vec<mpsc::Receiver<Reply>>,
}

impl Threads {
    fn reply(&self, i: usize) -> Reply {
        self.replies[i]
            .recv()
            .map_err(|_| format!("thread {i} stopped"))?
            .map_err(|why| format!("thread {i}: {why}"))
    }

    fn command(&self, i: usize, command: Command) -> Result<(), String> {
        self.commands[i]
            .send(command)
            .map_err(|_| format!("thread {i} stopped"))
    }
}

impl Streams for Threads {
    fn count(&self) -> usize {
        self.commands.len()
    }

    fn enqueue(&mut self, i: usize) -> Result<(), String> {
        self.command(i, Command::Enqueue)
    }

    fn enqueued(&mut self, i: usize) -> Result<(), String> {
        self.reply(i).map(|_| ())
    }

    fn finish(&mut self, i: usize) -> Result<(Span, usize), String> {
        self.command(i, Command::Finish)?;
        self.reply(i)?
            .ok_or_else(|| format!("thread {i} answered no span"))
    }
}

/// A worker of [`Threads`]: opens its instance, makes its workload, says so, then answers
/// commands until the main thread hangs up.
fn worker(seed: u64, gate: &Gate, commands: mpsc::Receiver<Command>, replies: mpsc::Sender<Reply>) {
    let variants = [
        Variant::Auto,
        Variant::BlockRegisters,
        Variant::RowSlices,
        Variant::WarpPerRowOnline,
    ];
    let ready = Softmax::new()
        .map_err(|e| e.to_string())
        .and_then(|mut own| {
            let workload = Workload::new(&mut own, &mut StdRng::seed_from_u64(seed), &variants)?;
            Ok((own, workload))
        });
    let (mut own, mut workload) = match ready {
        Ok(ready) => {
            let _ = replies.send(Ok(None));
            ready
        }
        Err(why) => {
            let _ = replies.send(Err(why));
            return;
        }
    };
    for command in commands {
        let reply = match command {
            Command::Enqueue => workload.enqueue(&mut own, gate).map(|()| None),
            Command::Finish => workload.finish(gate).map(Some),
        };
        if replies.send(reply).is_err() {
            return;
        }
    }
}

/// Four threads, each with its own instance (and stream) and pinned buffers: each alone, then
/// all at once, enqueueing from their threads at the same time.
fn threads(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    const THREADS: usize = 4;
    let gate = Gate::new(GATE_NS)?;
    let seeds: Vec<u64> = (0..THREADS).map(|_| rng.random()).collect();
    thread::scope(|scope| {
        let mut threads = Threads {
            commands: Vec::new(),
            replies: Vec::new(),
        };
        for seed in seeds {
            let (command, commands) = mpsc::channel();
            let (reply, replies) = mpsc::channel();
            let gate = &gate;
            scope.spawn(move || worker(seed, gate, commands, reply));
            threads.commands.push(command);
            threads.replies.push(replies);
        }
        for i in 0..THREADS {
            threads.reply(i)?;
        }
        let outcome = alone_then_together(&gate, &mut threads)?;
        Ok(format!(
            "{THREADS} threads, each with its own Softmax and stream: {outcome}"
        ))
    })
}

/// Two instances (two streams) driven from one thread: each alone, then both, their launches
/// enqueued one instance after the other without a wait.
fn two_streams(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let gate = Gate::new(GATE_NS)?;
    let mut second = Softmax::new().map_err(|e| e.to_string())?;
    let first_workload = Workload::new(softmax, rng, &[Variant::Auto])?;
    let second_workload = Workload::new(&mut second, rng, &[Variant::Auto])?;
    let mut instances = Instances {
        instances: vec![(softmax, first_workload), (&mut second, second_workload)],
        gate: &gate,
    };
    let outcome = alone_then_together(&gate, &mut instances)?;
    Ok(format!("two streams from one thread: {outcome}"))
}

/// A variant on a shape for each kernel family that launches with programmatic overlap (the
/// sliced 32×151936 and the clusters in waves of 128×128256 among them).
const DEPENDENT_CASES: [(Variant, usize, usize); 12] = [
    (Variant::Auto, 4096, 1000),
    (Variant::Auto, 65536, 100),
    (Variant::Auto, 64, 16384),
    (Variant::Auto, 128, 50257),
    (Variant::Auto, 32, 151936),
    (Variant::Auto, 128, 128256),
    (Variant::RowSlices, 8, 128256),
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

/// Each kernel family launched right after a kernel that lets it start at once but writes the
/// family's input only 100 µs later: a kernel that read its input before its
/// `griddepcontrol.wait` (or a launch that skipped the wait's guarantee) would read the NaN
/// poison the input starts with.
fn late_writer(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let module = common::kernels::load(0)?;
    let cuda = |e: cust::error::CudaError| e.to_string();
    let (mut checked, mut refused) = (0, Vec::new());
    for (variant, rows, cols) in DEPENDENT_CASES {
        let shape = Shape::new(rows, cols).unwrap();
        let values = common::random_matrix(rng, shape, 8.0);
        let source = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let (x, mut y) = (poisoned(shape.len())?, poisoned(shape.len())?);
        common::kernels::write_late(&module, softmax.stream(), &source, &x)?;
        let what = "after a late writer";
        if run_f32_checked(softmax, variant, (&x, &mut y), &values, shape, what)? {
            checked += 1;
        } else {
            refused.push(format!("{variant} on {shape}"));
        }
    }
    for (rows, cols) in [(4096, 1000), (128, 50257), (64, 8192), (256, 128256)] {
        let shape = Shape::new(rows, cols).unwrap();
        let values = random_bf16(rng, shape);
        // Whole 32-bit words: every shape here has an even number of elements.
        let source = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        let (x, mut y) = (poisoned_bf16(shape.len())?, poisoned_bf16(shape.len())?);
        common::kernels::write_late(&module, softmax.stream(), &source, &x)?;
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

/// The bf16 shapes of [`leaving_blocks`] besides the special values: 16-bit row-slices.
const BF16_LEAVING: [(usize, usize); 5] = [
    (32, 151936),
    (16, 262144),
    (64, 151936),
    (3, 1_048_576),
    // Row-slices in waves of rows.
    (16, 1_048_576),
];

/// Row-slices shapes (f32, and bf16 through the forward call, special values included) on an
/// instance whose blocks wait no time for their rows, each launched beside a kernel that holds
/// all but four multiprocessors (so a row's blocks cannot all be resident at once: on an idle
/// GPU they all arrive within the timer's resolution, and none would leave). Blocks leave their
/// slices to their rows' last blocks, which write them from the input again. The results must
/// be as exact as ever, and the device's count of blocks that left must grow at every launch
/// (so the leaving path ran, and the launch was row-slices).
fn leaving_blocks(_softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let mut impatient = Softmax::new().map_err(|e| e.to_string())?;
    impatient.set_row_barrier_patience(Duration::ZERO);
    let holder = common::kernels::Holder::new(impatient.device(), 4)?;
    let hold = Duration::from_millis(20);
    let cuda = |e: cust::error::CudaError| e.to_string();
    let left = |s: &Softmax| s.blocks_that_left().map_err(|e| e.to_string());
    let (mut checked, mut blocks_left) = (0, 0);
    let mut count = |what: String, before: u64, after: u64| {
        if after <= before {
            return Err(format!("{what}: no block left its slice"));
        }
        blocks_left += after - before;
        checked += 1;
        Ok(())
    };
    let row_slices = Variant::RowSlices;
    let f32_cases = [
        (32, 151936, row_slices),
        (16, 262144, row_slices),
        (8, 128256, row_slices),
        (1, 1048576, row_slices),
        (3, 100003, row_slices),
        (17, 50001, row_slices),
        (2, 65537, row_slices),
        // `auto`'s row-slices in waves of rows.
        (8, 1048576, Variant::Auto),
    ];
    let special = Shape::new(common::SPECIAL_ROWS, 200_003).unwrap();
    let bf16_shapes = BF16_LEAVING
        .map(|(rows, cols)| Shape::new(rows, cols).unwrap())
        .into_iter()
        .chain([special]);
    // Plans, modules and the workspace of every call made before any holder: a first call
    // that waited for the device would start after the holder let go, and no block would need
    // to leave.
    let bf16_forward = CallKind::Forward {
        input: DType::Bf16,
        masked: false,
    };
    let reserved: Vec<(CallKind, Shape)> = f32_cases
        .iter()
        .map(|&(rows, cols, variant)| (CallKind::Run(variant), Shape::new(rows, cols).unwrap()))
        .chain(bf16_shapes.map(|shape| (bf16_forward, shape)))
        .collect();
    impatient.reserve(&reserved).map_err(|e| e.to_string())?;
    for (rows, cols, variant) in f32_cases {
        let shape = Shape::new(rows, cols).unwrap();
        let values = common::random_matrix(rng, shape, 8.0);
        let x = DeviceBuffer::from_slice(&values).map_err(cuda)?;
        // Once alone first: the held launch is then not the first of its kernel, whose setup
        // could outlast the holders.
        let mut y = poisoned(shape.len())?;
        if !run_f32_checked(
            &mut impatient,
            variant,
            (&x, &mut y),
            &values,
            shape,
            "alone",
        )? {
            return Err(format!("{variant} refused {shape}"));
        }
        let mut y = poisoned(shape.len())?;
        let what = "with blocks leaving";
        let before = left(&impatient)?;
        let held = holder.hold(hold)?;
        if !run_f32_checked(&mut impatient, variant, (&x, &mut y), &values, shape, what)? {
            return Err(format!("{variant} refused {shape}"));
        }
        holder.stream.synchronize().map_err(cuda)?;
        drop(held);
        count(format!("f32 {shape}"), before, left(&impatient)?)?;
    }
    let bf16_cases = BF16_LEAVING
        .map(|(rows, cols)| {
            let shape = Shape::new(rows, cols).unwrap();
            (random_bf16(rng, shape), shape)
        })
        .into_iter()
        .chain([(
            common::special_rows(rng, special.cols())
                .into_iter()
                .map(bf16::from_f32)
                .collect(),
            special,
        )])
        .collect::<Vec<(Vec<bf16>, Shape)>>();
    for (values, shape) in bf16_cases {
        let (x, mut y) = (
            DeviceBuffer::from_slice(&values).map_err(cuda)?,
            poisoned_bf16(shape.len())?,
        );
        forward_bf16_checked(&mut impatient, (&x, &mut y), &values, shape, "alone")?;
        let mut y = poisoned_bf16(shape.len())?;
        let before = left(&impatient)?;
        let held = holder.hold(hold)?;
        forward_bf16_checked(
            &mut impatient,
            (&x, &mut y),
            &values,
            shape,
            "with blocks leaving",
        )?;
        holder.stream.synchronize().map_err(cuda)?;
        drop(held);
        count(format!("bf16 {shape}"), before, left(&impatient)?)?;
    }
    Ok(format!(
        "{checked} sliced launches with zero patience beside {} held multiprocessors matched the \
         reference (special values in bf16 included); {blocks_left} blocks left their slices, \
         some in every launch",
        holder.blocks
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

/// Launches between two waits of the soak; every launch's window is checked at each wait.
const SOAK_BATCH: usize = 1000;

/// Elements of each launch's output the soak reads back and checks (fewer in narrower rows).
const WINDOW: usize = 1024;

/// f32 probabilities, element by element: the exponent `t = (x − max)·log2 e` is rounded
/// (2.5·2^-24·|t|, with |t| ≤ 126 for any probability above f32's smallest normal number: a
/// relative error of 1.3e-5 once raised), plus ex2.approx and the normalization (a few 1e-6),
/// with a margin of 2.
const SOAK_F32_TOLERANCE: f64 = 4e-5;

/// Gradients, against their terms ([`common::check_gradient`]): the probabilities they read
/// are each within ~2e-5 of the reference.
const SOAK_DX_TOLERANCE: f64 = 1e-4;

/// What a launch of the soak writes.
#[derive(Clone, Copy, Debug)]
enum Written {
    /// A variant's f32 softmax.
    F32,
    /// The forward call's bf16 softmax.
    Bf16,
    /// The backward call's f32 gradient.
    Gradient,
}

/// Where a launch's output is sampled: `len` elements from `start`, within one row.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: usize,
    len: usize,
}

impl Window {
    fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// One buffer set of the soak: an f32 input and output for the variants, a bf16 copy of
/// the input and a bf16 output for the operation API's forward, and an incoming gradient and
/// its result for the backward pass (from the f32 output); and the references of all three.
struct SoakBuffers {
    shape: Shape,
    device_input: DeviceBuffer<f32>,
    device_output: DeviceBuffer<f32>,
    input_bf16: DeviceBuffer<bf16>,
    output_bf16: DeviceBuffer<bf16>,
    gradient: Vec<f32>,
    device_gradient: DeviceBuffer<f32>,
    device_dx: DeviceBuffer<f32>,
    /// The softmax of the input as f32 holds it, that of the input rounded to bf16 as bf16
    /// holds it, and the gradient (with its terms) from the reference softmax.
    expected_f32: Vec<f64>,
    expected_bf16: Vec<f64>,
    expected_dx: Vec<f64>,
    dx_terms: Vec<f64>,
}

impl SoakBuffers {
    fn new(rng: &mut StdRng, shape: Shape) -> Result<Self, String> {
        let text = |e: cust::error::CudaError| e.to_string();
        let (rows, cols) = (shape.rows(), shape.cols());
        let input = random_contents(rng, shape);
        let gradient = common::random_matrix(rng, shape, 1.0);
        let input_bf16: Vec<bf16> = input.iter().map(|&v| bf16::from_f32(v)).collect();
        let rounded: Vec<f32> = input_bf16.iter().map(|v| v.to_f32()).collect();
        let probabilities = softmax_f64(&input, rows, cols);
        let (expected_dx, dx_terms) =
            common::softmax_gradient_reference(&probabilities, &gradient, cols);
        Ok(SoakBuffers {
            shape,
            device_input: DeviceBuffer::from_slice(&input).map_err(text)?,
            device_output: poisoned(shape.len())?,
            input_bf16: DeviceBuffer::from_slice(&input_bf16).map_err(text)?,
            output_bf16: DeviceBuffer::from_slice(&vec![bf16::NAN; shape.len()]).map_err(text)?,
            device_gradient: DeviceBuffer::from_slice(&gradient).map_err(text)?,
            device_dx: poisoned(shape.len())?,
            expected_f32: common::as_written::<f32>(&probabilities),
            expected_bf16: common::as_written::<bf16>(&softmax_f64(&rounded, rows, cols)),
            expected_dx,
            dx_terms,
            gradient,
        })
    }

    /// What launch `kind` writes: a variant of `variants`, then the bf16 forward, then the
    /// backward.
    fn written(kind: usize, variants: &[Variant]) -> Written {
        match kind.checked_sub(variants.len()) {
            None => Written::F32,
            Some(0) => Written::Bf16,
            Some(_) => Written::Gradient,
        }
    }

    /// Launch `kind` (see [`SoakBuffers::written`]).
    fn launch(
        &mut self,
        softmax: &mut Softmax,
        variants: &[Variant],
        kind: usize,
    ) -> Result<(), Error> {
        let shape = self.shape;
        match Self::written(kind, variants) {
            Written::F32 => softmax.run(
                variants[kind],
                &self.device_input,
                &mut self.device_output,
                shape,
            ),
            Written::Bf16 => softmax.forward(
                Operation::Softmax,
                Rows::new(&self.input_bf16, shape)?,
                RowsMut::new(&mut self.output_bf16, shape)?,
                &Options::new(),
            ),
            Written::Gradient => softmax.backward(
                Operation::Softmax,
                Rows::new(&self.device_output, shape)?,
                Rows::new(&self.device_gradient, shape)?,
                RowsMut::new(&mut self.device_dx, shape)?,
                &Options::new(),
            ),
        }
    }

    /// A random window: up to [`WINDOW`] elements of a random row.
    fn random_window(&self, rng: &mut StdRng) -> Window {
        let cols = self.shape.cols();
        let len = cols.min(WINDOW);
        let row = rng.random_range(0..self.shape.rows());
        Window {
            start: row * cols + rng.random_range(0..=cols - len),
            len,
        }
    }

    /// Poisons `window` of what a launch writes, then enqueues the launch, then a copy of the
    /// window into `staged` (f32 outputs) or `staged_bf16`, all on `softmax`'s stream.
    fn launch_sampled(
        &mut self,
        softmax: &mut Softmax,
        (variants, kind): (&[Variant], usize),
        window: Window,
        (staged, staged_bf16): (&mut [f32], &mut [bf16]),
    ) -> Result<(), String> {
        let text = |e: cust::error::CudaError| e.to_string();
        let written = Self::written(kind, variants);
        let nan = f32::NAN.to_bits();
        // SAFETY: the memsets and copies are ordered on the stream with the launches, and the
        // host reads `staged` only after waiting for the stream.
        unsafe {
            match written {
                Written::F32 => self
                    .device_output
                    .index(window.range())
                    .set_32_async(nan, softmax.stream()),
                Written::Gradient => self
                    .device_dx
                    .index(window.range())
                    .set_32_async(nan, softmax.stream()),
                Written::Bf16 => self
                    .output_bf16
                    .index(window.range())
                    .set_16_async(bf16::NAN.to_bits(), softmax.stream()),
            }
            .map_err(text)?;
        }
        self.launch(softmax, variants, kind)
            .map_err(|e| e.to_string())?;
        // SAFETY: as above.
        unsafe {
            match written {
                Written::F32 => self
                    .device_output
                    .index(window.range())
                    .async_copy_to(staged, softmax.stream()),
                Written::Gradient => self
                    .device_dx
                    .index(window.range())
                    .async_copy_to(staged, softmax.stream()),
                Written::Bf16 => self
                    .output_bf16
                    .index(window.range())
                    .async_copy_to(staged_bf16, softmax.stream()),
            }
            .map_err(text)
        }
    }

    /// Checks the window a launch wrote (`staged`, or `staged_bf16` for the bf16 forward)
    /// against the reference: probabilities element by element and summed, gradients each
    /// against its terms.
    fn check_window(
        &self,
        written: Written,
        window: Window,
        (staged, staged_bf16): (&[f32], &[bf16]),
    ) -> Result<(), String> {
        let (range, len) = (window.range(), window.len);
        let probabilities = common::RowValues::Probabilities;
        match written {
            Written::F32 => common::check_rows(
                staged,
                &self.expected_f32[range],
                len,
                probabilities,
                DType::F32,
                SOAK_F32_TOLERANCE,
            ),
            Written::Bf16 => {
                let widened: Vec<f32> = staged_bf16.iter().map(|v| v.to_f32()).collect();
                let expected = &self.expected_bf16[range];
                common::check_rows(
                    &widened,
                    expected,
                    len,
                    probabilities,
                    DType::Bf16,
                    BF16_TOLERANCE,
                )
            }
            Written::Gradient => common::check_gradient(
                staged,
                &self.expected_dx[range.clone()],
                &self.dx_terms[range],
                SOAK_DX_TOLERANCE,
            ),
        }
        .map(|_| ())
    }

    /// Every output against the reference after the soak.
    fn check(&self) -> Result<(), String> {
        let (shape, text) = (self.shape, |e: cust::error::CudaError| e.to_string());
        let mut output = vec![0.0; shape.len()];
        self.device_output.copy_to(&mut output[..]).map_err(text)?;
        let mut output_bf16 = vec![bf16::ZERO; shape.len()];
        self.output_bf16
            .copy_to(&mut output_bf16[..])
            .map_err(text)?;
        let output_bf16: Vec<f32> = output_bf16.into_iter().map(bf16::to_f32).collect();
        let mut dx = vec![0.0; shape.len()];
        self.device_dx.copy_to(&mut dx[..]).map_err(text)?;
        let expected_dx = backward_f64(
            false,
            &output,
            &self.gradient,
            shape.cols(),
            &vec![1.0; shape.rows()],
        );
        let deviation = deviation(&output, &self.expected_f32, shape.cols());
        if !deviation.within(TOLERANCE) {
            return Err(format!(
                "f32 softmax on {shape} after the soak: {deviation:?}"
            ));
        }
        let (cols, probabilities) = (shape.cols(), common::RowValues::Probabilities);
        common::check_rows(
            &output_bf16,
            &self.expected_bf16,
            cols,
            probabilities,
            DType::Bf16,
            BF16_TOLERANCE,
        )
        .map_err(|why| format!("bf16 softmax on {shape} after the soak: {why}"))?;
        let deviation = value_deviation(&dx, &expected_dx);
        if !deviation.within(4e-5) {
            return Err(format!("backward on {shape} after the soak: {deviation:?}"));
        }
        Ok(())
    }
}

/// 100,000 launches in rotation over six shapes (each variant, the bf16 forward, the
/// backward), after one rotation that finds what each shape supports, every one checked: a
/// window of its output is poisoned before it, copied back after it, and compared with the
/// reference. Device memory must not grow, and every output must be right at the end.
fn soak(softmax: &mut Softmax, rng: &mut StdRng) -> Outcome {
    let text = |e: cust::error::CudaError| e.to_string();
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
        Variant::WarpPerRowOnline,
    ];
    // Each variant, then the operation API's bf16 forward and f32 backward.
    let kinds = variants.len() + 2;
    let mut buffers = Vec::new();
    for (rows, cols) in shapes {
        buffers.push(SoakBuffers::new(rng, Shape::new(rows, cols).unwrap())?);
    }
    // One rotation: what each shape supports, and every plan and workspace made.
    let mut rotation = Vec::new();
    for kind in 0..kinds {
        for (set, buffers) in buffers.iter_mut().enumerate() {
            match buffers.launch(softmax, &variants, kind) {
                Err(Error::Unsupported { .. }) => {}
                Err(error) => return Err(format!("kind {kind} on {}: {error}", buffers.shape)),
                Ok(()) => rotation.push((set, kind)),
            }
        }
    }
    softmax.synchronize().map_err(|e| e.to_string())?;
    let mut staged = LockedBuffer::new(&0.0f32, SOAK_BATCH * WINDOW).map_err(text)?;
    let mut staged_bf16 = LockedBuffer::new(&bf16::ZERO, SOAK_BATCH * WINDOW).map_err(text)?;
    let mut sampled: Vec<(usize, usize, Window)> = Vec::with_capacity(SOAK_BATCH);
    let before = free_device_memory()?;
    for launch in 0..SOAK_LAUNCHES {
        let (set, kind) = rotation[launch % rotation.len()];
        let window = buffers[set].random_window(rng);
        let slot = sampled.len() * WINDOW..sampled.len() * WINDOW + window.len;
        let staging = (
            &mut staged.as_mut_slice()[slot.clone()],
            &mut staged_bf16.as_mut_slice()[slot],
        );
        buffers[set]
            .launch_sampled(softmax, (&variants, kind), window, staging)
            .map_err(|why| {
                format!(
                    "launch {launch}: kind {kind} on {}: {why}",
                    buffers[set].shape
                )
            })?;
        sampled.push((set, kind, window));
        if sampled.len() < SOAK_BATCH && launch + 1 < SOAK_LAUNCHES {
            continue;
        }
        softmax
            .synchronize()
            .map_err(|e| format!("after launch {launch}: {e}"))?;
        let first = launch + 1 - sampled.len();
        for (i, &(set, kind, window)) in sampled.iter().enumerate() {
            let slot = i * WINDOW..i * WINDOW + window.len;
            let written = SoakBuffers::written(kind, &variants);
            let staging = (
                &staged.as_slice()[slot.clone()],
                &staged_bf16.as_slice()[slot],
            );
            buffers[set]
                .check_window(written, window, staging)
                .map_err(|why| {
                    format!(
                        "launch {}: kind {kind} on {}, elements {:?}: {why}",
                        first + i,
                        buffers[set].shape,
                        window.range()
                    )
                })?;
        }
        sampled.clear();
    }
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
        "{SOAK_LAUNCHES} launches (variants, bf16 forward, backward), each one's output sampled \
         and checked; free device memory {} MiB before and {} MiB after",
        before >> 20,
        after >> 20
    ))
}
