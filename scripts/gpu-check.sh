#!/bin/bash
# One call on a machine with an NVIDIA GPU: build, run every test (GPU tests
# included), compute-sanitizer over the GPU tests, benchmarks, and a SASS
# check. Logs go to $OUT (default: out/); a short summary prints last.
#   scripts/gpu-check.sh [quick]     quick: skip sanitizers and benchmarks
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
[[ -f .gpu/env.sh ]] && source .gpu/env.sh
export PATH="/usr/local/cuda/bin:$PATH"
B=build-gpu
summary=()
note() { summary+=("$*"); echo "== $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
if ! cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 ||
   ! cmake --build $B -j 16 >"$OUT/build.log" 2>&1; then
  tail -60 "$OUT/configure.log" "$OUT/build.log"
  echo "BUILD FAILED"
  exit 1
fi
note "build ok"

export MOEJIT_CACHE_DIR=$PWD/$B/gpu-cache
ctest --test-dir $B --output-on-failure -j 4 >"$OUT/ctest.log" 2>&1
note "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
grep -E '^\s*[0-9]+/[0-9]+ Test.*(Failed|\*\*\*)' "$OUT/ctest.log" | head -20

if [[ "${1:-}" != quick ]]; then
  for t in $B/tests/test_runtime $B/tests/test_route $B/tests/test_align $B/tests/test_combine; do
    [[ -x $t ]] || continue
    for tool in memcheck racecheck; do
      log="$OUT/sanitize-$(basename "$t")-$tool.log"
      compute-sanitizer --tool $tool --report-api-errors no --target-processes all --error-exitcode 9 "$t" --jobs=1 >"$log" 2>&1
      rc=$?
      note "compute-sanitizer $tool $(basename "$t"): rc=$rc $(grep -E 'ERROR SUMMARY' "$log" | sort | uniq -c | tr -s ' ' | head -3 | tr '\n' ' ')"
    done
  done
  for b in $B/bench/moejit_bench_ops; do
    [[ -x $b ]] && { "$b" >"$OUT/$(basename "$b").txt" 2>&1; note "$(basename "$b") rc=$?"; }
  done
  cub=$(ls "$MOEJIT_CACHE_DIR"/*/*.mjc 2>/dev/null | head -1)
fi
$B/moejit info >"$OUT/info.txt" 2>&1; note "moejit info rc=$?"
echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
for f in "$OUT"/moejit_bench_*.txt; do [[ -f $f ]] && tail -30 "$f"; done
