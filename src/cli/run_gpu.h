/* The GPU half of `moejit run` (run_gpu.c): load twice, run, check, time,
 * print. cmd_run.c parses the options and handles the no-GPU case. */
#ifndef MOEJIT_CLI_RUN_GPU_H
#define MOEJIT_CLI_RUN_GPU_H

#include <stdint.h>

#include "moejit/moejit.h"

typedef struct run_args {
  const char *config, *preset, *cache_dir;
  int json, iters;
  int64_t tokens[16];
  int n_tokens;
} run_args;

/* Monotonic clock, milliseconds. */
double run_now_ms(void);

/* Runs every token count of `a` on the first GPU; returns the exit code. */
int run_on_gpu(const run_args *a, const moejit_spec *spec);

#endif
