/* Periodic GPU-filled tensors for the layer tests; see layer_gpu.h. */
#include "layer_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_gpu.h"
#include "ref_dtype.h"

void lg_periodic_make(lg_periodic *p, moejit_dtype dtype, double scale, ts_rng *rng) {
  float *f = malloc(sizeof(float) * LG_PERIOD);
  p->dtype = dtype;
  p->bits = malloc(moejit_dtype_size(dtype) * LG_PERIOD);
  cr_assert(f && p->bits, "out of host memory");
  for (size_t i = 0; i < LG_PERIOD; i++) f[i] = (float)ts_uniform(rng, -scale, scale);
  ref_pack(dtype, f, p->bits, LG_PERIOD);
  free(f);
}

void lg_periodic_free(lg_periodic *p) {
  free(p->bits);
  p->bits = NULL;
}

void lg_periodic_fill(const lg_periodic *p, void *dst, size_t elems) {
  const size_t es = moejit_dtype_size(p->dtype), total = elems * es;
  const size_t first = total < es * LG_PERIOD ? total : es * LG_PERIOD;
  moejit_ctx *ctx = ops_ctx();
  OPS_OK(moejit_memcpy_htod(ctx, dst, p->bits, first, NULL));
  /* dst[0, filled) repeats with the period and filled is a multiple of it,
   * so copying it forward extends the pattern (log2 copies). */
  for (size_t filled = first; filled < total;) {
    size_t n = total - filled < filled ? total - filled : filled;
    OPS_OK(moejit_memcpy_dtod(ctx, (char *)dst + filled, dst, n, NULL));
    filled += n;
  }
  ops_sync();
}

void lg_periodic_read(const lg_periodic *p, size_t first, size_t n, void *dst) {
  const size_t es = moejit_dtype_size(p->dtype);
  size_t at = first % LG_PERIOD;
  for (size_t done = 0; done < n;) {
    size_t run = LG_PERIOD - at < n - done ? LG_PERIOD - at : n - done;
    memcpy((char *)dst + done * es, (const char *)p->bits + at * es, run * es);
    done += run;
    at = 0;
  }
}

void lg_weights_make(lg_weights *w, const moejit_spec *s, ts_rng *rng) {
  memset(w, 0, sizeof *w);
  w->spec = s;
  const size_t n1 = (size_t)s->experts * 2 * (size_t)s->expert_width * (size_t)s->hidden;
  const size_t n2 = (size_t)s->experts * (size_t)s->hidden * (size_t)s->expert_width;
  const size_t es = moejit_dtype_size(s->weight_dtype);
  /* scaled so that gate/up and y stay O(1) for x in [-1, 1] */
  lg_periodic_make(&w->w1, s->weight_dtype, sqrt(3.0 / (double)s->hidden), rng);
  lg_periodic_make(&w->w2, s->weight_dtype, sqrt(3.0 / (double)s->expert_width), rng);
  w->d_w1 = ops_alloc(n1 * es);
  w->d_w2 = ops_alloc(n2 * es);
  lg_periodic_fill(&w->w1, w->d_w1, n1);
  lg_periodic_fill(&w->w2, w->d_w2, n2);
}

void lg_weights_free(lg_weights *w) {
  ops_free(w->d_w1);
  ops_free(w->d_w2);
  lg_periodic_free(&w->w1);
  lg_periodic_free(&w->w2);
}

void lg_weights_fetch(void *user, int which, int expert, void *dst) {
  const lg_weights *w = user;
  const size_t per = 2 * (size_t)w->spec->expert_width * (size_t)w->spec->hidden;
  if (which == 1)
    lg_periodic_read(&w->w1, (size_t)expert * per, per, dst);
  else
    lg_periodic_read(&w->w2, (size_t)expert * per / 2, per / 2, dst);
}
