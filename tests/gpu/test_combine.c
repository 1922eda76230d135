/* moejit_combine on the GPU against the float64 reference (ref_combine.c):
 * bf16/fp16/fp32 rows into bf16/fp16/fp32 outputs, weighted and plain sums,
 * dropped rows (row_of = -1), T in {1, 7, 1000, 16384}; outputs poisoned
 * before each run, two runs bitwise identical; bad arguments refused; and
 * route -> align -> combine end to end with identity experts (y = xs), where
 * out[t] must be x[t] times the sum of the token's weights. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_align.h"
#include "ref_combine.h"
#include "ref_dtype.h"

/* fp32 accumulation of k terms: a few ulps of sum |w y|; then one rounding
 * to the output dtype (half an ulp of the result). */
#define ACC_RTOL 1e-6

static double out_rtol(moejit_dtype d) {
  return d == MOEJIT_DTYPE_BF16 ? 0x1p-8 : d == MOEJIT_DTYPE_FP16 ? 0x1p-11 : 0.0;
}

/* Half the spacing of the output dtype's subnormals: below the smallest
 * normal (fp16: 2^-14) rounding is absolute, not relative. */
static double out_atol(moejit_dtype d) {
  return d == MOEJIT_DTYPE_FP16 ? 0x1p-25 : d == MOEJIT_DTYPE_BF16 ? 0x1p-134 : 0x1p-150;
}

typedef struct combine_bufs {
  void *y, *out;
  int32_t *row_of;
  float *weights;
} combine_bufs;

static size_t act_bytes(const moejit_spec *s) {
  return moejit_dtype_size(s->act_dtype);
}
static size_t out_bytes(const moejit_spec *s) {
  return moejit_dtype_size(s->out_dtype);
}

static combine_bufs bufs_alloc(const moejit_spec *s, int64_t tokens) {
  const size_t entries = (size_t)(tokens * s->top_k), d = (size_t)s->hidden;
  combine_bufs b = {ops_alloc(entries * d * act_bytes(s)),
                    ops_alloc((size_t)tokens * d * out_bytes(s)), ops_alloc(entries * 4),
                    ops_alloc(entries * 4)};
  return b;
}

static void bufs_free(combine_bufs *b) {
  ops_free(b->y);
  ops_free(b->out);
  ops_free(b->row_of);
  ops_free(b->weights);
}

/* Runs combine twice (poisoned output), checks the runs agree bitwise and
 * returns the output as floats. */
static void run_combine(const moejit_model *m, const combine_bufs *b, int64_t tokens, int weighted,
                        float *out) {
  const moejit_spec *s = moejit_model_spec(m);
  const size_t n = (size_t)tokens * (size_t)s->hidden, bytes = n * out_bytes(s);
  void *raw[2] = {malloc(bytes), malloc(bytes)};
  cr_assert(raw[0] && raw[1]);
  const moejit_combine_args a = {.tokens = tokens,
                                 .y = b->y,
                                 .row_of = b->row_of,
                                 .weights = weighted ? b->weights : NULL,
                                 .out = b->out};
  for (int run = 0; run < 2; run++) {
    ops_poison(b->out, bytes, OPS_POISON_NAN);
    OPS_OK(moejit_combine(m, &a, NULL));
    ops_download(raw[run], b->out, bytes);
  }
  cr_assert(!memcmp(raw[0], raw[1], bytes), "two identical combine runs differ");
  ref_unpack(s->out_dtype, raw[0], out, n);
  free(raw[0]);
  free(raw[1]);
}

static void check_out(const moejit_spec *s, int64_t tokens, const float *got, const double *want,
                      const double *magnitude, const char *what) {
  const double rtol = out_rtol(s->out_dtype);
  for (int64_t i = 0; i < tokens * s->hidden; i++) {
    const double err = fabs(got[i] - want[i]);
    const double tol = ACC_RTOL * magnitude[i] + rtol * fabs(want[i]) + out_atol(s->out_dtype);
    cr_assert(err <= tol, "%s: out[%lld][%lld] = %.9g, reference %.9g (err %.3g > tol %.3g)", what,
              (long long)(i / s->hidden), (long long)(i % s->hidden), got[i], want[i], err, tol);
  }
}

/* Random rows y (stored dtype), weights, and row_of from a reference align
 * of random ids (a real permutation), with experts outside a range dropped
 * when `ep` is set. Uploads all; fills the host copies. */
static void random_inputs(const moejit_spec *s, const combine_bufs *b, int64_t tokens, int ep,
                          ts_rng *r, float *y, float *w, int32_t *row_of) {
  const int64_t entries = tokens * s->top_k;
  const size_t n_y = (size_t)entries * (size_t)s->hidden;
  for (size_t i = 0; i < n_y; i++) y[i] = (float)ts_uniform(r, -2.0, 2.0); /* cheap: ~10^9 values */
  for (int64_t i = 0; i < entries; i++) w[i] = (float)ts_uniform(r, 0.0, 1.0);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)entries);
  ops_random_ids(r, tokens, s->top_k, s->experts, ids);
  const ref_align_shape shape = {.tokens = tokens,
                                 .top_k = s->top_k,
                                 .experts = s->experts,
                                 .first = 0,
                                 .last = ep ? s->experts / 2 : s->experts,
                                 .tile_m = s->gemm1.tile_m};
  ref_align_out o;
  cr_assert(ref_align_out_alloc(&shape, &o));
  ref_align(&shape, ids, &o);
  memcpy(row_of, o.row_of, sizeof(int32_t) * (size_t)entries);
  ref_align_out_free(&o);
  free(ids);
  void *packed = malloc(n_y * act_bytes(s));
  cr_assert_not_null(packed);
  ref_pack(s->act_dtype, y, packed, n_y);
  ref_unpack(s->act_dtype, packed, y, n_y); /* the reference sees the stored values */
  ops_upload(b->y, packed, n_y * act_bytes(s));
  ops_upload(b->weights, w, sizeof(float) * (size_t)entries);
  ops_upload(b->row_of, row_of, sizeof(int32_t) * (size_t)entries);
  free(packed);
}

static void run_cases(moejit_spec *specs, size_t n_specs, const int64_t *tokens, size_t n_tokens,
                      const char *rng_name) {
  moejit_model **models = calloc(n_specs, sizeof *models);
  ops_load_models(specs, n_specs, MJ_OPS_COMBINE, models);
  ts_rng r = ts_rng_fresh(rng_name);
  for (size_t i = 0; i < n_specs; i++) {
    const moejit_spec *s = &specs[i];
    for (size_t ti = 0; ti < n_tokens; ti++) {
      const int64_t T = tokens[ti], entries = T * s->top_k, n_out = T * s->hidden;
      float *y = malloc(sizeof(float) * (size_t)(entries * s->hidden));
      float *w = malloc(sizeof(float) * (size_t)entries),
            *out = malloc(sizeof(float) * (size_t)n_out);
      int32_t *row_of = malloc(sizeof(int32_t) * (size_t)entries);
      double *want = malloc(sizeof(double) * (size_t)n_out),
             *mag = malloc(sizeof(double) * (size_t)n_out);
      cr_assert(y && w && out && row_of && want && mag);
      combine_bufs b = bufs_alloc(s, T);
      for (int variant = 0; variant < 3; variant++) { /* weighted, plain, weighted + EP */
        char what[128];
        snprintf(what, sizeof what, "%s E=%d k=%d d=%lld %s->%s T=%lld %s", rng_name, s->experts,
                 s->top_k, (long long)s->hidden, moejit_dtype_name(s->act_dtype),
                 moejit_dtype_name(s->out_dtype), (long long)T,
                 variant == 0   ? "weighted"
                 : variant == 1 ? "plain"
                                : "weighted, half dropped");
        random_inputs(s, &b, T, variant == 2, &r, y, w, row_of);
        run_combine(models[i], &b, T, variant != 1, out);
        ref_combine(T, s->top_k, s->hidden, y, row_of, variant != 1 ? w : NULL, want, mag);
        check_out(s, T, out, want, mag, what);
      }
      bufs_free(&b);
      free(y), free(w), free(out), free(row_of), free(want), free(mag);
    }
    moejit_model_destroy(models[i]);
  }
  free(models);
}

TestSuite(combine_gpu, .timeout = 600);

Test(combine_gpu, every_dtype_pair_small_and_odd_sizes) {
  OPS_REQUIRE_GPU();
  moejit_spec specs[] = {ops_spec(8, 2, 256),  ops_spec(64, 8, 512), ops_spec(128, 8, 264),
                         ops_spec(256, 1, 64), ops_spec(64, 4, 8),   ops_spec(32, 8, 1024)};
  specs[1].out_dtype = MOEJIT_DTYPE_FP32;
  specs[2].act_dtype = specs[2].out_dtype = MOEJIT_DTYPE_FP16;
  specs[3].act_dtype = specs[3].out_dtype = MOEJIT_DTYPE_FP32;
  specs[4].act_dtype = MOEJIT_DTYPE_FP32;
  specs[5].combine.block_threads = 1024;
  const int64_t tokens[] = {1, 7, 1000};
  run_cases(specs, MJ_ARRAY_LEN(specs), tokens, MJ_ARRAY_LEN(tokens), "combine-small");
}

Test(combine_gpu, preset_shapes_at_16384_tokens) {
  OPS_REQUIRE_GPU();
  moejit_spec specs[] = {ops_spec(128, 8, 2048), ops_spec(128, 8, 2048)};
  specs[1].out_dtype = MOEJIT_DTYPE_FP32;
  const int64_t tokens[] = {16384};
  run_cases(specs, MJ_ARRAY_LEN(specs), tokens, 1, "combine-16384");
}

Test(combine_gpu, deepseek_rows) {
  OPS_REQUIRE_GPU();
  moejit_spec s = ops_spec(256, 8, 7168);
  const int64_t tokens[] = {7, 1000};
  run_cases(&s, 1, tokens, MJ_ARRAY_LEN(tokens), "combine-7168");
}

/* route -> align -> combine with y = xs (identity experts): out[t] =
 * x[t] * sum_j w[t, j], for a softmax (sum 1) and the DeepSeek rule (sum
 * 2.5 with renormalization). */
Test(combine_gpu, route_align_combine_with_identity_experts) {
  OPS_REQUIRE_GPU();
  moejit_spec specs[2] = {ops_spec(128, 8, 512), ops_spec(256, 8, 512)};
  specs[0].out_dtype = specs[1].out_dtype = MOEJIT_DTYPE_FP32;
  specs[1].routing.rule = MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK;
  specs[1].routing.n_group = 8;
  specs[1].routing.topk_group = 4;
  specs[1].routing.scaling_factor = 2.5f;
  moejit_model *models[2];
  ops_load_models(specs, 2, MJ_OPS_ALL, models);
  ts_rng r = ts_rng_fresh("combine-pipeline");
  const int64_t T = 1000, d = 512;
  for (int i = 0; i < 2; i++) {
    const moejit_spec *s = &specs[i];
    const int E = s->experts, k = s->top_k;
    float *logits = malloc(sizeof(float) * (size_t)(T * E)),
          *x = malloc(sizeof(float) * (size_t)(T * d));
    uint16_t *x16 = malloc(2 * (size_t)(T * d));
    float *w = malloc(sizeof(float) * (size_t)(T * k)),
          *out = malloc(sizeof(float) * (size_t)(T * d));
    for (int64_t j = 0; j < T * E; j++) logits[j] = ts_normal(&r);
    for (int64_t j = 0; j < T * d; j++) x[j] = ts_normal(&r);
    ref_pack(MOEJIT_DTYPE_BF16, x, x16, (size_t)(T * d));
    ref_unpack(MOEJIT_DTYPE_BF16, x16, x, (size_t)(T * d));

    void *d_logits = ops_alloc(sizeof(float) * (size_t)(T * E)),
         *d_x = ops_alloc(2 * (size_t)(T * d));
    int32_t *d_ids = ops_alloc(4 * (size_t)(T * k));
    float *d_w = ops_alloc(4 * (size_t)(T * k));
    void *d_out = ops_alloc(4 * (size_t)(T * d));
    ops_upload(d_logits, logits, sizeof(float) * (size_t)(T * E));
    ops_upload(d_x, x16, 2 * (size_t)(T * d));
    const moejit_route_args ra = {
        .tokens = T, .logits = d_logits, .topk_ids = d_ids, .topk_weights = d_w};
    OPS_OK(moejit_route(models[i], &ra, NULL));

    int64_t cap;
    size_t ws;
    OPS_OK(moejit_align_tile_capacity(models[i], T, &cap));
    OPS_OK(moejit_align_workspace_size(models[i], T, &ws));
    void *bufs[9];
    const size_t sizes[9] = {4 * (size_t)E,
                             4 * (size_t)(E + 1),
                             4 * (size_t)(T * k),
                             4 * (size_t)(T * k),
                             4 * (size_t)cap,
                             4 * (size_t)cap,
                             4,
                             ws,
                             2 * (size_t)(T * k * d)};
    for (int j = 0; j < 9; j++) bufs[j] = ops_alloc(sizes[j]);
    const moejit_align_args aa = {.tokens = T,
                                  .topk_ids = d_ids,
                                  .x = d_x,
                                  .xs = bufs[8],
                                  .expert_counts = bufs[0],
                                  .expert_offsets = bufs[1],
                                  .sorted_slot = bufs[2],
                                  .row_of = bufs[3],
                                  .tile_expert = bufs[4],
                                  .tile_row_start = bufs[5],
                                  .num_tiles = bufs[6],
                                  .workspace = bufs[7],
                                  .workspace_bytes = ws};
    OPS_OK(moejit_align(models[i], &aa, NULL));
    const moejit_combine_args ca = {
        .tokens = T, .y = bufs[8], .row_of = bufs[3], .weights = d_w, .out = d_out};
    OPS_OK(moejit_combine(models[i], &ca, NULL));
    ops_download(w, d_w, 4 * (size_t)(T * k));
    ops_download(out, d_out, 4 * (size_t)(T * d));
    for (int64_t t = 0; t < T; t++) {
      double sum = 0;
      for (int j = 0; j < k; j++) sum += w[t * k + j];
      cr_assert(fabs(sum - s->routing.scaling_factor) < 1e-5, "token %lld: weights sum to %g",
                (long long)t, sum);
      for (int64_t c = 0; c < d; c++) {
        const double want = x[t * d + c] * sum;
        cr_assert(fabs(out[t * d + c] - want) <= 1e-5 * fabs(want) + 1e-6 * sum,
                  "rule %d token %lld col %lld: %.9g, expected %.9g", i, (long long)t, (long long)c,
                  out[t * d + c], want);
      }
    }
    for (int j = 0; j < 9; j++) ops_free(bufs[j]);
    ops_free(d_logits), ops_free(d_x), ops_free(d_ids), ops_free(d_w), ops_free(d_out);
    free(logits), free(x), free(x16), free(w), free(out);
    moejit_model_destroy(models[i]);
  }
}

Test(combine_gpu, bad_arguments_are_refused_before_launching) {
  OPS_REQUIRE_GPU();
  const moejit_spec s = ops_spec(64, 4, 256);
  moejit_model *m = NULL;
  ops_load_models(&s, 1, MJ_OPS_COMBINE, &m);
  combine_bufs b = bufs_alloc(&s, 16);
  ops_poison(b.out, 16 * 256 * 2, OPS_POISON_NAN);
  const moejit_combine_args good = {
      .tokens = 16, .y = b.y, .row_of = b.row_of, .weights = b.weights, .out = b.out};
  moejit_combine_args a;
#define REFUSED(change, needle)                                                            \
  do {                                                                                     \
    a = good;                                                                              \
    change;                                                                                \
    cr_expect_eq(moejit_combine(m, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT, #change);       \
    cr_expect(strstr(moejit_last_error(), needle), "%s: message '%s' lacks '%s'", #change, \
              moejit_last_error(), needle);                                                \
  } while (0)
  REFUSED(a.tokens = 0, "tokens");
  REFUSED(a.tokens = -5, "tokens");
  REFUSED(a.y = NULL, "y");
  REFUSED(a.y = (const char *)b.y + 2, "aligned");
  REFUSED(a.row_of = NULL, "row_of");
  REFUSED(a.weights = (const float *)((const char *)b.weights + 1), "weights");
  REFUSED(a.out = NULL, "out");
  REFUSED(a.out = (char *)b.out + 8, "aligned");
#undef REFUSED
  uint32_t out[16 * 128];
  ops_download(out, b.out, sizeof out);
  cr_expect(ops_all_words(out, sizeof out, OPS_POISON_NAN), "a refused call wrote its output");
  bufs_free(&b);
  moejit_model_destroy(m);
}
