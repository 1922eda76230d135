/* Tuned tables (src/tune/tuned_table.c) and the load-time picking of GEMM
 * variants (src/ops/gemm_choice.c), without a GPU: parse/write round trips
 * of fresh random tables, errors with file:line:col for every malformed or
 * out-of-range field, the nearest-bucket rule against a brute force, the
 * table of a device (whole, or one shape's entries as a load reads them)
 * from $MOEJIT_TUNED_DIR and the embedded list,
 * $MOEJIT_TUNED_DISABLE, what a load keeps and reports, and pinning the
 * heuristic at one T (moejit_tuned_table_pin_heuristic). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/ops.h"
#include "test_support.h"
#include "tuned_support.h"
#include "ops/gemm.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

#define OK(call) cr_assert_eq((call), MOEJIT_OK, "%s: %s", #call, moejit_last_error())

static const int kTileM[] = {16, 32, 64, 128, 256}, kTileN[] = {32, 64, 128, 256};
static const int kTileK[] = {32, 64, 128};

static int pick(ts_rng *r, const int *set, int n) {
  return set[ts_next(r) % (uint64_t)n];
}

/* A random entry within every range (not necessarily runnable). */
static mj_tuned_entry random_entry(ts_rng *r) {
  mj_tuned_entry e;
  memset(&e, 0, sizeof e);
  strcpy(e.kernel, ts_next(r) & 1 ? "gemm1" : "gemm2");
  e.dtype = ts_next(r) & 1 ? MOEJIT_DTYPE_BF16 : MOEJIT_DTYPE_FP16;
  e.hidden = 8 * (int64_t)(1 + ts_next(r) % 1024);
  e.expert_width = 8 * (int64_t)(1 + ts_next(r) % 512);
  e.experts = (int32_t)(1 + ts_next(r) % 256);
  e.top_k = (int32_t)(1 + ts_next(r) % (uint64_t)(e.experts < 32 ? e.experts : 32));
  e.tokens = (int64_t)1 << (ts_next(r) % 20);
  if (ts_next(r) & 1) e.tokens += (int64_t)(ts_next(r) % 1000);
  e.cfg = (moejit_gemm_cfg){pick(r, kTileM, 5),
                            pick(r, kTileN, 4),
                            pick(r, kTileK, 3),
                            (int)(2 + ts_next(r) % 7),
                            (int[]){4, 8, 12}[ts_next(r) % 3],
                            (int)(1 + ts_next(r) % 2),
                            (int)(1 + ts_next(r) % 2),
                            (moejit_raster)(ts_next(r) % 2),
                            (moejit_gemm_schedule)(ts_next(r) % MJ_SCHEDULE_COUNT)};
  if (e.cfg.cluster_m == 2 && e.cfg.cluster_n == 2) /* pairs along M or N, not both */
    e.cfg.cluster_n = 1;
  e.path = (moejit_gemm_path[]){MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                MOEJIT_GEMM_PATH_GEMV}[ts_next(r) % 3];
  e.us = ts_uniform(r, 0.5, 5000.0);
  e.heuristic_us = ts_next(r) % 4 ? ts_uniform(r, 0.5, 5000.0) : 0.0;
  e.pinned = ts_next(r) % 4 == 0;
  return e;
}

static void fill_header(mj_tuned_table *t, const char *device) {
  memset(t, 0, sizeof *t);
  strcpy(t->device, device);
  strcpy(t->arch, "sm_90a");
  strcpy(t->nvrtc, "12.8");
  t->driver = 12080;
  strcpy(t->date, "2026-11-23");
}

static void expect_same_entry(const mj_tuned_entry *a, const mj_tuned_entry *b, size_t i) {
  cr_expect_str_eq(a->kernel, b->kernel, "entry %zu", i);
  cr_expect_eq(a->dtype, b->dtype, "entry %zu", i);
  cr_expect(a->hidden == b->hidden && a->expert_width == b->expert_width &&
                a->experts == b->experts && a->top_k == b->top_k && a->tokens == b->tokens,
            "entry %zu: shape or tokens differ", i);
  cr_expect(memcmp(&a->cfg, &b->cfg, sizeof a->cfg) == 0, "entry %zu: cfg differs", i);
  cr_expect_eq(a->path, b->path, "entry %zu", i);
  cr_expect(a->us == b->us, "entry %zu: us %.17g became %.17g", i, a->us, b->us);
  cr_expect(a->heuristic_us == b->heuristic_us, "entry %zu: heuristic_us %.17g became %.17g", i,
            a->heuristic_us, b->heuristic_us);
  cr_expect_eq(a->pinned, b->pinned, "entry %zu: pinned", i);
}

/* ---- parse / write ------------------------------------------------------------- */

Test(tuned_table, round_trip_of_a_random_table_is_exact) {
  ts_rng r = ts_rng_fresh("tuned round trip");
  char *dir = ts_mkdtemp("tuned-rt");
  mj_tuned_table t, back, again;
  fill_header(&t, "NVIDIA H100 80GB HBM3");
  for (int i = 0; i < 120; i++) {
    mj_tuned_entry e = random_entry(&r);
    OK(mj_tuned_table_put(&t, &e));
  }
  for (size_t i = 1; i < t.n; i++) { /* put keeps the table sorted */
    const mj_tuned_entry *a = &t.entries[i - 1], *b = &t.entries[i];
    int c = strcmp(a->kernel, b->kernel);
    cr_assert(c < 0 || (c == 0 &&
                        (strcmp(moejit_dtype_name(a->dtype), moejit_dtype_name(b->dtype)) <= 0)),
              "entries %zu and %zu out of order", i - 1, i);
  }
  char path[1200], path2[1200];
  snprintf(path, sizeof path, "%s/sub/dir/t.yaml", dir); /* missing directories are made */
  snprintf(path2, sizeof path2, "%s/t2.yaml", dir);
  OK(mj_tuned_table_write(&t, path));
  OK(mj_tuned_table_load_file(path, &back));
  cr_assert_eq(back.n, t.n);
  cr_expect_str_eq(back.device, t.device);
  cr_expect_str_eq(back.arch, t.arch);
  cr_expect_str_eq(back.nvrtc, t.nvrtc);
  cr_expect_eq(back.driver, t.driver);
  cr_expect_str_eq(back.date, t.date);
  cr_expect_str_eq(back.origin, path);
  for (size_t i = 0; i < t.n; i++) expect_same_entry(&t.entries[i], &back.entries[i], i);
  /* and the text is stable: writing what was read gives the same bytes */
  OK(mj_tuned_table_write(&back, path2));
  char *a = NULL, *b = NULL;
  size_t la = 0, lb = 0;
  OK(mj_read_file(path, &a, &la));
  OK(mj_read_file(path2, &b, &lb));
  cr_expect(la == lb && memcmp(a, b, la) == 0, "rewritten table differs:\n%s\n---\n%s", a, b);
  cr_expect_eq(ts_count_files(dir, ".tmp"), 0, "temp files left in %s", dir);
  OK(mj_tuned_table_parse(a, la, "mem", &again));
  cr_expect_eq(again.n, t.n);
  free(a), free(b);
  mj_tuned_table_free(&t), mj_tuned_table_free(&back), mj_tuned_table_free(&again);
  cr_expect_eq(t.n, 0);
  cr_expect_null(t.entries);
  ts_rmtree(dir);
  free(dir);
}

Test(tuned_table, strings_with_quotes_and_an_empty_table_round_trip) {
  char *dir = ts_mkdtemp("tuned-str");
  mj_tuned_table t, back;
  fill_header(&t, "GPU \"quoted\" \\ name: #1");
  t.arch[0] = '\0';
  char path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  OK(mj_tuned_table_write(&t, path));
  OK(mj_tuned_table_load_file(path, &back));
  cr_expect_str_eq(back.device, t.device);
  cr_expect_str_eq(back.arch, "");
  cr_expect_eq(back.n, 0);
  mj_tuned_table_free(&back);
  ts_rmtree(dir);
  free(dir);
}

/* A gemv entry keeps its tile in the file (the module it is built with)
 * and round-trips; the line differs from an mma entry's in the path word
 * only, so entries of the other paths are written as before. */
Test(tuned_table, gemv_entry_round_trips) {
  char *dir = ts_mkdtemp("tuned-gemv");
  mj_tuned_table t, back;
  fill_header(&t, "NVIDIA H100 80GB HBM3");
  mj_tuned_entry e = {
      .kernel = "gemm2",
      .dtype = MOEJIT_DTYPE_BF16,
      .hidden = 2048,
      .expert_width = 768,
      .experts = 128,
      .top_k = 8,
      .tokens = 1,
      .cfg = {128, 256, 128, 2, 8, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE},
      .path = MOEJIT_GEMM_PATH_GEMV,
      .us = 11.5,
      .heuristic_us = 11.75};
  OK(mj_tuned_table_put(&t, &e));
  e.tokens = 2, e.path = MOEJIT_GEMM_PATH_MMA;
  OK(mj_tuned_table_put(&t, &e));
  char path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  OK(mj_tuned_table_write(&t, path));
  char *text = NULL;
  size_t len = 0;
  OK(mj_read_file(path, &text, &len));
  const char *line =
      "  - {kernel: gemm2, dtype: bf16, hidden: 2048, expert_width: 768, experts: 128, top_k: 8, "
      "tokens: 1, tile: [128, 256, 128], stages: 2, warps: 8, path: gemv, us: 11.5, "
      "heuristic_us: 11.75}\n"
      "  - {kernel: gemm2, dtype: bf16, hidden: 2048, expert_width: 768, experts: 128, top_k: 8, "
      "tokens: 2, tile: [128, 256, 128], stages: 2, warps: 8, path: mma, us: 11.5, "
      "heuristic_us: 11.75}\n";
  cr_expect(strstr(text, line), "%s", text);
  OK(mj_tuned_table_load_file(path, &back));
  cr_assert_eq(back.n, 2);
  for (size_t i = 0; i < t.n; i++) expect_same_entry(&t.entries[i], &back.entries[i], i);
  cr_expect_eq(back.entries[0].path, MOEJIT_GEMM_PATH_GEMV);
  free(text);
  mj_tuned_table_free(&t), mj_tuned_table_free(&back);
  ts_rmtree(dir);
  free(dir);
}

/* The shipped tables are written by this writer: parse + write gives their
 * bytes back (so the writer's output did not change under them). */
Test(tuned_table, shipped_tables_rewrite_byte_for_byte) {
  char *dir = ts_mkdtemp("tuned-shipped");
  for (size_t i = 0; i < mj_embedded_tuned_count; i++) {
    mj_tuned_table t;
    OK(mj_tuned_table_parse(mj_embedded_tuned[i].text, mj_embedded_tuned[i].len, "shipped", &t));
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, mj_embedded_tuned[i].name);
    OK(mj_tuned_table_write(&t, path));
    char *text = NULL;
    size_t len = 0;
    OK(mj_read_file(path, &text, &len));
    cr_expect(len == mj_embedded_tuned[i].len && !memcmp(text, mj_embedded_tuned[i].text, len),
              "%s is not what the writer writes", mj_embedded_tuned[i].name);
    free(text);
    mj_tuned_table_free(&t);
  }
  ts_rmtree(dir);
  free(dir);
}

/* The writer never writes what its reader refuses: header strings that are
 * not UTF-8 (stray bytes, overlong forms, surrogates) are refused, and
 * nothing is written; well-formed UTF-8 reads back as it was. */
Test(tuned_table, header_strings_must_be_utf8) {
  char *dir = ts_mkdtemp("tuned-utf8");
  char path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  static const char *const bad[] = {"\xff\xfe GPU", "\xc0\x80 GPU", "\xed\xa0\x80 GPU",
                                    "GPU \xe2\x82", "\xf4\x90\x80\x80 GPU"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    mj_tuned_table t;
    fill_header(&t, bad[i]);
    cr_expect_eq(mj_tuned_table_write(&t, path), MOEJIT_ERR_INVALID_ARGUMENT, "case %zu", i);
    cr_expect(strstr(moejit_last_error(), "not valid UTF-8"), "%s", moejit_last_error());
    cr_expect(access(path, F_OK) != 0, "case %zu: a file was written", i);
  }
  mj_tuned_table t, back;
  fill_header(&t,
              "\xc3\x9c"
              "n"
              "\xc3\xaf"
              "c"
              "\xc3\xb8"
              "d"
              "\xc3\xa9"
              " GPU \xf0\x9f\x9a\x80");
  OK(mj_tuned_table_write(&t, path));
  OK(mj_tuned_table_load_file(path, &back));
  cr_expect_str_eq(back.device, t.device);
  mj_tuned_table_free(&back);
  ts_rmtree(dir);
  free(dir);
}

Test(tuned_table, put_replaces_the_same_bucket) {
  ts_rng r = ts_rng_fresh("tuned put");
  mj_tuned_table t;
  fill_header(&t, "dev");
  mj_tuned_entry e = random_entry(&r);
  OK(mj_tuned_table_put(&t, &e));
  e.us = 1.25;
  e.cfg.stages = e.cfg.stages == 2 ? 3 : 2;
  OK(mj_tuned_table_put(&t, &e));
  cr_assert_eq(t.n, 1);
  cr_expect_eq(t.entries[0].us, 1.25);
  cr_expect_eq(t.entries[0].cfg.stages, e.cfg.stages);
  e.tokens += 1;
  OK(mj_tuned_table_put(&t, &e));
  cr_expect_eq(t.n, 2);
  cr_expect_lt(t.entries[0].tokens, t.entries[1].tokens);
  mj_tuned_entry bad = e;
  bad.cfg.tile_m = 48;
  cr_expect_eq(mj_tuned_table_put(&t, &bad), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "tile") != NULL, "%s", moejit_last_error());
  bad = e, bad.path = MOEJIT_GEMM_PATH_AUTO;
  cr_expect_eq(mj_tuned_table_put(&t, &bad), MOEJIT_ERR_INVALID_ARGUMENT);
  bad = e, strcpy(bad.kernel, "route");
  cr_expect_eq(mj_tuned_table_put(&t, &bad), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(t.n, 2, "a refused entry was added");
  mj_tuned_table_free(&t);
}

Test(tuned_table, write_refuses_what_parse_would_refuse) {
  ts_rng r = ts_rng_fresh("tuned write refuse");
  char *dir = ts_mkdtemp("tuned-refuse");
  char path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  mj_tuned_table t;
  fill_header(&t, "");
  cr_expect_eq(mj_tuned_table_write(&t, path), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "device") != NULL, "%s", moejit_last_error());
  fill_header(&t, "dev");
  mj_tuned_entry e = random_entry(&r);
  OK(mj_tuned_table_put(&t, &e));
  t.entries[0].us = NAN; /* changed behind put's back */
  cr_expect_eq(mj_tuned_table_write(&t, path), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "us") != NULL, "%s", moejit_last_error());
  t.entries[0].us = 3;
  e.tokens += 1;
  OK(mj_tuned_table_put(&t, &e));
  cr_assert_eq(t.n, 2);
  t.entries[0].tokens = t.entries[1].tokens = 5; /* two entries, one key */
  cr_expect_eq(mj_tuned_table_write(&t, path), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(ts_count_files(dir, NULL), 0, "something was written");
  mj_tuned_table_free(&t);
  ts_rmtree(dir);
  free(dir);
}

/* One entry in block style, each key on its own line (line 3 onward), with
 * `key` given the text `value` (NULL: left out) or `extra` appended. */
static const char *const kKeys[] = {"kernel", "dtype",  "hidden", "expert_width", "experts",
                                    "top_k",  "tokens", "tile",   "stages",       "warps",
                                    "path",   "us",     "pinned"};
/* NULL: the key is left out unless a test gives it a value */
static const char *const kValues[] = {"gemm1",        "bf16", "2048", "768",   "128",  "8", "1",
                                      "[64, 64, 64]", "8",    "8",    "wgmma", "21.3", NULL};

static char *entry_text(const char *key, const char *value, const char *extra) {
  mj_buf b = {0};
  mj_buf_puts(&b, "device: \"NVIDIA H100 80GB HBM3\"\nentries:\n");
  int first = 1;
  for (size_t i = 0; i < MJ_ARRAY_LEN(kKeys); i++) {
    const char *v = key && !strcmp(key, kKeys[i]) ? value : kValues[i];
    if (!v) continue;
    mj_buf_printf(&b, "%s%s: %s\n", first ? "  - " : "    ", kKeys[i], v);
    first = 0;
  }
  if (extra) mj_buf_printf(&b, "    %s\n", extra);
  return mj_buf_take(&b);
}

/* Line of key in entry_text (the header takes lines 1 and 2). */
static int line_of(const char *key) {
  for (size_t i = 0; i < MJ_ARRAY_LEN(kKeys); i++)
    if (!strcmp(kKeys[i], key)) return 3 + (int)i;
  return -1;
}

static void expect_error(const char *text, const char *where, const char *what) {
  mj_tuned_table t;
  moejit_status st = mj_tuned_table_parse(text, strlen(text), "bad.yaml", &t);
  cr_expect_eq(st, MOEJIT_ERR_CONFIG, "accepted:\n%s", text);
  cr_expect_eq(t.n, 0);
  cr_expect(strstr(moejit_last_error(), where) != NULL, "want '%s' in: %s\n%s", where,
            moejit_last_error(), text);
  cr_expect(strstr(moejit_last_error(), what) != NULL, "want '%s' in: %s", what,
            moejit_last_error());
}

/* key = value at its line: the error names the value's position and path. */
static void expect_value_error(const char *key, const char *value, const char *what) {
  char *text = entry_text(key, value, NULL), where[96];
  snprintf(where, sizeof where, "bad.yaml:%d:%zu: entries[0].%s", line_of(key), 5 + strlen(key) + 2,
           key);
  expect_error(text, where, what);
  free(text);
}

Test(tuned_table, the_template_entry_parses) {
  char *text = entry_text(NULL, NULL, NULL);
  mj_tuned_table t;
  OK(mj_tuned_table_parse(text, strlen(text), "good.yaml", &t));
  cr_assert_eq(t.n, 1);
  const mj_tuned_entry *e = &t.entries[0];
  cr_expect_str_eq(e->kernel, "gemm1");
  cr_expect_eq(e->cfg.tile_m, 64);
  cr_expect_eq(e->cfg.cluster_m, 1);
  cr_expect_eq(e->cfg.raster, MOEJIT_RASTER_ALONG_M);
  cr_expect_eq(e->path, MOEJIT_GEMM_PATH_WGMMA);
  cr_expect_eq(e->us, 21.3);
  cr_expect_eq(e->heuristic_us, 0);
  cr_expect_eq(e->pinned, 0, "not pinned where the key is left out");
  mj_tuned_table_free(&t);
  free(text);
}

/* Each schedule by name: parsed into its value, written back under the
 * same name (cooperative, the default, left out), read back the same; a
 * value outside the enum is refused by put with the allowed names. */
Test(tuned_table, every_schedule_parses_and_writes_back) {
  static const struct {
    const char *name;
    moejit_gemm_schedule value;
  } kScheds[] = {{"cooperative", MOEJIT_SCHEDULE_COOPERATIVE},
                 {"pingpong", MOEJIT_SCHEDULE_PINGPONG}};
  cr_assert_eq(MJ_ARRAY_LEN(kScheds), MJ_SCHEDULE_COUNT);
  char *dir = ts_mkdtemp("tuned-sched");
  char path[1200], extra[64], want[160];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  for (size_t i = 0; i < MJ_ARRAY_LEN(kScheds); i++) {
    snprintf(extra, sizeof extra, "schedule: %s", kScheds[i].name);
    char *text = entry_text("tile", "[128, 256, 64]", extra);
    mj_tuned_table t, back;
    OK(mj_tuned_table_parse(text, strlen(text), "good.yaml", &t));
    cr_assert_eq(t.n, 1);
    cr_expect_eq(t.entries[0].cfg.schedule, kScheds[i].value, "%s", kScheds[i].name);
    cr_expect_str_eq(moejit_gemm_schedule_name(t.entries[0].cfg.schedule), kScheds[i].name);
    OK(mj_tuned_table_write(&t, path));
    char *out = NULL;
    size_t len = 0;
    OK(mj_read_file(path, &out, &len));
    if (kScheds[i].value == MOEJIT_SCHEDULE_COOPERATIVE)
      snprintf(want, sizeof want, "warps: 8, path: wgmma, us: 21.3");
    else
      snprintf(want, sizeof want, "warps: 8, schedule: %s, path: wgmma, us: 21.3", kScheds[i].name);
    cr_expect(strstr(out, want) != NULL, "want '%s' in:\n%s", want, out);
    OK(mj_tuned_table_load_file(path, &back));
    cr_assert_eq(back.n, 1);
    expect_same_entry(&t.entries[0], &back.entries[0], 0);
    free(out), free(text);
    mj_tuned_table_free(&t), mj_tuned_table_free(&back);
  }
  mj_tuned_table t;
  fill_header(&t, "dev");
  mj_tuned_entry e;
  memset(&e, 0, sizeof e);
  strcpy(e.kernel, "gemm1");
  e.dtype = MOEJIT_DTYPE_BF16, e.hidden = 2048, e.expert_width = 768, e.experts = 128;
  e.top_k = 8, e.tokens = 64, e.path = MOEJIT_GEMM_PATH_WGMMA, e.us = 10;
  e.cfg = ts_tile(64, 256, 64, 4, 8);
  e.cfg.schedule = (moejit_gemm_schedule)MJ_SCHEDULE_COUNT;
  cr_expect_neq(mj_tuned_table_put(&t, &e), MOEJIT_OK);
  cr_expect(strstr(moejit_last_error(),
                   "value 2 is not a schedule (allowed cooperative, pingpong)") != NULL,
            "%s", moejit_last_error());
  cr_expect_eq(t.n, 0);
  mj_tuned_table_free(&t);
  ts_rmtree(dir);
  free(dir);
}

Test(tuned_table, out_of_range_values_name_their_position) {
  expect_value_error("kernel", "gemm3", "allowed gemm1, gemm2");
  expect_value_error("dtype", "fp32", "allowed bf16, fp16");
  expect_value_error("hidden", "100", "multiple of 8");
  expect_value_error("hidden", "0", "out of range");
  expect_value_error("expert_width", "2097152", "out of range");
  expect_value_error("experts", "1025", "allowed 1..1024");
  expect_value_error("top_k", "33", "out of range");
  expect_value_error("tokens", "0", "out of range");
  expect_value_error("tokens", "268435456", "int32"); /* * top_k 8 > INT32_MAX */
  expect_value_error("tile", "[48, 64, 64]", "not a supported tile");
  expect_value_error("tile", "[64, 64]", "a list of 3 integers");
  expect_value_error("tile", "64x64x64", "a list of 3 integers");
  expect_value_error("stages", "9", "allowed 2..8");
  expect_value_error("warps", "6", "allowed 4, 8, 12");
  expect_value_error("path", "auto", "allowed mma, wgmma, gemv");
  expect_value_error("path", "simt", "allowed mma, wgmma, gemv");
  expect_value_error("us", "-1", "out of range");
  expect_value_error("us", "nan", "a decimal number");
  expect_value_error("hidden", "\"2048\"", "expected an integer");
  expect_value_error("hidden", "0x800", "decimal integer");
  expect_value_error("hidden", "02048", "decimal integer");
  expect_value_error("experts", "99999999999", "32 bits");
  expect_value_error("stages", "2.5", "integer");
  expect_value_error("pinned", "yes", "allowed false, true");
  expect_value_error("pinned", "1", "allowed false, true");
}

/* `pinned: true` marks an entry a layer check pinned; written only where
 * set, so tables without pins keep their bytes; `pinned: false` reads as
 * unpinned. */
Test(tuned_table, pinned_parses_and_is_written_only_where_set) {
  const char *const values[] = {"true", "false"};
  for (int i = 0; i < 2; i++) {
    char *text = entry_text("pinned", values[i], NULL);
    mj_tuned_table t;
    OK(mj_tuned_table_parse(text, strlen(text), "pin.yaml", &t));
    cr_assert_eq(t.n, 1);
    cr_expect_eq(t.entries[0].pinned, i == 0, "pinned: %s", values[i]);
    char *dir = ts_mkdtemp("tuned-pinned"), path[1200];
    snprintf(path, sizeof path, "%s/t.yaml", dir);
    OK(mj_tuned_table_write(&t, path));
    char *out = NULL;
    size_t len = 0;
    OK(mj_read_file(path, &out, &len));
    cr_expect_eq(strstr(out, "pinned: true}") != NULL, i == 0, "%s", out);
    cr_expect_null(strstr(out, "pinned: false"), "%s", out);
    free(out);
    mj_tuned_table_free(&t);
    free(text);
    ts_rmtree(dir);
    free(dir);
  }
}

Test(tuned_table, structure_errors_name_their_position) {
  char *text = entry_text(NULL, NULL, "tiles: [64, 64, 64]");
  expect_error(text, "bad.yaml:15:5: entries[0]", "unknown key 'tiles' (allowed kernel, dtype");
  free(text);
  text = entry_text(NULL, NULL, "cluster: [3, 1]");
  expect_error(text, "bad.yaml:15:14: entries[0].cluster", "allowed 1 or 2");
  free(text);
  text = entry_text(NULL, NULL, "cluster: [2, 2]"); /* a pair along M or along N, not both */
  expect_error(text, "bad.yaml:15:14: entries[0].cluster", "not both 2");
  free(text);
  text = entry_text(NULL, NULL, "raster: diagonal");
  expect_error(text, "bad.yaml:15:13: entries[0].raster", "allowed along_m, along_n");
  free(text);
  text = entry_text(NULL, NULL, "schedule: split");
  expect_error(text, "bad.yaml:15:15: entries[0].schedule",
               "'split' is not one of the allowed values (allowed cooperative, pingpong)");
  free(text);
  text = entry_text(NULL, NULL, "heuristic_us: -3");
  expect_error(text, "bad.yaml:15:19: entries[0].heuristic_us", "out of range");
  free(text);
  text = entry_text(NULL, NULL, "stages: 4");
  expect_error(text, "bad.yaml:15:5: entries[0]", "key 'stages' is given twice (first at 11:5)");
  free(text);
  text = entry_text("tokens", NULL, NULL);
  expect_error(text, "bad.yaml:3:5: entries[0]", "missing key 'tokens'");
  free(text);
  expect_error("entries: []\n", "bad.yaml:1:1", "missing key 'device'");
  expect_error("device: x\nentries: [\n", "bad.yaml:", "malformed YAML");
  expect_error("device: x\nentries: {a: 1}\n", "bad.yaml:2:10: entries", "a list of entries");
  expect_error("device: x\ndevices: y\nentries: []\n", "bad.yaml:2:1",
               "unknown key 'devices' (allowed device, arch, nvrtc, driver, date, entries)");
  expect_error("device: \"\"\nentries: []\n", "bad.yaml:1:9: device", "empty");
  expect_error("device: x\ndriver: -1\nentries: []\n", "bad.yaml:2:9: driver", "out of range");
  expect_error("- 1\n", "bad.yaml:1:1", "expected a mapping");
  expect_error("", "bad.yaml:1:1", "empty");
  expect_error("device: x\nentries:\n  - 5\n", "bad.yaml:3:5: entries[0]", "expected a mapping");
  /* the same bucket twice */
  const char *dup =
      "device: x\nentries:\n"
      "  - {kernel: gemm2, dtype: fp16, hidden: 64, expert_width: 64, experts: 4, top_k: 2, "
      "tokens: 8, tile: [64, 64, 64], stages: 3, warps: 4, path: mma, us: 5}\n"
      "  - {kernel: gemm2, dtype: fp16, hidden: 64, expert_width: 64, experts: 4, top_k: 2, "
      "tokens: 8, tile: [32, 64, 64], stages: 3, warps: 4, path: mma, us: 4}\n";
  expect_error(dup, "bad.yaml:4:5", "entries[1] repeats entries[0]");
}

Test(tuned_table, missing_file_is_io) {
  mj_tuned_table t;
  cr_expect_eq(mj_tuned_table_load_file("/nonexistent/x.yaml", &t), MOEJIT_ERR_IO);
  cr_expect(strstr(moejit_last_error(), "/nonexistent/x.yaml") != NULL, "%s", moejit_last_error());
}

/* ---- lookup ---------------------------------------------------------------------- */

static moejit_spec qwen(void) {
  moejit_spec s;
  OK(moejit_spec_load_preset("qwen3-30b-a3b", &s));
  return s;
}

/* Brute force of the bucket rule in long double logs (ties by exact
 * products, to the larger bucket). */
static int64_t brute_nearest(const int64_t *b, size_t n, int64_t t) {
  int64_t best = -1;
  long double best_d = 0;
  for (size_t i = 0; i < n; i++) {
    long double d = fabsl(log2l((long double)b[i]) - log2l((long double)t));
    int64_t hi = b[i] > t ? b[i] : t, lo = b[i] > t ? t : b[i];
    int64_t bhi = best > t ? best : t, blo = best > t ? t : best;
    int tie = best >= 0 && (unsigned __int128)hi * (unsigned __int128)blo ==
                               (unsigned __int128)bhi * (unsigned __int128)lo;
    if (best < 0 || (!tie && d < best_d) || (tie && b[i] > best)) best = b[i], best_d = d;
  }
  return best;
}

Test(tuned_lookup, exact_nearest_and_ties) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  const int64_t buckets[] = {1, 16, 64, 256, 2048};
  for (size_t i = 0; i < 5; i++) {
    mj_tuned_entry e =
        ts_tuned_entry(&s, "gemm1", buckets[i], ts_tile(64, 128, 64, 4, 8), MOEJIT_GEMM_PATH_MMA);
    OK(mj_tuned_table_put(&t, &e));
  }
  mj_tuned_match m;
  const struct {
    int64_t tokens, want;
    mj_tuned_match match;
  } cases[] = {{1, 1, MJ_TUNED_EXACT},
               {64, 64, MJ_TUNED_EXACT},
               {2, 1, MJ_TUNED_NEAREST},
               {12, 16, MJ_TUNED_NEAREST}, /* 12/1 > 16/12 */
               {32, 64, MJ_TUNED_NEAREST}, /* tie 32/16 = 64/32: the larger */
               {10, 16, MJ_TUNED_NEAREST}, /* 10/1 > 16/10 */
               /* T <= 8 (k = 8) is within the decode layer's reach, where
                * the tile buckets past it (16) do not serve */
               {8, 1, MJ_TUNED_NEAREST},
               {127, 64, MJ_TUNED_NEAREST},  /* 127/64 < 256/127 */
               {129, 256, MJ_TUNED_NEAREST}, /* 129/64 > 256/129 */
               {100000, 2048, MJ_TUNED_NEAREST}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    const mj_tuned_entry *e = mj_tuned_lookup(&t, "gemm1", &s, cases[i].tokens, &m);
    cr_assert_not_null(e, "T=%lld", (long long)cases[i].tokens);
    cr_expect_eq(e->tokens, cases[i].want, "T=%lld: bucket %lld, want %lld",
                 (long long)cases[i].tokens, (long long)e->tokens, (long long)cases[i].want);
    cr_expect_eq(m, cases[i].match, "T=%lld", (long long)cases[i].tokens);
  }
  cr_expect_null(mj_tuned_lookup(&t, "gemm2", &s, 8, &m));
  cr_expect_eq(m, MJ_TUNED_NONE);
  moejit_spec other = s;
  other.hidden = 4096;
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &other, 8, &m));
  other = s, other.act_dtype = other.weight_dtype = other.out_dtype = MOEJIT_DTYPE_FP16;
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &other, 8, &m), "dtype must match");
  other = s, other.weight_dtype = MOEJIT_DTYPE_FP16;
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &other, 8, &m), "both dtypes must match");
  mj_tuned_table_free(&t);
}

Test(tuned_lookup, nearest_matches_a_brute_force) {
  ts_rng r = ts_rng_fresh("tuned nearest");
  moejit_spec s = qwen();
  for (int round = 0; round < 200; round++) {
    mj_tuned_table t;
    fill_header(&t, "dev");
    int64_t b[12];
    size_t n = 1 + ts_next(&r) % 12;
    for (size_t i = 0; i < n; i++) {
      b[i] = 1 + (int64_t)(ts_next(&r) % (round % 2 ? 64 : 1000000));
      mj_tuned_entry e =
          ts_tuned_entry(&s, "gemm2", b[i], ts_tile(128, 128, 64, 3, 8), MOEJIT_GEMM_PATH_MMA);
      OK(mj_tuned_table_put(&t, &e)); /* a repeated bucket replaces: same rule */
    }
    /* from T = 9: T <= 8 (k = 8) is within the decode layer's reach, which
     * mma buckets past it do not serve
     * (a_tile_bucket_does_not_serve_decode_sizes) */
    int64_t tok = 9 + (int64_t)(ts_next(&r) % (round % 2 ? 80 : 2000000));
    mj_tuned_match m;
    const mj_tuned_entry *e = mj_tuned_lookup(&t, "gemm2", &s, tok, &m);
    cr_assert_not_null(e);
    cr_assert_eq(e->tokens, brute_nearest(b, n, tok), "T=%lld", (long long)tok);
    cr_assert_eq(m, e->tokens == tok ? MJ_TUNED_EXACT : MJ_TUNED_NEAREST);
    mj_tuned_table_free(&t);
  }
}

Test(tuned_lookup, entries_that_cannot_run_the_spec_are_skipped) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  /* 256x256 with 4 warps: 512 accumulators per thread, refused by validate */
  mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm1", 8, ts_tile(256, 256, 64, 2, 4), MOEJIT_GEMM_PATH_MMA);
  OK(mj_tuned_table_put(&t, &e));
  /* mma.sync takes 4 or 8 warps */
  e = ts_tuned_entry(&s, "gemm1", 16, ts_tile(128, 128, 64, 3, 12), MOEJIT_GEMM_PATH_MMA);
  OK(mj_tuned_table_put(&t, &e));
  mj_tuned_match m; /* T = 12: past the decode layer's reach (T <= 8) */
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &s, 12, &m));
  cr_expect_eq(m, MJ_TUNED_NONE);
  /* the same 12-warp tile on wgmma is fine */
  e = ts_tuned_entry(&s, "gemm1", 64, ts_tile(128, 128, 64, 3, 12), MOEJIT_GEMM_PATH_WGMMA);
  OK(mj_tuned_table_put(&t, &e));
  const mj_tuned_entry *got = mj_tuned_lookup(&t, "gemm1", &s, 12, &m);
  cr_assert_not_null(got);
  cr_expect_eq(got->tokens, 64);
  cr_expect_eq(m, MJ_TUNED_NEAREST);
  mj_tuned_table_free(&t);
}

/* A gemv entry applies where the GEMV kernel takes the spec, whatever the
 * mma kernel's limits (12 warps); its tile must still validate (the module
 * is built from it). Where the GEMV kernel cannot run the spec (fp32, or d
 * not a multiple of 8), its blocker says why. */
Test(tuned_lookup, gemv_entries_apply_where_the_gemv_kernel_runs) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm1", 1, ts_tile(128, 128, 64, 3, 12), MOEJIT_GEMM_PATH_GEMV);
  OK(mj_tuned_table_put(&t, &e));
  mj_tuned_match m;
  const mj_tuned_entry *got = mj_tuned_lookup(&t, "gemm1", &s, 2, &m);
  cr_assert(got && got->path == MOEJIT_GEMM_PATH_GEMV && m == MJ_TUNED_NEAREST,
            "12 warps: the mma kernel would refuse it, the GEMV kernel does not care");
  cr_expect_null(mj_tuned_entry_blocker(got, &s));
  /* a tile that does not validate: skipped, even on gemv */
  mj_tuned_entry bad =
      ts_tuned_entry(&s, "gemm1", 8, ts_tile(256, 256, 64, 2, 4), MOEJIT_GEMM_PATH_GEMV);
  cr_expect_str_eq(mj_tuned_entry_blocker(&bad, &s), "the tile does not validate for this spec");
  OK(mj_tuned_table_put(&t, &bad));
  got = mj_tuned_lookup(&t, "gemm1", &s, 8, &m);
  cr_expect(got && got->tokens == 1, "the bucket of 8 does not apply");
  /* specs the GEMV kernel cannot run (no table entry can name them: the
   * lookup's shape rule already keeps such entries out) */
  moejit_spec f = s;
  f.act_dtype = f.weight_dtype = f.out_dtype = MOEJIT_DTYPE_FP32;
  f.gemm1 = f.gemm2 = ts_tile(64, 64, 32, 2, 4);
  OK(moejit_spec_validate(&f));
  mj_tuned_entry ef = ts_tuned_entry(&s, "gemm1", 1, f.gemm1, MOEJIT_GEMM_PATH_GEMV);
  const char *why = mj_tuned_entry_blocker(&ef, &f);
  cr_expect(why && strstr(why, "fp16 or bf16"), "%s", why ? why : "(null)");
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &f, 1, &m));
  /* d = 2052 is no valid spec at all: refused before the GEMV kernel's
   * own rule, which would say the same */
  moejit_spec odd = s;
  odd.hidden = 2052;
  cr_expect_not_null(mj_tuned_entry_blocker(&e, &odd));
  why = mj_gemm_gemv_blocker(&odd, 1);
  cr_expect(why && strstr(why, "multiples of 8"), "%s", why ? why : "(null)");
  cr_expect_null(mj_tuned_lookup(&t, "gemm1", &odd, 1, &m));
  mj_tuned_table_free(&t);
}

/* ---- the table of a device --------------------------------------------------------- */

Test(tuned_device, file_names_fold_odd_characters) {
  char buf[128];
  mj_tuned_file_name("NVIDIA H100 80GB HBM3", buf, sizeof buf);
  cr_expect_str_eq(buf, "NVIDIA_H100_80GB_HBM3.yaml");
  mj_tuned_file_name("a/b c:d.e-f_g", buf, sizeof buf);
  cr_expect_str_eq(buf, "a_b_c_d.e-f_g.yaml");
}

static char *write_table(const char *dir, const char *device, const char *file_device,
                         const moejit_spec *s, int64_t tokens) {
  mj_tuned_table t;
  fill_header(&t, device);
  mj_tuned_entry e =
      ts_tuned_entry(s, "gemm1", tokens, ts_tile(64, 128, 64, 4, 8), MOEJIT_GEMM_PATH_MMA);
  OK(mj_tuned_table_put(&t, &e));
  char file[256], *path = malloc(1200);
  cr_assert(path);
  mj_tuned_file_name(file_device, file, sizeof file);
  snprintf(path, 1200, "%s/%s", dir, file);
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);
  return path;
}

Test(tuned_device, tuned_dir_then_embedded_then_not_found) {
  moejit_spec s = qwen();
  char *dir = ts_mkdtemp("tuned-dir");
  const char *dev = "Test GPU 9000";
  unsetenv("MOEJIT_TUNED_DISABLE");
  unsetenv("MOEJIT_TUNED_DIR");
  /* an embedded table of this device, written by the same writer */
  char *emb_path = write_table(dir, dev, dev, &s, 7);
  char *emb_text = NULL;
  size_t emb_len = 0;
  OK(mj_read_file(emb_path, &emb_text, &emb_len));
  remove(emb_path);
  const mj_embedded_file embedded[] = {{"Other.yaml", "device: Other\nentries: []\n", 26},
                                       {"Test_GPU_9000.yaml", emb_text, emb_len}};
  mj_tuned_table t;
  OK(mj_tuned_table_for_device_in(dev, embedded, 2, &t));
  cr_expect_str_eq(t.origin, "embedded:Test_GPU_9000.yaml");
  cr_expect_eq(t.entries[0].tokens, 7);
  mj_tuned_table_free(&t);

  /* $MOEJIT_TUNED_DIR wins */
  char *path = write_table(dir, dev, dev, &s, 99);
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  OK(mj_tuned_table_for_device_in(dev, embedded, 2, &t));
  cr_expect_str_eq(t.origin, path);
  cr_expect_eq(t.entries[0].tokens, 99);
  mj_tuned_table_free(&t);

  /* a device whose table is in neither place */
  cr_expect_eq(mj_tuned_table_for_device_in("Test GPU 1", embedded, 2, &t), MOEJIT_ERR_NOT_FOUND);
  const char *msg = moejit_last_error();
  cr_expect(strstr(msg, "no tuned table for Test GPU 1") && strstr(msg, dir) &&
                strstr(msg, "Test_GPU_1.yaml") && strstr(msg, "2 tables embedded"),
            "%s", msg);
  unsetenv("MOEJIT_TUNED_DIR");
  cr_expect_eq(mj_tuned_table_for_device_in("Test GPU 1", embedded, 2, &t), MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "$MOEJIT_TUNED_DIR is not set"), "%s", moejit_last_error());

  /* a file named for the device but holding another's table is passed over */
  char *odd = write_table(dir, "Test GPU 9000!", dev, &s, 5);
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  OK(mj_tuned_table_for_device_in(dev, embedded, 2, &t)); /* falls through to embedded */
  cr_expect_str_eq(t.origin, "embedded:Test_GPU_9000.yaml");
  mj_tuned_table_free(&t);
  cr_expect_eq(mj_tuned_table_for_device_in(dev, embedded, 1, &t), MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "is the table of 'Test GPU 9000!'"), "%s",
            moejit_last_error());
  unsetenv("MOEJIT_TUNED_DIR");
  free(emb_text), free(emb_path), free(path), free(odd);
  ts_rmtree(dir);
  free(dir);
}

Test(tuned_device, a_broken_table_is_a_config_error) {
  char *dir = ts_mkdtemp("tuned-broken");
  unsetenv("MOEJIT_TUNED_DISABLE");
  free(ts_write_file(dir, "Dev_X.yaml", "device: Dev X\nentries:\n  - {kernel: gemm1}\n"));
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  mj_tuned_table t;
  cr_expect_eq(mj_tuned_table_for_device_in("Dev X", NULL, 0, &t), MOEJIT_ERR_CONFIG);
  cr_expect(strstr(moejit_last_error(), "Dev_X.yaml:3:5: entries[0]: missing key"), "%s",
            moejit_last_error());
  unsetenv("MOEJIT_TUNED_DIR");
  const mj_embedded_file bad[] = {{"Dev_X.yaml", "device: Dev X\nentries: 3\n", 25}};
  cr_expect_eq(mj_tuned_table_for_device_in("Dev X", bad, 1, &t), MOEJIT_ERR_CONFIG);
  cr_expect(strstr(moejit_last_error(), "embedded:Dev_X.yaml:2:10: entries"), "%s",
            moejit_last_error());
  ts_rmtree(dir);
  free(dir);
}

Test(tuned_device, disable_variable) {
  moejit_spec s = qwen();
  char *dir = ts_mkdtemp("tuned-off");
  free(write_table(dir, "Dev Y", "Dev Y", &s, 1));
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  mj_tuned_table t;
  setenv("MOEJIT_TUNED_DISABLE", "1", 1);
  cr_expect_eq(mj_tuned_table_for_device_in("Dev Y", NULL, 0, &t), MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "disabled"), "%s", moejit_last_error());
  cr_expect_eq(mj_tuned_table_for_device("Dev Y", &t), MOEJIT_ERR_NOT_FOUND);
  setenv("MOEJIT_TUNED_DISABLE", "0", 1);
  OK(mj_tuned_table_for_device_in("Dev Y", NULL, 0, &t));
  mj_tuned_table_free(&t);
  unsetenv("MOEJIT_TUNED_DISABLE");
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
}

static int same_shape(const mj_tuned_entry *e, const mj_tuned_shape *sh) {
  return e->hidden == sh->hidden && e->expert_width == sh->expert_width &&
         e->experts == sh->experts && e->top_k == sh->top_k;
}

/* A load reads one shape of its device's table (mj_tuned_table_for_shape):
 * for every shipped table and every shape in it, exactly that shape's
 * entries of the whole table, in the same order, under the same header and
 * origin; a shape the table lacks gives the header and no entries. */
Test(tuned_device, a_shape_read_of_a_shipped_table_is_that_shape_of_the_whole) {
  unsetenv("MOEJIT_TUNED_DIR");
  unsetenv("MOEJIT_TUNED_DISABLE");
  for (size_t i = 0; i < mj_embedded_tuned_count; i++) {
    mj_tuned_table whole;
    OK(mj_tuned_table_parse(mj_embedded_tuned[i].text, mj_embedded_tuned[i].len, "whole", &whole));
    size_t shapes = 0;
    for (size_t j = 0; j < whole.n; j++) {
      const mj_tuned_entry *e = &whole.entries[j];
      const mj_tuned_shape sh = {e->hidden, e->expert_width, e->experts, e->top_k};
      int seen = 0;
      for (size_t k = 0; k < j && !seen; k++) seen = same_shape(&whole.entries[k], &sh);
      if (seen) continue;
      shapes++;
      mj_tuned_table t;
      OK(mj_tuned_table_for_shape_in(whole.device, &sh, mj_embedded_tuned, mj_embedded_tuned_count,
                                     &t));
      char origin[300];
      snprintf(origin, sizeof origin, "embedded:%s", mj_embedded_tuned[i].name);
      cr_expect_str_eq(t.origin, origin);
      cr_expect(!strcmp(t.device, whole.device) && !strcmp(t.arch, whole.arch) &&
                    !strcmp(t.nvrtc, whole.nvrtc) && !strcmp(t.date, whole.date) &&
                    t.driver == whole.driver,
                "%s: the header differs", origin);
      size_t n = 0;
      for (size_t k = 0; k < whole.n; k++) {
        if (!same_shape(&whole.entries[k], &sh)) continue;
        cr_assert_lt(n, t.n, "%s: d=%lld f=%lld E=%d k=%d: too few entries", origin,
                     (long long)sh.hidden, (long long)sh.expert_width, sh.experts, sh.top_k);
        expect_same_entry(&whole.entries[k], &t.entries[n], n);
        n++;
      }
      cr_expect_eq(n, t.n, "%s: d=%lld: %zu entries of %zu", origin, (long long)sh.hidden, t.n, n);
      mj_tuned_table_free(&t);
    }
    cr_expect_gt(shapes, 1, "%s holds one shape; the test wants several",
                 mj_embedded_tuned[i].name);
    const mj_tuned_shape none = {8, 8, 3, 1};
    mj_tuned_table t;
    OK(mj_tuned_table_for_shape_in(whole.device, &none, mj_embedded_tuned, mj_embedded_tuned_count,
                                   &t));
    cr_expect_eq(t.n, 0);
    cr_expect_str_eq(t.device, whole.device);
    mj_tuned_table_free(&t);
    mj_tuned_table_free(&whole);
  }
}

/* A table of two shapes, qwen3-30b-a3b's (two entries) and mixtral-8x7b's
 * (one), their shapes in *sa and *sb; with `broken`, mixtral's entry reads
 * "stages: x", on line *broken_line. */
static char *two_shape_table(const char *device, int broken, mj_tuned_shape *sa, mj_tuned_shape *sb,
                             int *broken_line) {
  moejit_spec a = qwen(), b;
  OK(moejit_spec_load_preset("mixtral-8x7b", &b));
  mj_tuned_shape_of(&a, sa);
  mj_tuned_shape_of(&b, sb);
  mj_tuned_table t;
  fill_header(&t, device);
  for (int i = 0; i < 3; i++) {
    const moejit_spec *s = i == 1 ? &b : &a;
    mj_tuned_entry e = ts_tuned_entry(s, i == 2 ? "gemm2" : "gemm1", 32 << i,
                                      ts_tile(64, 128, 64, 4, 8), MOEJIT_GEMM_PATH_WGMMA);
    OK(mj_tuned_table_put(&t, &e));
  }
  char *dir = ts_mkdtemp("tuned-two"), path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);
  char *text = NULL;
  size_t len = 0;
  OK(mj_read_file(path, &text, &len));
  ts_rmtree(dir);
  free(dir);
  if (!broken) return text;
  char want[160];
  snprintf(want, sizeof want, "hidden: %lld, expert_width: %lld, experts: %d, top_k: %d, ",
           (long long)b.hidden, (long long)b.expert_width, b.experts, b.top_k);
  char *line = strstr(text, want);
  cr_assert(line, "the writer no longer spells shapes as %s", want);
  char *stages = strstr(line, "stages: 4");
  cr_assert(stages);
  stages[8] = 'x';
  *broken_line = 1;
  for (const char *p = text; p < line; p++) *broken_line += *p == '\n';
  return text;
}

/* An embedded table is read one shape at a time: a broken line of that
 * shape fails with its place in the whole table, one of another shape is
 * not read (the shipped tables are held to the writer's output by the
 * tests above); a table in $MOEJIT_TUNED_DIR is read whole, so any broken
 * line fails every shape. */
Test(tuned_device, a_shape_read_parses_that_shapes_lines_of_an_embedded_table) {
  unsetenv("MOEJIT_TUNED_DIR");
  unsetenv("MOEJIT_TUNED_DISABLE");
  mj_tuned_shape sa, sb;
  int line = 0;
  char *text = two_shape_table("Dev S", 1, &sa, &sb, &line);
  const mj_embedded_file emb[] = {{"Dev_S.yaml", text, strlen(text)}};
  mj_tuned_table t;
  OK(mj_tuned_table_for_shape_in("Dev S", &sa, emb, 1, &t));
  cr_expect_eq(t.n, 2);
  for (size_t i = 0; i < t.n; i++) cr_expect(same_shape(&t.entries[i], &sa), "entry %zu", i);
  mj_tuned_table_free(&t);
  char where[64];
  snprintf(where, sizeof where, "embedded:Dev_S.yaml:%d:", line);
  cr_expect_eq(mj_tuned_table_for_shape_in("Dev S", &sb, emb, 1, &t), MOEJIT_ERR_CONFIG);
  cr_expect(strstr(moejit_last_error(), where) && strstr(moejit_last_error(), "stages"), "%s",
            moejit_last_error());
  cr_expect_eq(mj_tuned_table_for_device_in("Dev S", emb, 1, &t), MOEJIT_ERR_CONFIG);

  char *dir = ts_mkdtemp("tuned-shape-dir");
  free(ts_write_file(dir, "Dev_S.yaml", text));
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  cr_expect_eq(mj_tuned_table_for_shape_in("Dev S", &sa, NULL, 0, &t), MOEJIT_ERR_CONFIG);
  snprintf(where, sizeof where, "Dev_S.yaml:%d:", line);
  cr_expect(strstr(moejit_last_error(), where), "%s", moejit_last_error());
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
  free(text);
}

/* From $MOEJIT_TUNED_DIR too, a shape read keeps that shape's entries. */
Test(tuned_device, a_shape_read_of_a_tuned_dir_table_keeps_that_shape) {
  unsetenv("MOEJIT_TUNED_DISABLE");
  mj_tuned_shape sa, sb;
  char *text = two_shape_table("Dev T", 0, &sa, &sb, NULL);
  char *dir = ts_mkdtemp("tuned-shape-keep");
  free(ts_write_file(dir, "Dev_T.yaml", text));
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  mj_tuned_table t;
  OK(mj_tuned_table_for_shape_in("Dev T", &sa, NULL, 0, &t));
  cr_expect_eq(t.n, 2);
  mj_tuned_table_free(&t);
  OK(mj_tuned_table_for_shape_in("Dev T", &sb, NULL, 0, &t));
  cr_expect(t.n == 1 && same_shape(&t.entries[0], &sb));
  mj_tuned_table_free(&t);
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(dir);
  free(dir);
  free(text);
}

/* Whatever configs/tuned/ holds parses, under the file name of its device. */
Test(tuned_device, every_embedded_table_parses_under_its_device_name) {
  for (size_t i = 0; i < mj_embedded_tuned_count; i++) {
    mj_tuned_table t;
    char origin[300], file[300];
    snprintf(origin, sizeof origin, "embedded:%s", mj_embedded_tuned[i].name);
    OK(mj_tuned_table_parse(mj_embedded_tuned[i].text, mj_embedded_tuned[i].len, origin, &t));
    mj_tuned_file_name(t.device, file, sizeof file);
    cr_expect_str_eq(file, mj_embedded_tuned[i].name);
    mj_tuned_table_free(&t);
  }
  unsetenv("MOEJIT_TUNED_DIR");
  unsetenv("MOEJIT_TUNED_DISABLE");
  mj_tuned_table t;
  cr_expect_eq(mj_tuned_table_for_device("No Such GPU", &t), MOEJIT_ERR_NOT_FOUND);
  char want[96];
  snprintf(want, sizeof want, "among the %zu tables embedded", mj_embedded_tuned_count);
  cr_expect(strstr(moejit_last_error(), want), "%s", moejit_last_error());
}

/* ---- what a load keeps and reports ------------------------------------------------- */

typedef struct picked {
  mj_gemm_variants v;
  moejit_load_kernel row;
} picked;

static picked collect(const mj_tuned_table *t, const char *no_table, const moejit_spec *s,
                      int which, const char *arch) {
  picked p;
  memset(&p, 0, sizeof p);
  mj_gemm_variants_collect(t, no_table, s, which, arch, &p.v, &p.row);
  return p;
}

static void tuned_qwen_table(mj_tuned_table *t, const moejit_spec *s) {
  fill_header(t, "NVIDIA H100 80GB HBM3");
  strcpy(t->origin, "embedded:NVIDIA_H100_80GB_HBM3.yaml");
  const mj_tuned_entry es[] = {
      ts_tuned_entry(s, "gemm1", 256, ts_tile(128, 256, 64, 4, 8), MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(s, "gemm1", 1, ts_tile(64, 64, 64, 8, 8), MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(s, "gemm1", 32, ts_tile(16, 256, 128, 3, 8), MOEJIT_GEMM_PATH_MMA),
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(es); i++) OK(mj_tuned_table_put(t, &es[i]));
}

Test(tuned_pick, tuned_hit_is_reported_with_every_bucket) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  tuned_qwen_table(&t, &s);
  picked p = collect(&t, NULL, &s, 1, "sm_90a");
  cr_assert_eq(p.v.n, 3);
  cr_expect(p.v.v[0].tokens == 1 && p.v.v[1].tokens == 32 && p.v.v[2].tokens == 256,
            "variants sorted by bucket");
  cr_expect_eq(p.v.v[1].path, MOEJIT_GEMM_PATH_MMA);
  cr_expect_eq(p.v.v[1].cfg.tile_m, 16);
  cr_expect_str_eq(p.row.config_source, "tuned");
  cr_expect_str_eq(p.row.config, "3 buckets, T=1..256");
  cr_expect_str_eq(p.row.config_detail,
                   "embedded:NVIDIA_H100_80GB_HBM3.yaml: T=1 64x64x64 s8 w8 wgmma, T=32 "
                   "16x256x128 s3 w8 mma, T=256 128x256x64 s4 w8 wgmma");
  /* gemm2 has no entry: heuristic, and the report says why */
  picked p2 = collect(&t, NULL, &s, 2, "sm_90a");
  cr_expect_eq(p2.v.n, 0);
  cr_expect_str_eq(p2.row.config_source, "heuristic");
  cr_expect_str_eq(p2.row.config_detail,
                   "embedded:NVIDIA_H100_80GB_HBM3.yaml has no gemm2 "
                   "entry for bf16 d=2048 f=768 E=128 k=8");
  char want[64];
  snprintf(want, sizeof want, "%dx%dx%d s%d w%d", s.gemm2.tile_m, s.gemm2.tile_n, s.gemm2.tile_k,
           s.gemm2.stages, s.gemm2.warps);
  cr_expect_str_eq(p2.row.config, want);
  mj_tuned_table_free(&t);
}

Test(tuned_pick, no_table_or_no_runnable_entry_falls_back_visibly) {
  moejit_spec s = qwen();
  picked p = collect(NULL, "no tuned table for NVIDIA H100 80GB HBM3 (...)", &s, 1, "sm_90a");
  cr_expect_eq(p.v.n, 0);
  cr_expect_str_eq(p.row.config_source, "heuristic");
  cr_expect_str_eq(p.row.config_detail, "no tuned table for NVIDIA H100 80GB HBM3 (...)");
  /* wgmma entries on an sm_90 ctx (no 'a'): skipped, and said so */
  mj_tuned_table t;
  tuned_qwen_table(&t, &s);
  p = collect(&t, NULL, &s, 1, "sm_90");
  cr_expect_eq(p.v.n, 1, "only the mma entry runs on sm_90");
  cr_expect_str_eq(p.row.config_source, "tuned");
  cr_expect(strstr(p.row.config_detail,
                   "T=32 16x256x128 s3 w8 mma; skipped T=1 (the wgmma kernel "
                   "needs an sm_90a device"),
            "%s", p.row.config_detail);
  /* on sm_80 (163 KiB a block) the mma entry's 204 KiB does not fit either:
   * a tuned tile runs as named, so it is skipped, not fitted */
  p = collect(&t, NULL, &s, 1, "sm_80");
  cr_expect_eq(p.v.n, 0);
  cr_expect_str_eq(p.row.config_source, "heuristic");
  cr_expect(strstr(p.row.config_detail,
                   "skipped T=32 (the 16x256x128 tile with 3 stages needs 208896 bytes of shared "
                   "memory a block, and sm_80 allows 166912)"),
            "%s", p.row.config_detail);
  mj_tuned_table_free(&t);
  fill_header(&t, "dev");
  strcpy(t.origin, "/x/dev.yaml");
  mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm2", 4, ts_tile(64, 64, 64, 4, 8), MOEJIT_GEMM_PATH_WGMMA);
  OK(mj_tuned_table_put(&t, &e));
  p = collect(&t, NULL, &s, 2, "sm_86");
  cr_expect_eq(p.v.n, 0);
  cr_expect_str_eq(p.row.config_source, "heuristic");
  cr_expect(strstr(p.row.config_detail,
                   "/x/dev.yaml: none of its 1 gemm2 entries for bf16 "
                   "d=2048 f=768 E=128 k=8 runs here; skipped T=4"),
            "%s", p.row.config_detail);
  mj_tuned_table_free(&t);
}

Test(tuned_pick, forward_choice_exact_nearest_and_heuristic) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  tuned_qwen_table(&t, &s);
  picked p = collect(&t, NULL, &s, 1, "sm_90a");
  mj_gemm_choice c;
  OK(mj_gemm_choose(&s, &p.v, 1, 32, "sm_90a", &c));
  cr_expect_eq(c.match, MJ_TUNED_EXACT);
  cr_expect_eq(c.path, MOEJIT_GEMM_PATH_MMA);
  cr_expect_eq(c.spec, &c.scratch);
  cr_expect_eq(c.spec->gemm1.tile_m, 16);
  cr_expect(memcmp(&c.spec->gemm2, &s.gemm2, sizeof s.gemm2) == 0, "gemm2 untouched");
  cr_expect_str_eq(c.plan.entry, "moejit_gemm1_swiglu_mma");
  OK(mj_gemm_choose(&s, &p.v, 1, 3, "sm_90a", &c)); /* 3/1 > 32/3? no: 3 < 10.7 */
  cr_expect_eq(c.match, MJ_TUNED_NEAREST);
  cr_expect_eq(c.variant, 0);
  cr_expect_eq(c.path, MOEJIT_GEMM_PATH_WGMMA);
  cr_expect_eq(c.spec->gemm1.tile_m, 64);
  OK(mj_gemm_choose(&s, &p.v, 1, 5000, "sm_90a", &c));
  cr_expect_eq(c.spec->gemm1.tile_n, 256);
  cr_expect_eq(c.variant, 2);
  /* the variant spec is byte-equal to the one a load builds and warms */
  moejit_spec built;
  mj_gemm_variant_spec(&s, 1, &p.v.v[2], &built);
  cr_expect(memcmp(&built, c.spec, sizeof built) == 0);
  /* no variants: the model's spec and AUTO (past the decode layer's reach) */
  picked none = collect(&t, NULL, &s, 2, "sm_90a");
  OK(mj_gemm_choose(&s, &none.v, 2, 9, "sm_90a", &c));
  cr_expect_eq(c.spec, &s);
  cr_expect_eq(c.path, MOEJIT_GEMM_PATH_AUTO);
  cr_expect_eq(c.match, MJ_TUNED_NONE);
  cr_expect_eq(c.variant, -1);
  mj_tuned_table_free(&t);
}

/* A gemv variant: kept on any arch, reported without a tile, and run
 * (explicit path: at any row count) for the T its bucket serves. */
Test(tuned_pick, gemv_variant_runs_the_gemv_kernel) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  strcpy(t.origin, "dev.yaml");
  const mj_tuned_entry es[] = {
      ts_tuned_entry(&s, "gemm2", 1, s.gemm2, MOEJIT_GEMM_PATH_GEMV),
      ts_tuned_entry(&s, "gemm2", 32, ts_tile(16, 128, 128, 3, 4), MOEJIT_GEMM_PATH_MMA),
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(es); i++) OK(mj_tuned_table_put(&t, &es[i]));
  const char *archs[] = {"sm_90a", "sm_80", ""};
  for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++) {
    picked p = collect(&t, NULL, &s, 2, archs[a]);
    cr_assert_eq(p.v.n, 2, "%s", archs[a]);
    cr_expect_str_eq(p.row.config_detail, "dev.yaml: T=1 gemv, T=32 16x128x128 s3 w4 mma");
    mj_gemm_choice c;
    /* 5 is nearer 1 than 32; 6 to 8 are nearer 32, but within the decode
     * layer's reach (T <= 8) the T = 32 tiles do not serve */
    for (int64_t tokens = 1; tokens <= 8; tokens++) {
      OK(mj_gemm_choose(&s, &p.v, 2, tokens, archs[a], &c));
      cr_expect_eq(c.variant, 0, "%s T=%lld", archs[a], (long long)tokens);
      cr_expect_eq(c.path, MOEJIT_GEMM_PATH_GEMV);
      cr_expect(c.plan.use_gemv, "T=%lld: %s", (long long)tokens, c.plan.entry);
      cr_expect_str_eq(c.plan.entry, "moejit_gemm2_gemv");
      cr_expect_eq(c.match, tokens == 1 ? MJ_TUNED_EXACT : MJ_TUNED_NEAREST);
    }
    OK(mj_gemm_choose(&s, &p.v, 2, 9, archs[a], &c));
    cr_expect(c.variant == 1 && c.path == MOEJIT_GEMM_PATH_MMA, "T=9 takes the bucket of 32");
  }
  mj_tuned_table_free(&t);
}

/* The variant (0, or -1 for the heuristic) and path GEMM 1 of spec s runs at
 * T = 1 under a table of one bucket. */
static int one_bucket_pick(const moejit_spec *s, int64_t bucket, moejit_gemm_cfg tile,
                           moejit_gemm_path path, moejit_gemm_path *ran) {
  mj_tuned_table t;
  fill_header(&t, "dev");
  const mj_tuned_entry e = ts_tuned_entry(s, "gemm1", bucket, tile, path);
  OK(mj_tuned_table_put(&t, &e));
  picked p = collect(&t, NULL, s, 1, "sm_90a");
  cr_assert_eq(p.v.n, 1);
  mj_gemm_choice c;
  OK(mj_gemm_choose(s, &p.v, 1, 1, "sm_90a", &c));
  mj_tuned_table_free(&t);
  *ran = c.path;
  return c.variant;
}

/* A table tuned without T = 1 (its first bucket T = 32, a tile path):
 * within the decode layer's reach (T <= 8, T * k <= 64) the forward runs
 * the GEMV kernel (and so the decode layer) rather than the T = 32 tiles;
 * the first T past it takes the bucket again. moejit_tuned_choice's lookup
 * agrees. MOEJIT_GEMM_GEMV=0 (no GEMV for AUTO either) lets the bucket
 * serve T = 1. */
Test(tuned_pick, a_tile_bucket_does_not_serve_decode_sizes) {
  moejit_spec s = qwen(); /* k = 8: T <= 8 within the decode layer's reach */
  mj_tuned_table t;
  fill_header(&t, "dev");
  strcpy(t.origin, "dev.yaml");
  const mj_tuned_entry es[] = {
      ts_tuned_entry(&s, "gemm1", 32, ts_tile(64, 128, 64, 8, 8), MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(&s, "gemm2", 32, ts_tile(16, 128, 128, 3, 4), MOEJIT_GEMM_PATH_MMA),
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(es); i++) OK(mj_tuned_table_put(&t, &es[i]));
  for (int which = 1; which <= 2; which++) {
    const char *kernel = which == 1 ? "gemm1" : "gemm2";
    picked p = collect(&t, NULL, &s, which, "sm_90a");
    cr_assert_eq(p.v.n, 1, "%s", kernel);
    mj_gemm_choice c;
    OK(mj_gemm_choose(&s, &p.v, which, 1, "sm_90a", &c));
    cr_expect_eq(c.variant, -1, "%s T=1", kernel);
    cr_expect_eq(c.match, MJ_TUNED_NONE);
    cr_expect_eq(c.path, MOEJIT_GEMM_PATH_GEMV);
    cr_expect(c.plan.use_gemv, "%s T=1: %s", kernel, c.plan.entry);
    cr_expect_eq(c.fell_back, 0);
    mj_tuned_match m = MJ_TUNED_EXACT;
    cr_expect_null(mj_tuned_lookup(&t, kernel, &s, 1, &m), "%s", kernel);
    cr_expect_eq(m, MJ_TUNED_NONE);
    /* 64 rows: still within the reach, the GEMV kernel past AUTO's 8 rows */
    OK(mj_gemm_choose(&s, &p.v, which, 8, "sm_90a", &c));
    cr_expect_eq(c.variant, -1, "%s T=8", kernel);
    cr_expect(c.plan.use_gemv && c.path == MOEJIT_GEMM_PATH_GEMV, "%s T=8: %s", kernel,
              c.plan.entry);
    cr_expect_null(mj_tuned_lookup(&t, kernel, &s, 8, &m), "%s T=8", kernel);
    OK(mj_gemm_choose(&s, &p.v, which, 9, "sm_90a", &c)); /* 72 rows: tiles again */
    cr_expect_eq(c.variant, 0, "%s T=9", kernel);
    cr_expect_eq(c.match, MJ_TUNED_NEAREST);
    cr_expect(!c.plan.use_gemv, "%s T=9: %s", kernel, c.plan.entry);
    const mj_tuned_entry *e = mj_tuned_lookup(&t, kernel, &s, 9, &m);
    cr_expect(e && e->tokens == 32 && m == MJ_TUNED_NEAREST, "%s", kernel);
    setenv("MOEJIT_GEMM_GEMV", "0", 1);
    OK(mj_gemm_choose(&s, &p.v, which, 1, "sm_90a", &c));
    cr_expect_eq(c.variant, 0, "%s T=1 without GEMV", kernel);
    cr_expect(!c.plan.use_gemv);
    cr_expect_not_null(mj_tuned_lookup(&t, kernel, &s, 1, &m));
    unsetenv("MOEJIT_GEMM_GEMV");
  }
  /* a bucket within the reach (T = 2 of a k = 4 model: timed against the
   * GEMV kernel) serves the other T there: T = 1 takes it */
  moejit_spec s4 = s;
  s4.top_k = 4;
  moejit_gemm_path path = MOEJIT_GEMM_PATH_AUTO;
  cr_expect_eq(one_bucket_pick(&s4, 2, ts_tile(16, 64, 64, 3, 4), MOEJIT_GEMM_PATH_MMA, &path), 0);
  cr_expect_eq(path, MOEJIT_GEMM_PATH_MMA);
  /* a model of top-16 has no decode layer (its kernels take k <= 8): the
   * T = 32 bucket serves T = 1 */
  moejit_spec s16 = s;
  s16.top_k = 16;
  cr_expect_eq(one_bucket_pick(&s16, 32, ts_tile(64, 128, 64, 8, 8), MOEJIT_GEMM_PATH_WGMMA, &path),
               0);
  cr_expect_eq(path, MOEJIT_GEMM_PATH_WGMMA);
  mj_tuned_table_free(&t);
}

/* A tile bucket within the decode layer's reach but of more than 8 rows
 * (T = 2 of a top-8 model: 16 rows, as `--check-layer` pins one) was never
 * timed against the GEMV kernel: it serves its own T only, and T = 1, 3
 * and 8 keep the GEMV kernel (the decode layer); T = 9, past the reach,
 * takes it again. */
Test(tuned_pick, a_wide_tile_bucket_in_the_decode_reach_serves_its_own_t) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  const mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm2", 2, ts_tile(64, 128, 64, 8, 8), MOEJIT_GEMM_PATH_WGMMA);
  OK(mj_tuned_table_put(&t, &e));
  picked p = collect(&t, NULL, &s, 2, "sm_90a");
  cr_assert_eq(p.v.n, 1);
  const struct {
    int64_t tokens;
    int variant;
  } cases[] = {{1, -1}, {2, 0}, {3, -1}, {8, -1}, {9, 0}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    mj_gemm_choice c;
    OK(mj_gemm_choose(&s, &p.v, 2, cases[i].tokens, "sm_90a", &c));
    cr_expect_eq(c.variant, cases[i].variant, "T=%lld", (long long)cases[i].tokens);
    cr_expect_eq(c.plan.use_gemv, cases[i].variant < 0, "T=%lld: %s",
                 (long long)cases[i].tokens, c.plan.entry);
    mj_tuned_match m;
    const mj_tuned_entry *hit = mj_tuned_lookup(&t, "gemm2", &s, cases[i].tokens, &m);
    cr_expect_eq(hit != NULL, cases[i].variant == 0, "lookup T=%lld", (long long)cases[i].tokens);
  }
  mj_tuned_table_free(&t);
}

/* A 16x32 tile makes 64 times the heuristic's CTAs: at the largest T its
 * grid outgrows int32 while the heuristic's fits, so that call falls back. */
Test(tuned_pick, a_variant_whose_plan_fails_at_this_t_falls_back) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "dev");
  strcpy(t.origin, "dev.yaml");
  mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm1", 1, ts_tile(16, 32, 64, 4, 4), MOEJIT_GEMM_PATH_MMA);
  OK(mj_tuned_table_put(&t, &e));
  picked p = collect(&t, NULL, &s, 1, "sm_90a");
  cr_assert_eq(p.v.n, 1);
  mj_gemm_choice c;
  OK(mj_gemm_choose(&s, &p.v, 1, 1000, "sm_90a", &c));
  cr_expect_eq(c.variant, 0);
  const int64_t t_max = INT32_MAX / s.top_k;
  OK(mj_gemm_choose(&s, &p.v, 1, t_max, "sm_90a", &c));
  cr_expect_eq(c.variant, -1);
  cr_expect_eq(c.fell_back, 1);
  cr_expect_eq(c.spec, &s);
  cr_expect_eq(c.path, MOEJIT_GEMM_PATH_AUTO);
  cr_expect(strstr(c.why, "tuned bucket T=1") && strstr(c.why, "blocks"), "%s", c.why);
  mj_tuned_table_free(&t);
}

/* moejit_model_gemm_choice on a model assembled by hand (no ctx: arch
 * unknown, so the mma.sync path runs), as a load would leave it. */
static moejit_model *fake_model(const mj_tuned_table *t, const moejit_spec *s) {
  moejit_model *m = calloc(1, sizeof *m);
  cr_assert(m);
  m->spec = *s;
  m->families = MJ_OPS_LAYER;
  m->report.n_kernels = 2;
  for (int which = 1; which <= 2; which++) {
    moejit_load_kernel *row = &m->report.kernels[which - 1];
    strcpy(row->kernel, which == 1 ? "gemm1" : "gemm2");
    mj_gemm_variants_collect(t, "no tuned table for Fake GPU", &m->spec, which, "",
                             &m->gemm_variants[which - 1], row);
  }
  return m;
}

Test(tuned_pick, model_gemm_choice_describes_what_runs) {
  moejit_spec s = qwen();
  mj_tuned_table t;
  fill_header(&t, "Fake GPU");
  strcpy(t.origin, "/x/Fake_GPU.yaml");
  mj_tuned_entry e =
      ts_tuned_entry(&s, "gemm1", 4, ts_tile(32, 128, 64, 4, 8), MOEJIT_GEMM_PATH_MMA);
  OK(mj_tuned_table_put(&t, &e));
  moejit_model *m = fake_model(&t, &s);
  char desc[512];
  moejit_config_source src = (moejit_config_source)-1;
  OK(moejit_model_gemm_choice(m, "gemm1", 4, desc, sizeof desc, &src));
  cr_expect_eq(src, MOEJIT_CONFIG_TUNED_EXACT);
  cr_expect_str_eq(desc,
                   "tuned, exact bucket T=4: 32x128x64 s4 w8, path mma, entry "
                   "moejit_gemm1_swiglu_mma (/x/Fake_GPU.yaml: T=4 32x128x64 s4 w8 mma)");
  OK(moejit_model_gemm_choice(m, "gemm1", 1000, desc, sizeof desc, &src));
  cr_expect_eq(src, MOEJIT_CONFIG_TUNED_NEAREST);
  cr_expect(strstr(desc, "tuned, nearest bucket T=4 for T=1000: 32x128x64"), "%s", desc);
  /* T=1: 8 rows of qwen3's top-8, within the decode layer's reach (T <= 8
   * at k = 8), where the GEMV kernel runs */
  OK(moejit_model_gemm_choice(m, "gemm2", 1, desc, sizeof desc, &src));
  cr_expect_eq(src, MOEJIT_CONFIG_HEURISTIC);
  cr_expect(!strncmp(desc, "heuristic: ", 11) &&
                strstr(desc,
                       ", path gemv, entry moejit_gemm2_gemv (/x/Fake_GPU.yaml has no "
                       "gemm2 entry for bf16 d=2048"),
            "%s", desc);
  OK(moejit_model_gemm_choice(m, "gemm2", 2, desc, sizeof desc, &src));
  cr_expect(strstr(desc, ", path gemv, entry moejit_gemm2_gemv ("), "T=2, 16 rows: %s", desc);
  OK(moejit_model_gemm_choice(m, "gemm2", 8, desc, sizeof desc, &src));
  cr_expect(strstr(desc, ", path gemv, entry moejit_gemm2_gemv ("), "T=8, 64 rows: %s", desc);
  OK(moejit_model_gemm_choice(m, "gemm2", 9, desc, sizeof desc, &src));
  cr_expect(strstr(desc, ", path auto, entry moejit_gemm2_mma ("), "T=9, 72 rows: %s", desc);
  OK(moejit_model_gemm_choice(m, "gemm1", INT32_MAX / 8, desc, sizeof desc, &src));
  cr_expect_eq(src, MOEJIT_CONFIG_TUNED_NEAREST);
  char small[12];
  OK(moejit_model_gemm_choice(m, "gemm2", 3, small, sizeof small, NULL));
  cr_expect_str_eq(small, "heuristi...");
  cr_expect_eq(moejit_model_gemm_choice(m, "gemm3", 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_gemm_choice(m, "gemm1", 0, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_gemm_choice(m, NULL, 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  m->families = MJ_OPS_ALL;
  cr_expect_eq(moejit_model_gemm_choice(m, "gemm1", 1, desc, sizeof desc, &src),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "without its gemm1 kernel"), "%s", moejit_last_error());
  free(m);
  /* without a table: the reason travels into the description */
  m = fake_model(NULL, &s);
  OK(moejit_model_gemm_choice(m, "gemm1", 2, desc, sizeof desc, &src));
  cr_expect_eq(src, MOEJIT_CONFIG_HEURISTIC);
  cr_expect(strstr(desc, "(no tuned table for Fake GPU)"), "%s", desc);
  free(m);
  mj_tuned_table_free(&t);
}

/* moejit_tuned_choice: the public lookup tools and benchmarks use. */
Test(tuned_device, public_choice_exact_nearest_and_not_found) {
  moejit_spec s = qwen();
  char *dir = ts_mkdtemp("tuned-choice");
  unsetenv("MOEJIT_TUNED_DISABLE");
  char *path = write_table(dir, "Choice GPU", "Choice GPU", &s, 32);
  setenv("MOEJIT_TUNED_DIR", dir, 1);
  moejit_gemm_cfg cfg;
  int gpath = -1, source = -1;
  OK(moejit_tuned_choice("Choice GPU", &s, 1, 32, &cfg, &gpath, &source));
  cr_expect_eq(cfg.tile_m, 64);
  cr_expect_eq(cfg.tile_n, 128);
  cr_expect_eq(gpath, MOEJIT_GEMM_PATH_MMA);
  cr_expect_eq(source, MOEJIT_CONFIG_TUNED_EXACT);
  OK(moejit_tuned_choice("Choice GPU", &s, 1, 40, &cfg, &gpath, &source));
  cr_expect_eq(source, MOEJIT_CONFIG_TUNED_NEAREST);
  /* no gemm2 entry; another device has no table */
  cr_expect_eq(moejit_tuned_choice("Choice GPU", &s, 2, 32, &cfg, &gpath, &source),
               MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "no gemm2 entry"), "%s", moejit_last_error());
  cr_expect_eq(moejit_tuned_choice("Other GPU", &s, 1, 32, &cfg, &gpath, &source),
               MOEJIT_ERR_NOT_FOUND);
  cr_expect_eq(moejit_tuned_choice("Choice GPU", &s, 3, 32, &cfg, &gpath, &source),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_tuned_choice(NULL, &s, 1, 32, &cfg, &gpath, &source),
               MOEJIT_ERR_INVALID_ARGUMENT);
  unsetenv("MOEJIT_TUNED_DIR");
  free(path);
  ts_rmtree(dir);
  free(dir);
}

/* ---- moejit_tuned_table_pin_heuristic ----------------------------------- */

/* An empty table of device `device` for sm_90a, and qwen3-30b-a3b's spec. */
static mj_tuned_table empty_table(const char *device, moejit_spec *qwen) {
  OK(moejit_spec_load_preset("qwen3-30b-a3b", qwen));
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, device, sizeof t.device);
  mj_strlcpy(t.arch, "sm_90a", sizeof t.arch);
  return t;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s", path);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strdup(buf);
}

static mj_tuned_entry pin_key(const moejit_spec *s, const char *kernel, int64_t tokens) {
  return ts_tuned_entry(s, kernel, tokens, s->gemm1, MOEJIT_GEMM_PATH_WGMMA);
}

/* A pin writes what a load without tables runs at that T on the table's
 * arch (AUTO's plan, or within the decode layer's reach the GEMV kernel),
 * replacing the bucket's entry or adding one, leaves every other entry and, where the
 * entry already holds that plan, the file as it was; bad arguments and
 * tables fail with the file untouched. */
Test(tuned_table, pin_writes_the_heuristic_plan_and_nothing_else) {
  char *dir = ts_mkdtemp("pin");
  moejit_spec s;
  mj_tuned_table t = empty_table("Pin Test GPU", &s);
  const moejit_gemm_cfg odd = ts_tile(128, 128, 64, 4, 8);
  const mj_tuned_entry es[] = {ts_tuned_entry(&s, "gemm1", 32, odd, MOEJIT_GEMM_PATH_WGMMA),
                               ts_tuned_entry(&s, "gemm2", 32, odd, MOEJIT_GEMM_PATH_WGMMA),
                               ts_tuned_entry(&s, "gemm1", 2048, odd, MOEJIT_GEMM_PATH_MMA)};
  for (size_t i = 0; i < MJ_ARRAY_LEN(es); i++) OK(mj_tuned_table_put(&t, &es[i]));
  char *path = ts_write_file(dir, "t.yaml", "");
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);

  moejit_spec base = s;
  base.n_archs = 1;
  mj_strlcpy(base.archs[0], "sm_90a", sizeof base.archs[0]);
  moejit_gemm_cfg want, got;
  moejit_gemm_path want_path;
  int got_path = -1, changed = -1;
  cr_assert(mj_tune_heuristic_tile(&base, 1, 32 * s.top_k, "sm_90a", &want, &want_path));
  OK(moejit_tuned_table_pin_heuristic(path, &s, 1, 32, 12.5, &got, &got_path, &changed));
  cr_expect_eq(changed, 1);
  cr_expect(mj_gemm_cfg_equal(&got, &want) && got_path == (int)want_path);
  cr_expect(!mj_gemm_cfg_equal(&want, &odd), "the test needs a pin that changes the tile");
  OK(mj_tuned_table_load_file(path, &t));
  cr_expect_eq(t.n, 3, "replaced, not added");
  mj_tuned_entry key = pin_key(&s, "gemm1", 32);
  const mj_tuned_entry *e = mj_tuned_table_find(&t, &key);
  cr_assert(e);
  cr_expect(mj_gemm_cfg_equal(&e->cfg, &want) && e->path == want_path);
  cr_expect(e->us == 12.5 && e->heuristic_us == 12.5);
  cr_expect_eq(e->pinned, 1, "a pin is marked, so that a re-tune keeps it");
  for (size_t i = 1; i < MJ_ARRAY_LEN(es); i++) {
    const mj_tuned_entry *o = mj_tuned_table_find(&t, &es[i]);
    cr_expect(o && mj_gemm_cfg_equal(&o->cfg, &odd) && o->path == es[i].path, "entry %zu kept", i);
    cr_expect(o && !o->pinned, "entry %zu not marked", i);
  }
  mj_tuned_table_free(&t);

  /* the same pin again: nothing to change, the file's bytes stay */
  char *before = slurp(path);
  OK(moejit_tuned_table_pin_heuristic(path, &s, 1, 32, 99, NULL, NULL, &changed));
  cr_expect_eq(changed, 0);
  char *after = slurp(path);
  cr_expect_str_eq(after, before);
  free(after);

  /* a T whose nearest bucket (32) holds the plan already: nothing written */
  OK(moejit_tuned_table_pin_heuristic(path, &s, 1, 40, 0, NULL, NULL, &changed));
  cr_expect_eq(changed, 0);
  after = slurp(path);
  cr_expect_str_eq(after, before, "no entry added at T = 40");
  free(after);

  /* a T between buckets: an entry added, its time unknown (0); T = 1: GEMV */
  OK(moejit_tuned_table_pin_heuristic(path, &s, 2, 4096, 0, NULL, &got_path, &changed));
  cr_expect_eq(changed, 1);
  OK(moejit_tuned_table_pin_heuristic(path, &s, 2, 1, 0, NULL, &got_path, &changed));
  cr_expect_eq(got_path, (int)MOEJIT_GEMM_PATH_GEMV);
  OK(mj_tuned_table_load_file(path, &t));
  cr_expect_eq(t.n, 5);
  mj_tuned_match match;
  const mj_tuned_entry *at = mj_tuned_lookup(&t, "gemm2", &s, 4096, &match);
  cr_expect(at && match == MJ_TUNED_EXACT && at->us == 0 && at->heuristic_us == 0);
  at = mj_tuned_lookup(&t, "gemm2", &s, 3000, &match);
  cr_expect(at && at->tokens == 4096, "the pin serves the T near it");
  mj_tuned_table_free(&t);

  /* within the decode layer's reach (T <= 8 at k = 8) a load without tables
   * runs the GEMV kernel at any row count, and so does the pin: T = 6 is 48
   * rows, past AUTO's 8; T = 9, past the reach, takes AUTO's tile */
  OK(moejit_tuned_table_pin_heuristic(path, &s, 1, 6, 0, NULL, &got_path, &changed));
  cr_expect(changed == 1 && got_path == (int)MOEJIT_GEMM_PATH_GEMV, "T=6: path %d", got_path);
  OK(moejit_tuned_table_pin_heuristic(path, &s, 1, 9, 0, NULL, &got_path, &changed));
  cr_expect(changed == 1 && got_path == (int)MOEJIT_GEMM_PATH_WGMMA, "T=9: path %d", got_path);

  /* refusals: the file as it was */
  free(before);
  before = slurp(path);
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &s, 3, 32, 0, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "which = 3"), "%s", moejit_last_error());
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &s, 1, 0, 0, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &s, 1, 8, -1, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &s, 1, 8, NAN, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_tuned_table_pin_heuristic(NULL, &s, 1, 8, 0, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  moejit_spec f32 = s;
  f32.act_dtype = f32.weight_dtype = MOEJIT_DTYPE_FP32;
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &f32, 1, 8, 0, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "fp32"), "%s", moejit_last_error());
  moejit_spec broken = s;
  broken.top_k = 0;
  cr_expect_eq(moejit_tuned_table_pin_heuristic(path, &broken, 1, 8, 0, NULL, NULL, NULL),
               MOEJIT_ERR_INVALID_ARGUMENT);
  after = slurp(path);
  cr_expect_str_eq(after, before);
  free(after);
  char *missing = NULL;
  cr_assert(asprintf(&missing, "%s/none.yaml", dir) > 0);
  cr_expect_eq(moejit_tuned_table_pin_heuristic(missing, &s, 1, 8, 0, NULL, NULL, NULL),
               MOEJIT_ERR_IO);
  cr_expect(strstr(moejit_last_error(), "none.yaml"), "%s", moejit_last_error());
  char *bad = ts_write_file(dir, "bad.yaml", "device: X\nentries: [1, 2\n");
  cr_expect_eq(moejit_tuned_table_pin_heuristic(bad, &s, 1, 8, 0, NULL, NULL, NULL),
               MOEJIT_ERR_CONFIG);
  after = slurp(bad);
  cr_expect_str_eq(after, "device: X\nentries: [1, 2\n");
  free(after);
  free(before), free(missing), free(bad), free(path);
  ts_rmtree(dir);
  free(dir);
}

/* Eight processes pinning 16 token counts each into one table at once, each
 * count's entry holding another tile before: the directory lock makes each
 * load-change-write whole, so all 128 entries hold the heuristic's plan at
 * the end (without it, writers overwrite each other's changes). */
Test(tuned_table, concurrent_pins_lose_nothing, .timeout = 120) {
  char *dir = ts_mkdtemp("pin-race");
  enum { kProcs = 8, kPins = 16 };
  moejit_spec s;
  mj_tuned_table t = empty_table("Pin Race GPU", &s);
  const moejit_gemm_cfg odd = ts_tile(128, 128, 64, 4, 8);
  for (int i = 0; i < kProcs * kPins; i++) {
    const mj_tuned_entry e = ts_tuned_entry(&s, "gemm1", 100 + i, odd, MOEJIT_GEMM_PATH_MMA);
    OK(mj_tuned_table_put(&t, &e));
  }
  char *path = ts_write_file(dir, "t.yaml", "");
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);
  pid_t pids[kProcs];
  for (int p = 0; p < kProcs; p++) {
    pids[p] = fork();
    cr_assert_geq(pids[p], 0);
    if (pids[p] == 0) {
      int bad = 0, changed = 0;
      for (int i = 0; i < kPins; i++)
        bad |= moejit_tuned_table_pin_heuristic(path, &s, 1, 100 + p * kPins + i, 0, NULL, NULL,
                                                &changed) != MOEJIT_OK ||
               !changed;
      _exit(bad);
    }
  }
  for (int p = 0; p < kProcs; p++) {
    int status = 0;
    cr_assert_eq(waitpid(pids[p], &status, 0), pids[p]);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process %d failed a pin", p);
  }
  OK(mj_tuned_table_load_file(path, &t));
  cr_expect_eq(t.n, kProcs * kPins);
  size_t pinned = 0;
  for (size_t i = 0; i < t.n; i++) pinned += t.entries[i].path != MOEJIT_GEMM_PATH_MMA;
  cr_expect_eq(pinned, (size_t)(kProcs * kPins), "every pin kept: %zu of %d", pinned,
               kProcs * kPins);
  mj_tuned_table_free(&t);
  free(path);
  ts_rmtree(dir);
  free(dir);
}

/* A device table for dozens of models: MJ_TUNED_MAX_ENTRIES entries write
 * and read back exactly; one more is refused by the writer (nothing
 * written) and, written by hand, by the parser, with its position. */
Test(tuned_table, the_largest_table_round_trips_and_one_more_is_refused, .timeout = 120) {
  char *dir = ts_mkdtemp("tuned-large");
  moejit_spec s;
  mj_tuned_table t = empty_table("Large Table GPU", &s);
  for (int i = 0; i < MJ_TUNED_MAX_ENTRIES; i++) {
    mj_tuned_entry e = ts_tuned_entry(&s, i % 2 ? "gemm2" : "gemm1", 1 + i / 2,
                                      ts_tile(128, 256, 64, 4, 8), MOEJIT_GEMM_PATH_WGMMA);
    e.hidden = 1024 + 8 * (i % 64); /* several shapes */
    e.cfg.cluster_m = 2, e.cfg.raster = MOEJIT_RASTER_ALONG_N; /* every optional key, */
    e.cfg.schedule = MOEJIT_SCHEDULE_PINGPONG, e.pinned = 1;   /* the most YAML nodes */
    e.heuristic_us = 1.5;
    OK(mj_tuned_table_put(&t, &e));
  }
  char path[1200];
  snprintf(path, sizeof path, "%s/t.yaml", dir);
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table back;
  OK(mj_tuned_table_load_file(path, &back));
  cr_assert_eq(back.n, (size_t)MJ_TUNED_MAX_ENTRIES);
  for (size_t i = 0; i < t.n; i++)
    cr_assert(!memcmp(&back.entries[i], &t.entries[i], sizeof t.entries[i]), "entry %zu", i);
  mj_tuned_table_free(&back);

  mj_tuned_entry extra = ts_tuned_entry(&s, "gemm1", 99999, s.gemm1, MOEJIT_GEMM_PATH_WGMMA);
  OK(mj_tuned_table_put(&t, &extra));
  char other[1200];
  snprintf(other, sizeof other, "%s/over.yaml", dir);
  cr_expect_eq(mj_tuned_table_write(&t, other), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "4096"), "%s", moejit_last_error());
  cr_expect_eq(ts_count_files(dir, "over.yaml"), 0, "nothing written");
  mj_tuned_table_free(&t);

  /* the same table with one more entry appended by hand */
  char *text = NULL;
  size_t len = 0;
  OK(mj_read_file(path, &text, &len));
  const char *line = strstr(text, "  - {kernel: gemm1");
  cr_assert(line);
  const char *eol = strchr(line, '\n');
  char *more = NULL;
  cr_assert(asprintf(&more, "%s%.*s", text, (int)(eol - line + 1), line) > 0);
  /* the copy repeats an entry; its position is past the limit, which is
   * checked first */
  cr_expect_eq(mj_tuned_table_parse(more, strlen(more), "more.yaml", &back), MOEJIT_ERR_CONFIG);
  cr_expect(
      strstr(moejit_last_error(), "more.yaml:") && strstr(moejit_last_error(), "at most 4096"),
      "%s", moejit_last_error());
  free(more), free(text);
  ts_rmtree(dir);
  free(dir);
}
