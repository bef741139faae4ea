/*
 * The pack family: the ternary / sign1 storage packers of quantized weights
 * (pack_ternary, pack_sign1 and their unpacks to i8x4: templates/qweight.lua)
 * and the i8x4 transposing pack of int8 codes (pack_i8x4, unpack_i8x4:
 * templates/pack.lua). Element-wise, grid-stride: any grid is correct.
 */
#include <stdio.h>

#include "runtime/ops/ops_int.h"

/* ---- pack_ternary / pack_sign1 -------------------------------------------- */

/* One launch: the packer (codes, words) or, with unpack, the unpacker
 * (words, codes), and rows (long long). unpack is one of the options the
 * op is prepared with, so it picks the entry here. */
static dg_status prep_weight(dg_prepared *p, const dg__op_call *c)
{
	bool tern = p->spec.op == DG_OP_PACK_TERNARY;
	long long rows = p->shape.r;
	long long words = rows * (p->spec.embd / (tern ? 16 : 32));
	const char *entry = tern ? (c->unpack ? "dg_unpack_ternary" : "dg_pack_ternary")
				 : (c->unpack ? "dg_unpack_sign1" : "dg_pack_sign1");
	if (words == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	dg_launch l = { { dg__op_grid(words, nt, 8LL * dg__dev_info(p->dev)->sm_count), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, c->unpack ? 1 : 0); /* packed | codes: the source */
	dg__arg_data(p, L, c->unpack ? 0 : 1); /* codes | packed: the destination */
	dg__arg_i64(p, L, rows);
	return DG_OK;
}

dg_status dg__prep_pack_ternary(dg_prepared *p, const dg__op_call *c)
{
	return prep_weight(p, c);
}

dg_status dg__prep_pack_sign1(dg_prepared *p, const dg__op_call *c)
{
	return prep_weight(p, c);
}

/* ---- pack_i8x4 / unpack_i8x4 ---------------------------------------------- */

/* One launch: src, dst (the op table's order) and rows (long long). */
static dg_status prep_i8x4(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const char *entry = p->spec.op == DG_OP_PACK_I8X4 ? "dg_pack_i8x4" : "dg_unpack_i8x4";
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, entry, &k);
	if (st)
		return st;
	/* Tiles as pack.lua cuts them: TK = min(128, K) codes along K by
	 * TC = 32 columns, walked grid-stride. */
	int nt = dg_kernel_spec(k)->tile.threads;
	const long long kk = p->spec.embd, cc = p->spec.latent;
	const long long tk = kk < 128 ? kk : 128, tc = 32;
	long long rows = p->shape.r;
	long long tiles = rows * dg__op_cdiv(kk, tk) * dg__op_cdiv(cc, tc);
	const int sms = dg__dev_info(p->dev)->sm_count;
	dg_launch l = { { dg__op_grid(tiles, 1, 8LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* src */
	dg__arg_data(p, L, 1); /* dst */
	dg__arg_i64(p, L, rows);
	return DG_OK;
}

dg_status dg__prep_pack_i8x4(dg_prepared *p, const dg__op_call *c)
{
	return prep_i8x4(p, c);
}

dg_status dg__prep_unpack_i8x4(dg_prepared *p, const dg__op_call *c)
{
	return prep_i8x4(p, c);
}

/* ---- the typed calls: one for two ops each ------------------------------- */

/* The op of the pair a, b that spec names: b when it says so, else a (a
 * spec of neither is refused before it matters). */
static dg_op pair_op(const dg_spec *spec, dg_op a, dg_op b)
{
	return spec && spec->op == b ? b : a;
}

/* A spec of neither op is refused naming both. */
static bool pair_ok(const dg_spec *spec, dg_op a, dg_op b, const char *fn, char *msg,
		    size_t size)
{
	if (!spec || spec->op == a || spec->op == b)
		return true; /* a NULL spec: dg__op_check says so */
	snprintf(msg, size, "%s: spec op=%s, expected op=%s or op=%s", fn, dg_op_name(spec->op),
		 dg_op_name(a), dg_op_name(b));
	return false;
}

/* The check of a pair's call: the pair's rule, then the table's (its
 * messages naming fn, the call's). */
static dg_status pair_check(const dg_spec *spec, dg_op a, dg_op b, const char *fn,
			    const void *args, char *msg, size_t msg_size)
{
	char local[256];
	if (!pair_ok(spec, a, b, fn, msg && msg_size ? msg : local,
		     msg && msg_size ? msg_size : sizeof(local)))
		return DG_ERR_INVALID_SPEC;
	dg_op op = pair_op(spec, a, b);
	dg__op_call c = dg__op_call_from_args(op, args);
	return dg__op_check(spec, op, fn, args ? &c : NULL, NULL, msg, msg_size);
}

static dg_status pair_run(dg_device *dev, const dg_spec *spec, dg_op a, dg_op b, const char *fn,
			  const void *args)
{
	char why[256];
	if (dev && !pair_ok(spec, a, b, fn, why, sizeof(why)))
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "%s", why);
	return dg__op_typed_run(dev, pair_op(spec, a, b), spec, args);
}

dg_status dg_pack_weight_check(const dg_spec *spec, const dg_pack_weight_args *a, char *msg,
			       size_t msg_size)
{
	return pair_check(spec, DG_OP_PACK_TERNARY, DG_OP_PACK_SIGN1, "dg_pack_weight", a, msg,
			  msg_size);
}

dg_status dg_pack_weight(dg_device *dev, const dg_spec *spec, const dg_pack_weight_args *a)
{
	return pair_run(dev, spec, DG_OP_PACK_TERNARY, DG_OP_PACK_SIGN1, "dg_pack_weight", a);
}

dg_status dg_pack_i8x4_check(const dg_spec *spec, const dg_pack_i8x4_args *a, char *msg,
			     size_t msg_size)
{
	return pair_check(spec, DG_OP_PACK_I8X4, DG_OP_UNPACK_I8X4, "dg_pack_i8x4", a, msg,
			  msg_size);
}

dg_status dg_pack_i8x4(dg_device *dev, const dg_spec *spec, const dg_pack_i8x4_args *a)
{
	return pair_run(dev, spec, DG_OP_PACK_I8X4, DG_OP_UNPACK_I8X4, "dg_pack_i8x4", a);
}
