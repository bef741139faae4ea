/*
 * dragon-gen build: compile a set of specs into a bundle folder.
 *
 * The command line over the library's builder (dg_bundle_build,
 * dragon/runtime.h), which compiles with a pool of threads into a private
 * temp folder and publishes the kernels and manifest.json only when all
 * of them built. Here: the flags, the spec set they make (or the default
 * build set), the tuning DB and the device they name, SIGINT/SIGTERM/
 * SIGHUP turned into a stop that leaves DIR as it was, progress, the
 * messages in the flags' words, the summary line and --json.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/common/progress.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/manifest.h"
#include "dragon/runtime.h"

#define MAX_JOBS 1024

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

/* ---- the library's callbacks ---------------------------------------------------- */

typedef struct build_args {
	dg__spec_flags flags;
	const char *out;
	const char *cache_dir;
	const char *device, *sm, *tune_db;
	long jobs;
	bool json, no_cache, progress, verbose, quiet, tuned;
} build_args;

typedef struct watch {
	const build_args *a;
	dg__cli_progress prog;
} watch;

static void on_progress(void *user, size_t done, size_t total, const char *file)
{
	watch *w = user;
	if (!file)
		dg__cli_progress_init(&w->prog, w->a->progress, total);
	else
		dg__cli_progress_tick(&w->prog, done, file);
}

static void on_note(void *user, int detail, const char *line)
{
	const watch *w = user;
	if (detail)
		dg__cli_note(w->a->verbose, "%s", line);
	else
		dg__cli_note(true, "build: %s", line);
}

static int on_stop(void *user)
{
	(void)user;
	return interrupted != 0;
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
	if (a->jobs > MAX_JOBS)
		a->jobs = MAX_JOBS;
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

/* "1 kernel", "3 kernels" */
static const char *plural(size_t n)
{
	return n == 1 ? "" : "s";
}

/* The one device the specs resolve for, as the build will find them: a
 * second one is a usage error, in the words of the flags. */
static int check_one_device(const dg__gen_tune *t, const dg__specset *set)
{
	char first[128] = "", name[128];
	int first_sm = 0, sm;

	for (size_t i = 0; i < set->n; i++) {
		dg__gen_tune_device_for(t, &set->specs[i], name, sizeof(name), &sm);
		if (!name[0])
			continue;
		if (!first[0]) {
			snprintf(first, sizeof(first), "%s", name);
			first_sm = sm;
		} else if (strcmp(first, name) != 0 || first_sm != sm) {
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "build: the specs' arches resolve for two devices of the tuning records (%s sm_%d and %s sm_%d); a bundle is for one: pick it with --device NAME --sm N, or --device none",
					   first, first_sm, name, sm);
		}
	}
	return DG__CLI_OK;
}

/* The spec set (the flags' product, or the default build set) and the
 * tuning DB with the device the flags name. */
static int plan_specs(const build_args *a, dg_codegen *cg, dg__specset *set, dg__gen_tune *t)
{
	char msg[1024];

	dg_status st = dg__specset_expand(cg, &a->flags, set, msg, sizeof(msg));
	if (st)
		return dg__cli_fail(st, "%s", msg);
	if (!a->quiet)
		dg__specset_note_dropped(set);
	int code = dg__gen_tune_open(a->tune_db, a->cache_dir, a->device, a->sm, "build",
				     a->verbose, t);
	return code ? code : check_one_device(t, set);
}

/* The library's failure in the flags' words; returns the exit code. */
static int report(const build_args *a, dg_status st, const dg_bundle_summary *s, const char *msg)
{
	char hint[1024] = "", flags[DG_SPEC_TEXT_MAX], why[256];
	dg_spec failed;

	switch (s->step) {
	case DG_BUNDLE_STEP_PLAN:
		return dg__cli_fail(st, "%s%s", st == DG_ERR_NOMEM ? "build: " : "", msg);
	case DG_BUNDLE_STEP_FOLDER:
		return dg__cli_fail(st, "build --out %s", msg);
	case DG_BUNDLE_STEP_COMPILE:
		break;
	default:
		return dg__cli_err(DG__CLI_FAIL, st, "build: %s", msg);
	}
	if (st == DG_ERR_INTERRUPTED)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_INTERNAL, "build interrupted; %s left as it was",
				   a->out);
	/* Only a template or compile error has source worth reading. */
	if (s->failed[0] && (st == DG_ERR_TEMPLATE || st == DG_ERR_COMPILE) &&
	    dg_spec_parse(s->failed, &failed, why, sizeof(why)) == DG_OK) {
		dg__spec_flags_of(&failed, flags, sizeof(flags));
		snprintf(hint, sizeof(hint), "dragon-gen render --op %s%s%s", dg_op_name(failed.op),
			 flags[0] ? " " : "", flags);
	}
	/* a spec error found by the compile is the user's, like any other */
	const char *where = st == DG_ERR_INVALID_SPEC ? "" : "build: ";
	dg__cli_fail(st, "%s%.*s%s%s%s", where, dg__cli_first_line_len(msg), msg,
		     hint[0] ? "; run `" : "", hint, hint[0] ? "` to see the source" : "");
	if (a->verbose && strchr(msg, '\n'))
		fprintf(stderr, "%s\n", msg);
	return dg__cli_exit_for(st);
}

/* The summary line, and with --json the manifest and the timings. */
static int report_done(const build_args *a, const dg__specset *set, const dg_bundle_summary *s)
{
	size_t compiled = s->kernels - s->cache_hits;

	if (!a->quiet) {
		char dev[200] = "";
		if (s->device[0])
			snprintf(dev, sizeof(dev), " for %s (sm_%d)", s->device, s->sm);
		fprintf(stderr, "dragon-gen: built %zu kernel%s%s into %s (%zu cache hit%s, %zu compiled) in %.1f s\n",
			s->kernels, plural(s->kernels), dev, a->out, s->cache_hits, plural(s->cache_hits),
			compiled, s->wall_ms / 1e3);
	}
	if (!a->json)
		return DG__CLI_OK;
	char path[4096], why[1024];
	uint8_t *text = NULL;
	size_t size = 0;
	dg_status st = DG_ERR_IO;
	if (dg__cli_join(path, sizeof(path), a->out, DG_MANIFEST_FILE))
		st = dg__cli_read_file(path, DG_MANIFEST_MAX_BYTES, &text, &size, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "%s: path too long", a->out);
	if (st)
		return dg__cli_fail(st, "build: %s", why);
	cJSON *root = cJSON_ParseWithLength((const char *)text, size);
	free(text);
	if (root) {
		cJSON *t = cJSON_CreateObject();
		cJSON_AddNumberToObject(t, "wall_ms", s->wall_ms);
		cJSON_AddNumberToObject(t, "jobs", (double)s->jobs);
		cJSON_AddNumberToObject(t, "kernels", (double)s->kernels);
		cJSON_AddNumberToObject(t, "specs", (double)set->n);
		cJSON_AddNumberToObject(t, "cache_hits", (double)s->cache_hits);
		cJSON_AddNumberToObject(t, "compiled", (double)compiled);
		cJSON_AddNumberToObject(t, "dropped", (double)set->dropped);
		cJSON_AddItemToObject(root, "timing", t);
	}
	return dg__cli_json_print(root);
}

int dg__gen_cmd_build(int argc, char **argv)
{
	build_args a;
	dg__specset set = { 0 };
	dg__gen_tune t;
	dg_codegen *cg = NULL;
	dg_bundle_summary sum;
	char msg[8192];

	memset(&a, 0, sizeof(a));
	memset(&t, 0, sizeof(t));
	int code = parse_args(argc, argv, &a);
	if (code)
		goto out;
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		code = dg__cli_fail(st, "build: %s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		goto out;
	}
	code = plan_specs(&a, cg, &set, &t);
	if (code)
		goto out;

	watch w = { .a = &a };
	dg_ctx_opts jit = { .cache_dir = a.cache_dir, .no_cache = a.no_cache };
	dg_bundle_opts o = {
		.out = a.out,
		.specs = set.specs,
		.n_specs = set.n,
		.jobs = (int)a.jobs,
		.jit = &jit,
		.tune_db = t.db,
		.device = t.mode == DG__GEN_DEV_NAMED ? t.device : t.mode == DG__GEN_DEV_NONE ? "" : NULL,
		.sm = t.mode == DG__GEN_DEV_NAMED ? t.sm : 0,
		.tuned = a.tuned,
		.progress = on_progress,
		.note = on_note,
		.stop = on_stop,
		.user = &w,
	};
	catch_signals(true);
	st = dg_bundle_build(&o, &sum, msg, sizeof(msg));
	dg__cli_progress_end(&w.prog);
	code = st ? report(&a, st, &sum, msg) : report_done(&a, &set, &sum);
out:
	catch_signals(false);
	int sig = interrupted;
	dg__gen_tune_close(&t);
	dg__specset_free(&set);
	dg_codegen_destroy(cg);
	dg__spec_flags_free(&a.flags);
	if (sig)
		raise(sig); /* exit the way an interrupted program does */
	return code < 0 ? DG__CLI_OK : code;
}
