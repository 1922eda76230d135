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

// Blocks loop over tiles of kTileTokens tokens; a thread per output vector.
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_combine_rows(const act_t *__restrict__ y, const int *__restrict__ row_of,
                        const float *__restrict__ weights, int tokens, out_t *__restrict__ out) {
  __shared__ int rows[kTileTokens * kTopK];
  __shared__ float w[kTileTokens * kTopK];
  for (long long tile = blockIdx.x; tile * kTileTokens < tokens; tile += gridDim.x) {
    const int t0 = (int)(tile * kTileTokens);
    const int n_tok = min(kTileTokens, tokens - t0);
    for (int q = threadIdx.x; q < n_tok * kTopK; q += blockDim.x) {
      const size_t entry = (size_t)t0 * kTopK + q;
      rows[q] = __ldg(row_of + entry);
      w[q] = weights != nullptr ? __ldg(weights + entry) : 1.0f;  // fmaf(1, v, a) == a + v
    }
    __syncthreads();
    const int n_vec = n_tok * row_tiling::kVecs;
    for (int v = threadIdx.x; v < n_vec; v += blockDim.x) {
      const int tt = v / row_tiling::kVecs, col = v % row_tiling::kVecs;
      float acc[kVecElems];
      combine_vector(y, rows, w, tt, col, acc);
      mj_store_floats<out_t, kVecElems>(out + (size_t)(t0 + tt) * kHidden + (size_t)col * kVecElems,
                                        acc);
    }
    __syncthreads();  // rows and w are rewritten by the next tile
  }
}
