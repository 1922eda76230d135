// Compile-time shape of a grouped-GEMM kernel (gemm1, gemm2): the CTA tile
// from the prelude, how its warps split that tile, and the shared memory the
// kernel needs. src/ops/gemm_plan.c mirrors mj_gemm_warp_layout and the byte
// counts on the host (keep the two in step: the kernel traps when launched
// with less dynamic shared memory than kSmemBytes).
#ifndef MOEJIT_COMMON_GEMM_CONFIG_CUH
#define MOEJIT_COMMON_GEMM_CONFIG_CUH

template <typename A, typename B>
struct mj_same_type {
  enum : bool { value = false };
};
template <typename A>
struct mj_same_type<A, A> {
  enum : bool { value = true };
};

// A where C holds, else B (std::conditional; NVRTC has no <type_traits>).
template <bool C, typename A, typename B>
struct mj_if {
  typedef A type;
};
template <typename A, typename B>
struct mj_if<false, A, B> {
  typedef B type;
};

// True for the element types mma.sync m16n8k16 takes (fp16, bf16).
template <typename T>
struct mj_is_mma_type {
  enum : bool { value = false };
};
template <>
struct mj_is_mma_type<__half> {
  enum : bool { value = true };
};
template <>
struct mj_is_mma_type<__nv_bfloat16> {
  enum : bool { value = true };
};

// warps = m * n * k: m warps down the tile's rows, n across its columns
// (both in 16-row / 16-column units), and k warps splitting each k-tile's
// 16-wide steps round-robin (summed in shared memory at the end; used only
// when the tile is too small to give every warp its own 16x16 piece).
struct mj_warp_layout {
  int m, n, k;
};

// Fewest k-splits first, then the squarest warp tile (the least fragment
// traffic from shared memory per mma).
__host__ __device__ constexpr mj_warp_layout mj_gemm_warp_layout(int tile_m, int tile_n, int warps) {
  mj_warp_layout best{1, 1, warps};
  int best_cost = 1 << 30;
  for (int wm = 1; wm <= warps; ++wm) {
    if (warps % wm != 0 || (tile_m / 16) % wm != 0) continue;
    for (int wn = 1; wn <= warps / wm; ++wn) {
      if ((warps / wm) % wn != 0 || (tile_n / 16) % wn != 0) continue;
      const int wk = warps / (wm * wn);
      const int cost = wk * 100000 + tile_m / wm + tile_n / wn;
      if (cost < best_cost) {
        best_cost = cost;
        best = mj_warp_layout{wm, wn, wk};
      }
    }
  }
  return best;
}

template <int TM, int TN, int TK, int STAGES, int WARPS> struct mj_gemm_shape {
  enum : int { kTM = TM, kTN = TN, kTK = TK, kStages = STAGES, kWarps = WARPS };
  enum : int { kThreads = WARPS * 32 };
  enum : int {
    kWarpsM = mj_gemm_warp_layout(TM, TN, WARPS).m,
    kWarpsN = mj_gemm_warp_layout(TM, TN, WARPS).n,
    kWarpsK = mj_gemm_warp_layout(TM, TN, WARPS).k
  };
  enum : int { kWarpsMN = kWarpsM * kWarpsN };
  enum : int { kWarpTM = TM / kWarpsM, kWarpTN = TN / kWarpsN };  // one warp's tile
  enum : int { kMi = kWarpTM / 16, kNi = kWarpTN / 8 };           // m16 x n8 mma tiles
  enum : int { kSteps = TK / 16 };                                // k16 steps per k-tile
  // A shared-memory row holds TK elements = kChunks 16-byte chunks.
  enum : int { kChunks = TK / 8 };
  enum : int { kStageBytesA = TM * TK * 2, kStageBytesB = TN * TK * 2 };
  enum : int { kPipeBytes = STAGES * (kStageBytesA + kStageBytesB) };
  // Partial sums of the k-split warps (kWarpsK - 1 of them) for the whole tile.
  enum : int { kReduceBytes = (kWarpsK - 1) * TM * TN * 4 };
  enum : int { kSmemBytes = kPipeBytes > kReduceBytes ? kPipeBytes : kReduceBytes };

  static_assert(TM % 16 == 0 && TN % 16 == 0 && TK % 16 == 0, "tiles are multiples of 16");
  static_assert(kWarpsM * kWarpsN * kWarpsK == WARPS, "warp layout must use every warp");
  static_assert(kWarpTN % 16 == 0, "a warp's columns come in pairs of n8 tiles (ldmatrix.x4)");
  static_assert(kChunks == 4 || kChunks == 8 || kChunks == 16, "tile_k is 32, 64 or 128");
  static_assert(kThreads % kChunks == 0, "each thread copies one fixed chunk column");
  static_assert(STAGES >= 2, "the cp.async pipeline needs at least two stages");
};

#endif
