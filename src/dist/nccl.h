/* NCCL, loaded at run time. moejit declares the small, stable part of
 * NCCL's C ABI it calls (the types and enum values below are NCCL's own,
 * unchanged since 2.7) and dlopens libnccl.so.2 on first use, so the library
 * builds and starts without NCCL and only expert parallelism needs it.
 * When the build finds nccl.h, nccl_abi_check.c compares these declarations
 * with it at compile time. */
#ifndef MOEJIT_SRC_DIST_NCCL_H
#define MOEJIT_SRC_DIST_NCCL_H

#include <stddef.h>

#include "moejit/moejit.h"

typedef struct mj_nccl_comm_opaque *mj_nccl_comm; /* ncclComm_t */
typedef struct CUstream_st *mj_nccl_stream;       /* cudaStream_t == CUstream */

#define MJ_NCCL_UNIQUE_ID_BYTES 128
typedef struct mj_nccl_unique_id {
  char internal[MJ_NCCL_UNIQUE_ID_BYTES];
} mj_nccl_unique_id; /* ncclUniqueId */

typedef enum mj_nccl_result {
  MJ_NCCL_SUCCESS = 0,
  MJ_NCCL_UNHANDLED_CUDA_ERROR = 1,
  MJ_NCCL_SYSTEM_ERROR = 2,
  MJ_NCCL_INTERNAL_ERROR = 3,
  MJ_NCCL_INVALID_ARGUMENT = 4,
  MJ_NCCL_INVALID_USAGE = 5,
  MJ_NCCL_REMOTE_ERROR = 6,
  MJ_NCCL_IN_PROGRESS = 7
} mj_nccl_result; /* ncclResult_t */

typedef enum mj_nccl_dtype {
  MJ_NCCL_INT8 = 0,
  MJ_NCCL_UINT8 = 1,
  MJ_NCCL_INT32 = 2,
  MJ_NCCL_FLOAT32 = 7
} mj_nccl_dtype; /* ncclDataType_t (the members moejit sends) */

/* ncclGetVersion of NCCL 2.9.0 (NCCL_VERSION(2, 9, 0)) */
#define MJ_NCCL_MIN_VERSION 20900
/* NCCL 2.14: ncclCommInitRankConfig and ncclCommFinalize, communicators
 * that never block the host (ncclConfig_t.blocking = 0) */
#define MJ_NCCL_NONBLOCKING_VERSION 21400

/* ncclConfig_t as NCCL 2.14 laid it out. NCCL reads a config by its size
 * and version (newer fields take their defaults), so this prefix of the
 * current struct is understood by every release since. Fill it with
 * mj_nccl_config_nonblocking. */
typedef struct mj_nccl_config {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char *net_name;
} mj_nccl_config;
#define MJ_NCCL_CONFIG_MAGIC 0xcafebeefu
#define MJ_NCCL_CONFIG_UNDEF_INT (-2147483647 - 1) /* NCCL_CONFIG_UNDEF_INT: INT_MIN */

/* A config asking for a nonblocking communicator, NCCL's defaults
 * otherwise. */
void mj_nccl_config_nonblocking(mj_nccl_config *c);

typedef struct mj_nccl {
  int version; /* ncclGetVersion, e.g. 22803 for 2.28.3 */
  mj_nccl_result (*GetVersion)(int *version);
  mj_nccl_result (*GetUniqueId)(mj_nccl_unique_id *id);
  mj_nccl_result (*CommInitRank)(mj_nccl_comm *comm, int nranks, mj_nccl_unique_id id, int rank);
  /* optional (NCCL >= 2.14; NULL when older) */
  mj_nccl_result (*CommInitRankConfig)(mj_nccl_comm *comm, int nranks, mj_nccl_unique_id id,
                                       int rank, mj_nccl_config *config);
  mj_nccl_result (*CommFinalize)(mj_nccl_comm comm); /* optional (NCCL >= 2.14) */
  mj_nccl_result (*CommDestroy)(mj_nccl_comm comm);
  mj_nccl_result (*CommAbort)(mj_nccl_comm comm);
  mj_nccl_result (*CommCount)(const mj_nccl_comm comm, int *count);
  mj_nccl_result (*CommUserRank)(const mj_nccl_comm comm, int *rank);
  mj_nccl_result (*CommCuDevice)(const mj_nccl_comm comm, int *device);
  mj_nccl_result (*CommGetAsyncError)(mj_nccl_comm comm, mj_nccl_result *async_error);
  const char *(*GetErrorString)(mj_nccl_result result);
  const char *(*GetLastError)(mj_nccl_comm comm); /* optional (NCCL >= 2.13) */
  mj_nccl_result (*GroupStart)(void);
  mj_nccl_result (*GroupEnd)(void);
  mj_nccl_result (*Send)(const void *buf, size_t count, mj_nccl_dtype dtype, int peer,
                         mj_nccl_comm comm, mj_nccl_stream stream);
  mj_nccl_result (*Recv)(void *buf, size_t count, mj_nccl_dtype dtype, int peer,
                         mj_nccl_comm comm, mj_nccl_stream stream);
} mj_nccl;

/* 1 when this NCCL makes nonblocking communicators (2.14 or newer, with
 * ncclCommInitRankConfig and ncclCommFinalize). */
int mj_nccl_has_nonblocking(const mj_nccl *n);

/* ncclCommGetAsyncError as one answer: the call's own error, else the
 * communicator's state (ncclSuccess; ncclInProgress while a nonblocking
 * one's work goes on in NCCL's thread; or the error NCCL found). */
mj_nccl_result mj_nccl_state(const mj_nccl *n, mj_nccl_comm comm);
/* 1 for a state that is an error (neither done nor in progress). */
static inline int mj_nccl_broken(mj_nccl_result state) {
  return state != MJ_NCCL_SUCCESS && state != MJ_NCCL_IN_PROGRESS;
}

/* Loads NCCL once per process ($MOEJIT_NCCL_LIBRARY, else libnccl.so.2,
 * else libnccl.so) and resolves the table. UNSUPPORTED with a message that
 * says how to provide NCCL when it is absent or too old (needs 2.9: send/recv
 * inside a CUDA graph capture); the same answer on every later call. Thread-safe. */
moejit_status mj_nccl_get(const mj_nccl **out);

/* MOEJIT_OK for ncclSuccess, else MOEJIT_ERR_CUDA with "what: NCCL error N
 * (string)[: last error]" recorded. comm may be NULL. */
moejit_status mj_nccl_check(const mj_nccl *n, mj_nccl_result r, mj_nccl_comm comm,
                            const char *what);

/* Defined by nccl_abi_check.c, which is built only when nccl.h is found. */
int mj_nccl_abi_checked(void);

#endif
