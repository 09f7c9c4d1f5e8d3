#!/usr/bin/env bash
# Session 13 call 8: branch programmatic-launch (wait-only entries; every non-cooperative
# launch with programmatic overlap). All GPU tests (gpu, gpu_stress with the chained launches,
# gpu_ops in full), then the f32 LLM table with the peers.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for t in gpu gpu_stress gpu_ops; do
  b=$(ls .gpu/tests/$t-* | head -n1)
  timeout 260 "$b" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-$t.txt"
done
timeout 150 .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out "$out/llm-f32" > "$out/llm-f32.txt" 2>&1
echo "f32 llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch )" "$out/llm-f32.txt"
tar czf "$out/tables.tgz" -C "$out" llm-f32
