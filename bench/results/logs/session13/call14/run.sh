#!/usr/bin/env bash
# Session 13 call 14: branch sixteen-bit-two-per-sm (16-bit row-slices aim at 2 blocks per
# multiprocessor). The 16-bit row-slices GPU test, then ab.sh main -> branch, bf16.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
b=$(ls .gpu/tests/gpu_ops-* | head -n1)
timeout 80 "$b" wide_16 > "$out/test-ops.txt" 2>&1; echo "gpu_ops wide_16 rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-ops.txt"
OUT="$out/bf16" timeout 100 bash bench/ab.sh 2 --dtype bf16 --iters 20 --shapes 32x151936,64x151936,16x262144,24x128256,48x65536,12x262144 > "$out/ab-bf16.txt" 2>&1
echo "ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-bf16.txt"
rm -rf "$out"/bf16/ab-base "$out"/bf16/ab-new
