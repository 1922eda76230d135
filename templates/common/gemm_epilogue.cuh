// Epilogue pieces shared by the grouped GEMMs: where each accumulator of the
// mma fragment lives in the tile, SwiGLU, and paired output stores.
#ifndef MOEJIT_COMMON_GEMM_EPILOGUE_CUH
#define MOEJIT_COMMON_GEMM_EPILOGUE_CUH

#include "common/dtype.cuh"

// silu(x) = x * sigmoid(x); for x -> -inf, expf(-x) = inf and x / inf = -0.
__device__ __forceinline__ float mj_silu(float x) { return x / (1.f + expf(-x)); }

// An m16n8 accumulator tile: registers {0,1} are row lane/4, columns
// 2*(lane%4) + {0,1}; registers {2,3} the same columns 8 rows further down.
__device__ __forceinline__ int mj_acc_row(int lane, int half) { return (lane >> 2) + half * 8; }
__device__ __forceinline__ int mj_acc_col(int lane) { return (lane & 3) * 2; }

// Stores two consecutive elements (p aligned to two elements) rounded to T.
template <typename T> __device__ __forceinline__ void mj_store2(T *p, float v0, float v1) {
  if constexpr (mj_dtype<T>::kBytes == 2) {
    const unsigned w = (mj_dtype<T>::from_float(v0) & 0xffffu) | (mj_dtype<T>::from_float(v1) << 16);
    *reinterpret_cast<unsigned *>(p) = w;
  } else {
    *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
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
