/*
 * dragon-gen render: the CUDA source of exactly one spec, for reading,
 * diffing and debugging templates (a failed build points here); or its
 * canonical text, or the template's plan of it.
 *
 * The spec is planned as the library plans it — an auto tile becomes the
 * template's default (no tuning record is asked: `inspect` and `build`
 * resolve for a device) — and its target is one NVRTC can compile for, so
 * what render shows is what a build of the same flags compiles.
 */
#include <stdio.h>
#include <string.h>

#include "base/publish.h"
#include "cli/common/cli.h"
#include "cli/common/scan.h"
#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/specset.h"
#include "dragon/codegen.h"

enum { OPT_HELP = 1, OPT_OUTPUT, OPT_CANONICAL, OPT_PLAN, OPT_VERBOSE };

static const dg__cli_opt opts[] = {
	{ "help", 'h', false, OPT_HELP },
	{ "output", 'o', true, OPT_OUTPUT },
	{ "canonical", 0, false, OPT_CANONICAL },
	{ "plan", 0, false, OPT_PLAN },
	{ "verbose", 'v', false, OPT_VERBOSE },
	DG__SPEC_OPTS
	{ NULL, 0, false, 0 },
};

static void help(void)
{
	printf("usage: dragon-gen render [spec flags] [-o FILE] [--canonical | --plan]\n\n"
	       "Prints the CUDA source generated for one spec (the spec flags must\n"
	       "name exactly one kernel). The source starts with a banner holding\n"
	       "the canonical spec. An auto tile is the template's default.\n\n"
	       "  -o, --output FILE  write to FILE (atomically) instead of stdout\n"
	       "      --canonical    print only the canonical spec (tile resolved)\n"
	       "      --plan         print the template's plan instead: the path, the\n"
	       "                     tile, the target, and each entry's threads a block\n"
	       "                     and dynamic shared memory\n"
	       "  -v, --verbose      on a template error, also print the traceback\n"
	       "  -h, --help         this text\n\n");
	dg__specset_help(stdout, false);
	printf("\nExample: dragon-gen render --op lowrank_fwd --weight ternary --relu 0\n");
}

static int emit(const char *path, const char *text)
{
	char err[1024];

	if (!path || strcmp(path, "-") == 0) {
		fputs(text, stdout);
		return DG__CLI_OK;
	}
	dg_status st = dg__publish_file(path, text, strlen(text), err, sizeof(err));
	if (st)
		return dg__cli_err(DG__CLI_FAIL, st, "render -o %s", err);
	return DG__CLI_OK;
}

/* The plan as text: what the template says the kernel is. */
static int plan_text(const dg_plan *p, const char *path)
{
	char text[4096], tile[64];
	size_t n = 0;

	dg_tile_to_string(&p->spec.tile, tile, sizeof(tile));
	n += (size_t)snprintf(text + n, sizeof(text) - n,
			      "spec:    %s\npath:    %s\ntile:    %s\narch:    sm_%d%s\nprogram: %s\n",
			      p->canonical, p->path, tile, p->spec.arch,
			      p->spec.arch_specific ? "a" : "", p->program);
	for (int i = 0; i < p->n_entries && n < sizeof(text); i++)
		n += (size_t)snprintf(text + n, sizeof(text) - n,
				      "entry:   %s  threads %d  smem %d\n", p->entries[i].name,
				      p->entries[i].threads, p->entries[i].smem);
	return emit(path, text);
}

typedef enum what { SOURCE, CANONICAL, PLAN } what;

static int render(dg_codegen *cg, const dg_spec *spec, what w, const char *path, bool verbose)
{
	dg_source *src = NULL;
	dg_plan plan;
	int code;

	dg_status st = dg_codegen_plan(cg, spec, &plan);
	if (!st && w == SOURCE)
		st = dg_codegen_render(cg, spec, &src);
	if (st) {
		const char *why = dg_codegen_errmsg(cg);
		code = dg__cli_fail(st, "%s%s", st == DG_ERR_INVALID_SPEC ? "" : "render: ", why);
		if (verbose && strchr(why, '\n'))
			fprintf(stderr, "%s\n", why);
	} else if (w == CANONICAL) {
		char text[DG_SPEC_TEXT_MAX + 2];
		snprintf(text, sizeof(text), "%s\n", plan.canonical);
		code = emit(path, text);
	} else if (w == PLAN) {
		code = plan_text(&plan, path);
	} else {
		code = emit(path, src->text);
	}
	dg_source_destroy(src);
	return code;
}

int dg__gen_cmd_render(int argc, char **argv)
{
	dg__cli_scan_state sc;
	dg__spec_flags flags = { { 0 } };
	dg__specset set = { 0 };
	dg_codegen *cg = NULL;
	const char *out = NULL, *arg;
	what w = SOURCE;
	bool verbose = false;
	char msg[1024];
	int id, code = DG__CLI_OK;

	dg__cli_scan_init(&sc, argc, argv, "render");
	while ((id = dg__cli_scan(&sc, opts, &arg)) != DG__CLI_SCAN_END) {
		switch (id) {
		case OPT_HELP:
			help();
			goto out;
		case OPT_OUTPUT:
			out = arg;
			break;
		case OPT_CANONICAL:
		case OPT_PLAN:
			if (w != SOURCE && w != (id == OPT_PLAN ? PLAN : CANONICAL)) {
				code = dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
						   "render: --canonical and --plan contradict each other; give one");
				goto out;
			}
			w = id == OPT_PLAN ? PLAN : CANONICAL;
			break;
		case OPT_VERBOSE:
			verbose = true;
			break;
		case DG__CLI_SCAN_ARG:
			code = dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "render takes no arguments, got '%s'; name the spec with flags (see `dragon-gen render --help`)",
					   arg);
			goto out;
		case DG__CLI_SCAN_ERROR:
			code = DG__CLI_USAGE;
			goto out;
		default:
			if (!dg__spec_flags_add(&flags, id, arg)) {
				code = DG__CLI_FAIL;
				goto out;
			}
		}
	}
	if (!dg__spec_flags_any(&flags)) {
		code = dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "render needs spec flags naming one kernel, e.g. --op pack_i8x4");
		goto out;
	}
	dg_status st = dg_codegen_create(&cg, NULL);
	if (st) {
		code = dg__cli_fail(st, "render: %s", cg ? dg_codegen_errmsg(cg) : dg_status_str(st));
		goto out;
	}
	st = dg__specset_expand(cg, &flags, &set, msg, sizeof(msg));
	if (st) {
		code = dg__cli_fail(st, "%s", msg);
		goto out;
	}
	if (set.n != 1) {
		code = dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "render takes one spec; got %zu (narrow the lists, e.g. with --op)",
				   set.n);
		goto out;
	}
	dg__specset_note_dropped(&set);
	code = render(cg, &set.specs[0], w, out, verbose);
out:
	dg__specset_free(&set);
	dg_codegen_destroy(cg);
	dg__spec_flags_free(&flags);
	return code;
}
