/*
 * The BDH model on the CPU (runtime/train/cpu_model.c): the gradient of
 * every weight against finite differences of the loss at a tiny config
 * (2 layers, D 32, H 2, N 64, T 16, B 2), the new ops' references against
 * finite differences of their forwards, the RoPE tables against the
 * reference's formula, the counter-based dropout (a batch's rows run
 * apart with row0 give the whole batch's loss and gradients: data
 * parallel draws one process's masks), the logits (their
 * log-softmax at the targets, averaged, is the step's loss; a position's
 * logits see no later token), and the refusals (a token outside the
 * vocabulary, a config the model cannot take, weights files with a
 * missing or misshapen tensor, a position outside the batch).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

static dg_model_config tiny(void)
{
	return dg_test_tiny_model("f32");
}

typedef struct fixture {
	dg_model_weights *w, *g;
	int32_t idx[32], tgt[32];
	dg_model_batch batch;
} fixture;

static void setup_config(fixture *f, uint64_t seed, dg_model_config c)
{
	char msg[512];
	cr_assert_eq(dg_model_weights_create(&c, seed, &f->w, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&c, seed, &f->g, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* init weights are 0.02-small: scale them so the activations are not
	 * all near the ReLU kinks and the loss is far from uniform */
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&c, (dg_model_param)p, &nd, sh);
		for (int64_t i = 0; i < n; i++)
			f->w->params[p][i] *= 25.0f;
	}
	dg_rng r;
	dg_rng_seed(&r, seed + 7);
	for (int i = 0; i < 32; i++) {
		f->idx[i] = dg_rng_int(&r, 0, c.vocab - 1);
		f->tgt[i] = dg_rng_int(&r, 0, c.vocab - 1);
	}
	f->batch = (dg_model_batch){ .idx = f->idx, .targets = f->tgt, .b = 2, .t = 16 };
}

static void setup_of(fixture *f, uint64_t seed, const char *preset)
{
	setup_config(f, seed, dg_test_tiny_model(preset));
}

static void setup(fixture *f, uint64_t seed)
{
	setup_of(f, seed, "f32");
}

static double loss_of(const fixture *f)
{
	char msg[512];
	double loss = 0;
	cr_assert_eq(dg_model_cpu_step(f->w, &f->batch, &loss, NULL, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	return loss;
}

/* Central differences of the loss, in f32 arithmetic: the steps are
 * sized so the loss moves far above its rounding (about 1e-6 of it). */
static double fd_along(fixture *f, int p, const float *u, int64_t n, double eps)
{
	float *keep = malloc((size_t)n * sizeof(float));
	cr_assert(keep);
	memcpy(keep, f->w->params[p], (size_t)n * sizeof(float));
	for (int64_t i = 0; i < n; i++)
		f->w->params[p][i] = keep[i] + (float)(eps * u[i]);
	double lp = loss_of(f);
	for (int64_t i = 0; i < n; i++)
		f->w->params[p][i] = keep[i] - (float)(eps * u[i]);
	double lm = loss_of(f);
	memcpy(f->w->params[p], keep, (size_t)n * sizeof(float));
	free(keep);
	return (lp - lm) / (2 * eps);
}

/* Every weight's gradient against central differences of the loss: along
 * the gradient (the derivative is |g|), and entry by entry among the
 * larger ones. */
static void gradients_match(fixture *f_)
{
	fixture f = *f_;
	char msg[512];
	double loss;
	cr_assert_eq(dg_model_cpu_step(f.w, &f.batch, &loss, f.g, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(loss > 1.0 && loss < 50.0, "loss %g", loss);
	dg_rng r;
	dg_rng_seed(&r, 99);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		const char *name = dg_model_param_name((dg_model_param)p);
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&f.w->config, (dg_model_param)p, &nd, sh);
		const float *g = f.g->params[p];
		float *u = calloc((size_t)n, sizeof(float));
		cr_assert(u);
		double gg = 0, gmax = 0;
		for (int64_t i = 0; i < n; i++) {
			gg += (double)g[i] * g[i];
			gmax = fmax(gmax, fabs(g[i]));
		}
		cr_assert(gg > 0, "%s: a zero gradient", name);
		/* along the gradient: the derivative is |g| */
		for (int64_t i = 0; i < n; i++)
			u[i] = (float)(g[i] / sqrt(gg));
		double fd = fd_along(&f, p, u, n, 1e-3 * sqrt((double)n) * 0.5);
		cr_log_info("%s: |g| %.6g, finite differences along g %.6g", name, sqrt(gg), fd);
		cr_assert(fabs(fd - sqrt(gg)) <= 2e-2 * sqrt(gg), "%s: |g| %.6g, along g %.6g", name,
			  sqrt(gg), fd);
		/* one entry at a time, among the larger gradients */
		memset(u, 0, (size_t)n * sizeof(float));
		for (int k = 0, tried = 0; k < 6 && tried < 100000; tried++) {
			int64_t i = (int64_t)(dg_rng_u64(&r) % (uint64_t)n);
			if (fabs(g[i]) < 0.1 * gmax)
				continue;
			u[i] = 1.0f;
			double fe = fd_along(&f, p, u, n, 1e-3);
			u[i] = 0.0f;
			cr_assert(fabs(fe - g[i]) <= 2e-2 * fabs(fe) + 3e-3 * gmax,
				  "%s[%lld]: analytic %.6g, finite differences %.6g", name, (long long)i,
				  (double)g[i], fe);
			k++;
		}
		free(u);
	}
	dg_model_weights_destroy(f.w);
	dg_model_weights_destroy(f.g);
}

Test(model_cpu, gradients_match_finite_differences)
{
	fixture f;
	setup(&f, 1);
	gradients_match(&f);
}

/* An odd shape, off every power of two: D 64, three heads of 96 neurons
 * (H·N = 288), a vocabulary of 300 (token ids past a byte), three layers. */
Test(model_cpu, gradients_match_finite_differences_at_an_odd_shape)
{
	fixture f;
	dg_model_config c = dg_test_model("f32", 3, 64, 3, 96);
	c.vocab = 300;
	setup_config(&f, 3, c);
	bool past_a_byte = false;
	for (int i = 0; i < 32; i++)
		past_a_byte |= f.idx[i] > 255 || f.tgt[i] > 255;
	cr_assert(past_a_byte, "no token past 255 in the batch");
	gradients_match(&f);
}

/* DRAGON_RECOMPUTE=1: xs and ys are not saved but made again by each
 * layer's backward (runtime/train/bdh_tape.c recompute); =ys: ys alone
 * (recompute_ys) — the same loss and every gradient the same bits, f32
 * and w8a8 (fake-quantized), with dropout; and the plan's saved
 * activations smaller by the layers' two (one) (B,H,T,N) f32 tensors. */
Test(model_cpu, recompute_gives_the_same_bits)
{
	static const char *const presets[] = { "f32", "w8a8" };
	static const char *const modes[] = { "1", "ys" };
	for (int k = 0; k < 2; k++)
		for (int r = 0; r < 2; r++) {
			fixture f;
			setup_of(&f, 31 + k, presets[k]);
			f.batch.train = true;
			f.batch.seed = 5;
			f.batch.step = 2;
			const dg_model_config *c = &f.w->config;
			char msg[512];
			dg_model_weights *g2 = NULL;
			cr_assert_eq(dg_model_weights_create(c, 0, &g2, msg, sizeof(msg)), DG_OK, "%s", msg);
			double l1 = 0, l2 = 0;
			dg_model_memory m1, m2;
			cr_assert_eq(dg_model_cpu_step(f.w, &f.batch, &l1, f.g, msg, sizeof(msg)), DG_OK, "%s", msg);
			cr_assert_eq(dg_model_cpu_memory(c, 2, 16, &m1, msg, sizeof(msg)), DG_OK, "%s", msg);
			setenv("DRAGON_RECOMPUTE", modes[r], 1);
			dg_status st = dg_model_cpu_step(f.w, &f.batch, &l2, g2, msg, sizeof(msg));
			dg_status sm = dg_model_cpu_memory(c, 2, 16, &m2, msg, sizeof(msg));
			unsetenv("DRAGON_RECOMPUTE");
			cr_assert_eq(st, DG_OK, "%s", msg);
			cr_assert_eq(sm, DG_OK, "%s", msg);
			cr_expect(memcmp(&l1, &l2, sizeof(l1)) == 0, "%s, DRAGON_RECOMPUTE=%s: loss %.17g saved, %.17g recomputed",
				  presets[k], modes[r], l1, l2);
			for (int p = 0; p < DG_MODEL_N_PARAMS; p++)
				cr_expect(memcmp(f.g->params[p], g2->params[p], dg_test_numel(c, p) * sizeof(float)) == 0,
					  "%s, DRAGON_RECOMPUTE=%s: grad %s differs", presets[k], modes[r],
					  dg_model_param_name((dg_model_param)p));
			const size_t bhtn = (size_t)2 * c->heads * 16 * c->neurons * sizeof(float);
			cr_expect_eq(m1.saved - m2.saved, (size_t)(2 - r) * (size_t)c->layers * bhtn,
				     "%s, DRAGON_RECOMPUTE=%s: saved %zu -> %zu", presets[k], modes[r], m1.saved, m2.saved);
			dg_model_weights_destroy(g2);
			dg_model_weights_destroy(f.w);
			dg_model_weights_destroy(f.g);
		}
}

Test(model_cpu, dropout_is_regenerated_and_unbiased)
{
	const int64_t n = 1 << 16;
	float *xs = malloc(n * sizeof(float)), *ys = malloc(n * sizeof(float));
	float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
	float *dxs = malloc(n * sizeof(float)), *dys = malloc(n * sizeof(float));
	float *one = malloc(n * sizeof(float));
	cr_assert(xs && ys && a && b && dxs && dys && one);
	for (int64_t i = 0; i < n; i++)
		xs[i] = 1.0f, ys[i] = 2.0f, one[i] = 1.0f;
	dg_ref_gate_fwd(xs, ys, n, 0.1f, 42, 7, 3, 0, a);
	dg_ref_gate_fwd(xs, ys, n, 0.1f, 42, 7, 3, 0, b);
	cr_assert_eq(memcmp(a, b, n * sizeof(float)), 0, "the mask is a function of its key");
	dg_ref_gate_fwd(xs, ys, n, 0.1f, 42, 8, 3, 0, b);
	cr_assert_neq(memcmp(a, b, n * sizeof(float)), 0, "another step, another mask");
	double mean = 0;
	int64_t dropped = 0;
	for (int64_t i = 0; i < n; i++) {
		mean += a[i];
		dropped += a[i] == 0.0f;
	}
	mean /= n;
	cr_assert(fabs(mean - 2.0) < 0.02, "E[xy] = xs·ys: %g", mean);
	cr_assert(fabs((double)dropped / n - 0.1) < 0.005, "dropped %g", (double)dropped / n);
	/* the backward drops the same elements */
	dg_ref_gate_bwd(one, xs, ys, n, 0.1f, 42, 7, 3, 0, dxs, dys);
	for (int64_t i = 0; i < n; i++)
		cr_assert_eq(dxs[i] == 0.0f, a[i] == 0.0f, "element %lld", (long long)i);
	free(xs), free(ys), free(a), free(b), free(dxs), free(dys), free(one);
}

/* Data parallel on the CPU model: the batch's two rows as batches of one
 * (row0 0 and 1, as 2 ranks run them) give the batch's loss and gradients
 * as their mean, with dropout, up to the sums' order; row 1 with row0 0
 * (its own masks) does not. */
Test(model_cpu, rows_apart_with_row0_are_the_whole_batch_with_dropout)
{
	fixture f;
	char msg[512];
	setup(&f, 3);
	cr_assert_gt(f.w->config.dropout, 0.0f, "the preset drops");
	dg_model_weights *g0, *g1;
	cr_assert_eq(dg_model_weights_create(&f.w->config, 3, &g0, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_weights_create(&f.w->config, 3, &g1, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_batch whole = f.batch;
	whole.seed = 11;
	whole.step = 5;
	whole.train = true;
	double lw, l0, l1, lo;
	cr_assert_eq(dg_model_cpu_step(f.w, &whole, &lw, f.g, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_batch r0 = whole, r1 = whole;
	r0.b = r1.b = 1;
	r1.idx += whole.t;
	r1.targets += whole.t;
	r1.row0 = 1;
	cr_assert_eq(dg_model_cpu_step(f.w, &r0, &l0, g0, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_cpu_step(f.w, &r1, &l1, g1, msg, sizeof(msg)), DG_OK, "%s", msg);
	double d = fabs((l0 + l1) / 2 - lw) / lw, worst = 0;
	cr_assert_lt(d, 1e-6, "loss: rows apart %.9g, whole %.9g", (l0 + l1) / 2, lw);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		int64_t n = dg_model_param_shape(&f.w->config, (dg_model_param)p, &nd, sh);
		float *mean = malloc((size_t)n * sizeof(float));
		cr_assert(mean);
		double e = 0, ww = 0;
		for (int64_t i = 0; i < n; i++) {
			mean[i] = (g0->params[p][i] + g1->params[p][i]) / 2;
			double dd = (double)mean[i] - f.g->params[p][i];
			e += dd * dd;
			ww += (double)f.g->params[p][i] * f.g->params[p][i];
		}
		worst = ww > 0 && sqrt(e / ww) > worst ? sqrt(e / ww) : worst;
		char why[256];
		cr_assert(dg_ref_close_norm(mean, f.g->params[p], (size_t)n, 1e-5, 1e-5f, why, sizeof(why)),
			  "%s: %s", dg_model_param_name((dg_model_param)p), why);
		free(mean);
	}
	printf("model_cpu: rows apart against the whole batch, dropout %g: loss %.2e, gradients %.2e (norm)\n",
	       (double)f.w->config.dropout, d, worst);
	/* row 1's own masks (row0 0: what a rank drew when its masks were its
	 * own): another loss */
	r1.row0 = 0;
	cr_assert_eq(dg_model_cpu_step(f.w, &r1, &lo, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_gt(fabs((l0 + lo) / 2 - lw) / lw, 1e-4, "row0 0: the whole batch's masks anyway");
	dg_model_weights_destroy(g0);
	dg_model_weights_destroy(g1);
	dg_model_weights_destroy(f.w);
	dg_model_weights_destroy(f.g);
}

/* The sizes of op_backwards_match_finite_differences' attention. */
typedef struct attn_dims {
	int B, H, T, N, D;
} attn_dims;

/* 12 central differences (step 1e-2) of Σ g·attention(qr, v) at sizes z in
 * random entries of p (qr or v itself, n values; each restored) against
 * the backward's grad (named name). */
static void attention_fd(dg_rng *r, const attn_dims *z, float *p, int n, const float *grad, const char *name,
			 const float *qr, const float *v, const float *g, float *out)
{
	const int B = z->B, H = z->H, T = z->T, N = z->N, D = z->D;

	for (int k = 0; k < 12; k++) {
		int i = dg_rng_int(r, 0, n - 1);
		float keep = p[i];
		double lp = 0, lm = 0;
		p[i] = keep + 1e-2f;
		dg_ref_attention_fwd(qr, v, B, H, T, N, D, out);
		for (int j = 0; j < B * H * T * D; j++)
			lp += (double)g[j] * out[j];
		p[i] = keep - 1e-2f;
		dg_ref_attention_fwd(qr, v, B, H, T, N, D, out);
		for (int j = 0; j < B * H * T * D; j++)
			lm += (double)g[j] * out[j];
		p[i] = keep;
		double fd = (lp - lm) / 2e-2;
		cr_assert(fabs(fd - grad[i]) <= 1e-3 + 1e-3 * fabs(fd), "%s[%d]: %g vs %g", name, i, grad[i], fd);
	}
}

/* d/dx of Σ w·f(x) against Σ w·f'(x) for one op at a time. */
Test(model_cpu, op_backwards_match_finite_differences)
{
	enum { B = 2, H = 2, T = 5, N = 8, D = 6 };
	dg_rng r;
	dg_rng_seed(&r, 5);
	float qr[B * H * T * N], v[B * T * D], g[B * H * T * D], out[B * H * T * D];
	float dqr[B * H * T * N], dv[B * T * D];
	for (int i = 0; i < B * H * T * N; i++)
		qr[i] = dg_rng_uniform(&r, -1, 1);
	for (int i = 0; i < B * T * D; i++)
		v[i] = dg_rng_uniform(&r, -1, 1);
	for (int i = 0; i < B * H * T * D; i++)
		g[i] = dg_rng_uniform(&r, -1, 1);
	dg_ref_attention_bwd(g, qr, v, B, H, T, N, D, dqr, dv);
	/* attention w.r.t. qr and v, a few entries each */
	const attn_dims z = { B, H, T, N, D };
	attention_fd(&r, &z, qr, B * H * T * N, dqr, "dqr", qr, v, g, out);
	attention_fd(&r, &z, v, B * T * D, dv, "dv", qr, v, g, out);
	/* RoPE's backward is its transpose: <rope(a), b> = <a, ropeᵀ(b)> */
	float cs[T * N / 2], sn[T * N / 2], a[H * T * N], b2[H * T * N], ra[H * T * N], rb[H * T * N];
	dg_ref_rope_table(T, N, cs, sn);
	for (int i = 0; i < H * T * N; i++)
		a[i] = dg_rng_uniform(&r, -1, 1), b2[i] = dg_rng_uniform(&r, -1, 1);
	dg_ref_rope_fwd(a, cs, sn, H, T, N, ra);
	dg_ref_rope_bwd(b2, cs, sn, H, T, N, rb);
	double l = 0, rr = 0;
	for (int i = 0; i < H * T * N; i++)
		l += (double)ra[i] * b2[i], rr += (double)a[i] * rb[i];
	cr_assert(fabs(l - rr) < 1e-4, "<rope a, b> %g, <a, rope^T b> %g", l, rr);
	/* layer norm */
	float x[3 * D], y[3 * D], rs[3], gy[3 * D], gx[3 * D], y2[3 * D];
	for (int i = 0; i < 3 * D; i++)
		x[i] = dg_rng_uniform(&r, -2, 2), gy[i] = dg_rng_uniform(&r, -1, 1);
	dg_ref_layernorm_fwd(x, 3, D, 1e-5f, y, NULL, rs);
	dg_ref_layernorm_bwd(gy, y, rs, 3, D, gx, false);
	for (int i = 0; i < 3 * D; i++) {
		float keep = x[i];
		double lp = 0, lm = 0;
		x[i] = keep + 1e-3f;
		dg_ref_layernorm_fwd(x, 3, D, 1e-5f, y2, NULL, NULL);
		for (int j = 0; j < 3 * D; j++)
			lp += (double)gy[j] * y2[j];
		x[i] = keep - 1e-3f;
		dg_ref_layernorm_fwd(x, 3, D, 1e-5f, y2, NULL, NULL);
		for (int j = 0; j < 3 * D; j++)
			lm += (double)gy[j] * y2[j];
		x[i] = keep;
		double fd = (lp - lm) / 2e-3;
		cr_assert(fabs(fd - gx[i]) <= 2e-3 + 2e-3 * fabs(fd), "layernorm dx[%d]: %g vs %g", i, gx[i], fd);
	}
}

Test(model_cpu, rope_table_is_the_reference_formula)
{
	enum { T = 64, N = 32 };
	float cs[T * N / 2], sn[T * N / 2];
	dg_ref_rope_table(T, N, cs, sn);
	for (int t = 0; t < T; t++)
		for (int p = 0; p < N / 2; p++) {
			double freq = 1.0 / pow(65536.0, 2.0 * p / N) / (2 * M_PI);
			double ph = fmod(t * freq, 1.0) * 2 * M_PI;
			cr_assert(fabs(cs[t * N / 2 + p] - cos(ph)) < 1e-4 && fabs(sn[t * N / 2 + p] - sin(ph)) < 1e-4,
				  "t %d pair %d", t, p);
		}
}

Test(model_cpu, refuses_bad_input_before_computing)
{
	fixture f;
	char msg[512];
	double loss;
	setup(&f, 2);
	f.idx[5] = 256;
	cr_assert_eq(dg_model_cpu_step(f.w, &f.batch, &loss, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "idx[5] = 256: outside the vocabulary 0..255"), "%s", msg);
	f.idx[5] = 3;
	f.tgt[31] = -1;
	cr_assert_eq(dg_model_cpu_step(f.w, &f.batch, &loss, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "targets[31] = -1"), "%s", msg);

	dg_model_config c = tiny();
	c.neurons = 66;
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(&c, 1, &w, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "neurons=66"), "%s", msg);
	cr_assert_eq(dg_model_preset("w4a4", &c, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "f32, bf16, w8a8, bitnet, seed"), "%s", msg);
	dg_model_weights_destroy(f.w);
	dg_model_weights_destroy(f.g);
}

Test(model_cpu, weights_round_trip_through_safetensors)
{
	fixture f;
	char msg[512], path[4096];
	setup(&f, 3);
	char *dir = dg_test_tmpdir();
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
	cr_assert_eq(dg_model_weights_save(f.w, path, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_model_weights *w2;
	cr_assert_eq(dg_model_weights_load(&f.w->config, path, &w2, msg, sizeof(msg)), DG_OK, "%s", msg);
	double a = loss_of(&f);
	dg_model_weights *keep = f.w;
	f.w = w2;
	double b = loss_of(&f);
	cr_assert_eq(a, b, "the loss of the loaded weights");
	f.w = keep;
	/* a config of another shape: the tensor is named with both shapes */
	dg_model_config c = f.w->config;
	c.neurons = 128;
	cr_assert_eq(dg_model_weights_load(&c, path, &w2, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "encoder: expected F32 [2, 32, 128], got F32 [2, 32, 64]"), "%s", msg);
	dg_model_weights_destroy(f.w);
	dg_model_weights_destroy(f.g);
	dg_test_rmtree(dir);
}

/* log_softmax(logits at t)[target at t], averaged over every (b, t), in
 * double: the step's loss to its rounding, for f32 and a low-bit recipe
 * (w8a8, fake-quantized). Dropout is off for the logits whatever the
 * batch says. A row's logits at pos are those of its prefix alone, and
 * do not move when a later token does (the sampler relies on both). */
static void logits_give_the_loss(const char *preset)
{
	fixture f;
	char msg[512];
	setup_of(&f, 5, preset);
	const int B = 2, T = 16, V = 256;
	double loss = 0;
	cr_assert_eq(dg_model_cpu_step(f.w, &f.batch, &loss, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	float *z = malloc((size_t)B * V * sizeof(float)), *z2 = malloc((size_t)B * V * sizeof(float));
	cr_assert(z && z2);
	double total = 0;
	for (int t = 0; t < T; t++) {
		f.batch.train = t % 2 == 1; /* ignored: no dropout in the logits */
		f.batch.seed = 99;
		cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, t, z, msg, sizeof(msg)), DG_OK, "%s", msg);
		for (int b = 0; b < B; b++) {
			const float *r = z + b * V;
			double m = -INFINITY, se = 0;
			for (int v = 0; v < V; v++)
				m = r[v] > m ? r[v] : m;
			for (int v = 0; v < V; v++)
				se += exp((double)r[v] - m);
			total += m + log(se) - r[f.tgt[b * T + t]];
		}
	}
	f.batch.train = false;
	total /= B * T;
	printf("model_cpu %s: loss %.9f, from the logits %.9f\n", preset, loss, total);
	cr_expect(fabs(total - loss) <= 1e-6 * fabs(loss), "%s: the logits give loss %.9f, the step %.9f",
		  preset, total, loss);

	/* causal: a later token moved, or the row cut after pos, leave pos */
	const int pos = 9;
	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, pos, z, msg, sizeof(msg)), DG_OK, "%s", msg);
	int32_t keep = f.idx[pos + 3];
	f.idx[pos + 3] = (keep + 17) % V;
	f.idx[T + pos + 1] = (f.idx[T + pos + 1] + 5) % V;
	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, pos, z2, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect(memcmp(z, z2, (size_t)B * V * sizeof(float)) == 0, "%s: a later token moved the logits", preset);
	/* the tokens before pos do move them (the check above can fail) */
	f.idx[pos - 1] = (f.idx[pos - 1] + 1) % V;
	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, pos, z2, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect(memcmp(z, z2, (size_t)V * sizeof(float)) != 0, "%s: an earlier token did not move them", preset);
	f.idx[pos - 1] = (f.idx[pos - 1] + V - 1) % V;
	/* row 0's first pos + 1 tokens alone, at pos */
	dg_model_batch one = { .idx = f.idx, .b = 1, .t = pos + 1 };
	cr_assert_eq(dg_model_cpu_logits(f.w, &one, pos, z2, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int v = 0; v < V; v++)
		cr_expect(fabs(z2[v] - z[v]) <= 1e-5f * (1 + fabsf(z[v])), "%s: the prefix's logit %d is %g, the row's %g",
			  preset, v, (double)z2[v], (double)z[v]);

	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, T, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "pos 16: outside the batch's positions 0..15"), "%s", msg);
	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, -1, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_model_cpu_logits(f.w, &f.batch, 0, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	free(z);
	free(z2);
	dg_model_weights_destroy(f.w);
	dg_model_weights_destroy(f.g);
}

Test(model_cpu, logits_give_the_loss_f32)
{
	logits_give_the_loss("f32");
}

Test(model_cpu, logits_give_the_loss_w8a8)
{
	logits_give_the_loss("w8a8");
}

/* The initial weights, drawn on every core, are the bits of one thread
 * drawing the stream in order: normal(0, 0.02) by Box-Muller over
 * splitmix64, parameter after parameter, two values a pair of draws. A
 * projection of 393,216 values is three chunks of 2^16 pairs. */
static void expect_sequential_init(const dg_model_config *c, uint64_t seed)
{
	char msg[256];
	dg_model_weights *w = NULL;
	cr_assert_eq(dg_model_weights_create(c, seed, &w, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_rng rng;
	dg_rng_seed(&rng, seed);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		const int64_t n = (int64_t)dg_test_numel(c, p);
		float *want = malloc((size_t)n * sizeof(float));
		cr_assert(want);
		for (int64_t i = 0; i < n; i += 2) {
			double u1 = ((double)(dg_rng_u64(&rng) >> 11) + 1.0) / 9007199254740993.0;
			double u2 = (double)(dg_rng_u64(&rng) >> 11) / 9007199254740992.0;
			double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
			want[i] = (float)(0.02 * r * cos(a));
			if (i + 1 < n)
				want[i + 1] = (float)(0.02 * r * sin(a));
		}
		cr_assert(memcmp(want, w->params[p], (size_t)n * sizeof(float)) == 0,
			  "%s: not the sequential stream's values", dg_model_param_name((dg_model_param)p));
		free(want);
	}
	dg_model_weights_destroy(w);
}

Test(model_cpu, initial_weights_are_the_sequential_stream)
{
	dg_model_config c = dg_test_model("f32", 2, 64, 3, 2048);
	expect_sequential_init(&c, 1);
	expect_sequential_init(&c, 0xfeedfacecafebeefull);
}
