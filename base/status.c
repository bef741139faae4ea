/*
 * Status strings, from the one X-macro list in dragon/status.h.
 */
#include "dragon/status.h"

static const char *const status_names[] = {
#define DG__STATUS_STR(name, str) str,
	DG_STATUS_LIST(DG__STATUS_STR)
#undef DG__STATUS_STR
};

const char *dg_status_str(dg_status st)
{
	if ((unsigned)st >= (unsigned)DG_STATUS__COUNT)
		return "unknown status";
	return status_names[st];
}
