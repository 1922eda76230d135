// Element types as raw bits: conversion to and from float for float, __half
// and __nv_bfloat16, and loads/stores of N consecutive elements with the
// widest aligned vector accesses (16 bytes where the data allows).
// Working on bits (not on the CUDA vector structs) keeps every access a
// plain ld/st.global.v4 and avoids type punning through unions.
#ifndef MOEJIT_COMMON_DTYPE_CUH
#define MOEJIT_COMMON_DTYPE_CUH

// The largest power of two <= cap that divides n (cap a power of two).
__host__ __device__ constexpr int mj_pow2_divisor(int n, int cap) {
  return (cap <= 1 || n % cap == 0) ? cap : mj_pow2_divisor(n, cap / 2);
}

// The largest power of two <= n (n >= 1).
__host__ __device__ constexpr int mj_pow2_floor(int n) {
  return n < 2 ? 1 : 2 * mj_pow2_floor(n / 2);
}

// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int mj_pow2_ceil(int n) {
  return mj_pow2_floor(n) < n ? 2 * mj_pow2_floor(n) : mj_pow2_floor(n);
}

template <typename T>
struct mj_dtype;

template <>
struct mj_dtype<float> {
  enum : int { kBytes = 4 };
  __device__ static float to_float(unsigned bits) { return __uint_as_float(bits); }
  __device__ static unsigned from_float(float v) { return __float_as_uint(v); }
};

template <>
struct mj_dtype<__nv_bfloat16> {
  enum : int { kBytes = 2 };
  // bf16 is the top half of an fp32: widening is a shift, exact.
  __device__ static float to_float(unsigned bits) { return __uint_as_float(bits << 16); }
  // Round to nearest even (NaN stays NaN).
  __device__ static unsigned from_float(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

template <>
struct mj_dtype<__half> {
  enum : int { kBytes = 2 };
  __device__ static float to_float(unsigned bits) {
    return __half2float(__ushort_as_half((unsigned short)bits));
  }
  __device__ static unsigned from_float(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

// A register holding kBytes (2, 4, 8 or 16) of raw data.
template <int kBytes>
struct mj_raw;
template <>
struct mj_raw<2> {
  typedef unsigned short type;
};
template <>
struct mj_raw<4> {
  typedef unsigned type;
};
template <>
struct mj_raw<8> {
  typedef uint2 type;
};
template <>
struct mj_raw<16> {
  typedef uint4 type;
};

// 32-bit words of an N-element vector of T (a 2-byte element alone still
// takes one word).
template <typename T, int N>
struct mj_words {
  enum : int { kBytes = N * mj_dtype<T>::kBytes };
  enum : int { kCount = kBytes < 4 ? 1 : kBytes / 4 };
  // The widest access that divides the vector: 16, 8, 4 (or 2) bytes.
  enum : int { kAccess = mj_pow2_divisor(kBytes, 16) };
};

// Loads the raw words of N elements at p, which must be aligned to
// mj_words<T, N>::kAccess bytes.
template <typename T, int N>
__device__ __forceinline__ void mj_load_words(const T *__restrict__ p,
                                              unsigned (&w)[mj_words<T, N>::kCount]) {
  typedef mj_words<T, N> W;
  if constexpr (W::kBytes < 4) {
    w[0] = *reinterpret_cast<const unsigned short *>(p);
  } else {
    const char *c = reinterpret_cast<const char *>(p);
#pragma unroll
    for (int i = 0; i < W::kBytes / W::kAccess; ++i) {
      const int base = i * (W::kAccess / 4);
      if constexpr (W::kAccess == 16) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(c) + i);
        w[base] = v.x, w[base + 1] = v.y, w[base + 2] = v.z, w[base + 3] = v.w;
      } else if constexpr (W::kAccess == 8) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(c) + i);
        w[base] = v.x, w[base + 1] = v.y;
      } else {
        w[base] = __ldg(reinterpret_cast<const unsigned *>(c) + i);
      }
    }
  }
}

template <typename T, int N>
__device__ __forceinline__ void mj_store_words(T *__restrict__ p,
                                               const unsigned (&w)[mj_words<T, N>::kCount]) {
  typedef mj_words<T, N> W;
  if constexpr (W::kBytes < 4) {
    *reinterpret_cast<unsigned short *>(p) = (unsigned short)w[0];
  } else {
    char *c = reinterpret_cast<char *>(p);
#pragma unroll
    for (int i = 0; i < W::kBytes / W::kAccess; ++i) {
      const int base = i * (W::kAccess / 4);
      if constexpr (W::kAccess == 16) {
        reinterpret_cast<uint4 *>(c)[i] =
            make_uint4(w[base], w[base + 1], w[base + 2], w[base + 3]);
      } else if constexpr (W::kAccess == 8) {
        reinterpret_cast<uint2 *>(c)[i] = make_uint2(w[base], w[base + 1]);
      } else {
        reinterpret_cast<unsigned *>(c)[i] = w[base];
      }
    }
  }
}

// Element i of a word array holding N elements of T.
template <typename T>
__device__ __forceinline__ unsigned mj_word_elem(const unsigned *w, int i) {
  if constexpr (mj_dtype<T>::kBytes == 4)
    return w[i];
  else
    return (i & 1) ? (w[i >> 1] >> 16) : (w[i >> 1] & 0xffffu);
}

// N consecutive elements at p (aligned as mj_load_words says) as floats.
template <typename T, int N>
__device__ __forceinline__ void mj_load_floats(const T *__restrict__ p, float (&out)[N]) {
  unsigned w[mj_words<T, N>::kCount];
  mj_load_words<T, N>(p, w);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = mj_dtype<T>::to_float(mj_word_elem<T>(w, i));
}

// Rounds N floats to T and stores them at p (aligned as mj_store_words says).
template <typename T, int N>
__device__ __forceinline__ void mj_store_floats(T *__restrict__ p, const float (&in)[N]) {
  unsigned w[mj_words<T, N>::kCount];
  if constexpr (mj_dtype<T>::kBytes == 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = mj_dtype<T>::from_float(in[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const unsigned lo = mj_dtype<T>::from_float(in[i]);
      const unsigned hi = i + 1 < N ? mj_dtype<T>::from_float(in[i + 1]) : 0u;
      w[i >> 1] = lo | (hi << 16);
    }
  }
  mj_store_words<T, N>(p, w);
}

template <typename T>
__device__ __forceinline__ float mj_load_float(const T *p) {
  float v[1];
  mj_load_floats<T, 1>(p, v);
  return v[0];
}

#endif
