// Programmatic dependent launch (compute capability 9.0 and newer). The ops
// layer launches every kernel of a forward with stream serialization relaxed
// (src/runtime: mj_ctx_launch_dependent), so the next kernel is scheduled
// while this one drains instead of after a full launch round trip. That is
// safe only because every such kernel calls mj_pdl_enter() before it reads
// or writes memory: it waits until the kernel before it in the stream has
// completed and its writes are visible (which, kernel by kernel, orders the
// whole chain). The next kernel is let in as each block exits (no early
// griddepcontrol.launch_dependents): waiting blocks of the next kernel that
// took SMs early measured 11% slower on olmoe-1b-7b at T = 2048 (H100),
// where persistent GEMMs expect one CTA on every SM. On older archs, or
// launched plainly, it does nothing.
#ifndef MOEJIT_COMMON_PDL_CUH
#define MOEJIT_COMMON_PDL_CUH

__device__ __forceinline__ void mj_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#endif
