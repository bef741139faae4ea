/*
 * `dragon train` and `dragon plot` as a user runs them (the binary at
 * $DRAGON); train on the CPU
 * model at a tiny shape on a generated text:
 *   - a run writes its log (a line a step, validation at the intervals and
 *     the end) and its checkpoints, and says where; --json gives one object;
 *   - --stop-at then --resume logs what one straight run logs (the timing
 *     fields aside);
 *   - a resume with another shape names the field (exit 2); a bad flag, a recipe
 *     the CPU model does not run (--cpu), a missing --data file and a
 *     missing built-in corpus (saying how to set it up) are refused with
 *     one line and the right exit code; so are the other bad inputs of a
 *     run (a short corpus, flags, resume mismatches, a truncated or
 *     corrupt checkpoint, a loss that blows up: the step named, the last
 *     good checkpoint kept); without a GPU a GPU-only preset's refusal
 *     says what to run instead, and an f32 run says it runs on the CPU;
 *   - faults: ^C and SIGTERM stop a run with a checkpoint of the step its
 *     log stops at (exit 130, 143) and --resume finishes it to the
 *     straight log; a full disk at a checkpoint names the file and errno
 *     and keeps the previous checkpoint, and so does a file-size limit
 *     (ulimit -f, SIGXFSZ at its default) with "File too large"; a
 *     directory or a FIFO as --data is refused by name at once; kill -9
 *     at 20 moments, many of them mid-write, always leaves a loadable newest checkpoint that
 *     --resume continues from, to the straight log and the same bytes;
 *     a second ^C during the stop's checkpoint kills the run, safely, but
 *     one SIGTERM sent twice by one process (timeout(1)) is one request;
 *   - on a terminal, the progress line (no MFU on the CPU).
 */
#define _XOPEN_SOURCE 700 /* posix_openpt, ptsname */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "dragon/checkpoint.h"
#include "runtime/store/safetensors.h"
#include "helpers.h"

extern char **environ;

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3"

Test(cli_train, runs_stops_and_resumes)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
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

	gen_ok(&sb, "train", TINY, "--steps", "10", "--data", data, "--out", b, "--stop-at", "4", NULL);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", b, "--resume", "--json", NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cJSON *j = parse_json(r.out);
	cr_assert_str_eq(cJSON_GetObjectItem(j, "device")->valuestring, "cpu");
	cr_assert_eq(num(j, "steps"), 6); /* this command's: 5..10 */
	cr_assert_eq(num(j, "step"), 10);
	cr_assert_eq(num(j, "total_steps"), 10);
	cJSON_Delete(j);
	run_free(&r);
	expect_same_log(b, "resumed", a, "straight");

	/* another shape: named */
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "4",
	    "--neurons", "64", "--batch", "2", "--time", "16", "--steps", "10", "--data", data, "--out", b,
	    "--resume", NULL);
	expect_one_line_error(&r, 2, "heads: the checkpoint's 2, this run's 4");
	run_free(&r);
	free(la);
	sandbox_fini(&sb);
}

Test(cli_train, refusals)
{
	sandbox sb;
	run r;
	char data[600], out[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
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
	gen(&sb, &r, "train", "--memory", "four", NULL);
	expect_one_line_error(&r, 2, "--memory four: not a size");
	run_free(&r);
	/* the CPU model's plan against --memory: refused before a step */
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons",
	    "64", "--batch", "2", "--time", "16", "--steps", "2", "--memory", "64K", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 1, "65.5 kB is available");
	run_free(&r);
	gen(&sb, &r, "train", "--cpu", "--preset", "bf16", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 2, "needs an NVIDIA GPU");
	run_free(&r);
	/* no GPU (none visible, on any machine): what to run instead; a
	 * recipe the CPU model runs runs there, saying so */
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	gen(&sb, &r, "train", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 1, "preset bf16 needs an NVIDIA GPU, and there is none");
	cr_expect(strstr(r.err, "`dragon train --cpu --preset f32 --layers 2 --embd 32") &&
			  strstr(r.err, "then `dragon sample runs/tiny`; or this command, as it is, on a machine with an NVIDIA GPU"),
		  "%s", r.err);
	run_free(&r);
	gen(&sb, &r, "train", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64",
	    "--batch", "2", "--time", "16", "--steps", "2", "--data", data, "--out", out, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.err, "dragon: note: no NVIDIA GPU here (") && strstr(r.err, "); running on the CPU model\n"),
		  "%s", r.err);
	run_free(&r);
	unsetenv("CUDA_VISIBLE_DEVICES");
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

/* --data (and $DRAGON_CORPUS) naming a directory or a FIFO: one line
 * naming the path and what it is, before anything is read. A directory
 * once said "9223372036854775807 bytes: out of memory"; a FIFO waited for
 * a writer forever (killed after 30 s here). */
Test(cli_train, data_that_is_not_a_file_is_refused)
{
	sandbox sb;
	run r;
	char dir[600], fifo[600], out[600], want[800];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(dir, sizeof(dir), "%s/corpus.d", sb.root);
	snprintf(fifo, sizeof(fifo), "%s/corpus.fifo", sb.root);
	snprintf(out, sizeof(out), "%s/o", sb.root);
	cr_assert_eq(mkdir(dir, 0700), 0);
	cr_assert_eq(mkfifo(fifo, 0600), 0);

	gen(&sb, &r, "train", TINY, "--data", dir, "--out", out, NULL);
	snprintf(want, sizeof(want), "dragon: --data %s: a directory, not a regular file", dir);
	expect_one_line_error(&r, 1, want);
	cr_expect(strstr(r.err, "out of memory") == NULL, "%s", r.err);
	run_free(&r);

	const char *args[] = { "train", TINY, "--data", fifo, "--out", out, NULL };
	gen_within(&sb, &r, 30, args);
	snprintf(want, sizeof(want), "dragon: --data %s: a FIFO (named pipe), not a regular file", fifo);
	expect_one_line_error(&r, 1, want);
	run_free(&r);

	setenv("DRAGON_CORPUS", dir, 1);
	gen(&sb, &r, "train", TINY, "--out", out, NULL);
	unsetenv("DRAGON_CORPUS");
	snprintf(want, sizeof(want), "dragon: %s: a directory, not a regular file", dir);
	expect_one_line_error(&r, 1, want);
	run_free(&r);
	sandbox_fini(&sb);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The step that an "interrupted at step N of M; checkpoint P" error names,
 * and P (into ckpt). */
static long long interrupted_at(const run *r, char *ckpt, size_t size)
{
	const char *at = strstr(r->err, "interrupted at step ");
	cr_assert_not_null(at, "%s", r->err);
	long long n = -1, m = -1;
	char p[700] = "";
	cr_assert(sscanf(at, "interrupted at step %lld of %lld; checkpoint %699[^;]", &n, &m, p) == 3, "%s", r->err);
	snprintf(ckpt, size, "%s", p);
	return n;
}

/* The last line of dir's log: its step. */
static long long last_logged(const char *dir)
{
	char *l = log_text(dir);
	char *last = l, *nl;
	while ((nl = strchr(last, '\n')) && nl[1])
		last = nl + 1;
	long long st = -1;
	cr_assert(sscanf(last, "{\"step\": %lld", &st) == 1, "%s", l);
	free(l);
	return st;
}

#define LONG_RUN TINY, "--steps", "100", "--ckpt-every", "1000"

/*
 * ^C, then SIGTERM, then the end: each signal, sent once the log shows a
 * few more steps, stops the run with exit 128 + the signal and a
 * checkpoint of the step its log stops at; --resume then finishes a run
 * whose log is the straight run's (timing fields aside).
 */
Test(cli_train, sigint_and_sigterm_checkpoint_and_resume)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600], ck[700], want[800];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	gen_ok(&sb, "train", LONG_RUN, "--data", data, "--out", a, NULL);

	const char *fresh[] = { "train", LONG_RUN, "--data", data, "--out", b, NULL };
	const char *resume[] = { "train", LONG_RUN, "--data", data, "--out", b, "--resume", NULL };
	static const int sigs[2] = { SIGINT, SIGTERM };
	long long done = 0;
	for (int k = 0; k < 2; k++) {
		pid_t pid = spawn_gen(&sb, k == 0 ? fresh : resume);
		wait_for_lines(b, (int)done + 5, pid);
		cr_assert_eq(kill(pid, sigs[k]), 0);
		collect(&sb, pid, &r);
		expect_stopped(&r, sigs[k], "; resume with --resume");
		long long n = interrupted_at(&r, ck, sizeof(ck));
		run_free(&r);
		cr_assert(n >= done + 5 && n < 100, "stopped at step %lld (%lld before)", n, done);
		snprintf(want, sizeof(want), "%s/ckpt-%08lld.safetensors", b, n);
		cr_assert_str_eq(ck, want);
		cr_assert_eq(last_logged(b), n, "the log goes past the checkpoint of step %lld", n);
		cr_assert_eq(log_lines(b), n);
		cr_assert_eq(ckpt_step(ck), n);
		done = n;
	}
	gen_ok(&sb, "train", LONG_RUN, "--data", data, "--out", b, "--resume", NULL);
	expect_same_log(b, "interrupted twice", a, "straight");
	sandbox_fini(&sb);
}

/*
 * One SIGTERM sent twice by the same process, as timeout(1) sends it (to
 * its child, then to its process group): one request, so the run still
 * stops with its checkpoint (exit 143), whether the two arrive together
 * or 5 ms apart (the first handled before the second comes); before, the
 * second took the default action and the run died without one.
 */
Test(cli_train, sigterm_twice_from_one_sender_is_one_request)
{
	sandbox sb;
	run r;
	char data[600], b[600], ck[700];
	train_sandbox(&sb, data, sizeof(data), 6000);
	static const useconds_t gaps[2] = { 0, 5000 };
	for (int k = 0; k < 2; k++) {
		snprintf(b, sizeof(b), "%s/b%d", sb.root, k);
		const char *args[] = { "train", LONG_RUN, "--data", data, "--out", b, NULL };
		pid_t pid = spawn_gen(&sb, args);
		wait_for_lines(b, 5, pid);
		cr_assert_eq(kill(pid, SIGTERM), 0);
		if (gaps[k])
			usleep(gaps[k]);
		kill(pid, SIGTERM); /* ESRCH if the run has ended already */
		collect(&sb, pid, &r);
		expect_stopped(&r, SIGTERM, "; resume with --resume");
		long long n = interrupted_at(&r, ck, sizeof(ck));
		run_free(&r);
		cr_assert_eq(last_logged(b), n, "gap %u us", (unsigned)gaps[k]);
		cr_assert_eq(ckpt_step(ck), n, "gap %u us", (unsigned)gaps[k]);
	}
	sandbox_fini(&sb);
}

/* Bytes of a file (NULL if it is missing). */
static char *bytes_of(const char *path, size_t *n)
{
	return exists(path) ? slurp(path, n) : NULL;
}

/* Names in dir that hold ".tmp." (a checkpoint's temp file). */
static int temps_in(const char *dir, long pid)
{
	char *l = listing(dir), tag[64];
	snprintf(tag, sizeof(tag), ".tmp.%ld.", pid);
	int n = 0;
	for (char *line = strtok(l, "\n"); line; line = strtok(NULL, "\n"))
		n += strstr(line, pid ? tag : ".tmp.") != NULL && strncmp(line, "ckpt-", 5) == 0;
	free(l);
	return n;
}

/*
 * A full disk at a checkpoint: the run given a file-size limit of half a
 * checkpoint (RLIMIT_FSIZE, inherited through exec, with SIGXFSZ ignored
 * so the write fails with EFBIG as one on a full disk fails with ENOSPC)
 * exits 1 with one line naming the file and errno; no temp file is left,
 * the previous checkpoint is as it was, and --resume with room goes on
 * from it to the straight run's log.
 */
Test(cli_train, full_disk_names_the_file_and_keeps_the_last_checkpoint)
{
	sandbox sb;
	run r;
	char data[600], a[600], d[600], p4[700], p6[700];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", a, NULL);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", d, "--stop-at",
	       "4", NULL);
	snprintf(p4, sizeof(p4), "%s/ckpt-00000004.safetensors", d);
	snprintf(p6, sizeof(p6), "%s/ckpt-00000006.safetensors", d);
	size_t n4, m4;
	char *before = bytes_of(p4, &n4);
	cr_assert_not_null(before, "%s", p4);

	struct rlimit was, lim;
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
	lim = was;
	lim.rlim_cur = n4 / 2;
	void (*xfsz)(int) = signal(SIGXFSZ, SIG_IGN);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
	const char *args[] = { "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", d,
			       "--resume", NULL };
	pid_t pid = spawn_gen(&sb, args);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
	signal(SIGXFSZ, xfsz);
	collect(&sb, pid, &r);
	char want[900];
	snprintf(want, sizeof(want), "dragon: step 6: checkpoint: %s: write: File too large (errno %d)", p6, EFBIG);
	expect_one_line_error(&r, 1, want);
	cr_assert(strstr(r.err, want) == r.err, "%s", r.err);
	cr_assert(strstr(r.err, "is removed; the newest checkpoint is step 4"), "%s", r.err);
	run_free(&r);
	cr_assert_eq(temps_in(d, 0), 0, "a temp file was left:\n%s", listing(d));
	cr_assert_not(exists(p6));
	char *after = bytes_of(p4, &m4);
	cr_assert(after && m4 == n4 && memcmp(before, after, n4) == 0, "%s changed", p4);
	cr_assert_eq(ckpt_step(p4), 4);
	free(before);
	free(after);

	gen_ok(&sb, "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", d, "--resume",
	       NULL);
	expect_same_log(d, "resumed after a full disk", a, "straight");
	sandbox_fini(&sb);
}

/*
 * `ulimit -f` as a shell sets it: a file-size limit of half a checkpoint
 * with SIGXFSZ at its default action, which once killed the run by that
 * signal without a word of dragon's. dragon ignores SIGXFSZ, so the write
 * fails with EFBIG: exit 1, one line naming the file and "too large", and
 * the previous checkpoint as it was.
 */
Test(cli_train, file_size_limit_names_the_file_and_keeps_the_last_checkpoint)
{
	sandbox sb;
	run r;
	char data[600], d[600], p4[700], p6[700];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", d, "--stop-at",
	       "4", NULL);
	snprintf(p4, sizeof(p4), "%s/ckpt-00000004.safetensors", d);
	snprintf(p6, sizeof(p6), "%s/ckpt-00000006.safetensors", d);
	size_t n4, m4;
	char *before = bytes_of(p4, &n4);
	cr_assert_not_null(before, "%s", p4);

	const char *args[] = { "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", d,
			       "--resume", NULL };
	gen_fsize(&sb, &r, n4 / 2, args);
	cr_assert_neq(r.code, 128 + SIGXFSZ, "killed by SIGXFSZ: %s", r.err);
	char want[900];
	snprintf(want, sizeof(want), "dragon: step 6: checkpoint: %s: write: File too large", p6);
	expect_one_line_error(&r, 1, want);
	cr_assert(strstr(r.err, "the newest checkpoint is step 4"), "%s", r.err);
	run_free(&r);
	cr_assert_eq(temps_in(d, 0), 0, "a temp file was left:\n%s", listing(d));
	cr_assert_not(exists(p6));
	char *after = bytes_of(p4, &m4);
	cr_assert(after && m4 == n4 && memcmp(before, after, n4) == 0, "%s changed", p4);
	cr_assert_eq(ckpt_step(p4), 4);
	free(before);
	free(after);
	sandbox_fini(&sb);
}

/* A run whose checkpoint (2.5 MB: D 32, H 2, N 1024, with AdamW's
 * moments) is written every step, and whose steps (B 1, T 8) are short,
 * so that a save (its hash, then the temp file's write and fsync) is a
 * good part of a step's time. */
#define KILL_STEPS 40
#define KILL_RUN "--cpu", "--preset", "f32", "--layers", "1", "--embd", "32", "--heads", "2", "--neurons", "1024", \
		 "--batch", "1", "--time", "8", "--eval-every", "0", "--eval-batches", "1", "--seed", "3", \
		 "--steps", "40", "--ckpt-every", "1", "--keep", "2"

/* The newest complete checkpoint of dir (the exact ckpt-<8 digits>.
 * safetensors names; temp files are not), -1 if none. */
static long long newest_ckpt(const char *dir)
{
	char *l = listing(dir);
	long long best = -1;
	for (char *line = strtok(l, "\n"); line; line = strtok(NULL, "\n")) {
		long long st;
		int end = 0;
		if (sscanf(line, "ckpt-%8lld.safetensors%n", &st, &end) == 1 && end == (int)strlen(line) && st > best)
			best = st;
	}
	free(l);
	return best;
}

/* Sleeps until cond(dir, pid, arg) holds (polling every 0.1 ms, at most
 * 120 s); fails, with its stderr, if the child ends first. */
static void wait_until(const sandbox *sb, bool (*cond)(const char *, long, long long), const char *dir, pid_t pid,
		       long long arg)
{
	const double t0 = now_s();
	while (!cond(dir, (long)pid, arg)) {
		int ws;
		if (waitpid(pid, &ws, WNOHANG) == pid) {
			char path[700];
			snprintf(path, sizeof(path), "%s/stderr", sb->root);
			cr_assert_fail("the run ended (status %d) before the moment to kill it: %s", ws,
				       slurp(path, NULL));
		}
		if (now_s() - t0 > 120) {
			kill(pid, SIGKILL);
			waitpid(pid, &ws, 0);
			cr_assert_fail("the moment to kill never came in 120 s");
		}
		usleep(100);
	}
}

/* The child has saved a checkpoint past `before` and is writing another. */
static bool writing_another(const char *dir, long pid, long long before)
{
	return newest_ckpt(dir) > before && temps_in(dir, pid) > 0;
}

/* The child has logged two steps past `before` and saved a checkpoint past it. */
static bool two_steps_on(const char *dir, long pid, long long before)
{
	(void)pid;
	return log_lines(dir) >= before + 2 && newest_ckpt(dir) > before;
}

/*
 * kill -9 at many moments of a run that checkpoints every step: 20 kills,
 * every other one the moment the child's temp file of a save appears
 * (once it has published one checkpoint in this life, so the run moves
 * on), the others at delays of 0 to 14 ms after two more logged steps,
 * which land anywhere in a step (its compute, its log line, its save,
 * the rename, the prune). After each kill: the newest complete checkpoint
 * loads and is no older than before; a temp file left means the kill
 * came mid-write (counted; the design makes one all but certain, and at
 * least one is asserted). Each next life is a --resume, which must not
 * take a temp file for a checkpoint; the last runs to the end: its log is
 * the straight run's, its final checkpoint the same bytes, and no temp
 * file is left (the runs removed the dead ones).
 */
Test(cli_train, kill9_at_any_moment_keeps_a_checkpoint)
{
	sandbox sb;
	run r;
	char data[600], a[600], k[600], pa[700], pk[700];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(k, sizeof(k), "%s/k", sb.root);
	gen_ok(&sb, "train", KILL_RUN, "--data", data, "--out", a, NULL);

	const char *fresh[] = { "train", KILL_RUN, "--data", data, "--out", k, NULL };
	const char *resume[] = { "train", KILL_RUN, "--data", data, "--out", k, "--resume", NULL };
	int kills = 0, mid_write = 0;
	long long newest = -1;
	for (int i = 0; i < 20 && newest < KILL_STEPS - 6; i++) {
		pid_t pid = spawn_gen(&sb, i == 0 ? fresh : resume);
		if (i % 2) {
			wait_until(&sb, writing_another, k, pid, newest);
		} else {
			wait_until(&sb, two_steps_on, k, pid, newest);
			usleep((useconds_t)(i / 2 * 1500 % 15000));
		}
		cr_assert_eq(kill(pid, SIGKILL), 0);
		collect(&sb, pid, &r);
		cr_assert_eq(r.code, 128 + SIGKILL, "life %d ended by itself (%d): %s", i, r.code, r.err);
		run_free(&r);
		kills++;
		mid_write += temps_in(k, (long)pid) > 0;
		long long now = newest_ckpt(k);
		cr_assert_geq(now, newest, "kill %d: the newest checkpoint went from %lld back to %lld", i, newest, now);
		snprintf(pk, sizeof(pk), "%s/ckpt-%08lld.safetensors", k, now);
		cr_assert_eq(ckpt_step(pk), now, "kill %d", i);
		cr_assert_geq(log_lines(k), now, "kill %d: the log lost steps", i);
		newest = now;
	}
	cr_log_info("%d kills, %d mid-write (a temp file left), the run at step %lld", kills, mid_write, newest);
	printf("kill9: %d kills, %d mid-write (a temp file left)\n", kills, mid_write);
	cr_assert_geq(kills, 10, "only %d kills before the run's end came near", kills);
	cr_assert_geq(mid_write, 1, "none of %d kills landed mid-write", kills);

	gen_ok(&sb, "train", KILL_RUN, "--data", data, "--out", k, "--resume", NULL);
	char what[64];
	snprintf(what, sizeof(what), "killed %d times", kills);
	expect_same_log(k, what, a, "straight");
	snprintf(pa, sizeof(pa), "%s/ckpt-%08d.safetensors", a, KILL_STEPS);
	snprintf(pk, sizeof(pk), "%s/ckpt-%08d.safetensors", k, KILL_STEPS);
	size_t na, nk;
	char *ba = bytes_of(pa, &na), *bk = bytes_of(pk, &nk);
	cr_assert(ba && bk && na == nk && memcmp(ba, bk, na) == 0, "the final checkpoints differ");
	free(ba);
	free(bk);
	cr_assert_eq(temps_in(k, 0), 0, "temp files left after the last run:\n%s", listing(k));
	sandbox_fini(&sb);
}

/* The child is writing a checkpoint's temp file, or has ended (then
 * reaped into *ended, so collect must not wait for it again). */
static bool temp_or_end(const char *dir, pid_t pid, int *ended)
{
	return temps_in(dir, (long)pid) > 0 || waitpid(pid, ended, WNOHANG) == pid;
}

/*
 * ^C twice, the second while the first one's checkpoint is being written
 * (the run checkpoints every 5 steps; the first ^C comes past step 6, so
 * the stop writes one of its own), the second from another process (as a
 * terminal's ^C or another shell's kill): a second request, so it kills
 * the run by SIGINT midway through the save. Exit 130 either way;
 * the newest complete checkpoint loads, and --resume finishes the run to
 * the straight log. Whether the second signal landed mid-write depends on
 * the timing of the save (its hash, write and fsync); it is printed, not
 * asserted, since the invariant is what must hold either way.
 */
Test(cli_train, second_sigint_during_the_checkpoint)
{
	sandbox sb;
	run r;
	char data[600], a[600], d[600], ck[700];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(d, sizeof(d), "%s/d", sb.root);
#define TWICE_RUN KILL_RUN, "--ckpt-every", "5"
	gen_ok(&sb, "train", TWICE_RUN, "--data", data, "--out", a, NULL);
	const char *args[] = { "train", TWICE_RUN, "--data", data, "--out", d, NULL };
	pid_t pid = spawn_gen(&sb, args);
	wait_for_lines(d, 7, pid);
	cr_assert_eq(kill(pid, SIGINT), 0);
	int ended = -1;
	const double t0 = now_s();
	while (!temp_or_end(d, pid, &ended) && now_s() - t0 < 120)
		usleep(50);
	const bool twice = ended == -1;
	int code;
	if (twice) {
		pid_t sender = fork();
		cr_assert_geq(sender, 0);
		if (sender == 0)
			_exit(kill(pid, SIGINT) ? 1 : 0);
		int ss;
		cr_assert_eq(waitpid(sender, &ss, 0), sender);
		cr_assert(WIFEXITED(ss) && WEXITSTATUS(ss) == 0, "the second ^C's sender failed");
		collect(&sb, pid, &r);
		code = r.code; /* 130 too when the second ^C killed it */
		run_free(&r);
	} else {
		cr_assert(WIFEXITED(ended), "the run died of signal %d", WTERMSIG(ended));
		code = WEXITSTATUS(ended);
	}
	cr_assert_eq(code, 128 + SIGINT, "exit %d", code);
	int left = temps_in(d, (long)pid);
	printf("second ^C: %s, %s\n", twice ? "sent during the save" : "the save was done first",
	       left ? "a temp file left (mid-write)" : "no temp file left");
	long long newest = newest_ckpt(d);
	cr_assert_geq(newest, 5);
	snprintf(ck, sizeof(ck), "%s/ckpt-%08lld.safetensors", d, newest);
	cr_assert_eq(ckpt_step(ck), newest);
	gen_ok(&sb, "train", TWICE_RUN, "--data", data, "--out", d, "--resume", NULL);
	expect_same_log(d, "stopped by two ^C", a, "straight");
	cr_assert_eq(temps_in(d, 0), 0, "a temp file left after the resume:\n%s", listing(d));
	sandbox_fini(&sb);
}

/* Writes n bytes of b at offset `at` of the file at path (or cuts the
 * file to `at` bytes when b is NULL). */
static void damage(const char *path, long at, const void *b, size_t n)
{
	if (!b) {
		cr_assert_eq(truncate(path, at), 0, "%s", path);
		return;
	}
	FILE *f = fopen(path, "r+b");
	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fseek(f, at, SEEK_SET), 0);
	cr_assert_eq(fwrite(b, 1, n, f), n);
	fclose(f);
}

/*
 * The bad inputs of a run, each refused with one line that names it and
 * the right exit code: a corpus too short for a row (empty, or without
 * a validation row), flags (a value out of range or not a number, a
 * missing value, an argument, an unknown preset); resuming with no
 * checkpoint, with another config (the field named), into another run's
 * folder without --resume, from a truncated or damaged checkpoint (the
 * file named; not silently an older one: a flipped bit of a tensor or of
 * the step, a step of 999999999999, a second moment that is not a number,
 * gradients in its place); a loss that is not finite (the step named,
 * the last good checkpoint kept and whole).
 */
Test(cli_train, bad_inputs_are_refused_by_name)
{
	sandbox sb;
	run r;
	char data[600], out[600], p[600], ck[800];
	cli_use_program("DRAGON", "dragon: ");
	sandbox_init(&sb);
	snprintf(out, sizeof(out), "%s/o", sb.root);
	text_file(&sb, data, sizeof(data), 100);
	gen(&sb, &r, "train", TINY, "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 1, "text.txt: its validation split (the last 10%) is 10 bytes; rows of 16 tokens need 17");
	run_free(&r);
	text_file(&sb, data, sizeof(data), 0);
	gen(&sb, &r, "train", TINY, "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 1, "text.txt: its train split (the first 90%) is 0 bytes");
	run_free(&r);

	static const struct {
		const char *flag, *value, *want;
	} flags[] = {
		{ "--steps", "0", "--steps 0: expected a whole number from 1" },
		{ "--batch", "x", "--batch x: expected a whole number from 1" },
		{ "--accum", "0", "--accum 0: expected a whole number from 1" },
		{ "--accum", "1025", "--accum 1025: expected a whole number from 1" },
		{ "--accum", "two", "--accum two: expected a whole number from 1" },
		{ "--time", "-3", "--time -3" },
		{ "--clip", "-1", "--clip -1: not a number >= 0" },
		{ "--preset", "nope", "--preset: preset nope: unknown; presets are" },
		{ "extra", NULL, "train takes no argument 'extra'" },
		{ "--keep", NULL, "train flag --keep needs a value" },
	};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		gen(&sb, &r, "train", "--cpu", "--out", out, flags[i].flag, flags[i].value, NULL);
		expect_one_line_error(&r, 2, flags[i].want);
		run_free(&r);
	}
	cr_assert_not(exists(out), "a refused command made %s", out);

	text_file(&sb, data, sizeof(data), 6000);
	/* accumulation runs on the CPU model and says so */
	char acc[600];
	snprintf(acc, sizeof(acc), "%s/accum", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "2", "--accum", "2", "--data", data, "--out", acc, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_expect(strstr(r.out, "2 steps of 4x16 (2 micro-batches)"), "%s", r.out);
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 1, "no checkpoint to resume from");
	run_free(&r);
	gen_ok(&sb, "train", TINY, "--steps", "10", "--ckpt-every", "2", "--data", data, "--out", out, "--stop-at",
	       "4", NULL);
	snprintf(ck, sizeof(ck), "%s/ckpt-00000002.safetensors", out);
	cr_assert(exists(ck), "%s", ck);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 1, "holds checkpoints of another run (the newest step 4)");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--lr", "0.002", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 2, "cannot resume: lr: the checkpoint's 0.00100000005, this run's 0.00200000009");
	run_free(&r);
	gen(&sb, &r, "train", TINY, "--steps", "12", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 2, "cannot resume: steps: the checkpoint's 10, this run's 12 (--steps)");
	run_free(&r);

	/* the newest checkpoint damaged: refused, naming it (not resumed
	 * from step 2's, which would hide the damage) */
	snprintf(ck, sizeof(ck), "%s/ckpt-00000004.safetensors", out);
	size_t n;
	char *good = slurp(ck, &n);
	const char *step = strstr(good + 8, "\"step\":\"4\"");
	cr_assert_not_null(step);
	const struct {
		long at;
		const char *bytes;
		const char *want;
	} bad[] = {
		{ (long)n / 2, NULL, "(truncated?)" },
		{ 8, "garbage!", "header: must start with '{'" },
		{ 0, "\xff\xff\xff\xff\xff\xff\xff\x7f", "header length 9223372036854775807; at most" },
		{ 6, NULL, "6 bytes; a safetensors file starts with an 8-byte header length" },
		{ (long)n - 3, "\x55", ": damaged: its bytes hash to " }, /* a byte of a tensor */
		{ (long)(step - good) + 8, "5", ": damaged: its bytes hash to " }, /* "step":"4" -> "5" */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		damage(ck, bad[i].at, bad[i].bytes, bad[i].bytes ? strlen(bad[i].bytes) : 0);
		gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
		expect_one_line_error(&r, 1, ck);
		expect_one_line_error(&r, 1, bad[i].want);
		run_free(&r);
		FILE *f = fopen(ck, "wb");
		cr_assert_not_null(f);
		cr_assert_eq(fwrite(good, 1, n, f), n);
		fclose(f);
	}
	/* written whole by another program: a step far past the run's (the
	 * seal as it was), a second moment that is not a number (sealed),
	 * gradients in its place */
	dg_safetensors *f;
	char msg[1024];
	cr_assert_eq(dg_safetensors_load(ck, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer *w = dg_test_rewrite(f, NULL, dg_test_far_step, NULL);
	cr_assert_eq(dg_safetensors_writer_save(w, ck, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_safetensors_writer_destroy(w);
	dg_safetensors_destroy(f);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 1, "ckpt-00000004.safetensors: damaged: ");
	run_free(&r);
	dg_train_state *st = NULL;
	damage(ck, 0, NULL, 0);
	damage(ck, 0, good, n);
	cr_assert_eq(dg_checkpoint_load(ck, &st, msg, sizeof(msg)), DG_OK, "%s", msg);
	st->v[DG_PARAM_ENCODER][11] = NAN;
	cr_assert_eq(dg_checkpoint_save(st, ck, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_state_destroy(st);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 1, "ckpt-00000004.safetensors: adamw.v.encoder[11] is nan");
	run_free(&r);
	damage(ck, 0, NULL, 0);
	damage(ck, 0, good, n);
	snprintf(p, sizeof(p), "%s/grads.safetensors", sb.root);
	gen_ok(&sb, "eval", "--model", ck, "--cpu", "--batch", "1", "--time", "8", "--batches", "1", "--grads", p,
	       NULL);
	cr_assert_eq(rename(p, ck), 0);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
	expect_one_line_error(&r, 1, "ckpt-00000004.safetensors: a gradients file");
	run_free(&r);
	FILE *gf = fopen(ck, "wb");
	cr_assert_not_null(gf);
	cr_assert_eq(fwrite(good, 1, n, gf), n);
	fclose(gf);
	free(good);
	gen(&sb, &r, "train", TINY, "--steps", "10", "--data", data, "--out", out, "--resume", NULL);
	cr_assert_eq(r.code, 0, "the mended checkpoint: %s", r.err);
	run_free(&r);

	/* a blow-up: the step named, the checkpoint before it kept */
	snprintf(p, sizeof(p), "%s/nan", sb.root);
	gen(&sb, &r, "train", TINY, "--steps", "40", "--lr", "1e30", "--clip", "0", "--warmup", "0", "--ckpt-every",
	    "1", "--data", data, "--out", p, NULL);
	expect_one_line_error(&r, 1, "; stopped (the last checkpoint is kept)");
	long long at = -1;
	const char *s = strstr(r.err, "dragon: step ");
	cr_assert(s && sscanf(s, "dragon: step %lld: the loss is", &at) == 1 && at >= 2, "%s", r.err);
	run_free(&r);
	cr_assert_eq(newest_ckpt(p), at - 1);
	snprintf(ck, sizeof(ck), "%s/ckpt-%08lld.safetensors", p, at - 1);
	cr_assert_eq(ckpt_step(ck), at - 1);
	sandbox_fini(&sb);
}

/* Runs the program with args, its stderr a pseudo-terminal: what it
 * wrote there (malloc'd), its exit status into *code. */
static char *on_a_terminal(const sandbox *sb, const char *const *args, int *code)
{
	int m = posix_openpt(O_RDWR | O_NOCTTY);
	cr_assert_geq(m, 0, "posix_openpt: %s", strerror(errno));
	cr_assert(grantpt(m) == 0 && unlockpt(m) == 0);
	char tty[256], outp[700];
	snprintf(tty, sizeof(tty), "%s", ptsname(m));
	snprintf(outp, sizeof(outp), "%s/stdout", sb->root);
	char *argv[64];
	int n = 0;
	argv[n++] = getenv("DRAGON");
	cr_assert(argv[0] && *argv[0], "DRAGON is not set (run through ctest)");
	for (; args[n - 1]; n++)
		argv[n] = (char *)args[n - 1];
	argv[n] = NULL;
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 2, tty, O_RDWR | O_NOCTTY, 0);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	cr_assert_eq(rc, 0, "posix_spawn: %s", strerror(rc));
	size_t cap = 1 << 16, len = 0;
	char *out = malloc(cap);
	for (;;) { /* until the child closes the terminal (EIO) */
		if (len + 4096 > cap)
			out = realloc(out, cap *= 2);
		ssize_t k = read(m, out + len, cap - len - 1);
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	out[len] = '\0';
	close(m);
	int ws;
	cr_assert_eq(waitpid(pid, &ws, 0), pid);
	*code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
	return out;
}

/* On a terminal: the progress line (rewritten in place, kept at each
 * validation); on the CPU, whose peak is unknown, no MFU. */
Test(cli_train, progress_on_a_terminal)
{
	sandbox sb;
	char data[600], out[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(out, sizeof(out), "%s/o", sb.root);
	const char *args[] = { "train", TINY, "--steps", "10", "--data", data, "--out", out, NULL };
	int code;
	char *err = on_a_terminal(&sb, args, &code);
	cr_assert_eq(code, 0, "%s", err);
	cr_assert(strstr(err, "\rstep 4/10  loss "), "%s", err);
	cr_assert(strstr(err, "\rstep 5/10  loss ") && strstr(strstr(err, "\rstep 5/10  loss "), "  val "), "%s", err);
	cr_assert(strstr(err, " tok/s  eta "), "%s", err);
	cr_assert_null(strstr(err, "mfu"), "an MFU on the CPU: %s", err);
	free(err);
	sandbox_fini(&sb);
}

/* dragon plot: a PNG of a run's log (gnuplot, which scripts/deps.sh
 * installs); bad logs and flags refused. */
Test(cli_train, plot_draws_a_png)
{
	sandbox sb;
	run r;
	char data[600], a[600], log[700], png[700], bad[700];
	if (!gnuplot_or_skip())
		return;
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "6", "--data", data, "--out", a, NULL);
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
