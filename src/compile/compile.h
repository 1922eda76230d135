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
/* 16 hex digits of XXH3-64 over the CUDA headers every generated source
 * includes (cuda_fp16.h/.hpp, cuda_bf16.h/.hpp in mj_cuda_include_dir),
 * computed once per process; "none" where no directory holds them. Part of
 * every cache key: a cubin built against other headers is another cubin. */
const char *mj_cuda_headers_digest(void);
/* The NVRTC library this process runs: the hex of its GNU build ID (which
 * tells patch releases apart; nvrtcVersion gives major.minor only), else
 * its file's size and mtime ("123.456"), "linked" where NVRTC is linked
 * into the program itself, "unknown" where it cannot be found. Found once
 * per process; part of every cache key. */
const char *mj_nvrtc_build_id(void);
/* Every directory passed to NVRTC as -I (the one above plus companions such
 * as include/cccl or the build's second directory). Returns the count
 * written to dirs (at most cap); 0 when none was found. */
int mj_cuda_include_dirs(const char **dirs, int cap);

/* For the runtime: the cubin of one kernel family for `arch` (an explicit
 * arch, not "auto"), from the compiler's memory map, the disk cache or
 * NVRTC, in that order. *cubin is owned by the compiler and stays valid
 * until moejit_compiler_destroy. key (33 bytes) and cache_hit (1: not
 * compiled now) may be NULL. Thread-safe. */
moejit_status mj_compiler_get_cubin(moejit_compiler *c, const moejit_spec *spec, const char *family,
                                    const char *arch, const void **cubin, size_t *len, char key[33],
                                    int *cache_hit);
/* The same for a module of only some entries (mj_codegen_entries; `only`
 * NULL or empty: all): its own source, key and cache entry. */
moejit_status mj_compiler_get_cubin_entries(moejit_compiler *c, const moejit_spec *spec,
                                            const char *family, const char *arch,
                                            const mj_entry_set *only, const void **cubin,
                                            size_t *len, char key[33], int *cache_hit);

/* How many sources the compiler has generated (each request not answered
 * by its memo of earlier requests generates one; for tests). */
long mj_compiler_generated(const moejit_compiler *c);
/* 1 where the compiler answers repeated requests from its memo (embedded
 * templates: no template directory in its options or $MOEJIT_TEMPLATE_DIR). */
int mj_compiler_memoizes(const moejit_compiler *c);

/* mj_codegen with the compiler's template directory (out->entries lists the
 * kernel's entry points). Release with mj_kernel_source_free. */
moejit_status mj_compiler_generate(moejit_compiler *c, const moejit_spec *spec, const char *family,
                                   const char *arch, mj_kernel_source *out);

#endif
