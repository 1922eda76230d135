/* moejit autotuner: sweeps of grouped-GEMM tile configurations (gemm1 +
 * SwiGLU and gemm2) over model shapes and token counts, compiled in parallel
 * through the disk cache, timed on the GPU, each checked against a float64
 * reference, and written as a tuned table that model loading reads, plus
 * every candidate's time as CSV and JSON and an SVG chart.
 * Included by moejit/moejit.h after layer.h. Sweep format, pruning rules,
 * outputs and resume: docs/tune.md.
 *
 *   moejit_sweep *sw;
 *   moejit_sweep_load_file("configs/sweeps/smoke.yaml", &sw);
 *   moejit_tune_opts o;
 *   moejit_tune_opts_init(&o);
 *   moejit_tune_summary sum;
 *   moejit_tune_run(ctx, sw, &o, &sum);   (ctx NULL: compile only)
 *   moejit_tune_summary_free(&sum);
 *   moejit_sweep_destroy(sw);
 *
 * The library never prints: progress comes through a callback
 * (moejit_tune_opts.progress) and the summary. */
#ifndef MOEJIT_TUNE_H
#define MOEJIT_TUNE_H

#include "moejit/moejit.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Sweeps                                                                   */
/* ------------------------------------------------------------------------ */

/* A loaded, checked sweep: shapes (presets or raw), token counts, and the
 * tile spaces to search. Immutable once loaded (moejit_sweep_set_shapes
 * aside, before any run); may then be shared by threads. */
typedef struct moejit_sweep moejit_sweep;

/* Loads and checks a sweep YAML file. Errors: MOEJIT_ERR_CONFIG with the
 * message "FILE:LINE:COL: key 'x': ... (allowed ...)", MOEJIT_ERR_IO when the
 * file cannot be read, NOT_FOUND for an unknown preset (the message lists
 * them). *out is NULL on failure; release with moejit_sweep_destroy. */
MOEJIT_API moejit_status moejit_sweep_load_file(const char *path, moejit_sweep **out);
/* Same, from memory; `origin` names the text in messages (NULL: "<string>"). */
MOEJIT_API moejit_status moejit_sweep_load_string(const char *text, size_t len, const char *origin,
                                                  moejit_sweep **out);
/* NULL is a no-op. */
MOEJIT_API void moejit_sweep_destroy(moejit_sweep *sweep);
/* The sweep's `name`; "" for NULL. Valid while the sweep lives. */
MOEJIT_API const char *moejit_sweep_name(const moejit_sweep *sweep);
/* The sweep's token counts (its `tokens:`, as written): the first cap of
 * them into tokens (may be NULL when cap is 0); returns how many it has (0
 * for NULL). */
MOEJIT_API size_t moejit_sweep_tokens(const moejit_sweep *sweep, int64_t *tokens, size_t cap);
/* The specs of the sweep's shapes, in order: a preset's (with its kernels:
 * tiles), a raw shape's (the defaults with its hidden, expert_width,
 * experts, top_k and dtype), or after moejit_sweep_set_shapes the specs it
 * was given; each with the sweep's target arch. The first cap into specs
 * (may be NULL when cap is 0); returns how many shapes it has (0 for
 * NULL). */
MOEJIT_API size_t moejit_sweep_shape_specs(const moejit_sweep *sweep, moejit_spec *specs,
                                           size_t cap);

/* Replaces the sweep's shapes with the shapes of n model specs (as
 * moejit_spec_load_file or moejit_spec_load_preset give them; 1 to
 * MOEJIT_TUNE_MAX_MODELS of them), so one sweep's spaces tune any model:
 * shape i is named after specs[i].name, its GEMM tiles (the config's
 * `kernels:`) are the heuristic the winners are measured against, its
 * dtypes are the config's, and it is timed at the sweep's token counts.
 * `moejit tune --model` uses it. Errors, the sweep unchanged:
 * INVALID_ARGUMENT (NULL, n out of range), CONFIG naming the spec (it does
 * not validate; its activation and weight dtypes are not both bf16 or both
 * fp16; two specs share a name; T * top_k rows do not fit int32 at the
 * sweep's largest T). Not thread-safe: call it before the sweep runs. */
MOEJIT_API moejit_status moejit_sweep_set_shapes(moejit_sweep *sweep, const moejit_spec *specs,
                                                 int n);
/* The most specs moejit_sweep_set_shapes takes (a sweep's shape limit). */
#define MOEJIT_TUNE_MAX_MODELS 64

/* Resolves a sweep argument to a file path: `name_or_path` itself when such
 * a file exists; else, for a bare name (no '/'), NAME or NAME.yaml in
 * $MOEJIT_SWEEP_DIR, then ./configs/sweeps/, then the source tree's
 * configs/sweeps/ (the directory the library was built from). NOT_FOUND
 * naming the places looked at. */
MOEJIT_API moejit_status moejit_sweep_find(const char *name_or_path, char *path, size_t cap);

/* ------------------------------------------------------------------------ */
/* Running a sweep                                                          */
/* ------------------------------------------------------------------------ */

typedef enum moejit_tune_phase {
  MOEJIT_TUNE_PHASE_PLAN = 0,    /* enumerated and pruned: one event, done = total */
  MOEJIT_TUNE_PHASE_COMPILE = 1, /* one event per kernel compiled or found in the cache */
  MOEJIT_TUNE_PHASE_TIME = 2,    /* one event per (candidate, token count) measured */
  MOEJIT_TUNE_PHASE_GROUP = 3    /* one event per (kernel, shape, token count) done: winner */
} moejit_tune_phase;

/* What a progress callback sees. Strings are valid during the call only. */
typedef struct moejit_tune_progress {
  moejit_tune_phase phase;
  size_t done, total; /* items of this phase finished, and in all */
  double elapsed_s;   /* since moejit_tune_run started */
  /* The item, e.g. "qwen3-30b-a3b gemm1 T=256 wgmma 128x256x64 s4 w8". */
  const char *item;
  /* COMPILE: "cache-hit", "compiled", "compile-failed"; TIME: "ok", "wrong",
   * "failed", "skipped-budget", "not-timed" (the GPU failed); GROUP: "ok" or
   * "no-winner". */
  const char *status;
  double us;           /* TIME: the median; GROUP: the winner's median */
  double heuristic_us; /* GROUP: the built-in choice's median (0: unknown) */
  const char *message; /* why it failed, or "" */
} moejit_tune_progress;

/* Called from the thread running moejit_tune_run or from one of its compile
 * threads, one call at a time. */
typedef void (*moejit_tune_progress_fn)(const moejit_tune_progress *progress, void *user);

typedef struct moejit_tune_opts {
  /* The tuned table to write or merge into. NULL: configs/tuned/<device file
   * name> under the current directory (e.g. NVIDIA_H100_80GB_HBM3.yaml). */
  const char *out_table;
  /* Where results.csv, results.json and chart.svg go; a results.csv found
   * there is resumed. NULL: tune-out/<sweep name> under the current dir. */
  const char *results_dir;
  int jobs;              /* compile threads; 0: all online CPUs */
  double budget_seconds; /* 0: none; else no new timing starts after this
                            many seconds from the start of the run */
  int warmup, iters;     /* > 0: override the sweep's timing settings */
  /* Compile-only runs (ctx NULL): the target arch (NULL: the sweep's
   * `arch`, default sm_90a) and the compiler (NULL: one with default
   * options, made for the run). With a ctx, its device arch and compiler. */
  const char *arch;
  moejit_compiler *compiler;
  int dry_run;  /* 1: enumerate and prune only; nothing compiled or written */
  int no_table; /* 1: write results but no tuned table */
  moejit_tune_progress_fn progress;
  void *progress_user;
  /* > 0: stability of a re-tune. Where the table already holds an entry for
   * a point and this run timed that entry's configuration within this many
   * percent of the point's winner, the entry keeps its configuration (with
   * this run's time), so run-to-run noise does not swap tiles; only clear
   * gains replace it. 0: every winner replaces the entry of its point. */
  double keep_within;
  /* The runoff: after a point's candidates are timed, its finalists (the
   * built-in choice, the `runoff` fastest candidates and, with keep_within,
   * the table's entry for the point) are timed RUNOFF_ROUNDS more times,
   * interleaved, in alternating order, and each keeps the median of its
   * timings, so one lucky or unlucky pass (clocks, the GPU's temperature)
   * does not pick the winner. 0: the sweep's `timing.runoff` (default 3);
   * < 0: no runoff. */
  int runoff;
  /* 1: this run's winners replace the table's pinned entries too (those a
   * layer check pinned to the heuristic, moejit_tuned_table_pin_heuristic).
   * 0: a pinned entry keeps its plan and the point's winner is not written
   * there (summary.table_pinned_kept counts them); `moejit tune
   * --check-layer` sets it, as its check pins again where the layer still
   * loses. */
  int replace_pinned;
} moejit_tune_opts;

/* Extra timings of each finalist in the runoff (moejit_tune_opts.runoff),
 * and the most candidates a runoff takes. */
#define MOEJIT_TUNE_RUNOFF_ROUNDS 2
#define MOEJIT_TUNE_MAX_RUNOFF 16

/* Zeroes opts: every field at its default. */
MOEJIT_API void moejit_tune_opts_init(moejit_tune_opts *opts);

#define MOEJIT_TUNE_MAX_REASONS 24

/* A pruning reason and how many candidates it removed. */
typedef struct moejit_tune_reason {
  char reason[96]; /* e.g. "shared memory over 227 KiB", "duplicate launch plan" */
  size_t count;
} moejit_tune_reason;

/* The winner of one (kernel, shape, token count). */
typedef struct moejit_tune_winner {
  char kernel[16];             /* "gemm1" or "gemm2" */
  char shape[MOEJIT_NAME_MAX]; /* the sweep's shape name (a preset's name) */
  moejit_dtype dtype;
  int64_t hidden, expert_width;
  int32_t experts, top_k;
  int64_t tokens;
  moejit_gemm_cfg cfg;
  /* A moejit_gemm_path, MOEJIT_GEMM_PATH_MMA, _WGMMA or _GEMV (an int here
   * because moejit/gemm.h may not be complete when this header is read).
   * GEMV ignores cfg: it is the tile the kernel's module is built with. */
  int path;
  double us;           /* its median, microseconds */
  double heuristic_us; /* moejit's built-in choice (path AUTO) in the same run; 0: unknown */
  double tflops;
  size_t candidates_ok; /* candidates that ran and passed the check */
} moejit_tune_winner;

typedef struct moejit_tune_summary {
  char sweep[MOEJIT_NAME_MAX];
  char device[256];           /* the GPU's name; "" for compile-only runs */
  char arch[MOEJIT_ARCH_MAX]; /* the arch compiled for */
  int timed;                  /* 1: candidates were timed on a GPU */
  /* Planning: (kernel, shape, tile config, path) candidates the spaces
   * span, how many were pruned before compiling, and why. */
  size_t enumerated, pruned, candidates;
  moejit_tune_reason prune_reasons[MOEJIT_TUNE_MAX_REASONS];
  size_t n_prune_reasons;
  size_t points; /* (candidate, token count) pairs to time, heuristic baselines included */
  /* Compiling: distinct kernels (a tile config's module serves every path). */
  size_t kernels, cache_hits, compiled, compile_failed;
  double compile_s;      /* wall time of the parallel compile phase */
  double kernels_per_s;  /* kernels / compile_s (cache hits included) */
  double compiled_per_s; /* fresh NVRTC compiles / compile_s */
  int jobs;              /* compile threads used */
  /* Timing. */
  size_t measured, resumed, wrong, failed, skipped_budget;
  size_t runoff_timed; /* timings of finalists in the runoff (beside `measured`) */
  double time_s, total_s;
  char stop_reason[256]; /* why timing stopped early, or "" */
  /* Outputs ("" when not written). */
  char results_dir[MOEJIT_PATH_MAX];
  char table_path[MOEJIT_PATH_MAX];
  size_t table_entries; /* entries this run put in the table */
  size_t table_kept;    /* of those, entries that kept their configuration (keep_within) */
  /* One per (kernel, shape, token count) with a winner; owned by the
   * summary: release with moejit_tune_summary_free. */
  moejit_tune_winner *winners;
  size_t n_winners;
  /* Winners not written because the table's entry for their point is
   * pinned (moejit_tune_opts.replace_pinned 0). */
  size_t table_pinned_kept;
} moejit_tune_summary;

/* Runs a sweep: enumerate and prune candidates, compile every remaining
 * tile config on `jobs` threads through the disk cache (a re-run compiles
 * nothing), then with a ctx time each candidate at each token count
 * (warm-up, CUDA events, the median of `iters`, inputs rotated so timings
 * are not L2-warm) after checking its output on sampled rows against a
 * float64 reference (a wrong candidate cannot win); the built-in choice
 * (path AUTO, the shape's own tiles) is timed in the same run. Writes
 * results.csv, results.json and chart.svg in the results dir and merges the
 * winners into the tuned table (stamped with device, arch, NVRTC and driver
 * versions and the date). Candidates a previous run in the same results dir
 * measured on the same device are not timed again.
 *
 * ctx NULL: compile only (cache warming); no timing, no table. opts NULL:
 * the moejit_tune_opts_init defaults, which write the table to
 * ./configs/tuned/<device>.yaml (a model load reads it from there only
 * through $MOEJIT_TUNED_DIR; set opts->out_table to put it elsewhere).
 * Compile failures, wrong candidates and an exhausted budget are recorded,
 * not errors. Returns INVALID_ARGUMENT for a NULL sweep or summary, IO when outputs
 * cannot be written, CUDA when the GPU context died mid-run (what finished
 * is still written), OUT_OF_MEMORY. *summary is filled as far as the run
 * got; release it with moejit_tune_summary_free. Not thread-safe with
 * other work on the same ctx (timings would be disturbed). */
MOEJIT_API moejit_status moejit_tune_run(moejit_ctx *ctx, const moejit_sweep *sweep,
                                         const moejit_tune_opts *opts,
                                         moejit_tune_summary *summary);

/* Frees the summary's winners; NULL is a no-op. */
MOEJIT_API void moejit_tune_summary_free(moejit_tune_summary *summary);

/* The GEMM configuration the tuned table of `device_name` (e.g. the
 * moejit_device_info name, "NVIDIA H100 80GB HBM3") names for GEMM `which`
 * (1 or 2) of spec at `tokens` tokens, found as model loading finds it
 * ($MOEJIT_TUNED_DIR, then the embedded tables; the nearest token bucket):
 * *cfg and *path (MMA, WGMMA or GEMV) and *source (TUNED_EXACT or
 * TUNED_NEAREST; may be NULL). NOT_FOUND, with the reason, when there is
 * no table or no entry for this shape (then run spec's own tiles with path
 * AUTO); CONFIG when the table does not parse; INVALID_ARGUMENT for NULL
 * arguments, which other than 1 or 2, tokens < 1. Host only. */
MOEJIT_API moejit_status moejit_tuned_choice(const char *device_name, const moejit_spec *spec,
                                             int which, int64_t tokens, moejit_gemm_cfg *cfg,
                                             int *path, int *source);

/* Pins the heuristic at one token count of a tuned table file: writes an
 * entry for GEMM `which` (1 or 2) of spec at `tokens` that holds the plan a
 * load with tuned tables off runs there (its path and tile on the table's
 * arch, the GEMV kernel within the decode layer's reach; spec's kernels:
 * tiles are the heuristic's base), replacing the
 * table's entry for that T, so that no other bucket of the table reaches
 * T. The entry is marked `pinned: true`, and a later moejit_tune_run into
 * the table keeps it (moejit_tune_opts.replace_pinned). `moejit tune
 * --check-layer` pins where a tuned choice ran the whole
 * layer slower than the heuristic (docs/tune.md). `us`: the GEMM's time
 * alone at that T where it is known (the entry's us and heuristic_us), else
 * 0 ("not timed alone"). *cfg and *path (MMA, WGMMA or GEMV; both may be
 * NULL) receive the plan; *changed (may be NULL) is 1 when the table's
 * choice at T changed and 0 when the table already ran this plan at T (its
 * entry for T, or where it has none its nearest bucket, holds it), in
 * which case the file is left as it was. Written atomically. Errors, the file unchanged:
 * INVALID_ARGUMENT (NULL table_path or spec, which, tokens < 1, us < 0 or
 * not finite, a spec moejit_spec_validate refuses, dtypes other than bf16
 * or fp16 for both act and weight), IO (the table cannot be read or
 * written), CONFIG (it does not parse), NOT_FOUND (the heuristic runs the
 * SIMT kernel there, which a table cannot name). Host only. */
MOEJIT_API moejit_status moejit_tuned_table_pin_heuristic(const char *table_path,
                                                          const moejit_spec *spec, int which,
                                                          int64_t tokens, double us,
                                                          moejit_gemm_cfg *cfg, int *path,
                                                          int *changed);

#ifdef __cplusplus
}
#endif

#endif
