/* Disk full while storing cubins, three ways: a real full file system (a
 * small tmpfs mounted in a private mount namespace, where the test may
 * mount), a real write failure that needs no privileges (RLIMIT_FSIZE:
 * EFBIG), and the injected ENOSPC fault (MOEJIT_CACHE_FAULT). Each failed
 * store is a CACHE error (cache layer) or a warning (compiler, CLI), leaves
 * no temp file, keeps the entries already there, and the compiler still
 * serves the kernel from memory. The cache's own fault tests are in
 * test_cache.c (enospc_fault_*). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "codegen_support.h"
#include "common/common.h"
#include "compile/compile.h"
#include "moejit/moejit.h"
#include "test_support.h"

#define N_FAMILIES 5

static char *tmp;
static char mnt[1024]; /* "" unless a tmpfs is mounted there */
static ts_rng rng;

static void setup(void) {
  unsetenv("MOEJIT_CACHE_FAULT");
  unsetenv("MOEJIT_CACHE_TEST_STALL_MS");
  unsetenv("MOEJIT_CACHE_DIR");
  unsetenv("MOEJIT_CACHE_DISABLE");
  unsetenv("MOEJIT_CACHE_MAXSIZE");
  unsetenv("MOEJIT_TEMPLATE_DIR");
  tmp = ts_mkdtemp("diskfull");
  cr_assert_not_null(tmp);
  rng = ts_rng_fresh("test_cache_diskfull");
}

static void teardown(void) {
  if (mnt[0]) umount2(mnt, MNT_DETACH);
  mnt[0] = '\0';
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(cache_diskfull, .init = setup, .fini = teardown, .timeout = 120);

/* ---- helpers ------------------------------------------------------------------- */

/* Mounts a tmpfs of `size` ("64k") at tmp/mnt in a mount namespace of this
 * test process alone (Criterion runs each test in its own process), so the
 * host never sees it. 0 with the reason where that is not allowed. */
static int mount_small_tmpfs(const char *size, char *why, size_t cap) {
  char opts[64];
  snprintf(mnt, sizeof mnt, "%s/mnt", tmp);
  cr_assert_eq(mkdir(mnt, 0755), 0);
  if (unshare(CLONE_NEWNS) != 0) {
    snprintf(why, cap, "unshare(CLONE_NEWNS): %s", strerror(errno));
  } else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    snprintf(why, cap, "making mounts private: %s", strerror(errno));
  } else if (snprintf(opts, sizeof opts, "size=%s", size),
             mount("moejit-test", mnt, "tmpfs", 0, opts) != 0) {
    snprintf(why, cap, "mount -t tmpfs: %s", strerror(errno));
  } else {
    return 1;
  }
  mnt[0] = '\0';
  return 0;
}

#define REQUIRE_TMPFS(size)                                                \
  do {                                                                     \
    char why_[256];                                                        \
    if (!mount_small_tmpfs(size, why_, sizeof why_)) {                     \
      teardown(); /* a skipped test does not reach .fini */                \
      tmp = NULL;                                                          \
      cr_skip_test(                                                        \
          "cannot mount a tmpfs here (%s); the RLIMIT_FSIZE and injected " \
          "tests cover the same path",                                     \
          why_);                                                           \
    }                                                                      \
  } while (0)

/* Writes junk into path until the file system is full; returns the bytes. */
static size_t fill_fs(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
  char block[1024];
  memset(block, 0x6a, sizeof block);
  size_t total = 0;
  for (;;) {
    ssize_t n = write(fd, block, sizeof block);
    if (n <= 0) break;
    total += (size_t)n;
  }
  cr_assert_eq(errno, ENOSPC, "filling %s stopped with %s", path, strerror(errno));
  close(fd);
  return total;
}

static void random_key(char key[33]) {
  char src[64];
  snprintf(src, sizeof src, "diskfull kernel %llu", (unsigned long long)ts_next(&rng));
  mj_cache_key(src, strlen(src), "-arch=sm_90a", 12, 8, "sm_90a", key);
}

static unsigned char *random_bytes(size_t n) {
  unsigned char *p = malloc(n);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)ts_next(&rng);
  return p;
}

/* Pre-creates the 256 fan-out directories (empty directories cost a tmpfs
 * no data pages), so that a full disk fails the entry write itself. */
static void make_fanout_dirs(const char *root) {
  cr_assert_eq(mj_mkdir_p(root, 0755), MOEJIT_OK, "%s", moejit_last_error());
  for (int i = 0; i < 256; i++) {
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/%02x", root, i);
    cr_assert(mkdir(sub, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", sub, strerror(errno));
  }
}

static void expect_store_fails(mj_cache *c, const char *root, size_t len, int err) {
  char key[33];
  random_key(key);
  unsigned char *p = random_bytes(len);
  mj_cache_counters before, after;
  mj_cache_get_counters(c, &before);
  cr_assert_eq(mj_cache_store(c, key, NULL, p, len), MOEJIT_ERR_CACHE, "a %zu-byte store passed",
               len);
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, strerror(err)), "message should say '%s': %s", strerror(err), msg);
  cr_assert(strstr(msg, "HINT"), "%s", msg);
  mj_cache_get_counters(c, &after);
  cr_assert_eq(after.store_failures, before.store_failures + 1);
  cr_assert_eq(ts_count_files(root, ".tmp."), 0, "a failed store left its temp file");
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(mj_cache_load(c, key, &data, &n), MOEJIT_ERR_NOT_FOUND);
  free(p);
}

static void store_and_check(mj_cache *c, const char *key, const unsigned char *p, size_t len) {
  cr_assert_eq(mj_cache_store(c, key, NULL, p, len), MOEJIT_OK, "%s", moejit_last_error());
}

static void expect_hit(mj_cache *c, const char *key, const unsigned char *p, size_t len) {
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(mj_cache_load(c, key, &data, &n), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(n == len && memcmp(data, p, len) == 0, "an earlier entry changed");
  free(data);
}

static moejit_compiler *new_compiler(const char *cache_dir) {
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.cache_dir = cache_dir;
  o.template_dir = cs_template_dir("good");
  o.jobs = 2;
  moejit_compiler *c = NULL;
  cr_assert_eq(moejit_compiler_create(&c, &o), MOEJIT_OK, "%s", moejit_last_error());
  return c;
}

/* Compiles every family with the store failing with `err`: each kernel
 * compiles, warns that it was not stored and why, nothing lands on disk, and
 * the cubins are served from memory afterwards. */
static void expect_compile_keeps_kernels_in_memory(const char *cache_dir, int err) {
  moejit_spec s;
  cs_random_spec(&rng, &s);
  moejit_compiler *c = new_compiler(cache_dir);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 0;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_eq(n, N_FAMILIES);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(r[i].status, MOEJIT_OK, "%s: %s", r[i].kernel, r[i].message);
    cr_assert_eq(r[i].cache_hit, 0);
    cr_assert(strstr(r[i].message, "not stored"), "%s: no warning: '%s'", r[i].kernel,
              r[i].message);
    cr_assert(strstr(r[i].message, strerror(err)), "%s: '%s'", r[i].kernel, r[i].message);
  }
  cr_assert_eq(ts_count_files(cache_dir, ".tmp."), 0, "temp files left behind");
  cr_assert_eq(ts_count_files(cache_dir, ".mjc"), 0, "entries written to a full disk");
  for (size_t i = 0; i < n; i++) {
    const void *cubin = NULL, *again = NULL;
    size_t len = 0, len2 = 0;
    int hit = 0;
    cr_assert_eq(mj_compiler_get_cubin(c, &s, r[i].kernel, "sm_90a", &cubin, &len, NULL, &hit),
                 MOEJIT_OK, "%s", moejit_last_error());
    cr_assert_eq(hit, 1, "%s was compiled again", r[i].kernel);
    cr_assert_eq(len, r[i].cubin_bytes);
    cr_assert_eq(mj_compiler_get_cubin(c, &s, r[i].kernel, "sm_90a", &again, &len2, NULL, NULL),
                 MOEJIT_OK);
    cr_assert_eq(cubin, again, "the same cubin in memory");
  }
  moejit_compiler_destroy(c);
}

/* Once there is room again, a new compiler stores every kernel. */
static void expect_compile_stores(const char *cache_dir) {
  moejit_spec s;
  cs_random_spec(&rng, &s);
  moejit_compiler *c = new_compiler(cache_dir);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 0;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(r[i].message[0], '\0', "%s: %s", r[i].kernel, r[i].message);
  cr_assert_eq(ts_count_files(cache_dir, ".mjc"), N_FAMILIES);
  moejit_compiler_destroy(c);
}

/* ---- a real full file system ---------------------------------------------------- */

Test(cache_diskfull, full_tmpfs_fails_stores_cleanly_and_keeps_entries) {
  REQUIRE_TMPFS("64k");
  char root[1100], junk[1100];
  snprintf(root, sizeof root, "%s/cache", mnt);
  snprintf(junk, sizeof junk, "%s/junk", mnt);
  mj_cache *c;
  cr_assert_eq(mj_cache_open(root, 0, &c), MOEJIT_OK, "%s", moejit_last_error());
  char key[33];
  random_key(key);
  unsigned char *small = random_bytes(2000);
  store_and_check(c, key, small, 2000);
  expect_store_fails(c, root, 200000, ENOSPC); /* larger than the file system */
  expect_hit(c, key, small, 2000);
  size_t filled = fill_fs(junk);
  cr_assert_gt(filled, 0);
  expect_store_fails(c, root, 100, ENOSPC); /* no room at all */
  expect_hit(c, key, small, 2000);
  cr_assert_eq(unlink(junk), 0);
  char key2[33];
  random_key(key2);
  store_and_check(c, key2, small, 2000); /* room again: stores work */
  expect_hit(c, key2, small, 2000);
  size_t ok = 0, bad = 0;
  cr_assert_eq(moejit_cache_verify(root, 0, &ok, &bad), MOEJIT_OK);
  cr_assert_eq(ok, 2);
  cr_assert_eq(bad, 0);
  free(small);
  mj_cache_close(c);
}

Test(cache_diskfull, full_tmpfs_compiler_serves_kernels_from_memory) {
  REQUIRE_TMPFS("4m"); /* room for five cubins once the junk is gone */
  char root[1100], junk[1100];
  snprintf(root, sizeof root, "%s/cache", mnt);
  snprintf(junk, sizeof junk, "%s/junk", mnt);
  make_fanout_dirs(root);
  fill_fs(junk);
  expect_compile_keeps_kernels_in_memory(root, ENOSPC);
  cr_assert_eq(unlink(junk), 0);
  expect_compile_stores(root);
}

/* ---- a real write failure without privileges ------------------------------------- */

/* Files this process writes stop at `bytes` (write fails with EFBIG;
 * SIGXFSZ ignored); pipes and the terminal are not affected. */
static struct rlimit limit_file_size(rlim_t bytes) {
  struct rlimit old, lim;
  cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, SIG_IGN);
  lim = old;
  lim.rlim_cur = bytes;
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0, "%s", strerror(errno));
  return old;
}

Test(cache_diskfull, file_size_limit_fails_stores_cleanly) {
  char root[1100];
  snprintf(root, sizeof root, "%s/cache", tmp);
  mj_cache *c;
  cr_assert_eq(mj_cache_open(root, 0, &c), MOEJIT_OK, "%s", moejit_last_error());
  char key[33];
  random_key(key);
  unsigned char *small = random_bytes(1000);
  store_and_check(c, key, small, 1000);
  struct rlimit old = limit_file_size(4096);
  expect_store_fails(c, root, 64 * 1024, EFBIG); /* header written, payload cut short */
  expect_hit(c, key, small, 1000);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  char key2[33];
  random_key(key2);
  store_and_check(c, key2, small, 1000);
  free(small);
  mj_cache_close(c);
}

Test(cache_diskfull, file_size_limit_compiler_serves_kernels_from_memory) {
  char root[1100];
  snprintf(root, sizeof root, "%s/cache", tmp);
  make_fanout_dirs(root);
  struct rlimit old = limit_file_size(512); /* less than any cubin */
  expect_compile_keeps_kernels_in_memory(root, EFBIG);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
  expect_compile_stores(root);
}

/* ---- the injected fault, through the library and the CLI -------------------------- */

Test(cache_diskfull, injected_enospc_compiler_serves_kernels_from_memory) {
  char root[1100];
  snprintf(root, sizeof root, "%s/cache", tmp);
  setenv("MOEJIT_CACHE_FAULT", "enospc", 1);
  expect_compile_keeps_kernels_in_memory(root, ENOSPC);
  unsetenv("MOEJIT_CACHE_FAULT");
  expect_compile_stores(root);
}

Test(cache_diskfull, injected_enospc_cli_warns_and_exits_0) {
  char *cfg = ts_write_file(tmp, "tiny.yaml",
                            "name: tiny\n"
                            "model: {hidden: 64, expert_width: 32, experts: 4, top_k: 2}\n"
                            "target: {arch: sm_90a}\n");
  char root[1100], tdir[1100], fault[64] = "MOEJIT_CACHE_FAULT=enospc";
  snprintf(root, sizeof root, "%s/cache", tmp);
  snprintf(tdir, sizeof tdir, "MOEJIT_TEMPLATE_DIR=%s", cs_template_dir("good"));
  const char *args[] = {"compile", cfg, "--cache-dir", root, NULL};
  const char *env[] = {fault, tdir, NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, env, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\n%s\n%s", rc, out, err);
  cr_assert_eq(ts_count_substr(out, "warning:"), N_FAMILIES, "%s", out);
  cr_assert(strstr(out, "not stored") && strstr(out, strerror(ENOSPC)), "%s", out);
  cr_assert_eq(ts_count_files(root, ".tmp."), 0);
  cr_assert_eq(ts_count_files(root, ".mjc"), 0);
  free(out);
  free(err);
  free(cfg);
}
