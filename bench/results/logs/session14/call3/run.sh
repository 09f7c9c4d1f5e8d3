#!/usr/bin/env bash
# Session 14 call 3, branch patient-row-slices (row-slices as an ordinary launch whose blocks
# may leave), bundled with `cargo xtask device-bundle --base main`:
# 1. gpu_stress: zero patience (nearly every block leaves), eight crowded streams, the
#    chained and late-writer tests; gpu (all); gpu_ops' 16-bit row-slices test;
# 2. A/B main -> branch, two rounds, f32 and bf16 few-row shapes, % of copy.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
b=$(ls .gpu/tests/gpu_stress-* | head -n1)
for f in leave resident chained late; do
  timeout 120 "$b" $f > "$out/stress-$f.txt" 2>&1; echo "stress $f rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/stress-$f.txt"
done
b=$(ls .gpu/tests/gpu-* | head -n1)
timeout 120 "$b" > "$out/gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/gpu.txt"
b=$(ls .gpu/tests/gpu_ops-* | head -n1)
timeout 100 "$b" wide_16 > "$out/ops-wide16.txt" 2>&1; echo "wide_16 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/ops-wide16.txt"
OUT="$out/f32" bash bench/ab.sh 2 --shapes 32x151936,16x262144,8x128256,1x1048576,48x65536,3x100003,17x50001,512x65536 --variants auto --iters 20 | tail -n 20
OUT="$out/bf16" bash bench/ab.sh 2 --dtype bf16 --shapes 32x151936,64x151936,16x262144,48x65536,24x128256,8x128256 --iters 20 | tail -n 20
echo "total $(( $(date +%s) - t0 ))s"
