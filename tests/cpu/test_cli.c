/* The moejit command-line tool, run as a user would: exit codes (0 ok,
 * 1 runtime failure, 2 usage/config error), --json output that parses,
 * a second compile served from the cache, config errors with file:line:col. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_support.h"

static char *tmp;

static void setup(void) { tmp = ts_mkdtemp("cli"); }
static void teardown(void) {
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 300);

#define RUN(out, err, ...) ts_run_cli((const char *const[]){__VA_ARGS__, NULL}, NULL, out, err)

Test(cli, version_and_help) {
  char *out = NULL;
  cr_assert_eq(RUN(&out, NULL, "--version"), 0);
  cr_assert(strstr(out, "moejit 0.1.0"), "got: %s", out);
  free(out);
  cr_assert_eq(RUN(&out, NULL, "--help"), 0);
  cr_assert(strstr(out, "usage: moejit"), "got: %s", out);
  cr_assert(strstr(out, "qwen3-30b-a3b"), "presets listed: %s", out);
  free(out);
  const char *cmds[] = {"compile", "gen", "cache", "info"};
  for (size_t i = 0; i < 4; i++) {
    cr_assert_eq(RUN(&out, NULL, cmds[i], "--help"), 0, "%s --help", cmds[i]);
    cr_assert(strstr(out, "usage: moejit"), "%s --help printed: %s", cmds[i], out);
    free(out);
  }
}

Test(cli, usage_errors_exit_2) {
  cr_assert_eq(ts_run_cli((const char *const[]){NULL}, NULL, NULL, NULL), 2);
  cr_assert_eq(RUN(NULL, NULL, "frobnicate"), 2);
  cr_assert_eq(RUN(NULL, NULL, "compile", "--bogus"), 2);
  cr_assert_eq(RUN(NULL, NULL, "compile", "--jobs", "0"), 2);
  cr_assert_eq(RUN(NULL, NULL, "compile", "--jobs"), 2);
  cr_assert_eq(RUN(NULL, NULL, "compile", "--preset", "no-such-model"), 2);
  cr_assert_eq(RUN(NULL, NULL, "gen", "--preset", "qwen3-30b-a3b"), 2, "gen needs --kernel");
  cr_assert_eq(RUN(NULL, NULL, "gen", "--preset", "qwen3-30b-a3b", "--kernel", "nope"), 2);
  cr_assert_eq(RUN(NULL, NULL, "cache"), 2);
  cr_assert_eq(RUN(NULL, NULL, "cache", "explode"), 2);
}

Test(cli, config_error_names_file_line_col_and_exits_2) {
  char *cfg = ts_write_file(tmp, "bad.yaml",
                            "name: broken\n"
                            "model:\n"
                            "  hidden: 2048\n"
                            "  expert_width: 768\n"
                            "  experts: 8\n"
                            "  top_k: 300\n");
  char *err = NULL;
  int rc = RUN(NULL, &err, "compile", cfg, "--cache-dir", tmp);
  cr_assert_eq(rc, 2, "exit %d, stderr: %s", rc, err);
  cr_assert(strstr(err, "bad.yaml:6:"), "stderr should name bad.yaml:6:COL: %s", err);
  cr_assert(strstr(err, "top_k"), "stderr should name the key: %s", err);
  free(err);
  free(cfg);
}

Test(cli, missing_config_file_exits_1) {
  char *err = NULL;
  int rc = RUN(NULL, &err, "compile", "/tmp/definitely/not/here.yaml");
  cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
  cr_assert(strstr(err, "not/here.yaml"), "names the path: %s", err);
  free(err);
}

Test(cli, compile_twice_second_is_all_cache_hits) {
  char *cache = NULL;
  cr_assert(asprintf(&cache, "%s/cache", tmp) > 0);
  char *out = NULL, *err = NULL;
  int rc = RUN(&out, &err, "compile", "--preset", "qwen3-30b-a3b", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0, "first compile failed: %s %s", out, err);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  int kernels = ts_count_substr(out, "\"kernel\":");
  cr_assert_gt(kernels, 0);
  cr_assert_eq(ts_count_substr(out, "\"cache_hit\":false"), kernels, "cold: all misses: %s", out);
  free(out);
  free(err);
  rc = RUN(&out, &err, "compile", "--preset", "qwen3-30b-a3b", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0, "%s", err);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  cr_assert_eq(ts_count_substr(out, "\"cache_hit\":true"), kernels, "warm: all hits: %s", out);
  free(out);
  free(err);
  /* the table form says the same */
  rc = RUN(&out, NULL, "compile", "--preset", "qwen3-30b-a3b", "--cache-dir", cache);
  cr_assert_eq(rc, 0);
  cr_assert(strstr(out, "from cache"), "table footer: %s", out);
  cr_assert_eq(ts_count_substr(out, " hit "), kernels, "table: %s", out);
  free(out);

  rc = RUN(&out, NULL, "cache", "list", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  cr_assert_eq(ts_count_substr(out, "\"ok\":true"), kernels, "%s", out);
  free(out);
  rc = RUN(&out, NULL, "cache", "stats", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  free(out);
  rc = RUN(&out, NULL, "cache", "verify", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0, "%s", out);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  free(out);
  rc = RUN(&out, NULL, "cache", "clear", "--cache-dir", cache, "--json");
  cr_assert_eq(rc, 0);
  cr_assert(ts_json_valid(out));
  free(out);
  cr_assert_eq(ts_count_files(cache, ".mjc"), 0, "clear removed all entries");
  free(cache);
}

Test(cli, compile_for_a_device_builds_what_its_load_builds) {
  char *cache = NULL;
  cr_assert(asprintf(&cache, "%s/cache", tmp) > 0);
  const char *const env[] = {"MOEJIT_TUNED_DIR=", "MOEJIT_TUNED_DISABLE=", NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(
      (const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--arch", "sm_90a", "--device",
                            "CLI Test GPU", "--cache-dir", cache, "--json", NULL},
      env, &out, &err);
  cr_assert_eq(rc, 0, "%s %s", out, err);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  cr_expect(strstr(out, "\"device\":\"CLI Test GPU\"") && strstr(out, "\"arch\":\"sm_90a\""), "%s",
            out);
  cr_expect(strstr(out, "\"kernels\":5,\"cache_hits\":0,\"cache_misses\":5"), "%s", out);
  cr_expect(strstr(out, "no tuned table for CLI Test GPU"), "the report says why: %s", out);
  free(out), free(err);
  rc = ts_run_cli((const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--arch", "sm_90a",
                                        "--device", "CLI Test GPU", "--cache-dir", cache, NULL},
                  env, &out, &err);
  cr_assert_eq(rc, 0, "%s %s", out, err);
  cr_expect(strstr(out, "5 kernel families, 5 from cache, 0 compiled now"), "%s", out);
  cr_expect_eq(ts_count_substr(out, " hit "), 5, "%s", out);
  free(out), free(err);
  cr_expect_eq(ts_count_files(cache, ".mjc"), 9,
               "route, align, combine, and each GEMM's tile in three modules (tile kernels, "
               "GEMV and decode, _wide64)");
  /* an arch that a prebuild cannot take: usage error, nothing compiled */
  rc = RUN(&out, &err, "compile", "--preset", "olmoe-1b-7b", "--arch", "auto", "--device", "X",
           "--cache-dir", cache);
  cr_expect_eq(rc, 2, "%s %s", out, err);
  cr_expect(strstr(err, "HINT"), "%s", err);
  free(out), free(err);
  free(cache);
}

Test(cli, verify_finds_corrupt_entry_and_fix_removes_it) {
  char *cache = NULL;
  cr_assert(asprintf(&cache, "%s/cache", tmp) > 0);
  cr_assert_eq(RUN(NULL, NULL, "compile", "--preset", "olmoe-1b-7b", "--cache-dir", cache), 0);
  /* flip a byte near the end of one entry */
  char *cmd = NULL;
  cr_assert(asprintf(&cmd,
                     "f=$(find %s -name '*.mjc' | head -1); s=$(stat -c %%s \"$f\");"
                     "printf '\\x5a' | dd of=\"$f\" bs=1 seek=$((s-3)) conv=notrunc 2>/dev/null",
                     cache) > 0);
  cr_assert_eq(system(cmd), 0);
  free(cmd);
  char *out = NULL;
  cr_assert_eq(RUN(&out, NULL, "cache", "verify", "--cache-dir", cache), 1, "%s", out);
  cr_assert(strstr(out, "1 bad"), "%s", out);
  free(out);
  cr_assert_eq(RUN(&out, NULL, "cache", "verify", "--cache-dir", cache, "--fix"), 0);
  free(out);
  cr_assert_eq(RUN(&out, NULL, "cache", "verify", "--cache-dir", cache), 0, "%s", out);
  free(out);
  /* the next compile rebuilds the removed entry: one miss, the rest hits */
  cr_assert_eq(RUN(&out, NULL, "compile", "--preset", "olmoe-1b-7b", "--cache-dir", cache, "--json"),
               0);
  cr_assert_eq(ts_count_substr(out, "\"cache_hit\":false"), 1, "%s", out);
  free(out);
  free(cache);
}

Test(cli, emit_dir_writes_cubin_ptx_and_source) {
  char *emit = NULL;
  cr_assert(asprintf(&emit, "%s/emit", tmp) > 0);
  char *out = NULL;
  int rc = RUN(&out, NULL, "compile", "--preset", "qwen3-30b-a3b", "--no-cache", "--emit-dir",
               emit, "--arch", "sm_80");
  cr_assert_eq(rc, 0, "%s", out);
  int kernels = ts_count_substr(out, " miss ");
  cr_assert_gt(kernels, 0, "%s", out);
  cr_assert_eq(ts_count_files(emit, ".cubin"), kernels);
  cr_assert_eq(ts_count_files(emit, ".ptx"), kernels);
  cr_assert_eq(ts_count_files(emit, ".cu") - ts_count_files(emit, ".cubin"), kernels, ".cu files");
  free(out);
  free(emit);
}

Test(cli, gen_prints_specialized_source) {
  char *out = NULL;
  cr_assert_eq(RUN(&out, NULL, "gen", "--preset", "deepseek-v3", "--kernel", "route"), 0);
  cr_assert(strstr(out, "kExperts = 256"), "prelude constant missing");
  cr_assert(strstr(out, "extern \"C\""), "entry missing");
  free(out);
  cr_assert_eq(RUN(&out, NULL, "gen", "qwen3-30b-a3b", "--kernel", "combine"), 0,
               "a preset name works as CONFIG");
  cr_assert(strstr(out, "kExperts = 128"));
  free(out);
}

/* Options never take an empty value: `--cache-dir "$UNSET"` must not fall
 * back on the default cache (which `cache clear` would then empty). */
Test(cli, empty_option_values_are_usage_errors) {
  char *cache = NULL, *env = NULL;
  cr_assert(asprintf(&cache, "%s/default-cache", tmp) > 0);
  cr_assert(asprintf(&env, "MOEJIT_CACHE_DIR=%s", cache) > 0);
  const char *const envs[] = {env, NULL};
  char *sub = NULL;
  cr_assert(asprintf(&sub, "%s/ab", cache) > 0);
  cr_assert_eq(mkdir(cache, 0755), 0);
  cr_assert_eq(mkdir(sub, 0755), 0);
  free(ts_write_file(sub, "ab0123456789abcdef0123456789abcd.mjc", "an entry's name\n"));
  free(sub);
  int entries = ts_count_files(cache, ".mjc");
  cr_assert_eq(entries, 1);
  char *err = NULL;
  const char *const *cases[] = {
      (const char *const[]){"cache", "clear", "--cache-dir", "", NULL},
      (const char *const[]){"cache", "clear", "--cache-dir=", NULL},
      (const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--device", "", NULL},
      (const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--emit-dir", "", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    cr_expect_eq(ts_run_cli(cases[i], envs, NULL, &err), 2, "%s %s", cases[i][0], cases[i][2]);
    cr_expect(err && strstr(err, "non-empty value"), "%s", err);
    free(err);
  }
  cr_expect_eq(ts_count_files(cache, ".mjc"), entries, "the default cache was touched");
  free(env);
  free(cache);
}

Test(cli, prune_names_the_source_of_a_bad_size) {
  char *err = NULL;
  const char *const junk[] = {"MOEJIT_CACHE_MAXSIZE=junk", NULL};
  cr_assert_eq(ts_run_cli((const char *const[]){"cache", "prune", "--cache-dir", tmp, NULL}, junk,
                          NULL, &err),
               2);
  cr_expect(strstr(err, "$MOEJIT_CACHE_MAXSIZE") && !strstr(err, "--max-size:"), "%s", err);
  free(err);
  const char *const empty[] = {"MOEJIT_CACHE_MAXSIZE=", NULL};
  cr_assert_eq(ts_run_cli((const char *const[]){"cache", "prune", "--cache-dir", tmp, NULL}, empty,
                          NULL, &err),
               2, "an empty MOEJIT_CACHE_MAXSIZE is unset, as the compiler reads it");
  cr_expect(strstr(err, "needs --max-size"), "%s", err);
  free(err);
  cr_assert_eq(ts_run_cli((const char *const[]){"cache", "prune", "--cache-dir", tmp, "--max-size",
                                                "junk", NULL},
                          NULL, NULL, &err),
               2);
  cr_expect(strstr(err, "--max-size"), "%s", err);
  free(err);
}

/* --arch is checked as the config's target.arch would be, before NVRTC. */
Test(cli, arch_option_follows_the_config_rules) {
  char *err = NULL;
  const char *const *cases[] = {
      (const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--arch", "sm_80a", NULL},
      (const char *const[]){"compile", "--preset", "olmoe-1b-7b", "--arch", "sm_75", NULL},
      (const char *const[]){"gen", "--preset", "olmoe-1b-7b", "--kernel", "route", "--arch",
                            "sm_52", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    cr_expect_eq(ts_run_cli(cases[i], NULL, NULL, &err), 2, "%s", err);
    cr_expect(err && strstr(err, "--arch") && strstr(err, "not a supported arch"), "%s", err);
    free(err);
  }
  char *cfg = ts_write_file(tmp, "cluster.yaml",
                            "name: t\n"
                            "model: {hidden: 1024, expert_width: 512, experts: 16, top_k: 4}\n"
                            "kernels: {gemm1: {cluster_m: 2}}\n");
  cr_expect_eq(
      ts_run_cli((const char *const[]){"compile", cfg, "--arch", "sm_80", NULL}, NULL, NULL, &err),
      2);
  cr_expect(err && strstr(err, "cluster") && strstr(err, "sm_90"), "%s", err);
  free(err);
  free(cfg);
}

Test(cli, fifo_as_config_is_refused_without_blocking) {
  char *fifo = NULL, *err = NULL;
  cr_assert(asprintf(&fifo, "%s/config.fifo", tmp) > 0);
  cr_assert_eq(mkfifo(fifo, 0644), 0);
  int rc =
      ts_run_cli((const char *const[]){"gen", fifo, "--kernel", "route", NULL}, NULL, NULL, &err);
  cr_expect_eq(rc, 1, "%s", err);
  cr_expect(err && strstr(err, "not a regular file"), "%s", err);
  free(err);
  free(fifo);
}
