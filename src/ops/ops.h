/* Internal face of the ops layer: the model object, the launch shapes the
 * host shares with templates/ (align's chunk size, the row tiling of align's
 * copy and of combine) and the argument checks every launcher runs first.
 * The public calls live in include/moejit/ops.h. */
#ifndef MOEJIT_SRC_OPS_H
#define MOEJIT_SRC_OPS_H

#include "moejit/moejit.h"
#include "moejit/ops.h"
#include "moejit/layer.h"
#include "codegen/codegen.h"
#include "ops/gemm.h"
#include "runtime/runtime.h"
#include "tune/tuned_table.h"

/* Kernel families a model can hold (bit mask). */
enum {
  MJ_OPS_ROUTE = 1u << 0,
  MJ_OPS_ALIGN = 1u << 1,
  MJ_OPS_COMBINE = 1u << 2,
  /* What moejit_model_load loads (the memory-bound stages). */
  MJ_OPS_ALL = MJ_OPS_ROUTE | MJ_OPS_ALIGN | MJ_OPS_COMBINE,
  MJ_OPS_GEMM1 = 1u << 3,
  MJ_OPS_GEMM2 = 1u << 4,
  /* A whole layer (moejit_model_load_spec / _config, moejit_moe_forward). */
  MJ_OPS_LAYER = MJ_OPS_ALL | MJ_OPS_GEMM1 | MJ_OPS_GEMM2,
  /* The kernels around an expert-parallel all-to-all (templates/ep.cu). */
  MJ_OPS_EP = 1u << 5
};

struct mj_ep;

/* One GEMM module of a whole-layer load: the family, the kernel spec
 * (canonical, mj_spec_canonical) and the entries the load resolves in it,
 * which the module is built with (model.c). A kernel spec's entries are
 * built in up to three modules, `part` 0 its tile kernels, 1 the GEMV path
 * and the decode layer's first two pairs, 2 the decode layer's _wide64
 * entry, so that NVRTC builds them side by side (model.c, module_part). */
typedef struct mj_gemm_module {
  const char *family;
  moejit_spec spec;
  mj_entry_set set;
  int part;
} mj_gemm_module;

/* ---- tuned GEMM variants (gemm_choice.c) ------------------------------- */

/* Token buckets a model keeps per GEMM (a log2 sweep of 1..2^31 has 32). */
#define MJ_GEMM_MAX_VARIANTS 32

/* One tuned configuration of a GEMM: what runs for T near `tokens`. */
typedef struct mj_gemm_variant {
  int64_t tokens;        /* the bucket */
  moejit_gemm_cfg cfg;   /* replaces spec.gemm1 / spec.gemm2 */
  moejit_gemm_path path; /* MMA or WGMMA */
  double us, heuristic_us;
} mj_gemm_variant;

typedef struct mj_gemm_variants {
  int n; /* 0: heuristic only */
  mj_gemm_variant v[MJ_GEMM_MAX_VARIANTS]; /* ascending tokens */
} mj_gemm_variants;

/* The GEMM modules a whole-layer load of `spec` on `arch` with these tuned
 * variants ([0] gemm1, [1] gemm2) builds: *out (free) holds *n of them.
 * For tests: every kernel a forward looks up must be in one. */
moejit_status mj_layer_gemm_modules(const moejit_spec *spec, const char *arch,
                                    const mj_gemm_variants variants[2], mj_gemm_module **out,
                                    size_t *n);

/* The variants of GEMM `which` (1 or 2) of spec in table t (NULL: no table;
 * `no_table` says why): the entries for spec's dtype and shape whose cfg
 * validates and whose plan holds on `arch` at tokens * top_k rows. Fills
 * row->config, config_source and config_detail ("tuned" with the origin and
 * buckets, or "heuristic" with why). Host only; needs no GPU. */
void mj_gemm_variants_collect(const mj_tuned_table *t, const char *no_table,
                              const moejit_spec *spec, int which, const char *arch,
                              mj_gemm_variants *out, moejit_load_kernel *row);

/* spec with GEMM `which` configured as v: the spec a variant's kernel is
 * built and looked up with (only that GEMM's cfg differs from spec). */
void mj_gemm_variant_spec(const moejit_spec *spec, int which, const mj_gemm_variant *v,
                          moejit_spec *out);

/* What one GEMM launch of a forward runs. `spec` points at the model's
 * spec or at `scratch` inside this struct: use the struct where it was
 * filled, never a copy. */
typedef struct mj_gemm_choice {
  const moejit_spec *spec;
  moejit_spec scratch;
  moejit_gemm_path path;
  int variant;          /* index into the variants, -1: heuristic */
  mj_tuned_match match; /* NONE: heuristic */
  int fell_back;        /* 1: the nearest variant's plan failed; `why` says how */
  char why[192];
  mj_gemm_plan plan;    /* the plan the launcher makes for these rows */
} mj_gemm_choice;

/* The choice for GEMM `which` at `tokens` (T * top_k rows) on `arch`: the
 * variant of the nearest bucket (mj_tuned_bucket_better) with its cfg and
 * path, or, with no variants or when that variant's plan fails for these
 * rows, spec and AUTO. Error: the heuristic plan's (INVALID_ARGUMENT, e.g.
 * a grid too large). Host only: no allocation, no sync. */
moejit_status mj_gemm_choose(const moejit_spec *spec, const mj_gemm_variants *v, int which,
                             int64_t tokens, const char *arch, mj_gemm_choice *c);
/* UNSUPPORTED, naming `op`, the GEMM, its kernel and tile, when the
 * choice's plan asks more shared memory than a block may have on the
 * device (smem_optin bytes; 0: unknown, no check). The plan already fits
 * AUTO's mma.sync tile to the arch's table (mj_arch_smem_optin); this is
 * the device's own word, for a tile run as named or a device that allows
 * less than its arch's table. */
moejit_status mj_gemm_choice_fits(const mj_gemm_choice *c, int which, int64_t tokens,
                                  int smem_optin, const char *op);

/* 1 when a forward of `tokens` tokens with these GEMM choices runs as the
 * two-launch decode layer (layer.c): both GEMMs on the GEMV path, T within
 * its reach (mj_decode_reach: at most MOEJIT_DECODE_MAX_TOKENS tokens and
 * MOEJIT_DECODE_MAX_ENTRIES token-slot entries), and $MOEJIT_LAYER_DECODE
 * not "0". Host only. */
int mj_moe_decode_ok(const moejit_spec *spec, int64_t tokens, const mj_gemm_choice *gemm1,
                     const mj_gemm_choice *gemm2);

/* 1 when GEMM 1 of a forward of `tokens` tokens with this choice gathers
 * its rows from x instead of reading the permuted copy (layer.c says when
 * and why); l2_bytes: the device's L2 (0: unknown), sms: its SM count (0:
 * unknown). $MOEJIT_GEMM1_GATHER "1" gathers wherever the kernel can, "0"
 * never. Host only. */
int mj_moe_gemm1_gathers(const moejit_spec *spec, int64_t tokens, const mj_gemm_choice *gemm1,
                         int64_t l2_bytes, int sms);
/* The same rule for GEMM 1's launch plan (the autotuner's, which has no
 * choice). */
int mj_gemm1_plan_gathers(const moejit_spec *spec, int64_t tokens, const mj_gemm_plan *plan,
                          int64_t l2_bytes, int sms);

struct moejit_model {
  moejit_ctx *ctx; /* borrowed */
  moejit_spec spec;
  unsigned families; /* MJ_OPS_* loaded */
  int sm_count;
  CUfunction route_topk;
  /* x . gate_weight^T (templates/route.cu) */
  CUfunction router_logits_warps, router_logits_mma, router_logits_mma_wide, router_logits_sum;
  CUfunction align_count, align_scan, align_scatter;
  CUfunction align_count_scan;   /* count + scan fused, for one chunk */
  CUfunction align_scan_scatter; /* scan + scatter fused, for a few chunks */
  /* 1: the fused kernel's shared memory exceeds the device's limit where the
   * count's alone fits (large E and block); align keeps three launches. */
  int align_unfused;
  CUfunction combine;
  CUfunction ep_mask, ep_scan, ep_pack, ep_combine;
  /* Expert parallelism (src/dist/ep.h); NULL on one GPU. An ep model holds
   * the router and the ep kernels for the global spec; ep->local holds the
   * rest of the layer for this rank's experts. */
  struct mj_ep *ep;
  moejit_load_report report; /* what the load did (moejit_model_load_report) */
  mj_gemm_variants gemm_variants[2]; /* tuned variants of gemm1, gemm2 (n 0: heuristic) */
  /* GEMM 2's K-split scratch (moejit_gemm_args.split) in the layer's
   * workspace: the fewest tokens whose GEMM 2 can split along K (the load's
   * sweep of T), and the most bytes any such T needs (its counters first:
   * MOEJIT_GEMM2_SPLIT_ZERO_BYTES of the device's SMs); bytes 0: no T
   * splits. The workspace holds it from that T on, so its size grows with
   * T. */
  int64_t gemm2_split_from;
  size_t gemm2_split_bytes;
};

/* moejit_model_load restricted to `families` (tests that launch only one
 * family skip compiling the others). Launching a family that was not
 * loaded is INVALID_ARGUMENT. */
moejit_status mj_model_load(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                            moejit_model **out);

/* mj_model_load that also fills *report (may be NULL; filled as far as the
 * load got on failure) with `origin` naming where the spec came from. All
 * families compile at once on the ctx compiler's threads; the GEMM families
 * also warm the ctx's kernel memo for every entry the launchers pick, so a
 * later launch never generates code or loads a module. */
moejit_status mj_model_load_reported(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                     const char *origin, moejit_load_report *report,
                                     moejit_model **out);

/* mj_model_load_reported with load options (opts NULL: defaults; the
 * report goes to opts->report). */
moejit_status mj_model_load_with(moejit_ctx *ctx, const moejit_spec *spec, unsigned families,
                                 const char *origin, const moejit_load_opts *opts,
                                 moejit_model **out);

/* The pointer checks of moejit_moe_forward (layer.c), shared with the
 * expert-parallel forward. */
moejit_status mj_moe_check_pointers(const moejit_model *m, const moejit_moe_args *a);
/* The logits a forward routes: a->logits, or (with a->gate_weight) those it
 * computes into a->router_logits, else ws_logits, with ws_split as the
 * split's scratch (mj_router_split_bytes of T). */
moejit_status mj_moe_logits(const moejit_model *m, const moejit_moe_args *a, void *ws_logits,
                            void *ws_split, moejit_stream stream, const void **logits);

/* The expert half of a layer on `m` (a whole layer, or an ep model's local
 * layer): align -> GEMM 1 + SwiGLU -> GEMM 2 -> combine of `tokens` tokens
 * whose routing is given (ids [T, k] of m's experts, -1: none; weights
 * [T, k]). ws: moejit_moe_workspace_size(m, tokens) bytes. Checks the
 * GEMM plans and the workspace before the first launch. */
moejit_status mj_moe_experts(const moejit_model *m, int64_t tokens, const void *x,
                             const int32_t *ids, const float *weights, const void *w1,
                             const void *w2, void *out, void *ws, size_t ws_bytes,
                             moejit_stream stream);

/* Records the failure on the model's ctx too and returns `status`. */
moejit_status mj_model_fail(const moejit_model *model, moejit_status status);

/* ---- launch shapes mirrored from templates/ --------------------------- */

/* templates/align.cu: kChunkEntries = kBlockThreads * kCountBatch. The
 * workspace is sized from it, so the two must agree. */
#define MJ_ALIGN_COUNT_BATCH 8
/* moejit_align_scan runs as one block of this many threads. */
#define MJ_ALIGN_SCAN_THREADS 1024
/* templates/align.cu: kScanScatterChunks, the most chunks for which
 * moejit_align_scan_scatter replaces the scan and the scatter. */
#define MJ_ALIGN_SCAN_SCATTER_CHUNKS 8

int64_t mj_align_chunk_entries(const moejit_spec *spec);
int64_t mj_align_chunks(const moejit_spec *spec, int64_t tokens);
/* Dynamic shared memory of moejit_align_count and moejit_align_count_scan:
 * a histogram of E+1 bins per warp. */
unsigned mj_align_count_smem(const moejit_spec *spec);
/* Byte offset of chunk_rank inside the workspace (chunk_counts come first). */
size_t mj_align_rank_offset(const moejit_spec *spec, int64_t tokens);

/* templates/common/rows.cuh: tokens per block tile of a row-streaming kernel
 * whose rows are `hidden` elements of `elem_bytes` bytes. Sizes the grid
 * only (the kernels loop over tiles). */
int mj_row_tile_tokens(int64_t hidden, size_t elem_bytes, int block_threads);

/* Blocks for a kernel that loops over `tiles` tiles: one per tile, at most
 * 32 per SM (more only adds block launches). */
unsigned mj_tile_grid(const moejit_model *model, int64_t tiles);

/* templates/common/gemm_epilogue.cuh: kMjKeepOutputBytes. A GEMM output of
 * at most this many bytes (rows * width * element size) is stored with the
 * L2 evict_last policy. */
#define MJ_KEEP_OUTPUT_BYTES (48ull << 20)

/* What the whole layer's combine tidies in L2 after the layer
 * (templates/combine.cu): `dead` (dead_bytes) is discarded, whole 128-byte
 * lines inside it only; `gathered` (gathered_bytes) demoted to the normal
 * priority, the same lines; drop_y: each line of y discarded once read (y
 * must be 128-byte aligned; rows that are not whole lines skip it). */
typedef struct mj_combine_tidy {
  const void *dead;
  size_t dead_bytes;
  const void *gathered;
  size_t gathered_bytes;
  int drop_y;
} mj_combine_tidy;

/* moejit_combine with `tidy` (NULL: none, as moejit_combine). */
moejit_status mj_combine_tidied(const moejit_model *model, const moejit_combine_args *args,
                                const mj_combine_tidy *tidy, moejit_stream stream);

/* The router logits' launch shapes (templates/route.cu): the warps form's
 * block (256 threads; up to 8 tokens and 4 experts an item), the
 * tensor-core tiles (tokens x experts, threads) and their dynamic shared
 * memory (stages x (rows + columns) x 64 two-byte elements). */
#define MJ_ROUTER_THREADS 256
#define MJ_ROUTER_TOKENS 8
#define MJ_ROUTER_EXPERTS 4
#define MJ_ROUTER_TILE_K 64 /* both tensor-core shapes' k-tile */
#define MJ_ROUTER_TILE_TOKENS 32
#define MJ_ROUTER_TILE_EXPERTS 64
#define MJ_ROUTER_TILE_THREADS 128
#define MJ_ROUTER_TILE_SMEM (8 * (32 + 64) * 64 * 2)
#define MJ_ROUTER_WIDE_TOKENS 128
#define MJ_ROUTER_WIDE_EXPERTS 128
#define MJ_ROUTER_WIDE_THREADS 256
#define MJ_ROUTER_WIDE_SMEM (3 * (128 + 128) * 64 * 2)
/* Up to this many tokens the warps form runs; above, the tensor-core form
 * where the types allow it. */
#define MJ_ROUTER_GEMV_MAX_TOKENS MOEJIT_ROUTER_WARP_MAX_TOKENS

/* The split's scratch: sums of at most three 32 x 64 tiles per SM. */
#define MJ_ROUTER_SPLIT_BYTES(sms) ((size_t)3 * (size_t)(sms)*32 * 64 * 4)
/* The scratch a call of `tokens` tokens can use: none at up to 8 tokens
 * (the warps form), else at most one part per 64-wide k-tile of
 * [tokens, E] fp32 sums, and at most MJ_ROUTER_SPLIT_BYTES. Grows with
 * tokens, so the scratch of the largest T serves every smaller one. */
size_t mj_router_split_bytes(const moejit_model *model, int64_t tokens);

/* 1 when a call of `tokens` tokens runs the tensor-core form. */
int mj_router_logits_mma(const moejit_spec *spec, int64_t tokens);

/* logits = x . gate_weight^T (arguments already checked); split: NULL, or
 * MJ_ROUTER_SPLIT_BYTES(model->sm_count) of scratch. */
moejit_status mj_router_logits_launch(const moejit_model *model, int64_t tokens, const void *x,
                                      const void *gate_weight, void *logits, void *split,
                                      moejit_stream stream);

/* ---- argument checks (check.c); each failure records a message --------- */

/* Model non-NULL and holding `family`; args non-NULL. */
moejit_status mj_check_call(const moejit_model *model, unsigned family, const char *op,
                            const void *args);
/* 1 <= tokens and tokens * top_k <= INT32_MAX. */
moejit_status mj_check_tokens(const moejit_model *model, const char *op, int64_t tokens);
/* Non-NULL and aligned to `align` bytes. */
moejit_status mj_check_ptr(const moejit_model *model, const char *op, const char *field,
                           const void *ptr, size_t align);
/* NULL, or aligned to `align` bytes. */
moejit_status mj_check_opt_ptr(const moejit_model *model, const char *op, const char *field,
                               const void *ptr, size_t align);

#endif
