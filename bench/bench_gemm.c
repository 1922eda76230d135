/* moejit_bench_gemm: grouped expert GEMMs (gemm1 + SwiGLU, gemm2) of the
 * presets at several token counts with random uniform routing (or, with
 * --routing balanced, T*k/E rows an expert), timed with
 * CUDA events beside cuBLAS peers measured in the same run (a dense GEMM of
 * equal FLOPs, a per-expert GEMM loop, cublasGemmGroupedBatchedEx); each
 * point against its floor max(FLOPs / dense cuBLAS rate, bytes / 3.0 TB/s)
 * and the targets of issue #5 (docs/gemm.md, DESIGN.md: the H100 figures). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moejit/gemm.h"
#include "moejit/moejit.h"

#include "bench_clock.h"
#include "bench_gemm_peers.h"

#define PEAK_FLOPS 750e12              /* the floor's rate where dense cuBLAS could not run */
#define CHUNK_BYTES ((size_t)64 << 20) /* random host data tiled over device buffers */
#define ROTATE_BYTES 100e6             /* 2x the H100 L2: inputs rotate until this much */
#define MAX_SETS 16
#define MAX_POINTS 512
#define WARMUP 3 /* untimed launches before the timed ones */
#define MAX_ROUNDS 9 /* --rounds: ours and the peers timed in turn this many times */
/* Targets (issue #5): time within 1.15x of the floor; from T*k = 32768 rows
 * on, at least 85% of the dense cuBLAS rate; never slower than the best peer. */
#define TARGET_FLOOR 1.15
#define TARGET_DENSE 0.85
#define TARGET_DENSE_ROWS 32768

/* cuBLAS peers of one (preset, gemm, T), in µs; NAN where one could not run. */
typedef struct peer_times {
  double dense, loop, grouped;
} peer_times;

typedef struct point {
  char preset[64]; /* a copy: callers pass names that live on their stack */
  const char *gemm;
  const char *path; /* "auto", "mma", "wgmma", "gemv" or "tuned" */
  int gathers;      /* tuned gemm1 read x's rows in place, as the layer does (table: "tuned*") */
  int64_t tokens, rows;
  double us, floor_us, tflops, tbs;
  double floor_tflops; /* the rate the floor used: dense cuBLAS's, or PEAK_FLOPS */
  peer_times peers;
  double dense_tflops, speedup; /* speedup: best peer µs / ours; NAN without a peer */
  char targets[32];             /* "ok" or the missed ones, joined by '+' */
} point;

static point g_points[MAX_POINTS];
/* Paths each point runs (--path): one row per path. */
static moejit_gemm_path g_paths[2] = {MOEJIT_GEMM_PATH_AUTO};
static int g_n_paths = 1;

/* --path tuned: the tile and path the device's tuned table names for the
 * point (moejit_tuned_choice; AUTO on the preset's tiles where it names
 * none), what a loaded model runs. Not a moejit_gemm_path value. */
#define BENCH_PATH_TUNED ((moejit_gemm_path)100)
static char g_device[256]; /* the GPU's name, for the tuned table */

static const char *path_name(moejit_gemm_path p) {
  return p == BENCH_PATH_TUNED ? "tuned" : moejit_gemm_path_name(p);
}
static int g_n_points;
static void *g_chunk; /* CHUNK_BYTES of random bf16/fp16 values on the host */
static FILE *g_csv;   /* --csv FILE, or NULL */
static peers *g_peers; /* NULL: every peer is n/a for the reason in g_peers_why */
static char g_peers_why[PEER_WHY_MAX];
static int g_n_sets_max, g_iters; /* for the footer */
static int g_rounds = 3;          /* --rounds */
static double g_heat_ms = 0;      /* --heat-ms */
/* --read-tbps: the floor's read rate, bytes/s (default: an H100 80GB HBM3's
 * read-only stream, DESIGN.md) */
#define H100_READ_BYTES_PER_S 3.0e12
static double g_read_bytes_per_s = H100_READ_BYTES_PER_S;
static int g_balanced;            /* --routing balanced */

/* Tuned gemm1 rows that gathered (read x in place): each checked once against the copied
 * run of the same tile on the same set, which must match bit for bit (docs/gemm.md,
 * "Gathering A rows"); mismatches make the exit status 1 after the table. */
static int g_gather_checked, g_gather_bad;

/* Why peers were n/a, each reason once with the first point it hit. */
#define MAX_NOTES 24
static char g_notes[MAX_NOTES][PEER_WHY_MAX + 160]; /* key + " (first at " + where */
static int g_n_notes;

static void note_na(const char *peer, const char *where, const char *why) {
  char key[PEER_WHY_MAX + 32];
  snprintf(key, sizeof key, "%.16s: %.*s", peer, PEER_WHY_MAX - 1, why);
  for (int i = 0; i < g_n_notes; i++)
    if (!strncmp(g_notes[i], key, strlen(key)) && g_notes[i][strlen(key)] == ' ') return;
  if (g_n_notes < MAX_NOTES)
    snprintf(g_notes[g_n_notes++], sizeof g_notes[0], "%s (first at %.100s)", key, where);
}

#define CHECK(call)                                                                         \
  do {                                                                                      \
    moejit_status st_ = (call);                                                             \
    if (st_ != MOEJIT_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, moejit_last_error());  \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static void *host_alloc_or_die(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) fprintf(stderr, "out of host memory\n"), exit(1);
  return p;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1dull;
}

/* Small values in [-1/32, 1/32) as bf16/fp16 bits: sums stay finite. */
static void make_chunk(moejit_dtype dt) {
  uint16_t *c = host_alloc_or_die(CHUNK_BYTES);
  for (size_t i = 0; i < CHUNK_BYTES / 2; i++) {
    uint64_t r = rng_next();
    /* exponent 2^-6..2^-9, random mantissa and sign */
    if (dt == MOEJIT_DTYPE_BF16) c[i] = (uint16_t)(((r & 1) << 15) | ((118 + (r >> 1) % 4) << 7) | ((r >> 8) & 0x7f));
    else c[i] = (uint16_t)(((r & 1) << 15) | ((6 + (r >> 1) % 4) << 10) | ((r >> 8) & 0x3ff));
  }
  g_chunk = c;
}

static void *dev_random(moejit_ctx *ctx, size_t bytes) {
  void *d;
  CHECK(moejit_mem_alloc(ctx, bytes, NULL, &d));
  size_t first = bytes < CHUNK_BYTES ? bytes : CHUNK_BYTES;
  CHECK(moejit_memcpy_htod(ctx, d, g_chunk, first, NULL));
  for (size_t off = first; off < bytes; off += CHUNK_BYTES) {
    size_t n = bytes - off < CHUNK_BYTES ? bytes - off : CHUNK_BYTES;
    CHECK(moejit_memcpy_dtod(ctx, (char *)d + off, d, n, NULL));
  }
  return d;
}

/* Random uniform routing: each token picks top_k distinct experts (with
 * --routing balanced, slot t*k + j takes expert (t*k + j) mod E instead: every
 * expert gets T*k/E rows, give or take one, and the routing draws nothing). Writes
 * offsets [E+1] and, if `choice` is non-NULL, the picks [T, k] (token t's
 * j-th expert at t*k + j); returns the number of experts with rows. The
 * random draws are the same either way, so a point's routing does not
 * depend on whether it gathers. */
static int route_random(const moejit_spec *s, int64_t tokens, int32_t *offsets, int32_t *choice) {
  /* balanced: round robin, each call going on where the last stopped, so
   * that input sets rotate over the experts as random ones do */
  static int64_t balanced_next;
  const int64_t base = balanced_next;
  if (g_balanced) balanced_next += tokens * s->top_k;
  int32_t *counts = host_alloc_or_die(sizeof *counts * (size_t)s->experts);
  memset(counts, 0, sizeof *counts * (size_t)s->experts);
  int picked[64];
  for (int64_t t = 0; t < tokens; t++)
    for (int j = 0; j < s->top_k; j++) {
      int e, dup;
      do {
        e = g_balanced ? (int)((base + t * s->top_k + j) % s->experts)
                       : (int)(rng_next() % (uint64_t)s->experts);
        dup = 0;
        for (int i = 0; i < j; i++) dup |= picked[i] == e;
      } while (dup);
      picked[j] = e;
      counts[e]++;
      if (choice) choice[t * s->top_k + j] = e;
    }
  int active = 0;
  offsets[0] = 0;
  for (int e = 0; e < s->experts; e++) {
    offsets[e + 1] = offsets[e] + counts[e];
    active += counts[e] > 0;
  }
  free(counts);
  return active;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct io_set {
  void *x, *h, *y, *offsets; /* x: the permuted copy [T*k, d] (align's xs), gemm1's A */
  float *scale;
  int32_t *host_offsets; /* [E + 1]: the peers launch per expert from the host */
  void *h2;              /* [rows, 2f]: gemm1 peers' output (gate and up, no SwiGLU) */
  peer_grouped *grouped; /* the grouped peer's pointer arrays for the GEMM being timed */
  /* Points whose tuned gemm1 gathers, as the layer's forward does: the layer's x [T, d]
   * and the index of row r of the permuted copy (align's sorted_slot: slot t*k + j, so
   * a_index[r] / k = token t); x above then holds exactly those rows. NULL elsewhere. */
  void *xt;
  int32_t *a_index;
} io_set;

/* One launch of what is timed, on input set `set`: 0, or -1 with why. */
typedef int (*launch_fn)(void *state, int set, char *why);

/* Runs `launch` back to back for g_heat_ms of wall time (in batches of 8,
 * the stream drained after each; 0 ms: nothing), so that each contestant
 * is timed in the clock and power state its own sustained load sets, as in
 * a model's forward, rather than in the one the contestant before it left:
 * an H100 under a GEMM's load holds its power cap by lowering its clocks
 * (1.1-1.6 GHz against 1.98 at rest, measured), with a lag of tens of ms
 * (docs/gemm.md, "Sustained load"). 0 on success. */
static int heat(moejit_ctx *ctx, launch_fn launch, void *state, int n_sets, moejit_stream stream,
                char *why) {
  const double t0 = bench_now_ms();
  for (int i = 0; bench_now_ms() - t0 < g_heat_ms;) {
    for (int b = 0; b < 8; b++, i++)
      if (launch(state, i % n_sets, why)) return -1;
    if (moejit_stream_synchronize(ctx, stream) != MOEJIT_OK) {
      snprintf(why, PEER_WHY_MAX, "%s", moejit_last_error());
      return -1;
    }
  }
  return 0;
}

/* Median µs of `iters` back-to-back launches, each between its own pair of
 * events, after heat() and WARMUP launches; launch i uses set (i + WARMUP)
 * % n_sets. NAN with why on failure (the stream drained first). */
static double time_launches(moejit_ctx *ctx, launch_fn launch, void *state, int n_sets, int iters,
                            moejit_stream stream, char *why) {
  moejit_event ev[257];
  double ms[256];
  if (iters > 256) iters = 256;
  int made = 0, failed = 0;
  moejit_status st = MOEJIT_OK;
  while (made <= iters && (st = moejit_event_create(ctx, &ev[made])) == MOEJIT_OK) made++;
  if (st == MOEJIT_OK) failed = heat(ctx, launch, state, n_sets, stream, why) != 0;
  for (int i = -WARMUP; i < iters && st == MOEJIT_OK && !failed; i++) {
    if (i == 0) st = moejit_event_record(ctx, ev[0], stream);
    if (st == MOEJIT_OK) failed = launch(state, (i + WARMUP) % n_sets, why) != 0;
    if (st == MOEJIT_OK && !failed && i >= 0) st = moejit_event_record(ctx, ev[i + 1], stream);
  }
  if (st == MOEJIT_OK && !failed) st = moejit_event_synchronize(ctx, ev[iters]);
  for (int i = 0; i < iters && st == MOEJIT_OK && !failed; i++) {
    float t;
    st = moejit_event_elapsed_ms(ctx, ev[i], ev[i + 1], &t);
    ms[i] = t;
  }
  if (st != MOEJIT_OK) snprintf(why, PEER_WHY_MAX, "%s", moejit_last_error());
  if (st != MOEJIT_OK || failed) (void)moejit_stream_synchronize(ctx, stream);
  for (int i = 0; i < made; i++) moejit_event_destroy(ctx, ev[i]);
  if (st != MOEJIT_OK || failed) return NAN;
  qsort(ms, (size_t)iters, sizeof ms[0], cmp_double);
  return (iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2])) * 1e3;
}

/* One GEMM of a point: the spec, its weights, the input sets. */
typedef struct gemm_run {
  moejit_ctx *ctx;
  const moejit_spec *s;
  int which; /* 1 or 2 */
  const void *w;
  io_set *sets;
  int n_sets;
  int64_t rows;
  moejit_gemm_path path; /* ours only */
  int gather;            /* ours, gemm1 only: read io->xt through io->a_index */
  moejit_stream stream;
  int dense_turn; /* dense only: launches so far, picks the expert */
} gemm_run;

/* GEMM 1's rounds-in-step words (moejit_gemm_args.round_sync): zeroed once,
 * left zero by every launch; the library decides where they are used. */
static uint32_t *g_round_sync;
/* GEMM 2's K-split scratch (moejit_gemm_args.split), as large as any tile
 * of this device can ask; zeroed once, its counters left zero by every
 * launch. */
static void *g_split;
static size_t g_split_bytes;

static int launch_ours(void *state, int set, char *why) {
  const gemm_run *r = state;
  io_set *io = &r->sets[set];
  const int gather = r->which == 1 && r->gather;
  /* gathering: the arguments the layer's forward passes (src/ops/layer.c) */
  moejit_gemm_args a = {.a = gather          ? io->xt
                             : r->which == 1 ? io->x
                                             : io->h,
                        .w = r->w,
                        .out = r->which == 1 ? io->h : io->y,
                        .expert_offsets = io->offsets,
                        .row_scale = r->which == 2 ? io->scale : NULL,
                        .max_rows = r->rows,
                        .path = r->path,
                        .a_index = gather ? io->a_index : NULL,
                        .a_index_div = gather ? (int32_t)r->s->top_k : 0,
                        .a_rows = gather ? r->rows / r->s->top_k : 0,
                        .round_sync = r->which == 1 ? g_round_sync : NULL,
                        .split = r->which == 2 ? g_split : NULL,
                        .split_bytes = r->which == 2 ? g_split_bytes : 0};
  moejit_status st = r->which == 1 ? moejit_gemm1_swiglu(r->ctx, r->s, &a, r->stream)
                                   : moejit_gemm2(r->ctx, r->s, &a, r->stream);
  if (st == MOEJIT_OK) return 0;
  snprintf(why, PEER_WHY_MAX, "%s", moejit_last_error());
  return -1;
}

/* Median µs of ours; a failure ends the run, as a broken kernel should. */
static double time_ours(gemm_run *r, int iters) {
  char why[PEER_WHY_MAX] = "";
  double us = time_launches(r->ctx, launch_ours, r, r->n_sets, iters, r->stream, why);
  if (isnan(us)) {
    fprintf(stderr, "%s gemm%d %s%s: %s\n", r->s->name, r->which, path_name(r->path),
            r->which == 1 && r->gather ? " (gathering)" : "", why);
    exit(1);
  }
  return us;
}

/* The peers' view of set `set`: gemm1 computes [rows, 2f] (gate and up, no
 * SwiGLU) into h2, gemm2 [rows, d] into y (no row scale). */
static peer_gemm peer_problem(const gemm_run *r, int set) {
  const io_set *io = &r->sets[set];
  const int64_t d = r->s->hidden, f = r->s->expert_width;
  peer_gemm g = {r->which == 1 ? io->x : io->h, r->w, r->which == 1 ? io->h2 : io->y,
                 io->host_offsets, r->s->experts, r->which == 1 ? 2 * f : d,
                 r->which == 1 ? d : f, r->s->act_dtype};
  return g;
}

/* Dense: one GEMM of all rows on one expert's weights, the expert changing
 * at every launch so its weights come from DRAM as ours do, not from an L2
 * the launch before filled. */
static int launch_dense(void *state, int set, char *why) {
  gemm_run *r = state;
  peer_gemm g = peer_problem(r, set);
  const size_t esz = moejit_dtype_size(g.dtype), e = (size_t)(r->dense_turn++ % g.experts);
  const char *w = (const char *)g.w + e * (size_t)(g.n * g.k) * esz;
  return peer_dense(g_peers, g.a, w, g.c, r->rows, g.n, g.k, g.dtype, why);
}

static int launch_loop(void *state, int set, char *why) {
  const gemm_run *r = state;
  peer_gemm g = peer_problem(r, set);
  return peer_loop(g_peers, &g, why);
}

static int launch_grouped(void *state, int set, char *why) {
  const gemm_run *r = state;
  return peer_grouped_run(g_peers, r->sets[set].grouped, why);
}

/* The peers of a GEMM, in the order of peer_times: dense, loop, grouped. */
static const char *const peer_names[3] = {"dense", "loop", "grouped"};
static const launch_fn peer_launch[3] = {launch_dense, launch_loop, launch_grouped};

static double *peer_slot(peer_times *t, int i) {
  return i == 0 ? &t->dense : i == 1 ? &t->loop : &t->grouped;
}

/* Gets the peers ready to be timed: ready[i] = 1 for those that can run,
 * each having run once untimed on every set (cuBLAS loads kernels and picks
 * algorithms per shape, and the sets' per-expert shapes differ); the
 * grouped peer's pointer arrays are built (release with unprepare_peers).
 * A peer that cannot run is noted with why. */
static void prepare_peers(gemm_run *r, const char *where, int ready[3]) {
  char why[PEER_WHY_MAX] = "";
  ready[0] = ready[1] = ready[2] = 0;
  int no_h2 = 0;
  for (int i = 0; i < r->n_sets; i++) no_h2 |= r->which == 1 && !r->sets[i].h2;
  const char *skip = !g_peers ? g_peers_why
                     : r->s->act_dtype != r->s->weight_dtype
                         ? "activation and weight dtypes differ"
                     : no_h2 ? "no device memory for the [T*k, 2f] output"
                             : NULL;
  if (skip) {
    note_na("all peers", where, skip);
    return;
  }
  int grouped = 1;
  for (int i = 0; i < r->n_sets && grouped; i++) {
    peer_gemm g = peer_problem(r, i);
    grouped = peer_grouped_prepare(g_peers, &g, &r->sets[i].grouped, why) == 0;
  }
  if (!grouped) note_na("grouped", where, why);
  for (int p = 0; p < 3; p++) {
    if (p == 2 && !grouped) continue;
    int failed = 0;
    for (int set = 0; set < r->n_sets && !failed; set++) failed = peer_launch[p](r, set, why) != 0;
    if (failed) note_na(peer_names[p], where, why);
    ready[p] = !failed;
  }
}

static void unprepare_peers(gemm_run *r) {
  for (int i = 0; i < r->n_sets; i++) {
    peer_grouped_free(r->sets[i].grouped);
    r->sets[i].grouped = NULL;
  }
}

/* Median µs of one peer's launches, or NAN with the reason noted (then
 * *ready = 0: the later rounds skip it). */
static double time_peer(gemm_run *r, int p, int iters, const char *where, int *ready) {
  char why[PEER_WHY_MAX] = "";
  const double us = time_launches(r->ctx, peer_launch[p], r, r->n_sets, iters, r->stream, why);
  if (isnan(us)) note_na(peer_names[p], where, why), *ready = 0;
  return us;
}

/* The median of n values; NAN if any is NAN (a peer that failed in a round). */
static double median_of(double *v, int n) {
  for (int i = 0; i < n; i++)
    if (isnan(v[i])) return NAN;
  qsort(v, (size_t)n, sizeof v[0], cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The missed targets of a point, joined by '+', or "ok". */
static void judge(point *p) {
  const double best = fmin(p->peers.loop, p->peers.grouped); /* NAN only if both are */
  p->targets[0] = '\0';
  if (p->us > TARGET_FLOOR * p->floor_us) strcat(p->targets, "+floor");
  if (p->us > best) strcat(p->targets, "+peer");
  if (p->rows >= TARGET_DENSE_ROWS && p->tflops < TARGET_DENSE * p->floor_tflops)
    strcat(p->targets, "+dense");
  if (!p->targets[0]) strcpy(p->targets, "ok");
  else memmove(p->targets, p->targets + 1, strlen(p->targets));
}

static void csv_row(const point *p);
static const char *cell(char *buf, size_t n, const char *fmt, double v);

/* The path as the table prints it: tuned gemm1 rows that gathered are "tuned*". */
static const char *shown_path(const point *p, char *buf, size_t n) {
  snprintf(buf, n, "%s%s", p->path, p->gathers ? "*" : "");
  return buf;
}

static void report(const char *preset, const char *gemm, moejit_gemm_path path, int gathers,
                   int64_t tokens, int64_t rows, double us, double flops, double bytes,
                   const peer_times *pt) {
  point p = {.gemm = gemm,
             .path = path_name(path),
             .gathers = gathers,
             .tokens = tokens,
             .rows = rows,
             .us = us,
             .peers = *pt};
  snprintf(p.preset, sizeof p.preset, "%s", preset);
  p.dense_tflops = flops / (pt->dense * 1e-6) / 1e12; /* NAN if dense failed */
  p.floor_tflops = isnan(p.dense_tflops) ? PEAK_FLOPS / 1e12 : p.dense_tflops;
  p.floor_us = fmax(flops / (p.floor_tflops * 1e12), bytes / g_read_bytes_per_s) * 1e6;
  p.tflops = flops / (us * 1e-6) / 1e12;
  p.tbs = bytes / (us * 1e-6) / 1e12;
  p.speedup = fmin(pt->loop, pt->grouped) / us;
  judge(&p);
  char b[3][32], shown[16];
  printf(
      "# %s %s %s T=%lld: %.1f us, floor %.1f us (%.1f%%), %.1f TFLOP/s, %.2f TB/s; "
      "dense %s, loop %s, grouped %s us; %s\n",
      preset, gemm, shown_path(&p, shown, sizeof shown), (long long)tokens, us, p.floor_us,
      100 * p.floor_us / us, p.tflops, p.tbs, cell(b[0], 32, "%.1f", pt->dense),
      cell(b[1], 32, "%.1f", pt->loop), cell(b[2], 32, "%.1f", pt->grouped), p.targets);
  fflush(stdout);
  if (g_csv) csv_row(&p);
  if (g_n_points < MAX_POINTS) g_points[g_n_points++] = p;
}

/* The index of the permuted rows that align's sorted_slot would hold for
 * routing `choice` [T, k] and its offsets: rows grouped by expert, tokens
 * in order inside an expert, row r naming slot t*k + j (so index[r] / k is
 * its token). */
static void gather_index(const moejit_spec *s, int64_t tokens, const int32_t *choice,
                         const int32_t *offsets, int32_t *index) {
  int32_t *next = host_alloc_or_die(sizeof *next * (size_t)s->experts);
  memcpy(next, offsets, sizeof *next * (size_t)s->experts);
  for (int64_t slot = 0; slot < tokens * s->top_k; slot++)
    index[next[choice[slot]]++] = (int32_t)slot;
  free(next);
}

/* Writes into dst [rows, d] the permuted copy of the x that dev_random made
 * (byte b of x is byte b % CHUNK_BYTES of g_chunk): row r = x row
 * index[r] / k, as align would copy it. Then the gathering gemm1 and the
 * copied one compute the same rows, and check_gather can compare them.
 * Built on the host a CHUNK_BYTES piece at a time. */
static void upload_permuted(moejit_ctx *ctx, void *dst, const int32_t *index, int k, int64_t rows,
                            size_t row_bytes) {
  const int64_t per = CHUNK_BYTES / row_bytes > 0 ? (int64_t)(CHUNK_BYTES / row_bytes) : 1;
  char *piece = host_alloc_or_die((size_t)per * row_bytes);
  const char *chunk = g_chunk;
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = rows - r0 < per ? rows - r0 : per;
    for (int64_t r = 0; r < n; r++) {
      const uint64_t x_at = (uint64_t)(index[r0 + r] / k) * row_bytes; /* the row's byte in x */
      /* a row may wrap around the chunk's end: copy the part up to it, then the rest */
      for (size_t done = 0; done < row_bytes;) {
        const size_t at = (size_t)((x_at + done) % CHUNK_BYTES), left = row_bytes - done;
        const size_t take = left < CHUNK_BYTES - at ? left : CHUNK_BYTES - at;
        memcpy(piece + (size_t)r * row_bytes + done, chunk + at, take);
        done += take;
      }
    }
    CHECK(moejit_memcpy_htod(ctx, (char *)dst + (size_t)r0 * row_bytes, piece,
                             (size_t)n * row_bytes, NULL));
  }
  free(piece);
}

/* Rotates routings and buffers until one pass of either GEMM touches
 * ROTATE_BYTES: the weights of the experts any set routes to (each GEMM is
 * timed alone and all sets share one w1 and w2, so an expert two sets use
 * counts once, and GEMM 2's weights, half of GEMM 1's, are what counts)
 * plus each set's A and C; returns the number of sets and the mean number
 * of experts with rows. gather: also
 * build each set's layer x and gather index (io_set.xt, a_index), with the
 * permuted copy made of x's rows. The sets, routings and offsets are the
 * same as without gather (the rotation counts the copied A either way). */
static int make_sets(moejit_ctx *ctx, const moejit_spec *s, int64_t tokens, int gather,
                     io_set *sets, double *active) {
  int64_t rows = tokens * s->top_k, d = s->hidden, f = s->expert_width;
  size_t esz = moejit_dtype_size(s->act_dtype), wsz = moejit_dtype_size(s->weight_dtype);
  size_t off_bytes = sizeof(int32_t) * ((size_t)s->experts + 1);
  int n_sets = 0, used = 0;
  double touched_ac = 0, touched = 0;
  unsigned char *seen = host_alloc_or_die((size_t)s->experts); /* experts some set routes to */
  memset(seen, 0, (size_t)s->experts);
  *active = 0;
  do {
    io_set *io = &sets[n_sets++];
    memset(io, 0, sizeof *io);
    io->host_offsets = host_alloc_or_die(off_bytes);
    int32_t *choice = gather ? host_alloc_or_die(sizeof *choice * (size_t)rows) : NULL;
    int act = route_random(s, tokens, io->host_offsets, choice);
    *active += act;
    if (!gather) {
      io->x = dev_random(ctx, (size_t)(rows * d) * esz);
    } else {
      int32_t *index = host_alloc_or_die(sizeof *index * (size_t)rows);
      gather_index(s, tokens, choice, io->host_offsets, index);
      io->xt = dev_random(ctx, (size_t)(tokens * d) * esz);
      CHECK(moejit_mem_alloc(ctx, (size_t)(rows * d) * esz, NULL, &io->x));
      upload_permuted(ctx, io->x, index, s->top_k, rows, (size_t)d * esz);
      CHECK(moejit_mem_alloc(ctx, sizeof *index * (size_t)rows, NULL, (void **)&io->a_index));
      CHECK(moejit_memcpy_htod(ctx, io->a_index, index, sizeof *index * (size_t)rows, NULL));
      free(index);
    }
    free(choice);
    io->h = dev_random(ctx, (size_t)(rows * f) * esz);
    io->y = dev_random(ctx, (size_t)(rows * d) * esz);
    /* gemm1 peers write gate and up; without the memory they are n/a */
    if (g_peers && moejit_mem_alloc(ctx, (size_t)(rows * 2 * f) * esz, NULL, &io->h2) != MOEJIT_OK)
      io->h2 = NULL;
    CHECK(moejit_mem_alloc(ctx, off_bytes, NULL, &io->offsets));
    CHECK(moejit_memcpy_htod(ctx, io->offsets, io->host_offsets, off_bytes, NULL));
    float *sc = host_alloc_or_die(sizeof(float) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) sc[i] = 1.0f / (float)s->top_k;
    CHECK(moejit_mem_alloc(ctx, sizeof(float) * (size_t)rows, NULL, (void **)&io->scale));
    CHECK(moejit_memcpy_htod(ctx, io->scale, sc, sizeof(float) * (size_t)rows, NULL));
    free(sc);
    for (int e = 0; e < s->experts; e++)
      if (io->host_offsets[e + 1] > io->host_offsets[e] && !seen[e]) seen[e] = 1, used++;
    touched_ac += (double)(rows * (d + f)) * (double)esz;
    touched = (double)used * (double)(f * d) * (double)wsz + touched_ac;
  } while (touched < ROTATE_BYTES && n_sets < MAX_SETS);
  free(seen);
  *active /= n_sets;
  return n_sets;
}

static void free_sets(moejit_ctx *ctx, io_set *sets, int n_sets) {
  for (int i = 0; i < n_sets; i++) {
    moejit_mem_free(ctx, sets[i].x, NULL), moejit_mem_free(ctx, sets[i].h, NULL);
    moejit_mem_free(ctx, sets[i].y, NULL), moejit_mem_free(ctx, sets[i].offsets, NULL);
    moejit_mem_free(ctx, sets[i].scale, NULL);
    if (sets[i].h2) moejit_mem_free(ctx, sets[i].h2, NULL);
    if (sets[i].xt) moejit_mem_free(ctx, sets[i].xt, NULL);
    if (sets[i].a_index) moejit_mem_free(ctx, sets[i].a_index, NULL);
    free(sets[i].host_offsets);
  }
}

/* Runs the tuned gemm1 `r` on set 0 once gathering, once from the permuted
 * copy (same tile, output poisoned before each), and compares h bit for
 * bit: the bench's index and copy must name the same rows, and the
 * gathering kernel computes them as the copied one does (the library's test
 * gemm/wgmma_gathers_rows holds it to that). Returns 0 where the gathering
 * launch cannot run (said why; the row then times the copy), else 1 (a
 * mismatch is printed and counted in g_gather_bad). */
static int check_gather(gemm_run *r, const char *where) {
  const size_t esz = moejit_dtype_size(r->s->act_dtype);
  const size_t n = (size_t)(r->rows * r->s->expert_width), bytes = n * esz;
  void *h = r->sets[0].h;
  char *got = host_alloc_or_die(bytes), *want = host_alloc_or_die(bytes);
  char why[PEER_WHY_MAX] = "";
  int ok = 1;
  for (int gather = 1; gather >= 0 && ok; gather--) {
    r->gather = gather;
    CHECK(moejit_memset_d32(r->ctx, h, 0xffffffffu, bytes / 4, r->stream));
    if (launch_ours(r, 0, why)) {
      if (gather) {
        printf(
            "# %s: the layer gathers here, the tuned tile cannot (%s): the tuned row reads "
            "the permuted copy\n",
            where, why);
        ok = 0;
        break;
      }
      fprintf(stderr, "%s: tuned gemm1 from the copy: %s\n", where, why);
      exit(1);
    }
    CHECK(moejit_memcpy_dtoh(r->ctx, gather ? got : want, h, bytes, r->stream));
    CHECK(moejit_stream_synchronize(r->ctx, r->stream));
  }
  r->gather = 0;
  if (ok) {
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < n; i++)
      if (memcmp(got + i * esz, want + i * esz, esz) && !differ++) first = i;
    g_gather_checked++;
    if (differ) {
      g_gather_bad++;
      printf(
          "# %s: MISMATCH: gathered gemm1 differs from the copied run of the same tile at %zu "
          "of %zu elements (first: row %zu col %zu)\n",
          where, differ, n, first / (size_t)r->s->expert_width, first % (size_t)r->s->expert_width);
      fprintf(stderr, "%s: gathered gemm1 differs from the copied run (%zu elements)\n", where,
              differ);
    }
  }
  free(got), free(want);
  return ok;
}

/* Says so where the loaded layer's gemm1 at T is not the tile and path the
 * tuned row runs (moejit_tuned_choice and the load read the same table, so
 * they should agree): its gather decision is then about another kernel. */
static void check_layer_tile(const moejit_model *model, const gemm_run *r, int64_t tokens,
                             const char *where) {
  char desc[512], cfg[64], want[96];
  moejit_gemm_cfg_text(&r->s->gemm1, cfg, sizeof cfg);
  snprintf(want, sizeof want, ": %s, path %s,", cfg, moejit_gemm_path_name(r->path));
  if (moejit_model_gemm_choice(model, "gemm1", tokens, desc, sizeof desc, NULL) != MOEJIT_OK)
    printf("# %s: the layer's gemm1 choice unknown: %s\n", where, moejit_last_error());
  else if (!strstr(desc, want))
    printf("# %s: note: the layer runs gemm1 as \"%.300s\"; the tuned row runs %s\n", where, desc,
           want + 2);
}

/* One point (preset, T): both GEMMs, each on every --path and beside the
 * peers. model: the preset's loaded layer, which says whether its forward
 * reads x in place at T (then the tuned gemm1 row does too), or NULL. */
static void bench_point(moejit_ctx *ctx, const moejit_spec *s, const moejit_model *model,
                        const void *w1, const void *w2, int64_t tokens, int iters,
                        moejit_stream stream) {
  int64_t rows = tokens * s->top_k, d = s->hidden, f = s->expert_width;
  size_t esz = moejit_dtype_size(s->act_dtype), wsz = moejit_dtype_size(s->weight_dtype);
  io_set sets[MAX_SETS];
  double active;
  int tuned_at = -1; /* the row of --path tuned, if any */
  for (int i = 0; i < g_n_paths; i++)
    if (g_paths[i] == BENCH_PATH_TUNED) tuned_at = i;
  /* the layer's own rule (moejit_moe_gemm1_gathers; $MOEJIT_GEMM1_GATHER
   * forces it there), not a copy of it */
  int gather = tuned_at >= 0 && model && moejit_moe_gemm1_gathers(model, tokens);
  int n_sets = make_sets(ctx, s, tokens, gather, sets, &active);
  if (n_sets > g_n_sets_max) g_n_sets_max = n_sets;
  CHECK(moejit_ctx_synchronize(ctx));
  const double m = (double)rows, ac = m * (double)(d + f) * (double)esz; /* A + C, both GEMMs */
  for (int which = 1; which <= 2; which++) {
    gemm_run r = {.ctx = ctx,
                  .s = s,
                  .which = which,
                  .w = which == 1 ? w1 : w2,
                  .sets = sets,
                  .n_sets = n_sets,
                  .rows = rows,
                  .path = MOEJIT_GEMM_PATH_AUTO,
                  .stream = stream};
    const double n_out = which == 1 ? 2 * (double)f : (double)d; /* gemm1: gate + up */
    const double flops = 2 * m * n_out * (double)(which == 1 ? d : f);
    const double bytes = active * n_out * (double)(which == 1 ? d : f) * (double)wsz + ac;
    /* what each of our rows runs: the spec and path (tuned: the table's) */
    moejit_spec tuned = *s;
    const moejit_spec *spec[2];
    moejit_gemm_path path[2];
    for (int i = 0; i < g_n_paths; i++) {
      spec[i] = s, path[i] = g_paths[i];
      if (path[i] == BENCH_PATH_TUNED) {
        moejit_gemm_cfg *g = which == 1 ? &tuned.gemm1 : &tuned.gemm2;
        int p = MOEJIT_GEMM_PATH_AUTO;
        if (moejit_tuned_choice(g_device, s, which, tokens, g, &p, NULL) != MOEJIT_OK)
          *g = which == 1 ? s->gemm1 : s->gemm2, p = MOEJIT_GEMM_PATH_AUTO;
        spec[i] = &tuned, path[i] = (moejit_gemm_path)p;
      }
    }
    char where[128];
    snprintf(where, sizeof where, "%.63s gemm%d T=%lld", s->name, which, (long long)tokens);
    if (which == 1 && gather) {
      r.s = spec[tuned_at], r.path = path[tuned_at];
      check_layer_tile(model, &r, tokens, where);
      gather = check_gather(&r, where);
      r.s = s, r.path = MOEJIT_GEMM_PATH_AUTO; /* the peers read the preset's spec */
    }
    int ready[3];
    prepare_peers(&r, where, ready);
    /* rounds: ours and each peer in turn, the first one changing every round
     * (the GPU's clocks and temperature drift; nobody always goes first) */
    /* ours: a row per --path, and where GEMM 1 gathers one more, the tuned
     * tile gathering (tuned*) beside the tuned row reading the copy */
    const int n_ours = g_n_paths + (which == 1 && gather ? 1 : 0);
    double t_ours[3][MAX_ROUNDS], t_peer[3][MAX_ROUNDS];
    const int n_cont = n_ours + 3;
    for (int round = 0; round < g_rounds; round++)
      for (int j = 0; j < n_cont; j++) {
        const int c = (j + round) % n_cont;
        if (c < n_ours) {
          const int at = c < g_n_paths ? c : tuned_at;
          r.s = spec[at], r.path = path[at], r.gather = c == g_n_paths;
          t_ours[c][round] = time_ours(&r, iters);
          r.gather = 0;
        } else {
          const int p = c - n_ours;
          r.s = s;
          t_peer[p][round] = ready[p] ? time_peer(&r, p, iters, where, &ready[p]) : NAN;
        }
      }
    unprepare_peers(&r);
    double us[3];
    for (int i = 0; i < n_ours; i++) us[i] = median_of(t_ours[i], g_rounds);
    peer_times pt;
    for (int p = 0; p < 3; p++) *peer_slot(&pt, p) = median_of(t_peer[p], g_rounds);
    for (int i = 0; i < n_ours; i++)
      report(s->name, which == 1 ? "gemm1" : "gemm2", g_paths[i < g_n_paths ? i : tuned_at],
             i == g_n_paths, tokens, rows, us[i], flops, bytes, &pt);
  }
  free_sets(ctx, sets, n_sets);
}

/* --gemm1 / --gemm2 M,N,K,STAGES,WARPS[,RASTER[,CLUSTER_M[,SCHEDULE[,CLUSTER_N]]]]:
 * tile overrides for every preset (tile sweeps). tile.tile_m 0 keeps the
 * preset's tile; raster (0 along M, 1 along N) and schedule (0 cooperative,
 * 1 pingpong) -1, and cluster_m / cluster_n (1 or 2) 0, keep the spec's. */
typedef struct tile_override {
  moejit_gemm_cfg tile;
  int raster, cluster_m, schedule, cluster_n;
} tile_override;
static tile_override g_override[2] = {{.raster = -1, .schedule = -1},
                                      {.raster = -1, .schedule = -1}};

static int parse_tile(const char *text, tile_override *o) {
  moejit_gemm_cfg *g = &o->tile;
  int n = sscanf(text, "%d,%d,%d,%d,%d,%d,%d,%d,%d", &g->tile_m, &g->tile_n, &g->tile_k, &g->stages,
                 &g->warps, &o->raster, &o->cluster_m, &o->schedule, &o->cluster_n);
  return n >= 5 && n <= 9 && o->raster >= -1 && o->raster <= 1 && o->cluster_m >= 0 &&
         o->cluster_m <= 2 && o->schedule >= -1 && o->schedule <= MOEJIT_SCHEDULE_PINGPONG &&
         o->cluster_n >= 0 && o->cluster_n <= 2;
}

static void apply_override(moejit_gemm_cfg *dst, const tile_override *o) {
  if (o->raster >= 0) dst->raster = (moejit_raster)o->raster;
  if (o->cluster_m > 0) dst->cluster_m = o->cluster_m;
  if (o->cluster_n > 0) dst->cluster_n = o->cluster_n;
  if (o->schedule >= 0) dst->schedule = (moejit_gemm_schedule)o->schedule;
  if (!o->tile.tile_m) return;
  dst->tile_m = o->tile.tile_m, dst->tile_n = o->tile.tile_n, dst->tile_k = o->tile.tile_k;
  dst->stages = o->tile.stages, dst->warps = o->tile.warps;
}

static void bench_preset(moejit_ctx *ctx, const char *name, const int64_t *tokens, int n_tokens,
                         int iters, moejit_stream stream) {
  moejit_spec s;
  CHECK(moejit_spec_load_preset(name, &s));
  apply_override(&s.gemm1, &g_override[0]);
  apply_override(&s.gemm2, &g_override[1]);
  if (moejit_spec_validate(&s) != MOEJIT_OK) {
    printf("# %s: tile override rejected: %s\n", name, moejit_last_error());
    return;
  }
  size_t wsz = moejit_dtype_size(s.weight_dtype);
  size_t w1_bytes = (size_t)s.experts * 2 * (size_t)s.expert_width * (size_t)s.hidden * wsz;
  size_t w2_bytes = (size_t)s.experts * (size_t)s.hidden * (size_t)s.expert_width * wsz;
  printf("# %s: d=%lld f=%lld E=%d k=%d, gemm1 %dx%dx%d/%d st/%d w, gemm2 %dx%dx%d/%d st/%d w, "
         "weights %.2f GB\n",
         name, (long long)s.hidden, (long long)s.expert_width, s.experts, s.top_k, s.gemm1.tile_m,
         s.gemm1.tile_n, s.gemm1.tile_k, s.gemm1.stages, s.gemm1.warps, s.gemm2.tile_m,
         s.gemm2.tile_n, s.gemm2.tile_k, s.gemm2.stages, s.gemm2.warps,
         (double)(w1_bytes + w2_bytes) / 1e9);
  /* --path tuned: the whole layer of this spec, loaded once (its kernels
   * compile through the cache), says at which T its forward runs GEMM 1
   * reading x in place; the tuned gemm1 row then does the same. */
  moejit_model *model = NULL;
  int tuned = 0;
  for (int i = 0; i < g_n_paths; i++) tuned |= g_paths[i] == BENCH_PATH_TUNED;
  if (tuned) {
    moejit_load_report rep;
    moejit_load_opts opts;
    moejit_load_opts_init(&opts);
    opts.report = &rep;
    if (moejit_model_load_spec(ctx, &s, &opts, &model) == MOEJIT_OK)
      printf(
          "# %s: layer loaded (%.0f ms) to decide where tuned gemm1 reads x in place as the "
          "layer does\n",
          name, rep.total_ms);
    else
      printf(
          "# %s: tuned gemm1 rows read the permuted copy everywhere: the layer did not load "
          "(%s)\n",
          name, moejit_last_error());
  }
  void *w1 = dev_random(ctx, w1_bytes), *w2 = dev_random(ctx, w2_bytes);
  for (int i = 0; i < n_tokens; i++) bench_point(ctx, &s, model, w1, w2, tokens[i], iters, stream);
  CHECK(moejit_ctx_synchronize(ctx));
  moejit_model_destroy(model);
  moejit_mem_free(ctx, w1, NULL), moejit_mem_free(ctx, w2, NULL);
}

/* A value for the table, or "n/a" (NAN: the peer could not run). */
static const char *cell(char *buf, size_t n, const char *fmt, double v) {
  if (isnan(v)) snprintf(buf, n, "n/a");
  else snprintf(buf, n, fmt, v);
  return buf;
}

/* The same value for the CSV: empty where n/a. */
static const char *csv_cell(char *buf, size_t n, const char *fmt, double v) {
  if (isnan(v)) buf[0] = '\0';
  else snprintf(buf, n, fmt, v);
  return buf;
}

static const char *csv_header =
    "preset,gemm,path,tokens,rows,time_us,floor_us,pct_of_floor,tflops,tbs,floor_tflops,"
    "floor_rate,dense_us,dense_tflops,loop_us,grouped_us,speedup_vs_best_peer,targets,"
    "gemm1_gathers\n";

static void csv_row(const point *p) {
  char b[6][32];
  fprintf(g_csv, "%s,%s,%s,%lld,%lld,%.2f,%.2f,%.1f,%.1f,%.3f,%.1f,%s,%s,%s,%s,%s,%s,%s,%d\n",
          p->preset, p->gemm, p->path, (long long)p->tokens, (long long)p->rows, p->us, p->floor_us,
          100 * p->floor_us / p->us, p->tflops, p->tbs, p->floor_tflops,
          isnan(p->dense_tflops) ? "fallback" : "dense", csv_cell(b[0], 32, "%.2f", p->peers.dense),
          csv_cell(b[1], 32, "%.1f", p->dense_tflops), csv_cell(b[2], 32, "%.2f", p->peers.loop),
          csv_cell(b[3], 32, "%.2f", p->peers.grouped), csv_cell(b[4], 32, "%.3f", p->speedup),
          p->targets, p->gathers);
  fflush(g_csv);
}

static void print_footer(int fallbacks, int met, int gathered) {
  printf(
      "# floor = max(FLOPs / dense TFLOP/s of the same point, bytes / %g TB/s%s), bytes = the\n"
      "#   active experts' weights + A + C once; TB/s = those bytes / time.\n",
      g_read_bytes_per_s / 1e12,
      g_read_bytes_per_s == H100_READ_BYTES_PER_S ? ", an H100's read rate" : "");
  printf("# dense = one cublasGemmEx of equal FLOPs (M = T*k rows, the GEMM's N and K; gemm1: N =\n"
         "#   2f, gate and up, no SwiGLU) on one expert's weights. It has no routing: it sets the\n"
         "#   floor and the dense target, and is not a peer.\n");
  if (fallbacks)
    printf("# floor marked *: dense was n/a there; the floor and the dense target used %.0f\n"
           "#   TFLOP/s instead (%d rows).\n",
           PEAK_FLOPS / 1e12, fallbacks);
  printf("# peers (%s, bf16, fp32 sums): loop = cublasGemmEx per expert with rows, the loop\n"
         "#   timed as one; grouped = cublasGemmGroupedBatchedEx, one group per expert with rows.\n"
         "#   Both read the per-expert row counts on the host (ours: on the device). gemm1 peers\n"
         "#   write [T*k, 2f] (no SwiGLU); gemm2 peers apply no row scale (ours does).\n"
         "# vs peer = best peer time / ours (> 1: ours faster); best peer = faster of loop, grouped.\n",
         peers_name(g_peers));
  printf("# targets: ok, or the missed ones: floor (time > %.2fx floor), peer (slower than the\n"
         "#   best peer), dense (T*k >= %d and TFLOP/s < %.0f%% of dense). %d of %d rows ok.\n",
         TARGET_FLOOR, TARGET_DENSE_ROWS, 100 * TARGET_DENSE, met, g_n_points);
  printf("# routing: %s\n",
         g_balanced ? "balanced (slot t*k + j on expert (t*k + j) mod E)" : "uniform random top-k");
  printf(
      "# timing: median of %d launches, each between its own events, after %.0f ms of the\n"
      "#   same launches (--heat-ms) and %d warm-ups, in each of %d rounds that time ours\n"
      "#   and every peer in turn (who goes first changes every round); a time is the\n"
      "#   median of its rounds. Inputs rotate over routing/buffer sets until a pass\n"
      "#   touches %.0f MB (here up to %d sets); each peer runs once on every set before\n"
      "#   (cuBLAS loads kernels per shape).\n",
      g_iters, g_heat_ms, WARMUP, g_rounds, ROTATE_BYTES / 1e6, g_n_sets_max);
  if (gathered)
    printf(
        "# path tuned*: gemm1 as the layer's forward runs it at that T (%d rows): reading x\n"
        "#   [T, d] in place through the permuted rows' slot index (a_index / k = token, the\n"
        "#   rows grouped by expert in token order), no permuted copy; same routing, floor\n"
        "#   (A counted as T*k*d) and peers. The tuned row before it times the same tile\n"
        "#   from the permuted copy. Checked against that copied run: %d of %d points bit\n"
        "#   for bit.\n",
        gathered, g_gather_checked - g_gather_bad, g_gather_checked);
  for (int i = 0; i < g_n_notes; i++) printf("# n/a: %s\n", g_notes[i]);
}

static void print_table(void) {
  printf("\n%-14s %-5s %-6s %6s %9s %10s %6s %7s %5s %9s %8s %9s %10s %7s  %s\n", "preset", "gemm",
         "path", "T", "time us", "floor us", "%floor", "TFLOP/s", "TB/s", "dense us", "dense TF",
         "loop us", "grouped us", "vs peer", "targets");
  int fallbacks = 0, met = 0, gathered = 0;
  for (int i = 0; i < g_n_points; i++) {
    const point *p = &g_points[i];
    char floor[32], b[5][32], shown[16];
    const int fb = isnan(p->dense_tflops);
    snprintf(floor, sizeof floor, "%.1f%s", p->floor_us, fb ? "*" : "");
    fallbacks += fb, met += !strcmp(p->targets, "ok"), gathered += p->gathers;
    printf("%-14s %-5s %-6s %6lld %9.1f %10s %5.1f%% %7.1f %5.2f %9s %8s %9s %10s %7s  %s\n",
           p->preset, p->gemm, shown_path(p, shown, sizeof shown), (long long)p->tokens, p->us,
           floor, 100 * p->floor_us / p->us, p->tflops, p->tbs,
           cell(b[0], 32, "%.1f", p->peers.dense), cell(b[1], 32, "%.1f", p->dense_tflops),
           cell(b[2], 32, "%.1f", p->peers.loop), cell(b[3], 32, "%.1f", p->peers.grouped),
           cell(b[4], 32, "%.2fx", p->speedup), p->targets);
  }
  print_footer(fallbacks, met, gathered);
}

/* --path: "auto", "mma", "wgmma", "gemv", "tuned", "both" (mma then wgmma)
 * or "compare" (auto then tuned). */
static int parse_paths(const char *v) {
  if (!strcmp(v, "both")) {
    g_paths[0] = MOEJIT_GEMM_PATH_MMA, g_paths[1] = MOEJIT_GEMM_PATH_WGMMA, g_n_paths = 2;
    return 1;
  }
  if (!strcmp(v, "compare")) {
    g_paths[0] = MOEJIT_GEMM_PATH_AUTO, g_paths[1] = BENCH_PATH_TUNED, g_n_paths = 2;
    return 1;
  }
  g_n_paths = 1;
  if (!strcmp(v, "auto")) g_paths[0] = MOEJIT_GEMM_PATH_AUTO;
  else if (!strcmp(v, "mma")) g_paths[0] = MOEJIT_GEMM_PATH_MMA;
  else if (!strcmp(v, "wgmma")) g_paths[0] = MOEJIT_GEMM_PATH_WGMMA;
  else if (!strcmp(v, "gemv")) g_paths[0] = MOEJIT_GEMM_PATH_GEMV;
  else if (!strcmp(v, "tuned")) g_paths[0] = BENCH_PATH_TUNED;
  else return 0;
  return 1;
}

/* ---- --smoke: one 64x64x64 tile per GEMM and path, against the CPU ---- */

static float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; inputs are finite */
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* One expert, 64 rows: gemm2 y[64,64] = a[64,64] W2[64,64]^T (one tile);
 * gemm1 h[64,32] from W1[64,64] (32 gate + 32 up rows: one 64-B-row tile).
 * gather (gemm1 only): the rows come from an x of XR rows through an index,
 * as the layer's forward passes them (row r = x[index[r] / 2]; one index
 * negative: a row of zeros). Prints the max abs error, and on failure the
 * first mismatches and a map of which 8x8 blocks of the output are wrong
 * (descriptor / swizzle bugs show as patterns). Returns 1 on a mismatch, 0
 * otherwise (or skipped). */
static int smoke_one(moejit_ctx *ctx, int which, moejit_gemm_path path, int gather) {
  enum { M = 64, K = 64, XR = 40, DIV = 2 };
  const int n = which == 1 ? 32 : 64, w_rows = 64;
  moejit_spec s;
  CHECK(moejit_spec_load_preset("qwen3-30b-a3b", &s));
  s.hidden = 64, s.expert_width = which == 1 ? 32 : 64, s.experts = 1, s.top_k = 1;
  s.act_dtype = s.weight_dtype = s.out_dtype = MOEJIT_DTYPE_BF16;
  s.gemm1 = s.gemm2 = (moejit_gemm_cfg){64, 64, 64, 4, 8, 1, 1, (moejit_raster)0, MOEJIT_SCHEDULE_COOPERATIVE};
  CHECK(moejit_spec_validate(&s));
  uint16_t a[M * K], w[64 * K], out[M * 64], x[XR * K];
  int32_t index[M];
  double ref[M * 64], max_ref = 0, max_err = 0;
  char name[32];
  snprintf(name, sizeof name, "%s%s", path_name(path), gather ? "+gather" : "");
  for (int i = 0; i < M * K; i++) a[i] = f32_to_bf16((float)((rng_next() >> 11) * 0x1p-53 * 2 - 1));
  if (gather) { /* A = x's rows through the index, zeros for the negative one */
    memcpy(x, a, sizeof x);
    for (int r = 0; r < M; r++) {
      index[r] = r == 5 ? -1 : (int32_t)(rng_next() % (XR * DIV));
      for (int k = 0; k < K; k++) a[r * K + k] = index[r] < 0 ? 0 : x[index[r] / DIV * K + k];
    }
  }
  for (int i = 0; i < w_rows * K; i++)
    w[i] = f32_to_bf16((float)((rng_next() >> 11) * 0x1p-53 * 0.5 - 0.25));
  for (int r = 0; r < M; r++)
    for (int c = 0; c < n; c++) {
      double g = 0, u = 0;
      for (int k = 0; k < K; k++) {
        g += (double)bf16_to_f32(a[r * K + k]) * bf16_to_f32(w[c * K + k]);
        if (which == 1) u += (double)bf16_to_f32(a[r * K + k]) * bf16_to_f32(w[(n + c) * K + k]);
      }
      ref[r * n + c] = which == 1 ? g / (1 + exp(-g)) * u : g;
      max_ref = fmax(max_ref, fabs(ref[r * n + c]));
    }
  int32_t off[2] = {0, M};
  void *da, *dw, *dout, *doff, *dindex = NULL;
  CHECK(moejit_mem_alloc(ctx, sizeof a, NULL, &da));
  CHECK(moejit_mem_alloc(ctx, sizeof w, NULL, &dw));
  CHECK(moejit_mem_alloc(ctx, sizeof out, NULL, &dout));
  CHECK(moejit_mem_alloc(ctx, sizeof off, NULL, &doff));
  if (!gather) {
    CHECK(moejit_memcpy_htod(ctx, da, a, sizeof a, NULL));
  } else { /* A is x (XR rows), read through the index */
    CHECK(moejit_memcpy_htod(ctx, da, x, sizeof x, NULL));
    CHECK(moejit_mem_alloc(ctx, sizeof index, NULL, &dindex));
    CHECK(moejit_memcpy_htod(ctx, dindex, index, sizeof index, NULL));
  }
  CHECK(moejit_memcpy_htod(ctx, dw, w, sizeof w, NULL));
  CHECK(moejit_memcpy_htod(ctx, doff, off, sizeof off, NULL));
  CHECK(moejit_memset_d32(ctx, dout, 0xffffffffu, sizeof out / 4, NULL));
  moejit_gemm_args args = {.a = da,
                           .w = dw,
                           .out = dout,
                           .expert_offsets = doff,
                           .max_rows = M,
                           .path = path,
                           .a_index = dindex,
                           .a_index_div = gather ? DIV : 0,
                           .a_rows = gather ? XR : 0};
  moejit_status st = which == 1 ? moejit_gemm1_swiglu(ctx, &s, &args, NULL) : moejit_gemm2(ctx, &s, &args, NULL);
  int bad = 0;
  if (st == MOEJIT_ERR_UNSUPPORTED) {
    printf("smoke gemm%d %-5s: skipped: %s\n", which, name, moejit_last_error());
  } else {
    if (st == MOEJIT_OK) st = moejit_memcpy_dtoh(ctx, out, dout, sizeof out, NULL);
    if (st == MOEJIT_OK) st = moejit_ctx_synchronize(ctx);
    if (st != MOEJIT_OK) {
      printf("smoke gemm%d %-5s: FAILED to run: %s\n", which, name, moejit_last_error());
      bad = 1;
    }
  }
  if (st == MOEJIT_OK) {
    const double tol = 2e-2 * fmax(1.0, max_ref);
    char map[8][9];
    memset(map, '.', sizeof map);
    for (int r = 0; r < 8; r++) map[r][8] = '\0';
    int shown = 0;
    for (int r = 0; r < M; r++)
      for (int c = 0; c < n; c++) {
        double got = bf16_to_f32(out[r * n + c]), err = fabs(got - ref[r * n + c]);
        if (!(err <= tol)) { /* NaN (poison left unwritten) counts */
          bad = 1, map[r / 8][c / 8] = 'X';
          if (shown++ < 8)
            printf("  gemm%d %s: row %2d col %2d: got %10.5f want %10.5f\n", which, name, r, c, got,
                   ref[r * n + c]);
        }
        max_err = isnan(got) ? INFINITY : fmax(max_err, err);
      }
    printf("smoke gemm%d %-5s: max abs error %.3g (max |ref| %.3g, tolerance %.3g): %s\n", which,
           name, max_err, max_ref, tol, bad ? "MISMATCH" : "ok");
    if (bad) {
      printf("  wrong 8x8 blocks (rows down, cols across):\n");
      for (int r = 0; r < 8; r++) printf("    %.*s\n", n / 8, map[r]);
    }
  }
  moejit_mem_free(ctx, da, NULL), moejit_mem_free(ctx, dw, NULL);
  moejit_mem_free(ctx, dout, NULL), moejit_mem_free(ctx, doff, NULL);
  if (dindex) moejit_mem_free(ctx, dindex, NULL);
  return bad;
}

/* The ctx and its device line; without a GPU there is nothing to measure:
 * say so and exit 0 (a build box runs the benchmark only to see it start). */
static moejit_ctx *open_ctx(moejit_device_info *info) {
  moejit_ctx *ctx;
  moejit_status st = moejit_ctx_create(&ctx, NULL);
  if (st == MOEJIT_ERR_NO_DRIVER || st == MOEJIT_ERR_NO_DEVICE) {
    printf("moejit_bench_gemm: no GPU, nothing measured: %s\n", moejit_last_error());
    exit(0);
  }
  CHECK(st);
  CHECK(moejit_ctx_device_info(ctx, info));
  printf("# device: %s (%s, %d SMs)\n", info->name, info->arch, info->sm_count);
  return ctx;
}

static int smoke_test(void) {
  moejit_device_info info;
  moejit_ctx *ctx = open_ctx(&info);
  int bad = 0;
  /* gemv at 64 rows of one expert: eight passes over the weights */
  const moejit_gemm_path paths[] = {MOEJIT_GEMM_PATH_MMA, MOEJIT_GEMM_PATH_WGMMA,
                                    MOEJIT_GEMM_PATH_GEMV};
  for (int which = 2; which >= 1; which--)
    for (int p = 0; p < 3; p++) bad |= smoke_one(ctx, which, paths[p], 0);
  /* gemm1 reading x in place, as the layer's forward runs it (wgmma, the spec's tile) */
  bad |= smoke_one(ctx, 1, MOEJIT_GEMM_PATH_WGMMA, 1);
  moejit_ctx_destroy(ctx);
  return bad;
}

/* ---- --router: the router's logits beside cuBLAS --------------------------- */

/* logits [T, E] = x [T, d] . gate [E, d]^T of one preset's shape: ours
 * (moejit_router_logits, fp32 logits) and one cublasGemmEx of the same
 * shape (bf16 out), inputs rotating over sets until they pass L2. */
typedef struct router_run {
  moejit_model *model;
  moejit_stream stream; /* the peers' too */
  int64_t tokens, experts, hidden;
  void *x[MAX_SETS], *gate[MAX_SETS], *logits, *c_peer, *ws;
  size_t ws_bytes;
  int n_sets;
} router_run;

static int launch_router(void *state, int set, char *why) {
  const router_run *r = state;
  const moejit_router_logits_args a = {.tokens = r->tokens,
                                       .x = r->x[set],
                                       .gate_weight = r->gate[set],
                                       .logits = r->logits,
                                       .workspace = r->ws,
                                       .workspace_bytes = r->ws_bytes};
  if (moejit_router_logits(r->model, &a, r->stream) == MOEJIT_OK) return 0;
  snprintf(why, PEER_WHY_MAX, "%s", moejit_last_error());
  return -1;
}

static int launch_router_peer(void *state, int set, char *why) {
  const router_run *r = state;
  return peer_dense(g_peers, r->x[set], r->gate[set], r->c_peer, r->tokens, r->experts, r->hidden,
                    MOEJIT_DTYPE_BF16, why);
}

static void bench_router(moejit_ctx *ctx, const char *name, const int64_t *tokens, int n_tokens,
                         int iters, moejit_stream stream) {
  moejit_spec s;
  CHECK(moejit_spec_load_preset(name, &s));
  router_run r = {.stream = stream, .experts = s.experts, .hidden = s.hidden};
  CHECK(moejit_model_load(ctx, &s, &r.model));
  CHECK(moejit_router_logits_workspace_size(r.model, &r.ws_bytes));
  CHECK(moejit_mem_alloc(ctx, r.ws_bytes, NULL, &r.ws));
  for (int i = 0; i < n_tokens; i++) {
    r.tokens = tokens[i];
    const size_t xb = (size_t)(r.tokens * r.hidden) * 2, gb = (size_t)(r.experts * r.hidden) * 2;
    r.n_sets = (int)(ROTATE_BYTES / (double)(xb + gb)) + 1;
    if (r.n_sets > MAX_SETS) r.n_sets = MAX_SETS;
    for (int k = 0; k < r.n_sets; k++)
      r.x[k] = dev_random(ctx, xb), r.gate[k] = dev_random(ctx, gb);
    CHECK(moejit_mem_alloc(ctx, (size_t)(r.tokens * r.experts) * 4, NULL, &r.logits));
    CHECK(moejit_mem_alloc(ctx, (size_t)(r.tokens * r.experts) * 2, NULL, &r.c_peer));
    double ours[MAX_ROUNDS], peer[MAX_ROUNDS];
    char why[PEER_WHY_MAX] = "", pwhy[PEER_WHY_MAX] = "";
    for (int round = 0; round < g_rounds; round++) {
      ours[round] = time_launches(ctx, launch_router, &r, r.n_sets, iters, stream, why);
      peer[round] =
          g_peers ? time_launches(ctx, launch_router_peer, &r, r.n_sets, iters, stream, pwhy) : NAN;
    }
    const double us = median_of(ours, g_rounds), peer_us = median_of(peer, g_rounds);
    const double flops = 2.0 * (double)r.tokens * (double)r.experts * (double)r.hidden;
    const double bytes = (double)(xb + gb) + (double)(r.tokens * r.experts) * 4;
    const double floor_us = fmax(flops / PEAK_FLOPS, bytes / g_read_bytes_per_s) * 1e6;
    char pc[32], sp[32];
    printf("%-14s %6lld %4lld %6lld %-5s %9.1f %9s %9.1f %6.1f%% %8.1f %6.2f %8s\n", name,
           (long long)r.tokens, (long long)r.experts, (long long)r.hidden,
           r.tokens <= MOEJIT_ROUTER_WARP_MAX_TOKENS ? "warps" : "tiles", us,
           cell(pc, sizeof pc, "%.1f", peer_us), floor_us, 100.0 * floor_us / us, flops / us * 1e-6,
           bytes / us * 1e-6, cell(sp, sizeof sp, "%.2fx", peer_us / us));
    if (isnan(us)) printf("# %s T=%lld: ours failed: %s\n", name, (long long)r.tokens, why);
    if (g_peers && isnan(peer_us))
      printf("# %s T=%lld: cuBLAS failed: %s\n", name, (long long)r.tokens, pwhy);
    for (int k = 0; k < r.n_sets; k++) {
      moejit_mem_free(ctx, r.x[k], NULL);
      moejit_mem_free(ctx, r.gate[k], NULL);
    }
    moejit_mem_free(ctx, r.logits, NULL);
    moejit_mem_free(ctx, r.c_peer, NULL);
  }
  moejit_mem_free(ctx, r.ws, NULL);
  moejit_model_destroy(r.model);
}

static void usage(void) {
  printf(
      "usage: moejit_bench_gemm [--preset NAME]... [--tokens 1,32,...] [--iters N (>= 20)] "
      "[--rounds N]\n"
      "                         [--heat-ms MS] [--path auto|mma|wgmma|gemv|tuned|both|compare]\n"
      "                         [--routing uniform|balanced] [--read-tbps X] [--csv FILE] "
      "[--smoke] [--router]\n"
      "                         [--gemm1 M,N,K,STAGES,WARPS[,RASTER[,CLUSTER_M[,SCHEDULE"
      "[,CLUSTER_N]]]]]\n"
      "                         [--gemm2 ...]\n"
      "  (tile overrides: RASTER 0 along M, 1 along N, -1 the preset's; CLUSTER_M and\n"
      "  CLUSTER_N 1 or 2, 0 the preset's; SCHEDULE 0 cooperative, 1 pingpong, -1 the\n"
      "  preset's)\n"
      "Times gemm1 (+SwiGLU) and gemm2 of each preset (default: mixtral-8x7b,\n"
      "qwen3-30b-a3b, deepseek-v3) at T tokens (default 1,32,256,2048,16384) with random\n"
      "uniform top-k routing (--routing balanced: slot t*k + j on expert (t*k + j) mod E,\n"
      "every expert T*k/E rows, so no expert's last M-tile is short where T*k/E is a tile\n"
      "multiple): median of N launches after MS ms of the same launches\n"
      "(--heat-ms, default 0; 100 lets the clocks settle under that load, as in a model)\n"
      "and 3 warm-ups, beside cuBLAS peers timed the same way in the same run: dense (one\n"
      "cublasGemmEx of equal FLOPs, which sets the floor), loop (cublasGemmEx per expert)\n"
      "and grouped (cublasGemmGroupedBatchedEx). --rounds N (default 3, 1..9) times ours\n"
      "and each peer in turn N times, who goes first changing every round, and keeps the\n"
      "median.\n"
      "Floor = max(FLOPs / dense TFLOP/s, bytes / 3.0 TB/s), bytes = active experts'\n"
      "weights + A + C; 3.0 TB/s is an H100's read rate, --read-tbps X gives this GPU's.\n"
      "Prints one table with the targets each row meets or misses\n"
      "(docs/gemm.md); --csv FILE writes the same rows.\n"
      "--path both prints an mma row and a wgmma row per point (wgmma needs sm_90a);\n"
      "gemv runs the weight-streaming decode kernel at any T (AUTO takes it at T*k <= 8);\n"
      "tuned runs what this GPU's tuned table names for the point (what a loaded model\n"
      "runs; auto where it names nothing), gemm1 reading x in place where the layer does\n"
      "(path tuned*: moejit_moe_gemm1_gathers of the preset's loaded layer, checked bit for\n"
      "bit against the copy; exit 1 on a mismatch); compare prints an auto and a tuned row.\n"
      "--smoke runs one 64x64x64 tile of each GEMM on each path (and gemm1 wgmma gathering\n"
      "its rows from x) against a CPU reference and prints the max abs error and the first\n"
      "mismatches (exit 1 on any).\n"
      "--router times the router's logits instead (x [T, d] . gate [E, d]^T,\n"
      "moejit_router_logits with its workspace, fp32 logits) beside one cublasGemmEx of\n"
      "the same shape (bf16 out), floor max(FLOPs / 750 TFLOP/s, bytes / 3.0 TB/s).\n"
      "Without a GPU it says so and exits 0.\n");
}

int main(int argc, char **argv) {
  const char *presets[8] = {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"};
  const char *csv_path = NULL;
  int n_presets = 3, n_tokens = 5, iters = 30, custom = 0, smoke = 0, router = 0;
  int64_t tokens[16] = {1, 32, 256, 2048, 16384};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
      if (!custom) n_presets = 0, custom = 1; /* named presets replace the default list */
      if (n_presets < 8) presets[n_presets++] = argv[++i];
    } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
      n_tokens = 0;
      for (char *t = strtok(argv[++i], ","); t && n_tokens < 16; t = strtok(NULL, ","))
        tokens[n_tokens++] = atoll(t);
    } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
      g_rounds = atoi(argv[++i]);
      if (g_rounds < 1 || g_rounds > MAX_ROUNDS) {
        fprintf(stderr, "moejit_bench_gemm: --rounds: 1 to %d\n", MAX_ROUNDS);
        return 2;
      }
    } else if (!strcmp(argv[i], "--heat-ms") && i + 1 < argc) {
      const char *v = argv[++i];
      char *end = NULL;
      g_heat_ms = strtod(v, &end);
      if (end == v || *end || !(g_heat_ms >= 0 && g_heat_ms <= 10000)) {
        fprintf(stderr, "moejit_bench_gemm: --heat-ms '%s': a number of ms, 0 to 10000\n", v);
        return 2;
      }
    } else if (!strcmp(argv[i], "--read-tbps") && i + 1 < argc) {
      const char *v = argv[++i];
      char *end = NULL;
      const double tbps = strtod(v, &end);
      if (end == v || *end || !(tbps > 0 && tbps <= 1000)) {
        fprintf(stderr,
                "moejit_bench_gemm: --read-tbps '%s': the read rate this GPU reaches, in TB/s "
                "(above 0, up to 1000)\n",
                v);
        return 2;
      }
      g_read_bytes_per_s = tbps * 1e12;
    } else if (!strcmp(argv[i], "--path") && i + 1 < argc && parse_paths(argv[i + 1])) {
      i++;
    } else if ((!strcmp(argv[i], "--gemm1") || !strcmp(argv[i], "--gemm2")) && i + 1 < argc &&
               parse_tile(argv[i + 1], &g_override[argv[i][6] - '1'])) {
      i++;
    } else if (!strcmp(argv[i], "--routing") && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "uniform") && strcmp(v, "balanced")) {
        fprintf(stderr, "moejit_bench_gemm: --routing '%s': uniform or balanced\n", v);
        return 2;
      }
      g_balanced = !strcmp(v, "balanced");
    } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (!strcmp(argv[i], "--smoke")) {
      smoke = 1;
    } else if (!strcmp(argv[i], "--router")) {
      router = 1;
    } else {
      usage();
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  for (int i = 0; i < n_tokens; i++)
    if (tokens[i] < 1) {
      fprintf(stderr, "moejit_bench_gemm: --tokens: each T must be >= 1\n");
      return 2;
    }
  if (smoke) return smoke_test();
  iters = iters < 20 ? 20 : iters > 256 ? 256 : iters;
  g_iters = iters;
  moejit_device_info info;
  moejit_ctx *ctx = open_ctx(&info);
  snprintf(g_device, sizeof g_device, "%s", info.name);
  if (csv_path && !(g_csv = fopen(csv_path, "w"))) {
    perror(csv_path);
    return 2;
  }
  if (g_csv) fputs(csv_header, g_csv);
  moejit_stream stream;
  CHECK(moejit_stream_create(ctx, &stream));
  if (peers_create(info.ordinal, stream, &g_peers, g_peers_why) == 0)
    printf("# peers: %s (dense, loop, grouped), bf16 in and out, fp32 sums\n", peers_name(g_peers));
  else
    printf("# peers: n/a: %s\n", g_peers_why);
  CHECK(moejit_mem_alloc(ctx, 8, NULL, (void **)&g_round_sync));
  CHECK(moejit_memset_d32(ctx, g_round_sync, 0, 2, stream));
  g_split_bytes = MOEJIT_GEMM2_SPLIT_MAX_BYTES(info.sm_count);
  CHECK(moejit_mem_alloc(ctx, g_split_bytes, NULL, &g_split));
  CHECK(moejit_memset_d32(ctx, g_split, 0, g_split_bytes / 4, stream));
  make_chunk(MOEJIT_DTYPE_BF16);
  if (router) {
    printf("\n%-14s %6s %4s %6s %-5s %9s %9s %9s %7s %8s %6s %8s\n", "preset", "T", "E", "d",
           "form", "us", "cublas_us", "floor_us", "%floor", "TFLOP/s", "TB/s", "vs_cublas");
    for (int i = 0; i < n_presets; i++)
      bench_router(ctx, presets[i], tokens, n_tokens, iters, stream);
  } else {
    for (int i = 0; i < n_presets; i++)
      bench_preset(ctx, presets[i], tokens, n_tokens, iters, stream);
    print_table();
  }
  peers_destroy(g_peers);
  moejit_mem_free(ctx, g_round_sync, NULL);
  moejit_mem_free(ctx, g_split, NULL);
  moejit_stream_destroy(ctx, stream);
  moejit_ctx_destroy(ctx);
  if (g_csv && fclose(g_csv)) return perror(csv_path), 1;
  free(g_chunk);
  return g_gather_bad ? 1 : 0; /* a gathered gemm1 that computed other values than the copy */
}
