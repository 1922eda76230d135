// The SIMT grouped GEMM: one thread per output element, an fp32 sum in k
// order. Slow and plainly correct: the path for fp32 (and mixed) dtypes and
// the GPU-side reference the tests compare the tensor-core kernels with.
#ifndef MOEJIT_COMMON_GEMM_SIMT_CUH
#define MOEJIT_COMMON_GEMM_SIMT_CUH

#include "common/gemm_epilogue.cuh"
#include "common/gemm_tiles.cuh"

// The expert owning `row` (the largest e with offsets[e] <= row, so empty
// experts are skipped), or -1 when the row is past the last expert's rows.
template <int EXPERTS>
__device__ int mj_gemm_row_expert(const int *offsets, int max_rows, int row) {
  if (mj_clamped_offset(offsets, 0, max_rows) > row) return -1;
  int lo = 0, hi = EXPERTS - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mj_clamped_offset(offsets, mid, max_rows) <= row) lo = mid;
    else hi = mid - 1;
  }
  return row < mj_clamped_offset(offsets, lo + 1, max_rows) ? lo : -1;
}

// sum_k a[k] * w[k] in fp32, k ascending.
template <int K, typename AT, typename WT>
__device__ float mj_gemm_dot(const AT *a, const WT *w) {
  float s = 0.f;
  for (int k = 0; k < K; ++k) s = fmaf(mj_load1(a + k), mj_load1(w + k), s);
  return s;
}

// Calls f(row, expert, col) for each element of a [max_rows, NCOLS] output
// whose row belongs to an expert (grid-stride: any grid size works).
template <int EXPERTS, int NCOLS, class F>
__device__ void mj_gemm_simt_for_each(const int *offsets, int max_rows, const F &f) {
  const long long total = (long long)max_rows * NCOLS;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int row = (int)(i / NCOLS), col = (int)(i % NCOLS);
    const int e = mj_gemm_row_expert<EXPERTS>(offsets, max_rows, row);
    if (e >= 0) f(row, e, col);
  }
}

#endif
