/* Host side of the autotuner's measurements: seeded routing, the periodic
 * random input pattern the device buffers are tiled from, the rows the
 * correctness check samples, and their float64 reference. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tune/tune.h"

uint64_t mj_tune_mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double mj_tune_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t next(uint64_t *s) {
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

moejit_status mj_tune_data_make(mj_tune_data *d, moejit_dtype dtype, int64_t k, size_t n,
                                uint64_t seed) {
  if (dtype != MOEJIT_DTYPE_BF16 && dtype != MOEJIT_DTYPE_FP16)
    return mj_fail(MOEJIT_ERR_UNSUPPORTED, "tuning inputs are bf16 or fp16, not %s",
                   moejit_dtype_name(dtype));
  d->chunk = malloc(n * sizeof *d->chunk);
  if (!d->chunk) return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of host memory for tuning inputs");
  d->dtype = dtype, d->n = n;
  /* +-[1, 2) * 2^-e with e ~ log2(k) / 4: a k-long dot product of such
   * values (random signs) stays near 1, far from fp16's range limits. */
  d->scale_exp = (int)lround(log2((double)(k > 1 ? k : 1)) / 4);
  uint64_t s = mj_tune_mix(seed, 0x5eed) | 1;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = next(&s);
    uint16_t sign = (uint16_t)((r & 1) << 15);
    if (dtype == MOEJIT_DTYPE_BF16)
      d->chunk[i] = sign | (uint16_t)((127 - d->scale_exp) << 7) | (uint16_t)((r >> 8) & 0x7f);
    else
      d->chunk[i] = sign | (uint16_t)((15 - d->scale_exp) << 10) | (uint16_t)((r >> 8) & 0x3ff);
  }
  for (uint32_t b = 0; b < 65536; b++)
    d->lut[b] =
        dtype == MOEJIT_DTYPE_BF16 ? bf16_to_double((uint16_t)b) : half_to_double((uint16_t)b);
  return MOEJIT_OK;
}

void mj_tune_data_free(mj_tune_data *d) {
  if (!d) return;
  free(d->chunk);
  d->chunk = NULL, d->n = 0;
}

int mj_tune_route(int32_t experts, int32_t top_k, int64_t tokens, uint64_t seed, int32_t *offsets,
                  int32_t *choice) {
  int32_t *counts = calloc((size_t)experts, sizeof *counts);
  if (!counts) return -1;
  uint64_t s = mj_tune_mix(seed, 0x7011) | 1;
  int picked[32];
  for (int64_t t = 0; t < tokens; t++)
    for (int j = 0; j < top_k; j++) { /* k distinct experts per token */
      int e, dup;
      do {
        e = (int)(next(&s) % (uint64_t)experts);
        dup = 0;
        for (int i = 0; i < j; i++) dup |= picked[i] == e;
      } while (dup);
      picked[j] = e;
      counts[e]++;
      if (choice) choice[t * top_k + j] = e;
    }
  int active = 0;
  offsets[0] = 0;
  for (int e = 0; e < experts; e++) {
    offsets[e + 1] = offsets[e] + counts[e];
    active += counts[e] > 0;
  }
  free(counts);
  return active;
}

int mj_tune_sorted_slots(const int32_t *choice, const int32_t *offsets, int32_t experts,
                         int64_t entries, int32_t *slot) {
  int32_t *cursor = malloc((size_t)experts * sizeof *cursor);
  if (!cursor) return -1;
  memcpy(cursor, offsets, (size_t)experts * sizeof *cursor);
  for (int64_t s = 0; s < entries; s++) slot[cursor[choice[s]]++] = (int32_t)s;
  free(cursor);
  return 0;
}

int mj_tune_check_rows(const int32_t *offsets, int32_t experts, int n, uint64_t seed,
                       int64_t *rows) {
  int active[1024], n_active = 0;
  for (int e = 0; e < experts && n_active < 1024; e++)
    if (offsets[e + 1] > offsets[e]) active[n_active++] = e;
  if (!n_active || n <= 0) return 0;
  uint64_t s = mj_tune_mix(seed, 0xc4ec) | 1;
  int count = 0;
  for (int i = 0; i < n; i++) {
    int e = active[(int64_t)i * n_active / n]; /* spread over the experts */
    int64_t len = offsets[e + 1] - offsets[e], first = (int64_t)(next(&s) % (uint64_t)len);
    for (int64_t tries = 0; tries < len; tries++) { /* a row not taken yet */
      int64_t r = offsets[e] + (first + tries) % len, taken = 0;
      for (int j = 0; j < count; j++) taken |= rows[j] == r;
      if (!taken) {
        rows[count++] = r;
        break;
      }
    }
  }
  return count;
}

/* ---- float64 reference ------------------------------------------------------ */

typedef struct ref_job {
  const mj_tune_data *d;
  int which;
  int64_t f, k, n_out, w_rows_per_expert;
  const int *expert; /* per sampled row */
  const double *a;   /* sampled A rows, [n_rows][k] */
  size_t w_offset;
  int n_blocks; /* column blocks per row */
  double *ref;
} ref_job;

#define REF_BLOCK 64

/* Dot product of a[k] with the pattern row starting at element `start`. */
static double dot_pattern(const mj_tune_data *d, size_t start, const double *a, int64_t k) {
  size_t p = start % d->n;
  double sum = 0;
  for (int64_t i = 0; i < k; i++) {
    sum += a[i] * d->lut[d->chunk[p]];
    if (++p == d->n) p = 0;
  }
  return sum;
}

static void ref_block(size_t item, void *arg) {
  const ref_job *j = arg;
  int row = (int)(item / (size_t)j->n_blocks), blk = (int)(item % (size_t)j->n_blocks);
  const double *a = j->a + (size_t)row * (size_t)j->k;
  size_t w_expert = j->w_offset + (size_t)j->expert[row] * (size_t)(j->w_rows_per_expert * j->k);
  for (int64_t c = (int64_t)blk * REF_BLOCK; c < (blk + 1) * (int64_t)REF_BLOCK && c < j->n_out;
       c++) {
    double g = dot_pattern(j->d, w_expert + (size_t)(c * j->k), a, j->k), v = g;
    if (j->which == 1) {
      double u = dot_pattern(j->d, w_expert + (size_t)((j->f + c) * j->k), a, j->k);
      v = g / (1 + exp(-g)) * u;
    }
    j->ref[(size_t)row * (size_t)j->n_out + (size_t)c] = v;
  }
}

static int expert_of(const int32_t *offsets, int32_t experts, int64_t row) {
  int lo = 0, hi = experts - 1; /* last e with offsets[e] <= row */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  while (lo < experts - 1 && offsets[lo + 1] <= row) lo++; /* skip empty experts */
  return lo;
}

void mj_tune_reference(const mj_tune_data *d, const moejit_spec *spec, int which,
                       const int32_t *offsets, const int64_t *rows, int n_rows, size_t a_offset,
                       int64_t a_period, const int32_t *a_map, size_t w_offset, int jobs,
                       double *ref) {
  int64_t f = spec->expert_width, hidden = spec->hidden;
  ref_job j = {d,
               which,
               f,
               which == 1 ? hidden : f,
               which == 1 ? f : hidden,
               which == 1 ? 2 * f : hidden,
               NULL,
               NULL,
               w_offset,
               0,
               ref};
  int expert[MJ_TUNE_MAX_CHECK_ROWS];
  double *a = malloc((size_t)n_rows * (size_t)j.k * sizeof *a);
  if (!a) { /* no memory for the check: a reference of NaN fails every candidate loudly */
    for (size_t i = 0; i < (size_t)n_rows * (size_t)j.n_out; i++) ref[i] = NAN;
    return;
  }
  for (int r = 0; r < n_rows; r++) {
    expert[r] = expert_of(offsets, spec->experts, rows[r]);
    const int64_t a_row = a_map ? a_map[rows[r]] : a_period > 0 ? rows[r] % a_period : rows[r];
    size_t p = (a_offset + (size_t)a_row * (size_t)j.k) % d->n;
    for (int64_t i = 0; i < j.k; i++) {
      a[(size_t)r * (size_t)j.k + (size_t)i] = d->lut[d->chunk[p]];
      if (++p == d->n) p = 0;
    }
  }
  j.expert = expert, j.a = a;
  j.n_blocks = (int)((j.n_out + REF_BLOCK - 1) / REF_BLOCK);
  mj_parallel_for((size_t)n_rows * (size_t)j.n_blocks, jobs, ref_block, &j);
  free(a);
}

double mj_tune_rel_error(const mj_tune_data *d, const uint16_t *got, const double *ref, size_t n) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; i++) {
    double g = d->lut[got[i]];
    if (!isfinite(g) || !isfinite(ref[i])) return INFINITY;
    err += (g - ref[i]) * (g - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? sqrt(err / norm) : sqrt(err);
}
