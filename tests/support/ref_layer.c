/* Float64 reference of the whole layer; see ref_layer.h. */
#include "ref_layer.h"

#include <stdlib.h>
#include <string.h>

#include "ref_combine.h"
#include "ref_dtype.h"
#include "ref_gemm.h"

ref_layer_shape ref_layer_shape_of(const moejit_spec *spec) {
  ref_layer_shape s = {.d = spec->hidden,
                       .f = spec->expert_width,
                       .experts = spec->experts,
                       .top_k = spec->top_k,
                       .act_dtype = spec->act_dtype,
                       .weight_dtype = spec->weight_dtype};
  return s;
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) abort(); /* a test helper: out of memory ends the test */
  return p;
}

/* Stores doubles as dtype (what the GPU keeps) and widens them back. */
static void round_rows(moejit_dtype dt, const double *src, void *bits, float *back, size_t n) {
  float *f = xmalloc(sizeof(float) * n);
  for (size_t i = 0; i < n; i++) f[i] = (float)src[i];
  ref_pack(dt, f, bits, n);
  if (back) ref_unpack(dt, bits, back, n);
  free(f);
}

/* The expert MLP for the `cnt` entries in rows[] (entry = token*k + j):
 * writes their y rows (rounded to act_dtype) into y[entry]. */
static void run_expert(const ref_layer_shape *s, int e, const int64_t *entries, int64_t cnt,
                       const void *x, ref_layer_fetch fetch, void *user, float *y) {
  const size_t as = moejit_dtype_size(s->act_dtype), ws = moejit_dtype_size(s->weight_dtype);
  const size_t d = (size_t)s->d, f = (size_t)s->f;
  char *a = xmalloc(as * d * (size_t)cnt), *hb = xmalloc(as * f * (size_t)cnt);
  void *w1 = xmalloc(ws * 2 * f * d), *w2 = xmalloc(ws * d * f);
  double *h = xmalloc(sizeof(double) * f * (size_t)cnt),
         *yd = xmalloc(sizeof(double) * d * (size_t)cnt);
  float *yf = xmalloc(sizeof(float) * d * (size_t)cnt);
  for (int64_t r = 0; r < cnt; r++)
    memcpy(a + (size_t)r * d * as, (const char *)x + (size_t)(entries[r] / s->top_k) * d * as,
           d * as);
  fetch(user, 1, e, w1);
  fetch(user, 2, e, w2);
  int32_t offsets[2] = {0, (int32_t)cnt};
  ref_gemm_problem p = {.act_dtype = s->act_dtype,
                        .weight_dtype = s->weight_dtype,
                        .a = a,
                        .w = w1,
                        .offsets = offsets,
                        .experts = 1,
                        .d = s->d,
                        .f = s->f};
  ref_gemm1_swiglu(&p, h);
  round_rows(s->act_dtype, h, hb, NULL, f * (size_t)cnt);
  p.a = hb;
  p.w = w2;
  ref_gemm2(&p, yd);
  round_rows(s->act_dtype, yd, a /* reuse: same size */, yf, d * (size_t)cnt);
  for (int64_t r = 0; r < cnt; r++)
    memcpy(y + (size_t)entries[r] * d, yf + (size_t)r * d, sizeof(float) * d);
  free(a), free(hb), free(w1), free(w2), free(h), free(yd), free(yf);
}

void ref_layer_tokens(const ref_layer_shape *s, int64_t n, const void *x, const int32_t *ids,
                      const float *weights, ref_layer_fetch fetch, void *user, double *out) {
  const int64_t entries = n * s->top_k;
  float *y = xmalloc(sizeof(float) * (size_t)entries * (size_t)s->d);
  int32_t *row_of = xmalloc(sizeof(int32_t) * (size_t)entries);
  int64_t *mine = xmalloc(sizeof(int64_t) * (size_t)entries);
  for (int64_t i = 0; i < entries; i++) {
    const int valid = ids[i] >= 0 && ids[i] < s->experts;
    row_of[i] = valid ? (int32_t)i : -1; /* y is indexed by entry */
  }
  for (int e = 0; e < s->experts; e++) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < entries; i++)
      if (ids[i] == e) mine[cnt++] = i;
    if (cnt) run_expert(s, e, mine, cnt, x, fetch, user, y);
  }
  ref_combine(n, s->top_k, s->d, y, row_of, weights, out, NULL);
  free(y), free(row_of), free(mine);
}
