/* The spec as plain data: defaults, dtype names, the field table (paths,
 * allowed values, int access) shared by the checker and the YAML loader. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"

const char *moejit_dtype_name(moejit_dtype dtype) {
  switch (dtype) {
    case MOEJIT_DTYPE_FP32:
      return "fp32";
    case MOEJIT_DTYPE_FP16:
      return "fp16";
    case MOEJIT_DTYPE_BF16:
      return "bf16";
  }
  return "?";
}

const char *const mj_schedule_names[MJ_SCHEDULE_COUNT] = {
    [MOEJIT_SCHEDULE_COOPERATIVE] = "cooperative", [MOEJIT_SCHEDULE_PINGPONG] = "pingpong"};

const char *moejit_gemm_schedule_name(moejit_gemm_schedule schedule) {
  return mj_schedule_valid((int64_t)schedule) ? mj_schedule_names[schedule] : "?";
}

void moejit_gemm_cfg_text(const moejit_gemm_cfg *c, char *buf, size_t cap) {
  if (!buf || !cap) return;
  if (!c) {
    buf[0] = '\0';
    return;
  }
  const char *sched =
      c->schedule == MOEJIT_SCHEDULE_COOPERATIVE ? "" : moejit_gemm_schedule_name(c->schedule);
  snprintf(buf, cap, "%dx%dx%d s%d w%d%s%s%s%s%s", c->tile_m, c->tile_n, c->tile_k, c->stages,
           c->warps, c->raster == MOEJIT_RASTER_ALONG_N ? " along_n" : "",
           c->cluster_m == 2 ? " c2" : "", c->cluster_n == 2 ? " cn2" : "", *sched ? " " : "",
           sched);
}

size_t moejit_dtype_size(moejit_dtype dtype) {
  switch (dtype) {
    case MOEJIT_DTYPE_FP32:
      return 4;
    case MOEJIT_DTYPE_FP16:
    case MOEJIT_DTYPE_BF16:
      return 2;
  }
  return 0;
}

/* Both GEMMs' tile where a config names none (and no tuned table entry
 * applies): 128x256x64, 4 stages. For GEMM 2 it ran 1.16x / 1.01x / 1.07x /
 * 1.09x faster than 128x128x64 at T = 32 / 256 / 2048 / 16384 (geometric
 * means over eleven model shapes on an H100; docs/tune.md "The built-in
 * tile"). */
static moejit_gemm_cfg gemm_default(void) {
  moejit_gemm_cfg g = {.tile_m = 128,
                       .tile_n = 256,
                       .tile_k = 64,
                       .stages = 4,
                       .warps = 8,
                       .cluster_m = 1,
                       .cluster_n = 1,
                       .raster = MOEJIT_RASTER_ALONG_M,
                       .schedule = MOEJIT_SCHEDULE_COOPERATIVE};
  return g;
}

void moejit_spec_init(moejit_spec *spec) {
  if (!spec) return;
  memset(spec, 0, sizeof *spec);
  /* A hand-built spec validates without naming it; YAML configs must. */
  mj_strlcpy(spec->name, "custom", sizeof spec->name);
  spec->routing.rule = MOEJIT_ROUTE_SOFTMAX_TOPK;
  spec->routing.renormalize = 1;
  spec->routing.n_group = 1;
  spec->routing.topk_group = 1;
  spec->routing.scaling_factor = 1.0f;
  spec->act_dtype = MOEJIT_DTYPE_BF16;
  spec->weight_dtype = MOEJIT_DTYPE_BF16;
  spec->logits_dtype = MOEJIT_DTYPE_FP32;
  spec->out_dtype = MOEJIT_DTYPE_BF16;
  spec->n_archs = 1;
  mj_strlcpy(spec->archs[0], "sm_90a", sizeof spec->archs[0]);
  spec->route.block_threads = 256;
  spec->align.block_threads = 1024;
  spec->combine.block_threads = 256;
  spec->gemm1 = gemm_default();
  spec->gemm2 = gemm_default();
}

moejit_status moejit_spec_validate(const moejit_spec *spec) {
  if (!spec) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_spec_validate: spec is NULL");
  return mj_spec_check(spec, NULL);
}

moejit_status moejit_spec_validate_arch(const moejit_spec *spec, const char *arch) {
  if (!spec || !arch)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_spec_validate_arch: %s is NULL",
                   !spec ? "spec" : "arch");
  moejit_spec s = *spec;
  if (strlen(arch) >= sizeof s.archs[0])
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "arch '%.40s...' is too long", arch);
  if (!strcmp(arch, "auto")) /* a config's word for "the GPU's own": no arch to build for */
    return mj_fail(MOEJIT_ERR_CONFIG,
                   "arch 'auto' names no arch here; HINT: name the GPU's, e.g. sm_90a for an H100");
  s.n_archs = 1;
  snprintf(s.archs[0], sizeof s.archs[0], "%s", arch);
  return mj_spec_check(&s, NULL);
}

void mj_spec_summary(const moejit_spec *spec, char *buf, size_t cap) {
  if (!buf || cap == 0) return;
  if (!spec) {
    buf[0] = '\0';
    return;
  }
  const char *rule = spec->routing.rule == MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK ? "sigmoid-grouped"
                     : spec->routing.rule == MOEJIT_ROUTE_SOFTMAX_TOPK       ? "softmax"
                                                                             : "?";
  snprintf(buf, cap, "%.*s d=%lld f=%lld E=%d k=%d %s %s", MOEJIT_NAME_MAX - 1, spec->name,
           (long long)spec->hidden, (long long)spec->expert_width, (int)spec->experts,
           (int)spec->top_k, rule, moejit_dtype_name(spec->act_dtype));
}

int mj_arch_parse(const char *arch, int *has_a_suffix) {
  if (has_a_suffix) *has_a_suffix = 0;
  if (!arch || strncmp(arch, "sm_", 3) != 0) return 0;
  const char *p = arch + 3;
  int value = 0, digits = 0;
  if (*p == '0') return 0; /* no leading zeros: "sm_090" is not a name */
  while (isdigit((unsigned char)*p) && digits < 3) value = value * 10 + (*p++ - '0'), digits++;
  if (digits < 2) return 0;
  int a = 0;
  if (*p == 'a') a = 1, p++;
  if (*p != '\0') return 0;
  if (has_a_suffix) *has_a_suffix = a;
  return value;
}

int mj_arch_smem_optin(const char *arch) {
  switch (mj_arch_parse(arch, NULL)) {
    case 80:
    case 87:
      return 163 * 1024;
    case 86:
    case 89:
    case 120:
    case 121:
      return 99 * 1024;
    case 90:
    case 100:
    case 103:
    case 110:
      return 227 * 1024;
    default:
      return 0;
  }
}

size_t mj_gemm_smem_bytes(const moejit_gemm_cfg *g, size_t elem_bytes) {
  if (!g || g->stages <= 0 || g->tile_m <= 0 || g->tile_n <= 0 || g->tile_k <= 0) return 0;
  return (size_t)g->stages * ((size_t)g->tile_m + (size_t)g->tile_n) * (size_t)g->tile_k *
         elem_bytes;
}

/* ---- the field table ---------------------------------------------------- */

typedef struct field_info {
  const char *path;
  const char *allowed;
} field_info;

#define GEMM_FIELDS(n)                                                                      \
  {"kernels.gemm" n ".tile_m", "16, 32, 64, 128 or 256"},                                   \
      {"kernels.gemm" n ".tile_n", "32, 64, 128 or 256"},                                   \
      {"kernels.gemm" n ".tile_k", "32, 64 or 128"}, {"kernels.gemm" n ".stages", "2..8"},  \
      {"kernels.gemm" n ".warps", "4, 8 or 12"}, {"kernels.gemm" n ".cluster_m", "1 or 2"}, \
      {"kernels.gemm" n ".cluster_n", "1 or 2"},                                            \
      {"kernels.gemm" n ".raster", "along_m or along_n"}, {                                 \
    "kernels.gemm" n ".schedule", MJ_SCHEDULE_ALLOWED                                       \
  }

static const field_info fields[MJ_F_COUNT] = {
    [MJ_F_NAME] = {"name", "1 to 63 characters of A-Z a-z 0-9 . _ -"},
    [MJ_F_HIDDEN] = {"model.hidden", "8..1048576, a multiple of 8"},
    [MJ_F_EXPERT_WIDTH] = {"model.expert_width", "8..1048576, a multiple of 8"},
    [MJ_F_EXPERTS] = {"model.experts", "1..1024"},
    [MJ_F_TOP_K] = {"model.top_k", "1..min(experts, 32)"},
    [MJ_F_RULE] = {"model.routing.rule", "softmax_topk or sigmoid_grouped_topk"},
    [MJ_F_RENORMALIZE] = {"model.routing.renormalize", "true/false, yes/no, on/off"},
    [MJ_F_N_GROUP] = {"model.routing.n_group",
                      "a divisor of experts with experts / n_group >= 2; 1 for softmax_topk"},
    [MJ_F_TOPK_GROUP] = {"model.routing.topk_group", "1..n_group"},
    [MJ_F_SCALING] = {"model.routing.scaling_factor", "a finite number > 0 and <= 1000"},
    [MJ_F_ACT] = {"dtypes.activation", "bf16, fp16 or fp32"},
    [MJ_F_WEIGHT] = {"dtypes.weight", "bf16, fp16 or fp32"},
    [MJ_F_LOGITS] = {"dtypes.logits", "bf16, fp16 or fp32"},
    [MJ_F_OUTPUT] = {"dtypes.output", "bf16, fp16 or fp32"},
    [MJ_F_ARCH0] = {"target.arch[0]", NULL},
    [MJ_F_ARCH1] = {"target.arch[1]", NULL},
    [MJ_F_ARCH2] = {"target.arch[2]", NULL},
    [MJ_F_ARCH3] = {"target.arch[3]", NULL},
    [MJ_F_ROUTE_THREADS] = {"kernels.route.block_threads", "32..1024, a multiple of 32"},
    [MJ_F_ALIGN_THREADS] = {"kernels.align.block_threads", "32..1024, a multiple of 32"},
    [MJ_F_COMBINE_THREADS] = {"kernels.combine.block_threads", "32..1024, a multiple of 32"},
    GEMM_FIELDS("1"),
    GEMM_FIELDS("2"),
    [MJ_F_CACHE_DIR] = {"cache.dir", "a directory path ('~' and relative paths allowed)"},
    [MJ_F_CACHE_MAX] = {"cache.max_size", "bytes, with an optional K, M, G or T suffix"},
};

const char *mj_arch_allowed(void) {
  return "sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, sm_100, sm_100a, sm_103, sm_103a, "
         "sm_110, sm_110a, sm_120, sm_120a, sm_121, sm_121a, or auto";
}

const char *mj_field_path(mj_field f) {
  return (unsigned)f < MJ_F_COUNT && fields[f].path ? fields[f].path : "?";
}

const char *mj_field_allowed(mj_field f) {
  if (f >= MJ_F_ARCH0 && f <= MJ_F_ARCH3) return mj_arch_allowed();
  return (unsigned)f < MJ_F_COUNT && fields[f].allowed ? fields[f].allowed : "?";
}

/* The int of GEMM field `i` (MJ_GEMM_*), or NULL. */
static int *gemm_slot(moejit_gemm_cfg *g, int i) {
  switch (i) {
    case MJ_GEMM_TILE_M:
      return &g->tile_m;
    case MJ_GEMM_TILE_N:
      return &g->tile_n;
    case MJ_GEMM_TILE_K:
      return &g->tile_k;
    case MJ_GEMM_STAGES:
      return &g->stages;
    case MJ_GEMM_WARPS:
      return &g->warps;
    case MJ_GEMM_CLUSTER_M:
      return &g->cluster_m;
    case MJ_GEMM_CLUSTER_N:
      return &g->cluster_n;
  }
  return NULL;
}

static moejit_gemm_cfg *gemm_of(moejit_spec *s, mj_field f, int *i) {
  if (f >= MJ_F_GEMM1 && f < MJ_F_GEMM1 + MJ_GEMM_NFIELDS) return *i = f - MJ_F_GEMM1, &s->gemm1;
  if (f >= MJ_F_GEMM2 && f < MJ_F_GEMM2 + MJ_GEMM_NFIELDS) return *i = f - MJ_F_GEMM2, &s->gemm2;
  return NULL;
}

static int64_t gemm_get(const moejit_gemm_cfg *g, int i) {
  switch (i) {
    case MJ_GEMM_TILE_M:
      return g->tile_m;
    case MJ_GEMM_TILE_N:
      return g->tile_n;
    case MJ_GEMM_TILE_K:
      return g->tile_k;
    case MJ_GEMM_STAGES:
      return g->stages;
    case MJ_GEMM_WARPS:
      return g->warps;
    case MJ_GEMM_CLUSTER_M:
      return g->cluster_m;
    case MJ_GEMM_CLUSTER_N:
      return g->cluster_n;
    case MJ_GEMM_SCHEDULE:
      return (int64_t)g->schedule;
    default:
      return (int64_t)g->raster;
  }
}

int64_t mj_spec_get_int(const moejit_spec *s, mj_field f) {
  if (f >= MJ_F_GEMM1 && f < MJ_F_GEMM1 + MJ_GEMM_NFIELDS) return gemm_get(&s->gemm1, f - MJ_F_GEMM1);
  if (f >= MJ_F_GEMM2 && f < MJ_F_GEMM2 + MJ_GEMM_NFIELDS) return gemm_get(&s->gemm2, f - MJ_F_GEMM2);
  switch (f) {
    case MJ_F_HIDDEN:
      return s->hidden;
    case MJ_F_EXPERT_WIDTH:
      return s->expert_width;
    case MJ_F_EXPERTS:
      return s->experts;
    case MJ_F_TOP_K:
      return s->top_k;
    case MJ_F_RULE:
      return (int64_t)s->routing.rule;
    case MJ_F_RENORMALIZE:
      return s->routing.renormalize;
    case MJ_F_N_GROUP:
      return s->routing.n_group;
    case MJ_F_TOPK_GROUP:
      return s->routing.topk_group;
    case MJ_F_ACT:
      return (int64_t)s->act_dtype;
    case MJ_F_WEIGHT:
      return (int64_t)s->weight_dtype;
    case MJ_F_LOGITS:
      return (int64_t)s->logits_dtype;
    case MJ_F_OUTPUT:
      return (int64_t)s->out_dtype;
    case MJ_F_ROUTE_THREADS:
      return s->route.block_threads;
    case MJ_F_ALIGN_THREADS:
      return s->align.block_threads;
    case MJ_F_COMBINE_THREADS:
      return s->combine.block_threads;
    case MJ_F_CACHE_MAX:
      return (int64_t)s->cache_max_bytes;
    default:
      return 0;
  }
}

void mj_spec_set_int(moejit_spec *s, mj_field f, int64_t v) {
  int i;
  moejit_gemm_cfg *g = gemm_of(s, f, &i);
  if (g) {
    if (i == MJ_GEMM_RASTER)
      g->raster = (moejit_raster)v;
    else if (i == MJ_GEMM_SCHEDULE)
      g->schedule = (moejit_gemm_schedule)v;
    else
      *gemm_slot(g, i) = (int)v;
    return;
  }
  switch (f) {
    case MJ_F_HIDDEN:
      s->hidden = v;
      break;
    case MJ_F_EXPERT_WIDTH:
      s->expert_width = v;
      break;
    case MJ_F_EXPERTS:
      s->experts = (int32_t)v;
      break;
    case MJ_F_TOP_K:
      s->top_k = (int32_t)v;
      break;
    case MJ_F_RULE:
      s->routing.rule = (moejit_route_rule)v;
      break;
    case MJ_F_RENORMALIZE:
      s->routing.renormalize = (int)v;
      break;
    case MJ_F_N_GROUP:
      s->routing.n_group = (int)v;
      break;
    case MJ_F_TOPK_GROUP:
      s->routing.topk_group = (int)v;
      break;
    case MJ_F_ACT:
      s->act_dtype = (moejit_dtype)v;
      break;
    case MJ_F_WEIGHT:
      s->weight_dtype = (moejit_dtype)v;
      break;
    case MJ_F_LOGITS:
      s->logits_dtype = (moejit_dtype)v;
      break;
    case MJ_F_OUTPUT:
      s->out_dtype = (moejit_dtype)v;
      break;
    case MJ_F_ROUTE_THREADS:
      s->route.block_threads = (int)v;
      break;
    case MJ_F_ALIGN_THREADS:
      s->align.block_threads = (int)v;
      break;
    case MJ_F_COMBINE_THREADS:
      s->combine.block_threads = (int)v;
      break;
    case MJ_F_CACHE_MAX:
      s->cache_max_bytes = (uint64_t)v;
      break;
    default:
      break;
  }
}

/* Bytes that do not carry meaning (after a string's NUL, struct padding)
 * are zeroed so that equal specs filled in different ways still meet. */
static void zero_tail(char *s, size_t cap) {
  size_t n = strnlen(s, cap);
  if (n < cap) memset(s + n, 0, cap - n);
}

void mj_spec_canonical(const moejit_spec *in, moejit_spec *out) {
  memcpy(out, in, sizeof *out);
  zero_tail(out->name, sizeof out->name);
  for (int i = 0; i < MOEJIT_MAX_ARCHS; i++) zero_tail(out->archs[i], sizeof out->archs[i]);
  zero_tail(out->cache_dir, sizeof out->cache_dir);
  size_t gap_start = offsetof(moejit_spec, cache_dir) + sizeof out->cache_dir;
  memset((char *)out + gap_start, 0, offsetof(moejit_spec, cache_max_bytes) - gap_start);
}
