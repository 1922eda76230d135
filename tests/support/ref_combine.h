/* Float64 CPU reference of combine (templates/combine.cu):
 * out[t] = sum over j of w[t, j] * y[row_of[t*k + j]], rows -1 skipped. */
#ifndef MOEJIT_TEST_REF_COMBINE_H
#define MOEJIT_TEST_REF_COMBINE_H

#include <stdint.h>

/* y: [rows, d] as floats (the stored values); weights [T, k] or NULL (all
 * 1); out [T, d]. magnitude [T, d] or NULL receives sum |w * y| per element,
 * the scale against which fp32 accumulation error is measured. */
void ref_combine(int64_t tokens, int top_k, int64_t hidden, const float *y, const int32_t *row_of,
                 const float *weights, double *out, double *magnitude);

#endif
