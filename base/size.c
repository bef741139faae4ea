/*
 * A byte size as people write one (base/size.h).
 */
#include "base/size.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

dg_status dg__parse_size(const char *text, size_t *bytes)
{
	if (!text || !bytes)
		return DG_ERR_INVALID_ARG;
	char *end = NULL;
	errno = 0;
	const double v = strtod(text, &end);
	if (end == text || errno || !(v > 0))
		return DG_ERR_INVALID_ARG;
	static const char units[] = "KMGT";
	double unit = 1;
	const char *u = end, *at = *u ? strchr(units, *u & ~0x20) : NULL;
	if (at) {
		for (const char *k = units; k <= at; k++)
			unit *= 1024;
		u++;
		if (*u == 'i')
			u++;
	}
	if (*u == 'B' || *u == 'b')
		u++;
	const double b = v * unit;
	if (*u || b < 1 || b >= 18446744073709551615.0)
		return DG_ERR_INVALID_ARG;
	*bytes = (size_t)b;
	return DG_OK;
}
