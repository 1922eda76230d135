/* The autotuner's engine: plan -> result rows (resumed from an earlier
 * results.csv) -> parallel compile of every tile config through the cache
 * -> per (shape, kernel, T) group: inputs, reference, the heuristic and
 * every candidate measured through the backend -> winners -> results files
 * and the tuned table. The GPU work itself lives behind mj_tune_backend. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/gemm.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

typedef struct unit {
  int shape, which;
  moejit_gemm_cfg cfg;
  moejit_status st;
  int cache_hit;
  char msg[192];
} unit;

typedef struct run {
  const moejit_sweep *sw;
  const moejit_tune_opts *o;
  const mj_tune_backend *be;
  moejit_tune_summary *sum;
  mj_tune_plan plan;
  mj_tune_rows rows, old;
  unsigned char *old_used;
  unit *units;
  size_t n_units;
  int *cand_unit;       /* per plan candidate */
  int *heur_unit;       /* per (shape, kernel): shape * 2 + which - 1 */
  unsigned char *tuned; /* same index: 1 when the plan has candidates there */
  double t0;
  char date[16], results_dir[MOEJIT_PATH_MAX];
  pthread_mutex_t lock;
  size_t compile_done;
  size_t time_done, time_total;
  int dead;
  mj_tuned_table prior; /* the table the winners merge into, as it was (may be empty) */
} run;

static double now_ms(const run *r) {
  return r->be->now_ms ? r->be->now_ms(r->be->state) : mj_now_ms();
}

static double elapsed_s(const run *r) {
  return (now_ms(r) - r->t0) / 1e3;
}

static void report(const run *r, moejit_tune_phase ph, size_t done, size_t total, const char *item,
                   const char *status, double us, double hus, const char *msg) {
  if (!r->o->progress) return;
  moejit_tune_progress p = {
      ph, done, total,         elapsed_s(r), item ? item : "", status ? status : "",
      us, hus,  msg ? msg : ""};
  r->o->progress(&p, r->o->progress_user);
}

/* First line of the calling thread's last error, for a results field. */
static void last_error_line(char *buf, size_t cap) {
  mj_strlcpy(buf, moejit_last_error(), cap);
  buf[strcspn(buf, "\n")] = '\0';
}

/* ---- rows ------------------------------------------------------------------ */

static void row_init(const run *r, int shape, int which, int t, mj_tune_row *row) {
  const mj_sweep_shape *sh = &r->sw->shapes[shape];
  memset(row, 0, sizeof *row);
  mj_strlcpy(row->device, r->be->device, sizeof row->device);
  mj_strlcpy(row->arch, r->be->arch, sizeof row->arch);
  mj_strlcpy(row->shape, sh->name, sizeof row->shape);
  mj_strlcpy(row->date, r->date, sizeof row->date);
  row->which = which;
  row->dtype = sh->spec.act_dtype;
  row->hidden = sh->spec.hidden, row->expert_width = sh->spec.expert_width;
  row->experts = sh->spec.experts, row->top_k = sh->spec.top_k;
  row->tokens = sh->tokens[t];
  row->t_index = t;
  row->cand = -1;
}

/* Per (shape, kernel, T): the heuristic row, then each candidate's. */
static moejit_status build_rows(run *r) {
  moejit_status st = MOEJIT_OK;
  for (size_t c = 0; c < r->plan.n; c++)
    r->tuned[r->plan.cands[c].shape * 2 + r->plan.cands[c].which - 1] = 1;
  for (int s = 0; s < r->sw->n_shapes; s++)
    for (int which = 1; which <= 2; which++) {
      if (!r->tuned[s * 2 + which - 1]) continue;
      const mj_sweep_shape *sh = &r->sw->shapes[s];
      for (int t = 0; t < sh->n_tokens && !st; t++) {
        mj_tune_row row;
        row_init(r, s, which, t, &row);
        row.role = MJ_ROLE_HEURISTIC, row.path = MOEJIT_GEMM_PATH_AUTO;
        row.cfg = which == 1 ? sh->spec.gemm1 : sh->spec.gemm2;
        st = mj_tune_rows_push(&r->rows, &row);
        for (size_t c = 0; c < r->plan.n && !st; c++) {
          const mj_tune_cand *cd = &r->plan.cands[c];
          if (cd->shape != s || cd->which != which || !(cd->tmask & (1u << t))) continue;
          row_init(r, s, which, t, &row);
          row.path = cd->path, row.cfg = cd->cfg, row.cand = (int)c;
          if (cd->pruned)
            row.status = MJ_TS_PRUNED, mj_strlcpy(row.reason, cd->reason, sizeof row.reason);
          st = mj_tune_rows_push(&r->rows, &row);
        }
      }
    }
  return st;
}

static uint64_t row_hash(const mj_tune_row *x) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = x->device; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  const int64_t v[] = {x->which,         x->dtype,       x->hidden,     x->expert_width,
                       x->experts,       x->top_k,       x->tokens,     x->role,
                       x->path,          x->cfg.tile_m,  x->cfg.tile_n, x->cfg.tile_k,
                       x->cfg.stages,    x->cfg.warps,   x->cfg.raster, x->cfg.cluster_m,
                       x->cfg.cluster_n, x->cfg.schedule};
  for (size_t i = 0; i < MJ_ARRAY_LEN(v); i++) h = mj_tune_mix(h, (uint64_t)v[i]);
  return h;
}

typedef struct hashed {
  uint64_t h;
  size_t i;
} hashed;

static int cmp_hashed(const void *a, const void *b) {
  uint64_t x = ((const hashed *)a)->h, y = ((const hashed *)b)->h;
  return (x > y) - (x < y);
}

static int base_spec(const run *r, const mj_tune_row *row, moejit_spec *base);

/* A heuristic row names AUTO, not what AUTO resolves to, so an earlier
 * run's time goes stale when AUTO changes (it took the GEMV kernel at
 * decode; MOEJIT_GEMM_GEMV / _WGMMA in the environment). It is kept only
 * when the explicit twin AUTO resolves to now (a candidate of the same
 * group) was resumed too; else it is timed again beside that twin, so the
 * winner rule (the heuristic's time for its twin's plan) compares like
 * with like. Rows are grouped: the heuristic row, then its candidates. */
static void drop_stale_heuristics(run *r) {
  for (size_t i = 0; i < r->rows.n; i++) {
    mj_tune_row *h = &r->rows.rows[i];
    if (h->role != MJ_ROLE_HEURISTIC || h->status == MJ_TS_PENDING) continue;
    moejit_spec base;
    moejit_gemm_cfg cfg;
    moejit_gemm_path path;
    base_spec(r, h, &base);
    if (!mj_tune_heuristic_tile(&base, h->which, h->tokens * h->top_k, r->be->arch, &cfg, &path))
      continue;
    for (size_t j = i + 1; j < r->rows.n && r->rows.rows[j].role != MJ_ROLE_HEURISTIC; j++) {
      const mj_tune_row *twin = &r->rows.rows[j];
      if (twin->path != path || memcmp(&twin->cfg, &cfg, sizeof cfg) != 0) continue;
      if (twin->status == MJ_TS_PENDING) {
        h->status = MJ_TS_PENDING;
        h->us = h->tflops = h->gbs = h->rel_err = 0, h->iters = 0;
        h->reason[0] = '\0';
        mj_strlcpy(h->date, r->date, sizeof h->date);
        h->resumed = 0;
        r->sum->resumed--;
      }
      break;
    }
  }
}

/* Rows an earlier run measured on this device (ok or wrong) are taken as
 * they are; any old row naming a current one is superseded (not carried).
 * A heuristic row whose AUTO now resolves to a launch not measured before
 * is timed again (drop_stale_heuristics). */
static moejit_status resume(run *r) {
  hashed *idx = malloc((r->old.n ? r->old.n : 1) * sizeof *idx);
  r->old_used = calloc(r->old.n ? r->old.n : 1, 1);
  if (!idx || !r->old_used) {
    free(idx);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory resuming results");
  }
  for (size_t i = 0; i < r->old.n; i++) idx[i] = (hashed){row_hash(&r->old.rows[i]), i};
  qsort(idx, r->old.n, sizeof *idx, cmp_hashed);
  for (size_t i = 0; i < r->rows.n; i++) {
    mj_tune_row *row = &r->rows.rows[i];
    uint64_t h = row_hash(row);
    size_t lo = 0, hi = r->old.n;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (idx[mid].h < h)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (; lo < r->old.n && idx[lo].h == h; lo++) {
      mj_tune_row *old = &r->old.rows[idx[lo].i];
      if (!mj_tune_row_same(old, row)) continue;
      r->old_used[idx[lo].i] = 1;
      if (row->status != MJ_TS_PENDING || (old->status != MJ_TS_OK && old->status != MJ_TS_WRONG))
        continue;
      /* judged again by this sweep's tolerance, which may have changed: a
       * row found wrong before (never timed) that passes now is timed */
      const int passes = old->rel_err <= r->sw->tolerance; /* NaN: fails */
      if (passes && old->status == MJ_TS_WRONG) continue;
      row->status = passes ? MJ_TS_OK : MJ_TS_WRONG;
      row->us = old->us, row->tflops = old->tflops, row->gbs = old->gbs;
      row->rel_err = old->rel_err, row->iters = old->iters, row->copy_us = old->copy_us;
      mj_strlcpy(row->date, old->date, sizeof row->date);
      mj_strlcpy(row->reason, old->reason, sizeof row->reason);
      if (!passes && old->status == MJ_TS_OK)
        snprintf(row->reason, sizeof row->reason,
                 "relative error %.3g on the sampled rows > tolerance %g", old->rel_err,
                 r->sw->tolerance);
      row->resumed = 1;
      r->sum->resumed++;
    }
  }
  free(idx);
  drop_stale_heuristics(r);
  return MOEJIT_OK;
}

/* ---- compile ---------------------------------------------------------------- */

static int unit_for(run *r, int shape, int which, const moejit_gemm_cfg *cfg) {
  for (size_t u = 0; u < r->n_units; u++)
    if (r->units[u].shape == shape && r->units[u].which == which &&
        !memcmp(&r->units[u].cfg, cfg, sizeof *cfg))
      return (int)u;
  r->units[r->n_units] = (unit){shape, which, *cfg, MOEJIT_OK, 0, ""};
  return (int)r->n_units++;
}

/* A unit per distinct tile config that has rows left to time (a config's
 * module holds the mma, wgmma and gemv entries all). */
static moejit_status make_units(run *r) {
  size_t pairs = (size_t)r->sw->n_shapes * 2;
  r->units = calloc(r->plan.n + pairs + 1, sizeof *r->units);
  r->cand_unit = malloc((r->plan.n + 1) * sizeof *r->cand_unit);
  r->heur_unit = malloc(pairs * sizeof *r->heur_unit);
  if (!r->units || !r->cand_unit || !r->heur_unit)
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory planning compiles");
  for (size_t c = 0; c < r->plan.n; c++) r->cand_unit[c] = -1;
  for (size_t i = 0; i < pairs; i++) r->heur_unit[i] = -1;
  for (size_t i = 0; i < r->rows.n; i++) {
    const mj_tune_row *row = &r->rows.rows[i];
    if (row->status != MJ_TS_PENDING) continue;
    int shape = row->cand >= 0 ? r->plan.cands[row->cand].shape : -1;
    if (row->cand >= 0 && r->cand_unit[row->cand] < 0)
      r->cand_unit[row->cand] = unit_for(r, shape, row->which, &row->cfg);
    for (int s = 0; row->cand < 0 && s < r->sw->n_shapes; s++)
      if (!strcmp(r->sw->shapes[s].name, row->shape) && r->heur_unit[s * 2 + row->which - 1] < 0)
        r->heur_unit[s * 2 + row->which - 1] = unit_for(r, s, row->which, &row->cfg);
  }
  return MOEJIT_OK;
}

static void compile_one(size_t i, void *arg) {
  run *r = arg;
  unit *u = &r->units[i];
  moejit_spec spec;
  mj_tune_cand_spec(r->sw, u->shape, u->which, &u->cfg, r->be->arch, &spec);
  u->st = r->be->compile(r->be->state, &spec, u->which == 1 ? "gemm1" : "gemm2", &u->cache_hit);
  if (u->st) last_error_line(u->msg, sizeof u->msg);
  char item[192], cfg[64];
  moejit_gemm_cfg_text(&u->cfg, cfg, sizeof cfg);
  snprintf(item, sizeof item, "%s gemm%d %s", r->sw->shapes[u->shape].name, u->which, cfg);
  pthread_mutex_lock(&r->lock);
  r->compile_done++;
  report(r, MOEJIT_TUNE_PHASE_COMPILE, r->compile_done, r->n_units, item,
         u->st          ? "compile-failed"
         : u->cache_hit ? "cache-hit"
                        : "compiled",
         0, 0, u->msg);
  pthread_mutex_unlock(&r->lock);
}

static void compile_all(run *r) {
  moejit_tune_summary *sum = r->sum;
  int jobs = r->o->jobs > 0 ? r->o->jobs : mj_online_cpus();
  double t = now_ms(r);
  mj_parallel_for(r->n_units, jobs, compile_one, r);
  sum->compile_s = (now_ms(r) - t) / 1e3;
  sum->jobs = jobs;
  sum->kernels = r->n_units;
  for (size_t u = 0; u < r->n_units; u++) {
    sum->cache_hits += !r->units[u].st && r->units[u].cache_hit;
    sum->compiled += !r->units[u].st && !r->units[u].cache_hit;
    sum->compile_failed += r->units[u].st != MOEJIT_OK;
  }
  if (sum->compile_s > 0) {
    sum->kernels_per_s = (double)sum->kernels / sum->compile_s;
    sum->compiled_per_s = (double)sum->compiled / sum->compile_s;
  }
  for (size_t i = 0; i < r->rows.n; i++) { /* a failed unit fails its rows */
    mj_tune_row *row = &r->rows.rows[i];
    if (row->status != MJ_TS_PENDING) continue;
    int u = row->cand >= 0 ? r->cand_unit[row->cand] : -1;
    for (int s = 0; row->cand < 0 && s < r->sw->n_shapes; s++)
      if (!strcmp(r->sw->shapes[s].name, row->shape)) u = r->heur_unit[s * 2 + row->which - 1];
    if (u >= 0 && r->units[u].st) {
      row->status = MJ_TS_COMPILE_FAILED;
      mj_strlcpy(row->reason, r->units[u].msg, sizeof row->reason);
    }
  }
}

/* ---- timing ------------------------------------------------------------------ */

static void row_item(const mj_tune_row *row, char *buf, size_t cap) {
  char cfg[64];
  moejit_gemm_cfg_text(&row->cfg, cfg, sizeof cfg);
  snprintf(buf, cap, "%s gemm%d T=%lld %s %s%s", row->shape, row->which, (long long)row->tokens,
           moejit_gemm_path_name(row->path), cfg,
           row->role == MJ_ROLE_HEURISTIC ? " (heuristic)" : "");
}

static void set_rates(mj_tune_row *row, const mj_tune_group *g) {
  double m = (double)g->rows, d = (double)row->hidden, f = (double)row->expert_width;
  double esz = (double)moejit_dtype_size(row->dtype);
  double flops = (row->which == 1 ? 4 : 2) * m * d * f;
  double w = (double)g->active_experts * (row->which == 1 ? 2 : 1) * d * f * esz;
  double bytes = w + m * (row->which == 1 ? d + f : f + d) * esz;
  row->tflops = flops / (row->us * 1e-6) / 1e12;
  row->gbs = bytes / (row->us * 1e-6) / 1e9;
}

static void measure_row(run *r, const mj_tune_group *g, mj_tune_row *row) {
  moejit_spec spec;
  moejit_gemm_path path = row->role == MJ_ROLE_HEURISTIC ? MOEJIT_GEMM_PATH_AUTO : row->path;
  mj_tune_cand_spec(r->sw, g->shape, g->which, &row->cfg, r->be->arch, &spec);
  mj_tune_measurement m = {0};
  moejit_status st = r->be->measure(r->be->state, g, &spec, path, &m);
  row->rel_err = m.rel_err;
  if (st) {
    row->status = MJ_TS_FAILED;
    last_error_line(row->reason, sizeof row->reason);
    r->sum->failed++;
    if (r->be->alive && !r->be->alive(r->be->state)) {
      r->dead = 1;
      snprintf(r->sum->stop_reason, sizeof r->sum->stop_reason,
               "the GPU stopped working (%.180s); results so far are written, re-run to resume",
               row->reason);
    }
  } else if (!(m.rel_err <= g->tolerance)) {
    row->status = MJ_TS_WRONG;
    snprintf(row->reason, sizeof row->reason,
             "relative error %.3g on the sampled rows > tolerance %g", m.rel_err, g->tolerance);
    r->sum->wrong++;
  } else {
    row->status = MJ_TS_OK;
    row->us = round(m.us * 1e3) / 1e3; /* ns: what results.csv keeps, so a resumed run agrees */
    row->copy_us = round(m.copy_us * 1e3) / 1e3;
    row->iters = m.iters;
    set_rates(row, g);
    r->sum->measured++;
  }
}

static int over_budget(const run *r) {
  return r->o->budget_seconds > 0 && elapsed_s(r) >= r->o->budget_seconds;
}

/* Marks a pending row as not timed for `status`, and reports it. */
static void skip_row(run *r, mj_tune_row *row, mj_tune_status status) {
  char item[256];
  row->status = status;
  if (status == MJ_TS_SKIPPED_BUDGET) r->sum->skipped_budget++;
  row_item(row, item, sizeof item);
  report(r, MOEJIT_TUNE_PHASE_TIME, ++r->time_done, r->time_total, item,
         mj_tune_status_name(status), 0, 0, "");
}

static void time_rows(run *r, const mj_tune_group *g, size_t first, size_t end) {
  for (size_t i = first; i < end; i++) {
    mj_tune_row *row = &r->rows.rows[i];
    if (row->status != MJ_TS_PENDING) continue;
    if (r->dead) {
      skip_row(r, row, MJ_TS_NOT_TIMED);
      continue;
    }
    if (over_budget(r)) {
      skip_row(r, row, MJ_TS_SKIPPED_BUDGET);
      continue;
    }
    measure_row(r, g, row);
    char item[256];
    row_item(row, item, sizeof item);
    report(r, MOEJIT_TUNE_PHASE_TIME, ++r->time_done, r->time_total, item,
           mj_tune_status_name(row->status), row->us, 0,
           row->status == MJ_TS_OK ? "" : row->reason);
  }
}

/* ---- the runoff ---------------------------------------------------------------- */

/* Whether entry e runs what (cfg, path) runs: the GEMV kernel ignores the tile. */
static int same_choice(const mj_tuned_entry *e, const moejit_gemm_cfg *cfg, moejit_gemm_path path) {
  return e->path == path && (path == MOEJIT_GEMM_PATH_GEMV || mj_gemm_cfg_equal(&e->cfg, cfg));
}

/* The first of rows [first, end) that is a candidate of table entry e's
 * point and configuration which ran and passed the check (resumed rows
 * included), or -1. */
static int entry_row(const run *r, size_t first, size_t end, const mj_tuned_entry *e) {
  const int which = strcmp(e->kernel, "gemm1") == 0 ? 1 : 2;
  for (size_t i = first; i < end; i++) {
    const mj_tune_row *row = &r->rows.rows[i];
    if (row->role == MJ_ROLE_CANDIDATE && row->status == MJ_TS_OK && row->which == which &&
        row->dtype == e->dtype && row->hidden == e->hidden &&
        row->expert_width == e->expert_width && row->experts == e->experts &&
        row->top_k == e->top_k && row->tokens == e->tokens && same_choice(e, &row->cfg, row->path))
      return (int)i;
  }
  return -1;
}

static int in_list(const size_t *v, size_t n, size_t x) {
  for (size_t i = 0; i < n; i++)
    if (v[i] == x) return 1;
  return 0;
}

/* Picks the finalists of group [first, end): the heuristic row, the `n`
 * fastest candidates and the prior table's entry for the point, each once
 * and only if it passed. Returns how many (at most cap). */
static size_t finalists(const run *r, size_t first, size_t end, int n, size_t *out, size_t cap) {
  size_t k = 0;
  for (size_t i = first; i < end && k < cap; i++)
    if (r->rows.rows[i].role == MJ_ROLE_HEURISTIC && r->rows.rows[i].status == MJ_TS_OK)
      out[k++] = i;
  for (int j = 0; j < n && k < cap; j++) { /* the next fastest not yet taken */
    size_t best = end;
    for (size_t i = first; i < end; i++) {
      const mj_tune_row *row = &r->rows.rows[i];
      if (row->role != MJ_ROLE_CANDIDATE || row->status != MJ_TS_OK) continue;
      if (!in_list(out, k, i) && (best == end || row->us < r->rows.rows[best].us)) best = i;
    }
    if (best == end) break;
    out[k++] = best;
  }
  if (r->o->keep_within > 0 && r->prior.n && k < cap) {
    const mj_tune_row *head = &r->rows.rows[first];
    mj_tuned_entry key;
    memset(&key, 0, sizeof key);
    snprintf(key.kernel, sizeof key.kernel, "gemm%d", head->which);
    key.dtype = head->dtype, key.hidden = head->hidden, key.expert_width = head->expert_width;
    key.experts = head->experts, key.top_k = head->top_k, key.tokens = head->tokens;
    const mj_tuned_entry *e = mj_tuned_table_find(&r->prior, &key);
    const int i = e ? entry_row(r, first, end, e) : -1;
    if (i >= 0 && !in_list(out, k, (size_t)i)) out[k++] = (size_t)i;
  }
  return k;
}

/* Times the finalists of group [first, end) MOEJIT_TUNE_RUNOFF_ROUNDS more
 * times, each round over all of them, in reverse order every other round,
 * and gives each the median of its timings (the first pass's included). A
 * finalist that fails or goes wrong now is recorded so and drops out. The
 * budget ends the runoff after a whole round. */
static void runoff(run *r, const mj_tune_group *g, size_t first, size_t end) {
  const int n = r->o->runoff < 0 ? 0 : r->o->runoff > 0 ? r->o->runoff : r->sw->runoff;
  enum { kCap = MJ_TUNE_MAX_RUNOFF + 2, kRounds = MOEJIT_TUNE_RUNOFF_ROUNDS };
  size_t fin[kCap];
  const size_t k =
      n > 0 ? finalists(r, first, end, n < MJ_TUNE_MAX_RUNOFF ? n : MJ_TUNE_MAX_RUNOFF, fin, kCap)
            : 0;
  if (k < 2) return; /* nothing to compare */
  double us[kCap][1 + kRounds];
  int got[kCap], iters[kCap];
  for (size_t j = 0; j < k; j++) us[j][0] = r->rows.rows[fin[j]].us, got[j] = 1, iters[j] = 0;
  for (int round = 0; round < kRounds && !r->dead && !over_budget(r); round++)
    for (size_t q = 0; q < k && !r->dead; q++) {
      const size_t j = round % 2 ? q : k - 1 - q; /* the first pass ran in row order */
      mj_tune_row *row = &r->rows.rows[fin[j]];
      if (row->status != MJ_TS_OK) continue;
      const mj_tune_row before = *row;
      measure_row(r, g, row);
      r->sum->runoff_timed++;
      /* counted once already, as measured or resumed: measure_row counted it
       * again when ok, else it moves to wrong or failed */
      if (row->status == MJ_TS_OK || !before.resumed)
        r->sum->measured--;
      else
        r->sum->resumed--;
      if (row->status == MJ_TS_OK) {
        us[j][got[j]++] = row->us, iters[j] += row->iters;
        *row = before; /* the median below sets the time */
      }
    }
  for (size_t j = 0; j < k; j++) {
    mj_tune_row *row = &r->rows.rows[fin[j]];
    if (row->status != MJ_TS_OK || got[j] < 2) continue;
    row->us = round(mj_tune_median(us[j], (size_t)got[j]) * 1e3) / 1e3;
    row->iters += iters[j];
    set_rates(row, g);
    mj_strlcpy(row->date, r->date, sizeof row->date);
  }
}

/* The sweep shape of a row (its index) and, if base is non-NULL, the spec
 * its group runs with: the shape's own tiles, archs set to the target. */
static int base_spec(const run *r, const mj_tune_row *row, moejit_spec *base) {
  int shape = 0;
  while (shape + 1 < r->sw->n_shapes && strcmp(r->sw->shapes[shape].name, row->shape)) shape++;
  const mj_sweep_shape *sh = &r->sw->shapes[shape];
  if (base)
    mj_tune_cand_spec(r->sw, shape, row->which, row->which == 1 ? &sh->spec.gemm1 : &sh->spec.gemm2,
                      r->be->arch, base);
  return shape;
}

static moejit_status add_winner(run *r, size_t first, size_t end) {
  const mj_tune_row *best = NULL, *heur = NULL;
  size_t ok = 0;
  for (size_t i = first; i < end; i++) {
    const mj_tune_row *row = &r->rows.rows[i];
    if (row->role == MJ_ROLE_HEURISTIC) heur = row;
    if (row->role != MJ_ROLE_CANDIDATE || row->status != MJ_TS_OK) continue;
    ok++;
    if (!best || row->us < best->us) best = row;
  }
  const mj_tune_row *any = &r->rows.rows[first];
  char item[160];
  snprintf(item, sizeof item, "%s gemm%d T=%lld", any->shape, any->which, (long long)any->tokens);
  double hus = heur && heur->status == MJ_TS_OK ? heur->us : 0;
  report(r, MOEJIT_TUNE_PHASE_GROUP, 0, 0, item, best ? "ok" : "no-winner", best ? best->us : 0,
         hus, "");
  if (!best) return MOEJIT_OK;
  moejit_tune_winner *w = realloc(r->sum->winners, (r->sum->n_winners + 1) * sizeof *w);
  if (!w) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory keeping winners");
  r->sum->winners = w;
  w += r->sum->n_winners++;
  memset(w, 0, sizeof *w);
  snprintf(w->kernel, sizeof w->kernel, "gemm%d", best->which);
  mj_strlcpy(w->shape, best->shape, sizeof w->shape);
  w->dtype = best->dtype, w->hidden = best->hidden, w->expert_width = best->expert_width;
  w->experts = best->experts, w->top_k = best->top_k, w->tokens = best->tokens;
  w->cfg = best->cfg, w->path = best->path, w->us = best->us, w->tflops = best->tflops;
  w->heuristic_us = hus, w->candidates_ok = ok;
  moejit_spec base;
  base_spec(r, best, &base);
  moejit_gemm_cfg cfg, gemv_cfg;
  moejit_gemm_path path, gemv_path;
  const int have_auto =
      hus > 0 && mj_tune_heuristic_tile(&base, best->which, best->tokens * best->top_k, r->be->arch,
                                        &cfg, &path);
  /* Within the decode layer's reach the layer without a table runs the GEMV
   * kernel on both GEMMs (AUTO itself up to MOEJIT_GEMV_MAX_ROWS rows), and
   * only while both GEMMs do it runs its two-launch decode form
   * (docs/layer.md, "Decode"), which saves more than the GEMMs' small
   * differences there: another path wins such a point only when it is
   * faster than GEMV (the heuristic's launch where AUTO runs GEMV, or a
   * GEMV candidate) by MJ_TUNE_DECODE_FORM_US. */
  const int layer_gemv = mj_tune_layer_heuristic_tile(&base, best->which, best->tokens, r->be->arch,
                                                      &gemv_cfg, &gemv_path) &&
                         gemv_path == MOEJIT_GEMM_PATH_GEMV;
  double gemv_us = have_auto && path == MOEJIT_GEMM_PATH_GEMV ? hus : 0;
  for (size_t i = first; layer_gemv && i < end; i++) {
    const mj_tune_row *row = &r->rows.rows[i];
    if (row->role == MJ_ROLE_CANDIDATE && row->status == MJ_TS_OK &&
        row->path == MOEJIT_GEMM_PATH_GEMV && (gemv_us <= 0 || row->us < gemv_us))
      gemv_us = row->us;
  }
  const int keep_decode = layer_gemv && gemv_us > 0 && best->path != MOEJIT_GEMM_PATH_GEMV &&
                          best->us > gemv_us - MJ_TUNE_DECODE_FORM_US;
  const double flop_us = best->tflops * best->us; /* FLOPs / 1e6, the same for all */
  if (keep_decode) {
    w->cfg = gemv_cfg, w->path = MOEJIT_GEMM_PATH_GEMV, w->us = gemv_us;
    w->tflops = flop_us / gemv_us;
  } else if (have_auto && hus < best->us) {
    /* the heuristic's own launch measured faster than every candidate (its
     * explicit twin is among them, so only noise separates the two): the
     * winner is what AUTO runs, so a tuned entry is never the slower GEMM */
    w->cfg = cfg, w->path = path, w->us = hus, w->tflops = flop_us / hus;
  }
  return MOEJIT_OK;
}

static int group_pending(const run *r, size_t first, size_t end) {
  for (size_t i = first; i < end; i++)
    if (r->rows.rows[i].status == MJ_TS_PENDING) return 1;
  return 0;
}

static void fail_group(run *r, size_t first, size_t end) {
  char msg[192];
  last_error_line(msg, sizeof msg);
  for (size_t i = first; i < end; i++) {
    mj_tune_row *row = &r->rows.rows[i];
    if (row->status != MJ_TS_PENDING) continue;
    row->status = MJ_TS_FAILED;
    snprintf(row->reason, sizeof row->reason, "inputs could not be set up: %.150s", msg);
    r->sum->failed++;
  }
}

/* Opens the group's inputs only when something in it is left to time. */
static moejit_status run_group(run *r, size_t first, size_t end) {
  const mj_tune_row *head = &r->rows.rows[first];
  const int shape = base_spec(r, head, NULL);
  const mj_sweep_shape *sh = &r->sw->shapes[shape];
  if (group_pending(r, first, end) && !r->dead && !over_budget(r)) {
    moejit_spec base;
    base_spec(r, head, &base);
    int32_t *offsets = malloc(((size_t)sh->spec.experts + 1) * sizeof *offsets);
    int32_t *choice = malloc((size_t)(head->tokens * sh->spec.top_k) * sizeof *choice + 1);
    uint64_t seed = mj_tune_mix(mj_tune_mix(r->sw->seed, (uint64_t)shape), (uint64_t)head->tokens);
    int active = offsets && choice ? mj_tune_route(sh->spec.experts, sh->spec.top_k, head->tokens,
                                                   seed, offsets, choice)
                                   : -1;
    if (active < 0) {
      free(offsets), free(choice);
      return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory routing tokens");
    }
    mj_tune_group g = {r->sw,
                       shape,
                       &base,
                       head->which,
                       head->tokens,
                       head->tokens * sh->spec.top_k,
                       offsets,
                       choice,
                       active,
                       mj_tune_mix(seed, (uint64_t)head->which),
                       r->o->warmup > 0 ? r->o->warmup : r->sw->warmup,
                       r->o->iters > 0 ? r->o->iters : r->sw->iters,
                       r->sw->min_iters,
                       r->sw->max_point_ms,
                       r->sw->rotate_bytes,
                       r->sw->tolerance,
                       r->sw->check_rows,
                       r->o->jobs > 0 ? r->o->jobs : mj_online_cpus()};
    if (g.min_iters > g.iters) g.min_iters = g.iters;
    if (r->be->open_group(r->be->state, &g) != MOEJIT_OK) {
      fail_group(r, first, end);
    } else {
      time_rows(r, &g, first, end);
      runoff(r, &g, first, end);
      r->be->close_group(r->be->state, &g);
    }
    free(offsets), free(choice);
  } else {
    time_rows(r, NULL, first, end); /* marks budget / dead skips */
  }
  return add_winner(r, first, end);
}

static moejit_status time_all(run *r) {
  for (size_t i = 0; i < r->rows.n; i++) r->time_total += r->rows.rows[i].status == MJ_TS_PENDING;
  double t = now_ms(r);
  moejit_status st = MOEJIT_OK;
  for (size_t first = 0; first < r->rows.n && !st;) { /* groups start at their heuristic row */
    size_t end = first + 1;
    while (end < r->rows.n && r->rows.rows[end].role != MJ_ROLE_HEURISTIC) end++;
    st = run_group(r, first, end);
    first = end;
  }
  r->sum->time_s = (now_ms(r) - t) / 1e3;
  if (r->sum->skipped_budget && !r->sum->stop_reason[0])
    snprintf(r->sum->stop_reason, sizeof r->sum->stop_reason,
             "the budget of %g s was spent: %zu points were not timed (re-run to resume them)",
             r->o->budget_seconds, r->sum->skipped_budget);
  return st;
}

/* ---- outputs ------------------------------------------------------------------- */

static moejit_status write_results(run *r) {
  mj_tune_rows all = {0};
  moejit_status st = MOEJIT_OK;
  for (size_t i = 0; i < r->rows.n && !st; i++) st = mj_tune_rows_push(&all, &r->rows.rows[i]);
  for (size_t i = 0; i < r->old.n && !st; i++) /* other devices and other sweeps' rows stay */
    if (!r->old_used[i]) st = mj_tune_rows_push(&all, &r->old.rows[i]);
  char path[MOEJIT_PATH_MAX + 32];
  int maj = 0, min = 0;
  moejit_nvrtc_version(&maj, &min);
  mj_tune_meta meta = {r->sw->name,  r->be->device, r->be->arch,
                       r->be->nvrtc, r->date,       r->be->driver};
  if (!st) st = mj_mkdir_p(r->results_dir, 0755);
  if (!st && !(st = mj_snprintf(path, sizeof path, "%s/results.csv", r->results_dir)))
    st = mj_tune_write_csv(&all, path);
  if (!st && !(st = mj_snprintf(path, sizeof path, "%s/results.json", r->results_dir)))
    st = mj_tune_write_json(&all, &meta, r->sum->winners, r->sum->n_winners, path);
  if (!st && !(st = mj_snprintf(path, sizeof path, "%s/chart.svg", r->results_dir)))
    st = mj_tune_write_svg(&r->rows, &meta, path);
  mj_tune_rows_free(&all);
  if (!st) mj_strlcpy(r->sum->results_dir, r->results_dir, sizeof r->sum->results_dir);
  return st;
}

/* The tuned table the run writes: --out, or configs/tuned/<device file>. */
static moejit_status table_path(const run *r, char *path, size_t cap) {
  if (r->o->out_table) return mj_snprintf(path, cap, "%s", r->o->out_table);
  char file[256];
  mj_tuned_file_name(r->be->device, file, sizeof file);
  return mj_snprintf(path, cap, "configs/tuned/%s", file);
}

/* Loads the table at path into t (left empty when there is none yet); one
 * this run cannot merge into (unreadable, or of another GPU) is an error. */
static moejit_status load_table(const run *r, const char *path, mj_tuned_table *t) {
  struct stat sb;
  if (stat(path, &sb) != 0) return MOEJIT_OK;
  moejit_status st = mj_tuned_table_load_file(path, t);
  if (st) return mj_fail_prefix(st, "cannot merge into the tuned table %s", path);
  if (t->device[0] && strcmp(t->device, r->be->device))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "the tuned table %s is for '%s', this GPU is '%s'; HINT: pass --out with "
                   "another file",
                   path, t->device, r->be->device);
  return MOEJIT_OK;
}

static moejit_status fill_table(run *r, const char *path, mj_tuned_table *t) {
  moejit_status st = load_table(r, path, t);
  if (st) return st;
  mj_strlcpy(t->device, r->be->device, sizeof t->device);
  mj_strlcpy(t->arch, r->be->arch, sizeof t->arch);
  mj_strlcpy(t->nvrtc, r->be->nvrtc, sizeof t->nvrtc);
  mj_strlcpy(t->date, r->date, sizeof t->date);
  t->driver = r->be->driver;
  for (size_t i = 0; i < r->sum->n_winners; i++) {
    const moejit_tune_winner *w = &r->sum->winners[i];
    mj_tuned_entry e;
    memset(&e, 0, sizeof e);
    mj_strlcpy(e.kernel, w->kernel, sizeof e.kernel);
    e.dtype = w->dtype, e.hidden = w->hidden, e.expert_width = w->expert_width;
    e.experts = w->experts, e.top_k = w->top_k, e.tokens = w->tokens;
    e.cfg = w->cfg, e.path = (moejit_gemm_path)w->path, e.us = w->us,
    e.heuristic_us = w->heuristic_us;
    const mj_tuned_entry *old = mj_tuned_table_find(t, &e);
    if (old && old->pinned && !r->o->replace_pinned) { /* a layer check's pin stays */
      r->sum->table_pinned_kept++;
      continue;
    }
    if (old && r->o->keep_within > 0 && !same_choice(old, &e.cfg, e.path)) {
      const int at = entry_row(r, 0, r->rows.n, old); /* this run's time of the entry's tile */
      const double us = at < 0 ? 0 : r->rows.rows[at].us;
      if (us > 0 && us <= e.us * (1 + r->o->keep_within / 100)) {
        e.cfg = old->cfg, e.path = old->path, e.us = us;
        r->sum->table_kept++;
      }
    }
    if ((st = mj_tuned_table_put(t, &e))) return st;
    r->sum->table_entries++;
  }
  return MOEJIT_OK;
}

static moejit_status write_table(run *r) {
  char path[MOEJIT_PATH_MAX];
  moejit_status st = table_path(r, path, sizeof path);
  if (st) return st;
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  int lock = -1;
  st = mj_tuned_table_lock(path, 1, &lock); /* read, merge and write as one */
  if (!st) st = fill_table(r, path, &t);
  if (!st) st = mj_tuned_table_write(&t, path);
  mj_tuned_table_unlock(lock);
  mj_tuned_table_free(&t);
  if (!st) mj_strlcpy(r->sum->table_path, path, sizeof r->sum->table_path);
  return st;
}

/* ---- the run ------------------------------------------------------------------- */

static void summarize_plan(run *r) {
  moejit_tune_summary *s = r->sum;
  s->enumerated = r->plan.enumerated;
  s->pruned = r->plan.pruned;
  s->candidates = r->plan.n - r->plan.pruned;
  s->n_prune_reasons = r->plan.n_reasons;
  memcpy(s->prune_reasons, r->plan.reasons, sizeof s->prune_reasons);
  for (size_t i = 0; i < r->rows.n; i++) s->points += r->rows.rows[i].status != MJ_TS_PRUNED;
}

static void today(char *buf, size_t cap) {
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(buf, cap, "%Y-%m-%d", &tm);
}

/* The results directory and the table's folder, made and checked before
 * any timing (a path that cannot be written would otherwise surface only
 * after hours of it), and a table that is not one of the results files. */
static moejit_status check_outputs(const run *r, const char *table) {
  char dir[MOEJIT_PATH_MAX], real_dir[PATH_MAX], real_table[PATH_MAX + 8];
  moejit_status st = mj_mkdir_p(r->results_dir, 0755);
  if (st) return mj_fail_prefix(st, "results directory %s", r->results_dir);
  if (access(r->results_dir, W_OK | X_OK) != 0 || !realpath(r->results_dir, real_dir))
    return mj_fail(MOEJIT_ERR_IO, "results directory %s: %s; HINT: pass --results DIR",
                   r->results_dir, strerror(errno));
  if (!table) return MOEJIT_OK;
  int fd = -1;
  if ((st = mj_tuned_table_lock(table, 1, &fd))) return st; /* makes its folder */
  mj_tuned_table_unlock(fd);
  mj_strlcpy(dir, table, sizeof dir);
  char *slash = strrchr(dir, '/');
  const char *base = slash ? slash + 1 : table;
  if (slash) *slash = '\0';
  if (access(slash ? (*dir ? dir : "/") : ".", W_OK | X_OK) != 0)
    return mj_fail(MOEJIT_ERR_IO,
                   "tuned table %s: its folder is not writable: %s; HINT: pass "
                   "--out with another file",
                   table, strerror(errno));
  if (!realpath(slash ? (*dir ? dir : "/") : ".", real_table)) return MOEJIT_OK;
  if (strcmp(real_table, real_dir) != 0) return MOEJIT_OK;
  static const char *const ours[] = {"results.csv", "results.json", "chart.svg"};
  for (size_t i = 0; i < sizeof ours / sizeof *ours; i++)
    if (!strcmp(base, ours[i]))
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "--out %s is this run's own %s; HINT: pass --out with another file", table,
                     ours[i]);
  return MOEJIT_OK;
}

static moejit_status prepare(run *r) {
  moejit_status st = mj_tune_plan_build(r->sw, r->be->arch, &r->plan);
  if (st) return st;
  size_t pairs = (size_t)r->sw->n_shapes * 2;
  if (!(r->tuned = calloc(pairs, 1))) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory");
  if ((st = build_rows(r))) return st;
  summarize_plan(r);
  report(r, MOEJIT_TUNE_PHASE_PLAN, r->plan.n, r->plan.n, r->sw->name, "ok", 0, 0, "");
  if (r->o->dry_run) return MOEJIT_OK;
  if (r->o->results_dir)
    st = mj_snprintf(r->results_dir, sizeof r->results_dir, "%s", r->o->results_dir);
  else
    st = mj_snprintf(r->results_dir, sizeof r->results_dir, "tune-out/%s", r->sw->name);
  char csv[MOEJIT_PATH_MAX + 16];
  if (!st && r->be->can_time &&
      !(st = mj_snprintf(csv, sizeof csv, "%s/results.csv", r->results_dir)))
    st = mj_tune_read_csv(csv, &r->old);
  if (!st) st = resume(r);
  if (!st) st = make_units(r);
  /* the table the winners go into: refused now (another GPU's, unreadable)
   * rather than after the timing; its entries join the runoff */
  char path[MOEJIT_PATH_MAX];
  const int table = r->be->can_time && !r->o->no_table;
  if (!st && table) st = table_path(r, path, sizeof path);
  if (!st && r->be->can_time) st = check_outputs(r, table ? path : NULL);
  if (!st && table) st = load_table(r, path, &r->prior);
  return st;
}

static moejit_status execute(run *r) {
  moejit_status st = prepare(r);
  if (st || r->o->dry_run) return st;
  compile_all(r);
  if (!r->be->can_time) {
    for (size_t i = 0; i < r->rows.n; i++)
      if (r->rows.rows[i].status == MJ_TS_PENDING) r->rows.rows[i].status = MJ_TS_COMPILED;
    return MOEJIT_OK;
  }
  r->sum->timed = 1;
  st = time_all(r);
  if (!st) st = write_results(r);
  if (!st && !r->o->no_table && r->sum->n_winners) st = write_table(r);
  if (!st && r->dead) st = mj_fail(MOEJIT_ERR_CUDA, "tuning stopped: %s", r->sum->stop_reason);
  return st;
}

moejit_status mj_tune_run_backend(const moejit_sweep *sweep, const moejit_tune_opts *opts,
                                  const mj_tune_backend *be, moejit_tune_summary *summary) {
  if (!summary) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_tune_run: summary is NULL");
  memset(summary, 0, sizeof *summary);
  if (!sweep) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_tune_run: sweep is NULL");
  moejit_tune_opts defaults;
  moejit_tune_opts_init(&defaults);
  run r = {.sw = sweep, .o = opts ? opts : &defaults, .be = be, .sum = summary};
  if (pthread_mutex_init(&r.lock, NULL) != 0)
    return mj_fail(MOEJIT_ERR_INTERNAL, "moejit_tune_run: cannot create a mutex");
  r.t0 = now_ms(&r);
  today(r.date, sizeof r.date);
  mj_strlcpy(summary->sweep, sweep->name, sizeof summary->sweep);
  mj_strlcpy(summary->device, be->device, sizeof summary->device);
  mj_strlcpy(summary->arch, be->arch, sizeof summary->arch);
  moejit_status st = execute(&r);
  summary->total_s = elapsed_s(&r);
  mj_tune_plan_free(&r.plan);
  mj_tune_rows_free(&r.rows);
  mj_tune_rows_free(&r.old);
  mj_tuned_table_free(&r.prior);
  free(r.old_used), free(r.units), free(r.cand_unit), free(r.heur_unit), free(r.tuned);
  pthread_mutex_destroy(&r.lock);
  return st;
}

/* ---- public calls --------------------------------------------------------------- */

void moejit_tune_opts_init(moejit_tune_opts *opts) {
  if (opts) memset(opts, 0, sizeof *opts);
}

void moejit_tune_summary_free(moejit_tune_summary *s) {
  if (!s) return;
  free(s->winners);
  s->winners = NULL, s->n_winners = 0;
}

void mj_tune_backend_free(mj_tune_backend *be) {
  if (be && be->destroy) be->destroy(be->state);
  if (be) memset(be, 0, sizeof *be);
}

moejit_status moejit_tune_run(moejit_ctx *ctx, const moejit_sweep *sweep,
                              const moejit_tune_opts *opts, moejit_tune_summary *summary) {
  if (!summary) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_tune_run: summary is NULL");
  memset(summary, 0, sizeof *summary);
  if (!sweep) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_tune_run: sweep is NULL");
  mj_tune_backend be;
  const char *arch = opts && opts->arch ? opts->arch : sweep->arch;
  if (!mj_arch_supported(arch))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_tune_run: arch '%.40s' is not an arch moejit targets (one of %s, "
                   "'auto' aside)",
                   arch, mj_arch_allowed());
  moejit_status st = ctx ? mj_tune_gpu_backend(ctx, &be)
                         : mj_tune_compile_backend(opts ? opts->compiler : NULL, arch, &be);
  if (st) return st;
  st = mj_tune_run_backend(sweep, opts, &be, summary);
  mj_tune_backend_free(&be);
  return st;
}
