/*
 * The message helper of base/msg.h. A file of its own so the programs
 * (cli/common/) can take it, and base/publish.c which needs it, into
 * their own binaries: libdragon exports neither.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/msg.h"

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
