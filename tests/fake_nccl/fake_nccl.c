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
 *   FAKE_NCCL_DESTROY_HANG  nonzero: ncclCommDestroy does not return for
 *                           60 s, as NCCL's waits for a peer that died
 *                           to destroy its communicator too
 *   FAKE_NCCL_ABORT_HANG    nonzero: ncclCommAbort releases the blocked
 *                           streams (NCCL's abort flag) but then does not
 *                           return for 60 s, as NCCL's can when it waits
 *                           for a dead peer to free the communicator
 * Nonblocking communicators (ncclCommInitRankConfig with blocking = 0; the
 * config is checked as NCCL checks it): ncclCommInitRankConfig, an
 * ncclGroupEnd of sends and receives on one and ncclCommFinalize answer
 * ncclInProgress, and ncclCommGetAsyncError says ncclInProgress until the
 * background work is done:
 *   FAKE_NCCL_PROGRESS_MS   how long that work takes (default 2 ms)
 *   FAKE_NCCL_INIT_HANG     (see above) the join never ends
 *   FAKE_NCCL_CONNECT_HANG  nonzero: the first group on a communicator
 *                           never ends (a connection to a dead peer)
 *   FAKE_NCCL_FINALIZE_HANG nonzero: ncclCommFinalize never ends
 * each until the communicator is aborted; FAKE_NCCL_ASYNC_ERROR applies
 * once the join has ended. ncclCommFinalize appends "finalize" to the log.
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
static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The communicators this stand-in made (a caller's handle from elsewhere
 * is not among them, and counts as blocking). */
typedef struct fake_comm {
  int nonblocking;
  atomic_llong busy_until; /* ncclInProgress until then (ns) */
  atomic_int hung;         /* ncclInProgress until aborted */
  atomic_int joined;       /* the join's end was reported */
  atomic_int groups;       /* groups ended on it */
} fake_comm;

static fake_comm *_Atomic made[256];
static atomic_int n_made;

static fake_comm *made_comm(const void *comm) {
  const int n = atomic_load(&n_made);
  for (int i = 0; i < n && i < 256; i++)
    if (atomic_load(&made[i]) == comm) return (fake_comm *)comm;
  return NULL;
}

static fake_comm *new_comm(int nonblocking) {
  fake_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->nonblocking = nonblocking;
  const int i = atomic_fetch_add(&n_made, 1);
  if (i < 256) atomic_store(&made[i], c);
  return c;
}

/* Background work on a nonblocking communicator: ncclInProgress. */
static int start_work(fake_comm *c, int hang) {
  atomic_store(&c->busy_until, now_ns() + 1000000LL * env_int("FAKE_NCCL_PROGRESS_MS", 2));
  if (hang) atomic_store(&c->hung, 1);
  return 7;
}

static int working(fake_comm *c) {
  return atomic_load(&c->hung) || now_ns() < atomic_load(&c->busy_until);
}

int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank) {
  (void)nranks, (void)id, (void)rank;
  if (env_int("FAKE_NCCL_INIT_HANG", 0)) {
    const struct timespec s = {60, 0};
    nanosleep(&s, NULL);
  }
  *comm = new_comm(0);
  return *comm ? 0 : 2;
}

/* ncclConfig_t's head, as NCCL 2.14 laid it out */
typedef struct fake_config {
  size_t size;
  unsigned int magic, version;
  int blocking;
} fake_config;

int ncclCommInitRankConfig(void **comm, int nranks, fake_id id, int rank, fake_config *config) {
  if (!config || config->size < sizeof *config || config->magic != 0xcafebeefu ||
      config->version < 21400)
    return 4; /* ncclInvalidArgument */
  if (config->blocking) return ncclCommInitRank(comm, nranks, id, rank);
  fake_comm *c = new_comm(1);
  *comm = c;
  return c ? start_work(c, env_int("FAKE_NCCL_INIT_HANG", 0)) : 2;
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
  if (env_int("FAKE_NCCL_DESTROY_HANG", 0)) {
    const struct timespec s = {60, 0};
    nanosleep(&s, NULL);
  }
  return 0;
}
int ncclCommFinalize(void *comm) {
  check_alive(comm);
  log_line("finalize");
  fake_comm *c = made_comm(comm);
  return c && c->nonblocking ? start_work(c, env_int("FAKE_NCCL_FINALIZE_HANG", 0)) : 0;
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
  fake_comm *c = made_comm(comm);
  if (c && c->nonblocking && working(c)) {
    *error = 7;
    return 0;
  }
  if (c && c->nonblocking && !atomic_exchange(&c->joined, 1)) {
    *error = 0; /* the join has just ended */
    return 0;
  }
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
/* the communicator of the open group's sends and receives, per thread */
static _Thread_local void *group_comm;

int ncclGroupStart(void) {
  group_comm = NULL;
  return 0;
}
int ncclGroupEnd(void) {
  fake_comm *c = group_comm ? made_comm(group_comm) : NULL;
  group_comm = NULL;
  if (!c || !c->nonblocking) return 0;
  const int first = atomic_fetch_add(&c->groups, 1) == 0;
  return start_work(c, first && env_int("FAKE_NCCL_CONNECT_HANG", 0));
}
int ncclSend(const void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
  (void)buf, (void)count, (void)dtype, (void)peer;
  check_alive(comm);
  group_comm = comm;
  return env_int("FAKE_NCCL_SEND_FAIL", 0) ? 6 : hang_stream(stream);
}
int ncclRecv(void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
  (void)buf, (void)count, (void)dtype, (void)peer;
  check_alive(comm);
  group_comm = comm;
  return hang_stream(stream);
}
