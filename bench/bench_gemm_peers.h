/* cuBLAS peers of moejit_bench_gemm: a dense GEMM, a per-expert GEMM loop and
 * cublasGemmGroupedBatchedEx, run on the benchmark's own device buffers.
 * Built with MOEJIT_BENCH_PEERS (cuBLAS found at configure time); without it
 * every call fails with that reason, so the benchmark still runs. */
#ifndef MOEJIT_BENCH_GEMM_PEERS_H
#define MOEJIT_BENCH_GEMM_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

/* Size of the `why` buffers below: a failing call writes its reason there. */
#define PEER_WHY_MAX 256

/* A cuBLAS handle on one device's primary context (the one moejit uses, so
 * moejit_mem_alloc'd pointers are valid), enqueuing on one stream. */
typedef struct peers peers;

/* One grouped problem, row-major as the benchmark stores it: for every
 * expert e with rows, C[r, :] = A[r, :] . W[e]^T over the rows
 * [offsets[e], offsets[e+1]), A [rows, k], W [experts, n, k], C [rows, n]. */
typedef struct peer_gemm {
  const void *a, *w;
  void *c;
  const int32_t *offsets; /* host copy, [experts + 1] */
  int experts;
  int64_t n, k;
  moejit_dtype dtype; /* of A, W and C: bf16 or fp16; sums are fp32 */
} peer_gemm;

/* Returns 0 and *out, or -1 with the reason in why. */
int peers_create(int device, moejit_stream stream, peers **out, char *why);
void peers_destroy(peers *p); /* NULL: no-op */
/* "cuBLAS 13.1.0" (the library loaded at run time). */
const char *peers_name(const peers *p);

/* Each returns 0 once its work is enqueued on the stream, -1 with why. */

/* One GEMM, C[m, n] = A[m, k] . W^T, W [n, k] row-major. */
int peer_dense(peers *p, const void *a, const void *w, void *c, int64_t m, int64_t n, int64_t k,
               moejit_dtype dtype, char *why);
/* One cublasGemmEx per expert with rows. */
int peer_loop(peers *p, const peer_gemm *g, char *why);

/* cublasGemmGroupedBatchedEx, one group per expert with rows. Its pointer
 * arrays live on the device: prepare them once per input set (synchronous,
 * outside any timed region), run as often as needed, free. */
typedef struct peer_grouped peer_grouped;
int peer_grouped_prepare(peers *p, const peer_gemm *g, peer_grouped **out, char *why);
int peer_grouped_run(peers *p, const peer_grouped *gr, char *why);
void peer_grouped_free(peer_grouped *gr); /* NULL: no-op */

#endif
