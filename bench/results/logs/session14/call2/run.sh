#!/usr/bin/env bash
# Session 14 call 2, branch noncoop-bound (main + two diagnostic knobs): the upper bound of
# launching row-slices as an ordinary grid with programmatic overlap (SOFTMAX_DIAG_NONCOOP=1,
# no co-residency guarantee) at 4, 3 and 2 blocks per multiprocessor
# (SOFTMAX_DIAG_BLOCKS_PER_SM), against the cooperative launch. Two rounds, % of copy.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for round in 1 2; do
  for cfg in coop:4 coop:2 noncoop:4 noncoop:3 noncoop:2; do
    mode=${cfg%%:*}; per=${cfg#*:}
    n=""; [ "$mode" = noncoop ] && n=1
    for dt in f32 bf16; do
      S=32x151936,16x262144,8x128256,64x151936,48x65536
      echo "### $dt $mode per-sm $per round $round" >> "$out/raw.txt"
      SOFTMAX_DIAG_NONCOOP=$n SOFTMAX_DIAG_BLOCKS_PER_SM=$per timeout 60 .gpu/host bench --dtype $dt --shapes $S --iters 20 --out "$out/b" >> "$out/raw.txt" 2>&1
    done
  done
done
echo "bench $(( $(date +%s) - t0 ))s"
awk '/^### / { cfg = $2 " " $3 " per-sm " $5 } / per tensor\)/ { shape = $1 } /^  auto / { key = shape " " cfg; if (!(key in p)) o[++n] = key; p[key] = p[key] " " $4; d[key] = $NF " " $(NF-1) " " $(NF-2) " " $(NF-3) " " $(NF-4) }
  END { for (i = 1; i <= n; i++) print o[i], p[o[i]], " (" d[o[i]] ")" }' "$out/raw.txt" | sort > "$out/summary.txt"
cat "$out/summary.txt"
grep -iE 'error|fail' "$out/raw.txt" | head -5
rm -rf "$out/b"
