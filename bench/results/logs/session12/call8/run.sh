#!/usr/bin/env bash
# Session 12 call 8: branch row-slices-to-f32 (+ a diagnostic example): the 16-bit test, now
# with f32 outputs, peeled rows and special values; then examples/mixed: bf16 -> f32 (and
# bf16 -> bf16) softmax through row-slices against the operation kernels, beside the copy.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
ops=$(ls .gpu/tests/gpu_ops-* | head -n1)
for f in wide_16 peeled special; do
  timeout 200 "$ops" $f > "$out/test-gpu_ops-$f.txt" 2>&1; echo "gpu_ops $f rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-gpu_ops-$f.txt"
done
ls .gpu/examples/ | head
timeout 120 .gpu/examples/mixed > "$out/mixed.txt" 2>&1; echo "mixed rc=$? $(( $(date +%s) - t0 ))s"; cat "$out/mixed.txt"
