// A shared header with a deliberate error on line 3.
__device__ inline float bad_value() {
  return not_declared_in_bad_cuh;
}
