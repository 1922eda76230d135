/* `moejit run --ep N`: the layer spread over N ranks, one process per GPU
 * (docs/ep.md). Without --ep-rank this process is the launcher: it starts
 * N copies of itself (rank r on GPU r), hands them a fresh NCCL id file,
 * collects each rank's measurements through a pipe and prints one table.
 * With --ep-rank R (and --ep-id-file, shared by all ranks, on several
 * machines) it is rank R and prints its own rows.
 *
 * Each rank, for each T (its tokens; weak scaling):
 *  - runs the single-GPU layer (all experts, on this GPU) on its inputs;
 *  - runs the expert-parallel layer exact (counts exchanged) and with a
 *    fixed capacity T, checks both against the single-GPU output and a
 *    float64 reference of sampled tokens, and checks that the captured
 *    capacity forward replays bit for bit;
 *  - times the single-GPU layer (graph), the exact forward (eager) and the
 *    capacity forward (graph) with its phases, and NCCL's own all-to-all of
 *    the dispatch's size. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_data.h"
#include "cli/run_gpu.h"

#define EP_WARMUPS 3
/* A rank's exit code when it ran to the end but a check failed: its peers
 * finish too (they are killed only when a rank stops early). */
#define EP_EXIT_CHECK 3
#define EP_SAMPLES 6
#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct ep_point {
  int64_t tokens; /* this rank's T */
  int rank, world;
  int64_t capacity;
  double single_ms, exact_ms, graph_ms;
  double phase_ms[5]; /* capacity graph: pack, dispatch, experts, return, combine */
  double a2a_ms, a2a_bytes, dispatch_bytes; /* bytes this rank sends to peers */
  double err_exact, err_capacity, err_f64;
  int dropped, ok;
  char problem[200];
} ep_point;

typedef struct ep_rank {
  const run_args *a;
  moejit_spec spec;
  int rank, world;
  moejit_ctx *ctx;
  moejit_model *ep, *single;
  moejit_load_report ep_report;
  moejit_stream stream;
  moejit_event ev[MOEJIT_EP_EVENTS], t0, t1;
  run_block bx, b1, b2;
  void *w1, *w2, *lw1, *lw2, *scratch;
  void *x, *logits, *out, *ws, *ws1, *ids, *weights, *dropped, *a2a_send, *a2a_recv;
  size_t ws_bytes, ws1_bytes, a2a_bytes;
  int32_t local[1024];
  int n_local;
  int64_t max_tokens;
} ep_rank;

#define TRY(call)               \
  do {                          \
    moejit_status st_ = (call); \
    if (st_) return st_;        \
  } while (0)

/* Waits for the rank's stream. Once the expert-parallel model is loaded,
 * through it: a peer that died, or no progress for --ep-timeout, ends the
 * wait with an error (and aborts the communicator) instead of hanging. */
static moejit_status wait_stream(const ep_rank *r) {
  return r->ep ? moejit_model_ep_wait(r->ep, r->stream, -1)
               : moejit_stream_synchronize(r->ctx, r->stream);
}

/* ---- setup ----------------------------------------------------------------- */

static moejit_status get_id(const ep_rank *r, moejit_nccl_id *id) {
  const char *path = r->a->ep_id_file;
  if (r->rank == 0) {
    TRY(moejit_nccl_unique_id(id));
    return moejit_nccl_id_write_file(path, id);
  }
  return moejit_nccl_id_read_file(path, 120000, id);
}

static moejit_status load(ep_rank *r) {
  char name[MOEJIT_NAME_MAX + 8];
  const char *what = cli_model_name(r->a->preset, r->a->config, name, sizeof name);
  int devices = 0;
  TRY(moejit_device_count(&devices));
  moejit_ctx_opts co;
  moejit_ctx_opts_init(&co);
  co.device = r->a->ep_device >= 0 ? r->a->ep_device : r->rank % (devices ? devices : 1);
  co.compiler.cache_dir = r->a->cache_dir;
  TRY(moejit_ctx_create(&r->ctx, &co));
  moejit_nccl_id id;
  TRY(get_id(r, &id));
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.report = &r->ep_report;
  o.ep.world = r->world;
  o.ep.rank = r->rank;
  o.ep.nccl_id = &id;
  o.ep.timeout_ms = r->a->ep_timeout_s * 1000;
  o.ep.nonblocking_comm = r->a->ep_nonblocking_comm;
  TRY(moejit_model_load_config(r->ctx, what, &o, &r->ep));
  r->spec = *moejit_model_spec(r->ep);
  TRY(moejit_model_load_config(r->ctx, what, NULL, &r->single));
  TRY(moejit_model_ep_local_experts(r->ep, r->local, 1024, &r->n_local));
  TRY(moejit_stream_create(r->ctx, &r->stream));
  for (int i = 0; i < MOEJIT_EP_EVENTS; i++) TRY(moejit_event_create(r->ctx, &r->ev[i]));
  TRY(moejit_event_create(r->ctx, &r->t0));
  return moejit_event_create(r->ctx, &r->t1);
}

static moejit_status alloc(ep_rank *r, size_t bytes, void **p) {
  return moejit_mem_alloc(r->ctx, bytes ? bytes : 16, r->stream, p);
}

/* All experts' weights (for the single-GPU layer), then this rank's slice:
 * its local experts copied in id order. */
static moejit_status make_weights(ep_rank *r) {
  const moejit_spec *s = &r->spec;
  const size_t es = moejit_dtype_size(s->weight_dtype);
  const size_t e1 = 2 * (size_t)s->expert_width * (size_t)s->hidden, e2 = e1 / 2;
  const size_t E = (size_t)s->experts, L = (size_t)r->n_local;
  if (!run_block_make(&r->b1, s->weight_dtype, 1.0 / run_sqrt((double)s->hidden), 0x5eed0001) ||
      !run_block_make(&r->b2, s->weight_dtype, 1.0 / run_sqrt((double)s->expert_width),
                      0x5eed0002) ||
      !run_block_make(&r->bx, s->act_dtype, 1.0, 0x5eed0003 + 17 * (uint64_t)r->rank))
    return MOEJIT_ERR_OUT_OF_MEMORY;
  const size_t act = moejit_dtype_size(s->act_dtype);
  TRY(alloc(r, E * e1 * es, &r->w1));
  TRY(alloc(r, E * e2 * es, &r->w2));
  TRY(alloc(r, L * e1 * es, &r->lw1));
  TRY(alloc(r, L * e2 * es, &r->lw2));
  TRY(alloc(r, RUN_BLOCK_ELEMS * (es > act ? es : act), &r->scratch));
  TRY(run_fill_periodic(r->ctx, &r->b1, r->scratch, r->w1, E * e1, r->stream));
  TRY(run_fill_periodic(r->ctx, &r->b2, r->scratch, r->w2, E * e2, r->stream));
  for (size_t i = 0; i < L; i++) {
    const size_t e = (size_t)r->local[i];
    TRY(moejit_memcpy_dtod(r->ctx, (char *)r->lw1 + i * e1 * es, (char *)r->w1 + e * e1 * es,
                           e1 * es, r->stream));
    TRY(moejit_memcpy_dtod(r->ctx, (char *)r->lw2 + i * e2 * es, (char *)r->w2 + e * e2 * es,
                           e2 * es, r->stream));
  }
  return wait_stream(r);
}

static size_t row_bytes(const moejit_spec *s) {
  return (size_t)s->hidden * moejit_dtype_size(s->act_dtype) + 8 * (size_t)s->top_k;
}

static moejit_status make_buffers(ep_rank *r) {
  const moejit_spec *s = &r->spec;
  int64_t t = 1;
  for (int i = 0; i < r->a->n_tokens; i++)
    if (r->a->tokens[i] > t) t = r->a->tokens[i];
  r->max_tokens = t;
  const size_t d = (size_t)s->hidden, k = (size_t)s->top_k;
  TRY(moejit_moe_workspace_size(r->ep, t, &r->ws_bytes));
  TRY(moejit_moe_workspace_size(r->single, t, &r->ws1_bytes));
  r->a2a_bytes = (size_t)t * row_bytes(s);
  TRY(alloc(r, (size_t)t * d * moejit_dtype_size(s->act_dtype), &r->x));
  TRY(alloc(r, (size_t)t * s->experts * moejit_dtype_size(s->logits_dtype), &r->logits));
  TRY(alloc(r, (size_t)t * d * moejit_dtype_size(s->out_dtype), &r->out));
  TRY(alloc(r, r->ws_bytes, &r->ws));
  TRY(alloc(r, r->ws1_bytes, &r->ws1));
  TRY(alloc(r, (size_t)t * k * 4, &r->ids));
  TRY(alloc(r, (size_t)t * k * 4, &r->weights));
  TRY(alloc(r, 4, &r->dropped));
  TRY(alloc(r, (size_t)r->world * r->a2a_bytes, &r->a2a_send));
  return alloc(r, (size_t)r->world * r->a2a_bytes, &r->a2a_recv);
}

/* Router logits for this rank's t tokens. "uniform": random permutations;
 * "one-rank": every token's experts all on rank 0 (the others get the
 * lowest logit, -8, below every rank-0 value). */
static moejit_status make_inputs(ep_rank *r, int64_t t) {
  const moejit_spec *s = &r->spec;
  if (t == 0) return MOEJIT_OK;
  TRY(run_fill_periodic(r->ctx, &r->bx, r->scratch, r->x, (size_t)t * s->hidden, r->stream));
  const size_t n = (size_t)t * s->experts, lsz = moejit_dtype_size(s->logits_dtype);
  float *l = run_make_logits(t, s->experts, 0x5eed0004 + 31 * (uint64_t)r->rank);
  void *packed = malloc(n * lsz);
  moejit_status st = l && packed ? MOEJIT_OK : MOEJIT_ERR_OUT_OF_MEMORY;
  if (!st && !strcmp(r->a->ep_route, "one-rank")) {
    const int rank0_experts = s->experts / r->world; /* contiguous placement */
    for (size_t i = 0; i < n; i++)
      if ((int)(i % (size_t)s->experts) >= rank0_experts) l[i] = -8.0f;
  }
  if (!st) run_pack(s->logits_dtype, l, packed, n);
  if (!st) st = moejit_memcpy_htod(r->ctx, r->logits, packed, n * lsz, r->stream);
  if (!st) st = wait_stream(r);
  free(l);
  free(packed);
  return st;
}

/* ---- one point -------------------------------------------------------------- */

static moejit_moe_args ep_args(const ep_rank *r, int64_t t, int64_t capacity, int events) {
  moejit_moe_args a = {.tokens = t,
                       .x = r->x,
                       .logits = r->logits,
                       .w1 = r->lw1,
                       .w2 = r->lw2,
                       .out = r->out,
                       .workspace = r->ws,
                       .workspace_bytes = r->ws_bytes,
                       .topk_ids = r->ids,
                       .topk_weights = r->weights,
                       .ep_capacity = capacity,
                       .ep_dropped = r->dropped,
                       .ep_events = events ? (moejit_event *)r->ev : NULL};
  return a;
}

static moejit_moe_args single_args(const ep_rank *r, int64_t t) {
  moejit_moe_args a = {.tokens = t,
                       .x = r->x,
                       .logits = r->logits,
                       .w1 = r->w1,
                       .w2 = r->w2,
                       .out = r->out,
                       .workspace = r->ws1,
                       .workspace_bytes = r->ws1_bytes};
  return a;
}

static size_t out_bytes(const ep_rank *r, int64_t t) {
  return (size_t)t * r->spec.hidden * moejit_dtype_size(r->spec.out_dtype);
}

/* Poisons out (NaN), runs `model` (or `graph`), downloads out. */
static moejit_status run_once(ep_rank *r, const moejit_model *m, const moejit_moe_args *a,
                              moejit_graph *graph, void *host) {
  const size_t bytes = out_bytes(r, a->tokens);
  if (bytes) TRY(moejit_memset_d32(r->ctx, r->out, 0xffffffffu, bytes / 4, r->stream));
  TRY(graph ? moejit_graph_launch(r->ctx, graph, r->stream) : moejit_moe_forward(m, a, r->stream));
  if (bytes) TRY(moejit_memcpy_dtoh(r->ctx, host, r->out, bytes, r->stream));
  return wait_stream(r);
}

static double rel_err(const moejit_spec *s, const void *got, const void *ref, size_t n) {
  double e = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    const double g = run_unpack_one(s->out_dtype, got, i), f = run_unpack_one(s->out_dtype, ref, i);
    e += (g - f) * (g - f);
    norm += f * f;
  }
  if (!(e <= 1.7e308)) return 1.0 / 0.0;
  return run_sqrt(e) / (norm > 0 ? run_sqrt(norm) : 1.0);
}

/* Float64 reference of a few tokens, with the ids and weights the
 * expert-parallel forward routed. */
static moejit_status check_f64(ep_rank *r, int64_t t, const void *host, ep_point *p) {
  const moejit_spec *s = &r->spec;
  const size_t k = (size_t)s->top_k, d = (size_t)s->hidden;
  const size_t n = t < EP_SAMPLES ? (size_t)t : EP_SAMPLES;
  int32_t *ids = malloc((size_t)t * k * 4), sid[EP_SAMPLES * 32];
  float *w = malloc((size_t)t * k * 4), sw[EP_SAMPLES * 32];
  double *ref = malloc(sizeof(double) * n * d);
  int64_t tok[EP_SAMPLES];
  moejit_status st = ids && w && ref ? MOEJIT_OK : MOEJIT_ERR_OUT_OF_MEMORY;
  if (!st) st = moejit_memcpy_dtoh(r->ctx, ids, r->ids, (size_t)t * k * 4, r->stream);
  if (!st) st = moejit_memcpy_dtoh(r->ctx, w, r->weights, (size_t)t * k * 4, r->stream);
  if (!st) st = wait_stream(r);
  if (!st) {
    for (size_t i = 0; i < n; i++) {
      tok[i] = n == (size_t)t ? (int64_t)i : (int64_t)i * (t - 1) / (int64_t)(n - 1);
      memcpy(&sid[i * k], &ids[(size_t)tok[i] * k], 4 * k);
      memcpy(&sw[i * k], &w[(size_t)tok[i] * k], 4 * k);
    }
    run_reference(s, &r->bx, &r->b1, &r->b2, tok, n, sid, sw, ref);
    double e = 0, norm = 0;
    for (size_t i = 0; i < n; i++)
      for (size_t c = 0; c < d; c++) {
        const double g = run_unpack_one(s->out_dtype, host, (size_t)tok[i] * d + c);
        e += (g - ref[i * d + c]) * (g - ref[i * d + c]);
        norm += ref[i * d + c] * ref[i * d + c];
      }
    p->err_f64 = e <= 1.7e308 ? run_sqrt(e) / (norm > 0 ? run_sqrt(norm) : 1.0) : 1.0 / 0.0;
  }
  free(ids);
  free(w);
  free(ref);
  return st;
}

static double tolerance(const moejit_spec *s) {
  return s->act_dtype == MOEJIT_DTYPE_FP32 ? 1e-4 : s->act_dtype == MOEJIT_DTYPE_FP16 ? 5e-3 : 1e-2;
}

static void verdict(const ep_rank *r, ep_point *p) {
  const double tol = tolerance(&r->spec);
  if (p->tokens == 0) {
    p->ok = 1;
    return;
  }
  if (!(p->err_exact <= tol))
    snprintf(p->problem, sizeof p->problem, "exact vs one GPU: relative error %.3g > %.0e",
             p->err_exact, tol);
  else if (!(p->err_capacity <= tol))
    snprintf(p->problem, sizeof p->problem, "capacity vs one GPU: relative error %.3g > %.0e",
             p->err_capacity, tol);
  else if (!(p->err_f64 <= tol))
    snprintf(p->problem, sizeof p->problem, "vs float64: relative error %.3g > %.0e", p->err_f64,
             tol);
  else if (p->dropped)
    snprintf(p->problem, sizeof p->problem, "%d (token, rank) pairs dropped at capacity %lld",
             p->dropped, (long long)p->capacity);
  p->ok = !p->problem[0];
}

/* Checks: single GPU, exact, capacity, graph replay of the capacity run. */
static moejit_status check_point(ep_rank *r, ep_point *p, moejit_graph **graph, moejit_graph **g1) {
  const int64_t t = p->tokens;
  const size_t bytes = out_bytes(r, t), n = bytes / moejit_dtype_size(r->spec.out_dtype);
  char *ref = malloc(bytes + 16), *got = malloc(bytes + 16), *again = malloc(bytes + 16);
  moejit_status st = ref && got && again ? MOEJIT_OK : MOEJIT_ERR_OUT_OF_MEMORY;
  moejit_moe_args sa = single_args(r, t), ea = ep_args(r, t, 0, 0),
                  ca = ep_args(r, t, p->capacity, 1);
  if (!st && t > 0) st = run_once(r, r->single, &sa, NULL, ref);
  if (!st) st = run_once(r, r->ep, &ea, NULL, got);
  if (!st && t > 0) {
    p->err_exact = rel_err(&r->spec, got, ref, n);
    st = check_f64(r, t, got, p);
  }
  if (!st) st = run_once(r, r->ep, &ca, NULL, got);
  if (!st && t > 0) p->err_capacity = rel_err(&r->spec, got, ref, n);
  int32_t dropped = 0;
  if (!st) st = moejit_memcpy_dtoh(r->ctx, &dropped, r->dropped, 4, r->stream);
  if (!st) st = wait_stream(r);
  p->dropped = dropped;
  /* capture the capacity forward (its phase events inside) and the
   * single-GPU layer; the replay must give the eager bits */
  if (!st) st = moejit_graph_begin_capture(r->ctx, r->stream);
  if (!st) {
    moejit_status fwd = moejit_moe_forward(r->ep, &ca, r->stream);
    st = moejit_graph_end_capture(r->ctx, r->stream, graph);
    if (!st) st = fwd;
  }
  if (!st) st = run_once(r, NULL, &ca, *graph, again);
  if (!st && memcmp(got, again, bytes) != 0)
    snprintf(p->problem, sizeof p->problem, "graph replay differs from the eager capacity run");
  if (!st && t > 0) {
    st = moejit_graph_begin_capture(r->ctx, r->stream);
    if (!st) {
      moejit_status fwd = moejit_moe_forward(r->single, &sa, r->stream);
      st = moejit_graph_end_capture(r->ctx, r->stream, g1);
      if (!st) st = fwd;
    }
  }
  free(ref);
  free(got);
  free(again);
  return st;
}

static int cmp_double(const void *x, const void *y) {
  const double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static moejit_status elapsed(ep_rank *r, moejit_event a, moejit_event b, double *ms) {
  float f = 0;
  TRY(moejit_event_elapsed_ms(r->ctx, a, b, &f));
  *ms = f;
  return MOEJIT_OK;
}

/* Every rank runs the same sequence of collectives: the single-GPU layer is
 * local, the rest is the same on all ranks. */
static moejit_status time_point(ep_rank *r, ep_point *p, moejit_graph *graph, moejit_graph *g1) {
  const int iters = r->a->iters, n = EP_WARMUPS + iters;
  double *v = calloc((size_t)iters * 9, sizeof *v);
  if (!v) return MOEJIT_ERR_OUT_OF_MEMORY;
  moejit_moe_args ea = ep_args(r, p->tokens, 0, 0);
  moejit_status st = MOEJIT_OK;
  for (int i = 0; i < n && !st; i++) {
    const int at = i - EP_WARMUPS;
    double ms[9] = {0};
    if (g1) { /* one GPU, all experts */
      st = moejit_event_record(r->ctx, r->t0, r->stream);
      if (!st) st = moejit_graph_launch(r->ctx, g1, r->stream);
      if (!st) st = moejit_event_record(r->ctx, r->t1, r->stream);
      if (!st) st = wait_stream(r);
      if (!st) st = elapsed(r, r->t0, r->t1, &ms[0]);
    }
    if (!st) st = moejit_event_record(r->ctx, r->t0, r->stream); /* exact, eager */
    if (!st) st = moejit_moe_forward(r->ep, &ea, r->stream);
    if (!st) st = moejit_event_record(r->ctx, r->t1, r->stream);
    if (!st) st = wait_stream(r);
    if (!st) st = elapsed(r, r->t0, r->t1, &ms[1]);
    if (!st) st = moejit_graph_launch(r->ctx, graph, r->stream); /* capacity, graph */
    if (!st) st = wait_stream(r);
    for (int ph = 0; ph < 5 && !st; ph++) st = elapsed(r, r->ev[ph], r->ev[ph + 1], &ms[3 + ph]);
    if (!st) st = elapsed(r, r->ev[0], r->ev[5], &ms[2]);
    if (!st && r->world > 1) { /* NCCL's all-to-all of the dispatch's size */
      const size_t bytes = (size_t)p->capacity * row_bytes(&r->spec);
      st = moejit_event_record(r->ctx, r->t0, r->stream);
      if (!st) st = moejit_ep_alltoall(r->ep, r->a2a_send, r->a2a_recv, bytes, r->stream);
      if (!st) st = moejit_event_record(r->ctx, r->t1, r->stream);
      if (!st) st = wait_stream(r);
      if (!st) st = elapsed(r, r->t0, r->t1, &ms[8]);
    }
    if (at >= 0)
      for (int j = 0; j < 9; j++) v[j * iters + at] = ms[j];
  }
  if (!st) {
    p->single_ms = median(v, iters);
    p->exact_ms = median(v + iters, iters);
    p->graph_ms = median(v + 2 * iters, iters);
    for (int ph = 0; ph < 5; ph++) p->phase_ms[ph] = median(v + (3 + ph) * iters, iters);
    p->a2a_ms = median(v + 8 * iters, iters);
  }
  free(v);
  return st;
}

static moejit_status run_point(ep_rank *r, ep_point *p) {
  TRY(make_inputs(r, p->tokens));
  moejit_graph *graph = NULL, *g1 = NULL;
  moejit_status st = check_point(r, p, &graph, &g1);
  if (!st) st = time_point(r, p, graph, g1);
  moejit_graph_destroy(r->ctx, graph);
  moejit_graph_destroy(r->ctx, g1);
  const double peers = r->world - 1;
  p->dispatch_bytes = peers * (double)p->capacity * (double)row_bytes(&r->spec);
  p->a2a_bytes = p->dispatch_bytes;
  verdict(r, p);
  return st;
}

/* ---- output ----------------------------------------------------------------- */

static double gbs(double bytes, double ms) {
  return ms > 0 ? bytes / (ms * 1e6) : 0;
}

static void print_header(void) {
  printf("%4s %6s %9s %9s %9s %8s %8s %8s %7s %9s %9s %8s %8s %8s  %s\n", "rank", "T",
         "1-GPU ms", "exact ms", "graph ms", "disp ms", "expt ms", "ret ms", "comm %",
         "disp GB/s", "a2a GB/s", "err 1GPU", "err f64", "dropped", "check");
}

static void print_point(const ep_point *p) {
  const double comm = p->phase_ms[1] + p->phase_ms[3];
  printf("%4d %6lld %9.4f %9.4f %9.4f %8.4f %8.4f %8.4f %7.1f %9.1f %9.1f %8.1e %8.1e %8d  %s\n",
         p->rank, (long long)p->tokens, p->single_ms, p->exact_ms, p->graph_ms, p->phase_ms[1],
         p->phase_ms[2], p->phase_ms[3], p->graph_ms > 0 ? 100 * comm / p->graph_ms : 0,
         gbs(p->dispatch_bytes, p->phase_ms[1]), gbs(p->a2a_bytes, p->a2a_ms),
         p->err_exact > p->err_capacity ? p->err_exact : p->err_capacity, p->err_f64, p->dropped,
         p->ok ? "ok" : p->problem);
}

static void print_legend(const run_args *a) {
  printf(
      "T: this rank's tokens. 1-GPU: the whole layer (all experts) on this rank's GPU, graph. "
      "exact: expert-parallel, counts exchanged (eager). graph: capacity = T per peer, captured; "
      "disp/expt/ret: its dispatch, local experts and return phases; comm %% = (disp + ret) / "
      "graph. GB/s: bytes this rank sends to its peers (x rows, ids, weights) / time, beside "
      "NCCL's own all-to-all of the same size. err: relative error vs the 1-GPU layer (the "
      "larger of exact and capacity) and vs float64 on sampled tokens. Medians of %d runs "
      "after %d warm-ups; routing: %s.\n",
      a->iters, EP_WARMUPS, a->ep_route);
}

static void print_point_json(const ep_point *p) {
  printf(
      "{\"rank\":%d,\"world\":%d,\"tokens\":%lld,\"capacity\":%lld,\"single_ms\":%.6f,"
      "\"exact_ms\":%.6f,\"graph_ms\":%.6f,\"pack_ms\":%.6f,\"dispatch_ms\":%.6f,"
      "\"experts_ms\":%.6f,\"return_ms\":%.6f,\"combine_ms\":%.6f,\"a2a_ms\":%.6f,"
      "\"dispatch_bytes\":%.0f,\"err_exact\":%.3e,\"err_capacity\":%.3e,\"err_f64\":%.3e,"
      "\"dropped\":%d,\"ok\":%s,\"problem\":",
      p->rank, p->world, (long long)p->tokens, (long long)p->capacity, p->single_ms, p->exact_ms,
      p->graph_ms, p->phase_ms[0], p->phase_ms[1], p->phase_ms[2], p->phase_ms[3], p->phase_ms[4],
      p->a2a_ms, p->dispatch_bytes, p->err_exact <= 1.7e308 ? p->err_exact : -1.0,
      p->err_capacity <= 1.7e308 ? p->err_capacity : -1.0,
      p->err_f64 <= 1.7e308 ? p->err_f64 : -1.0, p->dropped, p->ok ? "true" : "false");
  cli_json_str(stdout, p->problem);
  printf("}");
}

static void print_all(const run_args *a, const moejit_spec *s, const ep_point *pts, int n,
                      int ok) {
  int v = 0;
  (void)moejit_nccl_version(&v);
  /* as the ranks' loads made it (moejit_ep_opts.nonblocking_comm) */
  const char *comm = a->ep_nonblocking_comm ? "nonblocking" : "blocking";
  if (a->json) {
    printf("{\"config\":");
    cli_json_str(stdout, s->name);
    printf(",\"ep\":%d,\"nccl_version\":%d,\"comm\":\"%s\",\"route\":", a->ep, v, comm);
    cli_json_str(stdout, a->ep_route);
    printf(",\"iters\":%d,\"points\":[", a->iters);
    for (int i = 0; i < n; i++) {
      if (i) printf(",");
      print_point_json(&pts[i]);
    }
    printf("],\"ok\":%s}\n", ok ? "true" : "false");
    return;
  }
  char per_rank[32];
  if (s->experts % a->ep)
    snprintf(per_rank, sizeof per_rank, "%d-%d", s->experts / a->ep, s->experts / a->ep + 1);
  else
    snprintf(per_rank, sizeof per_rank, "%d", s->experts / a->ep);
  printf(
      "moejit run --ep %d: %s (d=%lld f=%lld E=%d k=%d), %s experts per rank, NCCL %d.%d.%d, "
      "%s communicator\n",
      a->ep, s->name, (long long)s->hidden, (long long)s->expert_width, s->experts, s->top_k,
      per_rank, v / 10000, v / 100 % 100, v % 100, comm);
  print_header();
  for (int i = 0; i < n; i++) print_point(&pts[i]);
  print_legend(a);
}

/* ---- one rank ----------------------------------------------------------------- */

static void release(ep_rank *r) {
  void *bufs[] = {r->w1,  r->w2,      r->lw1, r->lw2,     r->scratch,  r->x,
                  r->logits, r->out,  r->ws,  r->ws1,     r->ids,      r->weights,
                  r->dropped, r->a2a_send, r->a2a_recv};
  if (r->ctx) {
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
      if (bufs[i]) (void)moejit_mem_free(r->ctx, bufs[i], r->stream);
    (void)wait_stream(r);
    for (int i = 0; i < MOEJIT_EP_EVENTS; i++)
      if (r->ev[i]) (void)moejit_event_destroy(r->ctx, r->ev[i]);
    if (r->t0) (void)moejit_event_destroy(r->ctx, r->t0);
    if (r->t1) (void)moejit_event_destroy(r->ctx, r->t1);
    if (r->stream) (void)moejit_stream_destroy(r->ctx, r->stream);
  }
  moejit_model_destroy(r->ep);
  moejit_model_destroy(r->single);
  if (moejit_ep_pending_teardowns() > 0) {
    /* NCCL still tears the communicator down on another thread, waiting
     * for a peer (one that died after its last exchange): destroying the
     * ctx under it is not safe */
    fprintf(stderr,
            "moejit: run --ep: rank %d exits without cleaning up (NCCL's teardown of the "
            "communicator had not returned %d s later: a peer may have died)\n",
            r->rank, r->a->ep_timeout_s);
    fflush(stdout);
    fflush(stderr);
    _exit(CLI_EXIT_FAILURE);
  }
  moejit_ctx_destroy(r->ctx);
  run_block_free(&r->bx);
  run_block_free(&r->b1);
  run_block_free(&r->b2);
}

/* Runs rank a->ep_rank; points go to report_fd (binary ep_point records)
 * when >= 0, else printed. */
static int rank_main(const run_args *a, int report_fd) {
  ep_rank *r = calloc(1, sizeof *r);
  if (!r) return cli_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory");
  r->a = a;
  r->rank = a->ep_rank;
  r->world = a->ep;
  moejit_status st = load(r);
  if (!st) st = make_weights(r);
  if (!st) st = make_buffers(r);
  ep_point pts[16];
  int n = 0, ok = 1;
  for (int i = 0; i < a->n_tokens && !st; i++, n++) {
    ep_point *p = &pts[i];
    memset(p, 0, sizeof *p);
    p->rank = r->rank;
    p->world = r->world;
    p->capacity = a->tokens[i];
    p->tokens = !strcmp(a->ep_route, "idle-rank") && r->rank == r->world - 1 ? 0 : a->tokens[i];
    st = run_point(r, p);
    ok &= p->ok;
  }
  int rc = CLI_EXIT_OK;
  if (st) {
    char what[64];
    snprintf(what, sizeof what, "run --ep: rank %d", r->rank);
    rc = cli_fail(st, what);
    if (rc == CLI_EXIT_USAGE) rc = CLI_EXIT_FAILURE;
    moejit_ep_info info;
    if (r->ep && moejit_model_ep_info(r->ep, &info) == MOEJIT_OK && info.abort_pending) {
      /* NCCL is still freeing the communicator on another thread, waiting
       * for the dead peer: tearing CUDA down under it is not safe */
      fprintf(stderr,
              "moejit: run --ep: rank %d exits without cleaning up (NCCL's abort has not "
              "returned)\n",
              r->rank);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  } else if (report_fd >= 0) {
    for (int i = 0; i < n; i++)
      if (write(report_fd, &pts[i], sizeof pts[i]) != (ssize_t)sizeof pts[i]) rc = CLI_EXIT_FAILURE;
    if (!ok && !rc) rc = EP_EXIT_CHECK;
  } else {
    print_all(a, &r->spec, pts, n, ok);
    if (!ok) rc = CLI_EXIT_FAILURE;
  }
  release(r);
  free(r);
  return rc;
}

/* ---- launcher ---------------------------------------------------------------- */

static int cmp_point(const void *x, const void *y) {
  const ep_point *a = x, *b = y;
  if (a->capacity != b->capacity) return a->capacity < b->capacity ? -1 : 1;
  return a->rank - b->rank;
}

/* Starts `world` copies of this program as ranks 0..world-1, collects their
 * points, and kills the others when one fails (their NCCL calls would wait
 * for it forever). */
static int launch(const run_args *a, const moejit_spec *s, int argc, char **argv) {
  char dir[] = "/tmp/moejit-ep-XXXXXX", id_path[64], self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0 || !mkdtemp(dir)) {
    fprintf(stderr, "moejit: run --ep: cannot find this program or make a temporary directory: %s\n",
            strerror(errno));
    return CLI_EXIT_FAILURE;
  }
  self[len] = '\0';
  snprintf(id_path, sizeof id_path, "%s/nccl-id", dir);
  const int world = a->ep;
  pid_t pids[MOEJIT_EP_MAX_WORLD];
  int fds[MOEJIT_EP_MAX_WORLD], started = 0;
  char **args = calloc((size_t)argc + 6, sizeof *args);
  char rank_text[16];
  if (!args) return cli_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory");
  args[0] = self; /* then "run" and its options */
  for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
  args[argc + 1] = "--ep-rank";
  args[argc + 2] = rank_text;
  args[argc + 3] = "--ep-id-file";
  args[argc + 4] = id_path;
  fflush(stdout);
  for (int r = 0; r < world; r++) {
    int p[2];
    if (pipe(p) != 0) break;
    snprintf(rank_text, sizeof rank_text, "%d", r);
    char fd_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", p[1]);
    setenv("MOEJIT_EP_REPORT_FD", fd_text, 1); /* here: the child only execs */
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      execv(self, args);
      _exit(127);
    }
    close(p[1]);
    if (pid < 0) {
      close(p[0]);
      break;
    }
    pids[started] = pid;
    fds[started++] = p[0];
  }
  free(args);
  unsetenv("MOEJIT_EP_REPORT_FD");
  /* A rank that stops early (or never started) leaves the others waiting
   * in NCCL: stop them. One that only failed a check finished its part. */
  int failed = started < world, killed = 0, status = 0, reaped[MOEJIT_EP_MAX_WORLD] = {0};
  if (failed)
    for (int i = 0; i < started; i++) kill(pids[i], SIGTERM), killed = 1;
  for (int done = 0; done < started;) {
    pid_t pid = wait(&status);
    if (pid < 0) break;
    done++;
    for (int i = 0; i < started; i++)
      if (pids[i] == pid) reaped[i] = 1;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (code == EP_EXIT_CHECK) {
      failed = 1;
    } else if (code != 0) {
      failed = 1;
      if (!killed)
        for (int i = 0; i < started; i++)
          if (!reaped[i]) kill(pids[i], SIGTERM);
      killed = 1;
    }
  }
  ep_point pts[MOEJIT_EP_MAX_WORLD * 16];
  int n = 0, ok = !failed;
  for (int i = 0; i < started; i++) {
    while (n < MOEJIT_EP_MAX_WORLD * 16 && read(fds[i], &pts[n], sizeof pts[n]) == sizeof pts[n])
      ok &= pts[n++].ok;
    close(fds[i]);
  }
  unlink(id_path);
  rmdir(dir);
  qsort(pts, (size_t)n, sizeof *pts, cmp_point);
  if (n) print_all(a, s, pts, n, ok);
  if (failed && started < world)
    fprintf(stderr, "moejit: run --ep: could not start %d ranks\n", world);
  else if (!ok)
    fprintf(stderr, "moejit: run --ep: a rank failed or a check failed (see above)\n");
  return ok ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}

int run_ep(const run_args *a, const moejit_spec *spec, int argc, char **argv) {
  int v = 0;
  if (moejit_nccl_version(&v) != MOEJIT_OK) return cli_fail(MOEJIT_ERR_UNSUPPORTED, "run --ep");
  if (a->ep_rank >= 0) {
    const char *fd = getenv("MOEJIT_EP_REPORT_FD");
    return rank_main(a, fd && *fd ? atoi(fd) : -1);
  }
  int devices = 0;
  if (moejit_device_count(&devices) == MOEJIT_OK && devices < a->ep) {
    fprintf(stderr,
            "moejit: run --ep %d needs %d GPUs on this machine (one per rank), it has %d; HINT: "
            "lower --ep, or start ranks on several machines with --ep-rank and --ep-id-file\n",
            a->ep, a->ep, devices);
    return CLI_EXIT_FAILURE;
  }
  return launch(a, spec, argc, argv);
}
