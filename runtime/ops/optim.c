/*
 * The optimizer family (dragon/ops.h "optim"; templates/optim.lua): the
 * fused AdamW update of one tensor and the gradients' global norm with its
 * clip factor, each reading or writing the step's control block on the
 * device (dragon/optim.h dg_adamw_ctl), so a training step captured into a
 * CUDA graph replays with new scalars after one small copy. Nothing here
 * allocates, frees or synchronizes.
 */
#include <stdio.h>

#include "runtime/ref/ref_ops.h"
#include "runtime/ops/ops_int.h"

/* templates/optim.lua's PARTS: dg_grad_sumsq's blocks, a partial each. */
#define PARTS 264
/* The control block's alignment: the kernels read it whole, doubles
 * included, so a misaligned one would fault the context, not be refused. */
#define CTL_ALIGN 8u

/* adamw_update's rules on the call's pointers, which a prepared op checks
 * again at every launch: p, m and v distinct from each other and from
 * grad (each is written), the control block and the copy aligned. c
 * passed the op table's check. */
static dg_status ptr_rules(const char *fn, const dg__op_call *c, char *msg, size_t size)
{
	static const char *const names[] = { "p", "grad", "m", "v" };
	for (int i = 0; i < 4; i++)
		for (int j = i + 1; j < 4; j++)
			if (c->t[i]->data == c->t[j]->data) {
				snprintf(msg, size, "%s: %s: must not alias %s (p, m and v are each written)",
					 names[j], fn, names[i]);
				return DG_ERR_INVALID_ARG;
			}
	if (c->ctl & (CTL_ALIGN - 1)) {
		snprintf(msg, size, "ctl: %s: 0x%llx is not %u-byte aligned (a dg_adamw_ctl holds doubles)",
			 fn, (unsigned long long)c->ctl, CTL_ALIGN);
		return DG_ERR_INVALID_ARG;
	}
	if (c->copy && (c->copy & 15u)) {
		snprintf(msg, size, "copy: %s: 0x%llx is not 16-byte aligned", fn,
			 (unsigned long long)c->copy);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

/* The op table's check (four f32 tensors of one shape), then ptr_rules. */
dg_status dg__check_adamw_update(const dg_spec *spec, const dg__op_call *c, char *msg,
				 size_t size)
{
	static const char fn[] = "dg_adamw_update";
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, DG_OP_ADAMW_UPDATE, fn, c, NULL, msg, size);
	return st ? st : ptr_rules(fn, c, msg, size);
}

/* The rules a prepared adamw_update checks at every launch. */
static dg_status update_ptrs(const dg_prepared *p, const dg__op_call *c, char *msg,
			     size_t msg_size)
{
	return ptr_rules(p->fn, c, msg, msg_size);
}

/* (p, grad, m, v, const dg_adamw_ctl_t *ctl, dg_adamw_ctl_t cv,
 * unsigned short *copy, long long n, int decay): cv the default scalars
 * by value, which the kernel reads when ctl is 0; grid-stride over
 * vectors of 4. */
dg_status dg__prep_adamw_update(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	p->ptrs = update_ptrs;
	long long n = p->shape.n;
	if (n == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, "dg_adamw_update", &k);
	if (st)
		return st;
	const int nt = dg_kernel_spec(k)->tile.threads, sms = dg__dev_info(p->dev)->sm_count;
	dg_launch l = { { dg__op_grid(dg__op_cdiv(n, 4), nt, 8LL * (sms > 0 ? sms : 1)), 1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg_adamw_ctl cv;
	dg_ref_adamw_default_ctl(&cv);
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* p */
	dg__arg_data(p, L, 1); /* grad */
	dg__arg_data(p, L, 2); /* m */
	dg__arg_data(p, L, 3); /* v */
	DG__ARG_OF(p, L, ctl);
	dg__arg_blob(p, L, &cv, sizeof(cv));
	DG__ARG_OF(p, L, copy);
	dg__arg_i64(p, L, n);
	DG__FLAG_OF(p, L, decay);
	return DG_OK;
}

/* ---- the gradients' norm ------------------------------------------------------ */

size_t dg_grad_norm_workspace(int n)
{
	return n > 0 ? (size_t)n * PARTS * sizeof(double) : 0;
}

dg_status dg_grad_norm(dg_device *dev, const dg_spec *spec, const dg_grad_norm_args *a)
{
	static const char fn[] = "dg_grad_norm";
	char msg[512];
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!spec || !a || (a->n > 0 && !a->grads))
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: NULL argument", fn);
	if (spec->op != DG_OP_ADAMW_UPDATE)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "%s: op=%s: expected an adamw_update spec",
				    fn, dg_op_name(spec->op));
	dg_status st = dg_spec_validate(spec, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	if (a->n < 1)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: n=%d: at least one gradient", fn, a->n);
	if (!a->ctl || (a->ctl & (CTL_ALIGN - 1)))
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "ctl: %s: the control block must be an %u-byte aligned device address",
				    fn, CTL_ALIGN);
	st = dg__op_workspace_ok(dev, fn, &a->ws, dg_grad_norm_workspace(a->n));
	if (st)
		return st;
	for (int i = 0; i < a->n; i++) {
		char name[32];
		snprintf(name, sizeof(name), "grads[%d]", i);
		const dg_tensor *t = a->grads[i];
		if (!t)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: %s: NULL", fn, name);
		st = dg_tensor_expect(t, name, DG_FMT_F32, t->ndim, NULL, false, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(dev, st, msg);
	}
	dg_kernel *ks, *kc;
	if ((st = dg_kernel_get(dev, spec, "dg_grad_sumsq", &ks)) ||
	    (st = dg_kernel_get(dev, spec, "dg_grad_clip", &kc)))
		return st;
	const unsigned nt = (unsigned)dg_kernel_spec(ks)->tile.threads;
	dg_launch l = { { PARTS, 1, 1 }, { nt, 1, 1 }, 0 };
	for (int i = 0; i < a->n && !st; i++) {
		dg_dptr g = a->grads[i]->data, part = a->ws.ptr + (dg_dptr)i * PARTS * sizeof(double);
		long long n = dg_tensor_numel(a->grads[i]);
		void *args[] = { &g, &n, &part };
		st = dg_kernel_launch(dev, ks, &l, args);
	}
	if (st)
		return st;
	dg_launch l1 = { { 1, 1, 1 }, { nt, 1, 1 }, 0 };
	dg_dptr part = a->ws.ptr, ctl = a->ctl;
	int nparts = a->n * PARTS;
	void *args[] = { &part, &nparts, &ctl };
	return dg_kernel_launch(dev, kc, &l1, args);
}
