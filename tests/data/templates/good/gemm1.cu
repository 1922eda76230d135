// Test template for the gemm1 family: the GEMM tile constants of the prelude.
#include "common/test_math.cuh"

static_assert(kBlockThreads == kWarps * 32, "a GEMM block is its warps");
static_assert(kTileM > 0 && kTileN > 0 && kTileK > 0 && kStages >= 2, "tile");
static_assert(kClusterM >= 1 && kClusterN >= 1 && (kRaster == 0 || kRaster == 1), "cluster, raster");

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_test_gemm1(const act_t *a, const weight_t *w, act_t *h, int rows) {
  int r = blockIdx.x * kTileM + threadIdx.x % kTileM;
  int c = blockIdx.y * (kTileN / 2);
  if (r >= rows || c >= kExpertWidth) return;
  float acc = 0.f;
  for (int k = 0; k < kHidden; k += kTileK) acc += to_f32(a[(long long)r * kHidden + k]) * to_f32(w[k]);
  h[(long long)r * kExpertWidth + c] = static_cast<act_t>(acc);
}
