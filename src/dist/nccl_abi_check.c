/* Built only when CMake finds nccl.h (MOEJIT_NCCL_INCLUDE_DIR): compares
 * the declarations in nccl.h (src/dist/) with NCCL's own at compile time,
 * so a build against a changed NCCL fails here instead of misbehaving.
 * Nothing here refers to an NCCL symbol (sizeof and __typeof__ do not
 * evaluate their operands): the library never links against NCCL, which it
 * dlopens. */
#include <nccl.h>
#include <stddef.h>

#include "dist/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == sizeof(mj_nccl_unique_id), "ncclUniqueId size");
_Static_assert(NCCL_UNIQUE_ID_BYTES == MJ_NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
_Static_assert(sizeof(ncclComm_t) == sizeof(mj_nccl_comm), "ncclComm_t is a pointer");
_Static_assert(sizeof(ncclResult_t) == sizeof(mj_nccl_result), "ncclResult_t size");
_Static_assert(sizeof(ncclDataType_t) == sizeof(mj_nccl_dtype), "ncclDataType_t size");
_Static_assert(sizeof(cudaStream_t) == sizeof(mj_nccl_stream), "cudaStream_t is a pointer");
_Static_assert((int)ncclSuccess == MJ_NCCL_SUCCESS, "ncclSuccess");
_Static_assert((int)ncclUnhandledCudaError == MJ_NCCL_UNHANDLED_CUDA_ERROR,
               "ncclUnhandledCudaError");
_Static_assert((int)ncclSystemError == MJ_NCCL_SYSTEM_ERROR, "ncclSystemError");
_Static_assert((int)ncclInternalError == MJ_NCCL_INTERNAL_ERROR, "ncclInternalError");
_Static_assert((int)ncclInvalidArgument == MJ_NCCL_INVALID_ARGUMENT, "ncclInvalidArgument");
_Static_assert((int)ncclInvalidUsage == MJ_NCCL_INVALID_USAGE, "ncclInvalidUsage");
_Static_assert((int)ncclInProgress == MJ_NCCL_IN_PROGRESS, "ncclInProgress");
_Static_assert((int)ncclInt8 == MJ_NCCL_INT8, "ncclInt8");
_Static_assert((int)ncclUint8 == MJ_NCCL_UINT8, "ncclUint8");
_Static_assert((int)ncclInt32 == MJ_NCCL_INT32, "ncclInt32");
_Static_assert((int)ncclFloat32 == MJ_NCCL_FLOAT32, "ncclFloat32");
_Static_assert(NCCL_VERSION(2, 9, 0) == MJ_NCCL_MIN_VERSION, "NCCL's version code");
_Static_assert(NCCL_VERSION(2, 14, 0) == MJ_NCCL_NONBLOCKING_VERSION, "NCCL 2.14's code");

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
/* mj_nccl_config is the head of ncclConfig_t, field by field */
#define MJ_SAME_FIELD(theirs, ours)                                                              \
  _Static_assert(offsetof(ncclConfig_t, theirs) == offsetof(mj_nccl_config, ours) &&             \
                     sizeof(((ncclConfig_t *)0)->theirs) == sizeof(((mj_nccl_config *)0)->ours), \
                 "ncclConfig_t." #theirs)
MJ_SAME_FIELD(size, size);
MJ_SAME_FIELD(magic, magic);
MJ_SAME_FIELD(version, version);
MJ_SAME_FIELD(blocking, blocking);
MJ_SAME_FIELD(cgaClusterSize, cga_cluster_size);
MJ_SAME_FIELD(minCTAs, min_ctas);
MJ_SAME_FIELD(maxCTAs, max_ctas);
MJ_SAME_FIELD(netName, net_name);
_Static_assert(sizeof(mj_nccl_config) <= sizeof(ncclConfig_t), "ncclConfig_t is larger");
_Static_assert(NCCL_CONFIG_UNDEF_INT == MJ_NCCL_CONFIG_UNDEF_INT, "NCCL_CONFIG_UNDEF_INT");
#endif

/* Each entry of the mj_nccl table, written with NCCL's types, against the
 * prototype nccl.h gives it (the table's own types are the same with the
 * mj_ names checked above). */
#define MJ_SAME_PROTOTYPE(fn, type) \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn "'s prototype")

MJ_SAME_PROTOTYPE(ncclGetVersion, ncclResult_t (*)(int *));
MJ_SAME_PROTOTYPE(ncclGetUniqueId, ncclResult_t (*)(ncclUniqueId *));
MJ_SAME_PROTOTYPE(ncclCommInitRank, ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
MJ_SAME_PROTOTYPE(ncclCommInitRankConfig,
                  ncclResult_t (*)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *));
MJ_SAME_PROTOTYPE(ncclCommFinalize, ncclResult_t (*)(ncclComm_t));
#endif
MJ_SAME_PROTOTYPE(ncclCommDestroy, ncclResult_t (*)(ncclComm_t));
MJ_SAME_PROTOTYPE(ncclCommAbort, ncclResult_t (*)(ncclComm_t));
MJ_SAME_PROTOTYPE(ncclCommCount, ncclResult_t (*)(const ncclComm_t, int *));
MJ_SAME_PROTOTYPE(ncclCommUserRank, ncclResult_t (*)(const ncclComm_t, int *));
MJ_SAME_PROTOTYPE(ncclCommCuDevice, ncclResult_t (*)(const ncclComm_t, int *));
MJ_SAME_PROTOTYPE(ncclCommGetAsyncError, ncclResult_t (*)(ncclComm_t, ncclResult_t *));
MJ_SAME_PROTOTYPE(ncclGetErrorString, const char *(*)(ncclResult_t));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
MJ_SAME_PROTOTYPE(ncclGetLastError, const char *(*)(ncclComm_t));
#endif
MJ_SAME_PROTOTYPE(ncclGroupStart, ncclResult_t (*)(void));
MJ_SAME_PROTOTYPE(ncclGroupEnd, ncclResult_t (*)(void));
MJ_SAME_PROTOTYPE(ncclSend, ncclResult_t (*)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
                                             cudaStream_t));
MJ_SAME_PROTOTYPE(ncclRecv,
                  ncclResult_t (*)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));

int mj_nccl_abi_checked(void) {
  return NCCL_MAJOR * 10000 + NCCL_MINOR * 100;
}
