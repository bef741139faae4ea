/*
 * The bundle builder: what a bundle's kernels resolve to, and the tuning
 * records behind them.
 *
 * A bundle holds what runs: every spec of the set gets the tile and
 * target the runtime would give it on the device the bundle is for
 * (dg_tune_resolve: the tuning DB — the user's records above the
 * built-in ones — then the template's default, dg_codegen_plan_for), and
 * specs that resolve to one kernel are built once. With --tuned the
 * records used go into the bundle's tune/ folder (a file's bytes as they
 * are; a built-in record from its JSON) and the manifest's "tuning" array
 * (a field manifest readers ignore) says, for each spec, where its tile
 * came from. bundle_build.c calls these in order: resolve before the
 * compile, write the records into the temp folder, the manifest, publish
 * with the kernels.
 *
 * The device a spec resolves for: the one the caller names (device and
 * SM), none, or for each spec's SM the one device the DB's records (the
 * user's and the built-in ones) name, else none: then a spec gets its
 * template's default (dg_codegen_plan_for).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/msg.h"
#include "base/publish.h"
#include "dragon/cache.h"
#include "runtime/gpu/bundle_int.h"

/* A line for the user (the build's note callback), detail 1 for --verbose's. */
void dg__bundle_note(const dg_bundle_opts *o, int detail, const char *fmt, ...)
{
	char line[2048];
	va_list ap;

	if (!o->note)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	o->note(o->user, detail, line);
}

#define BUILTIN_PREFIX "built-in:"

/* ---- the device ---------------------------------------------------------------- */

dg_status dg__bundle_tune_open(const dg_bundle_opts *opts, dg__bundle_tune *out, char *msg,
			       size_t msz)
{
	memset(out, 0, sizeof(*out));
	if (opts->device && opts->device[0]) {
		if (opts->sm < 10 || opts->sm > 999)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msz,
					"device %s: sm %d; give the device's SM, 10 to 999 (90 for sm_90)",
					opts->device, opts->sm);
		if (strlen(opts->device) >= sizeof(out->device))
			return dg__msgf(DG_ERR_INVALID_ARG, msg, msz, "device '%.40s...': a name of at most %zu bytes",
					opts->device, sizeof(out->device) - 1);
		out->mode = DG__BUNDLE_DEV_NAMED;
		snprintf(out->device, sizeof(out->device), "%s", opts->device);
		out->sm = opts->sm;
	} else if (opts->device) {
		out->mode = DG__BUNDLE_DEV_NONE;
	}
	out->db = opts->tune_db;
	if (!out->db) {
		/* as the runtime opens them: the cache's tune/ folder, without
		 * making the cache (no cache, no records of the user's) */
		dg_tune_db_opts o;
		dg_cache *cache = NULL;
		const char *env = getenv("DRAGON_TUNE_DB");
		memset(&o, 0, sizeof(o));
		if (!(env && env[0])) {
			dg_cache_opts co = { .dir = opts->jit ? opts->jit->cache_dir : NULL, .no_create = true };
			if (!(opts->jit && opts->jit->no_cache) && dg_cache_open(&cache, &co) == DG_OK)
				o.cache_root = dg_cache_root(cache);
			else
				o.path = "builtin";
		}
		dg_status st = dg_tune_db_open(&out->owned, &o);
		dg_cache_close(cache);
		if (st)
			return dg__msgf(st, msg, msz, "out of memory reading the tuning DB");
		out->db = out->owned;
		for (size_t i = 0; i < dg_tune_db_n_problems(out->db); i++)
			dg__bundle_note(opts, 0, "skipped a tuning record: %s", dg_tune_db_problem(out->db, i));
	}
	size_t nd = dg_tune_db_devices(out->db, out->devs, DG__BUNDLE_MAX_DEVICES);
	out->n_devs = nd < DG__BUNDLE_MAX_DEVICES ? nd : DG__BUNDLE_MAX_DEVICES;
	if (out->mode != DG__BUNDLE_DEV_AUTO || !out->owned)
		return DG_OK;
	/* several devices of one SM: its specs resolve for none (say so once) */
	for (size_t i = 0; i < out->n_devs; i++) {
		size_t same = 0, first = i;
		for (size_t k = 0; k < out->n_devs; k++) {
			if (out->devs[k].sm != out->devs[i].sm)
				continue;
			if (k < first)
				first = k;
			same++;
		}
		if (same > 1 && first == i)
			dg__bundle_note(opts, 0,
					"the tuning records name %zu devices of sm_%d (%s, ...); specs for sm_%d resolve for none: name the device and its SM",
					same, out->devs[i].sm, out->devs[i].name, out->devs[i].sm);
	}
	dg__bundle_note(opts, 1, "tuning records of %zu device%s in %s (%zu built in)", nd,
			nd == 1 ? "" : "s", dg_tune_db_where(out->db), dg_tune_db_n_builtin(out->db));
	return DG_OK;
}

void dg__bundle_tune_close(dg__bundle_tune *t)
{
	dg_tune_db_close(t->owned);
	memset(t, 0, sizeof(*t));
}

/* The device spec resolves for: name "" and *sm 0 for none. */
static void device_for(const dg__bundle_tune *t, const dg_spec *spec, char *name, size_t size,
		       int *sm)
{
	name[0] = '\0';
	*sm = 0;
	if (t->mode == DG__BUNDLE_DEV_NAMED) {
		snprintf(name, size, "%s", t->device);
		*sm = t->sm;
		return;
	}
	if (t->mode == DG__BUNDLE_DEV_NONE)
		return;
	const dg_tune_device *pick = NULL;
	size_t same = 0;
	for (size_t i = 0; i < t->n_devs; i++)
		if (t->devs[i].sm == spec->arch) {
			pick = &t->devs[i];
			same++;
		}
	if (same == 1) {
		snprintf(name, size, "%s", pick->name);
		*sm = pick->sm;
	}
}

/* ---- the kernels ----------------------------------------------------------------- */

void dg__bundle_resolved_free(dg__bundle_resolved *r)
{
	for (size_t i = 0; r->canonical && i < r->n; i++)
		free(r->canonical[i]);
	for (size_t i = 0; i < r->n_recs; i++) {
		free(r->rec_paths[i]);
		free(r->rec_names[i]);
		free(r->rec_json[i]);
	}
	free(r->specs);
	free(r->canonical);
	free(r->rec_paths);
	free(r->rec_names);
	free(r->rec_json);
	cJSON_Delete(r->tuning);
	memset(r, 0, sizeof(*r));
}

/* The bundle name of record `path` (added to r if new; rec is the DB's
 * record, whose JSON a built-in one is written from); NULL: no memory. */
static const char *record_add(dg__bundle_resolved *r, const char *path, const dg_tune_record *rec)
{
	for (size_t i = 0; i < r->n_recs; i++)
		if (strcmp(r->rec_paths[i], path) == 0)
			return r->rec_names[i];
	char **p = realloc(r->rec_paths, (r->n_recs + 1) * sizeof(*p));
	if (!p)
		return NULL;
	r->rec_paths = p;
	char **q = realloc(r->rec_names, (r->n_recs + 1) * sizeof(*q));
	if (!q)
		return NULL;
	r->rec_names = q;
	char **jj = realloc(r->rec_json, (r->n_recs + 1) * sizeof(*jj));
	if (!jj)
		return NULL;
	r->rec_json = jj;
	r->rec_json[r->n_recs] = NULL;
	bool builtin = strncmp(path, BUILTIN_PREFIX, strlen(BUILTIN_PREFIX)) == 0;
	if (builtin) {
		char msg[256];
		if (!rec || dg_tune_record_to_json(rec, &r->rec_json[r->n_recs], msg, sizeof(msg)))
			return NULL;
	}
	const char *base = strncmp(path, BUILTIN_PREFIX, strlen(BUILTIN_PREFIX)) == 0
				   ? path + strlen(BUILTIN_PREFIX)
				   : strrchr(path, '/');
	base = base == NULL ? path : base[0] == '/' ? base + 1 : base;
	char name[300];
	snprintf(name, sizeof(name), "%.250s", base);
	for (size_t i = 0; i < r->n_recs; i++)
		if (strcmp(r->rec_names[i], name) == 0) /* same name, other folder */
			snprintf(name, sizeof(name), "%zu-%.240s", r->n_recs, base);
	r->rec_paths[r->n_recs] = strdup(path);
	r->rec_names[r->n_recs] = strdup(name);
	if (!r->rec_paths[r->n_recs] || !r->rec_names[r->n_recs]) {
		free(r->rec_paths[r->n_recs]);
		free(r->rec_names[r->n_recs]);
		free(r->rec_json[r->n_recs]);
		return NULL;
	}
	return r->rec_names[r->n_recs++];
}

/* Index of canonical among r's kernels, or r->n. */
static size_t kernel_index(const dg__bundle_resolved *r, const char *canonical)
{
	size_t i = 0;
	while (i < r->n && strcmp(r->canonical[i], canonical) != 0)
		i++;
	return i;
}

/* The one device the kernels resolve for: a second one is an error. */
static dg_status note_device(dg__bundle_resolved *r, const char *name, int sm, char *msg,
			     size_t msz)
{
	if (!name[0])
		return DG_OK;
	if (!r->device[0]) {
		snprintf(r->device, sizeof(r->device), "%s", name);
		r->sm = sm;
		return DG_OK;
	}
	if (strcmp(r->device, name) == 0 && r->sm == sm)
		return DG_OK;
	return dg__msgf(DG_ERR_INVALID_ARG, msg, msz,
			"the specs' arches resolve for two devices of the tuning records (%s sm_%d and %s sm_%d); a bundle is for one: name the device and its SM, or none",
			r->device, r->sm, name, sm);
}

static dg_status nomem(char *msg, size_t msz)
{
	return dg__msgf(DG_ERR_NOMEM, msg, msz, "out of memory");
}

/* The "tuning" entry of one spec; rec: the DB's record behind ch. */
static dg_status tuning_entry(dg__bundle_resolved *r, const char *given, const dg_tune_choice *ch,
			      const dg_tune_record *rec, char *msg, size_t msz)
{
	cJSON *o = cJSON_CreateObject();
	if (!o || !cJSON_AddItemToArray(r->tuning, o)) {
		cJSON_Delete(o);
		return nomem(msg, msz);
	}
	cJSON_AddStringToObject(o, "spec", given);
	cJSON_AddStringToObject(o, "kernel_spec", ch->plan.canonical);
	cJSON_AddBoolToObject(o, "tuned", ch->tuned);
	if (ch->tuned && ch->record[0]) {
		const char *name = record_add(r, ch->record, rec);
		char rel[320];
		if (!name)
			return nomem(msg, msz);
		snprintf(rel, sizeof(rel), "tune/%s", name);
		cJSON_AddStringToObject(o, "record", rel);
	} else {
		cJSON_AddStringToObject(o, "why", ch->why);
	}
	return DG_OK;
}

dg_status dg__bundle_resolve(const dg_bundle_opts *opts, const dg__bundle_tune *t, dg_codegen *cg,
			     const dg_spec *specs, char *const *canonical, size_t n, bool tuned,
			     dg__bundle_resolved *out, char *msg, size_t msz)
{
	char name[128];
	int sm;
	dg_status st = DG_OK;

	memset(out, 0, sizeof(*out));
	if (t->mode == DG__BUNDLE_DEV_NAMED) {
		snprintf(out->device, sizeof(out->device), "%s", t->device);
		out->sm = t->sm;
	}
	out->specs = calloc(n ? n : 1, sizeof(*out->specs));
	out->canonical = calloc(n ? n : 1, sizeof(*out->canonical));
	out->tuning = tuned ? cJSON_CreateArray() : NULL;
	if (!out->specs || !out->canonical || (tuned && !out->tuning))
		return nomem(msg, msz);
	for (size_t i = 0; i < n && !st; i++) {
		const dg_spec *s = &specs[i];
		dg_tune_choice ch;
		device_for(t, s, name, sizeof(name), &sm);
		st = dg_tune_resolve(cg, t->db, s, name[0] ? name : NULL, sm, &ch);
		if (st)
			return dg__msgf(st, msg, msz, "%s", dg_codegen_errmsg(cg));
		if ((st = note_device(out, name, sm, msg, msz)))
			break;
		if (tuned && dg_tile_is_auto(&s->tile) &&
		    (st = tuning_entry(out, canonical[i], &ch, dg_tune_db_record(t->db, s, name, sm),
				       msg, msz)))
			break;
		if (dg_tile_is_auto(&s->tile))
			dg__bundle_note(opts, 1, "%s: %s", canonical[i], ch.tuned ? ch.record : ch.why);
		if (kernel_index(out, ch.plan.canonical) < out->n)
			continue; /* another spec of the set resolved to this kernel */
		out->canonical[out->n] = strdup(ch.plan.canonical);
		if (!out->canonical[out->n])
			return nomem(msg, msz);
		out->specs[out->n++] = ch.spec;
	}
	return st;
}

dg_status dg__bundle_records_write(const dg__bundle_resolved *r, const char *tmp, char *msg,
				   size_t msz)
{
	char dir[4200], path[4600];

	if (!r->n_recs)
		return DG_OK;
	snprintf(dir, sizeof(dir), "%s/tune", tmp);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		snprintf(msg, msz, "%s: %s", dir, strerror(errno));
		return DG_ERR_IO;
	}
	for (size_t i = 0; i < r->n_recs; i++) {
		uint8_t *file = NULL; /* a user record's bytes, as they are */
		size_t n = 0;
		dg_status st = DG_OK;
		if (r->rec_json[i])
			n = strlen(r->rec_json[i]);
		else
			st = dg__file_read(r->rec_paths[i], (size_t)16 << 20, &file, &n, msg, msz);
		snprintf(path, sizeof(path), "%s/%s", dir, r->rec_names[i]);
		if (!st)
			st = dg__file_write(path, file ? file : (const uint8_t *)r->rec_json[i], n,
						msg, msz);
		free(file);
		if (st)
			return st;
	}
	return DG_OK;
}

dg_status dg__bundle_records_publish(const dg__bundle_resolved *r, const char *tmp,
				     const char *dir, char *msg, size_t msz)
{
	char from[4600], to[4600], tdir[4200];
	struct stat sb;
	size_t moved = 0;
	bool *fresh;
	dg_status st = DG_OK;

	if (!r->n_recs)
		return DG_OK;
	snprintf(tdir, sizeof(tdir), "%s/tune", dir);
	if (mkdir(tdir, 0755) != 0 && errno != EEXIST) {
		snprintf(msg, msz, "%s: %s", tdir, strerror(errno));
		return DG_ERR_IO;
	}
	fresh = calloc(r->n_recs, sizeof(*fresh));
	if (!fresh) {
		snprintf(msg, msz, "out of memory");
		return DG_ERR_NOMEM;
	}
	for (; moved < r->n_recs; moved++) {
		snprintf(from, sizeof(from), "%s/tune/%s", tmp, r->rec_names[moved]);
		snprintf(to, sizeof(to), "%s/%s", tdir, r->rec_names[moved]);
		fresh[moved] = lstat(to, &sb) != 0;
		if (rename(from, to) != 0) {
			snprintf(msg, msz, "%s: %s", to, strerror(errno));
			st = DG_ERR_IO;
			break;
		}
	}
	if (!st) /* the renames into tune/ are durable before the manifest is */
		st = dg__publish_sync_dir(tdir, msg, msz);
	for (size_t i = 0; st && i < moved; i++) {
		snprintf(to, sizeof(to), "%s/%s", tdir, r->rec_names[i]);
		if (fresh[i])
			unlink(to);
	}
	free(fresh);
	return st;
}

dg_status dg__bundle_tuning_manifest(const dg__bundle_resolved *r, char **json, char *msg,
				     size_t msz)
{
	if (!r->tuning)
		return DG_OK;
	cJSON *root = cJSON_Parse(*json);
	cJSON *dup = cJSON_Duplicate(r->tuning, true);
	char *text = NULL;
	if (root && dup && cJSON_AddItemToObject(root, "tuning", dup)) {
		dup = NULL;
		text = cJSON_Print(root);
	}
	cJSON_Delete(dup);
	cJSON_Delete(root);
	size_t len = text ? strlen(text) : 0;
	char *t2 = text ? realloc(text, len + 2) : NULL;
	if (!t2) {
		free(text);
		snprintf(msg, msz, "out of memory writing the manifest");
		return DG_ERR_NOMEM;
	}
	memcpy(t2 + len, "\n", 2);
	free(*json);
	*json = t2;
	return DG_OK;
}
