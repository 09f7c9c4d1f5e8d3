#!/usr/bin/env bash
# One run on a GPU machine that has no Rust toolchain (it takes a while: split it where
# needed): GPU tests (the f32 variants, the operation API, stress, integration, the CUDA-fault
# test) through both kernel builds, the outside consumer crates, the cold start and the host
# overhead, the two kernel builds side by side, the full benchmark with the peers (both timing
# modes), the bf16 and backward benchmarks, the dispatch-boundary sweep, compute-sanitizer over
# the test binaries (bench/sanitize.sh), ptxas and a short criterion run, from the bundle
# `cargo xtask device-bundle` packed into .gpu/ (unpacked here first). Logs go to $OUT (or
# ./device-out).
set -uo pipefail
# A GPU machine: a missing device fails the GPU tests instead of skipping them.
export SOFTMAX_REQUIRE_GPU=1
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
bash bench/unpack-bundle.sh || exit 2
gpu_tests=$(ls .gpu/tests/gpu-* | grep -v stress | head -n1)
stress_tests=$(ls .gpu/tests/gpu_stress-* | head -n1)
fault_tests=$(ls .gpu/tests/gpu_fault-* | head -n1)
ops_tests=$(ls .gpu/tests/gpu_ops-* | head -n1)
integration_tests=$(ls .gpu/tests/gpu_integration-* | head -n1)

for ptx in .gpu/images/*.sm_90.ptx; do echo "== $ptx"; ptxas -arch=sm_90 -v "$ptx" -o /dev/null; done > "$out/ptxas.txt" 2>&1
# Every test binary through the device's own kernel build, then through the sm_80 build (on a
# Hopper GPU; elsewhere the second pass repeats the first).
for build in "" sm_80; do
    tag=${build:-native}
    export SOFTMAX_KERNEL_BUILD=$build
    "$gpu_tests" 2>&1 | tee "$out/gpu-tests-$tag.txt"
    "$stress_tests" 2>&1 | tee "$out/gpu-stress-$tag.txt"
    timeout 180 "$fault_tests" 2>&1 | tee "$out/gpu-fault-$tag.txt"
    "$ops_tests" 2>&1 | tee "$out/gpu-ops-tests-$tag.txt"
    "$integration_tests" 2>&1 | tee "$out/gpu-integration-tests-$tag.txt"
done
unset SOFTMAX_KERNEL_BUILD
for consumer in .gpu/consumers/*; do "$consumer"; done 2>&1 | tee "$out/consumers.txt"
# Cold start (JIT cache off and warm) and the host's cost per call.
timeout 120 .gpu/host coldstart --out bench/results > "$out/coldstart.txt" 2>&1
timeout 60 .gpu/host overhead 2>&1 | tee "$out/overhead.txt"
# The two kernel builds side by side (auto, back-to-back).
for build in sm_90 sm_80; do
    SOFTMAX_KERNEL_BUILD=$build timeout 120 .gpu/host bench --variants auto --timing back-to-back \
        --out "bench/results/kernel-builds/$build" > "$out/bench-$build.txt" 2>&1
done
timeout 360 .gpu/host bench --peers --out bench/results > "$out/bench.txt" 2>&1
for run in "--dtype bf16" "--op backward" "--op backward --dtype bf16"; do
    # shellcheck disable=SC2086
    timeout 180 .gpu/host bench $run --peers --out bench/results > "$out/bench-${run//[- ]/}.txt" 2>&1
done
timeout 120 .gpu/host bench --boundaries --variants auto,registers,block-registers --out bench/results/boundaries > "$out/boundaries.txt" 2>&1
# memcheck, racecheck, initcheck, synccheck over the test binaries' default filters:
# $out/sanitizer.txt and $out/sanitizer-summary.txt (the summary is printed too); then the
# operation tests the defaults leave out (scales and masks, the two largest tensors).
OUT="$out" bash bench/sanitize.sh
SANITIZE_BINARY=gpu_ops SANITIZE_FILTERS="ops_scales ops_largest" OUT="$out/ops" bash bench/sanitize.sh
bench=$(ls .gpu/benches/softmax-* | xargs -n1 sh -c 'strings "$0" | grep -q criterion && echo "$0"' | head -n1)
timeout 90 "$bench" --bench --noplot --warm-up-time 0.2 --measurement-time 0.5 'softmax/(auto|registers)/' > "$out/criterion.txt" 2>&1
tail -n 4 "$out/criterion.txt"
tar czf "$out/results.tgz" bench/results
