/*
 * The CPU reference of dequantize (runtime/ref/ref_ops.h; templates/dequantize.lua):
 * out = code × s in f32, bf16 rounded to nearest even once — the kernel's
 * one product and one rounding, so the GPU matches it bit for bit.
 */
#include "runtime/ref/ref_int.h"

dg_status dg_ref_dequantize(dg_fmt act, dg_fmt out, dg_scale_gran gran, const void *codes,
			    int64_t rows, int64_t cols, const float *scale, void *dst)
{
	if (!dg__ref_is_act_code(act) || (out != DG_FMT_F32 && out != DG_FMT_BF16) ||
	    (gran != DG_SCALE_TENSOR && gran != DG_SCALE_TOKEN) || rows < 0 || cols < 0 ||
	    ((!codes || !scale || !dst) && rows * cols > 0))
		return DG_ERR_INVALID_ARG;
	for (int64_t r = 0; r < rows; r++) {
		const float s = scale[gran == DG_SCALE_TOKEN ? r : 0];
		for (int64_t c = 0; c < cols; c++) {
			size_t i = (size_t)(r * cols + c);
			int code = act == DG_FMT_UINT8POS ? ((const uint8_t *)codes)[i]
							  : ((const int8_t *)codes)[i];
			dg__ref_plain_store(out, dst, i, (float)code * s);
		}
	}
	return DG_OK;
}
