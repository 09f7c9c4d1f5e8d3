#!/usr/bin/env bash
# Session 12 call 6: main (9b8e609): the 16-bit row-slices test with the special values added;
# then a diagnostic (branch row-skew, .gpu/host-skew): row r of a row-slices launch starts
# reading r * SKEW ns after its blocks start, so rows finish reading in turn and early rows'
# exchange and writes overlap later rows' reads. Skews 0 (as main), 25, 50, 100 ns, two
# interleaved rounds, f32 and bf16.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
ops=$(ls .gpu/tests/gpu_ops-* | head -n1)
timeout 150 "$ops" wide_16 > "$out/test-gpu_ops-wide_16.txt" 2>&1; echo "gpu_ops wide_16 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-gpu_ops-wide_16.txt"
gunzip -kf .gpu/host-skew.gz && chmod +x .gpu/host-skew
for round in 1 2; do
  for skew in 0 25 50 100; do
    SOFTMAX_ROW_SKEW_NS=$skew timeout 40 .gpu/host-skew bench --shapes 32x151936,16x262144,8x128256 --variants auto --out "$out/skew" > "$out/skew-f32-$skew-$round.txt" 2>&1
    SOFTMAX_ROW_SKEW_NS=$skew timeout 40 .gpu/host-skew bench --dtype bf16 --shapes 32x151936,16x262144,64x151936 --out "$out/skew" > "$out/skew-bf16-$skew-$round.txt" 2>&1
  done
done
echo "skew $(( $(date +%s) - t0 ))s"
for f in "$out"/skew-*.txt; do
  awk -v f="$(basename $f .txt)" '/ per tensor\)/ {shape=$1} /^  auto / {printf "%-22s %-12s %s\n", f, shape, $4}' "$f"
done | sort -k2,2 -k1,1
rm -rf "$out/skew"
