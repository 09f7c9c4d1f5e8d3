#!/usr/bin/env python3
"""Summarizes an A/B of the fused cross-entropy: two builds' runs of
host/examples/cross_entropy_bench.rs, run alternately on one machine, as one Markdown table of
medians over the rounds: each shape's copy, the base's and the new build's in-place time with
its % of that build's own copy, the new build's time into a separate buffer, and our softmax
of the same logits.

The runs come either as a folder of CSVs named `ab-<build>-<round>.csv` (build `base` or
`new`), or as one CSV whose rows start with `build,round` (the raw rows committed under
bench/results/cross-entropy/ab-*.csv).

    python3 bench/ce_ab.py DIR_OR_CSV
"""

import collections
import csv
import glob
import os
import statistics
import sys


def rows(source):
    """(build, row) for every row of the runs in `source`."""
    if os.path.isdir(source):
        for path in sorted(glob.glob(f"{source}/ab-*-*.csv")):
            build = os.path.basename(path).split("-")[1]
            with open(path) as f:
                for r in csv.DictReader(f):
                    yield build, r
    else:
        with open(source) as f:
            for r in csv.DictReader(f):
                yield r["build"], r


def main():
    times = collections.defaultdict(list)
    for build, r in rows(sys.argv[1]):
        key = (r["dtype"], int(r["rows"]), int(r["cols"]), build, r["contender"])
        times[key].append(float(r["median_us"]))
    shapes = sorted({key[:3] for key in times})
    print("| shape | copy µs | base µs (%) | new µs (%) | new, into a buffer (%) | softmax (%) |")
    print("|---|---|---|---|---|---|")
    for dtype, rows_, cols in shapes:
        def median(build, contender):
            values = times.get((dtype, rows_, cols, build, contender))
            return statistics.median(values) if values else float("nan")

        def cell(build, contender):
            t = median(build, contender)
            return f"{t:.1f} ({100 * median(build, 'copy') / t:.1f})"

        softmax = 100 * median("new", "copy") / median("new", "softmax-rs-softmax")
        print(
            f"| {dtype} {rows_}×{cols} | {median('new', 'copy'):.1f} | "
            f"{cell('base', 'softmax-rs-in-place')} | {cell('new', 'softmax-rs-in-place')} | "
            f"{cell('new', 'softmax-rs')} | {softmax:.1f} |"
        )


if __name__ == "__main__":
    main()
