/*
 * dragon-gen inspect: is this bundle whole? Loads DIR/manifest.json and
 * checks every file it lists: present, the recorded size and SHA-256, and
 * a cubin header for the recorded SM (dg_manifest_kernel_verify).
 *
 * With spec flags instead of a folder: which tile each spec runs with and
 * why — a tuning record (tune.h; the DB of --tune-db, $DRAGON_TUNE_DB or
 * the cache's tune/ folder, for the device --device/--sm name or the one
 * device the records name) or the default heuristic. No GPU is needed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "cli/dragon-gen/util.h"
#include "dragon/manifest.h"

#define MAX_FILE_BYTES ((size_t)1 << 30)

enum { OPT_HELP = 1, OPT_JSON, OPT_VERBOSE, OPT_DEVICE, OPT_SM, OPT_TUNE_DB, OPT_CACHE_DIR };

static const dg__gen_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "json", 0, false, OPT_JSON },
	{ "verbose", 'v', false, OPT_VERBOSE },
	{ "device", 0, true, OPT_DEVICE },
	{ "sm", 0, true, OPT_SM },
	{ "tune-db", 0, true, OPT_TUNE_DB },
	{ "cache-dir", 0, true, OPT_CACHE_DIR },
	DG__SPEC_OPTS
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen inspect DIR [--json] [-v]\n"
	       "       dragon-gen inspect [spec flags] [--device NAME --sm N] [--tune-db PATH]\n\n"
	       "Checks a bundle made by `dragon-gen build --out DIR`: the manifest\n"
	       "parses, every kernel file it lists exists with the recorded size and\n"
	       "SHA-256, and every cubin is a CUDA ELF for the recorded SM.\n"
	       "Exit status 1 names each bad file.\n\n"
	       "With spec flags instead of DIR: the tile each spec runs with, from a\n"
	       "tuning record or the default heuristic, and why, e.g.\n"
	       "  tile: 128x128x64/2x4/4 (tuned: /path/record.json)\n"
	       "No GPU is needed: the device is --device/--sm, else the one device\n"
	       "the records name.\n\n"
	       "  --json           the manifest plus a per-kernel verdict (or the tile\n"
	       "                   choices) on stdout\n"
	       "  -v, --verbose    one line per kernel\n"
	       "  --device NAME    the device records are looked up for (with --sm)\n"
	       "  --sm N           its SM, 90 for sm_90\n"
	       "  --tune-db PATH   records: a file or folder (default $DRAGON_TUNE_DB,\n"
	       "                   else <cache root>/tune)\n"
	       "  --cache-dir D    kernel cache root whose tune/ is the default\n"
	       "  -h, --help       this text\n");
}

/* Verdict on one kernel; why is "" when it is good. */
static dg_status check_kernel(const char *dir, const dg_manifest_kernel *k,
			      char *why, size_t size)
{
	char path[4096];
	uint8_t *bytes = NULL;
	size_t n = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, k->file);
	dg_status st = dg__gen_read_file(path, MAX_FILE_BYTES, &bytes, &n, why,
					 size);
	if (st == DG_ERR_NOT_FOUND) {
		snprintf(why, size, "missing (the manifest lists it)");
		return st;
	}
	if (st)
		return st;
	st = dg_manifest_kernel_verify(k, bytes, n, why, size);
	free(bytes);
	return st;
}

typedef struct inspect_args {
	const char *dir, *device, *sm, *tune_db, *cache_dir;
	bool json, verbose;
	dg__spec_flags flags;
} inspect_args;

/* The tile choice of every spec of the flags' product. */
static int explain(const inspect_args *a)
{
	dg__specset set = { 0 };
	dg__gen_tune t;
	char msg[1024], line[1600], text[DG_SPEC_TEXT_MAX], runs[DG_SPEC_TEXT_MAX];

	dg_status st = dg__specset_expand(&a->flags, &set, msg, sizeof(msg));
	if (st)
		return dg__gen_err(dg__gen_exit_for(st), "%s", msg);
	int code = dg__gen_tune_open(a->tune_db, a->cache_dir, a->device, a->sm, "inspect",
				     a->verbose, &t);
	if (code) {
		dg__specset_free(&set);
		return code;
	}
	cJSON *arr = a->json ? cJSON_CreateArray() : NULL;
	for (size_t i = 0; i < set.n; i++) {
		dg_tune_choice ch;
		const dg_spec *s = &set.specs[i];
		char tile[64];

		dg__gen_tune_resolve(&t, s, &ch);
		dg_tile_to_string(&ch.spec.tile, tile, sizeof(tile));
		if (!dg_tile_is_auto(&s->tile))
			snprintf(line, sizeof(line), "tile: %s (named by the spec)", tile);
		else
			dg__gen_tile_line(&ch, line, sizeof(line));
		dg_spec_to_string(s, text, sizeof(text));
		dg_spec_to_string(&ch.spec, runs, sizeof(runs));
		if (arr) {
			cJSON *o = cJSON_CreateObject();
			cJSON_AddStringToObject(o, "spec", text);
			cJSON_AddStringToObject(o, "tile", tile);
			cJSON_AddBoolToObject(o, "arch_specific", ch.spec.arch_specific);
			cJSON_AddBoolToObject(o, "tuned", ch.tuned);
			cJSON_AddStringToObject(o, "record", ch.record);
			cJSON_AddStringToObject(o, "why", ch.tuned ? "" : ch.why);
			cJSON_AddStringToObject(o, "runs", runs);
			cJSON_AddItemToArray(arr, o);
		} else {
			printf("spec: %s\n%s\nruns: %s\n", text, line, runs);
		}
	}
	if (arr)
		code = dg__gen_json_print(arr);
	dg__gen_tune_close(&t);
	dg__specset_free(&set);
	return code;
}

static int parse_args(int argc, char **argv, inspect_args *a)
{
	dg__gen_scan_state sc;
	const char *arg;
	int id;

	dg__gen_scan_init(&sc, argc, argv, "inspect");
	while ((id = dg__gen_scan(&sc, opts, &arg)) != DG__GEN_SCAN_END) {
		switch (id) {
		case OPT_HELP:
			help();
			return -1;
		case OPT_JSON: a->json = true; break;
		case OPT_VERBOSE: a->verbose = true; break;
		case OPT_DEVICE: a->device = arg; break;
		case OPT_SM: a->sm = arg; break;
		case OPT_TUNE_DB: a->tune_db = arg; break;
		case OPT_CACHE_DIR: a->cache_dir = arg; break;
		case DG__GEN_SCAN_ARG:
			if (a->dir)
				return dg__gen_err(DG__GEN_USAGE,
						   "inspect takes one folder, got '%s' and '%s'",
						   a->dir, arg);
			a->dir = arg;
			break;
		case DG__GEN_SCAN_ERROR:
			return DG__GEN_USAGE;
		default:
			if (!dg__spec_flags_add(&a->flags, id, arg))
				return DG__GEN_FAIL;
		}
	}
	bool any = dg__spec_flags_any(&a->flags);
	if (a->dir && any)
		return dg__gen_err(DG__GEN_USAGE,
				   "inspect takes a bundle folder or spec flags, not both");
	if (!a->dir && !any)
		return dg__gen_err(DG__GEN_USAGE,
				   "inspect needs the bundle folder (dragon-gen inspect DIR) or spec flags (dragon-gen inspect --op lowrank_fwd)");
	if (a->dir && (a->device || a->sm || a->tune_db))
		return dg__gen_err(DG__GEN_USAGE,
				   "--device, --sm and --tune-db go with spec flags, not with a bundle folder");
	return DG__GEN_OK;
}

int dg__gen_cmd_inspect(int argc, char **argv)
{
	inspect_args a;
	char msg[2048];

	memset(&a, 0, sizeof(a));
	int pc = parse_args(argc, argv, &a);
	if (pc || !a.dir) {
		if (!pc)
			pc = explain(&a);
		dg__spec_flags_free(&a.flags);
		return pc < 0 ? DG__GEN_OK : pc;
	}
	const char *dir = a.dir;
	bool json = a.json, verbose = a.verbose;

	dg_manifest *m = NULL;
	dg_status st = dg_manifest_load(dir, &m, msg, sizeof(msg));
	if (st)
		return dg__gen_err(DG__GEN_FAIL, "inspect: %s", msg);

	cJSON *verdicts = json ? cJSON_CreateArray() : NULL;
	size_t bad = 0;
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		char why[1024] = "";
		bool ok = check_kernel(dir, k, why, sizeof(why)) == DG_OK;
		if (!ok) {
			bad++;
			dg__gen_err(DG__GEN_FAIL, "inspect: %s/%s: %s", dir, k->file,
				    why);
		} else if (verbose) {
			fprintf(stderr, "ok  %s  %s\n", k->file, k->spec);
		}
		if (verdicts) {
			cJSON *v = cJSON_CreateObject();
			cJSON_AddStringToObject(v, "file", k->file);
			cJSON_AddBoolToObject(v, "ok", ok);
			cJSON_AddStringToObject(v, "error", why);
			cJSON_AddItemToArray(verdicts, v);
		}
	}
	int code = bad ? DG__GEN_FAIL : DG__GEN_OK;
	if (json) {
		char *text = NULL;
		cJSON *root = NULL;
		if (dg_manifest_to_json(m, &text, msg, sizeof(msg)) == DG_OK)
			root = cJSON_Parse(text);
		free(text);
		if (root) {
			cJSON_AddBoolToObject(root, "ok", bad == 0);
			cJSON_AddItemToObject(root, "verdicts", verdicts);
			verdicts = NULL;
		}
		cJSON_Delete(verdicts);
		int jc = dg__gen_json_print(root);
		code = code ? code : jc;
	} else if (!bad) {
		printf("%s: %zu kernels ok (manifest format %d, generator %s, NVRTC %s, created %s)\n",
		       dir, m->n_kernels, m->format, m->generator_version,
		       m->nvrtc_version, m->created);
	}
	if (bad)
		dg__gen_err(DG__GEN_FAIL,
			    "inspect: %zu of %zu kernels in %s are bad; rebuild with `dragon-gen build --out %s`",
			    bad, m->n_kernels, dir, dir);
	dg_manifest_destroy(m);
	return code;
}
