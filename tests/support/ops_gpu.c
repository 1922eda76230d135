/* GPU test helpers for the ops tests; see ops_gpu.h. */
#include "ops_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"

int ops_gpu_usable(char *why, size_t cap) {
  int n = 0;
  if (moejit_device_count(&n) != MOEJIT_OK) {
    snprintf(why, cap, "%s", moejit_last_error());
    return 0;
  }
  if (n == 0) {
    snprintf(why, cap, "the CUDA driver reports no device");
    return 0;
  }
  return 1;
}

static moejit_ctx *the_ctx;

moejit_ctx *ops_ctx(void) {
  if (!the_ctx) OPS_OK(moejit_ctx_create(&the_ctx, NULL));
  return the_ctx;
}

int ops_ctx_is_sm90a(moejit_ctx *ctx) {
  moejit_device_info info;
  cr_assert_eq(moejit_ctx_device_info(ctx, &info), MOEJIT_OK, "%s", moejit_last_error());
  return strcmp(info.arch, "sm_90a") == 0;
}

void *ops_alloc(size_t bytes) {
  void *d = NULL;
  OPS_OK(moejit_mem_alloc(ops_ctx(), bytes, NULL, &d));
  return d;
}

void ops_free(void *dptr) {
  if (dptr) OPS_OK(moejit_mem_free(ops_ctx(), dptr, NULL));
}

void ops_upload(void *dst, const void *src, size_t bytes) {
  OPS_OK(moejit_memcpy_htod(ops_ctx(), dst, src, bytes, NULL));
}

void ops_download(void *dst, const void *src, size_t bytes) {
  OPS_OK(moejit_memcpy_dtoh(ops_ctx(), dst, src, bytes, NULL));
  ops_sync();
}

void ops_poison(void *dptr, size_t bytes, uint32_t word) {
  OPS_OK(moejit_memset_d32(ops_ctx(), dptr, word, bytes / 4, NULL));
}

void ops_sync(void) {
  OPS_OK(moejit_stream_synchronize(ops_ctx(), NULL));
}

int ops_all_words(const void *p, size_t bytes, uint32_t word) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    uint32_t w;
    memcpy(&w, b + i, 4);
    if (w != word) return 0;
  }
  return 1;
}

moejit_spec ops_spec(int experts, int top_k, int64_t hidden) {
  moejit_spec s;
  moejit_spec_init(&s);
  snprintf(s.name, sizeof s.name, "ops-test-e%d-k%d", experts, top_k);
  s.experts = experts;
  s.top_k = top_k;
  s.hidden = hidden;
  s.expert_width = 256;
  return s;
}

typedef struct load_job {
  const moejit_spec *specs;
  unsigned families;
  moejit_model **out;
  moejit_status *status;
  char (*message)[512];
} load_job;

static void load_one(size_t i, void *arg) {
  load_job *j = arg;
  j->status[i] = mj_model_load(ops_ctx(), &j->specs[i], j->families, &j->out[i]);
  if (j->status[i]) snprintf(j->message[i], sizeof j->message[i], "%s", moejit_last_error());
}

void ops_load_models(const moejit_spec *specs, size_t n, unsigned families, moejit_model **out) {
  moejit_status *status = calloc(n, sizeof *status);
  char(*message)[512] = calloc(n, sizeof *message);
  cr_assert(status && message);
  ops_ctx(); /* create it before the threads race to */
  load_job job = {specs, families, out, status, message};
  mj_parallel_for(n, 0, load_one, &job);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(status[i], MOEJIT_OK, "model %zu (%s E=%d k=%d): %s", i, specs[i].name,
                 specs[i].experts, specs[i].top_k, message[i]);
  free(status);
  free(message);
}

void ops_random_ids(ts_rng *r, int64_t tokens, int top_k, int experts, int32_t *ids) {
  int32_t *pool = malloc(sizeof(int32_t) * (size_t)experts);
  cr_assert_not_null(pool);
  for (int64_t t = 0; t < tokens; t++) {
    for (int e = 0; e < experts; e++) pool[e] = e;
    for (int j = 0; j < top_k; j++) { /* partial Fisher-Yates: k distinct */
      const int pick = j + (int)(ts_next(r) % (uint64_t)(experts - j));
      const int32_t tmp = pool[j];
      pool[j] = pool[pick];
      pool[pick] = tmp;
      ids[t * top_k + j] = pool[j];
    }
  }
  free(pool);
}
