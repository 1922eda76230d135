/* The code generator: spec + kernel family + arch -> one self-contained CUDA
 * source (prelude of compile-time constants, the template with its common
 * headers inlined), with #line markers so NVRTC names template files/lines. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/codegen.h"
#include "common/common.h"
#include "config/config.h"

/* Nested includes deeper than this are a template bug (each file is inlined
 * once, so cycles cannot recurse; this only bounds pathological chains). */
#define MJ_INCLUDE_DEPTH_MAX 8
/* Distinct template files one generated source may pull in. */
#define MJ_INLINED_MAX 64

/* In the order a layer runs them: route -> align/permute -> gemm1 (gate+up,
 * SwiGLU) -> gemm2 (down) -> combine. */
const char *const mj_kernel_families[] = {"route", "align", "gemm1", "gemm2", "combine", NULL};

const char *const *moejit_kernel_families(void) {
  return mj_kernel_families;
}

/* Families outside the single-GPU layer: "ep", the kernels around the
 * all-to-all of an expert-parallel layer (src/dist/). */
const char *const mj_extra_families[] = {"ep", NULL};

static int family_index(const char *family) {
  int n = 0;
  for (; mj_kernel_families[n]; n++)
    if (strcmp(mj_kernel_families[n], family) == 0) return n;
  for (int i = 0; mj_extra_families[i]; i++)
    if (strcmp(mj_extra_families[i], family) == 0) return n + i;
  return -1;
}

static void known_families(char *buf, size_t cap) {
  buf[0] = '\0';
  size_t used = 0;
  for (int i = 0; mj_kernel_families[i] && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", mj_kernel_families[i]);
  for (int i = 0; mj_extra_families[i] && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, ", %s", mj_extra_families[i]);
}

/* ------------------------------------------------------------------------ */
/* Template lookup: an override directory (no fallback) or the embedded table */

typedef struct tpl_text {
  const char *text; /* embedded: static; dir: == owned */
  size_t len;
  char *owned;
} tpl_text;

/* Names come from templates themselves (#include lines): keep them inside
 * the template root. */
static int tpl_name_safe(const char *name) {
  return name[0] && name[0] != '/' && !strstr(name, "..");
}

static const mj_embedded_file *embedded_find(const char *name) {
  for (const mj_embedded_file *f = mj_embedded_templates; f->name; f++)
    if (strcmp(f->name, name) == 0) return f;
  return NULL;
}

static int dir_file_exists(const char *dir, const char *name) {
  char path[MOEJIT_PATH_MAX + 128];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int tpl_exists(const char *dir, const char *name) {
  if (!tpl_name_safe(name)) return 0;
  return dir ? dir_file_exists(dir, name) : embedded_find(name) != NULL;
}

static moejit_status tpl_load_dir(const char *dir, const char *name, tpl_text *t) {
  char path[MOEJIT_PATH_MAX + 128];
  struct stat st;
  if (mj_snprintf(path, sizeof path, "%s/%s", dir, name)) return MOEJIT_ERR_INVALID_ARGUMENT;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "template directory '%s' does not exist; HINT: point MOEJIT_TEMPLATE_DIR "
                   "(or the template_dir option) at a directory laid out like templates/, or "
                   "unset it to use the embedded templates",
                   dir);
  if (stat(path, &st) != 0 && errno == ENOENT)
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "template '%s' not found: '%s' does not exist; HINT: an override template "
                   "directory must hold every file the kernel uses (there is no fallback to the "
                   "embedded templates)",
                   name, path);
  moejit_status s = mj_read_file(path, &t->owned, &t->len);
  if (s) return s;
  t->text = t->owned;
  return MOEJIT_OK;
}

static moejit_status tpl_load(const char *dir, const char *name, tpl_text *t) {
  memset(t, 0, sizeof *t);
  if (!tpl_name_safe(name))
    return mj_fail(MOEJIT_ERR_NOT_FOUND, "template name '%s' leaves the template directory", name);
  if (dir) return tpl_load_dir(dir, name, t);
  const mj_embedded_file *f = embedded_find(name);
  if (!f)
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "no embedded template '%s' (%zu templates embedded); HINT: this library was "
                   "built without templates/%s; set MOEJIT_TEMPLATE_DIR to a template directory",
                   name, mj_embedded_templates_count, name);
  t->text = f->text;
  t->len = f->len;
  return MOEJIT_OK;
}

/* ------------------------------------------------------------------------ */
/* Prelude: the compile-time constants templates are written against       */

static const char *dtype_ctype(moejit_dtype d) {
  switch (d) {
    case MOEJIT_DTYPE_FP32:
      return "float";
    case MOEJIT_DTYPE_FP16:
      return "__half";
    case MOEJIT_DTYPE_BF16:
      return "__nv_bfloat16";
  }
  return NULL;
}

/* The GEMM tile config a family is built with, or NULL for the memory-bound
 * families. */
static const moejit_gemm_cfg *family_gemm(const moejit_spec *s, const char *family) {
  if (strcmp(family, "gemm1") == 0) return &s->gemm1;
  if (strcmp(family, "gemm2") == 0) return &s->gemm2;
  return NULL;
}

/* A GEMM family's block is its warps; the others have their own setting. */
static int family_block_threads(const moejit_spec *s, const char *family) {
  const moejit_gemm_cfg *g = family_gemm(s, family);
  if (g) return g->warps * 32;
  if (strcmp(family, "route") == 0) return s->route.block_threads;
  if (strcmp(family, "align") == 0) return s->align.block_threads;
  return s->combine.block_threads;
}

/* "%.9g" round-trips a float; the result must stay a float literal ("1" ->
 * "1.0f") and must not depend on the caller's locale ("2,5" -> "2.5"). */
static moejit_status float_literal(float v, char *buf, size_t cap) {
  if (!isfinite(v))
    return mj_fail(MOEJIT_ERR_CONFIG, "routing.scaling_factor must be finite (got %g)", (double)v);
  char tmp[48], *o = buf;
  snprintf(tmp, sizeof tmp, "%.9g", (double)v);
  int has_point = 0, in_sep = 0;
  for (const char *p = tmp; *p && (size_t)(o - buf) + 4 < cap; p++) {
    if (isdigit((unsigned char)*p) || *p == '-' || *p == '+' || *p == 'e') {
      *o++ = *p;
      in_sep = 0;
      has_point |= *p == 'e';
    } else if (!in_sep) { /* the locale's decimal separator, whatever its bytes */
      *o++ = '.';
      in_sep = has_point = 1;
    }
  }
  if (!has_point) *o++ = '.', *o++ = '0';
  *o++ = 'f';
  *o = '\0';
  return MOEJIT_OK;
}

/* The spec summary goes into a // comment: keep it on one line. */
static void one_line(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) *s = ' ';
}

/* Only GEMM families get their tile: a gemm2 tile change must not change
 * (and recompile) route, align or combine. */
static void emit_gemm_constants(mj_buf *b, const moejit_gemm_cfg *g) {
  if (!g) return;
  mj_buf_printf(
      b, "enum : int { kTileM = %d, kTileN = %d, kTileK = %d, kStages = %d, kWarps = %d };\n",
      g->tile_m, g->tile_n, g->tile_k, g->stages, g->warps);
  mj_buf_printf(b,
                "enum : int { kClusterM = %d, kClusterN = %d };\n"
                "enum : int { kRaster = %d }; // 0 along_m, 1 along_n\n",
                g->cluster_m, g->cluster_n, (int)g->raster);
  /* a macro too: kernel attributes (__cluster_dims__) are chosen by #if */
  mj_buf_printf(b, "#define MJ_CLUSTER_M %d\n#define MJ_CLUSTER_N %d\n", g->cluster_m,
                g->cluster_n);
  mj_buf_printf(b, "enum : int { kSchedule = %d }; // 0 cooperative, 1 pingpong\n",
                (int)g->schedule);
}

static moejit_status emit_prelude(mj_buf *b, const moejit_spec *s, const char *family,
                                  const char *arch, int sm) {
  char summary[256], scale[64];
  moejit_status st = float_literal(s->routing.scaling_factor, scale, sizeof scale);
  if (st) return st;
  mj_spec_summary(s, summary, sizeof summary);
  one_line(summary);
  mj_buf_printf(b,
                "// Generated by moejit %s: kernel '%s' for %s.\n"
                "// Spec: %s\n"
                "// Do not edit: change the template or the config and regenerate.\n"
                "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n\n",
                moejit_version_string(), family, arch, summary);
  mj_buf_printf(b, "#define MOEJIT_ARCH_SM %d\n", sm);
  mj_buf_printf(b,
                "enum : int { kHidden = %lld, kExpertWidth = %lld, kExperts = %d, kTopK = %d };\n",
                (long long)s->hidden, (long long)s->expert_width, (int)s->experts, (int)s->top_k);
  mj_buf_printf(b,
                "enum : int { kRouteRule = %d }; // 0 softmax_topk, 1 sigmoid_grouped_topk\n"
                "enum : bool { kRenormalize = %s };\n"
                "enum : int { kNumGroups = %d, kTopkGroup = %d };\n"
                "__device__ __forceinline__ constexpr float mj_scaling_factor() { return %s; }\n",
                (int)s->routing.rule, s->routing.renormalize ? "true" : "false", s->routing.n_group,
                s->routing.topk_group, scale);
  mj_buf_printf(b, "enum : int { kBlockThreads = %d, kGemmTileM = %d };\n",
                family_block_threads(s, family), s->gemm1.tile_m);
  emit_gemm_constants(b, family_gemm(s, family));
  mj_buf_printf(
      b, "typedef %s act_t;\ntypedef %s weight_t;\ntypedef %s logits_t;\ntypedef %s out_t;\n\n",
      dtype_ctype(s->act_dtype), dtype_ctype(s->weight_dtype), dtype_ctype(s->logits_dtype),
      dtype_ctype(s->out_dtype));
  return MOEJIT_OK;
}

/* ------------------------------------------------------------------------ */
/* Inlining: #include "x" of template files, each once, behind #line markers */

typedef struct gen_state {
  const char *dir; /* override dir or NULL (embedded) */
  mj_buf out;
  int n_inlined;
  char inlined[MJ_INLINED_MAX][96];
} gen_state;

static int gen_seen(const gen_state *g, const char *name) {
  for (int i = 0; i < g->n_inlined; i++)
    if (strcmp(g->inlined[i], name) == 0) return 1;
  return 0;
}

/* Parses a line `  #  include "name"`; 1 with the name copied if it is a
 * quoted include (angle includes are CUDA's own and pass through), -1 for a
 * quoted include whose name is empty or does not fit `cap` (passed through,
 * NVRTC would read it from wherever the process runs, outside the cache
 * key). */
static int parse_quoted_include(const char *line, size_t len, char *name, size_t cap) {
  const char *p = line, *end = line + len;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (p == end || *p++ != '#') return 0;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if ((size_t)(end - p) < 7 || strncmp(p, "include", 7) != 0) return 0;
  p += 7;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (p == end || *p++ != '"') return 0;
  const char *q = memchr(p, '"', (size_t)(end - p));
  if (!q) return 0;
  if ((size_t)(q - p) + 1 > cap || q == p) return -1;
  memcpy(name, p, (size_t)(q - p));
  name[q - p] = '\0';
  return 1;
}

static int is_pragma_once(const char *line, size_t len) {
  const char *p = line, *end = line + len;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (p == end || *p++ != '#') return 0;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if ((size_t)(end - p) < 6 || strncmp(p, "pragma", 6) != 0) return 0;
  p += 6;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  return (size_t)(end - p) >= 4 && strncmp(p, "once", 4) == 0;
}

/* An include is looked up beside the including file first (common/a.cuh
 * may say "b.cuh"), then from the template root ("common/b.cuh"). */
static int resolve_include(const gen_state *g, const char *from, const char *inc, char *out,
                           size_t cap) {
  const char *slash = strrchr(from, '/');
  if (slash) {
    int n = snprintf(out, cap, "%.*s/%s", (int)(slash - from), from, inc);
    if (n >= 0 && (size_t)n < cap && tpl_exists(g->dir, out)) return 1;
  }
  int n = snprintf(out, cap, "%s", inc);
  return n >= 0 && (size_t)n < cap && tpl_exists(g->dir, out);
}

static moejit_status emit_file(gen_state *g, const char *name, int depth);

static moejit_status emit_include(gen_state *g, const char *from, int line_no, const char *inc,
                                  const char *line, size_t len, int depth) {
  char resolved[96];
  if (!resolve_include(g, from, inc, resolved, sizeof resolved))
    return mj_fail(MOEJIT_ERR_NOT_FOUND,
                   "%s(%d): #include \"%s\" names no template file (looked in %s); HINT: shared "
                   "device code lives in templates/common/ and is included as \"common/NAME.cuh\"",
                   from, line_no, inc, g->dir ? g->dir : "the embedded templates");
  if (gen_seen(g, resolved)) { /* once per source: keep the line count, drop the text */
    mj_buf_printf(&g->out, "// %.*s (inlined above)\n", (int)len, line);
    return MOEJIT_OK;
  }
  if (depth + 1 > MJ_INCLUDE_DEPTH_MAX || g->n_inlined == MJ_INLINED_MAX)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "%s(%d): including \"%s\" goes past %d nested includes or %d files", from,
                   line_no, inc, MJ_INCLUDE_DEPTH_MAX, MJ_INLINED_MAX);
  moejit_status s = emit_file(g, resolved, depth + 1);
  if (s) return s;
  mj_buf_printf(&g->out, "#line %d \"%s\"\n", line_no + 1, from);
  return MOEJIT_OK;
}

static moejit_status emit_file(gen_state *g, const char *name, int depth) {
  tpl_text t;
  moejit_status s = tpl_load(g->dir, name, &t);
  if (s) return s;
  const char *nul = memchr(t.text, '\0', t.len);
  if (nul) { /* NVRTC would stop reading there, and build a kernel of half the source */
    s = mj_fail(MOEJIT_ERR_UNSUPPORTED,
                "template %s holds a NUL byte at offset %zu; HINT: templates are text", name,
                (size_t)(nul - t.text));
    free(t.owned);
    return s;
  }
  mj_strlcpy(g->inlined[g->n_inlined++], name, sizeof g->inlined[0]);
  mj_buf_printf(&g->out, "#line 1 \"%s\"\n", name);
  const char *p = t.text, *end = t.text + t.len;
  char inc[96];
  for (int line_no = 1; p < end && !s; line_no++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    const int quoted = parse_quoted_include(p, len, inc, sizeof inc);
    if (quoted < 0) {
      s = mj_fail(MOEJIT_ERR_UNSUPPORTED,
                  "%s(%d): an #include \"...\" name must be 1 to %zu bytes; HINT: templates "
                  "include their own files by short relative names (\"common/NAME.cuh\")",
                  name, line_no, sizeof inc - 1);
    } else if (quoted) {
      s = emit_include(g, name, line_no, inc, p, len, depth);
    } else if (is_pragma_once(p, len)) {
      mj_buf_printf(&g->out, "// %.*s (not needed: each file is inlined once)\n", (int)len, p);
    } else {
      mj_buf_append(&g->out, p, len);
      mj_buf_puts(&g->out, "\n");
    }
    p += len + (nl ? 1 : 0);
  }
  free(t.owned);
  return s;
}

/* ------------------------------------------------------------------------ */
/* Entry discovery: extern "C" __global__ [attrs] void [attrs] NAME(...) {  */

/* A copy with comments blanked (newlines kept) so commented-out kernels and
 * prose do not count; string and char literals are kept as they are. */
static char *strip_comments(const char *src, size_t len) {
  char *c = malloc(len + 1);
  if (!c) return NULL;
  memcpy(c, src, len + 1);
  for (size_t i = 0; i < len; i++) {
    if (c[i] == '"' || c[i] == '\'') {
      char q = c[i];
      for (i++; i < len && c[i] != q && c[i] != '\n'; i++)
        if (c[i] == '\\') i++;
    } else if (c[i] == '/' && i + 1 < len && c[i + 1] == '/') {
      for (; i < len && c[i] != '\n'; i++) c[i] = ' ';
    } else if (c[i] == '/' && i + 1 < len && c[i + 1] == '*') {
      size_t j = i;
      for (; j < len && !(c[j] == '*' && j + 1 < len && c[j + 1] == '/' && j > i + 1); j++)
        if (c[j] != '\n') c[j] = ' ';
      for (size_t k = 0; k < 2 && j < len; k++, j++) c[j] = ' ';
      i = j - 1;
    }
  }
  return c;
}

static int is_ident(char ch) {
  return isalnum((unsigned char)ch) || ch == '_';
}

static const char *skip_ws(const char *p) {
  while (*p && isspace((unsigned char)*p)) p++;
  return p;
}

/* Matches `word` as a whole token at p; returns the position after it. */
static const char *match_word(const char *p, const char *word) {
  size_t n = strlen(word);
  if (strncmp(p, word, n) != 0 || is_ident(p[n])) return NULL;
  return p + n;
}

/* p at '(': returns the position after the matching ')', NULL if none. */
static const char *skip_parens(const char *p) {
  int depth = 0;
  for (; *p; p++) {
    if (*p == '(') depth++;
    if (*p == ')' && --depth == 0) return p + 1;
  }
  return NULL;
}

/* p just after `extern`: the entry's name span if this is an entry
 * definition, else 0. Attributes such as __launch_bounds__(256) or
 * __cluster_dims__(2,1,1) may stand before or after `void`; an identifier
 * followed by (...) is the name when `{` comes next, an attribute when
 * another identifier does. */
static size_t match_entry(const char *p, const char **name) {
  p = skip_ws(p);
  if (strncmp(p, "\"C\"", 3) != 0) return 0;
  p = skip_ws(p + 3);
  if (!(p = match_word(p, "__global__"))) return 0;
  for (int seen_void = 0;;) {
    p = skip_ws(p);
    const char *tok = p;
    while (is_ident(*p)) p++;
    size_t n = (size_t)(p - tok);
    if (n == 0) return 0;
    if (n == 4 && strncmp(tok, "void", 4) == 0 && !seen_void) {
      seen_void = 1;
      continue;
    }
    p = skip_ws(p);
    if (*p != '(' || !(p = skip_parens(p))) return 0;
    const char *next = skip_ws(p);
    if (seen_void && *next == '{') {
      *name = tok;
      return n;
    }
    if (strncmp(tok, "__", 2) != 0 || !is_ident(*next)) return 0; /* e.g. a declaration */
  }
}

static moejit_status add_entry(mj_kernel_source *ks, const char *name, size_t n) {
  for (int i = 0; i < ks->n_entries; i++)
    if (strlen(ks->entries[i]) == n && strncmp(ks->entries[i], name, n) == 0) return MOEJIT_OK;
  if (ks->n_entries == MJ_MAX_ENTRIES || n >= sizeof ks->entries[0])
    return mj_fail(MOEJIT_ERR_UNSUPPORTED,
                   "template %s defines more than %d entries or an entry name over %zu chars",
                   ks->template_name, MJ_MAX_ENTRIES, sizeof ks->entries[0] - 1);
  memcpy(ks->entries[ks->n_entries], name, n);
  ks->entries[ks->n_entries++][n] = '\0';
  return MOEJIT_OK;
}

static moejit_status scan_entries(mj_kernel_source *ks) {
  char *c = strip_comments(ks->source, ks->source_len);
  if (!c) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory scanning kernel entries");
  moejit_status s = MOEJIT_OK;
  for (const char *p = c; !s && (p = strstr(p, "extern")); p += 6) {
    if (p > c && is_ident(p[-1])) continue;
    const char *name = NULL;
    size_t n = match_entry(p + 6, &name);
    if (n) s = add_entry(ks, name, n);
  }
  free(c);
  if (!s && ks->n_entries == 0)
    s = mj_fail(MOEJIT_ERR_COMPILE,
                "template %s defines no entry point; HINT: define the kernel as "
                "extern \"C\" __global__ void NAME(...) { ... }",
                ks->template_name);
  return s;
}

/* ------------------------------------------------------------------------ */

static moejit_status check_arch(const char *arch, int *sm) {
  int has_a = 0;
  if (strcmp(arch, "auto") == 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "arch 'auto' needs a GPU to resolve; HINT: pass an explicit arch such as "
                   "sm_90a or sm_80, or go through a moejit_ctx, which picks the GPU's arch");
  *sm = strlen(arch) < MOEJIT_ARCH_MAX ? mj_arch_parse(arch, &has_a) : 0;
  if (*sm <= 0)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "'%s' is not an arch name; HINT: use sm_<major><minor>[a], e.g. sm_80, sm_90a",
                   arch);
  return MOEJIT_OK;
}

static const char *template_dir_choice(const char *template_dir) {
  if (template_dir && *template_dir) return template_dir;
  const char *env = getenv("MOEJIT_TEMPLATE_DIR");
  return env && *env ? env : NULL;
}

static moejit_status generate(const moejit_spec *spec, const char *family, const char *arch, int sm,
                              const char *dir, mj_kernel_source *out) {
  gen_state *g = calloc(1, sizeof *g);
  if (!g) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory generating a kernel");
  g->dir = dir;
  moejit_status s = emit_prelude(&g->out, spec, family, arch, sm);
  if (!s) s = emit_file(g, out->template_name, 0);
  if (!s && g->out.oom) s = mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory generating source");
  if (!s) {
    out->source_len = g->out.len;
    out->source = mj_buf_take(&g->out);
  }
  mj_buf_free(&g->out);
  free(g);
  return s;
}

static int in_set(const mj_entry_set *set, const char *name) {
  for (int i = 0; i < set->n; i++)
    if (strcmp(set->name[i], name) == 0) return 1;
  return 0;
}

int mj_entry_set_add(mj_entry_set *set, const char *name) {
  if (in_set(set, name)) return 1;
  if (set->n == MJ_MAX_ENTRIES) return 0;
  set->name[set->n++] = name;
  return 1;
}

/* Keeps only the wanted entries (template order) and puts their defines in
 * front of the source. */
static moejit_status select_entries(mj_kernel_source *ks, const mj_entry_set *only) {
  for (int i = 0; i < only->n; i++) {
    int found = 0;
    for (int e = 0; e < ks->n_entries && !found; e++)
      found = !strcmp(ks->entries[e], only->name[i]);
    if (!found)
      return mj_fail(MOEJIT_ERR_NOT_FOUND,
                     "kernel '%s' has no entry '%s'; HINT: entries are the extern \"C\" "
                     "__global__ functions of templates/%s",
                     ks->family, only->name[i], ks->template_name);
  }
  mj_buf b = {0};
  mj_buf_printf(&b, "#define MJ_ENTRY_SUBSET 1\n");
  int kept = 0;
  for (int e = 0; e < ks->n_entries; e++) {
    if (!in_set(only, ks->entries[e])) continue;
    mj_buf_printf(&b, "#define MJ_WANT_%s 1\n", ks->entries[e]);
    if (kept != e) memcpy(ks->entries[kept], ks->entries[e], sizeof ks->entries[0]);
    kept++;
  }
  ks->n_entries = kept;
  mj_buf_append(&b, ks->source, ks->source_len);
  if (b.oom) {
    mj_buf_free(&b);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory generating source");
  }
  free(ks->source);
  ks->source_len = b.len;
  ks->source = mj_buf_take(&b);
  return MOEJIT_OK;
}

moejit_status mj_codegen(const moejit_spec *spec, const char *family, const char *arch,
                         const char *template_dir, mj_kernel_source *out) {
  return mj_codegen_entries(spec, family, arch, template_dir, NULL, out);
}

moejit_status mj_codegen_entries(const moejit_spec *spec, const char *family, const char *arch,
                                 const char *template_dir, const mj_entry_set *only,
                                 mj_kernel_source *out) {
  if (!out) return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_codegen: out is NULL");
  memset(out, 0, sizeof *out);
  if (!spec || !family || !arch)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "mj_codegen: spec, family and arch are required");
  int sm = 0;
  if (family_index(family) < 0) {
    char known[128];
    known_families(known, sizeof known);
    return mj_fail(MOEJIT_ERR_NOT_FOUND, "unknown kernel family '%s' (known: %s)", family, known);
  }
  moejit_status s = moejit_spec_validate(spec);
  if (s) return mj_fail_prefix(s, "cannot generate kernel '%s'", family);
  if ((s = check_arch(arch, &sm))) return s;
  mj_strlcpy(out->family, family, sizeof out->family);
  mj_strlcpy(out->arch, arch, sizeof out->arch);
  snprintf(out->template_name, sizeof out->template_name, "%s.cu", family);
  s = generate(spec, family, arch, sm, template_dir_choice(template_dir), out);
  if (!s) s = scan_entries(out);
  if (!s && only && only->n > 0) s = select_entries(out, only);
  if (s) mj_kernel_source_free(out);
  return s;
}

void mj_kernel_source_free(mj_kernel_source *ks) {
  if (!ks) return;
  free(ks->source);
  memset(ks, 0, sizeof *ks);
}
