#!/usr/bin/env bash
# Session 13 call 6: where programmatic overlap costs (65536x100 lost 19 points in call 5).
# host = wait + launch_dependents at entry; host-base = wait only (implicit trigger at block
# exit). SOFTMAX_NO_PSS=1: launches without the overlap attribute (the instructions stay).
out=${OUT:-device-out}
mkdir -p "$out"
bash bench/unpack-bundle.sh || exit 2
t0=$(date +%s)
S=65536x100,4096x1000,1x128256,1x32000,128x50257,2048x4096,1638400x32,409600x128,51200x1024,3200x16384
for dtype in f32 bf16; do
for round in 1 2; do
  for bin in host host-base; do
    for knob in "" 1; do
      echo "### $dtype $bin knob '$knob' round $round" >> "$out/raw.txt"
      SOFTMAX_NO_PSS=$knob timeout 100 .gpu/$bin bench --dtype $dtype --shapes $S --variants auto --out "$out/b" >> "$out/raw.txt" 2>&1
    done
  done
done
echo "$dtype $(( $(date +%s) - t0 ))s"
done
awk '/^### / { cfg = $2 "-" $3 "-" $5 } / per tensor\)/ { shape = $1 " " $2 } /^  auto / { key = shape " " cfg; if (!(key in p)) o[++n] = key; p[key] = p[key] " " $4 }
  END { for (i = 1; i <= n; i++) print o[i], p[o[i]] }' "$out/raw.txt" | sort > "$out/summary.txt"
cat "$out/summary.txt"
rm -rf "$out/b"
