/* `moejit run` without a GPU (MOEJIT_LIBCUDA_PATH pointing nowhere, so the
 * test holds on the GPU machine too): exit 0, says no GPU and that nothing
 * ran, compiles every kernel into --cache-dir, a second run is all cache
 * hits, --json is one valid object, usage errors exit 2 naming the culprit;
 * and the layer API's argument checks, which need no driver. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moejit/moejit.h"
#include "test_support.h"

#define NO_LIBCUDA "MOEJIT_LIBCUDA_PATH=/nonexistent/libcuda.so.1"

static const char *const no_gpu_env[] = {NO_LIBCUDA, NULL};

static int run_cli(const char *const *args, char **out, char **err) {
  return ts_run_cli(args, no_gpu_env, out, err);
}

/* The number of layer kernel families (route, align, gemm1, gemm2, combine). */
static int family_count(void) {
  int n = 0;
  for (const char *const *f = moejit_kernel_families(); *f; f++) n++;
  return n;
}

Test(cli_run, no_gpu_compiles_every_kernel_then_hits_the_cache) {
  char *dir = ts_mkdtemp("cli-run");
  char *out = NULL, *err = NULL;
  const char *args[] = {"run", "--preset", "olmoe-1b-7b", "--cache-dir", dir, NULL};
  int rc = run_cli(args, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, "no GPU") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, "nothing ran") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, "/nonexistent/libcuda.so.1") != NULL, "the reason names the driver: %s",
            out);
  cr_expect(strstr(out, "sm_90a") != NULL, "stdout: %s", out);
  cr_expect_eq(ts_count_substr(out, " miss "), family_count(), "stdout: %s", out);
  cr_expect_geq(ts_count_files(dir, NULL), family_count(), "cache files in %s", dir);
  free(out);
  free(err);

  const char *again[] = {"run", "--preset", "olmoe-1b-7b", "--cache-dir", dir, "--json", NULL};
  rc = run_cli(again, &out, &err);
  cr_assert_eq(rc, 0, "exit %d\nstderr: %s", rc, err);
  cr_expect(ts_json_valid(out), "not one JSON value: %s", out);
  cr_expect(strstr(out, "\"gpu\":false") != NULL, "json: %s", out);
  cr_expect(strstr(out, "\"ran\":false") != NULL, "json: %s", out);
  char want[64];
  snprintf(want, sizeof want, "\"cache_hits\":%d,\"compiled\":0", family_count());
  cr_expect(strstr(out, want) != NULL, "second run should be all hits (%s): %s", want, out);
  cr_expect_eq(ts_count_substr(out, "\"cache_hit\":true"), family_count(), "json: %s", out);
  free(out);
  free(err);
  ts_rmtree(dir);
  free(dir);
}

Test(cli_run, config_file_argument) {
  char *dir = ts_mkdtemp("cli-run-file");
  char path[1100];
  snprintf(path, sizeof path, "%s/configs/models/qwen3-30b-a3b.yaml", MOEJIT_TEST_SOURCE_DIR);
  char *out = NULL;
  const char *args[] = {"run",      path,  "--cache-dir", dir,      "--json",
                        "--tokens", "1,7", "--ceilings",  "1500,6", NULL};
  int rc = run_cli(args, &out, NULL);
  cr_assert_eq(rc, 0, "exit %d: %s", rc, out);
  cr_expect(ts_json_valid(out), "json: %s", out);
  cr_expect(strstr(out, "\"config\":\"qwen3-30b-a3b\"") != NULL, "json: %s", out);
  free(out);
  ts_rmtree(dir);
  free(dir);
}

Test(cli_run, bad_preset_exits_2_naming_it) {
  char *err = NULL;
  const char *args[] = {"run", "--preset", "no-such-model", NULL};
  int rc = run_cli(args, NULL, &err);
  cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
  cr_expect(strstr(err, "no-such-model") != NULL, "stderr: %s", err);
  free(err);
}

Test(cli_run, usage_errors_exit_2) {
  const char *bad_tokens[] = {"run", "--tokens", "1,zero", NULL};
  const char *zero_tokens[] = {"run", "--tokens", "0", NULL};
  const char *bad_iters[] = {"run", "--iters", "-3", NULL};
  const char *unknown[] = {"run", "--frobnicate", NULL};
  const char *two_configs[] = {"run", "a.yaml", "b.yaml", NULL};
  const char *one_ceiling[] = {"run", "--ceilings", "750", NULL};
  const char *zero_ceiling[] = {"run", "--ceilings", "0,3", NULL};
  const char *bad_ceiling[] = {"run", "--ceilings", "750,3x", NULL};
  const char *huge_ceiling[] = {"run", "--ceilings", "750,inf", NULL};
  const char *tiny_ceiling[] = {"run", "--ceilings", "1e-310,3", NULL};
  const char *hex_ceiling[] = {"run", "--ceilings", "0x10,3", NULL};
  const char *empty_dir[] = {"run", "--cache-dir", "", NULL};
  const char *comma_tokens[] = {"run", "--tokens", "1,", NULL};
  const char *plus_tokens[] = {"run", "--tokens", "+5", NULL};
  const char *space_tokens[] = {"run", "--tokens", "1, 5", NULL};
  const char *bad_flush[] = {"run", "--flush", "cold", NULL};
  const char *flush_ep[] = {"run", "--flush", "plain", "--ep", "2", NULL};
  const char *vs_ep[] = {"run", "--vs-heuristic", "--ep", "2", NULL};
  const char *table_ep[] = {"run", "--tuned-table", "t.yaml", "--ep", "2", NULL};
  const char *table_none[] = {"run", "--tuned-table", NULL};
  const char *ceilings_ep[] = {"run", "--ceilings", "750,3", "--ep", "2", NULL};
  const char *id_file_alone[] = {"run", "--ep", "2", "--ep-id-file", "/tmp/moejit-x.id", NULL};
  const char *space_ep[] = {"run", "--ep", " 2", NULL};
  const char *plus_iters[] = {"run", "--iters", "+3", NULL};
  const char *timeout_alone[] = {"run", "--ep-timeout", "30", NULL};
  const char *bad_timeout[] = {"run", "--ep-timeout", "-1", "--ep", "2", NULL};
  const char *huge_timeout[] = {"run", "--ep-timeout", "86401", "--ep", "2", NULL};
  const char *nonblocking_alone[] = {"run", "--ep-nonblocking-comm", NULL};
  const char *gate_ep[] = {"run", "--gate-weight", "--ep", "2", NULL};
  /* rank 0 would overwrite an id the other ranks may have read already */
  const char *stale_id[] = {
      "run", "--ep", "2", "--ep-rank", "0", "--ep-id-file", MOEJIT_TEST_SOURCE_DIR "/README.md",
      NULL};
  /* deepseek-v3 at 64 ranks: rank 0 owns 4 experts, a token takes 8 */
  const char *one_rank_few[] = {"run", "--preset",   "deepseek-v3", "--ep",
                                "64",  "--ep-route", "one-rank",    NULL};
  const char *const *cases[] = {
      bad_tokens,   zero_tokens,  bad_iters,     unknown,       two_configs,  one_ceiling,
      zero_ceiling, bad_ceiling,  huge_ceiling,  bad_flush,     flush_ep,     vs_ep,
      table_ep,     table_none,   tiny_ceiling,  hex_ceiling,   empty_dir,    comma_tokens,
      plus_tokens,  space_tokens, ceilings_ep,   id_file_alone, space_ep,     plus_iters,
      one_rank_few, stale_id,     timeout_alone, bad_timeout,   huge_timeout, nonblocking_alone,
      gate_ep};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *err = NULL;
    int rc = run_cli(cases[i], NULL, &err);
    cr_expect_eq(rc, 2, "moejit %s %s: exit %d: %s", cases[i][1], cases[i][2] ? cases[i][2] : "",
                 rc, err);
    cr_expect(err && *err, "moejit %s: no message", cases[i][1]);
    if (strcmp(cases[i][1], "--ep-timeout") == 0)
      cr_expect(err && strstr(err, "--ep-timeout"), "%s", err);
    if (strcmp(cases[i][1], "--ep-nonblocking-comm") == 0)
      cr_expect(err && strstr(err, "--ep-nonblocking-comm need --ep N"), "%s", err);
    if (strcmp(cases[i][1], "--cache-dir") == 0)
      cr_expect(err && strstr(err, "--cache-dir") && strstr(err, "non-empty"), "%s", err);
    if (strcmp(cases[i][1], "--ceilings") == 0 || strcmp(cases[i][1], "--flush") == 0 ||
        strcmp(cases[i][1], "--vs-heuristic") == 0 || strcmp(cases[i][1], "--gate-weight") == 0)
      cr_expect(
          err && strstr(err, cases[i][1]) && (strstr(err, cases[i][2]) || strstr(err, "--ep")),
          "the message names the option and its value (or the clash): %s", err);
    free(err);
  }
}

/* A rank started by hand (--ep-rank) on a machine without a GPU fails:
 * its peers would wait for it (rank 0 writes the id file, the others
 * join), so "nothing ran, exit 0" is never its answer. */
Test(cli_run, ep_rank_without_a_gpu_fails) {
  int devices = 0;
  if (moejit_device_count(&devices) == MOEJIT_OK && devices > 0)
    cr_skip_test("a GPU is present: the rank would run");
  char *dir = ts_mkdtemp("cli-run-rank");
  char id[1100];
  snprintf(id, sizeof id, "%s/id", dir);
  char *err = NULL;
  const char *args[] = {"run", "--ep",     "2",           "--ep-rank",   "1", "--ep-id-file",
                        id,    "--preset", "olmoe-1b-7b", "--cache-dir", dir, NULL};
  int rc = run_cli(args, NULL, &err);
  cr_expect_eq(rc, 1, "exit %d: %s", rc, err);
  cr_expect(err && strstr(err, "rank 1 of --ep 2 has no GPU"), "%s", err);
  free(err);
  ts_rmtree(dir);
  free(dir);
}

/* --tuned-table without a GPU: the table is read as a load would read it,
 * so a missing or malformed one fails with its path and position, after
 * the families compiled (exit 1 for a file that cannot be read, 2 for one
 * that does not parse). */
Test(cli_run, tuned_table_is_checked_without_a_gpu) {
  char *dir = ts_mkdtemp("cli-run-table");
  char *missing = NULL, *bad = NULL;
  cr_assert(asprintf(&missing, "%s/none.yaml", dir) > 0 && asprintf(&bad, "%s/bad.yaml", dir) > 0);
  FILE *f = fopen(bad, "w");
  cr_assert(f);
  fputs(
      "device: X\narch: sm_90a\nnvrtc: \"13.0\"\ndriver: 13000\ndate: 2026-11-27\n"
      "entries:\n  - {kernel: gemm3}\n",
      f);
  fclose(f);
  char *out = NULL, *err = NULL;
  const char *a1[] = {"run", "--preset",      "olmoe-1b-7b", "--cache-dir",
                      dir,   "--tuned-table", missing,       NULL};
  int rc = run_cli(a1, &out, &err);
  cr_expect_eq(rc, 1, "exit %d: %s", rc, err);
  cr_expect(strstr(out, "no GPU") != NULL, "the families compile first: %s", out);
  cr_expect(strstr(err, "--tuned-table") && strstr(err, "none.yaml"), "stderr: %s", err);
  free(out), free(err);
  const char *a2[] = {"run", "--preset",      "olmoe-1b-7b", "--cache-dir",
                      dir,   "--tuned-table", bad,           NULL};
  rc = run_cli(a2, &out, &err);
  cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
  cr_expect(strstr(err, "bad.yaml:7:") && strstr(err, "missing key"), "file:line and why: %s", err);
  free(out), free(err);
  /* --json says so too: not ok, and why */
  const char *a3[] = {"run",           "--preset", "olmoe-1b-7b", "--cache-dir", dir,
                      "--tuned-table", missing,    "--json",      NULL};
  rc = run_cli(a3, &out, &err);
  cr_expect_eq(rc, 1, "exit %d: %s", rc, err);
  cr_expect(ts_json_valid(out), "not JSON: %s", out);
  cr_expect(strstr(out, "\"ok\":false") && strstr(out, "\"tuned_table\":{\"path\":") &&
                strstr(out, "none.yaml"),
            "%s", out);
  free(out), free(err);
  ts_rmtree(dir);
  free(dir), free(missing), free(bad);
}

Test(cli_run, help_and_listing) {
  char *out = NULL;
  const char *help[] = {"run", "--help", NULL};
  cr_assert_eq(run_cli(help, &out, NULL), 0);
  cr_expect(strstr(out, "--tokens") && strstr(out, "--iters") && strstr(out, "floor") &&
                strstr(out, "--ceilings") && strstr(out, "--flush") &&
                strstr(out, "--vs-heuristic"),
            "%s", out);
  free(out);
  const char *top[] = {"--help", NULL};
  cr_assert_eq(run_cli(top, &out, NULL), 0);
  cr_expect(strstr(out, "run [CONFIG") != NULL, "moejit --help lists run: %s", out);
  free(out);
}

/* ---- the layer API without a driver --------------------------------------- */

static void no_driver(void) {
  setenv("MOEJIT_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1);
}

Test(layer_api_nodriver, null_arguments_are_refused, .init = no_driver) {
  moejit_model *m = (moejit_model *)(uintptr_t)0x1;
  cr_expect_eq(moejit_model_load_config(NULL, "qwen3-30b-a3b", NULL, &m),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_null(m, "out is reset on failure");
  cr_expect(strstr(moejit_last_error(), "ctx") != NULL, "%s", moejit_last_error());
  cr_expect_eq(moejit_model_load_spec(NULL, NULL, NULL, &m), MOEJIT_ERR_INVALID_ARGUMENT);

  moejit_moe_args args = {0};
  cr_expect_eq(moejit_moe_forward(NULL, &args, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "model") != NULL, "%s", moejit_last_error());
  size_t bytes = 0;
  cr_expect_eq(moejit_moe_workspace_size(NULL, 16, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_load_report r;
  cr_expect_eq(moejit_model_load_report(NULL, &r), MOEJIT_ERR_INVALID_ARGUMENT);

  moejit_graph *g = (moejit_graph *)(uintptr_t)0x1;
  cr_expect_eq(moejit_graph_begin_capture(NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_graph_end_capture(NULL, NULL, &g), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_graph_launch(NULL, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_graph_destroy(NULL, NULL); /* no-op */
}

Test(layer_api_nodriver, flops_formula) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK, "%s", moejit_last_error());
  /* two GEMMs: 2*T*k*d*2f + 2*T*k*f*d */
  const double want = 6.0 * 256 * 8 * 2048 * 768;
  cr_expect_eq(moejit_moe_flops(&s, 256), want);
  cr_expect_eq(moejit_moe_flops(&s, 0), 0);
  cr_expect_eq(moejit_moe_flops(NULL, 5), 0);
  moejit_load_opts o;
  memset(&o, 0xab, sizeof o);
  moejit_load_opts_init(&o);
  cr_expect_null(o.report);
}

/* Kernels that fail to compile are counted as failed, not compiled, in
 * --json as in the table, and the object says not ok. */
Test(cli_run, json_counts_failed_kernels) {
  char *dir = ts_mkdtemp("cli-run-failed");
  char tpl[1200], env_tpl[1300];
  snprintf(tpl, sizeof tpl, "%s/tests/data/templates/broken", MOEJIT_TEST_SOURCE_DIR);
  snprintf(env_tpl, sizeof env_tpl, "MOEJIT_TEMPLATE_DIR=%s", tpl);
  const char *const env[] = {NO_LIBCUDA, env_tpl, NULL};
  const char *args[] = {"run", "--preset", "olmoe-1b-7b", "--cache-dir", dir, "--json", NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, env, &out, &err);
  cr_expect_eq(rc, 1, "exit %d: %s", rc, err);
  cr_expect(ts_json_valid(out), "not JSON: %s", out);
  char want[64];
  snprintf(want, sizeof want, "\"compiled\":0,\"failed\":%d,\"ok\":false", family_count());
  cr_expect(strstr(out, want) != NULL, "want %s in %s", want, out);
  free(out), free(err);
  ts_rmtree(dir);
  free(dir);
}
