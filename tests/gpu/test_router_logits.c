/* moejit_router_logits on the GPU: logits = x . gate_weight^T against a
 * float64 reference of the same rounded inputs, for every form (the warps
 * up to 8 tokens and wherever x and the weight are not one 16-bit type;
 * 32 x 64 tensor-core tiles above, 128 x 128 ones where they make half a
 * wave), E and d that are not tile multiples, fp32, bf16 and fp16 logits;
 * every output written (poisoned first); a token's logits the same bits
 * whatever else the call holds (within one form) and run after run;
 * refused arguments. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_dtype.h"
#include "ref_gemm.h"

TestSuite(router_logits, .timeout = 600);

/* One model's inputs for up to max_t tokens: host values as the GPU reads
 * them (rounded to the dtypes) and device copies. */
typedef struct rl_case {
  moejit_spec spec;
  moejit_model *model;
  int64_t max_t;
  float *x, *gate; /* host [max_t, d], [E, d] */
  void *d_x, *d_gate, *d_logits, *d_ws;
  size_t ws_bytes;
} rl_case;

static void upload_rounded(moejit_dtype dt, float *host, void **dev, size_t n) {
  const size_t bytes = n * moejit_dtype_size(dt);
  void *packed = malloc(bytes);
  cr_assert(packed);
  ref_pack(dt, host, packed, n);
  ref_unpack(dt, packed, host, n); /* what the GPU reads */
  *dev = ops_alloc(bytes);
  ops_upload(*dev, packed, bytes);
  free(packed);
}

static void case_make(rl_case *c, int experts, int64_t hidden, moejit_dtype act,
                      moejit_dtype weight, moejit_dtype logits, int64_t max_t, ts_rng *rng) {
  memset(c, 0, sizeof *c);
  c->spec = ops_spec(experts, 4, hidden);
  c->spec.act_dtype = act, c->spec.weight_dtype = weight, c->spec.logits_dtype = logits;
  c->spec.out_dtype = act;
  if (weight == MOEJIT_DTYPE_FP32) /* the GEMMs' default tiles need half their stages */
    c->spec.gemm1.stages = c->spec.gemm2.stages = 2;
  cr_assert_eq(moejit_spec_validate(&c->spec), MOEJIT_OK, "%s", moejit_last_error());
  ops_load_models(&c->spec, 1, MJ_OPS_ROUTE, &c->model);
  c->max_t = max_t;
  const size_t nx = (size_t)max_t * (size_t)hidden, ng = (size_t)experts * (size_t)hidden;
  c->x = malloc(sizeof(float) * nx);
  c->gate = malloc(sizeof(float) * ng);
  cr_assert(c->x && c->gate);
  /* logits of about unit size: x in [-1, 1], the weight in [-a, a] with
   * a = 3 / sqrt(d) (variance d * (1/3) * (a^2/3) = 1) */
  const double a = 3.0 / sqrt((double)hidden);
  for (size_t i = 0; i < nx; i++) c->x[i] = (float)ts_uniform(rng, -1.0, 1.0);
  for (size_t i = 0; i < ng; i++) c->gate[i] = (float)ts_uniform(rng, -a, a);
  upload_rounded(act, c->x, &c->d_x, nx);
  upload_rounded(weight, c->gate, &c->d_gate, ng);
  c->d_logits = ops_alloc((size_t)max_t * experts * moejit_dtype_size(logits));
  OPS_OK(moejit_router_logits_workspace_size(c->model, &c->ws_bytes));
  c->d_ws = ops_alloc(c->ws_bytes);
}

static void case_free(rl_case *c) {
  ops_free(c->d_x), ops_free(c->d_gate), ops_free(c->d_logits), ops_free(c->d_ws);
  free(c->x), free(c->gate);
  moejit_model_destroy(c->model);
}

/* Runs tokens [first, first + tokens) (x from row `first`), poisoned first,
 * with the workspace (d may split) or without; returns the logits as floats
 * (malloc'd). */
static float *run_ws(const rl_case *c, int64_t first, int64_t tokens, int ws) {
  const moejit_spec *s = &c->spec;
  const size_t n = (size_t)tokens * s->experts, lsz = moejit_dtype_size(s->logits_dtype);
  ops_poison(c->d_logits, (size_t)c->max_t * s->experts * lsz, OPS_POISON_NAN);
  ops_sync();
  const moejit_router_logits_args a = {
      .tokens = tokens,
      .x = (const char *)c->d_x + (size_t)first * s->hidden * moejit_dtype_size(s->act_dtype),
      .gate_weight = c->d_gate,
      .logits = c->d_logits,
      .workspace = ws ? c->d_ws : NULL,
      .workspace_bytes = ws ? c->ws_bytes : 0};
  /* the scratch poisoned too: nothing may read sums a part did not write */
  if (ws) ops_poison(c->d_ws, c->ws_bytes / 4 * 4, OPS_POISON_NAN);
  OPS_OK(moejit_router_logits(c->model, &a, NULL));
  void *bits = malloc(n * lsz);
  float *out = malloc(sizeof(float) * n);
  cr_assert(bits && out);
  ops_download(bits, c->d_logits, n * lsz);
  ref_unpack(s->logits_dtype, bits, out, n);
  free(bits);
  return out;
}

static float *run(const rl_case *c, int64_t first, int64_t tokens) {
  return run_ws(c, first, tokens, 0);
}

/* ||got - ref|| / ||ref|| over tokens [first, first + tokens); fails on a
 * value that is not finite (an element left poisoned). */
static double rel_error(const rl_case *c, int64_t first, int64_t tokens, const float *got,
                        const char *what) {
  const int E = c->spec.experts;
  for (int64_t t = 0; t < tokens; t++)
    for (int e = 0; e < E; e++)
      cr_assert(isfinite(got[t * E + e]), "%s: logit (%lld, %d) = %g: not written?", what,
                (long long)t, e, got[t * E + e]);
  return ref_logits_rel_error(c->x + first * c->spec.hidden, c->gate, tokens, c->spec.hidden, E,
                              got);
}

Test(router_logits, matches_float64) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("router logits");
  const struct {
    int experts;
    int64_t hidden;
    moejit_dtype act, weight, logits;
    double rtol;
  } cases[] = {
      /* qwen3-30b-a3b's router, fp32 logits */
      {128, 2048, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 1e-5},
      /* E and d off every tile (60 of 64 experts, d = 1288 = 20 k-tiles + 8) */
      {60, 1288, MOEJIT_DTYPE_FP16, MOEJIT_DTYPE_FP16, MOEJIT_DTYPE_FP32, 1e-5},
      /* deepseek-v3's 256 experts (four expert tiles), bf16 logits */
      {256, 1024, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, 1e-2},
      /* eight experts (one tile, 56 columns masked), fp16 logits */
      {8, 4096, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP16, 1e-2},
      /* no tensor cores: fp32 x with bf16 weights, and fp32 both */
      {64, 520, MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 1e-5},
      {33, 264, MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP32, 1e-5},
  };
  /* the warps: 1, 7, 8 (and every T for fp32 x: 9 and 33 a group of one
   * token, 1000 many groups); the tiles: 9, 33 (a tile of one row), 64,
   * 100, 1000 */
  static const int64_t tokens[] = {1, 7, 8, 9, 33, 64, 100, 1000};
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    rl_case c;
    case_make(&c, cases[i].experts, cases[i].hidden, cases[i].act, cases[i].weight, cases[i].logits,
              1000, &rng);
    for (size_t j = 0; j < MJ_ARRAY_LEN(tokens); j++) {
      char what[160];
      snprintf(what, sizeof what, "E=%d d=%lld %s/%s -> %s, T=%lld (%s)", cases[i].experts,
               (long long)cases[i].hidden, moejit_dtype_name(cases[i].act),
               moejit_dtype_name(cases[i].weight), moejit_dtype_name(cases[i].logits),
               (long long)tokens[j],
               mj_router_logits_mma(&c.spec, tokens[j]) ? "tensor cores" : "warps");
      for (int ws = 0; ws < 2; ws++) {
        float *got = run_ws(&c, 0, tokens[j], ws);
        const double err = rel_error(&c, 0, tokens[j], got, what);
        cr_expect(err <= cases[i].rtol, "%s%s: rel error %.3g > %.1g", what, ws ? ", d split" : "",
                  err, cases[i].rtol);
        free(got);
      }
    }
    case_free(&c);
  }
}

/* The 128 x 128 tiles, which run where the call makes half a wave: 300
 * experts (three expert tiles, the last of 44), d = 136 (a partial k-tile),
 * T = 12000 and 12345 (partial token tiles). */
Test(router_logits, wide_tiles_match_float64) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("router logits wide");
  rl_case c;
  case_make(&c, 300, 136, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 12345, &rng);
  static const int64_t tokens[] = {12000, 12345};
  for (size_t j = 0; j < MJ_ARRAY_LEN(tokens); j++) {
    const int64_t t = tokens[j];
    cr_assert(2 * ((t + 127) / 128 * 3) >= c.model->sm_count,
              "T=%lld: too few 128 x 128 tiles for this GPU's %d SMs", (long long)t,
              c.model->sm_count);
    char what[96];
    snprintf(what, sizeof what, "E=300 d=136 T=%lld (128 x 128 tiles)", (long long)t);
    float *got = run(&c, 0, t);
    const double err = rel_error(&c, 0, t, got, what);
    cr_expect(err <= 1e-5, "%s: rel error %.3g", what, err);
    free(got);
  }
  case_free(&c);
}

/* A token's logits do not depend on the other tokens of the call, within a
 * form (the warps at 8 tokens and, for fp32 x, at 64 in eight groups; the
 * 32 x 64 tiles), and repeat to the bit. */
static void same_bits(const rl_case *c, int64_t tokens, int64_t first, int64_t n,
                      const char *form) {
  const size_t E = (size_t)c->spec.experts;
  float *all = run(c, 0, tokens), *again = run(c, 0, tokens), *part = run(c, first, n);
  cr_expect(memcmp(all, again, sizeof(float) * (size_t)tokens * E) == 0, "%s: a rerun differs",
            form);
  cr_expect(memcmp(all + first * E, part, sizeof(float) * (size_t)n * E) == 0,
            "%s: tokens %lld..%lld differ when the call starts at %lld", form, (long long)first,
            (long long)(first + n - 1), (long long)first);
  free(all), free(again), free(part);
}

Test(router_logits, a_tokens_logits_do_not_depend_on_the_call) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("router logits bits");
  rl_case c;
  case_make(&c, 96, 1032, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 1000, &rng);
  cr_assert(!mj_router_logits_mma(&c.spec, 8) && mj_router_logits_mma(&c.spec, 9));
  same_bits(&c, 8, 2, 5, "warps");
  same_bits(&c, 1000, 333, 65, "32 x 64 tiles");
  /* with the workspace d splits into parts (more of them the fewer tiles
   * T makes): a logit's sum then depends on T, but the same T gives the
   * same bits */
  for (int64_t t = 9; t <= 1000; t = t * 4 + 3) {
    const size_t n = (size_t)t * 96;
    float *a = run_ws(&c, 0, t, 1), *b = run_ws(&c, 0, t, 1);
    cr_expect(memcmp(a, b, sizeof(float) * n) == 0, "T=%lld, d split: a rerun differs",
              (long long)t);
    free(a), free(b);
  }
  case_free(&c);
  case_make(&c, 96, 1032, MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 64, &rng);
  cr_assert(!mj_router_logits_mma(&c.spec, 64));
  same_bits(&c, 64, 17, 30, "warps, fp32 x");
  case_free(&c);
}

Test(router_logits, bad_arguments_are_refused_before_launching) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("router logits bad args");
  rl_case c;
  case_make(&c, 64, 256, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP32, 16, &rng);
  ops_poison(c.d_logits, 16 * 64 * 4, OPS_POISON_NAN);
  const moejit_router_logits_args good = {
      .tokens = 16, .x = c.d_x, .gate_weight = c.d_gate, .logits = c.d_logits};
  moejit_router_logits_args a;
#define REFUSED(field_change, needle)                                                              \
  do {                                                                                             \
    a = good;                                                                                      \
    field_change;                                                                                  \
    cr_expect_eq(moejit_router_logits(c.model, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT,             \
                 #field_change);                                                                   \
    cr_expect(strstr(moejit_last_error(), needle), "message '%s' lacks '%s'", moejit_last_error(), \
              needle);                                                                             \
  } while (0)
  REFUSED(a.tokens = 0, "tokens");
  REFUSED(a.tokens = INT32_MAX / 4 + 1, "tokens");
  REFUSED(a.x = NULL, "x");
  REFUSED(a.x = (const char *)c.d_x + 2, "aligned");
  REFUSED(a.gate_weight = NULL, "gate_weight");
  REFUSED(a.gate_weight = (const char *)c.d_gate + 8, "gate_weight");
  REFUSED(a.logits = NULL, "logits");
  REFUSED(a.logits = (char *)c.d_logits + 4, "logits");
  REFUSED((a.workspace = (char *)c.d_ws + 128, a.workspace_bytes = c.ws_bytes), "workspace");
  REFUSED((a.workspace = c.d_ws, a.workspace_bytes = c.ws_bytes - 4), "workspace_bytes");
#undef REFUSED
  cr_expect_eq(moejit_router_logits(c.model, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_router_logits(NULL, &good, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_router_logits_workspace_size(c.model, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  size_t bytes = 0;
  cr_expect_eq(moejit_router_logits_workspace_size(NULL, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  /* a model without the route kernels */
  moejit_model *align_only = NULL;
  ops_load_models(&c.spec, 1, MJ_OPS_ALIGN, &align_only);
  cr_expect_eq(moejit_router_logits(align_only, &good, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "route"), "%s", moejit_last_error());
  moejit_model_destroy(align_only);
  uint32_t words[16 * 64];
  ops_download(words, c.d_logits, sizeof words);
  cr_expect(ops_all_words(words, sizeof words, OPS_POISON_NAN), "a refused call wrote logits");
  case_free(&c);
}
