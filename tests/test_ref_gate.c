/*
 * The gate and step ops' CPU references (runtime/ref/gate.c, step.c):
 *   - gate_fwd_op / gate_bwd_op on f32 are dg_ref_gate_fwd / _bwd (the CPU
 *     model's) bit for bit, bwd with the ReLU mask of ys on dys; bf16 is
 *     the f32 result of the widened inputs rounded once; in place (dys over
 *     dxy) equals out of place; p = 0 keeps everything; the mask drops
 *     about p of the elements and changes with (seed, step, layer);
 *   - bf16 gradients (gate_bwd's out, add_mask's out and src): read
 *     exactly, every result the f32 one rounded to nearest even once, in
 *     place too;
 *   - add_mask, add3 and transpose against straightforward loops, with
 *     hand-worked cases, in place and aliased;
 *   - every one refuses an act (or a gradient format) it does not take;
 *   - elem0 (a data-parallel rank's rows): a batch's second half with
 *     elem0 = its first half's elements is the full batch's second half,
 *     bit for bit (gate fwd and bwd, the ops f32 and bf16, and
 *     decoder_gate_bwd), its masks dg_dropout_keep at elem0 + i; elem0 0
 *     draws other masks;
 *   - decoder_gate_bwd_ys is lowrank_fwd's ys then decoder_gate_bwd, bit
 *     for bit, for each act and scale granularity, an element worked by
 *     hand, and its bad calls refused without a write.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/ref.h"
#include "dragon/rng.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

static float *rnd(dg_rng *r, size_t n)
{
	float *v = malloc((n ? n : 1) * sizeof(float));
	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = dg_rng_uniform(r, -1.0f, 1.0f);
	return v;
}

/* decoder_gate_bwd, f32 throughout, at H heads of latent L, embd E
 * (validated). */
static dg_spec gate_bwd_spec(int H, int E, int L)
{
	dg_spec dg = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, H, E, L);
	dg.weight = DG_FMT_F32;
	dg.act = DG_FMT_F32;
	dg.out = DG_FMT_F32;
	cr_assert_eq(dg_spec_validate(&dg, NULL, 0), DG_OK);
	return dg;
}

static uint16_t *to_bf16(const float *v, size_t n, float *widened)
{
	uint16_t *h = malloc((n ? n : 1) * 2);
	cr_assert_not_null(h);
	for (size_t i = 0; i < n; i++) {
		h[i] = dg_f32_to_bf16(v[i]);
		widened[i] = dg_bf16_to_f32(h[i]);
	}
	return h;
}

#define N 1037 /* not a multiple of 4 or 8 */

Test(ref_gate, ops_are_the_models_gate_with_the_relu_mask)
{
	dg_rng r;
	dg_rng_seed(&r, 11);
	float *xs = rnd(&r, N), *ys = rnd(&r, N), *dxy = rnd(&r, N);
	float *want = malloc(N * 4), *got = malloc(N * 4), *dxs = malloc(N * 4), *dys = malloc(N * 4);
	float *gdxs = malloc(N * 4), *gdys = malloc(N * 4);
	const float ps[] = { 0.0f, 0.1f, 0.5f };
	for (int k = 0; k < 3; k++) {
		float p = ps[k];
		dg_ref_gate_fwd(xs, ys, N, p, 42, 7, 3, 0, want);
		cr_assert_eq(dg_ref_gate_fwd_op(DG_FMT_F32, xs, ys, N, p, 42, 7, 3, 0, got), DG_OK);
		cr_assert_eq(memcmp(got, want, N * 4), 0, "gate_fwd p=%g", (double)p);
		dg_ref_gate_bwd(dxy, xs, ys, N, p, 42, 7, 3, 0, dxs, dys);
		cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_F32, DG_FMT_F32, dxy, xs, ys, N, p, 42, 7, 3, 0, gdxs, gdys),
			     DG_OK);
		cr_assert_eq(memcmp(gdxs, dxs, N * 4), 0, "gate_bwd dxs p=%g", (double)p);
		size_t masked = 0, dropped = 0;
		for (int i = 0; i < N; i++) {
			float w = ys[i] > 0.0f ? dys[i] : 0.0f;
			cr_assert_eq(memcmp(&gdys[i], &w, 4), 0, "dys[%d] p=%g", i, (double)p);
			masked += ys[i] <= 0.0f;
			bool keep = dg_dropout_keep(42, 7, 3, (uint64_t)i, p);
			dropped += !keep;
			/* hand check: xy = xs·ys/(1−p) where kept */
			float e = keep ? xs[i] * ys[i] * (p > 0 ? 1.0f / (1.0f - p) : 1.0f) : 0.0f;
			cr_assert_eq(got[i], e);
		}
		cr_assert_gt(masked, N / 4, "the ReLU mask was exercised");
		if (p == 0.0f)
			cr_assert_eq(dropped, 0);
		else
			cr_assert(fabs((double)dropped / N - p) < 0.05, "%zu of %d dropped at p=%g", dropped, N,
				  (double)p);
		/* in place: dys over dxy */
		float *io = malloc(N * 4);
		memcpy(io, dxy, N * 4);
		cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_F32, DG_FMT_F32, io, xs, ys, N, p, 42, 7, 3, 0, dxs, io), DG_OK);
		cr_assert_eq(memcmp(io, gdys, N * 4), 0, "in place p=%g", (double)p);
		free(io);
	}
	/* another (seed, step, layer): another mask */
	dg_ref_gate_fwd_op(DG_FMT_F32, xs, ys, N, 0.1f, 42, 7, 3, 0, want);
	dg_ref_gate_fwd_op(DG_FMT_F32, xs, ys, N, 0.1f, 42, 8, 3, 0, got);
	cr_assert_neq(memcmp(got, want, N * 4), 0, "step 8 gave step 7's mask");
	dg_ref_gate_fwd_op(DG_FMT_F32, xs, ys, N, 0.1f, 42, 7, 4, 0, got);
	cr_assert_neq(memcmp(got, want, N * 4), 0, "layer 4 gave layer 3's mask");
	free(xs), free(ys), free(dxy), free(want), free(got), free(dxs), free(dys), free(gdxs), free(gdys);
}

Test(ref_gate, bf16_rounds_the_f32_result_once)
{
	dg_rng r;
	dg_rng_seed(&r, 12);
	float *xs = rnd(&r, N), *ys = rnd(&r, N), *dxy = rnd(&r, N);
	float *wx = malloc(N * 4), *wy = malloc(N * 4), *f = malloc(N * 4);
	float *dxs = malloc(N * 4), *dys = malloc(N * 4), *bdxs = malloc(N * 4), *bdys = malloc(N * 4);
	uint16_t *hx = to_bf16(xs, N, wx), *hy = to_bf16(ys, N, wy), *hxy = malloc(N * 2);
	dg_ref_gate_fwd(wx, wy, N, 0.1f, 1, 2, 3, 0, f);
	cr_assert_eq(dg_ref_gate_fwd_op(DG_FMT_BF16, hx, hy, N, 0.1f, 1, 2, 3, 0, hxy), DG_OK);
	for (int i = 0; i < N; i++)
		cr_assert_eq(hxy[i], dg_f32_to_bf16(f[i]), "xy[%d]", i);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_F32, DG_FMT_F32, dxy, wx, wy, N, 0.1f, 1, 2, 3, 0, dxs, dys), DG_OK);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_BF16, DG_FMT_F32, dxy, hx, hy, N, 0.1f, 1, 2, 3, 0, bdxs, bdys),
		     DG_OK);
	cr_assert_eq(memcmp(dxs, bdxs, N * 4), 0);
	cr_assert_eq(memcmp(dys, bdys, N * 4), 0);
	/* bf16 gradients: dxy read exactly (the f32 run of its widened values),
	 * dxs and dys that run's results rounded once; in place too */
	float *wd = malloc(N * 4);
	uint16_t *hd = to_bf16(dxy, N, wd), *gxs = malloc(N * 2), *gys = malloc(N * 2), *io = malloc(N * 2);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_BF16, DG_FMT_F32, wd, hx, hy, N, 0.1f, 1, 2, 3, 0, dxs, dys), DG_OK);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_BF16, DG_FMT_BF16, hd, hx, hy, N, 0.1f, 1, 2, 3, 0, gxs, gys), DG_OK);
	size_t nonzero = 0;
	for (int i = 0; i < N; i++) {
		cr_assert_eq(gxs[i], dg_f32_to_bf16(dxs[i]), "dxs[%d]", i);
		cr_assert_eq(gys[i], dg_f32_to_bf16(dys[i]), "dys[%d]", i);
		nonzero += gys[i] != 0;
	}
	cr_assert_gt(nonzero, N / 4);
	memcpy(io, hd, N * 2);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_BF16, DG_FMT_BF16, io, hx, hy, N, 0.1f, 1, 2, 3, 0, gxs, io), DG_OK);
	cr_assert_eq(memcmp(io, gys, N * 2), 0, "bf16 in place");
	cr_assert_eq(dg_ref_gate_fwd_op(DG_FMT_INT8, hx, hy, N, 0.1f, 1, 2, 3, 0, hxy), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_INT8, DG_FMT_F32, dxy, hx, hy, N, 0.1f, 1, 2, 3, 0, dxs, NULL),
		     DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_BF16, DG_FMT_INT8, dxy, hx, hy, N, 0.1f, 1, 2, 3, 0, dxs, NULL),
		     DG_ERR_INVALID_ARG);
	free(xs), free(ys), free(dxy), free(wx), free(wy), free(f), free(dxs), free(dys), free(bdxs);
	free(bdys), free(hx), free(hy), free(hxy), free(wd), free(hd), free(gxs), free(gys), free(io);
}

Test(ref_gate, add_mask_against_a_loop)
{
	/* hand-worked: xs > 0 keeps dxs + other, else 0 (xs = 0 is masked) */
	const float d[4] = { 1.0f, 2.0f, 3.0f, -4.0f }, o[4] = { 0.5f, 0.25f, -3.0f, 1.0f };
	const float x[4] = { 1.0f, 0.0f, 2.0f, -1.0f }, w[4] = { 1.5f, 0.0f, 0.0f, 0.0f };
	float out[4];
	cr_assert_eq(dg_ref_add_mask(DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, d, o, x, 4, out), DG_OK);
	cr_assert_eq(memcmp(out, w, sizeof(w)), 0);
	dg_rng r;
	dg_rng_seed(&r, 13);
	float *dxs = rnd(&r, N), *other = rnd(&r, N), *xs = rnd(&r, N), *wx = malloc(N * 4);
	float *got = malloc(N * 4), *io = malloc(N * 4);
	uint16_t *hx = to_bf16(xs, N, wx);
	for (int a = 0; a < 2; a++) {
		cr_assert_eq(dg_ref_add_mask(a ? DG_FMT_BF16 : DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, dxs, other,
					     a ? (void *)hx : (void *)xs, N, got), DG_OK);
		for (int i = 0; i < N; i++) {
			float xv = a ? wx[i] : xs[i];
			float e = xv > 0.0f ? dxs[i] + other[i] : 0.0f;
			cr_assert_eq(memcmp(&got[i], &e, 4), 0, "add_mask[%d]", i);
		}
		memcpy(io, dxs, N * 4); /* in place */
		cr_assert_eq(dg_ref_add_mask(a ? DG_FMT_BF16 : DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, io, other,
					     a ? (void *)hx : (void *)xs, N, io), DG_OK);
		cr_assert_eq(memcmp(io, got, N * 4), 0);
	}
	/* bf16 dxs (out), other f32 or bf16 (src): widened exactly, the f32
	 * sum rounded once; in place */
	float *wd = malloc(N * 4), *wo = malloc(N * 4);
	uint16_t *hd = to_bf16(dxs, N, wd), *ho = to_bf16(other, N, wo), *hg = malloc(N * 2), *hio = malloc(N * 2);
	for (int ob = 0; ob < 2; ob++) {
		cr_assert_eq(dg_ref_add_mask(DG_FMT_BF16, DG_FMT_BF16, ob ? DG_FMT_BF16 : DG_FMT_F32, hd,
					     ob ? (void *)ho : (void *)other, hx, N, hg), DG_OK);
		size_t kept = 0;
		for (int i = 0; i < N; i++) {
			float e = wx[i] > 0.0f ? wd[i] + (ob ? wo[i] : other[i]) : 0.0f;
			cr_assert_eq(hg[i], dg_f32_to_bf16(e), "add_mask bf16 other %s [%d]", ob ? "bf16" : "f32", i);
			kept += wx[i] > 0.0f;
		}
		cr_assert_gt(kept, N / 4);
		memcpy(hio, hd, N * 2);
		cr_assert_eq(dg_ref_add_mask(DG_FMT_BF16, DG_FMT_BF16, ob ? DG_FMT_BF16 : DG_FMT_F32, hio,
					     ob ? (void *)ho : (void *)other, hx, N, hio), DG_OK);
		cr_assert_eq(memcmp(hio, hg, N * 2), 0, "bf16 in place");
	}
	cr_assert_eq(dg_ref_add_mask(DG_FMT_INT8, DG_FMT_F32, DG_FMT_F32, dxs, other, xs, N, got), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_add_mask(DG_FMT_F32, DG_FMT_INT8, DG_FMT_F32, dxs, other, xs, N, got), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_add_mask(DG_FMT_F32, DG_FMT_F32, DG_FMT_UINT8POS, dxs, other, xs, N, got),
		     DG_ERR_INVALID_ARG);
	free(dxs), free(other), free(xs), free(wx), free(got), free(io), free(hx);
	free(wd), free(wo), free(hd), free(ho), free(hg), free(hio);
}

Test(ref_gate, add3_against_a_loop_in_its_order)
{
	/* (a + b) + c, not a + (b + c): 1 + 2^-24 + 2^-24 rounds to 1 this
	 * way (each sum a tie to even), to 1 + 2^-23 the other */
	const float a[1] = { 1.0f }, b[1] = { 0x1p-24f }, c[1] = { 0x1p-24f };
	float out[1];
	dg_ref_add3(a, b, c, 1, out);
	cr_assert_eq(out[0], 1.0f);
	cr_assert_neq(out[0], a[0] + (b[0] + c[0]));
	dg_rng r;
	dg_rng_seed(&r, 14);
	float *x = rnd(&r, N), *y = rnd(&r, N), *z = rnd(&r, N), *got = malloc(N * 4);
	dg_ref_add3(x, y, z, N, got);
	for (int i = 0; i < N; i++) {
		float e = (x[i] + y[i]) + z[i];
		cr_assert_eq(memcmp(&got[i], &e, 4), 0, "add3[%d]", i);
	}
	dg_ref_add3(x, y, z, N, x); /* out aliases a */
	cr_assert_eq(memcmp(x, got, N * 4), 0);
	free(x), free(y), free(z), free(got);
}

Test(ref_gate, transpose_against_a_loop)
{
	/* hand-worked: in (1, 2, 3) = [[0 1 2] [3 4 5]] → out (1, 3, 2) = [[0 3] [1 4] [2 5]] */
	const float in6[6] = { 0, 1, 2, 3, 4, 5 }, w6[6] = { 0, 3, 1, 4, 2, 5 };
	float o6[6];
	cr_assert_eq(dg_ref_transpose(DG_FMT_F32, in6, 1, 2, 3, o6), DG_OK);
	cr_assert_eq(memcmp(o6, w6, sizeof(w6)), 0);
	const int R = 3, E = 36, L = 13;
	dg_rng r;
	dg_rng_seed(&r, 15);
	float *in = rnd(&r, (size_t)R * E * L), *got = malloc((size_t)R * E * L * 4);
	uint16_t *hb = malloc((size_t)R * E * L * 2);
	cr_assert_eq(dg_ref_transpose(DG_FMT_F32, in, R, E, L, got), DG_OK);
	cr_assert_eq(dg_ref_transpose(DG_FMT_BF16, in, R, E, L, hb), DG_OK);
	for (int k = 0; k < R; k++)
		for (int l = 0; l < L; l++)
			for (int e = 0; e < E; e++) {
				size_t o = ((size_t)k * L + l) * E + e;
				float v = in[((size_t)k * E + e) * L + l];
				cr_assert_eq(got[o], v, "(%d, %d, %d)", k, l, e);
				cr_assert_eq(hb[o], dg_f32_to_bf16(v), "bf16 (%d, %d, %d)", k, l, e);
			}
	/* the way back (E and L swapped) gives the input again */
	float *back = malloc((size_t)R * E * L * 4);
	cr_assert_eq(dg_ref_transpose(DG_FMT_F32, got, R, L, E, back), DG_OK);
	cr_assert_eq(memcmp(back, in, (size_t)R * E * L * 4), 0);
	cr_assert_eq(dg_ref_transpose(DG_FMT_INT8, in, R, E, L, got), DG_ERR_INVALID_ARG);
	free(in), free(got), free(hb), free(back);
}

/* decoder_gate_bwd's reference is decoder_grad_input (out f32) followed by
 * gate_bwd (f32 gradients), bit for bit; out=bf16 rounds that once; bad
 * calls are refused. */
Test(ref_gate, decoder_gate_bwd_is_decoder_grad_input_then_gate_bwd)
{
	enum { B = 2, T = 5, H = 3, E = 12, L = 10 };
	const size_t n = (size_t)B * H * T * L;
	dg_rng r;
	dg_rng_seed(&r, 19);
	float *grad = rnd(&r, (size_t)B * T * E), *w = rnd(&r, (size_t)E * H * L);
	float *xs = rnd(&r, n), *ys = rnd(&r, n);
	float *dxy = malloc(n * 4), *wdxs = malloc(n * 4), *wdys = malloc(n * 4);
	float *gdxs = malloc(n * 4), *gdys = malloc(n * 4);
	uint16_t *bdxs = malloc(n * 2), *bdys = malloc(n * 2);
	dg_spec gi = dg_test_spec_sized(DG_OP_DECODER_GRAD_INPUT, H, E, L), dg;
	gi.weight = DG_FMT_F32;
	gi.out = DG_FMT_F32;
	dg = gate_bwd_spec(H, E, L);
	const float ps[] = { 0.0f, 0.25f };
	for (int k = 0; k < 2; k++) {
		float p = ps[k];
		cr_assert_eq(dg_ref_decoder_grad_input(&gi, grad, w, 1.0f, dxy, B, T), DG_OK);
		cr_assert_eq(dg_ref_gate_bwd_op(DG_FMT_F32, DG_FMT_F32, dxy, xs, ys, (int64_t)n, p, 5, 2, 1, 0,
						wdxs, wdys), DG_OK);
		dg.out = DG_FMT_F32;
		cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, p, 5, 2, 1, 0, gdxs, gdys), DG_OK);
		cr_assert_eq(memcmp(gdxs, wdxs, n * 4), 0, "dxs p=%g", (double)p);
		cr_assert_eq(memcmp(gdys, wdys, n * 4), 0, "dys p=%g", (double)p);
		dg.out = DG_FMT_BF16;
		cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, p, 5, 2, 1, 0, bdxs, bdys), DG_OK);
		for (size_t i = 0; i < n; i++) {
			cr_assert_eq(bdxs[i], dg_f32_to_bf16(wdxs[i]), "bf16 dxs[%zu]", i);
			cr_assert_eq(bdys[i], dg_f32_to_bf16(wdys[i]), "bf16 dys[%zu]", i);
		}
	}
	/* a hand check of one element: (b 1, h 2, t 3, l 4), p 0 */
	double sum = 0;
	for (int d = 0; d < E; d++)
		sum += (double)grad[(1 * T + 3) * E + d] * w[(size_t)d * H * L + 2 * L + 4];
	size_t i = (((size_t)1 * H + 2) * T + 3) * L + 4;
	dg.out = DG_FMT_F32;
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, 0.0f, 5, 2, 1, 0, gdxs, gdys), DG_OK);
	cr_assert_eq(gdxs[i], (float)sum * ys[i]);
	cr_assert_eq(gdys[i], ys[i] > 0.0f ? (float)sum * xs[i] : 0.0f);
	/* refusals */
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, 1.0f, 5, 2, 1, 0, gdxs, gdys),
		     DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&gi, grad, w, xs, ys, B, T, 0.0f, 5, 2, 1, 0, gdxs, gdys),
		     DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, 0.0f, 5, 2, 1, 0, gdxs, NULL),
		     DG_ERR_INVALID_ARG);
	free(grad), free(w), free(xs), free(ys), free(dxy), free(wdxs), free(wdys), free(gdxs), free(gdys);
	free(bdxs), free(bdys);
}

/* ---- decoder_gate_bwd_ys ----------------------------------------------------------
 * Its inputs at (B, T, H, E, L) = (2, 5, 3, 12, 10) (L not a multiple of
 * 4: the op takes any latent): grad (B,1,T,E) f32, w (E, H·L) bf16, xs
 * (B,H,T,L) in f32 and rounded to bf16, aq (B,H,T,E) as int8 and as
 * uint8pos codes, ev (H,L,E) int8, sa a scale a row (b·H + h)·T + t, sw one
 * a channel h·L + l, each row's and channel's its own. */
enum { YB = 2, YT = 5, YH = 3, YE = 12, YL = 10 };

typedef struct ys_in {
	float *grad;    /* (B,1,T,E) f32 */
	uint16_t *w;    /* (E, H·L) bf16 */
	float *xs;      /* (B,H,T,L) f32 */
	uint16_t *xs16; /* (B,H,T,L) bf16, xs rounded */
	int8_t *aq8;    /* (B,H,T,E) int8 codes */
	uint8_t *aqu;   /* (B,H,T,E) uint8pos codes */
	int8_t *ev;     /* (H,L,E) int8 codes */
	float *sa;      /* (B·H·T) a row's scale; sa[0] the tensor's */
	float *sw;      /* (H·L) a channel's scale; sw[0] the tensor's */
} ys_in;

static ys_in ys_make(uint64_t seed)
{
	const size_t n = (size_t)YB * YH * YT * YL, na = (size_t)YB * YH * YT * YE;
	ys_in in;
	dg_rng r;
	dg_rng_seed(&r, seed);
	const size_t nw = (size_t)YE * YH * YL;
	in.grad = rnd(&r, (size_t)YB * YT * YE);
	float *w = rnd(&r, nw), *wide = malloc((nw > n ? nw : n) * 4);
	cr_assert_not_null(wide);
	in.w = to_bf16(w, nw, wide);
	in.xs = rnd(&r, n);
	in.xs16 = to_bf16(in.xs, n, wide);
	free(w);
	free(wide);
	in.aq8 = malloc(na);
	in.aqu = malloc(na);
	in.ev = malloc((size_t)YH * YL * YE);
	cr_assert(in.aq8 && in.aqu && in.ev);
	dg_rng_fill(&r, DG_FMT_INT8, in.aq8, na);
	dg_rng_fill(&r, DG_FMT_UINT8POS, in.aqu, na);
	dg_rng_fill(&r, DG_FMT_INT8, in.ev, (size_t)YH * YL * YE);
	in.sa = malloc((size_t)YB * YH * YT * sizeof(float));
	in.sw = malloc((size_t)YH * YL * sizeof(float));
	cr_assert(in.sa && in.sw);
	for (int i = 0; i < YB * YH * YT; i++)
		in.sa[i] = 0.004f + 0.0005f * (float)(i % 7);
	for (int i = 0; i < YH * YL; i++)
		in.sw[i] = 0.003f + 0.00025f * (float)(i % 5);
	return in;
}

static void ys_free(ys_in *in)
{
	free(in->grad), free(in->xs), free(in->w), free(in->xs16), free(in->aq8), free(in->ev);
	free(in->aqu), free(in->sa), free(in->sw);
}

/* decoder_gate_bwd_ys of act, the scales, src (out the same) and relu thr. */
static dg_spec ys_spec(dg_fmt act, dg_scale_gran as, dg_scale_gran ws, dg_fmt src, float thr)
{
	dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD_YS, YH, YE, YL);
	s.act = act;
	s.ascale = as;
	s.wscale = ws;
	s.src = src;
	s.out = src;
	s.relu = true;
	s.relu_thr = thr;
	char m[256];
	cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
	return s;
}

/* The two ops the reference stands for, called one after the other:
 * lowrank_fwd (in_heads = heads, out src) into ys, then decoder_gate_bwd
 * (w bf16, act src) on it. */
static void ys_chain(const dg_spec *s, const ys_in *in, float p, void *dxs, void *dys)
{
	const size_t n = (size_t)YB * YH * YT * YL;
	dg_spec ly = dg_test_spec_sized(DG_OP_LOWRANK_FWD, YH, YE, YL);
	ly.in_heads = YH;
	ly.act = s->act;
	ly.weight = DG_FMT_INT8;
	ly.ascale = s->ascale;
	ly.wscale = s->wscale;
	ly.relu = s->relu;
	ly.relu_thr = s->relu_thr;
	ly.out = s->src;
	void *ys = malloc(n * 4);
	cr_assert_not_null(ys);
	dg_ref_lowrank_args a = { .x = s->act == DG_FMT_INT8 ? (const void *)in->aq8 : (const void *)in->aqu,
				  .w = in->ev, .sa = in->sa[0], .sw = in->sw[0],
				  .sa_v = s->ascale == DG_SCALE_TOKEN ? in->sa : NULL,
				  .sw_v = s->wscale == DG_SCALE_CHANNEL ? in->sw : NULL, .out = ys, .batch = YB,
				  .time = YT };
	cr_assert_eq(dg_ref_lowrank_fwd(&ly, &a), DG_OK);
	dg_spec dg = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, YH, YE, YL);
	dg.weight = DG_FMT_BF16;
	dg.act = s->src;
	dg.out = s->out;
	const void *xs = s->src == DG_FMT_BF16 ? (const void *)in->xs16 : (const void *)in->xs;
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, in->grad, in->w, xs, ys, YB, YT, p, 5, 2, 1, 0, dxs, dys),
		     DG_OK);
	free(ys);
}

static dg_status ys_run(const dg_spec *s, const ys_in *in, float p, void *dxs, void *dys)
{
	const void *aq = s->act == DG_FMT_INT8 ? (const void *)in->aq8 : (const void *)in->aqu;
	const void *xs = s->src == DG_FMT_BF16 ? (const void *)in->xs16 : (const void *)in->xs;
	return dg_ref_decoder_gate_bwd_ys(s, in->grad, in->w, xs, aq, in->sa, in->ev, in->sw, YB, YT, p, 5, 2, 1,
					  0, dxs, dys);
}

/* decoder_gate_bwd_ys's reference is lowrank_fwd's ys then decoder_gate_bwd,
 * bit for bit, with the dropout on, for int8 and uint8pos codes, a scale a
 * tensor or a row, a tensor or a channel, src (and out) f32 and bf16, and
 * ReLU thresholds 0 and 0.25; each scale's granularity changes the result
 * (so the comparison sees which one was read), the ReLU zeroes some ys. */
Test(ref_gate, decoder_gate_bwd_ys_is_lowrank_fwd_then_decoder_gate_bwd)
{
	const size_t n = (size_t)YB * YH * YT * YL;
	ys_in in = ys_make(23);
	float *gdxs = malloc(n * 4), *gdys = malloc(n * 4), *wdxs = malloc(n * 4), *wdys = malloc(n * 4);
	float *tdxs = malloc(n * 4); /* per-tensor scales' dxs */
	cr_assert(gdxs && gdys && wdxs && wdys && tdxs);
	const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_UINT8POS }, srcs[] = { DG_FMT_F32, DG_FMT_BF16 };
	const float thrs[] = { 0.0f, 0.25f };
	int runs = 0;
	for (int ia = 0; ia < 2; ia++)
		for (int is = 0; is < 2; is++)
			for (int it = 0; it < 2; it++)
				for (int g = 0; g < 4; g++) {
					dg_scale_gran as = g & 1 ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
					dg_scale_gran ws = g & 2 ? DG_SCALE_CHANNEL : DG_SCALE_TENSOR;
					dg_spec s = ys_spec(acts[ia], as, ws, srcs[is], thrs[it]);
					char text[DG_SPEC_TEXT_MAX];
					dg_spec_to_string(&s, text, sizeof(text));
					const size_t bytes = n * (srcs[is] == DG_FMT_BF16 ? 2 : 4);
					memset(gdxs, 0x5a, n * 4), memset(gdys, 0x5a, n * 4);
					memset(wdxs, 0xa5, n * 4), memset(wdys, 0xa5, n * 4);
					cr_assert_eq(ys_run(&s, &in, 0.1f, gdxs, gdys), DG_OK, "%s", text);
					ys_chain(&s, &in, 0.1f, wdxs, wdys);
					cr_assert_eq(memcmp(gdxs, wdxs, bytes), 0, "%s: dxs", text);
					cr_assert_eq(memcmp(gdys, wdys, bytes), 0, "%s: dys", text);
					if (g == 0)
						memcpy(tdxs, gdxs, bytes);
					else
						cr_assert_neq(memcmp(tdxs, gdxs, bytes), 0,
							      "%s: the same dxs as per-tensor scales", text);
					/* the dropout and the ReLU each zero some dys */
					size_t zero = 0;
					for (size_t i = 0; i < n; i++)
						zero += (srcs[is] == DG_FMT_BF16
								 ? dg_bf16_to_f32(((uint16_t *)gdys)[i])
								 : gdys[i]) == 0.0f;
					cr_assert(zero > 0 && zero < n, "%s: %zu of %zu dys zero", text, zero, n);
					runs++;
				}
	cr_assert_eq(runs, 32);
	free(gdxs), free(gdys), free(wdxs), free(wdys), free(tdxs);
	ys_free(&in);
}

/* One element worked by hand, without the other references: (b 1, h 2,
 * t 3, l 4) of int8 codes, a scale a row and a channel, f32, thr 0.25,
 * p 0: ys = max((float)Σ aq·ev · (sa·sw) − thr, 0), dxy = (float)Σ
 * grad·w in double, dxs = dxy·ys, dys = ys > 0 ? dxy·xs : 0. */
Test(ref_gate, decoder_gate_bwd_ys_by_hand)
{
	const size_t n = (size_t)YB * YH * YT * YL;
	ys_in in = ys_make(29);
	float *dxs = malloc(n * 4), *dys = malloc(n * 4);
	cr_assert(dxs && dys);
	dg_spec s = ys_spec(DG_FMT_INT8, DG_SCALE_TOKEN, DG_SCALE_CHANNEL, DG_FMT_F32, 0.25f);
	cr_assert_eq(ys_run(&s, &in, 0.0f, dxs, dys), DG_OK);
	int kept = 0, masked = 0;
	for (int l = 0; l < YL; l++) {
		const int b = 1, h = 2, t = 3, row = (b * YH + h) * YT + t;
		int32_t isum = 0;
		for (int e = 0; e < YE; e++)
			isum += in.aq8[(size_t)row * YE + e] * in.ev[((size_t)h * YL + l) * YE + e];
		float y = (float)isum * (in.sa[row] * in.sw[h * YL + l]);
		y = y - 0.25f;
		y = y > 0.0f ? y : 0.0f;
		double sum = 0;
		for (int e = 0; e < YE; e++)
			sum += (double)in.grad[(b * YT + t) * YE + e] *
			       dg_bf16_to_f32(in.w[(size_t)e * YH * YL + (size_t)h * YL + l]);
		const size_t i = (size_t)row * YL + l;
		cr_assert_eq(dxs[i], (float)sum * y, "dxs l %d", l);
		cr_assert_eq(dys[i], y > 0.0f ? (float)sum * in.xs[i] : 0.0f, "dys l %d", l);
		kept += y > 0.0f;
		masked += y == 0.0f;
	}
	cr_assert(kept > 0 && masked > 0, "the row's ys: %d kept, %d masked by the ReLU", kept, masked);
	free(dxs), free(dys);
	ys_free(&in);
}

/* Expects spec's call on in refused (DG_ERR_INVALID_ARG). */
static void ys_refused(const dg_spec *spec, const ys_in *in, void *dxs, void *dys, const char *what)
{
	cr_assert_eq(dg_ref_decoder_gate_bwd_ys(spec, in->grad, in->w, in->xs16, in->aq8, in->sa, in->ev, in->sw,
						 YB, YT, 0.1f, 5, 2, 1, 0, dxs, dys),
		     DG_ERR_INVALID_ARG, "%s: not refused", what);
}

/* Bad calls are refused (DG_ERR_INVALID_ARG) and write nothing: a missing
 * tensor or scale, a negative size, p outside [0, 1), another op's spec,
 * formats and scales the op does not take. */
Test(ref_gate, decoder_gate_bwd_ys_refuses_bad_calls)
{
	const size_t n = (size_t)YB * YH * YT * YL;
	ys_in in = ys_make(31);
	uint16_t *dxs = malloc(n * 2), *dys = malloc(n * 2), *okx = malloc(n * 2), *oky = malloc(n * 2);
	cr_assert(dxs && dys && okx && oky);
	memset(dxs, 0x5a, n * 2);
	memset(dys, 0x5a, n * 2);
	const dg_spec s = ys_spec(DG_FMT_INT8, DG_SCALE_TOKEN, DG_SCALE_CHANNEL, DG_FMT_BF16, 0.0f);
	const void *g = in.grad, *w = in.w, *xs = in.xs16, *aq = in.aq8, *ev = in.ev;
	const float *sa = in.sa, *sw = in.sw;
	/* the good call, then each argument spoiled */
	cr_assert_eq(dg_ref_decoder_gate_bwd_ys(&s, g, w, xs, aq, sa, ev, sw, YB, YT, 0.1f, 5, 2, 1, 0, okx, oky),
		     DG_OK);
	const struct {
		const char *what;
		const dg_spec *s;
		const void *g, *w, *xs, *aq, *ev;
		const float *sa, *sw;
		int b, t;
		float p;
		void *dxs, *dys;
	} calls[] = {
		{ "spec NULL", NULL, g, w, xs, aq, ev, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "grad NULL", &s, NULL, w, xs, aq, ev, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "w NULL", &s, g, NULL, xs, aq, ev, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "xs NULL", &s, g, w, NULL, aq, ev, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "aq NULL", &s, g, w, xs, NULL, ev, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "ev NULL", &s, g, w, xs, aq, NULL, sa, sw, YB, YT, 0.1f, dxs, dys },
		{ "sa NULL", &s, g, w, xs, aq, ev, NULL, sw, YB, YT, 0.1f, dxs, dys },
		{ "sw NULL", &s, g, w, xs, aq, ev, sa, NULL, YB, YT, 0.1f, dxs, dys },
		{ "dxs NULL", &s, g, w, xs, aq, ev, sa, sw, YB, YT, 0.1f, NULL, dys },
		{ "dys NULL", &s, g, w, xs, aq, ev, sa, sw, YB, YT, 0.1f, dxs, NULL },
		{ "batch -1", &s, g, w, xs, aq, ev, sa, sw, -1, YT, 0.1f, dxs, dys },
		{ "time -1", &s, g, w, xs, aq, ev, sa, sw, YB, -1, 0.1f, dxs, dys },
		{ "p 1", &s, g, w, xs, aq, ev, sa, sw, YB, YT, 1.0f, dxs, dys },
		{ "p -0.1", &s, g, w, xs, aq, ev, sa, sw, YB, YT, -0.1f, dxs, dys },
		{ "p NaN", &s, g, w, xs, aq, ev, sa, sw, YB, YT, NAN, dxs, dys },
	};
	for (size_t k = 0; k < sizeof(calls) / sizeof(calls[0]); k++)
		cr_assert_eq(dg_ref_decoder_gate_bwd_ys(calls[k].s, calls[k].g, calls[k].w, calls[k].xs, calls[k].aq,
							 calls[k].sa, calls[k].ev, calls[k].sw, calls[k].b, calls[k].t,
							 calls[k].p, 5, 2, 1, 0, calls[k].dxs, calls[k].dys),
			     DG_ERR_INVALID_ARG, "%s: not refused", calls[k].what);
	/* specs it does not take, each a field away from s */
	dg_spec b = s;
	b.op = DG_OP_DECODER_GATE_BWD;
	ys_refused(&b, &in, dxs, dys, "op decoder_gate_bwd");
	b = s, b.act = DG_FMT_F32;
	ys_refused(&b, &in, dxs, dys, "act f32");
	b = s, b.act = DG_FMT_INT4;
	ys_refused(&b, &in, dxs, dys, "act int4");
	b = s, b.weight = DG_FMT_TERNARY;
	ys_refused(&b, &in, dxs, dys, "weight ternary (its codes come as int8)");
	b = s, b.src = DG_FMT_INT8;
	ys_refused(&b, &in, dxs, dys, "src int8");
	b = s, b.out = DG_FMT_UINT8POS;
	ys_refused(&b, &in, dxs, dys, "out uint8pos");
	b = s, b.ascale = DG_SCALE_CHANNEL;
	ys_refused(&b, &in, dxs, dys, "ascale channel");
	b = s, b.wscale = DG_SCALE_TOKEN;
	ys_refused(&b, &in, dxs, dys, "wscale token");
	b = s, b.heads = 0;
	ys_refused(&b, &in, dxs, dys, "heads 0");
	b = s, b.embd = 10;
	ys_refused(&b, &in, dxs, dys, "embd 10 (codes four a word)");
	for (size_t i = 0; i < n; i++)
		cr_assert(dxs[i] == 0x5a5a && dys[i] == 0x5a5a, "a refused call wrote element %zu", i);
	free(dxs), free(dys), free(okx), free(oky);
	ys_free(&in);
}

/* A batch of 4 rows of (H, T, L) = (3, 7, 13) (273 elements a row: not
 * whole Philox blocks) and its rows 2..3 alone with elem0 = 2·273: the
 * second half of every result, bit for bit, as N ranks of one batch
 * draw what one process draws. */
Test(ref_gate, elem0_draws_the_global_batchs_masks)
{
	enum { B = 4, H = 3, T = 7, L = 13, E = 12, HB = B / 2 };
	const size_t per = (size_t)H * T * L, n = (size_t)B * per, hn = (size_t)HB * per;
	const uint64_t e0 = (uint64_t)HB * per;
	const float p = 0.25f;
	dg_rng r;
	dg_rng_seed(&r, 31);
	float *xs = rnd(&r, n), *ys = rnd(&r, n), *dxy = rnd(&r, n);
	float *grad = rnd(&r, (size_t)B * T * E), *w = rnd(&r, (size_t)E * H * L);
	float *fxy = malloc(n * 4), *fdxs = malloc(n * 4), *fdys = malloc(n * 4);
	float *hxy = malloc(hn * 4), *hdxs = malloc(hn * 4), *hdys = malloc(hn * 4);
	const float *x2 = xs + hn, *y2 = ys + hn, *d2 = dxy + hn;

	/* the model's gate: forward and backward */
	dg_ref_gate_fwd(xs, ys, (int64_t)n, p, 42, 7, 3, 0, fxy);
	dg_ref_gate_fwd(x2, y2, (int64_t)hn, p, 42, 7, 3, e0, hxy);
	cr_assert_eq(memcmp(hxy, fxy + hn, hn * 4), 0, "gate_fwd: the second half");
	size_t dropped = 0;
	for (size_t i = 0; i < hn; i++) { /* the masks: the global batch's elements */
		bool keep = dg_dropout_keep(42, 7, 3, e0 + i, p);
		cr_assert_eq(hxy[i] == 0.0f, !keep || x2[i] * y2[i] == 0.0f, "element %zu", i);
		dropped += !keep;
	}
	cr_assert_gt(dropped, hn / 8, "the dropout was exercised");
	dg_ref_gate_bwd(dxy, xs, ys, (int64_t)n, p, 42, 7, 3, 0, fdxs, fdys);
	dg_ref_gate_bwd(d2, x2, y2, (int64_t)hn, p, 42, 7, 3, e0, hdxs, hdys);
	cr_assert_eq(memcmp(hdxs, fdxs + hn, hn * 4), 0, "gate_bwd dxs: the second half");
	cr_assert_eq(memcmp(hdys, fdys + hn, hn * 4), 0, "gate_bwd dys: the second half");
	/* elem0 0: the half's own masks, not the global batch's */
	dg_ref_gate_fwd(x2, y2, (int64_t)hn, p, 42, 7, 3, 0, hxy);
	cr_assert_neq(memcmp(hxy, fxy + hn, hn * 4), 0, "elem0 0 drew the second half's masks");

	/* the ops, f32 and bf16 (act and gradients) */
	for (int b = 0; b < 2; b++) {
		dg_fmt f = b ? DG_FMT_BF16 : DG_FMT_F32;
		size_t es = b ? 2 : 4;
		float *wx = malloc(n * 4), *wy = malloc(n * 4), *wd = malloc(n * 4);
		void *hx = b ? (void *)to_bf16(xs, n, wx) : xs, *hy = b ? (void *)to_bf16(ys, n, wy) : ys;
		void *hd = b ? (void *)to_bf16(dxy, n, wd) : dxy;
		char *fo = malloc(n * es), *fx = malloc(n * es), *fy = malloc(n * es);
		char *ho = malloc(hn * es), *hx2 = malloc(hn * es), *hy2 = malloc(hn * es);
		const char *cx = hx, *cy = hy, *cd = hd;
		cr_assert_eq(dg_ref_gate_fwd_op(f, hx, hy, (int64_t)n, p, 42, 7, 3, 0, fo), DG_OK);
		cr_assert_eq(dg_ref_gate_fwd_op(f, cx + hn * es, cy + hn * es, (int64_t)hn, p, 42, 7, 3, e0, ho),
			     DG_OK);
		cr_assert_eq(memcmp(ho, fo + hn * es, hn * es), 0, "gate_fwd_op %s", dg_fmt_name(f));
		cr_assert_eq(dg_ref_gate_bwd_op(f, f, hd, hx, hy, (int64_t)n, p, 42, 7, 3, 0, fx, fy), DG_OK);
		cr_assert_eq(dg_ref_gate_bwd_op(f, f, cd + hn * es, cx + hn * es, cy + hn * es, (int64_t)hn, p, 42,
						7, 3, e0, hx2, hy2), DG_OK);
		cr_assert_eq(memcmp(hx2, fx + hn * es, hn * es), 0, "gate_bwd_op dxs %s", dg_fmt_name(f));
		cr_assert_eq(memcmp(hy2, fy + hn * es, hn * es), 0, "gate_bwd_op dys %s", dg_fmt_name(f));
		if (b)
			free(hx), free(hy), free(hd);
		free(wx), free(wy), free(wd), free(fo), free(fx), free(fy), free(ho), free(hx2), free(hy2);
	}

	/* decoder_gate_bwd: its sums a row are the row's alone */
	dg_spec dg = gate_bwd_spec(H, E, L);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, B, T, p, 42, 7, 3, 0, fdxs, fdys), DG_OK);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad + (size_t)HB * T * E, w, x2, y2, HB, T, p, 42, 7, 3, e0,
					     hdxs, hdys), DG_OK);
	cr_assert_eq(memcmp(hdxs, fdxs + hn, hn * 4), 0, "decoder_gate_bwd dxs: the second half");
	cr_assert_eq(memcmp(hdys, fdys + hn, hn * 4), 0, "decoder_gate_bwd dys: the second half");
	cr_assert_eq(dg_ref_decoder_gate_bwd(&dg, grad + (size_t)HB * T * E, w, x2, y2, HB, T, p, 42, 7, 3, 0,
					     hdxs, hdys), DG_OK);
	cr_assert_neq(memcmp(hdxs, fdxs + hn, hn * 4), 0, "decoder_gate_bwd: elem0 0 drew the global masks");
	free(xs), free(ys), free(dxy), free(grad), free(w), free(fxy), free(fdxs), free(fdys);
	free(hxy), free(hdxs), free(hdys);
}
