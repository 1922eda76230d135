// GEMM 1 of the MoE layer with SwiGLU fused: for the permuted rows xs of
// expert e (rows offsets[e] .. offsets[e+1]-1 of A [rows, d]),
//   h = silu(xs * W1[e, 0:f]^T) * (xs * W1[e, f:2f]^T)      -> h [rows, f]
// with W1 [E, 2f, d] as checkpoints store it (gate rows, then up rows).
//
// Tiling: kTileN counts B rows, half gate and half up: n-tile j computes h
// columns [j*kTileN/2, (j+1)*kTileN/2). The loader interleaves them by 8 rows
// (gate 8, up 8, gate 8, ...), so the two n8 mma tiles 2p and 2p+1 of a warp
// hold gate and up of the same 8 h columns in the same registers of the same
// thread: SwiGLU happens in registers and h is written once.
//
// Entries: moejit_gemm1_swiglu_mma (tensor cores; fp16/bf16 with act = weight
// dtype and d, f multiples of 8) and moejit_gemm1_swiglu_simt (any dtypes;
// the reference) take (A, W1, h, offsets [E+1] int32, max_rows).
// moejit_gemm1_swiglu_wgmma and _wgmma_narrow (sm_90a only; the narrow one
// is a 64 x 128-B-row tile for decode and few rows an expert) take (TMA
// map of A, TMA map of W1, h, offsets, max_rows); their B tile is the gate
// box then the up box of the same h columns, so acc columns j and
// j + kTN/2 pair up in one thread.
// moejit_gemm1_swiglu_wgmma_gather (the spec tile, A rows gathered from x)
// and _wgmma_narrow_gather (the narrow tile, gathering) take (TMA map of
// W1, x, a_index, a_div, x_rows, h, offsets, max_rows).
// moejit_gemm1_swiglu_gemv (decode: weight streaming) takes what mma takes;
// moejit_layer_decode_gemm1 (the decode layer's first launch: routing
// included, rows read from x) takes (logits, bias, x, W1, h, topk_ids,
// topk_weights, tokens, counters, W2, prefetch).
#include "common/gemm_config.cuh"
#include "common/gemm_tiles.cuh"
#include "common/gemm_mainloop.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_simt.cuh"
#include "common/gemm_wgmma.cuh"
#include "common/gemm_gemv.cuh"
#include "common/route.cuh"

typedef mj_gemm_shape<kTileM, kTileN, kTileK, kStages, kWarps> Gemm1Shape;
enum : int { kG1HalfN = kTileN / 2 };  // h columns per n-tile
enum : int { kG1NTiles = (kExpertWidth + kG1HalfN - 1) / kG1HalfN };
enum : bool {
  kG1Mma = mj_same_type<act_t, weight_t>::value && mj_is_mma_type<act_t>::value &&
           (kWarps == 4 || kWarps == 8) && kHidden % 8 == 0 && kExpertWidth % 8 == 0
};

static_assert(kBlockThreads == kWarps * 32, "gemm1: kBlockThreads must be kWarps * 32");
static_assert(2LL * kExpertWidth * kHidden < (1LL << 31), "gemm1: one expert's W1 must fit int32 offsets");
static_assert((long long)kTileM * kHidden < (1LL << 31), "gemm1: an A tile must fit int32 offsets");

// Tile row r of B -> element offset of its W1 row inside the expert's W1
// (-1 past column f). Rows come in blocks of 8: even blocks gate, odd up.
struct mj_gemm1_b_rows {
  int h_col0;
  __device__ int operator()(int r) const {
    const int blk = r / 8;
    const int col = h_col0 + (blk / 2) * 8 + r % 8;
    if (col >= kExpertWidth) return -1;
    return ((blk & 1) ? kExpertWidth + col : col) * kHidden;
  }
};

template <typename AT, typename WT>
__device__ __forceinline__ void mj_gemm1_mma(const AT *__restrict__ a, const WT *__restrict__ w,
                                             AT *__restrict__ h, const int *__restrict__ offsets,
                                             int max_rows) {
  if constexpr (!kG1Mma) {
    __trap(); // the host launches the simt entry for these dtypes/shapes
  } else {
    typedef Gemm1Shape S;
    mj_gemm_check_smem<S>();
    mj_gemm_tile t;
    if (!mj_gemm_find_tile<kTileM, kBlockThreads, kExperts, kRaster>(offsets, max_rows, kG1NTiles, &t))
      return;
    const int h_col0 = t.n_tile * kG1HalfN;
    const bool keep = mj_keep_output<AT>(max_rows, kExpertWidth);
    mj_tile_loader<S, kTileM, kHidden> la;
    la.init(mj_a_rows<kHidden>{t.row_end - t.row0});
    mj_tile_loader<S, kTileN, kHidden> lb;
    lb.init(mj_gemm1_b_rows{h_col0});
    const mj_warp_pos p = mj_gemm_warp_pos<S>();
    float acc[S::kMi][S::kNi][4];
    mj_gemm_mainloop<S, kHidden>(la, a + (long long)t.row0 * kHidden, lb,
                                 w + (long long)t.expert * (2LL * kExpertWidth * kHidden),
                                 mj_smem_u32(mj_gemm_smem), p, acc);
    if (!mj_gemm_reduce_k<S>(reinterpret_cast<float *>(mj_gemm_smem), p, acc)) return;

    // n8 tiles 2q (gate) and 2q+1 (up) of this warp are h columns
    // h_col0 + n0/2 + 8q + 0..7 (n0 is a multiple of 16).
#pragma unroll
    for (int mi = 0; mi < S::kMi; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = t.row0 + p.m0 + mi * 16 + mj_acc_row(p.lane, half);
        mj_store_acc_row<AT, S::kNi / 2>(
            h + (long long)row * kExpertWidth, h_col0 + p.n0 / 2, kExpertWidth, row < t.row_end,
            [&](int q, float *v0, float *v1) {
              const float *g = &acc[mi][2 * q][2 * half];
              const float *u = &acc[mi][2 * q + 1][2 * half];
              *v0 = mj_silu(g[0]) * u[0];
              *v1 = mj_silu(g[1]) * u[1];
            },
            keep);
      }
    }
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_mma)
extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm1_swiglu_mma(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ h,
                        const int *__restrict__ offsets, int max_rows) {
  mj_gemm1_mma(a, w, h, offsets, max_rows);
}
#endif

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_simt)
extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm1_swiglu_simt(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ h,
                         const int *__restrict__ offsets, int max_rows) {
  mj_gemm_simt_for_each<kExperts, kExpertWidth>(offsets, max_rows, [&](int row, int e, int col) {
    const act_t *x = a + (long long)row * kHidden;
    const weight_t *gate_w = w + ((long long)e * 2 * kExpertWidth + col) * kHidden;
    const weight_t *up_w = gate_w + (long long)kExpertWidth * kHidden;
    const float gate = mj_gemm_dot<kHidden>(x, gate_w), up = mj_gemm_dot<kHidden>(x, up_w);
    mj_store1(h + (long long)row * kExpertWidth + col, mj_silu(gate) * up);
  });
}
#endif

// ---- decode: weight streaming (common/gemm_gemv.cuh) --------------------------

// A unit is C h columns: their gate rows and up rows of W1[e].
template <typename AT, typename WT, int C, bool kEvictFirst = false> struct mj_gemm1_gemv_unit {
  const AT *a; // permuted rows (mj_gemv_for_each) or x (mj_decode_for_each)
  const WT *w;
  AT *h;
  template <int R, class Rows> __device__ __forceinline__ void run_rows(int e, int g, const Rows &map) const {
    const int j0 = g * C;
    const WT *wr[2 * C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      wr[c] = w + ((long long)e * 2 * kExpertWidth + j0 + c) * kHidden;
      wr[C + c] = wr[c] + (long long)kExpertWidth * kHidden;
    }
    float acc[2 * C][R];
    mj_gemv_dot<AT, WT, kHidden, 2 * C, R, kEvictFirst>(wr, map, acc);
    const int lane = mj_lane_id();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= map.rows || lane != r) continue; // lane r stores row r
      float v[C];
#pragma unroll
      for (int c = 0; c < C; ++c) v[c] = mj_silu(acc[c][r]) * acc[C + c][r];
      mj_store_floats<AT, C>(h + (long long)map.out_row(r) * kExpertWidth + j0, v);
    }
  }
  template <int R> __device__ __forceinline__ void run(int e, int g, int row0, int rows) const {
    run_rows<R>(e, g, mj_gemv_rows_contig<AT, kHidden>{a, row0, rows});
  }
  template <int R, int kEntries>
  __device__ __forceinline__ void run(int e, int g, mj_decode_packed<kEntries> packed,
                                      int rows) const {
    run_rows<R>(e, g, mj_gemv_rows_entries<AT, kHidden, kTopK, kEntries>{a, packed, rows});
  }
};

template <typename AT, typename WT>
__device__ __forceinline__ void mj_gemm1_gemv(const AT *__restrict__ a, const WT *__restrict__ w,
                                              AT *__restrict__ h, const int *__restrict__ offsets,
                                              int max_rows) {
  if constexpr (!kGemvOk) {
    __trap(); // the host launches the simt entry for these dtypes/shapes
  } else {
    mj_gemv_for_each<kExperts>(offsets, max_rows, kExpertWidth / kGemv1Cols,
                               mj_gemm1_gemv_unit<AT, WT, kGemv1Cols>{a, w, h});
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_gemv)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_gemm1_swiglu_gemv(const act_t *__restrict__ a, const weight_t *__restrict__ w,
                             act_t *__restrict__ h, const int *__restrict__ offsets, int max_rows) {
  mj_gemm1_gemv(a, w, h, offsets, max_rows);
}
#endif

// ---- the decode layer: route + GEMM 1 + SwiGLU, then GEMM 2 + combine ------------
// tokens <= kDecodeMaxTokens and tokens * kTopK <= kEntries (kGemvPassRows
// for moejit_layer_decode_gemm1, kDecodeWideEntries for its _wide twin,
// kDecodeWide64Entries for _wide64; the host checks). Warp t of every block
// routes token t (common/route.cuh: the router kernel's code, so the same
// picks and weights to the bit); block 0 writes them out for the caller
// (and the second launch) and zeroes GEMM 2's column-group counters. h rows
// are entries (token-slot order), not expert-sorted rows. GEMM 1 units are
// kDecode1Cols columns (one: the shortest chain per warp).
// The second launch is templates/gemm2.cu: moejit_layer_decode_gemm2.
enum : int { kDecode1Cols = 1 };
enum : int { kDecode2Groups = kHidden / kGemv2Cols };  // counters of mj_decode2_unit
enum : bool {
  kDecodeOk = kGemvOk && kTopK <= kGemvPassRows && kGemvWarps * kTopK >= kGemvPassRows
};

// With `prefetch` the W2 rows of the active experts go to L2 (evict_last)
// before the GEMM 1 units: GEMM 2 then reads W2 from L2. The host asks for
// it only where they fit. GEMM 1's weights, read once, leave L2 first.
template <typename WT> struct mj_decode1_hook {
  const WT *w2;
  int prefetch;
  __device__ __forceinline__ void before(const int *list, int active) const {
    if (prefetch) mj_prefetch_experts_l2(w2, (long long)kHidden * kExpertWidth, list, active);
  }
  __device__ __forceinline__ void after(const int *, int) const {}
};

// Routes the tokens into ids/wt (shared, kEntries each); returns the entries.
template <int kEntries>
__device__ __forceinline__ int mj_decode_route(const logits_t *__restrict__ logits,
                                               const float *__restrict__ bias, int tokens, int *ids,
                                               float *wt, int *__restrict__ topk_ids,
                                               float *__restrict__ topk_weights,
                                               unsigned *__restrict__ counters) {
  const int entries = min(tokens * kTopK, kEntries);
  const int warp = threadIdx.x / 32, lane = mj_lane_id();
  if (warp * kTopK < entries) { // warp t routes token t
    int expert;
    float weight;
    route_token(logits + (long long)warp * kExperts, bias, lane, expert, weight);
    if (lane < kTopK) {
      ids[warp * kTopK + lane] = expert;
      wt[warp * kTopK + lane] = weight;
      if (blockIdx.x == 0) {
        topk_ids[warp * kTopK + lane] = expert;
        topk_weights[warp * kTopK + lane] = weight;
      }
    }
  }
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < kDecode2Groups; i += blockDim.x) counters[i] = 0u;
  __syncthreads();
  return entries;
}

template <int kEntries, typename AT, typename WT>
__device__ __forceinline__ void mj_decode_gemm1_units(const AT *__restrict__ x,
                                                      const WT *__restrict__ w, AT *__restrict__ h,
                                                      const int *ids, int entries,
                                                      const WT *__restrict__ w2, int prefetch) {
  mj_decode_for_each<kEntries>(ids, entries, kExpertWidth / kDecode1Cols,
                               mj_gemm1_gemv_unit<AT, WT, kDecode1Cols, true>{x, w, h},
                               mj_decode1_hook<WT>{w2, prefetch});
}

template <int kEntries>
__device__ __forceinline__ void mj_decode_gemm1(
    const logits_t *__restrict__ logits, const float *__restrict__ bias,
    const act_t *__restrict__ x, const weight_t *__restrict__ w, act_t *__restrict__ h,
    int *__restrict__ topk_ids, float *__restrict__ topk_weights, int tokens,
    unsigned *__restrict__ counters, const weight_t *__restrict__ w2, int prefetch) {
  if constexpr (!kDecodeOk) {
    __trap();  // the host keeps these shapes on the unfused layer
  } else {
    __shared__ int ids[kEntries];
    __shared__ float wt[kEntries];
    const int entries =
        mj_decode_route<kEntries>(logits, bias, tokens, ids, wt, topk_ids, topk_weights, counters);
    mj_decode_gemm1_units<kEntries>(x, w, h, ids, entries, w2, prefetch);
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm1)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_layer_decode_gemm1(const logits_t *__restrict__ logits, const float *__restrict__ bias,
                              const act_t *__restrict__ x, const weight_t *__restrict__ w,
                              act_t *__restrict__ h, int *__restrict__ topk_ids,
                              float *__restrict__ topk_weights, int tokens,
                              unsigned *__restrict__ counters, const weight_t *__restrict__ w2,
                              int prefetch) {
  mj_decode_gemm1<kGemvPassRows>(logits, bias, x, w, h, topk_ids, topk_weights, tokens, counters,
                                 w2, prefetch);
}
#endif

// Past kGemvPassRows entries (units of up to mj_decode_max_rows rows).
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm1_wide)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_layer_decode_gemm1_wide(const logits_t *__restrict__ logits,
                                   const float *__restrict__ bias, const act_t *__restrict__ x,
                                   const weight_t *__restrict__ w, act_t *__restrict__ h,
                                   int *__restrict__ topk_ids, float *__restrict__ topk_weights,
                                   int tokens, unsigned *__restrict__ counters,
                                   const weight_t *__restrict__ w2, int prefetch) {
  mj_decode_gemm1<kDecodeWideEntries>(logits, bias, x, w, h, topk_ids, topk_weights, tokens,
                                      counters, w2, prefetch);
}
#endif

// Past kDecodeWideEntries entries.
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm1_wide64)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_layer_decode_gemm1_wide64(const logits_t *__restrict__ logits,
                                     const float *__restrict__ bias, const act_t *__restrict__ x,
                                     const weight_t *__restrict__ w, act_t *__restrict__ h,
                                     int *__restrict__ topk_ids, float *__restrict__ topk_weights,
                                     int tokens, unsigned *__restrict__ counters,
                                     const weight_t *__restrict__ w2, int prefetch) {
  mj_decode_gemm1<kDecodeWide64Entries>(logits, bias, x, w, h, topk_ids, topk_weights, tokens,
                                        counters, w2, prefetch);
}
#endif

// ---- Hopper path (wgmma + TMA), sm_90a --------------------------------------

typedef mj_wg_shape<kTileM, kTileN, kTileK, kStages, kExperts, kSchedule> Gemm1Wg;
typedef mj_wg_narrow<kExperts> Gemm1WgNarrow;

// gather (kGather): A rows from x by index (common/gemm_wgmma.cuh,
// mj_wg_produce_gather) instead of the TMA map ta of a permuted copy.
// sync: rounds in step (common/gemm_wgmma.cuh, mj_wg_round), or NULL.
template <class S, int CM, int CN, bool kGather = false, class Gather = int>
__device__ __forceinline__ void mj_gemm1_wgmma(const mj_tmap *ta, const mj_tmap *tw,
                                               act_t *__restrict__ h,
                                               const int *__restrict__ offsets, int max_rows,
                                               const Gather *gather = nullptr,
                                               unsigned *sync = nullptr) {
#if MJ_WGMMA_AVAILABLE
  constexpr int kHalf = S::kTN / 2;  // h columns per n-tile
  constexpr int kNTiles = (kExpertWidth + kHalf - 1) / kHalf;
  if constexpr (!kG1Mma || !S::kFits || (CN == 2 && kNTiles % 2 != 0)) {
    __trap();  // the host launches another entry (or, pairs along N: rejects the spec)
  } else {
    mj_wg_check_smem<S>();
    // B rows of a tile: its gate rows in W1 [E*2f, d], and the up rows f further
    const auto w_rows = [](const mj_gemm_tile &t, int *gate, int *up) {
      *gate = t.expert * 2 * kExpertWidth + t.n_tile * kHalf;
      *up = *gate + kExpertWidth;
    };
    // GEMM 1 stores with the quad transpose (mj_store_acc_row), not through
    // staging buffers as GEMM 2 does: its epilogue's time is SwiGLU's, the
    // staged stores measured even here, and the gathering kernel spilled.
    const auto epi =
        [&](float(&acc)[S::kMB][S::kAcc], int c, const mj_gemm_tile &t, unsigned) {
          const int h_col0 = t.n_tile * kHalf;
          const bool keep = mj_keep_output<act_t>(max_rows, kExpertWidth);
#pragma unroll
          for (int mb = 0; mb < S::kMB; ++mb) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int row = t.row0 + S::row(c, mb, half);
              const float *g = &acc[mb][2 * half], *u = &acc[mb][4 * (kHalf / 8) + 2 * half];
              // rows at or past row_end: the next expert's, or past max_rows
              mj_store_acc_row<act_t, kHalf / 8>(
                  h + (long long)row * kExpertWidth, h_col0, kExpertWidth, row < t.row_end,
                  [&](int i, float *v0, float *v1) {
                    *v0 = mj_silu(g[4 * i]) * u[4 * i];
                    *v1 = mj_silu(g[4 * i + 1]) * u[4 * i + 1];
                  },
                  keep);
            }
          }
        };
    if constexpr (kGather)
      mj_wg_gemm<S, act_t, kHidden, true, kExperts, kRaster, CM, CN, true>(
          ta, tw, offsets, max_rows, kNTiles, w_rows, epi, gather);
    else
      mj_wg_gemm<S, act_t, kHidden, true, kExperts, kRaster, CM, CN>(
          ta, tw, offsets, max_rows, kNTiles, w_rows, epi, nullptr, sync);
  }
#else
  __trap(); // not an sm_90a build
#endif
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_wgmma)
extern "C" __global__ void __launch_bounds__(Gemm1Wg::kThreads, 1) __mj_wg_cluster_dims__(0)
    moejit_gemm1_swiglu_wgmma(const __grid_constant__ mj_tmap tmap_a,
                              const __grid_constant__ mj_tmap tmap_w, act_t *__restrict__ h,
                              const int *__restrict__ offsets, int max_rows,
                              unsigned *__restrict__ round_sync) {
  mj_gemm1_wgmma<Gemm1Wg, kWgCluster, kWgClusterN>(&tmap_a, &tmap_w, h, offsets, max_rows,
                                                   static_cast<const int *>(nullptr), round_sync);
}
#endif

// The spec tile reading A rows of x in place: row r of A is x row
// a_index[r] / a_div (< 0, or at or past x_rows: zeros); the layer passes
// align's sorted_slot and top_k, so the permuted copy of x is never made.
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_wgmma_gather)
extern "C" __global__ void __launch_bounds__(Gemm1Wg::kThreads, 1) __mj_wg_cluster_dims__(0)
moejit_gemm1_swiglu_wgmma_gather(const __grid_constant__ mj_tmap tmap_w, const act_t *__restrict__ x,
                                 const int *__restrict__ a_index, int a_div, int x_rows, act_t *__restrict__ h,
                                 const int *__restrict__ offsets, int max_rows) {
#if MJ_WGMMA_AVAILABLE
  if constexpr (kWgClusterN == 2) {
    __trap();  // pairs along N share A by TMA multicast; the host copies A (moejit_gemm1_swiglu)
  } else {
    const mj_wg_gather_src<act_t> g = {x, a_index, a_div, x_rows};
    mj_gemm1_wgmma<Gemm1Wg, kWgCluster, 1, true>(nullptr, &tmap_w, h, offsets, max_rows, &g);
  }
#else
  __trap(); // not an sm_90a build
#endif
}
#endif

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_wgmma_narrow)
extern "C" __global__ void __launch_bounds__(Gemm1WgNarrow::kThreads, 1)
moejit_gemm1_swiglu_wgmma_narrow(const __grid_constant__ mj_tmap tmap_a, const __grid_constant__ mj_tmap tmap_w,
                                 act_t *__restrict__ h, const int *__restrict__ offsets, int max_rows) {
  mj_gemm1_wgmma<Gemm1WgNarrow, 1, 1>(&tmap_a, &tmap_w, h, offsets, max_rows);
}
#endif

// The narrow tile reading A rows of x in place, as _wgmma_gather does.
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm1_swiglu_wgmma_narrow_gather)
extern "C" __global__ void __launch_bounds__(Gemm1WgNarrow::kThreads, 1)
    moejit_gemm1_swiglu_wgmma_narrow_gather(const __grid_constant__ mj_tmap tmap_w,
                                            const act_t *__restrict__ x,
                                            const int *__restrict__ a_index, int a_div, int x_rows,
                                            act_t *__restrict__ h, const int *__restrict__ offsets,
                                            int max_rows) {
#if MJ_WGMMA_AVAILABLE
  const mj_wg_gather_src<act_t> g = {x, a_index, a_div, x_rows};
  mj_gemm1_wgmma<Gemm1WgNarrow, 1, 1, true>(nullptr, &tmap_w, h, offsets, max_rows, &g);
#else
  __trap();  // not an sm_90a build
#endif
}
#endif
