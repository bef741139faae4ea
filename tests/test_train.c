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
 *     corpus too short for a row are refused; a learning rate that makes
 *     the loss blow up stops the run naming the step, the last checkpoint
 *     kept.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dragon/checkpoint.h"
#include "dragon/train.h"
#include "helpers.h"

static dg_corpus *corpus_of(size_t n)
{
	static const char text[] = "To be, or not to be, that is the question: whether 'tis nobler in the mind "
				   "to suffer the slings and arrows of outrageous fortune. ";
	char path[512], msg[256];
	snprintf(path, sizeof(path), "%s/text.txt", dg_test_tmpdir());
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fputc(text[i % (sizeof(text) - 1)], f);
	fclose(f);
	dg_corpus *c;
	cr_assert_eq(dg_corpus_open(path, &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	return c;
}

static dg_train_opts tiny(const char *dir, int64_t steps)
{
	dg_train_opts o;
	dg_train_defaults(&o, steps);
	char msg[256];
	cr_assert_eq(dg_model_preset("f32", &o.model, msg, sizeof(msg)), DG_OK);
	o.model.layers = 2;
	o.model.embd = 32;
	o.model.heads = 2;
	o.model.neurons = 64;
	o.batch = 2;
	o.time = 16;
	o.opt.lr = 3e-3f;
	o.opt.warmup = 2;
	o.eval_every = 4;
	o.eval_batches = 2;
	o.ckpt_every = 3;
	o.keep = 2;
	o.out_dir = dir;
	o.seed = 5;
	return o;
}

/* The log's lines without the timing fields (tokens_per_s, wall_s). */
static char *log_of(const char *dir, int *lines)
{
	char path[600], line[1024];
	snprintf(path, sizeof(path), "%s/log.jsonl", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	size_t cap = 1 << 16, n = 0;
	char *out = calloc(cap, 1);
	*lines = 0;
	while (fgets(line, sizeof(line), f)) {
		char *cut = strstr(line, ", \"tokens_per_s\"");
		cr_assert_not_null(cut, "%s", line);
		*cut = '\0';
		n += (size_t)snprintf(out + n, cap - n, "%s\n", line);
		(*lines)++;
	}
	fclose(f);
	return out;
}

static dg_train_state *newest(const char *dir)
{
	int64_t latest;
	char msg[512], path[600];
	cr_assert_eq(dg_checkpoint_prune(dir, 0, &latest, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_geq(latest, 0);
	dg_checkpoint_path(dir, latest, path, sizeof(path));
	dg_train_state *s;
	cr_assert_eq(dg_checkpoint_load(path, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	return s;
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
	char *la = log_of(a, &na);
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
	free(log_of(b, &nb));
	cr_assert_eq(nb, 7);
	q.stop_at = 0;
	q.resume = true;
	cr_assert_eq(dg_train_run(&q, c, NULL, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	char *lb = log_of(b, &nb);
	cr_assert_str_eq(lb, la, "a resumed run logged other numbers");
	dg_train_state *sa = newest(a), *sb = newest(b);
	cr_assert_eq(sa->step, 12);
	cr_assert_eq(sb->step, 12);
	cr_assert_eq(sa->data_rng.state, sb->data_rng.state);
	for (int k = 0; k < DG_MODEL_N_PARAMS; k++) {
		int nd;
		int64_t sh[3];
		size_t n = (size_t)dg_model_param_shape(&sa->weights->config, (dg_model_param)k, &nd, sh) * 4;
		cr_assert_eq(memcmp(sa->weights->params[k], sb->weights->params[k], n), 0, "weights %d", k);
		cr_assert_eq(memcmp(sa->m[k], sb->m[k], n), 0, "m %d", k);
	}
	dg_train_state_destroy(sa);
	dg_train_state_destroy(sb);
	free(la), free(lb);
	dg_corpus_destroy(c);
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
	/* too short a corpus */
	dg_corpus *s = corpus_of(100);
	dg_train_opts t = tiny(d, 6);
	cr_assert_eq(dg_train_run(&t, s, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "validation split"), "%s", msg);
	dg_corpus_destroy(s);
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
	dg_corpus_destroy(c);
}
