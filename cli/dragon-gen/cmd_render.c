/*
 * dragon-gen render: the CUDA source of exactly one spec, for reading,
 * diffing and debugging templates (a failed build points here).
 */
#include <stdio.h>
#include <string.h>

#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "cli/dragon-gen/util.h"
#include "dragon/codegen.h"

enum { OPT_HELP = 1, OPT_OUTPUT, OPT_CANONICAL, OPT_VERBOSE };

static const dg__gen_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "output", 'o', true, OPT_OUTPUT },
	{ "canonical", 0, false, OPT_CANONICAL },
	{ "verbose", 'v', false, OPT_VERBOSE },
	DG__SPEC_OPTS
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen render [spec flags] [-o FILE] [--canonical]\n\n"
	       "Prints the CUDA source generated for one spec (the spec flags must\n"
	       "name exactly one kernel). The source starts with a banner holding\n"
	       "the canonical spec.\n\n"
	       "  -o, --output FILE  write to FILE (atomically) instead of stdout\n"
	       "      --canonical    print only the canonical spec (tile resolved)\n"
	       "  -v, --verbose      on a template error, also print the traceback\n"
	       "  -h, --help         this text\n\n%s\n"
	       "Example: dragon-gen render --op lowrank_fwd --weight ternary --relu 0\n",
	       dg__specset_help);
}

static int emit(const char *path, const char *text)
{
	char err[1024];

	if (!path || strcmp(path, "-") == 0) {
		fputs(text, stdout);
		return DG__GEN_OK;
	}
	dg_status st = dg__gen_write_file_atomic(path, text, strlen(text), err,
						 sizeof(err));
	if (st)
		return dg__gen_err(DG__GEN_FAIL, "render -o %s", err);
	return DG__GEN_OK;
}

/* The canonical text the kernel is known by: normalized, tile resolved
 * (what the source banner, cache keys and manifests carry). */
static int canonical(const dg_spec *spec, const char *path)
{
	char text[DG_SPEC_TEXT_MAX + 1];
	dg_spec s = *spec;

	dg_spec_normalize(&s);
	dg_spec_default_tile(&s, &s.tile);
	if (dg_spec_to_string(&s, text, DG_SPEC_TEXT_MAX))
		return dg__gen_err(DG__GEN_FAIL, "render: spec text too long");
	strcat(text, "\n");
	return emit(path, text);
}

static int render(const dg_spec *spec, const char *path, bool verbose)
{
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	int code;

	dg_status st = dg_codegen_create(&cg, NULL);
	if (!st)
		st = dg_codegen_render(cg, spec, &src);
	if (st) {
		const char *why = cg ? dg_codegen_errmsg(cg) : dg_status_str(st);
		code = dg__gen_err(DG__GEN_FAIL, "render: %s", why);
		if (verbose && strchr(why, '\n'))
			fprintf(stderr, "%s\n", why);
	} else {
		code = emit(path, src->text);
	}
	dg_source_destroy(src);
	dg_codegen_destroy(cg);
	return code;
}

int dg__gen_cmd_render(int argc, char **argv)
{
	dg__gen_scan_state sc;
	dg__spec_flags flags = { { 0 } };
	dg__specset set = { 0 };
	const char *out = NULL, *arg;
	bool canon = false, verbose = false;
	char msg[1024];
	int id, code = DG__GEN_OK;

	dg__gen_scan_init(&sc, argc, argv, "render");
	while ((id = dg__gen_scan(&sc, opts, &arg)) != DG__GEN_SCAN_END) {
		switch (id) {
		case OPT_HELP:
			help();
			goto out;
		case OPT_OUTPUT:
			out = arg;
			break;
		case OPT_CANONICAL:
			canon = true;
			break;
		case OPT_VERBOSE:
			verbose = true;
			break;
		case DG__GEN_SCAN_ARG:
			code = dg__gen_err(DG__GEN_USAGE,
					   "render takes no arguments, got '%s'; name the spec with flags (see `dragon-gen render --help`)",
					   arg);
			goto out;
		case DG__GEN_SCAN_ERROR:
			code = DG__GEN_USAGE;
			goto out;
		default:
			if (!dg__spec_flags_add(&flags, id, arg)) {
				code = DG__GEN_FAIL;
				goto out;
			}
		}
	}
	if (!dg__spec_flags_any(&flags)) {
		code = dg__gen_err(DG__GEN_USAGE,
				   "render needs spec flags naming one kernel, e.g. --op pack_i8x4");
		goto out;
	}
	dg_status st = dg__specset_expand(&flags, &set, msg, sizeof(msg));
	if (st) {
		code = dg__gen_err(dg__gen_exit_for(st), "%s", msg);
		goto out;
	}
	dg__gen_note(verbose, "spec flags expand to %zu kernels (%zu combinations of out-format=uint8pos with relu=none left out)",
		     set.n, set.dropped);
	if (set.n != 1) {
		code = dg__gen_err(DG__GEN_USAGE,
				   "render takes one spec; got %zu (narrow the lists, e.g. with --op)",
				   set.n);
		goto out;
	}
	code = canon ? canonical(&set.specs[0], out)
		     : render(&set.specs[0], out, verbose);
out:
	dg__specset_free(&set);
	dg__spec_flags_free(&flags);
	return code;
}
