#!/usr/bin/env bash
# Session 11 call 5: main's final binaries (streaming loads + the threads that save a round):
# gpu tests, the f32 LLM table with the peers, the four sanitizers on the LLM shapes.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
bin=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
timeout 100 "$bin" > "$out/test-gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep "test result" "$out/test-gpu.txt"
timeout 120 .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out bench/results/llm-f32 > "$out/llm-f32.txt" 2>&1
echo "llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch |triton)" "$out/llm-f32.txt" | head -60
tar czf "$out/llm-f32.tgz" bench/results/llm-f32
SANITIZE_BINARY=gpu SANITIZE_FILTERS=llm SANITIZE_TIMEOUT=100 SANITIZE_RACECHECK_TIMEOUT=120 OUT="$out/sanitize" bash bench/sanitize.sh > /dev/null 2>&1
echo "sanitize rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/sanitize/sanitizer-summary.txt"
gzip -f "$out/sanitize/sanitizer.txt"
