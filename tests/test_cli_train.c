/*
 * `dragon train` and `dragon plot` as a user runs them (the binary at
 * $DRAGON); train on the CPU
 * model at a tiny shape on a generated text:
 *   - a run writes its log (a line a step, validation at the intervals and
 *     the end) and its checkpoints, and says where; --json gives one object;
 *   - --stop-at then --resume logs what one straight run logs (the timing
 *     fields aside);
 *   - a resume with another shape names the field; a bad flag, a recipe
 *     the CPU model does not run (--cpu), a missing --data file and a
 *     missing built-in corpus (saying how to set it up) are refused with
 *     one line and the right exit code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"

/* sb.root/text.txt: n bytes of a repeated sentence. */
static void text_file(const sandbox *sb, char *path, size_t size, size_t n)
{
	static const char t[] = "Now is the winter of our discontent made glorious summer by this sun of York. ";
	snprintf(path, size, "%s/text.txt", sb->root);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fputc(t[i % (sizeof(t) - 1)], f);
	fclose(f);
}

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3"

/* The log without its timing fields. */
static char *log_text(const char *dir)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	size_t n;
	char *s = slurp(path, &n);
	cr_assert_not_null(s, "%s", path);
	char *out = calloc(n + 1, 1), *o = out;
	for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
		char *cut = strstr(line, ", \"tokens_per_s\"");
		if (cut)
			*cut = '\0';
		o += sprintf(o, "%s\n", line);
	}
	free(s);
	return out;
}

Test(cli_train, runs_stops_and_resumes)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	text_file(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", a, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "trained: f32 on the CPU, 10 steps of 2x16"), "%s", r.out);
	run_free(&r);
	char *la = log_text(a);
	cr_assert_eq(count_lines(la), 10, "%s", la);
	cr_assert(strstr(la, "{\"step\": 5, ") && strstr(strstr(la, "{\"step\": 5, "), "\"val_loss\""), "%s", la);
	char ck[700];
	snprintf(ck, sizeof(ck), "%s/ckpt-00000010.safetensors", a);
	cr_assert(exists(ck), "%s", ck);

	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", b, "--stop-at", "4", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", b, "--resume", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_assert_str_eq(cJSON_GetObjectItem(j, "device")->valuestring, "cpu");
	cr_assert_eq(num(j, "steps"), 10);
	cJSON_Delete(j);
	run_free(&r);
	char *lb = log_text(b);
	cr_assert_str_eq(lb, la, "resumed:\n%s\nstraight:\n%s", lb, la);

	/* another shape: named */
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "4",
	    "--neurons", "64", "--batch", "2", "--time", "16", "--steps", "10", "--data", data, "--out", b,
	    "--resume", NULL);
	expect_one_line_error(&r, 1, "heads: the checkpoint's 2, this run's 4");
	run_free(&r);
	free(la);
	free(lb);
	sandbox_fini(&sb);
}

Test(cli_train, refusals)
{
	sandbox sb;
	run r;
	char data[600], out[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	text_file(&sb, data, sizeof(data), 6000);
	snprintf(out, sizeof(out), "%s/o", sb.root);
	gen(&sb, &r, "train", "--frobnicate", NULL);
	cr_assert_eq(r.code, 2, "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "train", "--lr", "fast", NULL);
	expect_one_line_error(&r, 2, "--lr fast");
	run_free(&r);
	gen(&sb, &r, "train", "--dropout", "1", NULL);
	expect_one_line_error(&r, 2, "dropout=1: must be in [0, 1)");
	run_free(&r);
	gen(&sb, &r, "train", "--cpu", "--preset", "bf16", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 2, "needs an NVIDIA GPU");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--data", "/nonexistent.txt", "--out", out, NULL);
	expect_one_line_error(&r, 1, "/nonexistent.txt");
	run_free(&r);
	setenv("DRAGON_CORPUS", "/nonexistent/shakespeare.txt", 1);
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	expect_one_line_error(&r, 1, "run scripts/corpus.sh");
	run_free(&r);
	unsetenv("DRAGON_CORPUS");
	gen(&sb, &r, "train", "--help", NULL);
	cr_assert_eq(r.code, 0);
	cr_assert(strstr(r.out, "usage: dragon train"), "%s", r.out);
	run_free(&r);
	sandbox_fini(&sb);
}

/* dragon plot: a PNG of a run's log (gnuplot, which scripts/deps.sh
 * installs); bad logs and flags refused. */
Test(cli_train, plot_draws_a_png)
{
	sandbox sb;
	run r;
	char data[600], a[600], log[700], png[700], bad[700];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	text_file(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", a, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	snprintf(log, sizeof(log), "%s/log.jsonl", a);
	snprintf(png, sizeof(png), "%s/loss.png", sb.root);
	gen(&sb, &r, "plot", log, log, "--label", "one", "--out", png, "--title", "tiny \"run\"", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "(2 logs)"), "%s", r.out);
	run_free(&r);
	size_t n;
	char *b = slurp(png, &n);
	cr_assert(b && n > 1000 && memcmp(b, "\x89PNG", 4) == 0, "%s is not a PNG", png);
	free(b);
	gen(&sb, &r, "plot", NULL);
	expect_one_line_error(&r, 2, "name one or more logs");
	run_free(&r);
	gen(&sb, &r, "plot", "/nonexistent/log.jsonl", "--out", png, NULL);
	expect_one_line_error(&r, 1, "/nonexistent/log.jsonl");
	run_free(&r);
	snprintf(bad, sizeof(bad), "%s/empty.jsonl", sb.root);
	FILE *f = fopen(bad, "w");
	cr_assert_not_null(f);
	fputs("not a log\n", f);
	fclose(f);
	gen(&sb, &r, "plot", bad, "--out", png, NULL);
	expect_one_line_error(&r, 1, "no step lines");
	run_free(&r);
	sandbox_fini(&sb);
}
