/*
 * dragon plot with hostile text (the binary at $DRAGON, run in the sandbox
 * as its working folder; the real gnuplot, which scripts/deps.sh installs:
 * a missing gnuplot fails the tests that draw, since without it they
 * prove nothing).
 *
 * What is proved: nothing in a --title, a --label, an --out or a log's
 * folder name (the default label) is run. Each carries a command that
 * would create the file "canary" in the sandbox if gnuplot or a shell ran
 * it: backquotes (gnuplot's command substitution), $(...) (a shell's), a
 * quote that would close a gnuplot string and call system(), a newline
 * and gnuplot's `!` shell escape; --out also "|touch canary" (gnuplot's
 * pipe output). Each plot succeeds, writes a PNG at exactly the path
 * given, leaves no temporary file, and "canary" never appears. An --out
 * that is one of the logs (the same path, another spelling, a symlink, a
 * hard link) or a folder is refused with exit 2 in one line, the log
 * byte for byte as it was; without gnuplot on PATH the plot fails in one
 * line saying how to install it. The title and the labels are drawn as
 * typed (a control character as a space), read back from gnuplot's text
 * terminal.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"

/* What each hostile text would run: a file "canary" in the working folder. */
static const char *const payloads[] = {
	"x`touch canary`y",
	"x$(touch canary)y",
	"x' . system('touch canary') . 'y",
	"x\" . system(\"touch canary\") . \"y",
	"x\n!touch canary\ny",
	"x\\`touch canary`\\",
};
#define N_PAYLOADS (sizeof(payloads) / sizeof(payloads[0]))

/* The sandbox as the working folder (this test's process alone: Criterion
 * runs each test in its own); a test that draws needs gnuplot. */
static bool setup(sandbox *sb, bool draws)
{
	if (draws && !gnuplot_or_skip())
		return false;
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(sb);
	cr_assert_eq(chdir(sb->root), 0);
	return true;
}

static void teardown(sandbox *sb)
{
	cr_assert_eq(chdir("/"), 0);
	sandbox_fini(sb);
}

/* A log of dragon train's form: 6 steps, validation at 3 and 6. */
static void write_log(const char *dir)
{
	char path[4200];
	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	for (int s = 1; s <= 6; s++) {
		fprintf(f, "{\"step\": %d, \"train_loss\": %.3f, \"lr\": 0.001", s, 5.5 - 0.1 * s);
		if (s % 3 == 0)
			fprintf(f, ", \"val_loss\": %.3f", 5.6 - 0.1 * s);
		fprintf(f, ", \"tokens_per_s\": 1000, \"wall_s\": 0.1}\n");
	}
	fclose(f);
}

/* The plot went right: exit 0, a PNG at out, nothing else new in the
 * sandbox but out (and what was there), no canary. */
static void expect_plotted(const run *r, const char *out, const char *what, const char *payload)
{
	cr_expect_eq(r->code, 0, "%s '%s': exit %d: %s", what, payload, r->code, r->err);
	cr_expect_not(exists("canary"), "%s '%s' ran a command", what, payload);
	size_t n = 0;
	char *png = exists(out) ? slurp(out, &n) : NULL;
	cr_expect(png && n > 1000 && memcmp(png, "\x89PNG", 4) == 0, "%s '%s': no PNG at '%s'", what, payload,
		  out);
	free(png);
	char *names = listing(".");
	cr_expect_null(strstr(names, ".tmp"), "%s '%s': a temporary file left: %s", what, payload, names);
	free(names);
	unlink("canary");
}

/* Every payload as the value of `flag` of one plot of a/log.jsonl:
 * plotted, never run. */
static void plot_each_payload(const char *flag)
{
	sandbox sb;
	run r;
	if (!setup(&sb, true))
		return;
	write_log("a");
	for (size_t i = 0; i < N_PAYLOADS; i++) {
		gen(&sb, &r, "plot", "a/log.jsonl", flag, payloads[i], "--out", "p.png", NULL);
		expect_plotted(&r, "p.png", flag, payloads[i]);
		run_free(&r);
		unlink("p.png");
	}
	teardown(&sb);
}

Test(cli_plot, a_label_is_never_run)
{
	plot_each_payload("--label");
}

Test(cli_plot, a_title_is_never_run)
{
	plot_each_payload("--title");
}

/* A log's folder names its curves when there is no --label. */
Test(cli_plot, a_folder_name_is_never_run)
{
	sandbox sb;
	run r;
	char log[4200];
	if (!setup(&sb, true))
		return;
	for (size_t i = 0; i < N_PAYLOADS; i++) {
		write_log(payloads[i]);
		snprintf(log, sizeof(log), "%s/log.jsonl", payloads[i]);
		gen(&sb, &r, "plot", log, "--out", "p.png", NULL);
		expect_plotted(&r, "p.png", "a folder", payloads[i]);
		run_free(&r);
		unlink("p.png");
	}
	teardown(&sb);
}

/* --out is a file, whatever it holds: never a pipe, never a command. */
Test(cli_plot, an_out_path_is_never_run)
{
	sandbox sb;
	run r;
	char out[4200];
	if (!setup(&sb, true))
		return;
	write_log("a");
	gen(&sb, &r, "plot", "a/log.jsonl", "--out", "|touch canary", NULL);
	expect_plotted(&r, "|touch canary", "--out", "|touch canary");
	run_free(&r);
	for (size_t i = 0; i < N_PAYLOADS; i++) {
		snprintf(out, sizeof(out), "%s.png", payloads[i]);
		gen(&sb, &r, "plot", "a/log.jsonl", "--out", out, NULL);
		expect_plotted(&r, out, "--out", payloads[i]);
		run_free(&r);
		unlink(out);
	}
	teardown(&sb);
}

/* s as a key or title shows it: a control character as a space. */
static void as_shown(const char *s, const char *suffix, char *out, size_t size)
{
	snprintf(out, size, "%s%s", s, suffix);
	for (char *c = out; *c; c++)
		if ((unsigned char)*c < 0x20)
			*c = ' ';
}

/* What gnuplot draws, as text: a stand-in `gnuplot` first on PATH feeds
 * the real one dragon's script with the PNG terminal made the dumb (text)
 * one, so the title and the key can be read back from --out. */
Test(cli_plot, title_and_labels_show_as_typed)
{
	sandbox sb;
	run r;
	char stub[700], real[4200], path[8400], log[4200], want[4200];
	if (!setup(&sb, true))
		return;
	const char *p = getenv("PATH");
	while (p && *p) { /* the real gnuplot's path */
		size_t n = strcspn(p, ":");
		snprintf(real, sizeof(real), "%.*s/gnuplot", (int)n, p);
		if (n && access(real, X_OK) == 0)
			break;
		p += n + (p[n] == ':');
	}
	cr_assert_eq(mkdir("stub", 0755), 0);
	snprintf(stub, sizeof(stub), "%s/stub/gnuplot", sb.root);
	FILE *f = fopen(stub, "w");
	cr_assert_not_null(f);
	fprintf(f, "#!/bin/sh\nsed 's/^set terminal .*/set terminal dumb noenhanced size 400,30/' \"$1\" | '%s'\n",
		real);
	fclose(f);
	cr_assert_eq(chmod(stub, 0755), 0);
	snprintf(path, sizeof(path), "%s/stub:%s", sb.root, getenv("PATH"));
	setenv("PATH", path, 1); /* this test's process alone */
	write_log("a");
	for (size_t i = 0; i < N_PAYLOADS; i++) {
		char label[4200], title[4200];
		snprintf(label, sizeof(label), "%s#1", payloads[i]);
		snprintf(title, sizeof(title), "T:%s", payloads[i]);
		write_log(payloads[i]);
		snprintf(log, sizeof(log), "%s/log.jsonl", payloads[i]);
		gen(&sb, &r, "plot", "a/log.jsonl", log, "--label", label, "--title", title, "--out", "dumb.txt",
		    NULL);
		cr_expect_eq(r.code, 0, "'%s': exit %d: %s", payloads[i], r.code, r.err);
		cr_expect_not(exists("canary"), "'%s' ran a command", payloads[i]);
		unlink("canary");
		run_free(&r);
		char *text = slurp("dumb.txt", NULL);
		const char *wants[][2] = { { title, "" }, { label, " train" }, { label, " val" },
					   { payloads[i], " train" }, { payloads[i], " val" } };
		for (size_t w = 0; w < sizeof(wants) / sizeof(wants[0]); w++) {
			as_shown(wants[w][0], wants[w][1], want, sizeof(want));
			cr_expect(strstr(text, want), "'%s' is not drawn as typed:\n%s", want, text);
		}
		free(text);
		unlink("dumb.txt");
	}
	teardown(&sb);
}

/* Outputs never overwrite inputs: --out naming a log, however spelt, is
 * refused before anything is written. */
Test(cli_plot, out_is_never_a_log)
{
	sandbox sb;
	run r;
	setup(&sb, false);
	write_log("a");
	write_log("b");
	char *before = slurp("a/log.jsonl", NULL);
	cr_assert_eq(symlink("a/log.jsonl", "link.png"), 0);
	cr_assert_eq(link("a/log.jsonl", "hard.png"), 0);
	const char *outs[] = { "a/log.jsonl", "./b/../a/log.jsonl", "link.png", "hard.png" };
	for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
		gen(&sb, &r, "plot", "b/log.jsonl", "a/log.jsonl", "--out", outs[i], NULL);
		expect_one_line_error(&r, 2, "is the log a/log.jsonl");
		run_free(&r);
		char *after = slurp("a/log.jsonl", NULL);
		cr_expect_str_eq(after, before, "--out %s changed the log", outs[i]);
		free(after);
	}
	gen(&sb, &r, "plot", "a/log.jsonl", "--out", "b", NULL);
	expect_one_line_error(&r, 2, "--out b is a folder");
	run_free(&r);
	free(before);
	teardown(&sb);
}

Test(cli_plot, without_gnuplot_says_how_to_get_it)
{
	sandbox sb;
	run r;
	setup(&sb, false);
	write_log("a");
	setenv("PATH", sb.root, 1); /* a folder without gnuplot (this test's process alone) */
	gen(&sb, &r, "plot", "a/log.jsonl", "--out", "p.png", NULL);
	expect_one_line_error(&r, 1, "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox)");
	cr_expect_not(exists("p.png"));
	char *names = listing(".");
	cr_expect_null(strstr(names, ".tmp"), "a temporary file left: %s", names);
	free(names);
	run_free(&r);
	teardown(&sb);
}
