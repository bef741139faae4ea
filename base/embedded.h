/*
 * Files the library carries inside itself, generated at build time by
 * cmake/embed_files.cmake: the templates (codegen) and the tuning records
 * of the devices dragon was tuned on (runtime/tunedb).
 */
#ifndef DG_BASE_EMBEDDED_H
#define DG_BASE_EMBEDDED_H

#include <stddef.h>

typedef struct dg__embedded_file {
	const char *name;           /* file name, "dragon.lua" */
	const unsigned char *bytes; /* NUL-terminated */
	size_t size;                /* without the NUL */
} dg__embedded_file;

/* the templates (templates/, every .lua) */
extern const dg__embedded_file dg__templates[];
extern const size_t dg__templates_count;

/* the shipped tuning records (runtime/tunedb/records/, every .json) */
extern const dg__embedded_file dg__tune_records[];
extern const size_t dg__tune_records_count;

#endif
