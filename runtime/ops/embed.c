/*
 * The embed family (templates/embed.lua): the token embedding and its
 * gradient. The forward is a warp a row; the backward gives each block
 * unit one vocab row's columns and walks the tokens in order, so dtable is
 * dg_ref_embed_bwd's bit for bit with no atomics. No workspace. Token ids
 * live on the device, so an id outside 0..V-1 cannot be refused here: the
 * forward writes that row as zeros and sets the caller's `bad` int32 (see
 * dragon/ops.h); the backward skips it. R = 0 launches nothing (the
 * backward then still writes dtable: zeros, or unchanged with accumulate).
 */
#include <stdio.h>

#include "runtime/ops/ops_int.h"

/* `bad` must be 4-byte aligned (an int32), or 0. */
static dg_status bad_ok(const char *fn, dg_dptr bad, char *msg, size_t size)
{
	if (bad % 4 == 0)
		return DG_OK;
	snprintf(msg, size, "%s: bad: pointer 0x%llx is not 4-byte aligned (an int32 on the device)", fn,
		 (unsigned long long)bad);
	return DG_ERR_INVALID_ARG;
}

/* The table's check, then bad's alignment. */
static dg_status check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
		       char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, op, fn, c, NULL, msg, size);
	return st ? st : bad_ok(fn, c->bad, msg, size);
}

/* bad's rule at every launch of a prepared op: its pointer is the
 * launch's own. */
static dg_status ptrs(const dg_prepared *p, const dg__op_call *c, char *msg, size_t size)
{
	return bad_ok(p->fn, c->bad, msg, size);
}

/* One launch: idx, in, out, rows (long long), then the forward's bad
 * pointer or the backward's accumulate (int). */
static dg_status prep(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const bool fwd = p->spec.op == DG_OP_EMBED_FWD;
	long long rows = p->shape.r;
	p->ptrs = ptrs;
	if (rows == 0 && fwd)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, fwd ? "dg_embed_fwd" : "dg_embed_bwd", &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	int sms = dg__dev_info(p->dev)->sm_count;
	/* the forward: a warp a row; the backward: one block a unit (a few
	 * vocab rows, column chunk of nt; templates/embed.lua), all scanning
	 * at once: at most a unit a vocab row, and 16 blocks an SM walk them */
	long long units = (long long)p->spec.vocab * dg__op_cdiv(p->spec.embd, nt);
	unsigned grid = fwd ? dg__op_grid(rows, nt / 32, 64LL * (sms > 0 ? sms : 1))
			    : dg__op_grid(units, 1, 16LL * (sms > 0 ? sms : 1));
	dg_launch l = { { grid, 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* idx */
	dg__arg_data(p, L, 1); /* table | dout */
	dg__arg_data(p, L, 2); /* out | dtable */
	dg__arg_i64(p, L, rows);
	if (fwd)
		DG__ARG_OF(p, L, bad);
	else
		DG__FLAG_OF(p, L, accumulate);
	return DG_OK;
}

/* ---- embed_fwd ---------------------------------------------------------------- */

dg_status dg__check_embed_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			      size_t msg_size)
{
	return check(spec, DG_OP_EMBED_FWD, "dg_embed_fwd", c, msg, msg_size);
}

dg_status dg__prep_embed_fwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}

/* ---- embed_bwd ---------------------------------------------------------------- */

/* bad is the forward's, but the generic call may carry one: a launch
 * refuses it misaligned, so the check does too. */
dg_status dg__check_embed_bwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			      size_t msg_size)
{
	return check(spec, DG_OP_EMBED_BWD, "dg_embed_bwd", c, msg, msg_size);
}

dg_status dg__prep_embed_bwd(dg_prepared *p, const dg__op_call *c)
{
	return prep(p, c);
}
