/*
 * dragon-gen build and inspect, end to end (see test_cli.c for the
 * sandbox): every file of a built product passes the cubin check, a second
 * build is all cache hits, a failed or interrupted build leaves the output
 * folder as it was, inspect catches a damaged bundle, and the built-in
 * default set builds in full.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli/dragon-gen/specset.h"
#include "dragon/cubin.h"
#include "dragon/manifest.h"
#include "helpers.h"

#include "cli_helpers.h"

/* ---- build + inspect -------------------------------------------------------- */

/* Loads sb->out's manifest and checks every file as a user would. */
static dg_manifest *check_bundle(const sandbox *sb, size_t want_kernels)
{
	dg_manifest *m = NULL;
	char msg[1024], path[1024];

	cr_assert_eq(dg_manifest_load(sb->out, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(m->n_kernels, want_kernels);
	for (size_t i = 0; i < m->n_kernels; i++) {
		const dg_manifest_kernel *k = &m->kernels[i];
		size_t size;
		snprintf(path, sizeof(path), "%s/%s", sb->out, k->file);
		cr_assert(exists(path), "%s is listed but missing", path);
		char *bytes = slurp(path, &size);
		cr_expect_not(k->ptx);
		cr_expect_eq(dg_cubin_check(bytes, size, k->arch, msg, sizeof(msg)), DG_OK,
			     "%s: %s", k->file, msg);
		cr_expect_eq(dg_manifest_kernel_verify(k, bytes, size, msg, sizeof(msg)),
			     DG_OK, "%s: %s", k->file, msg);
		cr_expect_gt(k->n_entries, 0);
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "%.*s-%.16s.cubin",
			 (int)strcspn(k->file, "-"), k->file, k->key);
		cr_expect_str_eq(k->file, prefix, "file is named <op>-<key16>.cubin");
		free(bytes);
	}
	char *names = listing(sb->out);
	cr_expect(strstr(names, ".dragon-build.") == NULL, "temp folder left: %s", names);
	free(names);
	return m;
}

Test(cli, build_product_then_all_cache_hits)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--weight", "int8,ternary", "--relu",
	    "none,0", "--latent", "256", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	const cJSON *ks = cJSON_GetObjectItem(j, "kernels");
	cr_assert_eq(cJSON_GetArraySize(ks), 4);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "kernels"), 4);
	cr_expect(strstr(r.err, "built 4 kernels") != NULL, "summary line: %s", r.err);
	cr_expect_eq(count_lines(r.err), 1, "quiet when not a TTY: %s", r.err);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest *m = check_bundle(&sb, 4);
	for (size_t i = 0; i < 4; i++)
		cr_expect(strstr(m->kernels[i].spec, "latent=256;") != NULL);
	dg_manifest_destroy(m);

	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--weight", "int8,ternary", "--relu",
	    "none,0", "--latent", "256", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "cache_hits"), 4,
		     "second build must be all cache hits");
	const cJSON *k;
	cJSON_ArrayForEach(k, cJSON_GetObjectItem(j, "kernels"))
		cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(k, "cache_hit")));
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest_destroy(check_bundle(&sb, 4));
	sandbox_fini(&sb);
}

Test(cli, inspect_good_and_truncated_bundle)
{
	sandbox sb;
	run r;
	char path[1024], msg[512];

	sandbox_init(&sb);
	gen(&sb, &r, "build", "--op", "pack_i8x4,unpack_i8x4", "--out", sb.out, "-q", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect_str_empty(r.err, "-q: %s", r.err);
	run_free(&r);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "2 kernels ok") != NULL, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "inspect", sb.out, "--json", NULL);
	cr_expect_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
	cJSON_Delete(j);
	run_free(&r);

	dg_manifest *m = NULL;
	cr_assert_eq(dg_manifest_load(sb.out, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	snprintf(path, sizeof(path), "%s/%s", sb.out, m->kernels[1].file);
	cr_assert_eq(truncate(path, (off_t)m->kernels[1].size / 2), 0);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 1, "a truncated cubin must fail inspect");
	cr_expect(strstr(r.err, m->kernels[1].file) != NULL, "names the file: %s", r.err);
	cr_expect(strstr(r.err, "truncated") != NULL, "%s", r.err);
	cr_expect(strstr(r.err, m->kernels[0].file) == NULL, "the good file is not named");
	run_free(&r);
	unlink(path);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 1);
	cr_expect(strstr(r.err, "missing") != NULL, "%s", r.err);
	run_free(&r);
	snprintf(path, sizeof(path), "%s/manifest.json", sb.out);
	unlink(path);
	gen(&sb, &r, "inspect", sb.out, NULL);
	expect_one_line_error(&r, 1, "manifest.json");
	run_free(&r);
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* A copy of templates/ in the sandbox with lowrank.lua broken: `mode` 0
 * fails when the module loads (line 1), 1 when it renders (the line after
 * `function M.render`, returned in *line), 2 renders CUDA that NVRTC
 * refuses (an #error appended to the source). */
static void broken_templates(const sandbox *sb, char *dir, size_t size, int mode,
			     int *line)
{
	char cmd[8192], path[4096];

	snprintf(dir, size, "%s/templates-%d", sb->root, mode);
	snprintf(cmd, sizeof(cmd), "cp -r '%s/templates' '%s'", DG_SOURCE_DIR, dir);
	cr_assert_eq(system(cmd), 0);
	snprintf(path, sizeof(path), "%s/lowrank.lua", dir);
	char *orig = slurp(path, NULL);
	const char *bad = "error(\"broken on purpose\")\n";
	size_t at = 0;
	*line = 1;
	if (mode == 2) {
		char *ret = strstr(orig, "\nreturn M");
		cr_assert_not_null(ret, "lowrank.lua does not end with `return M`");
		at = (size_t)(ret + 1 - orig);
		bad = "local render = M.render\n"
		      "function M.render(spec)\n"
		      "  local s, e, n = render(spec)\n"
		      "  return s .. \"\\n#error broken on purpose\\n\", e, n\n"
		      "end\n";
	}
	if (mode == 1) {
		char *fn = strstr(orig, "\nfunction M.render(");
		cr_assert_not_null(fn, "lowrank.lua has no `function M.render(`");
		at = (size_t)(strchr(fn + 1, '\n') + 1 - orig);
		for (size_t i = 0; i < at; i++)
			*line += orig[i] == '\n';
	}
	char *out = malloc(strlen(orig) + strlen(bad) + 1);
	sprintf(out, "%.*s%s%s", (int)at, orig, bad, orig + at);
	dg_test_write_file(dir, "lowrank.lua", out);
	free(out);
	free(orig);
}

/* A template that fails, on load or on render: exit 1, the message names
 * the template file and line, and the out folder is exactly as it was. */
Test(cli, failed_build_leaves_out_dir_alone)
{
	sandbox sb;
	run r;
	char tmpl[3][700], want[64], mpath[800];
	int line[3];

	sandbox_init(&sb);
	for (int mode = 0; mode < 3; mode++)
		broken_templates(&sb, tmpl[mode], sizeof(tmpl[mode]), mode, &line[mode]);

	/* an out folder with an earlier bundle in it */
	gen(&sb, &r, "build", "--op", "pack_i8x4", "--out", sb.out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	dg_test_write_file(sb.out, "keep.txt", "mine");
	char *before = listing(sb.out);
	snprintf(mpath, sizeof(mpath), "%s/manifest.json", sb.out);
	char *manifest_before = slurp(mpath, NULL);

	for (int mode = 0; mode < 3; mode++) {
		sb.template_dir = tmpl[mode];
		/* pack and quantize compile fine first (-j1), lowrank fails:
		 * nothing may land */
		gen(&sb, &r, "build", "--op", "pack_i8x4,quantize_act,lowrank_fwd", "-j1",
		    "--out", sb.out, "--latent", "512", NULL);
		if (mode < 2)
			snprintf(want, sizeof(want), "templates/lowrank.lua:%d: broken on purpose",
				 line[mode]);
		else
			snprintf(want, sizeof(want), "compile error in ");
		expect_one_line_error(&r, 1, want);
		cr_expect(strstr(r.err, "broken on purpose") != NULL, "%s", r.err);
		if (mode >= 1)
			cr_expect(strstr(r.err, "run `dragon-gen render --op lowrank_fwd --latent 512`"),
				  "a render failure points at render: %s", r.err);
		run_free(&r);
		char *after = listing(sb.out);
		cr_expect_str_eq(after, before, "the out folder changed (mode %d)", mode);
		char *manifest_after = slurp(mpath, NULL);
		cr_expect_str_eq(manifest_after, manifest_before);
		free(after);
		free(manifest_after);
	}

	/* out folders that did not exist are not left behind, parents included */
	char fresh[800], nested[900];
	snprintf(fresh, sizeof(fresh), "%s/fresh", sb.root);
	snprintf(nested, sizeof(nested), "%s/a/b/", fresh);
	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--out", nested, NULL);
	cr_expect_eq(r.code, 1);
	cr_expect_not(exists(fresh), "a failed build must not leave the folders it made");
	run_free(&r);
	free(before);
	free(manifest_before);
	sandbox_fini(&sb);
}

/* SIGINT in the middle: the temp folder goes, nothing is published. */
Test(cli, interrupted_build_leaves_nothing)
{
	sandbox sb;
	run r;
	const char *args[] = { "build", "--no-cache", "-j1", "--out", NULL, "--op", "lowrank_fwd",
			       "--weight", "f32,bf16,int8,ternary,sign1", "--in-heads", "1,4",
			       "--latent", "256", NULL };

	sandbox_init(&sb);
	args[4] = sb.out;
	pid_t pid = spawn_gen(&sb, args);
	/* wait until the first kernel file sits in the temp folder */
	bool seen = false;
	for (int i = 0; i < 6000 && !seen; i++) {
		char *names = listing(sb.out);
		char *t = strstr(names, ".dragon-build.");
		if (t) {
			char tmp[1024];
			snprintf(tmp, sizeof(tmp), "%s/%.*s", sb.out, (int)strcspn(t, "\n"), t);
			char *inner = listing(tmp);
			seen = strstr(inner, ".cubin") != NULL;
			free(inner);
		}
		free(names);
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	cr_assert(seen, "the build never wrote a kernel into its temp folder");
	kill(pid, SIGINT);
	collect(&sb, pid, &r);
	cr_expect_eq(r.code, 128 + SIGINT, "exit like an interrupted program: %d (%s)", r.code,
		     r.err);
	cr_expect(strstr(r.err, "interrupted") != NULL, "%s", r.err);
	char *names = listing(sb.out);
	cr_expect_str_empty(names, "an interrupted build left: %s", names);
	free(names);
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli, default_set_builds, .timeout = 1100)
{
	sandbox sb;
	run r;

	if (dg_test_quick())
		cr_skip_test("DRAGON_TEST_QUICK: the default-set build is covered by the full run");
	sandbox_init(&sb);
	gen(&sb, &r, "build", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "kernels")),
		     DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "dropped"), 10);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest_destroy(check_bundle(&sb, DG__SPECSET_DEFAULT_SIZE));
	sandbox_fini(&sb);
}
