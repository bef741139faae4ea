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

const char *dg__op_fn_name(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? fn_names[op] : "dg_(no such op)";
}

dg_status dg__op_own_check(const dg_spec *spec, const dg__op_call *c, char *msg, size_t msg_size)
{
	return checks[spec->op] ? checks[spec->op](spec, c, msg, msg_size) : DG_OK;
}

dg_status dg__op_prep(dg_prepared *p, const dg__op_call *c)
{
	return preps[p->spec.op](p, c);
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

dg_status dg__op_typed_check(dg_op op, const dg_spec *spec, const void *args, char *msg,
			     size_t msg_size)
{
	dg__op_call c = dg__op_call_from_args(op, args);
	const dg__op_call *cp = args ? &c : NULL;
	if (checks[op])
		return checks[op](spec, cp, msg, msg_size);
	return dg__op_check(spec, op, fn_names[op], cp, NULL, msg, msg_size);
}
