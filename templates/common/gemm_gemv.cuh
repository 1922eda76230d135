// Decode GEMMs: a few rows per expert, so the work is streaming the active
// experts' weights once. A tensor-core tile would hold one useful row in 64
// and put a whole weight tile on one SM; here every warp of a persistent
// grid takes a work unit (an active expert and a few output columns), streams
// those weight rows with 16-byte loads that bypass L1, and dots each chunk
// with the expert's rows (which stay in L1: every warp of the SM reads them),
// fp32 sums on the CUDA cores, one butterfly per output. The units of all
// active experts are spread over all SMs, so the whole chip streams even when
// eight experts have one row each.
//
// The host mirrors the constants below (src/ops/gemm.h: MJ_GEMV_*,
// include/moejit/gemm.h: MOEJIT_GEMV_PASS_ROWS) and picks this path under
// AUTO only when max_rows <= MOEJIT_GEMV_MAX_ROWS, so one pass over the
// weights covers every expert's rows; more rows stay correct (another pass).
// Deterministic: each lane sums its chunks in order, then a fixed butterfly.
#ifndef MOEJIT_COMMON_GEMM_GEMV_CUH
#define MOEJIT_COMMON_GEMM_GEMV_CUH

#include "common/dtype.cuh"
#include "common/gemm_config.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_tiles.cuh"
#include "common/warp.cuh"

// The dtypes and shapes the path takes (src/ops: mj_gemm_gemv_blocker).
static constexpr bool kGemvOk = mj_same_type<act_t, weight_t>::value && mj_is_mma_type<act_t>::value &&
                                kHidden % 8 == 0 && kExpertWidth % 8 == 0;

static constexpr int kGemvWarps = 8;
static constexpr int kGemvThreads = kGemvWarps * 32;
static constexpr int kGemvPassRows = 8; // rows of one expert per pass over its weights
static constexpr int kGemv1Cols = 2;    // GEMM 1: h columns per unit (gate + up rows: 4)
static constexpr int kGemv2Cols = 4;    // GEMM 2: y columns per unit (W2 rows: 4)

// 16 weight bytes, read once: not allocated in L1, which keeps the rows.
__device__ __forceinline__ uint4 mj_ld_stream(const void *p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The 8 fp16/bf16 elements of a 16-byte chunk as floats.
template <typename T> __device__ __forceinline__ void mj_unpack8(const uint4 &v, float (&f)[8]) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = mj_dtype<T>::to_float(mj_word_elem<T>(w, i));
}

// The experts with rows, ascending, into list; returns how many (every
// thread of the block calls it). Warp 0 loads all offsets at once (one
// round trip), then compacts 32 experts per ballot.
template <int EXPERTS>
__device__ __forceinline__ int mj_gemv_active_experts(const int *offsets, int max_rows, int *list,
                                                      int *count) {
  constexpr int kPer = (EXPERTS + 31) / 32;
  if (threadIdx.x < 32) {
    const int lane = mj_lane_id();
    int lo[kPer], hi[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = i * 32 + lane;
      lo[i] = e < EXPERTS ? mj_clamped_offset(offsets, e, max_rows) : 0;
      hi[i] = e < EXPERTS ? mj_clamped_offset(offsets, e + 1, max_rows) : 0;
    }
    int base = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const bool has = hi[i] > lo[i];
      const unsigned m = __ballot_sync(MJ_FULL_MASK, has);
      if (has) list[base + __popc(m & mj_lanemask_lt())] = i * 32 + lane;
      base += __popc(m);
    }
    if (lane == 0) *count = base;
  }
  __syncthreads();
  return *count;
}

// acc[n][r] = lane's part of w[n] . a[r] over K (rows r >= rows repeat the
// last row; the caller drops them). Weight chunks of kBatch iterations are
// all in flight before the first multiply.
template <typename AT, typename WT, int K, int NW, int R>
__device__ __forceinline__ void mj_gemv_dot(const WT *const (&w)[NW], const AT *a, int rows,
                                            float (&acc)[NW][R]) {
  constexpr int kChunks = K / 8;
  constexpr int kIters = (kChunks + 31) / 32;
  constexpr int kBatch = kIters < (R <= 2 ? 4 : 2) ? kIters : (R <= 2 ? 4 : 2);
  const int lane = mj_lane_id();
#pragma unroll
  for (int n = 0; n < NW; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.f;
#pragma unroll 1
  for (int i0 = 0; i0 < kIters; i0 += kBatch) {
    uint4 wv[kBatch][NW];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = lane + 32 * (i0 + b);
      const bool ok = i0 + b < kIters && (kChunks % 32 == 0 || c < kChunks);
#pragma unroll
      for (int n = 0; n < NW; ++n) wv[b][n] = ok ? mj_ld_stream(w[n] + c * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = lane + 32 * (i0 + b);
      if (!(i0 + b < kIters && (kChunks % 32 == 0 || c < kChunks))) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float af[8];
        const int row = r < rows ? r : rows - 1;
        mj_unpack8<AT>(__ldg(reinterpret_cast<const uint4 *>(a + row * K + c * 8)), af);
#pragma unroll
        for (int n = 0; n < NW; ++n) {
          float wf[8];
          mj_unpack8<WT>(wv[b][n], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[n][r] = fmaf(wf[i], af[i], acc[n][r]);
        }
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NW; ++n)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = mj_warp_sum(acc[n][r]);
}

// The persistent loop: unit u = (active expert u / groups, column group
// u % groups), warp (blockIdx, w) takes units blockIdx + gridDim * w + k *
// (all warps), so consecutive units land on different SMs. For each unit
// and pass of up to kGemvPassRows rows, unit.run<R>(expert, group, row0,
// rows) runs with R the power of two >= rows (1, 2, 4 or 8).
template <int EXPERTS, class Unit>
__device__ __forceinline__ void mj_gemv_for_each(const int *offsets, int max_rows, int groups,
                                                 const Unit &unit) {
  __shared__ int list[EXPERTS];
  __shared__ int count;
  const int active = mj_gemv_active_experts<EXPERTS>(offsets, max_rows, list, &count);
  const long long units = (long long)active * groups;
  const long long stride = (long long)gridDim.x * kGemvWarps;
#pragma unroll 1
  for (long long u = blockIdx.x + (long long)gridDim.x * (threadIdx.x / 32); u < units; u += stride) {
    const int e = list[u / groups], g = (int)(u % groups);
    const int first = mj_clamped_offset(offsets, e, max_rows);
    const int end = mj_clamped_offset(offsets, e + 1, max_rows);
#pragma unroll 1
    for (int row0 = first; row0 < end; row0 += kGemvPassRows) {
      const int rows = end - row0 < kGemvPassRows ? end - row0 : kGemvPassRows;
      if (rows == 1) unit.template run<1>(e, g, row0, rows);
      else if (rows == 2) unit.template run<2>(e, g, row0, rows);
      else if (rows <= 4) unit.template run<4>(e, g, row0, rows);
      else unit.template run<8>(e, g, row0, rows);
    }
  }
}

#endif
