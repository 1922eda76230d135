#include "tuned_support.h"

#include <string.h>

#include "common/common.h"

moejit_gemm_cfg ts_tile(int m, int n, int k, int stages, int warps) {
  return (moejit_gemm_cfg){
      m, n, k, stages, warps, 1, 1, MOEJIT_RASTER_ALONG_M, MOEJIT_SCHEDULE_COOPERATIVE};
}

mj_tuned_entry ts_tuned_entry(const moejit_spec *s, const char *kernel, int64_t tokens,
                              moejit_gemm_cfg cfg, moejit_gemm_path path) {
  mj_tuned_entry e;
  memset(&e, 0, sizeof e);
  mj_strlcpy(e.kernel, kernel, sizeof e.kernel);
  e.dtype = s->act_dtype;
  e.hidden = s->hidden, e.expert_width = s->expert_width;
  e.experts = s->experts, e.top_k = s->top_k;
  e.tokens = tokens;
  e.cfg = cfg;
  e.path = path;
  e.us = 10.0 + (double)tokens;
  return e;
}
