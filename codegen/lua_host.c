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
	const dg__template_file *files;
	size_t n_files;
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

static const dg__template_file *find_file(dg__lua *lh, const char *name)
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
	const dg__template_file *f = find_file(lh, file);
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
	/* Load the entry module now, so a broken template fails at create. */
	lua_getglobal(L, "require");
	lua_pushstring(L, "dragon");
	lua_call(L, 1, 1);
	if (!lua_istable(L, -1))
		return luaL_error(L, "templates/dragon.lua must return a table");
	lua_getfield(L, -1, "render");
	if (!lua_isfunction(L, -1))
		return luaL_error(L,
				  "templates/dragon.lua must return a table with a render function");
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

dg_status dg__lua_create(dg__lua **out, const dg__template_file *files,
			 size_t n_files, size_t mem_limit, long instr_limit,
			 char *err, size_t err_size)
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
	lh->L = lua_newstate(sandbox_alloc, lh);
	if (!lh->L) {
		free(lh);
		snprintf(err, err_size, "out of memory creating the Lua state");
		return DG_ERR_NOMEM;
	}
	lua_pushcfunction(lh->L, open_sandbox);
	dg_status st = pcall_checked(lh, 0, 0, err, err_size);
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

/* Field `key` of the table at idx as an integer in lo..hi; 0 when absent.
 * Raises a Lua error naming the entry otherwise. */
static int launch_int(lua_State *L, int idx, const char *entry,
		      const char *key, lua_Integer lo, lua_Integer hi)
{
	int isnum = 0;
	lua_Integer v = 0;

	lua_getfield(L, idx, key);
	if (!lua_isnil(L, -1)) {
		v = lua_tointegerx(L, -1, &isnum);
		if (!isnum || v < lo || v > hi)
			return luaL_error(L,
					  "render's launch info: %s.%s=%s: must be an integer in %I..%I",
					  entry, key, luaL_tolstring(L, -1, NULL),
					  lo, hi);
	}
	lua_pop(L, 1);
	return (int)v;
}

/* The optional 4th value of render: entry name → { threads = N, smem = B }.
 * Every key must be one of the entries (a typo must not be dropped). */
static void check_launch(lua_State *L, int i_entries, int i_launch)
{
	if (!lua_istable(L, i_launch)) {
		luaL_error(L, "render's 4th value (launch info) must be a table entry → { threads = N, smem = BYTES }, got %s",
			   luaL_typename(L, i_launch));
		return;
	}
	lua_Integer n = luaL_len(L, i_entries);
	lua_pushnil(L);
	while (lua_next(L, i_launch)) {
		if (lua_type(L, -2) != LUA_TSTRING) {
			luaL_error(L, "render's launch info: keys must be entry names, got a %s",
				   luaL_typename(L, -2));
			return;
		}
		const char *key = lua_tostring(L, -2);
		bool found = false;
		for (lua_Integer i = 1; i <= n && !found; i++) {
			lua_geti(L, i_entries, i);
			found = strcmp(lua_tostring(L, -1), key) == 0;
			lua_pop(L, 1);
		}
		if (!found) {
			luaL_error(L, "render's launch info: '%s' is not one of the entries", key);
			return;
		}
		if (!lua_istable(L, -1)) {
			luaL_error(L, "render's launch info: %s must be a table { threads = N, smem = BYTES }",
				   key);
			return;
		}
		int v = lua_gettop(L);
		launch_int(L, v, key, "threads", 1, 1024);
		launch_int(L, v, key, "smem", 0, (lua_Integer)1 << 30);
		lua_pop(L, 1);
	}
}

/* Runs inside lua_pcall: builds the spec table and calls render.
 * Upvalue-free: the arguments are a light userdata (spec) and the
 * canonical string. */
static int call_render(lua_State *L)
{
	const dg_spec *s = lua_touserdata(L, 1);
	const char *canonical = lua_tostring(L, 2);

	lua_getglobal(L, "require");
	lua_pushstring(L, "dragon");
	lua_call(L, 1, 1);
	lua_getfield(L, -1, "render");
	lua_newtable(L);
	set_str(L, "op", dg_op_name(s->op));
	set_int(L, "heads", s->heads);
	set_int(L, "in_heads", s->in_heads);
	set_int(L, "embd", s->embd);
	set_int(L, "latent", s->latent);
	set_str(L, "weight", dg_fmt_name(s->weight));
	set_str(L, "act", dg_fmt_name(s->act));
	set_str(L, "out", dg_fmt_name(s->out));
	set_str(L, "src", dg_fmt_name(s->src));
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
	set_str(L, "canonical", canonical);
	set_str(L, "generator_version", DG_GENERATOR_VERSION);
	lua_call(L, 1, 4);
	int top = lua_gettop(L);
	int i_src = top - 3, i_entries = top - 2, i_name = top - 1, i_launch = top;
	if (!lua_isstring(L, i_src) || lua_type(L, i_src) != LUA_TSTRING)
		return luaL_error(L, "render must return the source as a string");
	if (!lua_istable(L, i_entries))
		return luaL_error(L, "render must return the entry names as a table");
	if (lua_type(L, i_name) != LUA_TSTRING)
		return luaL_error(L, "render must return the program name as a string");
	lua_Integer n = luaL_len(L, i_entries);
	if (n < 1 || n > 64)
		return luaL_error(L, "render returned %d entry names; 1 to 64 expected",
				  (int)n);
	for (lua_Integer i = 1; i <= n; i++) {
		if (lua_geti(L, i_entries, i) != LUA_TSTRING)
			return luaL_error(L, "entry name %d is not a string", (int)i);
		lua_pop(L, 1);
	}
	if (!lua_isnil(L, i_launch))
		check_launch(L, i_entries, i_launch);
	return 4;
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

dg_status dg__lua_render(dg__lua *lh, const dg_spec *spec,
			 const char *canonical, dg_source *src, char *err,
			 size_t err_size)
{
	lua_State *L = lh->L;
	int top = lua_gettop(L);
	size_t len, nlen;

	lua_pushcfunction(L, call_render);
	lua_pushlightuserdata(L, (void *)spec);
	lua_pushstring(L, canonical);
	dg_status st = pcall_checked(lh, 2, 4, err, err_size);
	if (st) {
		lua_settop(L, top);
		return st;
	}
	/* Copy everything out before popping: Lua owns those strings. The
	 * results are source, entries, name, launch (nil or checked table). */
	const int i_src = top + 1, i_entries = top + 2, i_name = top + 3,
		  i_launch = top + 4;
	const char *text = lua_tolstring(L, i_src, &len);
	const char *name = lua_tolstring(L, i_name, &nlen);
	int n = (int)luaL_len(L, i_entries);
	src->text = dup_str(text, len);
	src->len = len;
	src->name = dup_str(name, nlen);
	src->entries = calloc((size_t)n, sizeof(char *));
	src->block_threads = calloc((size_t)n, sizeof(int));
	src->dyn_smem = calloc((size_t)n, sizeof(int));
	src->n_entries = n;
	st = src->text && src->name && src->entries && src->block_threads &&
			     src->dyn_smem
		     ? DG_OK
		     : DG_ERR_NOMEM;
	for (int i = 0; st == DG_OK && i < n; i++) {
		size_t el;
		lua_geti(L, i_entries, i + 1);
		const char *e = lua_tolstring(L, -1, &el);
		src->entries[i] = dup_str(e, el);
		lua_pop(L, 1);
		if (!src->entries[i]) {
			st = DG_ERR_NOMEM;
			break;
		}
		/* Already checked by check_launch: integers in range. */
		if (lua_istable(L, i_launch) &&
		    lua_getfield(L, i_launch, src->entries[i]) == LUA_TTABLE) {
			lua_getfield(L, -1, "threads");
			src->block_threads[i] = (int)lua_tointeger(L, -1);
			lua_getfield(L, -2, "smem");
			src->dyn_smem[i] = (int)lua_tointeger(L, -1);
			lua_pop(L, 2);
		}
		if (lua_istable(L, i_launch))
			lua_pop(L, 1);
	}
	lua_settop(L, top);
	lua_gc(L, LUA_GCCOLLECT);
	if (st)
		snprintf(err, err_size, "out of memory copying the rendered source");
	return st;
}
