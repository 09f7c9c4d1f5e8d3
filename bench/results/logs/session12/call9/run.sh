#!/usr/bin/env bash
# Session 12 call 9: main's final binaries (fa7708b): gpu_ops in full and gpu_stress.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
for t in gpu_ops gpu_stress; do
  b=$(ls .gpu/tests/$t-* | head -n1)
  timeout 250 "$b" > "$out/test-$t.txt" 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-$t.txt"
done
