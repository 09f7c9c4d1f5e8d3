#!/usr/bin/env bash
# Session 14 call 1 (prepared in session 13), branch next-device-run-14 = row-cluster-16 +
# pdl-late-writer, bundled with `cargo xtask device-bundle`:
# 1. gpu_stress' late-writer test (every kernel family waits for a kernel that releases it at
#    once and writes its input 100 us later);
# 2. the 16-bit row-slices test with 16-bit softmax sent to a cluster per row (knob);
# 3. bf16 few-row shapes: row-slices (knob off) against row-cluster at 4 and 2 blocks per
#    multiprocessor, two rounds, % of copy.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
b=$(ls .gpu/tests/gpu_stress-* | head -n1)
timeout 100 "$b" late > "$out/test-late.txt" 2>&1; echo "late rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-late.txt"
b=$(ls .gpu/tests/gpu_ops-* | head -n1)
SOFTMAX_DIAG_CLUSTER16=1 timeout 100 "$b" wide_16 > "$out/test-ops-cluster.txt" 2>&1; echo "wide_16 (clusters) rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^test |test result" "$out/test-ops-cluster.txt"
S=32x151936,64x151936,16x262144,24x128256,48x65536
for round in 1 2; do
  for cfg in off:4 on:4 on:2; do
    knob=${cfg%%:*}; per=${cfg#*:}
    c=""; [ "$knob" = on ] && c=1
    echo "### bf16 cluster $knob per-sm $per round $round" >> "$out/raw.txt"
    SOFTMAX_DIAG_CLUSTER16=$c SOFTMAX_DIAG_CLUSTER_PER_SM=$per timeout 60 .gpu/host bench --dtype bf16 --shapes $S --iters 20 --out "$out/b" >> "$out/raw.txt" 2>&1
  done
done
echo "bench $(( $(date +%s) - t0 ))s"
awk '/^### / { cfg = "cluster " $4 " per-sm " $6 } / per tensor\)/ { shape = $1 } /^  auto / { key = shape " " cfg; if (!(key in p)) o[++n] = key; p[key] = p[key] " " $4; k[key] = $0 }
  END { for (i = 1; i <= n; i++) print o[i], p[o[i]] }' "$out/raw.txt" | sort > "$out/summary.txt"
cat "$out/summary.txt"
grep -iE 'error|fail' "$out/raw.txt" | head -5
rm -rf "$out/b"
