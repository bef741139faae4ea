/*
 * Where `dragon train` (the binary at $DRAGON, and the one `cmake --install`
 * puts in a prefix) finds the built-in corpus, run from a folder that has
 * nothing to do with the source tree: $DRAGON_CORPUS when it is set, else
 * the install's share/dragon/shakespeare.txt, else ./data/shakespeare.txt;
 * in none of them the error names each place and scripts/corpus.sh. A
 * stand-in file (the wrong bytes, refused by digest naming the file it
 * read) shows which place was read; the real corpus (where scripts/corpus.sh
 * has set it up in the source tree) trains a tiny model from there, which
 * prints "skipped: no corpus" where it is not set up.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "helpers.h"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--steps", "2", "--eval-every", "2", "--eval-batches", "1"

static const char real_corpus[] = DG_SOURCE_DIR "/data/shakespeare.txt";

/* 2,000 bytes that are not the corpus at path (its folders made). */
static void standin(const char *path)
{
	char dir[PATH_MAX + 64];
	snprintf(dir, sizeof(dir), "%s", path);
	for (char *p = dir + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			mkdir(dir, 0755);
			*p = '/';
		}
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	for (int i = 0; i < 2000; i++)
		fputc('a' + i % 26, f);
	cr_assert_eq(fclose(f), 0);
}

/* sb.root/elsewhere, made the working folder: unrelated to the source and
 * build trees (the resolved path into cwd). */
static void go_elsewhere(const sandbox *sb, char *cwd, size_t size)
{
	char dir[700];
	snprintf(dir, sizeof(dir), "%s/elsewhere", sb->root);
	cr_assert_eq(mkdir(dir, 0755), 0, "%s", dir);
	cr_assert_eq(chdir(dir), 0, "%s", dir);
	cr_assert_not_null(getcwd(cwd, size));
}

/* r's one-line refusal of the stand-in at path: the file it read. */
static void expect_read(const run *r, const char *path)
{
	char want[800];
	snprintf(want, sizeof(want), "dragon: %s: 2000 bytes of SHA-256 ", path);
	expect_one_line_error(r, 1, "not the built-in corpus");
	cr_expect_eq(strncmp(r->err, want, strlen(want)), 0, "stderr '%s' should start '%s'", r->err, want);
}

Test(cli_corpus, env_then_data_from_any_folder)
{
	sandbox sb;
	run r;
	char cwd[600], env[700], out[700], want[1200];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	go_elsewhere(&sb, cwd, sizeof(cwd));
	snprintf(out, sizeof(out), "%s/o", sb.root);

	/* nowhere: every place named, and the fix */
	unsetenv("DRAGON_CORPUS");
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_one_line_error(&r, 1, "the built-in corpus is in none of $DRAGON_CORPUS (unset), ");
	snprintf(want, sizeof(want), "share/dragon/shakespeare.txt, data/shakespeare.txt (under %s): run scripts/corpus.sh",
		 cwd);
	cr_expect(strstr(r.err, want), "stderr '%s' should name '%s'", r.err, want);
	run_free(&r);

	/* ./data of the working folder */
	standin("data/shakespeare.txt");
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_read(&r, "data/shakespeare.txt");
	run_free(&r);

	/* $DRAGON_CORPUS before ./data */
	snprintf(env, sizeof(env), "%s/mine.txt", sb.root);
	standin(env);
	setenv("DRAGON_CORPUS", env, 1);
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_read(&r, env);
	run_free(&r);

	/* the real one through $DRAGON_CORPUS trains */
	if (dg_test_need(access(real_corpus, R_OK) == 0, "no corpus (scripts/corpus.sh sets it up)",
			 "no data/shakespeare.txt in the source tree: scripts/test.sh sets it up (scripts/corpus.sh)")) {
		setenv("DRAGON_CORPUS", real_corpus, 1);
		gen(&sb, &r, "train", TINY, "--out", out, NULL);
		cr_assert_eq(r.code, 0, "%s", r.err);
		cr_expect(strstr(r.out, "trained: f32 on the CPU, 2 steps of 2x16"), "%s", r.out);
		run_free(&r);
	}
	unsetenv("DRAGON_CORPUS");
	sandbox_fini(&sb);
}

Test(cli_corpus, the_install_before_data)
{
	sandbox sb;
	run r;
	char cwd[600], prefix[700], real[PATH_MAX], installed[PATH_MAX + 64], cmd[2000], out[700];
	static char prog[PATH_MAX + 64];
	cli_use_program("DRAGON_INSTALLED", "dragon: ");
	sandbox_init(&sb);
	snprintf(prefix, sizeof(prefix), "%s/prefix", sb.root);
	snprintf(cmd, sizeof(cmd), "cmake --install '%s' --prefix '%s' >/dev/null", DG_BINARY_DIR, prefix);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	cr_assert_not_null(realpath(prefix, real));
	snprintf(prog, sizeof(prog), "%s/%s/dragon", real, DG_INSTALL_BINDIR);
	snprintf(installed, sizeof(installed), "%s/%s/dragon/shakespeare.txt", real, DG_INSTALL_DATADIR);
	setenv("DRAGON_INSTALLED", prog, 1);
	unsetenv("DRAGON_CORPUS");
	go_elsewhere(&sb, cwd, sizeof(cwd));
	snprintf(out, sizeof(out), "%s/o", sb.root);
	standin("data/shakespeare.txt");

	/* the install's copy of the real one (cmake --install takes the
	 * source tree's), before ./data's stand-in: it trains */
	if (dg_test_need(access(real_corpus, R_OK) == 0, "no corpus (scripts/corpus.sh sets it up)",
			 "no data/shakespeare.txt in the source tree: scripts/test.sh sets it up (scripts/corpus.sh)")) {
		cr_assert(exists(installed), "cmake --install did not put the corpus at %s", installed);
		gen(&sb, &r, "train", TINY, "--out", out, NULL);
		cr_assert_eq(r.code, 0, "%s", r.err);
		cr_expect(strstr(r.out, "trained: f32 on the CPU, 2 steps of 2x16"), "%s", r.out);
		run_free(&r);
	}

	/* a stand-in there is what it reads (named by its resolved path) */
	standin(installed);
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_read(&r, installed);
	run_free(&r);

	/* none there: ./data's */
	cr_assert_eq(unlink(installed), 0);
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_read(&r, "data/shakespeare.txt");
	run_free(&r);
	sandbox_fini(&sb);
}
