#!/usr/bin/env bash
# A/B of two builds in one run, from the repository root on the GPU machine:
#
#   bash bench/ab.sh ROUNDS BENCH_ARGS...
#
# runs `host bench BENCH_ARGS` with .gpu/host-base (`cargo xtask device-bundle --base REV`) and
# .gpu/host, alternately, ROUNDS times each; every run times the copy beside auto. Prints one
# line per shape, timing mode and build: auto's % of copy in each round, then the kernels auto
# launched. A table without timing sections (a build from before them) is back-to-back.
# Full output in $OUT/ab-raw.txt (OUT defaults to ./device-out).
set -uo pipefail
if [ $# -lt 1 ] || ! [ "$1" -ge 1 ] 2>/dev/null; then
    echo "usage: bash bench/ab.sh ROUNDS BENCH_ARGS..." >&2
    exit 2
fi
rounds=$1
shift
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
if [ ! -x .gpu/host-base ]; then
    echo "ab: no .gpu/host-base (bundle with \`cargo xtask device-bundle --base REV\`)" >&2
    exit 2
fi
raw="$out/ab-raw.txt"
: > "$raw"
for round in $(seq "$rounds"); do
    for build in base new; do
        binary=.gpu/host
        [ "$build" = base ] && binary=.gpu/host-base
        echo "### $build round $round: $binary bench $*" >> "$raw"
        "$binary" bench "$@" --out "$out/ab-$build" >> "$raw" 2>&1
    done
done
# Per (shape, timing mode, build): the % of copy of each round, and auto's kernels.
awk '
    /^### / { build = $2 }
    / per tensor\)/ { shape = $1; mode = "back-to-back" }
    /^  (isolated|back-to-back): / { mode = substr($1, 1, length($1) - 1) }
    /^  auto / {
        key = shape " " mode " " build
        if (!(key in pct)) { order[++n] = key }
        pct[key] = pct[key] sprintf(" %6s", $4)
        kernels[key] = $0
        sub(/^  auto +[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +/, "", kernels[key])
        sub(/^Softmax::[a-z]+::<[^>]*>\([^)]*\): /, "", kernels[key])
    }
    END {
        for (i = 1; i <= n; i++) {
            split(order[i], parts, " ")
            printf "%-14s %-12s %-4s%s  %s\n", parts[1], parts[2], parts[3], pct[order[i]], kernels[order[i]]
        }
    }
' "$raw" | sort -s -k1,2
