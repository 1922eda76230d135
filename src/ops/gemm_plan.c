/* Launch plans of the grouped GEMMs: entry, grid, block and shared memory,
 * derived from the spec exactly as templates/common/gemm_*.cuh derive them
 * (the kernels trap if they get less shared memory than they need). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/gemm.h"

/* The SIMT kernels loop over their outputs: more blocks only add launches. */
#define MJ_GEMM_SIMT_MAX_BLOCKS (1u << 20)

/* Whether AUTO takes the wgmma path on sm_90a when MOEJIT_GEMM_WGMMA is
 * unset: it passed the GPU tests on an H100 and, persistent, runs 1.2-1.8x
 * faster than mma.sync at large T; with the narrow tile it also wins decode
 * (H100, T = 1: qwen3-30b-a3b GEMM 1 24.6 us, GEMM 2 15.3 us; mixtral-8x7b
 * GEMM 2 102 us against 191 us on mma.sync's decode tile). */
#define MJ_GEMM_WGMMA_DEFAULT 1

/* mj_wg_shape (templates/common/gemm_wgmma.cuh): the dynamic shared memory
 * the pipeline may take (H100 opt-in limit less 1 KiB of static); the
 * work-item count under which the narrow entry (64 x 128, 8 stages of
 * 64-wide k-tiles) replaces the spec's tile under AUTO: two tiles per H100
 * SM (132); and the rows an active expert holds on average (max_rows /
 * min(E, max_rows)) up to which it replaces it too (fill_wgmma_plan). */
#define MJ_WG_SMEM_BUDGET (232448 - 1024)
/* kWgEpiWarpBytes: the epilogue staging buffer of one consumer warp (16
 * rows of 144 bytes) */
#define MJ_WG_EPI_WARP_BYTES (16 * 144)
/* mj_wg_group_slots: the group starts the scheduler keeps beside its tile
 * table */
#define MJ_WG_GROUP_SLOTS(experts) (2 * (experts) + 2)
#define MJ_WG_NARROW_CTAS 264
#define MJ_WG_NARROW_TM 64
#define MJ_WG_NARROW_TN 128
#define MJ_WG_NARROW_KTILES 8
#define MJ_WG_NARROW_EXPERT_ROWS 48
/* On other archs AUTO runs mma.sync on a 64-row decode tile under this many
 * rows (kDecodeTile below). */
#define MJ_MMA_DECODE_ROWS 64

void mj_gemm_warp_layout(int tile_m, int tile_n, int warps, int *wm_out, int *wn_out,
                         int *wk_out) {
  int best_m = 1, best_n = 1, best_k = warps, best_cost = 1 << 30;
  for (int wm = 1; wm <= warps; ++wm) {
    if (warps % wm != 0 || (tile_m / 16) % wm != 0) continue;
    for (int wn = 1; wn <= warps / wm; ++wn) {
      if ((warps / wm) % wn != 0 || (tile_n / 16) % wn != 0) continue;
      int wk = warps / (wm * wn), cost = wk * 100000 + tile_m / wm + tile_n / wn;
      if (cost < best_cost) best_cost = cost, best_m = wm, best_n = wn, best_k = wk;
    }
  }
  *wm_out = best_m, *wn_out = best_n, *wk_out = best_k;
}

const char *mj_gemm_mma_blocker(const moejit_spec *spec, int which) {
  const moejit_gemm_cfg *g = which == 1 ? &spec->gemm1 : &spec->gemm2;
  if (spec->act_dtype != spec->weight_dtype) return "activation and weight dtypes differ";
  if (spec->act_dtype != MOEJIT_DTYPE_BF16 && spec->act_dtype != MOEJIT_DTYPE_FP16)
    return "the tensor-core kernel takes fp16 or bf16 only";
  if (spec->hidden % 8 != 0 || spec->expert_width % 8 != 0)
    return "hidden and expert_width must be multiples of 8 (16-byte rows)";
  if (g->warps != 4 && g->warps != 8) return "the tensor-core kernel takes 4 or 8 warps";
  return NULL;
}

const char *mj_gemm_wgmma_blocker(const moejit_spec *spec, int which) {
  const moejit_gemm_cfg *g = which == 1 ? &spec->gemm1 : &spec->gemm2;
  if (spec->act_dtype != spec->weight_dtype) return "activation and weight dtypes differ";
  if (spec->act_dtype != MOEJIT_DTYPE_BF16 && spec->act_dtype != MOEJIT_DTYPE_FP16)
    return "the wgmma kernel takes fp16 or bf16 only";
  if (spec->hidden % 8 != 0 || spec->expert_width % 8 != 0)
    return "hidden and expert_width must be multiples of 8 (TMA rows are 16-byte multiples)";
  const int pp = g->schedule == MOEJIT_SCHEDULE_PINGPONG;
  int tm = g->tile_m < 64 ? 64 : g->tile_m, consumers = pp || tm >= 128 ? 2 : 1;
  if (pp && (tm / 64) * g->tile_n > 256)
    return "schedule pingpong keeps a whole tile per warpgroup: tile_m x tile_n must be at most "
           "16384 (e.g. 128x128 or 64x256)";
  if (!pp && (tm / consumers / 64) * g->tile_n > 256)
    return "tile_m 256 with tile_n 256 needs 256 accumulators per thread (at most 128)";
  if (g->tile_n % 32 != 0) return "tile_n must be a multiple of 32";
  return NULL;
}

const char *mj_gemm_gemv_blocker(const moejit_spec *spec, int which) {
  (void)which;
  if (spec->act_dtype != spec->weight_dtype) return "activation and weight dtypes differ";
  if (spec->act_dtype != MOEJIT_DTYPE_BF16 && spec->act_dtype != MOEJIT_DTYPE_FP16)
    return "the GEMV kernel takes fp16 or bf16 only";
  if (spec->hidden % 8 != 0 || spec->expert_width % 8 != 0)
    return "hidden and expert_width must be multiples of 8 (16-byte rows)";
  return NULL;
}

const char *mj_gemm_path_blocker(const moejit_spec *spec, int which, moejit_gemm_path path) {
  switch (path) {
    case MOEJIT_GEMM_PATH_MMA:
      return mj_gemm_mma_blocker(spec, which);
    case MOEJIT_GEMM_PATH_WGMMA:
      return mj_gemm_wgmma_blocker(spec, which);
    case MOEJIT_GEMM_PATH_GEMV:
      return mj_gemm_gemv_blocker(spec, which);
    default:
      return "the path is not mma, wgmma or gemv";
  }
}

int mj_gemm_gemv_enabled(void) {
  return mj_env_switch("MOEJIT_GEMM_GEMV", 1);
}

int mj_gemm_bucket_serves(const moejit_spec *spec, int which, int64_t bucket, moejit_gemm_path path,
                          int64_t tokens) {
  if (bucket == tokens || path == MOEJIT_GEMM_PATH_GEMV) return 1;
  /* where the layer's own choice is the GEMV kernel (within the decode
   * layer's reach) only a bucket of at most MOEJIT_GEMV_MAX_ROWS rows serves
   * another T: the tuner timed those against the GEMV kernel and keeps a
   * tile there only where it saves more than the decode layer; a larger one
   * there (e.g. a pin `moejit tune --check-layer` placed against the
   * six-launch chain) serves its own T */
  return bucket * spec->top_k <= MOEJIT_GEMV_MAX_ROWS ||
         mj_layer_heuristic_path(spec, which, tokens) != MOEJIT_GEMM_PATH_GEMV;
}

int mj_gemm_cfg_equal(const moejit_gemm_cfg *a, const moejit_gemm_cfg *b) {
  return a->tile_m == b->tile_m && a->tile_n == b->tile_n && a->tile_k == b->tile_k &&
         a->stages == b->stages && a->warps == b->warps && a->cluster_m == b->cluster_m &&
         a->cluster_n == b->cluster_n && a->raster == b->raster && a->schedule == b->schedule;
}

int mj_gemm_wgmma_enabled(void) {
  return mj_env_switch("MOEJIT_GEMM_WGMMA", MJ_GEMM_WGMMA_DEFAULT);
}

static int one_of(int v, const int *set, int n) {
  for (int i = 0; i < n; i++)
    if (v == set[i]) return 1;
  return 0;
}

/* The fields the plan computes with; the full rules run when the kernel is
 * generated (moejit_spec_validate). */
static moejit_status check_spec(const moejit_spec *spec, int which, const char *op) {
  static const int tm[] = {16, 32, 64, 128, 256}, tn[] = {32, 64, 128, 256}, tk[] = {32, 64, 128};
  static const int warps[] = {4, 8, 12};
  const moejit_gemm_cfg *g = which == 1 ? &spec->gemm1 : &spec->gemm2;
  if (!one_of(g->tile_m, tm, 5) || !one_of(g->tile_n, tn, 4) || !one_of(g->tile_k, tk, 3) ||
      !one_of(g->warps, warps, 3) || g->stages < 2 || g->stages > 8)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: spec kernels.gemm%d (tile %dx%dx%d, %d stages, %d warps) is out of range; "
                   "HINT: moejit_spec_validate says which field",
                   op, which, g->tile_m, g->tile_n, g->tile_k, g->stages, g->warps);
  if (spec->hidden < 1 || spec->hidden > INT32_MAX || spec->expert_width < 1 ||
      spec->expert_width > INT32_MAX || spec->experts < 1 ||
      spec->experts > 1024) /* the config's bound: the tile table's ints stay small */
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: spec shape d=%lld f=%lld E=%d is out of range; HINT: moejit_spec_validate "
                   "says which field",
                   op, (long long)spec->hidden, (long long)spec->expert_width, (int)spec->experts);
  if (moejit_dtype_size(spec->act_dtype) == 0 || moejit_dtype_size(spec->weight_dtype) == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: spec dtypes are out of range", op);
  return MOEJIT_OK;
}

static int is_sm90a(const char *arch) {
  return arch && strcmp(arch, "sm_90a") == 0;
}

/* *use_wgmma = 1 when the wgmma kernel runs; UNSUPPORTED when path WGMMA
 * cannot. AUTO takes it only on sm_90a, when enabled and possible. */
static moejit_status choose_wgmma(const moejit_spec *spec, int which, moejit_gemm_path path,
                                  int64_t max_rows, const char *arch, const char *op,
                                  int *use_wgmma) {
  const char *blocker = mj_gemm_wgmma_blocker(spec, which);
  *use_wgmma = 0;
  if (path == MOEJIT_GEMM_PATH_AUTO) {
    *use_wgmma = is_sm90a(arch) && mj_gemm_wgmma_enabled() && !blocker;
    return MOEJIT_OK;
  }
  if (path != MOEJIT_GEMM_PATH_WGMMA) return MOEJIT_OK;
  if (arch && !is_sm90a(arch))
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: the wgmma kernel needs an sm_90a device (this ctx compiles for %s); HINT: "
                   "use MOEJIT_GEMM_PATH_AUTO or MMA",
                   op, arch);
  if (blocker)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: the wgmma kernel cannot run this spec: %s; HINT: use "
                   "MOEJIT_GEMM_PATH_AUTO or MMA",
                   op, blocker);
  *use_wgmma = 1;
  return MOEJIT_OK;
}

/* *use_gemv = 1 when the GEMV kernel runs: asked for (UNSUPPORTED when it
 * cannot), or AUTO at MOEJIT_GEMV_MAX_ROWS rows or fewer, where no expert
 * can have more rows than one pass takes. */
static moejit_status choose_gemv(const moejit_spec *spec, int which, moejit_gemm_path path,
                                 int64_t max_rows, const char *op, int *use_gemv) {
  const char *blocker = mj_gemm_gemv_blocker(spec, which);
  *use_gemv = 0;
  if (path == MOEJIT_GEMM_PATH_AUTO) {
    *use_gemv = !blocker && max_rows <= MOEJIT_GEMV_MAX_ROWS && mj_gemm_gemv_enabled();
    return MOEJIT_OK;
  }
  if (path != MOEJIT_GEMM_PATH_GEMV) return MOEJIT_OK;
  if (blocker)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s: the GEMV kernel cannot run this spec: %s; HINT: use "
                   "MOEJIT_GEMM_PATH_AUTO",
                   op, blocker);
  *use_gemv = 1;
  return MOEJIT_OK;
}

/* The GEMV plan: work units of (active expert, MJ_GEMV1_COLS h columns or
 * MJ_GEMV2_COLS y columns), one warp each; the grid is enough blocks for
 * every unit max_rows could make (at most min(E, max_rows) experts have
 * rows), which the launcher caps at MJ_GEMV_BLOCKS_PER_SM per SM. */
static int64_t fill_gemv_plan(const moejit_spec *spec, int which, int64_t max_rows,
                              mj_gemm_plan *p) {
  const int cols = which == 1 ? MJ_GEMV1_COLS : MJ_GEMV2_COLS;
  const int64_t active = max_rows < spec->experts ? max_rows : spec->experts;
  const int64_t units = active * ((p->n_out + cols - 1) / cols);
  p->entry = which == 1 ? MJ_ENTRY_GEMV1 : MJ_ENTRY_GEMV2;
  p->use_gemv = 1;
  p->tile_m = MOEJIT_GEMV_PASS_ROWS, p->tile_n = which == 1 ? 2 * cols : cols;
  p->n_tiles = (p->n_out + cols - 1) / cols;
  p->threads = MJ_GEMV_WARPS * 32u;
  p->warps_m = p->warps_n = p->warps_k = 1;
  p->smem_bytes = 0;
  return (units + MJ_GEMV_WARPS - 1) / MJ_GEMV_WARPS;
}

static moejit_status choose_path(const moejit_spec *spec, int which, moejit_gemm_path path,
                                 const char *op, int *use_mma) {
  const char *blocker = mj_gemm_mma_blocker(spec, which);
  const moejit_gemm_cfg *g = which == 1 ? &spec->gemm1 : &spec->gemm2;
  *use_mma = 0;
  if (path == MOEJIT_GEMM_PATH_SIMT) return MOEJIT_OK;
  if (path != MOEJIT_GEMM_PATH_AUTO && path != MOEJIT_GEMM_PATH_MMA)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: path %d is not a moejit_gemm_path", op,
                   (int)path);
  /* AUTO falls back to SIMT only where the dtypes or shape leave no choice:
   * a 12-warp tile on bf16 would silently run ~100x slower. */
  if (!blocker) return *use_mma = 1, MOEJIT_OK;
  if (path == MOEJIT_GEMM_PATH_AUTO && g->warps != 12) return MOEJIT_OK;
  return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                 "%s: the tensor-core kernel cannot run this spec: %s; HINT: set "
                 "kernels.gemm%d.warps to 4 or 8, or ask for MOEJIT_GEMM_PATH_SIMT",
                 op, blocker, which);
}

/* The dynamic shared memory of an mma.sync tile with warps_k warps along K
 * (templates/common/gemm_config.cuh): its pipeline stages of 16-bit A and B
 * tiles, or the fp32 partial sums the K-warps reduce, whichever is more. */
static int64_t mma_smem(const moejit_gemm_cfg *g, int warps_k) {
  int64_t pipe = (int64_t)g->stages * (g->tile_m + g->tile_n) * g->tile_k * 2;
  int64_t reduce = (int64_t)(warps_k - 1) * g->tile_m * g->tile_n * 4;
  return pipe > reduce ? pipe : reduce;
}

/* *g with fewer stages (down to 2), then a shorter tile_k (down to 32, each
 * time with as many stages as keep the tile's k-depth in flight, at most 8,
 * and down again), until it needs at most `budget` bytes; 0 (and *g as it
 * was) where even 2 stages of 32 do not fit. The tile's M and N, warps and
 * schedule stay: the output the kernel writes per tile is the same. */
static int mma_fit(moejit_gemm_cfg *g, int warps_k, int64_t budget) {
  moejit_gemm_cfg f = *g;
  const int depth = f.stages * f.tile_k;
  while (mma_smem(&f, warps_k) > budget) {
    if (f.stages > 2) {
      f.stages--;
    } else if (f.tile_k > 32) {
      f.tile_k /= 2;
      f.stages = depth / f.tile_k > 8 ? 8 : depth / f.tile_k;
    } else {
      return 0;
    }
  }
  *g = f;
  return 1;
}

/* budget: the bytes a block may have (0: unknown, no fitting) */
static void fill_mma_plan(const moejit_spec *spec, const moejit_gemm_cfg *g, int64_t max_rows,
                          int64_t budget, mj_gemm_plan *p) {
  mj_gemm_warp_layout(g->tile_m, g->tile_n, g->warps, &p->warps_m, &p->warps_n, &p->warps_k);
  p->cfg = *g;
  if (budget > 0 && mma_smem(g, p->warps_k) > budget)
    p->fitted = mma_fit(&p->cfg, p->warps_k, budget);
  p->smem_bytes = (unsigned)mma_smem(&p->cfg, p->warps_k);
  p->m_slots = (int)(max_rows / g->tile_m + spec->experts);
}

/* mj_wg_stages: stages * tile_k in 64-wide k-tiles, 2..16, within budget
 * beside the tile table (mj_wg_table_bytes: int [E + 1] and the group
 * starts, 16-byte rounded). */
static int wg_table_bytes(int experts) {
  return ((experts + 1 + MJ_WG_GROUP_SLOTS(experts)) * 4 + 15) / 16 * 16;
}

static int wg_stages(int want, int stage_bytes, int extra) {
  int s = want < 2 ? 2 : (want > 16 ? 16 : want);
  while (s > 2 && 1024 + s * (stage_bytes + 16) + extra > MJ_WG_SMEM_BUDGET) --s;
  return s;
}

/* The wgmma plan: mj_wg_shape of the spec's tile, or, under AUTO, of the
 * narrow 64 x 128 x 64, 8-stage tile where the spec's tile would leave SMs
 * idle or where the experts hold few rows (48 or fewer on average: most
 * then fit one 64-row tile, so the weights are read once as with taller
 * tiles, over twice the CTAs or more). An explicit WGMMA path keeps the
 * spec's tile, so a tuned table or the autotuner gets exactly the tile it
 * names. Measured on an H100 over eleven model shapes (docs/gemm.md, "The
 * narrow tile at few rows an expert"): at 48 rows an expert or fewer the
 * narrow tile was within 1.05x of the fastest of 20 tiles at every point,
 * 2-3% faster than 128x256 on the geometric mean; at 64 rows it lost by up
 * to 1.34x. */
static void fill_wgmma_plan(const moejit_spec *spec, int which, const moejit_gemm_cfg *g,
                            moejit_gemm_path path, int64_t max_rows, mj_gemm_plan *p) {
  int tm = g->tile_m < 64 ? 64 : g->tile_m, tn = g->tile_n, want = g->stages * g->tile_k / 64;
  int64_t active = max_rows < spec->experts ? max_rows : spec->experts;
  int64_t ctas = (max_rows / tm + active) * mj_gemm_n_tiles(which, p->n_out, tn);
  const int few_rows = max_rows <= MJ_WG_NARROW_EXPERT_ROWS * active;
  /* tests: $MOEJIT_GEMM_WGMMA_NARROW "0" never, "1" always */
  int narrow =
      mj_env_switch("MOEJIT_GEMM_WGMMA_NARROW",
                    path == MOEJIT_GEMM_PATH_AUTO && (ctas < MJ_WG_NARROW_CTAS || few_rows) &&
                        (tm != MJ_WG_NARROW_TM || tn != MJ_WG_NARROW_TN));
  if (narrow) tm = MJ_WG_NARROW_TM, tn = MJ_WG_NARROW_TN, want = MJ_WG_NARROW_KTILES;
  p->entry = which == 1 ? (narrow ? "moejit_gemm1_swiglu_wgmma_narrow" : "moejit_gemm1_swiglu_wgmma")
                        : (narrow ? "moejit_gemm2_wgmma_narrow" : "moejit_gemm2_wgmma");
  /* the narrow decode tile is cooperative (one consumer warpgroup) */
  const int pp = !narrow && g->schedule == MOEJIT_SCHEDULE_PINGPONG;
  int consumers = pp || tm >= 128 ? 2 : 1, stage_bytes = (tm + tn) * 128;
  p->use_wgmma = 1;
  p->wg_narrow = narrow;
  p->tile_m = tm, p->tile_n = tn;
  p->threads = 128u * (unsigned)(1 + consumers);
  p->warps_m = pp ? 1 : consumers, p->warps_n = 1, p->warps_k = 1;
  p->wg_pingpong = pp;
  /* the tile table, after (ping-pong) the two order mbarriers, and (GEMM 2)
   * each consumer warp's epilogue staging buffer (kWgEpiWarpBytes) */
  const int table = wg_table_bytes(spec->experts) + (pp ? 16 : 0);
  const int epi = which == 2 ? consumers * 4 * MJ_WG_EPI_WARP_BYTES : 0;
  p->wg_stages = wg_stages(want, stage_bytes, epi + table);
  p->smem_bytes = (unsigned)(1024 + p->wg_stages * (stage_bytes + 16) + epi + table);
  /* cluster_m 2: CTA pairs along M; each loads half of the weight tile (for
   * GEMM 1 the gate or the up box) and multicasts it to both. cluster_n 2:
   * CTA pairs along N on one M-tile; each loads every other A box and
   * multicasts it to both (the spec check allows one of the two) */
  const int pair_m = !narrow && g->cluster_m == 2, pair_n = !narrow && !pair_m && g->cluster_n == 2;
  p->wg_cluster = pair_m || pair_n ? 2 : 1;
  p->wg_cluster_n = pair_n;
  /* cooperative 256-row tiles load A in 64-row boxes, only those holding
   * rows of the tile's expert (mj_wg_shape::kBoxA); pairs along N load
   * halves of the other tiles' A */
  p->wg_box_a_rows = !pp && tm == 256 ? 64 : (pair_n ? tm / 2 : tm);
  p->wg_box_w_rows = which == 1 || pair_m ? tn / 2 : tn;
  p->w_rows = (int64_t)spec->experts * (which == 1 ? 2 * spec->expert_width : spec->hidden);
  p->n_tiles = (int)mj_gemm_n_tiles(which, p->n_out, tn);
  p->m_slots = (int)(max_rows / tm + spec->experts);
}

moejit_status mj_gemm_plan_make(const moejit_spec *spec, int which, moejit_gemm_path path,
                                int64_t max_rows, mj_gemm_plan *p) {
  return mj_gemm_plan_make_for(spec, which, path, max_rows, NULL, p);
}

static moejit_status plan_make(const moejit_spec *spec, int which, moejit_gemm_path path,
                               int64_t max_rows, const char *arch, mj_gemm_plan *p) {
  const char *op = which == 1 ? "moejit_gemm1_swiglu" : "moejit_gemm2";
  moejit_status st = check_spec(spec, which, op);
  if (st) return st;
  const moejit_gemm_cfg *g = which == 1 ? &spec->gemm1 : &spec->gemm2;
  *p = (mj_gemm_plan){0};
  int use_wgmma = 0, use_gemv = 0;
  if ((st = choose_gemv(spec, which, path, max_rows, op, &use_gemv))) return st;
  if (!use_gemv && (st = choose_wgmma(spec, which, path, max_rows, arch, op, &use_wgmma)))
    return st;
  if (!use_gemv && !use_wgmma && (st = choose_path(spec, which, path, op, &p->use_mma)))
    return st;
  p->family = which == 1 ? "gemm1" : "gemm2";
  p->tile_m = g->tile_m, p->tile_n = g->tile_n;
  p->n_out = (int)(which == 1 ? spec->expert_width : spec->hidden);
  p->k = (int)(which == 1 ? spec->hidden : spec->expert_width);
  p->threads = (unsigned)g->warps * 32u;
  p->n_tiles = (int)mj_gemm_n_tiles(which, p->n_out, g->tile_n);
  int64_t blocks;
  if (use_gemv) {
    blocks = fill_gemv_plan(spec, which, max_rows, p);
  } else if (use_wgmma) {
    fill_wgmma_plan(spec, which, g, path, max_rows, p);
    blocks = (int64_t)p->m_slots * p->n_tiles;
  } else if (p->use_mma) {
    p->entry = which == 1 ? "moejit_gemm1_swiglu_mma" : "moejit_gemm2_mma";
    const int budget = mj_arch_smem_optin(arch);
    fill_mma_plan(spec, g, max_rows, path == MOEJIT_GEMM_PATH_AUTO ? budget : 0, p);
    if (budget > 0 && p->smem_bytes > (unsigned)budget)
      return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                     "%s: the %dx%dx%d tile with %d stages needs %u bytes of shared memory a "
                     "block, and %s allows %d; HINT: %s",
                     op, g->tile_m, g->tile_n, g->tile_k, g->stages, p->smem_bytes, arch, budget,
                     path == MOEJIT_GEMM_PATH_AUTO
                         ? "use a smaller tile_m or tile_n"
                         : "give the tile fewer stages or a shorter tile_k, or ask for "
                           "MOEJIT_GEMM_PATH_AUTO, which fits the tile to the arch");
    blocks = (int64_t)p->m_slots * p->n_tiles;
  } else {
    p->entry = which == 1 ? "moejit_gemm1_swiglu_simt" : "moejit_gemm2_simt";
    p->warps_m = p->warps_n = p->warps_k = 1;
    blocks = (max_rows * p->n_out + p->threads - 1) / p->threads;
    if (blocks > MJ_GEMM_SIMT_MAX_BLOCKS) blocks = MJ_GEMM_SIMT_MAX_BLOCKS;
  }
  if (blocks < 1 || blocks > INT32_MAX)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: max_rows %lld needs %lld blocks, more than a grid holds (%d); HINT: split "
                   "the rows over several calls",
                   op, (long long)max_rows, (long long)blocks, INT32_MAX);
  p->grid = (unsigned)blocks;
  return MOEJIT_OK;
}

/* Decode launches (fewer than MJ_MMA_DECODE_ROWS rows) on mma.sync stream weights: a
 * 64-row tile holds fewer idle rows and takes less shared memory per stage,
 * so more CTAs stream at once. Measured on an H100 through the whole layer
 * (qwen3-30b-a3b, T = 1): 0.069 ms with 64x256 / 64x128 tiles against 0.092
 * ms with the 128x256 tiles that win at large T. */
static const moejit_gemm_cfg kDecodeTile[2] = {
    {.tile_m = 64, .tile_n = 256, .tile_k = 64, .stages = 4, .warps = 8},
    {.tile_m = 64, .tile_n = 128, .tile_k = 64, .stages = 4, .warps = 8}};

/* *d = spec with GEMM `which` on the decode tile; returns 1 when that
 * changed the tile (0: the spec has it already). */
static int with_decode_tile(const moejit_spec *spec, int which, moejit_spec *d) {
  const moejit_gemm_cfg *want = &kDecodeTile[which - 1];
  *d = *spec;
  moejit_gemm_cfg *g = which == 1 ? &d->gemm1 : &d->gemm2;
  const int same = g->tile_m == want->tile_m && g->tile_n == want->tile_n &&
                   g->tile_k == want->tile_k && g->stages == want->stages &&
                   g->warps == want->warps;
  g->tile_m = want->tile_m, g->tile_n = want->tile_n, g->tile_k = want->tile_k;
  g->stages = want->stages, g->warps = want->warps;
  return !same;
}

/* with_decode_tile, and the result is a valid spec the mma kernel takes (not
 * so for fp32 weights, whose 4 stages would not fit). */
static int decode_spec(const moejit_spec *spec, int which, moejit_spec *d) {
  return with_decode_tile(spec, which, d) && moejit_spec_validate(d) == MOEJIT_OK &&
         !mj_gemm_mma_blocker(d, which);
}

moejit_status mj_gemm_plan_make_for(const moejit_spec *spec, int which, moejit_gemm_path path,
                                    int64_t max_rows, const char *arch, mj_gemm_plan *p) {
  moejit_status st = plan_make(spec, which, path, max_rows, arch, p);
  if (st || !p->use_mma || path != MOEJIT_GEMM_PATH_AUTO || max_rows >= MJ_MMA_DECODE_ROWS)
    return st;
  moejit_spec d;
  if (!decode_spec(spec, which, &d)) return MOEJIT_OK;
  mj_gemm_plan decode;
  if (plan_make(&d, which, path, max_rows, arch, &decode) != MOEJIT_OK || !decode.use_mma)
    return MOEJIT_OK; /* keep the spec's own tile */
  *p = decode;
  p->decode = 1;
  return MOEJIT_OK;
}

const moejit_spec *mj_gemm_kernel_spec(const moejit_spec *spec, int which,
                                       const mj_gemm_plan *plan, moejit_spec *scratch) {
  if (!plan->decode && !plan->fitted) return spec;
  *scratch = *spec;
  *(which == 1 ? &scratch->gemm1 : &scratch->gemm2) = plan->cfg;
  return scratch;
}

const char *moejit_gemm_path_name(int p) {
  switch ((moejit_gemm_path)p) {
    case MOEJIT_GEMM_PATH_AUTO:
      return "auto";
    case MOEJIT_GEMM_PATH_MMA:
      return "mma";
    case MOEJIT_GEMM_PATH_SIMT:
      return "simt";
    case MOEJIT_GEMM_PATH_WGMMA:
      return "wgmma";
    case MOEJIT_GEMM_PATH_GEMV:
      return "gemv";
  }
  return "?";
}
