/* The autotuner's engine with a fake compiler and timer (no GPU, no NVRTC):
 * winner selection, wrong candidates kept from winning, resume, budget,
 * compile and setup failures, a GPU that dies mid-run, and the outputs
 * (results.csv read back, results.json parsed, chart.svg, the tuned table
 * through its reader). Also the host data: routing, sampled rows and the
 * float64 reference against a naive one. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "ops/ops.h"
#include "test_support.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

/* The smoke sweep's shape and spaces, inline so the numbers below hold
 * whatever configs/sweeps/smoke.yaml becomes. At T = 4 the GEMMs see 8 rows,
 * where AUTO runs the GEMV kernel: its heuristic candidate there is path
 * gemv with the shape's own tile (so no kernel of its own); at T = 64 and
 * 512 AUTO runs the narrow wgmma tile. */
#define SWEEP_SPACES                                                           \
  "name: fake\n"                                                               \
  "tokens: [4, 64, 512]\n"                                                     \
  "shapes:\n"                                                                  \
  "  - {name: tiny, hidden: 512, expert_width: 256, experts: 8, top_k: 2}\n"   \
  "spaces:\n"                                                                  \
  "  - {paths: [mma], tile_m: [16, 64], tile_n: 128, tile_k: 64, stages: 3}\n" \
  "  - {paths: [wgmma], tile_m: [64, 128], tile_n: 128, tile_k: 64, stages: 4, warps: [8, 4]"
static const char kSweep[] = SWEEP_SPACES "}\n";

/* kSweep with the wgmma space also on CTA pairs along N (both GEMMs have 4
 * n-tiles of 128 output columns: an even count). */
static const char kSweepClusterN[] = SWEEP_SPACES ",\n     cluster_n: [1, 2]}\n";

typedef struct fake {
  const char *device;
  int compiles, opens, measures;
  double clock_ms, ms_per_measure;
  int measures_cn2;         /* of measures, those of cluster_n 2 configs */
  int fail_compile_tile_m;  /* compile fails for this tile_m (0: none) */
  int wrong_tile_m;         /* mma candidates of this tile_m compute garbage */
  int64_t fail_open_tokens; /* open_group fails for this T */
  int die_after;            /* the GPU dies at this measure (0: never) */
  int dead;
  double auto_us; /* the heuristic's time (0: 1000 us) */
  double gemv_us; /* gemv candidates' time (0: the formula below) */
  /* wgmma candidates of this tile_m: their first timing at each point
   * takes lucky_us (a pass on a cool GPU), later ones the formula */
  int lucky_tile_m;
  double lucky_us;
  int lucky_seen[2][3]; /* per kernel and token count: timed once already */
  /* wgmma candidates of this tile_m and 4 stages (not AUTO's narrow 64-row
   * tile, of 8) go wrong from their second timing at a point */
  int wrong_later_tile_m;
  int later_seen[2][3];
  int log_on; /* log every timing's (path, tile_m) from the first on */
  int log_n;
  int log_path[256], log_tile_m[256];
} fake;

static moejit_status fake_compile(void *state, const moejit_spec *spec, const char *family,
                                  int *hit) {
  fake *f = state;
  const moejit_gemm_cfg *g = !strcmp(family, "gemm1") ? &spec->gemm1 : &spec->gemm2;
  __atomic_add_fetch(&f->compiles, 1, __ATOMIC_SEQ_CST);
  *hit = 0;
  if (g->tile_m == f->fail_compile_tile_m)
    return mj_fail(MOEJIT_ERR_COMPILE, "gemm.cu(12): error: fake NVRTC failure\nmore log");
  return MOEJIT_OK;
}

static moejit_status fake_open(void *state, const mj_tune_group *g) {
  fake *f = state;
  f->opens++;
  cr_assert_eq(g->rows, g->tokens * 2);
  cr_assert_eq(g->offsets[8], g->rows, "routing covers every row");
  if (g->tokens == f->fail_open_tokens)
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "fake: out of device memory");
  return MOEJIT_OK;
}

/* Times with a known order: wgmma 64x128x64 s4 is the fastest correct
 * candidate; mma 16x128 would beat it but (wrong_tile_m) is wrong; the
 * heuristic (AUTO) takes 1000 us. */
static double fake_us(const fake *f, const moejit_spec *spec, int which, moejit_gemm_path path,
                      int64_t tokens) {
  const moejit_gemm_cfg *c = which == 1 ? &spec->gemm1 : &spec->gemm2;
  if (path == MOEJIT_GEMM_PATH_AUTO) return f->auto_us > 0 ? f->auto_us : 1000;
  if (path == MOEJIT_GEMM_PATH_GEMV && f->gemv_us > 0) return f->gemv_us;
  return 100 + (double)tokens / 8 + c->tile_m * 0.5 + c->tile_n * 0.1 +
         (path == MOEJIT_GEMM_PATH_MMA ? 20 : 0) + c->stages + which;
}

static moejit_status fake_measure(void *state, const mj_tune_group *g, const moejit_spec *spec,
                                  moejit_gemm_path path, mj_tune_measurement *m) {
  fake *f = state;
  f->measures++;
  f->clock_ms += f->ms_per_measure;
  if (f->die_after && f->measures >= f->die_after) {
    f->dead = 1;
    return mj_fail(MOEJIT_ERR_CUDA, "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (fake)");
  }
  const moejit_gemm_cfg *c = g->which == 1 ? &spec->gemm1 : &spec->gemm2;
  const int ti = g->tokens == 4 ? 0 : g->tokens == 64 ? 1 : 2;
  const int wgmma = path == MOEJIT_GEMM_PATH_WGMMA;
  f->measures_cn2 += path != MOEJIT_GEMM_PATH_AUTO && c->cluster_n == 2;
  if (f->log_on && f->log_n < 256)
    f->log_path[f->log_n] = path,
    f->log_tile_m[f->log_n++] = path == MOEJIT_GEMM_PATH_AUTO ? 0 : c->tile_m;
  m->rel_err = path == MOEJIT_GEMM_PATH_MMA && c->tile_m == f->wrong_tile_m ? 0.5 : 1e-3;
  if (wgmma && c->tile_m == f->wrong_later_tile_m && c->stages == 4 &&
      f->later_seen[g->which - 1][ti]++ > 0)
    m->rel_err = 0.5;
  m->us = m->rel_err <= g->tolerance ? fake_us(f, spec, g->which, path, g->tokens) : 0;
  if (wgmma && c->tile_m == f->lucky_tile_m && !f->lucky_seen[g->which - 1][ti]++)
    m->us = f->lucky_us;
  m->iters = g->iters;
  return MOEJIT_OK;
}

static void fake_close(void *state, const mj_tune_group *g) {}
static int fake_alive(void *state) {
  return !((fake *)state)->dead;
}
static double fake_now(void *state) {
  return ((fake *)state)->clock_ms;
}

static mj_tune_backend backend(fake *f) {
  mj_tune_backend be = {.state = f,
                        .can_time = 1,
                        .compile = fake_compile,
                        .open_group = fake_open,
                        .measure = fake_measure,
                        .close_group = fake_close,
                        .alive = fake_alive,
                        .now_ms = fake_now,
                        .driver = 13000};
  mj_strlcpy(be.device, f->device ? f->device : "Fake GPU 1", sizeof be.device);
  mj_strlcpy(be.arch, "sm_90a", sizeof be.arch);
  mj_strlcpy(be.nvrtc, "13.0", sizeof be.nvrtc);
  return be;
}

static char *tmp;
static moejit_sweep *sweep;
static char results[1024], table[1024];

static void setup(void) {
  tmp = ts_mkdtemp("tune-engine");
  snprintf(results, sizeof results, "%s/out", tmp);
  snprintf(table, sizeof table, "%s/tuned/Fake.yaml", tmp);
  cr_assert_eq(moejit_sweep_load_string(kSweep, strlen(kSweep), "fake.yaml", &sweep), MOEJIT_OK,
               "%s", moejit_last_error());
}

static void teardown(void) {
  moejit_sweep_destroy(sweep);
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(tune_engine, .init = setup, .fini = teardown, .timeout = 60);

static moejit_status run(fake *f, double budget, moejit_tune_summary *s) {
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table, o.budget_seconds = budget, o.jobs = 2;
  o.runoff = -1; /* these tests count single timings; the runoff has its own */
  mj_tune_backend be = backend(f);
  return mj_tune_run_backend(sweep, &o, &be, s);
}

/* run() with the runoff: 0 the sweep's (3), else that many candidates. */
static moejit_status run_runoff(fake *f, int runoff, double keep_within, moejit_tune_summary *s) {
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table, o.jobs = 2;
  o.runoff = runoff, o.keep_within = keep_within;
  mj_tune_backend be = backend(f);
  return mj_tune_run_backend(sweep, &o, &be, s);
}

static char *slurp(const char *dir, const char *name) {
  char path[2048];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text = NULL;
  size_t len = 0;
  cr_assert_eq(mj_read_file(path, &text, &len), MOEJIT_OK, "%s: %s", path, moejit_last_error());
  return text;
}

static size_t count_status(const mj_tune_rows *rows, mj_tune_status st) {
  size_t n = 0;
  for (size_t i = 0; i < rows->n; i++) n += rows->rows[i].status == st;
  return n;
}

static const mj_tune_row *row_of(const mj_tune_rows *rows, int which, int64_t tokens,
                                 moejit_gemm_path path, int tile_m);
static mj_tuned_entry entry_from_row(const mj_tune_row *r);

static void read_results(mj_tune_rows *rows) {
  char path[2048];
  snprintf(path, sizeof path, "%s/results.csv", results);
  cr_assert_eq(mj_tune_read_csv(path, rows), MOEJIT_OK);
}

Test(tune_engine, winners_skip_wrong_candidates) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(s.timed);
  /* per kernel: 6 space configs (2 of them duplicates), the narrow wgmma
   * tile (T = 64, 512) and gemv (T = 4) */
  cr_assert_eq(s.enumerated, 16);
  cr_assert_eq(s.pruned, 4);
  /* 12 modules: the gemv candidates are built with the shape's tiles
   * (128x256x64 s4 w8 for both kernels), which the heuristic runs too (one
   * module serves every path), and no space candidate has those tiles */
  cr_assert_eq(s.kernels, 12);
  cr_assert_eq(f.compiles, 12);
  cr_assert_eq(s.wrong, 6, "mma 16x128 at 3 token counts x 2 kernels");
  cr_assert_eq(s.measured + s.wrong, s.points, "every point measured once");
  cr_assert_eq(f.measures, (int)s.points);
  cr_assert_eq(f.opens, 6);
  cr_assert_eq(s.n_winners, 6);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    cr_assert_eq(w->path, MOEJIT_GEMM_PATH_WGMMA, "%s T=%lld", w->kernel, (long long)w->tokens);
    cr_assert_eq(w->cfg.tile_m, 64);
    cr_assert_eq(w->cfg.stages, 4, "s4 beats the s8 narrow tile");
    cr_assert_eq(w->cfg.warps, 8);
    cr_assert_float_eq(w->heuristic_us, 1000, 1e-9);
    cr_assert_float_eq(w->us, 100 + w->tokens / 8.0 + 32 + 12.8 + 4 + (w->kernel[4] - '0'), 1e-6);
    cr_assert_eq(w->candidates_ok, 4, "narrow (gemv at T=4), mma 64, wgmma 64 and 128");
    cr_assert_gt(w->tflops, 0);
  }
  cr_assert_str_eq(s.table_path, table);
  cr_assert_eq(s.table_entries, 6);
  moejit_tune_summary_free(&s);
}

/* When the heuristic's launch measures faster than every candidate (only
 * noise can do that: its explicit twin is a candidate), the winner is what
 * AUTO runs, at the heuristic's time. */
Test(tune_engine, heuristic_faster_wins_as_its_explicit_plan) {
  fake f = {.wrong_tile_m = 16, .auto_us = 50};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.n_winners, 6);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    cr_assert_float_eq(w->us, 50, 1e-9);
    cr_assert_float_eq(w->heuristic_us, 50, 1e-9);
    cr_assert(w->path == MOEJIT_GEMM_PATH_MMA || w->path == MOEJIT_GEMM_PATH_WGMMA ||
                  w->path == MOEJIT_GEMM_PATH_GEMV,
              "an explicit path, never AUTO");
    /* 8 rows at T = 4: AUTO runs the GEMV kernel, so that is the winner */
    cr_assert_eq(w->path == MOEJIT_GEMM_PATH_GEMV, w->tokens == 4, "%s T=%lld: %s", w->kernel,
                 (long long)w->tokens, moejit_gemm_path_name(w->path));
    cr_assert_gt(w->tflops, 0);
  }
  moejit_tune_summary_free(&s);
}

Test(tune_engine, outputs_parse_back) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  mj_tune_rows rows;
  read_results(&rows);
  /* per (kernel, T): the heuristic, then its kernel's 7 candidates (2 of
   * them pruned; gemv at T = 4, the narrow tile above): 6 groups x 8 rows */
  cr_assert_eq(rows.n, 6 * 8);
  cr_assert_eq(count_status(&rows, MJ_TS_PRUNED), 6 * 2);
  cr_assert_eq(count_status(&rows, MJ_TS_WRONG), 6);
  cr_assert_eq(count_status(&rows, MJ_TS_OK), s.measured);
  for (size_t i = 0; i < rows.n; i++) {
    const mj_tune_row *r = &rows.rows[i];
    cr_assert_str_eq(r->device, "Fake GPU 1");
    cr_assert_str_eq(r->shape, "tiny");
    cr_assert_eq(r->hidden, 512);
    if (r->status == MJ_TS_OK) {
      cr_assert_gt(r->us, 0);
      cr_assert_gt(r->gbs, 0);
    }
    if (r->status == MJ_TS_PRUNED)
      cr_assert(strstr(r->reason, "same launch plan"), "%s", r->reason);
    if (r->status == MJ_TS_WRONG) cr_assert_float_eq(r->rel_err, 0.5, 1e-9);
  }
  mj_tune_rows_free(&rows);
  char *json = slurp(results, "results.json");
  cr_assert(ts_json_valid(json), "results.json is not valid JSON");
  cr_assert(strstr(json, "\"device\":\"Fake GPU 1\""));
  cr_assert_eq(ts_count_substr(json, "\"status\":\"wrong\""), 6);
  cr_assert_eq(ts_count_substr(json, "\"heuristic_us\":1000"), 6, "one per winner");
  free(json);
  char *svg = slurp(results, "chart.svg");
  cr_assert(!strncmp(svg, "<?xml", 5));
  cr_assert(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
  cr_assert(strstr(svg, "</svg>\n"));
  cr_assert_eq(ts_count_substr(svg, "<g>"), 2, "a panel per kernel");
  cr_assert_eq(ts_count_substr(svg, "<g>"), ts_count_substr(svg, "</g>"));
  cr_assert_eq(ts_count_substr(svg, "<polyline class=\"winner\""), 2);
  cr_assert_eq(ts_count_substr(svg, "<polyline class=\"heuristic\""), 2);
  cr_assert_eq(ts_count_substr(svg, "<polyline class=\"cand\""), 2 * 5,
               "one line per correct config (gemv's of one point)");
  cr_assert_eq(ts_count_substr(svg, "<polyline"), ts_count_substr(svg, "</polyline>") + 2,
               "winner lines are self-closed");
  free(svg);
  moejit_tune_summary_free(&s);
}

/* Writes the tuned table file `table` for `device` holding one entry: 64x128
 * mma for another shape (E = 16, k = 4, T = 8) than the sweep's. */
static void write_one_entry_table(const char *device, const char *kernel, double us) {
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, device, sizeof t.device);
  mj_strlcpy(t.arch, "sm_90a", sizeof t.arch);
  mj_tuned_entry e = {.dtype = MOEJIT_DTYPE_BF16,
                      .hidden = 1024,
                      .expert_width = 512,
                      .experts = 16,
                      .top_k = 4,
                      .tokens = 8,
                      .cfg = {.tile_m = 64,
                              .tile_n = 128,
                              .tile_k = 64,
                              .stages = 4,
                              .warps = 8,
                              .cluster_m = 1,
                              .cluster_n = 1},
                      .path = MOEJIT_GEMM_PATH_MMA,
                      .us = us};
  mj_strlcpy(e.kernel, kernel, sizeof e.kernel);
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_tuned_table_write(&t, table), MOEJIT_OK, "%s", moejit_last_error());
  mj_tuned_table_free(&t);
}

Test(tune_engine, table_reads_back_and_merges) {
  /* an existing table for the same device with another shape's entry */
  write_one_entry_table("Fake GPU 1", "gemm2", 12.5);
  mj_tuned_table t;
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(t.n, 7, "6 winners merged beside the entry already there");
  cr_assert_str_eq(t.nvrtc, "13.0");
  cr_assert_eq(t.driver, 13000);
  cr_assert_eq(strlen(t.date), 10, "an ISO date: %s", t.date);
  const mj_sweep_shape *sh = &sweep->shapes[0];
  mj_tuned_match m;
  const mj_tuned_entry *e = mj_tuned_lookup(&t, "gemm1", &sh->spec, 64, &m);
  cr_assert_not_null(e);
  cr_assert_eq(m, MJ_TUNED_EXACT);
  cr_assert_eq(e->path, MOEJIT_GEMM_PATH_WGMMA);
  cr_assert_eq(e->cfg.tile_m, 64);
  cr_assert_float_eq(e->heuristic_us, 1000, 1e-9);
  e = mj_tuned_lookup(&t, "gemm2", &sh->spec, 100, &m);
  cr_assert(e && m == MJ_TUNED_NEAREST && e->tokens == 64, "T=100 takes the nearest bucket (64)");
  mj_tuned_table_free(&t);
  moejit_tune_summary_free(&s);
}

/* A GEMV candidate that measures fastest at a decode bucket is the winner,
 * its table entry names path gemv (with the tile its module is built
 * with), and a model loading that table runs the GEMV kernel there, on any
 * arch. */
Test(tune_engine, gemv_winner_reaches_the_table_and_the_load) {
  fake f = {.wrong_tile_m = 16, .gemv_us = 20};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.n_winners, 6);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    if (w->tokens != 4) {
      cr_assert_eq(w->path, MOEJIT_GEMM_PATH_WGMMA, "gemv is a candidate at T=4 only");
      continue;
    }
    cr_assert_eq(w->path, MOEJIT_GEMM_PATH_GEMV, "%s", w->kernel);
    cr_assert_float_eq(w->us, 20, 1e-9);
    const moejit_spec *sh = &sweep->shapes[0].spec;
    const moejit_gemm_cfg *own = w->kernel[4] == '1' ? &sh->gemm1 : &sh->gemm2;
    cr_assert(!memcmp(&w->cfg, own, sizeof *own), "the shape's own tile: no extra module");
  }
  moejit_tune_summary_free(&s);
  char *text = slurp(tmp, "tuned/Fake.yaml");
  cr_assert_eq(ts_count_substr(text, "path: gemv"), 2, "%s", text);
  free(text);
  mj_tuned_table t;
  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  const moejit_spec *spec = &sweep->shapes[0].spec;
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int which = 1; which <= 2; which++) {
    mj_tuned_match m;
    const mj_tuned_entry *e = mj_tuned_lookup(&t, which == 1 ? "gemm1" : "gemm2", spec, 3, &m);
    cr_assert(e && e->tokens == 4 && e->path == MOEJIT_GEMM_PATH_GEMV && m == MJ_TUNED_NEAREST);
    for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++) {
      mj_gemm_variants v;
      moejit_load_kernel row;
      memset(&row, 0, sizeof row);
      mj_gemm_variants_collect(&t, NULL, spec, which, archs[a], &v, &row);
      cr_assert_str_eq(row.config_source, "tuned");
      /* gemv names no tile; on sm_80 the wgmma buckets are skipped, gemv stays */
      cr_assert(strstr(row.config_detail, ": T=4 gemv, T=64 64x128x64 s4 w8 wgmma") ||
                    strstr(row.config_detail, ": T=4 gemv; skipped T=64 (the wgmma kernel"),
                "%s", row.config_detail);
      mj_gemm_choice c;
      cr_assert_eq(mj_gemm_choose(spec, &v, which, 4, archs[a], &c), MOEJIT_OK, "%s",
                   moejit_last_error());
      cr_assert_eq(c.match, MJ_TUNED_EXACT);
      cr_assert_eq(c.path, MOEJIT_GEMM_PATH_GEMV);
      cr_assert(c.plan.use_gemv, "%s: %s", archs[a], c.plan.entry);
      cr_assert_str_eq(c.plan.entry, which == 1 ? "moejit_gemm1_swiglu_gemv" : "moejit_gemm2_gemv");
    }
  }
  mj_tuned_table_free(&t);
}

/* Runs the current sweep with every GEMV candidate at gemv_us and checks
 * its n winners: at T = decode_t the GEMV kernel (at gemv_us) where
 * gemv_wins, else a tile faster than it by more than
 * MJ_TUNE_DECODE_FORM_US; wgmma at every other T. */
static void expect_decode_winners(double gemv_us, int gemv_wins, int64_t decode_t, size_t n) {
  fake f = {.wrong_tile_m = 16, .gemv_us = gemv_us};
  moejit_tune_summary s;
  ts_rmtree(results);
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.n_winners, n);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    const int gemv = w->tokens == decode_t && gemv_wins;
    cr_assert_eq(w->path, gemv ? MOEJIT_GEMM_PATH_GEMV : MOEJIT_GEMM_PATH_WGMMA,
                 "GEMV at %g us, %s T=%lld: %s", gemv_us, w->kernel, (long long)w->tokens,
                 moejit_gemm_path_name(w->path));
    if (gemv) cr_assert_float_eq(w->us, gemv_us, 1e-9);
    if (w->tokens == decode_t && !gemv) cr_assert_lt(w->us, gemv_us - MJ_TUNE_DECODE_FORM_US);
  }
  moejit_tune_summary_free(&s);
}

/* At T = 4 (8 rows: AUTO runs GEMV, the layer its decode form) the fastest
 * candidate, wgmma 64x128 s4 (150.5 us for gemm1, 151.5 for gemm2), wins
 * over GEMV only by more than MJ_TUNE_DECODE_FORM_US; other T as before. */
Test(tune_engine, decode_sizes_keep_gemv_unless_another_path_saves_more) {
  const struct {
    double gemv_us;
    int gemv_wins;
  } cases[] = {{155, 1}, {160, 1}, {170, 0}, {140, 1}};
  for (size_t c = 0; c < MJ_ARRAY_LEN(cases); c++)
    expect_decode_winners(cases[c].gemv_us, cases[c].gemv_wins, 4, 6);
}

/* T = 8 of the k = 2 shape is 16 rows: past AUTO's GEMV rows (AUTO runs
 * the narrow wgmma tile) but within the decode layer's reach, where the
 * layer without a table runs the GEMV kernel. The tuner times that kernel
 * beside AUTO's tile, and it wins unless another path is faster by more
 * than MJ_TUNE_DECODE_FORM_US (the fastest, wgmma 64x128 s4: 150.8 us for
 * gemm1, 151.8 for gemm2). */
Test(tune_engine, the_decode_reach_keeps_gemv_past_autos_rows) {
  static const char kReach[] =
      "name: fake\n"
      "tokens: [8]\n"
      "shapes:\n"
      "  - {name: tiny, hidden: 512, expert_width: 256, experts: 8, top_k: 2}\n"
      "spaces:\n"
      "  - {paths: [wgmma], tile_m: [64, 128], tile_n: 128, tile_k: 64, stages: 4}\n";
  moejit_sweep *own = NULL;
  cr_assert_eq(moejit_sweep_load_string(kReach, strlen(kReach), "reach.yaml", &own), MOEJIT_OK,
               "%s", moejit_last_error());
  moejit_sweep *saved = sweep;
  sweep = own;
  const struct {
    double gemv_us;
    int gemv_wins;
  } cases[] = {{155, 1}, {170, 0}, {140, 1}};
  for (size_t c = 0; c < MJ_ARRAY_LEN(cases); c++) {
    expect_decode_winners(cases[c].gemv_us, cases[c].gemv_wins, 8, 2);
    mj_tune_rows rows;
    read_results(&rows);
    size_t gemv_rows = 0;
    for (size_t i = 0; i < rows.n; i++)
      gemv_rows += rows.rows[i].role == MJ_ROLE_CANDIDATE &&
                   rows.rows[i].path == MOEJIT_GEMM_PATH_GEMV && rows.rows[i].status == MJ_TS_OK;
    cr_assert_eq(gemv_rows, 2, "one GEMV candidate a GEMM");
    mj_tune_rows_free(&rows);
  }
  sweep = saved;
  moejit_sweep_destroy(own);
}

/* Refused before anything is timed: the run would end unable to write its
 * table. */
Test(tune_engine, table_of_another_device_is_refused) {
  write_one_entry_table("Some Other GPU", "gemm1", 1);
  fake f = {0};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "Some Other GPU"), "%s", moejit_last_error());
  cr_assert_eq(f.measures, 0, "refused before the timing");
  cr_assert_eq(f.compiles, 0, "and before the compiles");
  moejit_tune_summary_free(&s);
  fake g = {0};
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table, o.no_table = 1, o.runoff = -1;
  mj_tune_backend be = backend(&g);
  cr_assert_eq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_OK, "--no-table: %s",
               moejit_last_error());
  cr_assert_eq(g.measures, (int)s.points);
  moejit_tune_summary_free(&s);
}

/* A candidate whose first timing was lucky (10 us against its 186-301)
 * wins without a runoff; the runoff times it twice more and its median is
 * its real time, so the real fastest wins. Every finalist is timed three
 * times, the rounds alternate their order, and the counts add up. */
Test(tune_engine, runoff_keeps_a_lucky_pass_from_winning) {
  fake f = {.wrong_tile_m = 16, .lucky_tile_m = 128, .lucky_us = 10};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  for (size_t i = 0; i < s.n_winners; i++)
    cr_assert_eq(s.winners[i].cfg.tile_m, 128, "without a runoff the lucky pass wins");
  cr_assert_eq(s.runoff_timed, 0);
  moejit_tune_summary_free(&s);
  ts_rmtree(results);

  fake g = {.wrong_tile_m = 16, .lucky_tile_m = 128, .lucky_us = 10, .log_on = 1};
  cr_assert_eq(run_runoff(&g, 0, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.n_winners, 6);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    cr_assert_eq(w->path, MOEJIT_GEMM_PATH_WGMMA);
    cr_assert_eq(w->cfg.tile_m, 64, "%s T=%lld: the real fastest wins", w->kernel,
                 (long long)w->tokens);
  }
  /* per point: the heuristic and the 3 fastest of 4 correct candidates,
   * timed twice more each */
  cr_assert_eq(s.runoff_timed, 6 * 4 * 2);
  cr_assert_eq(g.measures, (int)(s.points + s.runoff_timed));
  cr_assert_eq(s.measured + s.wrong, s.points, "a runoff timing is not a point");
  /* the first point's timings: 6 rows in order, then the runoff over its
   * finalists (heuristic first in row order), reversed, then forward */
  cr_assert_geq(g.log_n, 6 + 8);
  const int *lp = g.log_path, *lt = g.log_tile_m;
  for (int q = 0; q < 4; q++)
    cr_assert(lp[6 + q] == lp[6 + 7 - q] && lt[6 + q] == lt[6 + 7 - q],
              "round 2 runs round 1's order backwards (%d)", q);
  cr_assert_eq(lp[6 + 3], MOEJIT_GEMM_PATH_AUTO, "round 1 ends with the first finalist");
  mj_tune_rows rows;
  read_results(&rows);
  const mj_tune_row *lucky = row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_WGMMA, 128);
  cr_assert_float_eq(lucky->us, 100 + 8 + 64 + 12.8 + 4 + 1, 1e-6, "its median, not 10");
  cr_assert_eq(lucky->iters, 3 * 20, "the launches behind its three timings");
  cr_assert_gt(lucky->tflops, 0);
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&s);
}

/* --runoff 1: the heuristic and the fastest candidate; with --keep-within
 * the table's entry for a point joins them, so it is compared on the same
 * terms. */
Test(tune_engine, runoff_counts_and_the_table_entry) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary s;
  cr_assert_eq(run_runoff(&f, 1, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.runoff_timed, 6 * 2 * 2);
  moejit_tune_summary_free(&s);
  mj_tune_rows rows;
  read_results(&rows);
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, "Fake GPU 1", sizeof t.device);
  mj_strlcpy(t.arch, "sm_90a", sizeof t.arch);
  mj_tuned_entry e = entry_from_row(row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_MMA, 64));
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_tuned_table_write(&t, table), MOEJIT_OK, "%s", moejit_last_error());
  mj_tuned_table_free(&t);
  mj_tune_rows_free(&rows);
  ts_rmtree(results);
  fake g = {.wrong_tile_m = 16};
  cr_assert_eq(run_runoff(&g, 1, 15, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.runoff_timed, 6 * 2 * 2 + 2, "gemm1 T=64 also re-times the table's mma tile");
  cr_assert_eq(s.table_kept, 1, "within 15%%: kept");
  moejit_tune_summary_free(&s);
}

/* A finalist that goes wrong in the runoff drops out: the next fastest
 * wins, and the point counts it as wrong. */
Test(tune_engine, runoff_drops_a_finalist_that_goes_wrong) {
  fake f = {.wrong_tile_m = 16, .wrong_later_tile_m = 64};
  moejit_tune_summary s;
  cr_assert_eq(run_runoff(&f, 0, 0, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.n_winners, 6);
  for (size_t i = 0; i < s.n_winners; i++) {
    const moejit_tune_winner *w = &s.winners[i];
    cr_assert(!(w->path == MOEJIT_GEMM_PATH_WGMMA && w->cfg.tile_m == 64 && w->cfg.stages == 4),
              "%s T=%lld: the tile that went wrong in the runoff", w->kernel, (long long)w->tokens);
  }
  cr_assert_eq(s.wrong, 6 + 6, "mma 16 everywhere, wgmma 64 s4 in each runoff");
  cr_assert_eq(s.measured + s.wrong, s.points);
  mj_tune_rows rows;
  read_results(&rows);
  size_t wrong = 0;
  for (size_t i = 0; i < rows.n; i++) {
    const mj_tune_row *r = &rows.rows[i];
    wrong += r->status == MJ_TS_WRONG && r->path == MOEJIT_GEMM_PATH_WGMMA && r->cfg.tile_m == 64;
  }
  cr_assert_eq(wrong, 6, "results.csv records them as wrong");
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&s);
}

Test(tune_engine, resume_times_nothing_twice) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary first, again;
  cr_assert_eq(run(&f, 0, &first), MOEJIT_OK);
  fake f2 = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f2, 0, &again), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f2.measures, 0, "nothing re-timed");
  cr_assert_eq(f2.opens, 0, "no inputs set up");
  cr_assert_eq(again.resumed, first.measured + first.wrong);
  cr_assert_eq(again.n_winners, first.n_winners);
  for (size_t i = 0; i < first.n_winners; i++) {
    cr_assert_float_eq(again.winners[i].us, first.winners[i].us, 1e-3);
    cr_assert_float_eq(again.winners[i].heuristic_us, 1000, 1e-3);
  }
  cr_assert_eq(f2.compiles, 0, "fully measured candidates need no kernel");
  mj_tune_rows rows;
  read_results(&rows);
  cr_assert_eq(rows.n, 6 * 8, "no duplicate rows");
  mj_tune_rows_free(&rows);
  /* another GPU: everything is timed again; the first GPU's rows stay */
  fake f3 = {.device = "Fake GPU 2", .wrong_tile_m = 16};
  moejit_tune_summary other;
  char other_table[2048];
  snprintf(other_table, sizeof other_table, "%s/other.yaml", tmp);
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = other_table;
  mj_tune_backend be = backend(&f3);
  cr_assert_eq(mj_tune_run_backend(sweep, &o, &be, &other), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(other.resumed, 0);
  cr_assert_eq((size_t)f3.measures, other.points + other.runoff_timed, "the sweep's runoff of 3");
  cr_assert_eq(other.runoff_timed, 6 * 4 * 2);
  read_results(&rows);
  cr_assert_eq(rows.n, 2 * 6 * 8);
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&first);
  moejit_tune_summary_free(&again);
  moejit_tune_summary_free(&other);
}

/* Sets the median_us field of every ok row of results.csv to `value`. */
static int rewrite_ok_times(const char *value) {
  char path[2048];
  snprintf(path, sizeof path, "%s/results.csv", results);
  char *text = slurp(results, "results.csv"), *line, *save = NULL;
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  int n = 0;
  for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *ok = strstr(line, ",ok,");
    if (!ok) {
      fprintf(f, "%s\n", line);
      continue;
    }
    char *after = strchr(ok + 4, ','); /* past the median */
    cr_assert_not_null(after);
    fprintf(f, "%.*s,ok,%s%s\n", (int)(ok - line), line, value, after);
    n++;
  }
  fclose(f);
  free(text);
  return n;
}

/* A row no run writes (a time that is not one) is timed again, not
 * resumed: NaN or a negative time would fail the table write at the end of
 * every later run, 0 would write an entry that reads as a pin. */
Test(tune_engine, resume_drops_rows_whose_time_is_not_a_time) {
  static const char *const bad[] = {"nan", "-5.000", "0.000", "inf"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fake f = {.wrong_tile_m = 16};
    moejit_tune_summary first, again;
    cr_assert_eq(run(&f, 0, &first), MOEJIT_OK, "%s", moejit_last_error());
    const int edited = rewrite_ok_times(bad[i]);
    cr_assert_gt(edited, 0);
    fake f2 = {.wrong_tile_m = 16};
    cr_assert_eq(run(&f2, 0, &again), MOEJIT_OK, "%s: %s", bad[i], moejit_last_error());
    cr_expect_eq(f2.measures, edited, "%s: %d rows timed again, %d edited", bad[i], f2.measures,
                 edited);
    cr_expect_eq(again.n_winners, first.n_winners);
    for (size_t w = 0; w < again.n_winners; w++)
      cr_expect(again.winners[w].us > 0 && isfinite(again.winners[w].us), "%s: winner us %g",
                bad[i], again.winners[w].us);
    moejit_tune_summary_free(&first);
    moejit_tune_summary_free(&again);
    ts_rmtree(results);
    unlink(table);
  }
}

/* A resumed row is judged by this sweep's tolerance, not the one it ran
 * under: tightened, a row that passed before is wrong now (and cannot win);
 * loosened, a row found wrong before (never timed) is timed. */
Test(tune_engine, resume_judges_rows_by_the_current_tolerance) {
  static const char loose_text[] = SWEEP_SPACES "}\ncheck: {tolerance: 0.6}\n";
  moejit_sweep *loose = NULL;
  cr_assert_eq(moejit_sweep_load_string(loose_text, strlen(loose_text), "loose.yaml", &loose),
               MOEJIT_OK, "%s", moejit_last_error());
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table, o.jobs = 2, o.runoff = -1;
  fake f = {.wrong_tile_m = 16}; /* rel_err 0.5: ok at 0.6, wrong at 0.02 */
  mj_tune_backend be = backend(&f);
  moejit_tune_summary s1, s2, s3;
  cr_assert_eq(mj_tune_run_backend(loose, &o, &be, &s1), MOEJIT_OK, "%s", moejit_last_error());
  int loose_16 = 0;
  for (size_t w = 0; w < s1.n_winners; w++) loose_16 += s1.winners[w].cfg.tile_m == 16;
  cr_assert_gt(loose_16, 0, "the fake's 16-row mma tile is the fastest when it passes");
  fake f2 = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f2, 0, &s2), MOEJIT_OK, "%s", moejit_last_error()); /* tolerance 0.02 */
  cr_expect_eq(f2.measures, 0, "every row was resumed");
  for (size_t w = 0; w < s2.n_winners; w++)
    cr_expect_neq(s2.winners[w].cfg.tile_m, 16, "a row wrong at this tolerance won (T = %lld)",
                  (long long)s2.winners[w].tokens);
  /* and back: loose again after a strict first run times the wrong rows */
  ts_rmtree(results);
  unlink(table);
  fake f3 = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f3, 0, &s3), MOEJIT_OK);
  moejit_tune_summary_free(&s3);
  fake f4 = {.wrong_tile_m = 16};
  be = backend(&f4);
  cr_assert_eq(mj_tune_run_backend(loose, &o, &be, &s3), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_gt(f4.measures, 0, "rows found wrong before were not timed when they pass now");
  loose_16 = 0;
  for (size_t w = 0; w < s3.n_winners; w++) loose_16 += s3.winners[w].cfg.tile_m == 16;
  cr_expect_gt(loose_16, 0);
  moejit_tune_summary_free(&s1);
  moejit_tune_summary_free(&s2);
  moejit_tune_summary_free(&s3);
  moejit_sweep_destroy(loose);
}

/* Where the results or the table cannot go, the run says so before it
 * compiles or times anything (on a GPU, hours of timing were lost). */
Test(tune_engine, unusable_outputs_are_refused_before_timing) {
  char file[1100], out[2048];
  snprintf(file, sizeof file, "%s/a-file", tmp);
  free(ts_write_file(tmp, "a-file", "x"));
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.jobs = 2, o.runoff = -1;
  moejit_tune_summary s;
  fake f = {0};
  mj_tune_backend be = backend(&f);
  o.results_dir = file, o.out_table = table; /* results dir is a file */
  cr_expect_neq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_OK);
  cr_expect(strstr(moejit_last_error(), "results directory"), "%s", moejit_last_error());
  cr_expect_eq(f.measures + f.compiles, 0, "%d timed, %d compiled first", f.measures, f.compiles);
  moejit_tune_summary_free(&s);
  snprintf(out, sizeof out, "%s/under/t.yaml", file); /* the table's folder is a file */
  o.results_dir = results, o.out_table = out;
  cr_expect_neq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_OK);
  cr_expect_eq(f.measures + f.compiles, 0);
  moejit_tune_summary_free(&s);
  snprintf(out, sizeof out, "%s/results.csv", results); /* the run's own results */
  o.out_table = out;
  cr_expect_eq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "own results.csv"), "%s", moejit_last_error());
  cr_expect_eq(f.measures + f.compiles, 0);
  moejit_tune_summary_free(&s);
}

/* results.csv as a moejit before cluster_n had a column wrote it: that
 * column (the 20th; 1 in every row then) dropped from every line. */
static void drop_cluster_n_column(const char *dir) {
  char *text = slurp(dir, "results.csv");
  mj_buf b = {0};
  size_t lines = 0;
  for (char *line = text; *line; lines++) {
    char *eol = strchr(line, '\n');
    char *end = eol ? eol : line + strlen(line), *p = line;
    for (int commas = 0; commas < 19 && p < end; p++) commas += *p == ',';
    char *q = memchr(p, ',', (size_t)(end - p));
    cr_assert(q, "line %zu has no 20th field", lines);
    *q = '\0';
    cr_assert_str_eq(p, lines ? "1" : "cluster_n", "line %zu", lines);
    mj_buf_append(&b, line, (size_t)(p - line));
    mj_buf_append(&b, q + 1, (size_t)(end - q - 1));
    mj_buf_puts(&b, "\n");
    line = eol ? eol + 1 : end;
  }
  cr_assert(lines > 1 && !b.oom);
  mj_buf_puts(&b, ""); /* NUL-terminated */
  free(ts_write_file(dir, "results.csv", b.data));
  mj_buf_free(&b);
  free(text);
}

/* A results directory of a moejit before cluster_n had a column resumes:
 * its rows read as cluster_n 1, and a sweep that now lists cluster_n 2
 * times only those candidates (a cluster_n 2 candidate is not its
 * cluster_n 1 twin); the results it writes have the column. */
Test(tune_engine, resume_reads_rows_without_cluster_n) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary first, again, third;
  cr_assert_eq(run(&f, 0, &first), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f.measures_cn2, 0);
  drop_cluster_n_column(results);
  moejit_sweep_destroy(sweep);
  sweep = NULL;
  cr_assert_eq(
      moejit_sweep_load_string(kSweepClusterN, strlen(kSweepClusterN), "fake.yaml", &sweep),
      MOEJIT_OK, "%s", moejit_last_error());
  fake f2 = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f2, 0, &again), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(again.resumed, first.measured + first.wrong, "every old row resumed");
  cr_assert_eq(f2.measures, 2 * 3 * 2, "wgmma 64 and 128 on cluster_n 2, per kernel and T");
  cr_assert_eq(f2.measures_cn2, f2.measures, "only cluster_n 2 configs timed");
  char *text = slurp(results, "results.csv");
  cr_assert(strstr(text, ",raster,cluster_m,cluster_n,schedule,"), "the new header:\n%s", text);
  free(text);
  mj_tune_rows rows;
  read_results(&rows);
  cr_assert_eq(rows.n, 6 * 12, "old rows superseded, none doubled: %zu", rows.n);
  size_t cn2 = 0, cn2_ok = 0, cn2_dup = 0;
  for (size_t i = 0; i < rows.n; i++) {
    const mj_tune_row *r = &rows.rows[i];
    if (r->cfg.cluster_n != 2) continue;
    cn2++;
    cn2_ok += r->status == MJ_TS_OK && r->cfg.warps == 8;
    cn2_dup += r->status == MJ_TS_PRUNED && r->cfg.warps == 4 && strstr(r->reason, " cn2 wgmma");
  }
  cr_assert_eq(cn2, 6 * 4, "2 tiles x 2 warps per point");
  cr_assert_eq(cn2_ok, 6 * 2, "timed");
  cr_assert_eq(cn2_dup, 6 * 2, "4 warps duplicate 8 warps, cluster_n 2 kept apart");
  mj_tune_rows_free(&rows);
  fake f3 = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f3, 0, &third), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f3.measures, 0, "the cluster_n 2 rows resume too");
  cr_assert_eq(third.resumed, again.resumed + (size_t)f2.measures);
  moejit_tune_summary_free(&first);
  moejit_tune_summary_free(&again);
  moejit_tune_summary_free(&third);
}

/* Results of a run from before AUTO took the GEMV kernel at decode
 * (MOEJIT_GEMM_GEMV=0 stands in for it): a re-run times the new gemv
 * candidates and, since the T=4 heuristic rows named another launch then,
 * those heuristic rows again; everything else is resumed. */
Test(tune_engine, resume_retimes_a_heuristic_whose_auto_changed) {
  setenv("MOEJIT_GEMM_GEMV", "0", 1);
  fake f = {.wrong_tile_m = 16};
  moejit_tune_summary first, again;
  cr_assert_eq(run(&f, 0, &first), MOEJIT_OK, "%s", moejit_last_error());
  for (size_t i = 0; i < first.n_winners; i++)
    cr_assert_neq(first.winners[i].path, MOEJIT_GEMM_PATH_GEMV);
  unsetenv("MOEJIT_GEMM_GEMV");
  fake f2 = {.wrong_tile_m = 16, .auto_us = 40};
  cr_assert_eq(run(&f2, 0, &again), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f2.measures, 2 * 2, "gemv and the heuristic at T=4, 2 kernels");
  mj_tune_rows rows;
  read_results(&rows);
  size_t heur_t4 = 0;
  for (size_t i = 0; i < rows.n; i++) {
    const mj_tune_row *r = &rows.rows[i];
    if (r->role != MJ_ROLE_HEURISTIC) continue;
    cr_assert_float_eq(r->us, r->tokens == 4 ? 40 : 1000, 1e-9, "T=%lld", (long long)r->tokens);
    heur_t4 += r->tokens == 4;
  }
  cr_assert_eq(heur_t4, 2, "one heuristic row per kernel at T=4, the old one superseded");
  mj_tune_rows_free(&rows);
  for (size_t i = 0; i < again.n_winners; i++) {
    const moejit_tune_winner *w = &again.winners[i];
    cr_assert_float_eq(w->heuristic_us, w->tokens == 4 ? 40 : 1000, 1e-9);
    if (w->tokens == 4) /* AUTO's launch (gemv) was fastest: the winner is its twin */
      cr_assert(w->path == MOEJIT_GEMM_PATH_GEMV && w->us == 40, "%s", w->kernel);
  }
  moejit_tune_summary_free(&first);
  moejit_tune_summary_free(&again);
}

Test(tune_engine, budget_stops_timing_and_resume_finishes) {
  fake f = {.ms_per_measure = 1000};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 5, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f.measures, 5, "one measure per fake second until 5 s are spent");
  cr_assert_eq(s.measured, 5);
  cr_assert_eq(s.skipped_budget, s.points - 5);
  cr_assert(strstr(s.stop_reason, "budget of 5 s"), "%s", s.stop_reason);
  cr_assert_geq(s.n_winners, 0);
  mj_tune_rows rows;
  read_results(&rows);
  cr_assert_eq(count_status(&rows, MJ_TS_SKIPPED_BUDGET), s.skipped_budget);
  mj_tune_rows_free(&rows);
  fake f2 = {0};
  moejit_tune_summary rest;
  cr_assert_eq(run(&f2, 0, &rest), MOEJIT_OK);
  cr_assert_eq((size_t)f2.measures, s.skipped_budget, "only the skipped points are timed");
  cr_assert_eq(rest.resumed, 5);
  cr_assert_eq(rest.n_winners, 6);
  moejit_tune_summary_free(&s);
  moejit_tune_summary_free(&rest);
}

/* A group the budget cut short gets its runoff when a later run finishes
 * it, resumed rows among its finalists; one that goes wrong there moves
 * from resumed to wrong, and the counts still add up to the points. */
Test(tune_engine, runoff_after_a_resume) {
  fake f = {.ms_per_measure = 1000};
  moejit_tune_summary s, rest;
  cr_assert_eq(run(&f, 5, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.measured, 5);
  fake g = {.wrong_later_tile_m = 64};
  cr_assert_eq(run_runoff(&g, 0, 0, &rest), MOEJIT_OK, "%s", moejit_last_error());
  /* wgmma 64 s4 goes wrong at its second timing in this run: in the five
   * fresh groups that is the runoff's first round (it sits out the
   * second), in the resumed one (first timed in the runoff) the second */
  cr_assert_eq(rest.runoff_timed, 6 * 4 * 2 - 5, "%zu", rest.runoff_timed);
  cr_assert_eq(rest.resumed, 5 - 1, "the resumed wgmma 64 s4 went wrong: %zu", rest.resumed);
  cr_assert_eq(rest.wrong, 6, "%zu", rest.wrong);
  cr_assert_eq(rest.measured + rest.resumed + rest.wrong + rest.failed, rest.points);
  cr_assert_eq((size_t)g.measures, rest.points - 5 + rest.runoff_timed);
  moejit_tune_summary_free(&s);
  moejit_tune_summary_free(&rest);
}

Test(tune_engine, compile_and_setup_failures_are_recorded) {
  fake f = {.fail_compile_tile_m = 128, .fail_open_tokens = 512};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_OK, "failures are not fatal: %s", moejit_last_error());
  /* 128-row tiles: wgmma 128x128 of both kernels and their shape tiles
   * 128x256 (the heuristic's and the gemv candidates' modules) */
  cr_assert_eq(s.compile_failed, 4);
  mj_tune_rows rows;
  read_results(&rows);
  size_t compile_failed = count_status(&rows, MJ_TS_COMPILE_FAILED),
         failed = count_status(&rows, MJ_TS_FAILED);
  cr_assert_eq(compile_failed, 2 * 3 * 2 + 2,
               "wgmma 128x128 and the heuristic, 3 T, 2 kernels; gemv at T=4, 2 kernels");
  cr_assert_gt(failed, 0);
  for (size_t i = 0; i < rows.n; i++) {
    if (rows.rows[i].status == MJ_TS_COMPILE_FAILED)
      cr_assert(
          strstr(rows.rows[i].reason, "fake NVRTC failure") && !strchr(rows.rows[i].reason, '\n'),
          "%s", rows.rows[i].reason);
    if (rows.rows[i].status == MJ_TS_FAILED) {
      cr_assert_eq(rows.rows[i].tokens, 512);
      cr_assert(strstr(rows.rows[i].reason, "inputs could not be set up"), "%s",
                rows.rows[i].reason);
    }
  }
  mj_tune_rows_free(&rows);
  cr_assert_eq(s.n_winners, 4, "T=512 has no winner");
  for (size_t i = 0; i < s.n_winners; i++)
    cr_assert_eq(s.winners[i].heuristic_us, 0, "heuristic did not compile");
  moejit_tune_summary_free(&s);
}

Test(tune_engine, dead_gpu_stops_and_keeps_results) {
  fake f = {.die_after = 3};
  moejit_tune_summary s;
  cr_assert_eq(run(&f, 0, &s), MOEJIT_ERR_CUDA);
  cr_assert(strstr(moejit_last_error(), "ILLEGAL_ADDRESS"), "%s", moejit_last_error());
  cr_assert_eq(f.measures, 3, "nothing launched after the failure");
  cr_assert(strstr(s.stop_reason, "re-run to resume"), "%s", s.stop_reason);
  mj_tune_rows rows;
  read_results(&rows);
  cr_assert_eq(count_status(&rows, MJ_TS_OK), 2);
  cr_assert_eq(count_status(&rows, MJ_TS_FAILED), 1);
  cr_assert_eq(count_status(&rows, MJ_TS_NOT_TIMED), s.points - 3);
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&s);
}

Test(tune_engine, dry_run_and_compile_only_write_nothing) {
  fake f = {0};
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table, o.dry_run = 1;
  mj_tune_backend be = backend(&f);
  moejit_tune_summary s;
  cr_assert_eq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_OK);
  cr_assert_eq(f.compiles, 0);
  cr_assert_eq(s.enumerated, 16);
  cr_assert_eq(s.points, 6 * 6, "per group the heuristic and 5 candidates");
  o.dry_run = 0;
  be.can_time = 0; /* compile only */
  cr_assert_eq(mj_tune_run_backend(sweep, &o, &be, &s), MOEJIT_OK);
  cr_assert_eq(f.compiles, 12);
  cr_assert_eq(f.measures, 0);
  cr_assert_eq(s.timed, 0);
  cr_assert_eq(ts_count_files(tmp, NULL), 0, "nothing written");
  moejit_tune_summary_free(&s);
}

/* ---- host data ------------------------------------------------------------------ */

Test(tune_data, routing_and_sampled_rows) {
  int32_t off[65];
  for (int64_t tokens = 1; tokens <= 4096; tokens *= 8) {
    int active = mj_tune_route(64, 8, tokens, 7, off, NULL);
    cr_assert_eq(off[0], 0);
    cr_assert_eq(off[64], tokens * 8);
    int nonempty = 0;
    for (int e = 0; e < 64; e++) {
      cr_assert_geq(off[e + 1], off[e]);
      nonempty += off[e + 1] > off[e];
      cr_assert_leq(off[e + 1] - off[e], tokens, "an expert appears once per token at most");
    }
    cr_assert_eq(active, nonempty);
    if (tokens == 1) cr_assert_eq(active, 8, "k distinct experts");
    int64_t rows[8];
    int n = mj_tune_check_rows(off, 64, 8, 3, rows);
    cr_assert_eq(n, 8);
    for (int i = 0; i < n; i++) {
      cr_assert(rows[i] >= 0 && rows[i] < tokens * 8);
      for (int j = 0; j < i; j++) cr_assert_neq(rows[i], rows[j]);
    }
  }
  int32_t same[65];
  mj_tune_route(64, 8, 100, 7, off, NULL);
  mj_tune_route(64, 8, 100, 7, same, NULL);
  cr_assert(!memcmp(off, same, sizeof off), "seeded: the same routing");
}

/* The gathering GEMM 1's x rows: align's sorted_slot for a routing
 * (distinct tokens ascending inside each expert, every token k times),
 * scattered over x rather than consecutive. */
Test(tune_data, gather_rows_follow_the_routing) {
  int32_t off[65];
  for (int64_t tokens = 1; tokens <= 4096; tokens *= 8) {
    const int64_t rows = tokens * 8;
    int32_t *choice = malloc((size_t)rows * sizeof *choice), same[65];
    cr_assert(choice);
    mj_tune_route(64, 8, tokens, 11, off, choice);
    mj_tune_route(64, 8, tokens, 11, same, NULL);
    cr_assert(!memcmp(off, same, sizeof off), "the same routing with or without its picks");
    int32_t *x_row = malloc((size_t)rows * sizeof *x_row);
    int *seen = calloc((size_t)tokens, sizeof *seen);
    cr_assert(x_row && seen);
    cr_assert_eq(mj_tune_sorted_slots(choice, off, 64, rows, x_row), 0);
    for (int64_t r = 0; r < rows; r++) x_row[r] /= 8; /* slot -> token */
    int64_t runs = 0, pairs = 0;
    for (int e = 0; e < 64; e++)
      for (int32_t r = off[e]; r < off[e + 1]; r++) {
        cr_assert(x_row[r] >= 0 && x_row[r] < tokens, "row %d: token %d", r, x_row[r]);
        seen[x_row[r]]++;
        if (r > off[e]) {
          cr_assert_gt(x_row[r], x_row[r - 1], "expert %d: tokens distinct and ascending", e);
          pairs++, runs += x_row[r] == x_row[r - 1] + 1;
        }
      }
    for (int64_t t = 0; t < tokens; t++)
      cr_assert_eq(seen[t], 8, "token %lld: k rows", (long long)t);
    /* consecutive rows of an expert hold consecutive tokens about as often
     * as top-k routing makes them (k / E = 1/8), not always */
    if (tokens >= 512) cr_assert_lt(runs, pairs / 4, "%lld of %lld pairs consecutive", runs, pairs);
    int32_t *again = malloc((size_t)rows * sizeof *again);
    cr_assert(again);
    cr_assert_eq(mj_tune_sorted_slots(choice, off, 64, rows, again), 0);
    for (int64_t r = 0; r < rows; r++) again[r] /= 8;
    cr_assert(!memcmp(x_row, again, (size_t)rows * sizeof *again), "seeded: the same rows");
    free(again), free(seen), free(x_row), free(choice);
  }
}

static double naive(const mj_tune_data *d, const moejit_spec *s, int which, int expert, int64_t row,
                    int64_t col, size_t a_off, size_t w_off) {
  int64_t k = which == 1 ? s->hidden : s->expert_width,
          wr = which == 1 ? 2 * s->expert_width : s->hidden;
  double g = 0, u = 0;
  for (int64_t i = 0; i < k; i++) {
    double a = d->lut[d->chunk[(a_off + (size_t)(row * k + i)) % d->n]];
    g += a * d->lut[d->chunk[(w_off + (size_t)((expert * wr + col) * k + i)) % d->n]];
    if (which == 1)
      u += a * d->lut[d->chunk[(w_off + (size_t)((expert * wr + s->expert_width + col) * k + i)) %
                               d->n]];
  }
  return which == 1 ? g / (1 + exp(-g)) * u : g;
}

Test(tune_data, reference_matches_a_naive_one) {
  moejit_spec s;
  moejit_spec_init(&s);
  s.hidden = 96, s.expert_width = 40, s.experts = 4, s.top_k = 2;
  static mj_tune_data d; /* its lookup table is 512 KiB */
  for (int dt = 0; dt < 2; dt++) {
    cr_assert_eq(mj_tune_data_make(&d, dt ? MOEJIT_DTYPE_FP16 : MOEJIT_DTYPE_BF16, 96, 1000, 5),
                 MOEJIT_OK);
    for (size_t i = 0; i < d.n; i++) {
      double v = fabs(d.lut[d.chunk[i]]);
      cr_assert(v >= ldexp(1, -d.scale_exp) && v < ldexp(2, -d.scale_exp), "values +-[1,2)*2^-e");
    }
    int32_t off[5];
    mj_tune_route(4, 2, 20, 9, off, NULL);
    int64_t rows[6];
    int n = mj_tune_check_rows(off, 4, 6, 1, rows);
    for (int which = 1; which <= 2; which++) {
      int64_t cols = which == 1 ? s.expert_width : s.hidden;
      double ref[6 * 96];
      mj_tune_reference(&d, &s, which, off, rows, n, 123, 0, NULL, 777, 2, ref);
      for (int r = 0; r < n; r++) {
        int e = 0;
        while (off[e + 1] <= rows[r]) e++;
        for (int64_t c = 0; c < cols; c++)
          cr_assert_float_eq(ref[r * cols + c], naive(&d, &s, which, e, rows[r], c, 123, 777),
                             1e-12);
      }
      /* A repeating every 7 rows (GEMM 1's inputs on the GPU, which x's rows
       * gather to): row r multiplies A row r % 7 with its own expert's W */
      mj_tune_reference(&d, &s, which, off, rows, n, 123, 7, NULL, 777, 2, ref);
      for (int r = 0; r < n; r++) {
        int e = 0;
        while (off[e + 1] <= rows[r]) e++;
        for (int64_t c = 0; c < cols; c++)
          cr_assert_float_eq(ref[r * cols + c], naive(&d, &s, which, e, rows[r] % 7, c, 123, 777),
                             1e-12);
      }
      /* A rows named by a map (a gathering GEMM 1's x rows): row r
       * multiplies pattern row map[r] with its own expert's W */
      int32_t map[40];
      for (int r = 0; r < 40; r++) map[r] = (r * 13 + 5) % 20;
      mj_tune_reference(&d, &s, which, off, rows, n, 123, 7, map, 777, 2, ref);
      for (int r = 0; r < n; r++) {
        int e = 0;
        while (off[e + 1] <= rows[r]) e++;
        for (int64_t c = 0; c < cols; c++)
          cr_assert_float_eq(ref[r * cols + c], naive(&d, &s, which, e, map[rows[r]], c, 123, 777),
                             1e-12);
      }
      /* the error measure: exact bits give 0, a NaN gives infinity */
      uint16_t got[96];
      double want[96];
      for (int i = 0; i < 96; i++) got[i] = d.chunk[i], want[i] = d.lut[d.chunk[i]];
      cr_assert_float_eq(mj_tune_rel_error(&d, got, want, 96), 0, 1e-15);
      want[3] *= 1.5;
      cr_assert_gt(mj_tune_rel_error(&d, got, want, 96), 1e-3);
      got[5] = 0xffff;
      cr_assert(isinf(mj_tune_rel_error(&d, got, want, 96)));
    }
    mj_tune_data_free(&d);
  }
}

/* The fastest ok candidate row of GEMM `which` at T = tokens on `path` with
 * tile_m (wgmma 64-row tiles come as the sweep's and as AUTO's narrow one). */
static const mj_tune_row *row_of(const mj_tune_rows *rows, int which, int64_t tokens,
                                 moejit_gemm_path path, int tile_m) {
  const mj_tune_row *best = NULL;
  for (size_t i = 0; i < rows->n; i++) {
    const mj_tune_row *r = &rows->rows[i];
    if (r->role == MJ_ROLE_CANDIDATE && r->status == MJ_TS_OK && r->which == which &&
        r->tokens == tokens && r->path == path && r->cfg.tile_m == tile_m &&
        (!best || r->us < best->us))
      best = r;
  }
  cr_assert_not_null(best, "no ok row: gemm%d T=%lld path %d tile_m %d", which, (long long)tokens,
                     (int)path, tile_m);
  return best;
}

static mj_tuned_entry entry_from_row(const mj_tune_row *r) {
  mj_tuned_entry e = {.dtype = r->dtype,
                      .hidden = r->hidden,
                      .expert_width = r->expert_width,
                      .experts = r->experts,
                      .top_k = r->top_k,
                      .tokens = r->tokens,
                      .cfg = r->cfg,
                      .path = r->path,
                      .us = 1};
  mj_strlcpy(e.kernel, r->which == 1 ? "gemm1" : "gemm2", sizeof e.kernel);
  return e;
}

/* A first run of the fake sweep (results and table written) and its rows. */
static void first_run(moejit_tune_summary *first, mj_tune_rows *rows) {
  fake f = {.wrong_tile_m = 16};
  cr_assert_eq(run(&f, 0, first), MOEJIT_OK, "%s", moejit_last_error());
  read_results(rows);
}

/* A re-tune into the same table, resumed from the first run's results (so
 * nothing is timed again), with keep_within and replace_pinned. */
static void retune(double keep_within, int replace_pinned, moejit_tune_summary *s) {
  fake f = {.wrong_tile_m = 16};
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table;
  o.keep_within = keep_within, o.replace_pinned = replace_pinned;
  mj_tune_backend be = backend(&f);
  cr_assert_eq(mj_tune_run_backend(sweep, &o, &be, s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(f.measures, 0, "resumed: nothing timed again");
}

/* keep_within: a re-tune (here resumed from the first run's results, so
 * nothing is timed again) keeps an entry whose configuration it timed
 * within the margin of the winner, with this run's time; an entry further
 * off, or whose configuration the run did not time, gives way to the
 * winner. In the fake's times the winner (wgmma 64x128) beats mma 64x128
 * by 11% and wgmma 128x128 by 20% at T = 64. */
Test(tune_engine, keep_within_keeps_close_entries_and_replaces_the_rest) {
  moejit_tune_summary first;
  mj_tune_rows rows;
  first_run(&first, &rows);
  const mj_tune_row *close = row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_MMA, 64);
  const mj_tune_row *far = row_of(&rows, 2, 64, MOEJIT_GEMM_PATH_WGMMA, 128);
  const mj_tune_row *win1 = row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_WGMMA, 64);
  const mj_tune_row *win2 = row_of(&rows, 2, 64, MOEJIT_GEMM_PATH_WGMMA, 64);
  cr_assert(close->us > win1->us && close->us < win1->us * 1.15, "%g vs %g", close->us, win1->us);
  cr_assert(far->us > win2->us * 1.15, "%g vs %g", far->us, win2->us);

  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, "Fake GPU 1", sizeof t.device);
  mj_strlcpy(t.arch, "sm_90a", sizeof t.arch);
  mj_tuned_entry e = entry_from_row(close);
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  e = entry_from_row(far);
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  e = entry_from_row(row_of(&rows, 1, 512, MOEJIT_GEMM_PATH_WGMMA, 64));
  e.cfg.tile_m = 256, e.cfg.tile_n = 256; /* a tile this sweep never times */
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_tuned_table_write(&t, table), MOEJIT_OK, "%s", moejit_last_error());
  mj_tuned_table_free(&t);

  moejit_tune_summary again;
  retune(15, 0, &again);
  cr_assert_eq(again.table_kept, 1);
  cr_assert_eq(again.table_entries, first.n_winners);

  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  const mj_sweep_shape *sh = &sweep->shapes[0];
  mj_tuned_match m;
  const mj_tuned_entry *got = mj_tuned_lookup(&t, "gemm1", &sh->spec, 64, &m);
  cr_assert(got && m == MJ_TUNED_EXACT);
  cr_assert_eq(got->path, MOEJIT_GEMM_PATH_MMA, "within 15%%: the entry keeps mma");
  cr_assert_eq(got->cfg.tile_m, 64);
  cr_assert_eq(got->cfg.stages, close->cfg.stages);
  cr_assert_float_eq(got->us, close->us, 1e-3, "with this run's time");
  got = mj_tuned_lookup(&t, "gemm2", &sh->spec, 64, &m);
  cr_assert(got && m == MJ_TUNED_EXACT);
  cr_assert_eq(got->path, MOEJIT_GEMM_PATH_WGMMA);
  cr_assert_eq(got->cfg.tile_m, 64, "20%% slower: the winner replaces it");
  cr_assert_float_eq(got->us, win2->us, 1e-3);
  got = mj_tuned_lookup(&t, "gemm1", &sh->spec, 512, &m);
  cr_assert(got && m == MJ_TUNED_EXACT);
  cr_assert_eq(got->cfg.tile_m, 64, "never timed in this run: the winner replaces it");
  cr_assert_eq(got->cfg.tile_n, 128);
  mj_tuned_table_free(&t);
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&first);
  moejit_tune_summary_free(&again);
}

/* A layer check's pins survive a re-tune: the winner of a pinned point is
 * not written there (and is counted), every other point is; with
 * replace_pinned (what --check-layer sets) the winner replaces the pin and
 * the entry is no longer marked. */
Test(tune_engine, pinned_entries_survive_a_retune_unless_replaced) {
  moejit_tune_summary first;
  mj_tune_rows rows;
  first_run(&first, &rows);
  const mj_tune_row *pinned_row = row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_MMA, 64);
  const mj_tune_row *win1 = row_of(&rows, 1, 64, MOEJIT_GEMM_PATH_WGMMA, 64);
  cr_assert(pinned_row->us > win1->us, "the pin must not be the winner");

  mj_tuned_table t;
  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  const size_t n_before = t.n;
  mj_tuned_entry e = entry_from_row(pinned_row);
  e.us = 0, e.pinned = 1;
  cr_assert_eq(mj_tuned_table_put(&t, &e), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_tuned_table_write(&t, table), MOEJIT_OK, "%s", moejit_last_error());
  mj_tuned_table_free(&t);

  const mj_sweep_shape *sh = &sweep->shapes[0];
  for (int replace = 0; replace < 2; replace++) {
    moejit_tune_summary again;
    retune(0, replace, &again);
    cr_expect_eq(again.table_pinned_kept, replace ? 0u : 1u, "replace_pinned %d", replace);
    cr_expect_eq(again.table_entries, first.n_winners - (replace ? 0 : 1));
    cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
    cr_expect_eq(t.n, n_before, "no entry added or lost");
    mj_tuned_match m;
    const mj_tuned_entry *got = mj_tuned_lookup(&t, "gemm1", &sh->spec, 64, &m);
    cr_assert(got && m == MJ_TUNED_EXACT);
    if (!replace) {
      cr_expect(got->pinned && got->path == MOEJIT_GEMM_PATH_MMA && got->us == 0,
                "the pin stays as it was");
    } else {
      cr_expect(!got->pinned && got->path == MOEJIT_GEMM_PATH_WGMMA, "the winner replaces it");
      cr_expect_float_eq(got->us, win1->us, 1e-3);
    }
    got = mj_tuned_lookup(&t, "gemm2", &sh->spec, 64, &m);
    cr_expect(got && !got->pinned && got->path == MOEJIT_GEMM_PATH_WGMMA, "other points written");
    mj_tuned_table_free(&t);
    moejit_tune_summary_free(&again);
  }
  mj_tune_rows_free(&rows);
  moejit_tune_summary_free(&first);
}

/* A measured wgmma row of the smoke shape (512 x 256, 8 experts, top-2,
 * bf16) on a fake GPU: GEMM `which` at `tokens`, `us` with cfg. */
static mj_tune_row tiny_wgmma_row(int which, int64_t tokens, double us, moejit_gemm_cfg cfg) {
  mj_tune_row r;
  memset(&r, 0, sizeof r);
  strcpy(r.device, "Fake GPU");
  strcpy(r.arch, "sm_90a");
  strcpy(r.shape, "tiny");
  strcpy(r.date, "2026-01-01");
  r.which = which, r.dtype = MOEJIT_DTYPE_BF16, r.hidden = 512, r.expert_width = 256;
  r.experts = 8, r.top_k = 2, r.tokens = tokens, r.role = MJ_ROLE_CANDIDATE;
  r.path = MOEJIT_GEMM_PATH_WGMMA, r.status = MJ_TS_OK, r.us = us, r.iters = 20;
  r.cfg = cfg;
  return r;
}

/* results.csv and results.json name each schedule (pingpong included) and
 * the CSV reads back to the same value; moejit_gemm_cfg_text names it after the
 * tile (cooperative, the default, unnamed). */
Test(tune_results, every_schedule_round_trips_through_csv_and_json) {
  static const moejit_gemm_schedule kScheds[] = {MOEJIT_SCHEDULE_COOPERATIVE,
                                                 MOEJIT_SCHEDULE_PINGPONG};
  static const char *const kNames[] = {"cooperative", "pingpong"};
  static const char *const kStrs[] = {"64x256x64 s4 w8", "64x256x64 s4 w8 pingpong"};
  char *dir = ts_mkdtemp("tune-sched");
  char csv[2048], json[2048];
  snprintf(csv, sizeof csv, "%s/results.csv", dir);
  snprintf(json, sizeof json, "%s/results.json", dir);
  mj_tune_rows rows = {0}, back;
  moejit_tune_winner w[MJ_ARRAY_LEN(kScheds)];
  memset(w, 0, sizeof w);
  for (size_t i = 0; i < MJ_ARRAY_LEN(kScheds); i++) {
    mj_tune_row r = tiny_wgmma_row(
        1, 64, 10 + (double)i,
        (moejit_gemm_cfg){64, 256, 64, 4, 8, 1, 1, MOEJIT_RASTER_ALONG_M, kScheds[i]});
    r.copy_us = 2.5 * (double)i; /* 0: gathers; else the permuted copy's charge */
    cr_assert_eq(mj_tune_rows_push(&rows, &r), MOEJIT_OK);
    char cfg[96];
    moejit_gemm_cfg_text(&r.cfg, cfg, sizeof cfg);
    cr_expect_str_eq(cfg, kStrs[i]);
    strcpy(w[i].kernel, "gemm1"), strcpy(w[i].shape, "tiny");
    w[i].cfg = r.cfg, w[i].path = MOEJIT_GEMM_PATH_WGMMA, w[i].us = r.us, w[i].tokens = 64;
  }
  cr_assert_eq(mj_tune_write_csv(&rows, csv), MOEJIT_OK, "%s", moejit_last_error());
  char *text = slurp(dir, "results.csv");
  for (size_t i = 0; i < MJ_ARRAY_LEN(kNames); i++) {
    char want[64];
    snprintf(want, sizeof want, ",along_m,1,1,%s,ok,", kNames[i]);
    cr_expect_eq(ts_count_substr(text, want), 1, "want '%s' in:\n%s", want, text);
  }
  free(text);
  cr_assert_eq(mj_tune_read_csv(csv, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(back.n, rows.n);
  for (size_t i = 0; i < back.n; i++) {
    cr_expect_eq(back.rows[i].cfg.schedule, kScheds[i], "row %zu", i);
    cr_expect(mj_tune_row_same(&back.rows[i], &rows.rows[i]), "row %zu", i);
    cr_expect_float_eq(back.rows[i].copy_us, rows.rows[i].copy_us, 1e-9, "row %zu", i);
    cr_expect_float_eq(back.rows[i].us, rows.rows[i].us, 1e-9, "row %zu", i);
  }
  mj_tune_meta meta = {"s", "Fake GPU", "sm_90a", "12.8", "2026-01-01", 12080};
  cr_assert_eq(mj_tune_write_json(&rows, &meta, w, MJ_ARRAY_LEN(w), json), MOEJIT_OK, "%s",
               moejit_last_error());
  text = slurp(dir, "results.json");
  cr_assert(ts_json_valid(text), "not JSON:\n%s", text);
  cr_expect_eq(ts_count_substr(text, "\"copy_us\":2.5"), 1, "the copy's charge in:\n%s", text);
  for (size_t i = 0; i < MJ_ARRAY_LEN(kNames); i++) {
    char want[64];
    snprintf(want, sizeof want, "\"schedule\":\"%s\"", kNames[i]);
    cr_expect_eq(ts_count_substr(text, want), 2, "a winner and a row: '%s'", want);
  }
  free(text);
  mj_tune_rows_free(&rows), mj_tune_rows_free(&back);
  ts_rmtree(dir);
  free(dir);
}

/* A results.csv of a moejit before GEMM 1 was timed as the layer runs it
 * (no copy_us column) resumes nothing: its GEMM 1 times are of another
 * measure, so every point is timed again. */
Test(tune_results, rows_without_copy_us_are_not_resumed) {
  char *dir = ts_mkdtemp("tune-old-csv");
  char csv[2048];
  snprintf(csv, sizeof csv, "%s/results.csv", dir);
  FILE *f = fopen(csv, "wb");
  cr_assert(f);
  fputs(
      "device,arch,shape,kernel,dtype,hidden,expert_width,experts,top_k,tokens,role,path,"
      "tile_m,tile_n,tile_k,stages,warps,raster,cluster_m,schedule,status,median_us,tflops,"
      "gbs,rel_err,iters,date,reason\n"
      "Fake GPU,sm_90a,tiny,gemm1,bf16,512,256,8,2,64,candidate,wgmma,64,256,64,4,8,along_m,1,"
      "cooperative,ok,10.000,1.000,1.00,0.001,20,2026-01-01,\n",
      f);
  fclose(f);
  mj_tune_rows back;
  cr_assert_eq(mj_tune_read_csv(csv, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_eq(back.n, 0, "an old row was read back");
  mj_tune_rows_free(&back);
  ts_rmtree(dir);
  free(dir);
}

/* results.csv has a cluster_n column after cluster_m and results.json a
 * "cluster_n"; a row reads back with its own cluster_n, and rows that
 * differ only there are not the same row. A results.csv of a moejit before
 * that column (29 fields) reads as cluster_n 1, every later field in place. */
Test(tune_results, cluster_n_round_trips_and_old_rows_read_as_1) {
  char *dir = ts_mkdtemp("tune-cluster-n");
  char csv[2048], json[2048];
  snprintf(csv, sizeof csv, "%s/results.csv", dir);
  snprintf(json, sizeof json, "%s/results.json", dir);
  mj_tune_rows rows = {0}, back;
  moejit_tune_winner w;
  memset(&w, 0, sizeof w);
  for (int cn = 1; cn <= 2; cn++) {
    mj_tune_row r =
        tiny_wgmma_row(2, 512, 10 * cn,
                       (moejit_gemm_cfg){128, 128, 64, 4, 8, 1, cn, MOEJIT_RASTER_ALONG_M,
                                         MOEJIT_SCHEDULE_COOPERATIVE});
    cr_assert_eq(mj_tune_rows_push(&rows, &r), MOEJIT_OK);
    if (cn == 2) {
      strcpy(w.kernel, "gemm2"), strcpy(w.shape, "tiny");
      w.cfg = r.cfg, w.path = r.path, w.us = r.us, w.tokens = r.tokens;
    }
  }
  cr_assert_not(mj_tune_row_same(&rows.rows[0], &rows.rows[1]), "cluster_n tells them apart");
  cr_assert_eq(mj_tune_write_csv(&rows, csv), MOEJIT_OK, "%s", moejit_last_error());
  char *text = slurp(dir, "results.csv");
  cr_expect(strstr(text, ",raster,cluster_m,cluster_n,schedule,status,"), "header:\n%s", text);
  cr_expect_eq(ts_count_substr(text, ",along_m,1,1,cooperative,ok,"), 1, "%s", text);
  cr_expect_eq(ts_count_substr(text, ",along_m,1,2,cooperative,ok,"), 1, "%s", text);
  free(text);
  cr_assert_eq(mj_tune_read_csv(csv, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(back.n, 2);
  for (size_t i = 0; i < back.n; i++) {
    cr_expect_eq(back.rows[i].cfg.cluster_m, 1, "row %zu", i);
    cr_expect_eq(back.rows[i].cfg.cluster_n, (int)i + 1, "row %zu", i);
    cr_expect(mj_tune_row_same(&back.rows[i], &rows.rows[i]), "row %zu", i);
    cr_expect_float_eq(back.rows[i].us, rows.rows[i].us, 1e-9, "row %zu", i);
  }
  mj_tune_rows_free(&back);
  mj_tune_meta meta = {"s", "Fake GPU", "sm_90a", "12.8", "2026-01-01", 12080};
  cr_assert_eq(mj_tune_write_json(&rows, &meta, &w, 1, json), MOEJIT_OK, "%s", moejit_last_error());
  text = slurp(dir, "results.json");
  cr_assert(ts_json_valid(text), "not JSON:\n%s", text);
  cr_expect_eq(ts_count_substr(text, "\"cluster_m\":1,\"cluster_n\":1,"), 1, "a row:\n%s", text);
  cr_expect_eq(ts_count_substr(text, "\"cluster_m\":1,\"cluster_n\":2,"), 2,
               "the winner and its row:\n%s", text);
  free(text);

  FILE *f = fopen(csv, "wb");
  cr_assert(f);
  fputs(
      "device,arch,shape,kernel,dtype,hidden,expert_width,experts,top_k,tokens,role,path,"
      "tile_m,tile_n,tile_k,stages,warps,raster,cluster_m,schedule,status,median_us,tflops,"
      "gbs,rel_err,iters,copy_us,date,reason\n"
      "Fake GPU,sm_90a,tiny,gemm2,bf16,512,256,8,2,512,candidate,wgmma,128,128,64,4,8,along_m,1,"
      "cooperative,ok,10.000,1.500,2.50,0.001,20,0.000,2026-01-01,\n"
      "Fake GPU,sm_90a,tiny,gemm2,bf16,512,256,8,2,512,candidate,wgmma,128,128,64,4,8,along_n,2,"
      "pingpong,wrong,0.000,0.000,0.00,0.5,7,1.250,2026-01-02,rel_err 0.5\n",
      f);
  fclose(f);
  cr_assert_eq(mj_tune_read_csv(csv, &back), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(back.n, 2, "old rows read back");
  const mj_tune_row *a = &back.rows[0], *b = &back.rows[1];
  cr_expect_eq(a->cfg.cluster_n, 1);
  cr_expect(mj_tune_row_same(a, &rows.rows[0]), "resumes as the cluster_n 1 candidate");
  cr_expect_not(mj_tune_row_same(a, &rows.rows[1]), "not as its cluster_n 2 twin");
  cr_expect_float_eq(a->us, 10, 1e-9);
  cr_expect_float_eq(a->tflops, 1.5, 1e-9);
  cr_expect_float_eq(a->gbs, 2.5, 1e-9);
  cr_expect_eq(a->iters, 20);
  cr_expect_str_eq(a->date, "2026-01-01");
  cr_expect_eq(b->cfg.cluster_m, 2);
  cr_expect_eq(b->cfg.cluster_n, 1);
  cr_expect_eq(b->cfg.raster, MOEJIT_RASTER_ALONG_N);
  cr_expect_eq(b->cfg.schedule, MOEJIT_SCHEDULE_PINGPONG);
  cr_expect_eq(b->status, MJ_TS_WRONG);
  cr_expect_float_eq(b->rel_err, 0.5, 1e-9);
  cr_expect_eq(b->iters, 7);
  cr_expect_float_eq(b->copy_us, 1.25, 1e-9);
  cr_expect_str_eq(b->date, "2026-01-02");
  cr_expect_str_eq(b->reason, "rel_err 0.5");
  mj_tune_rows_free(&rows), mj_tune_rows_free(&back);
  ts_rmtree(dir);
  free(dir);
}

/* The median the GPU backend and the runoff keep: the middle value, or the
 * mean of the middle two, of unsorted timings. */
Test(tune_data, median_of_unsorted_values) {
  double odd[] = {5, 1, 4, 2, 3}, even[] = {9, 1, 7, 3}, one[] = {2.5};
  cr_expect_float_eq(mj_tune_median(odd, 5), 3, 1e-12);
  cr_expect_float_eq(mj_tune_median(even, 4), 5, 1e-12);
  cr_expect_float_eq(mj_tune_median(one, 1), 2.5, 1e-12);
  cr_expect(odd[0] == 1 && odd[4] == 5, "sorted in place");
}
