/*
 * The embedded Lua host.
 *
 * Templates are code, so they run in a sandbox: a private allocator with a
 * memory cap, only the base/string/table/math/utf8 libraries (no io, os,
 * package, debug; no load/dofile/loadfile/string.dump/print), text chunks
 * only, named "@templates/<file>.lua" so errors read "templates/x.lua:42:",
 * an instruction-count hook against runaway loops, and every call under
 * lua_pcall with a traceback handler, so a template can never abort the
 * process. Modules are reached through our own require(), which loads only
 * from the template set handed in.
 */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "codegen/lua_host.h"

#define HOOK_EVERY 1000 /* instructions between budget checks */

struct dg__lua {
	lua_State *L;
	size_t mem_used, mem_limit;
	long instr_limit, instr_used;
	const dg__embedded_file *files;
	size_t n_files;
	const char *const *modules; /* loaded at create (borrowed until then) */
	size_t n_modules;
};

/* lua_Alloc with a cap. When ptr is NULL, osize is a type tag, not a size. */
static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
	dg__lua *lh = ud;
	size_t old = ptr ? osize : 0;

	if (nsize == 0) {
		free(ptr);
		lh->mem_used -= old;
		return NULL;
	}
	if (nsize > old && lh->mem_used + (nsize - old) > lh->mem_limit)
		return NULL;
	void *p = realloc(ptr, nsize);
	if (!p)
		return NULL;
	lh->mem_used = lh->mem_used - old + nsize;
	return p;
}

static dg__lua *host_of(lua_State *L)
{
	void *ud;
	lua_getallocf(L, &ud);
	return ud;
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
	(void)ar;
	dg__lua *lh = host_of(L);
	lh->instr_used += HOOK_EVERY;
	if (lh->instr_used > lh->instr_limit)
		luaL_error(L,
			   "instruction budget of %I exceeded (a runaway loop in a template?)",
			   (lua_Integer)lh->instr_limit);
}

static int traceback(lua_State *L)
{
	const char *msg = lua_tostring(L, 1);
	if (!msg)
		msg = luaL_tolstring(L, 1, NULL);
	luaL_traceback(L, L, msg, 1);
	return 1;
}

static const dg__embedded_file *find_file(dg__lua *lh, const char *name)
{
	for (size_t i = 0; i < lh->n_files; i++)
		if (strcmp(lh->files[i].name, name) == 0)
			return &lh->files[i];
	return NULL;
}

/* require(name): templates/<name>.lua from the template set, run once. */
static int sandbox_require(lua_State *L)
{
	dg__lua *lh = host_of(L);
	const char *name = luaL_checkstring(L, 1);
	char file[128], chunk[160];

	for (const char *p = name; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
		      *p == '_'))
			return luaL_error(L,
					  "require '%s': module names are [a-z0-9_]+",
					  name);
	lua_getfield(L, LUA_REGISTRYINDEX, "dg_loaded");
	lua_getfield(L, -1, name);
	if (!lua_isnil(L, -1))
		return 1;
	lua_pop(L, 1);
	snprintf(file, sizeof(file), "%s.lua", name);
	const dg__embedded_file *f = find_file(lh, file);
	if (!f)
		return luaL_error(L, "require '%s': no templates/%s", name,
				  file);
	snprintf(chunk, sizeof(chunk), "@templates/%s", file);
	if (luaL_loadbufferx(L, (const char *)f->bytes, f->size, chunk, "t"))
		return lua_error(L);
	lua_pushstring(L, name);
	lua_call(L, 1, 1);
	if (lua_isnil(L, -1)) {
		lua_pop(L, 1);
		lua_pushboolean(L, 1);
	}
	lua_pushvalue(L, -1);
	lua_setfield(L, -3, name);
	return 1;
}

/* Runs inside lua_pcall: opens the allowed libraries and trims them. */
static int open_sandbox(lua_State *L)
{
	static const luaL_Reg libs[] = {
		{ LUA_GNAME, luaopen_base },     { LUA_STRLIBNAME, luaopen_string },
		{ LUA_TABLIBNAME, luaopen_table }, { LUA_MATHLIBNAME, luaopen_math },
		{ LUA_UTF8LIBNAME, luaopen_utf8 },
	};
	static const char *const drop[] = { "dofile", "loadfile", "load",
					    "print", "require", "collectgarbage" };

	for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
		luaL_requiref(L, libs[i].name, libs[i].func, 1);
		lua_pop(L, 1);
	}
	for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) {
		lua_pushnil(L);
		lua_setglobal(L, drop[i]);
	}
	lua_getglobal(L, "string");
	lua_pushnil(L);
	lua_setfield(L, -2, "dump");
	lua_pop(L, 1);
	lua_newtable(L);
	lua_setfield(L, LUA_REGISTRYINDEX, "dg_loaded");
	lua_pushcfunction(L, sandbox_require);
	lua_setglobal(L, "require");
	/* Load the entry module and every op module now, so a broken
	 * template fails at create. */
	lua_getglobal(L, "require");
	lua_pushstring(L, "dragon");
	lua_call(L, 1, 1);
	if (!lua_istable(L, -1))
		return luaL_error(L, "templates/dragon.lua must return a table");
	lua_getfield(L, -1, "plan");
	lua_getfield(L, -2, "render");
	if (!lua_isfunction(L, -1) || !lua_isfunction(L, -2))
		return luaL_error(L,
				  "templates/dragon.lua must return a table with plan and render functions");
	lua_settop(L, 0);
	dg__lua *lh = host_of(L);
	for (size_t i = 0; i < lh->n_modules; i++) {
		lua_getglobal(L, "require");
		lua_pushstring(L, lh->modules[i]);
		lua_call(L, 1, 1);
		if (!lua_istable(L, -1))
			return luaL_error(L, "templates/%s.lua must return a table (a module)",
					  lh->modules[i]);
		lua_pop(L, 1);
	}
	return 0;
}

/* Copies the error at the top of the stack into err and pops it. */
static void take_error(lua_State *L, char *err, size_t size)
{
	const char *m = lua_tostring(L, -1);
	snprintf(err, size, "%s", m ? m : "(error object is not a string)");
	lua_pop(L, 1);
}

static dg_status pcall_checked(dg__lua *lh, int nargs, int nres, char *err,
			       size_t size)
{
	lua_State *L = lh->L;
	int base = lua_gettop(L) - nargs;

	lua_pushcfunction(L, traceback);
	lua_insert(L, base);
	lh->instr_used = 0;
	lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
	int rc = lua_pcall(L, nargs, nres, base);
	lua_sethook(L, NULL, 0, 0);
	lua_remove(L, base);
	if (rc == LUA_OK)
		return DG_OK;
	if (rc == LUA_ERRMEM) {
		/* Lua calls no message handler for memory errors. */
		lua_pop(L, 1);
		lua_gc(L, LUA_GCCOLLECT);
		snprintf(err, size,
			 "templates: rendering needed more than the %zu-byte memory cap of the template sandbox",
			 lh->mem_limit);
		return DG_ERR_NOMEM;
	}
	take_error(L, err, size);
	return DG_ERR_TEMPLATE;
}

dg_status dg__lua_create(dg__lua **out, const dg__embedded_file *files,
			 size_t n_files, const char *const *modules, size_t n_modules,
			 size_t mem_limit, long instr_limit, char *err, size_t err_size)
{
	dg__lua *lh;

	*out = NULL;
	lh = calloc(1, sizeof(*lh));
	if (!lh) {
		snprintf(err, err_size, "out of memory creating the Lua state");
		return DG_ERR_NOMEM;
	}
	lh->mem_limit = mem_limit;
	lh->instr_limit = instr_limit;
	lh->files = files;
	lh->n_files = n_files;
	lh->modules = modules;
	lh->n_modules = n_modules;
	lh->L = lua_newstate(sandbox_alloc, lh);
	if (!lh->L) {
		free(lh);
		snprintf(err, err_size, "out of memory creating the Lua state");
		return DG_ERR_NOMEM;
	}
	lua_pushcfunction(lh->L, open_sandbox);
	dg_status st = pcall_checked(lh, 0, 0, err, err_size);
	lh->modules = NULL;
	lh->n_modules = 0;
	if (st) {
		dg__lua_destroy(lh);
		return st;
	}
	*out = lh;
	return DG_OK;
}

void dg__lua_destroy(dg__lua *lh)
{
	if (!lh)
		return;
	if (lh->L)
		lua_close(lh->L);
	free(lh);
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
	lua_pushinteger(L, v);
	lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
	lua_pushstring(L, v);
	lua_setfield(L, -2, k);
}

/* The spec as a table on the top of the stack. */
static void push_spec(lua_State *L, const dg_spec *s, const char *module,
		      const char *canonical)
{
	lua_newtable(L);
	set_str(L, "op", dg_op_name(s->op));
	set_str(L, "module", module);
	set_int(L, "heads", s->heads);
	set_int(L, "in_heads", s->in_heads);
	set_int(L, "embd", s->embd);
	set_int(L, "latent", s->latent);
	set_int(L, "vocab", s->vocab);
	set_int(L, "chunk", s->chunk);
	set_str(L, "weight", dg_fmt_name(s->weight));
	set_str(L, "act", dg_fmt_name(s->act));
	set_str(L, "out", dg_fmt_name(s->out));
	set_str(L, "src", dg_fmt_name(s->src));
	set_str(L, "ascale", dg_scale_name(s->ascale));
	set_str(L, "wscale", dg_scale_name(s->wscale));
	set_str(L, "rope", s->rope_pre ? "pre" : "load");
	set_str(L, "epi", dg_epi_name(s->epi));
	if (s->relu)
		lua_pushnumber(L, (lua_Number)s->relu_thr);
	else
		lua_pushboolean(L, 0);
	lua_setfield(L, -2, "relu");
	lua_newtable(L);
	set_int(L, "bm", s->tile.bm);
	set_int(L, "bn", s->tile.bn);
	set_int(L, "bk", s->tile.bk);
	set_int(L, "wm", s->tile.wm);
	set_int(L, "wn", s->tile.wn);
	set_int(L, "stages", s->tile.stages);
	set_int(L, "threads", s->tile.threads);
	lua_setfield(L, -2, "tile");
	set_int(L, "arch", s->arch);
	lua_pushboolean(L, s->arch_specific);
	lua_setfield(L, -2, "arch_specific");
	if (canonical)
		set_str(L, "canonical", canonical);
	set_str(L, "generator_version", DG_GENERATOR_VERSION);
}

/* Integer field `key` of the table at idx (dragon.lua checked its type). */
static int get_int(lua_State *L, int idx, const char *key)
{
	lua_getfield(L, idx, key);
	lua_Integer v = lua_tointeger(L, -1);
	lua_pop(L, 1);
	return v > INT_MAX ? INT_MAX : (int)v;
}

/* Copies string field `key` of the table at idx into buf; false if it is
 * not a string or does not fit. */
static bool get_str(lua_State *L, int idx, const char *key, char *buf, size_t size)
{
	size_t n = 0;
	lua_getfield(L, idx, key);
	const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &n) : NULL;
	bool ok = v && n < size;
	if (ok)
		memcpy(buf, v, n + 1);
	lua_pop(L, 1);
	return ok;
}

/* Runs inside lua_pcall: (spec, module) → dragon.plan's one or two values,
 * read into the plan (a light userdata). Returns a refusal's message, or
 * nothing. */
static int call_plan(lua_State *L)
{
	const dg_spec *s = lua_touserdata(L, 1);
	const char *module = lua_tostring(L, 2);
	dg_plan *p = lua_touserdata(L, 3);

	lua_getglobal(L, "require");
	lua_pushstring(L, "dragon");
	lua_call(L, 1, 1);
	lua_getfield(L, -1, "plan");
	push_spec(L, s, module, NULL);
	lua_call(L, 1, 2);
	if (lua_isnil(L, -2)) {
		if (lua_type(L, -1) != LUA_TSTRING) /* a refusal must say why */
			return luaL_error(L, "templates/%s.lua: plan returned nil without a message",
					  module);
		return 1; /* the message */
	}
	int t = lua_gettop(L) - 1;
	if (!lua_istable(L, t))
		return luaL_error(L, "templates/%s.lua: plan must return a table, or nil and a message",
				  module);
	lua_getfield(L, t, "tile");
	int ti = lua_gettop(L);
	p->spec.tile.bm = get_int(L, ti, "bm");
	p->spec.tile.bn = get_int(L, ti, "bn");
	p->spec.tile.bk = get_int(L, ti, "bk");
	p->spec.tile.wm = get_int(L, ti, "wm");
	p->spec.tile.wn = get_int(L, ti, "wn");
	p->spec.tile.stages = get_int(L, ti, "stages");
	p->spec.tile.threads = get_int(L, ti, "threads");
	lua_pop(L, 1);
	lua_getfield(L, t, "arch_specific");
	p->needs_arch_specific = lua_toboolean(L, -1);
	lua_pop(L, 1);
	if (!get_str(L, t, "path", p->path, sizeof(p->path)) ||
	    !get_str(L, t, "name", p->program, sizeof(p->program)))
		return luaL_error(L, "templates/%s.lua: plan's path and name must be short strings",
				  module);
	lua_getfield(L, t, "entries");
	int ei = lua_gettop(L);
	lua_Integer n = luaL_len(L, ei);
	if (n < 1 || n > DG_PLAN_MAX_ENTRIES)
		return luaL_error(L, "templates/%s.lua: plan has %d entries; 1 to %d expected",
				  module, (int)n, DG_PLAN_MAX_ENTRIES);
	p->n_entries = (int)n;
	for (lua_Integer i = 1; i <= n; i++) {
		dg_plan_entry *e = &p->entries[i - 1];
		lua_geti(L, ei, i);
		int ii = lua_gettop(L);
		if (!get_str(L, ii, "name", e->name, sizeof(e->name)))
			return luaL_error(L, "templates/%s.lua: plan entry %d: name must be a string of at most %d bytes",
					  module, (int)i, (int)sizeof(e->name) - 1);
		e->threads = get_int(L, ii, "threads");
		e->smem = get_int(L, ii, "smem");
		lua_pop(L, 1);
	}
	return 0;
}

dg_status dg__lua_plan(dg__lua *lh, const dg_spec *spec, const char *module,
		       dg_plan *plan, char *err, size_t err_size)
{
	lua_State *L = lh->L;
	int top = lua_gettop(L);

	lua_pushcfunction(L, call_plan);
	lua_pushlightuserdata(L, (void *)spec);
	lua_pushstring(L, module);
	lua_pushlightuserdata(L, plan);
	dg_status st = pcall_checked(lh, 3, 1, err, err_size);
	if (st == DG_OK && lua_type(L, -1) == LUA_TSTRING) {
		/* the template refused the spec: a usage error */
		snprintf(err, err_size, "%s", lua_tostring(L, -1));
		st = DG_ERR_INVALID_SPEC;
	}
	lua_settop(L, top);
	return st;
}

/* Runs inside lua_pcall: (spec, module, canonical) → the source. */
static int call_render(lua_State *L)
{
	const dg_spec *s = lua_touserdata(L, 1);
	const char *module = lua_tostring(L, 2);
	const char *canonical = lua_tostring(L, 3);

	lua_getglobal(L, "require");
	lua_pushstring(L, "dragon");
	lua_call(L, 1, 1);
	lua_getfield(L, -1, "render");
	push_spec(L, s, module, canonical);
	lua_call(L, 1, 1);
	if (lua_type(L, -1) != LUA_TSTRING)
		return luaL_error(L, "render must return the source as a string");
	return 1;
}

static char *dup_str(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, s, n);
		d[n] = '\0';
	}
	return d;
}

dg_status dg__lua_render(dg__lua *lh, const dg_spec *spec, const char *module,
			 const char *canonical, char **text, size_t *len, char *err,
			 size_t err_size)
{
	lua_State *L = lh->L;
	int top = lua_gettop(L);

	*text = NULL;
	*len = 0;
	lua_pushcfunction(L, call_render);
	lua_pushlightuserdata(L, (void *)spec);
	lua_pushstring(L, module);
	lua_pushstring(L, canonical);
	dg_status st = pcall_checked(lh, 3, 1, err, err_size);
	if (st == DG_OK) {
		/* copy before popping: Lua owns the string */
		size_t n;
		const char *src = lua_tolstring(L, -1, &n);
		*text = dup_str(src, n);
		*len = n;
		if (!*text) {
			snprintf(err, err_size, "out of memory copying the rendered source");
			st = DG_ERR_NOMEM;
		}
	}
	lua_settop(L, top);
	lua_gc(L, LUA_GCCOLLECT);
	return st;
}
