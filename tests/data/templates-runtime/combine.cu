// Test kernels for the runtime's GPU tests (tests/gpu/test_runtime.c), used
// through the compiler's template_dir option as the "combine" family. Their
// results are exact integers, so the host can check every element.

// y[i] = x[i] * mul + add + kTopK (unsigned, wrapping): kTopK comes from the
// generated prelude, so a right answer also shows the spec reached the kernel.
extern "C" __global__ void mj_rt_affine(const unsigned* __restrict__ x, unsigned* __restrict__ y,
                                        unsigned n, unsigned mul, unsigned add) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * mul + add + (unsigned)kTopK;
}

// Reverses each block's chunk of per_block words through dynamic shared
// memory: launched with more than 48 KiB it needs the opt-in the runtime
// sets up.
extern "C" __global__ void mj_rt_block_reverse(const unsigned* __restrict__ x,
                                               unsigned* __restrict__ y, unsigned per_block) {
  extern __shared__ unsigned chunk[];
  const unsigned base = blockIdx.x * per_block;
  for (unsigned i = threadIdx.x; i < per_block; i += blockDim.x) chunk[i] = x[base + i];
  __syncthreads();
  for (unsigned i = threadIdx.x; i < per_block; i += blockDim.x)
    y[base + i] = chunk[per_block - 1 - i];
}
