// The routing rules as warp-level device functions: one warp routes one
// token's logits row (kExperts values of logits_t) to its k picks, lane j
// holding pick j's expert id and weight. templates/route.cu runs them one
// warp per token; the decode layer (templates/gemm1.cu) runs them inside the
// GEMM so a decode step needs no router launch. Rules, tie and NaN policy:
// docs/kernels.md, "route".
#ifndef MOEJIT_COMMON_ROUTE_CUH
#define MOEJIT_COMMON_ROUTE_CUH

#include "common/dtype.cuh"
#include "common/warp.cuh"

// --- lane layout ----------------------------------------------------------
// Experts come in kGroups groups of kGroupSize (one group for softmax). Each
// group owns kLanesPerGroup consecutive lanes (a power of two, so the group
// reductions below are xor butterflies that never leave the group), and each
// lane holds kSlots consecutive experts of its group. Expert order is then
// (lane, slot) order: "lowest lane, then lowest slot" is "lowest expert".
enum : int { kGroups = kRouteRule == 1 ? kNumGroups : 1 };
enum : int { kGroupSize = kExperts / kGroups };
enum : int { kLanesPerGroup = mj_pow2_floor(32 / kGroups) };
enum : int { kSlots = (kGroupSize + kLanesPerGroup - 1) / kLanesPerGroup };
// Every lane that holds experts holds kSlots of them: the row can be loaded
// with vectors (aligned, since group and lane starts are kSlots multiples).
enum : bool { kFullSlots = kGroupSize % kSlots == 0 };

static_assert(kRouteRule == 0 || kRouteRule == 1, "unknown routing rule");
static_assert(kGroups >= 1 && kGroups <= 32 && kExperts % kGroups == 0,
              "route: n_group must divide the experts and be at most 32");
static_assert(kSlots <= 32, "route: at most 1024 experts (32 per lane)");
static_assert(kTopK >= 1 && kTopK <= 32, "route: top_k must be 1..32");
static_assert(kRouteRule == 0 || kTopK <= kTopkGroup * kGroupSize,
              "route: top_k exceeds the experts of the kept groups");

// Experts of this lane: [first, first + count) with count in 0..kSlots.
struct lane_experts {
  int first;
  int count;
};

__device__ __forceinline__ lane_experts experts_of_lane(int lane) {
  const int group = lane / kLanesPerGroup;
  const int in_group = (lane % kLanesPerGroup) * kSlots;
  lane_experts le;
  le.first = group * kGroupSize + in_group;
  le.count = group < kGroups ? min(kSlots, max(0, kGroupSize - in_group)) : 0;
  return le;
}

// This lane's values of a row (logits or bias), NaN as -inf, padding -inf.
template <typename T>
__device__ __forceinline__ void load_slots(const T *__restrict__ row, lane_experts le,
                                           float (&v)[kSlots]) {
  if (kFullSlots && le.count == kSlots) {
    mj_load_floats<T, kSlots>(row + le.first, v);
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) v[s] = s < le.count ? mj_load_float(row + le.first + s) : 0.0f;
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) v[s] = s < le.count ? mj_nan_to_neg_inf(v[s]) : -mj_inf();
}

// This lane's two best slots not yet picked (bit s of `used` set: slot s was
// picked). Strict > keeps the lowest slot first among equal keys.
struct lane_top2 {
  int key1, slot1, key2, slot2;
};

__device__ __forceinline__ lane_top2 lane_best_two(const int (&key)[kSlots], unsigned used) {
  lane_top2 t = {MJ_KEY_NONE, 0, MJ_KEY_NONE, 0};
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int k = (used >> s) & 1u ? MJ_KEY_NONE : key[s];
    if (k > t.key1) {
      t.key2 = t.key1, t.slot2 = t.slot1;
      t.key1 = k, t.slot1 = s;
    } else if (k > t.key2) {
      t.key2 = k, t.slot2 = s;
    }
  }
  return t;
}

// k rounds of warp argmax over the keys. Lane j (< kTopK) receives the j-th
// pick: its expert id and key. Ties go to the lowest expert.
// Each lane offers its best remaining key; the winner promotes its cached
// second best and rescans its slots only when it wins again with no second
// cached, so most rounds cost a handful of instructions instead of a
// kSlots-wide rescan.
__device__ __forceinline__ void warp_topk(const int (&key)[kSlots], int lane, int first_expert,
                                          int &pick_expert, int &pick_key) {
  unsigned used = 0;
  lane_top2 t = lane_best_two(key, used);
  bool have_second = true;
#pragma unroll
  for (int j = 0; j < kTopK; ++j) {
    const int top = __reduce_max_sync(MJ_FULL_MASK, t.key1);
    const int winner = __ffs(__ballot_sync(MJ_FULL_MASK, t.key1 == top)) - 1;
    const int expert = __shfl_sync(MJ_FULL_MASK, first_expert + t.slot1, winner);
    if (lane == j) pick_expert = expert, pick_key = top;
    if (j + 1 < kTopK && lane == winner) {
      used |= 1u << t.slot1;
      if (have_second) {
        t.key1 = t.key2, t.slot1 = t.slot2;
        have_second = false;
      } else {
        t = lane_best_two(key, used);
        have_second = true;
      }
    }
  }
}

// exp(x - max) with the infinite cases taken as their limits: the max itself
// (also when it is +inf or -inf) weighs 1, so a row of -inf (or NaN) logits
// is uniform and +inf logits share all the mass.
__device__ __forceinline__ float shifted_exp(float x, float max) {
  return x == max ? 1.0f : expf(x - max);
}

// NaN logits count as -inf, so their score is 0. The reciprocal is the
// hardware's (within 1 ulp; 1/inf = 0) rather than IEEE division: scores stay
// within a few ulp of float64, far inside the weight tolerance, and the
// route kernel is instruction-bound.
__device__ __forceinline__ float sigmoid(float x) {
  const float d = 1.0f + expf(-mj_nan_to_neg_inf(x));
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
}

// Pairwise sum of a lane's slots: log2(kSlots) rounding steps instead of
// kSlots - 1 (with the warp's butterfly, the whole softmax denominator is a
// pairwise tree: its error stays well inside the 1e-6 weight tolerance).
__device__ __forceinline__ float pairwise_sum(float (&v)[kSlots]) {
#pragma unroll
  for (int stride = 1; stride < kSlots; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < kSlots; i += 2 * stride) v[i] += v[i + stride];
  return v[0];
}

// --- softmax -> top-k (Mixtral, Qwen3-MoE, OLMoE) --------------------------
// Selection on the logits themselves: softmax is monotonic, and comparing the
// inputs is exact, so ids never depend on exp rounding.
__device__ __forceinline__ void route_softmax(const logits_t *__restrict__ row, int lane,
                                              int &pick_expert, float &weight) {
  const lane_experts le = experts_of_lane(lane);
  float x[kSlots];
  load_slots(row, le, x);
  int key[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) key[s] = s < le.count ? mj_float_key(x[s]) : MJ_KEY_NONE;

  int pick_key = MJ_KEY_NONE;
  pick_expert = -1;
  warp_topk(key, lane, le.first, pick_expert, pick_key);
  const float max = mj_key_float(__shfl_sync(MJ_FULL_MASK, pick_key, 0));  // the first pick
  const float e = lane < kTopK ? shifted_exp(mj_key_float(pick_key), max) : 0.0f;

  float denom;
  if (kRenormalize) {
    denom = mj_warp_sum(e);  // over the k picks; >= 1 since the max is one
  } else {
    float e_all[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) e_all[s] = s < le.count ? shifted_exp(x[s], max) : 0.0f;
    denom = mj_warp_sum(pairwise_sum(e_all));
  }
  weight = e / denom * mj_scaling_factor();
}

// --- sigmoid + bias, grouped top-k (DeepSeek-V3) ----------------------------
// Biased scores choose; unbiased scores weigh. A group's merit is the sum of
// its two best biased scores (its best one if it has one expert); the
// kTopkGroup best groups (ties: lower group) stay, the others never win.
__device__ __forceinline__ bool group_kept(const float (&biased)[kSlots], lane_experts le,
                                           int lane) {
  if (kGroups == 1) return true;
  float top1 = -mj_inf(), top2 = -mj_inf();
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s < le.count) {
      top2 = fmaxf(top2, fminf(top1, biased[s]));
      top1 = fmaxf(top1, biased[s]);
    }
  }
#pragma unroll
  for (int offset = 1; offset < kLanesPerGroup; offset <<= 1) {
    const float o1 = __shfl_xor_sync(MJ_FULL_MASK, top1, offset);
    const float o2 = __shfl_xor_sync(MJ_FULL_MASK, top2, offset);
    top2 = fmaxf(fminf(top1, o1), fmaxf(top2, o2));
    top1 = fmaxf(top1, o1);
  }
  const float merit = mj_nan_to_neg_inf(kGroupSize >= 2 ? top1 + top2 : top1);
  // Rank of this lane's group: groups with a better merit, or an equal merit
  // and a lower index, go first. Every lane gathers all kGroups merits.
  const int group = lane / kLanesPerGroup;
  int rank = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const float other = __shfl_sync(MJ_FULL_MASK, merit, g * kLanesPerGroup);
    rank += (other > merit || (other == merit && g < group)) ? 1 : 0;
  }
  return group < kGroups && rank < kTopkGroup;
}

__device__ __forceinline__ void route_sigmoid(const logits_t *__restrict__ row,
                                              const float *__restrict__ bias, int lane,
                                              int &pick_expert, float &weight) {
  const lane_experts le = experts_of_lane(lane);
  float x[kSlots], b[kSlots];
  load_slots(row, le, x);
  if (bias) {
    load_slots(bias, le, b);
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) b[s] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) b[s] = sigmoid(x[s]) + b[s];  // NaN-free: both were cleaned

  const bool kept = group_kept(b, le, lane);
  int key[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) key[s] = kept && s < le.count ? mj_float_key(b[s]) : MJ_KEY_NONE;

  int pick_key = MJ_KEY_NONE;
  pick_expert = -1;
  warp_topk(key, lane, le.first, pick_expert, pick_key);
  // The pick's unbiased score, recomputed from its logit by the same code as
  // above (same bits); one cached load per lane instead of carrying scores
  // through every round.
  const float score = lane < kTopK ? sigmoid(mj_load_float(row + pick_expert)) : 0.0f;
  // 1e-20 keeps a row of zero scores (all logits -inf) at weight 0, not NaN.
  weight = (kRenormalize ? score / (mj_warp_sum(score) + 1e-20f) : score) * mj_scaling_factor();
}

// The rule fixed at JIT time (kRouteRule) on one token's row: lane j < k
// ends with pick j's expert and weight.
__device__ __forceinline__ void route_token(const logits_t *__restrict__ row, const float *__restrict__ bias,
                                            int lane, int &pick_expert, float &weight) {
  if constexpr (kRouteRule == 0)
    route_softmax(row, lane, pick_expert, weight);
  else
    route_sigmoid(row, bias, lane, pick_expert, weight);
}

#endif
