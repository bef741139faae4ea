/*
 * Training on the GPU (runtime/train/gpu_train.c: dragon/model.h "training
 * on the GPU"), each check bit for bit:
 *   - the device's step (its update and execution copies on the device)
 *     is the host's baseline — the model's gradients read back, AdamW on
 *     the host (dg_adamw_step), the masters uploaded (dg_model_set_weights)
 *     — with clip 0 (the clip factor then 1 on both sides; with a clip the
 *     device's norm sums in another order): the losses of three steps, and
 *     after them the masters and both moments, for f32 at the tiny config
 *     and bf16 and w8a8 at a small one;
 *   - a run replaying the captured graph logs the same losses and norms as
 *     one run eagerly, and ends with the same masters, clip on (1.0);
 *   - a run stopped after 3 of 6 steps (its masters and moments read back)
 *     and resumed into a new model gives steps 4 to 6 as the straight run;
 *   - the clip: the device's norm within 1e-12 of the host's double sum;
 *   - bad calls: a step before dg_model_optim_init, a result of a step not
 *     queued, refused by name;
 *   - the loss scaler: at S 2^16 the f32 run is the unscaled one bit for
 *     bit (losses, norms, masters); from 2^127 with an inflated lm_head
 *     the first steps overflow and are skipped (masters untouched, S
 *     halved by dg_ref_loss_scale_update's rule) until S fits, and then
 *     the run trains.
 * Skips without a device.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/optim.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

/* The tiny model, or (small) a small one: embd 64, 256 neurons. */
static dg_model_config config(const char *preset, bool small)
{
	return dg_test_model(preset, 2, small ? 64 : 32, 2, small ? 256 : 64);
}

enum { B = 2, T = 16, STEPS = 6 };

struct batch {
	int32_t idx[B * T], tgt[B * T];
	dg_model_batch b;
};

/* Step t's batch (the same on every side). */
static void batch_of(struct batch *bt, int64_t t)
{
	gh_seed(100 + (uint64_t)t);
	for (int i = 0; i < B * T; i++) {
		bt->idx[i] = gh_int(0, 255);
		bt->tgt[i] = gh_int(0, 255);
	}
	bt->b = (dg_model_batch){ .idx = bt->idx, .targets = bt->tgt, .b = B, .t = T, .seed = 77,
				  .step = (uint32_t)t, .train = true };
}

static int64_t numel(const dg_model_config *c, int p)
{
	int nd;
	int64_t sh[3];
	return dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
}

/* Host moments of c, zeroed: m[p], v[p]. */
static void moments(const dg_model_config *c, float **m, float **v)
{
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		m[p] = calloc((size_t)numel(c, p), sizeof(float));
		v[p] = calloc((size_t)numel(c, p), sizeof(float));
		cr_assert(m[p] && v[p]);
	}
}

static void free_moments(float **m, float **v)
{
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		free(m[p]), free(v[p]);
}

static void same_floats(const char *what, const char *name, const float *a, const float *b, int64_t n)
{
	int64_t bad = 0, first = -1;
	for (int64_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && bad++ == 0)
			first = i;
	cr_expect_eq(bad, 0, "%s %s: %lld of %lld differ, first [%lld] %.9g vs %.9g", what, name,
		     (long long)bad, (long long)n, (long long)first, first >= 0 ? (double)a[first] : 0.0,
		     first >= 0 ? (double)b[first] : 0.0);
}

static void device_is_host(const char *preset, bool small)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config(preset, small);
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, 3);
	opt.clip = 0.0f;
	opt.warmup = 1;
	dg_model_weights *w = NULL, *grads = NULL, *got = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 5, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 0, &grads, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(&c, 0, &got, msg, sizeof(msg)), DG_OK);
	dg_model *mh = NULL, *md = NULL;
	cr_assert_eq(dg_model_create(dev, w, B, T, &mh), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	cr_assert_eq(dg_model_create(dev, w, B, T, &md), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(md, &opt, NULL, NULL, false, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	float *m1[DG_MODEL_N_PARAMS], *v1[DG_MODEL_N_PARAMS], *dm[DG_MODEL_N_PARAMS], *dv[DG_MODEL_N_PARAMS];
	moments(&c, m1, v1);
	moments(&c, dm, dv);
	for (int64_t t = 0; t < 3; t++) {
		struct batch bt;
		batch_of(&bt, t);
		double lh, ld, nd;
		cr_assert_eq(dg_model_step(mh, &bt.b, &lh, grads), DG_OK, "%s", dg_device_errmsg(dev));
		float lr = dg_adamw_lr(&opt, t);
		for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
			dg_adamw_step(&opt, t, lr, 1.0f, true, w->params[p], grads->params[p], m1[p], v1[p],
				      (size_t)numel(&c, p));
		cr_assert_eq(dg_model_set_weights(mh, w), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_model_train_step(md, &bt.b, t, lr), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_model_train_result(md, t, &ld, &nd, NULL, NULL), DG_OK, "%s", dg_device_errmsg(dev));
		printf("gpu_train %s step %lld: host loss %.9g, device %.9g (norm %.6g)\n", preset,
		       (long long)t, lh, ld, nd);
		cr_expect_eq(memcmp(&lh, &ld, sizeof(double)), 0, "%s step %lld: loss %.9g vs %.9g", preset,
			     (long long)t, lh, ld);
	}
	cr_assert_eq(dg_model_optim_get(md, got, dm, dv), DG_OK, "%s", dg_device_errmsg(dev));
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		const char *nm = dg_model_param_name((dg_model_param)p);
		same_floats(preset, nm, got->params[p], w->params[p], numel(&c, p));
		same_floats("adamw.m", nm, dm[p], m1[p], numel(&c, p));
		same_floats("adamw.v", nm, dv[p], v1[p], numel(&c, p));
	}
	free_moments(m1, v1);
	free_moments(dm, dv);
	dg_model_destroy(mh);
	dg_model_destroy(md);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(grads);
	dg_model_weights_destroy(got);
	gh_close(dev);
}

Test(gpu_train, device_step_is_the_hosts_f32)
{
	device_is_host("f32", false);
}

Test(gpu_train, device_step_is_the_hosts_bf16)
{
	device_is_host("bf16", true);
}

Test(gpu_train, device_step_is_the_hosts_w8a8)
{
	device_is_host("w8a8", true);
}

/* STEPS steps of w from t0 (moments m, v or zeros) on a new model; the
 * losses and norms into loss[t], norm[t]; the state back into w, m, v. */
static void train(dg_device *dev, dg_model_weights *w, float **m, float **v, bool fresh, int64_t t0,
		  int64_t t1, bool graph, double *loss, double *norm, bool *live)
{
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, STEPS);
	opt.warmup = 2;
	dg_model *md = NULL;
	cr_assert_eq(dg_model_create(dev, w, B, T, &md), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(md, &opt, fresh ? NULL : m, fresh ? NULL : v, graph, NULL), DG_OK, "%s",
		     dg_device_errmsg(dev));
	/* queued one ahead, as the trainer does */
	for (int64_t t = t0; t < t1; t++) {
		struct batch bt;
		batch_of(&bt, t);
		cr_assert_eq(dg_model_train_step(md, &bt.b, t, dg_adamw_lr(&opt, t)), DG_OK, "%s",
			     dg_device_errmsg(dev));
		if (t > t0)
			cr_assert_eq(dg_model_train_result(md, t - 1, &loss[t - 1], &norm[t - 1], NULL, NULL), DG_OK,
				     "%s", dg_device_errmsg(dev));
	}
	cr_assert_eq(dg_model_train_result(md, t1 - 1, &loss[t1 - 1], &norm[t1 - 1], NULL, NULL), DG_OK, "%s",
		     dg_device_errmsg(dev));
	if (live)
		*live = dg_model_graph_live(md);
	cr_assert_eq(dg_model_optim_get(md, w, m, v), DG_OK, "%s", dg_device_errmsg(dev));
	dg_model_destroy(md);
}

static void graph_and_resume(const char *preset, bool small)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config(preset, small);
	dg_model_weights *wg = NULL, *we = NULL, *wr = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 9, &wg, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 9, &we, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(&c, 9, &wr, msg, sizeof(msg)), DG_OK);
	float *mg[DG_MODEL_N_PARAMS], *vg[DG_MODEL_N_PARAMS], *me[DG_MODEL_N_PARAMS], *ve[DG_MODEL_N_PARAMS];
	float *mr[DG_MODEL_N_PARAMS], *vr[DG_MODEL_N_PARAMS];
	moments(&c, mg, vg);
	moments(&c, me, ve);
	moments(&c, mr, vr);
	double lg[STEPS], ng[STEPS], le[STEPS], ne[STEPS], lr[STEPS], nr[STEPS];
	bool live = false, live2 = true;
	train(dev, wg, mg, vg, true, 0, STEPS, true, lg, ng, &live);
	train(dev, we, me, ve, true, 0, STEPS, false, le, ne, &live2);
	cr_expect(live, "%s: the graph run does not replay a graph", preset);
	cr_expect_not(live2, "%s: the eager run replays a graph", preset);
	/* stopped after 3, resumed into a new model */
	train(dev, wr, mr, vr, true, 0, 3, true, lr, nr, NULL);
	train(dev, wr, mr, vr, false, 3, STEPS, true, lr, nr, NULL);
	for (int t = 0; t < STEPS; t++) {
		printf("gpu_train %s step %d: graph %.9g (norm %.9g), eager %.9g, resumed %.9g\n", preset, t,
		       lg[t], ng[t], le[t], lr[t]);
		cr_expect_eq(memcmp(&lg[t], &le[t], sizeof(double)), 0, "%s step %d: graph %.9g, eager %.9g",
			     preset, t, lg[t], le[t]);
		cr_expect_eq(memcmp(&ng[t], &ne[t], sizeof(double)), 0, "%s step %d: norm %.17g vs %.17g",
			     preset, t, ng[t], ne[t]);
		cr_expect_eq(memcmp(&lg[t], &lr[t], sizeof(double)), 0, "%s step %d: straight %.9g, resumed %.9g",
			     preset, t, lg[t], lr[t]);
	}
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		const char *nm = dg_model_param_name((dg_model_param)p);
		same_floats("eager", nm, we->params[p], wg->params[p], numel(&c, p));
		same_floats("resumed", nm, wr->params[p], wg->params[p], numel(&c, p));
		same_floats("resumed adamw.v", nm, vr[p], vg[p], numel(&c, p));
	}
	free_moments(mg, vg);
	free_moments(me, ve);
	free_moments(mr, vr);
	dg_model_weights_destroy(wg);
	dg_model_weights_destroy(we);
	dg_model_weights_destroy(wr);
	gh_close(dev);
}

Test(gpu_train, graph_is_eager_and_resume_is_straight_f32)
{
	graph_and_resume("f32", false);
}

Test(gpu_train, graph_is_eager_and_resume_is_straight_bitnet)
{
	graph_and_resume("bitnet", true);
}

Test(gpu_train, the_clip_norm_is_the_hosts)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config("f32", false);
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, 2);
	dg_model_weights *w = NULL, *grads = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 3, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 0, &grads, msg, sizeof(msg)), DG_OK);
	dg_model *m = NULL;
	cr_assert_eq(dg_model_create(dev, w, B, T, &m), DG_OK, "%s", dg_device_errmsg(dev));
	struct batch bt;
	batch_of(&bt, 0);
	double lh, ld, nd;
	cr_assert_eq(dg_model_step(m, &bt.b, &lh, grads), DG_OK, "%s", dg_device_errmsg(dev));
	double sq = 0;
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		sq += dg_adamw_sq_sum(grads->params[p], (size_t)numel(&c, p));
	/* bad calls first: no optimizer yet, then a step never queued */
	cr_assert_eq(dg_model_train_step(m, &bt.b, 0, 1e-3f), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "dg_model_optim_init"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(m, &opt, NULL, NULL, true, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_train_result(m, 0, &ld, &nd, NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_model_train_step(m, &bt.b, 0, dg_adamw_lr(&opt, 0)), DG_OK, "%s",
		     dg_device_errmsg(dev));
	bool skipped = true;
	cr_assert_eq(dg_model_train_result(m, 0, &ld, &nd, &skipped, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	printf("gpu_train clip: host norm %.17g, device %.17g\n", sqrt(sq), nd);
	cr_expect_eq(memcmp(&lh, &ld, sizeof(double)), 0, "loss %.9g vs %.9g", lh, ld);
	cr_expect(fabs(nd - sqrt(sq)) <= 1e-12 * sqrt(sq), "norm %.17g vs %.17g", nd, sqrt(sq));
	cr_expect_not(skipped);
	cr_assert_eq(dg_model_train_result(m, 9, &ld, &nd, NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "step 9"), "%s", dg_device_errmsg(dev));
	dg_model_destroy(m);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(grads);
	gh_close(dev);
}

/* ---- the loss scaler ---------------------------------------------------------- */

/* STEPS steps of w (fresh moments, the graph replayed) with the loss
 * scaler ls (NULL: none), each step's results read back before the next;
 * the masters back into w. */
static void train_ls(dg_device *dev, dg_model_weights *w, const dg_loss_scaler *ls, double *loss,
		     double *norm, bool *skipped, dg_loss_scaler *after)
{
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, STEPS);
	opt.warmup = 2;
	dg_model *md = NULL;
	cr_assert_eq(dg_model_create(dev, w, B, T, &md), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(md, &opt, NULL, NULL, true, ls), DG_OK, "%s", dg_device_errmsg(dev));
	for (int64_t t = 0; t < STEPS; t++) {
		struct batch bt;
		batch_of(&bt, t);
		cr_assert_eq(dg_model_train_step(md, &bt.b, t, dg_adamw_lr(&opt, t)), DG_OK, "%s",
			     dg_device_errmsg(dev));
		cr_assert_eq(dg_model_train_result(md, t, &loss[t], &norm[t], &skipped[t], &after[t]), DG_OK,
			     "%s", dg_device_errmsg(dev));
	}
	cr_assert_eq(dg_model_optim_get(md, w, NULL, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	dg_model_destroy(md);
}

/* S = 2^16 is a power of two and nothing overflows: the scaled run's
 * losses, norms (reported unscaled) and final masters are the unscaled
 * run's bit for bit, and S stays while the count of good steps grows. */
Test(gpu_train, loss_scale_2p16_is_the_unscaled_run_f32)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config("f32", false);
	dg_model_weights *wa = NULL, *wb = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 9, &wa, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 9, &wb, msg, sizeof(msg)), DG_OK, "%s", msg);
	double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS];
	bool sa[STEPS], sb[STEPS];
	dg_loss_scaler aa[STEPS], ab[STEPS], ls;
	dg_loss_scaler_defaults(&ls, true);
	train_ls(dev, wa, NULL, la, na, sa, aa);
	train_ls(dev, wb, &ls, lb, nb, sb, ab);
	for (int t = 0; t < STEPS; t++) {
		printf("gpu_train loss_scale step %d: loss %.9g / %.9g, norm %.9g / %.9g, S %g\n", t, la[t],
		       lb[t], na[t], nb[t], (double)ab[t].scale);
		cr_expect_eq(memcmp(&la[t], &lb[t], sizeof(double)), 0, "step %d: loss %.9g, scaled %.9g", t,
			     la[t], lb[t]);
		cr_expect_eq(memcmp(&na[t], &nb[t], sizeof(double)), 0, "step %d: norm %.17g, scaled %.17g", t,
			     na[t], nb[t]);
		cr_expect(!sa[t] && !sb[t], "step %d skipped", t);
		cr_expect_eq(aa[t].mode, DG_LOSS_SCALE_OFF);
		cr_expect_eq(aa[t].scale, 1.0f, "step %d: S %g without a scaler", t, (double)aa[t].scale);
		cr_expect_eq(ab[t].mode, DG_LOSS_SCALE_DYNAMIC);
		cr_expect_eq(ab[t].scale, 65536.0f, "step %d: S %g", t, (double)ab[t].scale);
		cr_expect_eq(ab[t].good_steps, (uint32_t)t + 1, "step %d: good %u", t, ab[t].good_steps);
	}
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
		same_floats("scaled", dg_model_param_name((dg_model_param)p), wb->params[p], wa->params[p],
			    numel(&c, p));
	dg_model_weights_destroy(wa);
	dg_model_weights_destroy(wb);
	gh_close(dev);
}

/*
 * Overflow: the tiny model's gradients are all below 1 (0.19 at most, on
 * the CPU model), so no f32 power of two overflows them; with lm_head
 * times 1024 they reach about 2^8 (the loss stays finite, about 340), and
 * from S = 2^127 the scaled gradients overflow f32. The steps are skipped,
 * S halving each time (the reference's rule, step by step), the masters
 * untouched, until S is small enough (about 2^120); then training
 * proceeds: a step that is not skipped moves the masters. The loss, which
 * S does not touch, is finite throughout, and a step is skipped exactly
 * when its norm is not finite.
 */
Test(gpu_train, loss_scale_overflow_skips_until_the_scale_fits_f32)
{
	enum { N = 24 };
	dg_device *dev = gh_open();
	char msg[512];
	dg_model_config c = config("f32", false);
	dg_model_weights *w = NULL, *prev = NULL;
	cr_assert_eq(dg_model_weights_create(&c, 9, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, 9, &prev, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int k = 0; k < 2; k++) {
		dg_model_weights *x = k ? prev : w;
		for (int64_t i = 0; i < numel(&c, DG_PARAM_LM_HEAD); i++)
			x->params[DG_PARAM_LM_HEAD][i] *= 1024.0f;
	}
	dg_adamw_config opt;
	dg_adamw_defaults(&opt, N);
	opt.warmup = 2;
	dg_loss_scaler ls = { .mode = DG_LOSS_SCALE_DYNAMIC, .growth_interval = 2000, .scale = 0x1p127f,
			      .good_steps = 0 };
	dg_loss_scaler ref = ls;
	dg_model *md = NULL;
	cr_assert_eq(dg_model_create(dev, w, B, T, &md), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_model_optim_init(md, &opt, NULL, NULL, true, &ls), DG_OK, "%s", dg_device_errmsg(dev));
	int first_ok = -1, skips = 0;
	for (int64_t t = 0; t < N; t++) {
		struct batch bt;
		batch_of(&bt, t);
		cr_assert_eq(dg_model_train_step(md, &bt.b, t, dg_adamw_lr(&opt, t)), DG_OK, "%s",
			     dg_device_errmsg(dev));
		double loss, norm;
		bool sk = false;
		dg_loss_scaler after;
		cr_assert_eq(dg_model_train_result(md, t, &loss, &norm, &sk, &after), DG_OK, "%s",
			     dg_device_errmsg(dev));
		printf("gpu_train overflow step %lld: loss %.9g, norm %g, %s, S after %g\n", (long long)t, loss,
		       norm, sk ? "skipped" : "stepped", (double)after.scale);
		cr_assert(isfinite(loss), "step %lld: loss %g", (long long)t, loss);
		cr_assert_eq(sk, !isfinite(norm), "step %lld: skipped %d with norm %g", (long long)t, sk, norm);
		dg_ref_loss_scale_update(&ref, !sk);
		cr_assert_eq(after.scale, ref.scale, "step %lld: S %g, the rule's %g", (long long)t,
			     (double)after.scale, (double)ref.scale);
		cr_assert_eq(after.good_steps, ref.good_steps, "step %lld: good %u, the rule's %u", (long long)t,
			     after.good_steps, ref.good_steps);
		cr_assert_eq(dg_model_optim_get(md, w, NULL, NULL), DG_OK, "%s", dg_device_errmsg(dev));
		bool moved = false;
		for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
			size_t bytes = (size_t)numel(&c, p) * sizeof(float);
			moved = moved || memcmp(w->params[p], prev->params[p], bytes) != 0;
			if (sk)
				same_floats("a skipped step", dg_model_param_name((dg_model_param)p), w->params[p],
					    prev->params[p], numel(&c, p));
			memcpy(prev->params[p], w->params[p], bytes);
		}
		if (!sk)
			cr_expect(moved, "step %lld was not skipped but moved no master", (long long)t);
		if (sk)
			skips++;
		else if (first_ok < 0)
			first_ok = (int)t;
	}
	/* first_ok > 0: step 0 was skipped; < N: a step was then taken */
	cr_expect(first_ok > 0 && first_ok < N,
		  "the first steps should skip and then training proceed: the first step taken is %d of %d "
		  "(%d skipped)", first_ok, N, skips);
	dg_model_destroy(md);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(prev);
	gh_close(dev);
}
