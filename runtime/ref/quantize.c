/*
 * CPU references of the quantize family: bf16 <-> f32, the formats' qmax,
 * activation and weight quantize (a scale a tensor, a row or a channel).
 *
 * Each function computes what its generated kernel computes, on the same
 * layouts (dragon/spec.h, dragon/ref.h), so a GPU result can be compared bit
 * for bit: every float → code conversion is rintf (round half to even in the
 * default rounding mode, __float2int_rn on the GPU) followed by a clamp, and
 * a NaN quotient gives code 0 (what cvt.rni.s32.f32 gives for NaN). Nothing
 * here allocates; bad pointers, sizes and formats give DG_ERR_INVALID_ARG
 * and leave the outputs untouched.
 */
#include "runtime/ref/ref_ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

/* --- bf16 ---------------------------------------------------------------- */

uint16_t dg_ref_f32_to_bf16(float x)
{
	return dg_f32_to_bf16(x);
}

float dg_ref_bf16_to_f32(uint16_t x)
{
	return dg_bf16_to_f32(x);
}

/* --- formats ------------------------------------------------------------- */

int dg_ref_qmax(dg_fmt fmt)
{
	switch (fmt) {
	case DG_FMT_INT8:
		return 127;
	case DG_FMT_INT4:
		return 7;
	case DG_FMT_UINT8POS:
		return 255;
	case DG_FMT_TERNARY:
	case DG_FMT_SIGN1:
		return 1;
	case DG_FMT_F32:
	case DG_FMT_BF16:
	default:
		return 0;
	}
}

static int is_src_fmt(dg_fmt fmt)
{
	return fmt == DG_FMT_F32 || fmt == DG_FMT_BF16;
}

/* --- activation quantize ------------------------------------------------- */

dg_status dg_ref_quantize_act_apply(dg_fmt src, dg_fmt act, const void *x,
				    size_t n, float scale, void *codes)
{
	int qmax, lo;

	if (!x || !codes || !is_src_fmt(src) || !dg__ref_is_act_code(act))
		return DG_ERR_INVALID_ARG;
	qmax = dg_ref_qmax(act);
	lo = act == DG_FMT_UINT8POS ? 0 : -qmax;
	for (size_t i = 0; i < n; i++) {
		int c = 0;

		/* x / scale is one IEEE division, as __fdiv_rn on the GPU. */
		if (scale != 0.0f)
			c = dg__ref_code_of(dg__ref_plain_at(src, x, i) / scale,
					    lo, qmax);

		if (act == DG_FMT_UINT8POS)
			((uint8_t *)codes)[i] = (uint8_t)c;
		else
			((int8_t *)codes)[i] = (int8_t)c;
	}
	return DG_OK;
}

dg_status dg_ref_quantize_act(dg_fmt src, dg_fmt act, const void *x, size_t n,
			      void *codes, float *scale)
{
	double sum = 0.0;
	float s;

	if (!x || !codes || !scale || !is_src_fmt(src) ||
	    !dg__ref_is_act_code(act))
		return DG_ERR_INVALID_ARG;
	for (size_t i = 0; i < n; i++)
		sum += fabs((double)dg__ref_plain_at(src, x, i));
	/* The same expression as dg_quantize_act_scale: 2·sum / (n·qmax). */
	s = sum == 0.0 ? 0.0f
		       : (float)(2.0 * sum /
				 ((double)n * (double)dg_ref_qmax(act)));
	*scale = s;
	return dg_ref_quantize_act_apply(src, act, x, n, s, codes);
}

dg_status dg_ref_quantize_act_rows(dg_fmt src, dg_fmt act, const void *x, size_t batch,
				   size_t groups, size_t time, size_t cols, void *codes,
				   float *scales)
{
	if (!x || !codes || !scales || !is_src_fmt(src) || !dg__ref_is_act_code(act))
		return DG_ERR_INVALID_ARG;
	const float qmax = (float)dg_ref_qmax(act);
	const size_t esz = act == DG_FMT_UINT8POS ? sizeof(uint8_t) : sizeof(int8_t);
	for (size_t b = 0; b < batch; b++) {
		for (size_t t = 0; t < time; t++) {
			float m = 0.0f;
			for (size_t g = 0; g < groups; g++) {
				size_t base = ((b * groups + g) * time + t) * cols;
				for (size_t c = 0; c < cols; c++)
					m = fmaxf(m, fabsf(dg__ref_plain_at(src, x, base + c)));
			}
			const float s = m / qmax; /* one IEEE division, as __fdiv_rn */
			scales[b * time + t] = s;
			for (size_t g = 0; g < groups; g++) {
				size_t base = ((b * groups + g) * time + t) * cols;
				const size_t sz = src == DG_FMT_F32 ? 4 : 2;
				dg_status st = dg_ref_quantize_act_apply(
					src, act, (const char *)x + base * sz, cols, s,
					(char *)codes + base * esz);
				if (st)
					return st;
			}
		}
	}
	return DG_OK;
}

/* --- weight quantize ----------------------------------------------------- */

static int8_t weight_code(dg_fmt weight, float v, float s)
{
	int c;

	if (weight == DG_FMT_INT8)
		c = s == 0.0f ? 0 : dg__ref_code_of(v / s, -127, 127);
	else if (weight == DG_FMT_TERNARY)
		c = fabsf(v) < s ? 0 : (v > 0.0f) - (v < 0.0f);
	else
		c = v >= 0.0f ? 1 : -1; /* NaN → -1 */
	return (int8_t)c;
}

dg_status dg_ref_quantize_weight_rows(dg_fmt weight, const float *w, size_t rows,
				      size_t cols, int8_t *codes, float *scales)
{
	if (!w || !codes || !scales || !cols)
		return DG_ERR_INVALID_ARG;
	if (weight != DG_FMT_INT8 && weight != DG_FMT_TERNARY && weight != DG_FMT_SIGN1)
		return DG_ERR_INVALID_ARG;
	for (size_t r = 0; r < rows; r++) {
		const float *row = w + r * cols;
		float s;
		if (weight == DG_FMT_INT8) {
			float m = 0.0f;
			for (size_t c = 0; c < cols; c++)
				m = fmaxf(m, fabsf(row[c]));
			s = m / 127.0f;
		} else {
			double sum = 0.0;
			for (size_t c = 0; c < cols; c++)
				sum += fabs((double)row[c]);
			s = (float)(sum / (double)cols);
		}
		scales[r] = s;
		for (size_t c = 0; c < cols; c++)
			codes[r * cols + c] = weight_code(weight, row[c], s);
	}
	return DG_OK;
}

dg_status dg_ref_quantize_weight(dg_fmt weight, const float *w, size_t n,
				 int8_t *codes, float *scale)
{
	double sum = 0.0;
	float s;

	if (!w || !codes || !scale)
		return DG_ERR_INVALID_ARG;
	if (weight != DG_FMT_INT8 && weight != DG_FMT_TERNARY &&
	    weight != DG_FMT_SIGN1)
		return DG_ERR_INVALID_ARG;
	for (size_t i = 0; i < n; i++)
		sum += fabs((double)w[i]);
	if (sum == 0.0)
		s = 0.0f;
	else if (weight == DG_FMT_INT8)
		s = (float)(2.0 * sum / ((double)n * 127.0));
	else
		s = (float)(sum / (double)n);

	for (size_t i = 0; i < n; i++)
		codes[i] = weight_code(weight, w[i], s);
	*scale = s;
	return DG_OK;
}
