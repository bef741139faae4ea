/*
 * A training run on the CPU model (dragon/train.h, runtime/train/
 * trainer.c), at a tiny config (2 layers, D 32, H 2, N 64, B 2, T 16) on a
 * generated corpus of repeated text:
 *   - it learns: the validation loss at the end is below the one at step 4
 *     and far below ln 256;
 *   - the log has a line a step, the validation loss where evaluated, and
 *     the checkpoints are the newest `keep`;
 *   - a run stopped at step 7 (stop_at) and resumed logs the same train
 *     losses, gradient norms, learning rates and validation losses, bit for
 *     bit, as one that ran through, and ends with the same weights;
 *   - a resume whose config differs is refused naming the field; a resume
 *     with no checkpoint, a folder holding another run's checkpoints, a
 *     corpus too short for a row or of tokens past the model's vocabulary
 *     are refused; a learning rate that makes
 *     the loss blow up stops the run naming the step, the last checkpoint
 *     kept;
 *   - the stop flag (what `dragon train`'s SIGINT handler sets) ends the
 *     run with DG_ERR_INTERRUPTED and a checkpoint of the steps done (not
 *     written twice when the interval wrote it), and the resumed run logs
 *     what a straight one logs;
 *   - a full disk at a checkpoint (a file-size limit in a child) fails the
 *     run naming the file and errno, leaves no temp file and the previous
 *     checkpoint as it was; resumed with room, the log is the straight one.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dragon/checkpoint.h"
#include "dragon/train.h"
#include "helpers.h"

static dg_corpus *corpus_of(size_t n)
{
	return dg_test_corpus("To be, or not to be, that is the question: whether 'tis nobler in the mind "
			      "to suffer the slings and arrows of outrageous fortune. ",
			      n, 1);
}

static dg_train_opts tiny(const char *dir, int64_t steps)
{
	dg_train_opts o = dg_test_tiny_opts(dir, steps);
	o.batch = 2;
	o.opt.warmup = 2;
	o.eval_every = 4;
	o.eval_batches = 2;
	o.ckpt_every = 3;
	o.keep = 2;
	o.seed = 5;
	return o;
}

static dg_train_state *newest(const char *dir)
{
	int64_t latest;
	char msg[512];
	cr_assert_eq(dg_checkpoint_prune(dir, 0, &latest, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_geq(latest, 0);
	return dg_test_checkpoint_at(dir, latest);
}

Test(train, learns_and_resumes_bit_exactly)
{
	dg_corpus *c = corpus_of(4000);
	char a[512], b[512], msg[512];
	snprintf(a, sizeof(a), "%s/a", dg_test_tmpdir());
	snprintf(b, sizeof(b), "%s/b", dg_test_tmpdir());
	dg_train_opts o = tiny(a, 12);
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	int na;
	char *la = dg_test_log_untimed(a, &na);
	cr_assert_eq(na, 12, "%s", la);
	double v4, v12;
	cr_assert(sscanf(strstr(la, "{\"step\": 4,"), "{\"step\": 4, \"train_loss\": %*g, \"lr\": %*g, \"grad_norm\": %*g, \"val_loss\": %lf", &v4) == 1, "%s", la);
	cr_assert(sscanf(strstr(la, "{\"step\": 12,"), "{\"step\": 12, \"train_loss\": %*g, \"lr\": %*g, \"grad_norm\": %*g, \"val_loss\": %lf", &v12) == 1, "%s", la);
	cr_assert_lt(v12, v4, "val loss %g at 4, %g at 12", v4, v12);
	cr_assert_lt(v12, 0.9 * log(256.0), "val loss %g", v12);
	/* checkpoints: the newest two (steps 9 and 12) */
	char p[600];
	struct stat st;
	dg_checkpoint_path(a, 12, p, sizeof(p));
	cr_assert_eq(stat(p, &st), 0);
	dg_checkpoint_path(a, 9, p, sizeof(p));
	cr_assert_eq(stat(p, &st), 0);
	dg_checkpoint_path(a, 6, p, sizeof(p));
	cr_assert_neq(stat(p, &st), 0, "step 6's checkpoint kept past keep = 2");

	/* stopped at 7, resumed */
	dg_train_opts q = tiny(b, 12);
	q.stop_at = 7;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	int nb;
	free(dg_test_log_untimed(b, &nb));
	cr_assert_eq(nb, 7);
	q.stop_at = 0;
	q.resume = true;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	char *lb = dg_test_log_untimed(b, &nb);
	cr_assert_str_eq(lb, la, "a resumed run logged other numbers");
	dg_train_state *sa = newest(a), *sb = newest(b);
	cr_assert_eq(sa->step, 12);
	cr_assert_eq(sb->step, 12);
	cr_assert_eq(sa->data_rng.state, sb->data_rng.state);
	dg_test_expect_same_state(sa, sb);
	dg_train_state_destroy(sa);
	dg_train_state_destroy(sb);
	free(la), free(lb);
	dg_corpus_close(c);
}

Test(train, refusals_and_faults)
{
	dg_corpus *c = corpus_of(4000);
	char d[512], msg[512];
	snprintf(d, sizeof(d), "%s/r", dg_test_tmpdir());
	dg_train_opts o = tiny(d, 6);
	o.resume = true;
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_NOT_FOUND);
	cr_assert(strstr(msg, "no checkpoint to resume from"), "%s", msg);
	o.resume = false;
	o.stop_at = 3;
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* the same folder again without --resume: another run's checkpoints */
	o.stop_at = 0;
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "holds checkpoints of another run"), "%s", msg);
	/* a resume whose config differs, named */
	dg_train_opts h = o;
	h.resume = true;
	h.model.heads = 4;
	cr_assert_eq(dg_train_run(&h, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "cannot resume: heads: the checkpoint's 2, this run's 4"), "%s", msg);
	h = o;
	h.resume = true;
	h.opt.lr = 1e-2f;
	cr_assert_eq(dg_train_run(&h, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "cannot resume: lr:"), "%s", msg);
	/* the loss scaler on the CPU model: refused, naming the flag */
	dg_train_opts ls = tiny(d, 6);
	ls.loss_scale = true;
	cr_assert_eq(dg_train_run(&ls, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "--loss-scale dynamic: the loss scaler runs on the GPU model only"), "%s", msg);
	/* too short a corpus */
	dg_corpus *s = corpus_of(100);
	dg_train_opts t = tiny(d, 6);
	cr_assert_eq(dg_train_run(&t, s, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "validation split"), "%s", msg);
	dg_corpus_close(s);
	/* a corpus of tokens past the model's vocabulary */
	char tok[512];
	snprintf(tok, sizeof(tok), "%s/tokens.u16", dg_test_tmpdir());
	FILE *f = fopen(tok, "wb");
	cr_assert_not_null(f);
	for (int i = 0; i < 4000; i++)
		fputc(i % 200, f), fputc(i % 2, f); /* tokens up to 455 */
	fclose(f);
	dg_corpus_opts co = { .vocab = 512 };
	cr_assert_eq(dg_corpus_open_with(tok, &co, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	t = tiny(d, 6);
	cr_assert_eq(dg_train_run(&t, s, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "vocab=256: ") && strstr(msg, "holds tokens up to 511"), "%s", msg);
	dg_corpus_close(s);
	/* a blow-up: stopped at the step it happens, the last checkpoint kept */
	char e[512];
	snprintf(e, sizeof(e), "%s/nan", dg_test_tmpdir());
	dg_train_opts n = tiny(e, 40);
	n.opt.lr = 1e30f;
	n.opt.lr_floor = 1e29f;
	n.opt.clip = 0;
	n.opt.warmup = 0;
	n.ckpt_every = 1;
	dg_status st = dg_train_run(&n, c, NULL, NULL, msg, sizeof(msg));
	cr_assert_eq(st, DG_ERR_NUMERIC, "%s", msg);
	long long at = 0;
	cr_assert(sscanf(msg, "step %lld: the loss is", &at) == 1, "%s", msg);
	cr_assert(strstr(msg, "the last checkpoint is kept"), "%s", msg);
	dg_train_state *k = newest(e);
	cr_assert_eq(k->step, at - 1, "the newest checkpoint is of step %lld, the blow-up of %lld",
		     (long long)k->step, at);
	dg_train_state_destroy(k);
	dg_corpus_close(c);
}

/* What the progress callback of the stop test does: at step `at` it sets
 * the flag (as a signal arriving during that step would) and notes the
 * inode of that step's checkpoint, if one was written. */
typedef struct stopper {
	volatile sig_atomic_t flag;
	int64_t at;
	const char *dir;
	ino_t ino; /* 0: no checkpoint of step `at` when the flag was set */
} stopper;

/* q run to its end on c logs what the straight run logged (la, freed);
 * what names the case. */
static void expect_resumed_log(const dg_train_opts *q, dg_corpus *c, char *la, const char *what)
{
	char msg[512];
	cr_assert_eq(dg_train_run(q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	char *lb = dg_test_log_untimed(q->out_dir, NULL);
	cr_assert_str_eq(lb, la, "%s, the run logged other numbers", what);
	free(la);
	free(lb);
}

static void stop_at_step(const dg_train_report *r, void *user)
{
	stopper *s = user;
	if (r->step != s->at)
		return;
	s->flag = 1;
	char p[600];
	struct stat st;
	dg_checkpoint_path(s->dir, r->step, p, sizeof(p));
	s->ino = stat(p, &st) == 0 ? st.st_ino : 0;
}

/* Each file name of dir that holds ".tmp." (a save's temp file), joined. */
static void temp_files(const char *dir, char *out, size_t size)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	out[0] = '\0';
	for (struct dirent *e; (e = readdir(d));)
		if (strstr(e->d_name, ".tmp."))
			snprintf(out + strlen(out), size - strlen(out), "%s ", e->d_name);
	closedir(d);
}

Test(train, stop_flag_checkpoints_then_resumes)
{
	dg_corpus *c = corpus_of(4000);
	char *root = dg_test_tmpdir(), a[600], b[600], msg[1024], p[600];
	snprintf(a, sizeof(a), "%s/a", root);
	snprintf(b, sizeof(b), "%s/b", root);
	dg_train_opts o = tiny(a, 12);
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	int na, nb;
	char *la = dg_test_log_untimed(a, &na);

	/* stopped during step 5 (ckpt_every 3: no checkpoint of 5 yet): one
	 * is written, the log ends at 5 */
	dg_train_opts q = tiny(b, 12);
	stopper s = { .at = 5, .dir = b };
	q.stop = &s.flag;
	cr_assert_eq(dg_train_run(&q, c, stop_at_step, &s, msg, sizeof(msg)), DG_ERR_INTERRUPTED, "%s", msg);
	cr_assert_eq(s.ino, 0, "a checkpoint of step 5 before the stop");
	dg_checkpoint_path(b, 5, p, sizeof(p));
	char want[1400];
	snprintf(want, sizeof(want), "interrupted at step 5 of 12; checkpoint %s", p);
	cr_assert_str_eq(msg, want);
	free(dg_test_log_untimed(b, &nb));
	cr_assert_eq(nb, 5);
	dg_train_state *k = newest(b);
	cr_assert_eq(k->step, 5);
	dg_train_state_destroy(k);

	/* resumed and stopped during step 6, whose checkpoint the interval
	 * wrote: that file is the checkpoint named, not written again */
	q.resume = true;
	s = (stopper){ .at = 6, .dir = b };
	cr_assert_eq(dg_train_run(&q, c, stop_at_step, &s, msg, sizeof(msg)), DG_ERR_INTERRUPTED, "%s", msg);
	cr_assert_neq(s.ino, 0, "no checkpoint of step 6 when the flag was set");
	dg_checkpoint_path(b, 6, p, sizeof(p));
	struct stat st;
	cr_assert_eq(stat(p, &st), 0);
	cr_assert_eq(st.st_ino, s.ino, "step 6's checkpoint was written twice");
	cr_assert(strstr(msg, "interrupted at step 6 of 12; checkpoint ") && strstr(msg, p), "%s", msg);

	/* the flag set before the run starts: nothing runs, the resume
	 * point's checkpoint is named */
	s.flag = 1;
	s.at = -1;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INTERRUPTED, "%s", msg);
	cr_assert(strstr(msg, "interrupted at step 6 of 12; checkpoint "), "%s", msg);
	free(dg_test_log_untimed(b, &nb));
	cr_assert_eq(nb, 6);

	/* resumed to the end: the same log as the straight run */
	q.stop = NULL;
	expect_resumed_log(&q, c, la, "stopped and resumed");
	dg_corpus_close(c);
	dg_test_rmtree(root);
}

/*
 * A full disk while checkpointing, made honestly without root: a child
 * process whose file-size limit (RLIMIT_FSIZE) is half a checkpoint, with
 * SIGXFSZ ignored, so the write past the limit fails with EFBIG (after a
 * short write up to it) as a full disk fails with ENOSPC. The run
 * resumed there from step 4 fails at step 6's checkpoint; then: the error
 * names the file and errno, no temp file is left, step 4's checkpoint is
 * byte for byte what it was and loads; resumed without the limit, the
 * run ends with the log of one that never failed.
 */
Test(train, full_disk_keeps_the_last_checkpoint)
{
	dg_corpus *c = corpus_of(4000);
	char *root = dg_test_tmpdir(), a[600], d[600], msg[1024], p4[600], p6[600];
	snprintf(a, sizeof(a), "%s/a", root);
	snprintf(d, sizeof(d), "%s/d", root);
	dg_train_opts o = tiny(a, 8);
	o.ckpt_every = 2;
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	int na;
	char *la = dg_test_log_untimed(a, &na);

	dg_train_opts q = tiny(d, 8);
	q.ckpt_every = 2;
	q.stop_at = 4;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_checkpoint_path(d, 4, p4, sizeof(p4));
	dg_checkpoint_path(d, 6, p6, sizeof(p6));
	FILE *f = fopen(p4, "rb");
	cr_assert_not_null(f, "%s", p4);
	static unsigned char before[1 << 20], after[1 << 20];
	size_t n4 = fread(before, 1, sizeof(before), f);
	fclose(f);
	cr_assert(n4 > 0 && n4 < sizeof(before), "%zu bytes", n4);

	q.stop_at = 0;
	q.resume = true;
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		close(fds[0]);
		struct rlimit rl;
		getrlimit(RLIMIT_FSIZE, &rl);
		rl.rlim_cur = n4 / 2;
		signal(SIGXFSZ, SIG_IGN);
		dg_status st = setrlimit(RLIMIT_FSIZE, &rl) ? DG_ERR_INTERNAL
							    : dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg));
		int code = (int)st;
		if (write(fds[1], &code, sizeof(code)) != sizeof(code) || write(fds[1], msg, strlen(msg) + 1) < 0)
			_exit(2);
		_exit(0);
	}
	close(fds[1]);
	int code = -1;
	char got[1024] = "";
	cr_assert_eq(read(fds[0], &code, sizeof(code)), (ssize_t)sizeof(code));
	ssize_t k, at = 0;
	while ((k = read(fds[0], got + at, sizeof(got) - 1 - (size_t)at)) > 0)
		at += k;
	close(fds[0]);
	int ws;
	cr_assert_eq(waitpid(pid, &ws, 0), pid);
	cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the limited child died: %d", ws);
	cr_assert_eq(code, DG_ERR_IO, "status %d: %s", code, got);
	char want[1400];
	snprintf(want, sizeof(want), "step 6: checkpoint: %s: write: File too large (errno %d)", p6, EFBIG);
	cr_assert(strstr(got, want) == got, "%s\nwant: %s...", got, want);
	cr_assert(strstr(got, "temp file") && strstr(got, "is removed"), "%s", got);
	cr_assert(strstr(got, "the newest checkpoint is step 4"), "%s", got);

	char temps[2048];
	temp_files(d, temps, sizeof(temps));
	cr_assert_str_eq(temps, "", "temp files left: %s", temps);
	struct stat st;
	cr_assert_neq(stat(p6, &st), 0, "%s was written", p6);
	f = fopen(p4, "rb");
	cr_assert_not_null(f, "%s", p4);
	size_t m4 = fread(after, 1, sizeof(after), f);
	fclose(f);
	cr_assert(m4 == n4 && memcmp(before, after, n4) == 0, "%s changed", p4);
	dg_train_state *k4 = newest(d);
	cr_assert_eq(k4->step, 4);
	dg_train_state_destroy(k4);

	/* room again: the resume goes on from 4 and logs what a straight run logs */
	expect_resumed_log(&q, c, la, "resumed after the full disk");
	dg_corpus_close(c);
	dg_test_rmtree(root);
}

/*
 * The run folder's lock: held by a child process, refused to this one
 * naming the child's pid (whatever the file says), and free again once
 * the child is gone, its file still there.
 */
Test(train, the_folder_lock_names_its_holder)
{
	char *root = dg_test_tmpdir(), d[600], msg[1024];
	snprintf(d, sizeof(d), "%s/run/sub", root);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		int fd;
		char m[512], c = 'x';
		if (dg_train_lock(d, &fd, NULL, m, sizeof(m)) != DG_OK || write(p[1], &c, 1) != 1)
			_exit(1);
		alarm(60); /* a failed test's child does not outlive it long */
		pause();   /* until killed */
		_exit(0);
	}
	char c;
	cr_assert_eq(read(p[0], &c, 1), 1, "the child could not take the lock");
	int fd = -1;
	long holder = 0;
	cr_assert_eq(dg_train_lock(d, &fd, &holder, msg, sizeof(msg)), DG_ERR_IO);
	cr_assert_eq(holder, (long)kid);
	char want[64];
	snprintf(want, sizeof(want), "in use by another training run (pid %ld ", (long)kid);
	cr_assert(strstr(msg, want), "%s", msg);
	cr_assert_eq(fd, -1);
	/* a run on it: refused the same way, before anything is written */
	dg_corpus *c4 = corpus_of(4000);
	dg_train_opts o = tiny(d, 4);
	dg_train_result res;
	o.result = &res;
	cr_assert_eq(dg_train_run(&o, c4, NULL, NULL, msg, sizeof(msg)), DG_ERR_IO);
	cr_assert(strstr(msg, want), "%s", msg);
	cr_assert_not(res.resume_refused);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	cr_assert_eq(dg_train_lock(d, &fd, &holder, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_unlock(fd);
	cr_assert_eq(dg_train_run(&o, c4, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(res.first, 0);
	cr_assert_eq(res.step, 4);
	close(p[0]);
	close(p[1]);
	dg_corpus_close(c4);
	dg_test_rmtree(root);
}

/* The CPU model's memory estimate against a limit: refused naming both
 * and the fix; and its stop flag, set before a step, stops it. */
Test(train, cpu_memory_and_stop_flag)
{
	dg_train_opts o = tiny("unused", 4);
	char msg[1024];
	size_t need = 0;
	setenv("DRAGON_CPU_MEMORY", "1000000000000", 1);
	cr_assert_eq(dg_model_cpu_fits(&o.model, 2, 16, 5, &need, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(need > 100000 && need < 10000000, "%zu bytes for the tiny shape", need);
	setenv("DRAGON_CPU_MEMORY", "1000", 1);
	cr_assert_eq(dg_model_cpu_fits(&o.model, 2, 16, 5, NULL, msg, sizeof(msg)), DG_ERR_NOMEM);
	cr_assert(strstr(msg, "1.0 kB is available ($DRAGON_CPU_MEMORY): use a smaller --batch, --time or --neurons"),
		  "%s", msg);
	unsetenv("DRAGON_CPU_MEMORY");
	/* T 2^20: the scores are (T, T) f64, 8.8 TB */
	cr_assert_eq(dg_model_cpu_fits(&o.model, 2, 1 << 20, 5, &need, msg, sizeof(msg)), DG_ERR_NOMEM, "%s", msg);
	cr_assert_geq((double)need, 8.0 * (1 << 20) * (double)(1 << 20), "%zu", need);
	cr_assert(strstr(msg, "the attention backward's (T, T) scores"), "%s", msg);

	dg_model_weights *w, *g;
	cr_assert_eq(dg_model_weights_create(&o.model, 1, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&o.model, 2, &g, msg, sizeof(msg)), DG_OK, "%s", msg);
	int32_t idx[32], tgt[32];
	for (int i = 0; i < 32; i++)
		idx[i] = tgt[i] = 'a' + i % 26;
	volatile sig_atomic_t flag = 1;
	dg_model_batch b = { .idx = idx, .targets = tgt, .b = 2, .t = 16, .train = true, .stop = &flag };
	double loss = -1;
	cr_assert_eq(dg_model_cpu_step(w, &b, &loss, g, msg, sizeof(msg)), DG_ERR_INTERRUPTED);
	cr_assert(strstr(msg, "stopped before the step's op 1 of"), "%s", msg);
	cr_assert_eq(loss, -1);
	flag = 0;
	cr_assert_eq(dg_model_cpu_step(w, &b, &loss, g, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(loss > 0);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
}
