/*
 * Building a bundle (dg_bundle_build, dragon/runtime.h): compile a set of
 * specs into a bundle folder, what `dragon-gen build` runs.
 *
 * A pool of threads, each with its own dg_ctx (a ctx is single-threaded;
 * NVRTC and the disk cache are safe across threads and processes), takes
 * specs off a shared counter. Every binary goes into a private temp folder
 * DIR/.dragon-build.<pid>.<n>.tmp/; only when all of them compiled and
 * passed dg_cubin_check are they renamed into DIR, and manifest.json is
 * published last (base/publish.h): that rename is the commit. Any failure
 * or a stop before it removes the temp folder (and the folders this build
 * created), so DIR is left exactly as it was.
 *
 * The bundle holds what runs: each auto tile is resolved for the device
 * the bundle is for (the caller's, else the one device the tuning records
 * name for the spec's SM, else none) as the runtime would, and specs that
 * resolve to one kernel are built once (bundle_tuned.c). The manifest
 * (format 2) names the templates, the device, and each entry's launch
 * info. A rebuild into a folder with a bundle in it removes the files the
 * old manifest listed and the new one does not, once the new manifest is
 * in place. With tuned the records used go into DIR/tune/ too, listed in
 * the manifest's "tuning" array.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/msg.h"
#include "base/pool.h"
#include "base/publish.h"
#include "dragon/cubin.h"
#include "dragon/jit.h"
#include "dragon/manifest.h"
#include "runtime/gpu/bundle_int.h"
#include "runtime/store/specset.h"

#define MAX_JOBS DG_POOL_MAX
#define NO_FAILURE SIZE_MAX
#define TEMP_PREFIX ".dragon-build."
/* The longest folder taken: its temp folder and a kernel's name fit 4096. */
#define MAX_OUT 3000
#define MSG_MAX 8192

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* "1 kernel", "3 kernels" */
static const char *plural(size_t n)
{
	return n == 1 ? "" : "s";
}

/* ---- the pool ---------------------------------------------------------------- */

typedef struct pool {
	const dg_bundle_opts *opts;
	const dg__bundle_resolved *r; /* the kernels to build */
	const char *tmp;         /* temp folder the binaries go into */
	dg_ctx_opts ctx_opts;
	pthread_mutex_t mu;      /* guards everything below */
	size_t next;             /* next spec to take */
	size_t done;
	size_t hits;
	bool stopped;            /* opts->stop said so */
	size_t fail_idx;         /* spec that failed first (lowest), or NO_FAILURE */
	bool fail_setup;         /* ...or a thread could not make its ctx */
	dg_status fail_st;
	char fail_msg[MSG_MAX];  /* its full message */
	dg_manifest_kernel *kernels; /* r->n results, in spec order */
} pool;

/* Keeps the failure of the lowest spec index (so -j does not change which
 * one is reported); a setup failure counts as index 0. */
static void record_failure(pool *p, size_t idx, bool setup, dg_status st,
			   const char *msg)
{
	if (p->fail_idx != NO_FAILURE && p->fail_idx <= idx)
		return;
	p->fail_idx = idx;
	p->fail_setup = setup;
	p->fail_st = st;
	snprintf(p->fail_msg, sizeof(p->fail_msg), "%s", msg);
}

/* Copies what the manifest needs from bin into k (k->file already set):
 * the entries with the launch info the template gave them. */
static dg_status describe(dg_manifest_kernel *k, const dg_binary *bin,
			  const uint8_t *bytes, size_t size, char *msg, size_t msz)
{
	size_t n = (size_t)(bin->n_entries > 0 ? bin->n_entries : 1);

	snprintf(k->spec, sizeof(k->spec), "%s", bin->canonical);
	snprintf(k->key, sizeof(k->key), "%s", bin->key);
	k->entries = calloc(n, sizeof(*k->entries));
	k->threads = calloc(n, sizeof(*k->threads));
	k->smem = calloc(n, sizeof(*k->smem));
	if (!k->entries || !k->threads || !k->smem) {
		snprintf(msg, msz, "out of memory describing %s", k->file);
		return DG_ERR_NOMEM;
	}
	for (int e = 0; e < bin->n_entries; e++) {
		k->entries[e] = strdup(bin->entries[e]);
		if (!k->entries[e]) {
			snprintf(msg, msz, "out of memory describing %s", k->file);
			return DG_ERR_NOMEM;
		}
		k->n_entries = e + 1;
		k->threads[e] = bin->block_threads[e];
		k->smem[e] = bin->dyn_smem[e];
		if (k->threads[e] < 1 || k->threads[e] > 1024) {
			snprintf(msg, msz, "%s: the template gives entry %s %d threads a block; a bundle needs 1 to 1024",
				 bin->canonical, bin->entries[e], k->threads[e]);
			return DG_ERR_TEMPLATE;
		}
	}
	k->arch = bin->arch;
	k->ptx = bin->is_ptx;
	k->compile_ms = bin->compile_ms;
	k->cache_hit = bin->cache_hit;
	dg_manifest_kernel_hash(k, bytes, size);
	return DG_OK;
}

/* Compiles spec i, checks it, writes its file into the temp folder. */
static dg_status build_one(pool *p, dg_ctx *ctx, size_t i, char *msg,
			   size_t msz)
{
	const dg_spec *spec = &p->r->specs[i];
	dg_manifest_kernel *k = &p->kernels[i];
	dg_binary *bin = NULL;
	char path[4096], name[128];

	dg_status st = dg_jit_compile(ctx, spec, &bin);
	if (st) {
		snprintf(msg, msz, "%s", dg_ctx_errmsg(ctx));
		return st;
	}
	/* PTX comes with its NUL; the file is plain text. */
	size_t size = bin->image_size;
	if (bin->is_ptx && size && bin->image[size - 1] == '\0')
		size--;
	if (!bin->is_ptx) {
		char why[512];
		st = dg_cubin_check(bin->image, size, bin->arch, why, sizeof(why));
		if (st) {
			snprintf(msg, msz, "%s: NVRTC returned a bad cubin: %s (try without the kernel cache)",
				 bin->canonical, why);
			goto out;
		}
	}
	if (strcmp(bin->canonical, p->r->canonical[i]) != 0) {
		snprintf(msg, msz, "%s: compiled as %s, not as it was planned", p->r->canonical[i],
			 bin->canonical);
		st = DG_ERR_INTERNAL;
		goto out;
	}
	snprintf(name, sizeof(name), "%s-%.16s.%s", dg_op_name(spec->op),
		 bin->key, bin->is_ptx ? "ptx" : "cubin");
	if (!dg__file_join(path, sizeof(path), p->tmp, name)) {
		snprintf(msg, msz, "%s: path too long", p->tmp);
		st = DG_ERR_IO;
		goto out;
	}
	st = dg__file_write(path, bin->image, size, msg, msz);
	if (st)
		goto out;
	k->file = strdup(name);
	if (!k->file) {
		snprintf(msg, msz, "out of memory describing %s", name);
		st = DG_ERR_NOMEM;
	} else {
		st = describe(k, bin, bin->image, size, msg, msz);
	}
out:
	dg_binary_destroy(bin);
	return st;
}

static void *worker(void *arg)
{
	pool *p = arg;
	dg_ctx *ctx = NULL;
	char msg[8192];

	dg_status st = dg_ctx_create(&ctx, &p->ctx_opts);
	if (st) {
		pthread_mutex_lock(&p->mu);
		record_failure(p, 0, true, st,
			       ctx ? dg_ctx_errmsg(ctx) : dg_status_str(st));
		pthread_mutex_unlock(&p->mu);
		dg_ctx_destroy(ctx);
		return NULL;
	}
	for (;;) {
		pthread_mutex_lock(&p->mu);
		if (!p->stopped && p->opts->stop && p->opts->stop(p->opts->user))
			p->stopped = true;
		bool stop = p->stopped || p->fail_idx != NO_FAILURE || p->next == p->r->n;
		size_t i = p->next;
		if (!stop)
			p->next++;
		pthread_mutex_unlock(&p->mu);
		if (stop)
			break;
		st = build_one(p, ctx, i, msg, sizeof(msg));
		pthread_mutex_lock(&p->mu);
		if (st) {
			record_failure(p, i, false, st, msg);
		} else {
			p->done++;
			p->hits += p->kernels[i].cache_hit;
			if (p->opts->progress)
				p->opts->progress(p->opts->user, p->done, p->r->n, p->kernels[i].file);
		}
		pthread_mutex_unlock(&p->mu);
	}
	dg_ctx_destroy(ctx);
	return NULL;
}

/* ---- publishing ------------------------------------------------------------- */

static void iso_now(char *buf, size_t size)
{
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Moves every file from tmp into dir (the records of r too) and syncs
 * the folders, then publishes manifest.json (its text json) whole: the
 * commit (base/publish.h: temp file, fsync, rename, fsync of dir), so
 * after a crash the manifest lists only files that are there. On a
 * failure before the commit unlinks the files it moved that were not
 * there before; *committed: the manifest is in place. */
static dg_status publish(const dg_manifest *m, const dg__bundle_resolved *r, const char *json,
			 const char *tmp, const char *dir, bool *committed, char *msg, size_t msz)
{
	char from[4096], to[4096];
	struct stat sb;
	bool *fresh = calloc(m->n_kernels + 1, sizeof(*fresh));
	size_t moved = 0;
	dg_status st = DG_OK;

	*committed = false;
	if (!fresh) {
		snprintf(msg, msz, "out of memory");
		return DG_ERR_NOMEM;
	}
	for (; moved < m->n_kernels; moved++) {
		const char *f = m->kernels[moved].file;
		if (!dg__file_join(from, sizeof(from), tmp, f) ||
		    !dg__file_join(to, sizeof(to), dir, f)) {
			snprintf(msg, msz, "%s: path too long", dir);
			st = DG_ERR_IO;
			break;
		}
		fresh[moved] = lstat(to, &sb) != 0;
		if (rename(from, to) != 0) {
			snprintf(msg, msz, "%s: %s", to, strerror(errno));
			st = DG_ERR_IO;
			break;
		}
	}
	if (!st)
		st = dg__bundle_records_publish(r, tmp, dir, msg, msz);
	if (!st) /* what the manifest lists is durable before it is */
		st = dg__publish_sync_dir(dir, msg, msz);
	if (!st) {
		dg__publish pb;
		if (!dg__file_join(to, sizeof(to), dir, DG_MANIFEST_FILE)) {
			snprintf(msg, msz, "%s: path too long", dir);
			st = DG_ERR_IO;
		} else if (!(st = dg__publish_begin(&pb, to, 0644, msg, msz)) &&
			   !(st = dg__publish_write(&pb, json, strlen(json), msg, msz))) {
			st = dg__publish_commit(&pb, msg, msz);
		}
		/* a failed sync of the folder comes after the rename */
		*committed = !st || pb.failed == DG__PUBLISH_SYNC_DIR;
	}
	if (st && !*committed) {
		for (size_t i = 0; i < moved; i++) {
			if (!fresh[i])
				continue;
			if (dg__file_join(to, sizeof(to), dir, m->kernels[i].file))
				unlink(to);
		}
	}
	free(fresh);
	return st;
}

/* ---- orphans ------------------------------------------------------------------ */

/* What the bundle already in DIR lists: its kernel files and its tune/
 * records. A manifest that does not read lists nothing (its files stay). */
typedef struct old_bundle {
	char **files; /* kernel files, then "tune/<record>" */
	size_t n;
} old_bundle;

static void old_free(old_bundle *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->files[i]);
	free(o->files);
	memset(o, 0, sizeof(*o));
}

static void old_add(old_bundle *o, const char *name)
{
	char **p = realloc(o->files, (o->n + 1) * sizeof(*p));
	if (!p)
		return; /* out of memory: the file is merely kept */
	o->files = p;
	if ((o->files[o->n] = strdup(name)))
		o->n++;
}

/* A plain file name: no folder, not "." or "..". */
static bool plain_name(const char *s)
{
	return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static void old_load(const char *dir, old_bundle *o)
{
	char msg[1024], path[4096];
	dg_manifest *m = NULL;
	uint8_t *bytes = NULL;
	size_t size = 0;

	memset(o, 0, sizeof(*o));
	if (dg_manifest_load(dir, &m, msg, sizeof(msg)) != DG_OK)
		return;
	for (size_t i = 0; i < m->n_kernels; i++)
		old_add(o, m->kernels[i].file); /* the reader keeps them plain */
	dg_manifest_destroy(m);
	/* the "tuning" array is the build's own field: read it raw */
	if (!dg__file_join(path, sizeof(path), dir, DG_MANIFEST_FILE) ||
	    dg__file_read(path, DG_MANIFEST_MAX_BYTES, &bytes, &size, msg, sizeof(msg)))
		return;
	cJSON *root = cJSON_ParseWithLength((const char *)bytes, size), *t;
	free(bytes);
	cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(root, "tuning")) {
		const cJSON *rec = cJSON_GetObjectItemCaseSensitive(t, "record");
		if (cJSON_IsString(rec) && strncmp(rec->valuestring, "tune/", 5) == 0 &&
		    plain_name(rec->valuestring + 5))
			old_add(o, rec->valuestring);
	}
	cJSON_Delete(root);
}

/* After the new manifest is in place: removes what the old bundle listed
 * and the new one does not (regular files only). */
static void remove_orphans(const char *dir, const old_bundle *o, const dg_manifest *m,
			   const dg__bundle_resolved *r)
{
	char path[4600], rel[320];
	struct stat sb;
	bool records = false;

	for (size_t i = 0; i < o->n; i++) {
		bool keep = strcmp(o->files[i], DG_MANIFEST_FILE) == 0;
		for (size_t k = 0; k < m->n_kernels && !keep; k++)
			keep = strcmp(o->files[i], m->kernels[k].file) == 0;
		for (size_t k = 0; k < r->n_recs && !keep; k++) {
			snprintf(rel, sizeof(rel), "tune/%s", r->rec_names[k]);
			keep = strcmp(o->files[i], rel) == 0;
		}
		if (keep || !dg__file_join(path, sizeof(path), dir, o->files[i]))
			continue;
		if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(path) == 0)
			records |= strncmp(o->files[i], "tune/", 5) == 0;
	}
	if (records && dg__file_join(path, sizeof(path), dir, "tune"))
		rmdir(path); /* only if it is now empty */
	(void)dg__publish_sync_dir(dir, NULL, 0); /* housekeeping: best effort */
}

/* The manifest's text (with the "tuning" array, if any) into *json,
 * after reading it back as inspect will. */
static dg_status manifest_text(const dg_manifest *m, const dg__bundle_resolved *r, char **json,
			       char *msg, size_t msz)
{
	dg_manifest *back = NULL;

	dg_status st = dg_manifest_to_json(m, json, msg, msz);
	if (!st)
		st = dg__bundle_tuning_manifest(r, json, msg, msz);
	if (st)
		return st;
	st = dg_manifest_parse(*json, strlen(*json), &back, msg, msz);
	dg_manifest_destroy(back);
	if (st)
		return DG_ERR_INTERNAL; /* we wrote something we cannot read */
	return DG_OK;
}

/* Temp folders of builds whose process is gone (killed mid-build). */
static void remove_stale_temps(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long pid;
		size_t len = strlen(e->d_name);
		if (sscanf(e->d_name, TEMP_PREFIX "%ld.", &pid) != 1 || pid <= 0 || len < 4 ||
		    strcmp(e->d_name + len - 4, ".tmp") != 0)
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		char path[4096];
		if (dg__file_join(path, sizeof(path), dir, e->d_name))
			dg__file_remove_tree(path);
	}
	if (d)
		closedir(d);
}

/* ---- the build ---------------------------------------------------------------- */

/* What one build holds between its steps. */
typedef struct build {
	const dg_bundle_opts *opts;
	dg_bundle_summary *sum;
	dg_codegen *cg;
	dg__specset set;       /* the default build set, or the caller's specs */
	dg__bundle_resolved r;
	dg_manifest *m;
	char tmp[4096];
	char msg[MSG_MAX];
} build;

/* Fails step with status st and the message (printf format). */
static dg_status fail(build *b, dg_bundle_step step, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static dg_status fail(build *b, dg_bundle_step step, dg_status st, const char *fmt, ...)
{
	char text[MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	snprintf(b->msg, sizeof(b->msg), "%s", text);
	b->sum->step = step;
	return st;
}

/* The caller's specs into b->set: each checked as a spec flag's value is
 * (the op's rules, NVRTC's arch range, its template's plan), normalized,
 * with its text. */
static dg_status take_specs(build *b)
{
	const dg_bundle_opts *o = b->opts;
	char why[1024], text[DG_SPEC_TEXT_MAX];

	b->set.specs = calloc(o->n_specs, sizeof(*b->set.specs));
	b->set.canonical = calloc(o->n_specs, sizeof(*b->set.canonical));
	if (!b->set.specs || !b->set.canonical)
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < o->n_specs; i++) {
		dg_spec s = o->specs[i];
		dg_status st = dg_spec_validate(&s, why, sizeof(why));
		if (!st)
			st = dg_jit_check_arch(s.arch, s.arch_specific, why, sizeof(why));
		dg_plan pl;
		if (!st && (st = dg_codegen_plan(b->cg, &s, &pl)))
			snprintf(why, sizeof(why), "%s", dg_codegen_errmsg(b->cg));
		if (st)
			return fail(b, DG_BUNDLE_STEP_ARGS, st, "specs[%zu]: %s", i, why);
		dg_spec_normalize(&s);
		if (dg_spec_to_string(&s, text, sizeof(text)))
			return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_SPEC,
				    "specs[%zu]: spec text too long", i);
		b->set.canonical[i] = strdup(text);
		if (!b->set.canonical[i])
			return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_NOMEM, "out of memory");
		b->set.specs[i] = s;
		b->set.n = i + 1;
	}
	return DG_OK;
}

/* The specs, resolved for the device: the kernels to build. */
static dg_status plan_kernels(build *b)
{
	const dg_bundle_opts *o = b->opts;
	dg__bundle_tune t;
	dg_status st;

	if (o->specs) {
		st = take_specs(b);
	} else {
		dg__spec_flags none;
		char line[1200];
		memset(&none, 0, sizeof(none));
		st = dg__specset_expand(b->cg, &none, &b->set, b->msg, sizeof(b->msg));
		if (st)
			return fail(b, DG_BUNDLE_STEP_PLAN, st, "the default build set: %.8000s", b->msg);
		if (dg__specset_dropped_line(&b->set, line, sizeof(line)))
			dg__bundle_note(o, 0, "%s", line);
		b->sum->dropped = b->set.dropped;
	}
	if (st)
		return st;
	b->sum->specs = b->set.n;
	st = dg__bundle_tune_open(o, &t, b->msg, sizeof(b->msg));
	if (st)
		return fail(b, DG_BUNDLE_STEP_ARGS, st, "%.8000s", b->msg);
	st = dg__bundle_resolve(o, &t, b->cg, b->set.specs, b->set.canonical, b->set.n, o->tuned,
				&b->r, b->msg, sizeof(b->msg));
	dg__bundle_tune_close(&t);
	if (st)
		return fail(b, DG_BUNDLE_STEP_PLAN, st, "%.8000s", b->msg);
	dg__bundle_note(o, 1, "%zu spec%s resolve%s to %zu kernel%s", b->set.n, plural(b->set.n),
			b->set.n == 1 ? "s" : "", b->r.n, plural(b->r.n));
	snprintf(b->sum->device, sizeof(b->sum->device), "%s", b->r.device);
	b->sum->sm = b->r.sm;
	return DG_OK;
}

/* Compile into b->tmp (which exists and is empty), then publish. */
static dg_status compile_and_publish(build *b)
{
	const dg_bundle_opts *o = b->opts;
	const dg__bundle_resolved *r = &b->r;
	dg_manifest *m = b->m;
	char why[MSG_MAX], when[32];
	char *json = NULL;
	old_bundle old;
	pool p;

	memset(&p, 0, sizeof(p));
	p.opts = o;
	p.r = r;
	p.tmp = b->tmp;
	if (o->jit)
		p.ctx_opts = *o->jit;
	p.fail_idx = NO_FAILURE;
	p.kernels = m->kernels;
	long jobs = o->jobs > 0 ? o->jobs : sysconf(_SC_NPROCESSORS_ONLN);
	if (jobs < 1)
		jobs = 1;
	if (jobs > MAX_JOBS)
		jobs = MAX_JOBS;
	if (jobs > (long)r->n)
		jobs = (long)r->n;
	b->sum->jobs = (int)jobs;
	double t0 = now_ms();
	if (o->progress)
		o->progress(o->user, 0, r->n, NULL);
	pthread_mutex_init(&p.mu, NULL);
	dg__pool_run(worker, &p, (int)jobs);
	pthread_mutex_destroy(&p.mu);
	b->sum->cache_hits = p.hits;

	if (p.stopped || (o->stop && o->stop(o->user)))
		return fail(b, DG_BUNDLE_STEP_COMPILE, DG_ERR_INTERRUPTED, "interrupted; %s left as it was",
			    o->out);
	if (p.fail_idx != NO_FAILURE) {
		if (!p.fail_setup)
			snprintf(b->sum->failed, sizeof(b->sum->failed), "%s", r->canonical[p.fail_idx]);
		return fail(b, DG_BUNDLE_STEP_COMPILE, p.fail_st, "%s", p.fail_msg);
	}
	iso_now(when, sizeof(when));
	m->format = DG_MANIFEST_FORMAT;
	m->generator_version = strdup(DG_GENERATOR_VERSION);
	m->nvrtc_version = strdup(dg_nvrtc_version());
	m->created = strdup(when);
	m->device = strdup(r->device);
	m->sm = r->sm;
	snprintf(m->template_hash, sizeof(m->template_hash), "%s", dg_codegen_template_hash(b->cg));
	if (!m->generator_version || !m->nvrtc_version || !m->created || !m->device)
		return fail(b, DG_BUNDLE_STEP_PUBLISH, DG_ERR_NOMEM, "out of memory");
	old_load(o->out, &old);
	dg_status st = dg__bundle_records_write(r, b->tmp, why, sizeof(why));
	if (!st)
		st = manifest_text(m, r, &json, why, sizeof(why));
	bool committed = false;
	if (!st)
		st = publish(m, r, json, b->tmp, o->out, &committed, why, sizeof(why));
	free(json);
	if (st) {
		old_free(&old);
		if (committed)
			return fail(b, DG_BUNDLE_STEP_PUBLISH, st,
				    "%.7000s; the bundle is in place but may not survive a power loss", why);
		return fail(b, DG_BUNDLE_STEP_PUBLISH, st, "%.7000s; %s left as it was", why, o->out);
	}
	remove_orphans(o->out, &old, m, r);
	old_free(&old);
	b->sum->wall_ms = now_ms() - t0;
	return DG_OK;
}

/* The checks of the options that need nothing built. */
static dg_status check_opts(build *b)
{
	const dg_bundle_opts *o = b->opts;

	if (!o->out || !o->out[0])
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG,
			    "no bundle folder: give opts.out, the folder to build into");
	if (strlen(o->out) > MAX_OUT)
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG,
			    "bundle folder '%.60s...': a name of at most %d characters", o->out, MAX_OUT);
	if (o->specs && o->n_specs == 0)
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG,
			    "no specs to build: the list is empty (no list at all builds the default build set)");
	if (!o->specs && o->n_specs)
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG,
			    "%zu specs and no list of them", o->n_specs);
	if (o->jobs < 0 || o->jobs > MAX_JOBS)
		return fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG,
			    "jobs %d: give 1 to %d, or 0 for the online CPUs", o->jobs, MAX_JOBS);
	return DG_OK;
}

dg_status dg_bundle_build(const dg_bundle_opts *opts, dg_bundle_summary *summary, char *msg,
			  size_t msg_size)
{
	static atomic_uint seq; /* temp folders of one process's builds differ */
	dg_bundle_summary local;
	char made[4096] = "";
	bool have_tmp = false;
	dg_status st;

	build *b = calloc(1, sizeof(*b));
	if (!summary)
		summary = &local;
	memset(summary, 0, sizeof(*summary));
	if (!b) {
		summary->step = DG_BUNDLE_STEP_ARGS;
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	}
	b->sum = summary;
	b->opts = opts;
	if (!opts) {
		st = fail(b, DG_BUNDLE_STEP_ARGS, DG_ERR_INVALID_ARG, "dg_bundle_build: NULL options");
		goto out;
	}
	if ((st = check_opts(b)))
		goto out;
	dg_codegen_opts co;
	memset(&co, 0, sizeof(co));
	co.template_dir = opts->jit ? opts->jit->template_dir : NULL;
	st = dg_codegen_create(&b->cg, &co);
	if (st) {
		st = fail(b, DG_BUNDLE_STEP_PLAN, st, "%s",
			  b->cg ? dg_codegen_errmsg(b->cg) : dg_status_str(st));
		goto out;
	}
	if ((st = plan_kernels(b)))
		goto out;
	b->m = calloc(1, sizeof(*b->m));
	if (b->m)
		b->m->kernels = calloc(b->r.n ? b->r.n : 1, sizeof(*b->m->kernels));
	if (!b->m || !b->m->kernels) {
		st = fail(b, DG_BUNDLE_STEP_PLAN, DG_ERR_NOMEM, "out of memory");
		goto out;
	}
	b->m->n_kernels = b->r.n;
	summary->kernels = b->r.n;
	st = dg__file_mkdirs(opts->out, made, sizeof(made), b->msg, sizeof(b->msg));
	if (st) {
		b->sum->step = DG_BUNDLE_STEP_FOLDER;
		goto out;
	}
	remove_stale_temps(opts->out);
	char tname[80];
	snprintf(tname, sizeof(tname), TEMP_PREFIX "%ld.%u.tmp", (long)getpid(),
		 atomic_fetch_add(&seq, 1u));
	if (!dg__file_join(b->tmp, sizeof(b->tmp), opts->out, tname)) {
		st = fail(b, DG_BUNDLE_STEP_FOLDER, DG_ERR_INVALID_ARG, "%s: path too long", opts->out);
		goto out;
	}
	dg__file_remove_tree(b->tmp);
	if (mkdir(b->tmp, 0755) != 0) {
		st = fail(b, DG_BUNDLE_STEP_FOLDER, DG_ERR_IO, "%s: %s", b->tmp, strerror(errno));
		goto out;
	}
	have_tmp = true;
	st = compile_and_publish(b);
out:
	if (have_tmp)
		dg__file_remove_tree(b->tmp);
	if (st && opts)
		dg__file_rmdirs(opts->out, made);
	if (st)
		dg__msgf(st, msg, msg_size, "%s", b->msg);
	else if (msg && msg_size)
		msg[0] = '\0';
	dg_manifest_destroy(b->m);
	dg__bundle_resolved_free(&b->r);
	dg__specset_free(&b->set);
	dg_codegen_destroy(b->cg);
	free(b);
	return st;
}

dg_status dg_bundle_default_specs(dg_spec **out, size_t *n, char *msg, size_t msg_size)
{
	dg_codegen *cg = NULL;
	dg__spec_flags none;
	dg__specset set;
	char why[1024];

	if (!out || !n)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_bundle_default_specs: NULL argument");
	*out = NULL;
	*n = 0;
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		dg__msgf(st, msg, msg_size, "%s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		dg_codegen_destroy(cg);
		return st;
	}
	memset(&none, 0, sizeof(none));
	st = dg__specset_expand(cg, &none, &set, why, sizeof(why));
	dg_codegen_destroy(cg);
	if (st)
		return dg__msgf(st, msg, msg_size, "the default build set: %s", why);
	*out = set.specs; /* calloc'd: the caller frees it */
	*n = set.n;
	set.specs = NULL;
	dg__specset_free(&set);
	if (msg && msg_size)
		msg[0] = '\0';
	return DG_OK;
}
