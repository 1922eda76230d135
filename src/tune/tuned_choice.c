/* moejit_tuned_choice: what a tuned table names for one GEMM at one token
 * count, found as model loading finds it (for tools and benchmarks that
 * launch the GEMMs themselves). */
#include <string.h>

#include "common/common.h"
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
