// Align/permute: topk_ids [T, k] -> rows grouped by expert. Produces per-
// expert counts and offsets, a stable permutation of the T*k entries
// (entry = t*k + j; token order kept inside each expert), its inverse, the
// list of GEMM tiles (kGemmTileM rows, one expert each) and the permuted copy
// of x. Entries whose expert is outside [expert_first, expert_last) (or not a
// valid id) are dropped: not counted, row_of = -1. Layouts: docs/kernels.md.
//
// Three launches, no atomics, so every output is the same run after run:
//   moejit_align_count    one block per chunk of entries: the chunk's
//                         histogram and each entry's rank inside its chunk;
//   moejit_align_scan     one block: chunk bases, counts, offsets, tiles;
//   moejit_align_scatter  per tile of tokens: rows, inverse map, and x copied
//                         once per token into its k rows.
// Two when a few chunks hold every entry (1 < chunks <= kScanScatterChunks):
//   moejit_align_count         unchanged;
//   moejit_align_scan_scatter  each block scans the chunks' histograms
//                              itself, block 0 writes offsets and tiles,
//                              then the scatter, with the same outputs.
// Two when one chunk holds every entry (T*k <= kChunkEntries, the small-T
// case where launch latency is the whole cost):
//   moejit_align_count_scan  one block: the count of the single chunk, then
//                            the scan (its chunk bases are all 0), with
//                            the same code and the same outputs as the two;
//   moejit_align_scatter     unchanged.
//
// The dropped entries go to an extra bin (kExperts) placed after every
// expert, so the permutation covers all T*k rows: rows >= offsets[kExperts]
// belong to dropped entries and get sorted_slot = -1.
#include "common/dtype.cuh"
#include "common/rows.cuh"
#include "common/warp.cuh"

enum : int { kBins = kExperts + 1 };
enum : int { kDroppedBin = kExperts };

static_assert(kGemmTileM >= 1, "align: the GEMM tile needs at least one row");
static_assert(kBlockThreads % 32 == 0, "align: block_threads must be a multiple of 32");

__device__ __forceinline__ int bin_of(int expert, int first, int last) {
  return expert >= first && expert < last ? expert : kDroppedBin;
}

// --- 1. count -------------------------------------------------------------
// A block counts one chunk of kChunkEntries consecutive entries; each warp
// takes kCountBatch runs of 32 in order, with a private histogram in shared
// memory (dynamic: kWarps * kBins ints). Ballots group the lanes of equal
// bins (mj_match_any_bits on bin + 1: an entry past the end, bin -1, is a
// value of its own): a lane's rank is the bin's count so far plus its equal
// lanes below it, which is entry order. The warps' histograms are then
// scanned so that each rank becomes the rank inside the block's chunk, and
// the chunk's histogram goes to chunk_counts [chunks][kBins].
enum : int { kWarps = kBlockThreads / 32 };
enum : int { kCountBatch = 8 };
// Mirrored by src/ops (mj_align_chunk_entries), which sizes the workspace.
enum : int { kChunkEntries = kBlockThreads * kCountBatch };

enum : int { kMatchBits = mj_bit_width(kBins) };  // bin + 1 is in 0..kBins

// The count kernels launch `__launch_bounds__(kBlockThreads, 1)`: one block
// an SM is plenty for a grid of a few chunks, and without the 1 ptxas held
// 1024-thread blocks to 32 registers and spilled (64 registers with it, no
// spills).

// Per bin of a [rows][kBins] matrix in shared memory, by the whole block:
// each cell becomes the sum of the cells above it in its column (an
// exclusive scan down the column), and the column's total goes to
// total[bin]. The caller synchronizes after.
__device__ __forceinline__ void scan_bin_columns(int *cells, int rows, int *total) {
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    int run = 0;
    for (int r = 0; r < rows; ++r) {
      const int v = cells[r * kBins + b];
      cells[r * kBins + b] = run;
      run += v;
    }
    total[b] = run;
  }
}

// Counts chunk `chunk` (blockDim.x == kBlockThreads): each entry's rank
// inside the chunk goes to chunk_rank, the chunk's histogram to
// chunk_hist [kBins] (global, or shared). warp_hist: the dynamic shared
// memory, kWarps * kBins ints. chunk_hist is written before the last
// __syncthreads, so the whole block may read it (shared) on return.
__device__ __forceinline__ void count_chunk(const int *__restrict__ topk_ids, int entries,
                                            int chunk, int expert_first, int expert_last,
                                            int *warp_hist, int *__restrict__ chunk_hist,
                                            int *__restrict__ chunk_rank) {
  const int warp = (int)(threadIdx.x / 32), lane = mj_lane_id();
  int *hist = warp_hist + warp * kBins;
  for (int i = threadIdx.x; i < kWarps * kBins; i += kBlockThreads) warp_hist[i] = 0;

  // All loads first: kCountBatch independent loads in flight per lane.
  const long long begin = (long long)chunk * kChunkEntries + warp * 32 * kCountBatch + lane;
  int bin[kCountBatch];
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b) {
    const long long i = begin + 32 * b;
    bin[b] = i < entries ? bin_of(__ldg(topk_ids + i), expert_first, expert_last) : -1;
  }
  __syncthreads();

  int rank[kCountBatch];
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b) {
    const unsigned peers = mj_match_any_bits<kMatchBits>((unsigned)(bin[b] + 1));
    const int before = bin[b] >= 0 ? hist[bin[b]] : 0;
    __syncwarp();
    if (bin[b] >= 0 && lane == __ffs(peers) - 1) hist[bin[b]] = before + __popc(peers);
    __syncwarp();
    rank[b] = before + __popc(peers & mj_lanemask_lt());
  }
  __syncthreads();

  // Per bin, exclusive over warps: warp w's base is the count of warps < w.
  scan_bin_columns(warp_hist, kWarps, chunk_hist);
  __syncthreads();
#pragma unroll
  for (int b = 0; b < kCountBatch; ++b)
    if (bin[b] >= 0) chunk_rank[begin + 32 * b] = hist[bin[b]] + rank[b];
}

extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    moejit_align_count(const int *__restrict__ topk_ids, int entries, int expert_first,
                       int expert_last, int *__restrict__ chunk_counts,
                       int *__restrict__ chunk_rank) {
  extern __shared__ int warp_hist[];
  count_chunk(topk_ids, entries, (int)blockIdx.x, expert_first, expert_last, warp_hist,
              chunk_counts + (size_t)blockIdx.x * kBins, chunk_rank);
}

// --- 2. scan --------------------------------------------------------------
// Exclusive prefix sum of data[0, n) in shared memory, in place, by the whole
// block (any blockDim.x <= 1024); returns the total to every thread. Each
// thread sums a contiguous run, the runs' sums are scanned by warp shuffles.
__device__ int block_exclusive_scan(int *data, int n, int *warp_sums /* [33] */) {
  const int tid = (int)threadIdx.x, threads = (int)blockDim.x;
  const int lane = mj_lane_id(), warp = tid / 32, warps = threads / 32;
  const int per = (n + threads - 1) / threads;
  const int lo = min(n, tid * per), hi = min(n, lo + per);
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += data[i];
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(MJ_FULL_MASK, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = lane < warps ? warp_sums[lane] : 0;
    int wincl = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(MJ_FULL_MASK, wincl, o);
      if (lane >= o) wincl += v;
    }
    warp_sums[lane] = wincl - w;
    if (lane == 31) warp_sums[32] = wincl;
  }
  __syncthreads();
  int run = warp_sums[warp] + incl - sum;
  for (int i = lo; i < hi; ++i) {
    const int v = data[i];
    data[i] = run;
    run += v;
  }
  const int total = warp_sums[32];
  __syncthreads();  // warp_sums and data are reused by the caller
  return total;
}

// Column sums of chunk_counts [chunks][kBins], turned in place into each
// chunk's exclusive base inside its bin. A bin's chunks are split in `parts`
// runs, one thread each, so a 1024-thread block keeps ~1024 loads in flight.
__device__ void scan_chunk_columns(int *__restrict__ chunk_counts, int chunks, int *bin_total,
                                   int *part_base /* [parts * kBins] */, int parts) {
  const int cells = parts * kBins;
  for (int cell = threadIdx.x; cell < cells; cell += blockDim.x) {
    const int bin = cell % kBins, part = cell / kBins;
    const int c0 = (int)((long long)chunks * part / parts),
              c1 = (int)((long long)chunks * (part + 1) / parts);
    int sum = 0;
    for (int c = c0; c < c1; ++c) sum += chunk_counts[(size_t)c * kBins + bin];
    part_base[cell] = sum;
  }
  __syncthreads();
  scan_bin_columns(part_base, parts, bin_total);
  __syncthreads();
  for (int cell = threadIdx.x; cell < cells; cell += blockDim.x) {
    const int bin = cell % kBins, part = cell / kBins;
    const int c0 = (int)((long long)chunks * part / parts),
              c1 = (int)((long long)chunks * (part + 1) / parts);
    int run = part_base[cell];
    for (int c = c0; c < c1; ++c) {
      int *p = chunk_counts + (size_t)c * kBins + bin;
      const int v = *p;
      *p = run;
      run += v;
    }
  }
  __syncthreads();
}

// Tile i covers rows [tile_row_start[i], min(+kGemmTileM, offsets[e+1])) of
// expert e = tile_expert[i]; entries from num_tiles to tile_capacity are -1.
// A thread per tile finds its expert by binary search over the tile bases.
__device__ void write_tiles(const int *offsets, const int *tile_base, int tile_capacity,
                            int *__restrict__ tile_expert, int *__restrict__ tile_row_start) {
  const int total = tile_base[kExperts];
  for (int i = threadIdx.x; i < tile_capacity; i += blockDim.x) {
    int expert = -1, row = -1;
    if (i < total) {
      int lo = 0, hi = kExperts;  // the last expert with tile_base <= i
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tile_base[mid] <= i)
          lo = mid;
        else
          hi = mid;
      }
      expert = lo;
      row = offsets[lo] + (i - tile_base[lo]) * kGemmTileM;
    }
    tile_expert[i] = expert;
    tile_row_start[i] = row;
  }
}

// The scan's second half, from the bin totals in offsets [kBins + 1]
// (shared, complete in every thread's view): expert_counts, the row offsets
// (offsets is scanned in place and copied to expert_offsets), the tile bases
// (tile_base: shared [kExperts + 1]), num_tiles and the tile list.
__device__ void write_offsets_and_tiles(int *offsets, int *tile_base, int *warp_sums /* [33] */,
                                        int tile_capacity, int *__restrict__ expert_counts,
                                        int *__restrict__ expert_offsets,
                                        int *__restrict__ tile_expert,
                                        int *__restrict__ tile_row_start,
                                        int *__restrict__ num_tiles) {
  for (int e = threadIdx.x; e < kExperts; e += blockDim.x) {
    expert_counts[e] = offsets[e];
    tile_base[e] = offsets[e] > 0 ? (offsets[e] - 1) / kGemmTileM + 1 : 0; /* int32-safe */
  }
  __syncthreads();
  block_exclusive_scan(offsets, kBins, warp_sums);  // bin totals -> row offsets
  const int tiles = block_exclusive_scan(tile_base, kExperts, warp_sums);
  if (threadIdx.x == 0) {
    tile_base[kExperts] = tiles;
    *num_tiles = tiles;
  }
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) expert_offsets[b] = offsets[b];
  __syncthreads();
  write_tiles(offsets, tile_base, tile_capacity, tile_expert, tile_row_start);
}

// One block (1024 threads expected; any multiple of 32 works).
extern "C" __global__ void __launch_bounds__(1024)
    moejit_align_scan(int chunks, int tile_capacity, int *__restrict__ chunk_counts,
                      int *__restrict__ expert_counts, int *__restrict__ expert_offsets,
                      int *__restrict__ tile_expert, int *__restrict__ tile_row_start,
                      int *__restrict__ num_tiles) {
  constexpr int kPartCells = 1024 > kBins ? 1024 : kBins;
  __shared__ int part_base[kPartCells];
  __shared__ int offsets[kBins + 1];
  __shared__ int tile_base[kExperts + 1];
  __shared__ int warp_sums[33];
  const int parts = max(1, (int)blockDim.x / kBins);

  scan_chunk_columns(chunk_counts, chunks, offsets, part_base, parts);
  write_offsets_and_tiles(offsets, tile_base, warp_sums, tile_capacity, expert_counts,
                          expert_offsets, tile_expert, tile_row_start, num_tiles);
}

// --- 1 + 2 fused, for a single chunk ---------------------------------------
// entries <= kChunkEntries: one block of kBlockThreads threads with the count
// kernel's dynamic shared memory (kWarps * kBins ints; the scan's arrays
// below are static, sized by kBins, not by the block). The chunk's histogram
// is the bin totals; its base in every bin is 0, which is what the scan
// leaves in chunk_counts [1][kBins] for one chunk and what the scatter reads.
extern "C" __global__ void __launch_bounds__(kBlockThreads, 1)
    moejit_align_count_scan(const int *__restrict__ topk_ids, int entries, int expert_first,
                            int expert_last, int tile_capacity, int *__restrict__ chunk_counts,
                            int *__restrict__ chunk_rank, int *__restrict__ expert_counts,
                            int *__restrict__ expert_offsets, int *__restrict__ tile_expert,
                            int *__restrict__ tile_row_start, int *__restrict__ num_tiles) {
  extern __shared__ int warp_hist[];
  __shared__ int offsets[kBins + 1];
  __shared__ int tile_base[kExperts + 1];
  __shared__ int warp_sums[33];

  count_chunk(topk_ids, entries, 0, expert_first, expert_last, warp_hist, offsets, chunk_rank);
  for (int b = threadIdx.x; b < kBins; b += kBlockThreads) chunk_counts[b] = 0;
  write_offsets_and_tiles(offsets, tile_base, warp_sums, tile_capacity, expert_counts,
                          expert_offsets, tile_expert, tile_row_start, num_tiles);
}

// --- 3. scatter + copy ----------------------------------------------------
typedef mj_row_tiling<act_t> row_tiling;
enum : int { kCopyUnroll = 4 };  // vectors in flight per thread

// xs[rows[tt*k + j]] = x[t0 + tt] for the tile's tokens, in 16-byte vectors:
// each vector of x is read once and written to the token's k rows (reading
// x once per row would move k times its bytes when x exceeds L2).
__device__ __forceinline__ void copy_tile(const act_t *__restrict__ x, act_t *__restrict__ xs,
                                          const int *rows, int t0, int n_tok) {
  typedef mj_words<act_t, row_tiling::kVecElems> W;
  const int n_vec = n_tok * row_tiling::kVecs;
  for (int v0 = threadIdx.x; v0 < n_vec; v0 += blockDim.x * kCopyUnroll) {
    unsigned w[kCopyUnroll][W::kCount];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int v = v0 + u * (int)blockDim.x;
      if (v < n_vec) {
        const int tt = v / row_tiling::kVecs, col = v % row_tiling::kVecs;
        mj_load_words<act_t, row_tiling::kVecElems>(
            x + (size_t)(t0 + tt) * kHidden + (size_t)col * row_tiling::kVecElems, w[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int v = v0 + u * (int)blockDim.x;
      if (v < n_vec) {
        const int tt = v / row_tiling::kVecs, col = v % row_tiling::kVecs;
#pragma unroll
        for (int j = 0; j < kTopK; ++j) {
          const int row = rows[tt * kTopK + j];
          if (row >= 0)
            mj_store_words<act_t, row_tiling::kVecElems>(
                xs + (size_t)row * kHidden + (size_t)col * row_tiling::kVecElems, w[u]);
        }
      }
    }
  }
}

// Blocks loop over tiles of row_tiling::kTokens tokens. Row of an entry =
// offset of its bin + base of its chunk in the bin + its rank in the chunk:
// offsets [kBins] and chunk_base [chunks][kBins] (global or shared). x and
// xs NULL: indices only. `rows`: shared, kTokens * kTopK ints.
__device__ __forceinline__ void scatter_tiles(const int *__restrict__ topk_ids, int tokens,
                                              int expert_first, int expert_last,
                                              const int *chunk_base, const int *chunk_rank,
                                              const int *offsets, int *__restrict__ sorted_slot,
                                              int *__restrict__ row_of, const act_t *__restrict__ x,
                                              act_t *__restrict__ xs, int *rows) {
  constexpr int kTileTokens = row_tiling::kTokens;
  for (long long tile = blockIdx.x; tile * kTileTokens < tokens; tile += gridDim.x) {
    const int t0 = (int)(tile * kTileTokens);
    const int n_tok = min(kTileTokens, tokens - t0);
    for (int q = threadIdx.x; q < n_tok * kTopK; q += blockDim.x) {
      const int entry = t0 * kTopK + q;
      const int bin = bin_of(__ldg(topk_ids + entry), expert_first, expert_last);
      const int chunk = entry / kChunkEntries;
      const int row =
          offsets[bin] + chunk_base[(size_t)chunk * kBins + bin] + __ldg(chunk_rank + entry);
      const bool kept = bin != kDroppedBin;
      row_of[entry] = kept ? row : -1;
      sorted_slot[row] = kept ? entry : -1;
      rows[q] = kept ? row : -1;
    }
    __syncthreads();
    if (x != nullptr) copy_tile(x, xs, rows, t0, n_tok);
    __syncthreads();  // rows is rewritten by the next tile
  }
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_align_scatter(const int *__restrict__ topk_ids, int tokens, int expert_first,
                         int expert_last, const int *__restrict__ chunk_base,
                         const int *__restrict__ chunk_rank, const int *__restrict__ expert_offsets,
                         int *__restrict__ sorted_slot, int *__restrict__ row_of,
                         const act_t *__restrict__ x, act_t *__restrict__ xs) {
  __shared__ int rows[row_tiling::kTokens * kTopK];
  scatter_tiles(topk_ids, tokens, expert_first, expert_last, chunk_base, chunk_rank, expert_offsets,
                sorted_slot, row_of, x, xs, rows);
}

// --- 2 + 3 fused, for a few chunks -----------------------------------------
// 1 < chunks <= kScanScatterChunks (mirrored by src/ops,
// MJ_ALIGN_SCAN_SCATTER_CHUNKS), after moejit_align_count: every block
// scans the chunks' histograms itself, in shared memory (dynamic: chunks *
// kBins ints), into the chunk bases and bin offsets the scatter reads, so
// the scan needs no launch of its own; block 0 also writes the counts,
// offsets and tile list (the scan's second half). A few chunks keep each
// block's extra reads small (8 x 129 ints for qwen3-30b-a3b at T = 2048).
// Every output is the three launches'; chunk_counts keep the histograms
// (the three launches leave the bases there).
enum : int { kScanScatterChunks = 8 };

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_align_scan_scatter(const int *__restrict__ topk_ids, int tokens, int expert_first,
                              int expert_last, int chunks, int tile_capacity,
                              const int *__restrict__ chunk_counts,
                              const int *__restrict__ chunk_rank, int *__restrict__ expert_counts,
                              int *__restrict__ expert_offsets, int *__restrict__ tile_expert,
                              int *__restrict__ tile_row_start, int *__restrict__ num_tiles,
                              int *__restrict__ sorted_slot, int *__restrict__ row_of,
                              const act_t *__restrict__ x, act_t *__restrict__ xs) {
  extern __shared__ int chunk_base[];  // [chunks][kBins]
  __shared__ int offsets[kBins + 1];
  __shared__ int tile_base[kExperts + 1];
  __shared__ int warp_sums[33];
  __shared__ int rows[row_tiling::kTokens * kTopK];
  for (int i = threadIdx.x; i < chunks * kBins; i += blockDim.x)
    chunk_base[i] = __ldg(chunk_counts + i);
  __syncthreads();
  scan_bin_columns(chunk_base, chunks, offsets);
  __syncthreads();
  if (blockIdx.x == 0)
    write_offsets_and_tiles(offsets, tile_base, warp_sums, tile_capacity, expert_counts,
                            expert_offsets, tile_expert, tile_row_start, num_tiles);
  else
    block_exclusive_scan(offsets, kBins, warp_sums);
  scatter_tiles(topk_ids, tokens, expert_first, expert_last, chunk_base, chunk_rank, offsets,
                sorted_slot, row_of, x, xs, rows);
}
