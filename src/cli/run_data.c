/* `moejit run` inputs (periodic tensors filled on the GPU, spaced logits)
 * and its float64 reference of the layer; see run_data.h. */
#include "cli/run_data.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- element conversions (round to nearest even, as the GPU stores) --- */

static uint32_t f32_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float v;
  memcpy(&v, &u, 4);
  return v;
}

static uint16_t to_bf16(float v) {
  uint32_t u = f32_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b) {
  return bits_f32((uint32_t)b << 16);
}

static float from_f16(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * (float)man * 5.9604644775390625e-08f; /* 2^-24 */
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

/* float -> half, round to nearest even (bit arithmetic, as in the usual
 * branch-light conversions). */
static uint16_t to_f16(float v) {
  const uint32_t u = f32_bits(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
  if (a < 0x38800000u) {                                   /* half subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign;            /* below half of 2^-24 */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127 -> 15 */
  return (uint16_t)(sign | (r >> 13));
}

void run_pack(moejit_dtype dtype, const float *src, void *dst, size_t n) {
  if (dtype == MOEJIT_DTYPE_FP32) {
    memcpy(dst, src, n * 4);
    return;
  }
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++)
    d[i] = dtype == MOEJIT_DTYPE_BF16 ? to_bf16(src[i]) : to_f16(src[i]);
}

double run_unpack_one(moejit_dtype dtype, const void *base, size_t i) {
  if (dtype == MOEJIT_DTYPE_FP32) return ((const float *)base)[i];
  const uint16_t b = ((const uint16_t *)base)[i];
  return dtype == MOEJIT_DTYPE_BF16 ? from_bf16(b) : from_f16(b);
}

double run_round(moejit_dtype dtype, double v) {
  float f = (float)v;
  if (dtype == MOEJIT_DTYPE_FP32) return f;
  uint16_t b;
  run_pack(dtype, &f, &b, 1);
  return run_unpack_one(dtype, &b, 0);
}

/* ---- math without libm (the CLI links only libmoejit) ------------------ */

double run_sqrt(double v) {
  if (!(v > 0)) return v == 0 ? 0 : v - v + (v - v) / 0.0; /* NaN for negatives and NaN */
  if (v > 1.7e308) return v;                               /* inf */
  double x = v > 1 ? v : 1; /* Newton from above converges for any start >= sqrt(v) */
  for (int i = 0; i < 2000; i++) {
    double next = 0.5 * (x + v / x);
    if (next >= x) break;
    x = next;
  }
  return x;
}

double run_exp(double v) {
  if (v != v) return v;
  if (v > 709.0) return 1.0 / 0.0;
  if (v < -745.0) return 0.0;
  /* v = n ln2 + r, |r| <= ln2 / 2; e^r by Taylor (terms to r^16 / 16!). */
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const double nf = v * 1.44269504088896338700 + (v < 0 ? -0.5 : 0.5);
  const int n = (int)nf;
  const double r = (v - n * ln2_hi) - n * ln2_lo;
  double term = 1, sum = 1;
  for (int i = 1; i <= 16; i++) sum += (term *= r / i);
  /* times 2^n in two steps so that subnormal results still come out */
  int n1 = n / 2, n2 = n - n1;
  uint64_t b1 = (uint64_t)(n1 + 1023) << 52, b2 = (uint64_t)(n2 + 1023) << 52;
  double s1, s2;
  memcpy(&s1, &b1, 8);
  memcpy(&s2, &b2, 8);
  return sum * s1 * s2;
}

/* ---- random data ------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) {
  return (double)(splitmix(s) >> 11) * 0x1.0p-53;
}

int run_block_make(run_block *b, moejit_dtype dtype, double scale, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->dtype = dtype;
  float *f = malloc(sizeof(float) * RUN_BLOCK_ELEMS);
  b->bits = malloc(moejit_dtype_size(dtype) * RUN_BLOCK_ELEMS);
  b->values = malloc(sizeof(double) * RUN_BLOCK_ELEMS);
  if (!f || !b->bits || !b->values) {
    free(f);
    run_block_free(b);
    return 0;
  }
  for (size_t i = 0; i < RUN_BLOCK_ELEMS; i++) f[i] = (float)((2 * uniform(&seed) - 1) * scale);
  run_pack(dtype, f, b->bits, RUN_BLOCK_ELEMS);
  for (size_t i = 0; i < RUN_BLOCK_ELEMS; i++) b->values[i] = run_unpack_one(dtype, b->bits, i);
  free(f);
  return 1;
}

void run_block_free(run_block *b) {
  free(b->bits);
  free(b->values);
  b->bits = NULL;
  b->values = NULL;
}

moejit_status run_fill_periodic(moejit_ctx *ctx, const run_block *b, void *scratch, void *dst,
                                size_t elems, moejit_stream stream) {
  const size_t es = moejit_dtype_size(b->dtype), block = (size_t)RUN_BLOCK_ELEMS * es;
  const size_t total = elems * es;
  moejit_status st = moejit_memcpy_htod(ctx, scratch, b->bits, block, stream);
  if (st) return st;
  size_t first = total < block ? total : block;
  if ((st = moejit_memcpy_dtod(ctx, dst, scratch, first, stream))) return st;
  /* dst[0, filled) is periodic with period `block` bytes and filled is a
   * multiple of it: copying it forward keeps the pattern. */
  for (size_t filled = first; filled < total;) {
    size_t n = total - filled < filled ? total - filled : filled;
    if ((st = moejit_memcpy_dtod(ctx, (char *)dst + filled, dst, n, stream))) return st;
    filled += n;
  }
  return MOEJIT_OK;
}

float *run_make_logits(int64_t tokens, int experts, uint64_t seed) {
  float *l = malloc(sizeof(float) * (size_t)tokens * (size_t)experts);
  int *perm = malloc(sizeof(int) * (size_t)experts);
  if (!l || !perm) {
    free(l);
    free(perm);
    return NULL;
  }
  const float step = 8.0f / (float)experts; /* a power of two: exact in bf16 */
  for (int64_t t = 0; t < tokens; t++) {
    for (int e = 0; e < experts; e++) perm[e] = e;
    for (int e = experts - 1; e > 0; e--) {
      int j = (int)(splitmix(&seed) % (uint64_t)(e + 1)), tmp = perm[e];
      perm[e] = perm[j];
      perm[j] = tmp;
    }
    for (int e = 0; e < experts; e++) l[t * experts + e] = (float)(perm[e] - experts / 2) * step;
  }
  free(perm);
  return l;
}

/* ---- float64 reference --------------------------------------------------- */

typedef struct ref_job {
  const moejit_spec *s;
  const run_block *bx, *b1, *b2;
  const int64_t *tokens;
  const int32_t *ids;
  const float *weights;
  double *out;
  size_t n, next;
  pthread_mutex_t lock;
} ref_job;

/* sum_c a[c] * block[(base + c) mod P] */
static double dot_periodic(const double *a, const double *block, size_t base, int64_t n) {
  double s = 0;
  size_t p = base % RUN_BLOCK_ELEMS;
  for (int64_t c = 0; c < n; c++) {
    s += a[c] * block[p];
    if (++p == RUN_BLOCK_ELEMS) p = 0;
  }
  return s;
}

double run_logits_error(const moejit_spec *s, const run_block *bx, const run_block *bg,
                        const int64_t *tokens, size_t n, const double *got) {
  const int64_t d = s->hidden, E = s->experts;
  double *x = malloc(sizeof(double) * (size_t)d), err = 0, norm = 0;
  if (!x) return 1.0 / 0.0;
  for (size_t i = 0; i < n; i++) {
    for (int64_t c = 0; c < d; c++)
      x[c] = bx->values[(size_t)(tokens[i] * d + c) % RUN_BLOCK_ELEMS];
    for (int64_t e = 0; e < E; e++) {
      const double ref = dot_periodic(x, bg->values, (size_t)(e * d), d), v = got[i * E + e];
      err += (v - ref) * (v - ref);
      norm += ref * ref;
    }
  }
  free(x);
  return err <= 1.7e308 ? run_sqrt(err) / (norm > 0 ? run_sqrt(norm) : 1.0) : 1.0 / 0.0;
}

static void ref_token(const ref_job *j, size_t i, double *x, double *h) {
  const moejit_spec *s = j->s;
  const int64_t d = s->hidden, f = s->expert_width, t = j->tokens[i];
  const int k = s->top_k;
  for (int64_t c = 0; c < d; c++) x[c] = j->bx->values[(size_t)(t * d + c) % RUN_BLOCK_ELEMS];
  double *out = j->out + i * (size_t)d;
  memset(out, 0, sizeof(double) * (size_t)d);
  for (int slot = 0; slot < k; slot++) {
    const int64_t e = j->ids[i * (size_t)k + slot];
    const double w = j->weights[i * (size_t)k + slot];
    if (e < 0 || e >= s->experts) continue; /* the caller reports bad ids */
    for (int64_t r = 0; r < f; r++) {
      double gate = dot_periodic(x, j->b1->values, (size_t)((e * 2 * f + r) * d), d);
      double up = dot_periodic(x, j->b1->values, (size_t)((e * 2 * f + f + r) * d), d);
      h[r] = run_round(s->act_dtype, gate / (1.0 + run_exp(-gate)) * up);
    }
    for (int64_t c = 0; c < d; c++) {
      double y = dot_periodic(h, j->b2->values, (size_t)((e * d + c) * f), f);
      out[c] += w * run_round(s->act_dtype, y);
    }
  }
}

static void *ref_worker(void *arg) {
  ref_job *j = arg;
  double *x = malloc(sizeof(double) * (size_t)j->s->hidden);
  double *h = malloc(sizeof(double) * (size_t)j->s->expert_width);
  for (;;) {
    pthread_mutex_lock(&j->lock);
    size_t i = j->next++;
    pthread_mutex_unlock(&j->lock);
    if (i >= j->n || !x || !h) break;
    ref_token(j, i, x, h);
  }
  free(x);
  free(h);
  return NULL;
}

void run_reference(const moejit_spec *s, const run_block *bx, const run_block *b1,
                   const run_block *b2, const int64_t *tokens, size_t n, const int32_t *ids,
                   const float *weights, double *out) {
  ref_job j = {.s = s,
               .bx = bx,
               .b1 = b1,
               .b2 = b2,
               .tokens = tokens,
               .ids = ids,
               .weights = weights,
               .out = out,
               .n = n};
  pthread_mutex_init(&j.lock, NULL);
  pthread_t th[16];
  size_t started = 0;
  for (size_t i = 0; i < n && i < 16; i++)
    if (pthread_create(&th[started], NULL, ref_worker, &j) == 0) started++;
  if (started == 0) ref_worker(&j); /* no threads: do it here */
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&j.lock);
}
