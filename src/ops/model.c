/* The model object: a validated spec copy and the CUfunctions of its route,
 * align and combine kernels on one ctx (whole layers also warm the GEMM
 * kernels, the tuned table's variants among them), all families compiled at
 * once, the load report, plus the launch-shape formulas the host shares
 * with the templates. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "config/config.h"
#include "dist/ep.h"
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
    {MJ_OPS_ALIGN, "align", "moejit_align_count_scan", offsetof(moejit_model, align_count_scan)},
    {MJ_OPS_COMBINE, "combine", "moejit_combine_rows", offsetof(moejit_model, combine)},
    {MJ_OPS_EP, "ep", "moejit_ep_mask", offsetof(moejit_model, ep_mask)},
    {MJ_OPS_EP, "ep", "moejit_ep_scan", offsetof(moejit_model, ep_scan)},
    {MJ_OPS_EP, "ep", "moejit_ep_pack", offsetof(moejit_model, ep_pack)},
    {MJ_OPS_EP, "ep", "moejit_ep_combine", offsetof(moejit_model, ep_combine)},
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

/* One kernel of a load: a family built from the model's spec, or a tuned
 * GEMM variant's (the same family, another tile). Compiled on a worker
 * thread; the failure message is carried back to the caller's thread
 * (errors are recorded per thread). */
typedef struct family_job {
  const char *name;         /* family = template name */
  const moejit_spec *spec;  /* &m->spec or one of load_batch.variant_specs */
  int row;                  /* the report row it counts into */
  int variant;              /* 1: a tuned variant's kernel */
  moejit_status status;
  char message[1024];
  char key[33];
  int hit;
  double ms;
} family_job;

#define MJ_LOAD_MAX_JOBS (MOEJIT_LOAD_MAX_KERNELS + 2 * MJ_GEMM_MAX_VARIANTS)

typedef struct load_batch {
  moejit_model *m;
  moejit_compiler *compiler; /* the ctx's, or moejit_model_prebuild's */
  const char *arch;          /* the ctx's, or the prebuild's target */
  family_job jobs[MJ_LOAD_MAX_JOBS];
  size_t n;
  moejit_spec variant_specs[2 * MJ_GEMM_MAX_VARIANTS];
  size_t n_specs;
} load_batch;

static const struct {
  unsigned bit;
  const char *name;
} load_families[] = {{MJ_OPS_ROUTE, "route"},
                     {MJ_OPS_ALIGN, "align"},
                     {MJ_OPS_GEMM1, "gemm1"},
                     {MJ_OPS_GEMM2, "gemm2"},
                     {MJ_OPS_COMBINE, "combine"},
                     {MJ_OPS_EP, "ep"}};

/* The launch shape a memory-bound family is built with, for the report. */
static void describe_config(const moejit_spec *s, unsigned bit, moejit_load_kernel *row) {
  int threads = bit == MJ_OPS_ROUTE   ? s->route.block_threads
                : bit == MJ_OPS_ALIGN ? s->align.block_threads
                                      : s->combine.block_threads; /* combine and ep */
  snprintf(row->config, sizeof row->config, "block %d", threads);
  mj_strlcpy(row->config_source, "heuristic", sizeof row->config_source);
  mj_strlcpy(row->config_detail, "kernels section of the config, else the built-in defaults",
             sizeof row->config_detail);
}

/* Generates and compiles (or reads from a cache) one kernel on a worker
 * thread: its status, time, and the message carried back to the caller's
 * thread (errors are recorded per thread). */
static moejit_status build_timed(moejit_compiler *c, const moejit_spec *spec, const char *family,
                                 const char *arch, char key[33], int *hit, double *ms,
                                 char *message, size_t cap) {
  const void *cubin = NULL;
  size_t len = 0;
  double t0 = mj_now_ms();
  moejit_status st = mj_compiler_get_cubin(c, spec, family, arch, &cubin, &len, key, hit);
  *ms = mj_now_ms() - t0;
  if (st) snprintf(message, cap, "%s", moejit_last_error());
  return st;
}

/* Worker: one family job. Module loads happen afterwards on the caller's
 * thread (they serialize on the ctx). */
static void compile_family(size_t i, void *arg) {
  load_batch *b = arg;
  family_job *j = &b->jobs[i];
  j->status = build_timed(b->compiler, j->spec, j->name, b->arch, j->key, &j->hit, &j->ms,
                          j->message, sizeof j->message);
}

/* Row counts whose launch plans name every entry a GEMM launcher may pick
 * (the plan may switch kernels with the row count). */
static const int64_t gemm_probe_rows[] = {1, 64, 4096, 1 << 20};

/* One kernel the load makes sure of: its (spec, family, entry) enters the
 * ctx's memo, so a forward never generates code or loads a module. */
typedef struct warm_job {
  moejit_spec spec;
  const char *family, *entry;
  char what[96]; /* for the error: "kernel 'x'" or "tuned T=n" */
  moejit_status status;
  char message[1024];
  int hit;   /* prebuild: the module came from a cache */
  double ms; /* prebuild: its generate + compile time */
} warm_job;

typedef struct warm_list {
  moejit_model *m;
  const char *arch;          /* the arch the GEMM plans are made for */
  moejit_compiler *compiler; /* prebuild: compiles the jobs' modules */
  warm_job *jobs;
  size_t n, cap;
} warm_list;

static moejit_status warm_add(warm_list *w, const moejit_spec *spec, const char *family,
                              const char *entry, const char *what) {
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 32;
    warm_job *j = realloc(w->jobs, cap * sizeof *j);
    if (!j) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory");
    w->jobs = j, w->cap = cap;
  }
  warm_job *j = &w->jobs[w->n++];
  memset(j, 0, sizeof *j);
  j->spec = *spec;
  j->family = family, j->entry = entry;
  mj_strlcpy(j->what, what, sizeof j->what);
  return MOEJIT_OK;
}

/* The exact (spec, family, entry) the launcher looks up for `plan`, and the
 * layer's other entries of that module: with a GEMV plan the decode
 * layer's, with GEMM 1's spec-tile wgmma plan its gathering twin. */
static moejit_status warm_plan(warm_list *w, const moejit_spec *spec, int which,
                               const mj_gemm_plan *plan, const char *what) {
  moejit_spec scratch;
  const moejit_spec *kspec = mj_gemm_kernel_spec(spec, which, plan, &scratch);
  moejit_status st = warm_add(w, kspec, plan->family, plan->entry, what);
  if (!st && plan->use_gemv)
    st = warm_add(w, kspec, plan->family, which == 1 ? MJ_ENTRY_DECODE1 : MJ_ENTRY_DECODE2, what);
  if (!st && which == 1 && plan->use_wgmma && !plan->wg_narrow)
    st = warm_add(w, kspec, plan->family, MJ_ENTRY_GEMM1_GATHER, what);
  return st;
}

/* Every entry the GEMM launchers may pick: the heuristic's (spec + AUTO:
 * mma.sync, its decode tile, or wgmma on sm_90a when enabled) and each
 * tuned variant's (its spec + path). */
static moejit_status list_gemm(warm_list *w, int which) {
  moejit_model *m = w->m;
  const char *arch = w->arch;
  mj_gemm_plan plan;
  moejit_status st;
  for (size_t i = 0; i < MJ_ARRAY_LEN(gemm_probe_rows); i++) {
    st = mj_gemm_plan_make_for(&m->spec, which, MOEJIT_GEMM_PATH_AUTO, gemm_probe_rows[i], arch,
                               &plan);
    if (st) return mj_fail_prefix(st, "moejit_model_load");
    char what[96];
    snprintf(what, sizeof what, "kernel '%s'", plan.entry);
    if ((st = warm_plan(w, &m->spec, which, &plan, what))) return st;
  }
  const mj_gemm_variants *vs = &m->gemm_variants[which - 1];
  for (int i = 0; i < vs->n; i++) {
    moejit_spec vspec;
    char what[96];
    snprintf(what, sizeof what, "tuned T=%lld", (long long)vs->v[i].tokens);
    mj_gemm_variant_spec(&m->spec, which, &vs->v[i], &vspec);
    st = mj_gemm_plan_make_for(&vspec, which, vs->v[i].path, vs->v[i].tokens * m->spec.top_k,
                               arch, &plan);
    if (st) return mj_fail_prefix(st, "moejit_model_load: %s", what);
    if ((st = warm_plan(w, &vspec, which, &plan, what))) return st;
  }
  return MOEJIT_OK;
}

/* Worker: code generation and the cache key run here, in parallel; module
 * loads serialize on the ctx. */
static void warm_one(size_t i, void *arg) {
  warm_list *w = arg;
  warm_job *j = &w->jobs[i];
  CUfunction fn;
  j->status = mj_ctx_get_function(w->m->ctx, &j->spec, j->family, j->entry, &fn);
  if (j->status) snprintf(j->message, sizeof j->message, "%s", moejit_last_error());
}

/* Every (spec, family, entry) a load of `families` resolves. */
static moejit_status warm_list_make(warm_list *w, unsigned families) {
  moejit_status st = MOEJIT_OK;
  for (size_t i = 0; i < MJ_ARRAY_LEN(kernel_entries) && !st; i++) {
    const kernel_entry *k = &kernel_entries[i];
    char what[96];
    snprintf(what, sizeof what, "kernel '%s'", k->entry);
    if (families & k->family) st = warm_add(w, &w->m->spec, k->family_name, k->entry, what);
  }
  if (!st && (families & MJ_OPS_GEMM1)) st = list_gemm(w, 1);
  if (!st && (families & MJ_OPS_GEMM2)) st = list_gemm(w, 2);
  return st;
}

static moejit_status warm_all(moejit_model *m, unsigned families) {
  warm_list w = {.m = m, .arch = mj_ctx_arch(m->ctx)};
  moejit_status st = warm_list_make(&w, families);
  if (!st) mj_parallel_for(w.n, 0, warm_one, &w);
  for (size_t i = 0; i < w.n && !st; i++)
    if (w.jobs[i].status)
      st = mj_fail(w.jobs[i].status, "moejit_model_load: %s: %s", w.jobs[i].what,
                   w.jobs[i].message);
  free(w.jobs);
  return st;
}

/* Sets m->align_unfused: the fused count + scan adds its static shared
 * memory (kBins-sized arrays) to the count's dynamic histograms, so where
 * the sum passes the device's opt-in limit and the count alone does not
 * (E near 1024 with a large align block on a small-smem GPU) align keeps
 * its three launches rather than fail. */
static moejit_status check_align_fused(moejit_model *m) {
  mj_device_limits limits;
  moejit_status st = mj_ctx_limits(m->ctx, &limits);
  if (st) return st;
  int static_smem = 0;
  if ((st = mj_ctx_enter(m->ctx))) return st;
  st = mj_cu_check(mj_ctx_driver(m->ctx)->FuncGetAttribute(
                       &static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, m->align_count_scan),
                   "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
  mj_ctx_leave(m->ctx);
  if (st) return mj_fail_prefix(st, "moejit_model_load: kernel 'moejit_align_count_scan'");
  m->align_unfused =
      (long long)mj_align_count_smem(&m->spec) + static_smem > limits.smem_per_block_optin;
  return MOEJIT_OK;
}

static moejit_status load_functions(moejit_model *m, unsigned families) {
  moejit_status st = warm_all(m, families);
  if (st) return st;
  for (size_t i = 0; i < MJ_ARRAY_LEN(kernel_entries); i++) { /* memo hits now */
    const kernel_entry *k = &kernel_entries[i];
    if (!(families & k->family)) continue;
    CUfunction *slot = (CUfunction *)((char *)m + k->slot);
    st = mj_ctx_get_function(m->ctx, &m->spec, k->family_name, k->entry, slot);
    if (st) return mj_fail_prefix(st, "moejit_model_load: kernel '%s'", k->entry);
  }
  if ((families & MJ_OPS_ALIGN) && (st = check_align_fused(m))) return st;
  m->families = families & (MJ_OPS_LAYER | MJ_OPS_EP);
  return MOEJIT_OK;
}

/* ---- tuned tables ----------------------------------------------------------- */

/* The table of the ctx's device, or (*have 0) why there is none. Fails only
 * where a table exists but cannot be read or parsed. */
static moejit_status table_named(const char *device_name, const moejit_load_opts *opts,
                                 const char *who, mj_tuned_table *t, int *have, char *why,
                                 size_t cap) {
  *have = 0;
  if (opts && opts->tuned_disable) {
    mj_strlcpy(why, "tuned tables are disabled (moejit_load_opts.tuned_disable)", cap);
    return MOEJIT_OK;
  }
  moejit_status st = mj_tuned_table_for_device(device_name, t);
  if (st == MOEJIT_OK) return *have = 1, MOEJIT_OK;
  if (st == MOEJIT_ERR_NOT_FOUND) return mj_strlcpy(why, moejit_last_error(), cap), MOEJIT_OK;
  char msg[1024];
  mj_strlcpy(msg, moejit_last_error(), sizeof msg);
  return mj_fail(st,
                 "%s: %s; HINT: fix or remove the tuned table, or load without it "
                 "(moejit_load_opts.tuned_disable, $MOEJIT_TUNED_DISABLE=1)",
                 who, msg);
}

static moejit_status find_table(moejit_ctx *ctx, const moejit_load_opts *opts, mj_tuned_table *t,
                                int *have, char *why, size_t cap) {
  *have = 0;
  if (opts && opts->tuned_disable)
    return table_named(NULL, opts, "moejit_model_load", t, have, why, cap);
  moejit_device_info info;
  if (moejit_ctx_device_info(ctx, &info) != MOEJIT_OK) {
    snprintf(why, cap, "no tuned table: the device's name is unknown (%s)", moejit_last_error());
    return MOEJIT_OK;
  }
  return table_named(info.name, opts, "moejit_model_load", t, have, why, cap);
}

static int same_cfg(const moejit_gemm_cfg *a, const moejit_gemm_cfg *b) {
  return a->tile_m == b->tile_m && a->tile_n == b->tile_n && a->tile_k == b->tile_k &&
         a->stages == b->stages && a->warps == b->warps && a->cluster_m == b->cluster_m &&
         a->cluster_n == b->cluster_n && a->raster == b->raster && a->schedule == b->schedule;
}

static family_job *add_job(load_batch *b, const char *name, const moejit_spec *spec, int row,
                           int variant) {
  family_job *j = &b->jobs[b->n++];
  j->name = name, j->spec = spec, j->row = row, j->variant = variant;
  return j;
}

/* One job per distinct tile among GEMM `which`'s variants; a tile equal to
 * the spec's own is the family job's kernel already. */
static void add_variant_jobs(load_batch *b, int which, int row) {
  const moejit_spec *spec = &b->m->spec;
  const mj_gemm_variants *vs = &b->m->gemm_variants[which - 1];
  const moejit_gemm_cfg *own = which == 1 ? &spec->gemm1 : &spec->gemm2;
  for (int i = 0; i < vs->n; i++) {
    int seen = same_cfg(&vs->v[i].cfg, own);
    for (int k = 0; k < i && !seen; k++) seen = same_cfg(&vs->v[i].cfg, &vs->v[k].cfg);
    if (seen) continue;
    moejit_spec *vspec = &b->variant_specs[b->n_specs++];
    mj_gemm_variant_spec(spec, which, &vs->v[i], vspec);
    add_job(b, which == 1 ? "gemm1" : "gemm2", vspec, row, 1);
  }
}

/* Report rows (one per family, tuned tables consulted for the GEMMs) and
 * the jobs that build them. */
static void plan_jobs(load_batch *b, unsigned families, const mj_tuned_table *table,
                      const char *no_table) {
  moejit_model *m = b->m;
  moejit_load_report *r = &m->report;
  for (size_t i = 0; i < MJ_ARRAY_LEN(load_families); i++) {
    const unsigned bit = load_families[i].bit;
    if (!(families & bit)) continue;
    const int row_i = r->n_kernels++, which = bit == MJ_OPS_GEMM1 ? 1 : bit == MJ_OPS_GEMM2 ? 2 : 0;
    moejit_load_kernel *row = &r->kernels[row_i];
    mj_strlcpy(row->kernel, load_families[i].name, sizeof row->kernel);
    mj_strlcpy(row->arch, b->arch, sizeof row->arch);
    if (which)
      mj_gemm_variants_collect(table, no_table, &m->spec, which, b->arch,
                               &m->gemm_variants[which - 1], row);
    else
      describe_config(&m->spec, bit, row);
    add_job(b, load_families[i].name, &m->spec, row_i, 0);
    if (which) add_variant_jobs(b, which, row_i);
  }
}

/* Folds the jobs into their rows: a row is a cache hit when none of its
 * kernels was compiled; its ms adds up its kernels' times. */
static moejit_status fold_jobs(load_batch *b) {
  moejit_load_report *r = &b->m->report;
  int family_hit[MOEJIT_LOAD_MAX_KERNELS] = {0}, failed[MOEJIT_LOAD_MAX_KERNELS] = {0};
  moejit_status first = MOEJIT_OK;
  for (size_t i = 0; i < b->n; i++) {
    const family_job *j = &b->jobs[i];
    moejit_load_kernel *row = &r->kernels[j->row];
    row->ms += j->ms;
    if (j->variant) {
      row->variants++;
      row->variant_hits += j->status == MOEJIT_OK && j->hit;
    } else {
      memcpy(row->key, j->key, sizeof row->key);
      family_hit[j->row] = j->hit;
    }
    failed[j->row] |= j->status != MOEJIT_OK;
    if (j->status && !first)
      first = mj_fail(j->status, "moejit_model_load: kernel '%s'%s: %s", j->name,
                      j->variant ? " (a tuned variant)" : "", j->message);
  }
  for (int i = 0; i < r->n_kernels; i++) {
    moejit_load_kernel *row = &r->kernels[i];
    row->cache_hit = family_hit[i] && row->variant_hits == row->variants;
    if (!failed[i]) row->cache_hit ? r->cache_hits++ : r->cache_misses++;
  }
  return first;
}

/* Compiles every requested family, and the GEMMs' tuned variants, at once;
 * the first failure (in layer order) becomes the caller's error. */
static moejit_status compile_families(moejit_model *m, moejit_compiler *compiler, const char *arch,
                                      unsigned families, const mj_tuned_table *table,
                                      const char *no_table) {
  load_batch *b = calloc(1, sizeof *b);
  if (!b) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory");
  b->m = m;
  b->compiler = compiler;
  b->arch = arch;
  plan_jobs(b, families, table, no_table);
  double t0 = mj_now_ms();
  mj_parallel_for(b->n, 0, compile_family, b);
  m->report.compile_ms = mj_now_ms() - t0;
  moejit_status st = fold_jobs(b);
  free(b);
  return st;
}

static void report_start(moejit_load_report *r, const moejit_spec *spec, const char *arch,
                         const char *origin) {
  memset(r, 0, sizeof *r);
  mj_strlcpy(r->model, spec->name, sizeof r->model);
  mj_strlcpy(r->origin, origin ? origin : "spec", sizeof r->origin);
  mj_strlcpy(r->arch, arch, sizeof r->arch);
}

static moejit_status load_into(moejit_model *m, unsigned families, const moejit_load_opts *opts,
                               double t_start) {
  mj_tuned_table table;
  memset(&table, 0, sizeof table);
  int have = 0;
  char no_table[512] = "";
  moejit_status st = MOEJIT_OK;
  if (families & (MJ_OPS_GEMM1 | MJ_OPS_GEMM2))
    st = find_table(m->ctx, opts, &table, &have, no_table, sizeof no_table);
  if (!st)
    st = compile_families(m, moejit_ctx_compiler(m->ctx), mj_ctx_arch(m->ctx), families,
                          have ? &table : NULL, no_table);
  mj_tuned_table_free(&table);
  if (st) return st;
  double t0 = mj_now_ms();
  st = load_functions(m, families);
  m->report.load_ms = mj_now_ms() - t0;
  m->report.total_ms = mj_now_ms() - t_start;
  return st;
}

/* ---- prebuilding a load's kernels without a GPU --------------------------- */

/* Worker: the module of one (spec, family) a load resolves entries in. */
static void prebuild_one(size_t i, void *arg) {
  warm_list *w = arg;
  warm_job *j = &w->jobs[i];
  j->status = build_timed(w->compiler, &j->spec, j->family, w->arch, NULL, &j->hit, &j->ms,
                          j->message, sizeof j->message);
}

/* The modules the load's entry lookups reach beyond the family jobs (the
 * kernel spec a launch plan derives, e.g. the mma.sync decode tile); a
 * row whose extra kernel was compiled now is no longer a cache hit. */
static moejit_status prebuild_plans(moejit_model *m, moejit_compiler *compiler, const char *arch) {
  warm_list w = {.m = m, .arch = arch, .compiler = compiler};
  moejit_status st = warm_list_make(&w, MJ_OPS_LAYER);
  if (!st) mj_parallel_for(w.n, 0, prebuild_one, &w);
  moejit_load_report *r = &m->report;
  for (size_t i = 0; i < w.n && !st; i++) {
    const warm_job *j = &w.jobs[i];
    if (j->status) {
      st = mj_fail(j->status, "moejit_model_prebuild: %s: %s", j->what, j->message);
      break;
    }
    if (j->hit) continue;
    for (int k = 0; k < r->n_kernels; k++) {
      moejit_load_kernel *row = &r->kernels[k];
      if (strcmp(row->kernel, j->family) != 0) continue;
      row->ms += j->ms;
      if (row->cache_hit) row->cache_hit = 0, r->cache_hits--, r->cache_misses++;
    }
  }
  free(w.jobs);
  return st;
}

moejit_status moejit_model_prebuild(moejit_compiler *compiler, const moejit_spec *spec,
                                    const char *arch, const char *device_name,
                                    const moejit_load_opts *opts) {
  const double t_start = mj_now_ms();
  if (!compiler || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_prebuild: %s is NULL",
                   !compiler ? "compiler" : "spec");
  moejit_status st = moejit_spec_validate(spec);
  if (st) return mj_fail_prefix(st, "moejit_model_prebuild");
  if ((st = check_supported(spec))) return st;
  if (opts && (opts->ep.world > 0 || opts->ep.nccl_comm))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_model_prebuild: builds one GPU's layer; an expert-parallel load "
                   "builds each rank's kernels for its own experts; HINT: leave opts.ep zero");
  if (!arch && spec->n_archs > 0) arch = spec->archs[0];
  if (!arch || !mj_arch_parse(arch, NULL))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_model_prebuild: arch '%s' is not an arch like sm_90a; HINT: name the "
                   "arch of the GPU the model will load on (sm_90a for an H100; 'auto' needs "
                   "that GPU)",
                   arch ? arch : "(none)");
  moejit_model *m = calloc(1, sizeof *m);
  if (!m) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_prebuild: out of memory");
  m->spec = *spec;
  m->sm_count = 1;
  report_start(&m->report, spec, arch, "spec");
  mj_tuned_table table;
  memset(&table, 0, sizeof table);
  int have = 0;
  char no_table[512] = "";
  if (device_name && *device_name)
    st = table_named(device_name, opts, "moejit_model_prebuild", &table, &have, no_table,
                     sizeof no_table);
  else
    mj_strlcpy(no_table,
               "no tuned table: no device named (moejit_model_prebuild builds the heuristic "
               "kernels only)",
               sizeof no_table);
  if (!st) st = compile_families(m, compiler, arch, MJ_OPS_LAYER, have ? &table : NULL, no_table);
  mj_tuned_table_free(&table);
  if (!st) {
    double t0 = mj_now_ms();
    st = prebuild_plans(m, compiler, arch);
    m->report.compile_ms += mj_now_ms() - t0;
  }
  m->report.total_ms = mj_now_ms() - t_start;
  if (opts && opts->report) *opts->report = m->report;
  free(m);
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

moejit_status mj_model_load_with(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                 const char *origin, const moejit_load_opts *opts,
                                 moejit_model **out) {
  const double t_start = mj_now_ms();
  if (out) *out = NULL;
  moejit_status st = check_load_args(ctx, spec, out);
  if (st) return st;
  if (opts && (opts->ep.world > 0 || opts->ep.nccl_comm)) {
    if (families != MJ_OPS_LAYER)
      return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                      "moejit_model_load: expert parallelism (opts.ep) needs a "
                                      "whole layer; HINT: load with moejit_model_load_config or "
                                      "moejit_model_load_spec"));
    return mj_ep_model_load(ctx, spec, origin, opts, out);
  }
  mj_device_limits limits;
  if ((st = mj_ctx_limits(ctx, &limits))) return st;

  moejit_model *m = calloc(1, sizeof *m);
  if (!m)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory"));
  m->ctx = ctx;
  m->spec = *spec;
  m->sm_count = limits.sm_count > 0 ? limits.sm_count : 1;
  report_start(&m->report, spec, mj_ctx_arch(ctx), origin);
  st = load_into(m, families, opts, t_start);
  if (opts && opts->report) *opts->report = m->report;
  if (st) {
    free(m);
    return mj_ctx_fail(ctx, st);
  }
  *out = m;
  return MOEJIT_OK;
}

moejit_status mj_model_load_reported(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                     const char *origin, moejit_load_report *report,
                                     moejit_model **out) {
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.report = report;
  return mj_model_load_with(ctx, spec, families, origin, &opts, out);
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
  if (model && model->ep) mj_ep_free(model->ctx, model->ep);
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

unsigned mj_align_count_smem(const moejit_spec *spec) {
  return (unsigned)(spec->align.block_threads / 32) * (unsigned)(spec->experts + 1) *
         (unsigned)sizeof(int32_t);
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
