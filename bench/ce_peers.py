#!/usr/bin/env python3
"""Times cross-entropy forward plus backward of the peers at training shapes, isolated as the
Rust benchmark times (a memset of twice the L2 before each sample, a GPU spin while the host
enqueues, one call between two CUDA events), beside a device-to-device copy of the logits.

Contenders, each where it imports: `torch` (F.cross_entropy, then backward), `liger`
(LigerCrossEntropyLoss, which writes the gradient over the logits in its forward), `quack`
(quack.cross_entropy.cross_entropy with its backward, in place as Liger's). Prints CSV lines
`rows,cols,dtype,contender,median_us,pct_of_copy,extra_bytes` (extra_bytes: the peak memory
the call allocated beyond its inputs). A contender that fails is named on stderr.

    python3 bench/ce_peers.py [ROWSxCOLS,...]
"""

import sys

import torch
import torch.nn.functional as F

from isolated import isolated, l2_flush

try:
    from liger_kernel.transformers import LigerCrossEntropyLoss
except Exception as error:
    LigerCrossEntropyLoss = None
    print(f"ce_peers.py: liger: {type(error).__name__}: {error}", file=sys.stderr)

try:
    from quack.cross_entropy import cross_entropy as quack_cross_entropy
except Exception as error:
    quack_cross_entropy = None
    print(f"ce_peers.py: quack: {type(error).__name__}: {error}", file=sys.stderr)


def extra_bytes(call):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main():
    shapes = [(4096, 128256), (8192, 32000), (16384, 151936), (2048, 262144)]
    if len(sys.argv) > 1:
        shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
    flush = l2_flush()
    liger = LigerCrossEntropyLoss() if LigerCrossEntropyLoss else None
    print("rows,cols,dtype,contender,median_us,pct_of_copy,extra_bytes")
    for rows, cols in shapes:
        for dtype, name in [(torch.bfloat16, "bf16"), (torch.float32, "f32")]:
            gen = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
            x = (torch.rand(rows, cols, device="cuda", dtype=torch.float32, generator=gen) * 10 - 5).to(dtype)
            target = torch.randint(0, cols, (rows,), device="cuda", generator=gen)
            out = torch.empty_like(x)
            copy = isolated(lambda: out.copy_(x), flush)
            del out
            print(f"{rows},{cols},{name},copy,{copy:.2f},100.0,0", flush=True)
            leaf = x.clone().requires_grad_(True)

            def torch_call():
                leaf.grad = None
                F.cross_entropy(leaf, target).backward()

            def liger_call():
                leaf.grad = None
                liger(leaf, target).backward()

            def quack_call():
                leaf.grad = None
                quack_cross_entropy(leaf, target, inplace_backward=True).backward()

            contenders = [("torch", torch_call)]
            if liger is not None:
                contenders.append(("liger", liger_call))
            if quack_cross_entropy is not None:
                contenders.append(("quack", quack_call))
            for contender, call in contenders:
                try:
                    us = isolated(call, flush)
                    memory = extra_bytes(call)
                    print(f"{rows},{cols},{name},{contender},{us:.2f},{100 * copy / us:.1f},{memory}", flush=True)
                except Exception as error:
                    print(f"ce_peers.py: {contender} {rows}x{cols} {name}: {type(error).__name__}: {error}", file=sys.stderr)
                torch.cuda.empty_cache()
            del leaf, x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
