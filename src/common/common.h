/* Shared host-side helpers for every layer: error recording, growable
 * buffers, file and directory utilities, a parallel-for, a clock. */
#ifndef MOEJIT_COMMON_H
#define MOEJIT_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

/* Records a formatted message as the calling thread's last error and
 * returns `status`, so callers write `return mj_fail(ST, "...", ...)`. */
moejit_status mj_fail(moejit_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
moejit_status mj_vfail(moejit_status status, const char *fmt, va_list ap);
/* Prepends "prefix: " to the current last error (context for a failure
 * that bubbled up) and returns `status`. */
moejit_status mj_fail_prefix(moejit_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Clears the calling thread's last error. */
void mj_clear_error(void);

/* Growable NUL-terminated byte buffer. Zero-initialise to start. On
 * allocation failure `oom` is set and later appends are ignored. */
typedef struct mj_buf {
  char *data;
  size_t len, cap;
  int oom;
} mj_buf;
void mj_buf_append(mj_buf *b, const void *data, size_t len);
void mj_buf_puts(mj_buf *b, const char *s);
void mj_buf_printf(mj_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mj_buf_free(mj_buf *b);
/* Hands the data to the caller (release with free); the buffer is reset. */
char *mj_buf_take(mj_buf *b);

/* Reads a whole file (NUL-terminated; *len excludes the NUL). IO error with
 * the path and strerror on failure. */
moejit_status mj_read_file(const char *path, char **data, size_t *len);
/* Writes atomically: unique temp file in the same directory, fsync, rename. */
moejit_status mj_write_file_atomic(const char *path, const void *data, size_t len);
/* mkdir -p; IO error naming the failing component. */
moejit_status mj_mkdir_p(const char *path, int mode);
/* snprintf that reports truncation as an INVALID_ARGUMENT error. */
moejit_status mj_snprintf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* strncpy that always terminates; returns 0 if it truncated. */
int mj_strlcpy(char *dst, const char *src, size_t cap);
/* An on/off switch from the environment: 0 when $name is "0", 1 when it is
 * "1", dflt otherwise (unset, empty or anything else). */
int mj_env_switch(const char *name, int dflt);

/* Runs fn(i, arg) for i in [0, n) on up to `jobs` threads (0: online CPUs).
 * Returns once all are done. */
void mj_parallel_for(size_t n, int jobs, void (*fn)(size_t i, void *arg), void *arg);
int mj_online_cpus(void);

/* Monotonic clock in milliseconds. */
double mj_now_ms(void);
/* Sleeps `us` microseconds, the whole time even when a signal interrupts. */
void mj_sleep_us(long us);
/* Runs fn(arg) on a detached thread of its own: 1 if it started, 0 if no
 * thread could be made (fn has not run). */
int mj_thread_detached(void *(*fn)(void *), void *arg);
/* Wall clock, unix seconds. */
int64_t mj_unix_time(void);

#define MJ_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
