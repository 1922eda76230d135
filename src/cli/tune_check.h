/* `moejit tune --check-layer` (tune_check.c): after a sweep has written its
 * tuned table, each tuned model's whole layer runs with that table and
 * with tables off, graph-replayed and interleaved (run_gpu.c), at the
 * sweep's token counts and between them; where the table's layer is slower
 * by more than the tolerance in two runs, the table is pinned to the
 * heuristic there (moejit_tuned_table_pin_heuristic). docs/tune.md. */
#ifndef MOEJIT_CLI_TUNE_CHECK_H
#define MOEJIT_CLI_TUNE_CHECK_H

#include <stdint.h>

#include "moejit/moejit.h"

#define CHECK_MAX_BUCKETS 32
#define CHECK_MAX_BETWEEN 7 /* points between two buckets (--check-between) */
#define CHECK_MAX_POINTS (CHECK_MAX_BUCKETS + (CHECK_MAX_BUCKETS - 1) * CHECK_MAX_BETWEEN)

/* The check's runs of a point: every point, the slower ones again, the
 * pinned ones after their pin. */
typedef enum { CHECK_FIRST, CHECK_AGAIN, CHECK_FINAL, CHECK_RUNS } check_run;

typedef struct check_point {
  int64_t tokens;
  int bucket; /* 1: a token count of the sweep; 0: between two of them */
  /* graph replay medians, ms, per run (check_run): the first, the
   * confirming one (only where the first was slower than the tolerance) and
   * the one after pinning (only where something was pinned); 0 where not
   * run */
  double tuned_ms[CHECK_RUNS], heur_ms[CHECK_RUNS];
  int pinned[2]; /* gemm1, gemm2: the pin changed the table's choice */
  const char *action;
  char problem[320];
} check_point;

typedef struct check_shape {
  moejit_spec spec;   /* the layer's, named as the shape: a sweep shape's or a --model config's */
  char skipped[160];  /* why this shape was not checked, or "" */
  int n;
  check_point p[CHECK_MAX_POINTS];
} check_shape;

typedef struct tune_check {
  const char *table; /* the tuned table the sweep wrote (or --check-only's) */
  /* --check-only: the sweep's token counts, the buckets checked (with a
   * summary, its winners' token counts are) */
  const int64_t *tokens;
  int n_tokens;
  int iters;
  int between; /* points between two buckets, 1..CHECK_MAX_BETWEEN */
  double tolerance_pct;
  check_shape *shapes;
  int n_shapes;
  int failed; /* a layer check (float64, graph == eager) or a pin failed */
  char error[512];
} tune_check;

/* Checks the layer of each of the sweep's shapes (its own, or --model's
 * configs after moejit_sweep_set_shapes; moejit_sweep_shape_specs) at the
 * winners' token counts in s (s NULL: c->tokens), pins where the table
 * loses. Returns 0, or an exit code after a failure that stopped it
 * (printed). */
int tune_check_layer(tune_check *c, const moejit_tune_summary *s, const moejit_sweep *sweep);
void tune_check_print_text(const tune_check *c);
void tune_check_print_json(const tune_check *c); /* a JSON value, no newline */
void tune_check_free(tune_check *c);

#endif
