// Combine: out[t] = sum over j = 0..k-1 of w[t, j] * y[row_of[t, j]], in
// that fixed j order with fp32 accumulation (fmaf), written as out_t. Rows
// with row_of = -1 (dropped by expert parallelism) add nothing; weights NULL
// means a plain sum (the weights were applied earlier, e.g. in GEMM 2).
//
// Why it is fast: it is a gather of k rows per token, so each thread owns one
// 16-byte vector of the output and issues its k 16-byte loads before the
// first add (k loads in flight per thread hide DRAM latency); rows and
// weights of a tile of tokens sit in shared memory, read by broadcast. Every
// byte of y is read once, every byte of out written once.
//
// The whole layer's combine also tidies L2 after the layer (the public
// moejit_combine asks for none of it): GEMM 1 and GEMM 2 store h and y with
// the evict_last policy where they fit L2 (common/gemm_epilogue.cuh), and
// the gathering GEMM 1 reads x's rows with it. Lines of that priority
// outlive any stream of normal traffic, so without this every kernel after
// the layer (the model's next layers, this layer's next call) would run
// with that much less L2, and the dirty lines of h and y, dead once this
// kernel has read y, would be written back to DRAM during them. So h's
// lines are discarded (`dead`), y's each as soon as the lanes that read it
// have (`drop_y`), and x's demoted to the normal priority (`gathered`).
#include "common/dtype.cuh"
#include "common/rows.cuh"

typedef mj_row_tiling<act_t> row_tiling;
enum : int { kVecElems = row_tiling::kVecElems };
enum : int { kTileTokens = row_tiling::kTokens };
// Loads issued before accumulating; more would only cost registers.
enum : int { kLoadBatch = kTopK < 8 ? kTopK : 8 };

static_assert(kBlockThreads % 32 == 0, "combine: block_threads must be a multiple of 32");

// One output vector: column `col` of token tt of the tile.
__device__ __forceinline__ void combine_vector(const act_t *__restrict__ y, const int *rows,
                                               const float *w, int tt, int col,
                                               float (&acc)[kVecElems]) {
  typedef mj_words<act_t, kVecElems> W;
#pragma unroll
  for (int e = 0; e < kVecElems; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int j0 = 0; j0 < kTopK; j0 += kLoadBatch) {
    unsigned words[kLoadBatch][W::kCount];
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int row = j0 + b < kTopK ? rows[tt * kTopK + j0 + b] : -1;
      if (row >= 0)
        mj_load_words<act_t, kVecElems>(y + (size_t)row * kHidden + (size_t)col * kVecElems,
                                        words[b]);
    }
#pragma unroll
    for (int b = 0; b < kLoadBatch; ++b) {
      const int j = j0 + b;
      if (j < kTopK && rows[tt * kTopK + j] >= 0) {
        const float wj = w[tt * kTopK + j];
#pragma unroll
        for (int e = 0; e < kVecElems; ++e)
          acc[e] = fmaf(wj, mj_dtype<act_t>::to_float(mj_word_elem<act_t>(words[b], e)), acc[e]);
      }
    }
  }
}

// 128-byte lines, the unit of L2's discard and priority instructions.
// Where y's rows are whole lines (then every vector is 16 bytes), the 8
// lanes that read one line of a row are 8 consecutive lanes of one warp.
enum : bool { kRowLines = (kHidden * sizeof(act_t)) % 128 == 0 };
enum : int { kLineVecs = 128 / (kVecElems * (int)sizeof(act_t)) };

__device__ __forceinline__ void mj_l2_discard(const void *line) {
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(line) : "memory");
}

__device__ __forceinline__ void mj_l2_demote(const void *line) {
  asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(line) : "memory");
}

// op(line) for lines [0, n) from p, spread over every thread of the grid.
template <class Op>
__device__ __forceinline__ void mj_each_line(const char *p, long long n, Op op) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    op(p + i * 128);
}

// The output vectors of a tile, a thread each. With kDropY every lane of a
// warp runs every pass (vectors past the tile's end compute nothing), so
// that after __syncwarp the lanes that have read a line of y are known to
// be done with it (their loaded values were added) and the first of them
// discards it.
template <bool kDropY>
__device__ __forceinline__ void combine_tile(const act_t *__restrict__ y, const int *rows,
                                             const float *w, int t0, int n_tok,
                                             out_t *__restrict__ out) {
  const int n_vec = n_tok * row_tiling::kVecs;
  const int lane = (int)(threadIdx.x & 31u);
  for (int v0 = kDropY ? (int)threadIdx.x - lane : (int)threadIdx.x; v0 < n_vec; v0 += blockDim.x) {
    const int v = kDropY ? v0 + lane : v0;
    const int tt = v / row_tiling::kVecs, col = v % row_tiling::kVecs;
    if (!kDropY || v < n_vec) {
      float acc[kVecElems];
      combine_vector(y, rows, w, tt, col, acc);
      mj_store_floats<out_t, kVecElems>(out + (size_t)(t0 + tt) * kHidden + (size_t)col * kVecElems,
                                        acc);
    }
    if constexpr (kDropY) {
      __syncwarp();
      if (v < n_vec && col % kLineVecs == 0) {
#pragma unroll
        for (int j = 0; j < kTopK; ++j) {
          const int row = rows[tt * kTopK + j];
          if (row >= 0) mj_l2_discard(y + (size_t)row * kHidden + (size_t)col * kVecElems);
        }
      }
    }
  }
}

// Blocks loop over tiles of kTileTokens tokens; a thread per output vector.
// dead / dead_lines: whole 128-byte lines to discard from L2 (h; NULL, 0:
// none); gathered / gathered_lines: lines to demote (x); drop_y: discard
// each line of y once read (y 128-byte aligned; ignored unless kRowLines).
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_combine_rows(const act_t *__restrict__ y, const int *__restrict__ row_of,
                        const float *__restrict__ weights, int tokens, out_t *__restrict__ out,
                        const char *dead, long long dead_lines, const char *gathered,
                        long long gathered_lines, int drop_y) {
  __shared__ int rows[kTileTokens * kTopK];
  __shared__ float w[kTileTokens * kTopK];
  mj_each_line(dead, dead_lines, [](const char *line) { mj_l2_discard(line); });
  mj_each_line(gathered, gathered_lines, [](const char *line) { mj_l2_demote(line); });
  for (long long tile = blockIdx.x; tile * kTileTokens < tokens; tile += gridDim.x) {
    const int t0 = (int)(tile * kTileTokens);
    const int n_tok = min(kTileTokens, tokens - t0);
    for (int q = threadIdx.x; q < n_tok * kTopK; q += blockDim.x) {
      const size_t entry = (size_t)t0 * kTopK + q;
      rows[q] = __ldg(row_of + entry);
      w[q] = weights != nullptr ? __ldg(weights + entry) : 1.0f;  // fmaf(1, v, a) == a + v
    }
    __syncthreads();
    if (kRowLines && drop_y)
      combine_tile<kRowLines>(y, rows, w, t0, n_tok, out);
    else
      combine_tile<false>(y, rows, w, t0, n_tok, out);
    __syncthreads();  // rows and w are rewritten by the next tile
  }
}
