// Warp-level helpers for the memory-bound kernels (route, align, combine):
// butterfly reductions, lane masks, and order-preserving integer keys for
// floats (so a warp argmax is one redux.sync instead of a shuffle tree).
#ifndef MOEJIT_COMMON_WARP_CUH
#define MOEJIT_COMMON_WARP_CUH

#define MJ_FULL_MASK 0xffffffffu

// Below the key of every float (even -inf): marks a slot that must never win
// an argmax (padding, already picked, or in a dropped group).
#define MJ_KEY_NONE (-2147483647 - 1)

__device__ __forceinline__ int mj_lane_id() {
  return (int)(threadIdx.x & 31u);
}

// Bits of the lanes below this one (for ranks inside a ballot/match mask).
__device__ __forceinline__ unsigned mj_lanemask_lt() {
  unsigned mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

// Bits needed to hold n: the smallest b with n < 2^b.
__host__ __device__ constexpr int mj_bit_width(int n) {
  return n == 0 ? 0 : 1 + mj_bit_width(n >> 1);
}

// The lanes whose v equals this lane's (the mask __match_any_sync returns),
// from kBits ballots, one per bit of v (v < 2^kBits). match.any's cost grows
// with the distinct values the warp holds; align's runs of 32 entries hold
// up to 32 distinct experts, where kBits (8 for 128 experts) ballots are
// cheaper (align's count: 3.97 against 5.02 µs on qwen3-30b-a3b at T = 2048,
// count + scan 5.63 against 6.72 at T = 256, H100, ncu).
template <int kBits>
__device__ __forceinline__ unsigned mj_match_any_bits(unsigned v) {
  unsigned peers = MJ_FULL_MASK;
#pragma unroll
  for (int b = 0; b < kBits; ++b) {
    const bool set = (v >> b) & 1u;
    const unsigned ballot = __ballot_sync(MJ_FULL_MASK, set);
    peers &= set ? ballot : ~ballot;
  }
  return peers;
}

// Sum over the warp by xor butterfly. Every lane ends with the same bits:
// at each level both partners add the same two partial sums (a+b == b+a),
// so the result does not depend on the lane and is the same run after run.
__device__ __forceinline__ float mj_warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(MJ_FULL_MASK, v, offset);
  return v;
}

__device__ __forceinline__ float mj_inf() {
  return __int_as_float(0x7f800000);
}

// NaN is ordered as -inf everywhere we select; -0 as +0 (they compare equal,
// so they must tie and fall to the lower index like any other tie).
__device__ __forceinline__ float mj_nan_to_neg_inf(float v) {
  return v != v ? -mj_inf() : v;
}

// A signed integer with the same order as the float: flip the magnitude bits
// of negatives. Lets __reduce_max_sync (one redux.sync on sm_80+) find a max.
__device__ __forceinline__ int mj_float_key(float v) {
  int bits = __float_as_int(mj_nan_to_neg_inf(v));
  if (bits == (int)0x80000000) bits = 0;  // -0 -> +0
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

__device__ __forceinline__ float mj_key_float(int key) {
  return __int_as_float(key ^ ((key >> 31) & 0x7fffffff));
}

#endif
