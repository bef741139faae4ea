/*
 * dg_bundle_build and dg_bundle_default_specs from C (dragon/runtime.h),
 * no device needed: a small list builds into a bundle the library's reader
 * accepts (every file checked against the manifest, the templates' hash,
 * no temp folder left), specs that resolve alike are one kernel, the
 * callbacks are called as documented; bad input (no folder, an empty
 * list, an invalid spec, a device without its SM, a folder that cannot be
 * made) is refused with one clear line and writes nothing; a kernel that
 * does not compile, and a stop, leave an earlier bundle as it was. The
 * default build set holds every op. (The command over it: test_cli_build.c.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "dragon/runtime.h"
#include "helpers.h"
#include "runtime/store/specset.h"

/* A sandbox: its own cache, the bundle folder root/out (not made). */
typedef struct box {
	char *root;
	char cache[600];
	char out[600];
	dg_ctx_opts jit;
} box;

static void box_init(box *b)
{
	b->root = dg_test_tmpdir();
	snprintf(b->cache, sizeof(b->cache), "%s/cache", b->root);
	snprintf(b->out, sizeof(b->out), "%s/out", b->root);
	memset(&b->jit, 0, sizeof(b->jit));
	b->jit.cache_dir = b->cache;
}

static bool exists(const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0;
}

/* The names in dir, sorted, one a line ("" for none or no folder). */
static char *listing(const char *dir)
{
	char cmd[800];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null", dir);
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p);
	char *text = calloc(1, 1 << 16);
	size_t n = fread(text, 1, (1 << 16) - 1, p);
	text[n] = '\0';
	pclose(p);
	return text;
}

/* What the callbacks saw. */
typedef struct seen {
	size_t started, total, ticks, last_done;
	size_t notes, details;
	int stop_after; /* stop once this many kernels are done; -1 never */
} seen;

static void on_progress(void *user, size_t done, size_t total, const char *file)
{
	seen *s = user;
	if (!file) {
		s->started++;
		s->total = total;
		s->last_done = 0;
		cr_expect_eq(done, 0);
		return;
	}
	cr_expect(strstr(file, ".cubin") != NULL, "%s", file);
	cr_expect_eq(done, s->last_done + 1, "one kernel at a time, in order of completion");
	s->last_done = done;
	s->ticks++;
}

static void on_note(void *user, int detail, const char *line)
{
	seen *s = user;
	cr_expect(line[0] && !strchr(line, '\n'), "a note is one line: '%s'", line);
	if (detail)
		s->details++;
	else
		s->notes++;
}

static int on_stop(void *user)
{
	const seen *s = user;
	return s->stop_after >= 0 && s->ticks >= (size_t)s->stop_after;
}

/* Loads dir's bundle with the library's reader and checks every file. */
static dg_manifest *load_bundle(const char *dir, size_t want)
{
	dg_manifest *m = NULL;
	char msg[1024], path[1024];

	cr_assert_eq(dg_manifest_load(dir, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(m->n_kernels, want);
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		snprintf(path, sizeof(path), "%s/%s", dir, k->file);
		FILE *f = fopen(path, "rb");
		cr_assert_not_null(f, "%s is listed but missing", path);
		static unsigned char bytes[4 << 20];
		size_t size = fread(bytes, 1, sizeof(bytes), f);
		fclose(f);
		cr_expect_eq(dg_manifest_kernel_verify(k, bytes, size, msg, sizeof(msg)), DG_OK, "%s: %s",
			     k->file, msg);
		cr_expect(strstr(k->spec, "tile=auto") == NULL, "tiles are resolved: %s", k->spec);
		cr_expect_gt(k->n_entries, 0);
	}
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	cr_expect_str_eq(m->template_hash, dg_codegen_template_hash(cg));
	dg_codegen_destroy(cg);
	char *names = listing(dir);
	cr_expect(strstr(names, ".dragon-build.") == NULL, "temp folder left: %s", names);
	cr_expect(strstr(names, ".tmp.") == NULL, "publish temp file left: %s", names);
	free(names);
	return m;
}

Test(bundle, builds_a_small_list)
{
	box b;
	char msg[4096];
	seen s = { .stop_after = -1 };
	dg_bundle_summary sum;

	box_init(&b);
	/* the auto tile and the tile it resolves to are one kernel */
	dg_spec specs[3] = { dg_test_spec_parse("op=pack_i8x4;latent=256"), dg_test_spec_parse("op=unpack_i8x4;latent=256"),
			     dg_test_spec_parse("op=pack_i8x4;latent=256") };
	dg_codegen *cg = NULL;
	dg_plan plan;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	cr_assert_eq(dg_codegen_plan(cg, &specs[2], &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	specs[2] = plan.spec;
	dg_codegen_destroy(cg);
	cr_assert_not(dg_tile_is_auto(&specs[2].tile));

	dg_bundle_opts o = { .out = b.out, .specs = specs, .n_specs = 3, .jobs = 2, .jit = &b.jit,
			     .device = "", .progress = on_progress, .note = on_note, .stop = on_stop,
			     .user = &s };
	cr_assert_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_str_empty(msg);
	cr_expect_eq(sum.step, DG_BUNDLE_STEP_NONE);
	cr_expect_eq(sum.specs, 3);
	cr_expect_eq(sum.kernels, 2, "specs that resolve alike are one kernel: %zu", sum.kernels);
	cr_expect_eq(sum.jobs, 2);
	cr_expect_str_empty(sum.device, "built for no device: %s", sum.device);
	cr_expect_eq(sum.sm, 0);
	cr_expect_eq(s.started, 1);
	cr_expect_eq(s.total, 2);
	cr_expect_eq(s.ticks, 2);
	cr_expect_gt(s.details, 0, "each auto tile's choice is a detail note");
	dg_manifest *m = load_bundle(b.out, 2);
	cr_expect_str_eq(m->device, "");
	dg_manifest_destroy(m);

	/* again: all cache hits, the same kernels; no summary is fine */
	cr_assert_eq(dg_bundle_build(&o, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	memset(&s, 0, sizeof(s));
	s.stop_after = -1;
	cr_assert_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_eq(sum.cache_hits, 2);
	dg_manifest_destroy(load_bundle(b.out, 2));

	/* a smaller list into the same folder: the other kernel's file goes */
	char *before = listing(b.out);
	o.n_specs = 1;
	cr_assert_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_OK, "%s", msg);
	m = load_bundle(b.out, 1);
	cr_expect(strncmp(m->kernels[0].file, "pack_i8x4-", 10) == 0, "%s", m->kernels[0].file);
	dg_manifest_destroy(m);
	char *after = listing(b.out);
	cr_expect(strstr(before, "unpack_i8x4-") && !strstr(after, "unpack_i8x4-"), "%s", after);
	free(before);
	free(after);
	dg_test_rmtree(b.root);
}

/* A device named with its SM: auto tiles resolve for it, and the manifest
 * says so. */
Test(bundle, builds_for_a_named_device)
{
	box b;
	char msg[4096];
	dg_bundle_summary sum;

	box_init(&b);
	dg_spec s = dg_test_spec_parse("op=unpack_i8x4;latent=256");
	dg_bundle_opts o = { .out = b.out, .specs = &s, .n_specs = 1, .jit = &b.jit,
			     .device = "NVIDIA H200", .sm = 90 };
	cr_assert_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_str_eq(sum.device, "NVIDIA H200");
	cr_expect_eq(sum.sm, 90);
	dg_manifest *m = load_bundle(b.out, 1);
	cr_expect_str_eq(m->device, "NVIDIA H200");
	cr_expect_eq(m->sm, 90);
	dg_manifest_destroy(m);
	dg_test_rmtree(b.root);
}

/* Each refusal: the status, the step, one line naming the cause, and no
 * folder made. */
static void expect_refused(const dg_bundle_opts *o, dg_status want, dg_bundle_step step,
			   const char *needle)
{
	char msg[4096];
	dg_bundle_summary sum;

	dg_status st = dg_bundle_build(o, &sum, msg, sizeof(msg));
	cr_expect_eq(st, want, "%s: got %s (%s)", needle, dg_status_str(st), msg);
	cr_expect_eq(sum.step, step, "%s: step %d", needle, (int)sum.step);
	cr_expect(strstr(msg, needle) != NULL, "'%s' not in: %s", needle, msg);
	cr_expect(!strchr(msg, '\n'), "one line: %s", msg);
	if (o && o->out)
		cr_expect_not(exists(o->out), "%s: %s was made", needle, o->out);
}

Test(bundle, refuses_bad_input_and_writes_nothing)
{
	box b;
	char out[800], blocker[800];

	box_init(&b);
	snprintf(out, sizeof(out), "%s/made/by/nobody", b.root);
	dg_spec good = dg_test_spec_parse("op=pack_i8x4;latent=256");

	expect_refused(NULL, DG_ERR_INVALID_ARG, DG_BUNDLE_STEP_ARGS, "NULL options");
	dg_bundle_opts o = { .out = NULL, .specs = &good, .n_specs = 1, .jit = &b.jit, .device = "" };
	expect_refused(&o, DG_ERR_INVALID_ARG, DG_BUNDLE_STEP_ARGS, "no bundle folder");
	o.out = out;
	o.n_specs = 0;
	expect_refused(&o, DG_ERR_INVALID_ARG, DG_BUNDLE_STEP_ARGS, "the list is empty");
	o.n_specs = 1;
	o.jobs = -1;
	expect_refused(&o, DG_ERR_INVALID_ARG, DG_BUNDLE_STEP_ARGS, "jobs -1");
	o.jobs = 0;

	/* an invalid spec: the op's rules, named by its place in the list */
	dg_spec bad[2] = { good, dg_test_spec_parse("op=lowrank_fwd") };
	bad[1].latent = 8190;
	o.specs = bad;
	o.n_specs = 2;
	expect_refused(&o, DG_ERR_INVALID_SPEC, DG_BUNDLE_STEP_ARGS, "specs[1]: latent=8190");
	/* an arch NVRTC cannot target */
	bad[1] = good;
	bad[1].arch = 50;
	expect_refused(&o, DG_ERR_INVALID_SPEC, DG_BUNDLE_STEP_ARGS, "specs[1]: arch=sm_50");
	/* a tile its template refuses */
	bad[1] = dg_test_spec_parse("op=lowrank_fwd;latent=256");
	char msg[512];
	cr_assert_eq(dg_spec_set(&bad[1], "tile", "48x64x64/2x2/2", msg, sizeof(msg)), DG_OK, "%s", msg);
	expect_refused(&o, DG_ERR_INVALID_SPEC, DG_BUNDLE_STEP_ARGS, "specs[1]: tile=48x64x64/2x2/2");

	/* a device without its SM */
	o.specs = &good;
	o.n_specs = 1;
	o.device = "NVIDIA H200";
	expect_refused(&o, DG_ERR_INVALID_ARG, DG_BUNDLE_STEP_ARGS, "NVIDIA H200: sm 0");
	o.device = "";

	/* a folder that cannot be made: a file where a parent should be (as
	 * root a read-only folder would not stop it) */
	dg_test_write_file(b.root, "blocker", "a file");
	snprintf(blocker, sizeof(blocker), "%s/blocker/out", b.root);
	o.out = blocker;
	expect_refused(&o, DG_ERR_IO, DG_BUNDLE_STEP_FOLDER, "blocker");
	dg_test_rmtree(b.root);
}

/* A stop before the first kernel: DG_ERR_INTERRUPTED, and the folders the
 * build made (parents too) are gone. */
Test(bundle, a_stop_leaves_nothing)
{
	box b;
	char out[900], top[800], msg[1024];
	seen s = { .stop_after = 0 };
	dg_bundle_summary sum;

	box_init(&b);
	snprintf(top, sizeof(top), "%s/made", b.root);
	snprintf(out, sizeof(out), "%s/by/the/build", top);
	dg_spec specs[2] = { dg_test_spec_parse("op=pack_i8x4;latent=256"), dg_test_spec_parse("op=unpack_i8x4;latent=256") };
	dg_bundle_opts o = { .out = out, .specs = specs, .n_specs = 2, .jit = &b.jit, .device = "",
			     .stop = on_stop, .user = &s };
	cr_expect_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_ERR_INTERRUPTED, "%s", msg);
	cr_expect_eq(sum.step, DG_BUNDLE_STEP_COMPILE);
	cr_expect(strstr(msg, "left as it was") != NULL, "%s", msg);
	cr_expect_not(exists(top), "the folders the build made stayed: %s", listing(top));
	dg_test_rmtree(b.root);
}

/* A kernel that does not compile (a template copy whose pack renders an
 * #error): DG_ERR_COMPILE naming the kernel, the log after the first line,
 * and the bundle already in the folder exactly as it was. */
Test(bundle, a_failed_kernel_leaves_the_old_bundle)
{
	box b;
	char msg[8192], path[900];
	dg_bundle_summary sum;

	box_init(&b);
	/* quantize_act's template is another file: it compiles, then pack fails */
	dg_spec specs[2] = { dg_test_spec_parse("op=quantize_act"), dg_test_spec_parse("op=pack_i8x4;latent=256") };
	dg_bundle_opts o = { .out = b.out, .specs = specs, .n_specs = 1, .jit = &b.jit, .device = "" };
	cr_assert_eq(dg_bundle_build(&o, &sum, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_test_write_file(b.out, "keep.txt", "mine");
	char *before = listing(b.out);
	snprintf(path, sizeof(path), "%s/manifest.json", b.out);
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f);
	char manifest[1 << 14];
	size_t n = fread(manifest, 1, sizeof(manifest) - 1, f);
	manifest[n] = '\0';
	fclose(f);

	/* pack's render with an #error after its CUDA, as test_cli_build.c breaks lowrank */
	char *tmpl = dg_test_templates_copy();
	snprintf(path, sizeof(path), "%s/pack.lua", tmpl);
	f = fopen(path, "rb");
	cr_assert_not_null(f);
	static char lua[1 << 16], edited[(1 << 16) + 512];
	n = fread(lua, 1, sizeof(lua) - 1, f);
	lua[n] = '\0';
	fclose(f);
	char *ret = strstr(lua, "\nreturn M");
	cr_assert_not_null(ret, "pack.lua does not end with `return M`");
	snprintf(edited, sizeof(edited),
		 "%.*s\nlocal render = M.render\n"
		 "function M.render(...)\n"
		 "  return render(...) .. \"\\n#error broken on purpose\\n\"\n"
		 "end%s",
		 (int)(ret - lua), lua, ret);
	dg_test_write_file(tmpl, "pack.lua", edited);
	b.jit.template_dir = tmpl;
	o.n_specs = 2;
	o.jobs = 1;
	dg_status st = dg_bundle_build(&o, &sum, msg, sizeof(msg));
	cr_expect_eq(st, DG_ERR_COMPILE, "%s: %s", dg_status_str(st), msg);
	cr_expect_eq(sum.step, DG_BUNDLE_STEP_COMPILE);
	cr_expect(strstr(sum.failed, "op=pack_i8x4;") && !strstr(sum.failed, "tile=auto"),
		  "names the kernel, its tile resolved: %s", sum.failed);
	cr_expect(strstr(msg, "broken on purpose") != NULL, "the log follows: %s", msg);
	char *after = listing(b.out);
	cr_expect_str_eq(after, before, "the folder changed");
	snprintf(path, sizeof(path), "%s/manifest.json", b.out);
	FILE *g = fopen(path, "rb");
	cr_assert_not_null(g);
	char again[1 << 14];
	n = fread(again, 1, sizeof(again) - 1, g);
	again[n] = '\0';
	fclose(g);
	cr_expect_str_eq(again, manifest, "the manifest changed");
	free(before);
	free(after);
	dg_test_rmtree(tmpl);
	dg_test_rmtree(b.root);
}

/* The default build set: the size the op table's build lists make, every
 * op, distinct specs that all validate. */
Test(bundle, default_specs_hold_every_op)
{
	dg_spec *specs = NULL;
	size_t n = 0;
	char msg[1024], text[DG_SPEC_TEXT_MAX], other[DG_SPEC_TEXT_MAX];

	cr_assert_eq(dg_bundle_default_specs(&specs, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_eq(n, DG__SPECSET_DEFAULT_SIZE);
	for (int op = 0; op < DG_OP__COUNT; op++) {
		size_t have = 0;
		for (size_t i = 0; i < n; i++)
			have += specs[i].op == (dg_op)op;
		cr_expect_gt(have, 0, "the default set has no %s", dg_op_name((dg_op)op));
	}
	for (size_t i = 0; i < n; i++) {
		cr_expect_eq(dg_spec_validate(&specs[i], msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_expect(dg_tile_is_auto(&specs[i].tile) || !(dg_spec_uses(specs[i].op) & DG_FIELD_TILE));
		dg_spec_to_string(&specs[i], text, sizeof(text));
		for (size_t k = 0; k < i; k++) {
			dg_spec_to_string(&specs[k], other, sizeof(other));
			cr_expect_str_neq(text, other, "twice: %s", text);
		}
	}
	free(specs);
	cr_expect_eq(dg_bundle_default_specs(NULL, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
}
