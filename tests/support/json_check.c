/* A strict JSON syntax checker for tests of `--json` output (RFC 8259
 * grammar; no extensions). Returns 1 when `text` is one valid JSON value
 * followed only by whitespace. */
#include <ctype.h>
#include <string.h>

#include "test_support.h"

typedef struct jp {
  const char *p;
  int depth;
} jp;

static void ws(jp *j) {
  while (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t') j->p++;
}

static int value(jp *j);

static int string(jp *j) {
  if (*j->p != '"') return 0;
  j->p++;
  while (*j->p && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) return 0;
    if (c == '\\') {
      j->p++;
      if (*j->p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)j->p[i])) return 0;
        j->p += 4;
      } else if (!strchr("\"\\/bfnrt", *j->p) || !*j->p) {
        return 0;
      }
    }
    j->p++;
  }
  if (*j->p != '"') return 0;
  j->p++;
  return 1;
}

static int number(jp *j) {
  const char *s = j->p;
  if (*j->p == '-') j->p++;
  if (*j->p == '0') j->p++;
  else if (isdigit((unsigned char)*j->p)) while (isdigit((unsigned char)*j->p)) j->p++;
  else return 0;
  if (*j->p == '.') {
    j->p++;
    if (!isdigit((unsigned char)*j->p)) return 0;
    while (isdigit((unsigned char)*j->p)) j->p++;
  }
  if (*j->p == 'e' || *j->p == 'E') {
    j->p++;
    if (*j->p == '+' || *j->p == '-') j->p++;
    if (!isdigit((unsigned char)*j->p)) return 0;
    while (isdigit((unsigned char)*j->p)) j->p++;
  }
  return j->p > s;
}

static int seq(jp *j, char close, int is_obj) {
  j->p++;
  if (++j->depth > 64) return 0;
  ws(j);
  if (*j->p == close) {
    j->p++;
    j->depth--;
    return 1;
  }
  for (;;) {
    ws(j);
    if (is_obj) {
      if (!string(j)) return 0;
      ws(j);
      if (*j->p++ != ':') return 0;
    }
    if (!value(j)) return 0;
    ws(j);
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p != close) return 0;
    j->p++;
    j->depth--;
    return 1;
  }
}

static int value(jp *j) {
  ws(j);
  switch (*j->p) {
    case '{': return seq(j, '}', 1);
    case '[': return seq(j, ']', 0);
    case '"': return string(j);
    case 't': return strncmp(j->p, "true", 4) == 0 ? (j->p += 4, 1) : 0;
    case 'f': return strncmp(j->p, "false", 5) == 0 ? (j->p += 5, 1) : 0;
    case 'n': return strncmp(j->p, "null", 4) == 0 ? (j->p += 4, 1) : 0;
    default: return number(j);
  }
}

int ts_json_valid(const char *text) {
  jp j = {text, 0};
  if (!value(&j)) return 0;
  ws(&j);
  return *j.p == '\0';
}

int ts_count_substr(const char *hay, const char *needle) {
  int n = 0;
  size_t len = strlen(needle);
  for (const char *p = hay; (p = strstr(p, needle)); p += len) n++;
  return n;
}
