/* moejit grouped expert GEMMs: GEMM 1 (gate + up) with SwiGLU fused, and
 * GEMM 2 (down) with an optional per-row scale. Include moejit/moejit.h (or
 * this header, which includes it).
 *
 * What they compute, for experts e = 0..E-1 owning the rows
 * [offsets[e], offsets[e+1]) of the permuted activations (rows grouped by
 * expert, as the align stage writes them; row_scale and outputs use the same
 * row order):
 *
 *   gemm1:  h[r, j] = silu(a[r,:] . W1[e, j, :]) * (a[r,:] . W1[e, f + j, :])
 *           a [max_rows, d], W1 [E, 2f, d], h [max_rows, f]
 *   gemm2:  y[r, i] = row_scale[r] * (a[r,:] . W2[e, i, :])  (scale 1 if NULL)
 *           a [max_rows, f], W2 [E, d, f], y [max_rows, d]
 *
 * with d = spec.hidden, f = spec.expert_width, all row-major and dense, W1
 * and W2 as checkpoints store them (W1: the f gate rows, then the f up rows).
 * Activations, weights and outputs use spec.act_dtype / spec.weight_dtype /
 * spec.act_dtype; sums are fp32 and outputs rounded once.
 *
 * Conventions (those of moejit/ops.h):
 * - The per-expert row counts stay on the device: offsets is read by the
 *   kernels only, never by the host. The grid is sized from max_rows (an
 *   upper bound of offsets[E], e.g. T * top_k); CTAs without rows exit. Rows
 *   from offsets[E] to max_rows - 1 are not written.
 * - Arguments are checked before anything is launched; a failed check is
 *   MOEJIT_ERR_INVALID_ARGUMENT naming the field, and nothing is enqueued.
 * - A launch never waits for the GPU, never allocates and never copies to the
 *   host (graph-capturable). The first call for a spec generates and compiles
 *   the kernel (NVRTC, or the disk cache): warm it with moejit_compile or a
 *   first call outside timed or captured regions.
 * - Deterministic: the same inputs give bitwise-identical outputs.
 * - Thread-safe (the ctx is locked internally).
 * Kernel design, tiling and tuning notes: docs/gemm.md. */
#ifndef MOEJIT_GEMM_H
#define MOEJIT_GEMM_H

#include "moejit/moejit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which kernel runs a GEMM. */
typedef enum moejit_gemm_path {
  /* Tensor cores (mma.sync, cp.async pipeline) when the spec allows it: act
   * and weight dtypes equal and fp16 or bf16, d and f multiples of 8; else
   * the SIMT kernel. */
  MOEJIT_GEMM_PATH_AUTO = 0,
  /* Tensor cores or MOEJIT_ERR_UNSUPPORTED saying why not. */
  MOEJIT_GEMM_PATH_MMA = 1,
  /* One thread per output, fp32 sums in k order: slow, any dtypes; the
   * reference the tests compare the tensor-core kernels with. */
  MOEJIT_GEMM_PATH_SIMT = 2,
  /* Hopper tensor cores (wgmma fed by TMA; the ctx's arch must be sm_90a,
   * dtypes fp16 or bf16 and equal, d and f multiples of 8, tile_m * tile_n
   * within the register budget: see docs/gemm.md) or MOEJIT_ERR_UNSUPPORTED
   * saying why not. AUTO picks it on sm_90a (with a narrow 64 x 128 tile
   * when the spec's tile would give fewer than 264 tiles); the environment
   * variable MOEJIT_GEMM_WGMMA=0 keeps AUTO off it. An explicit WGMMA path
   * runs exactly the spec's tile. */
  MOEJIT_GEMM_PATH_WGMMA = 3,
  /* Decode: a weight-streaming kernel for a few rows per expert. Every warp
   * of a persistent grid streams whole weight rows once (16-byte loads) and
   * dots each with the expert's rows, fp32 sums on the CUDA cores, so the
   * GPU's bandwidth is spread over all SMs even when a handful of experts
   * have one row each. Needs fp16 or bf16 with equal dtypes and d, f
   * multiples of 8 (else MOEJIT_ERR_UNSUPPORTED saying why); any arch. Rows
   * are taken MOEJIT_GEMV_PASS_ROWS per pass over the weights, so an expert
   * with more rows re-reads its weights: AUTO picks it only when max_rows <=
   * MOEJIT_GEMV_MAX_ROWS (then no expert can need a second pass); the
   * environment variable MOEJIT_GEMM_GEMV=0 keeps AUTO off it. */
  MOEJIT_GEMM_PATH_GEMV = 4
} moejit_gemm_path;

/* Rows per expert the GEMV path takes per pass over the weights, and the
 * max_rows at or under which AUTO picks it. */
#define MOEJIT_GEMV_PASS_ROWS 8
#define MOEJIT_GEMV_MAX_ROWS 8

typedef struct moejit_gemm_args {
  const void *a;                  /* activations [max_rows, K]; 16-byte aligned */
  const void *w;                  /* weights W1 [E, 2f, d] or W2 [E, d, f]; 16-byte aligned */
  void *out;                      /* h [max_rows, f] or y [max_rows, d]; 16-byte aligned */
  const int32_t *expert_offsets;  /* [E + 1], non-decreasing, offsets[E] <= max_rows;
                                     4-byte aligned */
  const float *row_scale;         /* gemm2: [max_rows] fp32 or NULL (no scale), 4-byte
                                     aligned; gemm1 ignores it */
  int64_t max_rows;               /* rows the buffers hold, 0 .. INT32_MAX; 0 launches
                                     nothing */
  moejit_gemm_path path;          /* 0 (AUTO) unless testing */
  /* gemm1 only, optional: gather the A rows instead of reading `a` in row
   * order. Row r of A is then row a_index[r] / a_index_div of `a` (which
   * holds a_rows rows of K); a negative index, or one whose row is at or
   * past a_rows, is a row of zeros. [max_rows] int32, 4-byte aligned; NULL:
   * no gather. The layer passes x, align's sorted_slot and top_k, so the
   * permuted copy of x is never written. Runs on the WGMMA path with the
   * spec's tile (AUTO: where it would pick that); else UNSUPPORTED. */
  const int32_t *a_index;
  int32_t a_index_div;            /* 1 or more; 0 counts as 1 */
  int64_t a_rows;                 /* rows of `a` when gathering, 1 .. INT32_MAX */
  /* gemm1 only, optional: 8 bytes of device memory (4-byte aligned), zero
   * before the first launch that passes them; every launch leaves the first
   * word zero (the second counts on). Where it pays (the wgmma kernel on the
   * spec's cooperative tile of 128 or more rows, A read in row order, no
   * clusters, experts of two M-tiles or more on average; docs/gemm.md
   * "Rounds in step"), the kernel's CTAs then start each round of
   * tiles together, so those sharing a weight tile find it in L2; the launch
   * is cooperative (every CTA resident at once) and falls back to a plain
   * one where the device cannot hold the grid. One launch at a time per
   * buffer. NULL: never. */
  uint32_t *round_sync;
  /* gemm2 only, optional: device scratch of split_bytes bytes (16-byte
   * aligned) for the last round of tiles split along K. Where that round
   * would leave at least half the SMs idle, the wgmma kernel on a
   * cooperative tile of 128 or more rows without clusters, with K of at
   * least 4096, splits each tile of it into K parts that idle CTAs take;
   * each part stores fp32 partial sums here, and the last part of a tile to
   * finish adds them up in a fixed order, so results are deterministic
   * (docs/gemm.md "The last round split along K"). Without it that round is
   * split into row halves instead. moejit_gemm2_split_size says how many bytes a
   * launch needs (0: it never splits along K; the field is then ignored)
   * and how many of them, at the start, must be zero before the first
   * launch that passes the buffer; every launch leaves them zero. One
   * launch at a time per buffer. NULL: never. */
  void *split;
  size_t split_bytes;
} moejit_gemm_args;

/* The name of a moejit_gemm_path: "auto", "mma", "simt", "wgmma", "gemv"; "?" for
 * other values. */
MOEJIT_API const char *moejit_gemm_path_name(int path);

/* GEMM 1 with SwiGLU: h = silu(a W1_gate^T) * (a W1_up^T) per expert, tiled by
 * spec.gemm1. Errors: INVALID_ARGUMENT (NULL or misaligned pointers,
 * max_rows out of range, a GEMM tile field out of range, which the launch
 * plan checks first); UNSUPPORTED (path MMA or WGMMA where it cannot
 * run, or gemm1.warps 12 where wgmma is not picked); COMPILE,
 * CONFIG (the spec's other fields), CUDA as moejit_ctx_get_kernel and
 * launches report them. */
MOEJIT_API moejit_status moejit_gemm1_swiglu(moejit_ctx *ctx, const moejit_spec *spec,
                                             const moejit_gemm_args *args, moejit_stream stream);

/* GEMM 2: y = row_scale * (a W2^T) per expert, tiled by spec.gemm2. Errors as
 * moejit_gemm1_swiglu, and INVALID_ARGUMENT for args->split with fewer
 * args->split_bytes than moejit_gemm2_split_size asks. */
MOEJIT_API moejit_status moejit_gemm2(moejit_ctx *ctx, const moejit_spec *spec,
                                      const moejit_gemm_args *args, moejit_stream stream);

/* Scratch a moejit_gemm2 launch of `max_rows` rows on `path` (AUTO: what
 * AUTO picks on ctx's device) can use to split its last round of tiles
 * along K (moejit_gemm_args.split): *bytes in all, of which the first
 * *zero_bytes must be zero before the first launch that passes the buffer
 * (every launch leaves them zero). Both 0 where that launch never splits
 * along K. Host only: no device work. Errors: INVALID_ARGUMENT (NULL ctx,
 * spec or bytes; max_rows out of range), and a spec's errors as
 * moejit_gemm2 reports them. */
/* The most scratch moejit_gemm2_split_size asks for on a device of `sms`
 * multiprocessors, whatever the spec: a buffer this large (its first
 * MOEJIT_GEMM2_SPLIT_ZERO_BYTES(sms) zero) serves every launch there. */
#define MOEJIT_GEMM2_SPLIT_ZERO_BYTES(sms) (((size_t)(sms)*16u + 255u) / 256u * 256u)
#define MOEJIT_GEMM2_SPLIT_MAX_BYTES(sms) \
  (MOEJIT_GEMM2_SPLIT_ZERO_BYTES(sms) + (size_t)(sms)*128u * 256u * 4u)

MOEJIT_API moejit_status moejit_gemm2_split_size(moejit_ctx *ctx, const moejit_spec *spec,
                                                 moejit_gemm_path path, int64_t max_rows,
                                                 size_t *bytes, size_t *zero_bytes);

#ifdef __cplusplus
}
#endif

#endif
