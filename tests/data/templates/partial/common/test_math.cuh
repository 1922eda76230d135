// Test-only shared header: includes its sibling by bare name (nested include).
#pragma once
#include "test_types.cuh"

template <typename T>
__device__ __forceinline__ float to_f32(T v) {
  return static_cast<float>(v);
}

__device__ __forceinline__ float scaled(float w) {
  return w * mj_scaling_factor();
}
