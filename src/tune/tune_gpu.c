/* The autotuner's backends: the GPU one (inputs tiled from a host pattern,
 * rotated across sets so timings are not L2-warm, a check of sampled rows
 * against the float64 reference, then warm-up and CUDA-event timing, the
 * median of N; GEMM 1 as the layer runs it, gathering x's rows or charged
 * the permuted copy) and the compile-only one (no GPU: cache warming). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "config/config.h"
#include "ops/ops.h"
#include "tune/tune.h"

#define MJ_TUNE_CHUNK_ELEMS ((size_t)8 << 20) /* 16 MB pattern period */
#define MJ_TUNE_MAX_SETS 8
#define MJ_TUNE_MAX_ITERS 1000
#define MJ_TUNE_COPY_TIMINGS 5 /* memsets timed for the permuted copy's charge */

typedef struct io_set {
  void *a, *out, *w; /* w: this set's copy, or NULL (the shared weights) */
  void *offsets;
} io_set;

typedef struct gpu {
  moejit_ctx *ctx;
  moejit_stream stream;
  char arch[MOEJIT_ARCH_MAX];
  mj_tune_data *data;
  int w_shape, w_which; /* whose weights `w` holds; -1: none */
  void *w;
  size_t w_bytes, w_offset;
  io_set sets[MJ_TUNE_MAX_SETS];
  int n_sets;
  size_t a_offset; /* pattern offset of set 0's A */
  int n_check;
  int64_t check_rows[MJ_TUNE_MAX_CHECK_ROWS];
  double *ref;
  uint16_t *got;
  int64_t k, n_out; /* of the open group */
  moejit_event ev[MJ_TUNE_MAX_ITERS + 1];
  int n_ev;
  uint32_t *round_sync; /* GEMM 1's rounds-in-step words, as the layer passes them */
  void *split;          /* GEMM 2's K-split scratch, as the layer passes it; zeroed once */
  size_t split_bytes;
  /* GEMM 1 as the layer runs it (docs/tune.md): A repeats every `period`
   * (= T) rows, so its first T rows are x. A candidate whose plan the layer
   * gathers with (mj_gemm1_plan_gathers) reads x through `index` [rows],
   * align's sorted_slot for set 0's routing (mj_tune_sorted_slots): each
   * expert's rows read x scattered as routing scatters them, A row r the x
   * row x_row[r], checked against ref_gather, the reference of those rows.
   * The others read A and are charged copy_us, the time to write A
   * (align's permuted copy). */
  int64_t period; /* 0: GEMM 2 */
  void *index;
  int32_t *x_row;     /* host [rows] */
  double *ref_gather; /* computed for the group's first gathering candidate */
  double copy_us;
  int gathers; /* the candidate being measured gathers */
} gpu;

/* ---- inputs --------------------------------------------------------------------- */

/* dst[i] = chunk[(offset + i) % C] for n elements: the first period from the
 * host, the rest by device copies of it. */
static moejit_status fill_pattern(gpu *g, void *dst, size_t n, size_t offset) {
  const mj_tune_data *d = g->data;
  size_t first = n < d->n ? n : d->n, head = d->n - offset < first ? d->n - offset : first;
  moejit_status st = moejit_memcpy_htod(g->ctx, dst, d->chunk + offset, head * 2, g->stream);
  if (!st && first > head)
    st =
        moejit_memcpy_htod(g->ctx, (char *)dst + head * 2, d->chunk, (first - head) * 2, g->stream);
  for (size_t off = d->n; !st && off < n; off += d->n)
    st = moejit_memcpy_dtod(g->ctx, (char *)dst + off * 2, dst,
                            (n - off < d->n ? n - off : d->n) * 2, g->stream);
  return st;
}

static void free_ptr(gpu *g, void **p) {
  if (*p) moejit_mem_free(g->ctx, *p, g->stream);
  *p = NULL;
}

static void free_sets(gpu *g) {
  for (int i = 0; i < g->n_sets; i++) {
    free_ptr(g, &g->sets[i].a), free_ptr(g, &g->sets[i].out);
    free_ptr(g, &g->sets[i].w), free_ptr(g, &g->sets[i].offsets);
  }
  free_ptr(g, &g->index);
  g->n_sets = 0, g->period = 0, g->copy_us = 0, g->gathers = 0;
  free(g->ref), free(g->got), free(g->x_row), free(g->ref_gather);
  g->ref = NULL, g->got = NULL, g->x_row = NULL, g->ref_gather = NULL;
}

static void free_weights(gpu *g) {
  free_ptr(g, &g->w);
  g->w_shape = g->w_which = -1;
}

/* The weights of the group's (shape, kernel), with the pattern they came
 * from; kept across token counts. */
static moejit_status load_weights(gpu *g, const mj_tune_group *grp) {
  if (g->w && g->w_shape == grp->shape && g->w_which == grp->which) return MOEJIT_OK;
  free_weights(g);
  const moejit_spec *s = grp->base;
  int64_t k = grp->which == 1 ? s->hidden : s->expert_width;
  int64_t rows = grp->which == 1 ? 2 * s->expert_width : s->hidden;
  uint64_t seed = mj_tune_mix(grp->sweep->seed, (uint64_t)(grp->shape * 2 + grp->which));
  mj_tune_data_free(g->data);
  moejit_status st = mj_tune_data_make(g->data, s->weight_dtype, k, MJ_TUNE_CHUNK_ELEMS, seed);
  if (st) return st;
  g->w_bytes = (size_t)s->experts * (size_t)rows * (size_t)k * 2;
  g->w_offset = (size_t)(mj_tune_mix(seed, 1) % g->data->n);
  if ((st = moejit_mem_alloc(g->ctx, g->w_bytes, g->stream, &g->w))) return st;
  if ((st = fill_pattern(g, g->w, g->w_bytes / 2, g->w_offset))) return st;
  g->w_shape = grp->shape, g->w_which = grp->which;
  return MOEJIT_OK;
}

static moejit_status upload_routing(gpu *g, const mj_tune_group *grp, int set, void **dst) {
  size_t bytes = ((size_t)grp->base->experts + 1) * sizeof(int32_t);
  int32_t *off = malloc(bytes);
  if (!off) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory routing tokens");
  if (set == 0)
    memcpy(off, grp->offsets, bytes);
  else
    mj_tune_route(grp->base->experts, grp->base->top_k, grp->tokens,
                  mj_tune_mix(grp->seed, (uint64_t)set), off, NULL);
  moejit_status st = moejit_mem_alloc(g->ctx, bytes, g->stream, dst);
  if (!st) st = moejit_memcpy_htod(g->ctx, *dst, off, bytes, g->stream);
  free(off);
  return st;
}

/* Enough sets that one pass over them touches rotate_bytes (L2 is 50 MB on
 * an H100): other routings over shared weights when the weights are large,
 * else a copy of the weights per set too. */
static int set_count(const gpu *g, const mj_tune_group *grp, size_t a_bytes, size_t out_bytes) {
  double w_active = (double)g->w_bytes * grp->active_experts / grp->base->experts;
  double touched = w_active + (double)(a_bytes + out_bytes);
  int n = (int)ceil(grp->rotate_bytes / touched);
  return n < 1 ? 1 : n > MJ_TUNE_MAX_SETS ? MJ_TUNE_MAX_SETS : n;
}

/* A of set i from the pattern at a_offset: with a period (GEMM 1), its
 * first `period` rows, then copies of them down to the last row. */
static moejit_status fill_a(gpu *g, void *a, size_t a_bytes, size_t a_offset) {
  if (!g->period) return fill_pattern(g, a, a_bytes / 2, a_offset);
  const size_t row_bytes = (size_t)g->k * 2, x_bytes = (size_t)g->period * row_bytes;
  moejit_status st = fill_pattern(g, a, x_bytes / 2, a_offset);
  for (size_t off = x_bytes; !st && off < a_bytes; off += x_bytes)
    st = moejit_memcpy_dtod(g->ctx, (char *)a + off, a,
                            a_bytes - off < x_bytes ? a_bytes - off : x_bytes, g->stream);
  return st;
}

static moejit_status make_set(gpu *g, const mj_tune_group *grp, int i, size_t a_bytes,
                              size_t out_bytes) {
  io_set *s = &g->sets[i];
  size_t a_offset =
      i == 0 ? g->a_offset : (size_t)(mj_tune_mix(grp->seed, 100 + (uint64_t)i) % g->data->n);
  moejit_status st = moejit_mem_alloc(g->ctx, a_bytes, g->stream, &s->a);
  if (!st) st = fill_a(g, s->a, a_bytes, a_offset);
  if (!st) st = moejit_mem_alloc(g->ctx, out_bytes, g->stream, &s->out);
  if (!st) st = upload_routing(g, grp, i, &s->offsets);
  if (!st && i > 0 && (double)g->w_bytes < grp->rotate_bytes &&
      !(st = moejit_mem_alloc(g->ctx, g->w_bytes, g->stream, &s->w)))
    st = moejit_memcpy_dtod(g->ctx, s->w, g->w, g->w_bytes, g->stream);
  return st;
}

static moejit_status events(gpu *g, int n) {
  for (; g->n_ev < n; g->n_ev++) {
    moejit_status st = moejit_event_create(g->ctx, &g->ev[g->n_ev]);
    if (st) return st;
  }
  return MOEJIT_OK;
}

/* GEMM 1's gather index (gpu.index): align's sorted_slot for set 0's
 * routing; x_row[r] = its slot / k, the x row that A row r reads. */
static moejit_status upload_index(gpu *g, const mj_tune_group *grp) {
  const int64_t rows = grp->rows, k = grp->base->top_k;
  if (!grp->choice)
    return mj_fail(
        MOEJIT_ERR_INVALID_ARGUMENT,
        "moejit tune: a GEMM 1 group without its routing's picks (mj_tune_group.choice)");
  int32_t *idx = malloc((size_t)rows * sizeof *idx + 1);
  g->x_row = malloc((size_t)rows * sizeof *g->x_row + 1);
  moejit_status st = MOEJIT_OK;
  if (!idx || !g->x_row ||
      mj_tune_sorted_slots(grp->choice, grp->offsets, grp->base->experts, rows, idx))
    st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory for the gather index");
  for (int64_t r = 0; !st && r < rows; r++) g->x_row[r] = (int32_t)(idx[r] / k);
  if (!st) st = moejit_mem_alloc(g->ctx, (size_t)rows * sizeof *idx, g->stream, &g->index);
  if (!st) st = moejit_memcpy_htod(g->ctx, g->index, idx, (size_t)rows * sizeof *idx, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream); /* idx is freed next */
  free(idx);
  return st;
}

/* The charge of GEMM 1's permuted copy: the median time to write A's bytes
 * (memsets over set 0's A, which is filled again after), which is what
 * align's scatter spends (it reads x's rows from L2). None where the layer
 * is the two-launch decode one (at most MOEJIT_GEMV_PASS_ROWS rows), which
 * neither copies nor gathers. */
static moejit_status time_copy(gpu *g, const mj_tune_group *grp, size_t a_bytes) {
  g->copy_us = 0;
  if (grp->rows <= MOEJIT_GEMV_PASS_ROWS) return MOEJIT_OK;
  double us[MJ_TUNE_COPY_TIMINGS];
  moejit_status st = events(g, MJ_TUNE_COPY_TIMINGS + 1);
  if (!st) st = moejit_event_record(g->ctx, g->ev[0], g->stream);
  for (int i = 0; i < MJ_TUNE_COPY_TIMINGS && !st; i++) {
    st = moejit_memset_d32(g->ctx, g->sets[0].a, 0x3f803f80u, a_bytes / 4, g->stream);
    if (!st) st = moejit_event_record(g->ctx, g->ev[i + 1], g->stream);
  }
  if (!st) st = moejit_event_synchronize(g->ctx, g->ev[MJ_TUNE_COPY_TIMINGS]);
  for (int i = 0; i < MJ_TUNE_COPY_TIMINGS && !st; i++) {
    float ms;
    st = moejit_event_elapsed_ms(g->ctx, g->ev[i], g->ev[i + 1], &ms);
    us[i] = ms * 1e3;
  }
  if (st) return st;
  g->copy_us = mj_tune_median(us, MJ_TUNE_COPY_TIMINGS);
  return fill_a(g, g->sets[0].a, a_bytes, g->a_offset);
}

static moejit_status gpu_open(void *state, const mj_tune_group *grp) {
  gpu *g = state;
  const moejit_spec *s = grp->base;
  moejit_status st = load_weights(g, grp);
  if (!st && !g->round_sync &&
      !(st = moejit_mem_alloc(g->ctx, 8, g->stream, (void **)&g->round_sync)))
    st = moejit_memset_d32(g->ctx, g->round_sync, 0, 2, g->stream);
  if (!st && !g->split) { /* as large as any tile of this device asks */
    g->split_bytes = MOEJIT_GEMM2_SPLIT_MAX_BYTES(mj_ctx_sm_count(g->ctx));
    if (!(st = moejit_mem_alloc(g->ctx, g->split_bytes, g->stream, &g->split)))
      st = moejit_memset_d32(g->ctx, g->split, 0, g->split_bytes / 4, g->stream);
  }
  if (st) return st;
  g->k = grp->which == 1 ? s->hidden : s->expert_width;
  g->n_out = grp->which == 1 ? s->expert_width : s->hidden;
  size_t a_bytes = (size_t)(grp->rows * g->k) * 2, out_bytes = (size_t)(grp->rows * g->n_out) * 2;
  g->a_offset = (size_t)(mj_tune_mix(grp->seed, 99) % g->data->n);
  g->period = grp->which == 1 ? grp->tokens : 0;
  int n = set_count(g, grp, a_bytes, out_bytes);
  for (int i = 0; i < n && !st; i++, g->n_sets++) st = make_set(g, grp, i, a_bytes, out_bytes);
  if (!st && g->period) st = upload_index(g, grp);
  if (!st && g->period) st = time_copy(g, grp, a_bytes);
  g->n_check =
      mj_tune_check_rows(grp->offsets, s->experts, grp->check_rows, grp->seed, g->check_rows);
  g->ref = malloc((size_t)g->n_check * (size_t)g->n_out * sizeof *g->ref + 1);
  g->got = malloc((size_t)g->n_check * (size_t)g->n_out * 2 + 1);
  if (!st && (!g->ref || !g->got))
    st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory for the check");
  if (!st) {
    mj_tune_reference(g->data, s, grp->which, grp->offsets, g->check_rows, g->n_check, g->a_offset,
                      g->period, NULL, g->w_offset, grp->jobs, g->ref);
    st = moejit_stream_synchronize(g->ctx, g->stream);
  }
  if (st) free_sets(g);
  return st;
}

static void gpu_close(void *state, const mj_tune_group *grp) {
  gpu *g = state;
  free_sets(g);
  moejit_stream_synchronize(g->ctx, g->stream);
}

/* ---- one candidate --------------------------------------------------------------- */

static moejit_status launch(gpu *g, const mj_tune_group *grp, const moejit_spec *spec,
                            moejit_gemm_path path, int set) {
  const io_set *s = &g->sets[set];
  moejit_gemm_args a = {.a = s->a,
                        .w = s->w ? s->w : g->w,
                        .out = s->out,
                        .expert_offsets = s->offsets,
                        .max_rows = grp->rows,
                        .path = path,
                        .round_sync = grp->which == 1 ? g->round_sync : NULL,
                        .split = grp->which == 2 ? g->split : NULL,
                        .split_bytes = grp->which == 2 ? g->split_bytes : 0};
  if (g->gathers) /* x is A's first T rows (gpu.index) */
    a.a_index = g->index, a.a_index_div = grp->base->top_k, a.a_rows = g->period;
  return grp->which == 1 ? moejit_gemm1_swiglu(g->ctx, spec, &a, g->stream)
                         : moejit_gemm2(g->ctx, spec, &a, g->stream);
}

/* One launch on poisoned output (NaN bits), the sampled rows read back and
 * compared with the reference. */
static moejit_status check(gpu *g, const mj_tune_group *grp, const moejit_spec *spec,
                           moejit_gemm_path path, double *rel_err) {
  size_t row_bytes = (size_t)g->n_out * 2;
  moejit_status st = moejit_memset_d32(g->ctx, g->sets[0].out, 0xffffffffu,
                                       (size_t)grp->rows * row_bytes / 4, g->stream);
  if (!st) st = launch(g, grp, spec, path, 0);
  for (int i = 0; i < g->n_check && !st; i++)
    st = moejit_memcpy_dtoh(g->ctx, g->got + (size_t)i * (size_t)g->n_out,
                            (const char *)g->sets[0].out + (size_t)g->check_rows[i] * row_bytes,
                            row_bytes, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream);
  if (!st)
    *rel_err = mj_tune_rel_error(g->data, g->got, g->gathers ? g->ref_gather : g->ref,
                                 (size_t)g->n_check * (size_t)g->n_out);
  return st;
}

/* Warm-up launches, timed as a whole to size the run: at most
 * max_point_ms of timed launches, never fewer than min_iters. */
static moejit_status warm_up(gpu *g, const mj_tune_group *grp, const moejit_spec *spec,
                             moejit_gemm_path path, int *iters) {
  int warm = grp->warmup > 0 ? grp->warmup : 1;
  float ms = 0;
  moejit_status st = moejit_event_record(g->ctx, g->ev[0], g->stream);
  for (int i = 0; i < warm && !st; i++) st = launch(g, grp, spec, path, (i + 1) % g->n_sets);
  if (!st) st = moejit_event_record(g->ctx, g->ev[1], g->stream);
  if (!st) st = moejit_event_synchronize(g->ctx, g->ev[1]);
  if (!st) st = moejit_event_elapsed_ms(g->ctx, g->ev[0], g->ev[1], &ms);
  double each = ms / warm;
  *iters = grp->iters;
  if (!st && each > 0 && grp->max_point_ms / each < grp->iters) {
    int fit = (int)(grp->max_point_ms / each);
    *iters = fit < grp->min_iters ? grp->min_iters : fit;
  }
  return st;
}

static moejit_status time_launches(gpu *g, const mj_tune_group *grp, const moejit_spec *spec,
                                   moejit_gemm_path path, mj_tune_measurement *m) {
  int iters;
  moejit_status st = warm_up(g, grp, spec, path, &iters);
  if (iters > MJ_TUNE_MAX_ITERS) iters = MJ_TUNE_MAX_ITERS;
  if (!st) st = events(g, iters + 1);
  if (!st) st = moejit_event_record(g->ctx, g->ev[0], g->stream);
  for (int i = 0; i < iters && !st; i++) { /* back to back, an event between each */
    st = launch(g, grp, spec, path, i % g->n_sets);
    if (!st) st = moejit_event_record(g->ctx, g->ev[i + 1], g->stream);
  }
  if (!st) st = moejit_event_synchronize(g->ctx, g->ev[iters]);
  double *ms = st ? NULL : malloc((size_t)iters * sizeof *ms);
  if (!st && !ms) st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory timing");
  for (int i = 0; i < iters && !st; i++) {
    float t;
    st = moejit_event_elapsed_ms(g->ctx, g->ev[i], g->ev[i + 1], &t);
    ms[i] = t;
  }
  if (!st) {
    m->us = mj_tune_median(ms, (size_t)iters) * 1e3;
    m->iters = iters;
  }
  free(ms);
  return st;
}

static moejit_status gpu_measure(void *state, const mj_tune_group *grp, const moejit_spec *spec,
                                 moejit_gemm_path path, mj_tune_measurement *m) {
  gpu *g = state;
  memset(m, 0, sizeof *m);
  g->gathers = 0;
  mj_gemm_plan plan;
  if (g->period && g->index &&
      mj_gemm_plan_make_for(spec, 1, path, grp->rows, g->arch, &plan) == MOEJIT_OK)
    g->gathers = mj_gemm1_plan_gathers(spec, grp->tokens, &plan, mj_ctx_l2_bytes(g->ctx),
                                       mj_ctx_sm_count(g->ctx));
  if (g->gathers && !g->ref_gather) { /* the gathered rows' reference, once a group */
    const size_t n = (size_t)g->n_check * (size_t)g->n_out;
    if (!(g->ref_gather = malloc(n * sizeof *g->ref_gather + 1)))
      return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory for the check");
    mj_tune_reference(g->data, grp->base, grp->which, grp->offsets, g->check_rows, g->n_check,
                      g->a_offset, 0, g->x_row, g->w_offset, grp->jobs, g->ref_gather);
  }
  moejit_status st = events(g, 2);
  if (!st) st = check(g, grp, spec, path, &m->rel_err);
  if (st || !(m->rel_err <= grp->tolerance)) return st; /* a wrong kernel is not timed */
  if ((st = time_launches(g, grp, spec, path, m))) return st;
  m->gathers = g->gathers;
  /* the GEMV kernel within the decode layer's reach runs in its two-launch
   * form, which neither copies nor gathers */
  const int decode = path == MOEJIT_GEMM_PATH_GEMV && mj_decode_reach(grp->base, grp->tokens);
  if (!g->gathers && !decode && g->copy_us > 0) m->copy_us = g->copy_us, m->us += g->copy_us;
  return MOEJIT_OK;
}

static int gpu_alive(void *state) {
  gpu *g = state;
  return moejit_stream_synchronize(g->ctx, g->stream) == MOEJIT_OK;
}

static moejit_status gpu_compile(void *state, const moejit_spec *spec, const char *family,
                                 int *hit) {
  gpu *g = state;
  const void *cubin;
  size_t len;
  return mj_compiler_get_cubin(moejit_ctx_compiler(g->ctx), spec, family, g->arch, &cubin, &len,
                               NULL, hit);
}

static void gpu_destroy(void *state) {
  gpu *g = state;
  if (!g) return;
  free_sets(g);
  free_weights(g);
  free_ptr(g, (void **)&g->round_sync);
  free_ptr(g, &g->split);
  for (int i = 0; i < g->n_ev; i++) moejit_event_destroy(g->ctx, g->ev[i]);
  if (g->stream) {
    moejit_stream_synchronize(g->ctx, g->stream);
    moejit_stream_destroy(g->ctx, g->stream);
  }
  mj_tune_data_free(g->data);
  free(g->data);
  free(g);
}

static void versions(mj_tune_backend *be) {
  int maj = 0, min = 0;
  moejit_nvrtc_version(&maj, &min);
  snprintf(be->nvrtc, sizeof be->nvrtc, "%d.%d", maj, min);
  if (moejit_driver_version(&be->driver) != MOEJIT_OK) be->driver = 0, mj_clear_error();
}

moejit_status mj_tune_gpu_backend(moejit_ctx *ctx, mj_tune_backend *be) {
  memset(be, 0, sizeof *be);
  moejit_device_info info;
  moejit_status st = moejit_ctx_device_info(ctx, &info);
  if (st) return st;
  gpu *g = calloc(1, sizeof *g);
  if (g) g->data = calloc(1, sizeof *g->data);
  if (!g || !g->data) {
    free(g);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory creating the tuner");
  }
  g->ctx = ctx;
  g->w_shape = g->w_which = -1;
  mj_strlcpy(g->arch, info.arch, sizeof g->arch);
  if ((st = moejit_stream_create(ctx, &g->stream))) {
    gpu_destroy(g);
    return st;
  }
  *be = (mj_tune_backend){.state = g,
                          .can_time = 1,
                          .compile = gpu_compile,
                          .open_group = gpu_open,
                          .measure = gpu_measure,
                          .close_group = gpu_close,
                          .alive = gpu_alive,
                          .destroy = gpu_destroy};
  mj_strlcpy(be->device, info.name, sizeof be->device);
  mj_strlcpy(be->arch, info.arch, sizeof be->arch);
  versions(be);
  return MOEJIT_OK;
}

/* ---- compile only ------------------------------------------------------------------ */

typedef struct compile_only {
  moejit_compiler *compiler;
  int owned;
  char arch[MOEJIT_ARCH_MAX];
} compile_only;

static moejit_status co_compile(void *state, const moejit_spec *spec, const char *family,
                                int *hit) {
  compile_only *c = state;
  const void *cubin;
  size_t len;
  return mj_compiler_get_cubin(c->compiler, spec, family, c->arch, &cubin, &len, NULL, hit);
}

static void co_destroy(void *state) {
  compile_only *c = state;
  if (c && c->owned) moejit_compiler_destroy(c->compiler);
  free(c);
}

moejit_status mj_tune_compile_backend(moejit_compiler *compiler, const char *arch,
                                      mj_tune_backend *be) {
  memset(be, 0, sizeof *be);
  int has_a;
  if (!arch || !strcmp(arch, "auto") || strlen(arch) >= MOEJIT_ARCH_MAX ||
      mj_arch_parse(arch, &has_a) <= 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "'%s' is not an arch to compile for; HINT: e.g. sm_90a or sm_80",
                   arch ? arch : "(null)");
  compile_only *c = calloc(1, sizeof *c);
  if (!c) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory creating the tuner");
  mj_strlcpy(c->arch, arch, sizeof c->arch);
  c->compiler = compiler;
  if (!compiler) {
    moejit_status st = moejit_compiler_create(&c->compiler, NULL);
    if (st) {
      free(c);
      return st;
    }
    c->owned = 1;
  }
  *be = (mj_tune_backend){.state = c, .compile = co_compile, .destroy = co_destroy};
  mj_strlcpy(be->arch, arch, sizeof be->arch);
  versions(be);
  return MOEJIT_OK;
}
