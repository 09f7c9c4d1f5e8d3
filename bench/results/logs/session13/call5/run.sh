#!/usr/bin/env bash
# Session 13 call 5: branch overlapped-launch (every non-cooperative launch with programmatic
# overlap; every entry waits first) + a diagnostic knob for cooperative launches.
# Tests first (gpu, gpu_stress' chained launches), then: the non-cooperative few-row
# variants beside auto; cooperative launches without the cooperative attribute (knob 1, a
# measurement of what overlap would give them, not a safe launch); ab main -> branch on the
# small and odd shapes.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
bin=$(ls .gpu/tests/gpu-* | head -n1)
timeout 100 "$bin" > "$out/test-gpu.txt" 2>&1; echo "gpu rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-gpu.txt"
b=$(ls .gpu/tests/gpu_stress-* | head -n1)
timeout 100 "$b" chained > "$out/test-chained.txt" 2>&1; echo "chained rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-chained.txt"
FEW=32x151936,16x262144,8x128256,1x1048576,64x151936
for round in 1 2; do
  for knob in "" 1; do
    echo "### f32 round $round knob '$knob'" >> "$out/few-f32.txt"
    SOFTMAX_COOP_OVERLAP=$knob timeout 60 .gpu/host bench --shapes $FEW --variants auto,split-rows,row-cluster --out "$out/few" >> "$out/few-f32.txt" 2>&1
    echo "### bf16 round $round knob '$knob'" >> "$out/few-bf16.txt"
    SOFTMAX_COOP_OVERLAP=$knob timeout 60 .gpu/host bench --dtype bf16 --shapes $FEW --out "$out/few" >> "$out/few-bf16.txt" 2>&1
  done
done
echo "few $(( $(date +%s) - t0 ))s"
grep -E '^###|per tensor\)|^  (auto|split|row-cl|copy)' "$out/few-f32.txt" | cut -c1-110
grep -E '^###|per tensor\)|^  (auto|copy)' "$out/few-bf16.txt" | cut -c1-110
SMALL=1x32000,1x128256,3x100003,4096x1000,65536x100,128x50257,256x50257,2048x4096
OUT="$out/f32" timeout 120 bash bench/ab.sh 2 --shapes $SMALL --variants auto > "$out/ab-f32.txt" 2>&1
echo "f32 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-f32.txt"
OUT="$out/bf16" timeout 120 bash bench/ab.sh 2 --dtype bf16 --shapes $SMALL > "$out/ab-bf16.txt" 2>&1
echo "bf16 ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-bf16.txt"
rm -rf "$out"/f32/ab-base "$out"/f32/ab-new "$out"/bf16/ab-base "$out"/bf16/ab-new "$out/few"
