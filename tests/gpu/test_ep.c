/* Expert parallelism on a GPU (docs/ep.md).
 *  - One rank, library calls: the expert-parallel forward (exact and fixed
 *    capacity, eager and graph-captured) gives bit for bit the single-GPU
 *    layer's output (its unfused chain) at T = 1, 37, 256, 4096; a capacity below T drops and
 *    counts exactly the tokens past it; a rank with T = 0 runs.
 *  - Bad options and arguments are refused before anything waits on a peer.
 *  - A peer that never answers (a stand-in NCCL whose sends and receives
 *    block the stream until the communicator is aborted): the exact
 *    forward's wait and moejit_model_ep_wait give up after the time limit
 *    or on NCCL's error, abort a communicator the model made (never a
 *    caller's), and the model refuses what follows; moejit_model_ep_abort
 *    from another thread ends a wait without a limit.
 *  - Several ranks (one process per GPU, through `moejit run --ep N`, which
 *    checks each rank against the one-GPU layer on the same inputs and a
 *    float64 reference): deepseek-v3 and qwen3-30b-a3b at T = 1, 256, 4096
 *    per rank, with uniform routing, every token on one rank's experts,
 *    and a rank without tokens. Skipped where fewer GPUs exist.
 * Skips without a GPU or without NCCL, saying which. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "dist/nccl.h"
#include "layer_gpu.h"
#include "runtime/runtime.h"
#include "ops_gpu.h"
#include "test_support.h"

TestSuite(ep, .timeout = 1800);

static void require_gpu_and_nccl(void) {
  OPS_REQUIRE_GPU();
  int v = 0;
  if (moejit_nccl_version(&v) != MOEJIT_OK) cr_skip_test("no NCCL: %s", moejit_last_error());
}

static int device_count(void) {
  int n = 0;
  OPS_OK(moejit_device_count(&n));
  return n;
}

/* ---- one rank, library calls -------------------------------------------- */

typedef struct one_rank {
  moejit_model *ep, *single;
  const moejit_spec *s;
  lg_weights w;
  lg_periodic px;
  void *x, *logits, *out, *ws_ep, *ws_1, *dropped;
  void *gate, *rl; /* the router's weight [E, d]; logits it gives [max_t, E] */
  size_t ws_ep_bytes, ws_1_bytes;
  int64_t max_t;
} one_rank;

static moejit_model *load_ep(const char *preset, int world, int rank, const moejit_nccl_id *id,
                             const int32_t *owner, moejit_status expect) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.ep.world = world;
  o.ep.rank = rank;
  o.ep.nccl_id = id;
  o.ep.expert_owner = owner;
  moejit_model *m = NULL;
  moejit_status st = moejit_model_load_config(ops_ctx(), preset, &o, &m);
  cr_assert_eq(st, expect, "load %s world %d rank %d: %s", preset, world, rank,
               moejit_last_error());
  return m;
}

static void one_rank_make(one_rank *r, const char *preset, int64_t max_t) {
  memset(r, 0, sizeof *r);
  moejit_nccl_id id;
  OPS_OK(moejit_nccl_unique_id(&id));
  r->ep = load_ep(preset, 1, 0, &id, NULL, MOEJIT_OK);
  OPS_OK(moejit_model_load_config(ops_ctx(), preset, NULL, &r->single));
  r->s = moejit_model_spec(r->single);
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(r->ep, &info));
  cr_assert_eq(info.world, 1);
  cr_assert_eq(info.local_experts, r->s->experts);
  cr_assert_eq(info.owns_comm, 1);
  moejit_load_report rep;
  OPS_OK(moejit_model_load_report(r->ep, &rep));
  cr_assert_eq(rep.n_kernels, 6, "route, align, gemm1, gemm2, combine, ep: %d", rep.n_kernels);
  cr_assert_str_eq(rep.kernels[5].kernel, "ep");
  ts_rng rng = ts_rng_fresh("ep_one_rank");
  lg_weights_make(&r->w, r->s, &rng);
  lg_periodic_make(&r->px, r->s->act_dtype, 1.0, &rng);
  r->max_t = max_t;
  const size_t d = (size_t)r->s->hidden;
  r->x = ops_alloc((size_t)max_t * d * moejit_dtype_size(r->s->act_dtype));
  lg_periodic_fill(&r->px, r->x, (size_t)max_t * d);
  float *l = malloc(sizeof(float) * (size_t)max_t * r->s->experts);
  for (int64_t i = 0; i < max_t * r->s->experts; i++) l[i] = 4.0f * ts_normal(&rng);
  cr_assert_eq(r->s->logits_dtype, MOEJIT_DTYPE_FP32, "the presets route in fp32");
  r->logits = ops_alloc(sizeof(float) * (size_t)max_t * r->s->experts);
  ops_upload(r->logits, l, sizeof(float) * (size_t)max_t * r->s->experts);
  free(l);
  r->out = ops_alloc((size_t)max_t * d * moejit_dtype_size(r->s->out_dtype));
  OPS_OK(moejit_moe_workspace_size(r->ep, max_t, &r->ws_ep_bytes));
  OPS_OK(moejit_moe_workspace_size(r->single, max_t, &r->ws_1_bytes));
  r->ws_ep = ops_alloc(r->ws_ep_bytes);
  r->ws_1 = ops_alloc(r->ws_1_bytes);
  r->dropped = ops_alloc(4);
  lg_periodic gate;
  lg_periodic_make(&gate, r->s->weight_dtype, 0.05, &rng);
  const size_t ge = (size_t)r->s->experts * d;
  r->gate = ops_alloc(ge * moejit_dtype_size(r->s->weight_dtype));
  lg_periodic_fill(&gate, r->gate, ge);
  lg_periodic_free(&gate);
  r->rl = ops_alloc(sizeof(float) * (size_t)max_t * r->s->experts);
}

static void one_rank_free(one_rank *r) {
  void *b[] = {r->x, r->logits, r->out, r->ws_ep, r->ws_1, r->dropped, r->gate, r->rl};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) ops_free(b[i]);
  lg_weights_free(&r->w);
  lg_periodic_free(&r->px);
  moejit_model_destroy(r->ep);
  moejit_model_destroy(r->single);
}

static moejit_moe_args args_for(const one_rank *r, int ep, int64_t t, int64_t capacity) {
  moejit_moe_args a = {.tokens = t,
                       .x = r->x,
                       .logits = r->logits,
                       .w1 = r->w.d_w1,
                       .w2 = r->w.d_w2,
                       .out = r->out,
                       .workspace = ep ? r->ws_ep : r->ws_1,
                       .workspace_bytes = ep ? r->ws_ep_bytes : r->ws_1_bytes,
                       .ep_capacity = capacity,
                       .ep_dropped = ep ? r->dropped : NULL};
  return a;
}

/* Poisoned output, one forward (or graph replay), the output downloaded. */
static void *forward(one_rank *r, const moejit_model *m, const moejit_moe_args *a,
                     moejit_graph *graph) {
  const size_t bytes = (size_t)a->tokens * r->s->hidden * moejit_dtype_size(r->s->out_dtype);
  ops_poison(r->out, (r->max_t * r->s->hidden * moejit_dtype_size(r->s->out_dtype) + 3) / 4 * 4,
             OPS_POISON_NAN);
  ops_sync();
  if (graph)
    OPS_OK(moejit_graph_launch(ops_ctx(), graph, NULL));
  else
    OPS_OK(moejit_moe_forward(m, a, NULL));
  void *host = malloc(bytes + 4);
  ops_download(host, r->out, bytes);
  return host;
}

/* The single-GPU layer here is its unfused chain: at T * k <= 8 its
 * decode layer sums GEMM 2 and the combine in fp32 without rounding y, so
 * it differs from the expert-parallel path in the last bits. */
static void one_rank_bitwise(const int64_t *ts, size_t n_ts) {
  require_gpu_and_nccl();
  setenv("MOEJIT_LAYER_DECODE", "0", 1);
  one_rank r;
  one_rank_make(&r, "qwen3-30b-a3b", ts[n_ts - 1]);
  moejit_stream stream;
  OPS_OK(moejit_stream_create(ops_ctx(), &stream));
  for (size_t i = 0; i < n_ts; i++) {
    const int64_t t = ts[i];
    const size_t bytes = (size_t)t * r.s->hidden * moejit_dtype_size(r.s->out_dtype);
    moejit_moe_args a1 = args_for(&r, 0, t, 0), ae = args_for(&r, 1, t, 0),
                    ac = args_for(&r, 1, t, t);
    void *ref = forward(&r, r.single, &a1, NULL);
    void *exact = forward(&r, r.ep, &ae, NULL);
    cr_assert_eq(memcmp(ref, exact, bytes), 0, "T=%lld: exact differs from one GPU", (long long)t);
    ops_poison(r.dropped, 4, OPS_POISON_INT);
    void *cap = forward(&r, r.ep, &ac, NULL);
    cr_assert_eq(memcmp(ref, cap, bytes), 0, "T=%lld: capacity differs from one GPU", (long long)t);
    int32_t dropped = -1;
    ops_download(&dropped, r.dropped, 4);
    cr_assert_eq(dropped, 0, "T=%lld: %d dropped at capacity T", (long long)t, dropped);
    /* the capacity forward captures and replays to the same bits */
    moejit_graph *g = NULL;
    OPS_OK(moejit_graph_begin_capture(ops_ctx(), stream));
    OPS_OK(moejit_moe_forward(r.ep, &ac, stream));
    OPS_OK(moejit_graph_end_capture(ops_ctx(), stream, &g));
    void *replay = forward(&r, r.ep, &ac, g);
    cr_assert_eq(memcmp(ref, replay, bytes), 0, "T=%lld: graph replay differs", (long long)t);
    moejit_graph_destroy(ops_ctx(), g);
    /* the router's weight instead of its logits: the same bits as one GPU
     * given it, exact and at capacity; the same logits out */
    moejit_moe_args g1 = args_for(&r, 0, t, 0), ge = args_for(&r, 1, t, 0);
    g1.logits = ge.logits = NULL;
    g1.gate_weight = ge.gate_weight = r.gate;
    g1.router_logits = r.rl;
    void *ref_g = forward(&r, r.single, &g1, NULL);
    const size_t lb = sizeof(float) * (size_t)t * r.s->experts;
    float *rl1 = malloc(lb), *rle = malloc(lb);
    cr_assert(rl1 && rle);
    ops_download(rl1, r.rl, lb);
    ops_poison(r.rl, lb, OPS_POISON_NAN);
    ge.router_logits = r.rl;
    void *exact_g = forward(&r, r.ep, &ge, NULL);
    ops_download(rle, r.rl, lb);
    cr_assert_eq(memcmp(ref_g, exact_g, bytes), 0, "T=%lld: gate weight: exact differs",
                 (long long)t);
    cr_assert_eq(memcmp(rl1, rle, lb), 0, "T=%lld: gate weight: the logits differ", (long long)t);
    ge.ep_capacity = t, ge.router_logits = NULL;
    void *cap_g = forward(&r, r.ep, &ge, NULL);
    cr_assert_eq(memcmp(ref_g, cap_g, bytes), 0, "T=%lld: gate weight: capacity differs",
                 (long long)t);
    free(ref_g), free(exact_g), free(cap_g), free(rl1), free(rle);
    /* capacity below T: tokens past it are dropped, and counted */
    if (t > 1) {
      moejit_moe_args small = args_for(&r, 1, t, t / 2);
      void *part = forward(&r, r.ep, &small, NULL);
      ops_download(&dropped, r.dropped, 4);
      cr_assert_eq(dropped, t - t / 2, "T=%lld capacity %lld: %d dropped", (long long)t,
                   (long long)(t / 2), dropped);
      cr_assert_eq(memcmp(ref, part, bytes / t * (t / 2)), 0,
                   "the tokens within the capacity are unchanged");
      free(part);
    }
    free(ref);
    free(exact);
    free(cap);
    free(replay);
  }
  /* a rank without tokens still takes part */
  moejit_moe_args none = args_for(&r, 1, 0, 0);
  OPS_OK(moejit_moe_forward(r.ep, &none, NULL));
  none.ep_capacity = 16;
  OPS_OK(moejit_moe_forward(r.ep, &none, NULL));
  OPS_OK(moejit_model_ep_wait(r.ep, NULL, 10000)); /* a healthy exchange: done */
  ops_sync();
  OPS_OK(moejit_stream_destroy(ops_ctx(), stream));
  one_rank_free(&r);
}

/* What the stand-in NCCL logged (FAKE_NCCL_LOG), "" for nothing. */
static const char *log_of(const char *path) {
  static char text[256];
  text[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f) {
    const size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
  }
  return text;
}

/* With a stand-in NCCL (tests/fake_nccl) whose peers never answer: a model
 * whose exchange failed, or whose communicator NCCL found broken, aborts
 * the communicator when it goes (ncclCommDestroy would wait for the
 * peers); a healthy one destroys it. */
static const char *fake_nccl_ends(const char *log, const char *send_fail, const char *async) {
  setenv("FAKE_NCCL_SEND_FAIL", send_fail, 1);
  setenv("FAKE_NCCL_ASYNC_ERROR", async, 1);
  unlink(log);
  moejit_nccl_id id;
  OPS_OK(moejit_nccl_unique_id(&id));
  moejit_model *m = load_ep("olmoe-1b-7b", 2, 0, &id, NULL, MOEJIT_OK);
  void *send = ops_alloc(2 * 256), *recv = ops_alloc(2 * 256);
  const moejit_status st = moejit_ep_alltoall(m, send, recv, 256, NULL);
  if (atoi(send_fail))
    cr_expect(st == MOEJIT_ERR_CUDA && strstr(moejit_last_error(), "ncclSend"), "%d: %s", st,
              moejit_last_error());
  else if (atoi(async)) /* refused before it enqueues anything */
    cr_expect(st == MOEJIT_ERR_CUDA && strstr(moejit_last_error(), "communicator is broken"),
              "%d: %s", st, moejit_last_error());
  else
    cr_expect_eq(st, MOEJIT_OK, "%s", moejit_last_error());
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(m, &info));
  cr_expect_eq(info.failed, st != MOEJIT_OK, "failed = %d after status %d", info.failed, st);
  if (st) { /* a failed model refuses what follows, with the first reason */
    cr_expect_eq(moejit_ep_alltoall(m, send, recv, 256, NULL), st);
    cr_expect(strstr(moejit_last_error(), "failed earlier"), "%s", moejit_last_error());
  }
  ops_sync();
  moejit_model_destroy(m);
  ops_free(send);
  ops_free(recv);
  static char text[256]; /* the whole log: one teardown, never two */
  FILE *f = fopen(log, "r");
  cr_assert_not_null(f, "the fake NCCL logged nothing");
  const size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

Test(ep, a_broken_communicator_is_aborted_not_destroyed) {
  OPS_REQUIRE_GPU();
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  char *dir = ts_mkdtemp("ep-fake-nccl"), log[1100];
  snprintf(log, sizeof log, "%s/log", dir);
  setenv("FAKE_NCCL_LOG", log, 1);
  cr_expect_str_eq(fake_nccl_ends(log, "0", "0"), "destroy\n");
  cr_expect_str_eq(fake_nccl_ends(log, "1", "0"), "abort\n", "after a failed ncclSend");
  cr_expect_str_eq(fake_nccl_ends(log, "0", "6"), "abort\n", "after an asynchronous error");
  ts_rmtree(dir);
  free(dir);
}

/* ---- a peer that never answers ------------------------------------------
 * The stand-in NCCL's FAKE_NCCL_HANG blocks the stream at each send and
 * receive until the communicator is aborted, as NCCL's kernels wait for a
 * peer that died. Rank 0 of 2 of olmoe-1b-7b, T tokens. */

typedef struct hung_rank {
  moejit_model *m;
  moejit_stream stream;
  void *x, *logits, *out, *ws, *w1, *w2;
  size_t ws_bytes;
  char *dir, log[1100];
} hung_rank;

enum { HUNG_T = 4 };

/* 1: hung_rank_make asks for a nonblocking communicator */
static int hung_nonblocking;

static void hung_rank_make(hung_rank *h, const char *hang, int timeout_ms, void *comm) {
  OPS_REQUIRE_GPU();
  memset(h, 0, sizeof *h);
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_HANG", hang, 1);
  h->dir = ts_mkdtemp("ep-hung");
  snprintf(h->log, sizeof h->log, "%s/log", h->dir);
  setenv("FAKE_NCCL_LOG", h->log, 1);
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  moejit_nccl_id id;
  if (comm) {
    o.ep.nccl_comm = comm; /* the caller's: size and rank from the stand-in */
  } else {
    OPS_OK(moejit_nccl_unique_id(&id));
    o.ep.world = 2;
    o.ep.nccl_id = &id;
  }
  o.ep.timeout_ms = timeout_ms;
  o.ep.nonblocking_comm = hung_nonblocking && !comm;
  OPS_OK(moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", &o, &h->m));
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(h->m, &info));
  cr_assert_eq(info.timeout_ms, timeout_ms);
  cr_assert_eq(info.failed, 0);
  const moejit_spec *s = moejit_model_spec(h->m);
  const size_t d = (size_t)s->hidden, f = (size_t)s->expert_width, E = (size_t)info.local_experts;
  ts_rng rng = ts_rng_fresh("ep_hung_rank");
  float logits[HUNG_T * 64];
  cr_assert_leq(s->experts, 64);
  for (int i = 0; i < HUNG_T * s->experts; i++) logits[i] = 4.0f * ts_normal(&rng);
  h->logits = ops_alloc(sizeof logits);
  ops_upload(h->logits, logits, sizeof(float) * HUNG_T * s->experts);
  h->x = ops_alloc(HUNG_T * d * 2);
  h->out = ops_alloc(HUNG_T * d * 2);
  h->w1 = ops_alloc(E * 2 * f * d * 2);
  h->w2 = ops_alloc(E * f * d * 2);
  ops_poison(h->x, HUNG_T * d * 2, 0x3c003c00u); /* bf16 pairs near 0.0078 */
  ops_poison(h->w1, E * 2 * f * d * 2, 0x3c003c00u);
  ops_poison(h->w2, E * f * d * 2, 0x3c003c00u);
  OPS_OK(moejit_moe_workspace_size(h->m, HUNG_T, &h->ws_bytes));
  h->ws = ops_alloc(h->ws_bytes);
  ops_poison(h->ws, h->ws_bytes / 4 * 4, 0);
  ops_sync();
  OPS_OK(moejit_stream_create(ops_ctx(), &h->stream));
}

static moejit_moe_args hung_args(const hung_rank *h, int64_t capacity) {
  moejit_moe_args a = {.tokens = HUNG_T,
                       .x = h->x,
                       .logits = h->logits,
                       .w1 = h->w1,
                       .w2 = h->w2,
                       .out = h->out,
                       .workspace = h->ws,
                       .workspace_bytes = h->ws_bytes,
                       .ep_capacity = capacity};
  return a;
}

/* Destroys the model; returns what the stand-in logged (destroy, abort). */
static const char *hung_rank_free(hung_rank *h) {
  ops_sync();
  OPS_OK(moejit_stream_destroy(ops_ctx(), h->stream));
  moejit_model_destroy(h->m);
  void *b[] = {h->x, h->logits, h->out, h->ws, h->w1, h->w2};
  for (size_t i = 0; i < sizeof b / sizeof *b; i++) ops_free(b[i]);
  static char text[256];
  text[0] = '\0';
  FILE *f = fopen(h->log, "r");
  if (f) {
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
  }
  ts_rmtree(h->dir);
  free(h->dir);
  return text;
}

Test(ep, an_exact_forward_gives_up_on_a_silent_peer_after_the_timeout) {
  hung_rank h;
  hung_rank_make(&h, "1", 300, NULL);
  moejit_moe_args a = hung_args(&h, 0);
  const double t0 = mj_now_ms();
  moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
  const double took = mj_now_ms() - t0;
  cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "count exchange") &&
                strstr(moejit_last_error(), "within 300 ms") &&
                strstr(moejit_last_error(), "communicator was aborted;"),
            "%s", moejit_last_error());
  cr_expect(took >= 290 && took < 20000, "the wait took %.0f ms", took);
  /* the abort ended the blocked work: the stream is done */
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(h.m, &info));
  cr_expect_eq(info.failed, 1);
  cr_expect_eq(info.abort_pending, 0, "the stand-in's abort returned");
  /* later calls are refused at once, with the first failure */
  st = moejit_moe_forward(h.m, &a, h.stream);
  cr_expect_eq(st, MOEJIT_ERR_TIMEOUT);
  cr_expect(
      strstr(moejit_last_error(), "failed earlier") && strstr(moejit_last_error(), "within 300 ms"),
      "%s", moejit_last_error());
  a.ep_capacity = HUNG_T;
  cr_expect_eq(moejit_moe_forward(h.m, &a, h.stream), MOEJIT_ERR_TIMEOUT);
  cr_expect_eq(moejit_model_ep_wait(h.m, h.stream, 0), MOEJIT_ERR_TIMEOUT);
  cr_expect_str_eq(hung_rank_free(&h), "abort\n", "aborted once, never destroyed");
}

/* A rank that never joins: ncclCommInitRank would wait for it for ever;
 * the load gives up after opts.ep.timeout_ms. A nonblocking join is
 * aborted as soon as the load gives up; a blocking one only once NCCL
 * returns (here never: the stand-in's join takes 60 s). */
/* Options for rank 0 of 2 joining through the stand-in NCCL with *id. */
static moejit_load_opts fake_rank0(moejit_nccl_id *id, int nonblocking) {
  OPS_REQUIRE_GPU();
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  OPS_OK(moejit_nccl_unique_id(id));
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.ep.world = 2;
  o.ep.nccl_id = id;
  o.ep.nonblocking_comm = nonblocking;
  return o;
}

static void never_joins(int nonblocking) {
  setenv("FAKE_NCCL_INIT_HANG", "1", 1);
  char *dir = ts_mkdtemp("ep-never-joins"), log[1100];
  snprintf(log, sizeof log, "%s/log", dir);
  setenv("FAKE_NCCL_LOG", log, 1);
  moejit_nccl_id id;
  moejit_load_opts o = fake_rank0(&id, nonblocking);
  o.ep.timeout_ms = 300;
  moejit_load_report rep;
  o.report = &rep;
  moejit_model *m = NULL;
  const double t0 = mj_now_ms();
  moejit_status st = moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", &o, &m);
  const double took = mj_now_ms() - t0;
  cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
  cr_assert_null(m);
  cr_expect(strstr(moejit_last_error(),
                   "joining the communicator as rank 0 of 2: not every rank "
                   "joined within 300 ms"),
            "%s", moejit_last_error());
  cr_expect(took >= 300 && took < 20000, "the load took %.0f ms", took);
  /* the kernels were built: a load with every rank there is all hits */
  cr_expect_gt(rep.n_kernels, 0);
  const double t1 = mj_now_ms();
  while (nonblocking && strcmp(log_of(log), "abort\n") && mj_now_ms() - t1 < 2000)
    mj_sleep_us(1000);
  cr_expect_str_eq(log_of(log), nonblocking ? "abort\n" : "", "nonblocking = %d", nonblocking);
  ts_rmtree(dir);
  free(dir);
}

Test(ep, a_rank_that_never_joins_fails_the_load_after_the_timeout) {
  never_joins(0);
}

Test(ep, a_nonblocking_join_that_never_ends_is_aborted_after_the_timeout) {
  never_joins(1);
}

/* Within a node, NCCL's abort can wait for a dead peer to free the
 * communicator, for ever: the wait still returns, after 5 s more, and
 * says so. */
Test(ep, an_abort_that_does_not_return_still_ends_the_wait) {
  hung_rank h;
  setenv("FAKE_NCCL_ABORT_HANG", "1", 1);
  hung_rank_make(&h, "1", 200, NULL);
  moejit_moe_args a = hung_args(&h, 0);
  const double t0 = mj_now_ms();
  moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
  const double took = mj_now_ms() - t0;
  cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(),
                   "its work on the stream ended, but ncclCommAbort had not "
                   "returned 5 s later") &&
                strstr(moejit_last_error(), "HINT: end this process"),
            "%s", moejit_last_error());
  cr_expect(took >= 5000 && took < 20000, "the wait took %.0f ms", took);
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(h.m, &info));
  cr_expect_eq(info.abort_pending, 1, "the caller learns that the process should end");
  cr_expect_eq(moejit_ep_pending_teardowns(), 1, "and so does the process");
  /* destroying the model touches the communicator no more */
  cr_expect_str_eq(hung_rank_free(&h), "abort\n");
}

Test(ep, a_peer_that_dies_mid_exchange_ends_the_wait_without_a_timeout) {
  hung_rank h;
  hung_rank_make(&h, "2", 0, NULL); /* no time limit: only NCCL's error ends it */
  moejit_moe_args a = hung_args(&h, 0);
  moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
  cr_assert_eq(st, MOEJIT_ERR_CUDA, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "communicator is broken") &&
                strstr(moejit_last_error(), "NCCL error 6") &&
                strstr(moejit_last_error(), "communicator was aborted;"),
            "%s", moejit_last_error());
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  cr_expect_eq(moejit_moe_forward(h.m, &a, h.stream), MOEJIT_ERR_CUDA);
  cr_expect_str_eq(hung_rank_free(&h), "abort\n");
}

Test(ep, ep_wait_with_a_limit_aborts_the_hung_exchange) {
  hung_rank h;
  hung_rank_make(&h, "1", 0, NULL);
  moejit_moe_args a = hung_args(&h, HUNG_T); /* fixed capacity: no host wait inside */
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
  const double t0 = mj_now_ms();
  moejit_status st = moejit_model_ep_wait(h.m, h.stream, 200);
  const double took = mj_now_ms() - t0;
  cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "moejit_model_ep_wait") &&
                strstr(moejit_last_error(), "within 200 ms"),
            "%s", moejit_last_error());
  cr_expect(took >= 190 && took < 20000, "the wait took %.0f ms", took);
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  cr_expect_str_eq(hung_rank_free(&h), "abort\n");
}

static void *abort_later(void *model) {
  mj_sleep_us(100000);
  OPS_OK(moejit_model_ep_abort(model));
  return NULL;
}

Test(ep, ep_abort_from_another_thread_ends_a_wait_without_limit) {
  hung_rank h;
  hung_rank_make(&h, "1", 0, NULL);
  moejit_moe_args a = hung_args(&h, HUNG_T);
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
  pthread_t watchdog;
  cr_assert_eq(pthread_create(&watchdog, NULL, abort_later, h.m), 0);
  moejit_status st = moejit_model_ep_wait(h.m, h.stream, 0);
  pthread_join(watchdog, NULL);
  cr_assert_eq(st, MOEJIT_ERR_CUDA, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "moejit_model_ep_abort"), "%s", moejit_last_error());
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  OPS_OK(moejit_model_ep_abort(h.m)); /* again: nothing more to do */
  cr_expect_str_eq(hung_rank_free(&h), "abort\n");
}

Test(ep, a_callers_communicator_is_left_to_the_caller) {
  hung_rank h;
  void *comm = malloc(1); /* the stand-in takes any handle */
  hung_rank_make(&h, "1", 150, comm);
  moejit_moe_args a = hung_args(&h, 0);
  moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
  cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "the caller's: abort it (ncclCommAbort)"), "%s",
            moejit_last_error());
  OPS_OK(moejit_model_ep_abort(h.m)); /* marks only: the communicator is not moejit's */
  /* the caller aborts it: that releases the stand-in's blocked stream */
  void *lib = dlopen(MOEJIT_FAKE_NCCL_PATH, RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(lib, "the stand-in NCCL is loaded");
  int (*comm_abort)(void *) = (int (*)(void *))dlsym(lib, "ncclCommAbort");
  cr_assert_not_null(comm_abort);
  cr_assert_eq(comm_abort(comm), 0);
  dlclose(lib);
  OPS_OK(moejit_stream_synchronize(ops_ctx(), h.stream));
  cr_expect_str_eq(hung_rank_free(&h), "abort\n", "moejit neither aborted nor destroyed it");
}

/* ---- nonblocking communicators -------------------------------------------
 * With NCCL 2.14 or newer the model makes its communicator nonblocking:
 * NCCL's first connection to a peer (inside a group's end) and the
 * teardown run in NCCL's thread, polled within opts.ep.timeout_ms, where a
 * blocking communicator holds the host with no limit. */

Test(ep, a_first_connection_that_never_ends_fails_the_forward_after_the_timeout) {
  setenv("FAKE_NCCL_CONNECT_HANG", "1", 1);
  hung_nonblocking = 1;
  for (int capacity = 0; capacity <= HUNG_T; capacity += HUNG_T) {
    hung_rank h;
    hung_rank_make(&h, "0", 300, NULL);
    moejit_ep_info info;
    OPS_OK(moejit_model_ep_info(h.m, &info));
    cr_assert_eq(info.nonblocking, 1, "the model made its communicator nonblocking");
    moejit_moe_args a = hung_args(&h, capacity);
    const double t0 = mj_now_ms();
    moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
    const double took = mj_now_ms() - t0;
    cr_assert_eq(st, MOEJIT_ERR_TIMEOUT, "capacity %d: %d: %s", capacity, st, moejit_last_error());
    cr_expect(strstr(moejit_last_error(), capacity ? "dispatch" : "count exchange") &&
                  strstr(moejit_last_error(), "had not finished enqueuing the exchange 300 ms") &&
                  strstr(moejit_last_error(), "communicator was aborted;"),
              "%s", moejit_last_error());
    cr_expect(took >= 290 && took < 20000, "the forward took %.0f ms", took);
    OPS_OK(moejit_model_ep_info(h.m, &info));
    cr_expect_eq(info.failed, 1);
    st = moejit_moe_forward(h.m, &a, h.stream); /* refused, with the first reason */
    cr_expect_eq(st, MOEJIT_ERR_TIMEOUT);
    cr_expect(strstr(moejit_last_error(), "failed earlier"), "%s", moejit_last_error());
    cr_expect_str_eq(hung_rank_free(&h), "abort\n", "aborted once, never finalized");
  }
}

Test(ep, a_healthy_nonblocking_communicator_is_finalized_then_destroyed) {
  setenv("FAKE_NCCL_PROGRESS_MS", "20", 1); /* each group's and the finalize's work */
  hung_nonblocking = 1;
  hung_rank h;
  hung_rank_make(&h, "0", 5000, NULL);
  moejit_moe_args a = hung_args(&h, 0);
  const double t0 = mj_now_ms();
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream)); /* three groups, each waited for */
  cr_expect_geq(mj_now_ms() - t0, 3 * 20, "the forward waited for NCCL's thread");
  a.ep_capacity = HUNG_T;
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
  OPS_OK(moejit_model_ep_wait(h.m, h.stream, 5000));
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(h.m, &info));
  cr_expect_eq(info.failed, 0);
  const double t1 = mj_now_ms();
  cr_expect_str_eq(hung_rank_free(&h), "finalize\ndestroy\n");
  cr_expect_geq(mj_now_ms() - t1, 20, "the destroy waited for the finalize");
  cr_expect_eq(moejit_ep_pending_teardowns(), 0, "the destroy returned");
}

Test(ep, a_finalize_that_never_ends_is_aborted_after_the_timeout) {
  setenv("FAKE_NCCL_FINALIZE_HANG", "1", 1);
  hung_nonblocking = 1;
  hung_rank h;
  hung_rank_make(&h, "0", 300, NULL);
  moejit_moe_args a = hung_args(&h, 0);
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
  const double t0 = mj_now_ms();
  const char *log = hung_rank_free(&h); /* a peer that died silently: finalize never ends */
  const double took = mj_now_ms() - t0;
  cr_expect_str_eq(log, "finalize\nabort\n");
  cr_expect(took >= 290 && took < 10000, "the destroy took %.0f ms", took);
}

/* Within a node ncclCommDestroy waits for every peer to destroy its
 * communicator too, for ever when one died after its last exchange: the
 * model's destroy gives up after opts.ep.timeout_ms, and the process
 * learns that NCCL has not returned. */
Test(ep, a_destroy_that_never_returns_is_left_after_the_timeout) {
  for (int nonblocking = 0; nonblocking < 2; nonblocking++) {
    hung_nonblocking = nonblocking;
    setenv("FAKE_NCCL_DESTROY_HANG", "0", 1);
    hung_rank h;
    hung_rank_make(&h, "0", 300, NULL);
    moejit_moe_args a = hung_args(&h, 0);
    OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
    cr_assert_eq(moejit_ep_pending_teardowns(), nonblocking, "one left from the first round");
    setenv("FAKE_NCCL_DESTROY_HANG", "1", 1);
    const double t0 = mj_now_ms();
    const char *log = hung_rank_free(&h);
    const double took = mj_now_ms() - t0;
    cr_expect_str_eq(log, nonblocking ? "finalize\ndestroy\n" : "destroy\n");
    cr_expect(took >= 290 && took < 10000, "nonblocking = %d: the destroy took %.0f ms",
              nonblocking, took);
    cr_expect_eq(moejit_ep_pending_teardowns(), 1 + nonblocking, "NCCL's destroy still runs");
  }
}

/* The default communicator blocks: no finalize, and the stand-in's
 * hanging first connection (which only a nonblocking one reports) does
 * not show. */
Test(ep, the_default_communicator_is_blocking) {
  setenv("FAKE_NCCL_CONNECT_HANG", "1", 1);
  hung_rank h;
  hung_rank_make(&h, "0", 0, NULL);
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(h.m, &info));
  cr_expect_eq(info.nonblocking, 0);
  moejit_moe_args a = hung_args(&h, 0);
  OPS_OK(moejit_moe_forward(h.m, &a, h.stream));
  cr_expect_str_eq(hung_rank_free(&h), "destroy\n");
  cr_expect_eq(moejit_ep_pending_teardowns(), 0, "the destroy returned");
}

Test(ep, a_nonblocking_communicator_needs_nccl_2_14) {
  setenv("FAKE_NCCL_VERSION", "21305", 1); /* 2.13.5 */
  moejit_nccl_id id;
  moejit_load_opts o = fake_rank0(&id, 1);
  moejit_model *m = NULL;
  cr_assert_eq(moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", &o, &m), MOEJIT_ERR_UNSUPPORTED);
  cr_assert_null(m);
  cr_expect(strstr(moejit_last_error(), "needs NCCL 2.14 or newer") &&
                strstr(moejit_last_error(), "this NCCL is 2.13.5"),
            "%s", moejit_last_error());
}

/* A caller's nonblocking communicator: the model waits for NCCL's thread
 * after each group, and leaves the communicator to the caller. */
Test(ep, a_callers_nonblocking_communicator_is_waited_for) {
  OPS_REQUIRE_GPU();
  setenv("MOEJIT_NCCL_LIBRARY", MOEJIT_FAKE_NCCL_PATH, 1);
  setenv("FAKE_NCCL_PROGRESS_MS", "10", 1);
  const mj_nccl *n = NULL;
  OPS_OK(mj_nccl_get(&n));
  cr_assert(mj_nccl_has_nonblocking(n));
  for (int hang = 0; hang < 2; hang++) {
    setenv("FAKE_NCCL_CONNECT_HANG", hang ? "1" : "0", 1);
    mj_nccl_config c;
    mj_nccl_config_nonblocking(&c);
    mj_nccl_unique_id uid;
    memset(&uid, 0, sizeof uid);
    mj_nccl_comm comm = NULL;
    cr_assert_eq(n->CommInitRankConfig(&comm, 2, uid, 0, &c), MJ_NCCL_IN_PROGRESS);
    mj_nccl_result async = MJ_NCCL_IN_PROGRESS;
    while (async == MJ_NCCL_IN_PROGRESS) cr_assert_eq(n->CommGetAsyncError(comm, &async), 0);
    cr_assert_eq(async, MJ_NCCL_SUCCESS);
    hung_rank h;
    hung_rank_make(&h, "0", 300, comm);
    moejit_ep_info info;
    OPS_OK(moejit_model_ep_info(h.m, &info));
    cr_expect_eq(info.nonblocking, 0, "not the model's");
    moejit_moe_args a = hung_args(&h, 0);
    const moejit_status st = moejit_moe_forward(h.m, &a, h.stream);
    if (!hang) {
      cr_expect_eq(st, MOEJIT_OK, "%s", moejit_last_error());
    } else {
      cr_expect_eq(st, MOEJIT_ERR_TIMEOUT, "%d: %s", st, moejit_last_error());
      cr_expect(strstr(moejit_last_error(), "the caller's: abort it (ncclCommAbort)"), "%s",
                moejit_last_error());
    }
    cr_expect_str_eq(hung_rank_free(&h), "", "hang = %d: moejit left it alone", hang);
    cr_assert_eq(n->CommAbort(comm), MJ_NCCL_SUCCESS); /* the caller's to end */
  }
}

/* Small T also serves compute-sanitizer (scripts/gpu-sanitize.sh). */
Test(ep, one_rank_small_is_bitwise_the_single_gpu_layer) {
  static const int64_t ts[] = {1, 37};
  one_rank_bitwise(ts, 2);
}

Test(ep, one_rank_large_is_bitwise_the_single_gpu_layer) {
  static const int64_t ts[] = {256, 4096};
  one_rank_bitwise(ts, 2);
}

Test(ep, bad_options_and_arguments_are_refused) {
  require_gpu_and_nccl();
  moejit_nccl_id id;
  OPS_OK(moejit_nccl_unique_id(&id));
  /* refused before joining any communicator: nothing waits */
  load_ep("qwen3-30b-a3b", 2, 0, NULL, NULL, MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "nccl_id"), "%s", moejit_last_error());
  load_ep("qwen3-30b-a3b", 2, 2, &id, NULL, MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "ep.rank = 2"), "%s", moejit_last_error());
  load_ep("qwen3-30b-a3b", 65, 0, &id, NULL, MOEJIT_ERR_INVALID_ARGUMENT);
  int32_t owner[128];
  for (int e = 0; e < 128; e++) owner[e] = e % 2;
  owner[100] = 7;
  load_ep("qwen3-30b-a3b", 2, 0, &id, owner, MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "expert_owner[100] = 7"), "%s", moejit_last_error());
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.ep.world = 2;
  o.ep.nccl_id = &id;
  o.ep.timeout_ms = -5;
  moejit_model *none = NULL;
  cr_assert_eq(moejit_model_load_config(ops_ctx(), "qwen3-30b-a3b", &o, &none),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "opts.ep.timeout_ms = -5"), "%s", moejit_last_error());
  cr_assert_null(none);
  o.ep.timeout_ms = 0;
  o.ep.nonblocking_comm = 2;
  cr_assert_eq(moejit_model_load_config(ops_ctx(), "qwen3-30b-a3b", &o, &none),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "opts.ep.nonblocking_comm = 2"), "%s", moejit_last_error());
  o.ep.nonblocking_comm = 1;
  o.ep.nccl_id = NULL;
  o.ep.world = 0;
  o.ep.nccl_comm = &o; /* refused before it is looked at */
  cr_assert_eq(moejit_model_load_config(ops_ctx(), "qwen3-30b-a3b", &o, &none),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "nonblocking_comm is set with opts.ep.nccl_comm"), "%s",
            moejit_last_error());
  cr_assert_null(none);

  one_rank r;
  one_rank_make(&r, "qwen3-30b-a3b", 64);
  cr_assert_eq(moejit_model_ep_wait(r.single, NULL, 0), MOEJIT_ERR_UNSUPPORTED);
  cr_assert_eq(moejit_model_ep_abort(r.single), MOEJIT_ERR_UNSUPPORTED);
  moejit_moe_args a = args_for(&r, 1, 64, -1);
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "ep_capacity = -1"), "%s", moejit_last_error());
  a = args_for(&r, 1, 64, 0);
  a.workspace_bytes = 1024;
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "workspace_bytes"), "%s", moejit_last_error());
  moejit_event ev[MOEJIT_EP_EVENTS] = {0};
  a = args_for(&r, 1, 64, 64);
  a.ep_events = ev;
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "ep_events[0]"), "%s", moejit_last_error());
  a = args_for(&r, 1, 64, 0x7fffffff);
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  a = args_for(&r, 1, 64, (int64_t)1 << 58); /* would wrap to 0 rows if multiplied first */
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "exceeds INT32_MAX"), "%s", moejit_last_error());
  a = args_for(&r, 1, 0, 0);
  a.w2 = NULL;
  cr_assert_eq(moejit_moe_forward(r.ep, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "args->w2"), "T = 0 still needs the weights: %s",
            moejit_last_error());
  /* exact mode waits on the host: not inside a capture */
  moejit_stream stream;
  OPS_OK(moejit_stream_create(ops_ctx(), &stream));
  a = args_for(&r, 1, 64, 0);
  OPS_OK(moejit_graph_begin_capture(ops_ctx(), stream));
  cr_assert_eq(moejit_moe_forward(r.ep, &a, stream), MOEJIT_ERR_UNSUPPORTED);
  cr_assert(strstr(moejit_last_error(), "HINT"), "%s", moejit_last_error());
  moejit_graph *g = NULL;
  OPS_OK(moejit_graph_end_capture(ops_ctx(), stream, &g)); /* nothing was captured */
  moejit_graph_destroy(NULL, g);                           /* the ctx that captured it */
  OPS_OK(moejit_stream_destroy(ops_ctx(), stream));
  /* expert-parallel queries on a one-GPU model */
  moejit_ep_info info;
  cr_assert_eq(moejit_model_ep_info(r.single, &info), MOEJIT_ERR_UNSUPPORTED);
  char buf[16];
  cr_assert_eq(moejit_ep_alltoall(r.single, buf, buf, 4, NULL), MOEJIT_ERR_UNSUPPORTED);
  int n = -1;
  cr_assert_eq(moejit_model_ep_local_experts(r.ep, NULL, 0, &n), MOEJIT_OK);
  cr_assert_eq(n, 128);
  one_rank_free(&r);
}

/* A communicator the caller made is adopted (world 0 takes its size), is
 * not destroyed with the model, and the model runs on it. */
Test(ep, a_callers_communicator_is_adopted) {
  require_gpu_and_nccl();
  const mj_nccl *n = NULL;
  OPS_OK(mj_nccl_get(&n));
  mj_nccl_unique_id uid;
  cr_assert_eq(n->GetUniqueId(&uid), MJ_NCCL_SUCCESS);
  mj_nccl_comm comm = NULL;
  OPS_OK(mj_ctx_enter(ops_ctx()));
  cr_assert_eq(n->CommInitRank(&comm, 1, uid, 0), MJ_NCCL_SUCCESS);
  mj_ctx_leave(ops_ctx());
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.ep.nccl_comm = comm; /* world 0: the communicator's size */
  moejit_model *m = NULL;
  OPS_OK(moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", &o, &m));
  moejit_ep_info info;
  OPS_OK(moejit_model_ep_info(m, &info));
  cr_assert_eq(info.world, 1);
  cr_assert_eq(info.owns_comm, 0);
  o.ep.world = 2; /* disagrees with the communicator */
  moejit_model *bad = NULL;
  cr_assert_eq(moejit_model_load_config(ops_ctx(), "olmoe-1b-7b", &o, &bad),
               MOEJIT_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(moejit_last_error(), "communicator has 1 ranks"), "%s", moejit_last_error());
  /* a forward of T = 0 without token buffers runs on it */
  size_t ws_bytes = 0;
  OPS_OK(moejit_moe_workspace_size(m, 8, &ws_bytes));
  void *ws = ops_alloc(ws_bytes), *w = ops_alloc(256);
  moejit_moe_args a = {.tokens = 0, .w1 = w, .w2 = w, .workspace = ws, .workspace_bytes = ws_bytes};
  OPS_OK(moejit_moe_forward(m, &a, NULL));
  ops_sync();
  moejit_model_destroy(m);
  /* still the caller's: usable, then destroyed by the caller */
  int count = 0;
  cr_assert_eq(n->CommCount(comm, &count), MJ_NCCL_SUCCESS);
  cr_assert_eq(count, 1);
  OPS_OK(mj_ctx_enter(ops_ctx()));
  cr_assert_eq(n->CommDestroy(comm), MJ_NCCL_SUCCESS);
  mj_ctx_leave(ops_ctx());
  ops_free(ws);
  ops_free(w);
}

/* ---- several ranks, one process per GPU ---------------------------------- */

/* The number after "key": in s (up to the next '}'), or NAN. */
static double json_num(const char *obj, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *end = strchr(obj, '}'), *p = strstr(obj, pat);
  if (!p || (end && p > end)) return 0.0 / 0.0;
  return strtod(p + strlen(pat), NULL);
}

static void run_ranks_with(int world, const char *preset, const char *route, int nonblocking) {
  require_gpu_and_nccl();
  if (device_count() < world)
    cr_skip_test("%d ranks need %d GPUs; this machine has %d", world, world, device_count());
  int version = 0;
  OPS_OK(moejit_nccl_version(&version));
  if (nonblocking && version < 21400)
    cr_skip_test("NCCL %d has no nonblocking communicators (2.14 or newer)", version);
  char ep[8];
  snprintf(ep, sizeof ep, "%d", world);
  const char *args[] = {"run",
                        "--preset",
                        preset,
                        "--ep",
                        ep,
                        "--ep-route",
                        route,
                        "--tokens",
                        "1,256,4096",
                        "--iters",
                        "3",
                        "--json",
                        nonblocking ? "--ep-nonblocking-comm" : NULL,
                        NULL};
  char *out = NULL, *err = NULL;
  int rc = ts_run_cli(args, NULL, &out, &err);
  cr_assert_eq(rc, 0, "moejit run --ep %d %s %s: exit %d\n%s\n%s", world, preset, route, rc, out,
               err);
  cr_assert(ts_json_valid(out), "not JSON: %s", out);
  cr_assert(strstr(out, nonblocking ? "\"comm\":\"nonblocking\"" : "\"comm\":\"blocking\""),
            "%.300s", out);
  int points = 0;
  for (const char *p = strstr(out, "{\"rank\":"); p; p = strstr(p + 1, "{\"rank\":")) {
    points++;
    const double t = json_num(p, "tokens"), rank = json_num(p, "rank");
    cr_assert(strstr(p, "\"ok\":true") && strstr(p, "\"ok\":true") < strchr(p, '}'),
              "rank %g T=%g failed: %.400s", rank, t, p);
    cr_assert_eq(json_num(p, "dropped"), 0);
    if (t > 0) {
      cr_assert_leq(json_num(p, "err_exact"), 1e-2, "rank %g T=%g", rank, t);
      cr_assert_geq(json_num(p, "err_exact"), 0);
      cr_assert_leq(json_num(p, "err_capacity"), 1e-2, "rank %g T=%g", rank, t);
      cr_assert_leq(json_num(p, "err_f64"), 1e-2, "rank %g T=%g", rank, t);
    } else {
      cr_assert(!strcmp(route, "idle-rank") && rank == world - 1, "T=0 only on the idle rank");
    }
    cr_assert_gt(json_num(p, "graph_ms"), 0);
  }
  cr_assert_eq(points, 3 * world, "%d points for %d ranks x 3 token counts", points, world);
  free(out);
  free(err);
}

static void run_ranks(int world, const char *preset, const char *route) {
  run_ranks_with(world, preset, route, 0);
}

/* Rank 0 of 2 of olmoe-1b-7b started by hand on the stand-in NCCL with
 * `fake` in its environment and --ep-timeout 1 (T = 4, one iteration):
 * expects exit 1 within limit_ms, with `says` and `also` on stderr. */
static void cli_rank_alone(const char *fake, const char *says, const char *also, double limit_ms) {
  OPS_REQUIRE_GPU();
  char *dir = ts_mkdtemp("ep-cli-rank"), id[1100], lib[1100];
  snprintf(id, sizeof id, "%s/id", dir);
  snprintf(lib, sizeof lib, "MOEJIT_NCCL_LIBRARY=%s", MOEJIT_FAKE_NCCL_PATH);
  const char *env[] = {lib, fake, NULL};
  const char *args[] = {
      "run", "--preset",     "olmoe-1b-7b", "--ep",     "2", "--ep-rank", "0", "--ep-id-file",
      id,    "--ep-timeout", "1",           "--tokens", "4", "--iters",   "1", NULL};
  char *out = NULL, *err = NULL;
  const double t0 = mj_now_ms();
  int rc = ts_run_cli(args, env, &out, &err);
  const double took = mj_now_ms() - t0;
  cr_expect_eq(rc, 1, "%s: exit %d\n%s\n%s", fake, rc, out, err);
  cr_expect(err && strstr(err, says) && strstr(err, also), "%s: stderr: %s", fake, err);
  cr_expect(took < limit_ms, "%s: took %.0f ms", fake, took);
  free(out);
  free(err);
  ts_rmtree(dir);
  free(dir);
}

/* A rank whose peer never comes (the stand-in's exchanges block): it
 * gives up after --ep-timeout and exits 1 saying so, rather than wait for
 * ever. */
Test(ep, a_cli_rank_gives_up_after_ep_timeout) {
  cli_rank_alone("FAKE_NCCL_HANG=1", "timed out", "did not finish within 1000 ms", 120000);
}

/* A rank whose NCCL teardown does not return (a peer that died after the
 * last exchange) stops waiting after --ep-timeout and exits 1 without
 * tearing CUDA down under NCCL. The stand-in moves nothing, so the rank's
 * checks fail too; what matters is that it ends, and says why. */
Test(ep, a_cli_rank_whose_teardown_hangs_exits_without_cleaning_up) {
  cli_rank_alone("FAKE_NCCL_DESTROY_HANG=1", "rank 0 exits without cleaning up",
                 "(NCCL's teardown of the communicator had not returned 1 s later",
                 50000); /* the stand-in's destroy takes 60 s */
}

Test(ep, one_rank_cli_deepseek) { run_ranks(1, "deepseek-v3", "uniform"); }
Test(ep, two_ranks_deepseek_uniform) { run_ranks(2, "deepseek-v3", "uniform"); }
Test(ep, two_ranks_qwen3_uniform) { run_ranks(2, "qwen3-30b-a3b", "uniform"); }
Test(ep, two_ranks_deepseek_all_tokens_on_one_rank) { run_ranks(2, "deepseek-v3", "one-rank"); }
Test(ep, two_ranks_qwen3_all_tokens_on_one_rank) { run_ranks(2, "qwen3-30b-a3b", "one-rank"); }
Test(ep, two_ranks_qwen3_a_rank_without_tokens) { run_ranks(2, "qwen3-30b-a3b", "idle-rank"); }
Test(ep, four_ranks_qwen3_uniform) { run_ranks(4, "qwen3-30b-a3b", "uniform"); }
Test(ep, two_ranks_qwen3_nonblocking) {
  run_ranks_with(2, "qwen3-30b-a3b", "uniform", 1);
}
