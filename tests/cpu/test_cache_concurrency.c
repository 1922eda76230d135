/* The cache under concurrent use: forked processes storing the same key and
 * different keys under a size limit, readers racing writers, a writer
 * killed mid-store, and threads sharing one handle. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/common.h"
#include "moejit/moejit.h"
#include "test_support.h"

static char *dir;
static ts_rng rng;

static void setup(void) {
  dir = ts_mkdtemp("cache-conc");
  cr_assert_not_null(dir);
  rng = ts_rng_fresh("test_cache_concurrency");
}

static void teardown(void) {
  ts_rmtree(dir);
  free(dir);
}

TestSuite(cache_concurrency, .init = setup, .fini = teardown);

/* Payload of `len` bytes determined by (seed): a reader can tell a whole
 * payload of some writer from a torn one. */
static void fill_payload(unsigned char *p, size_t len, uint64_t seed) {
  ts_rng r = ts_rng_seeded(seed * 0x9E3779B97F4A7C15ull + 1);
  for (size_t i = 0; i < len; i++) p[i] = (unsigned char)ts_next(&r);
  memcpy(p, &seed, len < sizeof seed ? len : sizeof seed);
}

static int payload_is_whole(const unsigned char *p, size_t len, size_t want_len) {
  if (len != want_len || len < sizeof(uint64_t)) return 0;
  uint64_t seed;
  memcpy(&seed, p, sizeof seed);
  unsigned char *expect = malloc(len);
  if (!expect) return 0;
  fill_payload(expect, len, seed);
  int same = memcmp(expect, p, len) == 0;
  free(expect);
  return same;
}

static void random_key(char key[33]) {
  char src[64];
  snprintf(src, sizeof src, "concurrent kernel %llu", (unsigned long long)ts_next(&rng));
  mj_cache_key(src, strlen(src), "", 12, 8, "sm_90a", key);
}

/* Start line for children: they block reading the pipe until the parent
 * closes its end, so their stores really overlap. */
typedef struct start_gate {
  int fd[2];
} start_gate;

static void gate_init(start_gate *g) {
  cr_assert_eq(pipe(g->fd), 0);
}

static void gate_wait(start_gate *g) {
  char b;
  close(g->fd[1]);
  while (read(g->fd[0], &b, 1) < 0 && errno == EINTR) {
  }
}

static void gate_open(start_gate *g) {
  close(g->fd[0]);
  close(g->fd[1]);
}

/* Forks n children running fn(i, arg) (exit status = its return value),
 * opens the gate and asserts every child exited 0. */
static void run_children(int n, int (*fn)(int i, void *arg), void *arg) {
  start_gate g;
  gate_init(&g);
  pid_t pids[64];
  cr_assert_leq(n, 64);
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    cr_assert_geq(pids[i], 0);
    if (pids[i] == 0) {
      gate_wait(&g);
      _exit(fn(i, arg));
    }
  }
  gate_open(&g);
  for (int i = 0; i < n; i++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d failed (status %d)", i,
              status);
  }
}

static void assert_clean_and_valid(size_t want_entries) {
  size_t ok = 0, bad = 0;
  cr_assert_eq(moejit_cache_verify(dir, 0, &ok, &bad), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(bad, 0, "%zu damaged entries", bad);
  if (want_entries != (size_t)-1) cr_assert_eq(ok, want_entries);
  cr_assert_eq(ts_count_files(dir, ".tmp."), 0, "temp files left behind");
}

/* ---- same key from many processes ------------------------------------------------ */

typedef struct same_key_job {
  char key[33];
  size_t len;
  int rounds;
} same_key_job;

static int store_same_key(int i, void *arg) {
  same_key_job *job = arg;
  mj_cache *c;
  if (mj_cache_open(dir, 0, &c) != MOEJIT_OK) return 2;
  unsigned char *p = malloc(job->len);
  if (!p) return 3;
  fill_payload(p, job->len, 42);
  int rc = 0;
  for (int r = 0; r < job->rounds && !rc; r++)
    rc = mj_cache_store(c, job->key, NULL, p, job->len) == MOEJIT_OK ? 0 : 4;
  free(p);
  mj_cache_close(c);
  return rc;
}

Test(cache_concurrency, eight_processes_storing_one_key_leave_one_entry) {
  same_key_job job = {.len = 200000 + ts_next(&rng) % 100000, .rounds = 10};
  random_key(job.key);
  run_children(8, store_same_key, &job);
  assert_clean_and_valid(1);
  cr_assert_eq(ts_count_files(dir, ".mjc"), 1);
  mj_cache *c;
  cr_assert_eq(mj_cache_open(dir, 0, &c), MOEJIT_OK);
  void *data;
  size_t len;
  cr_assert_eq(mj_cache_load(c, job.key, &data, &len), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(payload_is_whole(data, len, job.len));
  free(data);
  mj_cache_close(c);
}

/* ---- readers racing writers ---------------------------------------------------- */

typedef struct race_job {
  char key[33];
  size_t len;
  int writers;
} race_job;

/* Writers store their own payload version of one key over and over;
 * readers must see a miss or one writer's whole payload, never damage. */
static int race_child(int i, void *arg) {
  race_job *job = arg;
  mj_cache *c;
  if (mj_cache_open(dir, 0, &c) != MOEJIT_OK) return 2;
  int rc = 0;
  if (i < job->writers) {
    unsigned char *p = malloc(job->len);
    if (!p) return 3;
    fill_payload(p, job->len, 1000 + (uint64_t)i);
    for (int r = 0; r < 25 && !rc; r++)
      rc = mj_cache_store(c, job->key, NULL, p, job->len) == MOEJIT_OK ? 0 : 3;
    free(p);
  } else {
    double end = mj_now_ms() + 400;
    while (!rc && mj_now_ms() < end) {
      void *data = NULL;
      size_t len = 0;
      moejit_status st = mj_cache_load(c, job->key, &data, &len);
      if (st == MOEJIT_OK && !payload_is_whole(data, len, job->len))
        rc = 4;
      else if (st != MOEJIT_OK && st != MOEJIT_ERR_NOT_FOUND)
        rc = 5;
      free(data);
    }
    mj_cache_counters k;
    mj_cache_get_counters(c, &k);
    if (!rc && k.corrupt) rc = 6; /* a reader saw a partial entry */
  }
  mj_cache_close(c);
  return rc;
}

Test(cache_concurrency, readers_racing_writers_see_a_miss_or_a_whole_entry) {
  race_job job = {.len = 300000 + ts_next(&rng) % 1000, .writers = 4};
  random_key(job.key);
  run_children(8, race_child, &job);
  assert_clean_and_valid(1);
}

/* ---- different keys under a size limit ------------------------------------------ */

typedef struct limit_job {
  uint64_t max_bytes;
  uint64_t seed;
} limit_job;

static int store_many_keys(int i, void *arg) {
  limit_job *job = arg;
  mj_cache *c;
  if (mj_cache_open(dir, job->max_bytes, &c) != MOEJIT_OK) return 2;
  int rc = 0;
  unsigned char p[4096];
  for (int k = 0; k < 12 && !rc; k++) {
    char src[64], key[33];
    snprintf(src, sizeof src, "%llu/%d/%d", (unsigned long long)job->seed, i, k);
    mj_cache_key(src, strlen(src), "", 12, 8, "sm_90a", key);
    fill_payload(p, sizeof p, (uint64_t)(i * 100 + k));
    rc = mj_cache_store(c, key, NULL, p, sizeof p) == MOEJIT_OK ? 0 : 3;
  }
  mj_cache_close(c);
  return rc;
}

Test(cache_concurrency, different_keys_under_a_limit_stay_under_it) {
  limit_job job = {.max_bytes = 10 * (4096 + 200), .seed = ts_next(&rng)};
  run_children(8, store_many_keys, &job);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_leq(s.bytes, job.max_bytes, "%llu bytes over a limit of %llu",
                (unsigned long long)s.bytes, (unsigned long long)job.max_bytes);
  cr_assert_gt(s.entries, 0);
  assert_clean_and_valid(s.entries);
}

/* ---- a writer killed mid-store -------------------------------------------------- */

static void wait_for_temp_file(void) {
  double end = mj_now_ms() + 10000;
  while (ts_count_files(dir, ".tmp.") == 0) {
    cr_assert_lt(mj_now_ms(), end, "the writer never created its temp file");
    usleep(2000);
  }
}

Test(cache_concurrency, killed_writer_leaves_a_temp_that_verify_removes) {
  char key[33];
  random_key(key);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    setenv("MOEJIT_CACHE_TEST_STALL_MS", "30000", 1);
    mj_cache *c;
    unsigned char p[5000];
    fill_payload(p, sizeof p, 7);
    if (mj_cache_open(dir, 0, &c) != MOEJIT_OK) _exit(2);
    mj_cache_store(c, key, NULL, p, sizeof p); /* stalls before rename */
    _exit(3);
  }
  wait_for_temp_file();
  cr_assert_eq(kill(pid, SIGKILL), 0);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status), "the writer finished before it was killed");

  mj_cache *c;
  cr_assert_eq(mj_cache_open(dir, 0, &c), MOEJIT_OK);
  void *data;
  size_t len;
  cr_assert_eq(mj_cache_load(c, key, &data, &len), MOEJIT_ERR_NOT_FOUND);
  mj_cache_counters k;
  mj_cache_get_counters(c, &k);
  cr_assert_eq(k.corrupt, 0);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.entries, 0);
  cr_assert_eq(s.temp_files, 1);
  size_t n = 0, ok = 0, bad = 0;
  cr_assert_eq(moejit_cache_prune(dir, 0, &n, NULL), MOEJIT_OK);
  cr_assert_eq(n, 0, "prune removed a temp file younger than a minute");
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(ok + bad, 0);
  cr_assert_eq(ts_count_files(dir, ".tmp."), 0, "verify kept the dead writer's temp file");
  cr_assert_eq(mj_cache_load(c, key, &data, &len), MOEJIT_ERR_NOT_FOUND);
  mj_cache_close(c);
}

Test(cache_concurrency, stalled_live_writer_is_not_disturbed_by_verify) {
  char key[33];
  random_key(key);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    mj_cache *c;
    unsigned char p[3000];
    fill_payload(p, sizeof p, 9);
    if (mj_cache_open(dir, 0, &c) != MOEJIT_OK) _exit(2);
    mj_cache_set_stall_ms(c, 300);
    _exit(mj_cache_store(c, key, NULL, p, sizeof p) == MOEJIT_OK ? 0 : 3);
  }
  wait_for_temp_file();
  size_t ok = 0, bad = 0;
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(ts_count_files(dir, ".tmp."), 1, "verify removed a live writer's temp file");
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the stalled store failed");
  assert_clean_and_valid(1);
}

/* ---- threads sharing one handle ------------------------------------------------- */

typedef struct thread_job {
  mj_cache *c;
  int id, failures;
  uint64_t seed;
} thread_job;

static void *thread_main(void *arg) {
  thread_job *t = arg;
  unsigned char p[2048];
  for (int k = 0; k < 20; k++) {
    char src[64], key[33];
    snprintf(src, sizeof src, "%llu/%d/%d", (unsigned long long)t->seed, t->id, k);
    mj_cache_key(src, strlen(src), "", 12, 8, "sm_90a", key);
    fill_payload(p, sizeof p, (uint64_t)(t->id * 1000 + k));
    void *data = NULL;
    size_t len = 0;
    if (mj_cache_store(t->c, key, NULL, p, sizeof p) != MOEJIT_OK ||
        mj_cache_load(t->c, key, &data, &len) != MOEJIT_OK || len != sizeof p ||
        memcmp(data, p, len) != 0)
      t->failures++;
    free(data);
  }
  return NULL;
}

Test(cache_concurrency, threads_share_one_handle_and_its_counters) {
  mj_cache *c;
  cr_assert_eq(mj_cache_open(dir, 0, &c), MOEJIT_OK);
  pthread_t th[8];
  thread_job jobs[8];
  uint64_t seed = ts_next(&rng);
  for (int i = 0; i < 8; i++) {
    jobs[i] = (thread_job){.c = c, .id = i, .seed = seed};
    cr_assert_eq(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
  }
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(jobs[i].failures, 0, "thread %d", i);
  }
  mj_cache_counters k;
  mj_cache_get_counters(c, &k);
  cr_assert_eq(k.stores, 160);
  cr_assert_eq(k.hits, 160);
  cr_assert_eq(k.misses + k.corrupt + k.store_failures, 0);
  mj_cache_close(c);
  assert_clean_and_valid(160);
}
