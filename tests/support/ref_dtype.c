/* fp32 <-> bf16 / fp16 conversions with round-to-nearest-even (see
 * ref_dtype.h). */
#include "ref_dtype.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

static float bits_f32(uint32_t b) {
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}

uint16_t ref_f32_to_bf16(float v) {
  uint32_t b = f32_bits(v);
  if (isnan(v)) return (uint16_t)((b >> 16) | 0x0040u); /* stays a (quiet) NaN */
  b += 0x7fffu + ((b >> 16) & 1u);
  return (uint16_t)(b >> 16);
}

float ref_bf16_to_f32(uint16_t bits) {
  return bits_f32((uint32_t)bits << 16);
}

uint16_t ref_f32_to_f16(float v) {
  const uint32_t b = f32_bits(v);
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  if (isnan(v)) return sign | 0x7e00u;
  const float a = fabsf(v);
  if (a >= 65520.0f) return sign | 0x7c00u;      /* rounds to inf */
  if (a < 0x1p-14f) {                            /* subnormal: multiples of 2^-24 */
    return sign | (uint16_t)lrintf(a * 0x1p24f); /* lrintf rounds half to even */
  }
  uint32_t mant = b & 0x7fffffu;
  int exp = (int)((b >> 23) & 0xffu) - 127 + 15;
  uint32_t half = ((uint32_t)exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++; /* may carry into exp */
  return sign | (uint16_t)half;
}

float ref_f16_to_f32(uint16_t bits) {
  const int exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  if (exp == 0) return sign * ldexpf((float)mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * ldexpf((float)(mant | 0x400), exp - 25);
}

float ref_round_to(moejit_dtype dtype, float v) {
  switch (dtype) {
    case MOEJIT_DTYPE_BF16:
      return ref_bf16_to_f32(ref_f32_to_bf16(v));
    case MOEJIT_DTYPE_FP16:
      return ref_f16_to_f32(ref_f32_to_f16(v));
    default:
      return v;
  }
}

void ref_pack(moejit_dtype dtype, const float *src, void *dst, size_t n) {
  if (dtype == MOEJIT_DTYPE_FP32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++)
    d[i] = dtype == MOEJIT_DTYPE_BF16 ? ref_f32_to_bf16(src[i]) : ref_f32_to_f16(src[i]);
}

void ref_unpack(moejit_dtype dtype, const void *src, float *dst, size_t n) {
  if (dtype == MOEJIT_DTYPE_FP32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  const uint16_t *s = src;
  for (size_t i = 0; i < n; i++)
    dst[i] = dtype == MOEJIT_DTYPE_BF16 ? ref_bf16_to_f32(s[i]) : ref_f16_to_f32(s[i]);
}
