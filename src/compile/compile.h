/* Internal face of the NVRTC wrapper: compile one generated source to PTX
 * and cubin, thread-safe; find the CUDA include directory. */
#ifndef MOEJIT_COMPILE_H
#define MOEJIT_COMPILE_H

#include "codegen/codegen.h"

typedef struct mj_compile_opts {
  const char *arch; /* "sm_90a" */
  int fast_math;
  int lineinfo;
} mj_compile_opts;

/* The canonical option list as one string, part of the cache key; it never
 * contains absolute paths (the include dir is left out on purpose). */
void mj_compile_opts_string(const mj_compile_opts *o, char *buf, size_t cap);

/* Compiles ks->source. On success *ptx and *cubin are malloc'd. On failure
 * returns MOEJIT_ERR_COMPILE with NVRTC's log in the message (lines refer to
 * the template through #line markers). */
moejit_status mj_nvrtc_compile(const mj_kernel_source *ks, const mj_compile_opts *o, char **ptx,
                               size_t *ptx_len, void **cubin, size_t *cubin_len);

/* The CUDA include dir for NVRTC: $CUDA_HOME/include, $CUDA_PATH/include,
 * then the build-time directories. NULL if none holds cuda_bf16.h. */
const char *mj_cuda_include_dir(void);

#endif
