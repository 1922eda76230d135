/* Public cache maintenance calls (moejit.h "Cache directory maintenance"):
 * stats, list, verify, prune, clear. Each works from one directory scan
 * and is safe while other processes read and write the same cache. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/common.h"

#define PATH_CAP (MOEJIT_PATH_MAX + 128)

moejit_status moejit_cache_resolve_dir(const char *dir, char *buf, size_t cap) {
  if (!buf || cap == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_cache_resolve_dir: no output buffer");
  return dir && *dir ? mj_cache_dir_printf(buf, cap, "%s", dir) : mj_cache_default_dir(buf, cap);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Resolves `dir` and scans it. */
static moejit_status scan_dir(const char *dir, char root[MOEJIT_PATH_MAX], mj_cache_file **files,
                              size_t *n) {
  moejit_status st = moejit_cache_resolve_dir(dir, root, MOEJIT_PATH_MAX);
  if (st != MOEJIT_OK) return st;
  return mj_cache_scan(root, files, n);
}

/* unlink that tolerates a file already gone (another process got there). */
static moejit_status remove_file(const char *root, const mj_cache_file *f, int *removed) {
  char path[PATH_CAP];
  *removed = 0;
  moejit_status st = mj_cache_file_path(root, f, path, sizeof path);
  if (st != MOEJIT_OK) return st;
  const int rc = mj_cache_unlink_any(path);
  *removed = rc == 1;
  if (rc < 0)
    return mj_fail(MOEJIT_ERR_CACHE,
                   "cannot remove '%s': %s; HINT: check the directory's "
                   "permissions",
                   path, strerror(errno));
  return MOEJIT_OK;
}

moejit_status moejit_cache_stats_get(const char *dir, moejit_cache_stats *stats) {
  if (!stats) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_cache_stats_get: stats is NULL");
  char root[MOEJIT_PATH_MAX];
  mj_cache_file *files;
  size_t n;
  moejit_status st = scan_dir(dir, root, &files, &n);
  if (st != MOEJIT_OK) return st;
  memset(stats, 0, sizeof *stats);
  memcpy(stats->dir, root, sizeof root);
  int dated = 0;
  for (size_t i = 0; i < n; i++) {
    if (files[i].is_temp) {
      stats->temp_files++;
      continue;
    }
    stats->entries++;
    if (files[i].not_regular) continue; /* damaged: no size, no use time */
    int64_t used = files[i].mtime_ns / 1000000000;
    if (!dated || used < stats->oldest_used) stats->oldest_used = used;
    if (!dated || used > stats->newest_used) stats->newest_used = used;
    dated = 1;
    stats->bytes += files[i].bytes;
  }
  free(files);
  return MOEJIT_OK;
}

/* Fills *info; *gone set if the entry vanished since the scan (another
 * process evicted or cleared it): it is then not listed. */
static moejit_status describe_entry(const char *root, const mj_cache_file *f,
                                    moejit_cache_entry_info *info, int *gone) {
  char path[PATH_CAP];
  mj_cache_entry_head head;
  memset(info, 0, sizeof *info);
  memcpy(info->key, f->key, sizeof info->key);
  info->bytes = f->bytes;
  info->last_used = f->mtime_ns / 1000000000;
  moejit_status st = mj_cache_file_path(root, f, path, sizeof path);
  if (st != MOEJIT_OK) return st;
  st = mj_cache_read_entry(path, f->key, &head, NULL, NULL);
  if (st == MOEJIT_ERR_OUT_OF_MEMORY) return st;
  *gone = st == MOEJIT_ERR_NOT_FOUND;
  /* 1 verified, 0 damaged, -1 not readable (permissions, I/O): not known
   * to be damaged. */
  info->ok = st == MOEJIT_OK ? 1 : st == MOEJIT_ERR_CACHE ? 0 : -1;
  if (head.header_ok) {
    mj_strlcpy(info->kernel, head.meta.kernel, sizeof info->kernel);
    mj_strlcpy(info->arch, head.meta.arch, sizeof info->arch);
    mj_strlcpy(info->summary, head.meta.summary, sizeof info->summary);
    info->created = head.created;
  }
  return MOEJIT_OK;
}

moejit_status moejit_cache_list(const char *dir, moejit_cache_entry_info **entries, size_t *n) {
  if (!entries || !n) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_cache_list: NULL output");
  *entries = NULL;
  *n = 0;
  char root[MOEJIT_PATH_MAX];
  mj_cache_file *files;
  size_t nf, k = 0;
  moejit_status st = scan_dir(dir, root, &files, &nf);
  if (st != MOEJIT_OK) return st;
  mj_cache_sort_lru(files, nf);
  moejit_cache_entry_info *out = calloc(nf ? nf : 1, sizeof *out);
  if (!out) st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory listing the cache");
  for (size_t i = 0; st == MOEJIT_OK && i < nf; i++) {
    int gone = 0;
    if (files[i].is_temp) continue;
    st = describe_entry(root, &files[i], &out[k], &gone);
    if (!gone) k++;
  }
  free(files);
  if (st != MOEJIT_OK) {
    free(out);
    return st;
  }
  *entries = out;
  *n = k;
  return MOEJIT_OK;
}

/* One entry for verify: 1 good, 0 bad (removed if asked), -1 vanished or
 * not checked (unreadable, out of memory: *first_err says so, nothing is
 * removed). Only an entry read and found damaged is bad: one that cannot be
 * read (another user's, a full descriptor table) may be good. */
static int verify_entry(const char *root, const mj_cache_file *f, int remove_bad,
                        moejit_status *first_err) {
  char path[PATH_CAP];
  mj_cache_entry_head head;
  moejit_status st = mj_cache_file_path(root, f, path, sizeof path);
  if (st == MOEJIT_OK) st = mj_cache_read_entry(path, f->key, &head, NULL, NULL);
  if (st == MOEJIT_OK) return 1;
  if (st == MOEJIT_ERR_NOT_FOUND) return -1;
  if (st != MOEJIT_ERR_CACHE) {
    if (*first_err == MOEJIT_OK && st == MOEJIT_ERR_IO) {
      char why[PATH_CAP + 128];
      mj_strlcpy(why, moejit_last_error(), sizeof why);
      st = mj_fail(st,
                   "%s; HINT: the entry was not checked and may be good: fix its "
                   "permissions, or run as its owner",
                   why);
    }
    if (*first_err == MOEJIT_OK) *first_err = st;
    return -1;
  }
  if (remove_bad && mj_cache_remove_damaged(path, &head) != 0 && *first_err == MOEJIT_OK)
    *first_err =
        mj_fail(MOEJIT_ERR_CACHE, "cannot remove bad entry '%s': %s", path, strerror(errno));
  return 0;
}

moejit_status moejit_cache_verify(const char *dir, int remove_bad, size_t *n_ok, size_t *n_bad) {
  char root[MOEJIT_PATH_MAX];
  mj_cache_file *files;
  size_t n, ok = 0, bad = 0;
  moejit_status st = scan_dir(dir, root, &files, &n), first_err = MOEJIT_OK;
  if (st != MOEJIT_OK) return st;
  int64_t now = now_ns();
  for (size_t i = 0; i < n; i++) {
    const mj_cache_file *f = &files[i];
    int removed;
    if (!f->is_temp) {
      int r = verify_entry(root, f, remove_bad, &first_err);
      ok += r == 1;
      bad += r == 0;
    } else if (remove_bad && mj_cache_temp_is_stale(f, now, MJ_CACHE_TEMP_VERIFY_AGE_S, 1) &&
               (st = remove_file(root, f, &removed)) != MOEJIT_OK && first_err == MOEJIT_OK) {
      first_err = st;
    }
  }
  free(files);
  if (n_ok) *n_ok = ok;
  if (n_bad) *n_bad = bad;
  return first_err;
}

/* Removes temp files older than MJ_CACHE_TEMP_PRUNE_AGE_S. */
static moejit_status prune_temps(const char *root, mj_cache_file *files, size_t n, size_t *removed,
                                 uint64_t *freed) {
  int64_t now = now_ns();
  moejit_status first_err = MOEJIT_OK;
  for (size_t i = 0; i < n; i++) {
    int gone;
    if (!files[i].is_temp || !mj_cache_temp_is_stale(&files[i], now, MJ_CACHE_TEMP_PRUNE_AGE_S, 0))
      continue;
    moejit_status st = remove_file(root, &files[i], &gone);
    if (st != MOEJIT_OK && first_err == MOEJIT_OK) first_err = st;
    *removed += (size_t)gone;
    *freed += gone ? files[i].bytes : 0;
  }
  return first_err;
}

moejit_status moejit_cache_prune(const char *dir, uint64_t max_bytes, size_t *n_removed,
                                 uint64_t *bytes_removed) {
  char root[MOEJIT_PATH_MAX];
  mj_cache_file *files;
  size_t n, removed = 0, evicted = 0;
  uint64_t freed = 0, evicted_bytes = 0;
  moejit_status st = scan_dir(dir, root, &files, &n);
  if (st != MOEJIT_OK) return st;
  st = prune_temps(root, files, n, &removed, &freed);
  free(files);
  if (max_bytes > 0) {
    moejit_status est = mj_cache_evict_lru(root, max_bytes, &evicted, &evicted_bytes);
    if (st == MOEJIT_OK) st = est;
  }
  if (n_removed) *n_removed = removed + evicted;
  if (bytes_removed) *bytes_removed = freed + evicted_bytes;
  return st;
}

moejit_status moejit_cache_clear(const char *dir, size_t *n_removed) {
  char root[MOEJIT_PATH_MAX];
  mj_cache_file *files;
  size_t n, removed = 0;
  moejit_status st = scan_dir(dir, root, &files, &n), first_err = MOEJIT_OK;
  if (st != MOEJIT_OK) return st;
  for (size_t i = 0; i < n; i++) {
    int gone;
    st = remove_file(root, &files[i], &gone);
    if (st != MOEJIT_OK && first_err == MOEJIT_OK) first_err = st;
    removed += (size_t)gone;
  }
  free(files);
  if (n_removed) *n_removed = removed;
  return first_err;
}
