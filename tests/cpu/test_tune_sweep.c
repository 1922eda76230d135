/* Sweep YAML loading (shapes, spaces, ranges, defaults, errors with
 * file:line:col) and the candidate plan: pruning counts per reason,
 * launch-plan dedupe with token masks merged, the tiles AUTO resolves to.
 * No compiling: everything here is host logic. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"
#include "test_support.h"
#include "ops/gemm.h"
#include "tune/tune.h"

#define SWEEPS MOEJIT_TEST_SOURCE_DIR "/configs/sweeps/"

static moejit_sweep *load(const char *text) {
  moejit_sweep *sw = NULL;
  moejit_status st = moejit_sweep_load_string(text, strlen(text), "t.yaml", &sw);
  cr_assert_eq(st, MOEJIT_OK, "load failed: %s", moejit_last_error());
  return sw;
}

/* Loading fails with CONFIG and a message holding every needle. */
static void load_fails(const char *text, const char *needle1, const char *needle2) {
  moejit_sweep *sw = (moejit_sweep *)0x1;
  moejit_status st = moejit_sweep_load_string(text, strlen(text), "t.yaml", &sw);
  cr_assert_neq(st, MOEJIT_OK, "loaded but should not:\n%s", text);
  cr_assert_null(sw);
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, needle1), "message '%s' lacks '%s'", msg, needle1);
  if (needle2) cr_assert(strstr(msg, needle2), "message '%s' lacks '%s'", msg, needle2);
}

static size_t reason_count(const mj_tune_plan *p, const char *reason) {
  for (size_t i = 0; i < p->n_reasons; i++)
    if (strstr(p->reasons[i].reason, reason)) return p->reasons[i].count;
  return 0;
}

static size_t kept(const mj_tune_plan *p) {
  size_t n = 0;
  for (size_t i = 0; i < p->n; i++) n += !p->cands[i].pruned;
  return n;
}

Test(tune_sweep, shipped_sweeps_load) {
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file(SWEEPS "smoke.yaml", &sw), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_str_eq(moejit_sweep_name(sw), "smoke");
  cr_assert_eq(sw->n_shapes, 1);
  cr_assert_eq(sw->shapes[0].spec.hidden, 512);
  cr_assert_eq(sw->shapes[0].spec.top_k, 2);
  cr_assert_eq(sw->n_spaces, 2);
  moejit_sweep_destroy(sw);
  cr_assert_eq(moejit_sweep_load_file(SWEEPS "h100-presets.yaml", &sw), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_eq(sw->n_shapes, 4);
  cr_assert_eq(sw->n_tokens, 5);
  cr_assert_eq(sw->tokens[4], 16384);
  int64_t tok[3] = {-1, -1, -1};
  cr_assert_eq(moejit_sweep_tokens(sw, tok, 2), 5, "the count, whatever the cap");
  cr_assert(tok[0] == 1 && tok[1] == 32 && tok[2] == -1, "the first cap only");
  cr_assert_eq(moejit_sweep_tokens(sw, NULL, 0), 5);
  cr_assert_eq(moejit_sweep_tokens(NULL, tok, 3), 0);
  moejit_spec specs[5];
  memset(specs, 0, sizeof specs);
  cr_assert_eq(moejit_sweep_shape_specs(sw, specs, 5), 4);
  cr_assert_str_eq(specs[1].name, "olmoe-1b-7b");
  cr_assert_eq(specs[3].experts, 256);
  cr_assert_eq(moejit_spec_validate(&specs[0]), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(specs[4].hidden, 0, "past the count: untouched");
  cr_assert_eq(moejit_sweep_shape_specs(NULL, specs, 5), 0);
  const char *want[] = {"qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b", "deepseek-v3"};
  for (int i = 0; i < 4; i++) {
    cr_assert_str_eq(sw->shapes[i].name, want[i]);
    cr_assert_str_eq(sw->shapes[i].preset, want[i]);
  }
  cr_assert_eq(sw->shapes[3].spec.hidden, 7168);
  cr_assert_eq(sw->max_point_ms, 100);
  cr_assert_eq(sw->runoff, 3, "the default runoff");
  moejit_sweep_destroy(sw);
}

/* The sweep for GPUs without wgmma: mma.sync and gemv only; on sm_86 the
 * tiles over its 99 KiB are pruned by that limit before compiling, and
 * AUTO's own candidates are the presets' tiles fitted to it. */
Test(tune_sweep, mma_presets_fit_each_arch) {
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file(SWEEPS "mma-presets.yaml", &sw), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_str_eq(moejit_sweep_name(sw), "mma-presets");
  cr_assert_str_eq(sw->arch, "sm_80");
  cr_assert_eq(sw->n_shapes, 4);
  static const char *const archs[] = {"sm_80", "sm_86", "sm_100"};
  for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++) {
    mj_tune_plan p;
    cr_assert_eq(mj_tune_plan_build(sw, archs[a], &p), MOEJIT_OK, "%s", moejit_last_error());
    const int limit = mj_arch_smem_optin(archs[a]);
    size_t kept_n = 0;
    for (size_t i = 0; i < p.n; i++) {
      const mj_tune_cand *c = &p.cands[i];
      if (c->pruned) continue;
      kept_n++;
      cr_assert(c->path == MOEJIT_GEMM_PATH_MMA || c->path == MOEJIT_GEMM_PATH_GEMV);
      if (c->path == MOEJIT_GEMM_PATH_MMA)
        cr_assert_leq(mj_gemm_smem_bytes(&c->cfg, 2), (size_t)limit, "%s: %dx%dx%d s%d", archs[a],
                      c->cfg.tile_m, c->cfg.tile_n, c->cfg.tile_k, c->cfg.stages);
    }
    cr_assert_gt(kept_n, 300, "%s: %zu candidates", archs[a], kept_n);
    if (limit < 232448)
      cr_assert_gt(reason_count(&p, "shared memory (over the arch's limit)"), 0, "%s", archs[a]);
    mj_tune_plan_free(&p);
  }
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, ranges_lists_and_defaults) {
  moejit_sweep *sw = load(
      "name: r\n"
      "tokens: {from: 1, to: 4096, times: 4}\n"
      "shapes: [olmoe-1b-7b]\n"
      "spaces:\n"
      "  - tile_m: {from: 32, to: 128, times: 2}\n"
      "    tile_n: [256, 64, 64]\n"
      "    tile_k: 64\n"
      "    stages: {from: 2, to: 5}\n");
  int64_t tokens[] = {1, 4, 16, 64, 256, 1024, 4096};
  cr_assert_eq(sw->n_tokens, 7);
  for (int i = 0; i < 7; i++) cr_assert_eq(sw->tokens[i], tokens[i]);
  const mj_sweep_space *sp = &sw->spaces[0];
  cr_assert_eq(sp->n_values[MJ_P_TILE_M], 3, "32, 64, 128");
  cr_assert_eq(sp->values[MJ_P_TILE_M][2], 128);
  cr_assert_eq(sp->n_values[MJ_P_TILE_N], 2, "a value listed twice counts once");
  cr_assert_eq(sp->values[MJ_P_TILE_N][0], 256, "in the order written");
  cr_assert_eq(sp->n_values[MJ_P_STAGES], 4);
  cr_assert_eq(sp->n_values[MJ_P_WARPS], 1, "warps default to 8");
  cr_assert_eq(sp->values[MJ_P_WARPS][0], 8);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, range_values_are_checked) {
  load_fails(
      "name: r\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: {from: 32, to: 128, step: 32}, tile_n: 64, tile_k: 64, stages: 2}\n",
      "t.yaml:5:", "value 96 is not allowed");
  moejit_sweep *sw = load(
      "name: r\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: {from: 16, to: 256, times: 2}, tile_n: 64, tile_k: 64,"
      " stages: {from: 2, to: 8, step: 3}, warps: [4, 8], raster: [along_m, along_n]}\n");
  const mj_sweep_space *sp = &sw->spaces[0];
  int tm[] = {16, 32, 64, 128, 256}, st[] = {2, 5, 8};
  cr_assert_eq(sp->n_values[MJ_P_TILE_M], 5);
  for (int i = 0; i < 5; i++) cr_assert_eq(sp->values[MJ_P_TILE_M][i], tm[i]);
  cr_assert_eq(sp->n_values[MJ_P_STAGES], 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(sp->values[MJ_P_STAGES][i], st[i]);
  cr_assert_eq(sp->n_values[MJ_P_WARPS], 2);
  cr_assert_eq(sp->n_values[MJ_P_RASTER], 2);
  cr_assert_eq(sp->kernels, MJ_KERNEL_BIT(1) | MJ_KERNEL_BIT(2), "both kernels by default");
  cr_assert_eq(sp->paths, MJ_PATH_BIT(MOEJIT_GEMM_PATH_MMA) | MJ_PATH_BIT(MOEJIT_GEMM_PATH_WGMMA));
  cr_assert_eq(sw->warmup, 3);
  cr_assert_eq(sw->iters, 20);
  cr_assert_str_eq(sw->arch, "sm_90a");
  cr_assert_eq(sw->divisible, 1);
  cr_assert_float_eq(sw->tolerance, 2e-2, 1e-12);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, raw_shapes_and_overrides) {
  moejit_sweep *sw = load(
      "name: raw\n"
      "arch: sm_80\n"
      "tokens: [1, 8]\n"
      "kernels: gemm2\n"
      "paths: [mma]\n"
      "shapes:\n"
      "  - {name: small, hidden: 256, expert_width: 128, experts: 4, top_k: 2, dtype: fp16, "
      "tokens: [3]}\n"
      "  - {preset: qwen3-30b-a3b, dtype: fp16}\n"
      "spaces:\n"
      "  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2}\n"
      "timing: {warmup: 1, iters: 7, min_iters: 9, max_point_ms: 50, rotate_mb: 10, runoff: 5}\n"
      "check: {rows: 3, tolerance: 0.05}\n"
      "seed: 42\n"
      "constraints: {divisible: no}\n");
  cr_assert_str_eq(sw->arch, "sm_80");
  cr_assert_eq(sw->shapes[0].spec.act_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(sw->shapes[0].spec.weight_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(sw->shapes[0].n_tokens, 1);
  cr_assert_eq(sw->shapes[0].tokens[0], 3);
  cr_assert_eq(sw->shapes[1].n_tokens, 2, "a shape without tokens takes the sweep's");
  cr_assert_str_eq(sw->shapes[1].name, "qwen3-30b-a3b");
  cr_assert_eq(sw->shapes[1].spec.act_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_str_eq(sw->shapes[1].spec.archs[0], "sm_80");
  cr_assert_eq(sw->spaces[0].kernels, MJ_KERNEL_BIT(2));
  cr_assert_eq(sw->spaces[0].paths, MJ_PATH_BIT(MOEJIT_GEMM_PATH_MMA));
  cr_assert_eq(sw->iters, 7);
  cr_assert_eq(sw->min_iters, 7, "min_iters is capped at iters");
  cr_assert_float_eq(sw->rotate_bytes, 10e6, 1);
  cr_assert_eq(sw->runoff, 5);
  cr_assert_eq(sw->check_rows, 3);
  cr_assert_eq(sw->seed, 42);
  cr_assert_eq(sw->divisible, 0);
  moejit_sweep_destroy(sw);
}

#define HEAD "name: e\ntokens: [1, 64]\nshapes: [olmoe-1b-7b]\n"
#define SPACE "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2}\n"

Test(tune_sweep, errors_name_line_col_and_key) {
  load_fails("", "t.yaml:1:1", "empty");
  load_fails("name: e\n", "missing key 'tokens'", NULL);
  load_fails(HEAD SPACE "colour: red\n", "t.yaml:6:1: ", "unknown key 'colour'");
  load_fails(HEAD SPACE "timing: {iters: 0}\n", "t.yaml:6:17: key 'timing.iters'", "out of range");
  load_fails(HEAD SPACE "timing: {iters: 1.5}\n", "timing.iters", "not a decimal integer");
  load_fails(HEAD SPACE "timing: {runoff: 17}\n", "key 'timing.runoff'", "out of range");
  load_fails(HEAD SPACE "timing: {runoff: -1}\n", "key 'timing.runoff'", "out of range");
  load_fails(HEAD "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64}\n",
             "t.yaml:5:5: key 'spaces[0]'", "missing key 'stages'");
  load_fails(HEAD "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 48, stages: 2}\n",
             "t.yaml:5:38: key 'spaces[0].tile_k'", "allowed 32, 64, 128");
  load_fails(HEAD "spaces:\n  - {tile_m: [], tile_n: 64, tile_k: 64, stages: 2}\n",
             "spaces[0].tile_m", "no values");
  load_fails(HEAD "spaces:\n  - {tile_m: {from: 128, to: 64}, tile_n: 64, tile_k: 64, stages: 2}\n",
             "spaces[0].tile_m", "below 'from'");
  load_fails(HEAD
             "spaces:\n  - {tile_m: {from: 64, to: 128, step: 64, times: 2}, tile_n: 64, tile_k: "
             "64, stages: 2}\n",
             "spaces[0].tile_m", "not both");
  load_fails(HEAD "spaces:\n  - {paths: [auto], tile_m: 64, tile_n: 64, tile_k: 64, stages: 2}\n",
             "spaces[0].paths", "allowed mma, wgmma, gemv");
  load_fails(HEAD "spaces:\n  - {tokens: [2], tile_m: 64, tile_n: 64, tile_k: 64, stages: 2}\n",
             "spaces[0].tokens", "not in the sweep's tokens");
  load_fails(HEAD
             "spaces:\n  - {raster: sideways, tile_m: 64, tile_n: 64, tile_k: 64, stages: 2}\n",
             "spaces[0].raster", "along_m, along_n");
  load_fails(HEAD "spaces: []\n", "t.yaml:4:9: key 'spaces'", "non-empty list");
  load_fails("name: e\ntokens: [1]\nshapes: [mixtral-9x9b]\n" SPACE, "t.yaml:3:10: key 'shapes[0]'",
             "unknown preset 'mixtral-9x9b'");
  load_fails(
      "name: e\ntokens: [1]\nshapes:\n  - {name: s, hidden: 64, expert_width: 64, experts: 4, "
      "top_k: 8}\n" SPACE,
      "t.yaml:4:5: key 'shapes[0]'", "top_k");
  load_fails(
      "name: e\ntokens: [1]\nshapes:\n  - {hidden: 64, expert_width: 64, experts: 4, top_k: "
      "2}\n" SPACE,
      "shapes[0]", "needs 'name'");
  load_fails(
      "name: e\ntokens: [1]\nshapes:\n  - {name: s, hidden: 64, expert_width: 64, experts: 4, "
      "top_k: 2, dtype: fp32}\n" SPACE,
      "shapes[0].dtype", "allowed bf16, fp16");
  load_fails("name: e\ntokens: [1]\nshapes: [olmoe-1b-7b, olmoe-1b-7b]\n" SPACE, "used twice",
             NULL);
  load_fails("name: e\ntokens: [1]\nshapes:\n  - {preset: olmoe-1b-7b, hidden: 64}\n" SPACE,
             "'hidden' cannot be given with 'preset'", NULL);
  load_fails("name: e\ntokens: [0]\nshapes: [olmoe-1b-7b]\n" SPACE, "t.yaml:2:10: key 'tokens'",
             "not allowed (allowed 1..");
  load_fails("name: e\ntokens: [1]\ntokens: [2]\nshapes: [olmoe-1b-7b]\n" SPACE, "given twice",
             NULL);
  load_fails("name: e f\ntokens: [1]\nshapes: [olmoe-1b-7b]\n" SPACE, "key 'name'", "not a name");
  load_fails("name: e\narch: auto\ntokens: [1]\nshapes: [olmoe-1b-7b]\n" SPACE, "key 'arch'",
             "'auto' aside");
  load_fails("name: e\narch: sm_75\ntokens: [1]\nshapes: [olmoe-1b-7b]\n" SPACE, "key 'arch'",
             "'auto' aside");
  load_fails("name: e\ntokens: [1\n", "t.yaml:", "malformed YAML");
}

/* One preset in two dtypes: the second takes a name of its own. */
Test(tune_sweep, a_preset_twice_under_another_name) {
  moejit_sweep *sw = load(
      "name: two\ntokens: [1, 64]\nshapes:\n  - olmoe-1b-7b\n"
      "  - {preset: olmoe-1b-7b, name: olmoe-fp16, dtype: fp16}\n" SPACE);
  cr_assert_eq(sw->n_shapes, 2);
  cr_assert_str_eq(sw->shapes[1].name, "olmoe-fp16");
  cr_assert_str_eq(sw->shapes[1].preset, "olmoe-1b-7b");
  cr_assert_eq(sw->shapes[1].spec.act_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(sw->shapes[1].spec.gemm1.tile_m, sw->shapes[0].spec.gemm1.tile_m,
               "the preset's tiles (the heuristic baseline) are kept");
  moejit_sweep_destroy(sw);
  load_fails("name: e\ntokens: [1]\nshapes:\n  - {preset: olmoe-1b-7b, name: \"a b\"}\n" SPACE,
             "shapes[0].name", NULL);
}

/* A shape whose token counts no space times would drop out of the plan
 * without a word: the plan refuses it, naming it and its place. */
Test(tune_sweep, shape_that_no_space_times_is_refused) {
  moejit_sweep *sw = load(
      "name: d\ntokens: [4, 64]\nshapes:\n"
      "  - {name: kept, hidden: 512, expert_width: 256, experts: 8, top_k: 2}\n"
      "  - {name: dropped, hidden: 512, expert_width: 512, experts: 8, top_k: 2, tokens: "
      "[1, 8]}\n"
      "spaces:\n  - {paths: [mma], tokens: [4, 64], tile_m: 64, tile_n: 128, tile_k: 64, "
      "stages: 3}\n");
  mj_tune_plan plan;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &plan), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "t.yaml:5:5: shape 'dropped'") &&
                strstr(moejit_last_error(), "no space times"),
            "%s", moejit_last_error());
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, file_errors_and_find) {
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file("/nonexistent/s.yaml", &sw), MOEJIT_ERR_IO);
  sw = (moejit_sweep *)(uintptr_t)1;
  cr_assert_eq(moejit_sweep_load_file(NULL, &sw), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_null(sw, "*out is NULL on failure");
  char *dir = ts_mkdtemp("sweepfind");
  char *p = ts_write_file(dir, "mine.yaml", HEAD SPACE);
  char buf[4096];
  cr_assert_eq(moejit_sweep_find(p, buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, p);
  setenv("MOEJIT_SWEEP_DIR", dir, 1);
  cr_assert_eq(moejit_sweep_find("mine", buf, sizeof buf), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_str_eq(buf, p);
  cr_assert_eq(moejit_sweep_find("smoke", buf, sizeof buf), MOEJIT_OK, "the source tree's sweeps");
  cr_assert(strstr(buf, "configs/sweeps/smoke"), "%s", buf);
  cr_assert_eq(moejit_sweep_find("no-such-sweep", buf, sizeof buf), MOEJIT_ERR_NOT_FOUND);
  cr_assert(strstr(moejit_last_error(), dir), "%s", moejit_last_error());
  cr_assert_eq(moejit_sweep_find("x/no-such.yaml", buf, sizeof buf), MOEJIT_ERR_NOT_FOUND);
  free(p);
  ts_rmtree(dir);
  free(dir);
}

Test(tune_sweep, pruning_counts_per_reason) {
  moejit_sweep *sw = load(
      "name: p\n"
      "tokens: [256]\n"
      "shapes: [olmoe-1b-7b]\n"
      "kernels: [gemm1]\n"
      "spaces:\n"
      /* mma: 64x256x128 s4 = 327680 B smem; 12 warps refused by mma */
      "  - paths: [mma]\n"
      "    tile_m: 64\n    tile_n: 256\n    tile_k: [64, 128]\n    stages: 4\n"
      "    warps: [8, 12]\n"
      /* wgmma: 256x256 w8 = 256 accumulators; 64x128 with warps 4/8 = one plan */
      "  - paths: [wgmma]\n"
      "    tile_m: [64, 256]\n    tile_n: [128, 256]\n    tile_k: 64\n    stages: 3\n"
      "    warps: [4, 8]\n");
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  /* mma: 64x256x64 s4 w8 ok, w12 mma-refused; 64x256x128 s4 w8/w12: smem.
   * wgmma: 64x128 w4 ok, w8 dup; 64x256 w4 (128 acc) ok, w8 dup;
   * 256x128 w4: 256 acc (registers), w8 ok; 256x256 w4/w8: registers. */
  cr_assert_eq(reason_count(&p, "shared memory"), 2);
  cr_assert_eq(reason_count(&p, "4 or 8 warps"), 1);
  cr_assert_eq(reason_count(&p, "registers"), 3);
  cr_assert_eq(reason_count(&p, "duplicate launch plan"), 2);
  size_t sum = 0;
  for (size_t i = 0; i < p.n_reasons; i++) sum += p.reasons[i].count;
  cr_assert_eq(sum, p.pruned, "reasons add up to the pruned count");
  cr_assert_eq(p.enumerated, p.n, "every enumerated candidate is listed");
  /* heuristic at T=256 on sm_90a (2048 rows): wgmma on the preset's
   * 128x256 tile: a candidate of its own */
  size_t heur = 0;
  for (size_t i = 0; i < p.n; i++) heur += p.cands[i].heuristic;
  cr_assert_eq(heur, 1);
  cr_assert_eq(kept(&p), 1 + 1 + 2 + 1,
               "heuristic + mma 64x256x64 + two 64-row wgmma + 256x128 w8");
  mj_tune_plan_free(&p);
  /* the same sweep for sm_80: every wgmma candidate pruned with that reason */
  cr_assert_eq(mj_tune_plan_build(sw, "sm_80", &p), MOEJIT_OK);
  cr_assert_eq(reason_count(&p, "wgmma needs sm_90a"), 8);
  for (size_t i = 0; i < p.n; i++)
    if (!p.cands[i].pruned) cr_assert_eq(p.cands[i].path, MOEJIT_GEMM_PATH_MMA);
  mj_tune_plan_free(&p);
  /* sm_86 allows a block 99 KiB: mma 64x256x64 s4 (160 KiB) is pruned
   * there, while AUTO's own tile (the preset's 128x256x64 s4, 192 KiB)
   * stays a candidate, fitted to 2 stages as a load there runs it */
  cr_assert_eq(mj_tune_plan_build(sw, "sm_86", &p), MOEJIT_OK);
  cr_assert_eq(reason_count(&p, "shared memory (over the arch's limit)"), 1);
  size_t heuristics = 0;
  for (size_t i = 0; i < p.n; i++) {
    const mj_tune_cand *c = &p.cands[i];
    if (c->pruned) continue;
    cr_assert_eq(c->path, MOEJIT_GEMM_PATH_MMA);
    cr_assert_leq(mj_gemm_smem_bytes(&c->cfg, 2), 99 * 1024, "%dx%dx%d s%d kept on sm_86",
                  c->cfg.tile_m, c->cfg.tile_n, c->cfg.tile_k, c->cfg.stages);
    if (c->heuristic) {
      heuristics++;
      cr_assert(
          c->cfg.tile_m == 128 && c->cfg.tile_n == 256 && c->cfg.tile_k == 64 && c->cfg.stages == 2,
          "AUTO's tile on sm_86: %dx%dx%d s%d", c->cfg.tile_m, c->cfg.tile_n, c->cfg.tile_k,
          c->cfg.stages);
    }
  }
  cr_assert_eq(heuristics, 1);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, divisibility_constraint) {
  const char *text =
      "name: d\ntokens: [64]\nkernels: [gemm1]\npaths: [mma]\n"
      "shapes:\n  - {name: odd, hidden: 96, expert_width: 96, experts: 4, top_k: 2}\n"
      "spaces:\n  - {tile_m: 64, tile_n: [64, 256], tile_k: [32, 64], stages: 2}\n";
  moejit_sweep *sw = load(text);
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_80", &p), MOEJIT_OK);
  /* f = 96 columns: tile_n 64 (32 h columns) divides, 256 (128) does not;
   * K = 96: tile_k 32 divides, 64 does not */
  cr_assert_eq(reason_count(&p, "divisibility (output columns)"), 2);
  cr_assert_eq(reason_count(&p, "divisibility (K)"), 1);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
  char relaxed[1024];
  snprintf(relaxed, sizeof relaxed, "%sconstraints: {divisible: false}\n", text);
  sw = load(relaxed);
  cr_assert_eq(mj_tune_plan_build(sw, "sm_80", &p), MOEJIT_OK);
  cr_assert_eq(reason_count(&p, "divisibility"), 0);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
}

static const mj_tune_cand *find(const mj_tune_plan *p, int which, moejit_gemm_path path, int tm,
                                int tn, int tk, int stages, int pruned) {
  for (size_t i = 0; i < p->n; i++) {
    const mj_tune_cand *c = &p->cands[i];
    if (c->which == which && c->path == path && c->cfg.tile_m == tm && c->cfg.tile_n == tn &&
        c->cfg.tile_k == tk && c->cfg.stages == stages && c->pruned == pruned)
      return c;
  }
  return NULL;
}

Test(tune_sweep, dedupe_merges_token_masks) {
  /* wgmma: 128 x 64 s2 is four 64-wide k-stages, as 64 x 64 s4; and
   * tile_m 16/32/64 all become a 64-row wgmma tile */
  moejit_sweep *sw = load(
      "name: dd\ntokens: [32, 256, 2048]\nshapes: [qwen3-30b-a3b]\nkernels: [gemm2]\n"
      "paths: [wgmma]\n"
      "spaces:\n"
      "  - {tokens: [32], tile_m: [16, 64], tile_n: 128, tile_k: 64, stages: 4}\n"
      "  - {tokens: [2048], tile_m: 32, tile_n: 128, tile_k: 128, stages: 2}\n");
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  const mj_tune_cand *kept16 = find(&p, 2, MOEJIT_GEMM_PATH_WGMMA, 16, 128, 64, 4, 0);
  cr_assert_not_null(kept16, "the first of the equal plans is kept");
  cr_assert_eq(kept16->tmask, 1u | 4u, "T=32 and T=2048 (bits 0 and 2) merged");
  cr_assert_eq(reason_count(&p, "duplicate launch plan"), 2);
  const mj_tune_cand *dup = find(&p, 2, MOEJIT_GEMM_PATH_WGMMA, 32, 128, 128, 2, 1);
  cr_assert_not_null(dup);
  cr_assert(strstr(dup->reason, "16x128x64 s4 w8 wgmma"), "names what it duplicates: %s",
            dup->reason);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, heuristic_tiles_are_candidates) {
  moejit_sweep *sw = NULL;
  cr_assert_eq(moejit_sweep_load_file(SWEEPS "smoke.yaml", &sw), MOEJIT_OK);
  mj_tune_plan p;
  /* sm_80: AUTO runs the GEMV kernel at T=4 (8 rows: at most
   * MOEJIT_GEMV_MAX_ROWS), as on every arch; its candidate carries the
   * shape's tile. Above, mma.sync on the shape's tile (128 rows and more:
   * not the decode tile, which takes fewer than 64 rows), so no heuristic
   * candidate is on the decode tile any more. The shape's 128x256x64 s4
   * (192 KiB) runs there with 3 stages, fitted to sm_80's 163 KiB. */
  cr_assert_eq(mj_tune_plan_build(sw, "sm_80", &p), MOEJIT_OK);
  const mj_tune_cand *g1 = find(&p, 1, MOEJIT_GEMM_PATH_GEMV, 128, 256, 64, 4, 0);
  const mj_tune_cand *g2 = find(&p, 2, MOEJIT_GEMM_PATH_GEMV, 128, 256, 64, 4, 0);
  const mj_tune_cand *d1 = find(&p, 1, MOEJIT_GEMM_PATH_MMA, 64, 256, 64, 4, 0);
  const mj_tune_cand *d2 = find(&p, 2, MOEJIT_GEMM_PATH_MMA, 64, 256, 64, 4, 0);
  const mj_tune_cand *s1 = find(&p, 1, MOEJIT_GEMM_PATH_MMA, 128, 256, 64, 3, 0);
  cr_assert(g1 && g1->heuristic && g1->tmask == 1u, "gemm1 T=4 on gemv");
  cr_assert(g2 && g2->heuristic && g2->tmask == 1u, "gemm2 T=4 on gemv");
  cr_assert(!d1 && !d2, "the mma decode tile is no heuristic here");
  cr_assert(s1 && s1->heuristic && s1->tmask == 6u, "T=64 and T=512 on the shape's own tile");
  mj_tune_plan_free(&p);
  /* sm_90a: whatever AUTO's plan is at each T, a heuristic candidate has
   * its tile and path */
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  const mj_sweep_shape *sh = &sw->shapes[0];
  for (int which = 1; which <= 2; which++)
    for (int t = 0; t < sh->n_tokens; t++) {
      mj_gemm_plan auto_plan;
      cr_assert_eq(mj_gemm_plan_make_for(&sh->spec, which, MOEJIT_GEMM_PATH_AUTO,
                                         sh->tokens[t] * sh->spec.top_k, "sm_90a", &auto_plan),
                   MOEJIT_OK);
      int found = 0;
      for (size_t i = 0; i < p.n; i++) {
        const mj_tune_cand *c = &p.cands[i];
        const moejit_gemm_cfg *own = which == 1 ? &sh->spec.gemm1 : &sh->spec.gemm2;
        found |= !c->pruned && c->heuristic && c->which == which && (c->tmask & (1u << t)) &&
                 (auto_plan.use_gemv    ? c->path == MOEJIT_GEMM_PATH_GEMV
                  : auto_plan.use_wgmma ? c->path == MOEJIT_GEMM_PATH_WGMMA
                                        : c->path == MOEJIT_GEMM_PATH_MMA) &&
                 (auto_plan.use_gemv /* gemv ignores the tile: the shape's own */
                      ? !memcmp(&c->cfg, own, sizeof *own)
                      : (c->cfg.tile_m < 64 ? 64 : c->cfg.tile_m) == auto_plan.tile_m &&
                            c->cfg.tile_n == auto_plan.tile_n);
      }
      cr_assert(found, "gemm%d T=%lld: no candidate for AUTO's %dx%d %s", which,
                (long long)sh->tokens[t], auto_plan.tile_m, auto_plan.tile_n, auto_plan.entry);
      cr_assert_eq(auto_plan.use_gemv, sh->tokens[t] * sh->spec.top_k <= MOEJIT_GEMV_MAX_ROWS);
    }
  cr_assert_eq(p.pruned, 4, "the 4-warp wgmma tiles duplicate the 8-warp ones");
  for (size_t i = 0; i < p.n; i++)
    if (p.cands[i].pruned)
      cr_assert_eq(p.cands[i].cfg.warps, 4, "the first listed (8 warps) is kept");
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, cluster_parameter) {
  moejit_sweep *sw = load(
      "name: c\ntokens: [256]\nshapes: [olmoe-1b-7b]\nkernels: [gemm2]\n"
      "spaces:\n  - {tile_m: 128, tile_n: 128, tile_k: 64, stages: 4, cluster_m: [1, 2]}\n");
  cr_assert_eq(sw->spaces[0].n_values[MJ_P_CLUSTER_M], 2);
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  /* mma ignores clusters: cluster 2 is its duplicate; wgmma multicasts: kept */
  const mj_tune_cand *m2 = NULL, *w2 = NULL;
  for (size_t i = 0; i < p.n; i++)
    if (p.cands[i].cfg.cluster_m == 2) {
      if (p.cands[i].path == MOEJIT_GEMM_PATH_MMA)
        m2 = &p.cands[i];
      else
        w2 = &p.cands[i];
    }
  cr_assert(m2 && m2->pruned && strstr(m2->category, "duplicate"));
  cr_assert(w2 && !w2->pruned, "%s", w2 ? w2->reason : "none");
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
  load_fails(
      "name: c\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, cluster_m: 4}\n",
      "spaces[0].cluster_m", "allowed 1, 2");
}

/* The explicit candidate (not AUTO's) of a path and cluster shape. */
static const mj_tune_cand *find_cluster(const mj_tune_plan *p, int which, moejit_gemm_path path,
                                        int tile_n, int cluster_m, int cluster_n) {
  for (size_t i = 0; i < p->n; i++) {
    const mj_tune_cand *c = &p->cands[i];
    if (!c->heuristic && c->which == which && c->path == path && c->cfg.tile_n == tile_n &&
        c->cfg.cluster_m == cluster_m && c->cfg.cluster_n == cluster_n)
      return c;
  }
  return NULL;
}

/* cluster_n is listed like cluster_m: wgmma keeps its pairs along N (a
 * launch of its own); mma and gemv ignore clusters, so there cluster_n 2
 * duplicates cluster_n 1. */
Test(tune_sweep, cluster_n_parameter) {
  moejit_sweep *sw = load(
      "name: c\ntokens: [256]\nshapes: [olmoe-1b-7b]\nkernels: [gemm2]\n"
      "paths: [mma, wgmma, gemv]\n"
      "spaces:\n  - {tile_m: 128, tile_n: 128, tile_k: 64, stages: 4, cluster_n: [1, 2]}\n"
      "  - {tile_m: 128, tile_n: 128, tile_k: 64, stages: 4}\n");
  cr_assert_eq(sw->spaces[0].n_values[MJ_P_CLUSTER_N], 2);
  cr_assert_eq(sw->spaces[0].values[MJ_P_CLUSTER_N][0], 1);
  cr_assert_eq(sw->spaces[0].values[MJ_P_CLUSTER_N][1], 2);
  cr_assert_eq(sw->spaces[1].n_values[MJ_P_CLUSTER_N], 1, "cluster_n defaults to [1]");
  cr_assert_eq(sw->spaces[1].values[MJ_P_CLUSTER_N][0], 1);
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  const moejit_gemm_path paths[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                    MOEJIT_GEMM_PATH_GEMV};
  for (size_t i = 0; i < MJ_ARRAY_LEN(paths); i++) {
    const char *name = moejit_gemm_path_name(paths[i]);
    const mj_tune_cand *one = find_cluster(&p, 2, paths[i], 128, 1, 1);
    const mj_tune_cand *two = find_cluster(&p, 2, paths[i], 128, 1, 2);
    cr_assert(one && two, "%s: both cluster_n values enumerated", name);
    if (paths[i] == MOEJIT_GEMM_PATH_WGMMA) {
      cr_assert(!two->pruned, "wgmma cluster_n 2 is a launch of its own: %s", two->reason);
    } else {
      cr_assert(two->pruned && !strcmp(two->category, "duplicate launch plan"),
                "%s ignores clusters: %s", name, two->category);
      cr_assert(strstr(two->reason, name), "names the kept %s launch: %s", name, two->reason);
    }
  }
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
  load_fails(
      "name: c\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, cluster_n: 4}\n",
      "spaces[0].cluster_n", "allowed 1, 2");
  load_fails(
      "name: c\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, cluster_n: [1, 0]}\n",
      "t.yaml:5:68: key 'spaces[0].cluster_n'", "value 0 is not allowed (allowed 1, 2)");
}

/* The validator's cluster rules prune with their own categories: a 2x2
 * cluster (every cross of cluster_m and cluster_n [1, 2] spans one), and
 * cluster_n 2 where tile_n leaves an odd n-tile count (here 384 / 128 = 3
 * for gemm1, 768 / 256 = 3 for gemm2; tile_n 128 gives 6 for both). */
Test(tune_sweep, invalid_clusters_are_pruned) {
  moejit_sweep *sw = load(
      "name: c\ntokens: [256]\nshapes: [olmoe-1b-7b]\nkernels: [gemm2]\npaths: [wgmma]\n"
      "spaces:\n  - {tile_m: 128, tile_n: 128, tile_k: 64, stages: 4, cluster_m: [1, 2],"
      " cluster_n: [1, 2]}\n");
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  const mj_tune_cand *c22 = find_cluster(&p, 2, MOEJIT_GEMM_PATH_WGMMA, 128, 2, 2);
  cr_assert(c22 && c22->pruned);
  cr_assert_str_eq(c22->category, "thread-block cluster (2x2)");
  cr_assert(strstr(c22->reason, "2x2 thread-block cluster is not supported"), "%s", c22->reason);
  cr_assert_eq(reason_count(&p, "thread-block cluster (2x2)"), 1);
  const mj_tune_cand *c21 = find_cluster(&p, 2, MOEJIT_GEMM_PATH_WGMMA, 128, 2, 1);
  const mj_tune_cand *c12 = find_cluster(&p, 2, MOEJIT_GEMM_PATH_WGMMA, 128, 1, 2);
  cr_assert(c21 && !c21->pruned, "pairs along M: %s", c21 ? c21->reason : "none");
  cr_assert(c12 && !c12->pruned, "pairs along N: %s", c12 ? c12->reason : "none");
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);

  sw = load(
      "name: odd\ntokens: [256]\npaths: [wgmma]\n"
      "shapes:\n  - {name: odd, hidden: 768, expert_width: 384, experts: 8, top_k: 2}\n"
      "spaces:\n  - {tile_m: 128, tile_n: [128, 256], tile_k: 64, stages: 4, cluster_n: 2}\n");
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  for (int which = 1; which <= 2; which++) {
    const mj_tune_cand *even = find_cluster(&p, which, MOEJIT_GEMM_PATH_WGMMA, 128, 1, 2);
    const mj_tune_cand *odd = find_cluster(&p, which, MOEJIT_GEMM_PATH_WGMMA, 256, 1, 2);
    cr_assert(even && !even->pruned, "gemm%d tile_n 128: 6 n-tiles: %s", which,
              even ? even->reason : "none");
    cr_assert(odd && odd->pruned, "gemm%d tile_n 256: 3 n-tiles", which);
    cr_assert_str_eq(odd->category, "thread-block cluster (cluster_n 2, odd n-tile count)");
    cr_assert(strstr(odd->reason, "an odd number"), "the validator's reason: %s", odd->reason);
  }
  cr_assert_eq(reason_count(&p, "odd n-tile count"), 2);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
}

Test(tune_sweep, schedule_parameter) {
  moejit_sweep *sw = load(
      "name: s\ntokens: [2048]\nshapes: [olmoe-1b-7b]\nkernels: [gemm1]\npaths: [wgmma]\n"
      "spaces:\n  - {tile_m: [64, 128, 256], tile_n: 128, tile_k: 64, stages: 4,"
      " schedule: [cooperative, pingpong]}\n");
  cr_assert_eq(sw->spaces[0].n_values[MJ_P_SCHEDULE], 2);
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK);
  size_t pingpong = 0;
  for (size_t i = 0; i < p.n; i++)
    if (p.cands[i].cfg.schedule == MOEJIT_SCHEDULE_PINGPONG && !p.cands[i].pruned) pingpong++;
  /* 256x128 pingpong would hold 32768 sums per warpgroup: the wgmma blocker says no */
  cr_assert_eq(pingpong, 2, "64x128 and 128x128 pingpong kept");
  cr_assert_eq(reason_count(&p, "pingpong"), 1);
  mj_tune_plan_free(&p);
  moejit_sweep_destroy(sw);
  load_fails(
      "name: s\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, schedule: [fast]}\n",
      "spaces[0].schedule", "allowed cooperative, pingpong");
}

/* Every schedule by name, in enum order whatever the list's order; one
 * alone; a near miss is refused with the two names. */
Test(tune_sweep, schedule_names_parse_in_enum_order) {
  moejit_sweep *sw = load(
      "name: s\ntokens: [2048]\nshapes: [olmoe-1b-7b]\nkernels: [gemm1]\npaths: [wgmma]\n"
      "spaces:\n  - {tile_m: 128, tile_n: 128, tile_k: 64, stages: 4,"
      " schedule: [cooperative, pingpong]}\n"
      "  - {tile_m: 64, tile_n: 256, tile_k: 64, stages: 4, schedule: [pingpong, cooperative]}\n"
      "  - {tile_m: 64, tile_n: 256, tile_k: 64, stages: 4, schedule: pingpong}\n");
  const mj_sweep_space *sp = &sw->spaces[0];
  cr_assert_eq(sp->n_values[MJ_P_SCHEDULE], 2);
  cr_assert_eq(sp->values[MJ_P_SCHEDULE][0], MOEJIT_SCHEDULE_COOPERATIVE);
  cr_assert_eq(sp->values[MJ_P_SCHEDULE][1], MOEJIT_SCHEDULE_PINGPONG);
  sp = &sw->spaces[1];
  cr_assert_eq(sp->n_values[MJ_P_SCHEDULE], 2);
  cr_assert_eq(sp->values[MJ_P_SCHEDULE][0], MOEJIT_SCHEDULE_COOPERATIVE);
  cr_assert_eq(sp->values[MJ_P_SCHEDULE][1], MOEJIT_SCHEDULE_PINGPONG);
  sp = &sw->spaces[2];
  cr_assert_eq(sp->n_values[MJ_P_SCHEDULE], 1);
  cr_assert_eq(sp->values[MJ_P_SCHEDULE][0], MOEJIT_SCHEDULE_PINGPONG);
  moejit_sweep_destroy(sw);
  load_fails(
      "name: s\ntokens: [1]\nshapes: [olmoe-1b-7b]\n"
      "spaces:\n  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, schedule: [ping-pong]}\n",
      "spaces[0].schedule", "allowed cooperative, pingpong");
}

static size_t count_cands(const mj_tune_plan *p, int which, moejit_gemm_path path, int pruned) {
  size_t n = 0;
  for (size_t i = 0; i < p->n; i++)
    n += p->cands[i].which == which && p->cands[i].path == path && p->cands[i].pruned == pruned;
  return n;
}

/* paths: [gemv]: every tile of the space is one launch (the GEMV kernel
 * ignores it), so one gemv candidate per shape and kernel survives, timed
 * at every T it was asked for; at T = 1 (8 rows of qwen3's top-8) AUTO
 * itself runs gemv, so the kept one is the heuristic's, on the preset's
 * own tile. No divisibility rule on the tile's columns or tile_k: f = 96
 * with tile_n 256 or tile_k 64 would prune mma tiles, not gemv. */
Test(tune_sweep, gemv_space_keeps_one_candidate_per_shape_and_kernel) {
  moejit_sweep *sw = load(
      "name: g\ntokens: [1, 64]\n"
      "shapes:\n  - qwen3-30b-a3b\n"
      "  - {name: odd, hidden: 96, expert_width: 96, experts: 4, top_k: 2}\n"
      "spaces:\n"
      "  - {paths: [gemv], tile_m: [16, 128], tile_n: [64, 256], tile_k: [32, 64],"
      " stages: [2, 4], warps: [8, 12], raster: [along_m, along_n]}\n");
  cr_assert_eq(sw->spaces[0].paths, MJ_PATH_BIT(MOEJIT_GEMM_PATH_GEMV));
  cr_assert_eq(sw->paths, MJ_PATH_BIT(MOEJIT_GEMM_PATH_MMA) | MJ_PATH_BIT(MOEJIT_GEMM_PATH_WGMMA),
               "gemv is never a default path");
  const char *archs[] = {"sm_90a", "sm_80"};
  for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++) {
    mj_tune_plan p;
    cr_assert_eq(mj_tune_plan_build(sw, archs[a], &p), MOEJIT_OK);
    cr_assert_eq(reason_count(&p, "divisibility"), 0, "%s", archs[a]);
    cr_assert_eq(reason_count(&p, "gemv kernel"), 0, "%s", archs[a]);
    for (int shape = 0; shape < 2; shape++)
      for (int which = 1; which <= 2; which++) {
        const mj_sweep_shape *sh = &sw->shapes[shape];
        const mj_tune_cand *kept = NULL;
        size_t n_kept = 0;
        for (size_t i = 0; i < p.n; i++) {
          const mj_tune_cand *c = &p.cands[i];
          if (c->shape != shape || c->which != which || c->path != MOEJIT_GEMM_PATH_GEMV) continue;
          if (!c->pruned)
            kept = c, n_kept++;
          else
            cr_assert(strstr(c->reason, "same launch plan as") && strstr(c->reason, " gemv"),
                      "%s: %s", archs[a], c->reason);
        }
        cr_assert_eq(n_kept, 1, "%s %s gemm%d", archs[a], sh->name, which);
        cr_assert_eq(kept->tmask, 3u, "timed at T=1 and T=64 (bits 0, 1)");
        const moejit_gemm_cfg *own = which == 1 ? &sh->spec.gemm1 : &sh->spec.gemm2;
        /* qwen3: T=1 is 8 rows (AUTO's gemv); odd: 2 rows */
        cr_assert(kept->heuristic && !memcmp(&kept->cfg, own, sizeof *own),
                  "%s %s gemm%d: the heuristic's gemv candidate, on the shape's tile", archs[a],
                  sh->name, which);
        /* the heuristic candidate at T=1 is gemv; none at T=64 is */
        for (size_t i = 0; i < p.n; i++) {
          const mj_tune_cand *c = &p.cands[i];
          if (c->shape != shape || c->which != which || !c->heuristic) continue;
          if (c->tmask & 1u) cr_assert_eq(c->path, MOEJIT_GEMM_PATH_GEMV);
          if (c->path != MOEJIT_GEMM_PATH_GEMV) cr_assert_eq(c->tmask & 1u, 0u);
        }
      }
    /* every enumerated gemv config is a duplicate of the heuristic's: per
     * kernel 2 shapes x 2^6 tiles (12 warps too: no mma rule for gemv) */
    cr_assert_eq(p.pruned, 2 * 2 * 64, "%s", archs[a]);
    cr_assert_eq(reason_count(&p, "duplicate launch plan"), p.pruned);
    for (int which = 1; which <= 2; which++) {
      cr_assert_eq(count_cands(&p, which, MOEJIT_GEMM_PATH_GEMV, 0), 2);
      cr_assert_eq(count_cands(&p, which, MOEJIT_GEMM_PATH_GEMV, 1), 2 * 64, "%s", archs[a]);
    }
    mj_tune_plan_free(&p);
  }
  moejit_sweep_destroy(sw);
}

/* The gemv blocker prunes like the others, under "gemv kernel: ..." (no
 * sweep shape can trigger it: shapes are bf16/fp16 with d, f multiples of
 * 8), and the heuristic tile maps AUTO's GEMV plan to path gemv on the
 * spec's own tile at up to MOEJIT_GEMV_MAX_ROWS rows only. */
Test(tune_sweep, heuristic_tile_is_gemv_up_to_its_row_limit) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("mixtral-8x7b", &s), MOEJIT_OK);
  const char *archs[] = {"sm_90a", "sm_80", "sm_86"};
  for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++)
    for (int which = 1; which <= 2; which++)
      for (int64_t rows = 1; rows <= 2 * MOEJIT_GEMV_MAX_ROWS; rows++) {
        moejit_gemm_cfg cfg;
        moejit_gemm_path path;
        cr_assert(mj_tune_heuristic_tile(&s, which, rows, archs[a], &cfg, &path));
        if (rows <= MOEJIT_GEMV_MAX_ROWS) {
          cr_assert_eq(path, MOEJIT_GEMM_PATH_GEMV, "%s gemm%d rows %lld", archs[a], which,
                       (long long)rows);
          const moejit_gemm_cfg *own = which == 1 ? &s.gemm1 : &s.gemm2;
          cr_assert(!memcmp(&cfg, own, sizeof cfg));
        } else {
          cr_assert_neq(path, MOEJIT_GEMM_PATH_GEMV);
        }
      }
  moejit_spec f = s;
  f.act_dtype = f.weight_dtype = f.out_dtype = MOEJIT_DTYPE_FP32;
  cr_assert_not_null(mj_gemm_gemv_blocker(&f, 1));
  moejit_gemm_cfg cfg;
  moejit_gemm_path path = MOEJIT_GEMM_PATH_GEMV;
  if (mj_tune_heuristic_tile(&f, 1, 1, "sm_90a", &cfg, &path))
    cr_assert_neq(path, MOEJIT_GEMM_PATH_GEMV, "fp32: AUTO cannot take gemv");
}

/* moejit_sweep_set_shapes: model specs replace the sweep's shapes, with
 * their own tiles as the heuristic and the sweep's token counts; a bad
 * spec leaves the sweep as it was. */
Test(tune_sweep, model_specs_replace_the_shapes) {
  moejit_sweep *sw = load(HEAD SPACE);
  moejit_spec specs[2];
  cr_assert_eq(moejit_spec_load_preset("mixtral-8x7b", &specs[0]), MOEJIT_OK);
  moejit_spec_init(&specs[1]);
  mj_strlcpy(specs[1].name, "my-model", sizeof specs[1].name);
  specs[1].hidden = 1024, specs[1].expert_width = 512, specs[1].experts = 16, specs[1].top_k = 4;
  specs[1].act_dtype = specs[1].weight_dtype = specs[1].out_dtype = MOEJIT_DTYPE_FP16;
  specs[1].gemm2.tile_m = 64, specs[1].gemm2.tile_n = 128;
  cr_assert_eq(moejit_sweep_set_shapes(sw, specs, 2), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(sw->n_shapes, 2);
  cr_assert_str_eq(sw->shapes[0].name, "mixtral-8x7b");
  cr_assert_str_eq(sw->shapes[1].name, "my-model");
  cr_assert_eq(sw->shapes[1].spec.hidden, 1024);
  cr_assert_eq(sw->shapes[1].spec.act_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(sw->shapes[1].spec.gemm2.tile_n, 128, "the spec's tile is the heuristic");
  cr_assert_str_eq(sw->shapes[1].spec.archs[0], "sm_90a", "the sweep's arch");
  for (int s = 0; s < 2; s++) {
    cr_assert_eq(sw->shapes[s].n_tokens, 2);
    cr_assert_eq(sw->shapes[s].tokens[1], 64);
  }
  /* the plan tunes them: candidates of both shapes, the heuristic's tiles among them */
  mj_tune_plan p;
  cr_assert_eq(mj_tune_plan_build(sw, "sm_90a", &p), MOEJIT_OK, "%s", moejit_last_error());
  int seen[2] = {0, 0};
  for (size_t i = 0; i < p.n; i++) seen[p.cands[i].shape] += !p.cands[i].pruned;
  cr_assert(seen[0] > 0 && seen[1] > 0, "%d %d", seen[0], seen[1]);
  mj_tune_plan_free(&p);

  /* errors: the sweep keeps its shapes */
  moejit_spec bad[2] = {specs[1], specs[1]};
  cr_assert_eq(moejit_sweep_set_shapes(sw, bad, 2), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "both named 'my-model'"), "%s", moejit_last_error());
  bad[1].act_dtype = bad[1].weight_dtype = MOEJIT_DTYPE_FP32;
  mj_strlcpy(bad[1].name, "fp32-model", sizeof bad[1].name);
  cr_assert_eq(moejit_sweep_set_shapes(sw, bad, 2), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "specs[1] (fp32-model)") &&
                strstr(moejit_last_error(), "bf16 and fp16"),
            "%s", moejit_last_error());
  bad[1] = specs[1], bad[1].experts = 0;
  cr_assert_eq(moejit_sweep_set_shapes(sw, bad + 1, 1), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "specs[0]") && strstr(moejit_last_error(), "experts"), "%s",
            moejit_last_error());
  bad[1] = specs[1], bad[1].top_k = 16, bad[1].experts = 16;
  moejit_sweep *big = load("name: b\ntokens: [1, 200000000]\nshapes: [olmoe-1b-7b]\n" SPACE);
  cr_assert_eq(moejit_sweep_set_shapes(big, bad + 1, 1), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "do not fit in int32"), "%s", moejit_last_error());
  moejit_sweep_destroy(big);
  cr_assert_eq(moejit_sweep_set_shapes(sw, specs, 0), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_sweep_set_shapes(sw, specs, MOEJIT_TUNE_MAX_MODELS + 1),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_sweep_set_shapes(sw, NULL, 1), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_sweep_set_shapes(NULL, specs, 1), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(sw->n_shapes, 2);
  cr_assert_str_eq(sw->shapes[1].name, "my-model");
  moejit_sweep_destroy(sw);
}
