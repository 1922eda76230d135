/* Waiting on an expert-parallel model's exchanges, and giving up on them
 * (moejit_model_ep_wait, moejit_model_ep_abort; docs/ep.md, "When one rank
 * fails"). NCCL has no timeout of its own: a peer that dies mid-exchange
 * leaves this rank's NCCL kernels waiting for ever, and a stream
 * synchronize with them. The wait here polls the stream and the
 * communicator's asynchronous error instead, and past the model's time
 * limit (or on an error) aborts a communicator the model made, which ends
 * those kernels. A failed model refuses its later forwards. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "dist/ep.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

/* The stream is polled without sleeping, yielding the core between polls
 * (as cuStreamSynchronize does by default): a sleep would add its length to
 * every exact forward, whose count exchange takes tens of µs. The
 * communicator's error and the clock are checked every EP_CHECK_MS. */
#define EP_CHECK_MS 1.0
/* How often a drain polls the stream. */
#define EP_POLL_US 200
/* After an abort, how long the stream gets to drain. */
#define EP_DRAIN_MS 10000.0
/* How long an abort may take before the caller gets its thread back. */
#define EP_ABORT_WAIT_MS 5000.0

/* What to do about a failed model: load again, or, while NCCL's abort of
 * its communicator has not returned, end the process. */
static const char *hint_for(mj_ep *ep) {
  return mj_ep_abort_pending(atomic_load(&ep->abort_job))
             ? "HINT: end this process (_exit: tearing CUDA down under NCCL's unfinished abort "
               "is not safe) and start every rank again"
             : "HINT: destroy the model and load it again on every rank";
}

static void sleep_us(long us) {
  const struct timespec ts = {0, us * 1000L};
  nanosleep(&ts, NULL);
}

static mj_ep *ep_of(const moejit_model *m) {
  return (mj_ep *)m->ep;
}

/* Keeps the first failure's status and message; later ones are dropped. */
static void keep_reason(mj_ep *ep, moejit_status st, const char *msg) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&ep->why_claimed, &expected, 1)) return;
  ep->why_status = st;
  snprintf(ep->why, sizeof ep->why, "%s", msg);
  atomic_store(&ep->why_ready, 1);
}

static void mark_failed(mj_ep *ep, moejit_status st, const char *msg) {
  keep_reason(ep, st, msg);
  int expected = MJ_EP_OK;
  atomic_compare_exchange_strong(&ep->state, &expected, MJ_EP_FAILED);
}

moejit_status mj_ep_fail(const moejit_model *m, moejit_status st) {
  char msg[sizeof ep_of(m)->why];
  snprintf(msg, sizeof msg, "%s", moejit_last_error());
  mark_failed(ep_of(m), st, msg);
  return st;
}

/* ncclCommAbort on a thread of its own. NCCL raises the communicator's
 * abort flag first, which ends its kernels, but then frees the
 * communicator, and within a node that can wait for the peers, for ever
 * when one died (NVIDIA/nccl issues 863, 1777): the caller gets its thread
 * back after EP_ABORT_WAIT_MS all the same. The job is freed by whichever
 * of the two lets go last. */
struct mj_ep_abort_job {
  const mj_nccl *nccl;
  mj_nccl_comm comm;
  atomic_int done, refs;
};

void mj_ep_abort_release(mj_ep_abort_job *j) {
  if (j && atomic_fetch_sub(&j->refs, 1) == 1) free(j);
}

int mj_ep_abort_pending(const mj_ep_abort_job *j) {
  return j && !atomic_load(&((mj_ep_abort_job *)j)->done);
}

static void *abort_thread(void *arg) {
  mj_ep_abort_job *j = arg;
  j->nccl->CommAbort(j->comm);
  atomic_store(&j->done, 1);
  mj_ep_abort_release(j);
  return NULL;
}

int mj_ep_abort_comm(const mj_nccl *nccl, mj_nccl_comm comm, mj_ep_abort_job **keep) {
  if (keep) *keep = NULL;
  mj_ep_abort_job *j = calloc(1, sizeof *j);
  pthread_t t;
  pthread_attr_t attr;
  int started = 0;
  if (j && pthread_attr_init(&attr) == 0) {
    j->nccl = nccl, j->comm = comm;
    atomic_store(&j->refs, keep ? 3 : 2); /* the thread, this call, the keeper */
    started = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
              pthread_create(&t, &attr, abort_thread, j) == 0;
    pthread_attr_destroy(&attr);
  }
  if (!started) { /* no thread to spare: abort here, however long it takes */
    free(j);
    nccl->CommAbort(comm);
    return 1;
  }
  const double t0 = mj_now_ms();
  while (!atomic_load(&j->done) && mj_now_ms() - t0 < EP_ABORT_WAIT_MS) sleep_us(EP_POLL_US);
  const int done = atomic_load(&j->done);
  if (keep) *keep = j;
  mj_ep_abort_release(j);
  return done;
}

/* Aborts a communicator the model made, once (the thread that moves the
 * state to ABORTED does). 1 when it was aborted (now or before), 0 for a
 * caller's communicator; *hung set when ncclCommAbort has not returned. */
static int abort_owned(const moejit_model *m, int *hung) {
  mj_ep *ep = ep_of(m);
  if (hung) *hung = 0;
  if (!ep->owns_comm || !ep->comm) return 0;
  int s = atomic_load(&ep->state);
  while (s != MJ_EP_ABORTED)
    if (atomic_compare_exchange_weak(&ep->state, &s, MJ_EP_ABORTED)) {
      mj_ep_abort_job *job = NULL;
      const int returned = mj_ep_abort_comm(ep->nccl, ep->comm, &job);
      atomic_store(&ep->abort_job, job);
      if (hung) *hung = !returned;
      break;
    }
  return 1;
}

/* The refusal of a failed model: the first failure's status and reason. */
static moejit_status refusal(const moejit_model *m, const char *what) {
  const mj_ep *ep = ep_of(m);
  const int ready = atomic_load(&((mj_ep *)ep)->why_ready);
  return mj_fail(ready ? ep->why_status : MOEJIT_ERR_CUDA,
                 "%s: the model's exchanges failed earlier, so it runs no more (%s); %s", what,
                 ready ? ep->why : "another thread is recording why", hint_for((mj_ep *)ep));
}

/* 1 with the failure recorded when NCCL reports an error on the
 * communicator (the caller gives up on it). */
static int nccl_reports_error(const moejit_model *m, const char *what) {
  mj_ep *ep = ep_of(m);
  if (!ep->comm || atomic_load(&ep->state) == MJ_EP_ABORTED) return 0;
  mj_nccl_result async = MJ_NCCL_SUCCESS;
  const mj_nccl_result r = ep->nccl->CommGetAsyncError(ep->comm, &async);
  if (r == MJ_NCCL_SUCCESS && (async == MJ_NCCL_SUCCESS || async == MJ_NCCL_IN_PROGRESS)) return 0;
  moejit_status st =
      mj_nccl_check(ep->nccl, r != MJ_NCCL_SUCCESS ? r : async, ep->comm, "ncclCommGetAsyncError");
  st = mj_fail_prefix(st, "%s: the communicator is broken", what);
  mark_failed(ep, st, moejit_last_error());
  return 1;
}

moejit_status mj_ep_usable(const moejit_model *m, const char *what) {
  if (atomic_load(&ep_of(m)->state) != MJ_EP_OK) return refusal(m, what);
  if (!nccl_reports_error(m, what)) return MOEJIT_OK;
  abort_owned(m, NULL); /* nothing of this call is on a stream yet */
  return refusal(m, what);
}

/* cuStreamQuery: 1 done, 0 not yet, -1 a CUDA error (recorded as *st). */
static int stream_done(const moejit_model *m, moejit_stream stream, moejit_status *st) {
  const mj_driver *d = mj_ctx_driver(m->ctx);
  if ((*st = mj_ctx_enter(m->ctx))) return -1;
  const CUresult r = d->StreamQuery((CUstream)stream);
  mj_ctx_leave(m->ctx);
  if (r == CUDA_SUCCESS) return 1;
  if (r == CUDA_ERROR_NOT_READY) return 0;
  *st = mj_cu_check(r, "cuStreamQuery");
  return -1;
}

/* Gives up on the exchanges of a failed model: aborts a communicator it
 * made, then lets NCCL's ended work and what follows it on `stream` run
 * out. What to say about it (a static string). */
static const char *give_up(const moejit_model *m, moejit_stream stream) {
  int hung = 0;
  if (!abort_owned(m, &hung))
    return "the communicator is the caller's: abort it (ncclCommAbort) to end the NCCL work "
           "still on the stream";
  const double t0 = mj_now_ms();
  moejit_status st;
  int done;
  while ((done = stream_done(m, stream, &st)) == 0 && mj_now_ms() - t0 < EP_DRAIN_MS)
    sleep_us(EP_POLL_US);
  if (done != 1)
    return done == 0 ? "the communicator was aborted, but the stream had not drained 10 s later"
                     : "the communicator was aborted, and the stream then failed";
  return hung ? "the communicator was aborted and its work on the stream ended, but "
                "ncclCommAbort had not returned 5 s later (NCCL can wait for a dead peer even to "
                "free a communicator)"
              : "the communicator was aborted";
}

moejit_status mj_ep_wait(const moejit_model *m, moejit_stream stream, int timeout_ms,
                         const char *what) {
  mj_ep *ep = ep_of(m);
  /* a model that failed before refuses; an error NCCL reports from here on
   * is this wait's to tell (below) */
  if (atomic_load(&ep->state) != MJ_EP_OK) return refusal(m, what);
  moejit_status st;
  const double t0 = mj_now_ms();
  double checked = t0;
  for (;;) {
    const int done = stream_done(m, stream, &st);
    if (done < 0) return st;
    if (atomic_load(&ep->state) != MJ_EP_OK) {
      /* another thread gave up (moejit_model_ep_abort): its abort ends
       * the NCCL work, so the stream drains */
      if (!done) give_up(m, stream);
      return refusal(m, what);
    }
    if (done) return MOEJIT_OK;
    const double now = mj_now_ms(), waited = now - t0;
    if (now - checked < EP_CHECK_MS) {
      sched_yield();
      continue;
    }
    checked = now;
    if (nccl_reports_error(m, what)) {
      const char *after = give_up(m, stream);
      return mj_fail(ep->why_status, "%s; %s; %s", ep->why, after, hint_for(ep));
    }
    if (timeout_ms > 0 && waited >= timeout_ms) {
      mj_fail(MOEJIT_ERR_TIMEOUT,
              "%s: the exchanges with the peer ranks did not finish within %d ms (a peer may "
              "have died, hung or stopped calling the forward)",
              what, timeout_ms);
      mj_ep_fail(m, MOEJIT_ERR_TIMEOUT);
      const char *after = give_up(m, stream);
      return mj_fail(MOEJIT_ERR_TIMEOUT, "%s; %s; %s", ep->why, after, hint_for(ep));
    }
    sched_yield();
  }
}

moejit_status moejit_model_ep_wait(const moejit_model *model, moejit_stream stream,
                                   int timeout_ms) {
  static const char fn[] = "moejit_model_ep_wait";
  moejit_status st = mj_ep_need(model, fn);
  if (st) return st;
  st = mj_ep_wait(model, stream, timeout_ms < 0 ? model->ep->timeout_ms : timeout_ms, fn);
  return st ? mj_model_fail(model, st) : MOEJIT_OK;
}

moejit_status moejit_model_ep_abort(const moejit_model *model) {
  moejit_status st = mj_ep_need(model, "moejit_model_ep_abort");
  if (st) return st;
  mj_ep *ep = ep_of(model);
  mark_failed(ep, MOEJIT_ERR_CUDA,
              ep->owns_comm ? "moejit_model_ep_abort gave up on the exchanges and aborted the "
                              "communicator"
                            : "moejit_model_ep_abort gave up on the exchanges (the communicator "
                              "is the caller's to abort)");
  abort_owned(model, NULL);
  return MOEJIT_OK;
}
