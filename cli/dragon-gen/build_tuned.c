/*
 * dragon-gen build --tuned: every spec whose tile is auto gets the tile
 * the tuning DB names for it on the device (--device/--sm, else the one
 * device the records name; dg_tune_resolve, as the runtime would), else
 * the heuristic; the records used are copied into the bundle's tune/
 * folder and listed in the manifest's "tuning" array (a field manifest
 * readers ignore), with each spec's choice, so a bundle says where its
 * tiles came from. cmd_build.c calls these in order: resolve before the
 * compile, copy into the temp folder, the manifest, publish with the
 * kernels.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "cli/dragon-gen/util.h"
#include "dragon/tune.h"

void dg__gen_tuned_free(dg__gen_tuned *ts)
{
	for (size_t i = 0; i < ts->n; i++) {
		free(ts->paths[i]);
		free(ts->names[i]);
	}
	free(ts->paths);
	free(ts->names);
	cJSON_Delete(ts->json);
	memset(ts, 0, sizeof(*ts));
}

/* The bundle name of record `path` (added to ts if new); NULL: no memory. */
static const char *tuned_add(dg__gen_tuned *ts, const char *path)
{
	for (size_t i = 0; i < ts->n; i++)
		if (strcmp(ts->paths[i], path) == 0)
			return ts->names[i];
	char **p = realloc(ts->paths, (ts->n + 1) * sizeof(*p));
	if (!p)
		return NULL;
	ts->paths = p;
	char **q = realloc(ts->names, (ts->n + 1) * sizeof(*q));
	if (!q)
		return NULL;
	ts->names = q;
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	char name[300];
	snprintf(name, sizeof(name), "%.250s", base);
	for (size_t i = 0; i < ts->n; i++)
		if (strcmp(ts->names[i], name) == 0) /* same name, other folder */
			snprintf(name, sizeof(name), "%zu-%.240s", ts->n, base);
	ts->paths[ts->n] = strdup(path);
	ts->names[ts->n] = strdup(name);
	if (!ts->paths[ts->n] || !ts->names[ts->n]) {
		free(ts->paths[ts->n]);
		free(ts->names[ts->n]);
		return NULL;
	}
	return ts->names[ts->n++];
}

int dg__gen_tuned_resolve(const char *db_path, const char *cache_dir, const char *device,
			  const char *sm_text, bool verbose, dg__specset *set,
			  dg__gen_tuned *ts)
{
	dg__gen_tune t;
	char text[DG_SPEC_TEXT_MAX], runs[DG_SPEC_TEXT_MAX];
	int code = dg__gen_tune_open(db_path, cache_dir, device, sm_text, "build", verbose, &t);
	if (code)
		return code;
	ts->json = cJSON_CreateArray();
	for (size_t i = 0; i < set->n && ts->json && !code; i++) {
		dg_spec *s = &set->specs[i];
		dg_tune_choice ch;
		if (!dg_tile_is_auto(&s->tile))
			continue;
		dg__gen_tune_resolve(&t, s, &ch);
		dg_spec_to_string(s, text, sizeof(text));
		dg_spec_to_string(&ch.spec, runs, sizeof(runs));
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "spec", text);
		cJSON_AddStringToObject(o, "kernel_spec", runs);
		cJSON_AddBoolToObject(o, "tuned", ch.tuned);
		if (ch.tuned && ch.record[0]) {
			const char *name = tuned_add(ts, ch.record);
			char rel[320];
			if (!name)
				code = dg__gen_err(DG__GEN_FAIL, "build: out of memory");
			snprintf(rel, sizeof(rel), "tune/%s", name ? name : "");
			cJSON_AddStringToObject(o, "record", rel);
		} else {
			cJSON_AddStringToObject(o, "why", ch.why);
		}
		cJSON_AddItemToArray(ts->json, o);
		dg__gen_note(verbose, "%s: %s", text, ch.tuned ? ch.record : ch.why);
		*s = ch.spec;
	}
	dg__gen_tune_close(&t);
	if (!ts->json && !code)
		code = dg__gen_err(DG__GEN_FAIL, "build: out of memory");
	return code;
}

dg_status dg__gen_tuned_copy_records(const dg__gen_tuned *ts, const char *tmp, char *msg,
				     size_t msz)
{
	char dir[4200], path[4600];
	uint8_t *bytes = NULL;
	size_t n = 0;

	if (!ts->n)
		return DG_OK;
	snprintf(dir, sizeof(dir), "%s/tune", tmp);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		snprintf(msg, msz, "%s: %s", dir, strerror(errno));
		return DG_ERR_IO;
	}
	for (size_t i = 0; i < ts->n; i++) {
		dg_status st = dg__gen_read_file(ts->paths[i], (size_t)16 << 20, &bytes, &n, msg,
						 msz);
		if (st)
			return st;
		snprintf(path, sizeof(path), "%s/%s", dir, ts->names[i]);
		st = dg__gen_write_file(path, bytes, n, msg, msz);
		free(bytes);
		if (st)
			return st;
	}
	return DG_OK;
}

dg_status dg__gen_tuned_publish_records(const dg__gen_tuned *ts, const char *tmp,
					const char *dir, char *msg, size_t msz)
{
	char from[4600], to[4600], tdir[4200];
	struct stat sb;
	size_t moved = 0;
	bool *fresh;
	dg_status st = DG_OK;

	if (!ts || !ts->n)
		return DG_OK;
	snprintf(tdir, sizeof(tdir), "%s/tune", dir);
	if (mkdir(tdir, 0755) != 0 && errno != EEXIST) {
		snprintf(msg, msz, "%s: %s", tdir, strerror(errno));
		return DG_ERR_IO;
	}
	fresh = calloc(ts->n, sizeof(*fresh));
	if (!fresh) {
		snprintf(msg, msz, "out of memory");
		return DG_ERR_NOMEM;
	}
	for (; moved < ts->n; moved++) {
		snprintf(from, sizeof(from), "%s/tune/%s", tmp, ts->names[moved]);
		snprintf(to, sizeof(to), "%s/%s", tdir, ts->names[moved]);
		fresh[moved] = lstat(to, &sb) != 0;
		if (rename(from, to) != 0) {
			snprintf(msg, msz, "%s: %s", to, strerror(errno));
			st = DG_ERR_IO;
			break;
		}
	}
	for (size_t i = 0; st && i < moved; i++) {
		snprintf(to, sizeof(to), "%s/%s", tdir, ts->names[i]);
		if (fresh[i])
			unlink(to);
	}
	free(fresh);
	return st;
}

dg_status dg__gen_tuned_manifest(const dg__gen_tuned *ts, char **json, char *msg, size_t msz)
{
	if (!ts->json)
		return DG_OK;
	cJSON *root = cJSON_Parse(*json);
	cJSON *dup = cJSON_Duplicate(ts->json, true);
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
