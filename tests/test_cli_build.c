/*
 * dragon-gen build and inspect, end to end (see test_cli.c for the
 * sandbox): every file of a built product passes the cubin check and the
 * manifest (format 2) names the templates, the device and each entry's
 * launch info; a second build is all cache hits; auto tiles resolve for
 * the device as the runtime would and specs that resolve alike are one
 * kernel; a rebuild removes what the old bundle listed alone; a failed or
 * interrupted build leaves the output folder as it was; inspect catches a
 * damaged bundle, an edited key and other templates; a copy of templates/
 * is the embedded set (cache hits, a bundle inspect accepts); a build past
 * a file-size limit names the file; the default build set holds every op.
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
#include "dragon/codegen.h"
#include "dragon/tune.h"
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
		for (int e = 0; e < k->n_entries; e++)
			cr_expect(k->threads[e] >= 32 && k->threads[e] <= 1024 && k->smem[e] >= 0,
				  "%s: entry %s: %d threads, %d smem", k->file, k->entries[e],
				  k->threads[e], k->smem[e]);
		cr_expect(strstr(k->spec, "tile=auto") == NULL, "a bundle's tiles are resolved: %s",
			  k->spec);
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "%.*s-%.16s.cubin",
			 (int)strcspn(k->file, "-"), k->file, k->key);
		cr_expect_str_eq(k->file, prefix, "file is named <op>-<key16>.cubin");
		free(bytes);
	}
	char *names = listing(sb->out);
	cr_expect(strstr(names, ".dragon-build.") == NULL, "temp folder left: %s", names);
	free(names);
	cr_expect_eq(m->format, 2);
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	cr_expect_str_eq(m->template_hash, dg_codegen_template_hash(cg));
	dg_codegen_destroy(cg);
	return m;
}

/* The manifest's text, and the same with `from` replaced by `to` once. */
static void edit_manifest(const sandbox *sb, const char *from, const char *to)
{
	char path[800];
	snprintf(path, sizeof(path), "%s/manifest.json", sb->out);
	char *text = slurp(path, NULL);
	char *at = strstr(text, from);
	cr_assert_not_null(at, "'%s' is not in the manifest", from);
	char *out = malloc(strlen(text) + strlen(to) + 1);
	sprintf(out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
	dg_test_write_file(sb->out, "manifest.json", out);
	free(out);
	free(text);
}

Test(cli, build_product_then_all_cache_hits)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	unsetenv("DRAGON_TUNE_DB"); /* the built-in records alone: the H200's */
	gen(&sb, &r, "build", "--op", "lowrank_fwd", "--weight", "int8,ternary", "--relu",
	    "none,0", "--latent", "256", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	const cJSON *ks = cJSON_GetObjectItem(j, "kernels");
	cr_assert_eq(cJSON_GetArraySize(ks), 4);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "kernels"), 4);
	/* the one device the records name for sm_90 */
	cr_expect(strstr(r.err, "built 4 kernels for NVIDIA H200 (sm_90) into ") != NULL,
		  "summary line: %s", r.err);
	cr_expect_eq(count_lines(r.err), 1, "quiet when not a TTY: %s", r.err);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest *m = check_bundle(&sb, 4);
	for (size_t i = 0; i < 4; i++)
		cr_expect(strstr(m->kernels[i].spec, "latent=256;") != NULL);
	cr_expect_str_eq(m->device, "NVIDIA H200");
	cr_expect_eq(m->sm, 90);
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
	cr_expect(strstr(r.out, "2 kernels ok, keys checked") != NULL, "%s", r.out);
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
		      "function M.render(...)\n"
		      "  return render(...) .. \"\\n#error broken on purpose\\n\"\n"
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
	gen_ok(&sb, "build", "--op", "pack_i8x4", "--out", sb.out, NULL);
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
		/* the hint names the kernel that failed: its tile resolved */
		if (mode >= 1)
			cr_expect(strstr(r.err, "run `dragon-gen render --op lowrank_fwd ") &&
					  strstr(r.err, " --latent 512 ") && strstr(r.err, " --tile ") &&
					  strstr(r.err, "` to see the source"),
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

/* The default build set holds every op of the op table (a BDH training
 * step, forward and backward), and builds. */
Test(cli, default_set_builds)
{
	sandbox sb;
	run r;

	if (dg_test_quick())
		cr_skip_test("DRAGON_TEST_QUICK: the default-set build is covered by the full run");
	sandbox_init(&sb);
	gen(&sb, &r, "build", "-j2", "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "specs"), DG__SPECSET_DEFAULT_SIZE);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "dropped"), 0);
	size_t n = (size_t)cJSON_GetArraySize(cJSON_GetObjectItem(j, "kernels"));
	cJSON_Delete(j);
	run_free(&r);
	cr_expect(n > 0 && n <= DG__SPECSET_DEFAULT_SIZE, "%zu kernels", n);
	dg_manifest *m = check_bundle(&sb, n);
	for (int op = 0; op < DG_OP__COUNT; op++) {
		char want[64];
		size_t have = 0;
		snprintf(want, sizeof(want), ";op=%s;", dg_op_name((dg_op)op));
		for (size_t i = 0; i < m->n_kernels; i++) {
			char spec[DG_SPEC_TEXT_MAX + 1];
			snprintf(spec, sizeof(spec), ";%s", m->kernels[i].spec);
			have += strstr(spec, want) != NULL;
		}
		cr_expect_gt(have, 0, "the default set has no %s", dg_op_name((dg_op)op));
	}
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* A bare flag: every op (--op defaults to all), the flag where an op reads
 * it, its defaults elsewhere; each op's defaults are valid (decoder_fwd,
 * relu_mask), so it builds. */
Test(cli, build_heads_flag_alone)
{
	sandbox sb;
	size_t readers = DG_OP__COUNT;

	sandbox_init(&sb);
	gen_ok(&sb, "build", "--heads", "4", "--latent", "256", "--device", "none", "-j2",
	       "--out", sb.out, NULL);
	dg_manifest *m = check_bundle(&sb, readers);
	cr_expect_str_eq(m->device, "");
	cr_expect_eq(m->sm, 0);
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* An auto tile resolves as the runtime resolves it on the device: with
 * the H200's built-in record, its winner on sm_90a. */
Test(cli, build_resolves_for_the_device)
{
	sandbox sb;
	run r;
	const char *want = "act=int8;arch=sm_90a;embd=256;heads=4;in_heads=1;latent=8192;"
			   "op=lowrank_fwd;out=int8;relu=0;tile=128x64x64/8x1/2;weight=ternary;";

	sandbox_init(&sb);
	unsetenv("DRAGON_TUNE_DB");
	gen(&sb, &r, "build", "--device", "NVIDIA H200", "--sm", "90", "--op", "lowrank_fwd",
	    "--weight", "ternary", "--relu", "0", "--out-format", "int8", "--out", sb.out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.err, "built 1 kernel for NVIDIA H200 (sm_90) into "), "%s", r.err);
	run_free(&r);
	dg_manifest *m = check_bundle(&sb, 1);
	cr_expect_str_eq(m->kernels[0].spec, want);
	cr_expect_str_eq(m->device, "NVIDIA H200");
	cr_expect_eq(m->sm, 90);
	dg_manifest_destroy(m);
	/* without --device: the one device the records name for sm_90 */
	gen_ok(&sb, "build", "--op", "lowrank_fwd", "--weight", "ternary", "--relu", "0",
	       "--out-format", "int8", "--out", sb.out, NULL);
	m = check_bundle(&sb, 1);
	cr_expect_str_eq(m->kernels[0].spec, want);
	dg_manifest_destroy(m);
	/* decoder_fwd int8: the record's winner (sm_90) is not the template's
	 * default (a warpgroup tile on sm_90a), so the device shows */
	gen_ok(&sb, "build", "--op", "decoder_fwd", "--out", sb.out, NULL);
	m = check_bundle(&sb, 1);
	cr_expect(strstr(m->kernels[0].spec, "arch=sm_90;") &&
			  strstr(m->kernels[0].spec, "tile=64x128x64/2x2/4;"),
		  "the built-in record's winner: %s", m->kernels[0].spec);
	dg_manifest_destroy(m);
	/* --device none: the template's default, whatever the records say */
	gen(&sb, &r, "build", "--device", "none", "--op", "decoder_fwd", "--out", sb.out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.err, "built 1 kernel into "), "%s", r.err);
	run_free(&r);
	m = check_bundle(&sb, 1);
	cr_expect_str_eq(m->device, "");
	cr_expect_eq(m->sm, 0);
	cr_expect(strstr(m->kernels[0].spec, "tile=64x128x64/2x2/4;") == NULL,
		  "no device, no record: %s", m->kernels[0].spec);
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* A spec with the auto tile and the same spec with the tile auto resolves
 * to are one kernel. */
Test(cli, build_auto_and_its_tile_once)
{
	sandbox sb;
	run r, c;
	char tiles[128];

	sandbox_init(&sb);
	gen(&sb, &c, "render", "--canonical", "--op", "pack_i8x4", "--latent", "256", NULL);
	cr_assert_eq(c.code, 0, "%s", c.err);
	const char *t = strstr(c.out, "tile=");
	cr_assert_not_null(t, "%s", c.out);
	snprintf(tiles, sizeof(tiles), "auto,%.*s", (int)strcspn(t + 5, ";"), t + 5);
	gen(&sb, &r, "build", "--device", "none", "--op", "pack_i8x4", "--latent", "256", "--tile",
	    tiles, "--out", sb.out, "--json", NULL);
	cr_assert_eq(r.code, 0, "--tile %s: %s", tiles, r.err);
	cr_expect(strstr(r.err, "built 1 kernel into "), "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "specs"), 2);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "kernels"), 1);
	cJSON_Delete(j);
	run_free(&r);
	dg_manifest *m = check_bundle(&sb, 1);
	c.out[strcspn(c.out, "\n")] = '\0';
	cr_expect_str_eq(m->kernels[0].spec, c.out);
	dg_manifest_destroy(m);
	run_free(&c);
	sandbox_fini(&sb);
}

/* A rebuild into a bundle folder removes the files (and tune/ records)
 * the old manifest listed and the new one does not; others stay. */
Test(cli, rebuild_removes_orphans)
{
	sandbox sb;
	char path[900], rec[900];

	sandbox_init(&sb);
	unsetenv("DRAGON_TUNE_DB");
	/* pack_i8x4 at the BDH shape has a built-in record: --tuned bundles it */
	gen_ok(&sb, "build", "--tuned", "--op", "pack_i8x4,unpack_i8x4", "--out", sb.out, "-q",
	       NULL);
	dg_manifest *m = check_bundle(&sb, 2);
	char pack[256];
	snprintf(pack, sizeof(pack), "%s", strncmp(m->kernels[0].file, "pack", 4) == 0
						   ? m->kernels[0].file
						   : m->kernels[1].file);
	dg_manifest_destroy(m);
	snprintf(rec, sizeof(rec), "%s/tune/pack_i8x4-95f9d53f548b9e0d-nvidia-h200-sm90.json",
		 sb.out);
	cr_assert(exists(rec), "the built-in record is bundled: %s", listing(sb.out));
	/* written from the record: it reads back as one, of the H200 */
	dg_tune_record *tr = NULL;
	char msg[512];
	cr_expect_eq(dg_tune_record_load(rec, &tr, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect(tr && strcmp(tr->device.name, "NVIDIA H200") == 0 && tr->winner >= 0);
	dg_tune_record_destroy(tr);
	dg_test_write_file(sb.out, "keep.txt", "mine");

	gen_ok(&sb, "build", "--op", "unpack_i8x4", "--out", sb.out, "-q", NULL);
	dg_manifest_destroy(check_bundle(&sb, 1));
	snprintf(path, sizeof(path), "%s/%s", sb.out, pack);
	cr_expect_not(exists(path), "the old kernel %s stayed", pack);
	cr_expect_not(exists(rec), "the old record stayed");
	snprintf(path, sizeof(path), "%s/tune", sb.out);
	cr_expect_not(exists(path), "the emptied tune/ folder stayed");
	snprintf(path, sizeof(path), "%s/keep.txt", sb.out);
	cr_expect(exists(path), "a file no manifest listed was removed");
	sandbox_fini(&sb);
}

/* inspect recomputes keys: an edited key is caught, naming the kernel; a
 * bundle of other templates is one this library will not load. */
Test(cli, inspect_checks_keys_and_templates)
{
	sandbox sb;
	run r;
	char msg[512];

	sandbox_init(&sb);
	gen_ok(&sb, "build", "--op", "pack_i8x4,unpack_i8x4", "--latent", "256", "--out",
	       sb.out, "-q", NULL);
	dg_manifest *m = NULL;
	cr_assert_eq(dg_manifest_load(sb.out, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	char key[80], bad[80], hash[80], other[80];
	snprintf(key, sizeof(key), "\"%s\"", m->kernels[1].key);
	snprintf(bad, sizeof(bad), "%s", key);
	bad[1] = bad[1] == '0' ? '1' : '0';
	snprintf(hash, sizeof(hash), "\"%s\"", m->template_hash);
	snprintf(other, sizeof(other), "%s", hash);
	other[1] = other[1] == '0' ? '1' : '0';

	edit_manifest(&sb, key, bad);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 1, "an edited key must fail inspect: %s", r.err);
	cr_expect(strstr(r.err, m->kernels[1].file) && strstr(r.err, "key"), "names the kernel: %s",
		  r.err);
	cr_expect(strstr(r.err, m->kernels[0].file) == NULL, "the good kernel is not named: %s",
		  r.err);
	run_free(&r);
	gen(&sb, &r, "inspect", sb.out, "--json", NULL);
	cr_expect_eq(r.code, 1);
	cJSON *j = parse_json(r.out);
	cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")));
	cr_expect(cJSON_IsString(cJSON_GetObjectItem(j, "error")), "%s", r.out);
	cJSON_Delete(j);
	run_free(&r);
	edit_manifest(&sb, bad, key);

	edit_manifest(&sb, hash, other);
	gen(&sb, &r, "inspect", sb.out, NULL);
	expect_one_line_error(&r, 1, "other templates, so dg_device_load_bundle refuses it");
	cr_expect_str_empty(r.out);
	run_free(&r);
	edit_manifest(&sb, other, hash);
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 0, "restored: %s", r.err);
	run_free(&r);
	dg_manifest_destroy(m);
	sandbox_fini(&sb);
}

/* A bundle built from DRAGON_TEMPLATE_DIR pointing at a byte-identical
 * copy of templates/ (its files made in reverse name order) is one of the
 * stock library's templates: every kernel a cache hit of the embedded
 * set's build, and inspect without the variable (the check
 * dg_device_load_bundle makes) accepts it. */
Test(cli, a_copy_of_templates_builds_what_the_library_loads)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	gen_ok(&sb, "build", "--op", "pack_i8x4,unpack_i8x4", "--latent", "256", "--out", sb.out, "-q",
	       NULL);
	char *copy = dg_test_templates_copy();
	sb.template_dir = copy;
	gen(&sb, &r, "build", "--op", "pack_i8x4,unpack_i8x4", "--latent", "256", "--out", sb.out,
	    "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_expect_eq(num(cJSON_GetObjectItem(j, "timing"), "cache_hits"), 2,
		     "the copy's kernels must be the embedded set's cache entries: %s", r.out);
	cJSON_Delete(j);
	run_free(&r);
	sb.template_dir = NULL;
	dg_manifest_destroy(check_bundle(&sb, 2));
	gen(&sb, &r, "inspect", sb.out, NULL);
	cr_expect_eq(r.code, 0, "the stock library refuses a bundle of identical templates: %s", r.err);
	cr_expect(strstr(r.out, "2 kernels ok, keys checked") != NULL, "%s", r.out);
	run_free(&r);
	dg_test_rmtree(copy);
	sandbox_fini(&sb);
}

/* A build past a file-size limit (`ulimit -f`: SIGXFSZ at its default
 * action, which once killed dragon-gen without a word): exit 1, one line
 * naming the file and "File too large", and no output folder. */
Test(cli, build_past_the_file_size_limit_names_the_file)
{
	sandbox sb;
	run r;

	sandbox_init(&sb);
	const char *args[] = { "build", "--op", "pack_i8x4", "--latent", "256", "--out", sb.out, NULL };
	gen_fsize(&sb, &r, 1024, args);
	cr_assert_neq(r.code, 128 + SIGXFSZ, "killed by SIGXFSZ: %s", r.err);
	expect_one_line_error(&r, 1, ": File too large");
	cr_expect(strstr(r.err, sb.out) != NULL, "names the file: %s", r.err);
	run_free(&r);
	cr_expect_not(exists(sb.out), "%s", listing(sb.out));
	sandbox_fini(&sb);
}
