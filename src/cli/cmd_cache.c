/* `moejit cache stats|list|verify|prune|clear`: inspect and maintain a
 * cubin cache directory, for people (tables) and programs (--json). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static void cache_usage(FILE *f) {
  fprintf(f,
          "usage: moejit cache <stats|list|verify|prune|clear> [options]\n"
          "\n"
          "  stats    entries, bytes, leftover temp files\n"
          "  list     every entry: key, kernel, arch, size, last use, config summary\n"
          "  verify   check every entry's header and checksum (--fix removes bad ones\n"
          "           and temp files of dead writers); exit 1 if a bad entry is found\n"
          "  prune    evict least-recently-used entries down to --max-size SIZE\n"
          "  clear    remove every entry\n"
          "\n"
          "options:\n"
          "  --cache-dir DIR   cache directory (default: $MOEJIT_CACHE_DIR, then\n"
          "                    $XDG_CACHE_HOME/moejit, then ~/.cache/moejit)\n"
          "  --max-size SIZE   prune target, e.g. 500M, 2G (default: $MOEJIT_CACHE_MAXSIZE);\n"
          "                    0: no limit, so prune removes only old temp files\n"
          "  --fix             with verify: delete what is bad\n"
          "  --json            one JSON object\n");
}

static void fmt_time(int64_t t, char *buf, size_t cap) {
  if (!t) {
    snprintf(buf, cap, "-");
    return;
  }
  time_t tt = (time_t)t;
  struct tm tm;
  localtime_r(&tt, &tm);
  strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm);
}

static int do_stats(const char *dir, int json) {
  moejit_cache_stats s;
  moejit_status st = moejit_cache_stats_get(dir, &s);
  if (st) return cli_fail(st, "cache stats");
  if (json) {
    printf("{\"dir\":");
    cli_json_str(stdout, s.dir);
    printf(",\"entries\":%llu,\"bytes\":%llu,\"temp_files\":%llu,\"oldest_used\":%lld,"
           "\"newest_used\":%lld}\n",
           (unsigned long long)s.entries, (unsigned long long)s.bytes,
           (unsigned long long)s.temp_files, (long long)s.oldest_used, (long long)s.newest_used);
    return CLI_EXIT_OK;
  }
  char a[32], b[32];
  fmt_time(s.oldest_used, a, sizeof a);
  fmt_time(s.newest_used, b, sizeof b);
  printf("cache dir:   %s\nentries:     %llu\nbytes:       %llu (%.1f MiB)\ntemp files:  %llu\n"
         "oldest use:  %s\nnewest use:  %s\n",
         s.dir, (unsigned long long)s.entries, (unsigned long long)s.bytes,
         (double)s.bytes / 1048576.0, (unsigned long long)s.temp_files, a, b);
  return CLI_EXIT_OK;
}

static int do_list(const char *dir, int json) {
  moejit_cache_entry_info *e = NULL;
  size_t n = 0;
  moejit_status st = moejit_cache_list(dir, &e, &n);
  if (st) return cli_fail(st, "cache list");
  if (json) printf("[");
  else printf("%-32s %-10s %-8s %9s %-19s %s\n", "key", "kernel", "arch", "bytes", "last used", "config");
  for (size_t i = 0; i < n; i++) {
    if (json) {
      printf("%s{\"key\":", i ? "," : "");
      cli_json_str(stdout, e[i].key);
      printf(",\"kernel\":");
      cli_json_str(stdout, e[i].kernel);
      printf(",\"arch\":");
      cli_json_str(stdout, e[i].arch);
      printf(",\"summary\":");
      cli_json_str(stdout, e[i].summary);
      printf(",\"bytes\":%llu,\"created\":%lld,\"last_used\":%lld,\"ok\":%s,\"readable\":%s}",
             (unsigned long long)e[i].bytes, (long long)e[i].created, (long long)e[i].last_used,
             e[i].ok == 1 ? "true" : "false", e[i].ok >= 0 ? "true" : "false");
    } else {
      char t[32];
      fmt_time(e[i].last_used, t, sizeof t);
      printf("%-32s %-10s %-8s %9llu %-19s %s%s\n", e[i].key, e[i].kernel, e[i].arch,
             (unsigned long long)e[i].bytes, t, e[i].summary,
             e[i].ok == 1   ? ""
             : e[i].ok == 0 ? " [BAD]"
                            : " [UNREADABLE]");
    }
  }
  if (json) printf("]\n");
  else printf("%zu entries\n", n);
  moejit_free(e);
  return CLI_EXIT_OK;
}

static int do_verify(const char *dir, int fix, int json) {
  size_t ok = 0, bad = 0;
  moejit_status st = moejit_cache_verify(dir, fix, &ok, &bad);
  if (st) return cli_fail(st, "cache verify");
  if (json)
    printf("{\"ok\":%zu,\"bad\":%zu,\"fixed\":%s}\n", ok, bad, fix ? "true" : "false");
  else
    printf("%zu entries ok, %zu bad%s\n", ok, bad, bad ? (fix ? " (removed)" : " (run with --fix to remove)") : "");
  return bad && !fix ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}

static int do_prune(const char *dir, const char *max_size, int json) {
  uint64_t max = 0;
  const char *env = getenv("MOEJIT_CACHE_MAXSIZE");
  const char *text = max_size ? max_size : env && *env ? env : NULL; /* empty: unset */
  if (!text) {
    fprintf(stderr, "moejit: cache prune needs --max-size SIZE (or $MOEJIT_CACHE_MAXSIZE)\n");
    return CLI_EXIT_USAGE;
  }
  moejit_status st = moejit_parse_size(text, &max);
  if (st) return cli_fail(st, max_size ? "--max-size" : "$MOEJIT_CACHE_MAXSIZE");
  size_t removed = 0;
  uint64_t bytes = 0;
  st = moejit_cache_prune(dir, max, &removed, &bytes);
  if (st) return cli_fail(st, "cache prune");
  if (json)
    printf("{\"removed\":%zu,\"bytes_removed\":%llu,\"max_bytes\":%llu}\n", removed,
           (unsigned long long)bytes, (unsigned long long)max);
  else
    printf("removed %zu entries (%llu bytes); limit %llu bytes\n", removed,
           (unsigned long long)bytes, (unsigned long long)max);
  return CLI_EXIT_OK;
}

static int do_clear(const char *dir, int json) {
  size_t removed = 0;
  moejit_status st = moejit_cache_clear(dir, &removed);
  if (st) return cli_fail(st, "cache clear");
  if (json) printf("{\"removed\":%zu}\n", removed);
  else printf("removed %zu entries\n", removed);
  return CLI_EXIT_OK;
}

int cli_cache(int argc, char **argv) {
  const char *sub = NULL, *dir = NULL, *max_size = NULL;
  int json = 0, fix = 0;
  for (int i = 1; i < argc; i++) {
    int bad = 0;
    if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
      cache_usage(stdout);
      return CLI_EXIT_OK;
    }
    if (cli_opt_value(argc, argv, &i, "--cache-dir", &dir, &bad) ||
        cli_opt_value(argc, argv, &i, "--max-size", &max_size, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
    } else if (cli_flag(argv, i, "--json")) {
      json = 1;
    } else if (cli_flag(argv, i, "--fix")) {
      fix = 1;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "moejit: unknown option '%s' (see moejit cache --help)\n", argv[i]);
      return CLI_EXIT_USAGE;
    } else if (!sub) {
      sub = argv[i];
    } else {
      fprintf(stderr, "moejit: unexpected argument '%s'\n", argv[i]);
      return CLI_EXIT_USAGE;
    }
  }
  if (!sub) {
    cache_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  if (!strcmp(sub, "stats")) return do_stats(dir, json);
  if (!strcmp(sub, "list")) return do_list(dir, json);
  if (!strcmp(sub, "verify")) return do_verify(dir, fix, json);
  if (!strcmp(sub, "prune")) return do_prune(dir, max_size, json);
  if (!strcmp(sub, "clear")) return do_clear(dir, json);
  fprintf(stderr, "moejit: unknown cache command '%s' (stats, list, verify, prune, clear)\n", sub);
  return CLI_EXIT_USAGE;
}
