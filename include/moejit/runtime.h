/* moejit GPU runtime: contexts, memory, streams, events, kernel launch.
 * Included by moejit/moejit.h; do not include on its own.
 *
 * The CUDA driver (libcuda.so.1, or $MOEJIT_LIBCUDA_PATH) is loaded with
 * dlopen at first use: programs linking moejit start on machines without a
 * driver, where these calls return MOEJIT_ERR_NO_DRIVER and compile-only use
 * (moejit_compiler) keeps working. The library never links libcuda.
 *
 * Loading happens once per process, on the first call that needs the
 * driver; $MOEJIT_LIBCUDA_PATH is read at that moment only. A failed load is
 * remembered: later calls fail the same way without retrying.
 *
 * Conventions for every call below:
 * - Errors: MOEJIT_ERR_INVALID_ARGUMENT for NULL out-pointers, NULL device
 *   pointers, zero sizes where a size is required, misaligned pointers and
 *   launch shapes that do not fit the device; these checks run before any
 *   driver call (so they need no driver) and nothing is enqueued when they
 *   fail. A failing driver call gives MOEJIT_ERR_CUDA (or OUT_OF_MEMORY,
 *   NO_DEVICE, NOT_FOUND where that is what the driver said) with the message
 *   "cuXxx: CUDA_ERROR_NAME (driver's description)". On failure the message is
 *   the calling thread's moejit_last_error() and also the ctx's
 *   moejit_ctx_last_error().
 * - Threads: a moejit_ctx may be used from any number of threads at once.
 *   Each call makes the ctx's CUDA context current on the calling thread for
 *   its duration only (push/pop), so a caller's own current context is left
 *   as it was. Ordering between threads is the caller's business (streams).
 * - Streams: every call that takes a moejit_stream enqueues its work on that
 *   stream and returns without waiting for the GPU unless it says otherwise.
 *   NULL is the legacy default stream. A CUstream or cudaStream_t created by
 *   the caller on the same device (the CUDA runtime uses the primary context,
 *   as moejit does) may be passed directly.
 * - Device pointers are `void *` holding a CUdeviceptr (the same value the
 *   CUDA runtime's cudaMalloc returns); cast as needed. */
#ifndef MOEJIT_RUNTIME_PUBLIC_H
#define MOEJIT_RUNTIME_PUBLIC_H

#ifdef __cplusplus
extern "C" {
#endif

/* Same layout as CUstream / cudaStream_t and CUevent / cudaEvent_t, so
 * either can be passed directly. NULL is the legacy default stream. */
typedef struct CUstream_st *moejit_stream;
typedef struct CUevent_st *moejit_event;

typedef struct moejit_ctx moejit_ctx;

/* ------------------------------------------------------------------------ */
/* Driver and devices (no context needed)                                   */
/* ------------------------------------------------------------------------ */

/* The driver's CUDA version, e.g. 13000 for 13.0 (cuDriverGetVersion).
 * Needs the driver library only, not a device. NO_DRIVER without one.
 * Thread-safe. */
MOEJIT_API moejit_status moejit_driver_version(int *version);

/* Number of CUDA devices. MOEJIT_OK with *n = 0 when the driver loads but
 * reports no device (cuInit: CUDA_ERROR_NO_DEVICE); NO_DRIVER (and *n = 0)
 * when there is no usable driver, with a message saying why and that
 * compile-only use still works. Thread-safe. */
MOEJIT_API moejit_status moejit_device_count(int *n);

/* What moejit knows about one device. */
typedef struct moejit_device_info {
  int ordinal;               /* 0-based, as cuDeviceGet counts */
  char name[256];            /* "NVIDIA H100 80GB HBM3" */
  int cc_major, cc_minor;    /* compute capability, 9 and 0 on H100 */
  int sm_count;              /* multiprocessors */
  size_t total_mem;          /* device memory, bytes */
  int smem_per_block_optin;  /* bytes one block may use after opting in */
  int smem_per_sm;           /* bytes of shared memory per multiprocessor */
  int l2_bytes;              /* L2 cache size */
  int max_threads_per_block; /* 1024 on current GPUs */
  int memory_pools;          /* 1: stream-ordered allocation supported */
  /* The arch moejit compiles for on this device: "sm_90a" on 9.0,
   * "sm_100a" on 10.0 (the arch-specific features wgmma/tcgen05 need),
   * "sm_XY" otherwise. */
  char arch[MOEJIT_ARCH_MAX];
} moejit_device_info;

/* Fills *info for device `ordinal`. INVALID_ARGUMENT for an ordinal out of
 * range (the message gives the count); NO_DRIVER / NO_DEVICE as
 * moejit_device_count. Creates no context. Thread-safe. */
MOEJIT_API moejit_status moejit_device_query(int ordinal, moejit_device_info *info);

/* ------------------------------------------------------------------------ */
/* Context: one GPU, its loaded modules and the compiler that feeds them    */
/* ------------------------------------------------------------------------ */

typedef struct moejit_ctx_opts {
  int device;                    /* ordinal; -1: the first device */
  moejit_compiler_opts compiler; /* for the ctx's own moejit_compiler */
} moejit_ctx_opts;

/* Defaults: device -1, compiler options from moejit_compiler_opts_init. */
MOEJIT_API void moejit_ctx_opts_init(moejit_ctx_opts *opts);

/* Creates a context on one device: retains the device's primary CUDA
 * context (the one the CUDA runtime uses, so memory and streams are shared
 * with it), reads the device's limits, picks its arch and creates a
 * moejit_compiler from opts->compiler. opts NULL: defaults.
 *
 * Returns MOEJIT_OK and *out, owned by the caller (release with
 * moejit_ctx_destroy); on failure *out is NULL and:
 * NO_DRIVER (no libcuda.so.1, or unusable) and NO_DEVICE (no GPU) carry a
 * message that names the cause and says compile-only use (moejit compile,
 * moejit_compiler) still works; INVALID_ARGUMENT for an ordinal out of range;
 * the compiler's status if the compiler cannot be created.
 * Thread-safe; several contexts on one device share its primary context. */
MOEJIT_API moejit_status moejit_ctx_create(moejit_ctx **out, const moejit_ctx_opts *opts);

/* Waits for all work in the device's primary context (including work the
 * caller queued there through other APIs), unloads the ctx's modules,
 * returns unused stream-ordered pool memory to the device, releases the
 * primary context and frees the ctx. Memory from moejit_mem_alloc that the
 * caller did not free stays allocated while other users keep the primary
 * context alive. Kernel handles of this ctx become invalid. NULL is a no-op.
 * Not thread-safe with other calls on the same ctx. */
MOEJIT_API void moejit_ctx_destroy(moejit_ctx *ctx);

/* The last failure message produced through this ctx by any thread, or ""
 * (also for ctx NULL). The returned string is a copy private to the calling
 * thread, valid until that thread calls moejit_ctx_last_error again; long
 * messages are truncated to 8 KiB (the failing thread's moejit_last_error()
 * has the whole text). Thread-safe. */
MOEJIT_API const char *moejit_ctx_last_error(moejit_ctx *ctx);

/* The device this ctx runs on. Thread-safe. */
MOEJIT_API moejit_status moejit_ctx_device_info(moejit_ctx *ctx, moejit_device_info *info);

/* The ctx's compiler, borrowed: owned and destroyed by the ctx. Every
 * kernel the ctx loads is compiled (or found in the cache) for the ctx's
 * device arch (moejit_device_info.arch), whatever the spec's archs list
 * says: a spec listing only other archs, or "auto", still loads. Use it
 * to compile or warm the cache with the same options. NULL for ctx NULL. */
MOEJIT_API moejit_compiler *moejit_ctx_compiler(moejit_ctx *ctx);

/* Waits until all work queued in the ctx's (primary) context is done.
 * Returns the error of any earlier asynchronous failure (e.g. a kernel
 * that faulted). Blocks the calling thread. */
MOEJIT_API moejit_status moejit_ctx_synchronize(moejit_ctx *ctx);

/* Demotes every line the device's L2 holds with the persisting (evict_last)
 * priority to normal (cuCtxResetPersistingL2Cache), so that other data
 * streaming through L2 evicts them as it evicts the rest. moejit's kernels
 * store GEMM outputs of up to 48 MB and the gathered rows of x that way; a
 * benchmark that empties L2 between timed runs by reading a large buffer
 * needs this call first, or those lines outlive its flush (`moejit run`
 * does both). Acts when called, not in stream order: call it while none of
 * the ctx's work runs (after a synchronize). UNSUPPORTED where the driver
 * lacks the call (before CUDA 11.0). Thread-safe. */
MOEJIT_API moejit_status moejit_ctx_reset_persisting_l2(moejit_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* Device memory and pinned host memory                                     */
/* ------------------------------------------------------------------------ */

/* Allocates `bytes` (> 0) of device memory, 256-byte aligned, ordered on
 * `stream` (cuMemAllocAsync from the device's default pool) where the device
 * supports memory pools, else with cuMemAlloc (which may synchronize the
 * device). The memory may be used by work on `stream` at once, and by other
 * streams once they are ordered after it. Release with moejit_mem_free on
 * the same ctx. OUT_OF_MEMORY if the device has not enough free memory. */
MOEJIT_API moejit_status moejit_mem_alloc(moejit_ctx *ctx, size_t bytes, moejit_stream stream,
                                          void **dptr);

/* Frees memory from moejit_mem_alloc, ordered on `stream` (work queued
 * earlier on `stream` may still use it; work on other streams must be
 * ordered before this call). Falls back to cuMemFree, which synchronizes,
 * where pools are unsupported. dptr NULL is INVALID_ARGUMENT. Memory not
 * allocated by moejit_mem_alloc must not be passed. */
MOEJIT_API moejit_status moejit_mem_free(moejit_ctx *ctx, void *dptr, moejit_stream stream);

/* Copies `bytes` host → device on `stream`. `src` may be pageable (the call
 * then returns once `src` has been staged and may be reused) or pinned
 * (moejit_host_alloc: `src` must stay unchanged until the stream reaches
 * the copy). bytes 0 is a no-op; NULL pointers are INVALID_ARGUMENT; a
 * `dst` that is not device memory is INVALID_ARGUMENT. */
MOEJIT_API moejit_status moejit_memcpy_htod(moejit_ctx *ctx, void *dst, const void *src,
                                            size_t bytes, moejit_stream stream);

/* Copies `bytes` device → host on `stream`. Read `dst` only after
 * synchronizing the stream (for a pageable `dst` the driver completes the
 * copy before returning, for pinned memory it does not). */
MOEJIT_API moejit_status moejit_memcpy_dtoh(moejit_ctx *ctx, void *dst, const void *src,
                                            size_t bytes, moejit_stream stream);

/* Copies `bytes` device → device on `stream`. */
MOEJIT_API moejit_status moejit_memcpy_dtod(moejit_ctx *ctx, void *dst, const void *src,
                                            size_t bytes, moejit_stream stream);

/* Sets `count` 32-bit words at `dst` (4-byte aligned) to `value`, on
 * `stream`. count 0 is a no-op. */
MOEJIT_API moejit_status moejit_memset_d32(moejit_ctx *ctx, void *dst, uint32_t value, size_t count,
                                           moejit_stream stream);

/* Allocates `bytes` (> 0) of page-locked host memory (portable: usable with
 * every context) for fast, truly asynchronous copies. Release with
 * moejit_host_free. Synchronous; slow (milliseconds): allocate once. */
MOEJIT_API moejit_status moejit_host_alloc(moejit_ctx *ctx, size_t bytes, void **host);
/* Frees moejit_host_alloc memory. NULL is a no-op returning MOEJIT_OK.
 * The GPU must be done with it (synchronize first). */
MOEJIT_API moejit_status moejit_host_free(moejit_ctx *ctx, void *host);

/* Free and total device memory in bytes (cuMemGetInfo), as the driver sees
 * them now for the whole device. Either pointer may be NULL. */
MOEJIT_API moejit_status moejit_mem_get_info(moejit_ctx *ctx, size_t *free_bytes,
                                             size_t *total_bytes);

/* ------------------------------------------------------------------------ */
/* Streams and events (thin wrappers; CUstream / CUevent interchangeable)   */
/* ------------------------------------------------------------------------ */

/* Creates a stream that does not synchronize with the legacy default stream
 * (CU_STREAM_NON_BLOCKING). Owned by the caller: moejit_stream_destroy. */
MOEJIT_API moejit_status moejit_stream_create(moejit_ctx *ctx, moejit_stream *stream);
/* Destroys a stream; work already queued still completes. NULL: no-op. */
MOEJIT_API moejit_status moejit_stream_destroy(moejit_ctx *ctx, moejit_stream stream);
/* Blocks until all work queued on `stream` (NULL: the default stream) is
 * done; returns the error of any failed asynchronous work. */
MOEJIT_API moejit_status moejit_stream_synchronize(moejit_ctx *ctx, moejit_stream stream);

/* Creates an event with timing enabled. Owned by the caller. */
MOEJIT_API moejit_status moejit_event_create(moejit_ctx *ctx, moejit_event *event);
/* Records `event` on `stream` (captures the work queued so far). */
MOEJIT_API moejit_status moejit_event_record(moejit_ctx *ctx, moejit_event event,
                                             moejit_stream stream);
/* Blocks until the work captured by the last record of `event` is done. */
MOEJIT_API moejit_status moejit_event_synchronize(moejit_ctx *ctx, moejit_event event);
/* Milliseconds between two completed, recorded events (resolution about
 * 0.5 µs). CUDA_ERROR_NOT_READY (as MOEJIT_ERR_CUDA) if either has not
 * completed: synchronize `end` first. */
MOEJIT_API moejit_status moejit_event_elapsed_ms(moejit_ctx *ctx, moejit_event start,
                                                 moejit_event end, float *ms);
/* Destroys an event. NULL: no-op. */
MOEJIT_API moejit_status moejit_event_destroy(moejit_ctx *ctx, moejit_event event);

/* ------------------------------------------------------------------------ */
/* Kernels: generic launch of one generated entry point                     */
/* ------------------------------------------------------------------------ */
/* For advanced users and tests; the MoE ops build their launches on the
 * same machinery. */

typedef struct moejit_kernel moejit_kernel;

/* Generates, compiles (or finds in the disk cache) and loads the kernel
 * family `family` of `spec` for the ctx's device arch, and returns the
 * extern "C" entry `entry` (NULL: the family's first entry). The module of
 * a given cache key is loaded once per ctx (later calls with an equal spec
 * are a memo lookup; templates are read once per ctx).
 *
 * *out is borrowed: owned by the ctx, valid until moejit_ctx_destroy, and
 * may be used from several threads. NOT_FOUND for an unknown family or
 * entry; COMPILE with NVRTC's log; CONFIG for an invalid spec. Thread-safe;
 * may take seconds the first time (NVRTC). */
MOEJIT_API moejit_status moejit_ctx_get_kernel(moejit_ctx *ctx, const moejit_spec *spec,
                                               const char *family, const char *entry,
                                               moejit_kernel **out);

typedef struct moejit_kernel_info {
  char family[MOEJIT_NAME_MAX];
  char entry[96];
  char arch[MOEJIT_ARCH_MAX];
  char key[33];               /* cache key of its module */
  int max_threads_per_block;  /* for this kernel (registers may limit it) */
  int static_smem_bytes;      /* __shared__ arrays */
  int max_dynamic_smem_bytes; /* the most smem_bytes a launch may ask */
  int num_regs;               /* registers per thread */
  int num_params;             /* kernel parameters; -1 if the driver
                                 cannot say (before CUDA 12.4) */
} moejit_kernel_info;

/* Describes a kernel handle. Thread-safe. */
MOEJIT_API moejit_status moejit_kernel_get_info(const moejit_kernel *kernel,
                                                moejit_kernel_info *info);

/* Launches `kernel` on `stream` with grid[3] blocks of block[3] threads and
 * smem_bytes of dynamic shared memory; args[i] points at the value of the
 * i-th kernel parameter (as cuLaunchKernel's kernelParams).
 *
 * Checked before anything is launched (INVALID_ARGUMENT, message with the
 * limit and the value): every grid and block dimension > 0 and within the
 * device's limits, threads per block <= the kernel's limit, smem_bytes <=
 * the opt-in maximum less the kernel's static shared memory, args non-NULL
 * (and each args[i] for kernels whose parameter count the driver reports).
 * Above 48 KiB the kernel's dynamic shared-memory limit is raised first.
 * Never synchronizes the host; may be captured in a CUDA graph.
 * A launch failure found later (a fault) is reported by the next
 * synchronizing call. Thread-safe. */
MOEJIT_API moejit_status moejit_kernel_launch(moejit_ctx *ctx, moejit_kernel *kernel,
                                              const unsigned grid[3], const unsigned block[3],
                                              unsigned smem_bytes, moejit_stream stream,
                                              void **args);

#ifdef __cplusplus
}
#endif

#endif
