/*
 * Status strings, from the one X-macro list in dragon/status.h, and the
 * message helper of codegen/msg.h.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/msg.h"
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

dg_status dg__msgf(dg_status st, char *msg, size_t size, const char *fmt, ...)
{
	if (msg && size) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, size, fmt, ap);
		va_end(ap);
	}
	return st;
}
