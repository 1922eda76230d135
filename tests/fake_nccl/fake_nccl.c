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
 *   FAKE_NCCL_HANG          1: each ncclSend / ncclRecv blocks its stream
 *                           until ncclCommAbort (at most 60 s), as NCCL's
 *                           kernels wait for a peer that never comes; 2:
 *                           the same, and once the stream is blocked
 *                           ncclCommGetAsyncError reports ncclRemoteError,
 *                           as NCCL does when a peer dies mid-exchange
 *   FAKE_NCCL_INIT_HANG     nonzero: ncclCommInitRank returns only after
 *                           60 s, as NCCL's does while a rank is missing
 *   FAKE_NCCL_ABORT_HANG    nonzero: ncclCommAbort releases the blocked
 *                           streams (NCCL's abort flag) but then does not
 *                           return for 60 s, as NCCL's can when it waits
 *                           for a dead peer to free the communicator
 * Collectives otherwise succeed and move nothing. A communicator that was
 * destroyed or aborted is remembered (its memory is never reused): any
 * later call on it, a second teardown included, abort()s the process, so
 * a use after abort fails the test that does it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  if (env_int("FAKE_NCCL_INIT_HANG", 0)) {
    const struct timespec s = {60, 0};
    nanosleep(&s, NULL);
  }
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
/* FAKE_NCCL_HANG: a host function on the stream (cuLaunchHostFunc of the
 * driver the process has loaded) that holds the stream until released. */
static atomic_int hang_released, hang_started;

static void hang_fn(void *arg) {
  (void)arg;
  atomic_store(&hang_started, 1);
  const struct timespec ms = {0, 1000000L};
  for (int i = 0; i < 60000 && !atomic_load(&hang_released); i++) nanosleep(&ms, NULL);
}

static int hang_stream(void *stream) {
  if (!env_int("FAKE_NCCL_HANG", 0)) return 0;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  typedef int (*launch_host_func)(void *stream, void (*fn)(void *), void *data);
  launch_host_func launch = lib ? (launch_host_func)dlsym(lib, "cuLaunchHostFunc") : NULL;
  return launch && launch(stream, hang_fn, NULL) == 0 ? 0 : 1; /* ncclUnhandledCudaError */
}

/* Communicators torn down so far (kept allocated, so no address comes
 * back). */
static void *_Atomic gone[256];
static atomic_int n_gone;

static void check_alive(const void *comm) {
  const int n = atomic_load(&n_gone);
  for (int i = 0; i < n && i < 256; i++)
    if (atomic_load(&gone[i]) == comm) {
      fprintf(stderr, "fake NCCL: a call on communicator %p after its destroy or abort\n", comm);
      abort();
    }
}

static void tear_down(void *comm) {
  check_alive(comm);
  const int i = atomic_fetch_add(&n_gone, 1);
  if (i < 256) atomic_store(&gone[i], comm);
}

int ncclCommDestroy(void *comm) {
  tear_down(comm);
  atomic_store(&hang_released, 1);
  log_line("destroy");
  return 0;
}
int ncclCommAbort(void *comm) {
  tear_down(comm);
  atomic_store(&hang_released, 1);
  log_line("abort");
  if (env_int("FAKE_NCCL_ABORT_HANG", 0)) {
    const struct timespec s = {60, 0};
    nanosleep(&s, NULL);
  }
  return 0;
}
int ncclCommCount(const void *comm, int *count) {
  check_alive(comm);
  *count = env_int("FAKE_NCCL_COUNT", 2);
  return 0;
}
int ncclCommUserRank(const void *comm, int *rank) {
  check_alive(comm);
  *rank = env_int("FAKE_NCCL_RANK", 0);
  return 0;
}
int ncclCommCuDevice(const void *comm, int *device) {
  check_alive(comm);
  *device = env_int("FAKE_NCCL_DEVICE", 0);
  return 0;
}
int ncclCommGetAsyncError(void *comm, int *error) {
  check_alive(comm);
  *error = env_int("FAKE_NCCL_HANG", 0) == 2 && atomic_load(&hang_started)
               ? 6
               : env_int("FAKE_NCCL_ASYNC_ERROR", 0);
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
  (void)buf, (void)count, (void)dtype, (void)peer;
  check_alive(comm);
  return env_int("FAKE_NCCL_SEND_FAIL", 0) ? 6 : hang_stream(stream);
}
int ncclRecv(void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
  (void)buf, (void)count, (void)dtype, (void)peer;
  check_alive(comm);
  return hang_stream(stream);
}
