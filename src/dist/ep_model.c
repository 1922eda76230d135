/* Loading an expert-parallel model (src/dist/ep.h): the communicator
 * checked or created, the experts placed, the router and the ep kernels
 * built for the global spec, the rest of the layer for this rank's experts
 * only, and the placement maps put on the device. */
#include <pthread.h>
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
 * limit of its own. It runs on a thread of its own, waited for up to
 * opts.ep.timeout_ms (0: no limit): a rank that never comes then fails the
 * load with TIMEOUT instead of holding it for ever. Should the ranks all
 * join after that after all, the thread aborts the communicator nobody
 * took. A nonblocking join (ncclCommInitRankConfig, blocking = 0) returns
 * at once and is polled on that thread, which aborts it as soon as the
 * waiter gives up. The job is freed by whichever of the two lets go
 * last. */
typedef struct join_job {
  const mj_nccl *nccl;
  const mj_driver *d;
  CUdevice dev; /* the thread makes its primary context current: NCCL takes that GPU */
  int world, rank, nonblocking;
  mj_nccl_unique_id id;
  pthread_mutex_t mu;
  double give_up_at; /* joining here, without a thread: the time limit (0: none) */
  mj_nccl_comm comm;
  mj_nccl_result result;
  int done, abandoned, aborted, refs;
} join_job;

static void join_release(join_job *j) {
  pthread_mutex_lock(&j->mu);
  const int last = --j->refs == 0;
  pthread_mutex_unlock(&j->mu);
  if (!last) return;
  pthread_mutex_destroy(&j->mu);
  free(j);
}

/* Polls a nonblocking communicator's state (mj_nccl_state) every 200 µs
 * while NCCL's thread works, until it ends, `deadline` (mj_now_ms; 0:
 * none) passes, or stop(arg) (stop may be NULL) says to; the last state,
 * ncclInProgress when it stopped early. */
static mj_nccl_result poll_state(const mj_nccl *n, mj_nccl_comm comm, double deadline,
                                 int (*stop)(void *), void *arg) {
  for (;;) {
    const mj_nccl_result r = mj_nccl_state(n, comm);
    if (r != MJ_NCCL_IN_PROGRESS || (deadline > 0 && mj_now_ms() >= deadline) ||
        (stop && stop(arg)))
      return r;
    mj_sleep_us(200);
  }
}

static int join_abandoned(void *arg) {
  join_job *j = arg;
  pthread_mutex_lock(&j->mu);
  const int v = j->abandoned;
  pthread_mutex_unlock(&j->mu);
  return v;
}

/* A nonblocking join: ncclCommInitRankConfig returns at once, and NCCL's
 * thread goes on until every rank has joined. Polled until it ends, or
 * aborted once the waiter gives up (*aborted set, no communicator). */
static mj_nccl_result join_nonblocking(join_job *j, mj_nccl_comm *comm, int *aborted) {
  mj_nccl_config c;
  mj_nccl_config_nonblocking(&c);
  mj_nccl_result r = j->nccl->CommInitRankConfig(comm, j->world, j->id, j->rank, &c);
  if (r == MJ_NCCL_IN_PROGRESS && *comm) {
    r = poll_state(j->nccl, *comm, j->give_up_at, join_abandoned, j);
    *aborted = r == MJ_NCCL_IN_PROGRESS;
  }
  /* a join that failed or was given up still holds a communicator */
  if (r != MJ_NCCL_SUCCESS && *comm) {
    (void)j->nccl->CommAbort(*comm);
    *comm = NULL;
  }
  return r;
}

/* With the device's primary context retained and current for the call:
 * the ctx may be destroyed meanwhile (after a timeout). */
static mj_nccl_result join_now(join_job *j, mj_nccl_comm *comm, int *aborted) {
  CUcontext cu = NULL, popped;
  const int retained = j->d->DevicePrimaryCtxRetain(&cu, j->dev) == CUDA_SUCCESS;
  const int pushed = retained && j->d->CtxPushCurrent(cu) == CUDA_SUCCESS;
  const mj_nccl_result r = j->nonblocking ? join_nonblocking(j, comm, aborted)
                                          : j->nccl->CommInitRank(comm, j->world, j->id, j->rank);
  if (pushed) (void)j->d->CtxPopCurrent(&popped);
  if (retained) (void)j->d->DevicePrimaryCtxRelease(j->dev);
  return r;
}

static void *join_thread(void *arg) {
  join_job *j = arg;
  mj_nccl_comm comm = NULL;
  int aborted = 0;
  const mj_nccl_result r = join_now(j, &comm, &aborted);
  pthread_mutex_lock(&j->mu);
  j->done = 1, j->comm = comm, j->result = r, j->aborted = aborted;
  const int abandoned = j->abandoned;
  pthread_mutex_unlock(&j->mu);
  if (abandoned && r == MJ_NCCL_SUCCESS && comm) (void)j->nccl->CommAbort(comm);
  join_release(j);
  return NULL;
}

static moejit_status join_comm(moejit_ctx *ctx, mj_ep *ep, const moejit_nccl_id *id) {
  join_job *j = calloc(1, sizeof *j);
  if (!j) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  j->nccl = ep->nccl, j->d = mj_ctx_driver(ctx), j->dev = mj_ctx_device(ctx);
  j->world = ep->place.world, j->rank = ep->place.rank, j->nonblocking = ep->nonblocking;
  memcpy(j->id.internal, id->bytes, sizeof j->id.internal);
  j->refs = 2;
  pthread_mutex_init(&j->mu, NULL);
  const double t0 = mj_now_ms();
  if (!mj_thread_detached(join_thread, j)) {
    /* no thread to spare: join here (a blocking join however long) */
    if (ep->timeout_ms > 0) j->give_up_at = t0 + ep->timeout_ms;
    j->result = join_now(j, &j->comm, &j->aborted);
    j->done = 1, j->refs = 1;
  }
  int done = 0;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    done = j->done;
    if (!done && ep->timeout_ms > 0 && mj_now_ms() - t0 >= ep->timeout_ms) j->abandoned = 1;
    const int abandoned = j->abandoned;
    pthread_mutex_unlock(&j->mu);
    if (done || abandoned) break;
    mj_sleep_us(200);
  }
  const mj_nccl_comm comm = j->comm;
  const mj_nccl_result r = j->result;
  const int aborted = j->aborted;
  join_release(j);
  if (!done || aborted)
    return mj_fail(MOEJIT_ERR_TIMEOUT,
                   "%s: joining the communicator as rank %d of %d: not every rank joined within "
                   "%d ms (opts.ep.timeout_ms); HINT: start all %d ranks with the same id (a rank "
                   "that failed or was never started leaves the others waiting)",
                   op, ep->place.rank, ep->place.world, ep->timeout_ms, ep->place.world);
  moejit_status st = mj_nccl_check(ep->nccl, r, NULL,
                                   ep->nonblocking ? "ncclCommInitRankConfig" : "ncclCommInitRank");
  if (st)
    return mj_fail_prefix(st, "%s: joining the communicator as rank %d of %d", op,
                          ep->place.rank, ep->place.world);
  ep->comm = comm;
  ep->owns_comm = 1;
  return MOEJIT_OK;
}

/* A healthy communicator's teardown. A nonblocking one is finalized first
 * (its work flushed in NCCL's thread, polled up to opts.ep.timeout_ms; one
 * that fails or has not ended by then is aborted instead, bounded). Then
 * ncclCommDestroy, which within a node waits for every peer to destroy
 * its own (measured with NCCL 2.28.3, finalize or not), runs on a thread
 * of its own, waited for up to opts.ep.timeout_ms (0: no limit): past that
 * the model is freed all the same, and moejit_ep_pending_teardowns tells
 * the process that NCCL has not returned. */
static void teardown(mj_ep *ep) {
  if (!ep->nonblocking) {
    (void)mj_ep_destroy_comm(ep, ep->timeout_ms);
    return;
  }
  mj_nccl_result r = ep->nccl->CommFinalize(ep->comm);
  if (r == MJ_NCCL_IN_PROGRESS)
    r = poll_state(ep->nccl, ep->comm, ep->timeout_ms > 0 ? mj_now_ms() + ep->timeout_ms : 0, NULL,
                   NULL);
  if (r == MJ_NCCL_SUCCESS)
    (void)mj_ep_destroy_comm(ep, ep->timeout_ms);
  else
    (void)mj_ep_abort(ep, MJ_EP_ABORT_WAIT_MS, NULL);
}

void mj_ep_free(moejit_ctx *ctx, mj_ep *ep) {
  if (!ep) return;
  /* an aborted communicator is gone already, or going (ep_wait.c) */
  if (ep->comm && ep->owns_comm && !atomic_load(&ep->abort_claimed)) {
    if (mj_ctx_enter(ctx) == MOEJIT_OK) {
      /* after a failure, or an error NCCL found on its own (a peer that
       * died), ncclCommDestroy would wait for the peers: abort instead,
       * bounded (it may wait for a dead peer too) */
      const int failed =
          atomic_load(&ep->state) != MJ_EP_OK || mj_nccl_broken(mj_nccl_state(ep->nccl, ep->comm));
      if (failed)
        (void)mj_ep_abort(ep, MJ_EP_ABORT_WAIT_MS, NULL);
      else
        teardown(ep);
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
  if (e->nonblocking_comm != 0 && e->nonblocking_comm != 1)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.nonblocking_comm = %d (0: a blocking communicator, 1: a "
                   "nonblocking one)",
                   op, e->nonblocking_comm);
  if (e->nccl_comm && e->nonblocking_comm)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: opts.ep.nonblocking_comm is set with opts.ep.nccl_comm; HINT: it chooses "
                   "how moejit makes a communicator (with nccl_id); yours is as you made it "
                   "(ncclConfig_t.blocking), and moejit waits for a nonblocking one either way",
                   op);
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
  if (e->nonblocking_comm && !mj_nccl_has_nonblocking(n)) {
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_UNSUPPORTED,
                     "%s: opts.ep.nonblocking_comm needs NCCL 2.14 or newer "
                     "(ncclCommInitRankConfig, ncclCommFinalize); this NCCL is %d.%d.%d; HINT: "
                     "install a newer NCCL, or leave nonblocking_comm 0",
                     op, n->version / 10000, n->version / 100 % 100, n->version % 100));
  }
  mj_ep *ep = calloc(1, sizeof *ep);
  if (!ep) return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op));
  ep->nccl = n;
  ep->timeout_ms = e->timeout_ms;
  ep->nonblocking = e->nonblocking_comm;
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
  info->nonblocking = ep->nonblocking;
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
