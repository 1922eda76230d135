// GEMM 2 of the MoE layer (down projection): for the permuted rows h of
// expert e (rows offsets[e] .. offsets[e+1]-1 of h [rows, f]),
//   y[row, :] = scale[row] * (h[row, :] * W2[e]^T)           -> y [rows, d]
// with W2 [E, d, f] as checkpoints store it; scale (fp32 per row, the
// router weight) is optional: NULL multiplies by 1.
//
// Entries: moejit_gemm2_mma (tensor cores; fp16/bf16 with act = weight
// dtype and d, f multiples of 8) and moejit_gemm2_simt (any dtypes; the
// reference). Both take (h, W2, y, offsets [E+1] int32, scale, max_rows).
#include "common/gemm_config.cuh"
#include "common/gemm_tiles.cuh"
#include "common/gemm_mainloop.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_simt.cuh"

typedef mj_gemm_shape<kTileM, kTileN, kTileK, kStages, kWarps> Gemm2Shape;
static constexpr int kG2NTiles = (kHidden + kTileN - 1) / kTileN;
static constexpr bool kG2Mma = mj_same_type<act_t, weight_t>::value && mj_is_mma_type<act_t>::value &&
                               (kWarps == 4 || kWarps == 8) && kHidden % 8 == 0 && kExpertWidth % 8 == 0;

static_assert(kBlockThreads == kWarps * 32, "gemm2: kBlockThreads must be kWarps * 32");
static_assert((long long)kHidden * kExpertWidth < (1LL << 31), "gemm2: one expert's W2 must fit int32 offsets");
static_assert((long long)kTileM * kExpertWidth < (1LL << 31), "gemm2: an A tile must fit int32 offsets");

// Tile row r of B -> element offset of W2 row (output column) n0 + r inside
// the expert's W2, -1 past column d.
struct mj_gemm2_b_rows {
  int n0;
  __device__ int operator()(int r) const { return n0 + r < kHidden ? (n0 + r) * kExpertWidth : -1; }
};

template <typename AT, typename WT>
__device__ __forceinline__ void mj_gemm2_mma(const AT *__restrict__ a, const WT *__restrict__ w,
                                             AT *__restrict__ y, const int *__restrict__ offsets,
                                             const float *__restrict__ scale, int max_rows) {
  if constexpr (!kG2Mma) {
    __trap(); // the host launches the simt entry for these dtypes/shapes
  } else {
    typedef Gemm2Shape S;
    mj_gemm_check_smem<S>();
    mj_gemm_tile t;
    if (!mj_gemm_find_tile<kTileM, kBlockThreads, kExperts, kRaster>(offsets, max_rows, kG2NTiles, &t))
      return;
    const int n0 = t.n_tile * kTileN;
    mj_tile_loader<S, kTileM, kExpertWidth> la;
    la.init(mj_a_rows<kExpertWidth>{t.row_end - t.row0});
    mj_tile_loader<S, kTileN, kExpertWidth> lb;
    lb.init(mj_gemm2_b_rows{n0});
    const mj_warp_pos p = mj_gemm_warp_pos<S>();
    float acc[S::kMi][S::kNi][4];
    mj_gemm_mainloop<S, kExpertWidth>(la, a + (long long)t.row0 * kExpertWidth, lb,
                                      w + (long long)t.expert * ((long long)kHidden * kExpertWidth),
                                      mj_smem_u32(mj_gemm_smem), p, acc);
    if (!mj_gemm_reduce_k<S>(reinterpret_cast<float *>(mj_gemm_smem), p, acc)) return;

#pragma unroll
    for (int mi = 0; mi < S::kMi; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = t.row0 + p.m0 + mi * 16 + mj_acc_row(p.lane, half);
        if (row >= t.row_end) continue;
        const float s = scale ? __ldg(scale + row) : 1.f;
        AT *out = y + (long long)row * kHidden;
#pragma unroll
        for (int ni = 0; ni < S::kNi; ++ni) {
          const int col = n0 + p.n0 + ni * 8 + mj_acc_col(p.lane);
          if (col >= kHidden) continue;
          mj_store2(out + col, s * acc[mi][ni][2 * half], s * acc[mi][ni][2 * half + 1]);
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm2_mma(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ y,
                 const int *__restrict__ offsets, const float *__restrict__ scale, int max_rows) {
  mj_gemm2_mma(a, w, y, offsets, scale, max_rows);
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm2_simt(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ y,
                  const int *__restrict__ offsets, const float *__restrict__ scale, int max_rows) {
  mj_gemm_simt_for_each<kExperts, kHidden>(offsets, max_rows, [&](int row, int e, int col) {
    const weight_t *w_row = w + ((long long)e * kHidden + col) * kExpertWidth;
    const float v = mj_gemm_dot<kExpertWidth>(a + (long long)row * kExpertWidth, w_row);
    mj_store1(y + (long long)row * kHidden + col, scale ? scale[row] * v : v);
  });
}
