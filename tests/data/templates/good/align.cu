// Test template for the align family: two entries, one declared before use.
#include "common/test_types.cuh"

extern "C" __global__ void moejit_test_align_count(const int *experts, int *counts, int n);

extern "C" __global__ __launch_bounds__(kBlockThreads) void moejit_test_align_count(
    const int *experts, int *counts, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&counts[experts[i]], 1);
}

// extern "C" __global__ void moejit_commented_out(int *x) { }
/* extern "C" __global__ void moejit_block_commented(int *x) { } */

extern "C"
__global__
void
moejit_test_align_tiles(const int *counts, int *tile_expert) {
  int e = threadIdx.x;
  if (e < kExperts) tile_expert[e] = (counts[e] + kGemmTileM - 1) / kGemmTileM;
}
