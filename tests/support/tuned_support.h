/* Tuned-table entries for the tests that write tables (CPU and GPU). */
#ifndef MOEJIT_TUNED_SUPPORT_H
#define MOEJIT_TUNED_SUPPORT_H

#include "tune/tuned_table.h"

/* An entry for `kernel` ("gemm1"/"gemm2") of spec s's dtype and shape at
 * bucket `tokens`, with the given tile and path; us = 10 + tokens. */
/* A cooperative, unclustered tile along M. */
moejit_gemm_cfg ts_tile(int m, int n, int k, int stages, int warps);

mj_tuned_entry ts_tuned_entry(const moejit_spec *s, const char *kernel, int64_t tokens,
                              moejit_gemm_cfg cfg, moejit_gemm_path path);

#endif
