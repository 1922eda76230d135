/* CPU reference of align/permute (templates/align.cu) and an independent
 * checker of the properties any align result must have (a permutation,
 * stable, tiles covering every expert's rows), used on GPU results and on
 * the reference itself. Layouts: include/moejit/ops.h, moejit_align_args. */
#ifndef MOEJIT_TEST_REF_ALIGN_H
#define MOEJIT_TEST_REF_ALIGN_H

#include <stddef.h>
#include <stdint.h>

typedef struct ref_align_shape {
  int64_t tokens;
  int top_k, experts;
  int first, last; /* kept experts [first, last) */
  int tile_m;      /* GEMM tile rows */
} ref_align_shape;

/* Host copies of every align output (caller-allocated, sizes as in ops.h;
 * tiles hold `tile_capacity` entries). */
typedef struct ref_align_out {
  int32_t *counts;         /* [E] */
  int32_t *offsets;        /* [E+1] */
  int32_t *sorted_slot;    /* [T*k] */
  int32_t *row_of;         /* [T*k] */
  int32_t *tile_expert;    /* [tile_capacity] */
  int32_t *tile_row_start; /* [tile_capacity] */
  int32_t num_tiles;
  int64_t tile_capacity;
} ref_align_out;

/* min(T*k, floor(T*k / tile_m) + E), as moejit_align_tile_capacity. */
int64_t ref_align_tile_capacity(const ref_align_shape *s);

/* Allocates every array of `out` for shape s (tile_capacity set); returns
 * 0 on allocation failure. ref_align_out_free releases them. */
int ref_align_out_alloc(const ref_align_shape *s, ref_align_out *out);
void ref_align_out_free(ref_align_out *out);

/* The stable counting sort. */
void ref_align(const ref_align_shape *s, const int32_t *topk_ids, ref_align_out *out);

/* Checks `out` against the definition (not against ref_align): each kept
 * entry exactly once, rows of an expert in entry order, dropped entries -1,
 * offsets = prefix sums of counts, tiles covering each expert's rows in
 * order with -1 past num_tiles. Returns NULL if all hold, else a static
 * message describing the first violation. */
const char *ref_align_check(const ref_align_shape *s, const int32_t *topk_ids,
                            const ref_align_out *out);

#endif
