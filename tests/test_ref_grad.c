/*
 * Tests of the gradient GEMMs' CPU references (runtime/ref/grad.c) and of
 * the _check twins of the gradient and weight-quantize ops (no device needed):
 *
 *   - every grad ref against central finite differences of a forward:
 *     dg_ref_lowrank_fwd for the projection (f32, ReLU off, so the loss
 *     Σ r·out is bilinear and the differences are exact up to rounding),
 *     a double-precision decoder forward written here for the decoder;
 *   - every storage format against a naive double loop with its own
 *     decoders (codes × scale), Hin 1 and H;
 *   - the unpack refs: hand words, round trips through the pack refs, the
 *     refused ternary pair 10;
 *   - bad arguments; _check messages name the tensor and the expected shape.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/ref.h"
#include "helpers.h"
#include "ref_helpers.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"

/* --- helpers ------------------------------------------------------------- */

static float frand(void)
{
	return (float)rh_rng_int(-1000, 1000) / 500.0f;
}

static dg_spec grad_spec(dg_op op, int heads, int in_heads, int embd,
			 int latent)
{
	dg_spec s = dg_test_spec_sized(op, heads, embd, latent);

	s.in_heads = in_heads;
	s.weight = DG_FMT_F32;
	s.act = DG_FMT_F32;
	return s;
}

static void expect_close(const char *what, const float *got,
			 const double *want, size_t n, double atol, double rtol)
{
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);

		cr_assert(d <= atol + rtol * fabs(want[i]),
			  "%s[%zu]: got %.9g, want %.9g", what, i,
			  (double)got[i], want[i]);
	}
}

/* Packs n codes (n a multiple of the format's word) into storage. */
static void pack_codes(dg_fmt f, const int *c, void *dst, size_t n)
{
	uint32_t *w = dst;

	if (f == DG_FMT_TERNARY) {
		memset(w, 0, n / 16 * 4);
		for (size_t i = 0; i < n; i++) {
			uint32_t bits = c[i] == 1 ? 1u : c[i] == -1 ? 3u : 0u;

			w[i / 16] |= bits << (2 * (i % 16));
		}
	} else if (f == DG_FMT_SIGN1) {
		memset(w, 0, n / 32 * 4);
		for (size_t i = 0; i < n; i++)
			if (c[i] == 1)
				w[i / 32] |= 1u << (i % 32);
	} else { /* i8x4 lanes, little-endian */
		memset(w, 0, n);
		for (size_t i = 0; i < n; i++)
			w[i / 4] |= ((uint32_t)c[i] & 0xffu) << (8 * (i % 4));
	}
}

/* Random codes of format f. */
static int rand_code(dg_fmt f)
{
	switch (f) {
	case DG_FMT_TERNARY:
		return rh_rng_int(-1, 1);
	case DG_FMT_SIGN1:
		return rh_rng_int(0, 1) ? 1 : -1;
	case DG_FMT_INT4:
		return rh_rng_int(-7, 7);
	case DG_FMT_UINT8POS:
		return rh_rng_int(0, 255);
	default:
		return rh_rng_int(-127, 127);
	}
}

/*
 * A tensor of n values in format f: storage (malloc'd, what the ref reads)
 * and the values it stands for as doubles (codes unscaled; bf16 rounded).
 */
static void *make_operand(dg_fmt f, size_t n, double *vals)
{
	void *st;

	if (f == DG_FMT_F32) {
		float *p = rh_xmalloc(n * 4);

		for (size_t i = 0; i < n; i++) {
			p[i] = frand();
			vals[i] = p[i];
		}
		return p;
	}
	if (f == DG_FMT_BF16) {
		uint16_t *p = rh_xmalloc(n * 2);

		for (size_t i = 0; i < n; i++) {
			p[i] = dg_ref_f32_to_bf16(frand());
			vals[i] = dg_ref_bf16_to_f32(p[i]);
		}
		return p;
	}
	int *c = rh_xmalloc(n * sizeof(int));

	for (size_t i = 0; i < n; i++) {
		c[i] = rand_code(f);
		vals[i] = c[i];
	}
	st = rh_xmalloc(n + 64);
	pack_codes(f, c, st, n);
	free(c);
	return st;
}

static bool fmt_int(dg_fmt f)
{
	return f != DG_FMT_F32 && f != DG_FMT_BF16;
}

/* --- finite differences --------------------------------------------------- */

/* Central differences (loss(p_i + eps) - loss(p_i - eps)) / (2·eps) over
 * the n elements of an operand held as floats (pf) or doubles (pd, pf
 * NULL), into fd; each element is restored after its pair. loss(u)
 * evaluates the loss of the operands as they stand. */
static void central_diff(float *pf, double *pd, size_t n, double eps,
			 double (*loss)(void *u), void *u, double *fd)
{
	for (size_t i = 0; i < n; i++) {
		double v = pf ? pf[i] : pd[i];
		double lp, lm;

		if (pf)
			pf[i] = (float)(v + eps);
		else
			pd[i] = v + eps;
		lp = loss(u);
		if (pf)
			pf[i] = (float)(v - eps);
		else
			pd[i] = v - eps;
		lm = loss(u);
		if (pf)
			pf[i] = (float)v;
		else
			pd[i] = v;
		fd[i] = (lp - lm) / (2 * eps);
	}
}

/* --- finite differences: lowrank ----------------------------------------- */

/* loss = Σ r·out of the f32 forward, in double. */
static double lowrank_loss(const dg_spec *fs, const float *x, const float *w,
			   const float *r, float *out, int B, int T)
{
	dg_ref_lowrank_args a = { .x = x, .w = w, .sa = 1, .sw = 1, .so = 1,
				  .out = out, .batch = B, .time = T };
	size_t n = (size_t)B * fs->heads * T * fs->latent;
	double loss = 0;

	cr_assert_eq(dg_ref_lowrank_fwd(fs, &a), DG_OK);
	for (size_t i = 0; i < n; i++)
		loss += (double)r[i] * out[i];
	return loss;
}

typedef struct lowrank_fd_ctx {
	const dg_spec *fs;
	const float *x, *w, *r;
	float *out;
	int B, T;
} lowrank_fd_ctx;

static double lowrank_loss_of(void *u)
{
	lowrank_fd_ctx *c = u;

	return lowrank_loss(c->fs, c->x, c->w, c->r, c->out, c->B, c->T);
}

static void lowrank_fd(int H, int Hin)
{
	const int E = 8, L = 12, B = 2, T = 3;
	dg_spec fs = grad_spec(DG_OP_LOWRANK_FWD, H, Hin, E, L);
	fs.out = DG_FMT_F32;
	size_t nx = (size_t)B * Hin * T * E, nw = (size_t)H * L * E,
	       no = (size_t)B * H * T * L;
	float *x = rh_xmalloc(nx * 4), *w = rh_xmalloc(nw * 4);
	float *r = rh_xmalloc(no * 4), *out = rh_xmalloc(no * 4);
	float *gx = rh_xmalloc(nx * 4), *gw = rh_xmalloc(nw * 4);
	double *fd = rh_xmalloc((nx > nw ? nx : nw) * sizeof(double));
	const float eps = 0.125f; /* exact in binary; the loss is bilinear */

	rh_rng_seed(11 + (uint64_t)Hin);
	for (size_t i = 0; i < nx; i++)
		x[i] = frand();
	for (size_t i = 0; i < nw; i++)
		w[i] = frand();
	for (size_t i = 0; i < no; i++)
		r[i] = frand();

	dg_spec gi = grad_spec(DG_OP_LOWRANK_GRAD_INPUT, H, Hin, E, L);
	dg_spec gwspec = grad_spec(DG_OP_LOWRANK_GRAD_WEIGHT, H, Hin, E, L);
	cr_assert_eq(dg_ref_lowrank_grad_input(&gi, r, w, 1.0f, gx, B, T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_weight(&gwspec, r, x, 1.0f, gw, B, T),
		     DG_OK);

	lowrank_fd_ctx ctx = { &fs, x, w, r, out, B, T };
	central_diff(x, NULL, nx, eps, lowrank_loss_of, &ctx, fd);
	expect_close("grad_x vs finite differences", gx, fd, nx, 1e-4, 1e-4);
	central_diff(w, NULL, nw, eps, lowrank_loss_of, &ctx, fd);
	expect_close("grad_w vs finite differences", gw, fd, nw, 1e-4, 1e-4);
	free(x);
	free(w);
	free(r);
	free(out);
	free(gx);
	free(gw);
	free(fd);
}

Test(lowrank_grad, finite_differences_in_heads_h)
{
	lowrank_fd(3, 3);
}

Test(lowrank_grad, finite_differences_in_heads_1)
{
	lowrank_fd(3, 1);
}

/* --- finite differences: decoder ----------------------------------------- */

/* out[b,0,t,d] = Σ_h Σ_l y[b,h,t,l] · w[d, h·L + l]; loss = Σ r·out. */
static double decoder_loss(const double *y, const double *w, const double *r,
			   int B, int H, int T, int L, int E)
{
	double loss = 0;

	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int d = 0; d < E; d++) {
				double o = 0;

				for (int h = 0; h < H; h++)
					for (int l = 0; l < L; l++)
						o += y[((size_t)(b * H + h) * T + t) * L + l] *
						     w[(size_t)d * H * L + (size_t)h * L + l];
				loss += r[((size_t)b * T + t) * E + d] * o;
			}
	return loss;
}

typedef struct decoder_fd_ctx {
	const double *y, *w, *r;
	int B, H, T, L, E;
} decoder_fd_ctx;

static double decoder_loss_of(void *u)
{
	decoder_fd_ctx *c = u;

	return decoder_loss(c->y, c->w, c->r, c->B, c->H, c->T, c->L, c->E);
}

Test(decoder_grad, finite_differences)
{
	const int H = 2, E = 8, L = 12, B = 2, T = 3;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L,
	       nr = (size_t)B * T * E;
	float *yf = rh_xmalloc(ny * 4), *wf = rh_xmalloc(nw * 4);
	float *rf = rh_xmalloc(nr * 4);
	double *y = rh_xmalloc(ny * 8), *w = rh_xmalloc(nw * 8);
	double *r = rh_xmalloc(nr * 8);
	float *gy = rh_xmalloc(ny * 4), *gw = rh_xmalloc(nw * 4);
	double *fd = rh_xmalloc((ny > nw ? ny : nw) * 8);
	const double eps = 1e-3;

	rh_rng_seed(21);
	for (size_t i = 0; i < ny; i++)
		y[i] = yf[i] = frand();
	for (size_t i = 0; i < nw; i++)
		w[i] = wf[i] = frand();
	for (size_t i = 0; i < nr; i++)
		r[i] = rf[i] = frand();
	dg_spec gi = grad_spec(DG_OP_DECODER_GRAD_INPUT, H, 1, E, L);
	dg_spec gws = grad_spec(DG_OP_DECODER_GRAD_WEIGHT, H, 1, E, L);
	cr_assert_eq(dg_ref_decoder_grad_input(&gi, rf, wf, 1.0f, gy, B, T), DG_OK);
	cr_assert_eq(dg_ref_decoder_grad_weight(&gws, rf, yf, 1.0f, gw, B, T), DG_OK);

	decoder_fd_ctx ctx = { y, w, r, B, H, T, L, E };
	central_diff(NULL, y, ny, eps, decoder_loss_of, &ctx, fd);
	expect_close("grad_y vs finite differences", gy, fd, ny, 1e-6, 1e-6);
	central_diff(NULL, w, nw, eps, decoder_loss_of, &ctx, fd);
	expect_close("grad_w vs finite differences", gw, fd, nw, 1e-6, 1e-6);
	free(yf);
	free(wf);
	free(rf);
	free(y);
	free(w);
	free(r);
	free(gy);
	free(gw);
	free(fd);
}

/* --- every format against a naive double loop ---------------------------- */

static const dg_fmt weights[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
				  DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt acts[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
			       DG_FMT_INT4, DG_FMT_UINT8POS };

Test(lowrank_grad, every_format_against_naive)
{
	const int H = 2, E = 32, L = 8, B = 2, T = 3;
	const float scale = 0.375f;

	rh_rng_seed(31);
	for (int hin_i = 0; hin_i < 2; hin_i++) {
		int Hin = hin_i ? H : 1;
		size_t ng = (size_t)B * H * T * L, nw = (size_t)H * L * E,
		       nx = (size_t)B * Hin * T * E;
		float *g = rh_xmalloc(ng * 4);
		double *wv = rh_xmalloc(nw * 8), *xv = rh_xmalloc(nx * 8);
		double *want = rh_xmalloc((nx > nw ? nx : nw) * 8);
		float *got = rh_xmalloc((nx > nw ? nx : nw) * 4);

		for (size_t i = 0; i < ng; i++)
			g[i] = frand();
		for (int f = 0; f < 5; f++) {
			/* grad_input, weight format weights[f] */
			dg_spec s = grad_spec(DG_OP_LOWRANK_GRAD_INPUT, H, Hin, E, L);
			s.weight = weights[f];
			void *w = make_operand(weights[f], nw, wv);
			double sc = fmt_int(weights[f]) ? scale : 1.0;

			for (int b = 0; b < B; b++)
				for (int i = 0; i < Hin; i++)
					for (int t = 0; t < T; t++)
						for (int e = 0; e < E; e++) {
							double acc = 0;

							for (int h = 0; h < H; h++) {
								if (Hin != 1 && h != i)
									continue;
								for (int l = 0; l < L; l++)
									acc += g[((size_t)(b * H + h) * T + t) * L + l] *
									       wv[((size_t)h * L + l) * E + e];
							}
							want[((size_t)(b * Hin + i) * T + t) * E + e] = sc * acc;
						}
			cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, scale, got, B, T),
				     DG_OK, "weight=%s", dg_fmt_name(weights[f]));
			expect_close(dg_fmt_name(weights[f]), got, want, nx, 1e-6, 1e-6);
			free(w);

			/* grad_weight, act format acts[f] */
			s = grad_spec(DG_OP_LOWRANK_GRAD_WEIGHT, H, Hin, E, L);
			s.act = acts[f];
			void *x = make_operand(acts[f], nx, xv);
			sc = fmt_int(acts[f]) ? scale : 1.0;
			for (int h = 0; h < H; h++)
				for (int l = 0; l < L; l++)
					for (int e = 0; e < E; e++) {
						double acc = 0;

						for (int b = 0; b < B; b++)
							for (int t = 0; t < T; t++)
								acc += g[((size_t)(b * H + h) * T + t) * L + l] *
								       xv[((size_t)(b * Hin + (Hin == 1 ? 0 : h)) * T + t) * E + e];
						want[((size_t)h * L + l) * E + e] = sc * acc;
					}
			cr_assert_eq(dg_ref_lowrank_grad_weight(&s, g, x, scale, got, B, T),
				     DG_OK, "act=%s", dg_fmt_name(acts[f]));
			expect_close(dg_fmt_name(acts[f]), got, want, nw, 1e-6, 1e-6);
			free(x);
		}
		free(g);
		free(wv);
		free(xv);
		free(want);
		free(got);
	}
}

Test(decoder_grad, every_format_against_naive)
{
	const int H = 2, E = 8, L = 32, B = 2, T = 3;
	const float scale = 0.625f;
	size_t ng = (size_t)B * T * E, nw = (size_t)E * H * L,
	       ny = (size_t)B * H * T * L;
	float *g = rh_xmalloc(ng * 4);
	double *wv = rh_xmalloc(nw * 8), *yv = rh_xmalloc(ny * 8);
	double *want = rh_xmalloc((ny > nw ? ny : nw) * 8);
	float *got = rh_xmalloc((ny > nw ? ny : nw) * 4);

	rh_rng_seed(41);
	for (size_t i = 0; i < ng; i++)
		g[i] = frand();
	for (int f = 0; f < 5; f++) {
		dg_spec s = grad_spec(DG_OP_DECODER_GRAD_INPUT, H, 1, E, L);
		s.weight = weights[f];
		void *w = make_operand(weights[f], nw, wv);
		double sc = fmt_int(weights[f]) ? scale : 1.0;

		for (int b = 0; b < B; b++)
			for (int h = 0; h < H; h++)
				for (int t = 0; t < T; t++)
					for (int l = 0; l < L; l++) {
						double acc = 0;

						for (int d = 0; d < E; d++)
							acc += g[((size_t)b * T + t) * E + d] *
							       wv[(size_t)d * H * L + (size_t)h * L + l];
						want[((size_t)(b * H + h) * T + t) * L + l] = sc * acc;
					}
		cr_assert_eq(dg_ref_decoder_grad_input(&s, g, w, scale, got, B, T), DG_OK,
			     "weight=%s", dg_fmt_name(weights[f]));
		expect_close(dg_fmt_name(weights[f]), got, want, ny, 1e-6, 1e-6);
		free(w);

		s = grad_spec(DG_OP_DECODER_GRAD_WEIGHT, H, 1, E, L);
		s.act = acts[f];
		void *y = make_operand(acts[f], ny, yv);
		sc = fmt_int(acts[f]) ? scale : 1.0;
		for (int d = 0; d < E; d++)
			for (int h = 0; h < H; h++)
				for (int l = 0; l < L; l++) {
					double acc = 0;

					for (int b = 0; b < B; b++)
						for (int t = 0; t < T; t++)
							acc += g[((size_t)b * T + t) * E + d] *
							       yv[((size_t)(b * H + h) * T + t) * L + l];
					want[(size_t)d * H * L + (size_t)h * L + l] = sc * acc;
				}
		cr_assert_eq(dg_ref_decoder_grad_weight(&s, g, y, scale, got, B, T), DG_OK,
			     "act=%s", dg_fmt_name(acts[f]));
		expect_close(dg_fmt_name(acts[f]), got, want, nw, 1e-6, 1e-6);
		free(y);
	}
	free(g);
	free(wv);
	free(yv);
	free(want);
	free(got);
}

/* A hand case: H = Hin = 1, E = 4, L = 2, B = T = 1, int8 weights w =
 * [[1, -2, 3, 4], [0, 5, -1, 2]] (i8x4 rows), scale 0.5, grad [2, -1]:
 * grad_x = 0.5 · (2·[1,-2,3,4] - [0,5,-1,2]) = [1, -4.5, 3.5, 3]. */
Test(lowrank_grad, hand_int8)
{
	dg_spec s = grad_spec(DG_OP_LOWRANK_GRAD_INPUT, 1, 1, 4, 2);
	int c[8] = { 1, -2, 3, 4, 0, 5, -1, 2 };
	uint32_t w[2];
	float g[2] = { 2, -1 }, gx[4];

	s.weight = DG_FMT_INT8;
	pack_codes(DG_FMT_INT8, c, w, 8);
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 0.5f, gx, 1, 1), DG_OK);
	cr_assert_float_eq(gx[0], 1.0f, 0);
	cr_assert_float_eq(gx[1], -4.5f, 0);
	cr_assert_float_eq(gx[2], 3.5f, 0);
	cr_assert_float_eq(gx[3], 3.0f, 0);
}

/* --- unpack ---------------------------------------------------------------- */

Test(unpack, ternary_hand_and_corrupt)
{
	/* codes 0..3: +1, -1, 0, +1 → bits 01, 11, 00, 01 */
	uint32_t w[1] = { 0x1u | 0x3u << 2 | 0x1u << 6 };
	int8_t c[16];

	cr_assert_eq(dg_ref_unpack_ternary(w, c, 1, 16), DG_OK);
	cr_assert_eq(c[0], 1);
	cr_assert_eq(c[1], -1);
	cr_assert_eq(c[2], 0);
	cr_assert_eq(c[3], 1);
	for (int i = 4; i < 16; i++)
		cr_assert_eq(c[i], 0);
	/* pair 10 at code 9: refused, nothing written */
	uint32_t bad[2] = { 0, 0x2u << 18 };
	int8_t out[32];
	memset(out, 7, sizeof(out));
	cr_assert_eq(dg_ref_unpack_ternary(bad, out, 2, 16), DG_ERR_CORRUPT);
	for (int i = 0; i < 32; i++)
		cr_assert_eq(out[i], 7);
}

Test(unpack, sign1_hand)
{
	uint32_t w[1] = { 0x80000005u };
	int8_t c[32];

	cr_assert_eq(dg_ref_unpack_sign1(w, c, 1, 32), DG_OK);
	for (int i = 0; i < 32; i++)
		cr_assert_eq(c[i], (i == 0 || i == 2 || i == 31) ? 1 : -1, "code %d", i);
}

Test(unpack, roundtrip_random)
{
	const size_t rows = 5;
	const int k = 64;
	int8_t c[5 * 64], back[5 * 64];
	uint32_t w[5 * 64 / 16];

	rh_rng_seed(51);
	for (size_t i = 0; i < rows * k; i++)
		c[i] = (int8_t)rh_rng_int(-1, 1);
	cr_assert_eq(dg_ref_pack_ternary(c, w, rows, k), DG_OK);
	cr_assert_eq(dg_ref_unpack_ternary(w, back, rows, k), DG_OK);
	cr_assert_eq(memcmp(c, back, sizeof(c)), 0);
	for (size_t i = 0; i < rows * k; i++)
		c[i] = rh_rng_int(0, 1) ? 1 : -1;
	cr_assert_eq(dg_ref_pack_sign1(c, w, rows, k), DG_OK);
	cr_assert_eq(dg_ref_unpack_sign1(w, back, rows, k), DG_OK);
	cr_assert_eq(memcmp(c, back, sizeof(c)), 0);
}

Test(unpack, bad_args)
{
	uint32_t w[2] = { 0, 0 };
	int8_t c[64];

	cr_assert_eq(dg_ref_unpack_ternary(NULL, c, 1, 16), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_ternary(w, NULL, 1, 16), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_ternary(w, c, 1, 8), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_sign1(w, c, 1, 16), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_sign1(w, c, 1, 0), DG_ERR_INVALID_ARG);
}

/* --- bad arguments of the grad refs ---------------------------------------- */

Test(grad_refs, bad_args)
{
	float g[64] = { 0 }, out[256];
	uint32_t w[256] = { 0 }; /* 2·4·32 f32 weights at most */
	dg_spec s = grad_spec(DG_OP_LOWRANK_GRAD_INPUT, 2, 1, 32, 4);

	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, 1, 1), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_input(NULL, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, NULL, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, NULL, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, NULL, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, -1, 1), DG_ERR_INVALID_ARG);
	/* the wrong op's spec */
	cr_assert_eq(dg_ref_lowrank_grad_weight(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	s.in_heads = 3;
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	/* sign1 packs 32 along embd: embd 16 is refused */
	s = grad_spec(DG_OP_LOWRANK_GRAD_INPUT, 1, 1, 16, 4);
	s.weight = DG_FMT_SIGN1;
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	/* an act format as the weight */
	s.weight = DG_FMT_UINT8POS;
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	/* decoder: ternary packs 16 along latent */
	s = grad_spec(DG_OP_DECODER_GRAD_INPUT, 1, 1, 4, 8);
	s.weight = DG_FMT_TERNARY;
	cr_assert_eq(dg_ref_decoder_grad_input(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	s = grad_spec(DG_OP_DECODER_GRAD_WEIGHT, 1, 1, 4, 8);
	s.act = DG_FMT_TERNARY;
	cr_assert_eq(dg_ref_decoder_grad_weight(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	s.act = DG_FMT_INT4;
	cr_assert_eq(dg_ref_decoder_grad_weight(&s, g, w, 1, out, 1, 1), DG_OK);
}

/* --- _check: messages name the tensor and the expected shape --------------- */

#define FAKE_PTR 0x10000ull /* aligned, non-zero: _check never dereferences */

static void expect_refused(dg_status st, dg_status want, const char *msg,
			   const char *part1, const char *part2)
{
	cr_assert_eq(st, want, "status %d, message: %s", st, msg);
	cr_assert(strstr(msg, part1), "message '%s' lacks '%s'", msg, part1);
	if (part2)
		cr_assert(strstr(msg, part2), "message '%s' lacks '%s'", msg, part2);
}

Test(check, lowrank_grad_input)
{
	char msg[512];
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_GRAD_INPUT);
	s.heads = 4;
	s.in_heads = 1;
	s.embd = 256;
	s.latent = 64;
	s.weight = DG_FMT_INT8;
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, FAKE_PTR, 2, 4, 3, 64);
	dg_tensor w = dg_tensor_3d("w", DG_FMT_INT8, FAKE_PTR, 4, 64, 256);
	w.scale = FAKE_PTR;
	dg_tensor gx = dg_tensor_4d("grad_x", DG_FMT_F32, FAKE_PTR, 2, 1, 3, 256);
	dg_lowrank_grad_input_args a = { .grad = &g, .w = &w, .grad_x = &gx };

	cr_assert_eq(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* K splits: 0 (the runtime's choice) and 1 to 64 forced; past them
	 * refused, naming the field and the range */
	a.splits = 64;
	cr_assert_eq(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	a.splits = 65;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "splits 65", "1 to 64");
	a.splits = -1;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "dg_lowrank_grad_input: splits -1", "0 (the runtime picks)");
	a.splits = 0;
	a.w = NULL;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w", "(4, 64, 256)");
	a.w = &w;
	w.scale = 0;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w", "scale");
	w.scale = FAKE_PTR;
	w.shape[1] = 65;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w: expected", "(4, 64, 256)");
	w.shape[1] = 64;
	gx.shape[1] = 4; /* Hin is 1 */
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad_x", "(2, 1, 3, 256)");
	gx.shape[1] = 1;
	g.fmt = DG_FMT_BF16;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad", "f32");
	g.fmt = DG_FMT_F32;
	s.op = DG_OP_LOWRANK_FWD;
	expect_refused(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_SPEC, msg, "lowrank_grad_input", NULL);
	s.op = DG_OP_LOWRANK_GRAD_INPUT;
	s.latent = 6;
	cr_assert_eq(dg_lowrank_grad_input_check(&s, &a, msg, sizeof(msg)),
		     DG_ERR_INVALID_SPEC, "%s", msg);
	s.latent = 64;
	cr_assert_eq(dg_lowrank_grad_input_check(&s, NULL, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
}

Test(check, lowrank_grad_weight)
{
	char msg[512];
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_GRAD_WEIGHT);
	s.heads = 2;
	s.in_heads = 2;
	s.embd = 32;
	s.latent = 16;
	s.act = DG_FMT_UINT8POS;
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, FAKE_PTR, 2, 2, 5, 16);
	dg_tensor x = dg_tensor_4d("x", DG_FMT_UINT8POS, FAKE_PTR, 2, 2, 5, 32);
	x.scale = FAKE_PTR;
	dg_tensor gw = dg_tensor_3d("grad_w", DG_FMT_F32, FAKE_PTR, 2, 16, 32);
	dg_lowrank_grad_weight_args a = { .grad = &g, .x = &x, .grad_w = &gw, .accumulate = true };

	cr_assert_eq(dg_lowrank_grad_weight_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	x.shape[2] = 4; /* T differs from grad's */
	expect_refused(dg_lowrank_grad_weight_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "x", "(2, 2, 5, 32)");
	x.shape[2] = 5;
	x.fmt = DG_FMT_INT8;
	expect_refused(dg_lowrank_grad_weight_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "x", "uint8pos");
	x.fmt = DG_FMT_UINT8POS;
	a.grad_w = NULL;
	expect_refused(dg_lowrank_grad_weight_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad_w", "(2, 16, 32)");
	a.grad_w = &gw;
	g.data = FAKE_PTR + 4; /* misaligned */
	expect_refused(dg_lowrank_grad_weight_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad", "aligned");
}

Test(check, decoder_grads)
{
	char msg[512];
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_GRAD_INPUT);
	s.heads = 2;
	s.embd = 8;
	s.latent = 32;
	s.weight = DG_FMT_SIGN1;
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, FAKE_PTR, 3, 1, 7, 8);
	dg_tensor w = dg_tensor_2d("w", DG_FMT_SIGN1, FAKE_PTR, 8, 64);
	w.scale = FAKE_PTR;
	dg_tensor gy = dg_tensor_4d("grad_y", DG_FMT_F32, FAKE_PTR, 3, 2, 7, 32);
	dg_decoder_grad_input_args a = { &g, &w, &gy };

	cr_assert_eq(dg_decoder_grad_input_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	w.shape[1] = 32;
	expect_refused(dg_decoder_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w", "(8, 64)");
	w.shape[1] = 64;
	g.shape[1] = 2;
	expect_refused(dg_decoder_grad_input_check(&s, &a, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad", "8)");

	dg_spec_init(&s, DG_OP_DECODER_GRAD_WEIGHT);
	s.heads = 2;
	s.embd = 8;
	s.latent = 32;
	s.act = DG_FMT_INT8;
	g.shape[1] = 1;
	dg_tensor y = dg_tensor_4d("y", DG_FMT_INT8, FAKE_PTR, 3, 2, 7, 32);
	dg_tensor gw = dg_tensor_2d("grad_w", DG_FMT_F32, FAKE_PTR, 8, 64);
	dg_decoder_grad_weight_args b = { .grad = &g, .y = &y, .grad_w = &gw };

	cr_assert_eq(dg_decoder_grad_weight_check(&s, &b, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG, "y has no scale: %s", msg);
	cr_assert(strstr(msg, "y"), "%s", msg);
	y.scale = FAKE_PTR;
	cr_assert_eq(dg_decoder_grad_weight_check(&s, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	gw.shape[0] = 64;
	gw.shape[1] = 8;
	expect_refused(dg_decoder_grad_weight_check(&s, &b, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "grad_w", "(8, 64)");
}

Test(check, quantize_weight_and_pack)
{
	char msg[512];
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_WEIGHT);
	s.weight = DG_FMT_TERNARY;
	s.src = DG_FMT_BF16;
	dg_tensor w = dg_tensor_3d("w", DG_FMT_BF16, FAKE_PTR, 4, 8, 32);
	dg_tensor c = dg_tensor_3d("codes", DG_FMT_INT8, FAKE_PTR, 4, 8, 32);
	c.scale = FAKE_PTR;
	dg_quantize_weight_args qa = { .w = &w, .codes = &c };

	cr_assert_eq(dg_quantize_weight_check(&s, &qa, msg, sizeof(msg)), DG_OK, "%s", msg);
	w.fmt = DG_FMT_F32;
	expect_refused(dg_quantize_weight_check(&s, &qa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w", "bf16");
	w.fmt = DG_FMT_BF16;
	c.scale = 0;
	expect_refused(dg_quantize_weight_check(&s, &qa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "codes", "scale");
	c.scale = FAKE_PTR;
	c.shape[2] = 16;
	expect_refused(dg_quantize_weight_check(&s, &qa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "codes", "(4, 8, 32)");
	qa.w = NULL;
	expect_refused(dg_quantize_weight_check(&s, &qa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "w", NULL);

	dg_spec_init(&s, DG_OP_PACK_SIGN1);
	s.embd = 64;
	dg_tensor cc = dg_tensor_2d("codes", DG_FMT_INT8, FAKE_PTR, 5, 64);
	dg_tensor p = dg_tensor_2d("packed", DG_FMT_SIGN1, FAKE_PTR, 5, 64);
	dg_pack_weight_args pa = { .codes = &cc, .packed = &p };
	dg_pack_weight_args ua = { .codes = &cc, .packed = &p, .unpack = true };

	cr_assert_eq(dg_pack_weight_check(&s, &pa, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_pack_weight_check(&s, &ua, msg, sizeof(msg)), DG_OK, "%s", msg);
	p.fmt = DG_FMT_TERNARY;
	expect_refused(dg_pack_weight_check(&s, &pa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "packed", "sign1");
	p.fmt = DG_FMT_SIGN1;
	p.shape[0] = 4;
	expect_refused(dg_pack_weight_check(&s, &pa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "packed", "(5, 64)");
	p.shape[0] = 5;
	cc.shape[1] = 32;
	expect_refused(dg_pack_weight_check(&s, &pa, msg, sizeof(msg)),
		       DG_ERR_INVALID_ARG, msg, "codes", "64)");
	s.op = DG_OP_PACK_I8X4;
	cr_assert_eq(dg_pack_weight_check(&s, &pa, msg, sizeof(msg)),
		     DG_ERR_INVALID_SPEC);
}
