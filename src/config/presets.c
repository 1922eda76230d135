/* Model presets embedded at build time from configs/models/ (the table in
 * the generated embedded_presets.c): names, text, and loading by name. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "config/config.h"

#define MJ_DEFAULT_PRESET "qwen3-30b-a3b"

/* NULL-terminated view of the table's names, built once. */
#define MJ_MAX_PRESETS 64
static const char *preset_names[MJ_MAX_PRESETS + 1];
static pthread_once_t preset_names_once = PTHREAD_ONCE_INIT;

static void build_preset_names(void) {
  size_t n = mj_embedded_presets_count;
  for (size_t i = 0; i < n && i < MJ_MAX_PRESETS; i++)
    preset_names[i] = mj_embedded_presets[i].name;
}

const char *const *moejit_preset_names(void) {
  pthread_once(&preset_names_once, build_preset_names);
  return preset_names;
}

const char *moejit_default_preset(void) {
  return MJ_DEFAULT_PRESET;
}

static const mj_embedded_file *find_preset(const char *name) {
  for (size_t i = 0; name && i < mj_embedded_presets_count; i++)
    if (!strcmp(mj_embedded_presets[i].name, name)) return &mj_embedded_presets[i];
  return NULL;
}

const char *moejit_preset_yaml(const char *name) {
  const mj_embedded_file *p = find_preset(name);
  return p ? p->text : NULL;
}

moejit_status moejit_spec_load_preset(const char *name, moejit_spec *spec) {
  if (!name || !spec)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "moejit_spec_load_preset: %s is NULL",
                   name ? "spec" : "name");
  const mj_embedded_file *p = find_preset(name);
  if (!p) {
    mj_buf known = {0};
    for (size_t i = 0; i < mj_embedded_presets_count; i++)
      mj_buf_printf(&known, "%s%s", i ? ", " : "", mj_embedded_presets[i].name);
    char q[256];
    mj_quote(q, sizeof q, name, strlen(name));
    moejit_status st = mj_fail(MOEJIT_ERR_NOT_FOUND,
                               "unknown preset %s (known presets: %s); HINT: give one of "
                               "these names or the path of a YAML config",
                               q, known.data && !known.oom ? known.data : "none");
    mj_buf_free(&known);
    return st;
  }
  char origin[MOEJIT_NAME_MAX + 32];
  snprintf(origin, sizeof origin, "<preset %s>", p->name);
  return moejit_spec_load_string(p->text, p->len, origin, spec);
}
