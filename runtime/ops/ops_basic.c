/*
 * The element-wise ops: activation quantize (three launches: |x| partial
 * sums → scale → codes) and the i8x4 pack / unpack of int8 codes.
 *
 * Each op runs its _check first (no device needed) and launches nothing
 * when it fails; the message then sits on the device. The launch geometry
 * mirrors templates/quantize.lua and templates/pack.lua.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/gpu/gpu_int.h"

/* Blocks a grid-stride launch needs for `work` items of `per_block`,
 * at least 1 and at most `cap`. */
static unsigned grid_for(long long work, long long per_block, long long cap)
{
	long long g = per_block > 0 ? (work + per_block - 1) / per_block : 1;
	if (cap < 1)
		cap = 1;
	if (g > cap)
		g = cap;
	if (g < 1)
		g = 1;
	return (unsigned)g;
}

static dg_status spec_check(const dg_spec *spec, const char *fn, dg_op op1,
			    dg_op op2, char *msg, size_t msg_size)
{
	if (!spec) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s: spec is NULL", fn);
		return DG_ERR_INVALID_ARG;
	}
	if (spec->op != op1 && spec->op != op2) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s: spec op=%s, expected op=%s%s%s", fn,
				 dg_op_name(spec->op) ? dg_op_name(spec->op) : "?",
				 dg_op_name(op1), op1 != op2 ? " or op=" : "",
				 op1 != op2 ? dg_op_name(op2) : "");
		return DG_ERR_INVALID_SPEC;
	}
	return dg_spec_validate(spec, msg, msg_size);
}

/* The spec as it runs on dev, its threads at least set. */
static dg_status spec_resolved(dg_device *dev, const dg_spec *spec, dg_spec *out)
{
	dg_status st = dg__spec_as_run(dev, spec, out);

	if (st == DG_OK && out->tile.threads <= 0)
		out->tile.threads = 256;
	return st;
}

/* ---- quantize_act --------------------------------------------------------- */

dg_status dg_quantize_act_check(const dg_spec *spec, const dg_tensor *x,
				const dg_tensor *codes, char *msg, size_t msg_size)
{
	dg_status st = spec_check(spec, "dg_quantize_act", DG_OP_QUANTIZE_ACT,
				  DG_OP_QUANTIZE_ACT, msg, msg_size);
	if (st)
		return st;
	if (!x) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "x: missing (expected %s, any shape)",
				 dg_fmt_name(spec->src));
		return DG_ERR_INVALID_ARG;
	}
	st = dg_tensor_expect(x, "x", spec->src, x->ndim, NULL, false, msg, msg_size);
	if (st)
		return st;
	/* codes: the shape of x, in the act format, with the scale it gets. */
	return dg_tensor_expect(codes, "codes", spec->act, x->ndim, x->shape, true,
				msg, msg_size);
}

dg_status dg_quantize_act(dg_device *dev, const dg_spec *spec,
			  const dg_tensor *x, const dg_tensor *codes)
{
	char msg[512];
	dg_status st;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	st = dg_quantize_act_check(spec, x, codes, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);

	dg_spec r;
	st = spec_resolved(dev, spec, &r);
	if (st)
		return st;
	const int nt = r.tile.threads;
	const long long ve = spec->src == DG_FMT_BF16 ? 8 : 4; /* one 16-byte load */
	const int sms = dg__dev_info(dev)->sm_count;
	long long n = (long long)dg_tensor_numel(x);
	dg_dptr x_p = x->data, codes_p = codes->data, scale_p = codes->scale;

	/* Partial sums: a few blocks an SM; the partials are deterministic
	 * for a given grid, and the grid depends only on n and the device. */
	unsigned g = grid_for(n, (long long)nt * ve, 4LL * (sms > 0 ? sms : 1));
	int n_partials = (int)g;
	dg_dptr partials = 0;
	st = dg__dev_scratch(dev, 0, (size_t)g * sizeof(float), &partials);
	if (st)
		return st;

	dg_launch l1 = { { g, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	void *a1[] = { &x_p, &n, &partials };
	st = dg__op_launch(dev, &r, "dg_quantize_act_absum", &l1, a1);
	if (st)
		return st;

	dg_launch l2 = { { 1, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	void *a2[] = { &partials, &n_partials, &n, &scale_p };
	st = dg__op_launch(dev, &r, "dg_quantize_act_scale", &l2, a2);
	if (st)
		return st;

	unsigned g3 = grid_for(n, (long long)nt * ve, 16LL * (sms > 0 ? sms : 1));
	dg_launch l3 = { { g3, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	void *a3[] = { &x_p, &n, &scale_p, &codes_p };
	return dg__op_launch(dev, &r, "dg_quantize_act_apply", &l3, a3);
}

/* ---- pack_i8x4 / unpack_i8x4 ---------------------------------------------- */

dg_status dg_pack_i8x4_check(const dg_spec *spec, const dg_tensor *codes,
			     const dg_tensor *packed, char *msg, size_t msg_size)
{
	dg_status st = spec_check(spec, "dg_pack_i8x4", DG_OP_PACK_I8X4,
				  DG_OP_UNPACK_I8X4, msg, msg_size);
	if (st)
		return st;
	const int64_t k = spec->embd, c = spec->latent;
	const int64_t cs[3] = { -1, k, c };
	st = dg_tensor_expect(codes, "codes", DG_FMT_INT8, 3, cs, false, msg, msg_size);
	if (st)
		return st;
	/* packed: the same rows, (C, K) with four codes a word along K. */
	const int64_t ps[3] = { codes->shape[0], c, k };
	return dg_tensor_expect(packed, "packed", DG_FMT_INT8, 3, ps, false, msg,
				msg_size);
}

dg_status dg_pack_i8x4(dg_device *dev, const dg_spec *spec,
		       const dg_tensor *codes, const dg_tensor *packed)
{
	char msg[512];
	dg_status st;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	st = dg_pack_i8x4_check(spec, codes, packed, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);

	/* Tiles as pack.lua cuts them: TK = min(128, K) codes along K by
	 * TC = 32 columns, walked grid-stride. */
	dg_spec r;
	st = spec_resolved(dev, spec, &r);
	if (st)
		return st;
	const int nt = r.tile.threads;
	const long long k = spec->embd, c = spec->latent;
	const long long tk = k < 128 ? k : 128, tc = 32;
	long long rows = (long long)codes->shape[0];
	long long tiles = rows * ((k + tk - 1) / tk) * ((c + tc - 1) / tc);
	const int sms = dg__dev_info(dev)->sm_count;
	unsigned g = grid_for(tiles, 1, 8LL * (sms > 0 ? sms : 1));
	dg_dptr codes_p = codes->data, packed_p = packed->data;

	dg_launch l = { { g, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	if (spec->op == DG_OP_PACK_I8X4) {
		void *a[] = { &codes_p, &packed_p, &rows };
		return dg__op_launch(dev, &r, "dg_pack_i8x4", &l, a);
	}
	void *a[] = { &packed_p, &codes_p, &rows };
	return dg__op_launch(dev, &r, "dg_unpack_i8x4", &l, a);
}
