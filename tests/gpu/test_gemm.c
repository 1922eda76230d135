/* GPU tests of the grouped GEMMs (moejit/gemm.h) against the float64 CPU
 * reference: fresh random data, outputs poisoned with NaN bytes before each
 * run, uneven routing (empty experts, one hot expert, single rows, counts
 * that are not tile multiples), the presets' shapes with few experts, every
 * tile config the presets ship plus a spread of others (all 48 of the
 * supported grid with MOEJIT_GEMM_TEST_ALL_TILES=1), bitwise-identical
 * reruns, and argument checks. On an sm_90a device every case of the mma
 * (or AUTO) path runs again on the wgmma path, with its spec tile and with
 * the narrow decode tile, and everywhere on the GEMV decode path (one or
 * more passes of up to 8 rows per expert). Skips without a GPU. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moejit/gemm.h"
#include "moejit/moejit.h"
#include "ops/gemm.h"
#include "runtime/runtime.h"
#include "ops_gpu.h"
#include "ref_dtype.h"
#include "ref_gemm.h"
#include "test_support.h"

#define POISON_WORD 0xffffffffu /* NaN in fp32, bf16 and fp16 alike */

static moejit_ctx *ctx_or_skip(void) {
  char why[512];
  if (!ts_gpu_available(why, sizeof why)) cr_skip_test("no GPU: %s", why);
  moejit_ctx *ctx = NULL;
  moejit_status st = moejit_ctx_create(&ctx, NULL);
  cr_assert_eq(st, MOEJIT_OK, "moejit_ctx_create: %s", moejit_last_error());
  return ctx;
}

/* A spec of the given shape on the qwen3 preset (softmax routing accepts
 * any expert count); both GEMMs tiled by `g`. */
static moejit_spec make_spec(int64_t d, int64_t f, int experts, moejit_dtype dtype,
                             moejit_gemm_cfg g) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK, "%s", moejit_last_error());
  s.hidden = d, s.expert_width = f, s.experts = experts;
  s.top_k = experts < 2 ? 1 : 2;
  s.act_dtype = s.weight_dtype = s.out_dtype = dtype;
  s.gemm1 = s.gemm2 = g;
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  return s;
}

static moejit_gemm_cfg cfg(int tm, int tn, int tk, int stages, int warps, int raster) {
  return (moejit_gemm_cfg){tm, tn, tk, stages, warps, 1, 1, (moejit_raster)raster, MOEJIT_SCHEDULE_COOPERATIVE};
}

/* Uniform in [-scale, scale), stored as dtype. */
static void fill_random(ts_rng *r, moejit_dtype dt, void *dst, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) {
    float v = (float)((double)(ts_next(r) >> 11) * 0x1p-53 * 2 * scale - scale);
    if (dt == MOEJIT_DTYPE_FP32) ((float *)dst)[i] = v;
    else if (dt == MOEJIT_DTYPE_BF16) ((uint16_t *)dst)[i] = ref_f32_to_bf16(v);
    else ((uint16_t *)dst)[i] = ref_f32_to_f16(v);
  }
}

static void *dev_upload(moejit_ctx *ctx, const void *src, size_t bytes) {
  void *d = NULL;
  cr_assert_eq(moejit_mem_alloc(ctx, bytes, NULL, &d), MOEJIT_OK, "%s", moejit_last_error());
  if (src)
    cr_assert_eq(moejit_memcpy_htod(ctx, d, src, bytes, NULL), MOEJIT_OK, "%s", moejit_last_error());
  return d;
}

/* One GEMM problem on the device, its reference and two poisoned runs. */
typedef struct gemm_case {
  moejit_ctx *ctx;
  const moejit_spec *spec;
  int which;               /* 1 or 2 */
  moejit_gemm_path path;
  const int32_t *counts;   /* rows per expert */
  int64_t extra_rows;      /* max_rows - offsets[E]: rows that must stay poisoned */
  int with_scale;          /* gemm2 */
  double tolerance;
  uint32_t *round_sync; /* gemm1: moejit_gemm_args.round_sync, or NULL */
} gemm_case;

typedef struct gemm_io {
  int64_t rows, max_rows, k, n_out;
  size_t esz;
  int32_t *offsets;
  void *a, *w, *out1, *out2;
  float *scale;
  double *ref;
} gemm_io;

static void io_prepare(const gemm_case *c, ts_rng *r, gemm_io *io) {
  const moejit_spec *s = c->spec;
  int e_n = s->experts;
  io->k = c->which == 1 ? s->hidden : s->expert_width;
  io->n_out = c->which == 1 ? s->expert_width : s->hidden;
  int64_t w_rows = c->which == 1 ? 2 * s->expert_width : s->hidden;
  io->esz = moejit_dtype_size(s->act_dtype);
  io->offsets = calloc((size_t)e_n + 1, sizeof(int32_t));
  cr_assert_not_null(io->offsets);
  for (int e = 0; e < e_n; e++) io->offsets[e + 1] = io->offsets[e] + c->counts[e];
  io->rows = io->offsets[e_n];
  io->max_rows = io->rows + c->extra_rows;
  size_t a_n = (size_t)(io->max_rows * io->k), w_n = (size_t)(e_n * w_rows * io->k);
  size_t out_n = (size_t)(io->max_rows * io->n_out);
  io->a = malloc(a_n * io->esz + 16);
  io->w = malloc(w_n * moejit_dtype_size(s->weight_dtype) + 16);
  io->out1 = malloc(out_n * io->esz + 16);
  io->out2 = malloc(out_n * io->esz + 16);
  io->scale = malloc(sizeof(float) * (size_t)(io->max_rows + 1));
  io->ref = malloc(sizeof(double) * (out_n + 1));
  cr_assert(io->a && io->w && io->out1 && io->out2 && io->scale && io->ref, "host out of memory");
  fill_random(r, s->act_dtype, io->a, a_n, 1.0);
  /* gate/up/down sums come out O(1): var(a*w) * K = (1/3)(s^2/3) K = 1 */
  fill_random(r, s->weight_dtype, io->w, w_n, 3.0 / sqrt((double)io->k));
  for (int64_t i = 0; i < io->max_rows; i++) io->scale[i] = (float)ts_uniform(r, -2.0, 2.0);
  ref_gemm_problem p = {s->act_dtype, s->weight_dtype, io->a, io->w, io->offsets,
                        c->with_scale ? io->scale : NULL, e_n, s->hidden, s->expert_width};
  if (c->which == 1) ref_gemm1_swiglu(&p, io->ref);
  else ref_gemm2(&p, io->ref);
}

static void io_free(gemm_io *io) {
  free(io->offsets), free(io->a), free(io->w), free(io->out1), free(io->out2);
  free(io->scale), free(io->ref);
}

static moejit_status launch(const gemm_case *c, const moejit_gemm_args *args) {
  return c->which == 1 ? moejit_gemm1_swiglu(c->ctx, c->spec, args, NULL)
                       : moejit_gemm2(c->ctx, c->spec, args, NULL);
}

/* Poisons the output, runs, copies it back to host `dst`. */
static void run_once(const gemm_case *c, const gemm_io *io, moejit_gemm_args *args, void *dst) {
  size_t out_bytes = (size_t)(io->max_rows * io->n_out) * io->esz;
  cr_assert_eq(moejit_memset_d32(c->ctx, args->out, POISON_WORD, (out_bytes + 3) / 4, NULL),
               MOEJIT_OK, "%s", moejit_last_error());
  moejit_status st = launch(c, args);
  cr_assert_eq(st, MOEJIT_OK, "gemm%d launch: %s", c->which, moejit_last_error());
  cr_assert_eq(moejit_memcpy_dtoh(c->ctx, dst, args->out, out_bytes, NULL), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_eq(moejit_ctx_synchronize(c->ctx), MOEJIT_OK, "gemm%d kernel: %s", c->which,
               moejit_last_error());
}

static int all_poison(const void *p, size_t bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++)
    if (b[i] != 0xff) return 0;
  return 1;
}

static int all_zero(const void *p, size_t bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++)
    if (b[i]) return 0;
  return 1;
}

/* The case's inputs on the device, and its (unpoisoned) output buffer, as
 * launch arguments; args_free gives them back. */
static moejit_gemm_args args_upload(const gemm_case *c, const gemm_io *io) {
  const moejit_spec *s = c->spec;
  int64_t w_rows = c->which == 1 ? 2 * s->expert_width : s->hidden;
  size_t out_bytes = (size_t)(io->max_rows * io->n_out) * io->esz;
  /* +16 bytes so even max_rows 0 allocates */
  moejit_gemm_args args = {
      .a = dev_upload(c->ctx, io->a, (size_t)(io->max_rows * io->k) * io->esz + 16),
      .w = dev_upload(c->ctx, io->w,
                      (size_t)(s->experts * w_rows * io->k) * moejit_dtype_size(s->weight_dtype)),
      .out = dev_upload(c->ctx, NULL, out_bytes + 16),
      .expert_offsets = dev_upload(c->ctx, io->offsets, sizeof(int32_t) * ((size_t)s->experts + 1)),
      .row_scale = c->with_scale
                       ? dev_upload(c->ctx, io->scale, sizeof(float) * (size_t)(io->max_rows + 1))
                       : NULL,
      .max_rows = io->max_rows,
      .path = c->path,
      .round_sync = c->round_sync};
  return args;
}

static void args_free(moejit_ctx *ctx, const moejit_gemm_args *a) {
  void *bufs[] = {(void *)a->a, (void *)a->w, a->out, (void *)a->expert_offsets,
                  (void *)a->row_scale};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) moejit_mem_free(ctx, bufs[i], NULL);
}

/* Runs one case; returns the relative error of the first run. */
static double run_case(const gemm_case *c) {
  ts_rng r = ts_rng_fresh("test_gemm");
  gemm_io io;
  io_prepare(c, &r, &io);
  const moejit_spec *s = c->spec;
  size_t out_bytes = (size_t)(io.max_rows * io.n_out) * io.esz;
  moejit_gemm_args args = args_upload(c, &io);
  run_once(c, &io, &args, io.out1);
  run_once(c, &io, &args, io.out2);
  size_t valid_bytes = (size_t)(io.rows * io.n_out) * io.esz;
  double err = ref_gemm_rel_error(s->act_dtype, io.out1, io.ref, (size_t)(io.rows * io.n_out));
  cr_expect(all_poison((char *)io.out1 + valid_bytes, out_bytes - valid_bytes),
            "gemm%d wrote rows past offsets[E] = %lld", c->which, (long long)io.rows);
  cr_expect(memcmp(io.out1, io.out2, out_bytes) == 0, "gemm%d: two runs differ bitwise", c->which);
  cr_expect(err <= c->tolerance, "gemm%d %s: rel error %.3g > %.3g (tile %dx%dx%d, %d stages, %d warps)",
            c->which, moejit_dtype_name(s->act_dtype), err, c->tolerance,
            (c->which == 1 ? s->gemm1 : s->gemm2).tile_m, (c->which == 1 ? s->gemm1 : s->gemm2).tile_n,
            (c->which == 1 ? s->gemm1 : s->gemm2).tile_k, (c->which == 1 ? s->gemm1 : s->gemm2).stages,
            (c->which == 1 ? s->gemm1 : s->gemm2).warps);
  args_free(c->ctx, &args);
  io_free(&io);
  return err;
}

/* The case on the wgmma path, with the spec's tile and with the narrow
 * decode tile (MOEJIT_GEMM_WGMMA_NARROW forces the plan's choice). */
static void run_case_wgmma(const gemm_case *c) {
  gemm_case w = *c;
  w.path = MOEJIT_GEMM_PATH_WGMMA;
  for (int narrow = 0; narrow < 2; narrow++) {
    setenv("MOEJIT_GEMM_WGMMA_NARROW", narrow ? "1" : "0", 1);
    double err = run_case(&w);
    cr_expect(err <= w.tolerance, "gemm%d wgmma (%s tile): rel error %.3g", w.which,
              narrow ? "narrow" : "spec", err);
  }
  unsetenv("MOEJIT_GEMM_WGMMA_NARROW");
}

static double tol_of(moejit_dtype dt) {
  return dt == MOEJIT_DTYPE_FP32 ? 1e-5 : dt == MOEJIT_DTYPE_FP16 ? 5e-3 : 1e-2;
}

/* Both GEMMs (gemm2 with and without scale) of one spec and routing. */
static void run_both(moejit_ctx *ctx, const moejit_spec *s, const int32_t *counts, int64_t extra,
                     moejit_gemm_path path) {
  double tol = tol_of(s->act_dtype);
  gemm_case c1 = {ctx, s, 1, path, counts, extra, 0, tol, NULL};
  gemm_case c2 = {ctx, s, 2, path, counts, extra, 1, tol, NULL};
  gemm_case c3 = {ctx, s, 2, path, counts, extra, 0, tol, NULL};
  run_case(&c1);
  run_case(&c2);
  run_case(&c3);
  /* The same cases on the decode path (any row count: experts with more
   * rows than one pass takes go round again). */
  if ((path == MOEJIT_GEMM_PATH_MMA || path == MOEJIT_GEMM_PATH_AUTO) &&
      !mj_gemm_gemv_blocker(s, 1)) {
    gemm_case g[3] = {c1, c2, c3};
    for (int i = 0; i < 3; i++) {
      g[i].path = MOEJIT_GEMM_PATH_GEMV;
      double err = run_case(&g[i]);
      cr_expect(err <= tol, "gemm%d gemv: rel error %.3g", g[i].which, err);
    }
  }
  /* The same cases on the Hopper path, where the device and spec take it. */
  if ((path == MOEJIT_GEMM_PATH_MMA || path == MOEJIT_GEMM_PATH_AUTO) && ops_ctx_is_sm90a(ctx) &&
      !mj_gemm_wgmma_blocker(s, 1) && !mj_gemm_wgmma_blocker(s, 2)) {
    run_case_wgmma(&c1);
    run_case_wgmma(&c2);
    run_case_wgmma(&c3);
  }
}

/* d = 264, f = 200: every tile has N and K tails (264 = 4*64 + 8, 200 =
 * 128 + 72 = 3*64 + 8); counts: a 70-row expert (tile tails for every
 * tile_m), an empty one, a single row. */
static const int32_t small_counts[5] = {37, 0, 1, 70, 16};

static const moejit_gemm_cfg *shipped_tiles(size_t *n) {
  static moejit_gemm_cfg tiles[] = {
      /* the presets' configs (configs/models/) */
      {128, 256, 64, 4, 8, 1, 1, 0, 0},
      {128, 128, 64, 4, 8, 1, 1, 0, 0},
      {64, 256, 64, 4, 8, 1, 1, 0, 0},
      {64, 128, 64, 4, 8, 1, 1, 0, 0},
      /* decode and in-between shapes, 4 warps, k-split warps, raster along N */
      {16, 256, 128, 3, 8, 1, 1, 0, 0},
      {16, 64, 64, 4, 8, 1, 1, 1, 0},
      {16, 64, 32, 2, 4, 1, 1, 0, 0},
      {32, 256, 64, 3, 8, 1, 1, 1, 0},
      {32, 128, 32, 3, 4, 1, 1, 0, 0},
      {128, 64, 32, 2, 4, 1, 1, 1, 0},
      {256, 128, 64, 3, 8, 1, 1, 0, 0},
      {64, 32, 64, 5, 4, 1, 1, 0, 0},
      /* exactly 48 KiB of dynamic shared memory beside the kernel's static
       * bytes: past the default limit, so the launch must opt in */
      {64, 128, 64, 2, 8, 1, 1, 0, 0},
      {128, 128, 32, 3, 4, 1, 1, 0, 0}};
  *n = sizeof tiles / sizeof tiles[0];
  return tiles;
}

Test(gemm, tile_configs_on_ragged_shape_bf16) {
  moejit_ctx *ctx = ctx_or_skip();
  size_t n;
  const moejit_gemm_cfg *tiles = shipped_tiles(&n);
  for (size_t i = 0; i < n; i++) {
    moejit_spec s = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, tiles[i]);
    run_both(ctx, &s, small_counts, 11, MOEJIT_GEMM_PATH_MMA);
  }
  moejit_ctx_destroy(ctx);
}

Test(gemm, all_tile_configs, .timeout = 1800) {
  moejit_ctx *ctx = ctx_or_skip();
  const char *all = getenv("MOEJIT_GEMM_TEST_ALL_TILES");
  if (!all || strcmp(all, "1") != 0)
    cr_skip_test("set MOEJIT_GEMM_TEST_ALL_TILES=1 to sweep all 48 tile configs");
  static const int tm[] = {16, 32, 64, 128}, tn[] = {64, 128, 256}, tk[] = {32, 64}, w[] = {4, 8};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 3; b++)
      for (int k = 0; k < 2; k++)
        for (int v = 0; v < 2; v++) {
          if (tm[a] * tn[b] / (w[v] * 32) > 128) continue; /* the validator's register cap */
          moejit_spec s = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, cfg(tm[a], tn[b], tk[k], 3, w[v], (a + b) & 1));
          run_both(ctx, &s, small_counts, 5, MOEJIT_GEMM_PATH_MMA);
        }
  moejit_ctx_destroy(ctx);
}

Test(gemm, fp16_and_simt_paths) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s = make_spec(264, 200, 5, MOEJIT_DTYPE_FP16, cfg(64, 128, 64, 3, 8, 0));
  run_both(ctx, &s, small_counts, 3, MOEJIT_GEMM_PATH_AUTO);
  moejit_spec b = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, cfg(32, 128, 64, 3, 4, 0));
  run_both(ctx, &b, small_counts, 3, MOEJIT_GEMM_PATH_SIMT);
  /* AUTO under 64 rows (above the GEMV path's 8): the 64x128 decode tile,
   * built from a spec copy */
  mj_gemm_plan d;
  cr_assert_eq(mj_gemm_plan_make(&s, 2, MOEJIT_GEMM_PATH_AUTO, 9, &d), MOEJIT_OK);
  cr_assert(d.decode && d.use_mma);
  cr_assert_eq(d.tile_m, 64);
  cr_assert_eq(d.tile_n, 128);
  moejit_spec scratch;
  const moejit_spec *ks = mj_gemm_kernel_spec(&s, 2, &d, &scratch);
  cr_assert(ks == &scratch && ks->gemm2.tile_m == 64 && ks->gemm2.tile_n == 128);
  cr_assert_eq(ks->gemm1.tile_m, s.gemm1.tile_m, "GEMM 1's tile is untouched");
  cr_assert_eq(mj_gemm_plan_make(&s, 2, MOEJIT_GEMM_PATH_AUTO, 64, &d), MOEJIT_OK);
  cr_assert(!d.decode, "64 rows and more keep the spec's tile");
  moejit_spec f = make_spec(264, 200, 5, MOEJIT_DTYPE_FP32, cfg(32, 64, 32, 2, 4, 0));
  run_both(ctx, &f, small_counts, 3, MOEJIT_GEMM_PATH_AUTO); /* fp32 -> SIMT */
  moejit_ctx_destroy(ctx);
}

Test(gemm, routing_edge_cases) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s = make_spec(264, 200, 8, MOEJIT_DTYPE_BF16, cfg(64, 128, 64, 3, 8, 0));
  const int32_t one_hot[8] = {0, 0, 0, 0, 0, 301, 0, 0}; /* one expert, 4.7 tiles */
  const int32_t single[8] = {0, 0, 0, 1, 0, 0, 0, 0};   /* T = 1, k = 1 */
  const int32_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};     /* each expert one row */
  const int32_t first_last[8] = {64, 0, 0, 0, 0, 0, 0, 65}; /* exact tile, tile + 1 */
  const int32_t none[8] = {0};                              /* no rows at all */
  run_both(ctx, &s, one_hot, 0, MOEJIT_GEMM_PATH_AUTO);
  run_both(ctx, &s, single, 7, MOEJIT_GEMM_PATH_AUTO);
  run_both(ctx, &s, ones, 0, MOEJIT_GEMM_PATH_AUTO);
  run_both(ctx, &s, first_last, 2, MOEJIT_GEMM_PATH_AUTO);
  run_both(ctx, &s, none, 9, MOEJIT_GEMM_PATH_AUTO);
  moejit_ctx_destroy(ctx);
}

/* Both GEMMs (gemm2 with its row scale) of a d x f, 8-expert bf16 spec on
 * the explicit wgmma path for each tile, with `tweak` applied to both GEMMs'
 * configs, the experts' rows given by counts. */
static void run_wgmma_tiles_counts(moejit_ctx *ctx, int64_t d, int64_t f,
                                   const moejit_gemm_cfg *tiles, size_t n,
                                   void (*tweak)(moejit_gemm_cfg *), const char *what,
                                   const int32_t counts[8]) {
  for (size_t i = 0; i < n; i++) {
    moejit_spec s = make_spec(d, f, 8, MOEJIT_DTYPE_BF16, tiles[i]);
    tweak(&s.gemm1), tweak(&s.gemm2);
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    for (int which = 1; which <= 2; which++) {
      gemm_case c = {
          ctx, &s, which, MOEJIT_GEMM_PATH_WGMMA, counts, 5, which == 2, tol_of(s.act_dtype), NULL};
      double err = run_case(&c);
      cr_expect(err <= c.tolerance, "tile %d: gemm%d %s: rel error %.3g", (int)i, which, what, err);
    }
  }
}

/* The same with experts of an odd number of 128-row tiles, exact tile
 * multiples, a single row and empty experts. */
static void run_wgmma_tiles(moejit_ctx *ctx, int64_t d, int64_t f, const moejit_gemm_cfg *tiles,
                            size_t n, void (*tweak)(moejit_gemm_cfg *), const char *what) {
  static const int32_t counts[8] = {0, 129, 1, 300, 0, 256, 385, 2};
  run_wgmma_tiles_counts(ctx, d, f, tiles, n, tweak, what, counts);
}

static moejit_ctx *sm90a_ctx_or_skip(void) {
  moejit_ctx *ctx = ctx_or_skip();
  if (!ops_ctx_is_sm90a(ctx)) {
    moejit_ctx_destroy(ctx);
    cr_skip_test("the wgmma path needs an sm_90a device");
  }
  return ctx;
}

static void pair_along_m(moejit_gemm_cfg *g) {
  g->cluster_m = 2;
}

static void pingpong(moejit_gemm_cfg *g) {
  g->schedule = MOEJIT_SCHEDULE_PINGPONG;
}

/* cluster_m 2 on the wgmma path: CTA pairs share each weight tile by TMA
 * multicast; an expert with an odd number of tiles leaves the pair's second
 * CTA without rows. */
Test(gemm, wgmma_cluster_pairs) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  const moejit_gemm_cfg tiles[] = {cfg(128, 256, 64, 4, 8, 0), cfg(128, 128, 64, 4, 8, 1),
                                   cfg(64, 256, 64, 4, 8, 0)};
  run_wgmma_tiles(ctx, 264, 200, tiles, sizeof tiles / sizeof tiles[0], pair_along_m, "cluster 2");
  moejit_ctx_destroy(ctx);
}

static void pair_along_n(moejit_gemm_cfg *g) {
  g->cluster_n = 2;
}

/* cluster_n 2 on the wgmma path: CTA pairs on one M-tile and two consecutive
 * n-tiles share each A tile by TMA multicast (each CTA loads every other
 * box of it): cooperative 128- and 256-row tiles (the latter loading only
 * the 64-row boxes that hold rows, so a pair may split an odd count),
 * 64-row tiles, both rasters, then ping-pong with one hot expert and with
 * a single row. d = 504 and f = 200 give an even number of n-tiles for
 * every tile here (GEMM 1: 2 or 4, GEMM 2: 2 or 4) with K tails (504 and
 * 200 are not multiples of 64). */
Test(gemm, wgmma_cluster_pairs_along_n) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  const moejit_gemm_cfg tiles[] = {cfg(128, 256, 64, 4, 8, 0), cfg(128, 128, 64, 4, 8, 1),
                                   cfg(256, 128, 64, 4, 8, 0), cfg(64, 256, 64, 4, 8, 0),
                                   cfg(64, 128, 64, 4, 8, 1)};
  run_wgmma_tiles(ctx, 504, 200, tiles, sizeof tiles / sizeof tiles[0], pair_along_n,
                  "cluster_n 2");
  moejit_spec s = make_spec(504, 200, 8, MOEJIT_DTYPE_BF16, tiles[1]);
  s.gemm1.schedule = s.gemm2.schedule = MOEJIT_SCHEDULE_PINGPONG;
  pair_along_n(&s.gemm1), pair_along_n(&s.gemm2);
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  static const int32_t one_hot[8] = {0, 0, 0, 0, 0, 1001, 0, 0}; /* 7.8 tiles of 128 rows */
  static const int32_t single[8] = {0, 0, 0, 1, 0, 0, 0, 0};
  for (int which = 1; which <= 2; which++) {
    gemm_case c = {
        ctx, &s, which, MOEJIT_GEMM_PATH_WGMMA, one_hot, 3, which == 2, tol_of(s.act_dtype), NULL};
    double err = run_case(&c);
    cr_expect(err <= c.tolerance, "gemm%d, one hot expert: rel error %.3g", which, err);
    c.counts = single;
    err = run_case(&c);
    cr_expect(err <= c.tolerance, "gemm%d, one row: rel error %.3g", which, err);
  }
  moejit_ctx_destroy(ctx);
}

/* Cooperative 128-row tiles when the last round of the persistent schedule
 * would leave at least half the CTAs idle: that round's tiles are split into
 * the two consumers' 64-row halves, each its own item. Here (H100: 132 CTAs)
 * 14 M-tiles x 11 n-tiles = 154 tiles, so 22 tail tiles become 44 halves:
 * full 128-row tiles, a 1-row tile (empty second half), exactly 64 rows
 * (empty second half) and 65 rows (a 1-row second half); N and K have
 * tails (d = 1288, f = 648). Against the float64 reference, with the rows
 * past offsets[E] left poisoned and a bitwise rerun (run_case). */
Test(gemm, wgmma_splits_the_last_round) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  static const int32_t counts[8] = {129, 300, 0, 256, 385, 2, 64, 65};
  moejit_spec s = make_spec(1288, 648, 8, MOEJIT_DTYPE_BF16, cfg(128, 128, 64, 4, 8, 0));
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  int64_t m_tiles = 0, rows = 0;
  for (int e = 0; e < 8; e++) m_tiles += (counts[e] + 127) / 128, rows += counts[e];
  for (int which = 1; which <= 2; which++) {
    mj_gemm_plan p;
    cr_assert_eq(mj_gemm_plan_make_for(&s, which, MOEJIT_GEMM_PATH_WGMMA, rows + 5, "sm_90a", &p),
                 MOEJIT_OK, "%s", moejit_last_error());
    const int64_t sms = mj_ctx_sm_count(ctx), grid = p.grid < sms ? p.grid : sms;
    const int64_t tiles = m_tiles * p.n_tiles, rem = tiles % grid;
    if (sms == 132)
      cr_assert(tiles > grid && rem > 0 && 2 * rem <= grid,
                "gemm%d: %lld tiles on %lld CTAs should split the last round", which,
                (long long)tiles, (long long)grid);
    gemm_case c = {
        ctx, &s, which, MOEJIT_GEMM_PATH_WGMMA, counts, 5, which == 2, tol_of(s.act_dtype), NULL};
    double err = run_case(&c);
    cr_expect(err <= c.tolerance, "gemm%d split last round: rel error %.3g", which, err);
  }
  moejit_ctx_destroy(ctx);
}

/* The K parts a GEMM 2 launch of spec over `counts` splits each tile of its
 * last round into on this device (templates/common/gemm_wgmma.cuh,
 * mj_wg_schedule), 0 where it does not split along K. */
static int ksplit_parts(moejit_ctx *ctx, const moejit_spec *s, const int32_t *counts,
                        int64_t max_rows) {
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make_for(s, 2, MOEJIT_GEMM_PATH_WGMMA, max_rows, "sm_90a", &p),
               MOEJIT_OK, "%s", moejit_last_error());
  size_t bytes, zero;
  mj_gemm2_split_layout(&p, mj_ctx_sm_count(ctx), &bytes, &zero);
  int64_t m_tiles = 0;
  for (int e = 0; e < s->experts; e++) m_tiles += (counts[e] + p.tile_m - 1) / p.tile_m;
  const int64_t sms = mj_ctx_sm_count(ctx), grid = p.grid < sms ? p.grid : sms;
  const int64_t tiles = m_tiles * p.n_tiles, rem = tiles % grid;
  if (!bytes || rem == 0 || 2 * rem > grid) return 0;
  int64_t parts = grid / rem, k_parts = (p.k + 63) / 64 / MJ_WG_KSPLIT_MIN_KTILES;
  if (parts > 8) parts = 8; /* kWgKSplitMaxParts */
  if (parts > k_parts) parts = k_parts;
  return parts >= 2 ? (int)parts : 0;
}

/* One GEMM 2 case with the K-split scratch `split` (`total` bytes, the
 * first `zero` of them counters) on inputs drawn once: against the float64
 * reference with poisoned outputs and a bitwise rerun; the scratch's
 * partial sums written (poisoned before) and its counters left zero; within
 * bf16 rounding of the launch without scratch (row halves), and bitwise
 * that launch with $MOEJIT_GEMM_KSPLIT=0, which writes no partials. */
static void run_ksplit_case(moejit_ctx *ctx, const moejit_spec *s, const int32_t *counts,
                            int64_t extra, void *split, size_t total, size_t zero,
                            const char *what) {
  ts_rng r = ts_rng_fresh("test_gemm ksplit");
  gemm_case c = {ctx, s, 2, MOEJIT_GEMM_PATH_WGMMA, counts, extra, 1, tol_of(s->act_dtype), NULL};
  gemm_io io;
  io_prepare(&c, &r, &io);
  const int parts = ksplit_parts(ctx, s, counts, io.max_rows);
  cr_assert(parts >= 2 || mj_ctx_sm_count(ctx) != 132, "%s: %d K parts", what, parts);
  const size_t out_bytes = (size_t)(io.max_rows * io.n_out) * io.esz,
               valid = (size_t)(io.rows * io.n_out);
  moejit_gemm_args a = args_upload(&c, &io);
  a.split = split, a.split_bytes = total;
  unsigned char *host = malloc(total);
  void *halves = malloc(out_bytes), *off = malloc(out_bytes);
  double *half_ref = malloc(valid * sizeof(double));
  cr_assert(host && halves && off && half_ref);
  const size_t slots = (size_t)parts * (size_t)s->gemm2.tile_m * (size_t)s->gemm2.tile_n * 4;
  cr_assert_eq(moejit_memset_d32(ctx, split, 0, zero / 4, NULL), MOEJIT_OK);
  cr_assert_eq(moejit_memset_d32(ctx, (char *)split + zero, POISON_WORD, (total - zero) / 4, NULL),
               MOEJIT_OK);
  run_once(&c, &io, &a, io.out1);
  run_once(&c, &io, &a, io.out2);
  const double err = ref_gemm_rel_error(s->act_dtype, io.out1, io.ref, valid);
  cr_expect(err <= c.tolerance, "%s, K parts: rel error %.3g", what, err);
  cr_expect(all_poison((char *)io.out1 + valid * io.esz, out_bytes - valid * io.esz),
            "%s: rows past offsets[E] written", what);
  cr_expect(memcmp(io.out1, io.out2, out_bytes) == 0, "%s: two runs differ bitwise", what);
  cr_assert_eq(moejit_memcpy_dtoh(ctx, host, split, total, NULL), MOEJIT_OK);
  cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect(all_zero(host, zero), "%s: counters left nonzero", what);
  cr_expect(!all_poison(host + zero, slots), "%s: no partial sums written", what);
  /* without scratch: the last round's tiles in row halves */
  a.split = NULL, a.split_bytes = 0;
  run_once(&c, &io, &a, halves);
  for (size_t i = 0; i < valid; i++) half_ref[i] = ref_bf16_to_f32(((const uint16_t *)halves)[i]);
  const double diff = ref_gemm_rel_error(s->act_dtype, io.out1, half_ref, valid);
  cr_expect(diff < 1e-2, "%s: K parts against halves: %.3g", what, diff);
  /* $MOEJIT_GEMM_KSPLIT=0: the halves to the bit, no partial sums */
  cr_assert_eq(moejit_memset_d32(ctx, (char *)split + zero, POISON_WORD, (total - zero) / 4, NULL),
               MOEJIT_OK);
  a.split = split, a.split_bytes = total;
  setenv("MOEJIT_GEMM_KSPLIT", "0", 1);
  run_once(&c, &io, &a, off);
  unsetenv("MOEJIT_GEMM_KSPLIT");
  cr_expect(memcmp(off, halves, out_bytes) == 0, "%s: MOEJIT_GEMM_KSPLIT=0 is not the halves",
            what);
  cr_assert_eq(moejit_memcpy_dtoh(ctx, host, split, total, NULL), MOEJIT_OK);
  cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect(all_poison(host + zero, total - zero), "%s: MOEJIT_GEMM_KSPLIT=0 wrote partials", what);
  args_free(ctx, &a);
  free(host), free(halves), free(off), free(half_ref);
  io_free(&io);
}

/* GEMM 2's last round split along K (moejit_gemm_args.split): K = f = 6152
 * (97 k-tiles, a K tail: up to 3 parts of 32 k-tiles or more), N = d = 1032
 * (an N tail), 12 experts. 128 x 64 tiles (17 n-tiles): 8 M-tiles, 136
 * tiles on 132 CTAs, a whole round and then 4 tiles in 3 parts each; 3
 * M-tiles, all in the last round, in 2 parts. 256 x 128 tiles (9 n-tiles,
 * whose consumers skip the blocks without rows: 1 row, 129 rows): 2 M-tiles
 * on a grid capped at 108 by max_rows, in 3 parts each; 6 M-tiles in 2.
 * Empty experts, 1, 2, 64, 65, 129, 130 rows; max_rows 2000 rows past the
 * last expert where the grid should be all 132 SMs (run_ksplit_case). Then
 * where it never splits along K, and the argument checks. */
Test(gemm, wgmma_splits_the_last_round_along_k) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  static const int32_t mix[12] = {129, 0, 1, 64, 65, 0, 2, 130, 0, 0, 0, 0};
  static const int32_t few[12] = {129, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const int sms = mj_ctx_sm_count(ctx);
  const size_t zero = MOEJIT_GEMM2_SPLIT_ZERO_BYTES(sms), total = MOEJIT_GEMM2_SPLIT_MAX_BYTES(sms);
  void *split = dev_upload(ctx, NULL, total);
  const struct {
    moejit_gemm_cfg tile;
    const int32_t *counts;
    int64_t extra;
    int parts; /* on 132 SMs */
  } cases[4] = {{cfg(128, 64, 64, 4, 8, 0), mix, 2000, 3},
                {cfg(128, 64, 64, 4, 8, 0), few, 2000, 2},
                {cfg(256, 128, 64, 4, 8, 0), few, 5, 3},
                {cfg(256, 128, 64, 4, 8, 0), mix, 2000, 2}};
  for (int i = 0; i < 4; i++) {
    moejit_spec s = make_spec(1032, 6152, 12, MOEJIT_DTYPE_BF16, cases[i].tile);
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    int64_t rows = 0;
    for (int e = 0; e < 12; e++) rows += cases[i].counts[e];
    const int64_t max_rows = rows + cases[i].extra;
    if (sms == 132)
      cr_assert_eq(ksplit_parts(ctx, &s, cases[i].counts, max_rows), cases[i].parts, "case %d", i);
    size_t need = 0, need_zero = 0;
    cr_assert_eq(
        moejit_gemm2_split_size(ctx, &s, MOEJIT_GEMM_PATH_WGMMA, max_rows, &need, &need_zero),
        MOEJIT_OK, "%s", moejit_last_error());
    cr_assert(need > 0 && need <= total && need_zero == zero, "need %zu of %zu, zero %zu", need,
              total, need_zero);
    char what[64];
    snprintf(what, sizeof what, "case %d (%dx%d tiles)", i, cases[i].tile.tile_m,
             cases[i].tile.tile_n);
    run_ksplit_case(ctx, &s, cases[i].counts, cases[i].extra, split, need, zero, what);
  }
  /* where it never splits along K: K under 2 x 32 k-tiles, ping-pong,
   * 64-row tiles, cluster pairs */
  moejit_gemm_cfg no[4] = {cfg(128, 256, 64, 4, 8, 0), cfg(128, 128, 64, 4, 8, 0),
                           cfg(64, 256, 64, 4, 8, 0), cfg(128, 256, 64, 4, 8, 0)};
  pingpong(&no[1]);
  pair_along_m(&no[3]);
  for (int i = 0; i < 4; i++) {
    moejit_spec s = make_spec(1288, i == 0 ? 4032 : 6152, 8, MOEJIT_DTYPE_BF16, no[i]);
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    size_t need = 1, need_zero = 1;
    cr_assert_eq(moejit_gemm2_split_size(ctx, &s, MOEJIT_GEMM_PATH_WGMMA, 4000, &need, &need_zero),
                 MOEJIT_OK, "%s", moejit_last_error());
    cr_expect(need == 0 && need_zero == 0, "case %d: %zu bytes", i, need);
  }
  moejit_spec s = make_spec(1288, 6152, 8, MOEJIT_DTYPE_BF16, no[0]);
  size_t need = 1;
  cr_assert_eq(moejit_gemm2_split_size(ctx, &s, MOEJIT_GEMM_PATH_AUTO, 0, &need, NULL), MOEJIT_OK);
  cr_expect_eq(need, 0u);
  cr_expect_eq(moejit_gemm2_split_size(ctx, &s, MOEJIT_GEMM_PATH_AUTO, -1, &need, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_gemm2_split_size(ctx, NULL, MOEJIT_GEMM_PATH_AUTO, 1, &need, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  /* too little scratch, misaligned scratch, scratch for GEMM 1 */
  moejit_gemm_args a = {.a = split,
                        .w = split,
                        .out = split,
                        .expert_offsets = (const int32_t *)split,
                        .max_rows = 4000,
                        .path = MOEJIT_GEMM_PATH_WGMMA,
                        .split = split,
                        .split_bytes = 1024};
  cr_expect_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "split_bytes"), "%s", moejit_last_error());
  a.split = (char *)split + 4, a.split_bytes = total - 4;
  cr_expect_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "args->split"), "%s", moejit_last_error());
  a.split = split, a.split_bytes = total;
  cr_expect_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "only GEMM 2"), "%s", moejit_last_error());
  cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
  moejit_mem_free(ctx, split, NULL);
  moejit_ctx_destroy(ctx);
}

static void keep_cfg(moejit_gemm_cfg *g) {
  (void)g;
}

/* The persistent schedule's groups of about 8 M-tiles keep an expert of
 * fewer M-tiles whole (its start moves back) and cut larger ones at
 * multiples of 8; only the first 2E + 2 groups are kept in shared memory,
 * later ones keep their nominal starts. Every tile must still be computed
 * once, along M and along N. 16 experts of 128-row M-tiles 3,3,3,3,5,1,2,
 * 7,0,4,6,3,9,1,2,3 put small experts across the nominal starts 8, 16, 24
 * and 32 and a 9-tile expert across 40 and 48; 3 experts of 64-row M-tiles
 * 63, 5, 11 have 10 groups, so the 5-tile expert is cut at 64, the start
 * of group 8, past the 8 kept ones. Rows are not tile multiples. */
Test(gemm, wgmma_groups_keep_small_experts_whole) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  static const int32_t many[16] = {300, 257, 384, 290, 600,  1,   200, 850,
                                   0,   500, 700, 270, 1100, 128, 129, 330};
  static const int32_t few[3] = {4000, 300, 700};
  const struct {
    int experts;
    const int32_t *counts;
    moejit_gemm_cfg tile;
  } cases[] = {{16, many, cfg(128, 128, 64, 4, 8, 0)},
               {16, many, cfg(128, 128, 64, 4, 8, 1)},
               {3, few, cfg(64, 128, 64, 4, 8, 0)},
               {3, few, cfg(64, 128, 64, 4, 8, 1)}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moejit_spec s = make_spec(520, 328, cases[i].experts, MOEJIT_DTYPE_BF16, cases[i].tile);
    for (int which = 1; which <= 2; which++) {
      gemm_case c = {ctx,
                     &s,
                     which,
                     MOEJIT_GEMM_PATH_WGMMA,
                     cases[i].counts,
                     5,
                     which == 2,
                     tol_of(s.act_dtype),
                     NULL};
      double err = run_case(&c);
      cr_expect(err <= c.tolerance, "case %d: gemm%d: rel error %.3g", (int)i, which, err);
    }
  }
  moejit_ctx_destroy(ctx);
}

/* Cooperative 256-row tiles multiply and load only the m64 blocks holding
 * rows of the tile's expert: last M-tiles of 1 and 64 rows (consumer 0 on
 * one block, consumer 1 without rows), 129 and 192 (consumer 1 on one
 * block), 193 (on both), 44 (300 = 256 + 44), 255 (511) and 32 (800 = 3 x
 * 256 + 32), along M and along N. With d = 1288 and f = 648 both GEMMs have
 * 13 M-tiles x 11 n-tiles = 143 tiles, so on 132 CTAs the last round is
 * split into halves too; cluster pairs on a smaller shape. */
Test(gemm, wgmma_256_row_tiles_skip_empty_blocks) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  static const int32_t counts[8] = {1, 64, 129, 192, 193, 300, 800, 511};
  const moejit_gemm_cfg tiles[] = {cfg(256, 128, 64, 4, 8, 0), cfg(256, 128, 64, 4, 8, 1)};
  run_wgmma_tiles_counts(ctx, 1288, 648, tiles, 2, keep_cfg, "256-row tiles", counts);
  run_wgmma_tiles_counts(ctx, 520, 328, tiles, 1, pair_along_m, "256-row tiles in pairs", counts);
  mj_gemm_plan p;
  moejit_spec s = make_spec(1288, 648, 8, MOEJIT_DTYPE_BF16, tiles[0]);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 2, MOEJIT_GEMM_PATH_WGMMA, 3000, "sm_90a", &p), MOEJIT_OK,
               "%s", moejit_last_error());
  cr_assert_eq(p.wg_box_a_rows, 64, "256-row tiles load A in 64-row boxes");
  moejit_ctx_destroy(ctx);
}

/* The rounds of GEMM 1's persistent schedule a launch of spec runs over
 * `counts` on this device (CTA b takes items b, b + grid, ...), with the
 * last round split into halves where the kernel splits it. */
static int64_t wgmma_rounds(moejit_ctx *ctx, const moejit_spec *s, const int32_t *counts,
                            int64_t max_rows) {
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make_for(s, 1, MOEJIT_GEMM_PATH_WGMMA, max_rows, "sm_90a", &p),
               MOEJIT_OK, "%s", moejit_last_error());
  int64_t m_tiles = 0;
  for (int e = 0; e < s->experts; e++) m_tiles += (counts[e] + p.tile_m - 1) / p.tile_m;
  const int64_t sms = mj_ctx_sm_count(ctx), grid = p.grid < sms ? p.grid : sms;
  const int64_t tiles = m_tiles * p.n_tiles, rem = tiles % grid;
  const int split = !p.wg_pingpong && p.tile_m >= 128 && rem > 0 && 2 * rem <= grid;
  const int64_t items = split ? tiles + rem : tiles;
  return (items + grid - 1) / grid;
}

/* GEMM 1 with its rounds in step (moejit_gemm_args.round_sync): 128-row
 * cooperative tiles over 4320 rows of 8 experts (more than two M-tiles an
 * expert: the rule turns it on), 39 M-tiles x 11 n-tiles = 429 tiles, on
 * 132 CTAs three whole rounds and a last one split into halves. Against
 * the float64 reference with poisoned outputs and a bitwise rerun
 * (run_case); each launch leaves the first word zero and moves the second
 * on by one per barrier (rounds - 1). Forced on ($MOEJIT_GEMM_ROUND_SYNC=1)
 * for a 64-row tile; the rule's refusals. */
Test(gemm, wgmma_rounds_in_step) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  static const int32_t counts[8] = {700, 900, 0, 1, 650, 1300, 129, 640};
  const uint32_t zero[2] = {0, 0};
  uint32_t *sync = dev_upload(ctx, zero, sizeof zero);
  int64_t rows = 0;
  for (int e = 0; e < 8; e++) rows += counts[e];
  unsetenv("MOEJIT_GEMM_ROUND_SYNC");
  const moejit_gemm_cfg tiles[2] = {cfg(128, 128, 64, 4, 8, 0), cfg(64, 256, 64, 4, 8, 1)};
  for (int i = 0; i < 2; i++) {
    moejit_spec s = make_spec(1288, 648, 8, MOEJIT_DTYPE_BF16, tiles[i]);
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    mj_gemm_plan p;
    cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, rows + 5, "sm_90a", &p),
                 MOEJIT_OK, "%s", moejit_last_error());
    moejit_gemm_args a = {.max_rows = rows + 5, .round_sync = sync};
    cr_assert_eq(mj_gemm1_rounds_in_step(&s, &a, &p), i == 0,
                 "tile %d: on for 128-row tiles at 540 rows an expert, off for 64-row ones", i);
    if (i == 1) setenv("MOEJIT_GEMM_ROUND_SYNC", "1", 1);
    cr_assert(mj_gemm1_rounds_in_step(&s, &a, &p));
    const int64_t barriers = wgmma_rounds(ctx, &s, counts, rows + 5) - 1;
    cr_assert(barriers >= 2, "tile %d: %lld barriers", i, (long long)barriers);
    uint32_t before[2], after[2];
    cr_assert_eq(moejit_memcpy_dtoh(ctx, before, sync, sizeof before, NULL), MOEJIT_OK);
    gemm_case c = {ctx, &s, 1, MOEJIT_GEMM_PATH_WGMMA, counts, 5, 0, tol_of(s.act_dtype), sync};
    const double err = run_case(&c);
    cr_expect(err <= c.tolerance, "tile %d in step: rel error %.3g", i, err);
    cr_assert_eq(moejit_memcpy_dtoh(ctx, after, sync, sizeof after, NULL), MOEJIT_OK);
    cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
    cr_expect_eq(after[0], 0u, "tile %d: the arrival count is left zero", i);
    cr_expect_eq((int64_t)(after[1] - before[1]), 2 * barriers,
                 "tile %d: two launches of %lld barriers each", i, (long long)barriers);
    unsetenv("MOEJIT_GEMM_ROUND_SYNC");
  }
  /* the rule's refusals */
  moejit_spec s = make_spec(1288, 648, 8, MOEJIT_DTYPE_BF16, tiles[0]);
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, rows, "sm_90a", &p), MOEJIT_OK);
  moejit_gemm_args a = {.max_rows = 128 * 8 - 1, .round_sync = sync};
  cr_expect(!mj_gemm1_rounds_in_step(&s, &a, &p), "under a tile's rows an expert");
  a.max_rows = 128 * 8;
  cr_expect(mj_gemm1_rounds_in_step(&s, &a, &p), "a tile's rows an expert");
  a.max_rows = rows;
  a.a_index = (const int32_t *)sync;
  cr_expect(!mj_gemm1_rounds_in_step(&s, &a, &p), "gathering");
  a.a_index = NULL, a.round_sync = NULL;
  cr_expect(!mj_gemm1_rounds_in_step(&s, &a, &p), "no words");
  a.round_sync = sync;
  setenv("MOEJIT_GEMM_ROUND_SYNC", "0", 1);
  cr_expect(!mj_gemm1_rounds_in_step(&s, &a, &p), "MOEJIT_GEMM_ROUND_SYNC=0");
  unsetenv("MOEJIT_GEMM_ROUND_SYNC");
  s.gemm1.schedule = MOEJIT_SCHEDULE_PINGPONG;
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, rows, "sm_90a", &p), MOEJIT_OK);
  cr_expect(!mj_gemm1_rounds_in_step(&s, &a, &p), "ping-pong");
  /* GEMM 2 refuses the words */
  moejit_gemm_args g2 = {.a = sync,
                         .w = sync,
                         .out = sync,
                         .expert_offsets = (const int32_t *)sync,
                         .max_rows = 1,
                         .round_sync = sync};
  cr_expect_eq(moejit_gemm2(ctx, &s, &g2, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "round_sync"), "%s", moejit_last_error());
  moejit_mem_free(ctx, sync, NULL);
  moejit_ctx_destroy(ctx);
}

/* schedule pingpong on the wgmma path: two consumer warpgroups alternate
 * whole tiles (each CTA takes several tiles: odd and even counts per CTA,
 * ragged N and K with more k-tiles than stages, uneven routing). */
Test(gemm, wgmma_pingpong) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  const moejit_gemm_cfg tiles[] = {cfg(128, 128, 64, 4, 8, 0), cfg(64, 256, 64, 4, 8, 1),
                                   cfg(64, 128, 128, 3, 8, 0)};
  run_wgmma_tiles(ctx, 1032, 584, tiles, sizeof tiles / sizeof tiles[0], pingpong, "pingpong");
  /* 128-row ping-pong tiles cut short by the expert's end at every depth:
   * last M-tiles of 64, 1 and 64 rows (counts 64, 1, 192, 320), where one
   * consumer's second m64 block holds no rows, and of 65, 72 and 127 rows
   * (65, 200, 127), where it holds some. */
  static const int32_t tails[8] = {64, 65, 200, 127, 1, 0, 192, 320};
  run_wgmma_tiles_counts(ctx, 520, 328, tiles, 1, pingpong, "pingpong m64 tails", tails);
  /* a tile one warpgroup cannot hold: refused on WGMMA, mma.sync under AUTO */
  moejit_spec big = make_spec(264, 200, 8, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  big.gemm2.schedule = MOEJIT_SCHEDULE_PINGPONG;
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make_for(&big, 2, MOEJIT_GEMM_PATH_WGMMA, 100, "sm_90a", &p),
               MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "pingpong"), "%s", moejit_last_error());
  moejit_ctx_destroy(ctx);
}

/* The presets' d and f with few experts (the reference costs M*N*K). */
Test(gemm, preset_shapes_qwen3) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK);
  moejit_spec q = make_spec(s.hidden, s.expert_width, 16, MOEJIT_DTYPE_BF16, s.gemm1);
  q.gemm2 = s.gemm2;
  const int32_t counts[16] = {1, 0, 150, 3, 0, 0, 17, 1, 0, 0, 0, 9, 0, 0, 0, 64};
  run_both(ctx, &q, counts, 5, MOEJIT_GEMM_PATH_AUTO);
  /* decode: T = 1, k = 8 of 128 experts, with a 16-row k-split tile */
  moejit_spec d = make_spec(s.hidden, s.expert_width, 128, MOEJIT_DTYPE_BF16, cfg(16, 64, 64, 4, 8, 0));
  int32_t dec[128] = {0};
  for (int i = 0; i < 8; i++) dec[(i * 37 + 5) % 128] = 1;
  run_both(ctx, &d, dec, 0, MOEJIT_GEMM_PATH_AUTO);
  /* the same decode on mma.sync's 64-row decode tile (AUTO's pick off
   * sm_90a when the GEMV path is turned off) */
  setenv("MOEJIT_GEMM_WGMMA", "0", 1);
  setenv("MOEJIT_GEMM_GEMV", "0", 1);
  run_both(ctx, &d, dec, 0, MOEJIT_GEMM_PATH_AUTO);
  unsetenv("MOEJIT_GEMM_WGMMA");
  unsetenv("MOEJIT_GEMM_GEMV");
  moejit_ctx_destroy(ctx);
}

/* The tiles a load on a GPU with less shared memory a block runs (the
 * presets' H100 tiles fitted to sm_80's 163 KiB and sm_86's 99 KiB: fewer
 * stages, a shorter tile_k; mj_gemm_plan_make_for), run here on mma.sync:
 * the same answer as the reference. */
Test(gemm, preset_tiles_fitted_to_smaller_archs) {
  moejit_ctx *ctx = ctx_or_skip();
  static const char *const presets[] = {"qwen3-30b-a3b", "olmoe-1b-7b"};
  static const char *const archs[] = {"sm_80", "sm_86"};
  const int32_t counts[8] = {1, 0, 150, 3, 0, 17, 64, 129};
  for (size_t p = 0; p < 2; p++) {
    moejit_spec s;
    cr_assert_eq(moejit_spec_load_preset(presets[p], &s), MOEJIT_OK);
    for (size_t a = 0; a < 2; a++)
      for (int which = 1; which <= 2; which++) {
        mj_gemm_plan plan;
        cr_assert_eq(mj_gemm_plan_make_for(&s, which, MOEJIT_GEMM_PATH_AUTO, 4096, archs[a], &plan),
                     MOEJIT_OK, "%s", moejit_last_error());
        cr_assert(plan.use_mma && plan.fitted, "%s GEMM %d on %s", presets[p], which, archs[a]);
        moejit_spec f = make_spec(s.hidden, s.expert_width, 8, MOEJIT_DTYPE_BF16, plan.cfg);
        f.gemm2 = plan.cfg;
        gemm_case c = {ctx, &f, which, MOEJIT_GEMM_PATH_MMA, counts, 7, which == 2, 1e-2, NULL};
        run_case(&c);
      }
  }
  moejit_ctx_destroy(ctx);
}

Test(gemm, preset_shapes_mixtral_deepseek, .timeout = 1200) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec m, ds;
  cr_assert_eq(moejit_spec_load_preset("mixtral-8x7b", &m), MOEJIT_OK);
  cr_assert_eq(moejit_spec_load_preset("deepseek-v3", &ds), MOEJIT_OK);
  moejit_spec mx = make_spec(m.hidden, m.expert_width, 2, MOEJIT_DTYPE_BF16, m.gemm1);
  mx.gemm2 = m.gemm2;
  const int32_t mc[2] = {3, 2};
  run_both(ctx, &mx, mc, 1, MOEJIT_GEMM_PATH_AUTO);
  moejit_spec dv = make_spec(ds.hidden, ds.expert_width, 4, MOEJIT_DTYPE_BF16, ds.gemm1);
  dv.gemm2 = ds.gemm2;
  const int32_t dc[4] = {0, 20, 1, 9};
  run_both(ctx, &dv, dc, 0, MOEJIT_GEMM_PATH_AUTO);
  moejit_ctx_destroy(ctx);
}

Test(gemm, argument_checks) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, cfg(64, 128, 64, 3, 8, 0));
  void *buf = dev_upload(ctx, NULL, 1 << 20);
  int32_t off[6] = {0, 1, 2, 3, 4, 5};
  void *doff = dev_upload(ctx, off, sizeof off);
  moejit_gemm_args ok = {.a = buf, .w = buf, .out = buf, .expert_offsets = doff, .max_rows = 5,
                         .path = MOEJIT_GEMM_PATH_AUTO},
                   a;
  cr_assert_eq(moejit_gemm1_swiglu(NULL, &s, &ok, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_gemm1_swiglu(ctx, NULL, &ok, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_gemm2(ctx, &s, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.a = NULL;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "args->a"), "%s", moejit_last_error());
  a = ok, a.out = (char *)buf + 2;
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "16-byte"), "%s", moejit_last_error());
  a = ok, a.expert_offsets = (const int32_t *)((char *)doff + 2);
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.row_scale = (const float *)((char *)buf + 1);
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.max_rows = -1;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.max_rows = (int64_t)INT32_MAX + 1;
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.path = (moejit_gemm_path)7;
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.max_rows = 0; /* no rows: nothing launched, OK */
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_OK, "%s", moejit_last_error());
  a.path = (moejit_gemm_path)77; /* ... but a bad path or spec is still one */
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a.path = ok.path;
  moejit_spec huge = s;
  huge.experts = INT32_MAX; /* no int overflow on the way to the refusal */
  cr_assert_eq(moejit_gemm2(ctx, &huge, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_spec f = make_spec(264, 200, 5, MOEJIT_DTYPE_FP32, cfg(32, 64, 32, 2, 4, 0));
  a = ok, a.path = MOEJIT_GEMM_PATH_MMA;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &f, &a, NULL), MOEJIT_ERR_UNSUPPORTED);
  moejit_spec w12 = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, cfg(64, 128, 64, 3, 12, 0));
  setenv("MOEJIT_GEMM_WGMMA", "0", 1); /* AUTO on mma.sync, which takes 4 or 8 warps */
  setenv("MOEJIT_GEMM_GEMV", "0", 1);  /* (5 rows would take the GEMV path, warps unused) */
  cr_assert_eq(moejit_gemm2(ctx, &w12, &ok, NULL), MOEJIT_ERR_UNSUPPORTED);
  unsetenv("MOEJIT_GEMM_WGMMA");
  unsetenv("MOEJIT_GEMM_GEMV");
  cr_assert(strstr(moejit_last_error(), "warps"), "%s", moejit_last_error());
  a = ok, a.path = MOEJIT_GEMM_PATH_WGMMA; /* fp32: the wgmma kernel cannot take it */
  cr_assert_eq(moejit_gemm2(ctx, &f, &a, NULL), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "wgmma"), "%s", moejit_last_error());
  a = ok, a.path = MOEJIT_GEMM_PATH_WGMMA; /* bf16: runs on sm_90a, refused elsewhere */
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL),
               ops_ctx_is_sm90a(ctx) ? MOEJIT_OK : MOEJIT_ERR_UNSUPPORTED, "%s",
               moejit_last_error());
  cr_assert_eq(moejit_ctx_synchronize(ctx), MOEJIT_OK, "%s", moejit_last_error());
  moejit_mem_free(ctx, buf, NULL);
  moejit_mem_free(ctx, doff, NULL);
  moejit_ctx_destroy(ctx);
}

/* ---- GEMM 1 gathering its rows (args.a_index) ------------------------------------ */

/* Row r of A = x[index[r] / div], zeros where the index is negative or its
 * row is at or past x_rows. */
static void gather_rows(const void *x, int64_t x_rows, const int32_t *index, int div, int64_t rows,
                        int64_t k, size_t esz, void *a) {
  for (int64_t r = 0; r < rows; r++) {
    char *dst = (char *)a + (size_t)(r * k) * esz;
    const int64_t xr = index[r] < 0 ? -1 : index[r] / div;
    if (xr < 0 || xr >= x_rows) memset(dst, 0, (size_t)k * esz);
    else memcpy(dst, (const char *)x + (size_t)(xr * k) * esz, (size_t)k * esz);
  }
}

/* The gathering wgmma kernel against the same kernel on the permuted copy
 * (bitwise: same rows, same math) and the float64 reference: uneven
 * routing, rows past offsets[E] left alone, negative and out-of-range
 * indices giving zero rows. narrow: the narrow tile (AUTO, forced), else
 * the spec's (WGMMA). */
static void run_gather(moejit_ctx *ctx, const moejit_spec *s, int div, int narrow,
                       const char *what) {
  static const int32_t counts[8] = {0, 129, 1, 300, 0, 256, 385, 2};
  ts_rng r = ts_rng_fresh("test_gemm gather");
  const int E = s->experts;
  const int64_t k = s->hidden, f = s->expert_width, extra = 5;
  const size_t esz = moejit_dtype_size(s->act_dtype);
  int32_t off[9] = {0};
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
  const int64_t rows = off[E], max_rows = rows + extra, x_rows = rows / div + 3;
  int32_t *index = malloc(sizeof(int32_t) * (size_t)max_rows);
  void *x = malloc((size_t)(x_rows * k) * esz), *a = malloc((size_t)(max_rows * k) * esz);
  void *w = malloc((size_t)(E * 2 * f * k) * esz);
  void *o1 = malloc((size_t)(max_rows * f) * esz), *o2 = malloc((size_t)(max_rows * f) * esz);
  double *ref = malloc(sizeof(double) * (size_t)(max_rows * f));
  cr_assert(index && x && a && w && o1 && o2 && ref);
  fill_random(&r, s->act_dtype, x, (size_t)(x_rows * k), 1.0);
  fill_random(&r, s->weight_dtype, w, (size_t)(E * 2 * f * k), 3.0 / sqrt((double)k));
  for (int64_t i = 0; i < max_rows; i++) {
    const uint64_t u = ts_next(&r) % 64;
    index[i] = u == 0 ? -1 : u == 1 ? (int32_t)(x_rows * div + (int64_t)(u % 7)) /* past x */
                                    : (int32_t)(ts_next(&r) % (uint64_t)(x_rows * div));
  }
  gather_rows(x, x_rows, index, div, max_rows, k, esz, a);
  ref_gemm_problem p = {s->act_dtype, s->weight_dtype, a, w, off, NULL, E, k, f};
  ref_gemm1_swiglu(&p, ref);
  const size_t out_bytes = (size_t)(max_rows * f) * esz;
  void *d_x = dev_upload(ctx, x, (size_t)(x_rows * k) * esz), *d_a = dev_upload(ctx, a, (size_t)(max_rows * k) * esz);
  void *d_w = dev_upload(ctx, w, (size_t)(E * 2 * f * k) * esz), *d_out = dev_upload(ctx, NULL, out_bytes);
  void *d_off = dev_upload(ctx, off, sizeof off), *d_idx = dev_upload(ctx, index, sizeof(int32_t) * (size_t)max_rows);
  const moejit_gemm_path path = narrow ? MOEJIT_GEMM_PATH_AUTO : MOEJIT_GEMM_PATH_WGMMA;
  gemm_case c = {ctx, s, 1, path, counts, extra, 0, tol_of(s->act_dtype), NULL};
  gemm_io io = {.max_rows = max_rows, .n_out = f, .esz = esz};
  setenv("MOEJIT_GEMM_WGMMA_NARROW", narrow ? "1" : "0", 1);
  moejit_gemm_args copy = {.a = d_a,
                           .w = d_w,
                           .out = d_out,
                           .expert_offsets = d_off,
                           .max_rows = max_rows,
                           .path = path};
  run_once(&c, &io, &copy, o1);
  moejit_gemm_args gather = copy;
  gather.a = d_x, gather.a_index = d_idx, gather.a_index_div = div, gather.a_rows = x_rows;
  run_once(&c, &io, &gather, o2);
  unsetenv("MOEJIT_GEMM_WGMMA_NARROW");
  const size_t valid = (size_t)(rows * f) * esz;
  cr_expect(memcmp(o1, o2, out_bytes) == 0, "%s: gathered rows differ from the permuted copy's", what);
  cr_expect(all_poison((char *)o2 + valid, out_bytes - valid), "%s: wrote rows past offsets[E]", what);
  const double err = ref_gemm_rel_error(s->act_dtype, o2, ref, (size_t)(rows * f));
  cr_expect(err <= c.tolerance, "%s: rel error %.3g", what, err);
  void *bufs[] = {d_x, d_a, d_w, d_out, d_off, d_idx};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) moejit_mem_free(ctx, bufs[i], NULL);
  free(index), free(x), free(a), free(w), free(o1), free(o2), free(ref);
}

Test(gemm, wgmma_gathers_rows) {
  moejit_ctx *ctx = sm90a_ctx_or_skip();
  const struct {
    moejit_gemm_cfg g;
    void (*tweak)(moejit_gemm_cfg *);
    int div;
    const char *what;
  } cases[] = {
      {cfg(128, 256, 64, 4, 8, 0), NULL, 8, "128x256 cooperative, top-8 rows"},
      {cfg(64, 256, 64, 4, 8, 1), pingpong, 2, "64x256 pingpong"},
      {cfg(128, 128, 64, 4, 8, 0), pair_along_m, 1, "128x128 cluster pairs"},
      {cfg(128, 128, 64, 2, 8, 0), NULL, 3, "two stages (no lag)"},
      {cfg(256, 128, 64, 4, 8, 1), NULL, 8, "256x128 along N: m64 blocks without rows skipped"},
      {cfg(64, 128, 64, 3, 8, 0), NULL, 4, "three stages"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    moejit_spec s = make_spec(1032, 200, 8, MOEJIT_DTYPE_BF16, cases[i].g);
    if (cases[i].tweak) cases[i].tweak(&s.gemm1);
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    run_gather(ctx, &s, cases[i].div, 0, cases[i].what);
  }
  moejit_spec h = make_spec(264, 200, 8, MOEJIT_DTYPE_FP16, cfg(128, 256, 64, 4, 8, 0));
  run_gather(ctx, &h, 8, 0, "fp16, K = 264");
  run_gather(ctx, &h, 8, 1, "fp16, K = 264, the narrow tile");
  moejit_spec one = make_spec(56, 200, 8, MOEJIT_DTYPE_BF16, cfg(128, 128, 64, 4, 8, 0));
  run_gather(ctx, &one, 2, 0, "K = 56: one k-tile per tile");
  run_gather(ctx, &one, 2, 1, "K = 56, the narrow tile");
  moejit_spec n = make_spec(1032, 200, 8, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  run_gather(ctx, &n, 8, 1, "the narrow tile, top-8 rows");
  moejit_ctx_destroy(ctx);
}

/* Gathering is GEMM 1's, on the wgmma kernel only (spec or narrow tile). */
Test(gemm, gather_argument_checks) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s = make_spec(264, 200, 5, MOEJIT_DTYPE_BF16, cfg(128, 128, 64, 4, 8, 0));
  void *buf = dev_upload(ctx, NULL, 1 << 20);
  int32_t off[6] = {0, 1, 2, 3, 4, 5};
  void *doff = dev_upload(ctx, off, sizeof off);
  moejit_gemm_args ok = {.a = buf, .w = buf, .out = buf, .expert_offsets = doff, .max_rows = 5,
                         .path = MOEJIT_GEMM_PATH_WGMMA, .a_index = buf, .a_index_div = 2,
                         .a_rows = 3};
  moejit_gemm_args a = ok;
  cr_assert_eq(moejit_gemm2(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "a_index"), "%s", moejit_last_error());
  a = ok, a.a_index = (const int32_t *)((char *)buf + 2);
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.a_rows = 0;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "a_rows"), "%s", moejit_last_error());
  a = ok, a.a_index_div = -1;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = ok, a.path = MOEJIT_GEMM_PATH_MMA;
  cr_assert_eq(moejit_gemm1_swiglu(ctx, &s, &a, NULL), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "a_index"), "%s", moejit_last_error());
  if (ops_ctx_is_sm90a(ctx)) {
    /* pairs along N share A by multicast: no gathering there */
    moejit_spec n = s;
    n.gemm1.cluster_n = 2;
    cr_assert_eq(moejit_spec_validate(&n), MOEJIT_OK, "%s", moejit_last_error());
    a = ok;
    cr_assert_eq(moejit_gemm1_swiglu(ctx, &n, &a, NULL), MOEJIT_ERR_UNSUPPORTED);
    cr_assert(strstr(moejit_last_error(), "cluster_n"), "%s", moejit_last_error());
  }
  moejit_mem_free(ctx, buf, NULL);
  moejit_mem_free(ctx, doff, NULL);
  moejit_ctx_destroy(ctx);
}

/* Rows past an expert's range belong to the next expert: with one tile
 * straddling two experts, each expert's rows come out right (the other's
 * rows are neither overwritten nor clobbered). Every path the device has. */
Test(gemm, tile_straddling_experts) {
  moejit_ctx *ctx = ctx_or_skip();
  moejit_spec s = make_spec(128, 64, 3, MOEJIT_DTYPE_BF16, cfg(128, 64, 64, 4, 8, 0));
  const int32_t counts[3] = {5, 120, 3}; /* 5 + 120 + 3 rows: every tile holds two experts */
  run_both(ctx, &s, counts, 4, MOEJIT_GEMM_PATH_MMA);
  moejit_ctx_destroy(ctx);
}

/* The host plan mirrors the template's shape rules (no GPU needed). */
Test(gemm, plan_matches_template_rules) {
  moejit_spec s = make_spec(2048, 768, 128, MOEJIT_DTYPE_BF16, cfg(64, 256, 64, 4, 8, 0));
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1000, &p), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(p.use_mma);
  cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_mma");
  cr_assert_eq(p.n_tiles, 6);             /* 768 h columns / 128 per tile */
  cr_assert_eq(p.m_slots, 1000 / 64 + 128);
  cr_assert_eq(p.grid, (unsigned)(p.m_slots * 6));
  cr_assert_eq(p.warps_m * p.warps_n, 8);
  cr_assert_eq(p.warps_k, 1);
  cr_assert_eq(64 / p.warps_m + 256 / p.warps_n, 96); /* squarest: 64x32 (ties: fewer m-warps) */
  cr_assert_eq(p.warps_m, 1);
  cr_assert_eq(p.smem_bytes, 4u * (64 + 256) * 64 * 2);
  s.gemm2 = cfg(16, 64, 64, 4, 8, 0); /* 4 16x16 pieces for 8 warps: k-split 2 */
  cr_assert_eq(mj_gemm_plan_make(&s, 2, MOEJIT_GEMM_PATH_MMA, 8, &p), MOEJIT_OK);
  cr_assert(!p.decode, "path MMA keeps the spec's tile");
  cr_assert_eq(p.warps_k, 2);
  cr_assert_eq(p.n_tiles, 2048 / 64);
  cr_assert_eq(p.smem_bytes, 4u * (16 + 64) * 64 * 2);
  moejit_spec f = make_spec(264, 200, 5, MOEJIT_DTYPE_FP32, cfg(32, 64, 32, 2, 4, 0));
  cr_assert_eq(mj_gemm_plan_make(&f, 1, MOEJIT_GEMM_PATH_AUTO, 100, &p), MOEJIT_OK);
  cr_assert(!p.use_mma);
  cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_simt");
  cr_assert_eq(mj_gemm_plan_make(&f, 1, MOEJIT_GEMM_PATH_MMA, 100, &p), MOEJIT_ERR_UNSUPPORTED);
}

/* The wgmma plan mirrors mj_wg_shape (templates/common/gemm_wgmma.cuh). */
/* The entry AUTO (or `path`) plans for `rows` rows of GEMM `which`. */
static void plan_entry_is(const moejit_spec *s, int which, moejit_gemm_path path, int64_t rows,
                          const char *entry) {
  mj_gemm_plan p;
  cr_assert_eq(mj_gemm_plan_make_for(s, which, path, rows, "sm_90a", &p), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_str_eq(p.entry, entry, "gemm%d, %lld rows", which, (long long)rows);
}

Test(gemm, wgmma_plan_matches_template_rules) {
  unsetenv("MOEJIT_GEMM_WGMMA_NARROW");
  moejit_spec s = make_spec(2048, 768, 128, MOEJIT_DTYPE_BF16, cfg(64, 256, 64, 4, 8, 0));
  mj_gemm_plan p;
  /* AUTO picks wgmma only on sm_90a with MOEJIT_GEMM_WGMMA=1 */
  setenv("MOEJIT_GEMM_WGMMA", "1", 1);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1000, "sm_90a", &p), MOEJIT_OK);
  cr_assert(p.use_wgmma && !p.use_mma);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1000, "sm_80", &p), MOEJIT_OK);
  cr_assert(!p.use_wgmma && p.use_mma);
  cr_assert_eq(mj_gemm_plan_make(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1000, &p), MOEJIT_OK);
  cr_assert(!p.use_wgmma, "no arch: AUTO stays on mma");
  setenv("MOEJIT_GEMM_WGMMA", "0", 1);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1000, "sm_90a", &p), MOEJIT_OK);
  cr_assert(!p.use_wgmma);
  unsetenv("MOEJIT_GEMM_WGMMA");
  /* the spec tile: 64 rows, one consumer warpgroup + the producer */
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, 1000, "sm_90a", &p), MOEJIT_OK);
  cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_wgmma");
  cr_assert_eq(p.threads, 256u);
  cr_assert_eq(p.n_tiles, 6);
  cr_assert_eq(p.m_slots, 1000 / 64 + 128);
  cr_assert_eq(p.grid, (unsigned)(p.m_slots * 6));
  cr_assert_eq(p.wg_stages, 4);
  cr_assert_eq(p.smem_bytes, 1024u + 4u * ((64 + 256) * 128 + 16) + 1552u);
  /* + table [129] and 258 group starts, 16-byte rounded */
  cr_assert_eq(p.wg_box_a_rows, 64);
  cr_assert_eq(p.wg_box_w_rows, 128); /* gate half, then up half */
  cr_assert_eq(p.w_rows, 128LL * 2 * 768);
  /* decode: an explicit WGMMA path keeps the spec's tile (tuned choices) */
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, 8, "sm_90a", &p), MOEJIT_OK);
  cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_wgmma");
  /* under AUTO (the GEMV path off), 8 rows would give 48 work items: the
   * narrow 64x128 tile, 8 stages */
  setenv("MOEJIT_GEMM_GEMV", "0", 1);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 8, "sm_90a", &p), MOEJIT_OK);
  cr_assert(p.use_wgmma);
  cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_wgmma_narrow");
  cr_assert_eq(p.n_tiles, 768 / 64);
  cr_assert_eq(p.wg_stages, 8);
  cr_assert_eq(p.smem_bytes, 1024u + 8u * ((64 + 128) * 128 + 16) + 1552u);
  cr_assert_eq(p.wg_box_w_rows, 64);
  cr_assert_str_eq(mj_gemm1_gather_entry(&p), "moejit_gemm1_swiglu_wgmma_narrow_gather");
  /* and while the experts hold 48 rows or fewer on average (128 experts:
   * 6144 rows), though the spec's tile would make enough work items */
  const moejit_gemm_path au = MOEJIT_GEMM_PATH_AUTO;
  plan_entry_is(&s, 1, au, 48 * 128, "moejit_gemm1_swiglu_wgmma_narrow");
  plan_entry_is(&s, 2, au, 48 * 128, "moejit_gemm2_wgmma_narrow");
  plan_entry_is(&s, 1, au, 48 * 128 + 1, "moejit_gemm1_swiglu_wgmma");
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, au, 48 * 128 + 1, "sm_90a", &p), MOEJIT_OK);
  cr_assert_eq(p.tile_m, 64);
  cr_assert_eq(p.tile_n, 256);
  cr_assert_str_eq(mj_gemm1_gather_entry(&p), "moejit_gemm1_swiglu_wgmma_gather");
  /* 8 wide experts: 896 work items of 128x256 at 9 rows (about one row an
   * expert), 1232 at 392 (49 rows an expert) */
  moejit_spec wide = make_spec(4096, 14336, 8, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  plan_entry_is(&wide, 1, au, 9, "moejit_gemm1_swiglu_wgmma_narrow");
  plan_entry_is(&wide, 1, au, 8 * 48, "moejit_gemm1_swiglu_wgmma_narrow");
  plan_entry_is(&wide, 1, au, 8 * 49, "moejit_gemm1_swiglu_wgmma");
  /* an explicit path keeps the spec's tile */
  plan_entry_is(&wide, 1, MOEJIT_GEMM_PATH_WGMMA, 9, "moejit_gemm1_swiglu_wgmma");
  /* other archs: mma.sync on the 64-row decode tile (GEMM 2's: 64x128) */
  cr_assert_eq(mj_gemm_plan_make_for(&s, 2, MOEJIT_GEMM_PATH_AUTO, 8, "sm_80", &p), MOEJIT_OK);
  cr_assert(p.use_mma && p.decode && !p.use_wgmma);
  cr_assert_eq(p.tile_m, 64);
  cr_assert_eq(p.tile_n, 128);
  /* cluster_m 2: pairs along M, each loading half of the weight tile */
  moejit_spec c = s;
  c.gemm2 = cfg(128, 256, 64, 4, 8, 0);
  c.gemm2.cluster_m = 2;
  cr_assert_eq(mj_gemm_plan_make_for(&c, 2, MOEJIT_GEMM_PATH_WGMMA, 100000, "sm_90a", &p), MOEJIT_OK);
  cr_assert_eq(p.wg_cluster, 2);
  cr_assert_eq(p.wg_box_w_rows, 128);
  cr_assert_eq(p.wg_cluster_n, 0);
  cr_assert_eq(p.wg_box_a_rows, 128);
  cr_assert_eq(mj_gemm_plan_make_for(&c, 2, MOEJIT_GEMM_PATH_AUTO, 8, "sm_90a", &p), MOEJIT_OK);
  cr_assert_eq(p.wg_cluster, 1, "the narrow decode tile runs without clusters");
  /* cluster_n 2: pairs along N, each loading half of the A tile (256-row
   * tiles: every other 64-row box) and all of its weight tile */
  c.gemm2.cluster_m = 1, c.gemm2.cluster_n = 2;
  cr_assert_eq(mj_gemm_plan_make_for(&c, 2, MOEJIT_GEMM_PATH_WGMMA, 100000, "sm_90a", &p),
               MOEJIT_OK);
  cr_assert_eq(p.wg_cluster, 2);
  cr_assert_eq(p.wg_cluster_n, 1);
  cr_assert_eq(p.wg_box_a_rows, 64);
  cr_assert_eq(p.wg_box_w_rows, 256);
  c.gemm2 = cfg(256, 128, 64, 4, 8, 0), c.gemm2.cluster_n = 2;
  cr_assert_eq(mj_gemm_plan_make_for(&c, 2, MOEJIT_GEMM_PATH_WGMMA, 100000, "sm_90a", &p),
               MOEJIT_OK);
  cr_assert_eq(p.wg_box_a_rows, 64);
  cr_assert_eq(p.wg_box_w_rows, 128);
  unsetenv("MOEJIT_GEMM_GEMV");
  /* 128-row tiles: two consumer warpgroups */
  s.gemm2 = cfg(128, 128, 64, 4, 8, 0);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 2, MOEJIT_GEMM_PATH_WGMMA, 100000, "sm_90a", &p), MOEJIT_OK);
  cr_assert_str_eq(p.entry, "moejit_gemm2_wgmma");
  cr_assert_eq(p.threads, 384u);
  cr_assert_eq(p.n_tiles, 2048 / 128);
  cr_assert_eq(p.wg_box_a_rows, 128);
  cr_assert_eq(p.wg_box_w_rows, 128);
  /* GEMM 2 adds each consumer warp's epilogue staging (16 rows of 144 bytes) */
  cr_assert_eq(p.wg_stages, 4);
  cr_assert_eq(p.smem_bytes, 1024u + 4u * ((128 + 128) * 128 + 16) + 8u * 16 * 144 + 1552u);
  /* tile_k 32 with 3 stages is 1.5 64-wide k-tiles: 2 stages */
  s.gemm2 = cfg(16, 64, 32, 3, 4, 0);
  setenv("MOEJIT_GEMM_WGMMA_NARROW", "0", 1);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 2, MOEJIT_GEMM_PATH_WGMMA, 100, "sm_90a", &p), MOEJIT_OK);
  cr_assert_eq(p.tile_m, 64);
  cr_assert_eq(p.wg_stages, 2);
  unsetenv("MOEJIT_GEMM_WGMMA_NARROW");
  /* refusals: wrong arch, fp32 */
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_WGMMA, 100, "sm_80", &p),
               MOEJIT_ERR_UNSUPPORTED);
  moejit_spec f = make_spec(264, 200, 5, MOEJIT_DTYPE_FP32, cfg(32, 64, 32, 2, 4, 0));
  cr_assert_eq(mj_gemm_plan_make_for(&f, 1, MOEJIT_GEMM_PATH_WGMMA, 100, "sm_90a", &p),
               MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "fp16 or bf16"), "%s", moejit_last_error());
  cr_assert_eq(mj_gemm_plan_make_for(&f, 1, MOEJIT_GEMM_PATH_AUTO, 100, "sm_90a", &p), MOEJIT_OK);
  cr_assert(!p.use_wgmma && !p.use_mma, "fp32 under AUTO: SIMT");
}

/* The GEMV decode plan: AUTO takes it at MOEJIT_GEMV_MAX_ROWS rows or fewer
 * on every arch, never above; an explicit path at any row count; refused
 * (explicit) or passed over (AUTO) for dtypes it cannot take. */
Test(gemm, gemv_plan) {
  unsetenv("MOEJIT_GEMM_GEMV");
  moejit_spec s = make_spec(2048, 768, 128, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  mj_gemm_plan p;
  const char *archs[] = {"sm_90a", "sm_80", NULL};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, MOEJIT_GEMV_MAX_ROWS, archs[i], &p),
                 MOEJIT_OK);
    cr_assert(p.use_gemv && !p.use_mma && !p.use_wgmma, "arch %s", archs[i] ? archs[i] : "none");
    cr_assert_str_eq(p.entry, "moejit_gemm1_swiglu_gemv");
    cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, MOEJIT_GEMV_MAX_ROWS + 1, archs[i], &p),
                 MOEJIT_OK);
    cr_assert(!p.use_gemv, "above MOEJIT_GEMV_MAX_ROWS rows AUTO streams tiles");
  }
  /* 8 rows reach at most 8 experts: 8 * 768/2 units, 8 warps a block */
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 8, "sm_90a", &p), MOEJIT_OK);
  cr_assert_eq(p.threads, MJ_GEMV_WARPS * 32u);
  cr_assert_eq(p.grid, (unsigned)((8 * 768 / MJ_GEMV1_COLS + MJ_GEMV_WARPS - 1) / MJ_GEMV_WARPS));
  cr_assert_eq(p.smem_bytes, 0u);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 2, MOEJIT_GEMM_PATH_GEMV, 100000, "sm_90a", &p), MOEJIT_OK);
  cr_assert(p.use_gemv);
  cr_assert_str_eq(p.entry, "moejit_gemm2_gemv");
  cr_assert_eq(p.grid, (unsigned)((128 * 2048 / MJ_GEMV2_COLS + MJ_GEMV_WARPS - 1) / MJ_GEMV_WARPS));
  setenv("MOEJIT_GEMM_GEMV", "0", 1);
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 1, "sm_90a", &p), MOEJIT_OK);
  cr_assert(!p.use_gemv, "MOEJIT_GEMM_GEMV=0 keeps AUTO off it");
  cr_assert_eq(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_GEMV, 1, "sm_90a", &p), MOEJIT_OK);
  cr_assert(p.use_gemv, "an explicit path still runs it");
  unsetenv("MOEJIT_GEMM_GEMV");
  moejit_spec f = make_spec(264, 200, 5, MOEJIT_DTYPE_FP32, cfg(32, 64, 32, 2, 4, 0));
  cr_assert_eq(mj_gemm_plan_make_for(&f, 2, MOEJIT_GEMM_PATH_GEMV, 4, "sm_90a", &p), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "GEMV"), "%s", moejit_last_error());
  cr_assert_eq(mj_gemm_plan_make_for(&f, 2, MOEJIT_GEMM_PATH_AUTO, 4, "sm_90a", &p), MOEJIT_OK);
  cr_assert(!p.use_gemv && !p.use_mma, "fp32 under AUTO: SIMT");
  cr_assert_str_eq(moejit_gemm_path_name(MOEJIT_GEMM_PATH_GEMV), "gemv");
}

/* Decode shapes on the GEMV path: one row on each of eight experts (T = 1,
 * k = 8), two and five rows (one pass, R = 2 and 8), nine and seventeen
 * rows (a second and third pass), an expert past the first 32 (the active
 * list's second ballot), a K that is not a multiple of 256 (the lanes' last
 * chunk), fp16. */
Test(gemm, gemv_decode_shapes) {
  moejit_ctx *ctx = ctx_or_skip();
  int32_t counts[40] = {0};
  for (int i = 0; i < 8; i++) counts[(i * 7 + 3) % 40] = 1;
  moejit_spec s = make_spec(2048, 768, 40, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  run_both(ctx, &s, counts, 0, MOEJIT_GEMM_PATH_AUTO);
  int32_t multi[40] = {0};
  multi[0] = 2, multi[5] = 5, multi[33] = 9, multi[39] = 17;
  moejit_spec r = make_spec(1032, 584, 40, MOEJIT_DTYPE_BF16, cfg(128, 256, 64, 4, 8, 0));
  run_both(ctx, &r, multi, 3, MOEJIT_GEMM_PATH_AUTO);
  moejit_spec h = make_spec(1032, 584, 40, MOEJIT_DTYPE_FP16, cfg(128, 256, 64, 4, 8, 0));
  run_both(ctx, &h, multi, 0, MOEJIT_GEMM_PATH_AUTO);
  moejit_ctx_destroy(ctx);
}
