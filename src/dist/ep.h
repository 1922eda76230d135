/* Internal face of expert parallelism (moejit/ep.h, docs/ep.md): the
 * placement of experts on ranks, the buffer layout of one forward, and the
 * state an expert-parallel model keeps. Placement and layout are host
 * arithmetic, tested without a GPU. */
#ifndef MOEJIT_SRC_DIST_EP_H
#define MOEJIT_SRC_DIST_EP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/nccl.h"
#include "moejit/moejit.h"

/* The spec limit on experts (spec_check.c). */
#define MJ_EP_MAX_EXPERTS 1024

typedef struct mj_ep_placement {
  int world, rank, experts;
  int32_t owner[MJ_EP_MAX_EXPERTS];       /* rank of each expert */
  int32_t local_index[MJ_EP_MAX_EXPERTS]; /* its index among its owner's experts */
  int32_t per_rank[MOEJIT_EP_MAX_WORLD];  /* experts of each rank */
  int n_local;                            /* per_rank[rank] */
  int32_t local_experts[MJ_EP_MAX_EXPERTS]; /* this rank's, ascending */
} mj_ep_placement;

/* Places `experts` experts on `world` ranks: owner[E] (NULL: contiguous
 * ranges, rank r holding [r*E/W, (r+1)*E/W)). INVALID_ARGUMENT naming the
 * problem for world outside 1..MOEJIT_EP_MAX_WORLD, rank outside
 * 0..world-1, an owner outside 0..world-1, or a rank left without experts. */
moejit_status mj_ep_place(int experts, int world, int rank, const int32_t *owner,
                          mj_ep_placement *out);

/* The layer a rank computes: `global` with `n_local` experts (at least
 * top_k: spec validation asks top_k <= experts, and the extra experts of a
 * rank holding fewer than top_k simply receive no rows), softmax routing
 * (the local layer never routes) and nothing else changed. */
void mj_ep_local_spec(const moejit_spec *global, int n_local, moejit_spec *out);

/* Where each buffer of one expert-parallel forward lives in the workspace
 * (byte offsets, 256-byte aligned), for T tokens on this rank, `send_rows`
 * rows sent to peers, `recv_rows` rows computed here (received plus this
 * rank's own), and the local layer's workspace for recv_rows tokens. The
 * first part (route results, masks, positions, counts, the router's logits
 * when the forward computes them) depends on T and
 * world only: the exact mode fills it before it knows the row counts. */
typedef struct mj_ep_layout {
  int64_t tokens, send_rows, recv_rows;
  size_t ids, weights, mask, pos, counts, recv_counts, dropped_by_rank, logits, router_split;
  size_t head; /* end of the first part */
  size_t send_x, send_ids, send_w, recv_x, recv_ids, recv_w, partial, back, local_ws;
  size_t local_ws_bytes, total;
} mj_ep_layout;

moejit_status mj_ep_layout_for(const moejit_spec *spec, int world, int64_t tokens,
                               int64_t send_rows, int64_t recv_rows, size_t local_ws_bytes,
                               size_t router_split_bytes, mj_ep_layout *out);

/* Rows each rank sends and receives at most when every rank has at most
 * max_tokens tokens and the capacity (if any) is at most max_tokens. */
static inline int64_t mj_ep_max_rows(int world, int64_t max_tokens) {
  return (int64_t)world * max_tokens;
}

/* An ncclCommAbort running on a thread of its own (ep_wait.c). */
typedef struct mj_ep_abort_job mj_ep_abort_job;

/* The communicator's state (mj_ep.state): each step only ever goes up. */
enum {
  MJ_EP_OK = 0,
  MJ_EP_FAILED = 1,  /* failed: forwards refused; free aborts an owned comm */
  MJ_EP_ABORTED = 2, /* an owned comm was aborted: comm is gone */
};

/* What an expert-parallel model holds besides the router (moejit_model.ep). */
typedef struct mj_ep {
  mj_ep_placement place;
  const mj_nccl *nccl;
  mj_nccl_comm comm;
  int owns_comm;
  int nonblocking;                      /* the model made comm nonblocking */
  int timeout_ms;                       /* opts.ep.timeout_ms */
  atomic_int state;                     /* MJ_EP_OK, MJ_EP_FAILED, MJ_EP_ABORTED */
  atomic_int why_claimed;               /* 1 once a failure claimed `why` */
  atomic_int why_ready;                 /* 1 once `why` is written */
  moejit_status why_status;             /* the first failure's status */
  char why[512];                        /* and its message */
  atomic_int abort_claimed;             /* 1 once a thread started aborting the comm */
  atomic_int abort_done_here;           /* no job could be made: the abort ran inline */
  atomic_int users;                     /* calls inside NCCL on comm (mj_ep_comm_enter) */
  _Atomic(mj_ep_abort_job *) abort_job; /* the abort of an owned comm, once made */
  struct moejit_model *local; /* align, gemm1, gemm2, combine for the local experts */
  void *d_maps;               /* device: owner[E], then local_index[E] (int32) */
} mj_ep;

/* Loads an expert-parallel model (mj_model_load_with with opts->ep.world >
 * 0): placement, the router and ep kernels for the global spec, the local
 * layer for this rank's experts, device maps, then the communicator. */
moejit_status mj_ep_model_load(moejit_ctx *ctx, const moejit_spec *spec, const char *origin,
                               const moejit_load_opts *opts, struct moejit_model **out);

/* Frees what the model's ep holds (destroys an owned communicator, or
 * aborts it when the model failed or NCCL reports it broken). */
void mj_ep_free(moejit_ctx *ctx, mj_ep *ep);

/* ---- failure (ep_wait.c) --------------------------------------------------
 * A model whose exchange failed refuses its later forwards: its peers may
 * be waiting on transfers that never come, and NCCL leaves a communicator
 * undefined after an error. */

/* Marks the model failed with the thread's last error as the reason (the
 * first failure's reason is kept) and returns `st`. */
moejit_status mj_ep_fail(const struct moejit_model *m, moejit_status st);
/* MOEJIT_OK while the model has not failed and NCCL reports no error on
 * its communicator; otherwise fails it (aborting an owned communicator
 * NCCL reports broken) and returns the refusal, prefixed with `what`. */
moejit_status mj_ep_usable(const struct moejit_model *m, const char *what);
/* How long a caller waits for ncclCommAbort before it takes its thread
 * back (mj_ep_abort's wait_ms everywhere moejit aborts). */
#define MJ_EP_ABORT_WAIT_MS 5000.0

/* Aborts the communicator the model made, once, whichever thread asks
 * first: the state becomes MJ_EP_ABORTED (no call enters NCCL on it from
 * then on), calls already inside are let out (up to 1 s), and
 * ncclCommAbort runs on a thread of its own (within a node NCCL can wait
 * for a dead peer even to abort). Every caller then waits up to wait_ms
 * for it to return. 0 for a caller's communicator (nothing done); else 1,
 * with *hung (may be NULL) set when the abort had not returned. The model
 * must outlive the call; the abort's thread does not need it. */
int mj_ep_abort(mj_ep *ep, double wait_ms, int *hung);
/* ncclCommDestroy of a healthy communicator the model made, on a thread
 * of its own: within a node it waits for the peers to destroy theirs, for
 * ever when one died silently. Waits up to wait_ms (0: no limit); 1 when
 * it returned, 0 when it is still running (moejit_ep_pending_teardowns
 * counts it until it does). */
int mj_ep_destroy_comm(mj_ep *ep, double wait_ms);
/* Around every NCCL call on the communicator: 0 (nothing entered) once it
 * is being aborted; after 1, mj_ep_comm_leave. */
int mj_ep_comm_enter(mj_ep *ep);
void mj_ep_comm_leave(mj_ep *ep);
/* 1 while the job's ncclCommAbort has not returned (0 for NULL). */
int mj_ep_abort_pending(const mj_ep_abort_job *job);
void mj_ep_abort_release(mj_ep_abort_job *job);
/* After an NCCL call on the communicator returned ncclInProgress (a
 * nonblocking communicator: NCCL goes on in a thread of its own, and the
 * first exchange with a peer connects to it there): waits until
 * ncclCommGetAsyncError says the work is done, up to the model's
 * timeout_ms. On an error or past the limit the model fails, an owned
 * communicator is aborted (and, unless `stream` is being captured, what
 * NCCL put on it drained), and the status says why. */
moejit_status mj_ep_settle(const struct moejit_model *m, moejit_stream stream, const char *what);
/* moejit_model_ep_wait's body: `what` prefixes the messages. */
moejit_status mj_ep_wait(const struct moejit_model *m, moejit_stream stream, int timeout_ms,
                         const char *what);

/* INVALID_ARGUMENT for a NULL model, UNSUPPORTED (recorded on it) for one
 * loaded without opts.ep; `fn` names the public call. */
moejit_status mj_ep_need(const struct moejit_model *model, const char *fn);
/* moejit_moe_workspace_size and moejit_moe_forward of an ep model. */
moejit_status mj_ep_workspace_size(const struct moejit_model *m, int64_t max_tokens,
                                   size_t *bytes);
moejit_status mj_ep_forward(const struct moejit_model *m, const moejit_moe_args *a,
                            moejit_stream stream);

#endif
