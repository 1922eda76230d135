/* cuBLAS peers of moejit_bench_gemm (see bench_gemm_peers.h). Row-major
 * C = A . W^T is column-major C^T = W^T' . A^T': cuBLAS's "TN" GEMM with
 * m = n (weight rows), n = rows, k = k, W as its A operand. */
#include "bench_gemm_peers.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef MOEJIT_BENCH_PEERS

/* Built without cuBLAS: every peer is n/a with this reason. */
static int not_built(char *why) {
  snprintf(why, PEER_WHY_MAX, "built without cuBLAS (not found when CMake configured the bench)");
  return -1;
}
int peers_create(int device, moejit_stream stream, peers **out, char *why) {
  *out = NULL;
  return not_built(why);
}
void peers_destroy(peers *p) {}
const char *peers_name(const peers *p) {
  return "none";
}
int peer_dense(peers *p, const void *a, const void *w, void *c, int64_t m, int64_t n, int64_t k,
               moejit_dtype dtype, char *why) {
  return not_built(why);
}
int peer_loop(peers *p, const peer_gemm *g, char *why) {
  return not_built(why);
}
int peer_grouped_prepare(peers *p, const peer_gemm *g, peer_grouped **out, char *why) {
  *out = NULL;
  return not_built(why);
}
int peer_grouped_run(peers *p, const peer_grouped *gr, char *why) {
  return not_built(why);
}
void peer_grouped_free(peer_grouped *gr) {}

#else

#include <limits.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

/* cublasGemmGroupedBatchedEx arrived in cuBLAS 12.5 (CUDA 12.5). */
#define PEER_HAVE_GROUPED \
  (CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5))

struct peers {
  cublasHandle_t handle;
  char name[48];
};

static const float k_one = 1.0f, k_zero = 0.0f;

static int cuda_fail(cudaError_t e, const char *what, char *why) {
  snprintf(why, PEER_WHY_MAX, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaGetLastError(); /* clears a non-sticky error so later calls start clean */
  return -1;
}

static int blas_fail(cublasStatus_t s, const char *what, char *why) {
  snprintf(why, PEER_WHY_MAX, "%s: %s", what, cublasGetStatusName(s));
  return -1;
}

static int cuda_type(moejit_dtype dt, cudaDataType_t *t, char *why) {
  if (dt == MOEJIT_DTYPE_BF16)
    *t = CUDA_R_16BF;
  else if (dt == MOEJIT_DTYPE_FP16)
    *t = CUDA_R_16F;
  else {
    snprintf(why, PEER_WHY_MAX, "dtype %s: the peers run bf16 and fp16 only",
             moejit_dtype_name(dt));
    return -1;
  }
  return 0;
}

/* cublasGemmEx takes int sizes. */
static int fits_int(int64_t m, int64_t n, int64_t k, char *why) {
  if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX) return 0;
  snprintf(why, PEER_WHY_MAX, "GEMM %lldx%lldx%lld exceeds cuBLAS's int sizes", (long long)m,
           (long long)n, (long long)k);
  return -1;
}

int peers_create(int device, moejit_stream stream, peers **out, char *why) {
  *out = NULL;
  peers *p = calloc(1, sizeof *p);
  if (!p) return snprintf(why, PEER_WHY_MAX, "out of host memory"), -1;
  /* cudaFree(NULL) initializes the runtime on the device's primary context,
   * the context moejit retained: both see the same memory. */
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(NULL);
  if (e != cudaSuccess) return free(p), cuda_fail(e, "cudaSetDevice", why);
  cublasStatus_t s = cublasCreate(&p->handle);
  if (s != CUBLAS_STATUS_SUCCESS) return free(p), blas_fail(s, "cublasCreate", why);
  int version = 0;
  s = cublasSetStream(p->handle, stream);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetPointerMode(p->handle, CUBLAS_POINTER_MODE_HOST);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasGetVersion(p->handle, &version);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(p->handle), free(p);
    return blas_fail(s, "cublasSetStream/SetPointerMode/GetVersion", why);
  }
  snprintf(p->name, sizeof p->name, "cuBLAS %d.%d.%d", version / 10000, version / 100 % 100,
           version % 100);
  *out = p;
  return 0;
}

void peers_destroy(peers *p) {
  if (!p) return;
  cublasDestroy(p->handle);
  free(p);
}

const char *peers_name(const peers *p) {
  return p ? p->name : "none";
}

int peer_dense(peers *p, const void *a, const void *w, void *c, int64_t m, int64_t n, int64_t k,
               moejit_dtype dtype, char *why) {
  cudaDataType_t t;
  if (cuda_type(dtype, &t, why) || fits_int(m, n, k, why)) return -1;
  cublasStatus_t s = cublasGemmEx(p->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                  &k_one, w, t, (int)k, a, t, (int)k, &k_zero, c, t, (int)n,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s, "cublasGemmEx", why);
}

int peer_loop(peers *p, const peer_gemm *g, char *why) {
  const size_t esz = moejit_dtype_size(g->dtype);
  for (int e = 0; e < g->experts; e++) {
    const int64_t first = g->offsets[e], rows = g->offsets[e + 1] - first;
    if (rows <= 0) continue;
    const char *a = (const char *)g->a + (size_t)(first * g->k) * esz;
    const char *w = (const char *)g->w + (size_t)e * (size_t)(g->n * g->k) * esz;
    char *c = (char *)g->c + (size_t)(first * g->n) * esz;
    if (peer_dense(p, a, w, c, rows, g->n, g->k, g->dtype, why)) return -1;
  }
  return 0;
}

struct peer_grouped {
  int groups;
  cudaDataType_t type;
  cublasOperation_t *trans; /* [2 * groups]: T for the weights, N for the activations */
  int *sizes;               /* [7 * groups]: m, n, k, lda, ldb, ldc, group size */
  float *scalars;           /* [2 * groups]: alpha 1, beta 0 */
  void **dev_ptrs;          /* device: weights, activations, outputs, [groups] each */
};

void peer_grouped_free(peer_grouped *gr) {
  if (!gr) return;
  if (gr->dev_ptrs) cudaFree(gr->dev_ptrs);
  free(gr->trans), free(gr->sizes), free(gr->scalars), free(gr);
}

#if PEER_HAVE_GROUPED

/* Host pointers of every group's operands, then one copy to the device. */
static int upload_pointers(peer_grouped *gr, const peer_gemm *g, char *why) {
  const size_t esz = moejit_dtype_size(g->dtype), n = (size_t)gr->groups;
  const void **host = malloc(3 * n * sizeof *host);
  if (!host) return snprintf(why, PEER_WHY_MAX, "out of host memory"), -1;
  size_t i = 0;
  for (int e = 0; e < g->experts; e++) {
    const int64_t first = g->offsets[e];
    if (g->offsets[e + 1] <= first) continue;
    host[i] = (const char *)g->w + (size_t)e * (size_t)(g->n * g->k) * esz;
    host[n + i] = (const char *)g->a + (size_t)(first * g->k) * esz;
    host[2 * n + i] = (char *)g->c + (size_t)(first * g->n) * esz;
    i++;
  }
  cudaError_t err = cudaMalloc((void **)&gr->dev_ptrs, 3 * n * sizeof(void *));
  if (err == cudaSuccess)
    err = cudaMemcpy(gr->dev_ptrs, host, 3 * n * sizeof(void *), cudaMemcpyHostToDevice);
  free(host);
  return err == cudaSuccess ? 0
                            : cuda_fail(err, "cudaMalloc/cudaMemcpy of the pointer arrays", why);
}

int peer_grouped_prepare(peers *p, const peer_gemm *g, peer_grouped **out, char *why) {
  *out = NULL;
  peer_grouped *gr = calloc(1, sizeof *gr);
  if (!gr) return snprintf(why, PEER_WHY_MAX, "out of host memory"), -1;
  if (cuda_type(g->dtype, &gr->type, why)) return free(gr), -1;
  for (int e = 0; e < g->experts; e++) gr->groups += g->offsets[e + 1] > g->offsets[e];
  const size_t n = gr->groups > 0 ? (size_t)gr->groups : 1;
  gr->trans = malloc(2 * n * sizeof *gr->trans);
  gr->sizes = malloc(7 * n * sizeof *gr->sizes);
  gr->scalars = malloc(2 * n * sizeof *gr->scalars);
  if (!gr->trans || !gr->sizes || !gr->scalars) {
    peer_grouped_free(gr);
    return snprintf(why, PEER_WHY_MAX, "out of host memory"), -1;
  }
  int i = 0;
  for (int e = 0; e < g->experts; e++) {
    const int64_t rows = g->offsets[e + 1] - g->offsets[e];
    if (rows <= 0) continue;
    if (fits_int(rows, g->n, g->k, why)) return peer_grouped_free(gr), -1;
    int *sz = gr->sizes;
    const size_t G = (size_t)gr->groups;
    gr->trans[i] = CUBLAS_OP_T, gr->trans[G + i] = CUBLAS_OP_N;
    sz[i] = (int)g->n, sz[G + i] = (int)rows, sz[2 * G + i] = (int)g->k;
    sz[3 * G + i] = (int)g->k, sz[4 * G + i] = (int)g->k, sz[5 * G + i] = (int)g->n;
    sz[6 * G + i] = 1;
    gr->scalars[i] = k_one, gr->scalars[G + i] = k_zero;
    i++;
  }
  if (gr->groups > 0 && upload_pointers(gr, g, why)) return peer_grouped_free(gr), -1;
  *out = gr;
  return 0;
}

int peer_grouped_run(peers *p, const peer_grouped *gr, char *why) {
  const int G = gr->groups;
  if (G == 0) return 0;
  const int *sz = gr->sizes;
  void **ptr = gr->dev_ptrs;
  cublasStatus_t s = cublasGemmGroupedBatchedEx(
      p->handle, gr->trans, gr->trans + G, sz, sz + G, sz + 2 * G, gr->scalars,
      (const void *const *)ptr, gr->type, sz + 3 * G, (const void *const *)(ptr + G), gr->type,
      sz + 4 * G, gr->scalars + G, ptr + 2 * G, gr->type, sz + 5 * G, G, sz + 6 * G,
      CUBLAS_COMPUTE_32F);
  return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(s, "cublasGemmGroupedBatchedEx", why);
}

#else /* cuBLAS older than 12.5 */

static int grouped_missing(char *why) {
  snprintf(why, PEER_WHY_MAX, "cublasGemmGroupedBatchedEx needs cuBLAS 12.5+, built against %d.%d",
           CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
  return -1;
}
int peer_grouped_prepare(peers *p, const peer_gemm *g, peer_grouped **out, char *why) {
  *out = NULL;
  return grouped_missing(why);
}
int peer_grouped_run(peers *p, const peer_grouped *gr, char *why) {
  return grouped_missing(why);
}

#endif /* PEER_HAVE_GROUPED */

#endif /* MOEJIT_BENCH_PEERS */
