/*
 * dragon-gen inspect: is this bundle whole? Loads DIR/manifest.json and
 * checks every file it lists: present, the recorded size and SHA-256, and
 * a cubin header for the recorded SM (dg_manifest_kernel_verify).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/gen/gen.h"
#include "codegen/gen/util.h"
#include "dragon/manifest.h"

#define MAX_FILE_BYTES ((size_t)1 << 30)

enum { OPT_HELP = 1, OPT_JSON, OPT_VERBOSE };

static const dg__gen_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "json", 0, false, OPT_JSON },
	{ "verbose", 'v', false, OPT_VERBOSE },
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen inspect DIR [--json] [-v]\n\n"
	       "Checks a bundle made by `dragon-gen build --out DIR`: the manifest\n"
	       "parses, every kernel file it lists exists with the recorded size and\n"
	       "SHA-256, and every cubin is a CUDA ELF for the recorded SM.\n"
	       "Exit status 1 names each bad file.\n\n"
	       "  --json         the manifest plus a per-kernel verdict on stdout\n"
	       "  -v, --verbose  one line per kernel\n"
	       "  -h, --help     this text\n");
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

int dg__gen_cmd_inspect(int argc, char **argv)
{
	dg__gen_scan_state sc;
	const char *arg, *dir = NULL;
	bool json = false, verbose = false;
	char msg[2048];
	int id;

	dg__gen_scan_init(&sc, argc, argv, "inspect");
	while ((id = dg__gen_scan(&sc, opts, &arg)) != DG__GEN_SCAN_END) {
		if (id == OPT_HELP) {
			help();
			return DG__GEN_OK;
		} else if (id == OPT_JSON) {
			json = true;
		} else if (id == OPT_VERBOSE) {
			verbose = true;
		} else if (id == DG__GEN_SCAN_ARG) {
			if (dir)
				return dg__gen_err(DG__GEN_USAGE,
						   "inspect takes one folder, got '%s' and '%s'",
						   dir, arg);
			dir = arg;
		} else {
			return DG__GEN_USAGE;
		}
	}
	if (!dir)
		return dg__gen_err(DG__GEN_USAGE,
				   "inspect needs the bundle folder: dragon-gen inspect DIR");

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
