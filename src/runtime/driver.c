/* Loads the CUDA driver (libcuda.so.1) with dlopen, once per process, and
 * resolves every entry point moejit uses; turns CUresults into messages. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "runtime/runtime.h"

/* We ask cuGetProcAddress for the 12.0 ABI of each symbol: it matches the
 * PFN types in mj_driver (cuCtxSynchronize gained a CUcontext argument in
 * 13.0; asking for CUDA_VERSION would hand us that variant). */
#define MJ_DRIVER_ABI_VERSION 12000

typedef struct driver_symbol {
  const char *name;      /* base name for cuGetProcAddress */
  const char *versioned; /* exported name with the same ABI, for dlsym */
  int version;           /* CUDA version to request */
  size_t offset;         /* where in mj_driver the pointer goes */
  int optional;
} driver_symbol;

#define SYM(member, base, exported) \
  { base, exported, MJ_DRIVER_ABI_VERSION, offsetof(mj_driver, member), 0 }
#define OPT(member, base, exported, ver) \
  { base, exported, ver, offsetof(mj_driver, member), 1 }

static const driver_symbol driver_symbols[] = {
    SYM(Init, "cuInit", "cuInit"),
    SYM(DriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion"),
    SYM(GetErrorName, "cuGetErrorName", "cuGetErrorName"),
    SYM(GetErrorString, "cuGetErrorString", "cuGetErrorString"),
    SYM(DeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet", "cuDeviceGet"),
    SYM(DeviceGetName, "cuDeviceGetName", "cuDeviceGetName"),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute"),
    SYM(DeviceTotalMem, "cuDeviceTotalMem", "cuDeviceTotalMem_v2"),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain"),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"),
    SYM(CtxPushCurrent, "cuCtxPushCurrent", "cuCtxPushCurrent_v2"),
    SYM(CtxPopCurrent, "cuCtxPopCurrent", "cuCtxPopCurrent_v2"),
    SYM(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize"),
    SYM(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload", "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction"),
    SYM(FuncGetAttribute, "cuFuncGetAttribute", "cuFuncGetAttribute"),
    SYM(FuncSetAttribute, "cuFuncSetAttribute", "cuFuncSetAttribute"),
    SYM(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel"),
    SYM(MemAlloc, "cuMemAlloc", "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree", "cuMemFree_v2"),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2"),
    SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2"),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2"),
    SYM(MemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async"),
    SYM(MemsetD32Async, "cuMemsetD32Async", "cuMemsetD32Async"),
    SYM(MemHostAlloc, "cuMemHostAlloc", "cuMemHostAlloc"),
    SYM(MemFreeHost, "cuMemFreeHost", "cuMemFreeHost"),
    SYM(MemGetInfo, "cuMemGetInfo", "cuMemGetInfo_v2"),
    SYM(PointerGetAttribute, "cuPointerGetAttribute", "cuPointerGetAttribute"),
    SYM(StreamCreate, "cuStreamCreate", "cuStreamCreate"),
    SYM(StreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2"),
    SYM(StreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize"),
    SYM(StreamQuery, "cuStreamQuery", "cuStreamQuery"),
    SYM(EventCreate, "cuEventCreate", "cuEventCreate"),
    SYM(EventRecord, "cuEventRecord", "cuEventRecord"),
    SYM(EventSynchronize, "cuEventSynchronize", "cuEventSynchronize"),
    SYM(EventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime"),
    SYM(EventDestroy, "cuEventDestroy", "cuEventDestroy_v2"),
    OPT(MemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync", MJ_DRIVER_ABI_VERSION),
    OPT(MemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync", MJ_DRIVER_ABI_VERSION),
    OPT(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool",
        MJ_DRIVER_ABI_VERSION),
    OPT(MemPoolTrimTo, "cuMemPoolTrimTo", "cuMemPoolTrimTo", MJ_DRIVER_ABI_VERSION),
    OPT(LaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx", MJ_DRIVER_ABI_VERSION),
    OPT(FuncGetParamInfo, "cuFuncGetParamInfo", "cuFuncGetParamInfo", 12040),
    OPT(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", "cuTensorMapEncodeTiled",
        MJ_DRIVER_ABI_VERSION),
    OPT(OccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters", "cuOccupancyMaxActiveClusters",
        MJ_DRIVER_ABI_VERSION),
    OPT(StreamIsCapturing, "cuStreamIsCapturing", "cuStreamIsCapturing", MJ_DRIVER_ABI_VERSION),
    OPT(EventRecordWithFlags, "cuEventRecordWithFlags", "cuEventRecordWithFlags",
        MJ_DRIVER_ABI_VERSION),
    OPT(CtxResetPersistingL2Cache, "cuCtxResetPersistingL2Cache", "cuCtxResetPersistingL2Cache",
        MJ_DRIVER_ABI_VERSION),
};

/* Outcome of the one-time load and init, replayed to every caller. */
static struct {
  pthread_once_t load_once, init_once;
  void *lib;
  int loaded; /* 1 once the table is complete */
  mj_driver table;
  moejit_status load_status, init_status;
  char load_message[1024], init_message[1024];
} drv = {.load_once = PTHREAD_ONCE_INIT, .init_once = PTHREAD_ONCE_INIT};

static const char *libcuda_path(void) {
  const char *env = getenv("MOEJIT_LIBCUDA_PATH");
  return env && *env ? env : "libcuda.so.1";
}

/* One symbol: cuGetProcAddress first (the driver's own way to hand out the
 * right ABI), then the exported versioned name. */
static void *resolve_symbol(PFN_cuGetProcAddress_v12000 get_proc, const driver_symbol *s) {
  void *fn = NULL;
  if (get_proc) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS) fn = NULL;
  }
  if (!fn) fn = dlsym(drv.lib, s->versioned);
  return fn;
}

static void set_load_failure(const char *why) {
  drv.load_status = MOEJIT_ERR_NO_DRIVER;
  snprintf(drv.load_message, sizeof drv.load_message,
           "no CUDA driver found (%.760s); HINT: install the NVIDIA driver or set "
           "MOEJIT_LIBCUDA_PATH; " MJ_NO_GPU_HINT,
           why);
}

static void load_driver(void) {
  const char *path = libcuda_path();
  drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    const char *err = dlerror();
    char why[900];
    /* glibc's message usually starts with the path already */
    if (err && strncmp(err, path, strlen(path)) == 0)
      snprintf(why, sizeof why, "%s", err);
    else
      snprintf(why, sizeof why, "%s: %s", path, err ? err : "dlopen failed");
    set_load_failure(why);
    return;
  }
  PFN_cuGetProcAddress_v12000 get_proc =
      (PFN_cuGetProcAddress_v12000)dlsym(drv.lib, "cuGetProcAddress_v2");
  for (size_t i = 0; i < MJ_ARRAY_LEN(driver_symbols); i++) {
    const driver_symbol *s = &driver_symbols[i];
    void *fn = resolve_symbol(get_proc, s);
    if (!fn && !s->optional) {
      char why[900];
      snprintf(why, sizeof why, "%s lacks %s: the driver is too old, need CUDA 12.0 or newer", path,
               s->name);
      set_load_failure(why);
      return; /* the library stays loaded: unloading a driver is not safe */
    }
    memcpy((char *)&drv.table + s->offset, &fn, sizeof fn);
  }
  /* Works before cuInit, so `moejit info` can name the driver even when
   * cuInit then finds no device. */
  if (drv.table.DriverGetVersion(&drv.table.version) != CUDA_SUCCESS) drv.table.version = 0;
  drv.load_status = MOEJIT_OK;
  drv.loaded = 1;
}

void *mj_driver_lib(void) {
  pthread_once(&drv.load_once, load_driver);
  return drv.load_status == MOEJIT_OK ? drv.lib : NULL;
}

moejit_status mj_driver_get(const mj_driver **out) {
  pthread_once(&drv.load_once, load_driver);
  if (drv.load_status != MOEJIT_OK) {
    *out = NULL;
    return mj_fail(drv.load_status, "%s", drv.load_message);
  }
  *out = &drv.table;
  return MOEJIT_OK;
}

static void init_driver(void) {
  const mj_driver *d;
  if (mj_driver_get(&d) != MOEJIT_OK) return; /* load_status speaks */
  CUresult r = d->Init(0);
  if (r == CUDA_SUCCESS) {
    drv.init_status = MOEJIT_OK;
    return;
  }
  const char *name = NULL, *desc = NULL;
  if (d->GetErrorName(r, &name) != CUDA_SUCCESS) name = "CUDA_ERROR_UNKNOWN";
  if (d->GetErrorString(r, &desc) != CUDA_SUCCESS) desc = "no description";
  if (r == CUDA_ERROR_NO_DEVICE) {
    drv.init_status = MOEJIT_ERR_NO_DEVICE;
    snprintf(drv.init_message, sizeof drv.init_message,
             "no CUDA device found (cuInit: %s (%s)); HINT: check nvidia-smi and "
             "CUDA_VISIBLE_DEVICES; " MJ_NO_GPU_HINT,
             name, desc);
  } else {
    drv.init_status = MOEJIT_ERR_NO_DRIVER;
    snprintf(drv.init_message, sizeof drv.init_message,
             "the CUDA driver is unusable (cuInit: %s (%s)); HINT: check the driver install "
             "(nvidia-smi) or set MOEJIT_LIBCUDA_PATH; " MJ_NO_GPU_HINT,
             name, desc);
  }
}

moejit_status mj_driver_init(const mj_driver **out) {
  moejit_status st = mj_driver_get(out);
  if (st != MOEJIT_OK) return st;
  pthread_once(&drv.init_once, init_driver);
  if (drv.init_status != MOEJIT_OK) {
    *out = NULL;
    return mj_fail(drv.init_status, "%s", drv.init_message);
  }
  return MOEJIT_OK;
}

/* A hint for errors where the next step is not obvious from the name. */
static const char *cu_hint(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "; HINT: free device memory (moejit_mem_get_info shows what is left) or use smaller "
             "sizes";
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
      return "; HINT: the cubin does not fit this GPU; check the arch, or clear the cache "
             "(moejit cache clear)";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
      return "; HINT: a kernel faulted and the CUDA context is now unusable; run under "
             "compute-sanitizer to find it";
    default:
      return "";
  }
}

static moejit_status cu_status(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return MOEJIT_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_NO_DEVICE:
      return MOEJIT_ERR_NO_DEVICE;
    case CUDA_ERROR_NOT_FOUND:
      return MOEJIT_ERR_NOT_FOUND;
    case CUDA_ERROR_NOT_SUPPORTED:
      return MOEJIT_ERR_UNSUPPORTED;
    default:
      return MOEJIT_ERR_CUDA;
  }
}

moejit_status mj_cu_check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return MOEJIT_OK;
  const char *name = NULL, *desc = NULL;
  /* The table is loaded whenever a CUresult exists; stay safe anyway. */
  if (drv.loaded) {
    if (drv.table.GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (drv.table.GetErrorString(r, &desc) != CUDA_SUCCESS) desc = NULL;
  }
  if (!name)
    return mj_fail(cu_status(r), "%s: CUDA error %d (unknown)%s", what, (int)r, cu_hint(r));
  return mj_fail(cu_status(r), "%s: %s (%s)%s", what, name, desc ? desc : "no description",
                 cu_hint(r));
}

void mj_arch_for_cc(int major, int minor, char out[MOEJIT_ARCH_MAX]) {
  /* 'a' archs unlock wgmma/TMA multicast (9.0) and tcgen05 (10.0); cubins
   * for them only run on exactly that compute capability, which is the
   * device we are on. */
  const char *suffix = ((major == 9 || major == 10) && minor == 0) ? "a" : "";
  snprintf(out, MOEJIT_ARCH_MAX, "sm_%d%d%s", major, minor, suffix);
}
