/*
 * dragon-gen build: what a bundle's kernels resolve to, and the tuning
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
 * came from. cmd_build.c calls these in order: resolve before the
 * compile, write the records into the temp folder, the manifest, publish
 * with the kernels.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/publish.h"
#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/tune.h"

#define BUILTIN_PREFIX "built-in:"

void dg__gen_resolved_free(dg__gen_resolved *r)
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
static const char *record_add(dg__gen_resolved *r, const char *path, const dg_tune_record *rec)
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
static size_t kernel_index(const dg__gen_resolved *r, const char *canonical)
{
	size_t i = 0;
	while (i < r->n && strcmp(r->canonical[i], canonical) != 0)
		i++;
	return i;
}

/* The one device the kernels resolve for: a second one is a usage error. */
static int note_device(dg__gen_resolved *r, const char *name, int sm)
{
	if (!name[0])
		return DG__CLI_OK;
	if (!r->device[0]) {
		snprintf(r->device, sizeof(r->device), "%s", name);
		r->sm = sm;
		return DG__CLI_OK;
	}
	if (strcmp(r->device, name) == 0 && r->sm == sm)
		return DG__CLI_OK;
	return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
			   "build: the specs' arches resolve for two devices of the tuning records (%s sm_%d and %s sm_%d); a bundle is for one: pick it with --device NAME --sm N, or --device none",
			   r->device, r->sm, name, sm);
}

/* The "tuning" entry of one spec; rec: the DB's record behind ch. */
static int tuning_entry(dg__gen_resolved *r, const char *given, const dg_tune_choice *ch,
			const dg_tune_record *rec)
{
	cJSON *o = cJSON_CreateObject();
	if (!o || !cJSON_AddItemToArray(r->tuning, o)) {
		cJSON_Delete(o);
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
	}
	cJSON_AddStringToObject(o, "spec", given);
	cJSON_AddStringToObject(o, "kernel_spec", ch->plan.canonical);
	cJSON_AddBoolToObject(o, "tuned", ch->tuned);
	if (ch->tuned && ch->record[0]) {
		const char *name = record_add(r, ch->record, rec);
		char rel[320];
		if (!name)
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
		snprintf(rel, sizeof(rel), "tune/%s", name);
		cJSON_AddStringToObject(o, "record", rel);
	} else {
		cJSON_AddStringToObject(o, "why", ch->why);
	}
	return DG__CLI_OK;
}

int dg__gen_build_resolve(const dg__gen_tune *t, dg_codegen *cg, const dg__specset *set,
			  bool tuned, bool verbose, dg__gen_resolved *out)
{
	char name[128];
	int code = DG__CLI_OK, sm;

	memset(out, 0, sizeof(*out));
	if (t->mode == DG__GEN_DEV_NAMED) {
		snprintf(out->device, sizeof(out->device), "%s", t->device);
		out->sm = t->sm;
	}
	out->specs = calloc(set->n ? set->n : 1, sizeof(*out->specs));
	out->canonical = calloc(set->n ? set->n : 1, sizeof(*out->canonical));
	out->tuning = tuned ? cJSON_CreateArray() : NULL;
	if (!out->specs || !out->canonical || (tuned && !out->tuning))
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
	for (size_t i = 0; i < set->n && !code; i++) {
		const dg_spec *s = &set->specs[i];
		dg_tune_choice ch;
		dg__gen_tune_device_for(t, s, name, sizeof(name), &sm);
		dg_status st = dg_tune_resolve(cg, t->db, s, name[0] ? name : NULL, sm, &ch);
		if (st)
			return dg__cli_fail(st, "%s", dg_codegen_errmsg(cg));
		if ((code = note_device(out, name, sm)))
			break;
		if (tuned && dg_tile_is_auto(&s->tile) &&
		    (code = tuning_entry(out, set->canonical[i], &ch,
					 dg_tune_db_record(t->db, s, name, sm))))
			break;
		if (dg_tile_is_auto(&s->tile))
			dg__cli_note(verbose, "%s: %s", set->canonical[i],
				     ch.tuned ? ch.record : ch.why);
		if (kernel_index(out, ch.plan.canonical) < out->n)
			continue; /* another spec of the set resolved to this kernel */
		out->canonical[out->n] = strdup(ch.plan.canonical);
		if (!out->canonical[out->n])
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
		out->specs[out->n++] = ch.spec;
	}
	return code;
}

dg_status dg__gen_records_write(const dg__gen_resolved *r, const char *tmp, char *msg,
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
			st = dg__cli_read_file(r->rec_paths[i], (size_t)16 << 20, &file, &n, msg, msz);
		snprintf(path, sizeof(path), "%s/%s", dir, r->rec_names[i]);
		if (!st)
			st = dg__cli_write_file(path, file ? file : (const uint8_t *)r->rec_json[i], n,
						msg, msz);
		free(file);
		if (st)
			return st;
	}
	return DG_OK;
}

dg_status dg__gen_records_publish(const dg__gen_resolved *r, const char *tmp,
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

dg_status dg__gen_tuning_manifest(const dg__gen_resolved *r, char **json, char *msg,
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
