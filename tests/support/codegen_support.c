/* Helpers for the code generator and compiler tests (see codegen_support.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strndup; also set by the build */
#endif
#include "codegen_support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "common/common.h"

static int pick(ts_rng *r, const int *v, int n) {
  return v[ts_next(r) % (uint64_t)n];
}

void cs_random_spec(ts_rng *r, moejit_spec *s) {
  static const int experts[] = {8, 16, 60, 64, 128, 256};
  static const int threads[] = {64, 128, 256, 512, 1024};
  static const int tile_m[] = {16, 32, 64, 128};
  moejit_spec_init(s);
  snprintf(s->name, sizeof s->name, "rand-%04x", (unsigned)(ts_next(r) & 0xffff));
  s->hidden = 8 * (int64_t)(1 + ts_next(r) % 1024);
  s->expert_width = 8 * (int64_t)(1 + ts_next(r) % 512);
  s->experts = pick(r, experts, 6);
  s->top_k = 1 + (int)(ts_next(r) % (uint64_t)(s->experts < 8 ? s->experts : 8));
  if (ts_next(r) % 2 && s->experts % 4 == 0) {
    s->routing.rule = MOEJIT_ROUTE_SIGMOID_GROUPED_TOPK;
    s->routing.n_group = 4;
    int per_group = s->experts / 4, need = (s->top_k + per_group - 1) / per_group;
    s->routing.topk_group = 1 + (int)(ts_next(r) % 4);
    if (s->routing.topk_group < need) s->routing.topk_group = need; /* top_k fits the kept groups */
    s->routing.scaling_factor = (float)ts_uniform(r, 0.5, 3.0);
  }
  s->routing.renormalize = (int)(ts_next(r) % 2);
  s->act_dtype = (moejit_dtype)(ts_next(r) % 3);
  s->weight_dtype = (moejit_dtype)(ts_next(r) % 3);
  s->out_dtype = (moejit_dtype)(ts_next(r) % 3);
  s->route.block_threads = pick(r, threads, 5);
  s->align.block_threads = pick(r, threads, 5);
  s->combine.block_threads = pick(r, threads, 5);
  s->gemm1.tile_m = pick(r, tile_m, 4);
  if (s->weight_dtype == MOEJIT_DTYPE_FP32) s->gemm1.stages = s->gemm2.stages = 2; /* smem */
}

const char *cs_template_dir(const char *name) {
  static _Thread_local char buf[1024];
  snprintf(buf, sizeof buf, "%s/tests/data/templates/%s", MOEJIT_TEST_SOURCE_DIR, name);
  return buf;
}

/* Line `n` (1-based) of a text, without its newline; NULL past the end. */
static char *text_line(const char *text, int n) {
  for (int i = 1; i < n && text; i++) {
    text = strchr(text, '\n');
    if (text) text++;
  }
  if (!text || !*text) return NULL;
  return strndup(text, strcspn(text, "\n"));
}

/* A template's text from a directory, or from the embedded table (dir NULL). */
static char *template_text(const char *dir, const char *name) {
  if (!dir) {
    for (const mj_embedded_file *f = mj_embedded_templates; f->name; f++)
      if (strcmp(f->name, name) == 0) return strdup(f->text);
    return NULL;
  }
  char path[1400], *data = NULL;
  size_t len = 0;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return mj_read_file(path, &data, &len) == MOEJIT_OK ? data : NULL;
}

/* One generated line against the template line it claims to be. Include and
 * #pragma once lines are replaced by "// <original> (why)". */
static int line_matches(const char *got, const char *want) {
  if (!want) return 0;
  if (strcmp(got, want) == 0) return 1;
  return want[0] == '#' && strncmp(got, "// ", 3) == 0 && strncmp(got + 3, want, strlen(want)) == 0;
}

int cs_check_line_mapping(const char *source, const char *template_dir, char *why, size_t cap) {
  char file[256] = "", *text = NULL;
  int line_no = 0, checked = 0, bad = 0;
  for (const char *p = source; *p && !bad;) {
    size_t len = strcspn(p, "\n");
    char *got = strndup(p, len), name[256];
    int n;
    if (sscanf(got, "#line %d \"%255[^\"]\"", &n, name) == 2) {
      free(text);
      text = template_text(template_dir, name);
      snprintf(file, sizeof file, "%s", name);
      line_no = n;
    } else if (file[0]) {
      char *want = text ? text_line(text, line_no) : NULL;
      bad = !line_matches(got, want);
      if (bad)
        snprintf(why, cap, "%s(%d): generated '%s', template has '%s'", file, line_no, got,
                 want ? want : "(no such line)");
      free(want);
      checked++, line_no++;
    }
    free(got);
    p += len + (p[len] ? 1 : 0);
  }
  free(text);
  if (!bad && checked == 0) snprintf(why, cap, "no template line found after a #line marker");
  return bad || checked == 0;
}

moejit_spec cs_fresh_spec(const char *tag) {
  ts_rng r = ts_rng_fresh(tag);
  moejit_spec s;
  cs_random_spec(&r, &s);
  return s;
}
