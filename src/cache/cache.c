/* The cache handle: opening a cache directory, loading entries (a bad entry
 * is a counted miss) and storing them atomically (temp file + rename). */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/common.h"

struct mj_cache {
  char root[MOEJIT_PATH_MAX];
  uint64_t max_bytes;
  int dir_readonly;     /* the directory itself cannot be written */
  atomic_int fault;     /* MJ_CACHE_FAULT_* */
  atomic_int stall_ms;  /* test hook: sleep before rename */
  pthread_mutex_t lock; /* guards counters */
  mj_cache_counters counters;
};

static const char cachedir_tag[] =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by moejit.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n";

/* ---- configuration ---------------------------------------------------------- */

moejit_status mj_cache_dir_printf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < cap) return MOEJIT_OK;
  if (cap < MOEJIT_PATH_MAX) /* the caller's buffer, not the path, is short */
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "text too long for a %zu-byte buffer", cap);
  return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                 "the cache directory's path is longer than the %d bytes this build supports; "
                 "HINT: use a shorter path (--cache-dir, MOEJIT_CACHE_DIR or the config's "
                 "cache.dir)",
                 MOEJIT_PATH_MAX - 1);
}

moejit_status mj_cache_default_dir(char *buf, size_t cap) {
  const char *v = getenv("MOEJIT_CACHE_DIR");
  if (v && *v) return mj_cache_dir_printf(buf, cap, "%s", v);
  v = getenv("XDG_CACHE_HOME");
  if (v && v[0] == '/') return mj_cache_dir_printf(buf, cap, "%s/moejit", v); /* absolute only */
  v = getenv("HOME");
  if (v && *v) return mj_cache_dir_printf(buf, cap, "%s/.cache/moejit", v);
  return mj_fail(MOEJIT_ERR_CACHE,
                 "no cache directory: none of MOEJIT_CACHE_DIR, XDG_CACHE_HOME, HOME is set; "
                 "HINT: set MOEJIT_CACHE_DIR to a writable directory");
}

static moejit_status fault_from_env(int *fault, int *stall_ms) {
  const char *v = getenv("MOEJIT_CACHE_FAULT");
  *fault = MJ_CACHE_FAULT_NONE;
  if (v && !strcmp(v, "readonly"))
    *fault = MJ_CACHE_FAULT_READONLY;
  else if (v && !strcmp(v, "enospc"))
    *fault = MJ_CACHE_FAULT_ENOSPC;
  else if (v && *v && strcmp(v, "none") != 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "MOEJIT_CACHE_FAULT='%s' is not a fault (allowed: readonly, enospc, none)", v);
  v = getenv("MOEJIT_CACHE_TEST_STALL_MS");
  *stall_ms = v ? atoi(v) : 0;
  if (*stall_ms < 0) *stall_ms = 0;
  return MOEJIT_OK;
}

/* Trailing slashes would make "a/" and "a" look like different caches. */
static moejit_status set_root(mj_cache *c, const char *dir) {
  moejit_status st = dir && *dir ? mj_cache_dir_printf(c->root, sizeof c->root, "%s", dir)
                                 : mj_cache_default_dir(c->root, sizeof c->root);
  if (st == MOEJIT_ERR_INVALID_ARGUMENT) return MOEJIT_ERR_CACHE; /* too long: said why */
  if (st != MOEJIT_OK) return st;
  for (size_t n = strlen(c->root); n > 1 && c->root[n - 1] == '/'; n--) c->root[n - 1] = '\0';
  return MOEJIT_OK;
}

/* 1 if the tag at `path` begins with the signature line (the part backup
 * tools check); 0 if it does not, or cannot be read. */
static int cachedir_tag_ok(const char *path) {
  enum { SIG = 44 }; /* "Signature: " + 32 hex digits + newline */
  char buf[SIG];
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return errno != ENOENT; /* unreadable: leave it alone */
  ssize_t n = read(fd, buf, SIG);
  close(fd);
  return n == SIG && memcmp(buf, cachedir_tag, SIG) == 0;
}

/* Written whole to a temp file, then linked in place: concurrent openers
 * race harmlessly, and a disk that fills mid-write leaves no truncated tag.
 * A truncated one (an earlier full disk) is replaced. The tag is advisory:
 * failures are ignored. */
static int open_temp(const char *final_path, char *tmp, size_t cap);

static void write_cachedir_tag(const char *root) {
  char path[MOEJIT_PATH_MAX + 16], tmp[MOEJIT_PATH_MAX + 48];
  if (snprintf(path, sizeof path, "%s/CACHEDIR.TAG", root) >= (int)sizeof path) return;
  if (cachedir_tag_ok(path)) return; /* whole, or there and unreadable */
  /* a temp name of this call's own (two threads of a process may write the
   * tag at once: one truncating a temp the other already linked in place
   * would empty the tag) */
  int fd = open_temp(path, tmp, sizeof tmp);
  if (fd < 0) return;
  ssize_t n = write(fd, cachedir_tag, sizeof cachedir_tag - 1);
  int whole = n == (ssize_t)(sizeof cachedir_tag - 1);
  if (close(fd) != 0) whole = 0;
  if (whole && link(tmp, path) != 0 && errno == EEXIST && !cachedir_tag_ok(path))
    rename(tmp, path); /* replace a truncated tag */
  unlink(tmp);
}

static moejit_status prepare_root(mj_cache *c, int fault) {
  struct stat sb;
  if (stat(c->root, &sb) != 0) {
    if (errno != ENOENT)
      return mj_fail(MOEJIT_ERR_CACHE, "cannot use cache directory '%s': %s", c->root,
                     strerror(errno));
    if (fault == MJ_CACHE_FAULT_READONLY)
      return mj_fail(MOEJIT_ERR_CACHE, "cache directory '%s' does not exist (read-only)", c->root);
    if (mj_mkdir_p(c->root, 0755) != MOEJIT_OK)
      return mj_fail_prefix(MOEJIT_ERR_CACHE, "cannot create cache directory '%s'", c->root);
  } else if (!S_ISDIR(sb.st_mode)) {
    return mj_fail(
        MOEJIT_ERR_CACHE,
        "cache directory '%s' is not a directory; HINT: point MOEJIT_CACHE_DIR elsewhere", c->root);
  }
  if (faccessat(AT_FDCWD, c->root, R_OK | X_OK, AT_EACCESS) != 0)
    return mj_fail(MOEJIT_ERR_CACHE, "cannot read cache directory '%s': %s", c->root,
                   strerror(errno));
  c->dir_readonly = faccessat(AT_FDCWD, c->root, W_OK, AT_EACCESS) != 0;
  if (!c->dir_readonly && fault != MJ_CACHE_FAULT_READONLY) write_cachedir_tag(c->root);
  return MOEJIT_OK;
}

moejit_status mj_cache_open(const char *dir, uint64_t max_bytes, mj_cache **out) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_cache_open: out is NULL");
  *out = NULL;
  int fault, stall_ms;
  moejit_status st = fault_from_env(&fault, &stall_ms);
  if (st != MOEJIT_OK) return st;
  mj_cache *c = calloc(1, sizeof *c);
  if (!c) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory opening the cache");
  c->max_bytes = max_bytes;
  atomic_init(&c->fault, fault);
  atomic_init(&c->stall_ms, stall_ms);
  if ((st = set_root(c, dir)) != MOEJIT_OK || (st = prepare_root(c, fault)) != MOEJIT_OK) {
    free(c);
    return st;
  }
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return mj_fail(MOEJIT_ERR_INTERNAL, "cannot create the cache mutex");
  }
  *out = c;
  return MOEJIT_OK;
}

void mj_cache_close(mj_cache *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

const char *mj_cache_dir(const mj_cache *c) {
  return c ? c->root : "";
}

int mj_cache_readonly(const mj_cache *c) {
  return c && (c->dir_readonly || atomic_load(&c->fault) == MJ_CACHE_FAULT_READONLY);
}

void mj_cache_set_fault(mj_cache *c, int fault) {
  if (c) atomic_store(&c->fault, fault);
}

void mj_cache_set_stall_ms(mj_cache *c, int ms) {
  if (c) atomic_store(&c->stall_ms, ms < 0 ? 0 : ms);
}

void mj_cache_get_counters(mj_cache *c, mj_cache_counters *out) {
  if (!c || !out) return;
  pthread_mutex_lock(&c->lock);
  *out = c->counters;
  pthread_mutex_unlock(&c->lock);
}

/* Adds n to one of c->counters under the lock. */
static void count(mj_cache *c, uint64_t *field, uint64_t n) {
  pthread_mutex_lock(&c->lock);
  *field += n;
  pthread_mutex_unlock(&c->lock);
}

/* ---- load ------------------------------------------------------------------ */

moejit_status mj_cache_load(mj_cache *c, const char *key, void **data, size_t *len) {
  if (!c || !data || !len)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_cache_load: NULL argument");
  *data = NULL;
  *len = 0;
  char path[MOEJIT_PATH_MAX + 64];
  moejit_status st = mj_cache_entry_path(c->root, key, path, sizeof path);
  if (st != MOEJIT_OK) return st;
  mj_cache_entry_head head;
  st = mj_cache_read_entry(path, key, &head, data, len);
  if (st == MOEJIT_OK) {
    count(c, &c->counters.hits, 1);
    if (!mj_cache_readonly(c)) utimensat(AT_FDCWD, path, NULL, 0); /* last use; may fail */
    return MOEJIT_OK;
  }
  if (st == MOEJIT_ERR_OUT_OF_MEMORY) return st;
  count(c, &c->counters.misses, 1);
  if (st == MOEJIT_ERR_CACHE) {
    count(c, &c->counters.corrupt, 1);
    if (!mj_cache_readonly(c)) mj_cache_remove_damaged(path, &head); /* best effort */
    return mj_fail_prefix(MOEJIT_ERR_NOT_FOUND, "cache miss (the entry will be rebuilt)");
  }
  return st == MOEJIT_ERR_NOT_FOUND ? st : mj_fail_prefix(MOEJIT_ERR_NOT_FOUND, "cache miss");
}

/* ---- store ----------------------------------------------------------------- */

#define STORE_HINT                                                                    \
  "; HINT: the kernel stays in memory; free disk space or set MOEJIT_CACHE_DIR to a " \
  "writable directory"

static int write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Unique per process, thread and call; O_EXCL catches the rest. */
static uint32_t temp_suffix(void) {
  static atomic_uint counter;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^
               ((uint64_t)atomic_fetch_add(&counter, 1) << 20) ^ (uint64_t)(uintptr_t)&ts;
  x ^= x >> 31;
  x *= 0x9E3779B97F4A7C15ull; /* splitmix finaliser */
  x ^= x >> 29;
  return (uint32_t)x;
}

static int open_temp(const char *final_path, char *tmp, size_t cap) {
  for (int attempt = 0; attempt < 8; attempt++) {
    if (snprintf(tmp, cap, "%s.tmp.%ld.%08x", final_path, (long)getpid(), temp_suffix()) >=
        (int)cap) {
      errno = ENAMETOOLONG;
      return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  return -1;
}

static void stall(mj_cache *c) {
  int ms = atomic_load(&c->stall_ms);
  if (ms > 0) mj_sleep_us(ms * 1000L);
}

/* Header + metadata, then payload, fsync, close; errno set on failure. */
static int write_entry_fd(mj_cache *c, int fd, const unsigned char *head, size_t head_len,
                          const void *data, size_t len) {
  if (write_all(fd, head, head_len) != 0) return -1;
  if (atomic_load(&c->fault) == MJ_CACHE_FAULT_ENOSPC) {
    errno = ENOSPC;
    return -1;
  }
  if (write_all(fd, data, len) != 0 || fsync(fd) != 0) return -1;
  return 0;
}

/* 1 if `path` is a directory itself (not a symlink to one). */
static int is_real_dir(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The root may have been deleted since open (rm -rf of a cache in use):
 * recreate it rather than fail every later store. A fan-out directory must
 * be a directory itself: scans, eviction and maintenance never follow a
 * symlink there, so entries stored through one would never count against
 * the size limit. A symlink or file in its place is damage, replaced like
 * a damaged entry (the link goes, not what it points to). */
static moejit_status make_fanout_dir(mj_cache *c, const char *path) {
  for (int attempt = 0; attempt < 2; attempt++) {
    if (mkdir(path, 0755) == 0) return MOEJIT_OK;
    if (errno == EEXIST) {
      if (is_real_dir(path)) return MOEJIT_OK;
      if (unlink(path) != 0 && errno != ENOENT)
        return mj_fail(MOEJIT_ERR_CACHE,
                       "'%s' is a symlink or file in a fan-out directory's place, and removing "
                       "it failed: %s; remove it" STORE_HINT,
                       path, strerror(errno));
      continue;
    }
    if (errno == ENOENT && mj_mkdir_p(path, 0755) == MOEJIT_OK) {
      write_cachedir_tag(c->root);
      if (is_real_dir(path)) return MOEJIT_OK;
      continue;
    }
    break;
  }
  if (errno == 0 || errno == EEXIST || errno == ENOENT)
    return mj_fail(MOEJIT_ERR_CACHE,
                   "'%s' is not a directory (something keeps replacing the fan-out directory); "
                   "remove it" STORE_HINT,
                   path);
  return mj_fail(MOEJIT_ERR_CACHE, "cannot create '%s': %s" STORE_HINT, path, strerror(errno));
}

static moejit_status write_entry(mj_cache *c, const char *key, const mj_cache_meta *meta,
                                 const void *data, size_t len) {
  char path[MOEJIT_PATH_MAX + 64], tmp[MOEJIT_PATH_MAX + 128];
  unsigned char head[MJ_CACHE_HEADER_BYTES + MJ_CACHE_META_MAX];
  moejit_status st = mj_snprintf(path, sizeof path, "%s/%.2s", c->root, key);
  if (st != MOEJIT_OK) return st;
  if ((st = make_fanout_dir(c, path)) != MOEJIT_OK) return st;
  if ((st = mj_cache_entry_path(c->root, key, path, sizeof path)) != MOEJIT_OK) return st;
  size_t head_len = mj_cache_encode_head(key, meta, data, len, mj_unix_time(), head, sizeof head);
  int fd = open_temp(path, tmp, sizeof tmp);
  if (fd < 0)
    return mj_fail(MOEJIT_ERR_CACHE, "cannot create a temp file for '%s': %s" STORE_HINT, path,
                   strerror(errno));
  int rc = write_entry_fd(c, fd, head, head_len, data, len);
  int err = errno;
  if (close(fd) != 0 && rc == 0) rc = -1, err = errno;
  if (rc == 0) stall(c);
  if (rc == 0 && rename(tmp, path) != 0) rc = -1, err = errno;
  if (rc == 0) return MOEJIT_OK;
  unlink(tmp);
  return mj_fail(MOEJIT_ERR_CACHE, "cannot write cache entry '%s': %s" STORE_HINT, path,
                 strerror(err));
}

moejit_status mj_cache_store(mj_cache *c, const char *key, const mj_cache_meta *meta,
                             const void *data, size_t len) {
  if (!c || !data || len == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_cache_store: no data (a cubin is never empty)");
  if (!mj_cache_key_valid(key))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "invalid cache key '%s'", key ? key : "(null)");
  if (mj_cache_readonly(c)) {
    count(c, &c->counters.store_failures, 1);
    return mj_fail(MOEJIT_ERR_CACHE,
                   "cache directory '%s' is read-only: entry %s not stored" STORE_HINT, c->root,
                   key);
  }
  /* An entry larger than the whole limit would only evict everything else
   * and then itself. */
  if (c->max_bytes > 0 && (uint64_t)len + MJ_CACHE_HEADER_BYTES > c->max_bytes) {
    count(c, &c->counters.store_failures, 1);
    return mj_fail(MOEJIT_ERR_CACHE,
                   "entry %s (%zu bytes) is larger than the cache's size limit of %llu bytes: "
                   "not stored; HINT: the kernel stays in memory; raise MOEJIT_CACHE_MAXSIZE "
                   "(or the config's cache.max_size), or set it to 0 for no limit",
                   key, len, (unsigned long long)c->max_bytes);
  }
  moejit_status st = write_entry(c, key, meta, data, len);
  if (st != MOEJIT_OK) {
    count(c, &c->counters.store_failures, 1);
    return st;
  }
  count(c, &c->counters.stores, 1);
  size_t evicted = 0;
  if (c->max_bytes > 0) {
    mj_cache_evict_lru(c->root, c->max_bytes, &evicted, NULL); /* best effort */
    count(c, &c->counters.evictions, evicted);
  }
  return MOEJIT_OK;
}
