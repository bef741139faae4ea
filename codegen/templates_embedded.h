/*
 * The templates compiled into the library (generated at build time by
 * cmake/embed_templates.cmake into templates_embedded.c).
 */
#ifndef DG_CODEGEN_TEMPLATES_EMBEDDED_H
#define DG_CODEGEN_TEMPLATES_EMBEDDED_H

#include <stddef.h>

typedef struct dg__template_file {
	const char *name;           /* file name under templates/, "dragon.lua" */
	const unsigned char *bytes; /* NUL-terminated */
	size_t size;                /* without the NUL */
} dg__template_file;

extern const dg__template_file dg__templates[];
extern const size_t dg__n_templates;

#endif
