#!/usr/bin/env python3
"""Charts and tabulates the sampling comparison from the CSVs of host/examples/sampling_bench.rs
and bench/sampling_peers.py (one run): for each shape and type, the time of each sampler over
the time of this library's softmax of the same logits (lower is better), and a Markdown table
of the times with our sampler against FlashInfer's.

    python3 bench/sampling_chart.py OURS.csv PEERS.csv OUT_STEM
    (writes OUT_STEM.png, OUT_STEM.svg and OUT_STEM.md)
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ce_chart import card

CONTENDERS = [
    ("softmax-rs-temperature", "ours, temperature"),
    ("flashinfer-temperature", "FlashInfer sampling_from_logits"),
    ("softmax-rs-top-k-top-p", "ours, top-k 50 + top-p 0.9"),
    ("flashinfer-top-k-top-p", "FlashInfer top_k_top_p_sampling_from_logits"),
    ("softmax-rs-greedy", "ours, greedy"),
    ("torch-temperature", "torch softmax + multinomial"),
]


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ours, peers, stem = sys.argv[1], sys.argv[2], sys.argv[3]
    data = rows(ours) + rows(peers)
    cases = sorted({(r["dtype"], int(r["rows"]), int(r["cols"])) for r in data})

    def time(contender, case):
        dtype, r, c = case
        match = [float(x["median_us"]) for x in data if x["contender"] == contender
                 and x["dtype"] == dtype and int(x["rows"]) == r and int(x["cols"]) == c]
        return match[0] if match else None

    present = [(c, label) for c, label in CONTENDERS if any(x["contender"] == c for x in data)]
    width = 0.8 / len(present)
    fig, ax = plt.subplots(figsize=(15, 5))
    for k, (contender, label) in enumerate(present):
        values = []
        for case in cases:
            t, base = time(contender, case), time("softmax-rs-softmax", case)
            values.append(t / base if t and base else 0.0)
        ax.bar([i + k * width for i in range(len(cases))], values, width, label=label)
    ax.axhline(1.5, color="black", linewidth=0.8, linestyle="--")
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([f"{d} {r}×{c}" for d, r, c in cases], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("time over our softmax of the same logits (×, log)")
    ax.set_title(f"Sampling, {card(stem)}, isolated (lower is better; dashed: 1.5×)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=110)
    fig.savefig(stem + ".svg")

    lines = ["| shape | softmax µs | ours temp. µs | FlashInfer temp. µs | ours top-k/top-p µs "
             "| FlashInfer top-k/top-p µs | ours greedy µs | temp. vs FlashInfer | top-k/top-p vs "
             "FlashInfer |", "|---|---|---|---|---|---|---|---|---|"]

    def fmt(v):
        return f"{v:.1f}" if v else "–"

    def ratio(a, b):
        return f"{b / a:.2f}×" if a and b else "–"

    for case in cases:
        d, r, c = case
        s, ot, ft = time("softmax-rs-softmax", case), time("softmax-rs-temperature", case), \
            time("flashinfer-temperature", case)
        ok, fk, og = time("softmax-rs-top-k-top-p", case), time("flashinfer-top-k-top-p", case), \
            time("softmax-rs-greedy", case)
        lines.append(f"| {d} {r}×{c} | {fmt(s)} | {fmt(ot)} | {fmt(ft)} | {fmt(ok)} | {fmt(fk)} "
                     f"| {fmt(og)} | {ratio(ot, ft)} | {ratio(ok, fk)} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
