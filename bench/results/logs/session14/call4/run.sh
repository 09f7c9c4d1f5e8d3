#!/usr/bin/env bash
# Session 14 call 4, branch sweep-14 (patient-row-slices + diagnostic knobs): row-slices'
# blocks per multiprocessor (SOFTMAX_DIAG_BLOCKS_PER_SM) and threads per block
# (SOFTMAX_DIAG_THREADS) now that the launch is an ordinary one, f32 and bf16 few-row shapes,
# two rounds, % of copy.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for round in 1 2; do
  for per in 4 3 2; do
    for threads in "" 256 320 384; do
      echo "### bf16 per-sm $per threads '$threads' round $round" >> "$out/raw.txt"
      SOFTMAX_DIAG_BLOCKS_PER_SM=$per SOFTMAX_DIAG_THREADS=$threads timeout 60 .gpu/host bench --dtype bf16 --shapes 32x151936,64x151936,16x262144,48x65536,24x128256,12x262144 --iters 20 --out "$out/b" >> "$out/raw.txt" 2>&1
      echo "### f32 per-sm $per threads '$threads' round $round" >> "$out/raw.txt"
      SOFTMAX_DIAG_BLOCKS_PER_SM=$per SOFTMAX_DIAG_THREADS=$threads timeout 60 .gpu/host bench --shapes 32x151936,16x262144,48x65536,8x128256 --variants auto --iters 20 --out "$out/b" >> "$out/raw.txt" 2>&1
    done
  done
done
echo "bench $(( $(date +%s) - t0 ))s"
awk '/^### / { cfg = $2 " per-sm " $4 " threads " $6 } / per tensor\)/ { shape = $1 } /^  auto / { key = shape " " cfg; if (!(key in p)) o[++n] = key; p[key] = p[key] " " $4 }
  END { for (i = 1; i <= n; i++) print o[i], p[o[i]] }' "$out/raw.txt" | sort > "$out/summary.txt"
cat "$out/summary.txt"
grep -iE 'error|fail' "$out/raw.txt" | head -5
rm -rf "$out/b"
