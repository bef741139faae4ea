/*
 * CPU reference internals shared by runtime/ref.c (bf16, quantize, packing)
 * and runtime/ref_lowrank.c (lowrank_fwd): the float → code rounding every
 * reference uses, and the plain f32/bf16 element loader. Only those two
 * files look here.
 */
#ifndef DG_RUNTIME_REF_INT_H
#define DG_RUNTIME_REF_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/ref.h"

/* Activation code formats: int8, int4, uint8pos. */
static inline bool dg__ref_is_act_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_INT4 || f == DG_FMT_UINT8POS;
}

/* clamp(rint(q), lo, hi); NaN → 0, as __float2int_rn then a clamp. */
static inline int dg__ref_code_of(float q, int lo, int hi)
{
	float r;

	if (isnan(q))
		return 0;
	r = rintf(q);
	if (r < (float)lo)
		return lo;
	if (r > (float)hi)
		return hi;
	return (int)r;
}

/* Element i of a plain tensor: bf16 (uint16_t) or, for any other f, f32. */
static inline float dg__ref_plain_at(dg_fmt f, const void *p, size_t i)
{
	if (f == DG_FMT_BF16)
		return dg_ref_bf16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

#endif
