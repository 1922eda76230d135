/* Bad inputs to every launcher (moejit_route, _align, _combine,
 * _gemm1_swiglu, _gemm2, _moe_forward): NULL and misaligned pointers, token
 * counts and sizes out of range, expert ranges out of range, models without
 * the family. Each is INVALID_ARGUMENT naming the field, and nothing runs.
 *
 * Two ways to see "nothing runs":
 * - badargs_nogpu (any machine): the launchers run against a fake ctx whose
 *   driver table counts calls. A good call must reach the driver (1 for
 *   route, 2 or 3 for align, 1 for combine), a refused one must not touch
 *   it at all.
 * - badargs_gpu (skips without a GPU): the same table on a real model with
 *   poisoned outputs, eagerly and inside a stream capture; the capture stays
 *   valid, its graph replays, and every output is still poison. Device data
 *   out of range (expert ids beyond E, NaN/inf logits) is dropped or
 *   neutralized, which compute-sanitizer checks (scripts/gpu-sanitize.sh). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "moejit/moejit.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"
#include "test_support.h"

/* ---- where each launcher's arguments point -------------------------------------- */

#define T_TOKENS 16

/* Buffers for T_TOKENS tokens of `spec` (device memory, or fake addresses
 * that are never dereferenced), good args for each launcher built on them. */
typedef struct fixture {
  moejit_ctx *ctx;
  moejit_model *ops;   /* route + align + combine */
  moejit_model *layer; /* every family */
  moejit_model *route_only;
  const moejit_spec *spec;
  moejit_stream stream;
  /* counts the driver calls of a fake ctx; NULL on a real GPU */
  atomic_int *driver_calls;
  moejit_route_args route;
  moejit_align_args align;
  moejit_combine_args combine;
  moejit_gemm_args gemm1, gemm2;
  moejit_moe_args forward;
} fixture;

/* Output buffers a refused call must leave alone (GPU: poisoned first). */
typedef struct out_buf {
  void *ptr;
  size_t bytes;
} out_buf;

/* ---- checking one refusal ------------------------------------------------------- */

static int is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* `word` appears in msg as a whole word ("x" in "args->x is NULL"). */
static int names(const char *msg, const char *word) {
  size_t n = strlen(word);
  for (const char *p = strstr(msg, word); p; p = strstr(p + 1, word))
    if ((p == msg || !is_word_char(p[-1])) && !is_word_char(p[n])) return 1;
  return 0;
}

static int refusals;

static void expect_refused(const fixture *f, moejit_status st, const char *op, const char *field,
                           const char *what) {
  const int calls = f->driver_calls ? atomic_load(f->driver_calls) : 0;
  const char *msg = moejit_last_error();
  cr_expect_eq(st, MOEJIT_ERR_INVALID_ARGUMENT, "%s with %s: status %d (%s)", op, what, st, msg);
  cr_expect(strstr(msg, op), "%s with %s: message does not name the call: %s", op, what, msg);
  cr_expect(names(msg, field), "%s with %s: message does not name '%s': %s", op, what, field, msg);
  cr_expect_eq(calls, 0, "%s with %s: the driver was called %d times", op, what, calls);
  refusals++;
}

/* ---- the launchers behind one signature ------------------------------------------ */

typedef moejit_status (*launcher)(const fixture *f, const void *args);

static moejit_status call_route(const fixture *f, const void *a) {
  return moejit_route(f->ops, a, f->stream);
}
static moejit_status call_align(const fixture *f, const void *a) {
  return moejit_align(f->ops, a, f->stream);
}
static moejit_status call_combine(const fixture *f, const void *a) {
  return moejit_combine(f->ops, a, f->stream);
}
static moejit_status call_gemm1(const fixture *f, const void *a) {
  return moejit_gemm1_swiglu(f->ctx, moejit_model_spec(f->layer), a, f->stream);
}
static moejit_status call_gemm2(const fixture *f, const void *a) {
  return moejit_gemm2(f->ctx, moejit_model_spec(f->layer), a, f->stream);
}
static moejit_status call_forward(const fixture *f, const void *a) {
  return moejit_moe_forward(f->layer, a, f->stream);
}

/* A pointer field of an args struct: where it is, what it must be. */
typedef struct ptr_field {
  const char *name; /* as the message names it */
  size_t offset;
  size_t align;
  int optional; /* NULL allowed */
} ptr_field;

typedef struct op_desc {
  const char *name;
  launcher call;
  const void *good;
  size_t size;
  const ptr_field *fields;
  size_t n_fields;
} op_desc;

static void set_ptr(void *args, size_t offset, const void *value) {
  memcpy((char *)args + offset, &value, sizeof value);
}

static const void *get_ptr(const void *args, size_t offset) {
  const void *p;
  memcpy(&p, (const char *)args + offset, sizeof p);
  return p;
}

/* Every pointer NULL (when required) and off its alignment by 1 and by
 * half of it. */
static void refuse_pointers(const fixture *f, const op_desc *op) {
  unsigned char args[512];
  cr_assert_leq(op->size, sizeof args);
  for (size_t i = 0; i < op->n_fields; i++) {
    const ptr_field *fd = &op->fields[i];
    char what[96];
    if (!fd->optional) {
      memcpy(args, op->good, op->size);
      set_ptr(args, fd->offset, NULL);
      snprintf(what, sizeof what, "%s = NULL", fd->name);
      expect_refused(f, op->call(f, args), op->name, fd->name, what);
    }
    const size_t offs[2] = {1, fd->align / 2};
    for (int k = 0; k < 2; k++) {
      if (offs[k] == 0 || offs[k] >= fd->align || (k == 1 && offs[1] == offs[0])) continue;
      memcpy(args, op->good, op->size);
      const char *p = get_ptr(op->good, fd->offset);
      set_ptr(args, fd->offset, (p ? p : (const char *)f->forward.out) + offs[k]);
      snprintf(what, sizeof what, "%s off by %zu bytes", fd->name, offs[k]);
      expect_refused(f, op->call(f, args), op->name, fd->name, what);
    }
  }
}

/* Token counts outside 1..INT32_MAX / top_k (the field is int64 `tokens`
 * at offset 0 of route, align, combine and moe args). */
static void refuse_tokens(const fixture *f, const op_desc *op) {
  const int64_t max = INT32_MAX / f->spec->top_k;
  const int64_t bad[] = {0, -1, INT64_MIN, max + 1, INT64_MAX};
  unsigned char args[512];
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    memcpy(args, op->good, op->size);
    memcpy(args, &bad[i], sizeof bad[i]);
    char what[64];
    snprintf(what, sizeof what, "tokens = %lld", (long long)bad[i]);
    expect_refused(f, op->call(f, args), op->name, "tokens", what);
  }
}

/* ---- the tables -------------------------------------------------------------------- */

#define F(type, field, align, optional) \
  { #field, offsetof(type, field), align, optional }

static const ptr_field route_fields[] = {
    F(moejit_route_args, logits, 16, 0), F(moejit_route_args, bias, 16, 1),
    F(moejit_route_args, topk_ids, 4, 0), F(moejit_route_args, topk_weights, 4, 0)};
static const ptr_field align_fields[] = {F(moejit_align_args, topk_ids, 4, 0),
                                         F(moejit_align_args, expert_counts, 4, 0),
                                         F(moejit_align_args, expert_offsets, 4, 0),
                                         F(moejit_align_args, sorted_slot, 4, 0),
                                         F(moejit_align_args, row_of, 4, 0),
                                         F(moejit_align_args, tile_expert, 4, 0),
                                         F(moejit_align_args, tile_row_start, 4, 0),
                                         F(moejit_align_args, num_tiles, 4, 0),
                                         F(moejit_align_args, workspace, 16, 0),
                                         F(moejit_align_args, x, 16, 1),
                                         F(moejit_align_args, xs, 16, 1)};
static const ptr_field combine_fields[] = {
    F(moejit_combine_args, y, 16, 0), F(moejit_combine_args, row_of, 4, 0),
    F(moejit_combine_args, weights, 4, 1), F(moejit_combine_args, out, 16, 0)};
static const ptr_field gemm_fields[] = {
    F(moejit_gemm_args, a, 16, 0), F(moejit_gemm_args, w, 16, 0), F(moejit_gemm_args, out, 16, 0),
    F(moejit_gemm_args, expert_offsets, 4, 0), F(moejit_gemm_args, row_scale, 4, 1)};
static const ptr_field forward_fields[] = {
    F(moejit_moe_args, x, 16, 0),          F(moejit_moe_args, logits, 16, 0),
    F(moejit_moe_args, route_bias, 16, 1), F(moejit_moe_args, w1, 16, 0),
    F(moejit_moe_args, w2, 16, 0),         F(moejit_moe_args, out, 16, 0),
    F(moejit_moe_args, workspace, 256, 0), F(moejit_moe_args, topk_ids, 4, 1),
    F(moejit_moe_args, topk_weights, 4, 1)};
#undef F

#define OP(nm, fn, member, fields) \
  { nm, fn, &f->member, sizeof f->member, fields, MJ_ARRAY_LEN(fields) }

static void refuse_route(const fixture *f) {
  const op_desc op = OP("moejit_route", call_route, route, route_fields);
  refuse_pointers(f, &op);
  refuse_tokens(f, &op);
  expect_refused(f, moejit_route(f->ops, NULL, f->stream), op.name, "args", "args = NULL");
  expect_refused(f, moejit_route(NULL, &f->route, f->stream), op.name, "model", "model = NULL");
}

static void refuse_align_ranges(const fixture *f) {
  const int32_t e = f->spec->experts;
  const int32_t bad[][2] = {{-1, 4},        {3, 0},     {0, e + 1},     {e, e},
                            {5, 5},         {6, 2},     {INT32_MIN, 4}, {0, INT32_MAX},
                            {INT32_MIN, 0}, {e, e + 1}, {0, -1}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(bad); i++) {
    moejit_align_args a = f->align;
    a.expert_first = bad[i][0], a.expert_last = bad[i][1];
    char what[64];
    snprintf(what, sizeof what, "experts [%d, %d)", (int)bad[i][0], (int)bad[i][1]);
    expect_refused(f, moejit_align(f->ops, &a, f->stream), "moejit_align", "range", what);
  }
}

static void refuse_align(const fixture *f) {
  const op_desc op = OP("moejit_align", call_align, align, align_fields);
  refuse_pointers(f, &op);
  refuse_tokens(f, &op);
  refuse_align_ranges(f);
  moejit_align_args a = f->align;
  a.x = NULL; /* x and xs go together */
  expect_refused(f, moejit_align(f->ops, &a, f->stream), op.name, "x", "x = NULL, xs set");
  a = f->align, a.xs = NULL;
  expect_refused(f, moejit_align(f->ops, &a, f->stream), op.name, "xs", "xs = NULL, x set");
  a = f->align, a.workspace_bytes -= 1;
  expect_refused(f, moejit_align(f->ops, &a, f->stream), op.name, "workspace_bytes", "-1 byte");
  a = f->align, a.workspace_bytes = 0;
  expect_refused(f, moejit_align(f->ops, &a, f->stream), op.name, "workspace_bytes", "0 bytes");
  a = f->align, a.tokens = T_TOKENS + 1;
  expect_refused(f, moejit_align(f->ops, &a, f->stream), op.name, "workspace_bytes", "T + 1");
  expect_refused(f, moejit_align(f->ops, NULL, f->stream), op.name, "args", "args = NULL");
  expect_refused(f, moejit_align(f->route_only, &f->align, f->stream), op.name, "align",
                 "a route-only model");
}

static void refuse_combine(const fixture *f) {
  const op_desc op = OP("moejit_combine", call_combine, combine, combine_fields);
  refuse_pointers(f, &op);
  refuse_tokens(f, &op);
  expect_refused(f, moejit_combine(f->ops, NULL, f->stream), op.name, "args", "args = NULL");
  expect_refused(f, moejit_combine(f->route_only, &f->combine, f->stream), op.name, "combine",
                 "a route-only model");
}

static void refuse_gemm(const fixture *f, int which) {
  const char *name = which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2";
  const op_desc op = which == 1 ? (op_desc)OP(name, call_gemm1, gemm1, gemm_fields)
                                : (op_desc)OP(name, call_gemm2, gemm2, gemm_fields);
  op_desc ptrs = op;
  ptrs.n_fields -= which == 1; /* gemm1 ignores row_scale */
  refuse_pointers(f, &ptrs);
  const int64_t rows[] = {-1, INT64_MIN, (int64_t)INT32_MAX + 1, INT64_MAX};
  for (size_t i = 0; i < MJ_ARRAY_LEN(rows); i++) {
    moejit_gemm_args a = which == 1 ? f->gemm1 : f->gemm2;
    a.max_rows = rows[i];
    expect_refused(f, op.call(f, &a), name, "max_rows", "max_rows out of range");
  }
  const moejit_gemm_path paths[] = {(moejit_gemm_path)-1, (moejit_gemm_path)7};
  for (size_t i = 0; i < MJ_ARRAY_LEN(paths); i++) {
    moejit_gemm_args a = which == 1 ? f->gemm1 : f->gemm2;
    a.path = paths[i];
    expect_refused(f, op.call(f, &a), name, "path", "an unknown path");
  }
  const moejit_spec *s = moejit_model_spec(f->layer);
  const moejit_gemm_args *good = which == 1 ? &f->gemm1 : &f->gemm2;
  moejit_status (*fn)(moejit_ctx *, const moejit_spec *, const moejit_gemm_args *, moejit_stream) =
      which == 1 ? moejit_gemm1_swiglu : moejit_gemm2;
  expect_refused(f, fn(NULL, s, good, f->stream), name, "ctx", "ctx = NULL");
  expect_refused(f, fn(f->ctx, NULL, good, f->stream), name, "spec", "spec = NULL");
  expect_refused(f, fn(f->ctx, s, NULL, f->stream), name, "args", "args = NULL");
  /* the K-split scratch: GEMM 2's only, 16-byte aligned */
  moejit_gemm_args a = *good;
  a.split = (char *)good->out + (which == 1 ? 0 : 8), a.split_bytes = (size_t)1 << 30;
  expect_refused(f, op.call(f, &a), name, "args->split",
                 which == 1 ? "K-split scratch for GEMM 1" : "misaligned K-split scratch");
  if (which == 2) {
    size_t bytes = 0;
    expect_refused(f, moejit_gemm2_split_size(NULL, s, MOEJIT_GEMM_PATH_AUTO, 4, &bytes, NULL),
                   "moejit_gemm2_split_size", "ctx", "split size, ctx = NULL");
    expect_refused(f, moejit_gemm2_split_size(f->ctx, s, MOEJIT_GEMM_PATH_AUTO, -1, &bytes, NULL),
                   "moejit_gemm2_split_size", "max_rows", "split size, max_rows = -1");
    expect_refused(f, moejit_gemm2_split_size(f->ctx, s, MOEJIT_GEMM_PATH_AUTO, 4, NULL, NULL),
                   "moejit_gemm2_split_size", "bytes", "split size, bytes = NULL");
  }
}

static void refuse_forward(const fixture *f) {
  const op_desc op = OP("moejit_moe_forward", call_forward, forward, forward_fields);
  refuse_pointers(f, &op);
  refuse_tokens(f, &op);
  moejit_moe_args a = f->forward;
  a.workspace_bytes -= 1;
  expect_refused(f, moejit_moe_forward(f->layer, &a, f->stream), op.name, "workspace_bytes",
                 "-1 byte");
  a = f->forward, a.tokens = T_TOKENS + 1;
  expect_refused(f, moejit_moe_forward(f->layer, &a, f->stream), op.name, "workspace_bytes",
                 "T + 1");
  expect_refused(f, moejit_moe_forward(f->layer, NULL, f->stream), op.name, "args", "args = NULL");
  expect_refused(f, moejit_moe_forward(NULL, &f->forward, f->stream), op.name, "model",
                 "model = NULL");
  expect_refused(f, moejit_moe_forward(f->ops, &f->forward, f->stream), op.name,
                 "moejit_model_load_config", "a model without GEMMs");
}

/* Size queries share the launchers' checks. */
static void refuse_queries(const fixture *f) {
  size_t bytes;
  int64_t tiles;
  expect_refused(f, moejit_align_workspace_size(NULL, 4, &bytes), "moejit_align_workspace_size",
                 "model", "model = NULL");
  expect_refused(f, moejit_align_workspace_size(f->ops, 0, &bytes), "moejit_align_workspace_size",
                 "tokens", "tokens = 0");
  expect_refused(f, moejit_align_workspace_size(f->ops, 4, NULL), "moejit_align_workspace_size",
                 "out", "out = NULL");
  expect_refused(f, moejit_align_tile_capacity(f->ops, -3, &tiles), "moejit_align_tile_capacity",
                 "tokens", "tokens = -3");
  expect_refused(f, moejit_moe_workspace_size(f->layer, INT64_MAX, &bytes),
                 "moejit_moe_workspace_size", "tokens", "tokens = INT64_MAX");
  expect_refused(f, moejit_moe_workspace_size(f->layer, 4, NULL), "moejit_moe_workspace_size",
                 "bytes", "bytes = NULL");
  expect_refused(f, moejit_moe_workspace_size(f->ops, 4, &bytes), "moejit_moe_workspace_size",
                 "moejit_model_load_config", "a model without GEMMs");
}

static void refuse_everything(const fixture *f) {
  refuse_route(f);
  refuse_align(f);
  refuse_combine(f);
  refuse_gemm(f, 1);
  refuse_gemm(f, 2);
  refuse_forward(f);
  refuse_queries(f);
}

/* ---- good args over a buffer plan ---------------------------------------------------- */

/* Addresses of every buffer, from `alloc` (device memory or fake). */
typedef void *(*allocator)(size_t bytes);

typedef struct buffers {
  void *logits, *bias, *ids, *weights, *x, *xs, *counts, *offsets, *sorted, *row_of, *tile_e,
      *tile_r, *n_tiles, *ws_align, *y, *out, *h, *w1, *w2, *ws_layer, *scale;
  size_t ws_align_bytes, ws_layer_bytes;
  out_buf outs[16];
  int n_outs;
} buffers;

static void *keep_out(buffers *b, void *p, size_t bytes) {
  cr_assert_lt(b->n_outs, 16);
  b->outs[b->n_outs++] = (out_buf){p, bytes};
  return p;
}

static void make_buffers(fixture *f, buffers *b, allocator alloc) {
  const moejit_spec *s = f->spec;
  const size_t T = T_TOKENS, k = (size_t)s->top_k, E = (size_t)s->experts;
  const size_t d = (size_t)s->hidden, fw = (size_t)s->expert_width;
  const size_t act = moejit_dtype_size(s->act_dtype), wt = moejit_dtype_size(s->weight_dtype);
  int64_t tiles = 0;
  cr_assert_eq(moejit_align_tile_capacity(f->ops, T, &tiles), MOEJIT_OK, "%s", moejit_last_error());
  cr_assert_eq(moejit_align_workspace_size(f->ops, T, &b->ws_align_bytes), MOEJIT_OK);
  cr_assert_eq(moejit_moe_workspace_size(f->layer, T, &b->ws_layer_bytes), MOEJIT_OK, "%s",
               moejit_last_error());
  b->logits = alloc(T * E * moejit_dtype_size(s->logits_dtype));
  b->bias = alloc(E * 4);
  b->ids = keep_out(b, alloc(T * k * 4), T * k * 4);
  b->weights = keep_out(b, alloc(T * k * 4), T * k * 4);
  b->x = alloc(T * d * act);
  b->xs = keep_out(b, alloc(T * k * d * act), T * k * d * act);
  b->counts = keep_out(b, alloc(E * 4), E * 4);
  b->offsets = keep_out(b, alloc((E + 1) * 4), (E + 1) * 4);
  b->sorted = keep_out(b, alloc(T * k * 4), T * k * 4);
  b->row_of = keep_out(b, alloc(T * k * 4), T * k * 4);
  b->tile_e = keep_out(b, alloc((size_t)tiles * 4), (size_t)tiles * 4);
  b->tile_r = keep_out(b, alloc((size_t)tiles * 4), (size_t)tiles * 4);
  b->n_tiles = keep_out(b, alloc(4), 4);
  b->ws_align = alloc(b->ws_align_bytes);
  b->y = alloc(T * k * d * act);
  b->out = keep_out(b, alloc(T * d * moejit_dtype_size(s->out_dtype)),
                    T * d * moejit_dtype_size(s->out_dtype));
  b->h = keep_out(b, alloc(T * k * fw * act), T * k * fw * act);
  b->w1 = alloc(E * 2 * fw * d * wt);
  b->w2 = alloc(E * d * fw * wt);
  b->ws_layer = alloc(b->ws_layer_bytes);
  b->scale = alloc(T * k * 4);
}

static void good_args(fixture *f, const buffers *b) {
  f->route = (moejit_route_args){T_TOKENS, b->logits, b->bias, b->ids, b->weights};
  f->align = (moejit_align_args){.tokens = T_TOKENS,
                                 .topk_ids = b->ids,
                                 .x = b->x,
                                 .xs = b->xs,
                                 .expert_counts = b->counts,
                                 .expert_offsets = b->offsets,
                                 .sorted_slot = b->sorted,
                                 .row_of = b->row_of,
                                 .tile_expert = b->tile_e,
                                 .tile_row_start = b->tile_r,
                                 .num_tiles = b->n_tiles,
                                 .workspace = b->ws_align,
                                 .workspace_bytes = b->ws_align_bytes};
  f->combine = (moejit_combine_args){T_TOKENS, b->y, b->row_of, b->weights, b->out};
  const int64_t rows = T_TOKENS * f->spec->top_k;
  f->gemm1 = (moejit_gemm_args){
      .a = b->xs, .w = b->w1, .out = b->h, .expert_offsets = b->offsets, .max_rows = rows};
  f->gemm2 = (moejit_gemm_args){
      .a = b->h, .w = b->w2, .out = b->y, .expert_offsets = b->offsets, .row_scale = b->scale,
      .max_rows = rows};
  f->forward = (moejit_moe_args){.tokens = T_TOKENS,
                                 .x = b->x,
                                 .logits = b->logits,
                                 .route_bias = b->bias,
                                 .w1 = b->w1,
                                 .w2 = b->w2,
                                 .out = b->out,
                                 .workspace = b->ws_layer,
                                 .workspace_bytes = b->ws_layer_bytes,
                                 .topk_ids = b->ids,
                                 .topk_weights = b->weights};
}

/* A small layer: E = 16, k = 4, d = 256, f = 256, bf16 (sigmoid routing, so
 * the bias is used). */
static moejit_spec small_spec(void) {
  moejit_spec s = ops_spec(16, 4, 256);
  snprintf(s.name, sizeof s.name, "badargs");
  s.routing.rule = MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK;
  s.routing.n_group = 4;
  s.routing.topk_group = 2;
  return s;
}

/* ====================================================================================== */
/* Without a GPU: a fake ctx whose driver counts calls                                    */
/* ====================================================================================== */

static atomic_int fake_calls;
static atomic_int fake_launches;
static unsigned fake_last_grid;

static CUresult CUDAAPI fake_push(CUcontext c) {
  (void)c;
  atomic_fetch_add(&fake_calls, 1);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI fake_pop(CUcontext *c) {
  if (c) *c = NULL;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI fake_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                    CUstream s, void **params, void **extra) {
  (void)fn, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem, (void)s, (void)extra;
  cr_assert_not_null(params, "launch without parameters");
  fake_last_grid = gx;
  atomic_fetch_add(&fake_calls, 1);
  atomic_fetch_add(&fake_launches, 1);
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI fake_launch_ex(const CUlaunchConfig *cfg, CUfunction fn, void **params,
                                       void **extra) {
  return fake_launch(fn, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX,
                     cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params,
                     extra);
}
static CUresult CUDAAPI fake_get_attr(int *v, CUfunction_attribute a, CUfunction fn) {
  (void)a, (void)fn;
  atomic_fetch_add(&fake_calls, 1);
  *v = 0;
  return CUDA_SUCCESS;
}
static CUresult CUDAAPI fake_set_attr(CUfunction fn, CUfunction_attribute a, int v) {
  (void)fn, (void)a, (void)v;
  atomic_fetch_add(&fake_calls, 1);
  return CUDA_SUCCESS;
}

static const mj_driver fake_driver = {.CtxPushCurrent = fake_push,
                                      .CtxPopCurrent = fake_pop,
                                      .LaunchKernel = fake_launch,
                                      .LaunchKernelEx = fake_launch_ex,
                                      .FuncGetAttribute = fake_get_attr,
                                      .FuncSetAttribute = fake_set_attr};

/* An H100-shaped ctx with nothing behind it but the counting driver. */
static moejit_ctx *fake_ctx(void) {
  moejit_ctx *ctx = calloc(1, sizeof *ctx);
  cr_assert_not_null(ctx);
  cr_assert_eq(pthread_mutex_init(&ctx->lock, NULL), 0);
  cr_assert_eq(pthread_mutex_init(&ctx->error_lock, NULL), 0);
  ctx->d = &fake_driver;
  mj_device_limits *l = &ctx->limits;
  l->cc_major = 9, l->sm_count = 132, l->cluster_launch = 1;
  l->max_threads_per_block = 1024;
  l->smem_per_block_optin = 232448;
  l->max_grid[0] = 2147483647u, l->max_grid[1] = 65535, l->max_grid[2] = 65535;
  l->max_block[0] = 1024, l->max_block[1] = 1024, l->max_block[2] = 64;
  ctx->info.cc_major = 9, ctx->info.sm_count = 132, ctx->info.max_threads_per_block = 1024;
  ctx->info.smem_per_block_optin = l->smem_per_block_optin;
  mj_arch_for_cc(9, 0, ctx->info.arch);
  return ctx;
}

/* A model as loading would leave it, with fake kernel handles. */
static moejit_model *fake_model(moejit_ctx *ctx, const moejit_spec *spec, unsigned families) {
  cr_assert_eq(moejit_spec_validate(spec), MOEJIT_OK, "%s", moejit_last_error());
  moejit_model *m = calloc(1, sizeof *m);
  cr_assert_not_null(m);
  m->ctx = ctx;
  m->spec = *spec;
  m->families = families;
  m->sm_count = 132;
  m->route_topk = (CUfunction)(uintptr_t)0x1000;
  m->align_count = (CUfunction)(uintptr_t)0x2000;
  m->align_scan = (CUfunction)(uintptr_t)0x3000;
  m->align_scatter = (CUfunction)(uintptr_t)0x4000;
  m->combine = (CUfunction)(uintptr_t)0x5000;
  m->align_count_scan = (CUfunction)(uintptr_t)0x6000;
  m->align_scan_scatter = (CUfunction)(uintptr_t)0x7000;
  return m;
}

/* Distinct 256-byte aligned addresses that are never dereferenced. */
static void *fake_alloc(size_t bytes) {
  static uintptr_t next = 0x7e0000000000u;
  void *p = (void *)next;
  next += (bytes + 0xffffu) & ~(uintptr_t)0xffffu;
  return p;
}

static fixture fake_fixture(moejit_spec *spec) {
  fixture f = {0};
  *spec = small_spec();
  f.spec = spec;
  f.ctx = fake_ctx();
  f.ops = fake_model(f.ctx, spec, MJ_OPS_ALL);
  f.layer = fake_model(f.ctx, spec, MJ_OPS_LAYER);
  f.route_only = fake_model(f.ctx, spec, MJ_OPS_ROUTE);
  f.driver_calls = &fake_calls;
  buffers b = {0};
  make_buffers(&f, &b, fake_alloc);
  good_args(&f, &b);
  return f;
}

static void fake_fixture_free(fixture *f) {
  free(f->ops), free(f->layer), free(f->route_only);
  pthread_mutex_destroy(&f->ctx->lock);
  pthread_mutex_destroy(&f->ctx->error_lock);
  free(f->ctx);
}

/* A good call reaches the (fake) driver with `launches` launches. */
static void expect_launched(moejit_status st, int launches, const char *what) {
  cr_expect_eq(st, MOEJIT_OK, "%s: %s", what, moejit_last_error());
  cr_expect_eq(atomic_load(&fake_launches), launches, "%s: %d launches", what,
               atomic_load(&fake_launches));
  cr_expect_gt(fake_last_grid, 0, "%s: empty grid", what);
  atomic_store(&fake_calls, 0);
  atomic_store(&fake_launches, 0);
}

TestSuite(badargs_nogpu, .timeout = 60);

Test(badargs_nogpu, good_calls_reach_the_driver) {
  moejit_spec spec;
  fixture f = fake_fixture(&spec);
  expect_launched(moejit_route(f.ops, &f.route, NULL), 1, "route");
  expect_launched(moejit_align(f.ops, &f.align, NULL), 2, "align");
  expect_launched(moejit_combine(f.ops, &f.combine, NULL), 1, "combine");
  moejit_align_args a = f.align; /* indices only, one expert range */
  a.x = NULL, a.xs = NULL, a.expert_first = 3, a.expert_last = spec.experts;
  expect_launched(moejit_align(f.ops, &a, NULL), 2, "align of experts [3, E)");
  fake_fixture_free(&f);
}

/* Align fuses count and scan (two launches) while one chunk holds every
 * entry, then scan and scatter (two launches) up to
 * MJ_ALIGN_SCAN_SCATTER_CHUNKS chunks, and launches three from the next
 * entry on, or when asked to with MOEJIT_ALIGN_FUSED=0; one chunk also
 * takes three when the model found the fused count + scan too large for
 * the device's shared memory. */
Test(badargs_nogpu, align_fuses_count_and_scan_for_one_chunk) {
  moejit_spec spec;
  fixture f = fake_fixture(&spec);
  const int64_t chunk = mj_align_chunk_entries(&spec);
  const int64_t one_chunk = chunk / spec.top_k;
  const int64_t few = MJ_ALIGN_SCAN_SCATTER_CHUNKS * chunk / spec.top_k;
  moejit_align_args a = f.align;
  a.workspace_bytes = SIZE_MAX; /* fake buffers: sized for any T */
  a.tokens = one_chunk;
  expect_launched(moejit_align(f.ops, &a, NULL), 2, "align of the largest T of one chunk");
  a.tokens = one_chunk + 1;
  expect_launched(moejit_align(f.ops, &a, NULL), 2, "align of one entry past a chunk");
  a.tokens = few;
  expect_launched(moejit_align(f.ops, &a, NULL), 2, "align of the largest T of a few chunks");
  a.tokens = few + 1;
  expect_launched(moejit_align(f.ops, &a, NULL), 3, "align of one chunk more");
  for (int64_t t = 1; t <= few; t += few - 1) {
    char what[96];
    a.tokens = t;
    setenv("MOEJIT_ALIGN_FUSED", "0", 1);
    snprintf(what, sizeof what, "align at T = %lld, MOEJIT_ALIGN_FUSED=0", (long long)t);
    expect_launched(moejit_align(f.ops, &a, NULL), 3, what);
    setenv("MOEJIT_ALIGN_FUSED", "1", 1);
    snprintf(what, sizeof what, "align at T = %lld, MOEJIT_ALIGN_FUSED=1", (long long)t);
    expect_launched(moejit_align(f.ops, &a, NULL), 2, what);
    unsetenv("MOEJIT_ALIGN_FUSED");
  }
  a.tokens = 1;
  f.ops->align_unfused = 1;
  expect_launched(moejit_align(f.ops, &a, NULL), 3, "align at T = 1, fused kernel too large");
  fake_fixture_free(&f);
}

/* The largest token count the checks admit makes grids that fit the device
 * (no int overflow on the way); the buffers are fake, so nothing is touched. */
Test(badargs_nogpu, largest_token_count_gives_valid_grids) {
  moejit_spec spec;
  fixture f = fake_fixture(&spec);
  const int64_t max = INT32_MAX / spec.top_k;
  moejit_route_args r = f.route;
  r.tokens = max;
  expect_launched(moejit_route(f.ops, &r, NULL), 1, "route at the largest T");
  moejit_align_args a = f.align;
  a.tokens = max, a.workspace_bytes = SIZE_MAX;
  expect_launched(moejit_align(f.ops, &a, NULL), 3, "align at the largest T");
  moejit_combine_args c = f.combine;
  c.tokens = max;
  expect_launched(moejit_combine(f.ops, &c, NULL), 1, "combine at the largest T");
  size_t bytes = 0;
  cr_expect_eq(moejit_align_workspace_size(f.ops, max, &bytes), MOEJIT_OK);
  cr_expect_geq(bytes, (size_t)max * (size_t)spec.top_k * 4, "workspace wrapped around");
  fake_fixture_free(&f);
}

/* A GEMM tile larger than the device's shared memory per block (the
 * presets' H100 tiles on an A100, for one) is refused before route runs:
 * nothing is enqueued. */
Test(badargs_nogpu, forward_refuses_a_gemm_tile_the_device_cannot_hold) {
  moejit_spec spec;
  fixture f = fake_fixture(&spec);
  f.ctx->limits.smem_per_block_optin = 1024; /* smaller than any tile's pipeline */
  atomic_store(&fake_calls, 0);
  moejit_moe_args a = f.forward;
  cr_expect_eq(moejit_moe_forward(f.layer, &a, NULL), MOEJIT_ERR_UNSUPPORTED, "%s",
               moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "shared memory") &&
                strstr(moejit_last_error(), "this GPU allows 1024") &&
                strstr(moejit_last_error(), "HINT"),
            "%s", moejit_last_error());
  cr_expect_eq(atomic_load(&fake_calls), 0, "the forward reached the driver before refusing");
  /* the query of what the forward runs says the same; the host-only
   * queries answer 0 and leave the ctx's last error alone */
  char desc[256];
  cr_expect_eq(moejit_model_gemm_choice(f.layer, "gemm1", a.tokens, desc, sizeof desc, NULL),
               MOEJIT_ERR_UNSUPPORTED);
  cr_expect(strstr(moejit_last_error(), "this GPU allows 1024"), "%s", moejit_last_error());
  char before[512], after[512];
  snprintf(before, sizeof before, "%s", moejit_ctx_last_error(f.ctx));
  cr_expect_eq(moejit_moe_decode_layer(f.layer, a.tokens), 0);
  cr_expect_eq(moejit_moe_gemm1_gathers(f.layer, a.tokens), 0);
  snprintf(after, sizeof after, "%s", moejit_ctx_last_error(f.ctx));
  cr_expect_str_eq(after, before, "a host-only query recorded an error in the ctx");
  /* With an H100's limit the same forward passes the check and launches
   * route and align (the fake model has no GEMM kernels to go further). */
  f.ctx->limits.smem_per_block_optin = 232448;
  atomic_store(&fake_launches, 0);
  (void)moejit_moe_forward(f.layer, &a, NULL);
  cr_expect_geq(atomic_load(&fake_launches), 2, "the check refused a tile an H100 holds");
  atomic_store(&fake_calls, 0);
  atomic_store(&fake_launches, 0);
  fake_fixture_free(&f);
}

Test(badargs_nogpu, every_bad_argument_is_refused_before_the_driver) {
  moejit_spec spec;
  fixture f = fake_fixture(&spec);
  atomic_store(&fake_calls, 0);
  refusals = 0;
  refuse_everything(&f);
  cr_expect_gt(refusals, 150, "only %d refusals tried", refusals);
  cr_expect_eq(atomic_load(&fake_calls), 0);
  fprintf(stderr, "badargs: %d bad calls refused without a driver call\n", refusals);
  fake_fixture_free(&f);
}

Test(badargs_nogpu, model_load_refuses_null_and_invalid_specs) {
  moejit_spec spec = small_spec();
  moejit_model *m = (moejit_model *)(uintptr_t)1;
  moejit_ctx *ctx = fake_ctx();
  cr_expect_eq(moejit_model_load(NULL, &spec, &m), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_null(m, "*out is reset on failure");
  cr_expect_eq(moejit_model_load(ctx, NULL, &m), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_load(ctx, &spec, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_load_spec(NULL, &spec, NULL, &m), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_model_load_config(NULL, NULL, NULL, &m), MOEJIT_ERR_INVALID_ARGUMENT);
  /* a negative world is an expert-parallel request out of range, not one GPU */
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  o.ep.world = -4, o.ep.rank = 7;
  cr_expect_eq(moejit_model_load_spec(ctx, &spec, &o, &m), MOEJIT_ERR_INVALID_ARGUMENT, "%s",
               moejit_last_error());
  cr_expect(strstr(moejit_last_error(), "ep.world"), "%s", moejit_last_error());
  cr_expect_null(m);
  spec.top_k = spec.experts + 1;
  cr_expect_eq(moejit_model_load(ctx, &spec, &m), MOEJIT_ERR_CONFIG, "%s", moejit_last_error());
  cr_expect_null(m);
  cr_expect_eq(atomic_load(&fake_calls), 0, "the driver was called");
  cr_expect_eq(moejit_model_load_report(NULL, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_null(moejit_model_spec(NULL));
  moejit_model_destroy(NULL);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->error_lock);
  free(ctx);
}

/* ====================================================================================== */
/* On a GPU: the same table with real buffers, eagerly and under stream capture           */
/* ====================================================================================== */

/* Zeroed, so that compute-sanitizer initcheck sees no uninitialized read. */
static void *gpu_alloc(size_t bytes) {
  bytes = (bytes + 3) / 4 * 4;
  void *p = ops_alloc(bytes ? bytes : 4);
  ops_poison(p, bytes, 0);
  return p;
}

typedef struct gpu_fixture {
  fixture f;
  buffers b;
  moejit_spec spec;
} gpu_fixture;

static void gpu_fixture_make(gpu_fixture *g) {
  memset(g, 0, sizeof *g);
  g->spec = small_spec();
  fixture *f = &g->f;
  f->spec = &g->spec;
  f->ctx = ops_ctx();
  ops_load_models(&g->spec, 1, MJ_OPS_ALL, &f->ops);
  ops_load_models(&g->spec, 1, MJ_OPS_ROUTE, &f->route_only);
  OPS_OK(moejit_model_load_spec(f->ctx, &g->spec, NULL, &f->layer));
  make_buffers(f, &g->b, gpu_alloc);
  good_args(f, &g->b);
}

static void gpu_fixture_free(gpu_fixture *g) {
  void **p = (void **)&g->b;
  for (size_t i = 0; i < offsetof(buffers, ws_align_bytes) / sizeof *p; i++) ops_free(p[i]);
  moejit_model_destroy(g->f.ops);
  moejit_model_destroy(g->f.route_only);
  moejit_model_destroy(g->f.layer);
}

static void poison_outputs(const buffers *b) {
  for (int i = 0; i < b->n_outs; i++) ops_poison(b->outs[i].ptr, b->outs[i].bytes, OPS_POISON_INT);
  ops_sync();
}

static void expect_outputs_poisoned(const buffers *b, const char *when) {
  for (int i = 0; i < b->n_outs; i++) {
    void *host = malloc(b->outs[i].bytes);
    cr_assert_not_null(host);
    ops_download(host, b->outs[i].ptr, b->outs[i].bytes);
    cr_expect(ops_all_words(host, b->outs[i].bytes, OPS_POISON_INT),
              "%s: output buffer %d was written", when, i);
    free(host);
  }
}

Test(badargs_gpu, every_bad_argument_is_refused_and_nothing_runs, .timeout = 600) {
  OPS_REQUIRE_GPU();
  gpu_fixture g;
  gpu_fixture_make(&g);
  poison_outputs(&g.b);
  refusals = 0;
  refuse_everything(&g.f);
  cr_expect_gt(refusals, 150);
  OPS_OK(moejit_ctx_synchronize(g.f.ctx));
  expect_outputs_poisoned(&g.b, "eager");
  gpu_fixture_free(&g);
}

/* Refused calls inside a capture enqueue nothing and leave the capture
 * valid: the graph instantiates, replays (its one node, a memset of a
 * scratch word, shows it ran), and writes none of the outputs. */
Test(badargs_gpu, refusals_inside_a_capture_record_nothing, .timeout = 600) {
  OPS_REQUIRE_GPU();
  gpu_fixture g;
  gpu_fixture_make(&g);
  poison_outputs(&g.b);
  void *scratch = gpu_alloc(4);
  OPS_OK(moejit_stream_create(g.f.ctx, &g.f.stream));
  OPS_OK(moejit_graph_begin_capture(g.f.ctx, g.f.stream));
  OPS_OK(moejit_memset_d32(g.f.ctx, scratch, 0x600dcafeu, 1, g.f.stream));
  refuse_everything(&g.f);
  moejit_graph *graph = NULL;
  OPS_OK(moejit_graph_end_capture(g.f.ctx, g.f.stream, &graph));
  OPS_OK(moejit_graph_launch(g.f.ctx, graph, g.f.stream));
  OPS_OK(moejit_stream_synchronize(g.f.ctx, g.f.stream));
  uint32_t word = 0;
  ops_download(&word, scratch, sizeof word);
  cr_expect_eq(word, 0x600dcafeu, "the graph did not run");
  expect_outputs_poisoned(&g.b, "graph replay");
  ops_free(scratch);
  moejit_graph_destroy(g.f.ctx, graph);
  OPS_OK(moejit_stream_destroy(g.f.ctx, g.f.stream));
  gpu_fixture_free(&g);
}

/* Expert ids outside 0..E-1, extremes included, are dropped by align (no
 * write outside its buffers: compute-sanitizer memcheck sees to that). */
Test(badargs_gpu, align_drops_ids_out_of_range) {
  OPS_REQUIRE_GPU();
  gpu_fixture g;
  gpu_fixture_make(&g);
  const int E = g.spec.experts, k = g.spec.top_k, n = T_TOKENS * k;
  const int32_t wild[] = {INT32_MIN, -1, E, E + 1, INT32_MAX, 1 << 30};
  int32_t ids[T_TOKENS * 16], counts[64] = {0}, want[64] = {0}, row_of[T_TOKENS * 16];
  int kept = 0;
  for (int e = 0; e < n; e++) {
    ids[e] = e % 3 == 0 ? wild[(e / 3) % MJ_ARRAY_LEN(wild)] : (e * 7) % E;
    if (ids[e] >= 0 && ids[e] < E) want[ids[e]]++, kept++;
  }
  ops_upload(g.b.ids, ids, sizeof(int32_t) * (size_t)n);
  OPS_OK(moejit_align(g.f.ops, &g.f.align, NULL));
  ops_download(counts, g.b.counts, sizeof(int32_t) * (size_t)E);
  ops_download(row_of, g.b.row_of, sizeof(int32_t) * (size_t)n);
  int32_t total = -1;
  ops_download(&total, (int32_t *)g.b.offsets + E, sizeof total);
  cr_expect_eq(total, kept, "offsets[E] = %d, %d valid entries", total, kept);
  for (int x = 0; x < E; x++) cr_expect_eq(counts[x], want[x], "expert %d", x);
  for (int e = 0; e < n; e++)
    cr_expect_eq(row_of[e] < 0, !(ids[e] >= 0 && ids[e] < E), "entry %d (id %d): row %d", e, ids[e],
                 row_of[e]);
  gpu_fixture_free(&g);
}

/* NaN and infinite logits route to valid experts with finite weights, and
 * the whole layer's output stays finite. */
Test(badargs_gpu, forward_with_nan_and_inf_logits_stays_finite, .timeout = 600) {
  OPS_REQUIRE_GPU();
  gpu_fixture g;
  gpu_fixture_make(&g);
  const int E = g.spec.experts, k = g.spec.top_k;
  const size_t d = (size_t)g.spec.hidden;
  float logits[T_TOKENS * 64], bias[64] = {0};
  for (int t = 0; t < T_TOKENS; t++)
    for (int e = 0; e < E; e++) {
      const float specials[] = {NAN, INFINITY, -INFINITY, 3.0e38f, -3.0e38f};
      logits[t * E + e] = (t + e) % 2 ? specials[(t + e) % 5] : (float)e / (float)E;
    }
  ops_upload(g.b.logits, logits, sizeof(float) * T_TOKENS * (size_t)E);
  ops_upload(g.b.bias, bias, sizeof(float) * (size_t)E);
  ops_poison(g.b.x, T_TOKENS * d * 2, 0x3c003c00u); /* bf16 pairs of 0.0078 */
  ops_poison(g.b.w1, (size_t)E * 2 * g.spec.expert_width * d * 2, 0x3c003c00u);
  ops_poison(g.b.w2, (size_t)E * d * g.spec.expert_width * 2, 0x3c003c00u);
  OPS_OK(moejit_moe_forward(g.f.layer, &g.f.forward, NULL));
  int32_t ids[T_TOKENS * 16];
  float w[T_TOKENS * 16];
  uint16_t *out = malloc(T_TOKENS * d * 2);
  cr_assert_not_null(out);
  ops_download(ids, g.b.ids, sizeof(int32_t) * T_TOKENS * (size_t)k);
  ops_download(w, g.b.weights, sizeof(float) * T_TOKENS * (size_t)k);
  ops_download(out, g.b.out, T_TOKENS * d * 2);
  for (int i = 0; i < T_TOKENS * k; i++) {
    cr_expect(ids[i] >= 0 && ids[i] < E, "id %d at %d", ids[i], i);
    cr_expect(isfinite(w[i]), "weight %g at %d", w[i], i);
  }
  for (size_t i = 0; i < T_TOKENS * d; i++)
    cr_expect((out[i] & 0x7f80u) != 0x7f80u, "out[%zu] = bf16 0x%04x is not finite", i, out[i]);
  free(out);
  gpu_fixture_free(&g);
}
