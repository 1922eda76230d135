// Test template whose include holds the error (common/bad.cuh line 3).
#include "common/bad.cuh"

extern "C" __global__ void moejit_test_broken_common(float *out) { out[0] = bad_value(); }
