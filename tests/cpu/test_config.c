/* The config layer: presets, the YAML loader (every bad-input class with its
 * exact file:line:col), moejit_spec_validate, helpers, and a mutation fuzz. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "config/config.h"
#include "moejit/moejit.h"
#include "test_support.h"

#define CONFIG_DATA MOEJIT_TEST_SOURCE_DIR "/tests/data/configs"

static moejit_status load_text(const char *yaml, moejit_spec *spec) {
  return moejit_spec_load_string(yaml, strlen(yaml), "cfg.yaml", spec);
}

/* Asserts a CONFIG error at exactly origin:line:col whose message holds
 * `needle`. */
static void expect_error_msg(moejit_status st, const char *origin, int line, int col,
                             const char *needle) {
  const char *msg = moejit_last_error();
  char prefix[1200];
  snprintf(prefix, sizeof prefix, "%s:%d:%d: ", origin, line, col);
  cr_assert_eq(st, MOEJIT_ERR_CONFIG, "status %d (%s), message: %s", st, moejit_status_str(st),
               msg);
  cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0, "expected prefix '%s', got: %s", prefix,
            msg);
  cr_assert(strstr(msg, needle) != NULL, "expected '%s' in: %s", needle, msg);
}

static void expect_error(const char *yaml, int line, int col, const char *needle) {
  moejit_spec spec;
  expect_error_msg(load_text(yaml, &spec), "cfg.yaml", line, col, needle);
}

/* A file under tests/data/configs/bad/ starts with "# expect: L:C: text". */
static void check_bad_file(const char *name) {
  char path[1024], *text;
  size_t len;
  int line = 0, col = 0, used = 0;
  snprintf(path, sizeof path, "%s/bad/%s", CONFIG_DATA, name);
  cr_assert_eq(mj_read_file(path, &text, &len), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(sscanf(text, "# expect: %d:%d: %n", &line, &col, &used), 2, "%s: no expect header",
               path);
  char *eol = strchr(text + used, '\n');
  char *needle = strndup(text + used, eol ? (size_t)(eol - text - used) : strlen(text + used));

  moejit_spec from_file, from_string;
  memset(&from_file, 0x5a, sizeof from_file);
  moejit_spec untouched = from_file;
  expect_error_msg(moejit_spec_load_file(path, &from_file), path, line, col, needle);
  cr_assert(memcmp(&from_file, &untouched, sizeof untouched) == 0, "%s: spec changed on failure",
            name);
  char *file_msg = strdup(moejit_last_error());
  /* The same text from memory, under the same origin, gives the same error. */
  moejit_status st = moejit_spec_load_string(text, len, path, &from_string);
  cr_assert_eq(st, MOEJIT_ERR_CONFIG);
  cr_assert_str_eq(moejit_last_error(), file_msg);
  free(file_msg);
  free(needle);
  free(text);
}

/* ---- presets ------------------------------------------------------------- */

typedef struct preset_expect {
  const char *name;
  int64_t d, f;
  int e, k;
  moejit_route_rule rule;
  int renorm, n_group, topk_group;
  float scale;
} preset_expect;

static const preset_expect presets[] = {
    {"mixtral-8x7b", 4096, 14336, 8, 2, MOEJIT_ROUTE_SOFTMAX_TOPK, 1, 1, 1, 1.0f},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, MOEJIT_ROUTE_SOFTMAX_TOPK, 1, 1, 1, 1.0f},
    {"deepseek-v3", 7168, 2048, 256, 8, MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK, 1, 8, 4, 2.5f},
    {"olmoe-1b-7b", 2048, 1024, 64, 8, MOEJIT_ROUTE_SOFTMAX_TOPK, 0, 1, 1, 1.0f},
};

Test(config_presets, all_load_with_the_right_numbers) {
  const char *const *names = moejit_preset_names();
  size_t n = 0;
  while (names[n]) n++;
  cr_assert_eq(n, MJ_ARRAY_LEN(presets), "%zu presets embedded", n);
  for (size_t i = 0; i < MJ_ARRAY_LEN(presets); i++) {
    const preset_expect *p = &presets[i];
    moejit_spec s;
    cr_assert_eq(moejit_spec_load_preset(p->name, &s), MOEJIT_OK, "%s: %s", p->name,
                 moejit_last_error());
    cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
    cr_assert_str_eq(s.name, p->name);
    cr_assert_eq(s.hidden, p->d);
    cr_assert_eq(s.expert_width, p->f);
    cr_assert_eq(s.experts, p->e);
    cr_assert_eq(s.top_k, p->k);
    cr_assert_eq(s.routing.rule, p->rule, "%s", p->name);
    cr_assert_eq(s.routing.renormalize, p->renorm, "%s", p->name);
    cr_assert_eq(s.routing.n_group, p->n_group, "%s", p->name);
    cr_assert_eq(s.routing.topk_group, p->topk_group, "%s", p->name);
    cr_assert_float_eq(s.routing.scaling_factor, p->scale, 1e-6f);
    cr_assert_eq(s.act_dtype, MOEJIT_DTYPE_BF16);
    cr_assert_eq(s.weight_dtype, MOEJIT_DTYPE_BF16);
    cr_assert_eq(s.out_dtype, MOEJIT_DTYPE_BF16);
    cr_assert_eq(s.logits_dtype, MOEJIT_DTYPE_FP32);
    cr_assert_eq(s.n_archs, 1);
    cr_assert_str_eq(s.archs[0], "sm_90a");
    cr_assert_eq(s.cache_dir[0], '\0');
    const char *yaml = moejit_preset_yaml(p->name);
    cr_assert(yaml && strstr(yaml, p->name), "preset yaml of %s", p->name);
    cr_assert_eq(yaml[0], '#', "%s: presets open with a comment header", p->name);
    int found = 0;
    for (size_t j = 0; names[j]; j++) found += !strcmp(names[j], p->name);
    cr_assert_eq(found, 1, "%s listed once", p->name);
  }
}

Test(config_presets, default_preset_is_embedded) {
  cr_assert_str_eq(moejit_default_preset(), "qwen3-30b-a3b");
  cr_assert_not_null(moejit_preset_yaml(moejit_default_preset()));
  cr_assert_null(moejit_preset_yaml("no-such-model"));
  cr_assert_null(moejit_preset_yaml(NULL));
  cr_assert_eq(mj_embedded_presets_count, MJ_ARRAY_LEN(presets));
  cr_assert_null(mj_embedded_presets[mj_embedded_presets_count].name);
}

Test(config_presets, big_model_gemm_tiles) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("mixtral-8x7b", &s), MOEJIT_OK);
  cr_assert_eq(s.gemm1.tile_m, 128);
  cr_assert_eq(s.gemm1.tile_n, 256);
  cr_assert_eq(s.gemm1.tile_k, 64);
  cr_assert_eq(s.gemm1.stages, 4);
  cr_assert_eq(s.gemm1.warps, 8);
}

Test(config_presets, unknown_preset_lists_known_names) {
  moejit_spec s;
  memset(&s, 0x33, sizeof s);
  moejit_spec before = s;
  cr_assert_eq(moejit_spec_load_preset("mixtral-8x22b", &s), MOEJIT_ERR_NOT_FOUND);
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, "mixtral-8x22b"), "%s", msg);
  for (size_t i = 0; i < MJ_ARRAY_LEN(presets); i++)
    cr_assert(strstr(msg, presets[i].name), "%s", msg);
  cr_assert(memcmp(&s, &before, sizeof s) == 0);
  cr_assert_eq(moejit_spec_load_preset(NULL, &s), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", NULL), MOEJIT_ERR_INVALID_ARGUMENT);
}

/* ---- good configs ---------------------------------------------------------- */

static moejit_spec load_good(const char *name) {
  char path[1024];
  moejit_spec s;
  snprintf(path, sizeof path, "%s/good/%s", CONFIG_DATA, name);
  cr_assert_eq(moejit_spec_load_file(path, &s), MOEJIT_OK, "%s: %s", name, moejit_last_error());
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s: %s", name, moejit_last_error());
  return s;
}

Test(config_load, minimal_takes_defaults) {
  moejit_spec s = load_good("minimal.yaml"), d;
  moejit_spec_init(&d);
  cr_assert_str_eq(s.name, "minimal");
  cr_assert_eq(s.hidden, 1024);
  cr_assert_eq(s.top_k, 4);
  /* Everything but name and shape equals moejit_spec_init's defaults. */
  memcpy(d.name, s.name, sizeof d.name);
  d.hidden = s.hidden, d.expert_width = s.expert_width, d.experts = s.experts, d.top_k = s.top_k;
  cr_assert(memcmp(&s, &d, sizeof s) == 0, "defaults differ from moejit_spec_init");
  cr_assert_eq(s.gemm1.tile_n, 256);
  cr_assert_eq(s.gemm2.tile_n, 256);
  cr_assert_eq(s.align.block_threads, 1024);
}

Test(config_load, full_sets_every_key) {
  moejit_spec s = load_good("full.yaml");
  cr_assert_str_eq(s.name, "full.example_1");
  cr_assert_eq(s.hidden, 4096);
  cr_assert_eq(s.expert_width, 1408);
  cr_assert_eq(s.experts, 64);
  cr_assert_eq(s.top_k, 6);
  cr_assert_eq(s.routing.rule, MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK);
  cr_assert_eq(s.routing.renormalize, 0);
  cr_assert_eq(s.routing.n_group, 8);
  cr_assert_eq(s.routing.topk_group, 3);
  cr_assert_float_eq(s.routing.scaling_factor, 16.5f, 1e-6f);
  cr_assert_eq(s.act_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(s.weight_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(s.logits_dtype, MOEJIT_DTYPE_BF16);
  cr_assert_eq(s.out_dtype, MOEJIT_DTYPE_FP32);
  cr_assert_eq(s.n_archs, 3);
  cr_assert_str_eq(s.archs[0], "sm_90a");
  cr_assert_str_eq(s.archs[1], "sm_80");
  cr_assert_str_eq(s.archs[2], "auto");
  cr_assert_eq(s.route.block_threads, 128);
  cr_assert_eq(s.align.block_threads, 512);
  cr_assert_eq(s.combine.block_threads, 64);
  moejit_gemm_cfg g1 = {16, 256, 128, 3, 8, 1, 1, MOEJIT_RASTER_ALONG_N, MOEJIT_SCHEDULE_COOPERATIVE};
  moejit_gemm_cfg g2 = {32, 64, 32, 8, 4, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
  cr_assert(memcmp(&s.gemm1, &g1, sizeof g1) == 0);
  cr_assert(memcmp(&s.gemm2, &g2, sizeof g2) == 0);
  cr_assert_str_eq(s.cache_dir, "/tmp/moejit-full-example");
  cr_assert_eq(s.cache_max_bytes, 512ull << 20);
}

Test(config_load, linked_defaults_and_nulls) {
  moejit_spec s = load_good("defaults_follow.yaml");
  cr_assert_eq(s.weight_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(s.out_dtype, MOEJIT_DTYPE_FP16);
  cr_assert_eq(s.logits_dtype, MOEJIT_DTYPE_FP32);
  cr_assert_eq(s.routing.topk_group, 4);
  cr_assert_eq(s.routing.renormalize, 1);
  cr_assert_str_eq(s.archs[0], "sm_90");
  cr_assert_eq(s.route.block_threads, 256);
}

Test(config_load, flow_style_and_quoted_strings) {
  moejit_spec s = load_good("flow_style.yaml");
  cr_assert_str_eq(s.name, "flow-style");
  cr_assert_eq(s.routing.renormalize, 0);
  cr_assert_str_eq(s.archs[0], "sm_100a");
  cr_assert_eq(s.cache_max_bytes, 1048576u);
}

Test(config_load, booleans_in_every_spelling) {
  static const char *const words[] = {"true", "True", "YES", "on", "false", "FALSE", "no", "Off"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(words); i++) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "name: b\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2, routing: "
             "{renormalize: %s}}\n",
             words[i]);
    moejit_spec s;
    cr_assert_eq(load_text(yaml, &s), MOEJIT_OK, "%s: %s", words[i], moejit_last_error());
    cr_assert_eq(s.routing.renormalize, i < 4, "%s", words[i]);
  }
}

Test(config_load, relative_cache_dir_follows_the_file) {
  moejit_spec s = load_good("relative_cache.yaml");
  char want[2048];
  snprintf(want, sizeof want, "%s/good/kernel-cache/sub", CONFIG_DATA);
  cr_assert_str_eq(s.cache_dir, want);
  cr_assert_eq(s.cache_max_bytes, 2ull << 30);

  /* From a string, relative means relative to the current directory. */
  char *text;
  size_t len;
  char path[1024], cwd[1024];
  snprintf(path, sizeof path, "%s/good/relative_cache.yaml", CONFIG_DATA);
  cr_assert_eq(mj_read_file(path, &text, &len), MOEJIT_OK);
  cr_assert_eq(moejit_spec_load_string(text, len, "<mem>", &s), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_not_null(getcwd(cwd, sizeof cwd));
  snprintf(want, sizeof want, "%s/kernel-cache/sub", cwd);
  cr_assert_str_eq(s.cache_dir, want);
  free(text);
}

Test(config_load, tilde_expands_to_home) {
  char *home = ts_mkdtemp("config-home");
  setenv("HOME", home, 1);
  moejit_spec s;
  const char *base =
      "name: t\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2}\ncache: {dir: ";
  char yaml[512], want[1024];
  snprintf(yaml, sizeof yaml, "%s~/kernels}\n", base);
  cr_assert_eq(load_text(yaml, &s), MOEJIT_OK, "%s", moejit_last_error());
  snprintf(want, sizeof want, "%s/kernels", home);
  cr_assert_str_eq(s.cache_dir, want);
  snprintf(yaml, sizeof yaml, "%s\"~\"}\n", base); /* a bare ~ is YAML's null */
  cr_assert_eq(load_text(yaml, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_str_eq(s.cache_dir, home);
  snprintf(yaml, sizeof yaml, "%s~}\n", base);
  cr_assert_eq(load_text(yaml, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_str_eq(s.cache_dir, "", "null means: not given");
  snprintf(yaml, sizeof yaml, "%s~root/x}\n", base);
  expect_error(yaml, 3, 14, "only '~' and '~/...' are expanded");
  unsetenv("HOME");
  snprintf(yaml, sizeof yaml, "%s~/x}\n", base);
  expect_error(yaml, 3, 14, "$HOME is not set");
  ts_rmtree(home);
  free(home);
}

Test(config_load, string_and_file_agree) {
  static const char *const goods[] = {"minimal.yaml", "full.yaml", "defaults_follow.yaml",
                                      "flow_style.yaml"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(goods); i++) {
    char path[1024], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/good/%s", CONFIG_DATA, goods[i]);
    cr_assert_eq(mj_read_file(path, &text, &len), MOEJIT_OK);
    moejit_spec a, b;
    memset(&a, 0, sizeof a), memset(&b, 0xff, sizeof b);
    cr_assert_eq(moejit_spec_load_file(path, &a), MOEJIT_OK, "%s", moejit_last_error());
    cr_assert_eq(moejit_spec_load_string(text, len, "x", &b), MOEJIT_OK, "%s", moejit_last_error());
    cr_assert(memcmp(&a, &b, sizeof a) == 0, "%s: file and string loads differ", goods[i]);
    free(text);
  }
}

/* The example configs of configs/more-models/ load, are named after their
 * files, and stay out of the presets (configs/models/ only). */
Test(config_load, more_models_examples_load) {
  DIR *d = opendir(MOEJIT_TEST_SOURCE_DIR "/configs/more-models");
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".yaml")) continue;
    char path[1200], name[256];
    snprintf(path, sizeof path, "%s/configs/more-models/%s", MOEJIT_TEST_SOURCE_DIR, e->d_name);
    snprintf(name, sizeof name, "%.*s", (int)(len - 5), e->d_name);
    moejit_spec s, p;
    cr_assert_eq(moejit_spec_load_file(path, &s), MOEJIT_OK, "%s: %s", path, moejit_last_error());
    cr_expect_str_eq(s.name, name, "%s", path);
    cr_expect(s.hidden >= 2048 && s.experts >= 8, "%s: a real model's shape", path);
    cr_expect_eq(moejit_spec_load_preset(name, &p), MOEJIT_ERR_NOT_FOUND, "%s is no preset", name);
    n++;
  }
  closedir(d);
  cr_assert_eq(n, 7);
}

Test(config_load, string_needs_no_terminator) {
  const char *yaml =
      "name: cut\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2}\nGARBAGE";
  moejit_spec s;
  size_t len = strstr(yaml, "GARBAGE") - yaml;
  cr_assert_eq(moejit_spec_load_string(yaml, len, NULL, &s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(moejit_spec_load_string(yaml, strlen(yaml), NULL, &s), MOEJIT_ERR_CONFIG);
  /* libyaml reports a missing ':' at the end of the stream, which it
   * places on the line after the last one. */
  cr_assert(strncmp(moejit_last_error(),
                    "<string>:4:1: malformed YAML: could not find expected ':'", 57) == 0,
            "%s", moejit_last_error());
  cr_assert_eq(moejit_spec_load_string(NULL, 0, NULL, &s), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert_eq(moejit_spec_load_string(yaml, len, NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
}

/* ---- IO errors ------------------------------------------------------------- */

Test(config_io, missing_file_and_directory) {
  moejit_spec s;
  memset(&s, 0x11, sizeof s);
  moejit_spec before = s;
  const char *missing = "/tmp/moejit-no-such-dir/none.yaml";
  cr_assert_eq(moejit_spec_load_file(missing, &s), MOEJIT_ERR_IO);
  cr_assert(strstr(moejit_last_error(), missing), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), strerror(ENOENT)), "%s", moejit_last_error());
  cr_assert_eq(moejit_spec_load_file(CONFIG_DATA, &s), MOEJIT_ERR_IO);
  cr_assert(strstr(moejit_last_error(), CONFIG_DATA), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), strerror(EISDIR)), "%s", moejit_last_error());
  cr_assert(memcmp(&s, &before, sizeof s) == 0);
  cr_assert_eq(moejit_spec_load_file(NULL, &s), MOEJIT_ERR_INVALID_ARGUMENT);
}

Test(config_io, oversized_file_is_refused_before_reading) {
  char *dir = ts_mkdtemp("config-big");
  size_t n = MJ_CONFIG_MAX_BYTES + 1;
  char *big = malloc(n + 1);
  cr_assert_not_null(big);
  memset(big, '#', n);
  big[n] = '\0';
  char *path = ts_write_file(dir, "big.yaml", big);
  moejit_spec s;
  expect_error_msg(moejit_spec_load_file(path, &s), path, 1, 1,
                   "more than the limit of 1048576 (1 MiB)");
  expect_error_msg(moejit_spec_load_string(big, n, "big", &s), "big", 1, 1, "1 MiB");
  /* Exactly at the limit is fine size-wise (and only comments: empty). */
  expect_error_msg(moejit_spec_load_string(big, n - 1, "big", &s), "big", 1, 1,
                   "the config is empty");
  free(path);
  free(big);
  ts_rmtree(dir);
  free(dir);
}

/* ---- every bad-input class (tests/data/configs/bad) -------------------------- */

#define BAD(test, file)    \
  Test(config_bad, test) { \
    check_bad_file(file);  \
  }

BAD(malformed_indentation, "malformed_indent.yaml")
BAD(malformed_unclosed_flow, "malformed_flow.yaml")
BAD(only_comments, "comments_only.yaml")
BAD(top_level_list, "top_level_list.yaml")
BAD(top_level_scalar, "top_level_scalar.yaml")
BAD(unknown_key_with_hint, "unknown_key.yaml")
BAD(unknown_top_level_key, "unknown_top_key.yaml")
BAD(unknown_key_without_hint, "unknown_key_no_hint.yaml")
BAD(missing_model_key, "missing_key.yaml")
BAD(missing_name, "missing_name.yaml")
BAD(missing_model, "missing_model.yaml")
BAD(string_for_int, "string_for_int.yaml")
BAD(quoted_int, "quoted_int.yaml")
BAD(list_for_mapping, "list_for_map.yaml")
BAD(null_for_required, "null_for_required.yaml")
BAD(non_boolean_renormalize, "bool_renormalize.yaml")
BAD(mapping_for_int, "map_for_int.yaml")
BAD(duplicate_key, "duplicate_key.yaml")
BAD(duplicate_top_key, "duplicate_top_key.yaml")
BAD(top_k_above_32, "top_k_too_big.yaml")
BAD(top_k_above_experts_points_at_later_key, "top_k_over_experts.yaml")
BAD(zero_size, "zero_hidden.yaml")
BAD(negative_count, "negative_experts.yaml")
BAD(not_a_multiple, "not_multiple.yaml")
BAD(integer_overflow, "overflow.yaml")
BAD(int64_but_not_int32, "big_int32.yaml")
BAD(float_for_int, "float_for_int.yaml")
BAD(hex_is_refused, "hex_int.yaml")
BAD(leading_zero_is_refused, "leading_zero.yaml")
BAD(unsupported_tile, "tile_unsupported.yaml")
BAD(smem_budget_from_dtype, "smem_budget.yaml")
BAD(smem_budget_from_stages, "smem_stages.yaml")
BAD(register_budget, "register_budget.yaml")
BAD(nesting_too_deep, "deep_nesting.yaml")
BAD(alias, "alias.yaml")
BAD(alias_bomb, "alias_bomb.yaml")
BAD(explicit_tag, "tag.yaml")
BAD(two_documents, "two_documents.yaml")
BAD(arch_unknown_in_list, "arch_unknown.yaml")
BAD(arch_unknown_scalar, "arch_scalar_unknown.yaml")
BAD(arch_too_many, "arch_too_many.yaml")
BAD(arch_duplicate, "arch_duplicate.yaml")
BAD(cluster_needs_sm90, "cluster_sm80.yaml")
BAD(cluster_2x2, "cluster_2x2.yaml")
BAD(cluster_n_needs_even_n_tiles, "cluster_n_odd.yaml")
BAD(dtype_typo, "dtype_typo.yaml")
BAD(rule_unknown, "rule_unknown.yaml")
BAD(group_not_divisor, "group_not_divisor.yaml")
BAD(topk_group_range, "topk_group_range.yaml")
BAD(top_k_over_kept_groups, "top_k_over_groups.yaml")
BAD(softmax_with_groups, "softmax_groups.yaml")
BAD(scaling_zero, "scaling_zero.yaml")
BAD(scaling_nan, "scaling_nan.yaml")
BAD(name_characters, "name_chars.yaml")
BAD(name_too_long, "name_too_long.yaml")
BAD(size_suffix, "size_suffix.yaml")
BAD(block_threads, "threads.yaml")
BAD(non_string_key, "map_key.yaml")

/* No bad file is left without a test above, and each one checks out. */
Test(config_bad, every_file_in_the_directory) {
  DIR *d = opendir(CONFIG_DATA "/bad");
  cr_assert_not_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strstr(e->d_name, ".yaml")) continue;
    check_bad_file(e->d_name);
    n++;
  }
  closedir(d);
  cr_assert_geq(n, 50);
}

/* ---- classes that need generated input ------------------------------------- */

Test(config_bad, empty_input) {
  expect_error("", 1, 1, "the config is empty");
  expect_error("\n\n   \n", 1, 1, "the config is empty");
  expect_error("---\n", 1, 1, "the config is empty");
  expect_error("~\n", 1, 1, "the config is empty");
}

Test(config_bad, generated_deep_nesting_stops_at_the_cap) {
  /* Containers 1..16 are fine; the 17th is refused where it opens. */
  char yaml[4096];
  size_t o = 0;
  for (int i = 0; i < 200; i++) yaml[o++] = '[';
  yaml[o] = '\0';
  expect_error(yaml, 1, MJ_CONFIG_MAX_DEPTH + 1, "nesting is deeper than 16 levels");
  /* Block style: each level a mapping indented two more columns. */
  mj_buf b = {0};
  for (int i = 0; i < 20; i++) mj_buf_printf(&b, "%*sk%d:\n", 2 * i, "", i);
  expect_error(b.data, 17, 33, "nesting is deeper than 16 levels");
  mj_buf_free(&b);
}

Test(config_bad, node_count_limit) {
  mj_buf b = {0};
  mj_buf_puts(&b, "name: many\nlist:\n");
  for (int i = 0; i < MJ_CONFIG_MAX_NODES; i++) mj_buf_puts(&b, "- 1\n");
  /* Nodes: root map, 2 keys, "many", the list, then items: the item that
   * makes the count exceed the limit sits at line 3 + (limit - 5). */
  expect_error(b.data, 3 + MJ_CONFIG_MAX_NODES - 5, 3, "too many YAML nodes (the limit is 10000");
  mj_buf_free(&b);
}

Test(config_bad, invalid_utf8_and_control_bytes) {
  expect_error("name: ok\nmodel:\n  hidden: \xff\xfe\n", 3, 11, "malformed YAML");
  expect_error("name: a\x01z\n", 1, 8, "malformed YAML");
  /* A NUL inside a double-quoted string reaches the loader as text. */
  static const char yaml[] =
      "name: \"a\\0b\"\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2}\n";
  expect_error(yaml, 1, 7, "contains a NUL character");
}

/* Integer and number forms the docs promise to refuse, each at its value. */
Test(config_bad, value_forms) {
  static const struct {
    const char *value, *needle;
  } cases[] = {
      {"1_024", "expected an integer, got '1_024'"},
      {"1e3", "expected an integer, got the number 1e3"},
      {"0o17", "'0o17' is not a decimal integer"},
      {"-0x10", "'-0x10' is not a decimal integer"},
      {"+1024", ""}, /* a sign is fine: loads */
      {"'1024'",
       "got the quoted string '1024' (allowed 8..1048576, a multiple of 8); HINT: remove the "
       "quotes"},
      {"[1024]", "expected an integer, got a list"},
      {"-9223372036854775808", "is out of range"},
      {"-9223372036854775809", "does not fit in a 64-bit integer"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    char yaml[256];
    snprintf(yaml, sizeof yaml,
             "name: v\nmodel:\n  hidden: %s\n  expert_width: 64\n  experts: 4\n  top_k: 2\n",
             cases[i].value);
    moejit_spec s;
    if (!*cases[i].needle) {
      cr_assert_eq(load_text(yaml, &s), MOEJIT_OK, "%s: %s", cases[i].value, moejit_last_error());
      cr_assert_eq(s.hidden, 1024);
      continue;
    }
    expect_error(yaml, 3, 11, cases[i].needle);
  }
  expect_error(
      "name: v\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2, routing: {renormalize: "
      "\"yes\"}}",
      2, 84,
      "expected a boolean, got the quoted string 'yes' (allowed true/false, yes/no, on/off); HINT: "
      "remove the quotes");
  expect_error(
      "name: v\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2}\ndtypes: {weight: {a: "
      "1}}",
      3, 18, "dtypes.weight: expected a string, got a mapping (allowed fp32, fp16, bf16)");
  expect_error(
      "name: v\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2, routing: "
      "{scaling_factor: \"2\"}}",
      2, 87,
      "got the quoted string '2' (allowed a finite number > 0 and <= 1000); HINT: remove the "
      "quotes");
  expect_error(
      "name: v\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2, routing: "
      "{scaling_factor: 1e999}}",
      2, 87, "model.routing.scaling_factor: inf is out of range");
}

Test(config_bad, top_k_before_experts_points_at_top_k) {
  /* Cross-field: the later of the two keys is top_k here. */
  expect_error("name: c\nmodel:\n  experts: 4\n  hidden: 64\n  expert_width: 64\n  top_k: 5\n", 6,
               10, "model.top_k: 5 is out of range (allowed 1..min(experts, 32) = 1..4)");
}

Test(config_bad, defaults_point_at_the_section) {
  /* A rule broken only by defaults points at the mapping that would hold
   * the key: here fp32 activations make weights fp32 (weight follows). */
  expect_error(
      "name: c\nmodel: {hidden: 64, expert_width: 64, experts: 4, top_k: 2}\ndtypes:\n"
      "  logits: fp32\n  activation: fp32\n",
      5, 15, "kernels.gemm1: needs 393216 bytes");
}

/* ---- moejit_spec_validate: same rules, messages name the field --------------- */

static moejit_spec valid_spec(void) {
  moejit_spec s;
  moejit_spec_init(&s);
  s.hidden = 2048, s.expert_width = 768, s.experts = 128, s.top_k = 8;
  return s;
}

static void expect_invalid(const moejit_spec *s, const char *prefix) {
  cr_assert_eq(moejit_spec_validate(s), MOEJIT_ERR_CONFIG, "expected '%s'", prefix);
  const char *msg = moejit_last_error();
  cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0, "expected '%s', got: %s", prefix, msg);
}

Test(config_validate, init_needs_a_shape) {
  moejit_spec s;
  moejit_spec_init(&s);
  expect_invalid(&s, "model.hidden: 0 is out of range (allowed 8..1048576, a multiple of 8)");
  s = valid_spec();
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(moejit_spec_validate(NULL), MOEJIT_ERR_INVALID_ARGUMENT);
}

/* One expert's W1 (2f x d elements) must fit the kernels' int32 offsets:
 * refused as a config error, not at NVRTC's static_assert. */
Test(config_validate, expert_weights_fit_int32_offsets) {
  moejit_spec s = valid_spec();
  s.hidden = 32768, s.expert_width = 32768;
  expect_invalid(&s,
                 "model.expert_width: hidden 32768 x expert_width 32768: one expert's W1 "
                 "holds 2 x 32768 x 32768 = 2147483648 elements");
  s.expert_width = 32760; /* 2 x 32768 x 32760 < 2^31 */
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
}

Test(config_validate, every_field_is_named) {
  moejit_spec s = valid_spec();
  s.name[0] = '\0';
  expect_invalid(&s, "name: is empty");
  s = valid_spec(), memset(s.name, 'x', sizeof s.name);
  expect_invalid(&s, "name: is not NUL-terminated");
  s = valid_spec(), s.expert_width = 12;
  expect_invalid(&s, "model.expert_width: 12 is not a multiple of 8");
  s = valid_spec(), s.experts = 2000;
  expect_invalid(&s, "model.experts: 2000 is out of range (allowed 1..1024)");
  s = valid_spec(), s.experts = 4;
  expect_invalid(&s, "model.top_k: 8 is out of range (allowed 1..min(experts, 32) = 1..4)");
  s = valid_spec(), s.top_k = 0;
  expect_invalid(&s, "model.top_k: 0 is out of range");
  s = valid_spec(), s.routing.rule = (moejit_route_rule)5;
  expect_invalid(&s, "model.routing.rule: value 5 is not a rule");
  s = valid_spec(), s.routing.renormalize = 2;
  expect_invalid(&s, "model.routing.renormalize: 2 is not 0 or 1");
  s = valid_spec(), s.routing.scaling_factor = NAN;
  expect_invalid(&s, "model.routing.scaling_factor: nan is out of range");
  s = valid_spec(), s.routing.scaling_factor = -1.0f;
  expect_invalid(&s, "model.routing.scaling_factor: -1 is out of range");
  s = valid_spec(), s.routing.n_group = 2;
  expect_invalid(&s, "model.routing.n_group: 2 is only used by rule sigmoid_grouped_topk");
  s = valid_spec(), s.routing.rule = MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK, s.routing.n_group = 128;
  s.routing.topk_group = 1;
  expect_invalid(&s, "model.routing.n_group: 128 leaves 1 expert per group");
  s.routing.n_group = 16, s.routing.topk_group = 17;
  expect_invalid(&s, "model.routing.topk_group: 17 is out of range (allowed 1..n_group = 1..16)");
  s.routing.topk_group = 16;
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  s = valid_spec(), s.weight_dtype = (moejit_dtype)7;
  expect_invalid(&s, "dtypes.weight: 7 is not supported (allowed bf16, fp16 or fp32)");
  s = valid_spec(), s.n_archs = 0;
  expect_invalid(&s, "target.arch: 0 archs given");
  s = valid_spec(), s.n_archs = 2, strcpy(s.archs[1], "sm_89a");
  expect_invalid(&s, "target.arch[1]: 'sm_89a' is not a supported arch");
  s = valid_spec(), s.combine.block_threads = 2048;
  expect_invalid(&s, "kernels.combine.block_threads: 2048 is out of range");
  s = valid_spec(), s.gemm2.tile_k = 16;
  expect_invalid(&s, "kernels.gemm2.tile_k: 16 is not supported (allowed 32, 64 or 128)");
  s = valid_spec(), s.gemm1.stages = 1;
  expect_invalid(&s, "kernels.gemm1.stages: 1 is out of range (allowed 2..8)");
  s = valid_spec(), s.gemm1.warps = 6;
  expect_invalid(&s, "kernels.gemm1.warps: 6 is not supported (allowed 4, 8 or 12)");
  s = valid_spec(), s.gemm1.cluster_n = 4;
  expect_invalid(&s, "kernels.gemm1.cluster_n: 4 is out of range (allowed 1 or 2)");
  s = valid_spec(), s.gemm2.raster = (moejit_raster)3;
  expect_invalid(&s, "kernels.gemm2.raster: value 3 is not a raster order");
  s = valid_spec(), s.gemm1.schedule = (moejit_gemm_schedule)2;
  expect_invalid(
      &s, "kernels.gemm1.schedule: value 2 is not a schedule (allowed cooperative, pingpong)");
  s = valid_spec(), memset(s.cache_dir, 'c', sizeof s.cache_dir);
  expect_invalid(&s, "cache.dir: is not NUL-terminated");
}

Test(config_validate, budgets_state_numbers_and_hints) {
  moejit_spec s = valid_spec();
  s.gemm1.tile_m = 256, s.gemm1.tile_n = 256, s.gemm1.warps = 8, s.gemm1.stages = 2;
  expect_invalid(
      &s,
      "kernels.gemm1: a 256x256 tile with 8 warps needs 256 fp32 accumulators per thread, "
      "more than 128");
  cr_assert(strstr(moejit_last_error(), "HINT: use more warps"), "%s", moejit_last_error());
  s.gemm1.warps = 12; /* 65536 / 384 = 170.7 -> 171 */
  expect_invalid(&s, "kernels.gemm1: a 256x256 tile with 12 warps needs 171 fp32 accumulators");
  s = valid_spec(), s.weight_dtype = MOEJIT_DTYPE_FP32;
  expect_invalid(&s, "kernels.gemm1: needs 393216 bytes of shared memory");
  const char *msg = moejit_last_error();
  cr_assert(strstr(msg, "232448"), "%s", msg);
  cr_assert(strstr(msg, "HINT: use fewer stages (at most 2 fit) or a smaller tile"), "%s", msg);
  s.gemm1.stages = 2; /* 196608 bytes: fits */
  expect_invalid(&s, "kernels.gemm2: needs 393216 bytes of shared memory");
  cr_assert(strstr(moejit_last_error(), "at most 2 fit"), "%s", moejit_last_error());
  s.gemm2.stages = 2;
  cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "%s", moejit_last_error());
  s.gemm1.tile_k = 128, s.gemm1.tile_m = 256, s.gemm1.warps = 12; /* 2*384*128*4 > limit */
  s.gemm1.tile_n = 128;
  expect_invalid(&s,
                 "kernels.gemm1: needs 393216 bytes of shared memory = stages 2 * (tile_m 256 + "
                 "tile_n 128) * tile_k 128 * 4 bytes");
  cr_assert(strstr(moejit_last_error(), "even 2 stages do not fit"), "%s", moejit_last_error());
}

/* ---- helpers -------------------------------------------------------------- */

Test(config_helpers, dtype_names_and_sizes) {
  cr_assert_str_eq(moejit_dtype_name(MOEJIT_DTYPE_BF16), "bf16");
  cr_assert_str_eq(moejit_dtype_name(MOEJIT_DTYPE_FP16), "fp16");
  cr_assert_str_eq(moejit_dtype_name(MOEJIT_DTYPE_FP32), "fp32");
  cr_assert_str_eq(moejit_dtype_name((moejit_dtype)42), "?");
  cr_assert_str_eq(moejit_gemm_schedule_name(MOEJIT_SCHEDULE_COOPERATIVE), "cooperative");
  cr_assert_str_eq(moejit_gemm_schedule_name(MOEJIT_SCHEDULE_PINGPONG), "pingpong");
  cr_assert_str_eq(moejit_gemm_schedule_name((moejit_gemm_schedule)MJ_SCHEDULE_COUNT), "?");
  cr_assert_str_eq(moejit_gemm_schedule_name((moejit_gemm_schedule)-1), "?");
  /* the allowed-values text lists the table's names */
  char joined[128] = "";
  for (int i = 0; i < MJ_SCHEDULE_COUNT; i++)
    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", i ? ", " : "",
             mj_schedule_names[i]);
  cr_assert_str_eq(joined, MJ_SCHEDULE_ALLOWED);
  cr_assert_eq(moejit_dtype_size(MOEJIT_DTYPE_BF16), 2);
  cr_assert_eq(moejit_dtype_size(MOEJIT_DTYPE_FP16), 2);
  cr_assert_eq(moejit_dtype_size(MOEJIT_DTYPE_FP32), 4);
  cr_assert_eq(moejit_dtype_size((moejit_dtype)-1), 0);
}

Test(config_helpers, summary) {
  moejit_spec s;
  char buf[192];
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK);
  mj_spec_summary(&s, buf, sizeof buf);
  cr_assert_str_eq(buf, "qwen3-30b-a3b d=2048 f=768 E=128 k=8 softmax bf16");
  cr_assert_eq(moejit_spec_load_preset("deepseek-v3", &s), MOEJIT_OK);
  mj_spec_summary(&s, buf, sizeof buf);
  cr_assert_str_eq(buf, "deepseek-v3 d=7168 f=2048 E=256 k=8 sigmoid-grouped bf16");
  mj_spec_summary(&s, buf, 12);
  cr_assert_str_eq(buf, "deepseek-v3");
}

/* moejit_gemm_cfg_text names each option that differs from the default,
 * both clusters apart (a 2x2 cluster is invalid, but a pruned candidate's
 * name still shows it). */
Test(config_helpers, gemm_cfg_text) {
  char buf[96];
  moejit_gemm_cfg g = {
      128, 256, 64, 4, 8, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
  moejit_gemm_cfg_text(&g, buf, sizeof buf);
  cr_assert_str_eq(buf, "128x256x64 s4 w8");
  g.cluster_m = 2;
  moejit_gemm_cfg_text(&g, buf, sizeof buf);
  cr_assert_str_eq(buf, "128x256x64 s4 w8 c2");
  g.cluster_m = 1, g.cluster_n = 2, g.raster = MOEJIT_RASTER_ALONG_N;
  g.schedule = MOEJIT_SCHEDULE_PINGPONG;
  moejit_gemm_cfg_text(&g, buf, sizeof buf);
  cr_assert_str_eq(buf, "128x256x64 s4 w8 along_n cn2 pingpong");
  g.cluster_m = 2;
  moejit_gemm_cfg_text(&g, buf, sizeof buf);
  cr_assert_str_eq(buf, "128x256x64 s4 w8 along_n c2 cn2 pingpong");
  moejit_gemm_cfg_text(&g, buf, 8);
  cr_assert_str_eq(buf, "128x256");
}

Test(config_helpers, arch_parse) {
  int a = -1;
  cr_assert_eq(mj_arch_parse("sm_80", &a), 80);
  cr_assert_eq(a, 0);
  cr_assert_eq(mj_arch_parse("sm_90a", &a), 90);
  cr_assert_eq(a, 1);
  cr_assert_eq(mj_arch_parse("sm_100a", &a), 100);
  cr_assert_eq(a, 1);
  cr_assert_eq(mj_arch_parse("sm_120", NULL), 120);
  static const char *const bad[] = {"auto",  "sm_",     "sm_9",    "sm_90b", "sm_090", "compute_90",
                                    "SM_90", "sm_1000", "sm_90aa", "",       " sm_90"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    a = -1;
    cr_assert_eq(mj_arch_parse(bad[i], &a), 0, "%s", bad[i]);
    cr_assert_eq(a, 0, "%s", bad[i]);
  }
  cr_assert_eq(mj_arch_parse(NULL, NULL), 0);
}

Test(config_helpers, gemm_smem_bytes) {
  moejit_gemm_cfg g = {128, 256, 64, 4, 8, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
  cr_assert_eq(mj_gemm_smem_bytes(&g, 2), 4u * 384 * 64 * 2);
  g.stages = 3, g.tile_m = 16;
  cr_assert_eq(mj_gemm_smem_bytes(&g, 4), 3u * 272 * 64 * 4);
  cr_assert_eq(mj_gemm_smem_bytes(NULL, 2), 0);
}

/* ---- mutation fuzz ---------------------------------------------------------- */

/* One random edit: delete / duplicate / swap a line, cut the text, or
 * overwrite / insert a random byte. */
static void mutate(mj_buf *b, ts_rng *r) {
  size_t n = b->len;
  if (n == 0) return;
  size_t at = ts_next(r) % n;
  size_t ls = at, le = at;
  while (ls > 0 && b->data[ls - 1] != '\n') ls--;
  while (le < n && b->data[le] != '\n') le++;
  if (le < n) le++;
  static const char interesting[] = ":-[]{}&*!#'\"\n\t ,?|>%@`0~";
  switch (ts_next(r) % 6) {
    case 0: /* delete the line */
      memmove(b->data + ls, b->data + le, n - le), b->len -= le - ls;
      break;
    case 1: { /* duplicate the line */
      size_t l = le - ls;
      /* memcpy, not strndup: an earlier edit may have put a NUL byte in the line */
      char *copy = malloc(l ? l : 1);
      cr_assert(copy);
      memcpy(copy, b->data + ls, l);
      mj_buf rest = {0};
      mj_buf_append(&rest, b->data + ls, n - ls);
      b->len = ls;
      mj_buf_append(b, copy, l);
      mj_buf_append(b, rest.data, rest.len);
      mj_buf_free(&rest);
      free(copy);
      break;
    }
    case 2:
      b->len = at;
      break; /* truncate */
    case 3:
      b->data[at] = (char)(ts_next(r) & 0xff);
      break;
    case 4:
      b->data[at] = interesting[ts_next(r) % (sizeof interesting - 1)];
      break;
    default: { /* insert a byte */
      mj_buf rest = {0};
      mj_buf_append(&rest, b->data + at, n - at);
      b->len = at;
      char ch = ts_next(r) & 1 ? interesting[ts_next(r) % (sizeof interesting - 1)]
                               : (char)(ts_next(r) & 0xff);
      mj_buf_append(b, &ch, 1);
      mj_buf_append(b, rest.data, rest.len);
      mj_buf_free(&rest);
    }
  }
  b->data[b->len] = '\0';
}

static int has_position_prefix(const char *msg, const char *origin) {
  size_t ol = strlen(origin);
  if (strncmp(msg, origin, ol) != 0 || msg[ol] != ':') return 0;
  const char *p = msg + ol + 1;
  size_t d1 = strspn(p, "0123456789");
  if (!d1 || p[d1] != ':') return 0;
  p += d1 + 1;
  size_t d2 = strspn(p, "0123456789");
  return d2 && p[d2] == ':' && p[d2 + 1] == ' ' && atoi(msg + ol + 1) >= 1 && atoi(p) >= 1;
}

Test(config_fuzz, mutated_configs_never_crash) {
  char path[1024], *base;
  size_t base_len;
  snprintf(path, sizeof path, "%s/good/full.yaml", CONFIG_DATA);
  cr_assert_eq(mj_read_file(path, &base, &base_len), MOEJIT_OK);
  ts_rng r = ts_rng_fresh("config mutation fuzz");
  int ok = 0, bad = 0;
  for (int iter = 0; iter < 2000; iter++) {
    mj_buf b = {0};
    mj_buf_append(&b, base, base_len);
    int edits = 1 + (int)(ts_next(&r) % 4);
    for (int e = 0; e < edits; e++) mutate(&b, &r);
    cr_assert(!b.oom);
    moejit_spec s;
    memset(&s, 0x77, sizeof s);
    moejit_spec before = s;
    moejit_status st = moejit_spec_load_string(b.data, b.len, "fuzz.yaml", &s);
    cr_assert(st == MOEJIT_OK || st == MOEJIT_ERR_CONFIG, "iteration %d: status %d: %s", iter, st,
              moejit_last_error());
    if (st == MOEJIT_OK) {
      ok++;
      cr_assert_eq(moejit_spec_validate(&s), MOEJIT_OK, "iteration %d: loaded but invalid: %s",
                   iter, moejit_last_error());
    } else {
      bad++;
      cr_assert(has_position_prefix(moejit_last_error(), "fuzz.yaml"), "iteration %d: %s", iter,
                moejit_last_error());
      cr_assert(memcmp(&s, &before, sizeof s) == 0, "iteration %d: spec changed on failure", iter);
    }
    mj_buf_free(&b);
  }
  cr_assert_gt(bad, 100, "mutations should mostly break the config (ok %d, bad %d)", ok, bad);
  free(base);
}

/* kernels.gemmN.schedule: the wgmma path's ping-pong schedule by name. */
Test(config_load, gemm_schedule) {
  const char *base = "name: pp\nmodel: {hidden: 2048, expert_width: 768, experts: 128, top_k: 8}\n"
                     "kernels:\n  gemm2: {tile_m: 128, tile_n: 128, schedule: %s}\n";
  char yaml[512];
  moejit_spec spec;
  snprintf(yaml, sizeof yaml, base, "pingpong");
  cr_assert_eq(load_text(yaml, &spec), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(spec.gemm2.schedule, MOEJIT_SCHEDULE_PINGPONG);
  cr_assert_eq(spec.gemm1.schedule, MOEJIT_SCHEDULE_COOPERATIVE, "the default");
  snprintf(yaml, sizeof yaml, base, "pingpnog");
  expect_error(yaml, 4, 47, "did you mean 'pingpong'");
  snprintf(yaml, sizeof yaml, base, "split");
  expect_error(yaml, 4, 47,
               "'split' is not one of the allowed values (allowed cooperative, pingpong)");
}

/* Each schedule's name loads as its value, validates, and loads back the
 * same (every schedule: name -> value -> name). */
Test(config_load, gemm_schedule_round_trips) {
  const char *base =
      "name: sched\nmodel: {hidden: 2048, expert_width: 768, experts: 128, top_k: 8}\n"
      "kernels:\n  gemm1: {tile_m: 64, tile_n: 256, schedule: %s}\n"
      "  gemm2: {tile_m: 128, tile_n: 128, schedule: %s}\n";
  char yaml[512];
  moejit_spec spec, back;
  snprintf(yaml, sizeof yaml, base, "pingpong", "cooperative");
  cr_assert_eq(load_text(yaml, &spec), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(spec.gemm1.schedule, MOEJIT_SCHEDULE_PINGPONG);
  cr_assert_eq(spec.gemm2.schedule, MOEJIT_SCHEDULE_COOPERATIVE);
  cr_assert_eq(moejit_spec_validate(&spec), MOEJIT_OK, "%s", moejit_last_error());
  const moejit_gemm_schedule all[] = {MOEJIT_SCHEDULE_COOPERATIVE, MOEJIT_SCHEDULE_PINGPONG};
  cr_assert_eq(MJ_ARRAY_LEN(all), MJ_SCHEDULE_COUNT);
  for (size_t i = 0; i < MJ_ARRAY_LEN(all); i++) {
    spec.gemm1.schedule = all[i], spec.gemm2.schedule = all[(i + 1) % MJ_ARRAY_LEN(all)];
    snprintf(yaml, sizeof yaml, base, moejit_gemm_schedule_name(spec.gemm1.schedule),
             moejit_gemm_schedule_name(spec.gemm2.schedule));
    cr_assert_eq(load_text(yaml, &back), MOEJIT_OK, "%s", moejit_last_error());
    cr_assert_eq(back.gemm1.schedule, spec.gemm1.schedule, "%s", yaml);
    cr_assert_eq(back.gemm2.schedule, spec.gemm2.schedule, "%s", yaml);
  }
}

/* A message longer than the last-error buffer (a long NVRTC log) ends with
 * a line saying how much was not kept, never mid-line without a word. */
Test(errors, an_overlong_message_says_it_was_cut) {
  const size_t n = 40000;
  char *text = malloc(n + 1);
  cr_assert_not_null(text);
  memset(text, 'x', n);
  text[n] = '\0';
  cr_assert_eq(mj_fail(MOEJIT_ERR_COMPILE, "log:\n%s", text), MOEJIT_ERR_COMPILE);
  const char *msg = moejit_last_error();
  const size_t len = strlen(msg);
  cr_assert_lt(len, 16384);
  cr_assert(strstr(msg, "more bytes of this message not kept]"), "%s", msg + len - 80);
  const char *note = strstr(msg, "\n[... ");
  cr_assert_not_null(note);
  cr_assert_eq(atol(note + 6), (long)(n + 5 - (size_t)(note - msg)),
               "the count is what was cut: %s", note);
  free(text);
  cr_assert_eq(mj_fail(MOEJIT_ERR_COMPILE, "short"), MOEJIT_ERR_COMPILE);
  cr_assert_str_eq(moejit_last_error(), "short");
}
