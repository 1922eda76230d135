/* Element conversions for tests: fp32 <-> bf16 / fp16 bits, rounding to
 * nearest even like the GPU's __float2bfloat16_rn / __float2half_rn, and a
 * generic "n elements of dtype X" view used to upload inputs and read
 * outputs. */
#ifndef MOEJIT_TEST_REF_DTYPE_H
#define MOEJIT_TEST_REF_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "moejit/moejit.h"

uint16_t ref_f32_to_bf16(float v);
float ref_bf16_to_f32(uint16_t bits);
uint16_t ref_f32_to_f16(float v);
float ref_f16_to_f32(uint16_t bits);

/* Rounds v to the dtype and back (what storing it as `dtype` keeps). */
float ref_round_to(moejit_dtype dtype, float v);

/* Packs n floats into dst as `dtype` (dst holds n * moejit_dtype_size). */
void ref_pack(moejit_dtype dtype, const float *src, void *dst, size_t n);
/* Unpacks n elements of `dtype` into floats. */
void ref_unpack(moejit_dtype dtype, const void *src, float *dst, size_t n);

#endif
