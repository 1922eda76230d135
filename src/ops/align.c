/* moejit_align: checks the arguments, then the launches of
 * templates/align.cu: count, scan, scatter + copy; or, when one chunk holds
 * every entry, the fused count + scan then scatter + copy; or, for a few
 * chunks, count then the fused scan + scatter + copy. Plus the
 * workspace and tile-list size queries. Workspace layout: chunk_counts
 * [chunks][E+1] int32, then (256-byte aligned) chunk_rank [T*k] int32. */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"

static const char op[] = "moejit_align";

static moejit_status check_query(const moejit_model *m, const char *what, int64_t tokens,
                                 const void *out) {
  if (!m) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: model is NULL", what);
  if (!out) return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: out is NULL", what));
  return mj_check_tokens(m, what, tokens);
}

moejit_status moejit_align_workspace_size(const moejit_model *model, int64_t tokens,
                                          size_t *bytes) {
  moejit_status st = check_query(model, "moejit_align_workspace_size", tokens, bytes);
  if (st) return st;
  *bytes = mj_align_rank_offset(&model->spec, tokens) +
           (size_t)tokens * (size_t)model->spec.top_k * sizeof(int32_t);
  return MOEJIT_OK;
}

static int64_t tile_capacity(const moejit_spec *s, int64_t tokens) {
  const int64_t entries = tokens * s->top_k;
  const int64_t bound = entries / s->gemm1.tile_m + s->experts;
  return entries < bound ? entries : bound;
}

moejit_status moejit_align_tile_capacity(const moejit_model *model, int64_t tokens,
                                         int64_t *tiles) {
  moejit_status st = check_query(model, "moejit_align_tile_capacity", tokens, tiles);
  if (st) return st;
  *tiles = tile_capacity(&model->spec, tokens);
  return MOEJIT_OK;
}

static moejit_status check_range(const moejit_model *m, int32_t first, int32_t last) {
  const int32_t e = m->spec.experts;
  if ((first == 0 && last == 0) || (first >= 0 && first < last && last <= e)) return MOEJIT_OK;
  return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                  "%s: expert range [%d, %d) is invalid (allowed 0 <= "
                                  "expert_first < expert_last <= experts = %d, or both 0 for "
                                  "all experts)",
                                  op, (int)first, (int)last, (int)e));
}

static moejit_status check_copy(const moejit_model *m, const moejit_align_args *a) {
  if ((a->x == NULL) != (a->xs == NULL))
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: %s is NULL but %s is not; HINT: pass both to copy x, or "
                                    "neither for indices only",
                                    op, a->x ? "xs" : "x", a->x ? "x" : "xs"));
  moejit_status st = mj_check_opt_ptr(m, op, "x", a->x, 16);
  return st ? st : mj_check_opt_ptr(m, op, "xs", a->xs, 16);
}

static moejit_status check_outputs(const moejit_model *m, const moejit_align_args *a) {
  const struct {
    const char *name;
    const void *ptr;
  } outs[] = {{"expert_counts", a->expert_counts}, {"expert_offsets", a->expert_offsets},
              {"sorted_slot", a->sorted_slot},     {"row_of", a->row_of},
              {"tile_expert", a->tile_expert},     {"tile_row_start", a->tile_row_start},
              {"num_tiles", a->num_tiles}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(outs); i++) {
    moejit_status st = mj_check_ptr(m, op, outs[i].name, outs[i].ptr, 4);
    if (st) return st;
  }
  return MOEJIT_OK;
}

static moejit_status check_workspace(const moejit_model *m, const moejit_align_args *a) {
  moejit_status st = mj_check_ptr(m, op, "workspace", a->workspace, 16);
  if (st) return st;
  size_t need = 0;
  if ((st = moejit_align_workspace_size(m, a->tokens, &need))) return st;
  if (a->workspace_bytes < need)
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: workspace_bytes = %zu, but %lld tokens need %zu; HINT: "
                                    "size it with moejit_align_workspace_size",
                                    op, a->workspace_bytes, (long long)a->tokens, need));
  return MOEJIT_OK;
}

static moejit_status check_align_args(const moejit_model *m, const moejit_align_args *a) {
  moejit_status st;
  if ((st = mj_check_call(m, MJ_OPS_ALIGN, op, a))) return st;
  if ((st = mj_check_tokens(m, op, a->tokens))) return st;
  if ((st = mj_check_ptr(m, op, "topk_ids", a->topk_ids, 4))) return st;
  if ((st = check_range(m, a->expert_first, a->expert_last))) return st;
  if ((st = check_copy(m, a))) return st;
  if ((st = check_outputs(m, a))) return st;
  return check_workspace(m, a);
}

/* Everything the launches pass, as the kernels' parameter types. */
typedef struct align_launch {
  int entries, tokens, chunks, tile_capacity, first, last;
  const int32_t *ids;
  int32_t *chunk_counts, *chunk_rank;
} align_launch;

static moejit_status launch_count(const moejit_model *m, align_launch *l, moejit_stream stream) {
  void *params[] = {&l->ids, &l->entries, &l->first, &l->last, &l->chunk_counts, &l->chunk_rank};
  const unsigned grid[3] = {(unsigned)l->chunks, 1, 1};
  const unsigned block[3] = {(unsigned)m->spec.align.block_threads, 1, 1};
  return mj_ctx_launch(m->ctx, m->align_count, grid, block, mj_align_count_smem(&m->spec), stream,
                       params);
}

/* Count and scan in one block, for a single chunk: the count's block and
 * dynamic shared memory; chunk_counts ends as the scan would leave it. */
static moejit_status launch_count_scan(const moejit_model *m, align_launch *l,
                                       const moejit_align_args *a, moejit_stream stream) {
  int32_t *counts = a->expert_counts, *offsets = a->expert_offsets;
  int32_t *tile_expert = a->tile_expert, *tile_row = a->tile_row_start, *n_tiles = a->num_tiles;
  void *params[] = {&l->ids,           &l->entries,      &l->first,      &l->last,
                    &l->tile_capacity, &l->chunk_counts, &l->chunk_rank, &counts,
                    &offsets,          &tile_expert,     &tile_row,      &n_tiles};
  const unsigned grid[3] = {1, 1, 1};
  const unsigned block[3] = {(unsigned)m->spec.align.block_threads, 1, 1};
  return mj_ctx_launch(m->ctx, m->align_count_scan, grid, block, mj_align_count_smem(&m->spec),
                       stream, params);
}

static moejit_status launch_scan(const moejit_model *m, align_launch *l, const moejit_align_args *a,
                                 moejit_stream stream) {
  int32_t *counts = a->expert_counts, *offsets = a->expert_offsets;
  int32_t *tile_expert = a->tile_expert, *tile_row = a->tile_row_start, *n_tiles = a->num_tiles;
  void *params[] = {&l->chunks, &l->tile_capacity, &l->chunk_counts, &counts,
                    &offsets,   &tile_expert,      &tile_row,        &n_tiles};
  const unsigned grid[3] = {1, 1, 1}, block[3] = {MJ_ALIGN_SCAN_THREADS, 1, 1};
  return mj_ctx_launch(m->ctx, m->align_scan, grid, block, 0, stream, params);
}

/* The scatter's blocks loop over tiles of tokens (mj_row_tile_tokens). */
static unsigned scatter_grid(const moejit_model *m, const align_launch *l) {
  const int tile_tokens = mj_row_tile_tokens(m->spec.hidden, moejit_dtype_size(m->spec.act_dtype),
                                             m->spec.align.block_threads);
  return mj_tile_grid(m, (l->tokens + tile_tokens - 1) / tile_tokens);
}

static moejit_status launch_scatter(const moejit_model *m, align_launch *l,
                                    const moejit_align_args *a, moejit_stream stream) {
  const int32_t *offsets = a->expert_offsets;
  int32_t *sorted = a->sorted_slot, *row_of = a->row_of;
  const void *x = a->x;
  void *xs = a->xs;
  void *params[] = {
      &l->ids, &l->tokens, &l->first, &l->last, &l->chunk_counts, &l->chunk_rank, &offsets,
      &sorted, &row_of,    &x,        &xs};
  const unsigned grid[3] = {scatter_grid(m, l), 1, 1};
  const unsigned block[3] = {(unsigned)m->spec.align.block_threads, 1, 1};
  return mj_ctx_launch(m->ctx, m->align_scatter, grid, block, 0, stream, params);
}

/* The scan and the scatter in one launch, for a few chunks: every block
 * scans the chunks' histograms (dynamic shared memory, chunks x (E+1)
 * ints); block 0 writes counts, offsets and tiles. */
static moejit_status launch_scan_scatter(const moejit_model *m, align_launch *l,
                                         const moejit_align_args *a, moejit_stream stream) {
  int32_t *counts = a->expert_counts, *offsets = a->expert_offsets;
  int32_t *tile_expert = a->tile_expert, *tile_row = a->tile_row_start, *n_tiles = a->num_tiles;
  int32_t *sorted = a->sorted_slot, *row_of = a->row_of;
  const void *x = a->x;
  void *xs = a->xs;
  void *params[] = {
      &l->ids,          &l->tokens,     &l->first, &l->last, &l->chunks,   &l->tile_capacity,
      &l->chunk_counts, &l->chunk_rank, &counts,   &offsets, &tile_expert, &tile_row,
      &n_tiles,         &sorted,        &row_of,   &x,       &xs};
  const unsigned grid[3] = {scatter_grid(m, l), 1, 1};
  const unsigned block[3] = {(unsigned)m->spec.align.block_threads, 1, 1};
  const unsigned smem = (unsigned)l->chunks * (unsigned)(m->spec.experts + 1) * sizeof(int32_t);
  return mj_ctx_launch(m->ctx, m->align_scan_scatter, grid, block, smem, stream, params);
}

/* Two launches instead of three when a few count blocks hold every entry
 * (1 < chunks <= MJ_ALIGN_SCAN_SCATTER_CHUNKS): the scan runs inside the
 * scatter. $MOEJIT_ALIGN_FUSED=0 asks for three (tests compare them). */
static int scan_in_scatter(const align_launch *l) {
  if (l->chunks < 2 || l->chunks > MJ_ALIGN_SCAN_SCATTER_CHUNKS) return 0;
  return mj_env_switch("MOEJIT_ALIGN_FUSED", 1);
}

/* Two launches instead of three when one count block holds every entry
 * (small T: the stage is launch latency), unless the fused kernel does not
 * fit the device's shared memory (model load decides) or
 * $MOEJIT_ALIGN_FUSED=0 asks for three (tests compare the two paths). */
static int fused(const moejit_model *m, const align_launch *l) {
  if (l->chunks != 1 || m->align_unfused) return 0;
  return mj_env_switch("MOEJIT_ALIGN_FUSED", 1);
}

moejit_status moejit_align(const moejit_model *model, const moejit_align_args *args,
                           moejit_stream stream) {
  moejit_status st = check_align_args(model, args);
  if (st) return st;
  const moejit_spec *s = &model->spec;
  const int all = args->expert_first == 0 && args->expert_last == 0;
  align_launch l = {
      .entries = (int)(args->tokens * s->top_k),
      .tokens = (int)args->tokens,
      .chunks = (int)mj_align_chunks(s, args->tokens),
      .tile_capacity = (int)tile_capacity(s, args->tokens),
      .first = all ? 0 : args->expert_first,
      .last = all ? s->experts : args->expert_last,
      .ids = args->topk_ids,
      .chunk_counts = (int32_t *)args->workspace,
      .chunk_rank = (int32_t *)((char *)args->workspace + mj_align_rank_offset(s, args->tokens)),
  };
  if (fused(model, &l)) {
    if ((st = launch_count_scan(model, &l, args, stream))) return st;
    return launch_scatter(model, &l, args, stream);
  }
  if ((st = launch_count(model, &l, stream))) return st;
  if (scan_in_scatter(&l)) return launch_scan_scatter(model, &l, args, stream);
  if ((st = launch_scan(model, &l, args, stream))) return st;
  return launch_scatter(model, &l, args, stream);
}
