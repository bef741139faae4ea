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

#include "export.h"
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

/* ---- plans ----------------------------------------------------------------
 * The template of an op owns its kernel's rules: which path a tile takes
 * (warpgroup or warp tensor cores, SIMT), what it needs (threads, shared
 * memory) and the default tile. A plan is its answer for one spec. */

#define DG_PLAN_MAX_ENTRIES 8

typedef struct dg_plan_entry {
	char name[64]; /* extern "C" kernel name */
	int threads;   /* a block */
	int smem;      /* dynamic shared memory a launch passes, bytes */
} dg_plan_entry;

typedef struct dg_plan {
	dg_spec spec;           /* what renders: normalized, the tile resolved */
	char canonical[DG_SPEC_TEXT_MAX]; /* spec's canonical text */
	char path[32];          /* "wgmma", "mma.sync", "mma.sync bf16", "dp4a",
				 * "fp32", "simt", "element-wise" */
	bool needs_arch_specific; /* the path uses sm_XXa features */
	char program[64];       /* NVRTC program name, "lowrank_fwd.cu" */
	int n_entries;
	dg_plan_entry entries[DG_PLAN_MAX_ENTRIES];
} dg_plan;

/*
 * Validates spec (dg_spec_validate) and asks its template for the plan: an
 * auto tile becomes the template's default. DG_ERR_INVALID_SPEC with the
 * template's one line ("tile=48x64x64/2x2/2: BM and BN must be powers of
 * two from 16 to 256") when the tile cannot run; DG_ERR_TEMPLATE when a
 * template fails. Answers are cached on cg by canonical spec, so asking
 * again costs a hash lookup. The message is on cg.
 */
DG_API dg_status dg_codegen_plan(dg_codegen *cg, const dg_spec *spec, dg_plan *out);

/*
 * The plan of spec on a device of SM device_sm when no tuning record names
 * its tile: an auto tile of a spec whose arch is the device's (sm_90 and
 * later) moves to the arch-specific target when the template's default
 * there takes an arch-specific path (wgmma on sm_90a); otherwise
 * dg_codegen_plan. device_sm 0: the spec's own arch.
 */
DG_API dg_status dg_codegen_plan_for(dg_codegen *cg, const dg_spec *spec, int device_sm,
				     dg_plan *out);

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
DG_API dg_status dg_codegen_create(dg_codegen **out, const dg_codegen_opts *opts);
DG_API void dg_codegen_destroy(dg_codegen *cg);

/* Message of the last failure on cg ("" if none); valid until the next
 * call on cg. Template errors read "templates/<file>.lua:<line>: <msg>". */
DG_API const char *dg_codegen_errmsg(const dg_codegen *cg);

/* Hex SHA-256 over every template file (name and bytes, sorted by name):
 * part of every cache key, so editing a template invalidates what it
 * generated, and the same as the embedded set's for a folder holding the
 * same files, whatever order the folder lists them in. */
DG_API const char *dg_codegen_template_hash(const dg_codegen *cg);

/* Where templates come from: "embedded" or the folder path. */
DG_API const char *dg_codegen_template_origin(const dg_codegen *cg);

/* Plans spec (dg_codegen_plan: an auto tile gets its default) and renders
 * the planned kernel; the source's launch info is the plan's. */
DG_API dg_status dg_codegen_render(dg_codegen *cg, const dg_spec *spec,
				   dg_source **out);
DG_API void dg_source_destroy(dg_source *src);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_CODEGEN_H */
