/* Option parsing, spec loading and JSON helpers shared by CLI commands. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

int cli_flag(char **argv, int i, const char *name) { return strcmp(argv[i], name) == 0; }

int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **value, int *bad) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
  } else if (a[n] != '\0') {
    return 0;
  } else if (*i + 1 >= argc) {
    fprintf(stderr, "moejit: option %s needs a value\n", name);
    *bad = 1;
    return 1;
  } else {
    *value = argv[++*i];
  }
  /* An empty value is never meant: `--cache-dir "$UNSET"` must not fall
   * back on the default cache (and `cache clear` then empty it). */
  if (!**value) {
    fprintf(stderr, "moejit: option %s needs a non-empty value\n", name);
    *bad = 1;
  }
  return 1;
}

int cli_parse_int(const char *opt, const char *text, int lo, int hi, int *out) {
  char *end = NULL;
  errno = 0;
  /* digits, or '-' and digits: strtol would take " 2" and "+2" too */
  const int digits =
      text[0] == '-' ? text[1] >= '0' && text[1] <= '9' : text[0] >= '0' && text[0] <= '9';
  long v = strtol(text, &end, 10);
  if (!digits || errno || !end || *end || end == text || v < lo || v > hi) {
    fprintf(stderr, "moejit: %s: '%s' is not an integer in %d..%d\n", opt, text, lo, hi);
    return 0;
  }
  *out = (int)v;
  return 1;
}

int cli_positional(const char *arg, const char **config, const char *cmd) {
  if (arg[0] == '-' && arg[1]) {
    fprintf(stderr, "moejit: unknown option '%s' (see moejit %s --help)\n", arg, cmd);
    return CLI_EXIT_USAGE;
  }
  if (*config) {
    fprintf(stderr, "moejit: more than one CONFIG given ('%s')\n", arg);
    return CLI_EXIT_USAGE;
  }
  *config = arg;
  return 0;
}

int cli_exit_code(moejit_status st) {
  if (st == MOEJIT_OK) return CLI_EXIT_OK;
  return (st == MOEJIT_ERR_CONFIG || st == MOEJIT_ERR_INVALID_ARGUMENT ||
          st == MOEJIT_ERR_NOT_FOUND)
             ? CLI_EXIT_USAGE
             : CLI_EXIT_FAILURE;
}

int cli_fail(moejit_status st, const char *what) {
  const char *msg = moejit_last_error();
  fprintf(stderr, "moejit: %s: %s%s%s\n", what, moejit_status_str(st), *msg ? ": " : "", msg);
  return cli_exit_code(st);
}

int cli_check_arch(const moejit_spec *spec, const char *arch) {
  if (!arch || !strcmp(arch, "auto")) return 0;
  if (moejit_spec_validate_arch(spec, arch) == MOEJIT_OK) return 0;
  fprintf(stderr, "moejit: --arch %s: %s\n", arch, moejit_last_error());
  return CLI_EXIT_USAGE;
}

const char *cli_model_name(const char *preset, const char *config, char *buf, size_t cap) {
  if (!preset) return config;
  snprintf(buf, cap, "preset:%s", preset);
  return buf;
}

static int is_preset(const char *name) {
  for (const char *const *p = moejit_preset_names(); *p; p++)
    if (!strcmp(*p, name)) return 1;
  return 0;
}

int cli_load_spec(const char *arg, const char *preset, moejit_spec *spec) {
  moejit_status st;
  if (preset && arg) {
    fprintf(stderr, "moejit: give a CONFIG file or --preset, not both\n");
    return CLI_EXIT_USAGE;
  }
  struct stat sb;
  if (arg && stat(arg, &sb) != 0 && is_preset(arg)) preset = arg, arg = NULL;
  if (arg) {
    st = moejit_spec_load_file(arg, spec);
  } else {
    const char *name = preset ? preset : moejit_default_preset();
    st = moejit_spec_load_preset(name, spec);
  }
  if (st != MOEJIT_OK) {
    fprintf(stderr, "moejit: %s\n", moejit_last_error());
    return st == MOEJIT_ERR_IO ? CLI_EXIT_FAILURE : CLI_EXIT_USAGE;
  }
  return CLI_EXIT_OK;
}

void cli_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
      case '"': fputs("\\\"", f); break;
      case '\\': fputs("\\\\", f); break;
      case '\n': fputs("\\n", f); break;
      case '\r': fputs("\\r", f); break;
      case '\t': fputs("\\t", f); break;
      default:
        if (*p < 0x20)
          fprintf(f, "\\u%04x", *p);
        else
          fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* A load report as one JSON object (moejit run, moejit compile --device). */
void cli_print_load_json(const moejit_load_report *r) {
  printf(
      "{\"kernels\":%d,\"cache_hits\":%d,\"cache_misses\":%d,\"compile_ms\":%.3f,"
      "\"load_ms\":%.3f,\"total_ms\":%.3f,\"configs\":[",
      r->n_kernels, r->cache_hits, r->cache_misses, r->compile_ms, r->load_ms, r->total_ms);
  for (int i = 0; i < r->n_kernels; i++) {
    printf("%s{\"kernel\":", i ? "," : "");
    cli_json_str(stdout, r->kernels[i].kernel);
    printf(",\"config\":");
    cli_json_str(stdout, r->kernels[i].config);
    printf(",\"source\":");
    cli_json_str(stdout, r->kernels[i].config_source);
    printf(",\"detail\":");
    cli_json_str(stdout, r->kernels[i].config_detail);
    printf(",\"tuned_kernels\":%d,\"tuned_kernels_cached\":%d", r->kernels[i].variants,
           r->kernels[i].variant_hits);
    printf(",\"cache_hit\":%s}", r->kernels[i].cache_hit ? "true" : "false");
  }
  printf("]}");
}

void cli_print_load_row(const moejit_load_kernel *k, int show_cache) {
  printf("  %-8s ", k->kernel);
  if (show_cache) printf("%-5s ", k->cache_hit ? "hit" : "miss");
  printf("%-22s %s: %s", k->config, k->config_source, k->config_detail);
  if (k->variants) printf(" [%d tuned kernels, %d from cache]", k->variants, k->variant_hits);
  printf("\n");
}
