#!/usr/bin/env bash
# One call on a GPU machine that has no Rust toolchain: GPU tests, the full benchmark with the
# peers, the dispatch-boundary sweep, compute-sanitizer, ptxas and a short criterion run, from
# the bundle `cargo xtask device-bundle` built into .gpu/. Logs go to $OUT (or ./device-out).
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
gpu_tests=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
stress_tests=$(ls .gpu/tests/gpu_stress-* | head -n1)

ptxas -arch=sm_90 -v .gpu/kernels.ptx -o /dev/null > "$out/ptxas.txt" 2>&1
"$gpu_tests" 2>&1 | tee "$out/gpu-tests.txt"
"$stress_tests" 2>&1 | tee "$out/gpu-stress.txt"
timeout 360 .gpu/host bench --peers --out bench/results > "$out/bench.txt" 2>&1
timeout 120 .gpu/host bench --boundaries --variants auto,registers,block-registers --out bench/results/boundaries > "$out/boundaries.txt" 2>&1
{
    timeout 300 compute-sanitizer --tool memcheck "$gpu_tests" every_variant
    for tool in memcheck initcheck synccheck; do
        timeout 120 compute-sanitizer --tool "$tool" "$gpu_tests" misaligned
        timeout 120 compute-sanitizer --tool "$tool" "$gpu_tests" special
    done
    timeout 120 compute-sanitizer --tool racecheck "$gpu_tests" special
} > "$out/sanitizer.txt" 2>&1
grep -E "SUMMARY|test result" "$out/sanitizer.txt"
bench=$(ls .gpu/benches/softmax-* | xargs -n1 sh -c 'strings "$0" | grep -q criterion && echo "$0"' | head -n1)
timeout 90 "$bench" --bench --noplot --warm-up-time 0.2 --measurement-time 0.5 'softmax/(auto|registers)/' > "$out/criterion.txt" 2>&1
tail -n 4 "$out/criterion.txt"
tar czf "$out/results.tgz" bench/results
