#!/usr/bin/env bash
# Session 10 call 8: row-cluster's cluster size and threads (diag knob), beside row-slices; the planner's active-cluster count.
out=${OUT:-device-out}
S=32x151936,16x262144,8x128256
run() { echo "=== $*"; env "$@" timeout 25 .gpu/d/host-cl bench --shapes $S --variants row-slices,row-cluster --out "$out/x" 2>&1 | grep -E 'DIAG|^[0-9]|row-|copy'; }
{
run X=default
run SOFTMAX_DIAG_CLUSTER=8 SOFTMAX_DIAG_CLUSTER_THREADS=512
run SOFTMAX_DIAG_CLUSTER=8 SOFTMAX_DIAG_CLUSTER_THREADS=1024
run SOFTMAX_DIAG_CLUSTER=16 SOFTMAX_DIAG_CLUSTER_THREADS=512
run SOFTMAX_DIAG_CLUSTER=12 SOFTMAX_DIAG_CLUSTER_THREADS=512
run X=default
} > "$out/cluster.txt" 2>&1
rm -rf "$out/x"; cat "$out/cluster.txt"
