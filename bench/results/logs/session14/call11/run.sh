#!/usr/bin/env bash
# Session 14 call 11: the test beside a waiting kernel after the carveout fix, then the
# leaving and late-writer tests again.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
b=$(ls .gpu/tests/gpu_stress-* | head -n1)
for f in beside leave late; do
  timeout 60 "$b" $f > "$out/stress-$f.txt" 2>&1; echo "stress $f rc=$?"; grep -E "^test |test result" "$out/stress-$f.txt"
done
