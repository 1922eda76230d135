// Test template without an entry: only a device function and a declaration.
__device__ float helper(float x) { return x * 2.f; }
extern "C" __global__ void declared_only(float *out);
