/* NVRTC and the public compiler, on the CPU: outputs for real archs, error
 * logs that name template files and lines, the include-dir search, the
 * cache path (miss, then hit from a new compiler), cache off, read-only
 * caches, emit files, and every embedded template x preset compiling. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "codegen_support.h"
#include "common/common.h"
#include "compile/compile.h"
#include "test_support.h"

static char *tmp;

static void setup(void) {
  unsetenv("MOEJIT_TEMPLATE_DIR");
  unsetenv("MOEJIT_CACHE_DIR");
  unsetenv("MOEJIT_CACHE_DISABLE");
  unsetenv("MOEJIT_CACHE_MAXSIZE");
  unsetenv("MOEJIT_CACHE_FAULT");
  unsetenv("MOEJIT_LINEINFO");
  tmp = ts_mkdtemp("compile");
}
static void teardown(void) {
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(compile, .init = setup, .fini = teardown, .timeout = 120);

#define GOOD cs_template_dir("good")
#define N_FAMILIES 5 /* route, align, gemm1, gemm2, combine */

static moejit_spec random_spec(const char *what) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh(what);
  cs_random_spec(&r, &s);
  return s;
}

static moejit_compiler *new_compiler(const char *cache_dir, const char *template_dir,
                                     const char *emit_dir, int disable) {
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.cache_dir = cache_dir;
  o.template_dir = template_dir;
  o.emit_dir = emit_dir;
  o.cache_disable = disable;
  o.jobs = 2;
  moejit_compiler *c = NULL;
  cr_assert_eq(moejit_compiler_create(&c, &o), MOEJIT_OK, "%s", moejit_last_error());
  return c;
}

static char *subdir(const char *name) {
  char *p = malloc(strlen(tmp) + strlen(name) + 2);
  sprintf(p, "%s/%s", tmp, name);
  return p;
}

/* ---- NVRTC --------------------------------------------------------------- */

Test(compile, nvrtc_version_and_archs) {
  int major = -1, minor = -1;
  moejit_nvrtc_version(&major, &minor);
  cr_assert_geq(major, 11);
  cr_assert_geq(minor, 0);
  char archs[1024];
  cr_assert_eq(moejit_nvrtc_archs(archs, sizeof archs), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert(strstr(archs, "sm_80 "), "%s", archs);
  cr_assert(strstr(archs, "sm_90 sm_90a"), "%s", archs);
  char small[4];
  cr_assert_eq(moejit_nvrtc_archs(small, sizeof small), MOEJIT_ERR_INVALID_ARGUMENT);
  /* Every listed arch, 'a' variants included, really compiles. */
  mj_kernel_source ks = {.family = "route", .template_name = "probe.cu"};
  ks.source = (char *)"extern \"C\" __global__ void probe(int *x) { x[threadIdx.x] = 1; }\n";
  ks.source_len = strlen(ks.source);
  char *save = NULL;
  for (char *a = strtok_r(archs, " ", &save); a; a = strtok_r(NULL, " ", &save)) {
    mj_compile_opts o = {.arch = a};
    void *cubin = NULL;
    size_t len = 0;
    cr_assert_eq(mj_nvrtc_compile(&ks, &o, NULL, NULL, &cubin, &len), MOEJIT_OK, "%s: %s", a,
                 moejit_last_error());
    cr_assert_gt(len, 0);
    free(cubin);
  }
}

Test(compile, include_dirs_hold_cuda_bf16) {
  const char *dir = mj_cuda_include_dir();
  cr_assert_not_null(dir, "no CUDA include dir");
  char path[1200];
  snprintf(path, sizeof path, "%s/cuda_bf16.h", dir);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "%s", path);
  const char *dirs[8];
  int n = mj_cuda_include_dirs(dirs, 8);
  cr_assert_geq(n, 1);
  for (int i = 0; i < n; i++) cr_assert_eq(stat(dirs[i], &st), 0, "%s", dirs[i]);
}

Test(compile, cuda_home_wins_and_a_bad_one_falls_back) {
  /* Each Criterion test runs in its own process, so the once-only search
   * starts fresh here. A CUDA_HOME without headers is skipped. */
  setenv("CUDA_HOME", tmp, 1);
  setenv("CUDA_PATH", "/usr/local/cuda", 1);
  const char *dir = mj_cuda_include_dir();
  cr_assert_not_null(dir);
  cr_assert_str_eq(dir, "/usr/local/cuda/include");
}

/* In a child (the header search runs once per process): with CUDA_HOME
 * set to `home` (NULL: the default search), the headers' digest and the
 * key moejit_compile reports for the first kernel. */
static void digest_and_key(const moejit_spec *s, const char *home, char digest[17], char key[33],
                           char dir[1024]) {
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fd[0]);
    if (home)
      setenv("CUDA_HOME", home, 1);
    else
      unsetenv("CUDA_HOME");
    unsetenv("CUDA_PATH");
    char out[17 + 33 + 1024] = {0};
    snprintf(out, 17, "%s", mj_cuda_headers_digest());
    const char *found = mj_cuda_include_dir();
    snprintf(out + 50, 1024, "%s", found ? found : "");
    moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 1);
    moejit_kernel_report r[N_FAMILIES];
    size_t n = 0;
    moejit_compile(c, s, "sm_90a", r, N_FAMILIES, &n);
    if (n) memcpy(out + 17, r[0].key, 33);
    moejit_compiler_destroy(c);
    _exit(write(fd[1], out, sizeof out) == (ssize_t)sizeof out ? 0 : 1);
  }
  close(fd[1]);
  char in[17 + 33 + 1024];
  cr_assert_eq(read(fd[0], in, sizeof in), (ssize_t)sizeof in);
  close(fd[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  memcpy(digest, in, 17);
  memcpy(key, in + 17, 33);
  memcpy(dir, in + 50, 1024);
}

/* The CUDA headers NVRTC reads are in the cache key by content: another
 * toolkit's headers (same NVRTC) make another key, the same headers found
 * elsewhere the same key. */
Test(compile, cache_key_follows_the_cuda_headers) {
  char base_digest[17], base_key[33], same_digest[17], same_key[33], edit_digest[17], edit_key[33];
  const moejit_spec s = random_spec("headers_key"); /* one spec for every child */
  char real[1024], other[1024];
  digest_and_key(&s, NULL, base_digest, base_key, real);
  cr_assert_neq(strcmp(base_digest, "none"), 0, "no CUDA headers found here");
  cr_assert_eq(strlen(base_key), 32);
  char cmd[4096];
  snprintf(
      cmd, sizeof cmd,
      "set -e; real='%s'; for d in same edit; do mkdir -p %s/$d/include; for f in \"$real\"/*; do "
      "ln -s \"$f\" %s/$d/include/; done; done;"
      "rm %s/edit/include/cuda_bf16.h; cp \"$real/cuda_bf16.h\" %s/edit/include/;"
      "echo '// another build of these headers' >> %s/edit/include/cuda_bf16.h",
      real, tmp, tmp, tmp, tmp, tmp);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  char same[1100], edit[1100];
  snprintf(same, sizeof same, "%s/same", tmp);
  snprintf(edit, sizeof edit, "%s/edit", tmp);
  digest_and_key(&s, same, same_digest, same_key, other);
  digest_and_key(&s, edit, edit_digest, edit_key, other);
  cr_expect_str_eq(same_digest, base_digest, "the same headers elsewhere");
  cr_expect_str_eq(same_key, base_key);
  cr_expect_str_neq(edit_digest, base_digest, "edited headers");
  cr_expect_str_neq(edit_key, base_key, "a cubin of other headers would be served");
}

/* The cache key names the NVRTC build (nvrtcVersion gives 13.0 for every
 * 13.0.x): the GNU build ID of the library holding nvrtcVersion, which is
 * a byte string found in that file. */
Test(compile, cache_key_names_the_nvrtc_build) {
  const char *id = mj_nvrtc_build_id();
  cr_assert_str_eq(id, mj_nvrtc_build_id(), "found once");
  Dl_info info;
  void *fn = dlsym(RTLD_DEFAULT, "nvrtcVersion");
  cr_assert(fn && dladdr(fn, &info) && info.dli_fname, "nvrtcVersion is not loaded");
  cr_assert(strstr(info.dli_fname, "nvrtc"), "NVRTC is a shared library here: %s", info.dli_fname);
  const size_t n = strlen(id);
  cr_assert(n >= 16 && n % 2 == 0 && strspn(id, "0123456789abcdef") == n,
            "'%s' is not the hex of a build ID (%s)", id, info.dli_fname);
  unsigned char want[32];
  for (size_t i = 0; i < n / 2; i++) cr_assert_eq(sscanf(id + 2 * i, "%2hhx", &want[i]), 1);
  char *text = NULL;
  size_t len = 0;
  cr_assert_eq(mj_read_file(info.dli_fname, &text, &len), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect(memmem(text, len, want, n / 2), "%s does not hold the bytes of build ID %s",
            info.dli_fname, id);
  free(text);
}

Test(compile, no_headers_anywhere_is_a_compile_error_with_hint) {
  setenv("CUDA_HOME", tmp, 1);
  unsetenv("CUDA_PATH");
  setenv("MOEJIT_TEST_CUDA_INCLUDE_DIRS", tmp, 1); /* stands in for the build-time list */
  cr_assert_null(mj_cuda_include_dir());
  const char *dirs[8];
  cr_assert_eq(mj_cuda_include_dirs(dirs, 8), 0);
  moejit_spec s = random_spec("no_headers");
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", GOOD, &ks), MOEJIT_OK);
  mj_compile_opts o = {.arch = "sm_90a"};
  void *cubin;
  size_t len;
  cr_assert_eq(mj_nvrtc_compile(&ks, &o, NULL, NULL, &cubin, &len), MOEJIT_ERR_COMPILE);
  cr_assert(strstr(moejit_last_error(), "HINT: set CUDA_HOME"), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), tmp), "lists what was tried: %s", moejit_last_error());
  mj_kernel_source_free(&ks);
}

Test(compile, good_templates_give_ptx_and_cubin_for_real_archs) {
  moejit_spec s = random_spec("good_compile");
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    for (const char *const *f = mj_kernel_families; *f; f++) {
      mj_kernel_source ks;
      cr_assert_eq(mj_codegen(&s, *f, archs[a], GOOD, &ks), MOEJIT_OK, "%s", moejit_last_error());
      mj_compile_opts o = {.arch = archs[a], .lineinfo = 1};
      char *ptx = NULL;
      void *cubin = NULL;
      size_t ptx_len = 0, cubin_len = 0;
      cr_assert_eq(mj_nvrtc_compile(&ks, &o, &ptx, &ptx_len, &cubin, &cubin_len), MOEJIT_OK,
                   "%s %s: %s", *f, archs[a], moejit_last_error());
      cr_assert_eq(memcmp(cubin, "\177ELF", 4), 0, "a cubin is an ELF file");
      cr_assert_eq(strlen(ptx), ptx_len);
      char target[32];
      snprintf(target, sizeof target, ".target %s", archs[a]);
      cr_assert(strstr(ptx, target), "PTX for %s lacks '%s'", archs[a], target);
      for (int e = 0; e < ks.n_entries; e++)
        cr_assert(strstr(ptx, ks.entries[e]), "PTX lacks entry %s", ks.entries[e]);
      free(ptx);
      free(cubin);
      mj_kernel_source_free(&ks);
    }
  }
}

/* The named section of a cubin (ELF64), or NULL. */
static const unsigned char *elf_section(const void *img, size_t len, const char *name,
                                        size_t *size) {
  const Elf64_Ehdr *eh = img;
  cr_assert(len >= sizeof *eh && eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) <= len);
  const Elf64_Shdr *sh = (const Elf64_Shdr *)((const char *)img + eh->e_shoff);
  const char *names = (const char *)img + sh[eh->e_shstrndx].sh_offset;
  for (int i = 0; i < eh->e_shnum; i++)
    if (strcmp(names + sh[i].sh_name, name) == 0) {
      cr_assert(sh[i].sh_offset + sh[i].sh_size <= len);
      *size = sh[i].sh_size;
      return (const unsigned char *)img + sh[i].sh_offset;
    }
  return NULL;
}

Test(compile, lineinfo_is_off_by_default_and_only_adds_debug_sections) {
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  cr_expect_eq(o.lineinfo, 0, "off without $MOEJIT_LINEINFO");
  static const struct {
    const char *value;
    int want;
  } env[] = {{"1", 1}, {"0", 0}, {"yes", 0}, {"", 0}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(env); i++) {
    setenv("MOEJIT_LINEINFO", env[i].value, 1);
    moejit_compiler_opts_init(&o);
    cr_expect_eq(o.lineinfo, env[i].want, "MOEJIT_LINEINFO='%s'", env[i].value);
  }
  unsetenv("MOEJIT_LINEINFO");

  /* Same source both ways: the SASS of every entry is byte for byte the
   * same; -lineinfo only adds the line tables. */
  moejit_spec s = random_spec("lineinfo");
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "align", "sm_90a", NULL, &ks), MOEJIT_OK, "%s", moejit_last_error());
  void *cubin[2] = {NULL, NULL};
  size_t len[2] = {0, 0};
  for (int li = 0; li < 2; li++) {
    mj_compile_opts co = {.arch = "sm_90a", .lineinfo = li};
    cr_assert_eq(mj_nvrtc_compile(&ks, &co, NULL, NULL, &cubin[li], &len[li]), MOEJIT_OK, "%s",
                 moejit_last_error());
  }
  size_t n = 0;
  cr_expect_null(elf_section(cubin[0], len[0], ".debug_line", &n), "no line table by default");
  cr_expect_not_null(elf_section(cubin[1], len[1], ".debug_line", &n), "-lineinfo: a line table");
  cr_expect_gt(len[1], len[0]);
  cr_assert_gt(ks.n_entries, 0);
  for (int e = 0; e < ks.n_entries; e++) {
    char name[160];
    snprintf(name, sizeof name, ".text.%s", ks.entries[e]);
    size_t n0 = 0, n1 = 0;
    const unsigned char *t0 = elf_section(cubin[0], len[0], name, &n0);
    const unsigned char *t1 = elf_section(cubin[1], len[1], name, &n1);
    cr_assert(t0 && t1, "%s in both cubins", name);
    cr_expect(n0 == n1 && memcmp(t0, t1, n0) == 0, "%s: the same SASS", name);
  }
  free(cubin[0]);
  free(cubin[1]);
  mj_kernel_source_free(&ks);
}

/* The shipped templates keep their constants out of the module: NVRTC gives
 * every namespace- or class-scope variable (a `static constexpr` one too,
 * even unused) storage in .nv.global.init, and the driver pays for each
 * such symbol at every module load (docs/codegen.md, "Constants"). Every
 * family of a random spec, the embedded templates, sm_90a. */
Test(compile, shipped_templates_give_modules_without_globals, .timeout = 300) {
  moejit_spec s = random_spec("no_globals");
  const char *families[] = {"route", "align", "gemm1", "gemm2", "combine", "ep"};
  for (size_t f = 0; f < MJ_ARRAY_LEN(families); f++) {
    mj_kernel_source ks;
    cr_assert_eq(mj_codegen(&s, families[f], "sm_90a", NULL, &ks), MOEJIT_OK, "%s",
                 moejit_last_error());
    const mj_compile_opts o = {.arch = "sm_90a"};
    void *cubin = NULL;
    size_t len = 0, n = 0;
    cr_assert_eq(mj_nvrtc_compile(&ks, &o, NULL, NULL, &cubin, &len), MOEJIT_OK, "%s: %s",
                 families[f], moejit_last_error());
    cr_expect_null(elf_section(cubin, len, ".nv.global.init", &n),
                   "%s: %zu bytes of initialized globals (a static constexpr at namespace or "
                   "class scope?)",
                   families[f], n);
    cr_expect_null(elf_section(cubin, len, ".nv.global", &n), "%s: %zu bytes of globals",
                   families[f], n);
    free(cubin);
    mj_kernel_source_free(&ks);
  }
}

/* A module of some entries (mj_codegen_entries) holds exactly those, with
 * the SASS the full module has for them: the layer's GEMM modules run the
 * code the GEMM tests check. For each GEMM family: the first entries of a
 * fresh random order, on a random spec, sm_90a. */
Test(compile, entry_subsets_hold_the_full_modules_sass) {
  moejit_spec s = random_spec("subsets");
  ts_rng r = ts_rng_fresh("subset entries");
  static const char *const families[] = {"gemm1", "gemm2"};
  for (int f = 0; f < 2; f++) {
    mj_kernel_source full, part;
    cr_assert_eq(mj_codegen(&s, families[f], "sm_90a", NULL, &full), MOEJIT_OK, "%s",
                 moejit_last_error());
    cr_assert_geq(full.n_entries, 3);
    int order[MJ_MAX_ENTRIES];
    for (int i = 0; i < full.n_entries; i++) order[i] = i;
    for (int i = full.n_entries - 1; i > 0; i--) {
      int j = (int)(ts_next(&r) % (uint64_t)(i + 1)), t = order[i];
      order[i] = order[j], order[j] = t;
    }
    mj_entry_set only = {0};
    const int want = 1 + (int)(ts_next(&r) % 2);
    for (int i = 0; i < want; i++) cr_assert(mj_entry_set_add(&only, full.entries[order[i]]));
    cr_assert_eq(mj_codegen_entries(&s, families[f], "sm_90a", NULL, &only, &part), MOEJIT_OK, "%s",
                 moejit_last_error());
    cr_expect_eq(part.n_entries, want);
    cr_expect(strncmp(part.source, "#define MJ_ENTRY_SUBSET 1\n", 26) == 0);
    const mj_compile_opts o = {.arch = "sm_90a"};
    void *cf = NULL, *cp = NULL;
    size_t lf = 0, lp = 0;
    cr_assert_eq(mj_nvrtc_compile(&full, &o, NULL, NULL, &cf, &lf), MOEJIT_OK, "%s",
                 moejit_last_error());
    cr_assert_eq(mj_nvrtc_compile(&part, &o, NULL, NULL, &cp, &lp), MOEJIT_OK, "%s",
                 moejit_last_error());
    cr_expect_lt(lp, lf);
    for (int e = 0; e < full.n_entries; e++) {
      char name[160];
      snprintf(name, sizeof name, ".text.%s", full.entries[e]);
      size_t nf = 0, np = 0;
      const unsigned char *tf = elf_section(cf, lf, name, &nf);
      const unsigned char *tp = elf_section(cp, lp, name, &np);
      int wanted = 0;
      for (int i = 0; i < want; i++) wanted |= order[i] == e;
      cr_assert_not_null(tf, "%s", name);
      if (!wanted) {
        cr_expect_null(tp, "%s: %s is not in the subset", families[f], name);
        continue;
      }
      cr_assert_not_null(tp, "%s: %s", families[f], name);
      cr_expect(nf == np && memcmp(tf, tp, nf) == 0, "%s: %s differs from the full module's",
                families[f], name);
    }
    free(cf), free(cp);
    mj_kernel_source_free(&part);
    mj_kernel_source_free(&full);
  }
}

static void expect_compile_error(const char *dir, const char *where) {
  moejit_spec s = random_spec("broken");
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", cs_template_dir(dir), &ks), MOEJIT_OK);
  mj_compile_opts o = {.arch = "sm_90a", .lineinfo = 1};
  void *cubin = (void *)1;
  size_t len = 1;
  cr_assert_eq(mj_nvrtc_compile(&ks, &o, NULL, NULL, &cubin, &len), MOEJIT_ERR_COMPILE);
  cr_assert_null(cubin);
  cr_assert_eq(len, 0);
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, "NVRTC could not compile kernel 'route' for sm_90a (template route.cu):\n"),
            "%s", msg);
  cr_assert(strstr(msg, where), "the log should point at %s:\n%s", where, msg);
  mj_kernel_source_free(&ks);
}

Test(compile, broken_template_names_its_file_and_line) {
  expect_compile_error("broken", "route.cu(6): error");
}

Test(compile, broken_common_header_names_its_file_and_line) {
  expect_compile_error("broken_common", "common/bad.cuh(3): error");
}

Test(compile, unsupported_arch_is_unsupported) {
  moejit_spec s = random_spec("unsupported_arch");
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_89a", GOOD, &ks), MOEJIT_OK); /* a well-formed name */
  mj_compile_opts o = {.arch = "sm_89a"};
  void *cubin;
  size_t len;
  moejit_status st = mj_nvrtc_compile(&ks, &o, NULL, NULL, &cubin, &len);
  cr_assert(st == MOEJIT_ERR_UNSUPPORTED || st == MOEJIT_ERR_COMPILE, "got %d: %s", st,
            moejit_last_error());
  mj_kernel_source_free(&ks);
}

/* ---- the compiler and its cache ------------------------------------------ */

static void check_reports(const moejit_kernel_report *r, size_t n, int want_hit) {
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(r[i].status, MOEJIT_OK, "%s: %s", r[i].kernel, r[i].message);
    cr_assert_eq(r[i].cache_hit, want_hit, "%s %s hit=%d", r[i].kernel, r[i].arch, r[i].cache_hit);
    cr_assert_eq(strlen(r[i].key), 32);
    cr_assert_eq(strspn(r[i].key, "0123456789abcdef"), 32);
    cr_assert_gt(r[i].cubin_bytes, 0);
    cr_assert_geq(r[i].ms, 0);
    cr_assert_str_eq(r[i].kernel, mj_kernel_families[i % N_FAMILIES]);
  }
}

Test(compile, first_compile_misses_second_compiler_hits) {
  moejit_spec s = random_spec("miss_then_hit");
  s.n_archs = 2;
  strcpy(s.archs[0], "sm_90a");
  strcpy(s.archs[1], "sm_80");
  char *cache = subdir("cache");
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  char dir[MOEJIT_PATH_MAX];
  cr_assert_eq(moejit_compiler_cache_dir(c, &s, dir, sizeof dir), MOEJIT_OK);
  cr_assert_str_eq(dir, cache);
  moejit_kernel_report r1[2 * N_FAMILIES], r2[2 * N_FAMILIES];
  size_t n = 0;
  cr_assert_eq(moejit_compile(c, &s, NULL, r1, 2 * N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_eq(n, 2 * N_FAMILIES);
  check_reports(r1, n, 0);
  cr_assert_str_eq(r1[0].arch, "sm_90a");
  cr_assert_str_eq(r1[N_FAMILIES].arch, "sm_80");
  cr_assert_eq(ts_count_files(cache, ".mjc"), 2 * N_FAMILIES);
  moejit_compiler_destroy(c);

  c = new_compiler(cache, GOOD, NULL, 0);
  cr_assert_eq(moejit_compile(c, &s, NULL, r2, 2 * N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  check_reports(r2, n, 1);
  for (size_t i = 0; i < n; i++) {
    cr_assert_str_eq(r1[i].key, r2[i].key);
    cr_assert_eq(r1[i].cubin_bytes, r2[i].cubin_bytes);
  }
  /* One arch only, and fewer report slots than kernels. */
  cr_assert_eq(moejit_compile(c, &s, "sm_80", r2, 2, &n), MOEJIT_OK);
  cr_assert_eq(n, N_FAMILIES, "n counts every kernel even past cap");
  cr_assert_str_eq(r2[0].key, r1[N_FAMILIES].key);
  moejit_compiler_destroy(c);
  free(cache);
}

Test(compile, cache_disable_env_and_option) {
  moejit_spec s = random_spec("cache_disable");
  char *cache = subdir("cache");
  setenv("MOEJIT_CACHE_DISABLE", "1", 1);
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  char dir[MOEJIT_PATH_MAX] = "x";
  cr_assert_eq(moejit_compiler_cache_dir(c, &s, dir, sizeof dir), MOEJIT_OK);
  cr_assert_str_eq(dir, "");
  moejit_kernel_report r[N_FAMILIES];
  size_t n;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  check_reports(r, n, 0);
  cr_assert_eq(ts_count_files(tmp, NULL), 0, "nothing written with the cache off");
  /* Same compiler: served from memory. */
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK);
  check_reports(r, n, 1);
  moejit_compiler_destroy(c);
  unsetenv("MOEJIT_CACHE_DISABLE");

  c = new_compiler(cache, GOOD, NULL, 1); /* the option */
  cr_assert_eq(moejit_compiler_cache_dir(c, &s, dir, sizeof dir), MOEJIT_OK);
  cr_assert_str_eq(dir, "");
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK);
  check_reports(r, n, 0);
  cr_assert_eq(ts_count_files(tmp, NULL), 0);
  moejit_compiler_destroy(c);
  free(cache);
}

Test(compile, cache_dir_precedence) {
  moejit_spec s = random_spec("cache_precedence");
  char dir[MOEJIT_PATH_MAX], want[MOEJIT_PATH_MAX + 32];
  setenv("HOME", "/tmp/home-of-test", 1);
  unsetenv("XDG_CACHE_HOME");
  moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 0);
  cr_assert_eq(moejit_compiler_cache_dir(c, NULL, dir, sizeof dir), MOEJIT_OK);
  cr_assert_str_eq(dir, "/tmp/home-of-test/.cache/moejit");
  setenv("XDG_CACHE_HOME", "relative-xdg", 1); /* ignored, as `moejit cache` ignores it */
  moejit_compiler_cache_dir(c, NULL, dir, sizeof dir);
  cr_assert_str_eq(dir, "/tmp/home-of-test/.cache/moejit");
  char maint[MOEJIT_PATH_MAX];
  cr_assert_eq(moejit_cache_resolve_dir(NULL, maint, sizeof maint), MOEJIT_OK);
  cr_assert_str_eq(maint, dir, "the compiler and the maintenance calls disagree");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  moejit_compiler_cache_dir(c, NULL, dir, sizeof dir);
  cr_assert_str_eq(dir, "/tmp/xdg/moejit");
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s/from-spec", tmp);
  moejit_compiler_cache_dir(c, &s, dir, sizeof dir);
  cr_assert_str_eq(dir, s.cache_dir);
  snprintf(want, sizeof want, "%s/from-env", tmp);
  setenv("MOEJIT_CACHE_DIR", want, 1);
  moejit_compiler_cache_dir(c, &s, dir, sizeof dir);
  cr_assert_str_eq(dir, want);
  moejit_compiler_destroy(c);
  char *opt = subdir("from-opts");
  c = new_compiler(opt, GOOD, NULL, 0);
  moejit_compiler_cache_dir(c, &s, dir, sizeof dir);
  cr_assert_str_eq(dir, opt);
  char small[8];
  cr_assert_eq(moejit_compiler_cache_dir(c, &s, small, sizeof small), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_compiler_destroy(c);
  free(opt);
}

Test(compile, bad_maxsize_env_is_reported) {
  moejit_spec s = random_spec("maxsize");
  setenv("MOEJIT_CACHE_MAXSIZE", "lots", 1);
  char *cache = subdir("cache");
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 99;
  cr_assert_neq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK);
  cr_assert(strstr(moejit_last_error(), "MOEJIT_CACHE_MAXSIZE"), "%s", moejit_last_error());
  cr_assert_eq(n, 0);
  moejit_compiler_destroy(c);
  free(cache);
}

Test(compile, emit_dir_gets_cu_ptx_cubin) {
  moejit_spec s = random_spec("emit");
  char *emit = subdir("emit/nested"), *cache = subdir("cache");
  moejit_compiler *c = new_compiler(cache, GOOD, emit, 0);
  moejit_kernel_report r[N_FAMILIES];
  size_t n;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  for (const char *const *f = mj_kernel_families; *f; f++) {
    const char *ext[] = {"cu", "ptx", "cubin"};
    for (int e = 0; e < 3; e++) {
      char path[1400];
      snprintf(path, sizeof path, "%s/%s.sm_90a.%s", emit, *f, ext[e]);
      char *data = NULL;
      size_t len = 0;
      cr_assert_eq(mj_read_file(path, &data, &len), MOEJIT_OK, "%s", moejit_last_error());
      cr_assert_gt(len, 0);
      if (e == 0) { /* the .cu is exactly what moejit_generate gives */
        char *src = NULL;
        cr_assert_eq(moejit_generate(c, &s, *f, "sm_90a", &src), MOEJIT_OK);
        cr_assert_str_eq(data, src);
        moejit_free(src);
      }
      if (e == 2) cr_assert_eq(memcmp(data, "\177ELF", 4), 0);
      free(data);
    }
  }
  cr_assert_eq(ts_count_files(emit, NULL), 3 * N_FAMILIES);
  /* A warm cache still emits every file (NVRTC runs again for the PTX). */
  ts_rmtree(emit);
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK);
  cr_assert_eq(ts_count_files(emit, NULL), 3 * N_FAMILIES);
  moejit_compiler_destroy(c);
  free(emit);
  free(cache);
}

Test(compile, readonly_cache_still_compiles_in_memory) {
  moejit_spec s = random_spec("readonly");
  char *cache = subdir("cache");
  cr_assert_eq(mj_mkdir_p(cache, 0755), MOEJIT_OK);
  setenv("MOEJIT_CACHE_FAULT", "readonly", 1); /* the cache layer's fault hook */
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  size_t n;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  check_reports(r, n, 0);
  cr_assert(strstr(r[0].message, "not stored"), "a warning says so: '%s'", r[0].message);
  cr_assert_eq(ts_count_files(cache, ".mjc"), 0);
  /* The runtime's path: the same cubin pointer, now without compiling. */
  const void *cubin1 = NULL, *cubin2 = NULL;
  size_t len1 = 0, len2 = 0;
  char key[33];
  int hit = -1;
  cr_assert_eq(mj_compiler_get_cubin(c, &s, "route", "sm_90a", &cubin1, &len1, key, &hit),
               MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(hit, 1);
  cr_assert_str_eq(key, r[0].key);
  cr_assert_eq(len1, r[0].cubin_bytes);
  cr_assert_eq(mj_compiler_get_cubin(c, &s, "route", "sm_90a", &cubin2, &len2, NULL, NULL),
               MOEJIT_OK);
  cr_assert_eq(cubin1, cubin2);
  moejit_compiler_destroy(c);
  free(cache);
}

/* With the embedded templates a request the compiler answered before (the
 * same spec, byte noise aside, family, arch and entries) takes its cubin
 * from memory without generating the source again; anything else that
 * changes the source generates it. A template directory (files that may
 * change) always generates. */
Test(compile, repeated_requests_skip_code_generation, .timeout = 300) {
  moejit_spec s = random_spec("memo");
  moejit_compiler *c = new_compiler(NULL, NULL, NULL, 1);
  const void *cubin[2] = {NULL, NULL};
  size_t len = 0;
  char key[2][33];
  int hit = -1;
  cr_assert_eq(mj_compiler_get_cubin(c, &s, "route", "sm_90a", &cubin[0], &len, key[0], &hit),
               MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(hit, 0, "compiled now");
  cr_assert_eq(mj_compiler_generated(c), 1);

  moejit_spec noisy = s; /* equal, with bytes past the name's NUL set */
  size_t used = strlen(noisy.name);
  if (used + 2 < sizeof noisy.name) noisy.name[used + 1] = 'x';
  cr_assert_eq(mj_compiler_get_cubin(c, &noisy, "route", "sm_90a", &cubin[1], &len, key[1], &hit),
               MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_eq(mj_compiler_generated(c), 1, "answered by the memo");
  cr_expect_eq(hit, 1);
  cr_expect_eq(cubin[1], cubin[0], "the same cubin");
  cr_expect_str_eq(key[1], key[0]);

  /* Another family, another entry set, another spec: new sources. */
  mj_kernel_source full;
  cr_assert_eq(mj_codegen(&s, "align", "sm_90a", NULL, &full), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_gt(full.n_entries, 1);
  mj_entry_set one = {.n = 1, .name = {full.entries[0]}};
  long want = 1;
  const struct {
    const moejit_spec *spec;
    const char *family, *arch;
    const mj_entry_set *only;
  } other[] = {{&s, "align", "sm_90a", NULL}, {&s, "align", "sm_90a", &one}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(other); i++) {
    cr_assert_eq(mj_compiler_get_cubin_entries(c, other[i].spec, other[i].family, other[i].arch,
                                               other[i].only, &cubin[1], &len, key[1], &hit),
                 MOEJIT_OK, "%s", moejit_last_error());
    cr_expect_eq(mj_compiler_generated(c), ++want, "request %zu generates", i);
    cr_assert_eq(mj_compiler_get_cubin_entries(c, other[i].spec, other[i].family, other[i].arch,
                                               other[i].only, &cubin[0], &len, key[0], &hit),
                 MOEJIT_OK, "%s", moejit_last_error());
    cr_expect_eq(mj_compiler_generated(c), want, "request %zu again: the memo", i);
    cr_expect_eq(cubin[0], cubin[1]);
  }
  moejit_spec renamed = s; /* the name is in the source's header */
  snprintf(renamed.name, sizeof renamed.name, "memo_other");
  cr_assert_eq(mj_compiler_get_cubin(c, &renamed, "route", "sm_90a", &cubin[1], &len, key[1], &hit),
               MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_eq(mj_compiler_generated(c), ++want, "another spec generates");
  mj_kernel_source_free(&full);
  moejit_compiler_destroy(c);

  c = new_compiler(NULL, GOOD, NULL, 1);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mj_compiler_get_cubin(c, &s, "route", "sm_90a", &cubin[i], &len, key[i], &hit),
                 MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_eq(mj_compiler_generated(c), 2, "a template directory generates every time");
  cr_expect_eq(cubin[0], cubin[1], "and finds the cubin in memory by its key");
  moejit_compiler_destroy(c);
}

/* An explicit arch is held to the spec's config rules before anything is
 * generated: a cluster tile below sm_90, an 'a' arch before sm_90, an arch
 * no config may name; moejit_spec_validate_arch refuses "auto". */
Test(compile, explicit_archs_follow_the_config_rules) {
  moejit_spec s = random_spec("explicit_arch");
  s.gemm1.cluster_m = 2, s.gemm1.cluster_n = 1;
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 99;
  static const char *const bad[] = {"sm_80", "sm_80a", "sm_75"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    cr_expect_eq(moejit_compile(c, &s, bad[i], r, N_FAMILIES, &n), MOEJIT_ERR_INVALID_ARGUMENT,
                 "%s: %s", bad[i], moejit_last_error());
    cr_expect(strstr(moejit_last_error(), bad[i]), "%s", moejit_last_error());
    char *src = (char *)1;
    cr_expect_eq(moejit_generate(c, &s, "route", bad[i], &src), MOEJIT_ERR_INVALID_ARGUMENT,
                 "generate %s", bad[i]);
    cr_expect_null(src);
  }
  cr_expect(strstr(moejit_last_error(), "cluster") || strstr(moejit_last_error(), "sm_75"), "%s",
            moejit_last_error());
  cr_expect_eq(mj_compiler_generated(c), 0, "nothing was generated");
  char *src = NULL;
  cr_expect_eq(moejit_generate(c, &s, "route", "sm_90a", &src), MOEJIT_OK, "%s",
               moejit_last_error());
  moejit_free(src);
  cr_expect_eq(moejit_spec_validate_arch(&s, "auto"), MOEJIT_ERR_CONFIG);
  cr_expect(strstr(moejit_last_error(), "'auto'"), "%s", moejit_last_error());
  moejit_compiler_destroy(c);
}

Test(compile, unusable_cache_dir_is_a_warning) {
  moejit_spec s = random_spec("unusable_cache");
  char *file = ts_write_file(tmp, "a-file", "not a directory\n");
  char *cache = subdir("a-file/cache");
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  size_t n;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  check_reports(r, n, 0);
  cr_assert(strstr(r[0].message, "cache unusable"), "'%s'", r[0].message);
  moejit_compiler_destroy(c);
  free(cache);
  free(file);
}

/* moejit_compile of every family for sm_90a, which must succeed; each
 * report checked (hit or not as want_hit). */
static void compile_good(moejit_compiler *c, const moejit_spec *s, moejit_kernel_report *r,
                         int want_hit) {
  size_t n = 0;
  cr_assert_eq(moejit_compile(c, s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_OK, "%s",
               moejit_last_error());
  check_reports(r, n, want_hit);
}

/* A kernel this compiler already holds, asked for with another cache
 * directory, lands in that one too (a build box warming several caches). */
Test(compile, a_hit_in_memory_still_fills_the_requested_cache) {
  unsetenv("MOEJIT_CACHE_DIR");
  moejit_spec s = random_spec("two_caches");
  char *a = subdir("cache-a"), *b = subdir("cache-b");
  moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s", a);
  compile_good(c, &s, r, 0);
  cr_assert_eq(ts_count_files(a, ".mjc"), N_FAMILIES);
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s", b);
  compile_good(c, &s, r, 1); /* not compiled again */
  cr_expect_eq(ts_count_files(b, ".mjc"), N_FAMILIES, "the second cache stayed empty");
  compile_good(c, &s, r, 1);
  cr_expect_eq(ts_count_files(b, ".mjc"), N_FAMILIES);
  moejit_compiler_destroy(c);
  free(a), free(b);
}

/* A store that failed (the cache's directory gone for a while) is tried
 * again by the next request naming that cache: the kernel was never
 * counted as stored there. */
Test(compile, a_failed_store_is_tried_again) {
  unsetenv("MOEJIT_CACHE_DIR");
  moejit_spec s = random_spec("store_retry"), other = s;
  other.hidden += 64; /* other kernels */
  char *a = subdir("retry-a"), *b = subdir("retry-b"), *away = subdir("retry-b-away");
  moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s", a);
  compile_good(c, &s, r, 0);
  snprintf(other.cache_dir, sizeof other.cache_dir, "%s", b);
  compile_good(c, &other, r, 0); /* the compiler now holds cache b open */
  cr_assert_eq(ts_count_files(b, ".mjc"), N_FAMILIES);
  cr_assert_eq(rename(b, away), 0);
  free(ts_write_file(tmp, "retry-b", "not a directory\n"));
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s", b);
  compile_good(c, &s, r, 1); /* in memory; the stores fail */
  cr_expect(strstr(r[0].message, "not stored in the cache"), "'%s'", r[0].message);
  cr_assert_eq(unlink(b), 0);
  cr_assert_eq(rename(away, b), 0);
  compile_good(c, &s, r, 1);
  cr_expect_eq(ts_count_files(b, ".mjc"), 2 * N_FAMILIES, "the failed stores were not tried again");
  moejit_compiler_destroy(c);
  free(a), free(b), free(away);
}

Test(compile, overlong_cache_dir_is_a_warning) {
  moejit_spec s = random_spec("overlong_cache");
  char longdir[MOEJIT_PATH_MAX + 200];
  int n = snprintf(longdir, sizeof longdir, "%s/", tmp);
  while (n < MOEJIT_PATH_MAX + 100) n += snprintf(longdir + n, sizeof longdir - n, "d123456789/");
  moejit_compiler *c = new_compiler(longdir, GOOD, NULL, 0);
  moejit_kernel_report r[N_FAMILIES];
  compile_good(c, &s, r, 0);
  cr_assert(strstr(r[0].message, "cache unusable") && strstr(r[0].message, "longer than"), "'%s'",
            r[0].message);
  moejit_compiler_destroy(c);
  moejit_cache_stats st;
  cr_assert_eq(moejit_cache_stats_get(longdir, &st), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "shorter path"), "%s", moejit_last_error());
}

Test(compile, failures_are_reported_per_kernel) {
  moejit_spec s = random_spec("failures");
  char *emit = subdir("emit");
  moejit_compiler *c = new_compiler(NULL, cs_template_dir("broken"), emit, 1);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 0;
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", r, N_FAMILIES, &n), MOEJIT_ERR_COMPILE);
  cr_assert(strstr(moejit_last_error(), "route.cu(6): error"),
            "the whole log is the last error:\n%s", moejit_last_error());
  cr_assert_eq(n, N_FAMILIES, "all kernels are tried");
  cr_assert_eq(r[0].status, MOEJIT_ERR_COMPILE);
  cr_assert(strstr(r[0].message, "NVRTC could not compile kernel 'route'"), "%s", r[0].message);
  for (int i = 1; i < N_FAMILIES; i++)
    cr_assert_eq(r[i].status, MOEJIT_ERR_NOT_FOUND, "broken/ has no %s.cu", r[i].kernel);
  /* The rejected source is emitted for reading beside the log. */
  cr_assert_eq(ts_count_files(emit, "route.sm_90a.cu"), 1);
  cr_assert_eq(ts_count_files(emit, NULL), 1);
  moejit_compiler_destroy(c);
  free(emit);
}

Test(compile, arch_auto_and_bad_arguments_are_refused) {
  moejit_spec s = random_spec("auto");
  moejit_compiler *c = new_compiler(NULL, GOOD, NULL, 1);
  moejit_kernel_report r[N_FAMILIES];
  size_t n = 7;
  cr_assert_eq(moejit_compile(c, &s, "auto", r, 4, &n), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "HINT"), "%s", moejit_last_error());
  cr_assert_eq(n, 0);
  strcpy(s.archs[0], "auto");
  cr_assert_eq(moejit_compile(c, &s, NULL, r, 4, &n), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_compile(c, &s, "sm_90a", NULL, 4, &n), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_compile(NULL, &s, "sm_90a", r, 4, &n), MOEJIT_ERR_INVALID_ARGUMENT);
  char *src = (char *)1;
  cr_assert_eq(moejit_generate(c, &s, "route", NULL, &src), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_null(src);
  const void *cubin;
  size_t len;
  cr_assert_eq(mj_compiler_get_cubin(c, &s, "route", "auto", &cubin, &len, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_compiler_destroy(c);
  moejit_compiler_destroy(NULL);
  cr_assert_eq(moejit_compiler_create(NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
}

typedef struct race {
  moejit_compiler *c;
  const moejit_spec *spec;
  const void *cubin;
  moejit_status st;
} race;

static void *race_get(void *arg) {
  race *r = arg;
  size_t len;
  r->st = mj_compiler_get_cubin(r->c, r->spec, "combine", "sm_90a", &r->cubin, &len, NULL, NULL);
  return NULL;
}

Test(compile, concurrent_get_cubin_agrees) {
  moejit_spec s = random_spec("concurrent");
  char *cache = subdir("cache");
  moejit_compiler *c = new_compiler(cache, GOOD, NULL, 0);
  race r[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    r[i] = (race){.c = c, .spec = &s};
    cr_assert_eq(pthread_create(&t[i], NULL, race_get, &r[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  const void *first = r[0].cubin;
  for (int i = 0; i < 4; i++) cr_assert_eq(r[i].st, MOEJIT_OK);
  /* Later calls see one copy (racing compiles may each have produced one,
   * but the map keeps the first). */
  const void *again;
  size_t len;
  cr_assert_eq(mj_compiler_get_cubin(c, &s, "combine", "sm_90a", &again, &len, NULL, NULL),
               MOEJIT_OK);
  int seen = 0;
  for (int i = 0; i < 4; i++) seen |= r[i].cubin == again;
  cr_assert(seen || again == first);
  cr_assert_eq(ts_count_files(cache, ".mjc"), 1);
  moejit_compiler_destroy(c);
  free(cache);
}

/* ---- the real templates -------------------------------------------------- */

static int all_families_embedded(char *missing, size_t cap) {
  for (const char *const *f = mj_kernel_families; *f; f++) {
    int found = 0;
    char name[64];
    snprintf(name, sizeof name, "%s.cu", *f);
    for (const mj_embedded_file *e = mj_embedded_templates; e->name; e++)
      found |= !strcmp(e->name, name);
    if (!found) {
      snprintf(missing, cap, "templates/%s", name);
      return 0;
    }
  }
  return 1;
}

Test(compile, every_embedded_template_and_preset_compiles, .timeout = 600) {
  char missing[96];
  if (!all_families_embedded(missing, sizeof missing))
    cr_skip_test("%s is not written yet: it is not embedded in this build", missing);
  cr_assert_gt(mj_embedded_presets_count, 0, "no embedded presets");
  moejit_compiler *c = new_compiler(NULL, NULL, NULL, 1);
  for (size_t p = 0; p < mj_embedded_presets_count; p++) {
    moejit_spec s;
    cr_assert_eq(moejit_spec_load_preset(mj_embedded_presets[p].name, &s), MOEJIT_OK, "%s",
                 moejit_last_error());
    s.n_archs = 2;
    strcpy(s.archs[0], "sm_90a");
    strcpy(s.archs[1], "sm_80");
    moejit_kernel_report r[2 * N_FAMILIES];
    size_t n = 0;
    moejit_status st = moejit_compile(c, &s, NULL, r, 2 * N_FAMILIES, &n);
    cr_assert_eq(st, MOEJIT_OK, "preset %s: %s", mj_embedded_presets[p].name, moejit_last_error());
    check_reports(r, n, 0);
  }
  moejit_compiler_destroy(c);
}
