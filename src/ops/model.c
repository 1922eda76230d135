/* The model object: a validated spec copy and the CUfunctions of its route,
 * align and combine kernels on one ctx, plus the launch-shape formulas the
 * host shares with the templates. */
#include <stddef.h>
#include <stdlib.h>

#include "common/common.h"
#include "ops/ops.h"

/* Every kernel entry a model loads: its family (= template name), its
 * extern "C" name, and the model field that holds its CUfunction. */
typedef struct kernel_entry {
  unsigned family;
  const char *family_name, *entry;
  size_t slot; /* offsetof(moejit_model, ...) */
} kernel_entry;

static const kernel_entry kernel_entries[] = {
    {MJ_OPS_ROUTE, "route", "moejit_route_topk", offsetof(moejit_model, route_topk)},
    {MJ_OPS_ALIGN, "align", "moejit_align_count", offsetof(moejit_model, align_count)},
    {MJ_OPS_ALIGN, "align", "moejit_align_scan", offsetof(moejit_model, align_scan)},
    {MJ_OPS_ALIGN, "align", "moejit_align_scatter", offsetof(moejit_model, align_scatter)},
    {MJ_OPS_COMBINE, "combine", "moejit_combine_rows", offsetof(moejit_model, combine)},
};

/* Valid specs these kernels still cannot run (the route kernel keeps a
 * group's lanes inside one warp). */
static moejit_status check_supported(const moejit_spec *spec) {
  if (spec->routing.rule == MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK && spec->routing.n_group > 32)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "moejit_model_load: routing.n_group = %d; the route kernel handles at most 32 "
                   "groups (one warp per token); HINT: use n_group <= 32",
                   spec->routing.n_group);
  return MOEJIT_OK;
}

static moejit_status load_functions(moejit_model *m, unsigned families) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(kernel_entries); i++) {
    const kernel_entry *k = &kernel_entries[i];
    if (!(families & k->family)) continue;
    CUfunction *slot = (CUfunction *)((char *)m + k->slot);
    moejit_status st = mj_ctx_get_function(m->ctx, &m->spec, k->family_name, k->entry, slot);
    if (st) return mj_fail_prefix(st, "moejit_model_load: kernel '%s'", k->entry);
  }
  m->families = families & MJ_OPS_ALL;
  return MOEJIT_OK;
}

moejit_status mj_model_load(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                            moejit_model **out) {
  if (out) *out = NULL;
  if (!ctx || !spec || !out)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_load: %s is NULL",
                   !ctx    ? "ctx"
                   : !spec ? "spec"
                           : "out");
  moejit_status st = moejit_spec_validate(spec);
  if (st) return mj_ctx_fail(ctx, mj_fail_prefix(st, "moejit_model_load"));
  if ((st = check_supported(spec))) return mj_ctx_fail(ctx, st);
  mj_device_limits limits;
  if ((st = mj_ctx_limits(ctx, &limits))) return st;

  moejit_model *m = calloc(1, sizeof *m);
  if (!m)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory"));
  m->ctx = ctx;
  m->spec = *spec;
  m->sm_count = limits.sm_count > 0 ? limits.sm_count : 1;
  if ((st = load_functions(m, families))) {
    free(m);
    return mj_ctx_fail(ctx, st);
  }
  *out = m;
  return MOEJIT_OK;
}

moejit_status moejit_model_load(moejit_ctx *ctx, const moejit_spec *spec, moejit_model **out) {
  return mj_model_load(ctx, spec, MJ_OPS_ALL, out);
}

void moejit_model_destroy(moejit_model *model) {
  free(model);
}

const moejit_spec *moejit_model_spec(const moejit_model *model) {
  return model ? &model->spec : NULL;
}

moejit_status mj_model_fail(const moejit_model *model, moejit_status status) {
  return model ? mj_ctx_fail(model->ctx, status) : status;
}

/* ---- launch shapes ------------------------------------------------------ */

int64_t mj_align_chunk_entries(const moejit_spec *spec) {
  return (int64_t)spec->align.block_threads * MJ_ALIGN_COUNT_BATCH;
}

int64_t mj_align_chunks(const moejit_spec *spec, int64_t tokens) {
  const int64_t chunk = mj_align_chunk_entries(spec);
  return (tokens * spec->top_k + chunk - 1) / chunk;
}

static size_t round_up_256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

size_t mj_align_rank_offset(const moejit_spec *spec, int64_t tokens) {
  return round_up_256((size_t)mj_align_chunks(spec, tokens) * (size_t)(spec->experts + 1) *
                      sizeof(int32_t));
}

/* Mirrors mj_pow2_divisor and mj_row_tiling in templates/common/. */
int mj_row_tile_tokens(int64_t hidden, size_t elem_bytes, int block_threads) {
  int64_t vec_elems = 16 / (int64_t)elem_bytes;
  while (vec_elems > 1 && hidden % vec_elems != 0) vec_elems /= 2;
  const int64_t vecs = hidden / vec_elems;
  const int64_t wanted = 4 * (int64_t)block_threads / vecs;
  return wanted < 1 ? 1 : wanted > 32 ? 32 : (int)wanted;
}

unsigned mj_tile_grid(const moejit_model *model, int64_t tiles) {
  const int64_t cap = (int64_t)model->sm_count * 32;
  return (unsigned)(tiles < cap ? tiles : cap);
}
