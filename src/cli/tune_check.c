/* `moejit tune --check-layer`: the tuner times each GEMM alone, but the
 * layer runs them after routing and align, with L2 holding what those left
 * and GEMM 1 gathering x rows, and a pick that wins alone can lose there;
 * the table's nearest bucket also serves token counts nobody timed. So
 * each model's layer runs with the new table and with tables off at the
 * sweep's token counts and between each two, and where the table's is the
 * slower by more than the tolerance in two runs, the heuristic's plan is
 * pinned in the table at that T. See tune_check.h and docs/tune.md. */
#include "cli/tune_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_gpu.h"

static const char *const kKept = "kept";
static const char *const kAgain = "slower: run again";
static const char *const kNoise = "kept: faster in the second run";
static const char *const kPinned = "pinned to the heuristic";
static const char *const kSame = "slower, but it runs the heuristic's plans already";
static const char *const kFailed = "check failed";
static const char *const kSkipped = "not run: its buffers do not fit the GPU";

static int cmp_i64(const void *x, const void *y) {
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return a < b ? -1 : a > b;
}

/* Adds T to the set t[*n] (at most CHECK_MAX_BUCKETS). */
static void add_token(int64_t *t, int *n, int64_t tokens) {
  for (int j = 0; j < *n; j++)
    if (t[j] == tokens) return;
  if (*n < CHECK_MAX_BUCKETS) t[(*n)++] = tokens;
}

static check_point *new_point(check_shape *sh, int64_t tokens, int bucket) {
  check_point *p = &sh->p[sh->n++];
  memset(p, 0, sizeof *p);
  p->tokens = tokens, p->bucket = bucket, p->action = kKept;
  return p;
}

/* The token counts for `shape` (the winners' in s, else the sweep's),
 * ascending, and c->between points between each two (evenly spaced in log
 * scale; one: their geometric mean), where the table's nearest bucket
 * serves a T it was not timed at. */
static void plan_points(check_shape *sh, const tune_check *c, const moejit_tune_summary *s) {
  int64_t t[CHECK_MAX_BUCKETS];
  int n = 0;
  for (size_t i = 0; s && i < s->n_winners; i++)
    if (!strcmp(s->winners[i].shape, sh->spec.name)) add_token(t, &n, s->winners[i].tokens);
  for (int i = 0; !s && i < c->n_tokens; i++) add_token(t, &n, c->tokens[i]);
  qsort(t, (size_t)n, sizeof t[0], cmp_i64);
  sh->n = 0;
  for (int i = 0; i < n; i++) {
    new_point(sh, t[i], 1);
    int64_t last = t[i];
    for (int j = 1; i + 1 < n && j <= c->between; j++) {
      const double f = (double)j / (c->between + 1);
      const int64_t m = llround(exp((1 - f) * log((double)t[i]) + f * log((double)t[i + 1])));
      if (m > last && m < t[i + 1]) new_point(sh, last = m, 0);
    }
  }
}

static int wanted(const check_point *p, check_run k) {
  if (k == CHECK_FIRST) return 1;
  if (p->problem[0]) return 0;
  return k == CHECK_AGAIN ? p->action == kAgain : p->pinned[0] || p->pinned[1];
}

/* Runs the layer (the table's and tables off, interleaved) at the points
 * `k` wants, 16 at a time, and files each point's medians. */
static int run_layer(tune_check *c, check_shape *sh, check_run k) {
  int idx[CHECK_MAX_POINTS], n = 0;
  for (int i = 0; i < sh->n; i++)
    if (wanted(&sh->p[i], k)) idx[n++] = i;
  int rc = 0;
  for (int first = 0; first < n && !rc; first += 16) {
    run_result res;
    memset(&res, 0, sizeof res);
    run_args a = {.config = sh->spec.name,
                  .iters = c->iters,
                  .ep_rank = -1,
                  .ep_device = -1,
                  .ceil_tflops = RUN_CEIL_TFLOPS,
                  .ceil_tbps = RUN_CEIL_TBPS,
                  .vs_heuristic = 1,
                  .tuned_table = c->table,
                  .result = &res};
    for (int j = first; j < n && j < first + 16; j++) a.tokens[a.n_tokens++] = sh->p[idx[j]].tokens;
    if ((rc = run_on_gpu(&a, &sh->spec))) break;
    for (int j = 0; j < res.n; j++) {
      check_point *p = &sh->p[idx[first + j]];
      const run_point_result *r = &res.points[j];
      if (r->skipped) { /* not run again */
        p->action = kSkipped;
        snprintf(p->problem, sizeof p->problem, "skipped");
        continue;
      }
      if (!r->ok) {
        snprintf(p->problem, sizeof p->problem, "%s", r->problem);
        p->action = kFailed;
        c->failed = 1;
        continue;
      }
      p->tuned_ms[k] = r->graph_ms, p->heur_ms[k] = r->heur_ms;
    }
  }
  return rc;
}

static int slower(const tune_check *c, double tuned, double heur) {
  return tuned > heur * (1 + c->tolerance_pct / 100);
}

/* The GEMM's time alone under the heuristic at T, where the sweep timed
 * it (the pinned entry's us), else 0. */
static double heuristic_us(const moejit_tune_summary *s, const char *shape, int which, int64_t t) {
  for (size_t i = 0; s && i < s->n_winners; i++) {
    const moejit_tune_winner *w = &s->winners[i];
    if (!strcmp(w->shape, shape) && w->tokens == t && w->kernel[4] - '0' == which)
      return w->heuristic_us;
  }
  return 0;
}

/* Pins both GEMMs at each point slower in both runs; 0 or an exit code. */
static int pin_losers(tune_check *c, check_shape *sh, const moejit_tune_summary *s) {
  int rc = 0;
  for (int i = 0; i < sh->n && !rc; i++) {
    check_point *p = &sh->p[i];
    if (p->action != kAgain || p->problem[0]) continue;
    if (!slower(c, p->tuned_ms[CHECK_AGAIN], p->heur_ms[CHECK_AGAIN])) {
      p->action = kNoise;
      continue;
    }
    p->action = kPinned;
    for (int which = 1; which <= 2; which++) {
      moejit_status st = moejit_tuned_table_pin_heuristic(
          c->table, &sh->spec, which, p->tokens, heuristic_us(s, sh->spec.name, which, p->tokens),
          NULL, NULL, &p->pinned[which - 1]);
      if (st) {
        snprintf(c->error, sizeof c->error, "pinning %s gemm%d at T=%lld: %s", sh->spec.name, which,
                 (long long)p->tokens, moejit_last_error());
        c->failed = 1;
        return cli_fail(st, "--check-layer");
      }
    }
    if (!p->pinned[0] && !p->pinned[1]) p->action = kSame;
  }
  return rc;
}

static int check_shape_layer(tune_check *c, check_shape *sh, const moejit_tune_summary *s) {
  plan_points(sh, c, s);
  if (!sh->n) {
    snprintf(sh->skipped, sizeof sh->skipped, "no winners in this run");
    return 0;
  }
  int rc = run_layer(c, sh, CHECK_FIRST);
  for (int i = 0; i < sh->n && !rc; i++) /* marked for the confirming run */
    if (!sh->p[i].problem[0] &&
        slower(c, sh->p[i].tuned_ms[CHECK_FIRST], sh->p[i].heur_ms[CHECK_FIRST]))
      sh->p[i].action = kAgain;
  if (!rc) rc = run_layer(c, sh, CHECK_AGAIN);
  if (!rc) rc = pin_losers(c, sh, s);
  if (!rc) rc = run_layer(c, sh, CHECK_FINAL);
  return rc;
}

int tune_check_layer(tune_check *c, const moejit_tune_summary *s, const moejit_sweep *sweep) {
  const size_t n = moejit_sweep_shape_specs(sweep, NULL, 0);
  c->shapes = calloc(n ? n : 1, sizeof *c->shapes);
  moejit_spec *specs = calloc(n ? n : 1, sizeof *specs);
  if (!c->shapes || !specs) {
    free(specs);
    return cli_fail(MOEJIT_ERR_OUT_OF_MEMORY, "--check-layer");
  }
  moejit_sweep_shape_specs(sweep, specs, n);
  for (size_t i = 0; i < n; i++) {
    check_shape *sh = &c->shapes[c->n_shapes++];
    memset(sh, 0, sizeof *sh);
    sh->spec = specs[i];
    sh->spec.n_archs = 1; /* the layer runs on the GPU at hand */
    snprintf(sh->spec.archs[0], sizeof sh->spec.archs[0], "auto");
  }
  free(specs);
  for (int i = 0; i < c->n_shapes; i++) {
    check_shape *sh = &c->shapes[i];
    fprintf(stderr, "layer check: %s\n", sh->spec.name);
    int rc = check_shape_layer(c, sh, s);
    if (rc) return rc;
  }
  return 0;
}

static double ratio(double heur, double tuned) {
  return tuned > 0 ? heur / tuned : 0;
}

void tune_check_print_text(const tune_check *c) {
  printf(
      "\nlayer check (moejit run --tuned-table %s --vs-heuristic, graph replay from a cold L2, "
      "median of %d, interleaved; tolerance %g%%):\n",
      c->table, c->iters, c->tolerance_pct);
  printf("%-16s %7s %-7s %9s %9s %8s  %s\n", "shape", "T", "point", "tuned ms", "heur ms",
         "vs heur", "action");
  for (int i = 0; i < c->n_shapes; i++) {
    const check_shape *sh = &c->shapes[i];
    if (sh->skipped[0]) {
      printf("%-16s skipped: %s\n", sh->spec.name, sh->skipped);
      continue;
    }
    for (int j = 0; j < sh->n; j++) {
      const check_point *p = &sh->p[j];
      printf("%-16s %7lld %-7s %9.4f %9.4f %7.3fx  %s", sh->spec.name, (long long)p->tokens,
             p->bucket ? "bucket" : "between", p->tuned_ms[CHECK_FIRST], p->heur_ms[CHECK_FIRST],
             ratio(p->heur_ms[CHECK_FIRST], p->tuned_ms[CHECK_FIRST]), p->action);
      if (p->tuned_ms[CHECK_AGAIN] > 0)
        printf(" (again %.3fx)", ratio(p->heur_ms[CHECK_AGAIN], p->tuned_ms[CHECK_AGAIN]));
      if (p->pinned[0] || p->pinned[1])
        printf(": gemm%s; now %.4f / %.4f ms, %.3fx",
               p->pinned[0] && p->pinned[1] ? "1 and gemm2"
               : p->pinned[0]               ? "1"
                                            : "2",
               p->tuned_ms[CHECK_FINAL], p->heur_ms[CHECK_FINAL],
               ratio(p->heur_ms[CHECK_FINAL], p->tuned_ms[CHECK_FINAL]));
      if (p->problem[0] && p->action == kFailed) printf(": %s", p->problem);
      printf("\n");
    }
  }
  printf(
      "vs heur = tables-off ms / tuned ms (below 1: the table's choice ran the layer slower). "
      "A point slower by more than the tolerance is run again; slower again, the table holds "
      "the heuristic's plan there for both GEMMs (us 0 where the GEMM was not timed alone).\n");
}

void tune_check_print_json(const tune_check *c) {
  printf("{\"table\":");
  cli_json_str(stdout, c->table);
  printf(",\"iters\":%d,\"tolerance_pct\":%g,\"failed\":%s,\"shapes\":[", c->iters,
         c->tolerance_pct, c->failed ? "true" : "false");
  for (int i = 0; i < c->n_shapes; i++) {
    const check_shape *sh = &c->shapes[i];
    printf("%s{\"shape\":", i ? "," : "");
    cli_json_str(stdout, sh->spec.name);
    printf(",\"skipped\":");
    cli_json_str(stdout, sh->skipped);
    printf(",\"points\":[");
    for (int j = 0; j < sh->n; j++) {
      const check_point *p = &sh->p[j];
      printf(
          "%s{\"tokens\":%lld,\"bucket\":%s,\"tuned_ms\":%.6f,\"heuristic_ms\":%.6f,"
          "\"again_tuned_ms\":%.6f,\"again_heuristic_ms\":%.6f,\"pinned_gemm1\":%s,"
          "\"pinned_gemm2\":%s,\"final_tuned_ms\":%.6f,\"final_heuristic_ms\":%.6f,\"action\":",
          j ? "," : "", (long long)p->tokens, p->bucket ? "true" : "false",
          p->tuned_ms[CHECK_FIRST], p->heur_ms[CHECK_FIRST], p->tuned_ms[CHECK_AGAIN],
          p->heur_ms[CHECK_AGAIN], p->pinned[0] ? "true" : "false", p->pinned[1] ? "true" : "false",
          p->tuned_ms[CHECK_FINAL], p->heur_ms[CHECK_FINAL]);
      cli_json_str(stdout, p->action);
      printf(",\"problem\":");
      cli_json_str(stdout, p->problem);
      printf("}");
    }
    printf("]}");
  }
  printf("],\"error\":");
  cli_json_str(stdout, c->error);
  printf("}");
}

void tune_check_free(tune_check *c) {
  free(c->shapes);
  c->shapes = NULL;
  c->n_shapes = 0;
}
