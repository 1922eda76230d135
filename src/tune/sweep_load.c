/* Sweep YAML (files in configs/sweeps/, docs/tune.md) -> moejit_sweep, walking
 * the tree of config/yaml_tree.c; every message names FILE:LINE:COL and the
 * key path, like the config loader's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/common.h"
#include "config/config.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

typedef struct sl {
  const char *origin;
  moejit_sweep *sw;
} sl;

__attribute__((format(printf, 4, 5))) static moejit_status fail_at(const sl *L,
                                                                   const mj_yaml_node *n,
                                                                   const char *path,
                                                                   const char *fmt, ...) {
  char key[512] = ""; /* sweep messages name the key as key 'a.b' */
  if (path && *path) snprintf(key, sizeof key, "key '%s'", path);
  va_list ap;
  va_start(ap, fmt);
  moejit_status st = mj_yaml_vfail(L->origin, n, key, fmt, ap);
  va_end(ap);
  return st;
}

static const char *kind_name(const mj_yaml_node *n) {
  if (n->kind == MJ_YAML_MAP) return "a mapping";
  if (n->kind == MJ_YAML_SEQ) return "a list";
  return mj_yaml_is_null(n) ? "an empty value" : "a scalar";
}

/* Rejects keys outside `keys` (naming the allowed ones) and repeated keys. */
static moejit_status check_keys(const sl *L, const mj_yaml_node *map, const char *path,
                                const char *const *keys, size_t n_keys) {
  for (size_t i = 0; i + 1 < map->n_items; i += 2) {
    const mj_yaml_node *k = map->items[i];
    int known = 0;
    for (size_t j = 0; j < n_keys && k->kind == MJ_YAML_SCALAR; j++)
      known |= !strcmp(k->text, keys[j]);
    if (!known) {
      mj_buf b = {0};
      for (size_t j = 0; j < n_keys; j++) mj_buf_printf(&b, "%s%s", j ? ", " : "", keys[j]);
      char key[160];
      mj_quote(key, sizeof key, k->kind == MJ_YAML_SCALAR ? k->text : "?",
               k->kind == MJ_YAML_SCALAR ? k->len : 1);
      moejit_status st =
          fail_at(L, k, path, "unknown key %s (allowed %s)", key, b.data && !b.oom ? b.data : "?");
      mj_buf_free(&b);
      return st;
    }
    for (size_t j = 0; j < i; j += 2)
      if (!strcmp(map->items[j]->text, k->text))
        return fail_at(L, k, path, "key '%s' is given twice (first at line %d)", k->text,
                       map->items[j]->line);
  }
  return MOEJIT_OK;
}

static const mj_yaml_node *map_get(const mj_yaml_node *map, const char *key) {
  if (!map || map->kind != MJ_YAML_MAP) return NULL;
  for (size_t i = 0; i + 1 < map->n_items; i += 2)
    if (map->items[i]->kind == MJ_YAML_SCALAR && !strcmp(map->items[i]->text, key))
      return map->items[i + 1];
  return NULL;
}

static moejit_status want_map(const sl *L, const mj_yaml_node *n, const char *path) {
  if (n->kind == MJ_YAML_MAP) return MOEJIT_OK;
  return fail_at(L, n, path, "expected a mapping, got %s", kind_name(n));
}

/* Decimal integer in [lo, hi]. */
static moejit_status get_int(const sl *L, const mj_yaml_node *n, const char *path, int64_t lo,
                             int64_t hi, int64_t *out) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n))
    return fail_at(L, n, path, "expected an integer, got %s (allowed %lld..%lld)", kind_name(n),
                   (long long)lo, (long long)hi);
  const char *p = n->text + (n->text[0] == '-' || n->text[0] == '+');
  size_t digits = strspn(p, "0123456789");
  char q[160];
  mj_quote(q, sizeof q, n->text, n->len);
  if (!digits || p[digits] || digits > 18 || (p[0] == '0' && digits > 1))
    return fail_at(L, n, path, "%s is not a decimal integer (allowed %lld..%lld)", q, (long long)lo,
                   (long long)hi);
  int64_t v = strtoll(n->text, NULL, 10);
  if (v < lo || v > hi)
    return fail_at(L, n, path, "%lld is out of range (allowed %lld..%lld)", (long long)v,
                   (long long)lo, (long long)hi);
  *out = v;
  return MOEJIT_OK;
}

static moejit_status get_double(const sl *L, const mj_yaml_node *n, const char *path, double lo,
                                double hi, double *out) {
  int ok = n->kind == MJ_YAML_SCALAR && n->plain && n->len &&
           strspn(n->text, "0123456789+-.eE") == n->len;
  char *end = NULL;
  double v = ok ? strtod(n->text, &end) : 0;
  if (!ok || !end || *end || !(v >= lo && v <= hi))
    return fail_at(L, n, path, "expected a number in %g..%g, got %s", lo, hi,
                   n->kind == MJ_YAML_SCALAR ? n->text : kind_name(n));
  *out = v;
  return MOEJIT_OK;
}

static moejit_status get_bool(const sl *L, const mj_yaml_node *n, const char *path, int *out) {
  static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
  for (int i = 0; n->kind == MJ_YAML_SCALAR && n->plain && i < 3; i++) {
    if (!strcasecmp(n->text, yes[i])) return *out = 1, MOEJIT_OK;
    if (!strcasecmp(n->text, no[i])) return *out = 0, MOEJIT_OK;
  }
  return fail_at(L, n, path, "expected a boolean (allowed true/false, yes/no, on/off)");
}

/* A name of [A-Za-z0-9._-], 1..63 characters. */
static moejit_status get_name(const sl *L, const mj_yaml_node *n, const char *path, char *out) {
  const char *allowed = "1 to 63 characters of A-Z a-z 0-9 . _ -";
  if (n->kind != MJ_YAML_SCALAR || mj_yaml_is_null(n) || n->len == 0 || n->len >= MOEJIT_NAME_MAX ||
      strlen(n->text) != n->len ||
      strspn(n->text, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
          n->len) {
    char q[160];
    mj_quote(q, sizeof q, n->kind == MJ_YAML_SCALAR ? n->text : "",
             n->kind == MJ_YAML_SCALAR ? n->len : 0);
    return fail_at(L, n, path, "%s is not a name (allowed %s)",
                   n->kind == MJ_YAML_SCALAR ? q : kind_name(n), allowed);
  }
  memcpy(out, n->text, n->len + 1);
  return MOEJIT_OK;
}

/* Index of a scalar among names, or a message listing them. */
static moejit_status get_enum(const sl *L, const mj_yaml_node *n, const char *path,
                              const char *const *names, int count, int *out) {
  for (int i = 0; n->kind == MJ_YAML_SCALAR && i < count; i++)
    if (!strcmp(n->text, names[i])) return *out = i, MOEJIT_OK;
  mj_buf b = {0};
  for (int i = 0; i < count; i++) mj_buf_printf(&b, "%s%s", i ? ", " : "", names[i]);
  char q[160];
  mj_quote(q, sizeof q, n->kind == MJ_YAML_SCALAR ? n->text : "?",
           n->kind == MJ_YAML_SCALAR ? n->len : 1);
  moejit_status st =
      fail_at(L, n, path, "%s is not allowed (allowed %s)",
              n->kind == MJ_YAML_SCALAR ? q : kind_name(n), b.data && !b.oom ? b.data : "?");
  mj_buf_free(&b);
  return st;
}

/* ---- value sets: a scalar, a list, or a range {from, to, step | times} --- */

typedef struct value_rule {
  int64_t lo, hi; /* each value's range */
  const int *set; /* NULL, or the values allowed */
  int n_set;
  const char *allowed; /* for messages */
} value_rule;

static moejit_status check_value(const sl *L, const mj_yaml_node *n, const char *path,
                                 const value_rule *r, int64_t v) {
  int ok = v >= r->lo && v <= r->hi;
  if (ok && r->set) {
    ok = 0;
    for (int i = 0; i < r->n_set; i++) ok |= v == r->set[i];
  }
  return ok ? MOEJIT_OK
            : fail_at(L, n, path, "value %lld is not allowed (allowed %s)", (long long)v,
                      r->allowed);
}

static moejit_status add_value(const sl *L, const mj_yaml_node *n, const char *path,
                               const value_rule *r, int64_t v, int64_t *vals, int cap, int *count) {
  moejit_status st = check_value(L, n, path, r, v);
  if (st) return st;
  for (int i = 0; i < *count; i++)
    if (vals[i] == v) return MOEJIT_OK; /* listed twice: once is enough */
  if (*count >= cap) return fail_at(L, n, path, "more than %d values", cap);
  vals[(*count)++] = v;
  return MOEJIT_OK;
}

static moejit_status expand_range(const sl *L, const mj_yaml_node *n, const char *path,
                                  const value_rule *r, int64_t *vals, int cap, int *count) {
  static const char *const keys[] = {"from", "to", "step", "times"};
  moejit_status st = check_keys(L, n, path, keys, 4);
  const mj_yaml_node *from = map_get(n, "from"), *to = map_get(n, "to");
  const mj_yaml_node *step = map_get(n, "step"), *times = map_get(n, "times");
  if (st) return st;
  if (!from || !to)
    return fail_at(L, n, path, "a range needs 'from' and 'to' (and 'step' or 'times')");
  if (step && times) return fail_at(L, times, path, "a range takes 'step' or 'times', not both");
  int64_t a, b, s = 1, m = 0;
  if ((st = get_int(L, from, path, r->lo, r->hi, &a)) ||
      (st = get_int(L, to, path, r->lo, r->hi, &b)) ||
      (step && (st = get_int(L, step, path, 1, r->hi, &s))) ||
      (times && (st = get_int(L, times, path, 2, 1024, &m))))
    return st;
  if (a > b)
    return fail_at(L, to, path, "'to' (%lld) is below 'from' (%lld)", (long long)b, (long long)a);
  if (times && a < 1)
    return fail_at(L, from, path, "a geometric range ('times') starts at 1 or more");
  for (int64_t v = a; v <= b; v = times ? v * m : v + s) {
    if ((st = add_value(L, n, path, r, v, vals, cap, count))) return st;
    if ((times && v > INT64_MAX / m) || (!times && v > INT64_MAX - s)) break;
  }
  return MOEJIT_OK;
}

static moejit_status get_values(const sl *L, const mj_yaml_node *n, const char *path,
                                const value_rule *r, int64_t *vals, int cap, int *count) {
  *count = 0;
  moejit_status st = MOEJIT_OK;
  int64_t v;
  if (n->kind == MJ_YAML_MAP) {
    st = expand_range(L, n, path, r, vals, cap, count);
  } else if (n->kind == MJ_YAML_SEQ) {
    for (size_t i = 0; i < n->n_items && !st; i++) {
      st = get_int(L, n->items[i], path, INT64_MIN / 2, INT64_MAX / 2, &v);
      if (!st) st = add_value(L, n->items[i], path, r, v, vals, cap, count);
    }
  } else if (!(st = get_int(L, n, path, INT64_MIN / 2, INT64_MAX / 2, &v))) {
    st = add_value(L, n, path, r, v, vals, cap, count);
  }
  if (!st && *count == 0) st = fail_at(L, n, path, "no values (an empty list)");
  return st;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static moejit_status get_tokens(const sl *L, const mj_yaml_node *n, const char *path, int64_t *vals,
                                int *count) {
  static const value_rule r = {1, INT32_MAX, NULL, 0, "1..2147483647"};
  moejit_status st = get_values(L, n, path, &r, vals, MJ_SWEEP_MAX_TOKENS, count);
  if (!st) qsort(vals, (size_t)*count, sizeof *vals, cmp_i64);
  return st;
}

/* A list (or one) of names -> a bit mask; bit i+first for names[i]. */
static moejit_status get_mask(const sl *L, const mj_yaml_node *n, const char *path,
                              const char *const *names, int count, int first, unsigned *mask) {
  *mask = 0;
  size_t items = n->kind == MJ_YAML_SEQ ? n->n_items : 1;
  for (size_t i = 0; i < items; i++) {
    const mj_yaml_node *it = n->kind == MJ_YAML_SEQ ? n->items[i] : n;
    int idx;
    moejit_status st = get_enum(L, it, path, names, count, &idx);
    if (st) return st;
    *mask |= 1u << (idx + first);
  }
  if (!*mask) return fail_at(L, n, path, "no values (an empty list)");
  return MOEJIT_OK;
}

static const char *const kKernelNames[] = {"gemm1", "gemm2"};
/* The paths a space may name, and their moejit_gemm_path values. gemv is
 * never a default: its candidates ignore the tile (one per shape and
 * kernel survives the dedupe) and re-read weights above a few rows. */
static const char *const kPathNames[] = {"mma", "wgmma", "gemv"};
static const moejit_gemm_path kPathValues[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                               MOEJIT_GEMM_PATH_GEMV};

static moejit_status get_kernels(const sl *L, const mj_yaml_node *n, const char *path,
                                 unsigned *m) {
  return get_mask(L, n, path, kKernelNames, 2, 1, m); /* bits 1, 2 */
}

static moejit_status get_paths(const sl *L, const mj_yaml_node *n, const char *path, unsigned *m) {
  unsigned raw;
  moejit_status st = get_mask(L, n, path, kPathNames, (int)MJ_ARRAY_LEN(kPathNames), 0, &raw);
  *m = 0;
  for (size_t i = 0; i < MJ_ARRAY_LEN(kPathNames); i++)
    if (raw & (1u << i)) *m |= MJ_PATH_BIT(kPathValues[i]);
  return st;
}

/* ---- spaces ---------------------------------------------------------------- */

static const int kTileM[] = {16, 32, 64, 128, 256}, kTileN[] = {32, 64, 128, 256};
static const int kTileK[] = {32, 64, 128}, kWarps[] = {4, 8, 12};
static const value_rule kRules[MJ_P_COUNT] = {
    {16, 256, kTileM, 5, "16, 32, 64, 128, 256"},
    {32, 256, kTileN, 4, "32, 64, 128, 256"},
    {32, 128, kTileK, 3, "32, 64, 128"},
    {2, 8, NULL, 0, "2..8"},
    {4, 12, kWarps, 3, "4, 8, 12"},
    {0, 1, NULL, 0, "along_m, along_n"},
    {1, 2, NULL, 0, "1, 2"},
    {1, 2, NULL, 0, "1, 2"},
    {0, MJ_SCHEDULE_COUNT - 1, NULL, 0, MJ_SCHEDULE_ALLOWED}};
static const char *const kParamNames[MJ_P_COUNT] = {"tile_m",    "tile_n",    "tile_k",
                                                    "stages",    "warps",     "raster",
                                                    "cluster_m", "cluster_n", "schedule"};

/* A parameter written as names (raster, schedule): their enum values. */
static moejit_status get_named(const sl *L, const mj_yaml_node *n, const char *path, int p,
                               mj_sweep_space *sp) {
  static const char *const raster[] = {"along_m", "along_n"};
  const int count = p == MJ_P_RASTER ? (int)MJ_ARRAY_LEN(raster) : MJ_SCHEDULE_COUNT;
  unsigned m;
  moejit_status st =
      get_mask(L, n, path, p == MJ_P_RASTER ? raster : mj_schedule_names, count, 0, &m);
  sp->n_values[p] = 0;
  for (int i = 0; i < count; i++)
    if (m & (1u << i)) sp->values[p][sp->n_values[p]++] = i;
  return st;
}

/* Space tokens must be among the sweep's (a typo would silently time nothing). */
static moejit_status check_space_tokens(const sl *L, const mj_yaml_node *n, const char *path,
                                        const mj_sweep_space *sp) {
  for (int i = 0; i < sp->n_tokens; i++) {
    int found = 0;
    for (int j = 0; j < L->sw->n_tokens; j++) found |= sp->tokens[i] == L->sw->tokens[j];
    if (!found)
      return fail_at(L, n, path, "token count %lld is not in the sweep's tokens",
                     (long long)sp->tokens[i]);
  }
  return MOEJIT_OK;
}

static moejit_status load_space(const sl *L, const mj_yaml_node *n, int index, mj_sweep_space *sp) {
  static const char *const keys[] = {"kernels", "paths",     "tokens",    "tile_m",
                                     "tile_n",  "tile_k",    "stages",    "warps",
                                     "raster",  "cluster_m", "cluster_n", "schedule"};
  char path[64], sub[96];
  snprintf(path, sizeof path, "spaces[%d]", index);
  moejit_status st = want_map(L, n, path);
  if (!st) st = check_keys(L, n, path, keys, MJ_ARRAY_LEN(keys));
  if (st) return st;
  sp->line = n->line, sp->col = n->col;
  sp->kernels = L->sw->kernels, sp->paths = L->sw->paths;
  const mj_yaml_node *v;
  int64_t tmp[MJ_SWEEP_MAX_VALUES];
  snprintf(sub, sizeof sub, "%s.kernels", path);
  if ((v = map_get(n, "kernels")) && (st = get_kernels(L, v, sub, &sp->kernels))) return st;
  snprintf(sub, sizeof sub, "%s.paths", path);
  if ((v = map_get(n, "paths")) && (st = get_paths(L, v, sub, &sp->paths))) return st;
  snprintf(sub, sizeof sub, "%s.tokens", path);
  if ((v = map_get(n, "tokens")) && ((st = get_tokens(L, v, sub, sp->tokens, &sp->n_tokens)) ||
                                     (st = check_space_tokens(L, v, sub, sp))))
    return st;
  double product = 1;
  for (int p = 0; p < MJ_P_COUNT; p++) {
    snprintf(sub, sizeof sub, "%s.%s", path, kParamNames[p]);
    v = map_get(n, kParamNames[p]);
    if (!v && p <= MJ_P_STAGES)
      return fail_at(L, n, path,
                     "missing key '%s' (a space lists tile_m, tile_n, tile_k and stages)",
                     kParamNames[p]);
    if (!v) { /* warps 8, raster along_m, cluster_m and cluster_n 1, schedule cooperative */
      sp->values[p][0] = p == MJ_P_WARPS ? 8 : p == MJ_P_CLUSTER_M || p == MJ_P_CLUSTER_N ? 1 : 0;
      sp->n_values[p] = 1;
    } else if (p == MJ_P_RASTER || p == MJ_P_SCHEDULE) {
      if ((st = get_named(L, v, sub, p, sp))) return st;
    } else {
      if ((st = get_values(L, v, sub, &kRules[p], tmp, MJ_SWEEP_MAX_VALUES, &sp->n_values[p])))
        return st;
      for (int i = 0; i < sp->n_values[p]; i++) sp->values[p][i] = (int)tmp[i];
    }
    product *= sp->n_values[p];
  }
  if (product > MJ_SWEEP_MAX_SPACE)
    return fail_at(L, n, path,
                   "spans %.0f tile configs, more than %d; HINT: split it or list fewer values",
                   product, MJ_SWEEP_MAX_SPACE);
  return MOEJIT_OK;
}

/* ---- shapes ---------------------------------------------------------------- */

static moejit_status load_preset(const sl *L, const mj_yaml_node *n, const char *path,
                                 mj_sweep_shape *sh) {
  char name[MOEJIT_NAME_MAX];
  moejit_status st = get_name(L, n, path, name);
  if (st) return st;
  if (moejit_spec_load_preset(name, &sh->spec) != MOEJIT_OK) {
    mj_buf b = {0};
    for (const char *const *p = moejit_preset_names(); *p; p++)
      mj_buf_printf(&b, "%s%s", p == moejit_preset_names() ? "" : ", ", *p);
    st = fail_at(L, n, path, "unknown preset '%s' (allowed %s)", name,
                 b.data && !b.oom ? b.data : "?");
    mj_buf_free(&b);
    return st;
  }
  mj_strlcpy(sh->preset, name, sizeof sh->preset);
  mj_strlcpy(sh->name, name, sizeof sh->name);
  return MOEJIT_OK;
}

static moejit_status load_raw_shape(const sl *L, const mj_yaml_node *n, const char *path,
                                    mj_sweep_shape *sh) {
  static const char *const fields[] = {"hidden", "expert_width", "experts", "top_k"};
  static const int64_t hi[] = {1048576, 1048576, 1024, 32};
  const mj_yaml_node *name = map_get(n, "name");
  char sub[96];
  if (!name) return fail_at(L, n, path, "a raw shape needs 'name' (or give 'preset')");
  snprintf(sub, sizeof sub, "%s.name", path);
  moejit_status st = get_name(L, name, sub, sh->name);
  if (st) return st;
  moejit_spec_init(&sh->spec);
  mj_strlcpy(sh->spec.name, sh->name, sizeof sh->spec.name);
  for (int i = 0; i < 4; i++) {
    const mj_yaml_node *v = map_get(n, fields[i]);
    int64_t x;
    snprintf(sub, sizeof sub, "%s.%s", path, fields[i]);
    if (!v)
      return fail_at(L, n, path,
                     "missing key '%s' (a raw shape gives hidden, expert_width, experts, top_k)",
                     fields[i]);
    if ((st = get_int(L, v, sub, 1, hi[i], &x))) return st;
    if (i == 0) sh->spec.hidden = x;
    if (i == 1) sh->spec.expert_width = x;
    if (i == 2) sh->spec.experts = (int32_t)x;
    if (i == 3) sh->spec.top_k = (int32_t)x;
  }
  return MOEJIT_OK;
}

static moejit_status set_shape_dtype(const sl *L, const mj_yaml_node *v, const char *path,
                                     mj_sweep_shape *sh) {
  static const char *const names[] = {"bf16", "fp16"};
  int i;
  moejit_status st = get_enum(L, v, path, names, 2, &i);
  if (st) return st;
  moejit_dtype dt = i == 0 ? MOEJIT_DTYPE_BF16 : MOEJIT_DTYPE_FP16;
  sh->spec.act_dtype = sh->spec.weight_dtype = sh->spec.out_dtype = dt;
  return MOEJIT_OK;
}

/* Why shape sh cannot be tuned, in why (NULL: it can): its spec, on the
 * sweep's arch (set here), must have equal bf16 or fp16 activation and
 * weight dtypes and validate, and T * top_k rows must fit int32. YAML
 * shapes (finish_shape) and model specs (moejit_sweep_set_shapes) share it. */
static const char *shape_problem(const moejit_sweep *sw, mj_sweep_shape *sh, char *why,
                                 size_t cap) {
  sh->spec.n_archs = 1;
  mj_strlcpy(sh->spec.archs[0], sw->arch, sizeof sh->spec.archs[0]);
  if (!mj_tuned_spec_dtypes_ok(&sh->spec)) {
    snprintf(why, cap,
             "activations %s, weights %s; tuning covers bf16 and fp16 layers with equal "
             "activation and weight dtypes",
             moejit_dtype_name(sh->spec.act_dtype), moejit_dtype_name(sh->spec.weight_dtype));
    return why;
  }
  if (moejit_spec_validate(&sh->spec) != MOEJIT_OK) {
    mj_strlcpy(why, moejit_last_error(), cap);
    return why;
  }
  for (int i = 0; i < sh->n_tokens; i++)
    if (sh->tokens[i] > INT32_MAX / sh->spec.top_k) {
      snprintf(why, cap, "%lld tokens x top_k %d rows do not fit in int32",
               (long long)sh->tokens[i], (int)sh->spec.top_k);
      return why;
    }
  return NULL;
}

static moejit_status finish_shape(const sl *L, const mj_yaml_node *n, const char *path,
                                  mj_sweep_shape *sh) {
  char why[1024];
  return shape_problem(L->sw, sh, why, sizeof why) ? fail_at(L, n, path, "%s", why) : MOEJIT_OK;
}

static moejit_status load_shape(const sl *L, const mj_yaml_node *n, int index, mj_sweep_shape *sh) {
  static const char *const keys[] = {"preset",  "name",  "hidden", "expert_width",
                                     "experts", "top_k", "dtype",  "tokens"};
  char path[64], sub[96];
  snprintf(path, sizeof path, "shapes[%d]", index);
  sh->line = n->line, sh->col = n->col;
  memcpy(sh->tokens, L->sw->tokens, sizeof sh->tokens);
  sh->n_tokens = L->sw->n_tokens;
  moejit_status st;
  if (n->kind == MJ_YAML_SCALAR) {
    st = load_preset(L, n, path, sh);
    return st ? st : finish_shape(L, n, path, sh);
  }
  if ((st = want_map(L, n, path)) || (st = check_keys(L, n, path, keys, MJ_ARRAY_LEN(keys))))
    return st;
  const mj_yaml_node *preset = map_get(n, "preset"), *v;
  if (preset) {
    for (int i = 2; i <= 5; i++) /* a preset's shape is its own; 'name' only labels it */
      if ((v = map_get(n, keys[i])))
        return fail_at(L, v, path,
                       "'%s' cannot be given with 'preset' (a shape is a preset or raw)", keys[i]);
    snprintf(sub, sizeof sub, "%s.preset", path);
    st = load_preset(L, preset, sub, sh);
    snprintf(sub, sizeof sub, "%s.name", path);
    if (!st && (v = map_get(n, "name"))) st = get_name(L, v, sub, sh->name);
  } else {
    st = load_raw_shape(L, n, path, sh);
  }
  if (st) return st;
  snprintf(sub, sizeof sub, "%s.dtype", path);
  if ((v = map_get(n, "dtype")) && (st = set_shape_dtype(L, v, sub, sh))) return st;
  snprintf(sub, sizeof sub, "%s.tokens", path);
  if ((v = map_get(n, "tokens")) && (st = get_tokens(L, v, sub, sh->tokens, &sh->n_tokens)))
    return st;
  return finish_shape(L, n, path, sh);
}

static moejit_status load_list(const sl *L, const mj_yaml_node *n, const char *path, int max,
                               size_t elem, void **out, int *count,
                               moejit_status (*one)(const sl *, const mj_yaml_node *, int,
                                                    void *)) {
  if (n->kind != MJ_YAML_SEQ || n->n_items == 0)
    return fail_at(L, n, path, "expected a non-empty list, got %s",
                   n->kind == MJ_YAML_SEQ ? "an empty list" : kind_name(n));
  if (n->n_items > (size_t)max) return fail_at(L, n, path, "more than %d entries", max);
  char *items = calloc(n->n_items, elem);
  if (!items) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory loading a sweep");
  *out = items;
  for (size_t i = 0; i < n->n_items; i++) {
    moejit_status st = one(L, n->items[i], (int)i, items + i * elem);
    if (st) return st;
    ++*count;
  }
  return MOEJIT_OK;
}

static moejit_status one_shape(const sl *L, const mj_yaml_node *n, int i, void *out) {
  moejit_status st = load_shape(L, n, i, out);
  const mj_sweep_shape *sh = out;
  for (int j = 0; !st && j < i; j++)
    if (!strcmp(L->sw->shapes[j].name, sh->name))
      st = fail_at(L, n, "shapes",
                   "shape name '%s' is used twice (first at line %d); HINT: give "
                   "the second a 'name'",
                   sh->name, L->sw->shapes[j].line);
  return st;
}

static moejit_status one_space(const sl *L, const mj_yaml_node *n, int i, void *out) {
  return load_space(L, n, i, out);
}

/* ---- sections -------------------------------------------------------------- */

static moejit_status load_timing(const sl *L, const mj_yaml_node *n) {
  static const char *const keys[] = {"warmup",       "iters",     "min_iters",
                                     "max_point_ms", "rotate_mb", "runoff"};
  moejit_sweep *sw = L->sw;
  moejit_status st = want_map(L, n, "timing");
  if (!st) st = check_keys(L, n, "timing", keys, MJ_ARRAY_LEN(keys));
  const mj_yaml_node *v;
  int64_t x;
  double d;
  if (!st && (v = map_get(n, "warmup")) && !(st = get_int(L, v, "timing.warmup", 0, 1000, &x)))
    sw->warmup = (int)x;
  if (!st && (v = map_get(n, "iters")) && !(st = get_int(L, v, "timing.iters", 1, 1000, &x)))
    sw->iters = (int)x;
  if (!st && (v = map_get(n, "min_iters")) &&
      !(st = get_int(L, v, "timing.min_iters", 1, 1000, &x)))
    sw->min_iters = (int)x;
  if (!st && (v = map_get(n, "max_point_ms")) &&
      !(st = get_double(L, v, "timing.max_point_ms", 0.001, 1e6, &d)))
    sw->max_point_ms = d;
  if (!st && (v = map_get(n, "rotate_mb")) &&
      !(st = get_double(L, v, "timing.rotate_mb", 0, 1e5, &d)))
    sw->rotate_bytes = d * 1e6;
  if (!st && (v = map_get(n, "runoff")) &&
      !(st = get_int(L, v, "timing.runoff", 0, MJ_TUNE_MAX_RUNOFF, &x)))
    sw->runoff = (int)x;
  return st;
}

static moejit_status load_check(const sl *L, const mj_yaml_node *n) {
  static const char *const keys[] = {"rows", "tolerance"};
  moejit_status st = want_map(L, n, "check");
  if (!st) st = check_keys(L, n, "check", keys, 2);
  const mj_yaml_node *v;
  int64_t x;
  if (!st && (v = map_get(n, "rows")) &&
      !(st = get_int(L, v, "check.rows", 1, MJ_TUNE_MAX_CHECK_ROWS, &x)))
    L->sw->check_rows = (int)x;
  if (!st && (v = map_get(n, "tolerance")))
    st = get_double(L, v, "check.tolerance", 1e-6, 1, &L->sw->tolerance);
  return st;
}

static moejit_status load_constraints(const sl *L, const mj_yaml_node *n) {
  static const char *const keys[] = {"divisible"};
  moejit_status st = want_map(L, n, "constraints");
  if (!st) st = check_keys(L, n, "constraints", keys, 1);
  const mj_yaml_node *v;
  if (!st && (v = map_get(n, "divisible")))
    st = get_bool(L, v, "constraints.divisible", &L->sw->divisible);
  return st;
}

static moejit_status load_arch(const sl *L, const mj_yaml_node *n) {
  /* the length check also catches a NUL inside the scalar */
  if (n->kind != MJ_YAML_SCALAR || n->len >= MOEJIT_ARCH_MAX || !mj_arch_supported(n->text))
    return fail_at(L, n, "arch", "expected an arch name such as sm_90a (one of %s, 'auto' aside)",
                   mj_arch_allowed());
  mj_strlcpy(L->sw->arch, n->text, sizeof L->sw->arch);
  return MOEJIT_OK;
}

static void sweep_defaults(moejit_sweep *sw) {
  mj_strlcpy(sw->arch, "sm_90a", sizeof sw->arch);
  sw->kernels = MJ_KERNEL_BIT(1) | MJ_KERNEL_BIT(2);
  sw->paths = MJ_PATH_BIT(MOEJIT_GEMM_PATH_MMA) | MJ_PATH_BIT(MOEJIT_GEMM_PATH_WGMMA);
  sw->warmup = 3, sw->iters = 20, sw->min_iters = 5;
  sw->max_point_ms = 200, sw->rotate_bytes = 200e6, sw->runoff = 3;
  sw->check_rows = 8, sw->tolerance = 2e-2, sw->seed = 1, sw->divisible = 1;
}

/* Top-level keys in dependency order: arch, kernels, paths and tokens
 * before shapes and spaces, whose defaults they are. */
static moejit_status load_root(const sl *L, const mj_yaml_node *root) {
  static const char *const keys[] = {"name",  "arch",   "tokens",     "kernels",
                                     "paths", "shapes", "spaces",     "timing",
                                     "check", "seed",   "constraints"};
  moejit_sweep *sw = L->sw;
  if (!root) return fail_at(L, NULL, "", "the sweep is empty (needs name, tokens, shapes, spaces)");
  moejit_status st = want_map(L, root, "");
  if (!st) st = check_keys(L, root, "", keys, MJ_ARRAY_LEN(keys));
  if (st) return st;
  static const char *const required[] = {"name", "tokens", "shapes", "spaces"};
  for (size_t i = 0; i < MJ_ARRAY_LEN(required); i++)
    if (!map_get(root, required[i]))
      return fail_at(L, root, "",
                     "missing key '%s' (a sweep needs name, tokens, shapes and spaces)",
                     required[i]);
  const mj_yaml_node *v;
  int64_t seed;
  if ((st = get_name(L, map_get(root, "name"), "name", sw->name))) return st;
  if ((v = map_get(root, "arch")) && (st = load_arch(L, v))) return st;
  if ((st = get_tokens(L, map_get(root, "tokens"), "tokens", sw->tokens, &sw->n_tokens))) return st;
  if ((v = map_get(root, "kernels")) && (st = get_kernels(L, v, "kernels", &sw->kernels)))
    return st;
  if ((v = map_get(root, "paths")) && (st = get_paths(L, v, "paths", &sw->paths))) return st;
  if ((v = map_get(root, "timing")) && (st = load_timing(L, v))) return st;
  if (sw->min_iters > sw->iters) sw->min_iters = sw->iters;
  if ((v = map_get(root, "check")) && (st = load_check(L, v))) return st;
  if ((v = map_get(root, "constraints")) && (st = load_constraints(L, v))) return st;
  if ((v = map_get(root, "seed")) && !(st = get_int(L, v, "seed", 0, INT64_MAX / 2, &seed)))
    sw->seed = (uint64_t)seed;
  if (st) return st;
  if ((st = load_list(L, map_get(root, "shapes"), "shapes", MJ_SWEEP_MAX_SHAPES,
                      sizeof(mj_sweep_shape), (void **)&sw->shapes, &sw->n_shapes, one_shape)))
    return st;
  return load_list(L, map_get(root, "spaces"), "spaces", MJ_SWEEP_MAX_SPACES,
                   sizeof(mj_sweep_space), (void **)&sw->spaces, &sw->n_spaces, one_space);
}

moejit_status moejit_sweep_load_string(const char *text, size_t len, const char *origin,
                                       moejit_sweep **out) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_sweep_load_string: out is NULL");
  *out = NULL;
  if (!text) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_sweep_load_string: text is NULL");
  if (!origin) origin = "<string>";
  if (len > MJ_CONFIG_MAX_BYTES)
    return mj_fail(MOEJIT_ERR_CONFIG, "%s: %zu bytes is larger than a sweep may be (%zu)", origin,
                   len, MJ_CONFIG_MAX_BYTES);
  moejit_sweep *sw = calloc(1, sizeof *sw);
  if (!sw) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory loading a sweep");
  sweep_defaults(sw);
  mj_strlcpy(sw->origin, origin, sizeof sw->origin);
  mj_yaml_node *root = NULL;
  sl L = {origin, sw};
  moejit_status st = mj_yaml_parse(text, len, origin, &root);
  if (!st) st = load_root(&L, root);
  mj_yaml_free(root);
  if (st) {
    moejit_sweep_destroy(sw);
    return st;
  }
  *out = sw;
  return MOEJIT_OK;
}

moejit_status moejit_sweep_load_file(const char *path, moejit_sweep **out) {
  if (out) *out = NULL;
  if (!out || !path)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_sweep_load_file: NULL argument");
  char *text = NULL;
  size_t len = 0;
  moejit_status st = mj_read_file(path, &text, &len);
  if (st) return st;
  st = moejit_sweep_load_string(text, len, path, out);
  free(text);
  return st;
}

void moejit_sweep_destroy(moejit_sweep *sweep) {
  if (!sweep) return;
  free(sweep->shapes);
  free(sweep->spaces);
  free(sweep);
}

const char *moejit_sweep_name(const moejit_sweep *sweep) {
  return sweep ? sweep->name : "";
}

size_t moejit_sweep_tokens(const moejit_sweep *sweep, int64_t *tokens, size_t cap) {
  if (!sweep) return 0;
  for (size_t i = 0; i < cap && i < (size_t)sweep->n_tokens; i++) tokens[i] = sweep->tokens[i];
  return (size_t)sweep->n_tokens;
}

size_t moejit_sweep_shape_specs(const moejit_sweep *sweep, moejit_spec *specs, size_t cap) {
  if (!sweep) return 0;
  for (size_t i = 0; i < cap && i < (size_t)sweep->n_shapes; i++) specs[i] = sweep->shapes[i].spec;
  return (size_t)sweep->n_shapes;
}

_Static_assert(MOEJIT_TUNE_MAX_MODELS == MJ_SWEEP_MAX_SHAPES, "moejit_sweep_set_shapes' limit");

/* Shape i of moejit_sweep_set_shapes: the spec at the sweep's token counts. */
static moejit_status model_shape(const moejit_sweep *sw, const moejit_spec *spec, int i,
                                 mj_sweep_shape *sh) {
  char why[1024];
  memset(sh, 0, sizeof *sh);
  sh->spec = *spec;
  mj_strlcpy(sh->name, spec->name, sizeof sh->name);
  memcpy(sh->tokens, sw->tokens, sizeof sh->tokens);
  sh->n_tokens = sw->n_tokens;
  if (!shape_problem(sw, sh, why, sizeof why)) return MOEJIT_OK;
  return mj_fail(MOEJIT_ERR_CONFIG, "moejit_sweep_set_shapes: specs[%d] (%s): %s", i, sh->name,
                 why);
}

moejit_status moejit_sweep_set_shapes(moejit_sweep *sweep, const moejit_spec *specs, int n) {
  const char *op = "moejit_sweep_set_shapes";
  if (!sweep || !specs)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: sweep and specs are required", op);
  if (n < 1 || n > MJ_SWEEP_MAX_SHAPES)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: n = %d specs; give 1 to %d", op, n,
                   MJ_SWEEP_MAX_SHAPES);
  mj_sweep_shape *shapes = calloc((size_t)n, sizeof *shapes);
  if (!shapes) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  moejit_status st = MOEJIT_OK;
  for (int i = 0; i < n && !st; i++) {
    st = model_shape(sweep, &specs[i], i, &shapes[i]);
    for (int j = 0; !st && j < i; j++)
      if (!strcmp(shapes[j].name, shapes[i].name))
        st = mj_fail(MOEJIT_ERR_CONFIG,
                     "%s: specs[%d] and specs[%d] are both named '%s'; HINT: give each model "
                     "its own name",
                     op, j, i, shapes[i].name);
  }
  if (st) return free(shapes), st;
  free(sweep->shapes);
  sweep->shapes = shapes;
  sweep->n_shapes = n;
  return MOEJIT_OK;
}

static int is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* dir/name, then dir/name.yaml; 1 and the path in buf when one exists. */
static int try_dir(const char *dir, const char *name, char *buf, size_t cap, mj_buf *tried) {
  if (!dir || !*dir) return 0;
  static const char *const ext[] = {"", ".yaml"};
  for (int i = 0; i < 2; i++) {
    if (mj_snprintf(buf, cap, "%s/%s%s", dir, name, ext[i]) != MOEJIT_OK) continue;
    if (is_file(buf)) return 1;
  }
  mj_buf_printf(tried, "%s%s/", tried->len ? ", " : "", dir);
  return 0;
}

moejit_status moejit_sweep_find(const char *name, char *buf, size_t cap) {
  if (!name || !buf || cap == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_sweep_find: NULL argument");
  if (is_file(name)) return mj_snprintf(buf, cap, "%s", name);
  mj_buf tried = {0};
  int found = 0;
  if (!strchr(name, '/') && *name) {
    found = try_dir(getenv("MOEJIT_SWEEP_DIR"), name, buf, cap, &tried) ||
            try_dir("configs/sweeps", name, buf, cap, &tried);
#ifdef MOEJIT_SOURCE_DIR
    found = found || try_dir(MOEJIT_SOURCE_DIR "/configs/sweeps", name, buf, cap, &tried);
#endif
  }
  moejit_status st = found
                         ? MOEJIT_OK
                         : mj_fail(MOEJIT_ERR_NOT_FOUND,
                                   "sweep '%s' not found: no such file%s%s; HINT: give a path to a "
                                   "sweep YAML or a name in configs/sweeps/ (docs/tune.md)",
                                   name, tried.len ? ", nor NAME or NAME.yaml in " : "",
                                   tried.data && !tried.oom ? tried.data : "");
  mj_buf_free(&tried);
  return st;
}
