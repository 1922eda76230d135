/* Shared test helpers (see test_support.h). */
#include "test_support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moejit/moejit.h"

char *ts_mkdtemp(const char *tag) {
  char tmpl[256];
  snprintf(tmpl, sizeof tmpl, "/tmp/moejit-test-%s-XXXXXX", tag ? tag : "x");
  char *p = mkdtemp(tmpl);
  return p ? strdup(p) : NULL;
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void ts_rmtree(const char *path) {
  if (!path || strncmp(path, "/tmp/", 5) != 0) return;
  nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int count_rec(const char *dir, const char *needle) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      n += count_rec(p, needle);
    else if (S_ISREG(st.st_mode) && (!needle || strstr(e->d_name, needle)))
      n++;
  }
  closedir(d);
  return n;
}

int ts_count_files(const char *dir, const char *needle) { return count_rec(dir, needle); }

static char *slurp_fd(int fd) {
  size_t cap = 4096, len = 0;
  char *b = malloc(cap);
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap *= 2;
      b = realloc(b, cap);
    }
    ssize_t n = read(fd, b + len, cap - len - 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
  }
  b[len] = '\0';
  return b;
}

int ts_run_cli(const char *const *args, const char *const *env, char **out, char **err) {
  return ts_run_program(MOEJIT_CLI_PATH, args, env, out, err);
}

int ts_run_program(const char *path, const char *const *args, const char *const *env, char **out,
                   char **err) {
  char outp[] = "/tmp/moejit-cli-out-XXXXXX", errp[] = "/tmp/moejit-cli-err-XXXXXX";
  int ofd = mkstemp(outp), efd = mkstemp(errp);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(ofd, 1);
    dup2(efd, 2);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
    const char *argv[64];
    int n = 0;
    argv[n++] = path;
    for (const char *const *a = args; *a && n < 63; a++) argv[n++] = *a;
    argv[n] = NULL;
    execv(path, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  lseek(ofd, 0, SEEK_SET);
  lseek(efd, 0, SEEK_SET);
  char *o = slurp_fd(ofd), *e = slurp_fd(efd);
  close(ofd);
  close(efd);
  unlink(outp);
  unlink(errp);
  if (out) *out = o; else free(o);
  if (err) *err = e; else free(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

char *ts_write_file(const char *dir, const char *name, const char *text) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0) return NULL;
  FILE *f = fopen(p, "wb");
  if (!f) {
    free(p);
    return NULL;
  }
  fputs(text, f);
  fclose(f);
  return p;
}

ts_rng ts_rng_seeded(uint64_t seed) {
  ts_rng r = {seed ? seed : 0x9E3779B97F4A7C15ull};
  return r;
}

ts_rng ts_rng_fresh(const char *what) {
  const char *env = getenv("MOEJIT_TEST_SEED");
  uint64_t seed = env ? strtoull(env, NULL, 0)
                      : ((uint64_t)time(NULL) * 6364136223846793005ull) ^ ((uint64_t)getpid() << 17);
  fprintf(stderr, "[%s] seed %llu (replay with MOEJIT_TEST_SEED)\n", what ? what : "rng",
          (unsigned long long)seed);
  return ts_rng_seeded(seed);
}

uint64_t ts_next(ts_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}

double ts_uniform(ts_rng *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(ts_next(r) >> 11) / 9007199254740992.0);
}

float ts_normal(ts_rng *r) {
  double u1 = ts_uniform(r, 1e-12, 1.0), u2 = ts_uniform(r, 0.0, 1.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

int ts_gpu_available(char *reason, size_t cap) {
  int n = 0;
  moejit_status st = moejit_device_count(&n);
  if (st != MOEJIT_OK) {
    snprintf(reason, cap, "%s", moejit_last_error());
    return 0;
  }
  if (n == 0) {
    snprintf(reason, cap, "no CUDA device");
    return 0;
  }
  return 1;
}
