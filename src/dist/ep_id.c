/* NCCL unique ids as text and files (moejit/ep.h): how ranks that do not
 * share a process hand the id around. Needs no NCCL. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define ID_HEX (2 * sizeof(((moejit_nccl_id *)0)->bytes))

moejit_status moejit_nccl_id_format(const moejit_nccl_id *id, char *buf, size_t cap) {
  if (!id || !buf)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_id_format: %s is NULL",
                   !id ? "id" : "buf");
  if (cap < ID_HEX + 1)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_nccl_id_format: cap = %zu, the id needs %zu bytes", cap, ID_HEX + 1);
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof id->bytes; i++) {
    buf[2 * i] = hex[id->bytes[i] >> 4];
    buf[2 * i + 1] = hex[id->bytes[i] & 15];
  }
  buf[ID_HEX] = '\0';
  return MOEJIT_OK;
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

moejit_status moejit_nccl_id_parse(const char *text, moejit_nccl_id *id) {
  if (!text || !id)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_id_parse: %s is NULL",
                   !text ? "text" : "id");
  while (isspace((unsigned char)*text)) text++;
  size_t n = strlen(text);
  while (n && isspace((unsigned char)text[n - 1])) n--;
  for (size_t i = 0; i < n; i++)
    if (hex_value(text[i]) < 0)
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                     "moejit_nccl_id_parse: character %zu ('%c') is not a hex digit; HINT: pass "
                     "the text moejit_nccl_id_format wrote",
                     i + 1, isprint((unsigned char)text[i]) ? text[i] : '?');
  if (n != ID_HEX)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_nccl_id_parse: %zu hex digits, an NCCL unique id has %zu", n,
                   (size_t)ID_HEX);
  for (size_t i = 0; i < sizeof id->bytes; i++)
    id->bytes[i] = (unsigned char)(hex_value(text[2 * i]) << 4 | hex_value(text[2 * i + 1]));
  return MOEJIT_OK;
}

moejit_status moejit_nccl_id_write_file(const char *path, const moejit_nccl_id *id) {
  if (!path || !id)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_id_write_file: %s is NULL",
                   !path ? "path" : "id");
  char text[ID_HEX + 2];
  moejit_nccl_id_format(id, text, sizeof text);
  text[ID_HEX] = '\n';
  moejit_status st = mj_write_file_atomic(path, text, ID_HEX + 1);
  return st ? mj_fail_prefix(st, "moejit_nccl_id_write_file") : MOEJIT_OK;
}

moejit_status moejit_nccl_id_read_file(const char *path, int timeout_ms, moejit_nccl_id *id) {
  if (!path || !id)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_nccl_id_read_file: %s is NULL",
                   !path ? "path" : "id");
  if (timeout_ms < 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_nccl_id_read_file: timeout_ms = %d must be >= 0", timeout_ms);
  const double deadline = mj_now_ms() + timeout_ms;
  while (access(path, F_OK) != 0) {
    if (errno != ENOENT || mj_now_ms() >= deadline)
      return mj_fail(errno == ENOENT ? MOEJIT_ERR_NOT_FOUND : MOEJIT_ERR_IO,
                     "moejit_nccl_id_read_file: %s: %s after %d ms; HINT: rank 0 writes it with "
                     "moejit_nccl_id_write_file (moejit run --ep-id-file)",
                     path, strerror(errno), timeout_ms);
    mj_sleep_us(20000);
  }
  char *data = NULL;
  size_t len = 0;
  moejit_status st = mj_read_file(path, &data, &len);
  if (st) return mj_fail_prefix(st, "moejit_nccl_id_read_file");
  st = moejit_nccl_id_parse(data, id);
  free(data);
  return st ? mj_fail_prefix(st, "moejit_nccl_id_read_file: %s", path) : MOEJIT_OK;
}
