/* Threads hammering one cache directory, for ThreadSanitizer (`make tsan`;
 * Criterion cannot start under it) and as a plain test in `make test`.
 * Four writers and readers, two of them sharing one handle and two with a
 * handle each (as processes would), store and load a pool of keys under a
 * size limit that forces eviction, while a fifth thread runs the
 * maintenance calls (stats, list, verify without fixing). Every load is a
 * miss or exactly the bytes its key stands for; once all writers are done
 * the cache is within its limit and every entry verifies. Exit 0 on
 * success, 1 with what failed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "moejit/moejit.h"

enum { KEYS = 48, ROUNDS = 300, THREADS = 4 };
#define LIMIT (96u * 1024u)

static char dir[256];
static char keys[KEYS][33];
static atomic_int failures, done_writers;

static void fail(const char *what) {
  atomic_fetch_add(&failures, 1);
  fprintf(stderr, "stress_cache: %s\n", what);
}

/* The bytes key i stands for: its length and content follow from i. */
static size_t payload(int i, unsigned char *buf) {
  const size_t n = 1000 + (size_t)i * 97;
  for (size_t j = 0; j < n; j++) buf[j] = (unsigned char)(i * 31 + j * 7);
  return n;
}

typedef struct worker {
  mj_cache *c;
  unsigned seed;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  unsigned char want[1000 + KEYS * 97];
  mj_cache_meta m;
  memset(&m, 0, sizeof m);
  snprintf(m.kernel, sizeof m.kernel, "stress");
  snprintf(m.arch, sizeof m.arch, "sm_90a");
  for (int r = 0; r < ROUNDS; r++) {
    const int i = (int)(rand_r(&w->seed) % KEYS);
    const size_t n = payload(i, want);
    if (rand_r(&w->seed) % 2) {
      const moejit_status st = mj_cache_store(w->c, keys[i], &m, want, n);
      if (st != MOEJIT_OK && st != MOEJIT_ERR_CACHE) fail("a store returned neither OK nor CACHE");
    } else {
      void *data = NULL;
      size_t len = 0;
      const moejit_status st = mj_cache_load(w->c, keys[i], &data, &len);
      if (st == MOEJIT_OK && (len != n || memcmp(data, want, n) != 0))
        fail("a hit returned other bytes than its key stands for");
      else if (st != MOEJIT_OK && st != MOEJIT_ERR_NOT_FOUND)
        fail("a load returned neither OK nor NOT_FOUND");
      free(data);
    }
  }
  atomic_fetch_add(&done_writers, 1);
  return NULL;
}

static void *maintain(void *arg) {
  (void)arg;
  while (atomic_load(&done_writers) < THREADS) {
    moejit_cache_stats s;
    if (moejit_cache_stats_get(dir, &s) != MOEJIT_OK) fail("stats failed");
    moejit_cache_entry_info *e = NULL;
    size_t n = 0;
    if (moejit_cache_list(dir, &e, &n) != MOEJIT_OK) fail("list failed");
    moejit_free(e);
    size_t ok = 0, bad = 0;
    if (moejit_cache_verify(dir, 0, &ok, &bad) != MOEJIT_OK) fail("verify failed");
  }
  return NULL;
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/moejit-stress-cache-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  for (int i = 0; i < KEYS; i++) {
    char src[32];
    snprintf(src, sizeof src, "stress key %d", i);
    mj_cache_key(src, strlen(src), "-arch=sm_90a", 12, 8, "sm_90a", keys[i]);
  }
  mj_cache *shared = NULL, *own[2] = {NULL, NULL};
  if (mj_cache_open(dir, LIMIT, &shared) || mj_cache_open(dir, LIMIT, &own[0]) ||
      mj_cache_open(dir, LIMIT, &own[1])) {
    fprintf(stderr, "stress_cache: open: %s\n", moejit_last_error());
    return 1;
  }
  worker w[THREADS] = {{shared, 1}, {shared, 2}, {own[0], 3}, {own[1], 4}};
  pthread_t t[THREADS], m;
  for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, &w[i]);
  pthread_create(&m, NULL, maintain, NULL);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  pthread_join(m, NULL);
  moejit_cache_stats s;
  size_t ok = 0, bad = 0;
  if (moejit_cache_stats_get(dir, &s) != MOEJIT_OK)
    fail("final stats failed");
  else if (s.bytes > LIMIT)
    fail("the cache is over its limit once the writers are done");
  if (moejit_cache_verify(dir, 0, &ok, &bad) != MOEJIT_OK || bad) fail("an entry does not verify");
  mj_cache_close(shared);
  mj_cache_close(own[0]);
  mj_cache_close(own[1]);
  size_t removed = 0;
  moejit_cache_clear(dir, &removed);
  char tag[300];
  snprintf(tag, sizeof tag, "%s/CACHEDIR.TAG", dir);
  unlink(tag);
  for (int i = 0; i < 256; i++) {
    char sub[300];
    snprintf(sub, sizeof sub, "%s/%02x", dir, i);
    rmdir(sub);
  }
  rmdir(dir);
  const int f = atomic_load(&failures);
  printf(
      "stress_cache: %d threads x %d rounds over %d keys, limit %u bytes: %s (%llu entries, "
      "%llu bytes at the end)\n",
      THREADS, ROUNDS, KEYS, LIMIT, f ? "FAILED" : "ok", (unsigned long long)s.entries,
      (unsigned long long)s.bytes);
  return f ? 1 : 0;
}
