/*
 * dequantize on the GPU (templates/dequantize.lua, runtime/ops/
 * dequantize.c) against its CPU reference (dg_ref_dequantize, held to
 * hand-worked cases by tests/test_ref_dequantize.c), bit for bit. Skips
 * without a device (gh_open); fails instead with DRAGON_REQUIRE_GPU=1.
 *
 *   - every format: act int8, int4, uint8pos × out bf16, f32 × ascale
 *     tensor, token, the default block and t64;
 *   - odd shapes: C a multiple of 8 (the vector path), not one (a scale a
 *     row walks every code alone), n not a multiple of 8 (the scalar tail),
 *     one row, one code;
 *   - the model's shapes: the encoders' weights (4·8192, 256) a scale a
 *     channel and a tensor, the a stack (6·8·4·512, 256) a scale a row;
 *   - scales random a row, one of them 0; codes random bytes;
 *   - every output starts as 0xff bytes (NaN): an unwritten element fails;
 *     a second run gives the same bytes;
 *   - the comparison can fail: the reference with the rows' scales shifted
 *     by one row, or read as one tensor's, differs from the result.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

static void check(dg_device *dev, dg_fmt act, dg_fmt out, dg_scale_gran g, int64_t R, int64_t C,
		  int threads)
{
	char what[160];
	snprintf(what, sizeof(what), "dequantize %s → %s ascale=%s (%lld, %lld) t%d", dg_fmt_name(act),
		 dg_fmt_name(out), dg_scale_name(g), (long long)R, (long long)C, threads);
	size_t n = (size_t)(R * C), ob = n * (out == DG_FMT_BF16 ? 2 : 4);
	size_t ns = g == DG_SCALE_TOKEN ? (size_t)R : 1;
	void *codes = gh_rand_storage(act, n, NULL);
	float *sc = gh_xmalloc(ns * sizeof(float));
	for (size_t r = 0; r < ns; r++)
		sc[r] = gh_uniform(1e-3f, 0.05f);
	if (ns > 2)
		sc[ns / 2] = 0.0f;
	dg_tensor tc = dg_tensor_2d("codes", act, gh_upload(dev, codes, n ? n : 1), R, C);
	tc.scale = gh_upload(dev, sc, ns * sizeof(float));
	dg_tensor to = dg_tensor_2d("out", out, gh_alloc_ff(dev, ob ? ob : 1), R, C);
	dg_spec s = dg_test_dequantize_spec(act, out, g, threads);
	dg_dequantize_args a = { .codes = &tc, .out = &to };
	void *want = gh_xmalloc(ob), *got = gh_xmalloc(ob);
	cr_assert_eq(dg_ref_dequantize(act, out, g, codes, R, C, sc, want), DG_OK);
	for (int run = 0; run < 2; run++) {
		cr_assert_eq(dg_dequantize(dev, &s, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, got, to.data, ob);
		gh_expect_bytes(what, got, want, ob);
	}
	if (g == DG_SCALE_TOKEN && R > 2 && C > 1) {
		/* the check can fail: the scales one row off, or one for all */
		char why[256];
		void *bad = gh_xmalloc(ob);
		cr_assert_eq(dg_ref_dequantize(act, out, g, codes, R - 1, C, sc + 1, bad), DG_OK);
		cr_assert_not(dg_ref_same_bytes(got, bad, (size_t)(R - 1) * C * (ob / n), why, sizeof(why)),
			      "%s: the shifted scales pass", what);
		cr_assert_eq(dg_ref_dequantize(act, out, DG_SCALE_TENSOR, codes, R, C, sc, bad), DG_OK);
		cr_assert_not(dg_ref_same_bytes(got, bad, ob, why, sizeof(why)), "%s: one scale passes", what);
		free(bad);
	}
	free(codes), free(sc), free(want), free(got);
}

Test(gpu_dequantize, every_format_odd_shapes)
{
	dg_device *dev = gh_open();
	gh_seed(31);
	static const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	static const int64_t shapes[][2] = { { 7, 256 }, { 5, 13 }, { 3, 40 }, { 1, 3 }, { 1, 1 }, { 130, 24 } };
	for (int f = 0; f < 3; f++)
		for (int o = 0; o < 2; o++)
			for (int g = 0; g < 2; g++)
				for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++)
					for (int th = 0; th < 2; th++)
						check(dev, acts[f], o ? DG_FMT_F32 : DG_FMT_BF16,
						      g ? DG_SCALE_TOKEN : DG_SCALE_TENSOR, shapes[k][0], shapes[k][1],
						      th ? 64 : 0);
	gh_close(dev);
}

Test(gpu_dequantize, model_shapes)
{
	dg_device *dev = gh_open();
	gh_seed(32);
	/* the encoders' bf16 copies: w8a8 a scale a channel, bitnet one */
	check(dev, DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TOKEN, 4 * 8192, 256, 0);
	check(dev, DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TENSOR, 4 * 8192, 256, 0);
	/* the weight gradients' stacks: a (L·B·H·T, D), x (L·B·T, D) */
	check(dev, DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TOKEN, 6 * 8 * 4 * 512, 256, 0);
	check(dev, DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TOKEN, 6 * 8 * 512, 256, 0);
	gh_close(dev);
}
