/*
 * The embedded Lua host: one sandboxed lua_State that loads the templates
 * and renders a spec. Private to codegen/.
 */
#ifndef DG_CODEGEN_LUA_HOST_H
#define DG_CODEGEN_LUA_HOST_H

#include <stddef.h>

#include "codegen/templates_embedded.h"
#include "dragon/codegen.h"

typedef struct dg__lua dg__lua;

/*
 * files: the template set (name + text), borrowed for the host's lifetime.
 * mem_limit: bytes the state may hold; instr_limit: VM instructions a
 * render may run. On failure *out is NULL and err holds the reason.
 */
dg_status dg__lua_create(dg__lua **out, const dg__template_file *files,
			 size_t n_files, size_t mem_limit, long instr_limit,
			 char *err, size_t err_size);
void dg__lua_destroy(dg__lua *lh);

/*
 * Calls require("dragon").render(spec) with the spec as a table (tile
 * resolved, canonical text given) and fills src->text, name, entries,
 * and the per-entry launch info (block_threads, dyn_smem) from render's
 * optional 4th value, a table entry → { threads = N, smem = BYTES }.
 * Errors read "templates/<file>.lua:<line>: <message>" then a traceback.
 */
dg_status dg__lua_render(dg__lua *lh, const dg_spec *spec,
			 const char *canonical, dg_source *src, char *err,
			 size_t err_size);

#endif
