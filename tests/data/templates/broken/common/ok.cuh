// A harmless shared header: the broken line is in route.cu.
__device__ inline int ok_twice(int x) { return 2 * x; }
