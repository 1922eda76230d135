/* The GPU runtime without a GPU: with MOEJIT_LIBCUDA_PATH pointing nowhere
 * every runtime call fails cleanly with NO_DRIVER and a helpful message,
 * compiling still works, arguments are checked before the driver is
 * needed, every status has a name, and `moejit info` says "no GPU".
 *
 * Criterion runs each test in its own forked process and nothing loads the
 * driver before the fork, so each test gets a fresh once-per-process load
 * (the test driver_load_is_per_process checks exactly that). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compile/compile.h"
#include "moejit/moejit.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"
#include "test_support.h"

#define NO_LIBCUDA "/nonexistent/libcuda.so.1"

static void no_driver(void) {
  setenv("MOEJIT_LIBCUDA_PATH", NO_LIBCUDA, 1);
}

TestSuite(runtime_nodriver, .init = no_driver);

static void expect_no_driver_message(const char *msg, const char *path) {
  cr_expect(strstr(msg, "no CUDA driver found") != NULL, "message: %s", msg);
  cr_expect(strstr(msg, path) != NULL, "message should name %s: %s", path, msg);
  cr_expect(strstr(msg, "compile-only use") != NULL, "message: %s", msg);
  cr_expect(strstr(msg, "HINT") != NULL, "message: %s", msg);
}

Test(runtime_nodriver, ctx_create_fails_with_no_driver) {
  moejit_ctx *ctx = (moejit_ctx *)(uintptr_t)0x1; /* must be reset to NULL */
  moejit_status st = moejit_ctx_create(&ctx, NULL);
  cr_assert_eq(st, MOEJIT_ERR_NO_DRIVER, "status %d: %s", st, moejit_last_error());
  cr_expect_null(ctx);
  expect_no_driver_message(moejit_last_error(), NO_LIBCUDA);
  /* The failed load is remembered: the second call says the same. */
  mj_clear_error();
  moejit_ctx_opts opts;
  moejit_ctx_opts_init(&opts);
  opts.device = 0;
  cr_expect_eq(moejit_ctx_create(&ctx, &opts), MOEJIT_ERR_NO_DRIVER);
  expect_no_driver_message(moejit_last_error(), NO_LIBCUDA);
}

Test(runtime_nodriver, queries_fail_with_no_driver) {
  int n = 42, version = 42;
  moejit_device_info info;
  cr_expect_eq(moejit_device_count(&n), MOEJIT_ERR_NO_DRIVER);
  cr_expect_eq(n, 0, "device count must be 0 without a driver");
  expect_no_driver_message(moejit_last_error(), NO_LIBCUDA);
  cr_expect_eq(moejit_driver_version(&version), MOEJIT_ERR_NO_DRIVER);
  cr_expect_eq(version, 0);
  cr_expect_eq(moejit_device_query(0, &info), MOEJIT_ERR_NO_DRIVER);
  char reason[512];
  cr_expect_eq(ts_gpu_available(reason, sizeof reason), 0);
  cr_expect(strstr(reason, "no CUDA driver found") != NULL, "reason: %s", reason);
}

/* Two tests, two paths: if both ran in one process the once-per-process
 * load would make the second report the first's path. */
static void expect_path_reported(const char *path) {
  setenv("MOEJIT_LIBCUDA_PATH", path, 1);
  int n;
  cr_assert_eq(moejit_device_count(&n), MOEJIT_ERR_NO_DRIVER);
  expect_no_driver_message(moejit_last_error(), path);
}
Test(runtime_nodriver, driver_load_is_per_process_a) {
  expect_path_reported("/nonexistent/a/libcuda.so.1");
}
Test(runtime_nodriver, driver_load_is_per_process_b) {
  expect_path_reported("/nonexistent/b/libcuda.so.1");
}

Test(runtime_nodriver, a_library_without_cuda_symbols_is_no_driver) {
  /* libm loads fine but is not a driver: the message names the missing
   * entry point instead of crashing on a NULL pointer. */
  setenv("MOEJIT_LIBCUDA_PATH", "libm.so.6", 1);
  int n = 7;
  cr_assert_eq(moejit_device_count(&n), MOEJIT_ERR_NO_DRIVER);
  cr_expect_eq(n, 0);
  const char *msg = moejit_last_error();
  cr_expect(strstr(msg, "lacks cuInit") != NULL, "message: %s", msg);
  cr_expect(strstr(msg, "compile-only use") != NULL, "message: %s", msg);
}

/* A small spec that compiles quickly: the default preset. */
static void small_spec(moejit_spec *spec) {
  cr_assert_eq(moejit_spec_load_preset(moejit_default_preset(), spec), MOEJIT_OK, "%s",
               moejit_last_error());
}

Test(runtime_nodriver, compile_still_works_after_the_runtime_failed) {
  moejit_ctx *ctx = NULL;
  cr_assert_eq(moejit_ctx_create(&ctx, NULL), MOEJIT_ERR_NO_DRIVER);
  char *dir = ts_mkdtemp("rt-nodriver");
  moejit_compiler_opts copts;
  moejit_compiler_opts_init(&copts);
  copts.cache_dir = dir;
  copts.template_dir = MOEJIT_TEST_SOURCE_DIR "/tests/data/templates-runtime";
  moejit_compiler *c = NULL;
  cr_assert_eq(moejit_compiler_create(&c, &copts), MOEJIT_OK, "%s", moejit_last_error());
  moejit_spec spec;
  small_spec(&spec);
  const void *cubin = NULL;
  size_t len = 0;
  char key[33] = "";
  int hit = -1;
  moejit_status st = mj_compiler_get_cubin(c, &spec, "combine", "sm_90a", &cubin, &len, key, &hit);
  cr_assert_eq(st, MOEJIT_OK, "NVRTC must work without a driver: %s", moejit_last_error());
  cr_expect_gt(len, 0);
  cr_expect_eq(strlen(key), 32);
  cr_expect_eq(hit, 0);
  cr_expect_eq(ts_count_files(dir, ".mjc"), 1, "the cubin should be in the cache");
  moejit_compiler_destroy(c);
  ts_rmtree(dir);
  free(dir);
}

Test(runtime_nodriver, moejit_compile_of_a_preset_works_without_a_driver) {
  moejit_ctx *ctx = NULL;
  cr_assert_eq(moejit_ctx_create(&ctx, NULL), MOEJIT_ERR_NO_DRIVER);
  moejit_compiler_opts copts;
  moejit_compiler_opts_init(&copts);
  copts.cache_disable = 1;
  moejit_compiler *c = NULL;
  cr_assert_eq(moejit_compiler_create(&c, &copts), MOEJIT_OK, "%s", moejit_last_error());
  moejit_spec spec;
  small_spec(&spec);
  moejit_kernel_report reports[16];
  size_t n = 0;
  moejit_status st = moejit_compile(c, &spec, "sm_90a", reports, 16, &n);
  cr_expect_eq(st, MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_gt(n, 0);
  for (size_t i = 0; i < n && i < 16; i++)
    cr_expect_eq(reports[i].status, MOEJIT_OK, "%s: %s", reports[i].kernel, reports[i].message);
  moejit_compiler_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Argument checks that come before the driver                              */

static void expect_invalid(moejit_status st, const char *needle) {
  cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT, "status %d (%s), message: %s", st,
               moejit_status_str(st), moejit_last_error());
  if (needle)
    cr_expect(strstr(moejit_last_error(), needle) != NULL, "message should contain '%s': %s",
              needle, moejit_last_error());
}

Test(runtime_nodriver, null_arguments_are_refused_without_a_driver) {
  int n;
  void *p = NULL;
  float ms;
  moejit_stream s;
  moejit_event e;
  moejit_device_info info;
  moejit_kernel *k;
  moejit_kernel_info kinfo;
  unsigned dims[3] = {1, 1, 1};
  moejit_spec spec;
  moejit_spec_init(&spec);
  expect_invalid(moejit_ctx_create(NULL, NULL), "out is NULL");
  expect_invalid(moejit_device_count(NULL), "NULL");
  expect_invalid(moejit_driver_version(NULL), "NULL");
  expect_invalid(moejit_device_query(0, NULL), "NULL");
  expect_invalid(moejit_device_query(-1, &info), "-1");
  expect_invalid(moejit_ctx_device_info(NULL, &info), "ctx is NULL");
  expect_invalid(moejit_ctx_synchronize(NULL), "ctx is NULL");
  expect_invalid(moejit_ctx_reset_persisting_l2(NULL),
                 "moejit_ctx_reset_persisting_l2: ctx is NULL");
  expect_invalid(moejit_mem_alloc(NULL, 16, NULL, &p), "moejit_mem_alloc: ctx is NULL");
  expect_invalid(moejit_mem_free(NULL, &n, NULL), "moejit_mem_free");
  expect_invalid(moejit_memcpy_htod(NULL, &n, &n, 4, NULL), "moejit_memcpy_htod");
  expect_invalid(moejit_memcpy_dtoh(NULL, &n, &n, 4, NULL), "moejit_memcpy_dtoh");
  expect_invalid(moejit_memcpy_dtod(NULL, &n, &n, 4, NULL), "moejit_memcpy_dtod");
  expect_invalid(moejit_memset_d32(NULL, &n, 0, 1, NULL), "moejit_memset_d32");
  expect_invalid(moejit_host_alloc(NULL, 16, &p), "moejit_host_alloc");
  expect_invalid(moejit_host_free(NULL, &n), "moejit_host_free");
  expect_invalid(moejit_mem_get_info(NULL, NULL, NULL), "moejit_mem_get_info");
  expect_invalid(moejit_stream_create(NULL, &s), "moejit_stream_create");
  expect_invalid(moejit_stream_destroy(NULL, NULL), "moejit_stream_destroy");
  expect_invalid(moejit_stream_synchronize(NULL, NULL), "moejit_stream_synchronize");
  expect_invalid(moejit_event_create(NULL, &e), "moejit_event_create");
  expect_invalid(moejit_event_record(NULL, NULL, NULL), "moejit_event_record");
  expect_invalid(moejit_event_synchronize(NULL, NULL), "moejit_event_synchronize");
  expect_invalid(moejit_event_elapsed_ms(NULL, NULL, NULL, &ms), "moejit_event_elapsed_ms");
  expect_invalid(moejit_event_destroy(NULL, NULL), "moejit_event_destroy");
  expect_invalid(moejit_ctx_get_kernel(NULL, &spec, "combine", NULL, &k), "ctx is NULL");
  expect_invalid(moejit_kernel_launch(NULL, NULL, dims, dims, 0, NULL, NULL), "ctx is NULL");
  expect_invalid(moejit_kernel_get_info(NULL, &kinfo), "moejit_kernel_get_info");
  cr_expect_str_eq(moejit_ctx_last_error(NULL), "");
  cr_expect_null(moejit_ctx_compiler(NULL));
  moejit_ctx_destroy(NULL); /* a no-op */
  /* None of this needed the driver: a ctx still cannot be made. */
  moejit_ctx *ctx;
  cr_expect_eq(moejit_ctx_create(&ctx, NULL), MOEJIT_ERR_NO_DRIVER);
}

Test(runtime_nodriver, a_bad_device_ordinal_is_refused_before_the_driver) {
  moejit_ctx_opts opts;
  moejit_ctx_opts_init(&opts);
  cr_expect_eq(opts.device, -1, "the default is the first device");
  moejit_compiler_opts copts;
  moejit_compiler_opts_init(&copts);
  cr_expect_eq(opts.compiler.lineinfo, copts.lineinfo,
               "compiler defaults come from moejit_compiler_opts_init");
  opts.device = -7;
  moejit_ctx *ctx = NULL;
  expect_invalid(moejit_ctx_create(&ctx, &opts), "-7");
  cr_expect_null(ctx);
}

/* A ctx with H100-like limits and no driver behind it: enough to run the
 * checks that come before any driver call (a valid request would reach
 * the driver table, which is empty, so only invalid ones are tried). */
typedef struct fake {
  moejit_ctx ctx;
  mj_module module;
  mj_function function;
  moejit_kernel kernel;
} fake;

static fake *fake_ctx(void) {
  fake *f = calloc(1, sizeof *f);
  cr_assert_not_null(f);
  moejit_ctx *ctx = &f->ctx;
  cr_assert_eq(pthread_mutex_init(&ctx->lock, NULL), 0);
  cr_assert_eq(pthread_mutex_init(&ctx->error_lock, NULL), 0);
  mj_device_limits *l = &ctx->limits;
  l->cc_major = 9;
  l->max_threads_per_block = 1024;
  l->smem_per_block_optin = 232448;
  l->max_grid[0] = 2147483647u, l->max_grid[1] = 65535, l->max_grid[2] = 65535;
  l->max_block[0] = 1024, l->max_block[1] = 1024, l->max_block[2] = 64;
  ctx->info.smem_per_block_optin = l->smem_per_block_optin;
  mj_arch_for_cc(9, 0, ctx->info.arch);
  snprintf(f->module.key, sizeof f->module.key, "%032x", 7);
  snprintf(f->function.entry, sizeof f->function.entry, "fake_entry");
  f->function.fn = (CUfunction)(uintptr_t)0x1000; /* never called */
  f->function.max_threads_per_block = 256;        /* as if registers limited it */
  f->function.static_smem = 4096;
  f->function.num_params = 3;
  f->kernel.module = &f->module;
  f->kernel.function = &f->function;
  f->kernel.ctx = ctx;
  return f;
}

static void fake_free(fake *f) {
  pthread_mutex_destroy(&f->ctx.lock);
  pthread_mutex_destroy(&f->ctx.error_lock);
  free(f);
}

static void expect_launch_refused(fake *f, const unsigned grid[3], const unsigned block[3],
                                  unsigned smem, void **args, const char *n1, const char *n2) {
  mj_clear_error();
  moejit_status st = moejit_kernel_launch(&f->ctx, &f->kernel, grid, block, smem, NULL, args);
  expect_invalid(st, n1);
  if (n2) expect_invalid(st, n2);
  cr_expect_str_eq(moejit_ctx_last_error(&f->ctx), moejit_last_error(),
                   "the ctx keeps the last message");
}

Test(runtime_nodriver, launch_shapes_are_checked_before_launching) {
  fake *f = fake_ctx();
  ts_rng rng = ts_rng_fresh("launch shapes");
  unsigned ok_grid[3] = {1 + (unsigned)(ts_next(&rng) % 1000), 1, 1};
  unsigned ok_block[3] = {128, 1, 1};
  int a = 0, b = 0, c = 0;
  void *args[3] = {&a, &b, &c};
  unsigned zero_grid[3] = {ok_grid[0], 0, 1};
  expect_launch_refused(f, zero_grid, ok_block, 0, args, "grid.y = 0", "1..65535");
  unsigned big_grid[3] = {1, 1, 65536 + (unsigned)(ts_next(&rng) % 1000)};
  expect_launch_refused(f, big_grid, ok_block, 0, args, "grid.z", "1..65535");
  unsigned big_block_z[3] = {1, 1, 65};
  expect_launch_refused(f, ok_grid, big_block_z, 0, args, "block.z = 65", "1..64");
  unsigned too_many[3] = {32, 16, 1}; /* 512 > the kernel's 256 */
  expect_launch_refused(f, ok_grid, too_many, 0, args, "512 threads", "256");
  f->function.max_threads_per_block = 0; /* unknown: the device limit applies */
  unsigned over_device[3] = {1024, 2, 1};
  expect_launch_refused(f, ok_grid, over_device, 0, args, "2048 threads", "1024");
  fake_free(f);
}

Test(runtime_nodriver, launch_smem_and_args_are_checked_before_launching) {
  fake *f = fake_ctx();
  unsigned grid[3] = {4, 1, 1}, block[3] = {128, 1, 1};
  int a = 0, b = 0, c = 0;
  void *args[3] = {&a, &b, &c};
  unsigned max = 232448 - 4096;
  /* one byte over: the message gives the request and the limit */
  expect_launch_refused(f, grid, block, max + 1, args, "228353", "228352");
  expect_launch_refused(f, grid, block, 0, NULL, "args is NULL", NULL);
  args[1] = NULL;
  expect_launch_refused(f, grid, block, 0, args, "args[1] is NULL", "3 parameters");
  expect_invalid(moejit_kernel_launch(&f->ctx, &f->kernel, NULL, block, 0, NULL, args),
                 "grid and block are required");
  expect_invalid(moejit_kernel_launch(&f->ctx, NULL, grid, block, 0, NULL, args), "kernel is NULL");
  fake *other = fake_ctx();
  args[1] = &b;
  expect_invalid(moejit_kernel_launch(&other->ctx, &f->kernel, grid, block, 0, NULL, args),
                 "another ctx");
  fake_free(other);
  fake_free(f);
}

Test(runtime_nodriver, memory_arguments_are_checked_before_the_driver) {
  fake *f = fake_ctx();
  moejit_ctx *ctx = &f->ctx;
  void *p = (void *)(uintptr_t)0x1;
  int host = 0;
  expect_invalid(moejit_mem_alloc(ctx, 0, NULL, &p), "bytes is 0");
  cr_expect_null(p, "*dptr is reset on failure");
  expect_invalid(moejit_mem_alloc(ctx, 64, NULL, NULL), "dptr is NULL");
  expect_invalid(moejit_mem_free(ctx, NULL, NULL), "dptr is NULL");
  expect_invalid(moejit_memcpy_htod(ctx, NULL, &host, 4, NULL), "dst is NULL");
  expect_invalid(moejit_memcpy_htod(ctx, &host, NULL, 4, NULL), "src is NULL");
  expect_invalid(moejit_memcpy_dtoh(ctx, &host, NULL, 0, NULL), "src is NULL");
  expect_invalid(moejit_memcpy_dtod(ctx, NULL, &host, 4, NULL), "dst is NULL");
  expect_invalid(moejit_memset_d32(ctx, NULL, 0, 4, NULL), "dst is NULL");
  expect_invalid(moejit_memset_d32(ctx, (char *)&host + 1, 0, 4, NULL), "4-byte aligned");
  expect_invalid(moejit_host_alloc(ctx, 0, &p), "bytes is 0");
  expect_invalid(moejit_host_alloc(ctx, 8, NULL), "host is NULL");
  expect_invalid(moejit_stream_create(ctx, NULL), "stream is NULL");
  expect_invalid(moejit_event_create(ctx, NULL), "event is NULL");
  expect_invalid(moejit_event_elapsed_ms(ctx, NULL, NULL, NULL), "start is NULL");
  expect_invalid(moejit_ctx_device_info(ctx, NULL), "info is NULL");
  /* 0-byte copies and memsets of valid pointers are no-ops that need no driver */
  cr_expect_eq(moejit_memcpy_htod(ctx, &host, &host, 0, NULL), MOEJIT_OK);
  cr_expect_eq(moejit_memset_d32(ctx, &host, 0, 0, NULL), MOEJIT_OK);
  cr_expect_eq(moejit_host_free(ctx, NULL), MOEJIT_OK);
  cr_expect_eq(moejit_stream_destroy(ctx, NULL), MOEJIT_OK);
  cr_expect_eq(moejit_event_destroy(ctx, NULL), MOEJIT_OK);
  cr_expect(strstr(moejit_ctx_last_error(ctx), "moejit_ctx_device_info") != NULL,
            "last ctx error: %s", moejit_ctx_last_error(ctx));
  fake_free(f);
}

Test(runtime_nodriver, kernel_info_describes_a_handle) {
  fake *f = fake_ctx();
  snprintf(f->kernel.family, sizeof f->kernel.family, "combine");
  moejit_kernel_info info;
  cr_assert_eq(moejit_kernel_get_info(&f->kernel, &info), MOEJIT_OK);
  cr_expect_str_eq(info.family, "combine");
  cr_expect_str_eq(info.entry, "fake_entry");
  cr_expect_str_eq(info.arch, "sm_90a");
  cr_expect_eq(info.static_smem_bytes, 4096);
  cr_expect_eq(info.max_dynamic_smem_bytes, 232448 - 4096);
  cr_expect_eq(info.num_params, 3);
  cr_expect_eq(strlen(info.key), 32);
  fake_free(f);
}

/* ------------------------------------------------------------------------ */
/* Names: statuses, archs, CUDA errors                                      */

Test(runtime_nodriver, every_status_has_a_distinct_name) {
  for (int i = 0; i < MOEJIT_STATUS_COUNT; i++) {
    const char *s = moejit_status_str((moejit_status)i);
    cr_assert_not_null(s);
    cr_expect_gt(strlen(s), 0);
    cr_expect_str_neq(s, "unknown status", "status %d has no name", i);
    for (int j = 0; j < i; j++)
      cr_expect_str_neq(s, moejit_status_str((moejit_status)j), "statuses %d and %d", i, j);
  }
  cr_expect_str_eq(moejit_status_str((moejit_status)MOEJIT_STATUS_COUNT), "unknown status");
  cr_expect_str_eq(moejit_status_str((moejit_status)-1), "unknown status");
  cr_expect_str_eq(moejit_status_str((moejit_status)1000), "unknown status");
  cr_expect_str_eq(moejit_status_str(MOEJIT_ERR_NO_DRIVER), "no CUDA driver");
  cr_expect_str_eq(moejit_status_str(MOEJIT_ERR_NO_DEVICE), "no CUDA device");
}

Test(runtime_nodriver, arch_follows_compute_capability) {
  static const struct {
    int major, minor;
    const char *arch;
  } cases[] = {{9, 0, "sm_90a"}, {10, 0, "sm_100a"}, {8, 0, "sm_80"}, {8, 9, "sm_89"},
               {8, 6, "sm_86"},  {12, 0, "sm_120"},  {7, 5, "sm_75"}, {10, 3, "sm_103"}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(cases); i++) {
    char arch[MOEJIT_ARCH_MAX];
    mj_arch_for_cc(cases[i].major, cases[i].minor, arch);
    cr_expect_str_eq(arch, cases[i].arch, "cc %d.%d", cases[i].major, cases[i].minor);
  }
}

Test(runtime_nodriver, cuda_success_is_ok_and_errors_without_a_driver_still_say_something) {
  mj_clear_error();
  cr_expect_eq(mj_cu_check(CUDA_SUCCESS, "cuNothing"), MOEJIT_OK);
  cr_expect_str_eq(moejit_last_error(), "");
  /* No driver loaded: no names, but the call and the number are there. */
  cr_expect_eq(mj_cu_check(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData"), MOEJIT_ERR_CUDA);
  cr_expect(strstr(moejit_last_error(), "cuModuleLoadData: CUDA error 200") != NULL, "%s",
            moejit_last_error());
  cr_expect_eq(mj_cu_check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc"), MOEJIT_ERR_OUT_OF_MEMORY);
  cr_expect(strstr(moejit_last_error(), "HINT") != NULL, "%s", moejit_last_error());
}

/* ------------------------------------------------------------------------ */
/* `moejit info` without a driver                                           */

static const char *const no_driver_env[] = {"MOEJIT_LIBCUDA_PATH=" NO_LIBCUDA, NULL};

Test(runtime_nodriver, info_without_a_driver_says_no_gpu_and_exits_0) {
  const char *args[] = {"info", NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, no_driver_env, &out, &err);
  cr_expect_eq(rc, 0, "exit %d\nstdout: %s\nstderr: %s", rc, out, err);
  cr_expect(strstr(out, "no GPU: no CUDA driver found") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, "compile-only use") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, "NVRTC") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, "cache:") != NULL, "stdout: %s", out);
  cr_expect(strstr(out, moejit_version_string()) != NULL, "stdout: %s", out);
  free(out);
  free(err);
}

Test(runtime_nodriver, info_json_without_a_driver_is_one_valid_object) {
  const char *args[] = {"info", "--json", NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, no_driver_env, &out, &err);
  cr_expect_eq(rc, 0, "exit %d, stderr: %s", rc, err);
  cr_expect(ts_json_valid(out), "not valid JSON: %s", out);
  cr_expect(strstr(out, "\"gpu\":false") != NULL, "%s", out);
  cr_expect(strstr(out, "\"driver\":null") != NULL, "%s", out);
  cr_expect(strstr(out, "\"devices\":[]") != NULL, "%s", out);
  cr_expect(strstr(out, NO_LIBCUDA) != NULL, "the reason names the path: %s", out);
  cr_expect(strstr(out, "\"archs\":[\"sm_") != NULL, "%s", out);
  free(out);
  free(err);
}

/* info names the NCCL it finds (expert parallelism's), or why there is
 * none, in text and JSON */
Test(runtime_nodriver, info_reports_nccl) {
  static const char *const with_nccl[] = {"MOEJIT_LIBCUDA_PATH=" NO_LIBCUDA,
                                          "MOEJIT_NCCL_LIBRARY=" MOEJIT_FAKE_NCCL_PATH,
                                          "FAKE_NCCL_VERSION=22105", NULL};
  static const char *const none[] = {"MOEJIT_LIBCUDA_PATH=" NO_LIBCUDA,
                                     "MOEJIT_NCCL_LIBRARY=/nonexistent/libnccl.so.2", NULL};
  const char *text[] = {"info", NULL}, *json[] = {"info", "--json", NULL};
  char *out = NULL, *err = NULL;
  cr_expect_eq(ts_run_cli(text, with_nccl, &out, &err), 0, "%s", err);
  cr_expect(strstr(out, "NCCL 2.21.5 (expert parallelism; nonblocking communicators: yes)"), "%s",
            out);
  free(out), free(err);
  cr_expect_eq(ts_run_cli(json, with_nccl, &out, &err), 0, "%s", err);
  cr_expect(
      ts_json_valid(out) &&
          strstr(out, "\"nccl\":{\"version\":\"2.21.5\",\"nonblocking\":true,\"error\":null}"),
      "%s", out);
  free(out), free(err);
  /* older than 2.14: expert parallelism, but no nonblocking communicators */
  static const char *const old_nccl[] = {"MOEJIT_LIBCUDA_PATH=" NO_LIBCUDA,
                                         "MOEJIT_NCCL_LIBRARY=" MOEJIT_FAKE_NCCL_PATH,
                                         "FAKE_NCCL_VERSION=21305", NULL};
  cr_expect_eq(ts_run_cli(text, old_nccl, &out, &err), 0, "%s", err);
  cr_expect(strstr(out,
                   "NCCL 2.13.5 (expert parallelism; nonblocking communicators: no, they "
                   "need 2.14 or newer)"),
            "%s", out);
  free(out), free(err);
  cr_expect_eq(ts_run_cli(json, old_nccl, &out, &err), 0, "%s", err);
  cr_expect(
      ts_json_valid(out) && strstr(out, "\"nccl\":{\"version\":\"2.13.5\",\"nonblocking\":false,"),
      "%s", out);
  free(out), free(err);
  cr_expect_eq(ts_run_cli(text, none, &out, &err), 0, "%s", err);
  cr_expect(strstr(out, "NCCL: none (expert parallelism only): NCCL is not available") &&
                strstr(out, "/nonexistent/libnccl.so.2"),
            "%s", out);
  free(out), free(err);
  cr_expect_eq(ts_run_cli(json, none, &out, &err), 0, "%s", err);
  cr_expect(
      ts_json_valid(out) &&
          strstr(out, "\"nccl\":{\"version\":null,\"nonblocking\":false,\"error\":\"NCCL is not"),
      "%s", out);
  free(out), free(err);
}

Test(runtime_nodriver, info_help_and_bad_arguments) {
  const char *help[] = {"info", "--help", NULL};
  char *out = NULL, *err = NULL;
  cr_expect_eq(ts_run_cli(help, no_driver_env, &out, &err), 0);
  cr_expect(strstr(out, "usage: moejit info") != NULL, "%s", out);
  free(out);
  free(err);
  const char *bad[] = {"info", "--bogus", NULL};
  cr_expect_eq(ts_run_cli(bad, no_driver_env, &out, &err), 2);
  cr_expect(strstr(err, "--bogus") != NULL, "%s", err);
  free(out);
  free(err);
}

Test(runtime_nodriver, info_reports_the_cache_directory) {
  char *dir = ts_mkdtemp("rt-info-cache");
  char *f = ts_write_file(dir, "README", "not an entry\n");
  free(f);
  const char *args[] = {"info", "--json", "--cache-dir", dir, NULL};
  char *out = NULL, *err = NULL;
  cr_expect_eq(ts_run_cli(args, no_driver_env, &out, &err), 0, "%s", err);
  cr_expect(ts_json_valid(out), "%s", out);
  cr_expect(strstr(out, dir) != NULL, "%s", out);
  cr_expect(strstr(out, "\"entries\":0") != NULL, "%s", out);
  free(out);
  free(err);
  ts_rmtree(dir);
  free(dir);
}

/* An expert-parallel load checks opts.ep on its own before it loads NCCL:
 * a bad option is INVALID_ARGUMENT with NCCL absent too, the report is
 * zeroed, and only a good one gets as far as "NCCL is not available". */
static moejit_status ep_load(fake *f, moejit_ep_opts ep, moejit_load_report *r) {
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK);
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.ep = ep;
  opts.report = r;
  memset(r, 0xab, sizeof *r);
  moejit_model *m = (moejit_model *)(uintptr_t)1;
  moejit_status st = moejit_model_load_spec(&f->ctx, &s, &opts, &m);
  cr_expect_null(m);
  cr_expect_eq(r->n_kernels, 0, "the report is zeroed");
  return st;
}

/* A load or prebuild refused up front zeroes the report it was given:
 * a caller reading it after a failure finds no stale rows. */
Test(runtime_nodriver, a_refused_load_zeroes_its_report) {
  fake *f = fake_ctx();
  moejit_spec s;
  cr_assert_eq(moejit_spec_load_preset("qwen3-30b-a3b", &s), MOEJIT_OK);
  s.top_k = 0; /* invalid */
  moejit_load_report r;
  moejit_load_opts opts;
  moejit_load_opts_init(&opts);
  opts.report = &r;
  memset(&r, 0xab, sizeof r);
  moejit_model *m = NULL;
  cr_expect_eq(moejit_model_load_spec(&f->ctx, &s, &opts, &m), MOEJIT_ERR_CONFIG);
  cr_expect_eq(r.n_kernels, 0);
  cr_expect_eq(r.model[0], '\0');
  memset(&r, 0xab, sizeof r);
  moejit_compiler_opts co;
  moejit_compiler_opts_init(&co);
  moejit_compiler *c = NULL;
  cr_assert_eq(moejit_compiler_create(&c, &co), MOEJIT_OK, "%s", moejit_last_error());
  cr_expect_eq(moejit_model_prebuild(c, &s, "sm_90a", "Some GPU", &opts), MOEJIT_ERR_CONFIG);
  cr_expect_eq(r.n_kernels, 0);
  moejit_compiler_destroy(c);
  fake_free(f);
}

Test(runtime_nodriver, ep_options_are_checked_before_nccl) {
  setenv("MOEJIT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  fake *f = fake_ctx();
  moejit_load_report r;
  moejit_nccl_id id;
  memset(&id, 1, sizeof id);
  void *comm = (void *)(uintptr_t)0x10;
  static const struct {
    int world, rank, comm, id;
    const char *says;
  } bad[] = {
      {100, 0, 0, 1, "opts.ep.world = 100 (allowed 1..64"},
      {-3, 0, 1, 0, "opts.ep.world = -3"},
      {2, 5, 0, 1, "ep.rank = 5 is outside 0..1"},
      {2, 0, 0, 0, "neither opts.ep.nccl_comm nor opts.ep.nccl_id"},
      {2, 0, 1, 1, "both opts.ep.nccl_comm and opts.ep.nccl_id"},
      {0, 0, 1, 1, "both opts.ep.nccl_comm and opts.ep.nccl_id"},
      {2, 9, 1, 0, "ep.rank = 9 is outside 0..1"},
  };
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    moejit_ep_opts ep = {.world = bad[i].world, .rank = bad[i].rank};
    if (bad[i].comm) ep.nccl_comm = comm;
    if (bad[i].id) ep.nccl_id = &id;
    cr_expect_eq(ep_load(f, ep, &r), MOEJIT_ERR_INVALID_ARGUMENT, "case %zu: %s", i,
                 moejit_last_error());
    cr_expect(strstr(moejit_last_error(), bad[i].says), "case %zu: %s", i, moejit_last_error());
  }
  moejit_ep_opts good = {.world = 2, .rank = 1, .nccl_id = &id};
  cr_expect_eq(ep_load(f, good, &r), MOEJIT_ERR_UNSUPPORTED);
  cr_expect(strstr(moejit_last_error(), "NCCL is not available"), "%s", moejit_last_error());
  fake_free(f);
}

/* A caller's communicator larger than expert parallelism takes is named
 * as the communicator's size, not as an opts.ep.world the caller never set. */
Test(runtime_nodriver, ep_communicator_too_large_says_so) {
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_COUNT", "100", 1);
  fake *f = fake_ctx();
  moejit_load_report r;
  moejit_ep_opts ep = {.nccl_comm = (void *)(uintptr_t)0x10};
  cr_expect_eq(ep_load(f, ep, &r), MOEJIT_ERR_INVALID_ARGUMENT, "%s", moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "the communicator (opts.ep.nccl_comm) has 100 ranks"), "%s",
            moejit_last_error());
  fake_free(f);
}
