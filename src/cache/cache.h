/* Internal face of the on-disk cubin cache (docs/cache.md). Entries are
 * files <root>/<first two hex digits of key>/<key>.mjc; each holds a fixed
 * header (magic, format version, sizes, XXH3-128 checksum), metadata and
 * the cubin. Writes are atomic (temp file + rename); a bad entry is a
 * counted miss. */
#ifndef MOEJIT_CACHE_H
#define MOEJIT_CACHE_H

#include <stdint.h>

#include "moejit/moejit.h"

/* Bump when the entry layout or key derivation changes; tests pin it. */
#define MJ_CACHE_FORMAT_VERSION 1

typedef struct mj_cache mj_cache;

typedef struct mj_cache_meta {
  char kernel[MOEJIT_NAME_MAX];
  char arch[MOEJIT_ARCH_MAX];
  char summary[192];
} mj_cache_meta;

typedef struct mj_cache_counters {
  uint64_t hits, misses, corrupt, stores, store_failures, evictions;
} mj_cache_counters;

/* 32 lowercase hex digits of XXH3-128 over the format version, source,
 * options string, NVRTC version and arch (length-prefixed fields). */
void mj_cache_key(const char *source, size_t source_len, const char *options, int nvrtc_major,
                  int nvrtc_minor, const char *arch, char key_out[33]);

/* Opens (creating if needed, with CACHEDIR.TAG) a cache at `dir`.
 * max_bytes 0: no limit. A directory that exists but cannot be written is
 * opened read-only (hits still served, stores skipped; mj_cache_readonly
 * says so); a path that cannot be created or read fails with CACHE. */
moejit_status mj_cache_open(const char *dir, uint64_t max_bytes, mj_cache **out);
void mj_cache_close(mj_cache *c);
const char *mj_cache_dir(const mj_cache *c);
int mj_cache_readonly(const mj_cache *c);

/* Hit: MOEJIT_OK with *data (malloc'd) and *len; touches last-used time.
 * Miss (absent, truncated, corrupt, foreign, other version): NOT_FOUND; a
 * bad entry is counted in `corrupt` and removed when writable. */
moejit_status mj_cache_load(mj_cache *c, const char *key, void **data, size_t *len);
/* Stores atomically, then evicts LRU entries past max_bytes. A failed store
 * (disk full, read-only) returns CACHE with a message; callers treat it as a
 * warning and keep the cubin in memory. */
moejit_status mj_cache_store(mj_cache *c, const char *key, const mj_cache_meta *meta,
                             const void *data, size_t len);
void mj_cache_get_counters(mj_cache *c, mj_cache_counters *out);

/* Resolve the default directory: $MOEJIT_CACHE_DIR, $XDG_CACHE_HOME/moejit,
 * ~/.cache/moejit. */
moejit_status mj_cache_default_dir(char *buf, size_t cap);
/* mj_snprintf for a cache directory's path: one longer than MOEJIT_PATH_MAX
 * allows is INVALID_ARGUMENT saying so, with a hint (a buffer shorter than
 * MOEJIT_PATH_MAX gets mj_snprintf's message). */
moejit_status mj_cache_dir_printf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Fault injection (tests; CI runs as root, so permissions cannot
 * simulate a read-only cache). mj_cache_open also reads
 * $MOEJIT_CACHE_FAULT=readonly|enospc and $MOEJIT_CACHE_TEST_STALL_MS. */
enum {
  MJ_CACHE_FAULT_NONE = 0,
  MJ_CACHE_FAULT_READONLY = 1, /* behave as if the directory were not writable */
  MJ_CACHE_FAULT_ENOSPC = 2    /* stores fail with ENOSPC after writing the header */
};
void mj_cache_set_fault(mj_cache *c, int fault);
/* Stores sleep this long between the fully written temp file and the
 * rename, so a test can kill a writer mid-store. 0: no stall. */
void mj_cache_set_stall_ms(mj_cache *c, int ms);

/* ---- Shared between the cache's own files and its tests. */

/* Entry header: magic[8] "MOEJITC\0", u32 version, u32 header bytes,
 * u64 payload bytes, u64 metadata bytes, i64 created, checksum[16], key[32];
 * all little-endian. Pinned by a test together with the format version. */
#define MJ_CACHE_HEADER_BYTES 88
#define MJ_CACHE_MAGIC "MOEJITC"
/* Metadata longer than this is not ours (the fields fit in ~300 bytes). */
#define MJ_CACHE_META_MAX 1024
/* Temp files older than these are leftovers: prune / verify(remove_bad). */
#define MJ_CACHE_TEMP_PRUNE_AGE_S 60
#define MJ_CACHE_TEMP_VERIFY_AGE_S 600

/* mj_cache_key with an explicit format version (tests show it is keyed). */
void mj_cache_key_versioned(uint32_t format_version, const char *source, size_t source_len,
                            const char *options, int nvrtc_major, int nvrtc_minor, const char *arch,
                            char key_out[33]);
/* 1 if `key` is exactly 32 lowercase hex digits. */
int mj_cache_key_valid(const char *key);
/* <root>/<first two hex digits>/<key>.mjc */
moejit_status mj_cache_entry_path(const char *root, const char *key, char *buf, size_t cap);

/* What an entry's header and metadata say, plus the file's identity. */
typedef struct mj_cache_entry_head {
  mj_cache_meta meta;
  int64_t created;
  uint64_t file_bytes;
  uint64_t dev, ino;
  int header_ok; /* 1: header and metadata parsed (meta, created valid) */
} mj_cache_entry_head;

/* Reads and fully validates the entry at `path` for `key`. With `data`
 * non-NULL the payload is returned (malloc'd) in *data / *len. Returns OK,
 * NOT_FOUND (no such file), CACHE (damaged: truncated, corrupt, foreign,
 * other version; the message says which), IO or OUT_OF_MEMORY. */
moejit_status mj_cache_read_entry(const char *path, const char *key, mj_cache_entry_head *head,
                                  void **data, size_t *len);
/* Encodes header + metadata for an entry into buf (cap >= HEADER_BYTES +
 * META_MAX); returns the number of bytes, 0 if it does not fit. */
size_t mj_cache_encode_head(const char *key, const mj_cache_meta *meta, const void *payload,
                            size_t len, int64_t created, unsigned char *buf, size_t cap);

/* One file the cache owns, found by a directory scan. */
#define MJ_CACHE_NAME_MAX 96
typedef struct mj_cache_file {
  char name[MJ_CACHE_NAME_MAX]; /* inside <root>/<key[0..1]>/ */
  char key[33];
  int is_temp;     /* a <key>.mjc.tmp.<pid>.<rand> leftover or in-flight write */
  int not_regular; /* an entry's name on a directory, FIFO, symlink...: damaged */
  long writer_pid; /* temp files: the pid in the name */
  uint64_t bytes;
  int64_t mtime_ns; /* last use (entries) or last write (temps) */
} mj_cache_file;

/* Every entry and temp file under root (other files are never touched). A
 * missing root is an empty cache. *files is malloc'd (may be NULL if n 0).
 * mtime_ns is clamped to what int64_t holds. */
moejit_status mj_cache_scan(const char *root, mj_cache_file **files, size_t *n);
moejit_status mj_cache_file_path(const char *root, const mj_cache_file *f, char *buf, size_t cap);
/* Sorts entries oldest use first (ties by name). */
void mj_cache_sort_lru(mj_cache_file *files, size_t n);
/* Deletes entries until the total of entry files is <= max_bytes: first
 * any entry larger than max_bytes by itself, then least recently used
 * first. An entry it cannot delete is reported (CACHE) and no longer
 * counted, so newer entries do not pay for it. Counts what it removed
 * (either pointer may be NULL), also when it returns an error. */
moejit_status mj_cache_evict_lru(const char *root, uint64_t max_bytes, size_t *n_removed,
                                 uint64_t *bytes_removed);
/* Removes a damaged entry unless a writer has renamed a fresh one over it
 * since it was read (the inode in head differs). 0 on success or already
 * gone, -1 with errno. */
int mj_cache_remove_damaged(const char *path, const mj_cache_entry_head *head);
/* unlink, or rmdir for an (empty) directory: 1 removed, 0 already gone,
 * -1 with errno. */
int mj_cache_unlink_any(const char *path);
/* 1 if a temp file is a leftover: older than max_age_s or, when check_pid,
 * written by a process that no longer exists. */
int mj_cache_temp_is_stale(const mj_cache_file *f, int64_t now_ns, int64_t max_age_s,
                           int check_pid);

#endif
