/*
 * Gradient accumulation on the CPU model (dragon/train.h accum,
 * runtime/train/trainer.c), at a tiny config (2 layers, D 32, H 2, N 64,
 * T 16, dropout on):
 *   - K micro-batches of b rows make the step of one batch of K·b rows:
 *     (b 2, K 2) and (b 1, K 4) against (b 4, K 1), three steps: the train
 *     losses and gradient norms of every step within 1e-5 (relative; the
 *     norm is what a 1/K scale left out, or applied twice, would move by
 *     K), the weights after the updates within 1e-6 (a three-thousandth
 *     of a step at lr 3e-3) — and (b 2, K 1), the first micro-batch alone, is
 *     shown to be far outside both, so the tolerance can fail;
 *   - the checkpoint records accum; a run stopped at step 2 and resumed
 *     logs what the straight run logs, bit for bit, with the same
 *     weights; a resume with another accum is refused naming it (and
 *     allowed with allow_changed, noted in the log);
 *   - accum outside 0..DG_TRAIN_MAX_ACCUM is refused naming it.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/checkpoint.h"
#include "dragon/train.h"
#include "helpers.h"

enum { STEPS = 3 };

static dg_corpus *corpus_of(size_t n)
{
	return dg_test_corpus("Now is the winter of our discontent made glorious summer by this sun of "
			      "York; and all the clouds that lour'd upon our house. ",
			      n, 7);
}

static dg_train_opts tiny(const char *dir, int batch, int accum, int64_t steps)
{
	dg_train_opts o = dg_test_tiny_opts(dir, steps);
	o.batch = batch;
	o.accum = accum;
	o.opt.warmup = 1;
	o.eval_every = 0; /* at the last step only (over b-row batches: not compared) */
	o.eval_batches = 1;
	o.ckpt_every = 1;
	o.keep = 0;
	o.seed = 11;
	return o;
}

static void run_in(const char *name, int batch, int accum, char *dir, size_t size)
{
	char msg[512];
	snprintf(dir, size, "%s/%s", dg_test_tmpdir(), name);
	dg_corpus *c = corpus_of(6000);
	dg_train_opts o = tiny(dir, batch, accum, STEPS);
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s: %s", name, msg);
	dg_corpus_close(c);
}

/* Step n's train_loss and grad_norm from dir's log. */
static void logged(const char *dir, int n, double *loss, double *norm)
{
	char path[600], line[1024], key[32];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	snprintf(key, sizeof(key), "{\"step\": %d,", n);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	bool found = false;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, key, strlen(key)) == 0) {
			cr_assert_eq(sscanf(line, "{\"step\": %*d, \"train_loss\": %lf, \"lr\": %*g, \"grad_norm\": %lf",
					    loss, norm),
				     2, "%s", line);
			found = true;
		}
	fclose(f);
	cr_assert(found, "%s: no step %d", path, n);
}

/* The largest |a − b| over every weight of two checkpoints. */
static double weights_apart(const dg_train_state *a, const dg_train_state *b)
{
	double worst = 0;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&a->weights->config, (dg_model_param)p, &nd, sh);
		for (int64_t i = 0; i < n; i++) {
			double d = fabs((double)a->weights->params[p][i] - (double)b->weights->params[p][i]);
			if (d > worst)
				worst = d;
		}
	}
	return worst;
}

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(fabs(a), fabs(b));
}

Test(train_accum, k_micro_batches_are_the_k_times_larger_batch)
{
	char big[512], k2[512], k4[512], part[512];
	run_in("big", 4, 1, big, sizeof(big));
	run_in("k2", 2, 2, k2, sizeof(k2));
	run_in("k4", 1, 4, k4, sizeof(k4));
	run_in("part", 2, 1, part, sizeof(part)); /* the first micro-batch alone */
	const char *const same[2] = { k2, k4 };
	for (int n = 1; n <= STEPS; n++) {
		double lb, nb, lp, np;
		logged(big, n, &lb, &nb);
		logged(part, n, &lp, &np);
		for (int k = 0; k < 2; k++) {
			double l, g;
			logged(same[k], n, &l, &g);
			printf("train_accum step %d: K·b batch loss %.9g norm %.9g; %s loss %.9g norm %.9g\n", n, lb,
			       nb, k ? "b 1 K 4" : "b 2 K 2", l, g);
			cr_expect_lt(rel(l, lb), 1e-5, "step %d: loss %.9g, the larger batch's %.9g", n, l, lb);
			cr_expect_lt(rel(g, nb), 1e-5, "step %d: norm %.9g, the larger batch's %.9g", n, g, nb);
		}
		/* the tolerance can fail: the micro-batch alone is another step */
		cr_expect_gt(rel(lp, lb) + rel(np, nb), 1e-3, "step %d: the half batch logs the whole one's", n);
	}
	dg_train_state *sb = dg_test_checkpoint_at(big, STEPS), *s2 = dg_test_checkpoint_at(k2, STEPS), *s4 = dg_test_checkpoint_at(k4, STEPS),
		       *sp = dg_test_checkpoint_at(part, STEPS);
	cr_expect_eq(s2->accum, 2, "the checkpoint's accum %d", s2->accum);
	cr_expect_eq(s2->batch, 2);
	cr_expect_eq(sb->accum, 0, "accum 1 is not written (reads 0), got %d", sb->accum);
	double d2 = weights_apart(sb, s2), d4 = weights_apart(sb, s4), dp = weights_apart(sb, sp);
	printf("train_accum weights apart from the K·b batch's: K 2 %.3g, K 4 %.3g, half batch %.3g\n", d2, d4, dp);
	cr_expect_lt(d2, 1e-6, "K 2: weights %.3g apart", d2);
	cr_expect_lt(d4, 1e-6, "K 4: weights %.3g apart", d4);
	cr_expect_gt(dp, 1e-4, "the half batch's weights are only %.3g apart: the tolerance cannot fail", dp);
	cr_expect_eq(memcmp(&s2->data_rng, &sb->data_rng, sizeof(dg_rng)), 0, "the batch stream moved otherwise");
	dg_train_state_destroy(sb);
	dg_train_state_destroy(s2);
	dg_train_state_destroy(s4);
	dg_train_state_destroy(sp);
}

Test(train_accum, resume_is_bit_exact_and_holds_accum)
{
	char a[512], b[512], msg[512];
	snprintf(a, sizeof(a), "%s/straight", dg_test_tmpdir());
	snprintf(b, sizeof(b), "%s/stopped", dg_test_tmpdir());
	dg_corpus *c = corpus_of(6000);
	dg_train_opts o = tiny(a, 2, 3, 4);
	cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_train_opts q = tiny(b, 2, 3, 4);
	q.stop_at = 2;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* another accum: refused naming it */
	q.stop_at = 0;
	q.resume = true;
	q.accum = 2;
	dg_train_result res;
	q.result = &res;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_expect(strstr(msg, "accum") && strstr(msg, "--accum") && strstr(msg, "3") && strstr(msg, "2"), "%s",
		  msg);
	cr_expect(res.resume_refused);
	q.result = NULL;
	q.accum = 3;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	char *la = dg_test_log_untimed(a, NULL), *lb = dg_test_log_untimed(b, NULL);
	cr_expect_str_eq(lb, la, "a resumed run with accum logged other numbers");
	dg_train_state *sa = dg_test_checkpoint_at(a, 4), *sb = dg_test_checkpoint_at(b, 4);
	cr_expect_eq(sb->accum, 3);
	dg_test_expect_same_state(sa, sb);
	dg_train_state_destroy(sa);
	dg_train_state_destroy(sb);
	free(la), free(lb);

	/* allowed on purpose: noted in the log's next line */
	snprintf(b, sizeof(b), "%s/changed", dg_test_tmpdir());
	dg_train_opts r = tiny(b, 2, 3, 4);
	r.stop_at = 2;
	cr_assert_eq(dg_train_run(&r, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	r.stop_at = 0;
	r.resume = true;
	r.allow_changed = true;
	r.accum = 1;
	cr_assert_eq(dg_train_run(&r, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	char *lc = dg_test_log_untimed(b, NULL);
	cr_expect(strstr(lc, "\"changed\": {\"accum\": {\"from\": 3, \"to\": 1}}"), "%s", lc);
	free(lc);
	dg_corpus_close(c);
}

Test(train_accum, bad_accum_is_refused_by_name)
{
	char d[512], msg[512];
	snprintf(d, sizeof(d), "%s/bad", dg_test_tmpdir());
	dg_corpus *c = corpus_of(6000);
	const int bad[2] = { -1, DG_TRAIN_MAX_ACCUM + 1 };
	for (int i = 0; i < 2; i++) {
		dg_train_opts o = tiny(d, 2, bad[i], 2);
		cr_assert_eq(dg_train_run(&o, c, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG, "accum %d",
			     bad[i]);
		cr_expect(strstr(msg, "accum"), "%s", msg);
	}
	dg_corpus_close(c);
}
