/*
 * JIT: spec → rendered source → cache key → cached or freshly compiled
 * binary.
 *
 * The key covers everything the bytes depend on: generator version,
 * template hash, canonical spec, rendered source, NVRTC version, options
 * and target arch. The entry's metadata JSON travels with the binary, so a
 * hit returns the entry names, the NVRTC log and the compile time of the
 * build that made it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "dragon/jit.h"
#include "runtime/store/cache_io.h"
#include "runtime/store/nvrtc.h"
#include "base/sha256.h"

struct dg_ctx {
	dg_codegen *cg;
	dg_cache *cache; /* NULL when no_cache */
	dg_status init_status;
	char err[8192];
};

static dg_status set_err(dg_ctx *ctx, dg_status st, const char *msg)
{
	snprintf(ctx->err, sizeof(ctx->err), "%s", msg);
	return st;
}

dg_status dg_ctx_create(dg_ctx **out, const dg_ctx_opts *opts)
{
	dg_ctx *ctx;
	dg_status st;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return DG_ERR_NOMEM;
	dg_codegen_opts co = { 0 };
	co.template_dir = opts ? opts->template_dir : NULL;
	st = dg_codegen_create(&ctx->cg, &co);
	if (st) {
		if (!ctx->cg) {
			free(ctx);
			return st;
		}
		set_err(ctx, st, dg_codegen_errmsg(ctx->cg));
		goto fail;
	}
	if (!(opts && opts->no_cache)) {
		dg_cache_opts cop = { 0 };
		cop.dir = opts ? opts->cache_dir : NULL;
		cop.max_bytes = opts ? opts->cache_max_bytes : 0;
		st = dg_cache_open(&ctx->cache, &cop);
		if (st) {
			/* A failed open leaves no handle: the thread's last
			 * open failure is read through a NULL handle. */
			set_err(ctx, st, dg_cache_errmsg(ctx->cache));
			goto fail;
		}
	}
	*out = ctx;
	return DG_OK;
fail:
	/* Hand the handle out so dg_ctx_errmsg can say why (sqlite3_open). */
	ctx->init_status = st;
	*out = ctx;
	return st;
}

void dg_ctx_destroy(dg_ctx *ctx)
{
	if (!ctx)
		return;
	dg_cache_close(ctx->cache);
	dg_codegen_destroy(ctx->cg);
	free(ctx);
}

const char *dg_ctx_errmsg(const dg_ctx *ctx)
{
	return ctx ? ctx->err : "context is NULL";
}

dg_codegen *dg_ctx_codegen(dg_ctx *ctx)
{
	return ctx ? ctx->cg : NULL;
}

dg_cache *dg_ctx_cache(dg_ctx *ctx)
{
	return ctx ? ctx->cache : NULL;
}

void dg_binary_destroy(dg_binary *bin)
{
	if (!bin)
		return;
	free(bin->image);
	for (int i = 0; bin->entries && i < bin->n_entries; i++)
		free(bin->entries[i]);
	free(bin->entries);
	free(bin->block_threads);
	free(bin->dyn_smem);
	free(bin->log);
	free(bin->meta);
	free(bin);
}

static void hash_field(dg__sha256 *h, const char *s)
{
	dg__sha256_update(h, s, strlen(s) + 1); /* NUL separates fields */
}

static void compute_key(const dg_codegen *cg, const dg_source *src,
			const dg__nvrtc_target *t, char key[65])
{
	dg__sha256 h;
	uint8_t d[32];
	char opts[512], arch[32];

	dg__nvrtc_opts_string(t, opts, sizeof(opts));
	snprintf(arch, sizeof(arch), "%s_%d%s", t->ptx ? "compute" : "sm",
		 t->arch, t->arch_specific ? "a" : "");
	dg__sha256_init(&h);
	hash_field(&h, "dragon-kernel-key-v1");
	hash_field(&h, DG_GENERATOR_VERSION);
	hash_field(&h, dg_codegen_template_hash(cg));
	hash_field(&h, src->canonical);
	hash_field(&h, src->text);
	hash_field(&h, dg_nvrtc_version());
	hash_field(&h, opts);
	hash_field(&h, arch);
	dg__sha256_final(&h, d);
	dg__sha256_hex(d, key);
}

/* ISO-8601 UTC time, for metadata. */
static void iso_now(char *buf, size_t size)
{
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* "launch": { entry: { "threads": N, "smem": B } } for the entries the
 * template gave launch info for (absent when none did). Non-zero on OOM. */
static int add_launch(cJSON *m, const dg_source *src)
{
	cJSON *launch = NULL;

	for (int i = 0; i < src->n_entries; i++) {
		int t = src->block_threads ? src->block_threads[i] : 0;
		int sm = src->dyn_smem ? src->dyn_smem[i] : 0;
		if (!t && !sm)
			continue;
		if (!launch && !(launch = cJSON_AddObjectToObject(m, "launch")))
			return 1;
		cJSON *e = cJSON_AddObjectToObject(launch, src->entries[i]);
		if (!e || !cJSON_AddNumberToObject(e, "threads", t) ||
		    !cJSON_AddNumberToObject(e, "smem", sm))
			return 1;
	}
	return 0;
}

static char *make_meta(const dg_codegen *cg, const dg_source *src,
		       const dg__nvrtc_target *t, const char *key,
		       const dg__nvrtc_result *res)
{
	char opts[512], when[32];
	cJSON *m = cJSON_CreateObject();
	cJSON *entries = cJSON_CreateStringArray((const char *const *)src->entries,
						 src->n_entries);
	char *text = NULL;

	if (!m || !entries) {
		cJSON_Delete(m);
		cJSON_Delete(entries);
		return NULL;
	}
	dg__nvrtc_opts_string(t, opts, sizeof(opts));
	iso_now(when, sizeof(when));
	cJSON_AddNumberToObject(m, "format", 1);
	cJSON_AddStringToObject(m, "spec", src->canonical);
	cJSON_AddStringToObject(m, "key", key);
	cJSON_AddItemToObject(m, "entries", entries);
	if (add_launch(m, src)) {
		cJSON_Delete(m);
		return NULL;
	}
	cJSON_AddNumberToObject(m, "arch", t->arch);
	cJSON_AddBoolToObject(m, "arch_specific", t->arch_specific);
	cJSON_AddBoolToObject(m, "ptx", t->ptx);
	cJSON_AddStringToObject(m, "nvrtc_version", dg_nvrtc_version());
	cJSON_AddStringToObject(m, "options", opts);
	cJSON_AddStringToObject(m, "generator_version", DG_GENERATOR_VERSION);
	cJSON_AddStringToObject(m, "template_hash", dg_codegen_template_hash(cg));
	cJSON_AddNumberToObject(m, "compile_ms", res->ms);
	cJSON_AddStringToObject(m, "log", res->log ? res->log : "");
	cJSON_AddStringToObject(m, "created", when);
	text = cJSON_PrintUnformatted(m);
	cJSON_Delete(m);
	return text;
}

typedef struct build_job {
	dg_ctx *ctx;
	const dg_source *src;
	const dg__nvrtc_target *target;
	const char *key;
} build_job;

/* dg_cache_build_fn: compile and describe. */
static dg_status build_entry(void *user, uint8_t **image, size_t *size,
			     char **meta)
{
	build_job *job = user;
	dg__nvrtc_result res;
	dg_status st = dg__nvrtc_compile(job->src, job->target, &res,
					 job->ctx->err, sizeof(job->ctx->err));
	if (st) {
		dg__nvrtc_result_free(&res);
		return st;
	}
	*meta = make_meta(job->ctx->cg, job->src, job->target, job->key, &res);
	if (!*meta) {
		dg__nvrtc_result_free(&res);
		return set_err(job->ctx, DG_ERR_NOMEM, "out of memory writing metadata");
	}
	*image = res.image;
	*size = res.size;
	res.image = NULL;
	dg__nvrtc_result_free(&res);
	return DG_OK;
}

/* Fills bin's descriptive fields from the metadata JSON. */
static dg_status read_meta(dg_ctx *ctx, dg_binary *bin)
{
	cJSON *m = cJSON_Parse(bin->meta);
	dg_status st = DG_ERR_CORRUPT;

	if (!m)
		goto bad;
	const cJSON *entries = cJSON_GetObjectItemCaseSensitive(m, "entries");
	const cJSON *ms = cJSON_GetObjectItemCaseSensitive(m, "compile_ms");
	const cJSON *log = cJSON_GetObjectItemCaseSensitive(m, "log");
	const cJSON *key = cJSON_GetObjectItemCaseSensitive(m, "key");
	if (!cJSON_IsArray(entries) || !cJSON_IsNumber(ms) ||
	    !cJSON_IsString(log) || !cJSON_IsString(key) ||
	    strcmp(key->valuestring, bin->key) != 0)
		goto bad;
	int n = cJSON_GetArraySize(entries);
	if (n < 1 || n > 64)
		goto bad;
	const cJSON *launch = cJSON_GetObjectItemCaseSensitive(m, "launch");
	if (launch && !cJSON_IsObject(launch))
		goto bad;
	bin->entries = calloc((size_t)n, sizeof(char *));
	bin->block_threads = calloc((size_t)n, sizeof(int));
	bin->dyn_smem = calloc((size_t)n, sizeof(int));
	bin->log = strdup(log->valuestring);
	if (!bin->entries || !bin->block_threads || !bin->dyn_smem || !bin->log) {
		st = DG_ERR_NOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const cJSON *e = cJSON_GetArrayItem(entries, i);
		if (!cJSON_IsString(e))
			goto bad;
		bin->entries[i] = strdup(e->valuestring);
		if (!bin->entries[i]) {
			st = DG_ERR_NOMEM;
			goto out;
		}
		bin->n_entries = i + 1;
		/* Launch info is optional (entries written before it existed,
		 * templates that give none): absent reads as 0. */
		const cJSON *li = cJSON_GetObjectItemCaseSensitive(launch, e->valuestring);
		if (!li)
			continue;
		const cJSON *t = cJSON_GetObjectItemCaseSensitive(li, "threads");
		const cJSON *sm = cJSON_GetObjectItemCaseSensitive(li, "smem");
		if (!cJSON_IsNumber(t) || !cJSON_IsNumber(sm) || t->valuedouble < 0 ||
		    t->valuedouble > 1024 || sm->valuedouble < 0 ||
		    sm->valuedouble > (double)(1 << 30))
			goto bad;
		bin->block_threads[i] = (int)t->valuedouble;
		bin->dyn_smem[i] = (int)sm->valuedouble;
	}
	bin->compile_ms = ms->valuedouble;
	st = DG_OK;
	goto out;
bad:
	snprintf(ctx->err, sizeof(ctx->err),
		 "cache entry %s: metadata does not describe this kernel; run `dragon-gen cache verify`",
		 bin->key);
out:
	cJSON_Delete(m);
	return st;
}

dg_status dg_jit_check_arch(int arch, bool arch_specific, char *msg, size_t msg_size)
{
	dg__nvrtc_target t;
	char local[256];

	if (!msg || !msg_size) {
		msg = local;
		msg_size = sizeof(local);
	}
	return dg__nvrtc_target_for(arch, arch_specific, &t, msg, msg_size);
}

dg_status dg_jit_key(dg_ctx *ctx, const dg_spec *spec, char *key, char *canonical)
{
	dg_source *src = NULL;
	dg__nvrtc_target target;
	dg_status st;

	if (!ctx || !spec || !key)
		return DG_ERR_INVALID_ARG;
	if (ctx->init_status)
		return ctx->init_status;
	ctx->err[0] = '\0';
	st = dg_codegen_render(ctx->cg, spec, &src);
	if (st)
		return set_err(ctx, st, dg_codegen_errmsg(ctx->cg));
	st = dg__nvrtc_target_for(spec->arch, spec->arch_specific, &target, ctx->err,
				  sizeof(ctx->err));
	if (!st) {
		compute_key(ctx->cg, src, &target, key);
		if (canonical)
			snprintf(canonical, DG_SPEC_TEXT_MAX, "%s", src->canonical);
	}
	dg_source_destroy(src);
	return st;
}

dg_status dg_jit_compile(dg_ctx *ctx, const dg_spec *spec, dg_binary **out)
{
	dg_source *src = NULL;
	dg_binary *bin = NULL;
	dg__nvrtc_target target;
	dg_status st;

	if (!ctx || !out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	if (ctx->init_status)
		return ctx->init_status;
	ctx->err[0] = '\0';
	st = dg_codegen_render(ctx->cg, spec, &src);
	if (st)
		return set_err(ctx, st, dg_codegen_errmsg(ctx->cg));
	st = dg__nvrtc_target_for(spec->arch, spec->arch_specific, &target,
				  ctx->err, sizeof(ctx->err));
	if (st)
		goto out;
	bin = calloc(1, sizeof(*bin));
	if (!bin) {
		st = DG_ERR_NOMEM;
		goto out;
	}
	compute_key(ctx->cg, src, &target, bin->key);
	snprintf(bin->canonical, sizeof(bin->canonical), "%s", src->canonical);
	bin->arch = target.arch;
	bin->arch_specific = target.arch_specific;
	bin->is_ptx = target.ptx;

	build_job job = { ctx, src, &target, bin->key };
	if (ctx->cache) {
		dg_cache_blob blob = { 0 };
		st = dg_cache_get_or_build(ctx->cache, bin->key, build_entry, &job,
					   &blob, &bin->cache_hit);
		if (st) {
			if (!ctx->err[0])
				set_err(ctx, st, dg_cache_errmsg(ctx->cache));
			goto out;
		}
		bin->image = blob.image;
		bin->image_size = blob.image_size;
		bin->meta = blob.meta;
	} else {
		st = build_entry(&job, &bin->image, &bin->image_size, &bin->meta);
		if (st)
			goto out;
	}
	st = read_meta(ctx, bin);
out:
	dg_source_destroy(src);
	if (st) {
		dg_binary_destroy(bin);
		return st;
	}
	*out = bin;
	return DG_OK;
}
