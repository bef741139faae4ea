/*
 * How `dragon train` on the CPU model stops, or refuses to start (the
 * binary at $DRAGON):
 *   - a signal is acknowledged on stderr at once (well within a second),
 *     while the run is still winding down;
 *   - a lone run's long CPU step is cut short between its ops: a step of
 *     seconds ends in a fraction of one, the step under way dropped (the
 *     newest checkpoint is the step before, whole; the log ends there),
 *     and the resumed run draws that step's batch again, logging what a
 *     straight run logs;
 *   - a validation cut short the same way: its step is logged without
 *     the val_loss, checkpointed, and the resume adds it (the straight
 *     run's);
 *   - a shape whose step needs more memory than there is is refused
 *     before anything is allocated (fast, the process small), naming the
 *     estimate, what is available and the flags to shrink; a limit set by
 *     $DRAGON_CPU_MEMORY the same way;
 *   - --cpu alone names what the user typed and what to add.
 */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "cli_helpers.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The first line of sb's stderr file holds want (waits at most limit s,
 * polling every ms): the time it took, or -1. */
static double wait_for_err(const sandbox *sb, const char *want, double limit)
{
	char p[700];
	snprintf(p, sizeof(p), "%s/stderr", sb->root);
	const double t0 = now_s();
	while (now_s() - t0 < limit) {
		char *s = slurp(p, NULL);
		bool got = s && strstr(s, want);
		free(s);
		if (got)
			return now_s() - t0;
		usleep(1000);
	}
	return -1;
}

/* A step of seconds on the CPU: four layers at T 768 (2 s on a busy
 * 2-core machine); the validation cheap (one batch, at the end only). */
#define SLOW "--cpu", "--preset", "f32", "--layers", "4", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--time", "768", "--eval-every", "0", "--eval-batches", "1", "--seed", "5",       \
	     "--ckpt-every", "1", "--steps", "6"

/* The stop tests' start: a sandbox with 20000 bytes of data (its path
 * into data) and the run folders a and d (600 bytes each); `dragon train
 * <flags> --data data --out d` started (*pid) and its first log line
 * awaited: the seconds that took (a step, and the start). */
static double start_run(sandbox *sb, const char *const *flags, char *data, char *a, char *d, pid_t *pid)
{
	const char *args[40] = { "train" };
	int n = 1;
	train_sandbox(sb, data, 600, 20000);
	snprintf(a, 600, "%s/a", sb->root);
	snprintf(d, 600, "%s/d", sb->root);
	for (int i = 0; flags[i]; i++)
		args[n++] = flags[i];
	const char *tail[] = { "--data", data, "--out", d, NULL };
	for (int i = 0; i < 5; i++)
		args[n++] = tail[i];
	const double t0 = now_s();
	*pid = spawn_gen(sb, args);
	wait_for_lines(d, 1, *pid);
	return now_s() - t0;
}

static const char *const slow[] = { SLOW, NULL };

Test(cli_train_stop, a_long_cpu_step_stops_at_once_and_says_so)
{
	sandbox sb;
	run r;
	char data[600], a[600], d[600], ck[700];
	pid_t pid;
	const double step = start_run(&sb, slow, data, a, d, &pid); /* a step, and the start */
	usleep((useconds_t)(step * 0.25e6)); /* into step 2 (step 1's checkpoint is written) */
	const double ts = now_s();
	cr_assert_eq(kill(pid, SIGTERM), 0);
	const double ack = wait_for_err(&sb, "dragon: SIGTERM: stopping with a checkpoint (1 step done)", 1.0);
	collect(&sb, pid, &r);
	const double took = now_s() - ts;
	cr_log_info("a step %.2f s; acknowledged in %.3f s, stopped in %.3f s", step, ack, took);
	printf("cpu stop: a step %.2f s; acknowledged in %.3f s, stopped in %.3f s\n", step, ack, took);
	cr_assert(ack >= 0 && ack < 1.0, "no acknowledgement within a second: %s", r.err);
	expect_stopped(&r, SIGTERM, "interrupted at step 1 of 6; checkpoint ");
	run_free(&r);
	cr_assert_lt(took, step / 2, "stopping took %.2f s of a %.2f s step", took, step);
	snprintf(ck, sizeof(ck), "%s/ckpt-00000001.safetensors", d);
	cr_assert_eq(ckpt_step(ck), 1);
	cr_assert_eq(log_lines(d), 1);
	char *l = listing(d);
	cr_assert_str_eq(l, "ckpt-00000001.safetensors\nlock\nlog.jsonl\n", "%s", l);
	free(l);

	/* step 2 again, from the batch it drew: the straight run's */
	gen_ok(&sb, "train", SLOW, "--data", data, "--out", d, "--resume", "--stop-at", "2", NULL);
	gen_ok(&sb, "train", SLOW, "--data", data, "--out", a, "--stop-at", "2", NULL);
	expect_same_log(d, "stopped midway and resumed", a, "straight");
	sandbox_fini(&sb);
}

/* Steps of a fraction of a second and a validation of many batches (at
 * step 2): the signal lands in the validation. */
#define VAL "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	    "--batch", "2", "--time", "256", "--eval-every", "2", "--eval-batches", "60", "--seed", "5",     \
	    "--ckpt-every", "10", "--steps", "3"

static const char *const val[] = { VAL, NULL };

Test(cli_train_stop, a_validation_cut_short_is_finished_by_the_resume)
{
	sandbox sb;
	run r;
	char data[600], a[600], d[600];
	pid_t pid;
	const double step = start_run(&sb, val, data, a, d, &pid);
	/* step 2 takes one step; its validation sixty forwards (~20 steps) */
	usleep((useconds_t)(step * 4e6));
	const double ts = now_s();
	cr_assert_eq(kill(pid, SIGINT), 0);
	collect(&sb, pid, &r);
	const double took = now_s() - ts;
	cr_log_info("a step %.2f s; stopped in %.3f s", step, took);
	expect_stopped(&r, SIGINT, "interrupted at step 2 of 3; checkpoint ");
	run_free(&r);
	cr_assert_lt(took, 4 * step, "stopping took %.2f s (a step %.2f s)", took, step);
	cr_assert_eq(log_lines(d), 2);
	char *ld = log_text(d);
	cr_assert_null(strstr(ld, "val_loss"), "%s", ld);
	free(ld);

	gen_ok(&sb, "train", VAL, "--data", data, "--out", d, "--resume", NULL);
	gen_ok(&sb, "train", VAL, "--data", data, "--out", a, NULL);
	expect_same_log(d, "stopped in a validation and resumed", a, "straight");
	sandbox_fini(&sb);
}

/* Runs args (as gen) under an address-space limit of `limit` bytes (the
 * child's own), killing it after `secs`: its exit (as run.code), its
 * peak RSS in KiB and its time. */
static void run_limited(const sandbox *sb, const char *const *args, rlim_t limit, double secs, run *r,
			long *rss_kib, double *took)
{
	struct rlimit old, lim;
	cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
	lim = (struct rlimit){ limit < old.rlim_max ? limit : old.rlim_max, old.rlim_max }; /* soft: undone after */
	cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0); /* inherited by the child; this process's own is small */
	const double t0 = now_s();
	pid_t pid = spawn_gen(sb, args);
	cr_assert_eq(setrlimit(RLIMIT_AS, &old), 0);
	int ws = 0;
	struct rusage ru;
	pid_t w;
	while ((w = wait4(pid, &ws, WNOHANG, &ru)) == 0 && now_s() - t0 < secs)
		usleep(10000);
	if (w == 0) {
		kill(pid, SIGKILL);
		wait4(pid, &ws, 0, &ru);
		cr_assert_fail("still running after %.0f s", secs);
	}
	*took = now_s() - t0;
	*rss_kib = ru.ru_maxrss;
	char p[700];
	snprintf(p, sizeof(p), "%s/stdout", sb->root);
	r->out = slurp(p, NULL);
	snprintf(p, sizeof(p), "%s/stderr", sb->root);
	r->err = slurp(p, NULL);
	r->code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* The address space the refused shape's run gets: 4 GiB, a net under a
 * run that would start (a sanitizer's shadow needs it all). */
#if defined(__SANITIZE_ADDRESS__)
#define HUGE_LIMIT RLIM_INFINITY
#else
#define HUGE_LIMIT ((rlim_t)4 << 30)
#endif

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "2", "--eval-every", "5", "--eval-batches", "2", "--seed", "3", "--steps", "3"

Test(cli_train_stop, a_shape_past_the_memory_is_refused_before_it_starts)
{
	sandbox sb;
	run r = { 0 };
	char data[600], d[600];
	train_sandbox(&sb, data, sizeof(data), 10500000); /* a validation split of a row of 2^20 */
	snprintf(d, sizeof(d), "%s/d", sb.root);
	long rss;
	double took;
	/* T 2^20: the attention backward's (T, T) f64 scores alone are 8.8 TB;
	 * the arenas 15 GB. */
	const char *huge[] = { "train", TINY, "--time", "1048576", "--data", data, "--out", d, NULL };
	run_limited(&sb, huge, HUGE_LIMIT, 30, &r, &rss, &took);
	cr_log_info("refused in %.2f s, peak RSS %ld KiB", took, rss);
	expect_one_line_error(&r, 1, "the CPU model at batch 2 x time 1048576 (layers 2, embd 32, heads 2, neurons 64) "
				     "needs about ");
	cr_expect(strstr(r.err, " TB: ") && strstr(r.err, "the attention backward's (T, T) scores") &&
			  strstr(r.err, "use a smaller --batch, --time or --neurons"),
		  "%s", r.err);
	cr_expect_lt(took, 10.0);
	cr_expect_lt(rss, 200 * 1024, "peak RSS %ld KiB: something was allocated", rss);
	cr_expect_not(exists(d), "a refused run made %s", d);
	run_free(&r);

	/* a limit given: the tiny shape's step is ~1 MB */
	setenv("DRAGON_CPU_MEMORY", "100000", 1);
	const char *tiny[] = { "train", TINY, "--time", "16", "--data", data, "--out", d, NULL };
	run_limited(&sb, tiny, RLIM_INFINITY, 30, &r, &rss, &took);
	unsetenv("DRAGON_CPU_MEMORY");
	expect_one_line_error(&r, 1, "the CPU model at batch 2 x time 16 ");
	cr_expect(strstr(r.err, " MB: ") && strstr(r.err, "100.0 kB is available ($DRAGON_CPU_MEMORY)"), "%s", r.err);
	run_free(&r);
	setenv("DRAGON_CPU_MEMORY", "100000000", 1);
	run_limited(&sb, tiny, RLIM_INFINITY, 60, &r, &rss, &took);
	unsetenv("DRAGON_CPU_MEMORY");
	cr_expect_eq(r.code, 0, "%s", r.err);
	run_free(&r);
	sandbox_fini(&sb);
}

Test(cli_train_stop, cpu_alone_names_what_to_add)
{
	sandbox sb;
	run r;
	char data[600], d[600];
	train_sandbox(&sb, data, sizeof(data), 6000);
	snprintf(d, sizeof(d), "%s/d", sb.root);
	gen(&sb, &r, "train", "--cpu", "--data", data, "--out", d, NULL);
	expect_one_line_error(&r, 2, "--cpu: the default preset, bf16, runs on an NVIDIA GPU only; add --preset f32 (or "
				     "w8a8, bitnet) to train on the CPU");
	cr_expect_null(strstr(r.err, "--preset bf16"), "names a flag never typed: %s", r.err);
	run_free(&r);
	/* typed: named as typed */
	gen(&sb, &r, "train", "--cpu", "--preset", "bf16", "--data", data, "--out", d, NULL);
	expect_one_line_error(&r, 2, "--preset bf16 --cpu: the CPU model runs f32");
	run_free(&r);
	sandbox_fini(&sb);
}
