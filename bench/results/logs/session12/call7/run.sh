#!/usr/bin/env bash
# Session 12 call 7 (diagnostic, branch row-skew): row-slices' cached 16-byte slices arrive by
# bulk copies (8 pieces, issued by one thread), row r's issued r * SKEW ns after its blocks
# start, so rows finish reading in turn while each block keeps its whole slice in flight.
# .gpu/host (main) beside .gpu/host-bulk with skews 0, 25, 50, 100 ns, two interleaved rounds.
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
gunzip -kf .gpu/host-bulk.gz && chmod +x .gpu/host-bulk
t0=$(date +%s)
run() { # name binary skew
  SOFTMAX_ROW_SKEW_NS=$3 timeout 40 $2 bench --shapes 32x151936,16x262144,128x50257,8x128256 --variants auto --out "$out/x" > "$out/$1-f32-$4.txt" 2>&1
  SOFTMAX_ROW_SKEW_NS=$3 timeout 40 $2 bench --dtype bf16 --shapes 32x151936,16x262144,64x151936 --out "$out/x" > "$out/$1-bf16-$4.txt" 2>&1
}
for round in 1 2; do
  run main .gpu/host 0 $round
  for skew in 0 25 50 100; do run bulk$skew .gpu/host-bulk $skew $round; done
done
echo "runs $(( $(date +%s) - t0 ))s"
for f in "$out"/*-f32-*.txt "$out"/*-bf16-*.txt; do
  awk -v f="$(basename $f .txt)" '/ per tensor\)/ {shape=$1} /^  auto / {printf "%-16s %-12s %s\n", f, shape, $4} /FAILED|failed|error/ {print f, $0}' "$f"
done | sort -k2,2 -k1,1 | tee "$out/summary.txt"
rm -rf "$out/x"
