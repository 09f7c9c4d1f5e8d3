#!/usr/bin/env bash
# Session 12 call 1: one-global-load (row-slices' streaming loads through element::load_words):
# gpu tests; then the baseline of the op path against
# row-slices: f32 softmax (row-slices) beside f32 log-softmax (operation kernels) and bf16
# softmax (operation kernels) on the few-row shapes.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
bin=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
timeout 100 "$bin" > "$out/test-gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep "test result" "$out/test-gpu.txt"
S=32x151936,16x262144,128x50257,8x128256,64x151936
timeout 60 .gpu/host bench --shapes $S --variants auto --out "$out/f32" > "$out/f32.txt" 2>&1
timeout 60 .gpu/host bench --op log-softmax --shapes $S --out "$out/lsm" > "$out/lsm-f32.txt" 2>&1
timeout 60 .gpu/host bench --dtype bf16 --shapes $S --out "$out/bf16" > "$out/bf16.txt" 2>&1
echo "bench $(( $(date +%s) - t0 ))s"; grep -hE "^[0-9]|  (copy|auto) " "$out/f32.txt" "$out/lsm-f32.txt" "$out/bf16.txt"
