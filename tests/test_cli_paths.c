/*
 * Every path dragon and dragon-gen take, named as a hostile user would:
 * the folder H below holds a space, single and double quotes, backquotes,
 * $(...), a backslash, shell operators and a newline, and each file in it
 * repeats H in its own name. The binaries ($DRAGON, $DRAGON_GEN) run with
 * the sandbox as their working folder, where a command in a name, were a
 * shell or gnuplot to run it, would create the file "canary".
 *
 * What is proved: each command works on such paths, or refuses in one
 * line with its exit code, and "canary" never appears —
 *   dragon train --data, --out, --resume (the CPU model at a tiny shape),
 *     $DRAGON_CORPUS (refused: not the built-in corpus);
 *   dragon eval --model, --data, --grads (also "|touch canary": a file);
 *   dragon sample CKPT and DIR; dragon plot LOG (its folder the default
 *     label) and --out (gnuplot, which scripts/deps.sh installs: a missing
 *     gnuplot fails that test, which would prove nothing without it);
 *   dragon-gen build --out, --cache-dir, --tune-db; inspect DIR and
 *     --tune-db; render -o; tune --record (refused: no CUDA device, made
 *     so with CUDA_VISIBLE_DEVICES empty); cache stat and verify, with
 *     --cache-dir and $DRAGON_CACHE_DIR; $DRAGON_TEMPLATE_DIR and
 *     $DRAGON_TUNE_DB;
 *   missing files under such names: one line, exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"

/* The hostile name: a folder, and part of every file's name in it. */
#define H "h 'q' \"d\" `touch canary` $(touch canary) \\ ; | & * ? \n nl"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-every", "3", "--eval-batches", "2", "--seed", "3"

#define SPEC "--op", "lowrank_fwd", "--weight", "ternary", "--relu", "0"

/* The sandbox as the working folder (this test's process alone: Criterion
 * runs each test in its own) and the folder H in it. */
static void setup(sandbox *sb)
{
	sandbox_init(sb);
	cr_assert_eq(chdir(sb->root), 0);
	cr_assert_eq(mkdir(H, 0755), 0);
}

static void teardown(sandbox *sb)
{
	cr_assert_eq(chdir("/"), 0);
	sandbox_fini(sb);
}

/* A text of 6000 bytes at path. */
static void hostile_text(const sandbox *sb, const char *path)
{
	char tmp[600];
	text_file(sb, tmp, sizeof(tmp), 6000);
	cr_assert_eq(rename(tmp, path), 0);
}

/* r exited 0 and nothing was run (a canary is removed, so that the next
 * check is the next command's). */
static void expect_ok(const run *r, const char *what)
{
	cr_expect_eq(r->code, 0, "%s: exit %d: %s", what, r->code, r->err);
	cr_expect_not(exists("canary"), "%s ran a command from a name", what);
	unlink("canary");
}

/* r refused in one line naming H's start, exit code; nothing was run. */
static void expect_refused(const run *r, int code, const char *what)
{
	expect_one_line_error(r, code, "h 'q' \"d\" `touch canary` $(touch canary)");
	cr_expect_not(exists("canary"), "%s ran a command from a name", what);
	unlink("canary");
}

static const char *json_str(const cJSON *j, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
	cr_assert(cJSON_IsString(v), "'%s' is not a string", name);
	return v->valuestring;
}

Test(cli_paths, dragon)
{
	sandbox sb;
	run r;
	cli_use_program("DRAGON", "dragon: ");
	setup(&sb);
	const char *data = H "/text " H ".txt", *out = H "/run " H, *ckpt = H "/run " H "/ckpt-00000006.safetensors",
		   *grads = H "/grads " H ".safetensors";
	hostile_text(&sb, data);

	/* train, stopped and resumed */
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", out, "--stop-at", "3", NULL);
	expect_ok(&r, "train --data --out");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", out, "--resume", NULL);
	expect_ok(&r, "train --resume");
	run_free(&r);
	cr_expect_eq(log_lines(out), 6);
	cr_expect(exists(ckpt), "no %s", ckpt);
	setenv("DRAGON_CORPUS", data, 1);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--out", H "/run2 " H, NULL);
	expect_refused(&r, 1, "train with $DRAGON_CORPUS");
	run_free(&r);
	unsetenv("DRAGON_CORPUS");

	/* eval */
	gen(&sb, &r, "eval", "--cpu", "--model", ckpt, "--data", data, "--grads", grads, "--batch", "2", "--time",
	    "16", "--batches", "1", "--json", NULL);
	expect_ok(&r, "eval --model --data --grads");
	cJSON *j = parse_json(r.out);
	cr_expect_str_eq(json_str(j, "model"), ckpt);
	cr_expect_str_eq(json_str(j, "data"), data);
	cr_expect_str_eq(json_str(j, "grads"), grads);
	cJSON_Delete(j);
	run_free(&r);
	cr_expect(exists(grads), "no %s", grads);
	gen(&sb, &r, "eval", "--cpu", "--model", ckpt, "--data", data, "--grads", "|touch canary", "--batch", "2",
	    "--time", "16", "--batches", "1", NULL);
	expect_ok(&r, "eval --grads '|touch canary'");
	run_free(&r);
	cr_expect(exists("|touch canary"), "--grads '|touch canary' is a file");

	/* sample: a checkpoint and a run's folder */
	gen(&sb, &r, "sample", "--cpu", ckpt, "--length", "8", "--prompt", "Now", NULL);
	expect_ok(&r, "sample CKPT");
	cr_expect_eq(strncmp(r.out, "Now", 3), 0, "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "sample", "--cpu", out, "--length", "8", NULL);
	expect_ok(&r, "sample DIR");
	run_free(&r);

	/* missing files under hostile names */
	gen(&sb, &r, "eval", "--cpu", "--model", H "/none " H ".safetensors", NULL);
	expect_refused(&r, 1, "eval --model (missing)");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--data", H "/none " H ".txt", "--out", H "/run3 " H, NULL);
	expect_refused(&r, 1, "train --data (missing)");
	run_free(&r);
	gen(&sb, &r, "sample", "--cpu", H "/none " H, NULL);
	expect_refused(&r, 1, "sample (missing)");
	run_free(&r);
	teardown(&sb);
}

/* The run folder's name is the default label. */
Test(cli_paths, dragon_plot)
{
	sandbox sb;
	run r;
	if (!gnuplot_or_skip())
		return;
	cli_use_program("DRAGON", "dragon: ");
	setup(&sb);
	const char *data = H "/text " H ".txt", *log = H "/run " H "/log.jsonl", *png = H "/loss " H ".png";
	hostile_text(&sb, data);
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", H "/run " H, NULL);
	expect_ok(&r, "train --data --out");
	run_free(&r);
	gen(&sb, &r, "plot", log, "--out", "loss.png", NULL);
	expect_ok(&r, "plot LOG");
	run_free(&r);
	gen(&sb, &r, "plot", log, "--out", png, NULL);
	expect_ok(&r, "plot LOG --out");
	run_free(&r);
	const char *pngs[] = { "loss.png", png };
	for (int i = 0; i < 2; i++) {
		size_t n = 0;
		char *b = exists(pngs[i]) ? slurp(pngs[i], &n) : NULL;
		cr_expect(b && n > 1000 && memcmp(b, "\x89PNG", 4) == 0, "no PNG at %s", pngs[i]);
		free(b);
	}
	gen(&sb, &r, "plot", H "/none " H ".jsonl", "--out", png, NULL);
	expect_refused(&r, 1, "plot (missing)");
	run_free(&r);
	teardown(&sb);
}

Test(cli_paths, dragon_gen)
{
	sandbox sb;
	run r;
	char cwd[256];
	cli_use_program("DRAGON_GEN", "dragon-gen: ");
	setup(&sb);
	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	/* $DRAGON_CACHE_DIR (the sandbox's): absolute, as a user sets it */
	snprintf(sb.cache, sizeof(sb.cache), "%s/%s/cache %s", cwd, H, H);
	const char *bundle = H "/bundle " H, *db = H "/db " H, *cu = H "/k " H ".cu";
	cr_assert_eq(mkdir(db, 0755), 0);

	gen(&sb, &r, "build", "--op", "pack_i8x4", "--latent", "256", "--out", bundle, NULL);
	expect_ok(&r, "build --out, $DRAGON_CACHE_DIR");
	run_free(&r);
	gen(&sb, &r, "inspect", bundle, NULL);
	expect_ok(&r, "inspect DIR");
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--json", NULL);
	expect_ok(&r, "cache stat");
	cJSON *j = parse_json(r.out);
	cr_expect_str_eq(json_str(j, "root"), sb.cache);
	cr_expect_eq(num(j, "entries"), 1);
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "cache", "verify", "--cache-dir", sb.cache, NULL);
	expect_ok(&r, "cache verify --cache-dir");
	run_free(&r);
	gen(&sb, &r, "build", "--op", "pack_i8x4", "--latent", "256", "--out", H "/bundle2 " H, "--cache-dir",
	    H "/cache2 " H, "--tune-db", db, NULL);
	expect_ok(&r, "build --cache-dir --tune-db");
	run_free(&r);
	cr_expect(exists(H "/cache2 " H), "--cache-dir made no cache");

	/* render -o, with the templates from a folder of a hostile name */
	gen(&sb, &r, "render", "-o", cu, SPEC, "--latent", "256", NULL);
	expect_ok(&r, "render -o");
	run_free(&r);
	char *text = slurp(cu, NULL);
	cr_expect_eq(strncmp(text, "/*\n * generated by dragon ", 26), 0, "%.100s", text);
	free(text);
	gen(&sb, &r, "render", "-o", "|touch canary", SPEC, "--latent", "256", NULL);
	expect_ok(&r, "render -o '|touch canary'");
	run_free(&r);
	cr_expect(exists("|touch canary"), "-o '|touch canary' is a file");
	char tmpl[700];
	snprintf(tmpl, sizeof(tmpl), "%s/%s/templates %s", cwd, H, H);
	cr_assert_eq(symlink(DG_SOURCE_DIR "/templates", tmpl), 0);
	sb.template_dir = tmpl;
	gen(&sb, &r, "render", "--canonical", SPEC, "--latent", "256", NULL);
	expect_ok(&r, "render, $DRAGON_TEMPLATE_DIR");
	cr_expect(strstr(r.out, "op=lowrank_fwd;"), "%s", r.out);
	run_free(&r);
	sb.template_dir = NULL;

	/* the tuning records: --tune-db and $DRAGON_TUNE_DB; tune --record */
	gen(&sb, &r, "inspect", SPEC, "--device", "NVIDIA H200", "--sm", "90", "--tune-db", db, NULL);
	expect_ok(&r, "inspect --tune-db");
	cr_expect(strstr(r.out, "tile: "), "%s", r.out);
	run_free(&r);
	setenv("DRAGON_TUNE_DB", db, 1);
	gen(&sb, &r, "inspect", SPEC, "--device", "NVIDIA H200", "--sm", "90", NULL);
	expect_ok(&r, "inspect, $DRAGON_TUNE_DB");
	run_free(&r);
	unsetenv("DRAGON_TUNE_DB");
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	gen(&sb, &r, "tune", SPEC, "--budget", "5", "--record", H "/rec " H ".json", NULL);
	expect_one_line_error(&r, 1, "no CUDA device");
	cr_expect_not(exists("canary"), "tune --record ran a command from a name");
	unlink("canary");
	run_free(&r);
	unsetenv("CUDA_VISIBLE_DEVICES");

	/* missing: a bundle and a cache under hostile names */
	gen(&sb, &r, "inspect", H "/none " H, NULL);
	expect_refused(&r, 1, "inspect (missing)");
	run_free(&r);
	gen(&sb, &r, "cache", "stat", "--cache-dir", H "/none " H, NULL);
	expect_ok(&r, "cache stat (missing)");
	cr_expect(strstr(r.out, "no kernel cache"), "%s", r.out);
	run_free(&r);
	teardown(&sb);
}
