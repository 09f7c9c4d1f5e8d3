#!/usr/bin/env bash
# compute-sanitizer over the GPU tests, on a GPU machine, from the repository root, using the
# bundle `cargo xtask device-bundle` packed into .gpu/ (no Rust toolchain needed there). The one
# command for every kernel:
#
#   bash bench/sanitize.sh [EXTRA_FILTER ...]
#
# Runs each tool (memcheck, racecheck, initcheck, synccheck) over each test binary once per
# test filter (a filter selects the tests whose name contains it, so later tests can be added
# without editing this file), then once per filter given as an argument:
# - `gpu` (the f32 variants): `every_variant`, `special`, `misaligned`, `llm`. `every_variant`
#   is the foundation shape list: every variant on cols {1, 2, 31, 32, 33, 127, 1000, 4097,
#   16384, 65537} x rows {1, 3, 1000}.
# - `gpu_ops` (the operation kernels): `ops_special`, `ops_every` (every operation and type
#   pair on the same shape list), `ops_peeled`, `ops_partial`, `ops_strides`, `ops_pitched`,
#   `ops_few` (few wide rows in slices, in clusters and cooperative), `ops_bad`.
# - `gpu_stress`: `launches_wait` (every family right after a late writer),
#   `sliced_rows_are_exact` (blocks leaving their slices).
# - `gpu_integration`: `callers_stream` (calls and raw calls on the caller's stream),
#   `overlapping`, `tuned_choice`, `cudarc`.
# - `gpu_sampling`: `small_top_k` (the candidate path against the row kernel), `bisects`,
#   `shards`, `reproducible`, `captured`, `greedy`, `without_a_token`, `log_probabilities`,
#   `bad_input` (not `draws_follow_the_filtered_distribution`, the chi-square cases, which
#   draw 2^20 tokens 32 times).
# - `gpu_cross_entropy`: `ce_every_option`, `ce_block_entries`, `ce_in_place`, `ce_ignored`,
#   `ce_strided`, `ce_targets`, `ce_upstream`, `ce_vocabulary`, `ce_captured`, `ce_bad`,
#   `ce_special`.
# - `gpu_streams` (one instance on many streams; not in the default binaries, name it in
#   SANITIZE_BINARY): `two_streams`, `growth`, `graph_replays`, `context`, `cudarc`.
# (gpu_fault faults on purpose, so it is not run under the tools.)
#
# Writes the full log to $OUT/sanitizer.txt and one line per (binary, tool, filter) to
# $OUT/sanitizer-summary.txt (OUT defaults to ./device-out): the tool's error count (its
# ERROR SUMMARY; racecheck's RACECHECK SUMMARY), the harness's `test result:` line and the exit
# code. Exits non-zero if any tool reported an error, a test failed, a filter matched no test,
# or a run timed out.
#
# Every run has a timeout. racecheck and initcheck are much slower than the uninstrumented
# run (racecheck most), so racecheck gets its own, longer one. gpu and gpu_ops take about six
# minutes on an H200. Environment:
#   SANITIZE_BINARY             test binaries (default "gpu gpu_ops gpu_stress gpu_integration
#                               gpu_sampling gpu_cross_entropy"; fewer to split the work over
#                               shorter runs)
#   SANITIZE_TOOLS              tools to run (default "memcheck racecheck initcheck synccheck")
#   SANITIZE_FILTERS            the default filters replaced (space-separated); a filter
#                               `BINARY:FILTER` is run only over BINARY, one without a prefix
#                               over every binary named (the arguments likewise)
#   SANITIZE_TIMEOUT            seconds per run for memcheck, initcheck, synccheck (default 600)
#   SANITIZE_RACECHECK_TIMEOUT  seconds per racecheck run (default 1800)
#   SOFTMAX_TEST_SEED           passed through to the tests (replays their random inputs)
set -uo pipefail
# A GPU machine: a missing device fails the GPU tests instead of skipping them.
export SOFTMAX_REQUIRE_GPU=1
out=${OUT:-device-out}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin
log="$out/sanitizer.txt"
summary="$out/sanitizer-summary.txt"

read -ra tools <<< "${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}"
read -ra binaries <<< "${SANITIZE_BINARY:-gpu gpu_ops gpu_stress gpu_integration gpu_sampling gpu_cross_entropy}"
timeout_default=${SANITIZE_TIMEOUT:-600}
timeout_racecheck=${SANITIZE_RACECHECK_TIMEOUT:-1800}

# The default filters of a test binary.
default_filters() {
    case $1 in
        gpu) echo "every_variant special misaligned llm" ;;
        gpu_ops) echo "ops_special ops_every ops_peeled ops_partial ops_strides ops_pitched ops_few ops_bad" ;;
        gpu_stress) echo "launches_wait sliced_rows_are_exact" ;;
        gpu_integration) echo "callers_stream overlapping tuned_choice cudarc" ;;
        gpu_streams) echo "two_streams growth graph_replays context cudarc" ;;
        gpu_sampling) echo "small_top_k bisects shards reproducible captured greedy without_a_token log_probabilities bad_input" ;;
        gpu_cross_entropy) echo "ce_every_option ce_block_entries ce_in_place ce_ignored ce_strided ce_targets ce_upstream ce_vocabulary ce_captured ce_bad ce_special" ;;
        *) echo "" ;;
    esac
}

# SANITIZE_FILTERS and the arguments, as words (read, not expanded: a `*` stays a `*`).
read -ra requested_filters <<< "${SANITIZE_FILTERS:-}"
extra_filters=("$@")

# The filters to run over binary $1: SANITIZE_FILTERS's (those for it, or for every binary)
# if set, else its defaults; then the arguments' (as SANITIZE_FILTERS's). One a line, none
# empty.
filters_of() {
    local binary=$1 filter
    local -a chosen=()
    if [ "${#requested_filters[@]}" -gt 0 ]; then
        chosen=("${requested_filters[@]}")
    else
        read -ra chosen <<< "$(default_filters "$binary")"
    fi
    for filter in "${chosen[@]}" "${extra_filters[@]}"; do
        case $filter in
            "$binary":?*) echo "${filter#*:}" ;;
            *:*) ;;
            ?*) echo "$filter" ;;
        esac
    done
}

bash bench/unpack-bundle.sh || exit 2
if ! command -v compute-sanitizer > /dev/null; then
    echo "sanitize: compute-sanitizer is not on PATH (nor in /usr/local/cuda/bin)" >&2
    exit 2
fi
# A filter for a binary not named would run nowhere; one with an empty side, over a whole
# binary or nothing.
for filter in "${requested_filters[@]}" "${extra_filters[@]}"; do
    case $filter in
        *:*)
            named=false
            for binary in "${binaries[@]}"; do
                [ "${filter%%:*}" = "$binary" ] && named=true
            done
            if [ -z "${filter%%:*}" ] || [ -z "${filter#*:}" ]; then
                echo "sanitize: filter \"$filter\" needs BINARY:FILTER, both named" >&2
                exit 2
            elif [ "$named" = false ]; then
                echo "sanitize: filter $filter names a binary not in SANITIZE_BINARY (${binaries[*]})" >&2
                exit 2
            fi
            ;;
    esac
done
# The test binaries (`gpu-<hash>`, `gpu_ops-<hash>`; the glob's `-` keeps `gpu` from matching
# gpu_stress or gpu_fault), each found before anything runs.
declare -A executables
for binary in "${binaries[@]}"; do
    for candidate in .gpu/tests/"$binary"-*; do
        [ -x "$candidate" ] && executables[$binary]=$candidate && break
    done
    if [ -z "${executables[$binary]:-}" ]; then
        echo "sanitize: no .gpu/tests/$binary-* test binary (run \`cargo xtask device-bundle\` and bring .gpu/ along)" >&2
        exit 2
    fi
    if [ -z "$(filters_of "$binary")" ]; then
        echo "sanitize: no filters for $binary (give it some, or leave it out of SANITIZE_BINARY)" >&2
        exit 2
    fi
done

{
    echo "# compute-sanitizer over ${executables[*]}, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    compute-sanitizer --version 2>&1 | grep -i version | head -n1 | sed 's/^/# /'
} | tee "$summary" > "$log"

# One number out of a run's log: the error count of the tool's summary.
error_count() {
    local tool=$1 file=$2
    local count=""
    if [ "$tool" = racecheck ]; then
        # ========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
        count=$(grep -oE 'RACECHECK SUMMARY: .*\(([0-9]+) errors?' "$file" | tail -n1 |
            grep -oE '\([0-9]+' | tr -d '(')
    fi
    if [ -z "$count" ]; then
        # ========= ERROR SUMMARY: 0 errors
        count=$(grep -oE 'ERROR SUMMARY: [0-9]+ errors?' "$file" | tail -n1 | grep -oE '[0-9]+')
    fi
    echo "$count"
}

failures=0
runs=0
run_log=$(mktemp)
trap 'rm -f "$run_log"' EXIT
for binary in "${binaries[@]}"; do
    gpu_tests=${executables[$binary]}
    mapfile -t filters < <(filters_of "$binary")
    echo "# $binary: $gpu_tests" | tee -a "$summary" >> "$log"
    for tool in "${tools[@]}"; do
        limit=$timeout_default
        [ "$tool" = racecheck ] && limit=$timeout_racecheck
        for filter in "${filters[@]}"; do
            started=$(date +%s)
            # --error-exitcode makes errors found visible in the exit code too; the timeout's kill
            # follows its TERM after 30 s if the sanitizer does not stop.
            timeout -k 30 "$limit" compute-sanitizer --tool "$tool" --error-exitcode 86 \
                "$gpu_tests" "$filter" > "$run_log" 2>&1
            code=$?
            seconds=$(($(date +%s) - started))
            {
                echo
                echo "##### $binary / $tool / $filter (limit ${limit} s): exit $code after ${seconds} s"
                cat "$run_log"
            } >> "$log"
            errors=$(error_count "$tool" "$run_log")
            result=$(grep -m1 '^test result:' "$run_log")
            warnings=""
            if [ "$tool" = racecheck ]; then
                w=$(grep -oE 'RACECHECK SUMMARY: .*, ([0-9]+) warnings?' "$run_log" | tail -n1 |
                    grep -oE '[0-9]+ warnings?' | grep -oE '[0-9]+')
                [ -n "$w" ] && warnings=" ($w warnings)"
            fi
            if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
                verdict="TIMEOUT after ${limit} s"
            elif [ -z "$errors" ]; then
                verdict="FAILED: no sanitizer summary"
            elif [ "$errors" -ne 0 ]; then
                verdict="ERRORS"
            elif [ -z "$result" ]; then
                verdict="FAILED: no test result line"
            elif grep -q 'skipped (no GPU)' <<< "$result"; then
                verdict="FAILED: the tests saw no GPU"
            elif ! grep -qE '^test result: [0-9]+ passed, 0 failed' <<< "$result"; then
                verdict="FAILED: a test failed"
            elif grep -qE '^test result: 0 passed' <<< "$result"; then
                verdict="FAILED: no test matched the filter"
            elif [ "$code" -ne 0 ]; then
                verdict="FAILED: exit $code"
            else
                verdict="ok"
            fi
            [ "$verdict" = ok ] || failures=$((failures + 1))
            runs=$((runs + 1))
            printf '%-17s %-9s %-20s errors %-15s exit %-3s %4s s  %-38s %s\n' \
                "$binary" "$tool" "$filter" "${errors:-?}$warnings" "$code" "$seconds" \
                "${result:-(no test result line)}" "$verdict" | tee -a "$summary"
        done
    done
done

if [ "$failures" -eq 0 ]; then
    echo "sanitize: all $runs runs clean" | tee -a "$summary"
else
    echo "sanitize: $failures of $runs runs not clean (full log: $log)" | tee -a "$summary"
    exit 1
fi
