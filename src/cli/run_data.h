/* Inputs and the float64 check of `moejit run`: pseudo-random tensors that
 * the GPU fills itself from one small uploaded block (element i of a tensor
 * is block[i mod P]), so the host can recompute any element without copying
 * gigabytes back, and the reference of the layer for a few tokens. Public
 * API only (the CLI links the shared library). */
#ifndef MOEJIT_CLI_RUN_DATA_H
#define MOEJIT_CLI_RUN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

/* Block length: a prime, so that rows of any width land on different
 * stretches of the block. */
#define RUN_BLOCK_ELEMS 4194301

/* One periodic tensor source: the block as dtype bits (for upload) and as
 * doubles (for the reference). */
typedef struct run_block {
  moejit_dtype dtype;
  void *bits;     /* RUN_BLOCK_ELEMS elements of dtype */
  double *values; /* the same values, widened */
} run_block;

/* Uniform values in [-scale, scale] from `seed`, rounded to dtype. 0 on
 * allocation failure. */
int run_block_make(run_block *b, moejit_dtype dtype, double scale, uint64_t seed);
void run_block_free(run_block *b);

/* Fills `elems` elements at dst with the periodic tensor of block b, on
 * the GPU (one upload of the block, then device copies doubling what is
 * filled). scratch: device memory of RUN_BLOCK_ELEMS elements. */
moejit_status run_fill_periodic(moejit_ctx *ctx, const run_block *b, void *scratch, void *dst,
                                size_t elems, moejit_stream stream);

/* Router logits [T, E] as fp32: each token a random permutation of E
 * evenly spaced values (exact in bf16), so top-k choices are clear. */
float *run_make_logits(int64_t tokens, int experts, uint64_t seed);

/* ||got - ref|| / ||ref|| of the router's logits of n tokens (got: [n, E],
 * token tokens[i]'s row at i), ref = x . gate^T in float64 from the
 * periodic blocks of x [T, d] and the gate weight [E, d]. */
double run_logits_error(const moejit_spec *s, const run_block *bx, const run_block *bg,
                        const int64_t *tokens, size_t n, const double *got);

/* Packs n floats as dtype. */
void run_pack(moejit_dtype dtype, const float *src, void *dst, size_t n);
/* One stored element of dtype as double. */
double run_unpack_one(moejit_dtype dtype, const void *base, size_t i);
/* sqrt and exp in double without libm (the CLI links only libmoejit). */
double run_sqrt(double v);
double run_exp(double v);

/* v rounded to dtype. */
double run_round(moejit_dtype dtype, double v);

/* The layer for the `n` tokens in `tokens` (their ids and weights [n, k],
 * as the GPU routed them), in float64 with h and y rounded to the
 * activation dtype as the GPU stores them; x, W1, W2 are the periodic
 * tensors of blocks bx, b1, b2. out: [n, d]. Runs the tokens on threads. */
void run_reference(const moejit_spec *s, const run_block *bx, const run_block *b1,
                   const run_block *b2, const int64_t *tokens, size_t n, const int32_t *ids,
                   const float *weights, double *out);

#endif
