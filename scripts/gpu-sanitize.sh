#!/bin/bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the GPU
# tests of every kernel family, on a machine with an NVIDIA GPU. Each run has
# a time limit and a test filter sized to stay near 2 minutes (racecheck gets
# the smallest shapes: it is slow on big GEMMs); a run that overstays is
# killed with its whole process tree (the sanitizer, the test runner and the
# test processes Criterion forks) before the next starts. Ends with a table:
# tool, binary, errors found, tests, time, status. Exit 1 if any run found
# errors, failed or timed out.
#
#   scripts/gpu-sanitize.sh BUILD_DIR [TOOL...]     tools: memcheck racecheck initcheck synccheck
#   GPU_SANITIZE_BINARIES="test_gemm test_layer"    which test binaries (default: all nine)
#   GPU_SANITIZE_TIMEOUT=120                        seconds per run
#   GPU_SANITIZE_FILTER_test_gemm_racecheck='gemm/routing_edge_cases'   override one filter
#   OUT=out                                         logs go to $OUT/sanitize/ (plus summary.txt)
# All four tools over all nine binaries take up to 36 x GPU_SANITIZE_TIMEOUT
# seconds: where a session has a time limit, run one or two tools per call.
set -uo pipefail
B=${1:?usage: scripts/gpu-sanitize.sh BUILD_DIR [memcheck racecheck initcheck synccheck]}
shift
tools=("$@")
[[ ${#tools[@]} -eq 0 ]] && tools=(memcheck racecheck initcheck synccheck)
read -r -a bins <<<"${GPU_SANITIZE_BINARIES:-test_runtime test_route test_router_logits test_align test_combine test_gemm test_layer test_badargs test_ep}"
limit=${GPU_SANITIZE_TIMEOUT:-120}
OUT=${OUT:-out}
LOGS=$OUT/sanitize
mkdir -p "$LOGS"
[[ -f .gpu/env.sh ]] && source .gpu/env.sh
export PATH="/usr/local/cuda/bin:$PATH"
export MOEJIT_CACHE_DIR=${MOEJIT_CACHE_DIR:-$PWD/$B/gpu-cache} # warm NVRTC cache across runs
if ! command -v compute-sanitizer >/dev/null; then
  echo "gpu-sanitize: compute-sanitizer not found (CUDA toolkit bin/ not on PATH)" >&2
  exit 2
fi

# Filters: Criterion globs with @(a|b) alternatives and !(a|b) exclusions.
# "full" serves memcheck, initcheck and synccheck; "race" serves racecheck.
filter_for() { # binary class
  case "$1:$2" in
    test_runtime:full) echo 'runtime_gpu/!(create_launch_destroy_cycles_leak_no_device_memory)' ;;
    test_runtime:race) echo 'runtime_gpu/@(nvrtc_cache_load_launch_gives_the_exact_answer|large_dynamic_shared_memory_is_opted_in)' ;;
    test_route:full) echo 'route_gpu/!(softmax_renormalized_grid|softmax_plain_grid)' ;;
    test_route:race) echo 'route_gpu/@(ties_go_to_the_lower_index|nan_and_inf_logits|bf16_logits)' ;;
    test_router_logits:full) echo 'router_logits/@(a_tokens_logits_do_not_depend_on_the_call|bad_arguments_are_refused_before_launching)' ;;
    test_router_logits:race) echo 'router_logits/a_tokens_logits_do_not_depend_on_the_call' ;;
    test_align:full) echo 'align_gpu/@(grid_of_experts_topk_and_tokens|expert_ranges_drop_the_other_experts|skewed_empty_and_invalid_ids|bad_arguments_are_refused_before_launching)' ;;
    test_align:race) echo 'align_gpu/@(expert_ranges_drop_the_other_experts|bad_arguments_are_refused_before_launching)' ;;
    test_combine:full) echo 'combine_gpu/!(preset_shapes_at_16384_tokens)' ;;
    test_combine:race) echo 'combine_gpu/every_dtype_pair_small_and_odd_sizes' ;;
    test_gemm:full) echo 'gemm/@(tile_configs_on_ragged_shape_bf16|fp16_and_simt_paths|routing_edge_cases|wgmma_cluster_pairs|wgmma_256_row_tiles_skip_empty_blocks|wgmma_rounds_in_step|argument_checks|tile_straddling_experts)' ;;
    test_gemm:race) echo 'gemm/@(routing_edge_cases|tile_straddling_experts|wgmma_cluster_pairs)' ;;
    test_layer:full) echo 'layer/@(olmoe_1b_7b_matches_reference|graph_replay_equals_eager_bitwise|capture_needs_a_real_stream|bad_arguments_are_refused_before_launching)' ;;
    test_layer:race) echo 'layer/@(capture_needs_a_real_stream|bad_arguments_are_refused_before_launching)' ;;
    test_badargs:full) echo 'badargs_gpu/*' ;;
    test_badargs:race) echo 'badargs_gpu/@(align_drops_ids_out_of_range|forward_with_nan_and_inf_logits_stays_finite)' ;;
    test_ep:full) echo 'ep/@(one_rank_small_is_bitwise_the_single_gpu_layer|bad_options_and_arguments_are_refused)' ;;
    test_ep:race) echo 'ep/one_rank_small_is_bitwise_the_single_gpu_layer' ;;
    *) echo '*' ;;
  esac
}

# Runs one sanitizer in its own session; on timeout kills the session.
# Sets rc, secs, timed_out.
run_one() { # tool binary filter log
  local tool=$1 bin=$2 filter=$3 log=$4 start pid
  start=$(date +%s)
  timed_out=0
  # a background job of a script is no group leader, so setsid execs in
  # place: pid is the new session's id, and everything below it inherits it
  setsid compute-sanitizer --tool "$tool" --target-processes all --report-api-errors no \
    --error-exitcode 9 "$B/tests/$bin" --jobs=1 --short-filename --filter "$filter" \
    >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if (($(date +%s) - start >= limit)); then
      timed_out=1
      kill -TERM -- "-$pid" 2>/dev/null
      sleep 3
      kill -KILL -- "-$pid" 2>/dev/null
      pkill -KILL -s "$pid" 2>/dev/null # strays that left the group, not the session
      break
    fi
    sleep 1
  done
  wait "$pid"
  rc=$?
  secs=$(($(date +%s) - start))
  if pgrep -s "$pid" >/dev/null 2>&1; then
    echo "gpu-sanitize: processes of session $pid survive; killing them" >&2
    pkill -KILL -s "$pid" 2>/dev/null
  fi
}

rows=()
bad=0
for tool in "${tools[@]}"; do
  case $tool in
    memcheck | initcheck | synccheck) class=full ;;
    racecheck) class=race ;;
    *) echo "gpu-sanitize: unknown tool '$tool'" >&2; exit 2 ;;
  esac
  for bin in "${bins[@]}"; do
    override="GPU_SANITIZE_FILTER_${bin}_${tool}"
    filter=${!override:-$(filter_for "$bin" "$class")}
    log=$LOGS/$tool-$bin.log
    if [[ ! -x $B/tests/$bin ]]; then
      rows+=("$(printf '%-10s %-13s %7s %-16s %6s  %s' "$tool" "$bin" - - - "MISSING (not built)")")
      bad=1
      continue
    fi
    echo "== $tool $bin --filter '$filter' (limit ${limit}s)"
    run_one "$tool" "$bin" "$filter" "$log"
    errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | awk '{s += $3} END {print s + 0}')
    synth=$(grep -E 'Synthesis: Tested' "$log" | tail -1)
    tested=$(sed -nE 's/.*Tested: ([0-9]+).*/\1/p' <<<"$synth")
    passing=$(sed -nE 's/.*Passing: ([0-9]+).*/\1/p' <<<"$synth")
    tests="${passing:-?}/${tested:-?} passed"
    if ((timed_out)); then
      status="TIMEOUT (killed)"
    elif ((errors > 0)); then
      status="ERRORS"
    elif ((rc != 0)); then
      status="FAIL (rc $rc)"
    elif [[ ${tested:-0} == 0 ]]; then
      status="NOTHING RAN (no GPU or no test matched)"
    else
      status=ok
    fi
    [[ $status != ok ]] && bad=1
    rows+=("$(printf '%-10s %-13s %7s %-16s %5ss  %s' "$tool" "$bin" "$errors" "$tests" "$secs" "$status")")
    [[ $status == ERRORS ]] && grep -m5 -E '^=+ +(Invalid|Race|Uninitialized|Barrier|ERROR)|^=+ .*(hazard|error)' "$log"
  done
done

{
  echo
  echo "compute-sanitizer over $B (logs: $LOGS/TOOL-BINARY.log)"
  printf '%-10s %-13s %7s %-16s %6s  %s\n' tool binary errors tests time status
  printf '%s\n' "${rows[@]}"
} | tee "$LOGS/summary.txt"
exit $bad
