/*
 * dragon — status codes.
 *
 * Every action in the library returns a dg_status. DG_OK is zero, so the call
 * site reads `if (st) goto out;`. The human-readable message of the last
 * failure lives on the handle the call was made on (dg_ctx_errmsg,
 * dg_codegen_errmsg, dg_cache_errmsg) or in the caller's message buffer for
 * handle-free functions; dg_status_str gives the code's fixed name.
 */
#ifndef DRAGON_STATUS_H
#define DRAGON_STATUS_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, string): one list gives the enum and its strings. */
#define DG_STATUS_LIST(X)                                                     \
	X(DG_OK, "ok")                                                        \
	X(DG_ERR_INVALID_ARG, "invalid argument")                             \
	X(DG_ERR_INVALID_SPEC, "invalid spec")                                \
	X(DG_ERR_UNSUPPORTED, "unsupported")                                  \
	X(DG_ERR_NOMEM, "out of memory")                                      \
	X(DG_ERR_IO, "i/o error")                                             \
	X(DG_ERR_TEMPLATE, "template error")                                  \
	X(DG_ERR_COMPILE, "compile error")                                    \
	X(DG_ERR_CORRUPT, "corrupt data")                                     \
	X(DG_ERR_NOT_FOUND, "not found")                                      \
	X(DG_ERR_PARSE, "parse error")                                        \
	X(DG_ERR_NO_DEVICE, "no CUDA device")                                 \
	X(DG_ERR_CUDA, "CUDA driver error")                                   \
	X(DG_ERR_INTERNAL, "internal error")                                  \
	X(DG_ERR_NUMERIC, "not a finite number")                              \
	X(DG_ERR_INTERRUPTED, "interrupted")

typedef enum dg_status {
#define DG__STATUS_ENUM(name, str) name,
	DG_STATUS_LIST(DG__STATUS_ENUM)
#undef DG__STATUS_ENUM
	DG_STATUS__COUNT
} dg_status;

/* Fixed name of a status ("invalid spec"); never NULL. */
DG_API const char *dg_status_str(dg_status st);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_STATUS_H */
