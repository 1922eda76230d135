/* Private to src/runtime/: the layout of moejit_ctx and its module and
 * kernel memos, shared by the files of this folder only. */
#ifndef MOEJIT_RUNTIME_IMPL_H
#define MOEJIT_RUNTIME_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "runtime/runtime.h"

#define MJ_CTX_ERROR_MAX 8192
#define MJ_ENTRY_MAX 96

/* A function resolved from a loaded module, with the attributes launch
 * checks need (read once, when it is resolved). */
typedef struct mj_function {
  char entry[MJ_ENTRY_MAX];
  CUfunction fn;
  int max_threads_per_block;
  int static_smem;
  int num_regs;
  int num_params;                /* -1: unknown */
  atomic_int dynamic_smem_limit; /* current MAX_DYNAMIC_SHARED_SIZE_BYTES */
  atomic_int active_clusters;    /* mj_kernel_active_clusters: 0 not asked, -1 unknown */
} mj_function;

/* One loaded cubin, keyed by its cache key. Functions are allocated one by
 * one so that their addresses stay valid while the arrays grow. */
typedef struct mj_module {
  char key[33];
  char family[MOEJIT_NAME_MAX];
  CUmodule module;
  mj_function **functions;
  size_t n_functions, cap_functions;
} mj_module;

/* What moejit_ctx_get_kernel hands out: a memo entry keyed by the spec's
 * bytes, family and requested entry. */
struct moejit_kernel {
  moejit_spec spec;
  char family[MOEJIT_NAME_MAX];
  char requested_entry[MJ_ENTRY_MAX]; /* "" when the caller passed NULL */
  mj_module *module;
  mj_function *function;
  moejit_ctx *ctx;
};

struct moejit_ctx {
  const mj_driver *d;
  CUdevice dev;
  CUcontext cu; /* the device's primary context, retained */
  moejit_device_info info;
  mj_device_limits limits;
  moejit_compiler *compiler;

  pthread_mutex_t lock; /* guards modules and kernels */
  mj_module **modules;
  size_t n_modules, cap_modules;
  moejit_kernel **kernels;
  size_t n_kernels, cap_kernels;
  atomic_ulong module_loads;

  pthread_mutex_t error_lock;
  char last_error[MJ_CTX_ERROR_MAX];
};

/* Reads a device's info and launch limits (device.c). */
moejit_status mj_device_read(const mj_driver *d, CUdevice dev, int ordinal,
                             moejit_device_info *info, mj_device_limits *limits);
/* Loads the driver, runs cuInit and finds device `ordinal` (-1: the first);
 * *resolved is the ordinal used. NO_DEVICE when there are none. */
moejit_status mj_device_open(int ordinal, const mj_driver **d, CUdevice *dev, int *resolved);

/* The record of a function this ctx resolved, or NULL for a CUfunction
 * from elsewhere (module.c; takes ctx->lock). */
mj_function *mj_ctx_function_info(moejit_ctx *ctx, CUfunction fn);

/* Unloads every module and frees the memos (module.c); ctx pushed. */
void mj_ctx_free_modules(moejit_ctx *ctx);

/* Shared argument check: NULL ctx is INVALID_ARGUMENT naming `call`. */
#define MJ_CHECK_CTX(ctx, call)                                                       \
  do {                                                                                \
    if (!(ctx)) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", call); \
  } while (0)

#endif
