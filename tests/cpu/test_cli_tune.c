/* `moejit tune` as a user runs it, without a GPU (the driver is hidden with
 * MOEJIT_LIBCUDA_PATH even where one exists): the smoke sweep compiles,
 * says timing needs a GPU and exits 0, writing nothing; a second run is all
 * cache hits; bad sweeps exit 2 naming file:line:col; --dry-run, --json and
 * option errors. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_support.h"

#define SMOKE MOEJIT_TEST_SOURCE_DIR "/configs/sweeps/smoke.yaml"

static char *tmp;
static char results[1024], table[1024];
static const char *const no_gpu_env[] = {"MOEJIT_LIBCUDA_PATH=/nonexistent/libcuda.so.1", NULL};

static void setup(void) {
  tmp = ts_mkdtemp("cli-tune");
  snprintf(results, sizeof results, "%s/results", tmp);
  snprintf(table, sizeof table, "%s/table.yaml", tmp);
}

static void teardown(void) {
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(cli_tune, .init = setup, .fini = teardown, .timeout = 300);

#define TUNE(out, err, ...) \
  ts_run_cli((const char *const[]){"tune", __VA_ARGS__, NULL}, no_gpu_env, out, err)

/* `moejit tune SMOKE ARGS...` exits 2 (usage) and its stderr holds w1 and w2. */
#define USAGE_ERROR(w1, w2, ...)                                             \
  do {                                                                       \
    char *e_ = NULL;                                                         \
    cr_assert_eq(TUNE(NULL, &e_, SMOKE, __VA_ARGS__), 2, "%s", __VA_ARGS__); \
    cr_assert(strstr(e_, w1) && strstr(e_, w2), "%s", e_);                   \
    free(e_);                                                                \
  } while (0)

Test(cli_tune, no_gpu_compiles_and_exits_0) {
  char *out = NULL, *err = NULL;
  int rc = TUNE(&out, &err, SMOKE, "--results", results, "--out", table, "--jobs", "2");
  cr_assert_eq(rc, 0, "exit %d\nstdout:\n%s\nstderr:\n%s", rc, out, err);
  cr_assert(strstr(err, "no GPU"), "stderr: %s", err);
  cr_assert(strstr(err, "timing needs a GPU"), "stderr: %s", err);
  cr_assert(strstr(out, "sweep smoke (sm_90a)"), "stdout: %s", out);
  cr_assert(strstr(out, "4 pruned before compiling"), "stdout: %s", out);
  cr_assert(strstr(out, "duplicate launch plan"), "stdout: %s", out);
  cr_assert(strstr(out, "compile: 12 kernels"), "stdout: %s", out);
  cr_assert(strstr(out, "0 failed"), "stdout: %s", out);
  cr_assert(strstr(out, "kernels/s"), "the compile rate: %s", out);
  cr_assert(strstr(out, "nothing was timed"), "stdout: %s", out);
  cr_assert_eq(ts_count_files(tmp, NULL), 0, "a compile-only run writes no results or table");
  free(out), free(err);
  /* again, by name, as JSON: every kernel comes from the cache */
  rc = TUNE(&out, &err, "smoke", "--results", results, "--out", table, "--json");
  cr_assert_eq(rc, 0, "stderr: %s", err);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  cr_assert(strstr(out, "\"timed\":false"), "%s", out);
  cr_assert(strstr(out, "\"kernels\":12,\"cache_hits\":12,\"compiled\":0"), "%s", out);
  cr_assert(strstr(out, "\"table_kept\":0,\"table_pinned_kept\":0,"), "%s", out);
  free(out), free(err);
}

Test(cli_tune, dry_run_counts_without_compiling) {
  char *out = NULL, *err = NULL;
  int rc =
      TUNE(&out, &err, MOEJIT_TEST_SOURCE_DIR "/configs/sweeps/h100-presets.yaml", "--dry-run");
  cr_assert_eq(rc, 0, "stderr: %s", err);
  cr_assert(strstr(out, "sweep h100-presets"), "%s", out);
  cr_assert(strstr(out, "shared memory (over 227 KiB)"), "%s", out);
  cr_assert(strstr(out, "registers (over 128 accumulators per thread)"), "%s", out);
  cr_assert(strstr(out, "candidates left"), "%s", out);
  cr_assert_null(strstr(out, "compile:"), "a dry run compiles nothing: %s", out);
  cr_assert_null(strstr(err, "no GPU"), "a dry run does not look for one: %s", err);
  free(out), free(err);
  rc = TUNE(&out, &err, "h100-presets", "--dry-run", "--json");
  cr_assert_eq(rc, 0);
  cr_assert(ts_json_valid(out), "%s", out);
  cr_assert(strstr(out, "\"prune_reasons\":[{\"reason\":"), "%s", out);
  free(out), free(err);
}

/* A space listing cluster_n: the dry run counts the validator's cluster
 * rules under their own reasons; a value outside 1, 2 exits 2 naming it. */
Test(cli_tune, dry_run_prunes_invalid_clusters) {
  char *sweep =
      ts_write_file(tmp, "cn.yaml",
                    "name: cn\n"
                    "tokens: [256]\n"
                    "paths: [wgmma]\n"
                    "shapes:\n"
                    "  - {name: odd, hidden: 768, expert_width: 384, experts: 8, top_k: 2}\n"
                    "spaces:\n"
                    "  - {tile_m: 128, tile_n: [128, 256], tile_k: 64, stages: 4,\n"
                    "     cluster_m: [1, 2], cluster_n: [1, 2]}\n");
  char *out = NULL, *err = NULL;
  int rc = TUNE(&out, &err, sweep, "--dry-run", "--json");
  cr_assert_eq(rc, 0, "stderr: %s", err);
  cr_assert(ts_json_valid(out), "%s", out);
  /* per kernel: 2 tile_n x 4 cluster shapes; 2x2 twice, odd n-tiles (tile_n 256) once */
  cr_assert(strstr(out, "\"enumerated\":18,\"pruned\":6,"), "%s", out);
  cr_assert(strstr(out, "{\"reason\":\"thread-block cluster (2x2)\",\"count\":4}"), "%s", out);
  cr_assert(strstr(out,
                   "{\"reason\":\"thread-block cluster (cluster_n 2, odd n-tile "
                   "count)\",\"count\":2}"),
            "%s", out);
  free(out), free(err);
  char *bad = ts_write_file(tmp, "bad-cn.yaml",
                            "name: bad\n"
                            "tokens: [1]\n"
                            "shapes: [qwen3-30b-a3b]\n"
                            "spaces:\n"
                            "  - {tile_m: 64, tile_n: 64, tile_k: 64, stages: 2, cluster_n: 4}\n");
  cr_assert_eq(TUNE(&out, &err, bad, "--dry-run"), 2, "stderr: %s", err);
  cr_assert(strstr(err,
                   "bad-cn.yaml:5:64: key 'spaces[0].cluster_n': value 4 is not allowed "
                   "(allowed 1, 2)"),
            "stderr: %s", err);
  free(out), free(err);
  free(sweep), free(bad);
}

Test(cli_tune, bad_sweep_exits_2_with_position) {
  char *bad = ts_write_file(tmp, "bad.yaml",
                            "name: bad\n"
                            "tokens: [1, 8]\n"
                            "shapes: [qwen3-30b-a3b]\n"
                            "spaces:\n"
                            "  - tile_m: [64, 48]\n"
                            "    tile_n: 128\n"
                            "    tile_k: 64\n"
                            "    stages: 3\n");
  char *out = NULL, *err = NULL;
  cr_assert_eq(TUNE(&out, &err, bad), 2, "stderr: %s", err);
  cr_assert(strstr(err, "bad.yaml:5:18: key 'spaces[0].tile_m': value 48 is not allowed"),
            "stderr: %s", err);
  free(out), free(err);
  char *typo = ts_write_file(
      tmp, "typo.yaml", "name: t\ntokens: [1]\nshapes: [qwen3-30b-a3b]\nspaces: []\nbudget: 5\n");
  cr_assert_eq(TUNE(&out, &err, typo), 2);
  cr_assert(strstr(err, "typo.yaml:5:1: unknown key 'budget'"), "stderr: %s", err);
  free(out), free(err);
  cr_assert_eq(TUNE(&out, &err, "no-such-sweep"), 2);
  cr_assert(strstr(err, "sweep 'no-such-sweep' not found"), "stderr: %s", err);
  free(out), free(err);
  free(bad), free(typo);
}

Test(cli_tune, options) {
  char *out = NULL, *err = NULL;
  cr_assert_eq(TUNE(&out, NULL, "--help"), 0);
  cr_assert(strstr(out, "usage: moejit tune SWEEP"), "%s", out);
  cr_assert(strstr(out, "--budget-seconds"), "%s", out);
  cr_assert(strstr(out, "--keep-within PCT"), "%s", out);
  cr_assert(strstr(out, "--runoff N"), "%s", out);
  cr_assert(strstr(out, "--model CONFIG"), "%s", out);
  cr_assert(strstr(out, "--check-layer") && strstr(out, "--check-tolerance PCT") &&
                strstr(out, "--check-between N") && strstr(out, "--check-only") &&
                strstr(out, "--replace-pinned"),
            "%s", out);
  free(out);
  cr_assert_eq(ts_run_cli((const char *const[]){"tune", NULL}, no_gpu_env, NULL, &err), 2);
  cr_assert(strstr(err, "needs a SWEEP"), "%s", err);
  free(err);
  USAGE_ERROR("--budget-seconds", "", "--budget-seconds", "-1");
  USAGE_ERROR("--keep-within: '101' is not a percentage", "", "--keep-within", "101");
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, "--keep-within", "5%"), 2);
  USAGE_ERROR("--runoff", "", "--runoff", "17");
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, "--runoff", "-1"), 2);
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, "--iters", "0"), 2);
  USAGE_ERROR("--check-layer", "--no-table", "--check-layer", "--no-table");
  USAGE_ERROR("--check-layer", "", "--check-layer", "--dry-run");
  USAGE_ERROR("--check-only", "--out FILE", "--check-only", "--model", "olmoe-1b-7b");
  cr_assert_eq(TUNE(NULL, &err, SMOKE, "--check-only", "--out", "/nonexistent/t.yaml", "--model",
                    "olmoe-1b-7b"),
               1);
  cr_assert(strstr(err, "cannot read the table /nonexistent/t.yaml"), "%s", err);
  free(err);
  cr_assert_eq(TUNE(NULL, &err, SMOKE, "--check-only", "--out", tmp, "--model", "olmoe-1b-7b"), 1,
               "a directory is no table");
  cr_assert(strstr(err, "cannot read the table"), "%s", err);
  free(err);
  char *t = ts_write_file(tmp, "t.yaml", "device: X\nentries: []\n");
  cr_assert_eq(TUNE(NULL, &err, SMOKE, "--check-only", "--out", t, "--model", "olmoe-1b-7b"), 1);
  cr_assert(strstr(err, "needs a GPU") && strstr(err, "libcuda"), "%s", err);
  free(err), free(t);
  USAGE_ERROR("--replace-pinned", "--no-table", "--replace-pinned", "--no-table");
  USAGE_ERROR("--replace-pinned", "--check-only", "--replace-pinned", "--check-only", "--out",
              "t.yaml");
  USAGE_ERROR("--check-between", "", "--check-between", "8");
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, "--check-between", "0"), 2);
  USAGE_ERROR("--check-tolerance: '-2' is not a percentage", "", "--check-tolerance", "-2");
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, "--frob"), 2);
  /* an arch no config may name, before anything is planned */
  cr_assert_eq(TUNE(NULL, &err, SMOKE, "--dry-run", "--arch", "sm_75"), 2);
  cr_assert(strstr(err, "arch 'sm_75' is not an arch moejit targets"), "%s", err);
  free(err);
  cr_assert_eq(TUNE(NULL, NULL, SMOKE, SMOKE), 2, "one SWEEP");
  cr_assert_eq(ts_run_cli((const char *const[]){"--help", NULL}, NULL, &out, NULL), 0);
  cr_assert(strstr(out, "tune SWEEP"), "the command list names tune: %s", out);
  free(out);
}

/* --model: the sweep's spaces over a config file's and a preset's shapes
 * instead of its own; bad models exit with the loader's words. */
Test(cli_tune, models_replace_the_sweep_shapes) {
  char *out = NULL, *err = NULL;
  const char *phi = MOEJIT_TEST_SOURCE_DIR "/configs/more-models/phi35-moe.yaml";
  int rc = TUNE(&out, &err, "smoke", "--model", phi, "--model", "olmoe-1b-7b", "--dry-run");
  cr_assert_eq(rc, 0, "stderr: %s", err);
  cr_assert(strstr(out, "model: phi35-moe (bf16 d=4096 f=6400 E=16 k=2)"), "%s", out);
  cr_assert(strstr(out, "olmoe-1b-7b (bf16 d=2048 f=1024 E=64 k=8)"), "%s", out);
  /* two shapes' candidates (the smoke sweep alone has 12 left, 36 points),
   * and at olmoe-1b-7b's T = 4 (32 rows: past AUTO's GEMV rows, within the
   * decode layer's reach) the GEMV kernel of each GEMM besides AUTO's tile */
  cr_assert(strstr(out, "28 candidates left, 74 points"), "%s", out);
  free(out), free(err);
  rc = TUNE(&out, &err, "smoke", "--model", "olmoe-1b-7b", "--dry-run", "--json");
  cr_assert_eq(rc, 0, "stderr: %s", err);
  cr_assert(ts_json_valid(out), "--json prints only JSON: %s", out);
  free(out), free(err);
  cr_assert_eq(TUNE(NULL, &err, "smoke", "--model", "no-such-model", "--dry-run"), 1);
  cr_assert(strstr(err, "no-such-model"), "%s", err);
  free(err);
  cr_assert_eq(
      TUNE(NULL, &err, "smoke", "--model", "olmoe-1b-7b", "--model", "olmoe-1b-7b", "--dry-run"),
      2);
  cr_assert(strstr(err, "both named 'olmoe-1b-7b'"), "%s", err);
  free(err);
  /* a config the tuner cannot take: fp32 weights */
  char *cfg = ts_write_file(
      tmp, "fp32.yaml",
      "name: fp32-model\nmodel: {hidden: 256, expert_width: 128, experts: 4, top_k: 2}\n"
      "dtypes: {activation: fp32, weight: fp32}\n"
      "kernels:\n  gemm1: {tile_m: 32, tile_n: 64, tile_k: 32, stages: 2, warps: 4}\n"
      "  gemm2: {tile_m: 32, tile_n: 64, tile_k: 32, stages: 2, warps: 4}\n");
  cr_assert_eq(TUNE(NULL, &err, "smoke", "--model", cfg, "--dry-run"), 2);
  cr_assert(strstr(err, "fp32-model") && strstr(err, "bf16 and fp16"), "%s", err);
  free(err), free(cfg);
  cr_assert_eq(TUNE(NULL, NULL, "smoke", "--model"), 2, "--model needs a value");
}
