#!/usr/bin/env python3
"""Summarizes an A/B of the fused cross-entropy: the CSVs of two builds' runs of
host/examples/cross_entropy_bench.rs, run alternately on one machine and named
`ab-<build>-<round>.csv` (build `base` or `new`), as one Markdown table of medians over the
rounds: each shape's copy, the base's and the new build's in-place time with its % of the
copy, the new build's time into a separate buffer, and our softmax of the same logits.

    python3 bench/ce_ab.py DIR
"""

import collections
import csv
import glob
import statistics
import sys


def main():
    folder = sys.argv[1]
    times = collections.defaultdict(list)
    for path in sorted(glob.glob(f"{folder}/ab-*-*.csv")):
        build = path.rsplit("/", 1)[-1].split("-")[1]
        with open(path) as f:
            for r in csv.DictReader(f):
                key = (r["dtype"], int(r["rows"]), int(r["cols"]), build, r["contender"])
                times[key].append(float(r["median_us"]))
    shapes = sorted({key[:3] for key in times})
    print("| shape | copy µs | base µs (%) | new µs (%) | new, into a buffer (%) | softmax (%) |")
    print("|---|---|---|---|---|---|")
    for dtype, rows, cols in shapes:
        def median(build, contender):
            values = times.get((dtype, rows, cols, build, contender))
            return statistics.median(values) if values else float("nan")

        copies = times[(dtype, rows, cols, "new", "copy")] + times[(dtype, rows, cols, "base", "copy")]
        copy = statistics.median(copies)
        cells = [
            median("base", "softmax-rs-in-place"),
            median("new", "softmax-rs-in-place"),
            median("new", "softmax-rs"),
        ]
        timed = " | ".join(f"{t:.1f} ({100 * copy / t:.1f})" for t in cells)
        softmax = 100 * copy / median("new", "softmax-rs-softmax")
        print(f"| {dtype} {rows}×{cols} | {copy:.1f} | {timed} | {softmax:.1f} |")


if __name__ == "__main__":
    main()
