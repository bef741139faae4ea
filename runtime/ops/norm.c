/*
 * The norm family: layer norm without affine parameters, alone
 * (layernorm_fwd / _bwd) and fused with the residual add (resid_ln_fwd /
 * _bwd), templates/norm.lua. One warp a row, rows grid-stride, so any
 * grid gives the same bits; no workspace. eps is the call's (finite,
 * >= 0); R = 0 launches nothing.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

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

/* The table check, then the forward's eps. */
static dg_status check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
		       dg__op_shape *sh, char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, op, fn, c, sh, msg, size);
	if (!st && (op == DG_OP_LAYERNORM_FWD || op == DG_OP_RESID_LN_FWD))
		st = eps_ok(fn, c->eps, msg, size);
	return st;
}

static dg_status run(dg_device *dev, const dg_spec *spec, dg_op op, const char *fn,
		     const dg__op_call *c)
{
	char msg[512];
	dg__op_shape sh;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	dg_status st = check(spec, op, fn, c, &sh, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	long long rows = sh.r;
	if (rows == 0)
		return DG_OK;
	char entry[64];
	snprintf(entry, sizeof(entry), "dg_%s", dg_op_name(op));
	dg_kernel *k;
	st = dg_kernel_get(dev, spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	int sms = dg__dev_info(dev)->sm_count;
	dg_launch l = { { dg__op_grid(rows, nt / 32, 64LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg_dptr p[5] = { 0 };
	for (int i = 0; i < dg_op_info_of(op)->n_args; i++)
		p[i] = c->t[i]->data;
	float eps = c->eps;
	int acc = c->accumulate ? 1 : 0;
	switch (op) {
	case DG_OP_LAYERNORM_FWD: { /* x, y, rstd */
		void *a[] = { &p[0], &p[1], &p[2], &rows, &eps };
		return dg_kernel_launch(dev, k, &l, a);
	}
	case DG_OP_RESID_LN_FWD: { /* x, y, out, rstd */
		void *a[] = { &p[0], &p[1], &p[2], &p[3], &rows, &eps };
		return dg_kernel_launch(dev, k, &l, a);
	}
	case DG_OP_LAYERNORM_BWD: { /* dy, y, rstd, dx */
		void *a[] = { &p[0], &p[1], &p[2], &p[3], &rows, &acc };
		return dg_kernel_launch(dev, k, &l, a);
	}
	default: { /* resid_ln_bwd: dout, out, rstd, dx, dy */
		void *a[] = { &p[0], &p[1], &p[2], &p[3], &p[4], &rows, &acc };
		return dg_kernel_launch(dev, k, &l, a);
	}
	}
}

/* ---- layernorm_fwd ------------------------------------------------------------ */

static dg__op_call ln_fwd_call(const dg_layernorm_fwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->x;
		c.t[1] = a->y;
		c.t[2] = a->rstd;
		c.eps = a->eps;
	}
	return c;
}

dg_status dg_layernorm_fwd_check(const dg_spec *spec, const dg_layernorm_fwd_args *a, char *msg,
				 size_t msg_size)
{
	dg__op_call c = ln_fwd_call(a);
	return check(spec, DG_OP_LAYERNORM_FWD, "dg_layernorm_fwd", a ? &c : NULL, NULL, msg,
		     msg_size);
}

dg_status dg__run_layernorm_fwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run(dev, spec, DG_OP_LAYERNORM_FWD, "dg_layernorm_fwd", c);
}

DG__OP_NO_WORKSPACE(layernorm_fwd)

dg_status dg__check_layernorm_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				  size_t msg_size)
{
	return check(spec, DG_OP_LAYERNORM_FWD, "dg_layernorm_fwd", c, NULL, msg, msg_size);
}

dg_status dg_layernorm_fwd(dg_device *dev, const dg_spec *spec, const dg_layernorm_fwd_args *a)
{
	dg__op_call c = ln_fwd_call(a);
	return dg__run_layernorm_fwd(dev, spec, a ? &c : NULL);
}

/* ---- layernorm_bwd ------------------------------------------------------------ */

static dg__op_call ln_bwd_call(const dg_layernorm_bwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->dy;
		c.t[1] = a->y;
		c.t[2] = a->rstd;
		c.t[3] = a->dx;
		c.accumulate = a->accumulate;
	}
	return c;
}

dg_status dg_layernorm_bwd_check(const dg_spec *spec, const dg_layernorm_bwd_args *a, char *msg,
				 size_t msg_size)
{
	dg__op_call c = ln_bwd_call(a);
	return check(spec, DG_OP_LAYERNORM_BWD, "dg_layernorm_bwd", a ? &c : NULL, NULL, msg,
		     msg_size);
}

dg_status dg__run_layernorm_bwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run(dev, spec, DG_OP_LAYERNORM_BWD, "dg_layernorm_bwd", c);
}

DG__OP_NO_WORKSPACE(layernorm_bwd)

dg_status dg_layernorm_bwd(dg_device *dev, const dg_spec *spec, const dg_layernorm_bwd_args *a)
{
	dg__op_call c = ln_bwd_call(a);
	return dg__run_layernorm_bwd(dev, spec, a ? &c : NULL);
}

/* ---- resid_ln_fwd ------------------------------------------------------------- */

static dg__op_call rln_fwd_call(const dg_resid_ln_fwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->x;
		c.t[1] = a->y;
		c.t[2] = a->out;
		c.t[3] = a->rstd;
		c.eps = a->eps;
	}
	return c;
}

dg_status dg_resid_ln_fwd_check(const dg_spec *spec, const dg_resid_ln_fwd_args *a, char *msg,
				size_t msg_size)
{
	dg__op_call c = rln_fwd_call(a);
	return check(spec, DG_OP_RESID_LN_FWD, "dg_resid_ln_fwd", a ? &c : NULL, NULL, msg,
		     msg_size);
}

dg_status dg__run_resid_ln_fwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run(dev, spec, DG_OP_RESID_LN_FWD, "dg_resid_ln_fwd", c);
}

DG__OP_NO_WORKSPACE(resid_ln_fwd)

dg_status dg__check_resid_ln_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				 size_t msg_size)
{
	return check(spec, DG_OP_RESID_LN_FWD, "dg_resid_ln_fwd", c, NULL, msg, msg_size);
}

dg_status dg_resid_ln_fwd(dg_device *dev, const dg_spec *spec, const dg_resid_ln_fwd_args *a)
{
	dg__op_call c = rln_fwd_call(a);
	return dg__run_resid_ln_fwd(dev, spec, a ? &c : NULL);
}

/* ---- resid_ln_bwd ------------------------------------------------------------- */

static dg__op_call rln_bwd_call(const dg_resid_ln_bwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->dout;
		c.t[1] = a->out;
		c.t[2] = a->rstd;
		c.t[3] = a->dx;
		c.t[4] = a->dy;
		c.accumulate = a->accumulate;
	}
	return c;
}

dg_status dg_resid_ln_bwd_check(const dg_spec *spec, const dg_resid_ln_bwd_args *a, char *msg,
				size_t msg_size)
{
	dg__op_call c = rln_bwd_call(a);
	return check(spec, DG_OP_RESID_LN_BWD, "dg_resid_ln_bwd", a ? &c : NULL, NULL, msg,
		     msg_size);
}

dg_status dg__run_resid_ln_bwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run(dev, spec, DG_OP_RESID_LN_BWD, "dg_resid_ln_bwd", c);
}

DG__OP_NO_WORKSPACE(resid_ln_bwd)

dg_status dg_resid_ln_bwd(dg_device *dev, const dg_spec *spec, const dg_resid_ln_bwd_args *a)
{
	dg__op_call c = rln_bwd_call(a);
	return dg__run_resid_ln_bwd(dev, spec, a ? &c : NULL);
}
