/* Float64 CPU reference of the whole MoE layer (moejit/layer.h), composed
 * of the stage references: per expert in use, ref_gemm1_swiglu, h rounded
 * to the activation dtype (as the GPU stores it), ref_gemm2, y rounded the
 * same way, then ref_combine with the top-k weights (moejit_moe_forward
 * applies them in combine). Only the given tokens are computed, and only
 * the experts they chose are fetched, so it stays cheap for models whose
 * weights do not fit in host memory. Routing: ref_route.h. */
#ifndef MOEJIT_TEST_REF_LAYER_H
#define MOEJIT_TEST_REF_LAYER_H

#include <stdint.h>

#include "moejit/moejit.h"

typedef struct ref_layer_shape {
  int64_t d, f;
  int experts, top_k;
  moejit_dtype act_dtype, weight_dtype;
} ref_layer_shape;

ref_layer_shape ref_layer_shape_of(const moejit_spec *spec);

/* Writes expert `expert`'s weights as stored (weight_dtype bits) to dst:
 * which 1: W1[expert], [2f, d]; which 2: W2[expert], [d, f]. */
typedef void (*ref_layer_fetch)(void *user, int which, int expert, void *dst);

/* out [n, d] for n tokens: x [n, d] (act_dtype bits), their ids and
 * weights [n, k] (ids outside 0..E-1 are skipped, as align drops them). */
void ref_layer_tokens(const ref_layer_shape *s, int64_t n, const void *x, const int32_t *ids,
                      const float *weights, ref_layer_fetch fetch, void *user, double *out);

#endif
