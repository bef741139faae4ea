/*
 * dequantize (the quantize family; templates/dequantize.lua): codes (R, C)
 * with a scale a tensor or a row → out (R, C) bf16 | f32, one launch, no
 * workspace. The float copies it makes are what a GEMM reads where its
 * operand must be float (the sm_90 projection gradients' bf16 operands).
 * Nothing here allocates, frees or synchronizes.
 */
#include <stdio.h>

#include "runtime/ops/ops_int.h"

#define FN "dg_dequantize"

/* The op table's check (formats, one shape for both, the codes' scale),
 * then the op's own rule: rows, a 2-D tensor (a scale a row is a row of
 * the last dimension, so a stack is passed as its rows). */
dg_status dg__check_dequantize(const dg_spec *spec, const dg__op_call *c, char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, DG_OP_DEQUANTIZE, FN, c, NULL, msg, size);
	if (st)
		return st;
	const dg_tensor *codes = c->t[0];
	if (codes->ndim != 2) {
		snprintf(msg, size,
			 "%s: %s: expected (R, C) codes, got %d dimensions (view the tensor as its rows: one %s a row)",
			 codes->name ? codes->name : "codes", FN, codes->ndim,
			 spec->ascale == DG_SCALE_TOKEN ? "scale" : "shape");
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

/* One launch: codes, their scale, out, rows and cols (long long). */
dg_status dg__prep_dequantize(dg_prepared *p, const dg__op_call *c)
{
	long long rows = c->t[0]->shape[0], cols = c->t[0]->shape[1], n = rows * cols;
	if (n == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, "dg_dequantize", &k);
	if (st)
		return st;
	const int nt = dg_kernel_spec(k)->tile.threads, sms = dg__dev_info(p->dev)->sm_count;
	dg_launch l = { { dg__op_grid(dg__op_cdiv(n, 8), nt, 8LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);  /* codes */
	dg__arg_scale(p, L, 0); /* a float, or one a row */
	dg__arg_data(p, L, 1);  /* out */
	dg__arg_i64(p, L, rows);
	dg__arg_i64(p, L, cols);
	return DG_OK;
}
