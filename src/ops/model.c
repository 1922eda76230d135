/* The model object: a validated spec copy and the CUfunctions of its route,
 * align and combine kernels on one ctx (whole layers also warm the GEMM
 * kernels), all families compiled at once, the load report, plus the
 * launch-shape formulas the host shares with the templates. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "ops/gemm.h"
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

/* One kernel family's share of a load: compiled on a worker thread, its
 * report row, and the failure message carried back to the caller's thread
 * (errors are recorded per thread). */
typedef struct family_job {
  unsigned bit;
  const char *name;
  moejit_status status;
  char message[1024];
  moejit_load_kernel row;
} family_job;

typedef struct load_batch {
  moejit_model *m;
  family_job jobs[MOEJIT_LOAD_MAX_KERNELS];
  size_t n;
} load_batch;

static const struct {
  unsigned bit;
  const char *name;
} load_families[] = {{MJ_OPS_ROUTE, "route"},
                     {MJ_OPS_ALIGN, "align"},
                     {MJ_OPS_GEMM1, "gemm1"},
                     {MJ_OPS_GEMM2, "gemm2"},
                     {MJ_OPS_COMBINE, "combine"}};

/* The launch shape a family is built with, for the report. */
static void describe_config(const moejit_spec *s, unsigned bit, moejit_load_kernel *row) {
  const moejit_gemm_cfg *g = bit == MJ_OPS_GEMM1   ? &s->gemm1
                             : bit == MJ_OPS_GEMM2 ? &s->gemm2
                                                   : NULL;
  int threads = bit == MJ_OPS_ROUTE   ? s->route.block_threads
                : bit == MJ_OPS_ALIGN ? s->align.block_threads
                                      : s->combine.block_threads;
  if (g)
    snprintf(row->config, sizeof row->config, "%dx%dx%d s%d w%d", g->tile_m, g->tile_n, g->tile_k,
             g->stages, g->warps);
  else
    snprintf(row->config, sizeof row->config, "block %d", threads);
  /* No tuned tables yet: every shape is the config's or the defaults. */
  mj_strlcpy(row->config_source, "heuristic", sizeof row->config_source);
  mj_strlcpy(row->config_detail, "kernels section of the config, else the built-in defaults",
             sizeof row->config_detail);
}

/* Worker: generate + compile (or read the cache) one family. Module loads
 * happen afterwards on the caller's thread (they serialize on the ctx). */
static void compile_family(size_t i, void *arg) {
  load_batch *b = arg;
  family_job *j = &b->jobs[i];
  moejit_ctx *ctx = b->m->ctx;
  const void *cubin = NULL;
  size_t len = 0;
  int hit = 0;
  double t0 = mj_now_ms();
  j->status = mj_compiler_get_cubin(moejit_ctx_compiler(ctx), &b->m->spec, j->name,
                                    mj_ctx_arch(ctx), &cubin, &len, j->row.key, &hit);
  j->row.ms = mj_now_ms() - t0;
  j->row.cache_hit = hit;
  if (j->status) snprintf(j->message, sizeof j->message, "%s", moejit_last_error());
}

static moejit_status resolve(moejit_model *m, const char *family, const char *entry,
                             CUfunction *slot) {
  CUfunction fn;
  moejit_status st = mj_ctx_get_function(m->ctx, &m->spec, family, entry, slot ? slot : &fn);
  return st ? mj_fail_prefix(st, "moejit_model_load: kernel '%s'", entry) : MOEJIT_OK;
}

/* Row counts whose launch plans name every entry a GEMM launcher may pick
 * (the plan may switch kernels with the row count). */
static const int64_t gemm_probe_rows[] = {1, 64, 4096, 1 << 20};

/* Warms the ctx's kernel memo with the exact (spec, family, entry) the GEMM
 * launchers look up (their plan for this ctx's arch: mma.sync, or wgmma on
 * sm_90a when enabled), so a forward never generates code or loads a module. */
static moejit_status resolve_gemm(moejit_model *m, int which) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(gemm_probe_rows); i++) {
    mj_gemm_plan plan;
    moejit_status st = mj_gemm_plan_make_for(&m->spec, which, MOEJIT_GEMM_PATH_AUTO,
                                             gemm_probe_rows[i], mj_ctx_arch(m->ctx), &plan);
    if (st) return mj_fail_prefix(st, "moejit_model_load");
    moejit_spec scratch;
    const moejit_spec *kspec = mj_gemm_kernel_spec(&m->spec, which, &plan, &scratch);
    CUfunction fn;
    if ((st = mj_ctx_get_function(m->ctx, kspec, plan.family, plan.entry, &fn)))
      return mj_fail_prefix(st, "moejit_model_load: kernel '%s'", plan.entry);
  }
  return MOEJIT_OK;
}

static moejit_status load_functions(moejit_model *m, unsigned families) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(kernel_entries); i++) {
    const kernel_entry *k = &kernel_entries[i];
    if (!(families & k->family)) continue;
    CUfunction *slot = (CUfunction *)((char *)m + k->slot);
    moejit_status st = resolve(m, k->family_name, k->entry, slot);
    if (st) return st;
  }
  moejit_status st;
  if ((families & MJ_OPS_GEMM1) && (st = resolve_gemm(m, 1))) return st;
  if ((families & MJ_OPS_GEMM2) && (st = resolve_gemm(m, 2))) return st;
  m->families = families & MJ_OPS_LAYER;
  return MOEJIT_OK;
}

/* Compiles every requested family at once; the first failure (in layer
 * order) becomes the caller's error. */
static moejit_status compile_families(moejit_model *m, unsigned families) {
  load_batch b = {.m = m};
  for (size_t i = 0; i < MJ_ARRAY_LEN(load_families); i++) {
    if (!(families & load_families[i].bit)) continue;
    family_job *j = &b.jobs[b.n++];
    j->bit = load_families[i].bit;
    j->name = load_families[i].name;
    mj_strlcpy(j->row.kernel, j->name, sizeof j->row.kernel);
    mj_strlcpy(j->row.arch, mj_ctx_arch(m->ctx), sizeof j->row.arch);
    describe_config(&m->spec, j->bit, &j->row);
  }
  double t0 = mj_now_ms();
  mj_parallel_for(b.n, 0, compile_family, &b);
  moejit_load_report *r = &m->report;
  r->compile_ms = mj_now_ms() - t0;
  moejit_status first = MOEJIT_OK;
  for (size_t i = 0; i < b.n; i++) {
    const family_job *j = &b.jobs[i];
    r->kernels[r->n_kernels++] = j->row;
    if (j->status == MOEJIT_OK) j->row.cache_hit ? r->cache_hits++ : r->cache_misses++;
    if (j->status && !first)
      first = mj_fail(j->status, "moejit_model_load: kernel '%s': %s", j->name, j->message);
  }
  return first;
}

static void report_start(moejit_load_report *r, const moejit_spec *spec, moejit_ctx *ctx,
                         const char *origin) {
  memset(r, 0, sizeof *r);
  mj_strlcpy(r->model, spec->name, sizeof r->model);
  mj_strlcpy(r->origin, origin ? origin : "spec", sizeof r->origin);
  mj_strlcpy(r->arch, mj_ctx_arch(ctx), sizeof r->arch);
}

static moejit_status load_into(moejit_model *m, unsigned families, double t_start) {
  moejit_status st = compile_families(m, families);
  if (st) return st;
  double t0 = mj_now_ms();
  st = load_functions(m, families);
  m->report.load_ms = mj_now_ms() - t0;
  m->report.total_ms = mj_now_ms() - t_start;
  return st;
}

static moejit_status check_load_args(moejit_ctx *ctx, const moejit_spec *spec, moejit_model **out) {
  if (!ctx || !spec || !out)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_load: %s is NULL",
                   !ctx    ? "ctx"
                   : !spec ? "spec"
                           : "out");
  moejit_status st = moejit_spec_validate(spec);
  if (st) return mj_ctx_fail(ctx, mj_fail_prefix(st, "moejit_model_load"));
  if ((st = check_supported(spec))) return mj_ctx_fail(ctx, st);
  return MOEJIT_OK;
}

moejit_status mj_model_load_reported(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                     const char *origin, moejit_load_report *report,
                                     moejit_model **out) {
  const double t_start = mj_now_ms();
  if (out) *out = NULL;
  moejit_status st = check_load_args(ctx, spec, out);
  if (st) return st;
  mj_device_limits limits;
  if ((st = mj_ctx_limits(ctx, &limits))) return st;

  moejit_model *m = calloc(1, sizeof *m);
  if (!m)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory"));
  m->ctx = ctx;
  m->spec = *spec;
  m->sm_count = limits.sm_count > 0 ? limits.sm_count : 1;
  report_start(&m->report, spec, ctx, origin);
  st = load_into(m, families, t_start);
  if (report) *report = m->report;
  if (st) {
    free(m);
    return mj_ctx_fail(ctx, st);
  }
  *out = m;
  return MOEJIT_OK;
}

moejit_status mj_model_load(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                            moejit_model **out) {
  return mj_model_load_reported(ctx, spec, families, "spec", NULL, out);
}

moejit_status moejit_model_load(moejit_ctx *ctx, const moejit_spec *spec, moejit_model **out) {
  return mj_model_load(ctx, spec, MJ_OPS_ALL, out);
}

moejit_status moejit_model_load_report(const moejit_model *model, moejit_load_report *report) {
  if (!model || !report)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_load_report: %s is NULL",
                   !model ? "model" : "report");
  *report = model->report;
  return MOEJIT_OK;
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
