/* Driver and device queries that need no context: driver version, device
 * count, and each device's name, compute capability, limits and arch. */
#include <string.h>

#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

moejit_status moejit_driver_version(int *version) {
  if (!version)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_driver_version: version is NULL");
  *version = 0;
  const mj_driver *d;
  moejit_status st = mj_driver_get(&d);
  if (st != MOEJIT_OK) return st;
  *version = d->version;
  return MOEJIT_OK;
}

moejit_status moejit_device_count(int *n) {
  if (!n) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_device_count: n is NULL");
  *n = 0;
  const mj_driver *d;
  moejit_status st = mj_driver_init(&d);
  if (st == MOEJIT_ERR_NO_DEVICE) return MOEJIT_OK; /* a valid answer: zero */
  if (st != MOEJIT_OK) return st;
  return mj_cu_check(d->DeviceGetCount(n), "cuDeviceGetCount");
}

/* One attribute; on failure the message names it. */
static moejit_status device_attr(const mj_driver *d, CUdevice dev, CUdevice_attribute attr,
                                 const char *name, int *out) {
  CUresult r = d->DeviceGetAttribute(out, attr, dev);
  if (r == CUDA_SUCCESS) return MOEJIT_OK;
  return mj_fail_prefix(mj_cu_check(r, "cuDeviceGetAttribute"), "device attribute %s", name);
}

#define ATTR(attr, field)                                                              \
  do {                                                                                 \
    moejit_status st_ = device_attr(d, dev, CU_DEVICE_ATTRIBUTE_##attr, #attr, field); \
    if (st_ != MOEJIT_OK) return st_;                                                  \
  } while (0)

moejit_status mj_device_read(const mj_driver *d, CUdevice dev, int ordinal,
                             moejit_device_info *info, mj_device_limits *limits) {
  memset(info, 0, sizeof *info);
  memset(limits, 0, sizeof *limits);
  info->ordinal = ordinal;
  moejit_status st =
      mj_cu_check(d->DeviceGetName(info->name, (int)sizeof info->name, dev), "cuDeviceGetName");
  if (st != MOEJIT_OK) return st;
  info->name[sizeof info->name - 1] = '\0';
  st = mj_cu_check(d->DeviceTotalMem(&info->total_mem, dev), "cuDeviceTotalMem");
  if (st != MOEJIT_OK) return st;
  ATTR(COMPUTE_CAPABILITY_MAJOR, &info->cc_major);
  ATTR(COMPUTE_CAPABILITY_MINOR, &info->cc_minor);
  ATTR(MULTIPROCESSOR_COUNT, &info->sm_count);
  ATTR(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &info->smem_per_block_optin);
  ATTR(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &info->smem_per_sm);
  ATTR(L2_CACHE_SIZE, &info->l2_bytes);
  ATTR(MAX_THREADS_PER_BLOCK, &info->max_threads_per_block);
  int pools = 0, cluster = 0, dims[6];
  /* Older drivers may not know these two: treat as "no". */
  if (d->DeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev) !=
      CUDA_SUCCESS)
    pools = 0;
  if (d->DeviceGetAttribute(&cluster, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, dev) != CUDA_SUCCESS)
    cluster = 0;
  info->memory_pools = pools && d->MemAllocAsync && d->MemFreeAsync;
  ATTR(MAX_GRID_DIM_X, &dims[0]);
  ATTR(MAX_GRID_DIM_Y, &dims[1]);
  ATTR(MAX_GRID_DIM_Z, &dims[2]);
  ATTR(MAX_BLOCK_DIM_X, &dims[3]);
  ATTR(MAX_BLOCK_DIM_Y, &dims[4]);
  ATTR(MAX_BLOCK_DIM_Z, &dims[5]);
  mj_arch_for_cc(info->cc_major, info->cc_minor, info->arch);

  limits->cc_major = info->cc_major;
  limits->cc_minor = info->cc_minor;
  limits->sm_count = info->sm_count;
  limits->max_threads_per_block = info->max_threads_per_block;
  limits->smem_per_block_optin = info->smem_per_block_optin;
  for (int i = 0; i < 3; i++) {
    limits->max_grid[i] = (unsigned)dims[i];
    limits->max_block[i] = (unsigned)dims[3 + i];
  }
  limits->cluster_launch = cluster && d->LaunchKernelEx;
  return MOEJIT_OK;
}

moejit_status mj_device_open(int ordinal, const mj_driver **d, CUdevice *dev, int *resolved) {
  moejit_status st = mj_driver_init(d);
  if (st != MOEJIT_OK) return st;
  int n = 0;
  st = mj_cu_check((*d)->DeviceGetCount(&n), "cuDeviceGetCount");
  if (st != MOEJIT_OK) return st;
  if (n == 0)
    return mj_fail(MOEJIT_ERR_NO_DEVICE,
                   "no CUDA device found (the driver reports 0 devices); HINT: check nvidia-smi "
                   "and CUDA_VISIBLE_DEVICES; " MJ_NO_GPU_HINT);
  if (ordinal < 0) ordinal = 0;
  if (ordinal >= n)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "device %d does not exist: %d device%s visible (ordinals 0..%d); HINT: check "
                   "CUDA_VISIBLE_DEVICES",
                   ordinal, n, n == 1 ? " is" : "s are", n - 1);
  *resolved = ordinal;
  return mj_cu_check((*d)->DeviceGet(dev, ordinal), "cuDeviceGet");
}

moejit_status moejit_device_query(int ordinal, moejit_device_info *info) {
  if (!info) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_device_query: info is NULL");
  if (ordinal < 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_device_query: ordinal %d < 0", ordinal);
  const mj_driver *d;
  CUdevice dev;
  int resolved;
  moejit_status st = mj_device_open(ordinal, &d, &dev, &resolved);
  if (st != MOEJIT_OK) return st;
  mj_device_limits limits;
  return mj_device_read(d, dev, resolved, info, &limits);
}
