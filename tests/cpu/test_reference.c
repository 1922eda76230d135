/* The float64 CPU references the GPU tests trust (tests/support/ref_*.c),
 * checked on small cases computed by hand, plus the align property checker
 * on results it must accept and corruptions it must reject. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref_align.h"
#include "ref_combine.h"
#include "ref_dtype.h"
#include "ref_route.h"

#define EXPECT_NEAR(got, want)                                                               \
  cr_expect(fabs((double)(got) - (double)(want)) <= 1e-12 * fmax(1.0, fabs((double)(want))), \
            "%s = %.17g, expected %.17g", #got, (double)(got), (double)(want))

/* ---- dtype conversions ---------------------------------------------------- */

Test(reference, bf16_rounds_to_nearest_even) {
  cr_expect_eq(ref_f32_to_bf16(1.0f), 0x3f80);
  cr_expect_eq(ref_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80, "halfway rounds to the even 0x3f80");
  cr_expect_eq(ref_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82, "halfway rounds to the even 0x3f82");
  cr_expect_eq(ref_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81, "above halfway rounds up");
  cr_expect_eq(ref_f32_to_bf16(-0.0f), 0x8000);
  cr_expect_eq(ref_f32_to_bf16(3.4028235e38f), 0x7f80, "FLT_MAX rounds to inf");
  cr_expect(isnan(ref_bf16_to_f32(ref_f32_to_bf16(NAN))));
  cr_expect_eq(ref_bf16_to_f32(0xc0a0), -5.0f);
}

Test(reference, fp16_rounds_to_nearest_even) {
  cr_expect_eq(ref_f32_to_f16(1.0f), 0x3c00);
  cr_expect_eq(ref_f32_to_f16(65504.0f), 0x7bff);
  cr_expect_eq(ref_f32_to_f16(65520.0f), 0x7c00, "65520 rounds to inf");
  cr_expect_eq(ref_f32_to_f16(0x1p-24f), 0x0001, "smallest subnormal");
  cr_expect_eq(ref_f32_to_f16(0x1p-25f), 0x0000, "half the smallest subnormal ties to 0");
  cr_expect_eq(ref_f32_to_f16(3 * 0x1p-25f), 0x0002, "1.5 subnormal units tie to 2");
  cr_expect_eq(ref_f32_to_f16(1.0f + 0x1p-11f), 0x3c00, "halfway rounds to even");
  cr_expect_eq(ref_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02, "halfway rounds to even");
  cr_expect_eq(ref_f32_to_f16(-2.0f), 0xc000);
  cr_expect_eq(ref_f16_to_f32(0x3555), 0.333251953125f);
  cr_expect_eq(ref_f16_to_f32(0x0001), 0x1p-24f);
  cr_expect(isinf(ref_f16_to_f32(0xfc00)) && ref_f16_to_f32(0xfc00) < 0);
}

/* ---- route ---------------------------------------------------------------- */

static ref_route_cfg softmax_cfg(int experts, int top_k, int renormalize) {
  ref_route_cfg c = {.experts = experts,
                     .top_k = top_k,
                     .rule = 0,
                     .renormalize = renormalize,
                     .n_group = 1,
                     .topk_group = 1,
                     .scaling_factor = 1.0};
  return c;
}

Test(reference, softmax_topk_renormalized) {
  /* picks 3 then 2: weights e^0 / (e^0 + e^-1) and e^-1 / (e^0 + e^-1) */
  const float logits[4] = {1, 3, 2, 0};
  ref_route_cfg c = softmax_cfg(4, 2, 1);
  int ids[2];
  double w[2];
  cr_expect(isinf(ref_route_token(&c, logits, NULL, ids, w)), "softmax compares inputs: no margin");
  cr_expect_eq(ids[0], 1);
  cr_expect_eq(ids[1], 2);
  EXPECT_NEAR(w[0], 0.7310585786300049);
  EXPECT_NEAR(w[1], 0.2689414213699951);
  c.scaling_factor = 2.0;
  ref_route_token(&c, logits, NULL, ids, w);
  EXPECT_NEAR(w[0], 2 * 0.7310585786300049);
}

Test(reference, softmax_topk_plain) {
  /* softmax of (3, 2, 1, 0): 0.64391425988797, 0.23688281808991, ... */
  const float logits[4] = {1, 3, 2, 0};
  ref_route_cfg c = softmax_cfg(4, 2, 0);
  int ids[2];
  double w[2];
  ref_route_token(&c, logits, NULL, ids, w);
  cr_expect_eq(ids[0], 1);
  cr_expect_eq(ids[1], 2);
  EXPECT_NEAR(w[0], 0.6439142598879724);
  EXPECT_NEAR(w[1], 0.23688281808991013);
}

Test(reference, ties_go_to_the_lower_index) {
  const float logits[4] = {5, 7, 7, 5};
  ref_route_cfg c = softmax_cfg(4, 3, 1);
  int ids[3];
  double w[3];
  ref_route_token(&c, logits, NULL, ids, w);
  cr_expect_eq(ids[0], 1);
  cr_expect_eq(ids[1], 2);
  cr_expect_eq(ids[2], 0);
  EXPECT_NEAR(w[0], 0.4683105308334812); /* 1 / (2 + e^-2) */
  EXPECT_NEAR(w[1], 0.4683105308334812);
  EXPECT_NEAR(w[2], 0.06337893833303762);
  const float zeros[2] = {-0.0f, 0.0f}; /* -0 == +0: a tie */
  ref_route_cfg c1 = softmax_cfg(2, 1, 1);
  ref_route_token(&c1, zeros, NULL, ids, w);
  cr_expect_eq(ids[0], 0);
}

Test(reference, nan_counts_as_negative_infinity) {
  int ids[3];
  double w[3];
  const float some_nan[4] = {NAN, 1, NAN, -INFINITY};
  ref_route_cfg c = softmax_cfg(4, 2, 1);
  ref_route_token(&c, some_nan, NULL, ids, w);
  cr_expect_eq(ids[0], 1);
  cr_expect_eq(ids[1], 0, "NaN, NaN, -inf tie at -inf: lowest index");
  EXPECT_NEAR(w[0], 1.0);
  EXPECT_NEAR(w[1], 0.0);

  const float all_nan[4] = {NAN, NAN, NAN, NAN};
  c.renormalize = 0;
  ref_route_token(&c, all_nan, NULL, ids, w);
  cr_expect_eq(ids[0], 0);
  cr_expect_eq(ids[1], 1);
  EXPECT_NEAR(w[0], 0.25); /* uniform over E */
  EXPECT_NEAR(w[1], 0.25);

  const float two_inf[4] = {0, INFINITY, 3, INFINITY};
  c.top_k = 3;
  ref_route_token(&c, two_inf, NULL, ids, w);
  cr_expect_eq(ids[0], 1);
  cr_expect_eq(ids[1], 3);
  cr_expect_eq(ids[2], 2);
  EXPECT_NEAR(w[0], 0.5); /* the +inf logits share the mass */
  EXPECT_NEAR(w[1], 0.5);
  EXPECT_NEAR(w[2], 0.0);
}

/* E = 8 in 4 groups of 2, keep 2 groups, top-2, scale 2.5.
 * scores  s = sigmoid(0, 1, -1, 2, 3, -2, .5, .5)
 *           = .5, .7311, .2689, .8808, .9526, .1192, .6225, .6225
 * biased  b = .5, .7311, .2689, .8808, -.0474, .1192, .8225, .6225
 * merits: g0 1.2311, g1 1.1497, g2 .0718, g3 1.4449 -> keep g3, g0;
 * best kept: expert 6 (.8225), expert 1 (.7311). Expert 3 (.8808) sits in
 * a dropped group; expert 4 has the best score but a -1 bias. */
static const float grouped_logits[8] = {0, 1, -1, 2, 3, -2, 0.5f, 0.5f};
static const float grouped_bias[8] = {0, 0, 0, 0, -1, 0, 0.2f, 0};

static ref_route_cfg grouped_cfg(int renormalize) {
  ref_route_cfg c = {.experts = 8,
                     .top_k = 2,
                     .rule = 1,
                     .renormalize = renormalize,
                     .n_group = 4,
                     .topk_group = 2,
                     .scaling_factor = 2.5};
  return c;
}

Test(reference, sigmoid_grouped_topk) {
  ref_route_cfg c = grouped_cfg(1);
  int ids[2];
  double w[2];
  const double margin = ref_route_token(&c, grouped_logits, grouped_bias, ids, w);
  cr_expect_eq(ids[0], 6);
  cr_expect_eq(ids[1], 1);
  /* s6 / (s6 + s1) * 2.5 and s1 / (s6 + s1) * 2.5 */
  EXPECT_NEAR(w[0], 1.1497064920241424);
  EXPECT_NEAR(w[1], 1.3502935079758576);
  /* the cut between kept g0 (1.2311) and dropped g1 (1.1497) is the closest call */
  cr_expect(fabs(margin - 0.0813200792821275) < 1e-9, "margin %.17g", margin);

  c = grouped_cfg(0);
  ref_route_token(&c, grouped_logits, grouped_bias, ids, w);
  EXPECT_NEAR(w[0], 1.5561483280046364); /* s6 * 2.5 */
  EXPECT_NEAR(w[1], 1.8276464465750122); /* s1 * 2.5 */
}

Test(reference, grouped_ties_go_to_the_lower_group) {
  /* Two groups of 2 with equal merits; keep one: group 0 wins the tie. */
  const float logits[4] = {1, 2, 2, 1};
  ref_route_cfg c = {.experts = 4,
                     .top_k = 1,
                     .rule = 1,
                     .renormalize = 1,
                     .n_group = 2,
                     .topk_group = 1,
                     .scaling_factor = 1.0};
  int ids[1];
  double w[1];
  ref_route_token(&c, logits, NULL, ids, w);
  cr_expect_eq(ids[0], 1, "expert 2 ties expert 1 but sits in the dropped group 1");
  EXPECT_NEAR(w[0], 1.0);
}

Test(reference, sigmoid_zero_scores_keep_finite_weights) {
  const float logits[4] = {-INFINITY, NAN, -INFINITY, -INFINITY};
  const float bias[4] = {0, 0, 0.5f, 0};
  ref_route_cfg c = {.experts = 4,
                     .top_k = 2,
                     .rule = 1,
                     .renormalize = 1,
                     .n_group = 2,
                     .topk_group = 1,
                     .scaling_factor = 2.5};
  int ids[2];
  double w[2];
  ref_route_token(&c, logits, bias, ids, w);
  cr_expect_eq(ids[0], 2, "all scores 0: the bias decides");
  cr_expect_eq(ids[1], 3);
  EXPECT_NEAR(w[0], 0.0);
  EXPECT_NEAR(w[1], 0.0);
}

/* ---- align ---------------------------------------------------------------- */

/* ids per token: (2,0) (1,2) (2,3) (0,2), entries 0..7 */
static const int32_t align_ids[8] = {2, 0, 1, 2, 2, 3, 0, 2};

static void expect_ints(const int32_t *got, const int32_t *want, int n, const char *what) {
  for (int i = 0; i < n; i++)
    cr_expect_eq(got[i], want[i], "%s[%d] = %d, expected %d", what, i, got[i], want[i]);
}

Test(reference, align_all_experts) {
  ref_align_shape s = {.tokens = 4, .top_k = 2, .experts = 4, .first = 0, .last = 4, .tile_m = 2};
  ref_align_out o;
  cr_assert(ref_align_out_alloc(&s, &o));
  cr_assert_eq(o.tile_capacity, 8); /* min(8, 8/2 + 4) */
  ref_align(&s, align_ids, &o);
  expect_ints(o.counts, (int32_t[]){2, 1, 4, 1}, 4, "counts");
  expect_ints(o.offsets, (int32_t[]){0, 2, 3, 7, 8}, 5, "offsets");
  expect_ints(o.sorted_slot, (int32_t[]){1, 6, 2, 0, 3, 4, 7, 5}, 8, "sorted_slot");
  expect_ints(o.row_of, (int32_t[]){3, 0, 2, 4, 5, 7, 1, 6}, 8, "row_of");
  cr_expect_eq(o.num_tiles, 5);
  expect_ints(o.tile_expert, (int32_t[]){0, 1, 2, 2, 3, -1, -1, -1}, 8, "tile_expert");
  expect_ints(o.tile_row_start, (int32_t[]){0, 2, 3, 5, 7, -1, -1, -1}, 8, "tile_row_start");
  const char *m = ref_align_check(&s, align_ids, &o);
  cr_expect(m == NULL, "checker rejects the reference: %s", m);
  ref_align_out_free(&o);
}

Test(reference, align_expert_range) {
  ref_align_shape s = {.tokens = 4, .top_k = 2, .experts = 4, .first = 1, .last = 3, .tile_m = 2};
  ref_align_out o;
  cr_assert(ref_align_out_alloc(&s, &o));
  ref_align(&s, align_ids, &o);
  expect_ints(o.counts, (int32_t[]){0, 1, 4, 0}, 4, "counts");
  expect_ints(o.offsets, (int32_t[]){0, 0, 1, 5, 5}, 5, "offsets");
  expect_ints(o.sorted_slot, (int32_t[]){2, 0, 3, 4, 7, -1, -1, -1}, 8, "sorted_slot");
  expect_ints(o.row_of, (int32_t[]){1, -1, 0, 2, 3, -1, -1, 4}, 8, "row_of");
  cr_expect_eq(o.num_tiles, 3);
  expect_ints(o.tile_expert, (int32_t[]){1, 2, 2, -1, -1, -1, -1, -1}, 8, "tile_expert");
  expect_ints(o.tile_row_start, (int32_t[]){0, 1, 3, -1, -1, -1, -1, -1}, 8, "tile_row_start");
  cr_expect(ref_align_check(&s, align_ids, &o) == NULL);
  ref_align_out_free(&o);
}

Test(reference, align_checker_rejects_corruptions) {
  ref_align_shape s = {.tokens = 4, .top_k = 2, .experts = 4, .first = 0, .last = 4, .tile_m = 2};
  ref_align_out o;
  cr_assert(ref_align_out_alloc(&s, &o));
  ref_align(&s, align_ids, &o);

  /* rows 3 and 4 (both expert 2) swapped, row_of kept consistent: unstable */
  int32_t a = o.sorted_slot[3], b = o.sorted_slot[4];
  o.sorted_slot[3] = b, o.sorted_slot[4] = a, o.row_of[a] = 4, o.row_of[b] = 3;
  const char *m = ref_align_check(&s, align_ids, &o);
  cr_expect(m && strstr(m, "not stable"), "got: %s", m ? m : "(accepted)");
  ref_align(&s, align_ids, &o);

  o.row_of[5] = 6; /* the inverse points at a row holding another entry */
  cr_expect(ref_align_check(&s, align_ids, &o) != NULL);
  ref_align(&s, align_ids, &o);

  o.tile_expert[4] = -1; /* the last expert's tile missing */
  cr_expect(ref_align_check(&s, align_ids, &o) != NULL);
  ref_align(&s, align_ids, &o);

  o.sorted_slot[7] = 1; /* an entry placed twice, another lost */
  cr_expect(ref_align_check(&s, align_ids, &o) != NULL);
  ref_align(&s, align_ids, &o);

  o.counts[0] = 3; /* counts no longer match the offsets */
  cr_expect(ref_align_check(&s, align_ids, &o) != NULL);
  ref_align_out_free(&o);
}

Test(reference, align_duplicate_ids_in_a_token_stay_in_entry_order) {
  const int32_t ids[6] = {1, 1, 1, 0, 1, 1}; /* tokens (1,1) (1,0) (1,1) */
  ref_align_shape s = {.tokens = 3, .top_k = 2, .experts = 2, .first = 0, .last = 2, .tile_m = 4};
  ref_align_out o;
  cr_assert(ref_align_out_alloc(&s, &o));
  ref_align(&s, ids, &o);
  expect_ints(o.sorted_slot, (int32_t[]){3, 0, 1, 2, 4, 5}, 6, "sorted_slot");
  cr_expect_eq(o.tile_capacity, 3); /* min(6, 6/4 + 2): the bound is reached */
  cr_expect_eq(o.num_tiles, 3);     /* expert 0: 1 row, expert 1: 5 rows in tiles of 4 */
  expect_ints(o.tile_row_start, (int32_t[]){0, 1, 5}, 3, "tile_row_start");
  cr_expect(ref_align_check(&s, ids, &o) == NULL);
  ref_align_out_free(&o);
}

/* ---- combine -------------------------------------------------------------- */

Test(reference, combine_weighted_and_plain) {
  const float y[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}; /* rows 0, 1, 2 of width 3 */
  const int32_t row_of[4] = {2, 0, -1, 1};
  const float w[4] = {0.5f, 2, 3, 0.25f};
  double out[6], mag[6];
  ref_combine(2, 2, 3, y, row_of, w, out, mag);
  const double want[6] = {5.5, 8, 10.5, 1, 1.25, 1.5}; /* .5*(7,8,9)+2*(1,2,3); .25*(4,5,6) */
  for (int i = 0; i < 6; i++) EXPECT_NEAR(out[i], want[i]);
  EXPECT_NEAR(mag[0], 5.5);
  ref_combine(2, 2, 3, y, row_of, NULL, out, NULL);
  const double plain[6] = {8, 10, 12, 4, 5, 6};
  for (int i = 0; i < 6; i++) EXPECT_NEAR(out[i], plain[i]);
}
