/* moejit_route on the GPU against the float64 reference (ref_route.c): every
 * rule x E in {8, 64, 128, 256} x k in {1, 2, 4, 8} x T in {1, 7, 1000,
 * 16384}, fp32 and bf16 logits, ties, one expert winning every token, NaN
 * and inf logits, repeatability, and refused arguments. Ids must match
 * exactly (for the sigmoid rule: except at near-ties the reference flags,
 * where fp32 and float64 scores may order differently; those must still
 * carry the right weights for the ids chosen); weights within 1e-6
 * relative. Outputs are poisoned before every run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_dtype.h"
#include "ref_route.h"

#define WEIGHT_RTOL 1e-6
/* Scores differ between fp32 (GPU) and float64 by a few 1e-7; decisions
 * closer than this may legitimately differ. */
#define NEAR_TIE 4e-6

static const int kExpertsGrid[] = {8, 64, 128, 256};
static const int kTopKGrid[] = {1, 2, 4, 8};
static const int64_t kTokensGrid[] = {1, 7, 1000, 16384};

typedef enum { SOFTMAX_RENORM, SOFTMAX_PLAIN, SIGMOID_GROUPED } rule_kind;

/* The spec for a rule; sigmoid: 8 groups (4 for E = 8), keep half of them
 * or enough for k, scale 2.5 (DeepSeek-V3's shape at E = 256). */
static moejit_spec route_spec(rule_kind rule, int experts, int top_k, moejit_dtype logits) {
  moejit_spec s = ops_spec(experts, top_k, 256);
  s.logits_dtype = logits;
  s.routing.renormalize = rule != SOFTMAX_PLAIN;
  if (rule == SIGMOID_GROUPED) {
    const int groups = experts >= 64 ? 8 : 4, size = experts / groups;
    int keep = groups / 2;
    while (keep * size < top_k) keep++;
    s.routing.rule = MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK;
    s.routing.n_group = groups;
    s.routing.topk_group = keep;
    s.routing.scaling_factor = 2.5f;
  }
  return s;
}

static ref_route_cfg ref_cfg(const moejit_spec *s) {
  ref_route_cfg c = {.experts = s->experts,
                     .top_k = s->top_k,
                     .rule = (int)s->routing.rule,
                     .renormalize = s->routing.renormalize,
                     .n_group = s->routing.n_group,
                     .topk_group = s->routing.topk_group,
                     .scaling_factor = s->routing.scaling_factor};
  return c;
}

/* Device buffers for up to `tokens` tokens of one spec. */
typedef struct route_bufs {
  void *logits, *bias;
  int32_t *ids;
  float *weights;
} route_bufs;

static route_bufs bufs_alloc(int64_t tokens, int experts, int top_k) {
  route_bufs b = {ops_alloc((size_t)(tokens * experts) * 4), ops_alloc((size_t)experts * 4),
                  ops_alloc((size_t)(tokens * top_k) * 4), ops_alloc((size_t)(tokens * top_k) * 4)};
  return b;
}

static void bufs_free(route_bufs *b) {
  ops_free(b->logits);
  ops_free(b->bias);
  ops_free(b->ids);
  ops_free(b->weights);
}

/* Uploads logits (rounded to the spec's dtype in place, so the reference
 * sees what the GPU reads), runs route twice with poisoned outputs, checks
 * the two runs agree bit for bit, and returns the outputs. */
static void run_route(const moejit_model *m, route_bufs *b, int64_t tokens, float *logits,
                      const float *bias, int32_t *ids, float *weights) {
  const moejit_spec *s = moejit_model_spec(m);
  const size_t n_logits = (size_t)(tokens * s->experts), n_out = (size_t)(tokens * s->top_k);
  void *packed = malloc(n_logits * 4);
  int32_t *ids2 = malloc(n_out * 4);
  float *weights2 = malloc(n_out * 4);
  cr_assert(packed && ids2 && weights2);
  ref_pack(s->logits_dtype, logits, packed, n_logits);
  ref_unpack(s->logits_dtype, packed, logits, n_logits);
  ops_upload(b->logits, packed, n_logits * moejit_dtype_size(s->logits_dtype));
  if (bias) ops_upload(b->bias, bias, (size_t)s->experts * 4);
  moejit_route_args a = {.tokens = tokens,
                         .logits = b->logits,
                         .bias = bias ? b->bias : NULL,
                         .topk_ids = b->ids,
                         .topk_weights = b->weights};
  for (int run = 0; run < 2; run++) {
    ops_poison(b->ids, n_out * 4, OPS_POISON_NAN);
    ops_poison(b->weights, n_out * 4, OPS_POISON_NAN);
    OPS_OK(moejit_route(m, &a, NULL));
    ops_download(run ? ids2 : ids, b->ids, n_out * 4);
    ops_download(run ? weights2 : weights, b->weights, n_out * 4);
  }
  cr_assert(memcmp(ids, ids2, n_out * 4) == 0, "ids differ between two identical runs");
  cr_assert(memcmp(weights, weights2, n_out * 4) == 0, "weights differ between two identical runs");
  free(packed);
  free(ids2);
  free(weights2);
}

/* A token's k weights against the reference, relative to the token's largest
 * weight: |got - want| <= WEIGHT_RTOL * max_j |want_j|. Elementwise-relative
 * error is meaningless for weights like 1e-8 beside 0.9 (their fp32
 * exponent's argument alone carries ~1e-6 of rounding), so the scale is the
 * token's weight vector, as in a norm-wise relative error. */
static void expect_weights(const float *got, const double *want, int k, int64_t t,
                           const char *what) {
  double scale = 0;
  for (int j = 0; j < k; j++) scale = fmax(scale, fabs(want[j]));
  for (int j = 0; j < k; j++) {
    cr_assert(isfinite(got[j]), "%s: token %lld slot %d: weight %g is not finite", what,
              (long long)t, j, (double)got[j]);
    cr_assert(fabs(got[j] - want[j]) <= WEIGHT_RTOL * scale + 1e-30,
              "%s: token %lld slot %d: weight %.9g, reference %.9g (err %.3g relative to the "
              "token's largest weight %.9g)",
              what, (long long)t, j, (double)got[j], want[j], fabs(got[j] - want[j]) / scale, scale);
  }
}

/* The GPU's ids for a near-tie token: distinct valid experts, and weights
 * that are the rule's weights for those ids. */
static void check_near_tie(const ref_route_cfg *c, const float *logits, const int32_t *ids,
                           const float *weights, int64_t t, const char *what) {
  int ref_ids[32];
  double ref_w[32];
  for (int j = 0; j < c->top_k; j++) {
    cr_assert(ids[j] >= 0 && ids[j] < c->experts, "%s: token %lld: id %d", what, (long long)t,
              ids[j]);
    for (int i = 0; i < j; i++)
      cr_assert_neq(ids[i], ids[j], "%s: token %lld picks expert %d twice", what, (long long)t,
                    ids[j]);
    ref_ids[j] = ids[j];
  }
  ref_route_weights(c, logits, ref_ids, ref_w);
  expect_weights(weights, ref_w, c->top_k, t, what);
}

/* Compares a GPU result with the reference; returns the near-tie count. */
static int64_t check_route(const ref_route_cfg *c, int64_t tokens, const float *logits,
                           const float *bias, const int32_t *ids, const float *weights,
                           const char *what) {
  const int k = c->top_k;
  int64_t near = 0;
  for (int64_t t = 0; t < tokens; t++) {
    const float *row = logits + t * c->experts;
    int ref_ids[32];
    double ref_w[32];
    const double margin = ref_route_token(c, row, bias, ref_ids, ref_w);
    if (margin < NEAR_TIE) {
      near++;
      check_near_tie(c, row, ids + t * k, weights + t * k, t, what);
      continue;
    }
    for (int j = 0; j < k; j++)
      cr_assert_eq(ids[t * k + j], ref_ids[j], "%s: token %lld slot %d: expert %d, reference %d",
                   what, (long long)t, j, ids[t * k + j], ref_ids[j]);
    expect_weights(weights + t * k, ref_w, k, t, what);
  }
  return near;
}

static void random_logits(ts_rng *r, float *logits, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) logits[i] = scale * ts_normal(r);
}

/* Every (E, k) of the grid for one rule and logits dtype, every T. */
static void run_grid(rule_kind rule, moejit_dtype dtype, const char *rng_name) {
  enum { NE = 4, NK = 4 };
  moejit_spec specs[NE * NK];
  moejit_model *models[NE * NK];
  for (int e = 0; e < NE; e++)
    for (int k = 0; k < NK; k++)
      specs[e * NK + k] = route_spec(rule, kExpertsGrid[e], kTopKGrid[k], dtype);
  ops_load_models(specs, NE * NK, MJ_OPS_ROUTE, models);

  ts_rng r = ts_rng_fresh(rng_name);
  const int64_t max_t = 16384;
  float *logits = malloc(sizeof(float) * (size_t)max_t * 256);
  float bias[256];
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_t * 8);
  float *weights = malloc(sizeof(float) * (size_t)max_t * 8);
  cr_assert(logits && ids && weights);
  for (int i = 0; i < NE * NK; i++) {
    const moejit_spec *s = &specs[i];
    const ref_route_cfg c = ref_cfg(s);
    route_bufs b = bufs_alloc(max_t, s->experts, s->top_k);
    for (int e = 0; e < s->experts; e++) bias[e] = (float)ts_uniform(&r, -0.1, 0.1);
    for (size_t ti = 0; ti < MJ_ARRAY_LEN(kTokensGrid); ti++) {
      const int64_t tokens = kTokensGrid[ti];
      char what[128];
      snprintf(what, sizeof what, "%s E=%d k=%d T=%lld", rng_name, s->experts, s->top_k,
               (long long)tokens);
      random_logits(&r, logits, (size_t)(tokens * s->experts), 2.0f);
      const float *bias_or_null = rule == SIGMOID_GROUPED ? bias : NULL;
      run_route(models[i], &b, tokens, logits, bias_or_null, ids, weights);
      const int64_t near = check_route(&c, tokens, logits, bias_or_null, ids, weights, what);
      /* ~1% of random DeepSeek-like rows have a gap under NEAR_TIE; many more
       * would mean the margins (or the GPU's scores) are off */
      cr_expect(near <= tokens / 20 + 2, "%s: %lld of %lld tokens are near-ties", what,
                (long long)near, (long long)tokens);
    }
    bufs_free(&b);
    moejit_model_destroy(models[i]);
  }
  free(logits);
  free(ids);
  free(weights);
}

TestSuite(route_gpu, .timeout = 600);

Test(route_gpu, softmax_renormalized_grid) {
  OPS_REQUIRE_GPU();
  run_grid(SOFTMAX_RENORM, MOEJIT_DTYPE_FP32, "softmax-renorm");
}

Test(route_gpu, softmax_plain_grid) {
  OPS_REQUIRE_GPU();
  run_grid(SOFTMAX_PLAIN, MOEJIT_DTYPE_FP32, "softmax-plain");
}

Test(route_gpu, sigmoid_grouped_grid) {
  OPS_REQUIRE_GPU();
  run_grid(SIGMOID_GROUPED, MOEJIT_DTYPE_FP32, "sigmoid-grouped");
}

/* One (rule, E, k, dtype) model, run on the given logits; checked. */
static void run_case(const moejit_spec *s, int64_t tokens, float *logits, const float *bias,
                     const char *what, int32_t *ids_out, float *weights_out) {
  moejit_model *m = NULL;
  ops_load_models(s, 1, MJ_OPS_ROUTE, &m);
  route_bufs b = bufs_alloc(tokens, s->experts, s->top_k);
  int32_t *ids = ids_out ? ids_out : malloc(sizeof(int32_t) * (size_t)(tokens * s->top_k));
  float *w = weights_out ? weights_out : malloc(sizeof(float) * (size_t)(tokens * s->top_k));
  run_route(m, &b, tokens, logits, bias, ids, w);
  const ref_route_cfg c = ref_cfg(s);
  check_route(&c, tokens, logits, bias, ids, w, what);
  if (!ids_out) free(ids);
  if (!weights_out) free(w);
  bufs_free(&b);
  moejit_model_destroy(m);
}

Test(route_gpu, bf16_logits) {
  OPS_REQUIRE_GPU();
  /* bf16 logits repeat values often: many exact ties, resolved by index. */
  const struct {
    rule_kind rule;
    int experts, top_k;
  } cases[] = {{SOFTMAX_RENORM, 8, 2},    {SOFTMAX_RENORM, 128, 8}, {SOFTMAX_PLAIN, 64, 8},
               {SIGMOID_GROUPED, 256, 8}, {SIGMOID_GROUPED, 64, 4}, {SOFTMAX_PLAIN, 256, 1}};
  moejit_spec specs[MJ_ARRAY_LEN(cases)];
  moejit_model *models[MJ_ARRAY_LEN(cases)];
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++)
    specs[i] = route_spec(cases[i].rule, cases[i].experts, cases[i].top_k, MOEJIT_DTYPE_BF16);
  ops_load_models(specs, MJ_ARRAY_LEN(cases), MJ_OPS_ROUTE, models); /* warm, in parallel */
  ts_rng r = ts_rng_fresh("route-bf16");
  const int64_t tokens = 16384;
  float *logits = malloc(sizeof(float) * (size_t)tokens * 256);
  float bias[256];
  for (int e = 0; e < 256; e++) bias[e] = (float)ts_uniform(&r, -0.1, 0.1);
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    random_logits(&r, logits, (size_t)tokens * (size_t)specs[i].experts, 2.0f);
    run_case(&specs[i], tokens, logits, cases[i].rule == SIGMOID_GROUPED ? bias : NULL, "bf16",
             NULL, NULL);
    moejit_model_destroy(models[i]);
  }
  free(logits);
}

Test(route_gpu, ties_go_to_the_lower_index) {
  OPS_REQUIRE_GPU();
  ts_rng r = ts_rng_fresh("route-ties");
  const int64_t tokens = 1000;
  for (rule_kind rule = SOFTMAX_RENORM; rule <= SIGMOID_GROUPED; rule++) {
    const moejit_spec s = route_spec(rule, 64, 8, MOEJIT_DTYPE_FP32);
    float *logits = malloc(sizeof(float) * (size_t)tokens * 64);
    /* three distinct values per row (or one: every expert tied) */
    for (int64_t t = 0; t < tokens; t++)
      for (int e = 0; e < 64; e++)
        logits[t * 64 + e] = t % 10 == 0 ? 1.5f : (float)(ts_next(&r) % 3) - 1.0f;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens * 8);
    float *w = malloc(sizeof(float) * (size_t)tokens * 8);
    run_case(&s, tokens, logits, NULL, "ties", ids, w);
    for (int j = 0; j < 8; j++) /* token 0: all equal -> experts 0..7 */
      cr_expect_eq(ids[j], j, "all-tied row: slot %d picked %d", j, ids[j]);
    free(ids);
    free(w);
    free(logits);
  }
}

Test(route_gpu, one_expert_wins_every_token) {
  OPS_REQUIRE_GPU();
  ts_rng r = ts_rng_fresh("route-one-expert");
  const int64_t tokens = 16384;
  const moejit_spec s = route_spec(SOFTMAX_RENORM, 128, 8, MOEJIT_DTYPE_FP32);
  float *logits = malloc(sizeof(float) * (size_t)tokens * 128);
  random_logits(&r, logits, (size_t)tokens * 128, 1.0f);
  for (int64_t t = 0; t < tokens; t++) logits[t * 128 + 77] = 20.0f;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens * 8);
  run_case(&s, tokens, logits, NULL, "one-expert", ids, NULL);
  for (int64_t t = 0; t < tokens; t++) cr_assert_eq(ids[t * 8], 77, "token %lld", (long long)t);
  free(ids);
  free(logits);
}

/* Rows mixing NaN, +inf and -inf with numbers, plus all-NaN and all--inf
 * rows, for every rule: ids as the reference says, weights finite. */
Test(route_gpu, nan_and_inf_logits) {
  OPS_REQUIRE_GPU();
  ts_rng r = ts_rng_fresh("route-nan");
  const int64_t tokens = 1000;
  const int experts = 64;
  float bias[64];
  for (int e = 0; e < experts; e++) bias[e] = (float)ts_uniform(&r, -0.1, 0.1);
  for (rule_kind rule = SOFTMAX_RENORM; rule <= SIGMOID_GROUPED; rule++) {
    const moejit_spec s = route_spec(rule, experts, 4, MOEJIT_DTYPE_FP32);
    float *logits = malloc(sizeof(float) * (size_t)tokens * experts);
    for (int64_t t = 0; t < tokens; t++)
      for (int e = 0; e < experts; e++) {
        float *v = &logits[t * experts + e];
        const uint64_t u = ts_next(&r) % 16;
        *v = u == 0 ? NAN : u == 1 ? INFINITY : u == 2 ? -INFINITY : ts_normal(&r);
        if (t % 7 == 0) *v = NAN;                 /* all NaN */
        if (t % 7 == 1) *v = -INFINITY;           /* all -inf */
        if (t % 7 == 2) *v = e == 5 ? 0.5f : NAN; /* one number among NaNs */
      }
    float *w = malloc(sizeof(float) * (size_t)tokens * 4);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens * 4);
    run_case(&s, tokens, logits, rule == SIGMOID_GROUPED ? bias : NULL, "nan-inf", ids, w);
    for (int64_t i = 0; i < tokens * 4; i++)
      cr_assert(isfinite(w[i]), "weight %lld: %g", (long long)i, w[i]);
    if (rule != SIGMOID_GROUPED) {
      cr_expect_eq(ids[0], 0, "all-NaN row picks expert 0 first");
      cr_expect_eq(ids[2 * 4], 5, "the one number among NaNs wins");
    }
    free(ids);
    free(w);
    free(logits);
  }
}

Test(route_gpu, sigmoid_without_renormalization_or_bias) {
  OPS_REQUIRE_GPU();
  moejit_spec s = route_spec(SIGMOID_GROUPED, 256, 8, MOEJIT_DTYPE_FP32);
  s.routing.renormalize = 0;
  ts_rng r = ts_rng_fresh("route-sigmoid-plain");
  const int64_t tokens = 1000;
  float *logits = malloc(sizeof(float) * (size_t)tokens * 256);
  random_logits(&r, logits, (size_t)tokens * 256, 2.0f);
  run_case(&s, tokens, logits, NULL, "sigmoid-plain", NULL, NULL);
  free(logits);
}

Test(route_gpu, bad_arguments_are_refused_before_launching) {
  OPS_REQUIRE_GPU();
  const moejit_spec s = route_spec(SOFTMAX_RENORM, 64, 4, MOEJIT_DTYPE_FP32);
  moejit_model *m = NULL;
  ops_load_models(&s, 1, MJ_OPS_ROUTE, &m);
  route_bufs b = bufs_alloc(16, 64, 4);
  ops_poison(b.ids, 16 * 4 * 4, OPS_POISON_NAN);
  const moejit_route_args good = {
      .tokens = 16, .logits = b.logits, .bias = NULL, .topk_ids = b.ids, .topk_weights = b.weights};
  moejit_route_args a;
#define REFUSED(field_change, needle)                                                              \
  do {                                                                                             \
    a = good;                                                                                      \
    field_change;                                                                                  \
    cr_expect_eq(moejit_route(m, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT, #field_change);           \
    cr_expect(strstr(moejit_last_error(), needle), "message '%s' lacks '%s'", moejit_last_error(), \
              needle);                                                                             \
  } while (0)
  REFUSED(a.tokens = 0, "tokens");
  REFUSED(a.tokens = INT32_MAX / 4 + 1, "tokens");
  REFUSED(a.logits = NULL, "logits");
  REFUSED(a.logits = (char *)b.logits + 4, "aligned");
  REFUSED(a.bias = (const float *)((char *)b.bias + 4), "bias");
  REFUSED(a.topk_ids = NULL, "topk_ids");
  REFUSED(a.topk_weights = NULL, "topk_weights");
  REFUSED(a.topk_ids = (int32_t *)((char *)b.ids + 2), "topk_ids");
#undef REFUSED
  cr_expect_eq(moejit_route(m, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_route(NULL, &good, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_align_args none = {0};
  cr_expect_eq(moejit_align(m, &none, NULL), MOEJIT_ERR_INVALID_ARGUMENT,
               "a route-only model refuses align");
  int32_t ids[64];
  ops_download(ids, b.ids, sizeof ids);
  cr_expect(ops_all_words(ids, sizeof ids, OPS_POISON_NAN), "a refused call wrote its outputs");
  bufs_free(&b);
  moejit_model_destroy(m);
}
