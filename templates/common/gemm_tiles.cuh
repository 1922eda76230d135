// Tile scheduler of the grouped GEMMs: maps a CTA to (expert, rows, n-tile)
// from the device-side expert offsets alone, so the host never needs the
// per-expert row counts (no sync, graph-capturable).
//
// Slots: expert e owns the M-tile slots [s(e), s(e+1)) with
//   s(e) = floor(offsets[e] / TM) + e.
// s(e+1) - s(e) = floor(offsets[e+1]/TM) - floor(offsets[e]/TM) + 1, which is
// >= ceil(rows_e / TM) (write offsets[e] = q*TM + r: the difference is
// floor((r + rows_e)/TM) >= floor(rows_e/TM)), so every row of every expert
// lands in a slot; the last slot is below floor(max_rows/TM) + E, the grid's
// M extent. Slots past an expert's rows find no work and exit at once.
#ifndef MOEJIT_COMMON_GEMM_TILES_CUH
#define MOEJIT_COMMON_GEMM_TILES_CUH

// Rows [row0, row_end) of `expert`, at most TM of them, and the CTA's n-tile.
struct mj_gemm_tile {
  int expert;
  int row0, row_end;
  int n_tile;
};

// M-tile slots the grid covers for at most max_rows rows.
__host__ __device__ constexpr int mj_gemm_m_slots(int max_rows, int tile_m, int experts) {
  return max_rows / tile_m + experts;
}

// offsets[e] clamped into [0, max_rows]: a corrupt offsets array may give
// wrong rows but never reads or writes outside the buffers.
__device__ __forceinline__ int mj_clamped_offset(const int *offsets, int e, int max_rows) {
  const int v = __ldg(offsets + e);
  return v < 0 ? 0 : (v > max_rows ? max_rows : v);
}

// Finds the CTA's tile. Every thread of the block must call it (it holds two
// __syncthreads); the result is the same in all threads. Returns false when
// the CTA has no rows to compute. Raster 0 walks slots (down M) fastest,
// raster 1 walks n-tiles fastest.
template <int TM, int THREADS, int EXPERTS, int RASTER>
__device__ bool mj_gemm_find_tile(const int *offsets, int max_rows, int n_tiles, mj_gemm_tile *t) {
  __shared__ int found_expert;
  const int m_slots = mj_gemm_m_slots(max_rows, TM, EXPERTS);
  const unsigned id = blockIdx.x;
  const int slot = RASTER == 0 ? (int)(id % (unsigned)m_slots) : (int)(id / (unsigned)n_tiles);
  t->n_tile = RASTER == 0 ? (int)(id / (unsigned)m_slots) : (int)(id % (unsigned)n_tiles);
  if (threadIdx.x == 0) found_expert = EXPERTS;
  __syncthreads();
  // One pass over the experts in parallel: a single round trip to L2.
  for (int e = threadIdx.x; e < EXPERTS; e += THREADS) {
    const int lo = mj_clamped_offset(offsets, e, max_rows);
    const int hi = mj_clamped_offset(offsets, e + 1, max_rows);
    if (slot >= lo / TM + e && slot < hi / TM + e + 1) atomicMin(&found_expert, e);
  }
  __syncthreads();
  const int e = found_expert;
  if (e >= EXPERTS || t->n_tile >= n_tiles) return false;
  const int lo = mj_clamped_offset(offsets, e, max_rows);
  const int hi = mj_clamped_offset(offsets, e + 1, max_rows);
  t->expert = e;
  t->row0 = lo + (slot - (lo / TM + e)) * TM;
  t->row_end = hi - t->row0 > TM ? t->row0 + TM : hi; /* by difference: row0 + TM may pass INT32_MAX */
  return t->row0 < hi;
}

#endif
