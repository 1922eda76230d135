/* libFuzzer harness for the cache-entry reader (src/cache): whatever bytes
 * sit in an entry file, reading it is a hit with exactly the stored payload
 * or a counted miss that removes the file, and verify/list agree. The first
 * input byte picks a mode:
 *   0  raw: the rest is the entry file as it lies on disk;
 *   1  repaired: magic, version, sizes and checksum are made consistent
 *      first, so that the metadata parser and the accept path get fuzzed;
 *   2  round trip: the rest gives metadata and a payload that are stored,
 *      loaded back, then truncated and bit-flipped (both must miss). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/cache.h"
#include "common/common.h"
#include "fuzz.h"

#define HEADER MJ_CACHE_HEADER_BYTES
#define OFF_PAYLOAD_BYTES 16
#define OFF_META_BYTES 24
#define OFF_CREATED 32
#define OFF_CHECKSUM 40
#define OFF_KEY 56

static const char fixed_key[] = "0123456789abcdef0123456789abcdef";
static char root[256];
static mj_cache *cache;

/* ---- the cache directory, one per process (tmpfs when there is one) --------- */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void remove_root(void) {
  mj_cache_close(cache);
  if (root[0]) nftw(root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void open_cache(void) {
  if (cache) return;
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(root, sizeof root, "%s/moejit-fuzz-cache-XXXXXX", base);
  FUZZ_REQUIRE(mkdtemp(root) != NULL, "mkdtemp %s: %s", root, strerror(errno));
  unsetenv("MOEJIT_CACHE_FAULT");
  unsetenv("MOEJIT_CACHE_TEST_STALL_MS");
  FUZZ_REQUIRE(mj_cache_open(root, 0, &cache) == MOEJIT_OK, "%s", moejit_last_error());
  atexit(remove_root);
}

/* ---- little helpers ----------------------------------------------------------- */

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void write_file(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FUZZ_REQUIRE(fd >= 0, "open %s: %s", path, strerror(errno));
  FUZZ_REQUIRE(len == 0 || write(fd, data, len) == (ssize_t)len, "write %s", path);
  close(fd);
}

static int file_exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

/* The entry's path, its fan-out directory created (and removed again by
 * remove_entry, or every later verify would scan up to 256 of them). */
static void entry_path(const char *key, char *path, size_t cap) {
  char sub[512];
  snprintf(sub, sizeof sub, "%s/%.2s", root, key);
  FUZZ_REQUIRE(mkdir(sub, 0755) == 0 || errno == EEXIST, "mkdir %s", sub);
  FUZZ_REQUIRE(mj_cache_entry_path(root, key, path, cap) == MOEJIT_OK, "%s", moejit_last_error());
}

static void remove_entry(const char *key, const char *path) {
  char sub[512];
  unlink(path);
  snprintf(sub, sizeof sub, "%s/%.2s", root, key);
  rmdir(sub);
}

static mj_cache_counters counters(void) {
  mj_cache_counters k;
  mj_cache_get_counters(cache, &k);
  return k;
}

/* ---- what every read must satisfy ---------------------------------------------- */

/* verify and list see the one entry under root the way the reader does. */
static void check_maintenance_agrees(const char *key, int good) {
  size_t ok = 9, bad = 9;
  FUZZ_REQUIRE(moejit_cache_verify(root, 0, &ok, &bad) == MOEJIT_OK, "%s", moejit_last_error());
  FUZZ_REQUIRE(ok == (size_t)good && bad == (size_t)!good, "verify: %zu ok %zu bad, reader: %d", ok,
               bad, good);
  moejit_cache_entry_info *list = NULL;
  size_t n = 0;
  FUZZ_REQUIRE(moejit_cache_list(root, &list, &n) == MOEJIT_OK, "%s", moejit_last_error());
  FUZZ_REQUIRE(n == 1 && strcmp(list[0].key, key) == 0 && list[0].ok == good,
               "list: %zu entries, ok %d, reader %d", n, n ? list[0].ok : -1, good);
  moejit_free(list);
}

/* Reads the entry at path three ways (reader, maintenance, cache handle)
 * and checks that they agree. Returns 1 on a hit; *data / *len then hold the
 * payload (caller frees). A miss must be counted as corrupt and remove the
 * file. */
static int read_all_ways(const char *path, const char *key, mj_cache_entry_head *head, void **data,
                         size_t *len) {
  moejit_status st = mj_cache_read_entry(path, key, head, data, len);
  FUZZ_REQUIRE(st == MOEJIT_OK || st == MOEJIT_ERR_CACHE, "read_entry status %d: %s", st,
               moejit_last_error());
  const int good = st == MOEJIT_OK;
  check_maintenance_agrees(key, good);
  mj_cache_counters before = counters();
  void *loaded = NULL;
  size_t loaded_len = 0;
  moejit_status ls = mj_cache_load(cache, key, &loaded, &loaded_len);
  mj_cache_counters after = counters();
  if (good) {
    FUZZ_REQUIRE(ls == MOEJIT_OK && loaded_len == *len && memcmp(loaded, *data, *len) == 0,
                 "load disagrees with read_entry: %d %s", ls, moejit_last_error());
  } else {
    FUZZ_REQUIRE(ls == MOEJIT_ERR_NOT_FOUND && !loaded && loaded_len == 0, "load status %d", ls);
    FUZZ_REQUIRE(after.corrupt == before.corrupt + 1, "a damaged entry was not counted");
    FUZZ_REQUIRE(!file_exists(path), "a damaged entry was left in a writable cache");
  }
  free(loaded);
  return good;
}

/* A hit returns exactly the bytes after header and metadata, and encoding
 * what was read reproduces the file's header and metadata byte for byte. */
static void check_hit(const unsigned char *file, size_t n, const char *key,
                      const mj_cache_entry_head *head, const void *data, size_t len) {
  const uint64_t meta_bytes = get_u64(file + OFF_META_BYTES);
  FUZZ_REQUIRE(head->header_ok && head->file_bytes == n, "head: ok %d, %llu bytes", head->header_ok,
               (unsigned long long)head->file_bytes);
  FUZZ_REQUIRE(len == n - HEADER - meta_bytes && memcmp(data, file + HEADER + meta_bytes, len) == 0,
               "payload differs from the file's");
  unsigned char again[HEADER + MJ_CACHE_META_MAX];
  size_t head_len =
      mj_cache_encode_head(key, &head->meta, data, len, head->created, again, sizeof again);
  FUZZ_REQUIRE(head_len == HEADER + meta_bytes && memcmp(again, file, head_len) == 0,
               "re-encoding a good entry gives other bytes");
}

/* ---- modes ----------------------------------------------------------------------- */

/* Key the file claims, when it is one, so that the key check passes and the
 * rest of the file gets examined. */
static const char *claimed_key(const unsigned char *file, size_t n, char key[33]) {
  if (n < HEADER) return fixed_key;
  memcpy(key, file + OFF_KEY, 32);
  key[32] = '\0';
  return mj_cache_key_valid(key) ? key : fixed_key;
}

static void check_file(const unsigned char *file, size_t n, const char *key) {
  char path[1024];
  entry_path(key, path, sizeof path);
  write_file(path, file, n);
  mj_cache_entry_head head;
  void *data = NULL;
  size_t len = 0;
  if (read_all_ways(path, key, &head, &data, &len)) check_hit(file, n, key, &head, data, len);
  free(data);
  remove_entry(key, path);
}

/* Makes everything but the metadata's content consistent. */
static void repair(unsigned char *file, size_t n) {
  memcpy(file, MJ_CACHE_MAGIC, 8);
  const uint32_t version = MJ_CACHE_FORMAT_VERSION, header = HEADER;
  for (int i = 0; i < 4; i++) {
    file[8 + i] = (unsigned char)(version >> (8 * i));
    file[12 + i] = (unsigned char)(header >> (8 * i));
  }
  const uint64_t room = n - HEADER - 1 < MJ_CACHE_META_MAX ? n - HEADER - 1 : MJ_CACHE_META_MAX;
  uint64_t meta = get_u64(file + OFF_META_BYTES);
  if (meta < 12 || meta > room) meta = 12 + meta % (room - 12 + 1);
  put_u64(file + OFF_META_BYTES, meta);
  put_u64(file + OFF_PAYLOAD_BYTES, n - HEADER - meta);
  memcpy(file + OFF_KEY, fixed_key, 32);
  XXH128_hash_t h = XXH3_128bits(file + HEADER, n - HEADER);
  XXH128_canonicalFromHash((XXH128_canonical_t *)(file + OFF_CHECKSUM), h);
}

static void mode_repaired(const unsigned char *body, size_t n) {
  if (n < HEADER + 13) { /* no room for 12 bytes of metadata and a payload */
    check_file(body, n, fixed_key);
    return;
  }
  unsigned char *file = malloc(n);
  FUZZ_REQUIRE(file != NULL, "out of memory");
  memcpy(file, body, n);
  repair(file, n);
  check_file(file, n, fixed_key);
  free(file);
}

/* Metadata strings of fuzzed lengths (NUL bytes included: the encoder stops
 * at them), then the payload. */
static size_t take_string(const unsigned char **p, size_t *n, char *out, size_t cap) {
  size_t want = *n ? **p % cap : 0;
  if (*n) ++*p, --*n;
  if (want > *n) want = *n;
  memcpy(out, *p, want);
  out[want] = '\0';
  *p += want, *n -= want;
  return want;
}

/* Stores, loads back, then damages the entry two ways: each must miss. */
static void mode_round_trip(const unsigned char *body, size_t n) {
  if (n < 3) return;
  size_t cut = body[0] | (size_t)body[1] << 8, flip = body[2];
  body += 3, n -= 3;
  mj_cache_meta meta;
  memset(&meta, 0, sizeof meta);
  take_string(&body, &n, meta.kernel, sizeof meta.kernel);
  take_string(&body, &n, meta.arch, sizeof meta.arch);
  take_string(&body, &n, meta.summary, sizeof meta.summary);
  if (n == 0) {
    FUZZ_REQUIRE(mj_cache_store(cache, fixed_key, &meta, body, 0) == MOEJIT_ERR_INVALID_ARGUMENT,
                 "an empty payload was stored");
    return;
  }
  FUZZ_REQUIRE(mj_cache_store(cache, fixed_key, &meta, body, n) == MOEJIT_OK, "%s",
               moejit_last_error());
  char path[1024];
  entry_path(fixed_key, path, sizeof path);
  char *file = NULL;
  size_t file_len = 0;
  FUZZ_REQUIRE(mj_read_file(path, &file, &file_len) == MOEJIT_OK, "%s", moejit_last_error());
  mj_cache_entry_head head;
  void *data = NULL;
  size_t len = 0;
  FUZZ_REQUIRE(read_all_ways(path, fixed_key, &head, &data, &len), "a fresh entry misses");
  FUZZ_REQUIRE(len == n && memcmp(data, body, n) == 0, "stored and loaded payloads differ");
  FUZZ_REQUIRE(!strcmp(head.meta.kernel, meta.kernel) && !strcmp(head.meta.arch, meta.arch) &&
                   !strcmp(head.meta.summary, meta.summary),
               "metadata changed on the way");
  free(data);
  /* A truncated copy misses. */
  write_file(path, file, cut % file_len);
  FUZZ_REQUIRE(!read_all_ways(path, fixed_key, &head, &data, &len), "a truncated entry hit");
  /* So does any changed byte, except in the creation time, which only
   * informs `moejit cache list` and is not covered by the checksum. */
  size_t at = (cut ^ flip * 2654435761u) % file_len;
  if (at < OFF_CREATED || at >= OFF_CREATED + 8) {
    file[at] ^= (char)(flip | 1);
    write_file(path, file, file_len);
    FUZZ_REQUIRE(!read_all_ways(path, fixed_key, &head, &data, &len), "byte %zu flipped: a hit",
                 at);
  }
  remove_entry(fixed_key, path);
  free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  open_cache();
  if (size == 0) return 0;
  const unsigned char *body = data + 1;
  const size_t n = size - 1;
  char key[33];
  switch (data[0] % 3) {
    case 0:
      check_file(body, n, claimed_key(body, n, key));
      break;
    case 1:
      mode_repaired(body, n);
      break;
    default:
      mode_round_trip(body, n);
  }
  return 0;
}
