/* moejit_bench_gemm: grouped expert GEMMs (gemm1 + SwiGLU, gemm2) of the
 * presets at several token counts with random uniform routing, timed with
 * CUDA events; each point against its floor max(FLOPs / 750 TFLOP/s,
 * bytes / 3.0 TB/s) (docs/gemm.md, DESIGN.md: the H100 figures). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moejit/gemm.h"
#include "moejit/moejit.h"

#define PEAK_FLOPS 750e12
#define PEAK_BYTES 3.0e12
#define CHUNK_BYTES ((size_t)64 << 20) /* random host data tiled over device buffers */
#define ROTATE_BYTES 100e6             /* 2x the H100 L2: inputs rotate until this much */
#define MAX_SETS 16
#define MAX_POINTS 64

typedef struct point {
  char preset[64]; /* a copy: callers pass names that live on their stack */
  const char *gemm;
  const char *path; /* "auto", "mma" or "wgmma" */
  int64_t tokens;
  double us, tflops, weight_tbs, floor_us;
} point;

static point g_points[MAX_POINTS];
/* Paths each point runs (--path): one row per path. */
static moejit_gemm_path g_paths[2] = {MOEJIT_GEMM_PATH_AUTO};
static int g_n_paths = 1;

static const char *path_name(moejit_gemm_path p) {
  return p == MOEJIT_GEMM_PATH_MMA ? "mma" : p == MOEJIT_GEMM_PATH_WGMMA ? "wgmma" : "auto";
}
static int g_n_points;
static void *g_chunk; /* CHUNK_BYTES of random bf16/fp16 values on the host */

#define CHECK(call)                                                                         \
  do {                                                                                      \
    moejit_status st_ = (call);                                                             \
    if (st_ != MOEJIT_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, moejit_last_error());  \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* Small values in [-1/32, 1/32) as bf16/fp16 bits: sums stay finite. */
static void make_chunk(moejit_dtype dt) {
  uint16_t *c = malloc(CHUNK_BYTES);
  if (!c) fprintf(stderr, "out of host memory\n"), exit(1);
  for (size_t i = 0; i < CHUNK_BYTES / 2; i++) {
    uint64_t r = rng_next();
    /* exponent 2^-6..2^-9, random mantissa and sign */
    if (dt == MOEJIT_DTYPE_BF16) c[i] = (uint16_t)(((r & 1) << 15) | ((118 + (r >> 1) % 4) << 7) | ((r >> 8) & 0x7f));
    else c[i] = (uint16_t)(((r & 1) << 15) | ((6 + (r >> 1) % 4) << 10) | ((r >> 8) & 0x3ff));
  }
  g_chunk = c;
}

static void *dev_random(moejit_ctx *ctx, size_t bytes) {
  void *d;
  CHECK(moejit_mem_alloc(ctx, bytes, NULL, &d));
  size_t first = bytes < CHUNK_BYTES ? bytes : CHUNK_BYTES;
  CHECK(moejit_memcpy_htod(ctx, d, g_chunk, first, NULL));
  for (size_t off = first; off < bytes; off += CHUNK_BYTES) {
    size_t n = bytes - off < CHUNK_BYTES ? bytes - off : CHUNK_BYTES;
    CHECK(moejit_memcpy_dtod(ctx, (char *)d + off, d, n, NULL));
  }
  return d;
}

/* Random uniform routing: each token picks top_k distinct experts. Writes
 * offsets [E+1]; returns the number of experts with rows. */
static int route_random(const moejit_spec *s, int64_t tokens, int32_t *offsets) {
  int32_t *counts = calloc((size_t)s->experts, sizeof *counts);
  int picked[64];
  for (int64_t t = 0; t < tokens; t++)
    for (int j = 0; j < s->top_k; j++) {
      int e, dup;
      do {
        e = (int)(rng_next() % (uint64_t)s->experts);
        dup = 0;
        for (int i = 0; i < j; i++) dup |= picked[i] == e;
      } while (dup);
      picked[j] = e;
      counts[e]++;
    }
  int active = 0;
  offsets[0] = 0;
  for (int e = 0; e < s->experts; e++) {
    offsets[e + 1] = offsets[e] + counts[e];
    active += counts[e] > 0;
  }
  free(counts);
  return active;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct io_set {
  void *x, *h, *y, *offsets;
  float *scale;
} io_set;

/* Median µs of `iters` back-to-back launches of one GEMM over the sets. */
static double time_gemm(moejit_ctx *ctx, const moejit_spec *s, int which, const void *w,
                        io_set *sets, int n_sets, int64_t rows, int iters, moejit_gemm_path path,
                        moejit_stream stream) {
  moejit_event ev[257];
  double ms[256];
  if (iters > 256) iters = 256;
  for (int i = 0; i <= iters; i++) CHECK(moejit_event_create(ctx, &ev[i]));
  for (int i = -3; i < iters; i++) { /* 3 warm-up launches, then timed ones */
    io_set *io = &sets[(i + 3) % n_sets];
    moejit_gemm_args a = {which == 1 ? io->x : io->h, w, which == 1 ? io->h : io->y, io->offsets,
                          which == 2 ? io->scale : NULL, rows, path};
    if (i == 0) CHECK(moejit_event_record(ctx, ev[0], stream));
    CHECK(which == 1 ? moejit_gemm1_swiglu(ctx, s, &a, stream) : moejit_gemm2(ctx, s, &a, stream));
    if (i >= 0) CHECK(moejit_event_record(ctx, ev[i + 1], stream));
  }
  CHECK(moejit_event_synchronize(ctx, ev[iters]));
  for (int i = 0; i < iters; i++) {
    float t;
    CHECK(moejit_event_elapsed_ms(ctx, ev[i], ev[i + 1], &t));
    ms[i] = t;
  }
  for (int i = 0; i <= iters; i++) moejit_event_destroy(ctx, ev[i]);
  qsort(ms, (size_t)iters, sizeof ms[0], cmp_double);
  return ms[iters / 2] * 1e3;
}

static void report(const char *preset, const char *gemm, moejit_gemm_path path, int64_t tokens,
                   double us, double flops, double weight_bytes, double bytes) {
  double floor_us = fmax(flops / PEAK_FLOPS, bytes / PEAK_BYTES) * 1e6;
  point p = {"", gemm, path_name(path), tokens, us, flops / (us * 1e-6) / 1e12,
             weight_bytes / (us * 1e-6) / 1e12, floor_us};
  snprintf(p.preset, sizeof p.preset, "%s", preset);
  printf("%-14s %-6s %-5s T=%-6lld %9.1f us  %7.1f TFLOP/s  %5.2f TB/s weights  floor %8.1f us  "
         "%5.1f%% of floor\n",
         preset, gemm, p.path, (long long)tokens, us, p.tflops, p.weight_tbs, floor_us,
         100 * floor_us / us);
  fflush(stdout);
  if (g_n_points < MAX_POINTS) g_points[g_n_points++] = p;
}

static void bench_point(moejit_ctx *ctx, const moejit_spec *s, const void *w1, const void *w2,
                        int64_t tokens, int iters, moejit_stream stream) {
  int64_t rows = tokens * s->top_k, d = s->hidden, f = s->expert_width;
  size_t esz = moejit_dtype_size(s->act_dtype), wsz = moejit_dtype_size(s->weight_dtype);
  int32_t *off = malloc(sizeof(int32_t) * ((size_t)s->experts + 1));
  io_set sets[MAX_SETS];
  double active = 0;
  int n_sets = 0;
  double touched = 0;
  do { /* rotate routings and buffers until one pass touches ROTATE_BYTES */
    io_set *io = &sets[n_sets++];
    int act = route_random(s, tokens, off);
    active += act;
    io->x = dev_random(ctx, (size_t)(rows * d) * esz);
    io->h = dev_random(ctx, (size_t)(rows * f) * esz);
    io->y = dev_random(ctx, (size_t)(rows * d) * esz);
    CHECK(moejit_mem_alloc(ctx, sizeof(int32_t) * ((size_t)s->experts + 1), NULL, &io->offsets));
    CHECK(moejit_memcpy_htod(ctx, io->offsets, off, sizeof(int32_t) * ((size_t)s->experts + 1), NULL));
    float *sc = malloc(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) sc[i] = 1.0f / (float)s->top_k;
    CHECK(moejit_mem_alloc(ctx, sizeof(float) * (size_t)rows, NULL, (void **)&io->scale));
    CHECK(moejit_memcpy_htod(ctx, io->scale, sc, sizeof(float) * (size_t)rows, NULL));
    free(sc);
    touched += (double)act * 3 * (double)(f * d) * (double)wsz + (double)(rows * (2 * d + 2 * f)) * (double)esz;
  } while (touched < ROTATE_BYTES && n_sets < MAX_SETS);
  active /= n_sets;
  CHECK(moejit_ctx_synchronize(ctx));
  double m = (double)rows;
  double wb1 = active * 2 * (double)(f * d) * (double)wsz;
  double wb2 = active * (double)(f * d) * (double)wsz;
  for (int i = 0; i < g_n_paths; i++) {
    double us1 = time_gemm(ctx, s, 1, w1, sets, n_sets, rows, iters, g_paths[i], stream);
    report(s->name, "gemm1", g_paths[i], tokens, us1, 2 * m * 2 * (double)f * (double)d, wb1,
           wb1 + m * (double)(d + f) * (double)esz);
  }
  for (int i = 0; i < g_n_paths; i++) {
    double us2 = time_gemm(ctx, s, 2, w2, sets, n_sets, rows, iters, g_paths[i], stream);
    report(s->name, "gemm2", g_paths[i], tokens, us2, 2 * m * (double)d * (double)f, wb2,
           wb2 + m * (double)(d + f) * (double)esz);
  }
  for (int i = 0; i < n_sets; i++) {
    moejit_mem_free(ctx, sets[i].x, NULL), moejit_mem_free(ctx, sets[i].h, NULL);
    moejit_mem_free(ctx, sets[i].y, NULL), moejit_mem_free(ctx, sets[i].offsets, NULL);
    moejit_mem_free(ctx, sets[i].scale, NULL);
  }
  free(off);
}

/* --gemm1 / --gemm2 "M,N,K,STAGES,WARPS": tile overrides for every preset
 * (tile sweeps); tile_m 0 = keep the preset's. */
static moejit_gemm_cfg g_override[2];

/* M,N,K,STAGES,WARPS[,RASTER[,CLUSTER_M[,SCHEDULE]]] (raster 0: along M, 1:
 * along N, -1 keeps the spec's; cluster_m 1 or 2, 0 keeps the spec's;
 * schedule 0 cooperative, 1 pingpong, -1 keeps the spec's) */
static int g_raster[2] = {-1, -1}, g_cluster[2] = {0, 0}, g_schedule[2] = {-1, -1};

static int parse_tile(const char *text, moejit_gemm_cfg *g, int *raster, int *cluster,
                      int *schedule) {
  int n = sscanf(text, "%d,%d,%d,%d,%d,%d,%d,%d", &g->tile_m, &g->tile_n, &g->tile_k, &g->stages,
                 &g->warps, raster, cluster, schedule);
  return n >= 5 && n <= 8 && *raster >= -1 && *raster <= 1 && *cluster >= 0 && *cluster <= 2 &&
         *schedule >= -1 && *schedule <= 1;
}

static void apply_override(moejit_gemm_cfg *dst, const moejit_gemm_cfg *o, int raster,
                           int cluster, int schedule) {
  if (raster >= 0) dst->raster = (moejit_raster)raster;
  if (cluster > 0) dst->cluster_m = cluster;
  if (schedule >= 0) dst->schedule = (moejit_gemm_schedule)schedule;
  if (!o->tile_m) return;
  dst->tile_m = o->tile_m, dst->tile_n = o->tile_n, dst->tile_k = o->tile_k;
  dst->stages = o->stages, dst->warps = o->warps;
}

static void bench_preset(moejit_ctx *ctx, const char *name, const int64_t *tokens, int n_tokens,
                         int iters, moejit_stream stream) {
  moejit_spec s;
  CHECK(moejit_spec_load_preset(name, &s));
  apply_override(&s.gemm1, &g_override[0], g_raster[0], g_cluster[0], g_schedule[0]);
  apply_override(&s.gemm2, &g_override[1], g_raster[1], g_cluster[1], g_schedule[1]);
  if (moejit_spec_validate(&s) != MOEJIT_OK) {
    printf("# %s: tile override rejected: %s\n", name, moejit_last_error());
    return;
  }
  size_t wsz = moejit_dtype_size(s.weight_dtype);
  size_t w1_bytes = (size_t)s.experts * 2 * (size_t)s.expert_width * (size_t)s.hidden * wsz;
  size_t w2_bytes = (size_t)s.experts * (size_t)s.hidden * (size_t)s.expert_width * wsz;
  printf("# %s: d=%lld f=%lld E=%d k=%d, gemm1 %dx%dx%d/%d st/%d w, gemm2 %dx%dx%d/%d st/%d w, "
         "weights %.2f GB\n",
         name, (long long)s.hidden, (long long)s.expert_width, s.experts, s.top_k, s.gemm1.tile_m,
         s.gemm1.tile_n, s.gemm1.tile_k, s.gemm1.stages, s.gemm1.warps, s.gemm2.tile_m,
         s.gemm2.tile_n, s.gemm2.tile_k, s.gemm2.stages, s.gemm2.warps,
         (double)(w1_bytes + w2_bytes) / 1e9);
  void *w1 = dev_random(ctx, w1_bytes), *w2 = dev_random(ctx, w2_bytes);
  for (int i = 0; i < n_tokens; i++) bench_point(ctx, &s, w1, w2, tokens[i], iters, stream);
  CHECK(moejit_ctx_synchronize(ctx));
  moejit_mem_free(ctx, w1, NULL), moejit_mem_free(ctx, w2, NULL);
}

static void print_table(void) {
  printf("\n%-14s %-6s %-5s %7s %10s %9s %9s %10s %8s\n", "preset", "gemm", "path", "T",
         "time us", "TFLOP/s", "W TB/s", "floor us", "% floor");
  for (int i = 0; i < g_n_points; i++) {
    const point *p = &g_points[i];
    printf("%-14s %-6s %-5s %7lld %10.1f %9.1f %9.2f %10.1f %7.1f%%\n", p->preset, p->gemm,
           p->path, (long long)p->tokens, p->us, p->tflops, p->weight_tbs, p->floor_us,
           100 * p->floor_us / p->us);
  }
}

/* --path: "auto", "mma", "wgmma" or "both" (mma then wgmma). */
static int parse_paths(const char *v) {
  if (!strcmp(v, "both")) {
    g_paths[0] = MOEJIT_GEMM_PATH_MMA, g_paths[1] = MOEJIT_GEMM_PATH_WGMMA, g_n_paths = 2;
    return 1;
  }
  g_n_paths = 1;
  if (!strcmp(v, "auto")) g_paths[0] = MOEJIT_GEMM_PATH_AUTO;
  else if (!strcmp(v, "mma")) g_paths[0] = MOEJIT_GEMM_PATH_MMA;
  else if (!strcmp(v, "wgmma")) g_paths[0] = MOEJIT_GEMM_PATH_WGMMA;
  else return 0;
  return 1;
}

/* ---- --smoke: one 64x64x64 tile per GEMM and path, against the CPU ---- */

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; inputs are finite */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* One expert, 64 rows: gemm2 y[64,64] = a[64,64] W2[64,64]^T (one tile);
 * gemm1 h[64,32] from W1[64,64] (32 gate + 32 up rows: one 64-B-row tile).
 * Prints the max abs error, and on failure the first mismatches and a map
 * of which 8x8 blocks of the output are wrong (descriptor / swizzle bugs
 * show as patterns). Returns 1 on a mismatch, 0 otherwise (or skipped). */
static int smoke_one(moejit_ctx *ctx, int which, moejit_gemm_path path) {
  enum { M = 64, K = 64 };
  const int n = which == 1 ? 32 : 64, w_rows = 64;
  moejit_spec s;
  CHECK(moejit_spec_load_preset("qwen3-30b-a3b", &s));
  s.hidden = 64, s.expert_width = which == 1 ? 32 : 64, s.experts = 1, s.top_k = 1;
  s.act_dtype = s.weight_dtype = s.out_dtype = MOEJIT_DTYPE_BF16;
  s.gemm1 = s.gemm2 = (moejit_gemm_cfg){64, 64, 64, 4, 8, 1, 1, (moejit_raster)0, MOEJIT_SCHEDULE_COOPERATIVE};
  CHECK(moejit_spec_validate(&s));
  uint16_t a[M * K], w[64 * K], out[M * 64];
  double ref[M * 64], max_ref = 0, max_err = 0;
  for (int i = 0; i < M * K; i++) a[i] = f32_to_bf16((float)((rng_next() >> 11) * 0x1p-53 * 2 - 1));
  for (int i = 0; i < w_rows * K; i++)
    w[i] = f32_to_bf16((float)((rng_next() >> 11) * 0x1p-53 * 0.5 - 0.25));
  for (int r = 0; r < M; r++)
    for (int c = 0; c < n; c++) {
      double g = 0, u = 0;
      for (int k = 0; k < K; k++) {
        g += (double)bf16_to_f32(a[r * K + k]) * bf16_to_f32(w[c * K + k]);
        if (which == 1) u += (double)bf16_to_f32(a[r * K + k]) * bf16_to_f32(w[(n + c) * K + k]);
      }
      ref[r * n + c] = which == 1 ? g / (1 + exp(-g)) * u : g;
      max_ref = fmax(max_ref, fabs(ref[r * n + c]));
    }
  int32_t off[2] = {0, M};
  void *da, *dw, *dout, *doff;
  CHECK(moejit_mem_alloc(ctx, sizeof a, NULL, &da));
  CHECK(moejit_mem_alloc(ctx, sizeof w, NULL, &dw));
  CHECK(moejit_mem_alloc(ctx, sizeof out, NULL, &dout));
  CHECK(moejit_mem_alloc(ctx, sizeof off, NULL, &doff));
  CHECK(moejit_memcpy_htod(ctx, da, a, sizeof a, NULL));
  CHECK(moejit_memcpy_htod(ctx, dw, w, sizeof w, NULL));
  CHECK(moejit_memcpy_htod(ctx, doff, off, sizeof off, NULL));
  CHECK(moejit_memset_d32(ctx, dout, 0xffffffffu, sizeof out / 4, NULL));
  moejit_gemm_args args = {da, dw, dout, doff, NULL, M, path};
  moejit_status st = which == 1 ? moejit_gemm1_swiglu(ctx, &s, &args, NULL) : moejit_gemm2(ctx, &s, &args, NULL);
  int bad = 0;
  if (st == MOEJIT_ERR_UNSUPPORTED) {
    printf("smoke gemm%d %-5s: skipped: %s\n", which, path_name(path), moejit_last_error());
  } else {
    if (st == MOEJIT_OK) st = moejit_memcpy_dtoh(ctx, out, dout, sizeof out, NULL);
    if (st == MOEJIT_OK) st = moejit_ctx_synchronize(ctx);
    if (st != MOEJIT_OK) {
      printf("smoke gemm%d %-5s: FAILED to run: %s\n", which, path_name(path), moejit_last_error());
      bad = 1;
    }
  }
  if (st == MOEJIT_OK) {
    const double tol = 2e-2 * fmax(1.0, max_ref);
    char map[8][9];
    memset(map, '.', sizeof map);
    for (int r = 0; r < 8; r++) map[r][8] = '\0';
    int shown = 0;
    for (int r = 0; r < M; r++)
      for (int c = 0; c < n; c++) {
        double got = bf16_to_f32(out[r * n + c]), err = fabs(got - ref[r * n + c]);
        if (!(err <= tol)) { /* NaN (poison left unwritten) counts */
          bad = 1, map[r / 8][c / 8] = 'X';
          if (shown++ < 8)
            printf("  gemm%d %s: row %2d col %2d: got %10.5f want %10.5f\n", which, path_name(path), r, c, got,
                   ref[r * n + c]);
        }
        max_err = isnan(got) ? INFINITY : fmax(max_err, err);
      }
    printf("smoke gemm%d %-5s: max abs error %.3g (max |ref| %.3g, tolerance %.3g): %s\n", which,
           path_name(path), max_err, max_ref, tol, bad ? "MISMATCH" : "ok");
    if (bad) {
      printf("  wrong 8x8 blocks (rows down, cols across):\n");
      for (int r = 0; r < 8; r++) printf("    %.*s\n", n / 8, map[r]);
    }
  }
  moejit_mem_free(ctx, da, NULL), moejit_mem_free(ctx, dw, NULL);
  moejit_mem_free(ctx, dout, NULL), moejit_mem_free(ctx, doff, NULL);
  return bad;
}

static int smoke_test(void) {
  moejit_ctx *ctx;
  CHECK(moejit_ctx_create(&ctx, NULL));
  moejit_device_info info;
  CHECK(moejit_ctx_device_info(ctx, &info));
  printf("# device: %s (%s, %d SMs)\n", info.name, info.arch, info.sm_count);
  int bad = 0;
  const moejit_gemm_path paths[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA};
  for (int which = 2; which >= 1; which--)
    for (int p = 0; p < 2; p++) bad |= smoke_one(ctx, which, paths[p]);
  moejit_ctx_destroy(ctx);
  return bad;
}

int main(int argc, char **argv) {
  const char *presets[8] = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
  int n_presets = 3, n_tokens = 5, iters = 30, custom = 0, smoke = 0;
  int64_t tokens[16] = {1, 32, 256, 2048, 16384};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
      if (!custom) n_presets = 0, custom = 1; /* named presets replace the default list */
      if (n_presets < 8) presets[n_presets++] = argv[++i];
    } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      n_tokens = 0;
      for (char *t = strtok(argv[++i], ","); t && n_tokens < 16; t = strtok(NULL, ","))
        tokens[n_tokens++] = atoll(t);
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--path") && i + 1 < argc && parse_paths(argv[i + 1])) {
      i++;
    } else if ((!strcmp(argv[i], "--gemm1") || !strcmp(argv[i], "--gemm2")) && i + 1 < argc &&
               parse_tile(argv[i + 1], &g_override[argv[i][6] - '1'], &g_raster[argv[i][6] - '1'],
                          &g_cluster[argv[i][6] - '1'], &g_schedule[argv[i][6] - '1'])) {
      i++;
    } else if (!strcmp(argv[i], "--smoke")) {
      smoke = 1;
    } else {
      printf("usage: moejit_bench_gemm [--preset NAME]... [--tokens 1,32,...] [--iters N (>= 20)]\n"
             "                         [--path auto|mma|wgmma|both] [--smoke]\n"
             "                         [--gemm1 M,N,K,STAGES,WARPS[,RASTER[,CLUSTER_M[,SCHEDULE]]]] [--gemm2 ...]\n"
             "Times gemm1 (+SwiGLU) and gemm2 of each preset (default: mixtral-8x7b,\n"
             "qwen3-30b-a3b, deepseek-v3) at T tokens with random uniform top-k routing:\n"
             "median of N launches after 3 warm-ups, against the floor\n"
             "max(FLOPs / 750 TFLOP/s, bytes / 3.0 TB/s), bytes = active experts' weights + A + C.\n"
             "--path both prints an mma row and a wgmma row per point (wgmma needs sm_90a).\n"
             "--smoke runs one 64x64x64 tile of each GEMM on each path against a CPU\n"
             "reference and prints the max abs error and the first mismatches (exit 1 on any).\n");
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  if (smoke) return smoke_test();
  if (iters < 20) iters = 20;
  moejit_ctx *ctx;
  CHECK(moejit_ctx_create(&ctx, NULL));
  moejit_device_info info;
  CHECK(moejit_ctx_device_info(ctx, &info));
  printf("# device: %s (%s, %d SMs)\n", info.name, info.arch, info.sm_count);
  moejit_stream stream;
  CHECK(moejit_stream_create(ctx, &stream));
  make_chunk(MOEJIT_DTYPE_BF16);
  for (int i = 0; i < n_presets; i++) bench_preset(ctx, presets[i], tokens, n_tokens, iters, stream);
  print_table();
  moejit_stream_destroy(ctx, stream);
  moejit_ctx_destroy(ctx);
  free(g_chunk);
  return 0;
}
