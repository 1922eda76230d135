/* Growable byte buffer and bounded string helpers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

static int buf_reserve(mj_buf *b, size_t extra) {
  if (b->oom) return 0;
  if (b->len + extra + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) {
    if (cap > SIZE_MAX / 2) {
      b->oom = 1;
      return 0;
    }
    cap *= 2;
  }
  char *p = realloc(b->data, cap);
  if (!p) {
    b->oom = 1;
    return 0;
  }
  b->data = p;
  b->cap = cap;
  return 1;
}

void mj_buf_append(mj_buf *b, const void *data, size_t len) {
  if (!buf_reserve(b, len)) return;
  if (len) memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
}

void mj_buf_puts(mj_buf *b, const char *s) { mj_buf_append(b, s, strlen(s)); }

void mj_buf_printf(mj_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !buf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void mj_buf_free(mj_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

char *mj_buf_take(mj_buf *b) {
  if (!b->data && buf_reserve(b, 0)) b->data[0] = '\0'; /* nothing appended: "" */
  char *d = b->data;
  memset(b, 0, sizeof *b);
  return d;
}

moejit_status mj_snprintf(char *buf, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= cap)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "text too long for a %zu-byte buffer", cap);
  return MOEJIT_OK;
}

int mj_strlcpy(char *dst, const char *src, size_t cap) {
  if (cap == 0) return 0;
  size_t n = strlen(src);
  if (n >= cap) {
    memcpy(dst, src, cap - 1);
    dst[cap - 1] = '\0';
    return 0;
  }
  memcpy(dst, src, n + 1);
  return 1;
}

int mj_env_switch(const char *name, int dflt) {
  const char *v = getenv(name);
  if (v && strcmp(v, "0") == 0) return 0;
  if (v && strcmp(v, "1") == 0) return 1;
  return dflt;
}
