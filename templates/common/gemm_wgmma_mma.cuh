// wgmma.mma_async m64nNk16 wrappers (fp32 accumulators, A and B from shared
// memory through descriptors, both K-major), one per N and element type.
// Their operands are regular: the N/2 accumulators %0..%(N/2-1), then desc_a,
// desc_b and the scale-d flag; the macros below spell each list once.
// Needs sm_90a.
#ifndef MOEJIT_COMMON_GEMM_WGMMA_MMA_CUH
#define MOEJIT_COMMON_GEMM_WGMMA_MMA_CUH

// "+f" operands for d[i .. i+7] and its multiples: the accumulators stay in
// the same registers across the asynchronous operation.
#define MJ_ACC8(i)                                                                            \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MJ_ACC16(i) MJ_ACC8(i), MJ_ACC8(i + 8)
#define MJ_ACC32(i) MJ_ACC16(i), MJ_ACC16(i + 16)
#define MJ_ACC64(i) MJ_ACC32(i), MJ_ACC32(i + 32)
#define MJ_ACC128(i) MJ_ACC64(i), MJ_ACC64(i + 64)

// The accumulators' operand names, N/2 of them.
#define MJ_WGMMA_REGS_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MJ_WGMMA_REGS_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MJ_WGMMA_REGS_128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MJ_WGMMA_REGS_256 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

template <int N, bool kBf16> struct mj_wgmma_op;

// acc[N/2] += A(64x16, desc_a) * B(Nx16, desc_b)^T with elements TY ("bf16"
// or "f16"); DA, DB, SCALE name the operands after the accumulators.
#define MJ_WGMMA_OP(N, BF16, TY, DA, DB, SCALE)                                              \
  template <> struct mj_wgmma_op<N, BF16> {                                                  \
    __device__ static __forceinline__ void mma(float (&d)[N / 2], unsigned long long desc_a, \
                                               unsigned long long desc_b) {                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                        \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " "          \
                   "{" MJ_WGMMA_REGS_##N "}, " DA ", " DB ", p, 1, 1, 0, 0;\n"               \
                   "}\n"                                                                     \
                   : MJ_ACC##N##_HALF(0)                                                     \
                   : "l"(desc_a), "l"(desc_b), "r"(1));                                      \
    }                                                                                        \
  };

// N/2 accumulators per N.
#define MJ_ACC32_HALF(i) MJ_ACC16(i)
#define MJ_ACC64_HALF(i) MJ_ACC32(i)
#define MJ_ACC128_HALF(i) MJ_ACC64(i)
#define MJ_ACC256_HALF(i) MJ_ACC128(i)

MJ_WGMMA_OP(32, true, "bf16", "%16", "%17", "%18")
MJ_WGMMA_OP(32, false, "f16", "%16", "%17", "%18")
MJ_WGMMA_OP(64, true, "bf16", "%32", "%33", "%34")
MJ_WGMMA_OP(64, false, "f16", "%32", "%33", "%34")
MJ_WGMMA_OP(128, true, "bf16", "%64", "%65", "%66")
MJ_WGMMA_OP(128, false, "f16", "%64", "%65", "%66")
MJ_WGMMA_OP(256, true, "bf16", "%128", "%129", "%130")
MJ_WGMMA_OP(256, false, "f16", "%128", "%129", "%130")

#endif
