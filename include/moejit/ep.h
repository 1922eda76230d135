/* moejit expert parallelism: one MoE layer spread over several GPUs, each
 * rank holding a share of the experts, tokens moved between ranks with NCCL
 * send/recv grouped as an all-to-all. Included by moejit/moejit.h before
 * layer.h (the load options and the forward's arguments carry the fields
 * below); the design, the buffer layouts and the launch recipes are in
 * docs/ep.md.
 *
 * NCCL is loaded at run time (libnccl.so.2, or $MOEJIT_NCCL_LIBRARY): the
 * library starts without it and only these calls need it; they return
 * MOEJIT_ERR_UNSUPPORTED with a hint when it is absent. */
#ifndef MOEJIT_EP_H
#define MOEJIT_EP_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most ranks one layer may span. */
#define MOEJIT_EP_MAX_WORLD 64

/* NCCL's unique id (ncclUniqueId, 128 bytes): made once by one process,
 * handed to every rank, used by each to join the communicator. */
typedef struct moejit_nccl_id {
  unsigned char bytes[128];
} moejit_nccl_id;

/* NCCL's version code (e.g. 22803 for 2.28.3). UNSUPPORTED (with what
 * failed and how to provide NCCL) when it cannot be loaded. */
MOEJIT_API moejit_status moejit_nccl_version(int *version);

/* A new unique id (ncclGetUniqueId). Call it in one process only. */
MOEJIT_API moejit_status moejit_nccl_unique_id(moejit_nccl_id *id);

/* The id as 256 lowercase hex digits plus NUL (cap >= 257), to pass through
 * an environment variable or a command line. Needs no NCCL. */
MOEJIT_API moejit_status moejit_nccl_id_format(const moejit_nccl_id *id, char *buf, size_t cap);

/* Parses 256 hex digits (either case; surrounding white space allowed).
 * INVALID_ARGUMENT naming the first bad character or the wrong length. */
MOEJIT_API moejit_status moejit_nccl_id_parse(const char *text, moejit_nccl_id *id);

/* Writes the id to `path` as hex, atomically (a temporary file renamed into
 * place), so a reader never sees half of it: the way ranks on several
 * machines share it through a shared file system. */
MOEJIT_API moejit_status moejit_nccl_id_write_file(const char *path, const moejit_nccl_id *id);

/* Reads an id written by moejit_nccl_id_write_file, waiting up to
 * timeout_ms for the file to appear (0: no wait). NOT_FOUND on timeout,
 * INVALID_ARGUMENT for a file that holds no id. */
MOEJIT_API moejit_status moejit_nccl_id_read_file(const char *path, int timeout_ms,
                                                  moejit_nccl_id *id);

/* How a model is spread over ranks: the `ep` member of moejit_load_opts.
 * All zero (the default): one GPU, no NCCL. */
typedef struct moejit_ep_opts {
  /* Ranks, 1..MOEJIT_EP_MAX_WORLD; 0: expert parallelism off. With a
   * caller's communicator, 0 or its size. */
  int world;
  int rank; /* this process's rank, 0..world-1 (with a communicator: its rank) */
  /* The communicator, exactly one of (both set is refused):
   *  - nccl_comm: an ncclComm_t the caller made and owns (moejit never
   *    destroys it); its device must be the ctx's device;
   *  - nccl_id: a unique id shared by all ranks; every rank's load then
   *    joins (ncclCommInitRank, which waits for all `world` ranks), and the
   *    model owns and destroys the communicator, blocking as NCCL's
   *    default is, or nonblocking with nonblocking_comm (see there).
   * A caller's communicator may be blocking or nonblocking; with a
   * nonblocking one, moejit waits for NCCL's background work after each
   * group of sends and receives (ncclInProgress) as the timeout says. */
  void *nccl_comm;
  const moejit_nccl_id *nccl_id;
  /* [spec.experts] owner rank of each expert (host memory, copied), or
   * NULL: contiguous ranges, rank r holding experts [r*E/W, (r+1)*E/W).
   * Every rank must own at least one expert. A rank's local experts are its
   * experts in increasing id order; its w1/w2 hold exactly those. */
  const int32_t *expert_owner;
  /* Longest a host wait on the ranks may take, in ms:
   *  - the load's join (with nccl_id; ncclCommInitRank waits until all
   *    `world` ranks have joined, counted from when this rank joins, after
   *    its own compile): a rank that never comes fails the load with
   *    MOEJIT_ERR_TIMEOUT;
   *  - the exact forward's wait for its count exchange inside
   *    moejit_moe_forward, and moejit_model_ep_wait with a negative
   *    timeout: past it the model fails (moejit_model_ep_wait says how);
   *  - with a nonblocking communicator, NCCL's background work after each
   *    group of sends and receives: the first exchange with a peer
   *    connects to it, which waits for that peer (a blocking communicator
   *    holds the host inside ncclGroupEnd meanwhile, with no limit); past
   *    the limit the call fails with MOEJIT_ERR_TIMEOUT and the model with
   *    it;
   *  - the teardown of a communicator the model made, at
   *    moejit_model_destroy: ncclCommDestroy waits within a node for every
   *    peer to destroy its own, for ever when one died. Past the limit the
   *    model is freed all the same and NCCL's destroy goes on on a thread
   *    of its own (moejit_ep_pending_teardowns). A nonblocking one's
   *    ncclCommFinalize comes first, polled within the limit (aborted,
   *    bounded, past it).
   * 0: no limit (NCCL's own behaviour: a peer that never answers is waited
   * for), though an error NCCL reports still ends a forward's wait. >= 0. */
  int timeout_ms;
  /* 1: make the communicator (with nccl_id) nonblocking
   * (ncclCommInitRankConfig with ncclConfig_t.blocking = 0; needs NCCL
   * 2.14 or newer, else the load fails with MOEJIT_ERR_UNSUPPORTED). Then
   * no NCCL call holds the host beyond timeout_ms: not the first
   * connection to a peer, which a blocking communicator makes inside
   * ncclGroupEnd with no limit, and not the teardown. The price, measured
   * with NCCL 2.28.3 on two H100s: about 0.19 ms more an exact forward
   * (a graph replay pays nothing). 0 (the default): blocking. docs/ep.md,
   * "Nonblocking communicators". */
  int nonblocking_comm;
} moejit_ep_opts;

/* What an expert-parallel model holds. */
typedef struct moejit_ep_info {
  int world, rank;
  int local_experts;     /* experts this rank computes */
  int owns_comm;         /* 1: the model made the communicator and destroys it */
  int nccl_version;
  int timeout_ms; /* opts.ep.timeout_ms of the load */
  /* 1 once the model has failed (an NCCL call failed, NCCL reported an
   * error, a wait timed out, or moejit_model_ep_abort): its forwards are
   * refused from then on, and moejit_last_error() of such a refusal says
   * what failed first. */
  int failed;
  /* 1 while the abort of the model's communicator has not returned: within
   * a node NCCL can wait for a dead peer even to free a communicator, for
   * ever. The model's calls return all the same, but the process should
   * end (tearing down CUDA under that abort is not safe): _exit rather
   * than exit. */
  int abort_pending;
  /* 1: the model made its communicator nonblocking
   * (moejit_ep_opts.nonblocking_comm); 0 for a blocking one or a caller's. */
  int nonblocking;
} moejit_ep_info;

/* INVALID_ARGUMENT for NULL; UNSUPPORTED for a model loaded without
 * opts.ep (single GPU). */
MOEJIT_API moejit_status moejit_model_ep_info(const moejit_model *model, moejit_ep_info *info);

/* The global ids of this rank's local experts, ascending (the order of the
 * expert dimension of its w1 and w2): writes min(n, cap) ids, *n = count. */
MOEJIT_API moejit_status moejit_model_ep_local_experts(const moejit_model *model, int32_t *ids,
                                                       size_t cap, int *n);

/* NCCL's own all-to-all over the model's communicator, as nccl-tests runs
 * it: to each rank r, bytes_per_rank bytes from send + r * bytes_per_rank,
 * received into recv + r * bytes_per_rank (grouped ncclSend/ncclRecv; this
 * rank's own block is a device copy). A utility, and the baseline the
 * dispatch is measured against. Enqueued on `stream`; every rank must call
 * it with the same size. */
MOEJIT_API moejit_status moejit_ep_alltoall(const moejit_model *model, const void *send,
                                            void *recv, size_t bytes_per_rank,
                                            moejit_stream stream);

/* Waits until the work enqueued on `stream` has finished, watching the
 * model's communicator meanwhile: the way to wait for an expert-parallel
 * forward, since a plain stream synchronize waits for ever when a peer has
 * died or stopped calling the forward. timeout_ms: the longest wait, 0 for
 * no limit, negative for the load's opts.ep.timeout_ms.
 *
 * OK once the stream is done. Otherwise the model fails, and:
 *  - MOEJIT_ERR_CUDA when NCCL reports an error on the communicator
 *    (ncclCommGetAsyncError: a peer that died, a network failure);
 *  - MOEJIT_ERR_TIMEOUT when timeout_ms passes first;
 *  - a CUDA error of the stream itself, as reported;
 *  - for a model that had failed already (an NCCL call's error, a timeout,
 *    moejit_model_ep_abort), the status of its first failure, after giving
 *    up on what is left on the stream as below.
 * A communicator the model made is then aborted (ncclCommAbort, which ends
 * NCCL's work on the stream; the wait lets the stream drain, up to 10 s,
 * and the message says if it did not). The abort runs on a thread of its
 * own and is waited for 5 s at most: within a node NCCL can wait for a
 * dead peer even to free a communicator, and then the message and
 * moejit_ep_info.abort_pending say that the process should end. A
 * caller's communicator (opts.ep.nccl_comm) is left to the caller: abort
 * it to end that work. Either way the model refuses every later forward;
 * destroy it and load it again on every rank. INVALID_ARGUMENT for NULL,
 * UNSUPPORTED for a model of one GPU. Thread-safe. */
MOEJIT_API moejit_status moejit_model_ep_wait(const moejit_model *model, moejit_stream stream,
                                              int timeout_ms);

/* Gives up on the model's exchanges, from any thread (for instance a
 * watchdog's, while another thread waits in moejit_model_ep_wait, in an
 * exact forward's wait, or in a stream synchronize): the model fails as
 * above, no call enters NCCL on its communicator any more, and one it made
 * is aborted (returning within 5 s, as above), which ends the waits on its
 * NCCL work. A caller's communicator is only marked: abort it yourself.
 * The model's later forwards are refused; destroy it, but not while this
 * or another of its calls is still running. OK also when it had failed
 * already. */
MOEJIT_API moejit_status moejit_model_ep_abort(const moejit_model *model);

/* NCCL teardowns of models' communicators (ncclCommAbort, ncclCommDestroy)
 * that moejit started on threads of their own and that have not returned
 * yet, in this process. moejit_model_destroy waits for a healthy model's
 * ncclCommDestroy up to opts.ep.timeout_ms, a failed one's abort up to
 * 5 s; within a node NCCL can wait for a peer that died for ever, so
 * either may still be running after. Nonzero: end the process with _exit
 * once done (destroying a ctx, or exit's CUDA teardown, under NCCL's
 * unfinished teardown is not safe). Thread-safe; needs nothing loaded. */
MOEJIT_API int moejit_ep_pending_teardowns(void);

/* Phase events an expert-parallel forward records when the caller passes
 * them (moejit_moe_args.ep_events, MOEJIT_EP_EVENTS of them):
 *   [0] start            [1] routed and packed  [2] dispatched (NCCL)
 *   [3] experts computed [4] results returned (NCCL)   [5] combined. */
#define MOEJIT_EP_EVENTS 6

#ifdef __cplusplus
}
#endif

#endif
