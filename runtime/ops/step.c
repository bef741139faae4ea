/*
 * The step family (dragon/ops.h): the training step's element-wise glue —
 * add_mask (a masked gradient sum, in place) and add3 (three-way sum) — and
 * transpose (f32 master weights to the act-format execution layout and
 * back), all from templates/step.lua. Nothing here allocates, frees or
 * synchronizes.
 */
#include "runtime/ops/ops_int.h"

/* Any of the three: the op's tensors in the table's order, then add_mask's
 * (int B, int T), add3's (long long n) or transpose's (long long R). */
static dg_status step_prep(dg_prepared *p, const char *entry)
{
	const dg_spec *spec = &p->spec;
	const dg_op op = spec->op;
	const dg__op_shape *sh = &p->shape;
	/* the work items of a thread (a vector) or of a block (a 32x32 tile) */
	long long work, per_block;
	if (op == DG_OP_TRANSPOSE) {
		work = sh->r * dg__op_cdiv(spec->embd, 32) * dg__op_cdiv(spec->latent, 32);
		per_block = 1;
	} else {
		long long n = op == DG_OP_ADD3 ? sh->n : (long long)sh->b * spec->heads * sh->t * spec->latent;
		/* a vector: 16 bytes of the narrowest tensor (templates/step.lua) */
		bool bf = op == DG_OP_ADD_MASK && (spec->act == DG_FMT_BF16 || spec->out == DG_FMT_BF16 ||
						   spec->src == DG_FMT_BF16);
		work = dg__op_cdiv(n, bf ? 8 : 4);
		per_block = 0; /* the block size, below */
	}
	if (work == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	dg_launch l = { { dg__op_grid(work, per_block ? per_block : nt,
				      8LL * dg__dev_info(p->dev)->sm_count),
			  1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	const dg_op_info *row = dg_op_info_of(op);
	for (int i = 0; i < row->n_args; i++)
		dg__arg_data(p, L, i);
	if (op == DG_OP_ADD_MASK) {
		dg__arg_i32(p, L, sh->b);
		dg__arg_i32(p, L, sh->t);
	} else {
		dg__arg_i64(p, L, op == DG_OP_ADD3 ? sh->n : sh->r);
	}
	return DG_OK;
}

/* ---- the entries: add_mask (dxs in and out, other, xs), add3 (a, b, c, out),
 * transpose (in, out) ------------------------------------------------------------- */

dg_status dg__prep_add_mask(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return step_prep(p, "dg_add_mask");
}

dg_status dg__prep_add3(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return step_prep(p, "dg_add3");
}

dg_status dg__prep_transpose(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return step_prep(p, "dg_transpose");
}
