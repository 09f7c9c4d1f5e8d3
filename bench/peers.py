#!/usr/bin/env python3
"""Times the peers of softmax-rs on the benchmark's shapes and writes the benchmark's CSV.

Variants: `torch` (torch.softmax), `torch_unfused` (the seed's five separate PyTorch ops) and
`triton` (a fused Triton kernel, one row per program, the whole row in one block). The timing
method is the Rust benchmark's: inputs rotate over enough buffers to keep the working set at
4x the L2 cache, each sample times ~0.5 ms of back-to-back launches with CUDA events, and the
median sample is reported. Bytes: input read once + output written once.

Exit status 3 means PyTorch is missing (the benchmark then goes on without peers).
"""

import argparse
import math
import sys

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

WORKING_SET_OVER_L2 = 4
SAMPLE_MS = 0.5
WARMUP_MS = 30.0
MAX_WARMUP_LAUNCHES = 5000
MEASUREMENT_BUDGET_MS = 1500.0
MIN_SAMPLES = 3
TOLERANCE = 1e-5
TRITON_MAX_BLOCK = 1 << 20


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


def variants(cols):
    yield "torch", lambda x, out: torch.softmax(x, dim=1)
    yield "torch_unfused", lambda x, out: unfused_softmax(x)
    if triton is not None and triton.next_power_of_2(cols) <= TRITON_MAX_BLOCK:
        yield "triton", triton_softmax


def measure_interleaved(launches, slots, iters, warmup):
    """Median ms per launch of each launcher: warm-up, then rounds of one sample each."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    counter = [0]

    def timed(launch, count):
        start.record()
        for _ in range(count):
            x, out = slots[counter[0] % len(slots)]
            launch(x, out)
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


def correct(result, x):
    rows = sorted({0, x.shape[0] - 1, x.shape[0] // 2})
    expected = torch.softmax(x[rows].double(), dim=1)
    got = result[rows].double()
    relative = (torch.linalg.norm(got - expected) / torch.linalg.norm(expected)).item()
    row_sums = (got.sum(dim=1) - 1).abs().max().item()
    return relative < TOLERANCE and row_sums < TOLERANCE, relative


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True, help="comma-separated ROWSxCOLS")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("peers.py: PyTorch sees no CUDA device", file=sys.stderr)
        sys.exit(3)
    torch.cuda.set_device(args.device)
    l2 = torch.cuda.get_device_properties(args.device).L2_cache_size
    if triton is None:
        print("peers.py: Triton is not installed; timing PyTorch only", file=sys.stderr)
    lines = ["variant,dtype,rows,cols,median_ms,gbps,pct_of_copy"]
    for text in args.shapes.split(","):
        rows, cols = (int(v) for v in text.lower().split("x"))
        numel = rows * cols
        slots_needed = max(1, math.ceil(WORKING_SET_OVER_L2 * l2 / (2 * 4 * numel)))
        generator = torch.Generator(device="cuda").manual_seed(0x5EED)
        inputs = (torch.rand(slots_needed, rows, cols, device="cuda", generator=generator) * 16 - 8)
        outputs = torch.empty_like(inputs)
        slots = [(inputs[i], outputs[i]) for i in range(slots_needed)]
        traffic = 2 * numel * 4
        checked = []
        for name, launch in variants(cols):
            x, out = slots[0]
            out.fill_(float("nan"))
            ok, relative = correct(launch(x, out), x)
            if ok:
                checked.append((name, launch))
            else:
                print(f"peers.py: {name} on {text} FAILED the reference check ({relative:.2e}); not timed", file=sys.stderr)
        copy = lambda x, out: out.copy_(x)
        medians = measure_interleaved([copy] + [launch for _, launch in checked], slots, args.iters, args.warmup)
        copy_ms = medians[0]
        for (name, _), ms in zip(checked, medians[1:]):
            lines.append(f"{name},f32,{rows},{cols},{ms:.6f},{traffic / ms / 1e6:.2f},{100 * copy_ms / ms:.2f}")
            print(f"peers.py: {text:>14} {name:<14} {ms:9.4f} ms {traffic / ms / 1e6:8.0f} GB/s", file=sys.stderr)
        del inputs, outputs, slots
        torch.cuda.empty_cache()
    with open(args.out, "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
