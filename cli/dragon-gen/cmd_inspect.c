/*
 * dragon-gen inspect: is this bundle whole, and is it this library's?
 * Loads DIR/manifest.json and checks every file it lists: present, the
 * recorded size and SHA-256, and a cubin header for the recorded SM
 * (dg_manifest_kernel_verify). A bundle of this generator and these
 * templates has each kernel's key recomputed from its spec (dg_jit_key),
 * so a manifest whose spec and key disagree is caught; one of other
 * templates is reported as one the runtime will not load
 * (dg_device_load_bundle refuses it).
 *
 * With spec flags instead of a folder: which tile each spec runs with and
 * why — a tuning record (tune.h; the DB of --tune-db, $DRAGON_TUNE_DB or
 * the cache's tune/ folder, above the built-in records, for the device
 * --device/--sm name or the one device the records name for the spec's
 * SM) or the template's default. No GPU is needed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/common/cli.h"
#include "cli/common/files.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/jit.h"
#include "dragon/manifest.h"

#define MAX_FILE_BYTES ((size_t)1 << 30)

enum { OPT_HELP = 1, OPT_JSON, OPT_VERBOSE, OPT_DEVICE, OPT_SM, OPT_TUNE_DB, OPT_CACHE_DIR };

static const dg__cli_opt opts[] = {
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
	       "       dragon-gen inspect [spec flags] [--device NAME --sm N | --device none]\n"
	       "                          [--tune-db PATH]\n\n"
	       "Checks a bundle made by `dragon-gen build --out DIR`: the manifest\n"
	       "parses, every kernel file it lists exists with the recorded size and\n"
	       "SHA-256, every cubin is a CUDA ELF for the recorded SM, and (for a\n"
	       "bundle of this library's templates) every key is its spec's.\n"
	       "Exit status 1 names each bad kernel, or says the bundle was built from\n"
	       "other templates (the runtime would refuse to load it).\n\n"
	       "With spec flags instead of DIR: the tile each spec runs with, from a\n"
	       "tuning record or the template's default, and why, e.g.\n"
	       "  tile: 128x128x64/2x4/4 (tuned: /path/record.json)\n"
	       "No GPU is needed: the device is --device/--sm, else the one device\n"
	       "the records name for the spec's SM.\n\n"
	       "  --json           the manifest plus a per-kernel verdict (or the tile\n"
	       "                   choices) on stdout\n"
	       "  -v, --verbose    one line per kernel\n"
	       "  --device NAME    the device records are looked up for (with --sm;\n"
	       "                   none: no device)\n"
	       "  --sm N           its SM, 90 for sm_90\n"
	       "  --tune-db PATH   records: a file or folder (default $DRAGON_TUNE_DB,\n"
	       "                   else <cache root>/tune; built-in records below;\n"
	       "                   none: no records)\n"
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
	dg_status st = dg__cli_read_file(path, MAX_FILE_BYTES, &bytes, &n, why,
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
	dg_codegen *cg = NULL;
	char msg[1024], line[1600], text[DG_SPEC_TEXT_MAX], name[128];

	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		int code = dg__cli_fail(st, "inspect: %s",
					cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		dg_codegen_destroy(cg);
		return code;
	}
	st = dg__specset_expand(cg, &a->flags, &set, msg, sizeof(msg));
	if (st) {
		dg_codegen_destroy(cg);
		return dg__cli_fail(st, "%s", msg);
	}
	dg__specset_note_dropped(&set);
	int code = dg__gen_tune_open(a->tune_db, a->cache_dir, a->device, a->sm, "inspect",
				     a->verbose, &t);
	cJSON *arr = !code && a->json ? cJSON_CreateArray() : NULL;
	for (size_t i = 0; !code && i < set.n; i++) {
		dg_tune_choice ch;
		const dg_spec *s = &set.specs[i];
		char tile[64];
		int sm;

		dg__gen_tune_device_for(&t, s, name, sizeof(name), &sm);
		st = dg__gen_tune_resolve(&t, cg, s, &ch);
		if (st) {
			code = dg__cli_fail(st, "%s", dg_codegen_errmsg(cg));
			break;
		}
		dg_tile_to_string(&ch.spec.tile, tile, sizeof(tile));
		if (!(dg_spec_uses(s->op) & DG_FIELD_TILE))
			snprintf(line, sizeof(line), "tile: none (op %s takes none)", dg_op_name(s->op));
		else if (!dg_tile_is_auto(&s->tile))
			snprintf(line, sizeof(line), "tile: %s (named by the spec)", tile);
		else
			dg__gen_tile_line(&ch, line, sizeof(line));
		dg_spec_to_string(s, text, sizeof(text));
		if (arr) {
			cJSON *o = cJSON_CreateObject();
			cJSON_AddStringToObject(o, "spec", text);
			cJSON_AddStringToObject(o, "device", name);
			cJSON_AddNumberToObject(o, "sm", sm);
			cJSON_AddStringToObject(o, "tile", tile);
			cJSON_AddBoolToObject(o, "arch_specific", ch.spec.arch_specific);
			cJSON_AddBoolToObject(o, "tuned", ch.tuned);
			cJSON_AddStringToObject(o, "record", ch.record);
			cJSON_AddStringToObject(o, "why", ch.tuned ? "" : ch.why);
			cJSON_AddStringToObject(o, "runs", ch.plan.canonical);
			cJSON_AddStringToObject(o, "path", ch.plan.path);
			cJSON_AddItemToArray(arr, o);
		} else {
			char dev[200] = "no device";
			if (name[0])
				snprintf(dev, sizeof(dev), "%s (sm_%d)", name, sm);
			printf("spec: %s\nfor:  %s\n%s\nruns: %s (%s)\n", text, dev, line,
			       ch.plan.canonical, ch.plan.path);
		}
	}
	if (arr) {
		if (code)
			cJSON_Delete(arr);
		else
			code = dg__cli_json_print(arr);
	}
	dg__gen_tune_close(&t);
	dg__specset_free(&set);
	dg_codegen_destroy(cg);
	return code;
}

static int parse_args(int argc, char **argv, inspect_args *a)
{
	dg__cli_scan_state sc;
	const char *arg;
	int id;

	dg__cli_scan_init(&sc, argc, argv, "inspect");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
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
		case DG__CLI_SCAN_ARG:
			if (a->dir)
				return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "inspect takes one folder, got '%s' and '%s'",
						   a->dir, arg);
			a->dir = arg;
			break;
		case DG__CLI_SCAN_ERROR:
			return DG__CLI_USAGE;
		default:
			if (!dg__spec_flags_add(&a->flags, id, arg))
				return DG__CLI_FAIL;
		}
	}
	bool any = dg__spec_flags_any(&a->flags);
	if (a->dir && any)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "inspect takes a bundle folder or spec flags, not both");
	if (!a->dir && !any)
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "inspect needs the bundle folder (dragon-gen inspect DIR) or spec flags (dragon-gen inspect --op lowrank_fwd)");
	if (a->dir && (a->device || a->sm || a->tune_db || a->cache_dir))
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "--device, --sm, --tune-db and --cache-dir go with spec flags, not with a bundle folder");
	return DG__CLI_OK;
}

/* "1 kernel", "3 kernels" */
static const char *plural(size_t n)
{
	return n == 1 ? "" : "s";
}

/* Whether m comes from this generator and these templates: the only
 * bundles the runtime loads, and the only ones whose keys can be
 * recomputed here. why: what differs. */
static bool same_templates(const dg_manifest *m, dg_ctx *ctx, char *why, size_t size)
{
	const char *hash = dg_codegen_template_hash(dg_ctx_codegen(ctx));
	if (strcmp(m->generator_version, DG_GENERATOR_VERSION) == 0 &&
	    strcmp(m->template_hash, hash) == 0)
		return true;
	snprintf(why, size,
		 "built by generator %s from templates %.12s..., but this library is generator %s with templates %.12s...: other templates, so dg_device_load_bundle refuses it; rebuild it with this dragon-gen",
		 m->generator_version, m->template_hash, DG_GENERATOR_VERSION, hash);
	return false;
}

/* Holds k's key against the one its spec gives here. */
static dg_status check_key(dg_ctx *ctx, const dg_manifest_kernel *k, char *why, size_t size)
{
	char key[DG_CACHE_KEY_LEN + 1], canon[DG_SPEC_TEXT_MAX], msg[1024];
	dg_spec spec;

	dg_status st = dg_spec_parse(k->spec, &spec, msg, sizeof(msg));
	if (!st && (st = dg_jit_key(ctx, &spec, key, canon)))
		snprintf(msg, sizeof(msg), "%s", dg_ctx_errmsg(ctx));
	if (st) {
		snprintf(why, size, "spec %.300s: %.600s", k->spec, msg);
		return DG_ERR_CORRUPT;
	}
	if (strcmp(canon, k->spec) != 0) {
		snprintf(why, size, "spec %.300s is not what it plans to here (%.300s)", k->spec,
			 canon);
		return DG_ERR_CORRUPT;
	}
	if (strcmp(key, k->key) != 0) {
		snprintf(why, size,
			 "key %.16s... is not its spec's (%.16s... here): the manifest was edited or the file is another kernel",
			 k->key, key);
		return DG_ERR_CORRUPT;
	}
	return DG_OK;
}

static int inspect_bundle(const inspect_args *a)
{
	const char *dir = a->dir;
	char msg[2048], other[1024] = "";
	dg_manifest *m = NULL;
	dg_ctx *ctx = NULL;

	dg_status st = dg_manifest_load(dir, &m, msg, sizeof(msg));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "inspect: %s", msg);
	dg_ctx_opts co = { .no_cache = true };
	st = dg_ctx_create(&ctx, &co);
	if (st) {
		int code = dg__cli_fail(st, "inspect: %s", ctx ? dg_ctx_errmsg(ctx) : dg_status_str(st));
		dg_ctx_destroy(ctx);
		dg_manifest_destroy(m);
		return code;
	}
	bool ours = same_templates(m, ctx, other, sizeof(other));
	/* the key holds the NVRTC version: another one's keys differ anyway */
	bool keys = ours && strcmp(m->nvrtc_version, dg_nvrtc_version()) == 0;
	if (ours && !keys)
		dg__cli_note(a->verbose, "inspect: %s: keys not checked: built with NVRTC %s, this is %s",
			     dir, m->nvrtc_version, dg_nvrtc_version());
	cJSON *verdicts = a->json ? cJSON_CreateArray() : NULL;
	size_t bad = 0;
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		char why[1024] = "";
		bool ok = check_kernel(dir, k, why, sizeof(why)) == DG_OK;
		if (ok && keys)
			ok = check_key(ctx, k, why, sizeof(why)) == DG_OK;
		if (!ok) {
			bad++;
			dg__cli_err(DG__CLI_FAIL, DG_ERR_CORRUPT, "inspect: %s/%s: %s", dir, k->file,
				    why);
		} else if (a->verbose) {
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
	char summary[4096] = "";
	if (!ours)
		snprintf(summary, sizeof(summary), "inspect: %s: %s", dir, other);
	else if (bad)
		snprintf(summary, sizeof(summary),
			 "inspect: %zu of %zu kernel%s in %s %s bad; rebuild with `dragon-gen build --out %s`",
			 bad, m->n_kernels, plural(m->n_kernels), dir, bad == 1 ? "is" : "are", dir);
	int code = summary[0] ? DG__CLI_FAIL : DG__CLI_OK;
	if (summary[0])
		dg__cli_err(DG__CLI_FAIL, ours ? DG_ERR_CORRUPT : DG_ERR_UNSUPPORTED, "%s", summary);
	if (a->json) {
		char *text = NULL;
		cJSON *root = NULL;
		if (dg_manifest_to_json(m, &text, msg, sizeof(msg)) == DG_OK)
			root = cJSON_Parse(text);
		free(text);
		if (root) {
			cJSON_AddBoolToObject(root, "ok", code == DG__CLI_OK);
			cJSON_AddBoolToObject(root, "loadable", ours);
			cJSON_AddBoolToObject(root, "keys_checked", keys);
			if (summary[0]) {
				cJSON_AddStringToObject(root, "error",
							summary + strlen("inspect: "));
				cJSON_AddStringToObject(root, "status",
							dg_status_str(ours ? DG_ERR_CORRUPT
									   : DG_ERR_UNSUPPORTED));
				cJSON_AddNumberToObject(root, "exit", code);
			}
			cJSON_AddItemToObject(root, "verdicts", verdicts);
			verdicts = NULL;
		}
		cJSON_Delete(verdicts);
		int jc = dg__cli_json_print(root);
		code = code ? code : jc;
	} else if (!summary[0]) {
		char dev[200] = "no device";
		if (m->device[0])
			snprintf(dev, sizeof(dev), "%s (sm_%d)", m->device, m->sm);
		printf("%s: %zu kernel%s ok, keys %s (manifest format %d, generator %s, templates %.12s..., NVRTC %s, for %s, created %s)\n",
		       dir, m->n_kernels, plural(m->n_kernels), keys ? "checked" : "not checked",
		       m->format, m->generator_version, m->template_hash, m->nvrtc_version, dev,
		       m->created);
	}
	dg_ctx_destroy(ctx);
	dg_manifest_destroy(m);
	return code;
}

int dg__gen_cmd_inspect(int argc, char **argv)
{
	inspect_args a;

	memset(&a, 0, sizeof(a));
	int code = parse_args(argc, argv, &a);
	if (!code)
		code = a.dir ? inspect_bundle(&a) : explain(&a);
	dg__spec_flags_free(&a.flags);
	return code < 0 ? DG__CLI_OK : code;
}
