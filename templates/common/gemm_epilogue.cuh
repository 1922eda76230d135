// Epilogue pieces shared by the grouped GEMMs: where each accumulator of the
// mma fragment lives in the tile, SwiGLU, and paired output stores.
#ifndef MOEJIT_COMMON_GEMM_EPILOGUE_CUH
#define MOEJIT_COMMON_GEMM_EPILOGUE_CUH

#include "common/dtype.cuh"
#include "common/l2.cuh"
#include "common/warp.cuh"

// silu(x) = x * sigmoid(x), with the hardware's approximate exp2 and
// reciprocal (__expf: a few ulp; __fdividef: 2 ulp), far below the bf16 or
// fp16 rounding of h, and a third of the instructions of expf and an IEEE
// division, which GEMM 1's epilogue issues per output. For x -> -inf
// __expf(-x) = inf and __fdividef(x, inf) = -0 (below x = -87.3 it returns
// 0 where silu is under 1e-36); for x -> +inf the quotient is x.
__device__ __forceinline__ float mj_silu(float x) {
  return __fdividef(x, 1.f + __expf(-x));
}

// An m16n8 accumulator tile: registers {0,1} are row lane/4, columns
// 2*(lane%4) + {0,1}; registers {2,3} the same columns 8 rows further down.
__device__ __forceinline__ int mj_acc_row(int lane, int half) { return (lane >> 2) + half * 8; }

// Two floats rounded to a 2-byte T, packed low then high.
template <typename T>
__device__ __forceinline__ unsigned mj_pack2(float v0, float v1) {
  static_assert(mj_dtype<T>::kBytes == 2, "mj_pack2: 2-byte types only");
  return (mj_dtype<T>::from_float(v0) & 0xffffu) | (mj_dtype<T>::from_float(v1) << 16);
}

// Stores two consecutive elements (p aligned to two elements) rounded to T.
template <typename T> __device__ __forceinline__ void mj_store2(T *p, float v0, float v1) {
  if constexpr (mj_dtype<T>::kBytes == 2) {
    *reinterpret_cast<unsigned *>(p) = mj_pack2<T>(v0, v1);
  } else {
    *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
  }
}

// A GEMM output of at most this many bytes (about an H100's L2) is stored
// with an L2 evict_last policy: the layer's next kernel (GEMM 2 reading h,
// the combine reading y) then finds it in L2. Larger outputs are stored
// plainly, so they do not push out the weight tiles that the running GEMM's
// CTAs share (docs/gemm.md, "Output stores").
enum : long long { kMjKeepOutputBytes = 48LL << 20 };

template <typename T>
__device__ __forceinline__ bool mj_keep_output(int max_rows, int cols) {
  return (long long)max_rows * cols * (long long)sizeof(T) <= kMjKeepOutputBytes;
}

// 16 bytes to p (16-byte aligned); `keep` (mj_keep_output): with the L2
// evict_last policy.
template <typename T>
__device__ __forceinline__ void mj_store16(T *p, const uint4 &v, bool keep) {
  if (keep) {
    const unsigned long long policy = mj_l2_evict_last();
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w), "l"(policy)
                 : "memory");
  } else {
    *reinterpret_cast<uint4 *>(p) = v;
  }
}

// Stores one accumulator row of a thread's NI n8 groups: pair(i, &v0, &v1)
// gives the thread's two values of columns col0 + 8i + 2q and +1 (q = lane %
// 4, the mma/wgmma accumulator layout; the 4 lanes of a quad hold the same
// row). With NI a multiple of 4 and 2-byte T, each quad transposes every 4
// groups among its lanes (two xor-shuffle steps) so that lane q holds all 8
// columns of group 4m + q and stores them as one 16-byte vector: a warp
// store then covers whole 32-byte sectors (8 rows x 64 bytes) instead of
// half sectors, with a quarter of the store instructions. Every lane of the
// warp must call it (the vote and the shuffles); `store` says whether this
// lane's row is written. Groups at or past `limit` are skipped (col0 and limit multiples of
// 8, so a group is all in or all out; row pointer and col0 16-byte aligned).
// `keep` (mj_keep_output): the 16-byte stores carry the evict_last policy.
template <typename T, int NI, class Pair>
__device__ __forceinline__ void mj_store_acc_row(T *row_ptr, int col0, int limit, bool store,
                                                 const Pair &pair, bool keep = false) {
  const int q = (int)(threadIdx.x & 3u);
  if constexpr (NI % 4 == 0 && mj_dtype<T>::kBytes == 2) {
    // A warp whose rows all lie past the expert's end (most of a tile at
    // small T) has nothing to compute or store.
    if (!__any_sync(MJ_FULL_MASK, store)) return;
#pragma unroll
    for (int m = 0; m < NI / 4; ++m) {
      unsigned a[4];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        float v0, v1;
        pair(4 * m + s, &v0, &v1);
        a[s] = mj_pack2<T>(v0, v1);
      }
      // a[s] is (group 4m + s, column pair q); afterwards (group 4m + q,
      // column pair s). First swap the off-diagonal 2x2 blocks, then
      // transpose inside each block.
      const bool hi = (q & 2) != 0, lo = (q & 1) != 0;
      unsigned s0 = hi ? a[0] : a[2], s1 = hi ? a[1] : a[3];
      unsigned r0 = __shfl_xor_sync(MJ_FULL_MASK, s0, 2), r1 = __shfl_xor_sync(MJ_FULL_MASK, s1, 2);
      if (hi) {
        a[0] = r0;
        a[1] = r1;
      } else {
        a[2] = r0;
        a[3] = r1;
      }
      s0 = lo ? a[0] : a[1];
      s1 = lo ? a[2] : a[3];
      r0 = __shfl_xor_sync(MJ_FULL_MASK, s0, 1);
      r1 = __shfl_xor_sync(MJ_FULL_MASK, s1, 1);
      if (lo) {
        a[0] = r0;
        a[2] = r1;
      } else {
        a[1] = r0;
        a[3] = r1;
      }
      const int col = col0 + 32 * m + 8 * q;
      if (store && col < limit) mj_store16(row_ptr + col, make_uint4(a[0], a[1], a[2], a[3]), keep);
    }
  } else {
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      const int col = col0 + 8 * i + 2 * q;
      if (!store || col >= limit) continue;
      float v0, v1;
      pair(i, &v0, &v1);
      mj_store2(row_ptr + col, v0, v1);
    }
  }
}

// One element of T as float (any of float, __half, __nv_bfloat16).
template <typename T> __device__ __forceinline__ float mj_load1(const T *p) {
  if constexpr (mj_dtype<T>::kBytes == 2)
    return mj_dtype<T>::to_float(*reinterpret_cast<const unsigned short *>(p));
  else
    return mj_dtype<T>::to_float(*reinterpret_cast<const unsigned *>(p));
}

template <typename T> __device__ __forceinline__ void mj_store1(T *p, float v) {
  if constexpr (mj_dtype<T>::kBytes == 2)
    *reinterpret_cast<unsigned short *>(p) = (unsigned short)mj_dtype<T>::from_float(v);
  else
    *reinterpret_cast<unsigned *>(p) = mj_dtype<T>::from_float(v);
}

#endif
