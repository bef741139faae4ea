/*
 * The step family (dragon/ops.h): the training step's element-wise glue —
 * add_mask (a masked gradient sum, in place) and add3 (three-way sum) — and
 * transpose (f32 master weights to the act-format execution layout and
 * back), all from templates/step.lua. Nothing here allocates, frees or
 * synchronizes.
 */
#include <string.h>

#include "runtime/ops/ops_int.h"

static const char *fn_of(dg_op op)
{
	return op == DG_OP_ADD_MASK ? "dg_add_mask" : op == DG_OP_ADD3 ? "dg_add3" : "dg_transpose";
}

static dg_status run_step(dg_device *dev, const dg_spec *spec, dg_op op, const dg__op_call *c)
{
	const char *fn = fn_of(op);
	dg__op_shape sh;
	dg_status st = dg__op_check_dev(dev, spec, op, fn, c, &sh);
	if (st)
		return st;
	/* the work items of a thread (a vector) or of a block (a 32x32 tile) */
	long long work, per_block;
	dg_kernel *k;
	if (op == DG_OP_TRANSPOSE) {
		work = sh.r * dg__op_cdiv(spec->embd, 32) * dg__op_cdiv(spec->latent, 32);
		per_block = 1;
	} else {
		long long n = op == DG_OP_ADD3 ? sh.n : (long long)sh.b * spec->heads * sh.t * spec->latent;
		/* a vector: 16 bytes of the narrowest tensor (templates/step.lua) */
		bool bf = op == DG_OP_ADD_MASK && (spec->act == DG_FMT_BF16 || spec->out == DG_FMT_BF16 ||
						   spec->src == DG_FMT_BF16);
		work = dg__op_cdiv(n, bf ? 8 : 4);
		per_block = 0; /* the block size, below */
	}
	if (work == 0)
		return DG_OK;
	st = dg_kernel_get(dev, spec, fn, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	dg_launch l = { { dg__op_grid(work, per_block ? per_block : nt, 8LL * dg__dev_info(dev)->sm_count),
			  1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg_dptr p[DG_OP_MAX_ARGS];
	void *args[DG_OP_MAX_ARGS + 2];
	int na = 0;
	const dg_op_info *row = dg_op_info_of(op);
	for (int i = 0; i < row->n_args; i++) {
		p[i] = c->t[i]->data;
		args[na++] = &p[i];
	}
	int B = (int)sh.b, T = (int)sh.t;
	long long n_all = (long long)sh.n, rows = (long long)sh.r;
	if (op == DG_OP_ADD_MASK) {
		args[na++] = &B;
		args[na++] = &T;
	} else {
		args[na++] = op == DG_OP_ADD3 ? (void *)&n_all : (void *)&rows;
	}
	return dg_kernel_launch(dev, k, &l, args);
}

#define STEP_ENTRIES(name, OP)                                                               \
	dg_status dg__run_##name(dg_device *dev, const dg_spec *spec, const dg__op_call *c)  \
	{                                                                                    \
		return run_step(dev, spec, OP, c);                                           \
	}                                                                                    \
	DG__OP_NO_WORKSPACE(name)

STEP_ENTRIES(add_mask, DG_OP_ADD_MASK)
STEP_ENTRIES(add3, DG_OP_ADD3)
STEP_ENTRIES(transpose, DG_OP_TRANSPOSE)

/* The typed calls: a check and a run each, the tensors in the table's order. */
DG__OP_TYPED(add_mask, DG_OP_ADD_MASK, run_step, a->dxs, a->other, a->xs, NULL)
DG__OP_TYPED(add3, DG_OP_ADD3, run_step, a->a, a->b, a->c, a->out)
DG__OP_TYPED(transpose, DG_OP_TRANSPOSE, run_step, a->in, a->out, NULL, NULL)
