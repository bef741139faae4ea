/*
 * The norm family: layer norm without affine parameters, alone
 * (layernorm_fwd / _bwd) and fused with the residual add (resid_ln_fwd /
 * _bwd), templates/norm.lua. One warp a row, rows grid-stride, so any
 * grid gives the same bits; no workspace. eps is the call's (finite,
 * >= 0); R = 0 launches nothing.
 */
#include <math.h>
#include <stdio.h>

#include "runtime/ops/ops_int.h"

/* eps of a forward: finite and >= 0. */
static dg_status eps_ok(const char *fn, float eps, char *msg, size_t size)
{
	if (isfinite(eps) && eps >= 0.0f)
		return DG_OK;
	snprintf(msg, size, "%s: eps=%g must be finite and >= 0 (PyTorch's default is 1e-5)", fn,
		 (double)eps);
	return DG_ERR_INVALID_ARG;
}

/* A forward's check: the table's, then eps. (The backwards have the
 * table's alone.) */
static dg_status fwd_check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
			   char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, op, fn, c, NULL, msg, size);
	return st ? st : eps_ok(fn, c->eps, msg, size);
}

/* eps's rule at every launch of a prepared forward: the kernel reads the
 * launch's own. */
static dg_status eps_ptrs(const dg_prepared *p, const dg__op_call *c, char *msg, size_t size)
{
	return eps_ok(p->fn, c->eps, msg, size);
}

/* One launch of entry dg_<op>: the op's tensors in the table's order,
 * rows (long long), then the forward's eps (float) or the backward's
 * accumulate (int). */
static dg_status prep(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const dg_op op = p->spec.op;
	const bool fwd = op == DG_OP_LAYERNORM_FWD || op == DG_OP_RESID_LN_FWD;
	long long rows = p->shape.r;
	if (fwd)
		p->ptrs = eps_ptrs;
	if (rows == 0)
		return DG_OK;
	char entry[64];
	snprintf(entry, sizeof(entry), "dg_%s", dg_op_name(op));
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	int sms = dg__dev_info(p->dev)->sm_count;
	dg_launch l = { { dg__op_grid(rows, nt / 32, 64LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	/* layernorm_fwd: x, y, rstd; resid_ln_fwd: x, y, out, rstd;
	 * layernorm_bwd: dy, y, rstd, dx; resid_ln_bwd: dout, out, rstd, dx, dy */
	int n = op == DG_OP_LAYERNORM_FWD ? 3 : op == DG_OP_RESID_LN_BWD ? 5 : 4;
	for (int i = 0; i < n; i++)
		dg__arg_data(p, L, i);
	dg__arg_i64(p, L, rows);
	if (fwd)
		DG__ARG_OF(p, L, eps);
	else
		DG__FLAG_OF(p, L, accumulate);
	return DG_OK;
}

/* ---- the entries ------------------------------------------------------------- */

dg_status dg__check_layernorm_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				  size_t msg_size)
{
	return fwd_check(spec, DG_OP_LAYERNORM_FWD, "dg_layernorm_fwd", c, msg, msg_size);
}

dg_status dg__check_resid_ln_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				 size_t msg_size)
{
	return fwd_check(spec, DG_OP_RESID_LN_FWD, "dg_resid_ln_fwd", c, msg, msg_size);
}

dg_status dg__prep_layernorm_fwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}

dg_status dg__prep_layernorm_bwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}

dg_status dg__prep_resid_ln_fwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}

dg_status dg__prep_resid_ln_bwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}
