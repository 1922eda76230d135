/* Tuned GEMM variants of a model: which entries of the device's tuned table
 * a load takes (and what its report says about them), and which variant a
 * forward runs for its T. Pure host logic, testable without a GPU. */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "dist/ep.h"
#include "ops/ops.h"

/* Copies b's text into dst, ending in "..." when it does not fit. */
static void set_text(char *dst, size_t cap, const mj_buf *b) {
  const char *s = b->data && !b->oom ? b->data : "(out of memory)";
  if (mj_strlcpy(dst, s, cap) || cap < 4) return;
  memcpy(dst + cap - 4, "...", 4);
}

void mj_gemm_variant_spec(const moejit_spec *spec, int which, const mj_gemm_variant *v,
                          moejit_spec *out) {
  *out = *spec;
  *(which == 1 ? &out->gemm1 : &out->gemm2) = v->cfg;
}

/* Why variant v cannot be planned on arch at its bucket's rows, or NULL.
 * The message of the failed plan goes to why. */
static const char *plan_blocker(const moejit_spec *spec, int which, const mj_gemm_variant *v,
                                const char *arch, char *why, size_t cap) {
  moejit_spec s;
  mj_gemm_plan plan;
  mj_gemm_variant_spec(spec, which, v, &s);
  if (mj_gemm_plan_make_for(&s, which, v->path, v->tokens * spec->top_k, arch, &plan) == MOEJIT_OK)
    return NULL;
  /* the plan's own words, without "moejit_gemm1_swiglu: " and the hint */
  const char *msg = moejit_last_error(), *colon = strstr(msg, ": ");
  mj_strlcpy(why, colon ? colon + 2 : msg, cap);
  char *hint = strstr(why, "; HINT");
  if (hint) *hint = '\0';
  return why;
}

static void insert_sorted(mj_gemm_variants *out, const mj_gemm_variant *v) {
  int at = out->n;
  while (at > 0 && out->v[at - 1].tokens > v->tokens) {
    out->v[at] = out->v[at - 1];
    at--;
  }
  out->v[at] = *v;
  out->n++;
}

/* What a load keeps of table t for GEMM `which`; *matched counts entries
 * of the shape, dropped notes those that cannot run here. */
static void take_entries(const mj_tuned_table *t, const moejit_spec *spec, int which,
                         const char *arch, mj_gemm_variants *out, int *matched, mj_buf *dropped) {
  const char *kernel = which == 1 ? "gemm1" : "gemm2";
  char why[192];
  int ignored = 0;
  for (size_t i = 0; i < t->n; i++) {
    const mj_tuned_entry *e = &t->entries[i];
    if (!mj_tuned_entry_shape_is(e, kernel, spec)) continue;
    ++*matched;
    const mj_gemm_variant v = {.tokens = e->tokens,
                               .cfg = e->cfg,
                               .path = e->path,
                               .us = e->us,
                               .heuristic_us = e->heuristic_us};
    const char *blocker = mj_tuned_entry_blocker(e, spec);
    if (!blocker) blocker = plan_blocker(spec, which, &v, arch, why, sizeof why);
    if (blocker) {
      mj_buf_printf(dropped, "; skipped T=%lld (%s)", (long long)e->tokens, blocker);
    } else if (out->n == MJ_GEMM_MAX_VARIANTS) {
      ignored++;
    } else {
      insert_sorted(out, &v);
    }
  }
  if (ignored)
    mj_buf_printf(dropped, "; %d more buckets ignored (a model keeps %d)", ignored,
                  MJ_GEMM_MAX_VARIANTS);
}

static void shape_text(const moejit_spec *s, char *buf, size_t cap) {
  snprintf(buf, cap, "%s d=%lld f=%lld E=%d k=%d", moejit_dtype_name(s->act_dtype),
           (long long)s->hidden, (long long)s->expert_width, s->experts, s->top_k);
}

static void describe_tuned(const mj_tuned_table *t, const mj_gemm_variants *v,
                           const mj_buf *dropped, moejit_load_kernel *row) {
  mj_buf b = {0};
  char cfg[64];
  mj_buf_printf(&b, "%s:", t->origin);
  for (int i = 0; i < v->n; i++) {
    /* the GEMV kernel ignores the tile (it only names the module): the path says it all */
    cfg[0] = '\0';
    if (v->v[i].path != MOEJIT_GEMM_PATH_GEMV) moejit_gemm_cfg_text(&v->v[i].cfg, cfg, sizeof cfg);
    mj_buf_printf(&b, "%s T=%lld %s%s%s", i ? "," : "", (long long)v->v[i].tokens, cfg,
                  cfg[0] ? " " : "", moejit_gemm_path_name(v->v[i].path));
  }
  if (dropped->len) mj_buf_puts(&b, dropped->data);
  mj_strlcpy(row->config_source, "tuned", sizeof row->config_source);
  set_text(row->config_detail, sizeof row->config_detail, &b);
  mj_buf_free(&b);
  if (v->n == 1)
    snprintf(row->config, sizeof row->config, "1 bucket, T=%lld", (long long)v->v[0].tokens);
  else
    snprintf(row->config, sizeof row->config, "%d buckets, T=%lld..%lld", v->n,
             (long long)v->v[0].tokens, (long long)v->v[v->n - 1].tokens);
}

void mj_gemm_variants_collect(const mj_tuned_table *t, const char *no_table,
                              const moejit_spec *spec, int which, const char *arch,
                              mj_gemm_variants *out, moejit_load_kernel *row) {
  const char *kernel = which == 1 ? "gemm1" : "gemm2";
  char shape[160];
  memset(out, 0, sizeof *out);
  moejit_gemm_cfg_text(which == 1 ? &spec->gemm1 : &spec->gemm2, row->config, sizeof row->config);
  mj_strlcpy(row->config_source, "heuristic", sizeof row->config_source);
  if (!t) {
    mj_strlcpy(row->config_detail, no_table ? no_table : "no tuned table",
               sizeof row->config_detail);
    return;
  }
  int matched = 0;
  mj_buf dropped = {0};
  take_entries(t, spec, which, arch, out, &matched, &dropped);
  if (out->n) {
    describe_tuned(t, out, &dropped, row);
  } else {
    mj_buf b = {0};
    shape_text(spec, shape, sizeof shape);
    if (!matched)
      mj_buf_printf(&b, "%s has no %s entry for %s", t->origin, kernel, shape);
    else
      mj_buf_printf(&b, "%s: none of its %d %s entries for %s runs here%s", t->origin, matched,
                    kernel, shape, dropped.data ? dropped.data : "");
    set_text(row->config_detail, sizeof row->config_detail, &b);
    mj_buf_free(&b);
  }
  mj_buf_free(&dropped);
}

/* The variant whose bucket serves `tokens` best, or -1. */
static int nearest_variant(const moejit_spec *spec, int which, const mj_gemm_variants *v,
                           int64_t tokens) {
  int best = -1;
  for (int i = 0; v && i < v->n; i++) {
    if (!mj_gemm_bucket_serves(spec, which, v->v[i].tokens, v->v[i].path, tokens)) continue;
    if (best < 0 || mj_tuned_bucket_better(v->v[i].tokens, v->v[best].tokens, tokens)) best = i;
  }
  return best;
}

/* Within the decode layer's reach the GEMV kernel, where it runs: an
 * expert holds at most T <= 8 rows (one pass over its weights), and the
 * layer then runs its two-launch decode form; AUTO elsewhere (which is the
 * GEMV kernel too up to MOEJIT_GEMV_MAX_ROWS rows). */
moejit_gemm_path mj_layer_heuristic_path(const moejit_spec *spec, int which, int64_t tokens) {
  return mj_decode_reach(spec, tokens) && mj_gemm_gemv_enabled() &&
                 !mj_gemm_gemv_blocker(spec, which)
             ? MOEJIT_GEMM_PATH_GEMV
             : MOEJIT_GEMM_PATH_AUTO;
}

moejit_status mj_gemm_choose(const moejit_spec *spec, const mj_gemm_variants *v, int which,
                             int64_t tokens, const char *arch, mj_gemm_choice *c) {
  const int64_t rows = tokens * spec->top_k;
  c->variant = nearest_variant(spec, which, v, tokens);
  c->match = MJ_TUNED_NONE;
  c->fell_back = 0;
  c->why[0] = '\0';
  if (c->variant >= 0) {
    const mj_gemm_variant *var = &v->v[c->variant];
    mj_gemm_variant_spec(spec, which, var, &c->scratch);
    c->spec = &c->scratch;
    c->path = var->path;
    if (mj_gemm_plan_make_for(c->spec, which, c->path, rows, arch, &c->plan) == MOEJIT_OK) {
      c->match = mj_tuned_match_of(var->tokens, tokens);
      return MOEJIT_OK;
    }
    /* e.g. a 16-row tile whose grid outgrows int32 at this T */
    c->fell_back = 1;
    snprintf(c->why, sizeof c->why, "tuned bucket T=%lld: %s", (long long)var->tokens,
             moejit_last_error());
    c->variant = -1;
  }
  c->spec = spec;
  c->path = mj_layer_heuristic_path(spec, which, tokens);
  return mj_gemm_plan_make_for(spec, which, c->path, rows, arch, &c->plan);
}

/* ---- moejit_model_gemm_choice ---------------------------------------------- */

/* The load report's row of a family ("gemm1"), or NULL. */
static const moejit_load_kernel *report_row(const moejit_model *m, const char *kernel) {
  for (int i = 0; i < m->report.n_kernels; i++)
    if (!strcmp(m->report.kernels[i].kernel, kernel)) return &m->report.kernels[i];
  return NULL;
}

static void describe_choice(const moejit_model *m, int which, int64_t tokens,
                            const mj_gemm_choice *c, mj_buf *b) {
  char cfg[64];
  moejit_spec scratch;
  const moejit_spec *kspec = mj_gemm_kernel_spec(c->spec, which, &c->plan, &scratch);
  moejit_gemm_cfg_text(which == 1 ? &kspec->gemm1 : &kspec->gemm2, cfg, sizeof cfg);
  const moejit_load_kernel *row = report_row(m, which == 1 ? "gemm1" : "gemm2");
  if (c->variant >= 0) {
    const mj_gemm_variant *v = &m->gemm_variants[which - 1].v[c->variant];
    if (c->match == MJ_TUNED_EXACT)
      mj_buf_printf(b, "tuned, exact bucket T=%lld", (long long)v->tokens);
    else
      mj_buf_printf(b, "tuned, nearest bucket T=%lld for T=%lld", (long long)v->tokens,
                    (long long)tokens);
  } else {
    mj_buf_puts(b, "heuristic");
  }
  mj_buf_printf(b, ": %s, path %s, entry %s", cfg, moejit_gemm_path_name(c->path), c->plan.entry);
  if (c->fell_back)
    mj_buf_printf(b, " (%s)", c->why);
  else if (row)
    mj_buf_printf(b, " (%s)", row->config_detail);
}

moejit_status moejit_model_gemm_choice(const moejit_model *model, const char *kernel,
                                       int64_t tokens, char *desc, size_t cap,
                                       moejit_config_source *source) {
  static const char *op = "moejit_model_gemm_choice";
  const int which = kernel && !strcmp(kernel, "gemm1")   ? 1
                    : kernel && !strcmp(kernel, "gemm2") ? 2
                                                         : 0;
  if (!model || !kernel)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, model ? "kernel" : "model");
  if (model->ep) model = model->ep->local; /* its GEMMs run on the local layer */
  if (!which)
    return mj_model_fail(
        model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                       "%s: kernel '%.64s' is not a GEMM (allowed gemm1, gemm2)", op, kernel));
  if (!(model->families & (which == 1 ? MJ_OPS_GEMM1 : MJ_OPS_GEMM2)))
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                        "%s: this model was loaded without its %s kernel; HINT: "
                                        "load it with moejit_model_load_config or _spec",
                                        op, kernel));
  moejit_status st = mj_check_tokens(model, op, tokens);
  if (st) return st;
  mj_gemm_choice c;
  st = mj_gemm_choose(&model->spec, &model->gemm_variants[which - 1], which, tokens,
                      mj_ctx_arch(model->ctx), &c);
  if (st) return mj_model_fail(model, mj_fail_prefix(st, "%s", op));
  /* what the forward would refuse (a tile the GPU cannot hold) */
  if ((st = mj_gemm_choice_fits(&c, which, tokens, mj_ctx_smem_optin(model->ctx), op)))
    return mj_model_fail(model, st);
  if (source)
    *source = c.match == MJ_TUNED_EXACT     ? MOEJIT_CONFIG_TUNED_EXACT
              : c.match == MJ_TUNED_NEAREST ? MOEJIT_CONFIG_TUNED_NEAREST
                                            : MOEJIT_CONFIG_HEURISTIC;
  if (desc && cap) {
    mj_buf b = {0};
    describe_choice(model, which, tokens, &c, &b);
    set_text(desc, cap, &b);
    mj_buf_free(&b);
  }
  return MOEJIT_OK;
}

moejit_status mj_gemm_choice_fits(const mj_gemm_choice *c, int which, int64_t tokens,
                                  int smem_optin, const char *op) {
  if (smem_optin <= 0 || c->plan.smem_bytes <= (unsigned)smem_optin) return MOEJIT_OK;
  return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                 "%s: at T = %lld, GEMM %d's kernel '%s' (a %dx%d tile) needs %u bytes of shared "
                 "memory a block, and this GPU allows %d; HINT: give kernels.gemm%d fewer stages "
                 "or a smaller tile for this GPU, or tune one (moejit tune)",
                 op, (long long)tokens, which, c->plan.entry, c->plan.tile_m, c->plan.tile_n,
                 c->plan.smem_bytes, smem_optin, which);
}
