/*
 * Code generation: spec → plan → CUDA source.
 *
 * Owns the template set (the embedded copy, or a snapshot of a folder for
 * template development), its hash, the Lua host that plans and renders it,
 * and the cache of plans. The snapshot is read once at create, so the hash
 * always describes exactly the bytes that render.
 *
 * Plans are cached by the canonical text of the spec asked for (an auto
 * tile and its resolution are two keys of one plan), refusals included, so
 * validation, tuning spaces and launches that ask again cost a hash
 * lookup. The cache is cleared when it holds PLAN_CACHE_MAX answers.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lua_host.h"
#include "base/embedded.h"
#include "dragon/codegen.h"
#include "base/fnv.h"

#define DEFAULT_MEM_LIMIT ((size_t)64 << 20)
#define DEFAULT_INSTR_LIMIT 50000000L
#define MAX_TEMPLATE_BYTES ((size_t)4 << 20)
#define PLAN_CACHE_MAX 4096 /* answers; a power of two */

/* One cached answer: a plan, or the template's refusal. */
typedef struct plan_slot {
	uint64_t hash; /* 0: empty */
	char *key;     /* canonical text asked for */
	dg_status st;
	char *msg;     /* st != DG_OK: the refusal */
	dg_plan plan;  /* st == DG_OK */
} plan_slot;

struct dg_codegen {
	dg__lua *lua;
	plan_slot *plans; /* PLAN_CACHE_MAX * 2 slots, open addressing */
	size_t n_plans;
	dg__embedded_file *owned; /* snapshot of a folder, or NULL */
	size_t n_owned;
	const dg__embedded_file *files;
	size_t n_files;
	char origin[1024];
	char hash[65];
	dg_status init_status; /* why create failed, kept for every call */
	char init_err[4096];
	char err[4096];
};

static void free_files(dg__embedded_file *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free((char *)f[i].name);
		free((unsigned char *)f[i].bytes);
	}
	free(f);
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(((const dg__embedded_file *)a)->name,
		      ((const dg__embedded_file *)b)->name);
}

static dg_status read_file(const char *path, unsigned char **out, size_t *size,
			   char *err, size_t esz)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, esz, "%s: %s", path, strerror(errno));
		return DG_ERR_IO;
	}
	unsigned char *buf = NULL;
	size_t n = 0, cap = 0;
	dg_status st = DG_OK;
	for (;;) {
		if (n + 4096 + 1 > cap) {
			cap = cap ? cap * 2 : 16384;
			if (cap > MAX_TEMPLATE_BYTES) {
				snprintf(err, esz, "%s: larger than %zu bytes",
					 path, MAX_TEMPLATE_BYTES);
				st = DG_ERR_IO;
				break;
			}
			unsigned char *nb = realloc(buf, cap);
			if (!nb) {
				st = DG_ERR_NOMEM;
				break;
			}
			buf = nb;
		}
		size_t r = fread(buf + n, 1, 4096, f);
		n += r;
		if (r < 4096) {
			if (ferror(f)) {
				snprintf(err, esz, "%s: read error", path);
				st = DG_ERR_IO;
			}
			break;
		}
	}
	fclose(f);
	if (st) {
		free(buf);
		return st;
	}
	buf[n] = '\0';
	*out = buf;
	*size = n;
	return DG_OK;
}

/* Snapshot of every *.lua in dir, sorted by name. */
static dg_status load_dir(dg_codegen *cg, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		snprintf(cg->err, sizeof(cg->err),
			 "template folder %s: %s (unset DRAGON_TEMPLATE_DIR to use the built-in templates)",
			 dir, strerror(errno));
		return DG_ERR_IO;
	}
	dg_status st = DG_OK;
	size_t cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0 ||
		    e->d_name[0] == '.')
			continue;
		if (cg->n_owned == cap) {
			cap = cap ? cap * 2 : 16;
			dg__embedded_file *nf =
				realloc(cg->owned, cap * sizeof(*nf));
			if (!nf) {
				st = DG_ERR_NOMEM;
				break;
			}
			cg->owned = nf;
		}
		char path[2048];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unsigned char *bytes;
		size_t size;
		st = read_file(path, &bytes, &size, cg->err, sizeof(cg->err));
		if (st)
			break;
		char *name = strdup(e->d_name);
		if (!name) {
			free(bytes);
			st = DG_ERR_NOMEM;
			break;
		}
		cg->owned[cg->n_owned++] =
			(dg__embedded_file){ name, bytes, size };
	}
	closedir(d);
	if (st)
		return st;
	if (cg->n_owned == 0) {
		snprintf(cg->err, sizeof(cg->err),
			 "template folder %s holds no .lua files", dir);
		return DG_ERR_IO;
	}
	qsort(cg->owned, cg->n_owned, sizeof(*cg->owned), cmp_names);
	cg->files = cg->owned;
	cg->n_files = cg->n_owned;
	snprintf(cg->origin, sizeof(cg->origin), "%s", dir);
	return DG_OK;
}

dg_status dg_codegen_create(dg_codegen **out, const dg_codegen_opts *opts)
{
	dg_codegen *cg;
	dg_status st;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	cg = calloc(1, sizeof(*cg));
	if (!cg)
		return DG_ERR_NOMEM;
	const char *dir = opts ? opts->template_dir : NULL;
	if (!dir || !*dir)
		dir = getenv("DRAGON_TEMPLATE_DIR");
	if (dir && *dir) {
		st = load_dir(cg, dir);
		if (st)
			goto fail;
	} else {
		cg->files = dg__templates;
		cg->n_files = dg__templates_count;
		snprintf(cg->origin, sizeof(cg->origin), "embedded");
	}
	/* sorted by name inside, so a folder of the same files hashes alike */
	st = dg__embedded_hash(cg->files, cg->n_files, cg->hash);
	if (st) {
		snprintf(cg->err, sizeof(cg->err), "template hash: out of memory");
		goto fail;
	}
	size_t mem = opts && opts->mem_limit ? opts->mem_limit : DEFAULT_MEM_LIMIT;
	long instr = opts && opts->instr_limit > 0 ? opts->instr_limit
						   : DEFAULT_INSTR_LIMIT;
	/* every template module the op table names, once */
	const char *modules[DG_OP__COUNT];
	size_t n_modules = 0;
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const char *m = dg_op_info_of((dg_op)i)->module;
		bool seen = false;
		for (size_t j = 0; j < n_modules; j++)
			seen |= strcmp(modules[j], m) == 0;
		if (!seen)
			modules[n_modules++] = m;
	}
	st = dg__lua_create(&cg->lua, cg->files, cg->n_files, modules, n_modules, mem, instr,
			    cg->err, sizeof(cg->err));
	if (st)
		goto fail;
	*out = cg;
	return DG_OK;
fail:
	/* Like sqlite3_open: hand the handle out anyway so the caller can read
	 * the message; every later call fails the same way. */
	cg->init_status = st;
	snprintf(cg->init_err, sizeof(cg->init_err), "%s", cg->err);
	*out = cg;
	return st;
}

static void plans_clear(dg_codegen *cg)
{
	for (size_t i = 0; cg->plans && i < 2 * PLAN_CACHE_MAX; i++) {
		free(cg->plans[i].key);
		free(cg->plans[i].msg);
		memset(&cg->plans[i], 0, sizeof(cg->plans[i]));
	}
	cg->n_plans = 0;
}

void dg_codegen_destroy(dg_codegen *cg)
{
	if (!cg)
		return;
	plans_clear(cg);
	free(cg->plans);
	dg__lua_destroy(cg->lua);
	free_files(cg->owned, cg->n_owned);
	free(cg);
}

const char *dg_codegen_errmsg(const dg_codegen *cg)
{
	return cg ? cg->err : "codegen handle is NULL";
}

const char *dg_codegen_template_hash(const dg_codegen *cg)
{
	return cg->hash;
}

const char *dg_codegen_template_origin(const dg_codegen *cg)
{
	return cg->origin;
}

void dg_source_destroy(dg_source *src)
{
	if (!src)
		return;
	free(src->text);
	free(src->name);
	for (int i = 0; src->entries && i < src->n_entries; i++)
		free(src->entries[i]);
	free(src->entries);
	free(src->block_threads);
	free(src->dyn_smem);
	free(src);
}

/* ---- plans ---------------------------------------------------------------- */

static plan_slot *slot_of(dg_codegen *cg, uint64_t h, const char *key)
{
	size_t m = 2 * PLAN_CACHE_MAX - 1;
	for (size_t i = h & m;; i = (i + 1) & m) {
		plan_slot *e = &cg->plans[i];
		if (!e->hash || (e->hash == h && strcmp(e->key, key) == 0))
			return e;
	}
}

/* Keeps the answer for key (best effort: out of memory keeps nothing). */
static void plan_remember(dg_codegen *cg, uint64_t h, const char *key, dg_status st,
			  const dg_plan *plan)
{
	if (!cg->plans) {
		cg->plans = calloc(2 * PLAN_CACHE_MAX, sizeof(*cg->plans));
		if (!cg->plans)
			return;
	}
	if (cg->n_plans >= PLAN_CACHE_MAX)
		plans_clear(cg);
	plan_slot *e = slot_of(cg, h, key);
	if (e->hash)
		return;
	e->key = strdup(key);
	e->msg = st ? strdup(cg->err) : NULL;
	if (!e->key || (st && !e->msg)) {
		free(e->key);
		free(e->msg);
		e->key = e->msg = NULL;
		return;
	}
	e->hash = h;
	e->st = st;
	if (!st)
		e->plan = *plan;
	cg->n_plans++;
}

static dg_status enter(dg_codegen *cg, const dg_spec *spec, const void *out)
{
	if (!cg)
		return DG_ERR_INVALID_ARG;
	if (cg->init_status) {
		snprintf(cg->err, sizeof(cg->err), "%s", cg->init_err);
		return cg->init_status;
	}
	cg->err[0] = '\0';
	if (!spec || !out) {
		snprintf(cg->err, sizeof(cg->err), "%s is NULL", !spec ? "spec" : "out");
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

dg_status dg_codegen_plan(dg_codegen *cg, const dg_spec *spec, dg_plan *out)
{
	char key[DG_SPEC_TEXT_MAX];
	dg_status st = enter(cg, spec, out);

	if (st)
		return st;
	st = dg_spec_validate(spec, cg->err, sizeof(cg->err));
	if (st)
		return st;
	dg_spec s = *spec;
	dg_spec_normalize(&s);
	if (dg_spec_to_string(&s, key, sizeof(key))) {
		snprintf(cg->err, sizeof(cg->err), "spec text does not fit %d bytes", DG_SPEC_TEXT_MAX);
		return DG_ERR_INTERNAL;
	}
	uint64_t h = dg__fnv1a(key) | 1; /* never 0, the empty mark */
	if (cg->plans) {
		plan_slot *e = slot_of(cg, h, key);
		if (e->hash) {
			if (e->st)
				snprintf(cg->err, sizeof(cg->err), "%s", e->msg);
			else
				*out = e->plan;
			return e->st;
		}
	}
	dg_plan p;
	memset(&p, 0, sizeof(p));
	p.spec = s;
	const dg_op_info *row = dg_op_info_of(s.op);
	st = dg__lua_plan(cg->lua, &s, row->module, &p, cg->err, sizeof(cg->err));
	if (st == DG_OK) {
		/* the template's tile is still a tile of the op's kind */
		st = dg_spec_validate(&p.spec, cg->err, sizeof(cg->err));
		if (st == DG_OK && (dg_spec_uses(s.op) & DG_FIELD_TILE) &&
		    dg_tile_is_auto(&p.spec.tile)) {
			snprintf(cg->err, sizeof(cg->err), "templates/%s.lua: plan left the tile auto",
				 row->module);
			st = DG_ERR_TEMPLATE;
		}
		if (st == DG_ERR_INVALID_SPEC)
			st = DG_ERR_TEMPLATE; /* a default the op table refuses: a template bug */
		if (st == DG_OK && p.needs_arch_specific && !p.spec.arch_specific) {
			snprintf(cg->err, sizeof(cg->err),
				 "templates/%s.lua: plan took an arch-specific path for sm_%d", row->module,
				 p.spec.arch);
			st = DG_ERR_TEMPLATE;
		}
		if (st == DG_OK)
			st = dg_spec_to_string(&p.spec, p.canonical, sizeof(p.canonical)) ? DG_ERR_INTERNAL
											 : DG_OK;
	}
	if (st == DG_OK || st == DG_ERR_INVALID_SPEC)
		plan_remember(cg, h, key, st, &p);
	if (st == DG_OK)
		*out = p;
	return st;
}

dg_status dg_codegen_plan_for(dg_codegen *cg, const dg_spec *spec, int device_sm,
			      dg_plan *out)
{
	dg_status st = enter(cg, spec, out);

	if (st)
		return st;
	if (device_sm <= 0)
		device_sm = spec->arch;
	if ((dg_spec_uses(spec->op) & DG_FIELD_TILE) && dg_tile_is_auto(&spec->tile) &&
	    device_sm == spec->arch && spec->arch >= 90 && !spec->arch_specific) {
		dg_spec a = *spec;
		dg_plan p;
		a.arch_specific = true;
		if (dg_codegen_plan(cg, &a, &p) == DG_OK && p.needs_arch_specific) {
			*out = p;
			return DG_OK;
		}
	}
	return dg_codegen_plan(cg, spec, out);
}

dg_status dg_codegen_render(dg_codegen *cg, const dg_spec *spec,
			    dg_source **out)
{
	dg_plan p;
	dg_source *src;
	dg_status st;

	if (out)
		*out = NULL;
	st = dg_codegen_plan(cg, spec, &p);
	if (st)
		return st;
	src = calloc(1, sizeof(*src));
	if (!src)
		return DG_ERR_NOMEM;
	snprintf(src->canonical, sizeof(src->canonical), "%s", p.canonical);
	const dg_op_info *row = dg_op_info_of(p.spec.op);
	st = dg__lua_render(cg->lua, &p.spec, row->module, p.canonical, &src->text, &src->len,
			    cg->err, sizeof(cg->err));
	if (st == DG_OK) {
		src->name = strdup(p.program);
		src->entries = calloc((size_t)p.n_entries, sizeof(char *));
		src->block_threads = calloc((size_t)p.n_entries, sizeof(int));
		src->dyn_smem = calloc((size_t)p.n_entries, sizeof(int));
		st = src->name && src->entries && src->block_threads && src->dyn_smem ? DG_OK
										      : DG_ERR_NOMEM;
		for (int i = 0; st == DG_OK && i < p.n_entries; i++) {
			src->entries[i] = strdup(p.entries[i].name);
			if (!src->entries[i])
				st = DG_ERR_NOMEM;
			src->n_entries = i + 1;
			src->block_threads[i] = p.entries[i].threads;
			src->dyn_smem[i] = p.entries[i].smem;
		}
		if (st)
			snprintf(cg->err, sizeof(cg->err), "out of memory copying the rendered source");
	}
	if (st) {
		dg_source_destroy(src);
		return st;
	}
	*out = src;
	return DG_OK;
}
