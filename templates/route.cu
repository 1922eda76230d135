// Router: logits [T, E] (logits_t) -> topk_ids [T, k] (int32) and
// topk_weights [T, k] (fp32), for the rule fixed at JIT time (kRouteRule).
// Rules, tie and NaN policy: docs/kernels.md, "route".
//
// Why it is fast: one warp per token and the whole logits row in registers
// (kSlots values per lane, loaded with 16-byte vectors). Each of the k rounds
// of argmax is three warp instructions (redux.sync on an order-preserving
// integer key, a ballot to find the lowest lane holding the max, one shuffle
// for the expert id); the winner promotes its cached second-best slot and
// rescans its own registers only when it wins a second time in a row. Nothing
// touches shared memory; logits are read once; outputs are written by lanes
// 0..k-1 in one coalesced store each.
#include "common/route.cuh"

enum : int { kWarpsPerBlock = kBlockThreads / 32 };
static_assert(kBlockThreads % 32 == 0, "route: block_threads must be a multiple of 32");

// One warp per token; blocks of kWarpsPerBlock tokens. `bias` (fp32 [E], may
// be NULL: zero) is read by the sigmoid rule only.
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_route_topk(const logits_t *__restrict__ logits, const float *__restrict__ bias,
                      int tokens, int *__restrict__ topk_ids, float *__restrict__ topk_weights) {
  const long long token = (long long)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= tokens) return;  // the whole warp leaves together
  const int lane = mj_lane_id();
  const logits_t *row = logits + (size_t)token * kExperts;

  int expert;
  float weight;
  route_token(row, bias, lane, expert, weight);

  if (lane < kTopK) {
    topk_ids[(size_t)token * kTopK + lane] = expert;
    topk_weights[(size_t)token * kTopK + lane] = weight;
  }
}
