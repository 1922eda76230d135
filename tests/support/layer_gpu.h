/* Helpers for tests/gpu/test_layer.c: periodic pseudo-random tensors that
 * the GPU fills itself (element i is block[i mod P], P prime), so a 22 GB
 * weight tensor costs one small upload plus device copies, and the host can
 * produce any expert's weights for the reference without reading them back.
 * Calls assert (Criterion) instead of returning errors. */
#ifndef MOEJIT_TEST_LAYER_GPU_H
#define MOEJIT_TEST_LAYER_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"
#include "test_support.h"

#define LG_PERIOD 1048573 /* prime */

typedef struct lg_periodic {
  moejit_dtype dtype;
  void *bits; /* LG_PERIOD elements of dtype */
} lg_periodic;

/* Uniform values in [-scale, scale], stored as dtype. */
void lg_periodic_make(lg_periodic *p, moejit_dtype dtype, double scale, ts_rng *rng);
void lg_periodic_free(lg_periodic *p);

/* Fills elems elements at dst (ops_ctx(), default stream) and synchronizes. */
void lg_periodic_fill(const lg_periodic *p, void *dst, size_t elems);

/* Host copy of elements [first, first + n) of the tensor (dtype bits). */
void lg_periodic_read(const lg_periodic *p, size_t first, size_t n, void *dst);

/* Weights of one layer as periodic tensors: W1 [E, 2f, d], W2 [E, d, f],
 * and a ref_layer_fetch over them (user = the lg_weights). */
typedef struct lg_weights {
  const moejit_spec *spec;
  lg_periodic w1, w2;
  void *d_w1, *d_w2; /* device tensors */
} lg_weights;

void lg_weights_make(lg_weights *w, const moejit_spec *spec, ts_rng *rng);
void lg_weights_free(lg_weights *w);
void lg_weights_fetch(void *user, int which, int expert, void *dst);

#endif
