#!/bin/bash
# Runs each libFuzzer harness of a fuzz build in turn (2 cores: one at a time)
# and prints executions, coverage, corpus growth and crashes per harness.
#   tests/fuzz/run-fuzzers.sh BUILD_DIR SECONDS_PER_HARNESS [HARNESS...]
# `make fuzz FUZZ_MINUTES=N` calls it. New inputs go to BUILD_DIR/fuzz-corpus/
# (`make fuzz-merge` folds them into tests/fuzz/corpus/), crashing inputs to
# BUILD_DIR/fuzz-artifacts/, full logs to BUILD_DIR/fuzz-logs/. Exits 1 if
# any harness crashed.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: run-fuzzers.sh BUILD_DIR SECONDS [HARNESS...]}
seconds=${2:?usage: run-fuzzers.sh BUILD_DIR SECONDS [HARNESS...]}
shift 2
harnesses=("$@")
[[ ${#harnesses[@]} -eq 0 ]] && harnesses=(config cache_entry tuned_table)

# Extra seed folders per harness (read only; the corpus folder is first).
seeds_config=(tests/data/configs configs/models)
seeds_cache_entry=()
seeds_tuned_table=()

rows=()
crashed=0
for h in "${harnesses[@]}"; do
  bin=$build/tests/fuzz/fuzz_$h
  if [[ ! -x $bin ]]; then
    echo "run-fuzzers: $bin is missing (make fuzz builds it)" >&2
    exit 2
  fi
  work=$build/fuzz-corpus/$h art=$build/fuzz-artifacts/$h log=$build/fuzz-logs/$h.log
  mkdir -p "$work" "$art" "$(dirname "$log")"
  seeds_var="seeds_${h}[@]"
  dict=()
  [[ -f tests/fuzz/$h.dict ]] && dict=(-dict="tests/fuzz/$h.dict")
  before=$(find "$art" -type f | wc -l)
  echo "== fuzzing $h for ${seconds}s (log: $log)"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: ASan needs room
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" -max_total_time="$seconds" \
    -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$art/" "${dict[@]}" \
    "$work" "tests/fuzz/corpus/$h" "${!seeds_var}" >"$log" 2>&1
  rc=$?
  after=$(find "$art" -type f | wc -l)
  crashes=$((after - before))
  [[ $rc -ne 0 && $crashes -eq 0 ]] && crashes=1 # died without an artifact: count it
  execs=$(awk '/stat::number_of_executed_units/{print $2}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/{print $2}' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  corpus=$(find "$work" "tests/fuzz/corpus/$h" -type f | wc -l)
  rows+=("$(printf '%-12s %8s %12s %9s %9s %8s %8s' "$h" "$seconds" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "$corpus" "$crashes")")
  if ((crashes)); then
    crashed=1
    grep -E 'ERROR|runtime error|property failed|SUMMARY' "$log" | head -5
    ls -t "$art" | head -5 | sed "s|^|  artifact: $art/|"
  fi
done

echo
printf '%-12s %8s %12s %9s %9s %8s %8s\n' harness seconds executions exec/s coverage corpus crashes
printf '%s\n' "${rows[@]}"
if ((crashed)); then
  echo "replay one: $build/tests/fuzz/fuzz_HARNESS ARTIFACT; once fixed, copy it into tests/fuzz/corpus/HARNESS/"
  exit 1
fi
