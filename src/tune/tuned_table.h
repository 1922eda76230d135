/* Tuned tables: the autotuner's results (moejit tune) as model loading reads
 * them. One YAML file per device, configs/tuned/<device name>.yaml (spaces
 * and other characters outside [A-Za-z0-9._-] become '_', e.g.
 * NVIDIA_H100_80GB_HBM3.yaml), holding the best GEMM configuration per
 * (kernel, dtype, shape, token bucket). Format and lookup rules:
 * docs/tune.md. */
#ifndef MOEJIT_SRC_TUNE_TUNED_TABLE_H
#define MOEJIT_SRC_TUNE_TUNED_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

/* One winner: kernel "gemm1" or "gemm2", for act = weight dtype `dtype`,
 * the shape (d, f, E, k) and T = tokens (the GEMM sees T * k rows). */
typedef struct mj_tuned_entry {
  char kernel[16];
  moejit_dtype dtype;
  int64_t hidden, expert_width;
  int32_t experts, top_k;
  int64_t tokens;
  moejit_gemm_cfg cfg;   /* the tile that won */
  moejit_gemm_path path; /* MOEJIT_GEMM_PATH_MMA or _WGMMA: run exactly this */
  double us;             /* its median time, microseconds */
  double heuristic_us;   /* the built-in choice's median in the same run; 0: unknown */
} mj_tuned_entry;

typedef struct mj_tuned_table {
  char device[128]; /* e.g. "NVIDIA H100 80GB HBM3" */
  char arch[16];    /* e.g. "sm_90a" */
  char nvrtc[16];   /* NVRTC version that compiled the candidates, "12.8" */
  int driver;       /* CUDA driver version, e.g. 12080 */
  char date[32];    /* ISO date of the run, "2026-11-23" */
  char origin[MOEJIT_PATH_MAX]; /* file path or "embedded:<file>" it came from */
  mj_tuned_entry *entries;
  size_t n, cap;
} mj_tuned_table;

/* Parses a table from YAML text; origin names it in messages. Errors:
 * MOEJIT_ERR_CONFIG "ORIGIN:LINE:COL: ..." (malformed, unknown keys, values
 * out of range), OUT_OF_MEMORY. On failure *t is left empty (n = 0). */
moejit_status mj_tuned_table_parse(const char *text, size_t len, const char *origin,
                                   mj_tuned_table *t);
/* mj_tuned_table_parse of a file; IO when it cannot be read. */
moejit_status mj_tuned_table_load_file(const char *path, mj_tuned_table *t);
/* Writes the table as YAML, atomically (temp file + rename), entries sorted
 * by (kernel, dtype, shape, tokens). IO on failure, nothing half-written. */
moejit_status mj_tuned_table_write(const mj_tuned_table *t, const char *path);
/* Adds e, replacing an entry with the same (kernel, dtype, shape, tokens). */
moejit_status mj_tuned_table_put(mj_tuned_table *t, const mj_tuned_entry *e);
/* Frees the entries; *t becomes empty. NULL is a no-op. */
void mj_tuned_table_free(mj_tuned_table *t);

/* "NVIDIA H100 80GB HBM3" -> "NVIDIA_H100_80GB_HBM3.yaml". */
void mj_tuned_file_name(const char *device_name, char *buf, size_t cap);

/* The table for a device: $MOEJIT_TUNED_DIR/<file> when that variable is
 * set and the file exists, else the table embedded from configs/tuned/ at
 * build time. NOT_FOUND (with the places looked at) when there is none;
 * CONFIG when a table exists but does not parse. $MOEJIT_TUNED_DISABLE=1:
 * always NOT_FOUND. */
moejit_status mj_tuned_table_for_device(const char *device_name, mj_tuned_table *t);

typedef enum mj_tuned_match {
  MJ_TUNED_NONE = 0,    /* no entry for this kernel, dtype and shape */
  MJ_TUNED_EXACT = 1,   /* an entry for exactly this token count */
  MJ_TUNED_NEAREST = 2  /* the entry of the nearest token bucket (log scale;
                           ties go to the larger bucket) */
} mj_tuned_match;

/* The entry for `kernel` ("gemm1"/"gemm2") of spec (its act dtype, d, f, E,
 * k) at `tokens`, or NULL (*match = MJ_TUNED_NONE). Entries whose cfg does
 * not validate for spec are skipped. */
const mj_tuned_entry *mj_tuned_lookup(const mj_tuned_table *t, const char *kernel,
                                      const moejit_spec *spec, int64_t tokens,
                                      mj_tuned_match *match);

#endif
