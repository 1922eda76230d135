/* A minimal parallel-for over pthreads (workers pull indices from a shared
 * counter) and clocks. Used for compiling many kernels at once. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

typedef struct pf_job {
  size_t n;
  atomic_size_t next;
  void (*fn)(size_t, void *);
  void *arg;
} pf_job;

static void *pf_worker(void *p) {
  pf_job *job = p;
  for (;;) {
    size_t i = atomic_fetch_add(&job->next, 1);
    if (i >= job->n) break;
    job->fn(i, job->arg);
  }
  return NULL;
}

int mj_online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void mj_parallel_for(size_t n, int jobs, void (*fn)(size_t i, void *arg), void *arg) {
  if (n == 0) return;
  if (jobs <= 0) jobs = mj_online_cpus();
  if ((size_t)jobs > n) jobs = (int)n;
  pf_job job = {.n = n, .fn = fn, .arg = arg};
  atomic_init(&job.next, 0);
  pthread_t threads[256];
  if (jobs > 256) jobs = 256;
  int started = 0;
  for (int t = 1; t < jobs; t++) {
    if (pthread_create(&threads[started], NULL, pf_worker, &job) != 0) break;
    started++;
  }
  pf_worker(&job); /* the calling thread works too; with no threads it does it all */
  for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
}

double mj_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int64_t mj_unix_time(void) { return (int64_t)time(NULL); }

void mj_sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int mj_thread_detached(void *(*fn)(void *), void *arg) {
  pthread_attr_t attr;
  pthread_t t;
  if (pthread_attr_init(&attr) != 0) return 0;
  const int started = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
                      pthread_create(&t, &attr, fn, arg) == 0;
  pthread_attr_destroy(&attr);
  return started;
}
