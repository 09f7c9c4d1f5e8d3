#!/usr/bin/env python3
"""The grid's targets, checked against a grid run's CSV (`host bench --grid`, isolated):

- a point whose copy takes at least 10 µs: `auto` at least 92% of the copy (95% from 20 µs);
- a point whose copy takes under 10 µs: `auto` at most 1.5 µs above the copy;
- no peer more than 2% faster than `auto` (where peers ran);
- between neighbouring points (one row count or one width apart), no step larger than 5
  points of the copy.

Prints each target's misses, worst first, and a count per target.

    python3 bench/grid_targets.py RUN.csv [--limit N]
"""

import argparse

from grid_csv import PEERS, read


def misses(runs):
    """{target: [(badness, text)]}: each point that misses a target, with how far it misses."""
    auto, copy = runs.get("auto", {}), runs.get("copy", {})
    found = {"bandwidth": [], "above copy": [], "peers": [], "steps": []}
    for point, (ms, pct) in auto.items():
        if point not in copy:
            continue
        copy_us = copy[point][0] * 1000
        shape = f"{point[0]}x{point[1]}"
        if copy_us >= 10:
            want = 95.0 if copy_us >= 20 else 92.0
            if pct < want:
                found["bandwidth"].append(
                    (want - pct, f"{shape}: {pct:.1f}% (copy {copy_us:.1f} µs, target {want:.0f}%)")
                )
        else:
            above = ms * 1000 - copy_us
            if above > 1.5:
                found["above copy"].append(
                    (above - 1.5, f"{shape}: {above:.2f} µs above a {copy_us:.1f} µs copy")
                )
        for peer in PEERS:
            theirs = runs.get(peer, {}).get(point)
            if theirs and ms > 1.02 * theirs[0]:
                found["peers"].append(
                    (ms / theirs[0], f"{shape}: {peer} takes {100 * (1 - theirs[0] / ms):.1f}% less time")
                )
    rows = sorted({r for r, _ in auto})
    cols = sorted({c for _, c in auto})
    for r, c in auto:
        for neighbour in ((next_of(rows, r), c), (r, next_of(cols, c))):
            if neighbour in auto:
                step = abs(auto[(r, c)][1] - auto[neighbour][1])
                if step > 5:
                    found["steps"].append(
                        (step, f"{r}x{c} -> {neighbour[0]}x{neighbour[1]}: {step:.1f} points")
                    )
    return found


def next_of(values, value):
    """The value after `value` in the sorted `values`, or None."""
    later = [v for v in values if v > value]
    return later[0] if later else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--limit", type=int, default=12, help="misses shown per target")
    args = parser.parse_args()
    runs, dtype = read(args.csv)
    points = len(runs.get("auto", {}))
    print(f"{args.csv}: {dtype}, {points} points of auto")
    for target, found in misses(runs).items():
        found.sort(reverse=True)
        print(f"{target}: {len(found)} missed")
        for _, text in found[: args.limit]:
            print(f"  {text}")


if __name__ == "__main__":
    main()
