/*
 * dragon-gen build: compile a set of specs into a bundle folder.
 *
 * A pool of threads, each with its own dg_ctx (a ctx is single-threaded;
 * NVRTC and the disk cache are safe across threads and processes), takes
 * specs off a shared counter. Every binary goes into a private temp folder
 * DIR/.dragon-build.<pid>.tmp/; only when all of them compiled and passed
 * dg_cubin_check are they renamed into DIR, and manifest.json is renamed
 * in last: that rename is the commit. Any failure or SIGINT/SIGTERM before
 * it removes the temp folder (and the folders this build created), so DIR
 * is left exactly as it was.
 *
 * The bundle holds what runs: each auto tile is resolved for the device
 * the bundle is for (--device/--sm, else the one device the tuning
 * records name for the spec's SM, else none) as the runtime would, and
 * specs that resolve to one kernel are built once (build_tuned.c). The
 * manifest (format 2) names the templates, the device, and each entry's
 * launch info. A rebuild into a folder with a bundle in it removes the
 * files the old manifest listed and the new one does not, once the new
 * manifest is in place. --tuned also puts the records used into
 * DIR/tune/ and lists them in the manifest's "tuning" array.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/publish.h"
#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/common/progress.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/cubin.h"
#include "dragon/jit.h"
#include "dragon/manifest.h"

#define MAX_JOBS 1024
#define NO_FAILURE SIZE_MAX

enum {
	OPT_HELP = 1, OPT_OUT, OPT_JOBS, OPT_JSON, OPT_NO_CACHE, OPT_CACHE_DIR,
	OPT_PROGRESS, OPT_VERBOSE, OPT_QUIET, OPT_TUNED, OPT_DEVICE, OPT_SM, OPT_TUNE_DB,
};

static const dg__cli_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "out", 'o', true, OPT_OUT },
	{ "jobs", 'j', true, OPT_JOBS },
	{ "json", 0, false, OPT_JSON },
	{ "no-cache", 0, false, OPT_NO_CACHE },
	{ "cache-dir", 0, true, OPT_CACHE_DIR },
	{ "progress", 0, false, OPT_PROGRESS },
	{ "verbose", 'v', false, OPT_VERBOSE },
	{ "quiet", 'q', false, OPT_QUIET },
	{ "tuned", 0, false, OPT_TUNED },
	{ "device", 0, true, OPT_DEVICE },
	{ "sm", 0, true, OPT_SM },
	{ "tune-db", 0, true, OPT_TUNE_DB },
	DG__SPEC_OPTS
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen build [spec flags] [--out DIR] [-j N] [--json]\n"
	       "                        [--no-cache | --cache-dir DIR] [--tuned]\n"
	       "                        [--device NAME --sm N | --device none] [--tune-db PATH]\n\n"
	       "Compiles every spec of the product of the spec flags (or the default\n"
	       "build set) with NVRTC, through the kernel cache, into DIR: one\n"
	       "<op>-<key16>.cubin (.ptx past what NVRTC emits SASS for) per kernel and\n"
	       "manifest.json. Each auto tile is resolved as the runtime resolves it on\n"
	       "the device (a tuning record, else the template's default), so the\n"
	       "bundle holds what runs. DIR changes only if every kernel builds; files\n"
	       "an earlier bundle in DIR listed and this one does not are removed.\n\n"
	       "  -o, --out DIR      bundle folder (default ./dragon-kernels)\n"
	       "  -j, --jobs N       compile N specs at a time (default: online CPUs)\n"
	       "      --json         print the manifest and timings on stdout\n"
	       "      --no-cache     compile everything, read and write no cache\n"
	       "      --cache-dir D  kernel cache root (default $DRAGON_CACHE_DIR, ...)\n"
	       "      --progress     progress on stderr even when it is not a terminal\n"
	       "  -v, --verbose      each tile's choice; full compile errors\n"
	       "  -q, --quiet        no summary line\n"
	       "      --device NAME  with --sm N: the device the bundle is for (default:\n"
	       "                     the one device the tuning records name for the\n"
	       "                     spec's SM); --device none: resolve for no device\n"
	       "      --tune-db PATH tuning records: a file or folder (default\n"
	       "                     $DRAGON_TUNE_DB, else <cache root>/tune; the\n"
	       "                     built-in records below them; none: no records)\n"
	       "      --tuned        also put the records used into DIR/tune/ and say\n"
	       "                     in the manifest where each tile came from\n"
	       "  -h, --help         this text\n\n");
	dg__specset_help(stdout, true);
	printf("\nExample: dragon-gen build --op lowrank_fwd --weight int8,ternary --relu none,0 -j4\n");
}

/* ---- signals --------------------------------------------------------------- */

static volatile sig_atomic_t interrupted;
static const int caught[] = { SIGINT, SIGTERM, SIGHUP };

/* First signal: stop taking specs and clean up. Second: die now. */
static void on_signal(int sig)
{
	if (interrupted) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	interrupted = sig;
}

static void catch_signals(bool on)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on ? on_signal : SIG_DFL;
	sa.sa_flags = SA_RESTART; /* library I/O in flight should not see EINTR */
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(caught) / sizeof(caught[0]); i++)
		sigaction(caught[i], &sa, NULL);
}

/* ---- the pool ---------------------------------------------------------------- */

typedef struct pool {
	const dg__gen_resolved *r; /* the kernels to build */
	const char *tmp;         /* temp folder the binaries go into */
	dg_ctx_opts ctx_opts;
	pthread_mutex_t mu;      /* guards everything below */
	size_t next;             /* next spec to take */
	size_t done;
	size_t hits;
	size_t fail_idx;         /* spec that failed first (lowest), or NO_FAILURE */
	bool fail_setup;         /* ...or a thread could not make its ctx */
	dg_status fail_st;
	char fail_msg[8192];     /* its full message */
	dg_manifest_kernel *kernels; /* r->n results, in spec order */
	dg__cli_progress prog;
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
			snprintf(msg, msz, "%s: NVRTC returned a bad cubin: %s (try --no-cache)",
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
	if (!dg__cli_join(path, sizeof(path), p->tmp, name)) {
		snprintf(msg, msz, "%s: path too long", p->tmp);
		st = DG_ERR_IO;
		goto out;
	}
	st = dg__cli_write_file(path, bin->image, size, msg, msz);
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
		bool stop = interrupted || p->fail_idx != NO_FAILURE ||
			    p->next == p->r->n;
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
			dg__cli_progress_tick(&p->prog, p->done, p->kernels[i].file);
		}
		pthread_mutex_unlock(&p->mu);
	}
	dg_ctx_destroy(ctx);
	return NULL;
}

/* Runs `jobs` workers (or the work on this thread if none can start). */
static void run_pool(pool *p, int jobs)
{
	pthread_t th[MAX_JOBS];
	int started = 0;

	while (started < jobs &&
	       pthread_create(&th[started], NULL, worker, p) == 0)
		started++;
	if (started == 0)
		worker(p);
	for (int t = 0; t < started; t++)
		pthread_join(th[t], NULL);
}

/* ---- publishing ------------------------------------------------------------- */

static void iso_now(char *buf, size_t size)
{
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

typedef struct build_args {
	dg__spec_flags flags;
	const char *out;
	const char *cache_dir;
	const char *device, *sm, *tune_db;
	long jobs;
	bool json, no_cache, progress, verbose, quiet, tuned;
} build_args;

/* Moves every file from tmp into dir (the records of r too), syncs the
 * folders, then renames manifest.json in (the commit) and syncs dir again
 * (base/publish.h), so after a crash the manifest lists only files that
 * are there. On a failure before the commit unlinks the files it moved
 * that were not there before; *committed: the manifest is in place. */
static dg_status publish(const dg_manifest *m, const dg__gen_resolved *r, const char *tmp,
			 const char *dir, bool *committed, char *msg, size_t msz)
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
		if (!dg__cli_join(from, sizeof(from), tmp, f) ||
		    !dg__cli_join(to, sizeof(to), dir, f)) {
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
		st = dg__gen_records_publish(r, tmp, dir, msg, msz);
	if (!st) /* what the manifest lists is durable before it is */
		st = dg__publish_sync_dir(dir, msg, msz);
	if (!st) {
		if (!dg__cli_join(from, sizeof(from), tmp, DG_MANIFEST_FILE) ||
		    !dg__cli_join(to, sizeof(to), dir, DG_MANIFEST_FILE) ||
		    rename(from, to) != 0) {
			snprintf(msg, msz, "%s: %s", to, strerror(errno));
			st = DG_ERR_IO;
		}
	}
	if (st) {
		for (size_t i = 0; i < moved; i++) {
			if (!fresh[i])
				continue;
			if (dg__cli_join(to, sizeof(to), dir, m->kernels[i].file))
				unlink(to);
		}
	} else {
		*committed = true;
		st = dg__publish_sync_dir(dir, msg, msz);
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
	if (!dg__cli_join(path, sizeof(path), dir, DG_MANIFEST_FILE) ||
	    dg__cli_read_file(path, DG_MANIFEST_MAX_BYTES, &bytes, &size, msg, sizeof(msg)))
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
			   const dg__gen_resolved *r)
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
		if (keep || !dg__cli_join(path, sizeof(path), dir, o->files[i]))
			continue;
		if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(path) == 0)
			records |= strncmp(o->files[i], "tune/", 5) == 0;
	}
	if (records && dg__cli_join(path, sizeof(path), dir, "tune"))
		rmdir(path); /* only if it is now empty */
	(void)dg__publish_sync_dir(dir, NULL, 0); /* housekeeping: best effort */
}

/* Writes the manifest (with the "tuning" array, if any) into tmp, after
 * reading it back as inspect will. */
static dg_status write_manifest(const dg_manifest *m, const dg__gen_resolved *r,
				const char *tmp, char **json, char *msg, size_t msz)
{
	char path[4096];
	dg_manifest *back = NULL;

	dg_status st = dg_manifest_to_json(m, json, msg, msz);
	if (!st)
		st = dg__gen_tuning_manifest(r, json, msg, msz);
	if (st)
		return st;
	st = dg_manifest_parse(*json, strlen(*json), &back, msg, msz);
	dg_manifest_destroy(back);
	if (st)
		return DG_ERR_INTERNAL; /* we wrote something we cannot read */
	if (!dg__cli_join(path, sizeof(path), tmp, DG_MANIFEST_FILE)) {
		snprintf(msg, msz, "%s: path too long", tmp);
		return DG_ERR_IO;
	}
	return dg__cli_write_file(path, *json, strlen(*json), msg, msz);
}

/* Temp folders of builds whose process is gone (killed mid-build). */
static void remove_stale_temps(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long pid;
		char tail[8];
		if (sscanf(e->d_name, ".dragon-build.%ld.%4s", &pid, tail) != 2 ||
		    strcmp(tail, "tmp") != 0 || pid <= 0)
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		char path[4096];
		if (dg__cli_join(path, sizeof(path), dir, e->d_name))
			dg__cli_remove_tree(path);
	}
	if (d)
		closedir(d);
}

/* ---- the command ------------------------------------------------------------- */

static int parse_args(int argc, char **argv, build_args *a)
{
	dg__cli_scan_state sc;
	const char *arg;
	uint64_t v;
	int id;

	a->out = "dragon-kernels";
	a->jobs = sysconf(_SC_NPROCESSORS_ONLN);
	if (a->jobs < 1)
		a->jobs = 1;
	dg__cli_scan_init(&sc, argc, argv, "build");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
		switch (id) {
		case OPT_HELP:
			help();
			return -1;
		case OPT_OUT:
			if (!arg[0] || strlen(arg) > 3000)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--out: give a folder name of 1 to 3000 characters");
			a->out = arg;
			break;
		case OPT_JOBS:
			if (!dg__cli_parse_u64("-j", arg, 1, MAX_JOBS, &v))
				return DG__CLI_USAGE;
			a->jobs = (long)v;
			break;
		case OPT_JSON: a->json = true; break;
		case OPT_NO_CACHE: a->no_cache = true; break;
		case OPT_CACHE_DIR: a->cache_dir = arg; break;
		case OPT_PROGRESS: a->progress = true; break;
		case OPT_VERBOSE: a->verbose = true; break;
		case OPT_QUIET: a->quiet = true; break;
		case OPT_TUNED: a->tuned = true; break;
		case OPT_DEVICE: a->device = arg; break;
		case OPT_SM: a->sm = arg; break;
		case OPT_TUNE_DB: a->tune_db = arg; break;
		case DG__CLI_SCAN_ARG:
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "build takes no arguments, got '%s' (the folder goes after --out)",
					   arg);
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		default:
			if (!dg__spec_flags_add(&a->flags, id, arg))
				return DG__CLI_FAIL;
		}
	}
	if (a->no_cache && a->cache_dir)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--no-cache and --cache-dir contradict each other; give one");
	return DG__CLI_OK;
}

static cJSON *timing_json(const pool *p, const dg__specset *set, double wall_ms, long jobs)
{
	cJSON *t = cJSON_CreateObject();
	cJSON_AddNumberToObject(t, "wall_ms", wall_ms);
	cJSON_AddNumberToObject(t, "jobs", (double)jobs);
	cJSON_AddNumberToObject(t, "kernels", (double)p->r->n);
	cJSON_AddNumberToObject(t, "specs", (double)set->n);
	cJSON_AddNumberToObject(t, "cache_hits", (double)p->hits);
	cJSON_AddNumberToObject(t, "compiled", (double)(p->r->n - p->hits));
	cJSON_AddNumberToObject(t, "dropped", (double)set->dropped);
	return t;
}

/* "1 kernel", "3 kernels" */
static const char *plural(size_t n)
{
	return n == 1 ? "" : "s";
}

/* Compile, then publish; returns the exit code. tmp exists and is empty. */
static int build(const build_args *a, const dg__specset *set, const dg__gen_resolved *r,
		 const char *template_hash, const char *tmp, dg_manifest *m)
{
	pool p;
	char msg[8192], hint[1024], flags[DG_SPEC_TEXT_MAX], when[32];
	char *json = NULL;
	int code = DG__CLI_OK;
	double t0 = dg__cli_now_ms();
	old_bundle old;

	memset(&p, 0, sizeof(p));
	p.r = r;
	p.tmp = tmp;
	p.ctx_opts.cache_dir = a->cache_dir;
	p.ctx_opts.no_cache = a->no_cache;
	p.fail_idx = NO_FAILURE;
	p.kernels = m->kernels;
	pthread_mutex_init(&p.mu, NULL);
	dg__cli_progress_init(&p.prog, a->progress, r->n);
	long jobs = a->jobs < (long)r->n ? a->jobs : (long)r->n;
	run_pool(&p, (int)jobs);
	dg__cli_progress_end(&p.prog);
	pthread_mutex_destroy(&p.mu);

	if (interrupted)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_INTERNAL, "build interrupted; %s left as it was", a->out);
	if (p.fail_idx != NO_FAILURE) {
		/* Only a template or compile error has source worth reading. */
		hint[0] = '\0';
		if (!p.fail_setup &&
		    (p.fail_st == DG_ERR_TEMPLATE || p.fail_st == DG_ERR_COMPILE)) {
			dg__spec_flags_of(&r->specs[p.fail_idx], flags, sizeof(flags));
			snprintf(hint, sizeof(hint), "dragon-gen render --op %s%s%s",
				 dg_op_name(r->specs[p.fail_idx].op), flags[0] ? " " : "", flags);
		}
		/* a spec error found by the compile is the user's, like any other */
		const char *where = p.fail_st == DG_ERR_INVALID_SPEC ? "" : "build: ";
		dg__cli_fail(p.fail_st, "%s%.*s%s%s%s", where, dg__cli_first_line_len(p.fail_msg),
			     p.fail_msg, hint[0] ? "; run `" : "", hint,
			     hint[0] ? "` to see the source" : "");
		if (a->verbose && strchr(p.fail_msg, '\n'))
			fprintf(stderr, "%s\n", p.fail_msg);
		return dg__cli_exit_for(p.fail_st);
	}
	iso_now(when, sizeof(when));
	m->format = DG_MANIFEST_FORMAT;
	m->generator_version = strdup(DG_GENERATOR_VERSION);
	m->nvrtc_version = strdup(dg_nvrtc_version());
	m->created = strdup(when);
	m->device = strdup(r->device);
	m->sm = r->sm;
	snprintf(m->template_hash, sizeof(m->template_hash), "%s", template_hash);
	if (!m->generator_version || !m->nvrtc_version || !m->created || !m->device)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
	old_load(a->out, &old);
	dg_status st = dg__gen_records_write(r, tmp, msg, sizeof(msg));
	if (!st)
		st = write_manifest(m, r, tmp, &json, msg, sizeof(msg));
	bool committed = false;
	if (!st)
		st = publish(m, r, tmp, a->out, &committed, msg, sizeof(msg));
	if (st) {
		old_free(&old);
		free(json);
		if (committed)
			return dg__cli_err(DG__CLI_FAIL, st,
					   "build: %s; the bundle is in place but may not survive a power loss", msg);
		return dg__cli_err(DG__CLI_FAIL, st, "build: %s; %s left as it was", msg, a->out);
	}
	remove_orphans(a->out, &old, m, r);
	old_free(&old);
	double wall = dg__cli_now_ms() - t0;
	if (!a->quiet) {
		char dev[200] = "";
		if (r->device[0])
			snprintf(dev, sizeof(dev), " for %s (sm_%d)", r->device, r->sm);
		fprintf(stderr, "dragon-gen: built %zu kernel%s%s into %s (%zu cache hit%s, %zu compiled) in %.1f s\n",
			r->n, plural(r->n), dev, a->out, p.hits, plural(p.hits), r->n - p.hits,
			wall / 1e3);
	}
	if (a->json) {
		cJSON *root = cJSON_Parse(json);
		if (root)
			cJSON_AddItemToObject(root, "timing", timing_json(&p, set, wall, jobs));
		code = dg__cli_json_print(root);
	}
	free(json);
	return code;
}

/* The spec set, resolved for the device: the kernels to build. */
static int plan_kernels(const build_args *a, dg_codegen *cg, dg__specset *set,
			dg__gen_resolved *r)
{
	char msg[1024];
	dg__gen_tune t;

	dg_status st = dg__specset_expand(cg, &a->flags, set, msg, sizeof(msg));
	if (st)
		return dg__cli_fail(st, "%s", msg);
	if (!a->quiet)
		dg__specset_note_dropped(set);
	int code = dg__gen_tune_open(a->tune_db, a->cache_dir, a->device, a->sm, "build",
				     a->verbose, &t);
	if (code)
		return code;
	code = dg__gen_build_resolve(&t, cg, set, a->tuned, a->verbose, r);
	dg__gen_tune_close(&t);
	if (!code)
		dg__cli_note(a->verbose, "%zu spec%s resolve%s to %zu kernel%s", set->n,
			     plural(set->n), set->n == 1 ? "s" : "", r->n, plural(r->n));
	return code;
}

int dg__gen_cmd_build(int argc, char **argv)
{
	build_args a;
	dg__specset set = { 0 };
	dg__gen_resolved r = { 0 };
	dg_codegen *cg = NULL;
	dg_manifest *m = NULL;
	char msg[1024], tmp[4096];
	char made[4096] = "";
	bool have_tmp = false;

	memset(&a, 0, sizeof(a));
	int code = parse_args(argc, argv, &a);
	if (code)
		goto out;
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		code = dg__cli_fail(st, "build: %s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		goto out;
	}
	code = plan_kernels(&a, cg, &set, &r);
	if (code)
		goto out;
	m = calloc(1, sizeof(*m));
	if (m)
		m->kernels = calloc(r.n, sizeof(*m->kernels));
	if (!m || !m->kernels) {
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "build: out of memory");
		goto out;
	}
	m->n_kernels = r.n;
	catch_signals(true);
	st = dg__cli_mkdirs(a.out, made, sizeof(made), msg, sizeof(msg));
	if (st) {
		code = dg__cli_err(DG__CLI_FAIL, st, "build --out %s", msg);
		goto out;
	}
	remove_stale_temps(a.out);
	char tname[64];
	snprintf(tname, sizeof(tname), ".dragon-build.%ld.tmp", (long)getpid());
	if (!dg__cli_join(tmp, sizeof(tmp), a.out, tname)) {
		code = dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--out %s: path too long", a.out);
		goto out;
	}
	dg__cli_remove_tree(tmp);
	if (mkdir(tmp, 0755) != 0) {
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "build: %s: %s", tmp, strerror(errno));
		goto out;
	}
	have_tmp = true;
	code = build(&a, &set, &r, dg_codegen_template_hash(cg), tmp, m);
out:
	if (have_tmp)
		dg__cli_remove_tree(tmp);
	if (code > 0)
		dg__cli_rmdirs(a.out, made);
	catch_signals(false);
	int sig = interrupted;
	dg_manifest_destroy(m);
	dg__gen_resolved_free(&r);
	dg__specset_free(&set);
	dg_codegen_destroy(cg);
	dg__spec_flags_free(&a.flags);
	if (sig)
		raise(sig); /* exit the way an interrupted program does */
	return code < 0 ? DG__CLI_OK : code;
}
