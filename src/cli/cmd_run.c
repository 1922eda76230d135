/* `moejit run`: loads a model's whole MoE layer (cold, then warm), runs it
 * on pseudo-random inputs, checks sampled tokens against a float64
 * reference, and times it eager and graph-replayed against its floor.
 * Without a GPU it compiles every kernel instead and says nothing ran. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/run_data.h"
#include "cli/run_gpu.h"

#define MAX_TOKEN_COUNTS 16
#define MAX_REPORTS 64

static const int64_t default_tokens[] = {1, 32, 256, 2048, 16384};

static void run_usage(FILE *f) {
  fprintf(f,
          "usage: moejit run [CONFIG | --preset NAME] [options]\n"
          "\n"
          "Loads the model's whole MoE layer (every kernel compiled in parallel, cached),\n"
          "runs it on random inputs, checks sampled tokens against a float64 CPU\n"
          "reference, and times it eager and CUDA-graph-replayed (each timed run from a\n"
          "cold L2, as in a model) against its floor\n"
          "max(GEMM FLOPs / 750 TFLOP/s, bytes / 3.0 TB/s), an H100's ceilings unless\n"
          "--ceilings gives this GPU's. With no CONFIG, the embedded default preset\n"
          "(%s). Without a GPU it compiles every kernel for the target arch\n"
          "instead, says so and exits 0.\n"
          "\n"
          "options:\n"
          "  --preset NAME      an embedded preset instead of a file\n"
          "  --tokens LIST      token counts, e.g. 1,32,256 (default 1,32,256,2048,16384)\n"
          "  --iters N          timed runs per point, median reported (default 20)\n"
          "  --ceilings F,B     the floor's ceilings: dense GEMM TFLOP/s and read TB/s this\n"
          "                     GPU reaches (default 750,3.0, measured on an H100 80GB HBM3)\n"
          "  --flush MODE       how L2 is emptied before each timed run: demote (default:\n"
          "                     first demotes the lines stored with the evict_last policy,\n"
          "                     then reads twice the L2's size) or plain (the reads alone,\n"
          "                     as a model's other kernels between two calls would leave it)\n"
          "  --vs-heuristic     also load the layer with tuned tables off and time its graph\n"
          "                     replay beside the tuned one, interleaved: a tuned table's\n"
          "                     gain (or loss) in the whole layer, per T\n"
          "  --tuned-table FILE load the layer with this tuned table (e.g. one moejit tune\n"
          "                     just wrote) instead of this GPU's; with --vs-heuristic,\n"
          "                     what it gains or loses in the whole layer before it is\n"
          "                     installed\n"
          "  --gate-weight      route from a random router weight [E, d] instead of\n"
          "                     given logits: the layer computes the logits first\n"
          "                     (moejit_router_logits, timed with the layer) and the check\n"
          "                     compares them with float64 too\n"
          "  --cache-dir DIR    cache directory (default: $MOEJIT_CACHE_DIR, config, XDG/HOME)\n"
          "  --json             print one JSON object instead of tables\n"
          "\n"
          "expert parallelism (docs/ep.md; needs NCCL):\n"
          "  --ep N             spread the experts over N ranks, one process per GPU: starts\n"
          "                     N ranks on this machine (rank r on GPU r), checks each\n"
          "                     against the one-GPU layer and float64, and times it beside\n"
          "                     the one-GPU layer and NCCL's own all-to-all\n"
          "  --ep-rank R        run only rank R (ranks on several machines), with:\n"
          "  --ep-id-file PATH  where rank 0 writes the NCCL id and the others read it (a\n"
          "                     fresh path on a file system all ranks share)\n"
          "  --ep-device D      this rank's GPU (default: R modulo the GPU count)\n"
          "  --ep-route MODE    uniform (default), one-rank (every token's experts on rank\n"
          "                     0) or idle-rank (the last rank has no tokens)\n"
          "  --ep-timeout S     a rank whose peers have not all joined S seconds after it\n"
          "                     did, or whose exchanges make no progress for S seconds (a\n"
          "                     peer died or hangs), gives up (aborting its communicator)\n"
          "                     and exits 1 (default %d; 0: wait for ever)\n"
          "  --ep-nonblocking-comm\n"
          "                     make the communicator nonblocking (NCCL 2.14 or newer): the\n"
          "                     first connection to a peer and the teardown give up after\n"
          "                     --ep-timeout too (about 0.19 ms more an exact forward)\n"
          "\n"
          "exit codes: 0 ok (or no GPU), 1 runtime or check failure, 2 usage or config error\n",
          moejit_default_preset(), RUN_EP_TIMEOUT_S);
}

static int parse_tokens(const char *text, run_args *a) {
  const char *p = text;
  a->n_tokens = 0;
  while (*p) {
    char *end = NULL;
    /* digits only: strtoll would also take " 5", "+5"; and no trailing comma */
    long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : 0;
    if (!end || end == p || v < 1 || v > (1LL << 24) || (*end && *end != ',') ||
        (*end == ',' && !end[1]) || a->n_tokens == MAX_TOKEN_COUNTS) {
      fprintf(stderr,
              "moejit: --tokens: '%s' is not a list of at most %d token counts in 1..%lld "
              "(e.g. 1,32,256)\n",
              text, MAX_TOKEN_COUNTS, 1LL << 24);
      return 0;
    }
    a->tokens[a->n_tokens++] = v;
    p = *end ? end + 1 : end;
  }
  return a->n_tokens > 0 || (fprintf(stderr, "moejit: --tokens is empty\n"), 0);
}

/* "F,B": TFLOP/s in (0, 100000], TB/s in (0, 1000]. */
static int parse_ceilings(const char *text, run_args *a) {
  char *end = NULL, *end2 = NULL;
  const double f = strtod(text, &end);
  const double b = end != text && *end == ',' ? strtod(end + 1, &end2) : NAN;
  /* At least 0.001 each: a floor divided by a denormal would print inf. */
  if (!(f >= 1e-3 && f <= 1e5) || !(b >= 1e-3 && b <= 1e3) || end2 == end + 1 || (end2 && *end2) ||
      strpbrk(text, "xX")) {
    fprintf(stderr,
            "moejit: --ceilings: '%s' is not TFLOPS,TBPS (e.g. 750,3.0: the dense GEMM rate "
            "in TFLOP/s, 0.001 to 100000, and the read rate in TB/s, 0.001 to 1000, that this "
            "GPU reaches)\n",
            text);
    return 0;
  }
  a->ceil_tflops = f, a->ceil_tbps = b, a->ceilings_given = 1;
  return 1;
}

static int parse_args(int argc, char **argv, run_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int bad = 0, rc;
    if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return -1;
    if (cli_opt_value(argc, argv, &i, "--preset", &a->preset, &bad) ||
        cli_opt_value(argc, argv, &i, "--cache-dir", &a->cache_dir, &bad) ||
        cli_opt_value(argc, argv, &i, "--tuned-table", &a->tuned_table, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--tokens", &v, &bad)) {
      if (bad || !parse_tokens(v, a)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--iters", &v, &bad)) {
      if (bad || !cli_parse_int("--iters", v, 1, 100000, &a->iters)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--ceilings", &v, &bad)) {
      if (bad || !parse_ceilings(v, a)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--flush", &v, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
      if (strcmp(v, "demote") && strcmp(v, "plain")) {
        fprintf(stderr, "moejit: --flush '%s' (allowed: demote, plain)\n", v);
        return CLI_EXIT_USAGE;
      }
      a->flush_plain = strcmp(v, "plain") == 0;
    } else if (cli_opt_value(argc, argv, &i, "--ep", &v, &bad)) {
      if (bad || !cli_parse_int("--ep", v, 1, MOEJIT_EP_MAX_WORLD, &a->ep)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--ep-rank", &v, &bad)) {
      if (bad || !cli_parse_int("--ep-rank", v, 0, MOEJIT_EP_MAX_WORLD - 1, &a->ep_rank))
        return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--ep-timeout", &v, &bad)) {
      if (bad || !cli_parse_int("--ep-timeout", v, 0, 86400, &a->ep_timeout_s))
        return CLI_EXIT_USAGE;
      a->ep_timeout_given = 1;
    } else if (cli_opt_value(argc, argv, &i, "--ep-device", &v, &bad)) {
      if (bad || !cli_parse_int("--ep-device", v, 0, 1023, &a->ep_device)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--ep-id-file", &a->ep_id_file, &bad) ||
               cli_opt_value(argc, argv, &i, "--ep-route", &a->ep_route, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
    } else if (cli_flag(argv, i, "--ep-nonblocking-comm")) {
      a->ep_nonblocking_comm = 1;
    } else if (cli_flag(argv, i, "--json")) {
      a->json = 1;
    } else if (cli_flag(argv, i, "--vs-heuristic")) {
      a->vs_heuristic = 1;
    } else if (cli_flag(argv, i, "--gate-weight")) {
      a->gate_weight = 1;
    } else if ((rc = cli_positional(argv[i], &a->config, "run"))) {
      return rc;
    }
  }
  if (a->ep && a->flush_plain) {
    fprintf(stderr, "moejit: --flush applies to the one-GPU run; leave it out with --ep\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep && a->tuned_table) {
    fprintf(stderr, "moejit: --tuned-table applies to the one-GPU run; leave it out with --ep\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep && a->ceilings_given) {
    fprintf(stderr, "moejit: --ceilings applies to the one-GPU run; leave it out with --ep\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep && a->gate_weight) {
    fprintf(stderr, "moejit: --gate-weight applies to the one-GPU run; leave it out with --ep\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep && a->vs_heuristic) {
    fprintf(stderr, "moejit: --vs-heuristic applies to the one-GPU run; leave it out with --ep\n");
    return CLI_EXIT_USAGE;
  }
  if (!a->ep && (a->ep_rank >= 0 || a->ep_id_file || a->ep_route || a->ep_device >= 0 ||
                 a->ep_timeout_given || a->ep_nonblocking_comm)) {
    fprintf(stderr,
            "moejit: --ep-rank, --ep-id-file, --ep-device, --ep-route, --ep-timeout and "
            "--ep-nonblocking-comm need --ep N\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep_rank >= a->ep && a->ep) {
    fprintf(stderr, "moejit: --ep-rank %d is outside 0..%d (--ep %d)\n", a->ep_rank, a->ep - 1,
            a->ep);
    return CLI_EXIT_USAGE;
  }
  if (a->ep_id_file && a->ep_rank < 0) {
    fprintf(stderr, "moejit: --ep-id-file goes with --ep-rank (the launcher makes its own)\n");
    return CLI_EXIT_USAGE;
  }
  struct stat sb;
  if (a->ep_rank == 0 && a->ep_id_file && lstat(a->ep_id_file, &sb) == 0) {
    /* an earlier run's id: ranks that read it would join a communicator
     * that no longer exists, and wait for ever */
    fprintf(stderr,
            "moejit: --ep-id-file %s exists already (an earlier run's?); rank 0 writes a fresh "
            "id there: remove it first, or name a new path for every run\n",
            a->ep_id_file);
    return CLI_EXIT_USAGE;
  }
  if (a->ep_device >= 0 && a->ep_rank < 0) {
    fprintf(stderr, "moejit: --ep-device goes with --ep-rank (the launcher puts rank r on GPU r)\n");
    return CLI_EXIT_USAGE;
  }
  if (a->ep_rank >= 0 && !a->ep_id_file) {
    fprintf(stderr,
            "moejit: --ep-rank needs --ep-id-file PATH (rank 0 writes the NCCL id there, the "
            "others read it)\n");
    return CLI_EXIT_USAGE;
  }
  if (!a->ep_route) a->ep_route = "uniform";
  if (strcmp(a->ep_route, "uniform") && strcmp(a->ep_route, "one-rank") &&
      strcmp(a->ep_route, "idle-rank")) {
    fprintf(stderr, "moejit: --ep-route '%s' (allowed: uniform, one-rank, idle-rank)\n",
            a->ep_route);
    return CLI_EXIT_USAGE;
  }
  if (!a->n_tokens) {
    a->n_tokens = (int)(sizeof default_tokens / sizeof default_tokens[0]);
    memcpy(a->tokens, default_tokens, sizeof default_tokens);
  }
  return 0;
}

/* ---- no GPU: compile everything for the target arch ---------------------- */

static const char *target_arch(const moejit_spec *s) {
  for (int i = 0; i < s->n_archs; i++)
    if (!strcmp(s->archs[i], "auto")) return "sm_90a"; /* no GPU to ask: the H100 we target */
  return NULL;                                         /* the config's archs */
}

/* What --tuned-table's prebuild did (without a GPU). */
typedef struct table_check {
  const char *path; /* NULL: no --tuned-table */
  moejit_status st;
  char error[1024];
  moejit_load_report report;
} table_check;

static void print_no_gpu_json(const moejit_spec *s, const char *why, const char *dir,
                              const moejit_kernel_report *r, size_t n, double ms, moejit_status st,
                              const table_check *t) {
  int hits = 0, failed = 0;
  for (size_t i = 0; i < n; i++) {
    hits += r[i].status == MOEJIT_OK && r[i].cache_hit;
    failed += r[i].status != MOEJIT_OK;
  }
  printf("{\"config\":");
  cli_json_str(stdout, s->name);
  printf(",\"gpu\":false,\"ran\":false,\"reason\":");
  cli_json_str(stdout, why);
  printf(",\"cache_dir\":");
  cli_json_str(stdout, dir);
  printf(",\"ms\":%.3f,\"cache_hits\":%d,\"compiled\":%d,\"failed\":%d,\"ok\":%s", ms, hits,
         (int)n - hits - failed, failed, st == MOEJIT_OK && t->st == MOEJIT_OK ? "true" : "false");
  if (t->path) {
    printf(",\"tuned_table\":{\"path\":");
    cli_json_str(stdout, t->path);
    printf(",\"ok\":%s", t->st == MOEJIT_OK ? "true" : "false");
    if (t->st) {
      printf(",\"error\":");
      cli_json_str(stdout, t->error);
    }
    printf("}");
  }
  printf(",\"kernels\":[");
  for (size_t i = 0; i < n; i++) {
    printf("%s{\"kernel\":", i ? "," : "");
    cli_json_str(stdout, r[i].kernel);
    printf(",\"arch\":");
    cli_json_str(stdout, r[i].arch);
    printf(",\"key\":");
    cli_json_str(stdout, r[i].key);
    printf(",\"cache_hit\":%s,\"ms\":%.3f,\"status\":", r[i].cache_hit ? "true" : "false", r[i].ms);
    cli_json_str(stdout, moejit_status_str(r[i].status));
    printf("}");
  }
  printf("]}\n");
}

static void print_no_gpu_text(const moejit_spec *s, const char *why, const char *dir,
                              const moejit_kernel_report *r, size_t n, double ms,
                              const table_check *t) {
  int hits = 0, failed = 0;
  printf("moejit run: no GPU, so nothing ran: %s\n", why);
  printf("Compiled every kernel of %s for the target arch instead (as moejit compile does):\n",
         s->name);
  printf("  %-10s %-8s %-32s %-6s %9s\n", "kernel", "arch", "key", "cache", "ms");
  for (size_t i = 0; i < n; i++) {
    hits += r[i].status == MOEJIT_OK && r[i].cache_hit;
    failed += r[i].status != MOEJIT_OK;
    printf("  %-10s %-8s %-32s %-6s %9.1f\n", r[i].kernel, r[i].arch, r[i].key,
           r[i].status      ? "FAIL"
           : r[i].cache_hit ? "hit"
                            : "miss",
           r[i].ms);
  }
  printf("%zu kernels, %d from cache, %d compiled, %d failed, %.0f ms; cache: %s\n", n, hits,
         (int)n - hits - failed, failed, ms, *dir ? dir : "(disabled)");
  printf("(these are the families' full modules; `moejit compile --device NAME` builds what a "
         "model load on that GPU builds)\n");
  const moejit_load_report *lr = &t->report;
  for (int i = 0; t->path && t->st == MOEJIT_OK && i < lr->n_kernels; i++)
    if (!strcmp(lr->kernels[i].config_source, "tuned"))
      printf("tuned table %s: %s %s, %d variant kernel%s built\n", t->path, lr->kernels[i].kernel,
             lr->kernels[i].config, lr->kernels[i].variants,
             lr->kernels[i].variants == 1 ? "" : "s");
}

/* --tuned-table without a GPU: builds what a load with that table builds
 * (its variants), so a table that does not parse fails here too. */
static void prebuild_table(const run_args *a, const moejit_spec *s, moejit_compiler *comp,
                           table_check *t) {
  moejit_load_opts o;
  moejit_load_opts_init(&o);
  t->path = a->tuned_table;
  o.tuned_table = a->tuned_table, o.report = &t->report;
  t->st = moejit_model_prebuild(comp, s, target_arch(s), NULL, &o);
  if (t->st) snprintf(t->error, sizeof t->error, "%s", moejit_last_error());
}

static int run_without_gpu(const run_args *a, const moejit_spec *s, const char *why) {
  moejit_compiler_opts opts;
  moejit_compiler_opts_init(&opts);
  opts.cache_dir = a->cache_dir;
  moejit_compiler *comp = NULL;
  moejit_status st = moejit_compiler_create(&comp, &opts);
  if (st) return cli_fail(st, "cannot create compiler");
  char dir[MOEJIT_PATH_MAX] = "";
  moejit_compiler_cache_dir(comp, s, dir, sizeof dir);
  moejit_kernel_report reports[MAX_REPORTS];
  size_t n = 0;
  double t0 = run_now_ms();
  st = moejit_compile(comp, s, target_arch(s), reports, MAX_REPORTS, &n);
  double ms = run_now_ms() - t0;
  if (n > MAX_REPORTS) n = MAX_REPORTS;
  if (st && n == 0) { /* nothing to show: no table, just why */
    int rc = cli_fail(st, "compile failed");
    moejit_compiler_destroy(comp);
    return rc;
  }
  table_check t = {0};
  if (!st && a->tuned_table) prebuild_table(a, s, comp, &t);
  if (a->json)
    print_no_gpu_json(s, why, dir, reports, n, ms, st, &t);
  else
    print_no_gpu_text(s, why, dir, reports, n, ms, &t);
  moejit_compiler_destroy(comp);
  if (st) {
    for (size_t i = 0; i < n; i++)
      if (reports[i].status)
        fprintf(stderr, "moejit: %s: %s\n", reports[i].kernel, reports[i].message);
    return CLI_EXIT_FAILURE;
  }
  if (t.st) {
    fprintf(stderr, "moejit: --tuned-table: %s: %s\n", moejit_status_str(t.st), t.error);
    return cli_exit_code(t.st);
  }
  return CLI_EXIT_OK;
}

int cli_run(int argc, char **argv) {
  run_args a = {.iters = 20,
                .ep_rank = -1,
                .ep_device = -1,
                .ep_timeout_s = RUN_EP_TIMEOUT_S,
                .ceil_tflops = RUN_CEIL_TFLOPS,
                .ceil_tbps = RUN_CEIL_TBPS};
  int rc = parse_args(argc, argv, &a);
  if (rc == -1) {
    run_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (rc) return rc;
  moejit_spec spec;
  if ((rc = cli_load_spec(a.config, a.preset, &spec))) return rc;
  if (a.ep && !strcmp(a.ep_route, "one-rank") && spec.experts / a.ep < spec.top_k) {
    /* rank 0 owns the first E / W experts */
    fprintf(stderr,
            "moejit: --ep-route one-rank puts every token's %d experts on rank 0, which owns %d "
            "of %s's %d experts at --ep %d; use --ep %d or fewer\n",
            spec.top_k, spec.experts / a.ep, spec.name, spec.experts, a.ep,
            spec.experts / spec.top_k);
    return CLI_EXIT_USAGE;
  }
  int devices = 0;
  moejit_status st = moejit_device_count(&devices);
  if (st != MOEJIT_OK || devices == 0) {
    char why[1024];
    snprintf(why, sizeof why, "%s",
             st != MOEJIT_OK ? moejit_last_error() : "the CUDA driver reports no device");
    if (a.ep_rank >= 0) { /* the other ranks would wait for this one */
      fprintf(stderr, "moejit: rank %d of --ep %d has no GPU: %s\n", a.ep_rank, a.ep, why);
      return CLI_EXIT_FAILURE;
    }
    return run_without_gpu(&a, &spec, why);
  }
  return a.ep ? run_ep(&a, &spec, argc, argv) : run_on_gpu(&a, &spec);
}
