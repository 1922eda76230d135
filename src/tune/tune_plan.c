/* The candidate plan of a sweep: every (shape, kernel, tile config, path)
 * its spaces span, pruned before anything is compiled (spec rules, path
 * blockers, divisibility, launch plans identical to one already kept), plus
 * the tiles AUTO itself resolves to, so that a tuned entry is never slower
 * than the heuristic it replaces. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/gemm.h"
#include "tune/tune.h"

/* What makes two candidates the same kernel launch: the plan fields the
 * kernel's code and launch depend on (grid size aside). The mma path's
 * smem folds tile_k and stages together, so they are kept apart here. Only
 * wgmma plans set wg_cluster and wg_cluster_n (mma and gemv plans leave them
 * 0), so configs that differ only in cluster_m or cluster_n share a key off
 * wgmma and are duplicates there. The GEMV plan ignores the spec's tile
 * (fixed rows and columns per warp, no shared memory, no raster): every gemv
 * candidate of a shape and kernel has one key, so one of them is kept. */
typedef struct plan_key {
  const char *entry;
  int tile_m, tile_n, threads, smem, wm, wn, wk, wg_stages, box_a, box_w, cluster, cluster_n;
  int pingpong, tile_k, stages, raster;
} plan_key;

static int key_eq(const plan_key *a, const plan_key *b) {
  return !strcmp(a->entry, b->entry) && a->tile_m == b->tile_m && a->tile_n == b->tile_n &&
         a->threads == b->threads && a->smem == b->smem && a->wm == b->wm && a->wn == b->wn &&
         a->wk == b->wk && a->wg_stages == b->wg_stages && a->box_a == b->box_a &&
         a->box_w == b->box_w && a->cluster == b->cluster && a->cluster_n == b->cluster_n &&
         a->pingpong == b->pingpong && a->tile_k == b->tile_k && a->stages == b->stages &&
         a->raster == b->raster;
}

static plan_key key_of(const mj_gemm_plan *p, const moejit_gemm_cfg *cfg) {
  plan_key k = {.entry = p->entry,
                .tile_m = p->tile_m,
                .tile_n = p->tile_n,
                .threads = (int)p->threads,
                .smem = (int)p->smem_bytes,
                .wm = p->warps_m,
                .wn = p->warps_n,
                .wk = p->warps_k,
                .wg_stages = p->wg_stages,
                .box_a = p->wg_box_a_rows,
                .box_w = p->wg_box_w_rows,
                .cluster = p->wg_cluster,
                .cluster_n = p->wg_cluster_n,
                .pingpong = p->wg_pingpong,
                .raster = (int)cfg->raster};
  if (p->use_gemv) k.raster = 0;
  if (p->use_mma) cfg = &p->cfg; /* the tile the kernel is built with (fitted under AUTO) */
  if (!p->use_wgmma && !p->use_gemv) k.tile_k = cfg->tile_k, k.stages = cfg->stages;
  return k;
}

void mj_tune_cand_spec(const moejit_sweep *sw, int shape, int which, const moejit_gemm_cfg *cfg,
                       const char *arch, moejit_spec *out) {
  *out = sw->shapes[shape].spec;
  if (which == 1) out->gemm1 = *cfg;
  if (which == 2) out->gemm2 = *cfg;
  out->n_archs = 1;
  mj_strlcpy(out->archs[0], arch, sizeof out->archs[0]);
}

/* Builder state: the plan and each candidate's key (parallel arrays). */
typedef struct builder {
  const moejit_sweep *sw;
  const char *arch;
  mj_tune_plan *plan;
  plan_key *keys;
  size_t cap_keys;
  /* the kept candidates of the current (shape, which), by plan key and
   * path: an open-addressing table of candidate index + 1 (0: empty), so
   * finding a duplicate does not walk the whole plan */
  size_t *slots;
  size_t n_slots, used_slots;
} builder;

static uint64_t key_hash(const plan_key *k, moejit_gemm_path path) {
  uint64_t h = 1469598103934665603ull;
  for (const char *s = k->entry; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  const int v[] = {k->tile_m,   k->tile_n,    k->threads, k->smem,   k->wm,      k->wn,
                   k->wk,       k->wg_stages, k->box_a,   k->box_w,  k->cluster, k->cluster_n,
                   k->pingpong, k->tile_k,    k->stages,  k->raster, (int)path};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    h = (h ^ (uint64_t)(uint32_t)v[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

/* Forgets the kept candidates: a new (shape, which) begins. */
static void slots_clear(builder *b) {
  if (b->slots) memset(b->slots, 0, b->n_slots * sizeof *b->slots);
  b->used_slots = 0;
}

/* Counts a pruned candidate under its category; past the table's size
 * the last slot becomes "other". */
static void count_reason(mj_tune_plan *p, const char *category) {
  for (size_t i = 0; i < p->n_reasons; i++)
    if (!strcmp(p->reasons[i].reason, category)) {
      p->reasons[i].count++;
      return;
    }
  if (p->n_reasons < MOEJIT_TUNE_MAX_REASONS) {
    moejit_tune_reason *r = &p->reasons[p->n_reasons++];
    mj_strlcpy(r->reason, category, sizeof r->reason);
    r->count = 1;
    return;
  }
  moejit_tune_reason *last = &p->reasons[MOEJIT_TUNE_MAX_REASONS - 1];
  mj_strlcpy(last->reason, "other", sizeof last->reason);
  last->count++;
}

/* The kept candidate of this (shape, which) with the same path and plan
 * key, or -1. Candidates of one (shape, which) are pushed one after the
 * other, and the table holds only them. */
static int find_same(const builder *b, const mj_tune_cand *c, const plan_key *k) {
  if (!b->n_slots) return -1;
  for (size_t i = key_hash(k, c->path) & (b->n_slots - 1);; i = (i + 1) & (b->n_slots - 1)) {
    if (!b->slots[i]) return -1;
    const size_t j = b->slots[i] - 1;
    const mj_tune_cand *o = &b->plan->cands[j];
    if (o->shape == c->shape && o->which == c->which && o->path == c->path &&
        key_eq(&b->keys[j], k))
      return (int)j;
  }
}

static void slots_put(builder *b, size_t cand) {
  const mj_tune_cand *c = &b->plan->cands[cand];
  for (size_t i = key_hash(&b->keys[cand], c->path) & (b->n_slots - 1);;
       i = (i + 1) & (b->n_slots - 1))
    if (!b->slots[i]) {
      b->slots[i] = cand + 1;
      b->used_slots++;
      return;
    }
}

/* Keeps the table under half full (doubling it re-inserts what it holds). */
static moejit_status slots_reserve(builder *b) {
  if (2 * (b->used_slots + 1) <= b->n_slots) return MOEJIT_OK;
  const size_t n = b->n_slots ? 2 * b->n_slots : 1024;
  size_t *old = b->slots, old_n = b->n_slots;
  if (!(b->slots = calloc(n, sizeof *b->slots))) {
    b->slots = old;
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory planning a sweep");
  }
  b->n_slots = n, b->used_slots = 0;
  for (size_t i = 0; i < old_n; i++)
    if (old[i]) slots_put(b, old[i] - 1);
  free(old);
  return MOEJIT_OK;
}

static moejit_status push(builder *b, const mj_tune_cand *c, const plan_key *k) {
  mj_tune_plan *p = b->plan;
  if (p->n == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    mj_tune_cand *cands = realloc(p->cands, cap * sizeof *cands);
    if (!cands) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory planning a sweep");
    p->cands = cands, p->cap = cap;
  }
  if (p->n == b->cap_keys) {
    size_t cap = b->cap_keys ? b->cap_keys * 2 : 64;
    plan_key *keys = realloc(b->keys, cap * sizeof *keys);
    if (!keys) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory planning a sweep");
    b->keys = keys, b->cap_keys = cap;
  }
  if (k && !c->pruned) {
    moejit_status st = slots_reserve(b);
    if (st) return st;
  }
  p->cands[p->n] = *c;
  b->keys[p->n] = k ? *k : (plan_key){.entry = ""};
  p->n++;
  if (c->pruned) p->pruned++, count_reason(p, c->category);
  if (k && !c->pruned) slots_put(b, p->n - 1);
  return MOEJIT_OK;
}

static void prune(mj_tune_cand *c, const char *category, const char *detail) {
  c->pruned = 1;
  mj_strlcpy(c->category, category, sizeof c->category);
  mj_strlcpy(c->reason, detail, sizeof c->reason);
}

/* The spec rule a config breaks, as a category. The cluster rules get one
 * each: a space crossing cluster_m [1, 2] with cluster_n [1, 2] always
 * spans 2x2 clusters, while an odd n-tile count depends on the shape and
 * tile_n, which the summary should tell apart. */
static const char *rule_category(const char *msg) {
  if (strstr(msg, "accumulators")) return "registers (over 128 accumulators per thread)";
  if (strstr(msg, "shared memory")) return "shared memory (over 227 KiB)";
  if (strstr(msg, "2x2 thread-block cluster")) return "thread-block cluster (2x2)";
  if (strstr(msg, "cluster_n = 2") && strstr(msg, "odd number"))
    return "thread-block cluster (cluster_n 2, odd n-tile count)";
  if (strstr(msg, "cluster")) return "thread-block cluster";
  return "invalid config";
}

/* Output columns per tile and the reduction step must divide N and K
 * (a ragged last tile computes idle columns on every expert). The GEMV
 * kernel ignores the tile: its warps take MJ_GEMV1_COLS / MJ_GEMV2_COLS
 * output columns and K in 16-byte (8-element) loads, which its blocker's
 * multiples of 8 already divide. */
static const char *divisibility(const moejit_spec *s, int which, const moejit_gemm_cfg *g,
                                moejit_gemm_path path, char *detail, size_t cap) {
  int64_t n = which == 1 ? s->expert_width : s->hidden,
          k = which == 1 ? s->hidden : s->expert_width;
  const int gemv = path == MOEJIT_GEMM_PATH_GEMV;
  int cols =
      gemv ? (which == 1 ? MJ_GEMV1_COLS : MJ_GEMV2_COLS) : (int)mj_gemm_out_cols(which, g->tile_n);
  int step = gemv ? 8 : path == MOEJIT_GEMM_PATH_WGMMA ? 64 : g->tile_k;
  if (n % cols) {
    snprintf(detail, cap, "divisibility: %lld output columns are not a multiple of the tile's %d",
             (long long)n, cols);
    return "divisibility (output columns)";
  }
  if (k % step) {
    snprintf(detail, cap, "divisibility: K = %lld is not a multiple of the k-step %d", (long long)k,
             step);
    return "divisibility (K)";
  }
  return NULL;
}

/* Classifies one candidate and adds it (pruned or kept); a duplicate's
 * token counts are merged into the candidate it duplicates. */
static moejit_status add_candidate(builder *b, mj_tune_cand c, int check_divisible) {
  const char *arch = b->arch;
  moejit_spec spec;
  mj_tune_cand_spec(b->sw, c.shape, c.which, &c.cfg, arch, &spec);
  char detail[192];
  const char *blocker;
  mj_gemm_plan plan;
  c.unit = -1;
  b->plan->enumerated++;
  if (c.path == MOEJIT_GEMM_PATH_WGMMA && strcmp(arch, "sm_90a") != 0) {
    snprintf(detail, sizeof detail, "the wgmma kernel needs sm_90a (the target is %s)", arch);
    prune(&c, "wgmma needs sm_90a", detail);
  } else if (moejit_spec_validate(&spec) != MOEJIT_OK) {
    prune(&c, rule_category(moejit_last_error()), moejit_last_error());
  } else if ((blocker = mj_gemm_path_blocker(&spec, c.which, c.path))) {
    char category[96]; /* the blocker's gist: up to its first ':' */
    snprintf(category, sizeof category, "%s kernel: %.*s", moejit_gemm_path_name(c.path),
             (int)strcspn(blocker, ":"), blocker);
    prune(&c, category, blocker);
  } else if (check_divisible &&
             (blocker = divisibility(&spec, c.which, &c.cfg, c.path, detail, sizeof detail))) {
    prune(&c, blocker, detail);
  } else if (mj_gemm_plan_make_for(&spec, c.which, c.path, 1024, arch, &plan) != MOEJIT_OK) {
    /* an mma.sync tile over a smaller arch's limit (sm_80: 163 KiB) */
    const char *msg = moejit_last_error();
    prune(&c,
          strstr(msg, "shared memory") ? "shared memory (over the arch's limit)" : "no launch plan",
          msg);
  }
  mj_clear_error();
  if (c.pruned) return push(b, &c, NULL);
  plan_key k = key_of(&plan, &c.cfg);
  int same = find_same(b, &c, &k);
  if (same < 0) return push(b, &c, &k);
  mj_tune_cand *kept = &b->plan->cands[same];
  kept->tmask |= c.tmask;
  char kept_cfg[64];
  moejit_gemm_cfg_text(&kept->cfg, kept_cfg, sizeof kept_cfg);
  snprintf(detail, sizeof detail, "same launch plan as %s %s", kept_cfg,
           moejit_gemm_path_name(kept->path));
  prune(&c, "duplicate launch plan", detail);
  return push(b, &c, NULL);
}

/* Bits of the shape's token counts that a space times. */
static uint32_t space_tmask(const mj_sweep_shape *sh, const mj_sweep_space *sp) {
  uint32_t m = 0;
  for (int t = 0; t < sh->n_tokens; t++) {
    int in = sp->n_tokens == 0;
    for (int j = 0; j < sp->n_tokens && !in; j++) in = sp->tokens[j] == sh->tokens[t];
    if (in) m |= 1u << t;
  }
  return m;
}

static moejit_status enumerate_space(builder *b, int shape, int which, const mj_sweep_space *sp) {
  uint32_t tmask = space_tmask(&b->sw->shapes[shape], sp);
  if (!tmask) return MOEJIT_OK;
  static const moejit_gemm_path paths[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                           MOEJIT_GEMM_PATH_GEMV};
  int idx[MJ_P_COUNT] = {0};
  for (size_t pi = 0; pi < MJ_ARRAY_LEN(paths); pi++) {
    const moejit_gemm_path path = paths[pi];
    if (!(sp->paths & MJ_PATH_BIT(path))) continue;
    for (;;) {
      mj_tune_cand c = {.shape = shape, .which = which, .path = path, .tmask = tmask};
      c.cfg = (moejit_gemm_cfg){
          .tile_m = sp->values[MJ_P_TILE_M][idx[MJ_P_TILE_M]],
          .tile_n = sp->values[MJ_P_TILE_N][idx[MJ_P_TILE_N]],
          .tile_k = sp->values[MJ_P_TILE_K][idx[MJ_P_TILE_K]],
          .stages = sp->values[MJ_P_STAGES][idx[MJ_P_STAGES]],
          .warps = sp->values[MJ_P_WARPS][idx[MJ_P_WARPS]],
          .cluster_m = sp->values[MJ_P_CLUSTER_M][idx[MJ_P_CLUSTER_M]],
          .cluster_n = sp->values[MJ_P_CLUSTER_N][idx[MJ_P_CLUSTER_N]],
          .raster = (moejit_raster)sp->values[MJ_P_RASTER][idx[MJ_P_RASTER]],
          .schedule = (moejit_gemm_schedule)sp->values[MJ_P_SCHEDULE][idx[MJ_P_SCHEDULE]]};
      moejit_status st = add_candidate(b, c, b->sw->divisible);
      if (st) return st;
      int p = MJ_P_COUNT - 1; /* odometer over the parameters, last fastest */
      while (p >= 0 && ++idx[p] == sp->n_values[p]) idx[p--] = 0;
      if (p < 0) break;
    }
  }
  return MOEJIT_OK;
}

/* The (path, tile) AUTO runs at `rows` rows, as an explicit candidate:
 * the GEMV kernel (with the spec's tile, which it ignores; the module is
 * the spec's own), the spec's tile on wgmma or mma, the narrow decode tile
 * on wgmma (its plan's tile with its k-stages as 64-wide stages: the same
 * launch), or the decode tile on mma. 0 for SIMT. */
static int heuristic_tile(const moejit_spec *base, int which, moejit_gemm_path want, int64_t rows,
                          const char *arch, moejit_gemm_cfg *cfg, moejit_gemm_path *path) {
  mj_gemm_plan plan;
  if (mj_gemm_plan_make_for(base, which, want, rows, arch, &plan) != MOEJIT_OK) {
    mj_clear_error();
    return 0;
  }
  moejit_spec scratch;
  const moejit_spec *ks = mj_gemm_kernel_spec(base, which, &plan, &scratch);
  *cfg = which == 1 ? ks->gemm1 : ks->gemm2;
  if (plan.use_gemv) {
    *path = MOEJIT_GEMM_PATH_GEMV;
    return 1;
  }
  if (plan.use_wgmma) {
    *path = MOEJIT_GEMM_PATH_WGMMA;
    if (strstr(plan.entry, "narrow")) {
      cfg->tile_m = plan.tile_m, cfg->tile_n = plan.tile_n, cfg->tile_k = 64;
      cfg->stages = plan.wg_stages, cfg->warps = 8, cfg->cluster_m = cfg->cluster_n = 1;
      cfg->schedule = MOEJIT_SCHEDULE_COOPERATIVE; /* the narrow tile's */
    }
    return 1;
  }
  *path = MOEJIT_GEMM_PATH_MMA;
  return plan.use_mma;
}

int mj_tune_heuristic_tile(const moejit_spec *base, int which, int64_t rows, const char *arch,
                           moejit_gemm_cfg *cfg, moejit_gemm_path *path) {
  return heuristic_tile(base, which, MOEJIT_GEMM_PATH_AUTO, rows, arch, cfg, path);
}

int mj_tune_layer_heuristic_tile(const moejit_spec *base, int which, int64_t tokens,
                                 const char *arch, moejit_gemm_cfg *cfg, moejit_gemm_path *path) {
  return heuristic_tile(base, which, mj_layer_heuristic_path(base, which, tokens),
                        tokens * base->top_k, arch, cfg, path);
}

/* Added before the spaces, so a space's config with the same launch plan
 * merges into these; never pruned (AUTO runs them anyway). Within the
 * decode layer's reach past AUTO's GEMV rows, also the GEMV kernel the
 * layer runs there without a table (mj_tune_layer_heuristic_tile), so that
 * add_winner can keep the decode form. */
static moejit_status add_heuristic_tiles(builder *b, int shape, int which) {
  const mj_sweep_shape *sh = &b->sw->shapes[shape];
  moejit_spec base;
  mj_tune_cand_spec(b->sw, shape, which, which == 1 ? &sh->spec.gemm1 : &sh->spec.gemm2, b->arch,
                    &base);
  for (int i = 0; i < 2 * sh->n_tokens; i++) {
    /* even i: AUTO's plan at token count i / 2; odd i: the layer's GEMV */
    const int t = i / 2;
    const int64_t tokens = sh->tokens[t];
    mj_tune_cand c = {.shape = shape, .which = which, .tmask = 1u << t, .heuristic = 1, .unit = -1};
    const int ok =
        i % 2 == 0 ? mj_tune_heuristic_tile(&base, which, tokens * sh->spec.top_k, b->arch, &c.cfg,
                                            &c.path)
                   : mj_tune_layer_heuristic_tile(&base, which, tokens, b->arch, &c.cfg, &c.path) &&
                         c.path == MOEJIT_GEMM_PATH_GEMV;
    if (!ok) continue;
    moejit_spec spec;
    mj_gemm_plan plan;
    mj_tune_cand_spec(b->sw, shape, which, &c.cfg, b->arch, &spec);
    if (mj_gemm_plan_make_for(&spec, which, c.path, 1024, b->arch, &plan) != MOEJIT_OK) {
      mj_clear_error();
      continue;
    }
    plan_key k = key_of(&plan, &c.cfg);
    int same = find_same(b, &c, &k);
    if (same >= 0) {
      b->plan->cands[same].tmask |= c.tmask;
      continue;
    }
    b->plan->enumerated++;
    moejit_status st = push(b, &c, &k);
    if (st) return st;
  }
  return MOEJIT_OK;
}

static unsigned shape_kernels(const moejit_sweep *sw, int shape) {
  unsigned m = 0;
  for (int i = 0; i < sw->n_spaces; i++)
    if (space_tmask(&sw->shapes[shape], &sw->spaces[i])) m |= sw->spaces[i].kernels;
  return m;
}

moejit_status mj_tune_plan_build(const moejit_sweep *sw, const char *arch, mj_tune_plan *plan) {
  memset(plan, 0, sizeof *plan);
  builder b = {sw, arch, plan, NULL, 0, NULL, 0, 0};
  moejit_status st = MOEJIT_OK;
  for (int s = 0; s < sw->n_shapes && !st; s++) {
    unsigned kernels = shape_kernels(sw, s);
    if (!kernels) { /* it would vanish from the plan without a word */
      st = mj_fail(MOEJIT_ERR_CONFIG,
                   "%s:%d:%d: shape '%s': no space times any of its token counts; HINT: give "
                   "a space its tokens, or the shape tokens some space times",
                   sw->origin, sw->shapes[s].line, sw->shapes[s].col, sw->shapes[s].name);
      break;
    }
    for (int which = 1; which <= 2 && !st; which++) {
      if (!(kernels & MJ_KERNEL_BIT(which))) continue;
      slots_clear(&b);
      st = add_heuristic_tiles(&b, s, which);
      for (int i = 0; i < sw->n_spaces && !st; i++)
        if (sw->spaces[i].kernels & MJ_KERNEL_BIT(which))
          st = enumerate_space(&b, s, which, &sw->spaces[i]);
    }
  }
  free(b.keys);
  free(b.slots);
  if (st) mj_tune_plan_free(plan);
  return st;
}

void mj_tune_plan_free(mj_tune_plan *plan) {
  if (!plan) return;
  free(plan->cands);
  memset(plan, 0, sizeof *plan);
}
