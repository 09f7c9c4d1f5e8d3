#!/usr/bin/env python3
"""Charts the cross-entropy comparison: each contender's speed-up over torch (torch's time over
its time) at each shape and type, from the CSVs of host/examples/cross_entropy_bench.rs and
bench/ce_peers.py (one run). Times, not % of copy: the two harnesses time their own copies,
which differ by up to a tenth.

    python3 bench/ce_chart.py OURS.csv PEERS.csv OUT_STEM   (writes OUT_STEM.png and .svg)
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def card(stem):
    """The card a results stem names (`…/nvidia-h100-cross-entropy` → `H100`)."""
    name = stem.rsplit("/", 1)[-1]
    parts = name.split("-")
    return parts[1].upper() if len(parts) > 1 and parts[0] == "nvidia" else name


def main():
    ours, peers, stem = sys.argv[1], sys.argv[2], sys.argv[3]
    data = [r for r in rows(ours) + rows(peers) if r["contender"] != "copy"]
    cases = sorted({(int(r["rows"]), int(r["cols"]), r["dtype"]) for r in data},
                   key=lambda c: (c[2], c[0] * c[1]))
    contenders = ["softmax-rs-in-place", "softmax-rs", "liger", "torch", "quack"]
    contenders = [c for c in contenders if any(r["contender"] == c for r in data)]

    def time(contender, rows_, cols, dtype):
        match = [float(r["median_us"]) for r in data if r["contender"] == contender
                 and int(r["rows"]) == rows_ and int(r["cols"]) == cols and r["dtype"] == dtype]
        return match[0] if match else None

    width = 0.8 / len(contenders)
    fig, ax = plt.subplots(figsize=(12.5, 4.5))
    for k, contender in enumerate(contenders):
        values = []
        for rows_, cols, dtype in cases:
            ours, torch = time(contender, rows_, cols, dtype), time("torch", rows_, cols, dtype)
            values.append(torch / ours if ours and torch else 0.0)
        ax.bar([i + k * width for i in range(len(cases))], values, width, label=contender)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([f"{d} {r}×{c}" for r, c, d in cases], rotation=20, ha="right")
    ax.set_ylabel("speed-up over torch (×)")
    ax.set_title(f"Cross-entropy forward + backward, {card(stem)}, isolated (higher is better)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    fig.savefig(stem + ".svg")


if __name__ == "__main__":
    main()
