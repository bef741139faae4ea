/*
 * The model's forward and backward as two calls (dragon/ffi.h
 * dg_ffi_model_forward, dg_ffi_model_backward, dg_ffi_model_hidden; under
 * them runtime/train/model_int.h dg_model_cpu_forward ... and dg_model_run_backward),
 * what a framework's autograd runs:
 *   - on the CPU, forward then backward is dg_model_cpu_step bit for bit
 *     (f32 and w8a8, dropout on), at the model's (B, T) and at another;
 *   - the last hidden state times lm_head is dg_model_cpu_logits, with
 *     and without targets;
 *   - a backward with no forward, twice, after a forward without targets
 *     or after dg_ffi_model_run is refused saying why;
 *   - on a GPU, forward then backward is dg_model_step (f32, w8a8),
 *     a padded batch (targets outside the vocabulary) adds nothing but
 *     rows to the mean, and a forward without targets is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/dragon.h"
#include "dragon/ffi.h"
#include "gpu_helpers.h"
#include "runtime/train/model_int.h"

#define SIZES (&(dg_ffi_model_sizes){ .layers = 2, .embd = 32, .heads = 2, .neurons = 64, .vocab = 0, .dropout = 0.1f })
#define U64(p) ((uint64_t)(uintptr_t)(p))

static void tokens(int32_t *idx, int32_t *tgt, int n, int vocab, int salt)
{
	for (int i = 0; i < n; i++) {
		idx[i] = (i * 37 + salt * 11 + 5) % vocab;
		tgt[i] = (i * 53 + salt * 7 + 1) % vocab;
	}
}

static float *param_ptr(dg_ffi_model *m, int p, bool grad)
{
	uint64_t mp = 0, gp = 0;
	cr_assert_eq(dg_ffi_model_param(m, p, NULL, NULL, NULL, &mp, &gp), DG_OK);
	return (float *)(uintptr_t)(grad ? gp : mp);
}

static int64_t param_size(const dg_model_config *c, int p)
{
	int nd;
	int64_t sh[3];
	return dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
}

/* forward + backward through the door at (b, t) against dg_model_cpu_step
 * of the model's own masters (dropout on: the seed and step reach it). */
static void cpu_case(const char *preset, int b, int t)
{
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(NULL, preset, SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	dg_model_weights *w, *g;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(c, 7, &g, msg, sizeof(msg)), DG_OK);
	for (int p = 0; p < 5; p++) /* masters the caller changed: the forward reads them */
		for (int64_t i = 0; i < param_size(c, p); i++)
			param_ptr(m, p, false)[i] = w->params[p][i] = w->params[p][i] * 20.0f;
	int32_t *idx = malloc((size_t)b * t * 4), *tgt = malloc((size_t)b * t * 4);
	tokens(idx, tgt, b * t, 256, b + t);
	cr_assert_eq(dg_ffi_model_forward(m, U64(idx), U64(tgt), b, t, 0, 9, 4, 1, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	memset(idx, 0xff, (size_t)b * t * 4); /* the pass keeps its own copies */
	memset(tgt, 0xff, (size_t)b * t * 4);
	float got = *(float *)(uintptr_t)dg_ffi_model_loss(m);
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_OK, "%s", msg);
	tokens(idx, tgt, b * t, 256, b + t);
	dg_model_batch bt = { .idx = idx, .targets = tgt, .b = b, .t = t, .seed = 9, .step = 4, .train = true };
	double want;
	cr_assert_eq(dg_model_cpu_step(w, &bt, &want, g, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(got, (float)want, "%s %dx%d: loss %.9g, want %.9g", preset, b, t, got, want);
	for (int p = 0; p < 5; p++)
		cr_assert_eq(memcmp(param_ptr(m, p, true), g->params[p], (size_t)param_size(c, p) * 4), 0,
			     "%s %dx%d: %s's gradient", preset, b, t, dg_model_param_name((dg_model_param)p));
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "has run already"), "%s", msg);
	free(idx);
	free(tgt);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg_ffi_model_destroy(m);
}

Test(ffi_pass, cpu_forward_then_backward_is_the_step)
{
	cpu_case("f32", 2, 8);
	cpu_case("w8a8", 2, 8);
	cpu_case("f32", 3, 5);   /* another (B, T) than the model's: the CPU runs any */
	cpu_case("bitnet", 1, 11);
}

/* x_final · lm_head at each position is dg_model_cpu_logits's row, with
 * targets or without (then no loss and no backward). */
Test(ffi_pass, cpu_hidden_state_gives_the_logits)
{
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	uint64_t addr;
	cr_assert_eq(dg_ffi_model_hidden(m, &addr, NULL, NULL), DG_ERR_INVALID_ARG); /* no forward yet */
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "no forward"), "%s", msg);
	enum { B = 2, T = 6 };
	int32_t idx[B * T], tgt[B * T];
	tokens(idx, tgt, B * T, 256, 3);
	for (int with = 0; with < 2; with++) { /* dropout off: the logits' forward has none */
		cr_assert_eq(dg_ffi_model_forward(m, U64(idx), with ? U64(tgt) : 0, B, T, 0, 9, 4, 0, msg, sizeof(msg)),
			     DG_OK, "%s", msg);
		int32_t fmt = -1;
		int64_t sh[3];
		cr_assert_eq(dg_ffi_model_hidden(m, &addr, &fmt, sh), DG_OK);
		cr_assert_eq(fmt, DG_FMT_F32);
		cr_assert(sh[0] == B && sh[1] == T && sh[2] == 32, "%lld %lld %lld", (long long)sh[0],
			  (long long)sh[1], (long long)sh[2]);
		const float *x = (const float *)(uintptr_t)addr;
		const float *lm = param_ptr(m, DG_PARAM_LM_HEAD, false);
		dg_model_batch bt = { .idx = idx, .b = B, .t = T };
		for (int pos = 0; pos < T; pos++) {
			float want[B * 256];
			cr_assert_eq(dg_model_cpu_logits(w, &bt, pos, want, msg, sizeof(msg)), DG_OK, "%s", msg);
			for (int r = 0; r < B; r++)
				for (int v = 0; v < 256; v++) {
					double z = 0;
					for (int k = 0; k < 32; k++)
						z += (double)x[((int64_t)r * T + pos) * 32 + k] * lm[k * 256 + v];
					cr_assert_eq((float)z, want[r * 256 + v], "pos %d row %d v %d", pos, r, v);
				}
		}
		if (with) {
			cr_assert_gt(*(float *)(uintptr_t)dg_ffi_model_loss(m), 1.0f);
		} else {
			cr_assert_eq(*(float *)(uintptr_t)dg_ffi_model_loss(m), 0.0f);
			cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
			cr_assert(strstr(msg, "no targets"), "%s", msg);
		}
	}
	/* a run (at the model's own 2x8) in between spends the forward */
	cr_assert_eq(dg_ffi_model_forward(m, U64(idx), U64(tgt), B, T, 0, 9, 4, 1, msg, sizeof(msg)), DG_OK, "%s", msg);
	int32_t idx16[16], tgt16[16];
	tokens(idx16, tgt16, 16, 256, 5);
	cr_assert_eq(dg_ffi_model_run(m, U64(idx16), U64(tgt16), 0, 9, 4, 1, 0, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_ffi_model_hidden(m, &addr, NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "no forward"), "%s", msg);
	/* bad arguments */
	cr_assert_eq(dg_ffi_model_forward(m, U64(idx), U64(tgt), 0, T, 0, 9, 4, 1, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "at least 1"), "%s", msg);
	cr_assert_eq(dg_ffi_model_forward(m, 1, 1, B, T, 1, 9, 4, 1, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "CPU"), "%s", msg);
	tgt[4] = 256;
	cr_assert_eq(dg_ffi_model_forward(m, U64(idx), U64(tgt), B, T, 0, 9, 4, 1, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "targets[4] = 256"), "%s", msg);
	cr_assert_eq(dg_ffi_model_hidden(m, &addr, NULL, NULL), DG_ERR_INVALID_ARG); /* the failed one spent it */
	dg_model_weights_destroy(w);
	dg_ffi_model_destroy(m);
}

/* On a GPU: forward then backward (tokens on the device) against
 * dg_model_step; then the same batch's first row alone, padded to the
 * model's (B, T) with targets outside the vocabulary, against a model of
 * (1, t): its loss times B·T / t and its gradients times the same. */
static void gpu_case(const char *preset, double loss_tol, double grad_tol)
{
	dg_device *dev = gh_open();
	char msg[512];
	enum { B = 2, T = 8 };
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(dev, preset, SIZES, B, T, 7, &m, msg, sizeof(msg)), DG_OK, "%s: %s", preset,
		     msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	dg_model_weights *w, *g;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(c, 7, &g, msg, sizeof(msg)), DG_OK);
	int32_t idx[B * T], tgt[B * T];
	tokens(idx, tgt, B * T, 256, 4);
	dg_dptr didx = gh_upload(dev, idx, sizeof(idx)), dtgt = gh_upload(dev, tgt, sizeof(tgt));
	cr_assert_eq(dg_ffi_model_forward(m, didx, 0, B, T, 1, 9, 4, 1, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "needs targets"), "%s", msg);
	cr_assert_eq(dg_ffi_model_forward(m, didx, dtgt, B, T, 1, 9, 4, 1, msg, sizeof(msg)), DG_OK, "%s", msg);
	float got = gh_read_scalar(dev, dg_ffi_model_loss(m));
	uint64_t xa;
	int32_t fmt;
	int64_t sh[3];
	cr_assert_eq(dg_ffi_model_hidden(m, &xa, &fmt, sh), DG_OK);
	cr_assert(xa && sh[0] == B && sh[1] == T && sh[2] == 32);
	cr_assert_eq(fmt, strcmp(preset, "f32") ? DG_FMT_BF16 : DG_FMT_F32);
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model *ref;
	cr_assert_eq(dg_model_create(dev, w, B, T, &ref), DG_OK, "%s", dg_device_errmsg(dev));
	dg_model_batch bt = { .idx = idx, .targets = tgt, .b = B, .t = T, .seed = 9, .step = 4, .train = true };
	double want;
	cr_assert_eq(dg_model_step(ref, &bt, &want, g), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(got, (float)want, "%s: loss %.9g, want %.9g", preset, got, want);
	for (int p = 0; p < 5; p++) {
		int64_t n = param_size(c, p);
		float *h = gh_xmalloc((size_t)n * 4);
		gh_download(dev, h, U64(param_ptr(m, p, true)), (size_t)n * 4);
		gh_expect_bytes(dg_model_param_name((dg_model_param)p), h, g->params[p], (size_t)n * 4);
		free(h);
	}
	dg_model_destroy(ref);
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);

	/* row 0's first 5 tokens, padded: dropout off (its masks are drawn at
	 * the planned shape's element indices) */
	enum { t = 5 };
	int32_t pidx[B * T], ptgt[B * T], sidx[t], stgt[t];
	for (int i = 0; i < B * T; i++) {
		const bool in = i / T == 0 && i % T < t;
		pidx[i] = in ? idx[i] : 0;
		ptgt[i] = in ? tgt[i] : -1;
	}
	memcpy(sidx, idx, sizeof(sidx));
	memcpy(stgt, tgt, sizeof(stgt));
	dg_dptr dpi = gh_upload(dev, pidx, sizeof(pidx)), dpt = gh_upload(dev, ptgt, sizeof(ptgt));
	cr_assert_eq(dg_ffi_model_forward(m, dpi, dpt, B, T, 1, 9, 4, 0, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_ffi_model_backward(m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const double k = (double)(B * T) / t;
	got = gh_read_scalar(dev, dg_ffi_model_loss(m));
	cr_assert_eq(dg_model_create(dev, w, 1, t, &ref), DG_OK, "%s", dg_device_errmsg(dev));
	dg_model_batch sb = { .idx = sidx, .targets = stgt, .b = 1, .t = t, .seed = 9, .step = 4 };
	cr_assert_eq(dg_model_step(ref, &sb, &want, g), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert(fabs(got * k - want) <= loss_tol * fabs(want), "%s padded: loss %.9g x %g, want %.9g", preset, got, k,
		  want);
	for (int p = 0; p < 5; p++) {
		int64_t n = param_size(c, p);
		float *h = gh_xmalloc((size_t)n * 4);
		gh_download(dev, h, U64(param_ptr(m, p, true)), (size_t)n * 4);
		double d2 = 0, n2 = 0;
		for (int64_t i = 0; i < n; i++) {
			const double d = h[i] * k - g->params[p][i];
			d2 += d * d;
			n2 += (double)g->params[p][i] * g->params[p][i];
		}
		cr_assert(sqrt(d2) <= grad_tol * sqrt(n2) + 1e-12, "%s padded: %s's gradient off by %g of its norm", preset,
			  dg_model_param_name((dg_model_param)p), sqrt(d2 / (n2 + 1e-30)));
		free(h);
	}
	dg_model_destroy(ref);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg_ffi_model_destroy(m);
	gh_close(dev);
}

/* the padded run against a model of the small shape: f32 to the sums'
 * order; w8a8 to a code flipped by it (without the rescaling the loss is
 * off 3.2x, with the padding's rows counted the gradients by O(1)) */
Test(ffi_pass, gpu_f32)
{
	gpu_case("f32", 1e-5, 1e-4);
}

Test(ffi_pass, gpu_w8a8)
{
	gpu_case("w8a8", 1e-3, 3e-2);
}
