/* Tests of the on-disk cubin cache (src/cache): keys, the entry format,
 * round trips, damaged entries, faults, LRU eviction, maintenance calls
 * and moejit_parse_size. Concurrency lives in test_cache_concurrency.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/cache.h"
#include "common/common.h"
#include "moejit/moejit.h"
#include "test_support.h"

/* mj_cache_key("__global__ void k() {}", "-arch=sm_90a", NVRTC 12.8, "sm_90a")
 * for format version 1. */
#define GOLDEN_KEY "ca1bc67c816c8541fa79e664e604991c"

static char *dir;
static ts_rng rng;

static void setup(void) {
  dir = ts_mkdtemp("cache");
  cr_assert_not_null(dir);
  rng = ts_rng_fresh("test_cache");
}

static void teardown(void) {
  ts_rmtree(dir);
  free(dir);
}

TestSuite(cache, .init = setup, .fini = teardown);

/* ---- helpers ---------------------------------------------------------------- */

static unsigned char *random_bytes(size_t n) {
  unsigned char *p = malloc(n ? n : 1);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)ts_next(&rng);
  return p;
}

static void random_key(char key[33]) {
  char src[64];
  snprintf(src, sizeof src, "kernel source %llu", (unsigned long long)ts_next(&rng));
  mj_cache_key(src, strlen(src), "-arch=sm_90a", 12, 8, "sm_90a", key);
}

static mj_cache *open_cache(uint64_t max_bytes) {
  mj_cache *c = NULL;
  cr_assert_eq(mj_cache_open(dir, max_bytes, &c), MOEJIT_OK, "%s", moejit_last_error());
  return c;
}

static mj_cache_meta test_meta(const char *kernel) {
  mj_cache_meta m;
  memset(&m, 0, sizeof m);
  snprintf(m.kernel, sizeof m.kernel, "%s", kernel);
  snprintf(m.arch, sizeof m.arch, "sm_90a");
  snprintf(m.summary, sizeof m.summary, "test d=2048 f=768 E=128 k=8 bf16");
  return m;
}

static void store_ok(mj_cache *c, const char *key, const void *data, size_t len) {
  mj_cache_meta m = test_meta("gemm1");
  cr_assert_eq(mj_cache_store(c, key, &m, data, len), MOEJIT_OK, "%s", moejit_last_error());
}

static void entry_path(const char *key, char *buf, size_t cap) {
  cr_assert_eq(mj_cache_entry_path(dir, key, buf, cap), MOEJIT_OK);
}

static unsigned char *read_bytes(const char *path, size_t *len) {
  char *data = NULL;
  cr_assert_eq(mj_read_file(path, &data, len), MOEJIT_OK, "%s", moejit_last_error());
  return (unsigned char *)data;
}

static void write_bytes(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "cannot write %s", path);
  if (len) cr_assert_eq(fwrite(data, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
}

static void set_mtime(const char *path, time_t when) {
  struct timespec t[2] = {{when, 0}, {when, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, path, t, 0), 0, "utimensat %s: %s", path, strerror(errno));
}

static time_t mtime_of(const char *path) {
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  return sb.st_mtime;
}

static int exists(const char *path) {
  return access(path, F_OK) == 0;
}

static mj_cache_counters counters(mj_cache *c) {
  mj_cache_counters k;
  mj_cache_get_counters(c, &k);
  return k;
}

/* Loads `key` and asserts a counted miss of the given kind. */
static void expect_miss(mj_cache *c, const char *key, int corrupt) {
  mj_cache_counters before = counters(c);
  void *data = (void *)1;
  size_t len = 7;
  cr_assert_eq(mj_cache_load(c, key, &data, &len), MOEJIT_ERR_NOT_FOUND);
  cr_assert_null(data);
  cr_assert_eq(len, 0);
  mj_cache_counters after = counters(c);
  cr_assert_eq(after.misses, before.misses + 1);
  cr_assert_eq(after.corrupt, before.corrupt + (corrupt ? 1 : 0));
  cr_assert_eq(after.hits, before.hits);
}

static void expect_hit(mj_cache *c, const char *key, const void *want, size_t want_len) {
  void *data = NULL;
  size_t len = 0;
  cr_assert_eq(mj_cache_load(c, key, &data, &len), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(len, want_len);
  cr_assert_eq(memcmp(data, want, len), 0);
  free(data);
}

/* ---- keys -------------------------------------------------------------------- */

Test(cache, key_is_deterministic_lowercase_hex) {
  size_t n = 1 + ts_next(&rng) % 5000;
  char *src = (char *)random_bytes(n);
  char a[33], b[33];
  mj_cache_key(src, n, "-O3 --std=c++17", 12, 8, "sm_90a", a);
  mj_cache_key(src, n, "-O3 --std=c++17", 12, 8, "sm_90a", b);
  cr_assert_str_eq(a, b);
  cr_assert(mj_cache_key_valid(a), "key '%s' is not 32 lowercase hex digits", a);
  free(src);
}

Test(cache, key_changes_when_any_input_changes) {
  size_t n = 16 + ts_next(&rng) % 4000;
  char *src = (char *)random_bytes(n);
  char base[33], k[33];
  mj_cache_key(src, n, "-O3", 12, 8, "sm_90a", base);

  size_t at = ts_next(&rng) % n;
  char flip = (char)(1 + ts_next(&rng) % 255);
  src[at] ^= flip;
  mj_cache_key(src, n, "-O3", 12, 8, "sm_90a", k);
  cr_assert_str_neq(k, base, "flipping source byte %zu kept the key", at);
  src[at] ^= flip;
  mj_cache_key(src, n, "-O3", 12, 8, "sm_90a", k);
  cr_assert_str_eq(k, base);
  mj_cache_key(src, n - 1, "-O3", 12, 8, "sm_90a", k);
  cr_assert_str_neq(k, base, "a shorter source kept the key");
  const struct {
    const char *opts;
    int major, minor;
    const char *arch;
  } variants[] = {{"-O2", 12, 8, "sm_90a"}, {"-O3 ", 12, 8, "sm_90a"}, {"-O3", 13, 8, "sm_90a"},
                  {"-O3", 12, 9, "sm_90a"}, {"-O3", 12, 8, "sm_90"},   {"-O3", 12, 8, "sm_80"}};
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    mj_cache_key(src, n, variants[i].opts, variants[i].major, variants[i].minor, variants[i].arch,
                 k);
    cr_assert_str_neq(k, base, "variant %zu kept the key", i);
  }
  /* The format version is hashed: a bump invalidates every key. */
  mj_cache_key_versioned(MJ_CACHE_FORMAT_VERSION, src, n, "-O3", 12, 8, "sm_90a", k);
  cr_assert_str_eq(k, base);
  mj_cache_key_versioned(MJ_CACHE_FORMAT_VERSION + 1, src, n, "-O3", 12, 8, "sm_90a", k);
  cr_assert_str_neq(k, base);
  free(src);
}

Test(cache, key_fields_are_length_prefixed) {
  char a[33], b[33];
  mj_cache_key("ab", 2, "c", 12, 8, "sm_90a", a);
  mj_cache_key("a", 1, "bc", 12, 8, "sm_90a", b);
  cr_assert_str_neq(a, b, "moving a byte across the source/options boundary kept the key");
  mj_cache_key("x", 1, "-O3", 12, 8, "sm_90", a);
  mj_cache_key("x", 1, "-O3s", 12, 8, "m_90", b);
  cr_assert_str_neq(a, b);
}

Test(cache, invalid_keys_are_rejected) {
  mj_cache *c = open_cache(0);
  const char *bad[] = {"",
                       "abc",
                       "0123456789ABCDEF0123456789abcdef",
                       "../../../../etc/passwd000000000000",
                       "0123456789abcdef0123456789abcde",
                       "0123456789abcdef0123456789abcdef0"};
  unsigned char byte = 1;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    void *data;
    size_t len;
    cr_assert_eq(mj_cache_load(c, bad[i], &data, &len), MOEJIT_ERR_INVALID_ARGUMENT, "%s", bad[i]);
    cr_assert_eq(mj_cache_store(c, bad[i], NULL, &byte, 1), MOEJIT_ERR_INVALID_ARGUMENT);
  }
  cr_assert_eq(ts_count_files(dir, ".mjc"), 0);
  mj_cache_close(c);
}

/* ---- the format, pinned ------------------------------------------------------ */

/* If this fails you changed the entry layout or the key derivation: bump
 * MJ_CACHE_FORMAT_VERSION (old entries then miss instead of being misread),
 * update docs/cache.md, and update the numbers pinned here. */
Test(cache, format_version_and_layout_are_pinned) {
  cr_assert_eq(MJ_CACHE_FORMAT_VERSION, 1);
  cr_assert_eq(MJ_CACHE_HEADER_BYTES, 88);
  char key[33];
  mj_cache_key("__global__ void k() {}", 22, "-arch=sm_90a", 12, 8, "sm_90a", key);
  cr_assert_str_eq(key, GOLDEN_KEY, "key derivation changed: got %s", key);

  mj_cache_meta m = test_meta("route");
  const unsigned char payload[5] = {1, 2, 3, 4, 5};
  unsigned char head[MJ_CACHE_HEADER_BYTES + MJ_CACHE_META_MAX];
  size_t n = mj_cache_encode_head(key, &m, payload, 5, 0x0102030405060708ll, head, sizeof head);
  size_t meta_len = 12 + strlen(m.kernel) + strlen(m.arch) + strlen(m.summary);
  cr_assert_eq(n, 88 + meta_len);
  cr_assert_eq(memcmp(head, "MOEJITC\0", 8), 0);
  const unsigned char fixed[] = {1, 0, 0, 0, 88, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0};
  cr_assert_eq(memcmp(head + 8, fixed, sizeof fixed), 0, "version / header / payload bytes");
  cr_assert_eq(head[24], meta_len);
  const unsigned char created[] = {8, 7, 6, 5, 4, 3, 2, 1};
  cr_assert_eq(memcmp(head + 32, created, 8), 0, "created is little-endian i64");
  cr_assert_eq(memcmp(head + 56, key, 32), 0);
  /* metadata: u32 length + bytes, kernel / arch / summary */
  cr_assert_eq(head[88], strlen("route"));
  cr_assert_eq(memcmp(head + 92, "route", 5), 0);
  /* checksum: canonical XXH3-128 of metadata then payload */
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, head + 88, meta_len);
  XXH3_128bits_update(&st, payload, 5);
  XXH128_canonical_t sum;
  XXH128_canonicalFromHash(&sum, XXH3_128bits_digest(&st));
  cr_assert_eq(memcmp(head + 40, sum.digest, 16), 0);
}

/* ---- round trips ------------------------------------------------------------- */

Test(cache, store_load_round_trip_of_several_sizes) {
  mj_cache *c = open_cache(0);
  const size_t sizes[] = {1, 7, 88, 4096, 65536 + 13, (1u << 20) + 3, 1 + ts_next(&rng) % 300000};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char key[33];
    random_key(key);
    unsigned char *p = random_bytes(sizes[i]);
    expect_miss(c, key, 0);
    store_ok(c, key, p, sizes[i]);
    expect_hit(c, key, p, sizes[i]);
    free(p);
  }
  mj_cache_counters k = counters(c);
  cr_assert_eq(k.stores, 7);
  cr_assert_eq(k.hits, 7);
  cr_assert_eq(k.corrupt, 0);
  cr_assert_eq(ts_count_files(dir, ".tmp."), 0, "temp files left behind");
  mj_cache_close(c);
}

Test(cache, empty_cubin_is_rejected) {
  mj_cache *c = open_cache(0);
  char key[33];
  random_key(key);
  unsigned char b = 0;
  cr_assert_eq(mj_cache_store(c, key, NULL, &b, 0), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(mj_cache_store(c, key, NULL, NULL, 10), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ts_count_files(dir, ".mjc"), 0);
  mj_cache_close(c);
}

Test(cache, store_replaces_an_existing_entry_and_keeps_metadata) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  random_key(key);
  unsigned char *a = random_bytes(1000), *b = random_bytes(2000);
  store_ok(c, key, a, 1000);
  store_ok(c, key, b, 2000);
  expect_hit(c, key, b, 2000);
  entry_path(key, path, sizeof path);
  mj_cache_entry_head head;
  cr_assert_eq(mj_cache_read_entry(path, key, &head, NULL, NULL), MOEJIT_OK);
  cr_assert_str_eq(head.meta.kernel, "gemm1");
  cr_assert_str_eq(head.meta.arch, "sm_90a");
  cr_assert(head.created > time(NULL) - 60 && head.created <= time(NULL));
  cr_assert_eq(ts_count_files(dir, ".mjc"), 1);
  free(a);
  free(b);
  mj_cache_close(c);
}

Test(cache, open_creates_dir_and_cachedir_tag) {
  char sub[1024];
  snprintf(sub, sizeof sub, "%s/a/b/c/", dir);
  mj_cache *c = NULL;
  cr_assert_eq(mj_cache_open(sub, 0, &c), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(mj_cache_readonly(c), 0);
  char want[1024];
  snprintf(want, sizeof want, "%s/a/b/c", dir);
  cr_assert_str_eq(mj_cache_dir(c), want, "trailing slash kept");
  char tag[1100];
  snprintf(tag, sizeof tag, "%s/CACHEDIR.TAG", want);
  size_t len;
  char *text = (char *)read_bytes(tag, &len);
  cr_assert(!strncmp(text, "Signature: 8a477f597d28d172789f06886806bc55\n", 44), "%s", text);
  free(text);
  mj_cache_close(c);
}

Test(cache, store_recreates_a_cache_deleted_while_open) {
  mj_cache *c = open_cache(0);
  char key[33];
  random_key(key);
  unsigned char *p = random_bytes(300);
  store_ok(c, key, p, 300);
  ts_rmtree(dir);
  cr_assert(!exists(dir));
  expect_miss(c, key, 0);
  store_ok(c, key, p, 300);
  expect_hit(c, key, p, 300);
  char tag[1100];
  snprintf(tag, sizeof tag, "%s/CACHEDIR.TAG", dir);
  cr_assert(exists(tag));
  free(p);
  mj_cache_close(c);
}

/* A symlink in a fan-out directory's place would take entries where scans
 * never look (they do not follow it), so the size limit would not see
 * them: the store replaces it by a directory, and leaves its target
 * alone. A plain file there is replaced the same way. */
Test(cache, a_symlinked_or_file_fanout_dir_is_replaced_by_a_directory) {
  mj_cache *c = open_cache(0);
  char *elsewhere = ts_mkdtemp("cache-elsewhere");
  for (int kind = 0; kind < 2; kind++) {
    char key[33], fan[1100];
    random_key(key);
    snprintf(fan, sizeof fan, "%s/%.2s", dir, key);
    ts_rmtree(fan);
    if (kind == 0)
      cr_assert_eq(symlink(elsewhere, fan), 0, "symlink: %s", strerror(errno));
    else
      free(ts_write_file(dir, (char[3]){key[0], key[1], 0}, "not a directory"));
    unsigned char *p = random_bytes(500);
    store_ok(c, key, p, 500);
    struct stat sb;
    cr_assert_eq(lstat(fan, &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode), "kind %d: the fan-out is a directory now", kind);
    expect_hit(c, key, p, 500);
    cr_assert_eq(ts_count_files(elsewhere, NULL), 0, "nothing was written through the link");
    mj_cache_file *files = NULL;
    size_t n = 0;
    cr_assert_eq(mj_cache_scan(dir, &files, &n), MOEJIT_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++) found += strncmp(files[i].key, key, 32) == 0;
    cr_assert_eq(found, 1, "kind %d: scans count the entry", kind);
    free(files);
    free(p);
  }
  ts_rmtree(elsewhere);
  free(elsewhere);
  mj_cache_close(c);
}

Test(cache, open_refuses_a_file) {
  char *f = ts_write_file(dir, "plain", "x");
  mj_cache *c = (mj_cache *)1;
  cr_assert_eq(mj_cache_open(f, 0, &c), MOEJIT_ERR_CACHE);
  cr_assert_null(c);
  cr_assert(strstr(moejit_last_error(), "not a directory"), "%s", moejit_last_error());
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(f, &s), MOEJIT_ERR_CACHE);
  free(f);
}

/* ---- atomic writes and damaged entries ---------------------------------------- */

Test(cache, partial_temp_file_is_never_read) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048], tmp[2100];
  random_key(key);
  unsigned char *p = random_bytes(5000);
  store_ok(c, key, p, 5000);
  entry_path(key, path, sizeof path);
  size_t len;
  unsigned char *whole = read_bytes(path, &len);
  cr_assert_eq(unlink(path), 0);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d.%08x", path, (int)getpid(), 0xabcdefu);
  write_bytes(tmp, whole, len / 2); /* a writer that has not renamed yet */
  expect_miss(c, key, 0);
  cr_assert(exists(tmp), "a reader removed an in-flight temp file");
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.entries, 0);
  cr_assert_eq(s.temp_files, 1);
  free(whole);
  free(p);
  mj_cache_close(c);
}

Test(cache, truncated_entries_miss_and_are_rebuilt) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  random_key(key);
  unsigned char *p = random_bytes(3000);
  store_ok(c, key, p, 3000);
  entry_path(key, path, sizeof path);
  size_t len;
  unsigned char *whole = read_bytes(path, &len);
  size_t meta = len - 88 - 3000;
  const size_t cuts[] = {
      0, 1, 8, 40, 87, 88, 88 + meta / 2, 88 + meta, 88 + meta + 1, 88 + meta + 1500, len - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    write_bytes(path, whole, cuts[i]);
    expect_miss(c, key, 1);
    cr_assert(!exists(path), "damaged entry (cut at %zu) not removed", cuts[i]);
    store_ok(c, key, p, 3000);
    expect_hit(c, key, p, 3000);
  }
  /* Extra bytes after the payload are damage too. */
  unsigned char *longer = malloc(len + 1);
  memcpy(longer, whole, len);
  longer[len] = 0;
  write_bytes(path, longer, len + 1);
  expect_miss(c, key, 1);
  free(longer);
  free(whole);
  free(p);
  mj_cache_close(c);
}

Test(cache, flipped_byte_is_a_checksum_miss) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  random_key(key);
  unsigned char *p = random_bytes(4000);
  store_ok(c, key, p, 4000);
  entry_path(key, path, sizeof path);
  size_t len;
  unsigned char *whole = read_bytes(path, &len);
  size_t payload_at = len - 4000 + ts_next(&rng) % 4000;
  size_t meta_at = 88 + 4 + ts_next(&rng) % 5; /* inside the kernel name */
  const size_t flips[] = {payload_at, meta_at, 40 /* the checksum itself */};
  for (size_t i = 0; i < 3; i++) {
    whole[flips[i]] ^= (unsigned char)(1u << (ts_next(&rng) % 8));
    write_bytes(path, whole, len);
    expect_miss(c, key, 1);
    cr_assert(strstr(moejit_last_error(), "checksum"), "byte %zu: %s", flips[i],
              moejit_last_error());
    store_ok(c, key, p, 4000);
    free(whole);
    whole = read_bytes(path, &len);
  }
  free(whole);
  free(p);
  mj_cache_close(c);
}

Test(cache, foreign_files_with_an_entry_name_miss) {
  mj_cache *c = open_cache(0);
  char key[33], other[33], path[2048], other_path[2048];
  random_key(key);
  random_key(other);
  entry_path(key, path, sizeof path);
  unsigned char *p = random_bytes(600);
  store_ok(c, key, p, 600); /* also creates the fan-out directory */
  const char *text = "this is not a cubin\n";
  write_bytes(path, text, strlen(text));
  expect_miss(c, key, 1);
  unsigned char *junk = random_bytes(500);
  write_bytes(path, junk, 500);
  expect_miss(c, key, 1);
  /* A valid entry of another key, renamed: the stored key does not match. */
  store_ok(c, other, p, 600);
  entry_path(other, other_path, sizeof other_path);
  size_t len;
  unsigned char *whole = read_bytes(other_path, &len);
  write_bytes(path, whole, len);
  expect_miss(c, key, 1);
  cr_assert(strstr(moejit_last_error(), "another key"), "%s", moejit_last_error());
  /* A directory where the entry should be. */
  cr_assert_eq(mkdir(path, 0755), 0);
  expect_miss(c, key, 1);
  free(whole);
  free(junk);
  free(p);
  mj_cache_close(c);
}

Test(cache, entry_of_another_format_version_misses) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  random_key(key);
  unsigned char *p = random_bytes(700);
  store_ok(c, key, p, 700);
  entry_path(key, path, sizeof path);
  size_t len;
  unsigned char *whole = read_bytes(path, &len);
  whole[8] = (unsigned char)(MJ_CACHE_FORMAT_VERSION + 1); /* u32 LE version */
  write_bytes(path, whole, len);
  expect_miss(c, key, 1);
  cr_assert(strstr(moejit_last_error(), "format version 2"), "%s", moejit_last_error());
  free(whole);
  free(p);
  mj_cache_close(c);
}

/* ---- read-only caches and write failures ------------------------------------- */

Test(cache, readonly_fault_serves_hits_and_refuses_stores) {
  mj_cache *c = open_cache(0);
  char key[33], key2[33], bad[33], path[2048], bad_path[2048];
  random_key(key);
  random_key(key2);
  random_key(bad);
  unsigned char *p = random_bytes(900);
  store_ok(c, key, p, 900);
  store_ok(c, bad, p, 900);
  entry_path(key, path, sizeof path);
  entry_path(bad, bad_path, sizeof bad_path);
  write_bytes(bad_path, "junk", 4);
  set_mtime(path, 1000000);
  mj_cache_set_fault(c, MJ_CACHE_FAULT_READONLY);
  cr_assert_eq(mj_cache_readonly(c), 1);
  expect_hit(c, key, p, 900);
  cr_assert_eq(mtime_of(path), 1000000, "a read-only cache touched an entry");
  expect_miss(c, bad, 1);
  cr_assert(exists(bad_path), "a read-only cache removed a file");
  int files = ts_count_files(dir, NULL);
  cr_assert_eq(mj_cache_store(c, key2, NULL, p, 900), MOEJIT_ERR_CACHE);
  cr_assert(strstr(moejit_last_error(), "read-only"), "%s", moejit_last_error());
  cr_assert_eq(ts_count_files(dir, NULL), files, "a refused store wrote a file");
  cr_assert_eq(counters(c).store_failures, 1);
  free(p);
  mj_cache_close(c);
}

Test(cache, readonly_fault_from_environment) {
  mj_cache *c = open_cache(0);
  mj_cache_close(c);
  setenv("MOEJIT_CACHE_FAULT", "readonly", 1);
  c = open_cache(0);
  cr_assert_eq(mj_cache_readonly(c), 1);
  mj_cache_close(c);
  char missing[1024];
  snprintf(missing, sizeof missing, "%s/never", dir);
  cr_assert_eq(mj_cache_open(missing, 0, &c), MOEJIT_ERR_CACHE);
  cr_assert(!exists(missing));
  setenv("MOEJIT_CACHE_FAULT", "sometimes", 1);
  cr_assert_eq(mj_cache_open(dir, 0, &c), MOEJIT_ERR_INVALID_ARGUMENT);
  unsetenv("MOEJIT_CACHE_FAULT");
}

Test(cache, enospc_fault_fails_cleanly) {
  mj_cache *c = open_cache(0);
  char key[33];
  random_key(key);
  unsigned char *p = random_bytes(10000);
  mj_cache_set_fault(c, MJ_CACHE_FAULT_ENOSPC);
  cr_assert_eq(mj_cache_store(c, key, NULL, p, 10000), MOEJIT_ERR_CACHE);
  cr_assert(strstr(moejit_last_error(), strerror(ENOSPC)), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), "HINT"), "%s", moejit_last_error());
  cr_assert_eq(ts_count_files(dir, ".mjc"), 0, "temp or entry left after a failed write");
  cr_assert_eq(counters(c).store_failures, 1);
  expect_miss(c, key, 0);
  mj_cache_set_fault(c, MJ_CACHE_FAULT_NONE);
  store_ok(c, key, p, 10000);
  expect_hit(c, key, p, 10000);
  free(p);
  mj_cache_close(c);
}

Test(cache, enospc_fault_from_environment) {
  setenv("MOEJIT_CACHE_FAULT", "enospc", 1);
  mj_cache *c = open_cache(0);
  char key[33];
  random_key(key);
  unsigned char b[3] = {1, 2, 3};
  cr_assert_eq(mj_cache_store(c, key, NULL, b, 3), MOEJIT_ERR_CACHE);
  cr_assert_eq(ts_count_files(dir, ".mjc"), 0);
  mj_cache_close(c);
  unsetenv("MOEJIT_CACHE_FAULT");
}

Test(cache, permission_denied_opens_readonly) {
  if (geteuid() == 0) {
    teardown(); /* a skipped test does not reach .fini */
    dir = NULL;
    cr_skip_test(
        "running as root: permissions do not stop writes (the fault hook tests this path)");
  }
  mj_cache *c = open_cache(0);
  char key[33], key2[33];
  random_key(key);
  random_key(key2);
  unsigned char *p = random_bytes(100);
  store_ok(c, key, p, 100);
  mj_cache_close(c);
  char sub[1024];
  snprintf(sub, sizeof sub, "%s/%.2s", dir, key);
  cr_assert_eq(chmod(dir, 0555), 0);
  cr_assert_eq(chmod(sub, 0555), 0);
  c = open_cache(0);
  cr_assert_eq(mj_cache_readonly(c), 1);
  expect_hit(c, key, p, 100);
  cr_assert_eq(mj_cache_store(c, key2, NULL, p, 100), MOEJIT_ERR_CACHE);
  mj_cache_close(c);
  chmod(sub, 0755);
  chmod(dir, 0755);
  free(p);
}

/* ---- last use and eviction ----------------------------------------------------- */

Test(cache, hit_refreshes_last_use) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  random_key(key);
  unsigned char *p = random_bytes(64);
  store_ok(c, key, p, 64);
  entry_path(key, path, sizeof path);
  set_mtime(path, 1000000);
  expect_hit(c, key, p, 64);
  cr_assert(mtime_of(path) >= time(NULL) - 60, "last use not refreshed");
  free(p);
  mj_cache_close(c);
}

Test(cache, eviction_removes_least_recently_used_first) {
  mj_cache *c = open_cache(0);
  char keys[5][33], paths[5][2048];
  unsigned char *p = random_bytes(1000);
  for (int i = 0; i < 4; i++) {
    random_key(keys[i]);
    store_ok(c, keys[i], p, 1000);
    entry_path(keys[i], paths[i], sizeof paths[i]);
    set_mtime(paths[i], 1000000 + 1000 * i); /* 0 oldest ... 3 newest */
  }
  expect_hit(c, keys[0], p, 1000); /* 0 becomes the most recently used */
  mj_cache_close(c);
  struct stat sb;
  cr_assert_eq(stat(paths[0], &sb), 0);
  uint64_t entry_bytes = (uint64_t)sb.st_size;
  c = open_cache(3 * entry_bytes); /* room for three */
  random_key(keys[4]);
  store_ok(c, keys[4], p, 1000);
  entry_path(keys[4], paths[4], sizeof paths[4]);
  cr_assert(!exists(paths[1]) && !exists(paths[2]), "the two least recently used survived");
  cr_assert(exists(paths[0]) && exists(paths[3]) && exists(paths[4]));
  cr_assert_eq(counters(c).evictions, 2);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_leq(s.bytes, 3 * entry_bytes);
  free(p);
  mj_cache_close(c);
}

/* ---- directories ---------------------------------------------------------------- */

Test(cache, default_dir_precedence) {
  char buf[1024];
  setenv("MOEJIT_CACHE_DIR", "/tmp/mj-explicit", 1);
  setenv("XDG_CACHE_HOME", "/tmp/mj-xdg", 1);
  setenv("HOME", "/tmp/mj-home", 1);
  cr_assert_eq(mj_cache_default_dir(buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, "/tmp/mj-explicit");
  unsetenv("MOEJIT_CACHE_DIR");
  cr_assert_eq(mj_cache_default_dir(buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, "/tmp/mj-xdg/moejit");
  setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  cr_assert_eq(mj_cache_default_dir(buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, "/tmp/mj-home/.cache/moejit");
  unsetenv("XDG_CACHE_HOME");
  cr_assert_eq(moejit_cache_resolve_dir(NULL, buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, "/tmp/mj-home/.cache/moejit");
  cr_assert_eq(moejit_cache_resolve_dir("/some/where", buf, sizeof buf), MOEJIT_OK);
  cr_assert_str_eq(buf, "/some/where");
  unsetenv("HOME");
  cr_assert_eq(mj_cache_default_dir(buf, sizeof buf), MOEJIT_ERR_CACHE);
  cr_assert(strstr(moejit_last_error(), "MOEJIT_CACHE_DIR"), "%s", moejit_last_error());
  char tiny[8];
  cr_assert_eq(moejit_cache_resolve_dir("/a/long/path", tiny, sizeof tiny),
               MOEJIT_ERR_INVALID_ARGUMENT);
}

/* ---- maintenance ------------------------------------------------------------------ */

typedef struct populated {
  char keys[6][33];
  char bad_path[2048], stale_tmp[2100], old_tmp[2100], fresh_tmp[2100];
} populated;

/* Five good entries (last used at known times), one damaged, a temp file of
 * a dead writer, an old temp file of a live one, a fresh in-flight one, and
 * foreign files that must never be touched. */
static void populate(populated *pop) {
  mj_cache *c = open_cache(0);
  unsigned char *p = random_bytes(2000);
  char path[2048];
  for (int i = 0; i < 6; i++) {
    random_key(pop->keys[i]);
    mj_cache_meta m = test_meta(i % 2 ? "gemm2" : "route");
    cr_assert_eq(mj_cache_store(c, pop->keys[i], &m, p, 1000 + 100 * (size_t)i), MOEJIT_OK);
    entry_path(pop->keys[i], path, sizeof path);
    set_mtime(path, 2000000 - 1000 * i); /* later keys are older */
  }
  mj_cache_close(c);
  entry_path(pop->keys[5], pop->bad_path, sizeof pop->bad_path);
  size_t len;
  unsigned char *whole = read_bytes(pop->bad_path, &len);
  whole[len - 1] ^= 0xff;
  write_bytes(pop->bad_path, whole, len);
  set_mtime(pop->bad_path, 1000000); /* the oldest */
  free(whole);
  entry_path(pop->keys[0], path, sizeof path);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  cr_assert_gt(dead, 0);
  waitpid(dead, NULL, 0);
  snprintf(pop->stale_tmp, sizeof pop->stale_tmp, "%s.tmp.%d.0badc0de", path, (int)dead);
  snprintf(pop->old_tmp, sizeof pop->old_tmp, "%s.tmp.%d.00000001", path, (int)getpid());
  snprintf(pop->fresh_tmp, sizeof pop->fresh_tmp, "%s.tmp.%d.00000002", path, (int)getpid());
  write_bytes(pop->stale_tmp, "partial", 7);
  write_bytes(pop->old_tmp, "partial", 7);
  write_bytes(pop->fresh_tmp, "partial", 7);
  set_mtime(pop->old_tmp, time(NULL) - 11 * 60);
  free(ts_write_file(dir, "README.md", "not ours"));
  snprintf(path, sizeof path, "%s/%.2s/notes.txt", dir, pop->keys[0]);
  write_bytes(path, "not ours", 8);
  free(p);
}

Test(cache, stats_count_entries_bytes_and_temps) {
  populated pop;
  populate(&pop);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_str_eq(s.dir, dir);
  cr_assert_eq(s.entries, 6);
  cr_assert_eq(s.temp_files, 3);
  uint64_t want = 0;
  for (int i = 0; i < 6; i++) {
    char path[2048];
    entry_path(pop.keys[i], path, sizeof path);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    want += (uint64_t)sb.st_size;
  }
  cr_assert_eq(s.bytes, want);
  cr_assert_eq(s.oldest_used, 1000000);
  cr_assert_eq(s.newest_used, 2000000);
}

Test(cache, stats_of_a_missing_dir_are_empty) {
  char missing[1024];
  snprintf(missing, sizeof missing, "%s/none", dir);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(missing, &s), MOEJIT_OK);
  cr_assert_eq(s.entries + s.bytes + s.temp_files, 0);
  cr_assert_eq(s.oldest_used, 0);
  size_t n = 9;
  cr_assert_eq(moejit_cache_clear(missing, &n), MOEJIT_OK);
  cr_assert_eq(n, 0);
  cr_assert(!exists(missing), "a maintenance call created the directory");
}

Test(cache, list_is_oldest_first_and_flags_bad_entries) {
  populated pop;
  populate(&pop);
  moejit_cache_entry_info *e = NULL;
  size_t n = 0;
  cr_assert_eq(moejit_cache_list(dir, &e, &n), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(n, 6);
  cr_assert_str_eq(e[0].key, pop.keys[5]);
  cr_assert_eq(e[0].ok, 0, "the damaged entry verified");
  for (size_t i = 1; i < n; i++) {
    cr_assert_geq(e[i].last_used, e[i - 1].last_used);
    cr_assert_str_eq(e[i].key, pop.keys[5 - i]);
    cr_assert_eq(e[i].ok, 1);
    cr_assert_str_eq(e[i].kernel, (5 - i) % 2 ? "gemm2" : "route");
    cr_assert_str_eq(e[i].arch, "sm_90a");
    cr_assert_str_eq(e[i].summary, "test d=2048 f=768 E=128 k=8 bf16");
    cr_assert_eq(e[i].bytes, 88 + 12 + 5 + 6 + 32 + 1000 + 100 * (5 - i));
    cr_assert(e[i].created > time(NULL) - 60);
  }
  moejit_free(e);
}

Test(cache, verify_reports_and_removes_bad_entries_and_stale_temps) {
  populated pop;
  populate(&pop);
  size_t ok = 0, bad = 0;
  cr_assert_eq(moejit_cache_verify(dir, 0, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(ok, 5);
  cr_assert_eq(bad, 1);
  cr_assert(exists(pop.bad_path) && exists(pop.stale_tmp), "verify without remove_bad removed");
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(ok, 5);
  cr_assert_eq(bad, 1);
  cr_assert(!exists(pop.bad_path));
  cr_assert(!exists(pop.stale_tmp), "temp file of a dead writer kept");
  cr_assert(!exists(pop.old_tmp), "temp file older than 10 minutes kept");
  cr_assert(exists(pop.fresh_tmp), "a write in flight was removed");
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(bad, 0);
  cr_assert_eq(ts_count_files(dir, "notes.txt") + ts_count_files(dir, "README.md"), 2);
}

Test(cache, prune_evicts_lru_and_old_temps) {
  populated pop;
  populate(&pop);
  char fresh_but_old[2100];
  snprintf(fresh_but_old, sizeof fresh_but_old, "%s", pop.fresh_tmp);
  set_mtime(pop.fresh_tmp, time(NULL) - 90); /* a live pid, but older than a minute */
  size_t n = 0;
  uint64_t bytes = 0;
  cr_assert_eq(moejit_cache_prune(dir, 0, &n, &bytes), MOEJIT_OK);
  cr_assert_eq(n, 2, "prune with no limit removes only the temp files older than a minute");
  cr_assert_eq(bytes, 14);
  cr_assert(!exists(fresh_but_old) && !exists(pop.old_tmp));
  cr_assert(exists(pop.stale_tmp), "prune judges temp files by age only");
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.entries, 6);
  uint64_t limit = s.bytes / 2;
  cr_assert_eq(moejit_cache_prune(dir, limit, &n, &bytes), MOEJIT_OK);
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_leq(s.bytes, limit);
  cr_assert_eq(n, 6 - s.entries);
  cr_assert_gt(bytes, 0);
  char newest[2048];
  entry_path(pop.keys[0], newest, sizeof newest);
  cr_assert(exists(newest), "the most recently used entry was evicted");
  cr_assert(!exists(pop.bad_path), "the least recently used entry survived");
}

Test(cache, clear_removes_entries_and_temps_only) {
  populated pop;
  populate(&pop);
  size_t n = 0;
  cr_assert_eq(moejit_cache_clear(dir, &n), MOEJIT_OK);
  cr_assert_eq(n, 9);
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.entries + s.temp_files, 0);
  char tag[1100];
  snprintf(tag, sizeof tag, "%s/CACHEDIR.TAG", dir);
  cr_assert(exists(tag), "clear removed CACHEDIR.TAG");
  cr_assert_eq(ts_count_files(dir, "notes.txt") + ts_count_files(dir, "README.md"), 2);
}

/* ---- sizes ------------------------------------------------------------------------- */

Test(cache, parse_size_accepts_units_of_1024) {
  const struct {
    const char *text;
    uint64_t bytes;
  } ok[] = {{"0", 0},
            {"1048576", 1048576},
            {"500K", 500ull << 10},
            {"500k", 500ull << 10},
            {"500M", 500ull << 20},
            {"500MB", 500ull << 20},
            {"500mib", 500ull << 20},
            {"2G", 2ull << 30},
            {"2GiB", 2ull << 30},
            {"1T", 1ull << 40},
            {"7B", 7},
            {"16777215T", 16777215ull << 40},
            {"18446744073709551615", UINT64_MAX}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    uint64_t b = 1;
    cr_assert_eq(moejit_parse_size(ok[i].text, &b), MOEJIT_OK, "%s: %s", ok[i].text,
                 moejit_last_error());
    cr_assert_eq(b, ok[i].bytes, "%s", ok[i].text);
  }
}

Test(cache, parse_size_rejects_garbage) {
  const char *bad[] = {"",          "-1",
                       "-5M",       "M",
                       "1.5G",      "12X",
                       "5 M",       " 5",
                       "5MBB",      "5iB",
                       "0x10",      "18446744073709551616",
                       "16777216T", "99999999999999999999G"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t b = 42;
    cr_assert_eq(moejit_parse_size(bad[i], &b), MOEJIT_ERR_INVALID_ARGUMENT, "'%s' accepted",
                 bad[i]);
    cr_assert_eq(b, 42, "'%s' wrote a value", bad[i]);
    cr_assert(strstr(moejit_last_error(), "invalid size"), "%s", moejit_last_error());
  }
  uint64_t b;
  cr_assert_eq(moejit_parse_size(NULL, &b), MOEJIT_ERR_INVALID_ARGUMENT);
}

/* ---- odd objects, other users, limits (2026-11-27 review) ---------------------- */

/* Stores n random bytes under a fresh key; fills key and its entry's path. */
static unsigned char *store_random(mj_cache *c, char key[33], char path[2048], size_t n) {
  random_key(key);
  unsigned char *p = random_bytes(n);
  store_ok(c, key, p, n);
  entry_path(key, path, 2048);
  return p;
}

/* Runs fn in a child, as user `nobody` when the tests run as root (CI does):
 * permissions only bind an unprivileged user. Returns the child's exit code. */
static int as_other_user(int (*fn)(void *), void *arg) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(90);
    _exit(fn(arg));
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "child killed by signal %d", WTERMSIG(status));
  return WEXITSTATUS(status);
}

Test(cache, fifo_with_an_entry_name_misses_without_blocking) {
  alarm(20); /* an open that blocks on the FIFO fails the test instead of hanging it */
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  unsigned char *p = store_random(c, key, path, 400);
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkfifo(path, 0644), 0, "mkfifo: %s", strerror(errno));
  size_t ok = 9, bad = 9;
  cr_assert_eq(moejit_cache_verify(dir, 0, &ok, &bad), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(ok, 0);
  cr_assert_eq(bad, 1, "verify does not see the FIFO");
  moejit_cache_entry_info *e = NULL;
  size_t n = 0;
  cr_assert_eq(moejit_cache_list(dir, &e, &n), MOEJIT_OK);
  cr_assert_eq(n, 1);
  cr_assert_eq(e[0].ok, 0);
  moejit_free(e);
  expect_miss(c, key, 1); /* and the load removed it */
  cr_assert(!exists(path));
  store_ok(c, key, p, 400);
  expect_hit(c, key, p, 400);
  /* verify --fix removes one too */
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkfifo(path, 0644), 0);
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(bad, 1);
  cr_assert(!exists(path), "verify --fix left the FIFO");
  free(p);
  mj_cache_close(c);
}

Test(cache, directory_with_an_entry_name_is_repaired) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  unsigned char *p = store_random(c, key, path, 400);
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkdir(path, 0755), 0);
  size_t ok = 9, bad = 9, removed = 0;
  cr_assert_eq(moejit_cache_verify(dir, 0, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(bad, 1, "verify does not see the directory");
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.entries, 1);
  cr_assert_eq(s.bytes, 0);
  cr_assert_eq(moejit_cache_verify(dir, 1, &ok, &bad), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(!exists(path), "verify --fix left the empty directory");
  /* A load removes an empty one as well; the store after it lands. */
  cr_assert_eq(mkdir(path, 0755), 0);
  expect_miss(c, key, 1);
  store_ok(c, key, p, 400);
  expect_hit(c, key, p, 400);
  /* clear removes an empty one, and reports a non-empty one */
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(mkdir(path, 0755), 0);
  cr_assert_eq(moejit_cache_clear(dir, &removed), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(removed, 1);
  cr_assert(!exists(path));
  free(p);
  mj_cache_close(c);
}

typedef struct unreadable_case {
  const char *dir, *path;
} unreadable_case;

/* Exit codes: 0 all as expected, else the step that failed. */
static int verify_unreadable_child(void *arg) {
  const unreadable_case *u = arg;
  size_t ok = 9, bad = 9;
  moejit_status st = moejit_cache_verify(u->dir, 1, &ok, &bad);
  if (st != MOEJIT_ERR_IO) return 10;
  if (!strstr(moejit_last_error(), "may be good")) return 11;
  if (ok != 0 || bad != 0) return 12;
  if (access(u->path, F_OK) != 0) return 13; /* deleted */
  moejit_cache_entry_info *e = NULL;
  size_t n = 0;
  if (moejit_cache_list(u->dir, &e, &n) != MOEJIT_OK || n != 1) return 14;
  int ok_field = e[0].ok;
  moejit_free(e);
  return ok_field == -1 ? 0 : 15;
}

Test(cache, verify_keeps_entries_it_cannot_read) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  unsigned char *p = store_random(c, key, path, 400);
  mj_cache_close(c);
  cr_assert_eq(chmod(dir, 0755), 0);
  cr_assert_eq(chmod(path, geteuid() == 0 ? 0600 : 0000), 0); /* another user's, or none's */
  unreadable_case u = {dir, path};
  int rc = as_other_user(verify_unreadable_child, &u);
  chmod(path, 0644);
  cr_assert_eq(rc, 0,
               "step %d failed (10: status, 11: hint, 12: counts, 13: deleted, 14: "
               "list, 15: list's ok)",
               rc);
  cr_assert(exists(path));
  free(p);
}

typedef struct sticky_case {
  const char *dir;
  const unsigned char *data;
  char key[33], path[2048];
  uint64_t limit;
} sticky_case;

static int store_in_sticky_child(void *arg) {
  sticky_case *s = arg;
  mj_cache *c = NULL;
  if (mj_cache_open(s->dir, s->limit, &c) != MOEJIT_OK) return 10;
  mj_cache_meta m = test_meta("gemm1");
  if (mj_cache_store(c, s->key, &m, s->data, 1000) != MOEJIT_OK) return 11;
  int kept = access(s->path, F_OK) == 0;
  mj_cache_close(c);
  return kept ? 0 : 12;
}

Test(cache, store_in_a_shared_cache_keeps_its_own_entry) {
  if (geteuid() != 0) {
    teardown();
    dir = NULL;
    cr_skip_test("needs root: the other user's entries are made by root, the store by nobody");
  }
  /* A shared sticky cache (1777) over its limit with root's entries, which
   * nobody may delete: eviction must not fall back on the fresh entry. */
  mj_cache *c = open_cache(0);
  unsigned char *p = random_bytes(1000);
  sticky_case s = {.dir = dir, .data = p};
  char keys[4][33], paths[4][2048];
  for (int i = 0; i < 4; i++) {
    random_key(keys[i]);
    store_ok(c, keys[i], p, 1000);
    entry_path(keys[i], paths[i], sizeof paths[i]);
    set_mtime(paths[i], 1000000 + i);
  }
  mj_cache_close(c);
  random_key(s.key);
  entry_path(s.key, s.path, sizeof s.path);
  s.limit = 2500; /* two entries' room */
  for (int d = 0; d < 256; d++) {
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/%02x", dir, d);
    mkdir(sub, 0755);
    cr_assert_eq(chmod(sub, 01777), 0);
  }
  cr_assert_eq(chmod(dir, 01777), 0);
  int rc = as_other_user(store_in_sticky_child, &s);
  cr_assert_eq(rc, 0, "step %d failed (10: open, 11: store, 12: own entry evicted)", rc);
  for (int i = 0; i < 4; i++) cr_assert(exists(paths[i]), "nobody deleted root's entry");
  chmod(dir, 0755);
  free(p);
}

Test(cache, entry_larger_than_the_limit_is_not_stored_and_evicts_nothing) {
  mj_cache *c = open_cache(0);
  unsigned char *p = random_bytes(100 * 1024);
  char keys[10][33], big[33];
  for (int i = 0; i < 10; i++) {
    random_key(keys[i]);
    store_ok(c, keys[i], p, 4000);
  }
  mj_cache_close(c);
  c = open_cache(64 * 1024);
  random_key(big);
  mj_cache_meta m = test_meta("gemm1");
  cr_assert_eq(mj_cache_store(c, big, &m, p, 100 * 1024), MOEJIT_ERR_CACHE);
  cr_assert(strstr(moejit_last_error(), "larger than the cache's size limit"), "%s",
            moejit_last_error());
  cr_assert(strstr(moejit_last_error(), "MOEJIT_CACHE_MAXSIZE"), "%s", moejit_last_error());
  cr_assert_eq(counters(c).store_failures, 1);
  cr_assert_eq(counters(c).evictions, 0);
  for (int i = 0; i < 10; i++) expect_hit(c, keys[i], p, 4000);
  mj_cache_close(c);
  /* An oversized entry already there (stored under a larger limit) is
   * evicted first, however recently used: the others fit. */
  c = open_cache(0);
  store_ok(c, big, p, 100 * 1024);
  mj_cache_close(c);
  c = open_cache(64 * 1024);
  char small[33];
  random_key(small);
  store_ok(c, small, p, 4000);
  cr_assert_eq(counters(c).evictions, 1);
  expect_miss(c, big, 0);
  for (int i = 0; i < 10; i++) expect_hit(c, keys[i], p, 4000);
  expect_hit(c, small, p, 4000);
  free(p);
  mj_cache_close(c);
}

Test(cache, list_skips_entries_evicted_while_listing) {
  /* A child keeps storing under a tight limit (each store evicts) while the
   * parent lists: a vanished entry is not listed, never shown as bad. */
  char keys[8][33];
  for (int i = 0; i < 8; i++) random_key(keys[i]);
  unsigned char *p = random_bytes(4000);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    mj_cache *c = NULL;
    if (mj_cache_open(dir, 20 * 1024, &c) != MOEJIT_OK) _exit(1);
    mj_cache_meta m = test_meta("gemm1");
    for (int round = 0; round < 400; round++)
      for (int i = 0; i < 8; i++) mj_cache_store(c, keys[i], &m, p, 4000);
    _exit(0);
  }
  int shown_bad = 0, lists = 0, status;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    moejit_cache_entry_info *e = NULL;
    size_t n = 0;
    cr_assert_eq(moejit_cache_list(dir, &e, &n), MOEJIT_OK, "%s", moejit_last_error());
    for (size_t i = 0; i < n; i++) shown_bad += e[i].ok != 1;
    moejit_free(e);
    lists++;
  }
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_assert_eq(shown_bad, 0, "%d entries listed as not ok in %d lists", shown_bad, lists);
  free(p);
}

Test(cache, far_future_last_use_does_not_overflow) {
  mj_cache *c = open_cache(0);
  char old_key[33], future_key[33], old_path[2048], future_path[2048];
  unsigned char *p = random_bytes(1000);
  random_key(old_key);
  random_key(future_key);
  store_ok(c, old_key, p, 1000);
  store_ok(c, future_key, p, 1000);
  entry_path(old_key, old_path, sizeof old_path);
  entry_path(future_key, future_path, sizeof future_path);
  set_mtime(old_path, 1000000);
  struct timespec t[2] = {{(time_t)15032385535LL, 0}, {(time_t)15032385535LL, 0}}; /* 2446 */
  if (utimensat(AT_FDCWD, future_path, t, 0) != 0) {
    mj_cache_close(c);
    free(p);
    cr_skip_test("this file system does not take dates past 2262 (%s)", strerror(errno));
  }
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.oldest_used, 1000000);
  cr_assert_gt(s.newest_used, (int64_t)9000000000LL, "newest use %lld", (long long)s.newest_used);
  mj_cache_close(c);
  struct stat sb;
  cr_assert_eq(stat(old_path, &sb), 0);
  c = open_cache(2 * (uint64_t)sb.st_size + 100); /* room for two */
  char third[33];
  random_key(third);
  store_ok(c, third, p, 1000);
  cr_assert(!exists(old_path), "the least recently used entry survived");
  cr_assert(exists(future_path), "the entry dated 2446 was taken for the oldest");
  free(p);
  mj_cache_close(c);
}

Test(cache, truncated_cachedir_tag_is_repaired) {
  char tag[1100];
  snprintf(tag, sizeof tag, "%s/CACHEDIR.TAG", dir);
  write_bytes(tag, "Signature: 8a477f597", 20); /* a disk that filled mid-write */
  mj_cache *c = open_cache(0);
  mj_cache_close(c);
  size_t len;
  char *text = (char *)read_bytes(tag, &len);
  cr_assert_gt(len, 44);
  cr_assert(!strncmp(text, "Signature: 8a477f597d28d172789f06886806bc55\n", 44), "%.*s", (int)len,
            text);
  free(text);
  cr_assert_eq(ts_count_files(dir, "CACHEDIR.TAG.tmp"), 0, "temp file of the tag left behind");
  /* A whole tag is left as it is (its own text after the signature line). */
  const char *own = "Signature: 8a477f597d28d172789f06886806bc55\n# kept\n";
  write_bytes(tag, own, strlen(own));
  c = open_cache(0);
  mj_cache_close(c);
  text = (char *)read_bytes(tag, &len);
  cr_assert_eq(len, strlen(own));
  free(text);
}

Test(cache, temp_names_must_match_exactly) {
  mj_cache *c = open_cache(0);
  char key[33], path[2048];
  unsigned char *p = store_random(c, key, path, 100);
  mj_cache_close(c);
  const char *odd[] = {".tmp.+12.ab", ".tmp. 12.ab", ".tmp.012.ab", ".tmp.-3.ab", ".tmp.12.AB"};
  for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
    char name[2100];
    snprintf(name, sizeof name, "%s%s", path, odd[i]);
    write_bytes(name, "not ours", 8);
  }
  moejit_cache_stats s;
  cr_assert_eq(moejit_cache_stats_get(dir, &s), MOEJIT_OK);
  cr_assert_eq(s.temp_files, 0, "a foreign name counted as a temp file");
  size_t n = 0;
  cr_assert_eq(moejit_cache_clear(dir, &n), MOEJIT_OK);
  cr_assert_eq(n, 1, "clear removed foreign files");
  cr_assert_eq(ts_count_files(dir, ".mjc.tmp."), 5);
  free(p);
}
