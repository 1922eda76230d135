/* Internal face of the autotuner (moejit/tune.h): the loaded sweep, the
 * candidate plan (enumeration, pruning, dedupe), result rows and their
 * files, and the backend the engine measures through, so that CPU tests can
 * inject a fake compiler and timer. */
#ifndef MOEJIT_SRC_TUNE_TUNE_H
#define MOEJIT_SRC_TUNE_TUNE_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

#define MJ_SWEEP_MAX_TOKENS 32 /* token counts per sweep (a candidate's mask is 32 bits) */
#define MJ_SWEEP_MAX_VALUES 64 /* values per tile parameter of a space */
#define MJ_SWEEP_MAX_SHAPES 64
#define MJ_SWEEP_MAX_SPACES 32
#define MJ_SWEEP_MAX_SPACE 100000 /* candidates one space may span per kernel and shape */
#define MJ_TUNE_MAX_CHECK_ROWS 64

/* Tile parameters a space sweeps, in this order. */
enum {
  MJ_P_TILE_M,
  MJ_P_TILE_N,
  MJ_P_TILE_K,
  MJ_P_STAGES,
  MJ_P_WARPS,
  MJ_P_RASTER,
  MJ_P_CLUSTER_M,
  MJ_P_CLUSTER_N,
  MJ_P_SCHEDULE,
  MJ_P_COUNT
};

/* Bits of the kernels and paths masks. */
#define MJ_KERNEL_BIT(which) (1u << (which))       /* which: 1 gemm1, 2 gemm2 */
#define MJ_PATH_BIT(path) (1u << (unsigned)(path)) /* MOEJIT_GEMM_PATH_MMA, _WGMMA, _GEMV */

typedef struct mj_sweep_shape {
  char name[MOEJIT_NAME_MAX];
  char preset[MOEJIT_NAME_MAX]; /* "" for a raw shape */
  moejit_spec spec;             /* the base spec: its gemm1/gemm2 are the heuristic's tiles */
  int64_t tokens[MJ_SWEEP_MAX_TOKENS];
  int n_tokens;
  int line, col;
} mj_sweep_shape;

typedef struct mj_sweep_space {
  unsigned kernels, paths;             /* masks */
  int64_t tokens[MJ_SWEEP_MAX_TOKENS]; /* n_tokens 0: every token count */
  int n_tokens;
  int values[MJ_P_COUNT][MJ_SWEEP_MAX_VALUES];
  int n_values[MJ_P_COUNT];
  int line, col;
} mj_sweep_space;

/* At decode sizes (T * k <= MOEJIT_GEMV_MAX_ROWS), where AUTO runs the GEMV
 * kernel, how much faster than GEMV another path must be to win the point:
 * the layer's two-launch decode form, which needs GEMV on both GEMMs, took
 * 9.2 us off qwen3-30b-a3b and olmoe-1b-7b at T = 1 on an H100 (44.3 -> 35.1
 * and 52.1 -> 42.9 us; docs/layer.md, "Decode"). */
#define MJ_TUNE_DECODE_FORM_US 10.0

/* Most candidates in a point's runoff (timing.runoff, --runoff). */
#define MJ_TUNE_MAX_RUNOFF MOEJIT_TUNE_MAX_RUNOFF

struct moejit_sweep {
  char name[MOEJIT_NAME_MAX];
  char origin[MOEJIT_PATH_MAX];
  char arch[MOEJIT_ARCH_MAX]; /* compile-only target, default sm_90a */
  unsigned kernels, paths;    /* defaults for spaces that do not say */
  int64_t tokens[MJ_SWEEP_MAX_TOKENS];
  int n_tokens;
  mj_sweep_shape *shapes;
  int n_shapes;
  mj_sweep_space *spaces;
  int n_spaces;
  /* timing */
  int warmup, iters, min_iters;
  double max_point_ms; /* fewer than iters (not under min_iters) past this */
  double rotate_bytes; /* inputs rotate until one pass touches this much */
  int runoff;          /* candidates in each point's runoff beside the heuristic; 0: none */
  /* check */
  int check_rows;
  double tolerance;
  uint64_t seed;
  int divisible; /* constraints.divisible */
};

/* ------------------------------------------------------------------------ */
/* The plan: every candidate the spaces span, pruned or not                 */

typedef struct mj_tune_cand {
  int shape, which; /* index into sweep->shapes; 1 gemm1, 2 gemm2 */
  moejit_gemm_cfg cfg;
  moejit_gemm_path path; /* MOEJIT_GEMM_PATH_MMA, _WGMMA or _GEMV */
  uint32_t tmask;        /* token counts (bits index shape->tokens) it is timed at */
  int pruned;            /* 1: not compiled or timed */
  char category[96];     /* pruning reason, counted in the summary */
  char reason[384];      /* the detail written in the results */
  int heuristic;         /* 1: added because AUTO resolves to it at some T */
  int unit;              /* compile unit (filled by the engine); -1 none */
} mj_tune_cand;

typedef struct mj_tune_plan {
  mj_tune_cand *cands;
  size_t n, cap;
  size_t enumerated, pruned;
  moejit_tune_reason reasons[MOEJIT_TUNE_MAX_REASONS];
  size_t n_reasons;
} mj_tune_plan;

/* Enumerates the sweep's spaces for `arch` (the target: wgmma candidates
 * are pruned elsewhere than sm_90a), prunes (spec rules, path blockers,
 * divisibility, identical launch plans) and adds the tiles AUTO resolves to
 * at each token count. OUT_OF_MEMORY only. */
moejit_status mj_tune_plan_build(const moejit_sweep *sweep, const char *arch, mj_tune_plan *plan);
void mj_tune_plan_free(mj_tune_plan *plan);

/* The spec a candidate runs with: the shape's base spec, GEMM `which` set to
 * cfg, archs set to `arch`. */
void mj_tune_cand_spec(const moejit_sweep *sweep, int shape, int which, const moejit_gemm_cfg *cfg,
                       const char *arch, moejit_spec *out);

/* The (cfg, explicit path) AUTO runs for `rows` rows of GEMM `which` of
 * base on arch: GEMV (rows <= MOEJIT_GEMV_MAX_ROWS; cfg is the spec's tile,
 * which that kernel ignores), the spec's tile on wgmma or mma, the narrow
 * decode tile on wgmma, or mma.sync's decode tile. 0 when AUTO would run
 * SIMT. */
int mj_tune_heuristic_tile(const moejit_spec *base, int which, int64_t rows, const char *arch,
                           moejit_gemm_cfg *cfg, moejit_gemm_path *path);

/* The same for what a load without tuned tables runs at `tokens` tokens:
 * within the decode layer's reach the GEMV kernel at any row count
 * (mj_layer_heuristic_path), elsewhere AUTO's plan as above. (The tuner's
 * own heuristic row stays AUTO's: docs/tune.md.) */
int mj_tune_layer_heuristic_tile(const moejit_spec *base, int which, int64_t tokens,
                                 const char *arch, moejit_gemm_cfg *cfg, moejit_gemm_path *path);

/* ------------------------------------------------------------------------ */
/* Result rows and their files                                              */

typedef enum mj_tune_status {
  MJ_TS_PENDING = 0,
  MJ_TS_OK,
  MJ_TS_PRUNED,
  MJ_TS_COMPILE_FAILED,
  MJ_TS_WRONG,
  MJ_TS_FAILED,
  MJ_TS_SKIPPED_BUDGET,
  MJ_TS_COMPILED,  /* compile-only run */
  MJ_TS_NOT_TIMED, /* timing stopped (the GPU context died) */
  MJ_TS_COUNT
} mj_tune_status;

const char *mj_tune_status_name(mj_tune_status s);

typedef enum mj_tune_role { MJ_ROLE_CANDIDATE = 0, MJ_ROLE_HEURISTIC = 1 } mj_tune_role;

typedef struct mj_tune_row {
  /* identity */
  char device[256];
  char arch[MOEJIT_ARCH_MAX];
  char shape[MOEJIT_NAME_MAX];
  int which;
  moejit_dtype dtype;
  int64_t hidden, expert_width;
  int32_t experts, top_k;
  int64_t tokens;
  mj_tune_role role;
  moejit_gemm_path path; /* AUTO for the heuristic row */
  moejit_gemm_cfg cfg;
  /* result */
  mj_tune_status status;
  char reason[384];
  double us, tflops, gbs, rel_err;
  int iters;
  double copy_us; /* GEMM 1: the permuted copy's charge inside us (0: gathers, or none) */
  char date[16];
  /* engine bookkeeping (not written) */
  int cand; /* index into the plan, -1 for heuristic rows */
  int t_index;
  int resumed; /* 1: taken from an earlier run's results.csv */
} mj_tune_row;

typedef struct mj_tune_rows {
  mj_tune_row *rows;
  size_t n, cap;
} mj_tune_rows;

moejit_status mj_tune_rows_push(mj_tune_rows *r, const mj_tune_row *row);
void mj_tune_rows_free(mj_tune_rows *r);

/* 1 when two rows name the same measurement (device, kernel, dtype, shape
 * numbers, tokens, role, path, tile). */
int mj_tune_row_same(const mj_tune_row *a, const mj_tune_row *b);

/* results.csv: one header line, one line per row. */
moejit_status mj_tune_write_csv(const mj_tune_rows *rows, const char *path);
/* Reads a results.csv written by mj_tune_write_csv; lines it cannot read
 * are skipped. IO when the file exists but cannot be read; a missing file is
 * MOEJIT_OK with no rows. */
moejit_status mj_tune_read_csv(const char *path, mj_tune_rows *rows);

typedef struct mj_tune_meta {
  const char *sweep, *device, *arch, *nvrtc, *date;
  int driver;
} mj_tune_meta;

moejit_status mj_tune_write_json(const mj_tune_rows *rows, const mj_tune_meta *meta,
                                 const moejit_tune_winner *winners, size_t n_winners,
                                 const char *path);
/* chart.svg: a panel per (kernel, shape), time against token count on log
 * axes, a polyline per config, the winners and the heuristic highlighted. */
moejit_status mj_tune_write_svg(const mj_tune_rows *rows, const mj_tune_meta *meta,
                                const char *path);

/* ------------------------------------------------------------------------ */
/* Host data and the float64 reference of sampled rows                      */

/* Inputs are a periodic pattern: element i of a buffer with base `offset`
 * holds chunk[(offset + i) % n], so the host can recompute any element
 * without keeping the (possibly 15 GB) device buffers. */
typedef struct mj_tune_data {
  moejit_dtype dtype;
  int scale_exp;   /* values are +-[1, 2) * 2^-scale_exp */
  uint16_t *chunk; /* n dtype bit patterns */
  size_t n;
  double lut[65536]; /* bits -> value */
} mj_tune_data;

/* Fills `d` for dtype (fp16/bf16) and a reduction length k (values scaled
 * so dot products stay near 1 in both dtypes). n elements, seeded. */
moejit_status mj_tune_data_make(mj_tune_data *d, moejit_dtype dtype, int64_t k, size_t n,
                                uint64_t seed);
void mj_tune_data_free(mj_tune_data *d);

/* The float64 reference of rows[0..n_rows) of GEMM `which` (gemm2 without
 * row scale): A [max_rows, K] at a_offset, W at w_offset (layouts of
 * moejit/gemm.h), expert of each row from offsets. ref is [n_rows, N]. Runs
 * on `jobs` threads. Row r of A is row r of the pattern, or with a_period >
 * 0 row r % a_period (A repeats: the GPU backend's GEMM 1 inputs from the
 * copy), or with a_map row a_map[r] (the x row that a gathering GEMM 1
 * reads for it: align's sorted_slot / top_k, mj_tune_sorted_slots). */
void mj_tune_reference(const mj_tune_data *d, const moejit_spec *spec, int which,
                       const int32_t *offsets, const int64_t *rows, int n_rows, size_t a_offset,
                       int64_t a_period, const int32_t *a_map, size_t w_offset, int jobs,
                       double *ref);

/* ||got - ref|| / ||ref|| over n values stored as dtype bits; INFINITY for
 * a NaN or infinity. */
double mj_tune_rel_error(const mj_tune_data *d, const uint16_t *got, const double *ref, size_t n);

/* Seeded routing: each of `tokens` tokens picks top_k distinct experts
 * uniformly; offsets [E+1]; choice (or NULL) the picks [tokens, top_k], token
 * t's j-th expert at t * top_k + j (the draws are the same either way).
 * Returns the number of experts with rows, or -1 when out of memory. */
int mj_tune_route(int32_t experts, int32_t top_k, int64_t tokens, uint64_t seed, int32_t *offsets,
                  int32_t *choice);

/* align's sorted_slot for routing `choice` [entries] (mj_tune_route's
 * picks) and its offsets: rows grouped by expert, slots (t * top_k + j)
 * ascending inside an expert, so a gathering GEMM 1 reads row r from x row
 * slot[r] / top_k. slot [entries]. Returns 0, or -1 when out of memory. */
int mj_tune_sorted_slots(const int32_t *choice, const int32_t *offsets, int32_t experts,
                         int64_t entries, int32_t *slot);

/* Up to n rows spread over the experts that have rows (seeded). Returns the
 * count written. */
int mj_tune_check_rows(const int32_t *offsets, int32_t experts, int n, uint64_t seed,
                       int64_t *rows);

uint64_t mj_tune_mix(uint64_t a, uint64_t b);         /* a seed from two numbers */
/* The median of v[0..n) (n >= 1; the mean of the middle two for even n),
 * sorting v in place. */
double mj_tune_median(double *v, size_t n);

/* ------------------------------------------------------------------------ */
/* The backend the engine compiles and measures through                     */

/* One (kernel, shape, token count): what every candidate of it runs on. */
typedef struct mj_tune_group {
  const moejit_sweep *sweep;
  int shape;
  const moejit_spec *base; /* the shape's spec, archs set to the target */
  int which;
  int64_t tokens, rows;   /* rows = tokens * top_k */
  const int32_t *offsets; /* [E+1], the routing the check uses (set 0) */
  const int32_t *choice;  /* its picks [tokens, top_k] (mj_tune_route) */
  int active_experts;
  uint64_t seed; /* for this group's data and other routings */
  int warmup, iters, min_iters;
  double max_point_ms, rotate_bytes, tolerance;
  int check_rows;
  int jobs; /* CPU threads for the reference */
} mj_tune_group;

typedef struct mj_tune_measurement {
  double us;      /* median (with copy_us); 0 when not timed (wrong) */
  double rel_err; /* on the sampled rows */
  int iters;      /* timed launches behind the median */
  /* GEMM 1 as the layer runs it (docs/tune.md, "GEMM 1 as the layer runs
   * it"): 1 when the candidate gathers x's rows in place; otherwise the
   * layer's permuted copy of x, charged as copy_us (in us) */
  int gathers;
  double copy_us;
} mj_tune_measurement;

typedef struct mj_tune_backend {
  void *state;
  char device[256];
  char arch[MOEJIT_ARCH_MAX];
  char nvrtc[16];
  int driver;
  int can_time; /* 0: compile only */
  /* Compiles (or finds in the cache) the kernel of `family` for spec.
   * Thread-safe; runs on the compile threads. */
  moejit_status (*compile)(void *state, const moejit_spec *spec, const char *family,
                           int *cache_hit);
  /* Allocates and fills inputs for a group, computes its reference. */
  moejit_status (*open_group)(void *state, const mj_tune_group *g);
  /* Runs spec's GEMM on `path` once against the reference, then (when the
   * relative error is within g->tolerance) times it. */
  moejit_status (*measure)(void *state, const mj_tune_group *g, const moejit_spec *spec,
                           moejit_gemm_path path, mj_tune_measurement *m);
  void (*close_group)(void *state, const mj_tune_group *g);
  /* 0 when the device can no longer run anything (sticky CUDA error). */
  int (*alive)(void *state);
  /* Clock in ms; NULL: mj_now_ms. */
  double (*now_ms)(void *state);
  /* Frees state (mj_tune_backend_free); NULL: nothing to free. */
  void (*destroy)(void *state);
} mj_tune_backend;

/* The engine behind moejit_tune_run, with an explicit backend. */
moejit_status mj_tune_run_backend(const moejit_sweep *sweep, const moejit_tune_opts *opts,
                                  const mj_tune_backend *be, moejit_tune_summary *summary);

/* The GPU backend on ctx (tune_gpu.c) and the compile-only one. Release
 * with mj_tune_backend_free. */
moejit_status mj_tune_gpu_backend(moejit_ctx *ctx, mj_tune_backend *be);
moejit_status mj_tune_compile_backend(moejit_compiler *compiler, const char *arch,
                                      mj_tune_backend *be);
void mj_tune_backend_free(mj_tune_backend *be);

#endif
