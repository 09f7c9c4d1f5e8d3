#!/usr/bin/env bash
# Session 14 call 9, main after the test refactor (kernels and library unchanged since calls
# 6-8): the gpu_stress tests whose code changed.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
b=$(ls .gpu/tests/gpu_stress-* | head -n1)
for f in late leave resident; do
  timeout 120 "$b" $f > "$out/stress-$f.txt" 2>&1; echo "stress $f rc=$?"; grep -E "^test |test result" "$out/stress-$f.txt"
done
