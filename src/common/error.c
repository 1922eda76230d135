/* Per-thread last-error message and the status names: the library's error
 * model (every call returns a status; details are kept, never printed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define MJ_ERROR_CAP 16384

static _Thread_local char mj_last_error_buf[MJ_ERROR_CAP];

moejit_status mj_vfail(moejit_status status, const char *fmt, va_list ap) {
  const int n = vsnprintf(mj_last_error_buf, sizeof mj_last_error_buf, fmt, ap);
  if (n >= MJ_ERROR_CAP) { /* say so, rather than end mid-line (a long NVRTC log) */
    enum { NOTE = 64 };
    const int kept = MJ_ERROR_CAP - 1 - NOTE;
    snprintf(mj_last_error_buf + kept, NOTE + 1, "\n[... %d more bytes of this message not kept]",
             n - kept);
  }
  return status;
}

moejit_status mj_fail(moejit_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  mj_vfail(status, fmt, ap);
  va_end(ap);
  return status;
}

moejit_status mj_fail_prefix(moejit_status status, const char *fmt, ...) {
  char prefix[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  size_t plen = strlen(prefix);
  size_t olen = strlen(mj_last_error_buf);
  if (plen + 2 + olen + 1 > sizeof mj_last_error_buf) {
    olen = sizeof mj_last_error_buf - plen - 3;
  }
  memmove(mj_last_error_buf + plen + 2, mj_last_error_buf, olen);
  memcpy(mj_last_error_buf, prefix, plen);
  memcpy(mj_last_error_buf + plen, ": ", 2);
  mj_last_error_buf[plen + 2 + olen] = '\0';
  return status;
}

void mj_clear_error(void) { mj_last_error_buf[0] = '\0'; }

const char *moejit_last_error(void) { return mj_last_error_buf; }

const char *moejit_status_str(moejit_status status) {
  static const char *const names[MOEJIT_STATUS_COUNT] = {
      [MOEJIT_OK] = "ok",
      [MOEJIT_ERR_INVALID_ARGUMENT] = "invalid argument",
      [MOEJIT_ERR_CONFIG] = "config error",
      [MOEJIT_ERR_IO] = "I/O error",
      [MOEJIT_ERR_OUT_OF_MEMORY] = "out of memory",
      [MOEJIT_ERR_COMPILE] = "compile error",
      [MOEJIT_ERR_CACHE] = "cache error",
      [MOEJIT_ERR_NO_DRIVER] = "no CUDA driver",
      [MOEJIT_ERR_NO_DEVICE] = "no CUDA device",
      [MOEJIT_ERR_CUDA] = "CUDA error",
      [MOEJIT_ERR_UNSUPPORTED] = "unsupported",
      [MOEJIT_ERR_NOT_FOUND] = "not found",
      [MOEJIT_ERR_INTERNAL] = "internal error",
      [MOEJIT_ERR_TIMEOUT] = "timed out",
  };
  if ((unsigned)status >= MOEJIT_STATUS_COUNT) return "unknown status";
  return names[status];
}

unsigned moejit_version_number(void) { return MOEJIT_VERSION_NUMBER; }

const char *moejit_version_string(void) {
#define MJ_STR2(x) #x
#define MJ_STR(x) MJ_STR2(x)
  return MJ_STR(MOEJIT_VERSION_MAJOR) "." MJ_STR(MOEJIT_VERSION_MINOR) "." MJ_STR(
      MOEJIT_VERSION_PATCH);
}

void moejit_free(void *ptr) { free(ptr); }
