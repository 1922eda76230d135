/* Tuned tables (tuned_table.h): the YAML format `moejit tune` writes and
 * model loading reads, the per-device lookup ($MOEJIT_TUNED_DIR, then the
 * tables embedded from configs/tuned/), and the nearest-bucket rule.
 * Format and rules: docs/tuned-tables.md. */
#include "tune/tuned_table.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/gemm.h"

/* Input size limit, as for configs (a full table is about 60 KB). */

/* ---- the schema ------------------------------------------------------------ */

enum { TK_DEVICE, TK_ARCH, TK_NVRTC, TK_DRIVER, TK_DATE, TK_ENTRIES, TK_COUNT };
static const char *const top_keys[TK_COUNT] = {"device", "arch", "nvrtc",
                                               "driver", "date", "entries"};
static const unsigned char top_required[TK_COUNT] = {1, 0, 0, 0, 0, 1};

/* clang-format off */
enum {
  EK_KERNEL, EK_DTYPE, EK_HIDDEN, EK_WIDTH, EK_EXPERTS, EK_TOP_K, EK_TOKENS, EK_TILE,
  EK_STAGES, EK_WARPS, EK_CLUSTER, EK_RASTER, EK_PATH, EK_US, EK_HEURISTIC_US, EK_SCHEDULE,
  EK_PINNED, EK_COUNT
};
static const char *const entry_keys[EK_COUNT] = {
    "kernel", "dtype", "hidden", "expert_width", "experts", "top_k", "tokens",      "tile",
    "stages", "warps", "cluster", "raster",      "path",    "us",    "heuristic_us",
    "schedule", "pinned"};
static const unsigned char entry_required[EK_COUNT] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                       1, 1, 0, 0, 1, 1, 0, 0, 0};
/* clang-format on */

static const char *const kernel_names[] = {"gemm1", "gemm2"};
static const char *const dtype_names[] = {"bf16", "fp16"};
static const moejit_dtype dtype_values[] = {MOEJIT_DTYPE_BF16, MOEJIT_DTYPE_FP16};
/* The paths a tuned entry may name (AUTO and SIMT are not tuned). A gemv
 * entry still carries a tile: its kernel ignores it, but the module it
 * lives in is built from it. */
static const char *const path_names[] = {"mma", "wgmma", "gemv"};
static const moejit_gemm_path path_values[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                               MOEJIT_GEMM_PATH_GEMV};
static const char *const raster_names[] = {"along_m", "along_n"};
static const char *const pinned_names[] = {"false", "true"};

static void join(const char *const *names, size_t n, char *buf, size_t cap) {
  size_t o = 0;
  if (cap) buf[0] = '\0';
  for (size_t i = 0; i < n && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", names[i]);
}

/* ---- range rules (parse, put and write share them) ------------------------- */

static int one_of(int v, const int *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v == set[i]) return 1;
  return 0;
}

static int out_of(char *why, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int out_of(char *why, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
  return 1;
}

static int shape_problem(const mj_tuned_entry *e, int *key, char *why, size_t cap) {
  const int64_t dims[2] = {e->hidden, e->expert_width};
  for (int i = 0; i < 2; i++)
    if (dims[i] < 8 || dims[i] > 1048576 || dims[i] % 8)
      return *key = i ? EK_WIDTH : EK_HIDDEN,
             out_of(why, cap, "%lld is out of range (allowed 8..1048576, a multiple of 8)",
                    (long long)dims[i]);
  if (e->experts < 1 || e->experts > 1024)
    return *key = EK_EXPERTS,
           out_of(why, cap, "%d is out of range (allowed 1..1024)", (int)e->experts);
  const int k_max = e->experts < 32 ? e->experts : 32;
  if (e->top_k < 1 || e->top_k > k_max)
    return *key = EK_TOP_K,
           out_of(why, cap, "%d is out of range (allowed 1..min(experts, 32) = 1..%d)",
                  (int)e->top_k, k_max);
  const int64_t t_max = INT32_MAX / e->top_k;
  if (e->tokens < 1 || e->tokens > t_max)
    return *key = EK_TOKENS,
           out_of(why, cap,
                  "%lld is out of range (allowed 1..%lld: tokens * top_k must fit in int32)",
                  (long long)e->tokens, (long long)t_max);
  return 0;
}

static int cfg_problem(const moejit_gemm_cfg *g, int *key, char *why, size_t cap) {
  static const int tm[] = {16, 32, 64, 128, 256}, tn[] = {32, 64, 128, 256}, tk[] = {32, 64, 128};
  static const int warps[] = {4, 8, 12};
  if (!one_of(g->tile_m, tm, 5) || !one_of(g->tile_n, tn, 4) || !one_of(g->tile_k, tk, 3))
    return *key = EK_TILE,
           out_of(why, cap,
                  "[%d, %d, %d] is not a supported tile (allowed [tile_m, tile_n, tile_k] with "
                  "tile_m 16, 32, 64, 128 or 256; tile_n 32, 64, 128 or 256; tile_k 32, 64 or 128)",
                  g->tile_m, g->tile_n, g->tile_k);
  if (g->stages < 2 || g->stages > 8)
    return *key = EK_STAGES, out_of(why, cap, "%d is out of range (allowed 2..8)", g->stages);
  if (!one_of(g->warps, warps, 3))
    return *key = EK_WARPS, out_of(why, cap, "%d is not supported (allowed 4, 8, 12)", g->warps);
  if (g->cluster_m < 1 || g->cluster_m > 2 || g->cluster_n < 1 || g->cluster_n > 2 ||
      (g->cluster_m == 2 && g->cluster_n == 2))
    return *key = EK_CLUSTER,
           out_of(why, cap, "[%d, %d] is out of range (allowed 1 or 2 each, not both 2)",
                  g->cluster_m, g->cluster_n);
  if (g->raster != MOEJIT_RASTER_ALONG_M && g->raster != MOEJIT_RASTER_ALONG_N)
    return *key = EK_RASTER,
           out_of(why, cap, "value %d is not a raster order (allowed along_m, along_n)",
                  (int)g->raster);
  if (!mj_schedule_valid((int64_t)g->schedule))
    return *key = EK_SCHEDULE, out_of(why, cap, "value %d is not a schedule (allowed %s)",
                                      (int)g->schedule, MJ_SCHEDULE_ALLOWED);
  return 0;
}

/* The first field of e outside its range: *key (EK_*) and why; 0 when e fits. */
static int entry_problem(const mj_tuned_entry *e, int *key, char *why, size_t cap) {
  char q[64];
  if (!memchr(e->kernel, '\0', sizeof e->kernel) ||
      (strcmp(e->kernel, "gemm1") != 0 && strcmp(e->kernel, "gemm2") != 0)) {
    mj_quote(q, sizeof q, e->kernel, strnlen(e->kernel, sizeof e->kernel));
    return *key = EK_KERNEL, out_of(why, cap, "%s is not a GEMM kernel (allowed gemm1, gemm2)", q);
  }
  if (e->dtype != MOEJIT_DTYPE_BF16 && e->dtype != MOEJIT_DTYPE_FP16)
    return *key = EK_DTYPE, out_of(why, cap, "%s is not a tensor-core dtype (allowed bf16, fp16)",
                                   moejit_dtype_name(e->dtype));
  if (shape_problem(e, key, why, cap) || cfg_problem(&e->cfg, key, why, cap)) return 1;
  if (e->path != MOEJIT_GEMM_PATH_MMA && e->path != MOEJIT_GEMM_PATH_WGMMA &&
      e->path != MOEJIT_GEMM_PATH_GEMV)
    return *key = EK_PATH,
           out_of(why, cap, "value %d is not a tuned path (allowed mma, wgmma, gemv)",
                  (int)e->path);
  if (!isfinite(e->us) || e->us < 0)
    return *key = EK_US,
           out_of(why, cap, "%g is out of range (allowed a time > 0, or 0: not timed alone)",
                  e->us);
  if (!isfinite(e->heuristic_us) || e->heuristic_us < 0)
    return *key = EK_HEURISTIC_US,
           out_of(why, cap, "%g is out of range (allowed a time > 0, or 0: unknown)",
                  e->heuristic_us);
  if (e->pinned != 0 && e->pinned != 1)
    return *key = EK_PINNED, out_of(why, cap, "value %d is not a flag (allowed 0 or 1)", e->pinned);
  return 0;
}

/* Order of a table: kernel, dtype (by name), d, f, E, k, tokens. */
static int cmp_i64(int64_t a, int64_t b) {
  return (a > b) - (a < b);
}

static int entry_key_cmp(const mj_tuned_entry *a, const mj_tuned_entry *b) {
  int c = strcmp(a->kernel, b->kernel);
  if (!c) c = strcmp(moejit_dtype_name(a->dtype), moejit_dtype_name(b->dtype));
  if (!c) c = cmp_i64(a->hidden, b->hidden);
  if (!c) c = cmp_i64(a->expert_width, b->expert_width);
  if (!c) c = cmp_i64(a->experts, b->experts);
  if (!c) c = cmp_i64(a->top_k, b->top_k);
  if (!c) c = cmp_i64(a->tokens, b->tokens);
  return c;
}

static int entry_qsort_cmp(const void *a, const void *b) {
  return entry_key_cmp(a, b);
}

/* ---- parsing --------------------------------------------------------------- */

typedef struct tparser {
  const char *origin;
} tparser;

__attribute__((format(printf, 4, 5))) static moejit_status fail_at(const tparser *P,
                                                                   const mj_yaml_node *n,
                                                                   const char *path,
                                                                   const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  moejit_status st = mj_yaml_vfail(P->origin, n, path, fmt, ap);
  va_end(ap);
  return st;
}

static moejit_status fail_type(const tparser *P, const mj_yaml_node *n, const char *path,
                               const char *expected) {
  char got[128];
  mj_yaml_describe(n, got, sizeof got);
  return fail_at(P, n, path, "expected %s, got %s", expected, got);
}

/* Plain decimal integers only (no quotes, hex, leading zeros or floats). */
static moejit_status get_int(const tparser *P, const mj_yaml_node *n, const char *path,
                             int64_t *out) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n) || n->len != strlen(n->text))
    return fail_type(P, n, path, "an integer");
  const char *p = n->text + (n->text[0] == '-');
  size_t digits = strspn(p, "0123456789");
  if (digits == 0 || p[digits] != '\0' || (p[0] == '0' && digits > 1))
    return fail_type(P, n, path, "a decimal integer without leading zeros");
  errno = 0;
  long long v = strtoll(n->text, NULL, 10);
  if (errno == ERANGE) return fail_at(P, n, path, "%s does not fit in 64 bits", n->text);
  *out = v;
  return MOEJIT_OK;
}

/* An int-valued key; `lo..hi` only keeps the C field from overflowing (the
 * range rules above say what is allowed). */
static moejit_status get_int32(const tparser *P, const mj_yaml_node *n, const char *path,
                               int *out) {
  int64_t v;
  moejit_status st = get_int(P, n, path, &v);
  if (st) return st;
  if (v < INT32_MIN || v > INT32_MAX)
    return fail_at(P, n, path, "%lld does not fit in 32 bits", (long long)v);
  *out = (int)v;
  return MOEJIT_OK;
}

static moejit_status get_double(const tparser *P, const mj_yaml_node *n, const char *path,
                                double *out) {
  if (n->kind != MJ_YAML_SCALAR || !n->plain || mj_yaml_is_null(n) || n->len != strlen(n->text) ||
      strspn(n->text, "0123456789+-.eE") != n->len)
    return fail_type(P, n, path, "a decimal number");
  char *end;
  double v = strtod(n->text, &end);
  if (end == n->text || *end) return fail_type(P, n, path, "a decimal number");
  *out = v;
  return MOEJIT_OK;
}

/* A string scalar (plain or quoted) that fits in cap bytes with its NUL. */
static moejit_status get_string(const tparser *P, const mj_yaml_node *n, const char *path,
                                char *dst, size_t cap) {
  if (n->kind != MJ_YAML_SCALAR || mj_yaml_is_null(n)) return fail_type(P, n, path, "a string");
  if (strlen(n->text) != n->len) return fail_at(P, n, path, "contains a NUL character");
  if (n->len >= cap)
    return fail_at(P, n, path, "is %zu characters long (allowed at most %zu)", n->len, cap - 1);
  memcpy(dst, n->text, n->len + 1);
  return MOEJIT_OK;
}

static moejit_status get_enum(const tparser *P, const mj_yaml_node *n, const char *path,
                              const char *const *names, size_t count, size_t *index) {
  char allowed[96], q[96];
  join(names, count, allowed, sizeof allowed);
  if (n->kind != MJ_YAML_SCALAR || mj_yaml_is_null(n))
    return fail_at(P, n, path, "expected one of %s", allowed);
  for (size_t i = 0; i < count; i++)
    if (strlen(n->text) == n->len && !strcmp(n->text, names[i])) return *index = i, MOEJIT_OK;
  mj_quote(q, sizeof q, n->text, n->len);
  return fail_at(P, n, path, "%s is not one of the allowed values (allowed %s)", q, allowed);
}

/* A list of exactly n integers ("tile: [64, 128, 64]"). */
static moejit_status get_int_list(const tparser *P, const mj_yaml_node *n, const char *path,
                                  int *out, size_t count, const char *what) {
  if (n->kind != MJ_YAML_SEQ || n->n_items != count) {
    char got[128];
    mj_yaml_describe(n, got, sizeof got);
    if (n->kind == MJ_YAML_SEQ) snprintf(got, sizeof got, "a list of %zu", n->n_items);
    return fail_at(P, n, path, "expected a list of %zu integers %s, got %s", count, what, got);
  }
  for (size_t i = 0; i < count; i++) {
    moejit_status st = get_int32(P, n->items[i], path, &out[i]);
    if (st) return st;
  }
  return MOEJIT_OK;
}

/* vals[i] = the value of keys[i] in mapping n (NULL when absent). Refuses
 * other node kinds, non-string and repeated keys, unknown keys (with the
 * allowed list) and missing required keys. */
static moejit_status read_map(const tparser *P, const mj_yaml_node *n, const char *path,
                              const char *const *keys, const unsigned char *required, size_t nkeys,
                              const mj_yaml_node **vals) {
  char allowed[256];
  join(keys, nkeys, allowed, sizeof allowed);
  if (n->kind != MJ_YAML_MAP) {
    char got[128];
    mj_yaml_describe(n, got, sizeof got);
    return fail_at(P, n, path, "expected a mapping with the keys %s, got %s", allowed, got);
  }
  memset(vals, 0, nkeys * sizeof *vals);
  const mj_yaml_node *key_at[32] = {0};
  for (size_t i = 0; i + 1 < n->n_items; i += 2) {
    const mj_yaml_node *k = n->items[i];
    char q[96];
    if (k->kind != MJ_YAML_SCALAR || strlen(k->text) != k->len)
      return fail_at(P, k, path, "keys must be plain words (allowed %s)", allowed);
    size_t j = 0;
    while (j < nkeys && strcmp(k->text, keys[j]) != 0) j++;
    mj_quote(q, sizeof q, k->text, k->len);
    if (j == nkeys) return fail_at(P, k, path, "unknown key %s (allowed %s)", q, allowed);
    if (vals[j])
      return fail_at(P, k, path, "key %s is given twice (first at %d:%d)", q, key_at[j]->line,
                     key_at[j]->col);
    vals[j] = n->items[i + 1], key_at[j] = k;
  }
  for (size_t j = 0; j < nkeys; j++)
    if (required[j] && !vals[j])
      return fail_at(P, n, path, "missing key '%s' (required: %s)", keys[j], allowed);
  return MOEJIT_OK;
}

static moejit_status parse_entry_values(const tparser *P, const mj_yaml_node **v, const char *path,
                                        mj_tuned_entry *e) {
  char p[64];
  size_t idx;
  int pair[2] = {1, 1}, tile[3];
  moejit_status st;
#define AT(key) (snprintf(p, sizeof p, "%s.%s", path, entry_keys[key]), p)
  if ((st = get_enum(P, v[EK_KERNEL], AT(EK_KERNEL), kernel_names, 2, &idx))) return st;
  strcpy(e->kernel, kernel_names[idx]);
  if ((st = get_enum(P, v[EK_DTYPE], AT(EK_DTYPE), dtype_names, 2, &idx))) return st;
  e->dtype = dtype_values[idx];
  if ((st = get_int(P, v[EK_HIDDEN], AT(EK_HIDDEN), &e->hidden)) ||
      (st = get_int(P, v[EK_WIDTH], AT(EK_WIDTH), &e->expert_width)) ||
      (st = get_int32(P, v[EK_EXPERTS], AT(EK_EXPERTS), &e->experts)) ||
      (st = get_int32(P, v[EK_TOP_K], AT(EK_TOP_K), &e->top_k)) ||
      (st = get_int(P, v[EK_TOKENS], AT(EK_TOKENS), &e->tokens)) ||
      (st = get_int_list(P, v[EK_TILE], AT(EK_TILE), tile, 3, "[tile_m, tile_n, tile_k]")) ||
      (st = get_int32(P, v[EK_STAGES], AT(EK_STAGES), &e->cfg.stages)) ||
      (st = get_int32(P, v[EK_WARPS], AT(EK_WARPS), &e->cfg.warps)))
    return st;
  if (v[EK_CLUSTER] &&
      (st = get_int_list(P, v[EK_CLUSTER], AT(EK_CLUSTER), pair, 2, "[cluster_m, cluster_n]")))
    return st;
  e->cfg.tile_m = tile[0], e->cfg.tile_n = tile[1], e->cfg.tile_k = tile[2];
  e->cfg.cluster_m = pair[0], e->cfg.cluster_n = pair[1];
  e->cfg.raster = MOEJIT_RASTER_ALONG_M;
  if (v[EK_RASTER]) {
    if ((st = get_enum(P, v[EK_RASTER], AT(EK_RASTER), raster_names, 2, &idx))) return st;
    e->cfg.raster = (moejit_raster)idx;
  }
  e->cfg.schedule = MOEJIT_SCHEDULE_COOPERATIVE;
  if (v[EK_SCHEDULE]) {
    if ((st = get_enum(P, v[EK_SCHEDULE], AT(EK_SCHEDULE), mj_schedule_names, MJ_SCHEDULE_COUNT,
                       &idx)))
      return st;
    e->cfg.schedule = (moejit_gemm_schedule)idx;
  }
  if ((st = get_enum(P, v[EK_PATH], AT(EK_PATH), path_names, MJ_ARRAY_LEN(path_names), &idx)))
    return st;
  e->path = path_values[idx];
  if ((st = get_double(P, v[EK_US], AT(EK_US), &e->us))) return st;
  if (v[EK_HEURISTIC_US] &&
      (st = get_double(P, v[EK_HEURISTIC_US], AT(EK_HEURISTIC_US), &e->heuristic_us)))
    return st;
  if (v[EK_PINNED]) {
    if ((st = get_enum(P, v[EK_PINNED], AT(EK_PINNED), pinned_names, 2, &idx))) return st;
    e->pinned = (int)idx;
  }
#undef AT
  return MOEJIT_OK;
}

static moejit_status parse_entry(const tparser *P, const mj_yaml_node *n, size_t i,
                                 mj_tuned_entry *e) {
  char path[32], why[320], p[64];
  snprintf(path, sizeof path, "entries[%zu]", i);
  const mj_yaml_node *v[EK_COUNT];
  moejit_status st = read_map(P, n, path, entry_keys, entry_required, EK_COUNT, v);
  if (st) return st;
  memset(e, 0, sizeof *e);
  if ((st = parse_entry_values(P, v, path, e))) return st;
  int key;
  if (entry_problem(e, &key, why, sizeof why)) {
    snprintf(p, sizeof p, "%s.%s", path, entry_keys[key]);
    return fail_at(P, v[key] ? v[key] : n, p, "%s", why);
  }
  return MOEJIT_OK;
}

static moejit_status table_push(mj_tuned_table *t, const mj_tuned_entry *e) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    mj_tuned_entry *p = realloc(t->entries, cap * sizeof *p);
    if (!p) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "tuned table: out of memory");
    t->entries = p, t->cap = cap;
  }
  t->entries[t->n++] = *e;
  return MOEJIT_OK;
}

static moejit_status parse_entries(const tparser *P, const mj_yaml_node *n, mj_tuned_table *t) {
  if (n->kind != MJ_YAML_SEQ) return fail_type(P, n, "entries", "a list of entries");
  if (n->n_items > MJ_TUNED_MAX_ENTRIES)
    return fail_at(P, n->items[MJ_TUNED_MAX_ENTRIES], NULL,
                   "entries[%d]: a table holds at most %d entries", MJ_TUNED_MAX_ENTRIES,
                   MJ_TUNED_MAX_ENTRIES);
  for (size_t i = 0; i < n->n_items; i++) {
    mj_tuned_entry e;
    moejit_status st = parse_entry(P, n->items[i], i, &e);
    if (st) return st;
    for (size_t j = 0; j < t->n; j++)
      if (entry_key_cmp(&e, &t->entries[j]) == 0)
        return fail_at(P, n->items[i], NULL,
                       "entries[%zu] repeats entries[%zu] (same kernel, dtype, shape and "
                       "tokens; allowed one entry per bucket)",
                       i, j);
    if ((st = table_push(t, &e))) return st;
  }
  return MOEJIT_OK;
}

static moejit_status parse_header(const tparser *P, const mj_yaml_node **v, mj_tuned_table *t) {
  moejit_status st;
  if ((st = get_string(P, v[TK_DEVICE], "device", t->device, sizeof t->device))) return st;
  if (!t->device[0]) return fail_at(P, v[TK_DEVICE], "device", "is empty (allowed a GPU name)");
  if (v[TK_ARCH] && (st = get_string(P, v[TK_ARCH], "arch", t->arch, sizeof t->arch))) return st;
  if (v[TK_NVRTC] && (st = get_string(P, v[TK_NVRTC], "nvrtc", t->nvrtc, sizeof t->nvrtc)))
    return st;
  if (v[TK_DATE] && (st = get_string(P, v[TK_DATE], "date", t->date, sizeof t->date))) return st;
  if (v[TK_DRIVER]) {
    if ((st = get_int32(P, v[TK_DRIVER], "driver", &t->driver))) return st;
    if (t->driver < 0)
      return fail_at(P, v[TK_DRIVER], "driver", "%d is out of range (allowed 0 or more)",
                     t->driver);
  }
  return MOEJIT_OK;
}

static moejit_status parse_tree(const tparser *P, const mj_yaml_node *root, mj_tuned_table *t) {
  if (!root) return fail_at(P, NULL, NULL, "the table is empty (required: device and entries)");
  const mj_yaml_node *v[TK_COUNT];
  moejit_status st = read_map(P, root, "", top_keys, top_required, TK_COUNT, v);
  if (!st) st = parse_header(P, v, t);
  if (!st) st = parse_entries(P, v[TK_ENTRIES], t);
  if (!st && t->n) qsort(t->entries, t->n, sizeof *t->entries, entry_qsort_cmp);
  return st;
}

moejit_status mj_tuned_table_parse(const char *text, size_t len, const char *origin,
                                   mj_tuned_table *t) {
  if (!t) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_tuned_table_parse: t is NULL");
  memset(t, 0, sizeof *t);
  if (!text) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_tuned_table_parse: text is NULL");
  tparser P = {origin ? origin : "<tuned table>"};
  if (len > MJ_TUNED_MAX_BYTES)
    return mj_fail(MOEJIT_ERR_CONFIG, "%s:1:1: the table is %zu bytes (allowed at most %zu)",
                   P.origin, len, MJ_TUNED_MAX_BYTES);
  mj_yaml_node *root = NULL;
  moejit_status st = mj_yaml_parse_max(
      text, len, P.origin, (size_t)MJ_TUNED_MAX_ENTRIES * MJ_TUNED_NODES_PER_ENTRY + 64, &root);
  if (st) {
    if (strstr(moejit_last_error(), "too many YAML nodes"))
      return mj_fail_prefix(st, "tuned table (a table holds at most %d entries)",
                            MJ_TUNED_MAX_ENTRIES);
    return st;
  }
  mj_tuned_table tmp;
  memset(&tmp, 0, sizeof tmp);
  st = parse_tree(&P, root, &tmp);
  mj_yaml_free(root);
  if (st) {
    mj_tuned_table_free(&tmp);
    return st;
  }
  mj_strlcpy(tmp.origin, P.origin, sizeof tmp.origin);
  *t = tmp;
  return MOEJIT_OK;
}

moejit_status mj_tuned_table_load_file(const char *path, mj_tuned_table *t) {
  if (t) memset(t, 0, sizeof *t);
  if (!path || !t)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_tuned_table_load_file: %s is NULL",
                   path ? "t" : "path");
  char *text = NULL;
  size_t len = 0;
  moejit_status st = mj_read_file(path, &text, &len);
  if (st) return mj_fail_prefix(st, "tuned table");
  st = mj_tuned_table_parse(text, len, path, t);
  free(text);
  return st;
}

/* ---- writing ----------------------------------------------------------------- */

/* Shortest decimal form that reads back as exactly v, without an exponent
 * for ordinary timings. */
static void put_double(mj_buf *b, double v) {
  char s[64];
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(s, sizeof s, "%.*g", prec, v);
    if (strtod(s, NULL) == v) break;
  }
  if (strchr(s, 'e') && fabs(v) >= 1e-3 && fabs(v) < 1e15) {
    for (int prec = 0; prec <= 20; prec++) {
      snprintf(s, sizeof s, "%.*f", prec, v);
      if (strtod(s, NULL) == v) break;
    }
  }
  mj_buf_puts(b, s);
}

/* Length and code point of the UTF-8 sequence at p (0: not one). */
static int utf8_decode(const unsigned char *p, unsigned *cp) {
  int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
  if (!n || p[0] >= 0xf8) return 0;
  unsigned v = p[0] & (0x7fu >> n);
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    v = v << 6 | (p[i] & 0x3fu);
  }
  *cp = v;
  return n;
}

/* Characters a YAML reader would not give back as they are: C1 controls,
 * the line breaks NEL, LS and PS (folded to spaces inside a double-quoted
 * scalar), surrogates, the BOM and the non-characters U+FFFE/U+FFFF. */
static int yaml_must_escape(unsigned cp) {
  return (cp >= 0x80 && cp < 0xa0) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfeff || cp == 0xfffe || cp == 0xffff;
}

/* A double-quoted YAML string that reads back to the same bytes: '"' and
 * '\' escaped, control characters and the characters above as \xNN or
 * \uNNNN, other UTF-8 as it is. */
static void put_quoted(mj_buf *b, const char *s) {
  mj_buf_puts(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned cp = 0;
    int n = *p >= 0x80 ? utf8_decode(p, &cp) : 0;
    if (*p == '"' || *p == '\\')
      mj_buf_printf(b, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      mj_buf_printf(b, "\\x%02x", *p);
    else if (n && yaml_must_escape(cp))
      mj_buf_printf(b, "\\u%04x", cp);
    else if (n)
      mj_buf_append(b, p, (size_t)n);
    else
      mj_buf_append(b, p, 1);
    p += n ? n : 1;
  }
  mj_buf_puts(b, "\"");
}

/* An entry's shape keys as the writer puts them, "hidden: 2048, ...,
 * top_k: 8, " (the embedded tables' shape filter looks for this text). */
static void put_shape(mj_buf *b, int64_t hidden, int64_t expert_width, int experts, int top_k) {
  mj_buf_printf(b, "hidden: %lld, expert_width: %lld, experts: %d, top_k: %d, ", (long long)hidden,
                (long long)expert_width, experts, top_k);
}

static void put_entry(mj_buf *b, const mj_tuned_entry *e) {
  const moejit_gemm_cfg *g = &e->cfg;
  mj_buf_printf(b, "  - {kernel: %s, dtype: %s, ", e->kernel, moejit_dtype_name(e->dtype));
  put_shape(b, e->hidden, e->expert_width, e->experts, e->top_k);
  mj_buf_printf(b, "tokens: %lld, tile: [%d, %d, %d], stages: %d, warps: %d, ",
                (long long)e->tokens, g->tile_m, g->tile_n, g->tile_k, g->stages, g->warps);
  if (g->cluster_m != 1 || g->cluster_n != 1)
    mj_buf_printf(b, "cluster: [%d, %d], ", g->cluster_m, g->cluster_n);
  if (g->raster != MOEJIT_RASTER_ALONG_M) mj_buf_printf(b, "raster: %s, ", raster_names[g->raster]);
  if (g->schedule != MOEJIT_SCHEDULE_COOPERATIVE)
    mj_buf_printf(b, "schedule: %s, ", moejit_gemm_schedule_name(g->schedule));
  mj_buf_printf(b, "path: %s, us: ", moejit_gemm_path_name(e->path));
  put_double(b, e->us);
  mj_buf_puts(b, ", heuristic_us: ");
  put_double(b, e->heuristic_us);
  mj_buf_puts(b, e->pinned ? ", pinned: true}\n" : "}\n");
}

/* 1 if s is well-formed UTF-8: no stray or truncated bytes, no overlong
 * forms, no surrogates, nothing past U+10FFFF (what a YAML reader takes). */
static int utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned cp = 0;
    const int n = *p >= 0x80 ? utf8_decode(p, &cp) : 1;
    if (!n || (n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
    p += n;
  }
  return 1;
}

static moejit_status check_header(const mj_tuned_table *t, const char *op) {
  const struct {
    const char *name, *s;
    size_t cap;
  } strs[] = {{"device", t->device, sizeof t->device},
              {"arch", t->arch, sizeof t->arch},
              {"nvrtc", t->nvrtc, sizeof t->nvrtc},
              {"date", t->date, sizeof t->date}};
  for (size_t i = 0; i < MJ_ARRAY_LEN(strs); i++)
    if (!memchr(strs[i].s, '\0', strs[i].cap))
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is not NUL-terminated", op, strs[i].name);
    else if (!utf8_valid(strs[i].s)) /* the reader would refuse the file */
      return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is not valid UTF-8", op, strs[i].name);
  if (!t->device[0])
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: the table names no device; HINT: set device to the GPU's name "
                   "(moejit_device_info.name)",
                   op);
  if (t->driver < 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: driver = %d is negative", op, t->driver);
  if (t->n > MJ_TUNED_MAX_ENTRIES)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: %zu entries, more than a table holds (%d, the YAML loader's node limit); "
                   "HINT: keep fewer token buckets or shapes per device",
                   op, t->n, MJ_TUNED_MAX_ENTRIES);
  return MOEJIT_OK;
}

static moejit_status check_entry(const mj_tuned_entry *e, const char *op) {
  int key;
  char why[320];
  if (!entry_problem(e, &key, why, sizeof why)) return MOEJIT_OK;
  return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: entry %.15s T=%lld: %s: %s", op, e->kernel,
                 (long long)e->tokens, entry_keys[key], why);
}

static void render(const mj_tuned_table *t, const mj_tuned_entry *sorted, mj_buf *b) {
  mj_buf_puts(
      b,
      "# moejit tuned table: the fastest GEMM configuration `moejit tune` measured per\n"
      "# (kernel, dtype, shape, token count) on one device. Format: docs/tuned-tables.md\n");
  mj_buf_puts(b, "device: ");
  put_quoted(b, t->device);
  mj_buf_puts(b, "\narch: ");
  put_quoted(b, t->arch);
  mj_buf_puts(b, "\nnvrtc: ");
  put_quoted(b, t->nvrtc);
  mj_buf_printf(b, "\ndriver: %d\ndate: ", t->driver);
  put_quoted(b, t->date);
  mj_buf_puts(b, t->n ? "\nentries:\n" : "\nentries: []\n");
  for (size_t i = 0; i < t->n; i++) put_entry(b, &sorted[i]);
}

/* Sorted copy of t's entries, each checked, no two with the same key. */
static moejit_status sorted_entries(const mj_tuned_table *t, const char *op, mj_tuned_entry **out) {
  *out = NULL;
  for (size_t i = 0; i < t->n; i++) {
    moejit_status st = check_entry(&t->entries[i], op);
    if (st) return st;
  }
  mj_tuned_entry *s = malloc((t->n ? t->n : 1) * sizeof *s);
  if (!s) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  if (t->n) memcpy(s, t->entries, t->n * sizeof *s);
  qsort(s, t->n, sizeof *s, entry_qsort_cmp);
  for (size_t i = 1; i < t->n; i++)
    if (entry_key_cmp(&s[i - 1], &s[i]) == 0) {
      moejit_status st = mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                 "%s: two %s entries for T=%lld of the same dtype and shape; "
                                 "HINT: add them with mj_tuned_table_put, which replaces",
                                 op, s[i].kernel, (long long)s[i].tokens);
      free(s);
      return st;
    }
  *out = s;
  return MOEJIT_OK;
}

/* Creates the directory the table goes to when it is missing. */
/* The directory of path ("." for a bare name, "/" for one in the root). */
static moejit_status parent_of(const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  const size_t n = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
  if (n >= cap) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "path too long: '%s'", path);
  memcpy(dir, n ? path : ".", n ? n : 1);
  dir[n ? n : 1] = '\0';
  return MOEJIT_OK;
}

static moejit_status make_parent(const char *path) {
  char dir[MOEJIT_PATH_MAX];
  moejit_status st = parent_of(path, dir, sizeof dir);
  return st ? st : mj_mkdir_p(dir, 0755);
}

moejit_status mj_tuned_table_lock(const char *path, int create, int *fd) {
  *fd = -1;
  char dir[MOEJIT_PATH_MAX];
  moejit_status st = create ? make_parent(path) : MOEJIT_OK;
  if (!st) st = parent_of(path, dir, sizeof dir);
  if (st) return mj_fail_prefix(st, "tuned table %s", path);
  const int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0)
    return mj_fail(MOEJIT_ERR_IO, "tuned table %s: cannot open its directory %s: %s", path, dir,
                   strerror(errno));
  int rc;
  while ((rc = flock(d, LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    const int e = errno;
    close(d);
    if (e == ENOLCK || e == EOPNOTSUPP || e == EINVAL) return MOEJIT_OK; /* no locks there */
    return mj_fail(MOEJIT_ERR_IO, "tuned table %s: cannot lock its directory %s: %s", path, dir,
                   strerror(e));
  }
  *fd = d;
  return MOEJIT_OK;
}

void mj_tuned_table_unlock(int fd) {
  if (fd >= 0) close(fd); /* releases the flock */
}

moejit_status mj_tuned_table_write(const mj_tuned_table *t, const char *path) {
  const char *op = "mj_tuned_table_write";
  if (!t || !path)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, t ? "path" : "t");
  moejit_status st = check_header(t, op);
  mj_tuned_entry *sorted = NULL;
  if (!st) st = sorted_entries(t, op, &sorted);
  if (st) return st;
  mj_buf b = {0};
  render(t, sorted, &b);
  free(sorted);
  if (b.oom) {
    mj_buf_free(&b);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
  }
  st = make_parent(path);
  if (!st) st = mj_write_file_atomic(path, b.data, b.len);
  mj_buf_free(&b);
  return st ? mj_fail_prefix(st, "tuned table") : MOEJIT_OK;
}

moejit_status mj_tuned_table_put(mj_tuned_table *t, const mj_tuned_entry *e) {
  const char *op = "mj_tuned_table_put";
  if (!t || !e) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, t ? "e" : "t");
  moejit_status st = check_entry(e, op);
  if (st) return st;
  mj_tuned_entry copy = *e;
  memset(copy.kernel, 0, sizeof copy.kernel);
  strcpy(copy.kernel, e->kernel); /* checked: "gemm1" or "gemm2" */
  size_t at = 0;
  for (; at < t->n; at++) {
    int c = entry_key_cmp(&copy, &t->entries[at]);
    if (c == 0) return t->entries[at] = copy, MOEJIT_OK;
    if (c < 0) break;
  }
  if ((st = table_push(t, &copy))) return st;
  memmove(&t->entries[at + 1], &t->entries[at], (t->n - 1 - at) * sizeof *t->entries);
  t->entries[at] = copy;
  return MOEJIT_OK;
}

const mj_tuned_entry *mj_tuned_table_find(const mj_tuned_table *t, const mj_tuned_entry *key) {
  for (size_t i = 0; i < t->n; i++)
    if (entry_key_cmp(key, &t->entries[i]) == 0) return &t->entries[i];
  return NULL;
}

void mj_tuned_table_free(mj_tuned_table *t) {
  if (!t) return;
  free(t->entries);
  memset(t, 0, sizeof *t);
}

/* ---- the table of a device ---------------------------------------------------- */

void mj_tuned_file_name(const char *device_name, char *buf, size_t cap) {
  if (!cap) return;
  size_t o = 0;
  const char *s = device_name ? device_name : "";
  for (; *s && o + 1 < cap; s++) {
    char c = *s;
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    buf[o++] = ok ? c : '_';
  }
  buf[o] = '\0';
  if (o + 5 < cap) memcpy(buf + o, ".yaml", 6);
}

int mj_tuned_disabled(void) {
  const char *v = getenv("MOEJIT_TUNED_DISABLE");
  return v && *v && strcmp(v, "0") != 0;
}

/* A table read from `origin` counts only when it names this device (file
 * names fold characters, so two devices can share one). */
static int take_if_device(const char *device, mj_tuned_table *t, mj_buf *looked) {
  if (!strcmp(t->device, device)) return 1;
  mj_buf_printf(looked, "%s%s is the table of '%s'", looked->len ? "; " : "", t->origin, t->device);
  mj_tuned_table_free(t);
  return 0;
}

static moejit_status from_dir(const char *device, const char *file, mj_tuned_table *t,
                              mj_buf *looked, int *found) {
  const char *dir = getenv("MOEJIT_TUNED_DIR");
  *found = 0;
  if (!dir || !*dir) {
    mj_buf_puts(looked, "$MOEJIT_TUNED_DIR is not set");
    return MOEJIT_OK;
  }
  char path[MOEJIT_PATH_MAX];
  if (mj_snprintf(path, sizeof path, "%s/%s", dir, file))
    return mj_fail_prefix(MOEJIT_ERR_INVALID_ARGUMENT, "$MOEJIT_TUNED_DIR");
  struct stat sb;
  if (stat(path, &sb) != 0) {
    mj_buf_printf(looked, "no %s in $MOEJIT_TUNED_DIR=%s", file, dir);
    return MOEJIT_OK;
  }
  moejit_status st = mj_tuned_table_load_file(path, t);
  if (st) return st;
  *found = take_if_device(device, t, looked);
  return MOEJIT_OK;
}

/* 1 when e's shape keys (d, f, E, k) are `shape`'s. */
static int entry_has_shape(const mj_tuned_entry *e, const mj_tuned_shape *shape) {
  return e->hidden == shape->hidden && e->expert_width == shape->expert_width &&
         e->experts == shape->experts && e->top_k == shape->top_k;
}

/* Keeps the entries of `only`'s shape (all of them: every kernel, dtype and
 * bucket). */
static void keep_shape(mj_tuned_table *t, const mj_tuned_shape *only) {
  size_t n = 0;
  for (size_t i = 0; i < t->n; i++)
    if (entry_has_shape(&t->entries[i], only)) t->entries[n++] = t->entries[i];
  t->n = n;
}

/* The lines of an embedded table that hold `only`'s entries, under its
 * header: an embedded table is what the writer writes (a test holds every
 * shipped one to that), one entry a line with its shape keys spelled as
 * put_shape spells them, so the load parses a few lines instead of the
 * whole table. Returns 0 when out of memory. */
static int shape_lines(const mj_embedded_file *f, const mj_tuned_shape *only, mj_buf *out) {
  mj_buf want = {0};
  put_shape(&want, only->hidden, only->expert_width, only->experts, only->top_k);
  const char *p = f->text, *end = f->text + f->len;
  size_t kept = 0;
  int in_entries = 0;
  while (p < end && !want.oom) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
    if (!in_entries && n >= 8 && !memcmp(p, "entries:", 8)) {
      in_entries = 1;
    } else if (!in_entries) {
      mj_buf_append(out, p, n);
    } else if (memmem(p, n, want.data, want.len)) {
      if (!kept++) mj_buf_puts(out, "entries:\n");
      mj_buf_append(out, p, n);
    }
    p += n;
  }
  if (!kept) mj_buf_puts(out, "entries: []\n");
  const int ok = !want.oom && !out->oom;
  mj_buf_free(&want);
  return ok;
}

/* An embedded table, whole or (only) its lines of one shape. Should those
 * lines not parse, the whole table is parsed, so that an error names the
 * place in it. */
static moejit_status parse_embedded(const mj_embedded_file *f, const mj_tuned_shape *only,
                                    const char *origin, mj_tuned_table *t) {
  if (only) {
    mj_buf lines = {0};
    moejit_status st = MOEJIT_ERR_OUT_OF_MEMORY;
    if (shape_lines(f, only, &lines)) st = mj_tuned_table_parse(lines.data, lines.len, origin, t);
    mj_buf_free(&lines);
    if (!st) return MOEJIT_OK;
  }
  moejit_status st = mj_tuned_table_parse(f->text, f->len, origin, t);
  if (!st && only) keep_shape(t, only);
  return st;
}

static moejit_status for_device(const char *device_name, const mj_tuned_shape *only,
                                const mj_embedded_file *embedded, size_t n_embedded,
                                mj_tuned_table *t) {
  if (t) memset(t, 0, sizeof *t);
  if (!device_name || !*device_name || !t)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_tuned_table_for_device: %s",
                   t ? "no device name" : "t is NULL");
  if (mj_tuned_disabled())
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "tuned tables are disabled ($MOEJIT_TUNED_DISABLE=%s); HINT: unset it to use "
                   "them",
                   getenv("MOEJIT_TUNED_DISABLE"));
  char file[300];
  mj_tuned_file_name(device_name, file, sizeof file);
  mj_buf looked = {0};
  int found = 0;
  moejit_status st = from_dir(device_name, file, t, &looked, &found);
  if (!st && found && only) keep_shape(t, only);
  for (size_t i = 0; !st && !found && i < n_embedded; i++) {
    if (strcmp(embedded[i].name, file) != 0) continue;
    char origin[MOEJIT_PATH_MAX];
    snprintf(origin, sizeof origin, "embedded:%s", embedded[i].name);
    st = parse_embedded(&embedded[i], only, origin, t);
    if (!st) found = take_if_device(device_name, t, &looked);
    if (!st && !found) break;
  }
  if (!st && !found) {
    int any = 0;
    for (size_t i = 0; i < n_embedded; i++) any |= !strcmp(embedded[i].name, file);
    if (!any)
      mj_buf_printf(&looked, "; no %s among the %zu tables embedded from configs/tuned/", file,
                    n_embedded);
    st = mj_fail(MOEJIT_ERR_NOT_FOUND,
                 "no tuned table for %s (%s); HINT: `moejit tune` measures one, and "
                 "$MOEJIT_TUNED_DIR or configs/tuned/ holds it",
                 device_name, looked.data && !looked.oom ? looked.data : "?");
  }
  mj_buf_free(&looked);
  return st;
}

moejit_status mj_tuned_table_for_device_in(const char *device_name,
                                           const mj_embedded_file *embedded, size_t n_embedded,
                                           mj_tuned_table *t) {
  return for_device(device_name, NULL, embedded, n_embedded, t);
}

moejit_status mj_tuned_table_for_device(const char *device_name, mj_tuned_table *t) {
  return for_device(device_name, NULL, mj_embedded_tuned, mj_embedded_tuned_count, t);
}

void mj_tuned_shape_of(const moejit_spec *spec, mj_tuned_shape *out) {
  out->hidden = spec->hidden, out->expert_width = spec->expert_width;
  out->experts = spec->experts, out->top_k = spec->top_k;
}

moejit_status mj_tuned_table_for_shape_in(const char *device_name, const mj_tuned_shape *shape,
                                          const mj_embedded_file *embedded, size_t n_embedded,
                                          mj_tuned_table *t) {
  if (!shape) {
    if (t) memset(t, 0, sizeof *t);
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_tuned_table_for_shape: shape is NULL");
  }
  return for_device(device_name, shape, embedded, n_embedded, t);
}

moejit_status mj_tuned_table_for_shape(const char *device_name, const mj_tuned_shape *shape,
                                       mj_tuned_table *t) {
  return mj_tuned_table_for_shape_in(device_name, shape, mj_embedded_tuned, mj_embedded_tuned_count,
                                     t);
}

/* ---- lookup --------------------------------------------------------------------- */

int mj_tuned_bucket_better(int64_t a, int64_t b, int64_t tokens) {
  /* Compare max(x, t) / min(x, t) exactly: every value is clamped to
   * 1..INT32_MAX, so the cross products fit in 64 bits. */
  const int64_t lo = 1, hi = INT32_MAX;
  a = a < lo ? lo : a > hi ? hi : a;
  b = b < lo ? lo : b > hi ? hi : b;
  const int64_t t = tokens < lo ? lo : tokens > hi ? hi : tokens;
  const uint64_t ra_num = (uint64_t)(a > t ? a : t), ra_den = (uint64_t)(a > t ? t : a);
  const uint64_t rb_num = (uint64_t)(b > t ? b : t), rb_den = (uint64_t)(b > t ? t : b);
  const uint64_t lhs = ra_num * rb_den, rhs = rb_num * ra_den;
  return lhs < rhs || (lhs == rhs && a > b);
}

mj_tuned_match mj_tuned_match_of(int64_t bucket, int64_t tokens) {
  return bucket == tokens ? MJ_TUNED_EXACT : MJ_TUNED_NEAREST;
}

int mj_tuned_spec_dtypes_ok(const moejit_spec *spec) {
  const moejit_dtype dt = spec->act_dtype;
  return dt == spec->weight_dtype && (dt == MOEJIT_DTYPE_BF16 || dt == MOEJIT_DTYPE_FP16);
}

int mj_tuned_entry_shape_is(const mj_tuned_entry *e, const char *kernel, const moejit_spec *spec) {
  mj_tuned_shape shape;
  mj_tuned_shape_of(spec, &shape);
  return !strcmp(e->kernel, kernel) && e->dtype == spec->act_dtype &&
         e->dtype == spec->weight_dtype && entry_has_shape(e, &shape);
}

const char *mj_tuned_entry_blocker(const mj_tuned_entry *e, const moejit_spec *spec) {
  const int which = e->kernel[4] == '1' ? 1 : 2;
  moejit_spec s = *spec;
  *(which == 1 ? &s.gemm1 : &s.gemm2) = e->cfg;
  if (mj_spec_check(&s, NULL) != MOEJIT_OK) return "the tile does not validate for this spec";
  return mj_gemm_path_blocker(&s, which, e->path);
}

const mj_tuned_entry *mj_tuned_lookup(const mj_tuned_table *t, const char *kernel,
                                      const moejit_spec *spec, int64_t tokens,
                                      mj_tuned_match *match) {
  const mj_tuned_entry *best = NULL;
  for (size_t i = 0; t && kernel && spec && i < t->n; i++) {
    const mj_tuned_entry *e = &t->entries[i];
    if (!mj_tuned_entry_shape_is(e, kernel, spec) || mj_tuned_entry_blocker(e, spec)) continue;
    if (!mj_gemm_bucket_serves(spec, kernel[4] == '1' ? 1 : 2, e->tokens, e->path, tokens))
      continue;
    if (!best || mj_tuned_bucket_better(e->tokens, best->tokens, tokens)) best = e;
  }
  if (match) *match = best ? mj_tuned_match_of(best->tokens, tokens) : MJ_TUNED_NONE;
  return best;
}
