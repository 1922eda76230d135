/* Float64 reference of combine; see ref_combine.h. */
#include "ref_combine.h"

#include <math.h>

void ref_combine(int64_t tokens, int top_k, int64_t hidden, const float *y, const int32_t *row_of,
                 const float *weights, double *out, double *magnitude) {
  for (int64_t t = 0; t < tokens; t++) {
    double *o = out + t * hidden;
    for (int64_t c = 0; c < hidden; c++) o[c] = 0.0;
    if (magnitude)
      for (int64_t c = 0; c < hidden; c++) magnitude[t * hidden + c] = 0.0;
    for (int j = 0; j < top_k; j++) {
      const int32_t row = row_of[t * top_k + j];
      if (row < 0) continue;
      const double w = weights ? weights[t * top_k + j] : 1.0;
      for (int64_t c = 0; c < hidden; c++) {
        const double term = w * y[(int64_t)row * hidden + c];
        o[c] += term;
        if (magnitude) magnitude[t * hidden + c] += fabs(term);
      }
    }
  }
}
