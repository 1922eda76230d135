/* moejit whole MoE layer: a model loaded from a config file or preset with
 * every kernel compiled in parallel, a load report, one forward call that
 * runs route -> align/permute -> GEMM 1 + SwiGLU -> GEMM 2 -> combine, and
 * CUDA-graph capture of it. Included by moejit/moejit.h after gemm.h.
 *
 * Conventions are those of moejit/ops.h: device pointers, row-major dense
 * buffers, arguments checked before anything is enqueued, no host sync, no
 * allocation and no module load inside moejit_moe_forward once the model is
 * loaded (so it can be captured in a CUDA graph), deterministic results.
 * Workspace layout, data path and the benchmark floor: docs/layer.md. */
#ifndef MOEJIT_LAYER_H
#define MOEJIT_LAYER_H

#include "moejit/moejit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Loading a whole layer, and what the load did                             */
/* ------------------------------------------------------------------------ */

#define MOEJIT_LOAD_MAX_KERNELS 8

/* One kernel family of a loaded model. */
typedef struct moejit_load_kernel {
  char kernel[MOEJIT_NAME_MAX]; /* family: "route", "align", "gemm1", ... */
  char arch[MOEJIT_ARCH_MAX];   /* the ctx's arch, e.g. "sm_90a" */
  char key[33];                 /* cache key, 32 hex digits */
  int cache_hit;                /* 1: not compiled by this load (disk cache
                                   or the ctx compiler's memory) */
  double ms;                    /* generate + compile or cache read */
  char config[64];              /* the launch shape, e.g. "128x256x64 s4 w8"
                                   or "block 256" */
  /* Where that shape came from: "heuristic" (the config's kernels section
   * or the built-in defaults; config_detail says why no tuned table
   * applies) or "tuned" (gemm1/gemm2 only: the device's tuned table has
   * entries for this shape; config reads "N buckets, T=a..b" and
   * config_detail names the table and each bucket's tile and path). See
   * docs/tuned-tables.md. */
  char config_source[32];
  char config_detail[512];
  /* Tuned variants: kernels built besides the heuristic one (distinct
   * tiles of the table's buckets), and how many of them were cache hits.
   * cache_hit and ms above cover them too. */
  int variants, variant_hits;
} moejit_load_kernel;

typedef struct moejit_load_report {
  char model[MOEJIT_NAME_MAX];  /* spec name */
  char origin[MOEJIT_PATH_MAX]; /* the config path, "preset:NAME" or "spec" */
  char arch[MOEJIT_ARCH_MAX];
  int n_kernels; /* families loaded (entries of kernels[]) */
  int cache_hits, cache_misses;
  double compile_ms; /* wall time of the parallel generate + compile step */
  double load_ms;    /* wall time of the module loads and function lookups */
  double total_ms;   /* the whole load call, spec parsing included */
  moejit_load_kernel kernels[MOEJIT_LOAD_MAX_KERNELS];
} moejit_load_report;

typedef struct moejit_load_opts {
  /* If non-NULL, filled by the load (on failure: as far as it got). The
   * same report is kept in the model: moejit_model_load_report. */
  moejit_load_report *report;
  /* 1: ignore tuned tables, run the heuristic configuration at every T
   * (as $MOEJIT_TUNED_DISABLE=1 does for every load). */
  int tuned_disable;
  /* Expert parallelism (moejit/ep.h, docs/ep.md): all zero for one GPU.
   * With any field set (ep.world not 0, ep.nccl_comm or ep.nccl_id; a world
   * outside 1..MOEJIT_EP_MAX_WORLD is refused) the load joins or adopts the NCCL communicator,
   * places the experts, and JIT-builds the layer's kernels for this rank's
   * local experts only (the router for all of them). */
  moejit_ep_opts ep;
  /* A tuned table file to read instead of the device's (a table `moejit
   * tune` wrote, tried before it is installed), whichever GPU it names;
   * NULL: the device's table as below. tuned_disable and
   * $MOEJIT_TUNED_DISABLE=1 still turn it off. A file that cannot be read
   * or parsed fails the load (IO or CONFIG). */
  const char *tuned_table;
} moejit_load_opts;

/* Zeroes opts (no report pointer, tuned tables used). */
MOEJIT_API void moejit_load_opts_init(moejit_load_opts *opts);

/* Loads the whole layer: validates the spec, then generates and compiles
 * all of its kernel families (route, align, gemm1, gemm2, combine) at once
 * on the ctx compiler's threads through the disk cache (the next load is all
 * cache hits), loads the modules and resolves every entry the forward
 * launches. opts NULL: defaults. Errors and ownership as moejit_model_load.
 *
 * Tuned tables: the load reads the table of the ctx's device
 * ($MOEJIT_TUNED_DIR/<device>.yaml, else the one embedded from
 * configs/tuned/) and takes its gemm1/gemm2 entries for this spec's dtype
 * and shape as the GEMM variants, one per token bucket; their kernels are
 * built in the same parallel batch. The forward runs, per call, the
 * variant of the bucket nearest to T (docs/tuned-tables.md). A table that
 * exists but does not parse fails the load (CONFIG with file:line:col;
 * opts->tuned_disable or $MOEJIT_TUNED_DISABLE=1 skip it). Thread-safe. */
MOEJIT_API moejit_status moejit_model_load_spec(moejit_ctx *ctx, const moejit_spec *spec,
                                                const moejit_load_opts *opts, moejit_model **out);

/* moejit_model_load_spec from a YAML config path or an embedded preset
 * name: an existing file wins, else a preset of that name; "preset:NAME"
 * is always the preset (as the load report's origin writes it), never a
 * file; NULL is the default preset (moejit_default_preset). Errors: CONFIG or IO as
 * moejit_spec_load_file (a name holding '/' or ending in .yaml or .yml is
 * always a path: IO when it cannot be read), NOT_FOUND for any other name
 * that is neither a file nor a preset (the message lists the presets). */
MOEJIT_API moejit_status moejit_model_load_config(moejit_ctx *ctx, const char *config_or_preset,
                                                  const moejit_load_opts *opts, moejit_model **out);

/* Copies the report of the load that made `model` (any moejit_model_load*
 * call fills one). INVALID_ARGUMENT for NULL. Thread-safe. */
MOEJIT_API moejit_status moejit_model_load_report(const moejit_model *model,
                                                  moejit_load_report *report);

/* Builds, without a GPU, every kernel that moejit_model_load_spec builds for
 * `spec` on a GPU named `device_name` (as moejit_ctx_device_info reports it,
 * e.g. "NVIDIA H100 80GB HBM3") of arch `arch` (NULL: the spec's first;
 * "auto" is refused): the five families, the GEMM variants of that
 * device's tuned table ($MOEJIT_TUNED_DIR, then the embedded tables;
 * opts->tuned_disable skips it) and the kernels their launch plans derive.
 * Through `compiler`'s cache, so a load on such a GPU whose ctx compiler
 * has the same cache directory and options (lineinfo, fast_math) finds
 * every kernel there: a pre-built cache for machines that must not pay
 * the cold compile. opts->tuned_table: that file's entries instead of the
 * device's table. device_name NULL (and no opts->tuned_table) or without a
 * table: the heuristic kernels (the report's config_detail says why). opts
 * may be NULL;
 * opts->report receives a load report (load_ms 0: no modules are loaded).
 * INVALID_ARGUMENT for NULL compiler or spec, a bad arch, or opts.ep set;
 * the spec's and the compiler's errors as a load. Thread-safe. */
MOEJIT_API moejit_status moejit_model_prebuild(moejit_compiler *compiler, const moejit_spec *spec,
                                               const char *arch, const char *device_name,
                                               const moejit_load_opts *opts);

/* Where the configuration of one GEMM launch comes from. */
typedef enum moejit_config_source {
  MOEJIT_CONFIG_HEURISTIC = 0,    /* the spec's kernels section (or built-in defaults), path AUTO */
  MOEJIT_CONFIG_TUNED_EXACT = 1,  /* the tuned table's entry for exactly this T */
  MOEJIT_CONFIG_TUNED_NEAREST = 2 /* the tuned entry of the nearest token bucket */
} moejit_config_source;

/* What moejit_moe_forward runs for GEMM `kernel` ("gemm1" or "gemm2") at
 * `tokens` tokens: *source (may be NULL) and, if desc is non-NULL, a line
 * such as "tuned, nearest bucket T=32 for T=40: 64x128x64 s4 w8, path
 * wgmma, entry moejit_gemm1_swiglu_wgmma (table ...)" or "heuristic:
 * 128x256x64 s4 w8, path auto, entry moejit_gemm1_swiglu_mma (no tuned
 * table for ...)" (truncated to cap). Host only, no GPU work.
 * INVALID_ARGUMENT for NULL model or kernel, an unknown kernel, a model
 * without that GEMM, or tokens outside 1..INT32_MAX / top_k; UNSUPPORTED
 * where the forward would refuse the kernel (more shared memory a block
 * than the GPU allows). */
MOEJIT_API moejit_status moejit_model_gemm_choice(const moejit_model *model, const char *kernel,
                                                  int64_t tokens, char *desc, size_t cap,
                                                  moejit_config_source *source);

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/* One MoE layer, T tokens: out[t] = sum_j w[t,j] * W2[e_j] (silu(W1g[e_j] x)
 * * (W1u[e_j] x)) with (e_j, w[t,j]) the top-k of the routing rule. The
 * top-k weights are applied in combine (fp32, after y is rounded to the
 * activation dtype), not as a GEMM 2 row scale. */
typedef struct moejit_moe_args {
  int64_t tokens;          /* T, 1 .. INT32_MAX / top_k (expert-parallel: 0
                              too, for a rank without tokens this step; x,
                              logits and out may then be NULL; at most
                              INT32_MAX / (top_k * world), which the
                              workspace query checks) */
  const void *x;           /* [T, d] of spec.act_dtype; 16-byte aligned */
  const void *logits;      /* [T, E] router logits of spec.logits_dtype; 16-byte
                              aligned. NULL with gate_weight (below): exactly one
                              of the two */
  const float *route_bias; /* [E] fp32 selection bias (sigmoid rule) or NULL;
                              16-byte aligned */
  const void *w1;          /* [E, 2f, d] of spec.weight_dtype (gate rows, then
                              up rows); 16-byte aligned. Expert-parallel: this
                              rank's local experts only, [E_local, 2f, d] in
                              moejit_model_ep_local_experts order */
  const void *w2;          /* [E, d, f] of spec.weight_dtype; 16-byte aligned
                              (expert-parallel: [E_local, d, f]) */
  void *out;               /* out [T, d] of spec.out_dtype; 16-byte aligned */
  void *workspace;         /* moejit_moe_workspace_size(T) bytes or more,
                              256-byte aligned; no initialization needed */
  size_t workspace_bytes;
  /* Optional outputs, NULL: kept inside the workspace. The routing result
   * [T, k], as moejit_route writes it; 4-byte aligned. */
  int32_t *topk_ids;
  float *topk_weights;
  /* Expert-parallel models only (docs/ep.md); ignored otherwise.
   * ep_capacity: rows each rank sends to each peer.
   *   0: exact. Ranks first exchange their counts, the host waits for them
   *      (one wait per forward, as moejit_model_ep_wait waits, up to
   *      opts.ep.timeout_ms of the load; cannot be captured in a CUDA
   *      graph) and exactly the routed rows move.
   *   > 0: fixed capacity, the same on every rank. Nothing waits on the
   *      host, so the forward can be captured and replayed. A token whose
   *      experts on a peer would be its (capacity+1)-th row to that peer is
   *      not sent there: those experts add nothing to its output, and the
   *      number of such (token, rank) pairs goes to *ep_dropped. Capacity
   *      >= the largest T of any rank drops nothing.
   * ep_dropped: NULL or a device int32 [1], written every forward.
   * ep_events: NULL or MOEJIT_EP_EVENTS events of the model's ctx, recorded at
   * the phase boundaries (moejit/ep.h); inside a capture they become event
   * nodes of the graph, recorded at every replay. */
  int64_t ep_capacity;
  int32_t *ep_dropped;
  moejit_event *ep_events;
  /* The router's weight instead of its logits: [E, d] of spec.weight_dtype
   * (nn.Linear(d, E, bias=False).weight), 16-byte aligned, with logits
   * NULL. The forward then computes logits = x . gate_weight^T first (one
   * or two launches more: moejit_router_logits with the workspace's
   * scratch, fp32 sums rounded to spec.logits_dtype) and routes them. Expert-parallel: the whole router,
   * [E, d], on every rank. */
  const void *gate_weight;
  /* With gate_weight: NULL, or out [T, E] of spec.logits_dtype (16-byte
   * aligned) receiving the logits the forward computed (for an auxiliary
   * loss, or to check them); NULL keeps them in the workspace. Must be NULL
   * without gate_weight. */
  void *router_logits;
} moejit_moe_args;

/* Bytes of workspace a forward of up to max_tokens tokens needs (a
 * workspace sized for the largest T serves every smaller T). The model
 * must be a whole layer (moejit_model_load_spec / _config). */
MOEJIT_API moejit_status moejit_moe_workspace_size(const moejit_model *model, int64_t max_tokens,
                                                   size_t *bytes);

/* Enqueues the layer on `stream`: route, align (2 or 3 launches), GEMM 1 +
 * SwiGLU, GEMM 2, combine; or, at decode sizes (moejit_moe_decode_layer),
 * two launches: route + GEMM 1 + SwiGLU, then GEMM 2 + combine. With
 * args->gate_weight the router's logits are computed first (one or two
 * launches more). Each GEMM runs the tuned variant of the bucket
 * nearest to T when the load found one (else the heuristic configuration;
 * also when the variant's launch plan does not hold at this T, e.g. a grid
 * too large): moejit_model_gemm_choice says which. Checks every argument
 * first (INVALID_ARGUMENT naming the field, nothing enqueued); never
 * synchronizes, allocates or loads modules, so it may run inside a stream
 * capture. Thread-safe (with separate workspaces). */
MOEJIT_API moejit_status moejit_moe_forward(const moejit_model *model, const moejit_moe_args *args,
                                            moejit_stream stream);

/* The decode layer's reach: at most MOEJIT_DECODE_MAX_TOKENS tokens and
 * MOEJIT_DECODE_MAX_ENTRIES token-slot entries (T * top_k). */
#define MOEJIT_DECODE_MAX_TOKENS 8
#define MOEJIT_DECODE_MAX_ENTRIES 64

/* 1 when moejit_moe_forward of `tokens` tokens runs the two-launch decode
 * layer: T <= MOEJIT_DECODE_MAX_TOKENS (8) and T * top_k <=
 * MOEJIT_DECODE_MAX_ENTRIES (64) token-slot entries, both GEMMs on the
 * GEMV path (moejit_model_gemm_choice), one GPU, and $MOEJIT_LAYER_DECODE
 * not "0". 0 otherwise, also for a NULL model or tokens out of range. Host
 * only. docs/layer.md, "Decode". */
MOEJIT_API int moejit_moe_decode_layer(const moejit_model *model, int64_t tokens);

/* 1 when moejit_moe_forward of `tokens` tokens runs GEMM 1 reading its rows
 * from x in place (align writes no permuted copy of x): GEMM 1 on the
 * Hopper kernel with 64-row tiles, or with cooperative 128-row tiles where
 * the expert width is at most 2048 and x fits in L2 x min(2, 2048 / f);
 * $MOEJIT_GEMM1_GATHER "1" / "0" forces it where the kernel can / never.
 * 0 for the decode layer, an expert-parallel model, a NULL model or tokens
 * out of range. Host only. docs/layer.md, "GEMM 1 reading x in place". */
MOEJIT_API int moejit_moe_gemm1_gathers(const moejit_model *model, int64_t tokens);

/* FLOPs of one forward's two GEMMs (6 * T * k * d * f), for reports. */
MOEJIT_API double moejit_moe_flops(const moejit_spec *spec, int64_t tokens);

/* ------------------------------------------------------------------------ */
/* CUDA graphs: capture work enqueued on a stream, replay it                */
/* ------------------------------------------------------------------------ */
/* Thin wrappers of the driver's stream capture (cuStreamBeginCapture with
 * CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, cuStreamEndCapture,
 * cuGraphInstantiateWithFlags, cuGraphLaunch). The legacy default stream
 * (NULL) cannot be captured: use moejit_stream_create. While a stream is
 * capturing, work enqueued on it is recorded, not run. */

typedef struct moejit_graph moejit_graph;

/* Starts capturing `stream`. INVALID_ARGUMENT for a NULL stream. */
MOEJIT_API moejit_status moejit_graph_begin_capture(moejit_ctx *ctx, moejit_stream stream);

/* Ends the capture of `stream` and instantiates what was recorded. Always
 * ends the capture (given a stream), also when the capture was invalidated
 * by an illegal call in between (then CUDA with the driver's message, *out
 * NULL), and with a NULL out (INVALID_ARGUMENT; the graph is dropped).
 * *out is owned by the caller: moejit_graph_destroy. A graph must not be
 * launched or destroyed from two threads at once (CUDA runs one replay of
 * an instantiated graph at a time: serialize its launches). */
MOEJIT_API moejit_status moejit_graph_end_capture(moejit_ctx *ctx, moejit_stream stream,
                                                  moejit_graph **out);

/* Enqueues one replay of `graph` on `stream` (any stream of the ctx's
 * device). Never synchronizes. INVALID_ARGUMENT for a graph of another
 * ctx. */
MOEJIT_API moejit_status moejit_graph_launch(moejit_ctx *ctx, moejit_graph *graph,
                                             moejit_stream stream);

/* Frees a graph (replays already enqueued still complete). NULL: no-op. A
 * NULL ctx means the ctx that captured it, which must still exist. */
MOEJIT_API void moejit_graph_destroy(moejit_ctx *ctx, moejit_graph *graph);

#ifdef __cplusplus
}
#endif

#endif
