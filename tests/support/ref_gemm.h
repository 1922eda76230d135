/* float64 CPU reference of the grouped expert GEMMs (moejit/gemm.h): GEMM 1
 * with SwiGLU and GEMM 2 with an optional per-row scale, on inputs stored as
 * their dtype's bits, summed in double. */
#ifndef MOEJIT_TEST_REF_GEMM_H
#define MOEJIT_TEST_REF_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

typedef struct ref_gemm_problem {
  moejit_dtype act_dtype, weight_dtype;
  const void *a;           /* [offsets[E], K] of act_dtype */
  const void *w;           /* gemm1: W1 [E, 2f, d]; gemm2: W2 [E, d, f] (weight_dtype) */
  const int32_t *offsets;  /* [E + 1], non-decreasing, offsets[0] = 0 */
  const float *row_scale;  /* gemm2: [offsets[E]] or NULL; gemm1 ignores it */
  int experts;
  int64_t d, f;
} ref_gemm_problem;

double ref_silu(double x);

/* h[r, j] = silu(a[r] . W1[e, j]) * (a[r] . W1[e, f + j]) for the rows r of
 * each expert e; h is [offsets[E], f]. Runs on all CPUs. */
void ref_gemm1_swiglu(const ref_gemm_problem *p, double *h);

/* y[r, i] = scale[r] * (a[r] . W2[e, i]); y is [offsets[E], d]. */
void ref_gemm2(const ref_gemm_problem *p, double *y);

/* ||out - ref|| / ||ref|| over n elements (out stored as `dtype`); INFINITY
 * if out holds a NaN or an infinity; the absolute error norm if ||ref|| = 0. */
double ref_gemm_rel_error(moejit_dtype dtype, const void *out, const double *ref, size_t n);

/* The router's logits (moejit_router_logits): ||got - x . gate^T|| /
 * ||x . gate^T|| over `tokens` rows, the reference summed in double; x
 * [tokens, d], gate [experts, d], got [tokens, experts], as floats;
 * INFINITY if got holds a NaN or an infinity. */
double ref_logits_rel_error(const float *x, const float *gate, int64_t tokens, int64_t d,
                            int64_t experts, const float *got);

#endif
