/* Internal face of the ops layer: the model object, the launch shapes the
 * host shares with templates/ (align's chunk size, the row tiling of align's
 * copy and of combine) and the argument checks every launcher runs first.
 * The public calls live in include/moejit/ops.h. */
#ifndef MOEJIT_SRC_OPS_H
#define MOEJIT_SRC_OPS_H

#include "moejit/moejit.h"
#include "moejit/ops.h"
#include "moejit/layer.h"
#include "runtime/runtime.h"

/* Kernel families a model can hold (bit mask). */
enum {
  MJ_OPS_ROUTE = 1u << 0,
  MJ_OPS_ALIGN = 1u << 1,
  MJ_OPS_COMBINE = 1u << 2,
  /* What moejit_model_load loads (the memory-bound stages). */
  MJ_OPS_ALL = MJ_OPS_ROUTE | MJ_OPS_ALIGN | MJ_OPS_COMBINE,
  MJ_OPS_GEMM1 = 1u << 3,
  MJ_OPS_GEMM2 = 1u << 4,
  /* A whole layer (moejit_model_load_spec / _config, moejit_moe_forward). */
  MJ_OPS_LAYER = MJ_OPS_ALL | MJ_OPS_GEMM1 | MJ_OPS_GEMM2
};

struct moejit_model {
  moejit_ctx *ctx; /* borrowed */
  moejit_spec spec;
  unsigned families; /* MJ_OPS_* loaded */
  int sm_count;
  CUfunction route_topk;
  CUfunction align_count, align_scan, align_scatter;
  CUfunction combine;
  moejit_load_report report; /* what the load did (moejit_model_load_report) */
};

/* moejit_model_load restricted to `families` (tests that launch only one
 * family skip compiling the others). Launching a family that was not
 * loaded is INVALID_ARGUMENT. */
moejit_status mj_model_load(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                            moejit_model **out);

/* mj_model_load that also fills *report (may be NULL; filled as far as the
 * load got on failure) with `origin` naming where the spec came from. All
 * families compile at once on the ctx compiler's threads; the GEMM families
 * also warm the ctx's kernel memo for every entry the launchers pick, so a
 * later launch never generates code or loads a module. */
moejit_status mj_model_load_reported(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                     const char *origin, moejit_load_report *report,
                                     moejit_model **out);

/* Records the failure on the model's ctx too and returns `status`. */
moejit_status mj_model_fail(const moejit_model *model, moejit_status status);

/* ---- launch shapes mirrored from templates/ --------------------------- */

/* templates/align.cu: kChunkEntries = kBlockThreads * kCountBatch. The
 * workspace is sized from it, so the two must agree. */
#define MJ_ALIGN_COUNT_BATCH 8
/* moejit_align_scan runs as one block of this many threads. */
#define MJ_ALIGN_SCAN_THREADS 1024

int64_t mj_align_chunk_entries(const moejit_spec *spec);
int64_t mj_align_chunks(const moejit_spec *spec, int64_t tokens);
/* Byte offset of chunk_rank inside the workspace (chunk_counts come first). */
size_t mj_align_rank_offset(const moejit_spec *spec, int64_t tokens);

/* templates/common/rows.cuh: tokens per block tile of a row-streaming kernel
 * whose rows are `hidden` elements of `elem_bytes` bytes. Sizes the grid
 * only (the kernels loop over tiles). */
int mj_row_tile_tokens(int64_t hidden, size_t elem_bytes, int block_threads);

/* Blocks for a kernel that loops over `tiles` tiles: one per tile, at most
 * 32 per SM (more only adds block launches). */
unsigned mj_tile_grid(const moejit_model *model, int64_t tiles);

/* ---- argument checks (check.c); each failure records a message --------- */

/* Model non-NULL and holding `family`; args non-NULL. */
moejit_status mj_check_call(const moejit_model *model, unsigned family, const char *op,
                            const void *args);
/* 1 <= tokens and tokens * top_k <= INT32_MAX. */
moejit_status mj_check_tokens(const moejit_model *model, const char *op, int64_t tokens);
/* Non-NULL and aligned to `align` bytes. */
moejit_status mj_check_ptr(const moejit_model *model, const char *op, const char *field,
                           const void *ptr, size_t align);
/* NULL, or aligned to `align` bytes. */
moejit_status mj_check_opt_ptr(const moejit_model *model, const char *op, const char *field,
                               const void *ptr, size_t align);

#endif
