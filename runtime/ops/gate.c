/*
 * The gate family (dragon/ops.h): BDH's xy = dropout(xs · ys) and its
 * backward (templates/gate.lua), element-wise over the flat (B,H,T,L)
 * tensors. The dropout's p, seed, step, layer and elem0 travel in the
 * call (dg__op_call) and reach the kernel as arguments, so a kernel is
 * compiled once a spec, whatever the step or the rank. Nothing here
 * allocates, frees or synchronizes: a launch is a check, a kernel-map
 * lookup and a launch.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

static dg__op_call call_of(const dg_tensor *t0, const dg_tensor *t1, const dg_tensor *t2,
			   const dg_tensor *t3, float p, uint64_t seed, uint32_t step,
			   uint32_t layer, dg_dptr step_at, uint64_t elem0)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	c.t[0] = t0;
	c.t[1] = t1;
	c.t[2] = t2;
	c.t[3] = t3;
	c.p = p;
	c.seed = seed;
	c.step = step;
	c.layer = layer;
	c.step_at = step_at;
	c.elem0 = elem0;
	return c;
}

/* The op table's check, then the drop probability and step_at's
 * alignment (the kernel reads a uint32 there: a misaligned address would
 * fault the context instead of being refused). */
static dg_status gate_check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
			    dg__op_shape *sh, char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, op, fn, c, sh, msg, size);
	if (st)
		return st;
	if (!(c->p >= 0.0f && c->p < 1.0f)) {
		snprintf(msg, size, "%s: p=%g: the drop probability must be in [0, 1) (0: no dropout)",
			 fn, (double)c->p);
		return DG_ERR_INVALID_ARG;
	}
	if (c->step_at & 3u) {
		snprintf(msg, size, "step_at: %s: 0x%llx is not 4-byte aligned (a device uint32)", fn,
			 (unsigned long long)c->step_at);
		return DG_ERR_INVALID_ARG;
	}
	if (op == DG_OP_GATE_BWD && c->t[3]->data == c->t[0]->data) {
		snprintf(msg, size, "dxs: %s: must not alias dxy (dys is written over dxy)", fn);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

static dg_status run_gate(dg_device *dev, const dg_spec *spec, dg_op op, const dg__op_call *c)
{
	const char *fn = op == DG_OP_GATE_FWD ? "dg_gate_fwd" : "dg_gate_bwd";
	char msg[512];
	dg__op_shape sh;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	dg_status st = gate_check(spec, op, fn, c, &sh, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	long long n = (long long)sh.b * spec->heads * sh.t * spec->latent;
	if (n == 0)
		return DG_OK;
	dg_kernel *k;
	st = dg_kernel_get(dev, spec, fn, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	/* elements a thread's vector: 16 bytes of the narrowest tensor
	 * (templates/gate.lua); the loop is grid-stride, so this only sizes
	 * the grid */
	bool bf = spec->act == DG_FMT_BF16 || (op == DG_OP_GATE_BWD && spec->out == DG_FMT_BF16);
	long long ve = bf ? 8 : 4;
	dg_launch l = { { dg__op_grid(dg__op_cdiv(n, ve), nt, 8LL * dg__dev_info(dev)->sm_count), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg_dptr p[DG_OP_MAX_ARGS];
	void *args[DG_OP_MAX_ARGS + 8];
	int na = 0;
	const dg_op_info *row = dg_op_info_of(op);
	for (int i = 0; i < row->n_args; i++) {
		p[i] = c->t[i]->data;
		args[na++] = &p[i];
	}
	int B = (int)sh.b, T = (int)sh.t;
	float prob = c->p;
	unsigned long long seed = c->seed;
	unsigned step = c->step, layer = c->layer;
	dg_dptr step_at = c->step_at;
	unsigned long long elem0 = c->elem0;
	args[na++] = &B;
	args[na++] = &T;
	args[na++] = &prob;
	args[na++] = &seed;
	args[na++] = &step;
	args[na++] = &layer;
	args[na++] = &step_at;
	args[na++] = &elem0;
	return dg_kernel_launch(dev, k, &l, args);
}

dg_status dg__run_gate_fwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run_gate(dev, spec, DG_OP_GATE_FWD, c);
}

dg_status dg__run_gate_bwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	return run_gate(dev, spec, DG_OP_GATE_BWD, c);
}

DG__OP_NO_WORKSPACE(gate_fwd)

DG__OP_NO_WORKSPACE(gate_bwd)

dg_status dg__check_gate_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			     size_t msg_size)
{
	return gate_check(spec, DG_OP_GATE_FWD, "dg_gate_fwd", c, NULL, msg, msg_size);
}

dg_status dg__check_gate_bwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			     size_t msg_size)
{
	return gate_check(spec, DG_OP_GATE_BWD, "dg_gate_bwd", c, NULL, msg, msg_size);
}

/* ---- the typed calls ------------------------------------------------------------ */

#define FWD_CALL(a) \
	call_of((a)->xs, (a)->ys, (a)->xy, NULL, (a)->p, (a)->seed, (a)->step, (a)->layer, (a)->step_at, \
		(a)->elem0)
#define BWD_CALL(a) \
	call_of((a)->dxy, (a)->xs, (a)->ys, (a)->dxs, (a)->p, (a)->seed, (a)->step, (a)->layer, \
		(a)->step_at, (a)->elem0)

dg_status dg_gate_fwd_check(const dg_spec *spec, const dg_gate_fwd_args *a, char *msg,
			    size_t msg_size)
{
	dg__op_call c = a ? FWD_CALL(a) : call_of(NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0);
	return gate_check(spec, DG_OP_GATE_FWD, "dg_gate_fwd", a ? &c : NULL, NULL, msg, msg_size);
}

dg_status dg_gate_fwd(dg_device *dev, const dg_spec *spec, const dg_gate_fwd_args *a)
{
	dg__op_call c = a ? FWD_CALL(a) : call_of(NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0);
	return run_gate(dev, spec, DG_OP_GATE_FWD, a ? &c : NULL);
}

dg_status dg_gate_bwd_check(const dg_spec *spec, const dg_gate_bwd_args *a, char *msg,
			    size_t msg_size)
{
	dg__op_call c = a ? BWD_CALL(a) : call_of(NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0);
	return gate_check(spec, DG_OP_GATE_BWD, "dg_gate_bwd", a ? &c : NULL, NULL, msg, msg_size);
}

dg_status dg_gate_bwd(dg_device *dev, const dg_spec *spec, const dg_gate_bwd_args *a)
{
	dg__op_call c = a ? BWD_CALL(a) : call_of(NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0, 0);
	return run_gate(dev, spec, DG_OP_GATE_BWD, a ? &c : NULL);
}

/* ---- decoder_gate_bwd ----------------------------------------------------------
 * decoder_grad_input with gate_bwd in its epilogue (templates/decoder_gate.lua):
 * a GEMM grid (ceil(L/BN), ceil(B·T/BM), H) of the kernel's tile, the
 * dropout's arguments as gate_bwd's. */

static dg__op_call dg_call_of(const dg_decoder_gate_bwd_args *a)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if (a) {
		c.t[0] = a->grad;
		c.t[1] = a->w;
		c.t[2] = a->xs;
		c.t[3] = a->ys;
		c.t[4] = a->dxs;
		c.t[5] = a->dys;
		c.p = a->p;
		c.seed = a->seed;
		c.step = a->step;
		c.layer = a->layer;
		c.step_at = a->step_at;
		c.elem0 = a->elem0;
	}
	return c;
}

/* gate_check (the op table's, the drop probability), and outputs that
 * alias nothing (the kernel reads xs and ys after other blocks wrote dxs,
 * dys). */
static dg_status dg_check(const dg_spec *spec, const dg__op_call *c, dg__op_shape *sh, char *msg,
			  size_t size)
{
	static const char fn[] = "dg_decoder_gate_bwd";
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = gate_check(spec, DG_OP_DECODER_GATE_BWD, fn, c, sh, msg, size);
	if (st)
		return st;
	static const char *const names[] = { "grad", "w", "xs", "ys", "dxs", "dys" };
	for (int o = 4; o < 6; o++)
		for (int i = 0; i < 6; i++)
			if (i != o && c->t[i]->data == c->t[o]->data) {
				snprintf(msg, size, "%s: %s: %s: must not alias %s", names[o],
					 c->t[o]->name ? c->t[o]->name : "(unnamed)", fn, names[i]);
				return DG_ERR_INVALID_ARG;
			}
	return DG_OK;
}

dg_status dg__run_decoder_gate_bwd(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	char msg[512];
	dg__op_shape sh;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg_check(spec, c, &sh, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	if (sh.b * sh.t == 0)
		return DG_OK;
	dg_kernel *k;
	st = dg_kernel_get(dev, spec, "dg_decoder_gate_bwd", &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	dg_launch l;
	memset(&l, 0, sizeof(l)); /* block and shared memory: the plan's */
	l.grid[0] = (unsigned)dg__op_cdiv(spec->latent, t->bn);
	l.grid[1] = (unsigned)dg__op_cdiv(sh.b * sh.t, t->bm);
	l.grid[2] = (unsigned)spec->heads;
	if (l.grid[1] > 65535)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_decoder_gate_bwd: batch·time = %lld rows need %u row blocks of %d, more than the grid's 65535",
				    (long long)(sh.b * sh.t), l.grid[1], t->bm);
	dg_dptr p[6];
	void *args[14];
	for (int i = 0; i < 6; i++) {
		p[i] = c->t[i]->data;
		args[i] = &p[i];
	}
	int B = (int)sh.b, T = (int)sh.t;
	float prob = c->p;
	unsigned long long seed = c->seed;
	unsigned step = c->step, layer = c->layer;
	args[6] = &B;
	args[7] = &T;
	args[8] = &prob;
	args[9] = &seed;
	dg_dptr step_at = c->step_at;
	args[10] = &step;
	args[11] = &layer;
	args[12] = &step_at;
	unsigned long long elem0 = c->elem0;
	args[13] = &elem0;
	return dg_kernel_launch(dev, k, &l, args);
}

DG__OP_NO_WORKSPACE(decoder_gate_bwd)

dg_status dg__check_decoder_gate_bwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				     size_t msg_size)
{
	return dg_check(spec, c, NULL, msg, msg_size);
}

dg_status dg_decoder_gate_bwd_check(const dg_spec *spec, const dg_decoder_gate_bwd_args *a,
				    char *msg, size_t msg_size)
{
	dg__op_call c = dg_call_of(a);
	return dg_check(spec, a ? &c : NULL, NULL, msg, msg_size);
}

dg_status dg_decoder_gate_bwd(dg_device *dev, const dg_spec *spec,
			      const dg_decoder_gate_bwd_args *a)
{
	dg__op_call c = dg_call_of(a);
	return dg__run_decoder_gate_bwd(dev, spec, a ? &c : NULL);
}
