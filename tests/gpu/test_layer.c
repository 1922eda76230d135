/* The whole MoE layer (moejit_moe_forward) on the GPU against the float64
 * reference (ref_layer.c, ref_route.c): all four presets at their full size
 * (deepseek-v3's 22 GB of weights are filled on the GPU) at T in {1, 7,
 * 256, 2048}, a sample of tokens checked at large T, every output element
 * written (poisoned before each run); CUDA-graph capture + replay bitwise
 * equal to eager; two models in one ctx; bad arguments refused with nothing
 * enqueued; and what the load report says. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layer_gpu.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_dtype.h"
#include "ref_gemm.h"
#include "ref_layer.h"
#include "ref_route.h"
#include "runtime/runtime.h"

#define LAYER_RTOL 1e-2  /* bf16 activations and outputs */
#define WEIGHT_RTOL 1e-5 /* routing weights, fp32 vs float64 */
#define NEAR_TIE 4e-6    /* route decisions this close may legitimately differ */
#define SAMPLES 6        /* tokens checked when T > 8 */

static const int64_t kTokens[] = {1, 7, 256, 2048};

/* One model's inputs for up to max_tokens tokens, device and host. */
typedef struct layer_io {
  moejit_model *model;
  const moejit_spec *spec;
  int64_t max_tokens;
  lg_weights w;
  lg_periodic px; /* x is periodic too */
  float *logits;  /* host [T, E] as the GPU reads them */
  float *bias;    /* host [E] (sigmoid rule) or NULL */
  void *d_x, *d_logits, *d_bias, *d_out, *d_ws, *d_ids, *d_weights;
  size_t ws_bytes;
} layer_io;

static moejit_model *load(const char *config, moejit_load_report *r) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.report = r;
  moejit_model *m = NULL;
  OPS_OK(moejit_model_load_config(ops_ctx(), config, &o, &m));
  cr_assert_eq(r->n_kernels, 5, "a layer has 5 kernel families, report says %d", r->n_kernels);
  cr_assert_eq(r->cache_hits + r->cache_misses, 5);
  /* "tuned" where configs/tuned/ (or $MOEJIT_TUNED_DIR) holds this device's
   * table for the preset: test_layer_tuned.c checks that path */
  for (int i = 0; i < r->n_kernels; i++) {
    const moejit_load_kernel *k = &r->kernels[i];
    cr_expect(!strcmp(k->config_source, "heuristic") || !strcmp(k->config_source, "tuned"),
              "%s: config_source '%s'", k->kernel, k->config_source);
    cr_expect(k->config_detail[0] != '\0', "%s: no config_detail", k->kernel);
  }
  return m;
}

static void io_make(layer_io *io, moejit_model *m, int64_t max_tokens, ts_rng *rng) {
  memset(io, 0, sizeof *io);
  const moejit_spec *s = moejit_model_spec(m);
  io->model = m, io->spec = s, io->max_tokens = max_tokens;
  lg_weights_make(&io->w, s, rng);
  lg_periodic_make(&io->px, s->act_dtype, 1.0, rng);
  const size_t n_logits = (size_t)max_tokens * s->experts, lsz = moejit_dtype_size(s->logits_dtype);
  io->logits = malloc(sizeof(float) * n_logits);
  void *packed = malloc(lsz * n_logits);
  cr_assert(io->logits && packed);
  for (size_t i = 0; i < n_logits; i++) io->logits[i] = 2.0f * ts_normal(rng);
  ref_pack(s->logits_dtype, io->logits, packed, n_logits);
  ref_unpack(s->logits_dtype, packed, io->logits, n_logits); /* what the GPU reads */
  io->d_logits = ops_alloc(lsz * n_logits);
  ops_upload(io->d_logits, packed, lsz * n_logits);
  free(packed);
  if (s->routing.rule == MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK) {
    io->bias = malloc(sizeof(float) * (size_t)s->experts);
    cr_assert(io->bias);
    for (int e = 0; e < s->experts; e++) io->bias[e] = (float)ts_uniform(rng, -0.2, 0.2);
    io->d_bias = ops_alloc(sizeof(float) * (size_t)s->experts);
    ops_upload(io->d_bias, io->bias, sizeof(float) * (size_t)s->experts);
  }
  const size_t xd = (size_t)max_tokens * (size_t)s->hidden;
  io->d_x = ops_alloc(xd * moejit_dtype_size(s->act_dtype));
  lg_periodic_fill(&io->px, io->d_x, xd);
  io->d_out = ops_alloc(xd * moejit_dtype_size(s->out_dtype));
  io->d_ids = ops_alloc((size_t)max_tokens * s->top_k * 4);
  io->d_weights = ops_alloc((size_t)max_tokens * s->top_k * 4);
  OPS_OK(moejit_moe_workspace_size(m, max_tokens, &io->ws_bytes));
  io->d_ws = ops_alloc(io->ws_bytes);
}

static void io_free(layer_io *io) {
  void *d[] = {io->d_x, io->d_logits, io->d_bias, io->d_out, io->d_ws, io->d_ids, io->d_weights};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) ops_free(d[i]);
  lg_weights_free(&io->w);
  lg_periodic_free(&io->px);
  free(io->logits);
  free(io->bias);
}

static moejit_moe_args io_args(const layer_io *io, int64_t tokens) {
  moejit_moe_args a = {.tokens = tokens,
                       .x = io->d_x,
                       .logits = io->d_logits,
                       .route_bias = io->d_bias,
                       .w1 = io->w.d_w1,
                       .w2 = io->w.d_w2,
                       .out = io->d_out,
                       .workspace = io->d_ws,
                       .workspace_bytes = io->ws_bytes,
                       .topk_ids = io->d_ids,
                       .topk_weights = io->d_weights};
  return a;
}

static size_t out_bytes(const layer_io *io, int64_t tokens) {
  return (size_t)tokens * (size_t)io->spec->hidden * moejit_dtype_size(io->spec->out_dtype);
}

/* Poisons every output, runs the forward on `stream`, downloads. */
static void run_eager(const layer_io *io, int64_t tokens, moejit_stream stream, void *out,
                      int32_t *ids, float *weights) {
  const size_t nk = (size_t)tokens * io->spec->top_k;
  ops_poison(io->d_out, out_bytes(io, tokens), OPS_POISON_NAN);
  ops_poison(io->d_ids, nk * 4, OPS_POISON_INT);
  ops_poison(io->d_weights, nk * 4, OPS_POISON_NAN);
  ops_sync();
  moejit_moe_args a = io_args(io, tokens);
  OPS_OK(moejit_moe_forward(io->model, &a, stream));
  OPS_OK(moejit_stream_synchronize(ops_ctx(), stream));
  ops_download(out, io->d_out, out_bytes(io, tokens));
  if (ids) ops_download(ids, io->d_ids, nk * 4);
  if (weights) ops_download(weights, io->d_weights, nk * 4);
}

static ref_route_cfg route_cfg(const moejit_spec *s) {
  ref_route_cfg c = {.experts = s->experts,
                     .top_k = s->top_k,
                     .rule = (int)s->routing.rule,
                     .renormalize = s->routing.renormalize,
                     .n_group = s->routing.rule ? s->routing.n_group : 1,
                     .topk_group = s->routing.rule ? s->routing.topk_group : 1,
                     .scaling_factor = s->routing.scaling_factor};
  return c;
}

/* The GPU's routing of token t against the reference: same ids (unless the
 * reference flags a near-tie) and weights within WEIGHT_RTOL. */
static void check_route_token(const layer_io *io, int64_t t, const int32_t *ids, const float *w,
                              const char *what) {
  const ref_route_cfg c = route_cfg(io->spec);
  int ref_ids[32];
  double ref_w[32];
  const double margin = ref_route_token(&c, io->logits + t * c.experts, io->bias, ref_ids, ref_w);
  int differ = -1;
  for (int j = c.top_k - 1; j >= 0; j--)
    if (ref_ids[j] != ids[j]) differ = j;
  if (differ >= 0) {
    cr_assert(margin <= NEAR_TIE,
              "%s: token %lld: GPU chose expert %d in slot %d, reference %d (margin %.3g)", what,
              (long long)t, ids[differ], differ, ref_ids[differ], margin);
    int gpu_ids[32];
    for (int j = 0; j < c.top_k; j++) gpu_ids[j] = ids[j];
    ref_route_weights(&c, io->logits + t * c.experts, gpu_ids, ref_w);
  }
  for (int j = 0; j < c.top_k; j++)
    cr_assert(fabs(w[j] - ref_w[j]) <= WEIGHT_RTOL * fabs(ref_w[j]) + 1e-12,
              "%s: token %lld slot %d: weight %.9g, reference %.9g", what, (long long)t, j, w[j],
              ref_w[j]);
}

static void pick_samples(int64_t tokens, ts_rng *rng, int64_t *tok, size_t *n) {
  if (tokens <= 8) {
    for (int64_t t = 0; t < tokens; t++) tok[t] = t;
    *n = (size_t)tokens;
    return;
  }
  tok[0] = 0, tok[1] = tokens - 1;
  for (int i = 2; i < SAMPLES; i++) tok[i] = 1 + (int64_t)(ts_next(rng) % (uint64_t)(tokens - 2));
  *n = SAMPLES;
}

/* Checks a forward's output: every element written and finite, routing of
 * the sampled tokens, and their rows against the layer reference. */
static void check_output(const layer_io *io, int64_t tokens, const void *out, const int32_t *ids,
                         const float *w, ts_rng *rng, const char *what) {
  const moejit_spec *s = io->spec;
  const size_t d = (size_t)s->hidden, k = (size_t)s->top_k, as = moejit_dtype_size(s->act_dtype);
  float *row = malloc(sizeof(float) * d);
  cr_assert(row);
  for (int64_t t = 0; t < tokens; t++) {
    ref_unpack(s->out_dtype, (const char *)out + (size_t)t * d * moejit_dtype_size(s->out_dtype),
               row, d);
    for (size_t c = 0; c < d; c++)
      cr_assert(isfinite(row[c]), "%s: out[%lld, %zu] = %g (poison left or overflow)", what,
                (long long)t, c, row[c]);
  }
  free(row);
  int64_t tok[SAMPLES > 8 ? SAMPLES : 8];
  size_t n = 0;
  pick_samples(tokens, rng, tok, &n);
  void *x = malloc(as * d * n);
  int32_t *sid = malloc(sizeof(int32_t) * k * n);
  float *sw = malloc(sizeof(float) * k * n);
  double *ref = malloc(sizeof(double) * d * n);
  void *got = malloc(moejit_dtype_size(s->out_dtype) * d * n);
  cr_assert(x && sid && sw && ref && got);
  for (size_t i = 0; i < n; i++) {
    check_route_token(io, tok[i], ids + tok[i] * k, w + tok[i] * k, what);
    lg_periodic_read(&io->px, (size_t)tok[i] * d, d, (char *)x + i * d * as);
    memcpy(sid + i * k, ids + tok[i] * k, sizeof(int32_t) * k);
    memcpy(sw + i * k, w + tok[i] * k, sizeof(float) * k);
    const size_t ob = moejit_dtype_size(s->out_dtype) * d;
    memcpy((char *)got + i * ob, (const char *)out + (size_t)tok[i] * ob, ob);
  }
  ref_layer_shape shape = ref_layer_shape_of(s);
  ref_layer_tokens(&shape, (int64_t)n, x, sid, sw, lg_weights_fetch, (void *)&io->w, ref);
  const double err = ref_gemm_rel_error(s->out_dtype, got, ref, d * n);
  cr_assert(err <= LAYER_RTOL, "%s: T=%lld: relative error %.3g over %zu sampled tokens (> %g)",
            what, (long long)tokens, err, n, LAYER_RTOL);
  free(x), free(sid), free(sw), free(ref), free(got);
}

/* ---- the four presets against the reference -------------------------------- */

static void check_preset(const char *preset) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh(preset);
  moejit_load_report r;
  moejit_model *m = load(preset, &r);
  layer_io io;
  io_make(&io, m, kTokens[sizeof kTokens / sizeof kTokens[0] - 1], &rng);
  const moejit_spec *s = io.spec;
  void *out = malloc(out_bytes(&io, io.max_tokens));
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)io.max_tokens * s->top_k);
  float *w = malloc(sizeof(float) * (size_t)io.max_tokens * s->top_k);
  cr_assert(out && ids && w);
  for (size_t i = 0; i < sizeof kTokens / sizeof kTokens[0]; i++) {
    run_eager(&io, kTokens[i], NULL, out, ids, w);
    check_output(&io, kTokens[i], out, ids, w, &rng, preset);
  }
  free(out), free(ids), free(w);
  io_free(&io);
  moejit_model_destroy(m);
}

Test(layer, qwen3_30b_a3b_matches_reference) {
  check_preset("qwen3-30b-a3b");
}
Test(layer, olmoe_1b_7b_matches_reference) {
  check_preset("olmoe-1b-7b");
}
Test(layer, mixtral_8x7b_matches_reference) {
  check_preset("mixtral-8x7b");
}
Test(layer, deepseek_v3_matches_reference) {
  check_preset("deepseek-v3");
}

/* ---- graph capture ------------------------------------------------------------ */

/* The forward of `tokens` captured on `stream` into a graph. */
static moejit_graph *capture(const layer_io *io, int64_t tokens, moejit_stream stream) {
  moejit_moe_args a = io_args(io, tokens);
  moejit_graph *g = NULL;
  OPS_OK(moejit_graph_begin_capture(ops_ctx(), stream));
  moejit_status fwd = moejit_moe_forward(io->model, &a, stream);
  OPS_OK(moejit_graph_end_capture(ops_ctx(), stream, &g));
  cr_assert_eq(fwd, MOEJIT_OK, "forward inside a capture: %s", moejit_last_error());
  return g;
}

/* Poisons the output, replays g, downloads `bytes` of the output. */
static void replay_into(const layer_io *io, moejit_graph *g, moejit_stream stream, size_t bytes,
                        void *dst) {
  ops_poison(io->d_out, bytes, OPS_POISON_NAN);
  ops_sync();
  OPS_OK(moejit_graph_launch(ops_ctx(), g, stream));
  OPS_OK(moejit_stream_synchronize(ops_ctx(), stream));
  ops_download(dst, io->d_out, bytes);
}

/* GEMM 1's rounds-in-step words of a forward of t tokens: the workspace's
 * last 256-byte region (docs/layer.md, "Workspace layout"), where no
 * K-split scratch follows them (olmoe-1b-7b: K = 1024). */
static void read_round_sync(const layer_io *io, int64_t t, uint32_t words[2]) {
  size_t bytes = 0;
  OPS_OK(moejit_moe_workspace_size(io->model, t, &bytes));
  ops_sync();
  ops_download(words, (const char *)io->d_ws + bytes - 256, 2 * sizeof(uint32_t));
}

/* T = 1 (the decode layer), 256, and 16384 with GEMM 1 on the permuted
 * copy ($MOEJIT_GEMM1_GATHER=0), where its 128x256 tiles keep their rounds
 * in step: a memset and a cooperative launch inside the graph. */
Test(layer, graph_replay_equals_eager_bitwise) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer graph");
  moejit_load_report r;
  moejit_model *m = load("olmoe-1b-7b", &r);
  layer_io io;
  io_make(&io, m, 16384, &rng);
  moejit_ctx *ctx = ops_ctx();
  moejit_stream stream = NULL;
  OPS_OK(moejit_stream_create(ctx, &stream));
  const unsigned long loads_before = mj_ctx_module_loads(ctx);
  const int64_t sizes[] = {1, 256, 16384};
  for (size_t i = 0; i < 3; i++) {
    const int64_t t = sizes[i];
    const int in_step = t == 16384 && ops_ctx_is_sm90a(ctx);
    if (t == 16384) setenv("MOEJIT_GEMM1_GATHER", "0", 1);
    const size_t bytes = out_bytes(&io, t);
    void *eager = malloc(bytes), *replay = malloc(bytes);
    cr_assert(eager && replay);
    run_eager(&io, t, stream, eager, NULL, NULL);
    uint32_t sync_eager[2] = {0, 0}, sync_replay[2] = {0, 0};
    if (in_step) {
      read_round_sync(&io, t, sync_eager);
      cr_expect_eq(sync_eager[0], 0u, "T=%lld: arrivals left zero", (long long)t);
      cr_expect(sync_eager[1] > 0, "T=%lld: GEMM 1's rounds met no barrier", (long long)t);
    }
    moejit_graph *g = capture(&io, t, stream);
    for (int rep = 0; rep < 3; rep++) {
      replay_into(&io, g, stream, bytes, replay);
      cr_assert(memcmp(eager, replay, bytes) == 0, "T=%lld replay %d differs from eager",
                (long long)t, rep);
      if (in_step) { /* each forward zeroes the words, then meets the same barriers */
        read_round_sync(&io, t, sync_replay);
        cr_expect(sync_replay[0] == 0 && sync_replay[1] == sync_eager[1],
                  "T=%lld replay %d: words %u %u, eager left 0 %u", (long long)t, rep,
                  sync_replay[0], sync_replay[1], sync_eager[1]);
      }
    }
    moejit_graph_destroy(ctx, g);
    free(eager), free(replay);
    unsetenv("MOEJIT_GEMM1_GATHER");
  }
  cr_expect_eq(mj_ctx_module_loads(ctx), loads_before, "the forward loaded a module");
  /* end_capture without out still ends the capture: the stream runs work
   * again at once */
  moejit_moe_args a = io_args(&io, 256);
  OPS_OK(moejit_graph_begin_capture(ctx, stream));
  OPS_OK(moejit_moe_forward(io.model, &a, stream));
  cr_expect_eq(moejit_graph_end_capture(ctx, stream, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  OPS_OK(moejit_moe_forward(io.model, &a, stream));
  OPS_OK(moejit_stream_synchronize(ctx, stream));
  /* a graph replays only in the ctx that captured it; the graph's own ctx
   * frees it (ctx NULL) */
  moejit_graph *g = capture(&io, 256, stream);
  moejit_ctx_opts co;
  moejit_ctx_opts_init(&co);
  moejit_ctx *other = NULL;
  OPS_OK(moejit_ctx_create(&other, &co));
  cr_expect_eq(moejit_graph_launch(other, g, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "another ctx"), "%s", moejit_last_error());
  OPS_OK(moejit_graph_launch(ctx, g, stream));
  OPS_OK(moejit_stream_synchronize(ctx, stream));
  moejit_graph_destroy(NULL, g);
  moejit_ctx_destroy(other);
  OPS_OK(moejit_stream_destroy(ctx, stream));
  io_free(&io);
  moejit_model_destroy(m);
}

/* GEMM 2 with its last round split along K (moejit_gemm_args.split):
 * mixtral-8x7b at T = 2048 (K = 14336, 128x256 tiles, 560-592 tiles on 132
 * SMs). The workspace holds the scratch from the load's first splitting T
 * on; the forward matches the reference, graph replay equals eager to the
 * bit, the counters are left zero, and the forward without the split
 * ($MOEJIT_GEMM_KSPLIT=0: row halves) agrees within bf16 rounding. */
static double rel_diff(moejit_dtype dt, const void *a, const void *b, size_t n);

Test(layer, gemm2_splits_along_k_in_graph_replay) {
  OPS_REQUIRE_GPU();
  moejit_ctx *ctx = ops_ctx();
  if (!ops_ctx_is_sm90a(ctx)) cr_skip_test("GEMM 2 splits along K on the sm_90a wgmma path only");
  ts_rng rng = ts_rng_fresh("layer ksplit");
  moejit_load_report r;
  moejit_model *m = load("mixtral-8x7b", &r);
  const int64_t t = 2048;
  cr_assert(m->gemm2_split_bytes > 0 && m->gemm2_split_from <= t,
            "mixtral-8x7b: split scratch %zu bytes from T = %lld", m->gemm2_split_bytes,
            (long long)m->gemm2_split_from);
  layer_io io;
  io_make(&io, m, t, &rng);
  moejit_stream stream = NULL;
  OPS_OK(moejit_stream_create(ctx, &stream));
  const size_t bytes = out_bytes(&io, t), nk = (size_t)t * io.spec->top_k;
  void *eager = malloc(bytes), *replay = malloc(bytes), *halves = malloc(bytes);
  int32_t *ids = malloc(nk * 4);
  float *w = malloc(nk * 4);
  cr_assert(eager && replay && halves && ids && w);
  run_eager(&io, t, stream, eager, ids, w);
  check_output(&io, t, eager, ids, w, &rng, "mixtral-8x7b, K parts");
  /* the scratch is the workspace's last m->gemm2_split_bytes; its counters
   * come first */
  size_t ws = 0;
  OPS_OK(moejit_moe_workspace_size(m, t, &ws));
  const size_t zero = MOEJIT_GEMM2_SPLIT_ZERO_BYTES(mj_ctx_sm_count(ctx));
  unsigned char *counts = malloc(zero);
  cr_assert(counts);
  ops_download(counts, (const char *)io.d_ws + ws - m->gemm2_split_bytes, zero);
  for (size_t i = 0; i < zero; i++)
    cr_assert_eq(counts[i], 0, "counter byte %zu left %d", i, counts[i]);
  moejit_graph *g = capture(&io, t, stream);
  for (int rep = 0; rep < 2; rep++) {
    replay_into(&io, g, stream, bytes, replay);
    cr_assert(memcmp(eager, replay, bytes) == 0, "replay %d differs from eager", rep);
  }
  moejit_graph_destroy(ctx, g);
  setenv("MOEJIT_GEMM_KSPLIT", "0", 1);
  run_eager(&io, t, stream, halves, NULL, NULL);
  unsetenv("MOEJIT_GEMM_KSPLIT");
  const double diff = rel_diff(io.spec->out_dtype, eager, halves, bytes / 2);
  cr_expect(diff < 1e-2, "K parts against row halves: %.3g", diff);
  free(eager), free(replay), free(halves), free(ids), free(w), free(counts);
  OPS_OK(moejit_stream_destroy(ctx, stream));
  io_free(&io);
  moejit_model_destroy(m);
}

Test(layer, capture_needs_a_real_stream) {
  OPS_REQUIRE_GPU();
  cr_expect_eq(moejit_graph_begin_capture(ops_ctx(), NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "stream") != NULL, "%s", moejit_last_error());
}

/* ---- two models, reload, report ------------------------------------------------ */

Test(layer, two_models_in_one_ctx) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer two models");
  moejit_load_report ra, rb, again;
  moejit_model *a = load("qwen3-30b-a3b", &ra), *b = load("olmoe-1b-7b", &rb);
  layer_io ia, ib;
  io_make(&ia, a, 7, &rng);
  io_make(&ib, b, 7, &rng);
  void *out = malloc(out_bytes(&ia, 7) + out_bytes(&ib, 7));
  int32_t ids[7 * 8];
  float w[7 * 8];
  cr_assert(out);
  for (int round = 0; round < 2; round++) { /* interleaved, twice */
    run_eager(&ia, 7, NULL, out, ids, w);
    check_output(&ia, 7, out, ids, w, &rng, "qwen3 beside olmoe");
    run_eager(&ib, 7, NULL, out, ids, w);
    check_output(&ib, 7, out, ids, w, &rng, "olmoe beside qwen3");
  }
  /* Loading the same config again in this ctx: every kernel from the
   * compiler's memory or disk, no new module. */
  const unsigned long loads = mj_ctx_module_loads(ops_ctx());
  moejit_model *a2 = load("qwen3-30b-a3b", &again);
  cr_expect_eq(again.cache_hits, 5, "reload: %d hits", again.cache_hits);
  cr_expect_eq(mj_ctx_module_loads(ops_ctx()), loads, "reload loaded a module");
  cr_expect_str_eq(again.origin, "preset:qwen3-30b-a3b");
  moejit_load_report copy;
  OPS_OK(moejit_model_load_report(a2, &copy));
  cr_expect_eq(copy.cache_hits, again.cache_hits);
  moejit_model_destroy(a2);
  free(out);
  io_free(&ia);
  io_free(&ib);
  moejit_model_destroy(a);
  moejit_model_destroy(b);
}

/* ---- the decode layer ------------------------------------------------------------ */

/* At T <= 8 and T * k <= 32 with both GEMMs on the GEMV path the forward
 * is two launches (route + GEMM 1 in one, GEMM 2 + combine in the other;
 * past 8 entries their wide pair): against the reference and against the
 * unfused chain ($MOEJIT_LAYER_DECODE=0), with ragged K (chunks not a
 * multiple of the warp), fp16, fp32 out, the sigmoid rule, and experts
 * holding every token's rows. */

static moejit_model *load_heuristic(const moejit_spec *s) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.tuned_disable = 1; /* AUTO: GEMV at T * k <= 8 */
  moejit_model *m = NULL;
  OPS_OK(moejit_model_load_spec(ops_ctx(), s, &o, &m));
  return m;
}

/* Every token prefers experts hot[0] > hot[1] > ... (the rest far below):
 * each hot expert gets one row per token. */
static void logits_hot(layer_io *io, int64_t tokens, ts_rng *rng) {
  const moejit_spec *s = io->spec;
  const int E = s->experts;
  const size_t n = (size_t)tokens * E, lsz = moejit_dtype_size(s->logits_dtype);
  for (int64_t t = 0; t < tokens; t++)
    for (int e = 0; e < E; e++) io->logits[t * E + e] = (float)ts_uniform(rng, -4.0, -3.0);
  for (int64_t t = 0; t < tokens; t++)
    for (int j = 0; j < s->top_k; j++) io->logits[t * E + (3 + 5 * j) % E] = 8.0f - (float)j;
  void *packed = malloc(lsz * n);
  cr_assert(packed);
  ref_pack(s->logits_dtype, io->logits, packed, n);
  ref_unpack(s->logits_dtype, packed, io->logits, n);
  ops_upload(io->d_logits, packed, lsz * n);
  free(packed);
}

static double rel_diff(moejit_dtype dt, const void *a, const void *b, size_t n) {
  float *fa = malloc(sizeof(float) * n), *fb = malloc(sizeof(float) * n);
  cr_assert(fa && fb);
  ref_unpack(dt, a, fa, n);
  ref_unpack(dt, b, fb, n);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)fa[i] - fb[i]) * ((double)fa[i] - fb[i]);
    den += (double)fb[i] * fb[i];
  }
  free(fa), free(fb);
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The decode layer and the unfused chain at T tokens, both against the
 * reference; routing identical to the bit, outputs within bf16 rounding. */
static void decode_case(layer_io *io, int64_t tokens, ts_rng *rng, const char *what) {
  const moejit_spec *s = io->spec;
  const size_t nk = (size_t)tokens * s->top_k, ob = out_bytes(io, tokens);
  void *out_d = malloc(ob), *out_u = malloc(ob), *out_b = malloc(ob);
  int32_t ids_d[MOEJIT_DECODE_MAX_ENTRIES], ids_u[MOEJIT_DECODE_MAX_ENTRIES];
  float w_d[MOEJIT_DECODE_MAX_ENTRIES], w_u[MOEJIT_DECODE_MAX_ENTRIES];
  cr_assert(out_d && out_u && out_b && nk <= MOEJIT_DECODE_MAX_ENTRIES);
  char label[160];
  cr_assert(moejit_moe_decode_layer(io->model, tokens), "%s T=%lld: no decode layer", what,
            (long long)tokens);
  run_eager(io, tokens, NULL, out_d, ids_d, w_d);
  snprintf(label, sizeof label, "%s (decode layer)", what);
  check_output(io, tokens, out_d, ids_d, w_d, rng, label);
  /* GEMM 2 combining in each block (whatever the active experts, one or
   * several units a warp; the default at T = 1 and for small experts at a
   * few tokens) or through global partials and counters: the same bits */
  setenv("MOEJIT_DECODE_BLOCK_COMBINE", "1", 1);
  run_eager(io, tokens, NULL, out_b, NULL, NULL);
  setenv("MOEJIT_DECODE_BLOCK_COMBINE", "0", 1);
  run_eager(io, tokens, NULL, out_u, NULL, NULL);
  unsetenv("MOEJIT_DECODE_BLOCK_COMBINE");
  cr_assert(memcmp(out_b, out_u, ob) == 0,
            "%s T=%lld: the block-combined GEMM 2 and the counters' differ", what,
            (long long)tokens);
  cr_assert(memcmp(out_d, out_u, ob) == 0, "%s T=%lld: the default GEMM 2 differs", what,
            (long long)tokens);
  setenv("MOEJIT_LAYER_DECODE", "0", 1);
  cr_assert(!moejit_moe_decode_layer(io->model, tokens), "MOEJIT_LAYER_DECODE=0 ignored");
  run_eager(io, tokens, NULL, out_u, ids_u, w_u);
  unsetenv("MOEJIT_LAYER_DECODE");
  snprintf(label, sizeof label, "%s (unfused)", what);
  check_output(io, tokens, out_u, ids_u, w_u, rng, label);
  cr_assert(memcmp(ids_d, ids_u, nk * 4) == 0 && memcmp(w_d, w_u, nk * 4) == 0,
            "%s T=%lld: the decode layer routed differently from the router kernel", what,
            (long long)tokens);
  const double d = rel_diff(s->out_dtype, out_d, out_u, ob / moejit_dtype_size(s->out_dtype));
  cr_assert(d <= LAYER_RTOL, "%s T=%lld: decode vs unfused differ by %.3g", what,
            (long long)tokens, d);
  free(out_d), free(out_u), free(out_b);
}

static void decode_spec(const char *preset, int64_t hidden, int64_t width, int top_k,
                        moejit_dtype act, moejit_dtype out, moejit_spec *s) {
  OPS_OK(moejit_spec_load_preset(preset, s));
  s->hidden = hidden, s->expert_width = width, s->top_k = top_k;
  s->act_dtype = s->weight_dtype = act, s->out_dtype = out;
  cr_assert_eq(moejit_spec_validate(s), MOEJIT_OK, "%s", moejit_last_error());
}

Test(layer, decode_layer_matches_reference_and_unfused) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer decode");
  const struct {
    const char *preset;
    int64_t hidden, width;
    int top_k;
    moejit_dtype act, out;
    int64_t tokens[5];
    int64_t hot; /* T of the all-tokens-on-the-same-experts case, 0: none */
  } cases[] = {
      /* mixtral-shaped, k = 1: eight routing warps, one expert with 8 rows;
       * K = 1032 and 776 leave a ragged last chunk */
      {"mixtral-8x7b", 1032, 776, 1, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 5, 8, 0}, 8},
      /* k = 2: T = 6 and 8 take the wide pair (12 and 16 entries, 4 bits
       * an entry), every expert of the hot case 8 rows */
      {"mixtral-8x7b", 1024, 512, 2, MOEJIT_DTYPE_FP16, MOEJIT_DTYPE_FP32, {1, 3, 4, 6, 8}, 8},
      /* k = 8: T = 2 to 4 take the wide pair (16 to 32 entries), T = 5 to
       * 8 the _wide64 pair (40 to 64: 6 bits an entry, a lane finds the
       * experts of two entries); up to 8 rows an expert */
      {"qwen3-30b-a3b", 2048, 768, 8, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 2, 4, 6, 8}, 8},
      {"deepseek-v3", 1024, 256, 8, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 3, 5, 0}, 5},
      /* eight experts, so the entries share them: k = 3 (two rows an
       * expert at T = 2; 6 of a block's 8 warps busy; T = 7: 21 entries,
       * 5 bits an entry), k = 6 (idle warps in every block; T = 5: 30
       * entries, 5 rows an expert in 8-row units; T = 8: 48 entries, the
       * _wide64 pair) and
       * k = 8 at d = 7168 (several units a warp in GEMM 2: 1792 column
       * groups; T = 4 and 8: every expert 4 and 8 rows) */
      {"mixtral-8x7b", 1536, 384, 3, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 2, 7, 0}, 7},
      {"mixtral-8x7b", 2048, 256, 6, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 5, 8, 0}, 8},
      {"mixtral-8x7b", 7168, 256, 8, MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, {1, 4, 8, 0}, 8},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    moejit_spec s;
    decode_spec(cases[c].preset, cases[c].hidden, cases[c].width, cases[c].top_k, cases[c].act,
                cases[c].out, &s);
    moejit_model *m = load_heuristic(&s);
    layer_io io;
    io_make(&io, m, 8, &rng);
    char what[128];
    snprintf(what, sizeof what, "%s d=%lld f=%lld k=%d", cases[c].preset,
             (long long)cases[c].hidden, (long long)cases[c].width, cases[c].top_k);
    for (int i = 0; i < 5 && cases[c].tokens[i]; i++)
      decode_case(&io, cases[c].tokens[i], &rng, what);
    /* GEMM 1 pulling W2 into L2 for GEMM 2 (off unless asked for) */
    char pf[160];
    snprintf(pf, sizeof pf, "%s, W2 prefetched", what);
    setenv("MOEJIT_DECODE_PREFETCH", "1", 1);
    decode_case(&io, cases[c].tokens[0], &rng, pf);
    unsetenv("MOEJIT_DECODE_PREFETCH");
    if (cases[c].hot) {
      logits_hot(&io, cases[c].hot, &rng);
      char hot[224];
      snprintf(hot, sizeof hot, "%s, every token on the same experts", what);
      decode_case(&io, cases[c].hot, &rng, hot);
    }
    /* past 8 tokens or 64 entries the forward is the unfused chain (every
     * case here reaches 8 tokens: k <= 8) */
    const int64_t by_entries = MOEJIT_DECODE_MAX_ENTRIES / cases[c].top_k;
    const int64_t reach =
        by_entries < MOEJIT_DECODE_MAX_TOKENS ? by_entries : MOEJIT_DECODE_MAX_TOKENS;
    cr_expect_eq(reach, 8, "%s: reach %lld", what, (long long)reach);
    cr_expect(moejit_moe_decode_layer(m, reach), "%s: no decode layer at T = %lld", what,
              (long long)reach);
    cr_expect(!moejit_moe_decode_layer(m, reach + 1), "%s: decode layer past its reach", what);
    io_free(&io);
    moejit_model_destroy(m);
  }
}

/* ---- the router's weight instead of its logits ---------------------------------- */

/* A forward given args->gate_weight: the logits it computes (router_logits)
 * against float64 x . gate^T; its output against the layer reference routed
 * by those logits; the same forward given them as args->logits, and given
 * gate_weight without router_logits (the workspace keeps them), the same
 * bits; graph replay the same bits as eager. T = 1 and 7 run the decode
 * layer (qwen3-shaped: k = 8), 65 and 300 the chain with the router's
 * tensor-core form; the deepseek-shaped case routes by sigmoid with a bias,
 * from bf16 logits. */
Test(layer, gate_weight_computes_the_logits) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer gate weight");
  const struct {
    const char *preset;
    int64_t hidden, width;
    int top_k;
    moejit_dtype logits;
  } cases[] = {{"qwen3-30b-a3b", 2048, 768, 8, MOEJIT_DTYPE_FP32},
               {"deepseek-v3", 1024, 256, 8, MOEJIT_DTYPE_BF16}};
  static const int64_t sizes[] = {1, 7, 65, 300};
  moejit_stream stream = NULL;
  OPS_OK(moejit_stream_create(ops_ctx(), &stream));
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    moejit_spec s;
    decode_spec(cases[c].preset, cases[c].hidden, cases[c].width, cases[c].top_k, MOEJIT_DTYPE_BF16,
                MOEJIT_DTYPE_BF16, &s);
    s.logits_dtype = cases[c].logits;
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    moejit_model *m = load_heuristic(&s);
    layer_io io;
    io_make(&io, m, 300, &rng);
    const int64_t d = s.hidden, E = s.experts;
    const size_t lsz = moejit_dtype_size(s.logits_dtype), wsz = moejit_dtype_size(s.weight_dtype);
    /* the router's weight, logits of about unit size (x is in [-1, 1]) */
    float *gate = malloc(sizeof(float) * (size_t)(E * d));
    void *gate_bits = malloc(wsz * (size_t)(E * d));
    cr_assert(gate && gate_bits);
    const double amp = 3.0 / sqrt((double)d);
    for (int64_t i = 0; i < E * d; i++) gate[i] = (float)ts_uniform(&rng, -amp, amp);
    ref_pack(s.weight_dtype, gate, gate_bits, (size_t)(E * d));
    ref_unpack(s.weight_dtype, gate_bits, gate, (size_t)(E * d));
    void *d_gate = ops_alloc(wsz * (size_t)(E * d)), *d_rl = ops_alloc(lsz * (size_t)(300 * E));
    ops_upload(d_gate, gate_bits, wsz * (size_t)(E * d));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      const int64_t t = sizes[i];
      const size_t nk = (size_t)t * s.top_k, ob = out_bytes(&io, t), nl = (size_t)(t * E);
      char what[160];
      snprintf(what, sizeof what, "%s-shaped, gate weight, T=%lld (%s)", cases[c].preset,
               (long long)t, moejit_moe_decode_layer(m, t) ? "decode layer" : "chain");
      void *out_g = malloc(ob), *out_l = malloc(ob), *out_w = malloc(ob),
           *rl_bits = malloc(lsz * nl);
      void *x_bits = malloc(moejit_dtype_size(s.act_dtype) * (size_t)(t * d));
      float *x = malloc(sizeof(float) * (size_t)(t * d)), *w = malloc(sizeof(float) * nk);
      int32_t *ids = malloc(sizeof(int32_t) * nk);
      cr_assert(out_g && out_l && out_w && rl_bits && x_bits && x && w && ids);
      /* 1. gate_weight, logits out */
      ops_poison(io.d_out, ob, OPS_POISON_NAN);
      ops_poison(d_rl, lsz * (size_t)(300 * E) / 4 * 4, OPS_POISON_NAN);
      ops_poison(io.d_ids, nk * 4, OPS_POISON_INT);
      ops_sync();
      moejit_moe_args a = io_args(&io, t);
      a.logits = NULL, a.gate_weight = d_gate, a.router_logits = d_rl;
      OPS_OK(moejit_moe_forward(m, &a, stream));
      OPS_OK(moejit_stream_synchronize(ops_ctx(), stream));
      ops_download(out_g, io.d_out, ob);
      ops_download(ids, io.d_ids, nk * 4);
      ops_download(w, io.d_weights, nk * 4);
      ops_download(rl_bits, d_rl, lsz * nl);
      /* the logits against float64 */
      lg_periodic_read(&io.px, 0, (size_t)(t * d), x_bits);
      ref_unpack(s.act_dtype, x_bits, x, (size_t)(t * d));
      ref_unpack(s.logits_dtype, rl_bits, io.logits, nl);
      for (int64_t r = 0; r < t * E; r++)
        cr_assert(isfinite(io.logits[r]), "%s: logit (%lld, %lld) not written", what,
                  (long long)(r / E), (long long)(r % E));
      const double rtol = s.logits_dtype == MOEJIT_DTYPE_FP32 ? 1e-5 : 1e-2;
      const double lerr = ref_logits_rel_error(x, gate, t, d, E, io.logits);
      cr_expect(lerr <= rtol, "%s: logits rel error %.3g", what, lerr);
      /* the output, routed by those logits */
      check_output(&io, t, out_g, ids, w, &rng, what);
      /* 2. the same logits given: the same bits */
      ops_upload(io.d_logits, rl_bits, lsz * nl);
      run_eager(&io, t, stream, out_l, NULL, NULL);
      cr_expect(memcmp(out_g, out_l, ob) == 0, "%s: differs from the layer given its logits", what);
      /* 3. gate_weight without router_logits */
      a.router_logits = NULL;
      ops_poison(io.d_out, ob, OPS_POISON_NAN);
      ops_sync();
      OPS_OK(moejit_moe_forward(m, &a, stream));
      OPS_OK(moejit_stream_synchronize(ops_ctx(), stream));
      ops_download(out_w, io.d_out, ob);
      cr_expect(memcmp(out_g, out_w, ob) == 0, "%s: differs with the logits in the workspace",
                what);
      /* 4. graph replay */
      moejit_graph *g = NULL;
      OPS_OK(moejit_graph_begin_capture(ops_ctx(), stream));
      const moejit_status fwd = moejit_moe_forward(m, &a, stream);
      OPS_OK(moejit_graph_end_capture(ops_ctx(), stream, &g));
      cr_assert_eq(fwd, MOEJIT_OK, "%s: forward inside a capture: %s", what, moejit_last_error());
      replay_into(&io, g, stream, ob, out_w);
      cr_expect(memcmp(out_g, out_w, ob) == 0, "%s: graph replay differs from eager", what);
      moejit_graph_destroy(ops_ctx(), g);
      free(out_g), free(out_l), free(out_w), free(rl_bits), free(x_bits), free(x), free(w);
      free(ids);
    }
    ops_free(d_gate), ops_free(d_rl);
    free(gate), free(gate_bits);
    io_free(&io);
    moejit_model_destroy(m);
  }
  OPS_OK(moejit_stream_destroy(ops_ctx(), stream));
}

/* ---- GEMM 1 reading x in place --------------------------------------------------- */

/* Two eager forwards of t tokens, the first with $env set to `base`, the
 * second to `checked` (NULL: unset), which is checked against the
 * reference: their outputs must be equal to the bit (`differ` says how
 * they are not). Returns the checked output, malloc'd; $env is unset after. */
static void *same_under_env(const layer_io *io, int64_t t, const char *env, const char *base,
                            const char *checked, ts_rng *rng, const char *what,
                            const char *differ) {
  const size_t bytes = out_bytes(io, t), nk = (size_t)t * (size_t)io->spec->top_k;
  void *first = malloc(bytes), *out = malloc(bytes);
  int32_t *ids = malloc(nk * 4);
  float *w = malloc(nk * 4);
  cr_assert(first && out && ids && w);
  setenv(env, base, 1);
  run_eager(io, t, NULL, first, NULL, NULL);
  if (checked)
    setenv(env, checked, 1);
  else
    unsetenv(env);
  run_eager(io, t, NULL, out, ids, w);
  unsetenv(env);
  check_output(io, t, out, ids, w, rng, what);
  cr_assert(memcmp(first, out, bytes) == 0, "T=%lld: %s", (long long)t, differ);
  free(first), free(ids), free(w);
  return out;
}

/* Where GEMM 1 gathers its rows from x through align's sorted_slot (forced
 * on with $MOEJIT_GEMM1_GATHER=1) and align skips the permuted copy, the
 * output is the copy-based chain's to the bit ($MOEJIT_GEMM1_GATHER=0).
 * moejit_moe_gemm1_gathers says which a forward runs. */
Test(layer, gemm1_gather_equals_the_permuted_copy) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer gather");
  moejit_load_report r;
  moejit_model *m = load("qwen3-30b-a3b", &r);
  const int hopper = ops_ctx_is_sm90a(ops_ctx());
  cr_expect(!moejit_moe_gemm1_gathers(m, 1), "T = 1 runs the decode layer");
  cr_expect(!moejit_moe_gemm1_gathers(NULL, 2048) && !moejit_moe_gemm1_gathers(m, 0));
  /* on sm_90a the H100 table's 64x128 tile gathers at T = 256 and its
   * 128x256 cooperative tile at T = 2048 (x 8 MB), but not at T = 65536,
   * where x (268 MB) is past twice the L2; elsewhere GEMM 1 is not on the
   * Hopper kernel */
  cr_expect_eq(moejit_moe_gemm1_gathers(m, 256), hopper, "T = 256 (sm_90a: %d)", hopper);
  cr_expect_eq(moejit_moe_gemm1_gathers(m, 2048), hopper, "T = 2048 (sm_90a: %d)", hopper);
  cr_expect(!moejit_moe_gemm1_gathers(m, 65536), "T = 65536: x past twice the L2");
  setenv("MOEJIT_GEMM1_GATHER", "0", 1);
  cr_expect(!moejit_moe_gemm1_gathers(m, 256), "MOEJIT_GEMM1_GATHER=0");
  unsetenv("MOEJIT_GEMM1_GATHER");
  layer_io io;
  io_make(&io, m, 2048, &rng);
  const int64_t sizes[] = {256, 2048};
  for (size_t i = 0; i < 2; i++)
    free(same_under_env(&io, sizes[i], "MOEJIT_GEMM1_GATHER", "0", "1", &rng,
                        "qwen3 (gathering GEMM 1)", "gathered and copied rows differ"));
  io_free(&io);
  moejit_model_destroy(m);
}

/* The combine tidies L2 after the layer (templates/combine.cu): it
 * discards h's lines and, where y fits the evict_last bound, each line of y
 * once read, and demotes the lines of x that GEMM 1 gathered. None of that
 * may change a result or the caller's data: outputs equal a forward without
 * it ($MOEJIT_LAYER_TIDY=0) to the bit, also in the forward right after one
 * that discarded (h and y rewritten over dropped lines), and x is intact. On
 * qwen3-30b-a3b: T = 256 and 1024 keep h and y (8 and 34 MB of y), T = 2048
 * keeps h only (y 67 MB); GEMM 1 gathers at 256 and 2048 on sm_90a. */
Test(layer, l2_tidy_changes_no_result) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer tidy");
  moejit_load_report r;
  moejit_model *m = load("qwen3-30b-a3b", &r);
  layer_io io;
  io_make(&io, m, 2048, &rng);
  const moejit_spec *s = io.spec;
  const int64_t sizes[] = {256, 1024, 2048};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    const int64_t t = sizes[i];
    const size_t bytes = out_bytes(&io, t);
    void *tidied = same_under_env(&io, t, "MOEJIT_LAYER_TIDY", "0", NULL, &rng, "qwen3 (L2 tidied)",
                                  "tidying changed the output");
    void *again = malloc(bytes);
    cr_assert(again);
    run_eager(&io, t, NULL, again, NULL, NULL);
    cr_assert(memcmp(tidied, again, bytes) == 0, "T=%lld: the forward after a tidied one differs",
              (long long)t);
    free(tidied), free(again);
  }
  /* x as it was filled, every element */
  const size_t xn = (size_t)io.max_tokens * (size_t)s->hidden, as = moejit_dtype_size(s->act_dtype);
  void *want = malloc(xn * as), *got = malloc(xn * as);
  cr_assert(want && got);
  lg_periodic_read(&io.px, 0, xn, want);
  ops_download(got, io.d_x, xn * as);
  cr_assert(memcmp(want, got, xn * as) == 0, "x changed under the forwards");
  free(want), free(got);
  io_free(&io);
  moejit_model_destroy(m);
}

/* ---- refused arguments ----------------------------------------------------------- */

static void expect_refused(const moejit_model *m, const moejit_moe_args *a, const char *field,
                           const layer_io *io) {
  ops_poison(io->d_out, out_bytes(io, 7), OPS_POISON_NAN);
  ops_sync();
  moejit_status st = moejit_moe_forward(m, a, NULL);
  cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT, "%s: status %d", field, st);
  cr_expect(strstr(moejit_last_error(), field) != NULL, "message should name %s: %s", field,
            moejit_last_error());
  ops_sync();
  void *out = malloc(out_bytes(io, 7));
  cr_assert(out);
  ops_download(out, io->d_out, out_bytes(io, 7));
  cr_expect(ops_all_words(out, out_bytes(io, 7), OPS_POISON_NAN), "%s: something ran", field);
  free(out);
}

Test(layer, bad_arguments_are_refused_before_launching) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer bad args");
  moejit_load_report r;
  moejit_model *m = load("olmoe-1b-7b", &r);
  layer_io io;
  io_make(&io, m, 7, &rng);
  const moejit_moe_args good = io_args(&io, 7);
  moejit_moe_args a;
#define REFUSE(field, change) (a = good, (change), expect_refused(m, &a, field, &io))
  REFUSE("x", a.x = NULL);
  REFUSE("logits", a.logits = NULL);
  /* the router's weight: instead of the logits, never with them */
  REFUSE("gate_weight", a.gate_weight = io.d_x);
  REFUSE("gate_weight", (a.logits = NULL, a.gate_weight = (const char *)io.d_x + 8));
  REFUSE("router_logits", a.router_logits = io.d_out);
  REFUSE("router_logits",
         (a.logits = NULL, a.gate_weight = io.d_x, a.router_logits = (char *)io.d_out + 4));
  REFUSE("w1", a.w1 = NULL);
  REFUSE("w2", a.w2 = NULL);
  REFUSE("out", a.out = (char *)a.out + 2);
  REFUSE("route_bias", a.route_bias = (const float *)((const char *)io.d_x + 4));
  REFUSE("topk_ids", a.topk_ids = (int32_t *)((char *)a.topk_ids + 1));
  REFUSE("workspace", a.workspace = NULL);
  REFUSE("workspace_bytes", a.workspace_bytes = 16);
  REFUSE("tokens", a.tokens = 0);
  REFUSE("tokens", a.tokens = (int64_t)INT32_MAX);
  REFUSE("workspace_bytes", a.tokens = 8); /* sized for 7 */
#undef REFUSE
  /* A model without the GEMM kernels cannot run the layer. */
  moejit_model *partial = NULL;
  OPS_OK(moejit_model_load(ops_ctx(), moejit_model_spec(m), &partial));
  expect_refused(partial, &good, "moejit_model_load_config", &io);
  size_t bytes = 0;
  cr_expect_eq(moejit_moe_workspace_size(partial, 7, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_moe_workspace_size(m, 0, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_moe_forward(m, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_model_destroy(partial);
  io_free(&io);
  moejit_model_destroy(m);
}

/* qwen3-30b-a3b, and mixtral-8x7b, whose workspace takes GEMM 2's K-split
 * scratch from some T on (on sm_90a). */
Test(layer, workspace_grows_with_tokens) {
  OPS_REQUIRE_GPU();
  const char *presets[] = {"qwen3-30b-a3b", "mixtral-8x7b"};
  for (int i = 0; i < 2; i++) {
    moejit_load_report r;
    moejit_model *m = load(presets[i], &r);
    const moejit_spec *s = &m->spec;
    size_t prev = 0;
    for (int64_t t = 1; t <= 70000; t = t * 3 + 1) {
      size_t bytes = 0;
      OPS_OK(moejit_moe_workspace_size(m, t, &bytes));
      cr_expect_geq(bytes, prev, "%s T=%lld: %zu < %zu", presets[i], (long long)t, bytes, prev);
      /* at least the permuted rows and h */
      cr_expect_geq(bytes, (size_t)t * s->top_k * (s->hidden + s->expert_width) * 2);
      if (m->gemm2_split_bytes && t >= m->gemm2_split_from)
        cr_expect_geq(bytes, m->gemm2_split_bytes + (size_t)t * s->top_k * s->hidden * 2);
      prev = bytes;
    }
    moejit_model_destroy(m);
  }
}

Test(layer, config_file_and_unknown_name) {
  OPS_REQUIRE_GPU();
  char path[1100];
  snprintf(path, sizeof path, "%s/configs/models/olmoe-1b-7b.yaml", MOEJIT_TEST_SOURCE_DIR);
  moejit_load_report r;
  moejit_model *m = load(path, &r);
  cr_expect_str_eq(r.origin, path);
  cr_expect_str_eq(moejit_model_spec(m)->name, "olmoe-1b-7b");
  moejit_model_destroy(m);
  moejit_model *none = NULL;
  cr_expect_eq(moejit_model_load_config(ops_ctx(), "no-such-model", NULL, &none),
               MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "no-such-model") != NULL, "%s", moejit_last_error());
  cr_expect_eq(moejit_model_load_config(ops_ctx(), "/nonexistent/x.yaml", NULL, &none),
               MOEJIT_ERR_IO);
  cr_expect_null(none);
  /* A file named like a preset in the working directory wins over the bare
   * name, never over "preset:NAME" (what `moejit run --preset` passes). */
  char dir[] = "/tmp/moejit-test-preset-XXXXXX", cwd[4096];
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_not_null(getcwd(cwd, sizeof cwd));
  cr_assert_eq(chdir(dir), 0);
  FILE *f = fopen("olmoe-1b-7b", "w");
  cr_assert_not_null(f);
  fputs("not: [a, config\n", f);
  fclose(f);
  cr_expect_eq(moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", NULL, &none), MOEJIT_ERR_CONFIG);
  cr_expect_null(none);
  m = load("preset:olmoe-1b-7b", &r);
  cr_expect_str_eq(r.origin, "preset:olmoe-1b-7b");
  cr_expect_str_eq(moejit_model_spec(m)->name, "olmoe-1b-7b");
  moejit_model_destroy(m);
  unlink("olmoe-1b-7b");
  cr_assert_eq(chdir(cwd), 0);
  rmdir(dir);
}
