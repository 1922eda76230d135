/* moejit_route: checks the arguments, then one launch of moejit_route_topk
 * (templates/route.cu): a warp per token, block_threads / 32 tokens per
 * block. */
#include "common/common.h"
#include "ops/ops.h"

static moejit_status check_route_args(const moejit_model *m, const moejit_route_args *a) {
  static const char op[] = "moejit_route";
  moejit_status st;
  if ((st = mj_check_call(m, MJ_OPS_ROUTE, op, a))) return st;
  if ((st = mj_check_tokens(m, op, a->tokens))) return st;
  if ((st = mj_check_ptr(m, op, "logits", a->logits, 16))) return st;
  if ((st = mj_check_opt_ptr(m, op, "bias", a->bias, 16))) return st;
  if ((st = mj_check_ptr(m, op, "topk_ids", a->topk_ids, 4))) return st;
  return mj_check_ptr(m, op, "topk_weights", a->topk_weights, 4);
}

moejit_status moejit_route(const moejit_model *model, const moejit_route_args *args,
                           moejit_stream stream) {
  moejit_status st = check_route_args(model, args);
  if (st) return st;
  const int warps = model->spec.route.block_threads / 32;
  int tokens = (int)args->tokens;
  const void *logits = args->logits;
  const float *bias = args->bias;
  int32_t *ids = args->topk_ids;
  float *weights = args->topk_weights;
  void *params[] = {&logits, &bias, &tokens, &ids, &weights};
  const unsigned grid[3] = {(unsigned)((args->tokens + warps - 1) / warps), 1, 1};
  const unsigned block[3] = {(unsigned)model->spec.route.block_threads, 1, 1};
  return mj_ctx_launch(model->ctx, model->route_topk, grid, block, 0, stream, params);
}
