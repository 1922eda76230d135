/* libFuzzer harness for the YAML config loader (src/config). Whatever the
 * bytes, moejit_spec_load_string either loads a spec that validates and
 * generates every kernel's source, or fails with CONFIG whose message starts
 * "<fuzz>:LINE:COL:", leaving the caller's spec untouched. */
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "fuzz.h"
#include "moejit/moejit.h"

#define ORIGIN "<fuzz>"

/* One compiler for the process: code generation needs no GPU and no cache. */
static moejit_compiler *the_compiler(void) {
  static moejit_compiler *c;
  if (!c) {
    moejit_compiler_opts o;
    moejit_compiler_opts_init(&o);
    o.cache_disable = 1;
    o.jobs = 1;
    FUZZ_REQUIRE(moejit_compiler_create(&c, &o) == MOEJIT_OK, "%s", moejit_last_error());
  }
  return c;
}

/* A refused config names where: "<fuzz>:LINE:COL: ..." with a line inside
 * the text (libyaml may point one past the last line). */
static void check_refusal(moejit_status st, size_t size) {
  const char *msg = moejit_last_error();
  FUZZ_REQUIRE(st == MOEJIT_ERR_CONFIG || st == MOEJIT_ERR_OUT_OF_MEMORY, "status %d: %s", st, msg);
  if (st != MOEJIT_ERR_CONFIG) return;
  int line = 0, col = 0, end = 0;
  FUZZ_REQUIRE(sscanf(msg, ORIGIN ":%d:%d:%n", &line, &col, &end) == 2 && end > 0,
               "message lacks " ORIGIN ":LINE:COL: '%s'", msg);
  FUZZ_REQUIRE(line >= 1 && col >= 1 && (size_t)line <= size + 1, "position %d:%d: '%s'", line, col,
               msg);
}

/* What a loaded spec promises: it validates, and each kernel family's
 * source generates for each of its archs ("auto" resolves only with a GPU;
 * sm_90a stands in for it). */
static void check_loaded(const moejit_spec *spec) {
  FUZZ_REQUIRE(moejit_spec_validate(spec) == MOEJIT_OK, "loaded spec fails validation: %s",
               moejit_last_error());
  char summary[256];
  mj_spec_summary(spec, summary, sizeof summary);
  FUZZ_REQUIRE(strlen(summary) > 0, "empty summary");
  for (int a = 0; a < spec->n_archs; a++) {
    const char *arch = strcmp(spec->archs[a], "auto") ? spec->archs[a] : "sm_90a";
    for (const char *const *f = moejit_kernel_families(); *f; f++) {
      char *src = NULL;
      moejit_status st = moejit_generate(the_compiler(), spec, *f, arch, &src);
      FUZZ_REQUIRE(st == MOEJIT_OK && src && src[0], "generate %s for %s: status %d: %s", *f, arch,
                   st, moejit_last_error());
      moejit_free(src);
    }
  }
}

/* Sizes ("2G") are parsed by the same rules wherever they appear. */
static void check_parse_size(const uint8_t *data, size_t size) {
  char text[64];
  if (size >= sizeof text) return;
  memcpy(text, data, size);
  text[size] = '\0';
  uint64_t bytes = 0;
  moejit_status st = moejit_parse_size(text, &bytes);
  FUZZ_REQUIRE(st == MOEJIT_OK || st == MOEJIT_ERR_INVALID_ARGUMENT, "parse_size status %d", st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  moejit_spec spec, untouched;
  memset(&spec, 0xA5, sizeof spec);
  memcpy(&untouched, &spec, sizeof spec);
  /* data is not NUL-terminated: the loader must stay within size bytes */
  moejit_status st = moejit_spec_load_string((const char *)data, size, ORIGIN, &spec);
  if (st == MOEJIT_OK) {
    check_loaded(&spec);
  } else {
    check_refusal(st, size);
    FUZZ_REQUIRE(memcmp(&spec, &untouched, sizeof spec) == 0, "a failed load changed the spec");
  }
  check_parse_size(data, size);
  return 0;
}
