/* moejit: the command-line tool. Dispatches to one file per command. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: moejit <command> [options]\n"
          "\n"
          "JIT-specialized CUDA kernels for Mixture-of-Experts layers.\n"
          "\n"
          "commands:\n"
          "  run [CONFIG | --preset NAME]       load, run, check and time the whole MoE layer\n"
          "  compile [CONFIG | --preset NAME]   generate and compile every kernel (no GPU needed)\n"
          "  gen [CONFIG | --preset NAME] --kernel NAME   print a kernel's generated CUDA source\n"
          "  cache stats|list|verify|prune|clear  inspect and maintain the cubin cache\n"
          "  tune SWEEP                         autotune the GEMM tiles of a sweep (docs/tune.md)\n"
          "  info                               driver, GPUs, NVRTC, NCCL and cache\n"
          "\n"
          "options:\n"
          "  --help       help for moejit or for a command (moejit compile --help)\n"
          "  --version    print the version\n"
          "\n"
          "CONFIG is a YAML file (docs/config.md) or a preset name; presets:");
  for (const char *const *p = moejit_preset_names(); *p; p++) fprintf(f, " %s", *p);
  fprintf(f, "\nexit codes: 0 ok, 1 runtime failure, 2 usage or config error\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return CLI_EXIT_OK;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    int maj = 0, min = 0;
    moejit_nvrtc_version(&maj, &min);
    printf("moejit %s (NVRTC %d.%d)\n", moejit_version_string(), maj, min);
    return CLI_EXIT_OK;
  }
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } commands[] = {{"run", cli_run},
                  {"compile", cli_compile},
                  {"gen", cli_gen},
                  {"cache", cli_cache},
                  {"info", cli_info},
                  {"tune", cli_tune}};
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "moejit: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return CLI_EXIT_USAGE;
}
