/* The YAML config loader: walks the tree from yaml_tree.c against the
 * schema tables below, fills a local spec and the key positions, then runs
 * the shared rule checker. The caller's spec is written only on success. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "config/config.h"

/* ---- the schema ----------------------------------------------------------- */

typedef enum key_type {
  K_SECTION,
  K_INT,
  K_FLOAT,
  K_BOOL,
  K_NAME,
  K_DTYPE,
  K_RULE,
  K_RASTER,
  K_SCHEDULE,
  K_ARCHS,
  K_SIZE,
  K_DIR
} key_type;

typedef struct section section;
typedef struct key_def {
  const char *key;
  key_type type;
  int field; /* mj_field; -1 for sections */
  const section *sub;
  int required;
} key_def;
struct section {
  const char *path; /* "" for the top level */
  const key_def *keys;
  size_t n;
};

#define SECTION(name, path, keys) static const section name = {path, keys, MJ_ARRAY_LEN(keys)}
#define GEMM_KEYS(b)                                                                              \
  {"tile_m", K_INT, b + MJ_GEMM_TILE_M, NULL, 0}, {"tile_n", K_INT, b + MJ_GEMM_TILE_N, NULL, 0}, \
      {"tile_k", K_INT, b + MJ_GEMM_TILE_K, NULL, 0},                                             \
      {"stages", K_INT, b + MJ_GEMM_STAGES, NULL, 0},                                             \
      {"warps", K_INT, b + MJ_GEMM_WARPS, NULL, 0},                                               \
      {"cluster_m", K_INT, b + MJ_GEMM_CLUSTER_M, NULL, 0},                                       \
      {"cluster_n", K_INT, b + MJ_GEMM_CLUSTER_N, NULL, 0},                                       \
      {"raster", K_RASTER, b + MJ_GEMM_RASTER, NULL, 0}, {                                        \
    "schedule", K_SCHEDULE, b + MJ_GEMM_SCHEDULE, NULL, 0                                         \
  }

static const key_def gemm1_keys[] = {GEMM_KEYS(MJ_F_GEMM1)};
static const key_def gemm2_keys[] = {GEMM_KEYS(MJ_F_GEMM2)};
static const key_def route_keys[] = {{"block_threads", K_INT, MJ_F_ROUTE_THREADS, NULL, 0}};
static const key_def align_keys[] = {{"block_threads", K_INT, MJ_F_ALIGN_THREADS, NULL, 0}};
static const key_def combine_keys[] = {{"block_threads", K_INT, MJ_F_COMBINE_THREADS, NULL, 0}};
SECTION(gemm1_sec, "kernels.gemm1", gemm1_keys);
SECTION(gemm2_sec, "kernels.gemm2", gemm2_keys);
SECTION(route_sec, "kernels.route", route_keys);
SECTION(align_sec, "kernels.align", align_keys);
SECTION(combine_sec, "kernels.combine", combine_keys);

static const key_def kernels_keys[] = {{"route", K_SECTION, -1, &route_sec, 0},
                                       {"align", K_SECTION, -1, &align_sec, 0},
                                       {"combine", K_SECTION, -1, &combine_sec, 0},
                                       {"gemm1", K_SECTION, -1, &gemm1_sec, 0},
                                       {"gemm2", K_SECTION, -1, &gemm2_sec, 0}};
static const key_def routing_keys[] = {{"rule", K_RULE, MJ_F_RULE, NULL, 0},
                                       {"renormalize", K_BOOL, MJ_F_RENORMALIZE, NULL, 0},
                                       {"n_group", K_INT, MJ_F_N_GROUP, NULL, 0},
                                       {"topk_group", K_INT, MJ_F_TOPK_GROUP, NULL, 0},
                                       {"scaling_factor", K_FLOAT, MJ_F_SCALING, NULL, 0}};
SECTION(kernels_sec, "kernels", kernels_keys);
SECTION(routing_sec, "model.routing", routing_keys);

static const key_def model_keys[] = {{"hidden", K_INT, MJ_F_HIDDEN, NULL, 1},
                                     {"expert_width", K_INT, MJ_F_EXPERT_WIDTH, NULL, 1},
                                     {"experts", K_INT, MJ_F_EXPERTS, NULL, 1},
                                     {"top_k", K_INT, MJ_F_TOP_K, NULL, 1},
                                     {"routing", K_SECTION, -1, &routing_sec, 0}};
static const key_def dtypes_keys[] = {{"activation", K_DTYPE, MJ_F_ACT, NULL, 0},
                                      {"weight", K_DTYPE, MJ_F_WEIGHT, NULL, 0},
                                      {"logits", K_DTYPE, MJ_F_LOGITS, NULL, 0},
                                      {"output", K_DTYPE, MJ_F_OUTPUT, NULL, 0}};
static const key_def target_keys[] = {{"arch", K_ARCHS, MJ_F_ARCH0, NULL, 0}};
static const key_def cache_keys[] = {{"dir", K_DIR, MJ_F_CACHE_DIR, NULL, 0},
                                     {"max_size", K_SIZE, MJ_F_CACHE_MAX, NULL, 0}};
SECTION(model_sec, "model", model_keys);
SECTION(dtypes_sec, "dtypes", dtypes_keys);
SECTION(target_sec, "target", target_keys);
SECTION(cache_sec, "cache", cache_keys);

static const key_def root_keys[] = {
    {"name", K_NAME, MJ_F_NAME, NULL, 1},        {"model", K_SECTION, -1, &model_sec, 1},
    {"dtypes", K_SECTION, -1, &dtypes_sec, 0},   {"target", K_SECTION, -1, &target_sec, 0},
    {"kernels", K_SECTION, -1, &kernels_sec, 0}, {"cache", K_SECTION, -1, &cache_sec, 0}};
SECTION(root_sec, "", root_keys);

/* Names of enum values as YAML writes them, indexed by the C value. */
static const char *const dtype_names[] = {"fp32", "fp16", "bf16"};
static const char *const rule_names[] = {"softmax_topk", "sigmoid_grouped_topk"};
static const char *const raster_names[] = {"along_m", "along_n"};

/* ---- loader state and messages -------------------------------------------- */

typedef struct loader {
  const char *origin;
  const char *base_dir; /* for relative cache.dir; NULL: the current directory */
  moejit_spec spec;
  mj_spec_marks marks;
} loader;

__attribute__((format(printf, 4, 5))) static moejit_status fail_at(const loader *L,
                                                                   const mj_yaml_node *n,
                                                                   const char *path,
                                                                   const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  moejit_status st = mj_yaml_vfail(L->origin, n, path, fmt, ap);
  va_end(ap);
  return st;
}

/* A quoted scalar that would be a number or boolean without its quotes. */
static int quoted_value(const mj_yaml_node *n) {
  static const char *const words[] = {"true", "false", "yes", "no", "on", "off"};
  if (n->kind != MJ_YAML_SCALAR || n->plain || n->len == 0) return 0;
  if (strspn(n->text, "0123456789+-.eE") == n->len) return 1;
  for (size_t i = 0; i < MJ_ARRAY_LEN(words); i++)
    if (!strcasecmp(n->text, words[i])) return 1;
  return 0;
}

static moejit_status fail_type(const loader *L, const mj_yaml_node *n, const char *path,
                               const char *expected, const char *allowed) {
  char got[300];
  mj_yaml_describe(n, got, sizeof got);
  const char *unquote = quoted_value(n) ? "; HINT: remove the quotes" : "";
  return fail_at(L, n, path, "expected %s, got %s (allowed %s)%s", expected, got, allowed, unquote);
}

static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[72];
  if (la > 64 || lb > 64) return 99;
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = up, row[j] = best;
    }
  }
  return row[lb];
}

/* "; did you mean 'x'?" for the nearest of `names` within distance 2. */
static void suggest(const char *text, const char *const *names, size_t n, char *buf, size_t cap) {
  size_t best = 3, at = 0;
  for (size_t i = 0; i < n; i++) {
    size_t d = edit_distance(text, names[i]);
    if (d < best) best = d, at = i;
  }
  if (best <= 2)
    snprintf(buf, cap, "; did you mean '%s'?", names[at]);
  else if (cap)
    buf[0] = '\0';
}

static void join_names(const char *const *names, size_t n, char *buf, size_t cap) {
  mj_buf b = {0};
  for (size_t i = 0; i < n; i++) mj_buf_printf(&b, "%s%s", i ? ", " : "", names[i]);
  snprintf(buf, cap, "%s", b.data && !b.oom ? b.data : "?");
  mj_buf_free(&b);
}

/* ---- scalars ---------------------------------------------------------------- */

/* Decimal integers only; hex, octal-looking leading zeros, floats and
 * "1_000" are refused with a message saying so. */
static moejit_status parse_int(const loader *L, const mj_yaml_node *n, const char *path,
                               const char *allowed, int64_t *out) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n))
    return fail_type(L, n, path, "an integer", allowed);
  const char *p = n->text;
  int neg = *p == '-';
  if (*p == '-' || *p == '+') p++;
  if (p[0] == '0' && p[1] && strchr("xXoObB", p[1]))
    return fail_at(L, n, path, "'%s' is not a decimal integer; write it in decimal (allowed %s)",
                   n->text, allowed);
  size_t digits = strspn(p, "0123456789");
  if (digits == 0 || p[digits] != '\0' || n->len != strlen(n->text)) {
    char *end;
    strtod(n->text, &end);
    if (digits + (size_t)(p - n->text) > 0 && *end == '\0' && n->len == strlen(n->text))
      return fail_at(L, n, path, "expected an integer, got the number %s (allowed %s)", n->text,
                     allowed);
    return fail_type(L, n, path, "an integer", allowed);
  }
  if (p[0] == '0' && digits > 1)
    return fail_at(
        L, n, path,
        "'%s' has a leading zero, which YAML 1.1 reads as octal; write it in decimal (allowed %s)",
        n->text, allowed);
  uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (size_t i = 0; i < digits; i++) {
    unsigned d = (unsigned)(p[i] - '0');
    if (v > (limit - d) / 10)
      return fail_at(L, n, path,
                     "%s does not fit in a 64-bit integer (integer overflow; allowed %s)", n->text,
                     allowed);
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return MOEJIT_OK;
}

static moejit_status parse_float(const loader *L, const mj_yaml_node *n, const char *path,
                                 const char *allowed, double *out) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n))
    return fail_type(L, n, path, "a number", allowed);
  char *end;
  /* strtod also reads "inf", "nan" and hex floats: allow decimal forms only. */
  int decimal = n->len == strlen(n->text) && strspn(n->text, "0123456789+-.eE") == n->len;
  double v = decimal ? strtod(n->text, &end) : 0.0;
  if (!decimal || end == n->text || *end != '\0') return fail_type(L, n, path, "a number", allowed);
  *out = v;
  return MOEJIT_OK;
}

static moejit_status parse_bool(const loader *L, const mj_yaml_node *n, const char *path,
                                int *out) {
  static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
  const char *allowed = "true/false, yes/no, on/off";
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n))
    return fail_type(L, n, path, "a boolean", allowed);
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(n->text, yes[i])) return *out = 1, MOEJIT_OK;
    if (!strcasecmp(n->text, no[i])) return *out = 0, MOEJIT_OK;
  }
  return fail_type(L, n, path, "a boolean", allowed);
}

/* A string scalar without NULs, plain or quoted. */
static moejit_status get_string(const loader *L, const mj_yaml_node *n, const char *path,
                                const char *allowed, const char **out) {
  if (n->kind != MJ_YAML_SCALAR || mj_yaml_is_null(n))
    return fail_type(L, n, path, "a string", allowed);
  if (strlen(n->text) != n->len)
    return fail_at(L, n, path, "contains a NUL character (allowed %s)", allowed);
  *out = n->text;
  return MOEJIT_OK;
}

static moejit_status parse_enum(const loader *L, const mj_yaml_node *n, const char *path,
                                const char *const *names, size_t count, int64_t *out) {
  char allowed[128], hint[96], q[256];
  join_names(names, count, allowed, sizeof allowed);
  const char *s;
  moejit_status st = get_string(L, n, path, allowed, &s);
  if (st) return st;
  for (size_t i = 0; i < count; i++)
    if (!strcmp(s, names[i])) return *out = (int64_t)i, MOEJIT_OK;
  suggest(s, names, count, hint, sizeof hint);
  mj_quote(q, sizeof q, n->text, n->len);
  return fail_at(L, n, path, "%s is not one of the allowed values (allowed %s)%s", q, allowed,
                 hint);
}

/* ---- typed values ----------------------------------------------------------- */

static moejit_status load_name(loader *L, const mj_yaml_node *n) {
  const char *s;
  moejit_status st = get_string(L, n, "name", mj_field_allowed(MJ_F_NAME), &s);
  if (st) return st;
  if (n->len >= MOEJIT_NAME_MAX) {
    char q[256];
    mj_quote(q, sizeof q, n->text, n->len);
    return fail_at(L, n, "name", "%s is %zu characters long (allowed %s)", q, n->len,
                   mj_field_allowed(MJ_F_NAME));
  }
  memcpy(L->spec.name, s, n->len + 1);
  return MOEJIT_OK;
}

static moejit_status load_arch_item(loader *L, const mj_yaml_node *n, int i, const char *path) {
  const char *s;
  moejit_status st = get_string(L, n, path, mj_arch_allowed(), &s);
  if (st) return st;
  if (n->len >= MOEJIT_ARCH_MAX) {
    char q[256];
    mj_quote(q, sizeof q, n->text, n->len);
    return fail_at(L, n, path, "%s is not a supported arch (allowed %s)", q, mj_arch_allowed());
  }
  memcpy(L->spec.archs[i], s, n->len + 1);
  L->marks.field[MJ_F_ARCH0 + i] = (mj_mark){n->line, n->col};
  return MOEJIT_OK;
}

static moejit_status load_archs(loader *L, const mj_yaml_node *n) {
  if (n->kind == MJ_YAML_SCALAR) {
    L->spec.n_archs = 1;
    return load_arch_item(L, n, 0, "target.arch");
  }
  if (n->kind != MJ_YAML_SEQ)
    return fail_type(L, n, "target.arch", "an arch name or a list of them", mj_arch_allowed());
  if (n->n_items == 0)
    return fail_at(L, n, "target.arch", "the list is empty (allowed 1 to %d of %s)",
                   MOEJIT_MAX_ARCHS, mj_arch_allowed());
  L->marks.arch_is_list = 1;
  for (size_t i = 0; i < n->n_items; i++) {
    if (i >= MOEJIT_MAX_ARCHS)
      return fail_at(L, n->items[i], "target.arch", "more than %d archs listed (allowed 1 to %d)",
                     MOEJIT_MAX_ARCHS, MOEJIT_MAX_ARCHS);
    char path[32];
    snprintf(path, sizeof path, "target.arch[%zu]", i);
    moejit_status st = load_arch_item(L, n->items[i], (int)i, path);
    if (st) return st;
  }
  L->spec.n_archs = (int)n->n_items;
  return MOEJIT_OK;
}

static moejit_status load_size(loader *L, const mj_yaml_node *n) {
  const char *s;
  moejit_status st = get_string(L, n, "cache.max_size", mj_field_allowed(MJ_F_CACHE_MAX), &s);
  if (st) return st;
  uint64_t bytes;
  if (moejit_parse_size(s, &bytes) != MOEJIT_OK) {
    char why[600];
    snprintf(why, sizeof why, "%s", moejit_last_error());
    return fail_at(L, n, "cache.max_size", "%s", why);
  }
  L->spec.cache_max_bytes = bytes;
  return MOEJIT_OK;
}

/* '~' and '~/x' use $HOME; a relative path is taken from the config file's
 * directory (or the current one), so the spec holds an absolute path. */
static moejit_status load_dir(loader *L, const mj_yaml_node *n) {
  const char *path = "cache.dir", *s;
  moejit_status st = get_string(L, n, path, mj_field_allowed(MJ_F_CACHE_DIR), &s);
  if (st) return st;
  if (!*s) return fail_at(L, n, path, "is empty (allowed %s)", mj_field_allowed(MJ_F_CACHE_DIR));
  char cwd[MOEJIT_PATH_MAX], *out = L->spec.cache_dir;
  size_t cap = sizeof L->spec.cache_dir;
  int fits;
  if (s[0] == '~') {
    const char *home = getenv("HOME");
    if (s[1] && s[1] != '/')
      return fail_at(L, n, path,
                     "only '~' and '~/...' are expanded, not '~user'; HINT: write the full path");
    if (!home || !*home)
      return fail_at(L, n, path,
                     "cannot expand '~': $HOME is not set; HINT: write an absolute path");
    fits = snprintf(out, cap, "%s%s", home, s + 1) < (int)cap;
  } else if (s[0] == '/') {
    fits = snprintf(out, cap, "%s", s) < (int)cap;
  } else {
    const char *base = L->base_dir;
    if (!base || base[0] != '/') {
      if (!getcwd(cwd, sizeof cwd))
        return fail_at(L, n, path, "cannot resolve the relative path: getcwd failed: %s",
                       strerror(errno));
    }
    if (!base)
      fits = snprintf(out, cap, "%s/%s", cwd, s) < (int)cap;
    else if (base[0] == '/')
      fits = snprintf(out, cap, "%s/%s", base, s) < (int)cap;
    else
      fits = snprintf(out, cap, "%s/%s/%s", cwd, base, s) < (int)cap;
  }
  if (!fits)
    return fail_at(L, n, path, "the resolved path is longer than %d bytes", MOEJIT_PATH_MAX - 1);
  return MOEJIT_OK;
}

static moejit_status load_section(loader *L, const section *sec, const mj_yaml_node *map);

/* "keys a, b, c" of a section, for messages. */
static void section_keys(const section *sec, char *buf, size_t cap) {
  const char *list[16];
  char names[240];
  for (size_t i = 0; i < sec->n; i++) list[i] = sec->keys[i].key;
  join_names(list, sec->n, names, sizeof names);
  snprintf(buf, cap, "a mapping with the keys %s", names);
}

static moejit_status load_value(loader *L, const key_def *k, const char *path,
                                const mj_yaml_node *v) {
  mj_field f = (mj_field)k->field;
  int64_t i = 0;
  moejit_status st = MOEJIT_OK;
  if (!k->required && mj_yaml_is_null(v))
    return MOEJIT_OK; /* null: the same as leaving the key out */
  if (k->field >= 0) L->marks.field[f] = (mj_mark){v->line, v->col};
  switch (k->type) {
    case K_SECTION:
      if (v->kind != MJ_YAML_MAP) {
        char keys[320];
        section_keys(k->sub, keys, sizeof keys);
        return fail_type(L, v, path, "a mapping", keys);
      }
      return load_section(L, k->sub, v);
    case K_INT:
      if ((st = parse_int(L, v, path, mj_field_allowed(f), &i))) return st;
      L->marks.wide[f] = i, L->marks.has_wide[f] = 1;
      return MOEJIT_OK;
    case K_FLOAT:
      st = parse_float(L, v, path, mj_field_allowed(f), &L->marks.scaling_wide);
      L->marks.has_scaling_wide = 1;
      return st;
    case K_BOOL: {
      int b = 0;
      if ((st = parse_bool(L, v, path, &b))) return st;
      mj_spec_set_int(&L->spec, f, b);
      return MOEJIT_OK;
    }
    case K_DTYPE:
      st = parse_enum(L, v, path, dtype_names, 3, &i);
      break;
    case K_RULE:
      st = parse_enum(L, v, path, rule_names, 2, &i);
      break;
    case K_RASTER:
      st = parse_enum(L, v, path, raster_names, 2, &i);
      break;
    case K_SCHEDULE:
      st = parse_enum(L, v, path, mj_schedule_names, MJ_SCHEDULE_COUNT, &i);
      break;
    case K_NAME:
      return load_name(L, v);
    case K_ARCHS:
      return load_archs(L, v);
    case K_SIZE:
      return load_size(L, v);
    case K_DIR:
      return load_dir(L, v);
  }
  if (!st) mj_spec_set_int(&L->spec, f, i);
  return st;
}

/* Absent keys fall back to the position of the mapping that would hold
 * them (for messages about defaults). */
static void mark_section(loader *L, const section *sec, mj_mark at) {
  for (size_t i = 0; i < sec->n; i++) {
    const key_def *k = &sec->keys[i];
    if (k->type == K_SECTION)
      mark_section(L, k->sub, at);
    else if (k->type == K_ARCHS)
      for (int a = 0; a < MOEJIT_MAX_ARCHS; a++) L->marks.section[MJ_F_ARCH0 + a] = at;
    else
      L->marks.section[k->field] = at;
  }
}

static void key_path(const section *sec, const mj_yaml_node *key, char *buf, size_t cap) {
  char q[256];
  int clean =
      key->len > 0 && key->len <= 60 && strlen(key->text) == key->len &&
      strspn(key->text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
          key->len;
  if (clean)
    snprintf(q, sizeof q, "%s", key->text);
  else
    mj_quote(q, sizeof q, key->text, key->len);
  snprintf(buf, cap, "%s%s%s", sec->path, *sec->path ? "." : "", q);
}

/* The key's definition, or a CONFIG error: not a string, unknown, or given
 * twice in this mapping. */
static moejit_status find_key(loader *L, const section *sec, const mj_yaml_node *map, size_t at,
                              const key_def **out) {
  const mj_yaml_node *key = map->items[at];
  const char *where = *sec->path ? sec->path : "the top level";
  char path[384], names[256], hint[96];
  if (key->kind != MJ_YAML_SCALAR) {
    char got[64];
    mj_yaml_describe(key, got, sizeof got);
    return fail_at(L, key, sec->path, "a key must be a string, got %s", got);
  }
  key_path(sec, key, path, sizeof path);
  const char *list[16];
  for (size_t i = 0; i < sec->n; i++) list[i] = sec->keys[i].key;
  join_names(list, sec->n, names, sizeof names);
  for (size_t i = 0; i < sec->n; i++) {
    if (strlen(key->text) != key->len || strcmp(key->text, sec->keys[i].key)) continue;
    for (size_t j = 0; j < at; j += 2)
      if (!strcmp(map->items[j]->text, key->text))
        return fail_at(L, key, path,
                       "duplicate key (first given at %d:%d; allowed once per mapping)",
                       map->items[j]->line, map->items[j]->col);
    *out = &sec->keys[i];
    return MOEJIT_OK;
  }
  suggest(key->text, list, sec->n, hint, sizeof hint);
  return fail_at(L, key, path, "unknown key (allowed in %s: %s)%s", where, names, hint);
}

static moejit_status load_section(loader *L, const section *sec, const mj_yaml_node *map) {
  unsigned seen = 0;
  mark_section(L, sec, (mj_mark){map->line, map->col});
  for (size_t i = 0; i + 1 < map->n_items; i += 2) {
    const key_def *k = NULL;
    char path[384];
    moejit_status st = find_key(L, sec, map, i, &k);
    if (st) return st;
    key_path(sec, map->items[i], path, sizeof path);
    seen |= 1u << (k - sec->keys);
    if ((st = load_value(L, k, path, map->items[i + 1]))) return st;
  }
  for (size_t i = 0; i < sec->n; i++) {
    if (!sec->keys[i].required || (seen & (1u << i))) continue;
    char names[256];
    const char *list[16];
    size_t n = 0;
    for (size_t j = 0; j < sec->n; j++)
      if (sec->keys[j].required) list[n++] = sec->keys[j].key;
    join_names(list, n, names, sizeof names);
    return fail_at(L, map, *sec->path ? sec->path : NULL,
                   "missing required key '%s' (required %s: %s)", sec->keys[i].key,
                   *sec->path ? "here" : "at the top level", names);
  }
  return MOEJIT_OK;
}

/* Defaults that follow other keys: weight and output follow activation,
 * topk_group follows n_group. Their positions follow too. */
static void apply_linked_defaults(loader *L) {
  mj_spec_marks *m = &L->marks;
  if (!m->field[MJ_F_WEIGHT].line) {
    L->spec.weight_dtype = L->spec.act_dtype;
    m->field[MJ_F_WEIGHT] = m->field[MJ_F_ACT];
  }
  if (!m->field[MJ_F_OUTPUT].line) {
    L->spec.out_dtype = L->spec.act_dtype;
    m->field[MJ_F_OUTPUT] = m->field[MJ_F_ACT];
  }
  if (!m->field[MJ_F_TOPK_GROUP].line && m->has_wide[MJ_F_N_GROUP]) {
    m->wide[MJ_F_TOPK_GROUP] = m->wide[MJ_F_N_GROUP], m->has_wide[MJ_F_TOPK_GROUP] = 1;
    m->field[MJ_F_TOPK_GROUP] = m->field[MJ_F_N_GROUP];
  }
}

/* Integers were kept wide until checked; now they fit the spec's fields. */
static void commit_wide(loader *L) {
  for (int f = 0; f < MJ_F_COUNT; f++)
    if (L->marks.has_wide[f]) mj_spec_set_int(&L->spec, (mj_field)f, L->marks.wide[f]);
  if (L->marks.has_scaling_wide) L->spec.routing.scaling_factor = (float)L->marks.scaling_wide;
}

static moejit_status load_root(loader *L, const mj_yaml_node *root) {
  if (!root || mj_yaml_is_null(root))
    return mj_fail(MOEJIT_ERR_CONFIG,
                   "%s:1:1: the config is empty (expected a mapping with the keys %s)", L->origin,
                   "name, model and optionally dtypes, target, kernels, cache");
  if (root->kind != MJ_YAML_MAP) {
    char got[300];
    mj_yaml_describe(root, got, sizeof got);
    return fail_at(L, root, NULL,
                   "the top level must be a mapping with the keys name, model, ..., got %s", got);
  }
  L->marks.root = (mj_mark){root->line, root->col};
  moejit_status st = load_section(L, &root_sec, root);
  if (st) return st;
  apply_linked_defaults(L);
  if ((st = mj_spec_check(&L->spec, &L->marks))) return st;
  commit_wide(L);
  return MOEJIT_OK;
}

static moejit_status load_text(const char *text, size_t len, const char *origin,
                               const char *base_dir, moejit_spec *out) {
  if (len > MJ_CONFIG_MAX_BYTES)
    return mj_fail(MOEJIT_ERR_CONFIG,
                   "%s:1:1: the config is %zu bytes, more than the limit of %zu (1 MiB)", origin,
                   len, MJ_CONFIG_MAX_BYTES);
  loader *L = calloc(1, sizeof *L);
  if (!L) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory loading the config", origin);
  L->origin = origin, L->base_dir = base_dir, L->marks.origin = origin;
  moejit_spec_init(&L->spec);
  L->spec.name[0] = '\0';
  mj_yaml_node *root = NULL;
  moejit_status st = mj_yaml_parse(text, len, origin, &root);
  if (!st) st = load_root(L, root);
  if (!st) *out = L->spec;
  mj_yaml_free(root);
  free(L);
  return st;
}

moejit_status moejit_spec_load_string(const char *text, size_t len, const char *origin,
                                      moejit_spec *spec) {
  if (!text || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_spec_load_string: %s is NULL",
                   text ? "spec" : "text");
  return load_text(text, len, origin ? origin : "<string>", NULL, spec);
}

/* The directory part of `path` ("" stays NULL: the current directory). */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return NULL;
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (d) memcpy(d, path, n), d[n] = '\0';
  return d;
}

moejit_status moejit_spec_load_file(const char *path, moejit_spec *spec) {
  if (!path || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_spec_load_file: %s is NULL",
                   path ? "spec" : "path");
  struct stat st_buf;
  if (stat(path, &st_buf) != 0)
    return mj_fail(MOEJIT_ERR_IO, "cannot read config '%s': %s", path, strerror(errno));
  if (S_ISDIR(st_buf.st_mode))
    return mj_fail(MOEJIT_ERR_IO,
                   "cannot read config '%s': %s; HINT: give the path of a .yaml file", path,
                   strerror(EISDIR));
  if (S_ISREG(st_buf.st_mode) && (uint64_t)st_buf.st_size > MJ_CONFIG_MAX_BYTES)
    return mj_fail(MOEJIT_ERR_CONFIG,
                   "%s:1:1: the config is %lld bytes, more than the limit of %zu (1 MiB)", path,
                   (long long)st_buf.st_size, MJ_CONFIG_MAX_BYTES);
  char *text;
  size_t len;
  moejit_status st = mj_read_file(path, &text, &len);
  if (st) return st;
  char *dir = dir_of(path);
  if (strchr(path, '/') && !dir)
    st = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory loading '%s'", path);
  else
    st = load_text(text, len, path, dir, spec);
  free(dir);
  free(text);
  return st;
}
