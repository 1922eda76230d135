/* Internal face of the grouped GEMMs: the launch plan the host derives from
 * a spec, mirroring templates/common/gemm_config.cuh (warp layout, shared
 * memory) and gemm_tiles.cuh (M-tile slots). Public calls: moejit/gemm.h. */
#ifndef MOEJIT_SRC_OPS_GEMM_H
#define MOEJIT_SRC_OPS_GEMM_H

#include "moejit/gemm.h"
#include "moejit/layer.h"

typedef struct mj_gemm_plan {
  const char *family;     /* "gemm1" or "gemm2" */
  const char *entry;      /* extern "C" name in the template */
  int use_mma;            /* 1: mma.sync entry; 0: SIMT entry, or wgmma (use_wgmma) */
  int tile_m, tile_n;     /* CTA tile (tile_n counts B rows: gate + up for gemm1) */
  int n_out;              /* output columns: f (gemm1) or d (gemm2) */
  int k;                  /* reduction length: d (gemm1) or f (gemm2) */
  int n_tiles;            /* ceil(n_out / output columns per tile) */
  int m_slots;            /* floor(max_rows / tile_m) + E */
  int warps_m, warps_n, warps_k;
  unsigned grid, threads; /* 1-D grid and block */
  unsigned smem_bytes;    /* dynamic shared memory */
  /* wgmma path (templates/common/gemm_wgmma.cuh, mj_wg_shape): */
  int use_wgmma;          /* 1: the entry takes two TMA maps (A, W) first */
  int wg_box_a_rows;      /* TMA box of A: 64 k-elements x this many rows */
  int wg_box_w_rows;      /* TMA box of W (gemm1: half the B tile, gate or up) */
  int wg_stages;          /* pipeline depth the kernel derives */
  int wg_cluster;         /* CTAs per cluster (1, or 2: a pair sharing tiles by multicast) */
  int wg_cluster_n;       /* 1: the pair lies along N (A tiles shared); 0: along M
                             (weight tiles shared), or no cluster */
  int wg_pingpong;        /* 1: two consumer warpgroups alternate whole tiles */
  int wg_narrow;          /* 1: the narrow 64 x 128 decode tile, not the spec's */
  int64_t w_rows;         /* rows of the W tensor map: E * 2f (gemm1) or E * d */
  int use_gemv;           /* 1: the weight-streaming decode entry (persistent grid:
                             the launcher caps `grid` at MJ_GEMV_BLOCKS_PER_SM per SM) */
  int decode;             /* 1: a decode launch on mma.sync with the 64-row decode tile
                             instead of the spec's */
  int fitted;             /* 1: mma.sync under AUTO with fewer stages or a shorter
                             tile_k than the tile asks, to fit the arch's shared
                             memory (mj_arch_smem_optin) */
  moejit_gemm_cfg cfg;    /* mma.sync: the tile the kernel is built with (the
                             spec's, the decode tile, either fitted); where decode
                             or fitted is set, build it from mj_gemm_kernel_spec */
} mj_gemm_plan;

/* 1 when GEMM 1 with this plan and these args keeps its CTAs' rounds of
 * tiles in step (moejit_gemm_args.round_sync; docs/gemm.md "Rounds in
 * step"): args->round_sync given, the wgmma kernel on the spec's tile,
 * cooperative (not ping-pong), no clusters, A read in row order (not
 * gathering), tile_m >= 128 and max_rows >= tile_m * experts (a tile's
 * rows an expert on average, so about half the experts or more have two
 * M-tiles or more: CTAs share weight tiles). Where the tiles stream
 * weights (64 rows, or fewer rows than a tile an expert) the barrier
 * measured slower. $MOEJIT_GEMM_ROUND_SYNC=0 turns it off, =1 on wherever the
 * kernel can (any tile_m and row count: tests). */
int mj_gemm1_rounds_in_step(const moejit_spec *spec, const moejit_gemm_args *args,
                            const mj_gemm_plan *plan);

/* GEMM 2's last round split along K (moejit_gemm_args.split; docs/gemm.md
 * "The last round split"): parts keep at least this many 64-wide k-tiles
 * (templates/common/gemm_wgmma.cuh kWgKSplitMinKTiles). */
#define MJ_WG_KSPLIT_MIN_KTILES 32
/* The scratch a launch of `plan` on a device of `sms` SMs uses for its K
 * parts: *bytes in all, the first *zero_bytes of them counters that start
 * and end each launch at zero; both 0 where the kernel never splits along
 * K (not GEMM 2's wgmma kernel on a cooperative tile of 128 or more rows
 * without clusters, or K under 2 * 32 k-tiles: 4096). */
void mj_gemm2_split_layout(const mj_gemm_plan *plan, int sms, size_t *bytes, size_t *zero_bytes);
/* How warps split a tile_m x tile_n tile (templates/common/gemm_config.cuh,
 * mj_gemm_warp_layout: fewest k-splits, then the squarest warp tile). */
void mj_gemm_warp_layout(int tile_m, int tile_n, int warps, int *wm, int *wn, int *wk);

/* Why the tensor-core kernel cannot run `which` (1 or 2) of spec, or NULL
 * when it can. */
const char *mj_gemm_mma_blocker(const moejit_spec *spec, int which);

/* Why the GEMV (decode) kernel cannot run `which` of spec, or NULL. */
const char *mj_gemm_gemv_blocker(const moejit_spec *spec, int which);

/* Why the kernel of an explicit `path` (MMA, WGMMA or GEMV) cannot run
 * `which` of spec, or NULL; AUTO and SIMT, which name no one kernel, get a
 * reason too. One switch for the tuner and the tuned tables. */
const char *mj_gemm_path_blocker(const moejit_spec *spec, int which, moejit_gemm_path path);

/* 1 when AUTO may pick the GEMV path (max_rows <= MOEJIT_GEMV_MAX_ROWS):
 * MOEJIT_GEMM_GEMV=0 in the environment turns it off. */
int mj_gemm_gemv_enabled(void);

/* Whether a tuned bucket of `bucket` tokens, run on `path`, may serve
 * `tokens` (any other T than its own): not within the decode layer's reach
 * (mj_decode_reach: T <= 8, T * k <= 64), where the layer's choice without
 * a bucket is the GEMV kernel (mj_gemm_choose) and the layer runs its
 * two-launch decode form, unless the bucket is a GEMV one or of at most
 * MOEJIT_GEMV_MAX_ROWS rows (timed against the GEMV kernel when it was
 * tuned). A table tuned without T = 1 would otherwise hand T = 1 the tiles
 * of its T = 32 bucket.
 * Model loads and moejit_tuned_choice both ask it. */
int mj_gemm_bucket_serves(const moejit_spec *spec, int which, int64_t bucket, moejit_gemm_path path,
                          int64_t tokens);

/* templates/common/gemm_gemv.cuh: warps per block, output columns per warp
 * work unit (GEMM 1: h columns, so twice as many W1 rows; GEMM 2: y
 * columns), resident blocks per SM the launcher sizes the grid for
 * (kGemvWarps, kGemv1Cols, kGemv2Cols, kGemvBlocksPerSm). */
#define MJ_GEMV_WARPS 8
#define MJ_GEMV1_COLS 2
#define MJ_GEMV2_COLS 4
#define MJ_GEMV_BLOCKS_PER_SM 2
/* The GEMV path's entries (fill_gemv_plan, gemm_plan.c). */
#define MJ_ENTRY_GEMV1 "moejit_gemm1_swiglu_gemv"
#define MJ_ENTRY_GEMV2 "moejit_gemm2_gemv"
/* Entries beside the plan's own in the GEMM modules: the decode layer's two
 * launches (layer.c) and GEMM 1 gathering its rows (gemm_launch.c); the
 * load resolves them with the plans that use them (model.c). */
#define MJ_ENTRY_DECODE1 "moejit_layer_decode_gemm1"
#define MJ_ENTRY_DECODE2 "moejit_layer_decode_gemm2"
/* The decode layer's wide pair, past MOEJIT_GEMV_PASS_ROWS entries (up to
 * MJ_DECODE_WIDE_ENTRIES: templates/common/gemm_gemv.cuh
 * kDecodeWideEntries), and its _wide64 pair past those (up to
 * MOEJIT_DECODE_MAX_ENTRIES: kDecodeWide64Entries; MOEJIT_DECODE_MAX_TOKENS
 * is its kDecodeMaxTokens). */
#define MJ_DECODE_WIDE_ENTRIES 32
#define MJ_ENTRY_DECODE1_WIDE "moejit_layer_decode_gemm1_wide"
#define MJ_ENTRY_DECODE2_WIDE "moejit_layer_decode_gemm2_wide"
#define MJ_ENTRY_DECODE1_WIDE64 "moejit_layer_decode_gemm1_wide64"
#define MJ_ENTRY_DECODE2_WIDE64 "moejit_layer_decode_gemm2_wide64"
#define MJ_ENTRY_GEMM1_GATHER "moejit_gemm1_swiglu_wgmma_gather"
#define MJ_ENTRY_GEMM1_NARROW_GATHER "moejit_gemm1_swiglu_wgmma_narrow_gather"

/* The entry GEMM 1 with `plan` runs when it gathers its rows (args.a_index):
 * the spec tile's or the narrow tile's gathering twin, or NULL where none
 * can (not the wgmma kernel, or CTA pairs along N, which share A by TMA
 * multicast). */
static inline const char *mj_gemm1_gather_entry(const mj_gemm_plan *plan) {
  if (!plan->use_wgmma || plan->wg_cluster_n) return NULL;
  return plan->wg_narrow ? MJ_ENTRY_GEMM1_NARROW_GATHER : MJ_ENTRY_GEMM1_GATHER;
}

/* The decode layer's GEMM 1 units (templates/gemm1.cu kDecode1Cols: h
 * columns); its GEMM 2 units are MJ_GEMV2_COLS columns. */
#define MJ_DECODE1_COLS 1
/* The most tokens within the decode layer's reach (moejit_moe_decode_layer:
 * at most MOEJIT_DECODE_MAX_TOKENS and MOEJIT_DECODE_MAX_ENTRIES entries;
 * its kernels take top_k <= MOEJIT_GEMV_PASS_ROWS), 0 for none; and whether
 * `tokens` tokens are within it. */
static inline int64_t mj_decode_max_tokens(const moejit_spec *spec) {
  if (spec->top_k < 1 || spec->top_k > MOEJIT_GEMV_PASS_ROWS) return 0;
  const int64_t t = MOEJIT_DECODE_MAX_ENTRIES / spec->top_k;
  return t < MOEJIT_DECODE_MAX_TOKENS ? t : MOEJIT_DECODE_MAX_TOKENS;
}
static inline int mj_decode_reach(const moejit_spec *spec, int64_t tokens) {
  return tokens >= 1 && tokens <= mj_decode_max_tokens(spec);
}
/* The pair of entries a T within the reach takes: 0 the first (up to
 * MOEJIT_GEMV_PASS_ROWS entries), 1 the wide (up to MJ_DECODE_WIDE_ENTRIES),
 * 2 the _wide64; and the entry of GEMM `which` (1 or 2) of pair `pair`. */
static inline int mj_decode_pair(const moejit_spec *spec, int64_t tokens) {
  const int64_t entries = tokens * spec->top_k;
  return entries <= MOEJIT_GEMV_PASS_ROWS ? 0 : entries <= MJ_DECODE_WIDE_ENTRIES ? 1 : 2;
}
static inline const char *mj_decode_entry(int which, int pair) {
  static const char *const entries[2][3] = {
      {MJ_ENTRY_DECODE1, MJ_ENTRY_DECODE1_WIDE, MJ_ENTRY_DECODE1_WIDE64},
      {MJ_ENTRY_DECODE2, MJ_ENTRY_DECODE2_WIDE, MJ_ENTRY_DECODE2_WIDE64}};
  return entries[which == 1 ? 0 : 1][pair < 0 ? 0 : pair > 2 ? 2 : pair];
}

/* The path of the layer's choice at `tokens` where no tuned bucket serves
 * (gemm_choice.c): the GEMV kernel within the decode layer's reach where it
 * runs, else AUTO. (The tuner's heuristic row stays AUTO: docs/tune.md.) */
moejit_gemm_path mj_layer_heuristic_path(const moejit_spec *spec, int which, int64_t tokens);

/* Resident blocks an SM of the decode layer's GEMM 2 launch
 * (templates/common/gemm_gemv.cuh kDecode2BlocksPerSm): for the first pair
 * of entries, 4 where an expert holds one row at most
 * (MOEJIT_GEMV_PASS_ROWS / top_k tokens <= 1; its k picks are distinct
 * experts) and the units number at most 4096, MJ_GEMV_BLOCKS_PER_SM
 * otherwise and for the wide pairs (pair > 0). */
static inline int mj_decode2_blocks_per_sm(int top_k, int64_t hidden, int pair) {
  const int one_row = pair == 0 && top_k > 0 && MOEJIT_GEMV_PASS_ROWS / top_k <= 1;
  return one_row && hidden / MJ_GEMV2_COLS * MOEJIT_GEMV_PASS_ROWS <= 4096 ? 4
                                                                           : MJ_GEMV_BLOCKS_PER_SM;
}

/* The most column groups a block of the decode layer's GEMM 2 combines
 * (templates/gemm2.cu kDecode2MaxGroups): its grid gives no block more. */
#define MJ_DECODE2_MAX_GROUPS 32

/* Why the wgmma kernel cannot run `which` of spec (any arch), or NULL. */
const char *mj_gemm_wgmma_blocker(const moejit_spec *spec, int which);

/* 1 when AUTO should pick the wgmma path on sm_90a: MOEJIT_GEMM_WGMMA=1/0
 * in the environment, else the built-in default (MJ_GEMM_WGMMA_DEFAULT in
 * gemm_plan.c). */
int mj_gemm_wgmma_enabled(void);

/* 1 when a and b name the same GEMM configuration (every field). */
int mj_gemm_cfg_equal(const moejit_gemm_cfg *a, const moejit_gemm_cfg *b);

/* The launch plan of GEMM `which` (1 or 2) for max_rows rows (>= 1) and the
 * requested path. INVALID_ARGUMENT for a spec whose gemm fields, shape or
 * dtypes are out of range, or a grid too large; UNSUPPORTED for path MMA
 * (or AUTO with 12 warps) where the tensor-core kernel cannot run. Same as
 * mj_gemm_plan_make_for with an unknown arch (AUTO never picks wgmma). */
moejit_status mj_gemm_plan_make(const moejit_spec *spec, int which, moejit_gemm_path path,
                                int64_t max_rows, mj_gemm_plan *out);

/* The plan for a ctx of arch `arch` ("sm_90a"; NULL: unknown): AUTO picks
 * wgmma on sm_90a when mj_gemm_wgmma_enabled() and the spec allows it;
 * path WGMMA on a known arch other than sm_90a, or a spec it cannot run, is
 * UNSUPPORTED. On mma.sync, AUTO fits a tile whose stages need more shared
 * memory than the arch allows a block (mj_arch_smem_optin) with fewer
 * stages, then a shorter tile_k (plan->fitted); path MMA runs the tile as
 * given, and such a tile is UNSUPPORTED there. */
moejit_status mj_gemm_plan_make_for(const moejit_spec *spec, int which, moejit_gemm_path path,
                                    int64_t max_rows, const char *arch, mj_gemm_plan *out);

/* The spec whose kernel runs `plan`: spec itself, or (plan->decode or
 * plan->fitted) a copy in *scratch with GEMM `which` on plan->cfg: the
 * decode tile (64x256x64 for GEMM 1, 64x128x64 for GEMM 2, 4 stages, 8
 * warps), which AUTO takes on mma.sync for fewer than 64 rows, and/or the
 * tile fitted to the arch's shared memory. */
const moejit_spec *mj_gemm_kernel_spec(const moejit_spec *spec, int which,
                                       const mj_gemm_plan *plan, moejit_spec *scratch);

#endif
