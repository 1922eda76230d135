/* Waiting on an expert-parallel model's exchanges, and giving up on them
 * (moejit_model_ep_wait, moejit_model_ep_abort; docs/ep.md, "When one rank
 * fails"). NCCL has no timeout of its own: a peer that dies mid-exchange
 * leaves this rank's NCCL kernels waiting for ever, and a stream
 * synchronize with them. The wait here polls the stream and the
 * communicator's asynchronous error instead, and past the model's time
 * limit (or on an error) aborts a communicator the model made, which ends
 * those kernels. A failed model refuses its later forwards. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
/* How long an abort lets calls inside NCCL on the communicator leave. */
#define EP_USERS_WAIT_MS 1000.0

/* What to do about a failed model: load again, or, while NCCL's abort of
 * its communicator has not returned, end the process. */
static const char *hint_for(mj_ep *ep) {
  return mj_ep_abort_pending(atomic_load(&ep->abort_job))
             ? "HINT: end this process (_exit: tearing CUDA down under NCCL's unfinished abort "
               "is not safe) and start every rank again"
             : "HINT: destroy the model and load it again on every rank";
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

/* Fails the model with the message just recorded (moejit_last_error()),
 * kept in msg[cap] for the caller's own message. */
static void fail_with_last(mj_ep *ep, moejit_status st, char *msg, size_t cap) {
  snprintf(msg, cap, "%s", moejit_last_error());
  mark_failed(ep, st, msg);
}

moejit_status mj_ep_fail(const moejit_model *m, moejit_status st) {
  char msg[sizeof ep_of(m)->why];
  fail_with_last(ep_of(m), st, msg, sizeof msg);
  return st;
}

/* ncclCommAbort (or, for a healthy teardown, ncclCommDestroy) on a thread
 * of its own. NCCL raises the communicator's abort flag first, which ends
 * its kernels, but then frees the communicator, and within a node that
 * can wait for the peers, for ever when one died (NVIDIA/nccl issues 863,
 * 1777; a destroy waits for them too): the callers get their threads back
 * after a bound all the same. The job is shared by the
 * model (mj_ep.abort_job) and the thread, and freed by whichever lets go
 * last; the thread touches nothing else, so the model may go first. */
struct mj_ep_abort_job {
  const mj_nccl *nccl;
  mj_nccl_comm comm;
  int destroy;        /* ncclCommDestroy (a healthy teardown) instead */
  atomic_int done;    /* ncclCommAbort (or Destroy) returned */
  atomic_int overdue; /* a wait ran out: later waits do not wait again */
  atomic_int refs;
};

void mj_ep_abort_release(mj_ep_abort_job *j) {
  if (j && atomic_fetch_sub(&j->refs, 1) == 1) free(j);
}

int mj_ep_abort_pending(const mj_ep_abort_job *j) {
  return j && !atomic_load(&((mj_ep_abort_job *)j)->done);
}

/* Teardowns (jobs) started and not yet returned, in this process. */
static atomic_int teardowns_running;

int moejit_ep_pending_teardowns(void) {
  return atomic_load(&teardowns_running);
}

static void *abort_thread(void *arg) {
  mj_ep_abort_job *j = arg;
  if (j->destroy)
    j->nccl->CommDestroy(j->comm);
  else
    j->nccl->CommAbort(j->comm);
  atomic_store(&j->done, 1);
  atomic_fetch_sub(&teardowns_running, 1);
  mj_ep_abort_release(j);
  return NULL;
}

/* Starts the job's thread (which takes a reference), or, with no thread to
 * spare, runs it here, however long that takes. */
static void job_start(mj_ep_abort_job *j) {
  atomic_fetch_add(&j->refs, 1);
  atomic_fetch_add(&teardowns_running, 1);
  if (!mj_thread_detached(abort_thread, j)) abort_thread(j);
}

/* 1 once the abort returned, waiting up to wait_ms (not at all once an
 * earlier wait ran out). */
static int job_wait(mj_ep_abort_job *j, double wait_ms) {
  const double t0 = mj_now_ms();
  while (!atomic_load(&j->done) && !atomic_load(&j->overdue)) {
    if (mj_now_ms() - t0 >= wait_ms) {
      atomic_store(&j->overdue, 1);
      break;
    }
    mj_sleep_us(EP_POLL_US);
  }
  return atomic_load(&j->done);
}

int mj_ep_destroy_comm(mj_ep *ep, double wait_ms) {
  mj_ep_abort_job *j = calloc(1, sizeof *j);
  if (!j) { /* no memory for a job: destroy here, however long it takes */
    ep->nccl->CommDestroy(ep->comm);
    return 1;
  }
  j->nccl = ep->nccl, j->comm = ep->comm, j->destroy = 1;
  atomic_store(&j->refs, 1); /* this call's */
  job_start(j);
  const int done = job_wait(j, wait_ms > 0 ? wait_ms : 1e300);
  mj_ep_abort_release(j);
  return done;
}

int mj_ep_comm_enter(mj_ep *ep) {
  atomic_fetch_add(&ep->users, 1);
  if (!atomic_load(&ep->abort_claimed)) return 1;
  atomic_fetch_sub(&ep->users, 1);
  return 0;
}

void mj_ep_comm_leave(mj_ep *ep) {
  atomic_fetch_sub(&ep->users, 1);
}

int mj_ep_abort(mj_ep *ep, double wait_ms, int *hung) {
  if (hung) *hung = 0;
  if (!ep->owns_comm || !ep->comm) return 0;
  const double t0 = mj_now_ms();
  int expected = 0;
  if (atomic_compare_exchange_strong(&ep->abort_claimed, &expected, 1)) {
    atomic_store(&ep->state, MJ_EP_ABORTED);
    /* no new call enters NCCL on the communicator now; let those inside
     * leave first (enqueues take microseconds; a call blocked inside NCCL
     * is what the abort may end, so it is not waited for long) */
    while (atomic_load(&ep->users) > 0 && mj_now_ms() - t0 < EP_USERS_WAIT_MS)
      mj_sleep_us(EP_POLL_US);
    mj_ep_abort_job *j = calloc(1, sizeof *j);
    if (!j) { /* no memory for a job: abort here, however long it takes */
      ep->nccl->CommAbort(ep->comm);
      atomic_store(&ep->abort_done_here, 1);
      return 1;
    }
    j->nccl = ep->nccl, j->comm = ep->comm;
    atomic_store(&j->refs, 1); /* the model's */
    atomic_store(&ep->abort_job, j);
    job_start(j);
  }
  /* whoever started it, wait on the job (published right after the claim) */
  mj_ep_abort_job *j;
  while (!(j = atomic_load(&ep->abort_job)) && !atomic_load(&ep->abort_done_here)) {
    if (mj_now_ms() - t0 >= wait_ms) {
      if (hung) *hung = 1;
      return 1;
    }
    mj_sleep_us(EP_POLL_US);
  }
  const double left = wait_ms - (mj_now_ms() - t0);
  const int done = !j || job_wait(j, left > 0 ? left : 0);
  if (hung) *hung = !done;
  return 1;
}

/* The model's owned communicator aborted (see mj_ep_abort). */
static int abort_owned(const moejit_model *m, int *hung) {
  return mj_ep_abort(ep_of(m), MJ_EP_ABORT_WAIT_MS, hung);
}

/* The refusal of a failed model: the first failure's status and reason. */
static moejit_status refusal(const moejit_model *m, const char *what) {
  const mj_ep *ep = ep_of(m);
  const int ready = atomic_load(&((mj_ep *)ep)->why_ready);
  return mj_fail(ready ? ep->why_status : MOEJIT_ERR_CUDA,
                 "%s: the model's exchanges failed earlier, so it runs no more (%s); %s", what,
                 ready ? ep->why : "another thread is recording why", hint_for((mj_ep *)ep));
}

/* The communicator's state (mj_nccl_state), asked through the door
 * (mj_ep_comm_enter): 0 when it is being aborted (nothing asked), else 1
 * with *state set and, when that is an error, the model failed with it
 * (its status in *st, its message in msg[cap]). */
static int comm_state(const moejit_model *m, const char *what, mj_nccl_result *state,
                      moejit_status *st, char *msg, size_t cap) {
  mj_ep *ep = ep_of(m);
  if (!mj_ep_comm_enter(ep)) return 0;
  *state = mj_nccl_state(ep->nccl, ep->comm);
  const int broken = mj_nccl_broken(*state);
  if (broken) *st = mj_nccl_check(ep->nccl, *state, ep->comm, "ncclCommGetAsyncError");
  mj_ep_comm_leave(ep);
  if (broken) {
    *st = mj_fail_prefix(*st, "%s: the communicator is broken", what);
    fail_with_last(ep, *st, msg, cap);
  }
  return 1;
}

/* 1 with the failure recorded (its status in *st, its message in
 * msg[cap]) when NCCL reports an error on the communicator; the caller
 * gives up on it. */
static int nccl_reports_error(const moejit_model *m, const char *what, moejit_status *st, char *msg,
                              size_t cap) {
  mj_nccl_result state = MJ_NCCL_SUCCESS;
  return ep_of(m)->comm && comm_state(m, what, &state, st, msg, cap) && mj_nccl_broken(state);
}

moejit_status mj_ep_usable(const moejit_model *m, const char *what) {
  if (atomic_load(&ep_of(m)->state) != MJ_EP_OK) return refusal(m, what);
  moejit_status st;
  char msg[sizeof ep_of(m)->why];
  if (!nccl_reports_error(m, what, &st, msg, sizeof msg)) return MOEJIT_OK;
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
 * out (not a stream being captured: nothing of it runs). What to say
 * about it (a static string). */
static const char *give_up(const moejit_model *m, moejit_stream stream) {
  int hung = 0;
  if (!abort_owned(m, &hung))
    return "the communicator is the caller's: abort it (ncclCommAbort) to end the NCCL work "
           "still on the stream";
  if (mj_ctx_stream_capturing(m->ctx, stream))
    return hung ? "the communicator was aborted, but ncclCommAbort had not returned 5 s later"
                : "the communicator was aborted";
  const double t0 = mj_now_ms();
  moejit_status st;
  int done;
  while ((done = stream_done(m, stream, &st)) == 0 && mj_now_ms() - t0 < EP_DRAIN_MS)
    mj_sleep_us(EP_POLL_US);
  if (done != 1)
    return done == 0 ? "the communicator was aborted, but the stream had not drained 10 s later"
                     : "the communicator was aborted, and the stream then failed";
  return hung ? "the communicator was aborted and its work on the stream ended, but "
                "ncclCommAbort had not returned 5 s later (NCCL can wait for a dead peer even to "
                "free a communicator)"
              : "the communicator was aborted";
}

/* The failure just recorded (st, msg) with what giving up on it did, and
 * what to do next. */
static moejit_status give_up_on(const moejit_model *m, moejit_stream stream, moejit_status st,
                                const char *msg) {
  const char *after = give_up(m, stream);
  return mj_fail(st, "%s; %s; %s", msg, after, hint_for(ep_of(m)));
}

moejit_status mj_ep_wait(const moejit_model *m, moejit_stream stream, int timeout_ms,
                         const char *what) {
  mj_ep *ep = ep_of(m);
  char msg[sizeof ep->why];
  if (atomic_load(&ep->state) != MJ_EP_OK) {
    /* it failed before (an NCCL call's error, another thread's abort):
     * give up on what it left on the stream, then refuse */
    give_up(m, stream);
    return refusal(m, what);
  }
  moejit_status st;
  const double t0 = mj_now_ms();
  double checked = t0;
  for (;;) {
    const int done = stream_done(m, stream, &st);
    if (done < 0) { /* the context is broken: so is every exchange on it */
      fail_with_last(ep, st, msg, sizeof msg);
      return st;
    }
    if (atomic_load(&ep->state) != MJ_EP_OK) {
      /* another thread gave up meanwhile (moejit_model_ep_abort) */
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
    if (nccl_reports_error(m, what, &st, msg, sizeof msg)) return give_up_on(m, stream, st, msg);
    if (timeout_ms > 0 && waited >= timeout_ms) {
      mj_fail(MOEJIT_ERR_TIMEOUT,
              "%s: the exchanges with the peer ranks did not finish within %d ms (a peer may "
              "have died, hung or stopped calling the forward)",
              what, timeout_ms);
      fail_with_last(ep, MOEJIT_ERR_TIMEOUT, msg, sizeof msg);
      return give_up_on(m, stream, MOEJIT_ERR_TIMEOUT, msg);
    }
    sched_yield();
  }
}

moejit_status mj_ep_settle(const moejit_model *m, moejit_stream stream, const char *what) {
  mj_ep *ep = ep_of(m);
  char msg[sizeof ep->why];
  const double t0 = mj_now_ms();
  for (;;) {
    mj_nccl_result state;
    moejit_status st;
    if (atomic_load(&ep->state) != MJ_EP_OK || !comm_state(m, what, &state, &st, msg, sizeof msg))
      return refusal(m, what); /* another thread gave up meanwhile */
    if (state == MJ_NCCL_SUCCESS) return MOEJIT_OK;
    if (state == MJ_NCCL_IN_PROGRESS) {
      const double waited = mj_now_ms() - t0;
      if (ep->timeout_ms <= 0 || waited < ep->timeout_ms) {
        /* NCCL's thread enqueues in tens of µs once connected (polled
         * yielding the core: a busy poll starves that thread); a first
         * connection takes longer, and is polled less often */
        if (waited < 5.0)
          sched_yield();
        else
          mj_sleep_us(EP_POLL_US);
        continue;
      }
      st = mj_fail(MOEJIT_ERR_TIMEOUT,
                   "%s: NCCL had not finished enqueuing the exchange %d ms later (the first "
                   "exchange with a peer connects to it, which waits for the peer: a peer may "
                   "have died, hung or not reached this exchange)",
                   what, ep->timeout_ms);
      fail_with_last(ep, st, msg, sizeof msg);
    }
    return give_up_on(m, stream, st, msg);
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
