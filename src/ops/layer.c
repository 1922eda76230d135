/* The whole MoE layer (moejit/layer.h): loading from a config path or
 * preset, the workspace layout, and the forward that chains the existing
 * launchers route -> align -> gemm1 + SwiGLU -> gemm2 -> combine, or, at
 * decode sizes, the two launches of the decode layer. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "dist/ep.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

#define WS_ALIGN 256

void moejit_load_opts_init(moejit_load_opts *opts) {
  if (opts) memset(opts, 0, sizeof *opts);
}

moejit_status moejit_model_load_spec(moejit_ctx *ctx, const moejit_spec *spec,
                                     const moejit_load_opts *opts, moejit_model **out) {
  return mj_model_load_with(ctx, spec, MJ_OPS_LAYER, "spec", opts, out);
}

static int is_regular_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A name with a slash or a YAML extension is meant as a file: say that the
 * file is missing rather than that no preset has that name. */
static int looks_like_path(const char *s) {
  size_t n = strlen(s);
  return strchr(s, '/') || (n > 5 && !strcmp(s + n - 5, ".yaml")) ||
         (n > 4 && !strcmp(s + n - 4, ".yml"));
}

static moejit_status spec_from(const char *what, moejit_spec *spec, char *origin, size_t cap) {
  if (!what) what = moejit_default_preset();
  if (!strncmp(what, "preset:", 7)) { /* the report's own form: never a file */
    mj_strlcpy(origin, what, cap);
    return moejit_spec_load_preset(what + 7, spec);
  }
  if (is_regular_file(what) || looks_like_path(what)) {
    mj_strlcpy(origin, what, cap);
    return moejit_spec_load_file(what, spec);
  }
  snprintf(origin, cap, "preset:%s", what);
  return moejit_spec_load_preset(what, spec);
}

moejit_status moejit_model_load_config(moejit_ctx *ctx, const char *config_or_preset,
                                       const moejit_load_opts *opts, moejit_model **out) {
  const double t0 = mj_now_ms();
  if (out) *out = NULL;
  if (!ctx || !out)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_model_load_config: %s is NULL",
                   !ctx ? "ctx" : "out");
  if (opts && opts->report) /* "filled as far as it got", also when the name resolves to nothing */
    memset(opts->report, 0, sizeof *opts->report);
  moejit_spec spec;
  char origin[MOEJIT_PATH_MAX];
  moejit_status st = spec_from(config_or_preset, &spec, origin, sizeof origin);
  if (st) return mj_ctx_fail(ctx, mj_fail_prefix(st, "moejit_model_load_config"));
  moejit_load_report scratch, *r = opts && opts->report ? opts->report : &scratch;
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  if (opts) o = *opts;
  o.report = r;
  st = mj_model_load_with(ctx, &spec, MJ_OPS_LAYER, origin, &o, out);
  r->total_ms = mj_now_ms() - t0; /* parsing included */
  if (*out) (*out)->report.total_ms = r->total_ms;
  return st;
}

/* ---- workspace ---------------------------------------------------------- */

/* Where each buffer of one forward lives inside the workspace (byte
 * offsets, each 256-byte aligned; docs/layer.md draws it). y reuses xs:
 * GEMM 1 has consumed xs by the time GEMM 2 writes y. */
typedef struct ws_layout {
  size_t ids, weights, counts, offsets, sorted_slot, row_of, tile_expert, tile_row_start, num_tiles,
      align_ws, xs_y, h, decode_counters, gemm_sync, split, logits, router_split, total;
  size_t align_bytes, split_bytes;
} ws_layout;

static size_t take(size_t *cursor, size_t bytes) {
  size_t at = *cursor;
  *cursor += (bytes + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
  return at;
}

static moejit_status layout_for(const moejit_model *m, int64_t tokens, ws_layout *l) {
  const moejit_spec *s = &m->spec;
  int64_t tiles = 0;
  moejit_status st = moejit_align_tile_capacity(m, tokens, &tiles);
  if (!st) st = moejit_align_workspace_size(m, tokens, &l->align_bytes);
  if (st) return st;
  const size_t entries = (size_t)tokens * (size_t)s->top_k, E = (size_t)s->experts;
  const size_t act = moejit_dtype_size(s->act_dtype);
  size_t c = 0;
  l->ids = take(&c, entries * 4);
  l->weights = take(&c, entries * 4);
  /* the router's logits, computed there when the forward gets gate_weight */
  l->logits = take(&c, (size_t)tokens * E * moejit_dtype_size(s->logits_dtype));
  l->router_split = take(&c, mj_router_split_bytes(m, tokens)); /* its parts' sums */
  l->counts = take(&c, E * 4);
  l->offsets = take(&c, (E + 1) * 4);
  l->sorted_slot = take(&c, entries * 4);
  l->row_of = take(&c, entries * 4);
  l->tile_expert = take(&c, (size_t)tiles * 4);
  l->tile_row_start = take(&c, (size_t)tiles * 4);
  l->num_tiles = take(&c, 4);
  l->align_ws = take(&c, l->align_bytes);
  /* the decode layer keeps GEMM 2's fp32 partial rows where xs and y go:
   * room for those of the most entries any T up to `tokens` within its
   * reach makes, so that a workspace sized for T serves every smaller T */
  const int64_t t_max = mj_decode_max_tokens(s), t_dec = tokens < t_max ? tokens : t_max;
  const size_t xs_y = entries * (size_t)s->hidden * act;
  const size_t part = (size_t)t_dec * (size_t)s->top_k * (size_t)s->hidden * 4;
  l->xs_y = take(&c, part > xs_y ? part : xs_y);
  l->h = take(&c, entries * (size_t)s->expert_width * act);
  l->decode_counters = take(&c, (size_t)(s->hidden / MJ_GEMV2_COLS) * 4);
  l->gemm_sync = take(&c, 8); /* GEMM 1's rounds in step (moejit_gemm_args.round_sync) */
  /* GEMM 2's K parts (moejit_gemm_args.split), right after: one memset
   * zeroes both sets of words */
  l->split_bytes = m->gemm2_split_bytes && tokens >= m->gemm2_split_from ? m->gemm2_split_bytes : 0;
  l->split = take(&c, l->split_bytes);
  l->total = c;
  return MOEJIT_OK;
}

/* The expert half of a layer (an expert-parallel model's local layer has
 * no router); the forward needs the router too. */
#define MJ_OPS_EXPERTS (MJ_OPS_LAYER & ~MJ_OPS_ROUTE)

static moejit_status check_layer_model(const moejit_model *m, const char *op, unsigned need) {
  if (!m) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: model is NULL", op);
  if ((m->families & need) != need)
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: this model holds only some kernels of the layer; HINT: "
                                    "load it with moejit_model_load_config or "
                                    "moejit_model_load_spec",
                                    op));
  return MOEJIT_OK;
}

moejit_status moejit_moe_workspace_size(const moejit_model *model, int64_t max_tokens,
                                        size_t *bytes) {
  const char *op = "moejit_moe_workspace_size";
  if (model && model->ep) return mj_ep_workspace_size(model, max_tokens, bytes);
  moejit_status st = check_layer_model(model, op, MJ_OPS_EXPERTS);
  if (st) return st;
  if (!bytes)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", op));
  if ((st = mj_check_tokens(model, op, max_tokens))) return st;
  ws_layout l;
  if ((st = layout_for(model, max_tokens, &l))) return st;
  *bytes = l.total;
  return MOEJIT_OK;
}

double moejit_moe_flops(const moejit_spec *spec, int64_t tokens) {
  if (!spec || tokens < 1) return 0;
  return 6.0 * (double)tokens * spec->top_k * (double)spec->hidden * (double)spec->expert_width;
}

/* ---- forward ------------------------------------------------------------ */

moejit_status mj_moe_check_pointers(const moejit_model *m, const moejit_moe_args *a) {
  static const char *op = "moejit_moe_forward";
  const struct {
    const char *name;
    const void *ptr;
    size_t align;
    int optional;
  } fields[] = {{"args->x", a->x, 16, 0},
                {"args->logits", a->logits, 16, 1},
                {"args->gate_weight", a->gate_weight, 16, 1},
                {"args->router_logits", a->router_logits, 16, 1},
                {"args->route_bias", a->route_bias, 16, 1},
                {"args->w1", a->w1, 16, 0},
                {"args->w2", a->w2, 16, 0},
                {"args->out", a->out, 16, 0},
                {"args->workspace", a->workspace, WS_ALIGN, 0},
                {"args->topk_ids", a->topk_ids, 4, 1},
                {"args->topk_weights", a->topk_weights, 4, 1}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(fields); i++) {
    moejit_status st = fields[i].optional
                           ? mj_check_opt_ptr(m, op, fields[i].name, fields[i].ptr, fields[i].align)
                           : mj_check_ptr(m, op, fields[i].name, fields[i].ptr, fields[i].align);
    if (st) return st;
  }
  if (!a->logits == !a->gate_weight)
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: args->logits and args->gate_weight are both %s; HINT: "
                                    "pass the router's logits [T, E], or its weight [E, d] "
                                    "with logits NULL, and the forward computes them",
                                    op, a->logits ? "set" : "NULL"));
  if (a->router_logits && !a->gate_weight)
    return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "%s: args->router_logits is set without args->gate_weight; "
                                    "HINT: it receives the logits the forward computes from "
                                    "gate_weight: leave it NULL when you pass logits",
                                    op));
  return MOEJIT_OK;
}

moejit_status mj_moe_logits(const moejit_model *m, const moejit_moe_args *a, void *ws_logits,
                            void *ws_split, moejit_stream stream, const void **logits) {
  *logits = a->logits;
  if (!a->gate_weight) return MOEJIT_OK;
  void *computed = a->router_logits ? a->router_logits : ws_logits;
  *logits = computed; /* one or two launches more */
  return mj_router_logits_launch(m, a->tokens, a->x, a->gate_weight, computed, ws_split, stream);
}

/* The configuration each GEMM of this forward runs (a tuned variant or the
 * heuristic), as the launchers will plan it. */
typedef struct gemm_choices {
  mj_gemm_choice gemm[2];
} gemm_choices;

/* op NULL: a host-only query, which records no error in the ctx */
static moejit_status choose_gemms(const moejit_model *m, const char *op, int64_t tokens,
                                  gemm_choices *c) {
  for (int which = 1; which <= 2; which++) {
    moejit_status st = mj_gemm_choose(&m->spec, &m->gemm_variants[which - 1], which, tokens,
                                      mj_ctx_arch(m->ctx), &c->gemm[which - 1]);
    if (st && op) st = mj_fail_prefix(st, "%s", op);
    /* the load refuses such a model; checked here too, before route runs */
    if (!st)
      st = mj_gemm_choice_fits(&c->gemm[which - 1], which, tokens, mj_ctx_smem_optin(m->ctx),
                               op ? op : "moejit_moe_forward");
    if (st) return op ? mj_model_fail(m, st) : st;
  }
  return MOEJIT_OK;
}

static moejit_status check_workspace(const moejit_model *m, const char *op, int64_t tokens,
                                     size_t have, const ws_layout *l) {
  if (have >= l->total) return MOEJIT_OK;
  return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                  "%s: args->workspace_bytes = %zu, but %lld tokens need %zu; "
                                  "HINT: size it with moejit_moe_workspace_size",
                                  op, have, (long long)tokens, l->total));
}

/* Everything a launch could refuse, checked before the first launch so a
 * bad argument enqueues nothing; the GEMMs are planned with the very
 * configuration the launches will use. */
static moejit_status check_forward(const moejit_model *m, const moejit_moe_args *a, ws_layout *l,
                                   gemm_choices *c) {
  static const char *op = "moejit_moe_forward";
  moejit_status st = check_layer_model(m, op, MJ_OPS_LAYER);
  if (st) return st;
  if (!a) return mj_model_fail(m, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: args is NULL", op));
  if ((st = mj_check_tokens(m, op, a->tokens)) || (st = mj_moe_check_pointers(m, a))) return st;
  if ((st = layout_for(m, a->tokens, l))) return st;
  if ((st = check_workspace(m, op, a->tokens, a->workspace_bytes, l))) return st;
  return choose_gemms(m, op, a->tokens, c);
}

#define AT(base, off) ((void *)((char *)(base) + (off)))

/* Whether GEMM 1 reads its rows from x through align's sorted_slot (the
 * wgmma kernel: templates/gemm1.cu, moejit_gemm1_swiglu_wgmma_gather, or
 * _wgmma_narrow_gather on the narrow tile) rather than from the permuted copy xs,
 * which align then does not write. The copy is T*k*d elements written and
 * read again; gathering instead costs the compute-bound 128-row tiles
 * about a tenth of their speed (the cp.async producer), and reads x rows
 * from L2 only while x fits there. So (measured on an H100, layer ms,
 * graph replay, gathered / copied: docs/layer.md, "GEMM 1 reading x in
 * place"):
 * - 64-row tiles always (the narrow tile too): the GEMM streams weights
 *   (qwen3-30b-a3b T = 2048: 597 against 622-662 us);
 * - cooperative 128-row tiles without clusters where the copy is large
 *   beside the GEMM (expert width f <= 2048) and x fits in L2 times
 *   min(2, 2048 / f): the larger the copy's share (1/f), the more L2
 *   overflow the gather outweighs. qwen3-30b-a3b T = 16384 2.364-2.367 /
 *   2.474-2.495, T = 8192 1.263-1.264 / 1.303-1.305, olmoe-1b-7b T = 16384
 *   2.968-2.983 / 3.088-3.149, deepseek-v3 T = 2048 (x 29 MB) 8.048-8.058 /
 *   8.301-8.306; not mixtral-8x7b (f = 14336: 2.56-2.61 / 2.39-2.41 at
 *   T = 2048), deepseek-v3 T = 4096 (x 59 MB: 10.09-10.10 / 9.92-10.03) or
 *   16384 (x 235 MB: 22.7-24.9 / 21.2-21.8), or ping-pong 128-row tiles
 *   (olmoe-1b-7b T = 2048: 0.548-0.552 / 0.497-0.500); and not where the
 *   experts' last M-tiles are short (gather_short_tail_loses below).
 * $MOEJIT_GEMM1_GATHER=1 gathers wherever the kernel can, 0 never. */
int mj_moe_gemm1_gathers(const moejit_spec *spec, int64_t tokens, const mj_gemm_choice *gemm1,
                         int64_t l2_bytes, int sms) {
  return mj_gemm1_plan_gathers(spec, tokens, &gemm1->plan, l2_bytes, sms);
}

/* Whether gathering loses to the copy at cooperative 128-row tiles because
 * the experts end in a short M-tile: with one or two whole M-tiles an
 * expert (uniform routing: T*k/E rows each) and a last one 20-55% full,
 * over 9 rounds of tiles or more, the gathering kernel reads the shared
 * weight tiles from DRAM again (qwen3-30b-a3b T = 2560: 1.41 GB against
 * 0.92 from the copy, GEMM 1 517 against 340 us) while the copy's TMA
 * tiles, all the same size, do not. Fitted to the layer on an H100
 * (graph replay, ms, gathered / copied; docs/layer.md, "GEMM 1 reading x
 * in place"): qwen3-30b-a3b T = 2560 0.72 / 0.61, 3072 0.73 / 0.64, 4608
 * 0.99 / 0.92, 5120 0.96 / 0.89, olmoe-1b-7b T = 2304 0.58 / 0.54; and
 * gathering wins or ties outside it (qwen3 T = 2304 with a 12% tail, 3328
 * and 3584 with 62% and 75%, 7168 with three whole tiles; olmoe-1b-7b
 * T = 1536, 8 rounds, 0.38 / 0.40). */
static int gather_short_tail_loses(const moejit_spec *spec, int64_t tokens, const mj_gemm_plan *p,
                                   int sms) {
  if (sms <= 0 || p->tile_m != 128 || p->tile_n <= 0) return 0;
  const double tiles = (double)tokens * spec->top_k / spec->experts / p->tile_m;
  const double whole = floor(tiles), tail = tiles - whole;
  const double n_tiles = ceil(2.0 * (double)spec->expert_width / p->tile_n);
  const double rounds = ceil(tiles) * spec->experts * n_tiles / sms;
  return whole >= 1 && whole <= 2 && tail >= 0.2 && tail <= 0.55 && rounds >= 9;
}

int mj_gemm1_plan_gathers(const moejit_spec *spec, int64_t tokens, const mj_gemm_plan *p,
                          int64_t l2_bytes, int sms) {
  /* no gathering twin: not the wgmma kernel, or pairs along N (they share A
   * by TMA multicast) */
  if (!mj_gemm1_gather_entry(p)) return 0;
  int want = p->tile_m == 64;
  if (!want && p->tile_m == 128 && !p->wg_pingpong && p->wg_cluster == 1 &&
      spec->expert_width <= 2048) {
    const double x =
        (double)tokens * (double)spec->hidden * (double)moejit_dtype_size(spec->act_dtype);
    const double share = 2048.0 / (double)spec->expert_width;
    want = l2_bytes > 0 && x <= (share < 2.0 ? share : 2.0) * (double)l2_bytes &&
           !gather_short_tail_loses(spec, tokens, p, sms);
  }
  return mj_env_switch("MOEJIT_GEMM1_GATHER", want);
}

/* What the combine tidies in L2 after the layer (templates/combine.cu):
 * the lines GEMM 1 and GEMM 2 stored with the evict_last policy (h and y
 * where each is at most MJ_KEEP_OUTPUT_BYTES), dead by then, are discarded,
 * and x's lines, which the gathering GEMM 1 read with it, demoted. Without
 * that they would outlast the layer in L2 and every later kernel would run
 * with that much less of it and write back the dead dirty lines
 * (docs/layer.md, "L2 after the layer"). $MOEJIT_LAYER_TIDY=0 leaves them. */
static void tidy_after(const moejit_model *m, int64_t tokens, const void *x, int gather, void *ws,
                       const ws_layout *l, mj_combine_tidy *t) {
  const moejit_spec *s = &m->spec;
  const size_t act = moejit_dtype_size(s->act_dtype), rows = (size_t)tokens * (size_t)s->top_k;
  const size_t h_bytes = rows * (size_t)s->expert_width * act;
  const size_t y_bytes = rows * (size_t)s->hidden * act;
  memset(t, 0, sizeof *t);
  if (!mj_env_switch("MOEJIT_LAYER_TIDY", 1)) return;
  if (h_bytes <= MJ_KEEP_OUTPUT_BYTES) {
    t->dead = AT(ws, l->h);
    t->dead_bytes = h_bytes;
  }
  t->drop_y = y_bytes <= MJ_KEEP_OUTPUT_BYTES;
  if (gather) {
    t->gathered = x;
    t->gathered_bytes = (size_t)tokens * (size_t)s->hidden * act;
  }
}

/* Align, the two GEMMs and combine, routing given (ids, weights). */
static moejit_status launch_experts(const moejit_model *m, int64_t tokens, const void *x,
                                    const int32_t *ids, const float *weights, const void *w1,
                                    const void *w2, void *out, void *ws, const ws_layout *l,
                                    const gemm_choices *c, moejit_stream stream) {
  const int gather = mj_moe_gemm1_gathers(&m->spec, tokens, &c->gemm[0], mj_ctx_l2_bytes(m->ctx),
                                          mj_ctx_sm_count(m->ctx));
  moejit_align_args g = {.tokens = tokens,
                         .topk_ids = ids,
                         .x = gather ? NULL : x,
                         .xs = gather ? NULL : AT(ws, l->xs_y),
                         .expert_counts = AT(ws, l->counts),
                         .expert_offsets = AT(ws, l->offsets),
                         .sorted_slot = AT(ws, l->sorted_slot),
                         .row_of = AT(ws, l->row_of),
                         .tile_expert = AT(ws, l->tile_expert),
                         .tile_row_start = AT(ws, l->tile_row_start),
                         .num_tiles = AT(ws, l->num_tiles),
                         .workspace = AT(ws, l->align_ws),
                         .workspace_bytes = l->align_bytes};
  moejit_status st = moejit_align(m, &g, stream);
  if (st) return st;
  const int32_t *offsets = AT(ws, l->offsets);
  const int64_t rows = tokens * m->spec.top_k;
  moejit_gemm_args g1 = {.a = gather ? x : AT(ws, l->xs_y),
                         .w = w1,
                         .out = AT(ws, l->h),
                         .expert_offsets = offsets,
                         .max_rows = rows,
                         .path = c->gemm[0].path,
                         .a_index = gather ? (const int32_t *)AT(ws, l->sorted_slot) : NULL,
                         .a_index_div = (int32_t)m->spec.top_k,
                         .a_rows = tokens,
                         .round_sync = AT(ws, l->gemm_sync)};
  /* GEMM 2 splits its last round along K where its plan can and the
   * workspace holds the scratch (from m->gemm2_split_from tokens on) */
  size_t split_bytes, split_zero;
  mj_gemm2_split_layout(&c->gemm[1].plan, mj_ctx_sm_count(m->ctx), &split_bytes, &split_zero);
  const int split = split_bytes && split_bytes <= l->split_bytes;
  /* the workspace's words start at zero in every forward that uses them
   * (its memory is the caller's: any content): the rounds' two words and
   * the K parts' counters, which follow them, in one memset */
  const int in_step = mj_gemm1_rounds_in_step(c->gemm[0].spec, &g1, &c->gemm[0].plan);
  if ((in_step || split) &&
      (st = moejit_memset_d32(m->ctx, g1.round_sync, 0,
                              split ? (l->split - l->gemm_sync + split_zero) / 4 : 2, stream)))
    return st;
  if ((st = moejit_gemm1_swiglu(m->ctx, c->gemm[0].spec, &g1, stream))) return st;
  moejit_gemm_args g2 = {.a = AT(ws, l->h),
                         .w = w2,
                         .out = AT(ws, l->xs_y), /* y over xs, which GEMM 1 consumed */
                         .expert_offsets = offsets,
                         .row_scale = NULL, /* top-k weights go in combine */
                         .max_rows = rows,
                         .path = c->gemm[1].path,
                         .split = split ? AT(ws, l->split) : NULL,
                         .split_bytes = split ? l->split_bytes : 0};
  if ((st = moejit_gemm2(m->ctx, c->gemm[1].spec, &g2, stream))) return st;
  moejit_combine_args cb = {.tokens = tokens,
                            .y = AT(ws, l->xs_y),
                            .row_of = AT(ws, l->row_of),
                            .weights = weights,
                            .out = out};
  mj_combine_tidy tidy;
  tidy_after(m, tokens, x, gather, ws, l, &tidy);
  return mj_combine_tidied(m, &cb, &tidy, stream);
}

moejit_status mj_moe_experts(const moejit_model *m, int64_t tokens, const void *x,
                             const int32_t *ids, const float *weights, const void *w1,
                             const void *w2, void *out, void *ws, size_t ws_bytes,
                             moejit_stream stream) {
  static const char *op = "moejit_moe_forward (local experts)";
  ws_layout l;
  gemm_choices c;
  moejit_status st = mj_check_tokens(m, op, tokens);
  if (!st) st = layout_for(m, tokens, &l);
  if (!st) st = check_workspace(m, op, tokens, ws_bytes, &l);
  if (!st) st = choose_gemms(m, op, tokens, &c);
  if (st) return st;
  return launch_experts(m, tokens, x, ids, weights, w1, w2, out, ws, &l, &c, stream);
}

/* ---- the decode layer ----------------------------------------------------- */

/* At T <= MOEJIT_DECODE_MAX_TOKENS and T * k <= MOEJIT_DECODE_MAX_ENTRIES
 * (mj_decode_reach) the forward is the decode layer, two launches of the
 * GEMM modules (their wide pairs, _wide past MOEJIT_GEMV_PASS_ROWS
 * entries and _wide64 past MJ_DECODE_WIDE_ENTRIES: mj_decode_pair):
 * moejit_layer_decode_gemm1 (templates/
 * gemm1.cu) routes (every block, the router's own code), runs GEMM 1 +
 * SwiGLU on x rows directly, zeroes the column-group counters and, where
 * they fit, pulls the active experts' W2 into L2; moejit_layer_decode_gemm2
 * (gemm2.cu) runs GEMM 2 and combines: in each block where a block can hold
 * whole column groups, else through fp32 partial rows (over xs_y) that the
 * unit completing a column group sums. No align, no permutation, no combine
 * launch. */
int mj_moe_decode_ok(const moejit_spec *spec, int64_t tokens, const mj_gemm_choice *gemm1,
                     const mj_gemm_choice *gemm2) {
  if (!mj_decode_reach(spec, tokens)) return 0;
  if (!gemm1->plan.use_gemv || !gemm2->plan.use_gemv) return 0;
  return mj_env_switch("MOEJIT_LAYER_DECODE", 1);
}

/* The GEMM choices of a one-GPU whole-layer forward of `tokens` tokens;
 * 0 when there is none (NULL or expert-parallel model, T out of range, a
 * forward that would be refused). Records no error in the ctx. */
static int layer_choices(const moejit_model *m, int64_t tokens, gemm_choices *c) {
  return m && !m->ep && (m->families & MJ_OPS_LAYER) == MJ_OPS_LAYER && tokens >= 1 &&
         tokens <= INT32_MAX / m->spec.top_k && !choose_gemms(m, NULL, tokens, c);
}

int moejit_moe_decode_layer(const moejit_model *m, int64_t tokens) {
  gemm_choices c;
  if (!layer_choices(m, tokens, &c)) return 0;
  return mj_moe_decode_ok(&m->spec, tokens, &c.gemm[0], &c.gemm[1]);
}

int moejit_moe_gemm1_gathers(const moejit_model *m, int64_t tokens) {
  gemm_choices c;
  if (!layer_choices(m, tokens, &c) || mj_moe_decode_ok(&m->spec, tokens, &c.gemm[0], &c.gemm[1]))
    return 0;
  return mj_moe_gemm1_gathers(&m->spec, tokens, &c.gemm[0], mj_ctx_l2_bytes(m->ctx),
                              mj_ctx_sm_count(m->ctx));
}

/* Blocks of MJ_GEMV_WARPS warps for `units` work units: as many rounds as
 * the resident warps (per_sm blocks per SM) need, and every warp with the
 * same number of units. */
static unsigned decode_blocks(const moejit_model *m, int64_t units, int per_sm) {
  const int64_t resident = (int64_t)mj_ctx_sm_count(m->ctx) * per_sm * MJ_GEMV_WARPS;
  const int64_t rounds = (units + resident - 1) / resident;
  const int64_t warps = rounds > 0 ? (units + rounds - 1) / rounds : 1;
  return (unsigned)((warps + MJ_GEMV_WARPS - 1) / MJ_GEMV_WARPS);
}

/* Blocks for the decode layer's GEMM 2 combining in each block
 * (templates/gemm2.cu): block b takes `per` consecutive column groups, all
 * `active` experts' units of them, run by its warps in turn. `per` is the
 * most groups whose units keep every warp within the rounds the resident
 * warps need for all the units (the counters' form runs as many), fewer
 * if the blocks would then outnumber the resident ones, and at most
 * MJ_DECODE2_MAX_GROUPS. `active` is the most the entries can reach; where
 * fewer are active, a block's warps run fewer units. */
static unsigned decode2_block_grid(const moejit_model *m, int64_t groups, int64_t active,
                                   int per_sm) {
  const int64_t blocks = (int64_t)mj_ctx_sm_count(m->ctx) * per_sm;
  const int64_t units = groups * active;
  int64_t rounds = (units + blocks * MJ_GEMV_WARPS - 1) / (blocks * MJ_GEMV_WARPS), per;
  for (;; rounds++) {
    per = rounds * MJ_GEMV_WARPS / active;
    if (per >= MJ_DECODE2_MAX_GROUPS || (groups + per - 1) / per <= blocks) break;
  }
  if (per > MJ_DECODE2_MAX_GROUPS) per = MJ_DECODE2_MAX_GROUPS;
  return (unsigned)((groups + per - 1) / per);
}

/* Whether GEMM 1 of the decode layer pulls the active experts' W2 into L2
 * for GEMM 2: only when $MOEJIT_DECODE_PREFETCH=1 asks for it. It pays only
 * where L2 still holds W2 from the call before (the same layer called again
 * and again): from a cold L2, as in a model, the layer took 43-44 µs with it
 * against 35.8 without (qwen3-30b-a3b, T = 1, an H100; docs/layer.md). */
static int decode_prefetch(void) {
  return mj_env_switch("MOEJIT_DECODE_PREFETCH", 0);
}

/* Whether GEMM 2 of the decode layer combines in each block (its grid:
 * decode2_block_grid; templates/gemm2.cu) instead of through global partial
 * rows and counters: at T = 1, and where T x f is at most
 * MJ_DECODE_BLOCK_COMBINE_TF (small experts at a few tokens), where it
 * measured faster or even; elsewhere the counters measured faster or even
 * (up to 4.5%: llama4-scout at T = 6 and 8 on an H100; docs/layer.md,
 * "Combined in the block"). $MOEJIT_DECODE_BLOCK_COMBINE=1 / 0 takes one
 * form at every T. Both give the same bits. */
#define MJ_DECODE_BLOCK_COMBINE_TF 4096
static int decode_block_combine(const moejit_spec *s, int64_t tokens) {
  const int dflt = tokens == 1 || tokens * s->expert_width <= MJ_DECODE_BLOCK_COMBINE_TF;
  return mj_env_switch("MOEJIT_DECODE_BLOCK_COMBINE", dflt);
}

static moejit_status decode_kernel(const moejit_model *m, const mj_gemm_choice *c, int which,
                                   const char *entry, moejit_kernel **k) {
  moejit_spec scratch;
  const moejit_spec *ks = mj_gemm_kernel_spec(c->spec, which, &c->plan, &scratch);
  return moejit_ctx_get_kernel(m->ctx, ks, c->plan.family, entry, k);
}

static moejit_status launch_decode(const moejit_model *m, const moejit_moe_args *a,
                                   const void *logits, int32_t *ids, float *weights,
                                   const ws_layout *l, const gemm_choices *c,
                                   moejit_stream stream) {
  const moejit_spec *s = &m->spec;
  moejit_kernel *k1, *k2;
  const int pair = mj_decode_pair(s, a->tokens);
  moejit_status st = decode_kernel(m, &c->gemm[0], 1, mj_decode_entry(1, pair), &k1);
  if (!st) st = decode_kernel(m, &c->gemm[1], 2, mj_decode_entry(2, pair), &k2);
  if (st) return mj_model_fail(m, mj_fail_prefix(st, "moejit_moe_forward"));
  const void *x = a->x, *bias = a->route_bias, *w1 = a->w1, *w2 = a->w2;
  void *h = AT(a->workspace, l->h), *out = a->out, *part = AT(a->workspace, l->xs_y);
  void *counters = AT(a->workspace, l->decode_counters);
  int tokens = (int)a->tokens;
  const int64_t entries = a->tokens * s->top_k;
  const int64_t active = entries < s->experts ? entries : s->experts;
  const unsigned block[3] = {MJ_GEMV_WARPS * 32u, 1, 1};
  const unsigned grid1[3] = {
      decode_blocks(m, active * (s->expert_width / MJ_DECODE1_COLS), MJ_GEMV_BLOCKS_PER_SM), 1, 1};
  const int64_t groups = s->hidden / MJ_GEMV2_COLS;
  const int per_sm2 = mj_decode2_blocks_per_sm(s->top_k, s->hidden, pair);
  int prefetch = decode_prefetch(), block_combine = decode_block_combine(s, a->tokens);
  const unsigned grid2[3] = {block_combine ? decode2_block_grid(m, groups, active, per_sm2)
                                           : decode_blocks(m, active * groups, per_sm2),
                             1, 1};
  void *p1[] = {&logits, &bias, &x, &w1, &h, &ids, &weights, &tokens, &counters, &w2, &prefetch};
  void *p2[] = {&h, &w2, &ids, &weights, &tokens, &out, &part, &counters, &block_combine};
  st = moejit_kernel_launch(m->ctx, k1, grid1, block, 0, stream, p1);
  if (!st) st = moejit_kernel_launch(m->ctx, k2, grid2, block, 0, stream, p2);
  return st ? mj_model_fail(m, st) : MOEJIT_OK;
}

moejit_status moejit_moe_forward(const moejit_model *model, const moejit_moe_args *args,
                                 moejit_stream stream) {
  if (model && model->ep) return mj_ep_forward(model, args, stream);
  ws_layout l;
  gemm_choices choices;
  moejit_status st = check_forward(model, args, &l, &choices);
  if (st) return st;
  void *ws = args->workspace;
  int32_t *ids = args->topk_ids ? args->topk_ids : AT(ws, l.ids);
  float *weights = args->topk_weights ? args->topk_weights : AT(ws, l.weights);
  const void *logits = NULL;
  st = mj_moe_logits(model, args, AT(ws, l.logits), AT(ws, l.router_split), stream, &logits);
  if (st) return mj_model_fail(model, st);
  if (mj_moe_decode_ok(&model->spec, args->tokens, &choices.gemm[0], &choices.gemm[1]))
    return launch_decode(model, args, logits, ids, weights, &l, &choices, stream);
  moejit_route_args r = {.tokens = args->tokens,
                         .logits = logits,
                         .bias = args->route_bias,
                         .topk_ids = ids,
                         .topk_weights = weights};
  if ((st = moejit_route(model, &r, stream))) return st;
  return launch_experts(model, args->tokens, args->x, ids, weights, args->w1, args->w2, args->out,
                        ws, &l, &choices, stream);
}
