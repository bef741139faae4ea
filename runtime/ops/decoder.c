/*
 * The decoder family: the decoder tail (decoder_fwd: split-K into
 * per-split slices of partial sums in the caller's workspace, which a
 * second launch adds and converts) and its input and weight gradients (the
 * GEMMs of grad.c). Kernels: templates/decoder.lua, templates/backward.lua.
 */
#include <string.h>

#include "runtime/ops/ops_int.h"

/* ---- decoder_fwd ---------------------------------------------------------- */

static dg__op_call fwd_call(const dg_decoder_fwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->y;
		c.t[1] = a->w;
		c.t[2] = a->out;
		c.ws = a->ws;
	}
	return c;
}

dg_status dg_decoder_fwd_check(const dg_spec *spec, const dg_decoder_fwd_args *a, char *msg,
			       size_t msg_size)
{
	dg__op_call c = fwd_call(a);
	return dg__op_check(spec, DG_OP_DECODER_FWD, "dg_decoder_fwd", a ? &c : NULL, NULL, msg,
			    msg_size);
}

/* K splits: enough (tile, split) items for two a SM (one a SM, one wave,
 * on the wgmma path: a block fills its SM), each split at least 256 codes
 * of K, at most 32. The float path sums K in one item (deterministic): 1.
 * r: the spec the kernel was built for (its tile). */
static int splits_of(const dg_spec *r, long long m, int sms, long long *tiles)
{
	*tiles = dg__op_cdiv(m, r->tile.bm) * dg__op_cdiv(r->embd, r->tile.bn);
	if (!dg_fmt_is_code(r->act) || !dg_fmt_is_code(r->weight))
		return 1;
	if (sms < 1)
		sms = 1;
	long long want = r->arch_specific ? (sms / *tiles > 1 ? sms / *tiles : 1)
					  : dg__op_cdiv(2LL * sms, *tiles);
	long long most = (long long)r->heads * r->latent / 256;
	if (want > most)
		want = most;
	if (want > 32)
		want = 32;
	return want < 1 ? 1 : (int)want;
}

/* The kernel, its splits and the workspace bytes of m rows. */
static dg_status fwd_plan(dg_device *dev, const dg_spec *spec, long long m, dg_kernel **k,
			  int *nsplit, long long *tiles, size_t *bytes)
{
	dg_status st = dg_kernel_get(dev, spec, "dg_decoder_fwd", k);
	if (st)
		return st;
	*nsplit = splits_of(dg_kernel_spec(*k), m, dg__dev_info(dev)->sm_count, tiles);
	/* one slice of partial sums a split (int32; f32 for the float path,
	 * which runs one split): every element written, nothing to zero */
	*bytes = (size_t)*nsplit * (size_t)m * (size_t)spec->embd * 4;
	return DG_OK;
}

dg_status dg__workspace_decoder_fwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
				    size_t *bytes)
{
	dg__op_shape sh;
	dg_kernel *k;
	int nsplit;
	long long tiles;

	*bytes = 0;
	dg_status st = dg__op_check_dev(dev, spec, DG_OP_DECODER_FWD, "dg_decoder_fwd_workspace",
					c, &sh);
	if (st || sh.b * sh.t == 0)
		return st;
	return fwd_plan(dev, spec, sh.b * sh.t, &k, &nsplit, &tiles, bytes);
}

dg_status dg__run_decoder_fwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	dg__op_shape sh;
	dg_kernel *k, *k2;
	int nsplit;
	long long tiles;
	size_t need;

	dg_status st = dg__op_check_dev(dev, spec, DG_OP_DECODER_FWD, "dg_decoder_fwd", c, &sh);
	if (st)
		return st;
	int B = (int)sh.b, T = (int)sh.t;
	long long m = (long long)B * T, n = m * spec->embd;
	if (m == 0)
		return DG_OK;
	st = fwd_plan(dev, spec, m, &k, &nsplit, &tiles, &need);
	if (!st)
		st = dg__op_workspace_ok(dev, "dg_decoder_fwd", &c->ws, need);
	if (!st)
		st = dg_kernel_get(dev, spec, "dg_decoder_fwd_out", &k2);
	if (st)
		return st;
	const int sms = dg__dev_info(dev)->sm_count;
	long long work = tiles * nsplit; /* the kernel strides over any grid */
	dg_launch l1 = { { dg__op_grid(work, 1, 16LL * sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg_dptr ws = c->ws.ptr;
	dg_dptr y = c->t[0]->data, w = c->t[1]->data;
	void *a1[] = { &y, &w, &ws, &B, &T, &nsplit };
	st = dg_kernel_launch(dev, k, &l1, a1);
	if (st)
		return st;

	dg_launch l2 = { { dg__op_grid(n, 1024, 16LL * (sms / 2 > 0 ? sms / 2 : 1)), 1, 1 },
			 { 256, 1, 1 }, 0 };
	dg_dptr sa = c->t[0]->scale, sw = c->t[1]->scale, out = c->t[2]->data;
	void *a2[] = { &ws, &sa, &sw, &out, &n, &nsplit };
	return dg_kernel_launch(dev, k2, &l2, a2);
}

dg_status dg_decoder_fwd_workspace(dg_device *dev, const dg_spec *spec,
				   const dg_decoder_fwd_args *a, size_t *bytes)
{
	if (!bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_decoder_fwd_workspace: bytes is NULL");
	dg__op_call c = fwd_call(a);
	return dg__workspace_decoder_fwd(dev, spec, a ? &c : NULL, bytes);
}

dg_status dg_decoder_fwd(dg_device *dev, const dg_spec *spec, const dg_decoder_fwd_args *a)
{
	dg__op_call c = fwd_call(a);
	return dg__run_decoder_fwd(dev, spec, a ? &c : NULL);
}

/* ---- decoder_grad_input ----------------------------------------------------- */

static dg__op_call gi_call(const dg_decoder_grad_input_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->grad;
		c.t[1] = a->w;
		c.t[2] = a->grad_y;
	}
	return c;
}

dg_status dg_decoder_grad_input_check(const dg_spec *spec, const dg_decoder_grad_input_args *a,
				      char *msg, size_t msg_size)
{
	dg__op_call c = gi_call(a);
	return dg__op_check(spec, DG_OP_DECODER_GRAD_INPUT, "dg_decoder_grad_input",
			    a ? &c : NULL, NULL, msg, msg_size);
}

dg_status dg__run_decoder_grad_input(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	dg_status st = dg__op_check_dev(dev, spec, DG_OP_DECODER_GRAD_INPUT,
					"dg_decoder_grad_input", c, NULL);
	if (st)
		return st;
	/* K = E: a few steps, never split (no reduce entry) */
	return dg__grad_input_launch(dev, spec, "dg_decoder_grad_input", NULL, c->t[0], c->t[1],
				     c->t[2], spec->latent, (unsigned)spec->heads, spec->embd, 0, NULL);
}

DG__OP_NO_WORKSPACE(decoder_grad_input)

dg_status dg_decoder_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_decoder_grad_input_args *a)
{
	dg__op_call c = gi_call(a);
	return dg__run_decoder_grad_input(dev, spec, a ? &c : NULL);
}

/* ---- decoder_grad_weight ---------------------------------------------------- */

static dg__op_call gw_call(const dg_decoder_grad_weight_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->grad;
		c.t[1] = a->y;
		c.t[2] = a->grad_w;
		c.accumulate = a->accumulate;
		c.ws = a->ws;
	}
	return c;
}

dg_status dg_decoder_grad_weight_check(const dg_spec *spec,
				       const dg_decoder_grad_weight_args *a, char *msg,
				       size_t msg_size)
{
	dg__op_call c = gw_call(a);
	return dg__op_check(spec, DG_OP_DECODER_GRAD_WEIGHT, "dg_decoder_grad_weight",
			    a ? &c : NULL, NULL, msg, msg_size);
}

dg_status dg__workspace_decoder_grad_weight(dg_device *dev, const dg_spec *spec,
					    const dg__op_call *c, size_t *bytes)
{
	dg__op_shape sh;
	*bytes = 0;
	dg_status st = dg__op_check_dev(dev, spec, DG_OP_DECODER_GRAD_WEIGHT,
					"dg_decoder_grad_weight_workspace", c, &sh);
	if (st)
		return st;
	/* per head: rows d (E), cols l (L) */
	return dg__grad_weight_workspace(dev, spec, "dg_decoder_grad_weight", sh.b * sh.t,
					 spec->embd, spec->latent, bytes);
}

dg_status dg__run_decoder_grad_weight(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	dg_status st = dg__op_check_dev(dev, spec, DG_OP_DECODER_GRAD_WEIGHT,
					"dg_decoder_grad_weight", c, NULL);
	if (st)
		return st;
	return dg__grad_weight_launch(dev, spec, "dg_decoder_grad_weight",
				      "dg_decoder_grad_weight_reduce", c->t[0], c->t[1], c->t[2],
				      c->accumulate, &c->ws, spec->embd, spec->latent);
}

dg_status dg_decoder_grad_weight_workspace(dg_device *dev, const dg_spec *spec,
					   const dg_decoder_grad_weight_args *a, size_t *bytes)
{
	if (!bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_decoder_grad_weight_workspace: bytes is NULL");
	dg__op_call c = gw_call(a);
	return dg__workspace_decoder_grad_weight(dev, spec, a ? &c : NULL, bytes);
}

dg_status dg_decoder_grad_weight(dg_device *dev, const dg_spec *spec,
				 const dg_decoder_grad_weight_args *a)
{
	dg__op_call c = gw_call(a);
	return dg__run_decoder_grad_weight(dev, spec, a ? &c : NULL);
}
