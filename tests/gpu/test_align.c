/* moejit_align on the GPU: every output equal to the CPU reference
 * (ref_align.c) and, independently, a valid stable permutation with a tile
 * list covering every expert (ref_align_check); xs rows equal to their
 * token's x row bit for bit and rows past N untouched. Over E in {8, 64,
 * 128, 256}, k in {1, 2, 8}, T in {1, 7, 1000, 16384}, expert ranges, all
 * tokens on one expert, experts with no tokens, invalid ids, both chunk
 * sizes, fp32/fp16/bf16 rows; outputs poisoned before each run, two runs
 * bitwise identical; bad arguments refused. Where one chunk holds every
 * entry (count and scan fused into one launch), the same checks, and the
 * fused path bit for bit equal to the three launches (MOEJIT_ALIGN_FUSED=0);
 * and for 2 to MJ_ALIGN_SCAN_SCATTER_CHUNKS chunks (scan and scatter in
 * one launch) likewise. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "ops/ops.h"
#include "ops_gpu.h"
#include "ref_align.h"

typedef struct align_bufs {
  int32_t *ids, *counts, *offsets, *sorted, *row_of, *tile_expert, *tile_row, *num_tiles;
  void *x, *xs, *ws;
  size_t ws_bytes;
  int64_t capacity;
} align_bufs;

static size_t row_bytes(const moejit_spec *s) {
  return (size_t)s->hidden * moejit_dtype_size(s->act_dtype);
}

static align_bufs bufs_alloc(const moejit_model *m, int64_t tokens, int with_x) {
  const moejit_spec *s = moejit_model_spec(m);
  const size_t n = (size_t)(tokens * s->top_k) * 4;
  align_bufs b = {0};
  OPS_OK(moejit_align_tile_capacity(m, tokens, &b.capacity));
  OPS_OK(moejit_align_workspace_size(m, tokens, &b.ws_bytes));
  b.ids = ops_alloc(n);
  b.counts = ops_alloc((size_t)s->experts * 4);
  b.offsets = ops_alloc((size_t)(s->experts + 1) * 4);
  b.sorted = ops_alloc(n);
  b.row_of = ops_alloc(n);
  b.tile_expert = ops_alloc((size_t)b.capacity * 4);
  b.tile_row = ops_alloc((size_t)b.capacity * 4);
  b.num_tiles = ops_alloc(4);
  b.ws = ops_alloc(b.ws_bytes);
  if (with_x) {
    b.x = ops_alloc((size_t)tokens * row_bytes(s));
    b.xs = ops_alloc((size_t)(tokens * s->top_k) * row_bytes(s));
  }
  return b;
}

static void bufs_free(align_bufs *b) {
  void *all[] = {b->ids,      b->counts,    b->offsets, b->sorted, b->row_of, b->tile_expert,
                 b->tile_row, b->num_tiles, b->ws,      b->x,      b->xs};
  for (size_t i = 0; i < MJ_ARRAY_LEN(all); i++) ops_free(all[i]);
}

static moejit_align_args args_for(const align_bufs *b, int64_t tokens, int first, int last) {
  moejit_align_args a = {.tokens = tokens,
                         .topk_ids = b->ids,
                         .expert_first = first,
                         .expert_last = last,
                         .x = b->x,
                         .xs = b->xs,
                         .expert_counts = b->counts,
                         .expert_offsets = b->offsets,
                         .sorted_slot = b->sorted,
                         .row_of = b->row_of,
                         .tile_expert = b->tile_expert,
                         .tile_row_start = b->tile_row,
                         .num_tiles = b->num_tiles,
                         .workspace = b->ws,
                         .workspace_bytes = b->ws_bytes};
  return a;
}

static void poison_outputs(const moejit_spec *s, const align_bufs *b, int64_t tokens) {
  const size_t n = (size_t)(tokens * s->top_k) * 4;
  ops_poison(b->counts, (size_t)s->experts * 4, OPS_POISON_INT);
  ops_poison(b->offsets, (size_t)(s->experts + 1) * 4, OPS_POISON_INT);
  ops_poison(b->sorted, n, OPS_POISON_INT);
  ops_poison(b->row_of, n, OPS_POISON_INT);
  ops_poison(b->tile_expert, (size_t)b->capacity * 4, OPS_POISON_INT);
  ops_poison(b->tile_row, (size_t)b->capacity * 4, OPS_POISON_INT);
  ops_poison(b->num_tiles, 4, OPS_POISON_INT);
  ops_poison(b->ws, b->ws_bytes, OPS_POISON_INT); /* the workspace needs no init */
  if (b->xs) ops_poison(b->xs, (size_t)(tokens * s->top_k) * row_bytes(s), OPS_POISON_NAN);
}

static void download(const moejit_spec *s, const align_bufs *b, int64_t tokens, ref_align_out *o,
                     void *xs) {
  const size_t n = (size_t)(tokens * s->top_k) * 4;
  ops_download(o->counts, b->counts, (size_t)s->experts * 4);
  ops_download(o->offsets, b->offsets, (size_t)(s->experts + 1) * 4);
  ops_download(o->sorted_slot, b->sorted, n);
  ops_download(o->row_of, b->row_of, n);
  /* the call's tile list holds tile_capacity(tokens) entries; the buffers
   * may be larger (sized for more tokens) */
  ops_download(o->tile_expert, b->tile_expert, (size_t)o->tile_capacity * 4);
  ops_download(o->tile_row_start, b->tile_row, (size_t)o->tile_capacity * 4);
  ops_download(&o->num_tiles, b->num_tiles, 4);
  if (xs) ops_download(xs, b->xs, (size_t)(tokens * s->top_k) * row_bytes(s));
}

static int same_out(const moejit_spec *s, int64_t tokens, const ref_align_out *a,
                    const ref_align_out *b) {
  const size_t n = (size_t)(tokens * s->top_k) * 4, cap = (size_t)a->tile_capacity * 4;
  return !memcmp(a->counts, b->counts, (size_t)s->experts * 4) &&
         !memcmp(a->offsets, b->offsets, (size_t)(s->experts + 1) * 4) &&
         !memcmp(a->sorted_slot, b->sorted_slot, n) && !memcmp(a->row_of, b->row_of, n) &&
         !memcmp(a->tile_expert, b->tile_expert, cap) &&
         !memcmp(a->tile_row_start, b->tile_row_start, cap) && a->num_tiles == b->num_tiles;
}

static void expect_ints(const int32_t *got, const int32_t *want, int64_t n, const char *field,
                        const char *what) {
  for (int64_t i = 0; i < n; i++)
    cr_assert_eq(got[i], want[i], "%s: %s[%lld] = %d, reference %d", what, field, (long long)i,
                 got[i], want[i]);
}

/* xs row r < N is x[sorted_slot[r] / k]; rows from N on kept their poison. */
static void check_xs(const moejit_spec *s, int64_t tokens, const ref_align_out *o, const void *x,
                     const void *xs, const char *what) {
  const size_t rb = row_bytes(s);
  const int64_t rows = tokens * s->top_k, kept = o->offsets[s->experts];
  for (int64_t r = 0; r < kept; r++) {
    const int64_t t = o->sorted_slot[r] / s->top_k;
    cr_assert(!memcmp((const char *)xs + r * rb, (const char *)x + t * rb, rb),
              "%s: xs row %lld is not x row %lld", what, (long long)r, (long long)t);
  }
  cr_assert(ops_all_words((const char *)xs + kept * rb, (size_t)(rows - kept) * rb, OPS_POISON_NAN),
            "%s: align wrote xs rows past N = %lld", what, (long long)kept);
}

/* The reference's shape of a call on s (first == last: every expert). */
static ref_align_shape shape_for(const moejit_spec *s, int64_t tokens, int first, int last) {
  const ref_align_shape shape = {.tokens = tokens,
                                 .top_k = s->top_k,
                                 .experts = s->experts,
                                 .first = first == last ? 0 : first,
                                 .last = first == last ? s->experts : last,
                                 .tile_m = s->gemm1.tile_m};
  return shape;
}

/* Runs align twice on `ids` (and random x when the buffers have one),
 * checks both runs agree bitwise, and checks the result. */
static void run_and_check(const moejit_model *m, align_bufs *b, int64_t tokens, const int32_t *ids,
                          int first, int last, ts_rng *r, const char *what) {
  const moejit_spec *s = moejit_model_spec(m);
  const ref_align_shape shape = shape_for(s, tokens, first, last);
  ref_align_out got[2], want;
  cr_assert(ref_align_out_alloc(&shape, &got[0]) && ref_align_out_alloc(&shape, &got[1]) &&
            ref_align_out_alloc(&shape, &want));
  int64_t capacity = 0;
  OPS_OK(moejit_align_tile_capacity(m, tokens, &capacity));
  cr_assert_eq(got[0].tile_capacity, capacity, "%s: tile capacity: ops.h says %lld, the reference %lld",
               what, (long long)capacity, (long long)got[0].tile_capacity);
  cr_assert_leq(capacity, b->capacity, "%s: tile capacity %lld exceeds the buffers' %lld", what,
                (long long)capacity, (long long)b->capacity);
  const size_t xs_bytes = b->xs ? (size_t)(tokens * s->top_k) * row_bytes(s) : 0;
  void *x = NULL, *xs[2] = {NULL, NULL};
  if (b->x) {
    const size_t x_bytes = (size_t)tokens * row_bytes(s);
    x = malloc(x_bytes);
    xs[0] = malloc(xs_bytes);
    xs[1] = malloc(xs_bytes);
    cr_assert(x && xs[0] && xs[1]);
    for (size_t i = 0; i < x_bytes / 4; i++) ((uint32_t *)x)[i] = (uint32_t)ts_next(r);
    ops_upload(b->x, x, x_bytes);
  }
  ops_upload(b->ids, ids, (size_t)(tokens * s->top_k) * 4);
  const moejit_align_args a = args_for(b, tokens, first, last);
  for (int run = 0; run < 2; run++) {
    poison_outputs(s, b, tokens);
    OPS_OK(moejit_align(m, &a, NULL));
    download(s, b, tokens, &got[run], xs[run]);
  }
  cr_assert(same_out(s, tokens, &got[0], &got[1]), "%s: two identical runs differ", what);
  cr_assert(!xs_bytes || !memcmp(xs[0], xs[1], xs_bytes), "%s: xs differs between runs", what);

  const char *bad = ref_align_check(&shape, ids, &got[0]);
  cr_assert(bad == NULL, "%s: %s", what, bad);
  ref_align(&shape, ids, &want);
  const int64_t n = tokens * s->top_k;
  expect_ints(got[0].counts, want.counts, s->experts, "counts", what);
  expect_ints(got[0].offsets, want.offsets, s->experts + 1, "offsets", what);
  expect_ints(got[0].sorted_slot, want.sorted_slot, n, "sorted_slot", what);
  expect_ints(got[0].row_of, want.row_of, n, "row_of", what);
  cr_assert_eq(got[0].num_tiles, want.num_tiles, "%s: num_tiles", what);
  expect_ints(got[0].tile_expert, want.tile_expert, want.tile_capacity, "tile_expert", what);
  expect_ints(got[0].tile_row_start, want.tile_row_start, want.tile_capacity, "tile_row_start",
              what);
  if (x) check_xs(s, tokens, &got[0], x, xs[0], what);
  free(x);
  free(xs[0]);
  free(xs[1]);
  ref_align_out_free(&got[0]);
  ref_align_out_free(&got[1]);
  ref_align_out_free(&want);
}

TestSuite(align_gpu, .timeout = 600);

Test(align_gpu, grid_of_experts_topk_and_tokens) {
  OPS_REQUIRE_GPU();
  static const int experts[] = {8, 64, 128, 256}, top_k[] = {1, 2, 8};
  static const int64_t tokens[] = {1, 7, 1000, 16384};
  enum { NE = 4, NK = 3 };
  moejit_spec specs[NE * NK];
  moejit_model *models[NE * NK];
  for (int e = 0; e < NE; e++)
    for (int k = 0; k < NK; k++) specs[e * NK + k] = ops_spec(experts[e], top_k[k], 256);
  ops_load_models(specs, NE * NK, MJ_OPS_ALIGN, models);
  ts_rng r = ts_rng_fresh("align-grid");
  int32_t *ids = malloc(sizeof(int32_t) * 16384 * 8);
  for (int i = 0; i < NE * NK; i++) {
    for (size_t t = 0; t < MJ_ARRAY_LEN(tokens); t++) {
      const int64_t T = tokens[t];
      const int with_x = T <= 1000; /* the copy at T = 16384: dedicated tests */
      char what[96];
      snprintf(what, sizeof what, "E=%d k=%d T=%lld", specs[i].experts, specs[i].top_k,
               (long long)T);
      ops_random_ids(&r, T, specs[i].top_k, specs[i].experts, ids);
      align_bufs b = bufs_alloc(models[i], T, with_x);
      run_and_check(models[i], &b, T, ids, 0, 0, &r, what);
      bufs_free(&b);
    }
    moejit_model_destroy(models[i]);
  }
  free(ids);
}

/* Preset shapes with the copy at full size (Qwen3 at T = 16384, DeepSeek-V3
 * rows at T = 1000), other row dtypes, a 256-thread block (another chunk
 * size) and a 64-row GEMM tile. */
Test(align_gpu, copies_rows_of_every_dtype) {
  OPS_REQUIRE_GPU();
  moejit_spec specs[5] = {ops_spec(128, 8, 2048), ops_spec(256, 8, 7168), ops_spec(64, 2, 512),
                          ops_spec(32, 4, 264), ops_spec(256, 8, 256)};
  const int64_t tokens[5] = {16384, 1000, 1000, 777, 16384};
  specs[2].act_dtype = MOEJIT_DTYPE_FP32;
  specs[3].act_dtype = MOEJIT_DTYPE_FP16;
  specs[4].align.block_threads = 256;
  specs[4].gemm1.tile_m = 64;
  moejit_model *models[5];
  ops_load_models(specs, 5, MJ_OPS_ALIGN, models);
  ts_rng r = ts_rng_fresh("align-copy");
  int32_t *ids = malloc(sizeof(int32_t) * 16384 * 8);
  for (int i = 0; i < 5; i++) {
    char what[96];
    snprintf(what, sizeof what, "copy E=%d k=%d d=%lld %s T=%lld", specs[i].experts, specs[i].top_k,
             (long long)specs[i].hidden, moejit_dtype_name(specs[i].act_dtype),
             (long long)tokens[i]);
    ops_random_ids(&r, tokens[i], specs[i].top_k, specs[i].experts, ids);
    align_bufs b = bufs_alloc(models[i], tokens[i], 1);
    run_and_check(models[i], &b, tokens[i], ids, 0, 0, &r, what);
    bufs_free(&b);
    moejit_model_destroy(models[i]);
  }
  free(ids);
}

Test(align_gpu, expert_ranges_drop_the_other_experts) {
  OPS_REQUIRE_GPU();
  const moejit_spec s = ops_spec(64, 8, 256);
  moejit_model *m = NULL;
  ops_load_models(&s, 1, MJ_OPS_ALIGN, &m);
  ts_rng r = ts_rng_fresh("align-ranges");
  const int64_t T = 1000;
  int32_t *ids = malloc(sizeof(int32_t) * T * 8);
  ops_random_ids(&r, T, 8, 64, ids);
  const int ranges[][2] = {{16, 32}, {0, 1}, {63, 64}, {0, 64}, {5, 6}};
  align_bufs b = bufs_alloc(m, T, 1);
  for (size_t i = 0; i < MJ_ARRAY_LEN(ranges); i++) {
    char what[64];
    snprintf(what, sizeof what, "range [%d, %d)", ranges[i][0], ranges[i][1]);
    run_and_check(m, &b, T, ids, ranges[i][0], ranges[i][1], &r, what);
  }
  bufs_free(&b);
  free(ids);
  moejit_model_destroy(m);
}

/* All tokens on one expert (also the same expert k times in a token),
 * experts without tokens, and ids outside 0..E-1 (dropped). */
Test(align_gpu, skewed_empty_and_invalid_ids) {
  OPS_REQUIRE_GPU();
  moejit_spec specs[2] = {ops_spec(256, 8, 256), ops_spec(128, 8, 2048)};
  specs[1].align.block_threads = 256;
  moejit_model *models[2];
  ops_load_models(specs, 2, MJ_OPS_ALIGN, models);
  ts_rng r = ts_rng_fresh("align-skew");
  const int64_t T = 16384;
  int32_t *ids = malloc(sizeof(int32_t) * T * 8);
  for (int i = 0; i < 2; i++) {
    const int E = specs[i].experts;
    align_bufs b = bufs_alloc(models[i], T, 0);
    for (int64_t e = 0; e < T * 8; e++) ids[e] = 3;
    run_and_check(models[i], &b, T, ids, 0, 0, &r, "every entry on expert 3");
    ops_random_ids(&r, T, 8, E, ids);
    for (int64_t t = 0; t < T; t++) ids[t * 8 + (t % 8)] = E - 1;
    run_and_check(models[i], &b, T, ids, 0, 0, &r, "every token on expert E-1");
    for (int64_t e = 0; e < T * 8; e++) ids[e] = 2 * (int32_t)(ts_next(&r) % (uint64_t)(E / 2));
    run_and_check(models[i], &b, T, ids, 0, 0, &r, "odd experts empty");
    for (int64_t e = 0; e < T * 8; e += 5)
      ids[e] = (e / 5) % 3 == 0 ? -1 : (e / 5) % 3 == 1 ? E : 1 << 30;
    run_and_check(models[i], &b, T, ids, 0, 0, &r, "invalid ids");
    run_and_check(models[i], &b, T, ids, E / 2, E, &r, "invalid ids with a range");
    bufs_free(&b);
    moejit_model_destroy(models[i]);
  }
  free(ids);
}

/* The paths check_both_paths compares with the three launches. */
typedef enum {
  PATH_COUNT_SCAN,  /* one chunk: count + scan, then the scatter */
  PATH_SCAN_SCATTER /* 2 to MJ_ALIGN_SCAN_SCATTER_CHUNKS chunks: count, then scan + scatter */
} align_path;

/* run_and_check on one path and on the three launches
 * (MOEJIT_ALIGN_FUSED=0), with the same ids and the same x; then the two
 * paths' outputs, xs and workspace compared bit for bit. The workspace's
 * chunk ranks are equal; its chunk_counts hold the chunk bases after the
 * three launches and after count + scan, and the histograms after scan +
 * scatter, whose column-wise exclusive sums must then be those bases. */
static void check_both_paths(const moejit_model *m, align_bufs *b, int64_t tokens,
                             const int32_t *ids, int first, int last, ts_rng *r, align_path path,
                             const char *what) {
  const moejit_spec *s = moejit_model_spec(m);
  const int64_t chunks = mj_align_chunks(s, tokens);
  if (path == PATH_COUNT_SCAN) {
    cr_assert_eq(chunks, 1, "%s: %lld tokens take more than one chunk", what, (long long)tokens);
    cr_assert(!m->align_unfused, "%s: the fused kernel does not fit this device", what);
  } else {
    cr_assert(chunks >= 2 && chunks <= MJ_ALIGN_SCAN_SCATTER_CHUNKS,
              "%s: %lld tokens take %lld chunks", what, (long long)tokens, (long long)chunks);
  }
  const ref_align_shape shape = shape_for(s, tokens, first, last);
  const int64_t n = tokens * s->top_k;
  const size_t xs_bytes = b->xs ? (size_t)n * row_bytes(s) : 0;
  const size_t rank_at = mj_align_rank_offset(s, tokens), ws_used = rank_at + (size_t)n * 4;
  cr_assert_leq(ws_used, b->ws_bytes);
  const ts_rng start = *r;
  ref_align_out out[2];
  void *xs[2] = {NULL, NULL}, *ws[2];
  for (int i = 0; i < 2; i++) { /* 0: the path, 1: three launches */
    char w[192];
    snprintf(w, sizeof w, "%.160s, %s", what,
             i                         ? "three launches"
             : path == PATH_COUNT_SCAN ? "count + scan"
                                       : "scan + scatter");
    *r = start; /* the same x */
    setenv("MOEJIT_ALIGN_FUSED", i ? "0" : "1", 1);
    run_and_check(m, b, tokens, ids, first, last, r, w);
    unsetenv("MOEJIT_ALIGN_FUSED");
    cr_assert(ref_align_out_alloc(&shape, &out[i]));
    xs[i] = xs_bytes ? malloc(xs_bytes) : NULL;
    ws[i] = malloc(ws_used);
    cr_assert((!xs_bytes || xs[i]) && ws[i]);
    download(s, b, tokens, &out[i], xs[i]); /* the second run's, equal to the first's */
    ops_download(ws[i], b->ws, ws_used);
  }
  cr_assert(same_out(s, tokens, &out[0], &out[1]), "%s: the fused path and three launches differ",
            what);
  cr_assert(!xs_bytes || !memcmp(xs[0], xs[1], xs_bytes), "%s: xs differs between the paths", what);
  if (path == PATH_SCAN_SCATTER) { /* histograms -> bases, per bin over the chunks */
    const int bins = s->experts + 1;
    int32_t *cells = ws[0];
    for (int bin = 0; bin < bins; bin++) {
      int32_t run = 0;
      for (int64_t c = 0; c < chunks; c++) {
        const int32_t v = cells[c * bins + bin];
        cells[c * bins + bin] = run;
        run += v;
      }
    }
  }
  cr_assert(!memcmp(ws[0], ws[1], rank_at),
            "%s: the chunk bases differ between the paths (workspace)", what);
  cr_assert(!memcmp((char *)ws[0] + rank_at, (char *)ws[1] + rank_at, (size_t)n * 4),
            "%s: the chunk ranks differ between the paths (workspace)", what);
  for (int i = 0; i < 2; i++) {
    ref_align_out_free(&out[i]);
    free(xs[i]);
    free(ws[i]);
  }
}

/* Id patterns for the one-chunk cases; the last keeps experts [E/4, E/2). */
static const char *const one_chunk_patterns[] = {"random", "every entry on expert E-1",
                                                 "odd experts empty", "invalid ids",
                                                 "random, experts [E/4, E/2)"};

static void one_chunk_ids(int pattern, ts_rng *r, int64_t tokens, int k, int experts,
                          int32_t *ids) {
  const int64_t n = tokens * k;
  if (pattern == 1) {
    for (int64_t e = 0; e < n; e++) ids[e] = experts - 1;
    return;
  }
  if (pattern == 2) {
    for (int64_t e = 0; e < n; e++) ids[e] = 2 * (int32_t)(ts_next(r) % (uint64_t)(experts / 2));
    return;
  }
  ops_random_ids(r, tokens, k, experts, ids);
  if (pattern == 3)
    for (int64_t e = 0; e < n; e += 3)
      ids[e] = (e / 3) % 3 == 0 ? -1 : (e / 3) % 3 == 1 ? experts : 1 << 30;
}

/* check_both_paths on `path` for each id pattern of one_chunk_patterns at
 * T tokens; `label` leads each case's name. */
static void check_patterns(const moejit_model *m, align_bufs *b, int64_t T, int32_t *ids, ts_rng *r,
                           align_path path, const char *label) {
  const moejit_spec *s = moejit_model_spec(m);
  const int E = s->experts;
  for (int p = 0; p < (int)MJ_ARRAY_LEN(one_chunk_patterns); p++) {
    const int ranged = p == 4;
    char what[160];
    snprintf(what, sizeof what, "%.100s %s", label, one_chunk_patterns[p]);
    one_chunk_ids(p, r, T, s->top_k, E, ids);
    check_both_paths(m, b, T, ids, ranged ? E / 4 : 0, ranged ? E / 2 : 0, r, path, what);
  }
}

/* T*k <= kChunkEntries runs count and scan as one launch: T = 1, 7 and the
 * largest T of one chunk, over E / k / block shapes (a one-warp block, a
 * top-k that does not divide the chunk, a 64-row GEMM tile), with skewed,
 * empty, invalid and dropped ids, each against the reference and bit for
 * bit against the three launches. One token more takes two chunks (count,
 * then scan + scatter), checked at the boundary. */
Test(align_gpu, one_chunk_fuses_count_and_scan) {
  OPS_REQUIRE_GPU();
  enum { NS = 5 };
  moejit_spec specs[NS] = {ops_spec(8, 2, 256), ops_spec(64, 3, 256), ops_spec(128, 8, 256),
                           ops_spec(256, 8, 512), ops_spec(16, 4, 256)};
  specs[3].align.block_threads = 256;
  specs[3].gemm1.tile_m = 64;
  specs[4].align.block_threads = 32; /* one warp */
  moejit_model *models[NS];
  ops_load_models(specs, NS, MJ_OPS_ALIGN, models);
  ts_rng r = ts_rng_fresh("align-one-chunk");
  for (int i = 0; i < NS; i++) {
    const moejit_spec *s = &specs[i];
    const int E = s->experts, k = s->top_k;
    const int64_t most = mj_align_chunk_entries(s) / k; /* the largest T of one chunk */
    const int64_t tokens[] = {1, 7, most};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)((most + 1) * k));
    cr_assert(ids);
    for (size_t t = 0; t < MJ_ARRAY_LEN(tokens); t++) {
      const int64_t T = tokens[t];
      align_bufs b = bufs_alloc(models[i], T, 1);
      char label[96];
      snprintf(label, sizeof label, "E=%d k=%d block=%d T=%lld", E, k, s->align.block_threads,
               (long long)T);
      check_patterns(models[i], &b, T, ids, &r, PATH_COUNT_SCAN, label);
      bufs_free(&b);
    }
    cr_assert_eq(mj_align_chunks(s, most + 1), 2);
    align_bufs b = bufs_alloc(models[i], most + 1, 1);
    char what[160];
    snprintf(what, sizeof what, "E=%d k=%d block=%d T=%lld (two chunks)", E, k,
             s->align.block_threads, (long long)(most + 1));
    ops_random_ids(&r, most + 1, k, E, ids);
    run_and_check(models[i], &b, most + 1, ids, 0, 0, &r, what);
    bufs_free(&b);
    free(ids);
    moejit_model_destroy(models[i]);
  }
}

/* 2 to MJ_ALIGN_SCAN_SCATTER_CHUNKS chunks run count, then scan + scatter
 * in one launch: two chunks (one entry past the first), a partial and a
 * full last chunk, the most chunks, over E / k / block shapes (E = 256
 * with 1024-thread blocks; a top-k that does not divide the chunk; a
 * one-warp block; a 64-row tile), with and without the copy of x, and
 * skewed, empty, invalid and dropped ids, each against the reference and
 * bit for bit against the three launches. One chunk more takes three. */
Test(align_gpu, a_few_chunks_fuse_scan_and_scatter) {
  OPS_REQUIRE_GPU();
  enum { NS = 4 };
  moejit_spec specs[NS] = {ops_spec(128, 8, 256), ops_spec(64, 3, 256), ops_spec(256, 8, 512),
                           ops_spec(16, 4, 264)};
  specs[0].align.block_threads = 256;
  specs[2].gemm1.tile_m = 64;
  specs[3].align.block_threads = 32; /* one warp: chunks of 256 entries */
  specs[3].act_dtype = MOEJIT_DTYPE_FP16;
  moejit_model *models[NS];
  ops_load_models(specs, NS, MJ_OPS_ALIGN, models);
  ts_rng r = ts_rng_fresh("align-scan-scatter");
  for (int i = 0; i < NS; i++) {
    const moejit_spec *s = &specs[i];
    const int E = s->experts, k = s->top_k;
    const int64_t chunk = mj_align_chunk_entries(s);
    const int64_t most = MJ_ALIGN_SCAN_SCATTER_CHUNKS * chunk / k; /* the largest T */
    const int64_t tokens[] = {chunk / k + 1, (5 * chunk / 2) / k, 3 * chunk / k, most};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)((most + 8) * k));
    cr_assert(ids);
    for (size_t t = 0; t < MJ_ARRAY_LEN(tokens); t++) {
      const int64_t T = tokens[t];
      const int with_x = t % 2 == 0; /* the copy, or indices only */
      align_bufs b = bufs_alloc(models[i], T, with_x);
      char label[96];
      snprintf(label, sizeof label, "E=%d k=%d block=%d T=%lld%s", E, k, s->align.block_threads,
               (long long)T, with_x ? " +copy" : "");
      check_patterns(models[i], &b, T, ids, &r, PATH_SCAN_SCATTER, label);
      bufs_free(&b);
    }
    const int64_t past = (MJ_ALIGN_SCAN_SCATTER_CHUNKS * chunk + k) / k; /* one chunk more */
    cr_assert_eq(mj_align_chunks(s, past), MJ_ALIGN_SCAN_SCATTER_CHUNKS + 1);
    align_bufs b = bufs_alloc(models[i], past, 1);
    char what[160];
    snprintf(what, sizeof what, "E=%d k=%d block=%d T=%lld (%d chunks)", E, k,
             s->align.block_threads, (long long)past, MJ_ALIGN_SCAN_SCATTER_CHUNKS + 1);
    ops_random_ids(&r, past, k, E, ids);
    run_and_check(models[i], &b, past, ids, 0, 0, &r, what);
    bufs_free(&b);
    free(ids);
    moejit_model_destroy(models[i]);
  }
}

Test(align_gpu, workspace_for_more_tokens_serves_fewer) {
  OPS_REQUIRE_GPU();
  const moejit_spec s = ops_spec(128, 8, 256);
  moejit_model *m = NULL;
  ops_load_models(&s, 1, MJ_OPS_ALIGN, &m);
  size_t prev = 0;
  for (int64_t T = 1; T <= 1 << 20; T *= 4) {
    size_t bytes = 0;
    OPS_OK(moejit_align_workspace_size(m, T, &bytes));
    cr_expect_geq(bytes, prev, "workspace shrinks from %zu to %zu at T = %lld", prev, bytes,
                  (long long)T);
    prev = bytes;
  }
  ts_rng r = ts_rng_fresh("align-workspace");
  align_bufs b = bufs_alloc(m, 5000, 1);
  int32_t *ids = malloc(sizeof(int32_t) * 777 * 8);
  ops_random_ids(&r, 777, 8, 128, ids);
  run_and_check(m, &b, 777, ids, 0, 0, &r, "T = 777 in buffers for 5000");
  free(ids);
  bufs_free(&b);
  moejit_model_destroy(m);
}

Test(align_gpu, bad_arguments_are_refused_before_launching) {
  OPS_REQUIRE_GPU();
  const moejit_spec s = ops_spec(64, 4, 256);
  moejit_model *m = NULL;
  ops_load_models(&s, 1, MJ_OPS_ALIGN, &m);
  align_bufs b = bufs_alloc(m, 100, 1);
  poison_outputs(&s, &b, 100);
  const moejit_align_args good = args_for(&b, 100, 0, 0);
  moejit_align_args a;
#define REFUSED(change, needle)                                                            \
  do {                                                                                     \
    a = good;                                                                              \
    change;                                                                                \
    cr_expect_eq(moejit_align(m, &a, NULL), MOEJIT_ERR_INVALID_ARGUMENT, #change);         \
    cr_expect(strstr(moejit_last_error(), needle), "%s: message '%s' lacks '%s'", #change, \
              moejit_last_error(), needle);                                                \
  } while (0)
  REFUSED(a.tokens = 0, "tokens");
  REFUSED(a.tokens = (int64_t)INT32_MAX, "tokens");
  REFUSED(a.topk_ids = NULL, "topk_ids");
  REFUSED(a.expert_first = 3, "range");
  REFUSED((a.expert_first = 10, a.expert_last = 5), "range");
  REFUSED((a.expert_first = 0, a.expert_last = 65), "range");
  REFUSED(a.expert_first = -1, "range");
  REFUSED(a.xs = NULL, "xs");
  REFUSED(a.x = NULL, "x");
  REFUSED(a.x = (const char *)b.x + 8, "aligned");
  REFUSED(a.xs = (char *)b.xs + 2, "aligned");
  REFUSED(a.row_of = NULL, "row_of");
  REFUSED(a.sorted_slot = NULL, "sorted_slot");
  REFUSED(a.num_tiles = NULL, "num_tiles");
  REFUSED(a.tile_expert = (int32_t *)((char *)b.tile_expert + 1), "tile_expert");
  REFUSED(a.workspace = NULL, "workspace");
  REFUSED(a.workspace_bytes = b.ws_bytes - 1, "workspace_bytes");
  REFUSED(a.tokens = 101, "workspace_bytes"); /* buffers sized for 100 */
#undef REFUSED
  size_t bytes;
  int64_t tiles;
  cr_expect_eq(moejit_align_workspace_size(m, 0, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_align_workspace_size(NULL, 5, &bytes), MOEJIT_ERR_INVALID_ARGUMENT);
  cr_expect_eq(moejit_align_tile_capacity(m, 5, NULL), MOEJIT_ERR_INVALID_ARGUMENT);
  OPS_OK(moejit_align_tile_capacity(m, 100, &tiles));
  cr_expect_eq(tiles, 100 * 4 / 128 + 64); /* min(400, 3 + 64) */
  int32_t row_of[400];
  ops_download(row_of, b.row_of, sizeof row_of);
  cr_expect(ops_all_words(row_of, sizeof row_of, OPS_POISON_INT), "a refused call wrote outputs");
  bufs_free(&b);
  moejit_model_destroy(m);
}
