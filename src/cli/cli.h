/* Shared pieces of the moejit command-line tool: exit codes, option
 * parsing, spec loading from a path or preset name, JSON output. The CLI
 * uses only the public API (it links the shared library). */
#ifndef MOEJIT_CLI_H
#define MOEJIT_CLI_H

#include <stdio.h>

#include "moejit/moejit.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_FAILURE = 1, CLI_EXIT_USAGE = 2 };

/* Walks argv: returns 1 and sets *value when argv[*i] is `--name VALUE` or
 * `--name=VALUE` (advancing *i past the value). A missing or empty value
 * prints a usage error and sets *bad. */
int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **value, int *bad);
/* 1 when argv[*i] is the flag `--name`. */
int cli_flag(char **argv, int i, const char *name);
/* Parses a positive int option value or prints an error (returns 0). */
int cli_parse_int(const char *opt, const char *text, int lo, int hi, int *out);
/* An argument no option took: an unknown "-..." option, else the CONFIG
 * positional (stored in *config; a second one is refused). Returns 0 or
 * CLI_EXIT_USAGE after saying why; `cmd` names the command for --help. */
int cli_positional(const char *arg, const char **config, const char *cmd);

/* Loads a spec from a YAML path, or from an embedded preset when `preset`
 * is set or `arg` names one; NULL both: the default preset. Prints the
 * library's message and returns the exit code (0 on success). */
int cli_load_spec(const char *arg, const char *preset, moejit_spec *spec);

/* Prints a library failure: "moejit: <status>: <message>", returns the
 * exit code for it (2 for config/usage-type errors, 1 otherwise). */
int cli_fail(moejit_status st, const char *what);
/* That exit code alone (0 for MOEJIT_OK). */
int cli_exit_code(moejit_status st);
/* --arch ARCH (not auto) checked against the spec as its config's
 * target.arch would be: the allowed archs and the rules that depend on the
 * arch (clusters need sm_90). Prints the reason; 0 or CLI_EXIT_USAGE. */
int cli_check_arch(const moejit_spec *spec, const char *arch);

/* What moejit_model_load_config takes for `--preset NAME` ("preset:NAME",
 * never a file of that name in the working directory, written into buf)
 * or for a CONFIG argument (itself). */
const char *cli_model_name(const char *preset, const char *config, char *buf, size_t cap);

/* JSON string with escapes. */
void cli_json_str(FILE *f, const char *s);
/* {"kernels":N,"cache_hits":...,"configs":[...]} of a load report, no newline. */
void cli_print_load_json(const moejit_load_report *r);
/* One kernel row of a load report: family, [hit/miss,] config, source:
 * detail [tuned kernels]. */
void cli_print_load_row(const moejit_load_kernel *k, int show_cache);

int cli_compile(int argc, char **argv);
int cli_gen(int argc, char **argv);
int cli_cache(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_tune(int argc, char **argv);

#endif
