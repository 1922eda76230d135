/* Internal face of the grouped GEMMs: the launch plan the host derives from
 * a spec, mirroring templates/common/gemm_config.cuh (warp layout, shared
 * memory) and gemm_tiles.cuh (M-tile slots). Public calls: moejit/gemm.h. */
#ifndef MOEJIT_SRC_OPS_GEMM_H
#define MOEJIT_SRC_OPS_GEMM_H

#include "moejit/gemm.h"

typedef struct mj_gemm_plan {
  const char *family;     /* "gemm1" or "gemm2" */
  const char *entry;      /* extern "C" name in the template */
  int use_mma;            /* 1: tensor-core entry, 0: SIMT entry */
  int tile_m, tile_n;     /* CTA tile (tile_n counts B rows: gate + up for gemm1) */
  int n_out;              /* output columns: f (gemm1) or d (gemm2) */
  int k;                  /* reduction length: d (gemm1) or f (gemm2) */
  int n_tiles;            /* ceil(n_out / output columns per tile) */
  int m_slots;            /* floor(max_rows / tile_m) + E */
  int warps_m, warps_n, warps_k;
  unsigned grid, threads; /* 1-D grid and block */
  unsigned smem_bytes;    /* dynamic shared memory */
} mj_gemm_plan;

/* How warps split a tile_m x tile_n tile (templates/common/gemm_config.cuh,
 * mj_gemm_warp_layout: fewest k-splits, then the squarest warp tile). */
void mj_gemm_warp_layout(int tile_m, int tile_n, int warps, int *wm, int *wn, int *wk);

/* Why the tensor-core kernel cannot run `which` (1 or 2) of spec, or NULL
 * when it can. */
const char *mj_gemm_mma_blocker(const moejit_spec *spec, int which);

/* The launch plan of GEMM `which` (1 or 2) for max_rows rows (>= 1) and the
 * requested path. INVALID_ARGUMENT for a spec whose gemm fields, shape or
 * dtypes are out of range, or a grid too large; UNSUPPORTED for path MMA
 * (or AUTO with 12 warps) where the tensor-core kernel cannot run. */
moejit_status mj_gemm_plan_make(const moejit_spec *spec, int which, moejit_gemm_path path,
                                int64_t max_rows, mj_gemm_plan *out);

#endif
