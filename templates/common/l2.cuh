// L2 cache policies for the loads and stores that carry an
// L2::cache_hint: evict_first for data read once (streamed weights),
// evict_last for data the next reads come back to (gathered x rows, a GEMM
// output the layer's next kernel reads).
#ifndef MOEJIT_COMMON_L2_CUH
#define MOEJIT_COMMON_L2_CUH

__device__ __forceinline__ unsigned long long mj_l2_evict_first() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ unsigned long long mj_l2_evict_last() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

#endif
