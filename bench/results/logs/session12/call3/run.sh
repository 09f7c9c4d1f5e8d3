#!/usr/bin/env bash
# Session 12 call 3: row-slices-16 v2 (batch maximum on packed 16-bit pairs: bf16_p8 40
# registers, so 320-thread blocks stay 4 per multiprocessor on 32x151936). ab.sh main -> branch
# on bf16 and f32 first, then the tests (gpu, gpu_ops in full, gpu_stress) and the four
# sanitizers on gpu_ops' special values (12x100003 bf16: the 16-bit row-slices path) and gpu's
# LLM shapes (f32 row-slices, whose code is now the same template).
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
F32=32x151936,128x50257,16x262144,8x128256,64x151936,48x262144
BF16=32x151936,16x262144,128x50257,8x128256,1x1048576,64x151936,600x70000,300x100000
OUT="$out/bf16" timeout 200 bash bench/ab.sh 4 --dtype bf16 --shapes $BF16 > "$out/ab-bf16.txt" 2>&1
echo "bf16 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-bf16.txt"
OUT="$out/f32" timeout 120 bash bench/ab.sh 3 --shapes $F32 --variants auto > "$out/ab-f32.txt" 2>&1
echo "f32 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-f32.txt"
rm -rf "$out"/f32/ab-base "$out"/f32/ab-new "$out"/bf16/ab-base "$out"/bf16/ab-new
bin=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
timeout 100 "$bin" > "$out/test-gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep "test result" "$out/test-gpu.txt"
for t in gpu_ops gpu_stress; do
  b=$(ls .gpu/tests/$t-* | head -n1)
  timeout 330 "$b" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-$t.txt"
done
SANITIZE_BINARY=gpu_ops SANITIZE_FILTERS=ops_special SANITIZE_TIMEOUT=100 SANITIZE_RACECHECK_TIMEOUT=150 OUT="$out/sanitize-ops" bash bench/sanitize.sh > /dev/null 2>&1
echo "sanitize ops rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/sanitize-ops/sanitizer-summary.txt"
SANITIZE_BINARY=gpu SANITIZE_FILTERS=llm SANITIZE_TOOLS="memcheck synccheck" SANITIZE_TIMEOUT=100 OUT="$out/sanitize-gpu" bash bench/sanitize.sh > /dev/null 2>&1
echo "sanitize gpu rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/sanitize-gpu/sanitizer-summary.txt"
gzip -f "$out"/sanitize-*/sanitizer.txt
