/* Internal face of the code generator: spec + kernel family + arch ->
 * self-contained CUDA source (prelude of constants, inlined common headers,
 * template text, each part behind a #line marker so NVRTC's messages name
 * the template file and line) and the entry points it defines. */
#ifndef MOEJIT_CODEGEN_H
#define MOEJIT_CODEGEN_H

#include "moejit/moejit.h"

#define MJ_MAX_ENTRIES 12

typedef struct mj_kernel_source {
  char family[MOEJIT_NAME_MAX]; /* "route" */
  char arch[MOEJIT_ARCH_MAX];   /* "sm_90a" */
  char template_name[64];       /* "route.cu" */
  int n_entries;
  char entries[MJ_MAX_ENTRIES][96]; /* extern "C" __global__ names */
  char *source;                     /* malloc'd, NUL-terminated */
  size_t source_len;
} mj_kernel_source;

/* Some of a template's entries, by name (not owned). */
typedef struct mj_entry_set {
  int n;
  const char *name[MJ_MAX_ENTRIES];
} mj_entry_set;

/* Adds name unless present; 0 when the set is full. */
int mj_entry_set_add(mj_entry_set *set, const char *name);

/* Families with a template, in layer order; NULL-terminated. */
extern const char *const mj_kernel_families[];
/* Families built only for expert-parallel models: {"ep", NULL}. */
extern const char *const mj_extra_families[];

/* Generates the source for one family. template_dir NULL: embedded
 * templates (after $MOEJIT_TEMPLATE_DIR). NOT_FOUND for an unknown family
 * or template (an override directory has no fallback to the embedded
 * files); CONFIG if the spec is invalid; INVALID_ARGUMENT for an arch that
 * is not explicit ("auto") or not an arch name; COMPILE if the template
 * defines no extern "C" __global__ entry. On failure *out is zeroed. */
moejit_status mj_codegen(const moejit_spec *spec, const char *family, const char *arch,
                         const char *template_dir, mj_kernel_source *out);

/* mj_codegen for only some entries (`only` NULL or empty: all). The source
 * starts with "#define MJ_ENTRY_SUBSET 1" and "#define MJ_WANT_<name> 1"
 * for each wanted entry in the template's order (so any order of `only`
 * gives the same source and cache key), and the template compiles only
 * the entries whose "#if !defined(MJ_ENTRY_SUBSET) || defined(MJ_WANT_...)"
 * guard holds; out->entries lists those. NOT_FOUND for a name the template
 * does not define as an entry. */
moejit_status mj_codegen_entries(const moejit_spec *spec, const char *family, const char *arch,
                                 const char *template_dir, const mj_entry_set *only,
                                 mj_kernel_source *out);
void mj_kernel_source_free(mj_kernel_source *ks);

/* Embedded templates (each templates/NAME.cu and templates/common/NAME.cuh),
 * named by their path under templates/, e.g. "route.cu",
 * "common/moejit_common.cuh". The table ends with a NULL row. */
#include "config/config.h"
extern const mj_embedded_file mj_embedded_templates[];
extern const size_t mj_embedded_templates_count;

#endif
