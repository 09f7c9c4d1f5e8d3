#!/usr/bin/env bash
# Session 13 call 9: programmatic-launch (as call 8): the bf16 softmax table with the peers
# on the default shapes (seed sweep and LLM rows).
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
timeout 420 .gpu/host bench --dtype bf16 --peers --out "$out/results" > "$out/bench-softmax-bf16.txt" 2>&1
echo "bf16 table rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^[0-9]|  (copy|auto|torch )" "$out/bench-softmax-bf16.txt" | tail -75
tar czf "$out/tables.tgz" -C "$out" results
