// Expert parallelism: the kernels around NCCL's send/recv (src/dist/,
// docs/ep.md). A rank routes its T tokens, then
//   moejit_ep_mask     per token, the set of ranks owning any of its k
//                      experts (a 64-bit mask: at most 64 ranks);
//   moejit_ep_scan     one block per destination rank: each token's position
//                      in that rank's send segment (token order, stable), or
//                      -1 (not sent, or past the capacity), and the counts;
//   moejit_ep_pack     a warp per token copies its x row once per
//                      destination, with its k expert ids rewritten to the
//                      destination's local indices (-1 for experts elsewhere)
//                      and its k weights (0 elsewhere). Rows for this rank go
//                      straight to its receive buffer. With a capacity, the
//                      unused rows of each segment get ids -1, so the
//                      receiver's align drops them;
//   (NCCL dispatch, the local layer on the received rows, NCCL return)
//   moejit_ep_combine  a warp per token sums the partial outputs coming
//                      back from each of its ranks, in rank order, in fp32:
//                      deterministic, rounded once to out_t.
// Segment bases: with capacity C > 0, segment r starts at row r*C; without,
// the send segments are packed in rank order with this rank's left out
// (its rows go to the receive buffer), so their bases are prefix sums of
// the counts, recomputed here from `counts`.
#include "common/dtype.cuh"
#include "common/warp.cuh"

enum : int { kMaxWorld = 64 };
enum : int { kScanThreads = 1024 };

static_assert(kBlockThreads % 32 == 0, "ep: block_threads must be a multiple of 32");

// --- 1. destination ranks of each token -------------------------------------
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_ep_mask(const int *__restrict__ ids, const int *__restrict__ owner, int tokens,
                   unsigned long long *__restrict__ mask) {
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < tokens;
       t += (long long)gridDim.x * blockDim.x) {
    unsigned long long m = 0;
#pragma unroll
    for (int j = 0; j < kTopK; ++j) {
      const int e = __ldg(ids + (size_t)t * kTopK + j);
      if (e >= 0 && e < kExperts) m |= 1ull << __ldg(owner + e);
    }
    mask[t] = m;
  }
}

// --- 2. positions in each destination's segment -----------------------------
// Block r scans bit r of the masks, kScanThreads tokens at a time: a ballot
// ranks the lanes of a warp, warp 0 scans the 32 warp totals.
extern "C" __global__ void __launch_bounds__(kScanThreads)
    moejit_ep_scan(const unsigned long long *__restrict__ mask, int tokens, int capacity,
                   int *__restrict__ pos, int *__restrict__ counts,
                   int *__restrict__ dropped_by_rank) {
  __shared__ int warp_total[kScanThreads / 32];
  const int r = blockIdx.x, warp = (int)(threadIdx.x / 32), lane = mj_lane_id();
  int base = 0;
  for (long long c = 0; c < tokens; c += kScanThreads) {
    const long long t = c + threadIdx.x;
    const bool f = t < tokens && ((__ldg(mask + t) >> r) & 1ull);
    const unsigned b = __ballot_sync(MJ_FULL_MASK, f);
    if (lane == 0) warp_total[warp] = __popc(b);
    __syncthreads();
    if (warp == 0) {
      int v = warp_total[lane];
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int n = __shfl_up_sync(MJ_FULL_MASK, v, off);
        if (lane >= off) v += n;
      }
      warp_total[lane] = v;  // inclusive
    }
    __syncthreads();
    const int p = base + (warp ? warp_total[warp - 1] : 0) + __popc(b & mj_lanemask_lt());
    if (t < tokens) pos[(size_t)r * tokens + t] = f && (capacity == 0 || p < capacity) ? p : -1;
    base += warp_total[kScanThreads / 32 - 1];
    __syncthreads();  // warp_total is rewritten by the next chunk
  }
  if (threadIdx.x == 0) {
    const bool over = capacity > 0 && base > capacity;
    counts[r] = over ? capacity : base;
    dropped_by_rank[r] = over ? base - capacity : 0;
  }
}

// Segment bases of the send (and return) buffers, in shared memory.
__device__ __forceinline__ void ep_segments(const int *__restrict__ counts, int world, int rank,
                                            int capacity, int *seg) {
  if (threadIdx.x == 0) {
    int at = 0;
    for (int r = 0; r < world; ++r) {
      seg[r] = capacity > 0 ? r * capacity : at;
      if (r != rank) at += __ldg(counts + r);
    }
  }
  __syncthreads();
}

// A warp per token: this warp's first token and the grid's warp count.
__device__ __forceinline__ int ep_first_warp() {
  return (int)blockIdx.x * (int)(blockDim.x / 32) + (int)(threadIdx.x / 32);
}
__device__ __forceinline__ int ep_warps() {
  return (int)gridDim.x * (int)(blockDim.x / 32);
}

typedef mj_words<act_t, mj_pow2_divisor(kHidden, 16 / mj_dtype<act_t>::kBytes)> act_words;
enum : int { kActVec = mj_pow2_divisor(kHidden, 16 / mj_dtype<act_t>::kBytes) };

// --- 3. pack ---------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_ep_pack(const act_t *__restrict__ x, const int *__restrict__ ids,
                   const float *__restrict__ weights, const int *__restrict__ owner,
                   const int *__restrict__ local_index, const unsigned long long *__restrict__ mask,
                   const int *__restrict__ pos, const int *__restrict__ counts, int tokens,
                   int world, int rank, int capacity, int self_base, act_t *__restrict__ send_x,
                   int *__restrict__ send_ids, float *__restrict__ send_w,
                   act_t *__restrict__ recv_x, int *__restrict__ recv_ids,
                   float *__restrict__ recv_w, const int *__restrict__ dropped_by_rank,
                   int *__restrict__ dropped) {
  __shared__ int seg[kMaxWorld];
  ep_segments(counts, world, rank, capacity, seg);
  const int lane = mj_lane_id();
  for (long long t = ep_first_warp(); t < tokens; t += ep_warps()) {
    unsigned long long m = __ldg(mask + t);
    const int e = lane < kTopK ? __ldg(ids + (size_t)t * kTopK + lane) : -1;
    const bool valid = e >= 0 && e < kExperts;
    const int e_owner = valid ? __ldg(owner + e) : -1;
    const int e_local = valid ? __ldg(local_index + e) : -1;
    const float e_w = lane < kTopK ? __ldg(weights + (size_t)t * kTopK + lane) : 0.0f;
    while (m) {
      const int r = __ffsll((long long)m) - 1;
      m &= m - 1;
      const int p = __ldg(pos + (size_t)r * tokens + t);
      if (p < 0) continue;  // past the capacity
      const bool self = r == rank;
      const size_t row = (size_t)(self ? self_base + p : seg[r] + p);
      act_t *dx = (self ? recv_x : send_x) + row * kHidden;
      const act_t *sx = x + (size_t)t * kHidden;
      for (int v = lane; v < kHidden / kActVec; v += 32) {
        unsigned w[act_words::kCount];
        mj_load_words<act_t, kActVec>(sx + (size_t)v * kActVec, w);
        mj_store_words<act_t, kActVec>(dx + (size_t)v * kActVec, w);
      }
      if (lane < kTopK) {
        const bool mine = e_owner == r;
        (self ? recv_ids : send_ids)[row * kTopK + lane] = mine ? e_local : -1;
        (self ? recv_w : send_w)[row * kTopK + lane] = mine ? e_w : 0.0f;
      }
    }
  }
  if (capacity > 0) {  // unused rows of every segment: no experts
    const long long rows = (long long)world * capacity;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < rows;
         i += (long long)gridDim.x * blockDim.x) {
      const int r = (int)(i / capacity), p = (int)(i % capacity);
      if (p < __ldg(counts + r)) continue;
      const bool self = r == rank;
      const size_t row = (size_t)(self ? self_base + p : seg[r] + p);
#pragma unroll
      for (int j = 0; j < kTopK; ++j) {
        (self ? recv_ids : send_ids)[row * kTopK + j] = -1;
        (self ? recv_w : send_w)[row * kTopK + j] = 0.0f;
      }
    }
  }
  if (dropped != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    int n = 0;
    for (int r = 0; r < world; ++r) n += __ldg(dropped_by_rank + r);
    *dropped = n;
  }
}

// --- 4. combine the partial outputs ----------------------------------------
enum : int { kOutVec = mj_pow2_divisor(kHidden, 16 / mj_dtype<out_t>::kBytes) };

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    moejit_ep_combine(const out_t *__restrict__ partial, const out_t *__restrict__ back,
                      const unsigned long long *__restrict__ mask, const int *__restrict__ pos,
                      const int *__restrict__ counts, int tokens, int world, int rank,
                      int capacity, int self_base, out_t *__restrict__ out) {
  __shared__ int seg[kMaxWorld];
  ep_segments(counts, world, rank, capacity, seg);
  const int lane = mj_lane_id();
  for (long long t = ep_first_warp(); t < tokens; t += ep_warps()) {
    const unsigned long long m0 = __ldg(mask + t);
    for (int v = lane; v < kHidden / kOutVec; v += 32) {
      float acc[kOutVec];
#pragma unroll
      for (int i = 0; i < kOutVec; ++i) acc[i] = 0.0f;
      for (unsigned long long m = m0; m; m &= m - 1) {
        const int r = __ffsll((long long)m) - 1;
        const int p = __ldg(pos + (size_t)r * tokens + t);
        if (p < 0) continue;
        const out_t *src = r == rank ? partial + (size_t)(self_base + p) * kHidden
                                     : back + (size_t)(seg[r] + p) * kHidden;
        float f[kOutVec];
        mj_load_floats<out_t, kOutVec>(src + (size_t)v * kOutVec, f);
#pragma unroll
        for (int i = 0; i < kOutVec; ++i) acc[i] += f[i];
      }
      mj_store_floats<out_t, kOutVec>(out + (size_t)t * kHidden + (size_t)v * kOutVec, acc);
    }
  }
}
