/* Expert placement and the buffer layout of an expert-parallel forward
 * (src/dist/ep.h): host arithmetic only. */
#include <string.h>

#include "common/common.h"
#include "dist/ep.h"

moejit_status mj_ep_place(int experts, int world, int rank, const int32_t *owner,
                          mj_ep_placement *out) {
  static const char op[] = "expert placement";
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: out is NULL", op);
  memset(out, 0, sizeof *out);
  if (experts < 1 || experts > MJ_EP_MAX_EXPERTS)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %d experts (allowed 1..%d)", op, experts,
                   MJ_EP_MAX_EXPERTS);
  if (world < 1 || world > MOEJIT_EP_MAX_WORLD)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: ep.world = %d (allowed 1..%d ranks); HINT: set moejit_load_opts.ep.world "
                   "to the number of ranks",
                   op, world, MOEJIT_EP_MAX_WORLD);
  if (rank < 0 || rank >= world)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: ep.rank = %d is outside 0..%d", op, rank,
                   world - 1);
  if (!owner && experts < world)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: %d experts cannot be spread over %d ranks (each rank needs at least one); "
                   "HINT: use at most %d ranks",
                   op, experts, world, experts);
  out->world = world;
  out->rank = rank;
  out->experts = experts;
  for (int e = 0; e < experts; e++) {
    int r;
    if (owner) {
      r = owner[e];
      if (r < 0 || r >= world)
        return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                       "%s: ep.expert_owner[%d] = %d is outside 0..%d (ranks)", op, e, r,
                       world - 1);
    } else {
      /* the largest r with r*E/W <= e */
      r = (int)(((int64_t)(e + 1) * world - 1) / experts);
    }
    out->owner[e] = r;
    out->local_index[e] = out->per_rank[r]++;
    if (r == rank) out->local_experts[out->n_local++] = e;
  }
  for (int r = 0; r < world; r++)
    if (out->per_rank[r] == 0)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "%s: rank %d owns no expert in ep.expert_owner; HINT: give every rank at "
                     "least one expert",
                     op, r);
  return MOEJIT_OK;
}

void mj_ep_local_spec(const moejit_spec *global, int n_local, moejit_spec *out) {
  *out = *global;
  out->experts = n_local > global->top_k ? n_local : global->top_k;
  out->routing.rule = MOEJIT_ROUTE_SOFTMAX_TOPK;
  out->routing.n_group = 1;
  out->routing.topk_group = 1;
}

static size_t take(size_t *cursor, size_t bytes) {
  size_t at = *cursor;
  *cursor += (bytes + 255) / 256 * 256;
  return at;
}

moejit_status mj_ep_layout_for(const moejit_spec *s, int world, int64_t tokens, int64_t send_rows,
                               int64_t recv_rows, size_t local_ws_bytes, size_t router_split_bytes,
                               mj_ep_layout *l) {
  if (!s || !l || world < 1 || tokens < 0 || send_rows < 0 || recv_rows < 0)
    return mj_fail(MOEJIT_ERR_INTERNAL, "mj_ep_layout_for: bad arguments");
  memset(l, 0, sizeof *l);
  const size_t k = (size_t)s->top_k, d = (size_t)s->hidden, W = (size_t)world;
  const size_t act = moejit_dtype_size(s->act_dtype), out = moejit_dtype_size(s->out_dtype);
  const size_t T = (size_t)tokens, S = (size_t)send_rows, R = (size_t)recv_rows;
  size_t c = 0;
  l->tokens = tokens;
  l->send_rows = send_rows;
  l->recv_rows = recv_rows;
  l->ids = take(&c, T * k * 4);
  l->weights = take(&c, T * k * 4);
  l->mask = take(&c, T * 8);
  l->pos = take(&c, W * T * 4);
  l->counts = take(&c, W * 4);
  l->recv_counts = take(&c, W * 4);
  l->dropped_by_rank = take(&c, W * 4);
  /* the router's logits, computed there when the forward gets gate_weight */
  l->logits = take(&c, T * (size_t)s->experts * moejit_dtype_size(s->logits_dtype));
  l->router_split = take(&c, router_split_bytes);
  l->head = c;
  l->send_x = take(&c, S * d * act);
  l->send_ids = take(&c, S * k * 4);
  l->send_w = take(&c, S * k * 4);
  l->recv_x = take(&c, R * d * act);
  l->recv_ids = take(&c, R * k * 4);
  l->recv_w = take(&c, R * k * 4);
  l->partial = take(&c, R * d * out);
  l->back = take(&c, S * d * out);
  l->local_ws = take(&c, local_ws_bytes);
  l->local_ws_bytes = local_ws_bytes;
  l->total = c;
  return MOEJIT_OK;
}
