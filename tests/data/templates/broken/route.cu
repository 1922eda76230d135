// Test template with a deliberate error on line 6 (after an include).
#include "common/ok.cuh"

extern "C" __global__ void moejit_test_broken(float *out) {
  int i = ok_twice(threadIdx.x);
  out[i] = undefined_symbol_on_line_6;
}
