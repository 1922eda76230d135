/* The expert-parallel forward (docs/ep.md): route -> destination masks and
 * positions -> pack -> NCCL dispatch -> the local layer on the received rows
 * -> NCCL return -> combine in the original token order. */
#include <string.h>

#include "common/common.h"
#include "dist/ep.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

static const char op[] = "moejit_moe_forward";

#define AT(base, off) ((void *)((char *)(base) + (off)))

/* The layout of a forward moving `send_rows` / `recv_rows` rows. */
static moejit_status layout(const moejit_model *m, int64_t tokens, int64_t send_rows,
                            int64_t recv_rows, mj_ep_layout *l) {
  size_t local_ws = 0;
  if (recv_rows > 0) {
    moejit_status st = moejit_moe_workspace_size(m->ep->local, recv_rows, &local_ws);
    if (st) return st;
  }
  return mj_ep_layout_for(&m->spec, m->ep->place.world, tokens, send_rows, recv_rows, local_ws,
                          mj_router_split_bytes(m, tokens), l);
}

/* recv_rows * top_k must fit the local layer's int32 row indices. */
static moejit_status check_rows(const moejit_model *m, int64_t rows, const char *what) {
  if (rows * m->spec.top_k <= INT32_MAX) return MOEJIT_OK;
  return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                  "%s: %s gives %lld rows on one rank, %lld entries with top_k = "
                                  "%d: more than INT32_MAX; HINT: lower it",
                                  op, what, (long long)rows, (long long)rows * m->spec.top_k,
                                  m->spec.top_k));
}

moejit_status mj_ep_workspace_size(const moejit_model *m, int64_t max_tokens, size_t *bytes) {
  static const char fn[] = "moejit_moe_workspace_size";
  if (!bytes) return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn));
  moejit_status st = mj_check_tokens(m, fn, max_tokens);
  if (st) return st;
  const int64_t rows = mj_ep_max_rows(m->ep->place.world, max_tokens);
  if ((st = check_rows(m, rows, "world * max_tokens"))) return st;
  mj_ep_layout l;
  if ((st = layout(m, max_tokens, rows, rows, &l))) return st;
  *bytes = l.total;
  return MOEJIT_OK;
}

static moejit_status workspace_fits(const moejit_model *m, const moejit_moe_args *a,
                                    const mj_ep_layout *l) {
  if (a->workspace_bytes >= l->total) return MOEJIT_OK;
  return mj_model_fail(
      m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                 "%s: args->workspace_bytes = %zu, but %lld tokens sending %lld and computing "
                 "%lld rows need %zu; HINT: size it with moejit_moe_workspace_size for the "
                 "largest T of any rank (and a capacity no larger)",
                 op, a->workspace_bytes, (long long)a->tokens, (long long)l->send_rows,
                 (long long)l->recv_rows, l->total));
}

static moejit_status check_args(const moejit_model *m, const moejit_moe_args *a,
                               moejit_stream stream) {
  if (!a) return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: args is NULL", op));
  /* T = 0 is allowed: a rank without tokens still serves its experts */
  moejit_status st;
  if (a->tokens == 0) { /* no token data: x, logits and out may be NULL */
    st = mj_check_ptr(m, op, "args->w1", a->w1, 16);
    if (!st) st = mj_check_ptr(m, op, "args->w2", a->w2, 16);
    if (!st) st = mj_check_ptr(m, op, "args->workspace", a->workspace, 256);
  } else {
    st = mj_check_tokens(m, op, a->tokens);
    if (!st) st = mj_moe_check_pointers(m, a);
  }
  if (st) return st;
  if (a->ep_capacity < 0)
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: args->ep_capacity = %lld (allowed 0: exact, or rows "
                                    "per peer >= 1)",
                                    op, (long long)a->ep_capacity));
  if (a->ep_capacity > INT32_MAX / m->ep->place.world) /* before multiplying */
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: args->ep_capacity = %lld rows per peer, times %d ranks, "
                                    "exceeds INT32_MAX rows; HINT: use at most the largest T "
                                    "of any rank",
                                    op, (long long)a->ep_capacity, m->ep->place.world));
  if (a->ep_capacity > 0 &&
      (st = check_rows(m, a->ep_capacity * m->ep->place.world, "args->ep_capacity * world")))
    return st;
  if ((st = mj_check_opt_ptr(m, op, "args->ep_dropped", a->ep_dropped, 4))) return st;
  if (a->ep_events)
    for (int i = 0; i < MOEJIT_EP_EVENTS; i++)
      if (!a->ep_events[i])
        return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                        "%s: args->ep_events[%d] is NULL (give all %d events, "
                                        "or none)",
                                        op, i, MOEJIT_EP_EVENTS));
  if (a->ep_capacity == 0 && mj_ctx_stream_capturing(m->ctx, stream))
    return mj_model_fail(
        m, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: args->ep_capacity = 0 (exact) waits on the host for the peers' counts, "
                   "which a stream capture cannot hold; HINT: capture with a fixed capacity "
                   "(args->ep_capacity > 0, the same on every rank)",
                   op));
  return MOEJIT_OK;
}

static moejit_status record(const moejit_model *m, const moejit_moe_args *a, int i,
                            moejit_stream stream) {
  return a->ep_events ? mj_ctx_record_event(m->ctx, a->ep_events[i], stream) : MOEJIT_OK;
}

/* Rows this rank sends to / receives from each peer, and where each
 * peer's segment starts (rows). */
typedef struct ep_plan {
  int64_t send[MOEJIT_EP_MAX_WORLD], recv[MOEJIT_EP_MAX_WORLD];
  int64_t send_at[MOEJIT_EP_MAX_WORLD], recv_at[MOEJIT_EP_MAX_WORLD];
  int64_t send_rows, recv_rows, self_base;
} ep_plan;

static void plan_capacity(const mj_ep_placement *p, int64_t cap, ep_plan *pl) {
  for (int r = 0; r < p->world; r++) {
    pl->send[r] = pl->recv[r] = r == p->rank ? 0 : cap;
    pl->send_at[r] = pl->recv_at[r] = r * cap;
  }
  pl->send_rows = pl->recv_rows = p->world * cap;
  pl->self_base = p->rank * cap;
}

/* One unit (a count, or one block of bytes) to and from each peer, unit r
 * at offset r: the count exchange and moejit_ep_alltoall. */
static void plan_one_each(const mj_ep_placement *p, ep_plan *pl) {
  memset(pl, 0, sizeof *pl);
  for (int r = 0; r < p->world; r++) {
    pl->send[r] = pl->recv[r] = r == p->rank ? 0 : 1;
    pl->send_at[r] = pl->recv_at[r] = r;
  }
}

/* counts: rows to each rank (own included); recv: rows from each rank. */
static void plan_exact(const mj_ep_placement *p, const int32_t *counts, const int32_t *recv,
                       ep_plan *pl) {
  int64_t s = 0, r_at = 0;
  for (int r = 0; r < p->world; r++) {
    pl->send_at[r] = s;
    pl->send[r] = r == p->rank ? 0 : counts[r];
    s += pl->send[r];
    pl->recv_at[r] = r_at;
    pl->recv[r] = r == p->rank ? 0 : recv[r];
    r_at += r == p->rank ? counts[r] : recv[r];
  }
  pl->send_rows = s;
  pl->recv_rows = r_at;
  pl->self_base = pl->recv_at[p->rank];
}

/* One grouped exchange: to each peer `send` rows from `sbuf` (+ send_at),
 * from each peer `recv` rows into `rbuf` (+ recv_at); `row_bytes` per row.
 * swap: the return trip (send what was received, and back). */
typedef struct ep_xfer {
  const void *sbuf;
  void *rbuf;
  size_t row_bytes;
} ep_xfer;

/* mj_nccl_check, with ncclInProgress (a nonblocking communicator's answer
 * while NCCL works in the background) counted in *pending instead. */
static moejit_status nccl_step(const mj_nccl *nc, mj_nccl_result r, mj_nccl_comm comm,
                               const char *name, int *pending) {
  if (r == MJ_NCCL_IN_PROGRESS) {
    *pending = 1;
    return MOEJIT_OK;
  }
  return mj_nccl_check(nc, r, comm, name);
}

static moejit_status exchange(const moejit_model *m, const ep_plan *pl, const ep_xfer *x, int n,
                              int swap, const char *what, moejit_stream stream) {
  const mj_ep *ep = m->ep;
  const mj_nccl *nc = ep->nccl;
  if (ep->place.world == 1) return MOEJIT_OK;
  moejit_status st = mj_ctx_enter(m->ctx);
  if (st) return st;
  if (!mj_ep_comm_enter((mj_ep *)ep)) { /* another thread is aborting it */
    mj_ctx_leave(m->ctx);
    st = mj_ep_usable(m, what);
    return mj_model_fail(m, st ? st : mj_fail(MOEJIT_ERR_INTERNAL, "%s: aborted", what));
  }
  /* a nonblocking communicator may answer ncclInProgress (NCCL goes on in
   * a thread of its own): settled below, once out of the group */
  int pending = 0;
#define EP_CALL(call, name) nccl_step(nc, (call), ep->comm, name, &pending)
  st = EP_CALL(nc->GroupStart(), "ncclGroupStart");
  for (int r = 0; r < ep->place.world && !st; r++) {
    if (r == ep->place.rank) continue;
    const int64_t ns = swap ? pl->recv[r] : pl->send[r], nr = swap ? pl->send[r] : pl->recv[r];
    const int64_t as = swap ? pl->recv_at[r] : pl->send_at[r];
    const int64_t ar = swap ? pl->send_at[r] : pl->recv_at[r];
    for (int i = 0; i < n && !st; i++) {
      if (ns > 0)
        st = EP_CALL(nc->Send((const char *)x[i].sbuf + (size_t)as * x[i].row_bytes,
                              (size_t)ns * x[i].row_bytes, MJ_NCCL_UINT8, r, ep->comm,
                              (mj_nccl_stream)stream),
                     "ncclSend");
      if (!st && nr > 0)
        st = EP_CALL(
            nc->Recv((char *)x[i].rbuf + (size_t)ar * x[i].row_bytes, (size_t)nr * x[i].row_bytes,
                     MJ_NCCL_UINT8, r, ep->comm, (mj_nccl_stream)stream),
            "ncclRecv");
    }
  }
  /* the group must be closed even after a failure inside it */
  moejit_status end = EP_CALL(nc->GroupEnd(), "ncclGroupEnd");
#undef EP_CALL
  mj_ep_comm_leave((mj_ep *)ep);
  mj_ctx_leave(m->ctx);
  if (!st) st = end;
  /* nothing more may go on the stream before NCCL's thread is done */
  if (!st && pending) return mj_ep_settle(m, stream, what); /* its message names `what` */
  if (!st) return MOEJIT_OK;
  /* the peers may now wait on transfers that never come: the caller fails
   * the model and aborts its communicator (exchanges_failed) */
  return mj_fail_prefix(st, "%s", what);
}

/* Exact mode: each peer's count for us, then one host wait. */
static moejit_status exchange_counts(const moejit_model *m, void *ws, const mj_ep_layout *l,
                                     int32_t *counts, int32_t *recv, moejit_stream stream) {
  const mj_ep_placement *p = &m->ep->place;
  ep_plan one;
  plan_one_each(p, &one);
  const ep_xfer x = {AT(ws, l->counts), AT(ws, l->recv_counts), sizeof(int32_t)};
  /* no peer writes this rank's own slot: zero it, so all W are defined */
  moejit_status st = moejit_memset_d32(m->ctx, AT(ws, l->recv_counts), 0, (size_t)p->world, stream);
  if (!st) st = exchange(m, &one, &x, 1, 0, "moejit_moe_forward: count exchange", stream);
  if (st) return st;
  /* A peer that died leaves the exchange without an end: wait for it
   * watching the communicator, giving up after opts.ep.timeout_ms
   * (ep_wait.c), before the copies: a copy into pageable memory blocks the
   * thread until the stream reaches it, with no limit. */
  static const char what[] = "moejit_moe_forward: the count exchange";
  if ((st = mj_ep_wait(m, stream, m->ep->timeout_ms, what))) return mj_model_fail(m, st);
  const size_t bytes = (size_t)p->world * sizeof(int32_t);
  if ((st = moejit_memcpy_dtoh(m->ctx, counts, AT(ws, l->counts), bytes, stream))) return st;
  if ((st = moejit_memcpy_dtoh(m->ctx, recv, AT(ws, l->recv_counts), bytes, stream))) return st;
  st = mj_ep_wait(m, stream, m->ep->timeout_ms, what);
  return st ? mj_model_fail(m, st) : MOEJIT_OK;
}

static unsigned warp_grid(const moejit_model *m, int64_t items) {
  const int64_t per_block = m->spec.combine.block_threads / 32;
  return mj_tile_grid(m, (items + per_block - 1) / per_block);
}

static moejit_status launch_front(const moejit_model *m, const moejit_moe_args *a, void *ws,
                                  const mj_ep_layout *l, int32_t *ids, float *w,
                                  moejit_stream stream) {
  const mj_ep *ep = m->ep;
  const void *logits = NULL;
  moejit_status st = MOEJIT_OK;
  if (a->tokens > 0) /* no tokens: nothing to route */
    st = mj_moe_logits(m, a, AT(ws, l->logits), AT(ws, l->router_split), stream, &logits);
  moejit_route_args r = {.tokens = a->tokens,
                         .logits = logits,
                         .bias = a->route_bias,
                         .topk_ids = ids,
                         .topk_weights = w};
  if (!st && a->tokens > 0) st = moejit_route(m, &r, stream);
  if (st) return st;
  const int32_t *owner = ep->d_maps;
  void *mask = AT(ws, l->mask), *pos = AT(ws, l->pos), *counts = AT(ws, l->counts);
  void *dropped_by_rank = AT(ws, l->dropped_by_rank);
  int tokens = (int)a->tokens, capacity = (int)a->ep_capacity;
  const unsigned block[3] = {(unsigned)m->spec.combine.block_threads, 1, 1};
  const unsigned g_mask[3] = {mj_tile_grid(m, (a->tokens + block[0] - 1) / block[0]), 1, 1};
  void *p_mask[] = {&ids, &owner, &tokens, &mask};
  if (tokens > 0 && (st = mj_ctx_launch(m->ctx, m->ep_mask, g_mask, block, 0, stream, p_mask)))
    return st;
  const unsigned g_scan[3] = {(unsigned)ep->place.world, 1, 1}, b_scan[3] = {1024, 1, 1};
  void *p_scan[] = {&mask, &tokens, &capacity, &pos, &counts, &dropped_by_rank};
  return mj_ctx_launch(m->ctx, m->ep_scan, g_scan, b_scan, 0, stream, p_scan);
}

static moejit_status launch_pack(const moejit_model *m, const moejit_moe_args *a, void *ws,
                                 const mj_ep_layout *l, const ep_plan *pl, const int32_t *ids,
                                 const float *w, moejit_stream stream) {
  const mj_ep *ep = m->ep;
  const int32_t *owner = ep->d_maps, *local_index = owner + ep->place.experts;
  const void *x = a->x, *mask = AT(ws, l->mask), *pos = AT(ws, l->pos);
  const void *counts = AT(ws, l->counts), *dropped_by_rank = AT(ws, l->dropped_by_rank);
  void *send_x = AT(ws, l->send_x), *send_ids = AT(ws, l->send_ids), *send_w = AT(ws, l->send_w);
  void *recv_x = AT(ws, l->recv_x), *recv_ids = AT(ws, l->recv_ids), *recv_w = AT(ws, l->recv_w);
  int32_t *dropped = a->ep_dropped;
  int tokens = (int)a->tokens, world = ep->place.world, rank = ep->place.rank;
  int capacity = (int)a->ep_capacity, self_base = (int)pl->self_base;
  void *params[] = {&x,     &ids,      &w,        &owner,  &local_index, &mask,
                    &pos,   &counts,   &tokens,   &world,  &rank,        &capacity,
                    &self_base, &send_x, &send_ids, &send_w, &recv_x,   &recv_ids,
                    &recv_w, &dropped_by_rank, &dropped};
  const int64_t pad_rows = capacity > 0 ? (int64_t)world * capacity : 0;
  const int64_t per_block = m->spec.combine.block_threads;
  unsigned grid = warp_grid(m, a->tokens);
  const unsigned pad_grid = mj_tile_grid(m, (pad_rows + per_block - 1) / per_block);
  if (pad_grid > grid) grid = pad_grid;
  if (grid < 1) grid = 1; /* *dropped is written even without tokens */
  const unsigned g[3] = {grid, 1, 1}, block[3] = {(unsigned)per_block, 1, 1};
  return mj_ctx_launch(m->ctx, m->ep_pack, g, block, 0, stream, params);
}

static moejit_status launch_combine(const moejit_model *m, const moejit_moe_args *a, void *ws,
                                    const mj_ep_layout *l, const ep_plan *pl,
                                    moejit_stream stream) {
  const mj_ep *ep = m->ep;
  const void *partial = AT(ws, l->partial), *back = AT(ws, l->back);
  const void *mask = AT(ws, l->mask), *pos = AT(ws, l->pos), *counts = AT(ws, l->counts);
  int tokens = (int)a->tokens, world = ep->place.world, rank = ep->place.rank;
  int capacity = (int)a->ep_capacity, self_base = (int)pl->self_base;
  void *out = a->out;
  void *params[] = {&partial, &back,     &mask, &pos,      &counts,    &tokens,
                    &world,   &rank,     &capacity, &self_base, &out};
  const unsigned g[3] = {warp_grid(m, a->tokens), 1, 1};
  const unsigned block[3] = {(unsigned)m->spec.combine.block_threads, 1, 1};
  return mj_ctx_launch(m->ctx, m->ep_combine, g, block, 0, stream, params);
}

/* A call that failed once its exchanges began: the peers may wait on
 * transfers that never come, so the model refuses what follows and its
 * communicator is aborted (bounded; a caller's is left to the caller). */
static moejit_status exchanges_failed(const moejit_model *m, moejit_status st) {
  mj_ep_fail(m, st);
  (void)mj_ep_abort((mj_ep *)m->ep, MJ_EP_ABORT_WAIT_MS, NULL);
  return mj_model_fail(m, st);
}

static moejit_status forward_body(const moejit_model *m, const moejit_moe_args *a,
                                  moejit_stream stream, int *exchanging);

moejit_status mj_ep_forward(const moejit_model *m, const moejit_moe_args *a,
                            moejit_stream stream) {
  moejit_status st = check_args(m, a, stream);
  if (st) return st;
  if ((st = mj_ep_usable(m, op))) return mj_model_fail(m, st);
  int exchanging = 0;
  st = forward_body(m, a, stream, &exchanging);
  return st && exchanging ? exchanges_failed(m, st) : st;
}

/* The forward once its arguments are checked; *exchanging set once the
 * first exchange with peers is about to be enqueued for real (not with one
 * rank, which has no peers to leave waiting, nor into a graph capture,
 * where nothing runs yet). */
static moejit_status forward_body(const moejit_model *m, const moejit_moe_args *a,
                                  moejit_stream stream, int *exchanging) {
  moejit_status st;
  const mj_ep *ep = m->ep;
  const mj_ep_placement *p = &ep->place;
  const moejit_spec *s = &m->spec;
  void *ws = a->workspace;
  ep_plan pl;
  memset(&pl, 0, sizeof pl);
  mj_ep_layout l;
  if (a->ep_capacity > 0) {
    plan_capacity(p, a->ep_capacity, &pl);
    if ((st = layout(m, a->tokens, pl.send_rows, pl.recv_rows, &l))) return st;
    if ((st = workspace_fits(m, a, &l))) return st;
  } else {
    /* the front part only; the rest is sized once the counts are known */
    if ((st = layout(m, a->tokens, 0, 0, &l))) return st;
    if ((st = workspace_fits(m, a, &l))) return st;
  }
  int32_t *ids = a->topk_ids ? a->topk_ids : AT(ws, l.ids);
  float *w = a->topk_weights ? a->topk_weights : AT(ws, l.weights);
  if ((st = record(m, a, 0, stream))) return st;
  if ((st = launch_front(m, a, ws, &l, ids, w, stream))) return st;
  *exchanging = p->world > 1 && !mj_ctx_stream_capturing(m->ctx, stream);
  if (a->ep_capacity == 0) {
    int32_t counts[MOEJIT_EP_MAX_WORLD], recv[MOEJIT_EP_MAX_WORLD];
    if ((st = exchange_counts(m, ws, &l, counts, recv, stream))) return st;
    plan_exact(p, counts, recv, &pl);
    if ((st = check_rows(m, pl.recv_rows, "the rows routed to this rank"))) return st;
    if ((st = layout(m, a->tokens, pl.send_rows, pl.recv_rows, &l))) return st;
    /* the peers' sends are already agreed: failing here leaves them waiting
     * (docs/ep.md: size every rank's workspace for the largest T) */
    if ((st = workspace_fits(m, a, &l))) return st;
  }
  if ((st = launch_pack(m, a, ws, &l, &pl, ids, w, stream))) return st;
  if ((st = record(m, a, 1, stream))) return st;
  const size_t act = moejit_dtype_size(s->act_dtype), out = moejit_dtype_size(s->out_dtype);
  const size_t k = (size_t)s->top_k, d = (size_t)s->hidden;
  const ep_xfer there[3] = {{AT(ws, l.send_x), AT(ws, l.recv_x), d * act},
                            {AT(ws, l.send_ids), AT(ws, l.recv_ids), k * 4},
                            {AT(ws, l.send_w), AT(ws, l.recv_w), k * 4}};
  if ((st = exchange(m, &pl, there, 3, 0, "moejit_moe_forward: dispatch", stream))) return st;
  if ((st = record(m, a, 2, stream))) return st;
  if (pl.recv_rows > 0 &&
      (st = mj_moe_experts(ep->local, pl.recv_rows, AT(ws, l.recv_x), AT(ws, l.recv_ids),
                           AT(ws, l.recv_w), a->w1, a->w2, AT(ws, l.partial), AT(ws, l.local_ws),
                           l.local_ws_bytes, stream)))
    return st;
  if ((st = record(m, a, 3, stream))) return st;
  const ep_xfer back = {AT(ws, l.partial), AT(ws, l.back), d * out};
  if ((st = exchange(m, &pl, &back, 1, 1, "moejit_moe_forward: return", stream))) return st;
  if ((st = record(m, a, 4, stream))) return st;
  if (a->tokens > 0 && (st = launch_combine(m, a, ws, &l, &pl, stream))) return st;
  return record(m, a, 5, stream);
}

moejit_status moejit_ep_alltoall(const moejit_model *model, const void *send, void *recv,
                                 size_t bytes_per_rank, moejit_stream stream) {
  static const char fn[] = "moejit_ep_alltoall";
  moejit_status st = mj_ep_need(model, fn);
  if (st) return st;
  if (!send || !recv)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                                        !send ? "send" : "recv"));
  if ((st = mj_ep_usable(model, fn))) return mj_model_fail(model, st);
  if (bytes_per_rank == 0) return MOEJIT_OK;
  const mj_ep_placement *p = &model->ep->place;
  if (bytes_per_rank > SIZE_MAX / (size_t)p->world)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                        "%s: bytes_per_rank %zu times %d ranks overflows a size_t "
                                        "(send and recv hold bytes_per_rank bytes for each rank)",
                                        fn, bytes_per_rank, p->world));
  ep_plan pl;
  plan_one_each(p, &pl);
  const ep_xfer x = {send, recv, bytes_per_rank};
  if ((st = exchange(model, &pl, &x, 1, 0, fn, stream))) return exchanges_failed(model, st);
  const size_t self = (size_t)p->rank * bytes_per_rank;
  return moejit_memcpy_dtod(model->ctx, (char *)recv + self, (const char *)send + self,
                            bytes_per_rank, stream);
}
