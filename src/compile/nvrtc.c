/* The NVRTC wrapper: compiles one generated source to PTX and cubin, finds
 * the CUDA include directories once, and reports NVRTC's version and archs.
 * NVRTC allows concurrent calls on distinct programs, so no lock here. */
#include <dlfcn.h>
#include <link.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "compile/compile.h"
#include "config/config.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#ifndef MOEJIT_CUDA_INCLUDE_DIRS
#define MOEJIT_CUDA_INCLUDE_DIRS ""
#endif

#define MJ_MAX_INCLUDE_DIRS 8

/* ------------------------------------------------------------------------ */
/* Include directories: found once per process                             */

static struct {
  int n;
  char dirs[MJ_MAX_INCLUDE_DIRS][MOEJIT_PATH_MAX];
  char tried[2048]; /* for the error message when nothing fits */
} g_inc;
static pthread_once_t g_inc_once = PTHREAD_ONCE_INIT;

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int has_bf16_header(const char *dir) {
  char path[MOEJIT_PATH_MAX + 32];
  struct stat st;
  snprintf(path, sizeof path, "%s/cuda_bf16.h", dir);
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void note_tried(const char *dir) {
  size_t used = strlen(g_inc.tried);
  snprintf(g_inc.tried + used, sizeof g_inc.tried - used, "%s%s", used ? ", " : "", dir);
}

static void add_dir(const char *dir) {
  for (int i = 0; i < g_inc.n; i++)
    if (strcmp(g_inc.dirs[i], dir) == 0) return;
  if (g_inc.n < MJ_MAX_INCLUDE_DIRS && is_dir(dir))
    mj_strlcpy(g_inc.dirs[g_inc.n++], dir, sizeof g_inc.dirs[0]);
}

/* A toolkit root from the environment: its include/ must hold cuda_bf16.h;
 * include/cccl (CUDA 13 moved libcu++ there) comes along when present. */
static int try_toolkit_root(const char *var) {
  const char *root = getenv(var);
  if (!root || !*root) return 0;
  char inc[MOEJIT_PATH_MAX], cccl[MOEJIT_PATH_MAX + 8];
  snprintf(inc, sizeof inc, "%s/include", root);
  note_tried(inc);
  if (!has_bf16_header(inc)) return 0;
  snprintf(cccl, sizeof cccl, "%s/cccl", inc);
  add_dir(inc);
  add_dir(cccl);
  return 1;
}

/* The directories CMake found at build time (';'-separated): every existing
 * one is passed, as long as one of them holds cuda_bf16.h. */
static int try_build_dirs(void) {
  /* Tests replace the build-time list to reach the "nothing found" path. */
  const char *p = getenv("MOEJIT_TEST_CUDA_INCLUDE_DIRS");
  if (!p) p = MOEJIT_CUDA_INCLUDE_DIRS;
  int found = 0;
  while (*p) {
    const char *semi = strchr(p, ';');
    size_t n = semi ? (size_t)(semi - p) : strlen(p);
    char dir[MOEJIT_PATH_MAX];
    if (n > 0 && n < sizeof dir) {
      memcpy(dir, p, n);
      dir[n] = '\0';
      note_tried(dir);
      found |= has_bf16_header(dir);
      add_dir(dir);
    }
    p += n + (semi ? 1 : 0);
  }
  if (!found) g_inc.n = 0;
  return found;
}

/* One source of headers only (CUDA_HOME, else CUDA_PATH, else the build's
 * list) so two toolkits' headers never mix. */
static void find_include_dirs(void) {
  if (try_toolkit_root("CUDA_HOME")) return;
  if (try_toolkit_root("CUDA_PATH")) return;
  try_build_dirs();
}

static int include_dirs(const char **dirs, int cap) {
  pthread_once(&g_inc_once, find_include_dirs);
  int n = g_inc.n < cap ? g_inc.n : cap;
  for (int i = 0; i < n; i++) dirs[i] = g_inc.dirs[i];
  return n;
}

const char *mj_cuda_include_dir(void) {
  const char *dirs[MJ_MAX_INCLUDE_DIRS];
  int n = include_dirs(dirs, MJ_MAX_INCLUDE_DIRS);
  for (int i = 0; i < n; i++)
    if (has_bf16_header(dirs[i])) return dirs[i];
  return NULL;
}

int mj_cuda_include_dirs(const char **dirs, int cap) {
  return include_dirs(dirs, cap);
}

static pthread_once_t g_digest_once = PTHREAD_ONCE_INIT;
static char g_digest[17] = "none";

static void digest_headers(void) {
  const char *dir = mj_cuda_include_dir();
  if (!dir) return;
  static const char *const names[] = {"cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h",
                                      "cuda_bf16.hpp"};
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char path[MOEJIT_PATH_MAX + 32], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    XXH3_64bits_update(&st, names[i], strlen(names[i]) + 1);
    if (mj_read_file(path, &text, &len) == MOEJIT_OK) { /* absent: only its name counts */
      XXH3_64bits_update(&st, &len, sizeof len);
      XXH3_64bits_update(&st, text, len);
      free(text);
    }
  }
  mj_clear_error();
  snprintf(g_digest, sizeof g_digest, "%016llx", (unsigned long long)XXH3_64bits_digest(&st));
}

const char *mj_cuda_headers_digest(void) {
  pthread_once(&g_digest_once, digest_headers);
  return g_digest;
}

/* The NVRTC library this process runs, for the cache key: nvrtcVersion
 * says 13.0 for every 13.0.x release, while a patch release can change the
 * code NVRTC emits. */
typedef struct nvrtc_object {
  uintptr_t addr; /* nvrtcVersion's definition */
  int matched;    /* the object holding it was found */
  char id[2 * 32 + 1];
  char name[MOEJIT_PATH_MAX];
} nvrtc_object;

/* The hex of the object's NT_GNU_BUILD_ID note, if it has one. */
static void note_build_id(const struct dl_phdr_info *info, const ElfW(Phdr) * ph, char *id,
                          size_t cap) {
  const size_t align = ph->p_align == 8 ? 8 : 4;
  const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
  const unsigned char *end = p + ph->p_memsz;
  while ((size_t)(end - p) >= sizeof(ElfW(Nhdr))) {
    const ElfW(Nhdr) *n = (const ElfW(Nhdr) *)(const void *)p;
    const unsigned char *name = p + sizeof *n;
    const size_t name_len = (n->n_namesz + align - 1) / align * align;
    const size_t desc_len = (n->n_descsz + align - 1) / align * align;
    if ((size_t)(end - name) < name_len || (size_t)(end - name - name_len) < desc_len) return;
    const unsigned char *desc = name + name_len;
    if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(name, "GNU", 4) == 0 &&
        n->n_descsz > 0 && 2 * (size_t)n->n_descsz < cap) {
      for (size_t i = 0; i < n->n_descsz; i++) snprintf(id + 2 * i, 3, "%02x", desc[i]);
      return;
    }
    p = desc + desc_len;
  }
}

static int find_nvrtc_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  nvrtc_object *o = arg;
  int holds = 0;
  for (int i = 0; i < info->dlpi_phnum && !holds; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    holds = ph->p_type == PT_LOAD && o->addr >= lo && o->addr - lo < ph->p_memsz;
  }
  if (!holds) return 0;
  o->matched = 1;
  mj_strlcpy(o->name, info->dlpi_name ? info->dlpi_name : "", sizeof o->name);
  for (int i = 0; i < info->dlpi_phnum && !o->id[0]; i++)
    if (info->dlpi_phdr[i].p_type == PT_NOTE)
      note_build_id(info, &info->dlpi_phdr[i], o->id, sizeof o->id);
  return 1;
}

static pthread_once_t g_nvrtc_id_once = PTHREAD_ONCE_INIT;
static char g_nvrtc_id[2 * 32 + 48] = "unknown";

static void identify_nvrtc(void) {
  nvrtc_object o = {0};
  o.addr = (uintptr_t)dlsym(RTLD_DEFAULT, "nvrtcVersion");
  if (!o.addr) return;
  dl_iterate_phdr(find_nvrtc_object, &o);
  if (!o.matched) return;
  const char *base = strrchr(o.name, '/');
  base = base ? base + 1 : o.name;
  struct stat sb;
  if (!strstr(base, "nvrtc"))
    snprintf(g_nvrtc_id, sizeof g_nvrtc_id, "linked"); /* a static NVRTC: the version says it */
  else if (o.id[0])
    snprintf(g_nvrtc_id, sizeof g_nvrtc_id, "%s", o.id);
  else if (stat(o.name, &sb) == 0) /* no build ID: the file's size and time */
    snprintf(g_nvrtc_id, sizeof g_nvrtc_id, "%lld.%lld", (long long)sb.st_size,
             (long long)sb.st_mtime);
}

const char *mj_nvrtc_build_id(void) {
  pthread_once(&g_nvrtc_id_once, identify_nvrtc);
  return g_nvrtc_id;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */

void mj_compile_opts_string(const mj_compile_opts *o, char *buf, size_t cap) {
  snprintf(buf, cap, "--gpu-architecture=%s -std=c++17%s%s", o->arch ? o->arch : "",
           o->lineinfo ? " -lineinfo" : "", o->fast_math ? " --use_fast_math" : "");
}

/* ------------------------------------------------------------------------ */
/* Compile                                                                  */

static char *program_log(nvrtcProgram prog) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) return NULL;
  char *log = malloc(n + 1);
  if (!log) return NULL;
  if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
  log[n] = '\0';
  return log;
}

static moejit_status nvrtc_fail(nvrtcResult r, const char *what) {
  return mj_fail(r == NVRTC_ERROR_OUT_OF_MEMORY ? MOEJIT_ERR_OUT_OF_MEMORY : MOEJIT_ERR_INTERNAL,
                 "%s failed: %s", what, nvrtcGetErrorString(r));
}

static moejit_status compile_failed(nvrtcResult r, nvrtcProgram prog, const mj_kernel_source *ks,
                                    const char *arch) {
  if (r == NVRTC_ERROR_INVALID_OPTION) {
    char archs[512] = "";
    moejit_nvrtc_archs(archs, sizeof archs);
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "NVRTC cannot target %s (kernel '%s'); HINT: supported archs: %s", arch,
                   ks->family, archs);
  }
  if (r != NVRTC_ERROR_COMPILATION) return nvrtc_fail(r, "nvrtcCompileProgram");
  char *log = program_log(prog);
  moejit_status s =
      mj_fail(MOEJIT_ERR_COMPILE, "NVRTC could not compile kernel '%s' for %s (template %s):\n%s",
              ks->family, arch, ks->template_name, log ? log : "(no log)");
  free(log);
  return s;
}

/* Copies one NVRTC output (PTX or cubin) into a malloc'd buffer. */
static moejit_status fetch_output(nvrtcProgram prog, int want_cubin, void **out, size_t *len) {
  size_t n = 0;
  nvrtcResult r = want_cubin ? nvrtcGetCUBINSize(prog, &n) : nvrtcGetPTXSize(prog, &n);
  if (r != NVRTC_SUCCESS)
    return nvrtc_fail(r, want_cubin ? "nvrtcGetCUBINSize" : "nvrtcGetPTXSize");
  if (n == 0)
    return mj_fail(MOEJIT_ERR_INTERNAL, "NVRTC produced an empty %s", want_cubin ? "cubin" : "PTX");
  char *buf = malloc(n + 1);
  if (!buf)
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte NVRTC output", n);
  r = want_cubin ? nvrtcGetCUBIN(prog, buf) : nvrtcGetPTX(prog, buf);
  if (r != NVRTC_SUCCESS) {
    free(buf);
    return nvrtc_fail(r, want_cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX");
  }
  buf[n] = '\0';
  *out = buf;
  /* NVRTC counts the PTX's terminating NUL; callers get the text length. */
  *len = want_cubin ? n : strlen(buf);
  return MOEJIT_OK;
}

#define MJ_MAX_OPTIONS (4 + MJ_MAX_INCLUDE_DIRS)

static moejit_status run_nvrtc(nvrtcProgram prog, const mj_kernel_source *ks,
                               const mj_compile_opts *o) {
  const char *dirs[MJ_MAX_INCLUDE_DIRS];
  int nd = include_dirs(dirs, MJ_MAX_INCLUDE_DIRS);
  if (nd == 0)
    return mj_fail(MOEJIT_ERR_COMPILE,
                   "no CUDA include directory with cuda_bf16.h found (tried: %s); HINT: set "
                   "CUDA_HOME to the CUDA toolkit root (the directory holding include/cuda_bf16.h)",
                   g_inc.tried[0] ? g_inc.tried : "nothing: CUDA_HOME and CUDA_PATH unset");
  char arch_opt[MOEJIT_ARCH_MAX + 32], incs[MJ_MAX_INCLUDE_DIRS][MOEJIT_PATH_MAX + 3];
  const char *opts[MJ_MAX_OPTIONS];
  int n = 0;
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", o->arch);
  opts[n++] = arch_opt;
  opts[n++] = "-std=c++17";
  if (o->lineinfo) opts[n++] = "-lineinfo";
  if (o->fast_math) opts[n++] = "--use_fast_math";
  for (int i = 0; i < nd; i++) {
    snprintf(incs[i], sizeof incs[i], "-I%s", dirs[i]);
    opts[n++] = incs[i];
  }
  nvrtcResult r = nvrtcCompileProgram(prog, n, opts);
  return r == NVRTC_SUCCESS ? MOEJIT_OK : compile_failed(r, prog, ks, o->arch);
}

moejit_status mj_nvrtc_compile(const mj_kernel_source *ks, const mj_compile_opts *o, char **ptx,
                               size_t *ptx_len, void **cubin, size_t *cubin_len) {
  if (!ks || !ks->source || !o || !o->arch || !cubin || !cubin_len)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_nvrtc_compile: missing argument");
  *cubin = NULL;
  *cubin_len = 0;
  if (ptx) *ptx = NULL;
  if (ptx_len) *ptx_len = 0;
  /* Named like the emitted file, so lines of the prelude (before the first
   * #line marker) point into <family>.<arch>.cu. */
  char name[MOEJIT_NAME_MAX + MOEJIT_ARCH_MAX + 8];
  snprintf(name, sizeof name, "%s.%s.cu", ks->family, o->arch);
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, ks->source, name, 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) return nvrtc_fail(r, "nvrtcCreateProgram");
  moejit_status s = run_nvrtc(prog, ks, o);
  size_t plen = 0;
  void *p = NULL;
  if (!s && ptx) s = fetch_output(prog, 0, &p, &plen);
  if (!s) s = fetch_output(prog, 1, cubin, cubin_len);
  if (!s && ptx) {
    *ptx = p;
    if (ptx_len) *ptx_len = plen;
  } else {
    free(p);
  }
  nvrtcDestroyProgram(&prog);
  return s;
}

/* ------------------------------------------------------------------------ */
/* Version and supported archs                                              */

void moejit_nvrtc_version(int *major, int *minor) {
  int ma = 0, mi = 0;
  if (nvrtcVersion(&ma, &mi) != NVRTC_SUCCESS) ma = mi = 0;
  if (major) *major = ma;
  if (minor) *minor = mi;
}

static char g_archs[1024];
static pthread_once_t g_archs_once = PTHREAD_ONCE_INIT;

/* The arch-specific 'a' variants (wgmma, setmaxnreg, tcgen05) exist only for
 * some numbers and NVRTC versions: ask NVRTC by compiling an empty kernel. */
static int accepts_arch(const char *arch) {
  static const char *src = "extern \"C\" __global__ void moejit_probe() {}\n";
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src, "probe.cu", 0, NULL, NULL) != NVRTC_SUCCESS) return 0;
  char opt[64];
  snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {opt};
  nvrtcResult r = nvrtcCompileProgram(prog, 1, opts);
  nvrtcDestroyProgram(&prog);
  return r == NVRTC_SUCCESS;
}

static void find_archs(void) {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return;
  int *v = calloc((size_t)n, sizeof *v);
  if (!v) return;
  if (nvrtcGetSupportedArchs(v) == NVRTC_SUCCESS) {
    size_t used = 0;
    for (int i = 0; i < n && used < sizeof g_archs; i++) {
      char a[24];
      snprintf(a, sizeof a, "sm_%da", v[i]);
      int with_a = v[i] >= 90 && accepts_arch(a);
      used += (size_t)snprintf(g_archs + used, sizeof g_archs - used, "%ssm_%d%s%s",
                               used ? " " : "", v[i], with_a ? " " : "", with_a ? a : "");
    }
  }
  free(v);
}

moejit_status moejit_nvrtc_archs(char *buf, size_t cap) {
  if (!buf || cap == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nvrtc_archs: no buffer");
  pthread_once(&g_archs_once, find_archs);
  if (!g_archs[0]) {
    buf[0] = '\0';
    return mj_fail(MOEJIT_ERR_INTERNAL, "NVRTC did not report its supported archs");
  }
  return mj_snprintf(buf, cap, "%s", g_archs);
}
