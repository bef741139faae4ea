/*
 * Files the library carries inside itself, generated at build time by
 * cmake/embed_files.cmake: the templates (codegen) and the tuning records
 * of the devices dragon was tuned on (runtime/tunedb).
 */
#ifndef DG_BASE_EMBEDDED_H
#define DG_BASE_EMBEDDED_H

#include <stddef.h>

#include "dragon/status.h"

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

/*
 * The hex SHA-256 of a set of files (65 bytes into hex), whatever order
 * files[] holds them in: they are hashed sorted by name (then by bytes),
 * each as the 8-byte little-endian length of its name, the name, the
 * 8-byte length of its bytes and the bytes, after the 8-byte count of
 * files. So the embedded templates and a folder holding the same files
 * hash alike, and no two different sets share their input to SHA-256.
 * DG_ERR_NOMEM if the sort's index cannot be allocated (hex untouched).
 */
dg_status dg__embedded_hash(const dg__embedded_file *files, size_t n, char hex[65]);

#endif
