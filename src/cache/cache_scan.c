/* Walking a cache directory: finding entries and temp files by their exact
 * name patterns (nothing else is ever touched), LRU eviction, and telling a
 * leftover temp file from a write in flight. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/common.h"

static int is_hex_lower(char ch) {
  return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
}

/* A fan-out directory: exactly two lowercase hex digits. */
static int is_fanout_name(const char *name) {
  return is_hex_lower(name[0]) && is_hex_lower(name[1]) && name[2] == '\0';
}

/* "<key>.mjc" (entry) or "<key>.mjc.tmp.<pid>.<hex>" (temp) whose key starts
 * with the fan-out directory's digits. Returns 1 and fills f, else 0. */
static int classify(const char *sub, const char *name, mj_cache_file *f) {
  for (int i = 0; i < 32; i++)
    if (!is_hex_lower(name[i])) return 0;
  if (strncmp(name, sub, 2) != 0 || strncmp(name + 32, ".mjc", 4) != 0) return 0;
  if (strlen(name) >= sizeof f->name) return 0;
  memset(f, 0, sizeof *f);
  memcpy(f->key, name, 32);
  strcpy(f->name, name);
  const char *rest = name + 36;
  if (*rest == '\0') return 1;
  if (strncmp(rest, ".tmp.", 5) != 0) return 0;
  if (rest[5] < '1' || rest[5] > '9') return 0; /* strtol would take " +12", "012" */
  char *end;
  errno = 0;
  long pid = strtol(rest + 5, &end, 10);
  if (errno || end == rest + 5 || pid <= 0 || *end != '.' || !end[1]) return 0;
  for (const char *p = end + 1; *p; p++)
    if (!is_hex_lower(*p)) return 0;
  f->is_temp = 1;
  f->writer_pid = pid;
  return 1;
}

typedef struct file_list {
  mj_cache_file *v;
  size_t n, cap;
} file_list;

static moejit_status push(file_list *l, const mj_cache_file *f) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    mj_cache_file *v = realloc(l->v, cap * sizeof *v);
    if (!v) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory scanning the cache");
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *f;
  return MOEJIT_OK;
}

/* Nanoseconds since the epoch, clamped: a file dated past 2262 (clock skew,
 * touch -d, a restored backup) must not overflow into "oldest". */
static int64_t mtime_ns_of(const struct stat *sb) {
  const int64_t max_s = INT64_MAX / 1000000000 - 1;
  int64_t s = (int64_t)sb->st_mtim.tv_sec;
  if (s > max_s) return max_s * 1000000000;
  if (s < -max_s) return -max_s * 1000000000;
  return s * 1000000000 + sb->st_mtim.tv_nsec;
}

/* Files vanish under us when other processes evict or rename: skip them.
 * Something other than a regular file under an entry's name (a directory,
 * FIFO, symlink, ...) is listed as `not_regular` so that verify can report
 * and remove it; under a temp file's name it is left alone. */
static moejit_status scan_fanout(int root_fd, const char *sub, file_list *l) {
  int fd = openat(root_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return MOEJIT_OK;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return MOEJIT_OK;
  }
  moejit_status st = MOEJIT_OK;
  struct dirent *e;
  while (st == MOEJIT_OK && (e = readdir(d))) {
    mj_cache_file f;
    struct stat sb;
    if (!classify(sub, e->d_name, &f)) continue;
    if (fstatat(fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(sb.st_mode)) {
      if (f.is_temp) continue;
      f.not_regular = 1;
    }
    f.bytes = f.not_regular ? 0 : (uint64_t)sb.st_size;
    f.mtime_ns = mtime_ns_of(&sb);
    st = push(l, &f);
  }
  closedir(d);
  return st;
}

moejit_status mj_cache_scan(const char *root, mj_cache_file **files, size_t *n) {
  *files = NULL;
  *n = 0;
  int root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0 && errno == ENOENT) return MOEJIT_OK; /* no cache yet: empty */
  if (root_fd < 0)
    return mj_fail(MOEJIT_ERR_CACHE, "cannot open cache directory '%s': %s", root, strerror(errno));
  DIR *d = fdopendir(dup(root_fd));
  if (!d) {
    close(root_fd);
    return mj_fail(MOEJIT_ERR_CACHE, "cannot list cache directory '%s': %s", root, strerror(errno));
  }
  file_list l = {0};
  moejit_status st = MOEJIT_OK;
  struct dirent *e;
  while (st == MOEJIT_OK && (e = readdir(d)))
    if (is_fanout_name(e->d_name)) st = scan_fanout(root_fd, e->d_name, &l);
  closedir(d);
  close(root_fd);
  if (st != MOEJIT_OK) {
    free(l.v);
    return st;
  }
  *files = l.v;
  *n = l.n;
  return MOEJIT_OK;
}

moejit_status mj_cache_file_path(const char *root, const mj_cache_file *f, char *buf, size_t cap) {
  return mj_snprintf(buf, cap, "%s/%.2s/%s", root, f->key, f->name);
}

static int by_lru(const void *a, const void *b) {
  const mj_cache_file *x = a, *y = b;
  if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
  return strcmp(x->name, y->name);
}

void mj_cache_sort_lru(mj_cache_file *files, size_t n) {
  if (n > 1) qsort(files, n, sizeof *files, by_lru);
}

/* Keeps only entries (drops temps and whatever is not a regular file) in
 * place; returns their total size. */
static uint64_t keep_entries(mj_cache_file *files, size_t *n) {
  uint64_t total = 0;
  size_t k = 0;
  for (size_t i = 0; i < *n; i++) {
    if (files[i].is_temp || files[i].not_regular) continue;
    total += files[i].bytes;
    files[k++] = files[i];
  }
  *n = k;
  return total;
}

moejit_status mj_cache_evict_lru(const char *root, uint64_t max_bytes, size_t *n_removed,
                                 uint64_t *bytes_removed) {
  mj_cache_file *files;
  size_t n, removed = 0;
  uint64_t freed = 0;
  moejit_status st = mj_cache_scan(root, &files, &n);
  if (st != MOEJIT_OK) return st;
  uint64_t total = keep_entries(files, &n);
  mj_cache_sort_lru(files, n);
  unsigned char *taken = calloc(n ? n : 1, 1);
  if (!taken) {
    free(files);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory evicting cache entries");
  }
  /* Entries larger than the whole limit go first, whatever their age: LRU
   * alone would delete every older entry before reaching one of them. Then
   * least recently used first. An entry that cannot be deleted (another
   * user's, in a shared sticky directory) leaves the total rather than
   * pushing the eviction on to newer entries, down to the one just stored. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n && total > max_bytes; i++) {
      if (taken[i] || (pass == 0 && files[i].bytes <= max_bytes)) continue;
      taken[i] = 1;
      total -= files[i].bytes; /* gone, already gone (ENOENT), or not ours to delete */
      char path[MOEJIT_PATH_MAX + 128];
      if (mj_cache_file_path(root, &files[i], path, sizeof path) != MOEJIT_OK) continue;
      if (unlink(path) == 0) {
        removed++;
        freed += files[i].bytes;
      } else if (errno != ENOENT && st == MOEJIT_OK) {
        st = mj_fail(MOEJIT_ERR_CACHE,
                     "cannot evict '%s': %s; HINT: check its owner and the directory's "
                     "permissions",
                     path, strerror(errno));
      }
    }
  }
  free(taken);
  free(files);
  if (n_removed) *n_removed = removed;
  if (bytes_removed) *bytes_removed = freed;
  return st;
}

int mj_cache_temp_is_stale(const mj_cache_file *f, int64_t now_ns, int64_t max_age_s,
                           int check_pid) {
  if (now_ns - f->mtime_ns > max_age_s * 1000000000) return 1;
  /* A pid from another pid namespace may look dead: its writer then sees
   * its rename fail, which is a harmless store failure. */
  return check_pid && kill((pid_t)f->writer_pid, 0) != 0 && errno == ESRCH;
}

int mj_cache_remove_damaged(const char *path, const mj_cache_entry_head *head) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
  if (head->ino && ((uint64_t)sb.st_ino != head->ino || (uint64_t)sb.st_dev != head->dev))
    return 0; /* replaced by a fresh entry since it was read */
  return mj_cache_unlink_any(path) < 0 ? -1 : 0;
}

int mj_cache_unlink_any(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return errno == ENOENT ? 0 : -1;
  /* A directory under an entry's name is removed only while empty. */
  if ((S_ISDIR(sb.st_mode) ? rmdir(path) : unlink(path)) == 0) return 1;
  return errno == ENOENT ? 0 : -1;
}
