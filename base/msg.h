/*
 * The one helper for handle-free functions that report into a caller's
 * message buffer: the spec parser, the manifest reader, the cubin check.
 * Private to the library and its programs (base/msg.c is compiled into
 * each: libdragon does not export it).
 */
#ifndef DG_CODEGEN_MSG_H
#define DG_CODEGEN_MSG_H

#include <stddef.h>

#include "dragon/status.h"

/*
 * Formats the message into msg (size bytes, always NUL-terminated, cut to
 * fit) and returns st, so a failure reads `return dg__msgf(DG_ERR_X, msg,
 * size, "...", ...);`. msg may be NULL or size zero: the message is dropped.
 */
dg_status dg__msgf(dg_status st, char *msg, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
