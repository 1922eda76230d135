/* Internal face of the GPU runtime: the dlopen'ed CUDA driver table and
 * what ops need from a context (kernel lookup, launch, device limits).
 * The public calls live in include/moejit/runtime.h. */
#ifndef MOEJIT_RUNTIME_H
#define MOEJIT_RUNTIME_H

#include <cuda.h> /* types and enums only: libcuda is never linked */

#include "moejit/moejit.h"

/* Turns a CUresult into a moejit status with a message
 * "<what>: CUDA_ERROR_X (description)"; CUDA_SUCCESS returns MOEJIT_OK. */
moejit_status mj_cu_check(CUresult r, const char *what);

/* The device limits ops check launches against. */
typedef struct mj_device_limits {
  int cc_major, cc_minor, sm_count;
  int max_threads_per_block;
  int smem_per_block_optin; /* bytes, the most a block can ask for */
} mj_device_limits;
moejit_status mj_ctx_limits(moejit_ctx *ctx, mj_device_limits *out);

/* Generates, compiles (or loads from cache) and loads the module of
 * `family` for `spec` on this context's arch, then returns the entry's
 * function. Memoized by cache key: the module loads once per context.
 * Thread-safe. */
moejit_status mj_ctx_get_function(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                  const char *entry, CUfunction *out);

/* cuLaunchKernel through the driver table, raising the dynamic shared-
 * memory limit of `fn` first when smem_bytes > 48 KiB. Makes the context
 * current on the calling thread. Never synchronizes. */
moejit_status mj_ctx_launch(moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                            const unsigned block[3], unsigned smem_bytes, moejit_stream stream,
                            void **args);

/* Records `message` as the context's last error too (ops call this on
 * failure paths they report). */
void mj_ctx_note_error(moejit_ctx *ctx);

#endif
