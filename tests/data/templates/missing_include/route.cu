// Test template including a file that does not exist (line 2).
#include "common/absent.cuh"

extern "C" __global__ void moejit_test_missing(float *out) { out[0] = 1.f; }
