/* The GPU runtime on a real GPU: buffers round-trip, a kernel goes NVRTC ->
 * cache -> load -> launch and gives the exact answer, a module loads once,
 * bad launches are refused without running, stream-ordered memory works,
 * and 1000 ctx create/launch/destroy cycles leak no device memory.
 * Skips with the reason where no GPU is usable. Kernels come from
 * tests/data/templates-runtime/combine.cu (integer results, checked
 * element by element). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "moejit/moejit.h"
#include "runtime/runtime.h"
#include "test_support.h"

#define TEMPLATE_DIR MOEJIT_TEST_SOURCE_DIR "/tests/data/templates-runtime"
#define FAMILY "combine"

static void require_gpu(void) {
  int n = 0;
  moejit_status st = moejit_device_count(&n);
  if (st != MOEJIT_OK) cr_skip_test("no GPU: %s", moejit_last_error());
  if (n == 0) cr_skip_test("no GPU: the CUDA driver reports no device");
}

/* A ctx whose compiler reads the test templates and caches under `dir`. */
static moejit_ctx *make_ctx(const char *cache_dir) {
  moejit_ctx_opts opts;
  moejit_ctx_opts_init(&opts);
  opts.compiler.template_dir = TEMPLATE_DIR;
  opts.compiler.cache_dir = cache_dir;
  moejit_ctx *ctx = NULL;
  moejit_status st = moejit_ctx_create(&ctx, &opts);
  cr_assert_eq(st, MOEJIT_OK, "moejit_ctx_create: %s", moejit_last_error());
  cr_assert_not_null(ctx);
  return ctx;
}

static void spec_for_test(moejit_spec *spec) {
  cr_assert_eq(moejit_spec_load_preset(moejit_default_preset(), spec), MOEJIT_OK, "%s",
               moejit_last_error());
}

static moejit_kernel *get_kernel(moejit_ctx *ctx, const moejit_spec *spec, const char *entry) {
  moejit_kernel *k = NULL;
  moejit_status st = moejit_ctx_get_kernel(ctx, spec, FAMILY, entry, &k);
  cr_assert_eq(st, MOEJIT_OK, "get_kernel %s: %s", entry ? entry : "(first)", moejit_last_error());
  return k;
}

#define OK(call) cr_assert_eq((call), MOEJIT_OK, "%s: %s", #call, moejit_last_error())

/* ------------------------------------------------------------------------ */

Test(runtime_gpu, ctx_reports_the_device) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_device_info a, b;
  OK(moejit_ctx_device_info(ctx, &a));
  OK(moejit_device_query(a.ordinal, &b));
  cr_expect_str_eq(a.name, b.name);
  cr_expect_gt(a.sm_count, 0);
  cr_expect_gt(a.total_mem, 0);
  cr_expect_geq(a.smem_per_block_optin, 48 * 1024);
  cr_expect_gt(a.l2_bytes, 0);
  if (a.cc_major == 9 && a.cc_minor == 0) cr_expect_str_eq(a.arch, "sm_90a");
  int version = 0;
  OK(moejit_driver_version(&version));
  cr_expect_geq(version, 12000);
  size_t free_b = 0, total_b = 0;
  OK(moejit_mem_get_info(ctx, &free_b, &total_b));
  cr_expect_gt(free_b, 0);
  cr_expect_leq(free_b, total_b);
  cr_expect_not_null(moejit_ctx_compiler(ctx));
  moejit_ctx_destroy(ctx);
}

/* The driver table resolves cuCtxResetPersistingL2Cache (every driver of
 * CUDA 11.0 or later has it: `moejit run`'s L2 flush relies on it), and the
 * ctx works on after it. */
Test(runtime_gpu, persisting_l2_lines_can_be_demoted) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  OK(moejit_ctx_reset_persisting_l2(ctx));
  OK(moejit_ctx_synchronize(ctx));
  OK(moejit_ctx_reset_persisting_l2(ctx));
  size_t free_b = 0, total_b = 0;
  OK(moejit_mem_get_info(ctx, &free_b, &total_b));
  cr_expect_gt(free_b, 0);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, a_bad_ordinal_is_refused) {
  require_gpu();
  int n = 0;
  OK(moejit_device_count(&n));
  moejit_ctx_opts opts;
  moejit_ctx_opts_init(&opts);
  opts.device = n;
  moejit_ctx *ctx = NULL;
  cr_expect_eq(moejit_ctx_create(&ctx, &opts), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_null(ctx);
  cr_expect(strstr(moejit_last_error(), "does not exist") != NULL, "%s", moejit_last_error());
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */

static void round_trip(moejit_ctx *ctx, ts_rng *rng, size_t bytes, int pinned,
                       moejit_stream stream) {
  unsigned char *src, *dst;
  if (pinned) {
    OK(moejit_host_alloc(ctx, bytes, (void **)&src));
    OK(moejit_host_alloc(ctx, bytes, (void **)&dst));
  } else {
    src = malloc(bytes);
    dst = malloc(bytes);
    cr_assert(src && dst);
  }
  for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)ts_next(rng);
  memset(dst, 0, bytes);
  void *d1, *d2;
  OK(moejit_mem_alloc(ctx, bytes, stream, &d1));
  OK(moejit_mem_alloc(ctx, bytes, stream, &d2));
  OK(moejit_memcpy_htod(ctx, d1, src, bytes, stream));
  OK(moejit_memcpy_dtod(ctx, d2, d1, bytes, stream));
  OK(moejit_memcpy_dtoh(ctx, dst, d2, bytes, stream));
  OK(moejit_stream_synchronize(ctx, stream));
  size_t bad = 0;
  for (size_t i = 0; i < bytes; i++) bad += src[i] != dst[i];
  cr_expect_eq(bad, 0, "%zu of %zu bytes differ (pinned %d)", bad, bytes, pinned);
  OK(moejit_mem_free(ctx, d1, stream));
  OK(moejit_mem_free(ctx, d2, stream));
  OK(moejit_stream_synchronize(ctx, stream));
  if (pinned) {
    OK(moejit_host_free(ctx, src));
    OK(moejit_host_free(ctx, dst));
  } else {
    free(src);
    free(dst);
  }
}

Test(runtime_gpu, buffers_round_trip) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  ts_rng rng = ts_rng_fresh("round trip");
  moejit_stream s;
  OK(moejit_stream_create(ctx, &s));
  const size_t sizes[] = {1, 3, 4096, 65537, (1u << 20) + 7, 48u << 20};
  for (size_t i = 0; i < MJ_ARRAY_LEN(sizes); i++) {
    round_trip(ctx, &rng, sizes[i], 0, NULL);
    round_trip(ctx, &rng, sizes[i], 1, s);
  }
  OK(moejit_stream_destroy(ctx, s));
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, memset_d32_fills_words) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  ts_rng rng = ts_rng_fresh("memset");
  size_t count = 100000 + (size_t)(ts_next(&rng) % 1000);
  uint32_t value = (uint32_t)ts_next(&rng);
  uint32_t *host = malloc(count * 4);
  cr_assert_not_null(host);
  void *d;
  OK(moejit_mem_alloc(ctx, count * 4, NULL, &d));
  OK(moejit_memset_d32(ctx, d, value, count, NULL));
  OK(moejit_memcpy_dtoh(ctx, host, d, count * 4, NULL));
  OK(moejit_stream_synchronize(ctx, NULL));
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += host[i] != value;
  cr_expect_eq(bad, 0);
  OK(moejit_mem_free(ctx, d, NULL));
  free(host);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, copies_to_host_memory_as_device_are_invalid_arguments) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  int host[4] = {0};
  moejit_status st = moejit_memcpy_dtod(ctx, host, host, sizeof host, NULL);
  /* The driver may accept host memory with unified addressing; when it
   * refuses, the message must say which pointer is wrong. */
  if (st != MOEJIT_OK) {
    cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT, "%s", moejit_last_error());
    cr_expect(strstr(moejit_last_error(), "not device memory") != NULL, "%s", moejit_last_error());
  }
  OK(moejit_ctx_synchronize(ctx));
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, stream_ordered_alloc_and_free) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_device_info info;
  OK(moejit_ctx_device_info(ctx, &info));
  cr_log_info("memory pools: %d", info.memory_pools);
  moejit_stream s;
  OK(moejit_stream_create(ctx, &s));
  ts_rng rng = ts_rng_fresh("stream ordered");
  uint32_t expect = 0, got = 0;
  for (int i = 0; i < 200; i++) {
    size_t count = 1 + (size_t)(ts_next(&rng) % (1u << 20));
    void *d;
    OK(moejit_mem_alloc(ctx, count * 4, s, &d));
    expect = (uint32_t)ts_next(&rng);
    OK(moejit_memset_d32(ctx, d, expect, count, s));
    OK(moejit_memcpy_dtoh(ctx, &got, (char *)d + (count - 1) * 4, 4, s));
    OK(moejit_mem_free(ctx, d, s)); /* ordered after the copy on s */
    OK(moejit_stream_synchronize(ctx, s));
    cr_assert_eq(got, expect, "iteration %d", i);
  }
  OK(moejit_stream_destroy(ctx, s));
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, events_time_work) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_stream s;
  moejit_event a, b;
  OK(moejit_stream_create(ctx, &s));
  OK(moejit_event_create(ctx, &a));
  OK(moejit_event_create(ctx, &b));
  void *d;
  size_t bytes = 256u << 20;
  OK(moejit_mem_alloc(ctx, bytes, s, &d));
  OK(moejit_event_record(ctx, a, s));
  OK(moejit_memset_d32(ctx, d, 0x12345678u, bytes / 4, s));
  OK(moejit_event_record(ctx, b, s));
  OK(moejit_event_synchronize(ctx, b));
  float ms = -1;
  OK(moejit_event_elapsed_ms(ctx, a, b, &ms));
  cr_expect_gt(ms, 0.0f, "a 256 MiB memset takes measurable time");
  cr_expect_lt(ms, 1000.0f);
  OK(moejit_mem_free(ctx, d, s));
  OK(moejit_stream_synchronize(ctx, s));
  OK(moejit_event_destroy(ctx, a));
  OK(moejit_event_destroy(ctx, b));
  OK(moejit_stream_destroy(ctx, s));
  moejit_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                  */

typedef struct affine_run {
  unsigned n, mul, add;
  unsigned *x, *y; /* host */
  void *dx, *dy;   /* device */
} affine_run;

static void affine_setup(moejit_ctx *ctx, ts_rng *rng, unsigned n, affine_run *r) {
  r->n = n;
  r->mul = (unsigned)ts_next(rng);
  r->add = (unsigned)ts_next(rng);
  r->x = malloc(n * sizeof *r->x);
  r->y = malloc(n * sizeof *r->y);
  cr_assert(r->x && r->y);
  for (unsigned i = 0; i < n; i++) r->x[i] = (unsigned)ts_next(rng);
  OK(moejit_mem_alloc(ctx, n * sizeof(unsigned), NULL, &r->dx));
  OK(moejit_mem_alloc(ctx, n * sizeof(unsigned), NULL, &r->dy));
  OK(moejit_memcpy_htod(ctx, r->dx, r->x, n * sizeof(unsigned), NULL));
  OK(moejit_memset_d32(ctx, r->dy, 0xdeadbeefu, n, NULL));
}

static moejit_status affine_launch(moejit_ctx *ctx, moejit_kernel *k, affine_run *r,
                                   moejit_stream s) {
  void *args[] = {&r->dx, &r->dy, &r->n, &r->mul, &r->add};
  unsigned block[3] = {256, 1, 1}, grid[3] = {(r->n + 255) / 256, 1, 1};
  return moejit_kernel_launch(ctx, k, grid, block, 0, s, args);
}

/* Number of wrong elements of y against the exact host result. */
static size_t affine_check(moejit_ctx *ctx, affine_run *r, unsigned top_k) {
  OK(moejit_memcpy_dtoh(ctx, r->y, r->dy, r->n * sizeof(unsigned), NULL));
  OK(moejit_stream_synchronize(ctx, NULL));
  size_t bad = 0;
  for (unsigned i = 0; i < r->n; i++) bad += r->y[i] != r->x[i] * r->mul + r->add + top_k;
  return bad;
}

static void affine_free(moejit_ctx *ctx, affine_run *r) {
  OK(moejit_mem_free(ctx, r->dx, NULL));
  OK(moejit_mem_free(ctx, r->dy, NULL));
  free(r->x);
  free(r->y);
}

Test(runtime_gpu, nvrtc_cache_load_launch_gives_the_exact_answer) {
  require_gpu();
  char *dir = ts_mkdtemp("rt-gpu-cache");
  moejit_spec spec;
  spec_for_test(&spec);
  ts_rng rng = ts_rng_fresh("affine");
  /* First ctx: NVRTC compiles, the cubin lands in the empty cache. */
  moejit_ctx *ctx = make_ctx(dir);
  moejit_kernel *k = get_kernel(ctx, &spec, "mj_rt_affine");
  cr_expect_eq(ts_count_files(dir, ".mjc"), 1, "one cache entry after compiling");
  moejit_kernel_info ki;
  OK(moejit_kernel_get_info(k, &ki));
  cr_expect_str_eq(ki.entry, "mj_rt_affine");
  cr_expect_eq(ki.num_params == -1 || ki.num_params == 5, 1, "num_params %d", ki.num_params);
  affine_run r;
  affine_setup(ctx, &rng, 1000003, &r);
  OK(affine_launch(ctx, k, &r, NULL));
  cr_expect_eq(affine_check(ctx, &r, (unsigned)spec.top_k), 0);
  affine_free(ctx, &r);
  moejit_ctx_destroy(ctx);

  /* Second ctx: same kernel from the disk cache, no NVRTC. */
  ctx = make_ctx(dir);
  moejit_device_info info;
  OK(moejit_ctx_device_info(ctx, &info));
  const void *cubin;
  size_t len;
  char key[33];
  int hit = 0;
  OK(mj_compiler_get_cubin(moejit_ctx_compiler(ctx), &spec, FAMILY, info.arch, &cubin, &len, key,
                           &hit));
  cr_expect_eq(hit, 1, "the second ctx must hit the disk cache");
  cr_expect_str_eq(key, ki.key);
  k = get_kernel(ctx, &spec, NULL); /* NULL: the first entry, mj_rt_affine */
  OK(moejit_kernel_get_info(k, &ki));
  cr_expect_str_eq(ki.entry, "mj_rt_affine");
  affine_setup(ctx, &rng, 777, &r);
  OK(affine_launch(ctx, k, &r, NULL));
  cr_expect_eq(affine_check(ctx, &r, (unsigned)spec.top_k), 0);
  affine_free(ctx, &r);
  cr_expect_eq(mj_ctx_module_loads(ctx), 1);
  moejit_ctx_destroy(ctx);
  ts_rmtree(dir);
  free(dir);
}

Test(runtime_gpu, a_module_loads_once_across_many_launches) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_spec spec;
  spec_for_test(&spec);
  ts_rng rng = ts_rng_fresh("module once");
  affine_run r;
  affine_setup(ctx, &rng, 4096, &r);
  moejit_kernel *first = get_kernel(ctx, &spec, "mj_rt_affine");
  for (int i = 0; i < 100; i++) {
    moejit_kernel *k = get_kernel(ctx, &spec, "mj_rt_affine");
    cr_assert_eq(k, first, "the kernel memo hands out one handle");
    r.add = (unsigned)i;
    OK(affine_launch(ctx, k, &r, NULL));
  }
  cr_expect_eq(affine_check(ctx, &r, (unsigned)spec.top_k), 0);
  /* the internal path used by ops, and a second entry of the same module */
  CUfunction fn;
  OK(mj_ctx_get_function(ctx, &spec, FAMILY, "mj_rt_affine", &fn));
  get_kernel(ctx, &spec, "mj_rt_block_reverse");
  cr_expect_eq(mj_ctx_module_loads(ctx), 1, "loads: %lu", mj_ctx_module_loads(ctx));
  /* a different spec gives a different module */
  spec.top_k = spec.top_k > 1 ? spec.top_k - 1 : 2;
  moejit_kernel *k2 = get_kernel(ctx, &spec, "mj_rt_affine");
  cr_expect_neq(k2, first);
  cr_expect_eq(mj_ctx_module_loads(ctx), 2);
  OK(affine_launch(ctx, k2, &r, NULL));
  cr_expect_eq(affine_check(ctx, &r, (unsigned)spec.top_k), 0);
  affine_free(ctx, &r);
  moejit_ctx_destroy(ctx);
}

/* Threads racing for the same kernel on a cold cache: one module load,
 * one handle, every launch right. */
typedef struct racer {
  moejit_ctx *ctx;
  const moejit_spec *spec;
  moejit_kernel *kernel;
  uint64_t seed;
  size_t wrong;
  moejit_status status;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  r->status = moejit_ctx_get_kernel(r->ctx, r->spec, FAMILY, "mj_rt_affine", &r->kernel);
  if (r->status != MOEJIT_OK) return NULL;
  ts_rng rng = ts_rng_seeded(r->seed);
  moejit_stream s;
  affine_run run;
  if ((r->status = moejit_stream_create(r->ctx, &s)) != MOEJIT_OK) return NULL;
  run.n = 50000;
  run.mul = (unsigned)ts_next(&rng);
  run.add = (unsigned)ts_next(&rng);
  run.x = malloc(run.n * sizeof(unsigned));
  run.y = malloc(run.n * sizeof(unsigned));
  for (unsigned i = 0; i < run.n; i++) run.x[i] = (unsigned)ts_next(&rng);
  size_t bytes = run.n * sizeof(unsigned);
  moejit_status st = moejit_mem_alloc(r->ctx, bytes, s, &run.dx);
  if (!st) st = moejit_mem_alloc(r->ctx, bytes, s, &run.dy);
  if (!st) st = moejit_memcpy_htod(r->ctx, run.dx, run.x, bytes, s);
  if (!st) st = affine_launch(r->ctx, r->kernel, &run, s);
  if (!st) st = moejit_memcpy_dtoh(r->ctx, run.y, run.dy, bytes, s);
  if (!st) st = moejit_stream_synchronize(r->ctx, s);
  for (unsigned i = 0; !st && i < run.n; i++)
    r->wrong += run.y[i] != run.x[i] * run.mul + run.add + (unsigned)r->spec->top_k;
  if (!st) st = moejit_mem_free(r->ctx, run.dx, s);
  if (!st) st = moejit_mem_free(r->ctx, run.dy, s);
  if (!st) st = moejit_stream_synchronize(r->ctx, s);
  moejit_stream_destroy(r->ctx, s);
  free(run.x);
  free(run.y);
  r->status = st;
  return NULL;
}

Test(runtime_gpu, threads_share_one_module) {
  require_gpu();
  char *dir = ts_mkdtemp("rt-gpu-threads");
  moejit_ctx *ctx = make_ctx(dir);
  moejit_spec spec;
  spec_for_test(&spec);
  ts_rng rng = ts_rng_fresh("threads");
  enum { N = 8 };
  racer r[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    r[i] = (racer){.ctx = ctx, .spec = &spec, .seed = ts_next(&rng)};
    cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) {
    cr_expect_eq(r[i].status, MOEJIT_OK, "thread %d: %s", i, moejit_ctx_last_error(ctx));
    cr_expect_eq(r[i].wrong, 0, "thread %d", i);
    cr_expect_eq(r[i].kernel, r[0].kernel, "thread %d got another handle", i);
  }
  cr_expect_eq(mj_ctx_module_loads(ctx), 1);
  moejit_ctx_destroy(ctx);
  ts_rmtree(dir);
  free(dir);
}

Test(runtime_gpu, unknown_entries_and_families_are_not_found) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_spec spec;
  spec_for_test(&spec);
  moejit_kernel *k = NULL;
  cr_expect_eq(moejit_ctx_get_kernel(ctx, &spec, FAMILY, "no_such_entry", &k),
               MOEJIT_ERR_NOT_FOUND);
  cr_expect_null(k);
  cr_expect(strstr(moejit_ctx_last_error(ctx), "no_such_entry") != NULL, "%s",
            moejit_ctx_last_error(ctx));
  cr_expect_eq(moejit_ctx_get_kernel(ctx, &spec, "no_such_family", NULL, &k), MOEJIT_ERR_NOT_FOUND);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, large_dynamic_shared_memory_is_opted_in) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_spec spec;
  spec_for_test(&spec);
  moejit_kernel *k = get_kernel(ctx, &spec, "mj_rt_block_reverse");
  moejit_kernel_info ki;
  OK(moejit_kernel_get_info(k, &ki));
  /* As many words per block as the opt-in allows (over 48 KiB on sm_70+). */
  unsigned per_block = (unsigned)ki.max_dynamic_smem_bytes / 4;
  cr_assert_gt(per_block * 4, 48u * 1024, "this GPU cannot opt in above 48 KiB");
  unsigned blocks = 7, n = per_block * blocks;
  ts_rng rng = ts_rng_fresh("block reverse");
  unsigned *x = malloc(n * 4u), *y = malloc(n * 4u);
  cr_assert(x && y);
  for (unsigned i = 0; i < n; i++) x[i] = (unsigned)ts_next(&rng);
  void *dx, *dy;
  OK(moejit_mem_alloc(ctx, n * 4u, NULL, &dx));
  OK(moejit_mem_alloc(ctx, n * 4u, NULL, &dy));
  OK(moejit_memcpy_htod(ctx, dx, x, n * 4u, NULL));
  void *args[] = {&dx, &dy, &per_block};
  unsigned grid[3] = {blocks, 1, 1}, block[3] = {512, 1, 1};
  OK(moejit_kernel_launch(ctx, k, grid, block, per_block * 4, NULL, args));
  OK(moejit_memcpy_dtoh(ctx, y, dy, n * 4u, NULL));
  OK(moejit_ctx_synchronize(ctx));
  size_t bad = 0;
  for (unsigned b = 0; b < blocks; b++)
    for (unsigned i = 0; i < per_block; i++)
      bad += y[b * per_block + i] != x[b * per_block + per_block - 1 - i];
  cr_expect_eq(bad, 0, "%zu wrong of %u", bad, n);
  /* One byte more than the kernel can have: refused, with both numbers. */
  moejit_status st = moejit_kernel_launch(ctx, k, grid, block, per_block * 4 + 4, NULL, args);
  cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT);
  char want[64];
  snprintf(want, sizeof want, "%u bytes", per_block * 4 + 4);
  cr_expect(strstr(moejit_last_error(), want) != NULL, "%s", moejit_last_error());
  snprintf(want, sizeof want, "%d", ki.max_dynamic_smem_bytes);
  cr_expect(strstr(moejit_last_error(), want) != NULL, "%s", moejit_last_error());
  OK(moejit_mem_free(ctx, dx, NULL));
  OK(moejit_mem_free(ctx, dy, NULL));
  free(x);
  free(y);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, bad_launch_arguments_are_refused_and_nothing_runs) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_spec spec;
  spec_for_test(&spec);
  moejit_kernel *k = get_kernel(ctx, &spec, "mj_rt_affine");
  ts_rng rng = ts_rng_fresh("bad launch");
  affine_run r;
  affine_setup(ctx, &rng, 1024, &r); /* y = 0xdeadbeef everywhere */
  void *args[] = {&r.dx, &r.dy, &r.n, &r.mul, &r.add};
  unsigned grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
  unsigned zero[3] = {0, 1, 1}, huge_block[3] = {2048, 1, 1}, huge_grid[3] = {4, 70000, 1};
  moejit_device_info info;
  OK(moejit_ctx_device_info(ctx, &info));
  struct {
    const unsigned *grid, *block;
    unsigned smem;
    void **args;
    const char *needle;
  } cases[] = {
      {zero, block, 0, args, "grid.x = 0"},
      {grid, zero, 0, args, "block.x = 0"},
      {grid, huge_block, 0, args, "block.x = 2048"},
      {huge_grid, block, 0, args, "grid.y = 70000"},
      {grid, block, (unsigned)info.smem_per_block_optin + 1, args, "dynamic shared memory"},
      {grid, block, 0, NULL, "args is NULL"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    moejit_status st = moejit_kernel_launch(ctx, k, cases[i].grid, cases[i].block, cases[i].smem,
                                            NULL, cases[i].args);
    cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT, "case %zu: %s", i, moejit_last_error());
    cr_expect(strstr(moejit_last_error(), cases[i].needle) != NULL, "case %zu: %s", i,
              moejit_last_error());
    cr_expect_str_eq(moejit_ctx_last_error(ctx), moejit_last_error());
  }
  void *null_arg[] = {&r.dx, NULL, &r.n, &r.mul, &r.add};
  moejit_kernel_info ki;
  OK(moejit_kernel_get_info(k, &ki));
  if (ki.num_params == 5) {
    cr_expect_eq(moejit_kernel_launch(ctx, k, grid, block, 0, NULL, null_arg),
                 MOEJIT_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(moejit_last_error(), "args[1] is NULL") != NULL, "%s", moejit_last_error());
  }
  /* The internal launch path checks the same way. */
  CUfunction fn;
  OK(mj_ctx_get_function(ctx, &spec, FAMILY, "mj_rt_affine", &fn));
  cr_expect_eq(mj_ctx_launch(ctx, fn, grid, huge_block, 0, NULL, args),
               MOEJIT_ERR_INVALID_ARGUMENT);
  /* Nothing ran: y still holds the fill pattern. */
  OK(moejit_memcpy_dtoh(ctx, r.y, r.dy, r.n * sizeof(unsigned), NULL));
  OK(moejit_ctx_synchronize(ctx));
  size_t touched = 0;
  for (unsigned i = 0; i < r.n; i++) touched += r.y[i] != 0xdeadbeefu;
  cr_expect_eq(touched, 0, "a refused launch wrote %zu elements", touched);
  affine_free(ctx, &r);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, a_callers_stream_is_accepted) {
  require_gpu();
  moejit_ctx *ctx = make_ctx(NULL);
  moejit_spec spec;
  spec_for_test(&spec);
  moejit_kernel *k = get_kernel(ctx, &spec, "mj_rt_affine");
  moejit_stream s;
  OK(moejit_stream_create(ctx, &s));
  ts_rng rng = ts_rng_fresh("stream launch");
  affine_run r;
  affine_setup(ctx, &rng, 100000, &r);
  OK(moejit_stream_synchronize(ctx, NULL)); /* setup ran on the default stream */
  OK(affine_launch(ctx, k, &r, s));
  OK(moejit_stream_synchronize(ctx, s));
  cr_expect_eq(affine_check(ctx, &r, (unsigned)spec.top_k), 0);
  affine_free(ctx, &r);
  OK(moejit_stream_destroy(ctx, s));
  moejit_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------ */
/* Leaks                                                                    */

static void one_cycle(const char *dir, const moejit_spec *spec, ts_rng *rng) {
  moejit_ctx *ctx = make_ctx(dir);
  moejit_kernel *k = get_kernel(ctx, spec, "mj_rt_affine");
  affine_run r;
  affine_setup(ctx, rng, 1000 + (unsigned)(ts_next(rng) % 5000), &r);
  OK(affine_launch(ctx, k, &r, NULL));
  cr_assert_eq(affine_check(ctx, &r, (unsigned)spec->top_k), 0);
  affine_free(ctx, &r);
  moejit_ctx_destroy(ctx);
}

Test(runtime_gpu, create_launch_destroy_cycles_leak_no_device_memory, .timeout = 600) {
  require_gpu();
  int cycles = 1000;
  const char *env = getenv("MOEJIT_TEST_RUNTIME_CYCLES"); /* fewer under compute-sanitizer */
  if (env && atoi(env) > 0) cycles = atoi(env);
  char *dir = ts_mkdtemp("rt-gpu-leak");
  moejit_spec spec;
  spec_for_test(&spec);
  ts_rng rng = ts_rng_fresh("leak cycles");
  /* The outer ctx keeps the primary context alive, so the cycles measure
   * what each ctx leaves behind rather than a context teardown (which
   * would free everything and hide a leak). */
  moejit_ctx *outer = make_ctx(dir);
  for (int i = 0; i < 3; i++) one_cycle(dir, &spec, &rng); /* warm the cache and the driver */
  OK(moejit_ctx_synchronize(outer));
  size_t before = 0, after = 0, total = 0;
  OK(moejit_mem_get_info(outer, &before, &total));
  double t0 = mj_now_ms();
  for (int i = 0; i < cycles; i++) one_cycle(dir, &spec, &rng);
  OK(moejit_ctx_synchronize(outer));
  OK(moejit_mem_get_info(outer, &after, &total));
  cr_log_info(
      "%d cycles in %.0f ms; free device memory before %zu, after %zu (delta %lld "
      "bytes, tolerance 0)",
      cycles, mj_now_ms() - t0, before, after, (long long)after - (long long)before);
  fprintf(stderr, "leak check: %d cycles, free before %zu after %zu, delta %lld bytes\n", cycles,
          before, after, (long long)after - (long long)before);
  cr_expect_eq(after, before,
               "device memory leaked: %lld bytes over %d cycles (the free memory is the "
               "device's: run this alone, --jobs=1 as ctest does, with no other GPU work; a "
               "negative leak means someone else freed memory meanwhile)",
               (long long)before - (long long)after, cycles);
  moejit_ctx_destroy(outer);
  ts_rmtree(dir);
  free(dir);
}
