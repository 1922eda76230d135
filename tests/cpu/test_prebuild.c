/* moejit_model_prebuild without a GPU: it builds the five families plus one
 * kernel per distinct tuned tile of the named device's table (a tile equal
 * to the spec's own, or repeated across buckets, adds none), a second call
 * and a call without a device are all cache hits with no new cache file,
 * the report says where each configuration came from, and bad arguments or
 * a broken table fail before anything compiles; and every GEMM kernel a
 * forward looks up, at any T, lies in a module the load builds with that
 * entry (GEMM modules hold only the entries the load resolves). The GPU
 * half (a load after a prebuild compiles nothing) is in
 * tests/gpu/test_layer_tuned.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/ops.h"
#include "runtime/runtime.h"
#include "test_support.h"
#include "tuned_support.h"

#define OK(call) cr_assert_eq((call), MOEJIT_OK, "%s: %s", #call, moejit_last_error())

static char *tmp, *cache, *tables;
static const char *const kDevice = "Prebuild Test GPU";

static void setup(void) {
  unsetenv("MOEJIT_TUNED_DISABLE");
  unsetenv("MOEJIT_CACHE_DISABLE");
  tmp = ts_mkdtemp("prebuild");
  cr_assert(asprintf(&cache, "%s/cache", tmp) > 0 && asprintf(&tables, "%s/tuned", tmp) > 0);
  cr_assert(mj_mkdir_p(tables, 0755) == MOEJIT_OK, "%s", moejit_last_error());
  setenv("MOEJIT_TUNED_DIR", tables, 1);
}
static void teardown(void) {
  unsetenv("MOEJIT_TUNED_DIR");
  ts_rmtree(tmp);
  free(tmp), free(cache), free(tables);
}

TestSuite(prebuild, .init = setup, .fini = teardown, .timeout = 600);

static moejit_spec qwen(void) {
  moejit_spec s;
  OK(moejit_spec_load_preset("qwen3-30b-a3b", &s));
  return s;
}

/* The device's table in $MOEJIT_TUNED_DIR: gemm1 with its own tile at T=1
 * and one other tile at T=32 and T=256 (one new kernel); gemm2 with one
 * other tile at T=64 (one new kernel, which every T runs). */
static void write_device_table(const moejit_spec *s) {
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  mj_strlcpy(t.device, kDevice, sizeof t.device);
  mj_strlcpy(t.arch, "sm_90a", sizeof t.arch);
  mj_strlcpy(t.nvrtc, "13.0", sizeof t.nvrtc);
  t.driver = 13000;
  mj_strlcpy(t.date, "2026-11-25", sizeof t.date);
  const mj_tuned_entry es[] = {
      ts_tuned_entry(s, "gemm1", 1, s->gemm1, MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(s, "gemm1", 32, ts_tile(64, 128, 64, 6, 8), MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(s, "gemm1", 256, ts_tile(64, 128, 64, 6, 8), MOEJIT_GEMM_PATH_WGMMA),
      ts_tuned_entry(s, "gemm2", 64, ts_tile(64, 128, 64, 4, 8), MOEJIT_GEMM_PATH_WGMMA),
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(es); i++) OK(mj_tuned_table_put(&t, &es[i]));
  char file[256], path[1200];
  mj_tuned_file_name(kDevice, file, sizeof file);
  snprintf(path, sizeof path, "%s/%s", tables, file);
  OK(mj_tuned_table_write(&t, path));
  mj_tuned_table_free(&t);
}

static moejit_compiler *compiler(void) {
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.cache_dir = cache;
  moejit_compiler *c = NULL;
  OK(moejit_compiler_create(&c, &o));
  return c;
}

static const moejit_load_kernel *row(const moejit_load_report *r, const char *kernel) {
  for (int i = 0; i < r->n_kernels; i++)
    if (strcmp(r->kernels[i].kernel, kernel) == 0) return &r->kernels[i];
  cr_assert_fail("no report row for %s", kernel);
  return NULL;
}

static moejit_status prebuild(moejit_compiler *c, const moejit_spec *s, const char *device,
                              int tuned_disable, moejit_load_report *r) {
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.report = r;
  opts.tuned_disable = tuned_disable;
  memset(r, 0x5a, sizeof *r); /* poison: the call must fill it */
  return moejit_model_prebuild(c, s, "sm_90a", device, &opts);
}

Test(prebuild, tuned_tiles_once_then_every_call_is_all_hits) {
  moejit_spec s = qwen();
  write_device_table(&s);
  moejit_compiler *c = compiler();
  moejit_load_report r;

  OK(prebuild(c, &s, kDevice, 0, &r));
  cr_expect_str_eq(r.model, "qwen3-30b-a3b");
  cr_expect_str_eq(r.arch, "sm_90a");
  cr_assert_eq(r.n_kernels, 5, "route, align, gemm1, gemm2, combine");
  cr_expect_eq(r.cache_misses, 5);
  cr_expect_eq(r.cache_hits, 0);
  cr_expect_eq(r.load_ms, 0.0, "nothing is loaded");
  cr_expect(r.total_ms >= r.compile_ms && r.compile_ms > 0);
  const moejit_load_kernel *g1 = row(&r, "gemm1"), *g2 = row(&r, "gemm2");
  cr_expect_str_eq(g1->config_source, "tuned");
  cr_expect_str_eq(g1->config, "3 buckets, T=1..256");
  cr_expect_eq(g1->variants, 1, "T=1 is the spec's own tile, T=32 and T=256 share one");
  cr_expect_eq(g1->variant_hits, 0);
  cr_expect_str_eq(g2->config_source, "tuned");
  cr_expect_eq(g2->variants, 1);
  cr_expect_str_eq(row(&r, "route")->config_source, "heuristic");
  const int files = ts_count_files(cache, ".mjc");
  /* gemm2's one bucket (T = 64, a tile path) serves every T but T = 1, a
   * decode size, where AUTO runs the GEMV entry of gemm2's own module: so
   * that module is built too, and beside it the module of its _wide64
   * decode entry (the decode sizes of k = 8 reach 64 entries) */
  cr_expect_eq(files, 5 + 3, "one cache entry per family and per new tile, and gemm2's _wide64");
  cr_expect_eq(strlen(g2->key), 32);
  cr_expect_eq(strlen(g1->key), 32);

  /* a new compiler (no memory cache): everything from disk */
  moejit_compiler_destroy(c);
  c = compiler();
  OK(prebuild(c, &s, kDevice, 0, &r));
  cr_expect_eq(r.cache_hits, 5);
  cr_expect_eq(r.cache_misses, 0);
  cr_expect(row(&r, "gemm1")->cache_hit && row(&r, "gemm1")->variant_hits == 1);
  cr_expect(row(&r, "gemm2")->cache_hit && row(&r, "gemm2")->variant_hits == 1);
  cr_expect_eq(ts_count_files(cache, ".mjc"), files);

  /* no device, an unknown device, tables off: the heuristic kernels, and
   * the report says why no table was used. Without the tuned tiles the
   * GEMM modules hold other entries (e.g. the narrow tile that tuned
   * buckets replaced), so the first of these builds them (route, align and
   * combine are hits), and the others find them */
  static const struct {
    const char *device;
    int disable;
    const char *why;
  } cases[] = {{NULL, 0, "no device named"},
               {"Another GPU", 0, "no tuned table for Another GPU"},
               {kDevice, 1, "tuned tables are disabled"}};
  int heuristic_files = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    OK(prebuild(c, &s, cases[i].device, cases[i].disable, &r));
    cr_expect_geq(r.cache_hits, i == 0 ? 3 : 5, "case %zu", i);
    cr_expect(row(&r, "route")->cache_hit && row(&r, "combine")->cache_hit, "case %zu", i);
    g1 = row(&r, "gemm1");
    cr_expect_str_eq(g1->config_source, "heuristic", "case %zu", i);
    cr_expect_eq(g1->variants, 0, "case %zu", i);
    cr_expect(strstr(g1->config_detail, cases[i].why), "case %zu: %s", i, g1->config_detail);
    if (i == 0) heuristic_files = ts_count_files(cache, ".mjc");
    cr_expect_eq(ts_count_files(cache, ".mjc"), heuristic_files, "case %zu", i);
  }
  /* gemm1's own tile in its three parts (its tile kernels with the narrow
   * tile's entries now, its GEMV and decode entries, _wide64) and gemm2's
   * tile kernels; gemm2's GEMV parts are the tuned load's */
  cr_expect_leq(heuristic_files, files + 4, "%d files, %d before", heuristic_files, files);
  cr_expect_gt(heuristic_files, files, "gemm2's own tile, built now");

  /* opts.tuned_table: that file instead of the device's, whichever device
   * is named (here none, and one without a table): the tuned kernels
   * again, all hits; tables off (the option or the variable) still wins */
  char file[256], *path = NULL;
  mj_tuned_file_name(kDevice, file, sizeof file);
  cr_assert(asprintf(&path, "%s/%s", tables, file) > 0);
  static const char *const devices[] = {NULL, "Another GPU"};
  moejit_load_opts opts;
  for (size_t i = 0; i < MJ_ARRAY_LEN(devices); i++) {
    moejit_load_opts_init(&opts);
    opts.report = &r, opts.tuned_table = path;
    OK(moejit_model_prebuild(c, &s, "sm_90a", devices[i], &opts));
    g1 = row(&r, "gemm1");
    cr_expect_str_eq(g1->config_source, "tuned", "device %s", devices[i]);
    cr_expect_str_eq(g1->config, "3 buckets, T=1..256");
    cr_expect(strstr(g1->config_detail, path), "names the file: %s", g1->config_detail);
    cr_expect_eq(r.cache_misses, 0, "device %s", devices[i]);
    cr_expect_eq(ts_count_files(cache, ".mjc"), heuristic_files);
  }
  opts.tuned_disable = 1;
  OK(moejit_model_prebuild(c, &s, "sm_90a", NULL, &opts));
  cr_expect_str_eq(row(&r, "gemm1")->config_source, "heuristic");
  opts.tuned_disable = 0;
  setenv("MOEJIT_TUNED_DISABLE", "1", 1);
  OK(moejit_model_prebuild(c, &s, "sm_90a", NULL, &opts));
  unsetenv("MOEJIT_TUNED_DISABLE");
  cr_expect_str_eq(row(&r, "gemm1")->config_source, "heuristic");
  cr_expect(strstr(row(&r, "gemm1")->config_detail, "MOEJIT_TUNED_DISABLE"), "%s",
            row(&r, "gemm1")->config_detail);
  free(path);
  cr_assert(asprintf(&path, "%s/none.yaml", tmp) > 0);
  opts.tuned_table = path;
  cr_expect_eq(moejit_model_prebuild(c, &s, "sm_90a", kDevice, &opts), MOEJIT_ERR_IO);
  cr_expect(strstr(moejit_last_error(), "tuned_table") && strstr(moejit_last_error(), path), "%s",
            moejit_last_error());
  free(path);
  moejit_compiler_destroy(c);
}

Test(prebuild, bad_arguments_and_a_broken_table_fail_before_compiling) {
  moejit_spec s = qwen();
  moejit_compiler *c = compiler();
  moejit_load_report r;
  cr_expect_eq(moejit_model_prebuild(NULL, &s, "sm_90a", NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "compiler is NULL"), "%s", moejit_last_error());
  cr_expect_eq(moejit_model_prebuild(c, NULL, "sm_90a", NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  static const char *const bad_arch[] = {"auto", "sm_9", "compute_90", ""};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad_arch); i++) {
    cr_expect_eq(moejit_model_prebuild(c, &s, bad_arch[i], kDevice, NULL),
                 MOEJIT_ERR_INVALID_ARGUMENT, "%s", bad_arch[i]);
    cr_expect(strstr(moejit_last_error(), "HINT"), "%s", moejit_last_error());
  }
  /* arch names the config would refuse: before NVRTC, not a compile error */
  static const char *const refused_arch[] = {"sm_75", "sm_80a", "sm_70", "sm_999"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(refused_arch); i++) {
    cr_expect_eq(moejit_model_prebuild(c, &s, refused_arch[i], kDevice, NULL),
                 MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s", refused_arch[i], moejit_last_error());
    cr_expect(strstr(moejit_last_error(), "moejit_model_prebuild: arch") &&
                  strstr(moejit_last_error(), "not a supported arch"),
              "%s", moejit_last_error());
  }
  moejit_spec pairs = s;
  pairs.gemm1.cluster_m = 2; /* clusters need sm_90 */
  cr_expect_eq(moejit_model_prebuild(c, &pairs, "sm_80", NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect(strstr(moejit_last_error(), "cluster"), "%s", moejit_last_error());
  moejit_spec bad = s;
  bad.top_k = bad.experts + 1;
  cr_expect_eq(moejit_model_prebuild(c, &bad, "sm_90a", NULL, NULL), MOEJIT_ERR_CONFIG);
  cr_expect(strstr(moejit_last_error(), "top_k"), "%s", moejit_last_error());
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  const int worlds[] = {2, -4};
  for (size_t i = 0; i < MJ_ARRAY_LEN(worlds); i++) {
    opts.ep.world = worlds[i];
    cr_expect_eq(moejit_model_prebuild(c, &s, "sm_90a", NULL, &opts), MOEJIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(moejit_last_error(), "opts.ep"), "%s", moejit_last_error());
  }

  /* a table that does not parse: CONFIG with its position, as a load */
  char file[256];
  mj_tuned_file_name(kDevice, file, sizeof file);
  char text[256];
  snprintf(text, sizeof text, "device: \"%s\"\nentries:\n  - {kernel: gemm1}\n", kDevice);
  free(ts_write_file(tables, file, text));
  moejit_load_opts_init(&opts);
  opts.report = &r;
  cr_expect_eq(moejit_model_prebuild(c, &s, "sm_90a", kDevice, &opts), MOEJIT_ERR_CONFIG);
  const char *msg = moejit_last_error();
  cr_expect(strstr(msg, "moejit_model_prebuild: ") && strstr(msg, ":3:5: entries[0]") &&
                strstr(msg, "HINT"),
            "%s", msg);
  cr_expect_eq(ts_count_files(tmp, ".mjc"), 0, "nothing was compiled");
  moejit_compiler_destroy(c);
}

/* The module part an entry belongs in (model.c's module_part, spelled out). */
static int entry_part(const char *entry) {
  static const char *const gemv_and_decode[] = {
      "moejit_gemm1_swiglu_gemv",       "moejit_gemm2_gemv",
      "moejit_layer_decode_gemm1",      "moejit_layer_decode_gemm2",
      "moejit_layer_decode_gemm1_wide", "moejit_layer_decode_gemm2_wide"};
  if (!strcmp(entry, "moejit_layer_decode_gemm1_wide64") ||
      !strcmp(entry, "moejit_layer_decode_gemm2_wide64"))
    return 2;
  for (size_t i = 0; i < MJ_ARRAY_LEN(gemv_and_decode); i++)
    if (!strcmp(entry, gemv_and_decode[i])) return 1;
  return 0;
}

/* The module of (family, kernel spec) holding `entry`, or NULL (a kernel
 * spec's entries are in up to three modules, by part). */
static const mj_gemm_module *module_with(const mj_gemm_module *mods, size_t n, const char *family,
                                         const moejit_spec *kspec, const char *entry) {
  moejit_spec canon;
  mj_spec_canonical(kspec, &canon);
  for (size_t i = 0; i < n; i++) {
    if (strcmp(mods[i].family, family) != 0 || memcmp(&mods[i].spec, &canon, sizeof canon) != 0)
      continue;
    for (int e = 0; e < mods[i].set.n; e++)
      if (strcmp(mods[i].set.name[e], entry) == 0) return &mods[i];
  }
  return NULL;
}

/* What the forward runs for GEMM `which` at T, as layer.c asks for it. */
static void expect_covered(const moejit_spec *s, const char *arch, const mj_gemm_variants v[2],
                           const mj_gemm_module *mods, size_t n, int64_t t, const char *what) {
  for (int which = 1; which <= 2; which++) {
    mj_gemm_choice c;
    if (mj_gemm_choose(s, &v[which - 1], which, t, arch, &c) != MOEJIT_OK)
      continue; /* T too large */
    moejit_spec scratch;
    const moejit_spec *ks = mj_gemm_kernel_spec(c.spec, which, &c.plan, &scratch);
    const char *want[4] = {c.plan.entry, NULL, NULL, NULL};
    if (which == 1) want[1] = mj_gemm1_gather_entry(&c.plan);
    if (c.plan.use_gemv) want[2] = which == 1 ? MJ_ENTRY_DECODE1 : MJ_ENTRY_DECODE2;
    /* within the decode layer's reach, the pair of entries T takes (the
     * first, _wide past 8 entries, _wide64 past 32) */
    if (c.plan.use_gemv && mj_decode_reach(s, t))
      want[3] = mj_decode_entry(which, mj_decode_pair(s, t));
    for (int i = 0; i < 4; i++)
      if (want[i])
        cr_expect(module_with(mods, n, c.plan.family, ks, want[i]),
                  "%s %s %s: T=%lld runs %s (variant %d), which no module of the load holds",
                  s->name, arch, what, (long long)t, want[i], c.variant);
  }
}

Test(prebuild, every_kernel_a_forward_looks_up_is_in_a_module_of_the_load) {
  static const char *const presets[] = {"qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b",
                                        "deepseek-v3"};
  static const char *const archs[] = {"sm_90a", "sm_80", "sm_86"};
  unsetenv("MOEJIT_TUNED_DIR");
  mj_tuned_table h100;
  OK(mj_tuned_table_for_device("NVIDIA H100 80GB HBM3", &h100));
  ts_rng r = ts_rng_fresh("prebuild coverage");
  for (size_t p = 0; p < MJ_ARRAY_LEN(presets); p++)
    for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++)
      for (int tuned = 0; tuned < 2; tuned++) {
        moejit_spec s;
        OK(moejit_spec_load_preset(presets[p], &s));
        if (p == 0 && a == 0 && !tuned) s.act_dtype = s.weight_dtype = MOEJIT_DTYPE_FP16;
        mj_gemm_variants v[2];
        for (int which = 1; which <= 2; which++) {
          moejit_load_kernel row;
          mj_gemm_variants_collect(tuned ? &h100 : NULL, "none", &s, which, archs[a], &v[which - 1],
                                   &row);
        }
        if (tuned && !strcmp(archs[a], "sm_90a"))
          cr_expect_gt(v[0].n + v[1].n, 0, "%s: the H100 table has entries", presets[p]);
        mj_gemm_module *mods = NULL;
        size_t n = 0;
        OK(mj_layer_gemm_modules(&s, archs[a], v, &mods, &n));
        cr_assert_gt(n, 0);
        for (size_t i = 0; i < n; i++) {
          cr_expect_gt(mods[i].set.n, 0);
          /* every entry in the part of its kind: the tile kernels (0), the
           * GEMV path and the decode layer's first two pairs (1), _wide64 (2) */
          for (int e = 0; e < mods[i].set.n; e++)
            cr_expect_eq(mods[i].part, entry_part(mods[i].set.name[e]),
                         "%s %s module %zu (part %d) holds %s", presets[p], archs[a], i,
                         mods[i].part, mods[i].set.name[e]);
        }
        const char *what = tuned ? "tuned" : "heuristic";
        for (int64_t t = 1; t <= 300; t++) expect_covered(&s, archs[a], v, mods, n, t, what);
        for (int64_t t = 256; t <= ((int64_t)1 << 22); t *= 2)
          for (int64_t d = -1; d <= 1; d++) expect_covered(&s, archs[a], v, mods, n, t + d, what);
        for (int i = 0; i < 300; i++)
          expect_covered(&s, archs[a], v, mods, n, 1 + (int64_t)(ts_next(&r) % (1u << 22)), what);
        free(mods);
      }
  mj_tuned_table_free(&h100);
}

/* GEMM 1 gathers x rows (no permuted copy) with 64-row tiles, and with
 * cooperative 128-row tiles where the expert width f is at most 2048 and x
 * fits in L2 times min(2, 2048 / f): the H100 table's choices at the points
 * the rule was measured on (layer.c, mj_moe_gemm1_gathers). */
Test(prebuild, gemm1_gathers_where_it_was_measured_to_pay) {
  static const struct {
    const char *preset;
    int64_t tokens;
    int gathers;
  } cases[] = {
      {"qwen3-30b-a3b", 2048, 1},  /* 128x256, x 8 MB */
      {"qwen3-30b-a3b", 512, 1},   /* 64x128 (bucket 256) */
      {"qwen3-30b-a3b", 16384, 1}, /* 128x256, x 67 MB */
      {"qwen3-30b-a3b", 8192, 1},  /* x 34 MB */
      {"olmoe-1b-7b", 2048, 1},    /* 128x256, x 8 MB */
      {"olmoe-1b-7b", 16384, 1},   /* 128x256, x 67 MB */
      {"mixtral-8x7b", 2048, 0},   /* f = 14336 */
      {"mixtral-8x7b", 16384, 0},  /* f = 14336 */
      {"deepseek-v3", 2048, 1},    /* 128x256, x 29 MB */
      {"deepseek-v3", 4096, 0},    /* x 59 MB: past L2 x 2048 / f */
      {"deepseek-v3", 16384, 0},   /* x 235 MB */
      /* 128x256 with 1-2 whole M-tiles an expert and a last one 20-55% full:
       * the copy (gather_short_tail_loses) */
      {"qwen3-30b-a3b", 2560, 0}, /* 160 rows an expert: 1 + 25% */
      {"qwen3-30b-a3b", 3072, 0}, /* 1 + 50% */
      {"qwen3-30b-a3b", 4608, 0}, /* 2 + 25% */
      {"qwen3-30b-a3b", 5120, 0}, /* 2 + 50% */
      {"qwen3-30b-a3b", 2304, 1}, /* 1 + 12% */
      {"qwen3-30b-a3b", 3584, 1}, /* 1 + 75% */
      {"qwen3-30b-a3b", 7168, 1}, /* 3 + 50% */
      {"olmoe-1b-7b", 2304, 0},   /* 2 + 25% */
      {"olmoe-1b-7b", 1536, 1},   /* 1 + 50%, but 8 rounds of tiles on 132 SMs */
      {"deepseek-v3", 2560, 1},   /* 80 rows an expert: one M-tile */
  };
  const int64_t l2 = 50 << 20; /* an H100's */
  const int sms = 132;
  unsetenv("MOEJIT_TUNED_DIR");
  unsetenv("MOEJIT_GEMM1_GATHER");
  mj_tuned_table h100;
  OK(mj_tuned_table_for_device("NVIDIA H100 80GB HBM3", &h100));
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    moejit_spec s;
    OK(moejit_spec_load_preset(cases[i].preset, &s));
    mj_gemm_variants v;
    moejit_load_kernel row;
    mj_gemm_variants_collect(&h100, "none", &s, 1, "sm_90a", &v, &row);
    mj_gemm_choice c;
    OK(mj_gemm_choose(&s, &v, 1, cases[i].tokens, "sm_90a", &c));
    cr_expect_eq(mj_moe_gemm1_gathers(&s, cases[i].tokens, &c, l2, sms), cases[i].gathers,
                 "%s T=%lld (tile %dx%d%s): gathers %d", cases[i].preset,
                 (long long)cases[i].tokens, c.plan.tile_m, c.plan.tile_n,
                 c.plan.wg_pingpong ? " ping-pong" : "", cases[i].gathers);
    if (i == 2) {
      cr_expect(!mj_moe_gemm1_gathers(&s, cases[i].tokens, &c, 0, sms),
                "no L2 size: no 128-row gather");
      cr_expect(!mj_moe_gemm1_gathers(&s, 8 * cases[i].tokens, &c, l2, sms), "x past twice the L2");
      setenv("MOEJIT_GEMM1_GATHER", "0", 1);
      cr_expect(!mj_moe_gemm1_gathers(&s, cases[i].tokens, &c, l2, sms), "MOEJIT_GEMM1_GATHER=0");
      unsetenv("MOEJIT_GEMM1_GATHER");
    }
    if (i == 5) {
      setenv("MOEJIT_GEMM1_GATHER", "1", 1);
      cr_expect(mj_moe_gemm1_gathers(&s, cases[i].tokens, &c, l2, sms), "MOEJIT_GEMM1_GATHER=1");
      unsetenv("MOEJIT_GEMM1_GATHER");
    }
  }
  mj_tuned_table_free(&h100);
}

/* The presets' tiles are an H100's (227 KiB of shared memory a block). On
 * a GPU that allows less, AUTO's mma.sync tile keeps its M and N and comes
 * down in stages, then tile_k, until it fits: every T of every preset
 * plans within the arch's limit, with a kernel spec the config rules
 * accept; path MMA keeps the tile as given and is refused with a hint. */
Test(prebuild, presets_fit_the_shared_memory_of_smaller_archs) {
  static const char *const presets[] = {"qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b",
                                        "deepseek-v3"};
  static const struct {
    const char *arch;
    int bytes;
  } archs[] = {{"sm_80", 166912}, {"sm_86", 101376},  {"sm_87", 166912}, {"sm_89", 101376},
               {"sm_90", 232448}, {"sm_100", 232448}, {"sm_120", 101376}};
  unsetenv("MOEJIT_TUNED_DIR");
  cr_expect_eq(mj_arch_smem_optin("auto"), 0);
  cr_expect_eq(mj_arch_smem_optin(NULL), 0);
  cr_expect_eq(mj_arch_smem_optin("sm_90a"), 232448);
  cr_expect_eq(mj_arch_smem_optin("sm_120a"), 101376);
  for (size_t p = 0; p < MJ_ARRAY_LEN(presets); p++)
    for (size_t a = 0; a < MJ_ARRAY_LEN(archs); a++) {
      moejit_spec s;
      OK(moejit_spec_load_preset(presets[p], &s));
      cr_expect_eq(mj_arch_smem_optin(archs[a].arch), archs[a].bytes, "%s", archs[a].arch);
      int fitted = 0;
      for (int64_t t = 1; t <= ((int64_t)1 << 20); t = t < 64 ? t + 1 : 2 * t)
        for (int which = 1; which <= 2; which++) {
          mj_gemm_choice c;
          OK(mj_gemm_choose(&s, NULL, which, t, archs[a].arch, &c));
          cr_expect_leq(c.plan.smem_bytes, (unsigned)archs[a].bytes,
                        "%s on %s, GEMM %d at T=%lld: %u bytes", presets[p], archs[a].arch, which,
                        (long long)t, c.plan.smem_bytes);
          moejit_spec scratch;
          const moejit_spec *ks = mj_gemm_kernel_spec(c.spec, which, &c.plan, &scratch);
          cr_expect_eq(moejit_spec_validate(ks), MOEJIT_OK, "%s", moejit_last_error());
          const moejit_gemm_cfg *k = which == 1 ? &ks->gemm1 : &ks->gemm2;
          if (c.plan.use_mma)
            cr_expect_eq(mj_gemm_smem_bytes(k, 2), c.plan.smem_bytes,
                         "the kernel's tile is the plan's");
          fitted |= c.plan.fitted;
        }
      /* the presets' 128x256 tiles take 192 KiB: fitted below 227 KiB only */
      cr_expect_eq(fitted, archs[a].bytes < 232448, "%s on %s: fitted %d", presets[p],
                   archs[a].arch, fitted);
    }
  /* qwen3-30b-a3b at T = 2048 on sm_86 (99 KiB) and sm_80 (163 KiB):
   * GEMM 1 128x256x64 s4 -> s2 / s3; GEMM 2 128x256x128 s2 -> 128x256x64 s2 / s3 */
  moejit_spec s = qwen();
  static const struct {
    const char *arch;
    int which, tile_k, stages;
  } want[] = {{"sm_86", 1, 64, 2}, {"sm_86", 2, 64, 2}, {"sm_80", 1, 64, 3}, {"sm_80", 2, 64, 3}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(want); i++) {
    mj_gemm_plan plan;
    OK(mj_gemm_plan_make_for(&s, want[i].which, MOEJIT_GEMM_PATH_AUTO, 2048 * 8, want[i].arch,
                             &plan));
    cr_expect(plan.use_mma && plan.fitted && !plan.decode);
    cr_expect(plan.cfg.tile_m == 128 && plan.cfg.tile_n == 256 && plan.cfg.warps == 8 &&
                  plan.cfg.tile_k == want[i].tile_k && plan.cfg.stages == want[i].stages,
              "GEMM %d on %s: %dx%dx%d s%d", want[i].which, want[i].arch, plan.cfg.tile_m,
              plan.cfg.tile_n, plan.cfg.tile_k, plan.cfg.stages);
    /* path MMA runs the tile as given: refused, with what to do */
    cr_expect_eq(mj_gemm_plan_make_for(&s, want[i].which, MOEJIT_GEMM_PATH_MMA, 2048 * 8,
                                       want[i].arch, &plan),
                 MOEJIT_ERR_UNSUPPORTED);
    cr_expect(strstr(moejit_last_error(), "bytes of shared memory a block") &&
                  strstr(moejit_last_error(), want[i].arch) &&
                  strstr(moejit_last_error(), "MOEJIT_GEMM_PATH_AUTO"),
              "%s", moejit_last_error());
  }
  /* sm_90a runs wgmma, which sizes its own stages; the spec is untouched */
  mj_gemm_plan plan;
  OK(mj_gemm_plan_make_for(&s, 1, MOEJIT_GEMM_PATH_AUTO, 2048 * 8, "sm_90a", &plan));
  cr_expect(plan.use_wgmma && !plan.fitted);
  /* a prebuild for sm_86 compiles the fitted kernels and says so */
  moejit_compiler *c = compiler();
  moejit_load_report r;
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.report = &r;
  OK(moejit_model_prebuild(c, &s, "sm_86", "NVIDIA GeForce RTX 3090", &opts));
  const moejit_load_kernel *g1 = row(&r, "gemm1"), *g2 = row(&r, "gemm2");
  cr_expect(strstr(g1->config_detail,
                   "the 128x256x64 s4 w8 tile runs as 128x256x64 s2 w8, "
                   "fitted to sm_86's 99 KiB of shared memory a block; "),
            "%s", g1->config_detail);
  cr_expect(strstr(g2->config_detail, "runs as 128x256x64 s2 w8, fitted to sm_86's"), "%s",
            g2->config_detail);
  cr_expect(strstr(g1->config_detail, "no tuned table"), "the rest of the detail stays: %s",
            g1->config_detail);
  moejit_compiler_destroy(c);
}
