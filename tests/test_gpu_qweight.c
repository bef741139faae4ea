/*
 * GPU tests of quantize_weight and the ternary / sign1 packers
 * (templates/qweight.lua, runtime/ops/quantize.c, pack.c) against the CPU
 * references. Skip without a device (gh_open). quantize_weight's |w|
 * partial sums live in the caller's workspace (_workspace sizes it); a
 * missing or short one is refused by name and nothing runs.
 *
 * What quantize_weight guarantees (runtime/ops/quantize.c): the scale is
 * dg_ref_quantize_weight's to within one ulp (double partial sums; equal
 * unless the exact sum sits on a float rounding boundary), and the codes
 * are exactly the reference rule applied with the GPU's scale — so equal
 * to the reference's codes whenever the scales are equal.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/ref/ref_ops.h"

/* The reference rule with a given scale (dg_ref_quantize_weight's apply). */
static int8_t code_of(dg_fmt f, float v, float s)
{
	if (f == DG_FMT_INT8) {
		if (s == 0.0f)
			return 0;
		float r = rintf(v / s);
		return (int8_t)(r < -127.0f ? -127 : r > 127.0f ? 127 : (int)r);
	}
	if (f == DG_FMT_TERNARY)
		return (int8_t)(fabsf(v) < s ? 0 : (v > 0.0f) - (v < 0.0f));
	return (int8_t)(v >= 0.0f ? 1 : -1);
}

/* The workspace a's call needs, as the op sizes it (never none: the |w|
 * partials of the first pass). */
static dg_workspace qw_workspace(dg_device *dev, const dg_spec *s, const dg_quantize_weight_args *a)
{
	size_t need = 0;
	cr_assert_eq(dg_quantize_weight_workspace(dev, s, a, &need), DG_OK, "%s",
		     dg_device_errmsg(dev));
	cr_assert_gt(need, 0);
	return gh_workspace(dev, need);
}

/* quantize_weight to weight's codes. */
static dg_spec qw_spec(dg_fmt weight)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_WEIGHT);
	s.weight = weight;
	return s;
}

/* One call of s on a with its workspace (qw_workspace): it runs. */
static void qw_run(dg_device *dev, const dg_spec *s, dg_quantize_weight_args *a)
{
	a->ws = qw_workspace(dev, s, a);
	cr_assert_eq(dg_quantize_weight(dev, s, a), DG_OK, "%s", dg_device_errmsg(dev));
}

/* dg_quantize_weight with the workspace ws (gh_expect_bad_workspaces'). */
static dg_status quantize_weight_ws(dg_device *dev, const dg_spec *s, void *args, dg_workspace ws)
{
	dg_quantize_weight_args *a = args;
	a->ws = ws;
	return dg_quantize_weight(dev, s, a);
}

static void run_quantize(dg_fmt weight, dg_fmt src, size_t n, int mode)
{
	dg_device *dev = gh_open();
	float *w = gh_xmalloc(n * 4);
	uint16_t *wb = gh_xmalloc(n * 2);
	int8_t *ref = gh_xmalloc(n), *got = gh_xmalloc(n), *want = gh_xmalloc(n);
	float ref_scale = 0;

	for (size_t i = 0; i < n; i++) {
		float v = gh_uniform(-2.0f, 2.0f);

		if (mode == 1 && i % 7 == 0)
			v = 0.0f; /* exact zeros */
		if (mode == 1 && i % 11 == 0)
			v = -0.0f;
		if (mode == 1 && i % 13 == 0)
			v = (float)gh_int(-8, 8) * 0.25f; /* ties of small grids */
		if (mode == 2)
			v = 0.0f; /* all zero: scale 0 */
		wb[i] = dg_f32_to_bf16(v);
		w[i] = src == DG_FMT_BF16 ? dg_bf16_to_f32(wb[i]) : v;
	}
	cr_assert_eq(dg_ref_quantize_weight(weight, w, n, ref, &ref_scale), DG_OK);

	dg_dptr dw = src == DG_FMT_BF16 ? gh_upload(dev, wb, n * 2) : gh_upload(dev, w, n * 4);
	dg_dptr dc = gh_alloc_ff(dev, n + 16), ds = gh_scalar(dev, -1.0f);
	dg_tensor tw = dg_tensor_2d("w", src, dw, 1, (int64_t)n);
	dg_tensor tc = dg_tensor_2d("codes", DG_FMT_INT8, dc, 1, (int64_t)n);
	tc.scale = ds;
	dg_spec s = qw_spec(weight);
	s.src = src;
	dg_quantize_weight_args a = { .w = &tw, .codes = &tc };
	qw_run(dev, &s, &a);
	gh_download(dev, got, dc, n);
	float scale = gh_read_scalar(dev, ds);

	cr_assert(fabsf(scale - ref_scale) <= nextafterf(ref_scale, INFINITY) - ref_scale,
		  "%s/%s n=%zu: scale %.9g, reference %.9g (more than one ulp)",
		  dg_fmt_name(weight), dg_fmt_name(src), n, (double)scale, (double)ref_scale);
	for (size_t i = 0; i < n; i++)
		want[i] = code_of(weight, w[i], scale);
	gh_expect_bytes("codes (reference rule, GPU scale)", got, want, n);
	if (scale == ref_scale)
		gh_expect_bytes("codes (reference)", got, ref, n);
	free(w);
	free(wb);
	free(ref);
	free(got);
	free(want);
	gh_close(dev);
}

Test(gpu_qweight, quantize_every_format)
{
	static const dg_fmt wf[] = { DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	static const size_t sizes[] = { 1, 13, 4096, 100003, 4 * 8192 * 33 };

	gh_seed(1);
	for (int f = 0; f < 3; f++)
		for (int src = 0; src < 2; src++)
			for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
				run_quantize(wf[f], src ? DG_FMT_BF16 : DG_FMT_F32, sizes[k],
					     k % 2);
}

Test(gpu_qweight, quantize_all_zero)
{
	static const dg_fmt wf[] = { DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };

	for (int f = 0; f < 3; f++)
		run_quantize(wf[f], DG_FMT_F32, 1000, 2);
}

/* The BDH weight (4·8192·256): the scale is reproducible run to run. */
Test(gpu_qweight, quantize_bdh_reproducible)
{
	const size_t n = 4ull * 8192 * 256;
	dg_device *dev = gh_open();
	float *w = gh_xmalloc(n * 4);

	gh_seed(2);
	for (size_t i = 0; i < n; i++)
		w[i] = gh_uniform(-0.1f, 0.1f);
	dg_dptr dw = gh_upload(dev, w, n * 4), dc = gh_alloc(dev, n);
	dg_dptr s1 = gh_scalar(dev, 0), s2 = gh_scalar(dev, 0);
	dg_tensor tw = dg_tensor_3d("w", DG_FMT_F32, dw, 4, 8192, 256);
	dg_tensor tc = dg_tensor_3d("codes", DG_FMT_INT8, dc, 4, 8192, 256);
	dg_spec s = qw_spec(DG_FMT_TERNARY);
	tc.scale = s1;
	dg_quantize_weight_args qa = { .w = &tw, .codes = &tc };
	qw_run(dev, &s, &qa);
	tc.scale = s2;
	cr_assert_eq(dg_quantize_weight(dev, &s, &qa), DG_OK, "%s", dg_device_errmsg(dev));
	float a = gh_read_scalar(dev, s1), b = gh_read_scalar(dev, s2);
	cr_assert(memcmp(&a, &b, 4) == 0, "scale %.9g then %.9g", (double)a, (double)b);
	int8_t *ref = gh_xmalloc(n);
	float rs;
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_TERNARY, w, n, ref, &rs), DG_OK);
	cr_assert(fabsf(a - rs) <= nextafterf(rs, INFINITY) - rs, "scale %.9g, reference %.9g",
		  (double)a, (double)rs);
	free(ref);
	free(w);
	gh_close(dev);
}

static void run_pack(dg_op op, size_t rows, int k)
{
	dg_device *dev = gh_open();
	bool tern = op == DG_OP_PACK_TERNARY;
	size_t n = rows * (size_t)k, nw = n / (tern ? 16 : 32);
	int8_t *c = gh_xmalloc(n), *back = gh_xmalloc(n), *ref_back = gh_xmalloc(n);
	uint32_t *ref = gh_xmalloc(nw * 4), *got = gh_xmalloc(nw * 4);

	for (size_t i = 0; i < n; i++)
		c[i] = (int8_t)(tern ? gh_int(-1, 1) : (gh_int(0, 1) ? 1 : -1));
	cr_assert_eq(tern ? dg_ref_pack_ternary(c, ref, rows, k) : dg_ref_pack_sign1(c, ref, rows, k),
		     DG_OK);
	cr_assert_eq(tern ? dg_ref_unpack_ternary(ref, ref_back, rows, k)
			  : dg_ref_unpack_sign1(ref, ref_back, rows, k), DG_OK);

	dg_dptr dc = gh_upload(dev, c, n), dp = gh_alloc_ff(dev, nw * 4), du = gh_alloc_ff(dev, n);
	dg_tensor tc = dg_tensor_2d("codes", DG_FMT_INT8, dc, (int64_t)rows, k);
	dg_tensor tp = dg_tensor_2d("packed", tern ? DG_FMT_TERNARY : DG_FMT_SIGN1, dp,
				    (int64_t)rows, k);
	dg_tensor tu = dg_tensor_2d("codes", DG_FMT_INT8, du, (int64_t)rows, k);
	dg_spec s;
	dg_spec_init(&s, op);
	s.embd = k;
	dg_pack_weight_args pa = { .codes = &tc, .packed = &tp, .unpack = false };
	cr_assert_eq(dg_pack_weight(dev, &s, &pa), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, dp, nw * 4);
	gh_expect_bytes(tern ? "pack_ternary" : "pack_sign1", got, ref, nw * 4);
	dg_pack_weight_args ua = { .codes = &tu, .packed = &tp, .unpack = true };
	cr_assert_eq(dg_pack_weight(dev, &s, &ua), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, back, du, n);
	gh_expect_bytes(tern ? "unpack_ternary" : "unpack_sign1", back, ref_back, n);
	gh_expect_bytes("round trip", back, c, n);
	free(c);
	free(back);
	free(ref_back);
	free(ref);
	free(got);
	gh_close(dev);
}

Test(gpu_qweight, pack_unpack)
{
	gh_seed(3);
	run_pack(DG_OP_PACK_TERNARY, 1, 16);
	run_pack(DG_OP_PACK_TERNARY, 37, 48);
	run_pack(DG_OP_PACK_TERNARY, 4 * 8192, 256);
	run_pack(DG_OP_PACK_SIGN1, 1, 32);
	run_pack(DG_OP_PACK_SIGN1, 37, 96);
	run_pack(DG_OP_PACK_SIGN1, 4 * 8192, 256);
}

/* Codes other than ±1 pack as 0 (ternary) / -1 (sign1); the reference
 * refuses them, the kernel documents this mapping. */
Test(gpu_qweight, pack_out_of_range_codes)
{
	dg_device *dev = gh_open();
	int8_t c[32] = { 1, -1, 0, 2, -2, 127, -128, 1 };
	uint32_t got[2];

	dg_dptr dc = gh_upload(dev, c, 32), dp = gh_alloc_ff(dev, 16);
	dg_tensor tc = dg_tensor_2d("codes", DG_FMT_INT8, dc, 1, 32);
	dg_tensor tp = dg_tensor_2d("packed", DG_FMT_TERNARY, dp, 1, 32);
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_TERNARY);
	s.embd = 32;
	dg_pack_weight_args pa = { .codes = &tc, .packed = &tp, .unpack = false };
	cr_assert_eq(dg_pack_weight(dev, &s, &pa), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, dp, 8);
	cr_assert_eq(got[0], 0x1u | 0x3u << 2 | 0x1u << 14, "0x%08x", got[0]);
	cr_assert_eq(got[1], 0u);
	gh_close(dev);
}

/* The |w| partials go to the caller's workspace: missing or one byte
 * short, the call is refused naming the op and "ws", and neither the codes
 * nor the scale is touched. */
Test(gpu_qweight, workspace_is_checked)
{
	dg_device *dev = gh_open();
	const size_t n = 4096 * 33;
	float *w = gh_rand_storage(DG_FMT_F32, n, NULL);
	dg_dptr dc = gh_alloc_ff(dev, n), ds = gh_scalar(dev, -1.0f);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_F32, gh_upload(dev, w, n * 4), 33, 4096);
	dg_tensor tc = dg_tensor_2d("codes", DG_FMT_INT8, dc, 33, 4096);
	tc.scale = ds;
	dg_spec s = qw_spec(DG_FMT_TERNARY);
	dg_quantize_weight_args a = { .w = &tw, .codes = &tc };
	dg_workspace ok = qw_workspace(dev, &s, &a);
	gh_expect_bad_workspaces(dev, &s, &a, ok, quantize_weight_ws, "dg_quantize_weight", "codes", dc, n, ds);
	a.ws = ok;
	cr_assert_eq(dg_quantize_weight(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_gt(gh_read_scalar(dev, ds), 0.0f);
	free(w);
	gh_close(dev);
}
