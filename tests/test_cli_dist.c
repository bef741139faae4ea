/*
 * dragon train --gpus N as a user runs it, on the CPU model (--cpu: N
 * processes of it), the binary at $DRAGON:
 *   - 2 ranks at batch 4 log what one process at batch 4 logs, up to the
 *     sums' order (f32: 1e-6 here, 2e-9 measured), at dropout 0 and 0.1
 *     (each rank draws the masks of its rows of the global batch:
 *     dg_model_batch's row0); rank 0 alone writes (one log, the
 *     checkpoints), and says "on 2 ranks";
 *   - with dropout, --stop-at then --resume of a 2-rank run logs the
 *     straight 2-rank run exactly (timing aside);
 *   - two processes started by another launcher (RANK, WORLD_SIZE,
 *     LOCAL_RANK, MASTER_ADDR, MASTER_PORT) are the --gpus 2 run;
 *   - kill -9 of rank 1: the launcher names it, stops rank 0, says the
 *     newest checkpoint, which loads, and --resume finishes the run to the
 *     straight log; ^C to the launcher stops both ranks at one step with
 *     a checkpoint (exit 130), --resume finishes it likewise;
 *   - a batch that is not a multiple of the ranks, and --gpus against
 *     WORLD_SIZE, are refused.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "cli_helpers.h"
#include "dragon/checkpoint.h"
#include "dragon/runtime.h"

#define TINY "--cpu", "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", \
	     "--batch", "4", "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3"

/* Each line of dir's log as {train_loss, grad_norm, val_loss or NAN}. */
static int log_values(const char *dir, double v[][3], int cap)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	char line[4096];
	int n = 0;
	while (n < cap && fgets(line, sizeof(line), f)) {
		cJSON *j = cJSON_Parse(line);
		cr_assert_not_null(j, "%s", line);
		v[n][0] = cJSON_GetObjectItem(j, "train_loss")->valuedouble;
		v[n][1] = cJSON_GetObjectItem(j, "grad_norm")->valuedouble;
		cJSON *vl = cJSON_GetObjectItem(j, "val_loss");
		v[n][2] = vl ? vl->valuedouble : NAN;
		cJSON_Delete(j);
		n++;
	}
	fclose(f);
	return n;
}

static int files_named(const char *dir, const char *part)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strstr(e->d_name, part) != NULL;
	closedir(d);
	return n;
}

/* 2 ranks against one process at batch 4, both at dropout `drop`. */
static void two_ranks_are_the_lone_run(const char *drop)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600];
	train_sandbox(&sb, data, sizeof(data), 8000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	gen_ok(&sb, "train", TINY, "--steps", "12", "--dropout", drop, "--data", data, "--out", a, NULL);
	gen(&sb, &r, "train", TINY, "--steps", "12", "--dropout", drop, "--gpus", "2", "--data", data, "--out", b, NULL);
	cr_assert_eq(r.code, 0, "%s", r.err);
	cr_assert(strstr(r.out, "trained: f32 on 2 ranks (the CPU), 12 steps of 4x16"), "%s", r.out);
	cr_assert_eq(count_lines(r.out), 1, "one report, rank 0's:\n%s", r.out);
	run_free(&r);
	double va[16][3], vb[16][3];
	int na = log_values(a, va, 16), nb = log_values(b, vb, 16);
	cr_assert_eq(na, 12);
	cr_assert_eq(nb, 12, "one log line a step (rank 0's alone)");
	double worst = 0;
	for (int i = 0; i < 12; i++)
		for (int k = 0; k < 3; k++) {
			if (isnan(va[i][k]) || isnan(vb[i][k])) {
				cr_assert(isnan(va[i][k]) && isnan(vb[i][k]), "step %d: val_loss in one log only", i + 1);
				continue;
			}
			double d = fabs(va[i][k] - vb[i][k]) / fabs(va[i][k]);
			worst = d > worst ? d : worst;
		}
	printf("dist: 2 ranks against one process, f32, dropout %s: worst relative difference %.2e over 12 steps\n",
	       drop, worst);
	cr_assert_lt(worst, 1e-6, "dropout %s", drop);
	cr_assert_eq(files_named(b, "ckpt-"), 1, "%s", listing(b));
	cr_assert_eq(files_named(b, ".tmp"), 0, "%s", listing(b));
	sandbox_fini(&sb);
}

Test(cli_dist, two_ranks_are_the_lone_run_and_rank_0_writes)
{
	two_ranks_are_the_lone_run("0");
}

/* With dropout: each rank's masks are its rows' in the global batch, so
 * the run is the lone one's (with masks of their own, the ranks' runs
 * drift apart from it at the first step). */
Test(cli_dist, two_ranks_with_dropout_are_the_lone_run)
{
	two_ranks_are_the_lone_run("0.1");
}

#define DROP_RUN TINY, "--steps", "12", "--ckpt-every", "4", "--dropout", "0.1", "--gpus", "2"

Test(cli_dist, stop_and_resume_and_another_launcher)
{
	sandbox sb;
	run r;
	char data[600], a[600], b[600], c[600];
	train_sandbox(&sb, data, sizeof(data), 8000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	snprintf(c, sizeof(c), "%s/c", sb.root);
	gen_ok(&sb, "train", DROP_RUN, "--data", data, "--out", a, NULL);
	gen_ok(&sb, "train", DROP_RUN, "--data", data, "--out", b, "--stop-at", "6", NULL);
	gen_ok(&sb, "train", DROP_RUN, "--data", data, "--out", b, "--resume", NULL);
	expect_same_log(b, "resumed 2-rank run", a, "straight");

	/* two ranks of another launcher: the environment alone */
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	char port[16];
	snprintf(port, sizeof(port), "%d", free_port());
	setenv("MASTER_PORT", port, 1);
	const char *args[] = { "train", TINY, "--steps", "12", "--ckpt-every", "4", "--dropout", "0.1", "--data",
			       data, "--out", c, NULL };
	pid_t pid[2];
	for (int k = 1; k >= 0; k--) {
		char rank[4];
		snprintf(rank, sizeof(rank), "%d", k);
		setenv("RANK", rank, 1);
		setenv("LOCAL_RANK", rank, 1);
		pid[k] = spawn_gen(&sb, args);
	}
	unsetenv("WORLD_SIZE");
	unsetenv("RANK");
	unsetenv("LOCAL_RANK");
	unsetenv("MASTER_ADDR");
	unsetenv("MASTER_PORT");
	for (int k = 0; k < 2; k++) { /* (the two share the sandbox's stdout and stderr files) */
		collect(&sb, pid[k], &r);
		cr_assert_eq(r.code, 0, "rank %d: %s", k, r.err);
		if (k == 1) {
			const char *t = strstr(r.out, "trained: ");
			cr_assert(t && !strstr(t + 1, "trained: "), "one report (rank 0's): %s", r.out);
		}
		run_free(&r);
	}
	expect_same_log(c, "another launcher's ranks", a, "--gpus 2");
	sandbox_fini(&sb);
}

/* The pid of a child of `parent` (rank `rank` of the launcher: its
 * children in start order), 0 while there is none. */
static pid_t child_of(pid_t parent, int rank)
{
	char path[64], buf[256] = "";
	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)parent, (int)parent);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = buf;
	for (int k = 0; k <= rank; k++) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p)
			return 0;
		if (k == rank)
			return (pid_t)v;
		p = end;
	}
	return 0;
}

/* Runs args (a 2-rank run into dir) until dir's log has lines lines, then
 * kill -9 of rank 1: the launcher exits 1 naming the rank and the newest
 * checkpoint, which is whole. Returns its step. */
static long long kill_rank_1(sandbox *sb, const char *const *args, const char *dir, int lines)
{
	run r;
	char ck[800];
	pid_t pid = spawn_gen(sb, args);
	wait_for_lines(dir, lines, pid);
	pid_t r1 = child_of(pid, 1);
	cr_assert_gt(r1, 0, "no rank 1 under the launcher %d", (int)pid);
	cr_assert_eq(kill(r1, SIGKILL), 0);
	collect(sb, pid, &r);
	cr_assert_eq(r.code, 1, "exit %d: %s", r.code, r.err);
	cr_assert(strstr(r.err, "rank 1 of 2 was killed by signal 9"), "%s", r.err);
	cr_assert(strstr(r.err, "the other ranks were stopped; the newest checkpoint is step "), "%s", r.err);
	long long newest = atoll(strstr(r.err, "checkpoint is step ") + strlen("checkpoint is step "));
	run_free(&r);
	snprintf(ck, sizeof(ck), "%s/ckpt-%08lld.safetensors", dir, newest);
	cr_assert_eq(ckpt_step(ck), newest);
	return newest;
}

#define LONG_RUN "--cpu", "--preset", "f32", "--layers", "1", "--embd", "32", "--heads", "2", "--neurons", "1024", \
		 "--batch", "2", "--time", "8", "--eval-every", "0", "--eval-batches", "1", "--seed", "5", \
		 "--steps", "300", "--ckpt-every", "3", "--gpus", "2"

Test(cli_dist, a_killed_rank_and_a_ctrl_c)
{
	sandbox sb;
	run r;
	char data[600], a[600], k[600], c[600];
	train_sandbox(&sb, data, sizeof(data), 8000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(k, sizeof(k), "%s/k", sb.root);
	snprintf(c, sizeof(c), "%s/c", sb.root);
	gen_ok(&sb, "train", LONG_RUN, "--data", data, "--out", a, NULL);

	/* kill -9 of rank 1 */
	const char *args[] = { "train", LONG_RUN, "--data", data, "--out", k, NULL };
	kill_rank_1(&sb, args, k, 10);
	gen_ok(&sb, "train", LONG_RUN, "--data", data, "--out", k, "--resume", NULL);
	expect_same_log(k, "after a killed rank", a, "straight");

	/* ^C to the launcher: both ranks stop at one step, with its checkpoint */
	const char *cargs[] = { "train", LONG_RUN, "--data", data, "--out", c, NULL };
	pid_t pid = spawn_gen(&sb, cargs);
	wait_for_lines(c, 10, pid);
	cr_assert_eq(kill(pid, SIGINT), 0);
	collect(&sb, pid, &r);
	cr_assert_eq(r.code, 130, "exit %d: %s", r.code, r.err);
	cr_assert(strstr(r.err, "interrupted at step "), "%s", r.err);
	run_free(&r);
	gen_ok(&sb, "train", LONG_RUN, "--data", data, "--out", c, "--resume", NULL);
	expect_same_log(c, "after ^C", a, "straight");
	sandbox_fini(&sb);
}

Test(cli_dist, refusals)
{
	sandbox sb;
	run r;
	char data[600], out[600];
	train_sandbox(&sb, data, sizeof(data), 8000);
	snprintf(out, sizeof(out), "%s/o", sb.root);
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--batch", "3", "--gpus", "2", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 2, "--batch 3 --gpus 2: the batch must be a multiple of the GPUs");
	run_free(&r);
	setenv("WORLD_SIZE", "3", 1);
	setenv("RANK", "0", 1);
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--gpus", "2", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 2, "--gpus 2, but WORLD_SIZE=3");
	run_free(&r);
	setenv("RANK", "5", 1);
	gen(&sb, &r, "train", "--cpu", "--preset", "f32", "--data", data, "--out", out, NULL);
	expect_one_line_error(&r, 2, "RANK=5");
	run_free(&r);
	unsetenv("WORLD_SIZE");
	unsetenv("RANK");
	gen(&sb, &r, "train", "--gpus", "0", NULL);
	cr_assert_eq(r.code, 2, "%s", r.err);
	run_free(&r);
	sandbox_fini(&sb);
}

/* GPUs here (0 without a driver), the reason in why. */
static int gpus(char *why, size_t size)
{
	int n = 0;
	why[0] = 0;
	dg_device_count(&n, why, size);
	return n;
}

#define GPU_BASE "--preset", "f32", "--layers", "2", "--embd", "32", "--heads", "2", "--neurons", "64", "--batch", "4", \
		 "--time", "16", "--eval-every", "5", "--eval-batches", "2", "--seed", "3", "--steps", "12"
#define GPU_RUN GPU_BASE, "--dropout", "0"
#define GPU_DROP GPU_BASE, "--dropout", "0.1"
/* long enough that a kill lands mid-run, a checkpoint every 50 steps */
#define GPU_LONG "--preset", "f32", "--layers", "1", "--embd", "32", "--heads", "2", "--neurons", "1024", \
		 "--batch", "2", "--time", "8", "--eval-every", "0", "--eval-batches", "1", "--seed", "5", \
		 "--steps", "1000000", "--ckpt-every", "50", "--gpus", "2"

/* The worst relative difference of two logs' 12 steps' values. */
static double log_worst(const char *a, const char *b)
{
	double va[16][3], vb[16][3];
	cr_assert_eq(log_values(a, va, 16), 12);
	cr_assert_eq(log_values(b, vb, 16), 12);
	double worst = 0;
	for (int i = 0; i < 12; i++)
		for (int k = 0; k < 3; k++)
			if (!isnan(va[i][k])) {
				double d = fabs(va[i][k] - vb[i][k]) / fabs(va[i][k]);
				worst = d > worst ? d : worst;
			}
	return worst;
}

/*
 * On a GPU: --gpus 1 is the data-parallel path with a world of one (NCCL
 * over one rank, inside the captured step), and logs what the lone run
 * logs, bit for bit; with 2 GPUs, --gpus 2 logs the lone run at the same
 * batch up to the sums' order (with dropout too: a rank draws its rows'
 * masks of the global batch), and kill -9 of rank 1 is named with the
 * newest checkpoint whole, which resumes.
 */
Test(cli_dist, gpu_one_rank_is_the_lone_run_and_two_are_too)
{
	char why[512];
	int n = gpus(why, sizeof(why));
	if (n == 0) {
		if (getenv("DRAGON_REQUIRE_GPU") && strcmp(getenv("DRAGON_REQUIRE_GPU"), "1") == 0)
			cr_assert_fail("DRAGON_REQUIRE_GPU=1 and no CUDA device: %s", why);
		printf("skipped: no CUDA device (%s)\n", why);
		cr_skip_test("skipped: no CUDA device (%s)", why);
	}
	sandbox sb;
	char data[600], a[600], b[600], c[600];
	train_sandbox(&sb, data, sizeof(data), 8000);
	snprintf(a, sizeof(a), "%s/a", sb.root);
	snprintf(b, sizeof(b), "%s/b", sb.root);
	snprintf(c, sizeof(c), "%s/c", sb.root);
	gen_ok(&sb, "train", GPU_RUN, "--data", data, "--out", a, NULL);
	gen_ok(&sb, "train", GPU_RUN, "--gpus", "1", "--data", data, "--out", b, NULL);
	expect_same_log(b, "--gpus 1", a, "lone");
	if (n < 2) {
		printf("gpu_two: skipped: needs 2 GPUs (this machine has %d); --gpus 1 checked\n", n);
		sandbox_fini(&sb);
		return;
	}
	gen_ok(&sb, "train", GPU_RUN, "--gpus", "2", "--data", data, "--out", c, NULL);
	double worst = log_worst(a, c);
	printf("dist: 2 GPUs against one, f32, dropout 0: worst relative difference %.2e over 12 steps\n", worst);
	cr_assert_lt(worst, 1e-5);

	/* with dropout: each rank draws its rows' masks of the global batch */
	char ad[600], cd[600], k[600];
	snprintf(ad, sizeof(ad), "%s/ad", sb.root);
	snprintf(cd, sizeof(cd), "%s/cd", sb.root);
	snprintf(k, sizeof(k), "%s/k", sb.root);
	gen_ok(&sb, "train", GPU_DROP, "--data", data, "--out", ad, NULL);
	gen_ok(&sb, "train", GPU_DROP, "--gpus", "2", "--data", data, "--out", cd, NULL);
	worst = log_worst(ad, cd);
	printf("dist: 2 GPUs against one, f32, dropout 0.1: worst relative difference %.2e over 12 steps\n", worst);
	cr_assert_lt(worst, 1e-5);

	/* kill -9 of rank 1: both exit, the rank is named, the newest
	 * checkpoint is whole and resumes */
	const char *args[] = { "train", GPU_LONG, "--data", data, "--out", k, NULL };
	long long newest = kill_rank_1(&sb, args, k, 120);
	char stop[32];
	snprintf(stop, sizeof(stop), "%lld", newest + 10);
	gen_ok(&sb, "train", GPU_LONG, "--data", data, "--out", k, "--resume", "--stop-at", stop, NULL);
	printf("dist: 2 GPUs, rank 1 killed: named, checkpoint %lld whole, resumed to %s\n", newest, stop);
	sandbox_fini(&sb);
}
