/* `moejit info [--json]`: what this machine offers moejit — version, NVRTC
 * and its archs, the CUDA driver and each GPU, the cache directory. Runs
 * (and exits 0) without a driver or GPU, saying so. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dist/nccl.h" /* MJ_NCCL_NONBLOCKING_VERSION */

static void info_usage(FILE *f) {
  fprintf(f,
          "usage: moejit info [--json] [--cache-dir DIR]\n"
          "\n"
          "Prints the moejit and NVRTC versions, the archs NVRTC can target, the CUDA driver\n"
          "version and each GPU (name, compute capability, arch moejit compiles for, SMs,\n"
          "memory, shared memory, L2), the NCCL that expert parallelism would use and\n"
          "whether it makes nonblocking communicators (or why there is none), and the\n"
          "cache directory with its entries and size.\n"
          "Without a driver or GPU it says why and still exits 0 (compiling needs no GPU).\n"
          "\n"
          "options:\n"
          "  --json            one JSON object\n"
          "  --cache-dir DIR   cache directory to describe (default: $MOEJIT_CACHE_DIR, then\n"
          "                    $XDG_CACHE_HOME/moejit, then ~/.cache/moejit)\n");
}

/* Everything `info` reports, gathered first, printed by one of two writers. */
typedef struct info_report {
  int nvrtc_major, nvrtc_minor;
  char nvrtc_archs[512];
  int driver_ok, driver_version;
  int n_devices;
  moejit_device_info *devices; /* n_devices, or NULL */
  moejit_status *device_status;
  char **device_error;
  char no_gpu[2048]; /* why there is no GPU; "" when there is one */
  int cache_ok;
  moejit_cache_stats cache;
  char cache_dir[MOEJIT_PATH_MAX];
  char cache_error[1024];
  char nccl_version[32]; /* "2.28.9", or "" when not available */
  int nccl_nonblocking;  /* 2.14 or newer: opts.ep.nonblocking_comm works */
  char nccl_error[1024]; /* why not */
} info_report;

static char *dup_str(const char *s) {
  char *d = malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

static void gather_devices(info_report *r) {
  moejit_status st = moejit_driver_version(&r->driver_version);
  r->driver_ok = st == MOEJIT_OK;
  if (st == MOEJIT_OK) st = moejit_device_count(&r->n_devices);
  if (st != MOEJIT_OK) {
    r->n_devices = 0;
    snprintf(r->no_gpu, sizeof r->no_gpu, "%s", moejit_last_error());
    return;
  }
  if (r->n_devices == 0) {
    snprintf(r->no_gpu, sizeof r->no_gpu,
             "the CUDA driver reports no device; HINT: check nvidia-smi and "
             "CUDA_VISIBLE_DEVICES; compile-only use (moejit compile) still works");
    return;
  }
  r->devices = calloc((size_t)r->n_devices, sizeof *r->devices);
  r->device_status = calloc((size_t)r->n_devices, sizeof *r->device_status);
  r->device_error = calloc((size_t)r->n_devices, sizeof *r->device_error);
  if (!r->devices || !r->device_status || !r->device_error) {
    r->n_devices = 0;
    snprintf(r->no_gpu, sizeof r->no_gpu, "out of host memory");
    return;
  }
  for (int i = 0; i < r->n_devices; i++) {
    r->device_status[i] = moejit_device_query(i, &r->devices[i]);
    if (r->device_status[i] != MOEJIT_OK) r->device_error[i] = dup_str(moejit_last_error());
  }
}

static void gather_cache(info_report *r, const char *dir) {
  if (moejit_cache_resolve_dir(dir, r->cache_dir, sizeof r->cache_dir) != MOEJIT_OK) {
    snprintf(r->cache_error, sizeof r->cache_error, "%s", moejit_last_error());
    return;
  }
  if (moejit_cache_stats_get(r->cache_dir, &r->cache) == MOEJIT_OK)
    r->cache_ok = 1;
  else
    snprintf(r->cache_error, sizeof r->cache_error, "%s", moejit_last_error());
}

static void gather(info_report *r, const char *cache_dir) {
  memset(r, 0, sizeof *r);
  moejit_nvrtc_version(&r->nvrtc_major, &r->nvrtc_minor);
  if (moejit_nvrtc_archs(r->nvrtc_archs, sizeof r->nvrtc_archs) != MOEJIT_OK)
    snprintf(r->nvrtc_archs, sizeof r->nvrtc_archs, "?");
  gather_devices(r);
  gather_cache(r, cache_dir);
  int v = 0; /* NCCL's code: X*10000 + Y*100 + Z from 2.9, the oldest moejit takes */
  if (moejit_nccl_version(&v) == MOEJIT_OK) {
    r->nccl_nonblocking = v >= MJ_NCCL_NONBLOCKING_VERSION;
    snprintf(r->nccl_version, sizeof r->nccl_version, "%d.%d.%d", v / 10000, (v / 100) % 100,
             v % 100);
  } else {
    snprintf(r->nccl_error, sizeof r->nccl_error, "%s", moejit_last_error());
  }
}

static void report_free(info_report *r) {
  for (int i = 0; r->device_error && i < r->n_devices; i++) free(r->device_error[i]);
  free(r->device_error);
  free(r->device_status);
  free(r->devices);
}

static double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

static void print_text(const info_report *r) {
  printf("moejit %s\n", moejit_version_string());
  printf("NVRTC %d.%d, archs: %s\n", r->nvrtc_major, r->nvrtc_minor, r->nvrtc_archs);
  if (r->driver_ok)
    printf("CUDA driver %d.%d (%d)\n", r->driver_version / 1000, (r->driver_version % 1000) / 10,
           r->driver_version);
  else
    printf("CUDA driver: none\n");
  if (r->nccl_version[0])
    printf("NCCL %s (expert parallelism; nonblocking communicators: %s)\n", r->nccl_version,
           r->nccl_nonblocking ? "yes" : "no, they need 2.14 or newer");
  else
    printf("NCCL: none (expert parallelism only): %s\n", r->nccl_error);
  if (r->no_gpu[0]) printf("no GPU: %s\n", r->no_gpu);
  for (int i = 0; i < r->n_devices; i++) {
    const moejit_device_info *d = &r->devices[i];
    if (r->device_status[i] != MOEJIT_OK) {
      printf("GPU %d: query failed: %s\n", i, r->device_error[i] ? r->device_error[i] : "");
      continue;
    }
    printf("GPU %d: %s\n", i, d->name);
    printf("  compute capability %d.%d (moejit arch %s), %d SMs, %.1f GiB memory\n", d->cc_major,
           d->cc_minor, d->arch, d->sm_count, mib((double)d->total_mem) / 1024.0);
    printf("  shared memory %d KiB per block (opt-in), %d KiB per SM; L2 %.1f MiB; %s\n",
           d->smem_per_block_optin / 1024, d->smem_per_sm / 1024, mib(d->l2_bytes),
           d->memory_pools ? "stream-ordered allocation" : "no memory pools");
  }
  if (r->cache_ok)
    printf("cache: %s (%llu entries, %.1f MiB)\n", r->cache.dir,
           (unsigned long long)r->cache.entries, mib((double)r->cache.bytes));
  else
    printf("cache: %s (unavailable: %s)\n", r->cache_dir[0] ? r->cache_dir : "?", r->cache_error);
}

static void print_json_archs(const char *archs) {
  printf("[");
  const char *p = archs;
  for (int first = 1; *p;) {
    while (*p == ' ') p++;
    size_t n = strcspn(p, " ");
    if (n == 0) break;
    char one[MOEJIT_ARCH_MAX * 2];
    snprintf(one, sizeof one, "%.*s", (int)n, p);
    printf("%s", first ? "" : ",");
    cli_json_str(stdout, one);
    first = 0;
    p += n;
  }
  printf("]");
}

static void print_json_device(const moejit_device_info *d) {
  printf("{\"ordinal\":%d,\"name\":", d->ordinal);
  cli_json_str(stdout, d->name);
  printf(",\"cc\":\"%d.%d\",\"arch\":", d->cc_major, d->cc_minor);
  cli_json_str(stdout, d->arch);
  printf(
      ",\"sm_count\":%d,\"total_mem\":%llu,\"smem_per_block_optin\":%d,\"smem_per_sm\":%d,"
      "\"l2_bytes\":%d,\"max_threads_per_block\":%d,\"memory_pools\":%s}",
      d->sm_count, (unsigned long long)d->total_mem, d->smem_per_block_optin, d->smem_per_sm,
      d->l2_bytes, d->max_threads_per_block, d->memory_pools ? "true" : "false");
}

static void print_json(const info_report *r) {
  printf("{\"moejit\":");
  cli_json_str(stdout, moejit_version_string());
  printf(",\"nvrtc\":{\"version\":\"%d.%d\",\"archs\":", r->nvrtc_major, r->nvrtc_minor);
  print_json_archs(r->nvrtc_archs);
  printf("},\"nccl\":");
  if (r->nccl_version[0]) {
    printf("{\"version\":\"%s\",\"nonblocking\":%s,\"error\":null}", r->nccl_version,
           r->nccl_nonblocking ? "true" : "false");
  } else {
    printf("{\"version\":null,\"nonblocking\":false,\"error\":");
    cli_json_str(stdout, r->nccl_error);
    printf("}");
  }
  printf(",\"driver\":");
  if (r->driver_ok)
    printf("{\"version\":%d}", r->driver_version);
  else
    printf("null");
  printf(",\"gpu\":%s,\"no_gpu_reason\":", r->no_gpu[0] ? "false" : "true");
  if (r->no_gpu[0])
    cli_json_str(stdout, r->no_gpu);
  else
    printf("null");
  printf(",\"devices\":[");
  for (int i = 0; i < r->n_devices; i++) {
    printf("%s", i ? "," : "");
    if (r->device_status[i] == MOEJIT_OK) {
      print_json_device(&r->devices[i]);
    } else {
      printf("{\"ordinal\":%d,\"error\":", i);
      cli_json_str(stdout, r->device_error[i] ? r->device_error[i] : "");
      printf("}");
    }
  }
  printf("],\"cache\":{\"dir\":");
  cli_json_str(stdout, r->cache_ok ? r->cache.dir : r->cache_dir);
  if (r->cache_ok)
    printf(",\"entries\":%llu,\"bytes\":%llu,\"error\":null}", (unsigned long long)r->cache.entries,
           (unsigned long long)r->cache.bytes);
  else {
    printf(",\"entries\":null,\"bytes\":null,\"error\":");
    cli_json_str(stdout, r->cache_error);
    printf("}");
  }
  printf("}\n");
}

int cli_info(int argc, char **argv) {
  int json = 0, bad = 0;
  const char *cache_dir = NULL;
  for (int i = 1; i < argc && !bad; i++) {
    if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
      info_usage(stdout);
      return CLI_EXIT_OK;
    } else if (cli_flag(argv, i, "--json")) {
      json = 1;
    } else if (!cli_opt_value(argc, argv, &i, "--cache-dir", &cache_dir, &bad)) {
      fprintf(stderr, "moejit info: unknown argument '%s'\n", argv[i]);
      bad = 1;
    }
  }
  if (bad) {
    info_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  info_report r;
  gather(&r, cache_dir);
  if (json)
    print_json(&r);
  else
    print_text(&r);
  /* No GPU is a normal answer; a GPU that fails its query is not. */
  int failed = 0;
  for (int i = 0; i < r.n_devices; i++) failed |= r.device_status[i] != MOEJIT_OK;
  report_free(&r);
  return failed ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
