/* moejit_route: checks the arguments, then one launch of moejit_route_topk
 * (templates/route.cu): a warp per token, block_threads / 32 tokens per
 * block. moejit_router_logits: x . gate_weight^T, the warps or a
 * tensor-core form of the same template. */
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

/* ---- router logits ------------------------------------------------------ */

int mj_router_logits_mma(const moejit_spec *spec, int64_t tokens) {
  const moejit_dtype a = spec->act_dtype;
  return tokens > MJ_ROUTER_GEMV_MAX_TOKENS && a == spec->weight_dtype &&
         (a == MOEJIT_DTYPE_BF16 || a == MOEJIT_DTYPE_FP16);
}

static int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t mj_router_split_bytes(const moejit_model *model, int64_t tokens) {
  const moejit_spec *s = &model->spec;
  if (tokens <= MJ_ROUTER_GEMV_MAX_TOKENS) return 0;
  const size_t cap = MJ_ROUTER_SPLIT_BYTES(model->sm_count);
  const double all =
      (double)ceil_div(s->hidden, MJ_ROUTER_TILE_K) * (double)tokens * (double)s->experts * 4.0;
  return all < (double)cap ? (size_t)all : cap;
}

moejit_status mj_router_logits_launch(const moejit_model *model, int64_t tokens, const void *x,
                                      const void *gate_weight, void *logits, void *split,
                                      moejit_stream stream) {
  const moejit_spec *s = &model->spec;
  const int64_t sms = model->sm_count > 0 ? model->sm_count : 1;
  int t = (int)tokens;
  if (mj_router_logits_mma(s, tokens)) {
    /* the 128 x 128 tiles where they make half a wave, else 32 x 64; those
     * split d into parts where they make at most half a wave (and the
     * caller gave scratch): about two blocks an SM, each part at least one
     * k-tile. (A wave or so of tiles gains nothing from it: qwen3-30b-a3b's
     * 128 at T = 2048 took 17.9 us split in three against 13.5 whole, on an
     * H200.) */
    const int64_t wide_t = ceil_div(tokens, MJ_ROUTER_WIDE_TOKENS);
    const int64_t wide_e = ceil_div(s->experts, MJ_ROUTER_WIDE_EXPERTS);
    const int wide = 2 * wide_t * wide_e >= sms;
    const int64_t tt = wide ? wide_t : ceil_div(tokens, MJ_ROUTER_TILE_TOKENS);
    const int64_t te = wide ? wide_e : ceil_div(s->experts, MJ_ROUTER_TILE_EXPERTS);
    const int k_tiles = (int)ceil_div(s->hidden, MJ_ROUTER_TILE_K);
    int parts = 1, per = k_tiles;
    if (!wide && split && 2 * tt * te <= sms) {
      const int64_t want = ceil_div(2 * sms, tt * te);
      per = (int)ceil_div(k_tiles, want < k_tiles ? want : k_tiles);
      parts = (int)ceil_div(k_tiles, per);
    }
    float *part = parts > 1 ? split : NULL;
    void *params[] = {&x, &gate_weight, &t, &logits, &part, &per};
    const unsigned grid[3] = {(unsigned)tt, (unsigned)te, (unsigned)parts};
    const unsigned block[3] = {wide ? MJ_ROUTER_WIDE_THREADS : MJ_ROUTER_TILE_THREADS, 1, 1};
    moejit_status st = mj_ctx_launch(
        model->ctx, wide ? model->router_logits_mma_wide : model->router_logits_mma, grid, block,
        wide ? MJ_ROUTER_WIDE_SMEM : MJ_ROUTER_TILE_SMEM, stream, params);
    if (st || parts == 1) return st;
    long long n = (long long)tokens * s->experts;
    void *sum_params[] = {&part, &parts, &n, &logits};
    const unsigned sum_grid[3] = {mj_tile_grid(model, ceil_div(n, 256)), 1, 1};
    const unsigned sum_block[3] = {256, 1, 1};
    return mj_ctx_launch(model->ctx, model->router_logits_sum, sum_grid, sum_block, 0, stream,
                         sum_params);
  }
  /* the warps form: as many experts an item (4, 2, 1) as still give every
   * SM two blocks */
  const int64_t groups = ceil_div(tokens, MJ_ROUTER_TOKENS);
  int eb = MJ_ROUTER_EXPERTS;
  while (eb > 1 && ceil_div(s->experts, eb) * groups < 2 * sms) eb /= 2;
  void *params[] = {&x, &gate_weight, &t, &logits, &eb};
  const unsigned grid[3] = {mj_tile_grid(model, ceil_div(s->experts, eb) * groups), 1, 1};
  const unsigned block[3] = {MJ_ROUTER_THREADS, 1, 1};
  return mj_ctx_launch(model->ctx, model->router_logits_warps, grid, block, 0, stream, params);
}

moejit_status moejit_router_logits_workspace_size(const moejit_model *model, size_t *bytes) {
  static const char op[] = "moejit_router_logits_workspace_size";
  int where = 0;
  moejit_status st = mj_check_call(model, MJ_OPS_ROUTE, op, &where);
  if (st) return st;
  if (!bytes)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", op));
  *bytes = MJ_ROUTER_SPLIT_BYTES(model->sm_count);
  return MOEJIT_OK;
}

moejit_status moejit_router_logits(const moejit_model *model, const moejit_router_logits_args *args,
                                   moejit_stream stream) {
  static const char op[] = "moejit_router_logits";
  moejit_status st;
  if ((st = mj_check_call(model, MJ_OPS_ROUTE, op, args))) return st;
  if ((st = mj_check_tokens(model, op, args->tokens))) return st;
  if ((st = mj_check_ptr(model, op, "x", args->x, 16))) return st;
  if ((st = mj_check_ptr(model, op, "gate_weight", args->gate_weight, 16))) return st;
  if ((st = mj_check_ptr(model, op, "logits", args->logits, 16))) return st;
  if ((st = mj_check_opt_ptr(model, op, "workspace", args->workspace, 256))) return st;
  const size_t need = MJ_ROUTER_SPLIT_BYTES(model->sm_count);
  if (args->workspace && args->workspace_bytes < need)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                        "%s: workspace_bytes = %zu, but the split needs %zu; "
                                        "HINT: size it with "
                                        "moejit_router_logits_workspace_size, or pass none",
                                        op, args->workspace_bytes, need));
  return mj_router_logits_launch(model, args->tokens, args->x, args->gate_weight, args->logits,
                                 args->workspace, stream);
}
