// Test template for the route family: touches the routing constants.
#include "common/test_math.cuh"
#include "common/test_types.cuh"

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_test_route(const logits_t *logits, float *weights, int *experts, int tokens) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  TestChoice best = {-1e30f, 0};
  for (int e = 0; e < kExperts; e++) {
    float v = to_f32(logits[(long long)t * kExperts + e]);
    if (kRouteRule == 1) v = 1.f / (1.f + __expf(-v));
    if (v > best.weight) best = {v, e};
  }
  for (int k = 0; k < kTopK; k++) {
    weights[t * kTopK + k] = kRenormalize ? scaled(1.f / kTopK) : scaled(best.weight);
    experts[t * kTopK + k] = (best.expert + k) % kExperts;
  }
}
