/* Launchers of the grouped GEMMs (moejit/gemm.h): argument checks, the plan,
 * the kernel lookup (memoized per ctx) and one launch. No sync, no alloc. */
#include <stdint.h>

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
  if (a->max_rows < 0 || a->max_rows > INT32_MAX)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: args->max_rows = %lld is outside 0..%d (row indices are int32)", op,
                   (long long)a->max_rows, INT32_MAX);
  return MOEJIT_OK;
}

static moejit_status gemm_launch(int which, moejit_ctx *ctx, const moejit_spec *spec,
                                 const moejit_gemm_args *args, moejit_stream stream) {
  if (!ctx)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: ctx is NULL",
                   which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2");
  moejit_status st = check_args(which, spec, args);
  if (st) return mj_ctx_fail(ctx, st);
  if (args->max_rows == 0) return MOEJIT_OK; /* no rows: nothing to compute */
  mj_gemm_plan plan;
  if ((st = mj_gemm_plan_make(spec, which, args->path, args->max_rows, &plan)))
    return mj_ctx_fail(ctx, st);
  CUfunction fn;
  if ((st = mj_ctx_get_function(ctx, spec, plan.family, plan.entry, &fn)))
    return mj_ctx_fail(ctx, st);
  const void *a = args->a, *w = args->w;
  void *out = args->out;
  const int32_t *offsets = args->expert_offsets;
  const float *scale = args->row_scale;
  int max_rows = (int)args->max_rows;
  /* Kernel parameters: (a, w, out, offsets, [scale,] max_rows). */
  void *params1[] = {&a, &w, &out, &offsets, &max_rows};
  void *params2[] = {&a, &w, &out, &offsets, &scale, &max_rows};
  const unsigned grid[3] = {plan.grid, 1, 1}, block[3] = {plan.threads, 1, 1};
  st = mj_ctx_launch(ctx, fn, grid, block, plan.smem_bytes, stream,
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
