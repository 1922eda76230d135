/* Device and pinned host memory: stream-ordered alloc/free where the device
 * has memory pools (cuMemAllocAsync), copies, memset, free/total queries. */
#include <stdint.h>

#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

static CUdeviceptr dptr_of(const void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

static moejit_status invalid(moejit_ctx *ctx, const char *call, const char *what) {
  return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s", call, what));
}

/* After the driver refused a copy: if a pointer meant as device memory is
 * not, say so (INVALID_ARGUMENT) instead of a bare CUDA_ERROR_INVALID_VALUE.
 * Costs nothing on the success path. ctx pushed. */
static moejit_status explain_pointer(moejit_ctx *ctx, CUresult r, const char *call,
                                     const char *name, const void *p) {
  if (r == CUDA_ERROR_INVALID_VALUE) {
    unsigned int type = 0;
    CUresult q = ctx->d->PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr_of(p));
    if (q != CUDA_SUCCESS || type != CU_MEMORYTYPE_DEVICE)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: %s = %p is not device memory of this context; HINT: allocate it with "
                     "moejit_mem_alloc (or cudaMalloc on the same device)",
                     call, name, p);
  }
  return mj_cu_check(r, call);
}

moejit_status moejit_mem_alloc(moejit_ctx *ctx, size_t bytes, moejit_stream stream, void **dptr) {
  MJ_CHECK_CTX(ctx, "moejit_mem_alloc");
  if (!dptr) return invalid(ctx, "moejit_mem_alloc", "dptr is NULL");
  *dptr = NULL;
  if (bytes == 0) return invalid(ctx, "moejit_mem_alloc", "bytes is 0");
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  CUdeviceptr p = 0;
  if (ctx->info.memory_pools)
    st = mj_cu_check(ctx->d->MemAllocAsync(&p, bytes, (CUstream)stream), "cuMemAllocAsync");
  else
    st = mj_cu_check(ctx->d->MemAlloc(&p, bytes), "cuMemAlloc");
  mj_ctx_leave(ctx);
  if (st != MOEJIT_OK)
    return mj_ctx_fail(
        ctx, mj_fail_prefix(st, "allocating %zu bytes on device %d", bytes, ctx->info.ordinal));
  *dptr = (void *)(uintptr_t)p;
  return MOEJIT_OK;
}

moejit_status moejit_mem_free(moejit_ctx *ctx, void *dptr, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_mem_free");
  if (!dptr) return invalid(ctx, "moejit_mem_free", "dptr is NULL");
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  if (ctx->info.memory_pools)
    st = mj_cu_check(ctx->d->MemFreeAsync(dptr_of(dptr), (CUstream)stream), "cuMemFreeAsync");
  else
    st = mj_cu_check(ctx->d->MemFree(dptr_of(dptr)), "cuMemFree");
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

/* Shared NULL checks of the three copies (a 0-byte copy is still checked). */
static moejit_status copy_args(moejit_ctx *ctx, const char *call, const void *dst,
                               const void *src) {
  if (!dst) return invalid(ctx, call, "dst is NULL");
  if (!src) return invalid(ctx, call, "src is NULL");
  return MOEJIT_OK;
}

moejit_status moejit_memcpy_htod(moejit_ctx *ctx, void *dst, const void *src, size_t bytes,
                                 moejit_stream stream) {
  static const char call[] = "moejit_memcpy_htod";
  MJ_CHECK_CTX(ctx, call);
  moejit_status st = copy_args(ctx, call, dst, src);
  if (st != MOEJIT_OK || bytes == 0) return st;
  if ((st = mj_ctx_enter(ctx)) != MOEJIT_OK) return st;
  CUresult r = ctx->d->MemcpyHtoDAsync(dptr_of(dst), src, bytes, (CUstream)stream);
  st = r == CUDA_SUCCESS ? MOEJIT_OK : explain_pointer(ctx, r, "cuMemcpyHtoDAsync", "dst", dst);
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_memcpy_dtoh(moejit_ctx *ctx, void *dst, const void *src, size_t bytes,
                                 moejit_stream stream) {
  static const char call[] = "moejit_memcpy_dtoh";
  MJ_CHECK_CTX(ctx, call);
  moejit_status st = copy_args(ctx, call, dst, src);
  if (st != MOEJIT_OK || bytes == 0) return st;
  if ((st = mj_ctx_enter(ctx)) != MOEJIT_OK) return st;
  CUresult r = ctx->d->MemcpyDtoHAsync(dst, dptr_of(src), bytes, (CUstream)stream);
  st = r == CUDA_SUCCESS ? MOEJIT_OK : explain_pointer(ctx, r, "cuMemcpyDtoHAsync", "src", src);
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_memcpy_dtod(moejit_ctx *ctx, void *dst, const void *src, size_t bytes,
                                 moejit_stream stream) {
  static const char call[] = "moejit_memcpy_dtod";
  MJ_CHECK_CTX(ctx, call);
  moejit_status st = copy_args(ctx, call, dst, src);
  if (st != MOEJIT_OK || bytes == 0) return st;
  if ((st = mj_ctx_enter(ctx)) != MOEJIT_OK) return st;
  CUresult r = ctx->d->MemcpyDtoDAsync(dptr_of(dst), dptr_of(src), bytes, (CUstream)stream);
  st = r == CUDA_SUCCESS ? MOEJIT_OK : explain_pointer(ctx, r, "cuMemcpyDtoDAsync", "dst", dst);
  if (st == MOEJIT_ERR_CUDA && r == CUDA_ERROR_INVALID_VALUE)
    st = explain_pointer(ctx, r, "cuMemcpyDtoDAsync", "src", src);
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_memset_d32(moejit_ctx *ctx, void *dst, uint32_t value, size_t count,
                                moejit_stream stream) {
  static const char call[] = "moejit_memset_d32";
  MJ_CHECK_CTX(ctx, call);
  if (!dst) return invalid(ctx, call, "dst is NULL");
  if ((uintptr_t)dst % 4 != 0)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: dst = %p is not 4-byte aligned", call, dst));
  if (count == 0) return MOEJIT_OK;
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  CUresult r = ctx->d->MemsetD32Async(dptr_of(dst), value, count, (CUstream)stream);
  st = r == CUDA_SUCCESS ? MOEJIT_OK : explain_pointer(ctx, r, "cuMemsetD32Async", "dst", dst);
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_host_alloc(moejit_ctx *ctx, size_t bytes, void **host) {
  MJ_CHECK_CTX(ctx, "moejit_host_alloc");
  if (!host) return invalid(ctx, "moejit_host_alloc", "host is NULL");
  *host = NULL;
  if (bytes == 0) return invalid(ctx, "moejit_host_alloc", "bytes is 0");
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  /* Portable: the pinning holds for every context, not just this one. */
  st = mj_cu_check(ctx->d->MemHostAlloc(host, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
  mj_ctx_leave(ctx);
  if (st != MOEJIT_OK) {
    *host = NULL;
    return mj_ctx_fail(ctx, mj_fail_prefix(st, "pinning %zu bytes of host memory", bytes));
  }
  return MOEJIT_OK;
}

moejit_status moejit_host_free(moejit_ctx *ctx, void *host) {
  MJ_CHECK_CTX(ctx, "moejit_host_free");
  if (!host) return MOEJIT_OK;
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = mj_cu_check(ctx->d->MemFreeHost(host), "cuMemFreeHost");
  mj_ctx_leave(ctx);
  return mj_ctx_fail(ctx, st);
}

moejit_status moejit_mem_get_info(moejit_ctx *ctx, size_t *free_bytes, size_t *total_bytes) {
  MJ_CHECK_CTX(ctx, "moejit_mem_get_info");
  size_t f = 0, t = 0;
  moejit_status st = mj_ctx_enter(ctx);
  if (st != MOEJIT_OK) return st;
  st = mj_cu_check(ctx->d->MemGetInfo(&f, &t), "cuMemGetInfo");
  mj_ctx_leave(ctx);
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return mj_ctx_fail(ctx, st);
}
