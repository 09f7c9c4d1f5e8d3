#!/usr/bin/env bash
# Session 12 call 4: main with 16-bit row-slices (from 4 MiB): the new GPU test and peeled rows
# again (its 8x300001 shape is new), then the committed tables: bf16 softmax with the peers on
# the default shapes (seed sweep and LLM rows), and the f32 LLM table with the peers.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
ops=$(ls .gpu/tests/gpu_ops-* | head -n1)
for f in wide_16 peeled special; do
  timeout 100 "$ops" $f > "$out/test-gpu_ops-$f.txt" 2>&1; echo "gpu_ops $f rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-gpu_ops-$f.txt"
done
timeout 300 .gpu/host bench --dtype bf16 --peers --out "$out/results" > "$out/bench-softmax-bf16.txt" 2>&1
echo "bf16 table rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch |triton)" "$out/bench-softmax-bf16.txt" | tail -60
timeout 120 .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out "$out/llm-f32" > "$out/llm-f32.txt" 2>&1
echo "f32 llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch )" "$out/llm-f32.txt"
tar czf "$out/tables.tgz" -C "$out" results llm-f32
