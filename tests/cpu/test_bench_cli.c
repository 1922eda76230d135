/* The benchmark programs' command lines, run as a user runs them: --help,
 * refused arguments (exit 2, naming what to fix), the path without a GPU (a
 * clear message, no table) and, on a machine with a GPU, --smoke's tiles
 * checked against a CPU reference. Skips with the reason where the build has
 * no benchmarks (MOEJIT_BUILD_BENCH=OFF). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_support.h"

#define BENCH_GEMM MOEJIT_BENCH_DIR "/moejit_bench_gemm"
#define BENCH_OPS MOEJIT_BENCH_DIR "/moejit_bench_ops"

#define RUN(path, out, err, ...) \
  ts_run_program(path, (const char *const[]){__VA_ARGS__, NULL}, NULL, out, err)

static void need(const char *path) {
  if (access(path, X_OK) != 0) cr_skip_test("%s is not built (MOEJIT_BUILD_BENCH=OFF)", path);
}

/* The no-GPU tests: `path` built and no GPU, else skipped (with a GPU the
 * program would run `what`). */
static void need_no_gpu(const char *path, const char *what) {
  need(path);
  char reason[512];
  if (ts_gpu_available(reason, sizeof reason))
    cr_skip_test("a GPU is present: %s would run %s (the no-GPU path is for CI)", path, what);
}

Test(bench_cli, gemm_help_names_its_options) {
  need(BENCH_GEMM);
  char *out = NULL;
  cr_assert_eq(RUN(BENCH_GEMM, &out, NULL, "--help"), 0);
  const char *options[] = {"--preset",  "--tokens", "--iters",   "--rounds",
                           "--heat-ms", "--path",   "--routing", "--csv",
                           "--smoke",   "--gemm1",  "--gemm2",   "--read-tbps"};
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    cr_expect_not_null(strstr(out, options[i]), "--help does not mention %s:\n%s", options[i], out);
  free(out);
}

Test(bench_cli, gemm_refuses_bad_arguments_and_says_which) {
  need(BENCH_GEMM);
  const struct {
    const char *args[3];
    const char *says; /* in stdout or stderr */
  } cases[] = {
      {{"--heat-ms", "-1"}, "--heat-ms '-1'"},
      {{"--heat-ms", "lots"}, "--heat-ms 'lots'"},
      {{"--heat-ms", "5ms"}, "--heat-ms '5ms'"},
      {{"--heat-ms", "20000"}, "0 to 10000"},
      {{"--rounds", "0"}, "--rounds: 1 to"},
      {{"--rounds", "10"}, "--rounds: 1 to"},
      {{"--tokens", "0"}, "each T must be >= 1"},
      {{"--routing", "random"}, "--routing 'random': uniform or balanced"},
      {{"--read-tbps", "0"}, "--read-tbps '0'"},
      {{"--read-tbps", "3.0x"}, "--read-tbps '3.0x'"},
      {{"--read-tbps", "5000"}, "up to 1000"},
      {{"--no-such-option"}, "usage: moejit_bench_gemm"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out = NULL, *err = NULL;
    const int rc = ts_run_program(BENCH_GEMM, cases[i].args, NULL, &out, &err);
    cr_expect_eq(rc, 2, "%s %s: exit %d, expected 2", cases[i].args[0],
                 cases[i].args[1] ? cases[i].args[1] : "", rc);
    cr_expect(strstr(out, cases[i].says) || strstr(err, cases[i].says),
              "%s %s: the output does not say '%s':\n%s%s", cases[i].args[0],
              cases[i].args[1] ? cases[i].args[1] : "", cases[i].says, out, err);
    free(out);
    free(err);
  }
}

/* With a GPU, --smoke multiplies one tile of each GEMM on each path and
 * checks it against the CPU; without one it says so and measures nothing.
 * Either way it exits 0 (a wrong tile exits 1). */
Test(bench_cli, gemm_smoke_checks_its_tiles_or_says_there_is_no_gpu, .timeout = 600) {
  need(BENCH_GEMM);
  char reason[512];
  const int gpu = ts_gpu_available(reason, sizeof reason);
  char *out = NULL, *err = NULL;
  const int rc = RUN(BENCH_GEMM, &out, &err, "--smoke");
  cr_assert_eq(rc, 0, "--smoke: exit %d:\n%s%s", rc, out, err);
  if (!gpu) {
    cr_expect_not_null(strstr(out, "no GPU, nothing measured"), "%s", out);
    cr_expect_null(strstr(out, "smoke "), "a smoke line without a GPU:\n%s", out);
  } else {
    int lines = 0;
    for (const char *p = strstr(out, "smoke "); p; p = strstr(p + 1, "\nsmoke ")) {
      const char *eol = strchr(p + 1, '\n');
      const size_t n = eol ? (size_t)(eol - p) : strlen(p);
      cr_expect(n >= 4 && !strncmp(p + n - 4, ": ok", 4), "not ok: %.*s", (int)n, p);
      lines++;
    }
    cr_expect_geq(lines, 2, "--smoke printed %d tile checks:\n%s", lines, out);
  }
  free(out);
  free(err);
}

/* Without a GPU the GEMM benchmark times nothing, says why and exits 0, with
 * every argument accepted (so a script's command line is checked on a
 * build box too). */
Test(bench_cli, gemm_without_a_gpu_says_so_and_measures_nothing) {
  need_no_gpu(BENCH_GEMM, "the benchmark");
  char *out = NULL, *err = NULL;
  const int rc = RUN(BENCH_GEMM, &out, &err, "--preset", "qwen3-30b-a3b", "--tokens", "1,32",
                     "--heat-ms", "5", "--rounds", "1", "--path", "tuned");
  cr_expect_eq(rc, 0, "exit %d:\n%s%s", rc, out, err);
  cr_expect_not_null(strstr(out, "no GPU, nothing measured"), "%s", out);
  cr_expect_null(strstr(out, "qwen3-30b-a3b  gemm"), "a table row without a GPU:\n%s", out);
  free(out);
  free(err);
}

/* moejit_bench_ops exits 77 (the usual "skipped") without a GPU, naming
 * what is missing. */
Test(bench_cli, ops_without_a_gpu_exits_77_and_says_why) {
  need_no_gpu(BENCH_OPS, "its T = 16384 points");
  char *out = NULL, *err = NULL;
  const int rc = RUN(BENCH_OPS, &out, &err, "qwen3-30b-a3b");
  cr_expect_eq(rc, 77, "exit %d:\n%s%s", rc, out, err);
  cr_expect(strstr(err, "driver") || strstr(err, "device"), "no reason given:\n%s", err);
  free(out);
  free(err);
}
