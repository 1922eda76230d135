#!/bin/bash
# On a machine with an NVIDIA GPU: re-tune the shipped sweep into a fresh
# table, then run every preset's layer on that table, and print both. Used
# to refresh configs/tuned/ (copy $OUT/tuned/*.yaml there) and the measured
# tables in docs/. Assumes build-gpu is built (scripts/gpu-check.sh).
#   scripts/gpu-retune.sh [SWEEP]   (default h100-presets)
set -uo pipefail
OUT=${OUT:-out}
B=build-gpu
sweep=${1:-h100-presets}
mkdir -p "$OUT/tuned" "$OUT/tune"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')
$B/moejit tune "$sweep" --out "$OUT/tuned/$gpu.yaml" --results /tmp/tune-results \
  >"$OUT/tune/tune.txt" 2>&1
echo "== moejit tune rc=$?"
cp /tmp/tune-results/results.csv /tmp/tune-results/chart.svg "$OUT/tune/" 2>/dev/null
for p in ${GPU_CHECK_PRESETS:-qwen3-30b-a3b olmoe-1b-7b mixtral-8x7b deepseek-v3}; do
  MOEJIT_TUNED_DIR=$OUT/tuned $B/moejit run --preset "$p" \
    --tokens "${GPU_CHECK_TOKENS:-1,32,256,2048,16384}" >/tmp/run-$p.txt 2>&1
  echo "== moejit run $p rc=$?"
  cat /tmp/run-$p.txt >>"$OUT/tune/runs.txt"
  grep -E '^ +[0-9]+ ' /tmp/run-$p.txt | sed "s/^/$p /"
done
