/* CUDA-graph capture and replay (moejit/layer.h): the driver's stream
 * capture entry points, resolved once from the already loaded libcuda, and
 * thin wrappers that push the ctx around each call. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "runtime/runtime.h"
#include "runtime/runtime_impl.h"

/* The 12.0 ABI of each entry, as driver.c requests for its table. */
#define MJ_GRAPH_ABI_VERSION 12000

typedef struct graph_api {
  PFN_cuStreamBeginCapture_v10010 BeginCapture;
  PFN_cuStreamEndCapture_v10000 EndCapture;
  PFN_cuGraphInstantiateWithFlags_v11040 Instantiate;
  PFN_cuGraphLaunch_v10000 Launch;
  PFN_cuGraphExecDestroy_v10000 ExecDestroy;
  PFN_cuGraphDestroy_v10000 Destroy;
} graph_api;

struct moejit_graph {
  CUgraph graph;
  CUgraphExec exec;
  moejit_ctx *ctx; /* the ctx that captured it: destroy uses it when given none */
};

static struct {
  pthread_once_t once;
  graph_api api;
  moejit_status status;
  char message[512];
} g = {.once = PTHREAD_ONCE_INIT};

/* cuGetProcAddress (the driver's ABI-exact answer), then the exported name. */
static void *resolve(void *lib, PFN_cuGetProcAddress_v12000 get_proc, const char *base,
                     const char *exported) {
  void *fn = NULL;
  if (get_proc) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (get_proc(base, &fn, MJ_GRAPH_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=
            CUDA_SUCCESS ||
        found != CU_GET_PROC_ADDRESS_SUCCESS)
      fn = NULL;
  }
  return fn ? fn : dlsym(lib, exported);
}

static void load_graph_api(void) {
  const mj_driver *d;
  if ((g.status = mj_driver_get(&d)) != MOEJIT_OK) {
    snprintf(g.message, sizeof g.message, "%s", moejit_last_error());
    return;
  }
  /* the library driver.c loaded, whatever $MOEJIT_LIBCUDA_PATH says now */
  void *lib = mj_driver_lib();
  PFN_cuGetProcAddress_v12000 get_proc =
      lib ? (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2") : NULL;
  graph_api *a = &g.api;
  void *p[6] = {
      resolve(lib, get_proc, "cuStreamBeginCapture", "cuStreamBeginCapture_v2"),
      resolve(lib, get_proc, "cuStreamEndCapture", "cuStreamEndCapture"),
      resolve(lib, get_proc, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"),
      resolve(lib, get_proc, "cuGraphLaunch", "cuGraphLaunch"),
      resolve(lib, get_proc, "cuGraphExecDestroy", "cuGraphExecDestroy"),
      resolve(lib, get_proc, "cuGraphDestroy", "cuGraphDestroy"),
  };
  for (int i = 0; i < 6; i++)
    if (!p[i]) {
      g.status = MOEJIT_ERR_UNSUPPORTED;
      snprintf(g.message, sizeof g.message,
               "the CUDA driver lacks the graph entry points (stream capture needs CUDA 11.4 or "
               "newer); HINT: update the driver, or run the layer eagerly");
      return;
    }
  memcpy(&a->BeginCapture, &p[0], sizeof p[0]);
  memcpy(&a->EndCapture, &p[1], sizeof p[1]);
  memcpy(&a->Instantiate, &p[2], sizeof p[2]);
  memcpy(&a->Launch, &p[3], sizeof p[3]);
  memcpy(&a->ExecDestroy, &p[4], sizeof p[4]);
  memcpy(&a->Destroy, &p[5], sizeof p[5]);
  g.status = MOEJIT_OK;
}

static moejit_status graph_api_get(moejit_ctx *ctx, const graph_api **out) {
  pthread_once(&g.once, load_graph_api);
  if (g.status) return mj_ctx_fail(ctx, mj_fail(g.status, "%s", g.message));
  *out = &g.api;
  return MOEJIT_OK;
}

moejit_status moejit_graph_begin_capture(moejit_ctx *ctx, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_graph_begin_capture");
  if (!stream)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "moejit_graph_begin_capture: stream is NULL (the legacy "
                                    "default stream cannot be captured); HINT: use a stream "
                                    "from moejit_stream_create"));
  const graph_api *a;
  moejit_status st = graph_api_get(ctx, &a);
  if (st || (st = mj_ctx_enter(ctx))) return st;
  /* Thread-local: only this thread's unsafe calls (sync, alloc) break the
   * capture, other threads keep working. */
  st = mj_cu_check(a->BeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                   "cuStreamBeginCapture");
  mj_ctx_leave(ctx);
  return st ? mj_ctx_fail(ctx, st) : MOEJIT_OK;
}

static moejit_status instantiate(moejit_ctx *ctx, const graph_api *a, CUgraph graph,
                                 moejit_graph **out) {
  moejit_graph *gr = calloc(1, sizeof *gr);
  if (!gr) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "moejit_graph_end_capture: out of memory");
  gr->graph = graph, gr->ctx = ctx;
  moejit_status st =
      mj_cu_check(a->Instantiate(&gr->exec, graph, 0), "cuGraphInstantiateWithFlags");
  if (st) {
    free(gr);
    return st;
  }
  *out = gr;
  return MOEJIT_OK;
}

moejit_status moejit_graph_end_capture(moejit_ctx *ctx, moejit_stream stream, moejit_graph **out) {
  MJ_CHECK_CTX(ctx, "moejit_graph_end_capture");
  if (out) *out = NULL;
  if (!stream)
    return mj_ctx_fail(
        ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_graph_end_capture: stream is NULL"));
  const graph_api *a;
  moejit_status st = graph_api_get(ctx, &a);
  if (st || (st = mj_ctx_enter(ctx))) return st;
  CUgraph graph = NULL;
  st = mj_cu_check(a->EndCapture(stream, &graph), "cuStreamEndCapture");
  if (st == MOEJIT_OK && !graph)
    st = mj_fail(MOEJIT_ERR_CUDA, "cuStreamEndCapture returned no graph");
  if (st == MOEJIT_OK && !out) { /* the capture is ended all the same, and dropped */
    (void)a->Destroy(graph);
    st = mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                 "moejit_graph_end_capture: out is NULL (the capture was ended and dropped)");
  } else if (st == MOEJIT_OK && (st = instantiate(ctx, a, graph, out))) {
    (void)a->Destroy(graph);
  }
  mj_ctx_leave(ctx);
  return st ? mj_ctx_fail(ctx, st) : MOEJIT_OK;
}

moejit_status moejit_graph_launch(moejit_ctx *ctx, moejit_graph *graph, moejit_stream stream) {
  MJ_CHECK_CTX(ctx, "moejit_graph_launch");
  if (!graph)
    return mj_ctx_fail(ctx,
                       mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_graph_launch: graph is NULL"));
  if (graph->ctx != ctx)
    return mj_ctx_fail(ctx, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                    "moejit_graph_launch: the graph was captured in another ctx"));
  const graph_api *a;
  moejit_status st = graph_api_get(ctx, &a);
  if (st || (st = mj_ctx_enter(ctx))) return st;
  st = mj_cu_check(a->Launch(graph->exec, stream), "cuGraphLaunch");
  mj_ctx_leave(ctx);
  return st ? mj_ctx_fail(ctx, st) : MOEJIT_OK;
}

void moejit_graph_destroy(moejit_ctx *ctx, moejit_graph *graph) {
  const graph_api *a;
  if (graph && !ctx) ctx = graph->ctx; /* the driver's objects are freed all the same */
  if (!graph || !ctx || graph_api_get(ctx, &a) != MOEJIT_OK) {
    free(graph);
    return;
  }
  if (mj_ctx_enter(ctx) == MOEJIT_OK) {
    (void)a->ExecDestroy(graph->exec);
    (void)a->Destroy(graph->graph);
    mj_ctx_leave(ctx);
  }
  free(graph);
}
