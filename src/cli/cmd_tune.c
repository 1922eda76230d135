/* `moejit tune SWEEP`: runs an autotuning sweep through moejit_tune_run and
 * renders its progress (a bar on a terminal, plain lines otherwise), the
 * pruning and compile counts, and the speedup of the tuned tiles over the
 * heuristic. Without a GPU it compiles the candidates (cache warming). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/tune_check.h"

static void tune_usage(FILE *f) {
  fprintf(
      f,
      "usage: moejit tune SWEEP [options]\n"
      "\n"
      "Autotunes the grouped GEMMs (gemm1 + SwiGLU, gemm2): enumerates the sweep's tile\n"
      "spaces, prunes what cannot run (shared memory, registers, divisibility, identical\n"
      "launch plans), compiles the rest in parallel through the cache, checks each\n"
      "candidate against a float64 reference and times it (CUDA events, median), then\n"
      "writes the winners to a tuned table that model loading reads, and every\n"
      "candidate's time to results.csv / results.json / chart.svg.\n"
      "Resumable: candidates measured by an earlier run in the same results dir on\n"
      "the same GPU are not timed again, and compiled kernels come from the cache.\n"
      "Without a GPU it compiles every candidate (cache warming), says timing needs a\n"
      "GPU and exits 0.\n"
      "\n"
      "SWEEP is a sweep YAML file or the name of one in configs/sweeps/ (e.g. smoke,\n"
      "h100-presets); format: docs/tune.md.\n"
      "\n"
      "options:\n"
      "  --model CONFIG        tune this model's shape instead of the sweep's shapes: a\n"
      "                        config file or a preset name; repeat it for several\n"
      "                        (up to %d); its kernels: tiles are the heuristic the\n"
      "                        winners are measured against\n"
      "  --out FILE            tuned table to write or merge into\n"
      "                        (default configs/tuned/<GPU name>.yaml)\n"
      "  --results DIR         results directory (default tune-out/<sweep name>, with\n"
      "                        --model tune-out/<sweep name>-<first model's name>)\n"
      "  --jobs N              compile threads (default: all CPUs)\n"
      "  --budget-seconds S    start no new timing after S seconds; what finished is\n"
      "                        written, a re-run resumes the rest\n"
      "  --warmup N            warm-up launches per candidate (default: the sweep's, 3)\n"
      "  --iters N             timed launches per candidate, median kept (default: the sweep's)\n"
      "  --arch ARCH           target arch when compiling without a GPU (default: the sweep's)\n"
      "  --compile-only        compile (warm the cache) even when a GPU is present\n"
      "  --dry-run             count and prune the candidates; compile nothing\n"
      "  --no-table            write results, but no tuned table\n"
      "  --keep-within PCT     keep a table entry's configuration where this run timed\n"
      "                        it within PCT percent of the winner (default 0: the\n"
      "                        winner always replaces it)\n"
      "  --replace-pinned      let this run's winners replace the table's pinned\n"
      "                        entries too (those a layer check pinned to the\n"
      "                        heuristic; kept by default; --check-layer replaces\n"
      "                        them and pins again where the layer still loses)\n"
      "  --runoff N            re-time each point's N fastest candidates, the built-in\n"
      "                        choice (and with --keep-within the table's entry) twice\n"
      "                        more, interleaved, and keep each one's median (default:\n"
      "                        the sweep's timing.runoff, 3; 0: no runoff)\n"
      "  --check-layer         then run each tuned model's whole layer with the new\n"
      "                        table and with tables off (graph replay, interleaved)\n"
      "                        at the sweep's token counts and between each two; where\n"
      "                        the table's layer is slower in two runs, the table\n"
      "                        holds the heuristic's plan at that T (a GPU and the\n"
      "                        table are needed)\n"
      "  --check-tolerance PCT how much slower counts as slower (default 1)\n"
      "  --check-between N     points checked between two token counts, evenly spaced\n"
      "                        in log scale (default 1: their geometric mean; up to %d)\n"
      "  --check-only          time no GEMMs: check the table --out FILE names as\n"
      "                        --check-layer would after a sweep, at the sweep's token\n"
      "                        counts and between them (its shapes, or each --model)\n"
      "  --json                print the summary as one JSON object (progress: stderr)\n"
      "\n"
      "exit codes: 0 ok (or no GPU), 1 runtime failure, 2 usage or sweep error\n",
      MOEJIT_TUNE_MAX_MODELS, CHECK_MAX_BETWEEN);
}

typedef struct tune_args {
  const char *sweep, *out, *results, *arch;
  const char *models[MOEJIT_TUNE_MAX_MODELS];
  int n_models;
  int jobs, warmup, iters, json, dry_run, compile_only, no_table, check_layer, check_only;
  int replace_pinned;
  int check_between;
  int runoff; /* -1: not given */
  double budget, keep_within, check_tolerance;
} tune_args;

/* A number in [lo, hi] (above lo when lo_open) for option opt; `what`
 * says what it should be when it is not. */
static int parse_real(const char *opt, const char *v, double lo, int lo_open, double hi,
                      const char *what, double *out) {
  char *end = NULL;
  double x = strtod(v, &end);
  if (!end || *end || end == v || !(lo_open ? x > lo : x >= lo) || x > hi) {
    fprintf(stderr, "moejit: %s: '%s' is not %s\n", opt, v, what);
    return 0;
  }
  *out = x;
  return 1;
}

static int parse_args(int argc, char **argv, tune_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int bad = 0, rc;
    if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return -1;
    if (cli_opt_value(argc, argv, &i, "--out", &a->out, &bad) ||
        cli_opt_value(argc, argv, &i, "--results", &a->results, &bad) ||
        cli_opt_value(argc, argv, &i, "--arch", &a->arch, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--model", &v, &bad)) {
      if (bad) return CLI_EXIT_USAGE;
      if (a->n_models == MOEJIT_TUNE_MAX_MODELS) {
        fprintf(stderr, "moejit: --model: at most %d models a run\n", MOEJIT_TUNE_MAX_MODELS);
        return CLI_EXIT_USAGE;
      }
      a->models[a->n_models++] = v;
    } else if (cli_opt_value(argc, argv, &i, "--jobs", &v, &bad)) {
      if (bad || !cli_parse_int("--jobs", v, 1, 256, &a->jobs)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--warmup", &v, &bad)) {
      if (bad || !cli_parse_int("--warmup", v, 1, 1000, &a->warmup)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--iters", &v, &bad)) {
      if (bad || !cli_parse_int("--iters", v, 1, 1000, &a->iters)) return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--budget-seconds", &v, &bad)) {
      if (bad ||
          !parse_real("--budget-seconds", v, 0, 1, 1e7, "a number of seconds > 0", &a->budget))
        return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--keep-within", &v, &bad)) {
      if (bad ||
          !parse_real("--keep-within", v, 0, 0, 100, "a percentage (0 to 100)", &a->keep_within))
        return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--runoff", &v, &bad)) {
      if (bad || !cli_parse_int("--runoff", v, 0, MOEJIT_TUNE_MAX_RUNOFF, &a->runoff))
        return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--check-tolerance", &v, &bad)) {
      if (bad || !parse_real("--check-tolerance", v, 0, 0, 100, "a percentage (0 to 100)",
                             &a->check_tolerance))
        return CLI_EXIT_USAGE;
    } else if (cli_opt_value(argc, argv, &i, "--check-between", &v, &bad)) {
      if (bad || !cli_parse_int("--check-between", v, 1, CHECK_MAX_BETWEEN, &a->check_between))
        return CLI_EXIT_USAGE;
    } else if (cli_flag(argv, i, "--replace-pinned")) {
      a->replace_pinned = 1;
    } else if (cli_flag(argv, i, "--check-layer")) {
      a->check_layer = 1;
    } else if (cli_flag(argv, i, "--check-only")) {
      a->check_layer = a->check_only = 1;
    } else if (cli_flag(argv, i, "--json")) {
      a->json = 1;
    } else if (cli_flag(argv, i, "--dry-run")) {
      a->dry_run = 1;
    } else if (cli_flag(argv, i, "--compile-only")) {
      a->compile_only = 1;
    } else if (cli_flag(argv, i, "--no-table")) {
      a->no_table = 1;
    } else if ((rc = cli_positional(argv[i], &a->sweep, "tune"))) {
      return rc;
    }
  }
  if (a->check_layer && (a->no_table || a->dry_run || a->compile_only)) {
    fprintf(stderr,
            "moejit: --check-layer times the layer with the table this run writes; leave out "
            "--no-table, --dry-run and --compile-only\n");
    return CLI_EXIT_USAGE;
  }
  if (a->replace_pinned && (a->no_table || a->check_only)) {
    fprintf(stderr, "moejit: --replace-pinned: %s writes no winners into a table; leave it out\n",
            a->no_table ? "--no-table" : "--check-only");
    return CLI_EXIT_USAGE;
  }
  if (a->check_only && !a->out) {
    fprintf(stderr, "moejit: --check-only checks the table --out FILE names; give it\n");
    return CLI_EXIT_USAGE;
  }
  if (!a->sweep) {
    fprintf(stderr,
            "moejit: tune needs a SWEEP (a YAML file or a name in configs/sweeps/; see "
            "moejit tune --help)\n");
    return CLI_EXIT_USAGE;
  }
  return 0;
}

/* ---- progress -------------------------------------------------------------- */

typedef struct progress {
  int tty;
  moejit_tune_phase phase; /* of the bar on screen */
  int bar_shown;
  int last_decile;
} progress;

static void clear_bar(progress *p) {
  if (p->tty && p->bar_shown) fprintf(stderr, "\r\033[K");
  p->bar_shown = 0;
}

static void draw_bar(progress *p, const moejit_tune_progress *e, const char *what) {
  char bar[31];
  size_t fill = e->total ? e->done * 30 / e->total : 30;
  for (size_t i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
  bar[30] = '\0';
  double rate = e->elapsed_s > 0 ? (double)e->done / e->elapsed_s : 0;
  fprintf(stderr, "\r\033[K%s [%s] %zu/%zu %5.1f/s %.40s", what, bar, e->done, e->total, rate,
          e->item);
  p->bar_shown = 1;
}

/* Plain lines: every tenth of a phase, and everything that went wrong. */
static void plain_line(progress *p, const moejit_tune_progress *e, const char *what) {
  int decile = e->total ? (int)(e->done * 10 / e->total) : 10;
  if (decile != p->last_decile || e->done == e->total)
    fprintf(stderr, "%s: %zu/%zu (%.0f s)\n", what, e->done, e->total, e->elapsed_s);
  p->last_decile = decile;
}

static void on_progress(const moejit_tune_progress *e, void *user) {
  progress *p = user;
  const char *what = e->phase == MOEJIT_TUNE_PHASE_COMPILE ? "compile" : "time";
  if (e->phase == MOEJIT_TUNE_PHASE_PLAN) return;
  if (e->phase != p->phase) clear_bar(p), p->phase = e->phase, p->last_decile = -1;
  int bad = !strcmp(e->status, "compile-failed") || !strcmp(e->status, "wrong") ||
            !strcmp(e->status, "failed");
  if (bad || e->phase == MOEJIT_TUNE_PHASE_GROUP) clear_bar(p);
  if (bad)
    fprintf(stderr, "  %s: %s%s%.200s\n", e->status, e->item, *e->message ? ": " : "", e->message);
  if (e->phase == MOEJIT_TUNE_PHASE_GROUP) {
    if (e->us > 0 && e->heuristic_us > 0)
      fprintf(stderr, "  %s: best %.1f us, heuristic %.1f us (%.2fx)\n", e->item, e->us,
              e->heuristic_us, e->heuristic_us / e->us);
    else if (e->us > 0)
      fprintf(stderr, "  %s: best %.1f us\n", e->item, e->us);
    else
      fprintf(stderr, "  %s: no candidate passed\n", e->item);
    return;
  }
  if (p->tty)
    draw_bar(p, e, what);
  else
    plain_line(p, e, what);
}

/* ---- summary ---------------------------------------------------------------- */

static void print_plan(const moejit_tune_summary *s) {
  printf("plan: %zu candidates spanned, %zu pruned before compiling", s->enumerated, s->pruned);
  printf(s->n_prune_reasons ? ":\n" : "\n");
  for (size_t i = 0; i < s->n_prune_reasons; i++)
    printf("  %6zu  %s\n", s->prune_reasons[i].count, s->prune_reasons[i].reason);
  printf(
      "  %zu candidates left, %zu points (candidate x token count, heuristic baselines "
      "included)\n",
      s->candidates, s->points);
}

static void print_compile(const moejit_tune_summary *s) {
  printf(
      "compile: %zu kernels (%zu from cache, %zu compiled, %zu failed) in %.1f s with %d "
      "jobs: %.2f kernels/s, %.2f compiled/s\n",
      s->kernels, s->cache_hits, s->compiled, s->compile_failed, s->compile_s, s->jobs,
      s->kernels_per_s, s->compiled_per_s);
}

static void print_speedups(const moejit_tune_summary *s) {
  if (!s->n_winners) return;
  printf("\ntuned vs heuristic (median us; heuristic = the shape's own tiles, path auto):\n");
  printf("%-16s %-6s %7s %11s %11s %8s %9s  %s\n", "shape", "kernel", "T", "heuristic", "tuned",
         "speedup", "TFLOP/s", "tuned config");
  for (size_t i = 0; i < s->n_winners; i++) {
    const moejit_tune_winner *w = &s->winners[i];
    char cfg[64] = "", speed[16] = "-", heur[16] = "-";
    if (w->path != MOEJIT_GEMM_PATH_GEMV)
      moejit_gemm_cfg_text(&w->cfg, cfg, sizeof cfg); /* gemv: no tile */
    if (w->heuristic_us > 0) {
      snprintf(speed, sizeof speed, "%.2fx", w->heuristic_us / w->us);
      snprintf(heur, sizeof heur, "%.1f", w->heuristic_us);
    }
    printf("%-16s %-6s %7lld %11s %11.1f %8s %9.1f  %s%s%s\n", w->shape, w->kernel,
           (long long)w->tokens, heur, w->us, speed, w->tflops, cfg, cfg[0] ? " " : "",
           moejit_gemm_path_name(w->path));
  }
}

static void print_summary(const moejit_tune_summary *s, const tune_args *a, const char *no_gpu) {
  printf("sweep %s%s%s (%s)\n", s->sweep, s->device[0] ? " on " : "", s->device, s->arch);
  print_plan(s);
  if (a->dry_run) return;
  print_compile(s);
  if (!s->timed && a->compile_only) {
    printf("compile only (--compile-only): nothing was timed; the cache is warm.\n");
    return;
  }
  if (!s->timed) {
    printf(
        "no GPU, so nothing was timed: %s\ntiming needs a GPU; the cache is now warm, so a "
        "run there with the same cache compiles nothing.\n",
        no_gpu ? no_gpu : "");
    return;
  }
  printf(
      "timing: %zu measured, %zu resumed, %zu wrong, %zu failed, %zu skipped (budget), %zu "
      "runoff timings in %.1f s; whole run %.1f s\n",
      s->measured, s->resumed, s->wrong, s->failed, s->skipped_budget, s->runoff_timed, s->time_s,
      s->total_s);
  if (s->stop_reason[0]) printf("stopped early: %s\n", s->stop_reason);
  print_speedups(s);
  printf("\nresults: %s/results.csv, results.json, chart.svg\n", s->results_dir);
  if (s->table_path[0])
    printf(
        "tuned table: %s (%zu entries from this run, %zu of them kept their configuration: "
        "within --keep-within of the winner); model loading reads it from "
        "$MOEJIT_TUNED_DIR, or embedded after a rebuild\n",
        s->table_path, s->table_entries, s->table_kept);
  if (s->table_pinned_kept)
    printf(
        "%zu point(s) kept the table's pinned entry (a layer check pinned the heuristic "
        "there); --replace-pinned or --check-layer lets a winner replace it\n",
        s->table_pinned_kept);
}

static void json_reasons(const moejit_tune_summary *s) {
  printf("\"prune_reasons\":[");
  for (size_t i = 0; i < s->n_prune_reasons; i++) {
    printf("%s{\"reason\":", i ? "," : "");
    cli_json_str(stdout, s->prune_reasons[i].reason);
    printf(",\"count\":%zu}", s->prune_reasons[i].count);
  }
  printf("],");
}

static void json_winners(const moejit_tune_summary *s) {
  printf("\"winners\":[");
  for (size_t i = 0; i < s->n_winners; i++) {
    const moejit_tune_winner *w = &s->winners[i];
    printf("%s{\"shape\":", i ? "," : "");
    cli_json_str(stdout, w->shape);
    printf(
        ",\"kernel\":\"%s\",\"tokens\":%lld,\"path\":\"%s\",\"tile_m\":%d,\"tile_n\":%d,"
        "\"tile_k\":%d,\"stages\":%d,\"warps\":%d,\"cluster_m\":%d,\"cluster_n\":%d,"
        "\"raster\":\"%s\",\"schedule\":\"%s\",\"us\":%.3f,\"heuristic_us\":%.3f,"
        "\"tflops\":%.2f}",
        w->kernel, (long long)w->tokens, moejit_gemm_path_name(w->path), w->cfg.tile_m,
        w->cfg.tile_n, w->cfg.tile_k, w->cfg.stages, w->cfg.warps, w->cfg.cluster_m,
        w->cfg.cluster_n, w->cfg.raster == MOEJIT_RASTER_ALONG_N ? "along_n" : "along_m",
        moejit_gemm_schedule_name(w->cfg.schedule), w->us, w->heuristic_us, w->tflops);
  }
  printf("]");
}

static void print_json(const moejit_tune_summary *s, moejit_status st, const tune_check *check) {
  printf("{\"sweep\":");
  cli_json_str(stdout, s->sweep);
  printf(",\"device\":");
  cli_json_str(stdout, s->device);
  printf(",\"arch\":");
  cli_json_str(stdout, s->arch);
  printf(",\"ok\":%s,\"timed\":%s,\"enumerated\":%zu,\"pruned\":%zu,", st ? "false" : "true",
         s->timed ? "true" : "false", s->enumerated, s->pruned);
  json_reasons(s);
  printf(
      "\"candidates\":%zu,\"points\":%zu,\"kernels\":%zu,\"cache_hits\":%zu,\"compiled\":%zu,"
      "\"compile_failed\":%zu,\"compile_s\":%.3f,\"kernels_per_s\":%.3f,\"compiled_per_s\":%.3f,"
      "\"jobs\":%d,\"measured\":%zu,\"resumed\":%zu,\"wrong\":%zu,\"failed\":%zu,"
      "\"skipped_budget\":%zu,\"runoff_timed\":%zu,\"time_s\":%.3f,\"total_s\":%.3f,"
      "\"stop_reason\":",
      s->candidates, s->points, s->kernels, s->cache_hits, s->compiled, s->compile_failed,
      s->compile_s, s->kernels_per_s, s->compiled_per_s, s->jobs, s->measured, s->resumed, s->wrong,
      s->failed, s->skipped_budget, s->runoff_timed, s->time_s, s->total_s);
  cli_json_str(stdout, s->stop_reason);
  printf(",\"results_dir\":");
  cli_json_str(stdout, s->results_dir);
  printf(",\"table_path\":");
  cli_json_str(stdout, s->table_path);
  printf(",\"table_entries\":%zu,\"table_kept\":%zu,\"table_pinned_kept\":%zu,", s->table_entries,
         s->table_kept, s->table_pinned_kept);
  json_winners(s);
  if (check) {
    printf(",\"layer_check\":");
    tune_check_print_json(check);
  }
  printf("}\n");
}

/* ---- the command ------------------------------------------------------------- */

/* A ctx when a GPU is usable; NULL with *why set when there is none (the
 * run then compiles only). Other failures are reported (returns nonzero). */
static int open_gpu(const tune_args *a, moejit_ctx **ctx, char *why, size_t cap) {
  *ctx = NULL;
  if (a->dry_run || a->compile_only) return 0;
  moejit_ctx_opts o;
  moejit_ctx_opts_init(&o);
  o.compiler.jobs = a->jobs;
  moejit_status st = moejit_ctx_create(ctx, &o);
  if (st == MOEJIT_ERR_NO_DRIVER || st == MOEJIT_ERR_NO_DEVICE) {
    snprintf(why, cap, "%s", moejit_last_error());
    return 0;
  }
  return st ? cli_fail(st, "cannot open the GPU") : 0;
}

/* --model: the sweep tunes these models' shapes; unless --results names
 * one, their results go to tune-out/<sweep>-<first model> (not the sweep's
 * own dir, whose results.csv a later run of the whole sweep resumes). */
static int use_models(tune_args *a, moejit_sweep *sweep, char *results, size_t cap) {
  moejit_spec *specs = calloc((size_t)a->n_models, sizeof *specs);
  if (!specs) return cli_fail(MOEJIT_ERR_OUT_OF_MEMORY, "--model");
  int rc = 0;
  for (int i = 0; i < a->n_models && !rc; i++) rc = cli_load_spec(a->models[i], NULL, &specs[i]);
  moejit_status st = rc ? MOEJIT_OK : moejit_sweep_set_shapes(sweep, specs, a->n_models);
  if (st) {
    fprintf(stderr, "moejit: --model: %s\n", moejit_last_error());
    rc = CLI_EXIT_USAGE;
  }
  for (int i = 0; !rc && !a->json && i < a->n_models; i++)
    printf("%s %s (%s d=%lld f=%lld E=%d k=%d)\n", i ? "      " : "model:", specs[i].name,
           moejit_dtype_name(specs[i].act_dtype), (long long)specs[i].hidden,
           (long long)specs[i].expert_width, (int)specs[i].experts, (int)specs[i].top_k);
  if (!rc && !a->results) {
    if (snprintf(results, cap, "tune-out/%s-%s", moejit_sweep_name(sweep), specs[0].name) >=
        (int)cap) {
      fprintf(stderr, "moejit: --model: the results path is too long; give --results\n");
      rc = CLI_EXIT_USAGE;
    }
    a->results = results;
  }
  free(specs);
  return rc;
}

/* The layer check of `table` with the options given. */
static tune_check check_of(const tune_args *a, const char *table) {
  tune_check c = {.table = table,
                  .iters = a->iters ? a->iters : 20,
                  .between = a->check_between,
                  .tolerance_pct = a->check_tolerance};
  return c;
}

/* The check's failure as the exit code (0 when it passed). */
static int check_rc(const tune_check *check) {
  if (!check->failed) return 0;
  fprintf(stderr, "moejit: --check-layer: %s\n",
          check->error[0] ? check->error : "the layer's check failed (see the table)");
  return CLI_EXIT_FAILURE;
}

/* --check-only: the layer check of the table --out names, at the sweep's
 * token counts; no GEMM is timed alone. */
static int check_only(const tune_args *a, const moejit_sweep *sweep) {
  struct stat sb;
  FILE *f = stat(a->out, &sb) == 0 && S_ISREG(sb.st_mode) ? fopen(a->out, "rb") : NULL;
  if (!f) { /* a directory opens for reading too */
    fprintf(stderr, "moejit: --check-only: cannot read the table %s (not a readable file)\n",
            a->out);
    return CLI_EXIT_FAILURE;
  }
  fclose(f);
  int devices = 0;
  const moejit_status st = moejit_device_count(&devices);
  if (st != MOEJIT_OK || devices == 0) {
    fprintf(stderr, "moejit: --check-only runs the layer, which needs a GPU: %s\n",
            st != MOEJIT_OK ? moejit_last_error() : "the CUDA driver reports no device");
    return CLI_EXIT_FAILURE;
  }
  int64_t tokens[CHECK_MAX_BUCKETS];
  const size_t n = moejit_sweep_tokens(sweep, tokens, CHECK_MAX_BUCKETS);
  tune_check check = check_of(a, a->out);
  check.tokens = tokens, check.n_tokens = n < CHECK_MAX_BUCKETS ? (int)n : CHECK_MAX_BUCKETS;
  int rc = tune_check_layer(&check, NULL, sweep);
  if (a->json) {
    printf("{\"sweep\":");
    cli_json_str(stdout, moejit_sweep_name(sweep));
    printf(",\"check_only\":true,\"layer_check\":");
    tune_check_print_json(&check);
    printf("}\n");
  } else {
    tune_check_print_text(&check);
  }
  if (!rc) rc = check_rc(&check);
  tune_check_free(&check);
  return rc;
}

int cli_tune(int argc, char **argv) {
  tune_args a = {.runoff = -1, .check_tolerance = 1, .check_between = 1};
  int rc = parse_args(argc, argv, &a);
  if (rc == -1) return tune_usage(stdout), CLI_EXIT_OK;
  if (rc) return rc;
  char path[4096];
  moejit_sweep *sweep = NULL;
  moejit_status st = moejit_sweep_find(a.sweep, path, sizeof path);
  if (!st) st = moejit_sweep_load_file(path, &sweep);
  if (st) {
    fprintf(stderr, "moejit: %s\n", moejit_last_error());
    return st == MOEJIT_ERR_IO ? CLI_EXIT_FAILURE : CLI_EXIT_USAGE;
  }
  char results[4096];
  if (a.n_models && (rc = use_models(&a, sweep, results, sizeof results)))
    return moejit_sweep_destroy(sweep), rc;
  if (a.check_only) {
    rc = check_only(&a, sweep);
    moejit_sweep_destroy(sweep);
    return rc;
  }
  moejit_ctx *ctx = NULL;
  char why[2048] = "";
  if ((rc = open_gpu(&a, &ctx, why, sizeof why))) return moejit_sweep_destroy(sweep), rc;
  if (!ctx && !a.dry_run && !a.compile_only)
    fprintf(stderr,
            "moejit: no GPU: %s\nmoejit: compiling the candidates only (cache warming); "
            "timing needs a GPU\n",
            why);
  progress p = {.tty = isatty(2), .phase = MOEJIT_TUNE_PHASE_PLAN, .last_decile = -1};
  moejit_tune_opts o;
  moejit_tune_opts_init(&o);
  o.out_table = a.out, o.results_dir = a.results, o.jobs = a.jobs, o.budget_seconds = a.budget;
  o.keep_within = a.keep_within;
  o.replace_pinned = a.replace_pinned || a.check_layer; /* the check pins again */
  o.runoff = a.runoff < 0 ? 0 : a.runoff == 0 ? -1 : a.runoff;
  o.warmup = a.warmup, o.iters = a.iters, o.arch = a.arch, o.dry_run = a.dry_run;
  o.no_table = a.no_table, o.progress = on_progress, o.progress_user = &p;
  moejit_tune_summary s;
  st = moejit_tune_run(ctx, sweep, &o, &s);
  clear_bar(&p);
  const int timed = ctx != NULL;
  moejit_ctx_destroy(ctx); /* the layer check makes its own */
  tune_check check = check_of(&a, s.table_path);
  const int checking = !st && a.check_layer && timed && s.table_path[0];
  if (checking) rc = tune_check_layer(&check, &s, sweep);
  if (a.json)
    print_json(&s, st, checking ? &check : NULL);
  else if (!st || s.enumerated) /* a run that failed before planning has nothing to sum up */
    print_summary(&s, &a, timed ? NULL : why);
  if (checking && !a.json) tune_check_print_text(&check);
  if (a.check_layer && !timed && !a.json) printf("--check-layer: nothing to check without a GPU\n");
  if (st) rc = cli_fail(st, "tuning failed");
  if (!rc) rc = check_rc(&check);
  tune_check_free(&check);
  moejit_tune_summary_free(&s);
  moejit_sweep_destroy(sweep);
  return rc;
}
