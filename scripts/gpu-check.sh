#!/bin/bash
# One call on a machine with an NVIDIA GPU: build, run every test (GPU tests
# included), compute-sanitizer over the GPU tests, benchmarks, and a SASS
# check. Full logs are packed into $OUT/logs.tgz (default OUT: out/); a short
# summary prints last.
#   scripts/gpu-check.sh [STEP...]   steps: test sanitize bench sass layer profile
#                                    (default: test sanitize bench sass)
#   GPU_CHECK_TESTS="route align"    limit ctest to these test names (regex parts)
#   GPU_CHECK_BENCH="ops gemm"       which bench/moejit_bench_* programs to run
#   GPU_CHECK_ARGS_gemm="--path both"  extra arguments for one of them
#   GPU_CHECK_PRESETS="qwen3-30b-a3b"  presets of the layer and profile steps
#   GPU_CHECK_TOKENS=1,32,256,2048,16384  token counts of the layer step
#   GPU_CHECK_PROFILE_TOKENS=1,2048     token counts of the profile step (ncu
#                                    kernel durations of one graph replay)
set -uo pipefail
OUT=${OUT:-out}
LOGS=${GPU_CHECK_LOGS:-/tmp/gpu-check-logs}
mkdir -p "$OUT" "$LOGS"
[[ -f .gpu/env.sh ]] && source .gpu/env.sh
export PATH="/usr/local/cuda/bin:$PATH"
B=build-gpu
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(test sanitize bench sass)
want() { [[ " ${steps[*]} " == *" $1 "* ]]; }
summary=()
note() { summary+=("$*"); echo "== $*"; }
finish() {
  tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
  echo
  echo "================ summary ================"
  printf '%s\n' "${summary[@]}"
  for f in "$LOGS"/run-*.txt; do [[ -f $f ]] && { echo "--- $(basename "$f")"; grep -E '^ *[0-9]+ ' "$f" | tail -8; }; done
  for f in "$LOGS"/moejit_bench_*.txt; do [[ -f $f ]] && { echo "--- $(basename "$f")"; tail -40 "$f"; }; done
}
trap finish EXIT

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$LOGS/gpu.txt"
if ! cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1 ||
   ! cmake --build $B -j 16 >"$LOGS/build.log" 2>&1; then
  tail -60 "$LOGS/configure.log" "$LOGS/build.log"
  note "BUILD FAILED"
  exit 1
fi
note "build ok"
export MOEJIT_CACHE_DIR=$PWD/$B/gpu-cache

if want test; then
  filter=()
  [[ -n ${GPU_CHECK_TESTS:-} ]] && filter=(-R "$(echo "$GPU_CHECK_TESTS" | tr ' ' '|')")
  ctest --test-dir $B --output-on-failure -j 4 "${filter[@]}" >"$LOGS/ctest.log" 2>&1
  note "ctest: $(grep -E 'tests passed|tests failed' "$LOGS/ctest.log" | tail -1)"
  grep -E 'Failed|\*\*\*|Assertion|err [0-9]' "$LOGS/ctest.log" | head -30
fi

if want sanitize; then
  for t in ${GPU_CHECK_SANITIZE:-test_runtime test_route test_align test_combine test_gemm test_layer}; do
    [[ -x $B/tests/$t ]] || continue
    for tool in memcheck racecheck; do
      log="$LOGS/sanitize-$t-$tool.log"
      timeout "${GPU_CHECK_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --report-api-errors no --target-processes all --error-exitcode 9 \
        "$B/tests/$t" --jobs=1 >"$log" 2>&1
      rc=$?
      # a timeout ends the sanitizer, not its target: stop the test too, or it
      # keeps the GPU busy under whatever runs next (seen skewing benchmarks 2x)
      pkill -KILL -f "$B/tests/$t" 2>/dev/null
      note "compute-sanitizer $tool $t: rc=$rc $(grep -E 'ERROR SUMMARY' "$log" | sort | uniq -c | tr -s ' ' | head -3 | tr '\n' ' ')"
    done
  done
fi

if want bench; then
  for name in ${GPU_CHECK_BENCH:-ops gemm}; do
    b=$B/bench/moejit_bench_$name
    [[ -x $b ]] || continue
    args_var="GPU_CHECK_ARGS_$name"  # e.g. GPU_CHECK_ARGS_gemm="--path both"
    "$b" ${!args_var:-} >"$LOGS/moejit_bench_$name.txt" 2>&1
    note "moejit_bench_$name rc=$?"
  done
fi

presets=${GPU_CHECK_PRESETS:-qwen3-30b-a3b olmoe-1b-7b mixtral-8x7b deepseek-v3}
if want layer; then
  for p in $presets; do
    $B/moejit run --preset "$p" --tokens "${GPU_CHECK_TOKENS:-1,32,256,2048,16384}" \
      >"$LOGS/run-$p.txt" 2>&1
    note "moejit run $p rc=$?"
  done
fi

# Per-kernel durations (ncu, clocks left alone) of the layer's launches: the
# last replay of each kernel name at each T, so warm-ups and checks drop out.
if want profile; then
  for p in $presets; do
    for t in $(echo "${GPU_CHECK_PROFILE_TOKENS:-1,2048}" | tr ',' ' '); do
      log="$LOGS/profile-$p-T$t.csv"
      ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        $B/moejit run --preset "$p" --tokens "$t" --iters 1 >"$log" 2>&1
      note "profile $p T=$t rc=$? $(python3 scripts/ncu-summary.py "$log" | tr '\n' ';')"
    done
  done
fi

if want sass; then
  for fam in gemm1 gemm2; do
    n=$(grep -l "$fam" "$MOEJIT_CACHE_DIR"/*/*.mjc 2>/dev/null | head -1)
    [[ -n $n ]] || continue
    # the cubin follows the 88-byte entry header and metadata; cuobjdump finds the ELF itself
    cuobjdump --dump-sass "$n" >"$LOGS/sass-$fam.txt" 2>&1 ||
      { tail -c +1 "$n" | python3 -c 'import sys;d=sys.stdin.buffer.read();i=d.find(b"\x7fELF");open("/tmp/k.cubin","wb").write(d[i:])' &&
        cuobjdump --dump-sass /tmp/k.cubin >"$LOGS/sass-$fam.txt" 2>&1; }
    note "sass $fam: HGMMA=$(grep -c HGMMA "$LOGS/sass-$fam.txt") HMMA=$(grep -c HMMA "$LOGS/sass-$fam.txt")"
  done
fi
$B/moejit info >"$LOGS/info.txt" 2>&1; note "moejit info rc=$?"
