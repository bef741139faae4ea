/*
 * Gradient accumulation on the GPU (runtime/train/gpu_train.c,
 * dg_model_create_accum and dg_model_train_step's batch->micro):
 *   - K micro-batches of b rows make the step of one batch of K·b rows:
 *     a model of (K·b, T) stepping the whole batch against a model of
 *     (b, T) accumulating K micro-batches (micro-batch i the rows i·b..,
 *     row0 i·b: the same dropout masks), three steps, the second model
 *     replaying its per-micro-batch graphs from step 2 on: the losses and
 *     gradient norms within 1e-5 relative (a 1/K scale left out or applied
 *     twice moves the norm by K), and the masters after within 1e-5 of
 *     each other (a hundredth of a step at lr 1e-3); the first micro-batch
 *     alone (the model of b rows at accum 1) is shown to be far outside
 *     both, so the tolerance can fail. f32 at the tiny config, and bf16
 *     and w8a8 at a small one (their weight-gradient GEMMs add on the
 *     tensor-core paths);
 *   - bad calls: a micro-batch out of order (batch->micro) or of another
 *     step, the loss scaler with accum > 1, accum 0: each refused by name.
 * Skips without a device.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/optim.h"
#include "gpu_helpers.h"
#include "helpers.h"

enum { MB = 2, K = 2, T = 16, STEPS = 3 };

/* The tiny model, or (small) a small one: embd 64, 256 neurons. */
static dg_model_config config(const char *preset, bool small)
{
	return dg_test_model(preset, 2, small ? 64 : 32, 2, small ? 256 : 64);
}

/* Step t's K·b rows (the same on every side). */
static void rows_of(int32_t *idx, int32_t *tgt, int64_t t)
{
	gh_seed(300 + (uint64_t)t);
	for (int i = 0; i < K * MB * T; i++) {
		idx[i] = gh_int(0, 255);
		tgt[i] = gh_int(0, 255);
	}
}

static int64_t numel(const dg_model_config *c, int p)
{
	int nd;
	int64_t sh[3];
	return dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
}

static double rel(double a, double b)
{
	return fabs(a - b) / fmax(fmax(fabs(a), fabs(b)), 1e-30);
}

/* STEPS steps from w's weights: rows b a model (accum k, k micro-batches
 * a step; k 1 and b K·b: the whole batch; k 1 and b MB: the first
 * micro-batch alone); losses, norms and the masters after. */
static void train(dg_device *dev, const dg_model_weights *w, int b, int k, double *loss, double *norm,
		  dg_model_weights *out, bool *live)
{
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, STEPS);
	opt.warmup = 1;
	dg_model *m = NULL;
	cr_assert_eq(dg_model_create_accum(dev, w, b, T, k, &m), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(m, &opt, NULL, NULL, true, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	int32_t idx[K * MB * T], tgt[K * MB * T];
	for (int64_t t = 0; t < STEPS; t++) {
		rows_of(idx, tgt, t);
		const float lr = dg_adamw_lr(&opt, t);
		for (int i = 0; i < k; i++) {
			dg_model_batch bt = { .idx = idx + i * b * T, .targets = tgt + i * b * T, .b = b, .t = T,
					      .seed = 91, .train = true, .row0 = (uint32_t)(i * b), .micro = i };
			cr_assert_eq(dg_model_train_step(m, &bt, t, lr), DG_OK, "step %lld micro %d: %s",
				     (long long)t, i, dg_device_errmsg(dev));
		}
		cr_assert_eq(dg_model_train_result(m, t, &loss[t], &norm[t], NULL, NULL), DG_OK, "%s",
			     dg_device_errmsg(dev));
	}
	if (live)
		*live = dg_model_graph_live(m);
	cr_assert_eq(dg_model_optim_get(m, out, NULL, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	dg_model_destroy(m);
}

static double masters_apart(const dg_model_config *c, const dg_model_weights *a, const dg_model_weights *b)
{
	double worst = 0;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		for (int64_t i = 0; i < numel(c, p); i++) {
			double d = fabs((double)a->params[p][i] - (double)b->params[p][i]);
			if (d > worst || isnan(d))
				worst = isnan(d) ? INFINITY : d;
		}
	return worst;
}

static void accum_is_the_larger_batch(const char *preset, bool small)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config(preset, small);
	dg_model_weights *w = NULL, *wb = NULL, *wa = NULL, *wp = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 13, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 0, &wb, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(&c, 0, &wa, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(&c, 0, &wp, msg, sizeof(msg)), DG_OK);
	double lb[STEPS], nb[STEPS], la[STEPS], na[STEPS], lp[STEPS], np[STEPS];
	bool live = false;
	train(dev, w, K * MB, 1, lb, nb, wb, NULL);
	train(dev, w, MB, K, la, na, wa, &live);
	train(dev, w, MB, 1, lp, np, wp, NULL);
	cr_expect(live, "%s: the accumulating run does not replay its graphs", preset);
	for (int t = 0; t < STEPS; t++) {
		printf("gpu_train_accum %s step %d: K·b batch loss %.9g norm %.9g; K %d of b %d loss %.9g norm "
		       "%.9g; the first micro-batch alone %.9g norm %.9g\n",
		       preset, t, lb[t], nb[t], K, MB, la[t], na[t], lp[t], np[t]);
		cr_expect_lt(rel(la[t], lb[t]), 1e-5, "%s step %d: loss %.9g, the larger batch's %.9g", preset, t,
			     la[t], lb[t]);
		cr_expect_lt(rel(na[t], nb[t]), 1e-5, "%s step %d: norm %.9g, the larger batch's %.9g", preset, t,
			     na[t], nb[t]);
		cr_expect_gt(rel(lp[t], lb[t]) + rel(np[t], nb[t]), 1e-3,
			     "%s step %d: the first micro-batch alone logs the whole batch's", preset, t);
	}
	double da = masters_apart(&c, wb, wa), dp = masters_apart(&c, wb, wp);
	printf("gpu_train_accum %s: masters apart from the K·b batch's: accumulated %.3g, half batch %.3g\n",
	       preset, da, dp);
	cr_expect_lt(da, 1e-5, "%s: the accumulated step's masters are %.3g apart", preset, da);
	cr_expect_gt(dp, 1e-4, "%s: the half batch's masters only %.3g apart: the tolerance cannot fail", preset,
		     dp);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(wb);
	dg_model_weights_destroy(wa);
	dg_model_weights_destroy(wp);
	gh_close(dev);
}

Test(gpu_train_accum, k_micro_batches_are_the_k_times_larger_batch_f32)
{
	accum_is_the_larger_batch("f32", false);
}

Test(gpu_train_accum, k_micro_batches_are_the_k_times_larger_batch_bf16)
{
	accum_is_the_larger_batch("bf16", true);
}

Test(gpu_train_accum, k_micro_batches_are_the_k_times_larger_batch_w8a8)
{
	accum_is_the_larger_batch("w8a8", true);
}

Test(gpu_train_accum, bad_calls_are_refused_by_name)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config("f32", false);
	dg_model_weights *w = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 13, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model *m = NULL;
	cr_assert_eq(dg_model_create_accum(dev, w, MB, T, 0, &m), DG_ERR_INVALID_ARG);
	cr_expect(strstr(dg_device_errmsg(dev), "accum 0"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_create_accum(dev, w, MB, T, K, &m), DG_OK, "%s", dg_device_errmsg(dev));
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, STEPS);
	dg_loss_scaler ls;
	dg_loss_scaler_defaults(&ls, true);
	cr_assert_eq(dg_model_optim_init(m, &opt, NULL, NULL, false, &ls), DG_ERR_UNSUPPORTED);
	cr_expect(strstr(dg_device_errmsg(dev), "loss scaler") && strstr(dg_device_errmsg(dev), "accum 2"), "%s",
		  dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(m, &opt, NULL, NULL, false, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	int32_t idx[K * MB * T], tgt[K * MB * T];
	rows_of(idx, tgt, 0);
	dg_model_batch bt = { .idx = idx, .targets = tgt, .b = MB, .t = T, .seed = 1, .train = true };
	bt.micro = 1;
	cr_assert_eq(dg_model_train_step(m, &bt, 0, 1e-3f), DG_ERR_INVALID_ARG);
	cr_expect(strstr(dg_device_errmsg(dev), "micro-batch 1 of step 0: the next is micro-batch 0"), "%s",
		  dg_device_errmsg(dev));
	bt.micro = 0;
	cr_assert_eq(dg_model_train_step(m, &bt, 0, 1e-3f), DG_OK, "%s", dg_device_errmsg(dev));
	bt.micro = 1;
	cr_assert_eq(dg_model_train_step(m, &bt, 1, 1e-3f), DG_ERR_INVALID_ARG);
	cr_expect(strstr(dg_device_errmsg(dev), "of another step"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_train_step(m, &bt, 0, 1e-3f), DG_OK, "%s", dg_device_errmsg(dev));
	double loss, norm;
	cr_assert_eq(dg_model_train_result(m, 0, &loss, &norm, NULL, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	cr_expect(isfinite(loss) && isfinite(norm));
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	gh_close(dev);
}
