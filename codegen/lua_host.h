/*
 * The embedded Lua host: one sandboxed lua_State that loads the templates
 * and renders a spec. Private to codegen/.
 */
#ifndef DG_CODEGEN_LUA_HOST_H
#define DG_CODEGEN_LUA_HOST_H

#include <stddef.h>

#include "base/embedded.h"
#include "dragon/codegen.h"

typedef struct dg__lua dg__lua;

/*
 * files: the template set (name + text), borrowed for the host's lifetime.
 * modules: the op modules to load now (n_modules names, the op table's),
 * so a template that does not compile fails here. mem_limit: bytes the
 * state may hold; instr_limit: VM instructions a call may run. On failure
 * *out is NULL and err holds the reason.
 */
dg_status dg__lua_create(dg__lua **out, const dg__embedded_file *files,
			 size_t n_files, const char *const *modules, size_t n_modules,
			 size_t mem_limit, long instr_limit, char *err, size_t err_size);
void dg__lua_destroy(dg__lua *lh);

/*
 * Calls require("dragon").plan(spec) with the spec as a table (module: the
 * op's template module) and fills plan's tile, path, program and entries
 * (plan->spec is spec with the tile the template resolved; canonical and
 * spec are the caller's to finish). A refusal of the template is
 * DG_ERR_INVALID_SPEC with its message; a template failure DG_ERR_TEMPLATE,
 * reading "templates/<file>.lua:<line>: <message>" then a traceback.
 */
dg_status dg__lua_plan(dg__lua *lh, const dg_spec *spec, const char *module,
		       dg_plan *plan, char *err, size_t err_size);

/*
 * Calls require("dragon").render(spec) (the tile resolved, canonical text
 * given) and copies the source into *text (malloc'd, *len bytes). Errors as
 * dg__lua_plan's.
 */
dg_status dg__lua_render(dg__lua *lh, const dg_spec *spec, const char *module,
			 const char *canonical, char **text, size_t *len, char *err,
			 size_t err_size);

#endif
