#!/usr/bin/env bash
# Session 10 call 7: where slot-exchange's time goes (phases of row-slices), main's kernel beside it.
out=${OUT:-device-out}
for r in 1 2; do for b in main slot; do echo "== $b $r"; timeout 40 .gpu/d/phases-$b 32x151936 16x262144 8x128256 1x1048576; done; done > "$out/phases.txt" 2>&1
cat "$out/phases.txt"
