// Test template for the combine family: every dtype typedef of the prelude.
#include "common/test_math.cuh"

extern "C" __global__ void moejit_test_combine(const act_t *y, const weight_t *unused,
                                               const float *w, out_t *out, int tokens) {
  int t = blockIdx.y;
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens || c >= kHidden) return;
  float acc = 0.f;
  for (int k = 0; k < kTopK; k++) acc += w[t * kTopK + k] * to_f32(y[((long long)t * kTopK + k) * kHidden + c]);
  (void)unused;
  (void)kExpertWidth;
  out[(long long)t * kHidden + c] = static_cast<out_t>(acc);
}
