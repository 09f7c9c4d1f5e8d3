#!/usr/bin/env bash
# Session 11 call 1: GPU tests of streaming-op-loads (row-slices and operation kernels read
# their inputs with ld.global.cs), then ab.sh main -> branch on f32 and bf16 shapes.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
for t in gpu gpu_ops gpu_stress; do
  bin=$(ls .gpu/tests/$t-* | head -n1)
  timeout 200 "$bin" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "test result" "$out/test-$t.txt"
done
F32=32x151936,128x50257,16x262144,8x128256,1x1048576,64x151936,48x262144,128x151936,512x65536
BF16=32x151936,16x262144,8x128256,1x1048576,128x50257,64x151936,3x100003,25600x4096,102400x1024,6400x16384
OUT="$out/f32" timeout 170 bash bench/ab.sh 3 --shapes $F32 --variants auto > "$out/ab-f32.txt" 2>&1
echo "f32 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-f32.txt"
OUT="$out/bf16" timeout 170 bash bench/ab.sh 3 --dtype bf16 --shapes $BF16 > "$out/ab-bf16.txt" 2>&1
echo "bf16 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-bf16.txt"
rm -rf "$out"/f32/ab-base "$out"/f32/ab-new "$out"/bf16/ab-base "$out"/bf16/ab-new
