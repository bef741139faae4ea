/*
 * GPU tests of the four backward GEMMs at the BDH shape (H 4, E 256,
 * L 8192, B·T 4096; templates/backward.lua, runtime/ops/grad.c), on
 * the default tiles, int8 operands. Skip without a device (gh_open).
 *
 *   - lowrank grad_input on sampled rows;
 *   - lowrank grad_weight in full (its workspace as the op sizes it),
 *     sampled output rows checked against sums over those rows only;
 *   - decoder grad_input and grad_weight, sampled 256-wide row pieces.
 *
 * Outputs start as 0xff bytes (NaN): every element must be written.
 * Tolerance: tests/backward_helpers.h.
 * The small odd shapes are in tests/test_gpu_backward.c.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "backward_helpers.h"
#include "gpu_helpers.h"

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

Test(gpu_backward, bdh_lowrank_grad_input_sampled)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_INPUT); /* H 4, Hin 1, E 256, L 8192, int8 */

	gh_seed(20);
	float *g = bh_rand_f32(ng);
	int8_t *w = gh_rand_storage(DG_FMT_INT8, nw, NULL);
	float *got = gh_xmalloc(nx * 4);
	const float sw = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tw = dg_tensor_3d("w", DG_FMT_INT8, gh_upload(dev, w, nw), BDH_H, BDH_L, BDH_E);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), BDH_B, 1, BDH_T, BDH_E);
	dg_lowrank_grad_input_args a = { .grad = &tg, .w = &tw, .grad_x = &tx };
	cr_assert_eq(dg_lowrank_grad_input(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tx.data, nx * 4);
	bh_expect_written("grad_x", got, nx);

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
		bh_expect_bf16("bdh grad_x row", got + ((size_t)b * BDH_T + t) * BDH_E, want, absum, BDH_E,
			    bh_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(got);
	gh_close(dev);
}

Test(gpu_backward, bdh_lowrank_grad_weight_sampled)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_WEIGHT); /* act int8 */

	gh_seed(21);
	float *g = bh_rand_f32(ng);
	int8_t *x = gh_rand_storage(DG_FMT_INT8, nx, NULL);
	float *got = gh_xmalloc(nw * 4);
	const float sa = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_INT8, gh_upload(dev, x, nx), BDH_B, 1, BDH_T, BDH_E);
	tx.scale = gh_scalar(dev, sa);
	dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), BDH_H, BDH_L, BDH_E);
	dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw };
	size_t need = 0;
	cr_assert_eq(dg_lowrank_grad_weight_workspace(dev, &sp, &a, &need), DG_OK, "%s",
		     dg_device_errmsg(dev));
	a.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_lowrank_grad_weight(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tw.data, nw * 4);
	bh_expect_written("grad_w", got, nw);

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
		bh_expect_bf16("bdh grad_w row", got + ((size_t)h * BDH_L + l) * BDH_E, want, absum, BDH_E,
			    bh_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(x);
	free(got);
	gh_close(dev);
}

Test(gpu_backward, bdh_decoder_grads_sampled)
{
	dg_device *dev = gh_open();
	const size_t HL = (size_t)BDH_H * BDH_L, ng = (size_t)BDH_B * BDH_T * BDH_E,
		     ny = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_E * HL;
	const float s = 1.0f / 127;

	gh_seed(22);
	float *g = bh_rand_f32(ng);
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
	bh_expect_written("grad_y", gy, ny);

	dg_tensor ty = dg_tensor_4d("y", DG_FMT_INT8, gh_upload(dev, y, ny), BDH_B, BDH_H, BDH_T, BDH_L);
	ty.scale = gh_scalar(dev, s);
	dg_tensor tgw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), BDH_E, (int64_t)HL);
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_WEIGHT);
	dg_decoder_grad_weight_args aw = { .grad = &tg, .y = &ty, .grad_w = &tgw };
	size_t need = 0;
	cr_assert_eq(dg_decoder_grad_weight_workspace(dev, &sp, &aw, &need), DG_OK, "%s",
		     dg_device_errmsg(dev));
	aw.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_decoder_grad_weight(dev, &sp, &aw), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gw, tgw.data, nw * 4);
	bh_expect_written("decoder grad_w", gw, nw);

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
		bh_expect_bf16("bdh grad_y row", gy + (((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l0,
			    want, absum, 256, bh_bound_c(DG_FMT_INT8));
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
		bh_expect_bf16("bdh decoder grad_w row", gw + (size_t)d * HL + c0, want, absum, 256,
			    bh_bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(y);
	free(gy);
	free(gw);
	gh_close(dev);
}
