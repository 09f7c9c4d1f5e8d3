#!/usr/bin/env bash
# Session 11 call 3: branch balanced-rounds (sliced row-slices blocks take the threads that
# save a round of loads; one-wave rows an 8-loads instance): A/B main -> branch, then the
# branch's gpu and gpu_stress tests, then compute-sanitizer over the gpu (f32) test binary.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
S=32x151936,128x50257,120x40000,100x100000,16x262144,8x128256,64x65536,128x151936
OUT="$out/rounds" timeout 150 bash bench/ab.sh 3 --shapes $S --variants auto > "$out/ab-rounds.txt" 2>&1
echo "ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-rounds.txt"
rm -rf "$out"/rounds/ab-base "$out"/rounds/ab-new
for t in gpu gpu_stress; do
  bin=$(ls .gpu/tests/$t-* | head -n1)
  timeout 150 "$bin" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "test result" "$out/test-$t.txt"
done
SANITIZE_BINARY=gpu SANITIZE_TIMEOUT=200 SANITIZE_RACECHECK_TIMEOUT=300 OUT="$out/sanitize" bash bench/sanitize.sh > /dev/null 2>&1
echo "sanitize rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/sanitize/sanitizer-summary.txt"
gzip -f "$out/sanitize/sanitizer.txt"
