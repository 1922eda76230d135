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

// ---- router logits: logits [T, E] = x [T, d] . gate [E, d]^T ---------------
// For callers that hold the router's weight rather than its logits
// (moejit_router_logits, moejit_moe_args.gate_weight). Sums in fp32, rounded
// to logits_t once. Three forms, picked on the host by T and the device's
// SMs (src/ops/route.c, mj_router_logits_launch):
// - _warps (T <= 8, and every T where x and the weight are not one 16-bit
//   type): a block of 8 warps takes up to 8 tokens and `eb` experts (1, 2
//   or 4: as many as still give every SM two blocks), its 256 threads
//   splitting the rows into 16-byte chunks (thread i: chunks i, i + 256,
//   ...), each thread summing its chunks in order, then each warp's
//   butterfly, then the 8 warps' sums in warp order in shared memory. A
//   logit's sum is then the same whatever eb, T or the token's place in
//   the call.
// - _mma (32 x 64 tiles, tokens x experts, 4 warps, 8 stages: deep, since
//   few such tiles run at small T) and _mma_wide (128 x 128, 8 warps, 3
//   stages, for calls with half a wave of such tiles): mma.sync through
//   the GEMMs' cp.async pipeline (common/gemm_mainloop.cuh), where x and
//   the weight share a 16-bit type. Within one shape and unsplit a logit's
//   sum does not depend on the other tokens either; d split into parts (the
//   host's choice, by T) sums in another order; the forms differ in the
//   last bits.
#include "common/gemm_mainloop.cuh"
#include "common/gemm_epilogue.cuh"

enum : int { kRouterTokens = 8, kRouterExperts = 4 };  // a warps block's most (host: MJ_ROUTER_*)
enum : int { kRouterThreads = 256 };
enum : int { kRouterChunks = kHidden / 8 };  // 8-element chunks of a row (kHidden % 8 == 0)
typedef mj_gemm_shape<32, 64, 64, 8, 4> RouterShape;        // host: MJ_ROUTER_TILE*
typedef mj_gemm_shape<128, 128, 64, 3, 8> RouterWideShape;  // host: MJ_ROUTER_WIDE*

static_assert(kHidden % 8 == 0, "router logits: hidden must be a multiple of 8");
static_assert(128LL * kHidden < (1LL << 31), "router logits: a tile's rows must fit int32 offsets");

// Block items i = (token group, expert block), the expert block fastest;
// the grid may be smaller than the items (a block then takes i, i + grid,
// ...). eb: experts an item, 1..kRouterExperts.
extern "C" __global__ void __launch_bounds__(kRouterThreads, 2)
    moejit_router_logits_warps(const act_t *__restrict__ x, const weight_t *__restrict__ gate,
                               int tokens, logits_t *__restrict__ logits, int eb) {
  __shared__ float part[kRouterThreads / 32][kRouterExperts * kRouterTokens];
  const int eblocks = (kExperts + eb - 1) / eb;
  const long long groups = (tokens + (long long)kRouterTokens - 1) / kRouterTokens;
  const long long items = groups * eblocks;
  const int lane = mj_lane_id(), warp = threadIdx.x / 32;
#pragma unroll 1
  for (long long it = blockIdx.x; it < items; it += gridDim.x) {
    const int e0 = (int)(it % eblocks) * eb, t0 = (int)(it / eblocks) * kRouterTokens;
    const int n = tokens - t0 < kRouterTokens ? tokens - t0 : kRouterTokens;
    const int ne = kExperts - e0 < eb ? kExperts - e0 : eb;
    float acc[kRouterExperts][kRouterTokens];
#pragma unroll
    for (int j = 0; j < kRouterExperts; ++j)
#pragma unroll
      for (int t = 0; t < kRouterTokens; ++t) acc[j][t] = 0.f;
#pragma unroll 2
    for (int c = threadIdx.x; c < kRouterChunks; c += kRouterThreads) {
      float w[kRouterExperts][8];
#pragma unroll
      for (int j = 0; j < kRouterExperts; ++j)
        if (j < ne) mj_load_floats<weight_t, 8>(gate + (long long)(e0 + j) * kHidden + c * 8, w[j]);
#pragma unroll
      for (int t = 0; t < kRouterTokens; ++t) {
        if (t < n) {
          float v[8];
          mj_load_floats<act_t, 8>(x + (long long)(t0 + t) * kHidden + c * 8, v);
#pragma unroll
          for (int j = 0; j < kRouterExperts; ++j)
            if (j < ne)
#pragma unroll
              for (int i = 0; i < 8; ++i) acc[j][t] = fmaf(v[i], w[j][i], acc[j][t]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kRouterExperts; ++j)
#pragma unroll
      for (int t = 0; t < kRouterTokens; ++t)
        if (j < ne && t < n) {
          const float sum = mj_warp_sum(acc[j][t]);
          if (lane == 0) part[warp][j * kRouterTokens + t] = sum;
        }
    __syncthreads();
    const int j = threadIdx.x / kRouterTokens, t = threadIdx.x % kRouterTokens;
    if (j < ne && t < n) {
      float sum = part[0][threadIdx.x];
#pragma unroll
      for (int w2 = 1; w2 < kRouterThreads / 32; ++w2) sum += part[w2][threadIdx.x];
      mj_store1(logits + (long long)(t0 + t) * kExperts + e0 + j, sum);
    }
    __syncthreads();  // part is rewritten by the next item
  }
}

// A template, so that the branch not taken is never instantiated (mixed or
// 32-bit types have no mma). K part blockIdx.z: k-tiles [z * per, +per);
// part NULL: one part, the logits stored; else fp32 sums to part[z][T][E],
// which moejit_router_logits_sum adds in part order.
template <class S, typename AT, typename WT>
__device__ __forceinline__ void mj_router_mma(const AT *__restrict__ x, const WT *__restrict__ gate,
                                              int tokens, logits_t *__restrict__ logits,
                                              float *__restrict__ part, int per) {
  if constexpr (!(mj_same_type<AT, WT>::value && mj_is_mma_type<AT>::value)) {
    __trap();  // the host launches the warps form for these dtypes
  } else {
    mj_gemm_check_smem<S>();
    constexpr int kTiles = (kHidden + S::kTK - 1) / S::kTK;
    const int t0 = (int)blockIdx.x * S::kTM, e0 = (int)blockIdx.y * S::kTN;
    const int kt0 = (int)blockIdx.z * per, kt1 = kt0 + per < kTiles ? kt0 + per : kTiles;
    mj_tile_loader<S, S::kTM, kHidden> la;
    la.init(mj_a_rows<kHidden>{tokens - t0});
    mj_tile_loader<S, S::kTN, kHidden> lb;
    lb.init(mj_a_rows<kHidden>{kExperts - e0});
    const mj_warp_pos p = mj_gemm_warp_pos<S>();
    float acc[S::kMi][S::kNi][4];
    mj_gemm_mainloop_range<S, kHidden>(la, x + (long long)t0 * kHidden, lb,
                                       gate + (long long)e0 * kHidden, mj_smem_u32(mj_gemm_smem), p,
                                       acc, kt0, kt1);
    if (!mj_gemm_reduce_k<S>(reinterpret_cast<float *>(mj_gemm_smem), p, acc)) return;
    float *sums = part ? part + (long long)blockIdx.z * tokens * kExperts : nullptr;
#pragma unroll
    for (int mi = 0; mi < S::kMi; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = t0 + p.m0 + mi * 16 + mj_acc_row(p.lane, half);
        if (row >= tokens) continue;
#pragma unroll
        for (int ni = 0; ni < S::kNi; ++ni) {
          const int col = e0 + p.n0 + ni * 8 + 2 * (p.lane & 3);
          const long long at = (long long)row * kExperts + col;
          for (int c = 0; c < 2; ++c) {
            if (col + c >= kExperts) break;
            const float v = acc[mi][ni][2 * half + c];
            if (sums)
              sums[at + c] = v;
            else
              mj_store1(logits + at + c, v);
          }
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(RouterShape::kThreads)
    moejit_router_logits_mma(const act_t *__restrict__ x, const weight_t *__restrict__ gate,
                             int tokens, logits_t *__restrict__ logits, float *__restrict__ part,
                             int per) {
  mj_router_mma<RouterShape>(x, gate, tokens, logits, part, per);
}

extern "C" __global__ void __launch_bounds__(RouterWideShape::kThreads)
    moejit_router_logits_mma_wide(const act_t *__restrict__ x, const weight_t *__restrict__ gate,
                                  int tokens, logits_t *__restrict__ logits,
                                  float *__restrict__ part, int per) {
  mj_router_mma<RouterWideShape>(x, gate, tokens, logits, part, per);
}

// logits[i] = part[0][i] + part[1][i] + ... in part order (n = T * E).
extern "C" __global__ void __launch_bounds__(256)
    moejit_router_logits_sum(const float *__restrict__ part, int parts, long long n,
                             logits_t *__restrict__ logits) {
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < n;
       i += (long long)gridDim.x * 256) {
    float sum = part[i];
    for (int z = 1; z < parts; ++z) sum += part[z * n + i];
    mj_store1(logits + i, sum);
  }
}
