// GEMM 2 of the MoE layer (down projection): for the permuted rows h of
// expert e (rows offsets[e] .. offsets[e+1]-1 of h [rows, f]),
//   y[row, :] = scale[row] * (h[row, :] * W2[e]^T)           -> y [rows, d]
// with W2 [E, d, f] as checkpoints store it; scale (fp32 per row, the
// router weight) is optional: NULL multiplies by 1.
//
// Entries: moejit_gemm2_mma (tensor cores; fp16/bf16 with act = weight
// dtype and d, f multiples of 8) and moejit_gemm2_simt (any dtypes; the
// reference) take (h, W2, y, offsets [E+1] int32, scale, max_rows).
// moejit_gemm2_wgmma and _wgmma_narrow (sm_90a only; the narrow one is a
// 64 x 128 tile for decode and few rows an expert) take (TMA map of h, TMA
// map of W2, y, offsets, scale, max_rows, ks_count, ks_part): the last
// two, scratch for the last round's K parts (mj_wg_ksplit), or both NULL.
// moejit_gemm2_gemv (decode: weight streaming) takes what mma takes;
// moejit_layer_decode_gemm2 (the decode layer's second launch: combine
// included) takes (h, W2, topk_ids, topk_weights, tokens, out, part,
// counters).
#include "common/gemm_config.cuh"
#include "common/gemm_tiles.cuh"
#include "common/gemm_mainloop.cuh"
#include "common/gemm_epilogue.cuh"
#include "common/gemm_simt.cuh"
#include "common/gemm_wgmma.cuh"
#include "common/gemm_gemv.cuh"

typedef mj_gemm_shape<kTileM, kTileN, kTileK, kStages, kWarps> Gemm2Shape;
enum : int { kG2NTiles = (kHidden + kTileN - 1) / kTileN };
enum : bool {
  kG2Mma = mj_same_type<act_t, weight_t>::value && mj_is_mma_type<act_t>::value &&
           (kWarps == 4 || kWarps == 8) && kHidden % 8 == 0 && kExpertWidth % 8 == 0
};

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
    const bool keep = mj_keep_output<AT>(max_rows, kHidden);
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
        const bool in = row < t.row_end;
        const float s = scale && in ? __ldg(scale + row) : 1.f;
        mj_store_acc_row<AT, S::kNi>(
            y + (long long)row * kHidden, n0 + p.n0, kHidden, in,
            [&](int ni, float *v0, float *v1) {
              *v0 = s * acc[mi][ni][2 * half];
              *v1 = s * acc[mi][ni][2 * half + 1];
            },
            keep);
      }
    }
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm2_mma)
extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm2_mma(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ y,
                 const int *__restrict__ offsets, const float *__restrict__ scale, int max_rows) {
  mj_gemm2_mma(a, w, y, offsets, scale, max_rows);
}
#endif

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm2_simt)
extern "C" __global__ void __launch_bounds__(kBlockThreads)
moejit_gemm2_simt(const act_t *__restrict__ a, const weight_t *__restrict__ w, act_t *__restrict__ y,
                  const int *__restrict__ offsets, const float *__restrict__ scale, int max_rows) {
  mj_gemm_simt_for_each<kExperts, kHidden>(offsets, max_rows, [&](int row, int e, int col) {
    const weight_t *w_row = w + ((long long)e * kHidden + col) * kExpertWidth;
    const float v = mj_gemm_dot<kExpertWidth>(a + (long long)row * kExpertWidth, w_row);
    mj_store1(y + (long long)row * kHidden + col, scale ? scale[row] * v : v);
  });
}
#endif

// ---- decode: weight streaming (common/gemm_gemv.cuh) --------------------------

// acc[c][r] = W2[e] row n0 + c . (row r of the map), for the kGemv2Cols
// columns of a GEMV unit (the plain and the decode layer's).
template <int R, typename AT, typename WT, class Rows>
__device__ __forceinline__ void mj_gemm2_gemv_dot(const WT *w, int e, int n0, const Rows &map,
                                                  float (&acc)[kGemv2Cols][R]) {
  const WT *wr[kGemv2Cols];
#pragma unroll
  for (int c = 0; c < kGemv2Cols; ++c) wr[c] = w + ((long long)e * kHidden + n0 + c) * kExpertWidth;
  mj_gemv_dot<AT, WT, kExpertWidth, kGemv2Cols, R>(wr, map, acc);
}

// A unit is kGemv2Cols y columns: those rows of W2[e].
template <typename AT, typename WT> struct mj_gemm2_gemv_unit {
  const AT *a;
  const WT *w;
  AT *y;
  const float *scale;
  template <int R> __device__ __forceinline__ void run(int e, int g, int row0, int rows) const {
    constexpr int C = kGemv2Cols;
    const int n0 = g * C;
    float acc[C][R];
    mj_gemm2_gemv_dot<R, AT, WT>(w, e, n0, mj_gemv_rows_contig<AT, kExpertWidth>{a, row0, rows}, acc);
    const int lane = mj_lane_id();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows || lane != r) continue; // lane r stores row r
      const float s = scale ? __ldg(scale + row0 + r) : 1.f;
      float v[C];
#pragma unroll
      for (int c = 0; c < C; ++c) v[c] = s * acc[c][r];
      mj_store_floats<AT, C>(y + (long long)(row0 + r) * kHidden + n0, v);
    }
  }
};

template <typename AT, typename WT>
__device__ __forceinline__ void mj_gemm2_gemv(const AT *__restrict__ a, const WT *__restrict__ w,
                                              AT *__restrict__ y, const int *__restrict__ offsets,
                                              const float *__restrict__ scale, int max_rows) {
  if constexpr (!kGemvOk) {
    __trap(); // the host launches the simt entry for these dtypes/shapes
  } else {
    mj_gemv_for_each<kExperts>(offsets, max_rows, kHidden / kGemv2Cols,
                               mj_gemm2_gemv_unit<AT, WT>{a, w, y, scale});
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm2_gemv)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_gemm2_gemv(const act_t *__restrict__ a, const weight_t *__restrict__ w,
                      act_t *__restrict__ y, const int *__restrict__ offsets,
                      const float *__restrict__ scale, int max_rows) {
  mj_gemm2_gemv(a, w, y, offsets, scale, max_rows);
}
#endif

// ---- the decode layer, second launch: GEMM 2 + combine --------------------------
// h rows are entries p = t * kTopK + j (moejit_layer_decode_gemm1). Units
// are GEMM 2's GEMV units (an active expert's entries x kGemv2Cols output
// columns), written as fp32 partial rows part[p] (no rounding to act_t).
// Each column group g has a counter (zeroed by the first launch): a unit
// adds its rows to it with a release, and the unit that brings it to all the
// entries combines the group: out[t, cols] = sum over j of weights[t, j] *
// part[t * kTopK + j, cols], in j order, fp32, then resets the counter. So
// the sum's order is fixed whichever unit finishes last: deterministic.

// A decode unit's sums: lane r (< rows) calls store(entry p of row r, its
// kGemv2Cols fp32 sums). Both forms of the second launch run it.
template <int R, typename AT, typename WT, int kEntries, class Store>
__device__ __forceinline__ void mj_decode2_sums_of(const AT *h, const WT *w, int e, int g,
                                                   mj_decode_packed<kEntries> packed, int rows,
                                                   const Store &store) {
  constexpr int C = kGemv2Cols;
  const int lane = mj_lane_id();
  const mj_gemv_rows_entries<AT, kExpertWidth, 1, kEntries> map{h, packed, rows};
  float acc[C][R];
  mj_gemm2_gemv_dot<R, AT, WT>(w, e, g * C, map, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows || lane != r) continue;  // lane r stores row r
    float v[C];
#pragma unroll
    for (int c = 0; c < C; ++c) v[c] = acc[c][r];
    store(map.out_row(r), v);
  }
}

// out[t, col] = sum over j of wt[p] * sum(p), p = t * kTopK + j, in j order,
// fp32: the one combine both forms share, so they give the same bits.
template <class Sum>
__device__ __forceinline__ float mj_decode2_combine(const float *wt, int t, const Sum &sum) {
  float v = 0.f;
#pragma unroll
  for (int j = 0; j < kTopK; ++j) {
    const int p = t * kTopK + j;
    v = fmaf(wt[p], sum(p), v);
  }
  return v;
}

template <typename AT, typename WT, typename OT> struct mj_decode2_unit {
  const AT *h;
  const WT *w;
  float *part;
  unsigned *counters;
  const float *wt; // shared: the entries' router weights
  OT *out;
  int entries;
  template <int R, int kEntries>
  __device__ __forceinline__ void run(int e, int g, mj_decode_packed<kEntries> packed,
                                      int rows) const {
    constexpr int C = kGemv2Cols;
    const int n0 = g * C, lane = mj_lane_id();
    mj_decode2_sums_of<R, AT, WT>(h, w, e, g, packed, rows, [&](int p, const float(&v)[C]) {
      mj_store_floats<float, C>(part + (long long)p * kHidden + n0, v);
    });
    // The warp's partials, ordered before lane 0's count by the warp
    // barrier, are released with it; the unit that completes the group
    // acquires every unit's partials with its count, and the barrier passes
    // them on to its other lanes (one gpu-scope atomic per unit, no fence
    // per lane).
    __syncwarp();
    unsigned done = 0;
    if (lane == 0) {
      asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                   : "=r"(done)
                   : "l"(counters + g), "r"((unsigned)rows)
                   : "memory");
      done += (unsigned)rows;
    }
    done = __shfl_sync(MJ_FULL_MASK, done, 0);
    if (done != (unsigned)entries) return;
    __syncwarp();
    const int t = lane / C, c = lane % C, tokens = entries / kTopK;
    if (t < tokens) {
      const float v = mj_decode2_combine(
          wt, t, [&](int p) { return __ldcg(part + (long long)p * kHidden + n0 + c); });
      mj_store1(out + (long long)t * kHidden + n0 + c, v);
    }
    if (lane == 0) counters[g] = 0u; // ready for the next forward
  }
};

// The block-combined form: a block takes whole column groups, the
// ceil(groups / gridDim) consecutive ones from blockIdx * that, and its
// warps run every active expert's unit of them in turn (unit i: active
// expert i % active of the block's group i / active; warp w takes i = w,
// w + 8, ...). Each unit puts its rows' sums in shared memory instead of
// fp32 partial rows in global memory, and after one barrier the block
// combines its groups with the same arithmetic in the same j order as
// mj_decode2_unit's last unit: the same bits, without the global counter's
// round trip and the partials' store and reload, whatever the active
// experts and however many units a warp runs. The host sizes the grid so
// that each warp runs as many units as the counters' form would
// (src/ops/layer.c, decode2_block_grid) and a block takes at most
// kDecode2MaxGroups groups (src/ops/gemm.h mirrors it:
// MJ_DECODE2_MAX_GROUPS); a grid that asks more keeps the counters.
enum : int { kDecode2MaxGroups = 32 };
template <int kEntries>
using mj_decode2_sums = float[kEntries][kDecode2MaxGroups * kGemv2Cols];

template <typename AT, typename WT, int kEntries>
struct mj_decode2_smem_unit {
  const AT *h;
  const WT *w;
  mj_decode2_sums<kEntries> *sums;
  int col0;  // the unit's first column in sums: its group's slot in the block * kGemv2Cols
  template <int R>
  __device__ __forceinline__ void run(int e, int g, mj_decode_packed<kEntries> packed,
                                      int rows) const {
    mj_decode2_sums_of<R, AT, WT>(h, w, e, g, packed, rows,
                                  [&](int p, const float(&v)[kGemv2Cols]) {
#pragma unroll
                                    for (int c = 0; c < kGemv2Cols; ++c)
                                      (*sums)[p][col0 + c] = v[c];
                                  });
  }
};

// out[t, g0 * C + col] for the block's `groups` groups from g0.
template <int kEntries, typename OT>
__device__ __forceinline__ void mj_decode2_block_combine(const mj_decode2_sums<kEntries> &sums,
                                                         const float *wt, int entries, int g0,
                                                         int groups, OT *__restrict__ out) {
  constexpr int C = kGemv2Cols;
  const int cols = groups * C, tokens = entries / kTopK;
  for (int i = threadIdx.x; i < tokens * cols; i += blockDim.x) {
    const int t = i / cols, col = i % cols;
    const float v = mj_decode2_combine(wt, t, [&](int p) { return sums[p][col]; });
    mj_store1(out + (long long)t * kHidden + g0 * C + col, v);
  }
}

template <int kEntries, typename AT, typename WT, typename OT>
__device__ __forceinline__ void mj_decode_gemm2(const AT *__restrict__ h, const WT *__restrict__ w,
                                                const int *__restrict__ topk_ids,
                                                const float *__restrict__ topk_weights, int tokens,
                                                OT *__restrict__ out, float *__restrict__ part,
                                                unsigned *__restrict__ counters,
                                                int block_combine) {
  static_assert(kDecodeMaxTokens <= 32 / kGemv2Cols,
                "decode gemm2: a warp combines a column group");
  if constexpr (!kGemvOk || kTopK > kGemvPassRows) {
    __trap(); // the host keeps these shapes on the unfused layer
  } else {
    __shared__ int ids[kEntries];
    __shared__ float wt[kEntries];
    __shared__ int list[kEntries], rows[kEntries], count;
    __shared__ mj_decode_packed<kEntries> packed[kEntries];
    __shared__ mj_decode2_sums<kEntries> sums;
    const int entries = min(tokens * kTopK, kEntries);
    if (threadIdx.x < entries) {
      ids[threadIdx.x] = __ldg(topk_ids + threadIdx.x);
      wt[threadIdx.x] = __ldg(topk_weights + threadIdx.x);
    }
    __syncthreads();
    const int active = mj_decode_experts<kEntries>(ids, entries, list, packed, rows, &count);
    constexpr int kGroups = kHidden / kGemv2Cols;
    const int per_block = (kGroups + (int)gridDim.x - 1) / (int)gridDim.x;
    if (block_combine && active > 0 && per_block <= kDecode2MaxGroups) {
      const int g0 = blockIdx.x * per_block;
      const int groups = max(0, min(per_block, kGroups - g0));
#pragma unroll 1
      for (int i = threadIdx.x / 32; i < groups * active; i += kGemvWarps) {
        const int slot = i / active, a = i % active;
        mj_gemv_run_upto<mj_decode_max_rows(kEntries)>(
            mj_decode2_smem_unit<AT, WT, kEntries>{h, w, &sums, slot * kGemv2Cols}, list[a],
            g0 + slot, packed[a], rows[a]);
      }
      __syncthreads();
      mj_decode2_block_combine<kEntries>(sums, wt, entries, g0, groups, out);
    } else {
      mj_decode_units<kEntries>(
          list, packed, rows, active, kGroups,
          mj_decode2_unit<AT, WT, OT>{h, w, part, counters, wt, out, entries});
    }
  }
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm2)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kDecode2BlocksPerSm)
    moejit_layer_decode_gemm2(const act_t *__restrict__ h, const weight_t *__restrict__ w,
                              const int *__restrict__ topk_ids,
                              const float *__restrict__ topk_weights, int tokens,
                              out_t *__restrict__ out, float *__restrict__ part,
                              unsigned *__restrict__ counters, int block_combine) {
  mj_decode_gemm2<kGemvPassRows>(h, w, topk_ids, topk_weights, tokens, out, part, counters,
                                 block_combine);
}
#endif

// Past kGemvPassRows entries (units of up to mj_decode_max_rows rows).
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm2_wide)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_layer_decode_gemm2_wide(const act_t *__restrict__ h, const weight_t *__restrict__ w,
                                   const int *__restrict__ topk_ids,
                                   const float *__restrict__ topk_weights, int tokens,
                                   out_t *__restrict__ out, float *__restrict__ part,
                                   unsigned *__restrict__ counters, int block_combine) {
  mj_decode_gemm2<kDecodeWideEntries>(h, w, topk_ids, topk_weights, tokens, out, part, counters,
                                      block_combine);
}
#endif

// Past kDecodeWideEntries entries.
#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_layer_decode_gemm2_wide64)
extern "C" __global__ void __launch_bounds__(kGemvThreads, kGemvBlocksPerSm)
    moejit_layer_decode_gemm2_wide64(const act_t *__restrict__ h, const weight_t *__restrict__ w,
                                     const int *__restrict__ topk_ids,
                                     const float *__restrict__ topk_weights, int tokens,
                                     out_t *__restrict__ out, float *__restrict__ part,
                                     unsigned *__restrict__ counters, int block_combine) {
  mj_decode_gemm2<kDecodeWide64Entries>(h, w, topk_ids, topk_weights, tokens, out, part, counters,
                                        block_combine);
}
#endif

// ---- Hopper path (wgmma + TMA), sm_90a --------------------------------------

// GEMM 2 stores through the consumer warps' staging buffers (mj_wg_store_rows)
typedef mj_wg_shape<kTileM, kTileN, kTileK, kStages, kExperts, kSchedule, 1> Gemm2Wg;
typedef mj_wg_narrow<kExperts, 1> Gemm2WgNarrow;

template <class S, int CM, int CN>
__device__ __forceinline__ void mj_gemm2_wgmma(const mj_tmap *ta, const mj_tmap *tw,
                                               act_t *__restrict__ y,
                                               const int *__restrict__ offsets,
                                               const float *__restrict__ scale, int max_rows,
                                               unsigned *ks_count, float *ks_part) {
#if MJ_WGMMA_AVAILABLE
  constexpr int kNTiles = (kHidden + S::kTN - 1) / S::kTN;
  if constexpr (!kG2Mma || !S::kFits || (CN == 2 && kNTiles % 2 != 0)) {
    __trap();  // the host launches another entry (or, pairs along N: rejects the spec)
  } else {
    mj_wg_check_smem<S>();
    const auto w_rows = [](const mj_gemm_tile &t, int *row0, int *unused) {
      *row0 = t.expert * kHidden + t.n_tile * S::kTN; // in W2 [E*d, f]
      *unused = 0;
    };
    mj_wg_gemm<S, act_t, kExpertWidth, false, kExperts, kRaster, CM, CN>(
        ta, tw, offsets, max_rows, kNTiles, w_rows,
        [&](float(&acc)[S::kMB][S::kAcc], int c, const mj_gemm_tile &t, unsigned buf) {
          const bool keep = mj_keep_output<act_t>(max_rows, kHidden);
#pragma unroll
          for (int mb = 0; mb < S::kMB; ++mb) {
            float sc[2];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int row = t.row0 + S::row(c, mb, half);
              // not the next expert's rows, nor past max_rows
              sc[half] = scale && row < t.row_end ? __ldg(scale + row) : 1.f;
            }
            const float *a = acc[mb];
            mj_wg_store_rows<act_t, S::kTN / 8>(
                y, kHidden, t.row0 + S::warp_row(c, mb), t.row_end, t.n_tile * S::kTN, kHidden, buf,
                [&](int i, int half, float *v0, float *v1) {
                  *v0 = sc[half] * a[4 * i + 2 * half];
                  *v1 = sc[half] * a[4 * i + 2 * half + 1];
                },
                keep);
          }
        },
        nullptr, nullptr, mj_wg_ksplit{ks_count, reinterpret_cast<float4 *>(ks_part)});
  }
#else
  __trap(); // not an sm_90a build
#endif
}

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm2_wgmma)
extern "C" __global__ void __launch_bounds__(Gemm2Wg::kThreads, 1) __mj_wg_cluster_dims__(0)
    moejit_gemm2_wgmma(const __grid_constant__ mj_tmap tmap_a,
                       const __grid_constant__ mj_tmap tmap_w, act_t *__restrict__ y,
                       const int *__restrict__ offsets, const float *__restrict__ scale,
                       int max_rows, unsigned *ks_count, float *ks_part) {
  mj_gemm2_wgmma<Gemm2Wg, kWgCluster, kWgClusterN>(&tmap_a, &tmap_w, y, offsets, scale, max_rows,
                                                   ks_count, ks_part);
}
#endif

#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_moejit_gemm2_wgmma_narrow)
extern "C" __global__ void __launch_bounds__(Gemm2WgNarrow::kThreads, 1)
    moejit_gemm2_wgmma_narrow(const __grid_constant__ mj_tmap tmap_a,
                              const __grid_constant__ mj_tmap tmap_w, act_t *__restrict__ y,
                              const int *__restrict__ offsets, const float *__restrict__ scale,
                              int max_rows, unsigned *ks_count, float *ks_part) {
  mj_gemm2_wgmma<Gemm2WgNarrow, 1, 1>(&tmap_a, &tmap_w, y, offsets, scale, max_rows, ks_count,
                                      ks_part);
}
#endif
