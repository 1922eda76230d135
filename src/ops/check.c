/* Argument checks the launchers run before launching anything: a bad
 * pointer or size gets INVALID_ARGUMENT with the op and field named, and
 * nothing is enqueued. */
#include <stdint.h>

#include "common/common.h"
#include "ops/ops.h"

static const char *family_name(unsigned family) {
  return family == MJ_OPS_ROUTE ? "route" : family == MJ_OPS_ALIGN ? "align" : "combine";
}

moejit_status mj_check_call(const moejit_model *model, unsigned family, const char *op,
                            const void *args) {
  if (!model) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: model is NULL", op);
  if (!args)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: args is NULL", op));
  if (!(model->families & family))
    return mj_model_fail(model,
                         mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                 "%s: this model was loaded without its %s kernels; HINT: load "
                                 "it with moejit_model_load",
                                 op, family_name(family)));
  return MOEJIT_OK;
}

moejit_status mj_check_tokens(const moejit_model *model, const char *op, int64_t tokens) {
  const int64_t max = INT32_MAX / model->spec.top_k;
  if (tokens < 1 || tokens > max)
    return mj_model_fail(model,
                         mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                 "%s: tokens = %lld is out of range (allowed 1..%lld = "
                                 "INT32_MAX / top_k %d)",
                                 op, (long long)tokens, (long long)max, (int)model->spec.top_k));
  return MOEJIT_OK;
}

moejit_status mj_check_opt_ptr(const moejit_model *model, const char *op, const char *field,
                               const void *ptr, size_t align) {
  if (ptr && (uintptr_t)ptr % align != 0)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                                        "%s: %s = %p is not %zu-byte aligned; HINT: pass the "
                                        "start of an allocation or an offset that keeps the "
                                        "alignment (kernels load it with vectors)",
                                        op, field, ptr, align));
  return MOEJIT_OK;
}

moejit_status mj_check_ptr(const moejit_model *model, const char *op, const char *field,
                           const void *ptr, size_t align) {
  if (!ptr)
    return mj_model_fail(model, mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", op, field));
  return mj_check_opt_ptr(model, op, field, ptr, align);
}
