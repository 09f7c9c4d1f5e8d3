#!/usr/bin/env python3
"""Times the sampling peers at decode shapes, isolated as the Rust benchmark times (a memset of
twice the L2 before each sample, a GPU spin while the host enqueues, one call between two CUDA
events).

Contenders, each where it imports: `flashinfer-temperature` (flashinfer.sampling's
sampling_from_logits), `flashinfer-top-k-top-p` (top_k_top_p_sampling_from_logits, top-k 50 and
top-p 0.9, top-k first), `torch-temperature` (softmax in f32, then torch.multinomial). Logits as
bench's: bf16 and f32. Prints CSV lines `rows,cols,dtype,contender,median_us`; a contender that
fails is named on stderr.

    python3 bench/sampling_peers.py [ROWSxCOLS,...]
"""

import sys

import torch

from isolated import isolated, l2_flush

try:
    import flashinfer.sampling as fi
except Exception as error:
    fi = None
    print(f"sampling_peers.py: flashinfer: {type(error).__name__}: {error}", file=sys.stderr)


def logits_like_bench(rows, cols, dtype):
    i = torch.arange(rows * cols, device="cuda", dtype=torch.int64)
    bulk = ((i * 7919) % 2001).float() / 400.0 - 2.5
    head = torch.where((i * 104_729) % 997 == 0, 6.0, 0.0)
    return (bulk + head).reshape(rows, cols).to(dtype)


def contenders(x):
    yield "torch-temperature", lambda: torch.multinomial(torch.softmax(x.float(), -1), 1)
    if fi is not None:
        yield "flashinfer-temperature", lambda: fi.sampling_from_logits(x)
        yield "flashinfer-top-k-top-p", lambda: fi.top_k_top_p_sampling_from_logits(x, 50, 0.9)


def main():
    if len(sys.argv) > 1:
        shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
    else:
        shapes = [(r, c) for r in (1, 16, 64, 256) for c in (32000, 128256, 262144)]
    flush = l2_flush()
    print("rows,cols,dtype,contender,median_us")
    for rows, cols in shapes:
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
            x = logits_like_bench(rows, cols, dtype)
            for contender, call in contenders(x):
                try:
                    us = isolated(call, flush)
                except Exception as error:
                    print(f"sampling_peers.py: {contender} {rows}x{cols} {name}: "
                          f"{type(error).__name__}: {error}", file=sys.stderr)
                    continue
                print(f"{rows},{cols},{name},{contender},{us:.2f}", flush=True)


if __name__ == "__main__":
    main()
