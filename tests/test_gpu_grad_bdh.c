/*
 * GPU tests of the four gradient GEMMs at the BDH shape (H 4, E 256,
 * L 8192, B·T 4096; templates/grad.lua, runtime/ops/grad.c), on
 * the default tiles, int8 operands. Skip without a device (gh_open).
 *
 *   - lowrank grad_input on sampled rows;
 *   - lowrank grad_weight in full (its workspace as the op sizes it),
 *     sampled output rows checked against sums over those rows only;
 *   - decoder grad_input and grad_weight, sampled 256-wide row pieces;
 *   - bf16 gradients (the w8a8 step's: src=bf16 of the lowrank grads,
 *     out=bf16 of decoder_grad_input) bitwise against the f32 kernels on
 *     the same tile: a gradient whose values are bf16 already is what the
 *     f32 path stages (its rounding is then exact), so the sums are the
 *     same; a bf16 grad_y is the f32 one rounded to nearest even;
 *   - the sm_90a warpgroup path (bf16 gradient and bf16 w / x) against
 *     the mma.sync tile of the same spec, each one's time printed
 *     (bdh_wgmma_bf16_against_mma; skipped off sm_90); the same for
 *     decoder_grad_weight's (f32 gradient, y bf16 or uint8pos a scale a
 *     token: bdh_wgmma_decoder_grad_weight_against_mma).
 *
 * Outputs start as 0xff bytes (NaN): every element must be written.
 * Tolerance: tests/grad_helpers.h.
 * The small odd shapes are in tests/test_gpu_grad.c.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_helpers.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/gpu/gpu_int.h"

#define BDH_H 4
#define BDH_E 256
#define BDH_L 8192
#define BDH_B 2
#define BDH_T 2048
#define SAMPLES 12

/* Value i of an i8x4 int8 storage. */
static double i8_at(const int8_t *p, size_t i)
{
	return p[i];
}

Test(gpu_grad, bdh_lowrank_grad_input_sampled)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_INPUT); /* H 4, Hin 1, E 256, L 8192, int8 */

	gh_seed(20);
	float *g = gr_rand_f32(ng);
	int8_t *w = gh_rand_storage(DG_FMT_INT8, nw, NULL);
	float *got = gh_xmalloc(nx * 4);
	const float sw = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tw = dg_tensor_3d("w", DG_FMT_INT8, gh_upload(dev, w, nw), BDH_H, BDH_L, BDH_E);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), BDH_B, 1, BDH_T, BDH_E);
	dg_lowrank_grad_input_args a = { .grad = &tg, .w = &tw, .grad_x = &tx };
	gr_grad_input(dev, &sp, &a, "bdh lowrank_grad_input");
	gh_download(dev, got, tx.data, nx * 4);
	gr_expect_written("grad_x", got, nx);

	float want[BDH_E], absum[BDH_E];
	for (int smp = 0; smp < SAMPLES; smp++) {
		int b = gh_int(0, BDH_B - 1), t = smp == 0 ? BDH_T - 1 : gh_int(0, BDH_T - 1);
		double acc[BDH_E] = { 0 }, aacc[BDH_E] = { 0 };
		for (int h = 0; h < BDH_H; h++)
			for (int l = 0; l < BDH_L; l++) {
				double gv = g[(((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l];
				for (int e = 0; e < BDH_E; e++) {
					double term = gv * i8_at(w, ((size_t)h * BDH_L + l) * BDH_E + e);
					acc[e] += term;
					aacc[e] += fabs(term);
				}
			}
		for (int e = 0; e < BDH_E; e++) {
			want[e] = (float)(sw * acc[e]);
			absum[e] = (float)(sw * aacc[e]);
		}
		gr_expect_bf16("bdh grad_x row", got + ((size_t)b * BDH_T + t) * BDH_E, want, absum, BDH_E,
			    gr_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(got);
	gh_close(dev);
}

Test(gpu_grad, bdh_lowrank_grad_weight_sampled)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_WEIGHT); /* act int8 */

	gh_seed(21);
	float *g = gr_rand_f32(ng);
	int8_t *x = gh_rand_storage(DG_FMT_INT8, nx, NULL);
	float *got = gh_xmalloc(nw * 4);
	const float sa = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_INT8, gh_upload(dev, x, nx), BDH_B, 1, BDH_T, BDH_E);
	tx.scale = gh_scalar(dev, sa);
	dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), BDH_H, BDH_L, BDH_E);
	dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw };
	cr_assert_eq(gr_lowrank_grad_weight(dev, &sp, &a, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tw.data, nw * 4);
	gr_expect_written("grad_w", got, nw);

	float want[BDH_E], absum[BDH_E];
	for (int smp = 0; smp < SAMPLES; smp++) {
		int h = gh_int(0, BDH_H - 1), l = smp == 0 ? BDH_L - 1 : gh_int(0, BDH_L - 1);
		double acc[BDH_E] = { 0 }, aacc[BDH_E] = { 0 };
		for (int b = 0; b < BDH_B; b++)
			for (int t = 0; t < BDH_T; t++) {
				double gv = g[(((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l];
				const int8_t *xr = x + ((size_t)b * BDH_T + t) * BDH_E;
				for (int e = 0; e < BDH_E; e++) {
					acc[e] += gv * xr[e];
					aacc[e] += fabs(gv * xr[e]);
				}
			}
		for (int e = 0; e < BDH_E; e++) {
			want[e] = (float)(sa * acc[e]);
			absum[e] = (float)(sa * aacc[e]);
		}
		gr_expect_bf16("bdh grad_w row", got + ((size_t)h * BDH_L + l) * BDH_E, want, absum, BDH_E,
			    gr_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(x);
	free(got);
	gh_close(dev);
}

Test(gpu_grad, bdh_decoder_grads_sampled)
{
	dg_device *dev = gh_open();
	const size_t HL = (size_t)BDH_H * BDH_L, ng = (size_t)BDH_B * BDH_T * BDH_E,
		     ny = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_E * HL;
	const float s = 1.0f / 127;

	gh_seed(22);
	float *g = gr_rand_f32(ng);
	int8_t *w = gh_rand_storage(DG_FMT_INT8, nw, NULL), *y = gh_rand_storage(DG_FMT_INT8, ny, NULL);
	float *gy = gh_xmalloc(ny * 4), *gw = gh_xmalloc(nw * 4);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, 1, BDH_T, BDH_E);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_INT8, gh_upload(dev, w, nw), BDH_E, (int64_t)HL);
	tw.scale = gh_scalar(dev, s);
	dg_tensor tgy = dg_tensor_4d("grad_y", DG_FMT_F32, gh_alloc_ff(dev, ny * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_INPUT);
	dg_decoder_grad_input_args ai = { .grad = &tg, .w = &tw, .grad_y = &tgy };
	cr_assert_eq(dg_decoder_grad_input(dev, &sp, &ai), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gy, tgy.data, ny * 4);
	gr_expect_written("grad_y", gy, ny);

	dg_tensor ty = dg_tensor_4d("y", DG_FMT_INT8, gh_upload(dev, y, ny), BDH_B, BDH_H, BDH_T, BDH_L);
	ty.scale = gh_scalar(dev, s);
	dg_tensor tgw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), BDH_E, (int64_t)HL);
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_WEIGHT);
	dg_decoder_grad_weight_args aw = { .grad = &tg, .y = &ty, .grad_w = &tgw };
	cr_assert_eq(gr_decoder_grad_weight(dev, &sp, &aw, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gw, tgw.data, nw * 4);
	gr_expect_written("decoder grad_w", gw, nw);

	for (int smp = 0; smp < SAMPLES; smp++) {
		/* grad_y[b, h, t, l0 .. l0+255] */
		int b = gh_int(0, BDH_B - 1), h = gh_int(0, BDH_H - 1), t = gh_int(0, BDH_T - 1);
		int l0 = 256 * gh_int(0, BDH_L / 256 - 1);
		float want[256], absum[256];
		for (int j = 0; j < 256; j++) {
			double acc = 0, aacc = 0;
			for (int d = 0; d < BDH_E; d++) {
				double term = (double)g[((size_t)b * BDH_T + t) * BDH_E + d] *
					      w[(size_t)d * HL + (size_t)h * BDH_L + l0 + j];
				acc += term;
				aacc += fabs(term);
			}
			want[j] = (float)(s * acc);
			absum[j] = (float)(s * aacc);
		}
		gr_expect_bf16("bdh grad_y row", gy + (((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l0,
			    want, absum, 256, gr_bound_c(DG_FMT_INT8));
		/* grad_w[d, c0 .. c0+255] */
		int d = smp == 0 ? BDH_E - 1 : gh_int(0, BDH_E - 1);
		size_t c0 = 256 * (size_t)gh_int(0, (int)(HL / 256) - 1);
		double acc[256] = { 0 }, aacc[256] = { 0 };
		for (int bb = 0; bb < BDH_B; bb++)
			for (int tt = 0; tt < BDH_T; tt++) {
				double gv = g[((size_t)bb * BDH_T + tt) * BDH_E + d];
				for (int j = 0; j < 256; j++) {
					size_t c = c0 + (size_t)j, hh = c / BDH_L, l = c % BDH_L;
					double term = gv * y[(((size_t)bb * BDH_H + hh) * BDH_T + tt) * BDH_L + l];
					acc[j] += term;
					aacc[j] += fabs(term);
				}
			}
		for (int j = 0; j < 256; j++) {
			want[j] = (float)(s * acc[j]);
			absum[j] = (float)(s * aacc[j]);
		}
		gr_expect_bf16("bdh decoder grad_w row", gw + (size_t)d * HL + c0, want, absum, 256,
			    gr_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(y);
	free(gy);
	free(gw);
	gh_close(dev);
}

/* One op at the BDH shape, with the gradient in gf (src or out by op),
 * on tile t; returns the output's bytes (malloc'd, *bytes). grad: f32
 * values exact in bf16 (hb their bf16 storage). */
static void *bdh_run(dg_device *dev, dg_op op, dg_fmt gf, const dg_tile *t, const float *g,
		     const uint16_t *hb, const void *b, size_t *bytes)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.tile = *t;
	const bool dgi = op == DG_OP_DECODER_GRAD_INPUT, gi = op == DG_OP_LOWRANK_GRAD_INPUT;
	if (dgi)
		sp.out = gf;
	else
		sp.src = gf;
	const size_t ng = dgi ? (size_t)BDH_B * BDH_T * BDH_E : (size_t)BDH_B * BDH_H * BDH_T * BDH_L;
	const size_t nb = gi || dgi ? (size_t)BDH_H * BDH_L * BDH_E : (size_t)BDH_B * BDH_T * BDH_E;
	const size_t no = gi ? (size_t)BDH_B * BDH_T * BDH_E
			: dgi ? (size_t)BDH_B * BDH_H * BDH_T * BDH_L : (size_t)BDH_H * BDH_L * BDH_E;
	const bool in_bf = !dgi && gf == DG_FMT_BF16, out_bf = dgi && gf == DG_FMT_BF16;
	dg_dptr dgr = in_bf ? gh_upload(dev, hb, ng * 2) : gh_upload(dev, g, ng * 4);
	dg_dptr db = gh_upload(dev, b, nb);
	*bytes = no * (out_bf ? 2 : 4);
	dg_dptr dout = gh_alloc_ff(dev, *bytes);
	dg_fmt gfmt = in_bf ? DG_FMT_BF16 : DG_FMT_F32;
	dg_status st;
	if (gi) {
		dg_tensor tg = dg_tensor_4d("grad", gfmt, dgr, BDH_B, BDH_H, BDH_T, BDH_L);
		dg_tensor tw = dg_tensor_3d("w", DG_FMT_INT8, db, BDH_H, BDH_L, BDH_E);
		tw.scale = gh_scalar(dev, 1.0f / 127);
		dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, dout, BDH_B, 1, BDH_T, BDH_E);
		/* the split pinned: the runtime's choice follows the kernel's
		 * shared memory, which the gradient's format changes, and the
		 * comparison is of the formats at one summation order */
		dg_lowrank_grad_input_args a = { .grad = &tg, .w = &tw, .grad_x = &tx, .splits = 2 };
		gr_grad_input(dev, &sp, &a, "bdh lowrank_grad_input");
		st = DG_OK;
	} else if (dgi) {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dgr, BDH_B, 1, BDH_T, BDH_E);
		dg_tensor tw = dg_tensor_2d("w", DG_FMT_INT8, db, BDH_E, (int64_t)BDH_H * BDH_L);
		tw.scale = gh_scalar(dev, 1.0f / 127);
		dg_tensor ty = dg_tensor_4d("grad_y", gf, dout, BDH_B, BDH_H, BDH_T, BDH_L);
		dg_decoder_grad_input_args a = { .grad = &tg, .w = &tw, .grad_y = &ty };
		st = dg_decoder_grad_input(dev, &sp, &a);
	} else {
		dg_tensor tg = dg_tensor_4d("grad", gfmt, dgr, BDH_B, BDH_H, BDH_T, BDH_L);
		dg_tensor tx = dg_tensor_4d("x", DG_FMT_INT8, db, BDH_B, 1, BDH_T, BDH_E);
		tx.scale = gh_scalar(dev, 1.0f / 127);
		dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, dout, BDH_H, BDH_L, BDH_E);
		dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw };
		st = gr_lowrank_grad_weight(dev, &sp, &a, NULL);
	}
	cr_assert_eq(st, DG_OK, "%s: %s", dg_op_name(op), dg_device_errmsg(dev));
	void *out = gh_xmalloc(*bytes);
	gh_download(dev, out, dout, *bytes);
	return out;
}

Test(gpu_grad, bdh_bf16_gradients_match_the_f32_kernels)
{
	dg_device *dev = gh_open();
	static const dg_op ops[] = { DG_OP_LOWRANK_GRAD_INPUT, DG_OP_LOWRANK_GRAD_WEIGHT,
				     DG_OP_DECODER_GRAD_INPUT };
	/* the template's default tiles at this shape (templates/grad.lua),
	 * pinned so a tuning record of one format cannot give it another */
	static const dg_tile tiles[] = { { 64, 128, 64, 2, 4, 4, 0 }, { 128, 128, 32, 2, 2, 4, 0 },
					 { 128, 128, 32, 2, 2, 3, 0 } };
	gh_seed(24);
	for (int o = 0; o < 3; o++) {
		const bool dgi = ops[o] == DG_OP_DECODER_GRAD_INPUT;
		const size_t ng = dgi ? (size_t)BDH_B * BDH_T * BDH_E : (size_t)BDH_B * BDH_H * BDH_T * BDH_L;
		const size_t nb = ops[o] == DG_OP_LOWRANK_GRAD_WEIGHT ? (size_t)BDH_B * BDH_T * BDH_E
								      : (size_t)BDH_H * BDH_L * BDH_E;
		float *g = gr_rand_f32(ng);
		uint16_t *hb = gh_xmalloc(ng * 2);
		for (size_t i = 0; i < ng; i++) { /* values exact in bf16 */
			hb[i] = dg_f32_to_bf16(g[i]);
			g[i] = dg_bf16_to_f32(hb[i]);
		}
		void *b = gh_rand_storage(DG_FMT_INT8, nb, NULL);
		size_t nf = 0, nh = 0;
		void *f = bdh_run(dev, ops[o], DG_FMT_F32, &tiles[o], g, hb, b, &nf);
		void *h = bdh_run(dev, ops[o], DG_FMT_BF16, &tiles[o], g, hb, b, &nh);
		gr_expect_written(dg_op_name(ops[o]), f, nf / 4);
		if (dgi) { /* grad_y bf16: the f32 kernel's, rounded to nearest even once */
			cr_assert_eq(nh * 2, nf);
			const float *fv = f;
			const uint16_t *hv = h;
			for (size_t i = 0; i < nh / 2; i++)
				cr_assert_eq(hv[i], dg_f32_to_bf16(fv[i]), "grad_y[%zu]: 0x%04x, f32 %.9g", i, hv[i],
					     (double)fv[i]);
		} else {
			cr_assert_eq(nh, nf);
			gh_expect_bytes(dg_op_name(ops[o]), h, f, nf);
		}
		free(g), free(hb), free(b), free(f), free(h);
	}
	gh_close(dev);
}

/* ---- the sm_90a warpgroup path (templates/grad_wgmma.lua) ----------------------- */

/* One lowrank grad at the BDH shape with a bf16 gradient and bf16 w / x on
 * sm_90a, the tile t (auto: the warpgroup default); the output's device
 * pointer is u->out. */
typedef struct wg_run {
	dg_device *dev;
	dg_spec spec;
	dg_tensor grad, b, out;
	dg_workspace ws;
} wg_run;

static dg_status wg_call(void *user)
{
	wg_run *u = user;
	if (u->spec.op == DG_OP_LOWRANK_GRAD_INPUT) {
		dg_lowrank_grad_input_args a = { .grad = &u->grad, .w = &u->b, .grad_x = &u->out, .ws = u->ws };
		return dg_lowrank_grad_input(u->dev, &u->spec, &a);
	}
	if (u->spec.op == DG_OP_DECODER_GRAD_WEIGHT) {
		dg_decoder_grad_weight_args a = { .grad = &u->grad, .y = &u->b, .grad_w = &u->out, .ws = u->ws };
		return dg_decoder_grad_weight(u->dev, &u->spec, &a);
	}
	dg_lowrank_grad_weight_args a = { .grad = &u->grad, .x = &u->b, .grad_w = &u->out, .ws = u->ws };
	return dg_lowrank_grad_weight(u->dev, &u->spec, &a);
}

/* Runs u once into a 0xff-filled output, downloads it (malloc'd), then
 * times it and prints its rate (68.7 GFLOP either op). */
static float *wg_run_timed(wg_run *u, const char *path, size_t no)
{
	dg_codegen *cg = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	cr_assert_eq(dg_codegen_plan(cg, &u->spec, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s", p.canonical);
	dg_codegen_destroy(cg);
	size_t need = 0;
	if (u->spec.op == DG_OP_DECODER_GRAD_WEIGHT) {
		dg_decoder_grad_weight_args a = { .grad = &u->grad, .y = &u->b, .grad_w = &u->out };
		cr_assert_eq(dg_decoder_grad_weight_workspace(u->dev, &u->spec, &a, &need), DG_OK, "%s",
			     dg_device_errmsg(u->dev));
	} else if (u->spec.op == DG_OP_LOWRANK_GRAD_WEIGHT) {
		dg_lowrank_grad_weight_args a = { .grad = &u->grad, .x = &u->b, .grad_w = &u->out };
		cr_assert_eq(dg_lowrank_grad_weight_workspace(u->dev, &u->spec, &a, &need), DG_OK, "%s",
			     dg_device_errmsg(u->dev));
	} else {
		/* the K split's partials (the runtime's count, printed below) */
		dg_lowrank_grad_input_args a = { .grad = &u->grad, .w = &u->b, .grad_x = &u->out };
		cr_assert_eq(dg_lowrank_grad_input_workspace(u->dev, &u->spec, &a, &need), DG_OK, "%s",
			     dg_device_errmsg(u->dev));
	}
	u->ws = gh_workspace(u->dev, need);
	cr_assert_eq(dg_memset8(u->dev, u->out.data, 0xff, no * 4), DG_OK);
	cr_assert_eq(wg_call(u), DG_OK, "%s: %s", p.canonical, dg_device_errmsg(u->dev));
	float *got = gh_xmalloc(no * 4);
	gh_download(u->dev, got, u->out.data, no * 4);
	gr_expect_written(p.canonical, got, no);

	dg_timer *tm = NULL;
	dg_timing r;
	cr_assert_eq(dg_timer_create(u->dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(u->dev));
	dg_timer_opts o = { .reps = 10 };
	cr_assert_eq(dg_timer_run(tm, &o, wg_call, u, &r), DG_OK, "%s", dg_device_errmsg(u->dev));
	dg_timer_destroy(tm);
	const double flop = 2.0 * BDH_B * BDH_T * BDH_H * BDH_L * BDH_E;
	printf("bdh %-20s %-14s %-40s %9.1f us  %7.1f TFLOP/s  (%zu bytes of partials)\n",
	       dg_op_name(u->spec.op), path, p.canonical, r.median_us, flop / r.median_us * 1e-6, need);
	fflush(stdout);
	return got;
}

/* Both ops with bf16 gradient and bf16 w / x on sm_90a: the warpgroup
 * default against the mma.sync default tile of the same spec, within
 * 1e-3 of the norm (both sum exact products in f32, in other orders:
 * about 1e-5 apart), each one's time printed. Skips off sm_90. */
Test(gpu_grad, bdh_wgmma_bf16_against_mma)
{
	dg_device *dev = gh_open_sm90();
	static const dg_tile mma_tiles[] = { { 64, 128, 64, 2, 4, 4, 0 }, { 128, 128, 32, 2, 2, 4, 0 } };
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L;
	gh_seed(25);
	uint16_t *g = gh_xmalloc(ng * 2);
	float *f = gr_rand_f32(ng);
	for (size_t i = 0; i < ng; i++)
		g[i] = dg_f32_to_bf16(f[i]);
	free(f);
	dg_dptr dgr = gh_upload(dev, g, ng * 2);
	free(g);
	for (int o = 0; o < 2; o++) {
		const bool gi = o == 0;
		const size_t nb = gi ? (size_t)BDH_H * BDH_L * BDH_E : (size_t)BDH_B * BDH_T * BDH_E;
		const size_t no = gi ? (size_t)BDH_B * BDH_T * BDH_E : (size_t)BDH_H * BDH_L * BDH_E;
		float *bf = gr_rand_f32(nb);
		uint16_t *b = gh_xmalloc(nb * 2);
		for (size_t i = 0; i < nb; i++)
			b[i] = dg_f32_to_bf16(bf[i]);
		free(bf);
		wg_run u = { .dev = dev };
		dg_spec_init(&u.spec, gi ? DG_OP_LOWRANK_GRAD_INPUT : DG_OP_LOWRANK_GRAD_WEIGHT);
		u.spec.src = DG_FMT_BF16;
		if (gi)
			u.spec.weight = DG_FMT_BF16;
		else
			u.spec.act = DG_FMT_BF16;
		u.spec.arch = 90;
		u.spec.arch_specific = true;
		dg_spec_normalize(&u.spec);
		u.grad = dg_tensor_4d("grad", DG_FMT_BF16, dgr, BDH_B, BDH_H, BDH_T, BDH_L);
		dg_dptr db = gh_upload(dev, b, nb * 2), dout = gh_alloc(dev, no * 4);
		free(b);
		if (gi) {
			u.b = dg_tensor_3d("w", DG_FMT_BF16, db, BDH_H, BDH_L, BDH_E);
			u.out = dg_tensor_4d("grad_x", DG_FMT_F32, dout, BDH_B, 1, BDH_T, BDH_E);
		} else {
			u.b = dg_tensor_4d("x", DG_FMT_BF16, db, BDH_B, 1, BDH_T, BDH_E);
			u.out = dg_tensor_3d("grad_w", DG_FMT_F32, dout, BDH_H, BDH_L, BDH_E);
		}
		float *wg = wg_run_timed(&u, "wgmma tma", no); /* the default: warp-specialized */
		u.spec.tile = mma_tiles[o];
		float *mm = wg_run_timed(&u, "mma.sync bf16", no);
		char why[256];
		cr_assert(dg_ref_close_norm(wg, mm, no, 1e-3, FLT_MAX, why, sizeof(why)), "%s: %s",
			  dg_op_name(u.spec.op), why);
		free(wg);
		free(mm);
	}
	gh_close(dev);
}

/* decoder_grad_weight with its f32 gradient on sm_90a, y as the presets
 * have it (bf16; uint8pos codes a scale a token, w8a8's): the warpgroup
 * default against the mma.sync default tile of the same spec, within 1e-3
 * of the norm (both round the same operands to bf16 and sum exact
 * products in f32, in other orders), each one's time printed, and BN 256
 * and the warp-specialized tiles beside them. Skips off sm_90. */
Test(gpu_grad, bdh_wgmma_decoder_grad_weight_against_mma)
{
	dg_device *dev = gh_open_sm90();
	const dg_tile mma_tile = { 128, 128, 32, 2, 2, 4, 0 };
	const size_t ng = (size_t)BDH_B * BDH_T * BDH_E, ny = (size_t)BDH_B * BDH_H * BDH_T * BDH_L,
		     nt = (size_t)BDH_B * BDH_T, no = (size_t)BDH_E * BDH_H * BDH_L;
	gh_seed(26);
	float *g = gr_rand_f32(ng), *sv = gr_rand_f32(nt);
	for (size_t i = 0; i < nt; i++)
		sv[i] = (0.5f + fabsf(sv[i])) / 255.0f;
	dg_dptr dgr = gh_upload(dev, g, ng * 4), dsv = gh_upload(dev, sv, nt * 4);
	free(g);
	free(sv);
	for (int f = 0; f < 2; f++) {
		const dg_fmt yf = f ? DG_FMT_UINT8POS : DG_FMT_BF16;
		void *y = gh_rand_storage(yf, ny, NULL);
		wg_run u = { .dev = dev };
		dg_spec_init(&u.spec, DG_OP_DECODER_GRAD_WEIGHT);
		u.spec.act = yf;
		u.spec.ascale = f ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
		u.spec.arch = 90;
		u.spec.arch_specific = true;
		dg_spec_normalize(&u.spec);
		u.grad = dg_tensor_4d("grad", DG_FMT_F32, dgr, BDH_B, 1, BDH_T, BDH_E);
		u.b = dg_tensor_4d("y", yf, gh_upload(dev, y, gh_bytes(yf, ny)), BDH_B, BDH_H, BDH_T, BDH_L);
		if (f)
			u.b.scale = dsv;
		free(y);
		u.out = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc(dev, no * 4), BDH_E, (int64_t)BDH_H * BDH_L);
		float *wg = wg_run_timed(&u, "wgmma bf16", no);
		u.spec.tile = mma_tile;
		float *mm = wg_run_timed(&u, "mma.sync bf16", no);
		char why[256];
		cr_assert(dg_ref_close_norm(wg, mm, no, 1e-3, FLT_MAX, why, sizeof(why)), "%s: %s",
			  dg_fmt_name(yf), why);
		/* BN 256 (one block an SM, the f32 gradient read half as often),
		 * and the warp-specialized form (5 stages and more: the
		 * gradient's bf16 copy by TMA, y decoded by a producer
		 * warpgroup): the same sums, their times beside the default's */
		static const dg_tile more[] = { { 128, 256, 64, 8, 1, 2, 0 }, { 128, 256, 64, 8, 1, 3, 0 },
						{ 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 },
						{ 128, 64, 64, 8, 1, 8, 0 } };
		for (size_t k = 0; k < sizeof(more) / sizeof(more[0]); k++) {
			u.spec.tile = more[k];
			float *ww = wg_run_timed(&u, more[k].stages >= 5 ? "wgmma tma" : "wgmma bf16", no);
			cr_assert(dg_ref_close_norm(ww, mm, no, 1e-3, FLT_MAX, why, sizeof(why)), "%s tile %zu: %s",
				  dg_fmt_name(yf), k, why);
			free(ww);
		}
		free(wg);
		free(mm);
	}
	gh_close(dev);
}
