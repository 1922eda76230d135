/* The ctx's module cache: cache key -> CUmodule (loaded once), entry ->
 * CUfunction, and the kernel memo (spec, family, entry) -> handle that lets
 * repeated lookups skip code generation. */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "config/config.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

/* Grows an array of pointers by one slot; 0 on allocation failure. */
static int grow(void ***items, size_t n, size_t *cap) {
  if (n < *cap) return 1;
  size_t next = *cap ? *cap * 2 : 8;
  void **p = realloc(*items, next * sizeof *p);
  if (!p) return 0;
  *items = p;
  *cap = next;
  return 1;
}

static moejit_kernel *kernel_memo_find(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                       const char *entry) {
  for (size_t i = 0; i < ctx->n_kernels; i++) {
    moejit_kernel *k = ctx->kernels[i];
    if (strcmp(k->family, family) == 0 && strcmp(k->requested_entry, entry) == 0 &&
        memcmp(&k->spec, spec, sizeof *spec) == 0)
      return k;
  }
  return NULL;
}

static mj_module *module_find(moejit_ctx *ctx, const char *key) {
  for (size_t i = 0; i < ctx->n_modules; i++)
    if (strcmp(ctx->modules[i]->key, key) == 0) return ctx->modules[i];
  return NULL;
}

/* cuModuleLoadData once per key; caller holds ctx->lock. */
static moejit_status module_load(moejit_ctx *ctx, const char *key, const char *family,
                                 const void *cubin, mj_module **out) {
  if ((*out = module_find(ctx, key))) return MOEJIT_OK;
  if (!grow((void ***)&ctx->modules, ctx->n_modules, &ctx->cap_modules))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "module cache: out of host memory");
  mj_module *m = calloc(1, sizeof *m);
  if (!m) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "module cache: out of host memory");
  mj_strlcpy(m->key, key, sizeof m->key);
  mj_strlcpy(m->family, family, sizeof m->family);
  moejit_status st = mj_ctx_enter(ctx);
  if (st == MOEJIT_OK) {
    st = mj_cu_check(ctx->d->ModuleLoadData(&m->module, cubin), "cuModuleLoadData");
    mj_ctx_leave(ctx);
  }
  if (st != MOEJIT_OK) {
    free(m);
    return mj_fail_prefix(st, "loading kernel '%s' (cache key %s, %s)", family, key,
                          ctx->info.arch);
  }
  atomic_fetch_add(&ctx->module_loads, 1);
  ctx->modules[ctx->n_modules++] = m;
  *out = m;
  return MOEJIT_OK;
}

static int func_attr(moejit_ctx *ctx, CUfunction fn, CUfunction_attribute attr) {
  int v = 0;
  if (ctx->d->FuncGetAttribute(&v, attr, fn) != CUDA_SUCCESS) v = 0;
  return v;
}

/* Counts parameters where the driver can tell (cuFuncGetParamInfo, 12.4+):
 * it fails with CUDA_ERROR_INVALID_VALUE one past the last. */
static int func_param_count(moejit_ctx *ctx, CUfunction fn) {
  if (!ctx->d->FuncGetParamInfo) return -1;
  size_t offset, size;
  for (int i = 0; i < 4096; i++)
    if (ctx->d->FuncGetParamInfo(fn, (size_t)i, &offset, &size) != CUDA_SUCCESS) return i;
  return -1;
}

/* The function `entry` of module m, resolved once; caller holds ctx->lock
 * and has the ctx pushed. */
static moejit_status function_find(moejit_ctx *ctx, mj_module *m, const char *entry,
                                   mj_function **out) {
  for (size_t i = 0; i < m->n_functions; i++)
    if (strcmp(m->functions[i]->entry, entry) == 0) return (*out = m->functions[i]), MOEJIT_OK;
  CUfunction fn;
  CUresult r = ctx->d->ModuleGetFunction(&fn, m->module, entry);
  if (r == CUDA_ERROR_NOT_FOUND)
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "kernel '%s' has no entry '%s' (cache key %s); HINT: entries are the "
                   "extern \"C\" __global__ functions of templates/%s.cu",
                   m->family, entry, m->key, m->family);
  moejit_status st = mj_cu_check(r, "cuModuleGetFunction");
  if (st != MOEJIT_OK) return st;
  if (!grow((void ***)&m->functions, m->n_functions, &m->cap_functions))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "module cache: out of host memory");
  mj_function *f = calloc(1, sizeof *f);
  if (!f) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "module cache: out of host memory");
  mj_strlcpy(f->entry, entry, sizeof f->entry);
  f->fn = fn;
  f->max_threads_per_block = func_attr(ctx, fn, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  f->static_smem = func_attr(ctx, fn, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
  f->num_regs = func_attr(ctx, fn, CU_FUNC_ATTRIBUTE_NUM_REGS);
  f->num_params = func_param_count(ctx, fn);
  atomic_init(&f->dynamic_smem_limit,
              func_attr(ctx, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
  atomic_init(&f->active_clusters, 0);
  m->functions[m->n_functions++] = f;
  *out = f;
  return MOEJIT_OK;
}

static moejit_status function_find_pushed(moejit_ctx *ctx, mj_module *m, const char *entry,
                                          mj_function **out) {
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = function_find(ctx, m, entry, out);
  mj_ctx_leave(ctx);
  return st;
}

/* NULL entry: the first extern "C" __global__ of the generated source. */
static moejit_status first_entry(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                 char out[MJ_ENTRY_MAX]) {
  mj_kernel_source ks;
  moejit_status st = mj_compiler_generate(ctx->compiler, spec, family, ctx->info.arch, &ks);
  if (st != MOEJIT_OK) return st;
  mj_strlcpy(out, ks.entries[0], MJ_ENTRY_MAX);
  mj_kernel_source_free(&ks);
  return MOEJIT_OK;
}

/* Under ctx->lock: module, function and memo entry for a cubin in hand. */
static moejit_status kernel_add_locked(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                       const char *requested, const char *entry, const char *key,
                                       const void *cubin, moejit_kernel **out) {
  if ((*out = kernel_memo_find(ctx, spec, family, requested))) return MOEJIT_OK; /* a race won */
  mj_module *m;
  mj_function *f = NULL;
  moejit_status st = module_load(ctx, key, family, cubin, &m);
  if (st == MOEJIT_OK) st = function_find_pushed(ctx, m, entry, &f);
  if (st != MOEJIT_OK) return st;
  if (!grow((void ***)&ctx->kernels, ctx->n_kernels, &ctx->cap_kernels))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "kernel memo: out of host memory");
  moejit_kernel *k = calloc(1, sizeof *k);
  if (!k) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "kernel memo: out of host memory");
  k->spec = *spec;
  mj_strlcpy(k->family, family, sizeof k->family);
  mj_strlcpy(k->requested_entry, requested, sizeof k->requested_entry);
  k->module = m;
  k->function = f;
  k->ctx = ctx;
  ctx->kernels[ctx->n_kernels++] = k;
  *out = k;
  return MOEJIT_OK;
}

/* The slow path: generate + compile (or cache hit) outside the lock, so
 * one thread's NVRTC run does not stall another's lookups. */
static moejit_status kernel_build(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                  const mj_entry_set *only, const char *requested,
                                  moejit_kernel **out) {
  char entry[MJ_ENTRY_MAX];
  moejit_status st = MOEJIT_OK;
  if (*requested)
    mj_strlcpy(entry, requested, sizeof entry);
  else
    st = first_entry(ctx, spec, family, entry);
  const void *cubin = NULL;
  size_t len = 0;
  char key[33] = "";
  if (st == MOEJIT_OK)
    st = mj_compiler_get_cubin_entries(ctx->compiler, spec, family, ctx->info.arch, only, &cubin,
                                       &len, key, NULL);
  if (st != MOEJIT_OK) return st;
  if (strlen(key) != 32 || !cubin || len == 0) /* the module cache relies on the key */
    return mj_fail(MOEJIT_ERR_INTERNAL,
                   "kernel '%s': the compiler returned no cache key or an empty cubin; HINT: "
                   "please report this bug",
                   family);
  pthread_mutex_lock(&ctx->lock);
  st = kernel_add_locked(ctx, spec, family, requested, entry, key, cubin, out);
  pthread_mutex_unlock(&ctx->lock);
  return st;
}

/* The memo first (a repeated lookup skips code generation); a miss builds
 * the module: every entry, or with a non-empty `only` just those (then the
 * entry must be named). */
static moejit_status get_kernel(moejit_ctx *ctx, const char *fn, const moejit_spec *spec,
                                const char *family, const mj_entry_set *only, const char *entry,
                                moejit_kernel **out) {
  MJ_CHECK_CTX(ctx, fn);
  if (out) *out = NULL;
  if (!spec || !family || !out)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: spec, family and out are required", fn));
  if (only && only->n == 0) only = NULL;
  const char *requested = entry ? entry : "";
  if (only && !*requested)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: an entry (of the set) is required", fn));
  if (strlen(requested) >= MJ_ENTRY_MAX || strlen(family) >= MOEJIT_NAME_MAX)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: family or entry name too long", fn));
  moejit_spec canonical;
  mj_spec_canonical(spec, &canonical);
  pthread_mutex_lock(&ctx->lock);
  *out = kernel_memo_find(ctx, &canonical, family, requested);
  pthread_mutex_unlock(&ctx->lock);
  if (*out) return MOEJIT_OK;
  return mj_ctx_fail(ctx, kernel_build(ctx, &canonical, family, only, requested, out));
}

moejit_status moejit_ctx_get_kernel(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                    const char *entry, moejit_kernel **out) {
  return get_kernel(ctx, "moejit_ctx_get_kernel", spec, family, NULL, entry, out);
}

moejit_status mj_ctx_get_function(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                  const char *entry, CUfunction *out) {
  return mj_ctx_get_function_from(ctx, spec, family, NULL, entry, out);
}

moejit_status mj_ctx_get_function_from(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                       const mj_entry_set *only, const char *entry,
                                       CUfunction *out) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_ctx_get_function: out is NULL");
  *out = NULL;
  moejit_kernel *k;
  moejit_status st = get_kernel(ctx, "moejit_ctx_get_kernel", spec, family, only, entry, &k);
  if (st == MOEJIT_OK) *out = k->function->fn;
  return st;
}

moejit_status moejit_kernel_get_info(const moejit_kernel *k, moejit_kernel_info *info) {
  if (!k || !info)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_kernel_get_info: kernel and info are "
                   "required");
  memset(info, 0, sizeof *info);
  mj_strlcpy(info->family, k->family, sizeof info->family);
  mj_strlcpy(info->entry, k->function->entry, sizeof info->entry);
  mj_strlcpy(info->arch, k->ctx->info.arch, sizeof info->arch);
  mj_strlcpy(info->key, k->module->key, sizeof info->key);
  info->max_threads_per_block = k->function->max_threads_per_block;
  info->static_smem_bytes = k->function->static_smem;
  info->max_dynamic_smem_bytes = k->ctx->info.smem_per_block_optin - k->function->static_smem;
  info->num_regs = k->function->num_regs;
  info->num_params = k->function->num_params;
  return MOEJIT_OK;
}

mj_function *mj_ctx_function_info(moejit_ctx *ctx, CUfunction fn) {
  mj_function *found = NULL;
  pthread_mutex_lock(&ctx->lock);
  for (size_t i = 0; i < ctx->n_modules && !found; i++) {
    const mj_module *m = ctx->modules[i];
    for (size_t j = 0; j < m->n_functions && !found; j++)
      if (m->functions[j]->fn == fn) found = m->functions[j];
  }
  pthread_mutex_unlock(&ctx->lock);
  return found;
}

void mj_ctx_free_modules(moejit_ctx *ctx) {
  for (size_t i = 0; i < ctx->n_kernels; i++) free(ctx->kernels[i]);
  ctx->n_kernels = 0;
  for (size_t i = 0; i < ctx->n_modules; i++) {
    mj_module *m = ctx->modules[i];
    (void)ctx->d->ModuleUnload(m->module);
    for (size_t j = 0; j < m->n_functions; j++) free(m->functions[j]);
    free(m->functions);
    free(m);
  }
  ctx->n_modules = 0;
}
