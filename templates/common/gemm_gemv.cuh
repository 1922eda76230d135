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
#include "common/l2.cuh"
#include "common/warp.cuh"

// The dtypes and shapes the path takes (src/ops: mj_gemm_gemv_blocker).
enum : bool {
  kGemvOk = mj_same_type<act_t, weight_t>::value && mj_is_mma_type<act_t>::value &&
            kHidden % 8 == 0 && kExpertWidth % 8 == 0
};

enum : int { kGemvWarps = 8 };
enum : int { kGemvThreads = kGemvWarps * 32 };
// Resident blocks an SM the GEMV kernels are built for (their launch bounds;
// src/ops/gemm.h mirrors it: MJ_GEMV_BLOCKS_PER_SM caps their grids).
enum : int { kGemvBlocksPerSm = 2 };
enum : int { kGemvPassRows = 8 };  // rows of one expert per pass over its weights
enum : int { kGemv1Cols = 2 };     // GEMM 1: h columns per unit (gate + up rows: 4)
enum : int { kGemv2Cols = 4 };     // GEMM 2: y columns per unit (W2 rows: 4)

// 16 weight bytes, read once: not allocated in L1, which keeps the rows.
__device__ __forceinline__ uint4 mj_ld_stream(const void *p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// The same load with the L2 policy `policy` (mj_l2_evict_first): weights
// streamed once leave L2 first, so lines kept for later (the decode layer's
// prefetched W2) stay.
__device__ __forceinline__ uint4 mj_ld_stream(const void *p, unsigned long long policy) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(policy));
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

// ---- the decode layer's entries -------------------------------------------------
// The decode layer (below) takes T <= kDecodeMaxTokens tokens (warp t of a
// block routes token t) and at most kEntries token-slot entries p = t * k +
// j: kGemvPassRows (8) in its first pair of entries, kDecodeWideEntries
// (32) in its wide pair, which the host launches past 8 entries, and
// kDecodeWide64Entries (64: 8 tokens of top-8) in its _wide64 pair, past 32
// (src/ops/gemm.h mirrors them: MJ_DECODE_*; include/moejit/layer.h the
// reach, MOEJIT_DECODE_MAX_*). Each pair is built for its most entries
// (larger units, more shared memory), so a smaller T keeps a smaller pair.
enum : int { kDecodeMaxTokens = kGemvWarps };
enum : int { kDecodeWideEntries = 32, kDecodeWide64Entries = 64 };

// An expert's rows among the entries (at most one a token): their entry
// indices, ascending, kBits each: 4 in 32 bits up to 16 entries, else 5 (up
// to 32) or 6 (up to 64) in 64 bits.
template <int kEntries>
struct mj_decode_packed {
  typedef typename mj_if<(kEntries <= 16), unsigned, unsigned long long>::type word;
  enum : int { kBits = kEntries <= 16 ? 4 : kEntries <= 32 ? 5 : 6 };
  static_assert(kEntries <= 64 && kDecodeMaxTokens * kBits <= 8 * (int)sizeof(word),
                "decode: an expert's entries must fit the packed word");
  word v;
  __device__ __forceinline__ int entry(int r) const {
    return (int)((v >> (kBits * r)) & (word)((1u << kBits) - 1u));
  }
};

// Where a unit's rows live. A row map gives row r's A row (rows r >= rows
// repeat the last row; the caller drops them) and the output row it lands
// in. Contiguous: rows row0.. of a permuted A (align's layout). Entries: the
// decode layer's rows are token-slot entries p = t * kTopK + j (at most
// kGemvPassRows, packed 4 bits each, ascending), read from x[t] directly and
// written to output row p, so no permutation runs.
template <typename AT, int K> struct mj_gemv_rows_contig {
  const AT *a;
  int row0, rows;
  __device__ __forceinline__ const AT *a_row(int r) const {
    return a + (long long)(row0 + (r < rows ? r : rows - 1)) * K;
  }
  __device__ __forceinline__ int out_row(int r) const { return row0 + r; }
  __device__ __forceinline__ uint4 load(int r, int off) const {
    return __ldg(reinterpret_cast<const uint4 *>(a_row(r) + off));
  }
};

// DIV: entries per A row (kTopK where A is x [T, d]; 1 where A has a row
// per entry, as h of the decode layer).
template <typename AT, int K, int DIV, int kEntries>
struct mj_gemv_rows_entries {
  const AT *x;
  mj_decode_packed<kEntries> packed;
  int rows;
  __device__ __forceinline__ int out_row(int r) const {
    return packed.entry(r < rows ? r : rows - 1);
  }
  __device__ __forceinline__ const AT *a_row(int r) const {
    return x + (long long)(out_row(r) / DIV) * K;
  }
  __device__ __forceinline__ uint4 load(int r, int off) const {
    return __ldg(reinterpret_cast<const uint4 *>(a_row(r) + off));
  }
};

// acc[n][r] = lane's part of w[n] . (row r of the map) over K. Weight chunks
// of kBatch iterations are all in flight before the first multiply.
template <typename AT, typename WT, int K, int NW, int R, bool kEvictFirst = false, class Rows>
__device__ __forceinline__ void mj_gemv_dot(const WT *const (&w)[NW], const Rows &map,
                                            float (&acc)[NW][R]) {
  const unsigned long long policy = kEvictFirst ? mj_l2_evict_first() : 0ull;
  constexpr int kChunks = K / 8;
  constexpr int kIters = (kChunks + 31) / 32;
  constexpr int kWant = R <= 2 ? 4 : R <= 4 ? 2 : 1;
  constexpr int kBatch = kIters < kWant ? kIters : kWant;
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
      for (int n = 0; n < NW; ++n)
        wv[b][n] = !ok ? make_uint4(0, 0, 0, 0)
                       : kEvictFirst ? mj_ld_stream(w[n] + c * 8, policy) : mj_ld_stream(w[n] + c * 8);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int c = lane + 32 * (i0 + b);
      if (!(i0 + b < kIters && (kChunks % 32 == 0 || c < kChunks))) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float af[8];
        mj_unpack8<AT>(map.load(r, c * 8), af);
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

// unit.run<R>(e, g, where, rows) with R the power of two >= rows (1, 2, 4
// or 8, at most MAX: only those unit sizes are built): `where` is the first
// row (permuted rows) or the packed entries.
template <int MAX, class Unit, typename Where>
__device__ __forceinline__ void mj_gemv_run_upto(const Unit &unit, int e, int g, Where where,
                                                 int rows) {
  if (MAX == 1 || rows == 1)
    unit.template run<1>(e, g, where, rows);
  else if (MAX == 2 || rows == 2)
    unit.template run<2>(e, g, where, rows);
  else if (MAX == 4 || rows <= 4)
    unit.template run<4>(e, g, where, rows);
  else
    unit.template run<8>(e, g, where, rows);
}

template <class Unit, typename Where>
__device__ __forceinline__ void mj_gemv_run(const Unit &unit, int e, int g, Where where, int rows) {
  mj_gemv_run_upto<8>(unit, e, g, where, rows);
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
    for (int row0 = first, rows; row0 < end; row0 += rows) { /* row0 + rows <= end: no wrap */
      rows = end - row0 < kGemvPassRows ? end - row0 : kGemvPassRows;
      mj_gemv_run(unit, e, g, row0, rows);
    }
  }
}

// ---- the decode layer (moejit_layer_decode_gemm1 / _gemm2, and _wide) ------
// At T * k <= kDecodeWideEntries entries of T <= kDecodeMaxTokens tokens
// (the first pair of entries up to kGemvPassRows) the whole layer is two
// launches: GEMM 1
// routes the tokens itself (every block, the same bits) and reads x rows
// directly; GEMM 2 writes fp32 partial rows per entry and the warp that
// completes a column group combines it. No align, no permutation, no
// combine launch (docs/layer.md, "Decode").

// The unit sizes the decode layer builds for kEntries entries: an expert
// holds one row per token at most (its k picks are distinct experts), so
// min(kDecodeMaxTokens, kEntries / kTopK) rows, rounded up to the unit
// sizes (powers of two). For the first pair (8 entries) that is 1 where
// k >= 5, so only one-row units are built there.
__host__ __device__ constexpr int mj_decode_max_rows(int entries) {
  return mj_pow2_ceil(entries / kTopK < kDecodeMaxTokens
                          ? (entries / kTopK > 0 ? entries / kTopK : 1)
                          : kDecodeMaxTokens);
}
enum : int { kDecodeMaxRows = mj_decode_max_rows(kGemvPassRows) };

// Resident blocks an SM the decode layer's GEMM 2 launch is built for
// (src/ops/gemm.h mirrors it: mj_decode2_blocks_per_sm): four where its
// units are one row, whose code then fits 64 registers, and number at most
// 4096 (8 experts x kHidden / kGemv2Cols, kHidden <= 2048): qwen3-30b-a3b
// and olmoe-1b-7b then have one unit a warp, all of GEMM 2's W2 loads in
// flight in one round on an H100. kGemvBlocksPerSm (two) otherwise
// (deepseek-v3's 14336 units ran 2 µs slower at four).
enum : int {
  kDecode2BlocksPerSm =
      kDecodeMaxRows == 1 && kHidden / kGemv2Cols * kGemvPassRows <= 4096 ? 4 : kGemvBlocksPerSm
};

// Packs the entries of `same` (bit p: entry p holds the expert; at most
// one a token, so at most kDecodeMaxTokens bits) ascending; *n: how many.
template <int kEntries, typename Mask>
__device__ __forceinline__ typename mj_decode_packed<kEntries>::word mj_decode_pack(Mask same,
                                                                                    int *n) {
  typedef typename mj_decode_packed<kEntries>::word word;
  word p = 0;
  int i = 0;
  for (Mask m = same; m != 0 && i < kDecodeMaxTokens; ++i, m &= m - 1)
    p |= (word)(__ffsll((long long)m) - 1) << (mj_decode_packed<kEntries>::kBits * i);
  *n = i;
  return p;
}

// The active experts of the entries, in order of first appearance, each
// with its entries packed (mj_gemv_rows_entries) and its row count; returns
// how many. ids: shared, `entries` of them (<= kEntries <= 64); every
// thread calls it.
template <int kEntries>
__device__ __forceinline__ int mj_decode_experts(const int *ids, int entries, int *list,
                                                 mj_decode_packed<kEntries> *packed, int *rows,
                                                 int *count) {
  if constexpr (kEntries > 32) {
    // Past a warp's 32 lanes: lane l holds entries l and l + 32, and each
    // finds the entries of its expert by comparing every id (a shared
    // broadcast each); the first entry of an expert lists it.
    if (threadIdx.x < 32) {
      const int lane = mj_lane_id();
      int id[2];
      bool first[2];
      unsigned long long same[2] = {0ull, 0ull};
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int p = lane + 32 * s;
        id[s] = p < entries ? ids[p] : -1;
        if (id[s] < 0 || id[s] >= kExperts) id[s] = -1;  // matches no id
      }
#pragma unroll 8
      for (int q = 0; q < entries; ++q) {
        const int v = ids[q];
#pragma unroll
        for (int s = 0; s < 2; ++s) same[s] |= (unsigned long long)(v == id[s]) << q;
      }
      unsigned firsts[2];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        first[s] = id[s] >= 0 && __ffsll((long long)same[s]) - 1 == lane + 32 * s;
        firsts[s] = __ballot_sync(MJ_FULL_MASK, first[s]);
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        if (!first[s]) continue;
        const int at = (s ? __popc(firsts[0]) : 0) + __popc(firsts[s] & mj_lanemask_lt());
        int n;
        packed[at].v = mj_decode_pack<kEntries>(same[s], &n);
        list[at] = id[s], rows[at] = n;
      }
      if (lane == 0) *count = __popc(firsts[0]) + __popc(firsts[1]);
    }
    __syncthreads();
    return *count;
  }
  if (threadIdx.x < 32) {
    const int lane = mj_lane_id();
    const int id = lane < entries ? ids[lane] : -1;
    const bool valid = lane < entries && id >= 0 && id < kExperts;
    // invalid ids and padding share the value kExperts (only valid lanes use
    // their mask), so the warp holds at most 9 distinct values, where
    // match.any is cheap; ballots (mj_match_any_bits) measured even under
    // ncu and up to 1 µs slower in olmoe-1b-7b's layer at T = 1
    const unsigned same = __match_any_sync(MJ_FULL_MASK, valid ? id : kExperts);
    const bool first = valid && __ffs(same) - 1 == lane;
    const unsigned firsts = __ballot_sync(MJ_FULL_MASK, first);
    if (first) {
      const int at = __popc(firsts & mj_lanemask_lt());
      int n;
      packed[at].v = mj_decode_pack<kEntries>(same, &n);
      list[at] = id, rows[at] = n;
    }
    if (lane == 0) *count = __popc(firsts);
  }
  __syncthreads();
  return *count;
}

// The persistent loop of the decode GEMMs: unit u = (active expert u /
// groups, column group u % groups), spread as mj_gemv_for_each spreads
// them. hook.before(list, active) runs first, hook.after(list, active) when
// the warp has no unit left.
struct mj_decode_no_hook {
  __device__ __forceinline__ void before(const int *, int) const {}
  __device__ __forceinline__ void after(const int *, int) const {}
};

// The loop over units of experts already found (mj_decode_experts).
template <int kEntries, class Unit>
__device__ __forceinline__ void mj_decode_units(const int *list,
                                                const mj_decode_packed<kEntries> *packed,
                                                const int *rows, int active, int groups,
                                                const Unit &unit) {
  const int units = active * groups;
  const int stride = gridDim.x * kGemvWarps;
#pragma unroll 1
  for (int u = blockIdx.x + gridDim.x * (threadIdx.x / 32); u < units; u += stride) {
    const int a = u / groups;
    mj_gemv_run_upto<mj_decode_max_rows(kEntries)>(unit, list[a], u % groups, packed[a], rows[a]);
  }
}

template <int kEntries, class Unit, class Hook = mj_decode_no_hook>
__device__ __forceinline__ void mj_decode_for_each(const int *ids, int entries, int groups,
                                                   const Unit &unit, const Hook &hook = Hook()) {
  __shared__ int list[kEntries], rows[kEntries], count;
  __shared__ mj_decode_packed<kEntries> packed[kEntries];
  const int active = mj_decode_experts<kEntries>(ids, entries, list, packed, rows, &count);
  hook.before(list, active);
  mj_decode_units(list, packed, rows, active, groups, unit);
  hook.after(list, active);
}

// Pulls the W2 rows of the active experts into L2 (evict_last), one
// 128-byte line per thread and step over the whole grid: the decode layer's
// GEMM 2 then reads them from L2 while GEMM 1's weights stream past.
template <typename WT>
__device__ __forceinline__ void mj_prefetch_experts_l2(const WT *w, long long expert_elems,
                                                       const int *list, int active) {
  const long long lines = (expert_elems * (long long)sizeof(WT) + 127) / 128;
  const long long total = lines * active, step = (long long)gridDim.x * blockDim.x;
#pragma unroll 1
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
    const long long a = i / lines, l = i - a * lines;
    const char *p = reinterpret_cast<const char *>(w + list[a] * expert_elems) + l * 128;
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
  }
}

#endif
