#!/usr/bin/env bash
# Session 14 call 10, main after the review fixes: gpu and gpu_stress in full (the new test
# beside a kernel that waits for the sliced launches included), the 16-bit row-slices and
# every-operation tests of gpu_ops.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for t in gpu gpu_stress; do
  b=$(ls .gpu/tests/$t-* | head -n1)
  timeout 240 "$b" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-$t.txt"
done
b=$(ls .gpu/tests/gpu_ops-* | head -n1)
for f in wide_16 ops_every; do
  timeout 100 "$b" $f > "$out/test-ops-$f.txt" 2>&1; echo "gpu_ops $f rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-ops-$f.txt"
done
