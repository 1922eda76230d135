/* moejit_bench_ops: route, align + permute and combine of the presets at
 * T = 16384 tokens on random data, timed with CUDA events (median of 100
 * samples after warm-up; a sample averages a batch of back-to-back launches,
 * so launch gaps do not flatter it; route rotates its inputs, while align
 * and combine reuse theirs: "align (indices only)" moves about T*k*12 bytes,
 * which stay in L2, so its rate is an L2 rate, shown for information). Each op
 * is printed beside its memory floor: the bytes it must move at 2.95 TB/s
 * (DESIGN.md: a large device-to-device copy on the H100). Targets (issue):
 * route <= 20 us; align + permute and combine <= 1.5x their floor.
 *
 * usage: moejit_bench_ops [preset ...]   (default: deepseek-v3 qwen3-30b-a3b) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moejit/moejit.h"
#include "moejit/ops.h"

#define TOKENS 16384
#define FLOOR_BYTES_PER_S 2.95e12
#define SAMPLES 100
#define WARMUP 10
#define BATCH 10           /* launches per timed sample */
#define ROTATE_BYTES 100e6 /* 2x the H100 L2: small inputs rotate over this much */
#define MAX_ROTATE 16

#define CHECK(call)                                                                       \
  do {                                                                                    \
    moejit_status st_ = (call);                                                           \
    if (st_ != MOEJIT_OK) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, moejit_last_error()); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static moejit_ctx *g_ctx;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}
/* Uniform in [-1, 1). */
static float rng_float(void) {
  return (float)((double)(rng_next() >> 11) * 0x1p-52 - 1.0);
}

static uint16_t bf16_bits(float v) {
  uint32_t b;
  memcpy(&b, &v, 4);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* `bytes` of random values of dtype `dt` (4-logit spread for fp32). */
static void *dev_random(size_t bytes, moejit_dtype dt) {
  void *h = malloc(bytes), *d = NULL;
  if (!h) fprintf(stderr, "out of host memory\n"), exit(1);
  if (dt == MOEJIT_DTYPE_FP32)
    for (size_t i = 0; i < bytes / 4; i++) ((float *)h)[i] = 4.0f * rng_float();
  else
    for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)h)[i] = bf16_bits(rng_float());
  CHECK(moejit_mem_alloc(g_ctx, bytes, NULL, &d));
  CHECK(moejit_memcpy_htod(g_ctx, d, h, bytes, NULL));
  free(h);
  return d;
}

static void *dev_alloc(size_t bytes) {
  void *d = NULL;
  CHECK(moejit_mem_alloc(g_ctx, bytes, NULL, &d));
  return d;
}

/* One op to time: launch(i) enqueues its i-th run (i picks a rotation). */
typedef struct timed_op {
  void (*launch)(void *state, int i);
  void *state;
} timed_op;

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median microseconds per launch. */
static double time_op(timed_op op) {
  moejit_event start, end;
  CHECK(moejit_event_create(g_ctx, &start));
  CHECK(moejit_event_create(g_ctx, &end));
  double us[SAMPLES];
  int run = 0;
  for (int s = -WARMUP; s < SAMPLES; s++) {
    CHECK(moejit_event_record(g_ctx, start, NULL));
    for (int b = 0; b < BATCH; b++) op.launch(op.state, run++);
    CHECK(moejit_event_record(g_ctx, end, NULL));
    CHECK(moejit_event_synchronize(g_ctx, end));
    float ms = 0;
    CHECK(moejit_event_elapsed_ms(g_ctx, start, end, &ms));
    if (s >= 0) us[s] = 1e3 * ms / BATCH;
  }
  CHECK(moejit_event_destroy(g_ctx, start));
  CHECK(moejit_event_destroy(g_ctx, end));
  qsort(us, SAMPLES, sizeof us[0], cmp_double);
  return 0.5 * (us[SAMPLES / 2 - 1] + us[SAMPLES / 2]);
}

static void print_header(void) {
  printf("%-14s %-22s %6s %10s %10s %8s %10s %7s  %s\n", "preset", "op", "T", "us", "MB", "TB/s",
         "floor_us", "x_floor", "target");
}

static void print_row(const char *preset, const char *op, double us, double bytes,
                      const char *target) {
  const double floor_us = bytes / FLOOR_BYTES_PER_S * 1e6;
  printf("%-14s %-22s %6d %10.2f %10.1f %8.3f %10.2f %7.2f  %s\n", preset, op, TOKENS, us,
         bytes / 1e6, bytes / (us * 1e-6) / 1e12, floor_us, us / floor_us, target);
}

/* ---- the ops' launch states ---------------------------------------------- */

typedef struct route_state {
  const moejit_model *model;
  moejit_route_args args[MAX_ROTATE];
  int n;
} route_state;

static void launch_route(void *p, int i) {
  route_state *s = p;
  CHECK(moejit_route(s->model, &s->args[i % s->n], NULL));
}

typedef struct align_state {
  const moejit_model *model;
  moejit_align_args args;
} align_state;

static void launch_align(void *p, int i) {
  (void)i;
  align_state *s = p;
  CHECK(moejit_align(s->model, &s->args, NULL));
}

typedef struct combine_state {
  const moejit_model *model;
  moejit_combine_args args;
} combine_state;

static void launch_combine(void *p, int i) {
  (void)i;
  combine_state *s = p;
  CHECK(moejit_combine(s->model, &s->args, NULL));
}

/* ---- one preset --------------------------------------------------------- */

typedef struct layer_bufs {
  void *ids, *weights, *x, *xs, *out, *ws;
  void *counts, *offsets, *sorted, *row_of, *tile_expert, *tile_row, *num_tiles;
} layer_bufs;

static void bench_route(const char *preset, const moejit_model *m, layer_bufs *b) {
  const moejit_spec *s = moejit_model_spec(m);
  const size_t logits_bytes = (size_t)TOKENS * s->experts * moejit_dtype_size(s->logits_dtype);
  route_state st = {.model = m, .n = (int)(ROTATE_BYTES / logits_bytes) + 1};
  if (st.n > MAX_ROTATE) st.n = MAX_ROTATE;
  void *bias = s->routing.rule == MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK
                   ? dev_random((size_t)s->experts * 4, MOEJIT_DTYPE_FP32)
                   : NULL;
  for (int i = 0; i < st.n; i++) {
    moejit_route_args a = {.tokens = TOKENS,
                           .logits = dev_random(logits_bytes, s->logits_dtype),
                           .bias = bias,
                           .topk_ids = b->ids,
                           .topk_weights = b->weights};
    st.args[i] = a;
  }
  const double us = time_op((timed_op){launch_route, &st});
  const double bytes =
      (double)logits_bytes + (bias ? s->experts * 4.0 : 0) + TOKENS * s->top_k * 8.0;
  print_row(preset, "route", us, bytes, us <= 20.0 ? "<= 20 us: met" : "<= 20 us: MISSED");
  for (int i = 0; i < st.n; i++) CHECK(moejit_mem_free(g_ctx, (void *)st.args[i].logits, NULL));
  if (bias) CHECK(moejit_mem_free(g_ctx, bias, NULL));
}

static moejit_align_args align_args(const moejit_model *m, const layer_bufs *b, int copy) {
  size_t ws = 0;
  CHECK(moejit_align_workspace_size(m, TOKENS, &ws));
  moejit_align_args a = {.tokens = TOKENS,
                         .topk_ids = b->ids,
                         .x = copy ? b->x : NULL,
                         .xs = copy ? b->xs : NULL,
                         .expert_counts = b->counts,
                         .expert_offsets = b->offsets,
                         .sorted_slot = b->sorted,
                         .row_of = b->row_of,
                         .tile_expert = b->tile_expert,
                         .tile_row_start = b->tile_row,
                         .num_tiles = b->num_tiles,
                         .workspace = b->ws,
                         .workspace_bytes = ws};
  return a;
}

static void bench_align(const char *preset, const moejit_model *m, layer_bufs *b) {
  const moejit_spec *s = moejit_model_spec(m);
  const double entries = (double)TOKENS * s->top_k;
  const double row = (double)s->hidden * moejit_dtype_size(s->act_dtype);
  /* indices: ids in, row_of and sorted_slot out; copy: x read once, xs written */
  const double index_bytes = entries * 4 * 3 + (s->experts + 1) * 8.0;
  align_state st = {m, align_args(m, b, 0)};
  double us = time_op((timed_op){launch_align, &st});
  print_row(preset, "align (indices only)", us, index_bytes, "(info)");
  st.args = align_args(m, b, 1);
  us = time_op((timed_op){launch_align, &st});
  const double bytes = index_bytes + TOKENS * row + entries * row;
  char name[32];
  snprintf(name, sizeof name, "align+permute d=%lld", (long long)s->hidden);
  const double floor_us = bytes / FLOOR_BYTES_PER_S * 1e6;
  print_row(preset, name, us, bytes, us <= 1.5 * floor_us ? "<= 1.5x: met" : "<= 1.5x: MISSED");
}

static void bench_combine(const char *preset, const moejit_model *m, layer_bufs *b) {
  const moejit_spec *s = moejit_model_spec(m);
  const double entries = (double)TOKENS * s->top_k;
  combine_state st = {
      m, {.tokens = TOKENS, .y = b->xs, .row_of = b->row_of, .weights = b->weights, .out = b->out}};
  const double us = time_op((timed_op){launch_combine, &st});
  const double bytes = entries * s->hidden * moejit_dtype_size(s->act_dtype) +
                       (double)TOKENS * s->hidden * moejit_dtype_size(s->out_dtype) + entries * 8;
  char name[32];
  snprintf(name, sizeof name, "combine d=%lld", (long long)s->hidden);
  const double floor_us = bytes / FLOOR_BYTES_PER_S * 1e6;
  print_row(preset, name, us, bytes, us <= 1.5 * floor_us ? "<= 1.5x: met" : "<= 1.5x: MISSED");
}

static void bench_preset(const char *preset) {
  moejit_spec spec;
  CHECK(moejit_spec_load_preset(preset, &spec));
  moejit_model *m = NULL;
  CHECK(moejit_model_load(g_ctx, &spec, &m));
  const size_t entries = (size_t)TOKENS * spec.top_k;
  const size_t row = (size_t)spec.hidden * moejit_dtype_size(spec.act_dtype);
  int64_t tiles = 0;
  size_t ws = 0;
  CHECK(moejit_align_tile_capacity(m, TOKENS, &tiles));
  CHECK(moejit_align_workspace_size(m, TOKENS, &ws));
  layer_bufs b = {
      .ids = dev_alloc(entries * 4),
      .weights = dev_alloc(entries * 4),
      .x = dev_random(TOKENS * row, spec.act_dtype),
      .xs = dev_alloc(entries * row),
      .out = dev_alloc(TOKENS * (size_t)spec.hidden * moejit_dtype_size(spec.out_dtype)),
      .ws = dev_alloc(ws),
      .counts = dev_alloc((size_t)spec.experts * 4),
      .offsets = dev_alloc((size_t)(spec.experts + 1) * 4),
      .sorted = dev_alloc(entries * 4),
      .row_of = dev_alloc(entries * 4),
      .tile_expert = dev_alloc((size_t)tiles * 4),
      .tile_row = dev_alloc((size_t)tiles * 4),
      .num_tiles = dev_alloc(4),
  };
  bench_route(preset, m, &b); /* leaves the last rotation's ids: real routing */
  bench_align(preset, m, &b);
  bench_combine(preset, m, &b); /* y = xs: rows exactly where align put them */
  void *all[] = {b.ids,     b.weights, b.x,      b.xs,          b.out,      b.ws,       b.counts,
                 b.offsets, b.sorted,  b.row_of, b.tile_expert, b.tile_row, b.num_tiles};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    CHECK(moejit_mem_free(g_ctx, all[i], NULL));
  moejit_model_destroy(m);
}

int main(int argc, char **argv) {
  const char *defaults[] = {"deepseek-v3", "qwen3-30b-a3b"};
  const char *const *presets = argc > 1 ? (const char *const *)argv + 1 : defaults;
  const int n = argc > 1 ? argc - 1 : 2;
  moejit_status st = moejit_ctx_create(&g_ctx, NULL);
  if (st != MOEJIT_OK) {
    fprintf(stderr, "moejit_bench_ops: %s\n", moejit_last_error());
    return st == MOEJIT_ERR_NO_DRIVER || st == MOEJIT_ERR_NO_DEVICE ? 77 : 1;
  }
  moejit_device_info info;
  CHECK(moejit_ctx_device_info(g_ctx, &info));
  printf("# %s (%s), T = %d, median of %d samples x %d launches; floor = bytes / %.2f TB/s\n",
         info.name, info.arch, TOKENS, SAMPLES, BATCH, FLOOR_BYTES_PER_S / 1e12);
  print_header();
  for (int i = 0; i < n; i++) bench_preset(presets[i]);
  moejit_ctx_destroy(g_ctx);
  return 0;
}
