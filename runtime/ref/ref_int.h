/*
 * CPU reference internals shared by the files of runtime/ref/: the float →
 * code rounding every reference uses, and the element loaders of every
 * storage format (plain f32/bf16, i8x4 lanes, ternary and sign1 words).
 * Only those files look here.
 */
#ifndef DG_RUNTIME_REF_INT_H
#define DG_RUNTIME_REF_INT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "runtime/ref/ref_ops.h"

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

/* v into element i of a plain tensor: bf16 rounded to nearest even once,
 * else f32. */
static inline void dg__ref_plain_store(dg_fmt f, void *p, size_t i, float v)
{
	if (f == DG_FMT_BF16)
		((uint16_t *)p)[i] = dg_f32_to_bf16(v);
	else
		((float *)p)[i] = v;
}

/* Element i of a plain tensor: bf16 (uint16_t) or, for any other f, f32. */
static inline float dg__ref_plain_at(dg_fmt f, const void *p, size_t i)
{
	if (f == DG_FMT_BF16)
		return dg_bf16_to_f32(((const uint16_t *)p)[i]);
	return ((const float *)p)[i];
}

/* Word i of a packed stream (any alignment). */
static inline uint32_t dg__ref_word_at(const void *p, size_t i)
{
	uint32_t u;

	memcpy(&u, (const unsigned char *)p + 4 * i, sizeof(u));
	return u;
}

/* Code i of a tensor in an integer storage format f: i8x4 lanes (signed
 * for int8 / int4, unsigned for uint8pos), ternary 2-bit pairs (01 +1,
 * 11 -1, else 0), sign1 bits (1 +1, 0 -1). */
static inline int dg__ref_code_at(dg_fmt f, const void *p, size_t i)
{
	uint32_t bits;
	uint8_t b;
	int8_t s;

	switch (f) {
	case DG_FMT_TERNARY:
		bits = (dg__ref_word_at(p, i / 16) >> (2 * (i % 16))) & 3u;
		return bits == 1u ? 1 : bits == 3u ? -1 : 0;
	case DG_FMT_SIGN1:
		return (dg__ref_word_at(p, i / 32) >> (i % 32)) & 1u ? 1 : -1;
	default:
		b = (uint8_t)(dg__ref_word_at(p, i / 4) >> (8 * (i % 4)));
		if (f == DG_FMT_UINT8POS)
			return b;
		memcpy(&s, &b, 1);
		return s;
	}
}

/* The gradient GEMMs' references with a scale a row or a channel along the
 * reduction (sv; NULL: the per-tensor value), as dg_ref_run reaches them. */
dg_status dg__ref_lowrank_grad_input_v(const dg_spec *spec, const void *grad, const void *w,
				       float sw, const float *sv, float *grad_x, int batch,
				       int time);
dg_status dg__ref_lowrank_grad_weight_v(const dg_spec *spec, const void *grad, const void *x,
					float sa, const float *sv, float *grad_w, int batch,
					int time);
dg_status dg__ref_decoder_grad_input_v(const dg_spec *spec, const float *grad, const void *w,
				       float sw, const float *sv, void *grad_y, int batch,
				       int time);
dg_status dg__ref_decoder_grad_weight_v(const dg_spec *spec, const float *grad, const void *y,
					float sa, const float *sv, float *grad_w, int batch,
					int time);
/* relu_mask with the forward's scales a row / a channel (sa_v, sw_v may be
 * NULL where the spec's granularity is tensor). */
dg_status dg__ref_relu_mask_v(const dg_spec *spec, const void *x, const void *w, float sa,
			      float sw, const float *sa_v, const float *sw_v, const float *grad,
			      float *grad_out, int batch, int time);

/* The generic entry of each op of DG_OP_LIST (runtime/ref/registry.c). */
#define DG__REF_ENTRY(e, name) dg_status dg__ref_##name(const dg_spec *spec, const dg_ref_call *c);
DG_OP_LIST(DG__REF_ENTRY)
#undef DG__REF_ENTRY

#endif
