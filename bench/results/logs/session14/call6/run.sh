#!/usr/bin/env bash
# Session 14 call 6, branch patient-row-slices (final candidate), bundled with
# `cargo xtask device-bundle --base main`: every GPU test binary in full, then A/B main ->
# branch (both session 14 changes together), two rounds, % of copy.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for t in gpu gpu_stress gpu_ops; do
  b=$(ls .gpu/tests/$t-* | head -n1)
  timeout 330 "$b" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-$t.txt"
done
OUT="$out/bf16" bash bench/ab.sh 2 --dtype bf16 --shapes 32x151936,64x151936,8x262144,16x262144,48x65536,64x100000 --iters 20 | tail -n 12
OUT="$out/f32" bash bench/ab.sh 2 --shapes 32x151936,16x262144,8x128256,1x1048576 --variants auto --iters 20 | tail -n 8
rm -rf "$out"/*/ab-base "$out"/*/ab-new
echo "total $(( $(date +%s) - t0 ))s"
