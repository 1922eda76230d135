/* float64 reference of the grouped GEMMs (see ref_gemm.h). Work is split
 * into (expert, block of output columns) items run on all CPUs; each item
 * widens its weight rows to double once and reuses them for the expert's
 * rows. */
#include "ref_gemm.h"

#include <math.h>
#include <stdlib.h>

#include "common/common.h"
#include "ref_dtype.h"

#define REF_COLS_PER_ITEM 32

typedef struct ref_job {
  const ref_gemm_problem *p;
  int which;       /* 1 or 2 */
  const double *a; /* [offsets[E], K] widened */
  double *out;
  int64_t n_out, k, col_blocks;
} ref_job;

double ref_silu(double x) { return x / (1.0 + exp(-x)); }

static double elem(moejit_dtype dt, const void *base, int64_t i) {
  if (dt == MOEJIT_DTYPE_FP32) return ((const float *)base)[i];
  uint16_t b = ((const uint16_t *)base)[i];
  return dt == MOEJIT_DTYPE_BF16 ? ref_bf16_to_f32(b) : ref_f16_to_f32(b);
}

static void widen(moejit_dtype dt, const void *base, int64_t first, int64_t n, double *dst) {
  for (int64_t i = 0; i < n; i++) dst[i] = elem(dt, base, first + i);
}

static double dot(const double *x, const double *y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
  return s;
}

/* One item: expert e, output columns [c0, c1). */
static void run_item(size_t item, void *arg) {
  const ref_job *j = arg;
  const ref_gemm_problem *p = j->p;
  int e = (int)(item / (size_t)j->col_blocks);
  int64_t c0 = (int64_t)(item % (size_t)j->col_blocks) * REF_COLS_PER_ITEM;
  int64_t c1 = c0 + REF_COLS_PER_ITEM < j->n_out ? c0 + REF_COLS_PER_ITEM : j->n_out;
  int64_t r0 = p->offsets[e], r1 = p->offsets[e + 1], k = j->k;
  if (r0 >= r1) return;
  double *w0 = malloc(sizeof(double) * (size_t)k * 2), *w1 = w0 + k;
  if (!w0) abort(); /* a test helper: out of memory ends the test */
  for (int64_t c = c0; c < c1; c++) {
    if (j->which == 1) { /* gate row c, up row f + c of W1[e] */
      widen(p->weight_dtype, p->w, ((int64_t)e * 2 * p->f + c) * k, k, w0);
      widen(p->weight_dtype, p->w, ((int64_t)e * 2 * p->f + p->f + c) * k, k, w1);
    } else {
      widen(p->weight_dtype, p->w, ((int64_t)e * p->d + c) * k, k, w0);
    }
    for (int64_t r = r0; r < r1; r++) {
      const double *x = j->a + r * k;
      double v;
      if (j->which == 1) v = ref_silu(dot(x, w0, k)) * dot(x, w1, k);
      else v = dot(x, w0, k) * (p->row_scale ? (double)p->row_scale[r] : 1.0);
      j->out[r * j->n_out + c] = v;
    }
  }
  free(w0);
}

static void run(const ref_gemm_problem *p, int which, double *out) {
  int64_t rows = p->offsets[p->experts], k = which == 1 ? p->d : p->f;
  ref_job j = {.p = p, .which = which, .out = out, .k = k, .n_out = which == 1 ? p->f : p->d};
  j.col_blocks = (j.n_out + REF_COLS_PER_ITEM - 1) / REF_COLS_PER_ITEM;
  double *a = malloc(sizeof(double) * (size_t)(rows * k + 1));
  if (!a) abort();
  widen(p->act_dtype, p->a, 0, rows * k, a);
  j.a = a;
  mj_parallel_for((size_t)p->experts * (size_t)j.col_blocks, 0, run_item, &j);
  free(a);
}

void ref_gemm1_swiglu(const ref_gemm_problem *p, double *h) { run(p, 1, h); }

void ref_gemm2(const ref_gemm_problem *p, double *y) { run(p, 2, y); }

double ref_gemm_rel_error(moejit_dtype dtype, const void *out, const double *ref, size_t n) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    double v = elem(dtype, out, (int64_t)i);
    if (!isfinite(v)) return INFINITY;
    diff += (v - ref[i]) * (v - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

double ref_logits_rel_error(const float *x, const float *gate, int64_t tokens, int64_t d,
                            int64_t experts, const float *got) {
  double diff = 0, norm = 0;
  for (int64_t t = 0; t < tokens; t++)
    for (int64_t e = 0; e < experts; e++) {
      double ref = 0;
      for (int64_t i = 0; i < d; i++) ref += (double)x[t * d + i] * (double)gate[e * d + i];
      const double v = got[t * experts + e];
      if (!isfinite(v)) return INFINITY;
      diff += (v - ref) * (v - ref);
      norm += ref * ref;
    }
  return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}
