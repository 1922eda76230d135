/* Every rule a spec must satisfy, written once: moejit_spec_validate runs it
 * on a hand-built spec, the YAML loader runs it with the positions of the
 * keys so that messages read "FILE:LINE:COL: key.path: ...". */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"

/* Shared memory a CTA may opt into on H100 (227 KiB). */
#define MJ_SMEM_LIMIT 232448
/* fp32 accumulators per thread before the tile spills registers. */
#define MJ_ACC_LIMIT 128

typedef struct checker {
  const moejit_spec *s;
  const mj_spec_marks *m; /* NULL: no positions */
} checker;

#define INVOLVED(...) \
  (const mj_field[]){__VA_ARGS__}, (int)(sizeof((mj_field[]){__VA_ARGS__}) / sizeof(mj_field))

static int64_t val(const checker *c, mj_field f) {
  if (c->m && c->m->has_wide[f]) return c->m->wide[f];
  return mj_spec_get_int(c->s, f);
}

static int later(mj_mark a, mj_mark b) {
  return a.line > b.line || (a.line == b.line && a.col > b.col);
}

/* Cross-field errors point at the latest key involved; defaults point at
 * the mapping that would hold the key, else the top level. */
static mj_mark locate(const mj_spec_marks *m, const mj_field *inv, int n) {
  mj_mark best = {0, 0};
  for (int i = 0; i < n; i++)
    if (m->field[inv[i]].line && later(m->field[inv[i]], best)) best = m->field[inv[i]];
  for (int i = 0; i < n && !best.line; i++) best = m->section[inv[i]];
  if (!best.line) best = m->root;
  if (!best.line) best = (mj_mark){1, 1};
  return best;
}

static const char *path_of(const checker *c, mj_field f) {
  if (f == MJ_F_ARCH0 && c->m && !c->m->arch_is_list) return "target.arch";
  return mj_field_path(f);
}

__attribute__((format(printf, 5, 6))) static moejit_status fail(const checker *c, const char *path,
                                                                const mj_field *inv, int n,
                                                                const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!c->m) return mj_fail(MOEJIT_ERR_CONFIG, "%s: %s", path, msg);
  mj_mark at = locate(c->m, inv, n);
  return mj_fail(MOEJIT_ERR_CONFIG, "%s:%d:%d: %s: %s", c->m->origin, at.line, at.col, path, msg);
}

static moejit_status fail_range(const checker *c, mj_field f) {
  return fail(c, path_of(c, f), INVOLVED(f), "%lld is out of range (allowed %s)",
              (long long)val(c, f), mj_field_allowed(f));
}

static moejit_status check_range(const checker *c, mj_field f, int64_t lo, int64_t hi,
                                 int64_t multiple) {
  int64_t v = val(c, f);
  if (v < lo || v > hi) return fail_range(c, f);
  if (multiple > 1 && v % multiple != 0)
    return fail(c, path_of(c, f), INVOLVED(f), "%lld is not a multiple of %lld (allowed %s)",
                (long long)v, (long long)multiple, mj_field_allowed(f));
  return MOEJIT_OK;
}

static moejit_status check_one_of(const checker *c, mj_field f, const int *set, int n) {
  int64_t v = val(c, f);
  for (int i = 0; i < n; i++)
    if (v == set[i]) return MOEJIT_OK;
  return fail(c, path_of(c, f), INVOLVED(f), "%lld is not supported (allowed %s)", (long long)v,
              mj_field_allowed(f));
}

void mj_quote(char *buf, size_t cap, const char *s, size_t len) {
  size_t o = 0, shown = len > 60 ? 57 : len;
  if (cap < 8) {
    if (cap) buf[0] = '\0';
    return;
  }
  buf[o++] = '\'';
  for (size_t i = 0; i < shown && o + 6 < cap; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\')
      buf[o++] = (char)ch;
    else
      o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
  }
  if (shown < len && o + 5 < cap) memcpy(buf + o, "...", 3), o += 3;
  buf[o++] = '\'';
  buf[o] = '\0';
}

/* ---- the rules, in the order of the YAML schema --------------------------- */

static moejit_status check_name(const checker *c) {
  const char *name = c->s->name;
  const char *end = memchr(name, '\0', sizeof c->s->name);
  size_t len = end ? (size_t)(end - name) : sizeof c->s->name;
  char q[128];
  mj_quote(q, sizeof q, name, len);
  if (!end)
    return fail(c, "name", INVOLVED(MJ_F_NAME),
                "is not NUL-terminated within %d bytes (allowed %s)", MOEJIT_NAME_MAX,
                mj_field_allowed(MJ_F_NAME));
  if (len == 0)
    return fail(c, "name", INVOLVED(MJ_F_NAME), "is empty (allowed %s)",
                mj_field_allowed(MJ_F_NAME));
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)name[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    if (!ok)
      return fail(c, "name", INVOLVED(MJ_F_NAME),
                  "%s has a character outside [A-Za-z0-9._-] at position %zu (allowed %s)", q,
                  i + 1, mj_field_allowed(MJ_F_NAME));
  }
  return MOEJIT_OK;
}

static moejit_status check_shape(const checker *c) {
  moejit_status st;
  if ((st = check_range(c, MJ_F_HIDDEN, 8, 1048576, 8))) return st;
  if ((st = check_range(c, MJ_F_EXPERT_WIDTH, 8, 1048576, 8))) return st;
  if ((st = check_range(c, MJ_F_EXPERTS, 1, 1024, 1))) return st;
  /* one expert's W1 (2f x d) is indexed with int32 offsets in the kernels */
  const int64_t d = val(c, MJ_F_HIDDEN), f = val(c, MJ_F_EXPERT_WIDTH);
  if (2 * d * f >= ((int64_t)1 << 31))
    return fail(c, "model.expert_width", INVOLVED(MJ_F_HIDDEN, MJ_F_EXPERT_WIDTH),
                "hidden %lld x expert_width %lld: one expert's W1 holds 2 x %lld x %lld = %lld "
                "elements, more than the kernels' 32-bit offsets reach (allowed hidden * "
                "expert_width < 2^30 = 1073741824)",
                (long long)d, (long long)f, (long long)f, (long long)d, (long long)(2 * d * f));
  int64_t k = val(c, MJ_F_TOP_K), e = val(c, MJ_F_EXPERTS), hi = e < 32 ? e : 32;
  if (k < 1 || k > 32)
    return fail(c, "model.top_k", INVOLVED(MJ_F_TOP_K),
                "%lld is out of range (allowed 1..min(experts, 32) = 1..%lld)", (long long)k,
                (long long)hi);
  if (k > hi)
    return fail(c, "model.top_k", INVOLVED(MJ_F_TOP_K, MJ_F_EXPERTS),
                "%lld is out of range (allowed 1..min(experts, 32) = 1..%lld)", (long long)k,
                (long long)hi);
  return MOEJIT_OK;
}

static moejit_status check_scaling(const checker *c) {
  double v = c->m && c->m->has_scaling_wide ? c->m->scaling_wide : c->s->routing.scaling_factor;
  if (!isfinite(v) || v <= 0.0 || v > 1000.0)
    return fail(c, "model.routing.scaling_factor", INVOLVED(MJ_F_SCALING),
                "%.17g is out of range (allowed %s)", v, mj_field_allowed(MJ_F_SCALING));
  /* the spec keeps a float: a tiny positive number written in YAML would
   * become 0 there (found by fuzz_config) */
  if ((float)v <= 0.0f)
    return fail(c, "model.routing.scaling_factor", INVOLVED(MJ_F_SCALING),
                "%g is too small: it is 0 as a float (allowed %s)", v,
                mj_field_allowed(MJ_F_SCALING));
  return MOEJIT_OK;
}

/* Softmax routing has no groups: a group setting there is a mistake. */
static moejit_status check_softmax_groups(const checker *c) {
  if (val(c, MJ_F_N_GROUP) != 1)
    return fail(c, "model.routing.n_group", INVOLVED(MJ_F_N_GROUP, MJ_F_RULE),
                "%lld is only used by rule sigmoid_grouped_topk; the rule is softmax_topk (allowed "
                "1, or leave it out)",
                (long long)val(c, MJ_F_N_GROUP));
  if (val(c, MJ_F_TOPK_GROUP) != 1)
    return fail(c, "model.routing.topk_group", INVOLVED(MJ_F_TOPK_GROUP, MJ_F_RULE),
                "%lld is only used by rule sigmoid_grouped_topk; the rule is softmax_topk (allowed "
                "1, or leave it out)",
                (long long)val(c, MJ_F_TOPK_GROUP));
  return MOEJIT_OK;
}

static moejit_status check_groups(const checker *c) {
  int64_t e = val(c, MJ_F_EXPERTS), g = val(c, MJ_F_N_GROUP), tg = val(c, MJ_F_TOPK_GROUP);
  int64_t k = val(c, MJ_F_TOP_K);
  if (g < 1 || g > e) return fail_range(c, MJ_F_N_GROUP);
  if (e % g != 0)
    return fail(c, "model.routing.n_group", INVOLVED(MJ_F_N_GROUP, MJ_F_EXPERTS),
                "%lld does not divide experts = %lld (allowed %s)", (long long)g, (long long)e,
                mj_field_allowed(MJ_F_N_GROUP));
  if (e / g < 2)
    return fail(c, "model.routing.n_group", INVOLVED(MJ_F_N_GROUP, MJ_F_EXPERTS),
                "%lld leaves %lld expert per group, but a group is ranked by its two best scores "
                "(allowed %s)",
                (long long)g, (long long)(e / g), mj_field_allowed(MJ_F_N_GROUP));
  if (tg < 1 || tg > g)
    return fail(c, "model.routing.topk_group", INVOLVED(MJ_F_TOPK_GROUP, MJ_F_N_GROUP),
                "%lld is out of range (allowed 1..n_group = 1..%lld)", (long long)tg, (long long)g);
  if (k > tg * (e / g))
    return fail(
        c, "model.top_k", INVOLVED(MJ_F_TOP_K, MJ_F_TOPK_GROUP, MJ_F_N_GROUP, MJ_F_EXPERTS),
        "%lld is more than the experts in the kept groups, topk_group * experts / n_group = "
        "%lld * %lld / %lld = %lld (allowed top_k <= topk_group * (experts / n_group)); "
        "HINT: raise topk_group or lower top_k",
        (long long)k, (long long)tg, (long long)e, (long long)g, (long long)(tg * (e / g)));
  return MOEJIT_OK;
}

static moejit_status check_routing(const checker *c) {
  int64_t rule = val(c, MJ_F_RULE);
  if (rule != MOEJIT_ROUTE_SOFTMAX_TOPK && rule != MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK)
    return fail(c, "model.routing.rule", INVOLVED(MJ_F_RULE),
                "value %lld is not a rule (allowed %s)", (long long)rule,
                mj_field_allowed(MJ_F_RULE));
  int64_t renorm = val(c, MJ_F_RENORMALIZE);
  if (renorm != 0 && renorm != 1)
    return fail(c, "model.routing.renormalize", INVOLVED(MJ_F_RENORMALIZE),
                "%lld is not 0 or 1 (allowed %s)", (long long)renorm,
                mj_field_allowed(MJ_F_RENORMALIZE));
  moejit_status st = check_scaling(c);
  if (st) return st;
  return rule == MOEJIT_ROUTE_SOFTMAX_TOPK ? check_softmax_groups(c) : check_groups(c);
}

static moejit_status check_dtypes(const checker *c) {
  static const int dtypes[] = {MOEJIT_DTYPE_FP32, MOEJIT_DTYPE_FP16, MOEJIT_DTYPE_BF16};
  for (mj_field f = MJ_F_ACT; f <= MJ_F_OUTPUT; f++) {
    moejit_status st = check_one_of(c, f, dtypes, 3);
    if (st) return st;
  }
  return MOEJIT_OK;
}

/* Arch numbers with a product behind them; 'a' variants from sm_90 on. */
static int arch_known(const char *arch) {
  static const int known[] = {80, 86, 87, 89, 90, 100, 103, 110, 120, 121};
  if (strcmp(arch, "auto") == 0) return 1;
  int a, cc = mj_arch_parse(arch, &a);
  for (size_t i = 0; i < MJ_ARRAY_LEN(known); i++)
    if (cc == known[i]) return !a || cc >= 90;
  return 0;
}

int mj_arch_supported(const char *arch) {
  return arch && strcmp(arch, "auto") != 0 && strlen(arch) < MOEJIT_ARCH_MAX && arch_known(arch);
}

static moejit_status check_arch(const checker *c, int i) {
  const char *arch = c->s->archs[i];
  mj_field f = (mj_field)(MJ_F_ARCH0 + i);
  const char *end = memchr(arch, '\0', MOEJIT_ARCH_MAX);
  char q[128];
  mj_quote(q, sizeof q, arch, end ? (size_t)(end - arch) : MOEJIT_ARCH_MAX);
  if (!end || !arch_known(arch))
    return fail(c, path_of(c, f), INVOLVED(f), "%s is not a supported arch (allowed %s)", q,
                mj_arch_allowed());
  for (int j = 0; j < i; j++)
    if (strcmp(c->s->archs[j], arch) == 0)
      return fail(c, path_of(c, f), INVOLVED(f),
                  "%s is listed twice (first as target.arch[%d]; allowed each arch once)", q, j);
  return MOEJIT_OK;
}

static moejit_status check_archs(const checker *c) {
  int n = c->s->n_archs;
  if (n < 1 || n > MOEJIT_MAX_ARCHS)
    return fail(c, "target.arch", INVOLVED(MJ_F_ARCH0), "%d archs given (allowed 1 to %d of %s)", n,
                MOEJIT_MAX_ARCHS, mj_arch_allowed());
  for (int i = 0; i < n; i++) {
    moejit_status st = check_arch(c, i);
    if (st) return st;
  }
  return MOEJIT_OK;
}

static moejit_status check_simple_kernels(const checker *c) {
  for (mj_field f = MJ_F_ROUTE_THREADS; f <= MJ_F_COMBINE_THREADS; f++) {
    moejit_status st = check_range(c, f, 32, 1024, 32);
    if (st) return st;
  }
  return MOEJIT_OK;
}

static moejit_status check_gemm_fields(const checker *c, mj_field b) {
  static const int tile_m[] = {16, 32, 64, 128, 256}, tile_n[] = {32, 64, 128, 256};
  static const int tile_k[] = {32, 64, 128}, warps[] = {4, 8, 12};
  moejit_status st;
  if ((st = check_one_of(c, b + MJ_GEMM_TILE_M, tile_m, 5))) return st;
  if ((st = check_one_of(c, b + MJ_GEMM_TILE_N, tile_n, 4))) return st;
  if ((st = check_one_of(c, b + MJ_GEMM_TILE_K, tile_k, 3))) return st;
  if ((st = check_range(c, b + MJ_GEMM_STAGES, 2, 8, 1))) return st;
  if ((st = check_one_of(c, b + MJ_GEMM_WARPS, warps, 3))) return st;
  if ((st = check_range(c, b + MJ_GEMM_CLUSTER_M, 1, 2, 1))) return st;
  if ((st = check_range(c, b + MJ_GEMM_CLUSTER_N, 1, 2, 1))) return st;
  int64_t raster = val(c, b + MJ_GEMM_RASTER);
  if (raster != MOEJIT_RASTER_ALONG_M && raster != MOEJIT_RASTER_ALONG_N)
    return fail(c, path_of(c, b + MJ_GEMM_RASTER), INVOLVED(b + MJ_GEMM_RASTER),
                "value %lld is not a raster order (allowed %s)", (long long)raster,
                mj_field_allowed(b + MJ_GEMM_RASTER));
  int64_t schedule = val(c, b + MJ_GEMM_SCHEDULE);
  if (!mj_schedule_valid(schedule))
    return fail(c, path_of(c, b + MJ_GEMM_SCHEDULE), INVOLVED(b + MJ_GEMM_SCHEDULE),
                "value %lld is not a schedule (allowed %s)", (long long)schedule,
                mj_field_allowed(b + MJ_GEMM_SCHEDULE));
  return MOEJIT_OK;
}

/* Thread-block clusters exist from sm_90 on; a cluster is a CTA pair along
 * M or along N, and a pair along N needs an even number of n-tiles (both
 * CTAs of a pair take one M-tile and two consecutive n-tiles). */
static moejit_status check_clusters(const checker *c, mj_field b, const char *gemm) {
  const int64_t cm = val(c, b + MJ_GEMM_CLUSTER_M), cn = val(c, b + MJ_GEMM_CLUSTER_N);
  if (cm == 1 && cn == 1) return MOEJIT_OK;
  if (cm == 2 && cn == 2)
    return fail(c, gemm, INVOLVED(b + MJ_GEMM_CLUSTER_M, b + MJ_GEMM_CLUSTER_N),
                "a 2x2 thread-block cluster is not supported (allowed: cluster_m = 2 with "
                "cluster_n = 1, pairs sharing weight tiles, or cluster_m = 1 with cluster_n = 2, "
                "pairs sharing activation tiles); HINT: set one of them to 1");
  if (cn == 2) {
    const int g1 = b == MJ_F_GEMM1, which = g1 ? 1 : 2;
    const mj_field out_field = g1 ? MJ_F_EXPERT_WIDTH : MJ_F_HIDDEN;
    const int64_t out = val(c, out_field);
    const int64_t tn = val(c, b + MJ_GEMM_TILE_N), cols = mj_gemm_out_cols(which, tn);
    const int64_t n_tiles = mj_gemm_n_tiles(which, out, tn);
    if (n_tiles % 2 != 0)
      return fail(c, gemm, INVOLVED(b + MJ_GEMM_CLUSTER_N, b + MJ_GEMM_TILE_N, out_field),
                  "cluster_n = 2 pairs CTAs on consecutive n-tiles, but %s = %lld makes %lld "
                  "n-tiles of %lld output columns (tile_n %lld%s), an odd number; HINT: choose a "
                  "tile_n that gives an even count, or set cluster_n to 1",
                  g1 ? "model.expert_width" : "model.hidden", (long long)out, (long long)n_tiles,
                  (long long)cols, (long long)tn, g1 ? " / 2: gate and up" : "");
  }
  for (int i = 0; i < c->s->n_archs; i++) {
    int cc = mj_arch_parse(c->s->archs[i], NULL);
    if (cc && cc < 90)
      return fail(
          c, gemm,
          INVOLVED(b + MJ_GEMM_CLUSTER_M, b + MJ_GEMM_CLUSTER_N, (mj_field)(MJ_F_ARCH0 + i)),
          "a %lldx%lld thread-block cluster needs sm_90 or newer, but the targets include %s "
          "(allowed cluster_m = cluster_n = 1 there)",
          (long long)val(c, b + MJ_GEMM_CLUSTER_M), (long long)val(c, b + MJ_GEMM_CLUSTER_N),
          c->s->archs[i]);
  }
  return MOEJIT_OK;
}

static moejit_status check_gemm_budget(const checker *c, mj_field b, const char *gemm) {
  moejit_gemm_cfg g = {.tile_m = (int)val(c, b + MJ_GEMM_TILE_M),
                       .tile_n = (int)val(c, b + MJ_GEMM_TILE_N),
                       .tile_k = (int)val(c, b + MJ_GEMM_TILE_K),
                       .stages = (int)val(c, b + MJ_GEMM_STAGES),
                       .warps = (int)val(c, b + MJ_GEMM_WARPS)};
  int threads = g.warps * 32;
  int acc = (g.tile_m * g.tile_n + threads - 1) / threads;
  if (acc > MJ_ACC_LIMIT)
    return fail(c, gemm, INVOLVED(b + MJ_GEMM_TILE_M, b + MJ_GEMM_TILE_N, b + MJ_GEMM_WARPS),
                "a %dx%d tile with %d warps needs %d fp32 accumulators per thread, more than %d "
                "(allowed tile_m * tile_n / (warps * 32) <= %d); HINT: use more warps (up to 12) "
                "or a smaller tile_m or tile_n",
                g.tile_m, g.tile_n, g.warps, acc, MJ_ACC_LIMIT, MJ_ACC_LIMIT);
  moejit_dtype wt = (moejit_dtype)val(c, MJ_F_WEIGHT);
  size_t elem = moejit_dtype_size(wt), smem = mj_gemm_smem_bytes(&g, elem);
  if (smem > MJ_SMEM_LIMIT) {
    size_t per_stage = smem / (size_t)g.stages, fit = MJ_SMEM_LIMIT / per_stage;
    char hint[128];
    if (fit >= 2)
      snprintf(hint, sizeof hint, "use fewer stages (at most %zu fit) or a smaller tile", fit);
    else
      snprintf(hint, sizeof hint,
               "use a smaller tile_m, tile_n or tile_k (even 2 stages do not fit)");
    return fail(
        c, gemm,
        INVOLVED(b + MJ_GEMM_STAGES, b + MJ_GEMM_TILE_M, b + MJ_GEMM_TILE_N, b + MJ_GEMM_TILE_K,
                 MJ_F_WEIGHT),
        "needs %zu bytes of shared memory = stages %d * (tile_m %d + tile_n %d) * tile_k %d * "
        "%zu bytes (%s weights), more than the limit of %d bytes (227 KiB, the H100 opt-in "
        "maximum); HINT: %s",
        smem, g.stages, g.tile_m, g.tile_n, g.tile_k, elem, moejit_dtype_name(wt), MJ_SMEM_LIMIT,
        hint);
  }
  return MOEJIT_OK;
}

static moejit_status check_gemm(const checker *c, mj_field b, const char *gemm) {
  moejit_status st = check_gemm_fields(c, b);
  if (!st) st = check_gemm_budget(c, b, gemm);
  if (!st) st = check_clusters(c, b, gemm);
  return st;
}

static moejit_status check_cache(const checker *c) {
  if (!memchr(c->s->cache_dir, '\0', sizeof c->s->cache_dir))
    return fail(c, "cache.dir", INVOLVED(MJ_F_CACHE_DIR),
                "is not NUL-terminated within %d bytes (allowed %s)", MOEJIT_PATH_MAX,
                mj_field_allowed(MJ_F_CACHE_DIR));
  return MOEJIT_OK;
}

moejit_status mj_spec_check(const moejit_spec *spec, const mj_spec_marks *marks) {
  checker c = {spec, marks};
  moejit_status st;
  if ((st = check_name(&c))) return st;
  if ((st = check_shape(&c))) return st;
  if ((st = check_routing(&c))) return st;
  if ((st = check_dtypes(&c))) return st;
  if ((st = check_archs(&c))) return st;
  if ((st = check_simple_kernels(&c))) return st;
  if ((st = check_gemm(&c, MJ_F_GEMM1, "kernels.gemm1"))) return st;
  if ((st = check_gemm(&c, MJ_F_GEMM2, "kernels.gemm2"))) return st;
  return check_cache(&c);
}
