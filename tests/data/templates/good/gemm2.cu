// Test template for the gemm2 family: the GEMM tile constants of the prelude.
#include "common/test_math.cuh"

static_assert(kBlockThreads == kWarps * 32, "a GEMM block is its warps");

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_test_gemm2(const act_t *h, const weight_t *w, act_t *y, int rows) {
  int r = blockIdx.x * kTileM + threadIdx.x % kTileM;
  int c = blockIdx.y * kTileN + threadIdx.x / kTileM;
  if (r >= rows || c >= kHidden) return;
  float acc = 0.f;
  for (int k = 0; k < kExpertWidth; k += kTileK * kStages) acc += to_f32(h[(long long)r * kExpertWidth + k]) * to_f32(w[k]);
  y[(long long)r * kHidden + c] = static_cast<act_t>(acc + kRaster + kClusterM + kClusterN);
}
