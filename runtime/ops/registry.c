/*
 * The ops by number: a prepare entry an op of DG_OP_LIST, named after it
 * (dg__prep_<name>, in the op's family file), so the tuner, the bench, the
 * model and the tests reach every op through one door (dg__prepare, then
 * dg__prepared_launch; dg__op_run is both) and an op missing its entry
 * fails to link. A typed call's arguments struct becomes the generic call
 * through args_layout.c's table. The checks are sparse: a dg__check_<name>
 * only for the ops of DG__OP_OWN_CHECKS, whose family file adds rules to
 * the op table's; the rest are the table's alone. The typed calls of
 * dragon/ops.h (typed.c) are each a line through the dg__op_typed_ doors
 * at the end.
 */
#include <stddef.h>
#include <string.h>

#include "base/msg.h"
#include "runtime/ops/ops_int.h"

typedef dg_status (*prep_fn)(dg_prepared *, const dg__op_call *);
typedef dg_status (*check_fn)(const dg_spec *, const dg__op_call *, char *, size_t);

static const check_fn checks[DG_OP__COUNT] = {
#define DG__CHECK(e, name) [e] = dg__check_##name,
	DG__OP_OWN_CHECKS(DG__CHECK)
#undef DG__CHECK
};

static const prep_fn preps[DG_OP__COUNT] = {
#define DG__PREP(e, name) [e] = dg__prep_##name,
	DG_OP_LIST(DG__PREP)
#undef DG__PREP
};

static const char *const fn_names[DG_OP__COUNT] = {
#define DG__FN(e, name) [e] = "dg_" #name,
	DG_OP_LIST(DG__FN)
#undef DG__FN
};

dg_status dg__prepare(dg_device *dev, const dg_spec *spec, const dg__op_call *c, dg_prepared *p)
{
	char msg[512];
	dg_status st;

	memset(p, 0, offsetof(dg_prepared, launch));
	p->n_launch = 0;
	p->tmaps = NULL;
	p->ptrs = NULL;
	p->blob_used = 0;
	p->overflow = false;
	p->heap = false;
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg_prepare: no such op");
	p->dev = dev;
	p->spec = *spec;
	p->fn = fn_names[spec->op];
	/* the whole check: the table's, then the family's own rules */
	st = dg__op_check(spec, spec->op, p->fn, c, &p->shape, msg, sizeof(msg));
	if (!st && checks[spec->op])
		st = checks[spec->op](spec, c, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	/* then the device: a bad call is refused by what is wrong with it */
	if ((st = dg__dev_enter(dev)))
		return st;
	dg__prep_sign(p, c);
	st = preps[spec->op](p, c);
	if (!st && p->overflow)
		st = dg__dev_fail(dev, DG_ERR_INTERNAL,
				  "%s: its launches do not fit a prepared op (at most %d, %d parameters each, %d bytes of constants)",
				  p->fn, DG__PREP_LAUNCHES, DG__PREP_ARGS, DG__PREP_BLOB);
	return st;
}

dg_status dg__op_run(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_run: no such op");
	if (!c)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: args is NULL", fn_names[spec->op]);
	dg_prepared p;
	dg_status st = dg__prepare(dev, spec, c, &p);
	return st ? st : dg__prepared_launch(&p, c);
}

dg_status dg__op_workspace(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
			   size_t *bytes)
{
	*bytes = 0;
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_workspace: no such op");
	if (!c)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s_workspace: args is NULL",
				    fn_names[spec->op]);
	dg_prepared p;
	dg_status st = dg__prepare(dev, spec, c, &p);
	if (!st)
		*bytes = p.ws_bytes;
	return st;
}

dg_status dg__op_check_call(const dg_spec *spec, const dg__op_call *c, char *msg,
			    size_t msg_size)
{
	/* msg NULL or msg_size 0: no message, as dg__op_check and the
	 * entries' static checks take it */
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__msgf(DG_ERR_INVALID_SPEC, msg, msg_size, "dg__op_check_call: no such op");
	if (checks[spec->op])
		return checks[spec->op](spec, c, msg, msg_size);
	return dg__op_check(spec, spec->op, dg_op_name(spec->op), c, NULL, msg, msg_size);
}

/* A typed call's spec must name its op: else the table's check says why. */
static dg_status typed_spec_ok(dg_device *dev, dg_op op, const dg_spec *spec,
			       const dg__op_call *c)
{
	char msg[512];

	if (spec && spec->op == op)
		return DG_OK;
	dg_status st = dg__op_check(spec, op, fn_names[op], c, NULL, msg, sizeof(msg));
	return dg__dev_fail_msg(dev, st ? st : DG_ERR_INVALID_SPEC, msg);
}

dg_status dg__op_typed_run(dg_device *dev, dg_op op, const dg_spec *spec, const void *args)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	dg_status st = typed_spec_ok(dev, op, spec, cp);
	return st ? st : dg__op_run(dev, spec, cp);
}

dg_status dg__op_typed_workspace(dg_device *dev, dg_op op, const dg_spec *spec,
				 const void *args, size_t *bytes)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (!bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s_workspace: bytes is NULL",
				    fn_names[op]);
	*bytes = 0;
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	dg_status st = typed_spec_ok(dev, op, spec, cp);
	return st ? st : dg__op_workspace(dev, spec, cp, bytes);
}

dg_status dg__op_typed_check(dg_op op, const dg_spec *spec, const void *args, char *msg,
			     size_t msg_size)
{
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	if (checks[op])
		return checks[op](spec, cp, msg, msg_size);
	return dg__op_check(spec, op, fn_names[op], cp, NULL, msg, msg_size);
}
