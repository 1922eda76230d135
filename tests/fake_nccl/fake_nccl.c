/* A stand-in for libnccl.so.2 (tests point $MOEJIT_NCCL_LIBRARY at it): the
 * entry points moejit resolves, with what they return set by environment
 * variables, so the loader's and the expert-parallel load's checks run on
 * a machine without NCCL or a GPU.
 *   FAKE_NCCL_VERSION       ncclGetVersion's code (default 22803: 2.28.3)
 *   FAKE_NCCL_VERSION_FAIL  nonzero: ncclGetVersion fails (ncclInternalError)
 *   FAKE_NCCL_COUNT, FAKE_NCCL_RANK, FAKE_NCCL_DEVICE  what a communicator
 *                           reports (defaults 2, 0, 0)
 *   FAKE_NCCL_SEND_FAIL     nonzero: ncclSend fails (ncclRemoteError)
 *   FAKE_NCCL_ASYNC_ERROR   what ncclCommGetAsyncError reports (default 0)
 *   FAKE_NCCL_LOG           a file that ncclCommDestroy and ncclCommAbort
 *                           append "destroy" or "abort" lines to
 * Collectives otherwise succeed and move nothing. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fake_id {
  char internal[128];
} fake_id;

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

int ncclGetVersion(int *version) {
  if (env_int("FAKE_NCCL_VERSION_FAIL", 0)) return 3;
  *version = env_int("FAKE_NCCL_VERSION", 22803);
  return 0;
}
int ncclGetUniqueId(fake_id *id) {
  memset(id, 0x17, sizeof *id);
  return 0;
}
int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank) {
  (void)nranks, (void)id, (void)rank;
  *comm = malloc(1);
  return *comm ? 0 : 2;
}
static void log_line(const char *what) {
  const char *path = getenv("FAKE_NCCL_LOG");
  FILE *f = path && *path ? fopen(path, "a") : NULL;
  if (!f) return;
  fprintf(f, "%s\n", what);
  fclose(f);
}
int ncclCommDestroy(void *comm) {
  log_line("destroy");
  free(comm);
  return 0;
}
int ncclCommAbort(void *comm) {
  log_line("abort");
  free(comm);
  return 0;
}
int ncclCommCount(const void *comm, int *count) {
  (void)comm;
  *count = env_int("FAKE_NCCL_COUNT", 2);
  return 0;
}
int ncclCommUserRank(const void *comm, int *rank) {
  (void)comm;
  *rank = env_int("FAKE_NCCL_RANK", 0);
  return 0;
}
int ncclCommCuDevice(const void *comm, int *device) {
  (void)comm;
  *device = env_int("FAKE_NCCL_DEVICE", 0);
  return 0;
}
int ncclCommGetAsyncError(void *comm, int *error) {
  (void)comm;
  *error = env_int("FAKE_NCCL_ASYNC_ERROR", 0);
  return 0;
}
const char *ncclGetErrorString(int result) {
  return result ? "fake NCCL error" : "no error";
}
const char *ncclGetLastError(void *comm) {
  (void)comm;
  return "";
}
int ncclGroupStart(void) {
  return 0;
}
int ncclGroupEnd(void) {
  return 0;
}
int ncclSend(const void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
  (void)buf, (void)count, (void)dtype, (void)peer, (void)comm, (void)stream;
  return env_int("FAKE_NCCL_SEND_FAIL", 0) ? 6 : 0;
}
int ncclRecv(void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
  (void)buf, (void)count, (void)dtype, (void)peer, (void)comm, (void)stream;
  return 0;
}
