/*
 * GPU tests of the gate and step families (templates/gate.lua, step.lua;
 * runtime/ops/gate.c, step.c) against their CPU references
 * (runtime/ref/gate.c, step.c, held to loops and to the model's gate by
 * tests/test_ref_gate.c). Skip without a device (gh_open); fail instead
 * with DRAGON_REQUIRE_GPU=1. Every op is exact, so every comparison is bit
 * for bit (f32 exactly, bf16 the reference's one rounding):
 *
 *   - odd shapes (B 2, H 3, T 1 / 7 / 130, latent 13 and 100: the vector
 *     loop's scalar tail), act f32 and bf16, the default block and t64;
 *     the BDH shape (B 8, H 4, T 512, latent 8192) bf16 and f32;
 *   - the gradients (dragon/spec.h's formats) f32 and bf16: gate_bwd's
 *     out (dxy, dys, dxs) with either act, add_mask's out (dxs) and src
 *     (other) in every combination; bf16 bit for bit the reference's one
 *     rounding;
 *   - gate: p = 0 and p = 0.1; two (seed, step, layer) give different
 *     masks, equal ones the same bytes; dys written over dxy;
 *   - add_mask in place, add3 with out aliasing a, transpose at
 *     (R 4, E 256, L 8192) and (R 1, E 32768, L 256), odd ones, and back;
 *   - every output starts as 0xff bytes (NaN): an unwritten element fails;
 *   - a second run gives the same bytes (in-place inputs restored first);
 *   - step_at: gate_fwd and gate_bwd with step s0 and a device word k at
 *     step_at give the bytes of step s0 + k without one (uint32, wrapping
 *     past 2^32 too), the reference's, and not step s0's; a captured
 *     gate_fwd replayed after a new word is copied there gives that
 *     step's mask;
 *   - elem0 (a data-parallel rank's rows): a batch's second half run with
 *     elem0 = its first half's elements gives the bytes of the full
 *     batch's second half (forward and backward), and elem0 0 does not;
 *     an elem0 that is not whole Philox blocks (the vectors' straddling
 *     case) or past 2^32 elements is the reference's at that offset,
 *     f32 and bf16, odd shapes (the scalar tail) and whole vectors;
 *   - gate_quant (templates/gate_quant.lua): its codes and a scale a token
 *     are gate_fwd's xy through quantize_act ascale=token on the device
 *     bit for bit, and the reference's (dg_ref_gate_fwd_op, then
 *     dg_ref_quantize_act_rows), src f32 and bf16, codes uint8pos and
 *     int8, p 0 and 0.1 (elem0 13: not whole Philox blocks), odd shapes
 *     (latent 13: the element path; latent 64, heads 1: a vector a
 *     thread), t64, the default and the staged form (t256/1, t128/1:
 *     the token's xy in shared memory; latent 13 refused by it, naming
 *     it), the BDH shape with each form's time against the two ops';
 *     codes over xs refused.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dragon/ops.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"

/* The spec of op; grad, other: the gradients' formats (out, src) where
 * the op reads those fields. */
static dg_spec spec_grads(dg_op op, dg_fmt act, dg_fmt grad, dg_fmt other, int H, int E, int L,
			  int threads)
{
	dg_spec s = dg_test_spec_sized(op, H, E, L);
	if (dg_spec_uses(op) & DG_FIELD_ACT)
		s.act = act;
	if (dg_spec_uses(op) & DG_FIELD_OUT)
		s.out = grad;
	if (dg_spec_uses(op) & DG_FIELD_SRC)
		s.src = other;
	s.tile.threads = threads;
	dg_spec_normalize(&s);
	return s;
}

static dg_spec spec_of(dg_op op, dg_fmt act, int H, int E, int L, int threads)
{
	return spec_grads(op, act, DG_FMT_F32, DG_FMT_F32, H, E, L, threads);
}

static size_t esz(dg_fmt f)
{
	return f == DG_FMT_BF16 ? 2 : 4;
}

/* n random values in [-1, 1) in storage f (about half of them <= 0, so
 * the ReLU masks bite). */
static void *rand_of(dg_fmt f, size_t n)
{
	return gh_rand_storage(f, n, NULL);
}

static void expect_ok(dg_device *dev, dg_status st, const char *what)
{
	cr_assert_eq(st, DG_OK, "%s: %s", what, dg_device_errmsg(dev));
}

/* Host bytes into an existing device buffer (an in-place input again). */
static void upload_to(dg_device *dev, dg_dptr d, const void *host, size_t bytes)
{
	cr_assert_eq(dg_memcpy_htod(dev, d, host, bytes), DG_OK, "%s", dg_device_errmsg(dev));
}

typedef struct drop {
	float p;
	uint64_t seed;
	uint32_t step, layer;
	uint64_t elem0; /* the first element's draw (0: the tensor's own) */
} drop;

/* gate_fwd and gate_bwd at (B, H, T, L) against the reference, gate_bwd's
 * gradients (dxy, dys, dxs) in gf; returns the forward's bytes (malloc'd)
 * for the mask comparisons. */
static void *check_gate_g(dg_device *dev, dg_fmt act, dg_fmt gf, int B, int H, int T, int L,
			  int threads, const drop *d)
{
	char what[160];
	size_t n = (size_t)B * H * T * L, ab = n * esz(act), fb = n * esz(gf);
	snprintf(what, sizeof(what), "gate %s grads %s B%d H%d T%d L%d t%d p=%g seed=%llu step=%u layer=%u elem0=%llu",
		 dg_fmt_name(act), dg_fmt_name(gf), B, H, T, L, threads, (double)d->p,
		 (unsigned long long)d->seed, d->step, d->layer, (unsigned long long)d->elem0);
	void *xs = rand_of(act, n), *ys = rand_of(act, n);
	void *dxy = rand_of(gf, n);
	dg_tensor txs = dg_tensor_4d("xs", act, gh_upload(dev, xs, ab), B, H, T, L);
	dg_tensor tys = dg_tensor_4d("ys", act, gh_upload(dev, ys, ab), B, H, T, L);
	dg_tensor txy = dg_tensor_4d("xy", act, gh_alloc_ff(dev, ab), B, H, T, L);
	dg_tensor tdxy = dg_tensor_4d("dxy", gf, gh_upload(dev, dxy, fb), B, H, T, L);
	dg_tensor tdxs = dg_tensor_4d("dxs", gf, gh_alloc_ff(dev, fb), B, H, T, L);

	dg_spec sf = spec_of(DG_OP_GATE_FWD, act, H, 256, L, threads);
	dg_gate_fwd_args fa = { .xs = &txs, .ys = &tys, .xy = &txy, .p = d->p, .seed = d->seed,
				.step = d->step, .layer = d->layer, .elem0 = d->elem0 };
	expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
	void *got = gh_xmalloc(ab), *want = gh_xmalloc(ab), *again = gh_xmalloc(ab);
	gh_download(dev, got, txy.data, ab);
	cr_assert_eq(dg_ref_gate_fwd_op(act, xs, ys, (int64_t)n, d->p, d->seed, d->step, d->layer, d->elem0, want),
		     DG_OK);
	gh_expect_bytes(what, got, want, ab);
	expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what); /* a second run: the same bytes */
	gh_download(dev, again, txy.data, ab);
	cr_assert_eq(memcmp(again, got, ab), 0, "%s: a second run differs", what);

	dg_spec sb = spec_grads(DG_OP_GATE_BWD, act, gf, DG_FMT_F32, H, 256, L, threads);
	dg_gate_bwd_args ba = { .dxy = &tdxy, .xs = &txs, .ys = &tys, .dxs = &tdxs, .p = d->p,
				.seed = d->seed, .step = d->step, .layer = d->layer, .elem0 = d->elem0 };
	void *wdxs = gh_xmalloc(fb), *wdys = gh_xmalloc(fb), *gdxs = gh_xmalloc(fb), *gdys = gh_xmalloc(fb);
	cr_assert_eq(dg_ref_gate_bwd_op(act, gf, dxy, xs, ys, (int64_t)n, d->p, d->seed, d->step, d->layer, d->elem0,
					wdxs, wdys), DG_OK);
	for (int run = 0; run < 2; run++) {
		if (run) /* dys overwrote dxy: its input again */
			upload_to(dev, tdxy.data, dxy, fb);
		expect_ok(dev, dg_gate_bwd(dev, &sb, &ba), what);
		gh_download(dev, gdxs, tdxs.data, fb);
		gh_download(dev, gdys, tdxy.data, fb);
		gh_expect_bytes(what, gdxs, wdxs, fb);
		gh_expect_bytes(what, gdys, wdys, fb);
	}
	free(xs), free(ys), free(dxy), free(want), free(again);
	free(wdxs), free(wdys), free(gdxs), free(gdys);
	return got;
}

static void *check_gate(dg_device *dev, dg_fmt act, int B, int H, int T, int L, int threads,
			const drop *d)
{
	return check_gate_g(dev, act, DG_FMT_F32, B, H, T, L, threads, d);
}

static void gate_shapes(dg_fmt act)
{
	dg_device *dev = gh_open();
	gh_seed(21);
	static const int Ts[] = { 1, 7, 130 }, Ls[] = { 13, 100 };
	const drop none = { 0.0f, 1, 0, 0, 0 }, a = { 0.1f, 42, 7, 3, 0 };
	for (int g = 0; g < 2; g++) /* the gradients f32, then bf16 */
		for (int ti = 0; ti < 3; ti++)
			for (int li = 0; li < 2; li++)
				for (int th = 0; th < 2; th++) {
					dg_fmt gf = g ? DG_FMT_BF16 : DG_FMT_F32;
					free(check_gate_g(dev, act, gf, 2, 3, Ts[ti], Ls[li], th ? 64 : 0, &none));
					free(check_gate_g(dev, act, gf, 2, 3, Ts[ti], Ls[li], th ? 64 : 0, &a));
				}
	gh_close(dev);
}

Test(gpu_gate, gate_odd_shapes_f32)
{
	gate_shapes(DG_FMT_F32);
}

Test(gpu_gate, gate_odd_shapes_bf16)
{
	gate_shapes(DG_FMT_BF16);
}

/* Masks: the same random inputs (none 0), so xy differs exactly where the
 * masks do. */
Test(gpu_gate, masks_follow_seed_step_and_layer)
{
	dg_device *dev = gh_open();
	const drop a = { 0.1f, 42, 7, 3, 0 }, b = { 0.1f, 43, 7, 3, 0 }, c = { 0.1f, 42, 8, 3, 0 },
		   e = { 0.1f, 42, 7, 4, 0 };
	size_t bytes = (size_t)2 * 3 * 130 * 100 * 4;
	gh_seed(5);
	void *ga = check_gate(dev, DG_FMT_F32, 2, 3, 130, 100, 0, &a);
	gh_seed(5); /* the same inputs */
	void *ga2 = check_gate(dev, DG_FMT_F32, 2, 3, 130, 100, 0, &a);
	cr_assert_eq(memcmp(ga, ga2, bytes), 0, "equal (seed, step, layer): equal masks");
	const drop *others[] = { &b, &c, &e };
	for (int k = 0; k < 3; k++) {
		gh_seed(5);
		void *go = check_gate(dev, DG_FMT_F32, 2, 3, 130, 100, 0, others[k]);
		cr_assert_neq(memcmp(ga, go, bytes), 0, "another (seed, step, layer) #%d: the same mask", k);
		free(go);
	}
	free(ga), free(ga2);
	gh_close(dev);
}

Test(gpu_gate, gate_bdh_shape)
{
	dg_device *dev = gh_open();
	gh_seed(22);
	const drop a = { 0.1f, 1234567890123ull, 100, 5, 0 };
	free(check_gate(dev, DG_FMT_BF16, 8, 4, 512, 8192, 0, &a));
	free(check_gate_g(dev, DG_FMT_BF16, DG_FMT_BF16, 8, 4, 512, 8192, 0, &a)); /* the w8a8 step's */
	if (!getenv("DRAGON_TEST_QUICK"))
		free(check_gate(dev, DG_FMT_F32, 8, 4, 512, 8192, 0, &a));
	gh_close(dev);
}

/* ---- step ------------------------------------------------------------------------ */

/* add_mask with dxs in gf (out), other in of (src), xs in act. */
static void check_add_mask_g(dg_device *dev, dg_fmt act, dg_fmt gf, dg_fmt of, int B, int H, int T,
			     int L, int threads)
{
	char what[128];
	size_t n = (size_t)B * H * T * L, fb = n * esz(gf), ob = n * esz(of);
	snprintf(what, sizeof(what), "add_mask %s dxs %s other %s B%d H%d T%d L%d t%d", dg_fmt_name(act),
		 dg_fmt_name(gf), dg_fmt_name(of), B, H, T, L, threads);
	void *dxs = rand_of(gf, n), *other = rand_of(of, n);
	void *xs = rand_of(act, n);
	dg_tensor td = dg_tensor_4d("dxs", gf, gh_upload(dev, dxs, fb), B, H, T, L);
	dg_tensor to = dg_tensor_4d("other", of, gh_upload(dev, other, ob), B, H, T, L);
	dg_tensor tx = dg_tensor_4d("xs", act, gh_upload(dev, xs, n * esz(act)), B, H, T, L);
	dg_spec s = spec_grads(DG_OP_ADD_MASK, act, gf, of, H, 256, L, threads);
	dg_add_mask_args a = { .dxs = &td, .other = &to, .xs = &tx };
	void *want = gh_xmalloc(fb), *got = gh_xmalloc(fb);
	cr_assert_eq(dg_ref_add_mask(act, gf, of, dxs, other, xs, (int64_t)n, want), DG_OK);
	for (int run = 0; run < 2; run++) {
		if (run)
			upload_to(dev, td.data, dxs, fb);
		expect_ok(dev, dg_add_mask(dev, &s, &a), what);
		gh_download(dev, got, td.data, fb);
		gh_expect_bytes(what, got, want, fb);
	}
	free(dxs), free(other), free(xs), free(want), free(got);
}

static void check_add_mask(dg_device *dev, dg_fmt act, int B, int H, int T, int L, int threads)
{
	check_add_mask_g(dev, act, DG_FMT_F32, DG_FMT_F32, B, H, T, L, threads);
}

static void check_add3(dg_device *dev, int64_t rows, int64_t cols, int threads, bool alias)
{
	char what[96];
	size_t n = (size_t)(rows * cols), fb = n * 4;
	snprintf(what, sizeof(what), "add3 (%lld, %lld) t%d%s", (long long)rows, (long long)cols, threads,
		 alias ? " out = a" : "");
	float *a = rand_of(DG_FMT_F32, n), *b = rand_of(DG_FMT_F32, n), *c = rand_of(DG_FMT_F32, n);
	dg_tensor ta = dg_tensor_2d("a", DG_FMT_F32, gh_upload(dev, a, fb), rows, cols);
	dg_tensor tb = dg_tensor_2d("b", DG_FMT_F32, gh_upload(dev, b, fb), rows, cols);
	dg_tensor tc = dg_tensor_2d("c", DG_FMT_F32, gh_upload(dev, c, fb), rows, cols);
	dg_tensor tout = dg_tensor_2d("out", DG_FMT_F32, alias ? ta.data : gh_alloc_ff(dev, fb), rows, cols);
	dg_spec s = spec_of(DG_OP_ADD3, DG_FMT_F32, 4, 256, 8192, threads);
	dg_add3_args args = { .a = &ta, .b = &tb, .c = &tc, .out = &tout };
	float *want = gh_xmalloc(fb), *got = gh_xmalloc(fb);
	dg_ref_add3(a, b, c, (int64_t)n, want);
	for (int run = 0; run < 2; run++) {
		if (run && alias)
			upload_to(dev, ta.data, a, fb);
		expect_ok(dev, dg_add3(dev, &s, &args), what);
		gh_download(dev, got, tout.data, fb);
		gh_expect_bytes(what, got, want, fb);
	}
	free(a), free(b), free(c), free(want), free(got);
}

/* in (R, E, L) f32 → out (R, L, E) act; then (f32) back again. */
static void check_transpose(dg_device *dev, dg_fmt act, int64_t R, int E, int L, int threads)
{
	char what[96];
	size_t n = (size_t)R * E * L, fb = n * 4, ob = n * esz(act);
	snprintf(what, sizeof(what), "transpose %s (%lld, %d, %d) t%d", dg_fmt_name(act), (long long)R, E, L,
		 threads);
	float *in = rand_of(DG_FMT_F32, n);
	dg_tensor ti = dg_tensor_3d("in", DG_FMT_F32, gh_upload(dev, in, fb), R, E, L);
	dg_tensor to = dg_tensor_3d("out", act, gh_alloc_ff(dev, ob), R, L, E);
	dg_spec s = spec_of(DG_OP_TRANSPOSE, act, 4, E, L, threads);
	dg_transpose_args a = { .in = &ti, .out = &to };
	void *want = gh_xmalloc(ob), *got = gh_xmalloc(ob);
	cr_assert_eq(dg_ref_transpose(act, in, R, E, L, want), DG_OK);
	for (int run = 0; run < 2; run++) {
		expect_ok(dev, dg_transpose(dev, &s, &a), what);
		gh_download(dev, got, to.data, ob);
		gh_expect_bytes(what, got, want, ob);
	}
	if (act == DG_FMT_F32) { /* the way back: E and L swapped */
		dg_tensor tb = dg_tensor_3d("out", DG_FMT_F32, gh_alloc_ff(dev, fb), R, E, L);
		dg_spec sb = spec_of(DG_OP_TRANSPOSE, DG_FMT_F32, 4, L, E, threads);
		dg_transpose_args b = { .in = &to, .out = &tb };
		to.name = "in";
		if (L % 4 == 0) { /* embd is a multiple of 4 */
			expect_ok(dev, dg_transpose(dev, &sb, &b), what);
			gh_download(dev, got, tb.data, fb);
			gh_expect_bytes(what, got, in, fb);
		}
	}
	free(in), free(want), free(got);
}

Test(gpu_gate, step_odd_shapes)
{
	dg_device *dev = gh_open();
	gh_seed(23);
	static const int Ts[] = { 1, 7, 130 }, Ls[] = { 13, 100 };
	for (int a = 0; a < 2; a++)
		for (int ti = 0; ti < 3; ti++)
			for (int li = 0; li < 2; li++)
				for (int th = 0; th < 2; th++)
					check_add_mask(dev, a ? DG_FMT_BF16 : DG_FMT_F32, 2, 3, Ts[ti], Ls[li],
						       th ? 64 : 0);
	/* the gradients' formats: dxs (out) and other (src), f32 and bf16,
	 * with either act */
	for (int k = 1; k < 8; k++) {
		dg_fmt act = k & 1 ? DG_FMT_BF16 : DG_FMT_F32, gf = k & 2 ? DG_FMT_BF16 : DG_FMT_F32,
		       of = k & 4 ? DG_FMT_BF16 : DG_FMT_F32;
		check_add_mask_g(dev, act, gf, of, 2, 3, 7, 13, 0);
		check_add_mask_g(dev, act, gf, of, 2, 3, 130, 100, 64);
	}
	static const int64_t shapes[][2] = { { 1, 1 }, { 1, 7 }, { 3, 1037 }, { 130, 13 } };
	for (int k = 0; k < 4; k++)
		for (int th = 0; th < 2; th++) {
			check_add3(dev, shapes[k][0], shapes[k][1], th ? 64 : 0, false);
			check_add3(dev, shapes[k][0], shapes[k][1], th ? 64 : 0, true);
		}
	for (int a = 0; a < 2; a++)
		for (int th = 0; th < 2; th++) {
			dg_fmt f = a ? DG_FMT_BF16 : DG_FMT_F32;
			check_transpose(dev, f, 3, 36, 13, th ? 64 : 0);
			check_transpose(dev, f, 1, 4, 1, th ? 64 : 0);
			check_transpose(dev, f, 2, 100, 68, th ? 1024 : 0);
		}
	gh_close(dev);
}

Test(gpu_gate, step_bdh_shapes)
{
	dg_device *dev = gh_open();
	gh_seed(24);
	check_add_mask(dev, DG_FMT_BF16, 8, 4, 512, 8192, 0);
	/* the w8a8 step's: dxs bf16, the attention's grad_xs f32 */
	check_add_mask_g(dev, DG_FMT_BF16, DG_FMT_BF16, DG_FMT_F32, 8, 4, 512, 8192, 0);
	check_add3(dev, 8 * 512, 4 * 8192, 0, true);
	for (int a = 0; a < 2; a++) {
		dg_fmt f = a ? DG_FMT_BF16 : DG_FMT_F32;
		check_transpose(dev, f, 4, 256, 8192, 0);  /* the encoders [H, D, N] → (H, N, D) */
		check_transpose(dev, f, 1, 32768, 256, 0); /* the decoder [H·N, D] → (D, H·N) */
	}
	gh_close(dev);
}

/* ---- step_at ---------------------------------------------------------------------- */

/* gate_bwd's dxs and dys (written over dxy, its input copied in first). */
static void run_gate_bwd(dg_device *dev, const dg_spec *s, const dg_gate_bwd_args *a, const void *dxy,
			 size_t fb, void *dxs, void *dys, const char *what)
{
	upload_to(dev, a->dxy->data, dxy, fb);
	expect_ok(dev, dg_gate_bwd(dev, s, a), what);
	gh_download(dev, dxs, a->dxs->data, fb);
	gh_download(dev, dys, a->dxy->data, fb);
}

Test(gpu_gate, step_at_adds_the_device_step)
{
	dg_device *dev = gh_open();
	gh_seed(25);
	enum { B = 2, H = 3, T = 130, L = 100 };
	const size_t n = (size_t)B * H * T * L, fb = n * 4;
	const float p = 0.1f;
	const uint64_t seed = 42;
	const uint32_t layer = 3;
	/* (s0, k): none, a few, many, and s0 + k past 2^32 */
	static const uint32_t cases[][2] = { { 7, 0 }, { 7, 5 }, { 0, 12345 }, { 0xfffffff0u, 0x20u } };
	dg_dptr at = gh_alloc(dev, sizeof(uint32_t));
	for (int a = 0; a < 2; a++) {
		dg_fmt act = a ? DG_FMT_BF16 : DG_FMT_F32;
		size_t ab = n * esz(act);
		void *xs = rand_of(act, n), *ys = rand_of(act, n), *dxy = rand_of(DG_FMT_F32, n);
		dg_tensor txs = dg_tensor_4d("xs", act, gh_upload(dev, xs, ab), B, H, T, L);
		dg_tensor tys = dg_tensor_4d("ys", act, gh_upload(dev, ys, ab), B, H, T, L);
		dg_tensor txy = dg_tensor_4d("xy", act, gh_alloc_ff(dev, ab), B, H, T, L);
		dg_tensor tdxy = dg_tensor_4d("dxy", DG_FMT_F32, gh_alloc(dev, fb), B, H, T, L);
		dg_tensor tdxs = dg_tensor_4d("dxs", DG_FMT_F32, gh_alloc_ff(dev, fb), B, H, T, L);
		dg_spec sf = spec_of(DG_OP_GATE_FWD, act, H, 256, L, 0);
		dg_spec sb = spec_grads(DG_OP_GATE_BWD, act, DG_FMT_F32, DG_FMT_F32, H, 256, L, 0);
		void *got = gh_xmalloc(ab), *want = gh_xmalloc(ab), *plain = gh_xmalloc(ab);
		void *gdxs = gh_xmalloc(fb), *gdys = gh_xmalloc(fb), *pdxs = gh_xmalloc(fb), *pdys = gh_xmalloc(fb);
		void *wdxs = gh_xmalloc(fb), *wdys = gh_xmalloc(fb);
		for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
			const uint32_t s0 = cases[c][0], k = cases[c][1], sum = s0 + k;
			char what[128];
			snprintf(what, sizeof(what), "gate %s step %u + *step_at %u", dg_fmt_name(act), s0, k);
			upload_to(dev, at, &k, sizeof(k));
			dg_gate_fwd_args fa = { .xs = &txs, .ys = &tys, .xy = &txy, .p = p, .seed = seed,
						.step = s0, .layer = layer, .step_at = at };
			expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
			gh_download(dev, got, txy.data, ab);
			cr_assert_eq(dg_ref_gate_fwd_op(act, xs, ys, (int64_t)n, p, seed, sum, layer, 0, want), DG_OK);
			gh_expect_bytes(what, got, want, ab);
			fa.step = sum; /* the same step as an argument alone */
			fa.step_at = 0;
			expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
			gh_download(dev, plain, txy.data, ab);
			cr_assert_eq(memcmp(plain, got, ab), 0, "%s: not step %u's bytes", what, sum);
			if (k) { /* step s0 alone is another mask: step_at was read */
				fa.step = s0;
				expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
				gh_download(dev, plain, txy.data, ab);
				cr_assert_neq(memcmp(plain, got, ab), 0, "%s: step %u's mask", what, s0);
			}

			dg_gate_bwd_args ba = { .dxy = &tdxy, .xs = &txs, .ys = &tys, .dxs = &tdxs, .p = p,
						.seed = seed, .step = s0, .layer = layer, .step_at = at };
			run_gate_bwd(dev, &sb, &ba, dxy, fb, gdxs, gdys, what);
			cr_assert_eq(dg_ref_gate_bwd_op(act, DG_FMT_F32, dxy, xs, ys, (int64_t)n, p, seed, sum, layer, 0,
							wdxs, wdys), DG_OK);
			gh_expect_bytes(what, gdxs, wdxs, fb);
			gh_expect_bytes(what, gdys, wdys, fb);
			ba.step = sum;
			ba.step_at = 0;
			run_gate_bwd(dev, &sb, &ba, dxy, fb, pdxs, pdys, what);
			cr_assert(memcmp(pdxs, gdxs, fb) == 0 && memcmp(pdys, gdys, fb) == 0,
				  "%s: gate_bwd: not step %u's bytes", what, sum);
			if (k) {
				ba.step = s0;
				run_gate_bwd(dev, &sb, &ba, dxy, fb, pdxs, pdys, what);
				cr_assert_neq(memcmp(pdys, gdys, fb), 0, "%s: gate_bwd: step %u's mask", what, s0);
			}
		}

		/* captured with step 100 and step_at: each replay reads the word */
		dg_gate_fwd_args fa = { .xs = &txs, .ys = &tys, .xy = &txy, .p = p, .seed = seed, .step = 100,
					.layer = layer, .step_at = at };
		gh_sync(dev);
		dg_graph *g = NULL;
		expect_ok(dev, dg_graph_begin(dev), "dg_graph_begin");
		expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), "gate_fwd (captured)");
		expect_ok(dev, dg_graph_end(dev, &g), "dg_graph_end");
		cr_assert_not_null(g);
		static const uint32_t ks[] = { 3, 9, 3 };
		for (size_t r = 0; r < sizeof(ks) / sizeof(ks[0]); r++) {
			char what[96];
			snprintf(what, sizeof(what), "gate %s replay %zu: step 100 + %u", dg_fmt_name(act), r, ks[r]);
			upload_to(dev, at, &ks[r], sizeof(ks[r]));
			expect_ok(dev, dg_memset8(dev, txy.data, 0xff, ab), "dg_memset8");
			expect_ok(dev, dg_graph_launch(g), "dg_graph_launch");
			gh_sync(dev);
			gh_download(dev, got, txy.data, ab);
			cr_assert_eq(dg_ref_gate_fwd_op(act, xs, ys, (int64_t)n, p, seed, 100 + ks[r], layer, 0, want),
				     DG_OK);
			gh_expect_bytes(what, got, want, ab);
		}
		dg_graph_destroy(g);
		free(xs), free(ys), free(dxy), free(got), free(want), free(plain);
		free(gdxs), free(gdys), free(pdxs), free(pdys), free(wdxs), free(wdys);
	}
	gh_close(dev);
}

/* ---- elem0 ------------------------------------------------------------------------ */

/* gate_fwd and gate_bwd of b rows of (b0.., H, T, L) of the host batch
 * (xs, ys act; dxy gf), as a batch of their own drawing from elem0: xy,
 * dxs and dys (malloc'd). */
static void gate_rows(dg_device *dev, dg_fmt act, dg_fmt gf, int b, int b0, int H, int T, int L,
		      const drop *d, const void *xs, const void *ys, const void *dxy, void **xy, void **dxs,
		      void **dys)
{
	const size_t per = (size_t)H * T * L, n = (size_t)b * per, ab = n * esz(act), fb = n * esz(gf);
	const size_t ao = (size_t)b0 * per * esz(act), fo = (size_t)b0 * per * esz(gf);
	dg_tensor txs = dg_tensor_4d("xs", act, gh_upload(dev, (const char *)xs + ao, ab), b, H, T, L);
	dg_tensor tys = dg_tensor_4d("ys", act, gh_upload(dev, (const char *)ys + ao, ab), b, H, T, L);
	dg_tensor txy = dg_tensor_4d("xy", act, gh_alloc_ff(dev, ab), b, H, T, L);
	dg_tensor tdxy = dg_tensor_4d("dxy", gf, gh_upload(dev, (const char *)dxy + fo, fb), b, H, T, L);
	dg_tensor tdxs = dg_tensor_4d("dxs", gf, gh_alloc_ff(dev, fb), b, H, T, L);
	dg_spec sf = spec_of(DG_OP_GATE_FWD, act, H, 256, L, 0);
	dg_spec sb = spec_grads(DG_OP_GATE_BWD, act, gf, DG_FMT_F32, H, 256, L, 0);
	dg_gate_fwd_args fa = { .xs = &txs, .ys = &tys, .xy = &txy, .p = d->p, .seed = d->seed,
				.step = d->step, .layer = d->layer, .elem0 = d->elem0 };
	dg_gate_bwd_args ba = { .dxy = &tdxy, .xs = &txs, .ys = &tys, .dxs = &tdxs, .p = d->p,
				.seed = d->seed, .step = d->step, .layer = d->layer, .elem0 = d->elem0 };
	expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), "gate_fwd (rows)");
	expect_ok(dev, dg_gate_bwd(dev, &sb, &ba), "gate_bwd (rows)");
	*xy = gh_xmalloc(ab);
	*dxs = gh_xmalloc(fb);
	*dys = gh_xmalloc(fb);
	gh_download(dev, *xy, txy.data, ab);
	gh_download(dev, *dxs, tdxs.data, fb);
	gh_download(dev, *dys, tdxy.data, fb);
}

Test(gpu_gate, elem0_draws_the_global_batchs_masks)
{
	dg_device *dev = gh_open();
	gh_seed(26);
	/* (B, H, T, L): the scalar tail (H·T·L 273, not whole blocks), whole
	 * vectors (H·T·L 39000) */
	static const int shapes[][4] = { { 4, 3, 7, 13 }, { 4, 3, 130, 100 } };
	for (int a = 0; a < 2; a++)
		for (int g = 0; g < 2; g++)
			for (int k = 0; k < 2; k++) {
				dg_fmt act = a ? DG_FMT_BF16 : DG_FMT_F32, gf = g ? DG_FMT_BF16 : DG_FMT_F32;
				const int B = shapes[k][0], H = shapes[k][1], T = shapes[k][2], L = shapes[k][3],
					  hb = B / 2;
				char what[128];
				snprintf(what, sizeof(what), "gate %s grads %s B%d H%d T%d L%d: rows %d.. with elem0",
					 dg_fmt_name(act), dg_fmt_name(gf), B, H, T, L, hb);
				const size_t per = (size_t)H * T * L, n = (size_t)B * per;
				const size_t hab = (size_t)hb * per * esz(act), hfb = (size_t)hb * per * esz(gf);
				void *xs = rand_of(act, n), *ys = rand_of(act, n), *dxy = rand_of(gf, n);
				drop d = { 0.1f, 42, 7, 3, 0 };
				void *fxy, *fdxs, *fdys, *hxy, *hdxs, *hdys;
				gate_rows(dev, act, gf, B, 0, H, T, L, &d, xs, ys, dxy, &fxy, &fdxs, &fdys);
				d.elem0 = (uint64_t)hb * per;
				gate_rows(dev, act, gf, hb, hb, H, T, L, &d, xs, ys, dxy, &hxy, &hdxs, &hdys);
				gh_expect_bytes(what, hxy, (char *)fxy + hab, hab);
				gh_expect_bytes(what, hdxs, (char *)fdxs + hfb, hfb);
				gh_expect_bytes(what, hdys, (char *)fdys + hfb, hfb);
				free(hxy), free(hdxs), free(hdys);
				d.elem0 = 0; /* the half's own masks: not the global batch's */
				gate_rows(dev, act, gf, hb, hb, H, T, L, &d, xs, ys, dxy, &hxy, &hdxs, &hdys);
				cr_assert_neq(memcmp(hxy, (char *)fxy + hab, hab), 0, "%s: elem0 0 gave the same mask", what);
				free(hxy), free(hdxs), free(hdys);
				free(xs), free(ys), free(dxy), free(fxy), free(fdxs), free(fdys);
				/* any elem0 against the reference: blocks straddled (1, 2, 3
				 * past a multiple of 4), and the counter's high word */
				static const uint64_t offs[] = { 13, 6, 3, (1ull << 34) + 4, (1ull << 34) + 2 };
				for (size_t o = 0; o < sizeof(offs) / sizeof(offs[0]); o++) {
					const drop e = { 0.1f, 42, 7, 3, offs[o] };
					free(check_gate_g(dev, act, gf, B, H, T, L, 0, &e));
				}
			}
	gh_close(dev);
}

/* ---- gate_quant ------------------------------------------------------------ */

static double wall_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* gate_quant at (B, H, T, L) against gate_fwd then quantize_act on the
 * device and against the references; time: print both ways' time. */
static void check_gate_quant(dg_device *dev, dg_fmt src, dg_fmt act, int B, int H, int T, int L, int threads,
			     int stages, const drop *d, bool time)
{
	char what[200];
	snprintf(what, sizeof(what), "gate_quant %s -> %s B%d H%d T%d L%d t%d/%d p=%g elem0=%llu", dg_fmt_name(src),
		 dg_fmt_name(act), B, H, T, L, threads, stages, (double)d->p, (unsigned long long)d->elem0);
	const size_t n = (size_t)B * H * T * L, xb = n * esz(src), rows = (size_t)B * T;
	void *xs = rand_of(src, n), *ys = rand_of(src, n);
	dg_tensor txs = dg_tensor_4d("xs", src, gh_upload(dev, xs, xb), B, H, T, L);
	dg_tensor tys = dg_tensor_4d("ys", src, gh_upload(dev, ys, xb), B, H, T, L);
	dg_tensor tq = dg_tensor_4d("codes", act, gh_alloc_ff(dev, n), B, H, T, L);
	tq.scale = gh_alloc_ff(dev, rows * sizeof(float));
	dg_spec s;
	dg_spec_init(&s, DG_OP_GATE_QUANT);
	s.src = src, s.act = act, s.heads = H, s.latent = L, s.tile.threads = threads, s.tile.stages = stages;
	dg_spec_normalize(&s);
	dg_gate_quant_args a = { .xs = &txs, .ys = &tys, .codes = &tq, .p = d->p, .seed = d->seed, .step = d->step,
				 .layer = d->layer, .elem0 = d->elem0 };
	if (stages && L % (src == DG_FMT_BF16 ? 8 : 4)) { /* the staged form takes whole vectors */
		cr_assert_neq(dg_gate_quant(dev, &s, &a), DG_OK, "%s: run", what);
		cr_assert(strstr(dg_device_errmsg(dev), "staged"), "%s: %s", what, dg_device_errmsg(dev));
		free(xs), free(ys);
		return;
	}
	expect_ok(dev, dg_gate_quant(dev, &s, &a), what);
	unsigned char *got = gh_xmalloc(n), *want = gh_xmalloc(n), *two = gh_xmalloc(n);
	float *gs = gh_xmalloc(rows * sizeof(float)), *ws = gh_xmalloc(rows * sizeof(float));
	float *ts = gh_xmalloc(rows * sizeof(float));
	gh_download(dev, got, tq.data, n);
	gh_download(dev, gs, tq.scale, rows * sizeof(float));
	/* the reference: gate_fwd's xy, then a scale a token */
	void *xy = gh_xmalloc(xb);
	cr_assert_eq(dg_ref_gate_fwd_op(src, xs, ys, (int64_t)n, d->p, d->seed, d->step, d->layer, d->elem0, xy), DG_OK);
	cr_assert_eq(dg_ref_quantize_act_rows(src, act, xy, (size_t)B, (size_t)H, (size_t)T, (size_t)L, want, ws), DG_OK);
	gh_expect_bytes(what, got, want, n);
	cr_assert_eq(memcmp(gs, ws, rows * sizeof(float)), 0, "%s: the scales differ from the reference's", what);
	/* the two ops on the device */
	dg_tensor txy = dg_tensor_4d("xy", src, gh_alloc_ff(dev, xb), B, H, T, L);
	dg_tensor tq2 = dg_tensor_4d("codes", act, gh_alloc_ff(dev, n), B, H, T, L);
	tq2.scale = gh_alloc_ff(dev, rows * sizeof(float));
	dg_spec sf = spec_of(DG_OP_GATE_FWD, src, H, 256, L, 0);
	dg_gate_fwd_args fa = { .xs = &txs, .ys = &tys, .xy = &txy, .p = d->p, .seed = d->seed, .step = d->step,
				.layer = d->layer, .elem0 = d->elem0 };
	dg_spec sq;
	dg_spec_init(&sq, DG_OP_QUANTIZE_ACT);
	sq.src = src, sq.act = act, sq.ascale = DG_SCALE_TOKEN;
	dg_spec_normalize(&sq);
	dg_quantize_act_args qa = { .x = &txy, .codes = &tq2 };
	expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
	expect_ok(dev, dg_quantize_act(dev, &sq, &qa), what);
	gh_download(dev, two, tq2.data, n);
	gh_download(dev, ts, tq2.scale, rows * sizeof(float));
	cr_assert_eq(memcmp(got, two, n), 0, "%s: the codes differ from gate_fwd then quantize_act", what);
	cr_assert_eq(memcmp(gs, ts, rows * sizeof(float)), 0, "%s: the scales differ from quantize_act's", what);
	if (time) {
		const int reps = 20;
		gh_sync(dev);
		double t0 = wall_s();
		for (int r = 0; r < reps; r++)
			expect_ok(dev, dg_gate_quant(dev, &s, &a), what);
		gh_sync(dev);
		double t1 = wall_s();
		for (int r = 0; r < reps; r++) {
			expect_ok(dev, dg_gate_fwd(dev, &sf, &fa), what);
			expect_ok(dev, dg_quantize_act(dev, &sq, &qa), what);
		}
		gh_sync(dev);
		double t2 = wall_s();
		printf("%s: %.1f us, gate_fwd then quantize_act %.1f us\n", what, (t1 - t0) / reps * 1e6,
		       (t2 - t1) / reps * 1e6);
	}
	free(xs), free(ys), free(got), free(want), free(two), free(gs), free(ws), free(ts), free(xy);
}

Test(gpu_gate, gate_quant_is_gate_then_quantizer, .timeout = 600)
{
	dg_device *dev = gh_open();
	gh_seed(97);
	const drop none = { 0.0f, 1, 0, 0, 0 }, a = { 0.1f, 42, 7, 3, 13 };
	static const int shapes[][4] = { { 2, 3, 7, 13 }, { 2, 1, 130, 64 }, { 2, 4, 5, 256 }, { 1, 3, 3, 1000 } };
	/* the default, t64, and the staged form at 256 and 128 threads */
	static const int tiles[][2] = { { 0, 0 }, { 64, 0 }, { 256, 1 }, { 128, 1 } };
	for (int sf = 0; sf < 2; sf++)
		for (int af = 0; af < 2; af++)
			for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++)
				for (int th = 0; th < 4; th++)
					for (int dr = 0; dr < 2; dr++)
						check_gate_quant(dev, sf ? DG_FMT_BF16 : DG_FMT_F32,
								 af ? DG_FMT_INT8 : DG_FMT_UINT8POS, shapes[k][0], shapes[k][1],
								 shapes[k][2], shapes[k][3], tiles[th][0], tiles[th][1],
								 dr ? &a : &none, false);
	for (int th = 0; th < 4; th++) {
		if (th == 1)
			continue;
		check_gate_quant(dev, DG_FMT_BF16, DG_FMT_UINT8POS, 8, 4, 512, 8192, tiles[th][0], tiles[th][1], &a, true);
		check_gate_quant(dev, DG_FMT_BF16, DG_FMT_UINT8POS, 8, 4, 512, 8192, tiles[th][0], tiles[th][1], &none,
				 true);
	}
	/* codes over xs: refused */
	dg_spec s;
	dg_spec_init(&s, DG_OP_GATE_QUANT);
	s.heads = 1, s.latent = 64;
	dg_spec_normalize(&s);
	dg_dptr buf = gh_alloc(dev, 64 * 2 * 4);
	dg_tensor txs = dg_tensor_4d("xs", DG_FMT_BF16, buf, 1, 1, 4, 64), tys = txs;
	tys.data = gh_alloc(dev, 64 * 2 * 4);
	dg_tensor tq = dg_tensor_4d("codes", DG_FMT_UINT8POS, buf, 1, 1, 4, 64);
	tq.scale = gh_alloc(dev, 16);
	dg_gate_quant_args qa = { .xs = &txs, .ys = &tys, .codes = &tq };
	cr_assert_eq(dg_gate_quant(dev, &s, &qa), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "codes") && strstr(dg_device_errmsg(dev), "alias"), "%s",
		  dg_device_errmsg(dev));
	gh_close(dev);
}
