/* moejit_bench_compile: how long a cold compile takes (no disk cache, a new
 * compiler per run), per kernel and per preset, serial vs parallel. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moejit/moejit.h"

#include "bench_clock.h"

#define MAX_PRESETS 32
#define MAX_KERNELS 8

typedef struct bench_args {
  const char *arch, *template_dir, *only_preset;
  int jobs, repeat;
} bench_args;

typedef struct preset_result {
  const char *name;
  size_t n_kernels;
  double kernel_ms[MAX_KERNELS]; /* best serial time per kernel */
  char kernel[MAX_KERNELS][MOEJIT_NAME_MAX];
  double serial_ms, parallel_ms; /* best wall time for the whole preset */
} preset_result;

static void usage(FILE *f) {
  fprintf(f,
          "usage: moejit_bench_compile [--arch ARCH] [--jobs N] [--repeat R]\n"
          "                            [--preset NAME] [--template-dir DIR]\n"
          "Cold compile time (cache disabled, a fresh compiler each run) of every\n"
          "kernel of every embedded preset: serial (jobs=1) and parallel (jobs=N,\n"
          "default: online CPUs). Best of R runs (default 3).\n");
}

static int parse_args(int argc, char **argv, bench_args *a) {
  a->arch = "sm_90a";
  a->jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
  a->repeat = 3;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--help")) return usage(stdout), 1;
    if (!v) return usage(stderr), 2;
    if (!strcmp(argv[i], "--arch"))
      a->arch = v;
    else if (!strcmp(argv[i], "--jobs"))
      a->jobs = atoi(v);
    else if (!strcmp(argv[i], "--repeat"))
      a->repeat = atoi(v);
    else if (!strcmp(argv[i], "--preset"))
      a->only_preset = v;
    else if (!strcmp(argv[i], "--template-dir"))
      a->template_dir = v;
    else
      return usage(stderr), 2;
    i++;
  }
  if (a->jobs < 1 || a->repeat < 1) return usage(stderr), 2;
  return 0;
}

/* One cold compile of every kernel of `spec`; wall time in *ms. */
static int compile_once(const bench_args *a, const moejit_spec *spec, int jobs,
                        moejit_kernel_report *r, size_t *n, double *ms) {
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.cache_disable = 1;
  o.jobs = jobs;
  o.template_dir = a->template_dir;
  moejit_compiler *c = NULL;
  if (moejit_compiler_create(&c, &o) != MOEJIT_OK) return -1;
  double t0 = bench_now_ms();
  moejit_status st = moejit_compile(c, spec, a->arch, r, MAX_KERNELS, n);
  *ms = bench_now_ms() - t0;
  if (st) fprintf(stderr, "moejit_bench_compile: %s: %s\n", spec->name, moejit_last_error());
  moejit_compiler_destroy(c);
  return st ? -1 : 0;
}

static double min_d(double a, double b) {
  return a < b ? a : b;
}

static int bench_preset(const bench_args *a, const char *name, preset_result *res) {
  moejit_spec spec;
  if (moejit_spec_load_preset(name, &spec) != MOEJIT_OK) {
    fprintf(stderr, "moejit_bench_compile: %s\n", moejit_last_error());
    return -1;
  }
  moejit_kernel_report r[MAX_KERNELS];
  memset(res, 0, sizeof *res);
  res->name = name;
  res->serial_ms = res->parallel_ms = 1e300;
  for (int rep = 0; rep < a->repeat; rep++) {
    double ms;
    if (compile_once(a, &spec, 1, r, &res->n_kernels, &ms)) return -1;
    res->serial_ms = min_d(res->serial_ms, ms);
    for (size_t k = 0; k < res->n_kernels && k < MAX_KERNELS; k++) {
      snprintf(res->kernel[k], sizeof res->kernel[k], "%.*s", (int)sizeof res->kernel[k] - 1,
               r[k].kernel);
      res->kernel_ms[k] = rep ? min_d(res->kernel_ms[k], r[k].ms) : r[k].ms;
    }
    size_t n;
    if (compile_once(a, &spec, a->jobs, r, &n, &ms)) return -1;
    res->parallel_ms = min_d(res->parallel_ms, ms);
  }
  return 0;
}

static void print_tables(const bench_args *a, const preset_result *res, int n) {
  int major, minor;
  moejit_nvrtc_version(&major, &minor);
  printf("moejit %s compile benchmark: NVRTC %d.%d, arch %s, cache disabled, best of %d\n\n",
         moejit_version_string(), major, minor, a->arch, a->repeat);
  printf("%-18s %-10s %12s\n", "preset", "kernel", "serial ms");
  for (int p = 0; p < n; p++)
    for (size_t k = 0; k < res[p].n_kernels && k < MAX_KERNELS; k++)
      printf("%-18s %-10s %12.1f\n", res[p].name, res[p].kernel[k], res[p].kernel_ms[k]);
  printf("\n%-18s %8s %12s %16s %8s\n", "preset", "kernels", "jobs=1 ms", "jobs=N ms", "speedup");
  for (int p = 0; p < n; p++) {
    char jobs_col[32];
    snprintf(jobs_col, sizeof jobs_col, "%.1f (N=%d)", res[p].parallel_ms, a->jobs);
    printf("%-18s %8zu %12.1f %16s %7.2fx\n", res[p].name, res[p].n_kernels, res[p].serial_ms,
           jobs_col, res[p].serial_ms / res[p].parallel_ms);
  }
}

int main(int argc, char **argv) {
  bench_args a = {0};
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  static preset_result res[MAX_PRESETS];
  int n = 0;
  for (const char *const *p = moejit_preset_names(); *p && n < MAX_PRESETS; p++) {
    if (a.only_preset && strcmp(a.only_preset, *p) != 0) continue;
    if (bench_preset(&a, *p, &res[n])) return 1;
    n++;
  }
  if (n == 0) {
    fprintf(stderr, "moejit_bench_compile: no preset matched\n");
    return 2;
  }
  print_tables(&a, res, n);
  return 0;
}
