/*
 * dragon-gen tune: sweep candidate tiles of specs on the GPU and record
 * the winners in the tuning DB (dragon/tune.h); and the DB helpers
 * `inspect` and `build` share (gen.h).
 *
 * Without spec flags the BDH set is tuned (dg_tune_bdh_set). Records go
 * to --record, else to $DRAGON_TUNE_DB when it names one folder, else to
 * <cache root>/tune/ — where the runtime looks them up — one file per
 * (spec, device), replaced by a new sweep.
 *
 * Device identity without a GPU (inspect, build): --device NAME and --sm
 * N, or --device none; without them, the one device the DB's records
 * (the user's and the built-in ones) name for the spec's SM, else none —
 * then a spec gets its template's default (dg_codegen_plan_for).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/common/progress.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/cache.h"
#include "dragon/jit.h"
#include "dragon/runtime.h"
#include "dragon/autotune.h"
#include "dragon/tune.h"

/* ---- shared with inspect and build ------------------------------------------ */

int dg__gen_tune_open(const char *db_path, const char *cache_dir, const char *device,
		      const char *sm_text, const char *cmd, bool verbose,
		      dg__gen_tune *out)
{
	dg_tune_db_opts o;
	dg_cache *cache = NULL;
	uint64_t sm = 0;

	memset(out, 0, sizeof(*out));
	bool none = device && strcmp(device, "none") == 0;
	if (none && sm_text)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "%s: --device none takes no --sm (it resolves every spec for no device)",
				   cmd);
	if (!none && (device != NULL) != (sm_text != NULL))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "%s: give --device NAME and --sm N together (the device the kernels run on), or --device none",
				   cmd);
	if (device && !device[0])
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "%s: --device: give a device name, or none", cmd);
	if (sm_text && !dg__cli_parse_u64("--sm", sm_text, 10, 999, &sm))
		return DG__CLI_USAGE;
	memset(&o, 0, sizeof(o));
	o.path = db_path;
	const char *env = getenv("DRAGON_TUNE_DB");
	if (!db_path && !(env && env[0])) {
		/* the cache's tune/ folder, without making the cache: with no
		 * cache there are no records of the user's, only the built-in */
		dg_cache_opts co = { .dir = cache_dir, .no_create = true };
		if (dg_cache_open(&cache, &co) == DG_OK)
			o.cache_root = dg_cache_root(cache);
		else
			o.path = "builtin";
	}
	dg_status st = dg_tune_db_open(&out->db, &o);
	dg_cache_close(cache);
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "%s: out of memory reading the tuning DB", cmd);
	for (size_t i = 0; i < dg_tune_db_n_problems(out->db); i++)
		dg__cli_note(true, "%s: skipped a tuning record: %s", cmd,
			     dg_tune_db_problem(out->db, i));
	size_t nd = dg_tune_db_devices(out->db, out->devs, DG__GEN_MAX_DEVICES);
	out->n_devs = nd < DG__GEN_MAX_DEVICES ? nd : DG__GEN_MAX_DEVICES;
	if (none) {
		out->mode = DG__GEN_DEV_NONE;
	} else if (device) {
		out->mode = DG__GEN_DEV_NAMED;
		snprintf(out->device, sizeof(out->device), "%s", device);
		out->sm = (int)sm;
	}
	if (out->mode != DG__GEN_DEV_AUTO)
		return DG__CLI_OK;
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
			dg__cli_note(true,
				     "%s: the tuning records name %zu devices of sm_%d (%s, ...); specs for sm_%d resolve for none: pick one with --device NAME --sm %d",
				     cmd, same, out->devs[i].sm, out->devs[i].name, out->devs[i].sm,
				     out->devs[i].sm);
	}
	dg__cli_note(verbose, "%s: tuning records of %zu device%s in %s (%zu built in)", cmd, nd,
		     nd == 1 ? "" : "s", dg_tune_db_where(out->db), dg_tune_db_n_builtin(out->db));
	return DG__CLI_OK;
}

void dg__gen_tune_close(dg__gen_tune *t)
{
	dg_tune_db_close(t->db);
	t->db = NULL;
}

void dg__gen_tune_device_for(const dg__gen_tune *t, const dg_spec *spec, char *name,
			     size_t size, int *sm)
{
	name[0] = '\0';
	*sm = 0;
	if (t->mode == DG__GEN_DEV_NAMED) {
		snprintf(name, size, "%s", t->device);
		*sm = t->sm;
		return;
	}
	if (t->mode == DG__GEN_DEV_NONE)
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

dg_status dg__gen_tune_resolve(const dg__gen_tune *t, dg_codegen *cg, const dg_spec *spec,
			       dg_tune_choice *out)
{
	char name[128];
	int sm;

	dg__gen_tune_device_for(t, spec, name, sizeof(name), &sm);
	return dg_tune_resolve(cg, t->db, spec, name[0] ? name : NULL, sm, out);
}

void dg__gen_tile_line(const dg_tune_choice *ch, char *buf, size_t size)
{
	char tile[64];

	dg_tile_to_string(&ch->spec.tile, tile, sizeof(tile));
	if (ch->tuned)
		snprintf(buf, size, "tile: %s%s (tuned: %s)", tile,
			 ch->spec.arch_specific ? " on the arch-specific target" : "",
			 ch->record[0] ? ch->record : "record");
	else
		snprintf(buf, size, "tile: %s%s (template default: %s)", tile,
			 ch->spec.arch_specific ? " on the arch-specific target" : "", ch->why);
}

/* ---- the command -------------------------------------------------------------- */

enum {
	OPT_HELP = 1, OPT_BUDGET, OPT_RECORD, OPT_JSON, OPT_ROWS, OPT_CHECK_ROWS,
	OPT_REPS, OPT_WARMUP, OPT_JOBS, OPT_MAX_CANDS, OPT_GPU, OPT_CACHE_DIR,
	OPT_PROGRESS, OPT_VERBOSE, OPT_QUIET,
};

static const dg__cli_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "budget", 0, true, OPT_BUDGET },
	{ "record", 0, true, OPT_RECORD },
	{ "json", 0, false, OPT_JSON },
	{ "rows", 0, true, OPT_ROWS },
	{ "check-rows", 0, true, OPT_CHECK_ROWS },
	{ "reps", 0, true, OPT_REPS },
	{ "warmup", 0, true, OPT_WARMUP },
	{ "jobs", 'j', true, OPT_JOBS },
	{ "max-candidates", 0, true, OPT_MAX_CANDS },
	{ "gpu", 0, true, OPT_GPU },
	{ "cache-dir", 0, true, OPT_CACHE_DIR },
	{ "progress", 0, false, OPT_PROGRESS },
	{ "verbose", 'v', false, OPT_VERBOSE },
	{ "quiet", 'q', false, OPT_QUIET },
	DG__SPEC_OPTS
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	size_t n = dg_tune_bdh_set(NULL, 0);
	dg_spec *bdh = calloc(n ? n : 1, sizeof(*bdh));
	char flags[DG_SPEC_TEXT_MAX];

	printf("usage: dragon-gen tune [spec flags] [--budget S] [--record PATH] [--json]\n"
	       "                       [--rows N] [--reps N] [-j N] [--gpu N]\n\n"
	       "Times candidate tiles of each spec on the GPU and records the winner in\n"
	       "the tuning DB, where the runtime looks up the tile of every spec whose\n"
	       "tile is auto. Per spec: compile the candidates in parallel, reject those\n"
	       "that cannot run (registers, shared memory, threads), check each against\n"
	       "the CPU reference at --check-rows rows, time the rest at --rows rows\n"
	       "(CUDA events, L2 flushed between reps; median, p10, p90), and pick the\n"
	       "simplest tile within 2%% of the fastest. Without spec flags the ops of a\n"
	       "BDH training step are tuned (listed below). Needs a CUDA device.\n\n"
	       "  --budget S         seconds per spec (default 60)\n"
	       "  --record PATH      where records go: a file (one spec) or a folder\n"
	       "                     (default $DRAGON_TUNE_DB when it names one folder,\n"
	       "                     else <cache root>/tune/)\n"
	       "  --json             a summary per spec on stdout\n"
	       "  --rows N           B*T timed at (default 4096)\n"
	       "  --check-rows N     B*T checked against the reference at (default 64)\n"
	       "  --reps N           timed calls per candidate (default 25)\n"
	       "  --warmup N         untimed calls first (default 3)\n"
	       "  -j, --jobs N       compile N candidates at a time (default: online CPUs)\n"
	       "  --max-candidates N only the first N candidates (the default tiles first)\n"
	       "  --gpu N            CUDA device number (default 0)\n"
	       "  --cache-dir D      kernel cache root (default $DRAGON_CACHE_DIR, ...)\n"
	       "  --progress         progress on stderr even when it is not a terminal\n"
	       "  -v, --verbose      every candidate's figures or reason on stderr\n"
	       "  -q, --quiet        no summary lines\n"
	       "  -h, --help         this text\n\n"
	       "The BDH set (%zu specs, each flag a difference from its op's defaults):\n",
	       n);
	if (bdh)
		dg_tune_bdh_set(bdh, n);
	for (size_t i = 0; bdh && i < n; i++) {
		dg__spec_flags_of(&bdh[i], flags, sizeof(flags));
		printf("  %s%s%s\n", dg_op_name(bdh[i].op), flags[0] ? " " : "", flags);
	}
	free(bdh);
	putchar('\n');
	dg__specset_help(stdout, false);
	printf("\nExample: dragon-gen tune --op lowrank_fwd --weight ternary --relu 0 --budget 60\n");
}

typedef struct tune_args {
	dg__spec_flags flags;
	const char *record, *cache_dir;
	dg_tune_opts t;
	int gpu;
	bool json, progress, verbose, quiet;
} tune_args;

static bool num_flag(const char *flag, const char *v, uint64_t lo, uint64_t hi, int *out)
{
	uint64_t x;
	if (!dg__cli_parse_u64(flag, v, lo, hi, &x))
		return false;
	*out = (int)x;
	return true;
}

static int parse_args(int argc, char **argv, tune_args *a)
{
	dg__cli_scan_state sc;
	const char *arg;
	uint64_t v;
	int id;

	dg__cli_scan_init(&sc, argc, argv, "tune");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
		bool ok = true;
		switch (id) {
		case OPT_HELP:
			help();
			return -1;
		case OPT_BUDGET:
			ok = dg__cli_parse_u64("--budget", arg, 1, 86400, &v);
			a->t.budget_s = (double)v;
			break;
		case OPT_RECORD:
			if (!arg[0])
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "--record: give a file or folder");
			a->record = arg;
			break;
		case OPT_JSON: a->json = true; break;
		case OPT_ROWS: ok = num_flag("--rows", arg, 1, 1 << 24, &a->t.rows); break;
		case OPT_CHECK_ROWS:
			ok = num_flag("--check-rows", arg, 1, 4096, &a->t.check_rows);
			break;
		case OPT_REPS: ok = num_flag("--reps", arg, 1, 10000, &a->t.reps); break;
		case OPT_WARMUP: ok = num_flag("--warmup", arg, 1, 10000, &a->t.warmup); break;
		case OPT_JOBS: ok = num_flag("-j", arg, 1, 256, &a->t.jobs); break;
		case OPT_MAX_CANDS:
			ok = num_flag("--max-candidates", arg, 1, DG_TUNE_MAX_CANDIDATES,
				      &a->t.max_candidates);
			break;
		case OPT_GPU: ok = num_flag("--gpu", arg, 0, 1024, &a->gpu); break;
		case OPT_CACHE_DIR: a->cache_dir = arg; break;
		case OPT_PROGRESS: a->progress = true; break;
		case OPT_VERBOSE: a->verbose = true; break;
		case OPT_QUIET: a->quiet = true; break;
		case DG__CLI_SCAN_ARG:
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "tune takes no arguments, got '%s'; name specs with flags (see `dragon-gen tune --help`)",
					   arg);
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		default:
			if (id == DG__SPEC_OPT_BASE + DG__SF_TILE)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "--tile %s: tune chooses the tile; drop --tile", arg);
			if (!dg__spec_flags_add(&a->flags, id, arg))
				return DG__CLI_FAIL;
		}
		if (!ok)
			return DG__CLI_USAGE;
	}
	return DG__CLI_OK;
}

/* The specs: the product of the flags (planned on a codegen of its own),
 * or the BDH set. */
static int spec_list(const tune_args *a, dg_spec **out, size_t *n)
{
	char msg[1024];

	if (!dg__spec_flags_any(&a->flags)) {
		*n = dg_tune_bdh_set(NULL, 0);
		*out = calloc(*n, sizeof(**out));
		if (!*out)
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "tune: out of memory");
		dg_tune_bdh_set(*out, *n);
		return DG__CLI_OK;
	}
	dg_codegen *cg = NULL;
	dg__specset set = { 0 };
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		int code = dg__cli_fail(st, "tune: %s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		dg_codegen_destroy(cg);
		return code;
	}
	st = dg__specset_expand(cg, &a->flags, &set, msg, sizeof(msg));
	dg_codegen_destroy(cg);
	if (st)
		return dg__cli_fail(st, "%s", msg);
	if (!a->quiet)
		dg__specset_note_dropped(&set);
	*out = set.specs;
	*n = set.n;
	set.specs = NULL;
	dg__specset_free(&set);
	return DG__CLI_OK;
}

/* ---- progress ------------------------------------------------------------------- */

typedef struct prog {
	bool on, tty, shown;
	size_t index, count; /* spec index of count */
	double last;
	dg_tune_phase last_phase;
} prog;

static void on_progress(void *user, const dg_spec *spec, dg_tune_phase phase, size_t done,
			size_t total, double eta_s)
{
	static const char *const names[] = { "compiling", "reference", "checking and timing" };
	prog *p = user;
	double t = dg__cli_now_ms() / 1e3;

	if (!p->on)
		return;
	bool edge = phase != p->last_phase || done == total;
	if (!edge && t - p->last < (p->tty ? 0.2 : 5.0))
		return;
	p->last = t;
	p->last_phase = phase;
	char eta[32] = "";
	if (eta_s >= 0)
		snprintf(eta, sizeof(eta), ", ETA %.0f s", eta_s);
	fprintf(stderr, "%stune %zu/%zu %s: %s %zu/%zu%s%s", p->tty ? "\r\033[K" : "",
		p->index + 1, p->count, dg_op_name(spec->op), names[phase], done, total, eta,
		p->tty ? "" : "\n");
	p->shown = true;
	fflush(stderr);
}

/* ---- one spec --------------------------------------------------------------------- */

/* Where the records go: a folder (made) or, for one spec, a file. */
static int record_target(const tune_args *a, dg_device *dev, size_t n, char *dir, size_t dsz,
			 char *file, size_t fsz)
{
	char msg[1024], made[4096];
	struct stat sb;
	const char *env = getenv("DRAGON_TUNE_DB");

	dir[0] = file[0] = '\0';
	if (a->record) {
		size_t len = strlen(a->record);
		bool is_dir = (stat(a->record, &sb) == 0 && S_ISDIR(sb.st_mode)) ||
			      a->record[len - 1] == '/' || n > 1;
		if (!is_dir) {
			snprintf(file, fsz, "%s", a->record);
			return DG__CLI_OK;
		}
		snprintf(dir, dsz, "%s", a->record);
	} else if (env && env[0] && strcmp(env, "none") != 0 && !strchr(env, ':') &&
		   !(strlen(env) > 5 && strcmp(env + strlen(env) - 5, ".json") == 0)) {
		snprintf(dir, dsz, "%s", env);
	} else {
		dg_cache *c = dg_ctx_cache(dg_device_jit(dev));
		if (!c)
			return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO,
					   "tune: no kernel cache to put records in; give --record PATH");
		snprintf(dir, dsz, "%s/tune", dg_cache_root(c));
	}
	if (dg__cli_mkdirs(dir, made, sizeof(made), msg, sizeof(msg)) != DG_OK)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "tune: %s", msg);
	return DG__CLI_OK;
}

static const char *state_name(dg_tune_state s)
{
	static const char *const n[] = { "timed", "rejected", "wrong", "skipped" };
	return (unsigned)s <= DG_TUNE_SKIPPED ? n[s] : "?";
}

static cJSON *summary_json(const dg_tune_record *r, const char *path, const size_t counts[4])
{
	cJSON *o = cJSON_CreateObject();
	char tile[64];

	cJSON_AddStringToObject(o, "spec", r->spec_text);
	cJSON_AddStringToObject(o, "record", path);
	cJSON_AddStringToObject(o, "device", r->device.name);
	cJSON_AddNumberToObject(o, "sm", r->device.sm);
	if (r->winner >= 0) {
		const dg_tune_cand *w = &r->cands[r->winner];
		cJSON *wj = cJSON_AddObjectToObject(o, "winner");
		dg_tile_to_string(&w->tile, tile, sizeof(tile));
		cJSON_AddStringToObject(wj, "tile", tile);
		cJSON_AddBoolToObject(wj, "arch_specific", w->arch_specific);
		cJSON_AddNumberToObject(wj, "median_us", w->median_us);
	} else {
		cJSON_AddNullToObject(o, "winner");
	}
	if (r->n_cands && r->cands[0].state == DG_TUNE_TIMED)
		cJSON_AddNumberToObject(o, "default_median_us", r->cands[0].median_us);
	else
		cJSON_AddNullToObject(o, "default_median_us");
	cJSON_AddNumberToObject(o, "candidates", (double)r->n_cands);
	for (int s = 0; s <= DG_TUNE_SKIPPED; s++)
		cJSON_AddNumberToObject(o, state_name((dg_tune_state)s), (double)counts[s]);
	cJSON_AddBoolToObject(o, "budget_exhausted", r->budget_exhausted);
	cJSON_AddNumberToObject(o, "elapsed_s", r->elapsed_s);
	return o;
}

/* Sweeps one spec, writes its record; returns the exit code. */
static int tune_one(const tune_args *a, dg_device *dev, const dg_spec *spec, const char *dir,
		    const char *file, prog *p, cJSON *json)
{
	char path[4600], name[256], msg[1024], text[DG_SPEC_TEXT_MAX];
	dg_tune_record *r = NULL;
	size_t counts[4] = { 0 };

	dg_spec_to_string(spec, text, sizeof(text));
	dg_status st = dg_tune_sweep(dev, spec, &a->t, &r);
	if (p->shown && p->tty)
		fputs("\r\033[K", stderr);
	if (st)
		return dg__cli_fail(st, "tune: %s: %.*s", text,
				   dg__cli_first_line_len(dg_device_errmsg(dev)),
				   dg_device_errmsg(dev));
	if (file[0]) {
		snprintf(path, sizeof(path), "%s", file);
	} else {
		dg_tune_record_file_name(r, name, sizeof(name));
		snprintf(path, sizeof(path), "%s/%s", dir, name);
	}
	st = dg_tune_record_save(r, path, msg, sizeof(msg));
	if (st) {
		dg_tune_record_destroy(r);
		return dg__cli_err(DG__CLI_FAIL, st, "tune: writing the record: %s", msg);
	}
	for (size_t i = 0; i < r->n_cands; i++) {
		const dg_tune_cand *c = &r->cands[i];
		char tile[64];
		counts[c->state <= DG_TUNE_SKIPPED ? c->state : DG_TUNE_REJECTED]++;
		if (!a->verbose)
			continue;
		dg_tile_to_string(&c->tile, tile, sizeof(tile));
		if (c->state == DG_TUNE_TIMED)
			fprintf(stderr, "  %-22s sm_%d%-2s %10.1f us (p10 %.1f, p90 %.1f)%s\n", tile,
				r->spec.arch, c->arch_specific ? "a" : "", c->median_us, c->p10_us,
				c->p90_us, (int)i == r->winner ? "  <- winner" : "");
		else
			fprintf(stderr, "  %-22s sm_%d%-2s %s: %s\n", tile, r->spec.arch,
				c->arch_specific ? "a" : "", state_name(c->state), c->reason);
	}
	int code = DG__CLI_OK;
	if (r->winner < 0) {
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_UNSUPPORTED,
				   "tune: %s: no candidate passed (%zu rejected, %zu wrong, %zu skipped); see %s",
				   text, counts[1], counts[2], counts[3], path);
	} else if (!a->quiet) {
		const dg_tune_cand *w = &r->cands[r->winner];
		char tile[64], vs[96] = "";
		dg_tile_to_string(&w->tile, tile, sizeof(tile));
		if (r->cands[0].state == DG_TUNE_TIMED && w->median_us > 0)
			snprintf(vs, sizeof(vs), ", default %.1f us (%.2fx)", r->cands[0].median_us,
				 r->cands[0].median_us / w->median_us);
		fprintf(stderr,
			"dragon-gen: %s: %s%s %.1f us%s; %zu candidates: %zu timed, %zu rejected, %zu wrong, %zu skipped%s in %.0f s -> %s\n",
			dg_op_name(r->spec.op), tile, w->arch_specific ? " (arch-specific)" : "",
			w->median_us, vs, r->n_cands, counts[0], counts[1], counts[2], counts[3],
			r->budget_exhausted ? " (budget ran out)" : "", r->elapsed_s, path);
	}
	if (json)
		cJSON_AddItemToArray(json, summary_json(r, path, counts));
	dg_tune_record_destroy(r);
	return code;
}

int dg__gen_cmd_tune(int argc, char **argv)
{
	tune_args a;
	dg_spec *specs = NULL;
	size_t n = 0;
	dg_device *dev = NULL;
	char why[512], dir[4096], file[4096];
	int count = 0;

	memset(&a, 0, sizeof(a));
	int code = parse_args(argc, argv, &a);
	if (code)
		goto out;
	code = spec_list(&a, &specs, &n);
	if (code)
		goto out;
	if (dg_device_count(&count, why, sizeof(why)) != DG_OK || count == 0) {
		code = dg__cli_err(DG__CLI_FAIL, DG_ERR_NO_DEVICE,
				   "tune: no CUDA device (%s); tuning times kernels on the GPU they will run on",
				   why);
		goto out;
	}
	dg_ctx_opts jit = { .cache_dir = a.cache_dir };
	dg_device_opts dopts = { .ordinal = a.gpu, .jit = &jit };
	dg_status st = dg_device_open(&dev, &dopts);
	if (st) {
		code = dg__cli_err(DG__CLI_FAIL, st, "tune: %s",
				   dev ? dg_device_errmsg(dev) : "out of memory opening the device");
		goto out;
	}
	code = record_target(&a, dev, n, dir, sizeof(dir), file, sizeof(file));
	if (code)
		goto out;
	prog p = { .on = !a.quiet && (a.progress || isatty(2)), .tty = isatty(2) != 0,
		   .count = n };
	a.t.progress = on_progress;
	a.t.user = &p;
	cJSON *json = a.json ? cJSON_CreateArray() : NULL;
	for (size_t i = 0; i < n; i++) {
		p.index = i;
		int c = tune_one(&a, dev, &specs[i], dir, file, &p, json);
		if (c && !code)
			code = c;
		if (c == DG__CLI_FAIL && dg_device_sync(dev) != DG_OK)
			break; /* the device is gone: the next sweeps would fail too */
	}
	if (json) {
		int jc = dg__cli_json_print(json);
		code = code ? code : jc;
	}
out:
	dg_device_close(dev);
	free(specs);
	dg__spec_flags_free(&a.flags);
	return code < 0 ? DG__CLI_OK : code;
}
