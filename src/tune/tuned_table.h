/* Tuned tables: the autotuner's results (moejit tune) as model loading reads
 * them. One YAML file per device, configs/tuned/<device name>.yaml (spaces
 * and other characters outside [A-Za-z0-9._-] become '_', e.g.
 * NVIDIA_H100_80GB_HBM3.yaml), holding the best GEMM configuration per
 * (kernel, dtype, shape, token bucket). Format and lookup rules:
 * docs/tuned-tables.md. */
#ifndef MOEJIT_SRC_TUNE_TUNED_TABLE_H
#define MOEJIT_SRC_TUNE_TUNED_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

/* The most entries one table holds (a device's table for dozens of models,
 * pins between buckets included): a table is read with a YAML node limit of
 * MJ_TUNED_NODES_PER_ENTRY each, and at most MJ_TUNED_MAX_BYTES of text. */
#define MJ_TUNED_MAX_ENTRIES 4096
#define MJ_TUNED_NODES_PER_ENTRY 44
#define MJ_TUNED_MAX_BYTES ((size_t)4 << 20)

/* One winner: kernel "gemm1" or "gemm2", for act = weight dtype `dtype`,
 * the shape (d, f, E, k) and T = tokens (the GEMM sees T * k rows). */
typedef struct mj_tuned_entry {
  char kernel[16];
  moejit_dtype dtype;
  int64_t hidden, expert_width;
  int32_t experts, top_k;
  int64_t tokens;
  moejit_gemm_cfg cfg;   /* the tile that won (gemv: the tile its module is built with;
                            the GEMV kernel itself ignores it) */
  moejit_gemm_path path; /* MOEJIT_GEMM_PATH_MMA, _WGMMA or _GEMV: run exactly this */
  double us;             /* its median time, microseconds */
  double heuristic_us;   /* the built-in choice's median in the same run; 0: unknown */
  int pinned;            /* 1: a layer check put the heuristic's plan here
                            (moejit_tuned_table_pin_heuristic); a re-tune keeps
                            it unless told to replace pinned entries */
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
 * by (kernel, dtype, shape, tokens); creates the directory when missing.
 * IO on failure, nothing half-written; INVALID_ARGUMENT (nothing written)
 * for a table parse would refuse: no device, an entry out of range, two
 * entries with one key, more than MJ_TUNED_MAX_ENTRIES. parse(write(t))
 * gives t back exactly (doubles in their shortest exact decimal form). */
moejit_status mj_tuned_table_write(const mj_tuned_table *t, const char *path);
/* Serializes updates of the table at path between processes and threads:
 * an exclusive flock on its directory (created when missing), held from
 * before the table is read until after it is written, so two updates (two
 * tuners merging into one device table, pins) do not lose each other's
 * entries. create: make the directory when missing. *fd for
 * mj_tuned_table_unlock (-1 on failure, or where the file system has no
 * locks: then the update goes on unlocked). IO when the directory cannot
 * be created, opened or locked. */
moejit_status mj_tuned_table_lock(const char *path, int create, int *fd);
void mj_tuned_table_unlock(int fd);

/* Adds e, replacing an entry with the same (kernel, dtype, shape, tokens);
 * entries stay sorted. INVALID_ARGUMENT (naming the field) for an entry a
 * table file could not hold: kernel not gemm1/gemm2, dtype not bf16/fp16,
 * path not MMA/WGMMA/GEMV, shape, tile or times out of range. */
moejit_status mj_tuned_table_put(mj_tuned_table *t, const mj_tuned_entry *e);

/* The entry of t with key's (kernel, dtype, shape, tokens), or NULL. */
const mj_tuned_entry *mj_tuned_table_find(const mj_tuned_table *t, const mj_tuned_entry *key);
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
 * k; the weight dtype must equal the act dtype too) at `tokens`, or NULL
 * (*match = MJ_TUNED_NONE). Entries whose cfg does not validate for spec,
 * or whose path's kernel cannot run it, are skipped. */
const mj_tuned_entry *mj_tuned_lookup(const mj_tuned_table *t, const char *kernel,
                                      const moejit_spec *spec, int64_t tokens,
                                      mj_tuned_match *match);

/* ---- helpers shared with model loading (src/ops/gemm_choice.c) ---------- */

struct mj_embedded_file;
/* mj_tuned_table_for_device with the embedded list given (tests). */
moejit_status mj_tuned_table_for_device_in(const char *device_name,
                                           const struct mj_embedded_file *embedded,
                                           size_t n_embedded, mj_tuned_table *t);

/* The shape keys of an entry (its d, f, E and k). */
typedef struct mj_tuned_shape {
  int64_t hidden, expert_width;
  int experts, top_k;
} mj_tuned_shape;
void mj_tuned_shape_of(const moejit_spec *spec, mj_tuned_shape *out);
/* mj_tuned_table_for_device keeping only the entries of one shape (every
 * kernel, dtype and bucket of it), as a model load needs them. A table from
 * $MOEJIT_TUNED_DIR is parsed whole, so an error anywhere in it still fails;
 * an embedded one (shipped tables are what the writer writes, one entry a
 * line) has only its header and that shape's lines parsed, a fraction of
 * the work for a table of many shapes. */
moejit_status mj_tuned_table_for_shape(const char *device_name, const mj_tuned_shape *shape,
                                       mj_tuned_table *t);
moejit_status mj_tuned_table_for_shape_in(const char *device_name, const mj_tuned_shape *shape,
                                          const struct mj_embedded_file *embedded,
                                          size_t n_embedded, mj_tuned_table *t);

/* 1 when $MOEJIT_TUNED_DISABLE is set to something other than "" or "0". */
int mj_tuned_disabled(void);

/* The bucket rule: 1 when bucket a serves `tokens` better than bucket b:
 * nearer in log scale (max(x, T) / min(x, T) smaller), ties to the larger
 * bucket. Exact integer arithmetic (values clamped to 1..INT32_MAX). */
int mj_tuned_bucket_better(int64_t a, int64_t b, int64_t tokens);
/* EXACT when bucket == tokens, else NEAREST. */
mj_tuned_match mj_tuned_match_of(int64_t bucket, int64_t tokens);

/* 1 when spec's dtypes are ones a table holds: activation and weight both
 * bf16 or both fp16 (what the tuner tunes and a pin writes). */
int mj_tuned_spec_dtypes_ok(const moejit_spec *spec);

/* 1 when e is for `kernel` and spec's shape: d, f, E, k, and act and
 * weight dtypes both e->dtype. */
int mj_tuned_entry_shape_is(const mj_tuned_entry *e, const char *kernel, const moejit_spec *spec);
/* Why e's cfg and path cannot run spec (its cfg in the spec fails
 * moejit_spec_validate, or the path's kernel refuses it), or NULL. */
const char *mj_tuned_entry_blocker(const mj_tuned_entry *e, const moejit_spec *spec);

#endif
