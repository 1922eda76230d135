/* Kernel launch: shape, shared-memory and argument checks against the
 * device and the kernel before anything is enqueued; the dynamic shared-
 * memory opt-in above 48 KiB; plain, cluster and cooperative launches. */
#include <string.h>

#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

/* Dynamic shared memory a kernel may use without opting in. */
#define MJ_SMEM_DEFAULT_LIMIT (48 * 1024)

/* What a launch is checked against beyond the device: known for kernels
 * resolved through the module cache, unknown (NULL) for raw CUfunctions. */
typedef struct launch_target {
  CUfunction fn;
  const mj_function *info; /* may be NULL */
  atomic_int *smem_limit;  /* memo of the function's current opt-in */
} launch_target;

static const char *const dim_names[3] = {"x", "y", "z"};

static moejit_status check_shape(const moejit_ctx *ctx, const char *call, const launch_target *t,
                                 const unsigned grid[3], const unsigned block[3]) {
  const mj_device_limits *l = &ctx->limits;
  for (int i = 0; i < 3; i++) {
    if (grid[i] == 0 || grid[i] > l->max_grid[i])
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: grid.%s = %u is outside 1..%u", call,
                     dim_names[i], grid[i], l->max_grid[i]);
    if (block[i] == 0 || block[i] > l->max_block[i])
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: block.%s = %u is outside 1..%u", call,
                     dim_names[i], block[i], l->max_block[i]);
  }
  unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
  int max_threads = l->max_threads_per_block;
  const char *whose = "the device's";
  if (t->info && t->info->max_threads_per_block > 0 &&
      t->info->max_threads_per_block < max_threads) {
    max_threads = t->info->max_threads_per_block;
    whose = "this kernel's (registers or __launch_bounds__)";
  }
  if (threads > (unsigned long long)max_threads)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: block of %ux%ux%u = %llu threads exceeds %s limit of %d threads", call,
                   block[0], block[1], block[2], threads, whose, max_threads);
  return MOEJIT_OK;
}

static moejit_status check_smem(const moejit_ctx *ctx, const char *call, const launch_target *t,
                                unsigned smem) {
  int static_smem = t->info ? t->info->static_smem : 0;
  long long max = (long long)ctx->limits.smem_per_block_optin - static_smem;
  if ((long long)smem > max)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: %u bytes of dynamic shared memory requested, the most this kernel can "
                   "have is %lld (device opt-in limit %d bytes less %d bytes of static shared "
                   "memory)",
                   call, smem, max, ctx->limits.smem_per_block_optin, static_smem);
  return MOEJIT_OK;
}

static moejit_status check_args(const char *call, const launch_target *t, void **args) {
  int n = t->info ? t->info->num_params : -1;
  if (!args && n > 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: args is NULL but the kernel takes %d parameters", call, n);
  if (!args && n < 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: args is NULL (pass an array of pointers to the parameter values)", call);
  for (int i = 0; args && i < n; i++)
    if (!args[i])
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args[%d] is NULL (the kernel takes %d parameters; each args[i] must "
                     "point at the value of parameter i)",
                     call, i, n);
  return MOEJIT_OK;
}

static moejit_status check_launch(const moejit_ctx *ctx, const char *call, const launch_target *t,
                                  const unsigned grid[3], const unsigned block[3], unsigned smem,
                                  void **args) {
  if (!t->fn || !grid || !block)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: kernel, grid and block are required", call);
  moejit_status st = check_shape(ctx, call, t, grid, block);
  if (st == MOEJIT_OK) st = check_smem(ctx, call, t, smem);
  if (st == MOEJIT_OK) st = check_args(call, t, args);
  return st;
}

/* Above 48 KiB of static plus dynamic shared memory a kernel must opt in
 * (a kernel with static shared memory needs it below 48 KiB of dynamic:
 * 48 KiB of dynamic beside a few bytes of static was refused by the launch,
 * CUDA_ERROR_INVALID_VALUE). We raise its limit straight to the most it can
 * have: every thread then sets the same value, so concurrent launches with
 * different sizes cannot undo each other. ctx pushed. */
static moejit_status raise_smem_limit(moejit_ctx *ctx, const launch_target *t, unsigned smem) {
  if (smem == 0) return MOEJIT_OK;
  /* without the function's info, the driver's attribute below decides */
  if (t->info && (unsigned long long)smem + (unsigned)t->info->static_smem <= MJ_SMEM_DEFAULT_LIMIT)
    return MOEJIT_OK;
  if (t->smem_limit && (unsigned)atomic_load(t->smem_limit) >= smem) return MOEJIT_OK;
  const mj_driver *d = ctx->d;
  int current = 0, static_smem = 0;
  moejit_status st = mj_cu_check(
      d->FuncGetAttribute(&current, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, t->fn),
      "cuFuncGetAttribute");
  if (st == MOEJIT_OK && (unsigned)current < smem) {
    st = mj_cu_check(d->FuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, t->fn),
                     "cuFuncGetAttribute");
    current = ctx->limits.smem_per_block_optin - static_smem;
    if (st == MOEJIT_OK && (unsigned)current < smem) /* raw fn: static smem known only now */
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "kernel launch: %u bytes of dynamic shared memory requested, the most this "
                     "kernel can have is %d (device opt-in limit %d less %d static)",
                     smem, current, ctx->limits.smem_per_block_optin, static_smem);
    if (st == MOEJIT_OK)
      st = mj_cu_check(
          d->FuncSetAttribute(t->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, current),
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  }
  if (st == MOEJIT_OK && t->smem_limit) atomic_store(t->smem_limit, current);
  return st;
}

static moejit_status check_cluster(const moejit_ctx *ctx, const char *call, const unsigned grid[3],
                                   const unsigned cluster[3]) {
  if (!ctx->limits.cluster_launch)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: thread-block clusters need compute capability 9.0+ and a CUDA 12 driver "
                   "(device %s, cc %d.%d); HINT: set cluster_m and cluster_n to 1",
                   call, ctx->info.name, ctx->info.cc_major, ctx->info.cc_minor);
  for (int i = 0; i < 3; i++)
    if (cluster[i] == 0 || grid[i] % cluster[i] != 0)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: grid.%s = %u is not a multiple of cluster.%s = %u", call, dim_names[i],
                     grid[i], dim_names[i], cluster[i]);
  return MOEJIT_OK;
}

/* The cuLaunchKernelEx configuration of a launch with one attribute. */
static CUlaunchConfig launch_config(const unsigned grid[3], const unsigned block[3], unsigned smem,
                                    moejit_stream stream, CUlaunchAttribute *attr) {
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDimX = grid[0], cfg.gridDimY = grid[1], cfg.gridDimZ = grid[2];
  cfg.blockDimX = block[0], cfg.blockDimY = block[1], cfg.blockDimZ = block[2];
  cfg.sharedMemBytes = smem;
  cfg.hStream = (CUstream)stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* The launch attribute of a thread-block cluster shape. */
static CUlaunchAttribute cluster_attr(const unsigned cluster[3]) {
  CUlaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = cluster[0];
  attr.value.clusterDim.y = cluster[1];
  attr.value.clusterDim.z = cluster[2];
  return attr;
}

/* cuLaunchKernelEx of fn with one launch attribute. ctx pushed. */
static CUresult launch_ex(const moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                          const unsigned block[3], unsigned smem, moejit_stream stream, void **args,
                          CUlaunchAttribute *attr) {
  CUlaunchConfig cfg = launch_config(grid, block, smem, stream, attr);
  return ctx->d->LaunchKernelEx(&cfg, fn, args, NULL);
}

/* Enqueues t: a plain launch, or cuLaunchKernelEx with a cluster shape or
 * the cooperative attribute. *too_large = 1 (and MOEJIT_OK, nothing
 * enqueued) when a cooperative grid does not fit the device at once. */
static moejit_status enqueue(moejit_ctx *ctx, const launch_target *t, const unsigned grid[3],
                             const unsigned block[3], const unsigned cluster[3], int cooperative,
                             unsigned smem, moejit_stream stream, void **args, int *too_large) {
  if (!cluster && !cooperative)
    return mj_cu_check(ctx->d->LaunchKernel(t->fn, grid[0], grid[1], grid[2], block[0], block[1],
                                            block[2], smem, (CUstream)stream, args, NULL),
                       "cuLaunchKernel");
  CUlaunchAttribute attr;
  if (cooperative) {
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
  } else {
    attr = cluster_attr(cluster);
  }
  const CUresult r = launch_ex(ctx, t->fn, grid, block, smem, stream, args, &attr);
  if (cooperative && r == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) {
    *too_large = 1; /* a partitioned or shared GPU: the caller launches another way */
    return MOEJIT_OK;
  }
  return mj_cu_check(r, cooperative ? "cuLaunchKernelEx (cooperative)" : "cuLaunchKernelEx");
}

static int is_unit_cluster(const unsigned cluster[3]) {
  return !cluster || (cluster[0] == 1 && cluster[1] == 1 && cluster[2] == 1);
}

/* Checks, then enqueues under the ctx: cluster NULL or unit for none;
 * cooperative needs cuLaunchKernelEx (the caller checks) and sets
 * *too_large as enqueue() does. */
static moejit_status launch(moejit_ctx *ctx, const char *call, const launch_target *t,
                            const unsigned grid[3], const unsigned block[3],
                            const unsigned cluster[3], int cooperative, int *too_large,
                            unsigned smem, moejit_stream stream, void **args) {
  moejit_status st = check_launch(ctx, call, t, grid, block, smem, args);
  if (is_unit_cluster(cluster)) cluster = NULL;
  if (st == MOEJIT_OK && cluster) st = check_cluster(ctx, call, grid, cluster);
  if (st != MOEJIT_OK) return mj_ctx_fail(ctx, st);
  st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = raise_smem_limit(ctx, t, smem);
  if (st == MOEJIT_OK)
    st = enqueue(ctx, t, grid, block, cluster, cooperative, smem, stream, args, too_large);
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status mj_ctx_launch(moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                            const unsigned block[3], unsigned smem_bytes, moejit_stream stream,
                            void **args) {
  return mj_ctx_launch_cluster(ctx, fn, grid, block, NULL, smem_bytes, stream, args);
}

moejit_status mj_ctx_launch_cluster(moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                                    const unsigned block[3], const unsigned cluster[3],
                                    unsigned smem_bytes, moejit_stream stream, void **args) {
  MJ_CHECK_CTX(ctx, "mj_ctx_launch");
  /* Functions from this ctx's module cache get the full per-kernel checks. */
  mj_function *f = fn ? mj_ctx_function_info(ctx, fn) : NULL;
  launch_target t = {fn, f, f ? &f->dynamic_smem_limit : NULL};
  return launch(ctx, "mj_ctx_launch", &t, grid, block, cluster, 0, NULL, smem_bytes, stream, args);
}

static moejit_status check_kernel(moejit_ctx *ctx, const char *call, const moejit_kernel *kernel) {
  if (!kernel)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: kernel is NULL", call));
  if (kernel->ctx != ctx)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: the kernel belongs to another ctx", call));
  return MOEJIT_OK;
}

static launch_target kernel_target(moejit_kernel *kernel) {
  launch_target t = {kernel->function->fn, kernel->function, &kernel->function->dynamic_smem_limit};
  return t;
}

moejit_status moejit_kernel_launch(moejit_ctx *ctx, moejit_kernel *kernel, const unsigned grid[3],
                                   const unsigned block[3], unsigned smem_bytes,
                                   moejit_stream stream, void **args) {
  const char *call = "moejit_kernel_launch";
  MJ_CHECK_CTX(ctx, call);
  moejit_status st = check_kernel(ctx, call, kernel);
  if (st != MOEJIT_OK) return st;
  const launch_target t = kernel_target(kernel);
  return launch(ctx, call, &t, grid, block, NULL, 0, NULL, smem_bytes, stream, args);
}

moejit_status mj_kernel_launch_cooperative(moejit_ctx *ctx, moejit_kernel *kernel,
                                           const unsigned grid[3], const unsigned block[3],
                                           unsigned smem_bytes, moejit_stream stream, void **args,
                                           int *launched) {
  const char *call = "moejit_kernel_launch (cooperative)";
  *launched = 0;
  MJ_CHECK_CTX(ctx, call);
  moejit_status st = check_kernel(ctx, call, kernel);
  if (st != MOEJIT_OK) return st;
  if (!ctx->d->LaunchKernelEx)
    return MOEJIT_OK; /* no cuLaunchKernelEx: the caller's plain launch */
  const launch_target t = kernel_target(kernel);
  int too_large = 0;
  st = launch(ctx, call, &t, grid, block, NULL, 1, &too_large, smem_bytes, stream, args);
  *launched = st == MOEJIT_OK && !too_large;
  return st;
}

int mj_kernel_active_clusters(moejit_ctx *ctx, moejit_kernel *kernel, const unsigned block[3],
                              unsigned smem, unsigned cluster_x) {
  if (!ctx || !kernel || !kernel->function || cluster_x == 0) return 0;
  mj_function *f = kernel->function;
  int cached = atomic_load(&f->active_clusters);
  if (cached != 0) return cached > 0 ? cached : 0;
  if (!ctx->d->OccupancyMaxActiveClusters || mj_ctx_enter(ctx) != MOEJIT_OK) return 0;
  const launch_target t = kernel_target(kernel);
  int n = 0;
  moejit_status st = raise_smem_limit(ctx, &t, smem);
  if (st == MOEJIT_OK) {
    const unsigned shape[3] = {cluster_x, 1, 1};
    CUlaunchAttribute attr = cluster_attr(shape);
    const unsigned grid[3] = {
        cluster_x * (unsigned)(ctx->info.sm_count > 0 ? ctx->info.sm_count : 1), 1, 1};
    CUlaunchConfig cfg = launch_config(grid, block, smem, NULL, &attr);
    if (ctx->d->OccupancyMaxActiveClusters(&n, f->fn, &cfg) != CUDA_SUCCESS) n = 0;
  }
  mj_ctx_leave(ctx);
  atomic_store(&f->active_clusters, n > 0 ? n : -1);
  return n > 0 ? n : 0;
}
