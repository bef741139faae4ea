/*
 * Code generation: spec → CUDA source.
 *
 * Owns the template set (the embedded copy, or a snapshot of a folder for
 * template development), its hash, and the Lua host that renders it. The
 * snapshot is read once at create, so the hash always describes exactly the
 * bytes that render.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lua_host.h"
#include "codegen/templates_embedded.h"
#include "dragon/codegen.h"
#include "base/sha256.h"

#define DEFAULT_MEM_LIMIT ((size_t)64 << 20)
#define DEFAULT_INSTR_LIMIT 50000000L
#define MAX_TEMPLATE_BYTES ((size_t)4 << 20)

struct dg_codegen {
	dg__lua *lua;
	dg__template_file *owned; /* snapshot of a folder, or NULL */
	size_t n_owned;
	const dg__template_file *files;
	size_t n_files;
	char origin[1024];
	char hash[65];
	dg_status init_status; /* why create failed, kept for every call */
	char init_err[4096];
	char err[4096];
};

static void free_files(dg__template_file *f, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free((char *)f[i].name);
		free((unsigned char *)f[i].bytes);
	}
	free(f);
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(((const dg__template_file *)a)->name,
		      ((const dg__template_file *)b)->name);
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
			dg__template_file *nf =
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
			(dg__template_file){ name, bytes, size };
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

static void hash_files(dg_codegen *cg)
{
	dg__sha256 h;
	uint8_t d[32];

	dg__sha256_init(&h);
	for (size_t i = 0; i < cg->n_files; i++) {
		char sz[32];
		int n = snprintf(sz, sizeof(sz), "%zu", cg->files[i].size);
		dg__sha256_update(&h, cg->files[i].name,
				  strlen(cg->files[i].name) + 1);
		dg__sha256_update(&h, sz, (size_t)n + 1);
		dg__sha256_update(&h, cg->files[i].bytes, cg->files[i].size);
	}
	dg__sha256_final(&h, d);
	dg__sha256_hex(d, cg->hash);
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
		cg->n_files = dg__n_templates;
		snprintf(cg->origin, sizeof(cg->origin), "embedded");
	}
	hash_files(cg);
	size_t mem = opts && opts->mem_limit ? opts->mem_limit : DEFAULT_MEM_LIMIT;
	long instr = opts && opts->instr_limit > 0 ? opts->instr_limit
						   : DEFAULT_INSTR_LIMIT;
	st = dg__lua_create(&cg->lua, cg->files, cg->n_files, mem, instr,
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

void dg_codegen_destroy(dg_codegen *cg)
{
	if (!cg)
		return;
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

dg_status dg_codegen_render(dg_codegen *cg, const dg_spec *spec,
			    dg_source **out)
{
	dg_spec s;
	dg_source *src;
	dg_status st;

	if (!cg || !out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (cg->init_status) {
		snprintf(cg->err, sizeof(cg->err), "%s", cg->init_err);
		return cg->init_status;
	}
	cg->err[0] = '\0';
	if (!spec) {
		snprintf(cg->err, sizeof(cg->err), "spec is NULL");
		return DG_ERR_INVALID_ARG;
	}
	st = dg_spec_validate(spec, cg->err, sizeof(cg->err));
	if (st)
		return st;
	s = *spec;
	dg_spec_normalize(&s);
	dg_spec_default_tile(&s, &s.tile);
	/* A default tile is valid by construction; check it anyway so a bad
	 * heuristic shows up as a message, not as a broken kernel. */
	st = dg_spec_validate(&s, cg->err, sizeof(cg->err));
	if (st)
		return st;
	src = calloc(1, sizeof(*src));
	if (!src)
		return DG_ERR_NOMEM;
	st = dg_spec_to_string(&s, src->canonical, sizeof(src->canonical));
	if (st == DG_OK)
		st = dg__lua_render(cg->lua, &s, src->canonical, src, cg->err,
				    sizeof(cg->err));
	if (st) {
		dg_source_destroy(src);
		return st;
	}
	*out = src;
	return DG_OK;
}
