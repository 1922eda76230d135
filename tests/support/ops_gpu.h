/* Helpers for the GPU tests of the ops (tests/gpu/test_route.c, test_align.c,
 * test_combine.c): skipping without a GPU, one ctx per test process, device
 * buffers that fail the test on error, poisoning, specs shaped for a test
 * case, loading many models in parallel (NVRTC on every core), and random
 * top-k ids. All calls assert (Criterion) instead of returning errors. */
#ifndef MOEJIT_TEST_OPS_GPU_H
#define MOEJIT_TEST_OPS_GPU_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"
#include "moejit/ops.h"
#include "test_support.h"

/* Skips the calling test when moejit_device_count fails or finds none. */
#define OPS_REQUIRE_GPU()                                                                 \
  do {                                                                                    \
    char ops_why_[512];                                                                   \
    if (!ops_gpu_usable(ops_why_, sizeof ops_why_)) cr_skip_test("no GPU: %s", ops_why_); \
  } while (0)

#define OPS_OK(call) cr_assert_eq((call), MOEJIT_OK, "%s: %s", #call, moejit_last_error())

/* Poison words: 0xFFFFFFFF is -1 as an int (a legal "none" in align's
 * outputs), so int outputs get OPS_POISON_INT, which no output can equal. */
#define OPS_POISON_NAN 0xffffffffu
#define OPS_POISON_INT 0x5a5a5a5au

int ops_gpu_usable(char *why, size_t cap);
/* The process's ctx, created on first use. */
moejit_ctx *ops_ctx(void);
/* 1 when ctx's device is sm_90a (the wgmma kernels run there). */
int ops_ctx_is_sm90a(moejit_ctx *ctx);

void *ops_alloc(size_t bytes);
void ops_free(void *dptr);
void ops_upload(void *dst, const void *src, size_t bytes);
/* Copies to the host after synchronizing (the data is ready on return). */
void ops_download(void *dst, const void *src, size_t bytes);
/* Fills bytes (a multiple of 4) with `word`. */
void ops_poison(void *dptr, size_t bytes, uint32_t word);
void ops_sync(void);
/* 1 if every 32-bit word of host buffer p is `word`. */
int ops_all_words(const void *p, size_t bytes, uint32_t word);

/* moejit_spec_init plus the shape; other fields at their defaults. */
moejit_spec ops_spec(int experts, int top_k, int64_t hidden);

/* Loads n models (only the kernel families in `families`, MJ_OPS_* of
 * src/ops/ops.h) on the process's ctx, compiling on every core. */
void ops_load_models(const moejit_spec *specs, size_t n, unsigned families, moejit_model **out);

/* T tokens of k distinct experts drawn uniformly from [0, E). */
void ops_random_ids(ts_rng *r, int64_t tokens, int top_k, int experts, int32_t *ids);

#endif
