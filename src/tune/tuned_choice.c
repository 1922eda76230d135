/* moejit_tuned_choice: what a tuned table names for one GEMM at one token
 * count, found as model loading finds it (for tools and benchmarks that
 * launch the GEMMs themselves). */
#include <string.h>

#include "common/common.h"
#include "ops/gemm.h"
#include "tune/tune.h"
#include "tune/tuned_table.h"

moejit_status moejit_tuned_choice(const char *device_name, const moejit_spec *spec, int which,
                                  int64_t tokens, moejit_gemm_cfg *cfg, int *path, int *source) {
  if (!device_name || !spec || !cfg || !path)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_tuned_choice: device_name, spec, cfg and path are required");
  if ((which != 1 && which != 2) || tokens < 1)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "moejit_tuned_choice: which = %d (allowed 1 or 2), tokens = %lld (allowed >= 1)",
                   which, (long long)tokens);
  mj_tuned_table t = {0};
  moejit_status st = mj_tuned_table_for_device(device_name, &t);
  if (st) return st;
  const char *kernel = which == 1 ? "gemm1" : "gemm2";
  mj_tuned_match match = MJ_TUNED_NONE;
  const mj_tuned_entry *e = mj_tuned_lookup(&t, kernel, spec, tokens, &match);
  if (!e) {
    st = mj_fail(MOEJIT_ERR_NOT_FOUND,
                 "moejit_tuned_choice: %s has no %s entry for %s d=%lld f=%lld E=%d k=%d; HINT: "
                 "run the spec's own tiles with MOEJIT_GEMM_PATH_AUTO, or tune this shape "
                 "(moejit tune)",
                 t.origin, kernel, moejit_dtype_name(spec->act_dtype), (long long)spec->hidden,
                 (long long)spec->expert_width, (int)spec->experts, (int)spec->top_k);
    mj_tuned_table_free(&t);
    return st;
  }
  *cfg = e->cfg;
  *path = (int)e->path;
  if (source) *source = match == MJ_TUNED_EXACT ? 1 : 2; /* moejit_config_source */
  mj_tuned_table_free(&t);
  return MOEJIT_OK;
}

/* ---- pinning the heuristic -------------------------------------------------- */

static moejit_status pin_args(const char *table_path, const moejit_spec *spec, int which,
                              int64_t tokens, double us) {
  const char *op = "moejit_tuned_table_pin_heuristic";
  if (!table_path || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: table_path and spec are required", op);
  if ((which != 1 && which != 2) || tokens < 1 || !(us >= 0) || us > 1e300)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: which = %d (allowed 1 or 2), tokens = %lld (allowed >= 1), us = %g "
                   "(allowed a time >= 0)",
                   op, which, (long long)tokens, us);
  moejit_status st = moejit_spec_validate(spec);
  if (st) return mj_fail_prefix(MOEJIT_ERR_INVALID_ARGUMENT, "%s: spec", op);
  if (!mj_tuned_spec_dtypes_ok(spec))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "%s: spec '%s' runs act %s with weight %s; tuned tables hold bf16 or fp16 "
                   "for both",
                   op, spec->name, moejit_dtype_name(spec->act_dtype),
                   moejit_dtype_name(spec->weight_dtype));
  return MOEJIT_OK;
}

/* The pin, with the table's directory locked. */
static moejit_status pin_locked(const char *table_path, const moejit_spec *spec, int which,
                                int64_t tokens, double us, moejit_gemm_cfg *cfg, int *path,
                                int *changed) {
  const char *op = "moejit_tuned_table_pin_heuristic";
  moejit_status st;
  mj_tuned_table t = {0};
  if ((st = mj_tuned_table_load_file(table_path, &t))) return mj_fail_prefix(st, "%s", op);
  moejit_spec base = *spec;
  base.n_archs = 1;
  mj_strlcpy(base.archs[0], t.arch, sizeof base.archs[0]);
  mj_tuned_entry e;
  memset(&e, 0, sizeof e);
  mj_strlcpy(e.kernel, which == 1 ? "gemm1" : "gemm2", sizeof e.kernel);
  e.dtype = spec->act_dtype;
  e.hidden = spec->hidden, e.expert_width = spec->expert_width;
  e.experts = spec->experts, e.top_k = spec->top_k, e.tokens = tokens;
  e.us = e.heuristic_us = us;
  e.pinned = 1;
  if (!mj_tune_layer_heuristic_tile(&base, which, tokens, t.arch, &e.cfg, &e.path)) {
    st = mj_fail(MOEJIT_ERR_NOT_FOUND,
                 "%s: the heuristic runs %s's gemm%d at T=%lld on the SIMT kernel (%s), which a "
                 "tuned table cannot name",
                 op, spec->name, which, (long long)tokens, t.arch);
    mj_tuned_table_free(&t);
    return st;
  }
  /* what the table runs at T now: its entry for T, else its nearest bucket's */
  mj_tuned_match match = MJ_TUNED_NONE;
  const mj_tuned_entry *old = mj_tuned_table_find(&t, &e);
  if (!old) old = mj_tuned_lookup(&t, e.kernel, &base, tokens, &match);
  const int same = old && old->path == e.path && mj_gemm_cfg_equal(&old->cfg, &e.cfg);
  if (!same && !(st = mj_tuned_table_put(&t, &e)) && (st = mj_tuned_table_write(&t, table_path)))
    st = mj_fail_prefix(st, "%s", op);
  mj_tuned_table_free(&t);
  if (st) return st;
  if (cfg) *cfg = e.cfg;
  if (path) *path = (int)e.path;
  if (changed) *changed = !same;
  return MOEJIT_OK;
}

moejit_status moejit_tuned_table_pin_heuristic(const char *table_path, const moejit_spec *spec,
                                               int which, int64_t tokens, double us,
                                               moejit_gemm_cfg *cfg, int *path, int *changed) {
  const char *op = "moejit_tuned_table_pin_heuristic";
  moejit_status st = pin_args(table_path, spec, which, tokens, us);
  if (st) return st;
  int lock = -1;
  if ((st = mj_tuned_table_lock(table_path, 0, &lock))) return mj_fail_prefix(st, "%s", op);
  st = pin_locked(table_path, spec, which, tokens, us, cfg, path, changed);
  mj_tuned_table_unlock(lock);
  return st;
}
