// The Hopper (sm_90a) grouped-GEMM core shared by gemm1 and gemm2: wgmma
// fed by TMA (cp.async.bulk.tensor, 128-byte swizzle) through an mbarrier
// pipeline, one producer warpgroup and one or two consumer warpgroups.
// Design notes (pipeline, swizzle, descriptors, limits): docs/gemm.md.
// src/ops/gemm_plan.c mirrors mj_wg_shape on the host (grid, block, shared
// memory, TMA boxes): keep the two in step; the kernel traps when launched
// with less dynamic shared memory than kSmemBytes.
#ifndef MOEJIT_COMMON_GEMM_WGMMA_CUH
#define MOEJIT_COMMON_GEMM_WGMMA_CUH

#include "common/gemm_epilogue.cuh"
#include "common/gemm_mainloop.cuh"
#include "common/gemm_tiles.cuh"
#include "common/gemm_wgmma_mma.cuh"

// A CUtensorMap as a kernel parameter (NVRTC has no cuda.h): 128 opaque
// bytes, 64-byte aligned. Passed by value as a __grid_constant__ parameter.
struct alignas(64) mj_tmap {
  unsigned long long opaque[16];
};

// wgmma and setmaxnreg exist only on the arch-specific sm_90a target; other
// targets compile the entries as traps (the host never launches them there).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MJ_WGMMA_AVAILABLE 1
#else
#define MJ_WGMMA_AVAILABLE 0
#endif

// Dynamic shared memory the pipeline may take: the H100 opt-in limit (227
// KiB) less 1 KiB for static shared memory.
enum : int { kWgSmemBudget = 232448 - 1024 };

// The epilogue's staging buffer of each consumer warp (mj_wg_store_rows):
// 16 rows x 64 columns of a 2-byte type, rows 144 bytes apart (16 bytes of
// padding: the 8 rows that one stmatrix matrix or 8 lanes' reads touch fall
// in 8 distinct 16-byte bank groups).
enum : int { kWgEpiRowBytes = 144, kWgEpiWarpBytes = 16 * kWgEpiRowBytes };

// Stages: the spec's bytes of K in flight (stages * tile_k) in 64-wide
// k-tiles, 2..16, fewer when they would not fit the budget beside `extra`
// bytes (the persistent scheduler's per-expert tile table).
__host__ __device__ constexpr int mj_wg_stages(int want, int stage_bytes, int extra) {
  int s = want < 2 ? 2 : (want > 16 ? 16 : want);
  while (s > 2 && 1024 + s * (stage_bytes + 16) + extra > kWgSmemBudget) --s;
  return s;
}

// Group starts the scheduler keeps in shared memory (mj_wg_build_groups).
__host__ __device__ constexpr int mj_wg_group_slots(int experts) {
  return 2 * experts + 2;
}

// Bytes of the tile table: the first M-tile of each expert, [EXPERTS + 1]
// ints, then mj_wg_group_slots group starts, rounded up to 16.
__host__ __device__ constexpr int mj_wg_table_bytes(int experts) {
  return ((experts + 1 + mj_wg_group_slots(experts)) * 4 + 15) / 16 * 16;
}

// The CTA shape of the wgmma kernel for a spec tile TM x TN x TK, STAGES.
// Rows: at least 64 (wgmma's M). Cooperative (PP = 0): 128 or 256 rows are
// split over two consumer warpgroups. Ping-pong (PP = 1): two consumer
// warpgroups, each computing whole tiles, alternate tiles, so one stores
// while the other multiplies. K-tiles are 64 elements: one 128-byte swizzle
// atom per row.
template <int TM, int TN, int TK, int STAGES, int EXPERTS, int PP = 0, int EPI = 0>
struct mj_wg_shape {
  enum : int { kTM = TM < 64 ? 64 : TM };
  enum : bool { kPingPong = PP != 0 };
  enum : int { kConsumers = PP || kTM >= 128 ? 2 : 1 };
  enum : int { kWgRows = PP ? kTM : kTM / kConsumers };  // rows per consumer warpgroup
  enum : int { kMB = kWgRows / 64 };                     // m64 blocks per consumer
  enum : int { kTN = TN };                               // B rows (gemm1: gate + up)
  enum : int { kTK = 64 };
  enum : int { kThreads = 128 * (1 + kConsumers) };
  enum : int { kStageA = kTM * 128, kStageB = kTN * 128 };
  enum : int { kStageBytes = kStageA + kStageB };
  // the tile table, after (ping-pong) the two warpgroups' order barriers
  enum : int { kTableBytes = mj_wg_table_bytes(EXPERTS) + (PP ? 16 : 0) };
  // EPI = 1: a staging buffer per consumer warp for mj_wg_store_rows
  enum : int { kEpiBytes = EPI ? kConsumers * 4 * kWgEpiWarpBytes : 0 };
  enum : int { kStages = mj_wg_stages(STAGES * TK / 64, kStageBytes, kEpiBytes + kTableBytes) };
  // +1024: the tiles start at the next 1024-byte boundary (swizzle atoms);
  // then the epilogue's staging buffers; 16 bytes per stage: its full and
  // empty mbarriers; then the tile table.
  enum : int { kSmemBytes = 1024 + kStages * (kStageBytes + 16) + kEpiBytes + kTableBytes };
  enum : int { kAcc = kTN / 2 };  // fp32 accumulators per thread per m64 block
  // Cooperative 256-row tiles multiply and load only the m64 blocks that
  // hold rows of the tile's expert: a consumer whose 128 rows end within its
  // first block runs one block, one without rows waits out the tile
  // (docs/gemm.md, "256-row tiles"). A comes in boxes of 64 rows there, one
  // per block that holds rows (src/ops/gemm_plan.c: wg_box_a_rows).
  enum : bool { kBlockSkip = !PP && kMB == 2 };
  enum : int { kBoxA = kBlockSkip ? 64 : kTM };
  // The register budget: at most 128 accumulators per consumer thread.
  enum : bool { kFits = kMB * kTN <= 256 && kTN >= 32 && kTN <= 256 && kTN % 32 == 0 };

  // Tile row of accumulator pair `half` (0, 1) of m64 block mb of consumer c
  // (the m64nNk16 accumulator layout: thread
  // t of the warpgroup holds rows 16*(t/32) + (t%32)/4 (+8), columns
  // 8*i + 2*(t%4) (+1), in acc[4*i + 2*half + 0..1]).
  __device__ static int row(int c, int mb, int half) {
    return warp_row(c, mb) + ((threadIdx.x & 31) >> 2) + half * 8;
  }
  // The first of the 16 rows of m64 block mb that this thread's warp holds.
  __device__ static int warp_row(int c, int mb) {
    return (PP ? 0 : c * kWgRows) + mb * 64 + ((threadIdx.x & 127) >> 5) * 16;
  }
};

// The narrow decode tile: 64 x 128, 8 stages of 64-wide k-tiles, one
// consumer warpgroup (src/ops/gemm_plan.c: MJ_WG_NARROW_*).
template <int EXPERTS, int EPI = 0>
using mj_wg_narrow = mj_wg_shape<64, 128, 64, 8, EXPERTS, 0, EPI>;

// The spec's cluster_m (MJ_CLUSTER_M, from the GEMM prelude): 2 pairs CTAs
// along M, which share each weight tile by TMA multicast (sm_90a only); the
// spec-tile entries then carry the cluster shape through
// __mj_wg_cluster_dims__, named like an attribute so that codegen's entry
// scan reads it as one.
// The spec's cluster_n (MJ_CLUSTER_N): 2 pairs CTAs along N instead, which
// compute the same M-tile against two consecutive n-tiles and share each A
// tile the same way. The host rejects both at once (spec_check.c).
#if defined(MJ_CLUSTER_M) && defined(MJ_CLUSTER_N) && MJ_CLUSTER_M == 2 && MJ_CLUSTER_N == 2
#error "cluster_m and cluster_n cannot both be 2"
#endif
#if MJ_WGMMA_AVAILABLE && MJ_CLUSTER_M == 2
enum : int { kWgCluster = 2, kWgClusterN = 1 };
#define __mj_wg_cluster_dims__(unused) __cluster_dims__(2, 1, 1)
#elif MJ_WGMMA_AVAILABLE && MJ_CLUSTER_N == 2
enum : int { kWgCluster = 1, kWgClusterN = 2 };
#define __mj_wg_cluster_dims__(unused) __cluster_dims__(2, 1, 1)
#else
enum : int { kWgCluster = 1, kWgClusterN = 1 };
#define __mj_wg_cluster_dims__(unused)
#endif

#if MJ_WGMMA_AVAILABLE

// ---- mbarriers ----------------------------------------------------------

__device__ __forceinline__ void mj_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mj_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mj_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// ---- thread-block clusters ------------------------------------------------

__device__ __forceinline__ unsigned mj_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned mj_cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned mj_cluster_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
// All non-exited threads of the cluster (not .aligned: the producer warp
// reaches it with one thread).
__device__ __forceinline__ void mj_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// Arrives on the mbarrier at shared offset `bar` of cluster CTA `rank`
// with the default semantics (release at CTA scope): the stage's readers are
// wgmmas already waited for, so nothing wider needs ordering.
__device__ __forceinline__ void mj_mbar_arrive_cluster(unsigned bar, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// Waits until the phase of parity `parity` has completed (a fresh barrier
// is in phase 0: waiting for parity 1 returns at once).
__device__ __forceinline__ void mj_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA ----------------------------------------------------------------

__device__ __forceinline__ void mj_tma_prefetch(const mj_tmap *map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map))
               : "memory");
}

// Box at (k0, row0) of a 2-D map (k innermost) into shared memory at dst,
// completing `box bytes` of transactions on bar. Out-of-range elements
// (rows past the tensor, k past K) arrive as zeros and still count.
__device__ __forceinline__ void mj_tma_load_2d(unsigned dst, const mj_tmap *map, int k0, int row0,
                                               unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k0), "r"(row0), "r"(bar)
      : "memory");
}

// mj_tma_load_2d into the same shared offset of every CTA in `mask` (bit r:
// cluster rank r), completing the bytes on each one's mbarrier at `bar`.
__device__ __forceinline__ void mj_tma_load_2d_multicast(unsigned dst, const mj_tmap *map, int k0,
                                                         int row0, unsigned bar, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k0), "r"(row0), "r"(bar), "h"(mask)
      : "memory");
}

// ---- wgmma --------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major tile stored as 128-byte rows
// by TMA's 128-byte swizzle: start address >> 4 (bits 0-13), leading byte
// offset 1 (unused for swizzled K-major), stride byte offset 1024 >> 4 (8
// rows of 128 bytes, bits 32-45), base offset 0 (tiles are 1024-aligned),
// swizzle mode 1 = 128B (bits 62-63). The k16 step s of a 64-wide atom starts
// s * 32 bytes further; the hardware applies the XOR on the full address.
__device__ __forceinline__ unsigned long long mj_wg_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void mj_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void mj_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void mj_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulators while a wgmma owns them.
template <int N> __device__ __forceinline__ void mj_wg_pin(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(a[i])::"memory");
}

template <int N> __device__ __forceinline__ void mj_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void mj_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

// ---- the kernel core ------------------------------------------------------

// Shared memory layout from the 1024-aligned base: kStages A tiles
// [kTM][64], kStages B tiles [kTN][64] (each row 128 swizzled bytes), the
// consumer warps' epilogue staging buffers (kWgEpiWarpBytes each, warp w of
// consumer c at c * 4 + w), then full[kStages] and empty[kStages] mbarriers
// (8 bytes each), then the tile table (int [EXPERTS + 1], then the group
// starts: mj_wg_table_bytes).
template <class S> struct mj_wg_smem {
  unsigned a, b, full, empty, order, table;
  __device__ explicit mj_wg_smem(unsigned raw) {
    a = (raw + 1023u) & ~1023u;
    b = a + S::kStages * S::kStageA;
    full = b + S::kStages * S::kStageB + S::kEpiBytes;
    empty = full + S::kStages * 8;
    order = empty + S::kStages * 8;                  // ping-pong: done[2]
    table = order + (S::kPingPong ? 16 : 0);
  }
  // the staging buffer of warp w of consumer c (the buffers end at full)
  __device__ unsigned epi(int c, int w) const {
    return full - S::kEpiBytes + (unsigned)((c * 4 + w) * kWgEpiWarpBytes);
  }
};

// ---- the persistent tile scheduler ----------------------------------------
// Work items are (M-tile, n-tile) pairs over the M-tiles of all experts:
// expert e owns ceil(rows_e / TM) M-tiles, numbered from table[e] (table[E]
// is their total), so no CTA waits on an empty slot. CTA b takes items b,
// b + gridDim.x, ...; items come in groups of about kWgGroupM M-tiles, and
// inside a group raster 0 walks the M-tiles fastest (the CTAs running at
// once share weight tiles), raster 1 the n-tiles (they share activation
// tiles). Both keep what runs at once inside a few experts' weights and a
// few hundred activation rows, which L2 holds. A group does not split an
// expert of fewer M-tiles than a group (mj_wg_group_start): the M-tiles of
// an expert split between two groups would read its weights from DRAM
// twice, a group's worth of items apart. CTA pairs along N count n-tile
// pairs and take groups of 2 * kWgGroupM M-tiles (mj_wg_tile's G), so a
// round still spans about as many weight tiles.
enum : int { kWgGroupM = 8 };

// Start of group k in M-tiles (table units). Nominally k * kWgGroupM; moved
// back to the first M-tile of the expert that holds that M-tile when the
// expert has fewer M-tiles than a group, so they stay in one group. (Such an
// expert starts after (k - 1) * kWgGroupM.) Experts of a group's M-tiles or
// more are split at the nominal boundaries, as before: their weights are
// read once a group whichever way they are cut. So group k starts in
// ((k - 1) * kWgGroupM, k * kWgGroupM] (0 for k = 0; the total past it) and
// holds 0 to 2 * kWgGroupM - 1 M-tiles.
template <int EXPERTS, int G = kWgGroupM>
__device__ __forceinline__ int mj_wg_group_start(const int *table, int k) {
  const int m = k * G, total = table[EXPERTS];
  if (k <= 0) return 0;
  if (m >= total) return total;
  int lo = 0, hi = EXPERTS;  // table[lo] <= m < table[lo + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (table[mid] <= m)
      lo = mid;
    else
      hi = mid;
  }
  return table[lo + 1] - table[lo] < G ? table[lo] : m;
}

// The starts of groups 0 .. mj_wg_group_slots(E) - 1 after the table (the
// block syncs before and after; every thread calls it), so that a tile's
// group is a few shared loads away, not binary searches on the consumers'
// path between tiles (they cost GEMM 1 4% at T = 16384). Groups past those
// (more than (2E + 1) * kWgGroupM M-tiles: many rows on few experts, whose
// experts are then mostly larger than a group anyway) keep their nominal
// starts, which still partition the M-tiles: start(k) stays in
// ((k - 1) * kWgGroupM, k * kWgGroupM].
template <int EXPERTS, int G = kWgGroupM>
__device__ __forceinline__ void mj_wg_build_groups(int *table) {
#pragma unroll 1
  for (int k = threadIdx.x; k < mj_wg_group_slots(EXPERTS); k += blockDim.x)
    table[EXPERTS + 1 + k] = mj_wg_group_start<EXPERTS, G>(table, k);
}

template <int EXPERTS, int G = kWgGroupM>
__device__ __forceinline__ int mj_wg_group(const int *table, int k) {
  const int nominal = k * G, total = table[EXPERTS];
  return k < mj_wg_group_slots(EXPERTS) ? table[EXPERTS + 1 + k]
                                        : (nominal < total ? nominal : total);
}

// Fills table[0..E] from the expert offsets (clamped, as mj_gemm_find_tile
// reads them). Called by one whole warp; the block syncs before reading it.
template <int TM, int EXPERTS>
__device__ __forceinline__ void mj_wg_build_table(int *table, const int *offsets, int max_rows) {
  constexpr int kPer = (EXPERTS + 31) / 32;
  const int lane = threadIdx.x & 31, e0 = lane * kPer;
  int sum = 0;
#pragma unroll 1
  for (int e = e0; e < e0 + kPer && e < EXPERTS; ++e) {
    const int lo = mj_clamped_offset(offsets, e, max_rows);
    const int hi = mj_clamped_offset(offsets, e + 1, max_rows);
    const int tiles = hi > lo ? (hi - lo - 1) / TM + 1 : 0; /* no count + TM - 1: int32 */
    table[e + 1] = tiles;
    sum += tiles;
  }
  int incl = sum; // inclusive scan over the lanes
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int run = incl - sum;
  __syncwarp();
#pragma unroll 1
  for (int e = e0; e < e0 + kPer && e < EXPERTS; ++e) {
    run += table[e + 1];
    table[e + 1] = run;
  }
  if (lane == 0) table[0] = 0;
}

// Tile w of the schedule -> the tile of cluster rank `rank`. Table units are
// CM M-tiles (a cluster's CTAs take consecutive M-tiles of one expert, so
// they share the weight tile); a rank past the expert's last M-tile gets an
// empty tile (row_end == row0: it loads and multiplies, stores nothing).
// With CN = 2 the schedule counts n-tile pairs (n_tiles is the pair count):
// rank r takes n-tile 2p + r of pair p, on the same M-tile as its peer.
template <int TM, int CM, int CN, int EXPERTS, int RASTER>
__device__ __forceinline__ mj_gemm_tile mj_wg_tile(const int *table, const int *offsets,
                                                   int max_rows, int n_tiles, int w, int rank) {
  // Group g holds items [start(g) * n_tiles, start(g + 1) * n_tiles); with
  // q = (w / n_tiles) / G, start(q) <= w / n_tiles < start(q + 2),
  // so w's group is q or q + 1.
  constexpr int G = kWgGroupM * CN;  // pairs along N: twice the M-tiles, half the n-tiles
  const int mt0 = w / n_tiles, q = mt0 / G;
  const int g0 = mj_wg_group<EXPERTS, G>(table, q), g1 = mj_wg_group<EXPERTS, G>(table, q + 1),
            g2 = mj_wg_group<EXPERTS, G>(table, q + 2);
  const bool upper = mt0 >= g1;
  const int m_base = upper ? g1 : g0, m_end = upper ? g2 : g1;
  const int rows = m_end - m_base, within = w - m_base * n_tiles;
  mj_gemm_tile t;
  int mt;
  if (RASTER == 0) {
    mt = m_base + within % rows;
    t.n_tile = within / rows;
  } else {
    mt = m_base + within / n_tiles;
    t.n_tile = within % n_tiles;
  }
  int lo = 0, hi = EXPERTS; // table[lo] <= mt < table[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (table[mid] <= mt) lo = mid;
    else hi = mid;
  }
  const int first = mj_clamped_offset(offsets, lo, max_rows);
  const int end = mj_clamped_offset(offsets, lo + 1, max_rows);
  t.expert = lo;
  if (CN == 2) t.n_tile = 2 * t.n_tile + rank;
  t.row0 = first + ((mt - table[lo]) * CM + (CM == 2 ? rank : 0)) * TM;
  t.row_end = t.row0 >= end ? t.row0 : (end - t.row0 > TM ? t.row0 + TM : end);
  return t;
}

// The schedule's items. Tiles 0 .. tiles-1 (mj_wg_tile) are items of their
// own, except that when the last round would leave at least half the CTAs
// idle (kSplit: cooperative tiles of 128 or 256 rows with A by TMA, no
// clusters; docs/gemm.md "The last round split in halves" and "... along
// K"), each tile of that round is split into `parts` items of its own: CTA
// b still takes items b, b + grid, ..., so the last round's CTAs each take
// one part.
// - Row halves (parts = 2): a half's rows are [row0, +kWgRows) of the item,
//   so consumer 0 multiplies them and consumer 1 waits (mj_wg_skip), in less
//   than a tile's time (one warpgroup alone has the tensor cores). A half
//   past the expert's last row is an empty item (row_end == row0), which no
//   warpgroup loads or multiplies.
// - K parts (ksplit; a GEMM that passes mj_wg_ksplit scratch, where each
//   part keeps kWgKSplitMinKTiles k-tiles or more): part p multiplies all
//   the tile's rows over k-tiles [p * kt / parts, (p + 1) * kt / parts), up
//   to kWgKSplitMaxParts parts and no more than the idle CTAs can take. Each
//   consumer warp stores its fp32 partial sums and counts itself in; the
//   warp that completes its count adds the parts up in part order and runs
//   the epilogue (mj_wg_ksplit_sum). Nobody waits for anybody.

// The sum loads the parts' partials kWgKSumGroup float4 at a time: all at
// once would spill the accumulators.
enum : int { kWgKSplitMinKTiles = 32, kWgKSplitMaxParts = 8, kWgKSumGroup = 8 };

// Scratch of the K parts (both NULL: row halves only). count: 4 * grid
// words (a word per last-round tile, consumer and consumer warp, at most
// grid / 2 tiles), zero before the launch and left zero by it. part: grid
// item slots of two consumers' partial sums, [kMB * kAcc / 4][128 threads]
// float4 each (kTM * kTN * 4 bytes a slot).
struct mj_wg_ksplit {
  unsigned *count;
  float4 *part;
};

struct mj_wg_sched {
  int whole;    // items 0 .. whole-1 are tiles 0 .. whole-1; then the parts
  int items;    // whole + parts * (tiles - whole)
  int parts;    // items per tile of the last round (1: not split)
  bool ksplit;  // the parts split K (else rows)
};

template <int EXPERTS, bool kSplit>
__device__ __forceinline__ mj_wg_sched mj_wg_schedule(const int *table, int n_tiles, int grid,
                                                      int k_tiles, bool can_ksplit) {
  const int tiles = table[EXPERTS] * n_tiles, rem = tiles % grid;
  mj_wg_sched q = {tiles, tiles, 1, false};
  if (!kSplit || rem == 0 || 2 * rem > grid) return q;
  int kp = grid / rem;
  kp = kp < kWgKSplitMaxParts ? kp : kWgKSplitMaxParts;
  kp = kp < k_tiles / kWgKSplitMinKTiles ? kp : k_tiles / kWgKSplitMinKTiles;
  q.ksplit = can_ksplit && kp >= 2;
  q.parts = q.ksplit ? kp : 2;
  q.whole = tiles - rem;
  q.items = q.whole + q.parts * rem;
  return q;
}

// Item w of the schedule -> its tile (rank, CN: as mj_wg_tile).
template <class S, int CM, int CN, int EXPERTS, int RASTER, bool kSplit>
__device__ __forceinline__ mj_gemm_tile mj_wg_item(const mj_wg_sched &q, const int *table,
                                                   const int *offsets, int max_rows, int n_tiles,
                                                   int w, int rank) {
  if (!kSplit || w < q.whole)
    return mj_wg_tile<S::kTM, CM, CN, EXPERTS, RASTER>(table, offsets, max_rows, n_tiles, w, rank);
  const int u = w - q.whole;
  mj_gemm_tile t = mj_wg_tile<S::kTM, CM, CN, EXPERTS, RASTER>(table, offsets, max_rows, n_tiles,
                                                               q.whole + u / q.parts, rank);
  if (q.ksplit) return t;
  const int row0 = t.row0 + (u & 1) * S::kWgRows;
  const int end = t.row_end - row0 > S::kWgRows ? row0 + S::kWgRows : t.row_end;
  t.row0 = row0;
  t.row_end = end > row0 ? end : row0;
  return t;
}

// The k-tiles [*kt0, *kt1) item w multiplies: all k_tiles but for a K part.
__device__ __forceinline__ void mj_wg_k_range(const mj_wg_sched &q, int w, int k_tiles, int *kt0,
                                              int *kt1) {
  const int p = q.ksplit && w >= q.whole ? (w - q.whole) % q.parts : 0;
  const int n = q.ksplit && w >= q.whole ? q.parts : 1;
  *kt0 = p * k_tiles / n;
  *kt1 = (p + 1) * k_tiles / n;
}

// The pipeline position both sides keep across the tiles of a persistent
// CTA: the stage in use and the parity of its current phase.
struct mj_wg_ring {
  int s = 0;
  unsigned phase = 0;
  template <class S> __device__ __forceinline__ void next() {
    if (++s == S::kStages) s = 0, phase ^= 1u;
  }
  // Skips n stage uses (a ping-pong consumer passing the other's tile).
  template <class S> __device__ __forceinline__ void skip(int n) {
    const int total = s + n;
    phase ^= (unsigned)((total / S::kStages) & 1);
    s = total % S::kStages;
  }
};

// ---- rounds in step ---------------------------------------------------------
// With a sync word pair (mj_wg_gemm's `sync`), the producers of all CTAs
// keep the rounds of tiles (round r: items first + r * grid) in step, so
// the CTAs that share a weight tile in a round read it together and L2
// serves the later ones (docs/gemm.md, "Rounds in step"). A split barrier:
// each producer arrives once it has issued its loads of a round, issues the
// first kStages k-tiles of the next round (what the ring holds anyway, so
// the consumers' epilogue still overlaps the next tile's first loads), and
// then waits until every CTA has arrived. sync[0] counts arrivals and is
// put back to zero by the last one, which then advances sync[1]; a waiter
// waits for sync[1] to move past the value it read when it arrived. Each
// producer alternates arrive and wait, so arrivals of two barriers never
// mix. sync[0] must be zero before the first launch and is zero again after
// each (sync[1] only counts on); every CTA must be resident at once (a
// cooperative launch). The barrier orders no data: the GEMM's results do
// not depend on it.
// The barrier's generation word, read with acquire (gpu scope).
__device__ __forceinline__ unsigned mj_wg_round_gen(const unsigned *sync) {
  unsigned g;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(g) : "l"(sync + 1) : "memory");
  return g;
}

__device__ __forceinline__ unsigned mj_wg_round_arrive(unsigned *sync, unsigned n) {
  // read before arriving: a barrier that completes after this arrival
  // cannot be mistaken for an earlier one
  const unsigned g = mj_wg_round_gen(sync);
  unsigned arrived;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;"
               : "=r"(arrived)
               : "l"(sync)
               : "memory");
  if (arrived == n - 1) {
    // nobody arrives again before the generation moves: a plain store resets
    asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(sync) : "memory");
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(sync + 1) : "memory");
  }
  return g;
}

__device__ __forceinline__ void mj_wg_round_wait(const unsigned *sync, unsigned g) {
  while (mj_wg_round_gen(sync) == g) __nanosleep(64);
}

// What a producer owes the barrier: a wait on generation `gen` once armed.
struct mj_wg_round {
  unsigned *sync = nullptr;
  unsigned gen = 0;
  bool armed = false;
  __device__ __forceinline__ void wait() {
    if (armed) mj_wg_round_wait(sync, gen), armed = false;
  }
  __device__ __forceinline__ void arrive(unsigned n) {
    gen = mj_wg_round_arrive(sync, n), armed = true;
  }
};

// The B tile of k-tile k0 into shared offset b, completing on `full`: rows
// [w_row0, +kTN) (kSplitB: [w_row0, +kTN/2) then [w_row1, +kTN/2)); in a
// cluster of CM = 2 this CTA's half, multicast into both CTAs.
template <class S, bool kSplitB, int CM>
__device__ __forceinline__ void mj_wg_load_b(unsigned b, const mj_tmap *tw, int k0, int w_row0, int w_row1,
                                             unsigned rank, unsigned full) {
  if constexpr (CM == 2) {
    const int row = kSplitB ? (rank == 0 ? w_row0 : w_row1) : w_row0 + (int)rank * (S::kTN / 2);
    mj_tma_load_2d_multicast(b + rank * (S::kStageB / 2), tw, k0, row, full, (unsigned short)3);
  } else if constexpr (kSplitB) {
    mj_tma_load_2d(b, tw, k0, w_row0, full);
    mj_tma_load_2d(b + S::kStageB / 2, tw, k0, w_row1, full);
  } else {
    mj_tma_load_2d(b, tw, k0, w_row0, full);
  }
}

// The producer: one thread issues the TMA loads of every k-tile of one tile:
// A rows [a_row0, +kTM) and B rows [w_row0, +kTN) (kSplitB: [w_row0, +kTN/2)
// then [w_row1, +kTN/2), gemm1's gate and up halves). It runs ahead into the
// next tile while the consumers store this one. In a cluster of CM = 2, each
// CTA loads its own A and one half of the shared B tile, multicast into both
// CTAs (rank 0 the first half, rank 1 the second), so B crosses L2 once per
// pair; a stage is reloaded only when both CTAs' consumers released it. In a
// cluster of CN = 2 (both CTAs on one M-tile) the roles swap: each loads its
// own B and every other A box (rank r the boxes j with j % 2 == r, of kTM / 2
// rows, or of 64 rows with kBlockSkip), multicast into both, so A crosses L2
// once per pair.
// Only k-tiles [kt0, kt1) (a K part: mj_wg_k_range). step (rounds in step,
// or NULL): its owed wait comes before the tile's k-tile kStages.
template <class S, int K, bool kSplitB, int CM, int CN>
__device__ __forceinline__ void mj_wg_produce(const mj_wg_smem<S> &sm, mj_wg_ring &ring,
                                              const mj_tmap *ta, const mj_tmap *tw, int a_row0,
                                              int a_rows, int w_row0, int w_row1, unsigned rank,
                                              int kt0, int kt1, mj_wg_round *step = nullptr) {
  // kBlockSkip: A boxes of 64 rows, only those that hold the tile's rows
  // (a_rows of them from a_row0); otherwise kTM / kBox boxes of kBox rows
  constexpr int kBox = S::kBlockSkip ? S::kBoxA : S::kTM / CN;
  int boxes = S::kTM / kBox;
  if constexpr (S::kBlockSkip) {
    boxes = (a_rows + kBox - 1) / kBox;
    boxes = boxes < 0 ? 0 : (boxes > S::kTM / kBox ? S::kTM / kBox : boxes);
  }
  const unsigned bytes = (unsigned)(boxes * kBox * 128 + S::kStageB);
#pragma unroll 1
  for (int kt = kt0; kt < kt1; ++kt) {
    const unsigned full = sm.full + ring.s * 8;
    if (step && kt - kt0 == S::kStages) step->wait();
    mj_mbar_wait(sm.empty + ring.s * 8, ring.phase ^ 1u); // consumers are done with this stage
    mj_mbar_expect_tx(full, bytes);
    const int k0 = kt * 64;
    const unsigned a = sm.a + ring.s * S::kStageA;
#pragma unroll 1
    for (int j = 0; j < boxes; ++j) {
      if constexpr (CN == 2) {
        if ((unsigned)(j & 1) == rank)
          mj_tma_load_2d_multicast(a + j * kBox * 128, ta, k0, a_row0 + j * kBox, full,
                                   (unsigned short)3);
      } else {
        mj_tma_load_2d(a + j * kBox * 128, ta, k0, a_row0 + j * kBox, full);
      }
    }
    mj_wg_load_b<S, kSplitB, CM>(sm.b + ring.s * S::kStageB, tw, k0, w_row0, w_row1, rank, full);
    ring.next<S>();
  }
}

// ---- the gathering producer (GEMM 1 reading x rows in place) --------------
// A rows come from `x` by index instead of from a permuted copy: tile row r
// (rows [row0, row_end) of the permuted order) is x row index[row0 + r] /
// div; a negative index, one at or past x_rows, or a row past row_end is a
// row of zeros. The whole producer warpgroup copies A with cp.async, 16
// bytes per thread and row (thread t: 16-byte chunk t % 8 of rows t / 8 +
// 16 i), into the layout TMA's 128-byte swizzle gives (chunk c of row r at
// r * 128 + (c ^ r % 8) * 16), so the consumers cannot tell the two apart;
// thread 0 still loads B by TMA. Each thread hands its copies of a stage
// over without waiting for them: cp.async.mbarrier.arrive.noinc makes the
// copies' completion one arrival on the stage's full barrier (which expects
// 1 + 128 arrivals: thread 0's expect_tx and one per thread), so the
// producer runs as far ahead as the ring lets it, as the TMA producer does.
// cp.async writes through the generic proxy and wgmma reads through the
// async one: the consumers fence the proxies after the full barrier
// (mj_wg_consume's kGather).
template <typename T> struct mj_wg_gather_src {
  const T *x;
  const int *index;
  int div, x_rows;
};

// One arrival on the mbarrier at `bar` once every cp.async this thread
// issued before it has landed; .noinc: the barrier's count already holds it.
__device__ __forceinline__ void mj_cp_async_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// Rows of this thread in a tile (thread t: rows t / 8 + 16 i): their index
// values as loaded (-1 past the tile's rows), not yet used, so the loads
// stay in flight until the tile starts.
template <class S> struct mj_wg_gather_rows {
  enum : int { kRows = S::kTM / 16 };
  int index[kRows];
};

template <class S, typename T>
__device__ __forceinline__ void mj_wg_gather_index(const mj_wg_gather_src<T> &g, const mj_gemm_tile &t,
                                                   mj_wg_gather_rows<S> &rows) {
  const int r0 = (threadIdx.x & 127) >> 3;
#pragma unroll
  for (int i = 0; i < mj_wg_gather_rows<S>::kRows; ++i) {
    const int row = t.row0 + r0 + 16 * i;
    rows.index[i] = row < t.row_end ? __ldg(g.index + row) : -1;
  }
}

// One tile's k-tiles. `rows` holds this tile's x rows; once the first stage
// is issued (with one k-tile: before it), `next` (when has_next) gets the
// next tile's, so their index loads are in flight while this tile streams.
template <class S, int K, bool kSplitB, int CM, typename T>
__device__ __forceinline__ void mj_wg_produce_gather(
    const mj_wg_smem<S> &sm, mj_wg_ring &ring, const mj_wg_gather_src<T> &g, const mj_tmap *tw,
    const mj_wg_gather_rows<S> &rows, int w_row0, int w_row1, unsigned rank, bool has_next,
    const mj_gemm_tile &t_next, mj_wg_gather_rows<S> &next) {
  constexpr int kTiles = (K + 63) / 64;
  constexpr int kRows = mj_wg_gather_rows<S>::kRows;
  const int tid = threadIdx.x & 127, chunk = tid & 7, r0 = tid >> 3;
  // rows of x are read again for every n-tile while the weights stream past
  const unsigned long long keep = mj_l2_evict_last();
  int src[kRows]; // x row of each of this thread's rows, -1: zeros
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int xr = rows.index[i] < 0 ? -1 : rows.index[i] / g.div;
    src[i] = xr < g.x_rows ? xr : -1;
  }
#pragma unroll 1
  for (int kt = 0; kt < kTiles; ++kt) {
    const unsigned full = sm.full + ring.s * 8;
    if (kt == (kTiles > 1 ? 1 : 0) && has_next) mj_wg_gather_index<S, T>(g, t_next, next);
    mj_mbar_wait(sm.empty + ring.s * 8, ring.phase ^ 1u); // consumers are done with this stage
    const int k0 = kt * 64;
    if (tid == 0) {
      mj_mbar_expect_tx(full, S::kStageB);
      mj_wg_load_b<S, kSplitB, CM>(sm.b + ring.s * S::kStageB, tw, k0, w_row0, w_row1, rank, full);
    }
    const unsigned a = sm.a + ring.s * S::kStageA;
    const int col = k0 + chunk * 8;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = r0 + 16 * i;
      const bool ok = src[i] >= 0 && col < K;
      mj_cp_async16(a + r * 128 + ((chunk ^ (r & 7)) << 4),
                    ok ? g.x + (long long)src[i] * K + col : g.x, ok, keep);
    }
    mj_cp_async_arrive(full);
    ring.next<S>();
  }
}

// Gives stage `stage` back: to this CTA's producer, or (a cluster of CS = 2,
// along M or N) to both CTAs' producers, whose loads write into both.
template <int CS>
__device__ __forceinline__ void mj_wg_release(unsigned empty_bar) {
  mj_mbar_arrive(empty_bar);
  if constexpr (CS == 2) mj_mbar_arrive_cluster(empty_bar, mj_cluster_rank() ^ 1u);
}

// A consumer warpgroup (c = 0 or 1): rows [c * kWgRows, +kWgRows) of the tile
// against all kTN B rows, summed over k-tiles [kt0, kt1) into acc (a K part:
// mj_wg_k_range; all of K by default); only its first kActive
// m64 blocks are multiplied (the others stay zero). Each k-tile's wgmmas form
// one group; once the group before it has completed, that stage goes back to
// the producer (one arrival per consumer warp); the last stage goes back
// when all are done.
template <class S, typename T, int K, int CS, bool kGather = false, int kActive = S::kMB>
__device__ __forceinline__ void mj_wg_consume(const mj_wg_smem<S> &sm, mj_wg_ring &ring, int c,
                                              float (&acc)[S::kMB][S::kAcc], int kt0 = 0,
                                              int kt1 = (K + 63) / 64) {
  typedef mj_wgmma_op<S::kTN, mj_same_type<T, __nv_bfloat16>::value> Op;
  const bool signals = (threadIdx.x & 31) == 0;
#pragma unroll
  for (int mb = 0; mb < S::kMB; ++mb)
#pragma unroll
    for (int i = 0; i < S::kAcc; ++i) acc[mb][i] = 0.f;
  int prev = 0;
#pragma unroll 1
  for (int kt = kt0; kt < kt1; ++kt) {
    mj_mbar_wait(sm.full + ring.s * 8, ring.phase); // the stage's TMA bytes have landed
    if constexpr (kGather)  // A came by cp.async (generic proxy); wgmma reads through the async one
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#pragma unroll
    for (int mb = 0; mb < S::kMB; ++mb) mj_wg_pin(acc[mb]);
    mj_wgmma_fence();
    const unsigned a = sm.a + ring.s * S::kStageA + (S::kPingPong ? 0 : c * S::kWgRows * 128);
    const unsigned b = sm.b + ring.s * S::kStageB;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const unsigned long long db = mj_wg_desc(b + kk * 32);
#pragma unroll
      for (int mb = 0; mb < kActive; ++mb)
        Op::mma(acc[mb], mj_wg_desc(a + mb * 64 * 128 + kk * 32), db);
    }
    mj_wgmma_commit();
    mj_wgmma_wait<1>(); // k-tile kt-1's wgmmas are done: its stage is free
#pragma unroll
    for (int mb = 0; mb < S::kMB; ++mb) mj_wg_pin(acc[mb]);
    if (kt > kt0 && signals) mj_wg_release<CS>(sm.empty + prev * 8);
    prev = ring.s;
    ring.next<S>();
  }
  mj_wgmma_wait<0>();
#pragma unroll
  for (int mb = 0; mb < S::kMB; ++mb) mj_wg_pin(acc[mb]);
  if (signals) mj_wg_release<CS>(sm.empty + prev * 8);
}

// A consumer without rows in a split half (consumer 1) multiplies nothing:
// it gives each stage of the tile back once it has landed (not before: an
// arrival ahead of the producer would count toward the stage's next use),
// so the other consumer has the tensor cores to itself. n: the item's
// k-tiles.
template <class S, int CS>
__device__ __forceinline__ void mj_wg_skip(const mj_wg_smem<S> &sm, mj_wg_ring &ring, int n) {
  const bool signals = (threadIdx.x & 31) == 0;
#pragma unroll 1
  for (int kt = 0; kt < n; ++kt) {
    mj_mbar_wait(sm.full + ring.s * 8, ring.phase);
    if (signals) mj_wg_release<CS>(sm.empty + ring.s * 8);
    ring.next<S>();
  }
}

// K part of item w (q.ksplit, w >= q.whole), consumer c: this thread's
// partial sums go to the item's slot; then each warp counts itself in on
// its tile's counter. Returns true in the warp that completes the count,
// with acc then holding the sum of every part's slot, added in part order
// (so the result is the same whichever part finishes last), and the
// counter put back to zero; false in the others, which are done with the
// tile. Each thread reads only what the same thread position wrote in the
// other parts, so a warp's count orders all it needs.
template <class S>
__device__ __forceinline__ bool mj_wg_ksplit_sum(const mj_wg_ksplit &ks, const mj_wg_sched &q,
                                                 int w, int c, float (&acc)[S::kMB][S::kAcc]) {
  constexpr int kVec = S::kMB * S::kAcc / 4;  // float4 per thread
  const int tid = (int)(threadIdx.x & 127u), lane = tid & 31;
  const int u = w - q.whole, tile = u / q.parts;
  // the tile's parts' slots: consumer c's at (part * 2 + c) * kVec * 128
  constexpr int kStride = 2 * kVec * 128;
  float4 *const first = ks.part + (tile * q.parts * 2 + c) * kVec * 128 + tid;
  float4 *const mine = first + (u - tile * q.parts) * kStride;
#pragma unroll
  for (int mb = 0; mb < S::kMB; ++mb)
#pragma unroll
    for (int i = 0; i < S::kAcc; i += 4)
      __stcg(mine + (mb * S::kAcc + i) / 4 * 128,
             make_float4(acc[mb][i], acc[mb][i + 1], acc[mb][i + 2], acc[mb][i + 3]));
  __threadfence();  // the partials are visible before the count that publishes them
  __syncwarp();
  unsigned *const count = ks.count + (tile * 2 + c) * 4 + (tid >> 5);
  unsigned before = 0;
  if (lane == 0) before = atomicAdd(count, 1u);
  before = __shfl_sync(0xffffffffu, before, 0);
  if (before != (unsigned)q.parts - 1) return false;
  if (lane == 0) *count = 0u;  // for the next launch (kernel boundaries order it)
  __threadfence();             // the other parts' partials after their counts
#pragma unroll
  for (int mb = 0; mb < S::kMB; ++mb)
#pragma unroll
    for (int i = 0; i < S::kAcc; ++i) acc[mb][i] = 0.f;  // 0 + p0 is p0
#pragma unroll 1
  for (int p = 0; p < q.parts; ++p) {
    const float4 *const src = first + p * kStride;
#pragma unroll
    for (int mb = 0; mb < S::kMB; ++mb)
#pragma unroll
      for (int i = 0; i < S::kAcc; i += 4) {
        if (i % (4 * kWgKSumGroup) == 0) asm volatile("" ::: "memory");  // a group
        const float4 v = __ldcg(src + (mb * S::kAcc + i) / 4 * 128);
        acc[mb][i] += v.x, acc[mb][i + 1] += v.y, acc[mb][i + 2] += v.z, acc[mb][i + 3] += v.w;
      }
  }
  return true;
}

// Four 8x8 matrices of 16-bit elements from registers in the mma
// accumulator layout (register j: matrix j's row lane / 4, columns 2 * (lane
// % 4) and +1) to shared memory; lane l gives the address of row l % 8 of
// matrix l / 8.
__device__ __forceinline__ void mj_stmatrix_x4(unsigned addr, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Stores the 16 rows of an m64 accumulator block that one consumer warp
// holds (rows row0 .. row0 + 15 of out, leading dimension ld; those at or
// past row_end are not written), NG n8 groups of columns from col0 (groups
// at or past limit are not written; col0 and limit multiples of 8).
// pair(i, half, &v0, &v1) gives the thread's two values of group i in row
// half (0: row lane / 4, 1: 8 rows further), as in the accumulators. Per 64
// columns the warp writes its 16 x 64 piece to its staging buffer `buf`
// (kWgEpiWarpBytes, padded rows) with four stmatrix.x4, then each lane
// reads back 16-byte row pieces and stores them: a warp store covers 4 rows
// x 128 bytes, and the whole row piece costs 4 stmatrix, 4 shared loads and
// 4 global stores a thread, where the quad transpose of mj_store_acc_row
// spends 48 selects and 16 shuffles. Tiles whose width is not a multiple of
// 64 columns take mj_store_acc_row. `keep`: evict_last stores
// (mj_keep_output).
template <typename T, int NG, class Pair>
__device__ __forceinline__ void mj_wg_store_rows(T *out, long long ld, int row0, int row_end,
                                                 int col0, int limit, unsigned buf,
                                                 const Pair &pair, bool keep) {
  static_assert(mj_dtype<T>::kBytes == 2, "mj_wg_store_rows: 2-byte outputs");
  const int lane = (int)(threadIdx.x & 31u);
  if constexpr (NG % 8 != 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + (lane >> 2) + 8 * half;
      mj_store_acc_row<T, NG>(
          out + (long long)row * ld, col0, limit, row < row_end,
          [&](int i, float *v0, float *v1) { pair(i, half, v0, v1); }, keep);
    }
  } else {
    if (row0 >= row_end) return;  // the warp's rows all lie past the expert's end
    // stmatrix p: lane gives row lane % 8 of matrix lane / 8, which holds
    // group 2p + lane / 16, rows 8 * (lane / 8 % 2) .. +7
    const unsigned st =
        buf + (((lane >> 3) & 1) * 8 + (lane & 7)) * kWgEpiRowBytes + (lane >> 4) * 16;
    // read back: lane reads chunk lane % 8 of rows lane / 8 + 4j
    const int rrow = lane >> 3, rchunk = lane & 7;
    const unsigned ld_addr = buf + rrow * kWgEpiRowBytes + rchunk * 16;
    // this lane's rows (4j) and columns (64c) left to write, and where they go
    const int rows = row_end - row0 - rrow, cols = limit - col0 - 8 * rchunk;
    T *const dst0 = out + (long long)(row0 + rrow) * ld + col0 + 8 * rchunk;
#pragma unroll
    for (int c = 0; c < NG / 8; ++c) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        unsigned r[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          float v0, v1;
          pair(8 * c + 2 * p + (m >> 1), m & 1, &v0, &v1);
          r[m] = mj_pack2<T>(v0, v1);
        }
        mj_stmatrix_x4(st + 32 * p, r);
      }
      __syncwarp();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(ld_addr + 4 * j * kWgEpiRowBytes)
                     : "memory");
        if (4 * j < rows && 64 * c < cols) mj_store16(dst0 + 4 * j * ld + 64 * c, v, keep);
      }
      __syncwarp();  // the buffer is read before the next piece overwrites it
    }
  }
}

// The persistent grouped GEMM: barrier and tile-table setup, then the
// warp-specialized pipeline over the CTA's work items (mj_wg_item). For each
// tile, w_rows(t, &w_row0, &w_row1) names its B rows and epi(acc, c, t, buf)
// stores it in each consumer thread (buf: the shared address of the warp's
// staging buffer, for mj_wg_store_rows). Every thread of the block calls it. CM
// (1 or 2) is the cluster size along M, CN (1 or 2) along N, at most one of
// them 2: the kernel entry must then carry __cluster_dims__(2, 1, 1) and the
// grid be a multiple of 2; with CN = 2, n_tiles must be even. sync (no
// cluster, A by TMA; NULL: off): rounds in step (mj_wg_round). ks (both
// NULL: off): scratch for the last round's K parts (mj_wg_ksplit).
template <class S, typename T, int K, bool kSplitB, int EXPERTS, int RASTER, int CM, int CN,
          bool kGather = false, class WRows, class Epi>
__device__ __forceinline__ void mj_wg_gemm(const mj_tmap *ta, const mj_tmap *tw, const int *offsets,
                                           int max_rows, int n_tiles, const WRows &w_rows,
                                           const Epi &epi,
                                           const mj_wg_gather_src<T> *gather = nullptr,
                                           unsigned *sync = nullptr, mj_wg_ksplit ks = {}) {
  static_assert(CM == 1 || CM == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(CN == 1 || (CN == 2 && CM == 1), "pairs along N, or along M, not both");
  static_assert(!(kGather && CN == 2), "the gathering producer loads A without multicast");
  constexpr int CS = CM * CN;  // CTAs per cluster
  const mj_wg_smem<S> sm(mj_smem_u32(mj_gemm_smem));
  int *table = reinterpret_cast<int *>(mj_gemm_smem + (sm.table - mj_smem_u32(mj_gemm_smem)));
  if (threadIdx.x < 32) mj_wg_build_table<S::kTM * CM, EXPERTS>(table, offsets, max_rows);
  if (threadIdx.x == 32) {
#pragma unroll 1
    for (int s = 0; s < S::kStages; ++s) {
      // the producer's expect_tx (gathering: and each producer thread's copies)
      mj_mbar_init(sm.full + s * 8, kGather ? 1 + 128 : 1);
      // each consumer warp of the cluster that reads the stage (ping-pong: one warpgroup)
      mj_mbar_init(sm.empty + s * 8, 4 * (S::kPingPong ? 1 : S::kConsumers) * CS);
    }
    if (S::kPingPong) { // each consumer warpgroup's "mainloop of a tile done": one per warp
      mj_mbar_init(sm.order, 4);
      mj_mbar_init(sm.order + 8, 4);
    }
    // Make the initialized barriers visible to the async proxy (TMA) and,
    // in a cluster, to the other CTA.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  mj_wg_build_groups<EXPERTS, kWgGroupM * CN>(table);
  __syncthreads();
  const unsigned rank = CS == 1 ? 0u : mj_cluster_rank();
  const int first = CS == 1 ? (int)blockIdx.x : (int)mj_cluster_id();
  const int stride = CS == 1 ? (int)gridDim.x : (int)mj_cluster_count();
  if constexpr (CS > 1) mj_cluster_sync();  // the peer's barriers exist before any multicast
  // Split halves: cooperative tiles (two consumers) without clusters, A by
  // TMA (the gathering producer, at 40 registers, would spill for them).
  constexpr bool kSplit = CS == 1 && !S::kPingPong && S::kConsumers == 2 && !kGather;
  n_tiles /= CN;  // CN = 2: the schedule's n-tiles are pairs (mj_wg_tile)
  constexpr int kTiles = (K + 63) / 64;
  // K parts need two parts' k-tiles or more (else the code goes)
  constexpr bool kKSplit = kSplit && kTiles / kWgKSplitMinKTiles >= 2;
  const mj_wg_sched q = mj_wg_schedule<EXPERTS, kSplit>(
      table, n_tiles, stride, kTiles, kKSplit && ks.count != nullptr && ks.part != nullptr);
  const int items = q.items;
  // An item without rows (a split half past the expert's end) is skipped by
  // every warpgroup alike. In a cluster the peer's multicast needs this
  // CTA's loads, so a cluster rank past the expert's end still loads.
  const auto empty = [](const mj_gemm_tile &t) { return kSplit && t.row0 >= t.row_end; };
  const int wg = threadIdx.x / 128;
  mj_wg_ring ring;
  if (wg == 0) {
    if constexpr (S::kConsumers == 2) mj_setmaxnreg_dec<40>();
    if constexpr (kGather) {
      if (threadIdx.x == 0) mj_tma_prefetch(tw);
      mj_wg_gather_rows<S> cur, nxt;
      mj_gemm_tile t = {};
      if (first < items) {
        t = mj_wg_item<S, CM, CN, EXPERTS, RASTER, kSplit>(q, table, offsets, max_rows, n_tiles,
                                                           first, rank);
        mj_wg_gather_index<S, T>(*gather, t, cur);
      }
#pragma unroll 1
      for (int w = first; w < items; w += stride) {
        const bool has_next = w + stride < items;
        const mj_gemm_tile t_next =
            has_next ? mj_wg_item<S, CM, CN, EXPERTS, RASTER, kSplit>(q, table, offsets, max_rows,
                                                                      n_tiles, w + stride, rank)
                     : t;
        static_assert(!kSplit, "the gathering producer has no empty items to skip");
        int w_row0, w_row1;
        w_rows(t, &w_row0, &w_row1);
        mj_wg_produce_gather<S, K, kSplitB, CM, T>(sm, ring, *gather, tw, cur, w_row0, w_row1, rank,
                                                   has_next, t_next, nxt);
        t = t_next;
        cur = nxt;
      }
      asm volatile("cp.async.wait_all;" ::: "memory");  // no thread leaves with copies in flight
    } else {
      if (threadIdx.x != 0) return;
      mj_tma_prefetch(ta);
      mj_tma_prefetch(tw);
      // rounds in step: every CTA arrives after each round but the last,
      // also the rounds it has no item in, and waits in the next one
      const int rounds = CS == 1 && sync ? (items + stride - 1) / stride : 0;
      mj_wg_round step;
      step.sync = sync;
#pragma unroll 1
      for (int w = first, r = 0; w < items || r < rounds; w += stride, ++r) {
        if (w < items) {
          const mj_gemm_tile t = mj_wg_item<S, CM, CN, EXPERTS, RASTER, kSplit>(
              q, table, offsets, max_rows, n_tiles, w, rank);
          if (!empty(t)) {
            int w_row0, w_row1, kt0, kt1;
            w_rows(t, &w_row0, &w_row1);
            mj_wg_k_range(q, w, kTiles, &kt0, &kt1);
            mj_wg_produce<S, K, kSplitB, CM, CN>(sm, ring, ta, tw, t.row0, t.row_end - t.row0,
                                                 w_row0, w_row1, rank, kt0, kt1, &step);
          }
        }
        step.wait();  // no item, or fewer k-tiles than stages: the wait is still owed
        if (r + 1 < rounds) step.arrive((unsigned)stride);
      }
    }
  } else {
    if constexpr (S::kConsumers == 2) mj_setmaxnreg_inc<232>();
    float acc[S::kMB][S::kAcc];
    const int c = wg - 1;
    // Ping-pong: this warpgroup takes the CTA's items c, c + 2, ... and
    // starts a tile's mainloop only once the other warpgroup finished the
    // mainloop of the tile before (its order barrier), so the two never
    // multiply at once, one stores while the other multiplies, and neither
    // waits on a stage more than one lap of the ring ahead of the producer
    // (an mbarrier's parity cannot tell two laps apart).
    if (S::kPingPong && c == 1) ring.skip<S>((K + 63) / 64);
    unsigned order_phase = 0;
    const bool signals = (threadIdx.x & 31) == 0;
#pragma unroll 1
    for (int w = first + (S::kPingPong ? c * stride : 0), j = c; w < items;
         w += S::kPingPong ? 2 * stride : stride, j += 2) {
      const mj_gemm_tile t = mj_wg_item<S, CM, CN, EXPERTS, RASTER, kSplit>(
          q, table, offsets, max_rows, n_tiles, w, rank);
      if (empty(t)) continue;  // never in ping-pong (no split): the order barriers stay paired
      int kt0, kt1;
      mj_wg_k_range(q, w, kTiles, &kt0, &kt1);
      // a K part: the epilogue runs in the warps that complete their counts
      const bool kpart = kKSplit && q.ksplit && w >= q.whole;
      if (S::kPingPong && j > 0) {
        mj_mbar_wait(sm.order + (1 - c) * 8, order_phase);
        order_phase ^= 1u;
      }
      // Only the split halves of the last round leave a consumer idle (no
      // rows, no stores): a consumer skipping its rows of an ordinary tile
      // (an expert's last M-tile) lets its CTA run ahead of the CTAs that
      // share the weight tile, and L2 loses it (deepseek-v3 T = 16384 GEMM
      // 1: 28.7 against 16.0 ms on an H100).
      if constexpr (S::kBlockSkip) {
        // 256-row tiles: the expert's rows in this consumer's 128 (a split
        // half's rows are all consumer 0's). Experts of up to 256 rows have
        // one M-tile, so no other CTA shares the weight tile and running
        // ahead loses nothing; with more, only the expert's last M-tile is
        // short.
        const int left = t.row_end - t.row0 - c * S::kWgRows;
        if (left <= 0) {  // in every K part of the tile alike: no count either
          mj_wg_skip<S, CS>(sm, ring, kt1 - kt0);
          continue;
        }
        if (left <= 64) {
          mj_wg_consume<S, T, K, CS, kGather, 1>(sm, ring, c, acc, kt0, kt1);
          if (!kpart || mj_wg_ksplit_sum<S>(ks, q, w, c, acc))
            epi(acc, c, t, sm.epi(c, (threadIdx.x & 127) >> 5));
          continue;
        }
      } else if (kSplit && !(kKSplit && q.ksplit) && w >= q.whole && c == 1) {  // a half
        mj_wg_skip<S, CS>(sm, ring, kTiles);
        continue;
      }
      mj_wg_consume<S, T, K, CS, kGather>(sm, ring, c, acc, kt0, kt1);
      if (S::kPingPong) {
        if (signals) mj_mbar_arrive(sm.order + c * 8);
        ring.skip<S>(kTiles);  // the other warpgroup's next tile
      }
      if (kpart && !mj_wg_ksplit_sum<S>(ks, q, w, c, acc)) continue;
      epi(acc, c, t, sm.epi(c, (threadIdx.x & 127) >> 5));
    }
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if constexpr (CS > 1) mj_cluster_sync();
}

#endif // MJ_WGMMA_AVAILABLE

// Traps when the launch gave less dynamic shared memory than the tile needs.
template <class S> __device__ __forceinline__ void mj_wg_check_smem() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  if (bytes < (unsigned)S::kSmemBytes) __trap();
}

#endif
