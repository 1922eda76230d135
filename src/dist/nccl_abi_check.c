/* Built only when CMake finds nccl.h (MOEJIT_NCCL_INCLUDE_DIR): compares
 * the declarations in nccl.h (src/dist/) with NCCL's own at compile time,
 * so a build against a changed NCCL fails here instead of misbehaving. */
#include <nccl.h>
#include <stddef.h>

#include "dist/nccl.h"

_Static_assert(sizeof(ncclUniqueId) == sizeof(mj_nccl_unique_id), "ncclUniqueId size");
_Static_assert(NCCL_UNIQUE_ID_BYTES == MJ_NCCL_UNIQUE_ID_BYTES, "NCCL_UNIQUE_ID_BYTES");
_Static_assert(sizeof(ncclComm_t) == sizeof(mj_nccl_comm), "ncclComm_t is a pointer");
_Static_assert((int)ncclSuccess == MJ_NCCL_SUCCESS, "ncclSuccess");
_Static_assert((int)ncclInvalidArgument == MJ_NCCL_INVALID_ARGUMENT, "ncclInvalidArgument");
_Static_assert((int)ncclInvalidUsage == MJ_NCCL_INVALID_USAGE, "ncclInvalidUsage");
_Static_assert((int)ncclInProgress == MJ_NCCL_IN_PROGRESS, "ncclInProgress");
_Static_assert((int)ncclInt8 == MJ_NCCL_INT8, "ncclInt8");
_Static_assert((int)ncclUint8 == MJ_NCCL_UINT8, "ncclUint8");
_Static_assert((int)ncclInt32 == MJ_NCCL_INT32, "ncclInt32");
_Static_assert((int)ncclFloat32 == MJ_NCCL_FLOAT32, "ncclFloat32");

/* The table's pointer types against NCCL's prototypes. */
static void check_prototypes(mj_nccl *t) {
  ncclResult_t (*send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) =
      ncclSend;
  ncclResult_t (*recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = ncclRecv;
  ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int) = ncclCommInitRank;
  (void)send, (void)recv, (void)init, (void)t;
}

int mj_nccl_abi_checked(void) {
  (void)check_prototypes;
  return NCCL_MAJOR * 10000 + NCCL_MINOR * 100;
}
