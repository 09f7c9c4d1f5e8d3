#!/usr/bin/env bash
# Session 14 call 5, branch sweep-14 (same bundle as call 4): bf16 shapes not in call 4's
# sweep, at 4 and 2 blocks per multiprocessor, to check a rule drawn from call 4.
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
for round in 1 2; do
  for per in 4 2; do
    echo "### bf16 per-sm $per threads '' round $round" >> "$out/raw.txt"
    SOFTMAX_DIAG_BLOCKS_PER_SM=$per timeout 60 .gpu/host bench --dtype bf16 --shapes 40x151936,32x128256,16x151936,8x262144,32x100000,20x200000,96x65536,64x100000,24x151936,32x200064 --iters 20 --out "$out/b" >> "$out/raw.txt" 2>&1
  done
done
awk '/^### / { cfg = $2 " per-sm " $4 } / per tensor\)/ { shape = $1 } /^  auto / { key = shape " " cfg; if (!(key in p)) o[++n] = key; p[key] = p[key] " " $4; k[key] = $NF " " $(NF-1) " " $(NF-2) " " $(NF-3) }
  END { for (i = 1; i <= n; i++) print o[i], p[o[i]], k[o[i]] }' "$out/raw.txt" | sort > "$out/summary.txt"
cat "$out/summary.txt"
rm -rf "$out/b"
