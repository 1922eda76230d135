/* libFuzzer harness for the tuned-table reader (src/tune/tuned_table.c),
 * the other YAML the library reads from disk. Whatever the bytes,
 * mj_tuned_table_parse either loads a table or fails with CONFIG naming
 * "<fuzz>:LINE:COL:" and leaves the table empty; a loaded table writes back
 * and reads back identical (the round trip tuned_table.h promises). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "moejit/moejit.h"
#include "tune/tuned_table.h"

#define ORIGIN "<fuzz>"

static char table_path[256];

static void remove_dir(void) {
  unlink(table_path);
  char *slash = strrchr(table_path, '/');
  if (slash) *slash = '\0', rmdir(table_path);
}

/* A file to write tables to, on tmpfs when there is one. */
static const char *scratch_path(void) {
  if (!table_path[0]) {
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(table_path, sizeof table_path, "%s/moejit-fuzz-tuned-XXXXXX", base);
    FUZZ_REQUIRE(mkdtemp(table_path) != NULL, "mkdtemp: %s", strerror(errno));
    strcat(table_path, "/table.yaml");
    atexit(remove_dir);
  }
  return table_path;
}

static void check_refusal(moejit_status st, const mj_tuned_table *t) {
  const char *msg = moejit_last_error();
  FUZZ_REQUIRE(st == MOEJIT_ERR_CONFIG || st == MOEJIT_ERR_OUT_OF_MEMORY, "status %d: %s", st, msg);
  FUZZ_REQUIRE(t->n == 0, "a failed parse left %zu entries", t->n);
  if (st != MOEJIT_ERR_CONFIG) return;
  int line = 0, col = 0, end = 0;
  FUZZ_REQUIRE(
      sscanf(msg, ORIGIN ":%d:%d:%n", &line, &col, &end) == 2 && end > 0 && line >= 1 && col >= 1,
      "message lacks " ORIGIN ":LINE:COL: '%s'", msg);
}

static int same_entry(const mj_tuned_entry *a, const mj_tuned_entry *b) {
  return !strcmp(a->kernel, b->kernel) && a->dtype == b->dtype && a->hidden == b->hidden &&
         a->expert_width == b->expert_width && a->experts == b->experts && a->top_k == b->top_k &&
         a->tokens == b->tokens && !memcmp(&a->cfg, &b->cfg, sizeof a->cfg) && a->path == b->path &&
         a->us == b->us && a->heuristic_us == b->heuristic_us;
}

/* write(t) then read: the same table. */
static void check_round_trip(const mj_tuned_table *t) {
  const char *path = scratch_path();
  moejit_status st = mj_tuned_table_write(t, path);
  FUZZ_REQUIRE(st == MOEJIT_OK, "a parsed table does not write: %s", moejit_last_error());
  mj_tuned_table back;
  memset(&back, 0, sizeof back);
  st = mj_tuned_table_load_file(path, &back);
  FUZZ_REQUIRE(st == MOEJIT_OK, "a written table does not parse: %s", moejit_last_error());
  FUZZ_REQUIRE(!strcmp(back.device, t->device) && !strcmp(back.arch, t->arch) &&
                   !strcmp(back.nvrtc, t->nvrtc) && !strcmp(back.date, t->date) &&
                   back.driver == t->driver && back.n == t->n,
               "header or count changed: %zu entries, then %zu", t->n, back.n);
  for (size_t i = 0; i < t->n; i++)
    FUZZ_REQUIRE(same_entry(&t->entries[i], &back.entries[i]), "entry %zu changed", i);
  mj_tuned_table_free(&back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mj_tuned_table t;
  memset(&t, 0, sizeof t);
  moejit_status st = mj_tuned_table_parse((const char *)data, size, ORIGIN, &t);
  if (st == MOEJIT_OK)
    check_round_trip(&t);
  else
    check_refusal(st, &t);
  mj_tuned_table_free(&t);
  return 0;
}
