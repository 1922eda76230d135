/* The code generator without NVRTC: prelude constants, #line mapping back to
 * template lines, include inlining, entry discovery, template overrides,
 * determinism, and which spec changes reach the source (and so the key). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "codegen/codegen.h"
#include "codegen_support.h"
#include "common/common.h"
#include "compile/compile.h"
#include "test_support.h"

static char *tmp;

static void setup(void) {
  unsetenv("MOEJIT_TEMPLATE_DIR");
  tmp = ts_mkdtemp("codegen");
}
static void teardown(void) {
  ts_rmtree(tmp);
  free(tmp);
}

TestSuite(codegen, .init = setup, .fini = teardown, .timeout = 60);

#define GOOD cs_template_dir("good")

static mj_kernel_source gen_ok(const moejit_spec *s, const char *family, const char *arch,
                               const char *dir) {
  mj_kernel_source ks;
  moejit_status st = mj_codegen(s, family, arch, dir, &ks);
  cr_assert_eq(st, MOEJIT_OK, "codegen %s %s: %s", family, arch, moejit_last_error());
  cr_assert_not_null(ks.source);
  cr_assert_eq(strlen(ks.source), ks.source_len);
  return ks;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void key_of(const mj_kernel_source *ks, int fast_math, char key[33]) {
  char opts[256];
  mj_compile_opts o = {.arch = ks->arch, .fast_math = fast_math, .lineinfo = 1};
  mj_compile_opts_string(&o, opts, sizeof opts);
  mj_cache_key(ks->source, ks->source_len, opts, 13, 0, ks->arch, key);
}

Test(codegen, families_in_layer_order) {
  const char *const *f = moejit_kernel_families();
  cr_assert_eq(f, mj_kernel_families);
  const char *want[] = {"route", "align", "gemm1", "gemm2", "combine"};
  for (int i = 0; i < 5; i++) cr_assert_str_eq(f[i], want[i]);
  cr_assert_null(f[5]);
}

Test(codegen, unknown_family_lists_known_ones) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("unknown_family");
  cs_random_spec(&r, &s);
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "gemm9", "sm_90a", GOOD, &ks), MOEJIT_ERR_NOT_FOUND);
  cr_assert(strstr(moejit_last_error(), "gemm9"), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), "route, align, gemm1, gemm2, combine"), "%s",
            moejit_last_error());
  cr_assert_null(ks.source);
}

Test(codegen, prelude_holds_every_constant) {
  ts_rng r = ts_rng_fresh("prelude");
  for (int round = 0; round < 8; round++) {
    moejit_spec s;
    cs_random_spec(&r, &s);
    const char *archs[] = {"sm_80", "sm_90a", "sm_100a"};
    const int sms[] = {80, 90, 100};
    const char *arch = archs[round % 3];
    mj_kernel_source ks = gen_ok(&s, "align", arch, GOOD);
    const char *src = ks.source;
    char want[256];
    static const char *ctype[] = {"float", "__half", "__nv_bfloat16"};
#define HAS(...)                                                          \
  do {                                                                    \
    snprintf(want, sizeof want, __VA_ARGS__);                             \
    cr_assert(strstr(src, want), "missing '%s' in:\n%.2000s", want, src); \
  } while (0)
    HAS("#define MOEJIT_ARCH_SM %d\n", sms[round % 3]);
    HAS("enum : int { kHidden = %lld, kExpertWidth = %lld, kExperts = %d, kTopK = %d };",
        (long long)s.hidden, (long long)s.expert_width, s.experts, s.top_k);
    HAS("enum : int { kRouteRule = %d };", (int)s.routing.rule);
    HAS("enum : bool { kRenormalize = %s };", s.routing.renormalize ? "true" : "false");
    HAS("enum : int { kNumGroups = %d, kTopkGroup = %d };", s.routing.n_group,
        s.routing.topk_group);
    HAS("enum : int { kBlockThreads = %d, kGemmTileM = %d };", s.align.block_threads,
        s.gemm1.tile_m);
    HAS("typedef %s act_t;", ctype[s.act_dtype]);
    HAS("typedef %s weight_t;", ctype[s.weight_dtype]);
    HAS("typedef %s logits_t;", ctype[s.logits_dtype]);
    HAS("typedef %s out_t;", ctype[s.out_dtype]);
    HAS("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
    HAS("kernel 'align' for %s", arch);
    HAS("moejit %s", moejit_version_string());
    /* The scaling factor round-trips through its literal. */
    const char *lit = strstr(src, "mj_scaling_factor() { return ");
    cr_assert_not_null(lit);
    cr_assert_eq(strtof(lit + 29, NULL), s.routing.scaling_factor);
#undef HAS
    mj_kernel_source_free(&ks);
  }
}

Test(codegen, block_threads_follow_the_family) { /* a GEMM block is its warps */
  moejit_spec s;
  ts_rng r = ts_rng_fresh("block_threads");
  cs_random_spec(&r, &s);
  s.route.block_threads = 96, s.align.block_threads = 512, s.combine.block_threads = 160;
  s.gemm1.warps = 4, s.gemm1.tile_m = 64, s.gemm1.tile_n = 128; /* <= 128 accumulators/thread */
  s.gemm2.warps = 12;
  const char *fam[] = {"route", "align", "combine", "gemm1", "gemm2"};
  const int want[] = {96, 512, 160, 128, 384};
  for (int i = 0; i < 5; i++) {
    mj_kernel_source ks = gen_ok(&s, fam[i], "sm_90a", GOOD);
    char line[80];
    snprintf(line, sizeof line, "enum : int { kBlockThreads = %d,", want[i]);
    cr_assert(strstr(ks.source, line), "%s lacks %s", fam[i], line);
    mj_kernel_source_free(&ks);
  }
}

Test(codegen, gemm_families_get_their_own_tile) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("gemm_tile");
  cs_random_spec(&r, &s);
  s.gemm1 = (moejit_gemm_cfg){32, 128, 64, 3, 4, 2, 1, MOEJIT_RASTER_ALONG_N, MOEJIT_SCHEDULE_COOPERATIVE};
  s.gemm2 = (moejit_gemm_cfg){64, 64, 32, 2, 8, 1, 2, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
  /* cluster_n 2 needs an even n-tile count: hidden / 64 even */
  s.hidden = (s.hidden + 127) / 128 * 128;
  const moejit_gemm_cfg *cfg[] = {&s.gemm1, &s.gemm2};
  for (int i = 0; i < 2; i++) {
    mj_kernel_source ks = gen_ok(&s, i ? "gemm2" : "gemm1", "sm_90a", GOOD);
    const moejit_gemm_cfg *g = cfg[i];
    char want[512];
    snprintf(want, sizeof want,
             "enum : int { kTileM = %d, kTileN = %d, kTileK = %d, kStages = %d, kWarps = %d };\n"
             "enum : int { kClusterM = %d, kClusterN = %d };\nenum : int { kRaster = %d };",
             g->tile_m, g->tile_n, g->tile_k, g->stages, g->warps, g->cluster_m, g->cluster_n,
             (int)g->raster);
    cr_assert(strstr(ks.source, want), "gemm%d lacks\n%s\nin\n%.1500s", i + 1, want, ks.source);
    /* and as macros, which pick the entries' __cluster_dims__ */
    snprintf(want, sizeof want, "#define MJ_CLUSTER_M %d\n#define MJ_CLUSTER_N %d\n", g->cluster_m,
             g->cluster_n);
    cr_assert(strstr(ks.source, want), "gemm%d lacks\n%s", i + 1, want);
    mj_kernel_source_free(&ks);
  }
  /* The memory-bound families get no GEMM tile (so it stays out of their keys). */
  mj_kernel_source ks = gen_ok(&s, "combine", "sm_90a", GOOD);
  cr_assert_null(strstr(ks.source, "kTileN"));
  mj_kernel_source_free(&ks);
}

Test(codegen, scaling_factor_is_always_a_float_literal) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("scaling");
  cs_random_spec(&r, &s);
  const float values[] = {1.0f, 2.5f, 0.1f, 1000.0f, 1e-7f};
  const char *want[] = {"return 1.0f;", "return 2.5f;", "return 0.100000001f;", "return 1000.0f;",
                        "return 1.00000001e-07f;"};
  for (int i = 0; i < 5; i++) {
    s.routing.scaling_factor = values[i];
    mj_kernel_source ks = gen_ok(&s, "route", "sm_90a", GOOD);
    char *line = strstr(ks.source, "mj_scaling_factor() { ");
    cr_assert_not_null(line);
    cr_assert(strncmp(strstr(line, "return"), want[i], strlen(want[i])) == 0, "got %.50s, want %s",
              line, want[i]);
    mj_kernel_source_free(&ks);
  }
}

Test(codegen, lines_map_back_to_template_files) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("line_mapping");
  cs_random_spec(&r, &s);
  for (const char *const *f = mj_kernel_families; *f; f++) {
    mj_kernel_source ks = gen_ok(&s, *f, "sm_90a", GOOD);
    char why[512] = "";
    cr_assert_eq(cs_check_line_mapping(ks.source, GOOD, why, sizeof why), 0, "%s: %s", *f, why);
    char marker[64];
    snprintf(marker, sizeof marker, "#line 1 \"%s.cu\"\n", *f);
    cr_assert_eq(count_of(ks.source, marker), 1, "%s", ks.source);
    mj_kernel_source_free(&ks);
  }
}

Test(codegen, includes_inlined_once_nested_and_resumed) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("includes");
  cs_random_spec(&r, &s);
  mj_kernel_source ks = gen_ok(&s, "route", "sm_80", GOOD);
  const char *src = ks.source;
  /* route.cu includes test_math.cuh (line 2), which includes test_types.cuh
   * by bare name; route.cu's own include of test_types.cuh (line 3) is then
   * a comment, and the text resumes at line 3 and 4 of route.cu. */
  cr_assert_eq(count_of(src, "#line 1 \"common/test_math.cuh\"\n"), 1);
  cr_assert_eq(count_of(src, "#line 1 \"common/test_types.cuh\"\n"), 1);
  cr_assert_eq(count_of(src, "struct TestChoice {"), 1);
  cr_assert(strstr(src, "#line 4 \"common/test_math.cuh\"\n"), "resume after nested include");
  cr_assert(strstr(src, "#line 3 \"route.cu\"\n// #include \"common/test_types.cuh\""), "%s", src);
  cr_assert_eq(count_of(src, "\n#include \""), 0, "a quoted include was left: %s", src);
  cr_assert_eq(count_of(src, "\n#pragma once"), 0, "#pragma once left in the main file");
  cr_assert_eq(ks.n_entries, 1);
  cr_assert_str_eq(ks.entries[0], "moejit_test_route");
  cr_assert_str_eq(ks.template_name, "route.cu");
  mj_kernel_source_free(&ks);
}

Test(codegen, same_inputs_give_identical_bytes) {
  ts_rng r = ts_rng_fresh("determinism");
  moejit_spec s;
  cs_random_spec(&r, &s);
  mj_kernel_source a = gen_ok(&s, "combine", "sm_90a", GOOD);
  moejit_spec copy = s; /* a separate copy, as a second caller would have */
  mj_kernel_source b = gen_ok(&copy, "combine", "sm_90a", GOOD);
  cr_assert_eq(a.source_len, b.source_len);
  cr_assert_eq(memcmp(a.source, b.source, a.source_len), 0);
  /* Through two compiler objects and the public call. */
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.template_dir = GOOD;
  moejit_compiler *c1, *c2;
  cr_assert_eq(moejit_compiler_create(&c1, &o), MOEJIT_OK);
  cr_assert_eq(moejit_compiler_create(&c2, &o), MOEJIT_OK);
  char *s1 = NULL, *s2 = NULL;
  cr_assert_eq(moejit_generate(c1, &s, "combine", "sm_90a", &s1), MOEJIT_OK, "%s",
               moejit_last_error());
  cr_assert_eq(moejit_generate(c2, &copy, "combine", "sm_90a", &s2), MOEJIT_OK);
  cr_assert_str_eq(s1, s2);
  cr_assert_str_eq(s1, a.source);
  moejit_free(s1);
  moejit_free(s2);
  moejit_compiler_destroy(c1);
  moejit_compiler_destroy(c2);
  mj_kernel_source_free(&a);
  mj_kernel_source_free(&b);
}

Test(codegen, no_absolute_path_in_source_or_options) {
  ts_rng r = ts_rng_fresh("no_abs_path");
  moejit_spec s;
  cs_random_spec(&r, &s);
  snprintf(s.cache_dir, sizeof s.cache_dir, "%s/cache", tmp);
  for (const char *const *f = mj_kernel_families; *f; f++) {
    mj_kernel_source ks = gen_ok(&s, *f, "sm_90a", GOOD);
    cr_assert_null(strstr(ks.source, MOEJIT_TEST_SOURCE_DIR), "template dir leaked");
    cr_assert_null(strstr(ks.source, tmp), "cache dir leaked");
    cr_assert_null(strstr(ks.source, "\"/"), "an absolute path in a string");
    cr_assert_null(strstr(ks.source, "0x"), "pointer-like values");
    mj_kernel_source_free(&ks);
  }
  char opts[256];
  for (int fm = 0; fm < 2; fm++)
    for (int li = 0; li < 2; li++) {
      mj_compile_opts o = {.arch = "sm_90a", .fast_math = fm, .lineinfo = li};
      mj_compile_opts_string(&o, opts, sizeof opts);
      cr_assert_null(strchr(opts, '/'), "options hold a path: %s", opts);
      cr_assert(strstr(opts, "--gpu-architecture=sm_90a -std=c++17") == opts, "%s", opts);
      cr_assert_eq(strstr(opts, "-lineinfo") != NULL, li);
      cr_assert_eq(strstr(opts, "--use_fast_math") != NULL, fm);
    }
}

Test(codegen, key_changes_exactly_when_the_source_does) {
  ts_rng r = ts_rng_fresh("key_inputs");
  moejit_spec base;
  cs_random_spec(&r, &base);
  mj_kernel_source ks = gen_ok(&base, "align", "sm_90a", GOOD);
  char k0[33], k[33];
  key_of(&ks, 0, k0);
  cr_assert_eq(strlen(k0), 32);
  key_of(&ks, 1, k);
  cr_assert_str_neq(k0, k, "fast_math is an input");
  mj_kernel_source_free(&ks);

  /* Fields that reach the prelude: each changes the key. */
  for (int field = 0; field < 7; field++) {
    moejit_spec s = base;
    switch (field) {
      case 0:
        s.hidden += 8;
        break;
      case 1:
        s.expert_width += 8;
        break;
      case 2:
        s.top_k = s.top_k > 1 ? s.top_k - 1 : 2;
        break;
      case 3:
        s.align.block_threads = s.align.block_threads == 128 ? 256 : 128;
        break;
      case 4:
        s.gemm1.tile_m = s.gemm1.tile_m == 64 ? 128 : 64;
        break;
      case 5:
        s.out_dtype = (moejit_dtype)((s.out_dtype + 1) % 3);
        break;
      case 6:
        s.routing.renormalize = !s.routing.renormalize;
        break;
    }
    ks = gen_ok(&s, "align", "sm_90a", GOOD);
    key_of(&ks, 0, k);
    cr_assert_str_neq(k0, k, "field %d reaches the source, so it must change the key", field);
    mj_kernel_source_free(&ks);
  }
  /* Fields that do not reach the source: same bytes, same key. */
  for (int field = 0; field < 4; field++) {
    moejit_spec s = base;
    switch (field) {
      case 0:
        snprintf(s.cache_dir, sizeof s.cache_dir, "%s/elsewhere", tmp);
        break;
      case 1:
        s.cache_max_bytes = 123456789;
        break;
      case 2:
        s.gemm2.tile_n = s.gemm2.tile_n == 64 ? 128 : 64;
        break;
      case 3:
        s.route.block_threads = s.route.block_threads == 128 ? 256 : 128;
        break;
    }
    ks = gen_ok(&s, "align", "sm_90a", GOOD);
    key_of(&ks, 0, k);
    cr_assert_str_eq(k0, k, "field %d does not reach align's source: same key", field);
    mj_kernel_source_free(&ks);
  }
  /* A GEMM family's key follows its own tile, not the other GEMM's. */
  moejit_spec g = base;
  char kg[33], kg2[33];
  ks = gen_ok(&g, "gemm2", "sm_90a", GOOD);
  key_of(&ks, 0, kg);
  mj_kernel_source_free(&ks);
  g.gemm1.tile_n = g.gemm1.tile_n == 128 ? 256 : 128;
  ks = gen_ok(&g, "gemm2", "sm_90a", GOOD);
  key_of(&ks, 0, kg2);
  mj_kernel_source_free(&ks);
  cr_assert_str_eq(kg, kg2, "gemm1.tile_n does not reach gemm2");
  g.gemm2.tile_n = g.gemm2.tile_n == 128 ? 64 : 128; /* smaller: fits any stages it had */
  ks = gen_ok(&g, "gemm2", "sm_90a", GOOD);
  key_of(&ks, 0, kg2);
  mj_kernel_source_free(&ks);
  cr_assert_str_neq(kg, kg2, "gemm2.tile_n reaches gemm2");
  /* The arch is an input too. */
  ks = gen_ok(&base, "align", "sm_80", GOOD);
  key_of(&ks, 0, k);
  cr_assert_str_neq(k0, k);
  mj_kernel_source_free(&ks);
}

static void write_template(const char *dir, const char *name, const char *text) {
  char *p = ts_write_file(dir, name, text);
  cr_assert_not_null(p);
  free(p);
}

Test(codegen, entry_scanning_variants) {
  write_template(tmp, "route.cu",
                 "// extern \"C\" __global__ void in_line_comment(int *x) {}\n"
                 "/* extern \"C\" __global__ void in_block_comment(int *x) {} */\n"
                 "extern \"C\" __global__ void declared(int *x);\n"
                 "const char *s = \"extern \\\"C\\\" __global__ void in_string(int *x) {\";\n"
                 "extern \"C\" __global__ void plain(int *x) { x[0] = 1; }\n"
                 "extern \"C\" __global__ __launch_bounds__(kBlockThreads, 1) void\n"
                 "    bounds_before(int *x) { x[0] = 2; }\n"
                 "extern   \"C\"\n__global__\nvoid __launch_bounds__(256)\n"
                 "  bounds_after (int *x,\n  int n)\n{ x[0] = n; }\n"
                 "extern \"C\" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128)\n"
                 "    two_attrs(int *x) {}\n"
                 "extern \"C\" __global__ void plain(int *x);\n"
                 "static __global__ void not_extern_c(int *x) {}\n");
  moejit_spec s;
  ts_rng r = ts_rng_fresh("entries");
  cs_random_spec(&r, &s);
  mj_kernel_source ks = gen_ok(&s, "route", "sm_90a", tmp);
  const char *want[] = {"plain", "bounds_before", "bounds_after", "two_attrs"};
  cr_assert_eq(ks.n_entries, 4, "found %d entries (first %s)", ks.n_entries, ks.entries[0]);
  for (int i = 0; i < 4; i++) cr_assert_str_eq(ks.entries[i], want[i]);
  mj_kernel_source_free(&ks);

  ks = gen_ok(&s, "align", "sm_90a", GOOD);
  cr_assert_eq(ks.n_entries, 2);
  cr_assert_str_eq(ks.entries[0], "moejit_test_align_count");
  cr_assert_str_eq(ks.entries[1], "moejit_test_align_tiles");
  mj_kernel_source_free(&ks);
}

/* mj_codegen_entries: the same source for any order of the same set, the
 * defines in template order in front of the full source, only those
 * entries listed, an empty set the full source, an unknown name refused. */
Test(codegen, entry_subsets) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("entry subsets");
  cs_random_spec(&r, &s);
  mj_kernel_source full = gen_ok(&s, "gemm2", "sm_90a", NULL), a, b, none;
  cr_assert_geq(full.n_entries, 3);
  const char *e0 = full.entries[0], *e2 = full.entries[2];
  mj_entry_set ab = {0}, ba = {0}, empty = {0};
  cr_assert(mj_entry_set_add(&ab, e0) && mj_entry_set_add(&ab, e2) && mj_entry_set_add(&ab, e0));
  cr_expect_eq(ab.n, 2, "a name is added once");
  cr_assert(mj_entry_set_add(&ba, e2) && mj_entry_set_add(&ba, e0));
  cr_assert_eq(mj_codegen_entries(&s, "gemm2", "sm_90a", NULL, &ab, &a), MOEJIT_OK);
  cr_assert_eq(mj_codegen_entries(&s, "gemm2", "sm_90a", NULL, &ba, &b), MOEJIT_OK);
  cr_assert_str_eq(a.source, b.source, "the order of the set does not matter");
  cr_assert_eq(a.n_entries, 2);
  cr_expect_str_eq(a.entries[0], e0);
  cr_expect_str_eq(a.entries[1], e2);
  char head[512];
  snprintf(head, sizeof head,
           "#define MJ_ENTRY_SUBSET 1\n#define MJ_WANT_%s 1\n#define MJ_WANT_%s 1\n", e0, e2);
  cr_expect(strncmp(a.source, head, strlen(head)) == 0, "%.200s", a.source);
  cr_expect_str_eq(a.source + strlen(head), full.source, "then the full source");
  cr_expect_eq(a.source_len, strlen(head) + full.source_len);
  cr_assert_eq(mj_codegen_entries(&s, "gemm2", "sm_90a", NULL, &empty, &none), MOEJIT_OK);
  cr_expect_str_eq(none.source, full.source, "an empty set: every entry");
  mj_entry_set bad = {0};
  mj_entry_set_add(&bad, "moejit_gemm1_swiglu_wgmma");
  mj_kernel_source x;
  cr_expect_eq(mj_codegen_entries(&s, "gemm2", "sm_90a", NULL, &bad, &x), MOEJIT_ERR_NOT_FOUND);
  cr_expect(strstr(moejit_last_error(), "no entry 'moejit_gemm1_swiglu_wgmma'"), "%s",
            moejit_last_error());
  cr_expect_null(x.source);
  mj_kernel_source_free(&a), mj_kernel_source_free(&b), mj_kernel_source_free(&none);
  mj_kernel_source_free(&full);
}

Test(codegen, template_without_entry_is_an_error) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("noentry");
  cs_random_spec(&r, &s);
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", cs_template_dir("noentry"), &ks),
               MOEJIT_ERR_COMPILE);
  cr_assert(strstr(moejit_last_error(), "route.cu defines no entry"), "%s", moejit_last_error());
  cr_assert_null(ks.source);
}

Test(codegen, missing_include_names_file_and_line) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("missing_include");
  cs_random_spec(&r, &s);
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", cs_template_dir("missing_include"), &ks),
               MOEJIT_ERR_NOT_FOUND);
  cr_assert(strstr(moejit_last_error(), "route.cu(2)"), "%s", moejit_last_error());
  cr_assert(strstr(moejit_last_error(), "common/absent.cuh"), "%s", moejit_last_error());
}

Test(codegen, include_cannot_leave_the_template_dir) {
  write_template(tmp, "route.cu", "#include \"../../etc/passwd\"\n");
  moejit_spec s;
  ts_rng r = ts_rng_fresh("escape");
  cs_random_spec(&r, &s);
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", tmp, &ks), MOEJIT_ERR_NOT_FOUND);
  /* nor by a name too long for the inliner, which NVRTC would then read
   * from the working directory, outside the cache key */
  char line[400];
  snprintf(line, sizeof line, "\n#include \"/tmp/%0200d.cuh\"\n", 0);
  write_template(tmp, "route.cu", line);
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", tmp, &ks), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "route.cu(2)") &&
                strstr(moejit_last_error(), "name must be 1 to 95 bytes"),
            "%s", moejit_last_error());
  write_template(tmp, "route.cu", "#include \"\"\n");
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", tmp, &ks), MOEJIT_ERR_UNSUPPORTED);
}

/* A NUL byte would end NVRTC's reading of the source there (a kernel
 * found by the entry scan past it, compiled to nothing): refused. */
Test(codegen, nul_byte_in_a_template_is_refused) {
  char path[1200];
  snprintf(path, sizeof path, "%s/route.cu", tmp);
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  static const char text[] = "// a comment\0 hidden\nextern \"C\" __global__ void k(int *x) {}\n";
  fwrite(text, 1, sizeof text - 1, f);
  fclose(f);
  const moejit_spec s = cs_fresh_spec("nul");
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", tmp, &ks), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "NUL byte at offset 12"), "%s", moejit_last_error());
}

Test(codegen, override_dir_has_no_fallback) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("partial");
  cs_random_spec(&r, &s);
  const char *partial = cs_template_dir("partial");
  mj_kernel_source ks = gen_ok(&s, "route", "sm_90a", partial);
  mj_kernel_source_free(&ks);
  cr_assert_eq(mj_codegen(&s, "align", "sm_90a", partial, &ks), MOEJIT_ERR_NOT_FOUND);
  char path[1200];
  snprintf(path, sizeof path, "%s/align.cu", partial);
  cr_assert(strstr(moejit_last_error(), path), "names the path: %s", moejit_last_error());
  snprintf(path, sizeof path, "%s/nonexistent", tmp);
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", path, &ks), MOEJIT_ERR_NOT_FOUND);
  cr_assert(strstr(moejit_last_error(), path), "%s", moejit_last_error());
}

Test(codegen, env_override_and_argument_precedence) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("env_override");
  cs_random_spec(&r, &s);
  write_template(tmp, "route.cu", "extern \"C\" __global__ void from_tmp_dir(int *x) {}\n");
  setenv("MOEJIT_TEMPLATE_DIR", tmp, 1);
  mj_kernel_source ks = gen_ok(&s, "route", "sm_90a", NULL);
  cr_assert_str_eq(ks.entries[0], "from_tmp_dir");
  mj_kernel_source_free(&ks);
  ks = gen_ok(&s, "route", "sm_90a", GOOD); /* the argument wins over the environment */
  cr_assert_str_eq(ks.entries[0], "moejit_test_route");
  mj_kernel_source_free(&ks);
  /* Through the compiler's option too. */
  moejit_compiler_opts o;
  moejit_compiler_opts_init(&o);
  o.template_dir = GOOD;
  moejit_compiler *c;
  cr_assert_eq(moejit_compiler_create(&c, &o), MOEJIT_OK);
  cr_assert_eq(mj_compiler_generate(c, &s, "route", NULL, &ks), MOEJIT_OK);
  cr_assert_str_eq(ks.entries[0], "moejit_test_route");
  cr_assert_str_eq(ks.arch, s.archs[0], "arch NULL: the spec's first");
  mj_kernel_source_free(&ks);
  moejit_compiler_destroy(c);
}

Test(codegen, arch_must_be_explicit_and_valid) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("arch");
  cs_random_spec(&r, &s);
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "auto", GOOD, &ks), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "HINT"), "%s", moejit_last_error());
  const char *bad[] = {"sm_9", "compute_90", "sm_90b", "", "sm_90a\"; evil"};
  for (int i = 0; i < 5; i++)
    cr_assert_eq(mj_codegen(&s, "route", bad[i], GOOD, &ks), MOEJIT_ERR_INVALID_ARGUMENT, "%s",
                 bad[i]);
}

Test(codegen, invalid_spec_is_a_config_error) {
  moejit_spec s;
  ts_rng r = ts_rng_fresh("invalid_spec");
  cs_random_spec(&r, &s);
  s.top_k = s.experts + 1;
  mj_kernel_source ks;
  cr_assert_eq(mj_codegen(&s, "route", "sm_90a", GOOD, &ks), MOEJIT_ERR_CONFIG);
  cr_assert(strstr(moejit_last_error(), "route"), "%s", moejit_last_error());
}

Test(codegen, embedded_templates_generate_for_every_preset) {
  for (const char *const *f = mj_kernel_families; *f; f++) {
    char name[64];
    snprintf(name, sizeof name, "%s.cu", *f);
    int found = 0;
    for (const mj_embedded_file *e = mj_embedded_templates; e->name; e++)
      found |= !strcmp(e->name, name);
    if (!found)
      cr_skip_test("templates/%s is not written yet: it is not embedded in this build", name);
  }
  for (size_t p = 0; p < mj_embedded_presets_count; p++) {
    moejit_spec s;
    cr_assert_eq(moejit_spec_load_preset(mj_embedded_presets[p].name, &s), MOEJIT_OK, "%s",
                 moejit_last_error());
    for (const char *const *f = mj_kernel_families; *f; f++) {
      mj_kernel_source ks = gen_ok(&s, *f, "sm_90a", NULL);
      char why[512] = "";
      cr_assert_eq(cs_check_line_mapping(ks.source, NULL, why, sizeof why), 0, "%s/%s: %s",
                   mj_embedded_presets[p].name, *f, why);
      cr_assert_eq(count_of(ks.source, "\n#include \""), 0);
      mj_kernel_source_free(&ks);
    }
  }
}
