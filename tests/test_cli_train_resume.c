/*
 * `dragon train`'s run folder and what a resume holds to (the binary at
 * $DRAGON, the CPU model at a tiny shape on a generated text):
 *   - one run at a time: a second trainer on a folder another one holds
 *     (fresh, --resume, or a --gpus 2 launcher; and a lone one on a
 *     launcher's folder) is refused at once, exit 1, naming the holder's
 *     pid; the lock goes with its holder, a kill -9 included;
 *   - a resume repairs the log to its checkpoint, saying what it found:
 *     a missing log, lines that are not whole log lines, lines of a step
 *     that does not follow the one before, a log that stops short of the
 *     checkpoint; every line left is a whole JSON object;
 *   - a resume with another corpus, --batch, --time or --steps is refused
 *     naming the field, the flag and both values (exit 2; --steps no
 *     longer named "warmup"); --allow-changed takes each, and the log's
 *     next line records the change;
 *   - the steps a command ran, as --json and the summary line report them,
 *     under --stop-at and --resume;
 *   - --ckpt-every never: no checkpoint, at the end or at a stop.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3"
#define LONG_RUN TINY, "--steps", "100000", "--ckpt-every", "3"

/* Each line of dir's log parses as a JSON object with a step; their
 * steps into steps[] (at most cap); the count. */
static int log_steps(const char *dir, long long *steps, int cap)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	size_t n;
	char *s = slurp(path, &n);
	cr_assert_not_null(s, "%s", path);
	cr_assert(n == 0 || s[n - 1] == '\n', "%s: the last line is cut short", path);
	int k = 0;
	for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
		cJSON *j = cJSON_Parse(line);
		cr_assert(cJSON_IsObject(j), "%s: not a JSON line: '%s'", path, line);
		cr_assert_lt(k, cap);
		steps[k++] = (long long)num(j, "step");
		cJSON_Delete(j);
	}
	free(s);
	return k;
}

/* steps[0..n) are a..b. */
static void expect_steps(const long long *steps, int n, long long a, long long b)
{
	cr_assert_eq(n, b - a + 1, "%d lines, want steps %lld-%lld", n, a, b);
	for (int i = 0; i < n; i++)
		cr_assert_eq(steps[i], a + i, "line %d: step %lld, want %lld", i + 1, steps[i], a + i);
}

static long long last_step(const char *dir)
{
	long long st[512];
	int n = log_steps(dir, st, 512);
	return n ? st[n - 1] : 0;
}

/* A second trainer (its own sandbox: its output files) on dir, which pid
 * holds: refused at once naming it. */
static void refused_by(const sandbox *sb2, const char *const *args, pid_t holder)
{
	run r;
	char want[64];
	snprintf(want, sizeof(want), "in use by another training run (pid %ld ", (long)holder);
	pid_t pid = spawn_gen(sb2, args);
	/* at once: a trainer that runs instead fails the test, not hangs it */
	siginfo_t si = { 0 };
	for (int i = 0; i < 3000 && !si.si_pid; i++) {
		cr_assert_eq(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT), 0);
		if (!si.si_pid)
			usleep(10000);
	}
	if (!si.si_pid)
		kill(pid, SIGKILL);
	collect(sb2, pid, &r);
	expect_one_line_error(&r, 1, want);
	run_free(&r);
}

Test(cli_train_resume, one_run_at_a_time_in_a_folder)
{
	sandbox sb, sb2;
	run r;
	char data[600], d[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	sandbox_init(&sb2);
	text_file(&sb, data, sizeof(data), 6000);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	const char *fresh[] = { "train", LONG_RUN, "--data", data, "--out", d, NULL };
	const char *resume[] = { "train", LONG_RUN, "--data", data, "--out", d, "--resume", NULL };
	const char *ranks[] = { "train", LONG_RUN, "--data", data, "--out", d, "--resume", "--gpus", "2", NULL };

	pid_t a = spawn_gen(&sb, fresh);
	wait_for_lines(d, 4, a);
	refused_by(&sb2, fresh, a);
	refused_by(&sb2, resume, a);
	refused_by(&sb2, ranks, a);
	cr_assert_eq(kill(a, SIGTERM), 0);
	collect(&sb, a, &r);
	expect_stopped(&r, SIGTERM, "; resume with --resume");
	run_free(&r);
	long long st[4096];
	int n = log_steps(d, st, 4096);
	expect_steps(st, n, 1, n);

	/* its holder killed: the lock went with it (the file stays) */
	pid_t b = spawn_gen(&sb, resume);
	wait_for_lines(d, n + 3, b);
	cr_assert_eq(kill(b, SIGKILL), 0);
	collect(&sb, b, &r);
	run_free(&r);
	char lock[700];
	snprintf(lock, sizeof(lock), "%s/lock", d);
	cr_assert(exists(lock));

	/* a launcher of two ranks holds it for them, and a lone run is
	 * refused naming the launcher */
	pid_t c = spawn_gen(&sb, ranks);
	wait_for_lines(d, last_step(d) + 3, c);
	refused_by(&sb2, resume, c);
	cr_assert_eq(kill(c, SIGINT), 0);
	collect(&sb, c, &r);
	cr_assert_eq(r.code, 130, "%s", r.err);
	run_free(&r);
	n = log_steps(d, st, 4096);
	expect_steps(st, n, 1, n);
	sandbox_fini(&sb2);
	sandbox_fini(&sb);
}

/* dir's log as it is: its text (for a check that a refused command left
 * it as it was). */
static char *raw_log(const char *dir)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	return slurp(path, NULL);
}

static void write_log(const char *dir, const char *text)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	fclose(f);
}

/* dir's log's first n lines (of a log whose lines are all there). */
static char *first_lines(const char *dir, int n)
{
	char *s = raw_log(dir), *p = s;
	for (int i = 0; i < n && p; i++)
		p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
	cr_assert_not_null(p, "%s: fewer than %d lines", dir, n);
	*p = '\0';
	return s;
}

Test(cli_train_resume, a_resume_repairs_the_log_and_says_so)
{
	sandbox sb;
	run r;
	char data[600], a[600], d[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", a, NULL);
	char *straight = log_text(a);
	long long st[64];
	static const struct {
		const char *name;
		int keep;          /* lines of the stopped run's 6 kept (-1: no log) */
		const char *extra; /* then appended */
		const char *want;  /* the warning */
		bool whole;        /* the resumed log is the straight one */
	} cases[] = {
		{ "missing", -1, "", "log.jsonl: missing; steps 1-6 are not in the log, which goes on from step 7",
		  false },
		{ "garbage", 6, "garbage\n\x01\x02\n{\"step\": 7, \"train_lo",
		  "log.jsonl: dropped 3 lines that were not a whole log line (the first: line 7)", true },
		{ "short", 3, "", "log.jsonl ends at step 3 and the checkpoint is step 6: steps 4-6 are missing from the log",
		  false },
		{ "twice", 6, "{\"step\": 2, \"train_loss\": 1}\n{\"step\": 3, \"train_loss\": 1}\n",
		  "log.jsonl: dropped 2 lines whose step does not follow the one before (the first: line 7, step 2 "
		  "after step 6)",
		  true },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(d, sizeof(d), "%s/%s", sb.root, cases[i].name);
		gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--stop-at", "6", NULL);
		char *kept = first_lines(d, cases[i].keep < 0 ? 0 : cases[i].keep);
		char *text = malloc(strlen(kept) + strlen(cases[i].extra) + 1);
		sprintf(text, "%s%s", kept, cases[i].extra);
		if (cases[i].keep < 0) {
			char p[700];
			snprintf(p, sizeof(p), "%s/log.jsonl", d);
			cr_assert_eq(unlink(p), 0);
		} else {
			write_log(d, text);
		}
		free(kept);
		free(text);
		gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", NULL);
		cr_assert_eq(r.code, 0, "%s: %s", cases[i].name, r.err);
		cr_assert_eq(count_lines(r.err), 1, "%s: one warning: %s", cases[i].name, r.err);
		cr_assert(strncmp(r.err, "dragon: warning: ", 17) == 0 && strstr(r.err, cases[i].want), "%s: %s",
			  cases[i].name, r.err);
		run_free(&r);
		int n = log_steps(d, st, 64);
		if (cases[i].keep < 0) {
			expect_steps(st, n, 7, 10);
		} else if (cases[i].whole) {
			expect_steps(st, n, 1, 10);
			char *l = log_text(d);
			cr_assert_str_eq(l, straight, "%s", cases[i].name);
			free(l);
		} else {
			cr_assert_eq(n, cases[i].keep + 4, "%s", cases[i].name);
			expect_steps(st, cases[i].keep, 1, cases[i].keep);
			expect_steps(st + cases[i].keep, 4, 7, 10);
		}
	}
	free(straight);
	sandbox_fini(&sb);
}

/* The change a resume with --allow-changed records: line `step` of dir's
 * log has "changed": {key: {"from": ..., "to": ...}}, returned (owned);
 * key NULL: it has none (NULL returned). */
static cJSON *change_at(const char *dir, long long step, const char *key)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	char *s = slurp(path, NULL);
	cJSON *got = NULL;
	for (char *line = strtok(s, "\n"); line && !got; line = strtok(NULL, "\n")) {
		cJSON *j = cJSON_Parse(line);
		cr_assert_not_null(j, "%s", line);
		bool at = (long long)num(j, "step") == step;
		cJSON *c = cJSON_GetObjectItem(j, "changed");
		if (at && !key)
			cr_assert_null(c, "step %lld: %s", step, line);
		if (at && key) {
			cr_assert(cJSON_IsObject(c), "step %lld has no \"changed\": %s", step, line);
			cJSON *k = cJSON_GetObjectItem(c, key);
			cr_assert(cJSON_IsObject(k), "step %lld: no change of %s: %s", step, key, line);
			got = cJSON_Duplicate(k, true);
		}
		cJSON_Delete(j);
	}
	free(s);
	cr_assert(got || !key, "no line of step %lld", step);
	return got;
}

static void expect_change(const char *dir, long long step, const char *key, double from, double to)
{
	cJSON *c = change_at(dir, step, key);
	cr_assert_eq(num(c, "from"), from, "%s", key);
	cr_assert_eq(num(c, "to"), to, "%s", key);
	cJSON_Delete(c);
}

Test(cli_train_resume, a_resume_holds_the_corpus_batch_time_and_steps)
{
	sandbox sb;
	run r;
	char data[600], other[600], d[600];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(other, sizeof(other), "%s/other.txt", sb.root);
	text_file(&sb, data, sizeof(data), 7000);
	rename(data, other);
	text_file(&sb, data, sizeof(data), 6000);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--stop-at", "4", NULL);
	char *before = raw_log(d);

	/* each refused, naming the field, the flag, both values; nothing
	 * written (the default warmup follows --steps: 1 at 10, 6 at 60, but
	 * the message names the steps) */
	static const struct {
		const char *flag, *value, *want;
	} bad[] = {
		{ "--batch", "4", "cannot resume: batch: the checkpoint's 2, this run's 4 (--batch); give --allow-changed" },
		{ "--time", "8", "cannot resume: time: the checkpoint's 16, this run's 8 (--time); give --allow-changed" },
		{ "--steps", "60", "cannot resume: steps: the checkpoint's 10, this run's 60 (--steps); give --allow-changed" },
		{ "--data", NULL, "cannot resume: data: the checkpoint's corpus has SHA-256 " },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *v = bad[i].value ? bad[i].value : other;
		/* the flag last: it overrides TINY's and the defaults */
		gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", bad[i].flag, v, NULL);
		expect_one_line_error(&r, 2, bad[i].want);
		if (!bad[i].value)
			cr_expect(strstr(r.err, "other.txt") && strstr(r.err, "(--data)"), "%s", r.err);
		run_free(&r);
	}
	char *after = raw_log(d);
	cr_assert_str_eq(after, before, "a refused resume wrote the log");
	free(after);
	free(before);

	/* --allow-changed: each taken, recorded on the resumed run's first
	 * line, and the checkpoint holds the new value from then on */
	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", "--allow-changed",
	       "--batch", "4", "--stop-at", "5", NULL);
	expect_change(d, 5, "batch", 2, 4);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", NULL);
	expect_one_line_error(&r, 2, "batch: the checkpoint's 4, this run's 2 (--batch)");
	run_free(&r);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", "--allow-changed",
	       "--batch", "4", "--time", "8", "--stop-at", "6", NULL);
	expect_change(d, 6, "time", 16, 8);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", other, "--out", d, "--resume", "--allow-changed",
	       "--batch", "4", "--time", "8", "--stop-at", "7", NULL);
	cJSON *c = change_at(d, 7, "data");
	cr_assert(cJSON_IsString(cJSON_GetObjectItem(c, "from")) && cJSON_IsString(cJSON_GetObjectItem(c, "to")));
	cr_assert_eq(strlen(cJSON_GetObjectItem(c, "to")->valuestring), 64);
	cr_assert_str_neq(cJSON_GetObjectItem(c, "from")->valuestring, cJSON_GetObjectItem(c, "to")->valuestring);
	cJSON_Delete(c);
	gen_ok(&sb, "train", TINY, "--steps", "60", "--data", other, "--out", d, "--resume", "--allow-changed",
	       "--batch", "4", "--time", "8", "--stop-at", "8", NULL);
	expect_change(d, 8, "steps", 10, 60);
	expect_change(d, 8, "warmup", 1, 6);
	/* the new schedule is the checkpoint's now: resumed as it is */
	gen_ok(&sb, "train", TINY, "--steps", "60", "--data", other, "--out", d, "--resume", "--batch", "4", "--time",
	       "8", "--stop-at", "9", NULL);
	long long st[64];
	expect_steps(st, log_steps(d, st, 64), 1, 9);
	cr_assert_null(change_at(d, 9, NULL));
	cr_assert_null(change_at(d, 4, NULL));

	gen(&sb, &r, "train", TINY, "--data", data, "--out", d, "--allow-changed", NULL);
	expect_one_line_error(&r, 2, "--allow-changed goes with --resume");
	run_free(&r);
	sandbox_fini(&sb);
}

/* The steps a command ran: --stop-at, then resumes past it, beyond the
 * run's end, and with nothing left to do. */
Test(cli_train_resume, stop_at_and_json_count_the_steps_run)
{
	sandbox sb;
	run r;
	char data[600], d[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--stop-at", "4", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_assert_eq(num(j, "steps"), 4);
	cr_assert_eq(num(j, "step"), 4);
	cr_assert_eq(num(j, "total_steps"), 10);
	cJSON_Delete(j);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", "--stop-at", "7", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "trained: f32 on the CPU, 3 steps of 2x16 (steps 5-7 of 10), in "), "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", "--stop-at", "20", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "trained: f32 on the CPU, 3 steps of 2x16 (steps 8-10 of 10), in "), "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "trained: f32 on the CPU, 0 steps of 2x16 (the run was at step 10 of 10), in "), "%s",
		  r.out);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", d, "--resume", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	j = parse_json(r.out);
	cr_assert_eq(num(j, "steps"), 0);
	cr_assert_eq(num(j, "step"), 10);
	cJSON_Delete(j);
	run_free(&r);
	long long st[64];
	expect_steps(st, log_steps(d, st, 64), 1, 10);
	sandbox_fini(&sb);
}

/* The checkpoints in dir (ckpt-*.safetensors). */
static int ckpt_files(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert(d, "%s: not a folder", dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strncmp(e->d_name, "ckpt-", 5) == 0 && strstr(e->d_name, ".safetensors") != NULL;
	closedir(d);
	return n;
}

/*
 * --ckpt-every never: a run writes no checkpoint, not at the end and not
 * when a signal stops it (which says so, and offers no resume); the log
 * is the same as a run's with checkpoints.
 */
Test(cli_train_resume, ckpt_every_never_writes_none)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600], c[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	snprintf(c, sizeof(c), "%s/c", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", a, "--ckpt-every", "never", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "; log in "), "%s", r.out);
	run_free(&r);
	cr_expect_eq(ckpt_files(a), 0, "a checkpoint in %s", a);
	gen_ok(&sb, "train", TINY, "--steps", "6", "--data", data, "--out", b, NULL);
	cr_expect_eq(ckpt_files(b), 1);
	expect_same_log(a, "without checkpoints", b, "with");

	const char *never[] = { "train", LONG_RUN, "--data", data, "--out", c, "--ckpt-every", "never", NULL };
	pid_t pid = spawn_gen(&sb, never);
	wait_for_lines(c, 4, pid);
	cr_assert_eq(kill(pid, SIGTERM), 0);
	collect(&sb, pid, &r);
	cr_expect_eq(r.code, 128 + SIGTERM, "exit %d: %s", r.code, r.err);
	cr_expect(strstr(r.err, "SIGTERM: stopping, without a checkpoint (") &&
			  strstr(r.err, "; no checkpoint (none asked for)") && !strstr(r.err, "--resume"),
		  "%s", r.err);
	run_free(&r);
	cr_expect_eq(ckpt_files(c), 0, "a checkpoint in %s", c);
	gen(&sb, &r, "train", TINY, "--steps", "6", "--data", data, "--out", a, "--ckpt-every", "nev", NULL);
	expect_one_line_error(&r, 2, "--ckpt-every nev: a whole number of steps, or never");
	run_free(&r);
	sandbox_fini(&sb);
}
