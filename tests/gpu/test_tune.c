/* The autotuner on a GPU, end to end on configs/sweeps/smoke.yaml: every
 * candidate checks out against the reference, each (kernel, T) gets a
 * winner, the tuned table's entries run on their path and tile and match
 * the float64 reference on fresh data, and a second run re-times nothing.
 * Skips without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "moejit/moejit.h"
#include "ops/gemm.h"
#include "ref_gemm.h"
#include "test_support.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

#define SMOKE MOEJIT_TEST_SOURCE_DIR "/configs/sweeps/smoke.yaml"

static moejit_ctx *ctx_or_skip(void) {
  char why[512];
  if (!ts_gpu_available(why, sizeof why)) cr_skip_test("no GPU: %s", why);
  moejit_ctx *ctx = NULL;
  cr_assert_eq(moejit_ctx_create(&ctx, NULL), MOEJIT_OK, "%s", moejit_last_error());
  return ctx;
}

static void *upload(moejit_ctx *ctx, const void *host, size_t bytes) {
  void *d = NULL;
  cr_assert_eq(moejit_mem_alloc(ctx, bytes, NULL, &d), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(moejit_memcpy_htod(ctx, d, host, bytes, NULL), MOEJIT_OK);
  return d;
}

/* Runs one table entry's GEMM (its path and tile, exactly) on fresh random
 * data of the entry's shape and compares with the float64 reference. */
static void entry_runs(moejit_ctx *ctx, const mj_tuned_entry *e, const moejit_spec *shape,
                       ts_rng *rng) {
  moejit_spec spec = *shape;
  int which = e->kernel[4] - '0';
  if (which == 1)
    spec.gemm1 = e->cfg;
  else
    spec.gemm2 = e->cfg;
  cr_assert_eq(moejit_spec_validate(&spec), MOEJIT_OK, "%s", moejit_last_error());
  int64_t rows = e->tokens * spec.top_k, k = which == 1 ? spec.hidden : spec.expert_width;
  int64_t n = which == 1 ? spec.expert_width : spec.hidden, wr = which == 1 ? 2 * n : n;
  int32_t off[1025];
  mj_tune_route(spec.experts, spec.top_k, e->tokens, ts_next(rng), off, NULL);
  size_t a_n = (size_t)(rows * k), w_n = (size_t)(spec.experts * wr * k), o_n = (size_t)(rows * n);
  uint16_t *a = malloc(a_n * 2), *w = malloc(w_n * 2), *out = malloc(o_n * 2);
  double *ref = malloc(o_n * sizeof *ref);
  cr_assert(a && w && out && ref);
  mj_tune_data *d = malloc(sizeof *d); /* 512 KiB lookup table inside */
  cr_assert(d);
  cr_assert_eq(mj_tune_data_make(d, spec.act_dtype, k, 1 << 16, ts_next(rng)), MOEJIT_OK);
  for (size_t i = 0; i < a_n; i++) a[i] = d->chunk[ts_next(rng) % d->n];
  for (size_t i = 0; i < w_n; i++) w[i] = d->chunk[ts_next(rng) % d->n];
  void *da = upload(ctx, a, a_n * 2), *dw = upload(ctx, w, w_n * 2),
       *doff = upload(ctx, off, sizeof(int32_t) * (size_t)(spec.experts + 1));
  void *dout = NULL;
  cr_assert_eq(moejit_mem_alloc(ctx, o_n * 2, NULL, &dout), MOEJIT_OK);
  cr_assert_eq(moejit_memset_d32(ctx, dout, 0xffffffffu, o_n / 2, NULL), MOEJIT_OK);
  moejit_gemm_args args = {
      .a = da, .w = dw, .out = dout, .expert_offsets = doff, .max_rows = rows, .path = e->path};
  moejit_status st = which == 1 ? moejit_gemm1_swiglu(ctx, &spec, &args, NULL)
                                : moejit_gemm2(ctx, &spec, &args, NULL);
  cr_assert_eq(st, MOEJIT_OK, "%s T=%lld on %s: %s", e->kernel, (long long)e->tokens,
               moejit_gemm_path_name(e->path), moejit_last_error());
  cr_assert_eq(moejit_memcpy_dtoh(ctx, out, dout, o_n * 2, NULL), MOEJIT_OK);
  cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
  ref_gemm_problem p = {spec.act_dtype, spec.weight_dtype, a, w, off, NULL, spec.experts,
                        spec.hidden,    spec.expert_width};
  if (which == 1)
    ref_gemm1_swiglu(&p, ref);
  else
    ref_gemm2(&p, ref);
  double err = ref_gemm_rel_error(spec.act_dtype, out, ref, o_n);
  cr_assert_leq(err, 2e-2, "%s T=%lld %dx%dx%d s%d on %s: relative error %g", e->kernel,
                (long long)e->tokens, e->cfg.tile_m, e->cfg.tile_n, e->cfg.tile_k, e->cfg.stages,
                moejit_gemm_path_name(e->path), err);
  moejit_mem_free(ctx, da, NULL), moejit_mem_free(ctx, dw, NULL);
  moejit_mem_free(ctx, doff, NULL), moejit_mem_free(ctx, dout, NULL);
  mj_tune_data_free(d);
  free(d), free(a), free(w), free(out), free(ref);
}

/* GEMM 1 as the layer runs it (docs/tune.md): a candidate whose plan the
 * layer gathers with (64-row tiles always) reads x's rows through the index
 * and passes the check on them, uncharged; one the layer copies for (256
 * rows) is charged the copy, also when $MOEJIT_GEMM1_GATHER=0 keeps the
 * 64-row tile on the copy; GEMM 2 is neither. On the GPU backend itself. */
Test(tune_gpu, gemm1_timed_as_the_layer_runs_it, .timeout = 300) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_device_info info;
  cr_assert_eq(moejit_ctx_device_info(ctx, &info), MOEJIT_OK);
  if (strcmp(info.arch, "sm_90a") != 0) {
    moejit_ctx_destroy(ctx);
    cr_skip_test("the gathering GEMM 1 needs an sm_90a device (this one is %s)", info.arch);
  }
  moejit_spec base;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &base), MOEJIT_OK);
  base.hidden = 512, base.expert_width = 264, base.experts = 8, base.top_k = 2;
  base.n_archs = 1;
  mj_strlcpy(base.archs[0], info.arch, sizeof base.archs[0]);
  moejit_sweep sw;
  memset(&sw, 0, sizeof sw);
  sw.seed = 7;
  enum { kTokens = 600 };
  const int64_t tokens = kTokens;
  int32_t off[9], choice[kTokens * 2];
  mj_tune_route(8, 2, tokens, 11, off, choice);
  mj_tune_group g = {.sweep = &sw,
                     .base = &base,
                     .which = 1,
                     .tokens = tokens,
                     .rows = tokens * 2,
                     .offsets = off,
                     .choice = choice,
                     .active_experts = 8,
                     .seed = 5,
                     .warmup = 2,
                     .iters = 10,
                     .min_iters = 5,
                     .max_point_ms = 200,
                     .tolerance = 2e-2,
                     .check_rows = 32,
                     .jobs = 2};
  mj_tune_backend be;
  cr_assert_eq(mj_tune_gpu_backend(ctx, &be), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(be.open_group(be.state, &g), MOEJIT_OK, "%s", moejit_last_error());
  const struct {
    moejit_gemm_cfg cfg;
    const char *no_gather; /* $MOEJIT_GEMM1_GATHER, or NULL */
    int gathers;
  } cases[] = {
      {{64, 128, 64, 8, 8, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE}, NULL, 1},
      {{256, 128, 64, 4, 8, 1, 1, MOEJIT_RASTER_ALONG_N, MOEJIT_SCHEDULE_COOPERATIVE}, NULL, 0},
      {{64, 128, 64, 8, 8, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE}, "0", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moejit_spec spec = base;
    spec.gemm1 = cases[i].cfg;
    cr_assert_eq(moejit_spec_validate(&spec), MOEJIT_OK, "%s", moejit_last_error());
    if (cases[i].no_gather) setenv("MOEJIT_GEMM1_GATHER", cases[i].no_gather, 1);
    mj_tune_measurement m;
    moejit_status st = be.measure(be.state, &g, &spec, MOEJIT_GEMM_PATH_WGMMA, &m);
    unsetenv("MOEJIT_GEMM1_GATHER");
    cr_assert_eq(st, MOEJIT_OK, "case %zu: %s", i, moejit_last_error());
    cr_expect_leq(m.rel_err, g.tolerance, "case %zu: rel error %g", i, m.rel_err);
    cr_expect_eq(m.gathers, cases[i].gathers, "case %zu", i);
    if (cases[i].gathers)
      cr_expect_eq(m.copy_us, 0, "case %zu: a gathering candidate is charged %g us", i, m.copy_us);
    else
      cr_expect(m.copy_us > 0 && m.us > m.copy_us, "case %zu: us %g, copy charge %g", i, m.us,
                m.copy_us);
  }
  be.close_group(be.state, &g);
  g.which = 2;
  cr_assert_eq(be.open_group(be.state, &g), MOEJIT_OK, "%s", moejit_last_error());
  moejit_spec spec = base;
  spec.gemm2 = cases[0].cfg;
  mj_tune_measurement m;
  cr_assert_eq(be.measure(be.state, &g, &spec, MOEJIT_GEMM_PATH_WGMMA, &m), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_expect_leq(m.rel_err, g.tolerance);
  cr_expect(!m.gathers && m.copy_us == 0, "GEMM 2: gathers %d, copy %g us", m.gathers, m.copy_us);
  be.close_group(be.state, &g);
  mj_tune_backend_free(&be);
  moejit_ctx_destroy(ctx);
}

Test(tune_gpu, smoke_sweep_end_to_end, .timeout = 600) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_device_info info;
  cr_assert_eq(moejit_ctx_device_info(ctx, &info), MOEJIT_OK);
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file(SMOKE, &sw), MOEJIT_OK, "%s", moejit_last_error());
  char *tmp = ts_mkdtemp("tune-gpu"), results[1024], table[1024];
  snprintf(results, sizeof results, "%s/results", tmp);
  snprintf(table, sizeof table, "%s/tuned/table.yaml", tmp);
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.out_table = table;
  moejit_tune_summary s;
  cr_assert_eq(moejit_tune_run(ctx, sw, &o, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(s.timed);
  cr_assert_str_eq(s.device, info.name);
  cr_assert_eq(s.wrong, 0, "every candidate must match the reference");
  cr_assert_eq(s.failed, 0);
  cr_assert_eq(s.compile_failed, 0);
  cr_assert_eq(s.measured, s.points);
  /* the sweep's runoff of 3: each point's heuristic and fastest three
   * candidates (or as many as passed) timed twice more */
  cr_assert_geq(s.runoff_timed, 6 * 2 * 2);
  cr_assert_leq(s.runoff_timed, 6 * 4 * 2);
  cr_assert_eq(s.runoff_timed % 2, 0, "whole rounds");
  cr_assert_eq(s.n_winners, 6, "2 kernels x 3 token counts");
  for (size_t i = 0; i < s.n_winners; i++) {
    cr_assert_gt(s.winners[i].us, 0);
    cr_assert_gt(s.winners[i].heuristic_us, 0);
    /* AUTO's own tile is a candidate: the winner is no slower, give or take
     * the noise of kernels this small */
    cr_assert_leq(s.winners[i].us, s.winners[i].heuristic_us * 1.5,
                  "%s T=%lld: %g us vs heuristic %g", s.winners[i].kernel,
                  (long long)s.winners[i].tokens, s.winners[i].us, s.winners[i].heuristic_us);
  }
  mj_tuned_table t;
  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(t.n, 6);
  cr_assert_str_eq(t.device, info.name);
  cr_assert_str_eq(t.arch, info.arch);
  ts_rng rng = ts_rng_fresh("tune_gpu");
  for (size_t i = 0; i < t.n; i++) entry_runs(ctx, &t.entries[i], &sw->shapes[0].spec, &rng);
  mj_tuned_table_free(&t);
  cr_assert_eq(ts_count_files(results, "results.csv"), 1);
  cr_assert_eq(ts_count_files(results, "chart.svg"), 1);
  /* again: everything resumed, nothing compiled or timed */
  moejit_tune_summary again;
  cr_assert_eq(moejit_tune_run(ctx, sw, &o, &again), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(again.measured, 0);
  cr_assert_eq(again.resumed, s.measured);
  cr_assert_eq(again.compiled, 0);
  cr_assert_eq(again.n_winners, 6);
  moejit_tune_summary_free(&s);
  moejit_tune_summary_free(&again);
  moejit_sweep_destroy(sw);
  moejit_ctx_destroy(ctx);
  ts_rmtree(tmp);
  free(tmp);
}

Test(tune_gpu, budget_and_resume, .timeout = 600) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file(SMOKE, &sw), MOEJIT_OK, "%s", moejit_last_error());
  char *tmp = ts_mkdtemp("tune-gpu-budget"), results[1024];
  snprintf(results, sizeof results, "%s/results", tmp);
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.results_dir = results, o.no_table = 1;
  o.budget_seconds = 1e-3; /* spent before the first timing */
  moejit_tune_summary s;
  cr_assert_eq(moejit_tune_run(ctx, sw, &o, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(s.measured, 0);
  cr_assert_eq(s.skipped_budget, s.points);
  cr_assert(strstr(s.stop_reason, "budget"), "%s", s.stop_reason);
  cr_assert_eq(s.table_path[0], '\0');
  o.budget_seconds = 0;
  moejit_tune_summary rest;
  cr_assert_eq(moejit_tune_run(ctx, sw, &o, &rest), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(rest.measured, rest.points, "the skipped points are timed now");
  cr_assert_eq(rest.resumed, 0);
  moejit_tune_summary_free(&s);
  moejit_tune_summary_free(&rest);
  moejit_sweep_destroy(sw);
  moejit_ctx_destroy(ctx);
  ts_rmtree(tmp);
  free(tmp);
}

/* The number after "key": in the object text [p, end), or -1. */
static double json_num(const char *p, const char *end, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *at = strstr(p, k);
  return at && at < end ? strtod(at + strlen(k), NULL) : -1;
}

static int json_true(const char *p, const char *end, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":true", key);
  const char *at = strstr(p, k);
  return at && at < end;
}

/* `moejit tune --check-layer` on the smoke sweep tuning a model of its
 * shape: every point of the check (the sweep's three token counts and one
 * between each two) is timed both ways and passes the layer's float64
 * check; with no tolerance, noise alone makes some points slower, and
 * wherever the check says it pinned, the table holds the heuristic's plan
 * at that T, with us 0 between buckets. Then `moejit run --tuned-table`
 * loads that table. */
Test(tune_gpu, check_layer_times_both_ways_and_pins_the_heuristic, .timeout = 600) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_device_info info;
  cr_assert_eq(moejit_ctx_device_info(ctx, &info), MOEJIT_OK);
  moejit_ctx_destroy(ctx);
  char *tmp = ts_mkdtemp("tune-gpu-check"), results[1024], table[1024];
  snprintf(results, sizeof results, "%s/results", tmp);
  snprintf(table, sizeof table, "%s/table.yaml", tmp);
  char *cfg = ts_write_file(tmp, "tiny.yaml",
                            "name: tiny-check\n"
                            "model: {hidden: 512, expert_width: 256, experts: 8, top_k: 2,\n"
                            "        routing: {rule: softmax_topk, renormalize: true}}\n"
                            "dtypes: {activation: bf16, weight: bf16, logits: fp32, output: bf16}\n"
                            "target: {arch: auto}\n");
  const char *args[] = {
      "tune",  SMOKE,           "--model",           cfg, "--out",   table, "--results",
      results, "--check-layer", "--check-tolerance", "0", "--iters", "5",   "--json",
      NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_assert(ts_json_valid(out), "not one JSON value: %s", out);
  const char *lc = strstr(out, "\"layer_check\":{");
  cr_assert(lc, "json: %s", out);
  cr_expect(strstr(lc, "\"failed\":false"), "json: %s", lc);
  cr_expect_eq(ts_count_substr(lc, "\"bucket\":true"), 3, "json: %s", lc);
  cr_expect_eq(ts_count_substr(lc, "\"bucket\":false"), 2, "16 and 181: %s", lc);
  moejit_spec spec;
  cr_assert_eq(moejit_spec_load_file(cfg, &spec), MOEJIT_OK, "%s", moejit_last_error());
  spec.n_archs = 1;
  mj_strlcpy(spec.archs[0], info.arch, sizeof spec.archs[0]);
  mj_tuned_table t;
  cr_assert_eq(mj_tuned_table_load_file(table, &t), MOEJIT_OK, "%s", moejit_last_error());
  int pins = 0;
  for (const char *p = strstr(lc, "{\"tokens\":"); p; p = strstr(p + 1, "{\"tokens\":")) {
    const char *end = strchr(p, '}');
    cr_assert(end);
    const int64_t tokens = (int64_t)json_num(p, end, "tokens");
    cr_expect_gt(json_num(p, end, "tuned_ms"), 0, "T=%lld", (long long)tokens);
    cr_expect_gt(json_num(p, end, "heuristic_ms"), 0, "T=%lld", (long long)tokens);
    const int bucket = json_true(p, end, "bucket");
    for (int which = 1; which <= 2; which++) {
      if (!json_true(p, end, which == 1 ? "pinned_gemm1" : "pinned_gemm2")) continue;
      pins++;
      cr_expect_gt(json_num(p, end, "final_tuned_ms"), 0);
      mj_tuned_entry key = {.dtype = spec.act_dtype,
                            .hidden = spec.hidden,
                            .expert_width = spec.expert_width,
                            .experts = spec.experts,
                            .top_k = spec.top_k,
                            .tokens = tokens};
      snprintf(key.kernel, sizeof key.kernel, "gemm%d", which);
      const mj_tuned_entry *e = mj_tuned_table_find(&t, &key);
      cr_assert(e, "a pinned entry at T=%lld gemm%d", (long long)tokens, which);
      moejit_gemm_cfg want;
      moejit_gemm_path want_path;
      cr_assert(
          mj_tune_heuristic_tile(&spec, which, tokens * spec.top_k, info.arch, &want, &want_path));
      cr_expect(e->path == want_path && mj_gemm_cfg_equal(&e->cfg, &want),
                "T=%lld gemm%d holds the heuristic's plan", (long long)tokens, which);
      if (!bucket) cr_expect_eq(e->us, 0, "not timed alone");
      cr_expect_eq(e->pinned, 1, "T=%lld gemm%d is marked pinned", (long long)tokens, which);
    }
  }
  mj_tuned_table_free(&t);
  cr_log_info("--check-layer pinned %d entries", pins);
  free(out), free(err);

  /* --check-only: the same check of that table, no GEMM timed alone, for
   * the sweep's own raw shape (smoke-tiny: the model's d, f, E, k and
   * dtype, so the same entries); three points between two token counts,
   * evenly in log scale (8, 16, 32 between 4 and 64; 108, 181, 304 between
   * 64 and 512) */
  const char *only[] = {"tune", SMOKE,    "--check-only",    "--out", table, "--iters",
                        "3",    "--json", "--check-between", "3",     NULL};
  rc = ts_run_cli(only, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(ts_json_valid(out), "not one JSON value: %s", out);
  cr_expect(strstr(out, "\"check_only\":true") && strstr(out, "\"failed\":false") &&
                strstr(out, "\"shape\":\"smoke-tiny\""),
            "%s", out);
  cr_expect_eq(ts_count_substr(out, "\"bucket\":true"), 3, "json: %s", out);
  cr_expect_eq(ts_count_substr(out, "\"bucket\":false"), 6,
               "3 between 4 and 64, and 64 and 512: %s", out);
  cr_expect(strstr(out, "\"tokens\":8,") && strstr(out, "\"tokens\":181,"), "json: %s", out);
  cr_expect(!strstr(err, "compile:") && !strstr(out, "\"winners\""), "nothing tuned: %s", err);
  free(out), free(err);

  const char *run[] = {"run",      cfg,      "--tuned-table", table, "--vs-heuristic",
                       "--tokens", "16,300", "--iters",       "2",   NULL};
  rc = ts_run_cli(run, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, table) && strstr(out, "vs heur"), "stdout: %s", out);
  free(out), free(err), free(cfg);
  ts_rmtree(tmp);
  free(tmp);
}
