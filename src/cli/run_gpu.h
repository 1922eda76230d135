/* The GPU half of `moejit run` (run_gpu.c): load twice, run, check, time,
 * print. cmd_run.c parses the options and handles the no-GPU case. */
#ifndef MOEJIT_CLI_RUN_GPU_H
#define MOEJIT_CLI_RUN_GPU_H

#include <stdint.h>

#include "moejit/moejit.h"

/* --ep-timeout's default, seconds */
#define RUN_EP_TIMEOUT_S 300

typedef struct run_args {
  const char *config, *preset, *cache_dir;
  int json, iters;
  int64_t tokens[16];
  int n_tokens;
  /* --ep N: expert parallelism over N ranks (run_ep.c); 0: one GPU */
  int ep, ep_rank, ep_device; /* ep_rank -1: launch all ranks here */
  const char *ep_id_file, *ep_route;
  /* --ep-timeout S: a rank gives up on an exchange that makes no progress
   * for this long (moejit_load_opts.ep.timeout_ms); 0: no limit */
  int ep_timeout_s, ep_timeout_given;
  /* --ep-nonblocking-comm: the ranks' communicator nonblocking
   * (moejit_load_opts.ep.nonblocking_comm) */
  int ep_nonblocking_comm;
  /* the floor's ceilings (--ceilings): dense GEMM TFLOP/s and read TB/s;
   * by default an H100's (RUN_CEIL_TFLOPS, RUN_CEIL_TBPS) */
  double ceil_tflops, ceil_tbps;
  int ceilings_given;
  /* --flush plain: the L2 flush before each timed run leaves the lines of
   * the evict_last policy in place (as a model's other kernels do) instead
   * of demoting them first */
  int flush_plain;
  /* --vs-heuristic: a second model, loaded with tuned tables off, checked
   * and timed (graph replay) beside the first */
  int vs_heuristic;
  /* --gate-weight: route from a random router weight (moejit_moe_args.
   * gate_weight) instead of given logits; the logits are checked too */
  int gate_weight;
  /* --tuned-table FILE: the layer is loaded with this tuned table instead
   * of the device's (moejit_load_opts.tuned_table) */
  const char *tuned_table;
  /* Set by `moejit tune --check-layer`: one load, of the spec run_on_gpu is
   * given (no cold load in a fresh ctx), nothing printed; each point's
   * times and check go here instead. */
  struct run_result *result;
} run_args;

/* One point of a run, for callers that set run_args.result. */
typedef struct run_point_result {
  int64_t tokens;
  int skipped, ok;          /* ok: the float64 check and graph == eager passed */
  double graph_ms, heur_ms; /* graph replay medians (heur_ms: --vs-heuristic) */
  char problem[256];
} run_point_result;

typedef struct run_result {
  int n;
  run_point_result points[16];
} run_result;

/* The H100 80GB HBM3's measured ceilings (dense bf16 cuBLAS GEMM, read-only
 * streaming): the floor's defaults, and the device they were measured on. */
#define RUN_CEIL_TFLOPS 750.0
#define RUN_CEIL_TBPS 3.0
#define RUN_CEIL_DEVICE "NVIDIA H100 80GB HBM3"

/* Monotonic clock, milliseconds. */
double run_now_ms(void);

/* Runs every token count of `a` on the first GPU; returns the exit code. */
int run_on_gpu(const run_args *a, const moejit_spec *spec);

/* `moejit run --ep N` (run_ep.c): launches the ranks, or runs one
 * (--ep-rank); argc/argv are the run command's own, for the ranks. */
int run_ep(const run_args *a, const moejit_spec *spec, int argc, char **argv);

#endif
