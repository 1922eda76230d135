/* moejit — JIT-specialized CUDA kernels for Mixture-of-Experts layers.
 *
 * This header is the whole public API and its manual; read it top to bottom.
 *
 * The pieces, in the order data flows through them:
 *   moejit_spec      a validated description of one MoE layer's kernel set,
 *                    loaded from YAML (moejit_spec_load_*) or filled by hand;
 *   moejit_compiler  code generator + NVRTC + on-disk cubin cache; works on a
 *                    machine without a GPU (a build box can warm a cache);
 *   moejit_cache_*   inspection and maintenance of a cache directory;
 *   moejit_ctx       one GPU: the CUDA driver (loaded with dlopen at run time,
 *                    never linked), loaded modules, memory, streams, events.
 *
 * Errors. Every call that can fail returns a moejit_status. On failure the
 * detailed message (YAML file:line:column, NVRTC log, CUDA error name, and a
 * hint on what to do) is kept per thread: moejit_last_error() returns the
 * message of the calling thread's most recent failed call. Read it right
 * after a call that failed: a call that succeeds may leave there a message
 * of a step it recovered from (a cache miss before a compile). A moejit_ctx also
 * keeps a copy of the last message any thread produced on it. No call prints,
 * exits or aborts.
 *
 * Memory. Strings and arrays that the library allocates for the caller are
 * released with moejit_free(). Objects are released by their _destroy call.
 *
 * Threads. Unless a call says otherwise: objects may be used from several
 * threads at once (compiler and ctx are internally locked); a moejit_spec is
 * plain data owned by the caller.
 */
#ifndef MOEJIT_MOEJIT_H
#define MOEJIT_MOEJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MOEJIT_BUILDING_LIBRARY) && defined(__GNUC__)
#define MOEJIT_API __attribute__((visibility("default")))
#else
#define MOEJIT_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define MOEJIT_VERSION_MAJOR 0
#define MOEJIT_VERSION_MINOR 1
#define MOEJIT_VERSION_PATCH 0
#define MOEJIT_VERSION_NUMBER \
  (MOEJIT_VERSION_MAJOR * 10000 + MOEJIT_VERSION_MINOR * 100 + MOEJIT_VERSION_PATCH)

/* The version of the library actually linked (compare with the macros). */
MOEJIT_API unsigned moejit_version_number(void);
MOEJIT_API const char *moejit_version_string(void);

/* ------------------------------------------------------------------------ */
/* Status codes and errors                                                  */
/* ------------------------------------------------------------------------ */

/* Values are pinned: they never change meaning between versions. */
typedef enum moejit_status {
  MOEJIT_OK = 0,
  MOEJIT_ERR_INVALID_ARGUMENT = 1, /* a pointer, size or option does not fit */
  MOEJIT_ERR_CONFIG = 2,           /* YAML config malformed or out of range */
  MOEJIT_ERR_IO = 3,               /* a file could not be read or written */
  MOEJIT_ERR_OUT_OF_MEMORY = 4,    /* host or device allocation failed */
  MOEJIT_ERR_COMPILE = 5,          /* NVRTC rejected generated source */
  MOEJIT_ERR_CACHE = 6,            /* cache directory unusable */
  MOEJIT_ERR_NO_DRIVER = 7,        /* libcuda.so.1 not found or unusable */
  MOEJIT_ERR_NO_DEVICE = 8,        /* driver present, no usable GPU */
  MOEJIT_ERR_CUDA = 9,             /* a CUDA driver call failed */
  MOEJIT_ERR_UNSUPPORTED = 10,     /* valid request this build/GPU cannot do */
  MOEJIT_ERR_NOT_FOUND = 11,       /* named preset, kernel or entry unknown */
  MOEJIT_ERR_INTERNAL = 12,        /* a bug in moejit: please report it */
  MOEJIT_ERR_TIMEOUT = 13          /* a wait passed its time limit */
} moejit_status;

#define MOEJIT_STATUS_COUNT 14

/* A short constant name for a status ("invalid argument"); never NULL, also
 * for values outside the enum ("unknown status"). */
MOEJIT_API const char *moejit_status_str(moejit_status status);

/* The detailed message of the calling thread's most recent failed call, or
 * "" if none failed yet. Valid until the thread's next moejit call. */
MOEJIT_API const char *moejit_last_error(void);

/* Releases memory that moejit allocated for the caller. NULL is a no-op. */
MOEJIT_API void moejit_free(void *ptr);

/* ------------------------------------------------------------------------ */
/* Spec: one MoE layer's kernel set                                         */
/* ------------------------------------------------------------------------ */

typedef enum moejit_dtype {
  MOEJIT_DTYPE_FP32 = 0,
  MOEJIT_DTYPE_FP16 = 1,
  MOEJIT_DTYPE_BF16 = 2
} moejit_dtype;

/* "fp32", "fp16", "bf16"; "?" for other values. */
MOEJIT_API const char *moejit_dtype_name(moejit_dtype dtype);
/* Bytes per element (4 or 2), 0 for other values. */
MOEJIT_API size_t moejit_dtype_size(moejit_dtype dtype);

typedef enum moejit_route_rule {
  /* scores = softmax(logits); top-k; optionally renormalize the k weights
   * to sum to 1 (Mixtral, Qwen3-MoE norm_topk_prob); OLMoE: no renorm. */
  MOEJIT_ROUTE_SOFTMAX_TOPK = 0,
  /* scores = sigmoid(logits); selection on scores + bias, restricted to the
   * topk_group best of n_group groups (a group's merit is the sum of its two
   * best biased scores); weights are the unbiased scores of the chosen
   * experts, renormalized if asked, times scaling_factor (DeepSeek-V3). */
  MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK = 1
} moejit_route_rule;

typedef struct moejit_routing {
  moejit_route_rule rule;
  int renormalize;      /* 1: the k weights of a token are renormalized */
  int n_group;          /* sigmoid rule: expert groups (divides experts) */
  int topk_group;       /* sigmoid rule: groups kept, 1..n_group */
  float scaling_factor; /* weights are multiplied by this (default 1) */
} moejit_routing;

typedef enum moejit_raster {
  MOEJIT_RASTER_ALONG_M = 0, /* consecutive tiles walk down M (reuse B) */
  MOEJIT_RASTER_ALONG_N = 1  /* consecutive tiles walk across N (reuse A) */
} moejit_raster;

/* How the Hopper (wgmma) GEMM kernel shares a CTA's work between its two
 * consumer warpgroups; other paths ignore it. */
typedef enum moejit_gemm_schedule {
  /* both warpgroups split each tile's rows (tile_m >= 128; 64-row tiles
   * run one warpgroup) */
  MOEJIT_SCHEDULE_COOPERATIVE = 0,
  /* each warpgroup computes whole tiles and the two alternate, so one
   * stores its tile while the other multiplies (tile_m x tile_n <= 16384:
   * one warpgroup holds the whole tile's sums) */
  MOEJIT_SCHEDULE_PINGPONG = 1
} moejit_gemm_schedule;

/* A schedule's name as YAML, the CLI, CSV and JSON write it: "cooperative"
 * or "pingpong"; "?" for a value outside the enum. */
MOEJIT_API const char *moejit_gemm_schedule_name(moejit_gemm_schedule schedule);

/* Launch shape of a memory-bound kernel family. */
typedef struct moejit_simple_kernel_cfg {
  int block_threads; /* threads per block: 32..1024, a multiple of 32 */
} moejit_simple_kernel_cfg;

/* Tile shape of a grouped-GEMM kernel family. */
typedef struct moejit_gemm_cfg {
  int tile_m, tile_n, tile_k; /* CTA tile */
  int stages;                 /* shared-memory pipeline depth, 2..8 */
  int warps;                  /* warps per CTA: 4, 8 or 12 */
  int cluster_m, cluster_n;   /* thread-block cluster shape, 1 or 2 each, not both 2 (wgmma
                                 path: CTA pairs along M share weight tiles, along N
                                 activation tiles) */
  moejit_raster raster;
  moejit_gemm_schedule schedule; /* wgmma path only (0, cooperative, by default) */
} moejit_gemm_cfg;

/* A GEMM configuration as reports, the tuner and the CLI print it:
 * "128x256x64 s4 w8", then " along_n", " c2" (cluster_m 2), " cn2"
 * (cluster_n 2) and the
 * schedule's name (cooperative, the default, unnamed) where they apply.
 * Truncated to cap - 1 characters. */
MOEJIT_API void moejit_gemm_cfg_text(const moejit_gemm_cfg *cfg, char *buf, size_t cap);

#define MOEJIT_MAX_ARCHS 4
#define MOEJIT_NAME_MAX 64
#define MOEJIT_ARCH_MAX 16
#define MOEJIT_PATH_MAX 1024

typedef struct moejit_spec {
  char name[MOEJIT_NAME_MAX]; /* e.g. "qwen3-30b-a3b" */

  /* Model shape. */
  int64_t hidden;       /* d: token width */
  int64_t expert_width; /* f: expert inner width */
  int32_t experts;      /* E */
  int32_t top_k;        /* k, 1..min(E, 32) */
  moejit_routing routing;

  /* Data types. */
  moejit_dtype act_dtype;    /* x, h and y */
  moejit_dtype weight_dtype; /* W1, W2 */
  moejit_dtype logits_dtype; /* router logits */
  moejit_dtype out_dtype;    /* combine output */

  /* Target architectures, e.g. "sm_90a", "sm_80", or "auto" (the GPU's). */
  int n_archs;
  char archs[MOEJIT_MAX_ARCHS][MOEJIT_ARCH_MAX];

  /* Per kernel family. */
  moejit_simple_kernel_cfg route;
  moejit_simple_kernel_cfg align;
  moejit_simple_kernel_cfg combine;
  moejit_gemm_cfg gemm1; /* gate+up with fused SwiGLU */
  moejit_gemm_cfg gemm2; /* down */

  /* Cache settings ("" / 0: defaults, see moejit_compiler_opts). */
  char cache_dir[MOEJIT_PATH_MAX];
  uint64_t cache_max_bytes;
} moejit_spec;

/* Fills every field with its documented default (docs/config.md); shape
 * fields are left 0, which moejit_spec_validate rejects until set. */
MOEJIT_API void moejit_spec_init(moejit_spec *spec);

/* Checks every field and every cross-field rule (top_k <= experts, groups
 * divide experts, tile shapes within the shared-memory budget, ...).
 * MOEJIT_ERR_CONFIG with a message naming the field and what is allowed. */
MOEJIT_API moejit_status moejit_spec_validate(const moejit_spec *spec);
/* moejit_spec_validate as if the spec's target.arch were `arch` alone: an
 * arch a config may name (not "auto"), and the rules that depend on it
 * (clusters need sm_90 or newer). CONFIG with the reason; INVALID_ARGUMENT
 * for NULL or a name too long for spec->archs. */
MOEJIT_API moejit_status moejit_spec_validate_arch(const moejit_spec *spec, const char *arch);

/* Loads and validates a YAML config. Errors are MOEJIT_ERR_CONFIG (message
 * "FILE:LINE:COL: key 'x': ... (allowed: ...)") or MOEJIT_ERR_IO. On failure
 * *spec is left unchanged. */
MOEJIT_API moejit_status moejit_spec_load_file(const char *path, moejit_spec *spec);
/* Same, from memory; `origin` names the text in messages (e.g. "<stdin>"). */
MOEJIT_API moejit_status moejit_spec_load_string(const char *text, size_t len,
                                                 const char *origin, moejit_spec *spec);
/* Loads one of the presets embedded in the library ("qwen3-30b-a3b", ...).
 * MOEJIT_ERR_NOT_FOUND for an unknown name (the message lists the known). */
MOEJIT_API moejit_status moejit_spec_load_preset(const char *name, moejit_spec *spec);

/* The embedded presets: a NULL-terminated static array of names. */
MOEJIT_API const char *const *moejit_preset_names(void);
/* The preset `moejit run` and `make run` use when given no config. */
MOEJIT_API const char *moejit_default_preset(void);
/* The YAML text of an embedded preset, or NULL. Static storage. */
MOEJIT_API const char *moejit_preset_yaml(const char *name);

/* ------------------------------------------------------------------------ */
/* Compiler: code generation, NVRTC and the disk cache (no GPU needed)      */
/* ------------------------------------------------------------------------ */

typedef struct moejit_compiler moejit_compiler;

typedef struct moejit_compiler_opts {
  /* Cache directory. Precedence: this field, $MOEJIT_CACHE_DIR, the spec's
   * cache_dir, $XDG_CACHE_HOME/moejit, ~/.cache/moejit. NULL: not set. */
  const char *cache_dir;
  /* 1: no disk cache (also when $MOEJIT_CACHE_DISABLE is set to anything
   * but "" or "0"). */
  int cache_disable;
  /* Size limit; least-recently-used entries are evicted past it. 0: the
   * spec's cache_max_bytes, then $MOEJIT_CACHE_MAXSIZE (e.g. "2G"), else
   * no limit. */
  uint64_t cache_max_bytes;
  /* Compile threads; 0: the number of online CPUs. */
  int jobs;
  /* Template directory overriding the embedded templates (also
   * $MOEJIT_TEMPLATE_DIR). NULL: not set. */
  const char *template_dir;
  /* If set, each compiled kernel's .cu, .ptx and .cubin are written here. */
  const char *emit_dir;
  int fast_math; /* 1: --use_fast_math */
  /* 1: -lineinfo, source lines for profilers and compute-sanitizer (the
   * SASS is the same; the cubin carries ~2.8x the bytes). Default 0, or
   * $MOEJIT_LINEINFO=1, through moejit_compiler_opts_init. */
  int lineinfo;
} moejit_compiler_opts;

MOEJIT_API void moejit_compiler_opts_init(moejit_compiler_opts *opts);

/* opts may be NULL (all defaults). Creating a compiler touches no GPU. */
MOEJIT_API moejit_status moejit_compiler_create(moejit_compiler **out,
                                                const moejit_compiler_opts *opts);
MOEJIT_API void moejit_compiler_destroy(moejit_compiler *compiler);

/* Kernel families in the order a layer runs them. NULL-terminated static. */
MOEJIT_API const char *const *moejit_kernel_families(void);

/* What happened to one kernel in moejit_compile. */
typedef struct moejit_kernel_report {
  char kernel[MOEJIT_NAME_MAX]; /* family, e.g. "route" */
  char arch[MOEJIT_ARCH_MAX];   /* e.g. "sm_90a" */
  char key[33];                 /* cache key, 32 hex digits */
  int cache_hit;                /* 1: served from the disk cache */
  double ms;                    /* wall time for this kernel */
  size_t cubin_bytes;
  moejit_status status;         /* MOEJIT_OK or why this kernel failed */
  char message[512];            /* first part of the error, "" if OK */
} moejit_kernel_report;

/* Generates and compiles every kernel of `spec` for `arch` (NULL: each of
 * the spec's archs; "auto" needs a GPU and is refused here; an explicit
 * arch the spec's rules refuse, as moejit_spec_validate_arch, is
 * INVALID_ARGUMENT before anything compiles) on the
 * compiler's thread pool, through the cache. Writes up to `cap` reports
 * and the number of kernels to *n_reports. Returns MOEJIT_OK if all
 * compiled, else the first failing kernel's status (all are still tried). */
MOEJIT_API moejit_status moejit_compile(moejit_compiler *compiler, const moejit_spec *spec,
                                        const char *arch, moejit_kernel_report *reports,
                                        size_t cap, size_t *n_reports);

/* The generated CUDA source of one kernel family for `arch` (NULL: the
 * spec's first arch; an explicit one is checked as by moejit_compile).
 * *source is NUL-terminated; release with moejit_free.
 * The same spec and templates always give byte-identical source. */
MOEJIT_API moejit_status moejit_generate(moejit_compiler *compiler, const moejit_spec *spec,
                                         const char *kernel, const char *arch, char **source);

/* The cache directory this compiler uses for `spec` (spec may be NULL);
 * "" when caching is disabled. */
MOEJIT_API moejit_status moejit_compiler_cache_dir(moejit_compiler *compiler,
                                                   const moejit_spec *spec, char *buf,
                                                   size_t cap);

/* NVRTC's version and the archs it can target ("sm_75 sm_80 ... sm_90a"). */
MOEJIT_API void moejit_nvrtc_version(int *major, int *minor);
MOEJIT_API moejit_status moejit_nvrtc_archs(char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Cache directory maintenance                                              */
/* ------------------------------------------------------------------------ */
/* `dir` NULL means the default directory ($MOEJIT_CACHE_DIR, then
 * $XDG_CACHE_HOME/moejit, then ~/.cache/moejit). These calls are safe to
 * run while other processes use the same cache. */

typedef struct moejit_cache_stats {
  char dir[MOEJIT_PATH_MAX];
  uint64_t entries;
  uint64_t bytes;      /* all entry files together */
  uint64_t temp_files; /* leftovers of interrupted writes */
  int64_t oldest_used; /* unix seconds, 0 if empty */
  int64_t newest_used;
} moejit_cache_stats;

typedef struct moejit_cache_entry_info {
  char key[33];
  char kernel[MOEJIT_NAME_MAX];
  char arch[MOEJIT_ARCH_MAX];
  char summary[192]; /* spec summary, e.g. "qwen3-30b-a3b d=2048 f=768 E=128 k=8 bf16" */
  uint64_t bytes;    /* entry file size */
  int64_t created;   /* unix seconds */
  int64_t last_used;
  int ok; /* 1: header, checksum and payload verified; 0: damaged (verify
             --fix removes it); -1: could not be read (permissions, I/O),
             so not known to be damaged */
} moejit_cache_entry_info;

MOEJIT_API moejit_status moejit_cache_resolve_dir(const char *dir, char *buf, size_t cap);
MOEJIT_API moejit_status moejit_cache_stats_get(const char *dir, moejit_cache_stats *stats);
/* *entries: an array of *n entries, oldest use first; release with moejit_free. */
MOEJIT_API moejit_status moejit_cache_list(const char *dir, moejit_cache_entry_info **entries,
                                           size_t *n);
/* Checks every entry; with remove_bad, deletes bad entries and stale temp
 * files. Counts of good and bad entries are written where non-NULL. */
MOEJIT_API moejit_status moejit_cache_verify(const char *dir, int remove_bad, size_t *n_ok,
                                             size_t *n_bad);
/* Evicts least-recently-used entries until the total is <= max_bytes, and
 * removes temp files older than a minute. max_bytes 0 means "no limit", as
 * everywhere in this API: only stale temp files go (moejit_cache_clear
 * empties a cache). */
MOEJIT_API moejit_status moejit_cache_prune(const char *dir, uint64_t max_bytes,
                                            size_t *n_removed, uint64_t *bytes_removed);
/* Removes every entry and temp file (keeps the directory and CACHEDIR.TAG). */
MOEJIT_API moejit_status moejit_cache_clear(const char *dir, size_t *n_removed);

/* Parses sizes like "500M", "2G", "1048576" into bytes. */
MOEJIT_API moejit_status moejit_parse_size(const char *text, uint64_t *bytes);

#ifdef __cplusplus
}
#endif

#include "moejit/runtime.h"
#include "moejit/ops.h"
#include "moejit/gemm.h"
#include "moejit/ep.h"
#include "moejit/layer.h"
#include "moejit/tune.h"

#endif /* MOEJIT_MOEJIT_H */
