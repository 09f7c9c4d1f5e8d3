#!/usr/bin/env bash
# Session 11 call 2: (1) A/B main -> stagger-rows (trailing rows wait for their lead row's
# reads before reading); (2) main's GPU tests: gpu, gpu_stress, gpu_ops (all nine);
# (3) the f32 LLM table with the peers.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
gunzip -c .gpu/host-stagger.gz > .gpu/host-stagger && chmod +x .gpu/host-stagger
cp .gpu/host .gpu/host-base && cp .gpu/host-stagger .gpu/host && touch .gpu/host
S=32x151936,128x50257,16x262144,8x128256,3x100003
OUT="$out/stagger" timeout 150 bash bench/ab.sh 3 --shapes $S --variants auto > "$out/ab-stagger.txt" 2>&1
echo "stagger ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-stagger.txt"
rm -rf "$out"/stagger/ab-base "$out"/stagger/ab-new
cp .gpu/host-base .gpu/host && touch .gpu/host
for t in gpu gpu_stress gpu_ops; do
  bin=$(ls .gpu/tests/$t-* | head -n1)
  timeout 330 "$bin" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "test result" "$out/test-$t.txt"
done
left=$(( 585 - ($(date +%s) - t0) ))
timeout $left .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out bench/results/llm-f32 > "$out/llm-f32.txt" 2>&1
echo "llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch|triton)" "$out/llm-f32.txt" | head -60
tar czf "$out/llm-f32.tgz" bench/results/llm-f32
