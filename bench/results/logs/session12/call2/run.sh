#!/usr/bin/env bash
# Session 12 call 2: row-slices for bf16/f16 (branch row-slices-16; host-base = main):
# gpu tests, the gpu_ops tests that reach 16-bit row-slices, then ab.sh on f32 (row-slices'
# code is now generic: expected unchanged) and on bf16 (the new path).
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
bin=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
timeout 100 "$bin" > "$out/test-gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep "test result" "$out/test-gpu.txt"
ops=$(ls .gpu/tests/gpu_ops-* | head -n1)
for f in wide_16 special peeled every_operation; do
  timeout 150 "$ops" $f > "$out/test-gpu_ops-$f.txt" 2>&1; echo "gpu_ops $f rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-gpu_ops-$f.txt"
done
F32=32x151936,128x50257,16x262144,8x128256,1x1048576
BF16=32x151936,16x262144,128x50257,8x128256,1x1048576,64x151936,600x70000,300x100000,512x65536
OUT="$out/bf16" timeout 200 bash bench/ab.sh 3 --dtype bf16 --shapes $BF16 > "$out/ab-bf16.txt" 2>&1
echo "bf16 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-bf16.txt"
OUT="$out/f32" timeout 120 bash bench/ab.sh 3 --shapes $F32 --variants auto > "$out/ab-f32.txt" 2>&1
echo "f32 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-f32.txt"
rm -rf "$out"/f32/ab-base "$out"/f32/ab-new "$out"/bf16/ab-base "$out"/bf16/ab-new
