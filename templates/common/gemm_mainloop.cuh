// The sm_80-style main loop shared by gemm1 and gemm2: a kStages-deep
// cp.async pipeline (16-byte copies, global -> shared, zero-filled where rows
// or k run past the data), XOR-swizzled shared tiles read with ldmatrix, and
// mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulators). Runs on sm_80 and
// sm_90. Operand layouts: A [rows, K] and B [cols, K], both K-contiguous
// ("row.col" for mma: B rows are the output's columns).
#ifndef MOEJIT_COMMON_GEMM_MAINLOOP_CUH
#define MOEJIT_COMMON_GEMM_MAINLOOP_CUH

#include "common/gemm_config.cuh"
#include "common/l2.cuh"

// --- PTX wrappers -----------------------------------------------------------

__device__ __forceinline__ unsigned mj_smem_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, bypassing L1; `valid` false writes 16 zero bytes
// and reads nothing (src-size 0), which is how masked rows and k-tails read.
__device__ __forceinline__ void mj_cp_async16(unsigned dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// The same copy with the L2 policy `policy` (common/l2.cuh).
__device__ __forceinline__ void mj_cp_async16(unsigned dst, const void *src, bool valid,
                                              unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void mj_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void mj_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mj_ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile; T selects the bf16 or fp16 instruction.
template <typename T>
__device__ __forceinline__ void mj_mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
  if constexpr (mj_same_type<T, __nv_bfloat16>::value) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// --- shared-memory tile layout ----------------------------------------------
// Row r of a tile holds kChunks 16-byte chunks; logical chunk c sits at
// c ^ f(r). ldmatrix reads one chunk column of 8 consecutive rows: with the
// XOR those 8 chunks fall in 8 different 16-byte bank groups. With 8 or 16
// chunks per row (128+ bytes) f(r) = r % 8; with 4 (two rows per 128 bytes)
// f(r) = (r / 2) % 4, since rows r and r+1 already differ in the upper half.
template <class S> __device__ __forceinline__ int mj_swizzle(int row, int chunk) {
  constexpr int kRowsPerLine = S::kChunks >= 8 ? 1 : 8 / S::kChunks;
  constexpr int kMask = (S::kChunks >= 8 ? 8 : S::kChunks) - 1;
  return chunk ^ ((row / kRowsPerLine) & kMask);
}

// Byte offset of (row, chunk) inside one stage of a tile.
template <class S> __device__ __forceinline__ unsigned mj_tile_offset(int row, int chunk) {
  return (unsigned)(row * S::kChunks + mj_swizzle<S>(row, chunk)) * 16u;
}

// --- global -> shared copies of one operand tile ----------------------------
// A ROWS x TK tile is ROWS * kChunks chunks. Thread t always copies chunk
// column t % kChunks of rows t / kChunks + j * kRowStep: its source rows and
// destination offsets are fixed for the whole K loop, so they are computed
// once. kRowStep is a multiple of the swizzle period (8 rows), hence the
// swizzled column is the same for all j.
template <class S, int ROWS, int K> struct mj_tile_loader {
  enum : int { kTotal = ROWS * S::kChunks };
  enum : int { kPerThread = (kTotal + S::kThreads - 1) / S::kThreads };
  enum : int { kRowStep = S::kThreads / S::kChunks };
  static_assert(kRowStep % 8 == 0, "a thread's rows must share one swizzle phase");

  int row_elems[kPerThread]; // element offset of the row in the operand
  unsigned valid;            // bit j: row j exists (else zero-filled)
  int chunk;                 // this thread's chunk column
  unsigned dst0;             // byte offset of the first chunk in a stage

  // row_of(r) gives the element offset of tile row r in the operand (relative
  // to the base pointer passed to copy), or -1 for a masked row.
  template <class RowOf> __device__ __forceinline__ void init(const RowOf &row_of) {
    chunk = threadIdx.x % S::kChunks;
    const int first = threadIdx.x / S::kChunks;
    dst0 = mj_tile_offset<S>(first, chunk);
    valid = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int r = first + j * kRowStep;
      const int off = r < ROWS ? row_of(r) : -1;
      row_elems[j] = off < 0 ? 0 : off;
      if (off >= 0) valid |= 1u << j;
    }
  }

  // Issues the copies of k-tile [k0, k0 + TK) into the stage at `stage`.
  template <typename T>
  __device__ __forceinline__ void copy(unsigned stage, const T *base, int k0) const {
    const int k = k0 + chunk * 8;
    const bool k_ok = k < K; // K % 8 == 0: a chunk is all in or all out
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (kTotal % S::kThreads != 0 && (int)threadIdx.x + j * S::kThreads >= kTotal) break;
      const bool ok = k_ok && ((valid >> j) & 1u);
      const T *src = ok ? base + row_elems[j] + k : base;
      mj_cp_async16(stage + dst0 + (unsigned)(j * kRowStep * S::kChunks * 16), src, ok);
    }
  }
};

// Dynamic shared memory of the GEMM kernels: the pipeline stages, reused by
// the k-split reduction.
extern __shared__ __align__(128) unsigned char mj_gemm_smem[];

// Tile row r of A -> its element offset r * K while r < rows (the CTA's
// rows of the expert), else masked.
template <int K> struct mj_a_rows {
  int rows;
  __device__ int operator()(int r) const { return r < rows ? r * K : -1; }
};

// --- the warp's place in the tile -------------------------------------------
struct mj_warp_pos {
  int lane;
  int m0, n0; // first row / column of the warp's tile inside the CTA tile
  int wk;     // which k-split this warp sums (0 when kWarpsK == 1)
};

template <class S> __device__ __forceinline__ mj_warp_pos mj_gemm_warp_pos() {
  const int warp = threadIdx.x / 32;
  mj_warp_pos p;
  p.lane = threadIdx.x % 32;
  const int mn = S::kWarpsK == 1 ? warp : warp % S::kWarpsMN;
  p.wk = S::kWarpsK == 1 ? 0 : warp / S::kWarpsMN;
  p.m0 = (mn / S::kWarpsN) * S::kWarpTM;
  p.n0 = (mn % S::kWarpsN) * S::kWarpTN;
  return p;
}

// One k-tile from shared memory: this warp's k16 steps, all its mma tiles.
template <class S, typename T>
__device__ __forceinline__ void mj_gemm_tile_mma(unsigned stage_a, unsigned stage_b,
                                                 const mj_warp_pos &p,
                                                 float (&acc)[S::kMi][S::kNi][4]) {
#pragma unroll
  for (int ks = p.wk; ks < S::kSteps; ks += S::kWarpsK) {
    unsigned a[S::kMi][4], b[S::kNi][2];
#pragma unroll
    for (int mi = 0; mi < S::kMi; ++mi) {
      // Lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 the same rows at
      // k 8-15: registers come out as the a0..a3 of the mma fragment.
      const int row = p.m0 + mi * 16 + (p.lane & 15);
      mj_ldmatrix_x4(a[mi], stage_a + mj_tile_offset<S>(row, ks * 2 + (p.lane >> 4)));
    }
#pragma unroll
    for (int nj = 0; nj < S::kNi / 2; ++nj) {
      // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
      // (n 8-15, k 8-15) = b0, b1 of two n8 tiles.
      const int row = p.n0 + nj * 16 + ((p.lane >> 4) << 3) + (p.lane & 7);
      unsigned r[4];
      mj_ldmatrix_x4(r, stage_b + mj_tile_offset<S>(row, ks * 2 + ((p.lane >> 3) & 1)));
      b[2 * nj][0] = r[0], b[2 * nj][1] = r[1];
      b[2 * nj + 1][0] = r[2], b[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < S::kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < S::kNi; ++ni) mj_mma_16816<T>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
  }
}

// The K loop of one CTA tile over k-tiles [kt0, kt1): acc = A_tile *
// B_tile^T, summed over those k. Leaves no copies in flight and shared
// memory free for reuse.
template <class S, int K, typename T, class LA, class LB>
__device__ __forceinline__ void mj_gemm_mainloop_range(const LA &la, const T *a_base, const LB &lb,
                                                       const T *b_base, unsigned smem,
                                                       const mj_warp_pos &p,
                                                       float (&acc)[S::kMi][S::kNi][4], int kt0,
                                                       int kt1) {
  const int kTiles = kt1 - kt0;  // the loop counts from 0; the copies take k-tile kt0 + i
  const unsigned smem_b = smem + S::kStages * S::kStageBytesA;
#pragma unroll
  for (int mi = 0; mi < S::kMi; ++mi)
#pragma unroll
    for (int ni = 0; ni < S::kNi; ++ni)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mi][ni][i] = 0.f;

  // Prologue: k-tiles 0 .. kStages-2 in flight, one commit group each (empty
  // groups past the end keep the group count = k-tile index).
#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < kTiles) {
      la.copy(smem + s * S::kStageBytesA, a_base, (kt0 + s) * S::kTK);
      lb.copy(smem_b + s * S::kStageBytesB, b_base, (kt0 + s) * S::kTK);
    }
    mj_cp_async_commit();
  }
  int read = 0, write = S::kStages - 1;
#pragma unroll 1
  for (int kt = 0; kt < kTiles; ++kt) {
    // kStages-1+kt groups committed; <= kStages-2 pending => group kt landed.
    mj_cp_async_wait<S::kStages - 2>();
    // Everyone's copies of k-tile kt are visible, and everyone is done with
    // k-tile kt-1, whose stage (== write) the prefetch below overwrites.
    __syncthreads();
    const int next = kt + S::kStages - 1;
    if (next < kTiles) {
      la.copy(smem + write * S::kStageBytesA, a_base, (kt0 + next) * S::kTK);
      lb.copy(smem_b + write * S::kStageBytesB, b_base, (kt0 + next) * S::kTK);
    }
    mj_cp_async_commit();
    mj_gemm_tile_mma<S, T>(smem + read * S::kStageBytesA, smem_b + read * S::kStageBytesB, p, acc);
    read = read + 1 == S::kStages ? 0 : read + 1;
    write = write + 1 == S::kStages ? 0 : write + 1;
  }
  mj_cp_async_wait<0>();
  __syncthreads();
}

// The whole K loop of one CTA tile: acc = A_tile * B_tile^T, summed over K.
template <class S, int K, typename T, class LA, class LB>
__device__ __forceinline__ void mj_gemm_mainloop(const LA &la, const T *a_base, const LB &lb,
                                                 const T *b_base, unsigned smem,
                                                 const mj_warp_pos &p,
                                                 float (&acc)[S::kMi][S::kNi][4]) {
  mj_gemm_mainloop_range<S, K>(la, a_base, lb, b_base, smem, p, acc, 0, (K + S::kTK - 1) / S::kTK);
}

// Sums the k-split warps' partial tiles into the kWarpsK == 0 warps, in a
// fixed order (deterministic). Reuses the pipeline's shared memory: call after
// mj_gemm_mainloop. Returns true for the warps that hold the final sums.
template <class S>
__device__ __forceinline__ bool mj_gemm_reduce_k(float *smem, const mj_warp_pos &p,
                                                 float (&acc)[S::kMi][S::kNi][4]) {
  if constexpr (S::kWarpsK == 1) {
    return true;
  } else {
    constexpr int kAcc = S::kMi * S::kNi * 4;
    const int mn = (threadIdx.x / 32) % S::kWarpsMN;
    // Slot layout [split-1][warp mn][acc index][lane]: lanes write
    // consecutive words (no bank conflicts).
    if (p.wk > 0) {
      float *dst = smem + ((p.wk - 1) * S::kWarpsMN + mn) * kAcc * 32 + p.lane;
#pragma unroll
      for (int mi = 0; mi < S::kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < S::kNi; ++ni)
#pragma unroll
          for (int i = 0; i < 4; ++i) dst[((mi * S::kNi + ni) * 4 + i) * 32] = acc[mi][ni][i];
    }
    __syncthreads();
    if (p.wk > 0) return false;
#pragma unroll 1
    for (int s = 1; s < S::kWarpsK; ++s) {
      const float *src = smem + ((s - 1) * S::kWarpsMN + mn) * kAcc * 32 + p.lane;
#pragma unroll
      for (int mi = 0; mi < S::kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < S::kNi; ++ni)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mi][ni][i] += src[((mi * S::kNi + ni) * 4 + i) * 32];
    }
    return true;
  }
}

// Traps when the launch gave less dynamic shared memory than the tile needs
// (a host/template mismatch would otherwise corrupt memory silently).
template <class S> __device__ __forceinline__ void mj_gemm_check_smem() {
  unsigned bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  if (bytes < (unsigned)S::kSmemBytes) __trap();
}

#endif
