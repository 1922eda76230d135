/* Cache torture: worker processes compile, read and evict in one cache while
 * the parent SIGKILLs random workers (often mid-write: stores stall between
 * the written temp file and the rename) and starts new ones. One worker runs
 * the real compiler (NVRTC, test templates); the others store payloads
 * derived from their key; at the end all of them are killed at once.
 * Afterwards `moejit cache verify` finds no bad entry, `verify --fix`
 * leaves no temp file, every surviving entry loads (with its key's exact
 * payload), and no reader ever saw a damaged entry.
 * MOEJIT_TORTURE_SECONDS sets the length (default 8). */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "codegen_support.h"
#include "common/common.h"
#include "compile/compile.h"
#include "moejit/moejit.h"
#include "test_support.h"

#define N_KEYS 24
#define N_WORKERS 6                 /* at once, the compiler worker included */
#define MAX_SPAWNS 4096             /* stats slots; kills stop when they run out */
#define LIMIT_BYTES (1536u * 1024u) /* below the synthetic working set: stores evict */
#define TORTURE_KERNEL "torture"

/* Per worker, in memory shared with the parent (workers are killed at any
 * moment, so they publish as they go). */
typedef struct worker_stats {
  atomic_ullong iterations, hits, misses, stores, evicted, prunes, verifies, compiles;
  atomic_ullong corrupt_seen, wrong_payload, errors;
} worker_stats;

typedef struct shared {
  atomic_int stop;
  atomic_int error_claimed;
  char first_error[512];
  worker_stats slot[MAX_SPAWNS];
} shared;

static char *dir;
static shared *sh;
static uint64_t run_seed;

static void setup(void) {
  unsetenv("MOEJIT_CACHE_FAULT");
  unsetenv("MOEJIT_CACHE_TEST_STALL_MS");
  unsetenv("MOEJIT_CACHE_DIR");
  unsetenv("MOEJIT_CACHE_DISABLE");
  unsetenv("MOEJIT_CACHE_MAXSIZE");
  dir = ts_mkdtemp("cache-torture");
  cr_assert_not_null(dir);
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(sh, MAP_FAILED);
  ts_rng r = ts_rng_fresh("test_cache_torture");
  run_seed = ts_next(&r);
}

static void teardown(void) {
  ts_rmtree(dir);
  free(dir);
  munmap(sh, sizeof *sh);
}

TestSuite(cache_torture, .init = setup, .fini = teardown, .timeout = 120);

/* ---- the synthetic kernels: key i's payload is a function of i ------------------ */

static void key_of(int i, char key[33]) {
  char src[96];
  snprintf(src, sizeof src, "torture kernel %d of run %llu", i, (unsigned long long)run_seed);
  mj_cache_key(src, strlen(src), "-arch=sm_90a", 12, 8, "sm_90a", key);
}

/* From 1 KiB to ~250 KiB: big ones keep writes in flight longer. */
static size_t payload_len(int i) {
  return 1024 + (size_t)((i * 7919) % 61) * 4096;
}

static void payload_fill(int i, unsigned char *p, size_t len) {
  ts_rng r = ts_rng_seeded(run_seed ^ (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
  for (size_t j = 0; j < len; j++) p[j] = (unsigned char)ts_next(&r);
}

static int payload_matches(int i, const void *data, size_t len) {
  if (len != payload_len(i)) return 0;
  unsigned char *want = malloc(len);
  if (!want) return 0;
  payload_fill(i, want, len);
  int same = memcmp(want, data, len) == 0;
  free(want);
  return same;
}

/* Key index of a synthetic entry, or -1. */
static int index_of(const char *key) {
  char k[33];
  for (int i = 0; i < N_KEYS; i++) {
    key_of(i, k);
    if (!strcmp(k, key)) return i;
  }
  return -1;
}

/* ---- workers ------------------------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static void worker_error(worker_stats *w, const char *fmt,
                                                               ...) {
  atomic_fetch_add(&w->errors, 1);
  int expected = 0;
  if (!atomic_compare_exchange_strong(&sh->error_claimed, &expected, 1)) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sh->first_error, sizeof sh->first_error, fmt, ap);
  va_end(ap);
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Load key i; on a miss "compile" (pause), then store with a random stall
 * before the rename, the window the parent's kills aim at. */
static void get_or_compile(mj_cache *c, worker_stats *w, ts_rng *r) {
  const int i = (int)(ts_next(r) % N_KEYS);
  char key[33];
  key_of(i, key);
  mj_cache_counters before, after;
  mj_cache_get_counters(c, &before);
  void *data = NULL;
  size_t len = 0;
  moejit_status st = mj_cache_load(c, key, &data, &len);
  mj_cache_get_counters(c, &after);
  if (after.corrupt != before.corrupt) {
    atomic_fetch_add(&w->corrupt_seen, 1);
    worker_error(w, "pid %d saw a damaged entry: %s", (int)getpid(), moejit_last_error());
  }
  if (st == MOEJIT_OK) {
    atomic_fetch_add(&w->hits, 1);
    if (!payload_matches(i, data, len)) {
      atomic_fetch_add(&w->wrong_payload, 1);
      worker_error(w, "pid %d: key %d loaded %zu bytes that are not its payload", (int)getpid(), i,
                   len);
    }
    free(data);
    return;
  }
  if (st != MOEJIT_ERR_NOT_FOUND) worker_error(w, "load: status %d: %s", st, moejit_last_error());
  atomic_fetch_add(&w->misses, 1);
  sleep_us((long)(ts_next(r) % 2000));
  size_t n = payload_len(i);
  unsigned char *p = malloc(n);
  if (!p) return;
  payload_fill(i, p, n);
  mj_cache_meta meta = {.kernel = TORTURE_KERNEL, .arch = "sm_90a", .summary = "torture"};
  mj_cache_set_stall_ms(c, (int)(ts_next(r) % 12));
  st = mj_cache_store(c, key, &meta, p, n);
  free(p);
  if (st != MOEJIT_OK)
    worker_error(w, "pid %d: store failed: %s", (int)getpid(), moejit_last_error());
  else
    atomic_fetch_add(&w->stores, 1);
  mj_cache_counters k;
  mj_cache_get_counters(c, &k);
  atomic_store(&w->evicted, k.evictions);
}

/* Maintenance other processes run while the cache is busy. */
static void maintain(worker_stats *w, ts_rng *r) {
  size_t a = 0, b = 0;
  if (ts_next(r) % 2) {
    if (moejit_cache_prune(dir, LIMIT_BYTES, &a, NULL) != MOEJIT_OK)
      worker_error(w, "prune: %s", moejit_last_error());
    atomic_fetch_add(&w->prunes, 1);
  } else {
    if (moejit_cache_verify(dir, 1, &a, &b) != MOEJIT_OK)
      worker_error(w, "verify: %s", moejit_last_error());
    else if (b != 0)
      worker_error(w, "concurrent verify found %zu bad entries", b);
    atomic_fetch_add(&w->verifies, 1);
  }
}

static int synthetic_worker(worker_stats *w, uint64_t seed) {
  ts_rng r = ts_rng_seeded(seed);
  mj_cache *c;
  if (mj_cache_open(dir, LIMIT_BYTES, &c) != MOEJIT_OK) {
    worker_error(w, "open: %s", moejit_last_error());
    return 1;
  }
  while (!atomic_load(&sh->stop)) {
    if (ts_next(&r) % 10 == 0)
      maintain(w, &r);
    else
      get_or_compile(c, w, &r);
    atomic_fetch_add(&w->iterations, 1);
  }
  mj_cache_close(c);
  return 0;
}

/* A fresh compiler each round, so lookups go to the disk cache, over a pool
 * of three specs (repeats are disk hits, the rest NVRTC compiles). */
static int compiler_worker(worker_stats *w, uint64_t seed) {
  ts_rng r = ts_rng_seeded(seed);
  moejit_spec pool[3];
  for (int i = 0; i < 3; i++) {
    ts_rng sr = ts_rng_seeded(run_seed + (uint64_t)i);
    cs_random_spec(&sr, &pool[i]);
  }
  while (!atomic_load(&sh->stop)) {
    moejit_compiler_opts o;
    moejit_compiler_opts_init(&o);
    o.cache_dir = dir;
    o.cache_max_bytes = LIMIT_BYTES;
    o.template_dir = cs_template_dir("good");
    o.jobs = 1;
    moejit_compiler *c = NULL;
    if (moejit_compiler_create(&c, &o) != MOEJIT_OK) {
      worker_error(w, "compiler: %s", moejit_last_error());
      return 1;
    }
    const void *cubin;
    size_t len;
    int hit = 0;
    const moejit_spec *s = &pool[ts_next(&r) % 3];
    moejit_status st = mj_compiler_get_cubin(c, s, "route", "sm_90a", &cubin, &len, NULL, &hit);
    if (st != MOEJIT_OK) worker_error(w, "compile: %s", moejit_last_error());
    atomic_fetch_add(hit ? &w->hits : &w->compiles, 1);
    atomic_fetch_add(&w->iterations, 1);
    moejit_compiler_destroy(c);
  }
  return 0;
}

/* ---- the parent: spawn, kill, respawn --------------------------------------------- */

typedef struct worker {
  pid_t pid;
  int slot, compiles;
} worker;

typedef struct tally {
  int spawned, kills, kills_mid_write;
} tally;

static worker spawn(tally *t, int compiles) {
  worker wk = {.slot = t->spawned++, .compiles = compiles};
  cr_assert_lt(wk.slot, MAX_SPAWNS);
  wk.pid = fork();
  cr_assert_geq(wk.pid, 0, "fork: %s", strerror(errno));
  if (wk.pid == 0) {
    worker_stats *w = &sh->slot[wk.slot];
    uint64_t seed = run_seed * 31 + (uint64_t)wk.slot + 1;
    _exit(compiles ? compiler_worker(w, seed) : synthetic_worker(w, seed));
  }
  return wk;
}

/* SIGKILL, reap, and count whether the victim left a write half done. */
static void kill_one(worker *wk, tally *t) {
  cr_assert_eq(kill(wk->pid, SIGKILL), 0);
  int status;
  cr_assert_eq(waitpid(wk->pid, &status, 0), wk->pid);
  t->kills++;
  char needle[48];
  snprintf(needle, sizeof needle, ".tmp.%d.", (int)wk->pid);
  if (ts_count_files(dir, needle) > 0) t->kills_mid_write++;
}

/* The end is a crash too: every worker is killed wherever it is. */
static void kill_all(worker *ws, int n, tally *t) {
  atomic_store(&sh->stop, 1);
  for (int i = 0; i < n; i++) kill_one(&ws[i], t);
}

static double torture_seconds(void) {
  const char *v = getenv("MOEJIT_TORTURE_SECONDS");
  double s = v ? atof(v) : 8.0;
  return s > 0 ? s : 8.0;
}

static tally torture(void) {
  tally t = {0};
  ts_rng r = ts_rng_seeded(run_seed ^ 0x5bd1e995);
  worker ws[N_WORKERS];
  for (int i = 0; i < N_WORKERS; i++) ws[i] = spawn(&t, i == 0);
  const double end = mj_now_ms() + 1000 * torture_seconds();
  while (mj_now_ms() < end && t.spawned < MAX_SPAWNS) {
    sleep_us(5000 + (long)(ts_next(&r) % 30000));
    /* the compiler worker is killed less often, or it would never finish
     * one NVRTC compile */
    int i = (int)(ts_next(&r) % (N_WORKERS * 4));
    if (i >= N_WORKERS) i = 1 + i % (N_WORKERS - 1);
    kill_one(&ws[i], &t);
    ws[i] = spawn(&t, ws[i].compiles);
  }
  kill_all(ws, N_WORKERS, &t);
  return t;
}

/* ---- afterwards ---------------------------------------------------------------------- */

static worker_stats total_of(int spawned) {
  worker_stats sum;
  memset(&sum, 0, sizeof sum);
  atomic_ullong *dst = (atomic_ullong *)&sum;
  for (int s = 0; s < spawned; s++) {
    atomic_ullong *src = (atomic_ullong *)&sh->slot[s];
    for (size_t f = 0; f < sizeof sum / sizeof *dst; f++) dst[f] += atomic_load(&src[f]);
  }
  return sum;
}

static void run_cli_verify(int fix, int want_bad) {
  char *out = NULL, *err = NULL;
  const char *args[] = {"cache", "verify", "--cache-dir", dir, "--json", fix ? "--fix" : NULL,
                        NULL};
  int rc = ts_run_cli(args, NULL, &out, &err);
  cr_assert_eq(rc, 0, "moejit cache verify%s: exit %d: %s %s", fix ? " --fix" : "", rc, out, err);
  char want[32];
  snprintf(want, sizeof want, "\"bad\":%d", want_bad);
  cr_assert(strstr(out, want), "moejit cache verify: %s", out);
  free(out);
  free(err);
}

/* Every entry left verifies and loads; synthetic ones hold their payload. */
static size_t check_survivors(void) {
  moejit_cache_entry_info *list = NULL;
  size_t n = 0;
  cr_assert_eq(moejit_cache_list(dir, &list, &n), MOEJIT_OK, "%s", moejit_last_error());
  mj_cache *c;
  cr_assert_eq(mj_cache_open(dir, 0, &c), MOEJIT_OK);
  for (size_t e = 0; e < n; e++) {
    cr_assert_eq(list[e].ok, 1, "entry %s does not verify", list[e].key);
    void *data = NULL;
    size_t len = 0;
    cr_assert_eq(mj_cache_load(c, list[e].key, &data, &len), MOEJIT_OK, "%s", moejit_last_error());
    if (!strcmp(list[e].kernel, TORTURE_KERNEL)) {
      int i = index_of(list[e].key);
      cr_assert_geq(i, 0, "unknown synthetic key %s", list[e].key);
      cr_assert(payload_matches(i, data, len), "entry %s holds another payload", list[e].key);
    }
    free(data);
  }
  mj_cache_counters k;
  mj_cache_get_counters(c, &k);
  cr_assert_eq(k.corrupt, 0);
  mj_cache_close(c);
  moejit_free(list);
  return n;
}

Test(cache_torture, killed_writers_never_damage_the_cache) {
  const double t0 = mj_now_ms();
  tally t = torture();
  worker_stats sum = total_of(t.spawned);
  cr_assert_eq(sum.errors, 0, "%llu worker errors, first: %s", sum.errors, sh->first_error);
  cr_assert_eq(sum.corrupt_seen, 0, "readers saw damaged entries");
  cr_assert_eq(sum.wrong_payload, 0, "readers got another key's payload");
  cr_assert_gt(t.kills, 10, "only %d kills", t.kills);
  cr_assert_gt(t.kills_mid_write, 0, "no kill landed mid-write in %d kills", t.kills);
  cr_assert_gt(sum.stores, 0);
  cr_assert_gt(sum.hits, 0);

  moejit_cache_stats before;
  cr_assert_eq(moejit_cache_stats_get(dir, &before), MOEJIT_OK);
  run_cli_verify(0, 0); /* no bad entry */
  run_cli_verify(1, 0); /* the killed writers' temp files go */
  moejit_cache_stats after;
  cr_assert_eq(moejit_cache_stats_get(dir, &after), MOEJIT_OK);
  cr_assert_eq(after.temp_files, 0, "%llu temp files after verify --fix",
               (unsigned long long)after.temp_files);
  cr_assert_eq(ts_count_files(dir, ".tmp."), 0, "stray temp files");
  cr_assert_eq(after.entries, before.entries, "verify --fix removed entries");
  size_t survivors = check_survivors();
  cr_assert_eq(survivors, after.entries);
  fprintf(stderr,
          "torture: %.1f s, %d workers spawned, %d SIGKILLs (%d mid-write, %llu temp files left "
          "for verify --fix), %llu iterations: %llu hits, %llu misses, %llu stores, %llu NVRTC "
          "compiles, %llu evictions, %llu prunes, %llu verifies; %zu entries survive, all "
          "loading; 0 damaged entries seen\n",
          (mj_now_ms() - t0) / 1000, t.spawned, t.kills, t.kills_mid_write,
          (unsigned long long)before.temp_files, sum.iterations, sum.hits, sum.misses, sum.stores,
          sum.compiles, sum.evicted, sum.prunes, sum.verifies, survivors);
}
