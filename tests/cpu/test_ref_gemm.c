/* The float64 grouped-GEMM reference (tests/support/ref_gemm.c) on tiny
 * cases worked out by hand, so the GPU tests compare against a checked
 * oracle. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "ref_dtype.h"
#include "ref_gemm.h"

#define SENTINEL -777.0

/* 3 rows, d = 2, f = 1, E = 3 with expert 1 empty:
 *   expert 0 owns row 0, expert 1 none, expert 2 rows 1 and 2 (offsets 0 1 1 3).
 * W1[e] = [gate row; up row]. */
static const float g1_a[3 * 2] = {1, 2, /* row 0 */ 3, -1, /* row 1 */ 0.5f, 0};
static const float g1_w[3 * 2 * 2] = {1, 0, 0, 1,  /* expert 0: gate (1,0), up (0,1) */
                                      9, 9, 9, 9,  /* expert 1: no rows, never read */
                                      1, 1, 2, 0}; /* expert 2: gate (1,1), up (2,0) */
static const int32_t g1_offsets[4] = {0, 1, 1, 3};

Test(ref_gemm, silu_values) {
  cr_assert_eq(ref_silu(0.0), 0.0);
  cr_assert_float_eq(ref_silu(1.0), 1.0 / (1.0 + exp(-1.0)), 1e-15);
  cr_assert_float_eq(ref_silu(1.0), 0.7310585786300049, 1e-15);
  cr_assert(ref_silu(-1000.0) == 0.0, "silu(-inf side) is -0: %g", ref_silu(-1000.0));
  cr_assert_float_eq(ref_silu(50.0), 50.0, 1e-12);
}

Test(ref_gemm, gemm1_swiglu_by_hand_fp32) {
  ref_gemm_problem p = {MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP32, g1_a, g1_w, g1_offsets, NULL, 3, 2, 1};
  double h[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
  ref_gemm1_swiglu(&p, h);
  /* row 0 (e0): gate = 1*1 + 2*0 = 1, up = 0*1 + 1*2 = 2 -> silu(1) * 2 */
  cr_assert_float_eq(h[0], 2 * 0.7310585786300049, 1e-14);
  /* row 1 (e2): gate = 3 - 1 = 2, up = 2*3 = 6 -> 6 * 2 / (1 + e^-2) */
  cr_assert_float_eq(h[1], 6 * 1.7615941559557649, 1e-13);
  /* row 2 (e2): gate = 0.5, up = 1 -> 0.5 / (1 + e^-0.5) */
  cr_assert_float_eq(h[2], 0.31122966560092724, 1e-15);
  cr_assert_eq(h[3], SENTINEL, "rows past offsets[E] stay untouched");
}

Test(ref_gemm, gemm1_swiglu_two_columns_bf16) {
  /* 1 row, d = 2, f = 2, E = 1; all values exact in bf16.
   * W1 rows: gate0 (1, 0), gate1 (0, 1), up0 (1, 1), up1 (-2, 0.5). a = (2, -4):
   * gate = (2, -4), up = (-2, -6): h0 = silu(2) * -2, h1 = silu(-4) * -6. */
  const float a[2] = {2, -4}, w[8] = {1, 0, 0, 1, 1, 1, -2, 0.5f};
  uint16_t ab[2], wb[8];
  ref_pack(MOEJIT_DTYPE_BF16, a, ab, 2);
  ref_pack(MOEJIT_DTYPE_BF16, w, wb, 8);
  const int32_t off[2] = {0, 1};
  ref_gemm_problem p = {MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_BF16, ab, wb, off, NULL, 1, 2, 2};
  double h[2];
  ref_gemm1_swiglu(&p, h);
  cr_assert_float_eq(h[0], -2 * 1.7615941559557649, 1e-13);
  cr_assert_float_eq(h[1], -6 * (-4 / (1 + exp(4.0))), 1e-13);
  cr_assert_float_eq(h[1], 0.43166903909019744, 1e-14);
}

Test(ref_gemm, gemm2_with_and_without_scale) {
  /* 3 rows, f = 3 (K), d = 2 (outputs), E = 2: expert 0 rows 0-1, expert 1 row 2.
   * W2[0] = [(1,0,0); (1,1,1)], W2[1] = [(0,0,2); (1,-1,0)]. */
  const float a[9] = {1, 2, 3, /* */ -1, 0, 4, /* */ 0.25f, 8, 1};
  const float w[12] = {1, 0, 0, 1, 1, 1, 0, 0, 2, 1, -1, 0};
  const int32_t off[3] = {0, 2, 3};
  const float scale[3] = {0.5f, 2, -1};
  ref_gemm_problem p = {MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP32, a, w, off, NULL, 2, 2, 3};
  double y[6];
  ref_gemm2(&p, y);
  const double plain[6] = {1, 6, -1, 3, 2, 0.25 - 8};
  for (int i = 0; i < 6; i++) cr_assert_float_eq(y[i], plain[i], 1e-15, "y[%d] = %g", i, y[i]);
  p.row_scale = scale;
  ref_gemm2(&p, y);
  const double scaled[6] = {0.5, 3, -2, 6, -2, 7.75};
  for (int i = 0; i < 6; i++) cr_assert_float_eq(y[i], scaled[i], 1e-15, "y[%d] = %g", i, y[i]);
}

Test(ref_gemm, fp16_inputs_widen_exactly) {
  /* 1 row, f = 2, d = 1: 0.5 * 3 + -1.25 * 1024 = -1278.5 (exact in fp16 inputs). */
  const float a[2] = {0.5f, -1.25f}, w[2] = {3, 1024};
  uint16_t ah[2], wh[2];
  ref_pack(MOEJIT_DTYPE_FP16, a, ah, 2);
  ref_pack(MOEJIT_DTYPE_FP16, w, wh, 2);
  const int32_t off[2] = {0, 1};
  ref_gemm_problem p = {MOEJIT_DTYPE_FP16, MOEJIT_DTYPE_FP16, ah, wh, off, NULL, 1, 1, 2};
  double y[1];
  ref_gemm2(&p, y);
  cr_assert_eq(y[0], -1278.5);
}

Test(ref_gemm, many_experts_columns_match_a_naive_loop) {
  /* More columns than one work item (32) and several experts, against a
   * direct triple loop in double. */
  enum { E = 4, D = 40, F = 70, ROWS = 9 };
  static float a[ROWS * D], w[E * 2 * F * D];
  for (int i = 0; i < ROWS * D; i++) a[i] = (float)((i * 7) % 13) / 8 - 0.75f;
  for (int i = 0; i < E * 2 * F * D; i++) w[i] = (float)((i * 11) % 17) / 16 - 0.5f;
  const int32_t off[E + 1] = {0, 3, 3, 8, 9};
  ref_gemm_problem p = {MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP32, a, w, off, NULL, E, D, F};
  static double h[ROWS * F];
  ref_gemm1_swiglu(&p, h);
  for (int e = 0; e < E; e++)
    for (int r = off[e]; r < off[e + 1]; r++)
      for (int j = 0; j < F; j++) {
        double g = 0, u = 0;
        for (int k = 0; k < D; k++) {
          g += (double)a[r * D + k] * w[((e * 2 * F) + j) * D + k];
          u += (double)a[r * D + k] * w[((e * 2 * F) + F + j) * D + k];
        }
        cr_assert_float_eq(h[r * F + j], g / (1 + exp(-g)) * u, 1e-12, "row %d col %d", r, j);
      }
}

Test(ref_gemm, rel_error) {
  const double ref[3] = {3, 0, 4};
  const float same[3] = {3, 0, 4}, off_by[3] = {3, 0.5f, 4}, bad[3] = {3, NAN, 4};
  cr_assert_eq(ref_gemm_rel_error(MOEJIT_DTYPE_FP32, same, ref, 3), 0.0);
  cr_assert_float_eq(ref_gemm_rel_error(MOEJIT_DTYPE_FP32, off_by, ref, 3), 0.1, 1e-12);
  cr_assert(isinf(ref_gemm_rel_error(MOEJIT_DTYPE_FP32, bad, ref, 3)));
  uint16_t nan_bits[3] = {0x4040, 0xffff, 0x4080}; /* bf16 3, NaN, 4 */
  cr_assert(isinf(ref_gemm_rel_error(MOEJIT_DTYPE_BF16, nan_bits, ref, 3)));
  nan_bits[1] = 0;
  cr_assert_eq(ref_gemm_rel_error(MOEJIT_DTYPE_BF16, nan_bits, ref, 3), 0.0);
}
