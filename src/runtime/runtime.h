/* Internal face of the GPU runtime: the dlopen'ed CUDA driver table and
 * what ops need from a context (kernel lookup, launch, device limits).
 * The public calls live in include/moejit/runtime.h. */
#ifndef MOEJIT_RUNTIME_H
#define MOEJIT_RUNTIME_H

#include <cuda.h> /* types and enums only: libcuda is never linked */
#include <cudaTypedefs.h>

#include "moejit/moejit.h"

/* Turns a CUresult into a moejit status with a message
 * "<what>: CUDA_ERROR_X (description)"; CUDA_SUCCESS returns MOEJIT_OK. */
moejit_status mj_cu_check(CUresult r, const char *what);

/* The device limits ops check launches against. */
typedef struct mj_device_limits {
  int cc_major, cc_minor, sm_count;
  int max_threads_per_block;
  int smem_per_block_optin; /* bytes, the most a block can ask for */
  unsigned max_grid[3];     /* grid dimension limits */
  unsigned max_block[3];    /* block dimension limits */
  int cluster_launch;       /* 1: thread-block clusters supported */
} mj_device_limits;
moejit_status mj_ctx_limits(moejit_ctx *ctx, mj_device_limits *out);

/* The arch every kernel of this ctx is compiled for ("sm_90a"). */
const char *mj_ctx_arch(const moejit_ctx *ctx);
/* The device's multiprocessor count (1 when unknown). */
int mj_ctx_sm_count(const moejit_ctx *ctx);
/* The most shared memory a block may opt in to (0 when unknown: no ctx). */
int mj_ctx_smem_optin(const moejit_ctx *ctx);
/* The device's L2 cache bytes (0 when unknown). */
int mj_ctx_l2_bytes(const moejit_ctx *ctx);
/* moejit_kernel_launch with every block resident at once (cuLaunchKernelEx,
 * CU_LAUNCH_ATTRIBUTE_COOPERATIVE), for kernels whose blocks wait for each
 * other. *launched = 1 when enqueued; 0 with MOEJIT_OK when the driver has
 * no cuLaunchKernelEx or the device cannot hold the grid at once
 * (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE): nothing was enqueued, and the
 * caller launches the kernel another way. Other failures as
 * moejit_kernel_launch. */
moejit_status mj_kernel_launch_cooperative(moejit_ctx *ctx, moejit_kernel *kernel,
                                           const unsigned grid[3], const unsigned block[3],
                                           unsigned smem_bytes, moejit_stream stream, void **args,
                                           int *launched);

/* How many clusters of cluster_x CTAs of `kernel` (block, smem dynamic
 * shared bytes) can be resident on the device at once, from
 * cuOccupancyMaxActiveClusters, cached per kernel; 0 when unknown (old
 * driver, query failed). Persistent kernels size their grid by it: a
 * cluster that cannot start until another finishes doubles the time. */
int mj_kernel_active_clusters(moejit_ctx *ctx, moejit_kernel *kernel, const unsigned block[3],
                              unsigned smem, unsigned cluster_x);

/* Generates, compiles (or loads from cache) and loads the module of
 * `family` for `spec` on this context's arch, then returns the entry's
 * function. Memoized by cache key: the module loads once per context.
 * Thread-safe. */
moejit_status mj_ctx_get_function(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                  const char *entry, CUfunction *out);
/* The same, building on a miss the module of only the entries in `only`
 * (which must hold `entry`; NULL or empty: every entry). The memo is keyed
 * by (spec, family, entry) alike, so a later mj_ctx_get_function of that
 * entry finds this function. */
struct mj_entry_set;
moejit_status mj_ctx_get_function_from(moejit_ctx *ctx, const moejit_spec *spec, const char *family,
                                       const struct mj_entry_set *only, const char *entry,
                                       CUfunction *out);

/* cuLaunchKernel through the driver table, raising the dynamic shared-
 * memory limit of `fn` first when smem_bytes > 48 KiB. Makes the context
 * current on the calling thread (pushed and popped around the launch).
 * Checks grid/block/smem against the device limits first (INVALID_ARGUMENT,
 * nothing launched). Never synchronizes. */
moejit_status mj_ctx_launch(moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                            const unsigned block[3], unsigned smem_bytes, moejit_stream stream,
                            void **args);

/* Same with a thread-block cluster of cluster[3] blocks (cuLaunchKernelEx);
 * cluster {1,1,1} or NULL is a plain launch. UNSUPPORTED where the driver or
 * device has no cluster launch; INVALID_ARGUMENT if grid is not a multiple
 * of the cluster. */
moejit_status mj_ctx_launch_cluster(moejit_ctx *ctx, CUfunction fn, const unsigned grid[3],
                                    const unsigned block[3], const unsigned cluster[3],
                                    unsigned smem_bytes, moejit_stream stream, void **args);

/* 1 when `stream` is being captured into a CUDA graph (0 when the driver
 * cannot say). */
int mj_ctx_stream_capturing(moejit_ctx *ctx, moejit_stream stream);

/* cuEventRecord, or, while `stream` is being captured, an event-record
 * node of the graph (CU_EVENT_RECORD_EXTERNAL), so that each replay
 * records the event where a plain record would only mark a dependency. */
moejit_status mj_ctx_record_event(moejit_ctx *ctx, moejit_event event, moejit_stream stream);

/* The ctx's driver table (for the few callers outside src/runtime that
 * need a raw driver call, e.g. cuStreamSynchronize around NCCL). */
const struct mj_driver *mj_ctx_driver(const moejit_ctx *ctx);
/* The ctx's device: for a thread that must make its primary context
 * current without holding on to the ctx (which may go first), retaining
 * the context itself (cuDevicePrimaryCtxRetain). */
CUdevice mj_ctx_device(const moejit_ctx *ctx);

/* Records the calling thread's last error message (moejit_last_error())
 * as the context's last error too (ops call this on failure paths they
 * report). ctx NULL is a no-op. */
void mj_ctx_note_error(moejit_ctx *ctx);

/* mj_ctx_note_error(ctx), then returns `status`: `return mj_ctx_fail(ctx, st)`. */
moejit_status mj_ctx_fail(moejit_ctx *ctx, moejit_status status);

/* How many times this ctx called cuModuleLoadData (tests: a module loads
 * once however many launches use it). */
unsigned long mj_ctx_module_loads(moejit_ctx *ctx);

/* Makes the ctx's CUDA context current on this thread (cuCtxPushCurrent);
 * pair with mj_ctx_leave. For ops that call the driver table directly. */
moejit_status mj_ctx_enter(moejit_ctx *ctx);
void mj_ctx_leave(moejit_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* The driver table                                                         */
/* ------------------------------------------------------------------------ */
/* Member names drop the "cu" prefix on purpose: cuda.h #defines many cu*
 * names to versioned symbols (cuMemAlloc -> cuMemAlloc_v2), which would
 * silently rename struct members. Each pointer type is the exact ABI of the
 * version we request from cuGetProcAddress. */
typedef struct mj_driver {
  int version; /* cuDriverGetVersion, e.g. 13000 */

  PFN_cuInit_v2000 Init;
  PFN_cuDriverGetVersion_v2020 DriverGetVersion;
  PFN_cuGetErrorName_v6000 GetErrorName;
  PFN_cuGetErrorString_v6000 GetErrorString;

  PFN_cuDeviceGetCount_v2000 DeviceGetCount;
  PFN_cuDeviceGet_v2000 DeviceGet;
  PFN_cuDeviceGetName_v2000 DeviceGetName;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
  PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
  PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
  PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;

  PFN_cuCtxPushCurrent_v4000 CtxPushCurrent;
  PFN_cuCtxPopCurrent_v4000 CtxPopCurrent;
  PFN_cuCtxSynchronize_v2000 CtxSynchronize;

  PFN_cuModuleLoadData_v2000 ModuleLoadData;
  PFN_cuModuleUnload_v2000 ModuleUnload;
  PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
  PFN_cuFuncGetAttribute_v2020 FuncGetAttribute;
  PFN_cuFuncSetAttribute_v9000 FuncSetAttribute;
  PFN_cuLaunchKernel_v4000 LaunchKernel;

  PFN_cuMemAlloc_v3020 MemAlloc;
  PFN_cuMemFree_v3020 MemFree;
  PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
  PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
  PFN_cuMemcpyDtoDAsync_v3020 MemcpyDtoDAsync;
  PFN_cuMemsetD8Async_v3020 MemsetD8Async;
  PFN_cuMemsetD32Async_v3020 MemsetD32Async;
  PFN_cuMemHostAlloc_v2020 MemHostAlloc;
  PFN_cuMemFreeHost_v2000 MemFreeHost;
  PFN_cuMemGetInfo_v3020 MemGetInfo;
  PFN_cuPointerGetAttribute_v4000 PointerGetAttribute;

  PFN_cuStreamCreate_v2000 StreamCreate;
  PFN_cuStreamDestroy_v4000 StreamDestroy;
  PFN_cuStreamSynchronize_v2000 StreamSynchronize;
  PFN_cuStreamQuery_v2000 StreamQuery;
  PFN_cuEventCreate_v2000 EventCreate;
  PFN_cuEventRecord_v2000 EventRecord;
  PFN_cuEventSynchronize_v2000 EventSynchronize;
  PFN_cuEventElapsedTime_v2000 EventElapsedTime;
  PFN_cuEventDestroy_v4000 EventDestroy;

  /* Optional (NULL when the driver is too old): */
  PFN_cuMemAllocAsync_v11020 MemAllocAsync;
  PFN_cuMemFreeAsync_v11020 MemFreeAsync;
  PFN_cuDeviceGetDefaultMemPool_v11020 DeviceGetDefaultMemPool;
  PFN_cuMemPoolTrimTo_v11020 MemPoolTrimTo;
  PFN_cuLaunchKernelEx_v11060 LaunchKernelEx;
  PFN_cuFuncGetParamInfo_v12040 FuncGetParamInfo;
  PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncodeTiled; /* TMA descriptors (gemm wgmma path) */
  PFN_cuOccupancyMaxActiveClusters_v11070 OccupancyMaxActiveClusters; /* persistent clusters */
  PFN_cuStreamIsCapturing_v10000 StreamIsCapturing; /* expert parallelism's exact mode */
  PFN_cuEventRecordWithFlags_v11010 EventRecordWithFlags; /* events inside a capture */
  PFN_cuCtxResetPersistingL2Cache_v11000 CtxResetPersistingL2Cache; /* benchmarks' L2 flush */
} mj_driver;

/* Loads libcuda and resolves the table, once per process (thread-safe).
 * NO_DRIVER with "no CUDA driver found (...); HINT: ..." when absent or
 * missing a required entry point; the same result on every later call. */
moejit_status mj_driver_get(const mj_driver **out);
/* The dlopen handle of the driver mj_driver_get loaded (NULL if it did
 * not load): later lookups use it rather than reading the environment
 * again, which may have changed since. */
void *mj_driver_lib(void);

/* mj_driver_get, then cuInit(0) once. NO_DEVICE when the driver reports no
 * device, NO_DRIVER when cuInit fails otherwise; messages carry the hint
 * that compile-only use still works. */
moejit_status mj_driver_init(const mj_driver **out);

/* The hint appended to NO_DRIVER / NO_DEVICE messages. */
#define MJ_NO_GPU_HINT \
  "compile-only use (moejit compile, moejit_compiler) still works without a GPU"

/* The arch moejit targets on a device of compute capability major.minor:
 * "sm_90a" on 9.0, "sm_100a" on 10.0, else "sm_XY". */
void mj_arch_for_cc(int major, int minor, char out[MOEJIT_ARCH_MAX]);

#endif
