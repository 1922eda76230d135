// How the row-streaming kernels (align's permuted copy, combine) cut
// [tokens, kHidden] rows into work: threads move one vector (16 bytes of the
// element type where kHidden allows) at a time, and a block takes a tile of
// kTokens rows so that each thread has about four vectors in flight per tile.
// src/ops/ops.h (mj_row_tile_tokens) mirrors kTokens to size the grid; the
// kernels loop over tiles, so a mismatch would cost speed, never results.
#ifndef MOEJIT_COMMON_ROWS_CUH
#define MOEJIT_COMMON_ROWS_CUH

#include "dtype.cuh"

template <typename T>
struct mj_row_tiling {
  // Elements per vector: the most that fit 16 bytes and divide kHidden.
  enum : int { kVecElems = mj_pow2_divisor(kHidden, 16 / mj_dtype<T>::kBytes) };
  enum : int { kVecs = kHidden / kVecElems };  // vectors per row
  enum : int { kWanted = 4 * kBlockThreads / kVecs };
  enum : int { kTokens = kWanted < 1 ? 1 : (kWanted > 32 ? 32 : kWanted) };
};

#endif
