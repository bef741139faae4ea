/*
 * The tuning DB: every record under the DB path, merged by key
 * (canonical spec without tile, device name, device SM), and the lookup
 * the JIT does for an auto tile.
 *
 * Merging: records copied from several machines (or several sweeps of
 * one) may name the same key. The newest date wins (dates are ISO-8601
 * UTC, so text order is time order); on equal dates the record whose path
 * sorts last wins, so the outcome does not depend on the order files are
 * listed in. Records of other devices are left out when the DB is opened
 * for one device.
 *
 * Below the user's records serve the records of the devices dragon was
 * tuned on, built into the library (runtime/tunedb/records/, embedded at build
 * time): a user record of a key always wins over a built-in one, whatever
 * the dates, so an H200 user gets tuned tiles with no set-up and keeps
 * whatever they tune themselves.
 *
 * Beside the tiles' records the DB holds the attention's form records
 * (attention_form-*.json, runtime/tunedb/form.h: which form and chunk
 * the attention takes by T for a shape), merged by their own key the same
 * way: the user's over a built-in one, else the newest.
 *
 * A DB never fails to open over a bad record: an unreadable, truncated or
 * malformed file is skipped and its message kept (dg_tune_db_problem),
 * because one stray file in a shared folder must not stop training.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/embedded.h"
#include "base/file.h"
#include "base/fnv.h"
#include "dragon/cache.h"
#include "dragon/tune.h"
#include "runtime/tunedb/form.h"

typedef struct entry {
	struct entry *next; /* hash chain */
	uint64_t hash;
	char *key;          /* spec text \n device name \n sm */
	dg_tune_record *rec;
	bool builtin;       /* a record built into the library */
} entry;

struct dg_tune_db {
	char *where;
	entry **buckets;
	size_t n_buckets, n_entries;
	size_t n_other;
	size_t n_builtin;   /* entries holding a built-in record */
	char **problems;
	size_t n_problems, cap_problems;
	dg__attn_form *forms; /* the attention's forms (runtime/tunedb/form.h), a key each */
	size_t n_forms, cap_forms;
	bool oom;
};

/* "spec\ndevice\nsm" (malloc'd), or NULL when out of memory. */
static char *make_key(const char *spec_text, const char *device, int sm)
{
	size_t n = strlen(spec_text) + strlen(device) + 16;
	char *k = malloc(n);
	if (k)
		snprintf(k, n, "%s\n%s\n%d", spec_text, device, sm);
	return k;
}

static void problem(dg_tune_db *db, const char *msg)
{
	if (db->n_problems == db->cap_problems) {
		size_t cap = db->cap_problems ? db->cap_problems * 2 : 8;
		char **p = realloc(db->problems, cap * sizeof(*p));
		if (!p) {
			db->oom = true;
			return;
		}
		db->problems = p;
		db->cap_problems = cap;
	}
	char *m = strdup(msg);
	if (!m) {
		db->oom = true;
		return;
	}
	db->problems[db->n_problems++] = m;
}

static entry *find(const dg_tune_db *db, uint64_t h, const char *key)
{
	if (!db->n_buckets)
		return NULL;
	for (entry *e = db->buckets[h % db->n_buckets]; e; e = e->next)
		if (e->hash == h && strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* true when a is newer than b (see the merge rule above). */
static bool newer(const dg_tune_record *a, const dg_tune_record *b)
{
	int d = strcmp(a->date, b->date);
	if (d)
		return d > 0;
	return strcmp(a->path ? a->path : "", b->path ? b->path : "") > 0;
}

/* Takes r (keeps it or destroys it). */
static void add_record(dg_tune_db *db, dg_tune_record *r, const char *device, int sm,
		       bool builtin)
{
	if ((device && strcmp(r->device.name, device) != 0) || (sm > 0 && r->device.sm != sm)) {
		db->n_other++;
		dg_tune_record_destroy(r);
		return;
	}
	char *key = make_key(r->spec_text, r->device.name, r->device.sm);
	if (!key) {
		db->oom = true;
		dg_tune_record_destroy(r);
		return;
	}
	uint64_t h = dg__fnv1a(key);
	entry *e = find(db, h, key);
	if (e) {
		free(key);
		/* a user record over a built-in one; else the newest */
		bool take = e->builtin != builtin ? e->builtin : newer(r, e->rec);
		if (take) {
			dg_tune_record_destroy(e->rec);
			e->rec = r;
			db->n_builtin -= e->builtin;
			e->builtin = builtin;
			db->n_builtin += builtin;
		} else {
			dg_tune_record_destroy(r);
		}
		return;
	}
	if (db->n_entries + 1 > 2 * db->n_buckets) {
		size_t nb = db->n_buckets ? db->n_buckets * 4 : 64;
		entry **b = calloc(nb, sizeof(*b));
		if (!b) {
			db->oom = true;
			free(key);
			dg_tune_record_destroy(r);
			return;
		}
		for (size_t i = 0; i < db->n_buckets; i++)
			for (entry *x = db->buckets[i], *next; x; x = next) {
				next = x->next;
				x->next = b[x->hash % nb];
				b[x->hash % nb] = x;
			}
		free(db->buckets);
		db->buckets = b;
		db->n_buckets = nb;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		db->oom = true;
		free(key);
		dg_tune_record_destroy(r);
		return;
	}
	e->hash = h;
	e->key = key;
	e->rec = r;
	e->builtin = builtin;
	db->n_builtin += builtin;
	e->next = db->buckets[h % db->n_buckets];
	db->buckets[h % db->n_buckets] = e;
	db->n_entries++;
}

/* Takes f's path: keeps the form of its key from the user's DB over a
 * built-in one, else the newest (the path's order on equal dates). */
static void add_form(dg_tune_db *db, dg__attn_form *f, const char *device, int sm)
{
	if ((device && strcmp(f->device, device) != 0) || (sm > 0 && f->sm != sm)) {
		db->n_other++;
		free(f->path);
		return;
	}
	for (size_t i = 0; i < db->n_forms; i++) {
		dg__attn_form *e = &db->forms[i];
		if (e->sm != f->sm || e->heads != f->heads || e->latent != f->latent || e->embd != f->embd ||
		    e->act != f->act || strcmp(e->device, f->device) != 0)
			continue;
		int d = strcmp(f->date, e->date);
		bool take = e->builtin != f->builtin ? e->builtin
						     : d ? d > 0 : strcmp(f->path, e->path) > 0;
		if (take) {
			free(e->path);
			*e = *f;
		} else {
			free(f->path);
		}
		return;
	}
	if (db->n_forms == db->cap_forms) {
		size_t cap = db->cap_forms ? db->cap_forms * 2 : 4;
		dg__attn_form *p = realloc(db->forms, cap * sizeof(*p));
		if (!p) {
			db->oom = true;
			free(f->path);
			return;
		}
		db->forms = p;
		db->cap_forms = cap;
	}
	db->forms[db->n_forms++] = *f;
}

/* A form record's bytes (name: where they came from). */
static void load_form(dg_tune_db *db, const char *text, size_t len, const char *name, const char *device,
		      int sm, bool builtin)
{
	char msg[1024];
	dg__attn_form f;
	dg_status st = dg__attn_form_parse(text, len, name, &f, msg, sizeof(msg));
	if (st == DG_ERR_NOMEM)
		db->oom = true;
	else if (st)
		problem(db, msg);
	else {
		f.builtin = builtin;
		add_form(db, &f, device, sm);
	}
}

/* A form record's file (at most 16 MiB, as a tile record). */
static void load_form_file(dg_tune_db *db, const char *path, const char *device, int sm)
{
	char msg[1024];
	uint8_t *buf = NULL;
	size_t n = 0;
	dg_status st = dg__file_read(path, (size_t)16 << 20, &buf, &n, msg, sizeof(msg));
	if (st == DG_ERR_NOMEM)
		db->oom = true;
	else if (st)
		problem(db, msg);
	else
		load_form(db, (const char *)buf, n, path, device, sm, false);
	free(buf);
}

static void load_file(dg_tune_db *db, const char *path, const char *device, int sm)
{
	char msg[1024];
	dg_tune_record *r = NULL;
	if (dg__attn_form_file(path)) {
		load_form_file(db, path, device, sm);
		return;
	}
	dg_status st = dg_tune_record_load(path, &r, msg, sizeof(msg));

	if (st == DG_ERR_NOMEM) {
		db->oom = true;
		return;
	}
	if (st) {
		problem(db, msg);
		return;
	}
	add_record(db, r, device, sm, false);
}

/* The records built into the library ("built-in:<file>" in messages). */
static void load_builtin(dg_tune_db *db, const char *device, int sm)
{
	for (size_t i = 0; i < dg__tune_records_count && !db->oom; i++) {
		const dg__embedded_file *f = &dg__tune_records[i];
		char name[300], msg[1024];
		dg_tune_record *r = NULL;
		snprintf(name, sizeof(name), "built-in:%s", f->name);
		if (dg__attn_form_file(name)) {
			load_form(db, (const char *)f->bytes, f->size, name, device, sm, true);
			continue;
		}
		dg_status st = dg_tune_record_parse((const char *)f->bytes, f->size, name, &r, msg,
						    sizeof(msg));
		if (st == DG_ERR_NOMEM) {
			db->oom = true;
		} else if (st) {
			problem(db, msg);
		} else {
			free(r->path);
			r->path = strdup(name);
			if (!r->path) {
				db->oom = true;
				dg_tune_record_destroy(r);
			} else {
				add_record(db, r, device, sm, true);
			}
		}
	}
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every *.json of a folder, in name order (temp files of writers,
 * <name>.tmp.<pid>.<hex>, are not records). */
static void load_dir(dg_tune_db *db, const char *dir, const char *device, int sm)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;

	if (!d) {
		if (errno != ENOENT) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s: %s", dir, strerror(errno));
			problem(db, msg);
		}
		return;
	}
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		if (len < 6 || de->d_name[0] == '.' || strcmp(de->d_name + len - 5, ".json") != 0)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 16;
			char **p = realloc(names, cap * sizeof(*p));
			if (!p) {
				db->oom = true;
				break;
			}
			names = p;
		}
		size_t plen = strlen(dir) + len + 2;
		names[n] = malloc(plen);
		if (!names[n]) {
			db->oom = true;
			break;
		}
		snprintf(names[n], plen, "%s/%s", dir, de->d_name);
		n++;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		if (!db->oom)
			load_file(db, names[i], device, sm);
		free(names[i]);
	}
	free(names);
}

static void load_path(dg_tune_db *db, const char *path, const char *device, int sm)
{
	struct stat sb;

	if (stat(path, &sb) != 0) {
		if (errno != ENOENT) {
			char msg[1024];
			snprintf(msg, sizeof(msg), "%s: %s", path, strerror(errno));
			problem(db, msg);
		}
		return;
	}
	if (S_ISDIR(sb.st_mode))
		load_dir(db, path, device, sm);
	else
		load_file(db, path, device, sm);
}

/* The path list: opts->path, $DRAGON_TUNE_DB, or <cache root>/tune
 * ("none": no records at all; "builtin": the built-in ones alone). */
static char *choose_where(const dg_tune_db_opts *o)
{
	const char *env = getenv("DRAGON_TUNE_DB");

	if (o && o->path)
		return strdup(o->path);
	if (env && env[0])
		return strdup(env);
	const char *root = o ? o->cache_root : NULL;
	dg_cache *c = NULL;
	if (!root) {
		/* looking for records makes no cache folder */
		dg_cache_opts co = { .no_create = true };
		if (dg_cache_open(&c, &co) == DG_OK)
			root = dg_cache_root(c);
	}
	char *w = NULL;
	if (root) {
		size_t n = strlen(root) + 6;
		w = malloc(n);
		if (w)
			snprintf(w, n, "%s/tune", root);
	} else {
		w = strdup("none"); /* no cache folder: no default DB */
	}
	dg_cache_close(c);
	return w;
}

dg_status dg_tune_db_open(dg_tune_db **out, const dg_tune_db_opts *opts)
{
	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	dg_tune_db *db = calloc(1, sizeof(*db));
	if (!db)
		return DG_ERR_NOMEM;
	db->where = choose_where(opts);
	if (!db->where) {
		dg_tune_db_close(db);
		return DG_ERR_NOMEM;
	}
	const char *device = opts ? opts->device : NULL;
	int sm = opts ? opts->sm : 0;
	if (strcmp(db->where, "none") != 0)
		load_builtin(db, device, sm);
	if (strcmp(db->where, "none") != 0 && strcmp(db->where, "builtin") != 0) {
		char *list = strdup(db->where), *save = NULL;
		if (!list)
			db->oom = true;
		for (char *p = list ? strtok_r(list, ":", &save) : NULL; p && !db->oom;
		     p = strtok_r(NULL, ":", &save))
			load_path(db, p, device, sm);
		free(list);
	}
	if (db->oom) {
		dg_tune_db_close(db);
		return DG_ERR_NOMEM;
	}
	*out = db;
	return DG_OK;
}

void dg_tune_db_close(dg_tune_db *db)
{
	if (!db)
		return;
	for (size_t i = 0; i < db->n_buckets; i++)
		for (entry *e = db->buckets[i], *next; e; e = next) {
			next = e->next;
			dg_tune_record_destroy(e->rec);
			free(e->key);
			free(e);
		}
	free(db->buckets);
	for (size_t i = 0; i < db->n_problems; i++)
		free(db->problems[i]);
	free(db->problems);
	for (size_t i = 0; i < db->n_forms; i++)
		free(db->forms[i].path);
	free(db->forms);
	free(db->where);
	free(db);
}

bool dg__tune_db_attn_chunk(const dg_tune_db *db, const char *device, int sm, int heads, int latent, int embd,
			    dg_fmt act, int t, int *chunk, const char **why)
{
	for (size_t i = 0; db && device && i < db->n_forms; i++) {
		const dg__attn_form *f = &db->forms[i];
		if (f->sm != sm || f->heads != heads || f->latent != latent || f->embd != embd || f->act != act ||
		    strcmp(f->device, device) != 0)
			continue;
		int c = 0;
		for (int k = 0; k < f->n && f->from_t[k] <= t; k++)
			c = f->chunk[k];
		while (c >= 64 && t % c) /* the largest multiple of 64 up to it that divides T */
			c -= 64;
		*chunk = c >= 64 ? c : 0;
		if (why)
			*why = f->path;
		return true;
	}
	return false;
}

const char *dg_tune_db_where(const dg_tune_db *db)
{
	return db ? db->where : "none";
}

size_t dg_tune_db_size(const dg_tune_db *db)
{
	return db ? db->n_entries : 0;
}

size_t dg_tune_db_n_builtin(const dg_tune_db *db)
{
	return db ? db->n_builtin : 0;
}

size_t dg_tune_db_n_other_device(const dg_tune_db *db)
{
	return db ? db->n_other : 0;
}

size_t dg_tune_db_n_problems(const dg_tune_db *db)
{
	return db ? db->n_problems : 0;
}

const char *dg_tune_db_problem(const dg_tune_db *db, size_t i)
{
	return db && i < db->n_problems ? db->problems[i] : "";
}

size_t dg_tune_db_devices(const dg_tune_db *db, dg_tune_device *out, size_t max)
{
	dg_tune_device seen[64];
	size_t n = 0, total = 0;

	for (size_t i = 0; db && i < db->n_buckets; i++)
		for (entry *e = db->buckets[i]; e; e = e->next) {
			const dg_tune_device *d = &e->rec->device;
			bool dup = false;
			for (size_t k = 0; k < n && !dup; k++)
				dup = seen[k].sm == d->sm && strcmp(seen[k].name, d->name) == 0;
			if (dup)
				continue;
			if (n < sizeof(seen) / sizeof(seen[0]))
				seen[n++] = *d;
			if (out && total < max)
				out[total] = *d;
			total++;
		}
	return total;
}

/* The entry of (s normalized, device, sm), or NULL. */
static const entry *lookup(const dg_tune_db *db, const dg_spec *s, const char *device, int sm)
{
	char text[DG_SPEC_TEXT_MAX];
	dg_spec_to_string(s, text, sizeof(text));
	char *key = make_key(text, device, sm);
	const entry *e = key ? find(db, dg__fnv1a(key), key) : NULL;
	free(key);
	return e;
}

const dg_tune_record *dg_tune_db_record(const dg_tune_db *db, const dg_spec *spec,
					const char *device, int sm)
{
	if (!db || !spec || !device)
		return NULL;
	dg_spec s = *spec;
	dg_spec_normalize(&s);
	s.tile = (dg_tile){ 0 }; /* records are keyed by the auto-tile spec */
	const entry *e = lookup(db, &s, device, sm > 0 ? sm : s.arch);
	return e ? e->rec : NULL;
}

dg_status dg_tune_resolve(dg_codegen *cg, const dg_tune_db *db, const dg_spec *spec,
			  const char *device, int sm, dg_tune_choice *out)
{
	dg_spec s = *spec;

	memset(out, 0, sizeof(*out));
	dg_spec_normalize(&s);
	int dev_sm = sm > 0 ? sm : s.arch;
	if (!(dg_spec_uses(s.op) & DG_FIELD_TILE)) {
		snprintf(out->why, sizeof(out->why), "op %s takes no tile", dg_op_name(s.op));
	} else if (!dg_tile_is_auto(&s.tile)) {
		snprintf(out->why, sizeof(out->why), "the spec names its tile");
	} else if (!db || strcmp(db->where, "none") == 0) {
		snprintf(out->why, sizeof(out->why), "no tuning DB");
	} else if (!device || !device[0]) {
		snprintf(out->why, sizeof(out->why), "no device named to look records up for");
	} else {
		const entry *e = lookup(db, &s, device, dev_sm);
		if (!e) {
			snprintf(out->why, sizeof(out->why), "no record for %s (sm_%d) in %.300s",
				 device, dev_sm, db->where);
		} else if (e->rec->winner < 0) {
			snprintf(out->why, sizeof(out->why), "%.400s: the sweep found no winner",
				 e->rec->path ? e->rec->path : "record");
		} else {
			const dg_tune_cand *w = &e->rec->cands[e->rec->winner];
			dg_spec t = s;
			t.tile = w->tile;
			t.arch_specific = w->arch_specific;
			if (dg_codegen_plan(cg, &t, &out->plan) != DG_OK) {
				snprintf(out->why, sizeof(out->why),
					 "%.300s: the tuned tile is no longer valid: %.150s",
					 e->rec->path ? e->rec->path : "record", dg_codegen_errmsg(cg));
			} else {
				out->spec = out->plan.spec;
				out->tuned = true;
				snprintf(out->record, sizeof(out->record), "%s",
					 e->rec->path ? e->rec->path : "");
				snprintf(out->date, sizeof(out->date), "%s", e->rec->date);
				return DG_OK;
			}
		}
	}
	dg_status st = dg_codegen_plan_for(cg, &s, dev_sm, &out->plan);
	if (st)
		return st;
	out->spec = out->plan.spec;
	return DG_OK;
}
