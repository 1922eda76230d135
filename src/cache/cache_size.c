/* moejit_parse_size: human sizes for cache limits ("500M", "2GiB"), powers
 * of 1024, whole numbers only. */
#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"

static moejit_status bad_size(const char *text, const char *why) {
  return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                 "invalid size '%s': %s; HINT: write a whole number of bytes with an optional "
                 "K, M, G or T suffix (powers of 1024), e.g. 500M or 2G",
                 text, why);
}

/* The power of 1024 a suffix names: "", "B", "K", "KB", "KiB", ... (case
 * ignored). -1 if it is not a size suffix. */
static int suffix_shift(const char *s) {
  static const char units[] = "KMGT";
  if (*s == '\0' || !strcasecmp(s, "b")) return 0;
  const char *u = strchr(units, toupper((unsigned char)*s));
  if (!u) return -1;
  const char *rest = s + 1;
  if (*rest == '\0' || !strcasecmp(rest, "b") || !strcasecmp(rest, "ib"))
    return 10 * (int)(u - units + 1);
  return -1;
}

moejit_status moejit_parse_size(const char *text, uint64_t *bytes) {
  if (!text || !bytes)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_parse_size: NULL argument");
  const char *p = text;
  uint64_t value = 0;
  if (!isdigit((unsigned char)*p))
    return bad_size(text, *p == '-' ? "negative" : "it does not start with a digit");
  for (; isdigit((unsigned char)*p); p++) {
    unsigned digit = (unsigned)(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) return bad_size(text, "too large");
    value = value * 10 + digit;
  }
  int shift = suffix_shift(p);
  if (shift < 0) return bad_size(text, "unknown suffix");
  if (shift && value > (UINT64_MAX >> shift)) return bad_size(text, "too large");
  *bytes = value << shift;
  return MOEJIT_OK;
}
