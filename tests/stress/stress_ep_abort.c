/* Threads giving up on one expert-parallel communicator at once
 * (src/dist/ep_wait.c), for ThreadSanitizer (`make tsan`) and as a plain
 * test in `make test`; no GPU or NCCL needed: the NCCL table holds a
 * stand-in ncclCommAbort that takes 20 ms. Each round, four threads call
 * mj_ep_abort with bounds of 5 or 200 ms while two threads go in and out
 * of the door every NCCL call takes (mj_ep_comm_enter/leave); then the
 * model's state is freed while the abort's thread may still run. Checks:
 * one abort per round, the door shut after it, and no caller held longer
 * than its bound plus a margin. Exit 0 on success, 1 with what failed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"
#include "dist/ep.h"

enum { ROUNDS = 50, ABORTERS = 4, USERS = 2 };

static atomic_int aborts, failures;
static mj_nccl nccl;

static void fail(const char *what) {
  atomic_fetch_add(&failures, 1);
  fprintf(stderr, "stress_ep_abort: %s\n", what);
}

static mj_nccl_result slow_abort(mj_nccl_comm comm) {
  (void)comm;
  atomic_fetch_add(&aborts, 1);
  mj_sleep_us(20000);
  return MJ_NCCL_SUCCESS;
}

static void *user(void *arg) {
  mj_ep *ep = arg;
  for (int i = 0; i < 20000; i++)
    if (mj_ep_comm_enter(ep)) mj_ep_comm_leave(ep);
  return NULL;
}

typedef struct aborter_arg {
  mj_ep *ep;
  double bound_ms;
} aborter_arg;

static void *aborter(void *arg) {
  aborter_arg *a = arg;
  int hung = 0;
  const double t0 = mj_now_ms();
  if (mj_ep_abort(a->ep, a->bound_ms, &hung) != 1) fail("an owned communicator was not aborted");
  /* the bound, plus the second the abort lets calls inside leave, plus
   * a margin for a loaded machine */
  if (mj_now_ms() - t0 > a->bound_ms + 1000 + 2000) fail("a caller was held past its bound");
  if (mj_ep_comm_enter(a->ep)) fail("the door was open after the abort");
  (void)mj_ep_abort_pending(atomic_load(&a->ep->abort_job));
  return NULL;
}

int main(void) {
  nccl.CommAbort = slow_abort;
  for (int round = 0; round < ROUNDS; round++) {
    mj_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return 1;
    ep->nccl = &nccl;
    ep->comm = (mj_nccl_comm)&nccl;
    ep->owns_comm = 1;
    pthread_t u[USERS], a[ABORTERS];
    aborter_arg args[ABORTERS];
    for (int i = 0; i < USERS; i++) pthread_create(&u[i], NULL, user, ep);
    for (int i = 0; i < ABORTERS; i++) {
      args[i].ep = ep;
      args[i].bound_ms = (round + i) % 2 ? 5.0 : 200.0;
      pthread_create(&a[i], NULL, aborter, &args[i]);
    }
    for (int i = 0; i < ABORTERS; i++) pthread_join(a[i], NULL);
    for (int i = 0; i < USERS; i++) pthread_join(u[i], NULL);
    if (atomic_load(&ep->state) != MJ_EP_ABORTED) fail("the state is not ABORTED");
    mj_ep_abort_release(atomic_load(&ep->abort_job));
    free(ep); /* the abort's thread, if still running, holds the job only */
  }
  mj_sleep_us(300000); /* the last aborts return */
  if (atomic_load(&aborts) != ROUNDS) fail("not exactly one abort per round");
  const int f = atomic_load(&failures);
  printf(
      "stress_ep_abort: %d rounds of %d threads giving up with %d calls going in and out: "
      "%d aborts, %s\n",
      ROUNDS, ABORTERS, USERS, atomic_load(&aborts), f ? "FAILED" : "ok");
  return f ? 1 : 0;
}
