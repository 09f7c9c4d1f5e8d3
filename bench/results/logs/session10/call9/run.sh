#!/usr/bin/env bash
# Session 10 call 9: cache hints on row-slices' input loads and output stores (h0 main, h1 .cs stores, h2 .cs loads and stores).
out=${OUT:-device-out}
tar xzf .gpu/h.tgz -C .gpu
S=32x151936,128x50257,16x262144,8x128256
for r in 1 2 3; do for v in 0 1 2; do
  echo "### h$v round $r"; timeout 25 .gpu/h/host-h$v bench --shapes $S --variants auto --out "$out/x" 2>&1 | grep -E '^[0-9]|  (copy|auto) '
done; done > "$out/hints.txt"
rm -rf "$out/x"
awk '/^### /{b=$2} /^[0-9]/{s=$1} /  auto /{k=s" "b; if(!(k in v)){o[++n]=k}; v[k]=v[k]" "$(NF-3)} END{for(i=1;i<=n;i++) print o[i], v[o[i]]}' "$out/hints.txt" | sort
