/* `moejit run` on a GPU: cold and warm model load, inputs filled on the
 * device, one checked eager run per token count, then eager and graph
 * timings (CUDA events, median) against the floor; see run_gpu.h. */
#include "cli/run_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/run_data.h"

#define WARMUPS 3
#define MAX_SAMPLES 8
#define GIB (1024.0 * 1024.0 * 1024.0)
/* Part of the free device memory we let ourselves use. */
#define MEM_FRACTION 0.9
/* The L2 flush before each timed run reads this many times the L2's size,
 * in copies of FLUSH_CHUNK bytes into one FLUSH_CHUNK target. */
#define FLUSH_TIMES 2
#define FLUSH_CHUNK ((size_t)1 << 20)

typedef struct point {
  int64_t tokens;
  int skipped;
  double need_bytes;
  double eager_ms, graph_ms, flops, weight_bytes, io_bytes, floor_ms, rel_err;
  double heur_ms, heur_rel_err; /* --vs-heuristic: the tables-off layer's graph time, check */
  double logits_err;            /* --gate-weight: the router's logits against float64 */
  int active, checked, logits_checked, ok;
  char problem[256];
} point;

typedef struct gpu_state {
  const run_args *a;
  const moejit_spec *s;
  moejit_ctx *ctx;
  moejit_model *model;
  moejit_model *heur; /* --vs-heuristic: the same layer, tuned tables off; else NULL */
  moejit_load_report cold, warm, heur_load;
  moejit_device_info dev;
  moejit_stream stream;
  moejit_event ev0, ev1;
  run_block bx, b1, b2, bg; /* bg: the router's weight (--gate-weight) */
  void *w1, *w2, *scratch, *x, *logits, *out, *ws, *ids, *weights, *flush, *gate;
  size_t ws_bytes, free_after_weights, flush_bytes;
  int64_t max_tokens;
  point points[16];
  int n_points;
  int reported; /* 1: a failure was already printed (not a library error) */
} gpu_state;

double run_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double max2(double a, double b) {
  return a > b ? a : b;
}

static size_t act_size(const moejit_spec *s) {
  return moejit_dtype_size(s->act_dtype);
}

/* ---- setup ----------------------------------------------------------------- */

static moejit_status make_ctx(const gpu_state *g, moejit_ctx **ctx) {
  moejit_ctx_opts opts;
  moejit_ctx_opts_init(&opts);
  opts.compiler.cache_dir = g->a->cache_dir;
  return moejit_ctx_create(ctx, &opts);
}

/* One load into ctx: of the config or preset named (its path or name in
 * the report), or with run_args.result of the spec given. */
static moejit_status load_one(const gpu_state *g, moejit_ctx *ctx, const moejit_load_opts *o,
                              moejit_model **m) {
  if (g->a->result) return moejit_model_load_spec(ctx, g->s, o, m);
  char name[MOEJIT_NAME_MAX + 8];
  return moejit_model_load_config(
      ctx, cli_model_name(g->a->preset, g->a->config, name, sizeof name), o, m);
}

/* The first load compiles or reads the disk cache; the second, in a fresh
 * ctx (its own compiler memory and module memo), is what a warm start of
 * an engine costs. The run keeps the second. */
static moejit_status load_twice(gpu_state *g) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.report = &g->cold;
  o.tuned_table = g->a->tuned_table;
  moejit_status st = MOEJIT_OK;
  if (!g->a->result) { /* the cold load, in a ctx of its own (a caller's result needs one load) */
    moejit_ctx *first = NULL;
    moejit_model *m = NULL;
    st = make_ctx(g, &first);
    if (!st) st = load_one(g, first, &o, &m);
    if (!st) st = make_ctx(g, &g->ctx); /* before `first` goes: keeps the primary ctx alive */
    moejit_model_destroy(m);
    moejit_ctx_destroy(first);
    o.report = &g->warm;
  } else {
    st = make_ctx(g, &g->ctx);
  }
  if (!st) st = load_one(g, g->ctx, &o, &g->model);
  if (g->a->result) g->warm = g->cold;
  if (!st && g->a->vs_heuristic) {
    o.report = &g->heur_load, o.tuned_disable = 1;
    st = load_one(g, g->ctx, &o, &g->heur);
  }
  return st ? st : moejit_ctx_device_info(g->ctx, &g->dev);
}

/* The workspace a forward of t tokens needs: the model's, or with
 * --vs-heuristic the larger of the two models' (they share the buffers). */
static moejit_status ws_size(const gpu_state *g, int64_t t, size_t *ws) {
  size_t h = 0;
  moejit_status st = moejit_moe_workspace_size(g->model, t, ws);
  if (!st && g->heur && !(st = moejit_moe_workspace_size(g->heur, t, &h)) && h > *ws) *ws = h;
  return st;
}

static moejit_status alloc(gpu_state *g, size_t bytes, void **p) {
  return moejit_mem_alloc(g->ctx, bytes ? bytes : 16, g->stream, p);
}

static moejit_status make_weights(gpu_state *g) {
  const moejit_spec *s = g->s;
  const size_t ws = moejit_dtype_size(s->weight_dtype);
  const size_t n1 = (size_t)s->experts * 2 * (size_t)s->expert_width * (size_t)s->hidden;
  const size_t n2 = (size_t)s->experts * (size_t)s->hidden * (size_t)s->expert_width;
  size_t free_bytes = 0;
  moejit_status st = moejit_mem_get_info(g->ctx, &free_bytes, NULL);
  if (st) return st;
  const size_t ng = g->a->gate_weight ? (size_t)s->experts * (size_t)s->hidden : 0;
  const double need = (double)(n1 + n2 + ng + RUN_BLOCK_ELEMS) * ws;
  if (need > MEM_FRACTION * (double)free_bytes) {
    fprintf(stderr, "moejit: the weights of %s need %.1f GiB; the GPU has %.1f GiB free\n", s->name,
            need / GIB, (double)free_bytes / GIB);
    g->reported = 1;
    return MOEJIT_ERR_OUT_OF_MEMORY;
  }
  if (!run_block_make(&g->b1, s->weight_dtype, 1.0 / run_sqrt((double)s->hidden), 0x5eed0001) ||
      !run_block_make(&g->b2, s->weight_dtype, 1.0 / run_sqrt((double)s->expert_width),
                      0x5eed0002) ||
      !run_block_make(&g->bx, s->act_dtype, 1.0, 0x5eed0003) ||
      /* logits of about unit size: x in [-1, 1], the weight in [-a, a] with
       * a = 3 / sqrt(d), so their variance is d * (1/3) * (a^2 / 3) = 1 */
      (ng &&
       !run_block_make(&g->bg, s->weight_dtype, 3.0 / run_sqrt((double)s->hidden), 0x5eed0005))) {
    fprintf(stderr, "moejit: out of host memory for the input blocks\n");
    g->reported = 1;
    return MOEJIT_ERR_OUT_OF_MEMORY;
  }
  const size_t scratch = RUN_BLOCK_ELEMS * (ws > act_size(s) ? ws : act_size(s));
  const size_t l2 = g->dev.l2_bytes > 0 ? (size_t)g->dev.l2_bytes : (size_t)50 << 20;
  g->flush_bytes = FLUSH_CHUNK + (FLUSH_TIMES * l2 + FLUSH_CHUNK - 1) / FLUSH_CHUNK * FLUSH_CHUNK;
  if ((st = alloc(g, n1 * ws, &g->w1)) || (st = alloc(g, n2 * ws, &g->w2)) ||
      (st = alloc(g, scratch, &g->scratch)) || (st = alloc(g, g->flush_bytes, &g->flush)) ||
      (st = moejit_memset_d32(g->ctx, g->flush, 0x3c3c3c3cu, g->flush_bytes / 4, g->stream)))
    return st;
  if ((st = run_fill_periodic(g->ctx, &g->b1, g->scratch, g->w1, n1, g->stream)) ||
      (st = run_fill_periodic(g->ctx, &g->b2, g->scratch, g->w2, n2, g->stream)) ||
      (ng && ((st = alloc(g, ng * ws, &g->gate)) ||
              (st = run_fill_periodic(g->ctx, &g->bg, g->scratch, g->gate, ng, g->stream)))) ||
      (st = moejit_stream_synchronize(g->ctx, g->stream)))
    return st;
  return moejit_mem_get_info(g->ctx, &g->free_after_weights, NULL);
}

static double io_bytes_for(const gpu_state *g, int64_t t) {
  const moejit_spec *s = g->s;
  return (double)t * ((double)s->hidden * (act_size(s) + moejit_dtype_size(s->out_dtype)) +
                      (double)s->experts * moejit_dtype_size(s->logits_dtype) + 8.0 * s->top_k);
}

/* The largest token count whose buffers fit; larger ones are skipped. */
static moejit_status plan_points(gpu_state *g) {
  g->n_points = g->a->n_tokens;
  for (int i = 0; i < g->n_points; i++) {
    point *p = &g->points[i];
    memset(p, 0, sizeof *p);
    p->tokens = g->a->tokens[i];
    size_t ws = 0;
    moejit_status st = ws_size(g, p->tokens, &ws);
    if (st) return st;
    p->need_bytes = io_bytes_for(g, p->tokens) + (double)ws + 4096.0;
    p->skipped = p->need_bytes > MEM_FRACTION * (double)g->free_after_weights;
    if (!p->skipped && p->tokens > g->max_tokens) g->max_tokens = p->tokens;
  }
  return MOEJIT_OK;
}

static moejit_status make_inputs(gpu_state *g) {
  const moejit_spec *s = g->s;
  const int64_t t = g->max_tokens;
  const size_t lsz = moejit_dtype_size(s->logits_dtype), n_logits = (size_t)t * s->experts;
  moejit_status st = ws_size(g, t, &g->ws_bytes);
  if (st || (st = alloc(g, (size_t)t * s->hidden * act_size(s), &g->x)) ||
      (st = alloc(g, n_logits * lsz, &g->logits)) ||
      (st = alloc(g, (size_t)t * s->hidden * moejit_dtype_size(s->out_dtype), &g->out)) ||
      (st = alloc(g, g->ws_bytes, &g->ws)) || (st = alloc(g, (size_t)t * s->top_k * 4, &g->ids)) ||
      (st = alloc(g, (size_t)t * s->top_k * 4, &g->weights)))
    return st;
  if ((st = run_fill_periodic(g->ctx, &g->bx, g->scratch, g->x, (size_t)t * s->hidden, g->stream)))
    return st;
  float *logits = run_make_logits(t, s->experts, 0x5eed0004);
  void *packed = malloc(n_logits * lsz);
  if (!logits || !packed) {
    free(logits);
    free(packed);
    fprintf(stderr, "moejit: out of host memory for the logits\n");
    g->reported = 1;
    return MOEJIT_ERR_OUT_OF_MEMORY;
  }
  run_pack(s->logits_dtype, logits, packed, n_logits);
  st = moejit_memcpy_htod(g->ctx, g->logits, packed, n_logits * lsz, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream);
  free(logits);
  free(packed);
  return st;
}

/* ---- one point ------------------------------------------------------------- */

static moejit_moe_args forward_args(const gpu_state *g, int64_t t) {
  moejit_moe_args a = {.tokens = t,
                       .x = g->x,
                       .logits = g->logits,
                       .w1 = g->w1,
                       .w2 = g->w2,
                       .out = g->out,
                       .workspace = g->ws,
                       .workspace_bytes = g->ws_bytes,
                       .topk_ids = g->ids,
                       .topk_weights = g->weights};
  if (g->gate) /* the layer computes the logits, into the logits buffer */
    a.logits = NULL, a.gate_weight = g->gate, a.router_logits = g->logits;
  return a;
}

static moejit_status poison_out(const gpu_state *g, int64_t t) {
  size_t bytes = (size_t)t * g->s->hidden * moejit_dtype_size(g->s->out_dtype);
  return moejit_memset_d32(g->ctx, g->out, 0xffffffffu, bytes / 4, g->stream); /* NaN */
}

static int cmp_float(const void *x, const void *y) {
  float a = *(const float *)x, b = *(const float *)y;
  return a < b ? -1 : a > b;
}

static double median_of(float *ms, int n) {
  qsort(ms, (size_t)n, sizeof *ms, cmp_float);
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

/* Empties L2 of what the last run left there, as a model's other layers do
 * between two calls of this one: demotes the lines the kernels stored with
 * the evict_last policy (h, y, gathered x rows), which a stream of other
 * data does not evict otherwise, then reads FLUSH_TIMES the L2's size, in
 * copies into one FLUSH_CHUNK target, so L2 is left with clean lines and
 * one dirty chunk (a memset would leave it full of dirty lines, whose
 * write-back the timed run would pay for: about 17 µs on an H100). The
 * last run was waited for, so the demotion (not stream-ordered) sees all
 * of its lines; a driver without it keeps them, as before 2026-11-27.
 * --flush plain leaves out the demotion: what the layer leaves in L2 for
 * the kernels after it then stays there, as in a model. */
static moejit_status flush_l2(gpu_state *g) {
  moejit_status st = g->a->flush_plain ? MOEJIT_OK : moejit_ctx_reset_persisting_l2(g->ctx);
  if (st == MOEJIT_ERR_UNSUPPORTED) st = MOEJIT_OK;
  for (size_t off = FLUSH_CHUNK; off + FLUSH_CHUNK <= g->flush_bytes && !st; off += FLUSH_CHUNK)
    st = moejit_memcpy_dtod(g->ctx, g->flush, (char *)g->flush + off, FLUSH_CHUNK, g->stream);
  return st;
}

/* One run of the eager forward (graph NULL) or a graph replay between two
 * events, from a cold L2 (flush_l2), waited for; *ms its time. */
static moejit_status time_one(gpu_state *g, const moejit_moe_args *args, moejit_graph *graph,
                              float *ms) {
  moejit_status st = flush_l2(g);
  if (!st) st = moejit_event_record(g->ctx, g->ev0, g->stream);
  if (!st)
    st = graph ? moejit_graph_launch(g->ctx, graph, g->stream)
               : moejit_moe_forward(g->model, args, g->stream);
  if (!st) st = moejit_event_record(g->ctx, g->ev1, g->stream);
  if (!st) st = moejit_event_synchronize(g->ctx, g->ev1);
  if (!st) st = moejit_event_elapsed_ms(g->ctx, g->ev0, g->ev1, ms);
  return st;
}

/* Medians of `iters` eager runs and `iters` graph replays (and of the
 * heuristic model's graph `heur`, when given, the two graphs in either
 * order by turns), after WARMUPS untimed rounds.
 * They alternate, so all see the same clocks: timed one after the other,
 * the second set ran 2-8% slower at large T as the GPU warmed and its
 * clocks dropped. */
static moejit_status time_runs(gpu_state *g, int64_t t, moejit_graph *graph, moejit_graph *heur,
                               point *p) {
  const int iters = g->a->iters;
  float *ms = malloc(sizeof(float) * 3 * (size_t)iters), scratch;
  if (!ms) return MOEJIT_ERR_OUT_OF_MEMORY;
  moejit_moe_args args = forward_args(g, t);
  moejit_status st = MOEJIT_OK;
  for (int i = 0; i < WARMUPS + iters && !st; i++) {
    const int timed = i >= WARMUPS;
    float *at_graph = timed ? &ms[iters + i - WARMUPS] : &scratch;
    float *at_heur = timed ? &ms[2 * iters + i - WARMUPS] : &scratch;
    st = time_one(g, &args, NULL, timed ? &ms[i - WARMUPS] : &scratch);
    /* the two graphs in turns, first one then the other first */
    if (!st && heur && i % 2) st = time_one(g, &args, heur, at_heur);
    if (!st) st = time_one(g, &args, graph, at_graph);
    if (!st && heur && !(i % 2)) st = time_one(g, &args, heur, at_heur);
  }
  if (!st) {
    p->eager_ms = median_of(ms, iters);
    p->graph_ms = median_of(ms + iters, iters);
    if (heur) p->heur_ms = median_of(ms + 2 * iters, iters);
  }
  free(ms);
  return st;
}

/* Routing sanity over all tokens (ids in range and distinct per token,
 * weights finite) and the distinct experts chosen. */
static int check_routing(const gpu_state *g, int64_t t, const int32_t *ids, const float *w,
                         point *p) {
  const int k = g->s->top_k, E = g->s->experts;
  unsigned char *seen = calloc((size_t)E, 1);
  if (!seen) return 0;
  for (int64_t i = 0; i < t * k; i++) {
    const int32_t e = ids[i];
    int dup = 0;
    for (int64_t j = i - i % k; j < i; j++) dup |= ids[j] == e;
    if (e < 0 || e >= E || dup || !(w[i] - w[i] == 0)) {
      snprintf(p->problem, sizeof p->problem, "token %lld slot %d: expert %d, weight %g",
               (long long)(i / k), (int)(i % k), e, w[i]);
      free(seen);
      return 0;
    }
    if (!seen[e]) seen[e] = 1, p->active++;
  }
  free(seen);
  return 1;
}

static double tolerance(const moejit_spec *s) {
  return s->act_dtype == MOEJIT_DTYPE_FP32 ? 1e-4 : s->act_dtype == MOEJIT_DTYPE_FP16 ? 5e-3 : 1e-2;
}

/* The tokens a check samples: all of them up to MAX_SAMPLES, else
 * MAX_SAMPLES spread evenly from the first to the last. Returns how many. */
static size_t sample_tokens(int64_t t, int64_t tok[MAX_SAMPLES]) {
  const size_t n = t < MAX_SAMPLES ? (size_t)t : MAX_SAMPLES;
  for (size_t i = 0; i < n; i++)
    tok[i] = n == (size_t)t ? (int64_t)i : (int64_t)i * (t - 1) / (int64_t)(n - 1);
  return n;
}

/* ||out - ref|| / ||ref|| over the sampled tokens. */
static void check_sample(const gpu_state *g, int64_t t, const void *out, const int32_t *ids,
                         const float *w, point *p) {
  const moejit_spec *s = g->s;
  const int k = s->top_k;
  const size_t d = (size_t)s->hidden;
  int64_t tok[MAX_SAMPLES] = {0};
  const size_t n = sample_tokens(t, tok);
  int32_t sid[MAX_SAMPLES * 32] = {0}; /* top_k <= 32 (spec_check) */
  float sw[MAX_SAMPLES * 32] = {0};
  for (size_t i = 0; i < n; i++) {
    memcpy(&sid[i * k], &ids[tok[i] * k], sizeof(int32_t) * k);
    memcpy(&sw[i * k], &w[tok[i] * k], sizeof(float) * k);
  }
  double *ref = malloc(sizeof(double) * n * d);
  if (!ref) return;
  run_reference(s, &g->bx, &g->b1, &g->b2, tok, n, sid, sw, ref);
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t c = 0; c < d; c++) {
      double got = run_unpack_one(s->out_dtype, out, (size_t)tok[i] * d + c), r = ref[i * d + c];
      err += (got - r) * (got - r);
      norm += r * r;
    }
  free(ref);
  p->rel_err = err <= 1.7e308 ? run_sqrt(err) / (norm > 0 ? run_sqrt(norm) : 1.0) : 1.0 / 0.0;
  p->checked = (int)n;
  if (!(p->rel_err <= tolerance(s)))
    snprintf(p->problem, sizeof p->problem, "relative error %.3g over %zu sampled tokens > %.0e",
             p->rel_err, n, tolerance(s));
}

/* --gate-weight: the logits the forward computed, of up to MAX_SAMPLES
 * tokens spread over T, against float64 x . gate^T. */
static moejit_status check_logits(const gpu_state *g, int64_t t, point *p) {
  const moejit_spec *s = g->s;
  const size_t E = (size_t)s->experts, lsz = moejit_dtype_size(s->logits_dtype);
  int64_t tok[MAX_SAMPLES] = {0};
  const size_t n = sample_tokens(t, tok);
  void *rows = malloc(n * E * lsz);
  double *got = malloc(sizeof(double) * n * E);
  moejit_status st = rows && got ? MOEJIT_OK : MOEJIT_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < n && !st; i++)
    st = moejit_memcpy_dtoh(g->ctx, (char *)rows + i * E * lsz,
                            (const char *)g->logits + (size_t)tok[i] * E * lsz, E * lsz, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream);
  if (!st) {
    for (size_t i = 0; i < n * E; i++) got[i] = run_unpack_one(s->logits_dtype, rows, i);
    p->logits_err = run_logits_error(s, &g->bx, &g->bg, tok, n, got);
    p->logits_checked = (int)n;
    /* fp32: sums of d products in fp32 on the tensor cores (deepseek-v3's
     * d = 7168 read 7.4e-6 on an H100); 16-bit logits: their rounding */
    const double tol = s->logits_dtype == MOEJIT_DTYPE_FP32 ? 1e-4 : 1e-2;
    if (!(p->logits_err <= tol))
      snprintf(p->problem, sizeof p->problem,
               "router logits: relative error %.3g over %zu sampled tokens > %.0e", p->logits_err,
               n, tol);
  }
  free(rows);
  free(got);
  return st;
}

/* Eager run of model m, downloads and checks; fills host_out for the graph
 * comparison. */
static moejit_status eager_checked(gpu_state *g, moejit_model *m, point *p, void *host_out) {
  const int64_t t = p->tokens;
  const size_t out_bytes = (size_t)t * g->s->hidden * moejit_dtype_size(g->s->out_dtype);
  const size_t n_ids = (size_t)t * g->s->top_k;
  int32_t *ids = malloc(n_ids * 4);
  float *w = malloc(n_ids * 4);
  moejit_moe_args args = forward_args(g, t);
  moejit_status st = !ids || !w ? MOEJIT_ERR_OUT_OF_MEMORY : poison_out(g, t);
  if (!st) st = moejit_moe_forward(m, &args, g->stream);
  if (!st) st = moejit_memcpy_dtoh(g->ctx, host_out, g->out, out_bytes, g->stream);
  if (!st) st = moejit_memcpy_dtoh(g->ctx, ids, g->ids, n_ids * 4, g->stream);
  if (!st) st = moejit_memcpy_dtoh(g->ctx, w, g->weights, n_ids * 4, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream);
  if (!st && g->gate && m == g->model) st = check_logits(g, t, p);
  if (!st && !p->problem[0] && check_routing(g, t, ids, w, p))
    check_sample(g, t, host_out, ids, w, p);
  free(ids);
  free(w);
  return st;
}

/* Captures one forward of model m, replays it once on a poisoned output and
 * requires the bits of the eager run. *graph is kept for timing. */
static moejit_status graph_checked(gpu_state *g, moejit_model *m, point *p, const void *eager,
                                   void *host_out, moejit_graph **graph) {
  const int64_t t = p->tokens;
  const size_t out_bytes = (size_t)t * g->s->hidden * moejit_dtype_size(g->s->out_dtype);
  moejit_moe_args args = forward_args(g, t);
  moejit_status st = moejit_graph_begin_capture(g->ctx, g->stream);
  if (st) return st;
  moejit_status fwd = moejit_moe_forward(m, &args, g->stream);
  st = moejit_graph_end_capture(g->ctx, g->stream, graph); /* always end it */
  if (fwd) return fwd;
  if (!st) st = poison_out(g, t);
  if (!st) st = moejit_graph_launch(g->ctx, *graph, g->stream);
  if (!st) st = moejit_memcpy_dtoh(g->ctx, host_out, g->out, out_bytes, g->stream);
  if (!st) st = moejit_stream_synchronize(g->ctx, g->stream);
  if (!st && memcmp(eager, host_out, out_bytes) != 0 && !p->problem[0])
    snprintf(p->problem, sizeof p->problem, "graph replay output differs from the eager run");
  return st;
}

static void finish_point(const gpu_state *g, point *p) {
  const moejit_spec *s = g->s;
  const double wbytes = (double)moejit_dtype_size(s->weight_dtype) * 3.0 * (double)s->hidden *
                        (double)s->expert_width;
  p->flops = moejit_moe_flops(s, p->tokens);
  p->weight_bytes = wbytes * p->active;
  p->io_bytes = (double)p->tokens * s->hidden * (act_size(s) + moejit_dtype_size(s->out_dtype));
  p->floor_ms = 1e3 * max2(p->flops / (g->a->ceil_tflops * 1e12),
                           (p->weight_bytes + p->io_bytes) / (g->a->ceil_tbps * 1e12));
  p->ok = !p->problem[0];
}

/* --vs-heuristic: the tables-off model checked as the other is (float64,
 * graph replay bitwise equal to its eager run); a problem is the point's,
 * named as the heuristic's. Its graph is kept for timing. */
static moejit_status heur_checked(gpu_state *g, point *p, void *eager, void *replay,
                                  moejit_graph **graph) {
  point h = *p;
  h.problem[0] = '\0';
  moejit_status st = eager_checked(g, g->heur, &h, eager);
  if (!st) st = graph_checked(g, g->heur, &h, eager, replay, graph);
  p->heur_rel_err = h.rel_err;
  if (h.problem[0] && !p->problem[0])
    snprintf(p->problem, sizeof p->problem, "tables off: %.200s", h.problem);
  return st;
}

static moejit_status run_point(gpu_state *g, point *p) {
  const size_t out_bytes = (size_t)p->tokens * g->s->hidden * moejit_dtype_size(g->s->out_dtype);
  void *eager = malloc(out_bytes), *replay = malloc(out_bytes);
  moejit_graph *graph = NULL, *heur = NULL;
  moejit_status st =
      !eager || !replay ? MOEJIT_ERR_OUT_OF_MEMORY : eager_checked(g, g->model, p, eager);
  if (!st) st = graph_checked(g, g->model, p, eager, replay, &graph);
  if (!st && g->heur) st = heur_checked(g, p, eager, replay, &heur);
  free(eager);
  free(replay);
  if (!st) st = time_runs(g, p->tokens, graph, heur, p);
  moejit_graph_destroy(g->ctx, graph);
  moejit_graph_destroy(g->ctx, heur);
  finish_point(g, p);
  return st;
}

/* ---- output ----------------------------------------------------------------- */

static void print_load(const char *what, const moejit_load_report *r) {
  printf(
      "load (%s): %d kernels, %d from cache, %d compiled; compile %.1f ms, modules %.1f ms, "
      "total %.1f ms\n",
      what, r->n_kernels, r->cache_hits, r->cache_misses, r->compile_ms, r->load_ms, r->total_ms);
}

/* Each kernel's configuration and where it came from (a tuned table or the
 * heuristic, and why), then what each GEMM runs at each token count. */
static void print_configs(const gpu_state *g) {
  const moejit_load_report *r = &g->warm;
  printf("kernels (config, source):\n");
  for (int i = 0; i < r->n_kernels; i++) {
    cli_print_load_row(&r->kernels[i], 0);
  }
  static const char *const gemms[] = {"gemm1", "gemm2"};
  for (int i = 0; i < g->n_points; i++) {
    if (g->points[i].skipped) continue;
    for (int j = 0; j < 2; j++) {
      char desc[512], *why;
      if (moejit_model_gemm_choice(g->model, gemms[j], g->points[i].tokens, desc, sizeof desc,
                                   NULL) != MOEJIT_OK)
        continue;
      if ((why = strstr(desc, " ("))) *why = '\0'; /* the kernel rows above say why */
      printf("  T=%-6lld %s: %s\n", (long long)g->points[i].tokens, gemms[j], desc);
    }
    if (moejit_moe_decode_layer(g->model, g->points[i].tokens))
      printf("  T=%-6lld layer: decode, 2 launches (route + gemm1, gemm2 + combine)\n",
             (long long)g->points[i].tokens);
    else if (moejit_moe_gemm1_gathers(g->model, g->points[i].tokens))
      printf("  T=%-6lld layer: gemm1 reads x rows in place (no permuted copy)\n",
             (long long)g->points[i].tokens);
  }
}

static void print_text(const gpu_state *g) {
  const moejit_spec *s = g->s;
  printf("moejit run: %s (d=%lld f=%lld E=%d k=%d %s) on %s (%s)\n", s->name, (long long)s->hidden,
         (long long)s->expert_width, s->experts, s->top_k, moejit_dtype_name(s->act_dtype),
         g->dev.name, g->dev.arch);
  print_load("first", &g->cold);
  print_load("again, new ctx", &g->warm);
  if (g->heur) print_load("tuned tables off, for --vs-heuristic", &g->heur_load);
  print_configs(g);
  printf("%7s %10s %10s %8s %7s %10s %7s %7s %8s", "T", "eager ms", "graph ms", "TFLOP/s", "W TB/s",
         "floor ms", "% floor", "experts", "rel err");
  if (g->heur) printf(" %10s %8s", "heur ms", "vs heur");
  if (g->gate) printf(" %9s", "logit err");
  printf("  %s\n", "check");
  for (int i = 0; i < g->n_points; i++) {
    const point *p = &g->points[i];
    if (p->skipped) {
      printf("%7lld skipped: needs %.1f GiB of buffers, %.1f GiB free after the weights\n",
             (long long)p->tokens, p->need_bytes / GIB, (double)g->free_after_weights / GIB);
      continue;
    }
    printf("%7lld %10.4f %10.4f %8.1f %7.2f %10.4f %7.1f %7d", (long long)p->tokens, p->eager_ms,
           p->graph_ms, p->flops / (p->graph_ms * 1e9), p->weight_bytes / (p->graph_ms * 1e9),
           p->floor_ms, 100 * p->floor_ms / p->graph_ms, p->active);
    if (p->checked)
      printf(" %8.1e", p->rel_err);
    else
      printf(" %8s", "n/a"); /* the check did not get as far as the sums */
    if (g->heur) printf(" %10.4f %7.3fx", p->heur_ms, p->heur_ms / p->graph_ms);
    if (g->gate && p->logits_checked)
      printf(" %9.1e", p->logits_err);
    else if (g->gate)
      printf(" %9s", "n/a");
    printf("  %s\n", p->ok ? "ok" : p->problem);
  }
  printf(
      "floor = max(FLOPs of both GEMMs / %g TFLOP/s, (active experts' W1+W2 + x + out bytes) "
      "/ %g TB/s)%s; %% floor and the rates use the graph time. Active experts: the distinct "
      "experts the routing chose, counted from the ids on the host. Times: median of %d "
      "CUDA-event-timed runs each, eager and graph alternating, after %d warm-ups, each after an "
      "L2 flush (%s). Check: up to %d sampled tokens against a float64 reference, graph replay "
      "bitwise equal to eager.\n",
      g->a->ceil_tflops, g->a->ceil_tbps, g->a->ceilings_given ? " (--ceilings)" : "", g->a->iters,
      WARMUPS, g->a->flush_plain ? "plain: evict_last lines stay" : "evict_last lines demoted",
      MAX_SAMPLES);
  if (g->gate)
    printf(
        "router: from a random router weight [E, d] (args.gate_weight): the layer computes "
        "the logits first (moejit_router_logits), inside the times above; logit err: those "
        "of the sampled tokens against float64 x . gate^T.\n");
  if (g->heur)
    printf(
        "heur ms: the same layer loaded with tuned tables off (the heuristic's tiles at every "
        "T), checked the same way, its graph replay timed in turn with the others; vs heur = "
        "heur ms / graph ms (above 1: the tuned configuration is faster in the whole layer).\n");
  if (!g->a->ceilings_given && strcmp(g->dev.name, RUN_CEIL_DEVICE) != 0)
    printf("note: those ceilings are an %s's; --ceilings TFLOPS,TBPS sets this GPU's.\n",
           RUN_CEIL_DEVICE);
}

/* What each GEMM runs at each token count (moejit_model_gemm_choice). */
static void print_choices_json(const gpu_state *g) {
  static const char *const gemms[] = {"gemm1", "gemm2"};
  static const char *const sources[] = {"heuristic", "tuned_exact", "tuned_nearest"};
  int first = 1;
  printf("[");
  for (int i = 0; i < g->n_points; i++) {
    if (g->points[i].skipped) continue;
    printf("%s{\"tokens\":%lld", first ? "" : ",", (long long)g->points[i].tokens);
    first = 0;
    for (int j = 0; j < 2; j++) {
      char desc[512] = "";
      moejit_config_source src = MOEJIT_CONFIG_HEURISTIC;
      (void)moejit_model_gemm_choice(g->model, gemms[j], g->points[i].tokens, desc, sizeof desc,
                                     &src);
      printf(",\"%s\":{\"source\":\"%s\",\"desc\":", gemms[j],
             (unsigned)src < 3 ? sources[src] : "?");
      cli_json_str(stdout, desc);
      printf("}");
    }
    printf(",\"decode_layer\":%s,\"gemm1_gathers\":%s}",
           moejit_moe_decode_layer(g->model, g->points[i].tokens) ? "true" : "false",
           moejit_moe_gemm1_gathers(g->model, g->points[i].tokens) ? "true" : "false");
  }
  printf("]");
}

static void print_point_json(const point *p, int vs_heuristic, int gate) {
  printf("{\"tokens\":%lld,\"skipped\":%s", (long long)p->tokens, p->skipped ? "true" : "false");
  if (!p->skipped) {
    printf(
        ",\"eager_ms\":%.6f,\"graph_ms\":%.6f,\"tflops\":%.3f,\"weight_tbs\":%.4f,"
        "\"floor_ms\":%.6f,\"pct_of_floor\":%.2f,\"active_experts\":%d,\"checked_tokens\":%d,"
        "\"rel_err\":",
        p->eager_ms, p->graph_ms, p->flops / (p->graph_ms * 1e9),
        p->weight_bytes / (p->graph_ms * 1e9), p->floor_ms, 100 * p->floor_ms / p->graph_ms,
        p->active, p->checked);
    if (p->checked)
      printf("%.3e", p->rel_err <= 1.7e308 ? p->rel_err : -1.0);
    else
      printf("null");
    if (gate) {
      printf(",\"logits_rel_err\":");
      if (p->logits_checked)
        printf("%.3e", p->logits_err <= 1.7e308 ? p->logits_err : -1.0);
      else
        printf("null");
    }
    printf(",\"ok\":%s,\"problem\":", p->ok ? "true" : "false");
    cli_json_str(stdout, p->problem);
    if (vs_heuristic)
      printf(",\"heuristic_graph_ms\":%.6f,\"vs_heuristic\":%.4f,\"heuristic_rel_err\":%.3e",
             p->heur_ms, p->heur_ms / p->graph_ms,
             p->heur_rel_err <= 1.7e308 ? p->heur_rel_err : -1.0);
  } else {
    printf(",\"need_bytes\":%.0f", p->need_bytes);
  }
  printf("}");
}

static void print_json(const gpu_state *g, int ok) {
  printf("{\"config\":");
  cli_json_str(stdout, g->s->name);
  printf(",\"gpu\":true,\"ran\":true,\"device\":");
  cli_json_str(stdout, g->dev.name);
  printf(",\"arch\":");
  cli_json_str(stdout, g->dev.arch);
  printf(",\"load_cold\":");
  cli_print_load_json(&g->cold);
  printf(",\"load_warm\":");
  cli_print_load_json(&g->warm);
  if (g->heur) {
    printf(",\"load_heuristic\":");
    cli_print_load_json(&g->heur_load);
  }
  printf(",\"gemm_choices\":");
  print_choices_json(g);
  printf(
      ",\"iters\":%d,\"gate_weight\":%s,\"flush\":\"%s\",\"ceilings\":{\"tflops\":%g,"
      "\"tbps\":%g,\"from\":\"%s\"},\"points\":[",
      g->a->iters, g->gate ? "true" : "false", g->a->flush_plain ? "plain" : "demote",
      g->a->ceil_tflops, g->a->ceil_tbps, g->a->ceilings_given ? "--ceilings" : "default");
  for (int i = 0; i < g->n_points; i++) {
    if (i) printf(",");
    print_point_json(&g->points[i], g->heur != NULL, g->gate != NULL);
  }
  printf("],\"ok\":%s}\n", ok ? "true" : "false");
}

static void keep_result(const gpu_state *g, run_result *r) {
  r->n = g->n_points;
  for (int i = 0; i < g->n_points; i++) {
    const point *p = &g->points[i];
    run_point_result *o = &r->points[i];
    o->tokens = p->tokens, o->skipped = p->skipped, o->ok = p->skipped || p->ok;
    o->graph_ms = p->graph_ms, o->heur_ms = p->heur_ms;
    snprintf(o->problem, sizeof o->problem, "%s", p->problem);
  }
}

/* ---- driver ----------------------------------------------------------------- */

static void release(gpu_state *g) {
  void *bufs[] = {g->w1, g->w2,  g->scratch, g->x,     g->logits, g->out,
                  g->ws, g->ids, g->weights, g->flush, g->gate};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) (void)moejit_mem_free(g->ctx, bufs[i], g->stream);
  if (g->ctx) {
    (void)moejit_stream_synchronize(g->ctx, g->stream);
    (void)moejit_event_destroy(g->ctx, g->ev0);
    (void)moejit_event_destroy(g->ctx, g->ev1);
    (void)moejit_stream_destroy(g->ctx, g->stream);
  }
  moejit_model_destroy(g->model);
  moejit_model_destroy(g->heur);
  moejit_ctx_destroy(g->ctx);
  run_block_free(&g->bx);
  run_block_free(&g->b1);
  run_block_free(&g->b2);
  run_block_free(&g->bg);
}

static moejit_status prepare(gpu_state *g) {
  moejit_status st = load_twice(g);
  if (!st) g->s = moejit_model_spec(g->model); /* what was loaded */
  if (!st) st = moejit_stream_create(g->ctx, &g->stream);
  if (!st) st = moejit_event_create(g->ctx, &g->ev0);
  if (!st) st = moejit_event_create(g->ctx, &g->ev1);
  if (!st) st = make_weights(g);
  if (!st) st = plan_points(g);
  if (!st && g->max_tokens > 0) st = make_inputs(g);
  return st;
}

int run_on_gpu(const run_args *a, const moejit_spec *spec) {
  gpu_state *g = calloc(1, sizeof *g);
  if (!g) return cli_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory");
  g->a = a;
  g->s = spec;
  moejit_status st = prepare(g);
  if (st) {
    int rc = g->reported ? CLI_EXIT_FAILURE : cli_fail(st, "moejit run");
    release(g);
    free(g);
    return rc;
  }
  int ok = 1;
  for (int i = 0; i < g->n_points && !st; i++) {
    point *p = &g->points[i];
    if (p->skipped) continue;
    st = run_point(g, p);
    ok &= p->ok;
  }
  if (st) {
    int rc = g->reported ? CLI_EXIT_FAILURE : cli_fail(st, "moejit run");
    release(g);
    free(g);
    return rc == CLI_EXIT_USAGE ? CLI_EXIT_FAILURE : rc;
  }
  if (a->result)
    keep_result(g, a->result);
  else if (a->json)
    print_json(g, ok);
  else
    print_text(g);
  release(g);
  free(g);
  if (!ok && !a->result) fprintf(stderr, "moejit: run: the check failed (see the table)\n");
  return ok || a->result ? CLI_EXIT_OK : CLI_EXIT_FAILURE; /* result: the caller reads ok */
}
