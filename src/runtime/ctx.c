/* moejit_ctx: one device's primary context, its limits and arch, its
 * compiler, and the last error any thread produced through it. */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

void moejit_ctx_opts_init(moejit_ctx_opts *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->device = -1;
  moejit_compiler_opts_init(&opts->compiler);
}

static moejit_status ctx_init_locks(moejit_ctx *ctx) {
  if (pthread_mutex_init(&ctx->lock, NULL) != 0)
    return mj_fail(MOEJIT_ERR_INTERNAL, "moejit_ctx_create: pthread_mutex_init failed");
  if (pthread_mutex_init(&ctx->error_lock, NULL) != 0) {
    pthread_mutex_destroy(&ctx->lock);
    return mj_fail(MOEJIT_ERR_INTERNAL, "moejit_ctx_create: pthread_mutex_init failed");
  }
  return MOEJIT_OK;
}

/* The part of creation after the device is known; on failure the caller
 * frees what was set up (ctx_free copes with a half-built ctx). */
static moejit_status ctx_setup(moejit_ctx *ctx, int ordinal, const moejit_ctx_opts *opts) {
  moejit_status st = mj_device_read(ctx->d, ctx->dev, ordinal, &ctx->info, &ctx->limits);
  if (st != MOEJIT_OK) return st;
  st = mj_cu_check(ctx->d->DevicePrimaryCtxRetain(&ctx->cu, ctx->dev), "cuDevicePrimaryCtxRetain");
  if (st != MOEJIT_OK) {
    ctx->cu = NULL;
    return st;
  }
  return moejit_compiler_create(&ctx->compiler, &opts->compiler);
}

static void ctx_free(moejit_ctx *ctx) {
  if (ctx->cu) {
    if (mj_ctx_enter(ctx) == MOEJIT_OK) {
      /* Modules may still run queued kernels, and pool frees complete at
       * synchronization: wait, then unload and hand pool memory back. */
      (void)ctx->d->CtxSynchronize();
      mj_ctx_free_modules(ctx);
      if (ctx->info.memory_pools && ctx->d->DeviceGetDefaultMemPool && ctx->d->MemPoolTrimTo) {
        CUmemoryPool pool;
        if (ctx->d->DeviceGetDefaultMemPool(&pool, ctx->dev) == CUDA_SUCCESS)
          (void)ctx->d->MemPoolTrimTo(pool, 0);
      }
      mj_ctx_leave(ctx);
    }
    (void)ctx->d->DevicePrimaryCtxRelease(ctx->dev);
  }
  moejit_compiler_destroy(ctx->compiler);
  free(ctx->modules);
  free(ctx->kernels);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->error_lock);
  free(ctx);
}

moejit_status moejit_ctx_create(moejit_ctx **out, const moejit_ctx_opts *opts) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_ctx_create: out is NULL");
  *out = NULL;
  moejit_ctx_opts defaults;
  if (!opts) {
    moejit_ctx_opts_init(&defaults);
    opts = &defaults;
  }
  if (opts->device < -1)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_ctx_create: device %d is not an ordinal (use -1 for the first device)",
                   opts->device);
  const mj_driver *d;
  CUdevice dev;
  int ordinal;
  moejit_status st = mj_device_open(opts->device, &d, &dev, &ordinal);
  if (st != MOEJIT_OK) return st;

  moejit_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_ctx_create: out of host memory");
  ctx->d = d;
  ctx->dev = dev;
  st = ctx_init_locks(ctx);
  if (st != MOEJIT_OK) {
    free(ctx);
    return st;
  }
  st = ctx_setup(ctx, ordinal, opts);
  if (st != MOEJIT_OK) {
    ctx_free(ctx);
    return st;
  }
  *out = ctx;
  return MOEJIT_OK;
}

void moejit_ctx_destroy(moejit_ctx *ctx) {
  if (ctx) ctx_free(ctx);
}

void mj_ctx_note_error(moejit_ctx *ctx) {
  if (!ctx) return;
  const char *msg = moejit_last_error();
  pthread_mutex_lock(&ctx->error_lock);
  mj_strlcpy(ctx->last_error, msg ? msg : "", sizeof ctx->last_error);
  pthread_mutex_unlock(&ctx->error_lock);
}

moejit_status mj_ctx_fail(moejit_ctx *ctx, moejit_status status) {
  if (status != MOEJIT_OK) mj_ctx_note_error(ctx);
  return status;
}

const char *moejit_ctx_last_error(moejit_ctx *ctx) {
  /* A per-thread copy: another thread's failure cannot change the text
   * under the caller's feet. */
  static _Thread_local char copy[MJ_CTX_ERROR_MAX];
  if (!ctx) return "";
  pthread_mutex_lock(&ctx->error_lock);
  memcpy(copy, ctx->last_error, sizeof copy);
  pthread_mutex_unlock(&ctx->error_lock);
  return copy;
}

moejit_status moejit_ctx_device_info(moejit_ctx *ctx, moejit_device_info *info) {
  MJ_CHECK_CTX(ctx, "moejit_ctx_device_info");
  if (!info)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_ctx_device_info: info is NULL"));
  *info = ctx->info;
  return MOEJIT_OK;
}

moejit_compiler *moejit_ctx_compiler(moejit_ctx *ctx) {
  return ctx ? ctx->compiler : NULL;
}

moejit_status mj_ctx_limits(moejit_ctx *ctx, mj_device_limits *out) {
  MJ_CHECK_CTX(ctx, "mj_ctx_limits");
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_ctx_limits: out is NULL");
  *out = ctx->limits;
  return MOEJIT_OK;
}

const char *mj_ctx_arch(const moejit_ctx *ctx) {
  return ctx ? ctx->info.arch : "";
}

int mj_ctx_sm_count(const moejit_ctx *ctx) {
  return ctx && ctx->info.sm_count > 0 ? ctx->info.sm_count : 1;
}

int mj_ctx_smem_optin(const moejit_ctx *ctx) {
  return ctx && ctx->limits.smem_per_block_optin > 0 ? ctx->limits.smem_per_block_optin : 0;
}

int mj_ctx_l2_bytes(const moejit_ctx *ctx) {
  return ctx && ctx->info.l2_bytes > 0 ? ctx->info.l2_bytes : 0;
}

unsigned long mj_ctx_module_loads(moejit_ctx *ctx) {
  return ctx ? atomic_load(&ctx->module_loads) : 0;
}

int mj_ctx_stream_capturing(moejit_ctx *ctx, moejit_stream stream) {
  if (!ctx || !ctx->d->StreamIsCapturing || mj_ctx_enter(ctx) != MOEJIT_OK) return 0;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = ctx->d->StreamIsCapturing((CUstream)stream, &status);
  mj_ctx_leave(ctx);
  return r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

moejit_status mj_ctx_record_event(moejit_ctx *ctx, moejit_event event, moejit_stream stream) {
  if (!mj_ctx_stream_capturing(ctx, stream)) return moejit_event_record(ctx, event, stream);
  if (!ctx->d->EventRecordWithFlags)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                                    "recording an event inside a stream capture needs "
                                    "cuEventRecordWithFlags (CUDA 11.1 or newer driver)"));
  moejit_status st = mj_ctx_enter(ctx);
  if (st) return st;
  st = mj_cu_check(ctx->d->EventRecordWithFlags((CUevent)event, (CUstream)stream,
                                                CU_EVENT_RECORD_EXTERNAL),
                   "cuEventRecordWithFlags");
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

const struct mj_driver *mj_ctx_driver(const moejit_ctx *ctx) {
  return ctx ? ctx->d : NULL;
}

moejit_status mj_ctx_enter(moejit_ctx *ctx) {
  return mj_ctx_fail(ctx, mj_cu_check(ctx->d->CtxPushCurrent(ctx->cu), "cuCtxPushCurrent"));
}

CUdevice mj_ctx_device(const moejit_ctx *ctx) {
  return ctx->dev;
}

void mj_ctx_leave(moejit_ctx *ctx) {
  CUcontext popped;
  (void)ctx->d->CtxPopCurrent(&popped);
}

moejit_status moejit_ctx_reset_persisting_l2(moejit_ctx *ctx) {
  MJ_CHECK_CTX(ctx, "moejit_ctx_reset_persisting_l2");
  if (!ctx->d->CtxResetPersistingL2Cache)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                                    "moejit_ctx_reset_persisting_l2: this CUDA driver has no "
                                    "cuCtxResetPersistingL2Cache (CUDA 11.0 and later have it)"));
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = mj_cu_check(ctx->d->CtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache");
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_ctx_synchronize(moejit_ctx *ctx) {
  MJ_CHECK_CTX(ctx, "moejit_ctx_synchronize");
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = mj_cu_check(ctx->d->CtxSynchronize(), "cuCtxSynchronize");
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}
