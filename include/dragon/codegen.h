/*
 * dragon — code generation: spec → CUDA source through Lua templates.
 *
 * A dg_codegen owns one sandboxed Lua state (never global, never shared
 * between threads). Templates are embedded in the library at build time;
 * opts->template_dir (or $DRAGON_TEMPLATE_DIR) loads them from a folder
 * instead, for template development.
 */
#ifndef DRAGON_CODEGEN_H
#define DRAGON_CODEGEN_H

#include <stddef.h>

#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever generated code changes for reasons outside templates/. */
#define DG_GENERATOR_VERSION "0.1.0"

typedef struct dg_codegen dg_codegen;

typedef struct dg_codegen_opts {
	const char *template_dir; /* NULL: $DRAGON_TEMPLATE_DIR, else embedded */
	size_t mem_limit;         /* bytes the Lua state may hold; 0: 64 MiB */
	long instr_limit;         /* VM instructions per render; 0: 50 million */
} dg_codegen_opts;

/* Rendered kernel source. Owned by the caller: dg_source_destroy. */
typedef struct dg_source {
	char *text;          /* CUDA C++ source, NUL-terminated */
	size_t len;          /* strlen(text) */
	char *name;          /* program name for NVRTC, e.g. "lowrank_fwd.cu" */
	char **entries;      /* extern "C" kernel names, n_entries of them */
	int n_entries;
	/* Launch info the template gives per entry (parallel to entries; 0
	 * where it says nothing): threads a block, and the dynamic shared
	 * memory in bytes the launch must pass. */
	int *block_threads;
	int *dyn_smem;
	char canonical[DG_SPEC_TEXT_MAX]; /* canonical spec, tile resolved */
} dg_source;

/* opts may be NULL. Like sqlite3_open, a failure other than DG_ERR_NOMEM
 * still sets *out to a handle whose errmsg says why (a template folder that
 * does not exist: DG_ERR_IO; a template that does not load:
 * DG_ERR_TEMPLATE); every later call on it fails the same way. Destroy it
 * in either case. */
dg_status dg_codegen_create(dg_codegen **out, const dg_codegen_opts *opts);
void dg_codegen_destroy(dg_codegen *cg);

/* Message of the last failure on cg ("" if none); valid until the next
 * call on cg. Template errors read "templates/<file>.lua:<line>: <msg>". */
const char *dg_codegen_errmsg(const dg_codegen *cg);

/* Hex SHA-256 over every template file (name and bytes): part of every
 * cache key, so editing a template invalidates what it generated. */
const char *dg_codegen_template_hash(const dg_codegen *cg);

/* Where templates come from: "embedded" or the folder path. */
const char *dg_codegen_template_origin(const dg_codegen *cg);

/* Validates spec, fills an auto tile with its default, renders. */
dg_status dg_codegen_render(dg_codegen *cg, const dg_spec *spec,
			    dg_source **out);
void dg_source_destroy(dg_source *src);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_CODEGEN_H */
