#!/usr/bin/env python3
"""Times the peers of softmax-rs on the benchmark's shapes and writes the benchmark's CSV.

Variants for f32 softmax (the default): `torch` (torch.softmax), `torch_unfused` (the seed's
five separate PyTorch ops) and `triton` (a fused Triton kernel, one row per program, the whole
row in one block). Where installed, `quack` (QuACK's softmax forward and backward, any dtype)
and `flashinfer` (FlashInfer's sampling softmax, forward; it writes f32 probabilities, counted
at the input's element size like everyone else) are timed too; a missing one is named on
stderr with the reason. With `--op` / `--dtype`: `torch` only, in that dtype: torch.softmax,
torch.log_softmax, or for `backward` PyTorch's fused softmax backward kernel
(torch._softmax_backward_data(dy, y, 1, dtype), from y = a softmax of random logits and a
random dy). The timing is the Rust benchmark's, in the modes `--timing` names (isolated,
back-to-back or both). Isolated: before each launch a memset of a buffer twice the L2 cache
evicts it, and the one launch sits alone between two CUDA events. Back-to-back: inputs rotate
over enough buffers to keep the working set at 4x the L2 cache, and each sample times ~0.5 ms
of consecutive launches between two CUDA events. Either way the contenders (the copy
included) are timed in interleaved rounds and the median sample is reported. Bytes: input
read once + output written once (backward: y and dy read once + dx written once); % of copy
is GB/s over the GB/s of a device-to-device copy of the input tensor timed in the same mode.
The CSV's last column names the mode of each row.

Exit status 3 means PyTorch is missing (the benchmark then goes on without peers).
"""

import argparse
import math
import sys
import time

try:
    import torch
except ImportError:
    print("peers.py: PyTorch is not installed", file=sys.stderr)
    sys.exit(3)

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# QuACK (CuTe-DSL kernels, the fastest published Hopper softmax) and FlashInfer's sampling
# softmax, where installed: each is timed where its API covers the operation, and the run
# says why one is missing.
try:
    # `quack.softmax` the module: the package's own `softmax` attribute is a function.
    import quack.softmax
    quack_softmax = sys.modules["quack.softmax"]
except Exception as error:  # an import error, or a CUDA library the package cannot load
    quack_softmax = None
    QUACK_MISSING = f"{type(error).__name__}: {error}"

try:
    import flashinfer.sampling as flashinfer_sampling
except Exception as error:
    flashinfer_sampling = None
    FLASHINFER_MISSING = f"{type(error).__name__}: {error}"

# Clock cycles the GPU spins after each flush in isolated mode, while the host enqueues the
# timed launch: about 200 µs at the H200's 1980 MHz, more than any peer's dispatch takes.
GATE_CYCLES = 400_000
WORKING_SET_OVER_L2 = 4
SAMPLE_MS = 0.5
WARMUP_MS = 30.0
MAX_WARMUP_LAUNCHES = 5000
MEASUREMENT_BUDGET_MS = 1500.0
MIN_SAMPLES = 3
SLOW_LAUNCH_MS = 20.0
FLUSH_OVER_L2 = 2
FLUSH_MIN_BYTES = 16 << 20
TIMINGS = {"isolated": ("isolated",), "back-to-back": ("back-to-back",),
           "both": ("back-to-back", "isolated")}
CSV_HEADER = "variant,dtype,rows,cols,median_ms,gbps,pct_of_copy,timing"
TRITON_MAX_BLOCK = 1 << 20
OPS = ("softmax", "log-softmax", "backward")
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
# Relative L2 error allowed against the f64 reference rounded to the dtype (as the Rust side).
TOLERANCE = {"f32": 1e-5, "bf16": 2e-2, "f16": 2e-3}


def unfused_softmax(x):
    """Five kernels, each a round trip through device memory."""
    row_max = x.max(dim=1, keepdim=True)[0]
    shifted = x - row_max
    numerator = torch.exp(shifted)
    denominator = numerator.sum(dim=1, keepdim=True)
    return numerator / denominator


if triton is not None:

    @triton.jit
    def _row_softmax(out_ptr, in_ptr, row_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offsets = tl.arange(0, BLOCK)
        inside = offsets < n_cols
        base = row.to(tl.int64) * row_stride
        values = tl.load(in_ptr + base + offsets, mask=inside, other=-float("inf"))
        shifted = values - tl.max(values, axis=0)
        exps = tl.exp(shifted)
        tl.store(out_ptr + base + offsets, exps / tl.sum(exps, axis=0), mask=inside)

    def triton_softmax(x, out):
        rows, cols = x.shape
        block = triton.next_power_of_2(cols)
        warps = 16 if block >= 4096 else 8 if block >= 2048 else 4
        _row_softmax[(rows,)](out, x, x.stride(0), cols, BLOCK=block, num_warps=warps)
        return out


def quack_forward(x, out):
    quack_softmax._softmax_fwd(x, out)
    return out


def quack_backward(y, dy, dx):
    quack_softmax._softmax_backward(dy, y, dx)
    return dx


def variants(cols, op="softmax", dtype="f32"):
    """(name, launch) pairs; a launch takes one slot's tensors and returns the result."""
    if op == "softmax":
        yield "torch", lambda x, out: torch.softmax(x, dim=1)
    elif op == "log-softmax":
        yield "torch", lambda x, out: torch.log_softmax(x, dim=1)
    else:
        torch_dtype = DTYPES[dtype]
        yield "torch", lambda y, dy, out: torch._softmax_backward_data(dy, y, 1, torch_dtype)
    if quack_softmax is not None and op == "softmax":
        yield "quack", quack_forward
    if quack_softmax is not None and op == "backward":
        yield "quack", quack_backward
    # FlashInfer's softmax allocates its output (probabilities in f32).
    if flashinfer_sampling is not None and op == "softmax":
        yield "flashinfer", lambda x, out: flashinfer_sampling.softmax(x)
    if op != "softmax" or dtype != "f32":
        return
    yield "torch_unfused", lambda x, out: unfused_softmax(x)
    if triton is not None and triton.next_power_of_2(cols) <= TRITON_MAX_BLOCK:
        yield "triton", triton_softmax


def measure_back_to_back(launches, slots, iters, warmup):
    """Median ms per launch of each launcher: warm-up, then rounds of one sample each, a
    sample being ~SAMPLE_MS of consecutive launches between two events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    counter = [0]

    def timed(launch, count):
        start.record()
        for _ in range(count):
            launch(*slots[counter[0] % len(slots)])
            counter[0] += 1
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / count

    plans = []
    for launch in launches:
        first = timed(launch, 1)
        share = WARMUP_MS / len(launches)
        timed(launch, min(max(warmup, math.ceil(share / max(first, 1e-3))), MAX_WARMUP_LAUNCHES))
        estimate = max(timed(launch, 1), 1e-4)
        per_sample = int(min(max(math.ceil(SAMPLE_MS / estimate), 1), 1000))
        affordable = int(MEASUREMENT_BUDGET_MS / (estimate * per_sample))
        plans.append((per_sample, max(min(iters, affordable), MIN_SAMPLES)))
    times = [[] for _ in launches]
    for round_index in range(max(samples for _, samples in plans)):
        for i, launch in enumerate(launches):
            per_sample, samples = plans[i]
            if round_index < samples:
                times[i].append(timed(launch, per_sample))
    return [sorted(t)[len(t) // 2] for t in times]


def measure_isolated(launches, slots, iters, warmup, flush):
    """Median ms of one launch of each launcher, each alone on a flushed L2: a sample
    enqueues the flush (a memset of `flush`), an event, the launch and another event. Each
    launcher is warmed up (at least `warmup` samples and a share of WARMUP_MS, unless a launch
    takes SLOW_LAUNCH_MS), then all are timed in rounds, a round enqueued before it is read."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in launches]
    counter = [0]

    def enqueue(i):
        flush.zero_()
        # Hold the GPU while Python enqueues the rest: otherwise the GPU reaches the start
        # event, waits for the launch that Python is still dispatching (tens of µs for a Triton
        # launcher or five PyTorch ops), and that host time is counted as the kernel's.
        torch.cuda._sleep(GATE_CYCLES)
        start, stop = events[i]
        start.record()
        launches[i](*slots[counter[0] % len(slots)])
        counter[0] += 1
        stop.record()

    def elapsed(i):
        start, stop = events[i]
        stop.synchronize()
        return start.elapsed_time(stop)

    share_s = WARMUP_MS * 1e-3 / len(launches)
    samples = []
    for i in range(len(launches)):
        enqueue(i)
        estimate = elapsed(i)
        if estimate < SLOW_LAUNCH_MS:
            started, count = time.perf_counter(), 0
            while count < MAX_WARMUP_LAUNCHES and (
                    count < warmup or time.perf_counter() - started < share_s):
                enqueue(i)
                estimate = elapsed(i)
                count += 1
        affordable = int(MEASUREMENT_BUDGET_MS / max(estimate, 1e-4))
        samples.append(max(min(iters, affordable), MIN_SAMPLES))
    times = [[] for _ in launches]
    for round_index in range(max(samples)):
        taking = [i for i in range(len(launches)) if round_index < samples[i]]
        for i in taking:
            enqueue(i)
        for i in taking:
            times[i].append(elapsed(i))
    return [sorted(t)[len(t) // 2] for t in times]


def correct(result, slot, op="softmax", dtype="f32"):
    """Relative L2 error (and, for softmax, row sums) of sampled rows against the f64
    reference rounded to the result's dtype."""
    x = slot[0]
    rows = sorted({0, x.shape[0] - 1, x.shape[0] // 2})
    if op == "softmax":
        expected = torch.softmax(x[rows].double(), dim=1)
    elif op == "log-softmax":
        expected = torch.log_softmax(x[rows].double(), dim=1)
    else:
        y, dy = x[rows].double(), slot[1][rows].double()
        expected = y * (dy - (dy * y).sum(dim=1, keepdim=True))
    expected = expected.to(result.dtype).double()
    got = result[rows].double()
    tolerance = TOLERANCE[dtype]
    relative = (torch.linalg.norm(got - expected) / torch.linalg.norm(expected)).item()
    ok = relative < tolerance
    if op == "softmax":
        ok = ok and (got.sum(dim=1) - 1).abs().max().item() < tolerance
    return ok, relative


def make_slots(op, dtype, rows, cols, count):
    """`count` slots of the tensors one call touches: (x, out) forward, (y, dy, dx) backward."""
    generator = torch.Generator(device="cuda").manual_seed(0x5EED)
    shape = (count, rows, cols)
    logits = torch.rand(shape, device="cuda", generator=generator) * 16 - 8
    if op == "backward":
        y = torch.softmax(logits, dim=2).to(DTYPES[dtype])
        del logits
        dy = (torch.rand(shape, device="cuda", generator=generator) * 2 - 1).to(DTYPES[dtype])
        dx = torch.empty_like(y)
        return [(y[i], dy[i], dx[i]) for i in range(count)]
    x = logits.to(DTYPES[dtype])
    del logits
    out = torch.empty_like(x)
    return [(x[i], out[i]) for i in range(count)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True, help="comma-separated ROWSxCOLS")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--op", choices=OPS, default="softmax",
                        help="softmax, log-softmax or backward (softmax gradient)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                        help="element type of every tensor")
    parser.add_argument("--timing", choices=list(TIMINGS), default="both",
                        help="isolated (L2 flushed, one launch per sample), back-to-back, or both")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("peers.py: PyTorch sees no CUDA device", file=sys.stderr)
        sys.exit(3)
    torch.cuda.set_device(args.device)
    l2 = torch.cuda.get_device_properties(args.device).L2_cache_size
    default_run = args.op == "softmax" and args.dtype == "f32"
    if triton is None and default_run:
        print("peers.py: Triton is not installed; timing PyTorch only", file=sys.stderr)
    if quack_softmax is None:
        print(f"peers.py: QuACK (quack-kernels) not timed: {QUACK_MISSING}", file=sys.stderr)
    if flashinfer_sampling is None:
        print(f"peers.py: FlashInfer (flashinfer-python) not timed: {FLASHINFER_MISSING}",
              file=sys.stderr)
    element = torch.tensor([], dtype=DTYPES[args.dtype]).element_size()
    tensors = 3 if args.op == "backward" else 2
    timings = TIMINGS[args.timing]
    flush = None
    if "isolated" in timings:
        flush_bytes = max(FLUSH_OVER_L2 * l2, FLUSH_MIN_BYTES)
        flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
    # Rows are written as each shape finishes, so a failure later keeps what was measured.
    out = open(args.out, "w")
    out.write(CSV_HEADER + "\n")
    out.flush()
    for text in args.shapes.split(","):
        rows, cols = (int(v) for v in text.lower().split("x"))
        numel = rows * cols
        slots_needed = max(1, math.ceil(WORKING_SET_OVER_L2 * l2 / (tensors * element * numel)))
        slots = make_slots(args.op, args.dtype, rows, cols, slots_needed)
        traffic = tensors * numel * element
        copy_traffic = 2 * numel * element
        checked = []
        for name, launch in variants(cols, args.op, args.dtype):
            slot = slots[0]
            slot[-1].fill_(float("nan"))
            try:
                result = launch(*slot)
            except Exception as error:  # a peer that refuses the shape or type
                print(f"peers.py: {name} on {text} {args.dtype} cannot run: "
                      f"{type(error).__name__}: {str(error)[:200]}", file=sys.stderr)
                continue
            ok, relative = correct(result, slot, args.op, args.dtype)
            if ok:
                checked.append((name, launch))
            else:
                print(f"peers.py: {name} on {text} FAILED the reference check ({relative:.2e}); not timed", file=sys.stderr)
        copy = lambda *slot: slot[-1].copy_(slot[0])
        launches = [copy] + [launch for _, launch in checked]
        for timing in timings:
            try:
                if timing == "isolated":
                    medians = measure_isolated(launches, slots, args.iters, args.warmup, flush)
                else:
                    medians = measure_back_to_back(launches, slots, args.iters, args.warmup)
            except Exception as error:  # a peer failing on a later slot: the shape is lost
                print(f"peers.py: timing {text} ({timing}) failed: {type(error).__name__}: "
                      f"{str(error)[:200]}; no peer rows for it", file=sys.stderr)
                continue
            print(f"peers.py: {text:>14} {args.op} {args.dtype} {timing:<12} {'copy':<14} "
                  f"{medians[0]:9.4f} ms (this script's own copy)", file=sys.stderr)
            copy_gbps = copy_traffic / medians[0] / 1e6
            for (name, _), ms in zip(checked, medians[1:]):
                gbps = traffic / ms / 1e6
                out.write(f"{name},{args.dtype},{rows},{cols},{ms:.6f},{gbps:.2f},"
                          f"{100 * gbps / copy_gbps:.2f},{timing}\n")
                print(f"peers.py: {text:>14} {args.op} {args.dtype} {timing:<12} {name:<14} "
                      f"{ms:9.4f} ms {gbps:8.0f} GB/s", file=sys.stderr)
        out.flush()
        del slots
        torch.cuda.empty_cache()
    out.close()


if __name__ == "__main__":
    main()
