/* Helpers shared by the Criterion tests: temporary directories, running
 * the CLI and capturing its output, random data, GPU presence. */
#ifndef MOEJIT_TEST_SUPPORT_H
#define MOEJIT_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* Creates a fresh directory under /tmp (mkdtemp) and returns its path
 * (static storage per call site is not assumed: caller frees). */
char *ts_mkdtemp(const char *tag);
/* rm -rf (refuses paths outside /tmp). */
void ts_rmtree(const char *path);
/* Number of regular files under `dir` (recursive) whose name contains
 * `needle` (NULL: all). */
int ts_count_files(const char *dir, const char *needle);

/* Runs the built CLI with argv (NULL-terminated, without argv[0]) and extra
 * environment assignments ("K=V", NULL-terminated, may be NULL). Captures
 * stdout and stderr (malloc'd, NUL-terminated; pass NULL to discard).
 * Returns the exit code, or -1 if it did not exit normally. */
int ts_run_cli(const char *const *args, const char *const *env, char **out, char **err);
/* The same for the program at `path`. */
int ts_run_program(const char *path, const char *const *args, const char *const *env, char **out,
                   char **err);

/* Writes `text` to dir/name; returns the malloc'd full path. */
char *ts_write_file(const char *dir, const char *name, const char *text);

/* xorshift64* random numbers, seeded per call site. */
typedef struct ts_rng {
  uint64_t s;
} ts_rng;
ts_rng ts_rng_seeded(uint64_t seed);
/* Seed from time and pid, printed to stderr so a failure can be replayed
 * with MOEJIT_TEST_SEED. */
ts_rng ts_rng_fresh(const char *what);
uint64_t ts_next(ts_rng *r);
double ts_uniform(ts_rng *r, double lo, double hi);
float ts_normal(ts_rng *r);

/* 1 if a CUDA driver and device are usable (reason written otherwise). */
int ts_gpu_available(char *reason, size_t cap);

/* 1 when text is exactly one valid JSON value (json_check.c). */
int ts_json_valid(const char *text);
/* Occurrences of needle in hay. */
int ts_count_substr(const char *hay, const char *needle);

#endif
