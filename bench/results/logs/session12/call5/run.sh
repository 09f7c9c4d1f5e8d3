#!/usr/bin/env bash
# Session 12 call 5: where 16-bit row-slices starts paying, just above the 4 MiB cut: ab.sh
# with host-base = 8fb629a (operation kernels everywhere) against main (row-slices from 4 MiB)
# on bf16 shapes of 4.2-6.3 MB; then memcheck and synccheck over the new 16-bit test (both
# types, 16-byte and one-element packs).
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/smi.txt"
t0=$(date +%s)
BF16=8x262144,16x131072,32x65536,4x524288,2x1048576,24x128256,12x262144,48x65536
OUT="$out/cut" timeout 200 bash bench/ab.sh 3 --dtype bf16 --shapes $BF16 > "$out/ab-cut.txt" 2>&1
echo "cut ab $(( $(date +%s) - t0 ))s"; cat "$out/ab-cut.txt"
rm -rf "$out"/cut/ab-base "$out"/cut/ab-new
SANITIZE_BINARY=gpu_ops SANITIZE_FILTERS=ops_wide_16 SANITIZE_TOOLS="memcheck synccheck" SANITIZE_TIMEOUT=200 OUT="$out/sanitize" bash bench/sanitize.sh > /dev/null 2>&1
echo "sanitize rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/sanitize/sanitizer-summary.txt"
gzip -f "$out/sanitize/sanitizer.txt"
