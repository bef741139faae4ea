/*
 * GPU tests of the loss family (lmhead_ce; templates/loss.lua,
 * runtime/ops/loss.c) against dg_ref_lmhead_ce (double sums): every src ×
 * weight pair (f32 | bf16; a bf16 input is decoded exactly, as the
 * reference gets it), E 32, 96, 256, V 50, 256, 1000, R 1, 37 and BDH's
 * 4096 x 256 x 256; outputs start as 0xff so an unwritten element fails.
 *
 * Bounds, from a rounding model: with p the softmax and m[r][v] =
 * (p + onehot)/R ≥ |dlogits| (computed here in double),
 *   loss  |Δ| ≤ 2e-5·(1 + |loss|)          (f32 logits, expf/logf)
 *   dx    |Δ| ≤ 3e-5·Σ_v m[r][v]·|w[k][v]|  (f32 dlogits on both paths)
 *   dw    |Δ| ≤ c·Σ_r |x[r][k]|·m[r][v], c = 3e-5 (f32 dlogits) or
 *         2^-8 + 3e-5 (the bf16 path stores dlogits as bf16)
 * each plus 1e-7·|ref| for an accumulated dw and 1e-12. The loss of a
 * forward-only call is bitwise the backward call's; two runs are bitwise
 * equal. Out-of-vocabulary targets: their rows add 0 to the loss (the
 * mean still divides by R), get a zero dx row and nothing in dw, and the
 * bad flag becomes 1. A missing workspace is refused by name before
 * anything runs. Skips without a device (gh_open).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "rows_helpers.h"
#include "runtime/ref/ref_ops.h"

static const dg_fmt FL[2] = { DG_FMT_F32, DG_FMT_BF16 };

/* m[r][v] = (p + onehot)/R in double; rows with a bad target 0. */
static double *magnitudes(const float *x, const float *w, const int32_t *t, int64_t R, int E, int V)
{
	double *m = gh_xmalloc((size_t)R * (size_t)V * sizeof(double));
	double *z = gh_xmalloc((size_t)V * sizeof(double));
	for (int64_t r = 0; r < R; r++) {
		double *mr = m + r * V;
		if (t[r] < 0 || t[r] >= V) {
			memset(mr, 0, (size_t)V * sizeof(double));
			continue;
		}
		double mx = -INFINITY, se = 0.0;
		for (int v = 0; v < V; v++) {
			double s = 0.0;
			for (int k = 0; k < E; k++)
				s += (double)x[r * E + k] * w[(int64_t)k * V + v];
			z[v] = s;
			mx = s > mx ? s : mx;
		}
		for (int v = 0; v < V; v++)
			se += exp(z[v] - mx);
		for (int v = 0; v < V; v++)
			mr[v] = (exp(z[v] - mx) / se + (v == t[r])) / (double)R;
	}
	free(z);
	return m;
}

static void expect_within(const char *what, const float *got, const float *want, const float *bound, size_t n)
{
	char why[512];
	cr_assert(dg_ref_within(got, want, bound, n, why, sizeof(why)), "%s: %s", what, why);
}

typedef struct lm_run {
	dg_device *dev;
	dg_spec s;
	dg_tensor x, w, tg, loss, dx, dw;
	dg_lmhead_ce_args a;
} lm_run;

static void lm_call(void *ctx)
{
	lm_run *l = ctx;
	cr_assert_eq(dg_lmhead_ce(l->dev, &l->s, &l->a), DG_OK, "%s", dg_device_errmsg(l->dev));
}

static void lm_case(dg_device *dev, dg_fmt src, dg_fmt wfm, int E, int V, int64_t R, int bad_rows, bool accumulate,
		    bool report)
{
	size_t nx = (size_t)R * (size_t)E, nw = (size_t)E * (size_t)V;
	float *x = rw_rand(nx, -2.0f, 2.0f), *w = rw_rand(nw, -0.2f, 0.2f), *prior = rw_rand(nw, -0.01f, 0.01f);
	void *xs = gh_xmalloc(nx * 4), *ws = gh_xmalloc(nw * 4);
	int32_t *t = gh_xmalloc((size_t)R * 4);
	char what[160];

	for (int64_t r = 0; r < R; r++)
		t[r] = gh_int(0, V - 1);
	for (int i = 0; i < bad_rows; i++)
		t[(int64_t)i * 3 % R] = i % 2 ? V : -1;
	rw_store(src, x, nx, xs);
	rw_load(src, xs, nx, x);
	rw_store(wfm, w, nw, ws);
	rw_load(wfm, ws, nw, w);
	/* the tensor-core path (a large vocabulary) rounds x and w to bf16:
	 * the reference gets them rounded too, and dlogits are bf16 in dx */
	const bool tc = E % 8 == 0 && (src == DG_FMT_BF16 ? V >= 4096 : V > 50304);
	if (tc) {
		void *tmp = gh_xmalloc(nw * 2);
		rw_store(DG_FMT_BF16, x, nx, tmp);
		rw_load(DG_FMT_BF16, tmp, nx, x);
		rw_store(DG_FMT_BF16, w, nw, tmp);
		rw_load(DG_FMT_BF16, tmp, nw, w);
		free(tmp);
	}
	snprintf(what, sizeof(what), "lmhead_ce x %s w %s E=%d V=%d R=%lld bad=%d%s%s", dg_fmt_name(src),
		 dg_fmt_name(wfm), E, V, (long long)R, bad_rows, accumulate ? " accumulate" : "",
		 tc ? " (tensor cores)" : "");

	/* the reference on the valid rows, rescaled from their mean to the mean over R */
	float *xv = gh_xmalloc(nx * 4), *dxv = gh_xmalloc(nx * 4), *dwv = gh_xmalloc(nw * 4);
	int32_t *tv = gh_xmalloc((size_t)R * 4);
	int64_t nv = 0;
	for (int64_t r = 0; r < R; r++)
		if (t[r] >= 0 && t[r] < V) {
			memcpy(xv + nv * E, x + r * E, (size_t)E * 4);
			tv[nv++] = t[r];
		}
	double loss_v = 0.0;
	cr_assert_eq(dg_ref_lmhead_ce(xv, w, tv, nv, E, V, &loss_v, dxv, dwv, false, NULL), DG_OK);
	const double scale = (double)nv / (double)R;
	const float want_loss = (float)(loss_v * scale);
	float *want_dx = gh_xmalloc(nx * 4), *want_dw = gh_xmalloc(nw * 4);
	for (int64_t r = 0, j = 0; r < R; r++) {
		bool ok = t[r] >= 0 && t[r] < V;
		for (int k = 0; k < E; k++)
			want_dx[r * E + k] = ok ? (float)(dxv[j * E + k] * scale) : 0.0f;
		j += ok;
	}
	for (size_t i = 0; i < nw; i++)
		want_dw[i] = (accumulate ? prior[i] : 0.0f) + (float)(dwv[i] * scale);

	/* the bounds */
	double *m = magnitudes(x, w, t, R, E, V);
	float *bdx = gh_xmalloc(nx * 4), *bdw = gh_xmalloc(nw * 4);
	const double cdw = src == DG_FMT_BF16 || tc ? 1.0 / 256 + 3e-5 : 3e-5, cdx = tc ? 1.0 / 256 + 3e-5 : 3e-5;
	for (int64_t r = 0; r < R; r++)
		for (int k = 0; k < E; k++) {
			double s = 0.0;
			for (int v = 0; v < V; v++)
				s += m[r * V + v] * fabs((double)w[(int64_t)k * V + v]);
			bdx[r * E + k] = (float)(cdx * s + 1e-12);
		}
	for (int k = 0; k < E; k++)
		for (int v = 0; v < V; v++) {
			double s = 0.0;
			for (int64_t r = 0; r < R; r++)
				s += fabs((double)x[r * E + k]) * m[r * V + v];
			bdw[(int64_t)k * V + v] = (float)(cdw * s + 1e-7 * fabs((double)want_dw[(int64_t)k * V + v]) + 1e-12);
		}

	/* forward only, then the backward */
	lm_run l = { .dev = dev };
	dg_spec_init(&l.s, DG_OP_LMHEAD_CE);
	l.s.src = src;
	l.s.weight = wfm;
	l.s.embd = E;
	l.s.vocab = V;
	l.x = dg_tensor_2d("x", src, gh_upload(dev, xs, nx * rw_size(src)), R, E);
	l.w = dg_tensor_2d("w", wfm, gh_upload(dev, ws, nw * rw_size(wfm)), E, V);
	l.tg = dg_tensor_1d("targets", DG_FMT_I32, gh_upload(dev, t, (size_t)R * 4), R);
	l.loss = dg_tensor_1d("loss", DG_FMT_F32, gh_alloc_ff(dev, 4), 1);
	l.dx = dg_tensor_2d("dx", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), R, E);
	l.dw = dg_tensor_2d("dw", DG_FMT_F32, accumulate ? gh_upload(dev, prior, nw * 4) : gh_alloc_ff(dev, nw * 4), E, V);
	l.a = (dg_lmhead_ce_args){ .x = &l.x, .w = &l.w, .targets = &l.tg, .loss = &l.loss, .bad = gh_alloc(dev, 4) };
	size_t need = 0;
	cr_assert_eq(dg_lmhead_ce_workspace(dev, &l.s, &l.a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	l.a.ws = gh_workspace(dev, need);
	lm_call(&l);
	float loss_fwd = gh_read_scalar(dev, l.loss.data);
	l.a.dx = &l.dx;
	l.a.dw = &l.dw;
	l.a.backward = true;
	l.a.accumulate = accumulate;
	cr_assert_eq(dg_lmhead_ce_workspace(dev, &l.s, &l.a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	l.a.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_memset8(dev, l.loss.data, 0xff, 4), DG_OK);
	lm_call(&l);
	float loss = gh_read_scalar(dev, l.loss.data);
	float *dx = gh_xmalloc(nx * 4), *dw = gh_xmalloc(nw * 4), *dx2 = gh_xmalloc(nx * 4), *dw2 = gh_xmalloc(nw * 4);
	gh_download(dev, dx, l.dx.data, nx * 4);
	gh_download(dev, dw, l.dw.data, nw * 4);
	int32_t flag = -1;
	gh_download(dev, &flag, l.a.bad, 4);

	cr_assert(fabsf(loss - want_loss) <= 2e-5f * (1.0f + fabsf(want_loss)), "%s: loss %.9g, reference %.9g", what,
		  (double)loss, (double)want_loss);
	cr_assert(memcmp(&loss, &loss_fwd, 4) == 0, "%s: backward loss %.9g, forward-only %.9g", what, (double)loss,
		  (double)loss_fwd);
	expect_within(what, dx, want_dx, bdx, nx);
	expect_within(what, dw, want_dw, bdw, nw);
	for (int64_t r = 0; r < R; r++)
		if (t[r] < 0 || t[r] >= V)
			for (int k = 0; k < E; k++)
				cr_assert(dx[r * E + k] == 0.0f, "%s: dx row %lld of a bad target", what, (long long)r);
	cr_assert_eq(flag, bad_rows ? 1 : 0, "%s: bad flag %d", what, flag);

	/* run to run: the same bits */
	if (accumulate)
		cr_assert_eq(dg_memcpy_htod(dev, l.dw.data, prior, nw * 4), DG_OK);
	cr_assert_eq(dg_memset8(dev, l.dx.data, 0xff, nx * 4), DG_OK);
	lm_call(&l);
	float loss2 = gh_read_scalar(dev, l.loss.data);
	gh_download(dev, dx2, l.dx.data, nx * 4);
	gh_download(dev, dw2, l.dw.data, nw * 4);
	cr_assert(memcmp(&loss, &loss2, 4) == 0 && memcmp(dx, dx2, nx * 4) == 0 && memcmp(dw, dw2, nw * 4) == 0,
		  "%s: two runs differ", what);
	if (report) {
		l.a.accumulate = true; /* dw keeps growing: the time is what matters */
		rw_report(dev, &l.s, NULL, what, lm_call, &l, 20);
		l.a.backward = false;
		l.a.dx = l.a.dw = NULL;
		rw_report(dev, &l.s, NULL, "  forward only", lm_call, &l, 20);
	}
	free(x);
	free(w);
	free(prior);
	free(xs);
	free(ws);
	free(t);
	free(xv);
	free(dxv);
	free(dwv);
	free(tv);
	free(want_dx);
	free(want_dw);
	free(m);
	free(bdx);
	free(bdw);
	free(dx);
	free(dw);
	free(dx2);
	free(dw2);
}

Test(gpu_loss, lmhead_ce_small)
{
	static const int E[] = { 32, 96, 256 }, V[] = { 50, 256, 1000 };
	static const int64_t R[] = { 1, 37 };
	dg_device *dev = gh_open();
	gh_seed(41);
	for (int a = 0; a < 2; a++)
		for (int b = 0; b < 2; b++)
			for (int e = 0; e < 3; e++)
				for (int v = 0; v < 3; v++)
					for (int r = 0; r < 2; r++)
						lm_case(dev, FL[a], FL[b], E[e], V[v], R[r], 0, (e + v + r) % 2, false);
	/* R 1000: dw in 8 splits of 128 rows, the last one ragged; with and
	 * without accumulate */
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 96, 50, 1000, 0, true, false);
	lm_case(dev, DG_FMT_F32, DG_FMT_BF16, 256, 256, 1000, 0, false, false);
	/* a vocabulary whose logits leave room for one row a block */
	lm_case(dev, DG_FMT_F32, DG_FMT_F32, 256, 30000, 5, 0, false, false);
	gh_close(dev);
}

Test(gpu_loss, lmhead_ce_bdh)
{
	dg_device *dev = gh_open();
	gh_seed(42);
	lm_case(dev, DG_FMT_F32, DG_FMT_F32, 256, 256, 4096, 0, false, true);
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 256, 256, 4096, 0, true, true);
	lm_case(dev, DG_FMT_BF16, DG_FMT_BF16, 256, 256, 4096, 0, false, false);
	gh_close(dev);
}

/* The tensor-core path (templates/loss_tc.lua): a bf16 x from V 4096, an
 * f32 x past V 50304; ragged V (not a multiple of 8 or 128), ragged R,
 * E 64 (half a tile) and 256, bad targets, accumulate, dx in splits (R 300
 * at E 64: one row tile of one column tile); GPT-2's vocabulary at BDH's
 * 4096 rows timed. */
Test(gpu_loss, lmhead_ce_tensor_cores)
{
	dg_device *dev = gh_open();
	gh_seed(43);
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 64, 4096, 37, 0, false, false);
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 64, 5003, 300, 3, true, false);
	lm_case(dev, DG_FMT_BF16, DG_FMT_BF16, 256, 8197, 129, 0, false, false);
	lm_case(dev, DG_FMT_F32, DG_FMT_F32, 64, 50311, 20, 2, false, false);
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 64, 50304, 96, 1, true, false);
	gh_close(dev);
}

/* GPT-2's vocabulary at BDH's 4096 rows (E 256, a bf16 x): timed, forward
 * and backward, and a second run the same bits (the reference's double
 * sums at this size would take minutes; lmhead_ce_tensor_cores checks the
 * values). */
Test(gpu_loss, lmhead_ce_gpt2_vocab_timed)
{
	enum { E = 256, V = 50304, R = 4096 };
	dg_device *dev = gh_open();
	gh_seed(44);
	size_t nx = (size_t)R * E, nw = (size_t)E * V;
	float *x = rw_rand(nx, -2.0f, 2.0f), *w = rw_rand(nw, -0.05f, 0.05f);
	void *xs = gh_xmalloc(nx * 2);
	int32_t *t = gh_xmalloc((size_t)R * 4);
	for (int r = 0; r < R; r++)
		t[r] = gh_int(0, V - 1);
	rw_store(DG_FMT_BF16, x, nx, xs);
	lm_run l = { .dev = dev };
	dg_spec_init(&l.s, DG_OP_LMHEAD_CE);
	l.s.src = DG_FMT_BF16;
	l.s.weight = DG_FMT_F32;
	l.s.embd = E;
	l.s.vocab = V;
	l.x = dg_tensor_2d("x", DG_FMT_BF16, gh_upload(dev, xs, nx * 2), R, E);
	l.w = dg_tensor_2d("w", DG_FMT_F32, gh_upload(dev, w, nw * 4), E, V);
	l.tg = dg_tensor_1d("targets", DG_FMT_I32, gh_upload(dev, t, (size_t)R * 4), R);
	l.loss = dg_tensor_1d("loss", DG_FMT_F32, gh_alloc_ff(dev, 4), 1);
	l.dx = dg_tensor_2d("dx", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), R, E);
	l.dw = dg_tensor_2d("dw", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), E, V);
	l.a = (dg_lmhead_ce_args){ .x = &l.x, .w = &l.w, .targets = &l.tg, .loss = &l.loss, .dx = &l.dx,
				   .dw = &l.dw, .backward = true, .bad = gh_alloc(dev, 4) };
	size_t need = 0;
	cr_assert_eq(dg_lmhead_ce_workspace(dev, &l.s, &l.a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	l.a.ws = gh_workspace(dev, need);
	lm_call(&l);
	float loss = gh_read_scalar(dev, l.loss.data);
	/* weights of 0.05 and x of 2 leave the logits near 0: the loss near log V */
	cr_assert(fabsf(loss - logf((float)V)) < 0.5f, "loss %g, log V %g", (double)loss, log((double)V));
	float *dx = gh_xmalloc(nx * 4), *dx2 = gh_xmalloc(nx * 4);
	gh_download(dev, dx, l.dx.data, nx * 4);
	lm_call(&l);
	gh_download(dev, dx2, l.dx.data, nx * 4);
	cr_assert(memcmp(dx, dx2, nx * 4) == 0, "two runs differ");
	printf("lmhead_ce E %d V %d R %d bf16 on tensor cores: workspace %zu bytes, loss %.6f\n", E, V, R, need,
	       (double)loss);
	rw_report(dev, &l.s, NULL, "lmhead_ce gpt2 vocab fwd+bwd", lm_call, &l, 20);
	l.a.backward = false;
	l.a.dx = l.a.dw = NULL;
	rw_report(dev, &l.s, NULL, "  forward only", lm_call, &l, 20);
	free(x);
	free(w);
	free(xs);
	free(t);
	free(dx);
	free(dx2);
	gh_close(dev);
}

Test(gpu_loss, lmhead_ce_out_of_vocabulary)
{
	dg_device *dev = gh_open();
	gh_seed(43);
	lm_case(dev, DG_FMT_F32, DG_FMT_F32, 96, 50, 37, 4, false, false);
	lm_case(dev, DG_FMT_BF16, DG_FMT_F32, 256, 256, 512, 7, true, false);
	gh_close(dev);
}

/* A missing or short workspace is refused naming ws, and nothing runs. */
Test(gpu_loss, lmhead_ce_workspace_is_checked)
{
	dg_device *dev = gh_open();
	const int64_t R = 64;
	dg_spec s;
	dg_spec_init(&s, DG_OP_LMHEAD_CE);
	float *x = rw_rand((size_t)R * 256, -1.0f, 1.0f), *w = rw_rand(256 * 256, -0.1f, 0.1f);
	int32_t t[64] = { 0 };
	dg_tensor tx = dg_tensor_2d("x", DG_FMT_F32, gh_upload(dev, x, (size_t)R * 256 * 4), R, 256);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_F32, gh_upload(dev, w, 256 * 256 * 4), 256, 256);
	dg_tensor tt = dg_tensor_1d("targets", DG_FMT_I32, gh_upload(dev, t, sizeof(t)), R);
	dg_tensor tl = dg_tensor_1d("loss", DG_FMT_F32, gh_alloc_ff(dev, 4), 1);
	dg_lmhead_ce_args a = { .x = &tx, .w = &tw, .targets = &tt, .loss = &tl };
	size_t need = 0;
	cr_assert_eq(dg_lmhead_ce_workspace(dev, &s, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	dg_workspace ok = gh_workspace(dev, need);
	const dg_workspace bad[2] = { { 0, 0 }, { ok.ptr, need - 1 } };
	for (int i = 0; i < 2; i++) {
		a.ws = bad[i];
		cr_assert_eq(dg_lmhead_ce(dev, &s, &a), DG_ERR_INVALID_ARG, "case %d ran", i);
		cr_assert(strncmp(dg_device_errmsg(dev), "dg_lmhead_ce: ws: ", 18) == 0, "%s",
			  dg_device_errmsg(dev));
	}
	uint32_t u = 0;
	gh_download(dev, &u, tl.data, 4);
	cr_assert_eq(u, 0xffffffffu, "loss written by a refused call");
	a.ws = ok;
	cr_assert_eq(dg_lmhead_ce(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert(isfinite(gh_read_scalar(dev, tl.data)));
	free(x);
	free(w);
	gh_close(dev);
}
