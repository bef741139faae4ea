/*
 * The ops by number: one run and one workspace entry an op of DG_OP_LIST,
 * named after it (dg__run_<name>, dg__workspace_<name>, in the op's family
 * file), so the tuner, the bench and the tests reach every op through one
 * door and an op missing its entries fails to link. The checks are sparse:
 * a dg__check_<name> only for the ops of DG__OP_OWN_CHECKS, whose family
 * file adds rules to the op table's; the rest are the table's alone.
 */
#include "base/msg.h"
#include "runtime/ops/ops_int.h"

typedef dg_status (*run_fn)(dg_device *, const dg_spec *, const dg__op_call *);
typedef dg_status (*ws_fn)(dg_device *, const dg_spec *, const dg__op_call *, size_t *);
typedef dg_status (*check_fn)(const dg_spec *, const dg__op_call *, char *, size_t);

static const run_fn runs[DG_OP__COUNT] = {
#define DG__RUN(e, name) [e] = dg__run_##name,
	DG_OP_LIST(DG__RUN)
#undef DG__RUN
};

static const ws_fn workspaces[DG_OP__COUNT] = {
#define DG__WS(e, name) [e] = dg__workspace_##name,
	DG_OP_LIST(DG__WS)
#undef DG__WS
};

static const check_fn checks[DG_OP__COUNT] = {
#define DG__CHECK(e, name) [e] = dg__check_##name,
	DG__OP_OWN_CHECKS(DG__CHECK)
#undef DG__CHECK
};

dg_status dg__op_run(dg_device *dev, const dg_spec *spec, const dg__op_call *c)
{
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_run: no such op");
	return runs[spec->op](dev, spec, c);
}

dg_status dg__op_workspace(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
			   size_t *bytes)
{
	*bytes = 0;
	if (!spec || (unsigned)spec->op >= DG_OP__COUNT)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC, "dg__op_workspace: no such op");
	return workspaces[spec->op](dev, spec, c, bytes);
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
