/*
 * GPU tests of attention_step (templates/attention_step.lua; runtime/ops/
 * attention.c) against its CPU reference dg_ref_attention_step (which
 * tests/test_ref_attention.c holds to the model's recurrence and the
 * quadratic form). Skip without a device (gh_open); fail instead with
 * DRAGON_REQUIRE_GPU=1.
 *
 *   - B 3, H 2, latent 64 and 256, embd 32 and 64, act f32 and bf16, the
 *     default block and t64: 12 tokens in a row, each row at its own
 *     position (0, 1000, 65530 onwards), xs sparse (pairs of zeros, as a
 *     ReLU's); every token's out against the reference's, then the state;
 *   - out starts as 0xff bytes (NaN): an unwritten element fails;
 *   - determinism: the same tokens from the same state give the same bytes;
 *   - the BDH shape (latent 8192, embd 256, H 4, bf16) at B 1 and 64, each
 *     against the reference after 3 tokens, and the time a token (printed:
 *     µs and the state's bytes read and written a second).
 *   - a window of T tokens a row (a prefill, dg_attention_window): against
 *     the reference token by token, and against T calls of one token on the
 *     device bit for bit (out and state), at latent 64, 256, 8192 and 16384
 *     (past the rows it stages in shared memory on sm_90: the rest in
 *     memory), with the time a token of a 256-token window at the BDH shape.
 *
 * Tolerance (dg_ref_close_norm): f32 1e-5, bf16 1e-2 for out; the state is
 * f32 either way (its update is one fmaf an element: 1e-6).
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dragon/ops.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

static dg_spec spec_of(dg_fmt act, int H, int N, int D, int threads)
{
	dg_spec s = dg_test_spec_sized(DG_OP_ATTENTION_STEP, H, D, N);
	s.act = act;
	s.tile.threads = threads;
	dg_spec_normalize(&s);
	return s;
}

static float as_f32(dg_fmt f, const void *p, size_t i)
{
	return f == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Host bytes into an existing device buffer. */
static void upload_to(dg_device *dev, dg_dptr d, const void *host, size_t bytes)
{
	cr_assert_eq(dg_memcpy_htod(dev, d, host, bytes), DG_OK, "%s", dg_device_errmsg(dev));
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* `steps` tokens of B rows against the reference; `time`: then the time
 * of a token. */
static void check(dg_device *dev, dg_fmt act, int B, int H, int N, int D, int threads, int steps, bool time)
{
	char what[200];
	snprintf(what, sizeof(what), "attention_step %s B%d H%d N%d D%d t%d", dg_fmt_name(act), B, H, N, D,
		 threads);
	const dg_spec s = spec_of(act, H, N, D, threads);
	const size_t nx = (size_t)B * H * N, nv = (size_t)B * D, no = (size_t)B * H * D,
		     ns = (size_t)B * H * N * D;
	float *freq = gh_xmalloc((size_t)N * sizeof(float)), *pos = gh_xmalloc((size_t)B * sizeof(float));
	float *state = gh_xmalloc(ns * sizeof(float)), *gstate = gh_xmalloc(ns * sizeof(float));
	float *got = gh_xmalloc(no * sizeof(float)), *want = gh_xmalloc(no * sizeof(float));
	void *gout = gh_xmalloc(gh_bytes(act, no)), *wout = gh_xmalloc(gh_bytes(act, no));
	void *again = gh_xmalloc(gh_bytes(act, no));
	dg_ref_rope_freq(N, freq);
	for (size_t i = 0; i < ns; i++)
		state[i] = 0.1f * gh_uniform(-1.0f, 1.0f); /* a state with a past */
	dg_dptr dstate = gh_upload(dev, state, ns * sizeof(float)), dfreq = gh_upload(dev, freq, (size_t)N * 4);
	dg_dptr dxs = gh_alloc(dev, gh_bytes(act, nx)), dv = gh_alloc(dev, gh_bytes(act, nv));
	dg_dptr dpos = gh_alloc(dev, (size_t)B * 4), dout = gh_alloc_ff(dev, gh_bytes(act, no));
	dg_tensor txs = dg_tensor_4d("xs", act, dxs, B, H, 1, N), tv = dg_tensor_4d("v", act, dv, B, 1, 1, D);
	dg_tensor tpos = dg_tensor_1d("pos", DG_FMT_F32, dpos, B), tfreq = dg_tensor_1d("freq", DG_FMT_F32, dfreq, N);
	dg_tensor tst = dg_tensor_4d("state", DG_FMT_F32, dstate, B, H, N, D);
	dg_tensor tout = dg_tensor_4d("out", act, dout, B, H, 1, D);
	dg_attention_step_args a = { .xs = &txs, .pos = &tpos, .freq = &tfreq, .v = &tv, .state = &tst, .out = &tout };
	const float atol = act == DG_FMT_BF16 ? 1e-2f : 1e-5f;
	for (int k = 0; k < steps; k++) {
		void *xs = dg_test_sparse_pairs(gh_rng(), act, nx, 0.2f), *v = gh_rand_storage(act, nv, NULL);
		for (int b = 0; b < B; b++)
			pos[b] = (float)(k + (b == 0 ? 0 : b == 1 ? 1000 : 65530 + 7 * b));
		upload_to(dev, dxs, xs, gh_bytes(act, nx));
		upload_to(dev, dv, v, gh_bytes(act, nv));
		upload_to(dev, dpos, pos, (size_t)B * 4);
		cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_attention_step(&s, xs, pos, freq, v, state, wout, B, 1), DG_OK);
		gh_download(dev, gout, dout, gh_bytes(act, no));
		for (size_t i = 0; i < no; i++) {
			got[i] = as_f32(act, gout, i);
			want[i] = as_f32(act, wout, i);
		}
		char w2[240];
		snprintf(w2, sizeof(w2), "%s token %d: out", what, k);
		gh_expect_close(w2, got, want, no, atol, atol);
		free(xs);
		free(v);
	}
	gh_download(dev, gstate, dstate, ns * sizeof(float));
	gh_expect_close(what, gstate, state, ns, 1e-5f, 1e-5f);
	/* the same token from the same state: the same bytes */
	upload_to(dev, dstate, state, ns * sizeof(float));
	cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gout, dout, gh_bytes(act, no));
	upload_to(dev, dstate, state, ns * sizeof(float));
	cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, again, dout, gh_bytes(act, no));
	cr_assert_eq(memcmp(gout, again, gh_bytes(act, no)), 0, "%s: a second run differs", what);
	if (time) {
		const int reps = 200;
		gh_sync(dev);
		double t0 = now_s();
		for (int r = 0; r < reps; r++)
			cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
		gh_sync(dev);
		double us = (now_s() - t0) / reps * 1e6;
		/* the pairs with a nonzero xs (80% here): their rows read and written */
		double bytes = 2.0 * 0.8 * (double)ns * 4.0;
		printf("%s: %.1f us a token a layer, %.0f GB/s of the state's traffic (80%% of its rows)\n", what, us,
		       bytes / (us * 1e-6) * 1e-9);
	}
	free(freq), free(pos), free(state), free(gstate), free(got), free(want), free(gout), free(wout),
		free(again);
}

Test(gpu_attention_step, small_shapes_against_the_reference)
{
	dg_device *dev = gh_open();
	gh_seed(71);
	for (int f = 0; f < 2; f++) {
		dg_fmt act = f ? DG_FMT_BF16 : DG_FMT_F32;
		check(dev, act, 3, 2, 64, 32, 0, 12, false);
		check(dev, act, 3, 2, 256, 64, 64, 12, false);
	}
	gh_close(dev);
}

Test(gpu_attention_step, bdh_shape_and_time, .timeout = 600)
{
	dg_device *dev = gh_open();
	gh_seed(73);
	check(dev, DG_FMT_BF16, 1, 4, 8192, 256, 0, 3, true);
	check(dev, DG_FMT_BF16, 64, 4, 8192, 256, 0, 2, true);
	gh_close(dev);
}

/* A window of T tokens a row: against the reference (which runs them one
 * by one), then against T one-token calls on the device, bit for bit. */
static void check_window(dg_device *dev, dg_fmt act, int B, int H, int N, int D, int threads, int T, bool time)
{
	char what[200];
	snprintf(what, sizeof(what), "attention_step window %s B%d H%d N%d D%d T%d t%d", dg_fmt_name(act), B, H, N,
		 D, T, threads);
	const dg_spec s = spec_of(act, H, N, D, threads);
	const size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, no = (size_t)B * H * T * D,
		     ns = (size_t)B * H * N * D;
	const size_t nx1 = (size_t)B * H * N, nv1 = (size_t)B * D, no1 = (size_t)B * H * D;
	float *freq = gh_xmalloc((size_t)N * sizeof(float)), *pos = gh_xmalloc((size_t)B * sizeof(float));
	float *state = gh_xmalloc(ns * sizeof(float)), *want_state = gh_xmalloc(ns * sizeof(float));
	float *gstate = gh_xmalloc(ns * sizeof(float)), *tstate = gh_xmalloc(ns * sizeof(float));
	float *got = gh_xmalloc(no * sizeof(float)), *want = gh_xmalloc(no * sizeof(float));
	void *gout = gh_xmalloc(gh_bytes(act, no)), *wout = gh_xmalloc(gh_bytes(act, no));
	void *tout = gh_xmalloc(gh_bytes(act, no)), *x1 = gh_xmalloc(gh_bytes(act, nx1));
	void *v1 = gh_xmalloc(gh_bytes(act, nv1));
	float *p1 = gh_xmalloc((size_t)B * sizeof(float));
	dg_ref_rope_freq(N, freq);
	for (size_t i = 0; i < ns; i++)
		state[i] = want_state[i] = 0.1f * gh_uniform(-1.0f, 1.0f);
	for (int b = 0; b < B; b++)
		pos[b] = (float)(b == 0 ? 0 : b == 1 ? 1000 : 65530 + 7 * b);
	void *xs = dg_test_sparse_pairs(gh_rng(), act, nx, 0.2f), *v = gh_rand_storage(act, nv, NULL);
	dg_dptr dstate = gh_upload(dev, state, ns * sizeof(float)), dfreq = gh_upload(dev, freq, (size_t)N * 4);
	dg_dptr dxs = gh_upload(dev, xs, gh_bytes(act, nx)), dv = gh_upload(dev, v, gh_bytes(act, nv));
	dg_dptr dpos = gh_upload(dev, pos, (size_t)B * 4), dout = gh_alloc_ff(dev, gh_bytes(act, no));
	dg_tensor txs = dg_tensor_4d("xs", act, dxs, B, H, T, N), tv = dg_tensor_4d("v", act, dv, B, 1, T, D);
	dg_tensor tpos = dg_tensor_1d("pos", DG_FMT_F32, dpos, B), tfreq = dg_tensor_1d("freq", DG_FMT_F32, dfreq, N);
	dg_tensor tst = dg_tensor_4d("state", DG_FMT_F32, dstate, B, H, N, D);
	dg_tensor tout_t = dg_tensor_4d("out", act, dout, B, H, T, D);
	dg_attention_step_args a = { .xs = &txs, .pos = &tpos, .freq = &tfreq, .v = &tv, .state = &tst, .out = &tout_t };
	cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	gh_download(dev, gout, dout, gh_bytes(act, no));
	gh_download(dev, gstate, dstate, ns * sizeof(float));
	cr_assert_eq(dg_ref_attention_step(&s, xs, pos, freq, v, want_state, wout, B, T), DG_OK);
	for (size_t i = 0; i < no; i++) {
		got[i] = as_f32(act, gout, i);
		want[i] = as_f32(act, wout, i);
	}
	const float atol = act == DG_FMT_BF16 ? 1e-2f : 1e-5f;
	gh_expect_close(what, got, want, no, atol, atol);
	gh_expect_close(what, gstate, want_state, ns, 1e-5f, 1e-5f);

	/* the same tokens one at a time from the same state, on the device */
	upload_to(dev, dstate, state, ns * sizeof(float));
	dg_dptr dx1 = gh_alloc(dev, gh_bytes(act, nx1)), dv1 = gh_alloc(dev, gh_bytes(act, nv1));
	dg_dptr dp1 = gh_alloc(dev, (size_t)B * 4), do1 = gh_alloc_ff(dev, gh_bytes(act, no1));
	dg_tensor t1x = dg_tensor_4d("xs", act, dx1, B, H, 1, N), t1v = dg_tensor_4d("v", act, dv1, B, 1, 1, D);
	dg_tensor t1p = dg_tensor_1d("pos", DG_FMT_F32, dp1, B), t1o = dg_tensor_4d("out", act, do1, B, H, 1, D);
	dg_attention_step_args a1 = { .xs = &t1x, .pos = &t1p, .freq = &tfreq, .v = &t1v, .state = &tst, .out = &t1o };
	const size_t ex = gh_bytes(act, 1);
	for (int t = 0; t < T; t++) {
		for (int b = 0; b < B; b++) {
			p1[b] = pos[b] + (float)t;
			memcpy((char *)v1 + (size_t)b * D * ex, (const char *)v + ((size_t)b * T + t) * D * ex, (size_t)D * ex);
			for (int h = 0; h < H; h++)
				memcpy((char *)x1 + ((size_t)b * H + h) * N * ex,
				       (const char *)xs + (((size_t)b * H + h) * T + t) * N * ex, (size_t)N * ex);
		}
		upload_to(dev, dx1, x1, gh_bytes(act, nx1));
		upload_to(dev, dv1, v1, gh_bytes(act, nv1));
		upload_to(dev, dp1, p1, (size_t)B * 4);
		cr_assert_eq(dg_attention_step(dev, &s, &a1), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		void *o1 = gh_xmalloc(gh_bytes(act, no1));
		gh_download(dev, o1, do1, gh_bytes(act, no1));
		for (int b = 0; b < B; b++)
			for (int h = 0; h < H; h++)
				memcpy((char *)tout + (((size_t)b * H + h) * T + t) * D * ex,
				       (const char *)o1 + ((size_t)b * H + h) * D * ex, (size_t)D * ex);
		free(o1);
	}
	gh_download(dev, tstate, dstate, ns * sizeof(float));
	cr_assert_eq(memcmp(gout, tout, gh_bytes(act, no)), 0, "%s: out differs from %d one-token calls", what, T);
	cr_assert_eq(memcmp(gstate, tstate, ns * sizeof(float)), 0, "%s: the state differs from %d one-token calls",
		     what, T);
	if (time) {
		const int reps = 20;
		gh_sync(dev);
		double t0 = now_s();
		for (int r = 0; r < reps; r++)
			cr_assert_eq(dg_attention_step(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
		gh_sync(dev);
		double us = (now_s() - t0) / reps * 1e6;
		printf("%s: %.1f us a window, %.2f us a token a layer (one-token calls: above)\n", what, us, us / T);
	}
	free(freq), free(pos), free(state), free(want_state), free(gstate), free(tstate), free(got), free(want),
		free(gout), free(wout), free(tout), free(x1), free(v1), free(p1), free(xs), free(v);
}

Test(gpu_attention_step, window_is_its_tokens, .timeout = 600)
{
	dg_device *dev = gh_open();
	gh_seed(79);
	for (int f = 0; f < 2; f++) {
		dg_fmt act = f ? DG_FMT_BF16 : DG_FMT_F32;
		check_window(dev, act, 3, 2, 64, 32, 0, 12, false);
		check_window(dev, act, 3, 2, 256, 64, 64, 9, false);
	}
	check_window(dev, DG_FMT_BF16, 1, 4, 8192, 256, 0, 16, false);
	check_window(dev, DG_FMT_BF16, 2, 2, 16384, 64, 0, 5, false);
	check_window(dev, DG_FMT_BF16, 1, 4, 8192, 256, 0, 256, true);
	gh_close(dev);
}

Test(gpu_attention_step, refusals)
{
	dg_device *dev = gh_open();
	const dg_spec s = spec_of(DG_FMT_F32, 2, 64, 32, 0);
	dg_dptr d = gh_alloc(dev, (size_t)3 * 2 * 64 * 32 * 4);
	dg_tensor txs = dg_tensor_4d("xs", DG_FMT_F32, d, 3, 2, 1, 64), tv = dg_tensor_4d("v", DG_FMT_F32, d, 3, 1, 1, 32);
	dg_tensor tpos = dg_tensor_1d("pos", DG_FMT_F32, d, 3), tfreq = dg_tensor_1d("freq", DG_FMT_F32, d, 64);
	dg_tensor tst = dg_tensor_4d("state", DG_FMT_F32, d, 3, 2, 64, 32);
	dg_tensor bad = dg_tensor_4d("state", DG_FMT_F32, d, 3, 2, 32, 32); /* latent 32, not 64 */
	dg_tensor tout = dg_tensor_4d("out", DG_FMT_F32, d, 3, 2, 1, 32);
	dg_attention_step_args a = { .xs = &txs, .pos = &tpos, .freq = &tfreq, .v = &tv, .state = &bad, .out = &tout };
	cr_assert_neq(dg_attention_step(dev, &s, &a), DG_OK);
	cr_assert(strstr(dg_device_errmsg(dev), "state"), "%s", dg_device_errmsg(dev));
	a.state = &tst;
	a.pos = NULL;
	cr_assert_neq(dg_attention_step(dev, &s, &a), DG_OK);
	gh_close(dev);
}
