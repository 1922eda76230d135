/* Tuned tables through the whole layer on the GPU: a table in a temporary
 * $MOEJIT_TUNED_DIR, named for this device, gives a small raw-shape spec
 * different tiles and paths per token bucket (wgmma where the device is
 * sm_90a, mma.sync otherwise); the load reports "tuned", the forward picks
 * per T (exact and nearest buckets) and matches the float64 reference at
 * every T, graph replays are bitwise equal to eager runs without a module
 * load, a reload is all cache hits, and opting out or a broken table behave
 * as documented; a cache prebuilt for this device (moejit_model_prebuild)
 * leaves the load nothing to compile. Skips without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "layer_gpu.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_dtype.h"
#include "ref_gemm.h"
#include "ref_layer.h"
#include "ref_route.h"
#include "runtime/runtime.h"
#include "tune/tuned_table.h"

#define LAYER_RTOL 1e-2  /* bf16 activations and outputs */
#define WEIGHT_RTOL 1e-5 /* routing weights, fp32 vs float64 */
#define MAX_T 300

static const int64_t kTokens[] = {1, 2, 5, 16, 64, 100, MAX_T};

/* qwen3's routing and dtypes on a shape small enough to check every token. */
static moejit_spec small_spec(void) {
  moejit_spec s;
  OPS_OK(moejit_spec_load_preset("qwen3-30b-a3b", &s));
  s.hidden = 512, s.expert_width = 256, s.experts = 8, s.top_k = 2;
  OPS_OK(moejit_spec_validate(&s));
  return s;
}

static mj_tuned_entry entry(const moejit_spec *s, const char *kernel, int64_t tokens, int tm,
                            int tn, int tk, int stages, int warps, moejit_gemm_path path) {
  mj_tuned_entry e;
  memset(&e, 0, sizeof e);
  strcpy(e.kernel, kernel);
  e.dtype = s->act_dtype;
  e.hidden = s->hidden, e.expert_width = s->expert_width;
  e.experts = s->experts, e.top_k = s->top_k, e.tokens = tokens;
  e.cfg = (moejit_gemm_cfg){tm, tn, tk, stages, warps, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
  e.path = path;
  e.us = 5.0, e.heuristic_us = 6.0;
  return e;
}

/* Writes this device's table into a fresh directory and points
 * $MOEJIT_TUNED_DIR at it; returns the directory (caller removes it). */
static char *install_table(const moejit_spec *s, char *path, size_t cap) {
  moejit_device_info info;
  OPS_OK(moejit_ctx_device_info(ops_ctx(), &info));
  const int hopper = !strcmp(info.arch, "sm_90a");
  const moejit_gemm_path wide = hopper ? MOEJIT_GEMM_PATH_WGMMA : MOEJIT_GEMM_PATH_MMA;
  const mj_tuned_entry es[] = {
      entry(s, "gemm1", 1, 16, 64, 64, 3, 4, MOEJIT_GEMM_PATH_MMA),
      entry(s, "gemm1", 16, 64, 64, 64, 8, 8, wide),
      entry(s, "gemm1", 256, 128, 128, 64, 3, 8, wide),
      entry(s, "gemm2", 2, 32, 64, 128, 3, 4, MOEJIT_GEMM_PATH_MMA),
      entry(s, "gemm2", 64, 64, 128, 64, 4, 8, wide),
  };
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, info.name, sizeof t.device);
  mj_strlcpy(t.arch, info.arch, sizeof t.arch);
  strcpy(t.date, "2026-11-23");
  for (size_t i = 0; i < sizeof es / sizeof es[0]; i++) OPS_OK(mj_tuned_table_put(&t, &es[i]));
  char *dir = ts_mkdtemp("tuned-layer"), file[300];
  mj_tuned_file_name(info.name, file, sizeof file);
  snprintf(path, cap, "%s/%s", dir, file);
  OPS_OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);
  unsetenv("MOEJIT_TUNED_DISABLE");
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  return dir;
}

static moejit_model *load(const moejit_spec *s, moejit_load_report *r, int disable) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.report = r;
  o.tuned_disable = disable;
  moejit_model *m = NULL;
  OPS_OK(moejit_model_load_spec(ops_ctx(), s, &o, &m));
  return m;
}

static const moejit_load_kernel *row_of(const moejit_load_report *r, const char *kernel) {
  for (int i = 0; i < r->n_kernels; i++)
    if (!strcmp(r->kernels[i].kernel, kernel)) return &r->kernels[i];
  cr_assert_fail("no report row for %s", kernel);
  return NULL;
}

/* Inputs for up to MAX_T tokens. */
typedef struct io {
  const moejit_spec *s;
  lg_weights w;
  lg_periodic px;
  float *logits;
  void *d_x, *d_logits, *d_out, *d_ws, *d_ids, *d_w;
  size_t ws_bytes;
} io;

static void io_make(io *b, moejit_model *m, ts_rng *rng) {
  memset(b, 0, sizeof *b);
  const moejit_spec *s = b->s = moejit_model_spec(m);
  lg_weights_make(&b->w, s, rng);
  lg_periodic_make(&b->px, s->act_dtype, 1.0, rng);
  const size_t n_logits = (size_t)MAX_T * s->experts;
  b->logits = malloc(sizeof(float) * n_logits);
  cr_assert(b->logits);
  for (size_t i = 0; i < n_logits; i++) b->logits[i] = 2.0f * ts_normal(rng);
  cr_assert_eq(s->logits_dtype, MOEJIT_DTYPE_FP32);
  b->d_logits = ops_alloc(sizeof(float) * n_logits);
  ops_upload(b->d_logits, b->logits, sizeof(float) * n_logits);
  b->d_x = ops_alloc((size_t)MAX_T * s->hidden * 2);
  lg_periodic_fill(&b->px, b->d_x, (size_t)MAX_T * s->hidden);
  b->d_out = ops_alloc((size_t)MAX_T * s->hidden * 2);
  b->d_ids = ops_alloc((size_t)MAX_T * s->top_k * 4);
  b->d_w = ops_alloc((size_t)MAX_T * s->top_k * 4);
  OPS_OK(moejit_moe_workspace_size(m, MAX_T, &b->ws_bytes));
  b->d_ws = ops_alloc(b->ws_bytes);
}

static void io_free(io *b) {
  void *d[] = {b->d_x, b->d_logits, b->d_out, b->d_ws, b->d_ids, b->d_w};
  for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) ops_free(d[i]);
  lg_weights_free(&b->w);
  lg_periodic_free(&b->px);
  free(b->logits);
}

static moejit_moe_args args_for(const io *b, int64_t t) {
  moejit_moe_args a = {.tokens = t,
                       .x = b->d_x,
                       .logits = b->d_logits,
                       .w1 = b->w.d_w1,
                       .w2 = b->w.d_w2,
                       .out = b->d_out,
                       .workspace = b->d_ws,
                       .workspace_bytes = b->ws_bytes,
                       .topk_ids = b->d_ids,
                       .topk_weights = b->d_w};
  return a;
}

static size_t out_bytes(const io *b, int64_t t) {
  return (size_t)t * (size_t)b->s->hidden * 2;
}

static void run(const io *b, moejit_model *m, int64_t t, moejit_stream stream, void *out) {
  ops_poison(b->d_out, out_bytes(b, t), OPS_POISON_NAN);
  ops_sync();
  moejit_moe_args a = args_for(b, t);
  OPS_OK(moejit_moe_forward(m, &a, stream));
  OPS_OK(moejit_stream_synchronize(ops_ctx(), stream));
  ops_download(out, b->d_out, out_bytes(b, t));
}

/* Every token of a forward against the reference, from the GPU's routing
 * (whose weights are checked against the rule for the ids it chose). */
static void check_all_tokens(const io *b, int64_t t, const void *out, const char *what) {
  const moejit_spec *s = b->s;
  const int k = s->top_k, E = s->experts;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)t * k);
  float *w = malloc(sizeof(float) * (size_t)t * k);
  void *x = malloc((size_t)t * s->hidden * 2);
  double *ref = malloc(sizeof(double) * (size_t)t * s->hidden);
  cr_assert(ids && w && x && ref);
  ops_download(ids, b->d_ids, sizeof(int32_t) * (size_t)t * k);
  ops_download(w, b->d_w, sizeof(float) * (size_t)t * k);
  const ref_route_cfg rc = {.experts = E,
                            .top_k = k,
                            .rule = 0,
                            .renormalize = s->routing.renormalize,
                            .n_group = 1,
                            .topk_group = 1,
                            .scaling_factor = s->routing.scaling_factor};
  for (int64_t i = 0; i < t; i++) {
    int chosen[32];
    double ref_w[32];
    for (int j = 0; j < k; j++) {
      chosen[j] = ids[i * k + j];
      cr_assert(chosen[j] >= 0 && chosen[j] < E, "%s T=%lld: token %lld id %d", what, (long long)t,
                (long long)i, chosen[j]);
      for (int q = 0; q < j; q++) cr_assert_neq(chosen[q], chosen[j], "repeated expert");
    }
    ref_route_weights(&rc, b->logits + i * E, chosen, ref_w);
    for (int j = 0; j < k; j++)
      cr_assert(fabs(w[i * k + j] - ref_w[j]) <= WEIGHT_RTOL * fabs(ref_w[j]) + 1e-12,
                "%s T=%lld token %lld slot %d: weight %g, reference %g", what, (long long)t,
                (long long)i, j, w[i * k + j], ref_w[j]);
  }
  lg_periodic_read(&b->px, 0, (size_t)t * s->hidden, x);
  ref_layer_shape shape = ref_layer_shape_of(s);
  ref_layer_tokens(&shape, t, x, ids, w, lg_weights_fetch, (void *)&b->w, ref);
  const double err = ref_gemm_rel_error(s->out_dtype, out, ref, (size_t)t * s->hidden);
  cr_assert(err <= LAYER_RTOL, "%s T=%lld: relative error %.3g (> %g)", what, (long long)t, err,
            LAYER_RTOL);
  free(ids), free(w), free(x), free(ref);
}

static moejit_config_source choice(moejit_model *m, const char *kernel, int64_t t, char *desc,
                                   size_t cap) {
  moejit_config_source src = (moejit_config_source)-1;
  OPS_OK(moejit_model_gemm_choice(m, kernel, t, desc, cap, &src));
  return src;
}

Test(layer_tuned, report_choice_and_outputs_at_every_bucket) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer tuned");
  moejit_spec s = small_spec();
  char path[1200], desc[512];
  char *dir = install_table(&s, path, sizeof path);
  moejit_load_report r;
  moejit_model *m = load(&s, &r, 0);
  const moejit_load_kernel *g1 = row_of(&r, "gemm1"), *g2 = row_of(&r, "gemm2");
  cr_expect_str_eq(g1->config_source, "tuned", "%s", g1->config_detail);
  cr_expect_str_eq(g2->config_source, "tuned", "%s", g2->config_detail);
  cr_expect_str_eq(g1->config, "3 buckets, T=1..256");
  cr_expect(strstr(g1->config_detail, path) && strstr(g1->config_detail, "T=1 16x64x64 s3 w4 mma"),
            "%s", g1->config_detail);
  cr_expect_eq(g1->variants, 3, "three tiles besides the spec's");
  cr_expect_eq(g2->variants, 2);
  cr_expect_str_eq(row_of(&r, "route")->config_source, "heuristic");

  cr_expect_eq(choice(m, "gemm1", 1, desc, sizeof desc), MOEJIT_CONFIG_TUNED_EXACT, "%s", desc);
  cr_expect(strstr(desc, "16x64x64 s3 w4, path mma, entry moejit_gemm1_swiglu_mma"), "%s", desc);
  /* T = 5 (10 entries) is within the decode layer's reach (T <= 8 at
   * k = 2), which the T = 16 bucket past it does not serve; T = 9 is not */
  cr_expect_eq(choice(m, "gemm1", 5, desc, sizeof desc), MOEJIT_CONFIG_TUNED_NEAREST, "%s", desc);
  cr_expect(strstr(desc, "nearest bucket T=1 for T=5: 16x64x64 s3 w4"), "%s", desc);
  cr_expect_eq(choice(m, "gemm1", 9, desc, sizeof desc), MOEJIT_CONFIG_TUNED_NEAREST, "%s", desc);
  cr_expect(strstr(desc, "nearest bucket T=16 for T=9: 64x64x64 s8 w8"), "%s", desc);
  cr_expect_eq(choice(m, "gemm2", 2, desc, sizeof desc), MOEJIT_CONFIG_TUNED_EXACT, "%s", desc);
  cr_expect_eq(choice(m, "gemm2", MAX_T, desc, sizeof desc), MOEJIT_CONFIG_TUNED_NEAREST);
  cr_expect(strstr(desc, "T=64 for T=300"), "%s", desc);

  io b;
  io_make(&b, m, &rng);
  void *out = malloc(out_bytes(&b, MAX_T));
  cr_assert(out);
  const unsigned long loads = mj_ctx_module_loads(ops_ctx());
  for (size_t i = 0; i < sizeof kTokens / sizeof kTokens[0]; i++) {
    run(&b, m, kTokens[i], NULL, out);
    check_all_tokens(&b, kTokens[i], out, "tuned");
  }
  cr_expect_eq(mj_ctx_module_loads(ops_ctx()), loads, "a forward loaded a module");
  free(out);
  io_free(&b);
  moejit_model_destroy(m);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

Test(layer_tuned, graph_replay_equals_eager_bitwise) {
  OPS_REQUIRE_GPU();
  ts_rng rng = ts_rng_fresh("layer tuned graph");
  moejit_spec s = small_spec();
  char path[1200];
  char *dir = install_table(&s, path, sizeof path);
  moejit_load_report r;
  moejit_model *m = load(&s, &r, 0);
  cr_assert_str_eq(row_of(&r, "gemm1")->config_source, "tuned");
  io b;
  io_make(&b, m, &rng);
  moejit_ctx *ctx = ops_ctx();
  moejit_stream stream = NULL;
  OPS_OK(moejit_stream_create(ctx, &stream));
  const unsigned long loads = mj_ctx_module_loads(ctx);
  const int64_t sizes[] = {1, 16, MAX_T};
  for (size_t i = 0; i < 3; i++) {
    const int64_t t = sizes[i];
    void *eager = malloc(out_bytes(&b, t)), *replay = malloc(out_bytes(&b, t));
    cr_assert(eager && replay);
    run(&b, m, t, stream, eager);
    moejit_moe_args a = args_for(&b, t);
    moejit_graph *g = NULL;
    OPS_OK(moejit_graph_begin_capture(ctx, stream));
    moejit_status fwd = moejit_moe_forward(m, &a, stream);
    OPS_OK(moejit_graph_end_capture(ctx, stream, &g));
    cr_assert_eq(fwd, MOEJIT_OK, "forward inside a capture: %s", moejit_last_error());
    for (int rep = 0; rep < 2; rep++) {
      ops_poison(b.d_out, out_bytes(&b, t), OPS_POISON_NAN);
      ops_sync();
      OPS_OK(moejit_graph_launch(ctx, g, stream));
      OPS_OK(moejit_stream_synchronize(ctx, stream));
      ops_download(replay, b.d_out, out_bytes(&b, t));
      cr_assert(memcmp(eager, replay, out_bytes(&b, t)) == 0, "T=%lld replay %d differs",
                (long long)t, rep);
    }
    moejit_graph_destroy(ctx, g);
    free(eager), free(replay);
  }
  cr_expect_eq(mj_ctx_module_loads(ctx), loads, "the forward loaded a module");
  OPS_OK(moejit_stream_destroy(ctx, stream));
  io_free(&b);
  moejit_model_destroy(m);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

Test(layer_tuned, reload_hits_and_opting_out) {
  OPS_REQUIRE_GPU();
  moejit_spec s = small_spec();
  char path[1200], desc[512];
  char *dir = install_table(&s, path, sizeof path);
  moejit_load_report r, again, off;
  moejit_model *m = load(&s, &r, 0);
  const unsigned long loads = mj_ctx_module_loads(ops_ctx());
  moejit_model *m2 = load(&s, &again, 0);
  cr_expect_eq(again.cache_hits, 5);
  cr_expect_eq(row_of(&again, "gemm1")->variant_hits, row_of(&again, "gemm1")->variants);
  cr_expect_eq(mj_ctx_module_loads(ops_ctx()), loads, "a reload loaded a module");
  /* opting out: heuristic everywhere, said so */
  moejit_model *m3 = load(&s, &off, 1);
  for (int i = 0; i < off.n_kernels; i++)
    cr_expect_str_eq(off.kernels[i].config_source, "heuristic");
  cr_expect(strstr(row_of(&off, "gemm1")->config_detail, "disabled"), "%s",
            row_of(&off, "gemm1")->config_detail);
  cr_expect_eq(choice(m3, "gemm1", 1, desc, sizeof desc), MOEJIT_CONFIG_HEURISTIC, "%s", desc);
  moejit_model_destroy(m3);
  setenv("MOEJIT_TUNED_DISABLE", "1", 1);
  m3 = load(&s, &off, 0);
  cr_expect_str_eq(row_of(&off, "gemm2")->config_source, "heuristic");
  cr_expect(strstr(row_of(&off, "gemm2")->config_detail, "MOEJIT_TUNED_DISABLE"), "%s",
            row_of(&off, "gemm2")->config_detail);
  moejit_model_destroy(m3);
  unsetenv("MOEJIT_TUNED_DISABLE");
  /* a model of another shape finds no entry and says which shape */
  moejit_spec other = s;
  other.hidden = 1024;
  m3 = load(&other, &off, 0);
  cr_expect(strstr(row_of(&off, "gemm1")->config_detail, "has no gemm1 entry for bf16 d=1024"),
            "%s", row_of(&off, "gemm1")->config_detail);
  moejit_model_destroy(m3);
  moejit_model_destroy(m2);
  moejit_model_destroy(m);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

/* moejit_model_prebuild for this device's name and arch into an empty
 * cache, then a load in a new ctx on that cache: every family and tuned
 * kernel a cache hit, and no cache entry added (the kernels the launch
 * plans derive were prebuilt too). */
Test(layer_tuned, a_prebuilt_cache_leaves_the_load_nothing_to_compile) {
  OPS_REQUIRE_GPU();
  moejit_spec s = small_spec();
  char path[1200];
  char *dir = install_table(&s, path, sizeof path);
  moejit_device_info info;
  OPS_OK(moejit_ctx_device_info(ops_ctx(), &info));
  char *cache = ts_mkdtemp("prebuilt-cache");
  moejit_compiler_opts co;
  moejit_compiler_opts_init(&co);
  co.cache_dir = cache;
  moejit_compiler *comp = NULL;
  OPS_OK(moejit_compiler_create(&comp, &co));
  moejit_load_report pre, r;
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.report = &pre;
  OPS_OK(moejit_model_prebuild(comp, &s, info.arch, info.name, &o));
  moejit_compiler_destroy(comp);
  cr_expect_eq(pre.cache_misses, 5);
  cr_expect_str_eq(row_of(&pre, "gemm1")->config_source, "tuned");
  cr_expect_gt(row_of(&pre, "gemm1")->variants, 0);
  const int files = ts_count_files(cache, ".mjc");
  cr_expect_geq(files, 3 + row_of(&pre, "gemm1")->variants + row_of(&pre, "gemm2")->variants);

  moejit_ctx_opts copts;
  moejit_ctx_opts_init(&copts);
  copts.compiler.cache_dir = cache;
  moejit_ctx *ctx = NULL;
  OPS_OK(moejit_ctx_create(&ctx, &copts));
  o.report = &r;
  moejit_model *m = NULL;
  OPS_OK(moejit_model_load_spec(ctx, &s, &o, &m));
  cr_expect_eq(r.cache_hits, 5, "%d of 5 families from the prebuilt cache", r.cache_hits);
  for (int which = 1; which <= 2; which++) {
    const moejit_load_kernel *k = row_of(&r, which == 1 ? "gemm1" : "gemm2");
    cr_expect_eq(k->variants, row_of(&pre, k->kernel)->variants, "%s", k->kernel);
    cr_expect_eq(k->variant_hits, k->variants, "%s: %d of %d tuned kernels cached", k->kernel,
                 k->variant_hits, k->variants);
  }
  cr_expect_eq(ts_count_files(cache, ".mjc"), files, "the load compiled a kernel");
  moejit_model_destroy(m);
  moejit_ctx_destroy(ctx);
  ts_rmtree(cache);
  free(cache);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

Test(layer_tuned, a_broken_table_fails_the_load_with_its_position) {
  OPS_REQUIRE_GPU();
  moejit_spec s = small_spec();
  moejit_device_info info;
  OPS_OK(moejit_ctx_device_info(ops_ctx(), &info));
  char *dir = ts_mkdtemp("tuned-broken"), file[300];
  mj_tuned_file_name(info.name, file, sizeof file);
  char text[512];
  snprintf(text, sizeof text, "device: \"%s\"\nentries:\n  - {kernel: gemm1, dtype: bf16}\n",
           info.name);
  free(ts_write_file(dir, file, text));
  unsetenv("MOEJIT_TUNED_DISABLE");
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  moejit_model *m = NULL;
  cr_expect_eq(moejit_model_load_spec(ops_ctx(), &s, NULL, &m), MOEJIT_ERR_CONFIG);
  cr_expect_null(m);
  cr_expect(strstr(moejit_last_error(), ":3:5: entries[0]: missing key") &&
                strstr(moejit_last_error(), "MOEJIT_TUNED_DISABLE"),
            "%s", moejit_last_error());
  moejit_load_report r;
  m = load(&s, &r, 1); /* opting out loads */
  moejit_model_destroy(m);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

Test(layer_tuned, choice_arguments) {
  OPS_REQUIRE_GPU();
  moejit_spec s = small_spec();
  unsetenv("MOEJIT_TUNED_DIR");
  moejit_load_report r;
  moejit_model *m = load(&s, &r, 0);
  char desc[256];
  moejit_config_source src;
  cr_expect_eq(moejit_model_gemm_choice(NULL, "gemm1", 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_gemm_choice(m, "route", 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_gemm_choice(m, "gemm1", 0, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  OPS_OK(moejit_model_gemm_choice(m, "gemm2", 7, NULL, 0, NULL));
  OPS_OK(moejit_model_gemm_choice(m, "gemm2", 7, desc, 20, &src)); /* truncated, terminated */
  cr_expect_eq(strlen(desc), 19);
  cr_expect_eq(src, MOEJIT_CONFIG_HEURISTIC);
  moejit_model *partial = NULL;
  OPS_OK(moejit_model_load(ops_ctx(), &s, &partial));
  cr_expect_eq(moejit_model_gemm_choice(partial, "gemm1", 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_model_destroy(partial);
  moejit_model_destroy(m);
}

/* The first point's floor_ms in `moejit run --json` output, -1 if none. */
static double first_floor_ms(const char *json) {
  const char *p = json ? strstr(json, "\"floor_ms\":") : NULL;
  return p ? strtod(p + strlen("\"floor_ms\":"), NULL) : -1.0;
}

/* `moejit run` on a config of the small shape: each kernel's source and
 * detail, and per T what each GEMM runs (text and JSON), and the floor's
 * ceilings (--ceilings). */
Test(layer_tuned, moejit_run_shows_sources_and_choices) {
  OPS_REQUIRE_GPU();
  moejit_spec s = small_spec();
  char path[1200];
  char *dir = install_table(&s, path, sizeof path);
  char *cfg = ts_write_file(dir, "small.yaml",
                            "name: small-tuned\n"
                            "model: {hidden: 512, expert_width: 256, experts: 8, top_k: 2,\n"
                            "        routing: {rule: softmax_topk, renormalize: true}}\n"
                            "dtypes: {activation: bf16, weight: bf16, logits: fp32, output: bf16}\n"
                            "target: {arch: auto}\n");
  const char *args[] = {"run", cfg, "--tokens", "1,9,300", "--iters", "2", NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, "3 buckets, T=1..256") && strstr(out, "tuned: ") && strstr(out, path),
            "stdout: %s", out);
  cr_expect(strstr(out, "T=9      gemm1: tuned, nearest bucket T=16 for T=9"), "stdout: %s", out);
  cr_expect(strstr(out, "T=1      gemm1: tuned, exact bucket T=1"), "stdout: %s", out);
  free(out), free(err);
  const char *json[] = {"run", cfg, "--tokens", "1,5", "--iters", "2", "--json", NULL};
  rc = ts_run_cli(json, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstderr: %s", rc, err);
  cr_expect(ts_json_valid(out), "not one JSON value: %s", out);
  cr_expect(strstr(out, "\"gemm1\":{\"source\":\"tuned_nearest\""), "json: %s", out);
  cr_expect(strstr(out, "\"source\":\"tuned\",\"detail\":"), "json: %s", out);
  cr_expect(strstr(out, "\"ceilings\":{\"tflops\":750,\"tbps\":3,\"from\":\"default\"}"),
            "json: %s", out);
  /* --ceilings twice the defaults: every floor halves (T = 1 picks 2 distinct
   * experts every time, so its floor does not depend on the draw) */
  const double floor1 = first_floor_ms(out);
  free(out), free(err);
  const char *faster[] = {"run", cfg,      "--tokens",   "1",      "--iters",
                          "2",   "--json", "--ceilings", "1500,6", NULL};
  rc = ts_run_cli(faster, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstderr: %s", rc, err);
  cr_expect(strstr(out, "\"ceilings\":{\"tflops\":1500,\"tbps\":6,\"from\":\"--ceilings\"}"),
            "json: %s", out);
  const double floor2 = first_floor_ms(out);
  cr_expect(floor1 > 0 && fabs(floor2 * 2 - floor1) <= 0.01 * floor1,
            "floor %.6f ms with --ceilings 1500,6 against %.6f by default", floor2, floor1);
  free(out), free(err);
  /* --vs-heuristic: the tables-off layer checked and timed beside it */
  const char *vs[] = {"run", cfg, "--tokens", "5,300", "--iters", "2", "--vs-heuristic", NULL};
  rc = ts_run_cli(vs, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, "load (tuned tables off, for --vs-heuristic)") && strstr(out, "heur ms") &&
                strstr(out, "vs heur") && !strstr(out, "tables off:"),
            "stdout: %s", out);
  free(out), free(err);
  const char *vsj[] = {"run",    cfg, "--tokens", "5,300", "--iters", "2", "--vs-heuristic",
                       "--json", NULL};
  rc = ts_run_cli(vsj, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstderr: %s", rc, err);
  cr_expect(ts_json_valid(out), "not one JSON value: %s", out);
  cr_expect(strstr(out, "\"load_heuristic\":{"), "json: %s", out);
  cr_expect_eq(ts_count_substr(out, "\"heuristic_graph_ms\":"), 2, "json: %s", out);
  const char *h = strstr(out, "\"heuristic_graph_ms\":");
  cr_expect(h && strtod(h + strlen("\"heuristic_graph_ms\":"), NULL) > 0, "json: %s", out);
  cr_expect(!strstr(out, "\"ok\":false"), "json: %s", out);
  free(out), free(err);
  /* --gate-weight: the layer computes its logits from a router weight, and
   * they are checked against float64 (T = 1: decode layer; 300: the chain) */
  const char *gate[] = {"run", cfg, "--tokens", "1,300", "--iters", "2", "--gate-weight", NULL};
  rc = ts_run_cli(gate, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, "logit err") && strstr(out, "router: from a random router weight"),
            "stdout: %s", out);
  free(out), free(err);
  const char *gatej[] = {"run",           cfg,      "--tokens", "1,300", "--iters", "2",
                         "--gate-weight", "--json", NULL};
  rc = ts_run_cli(gatej, NULL, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstderr: %s", rc, err);
  cr_expect(ts_json_valid(out) && strstr(out, "\"gate_weight\":true"), "json: %s", out);
  cr_expect_eq(ts_count_substr(out, "\"logits_rel_err\":"), 2, "json: %s", out);
  const char *le = strstr(out, "\"logits_rel_err\":");
  const double lerr = le ? strtod(le + strlen("\"logits_rel_err\":"), NULL) : -1;
  cr_expect(lerr >= 0 && lerr <= 1e-5, "logits rel err %g; json: %s", lerr, out);
  cr_expect(!strstr(out, "\"ok\":false"), "json: %s", out);
  free(out), free(err);
  free(cfg);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}
