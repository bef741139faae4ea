/*
 * The one check of an op's tensors, read from the op table's signature
 * (dg_op_info.args), and the launch helpers every op file shares. A typed
 * op (dragon/ops.h) has its tensors put in a dg__op_call and asks here, so
 * the shapes an op takes are written once, in codegen/optable.c.
 */
#include <limits.h>
#include <stdio.h>

#include "runtime/ops/ops_int.h"

/* Rows B·T (or R) a kernel takes: int arithmetic inside, with tile padding. */
#define DG_MAX_ROWS (1LL << 30)

/* The extent of d, or -1 (any) for a call size not bound yet. */
static int64_t extent(const dg_spec *s, dg_dim d, const dg__op_shape *sh)
{
	return dg_op_dim_extent(s, d, sh->b, sh->t, sh->r);
}

dg_status dg__op_check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
		       dg__op_shape *shape, char *msg, size_t size)
{
	char local[512];
	dg_status st;

	if (!msg || !size) { /* the caller wants no message */
		msg = local;
		size = sizeof(local);
	}
	if (!spec || !c) {
		snprintf(msg, size, "%s: %s is NULL", fn, !spec ? "spec" : "args");
		return DG_ERR_INVALID_ARG;
	}
	if (spec->op != op) {
		snprintf(msg, size, "%s: spec op=%s, expected op=%s", fn, dg_op_name(spec->op),
			 dg_op_name(op));
		return DG_ERR_INVALID_SPEC;
	}
	st = dg_spec_validate(spec, msg, size);
	if (st)
		return st;
	const dg_op_info *row = dg_op_info_of(op);
	dg__op_shape sh = { -1, -1, -1, -1 };
	const dg_tensor *like = NULL; /* the first any-shape argument */
	for (int i = 0; i < row->n_args; i++) {
		const dg_op_arg *a = &row->args[i];
		const dg_tensor *t = c->t[i];
		dg_fmt f = dg_op_arg_fmt(spec, a->fmt);
		bool scale = a->scale && dg_fmt_is_code(f);
		if (a->ndim == 0) {
			if (!like) {
				if (!t) {
					snprintf(msg, size, "%s: missing (expected %s, any shape)", a->name,
						 dg_fmt_name(f));
					return DG_ERR_INVALID_ARG;
				}
				st = dg_tensor_expect(t, a->name, f, t->ndim, NULL, scale, msg, size);
				like = t;
				if (!st)
					sh.n = dg_tensor_numel(t);
			} else {
				st = dg_tensor_expect(t, a->name, f, like->ndim, like->shape, scale, msg,
						      size);
			}
			if (st)
				return st;
			continue;
		}
		if (!dg_op_arg_used(spec, i)) {
			/* another epilogue's argument (dg_op_arg.epi): never read,
			 * so one given is a mistake of the caller's */
			if (t) {
				snprintf(msg, size, "%s: op %s with epi=%s does not take it; pass NULL", a->name,
					 dg_op_name(op), dg_epi_name(spec->epi));
				return DG_ERR_INVALID_ARG;
			}
			continue;
		}
		if (!t && a->optional)
			continue; /* the op's own check says when it must be there */
		int64_t want[DG_TENSOR_MAX_DIMS];
		for (int d = 0; d < a->ndim; d++)
			want[d] = extent(spec, a->dims[d], &sh);
		st = dg_tensor_expect(t, a->name, f, a->ndim, want, scale, msg, size);
		if (st)
			return st;
		for (int d = 0; d < a->ndim; d++) {
			if (a->dims[d] == DG_DIM_B && sh.b < 0)
				sh.b = t->shape[d];
			else if (a->dims[d] == DG_DIM_T && sh.t < 0)
				sh.t = t->shape[d];
			else if (a->dims[d] == DG_DIM_R && sh.r < 0)
				sh.r = t->shape[d];
		}
		/* a size a tensor has twice ((B,H,T,T) scores) binds at its first */
		bool again = false;
		for (int d = 0; d < a->ndim; d++) {
			int64_t bound = extent(spec, a->dims[d], &sh);
			again |= want[d] < 0 && bound != t->shape[d];
			want[d] = bound;
		}
		if (again)
			return dg_tensor_expect(t, a->name, f, a->ndim, want, scale, msg, size);
	}
	int64_t rows = sh.b >= 0 ? sh.b * (sh.t > 0 ? sh.t : 1) : sh.r;
	if (rows > DG_MAX_ROWS || sh.b > INT_MAX || sh.t > INT_MAX) {
		snprintf(msg, size, "%s: %lld rows (B·T); at most %lld (split the batch)", fn,
			 (long long)rows, DG_MAX_ROWS);
		return DG_ERR_INVALID_ARG;
	}
	if (shape)
		*shape = sh;
	return DG_OK;
}

dg_status dg__op_workspace_ok(dg_device *dev, const char *fn, const dg_workspace *ws,
			      size_t need)
{
	if (need == 0)
		return DG_OK;
	if (!ws->ptr || ws->bytes < need)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: ws: %zu bytes of workspace needed, %zu given%s; size it with the op's _workspace call",
				    fn, need, ws->ptr ? ws->bytes : 0,
				    ws->ptr ? "" : " (ptr is 0)");
	if (ws->ptr % 256)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: ws: ptr 0x%llx must be 256-byte aligned", fn,
				    (unsigned long long)ws->ptr);
	return DG_OK;
}

unsigned dg__op_grid(long long work, long long per_block, long long cap)
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

long long dg__op_cdiv(long long a, long long b)
{
	return (a + b - 1) / b;
}
