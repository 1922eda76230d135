/* `moejit compile` and `moejit gen`: generate and compile a config's
 * kernels through the cache (no GPU needed), or print one kernel's source. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define MAX_REPORTS 64

static void compile_usage(FILE *f) {
  fprintf(f,
          "usage: moejit compile [CONFIG | --preset NAME] [options]\n"
          "\n"
          "Generates every kernel of a config and compiles it with NVRTC for the\n"
          "target arch, through the on-disk cache. Works without a GPU.\n"
          "With no CONFIG, the embedded default preset (%s).\n"
          "\n"
          "options:\n"
          "  --preset NAME      an embedded preset instead of a file\n"
          "  --arch ARCH        target arch (e.g. sm_90a, sm_80); default: the config's\n"
          "  --jobs N           compile threads (default: all CPUs)\n"
          "  --cache-dir DIR    cache directory (default: $MOEJIT_CACHE_DIR, config, XDG/HOME)\n"
          "  --no-cache         compile without the disk cache\n"
          "  --emit-dir DIR     also write each kernel's .cu, .ptx and .cubin to DIR\n"
          "  --device NAME      build what a model load builds on that GPU (its name as\n"
          "                     'moejit info' shows it, e.g. \"NVIDIA H100 80GB HBM3\"):\n"
          "                     the GEMM variants of its tuned table too, so a load there\n"
          "                     finds every kernel in the cache\n"
          "  --json             print one JSON object instead of a table\n",
          moejit_default_preset());
}

static void print_table(const moejit_spec *spec, const char *dir, const moejit_kernel_report *r,
                        size_t n, double total_ms, int jobs) {
  printf("%-10s %-8s %-32s %-6s %9s %9s\n", "kernel", "arch", "key", "cache", "ms", "cubin");
  int hits = 0, failed = 0;
  for (size_t i = 0; i < n; i++) {
    const char *state = r[i].status != MOEJIT_OK ? "FAIL" : r[i].cache_hit ? "hit" : "miss";
    hits += r[i].status == MOEJIT_OK && r[i].cache_hit;
    failed += r[i].status != MOEJIT_OK;
    printf("%-10s %-8s %-32s %-6s %9.1f %8zuB\n", r[i].kernel, r[i].arch, r[i].key, state,
           r[i].ms, r[i].cubin_bytes);
    if (r[i].message[0]) printf("  %s: %s\n", r[i].status ? "error" : "warning", r[i].message);
  }
  printf("%s: %zu kernels, %d from cache, %zu compiled, %d failed, %.0f ms with %d jobs; cache: %s\n",
         spec->name, n, hits, n - (size_t)hits - (size_t)failed, failed, total_ms, jobs,
         *dir ? dir : "(disabled)");
}

static void print_json(const moejit_spec *spec, const char *dir, const moejit_kernel_report *r,
                       size_t n, double total_ms, int jobs, moejit_status st) {
  printf("{\"config\":");
  cli_json_str(stdout, spec->name);
  printf(",\"cache_dir\":");
  cli_json_str(stdout, dir);
  printf(",\"jobs\":%d,\"ms\":%.3f,\"ok\":%s,\"kernels\":[", jobs, total_ms,
         st == MOEJIT_OK ? "true" : "false");
  for (size_t i = 0; i < n; i++) {
    printf("%s{\"kernel\":", i ? "," : "");
    cli_json_str(stdout, r[i].kernel);
    printf(",\"arch\":");
    cli_json_str(stdout, r[i].arch);
    printf(",\"key\":");
    cli_json_str(stdout, r[i].key);
    printf(",\"cache_hit\":%s,\"ms\":%.3f,\"cubin_bytes\":%zu,\"status\":",
           r[i].cache_hit ? "true" : "false", r[i].ms, r[i].cubin_bytes);
    cli_json_str(stdout, moejit_status_str(r[i].status));
    printf(",\"message\":");
    cli_json_str(stdout, r[i].message);
    printf("}");
  }
  printf("]}\n");
}

/* Options shared by compile and gen. */
typedef struct compile_args {
  const char *config, *preset, *arch, *cache_dir, *emit_dir, *kernel, *device;
  int jobs, json, no_cache;
} compile_args;

static int parse_args(int argc, char **argv, compile_args *a, int is_gen) {
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int bad = 0, rc;
    if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return -1;
    if (cli_opt_value(argc, argv, &i, "--preset", &a->preset, &bad) ||
        cli_opt_value(argc, argv, &i, "--arch", &a->arch, &bad) ||
        (!is_gen && cli_opt_value(argc, argv, &i, "--cache-dir", &a->cache_dir, &bad)) ||
        (!is_gen && cli_opt_value(argc, argv, &i, "--emit-dir", &a->emit_dir, &bad)) ||
        (!is_gen && cli_opt_value(argc, argv, &i, "--device", &a->device, &bad)) ||
        (is_gen && cli_opt_value(argc, argv, &i, "--kernel", &a->kernel, &bad))) {
      if (bad) return CLI_EXIT_USAGE;
    } else if (!is_gen && cli_opt_value(argc, argv, &i, "--jobs", &v, &bad)) {
      if (bad || !cli_parse_int("--jobs", v, 1, 256, &a->jobs)) return CLI_EXIT_USAGE;
    } else if (!is_gen && cli_flag(argv, i, "--json")) {
      a->json = 1;
    } else if (!is_gen && cli_flag(argv, i, "--no-cache")) {
      a->no_cache = 1;
    } else if ((rc = cli_positional(argv[i], &a->config, (is_gen ? "gen" : "compile")))) {
      return rc;
    }
  }
  return 0;
}

/* --device: what a model load on that GPU builds (moejit_model_prebuild). */
static int prebuild(const compile_args *a, const moejit_spec *spec, moejit_compiler *comp,
                    const char *dir) {
  moejit_load_report r;
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.report = &r;
  memset(&r, 0, sizeof r);
  moejit_status st = moejit_model_prebuild(comp, spec, a->arch, a->device, &opts);
  if (st) {
    fprintf(stderr, "moejit: compile --device: %s\n", moejit_last_error());
    return st == MOEJIT_ERR_INVALID_ARGUMENT || st == MOEJIT_ERR_CONFIG ? CLI_EXIT_USAGE
                                                                        : CLI_EXIT_FAILURE;
  }
  if (a->json) {
    printf("{\"config\":");
    cli_json_str(stdout, spec->name);
    printf(",\"device\":");
    cli_json_str(stdout, a->device);
    printf(",\"arch\":");
    cli_json_str(stdout, r.arch);
    printf(",\"cache_dir\":");
    cli_json_str(stdout, dir);
    printf(",\"load\":");
    cli_print_load_json(&r);
    printf("}\n");
    return CLI_EXIT_OK;
  }
  printf("%s for %s (%s): the kernels a model load there builds\n", spec->name, a->device, r.arch);
  for (int i = 0; i < r.n_kernels; i++) cli_print_load_row(&r.kernels[i], 1);
  printf("%d kernel families, %d from cache, %d compiled now; %.0f ms; cache: %s\n", r.n_kernels,
         r.cache_hits, r.cache_misses, r.total_ms, *dir ? dir : "(disabled)");
  return CLI_EXIT_OK;
}

int cli_compile(int argc, char **argv) {
  compile_args a = {0};
  int rc = parse_args(argc, argv, &a, 0);
  if (rc == -1) {
    compile_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (rc) return rc;
  moejit_spec spec;
  if ((rc = cli_load_spec(a.config, a.preset, &spec)) || (rc = cli_check_arch(&spec, a.arch)))
    return rc;

  moejit_compiler_opts opts;
  moejit_compiler_opts_init(&opts);
  opts.cache_dir = a.cache_dir;
  opts.cache_disable = a.no_cache;
  opts.emit_dir = a.emit_dir;
  opts.jobs = a.jobs;
  moejit_compiler *comp = NULL;
  moejit_status st = moejit_compiler_create(&comp, &opts);
  if (st) return cli_fail(st, "cannot create compiler");

  char dir[MOEJIT_PATH_MAX] = "";
  moejit_compiler_cache_dir(comp, &spec, dir, sizeof dir);
  if (a.device) {
    rc = prebuild(&a, &spec, comp, dir);
    moejit_compiler_destroy(comp);
    return rc;
  }
  moejit_kernel_report reports[MAX_REPORTS];
  size_t n = 0;
  double t0 = 0;
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t0 = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  }
  st = moejit_compile(comp, &spec, a.arch, reports, MAX_REPORTS, &n);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double total = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6 - t0;
  if (n > MAX_REPORTS) n = MAX_REPORTS;
  int jobs = a.jobs;
  if (!jobs) jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n == 0 && st) {
    moejit_compiler_destroy(comp);
    return cli_fail(st, "compile failed");
  }
  if (a.json)
    print_json(&spec, dir, reports, n, total, jobs, st);
  else
    print_table(&spec, dir, reports, n, total, jobs);
  if (st) {
    /* each failing kernel's first lines, then the first one's whole log
     * (a report holds its first 511 bytes) */
    fprintf(stderr, "moejit: compile failed: %s\n", moejit_status_str(st));
    size_t first = n;
    for (size_t i = 0; i < n; i++)
      if (reports[i].status) {
        if (first == n) first = i;
        fprintf(stderr, "%s\n", reports[i].message);
      }
    const char *log = moejit_last_error();
    if (first < n && strlen(log) > strlen(reports[first].message))
      fprintf(stderr, "--- the whole log of kernel '%s':\n%s\n", reports[first].kernel, log);
  }
  moejit_compiler_destroy(comp);
  if (st)
    return st == MOEJIT_ERR_INVALID_ARGUMENT || st == MOEJIT_ERR_CONFIG ? CLI_EXIT_USAGE
                                                                        : CLI_EXIT_FAILURE;
  return CLI_EXIT_OK;
}

int cli_gen(int argc, char **argv) {
  compile_args a = {0};
  int rc = parse_args(argc, argv, &a, 1);
  if (rc == -1) {
    printf(
        "usage: moejit gen [CONFIG | --preset NAME] --kernel NAME [--arch ARCH]\n"
        "\nPrints the generated CUDA source of one kernel family. Kernels:");
    for (const char *const *k = moejit_kernel_families(); *k; k++) printf(" %s", *k);
    printf("\n");
    return CLI_EXIT_OK;
  }
  if (rc) return rc;
  if (!a.kernel) {
    fprintf(stderr, "moejit: gen needs --kernel NAME (one of:");
    for (const char *const *k = moejit_kernel_families(); *k; k++) fprintf(stderr, " %s", *k);
    fprintf(stderr, ")\n");
    return CLI_EXIT_USAGE;
  }
  moejit_spec spec;
  if ((rc = cli_load_spec(a.config, a.preset, &spec)) || (rc = cli_check_arch(&spec, a.arch)))
    return rc;
  moejit_compiler *comp = NULL;
  moejit_status st = moejit_compiler_create(&comp, NULL);
  if (st) return cli_fail(st, "cannot create compiler");
  char *src = NULL;
  st = moejit_generate(comp, &spec, a.kernel, a.arch, &src);
  moejit_compiler_destroy(comp);
  if (st) return cli_fail(st, "cannot generate source");
  fputs(src, stdout);
  moejit_free(src);
  return CLI_EXIT_OK;
}
