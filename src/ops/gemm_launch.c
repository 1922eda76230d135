/* Launchers of the grouped GEMMs (moejit/gemm.h): argument checks, the plan,
 * the kernel lookup (memoized per ctx), the TMA maps of the wgmma path and
 * one launch. No sync, no alloc. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "ops/gemm.h"
#include "runtime/runtime.h"

static moejit_status check_ptr(const char *op, const char *field, const void *p, size_t align) {
  if (!p) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: args->%s is NULL", op, field);
  if ((uintptr_t)p % align != 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: args->%s (%p) is not %zu-byte aligned; HINT: moejit_mem_alloc and "
                   "cudaMalloc return 256-byte aligned memory; offsets into it must keep the "
                   "alignment",
                   op, field, p, align);
  return MOEJIT_OK;
}

static moejit_status check_args(int which, const moejit_spec *spec, const moejit_gemm_args *a) {
  const char *op = which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2";
  if (!spec || !a)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: spec and args are required", op);
  moejit_status st;
  if ((st = check_ptr(op, "a", a->a, 16)) || (st = check_ptr(op, "w", a->w, 16)) ||
      (st = check_ptr(op, "out", a->out, 16)) ||
      (st = check_ptr(op, "expert_offsets", a->expert_offsets, 4)))
    return st;
  if (which == 2 && a->row_scale && (st = check_ptr(op, "row_scale", a->row_scale, 4))) return st;
  if (a->a_index) {
    if (which != 1)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args->a_index is set; only GEMM 1 gathers its rows", op);
    if ((st = check_ptr(op, "a_index", a->a_index, 4))) return st;
    if (a->a_index_div < 0)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: args->a_index_div = %d is negative", op,
                     (int)a->a_index_div);
    if (a->a_rows < 1 || a->a_rows > INT32_MAX)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args->a_rows = %lld is outside 1..%d (the rows of a when gathering)",
                     op, (long long)a->a_rows, INT32_MAX);
  }
  if (a->round_sync) {
    if (which != 1)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args->round_sync is set; only GEMM 1 keeps its rounds in step", op);
    if ((st = check_ptr(op, "round_sync", a->round_sync, 4))) return st;
  }
  if (a->split) {
    if (which != 2)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args->split is set; only GEMM 2 splits its last round along K", op);
    if ((st = check_ptr(op, "split", a->split, 16))) return st;
  }
  if (a->max_rows < 0 || a->max_rows > INT32_MAX)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: args->max_rows = %lld is outside 0..%d (row indices are int32)", op,
                   (long long)a->max_rows, INT32_MAX);
  return MOEJIT_OK;
}

void mj_gemm2_split_layout(const mj_gemm_plan *plan, int sms, size_t *bytes, size_t *zero_bytes) {
  *bytes = *zero_bytes = 0;
  if (!plan || strcmp(plan->family, "gemm2") != 0 || !plan->use_wgmma || plan->wg_narrow ||
      plan->wg_pingpong || plan->wg_cluster != 1 || plan->tile_m < 128 || sms < 2 ||
      (plan->k + 63) / 64 / MJ_WG_KSPLIT_MIN_KTILES < 2)
    return;
  /* four counters a CTA (a word per last-round tile, consumer and consumer
   * warp: at most sms / 2 tiles), then a tile of fp32 partial sums a CTA */
  const size_t counts = MOEJIT_GEMM2_SPLIT_ZERO_BYTES(sms);
  *zero_bytes = counts;
  *bytes = counts + (size_t)sms * (size_t)plan->tile_m * (size_t)plan->tile_n * 4;
}

int mj_gemm1_rounds_in_step(const moejit_spec *spec, const moejit_gemm_args *args,
                            const mj_gemm_plan *plan) {
  if (!spec || !args || !plan || !args->round_sync || !plan->use_wgmma || plan->wg_narrow ||
      plan->wg_pingpong || plan->wg_cluster != 1 || args->a_index)
    return 0;
  const int want = plan->tile_m >= 128 && args->max_rows >= (int64_t)plan->tile_m * spec->experts;
  return mj_env_switch("MOEJIT_GEMM_ROUND_SYNC", want);
}

/* A 2-D TMA map over a row-major [rows, k] fp16/bf16 tensor at base: boxes
 * of 64 k-elements (one 128-byte swizzle row) x box_rows, 128-byte swizzle,
 * zeros outside the tensor (templates/common/gemm_wgmma.cuh). Host only. */
static moejit_status encode_map(const char *op, const char *what, CUtensorMap *map,
                                moejit_dtype dtype, const void *base, int64_t rows, int k,
                                int box_rows) {
  const mj_driver *d = NULL;
  moejit_status st = mj_driver_get(&d);
  if (st) return st;
  if (!d->TensorMapEncodeTiled)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12.0 or newer); "
                   "HINT: use MOEJIT_GEMM_PATH_MMA",
                   op);
  const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)k * 2u};
  const cuuint32_t box[2] = {64u, (cuuint32_t)box_rows}, elem_strides[2] = {1u, 1u};
  CUtensorMapDataType type = dtype == MOEJIT_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUresult r = d->TensorMapEncodeTiled(map, type, 2, (void *)base, dims, strides, box,
                                       elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) return MOEJIT_OK;
  char what_msg[160];
  snprintf(what_msg, sizeof what_msg,
           "%s: cuTensorMapEncodeTiled(%s: %lld x %d, box %d x 64)", op, what, (long long)rows, k,
           box_rows);
  return mj_cu_check(r, what_msg);
}

/* The wgmma entries take (map of A, map of W, out, offsets, [scale,]
 * max_rows); the maps are built per launch from the buffer pointers (host
 * work only) and passed by value (__grid_constant__). */
static moejit_status launch_wgmma(int which, moejit_ctx *ctx, const moejit_spec *spec,
                                  const moejit_gemm_args *args, const mj_gemm_plan *plan,
                                  moejit_kernel *kernel, moejit_stream stream) {
  const char *op = which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2";
  CUtensorMap map_a, map_w;
  /* the driver validates the maps against the current context's device */
  moejit_status st = mj_ctx_enter(ctx);
  if (st) return st;
  if (!args->a_index)
    st = encode_map(op, "a", &map_a, spec->act_dtype, args->a, args->max_rows, plan->k,
                    plan->wg_box_a_rows);
  else
    memset(&map_a, 0, sizeof map_a); /* A comes by cp.async from the index */
  if (!st)
    st = encode_map(op, "w", &map_w, spec->weight_dtype, args->w, plan->w_rows, plan->k,
                    plan->wg_box_w_rows);
  mj_ctx_leave(ctx);
  if (st) return st;
  void *out = args->out;
  const int32_t *offsets = args->expert_offsets;
  const float *scale = args->row_scale;
  int max_rows = (int)args->max_rows;
  const void *x = args->a;
  const int32_t *a_index = args->a_index;
  int a_div = args->a_index_div > 0 ? args->a_index_div : 1, x_rows = (int)args->a_rows;
  /* the spec-tile GEMM 1 entry's last parameter: rounds in step, or NULL */
  uint32_t *sync =
      which == 1 && mj_gemm1_rounds_in_step(spec, args, plan) ? args->round_sync : NULL;
  /* GEMM 2's last two parameters: the K parts' counters and partial sums */
  unsigned *ks_count = NULL;
  float *ks_part = NULL;
  if (which == 2 && args->split) {
    size_t need, zero;
    mj_gemm2_split_layout(plan, mj_ctx_sm_count(ctx), &need, &zero);
    if (need && args->split_bytes < need)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: args->split_bytes = %zu, but this launch needs %zu; HINT: size the "
                     "buffer with moejit_gemm2_split_size",
                     op, args->split_bytes, need);
    if (need && mj_env_switch("MOEJIT_GEMM_KSPLIT", 1)) {
      ks_count = (unsigned *)args->split;
      ks_part = (float *)((char *)args->split + zero);
    }
  }
  void *params1[] = {&map_a, &map_w, &out, &offsets, &max_rows, &sync};
  void *params2[] = {&map_a, &map_w, &out, &offsets, &scale, &max_rows, &ks_count, &ks_part};
  void *gather[] = {&map_w, &x, &a_index, &a_div, &x_rows, &out, &offsets, &max_rows};
  /* persistent: one CTA per SM (the pipeline fills the SM's shared memory),
   * never more CTAs than tiles the rows could make */
  const unsigned block[3] = {plan->threads, 1, 1};
  unsigned sms = (unsigned)mj_ctx_sm_count(ctx), want = plan->grid;
  if (plan->wg_cluster == 2) { /* whole clusters, all resident at once */
    const unsigned fit =
        2u * (unsigned)mj_kernel_active_clusters(ctx, kernel, block, plan->smem_bytes, 2);
    sms = sms >= 2 ? sms & ~1u : 2u, want += want & 1u;
    if (fit >= 2 && fit < sms) sms = fit;
  }
  const unsigned grid[3] = {want < sms ? want : sms, 1, 1};
  if (sync) { /* the CTAs wait for each other: all resident, or no barrier */
    int launched = 0;
    st = mj_kernel_launch_cooperative(ctx, kernel, grid, block, plan->smem_bytes, stream, params1,
                                      &launched);
    if (st || launched) return st;
    sync = NULL;
  }
  return moejit_kernel_launch(ctx, kernel, grid, block, plan->smem_bytes, stream,
                              args->a_index ? gather : which == 1 ? params1 : params2);
}

static moejit_status gemm_launch(int which, moejit_ctx *ctx, const moejit_spec *spec,
                                 const moejit_gemm_args *args, moejit_stream stream) {
  if (!ctx)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: ctx is NULL",
                   which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2");
  moejit_status st = check_args(which, spec, args);
  if (st) return mj_ctx_fail(ctx, st);
  mj_gemm_plan plan; /* planned for one row when there are none: the spec
                        and path are checked all the same */
  if ((st = mj_gemm_plan_make_for(spec, which, args->path, args->max_rows ? args->max_rows : 1,
                                  mj_ctx_arch(ctx), &plan)))
    return mj_ctx_fail(ctx, st);
  if (args->max_rows == 0) return MOEJIT_OK; /* no rows: nothing to compute */
  /* gathered A rows: the plan's gathering twin (mj_gemm1_gather_entry), or
   * why it has none */
  const char *gather = args->a_index ? mj_gemm1_gather_entry(&plan) : NULL;
  if (args->a_index && !gather && plan.use_wgmma)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                     "moejit_gemm1_swiglu: args->a_index (gathered A rows) cannot run with "
                     "cluster_n = 2 (CTA pairs along N share A by TMA multicast); HINT: leave "
                     "a_index NULL and pass the rows in order, or set cluster_n to 1"));
  if (args->a_index && !gather)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                     "moejit_gemm1_swiglu: args->a_index (gathered A rows) needs the wgmma "
                     "kernel; this launch would run %s; HINT: leave a_index NULL and pass the "
                     "rows in order",
                     plan.entry));
  /* the kernel handle carries its launch limits: no lookup by CUfunction */
  moejit_kernel *kernel;
  moejit_spec scratch;
  const moejit_spec *kspec = mj_gemm_kernel_spec(spec, which, &plan, &scratch);
  const char *entry = gather ? gather : plan.entry;
  if ((st = moejit_ctx_get_kernel(ctx, kspec, plan.family, entry, &kernel)))
    return mj_ctx_fail(ctx, st);
  if (plan.use_wgmma) {
    st = launch_wgmma(which, ctx, spec, args, &plan, kernel, stream);
    return st ? mj_ctx_fail(ctx, st) : MOEJIT_OK;
  }
  const void *a = args->a, *w = args->w;
  void *out = args->out;
  const int32_t *offsets = args->expert_offsets;
  const float *scale = args->row_scale;
  int max_rows = (int)args->max_rows;
  /* Kernel parameters: (a, w, out, offsets, [scale,] max_rows). */
  void *params1[] = {&a, &w, &out, &offsets, &max_rows};
  void *params2[] = {&a, &w, &out, &offsets, &scale, &max_rows};
  unsigned blocks = plan.grid;
  if (plan.use_gemv) { /* persistent: the warps loop over the work units */
    const unsigned cap = (unsigned)mj_ctx_sm_count(ctx) * MJ_GEMV_BLOCKS_PER_SM;
    if (blocks > cap) blocks = cap;
  }
  const unsigned grid[3] = {blocks, 1, 1}, block[3] = {plan.threads, 1, 1};
  st = moejit_kernel_launch(ctx, kernel, grid, block, plan.smem_bytes, stream,
                     which == 1 ? params1 : params2);
  return st ? mj_ctx_fail(ctx, st) : MOEJIT_OK;
}

moejit_status moejit_gemm1_swiglu(moejit_ctx *ctx, const moejit_spec *spec,
                                  const moejit_gemm_args *args, moejit_stream stream) {
  return gemm_launch(1, ctx, spec, args, stream);
}

moejit_status moejit_gemm2(moejit_ctx *ctx, const moejit_spec *spec, const moejit_gemm_args *args,
                           moejit_stream stream) {
  return gemm_launch(2, ctx, spec, args, stream);
}

moejit_status moejit_gemm2_split_size(moejit_ctx *ctx, const moejit_spec *spec,
                                      moejit_gemm_path path, int64_t max_rows, size_t *bytes,
                                      size_t *zero_bytes) {
  const char *op = "moejit_gemm2_split_size";
  if (!ctx || !spec || !bytes)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: ctx, spec and bytes are required", op);
  size_t scratch;
  if (!zero_bytes) zero_bytes = &scratch;
  *bytes = *zero_bytes = 0;
  if (max_rows < 0 || max_rows > INT32_MAX)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: max_rows = %lld is outside 0..%d", op,
                     (long long)max_rows, INT32_MAX));
  if (max_rows == 0) return MOEJIT_OK; /* launches nothing */
  mj_gemm_plan plan;
  moejit_status st = mj_gemm_plan_make_for(spec, 2, path, max_rows, mj_ctx_arch(ctx), &plan);
  if (st) return mj_ctx_fail(ctx, st);
  mj_gemm2_split_layout(&plan, mj_ctx_sm_count(ctx), bytes, zero_bytes);
  return MOEJIT_OK;
}
