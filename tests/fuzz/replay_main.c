/* A main() for the fuzz harnesses without libFuzzer: feeds every file named
 * on the command line (directories: every file inside, recursively, in name
 * order) to LLVMFuzzerTestOneInput once. The fuzz.replay_* ctests run the
 * corpus through it in every build, gcc included; a broken property aborts. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static size_t replayed;

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
    return 1;
  }
  size_t cap = 4096, len = 0;
  unsigned char *buf = malloc(cap);
  for (size_t n; buf && (n = fread(buf + len, 1, cap - len, f)) > 0;) {
    len += n;
    if (len == cap) {
      unsigned char *grown = realloc(buf, cap *= 2);
      if (!grown) free(buf);
      buf = grown;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    free(buf);
    return 1;
  }
  /* an exact-size copy, so that ASan sees reads past the input's end */
  unsigned char *input = malloc(len ? len : 1);
  if (!input) {
    free(buf);
    return 1;
  }
  memcpy(input, buf, len);
  free(buf);
  LLVMFuzzerTestOneInput(input, len);
  free(input);
  replayed++;
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_path(const char *path);

static int replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: cannot open %s: %s\n", dir, strerror(errno));
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue; /* hidden files such as .gitkeep */
    if (n == cap) {
      char **grown = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
      if (!grown) {
        rc = 1;
        break;
      }
      names = grown;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    if (!(names[n] = malloc(len))) {
      rc = 1;
      break;
    }
    snprintf(names[n++], len, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    rc |= replay_path(names[i]);
    free(names[i]);
  }
  free(names);
  return rc;
}

static int replay_path(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
    return 1;
  }
  return S_ISDIR(sb.st_mode) ? replay_dir(path) : replay_file(path);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
    return 2;
  }
  int rc = 0;
  for (int i = 1; i < argc; i++) rc |= replay_path(argv[i]);
  printf("replayed %zu inputs through %s: no crash, every property held\n", replayed, argv[0]);
  if (replayed == 0) {
    fprintf(stderr, "replay: no input found\n");
    return 1;
  }
  return rc;
}
