/* moejit MoE layer ops: a model (one spec's kernels loaded on one ctx) and
 * the launchers of the memory-bound stages of an MoE layer: route,
 * align/permute and combine. Included by moejit/moejit.h after runtime.h.
 *
 * The data path of one layer, T tokens, E experts, top-k, width d:
 *
 *   logits [T, E] --route--> topk_ids [T, k], topk_weights [T, k]
 *   topk_ids, x [T, d] --align--> offsets [E+1], row_of [T*k], tiles,
 *                                 xs [T*k, d] (x rows grouped by expert)
 *   (grouped GEMMs: xs -> y [T*k, d], rows in the same order)
 *   y, row_of, topk_weights --combine--> out [T, d]
 *
 * Conventions for every launcher below:
 * - Pointers in the args structs are device pointers (CUdeviceptr values,
 *   as moejit_mem_alloc or cudaMalloc return them), row-major, dense.
 * - Per-call sizes (the token count T) are arguments; everything else (E, k,
 *   d, dtypes, block sizes) was fixed when the model was loaded.
 * - Arguments are checked before anything is launched: NULL pointers, the
 *   alignment stated per field, T in 1..INT32_MAX / k, the expert range, the
 *   workspace size. A failed check returns MOEJIT_ERR_INVALID_ARGUMENT with a
 *   message naming the field, and enqueues nothing.
 * - A launcher enqueues its kernels on `stream` and returns: it never waits
 *   for the GPU, never copies to the host and never allocates, so a whole
 *   layer can be captured in a CUDA graph. Temporary storage is a workspace
 *   the caller provides, whose size is known up front.
 * - Results are deterministic: the same inputs give bitwise-identical
 *   outputs run after run (no floating-point atomics, fixed summation order).
 * - Thread-safety: a model may be used from several threads at once (it is
 *   read-only after loading); ordering work is the caller's business.
 * Kernel designs, the routing rules' exact definitions, the tie and NaN
 * policies and the tile-list layout: docs/kernels.md. */
#ifndef MOEJIT_OPS_H
#define MOEJIT_OPS_H

#include "moejit/moejit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Model: a spec's kernels, loaded on one ctx                               */
/* ------------------------------------------------------------------------ */

typedef struct moejit_model moejit_model;

/* Validates `spec`, copies it, and loads the route, align and combine
 * kernels on `ctx` (generated, compiled by NVRTC or found in the disk cache,
 * for the ctx's device arch; seconds the first time, milliseconds from the
 * cache). The ctx must outlive the model.
 *
 * Returns MOEJIT_OK and *out (release with moejit_model_destroy); on failure
 * *out is NULL and: INVALID_ARGUMENT for NULL arguments; CONFIG for a spec
 * that does not validate; UNSUPPORTED for a valid spec these kernels cannot
 * run (sigmoid routing with more than 32 groups); COMPILE, NO_DRIVER, CUDA as
 * the ctx reports them. Thread-safe. */
MOEJIT_API moejit_status moejit_model_load(moejit_ctx *ctx, const moejit_spec *spec,
                                           moejit_model **out);

/* Frees the model (its kernels stay loaded in the ctx until the ctx is
 * destroyed). NULL is a no-op. The GPU must be done with work it launched
 * only if the caller frees buffers too; a single-GPU model owns no device
 * memory. An expert-parallel model frees its placement maps and destroys
 * the NCCL communicator it created (not a caller's): wait for its
 * forwards first. */
MOEJIT_API void moejit_model_destroy(moejit_model *model);

/* The model's copy of its spec (valid until moejit_model_destroy); NULL for
 * model NULL. */
MOEJIT_API const moejit_spec *moejit_model_spec(const moejit_model *model);

/* ------------------------------------------------------------------------ */
/* Router logits: x and the router's weight -> logits                       */
/* ------------------------------------------------------------------------ */
/* logits[t, e] = sum_i x[t, i] * gate_weight[e, i], summed in fp32 and
 * rounded to spec.logits_dtype once (nn.Linear without a bias, the router
 * of Mixtral, Qwen-MoE, OLMoE and DeepSeek). For callers that hold the
 * router's weight instead of its logits; moejit_moe_forward runs it when
 * given args->gate_weight. Up to MOEJIT_ROUTER_WARP_MAX_TOKENS tokens (a
 * decode step) blocks of warps split each row; above, tensor-core tiles
 * where x and the weight share fp16 or bf16 (else the warps at every T).
 * A token's logits do not depend on the other tokens of the call within
 * one form; the forms may differ in the last bits. docs/kernels.md,
 * "Router logits". */
/* Up to this many tokens the warps form runs. */
#define MOEJIT_ROUTER_WARP_MAX_TOKENS 8

typedef struct moejit_router_logits_args {
  int64_t tokens;          /* T, 1 .. INT32_MAX / top_k */
  const void *x;           /* [T, d] of spec.act_dtype; 16-byte aligned */
  const void *gate_weight; /* [E, d] of spec.weight_dtype; 16-byte aligned */
  void *logits;            /* out [T, E] of spec.logits_dtype; 16-byte aligned */
  /* Optional scratch (NULL: none): moejit_router_logits_workspace_size
   * bytes or more, 256-byte aligned, no initialization needed. With it, a
   * call whose tensor-core tiles make at most half a wave splits d into parts
   * that more blocks sum at once, and a second launch adds the parts in
   * order (deterministic: the same T gives the same bits). */
  void *workspace;
  size_t workspace_bytes;
} moejit_router_logits_args;

/* One launch, two where the workspace lets d split. Needs the route
 * kernels (moejit_model_load loads them). Thread-safe (with separate
 * workspaces); never synchronizes. */
MOEJIT_API moejit_status moejit_router_logits(const moejit_model *model,
                                              const moejit_router_logits_args *args,
                                              moejit_stream stream);

/* The workspace moejit_router_logits can use, whatever T (a few MB: three
 * tiles' sums per SM of the model's device). */
MOEJIT_API moejit_status moejit_router_logits_workspace_size(const moejit_model *model,
                                                             size_t *bytes);

/* ------------------------------------------------------------------------ */
/* Route: logits -> top-k expert ids and weights                            */
/* ------------------------------------------------------------------------ */
/* Per token, by the spec's routing rule (moejit_routing):
 *  softmax_topk:  the k largest logits; weight = softmax probability,
 *                 renormalized over the k if asked, times scaling_factor.
 *  sigmoid_grouped_topk:  score = sigmoid(logit); selection on score + bias
 *                 among the topk_group best of n_group groups (a group's
 *                 merit: the sum of its two best biased scores); weight =
 *                 the unbiased score, renormalized over the k if asked
 *                 (sum + 1e-20), times scaling_factor.
 * Ids are written in selection order (best first). Ties go to the lower
 * expert index (and, for groups, the lower group index). A NaN logit counts
 * as -inf: never chosen before a number, score 0. Softmax: a row of only
 * -inf/NaN logits is uniform (experts 0..k-1, weight 1/E or 1/k), and +inf
 * logits share the whole mass equally. Weights are always finite. */
typedef struct moejit_route_args {
  int64_t tokens;      /* T, 1 .. INT32_MAX / top_k */
  const void *logits;  /* [T, E] of spec.logits_dtype; 16-byte aligned */
  const float *bias;   /* [E] fp32 selection bias (sigmoid rule only; must be
                          finite); NULL: zero. 16-byte aligned */
  int32_t *topk_ids;   /* out [T, k]; 4-byte aligned */
  float *topk_weights; /* out [T, k]; 4-byte aligned */
} moejit_route_args;

/* One launch. Thread-safe; never synchronizes. */
MOEJIT_API moejit_status moejit_route(const moejit_model *model, const moejit_route_args *args,
                                      moejit_stream stream);

/* ------------------------------------------------------------------------ */
/* Align / permute: group the T*k (token, slot) entries by expert           */
/* ------------------------------------------------------------------------ */
/* Entry e = t*k + j is (token t, its j-th pick topk_ids[t, j]). Outputs:
 *  expert_counts[x]   entries of expert x (0 outside the expert range);
 *  expert_offsets[x]  exclusive prefix sum, E+1 values: expert x owns rows
 *                     [offsets[x], offsets[x+1]); offsets[E] = N, the number
 *                     of kept entries;
 *  sorted_slot[r]     the entry placed at row r (r < N), in expert order and,
 *                     within an expert, in entry order (stable); -1 for rows
 *                     N .. T*k-1;
 *  row_of[e]          the row of entry e (the inverse), or -1 if dropped;
 *  tile list          for GEMM tiles of spec.gemm1.tile_m rows (M): expert x
 *                     gets ceil(count/M) tiles in expert order; tile i covers
 *                     rows [tile_row_start[i], min(tile_row_start[i] + M,
 *                     offsets[x+1])) of expert x = tile_expert[i]. Rows are
 *                     never padded; only the tile list rounds up. *num_tiles
 *                     holds the count; entries num_tiles .. capacity-1 have
 *                     tile_expert = tile_row_start = -1, so a GEMM launched
 *                     with `capacity` blocks can exit on -1 without reading
 *                     num_tiles;
 *  xs[r]              = x[sorted_slot[r] / k] for r < N (rows N.. untouched).
 * Expert parallelism: only experts in [expert_first, expert_last) are kept;
 * other entries (and ids outside 0..E-1) are dropped. expert_counts,
 * offsets and tile_expert use global expert ids. */
typedef struct moejit_align_args {
  int64_t tokens;          /* T, 1 .. INT32_MAX / top_k */
  const int32_t *topk_ids; /* [T, k]; 4-byte aligned */
  /* Kept experts [expert_first, expert_last), 0 <= first < last <= E;
   * both 0: all experts. */
  int32_t expert_first, expert_last;
  /* [T, d] of spec.act_dtype and out [T*k, d], both 16-byte aligned; both
   * NULL: indices only (no copy). */
  const void *x;
  void *xs;
  int32_t *expert_counts;  /* out [E] */
  int32_t *expert_offsets; /* out [E+1] */
  int32_t *sorted_slot;    /* out [T*k] */
  int32_t *row_of;         /* out [T*k] */
  int32_t *tile_expert;    /* out [moejit_align_tile_capacity(T)] */
  int32_t *tile_row_start; /* out [moejit_align_tile_capacity(T)] */
  int32_t *num_tiles;      /* out [1] */
  void *workspace;         /* moejit_align_workspace_size(T) bytes, 16-byte
                              aligned; contents need no initialization */
  size_t workspace_bytes;
} moejit_align_args;

/* Bytes of workspace moejit_align needs for `tokens` tokens (grows linearly
 * with T; a workspace sized for the largest T serves every smaller one). */
MOEJIT_API moejit_status moejit_align_workspace_size(const moejit_model *model, int64_t tokens,
                                                     size_t *bytes);

/* Entries of the tile list for `tokens` tokens: the most tiles T*k entries
 * can need, min(T*k, floor(T*k / M) + E) with M = spec.gemm1.tile_m. */
MOEJIT_API moejit_status moejit_align_tile_capacity(const moejit_model *model, int64_t tokens,
                                                    int64_t *tiles);

/* Three launches (count, scan, scatter + copy); two (count + scan, scatter +
 * copy) when T*k fits one count chunk (align.block_threads * 8 entries).
 * Thread-safe (given separate workspaces); never synchronizes. */
MOEJIT_API moejit_status moejit_align(const moejit_model *model, const moejit_align_args *args,
                                      moejit_stream stream);

/* ------------------------------------------------------------------------ */
/* Combine: weighted sum of each token's k expert outputs                   */
/* ------------------------------------------------------------------------ */
/* out[t] = sum over j = 0..k-1 of weights[t, j] * y[row_of[t*k + j]], in j
 * order, fp32 accumulation, rounded once to spec.out_dtype. Entries with
 * row_of = -1 are skipped (a token with none gets zeros). */
typedef struct moejit_combine_args {
  int64_t tokens;        /* T, 1 .. INT32_MAX / top_k */
  const void *y;         /* [rows, d] of spec.act_dtype, indexed by row_of
                            (rows as align placed them); 16-byte aligned */
  const int32_t *row_of; /* [T*k] from moejit_align; 4-byte aligned */
  const float *weights;  /* [T, k] (topk_weights); NULL: plain sum, for
                            weights already applied (e.g. in GEMM 2) */
  void *out;             /* out [T, d] of spec.out_dtype; 16-byte aligned */
} moejit_combine_args;

/* One launch. Thread-safe; never synchronizes. */
MOEJIT_API moejit_status moejit_combine(const moejit_model *model, const moejit_combine_args *args,
                                        moejit_stream stream);

#ifdef __cplusplus
}
#endif

#endif
