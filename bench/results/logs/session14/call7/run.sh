#!/usr/bin/env bash
# Session 14 call 7, the final binaries (same bundle as call 6): the f32 LLM and odd shapes
# and the bf16 default sweep, each with the peers, then compute-sanitizer (memcheck,
# racecheck, synccheck) over the leaving-blocks test and the f32 LLM test.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
timeout 150 .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out "$out/llm-f32" > "$out/llm-f32.txt" 2>&1
echo "f32 llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch )" "$out/llm-f32.txt"
timeout 300 .gpu/host bench --dtype bf16 --peers --out "$out/results" > "$out/bench-softmax-bf16.txt" 2>&1
echo "bf16 table rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch )" "$out/bench-softmax-bf16.txt" | tail -n 60
tar czf "$out/tables.tgz" -C "$out" llm-f32 results
SANITIZE_BINARY=gpu_stress SANITIZE_TOOLS="memcheck racecheck synccheck" SANITIZE_FILTERS="leave" SANITIZE_TIMEOUT=120 SANITIZE_RACECHECK_TIMEOUT=150 OUT="$out/san-stress" timeout 280 bash bench/sanitize.sh > /dev/null 2>&1; echo "sanitize stress rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/san-stress/sanitizer-summary.txt"
