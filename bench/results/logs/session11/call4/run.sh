#!/usr/bin/env bash
# Session 11 call 4: eight more A/B rounds of main -> balanced-rounds on the two shapes it
# targets, then the f32 LLM table with the peers from the branch's binary.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
OUT="$out/rounds" timeout 200 bash bench/ab.sh 8 --shapes 128x50257,32x151936 --variants auto > "$out/ab-rounds.txt" 2>&1
echo "ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-rounds.txt"
rm -rf "$out"/rounds/ab-base "$out"/rounds/ab-new
timeout 240 .gpu/host bench --peers --shapes 1x32000,1x128256,8x128256,32x151936,64x151936,128x50257,16x262144,1x1048576,4096x1000,65536x100,3x100003 --out bench/results/llm-f32 > "$out/llm-f32.txt" 2>&1
echo "llm rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch |triton)" "$out/llm-f32.txt" | head -60
tar czf "$out/llm-f32.tgz" bench/results/llm-f32
