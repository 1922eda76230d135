/* Loading an expert-parallel model (src/dist/ep.h): the communicator
 * checked or created, the experts placed, the router and the ep kernels
 * built for the global spec, the rest of the layer for this rank's experts
 * only, and the placement maps put on the device. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "dist/ep.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

static const char op[] = "moejit_model_load (expert parallelism)";

/* A caller's communicator must be on the ctx's device; its size and rank
 * become the placement's (opts.ep.world/rank, when set, must agree). */
static moejit_status adopt_comm(moejit_ctx *ctx, const mj_nccl *n, const moejit_ep_opts *e,
                                int *world, int *rank) {
  mj_nccl_comm comm = (mj_nccl_comm)e->nccl_comm;
  int count = 0, me = 0, dev = -1;
  moejit_status st = mj_nccl_check(n, n->CommCount(comm, &count), comm, "ncclCommCount");
  if (!st) st = mj_nccl_check(n, n->CommUserRank(comm, &me), comm, "ncclCommUserRank");
  if (!st) st = mj_nccl_check(n, n->CommCuDevice(comm, &dev), comm, "ncclCommCuDevice");
  if (st) return mj_fail_prefix(st, "%s: opts.ep.nccl_comm", op);
  if (count < 1 || count > MOEJIT_EP_MAX_WORLD)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: the communicator (opts.ep.nccl_comm) has %d ranks; expert parallelism "
                   "takes 1..%d",
                   op, count, MOEJIT_EP_MAX_WORLD);
  if (e->world > 0 && e->world != count)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.world = %d, but the communicator has %d ranks; HINT: leave "
                   "world 0 to take the communicator's size",
                   op, e->world, count);
  if (e->world > 0 && e->rank != me)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.rank = %d, but this process is rank %d of the communicator", op,
                   e->rank, me);
  moejit_device_info info;
  if ((st = moejit_ctx_device_info(ctx, &info))) return st;
  if (dev != info.ordinal)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: the communicator is on device %d, the ctx on device %d; HINT: create the "
                   "ctx (moejit_ctx_opts.device) on the communicator's device",
                   op, dev, info.ordinal);
  *world = count, *rank = me;
  return MOEJIT_OK;
}

/* One report for the whole layer: the router, then the local layer's
 * families, then the ep kernels. */
static void merge_reports(moejit_load_report *r, const moejit_load_report *global,
                          const moejit_load_report *local, double t_start) {
  *r = *global;
  r->n_kernels = 0;
  const moejit_load_report *parts[3] = {global, local, global};
  for (int p = 0; p < 3; p++)
    for (int i = 0; i < parts[p]->n_kernels && r->n_kernels < MOEJIT_LOAD_MAX_KERNELS; i++) {
      const int is_ep = !strcmp(parts[p]->kernels[i].kernel, "ep");
      if (p == 0 && is_ep) continue;    /* ep goes last */
      if (p == 2 && !is_ep) continue;
      r->kernels[r->n_kernels++] = parts[p]->kernels[i];
    }
  r->cache_hits = global->cache_hits + local->cache_hits;
  r->cache_misses = global->cache_misses + local->cache_misses;
  r->compile_ms = global->compile_ms + local->compile_ms;
  r->load_ms = global->load_ms + local->load_ms;
  r->total_ms = mj_now_ms() - t_start;
}

static moejit_status upload_maps(moejit_ctx *ctx, mj_ep *ep) {
  const size_t E = (size_t)ep->place.experts, bytes = 2 * E * sizeof(int32_t);
  moejit_status st = moejit_mem_alloc(ctx, bytes, NULL, &ep->d_maps);
  if (st) return st;
  int32_t *host = malloc(bytes);
  if (!host) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  memcpy(host, ep->place.owner, E * sizeof(int32_t));
  memcpy(host + E, ep->place.local_index, E * sizeof(int32_t));
  st = moejit_memcpy_htod(ctx, ep->d_maps, host, bytes, NULL);
  if (!st) st = moejit_ctx_synchronize(ctx);
  free(host);
  return st;
}

/* ncclCommInitRank waits until all `world` ranks have joined, with no
 * limit of its own, and NCCL connects to a peer only at the first exchange
 * with it, where ncclGroupEnd blocks the host until the peer connects too
 * (for ever, if it died in between). So the join runs on a thread of its
 * own and ends with one 4-byte exchange with every peer, which makes those
 * connections: the load waits for both up to opts.ep.timeout_ms (0: no
 * limit), and a forward's first exchange finds its peers connected. A rank
 * that never comes, or never connects, then fails the load with TIMEOUT
 * instead of holding it (or the first forward) for ever. Should the thread
 * finish after that after all, it aborts the communicator nobody took. The
 * job is freed by whichever of the two lets go last. */
typedef struct join_job {
  const mj_nccl *nccl;
  const mj_driver *d;
  CUdevice dev; /* the thread makes its primary context current: NCCL takes that GPU */
  int world, rank;
  mj_nccl_unique_id id;
  pthread_mutex_t mu;
  mj_nccl_comm comm;
  moejit_status status; /* of the join; with msg, what failed */
  char msg[512];
  int connecting; /* 1 once ncclCommInitRank returned: the exchange with the peers */
  int done, abandoned, refs;
} join_job;

static void join_release(join_job *j) {
  pthread_mutex_lock(&j->mu);
  const int last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static int join_abandoned(join_job *j) {
  pthread_mutex_lock(&j->mu);
  const int a = j->abandoned;
  pthread_mutex_unlock(&j->mu);
  return a;
}

/* The status of a failed step, its message kept in the job (the thread's
 * own error record is not the loader's). */
static moejit_status join_keep(join_job *j, moejit_status st) {
  if (st) snprintf(j->msg, sizeof j->msg, "%s", moejit_last_error());
  return st;
}

/* The exchange's stream and buffer. */
typedef struct join_link {
  CUstream s;
  CUdeviceptr buf;
} join_link;

static void join_link_free(const mj_driver *d, join_link *l) {
  if (l->s) (void)d->StreamSynchronize(l->s); /* after an abort too: its kernels have ended */
  if (l->buf) (void)d->MemFree(l->buf);
  if (l->s) (void)d->StreamDestroy(l->s);
}

/* One int32 to and from every peer on a stream of its own, waited for by
 * polling, so that a load that gave up (abandoned) or an error NCCL
 * reports ends the wait: MOEJIT_ERR_TIMEOUT when abandoned. */
static moejit_status join_connect(join_job *j, mj_nccl_comm comm, join_link *l) {
  const mj_driver *d = j->d;
  const mj_nccl *n = j->nccl;
  const size_t words = 2 * (size_t)j->world;
  moejit_status st = mj_cu_check(d->StreamCreate(&l->s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  if (!st) st = mj_cu_check(d->MemAlloc(&l->buf, words * sizeof(int32_t)), "cuMemAlloc");
  if (!st)
    st = mj_cu_check(d->MemsetD32Async(l->buf, (unsigned)j->rank, words, l->s), "cuMemsetD32Async");
  if (!st) st = mj_nccl_check(n, n->GroupStart(), comm, "ncclGroupStart");
  if (!st) {
    int32_t *send = (int32_t *)(uintptr_t)l->buf, *recv = send + j->world;
    const mj_nccl_stream s = (mj_nccl_stream)l->s;
    for (int p = 0; p < j->world && !st; p++) {
      if (p == j->rank) continue;
      st = mj_nccl_check(n, n->Send(send + p, 1, MJ_NCCL_INT32, p, comm, s), comm, "ncclSend");
      if (!st)
        st = mj_nccl_check(n, n->Recv(recv + p, 1, MJ_NCCL_INT32, p, comm, s), comm, "ncclRecv");
    }
    const moejit_status end = mj_nccl_check(n, n->GroupEnd(), comm, "ncclGroupEnd");
    if (!st) st = end;
  }
  while (!st) {
    const CUresult q = d->StreamQuery(l->s);
    if (q == CUDA_SUCCESS) break;
    if (q != CUDA_ERROR_NOT_READY) {
      st = mj_cu_check(q, "cuStreamQuery");
      break;
    }
    mj_nccl_result async = MJ_NCCL_SUCCESS;
    st = mj_nccl_check(n, n->CommGetAsyncError(comm, &async), comm, "ncclCommGetAsyncError");
    if (!st && async != MJ_NCCL_SUCCESS && async != MJ_NCCL_IN_PROGRESS)
      st = mj_nccl_check(n, async, comm, "the communicator is broken (ncclCommGetAsyncError)");
    if (!st && join_abandoned(j)) st = mj_fail(MOEJIT_ERR_TIMEOUT, "the load gave up waiting");
    if (!st) mj_sleep_us(100);
  }
  return join_keep(j, st);
}

/* ncclCommInitRank, then the exchange with the peers, with the device's
 * primary context retained and current (the ctx may be destroyed
 * meanwhile, after a timeout). A communicator whose exchange failed is
 * aborted here, which ends what the exchange left on its stream. */
static moejit_status join_now(join_job *j, mj_nccl_comm *comm) {
  CUcontext cu = NULL, popped;
  const int retained = j->d->DevicePrimaryCtxRetain(&cu, j->dev) == CUDA_SUCCESS;
  const int pushed = retained && j->d->CtxPushCurrent(cu) == CUDA_SUCCESS;
  moejit_status st =
      join_keep(j, mj_nccl_check(j->nccl, j->nccl->CommInitRank(comm, j->world, j->id, j->rank),
                                 NULL, "ncclCommInitRank"));
  if (!st && j->world > 1) {
    pthread_mutex_lock(&j->mu);
    j->connecting = 1;
    pthread_mutex_unlock(&j->mu);
    join_link l = {0};
    st = join_connect(j, *comm, &l);
    if (st) {
      (void)j->nccl->CommAbort(*comm);
      *comm = NULL;
    }
    join_link_free(j->d, &l);
  }
  if (pushed) (void)j->d->CtxPopCurrent(&popped);
  if (retained) (void)j->d->DevicePrimaryCtxRelease(j->dev);
  return st;
}

static void *join_thread(void *arg) {
  join_job *j = arg;
  mj_nccl_comm comm = NULL;
  const moejit_status st = join_now(j, &comm);
  pthread_mutex_lock(&j->mu);
  j->done = 1, j->comm = comm, j->status = st;
  const int abandoned = j->abandoned;
  pthread_mutex_unlock(&j->mu);
  if (abandoned && !st && comm) (void)j->nccl->CommAbort(comm);
  join_release(j);
  return NULL;
}

static moejit_status join_comm(moejit_ctx *ctx, mj_ep *ep, const moejit_nccl_id *id) {
  join_job *j = calloc(1, sizeof *j);
  if (!j) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  j->nccl = ep->nccl, j->d = mj_ctx_driver(ctx), j->dev = mj_ctx_device(ctx);
  j->world = ep->place.world, j->rank = ep->place.rank;
  memcpy(j->id.internal, id->bytes, sizeof j->id.internal);
  j->refs = 2;
  pthread_mutex_init(&j->mu, NULL);
  if (!mj_thread_detached(join_thread, j)) { /* no thread to spare: join here, however long */
    j->status = join_now(j, &j->comm);
    j->done = 1, j->refs = 1;
  }
  const double t0 = mj_now_ms();
  int done = 0, connecting = 0;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    done = j->done, connecting = j->connecting;
    if (!done && ep->timeout_ms > 0 && mj_now_ms() - t0 >= ep->timeout_ms) j->abandoned = 1;
    const int abandoned = j->abandoned;
    pthread_mutex_unlock(&j->mu);
    if (done || abandoned) break;
    mj_sleep_us(200);
  }
  const mj_nccl_comm comm = j->comm;
  const moejit_status st = j->status;
  char msg[sizeof j->msg];
  memcpy(msg, j->msg, sizeof msg);
  join_release(j);
  const int peers = ep->place.world - 1;
  if (!done && !connecting)
    return mj_fail(MOEJIT_ERR_TIMEOUT,
                   "%s: joining the communicator as rank %d of %d: not every rank joined within "
                   "%d ms (opts.ep.timeout_ms); HINT: start all %d ranks with the same id (a rank "
                   "that failed or was never started leaves the others waiting)",
                   op, ep->place.rank, ep->place.world, ep->timeout_ms, ep->place.world);
  if (!done)
    return mj_fail(MOEJIT_ERR_TIMEOUT,
                   "%s: rank %d of %d joined the communicator, but the first exchange with its "
                   "%d peer%s (where NCCL connects to them) did not finish within %d ms "
                   "(opts.ep.timeout_ms); HINT: a peer may have died or hung during its load; "
                   "start every rank again",
                   op, ep->place.rank, ep->place.world, peers, peers == 1 ? "" : "s",
                   ep->timeout_ms);
  if (st && connecting)
    return mj_fail(st, "%s: rank %d of %d: the first exchange with the peers: %s", op,
                   ep->place.rank, ep->place.world, msg);
  if (st)
    return mj_fail(st, "%s: joining the communicator as rank %d of %d: %s", op, ep->place.rank,
                   ep->place.world, msg);
  ep->comm = comm;
  ep->owns_comm = 1;
  return MOEJIT_OK;
}

void mj_ep_free(moejit_ctx *ctx, mj_ep *ep) {
  if (!ep) return;
  /* an aborted communicator is gone already, or going (ep_wait.c) */
  if (ep->comm && ep->owns_comm && !atomic_load(&ep->abort_claimed)) {
    if (mj_ctx_enter(ctx) == MOEJIT_OK) {
      /* after a failure, or an error NCCL found on its own (a peer that
       * died), ncclCommDestroy would wait for the peers: abort instead,
       * bounded (it may wait for a dead peer too) */
      mj_nccl_result async = MJ_NCCL_SUCCESS;
      const int failed = atomic_load(&ep->state) != MJ_EP_OK ||
                         ep->nccl->CommGetAsyncError(ep->comm, &async) != MJ_NCCL_SUCCESS ||
                         (async != MJ_NCCL_SUCCESS && async != MJ_NCCL_IN_PROGRESS);
      if (failed)
        (void)mj_ep_abort(ep, MJ_EP_ABORT_WAIT_MS, NULL);
      else
        ep->nccl->CommDestroy(ep->comm);
      mj_ctx_leave(ctx);
    }
  }
  mj_ep_abort_release(atomic_load(&ep->abort_job));
  if (ep->d_maps) moejit_mem_free(ctx, ep->d_maps, NULL);
  moejit_model_destroy(ep->local);
  free(ep);
}

static moejit_status load_parts(moejit_ctx *ctx, const moejit_spec *spec, const char *origin,
                                const moejit_load_opts *opts, mj_ep *ep, moejit_model **global) {
  moejit_load_opts inner = *opts;
  memset(&inner.ep, 0, sizeof inner.ep);
  moejit_load_report rg, rl;
  memset(&rg, 0, sizeof rg);
  memset(&rl, 0, sizeof rl);
  const double t0 = mj_now_ms();
  inner.report = &rg;
  moejit_status st = mj_model_load_with(ctx, spec, MJ_OPS_ROUTE | MJ_OPS_EP, origin, &inner, global);
  if (!st) {
    moejit_spec local;
    mj_ep_local_spec(spec, ep->place.n_local, &local);
    inner.report = &rl;
    st = mj_model_load_with(ctx, &local, MJ_OPS_LAYER & ~MJ_OPS_ROUTE, origin, &inner, &ep->local);
  }
  moejit_load_report merged;
  merge_reports(&merged, &rg, &rl, t0);
  if (*global) (*global)->report = merged;
  if (opts->report) *opts->report = merged;
  return st;
}

/* What opts.ep says on its own, checked before NCCL is loaded: a bad
 * option is INVALID_ARGUMENT whether or not NCCL is there. */
static moejit_status check_ep_opts(const moejit_spec *spec, const moejit_ep_opts *e) {
  if (e->world < 0 || e->world > MOEJIT_EP_MAX_WORLD)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.world = %d (allowed 1..%d ranks, or 0 with opts.ep.nccl_comm to "
                   "take the communicator's size)",
                   op, e->world, MOEJIT_EP_MAX_WORLD);
  if (e->nccl_comm && e->nccl_id)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: both opts.ep.nccl_comm and opts.ep.nccl_id are set; HINT: pass your "
                   "ncclComm_t, or an id for moejit to create one with, not both",
                   op);
  if (!e->nccl_comm && !e->nccl_id)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.world = %d but neither opts.ep.nccl_comm nor opts.ep.nccl_id is "
                   "set; HINT: pass your ncclComm_t, or a unique id from moejit_nccl_unique_id "
                   "shared by all ranks",
                   op, e->world);
  if (e->timeout_ms < 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.timeout_ms = %d (the longest wait on the other ranks, in ms; 0 for "
                   "no limit)",
                   op, e->timeout_ms);
  if (e->nccl_comm && e->world == 0) return MOEJIT_OK; /* the communicator's size and rank */
  mj_ep_placement place;                               /* world, rank and expert_owner as given */
  moejit_status st = mj_ep_place(spec->experts, e->world, e->rank, e->expert_owner, &place);
  return st ? mj_fail_prefix(st, "%s", op) : MOEJIT_OK;
}

moejit_status mj_ep_model_load(moejit_ctx *ctx, const moejit_spec *spec, const char *origin,
                               const moejit_load_opts *opts, moejit_model **out) {
  const double t_start = mj_now_ms();
  const moejit_ep_opts *e = &opts->ep;
  moejit_status st = check_ep_opts(spec, e); /* the report: zeroed by mj_model_load_with */
  if (st) return mj_ctx_fail(ctx, st);
  const mj_nccl *n = NULL;
  if ((st = mj_nccl_get(&n))) return mj_ctx_fail(ctx, mj_fail_prefix(st, "%s", op));
  int world = e->world, rank = e->rank;
  if (e->nccl_comm && (st = adopt_comm(ctx, n, e, &world, &rank))) return mj_ctx_fail(ctx, st);
  mj_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op));
  ep->nccl = n;
  ep->timeout_ms = e->timeout_ms;
  moejit_model *m = NULL;
  st = mj_ep_place(spec->experts, world, rank, e->expert_owner, &ep->place);
  if (st) st = mj_fail_prefix(st, "%s", op);
  if (!st) st = load_parts(ctx, spec, origin, opts, ep, &m);
  if (!st) st = upload_maps(ctx, ep);
  if (!st && e->nccl_comm) ep->comm = (mj_nccl_comm)e->nccl_comm;
  if (!st && !e->nccl_comm) st = join_comm(ctx, ep, e->nccl_id);
  if (st) {
    mj_ep_free(ctx, ep);
    moejit_model_destroy(m);
    return mj_ctx_fail(ctx, st);
  }
  m->ep = ep;
  m->report.total_ms = mj_now_ms() - t_start;
  if (opts->report) opts->report->total_ms = m->report.total_ms;
  *out = m;
  return MOEJIT_OK;
}

/* ---- public queries ----------------------------------------------------- */

moejit_status mj_ep_need(const moejit_model *model, const char *fn) {
  if (!model) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
  if (!model->ep)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                                        "%s: the model was loaded for one GPU (no opts.ep)", fn));
  return MOEJIT_OK;
}

moejit_status moejit_model_ep_info(const moejit_model *model, moejit_ep_info *info) {
  moejit_status st = mj_ep_need(model, "moejit_model_ep_info");
  if (st) return st;
  if (!info) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_ep_info: info is NULL");
  const mj_ep *ep = model->ep;
  memset(info, 0, sizeof *info);
  info->world = ep->place.world;
  info->rank = ep->place.rank;
  info->local_experts = ep->place.n_local;
  info->owns_comm = ep->owns_comm;
  info->nccl_version = ep->nccl->version;
  info->timeout_ms = ep->timeout_ms;
  info->failed = atomic_load(&((mj_ep *)ep)->state) != MJ_EP_OK;
  info->abort_pending = mj_ep_abort_pending(atomic_load(&((mj_ep *)ep)->abort_job));
  return MOEJIT_OK;
}

moejit_status moejit_model_ep_local_experts(const moejit_model *model, int32_t *ids, size_t cap,
                                            int *n) {
  moejit_status st = mj_ep_need(model, "moejit_model_ep_local_experts");
  if (st) return st;
  if (!n || (!ids && cap))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_ep_local_experts: %s is NULL",
                   !n ? "n" : "ids");
  const mj_ep_placement *p = &model->ep->place;
  for (size_t i = 0; i < cap && i < (size_t)p->n_local; i++) ids[i] = p->local_experts[i];
  *n = p->n_local;
  return MOEJIT_OK;
}
