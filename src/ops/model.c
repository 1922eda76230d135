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
    {MJ_OPS_ROUTE, "route", "moejit_router_logits_warps",
     offsetof(moejit_model, router_logits_warps)},
    {MJ_OPS_ROUTE, "route", "moejit_router_logits_mma", offsetof(moejit_model, router_logits_mma)},
    {MJ_OPS_ROUTE, "route", "moejit_router_logits_mma_wide",
     offsetof(moejit_model, router_logits_mma_wide)},
    {MJ_OPS_ROUTE, "route", "moejit_router_logits_sum", offsetof(moejit_model, router_logits_sum)},
    {MJ_OPS_ALIGN, "align", "moejit_align_count", offsetof(moejit_model, align_count)},
    {MJ_OPS_ALIGN, "align", "moejit_align_scan", offsetof(moejit_model, align_scan)},
    {MJ_OPS_ALIGN, "align", "moejit_align_scatter", offsetof(moejit_model, align_scatter)},
    {MJ_OPS_ALIGN, "align", "moejit_align_count_scan", offsetof(moejit_model, align_count_scan)},
    {MJ_OPS_ALIGN, "align", "moejit_align_scan_scatter",
     offsetof(moejit_model, align_scan_scatter)},
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
  const moejit_spec *spec;  /* &m->spec, or a GEMM module's (load_plan) */
  const mj_entry_set *only; /* the entries its module holds (NULL: all) */
  int row;                  /* the report row it counts into */
  int variant;              /* 0: the spec's own kernel; 1: a tuned tile's; 2: one a
                               launch plan derives (e.g. the mma.sync decode tile),
                               counted in the row's time and hit only */
  moejit_status status;
  char message[1024];
  char key[33];
  int hit;
  double ms;
} family_job;

/* The GEMM modules of a load: per (family, kernel spec), the entries the
 * load resolves in it. Built with only those entries (MJ_ENTRY_SUBSET) the
 * modules are smaller and compile faster; $MOEJIT_MODULE_SUBSETS=0 builds
 * every entry of the template instead. At most the spec's own kernel, its
 * decode tile, one per tuned variant and the GEMV and _wide64 parts of one
 * of them (module_part), for each GEMM. */
#define MJ_LOAD_MAX_GROUPS (2 * (4 + MJ_GEMM_MAX_VARIANTS))

typedef struct group_list {
  mj_gemm_module g[MJ_LOAD_MAX_GROUPS];
  size_t n;
  int subsets; /* 0: $MOEJIT_MODULE_SUBSETS=0, every group's module holds all entries */
} group_list;

#define MJ_LOAD_MAX_JOBS (MOEJIT_LOAD_MAX_KERNELS + MJ_LOAD_MAX_GROUPS)

typedef struct load_batch {
  moejit_model *m;
  moejit_compiler *compiler; /* the ctx's, or moejit_model_prebuild's */
  const char *arch;          /* the ctx's, or the prebuild's target */
  family_job jobs[MJ_LOAD_MAX_JOBS];
  size_t n;
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
                                 const char *arch, const mj_entry_set *only, char key[33], int *hit,
                                 double *ms, char *message, size_t cap) {
  const void *cubin = NULL;
  size_t len = 0;
  double t0 = mj_now_ms();
  moejit_status st =
      mj_compiler_get_cubin_entries(c, spec, family, arch, only, &cubin, &len, key, hit);
  *ms = mj_now_ms() - t0;
  if (st) snprintf(message, cap, "%s", moejit_last_error());
  return st;
}

/* Worker: one family job. Module loads happen afterwards on the caller's
 * thread (they serialize on the ctx). */
static void compile_family(size_t i, void *arg) {
  load_batch *b = arg;
  family_job *j = &b->jobs[i];
  j->status = build_timed(b->compiler, j->spec, j->name, b->arch, j->only, j->key, &j->hit, &j->ms,
                          j->message, sizeof j->message);
}

/* One kernel the load makes sure of: its (spec, family, entry) enters the
 * ctx's memo, so a forward never generates code or loads a module. */
typedef struct warm_job {
  moejit_spec spec;
  const char *family, *entry;
  char what[96]; /* for the error: "kernel 'x'" or "tuned T=n" */
  moejit_status status;
  char message[1024];
} warm_job;

typedef struct warm_list {
  moejit_model *m;
  const char *arch;         /* the arch the GEMM plans are made for */
  const group_list *groups; /* the GEMM modules' entry sets, or NULL */
  warm_job *jobs;
  size_t n, cap;
  int fitted[2];              /* GEMM which's heuristic tile was fitted (mj_gemm_plan.fitted) */
  moejit_gemm_cfg fit_cfg[2]; /* ... to this tile (the first T that fitted it) */
} warm_list;

static moejit_status warm_add(warm_list *w, const moejit_spec *spec, const char *family,
                              const char *entry, const char *what) {
  moejit_spec canon;
  mj_spec_canonical(spec, &canon);
  for (size_t i = 0; i < w->n; i++) /* once each */
    if (!strcmp(w->jobs[i].entry, entry) && !strcmp(w->jobs[i].family, family) &&
        !memcmp(&w->jobs[i].spec, &canon, sizeof canon))
      return MOEJIT_OK;
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 32;
    warm_job *j = realloc(w->jobs, cap * sizeof *j);
    if (!j) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory");
    w->jobs = j, w->cap = cap;
  }
  warm_job *j = &w->jobs[w->n++];
  memset(j, 0, sizeof *j);
  j->spec = canon;
  j->family = family, j->entry = entry;
  mj_strlcpy(j->what, what, sizeof j->what);
  return MOEJIT_OK;
}

/* The exact (spec, family, entry) the launcher looks up for `plan`, and the
 * layer's other entries of that module: with a GEMV plan the decode
 * layer's, with GEMM 1's wgmma plan its gathering twin. */
static moejit_status warm_plan(warm_list *w, const moejit_spec *spec, int which,
                               const mj_gemm_plan *plan, const char *what) {
  moejit_spec scratch;
  const moejit_spec *kspec = mj_gemm_kernel_spec(spec, which, plan, &scratch);
  moejit_status st = warm_add(w, kspec, plan->family, plan->entry, what);
  /* each pair some T within the decode layer's reach takes: the first, the
   * wide past its entries, the _wide64 past the wide's */
  const int pairs = plan->use_gemv ? mj_decode_pair(spec, mj_decode_max_tokens(spec)) : -1;
  for (int pair = 0; !st && pair <= pairs; pair++)
    st = warm_add(w, kspec, plan->family, mj_decode_entry(which, pair), what);
  const char *gather = which == 1 ? mj_gemm1_gather_entry(plan) : NULL;
  if (!st && gather) st = warm_add(w, kspec, plan->family, gather, what);
  return st;
}

/* Every entry the GEMM launchers may pick: what mj_gemm_choose gives the
 * forward (the heuristic's spec + AUTO, or a tuned variant's spec + path)
 * at each T of a sweep, added once per change of
 * outcome, for T = 1 .. 512, then around each power of two up to the
 * largest T and around each tuned bucket: the kernels the plans derive at
 * some T only (the mma.sync decode tile, the narrow wgmma tile) are built
 * with the others, not at the first forward that needs them, and a module
 * no T reaches (the heuristic tile where tuned buckets cover every T) is
 * not built. Ts whose plan fails (a grid too large) are skipped: the
 * forward refuses them; a failure at T = 1 fails the load. */
static moejit_status list_gemm(warm_list *w, int which) {
  const moejit_model *m = w->m;
  const mj_gemm_variants *vs = &m->gemm_variants[which - 1];
  const int64_t t_max = INT32_MAX / m->spec.top_k;
  int64_t ts[512 + 4 * 31 + 3 * MJ_GEMM_MAX_VARIANTS];
  size_t n = 0;
  for (int64_t t = 1; t <= 512 && t <= t_max; t++) ts[n++] = t;
  for (int k = 9; k < 31; k++) {
    const int64_t p = (int64_t)1 << k, near[] = {p - 1, p, p + 1, p + p / 2};
    for (int i = 0; i < 4; i++)
      if (near[i] > 512 && near[i] <= t_max) ts[n++] = near[i];
  }
  if (t_max > 512) ts[n++] = t_max;
  for (int i = 0; i < vs->n; i++)
    for (int64_t d = -1; d <= 1; d++)
      if (vs->v[i].tokens + d >= 1 && vs->v[i].tokens + d <= t_max) ts[n++] = vs->v[i].tokens + d;
  const char *last_entry = NULL;
  int last_variant = -2, last_decode = -1;
  const int smem_optin = mj_ctx_smem_optin(m->ctx); /* 0 in a prebuild: no GPU to ask */
  for (size_t i = 0; i < n; i++) {
    mj_gemm_choice c;
    moejit_status st = mj_gemm_choose(&m->spec, vs, which, ts[i], w->arch, &c);
    if (st && ts[i] == 1) return mj_fail_prefix(st, "moejit_model_load: GEMM %d at T = 1", which);
    if (st) continue;
    if ((st = mj_gemm_choice_fits(&c, which, ts[i], smem_optin, "moejit_model_load"))) return st;
    size_t split = 0, zero;
    if (which == 2) mj_gemm2_split_layout(&c.plan, mj_ctx_sm_count(m->ctx), &split, &zero);
    if (split) { /* the layer's workspace holds GEMM 2's K-split scratch from here on */
      moejit_model *mm = w->m;
      if (!mm->gemm2_split_bytes || ts[i] < mm->gemm2_split_from) mm->gemm2_split_from = ts[i];
      if (split > mm->gemm2_split_bytes) mm->gemm2_split_bytes = split;
    }
    if (c.plan.fitted && !c.plan.decode && c.variant < 0 && !w->fitted[which - 1])
      w->fitted[which - 1] = 1, w->fit_cfg[which - 1] = c.plan.cfg;
    if (c.plan.entry == last_entry && c.variant == last_variant && c.plan.decode == last_decode)
      continue; /* the same kernel as the T before */
    last_entry = c.plan.entry, last_variant = c.variant, last_decode = c.plan.decode;
    char what[96];
    snprintf(what, sizeof what, "kernel '%s' at T=%lld", c.plan.entry, (long long)ts[i]);
    if ((st = warm_plan(w, c.spec, which, &c.plan, what))) return st;
  }
  return MOEJIT_OK;
}

/* The part of its kernel spec's modules an entry is built in
 * (mj_gemm_module.part): 2 the decode layer's _wide64 entry, 1 the GEMV
 * path's entry and the decode layer's first two pairs, 0 the others (the
 * tile kernels). A GEMV plan names a tile only for its module, and the
 * tuned tables give it a tile other T run (e.g. the H100 table's
 * 128x256x64), so without parts one module held the GEMV, decode, wgmma
 * and gathering entries: the longest compile of a load, and NVRTC builds a
 * module on one thread. In three parts NVRTC builds them side by side,
 * which shortens a cold load; each part is one more module to load warm.
 * Where modules hold every entry ($MOEJIT_MODULE_SUBSETS=0) there are no
 * parts. */
static int module_part(const group_list *gl, const char *entry) {
  if (!gl->subsets) return 0;
  for (int which = 1; which <= 2; which++) {
    if (!strcmp(entry, mj_decode_entry(which, 2))) return 2;
    if (!strcmp(entry, mj_decode_entry(which, 0)) || !strcmp(entry, mj_decode_entry(which, 1)) ||
        !strcmp(entry, which == 1 ? MJ_ENTRY_GEMV1 : MJ_ENTRY_GEMV2))
      return 1;
  }
  return 0;
}

/* The index of the module of (family, spec, part) in gl, or -1. spec is
 * canonical, as warm_add stores every warm_job's. */
static long group_index(const group_list *gl, const char *family, const moejit_spec *spec,
                        int part) {
  for (size_t i = 0; i < gl->n; i++)
    if (gl->g[i].part == part && strcmp(gl->g[i].family, family) == 0 &&
        memcmp(&gl->g[i].spec, spec, sizeof *spec) == 0)
      return (long)i;
  return -1;
}

/* The entries the module holding (family, canonical spec, entry) is built
 * with; NULL: all. */
static const mj_entry_set *group_set(const group_list *gl, const char *family,
                                     const moejit_spec *spec, const char *entry) {
  if (!gl || !gl->subsets) return NULL;
  const long i = group_index(gl, family, spec, module_part(gl, entry));
  return i < 0 ? NULL : &gl->g[i].set;
}

/* One lookup of the plan (warm_all). */
static void warm_one(size_t i, void *arg) {
  warm_list *w = arg;
  warm_job *j = &w->jobs[i];
  CUfunction fn;
  const mj_entry_set *only = group_set(w->groups, j->family, &j->spec, j->entry);
  j->status = mj_ctx_get_function_from(w->m->ctx, &j->spec, j->family, only, j->entry, &fn);
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

/* What a load builds and resolves, made once per load when the tuned
 * variants are known: every (spec, family, entry) a forward looks up, and
 * the GEMM ones grouped by module for the compile step. */
typedef struct load_plan {
  warm_list w;
  group_list gl;
} load_plan;

static void load_plan_free(load_plan *p) {
  if (p) free(p->w.jobs);
  free(p);
}

static moejit_status load_plan_make(moejit_model *m, const char *arch, unsigned families,
                                    load_plan **out) {
  load_plan *p = *out = calloc(1, sizeof *p);
  if (!p) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory");
  p->w = (warm_list){.m = m, .arch = arch, .groups = &p->gl};
  p->gl.subsets = mj_env_switch("MOEJIT_MODULE_SUBSETS", 1);
  moejit_status st = warm_list_make(&p->w, families);
  for (size_t i = 0; i < p->w.n && !st; i++) {
    const warm_job *j = &p->w.jobs[i];
    if (strcmp(j->family, "gemm1") != 0 && strcmp(j->family, "gemm2") != 0) continue;
    group_list *gl = &p->gl;
    const int part = module_part(gl, j->entry);
    const long at = group_index(gl, j->family, &j->spec, part);
    mj_gemm_module *g = at < 0 ? NULL : &gl->g[at];
    if (!g && gl->n < MJ_LOAD_MAX_GROUPS) {
      g = &gl->g[gl->n++];
      g->family = j->family;
      g->spec = j->spec; /* canonical (warm_add) */
      g->set.n = 0;
      g->part = part;
    }
    if (!g || !mj_entry_set_add(&g->set, j->entry))
      st = mj_fail(MOEJIT_ERR_INTERNAL,
                   "moejit_model_load: more GEMM modules or entries than planned for (%zu); "
                   "HINT: please report this bug",
                   gl->n);
  }
  return st;
}

/* Every lookup of the plan, after the compile step built each module: with
 * the compiler's memo a lookup is a module load (which serializes on the
 * ctx) or less, so one thread does them all; without it (a template
 * directory) each regenerates its module's source, in parallel. */
static moejit_status warm_all(load_plan *p) {
  warm_list *w = &p->w;
  mj_parallel_for(w->n, mj_compiler_memoizes(moejit_ctx_compiler(w->m->ctx)) ? 1 : 0, warm_one, w);
  for (size_t i = 0; i < w->n; i++)
    if (w->jobs[i].status)
      return mj_fail(w->jobs[i].status, "moejit_model_load: %s: %s", w->jobs[i].what,
                     w->jobs[i].message);
  return MOEJIT_OK;
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

static moejit_status load_functions(moejit_model *m, unsigned families, load_plan *p) {
  moejit_status st = warm_all(p);
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
static moejit_status table_named(const char *device_name, const moejit_spec *spec,
                                 const moejit_load_opts *opts, const char *who, mj_tuned_table *t,
                                 int *have, char *why, size_t cap) {
  *have = 0;
  if (opts && opts->tuned_disable) {
    mj_strlcpy(why, "tuned tables are disabled (moejit_load_opts.tuned_disable)", cap);
    return MOEJIT_OK;
  }
  if (opts && opts->tuned_table && mj_tuned_disabled()) {
    mj_strlcpy(why, "tuned tables are disabled ($MOEJIT_TUNED_DISABLE)", cap);
    return MOEJIT_OK;
  }
  mj_tuned_shape shape; /* the load reads this shape's entries only */
  mj_tuned_shape_of(spec, &shape);
  moejit_status st = opts && opts->tuned_table ? mj_tuned_table_load_file(opts->tuned_table, t)
                                               : mj_tuned_table_for_shape(device_name, &shape, t);
  if (st == MOEJIT_OK) return *have = 1, MOEJIT_OK;
  if (opts && opts->tuned_table) return mj_fail_prefix(st, "%s: moejit_load_opts.tuned_table", who);
  if (st == MOEJIT_ERR_NOT_FOUND) return mj_strlcpy(why, moejit_last_error(), cap), MOEJIT_OK;
  char msg[1024];
  mj_strlcpy(msg, moejit_last_error(), sizeof msg);
  return mj_fail(st,
                 "%s: %s; HINT: fix or remove the tuned table, or load without it "
                 "(moejit_load_opts.tuned_disable, $MOEJIT_TUNED_DISABLE=1)",
                 who, msg);
}

static moejit_status find_table(moejit_ctx *ctx, const moejit_spec *spec,
                                const moejit_load_opts *opts, mj_tuned_table *t, int *have,
                                char *why, size_t cap) {
  *have = 0;
  if (opts && (opts->tuned_disable || opts->tuned_table))
    return table_named(NULL, spec, opts, "moejit_model_load", t, have, why, cap);
  moejit_device_info info;
  if (moejit_ctx_device_info(ctx, &info) != MOEJIT_OK) {
    snprintf(why, cap, "no tuned table: the device's name is unknown (%s)", moejit_last_error());
    return MOEJIT_OK;
  }
  return table_named(info.name, spec, opts, "moejit_model_load", t, have, why, cap);
}

static family_job *add_job(load_batch *b, const char *name, const moejit_spec *spec, int row,
                           int variant) {
  family_job *j = &b->jobs[b->n++];
  j->name = name, j->spec = spec, j->row = row, j->variant = variant;
  return j;
}

/* Report rows (one per family, tuned tables consulted for the GEMMs) and
 * the jobs of the families other than the GEMMs (add_gemm_jobs adds
 * theirs); gemm_row[which - 1] is GEMM which's row, or -1. */
static void plan_jobs(load_batch *b, unsigned families, const mj_tuned_table *table,
                      const char *no_table, int gemm_row[2]) {
  moejit_model *m = b->m;
  moejit_load_report *r = &m->report;
  for (size_t i = 0; i < MJ_ARRAY_LEN(load_families); i++) {
    const unsigned bit = load_families[i].bit;
    if (!(families & bit)) continue;
    const int row_i = r->n_kernels++, which = bit == MJ_OPS_GEMM1 ? 1 : bit == MJ_OPS_GEMM2 ? 2 : 0;
    moejit_load_kernel *row = &r->kernels[row_i];
    mj_strlcpy(row->kernel, load_families[i].name, sizeof row->kernel);
    mj_strlcpy(row->arch, b->arch, sizeof row->arch);
    if (which) {
      mj_gemm_variants_collect(table, no_table, &m->spec, which, b->arch,
                               &m->gemm_variants[which - 1], row);
      gemm_row[which - 1] = row_i;
    } else {
      describe_config(&m->spec, bit, row);
      add_job(b, load_families[i].name, &m->spec, row_i, 0);
    }
  }
}

/* What a GEMM module of the plan is to the report: the spec's own kernel
 * (0), a tuned tile (1) or one a launch plan derives (2). Module specs
 * differ from the model's in that GEMM's tile only. */
static int module_kind(const moejit_model *m, const mj_gemm_module *g) {
  const int which = strcmp(g->family, "gemm1") == 0 ? 1 : 2;
  const moejit_gemm_cfg *cfg = which == 1 ? &g->spec.gemm1 : &g->spec.gemm2;
  if (mj_gemm_cfg_equal(cfg, which == 1 ? &m->spec.gemm1 : &m->spec.gemm2)) return 0;
  const mj_gemm_variants *vs = &m->gemm_variants[which - 1];
  for (int i = 0; i < vs->n; i++)
    if (mj_gemm_cfg_equal(cfg, &vs->v[i].cfg)) return 1;
  return 2;
}

/* One job per GEMM module the plan names (a kernel no T reaches, such as
 * the spec's own tile where tuned buckets cover every T, is not built). */
static void add_gemm_jobs(load_batch *b, const group_list *gl, const int gemm_row[2]) {
  for (size_t k = 0; k < gl->n; k++) {
    const mj_gemm_module *g = &gl->g[k];
    const int row = gemm_row[strcmp(g->family, "gemm1") == 0 ? 0 : 1];
    if (row < 0 || b->n == MJ_LOAD_MAX_JOBS) continue;
    /* the tile kernels' module (part 0) is the one the report names; the
     * other parts count in its row's time and hit, as a derived tile does */
    family_job *j = add_job(b, g->family, &g->spec, row, g->part ? 2 : module_kind(b->m, g));
    j->only = gl->subsets ? &g->set : NULL;
  }
}

/* Folds the jobs into their rows: a row is a cache hit when none of its
 * kernels was compiled; its ms adds up its kernels' times; its key is its
 * own kernel's, else its first tuned one's, else its first. The first
 * failure in layer (row) order becomes the caller's error. */
static moejit_status fold_jobs(load_batch *b) {
  moejit_load_report *r = &b->m->report;
  int miss[MOEJIT_LOAD_MAX_KERNELS] = {0}, failed[MOEJIT_LOAD_MAX_KERNELS] = {0};
  int key_kind[MOEJIT_LOAD_MAX_KERNELS];
  const family_job *first = NULL;
  for (int i = 0; i < MOEJIT_LOAD_MAX_KERNELS; i++) key_kind[i] = 3;
  for (size_t i = 0; i < b->n; i++) {
    const family_job *j = &b->jobs[i];
    moejit_load_kernel *row = &r->kernels[j->row];
    if (j->variant < key_kind[j->row]) {
      memcpy(row->key, j->key, sizeof row->key);
      key_kind[j->row] = j->variant;
    }
    row->ms += j->ms;
    if (j->variant == 1) {
      row->variants++;
      row->variant_hits += j->status == MOEJIT_OK && j->hit;
    }
    miss[j->row] |= !j->hit;
    failed[j->row] |= j->status != MOEJIT_OK;
    if (j->status && (!first || j->row < first->row)) first = j;
  }
  for (int i = 0; i < r->n_kernels; i++) {
    moejit_load_kernel *row = &r->kernels[i];
    row->cache_hit = !miss[i];
    if (!failed[i]) row->cache_hit ? r->cache_hits++ : r->cache_misses++;
  }
  if (!first) return MOEJIT_OK;
  return mj_fail(first->status, "moejit_model_load: kernel '%s'%s: %s", first->name,
                 first->variant ? " (a tuned variant)" : "", first->message);
}

/* Says in GEMM which's report row that its tile runs fitted to the arch's
 * shared memory (mj_gemm_plan_make_for): the config's tile would not fit. */
static void note_fitted(const moejit_model *m, moejit_load_kernel *row, int which, const char *arch,
                        const moejit_gemm_cfg *fit) {
  char asked[64], runs[64], detail[sizeof row->config_detail + 256];
  moejit_gemm_cfg_text(which == 1 ? &m->spec.gemm1 : &m->spec.gemm2, asked, sizeof asked);
  moejit_gemm_cfg_text(fit, runs, sizeof runs);
  snprintf(detail, sizeof detail,
           "the %s tile runs as %s, fitted to %s's %d KiB of shared memory a block; %s", asked,
           runs, arch, mj_arch_smem_optin(arch) / 1024, row->config_detail);
  mj_strlcpy(row->config_detail, detail, sizeof row->config_detail);
}

/* Compiles every requested family and GEMM module (tuned tiles included)
 * at once; the first failure (in layer order) becomes the caller's error.
 * *plan (load_plan_free) is what the load then resolves. */
static moejit_status compile_families(moejit_model *m, moejit_compiler *compiler, const char *arch,
                                      unsigned families, const mj_tuned_table *table,
                                      const char *no_table, load_plan **plan) {
  *plan = NULL;
  load_batch *b = calloc(1, sizeof *b);
  if (!b) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_load: out of memory");
  b->m = m;
  b->compiler = compiler;
  b->arch = arch;
  int gemm_row[2] = {-1, -1};
  plan_jobs(b, families, table, no_table, gemm_row);
  moejit_status st = load_plan_make(m, arch, families, plan);
  if (st) {
    free(b);
    return st;
  }
  add_gemm_jobs(b, &(*plan)->gl, gemm_row);
  for (int which = 1; which <= 2; which++)
    if ((*plan)->w.fitted[which - 1] && gemm_row[which - 1] >= 0)
      note_fitted(m, &m->report.kernels[gemm_row[which - 1]], which, arch,
                  &(*plan)->w.fit_cfg[which - 1]);
  double t0 = mj_now_ms();
  mj_parallel_for(b->n, 0, compile_family, b);
  m->report.compile_ms = mj_now_ms() - t0;
  st = fold_jobs(b);
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
    st = find_table(m->ctx, &m->spec, opts, &table, &have, no_table, sizeof no_table);
  load_plan *plan = NULL;
  if (!st)
    st = compile_families(m, moejit_ctx_compiler(m->ctx), mj_ctx_arch(m->ctx), families,
                          have ? &table : NULL, no_table, &plan);
  mj_tuned_table_free(&table);
  if (st) {
    load_plan_free(plan);
    return st;
  }
  double t0 = mj_now_ms();
  st = load_functions(m, families, plan);
  load_plan_free(plan);
  m->report.load_ms = mj_now_ms() - t0;
  m->report.total_ms = mj_now_ms() - t_start;
  return st;
}

moejit_status mj_layer_gemm_modules(const moejit_spec *spec, const char *arch,
                                    const mj_gemm_variants variants[2], mj_gemm_module **out,
                                    size_t *n) {
  *out = NULL, *n = 0;
  moejit_model *m = calloc(1, sizeof *m);
  load_plan *p = NULL;
  moejit_status st = MOEJIT_OK;
  if (!m) st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "mj_layer_gemm_modules: out of memory");
  if (!st) {
    m->spec = *spec;
    m->gemm_variants[0] = variants[0], m->gemm_variants[1] = variants[1];
    st = load_plan_make(m, arch, MJ_OPS_GEMM1 | MJ_OPS_GEMM2, &p);
  }
  const size_t count = st ? 0 : p->gl.n;
  if (!st && count && !(*out = malloc(count * sizeof **out)))
    st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "mj_layer_gemm_modules: out of memory");
  if (!st) {
    if (count) memcpy(*out, p->gl.g, count * sizeof **out);
    *n = count;
  }
  load_plan_free(p);
  free(m);
  return st;
}

/* Any ep field set asks for expert parallelism; a world out of range is
 * then refused by its check, not taken for one GPU. */
static int ep_requested(const moejit_load_opts *opts) {
  return opts && (opts->ep.world != 0 || opts->ep.nccl_comm || opts->ep.nccl_id);
}

/* ---- prebuilding a load's kernels without a GPU --------------------------- */

moejit_status moejit_model_prebuild(moejit_compiler *compiler, const moejit_spec *spec,
                                    const char *arch, const char *device_name,
                                    const moejit_load_opts *opts) {
  const double t_start = mj_now_ms();
  if (opts && opts->report) memset(opts->report, 0, sizeof *opts->report); /* as far as it gets */
  if (!compiler || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_prebuild: %s is NULL",
                   !compiler ? "compiler" : "spec");
  moejit_status st = moejit_spec_validate(spec);
  if (st) return mj_fail_prefix(st, "moejit_model_prebuild");
  if ((st = check_supported(spec))) return st;
  if (ep_requested(opts))
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
  if (moejit_spec_validate_arch(spec, arch) != MOEJIT_OK) /* sm_75, sm_80a, clusters below sm_90 */
    return mj_fail_prefix(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_prebuild: arch '%s'", arch);
  moejit_model *m = calloc(1, sizeof *m);
  if (!m) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_model_prebuild: out of memory");
  m->spec = *spec;
  m->sm_count = 1;
  report_start(&m->report, spec, arch, "spec");
  mj_tuned_table table;
  memset(&table, 0, sizeof table);
  int have = 0;
  char no_table[512] = "";
  if ((device_name && *device_name) || (opts && opts->tuned_table))
    st = table_named(device_name, spec, opts, "moejit_model_prebuild", &table, &have, no_table,
                     sizeof no_table);
  else
    mj_strlcpy(no_table,
               "no tuned table: no device named (moejit_model_prebuild builds the heuristic "
               "kernels only)",
               sizeof no_table);
  load_plan *plan = NULL;
  if (!st)
    st = compile_families(m, compiler, arch, MJ_OPS_LAYER, have ? &table : NULL, no_table, &plan);
  load_plan_free(plan);
  mj_tuned_table_free(&table);
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
  if (opts && opts->report) memset(opts->report, 0, sizeof *opts->report); /* as far as it gets */
  moejit_status st = check_load_args(ctx, spec, out);
  if (st) return st;
  if (ep_requested(opts)) {
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
