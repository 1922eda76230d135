/* The autotuner's result rows: one per (candidate or heuristic, token
 * count), written as results.csv (also read back to resume a run) and
 * results.json. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"
#include "ops/gemm.h"
#include "tune/tune.h"

static const char *const kStatusNames[MJ_TS_COUNT] = {"pending",        "ok",       "pruned",
                                                      "compile-failed", "wrong",    "failed",
                                                      "skipped-budget", "compiled", "not-timed"};

const char *mj_tune_status_name(mj_tune_status s) {
  return (unsigned)s < MJ_TS_COUNT ? kStatusNames[s] : "?";
}

moejit_status mj_tune_rows_push(mj_tune_rows *r, const mj_tune_row *row) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 256;
    mj_tune_row *rows = realloc(r->rows, cap * sizeof *rows);
    if (!rows) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory keeping tuning results");
    r->rows = rows, r->cap = cap;
  }
  r->rows[r->n++] = *row;
  return MOEJIT_OK;
}

void mj_tune_rows_free(mj_tune_rows *r) {
  if (!r) return;
  free(r->rows);
  memset(r, 0, sizeof *r);
}

int mj_tune_row_same(const mj_tune_row *a, const mj_tune_row *b) {
  return !strcmp(a->device, b->device) && a->which == b->which && a->dtype == b->dtype &&
         a->hidden == b->hidden && a->expert_width == b->expert_width && a->experts == b->experts &&
         a->top_k == b->top_k && a->tokens == b->tokens && a->role == b->role &&
         a->path == b->path && mj_gemm_cfg_equal(&a->cfg, &b->cfg);
}

/* ---- CSV ------------------------------------------------------------------ */

#define CSV_HEADER                                                                            \
  "device,arch,shape,kernel,dtype,hidden,expert_width,experts,top_k,tokens,role,path,tile_m," \
  "tile_n,tile_k,stages,warps,raster,cluster_m,cluster_n,schedule,status,median_us,tflops,"   \
  "gbs,rel_err,iters,copy_us,date,reason"
#define CSV_FIELDS 30
/* Rows written before cluster_n had a column: one field fewer. */
#define CSV_FIELDS_NO_CLUSTER_N 29

/* Free text in a CSV field: no separators, quotes or line breaks. */
static void csv_clean(const char *s, char *out, size_t cap) {
  size_t o = 0;
  for (; *s && o + 1 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    out[o++] = c == ',' ? ';' : c == '"' ? '\'' : c < 0x20 ? ' ' : (char)c;
  }
  out[o] = '\0';
}

static void csv_row(mj_buf *b, const mj_tune_row *r) {
  char device[sizeof r->device], reason[sizeof r->reason];
  csv_clean(r->device, device, sizeof device);
  csv_clean(r->reason, reason, sizeof reason);
  mj_buf_printf(b, "%s,%s,%s,gemm%d,%s,%" PRId64 ",%" PRId64 ",%d,%d,%" PRId64 ",%s,%s,", device,
                r->arch, r->shape, r->which, moejit_dtype_name(r->dtype), r->hidden,
                r->expert_width, (int)r->experts, (int)r->top_k, r->tokens,
                r->role == MJ_ROLE_HEURISTIC ? "heuristic" : "candidate",
                moejit_gemm_path_name(r->path));
  mj_buf_printf(b, "%d,%d,%d,%d,%d,%s,%d,%d,%s,%s,%.3f,%.3f,%.2f,%.4g,%d,%.3f,%s,%s\n",
                r->cfg.tile_m, r->cfg.tile_n, r->cfg.tile_k, r->cfg.stages, r->cfg.warps,
                r->cfg.raster == MOEJIT_RASTER_ALONG_N ? "along_n" : "along_m", r->cfg.cluster_m,
                r->cfg.cluster_n, moejit_gemm_schedule_name(r->cfg.schedule),
                mj_tune_status_name(r->status), r->us, r->tflops, r->gbs,
                isfinite(r->rel_err) ? r->rel_err : 1e30, r->iters, r->copy_us, r->date, reason);
}

moejit_status mj_tune_write_csv(const mj_tune_rows *rows, const char *path) {
  mj_buf b = {0};
  mj_buf_puts(&b, CSV_HEADER "\n");
  for (size_t i = 0; i < rows->n; i++) csv_row(&b, &rows->rows[i]);
  moejit_status st = b.oom ? mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path)
                           : mj_write_file_atomic(path, b.data, b.len);
  mj_buf_free(&b);
  return st;
}

static int find_name(const char *s, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

static int parse_dtype(const char *s, moejit_dtype *out) {
  for (int d = MOEJIT_DTYPE_FP32; d <= MOEJIT_DTYPE_BF16; d++)
    if (!strcmp(s, moejit_dtype_name((moejit_dtype)d))) return *out = (moejit_dtype)d, 1;
  return 0;
}

/* A path as moejit_gemm_path_name writes it ("auto", "mma", ..., "gemv"). */
static int parse_path(const char *s, moejit_gemm_path *out) {
  for (int p = MOEJIT_GEMM_PATH_AUTO; p <= MOEJIT_GEMM_PATH_GEMV; p++)
    if (!strcmp(s, moejit_gemm_path_name(p))) return *out = (moejit_gemm_path)p, 1;
  return 0;
}

static int parse_i64(const char *s, int64_t *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end) return 0;
  *out = v;
  return 1;
}

static int parse_num(const char *s, double *out) {
  char *end;
  *out = strtod(s, &end);
  return *s && !*end;
}

/* Splits one line in place; the last field takes the rest. */
static int split(char *line, char **f) {
  int n = 0;
  f[n++] = line;
  for (char *p = line; *p && n < CSV_FIELDS; p++)
    if (*p == ',') *p = '\0', f[n++] = p + 1;
  return n;
}

static int parse_ints(char **f, int n, int64_t *out) {
  for (int i = 0; i < n; i++)
    if (!parse_i64(f[i], &out[i])) return 0;
  return 1;
}

/* Columns after the tile: raster, cluster_m, cluster_n; index of the
 * first of them. */
#define CSV_AFTER_TILE 17

/* A row of the current layout, or of the one before cluster_n had a column
 * (CSV_FIELDS_NO_CLUSTER_N fields): its candidates all ran with cluster_n 1,
 * so it reads as cluster_n 1 and resumes as that candidate. Free text holds
 * no comma (csv_clean), so the field count tells the two apart; rows of
 * older layouts (before copy_us: fewer fields) are not read. */
static int parse_row(char *line, mj_tune_row *r) {
  char *f[CSV_FIELDS];
  static const char *const roles[] = {"candidate", "heuristic"};
  static const char *const rasters[] = {"along_m", "along_n"};
  const int n = split(line, f);
  if (n != CSV_FIELDS && n != CSV_FIELDS_NO_CLUSTER_N) return 0;
  const int has_cn = n == CSV_FIELDS;
  memset(r, 0, sizeof *r);
  char **t = f + CSV_AFTER_TILE;
  char **u = t + 2 + has_cn; /* schedule, status, then the numbers */
  int64_t shape[5], tile[5], cluster, cluster_n = 1, iters;
  int role = find_name(f[10], roles, 2), raster = find_name(t[0], rasters, 2);
  int schedule = find_name(u[0], mj_schedule_names, MJ_SCHEDULE_COUNT),
      status = find_name(u[1], kStatusNames, MJ_TS_COUNT);
  if (strncmp(f[3], "gemm", 4) || (f[3][4] != '1' && f[3][4] != '2') || f[3][5] ||
      !parse_dtype(f[4], &r->dtype) || !parse_ints(f + 5, 5, shape) || role < 0 ||
      !parse_path(f[11], &r->path) || !parse_ints(f + 12, 5, tile) || raster < 0 ||
      !parse_i64(t[1], &cluster) || (has_cn && !parse_i64(t[2], &cluster_n)) || schedule < 0 ||
      status < 0 || !parse_num(u[2], &r->us) || !parse_num(u[3], &r->tflops) ||
      !parse_num(u[4], &r->gbs) || !parse_num(u[5], &r->rel_err) || !parse_i64(u[6], &iters) ||
      !parse_num(u[7], &r->copy_us))
    return 0;
  mj_strlcpy(r->device, f[0], sizeof r->device);
  mj_strlcpy(r->arch, f[1], sizeof r->arch);
  mj_strlcpy(r->shape, f[2], sizeof r->shape);
  mj_strlcpy(r->date, u[8], sizeof r->date);
  mj_strlcpy(r->reason, u[9], sizeof r->reason);
  r->which = f[3][4] - '0';
  r->hidden = shape[0], r->expert_width = shape[1];
  r->experts = (int32_t)shape[2], r->top_k = (int32_t)shape[3], r->tokens = shape[4];
  r->role = (mj_tune_role)role;
  r->cfg = (moejit_gemm_cfg){.tile_m = (int)tile[0],
                             .tile_n = (int)tile[1],
                             .tile_k = (int)tile[2],
                             .stages = (int)tile[3],
                             .warps = (int)tile[4],
                             .cluster_m = (int)cluster,
                             .cluster_n = (int)cluster_n,
                             .raster = (moejit_raster)raster,
                             .schedule = (moejit_gemm_schedule)schedule};
  r->status = (mj_tune_status)status;
  r->iters = (int)iters;
  r->cand = -1;
  /* A row no run of ours writes (edited, or damaged) is dropped, so its
   * point is timed again rather than resumed: an ok row's time must be a
   * time (finite, > 0; 0 means "not timed" in a table), its error a number,
   * and the tile's numbers must be ints of the ranges a config allows. */
  for (int i = 0; i < 5; i++)
    if (tile[i] < 1 || tile[i] > 4096) return 0;
  if (cluster < 1 || cluster > 2 || cluster_n < 1 || cluster_n > 2 || iters < 0 ||
      iters > INT32_MAX || shape[2] < 1 || shape[2] > INT32_MAX || shape[3] < 1 ||
      shape[3] > INT32_MAX)
    return 0;
  if (r->status == MJ_TS_OK && (!isfinite(r->us) || !(r->us > 0) || !isfinite(r->rel_err) ||
                                r->rel_err < 0 || !isfinite(r->copy_us) || r->copy_us < 0))
    return 0;
  return 1;
}

moejit_status mj_tune_read_csv(const char *path, mj_tune_rows *rows) {
  memset(rows, 0, sizeof *rows);
  FILE *probe = fopen(path, "rb");
  if (!probe) return MOEJIT_OK; /* nothing to resume */
  fclose(probe);
  char *text = NULL;
  size_t len = 0;
  moejit_status st = mj_read_file(path, &text, &len);
  if (st) return st;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line && !st; line = strtok_r(NULL, "\n", &save)) {
    mj_tune_row r;
    size_t l = strlen(line);
    if (l && line[l - 1] == '\r') line[l - 1] = '\0';
    if (parse_row(line, &r)) st = mj_tune_rows_push(rows, &r);
  }
  free(text);
  if (st) mj_tune_rows_free(rows);
  return st;
}

/* ---- JSON ----------------------------------------------------------------- */

static void json_str(mj_buf *b, const char *s) {
  mj_buf_puts(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      mj_buf_printf(b, "\\%c", *p);
    else if (*p < 0x20)
      mj_buf_printf(b, "\\u%04x", *p);
    else
      mj_buf_append(b, p, 1);
  }
  mj_buf_puts(b, "\"");
}

/* JSON has no NaN or infinity. */
static void json_num(mj_buf *b, double v) {
  if (isfinite(v))
    mj_buf_printf(b, "%.6g", v);
  else
    mj_buf_puts(b, "null");
}

static void json_cfg(mj_buf *b, const moejit_gemm_cfg *c) {
  mj_buf_printf(b,
                "\"tile_m\":%d,\"tile_n\":%d,\"tile_k\":%d,\"stages\":%d,\"warps\":%d,"
                "\"cluster_m\":%d,\"cluster_n\":%d,\"raster\":",
                c->tile_m, c->tile_n, c->tile_k, c->stages, c->warps, c->cluster_m, c->cluster_n);
  json_str(b, c->raster == MOEJIT_RASTER_ALONG_N ? "along_n" : "along_m");
  mj_buf_puts(b, ",\"schedule\":");
  json_str(b, moejit_gemm_schedule_name(c->schedule));
}

static void json_row(mj_buf *b, const mj_tune_row *r) {
  mj_buf_puts(b, "{\"device\":");
  json_str(b, r->device);
  mj_buf_puts(b, ",\"shape\":");
  json_str(b, r->shape);
  mj_buf_printf(b,
                ",\"kernel\":\"gemm%d\",\"dtype\":\"%s\",\"hidden\":%" PRId64
                ",\"expert_width\":%" PRId64 ",\"experts\":%d,\"top_k\":%d,\"tokens\":%" PRId64
                ",\"role\":\"%s\",\"path\":\"%s\",",
                r->which, moejit_dtype_name(r->dtype), r->hidden, r->expert_width, (int)r->experts,
                (int)r->top_k, r->tokens, r->role == MJ_ROLE_HEURISTIC ? "heuristic" : "candidate",
                moejit_gemm_path_name(r->path));
  json_cfg(b, &r->cfg);
  mj_buf_printf(b, ",\"status\":\"%s\",\"median_us\":", mj_tune_status_name(r->status));
  json_num(b, r->us);
  mj_buf_puts(b, ",\"tflops\":");
  json_num(b, r->tflops);
  mj_buf_puts(b, ",\"gbs\":");
  json_num(b, r->gbs);
  mj_buf_puts(b, ",\"copy_us\":");
  json_num(b, r->copy_us);
  mj_buf_puts(b, ",\"rel_err\":");
  json_num(b, r->rel_err);
  mj_buf_printf(b, ",\"iters\":%d,\"date\":", r->iters);
  json_str(b, r->date);
  mj_buf_puts(b, ",\"reason\":");
  json_str(b, r->reason);
  mj_buf_puts(b, "}");
}

static void json_winner(mj_buf *b, const moejit_tune_winner *w) {
  mj_buf_puts(b, "{\"kernel\":");
  json_str(b, w->kernel);
  mj_buf_puts(b, ",\"shape\":");
  json_str(b, w->shape);
  mj_buf_printf(b,
                ",\"dtype\":\"%s\",\"hidden\":%" PRId64 ",\"expert_width\":%" PRId64
                ",\"experts\":%d,\"top_k\":%d,\"tokens\":%" PRId64 ",\"path\":\"%s\",",
                moejit_dtype_name(w->dtype), w->hidden, w->expert_width, (int)w->experts,
                (int)w->top_k, w->tokens, moejit_gemm_path_name(w->path));
  json_cfg(b, &w->cfg);
  mj_buf_puts(b, ",\"median_us\":");
  json_num(b, w->us);
  mj_buf_puts(b, ",\"heuristic_us\":");
  json_num(b, w->heuristic_us);
  mj_buf_puts(b, ",\"speedup\":");
  json_num(b, w->heuristic_us > 0 && w->us > 0 ? w->heuristic_us / w->us : NAN);
  mj_buf_puts(b, ",\"tflops\":");
  json_num(b, w->tflops);
  mj_buf_printf(b, ",\"candidates_ok\":%zu}", w->candidates_ok);
}

moejit_status mj_tune_write_json(const mj_tune_rows *rows, const mj_tune_meta *m,
                                 const moejit_tune_winner *w, size_t n_w, const char *path) {
  mj_buf b = {0};
  mj_buf_puts(&b, "{\"sweep\":");
  json_str(&b, m->sweep);
  mj_buf_puts(&b, ",\"device\":");
  json_str(&b, m->device);
  mj_buf_puts(&b, ",\"arch\":");
  json_str(&b, m->arch);
  mj_buf_puts(&b, ",\"nvrtc\":");
  json_str(&b, m->nvrtc);
  mj_buf_printf(&b, ",\"driver\":%d,\"date\":", m->driver);
  json_str(&b, m->date);
  mj_buf_puts(&b, ",\n\"winners\":[");
  for (size_t i = 0; i < n_w; i++) {
    mj_buf_puts(&b, i ? ",\n" : "\n");
    json_winner(&b, &w[i]);
  }
  mj_buf_puts(&b, "],\n\"results\":[");
  for (size_t i = 0; i < rows->n; i++) {
    mj_buf_puts(&b, i ? ",\n" : "\n");
    json_row(&b, &rows->rows[i]);
  }
  mj_buf_puts(&b, "]}\n");
  moejit_status st = b.oom ? mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory writing %s", path)
                           : mj_write_file_atomic(path, b.data, b.len);
  mj_buf_free(&b);
  return st;
}
