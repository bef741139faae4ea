/*
 * CPU references of the step family (runtime/ref/ref_ops.h; templates/step.lua):
 * the masked gradient sum, the three-way sum and the layout transpose, in
 * the kernels' order of operations (each sum rounded once, in f32).
 */
#include "runtime/ref/ref_int.h"

static bool is_float(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16;
}

dg_status dg_ref_add_mask(dg_fmt act, dg_fmt grad, dg_fmt other_fmt, const void *dxs,
			  const void *other, const void *xs, int64_t n, void *out)
{
	if (!is_float(act) || !is_float(grad) || !is_float(other_fmt) || !dxs || !other || !xs ||
	    !out || n < 0)
		return DG_ERR_INVALID_ARG;
	for (int64_t i = 0; i < n; i++) {
		/* both reads before the write: out may be dxs */
		float d = dg__ref_plain_at(grad, dxs, (size_t)i);
		float o = dg__ref_plain_at(other_fmt, other, (size_t)i);
		dg__ref_plain_store(grad, out, (size_t)i,
				    dg__ref_plain_at(act, xs, (size_t)i) > 0.0f ? d + o : 0.0f);
	}
	return DG_OK;
}

void dg_ref_add3(const float *a, const float *b, const float *c, int64_t n, float *out)
{
	for (int64_t i = 0; i < n; i++)
		out[i] = (a[i] + b[i]) + c[i];
}

dg_status dg_ref_transpose(dg_fmt act, const float *in, int64_t r, int e, int l, void *out)
{
	if ((act != DG_FMT_F32 && act != DG_FMT_BF16) || !in || !out || r < 0 || e < 0 || l < 0)
		return DG_ERR_INVALID_ARG;
	for (int64_t k = 0; k < r; k++) {
		const float *src = in + k * e * (int64_t)l; /* (e, l) */
		for (int i = 0; i < e; i++)
			for (int j = 0; j < l; j++) {
				int64_t o = (k * l + j) * e + i; /* (r, l, e) */
				float v = src[(int64_t)i * l + j];
				if (act == DG_FMT_BF16)
					((uint16_t *)out)[o] = dg_f32_to_bf16(v);
				else
					((float *)out)[o] = v;
			}
	}
	return DG_OK;
}
