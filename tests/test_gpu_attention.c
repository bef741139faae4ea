/*
 * GPU tests of the attention family (templates/rope.lua, attention.lua;
 * runtime/ops/attention.c) against the CPU references of
 * runtime/ref/attention.c (which tests/test_ref_attention.c holds to
 * the model's dg_ref_attention_fwd / _bwd). Skip without a device
 * (gh_open); fail instead with DRAGON_REQUIRE_GPU=1.
 *
 *   - small odd shapes (T = 1, 7, 65, 130; latent 64 / 128; embd 32 / 64;
 *     B = 2, H = 2), act f32 and bf16, on the default tile and two others
 *     (a tensor-core tile with one buffer, a SIMT tile): rope_fwd and
 *     rope_bwd bit for bit; each GEMM op fed the reference's inputs, so
 *     each is judged alone; scores exactly 0 on and above the diagonal,
 *     grad_scores exactly symmetric with a zero diagonal;
 *   - every output starts as 0xff bytes (NaN): an unwritten element fails;
 *   - bitwise determinism: a second run of each op gives the same bytes;
 *   - the chains dg_attention_fwd / _bwd give the ops' bytes, and a short
 *     workspace is refused by name;
 *   - the BDH shape (B 8, H 4, T 512, latent 8192, embd 256, bf16, default
 *     tiles) with the reference on sampled (b, h) slices, and each op's
 *     time (printed: TFLOP/s and the fraction of 790, bf16's measured peak);
 *   - on sm_90, the warpgroup path (arch=sm_90a, rope=pre: scores and
 *     grad_xs read qr = RoPE(xs)) on the small shapes and four tiles,
 *     against the references given the same qr; the chains with rope=pre
 *     (their workspace holds qr) against the rope-on-the-load chains; and
 *     its BDH-shape times beside rope_fwd's;
 *   - grad_xs epi=mask (the model's add_mask fused: dxs = (dxs +
 *     grad_xs)·[mask_xs > 0] in place) on the warpgroup path (four tiles,
 *     sm_90) and the mma.sync and fp32 ones, dxs bf16 and f32, at T 64 and
 *     100 (ragged) and latent 128, 256 and 100 (L % 8 != 0), against its
 *     reference (grad_xs in f32 then add_mask), bit for bit against the
 *     unfused pair on the GPU (grad_xs out=f32 on the same tile, then
 *     add_mask), 0 where the mask (zeros and negatives) is not > 0; the
 *     backward chain given dxs against the chain given grad_xs and then
 *     add_mask; the BDH shape on sampled slices with the fused op's time
 *     beside the pair's.
 *
 * Tolerance (dg_ref_close_norm: the norm of the error against the norm of
 * the reference, and every element against the largest reference value):
 * f32 1e-5 and 1e-5 — the fp32 sums of at most 8192 terms err by about
 * √K·2^-24 of the terms' state; bf16 1e-2 and 2e-2 — operands rounded once
 * to bf16 (2^-9 relative), f32 sums, act outputs rounded once more.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ref/ref_ops.h"

typedef struct shape {
	int B, H, T, N, D;
} shape;

static dg_spec spec_of(dg_op op, dg_fmt act, const shape *s, const dg_tile *tile)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	if (dg_spec_uses(op) & DG_FIELD_ACT)
		sp.act = act;
	sp.heads = s->H;
	sp.latent = s->N;
	sp.embd = s->D;
	if (tile && op != DG_OP_ROPE_FWD && op != DG_OP_ROPE_BWD)
		sp.tile = *tile;
	dg_spec_normalize(&sp);
	return sp;
}

static size_t act_size(dg_fmt act)
{
	return act == DG_FMT_BF16 ? 2 : 4;
}

/* n random floats in [lo, 1) stored in act (malloc'd); v gets the stored
 * values as floats. */
static void *rand_act(dg_fmt act, size_t n, float lo, float **v)
{
	float *f = gh_xmalloc(n * 4);
	void *st = gh_xmalloc(n * act_size(act));
	for (size_t i = 0; i < n; i++) {
		f[i] = gh_uniform(lo, 1.0f);
		if (act == DG_FMT_BF16) {
			((uint16_t *)st)[i] = dg_ref_f32_to_bf16(f[i]);
			f[i] = dg_ref_bf16_to_f32(((uint16_t *)st)[i]);
		} else {
			((float *)st)[i] = f[i];
		}
	}
	if (v)
		*v = f;
	else
		free(f);
	return st;
}

static float *widen(dg_fmt act, const void *p, size_t n)
{
	float *f = gh_xmalloc(n * 4);
	for (size_t i = 0; i < n; i++)
		f[i] = act == DG_FMT_BF16 ? dg_ref_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
	return f;
}

/* got (storage of fmt) against want (the same) by the path's bound. */
static void expect_close(const char *what, dg_fmt path, dg_fmt fmt, const void *got, const void *want,
			 size_t n)
{
	char why[512];
	float *g = widen(fmt, got, n), *w = widen(fmt, want, n);
	bool bf = path == DG_FMT_BF16;
	cr_assert(dg_ref_close_norm(g, w, n, bf ? 1e-2 : 1e-5, bf ? 2e-2f : 1e-5f, why, sizeof(why)), "%s (%s): %s",
		  what, dg_fmt_name(path), why);
	free(g);
	free(w);
}

/* A device copy of n bytes of host, and an output of n bytes of 0xff. */
#define UP(p, n) gh_upload(dev, (p), (n))
#define FF(n) gh_alloc_ff(dev, (n))

/* The typed call of s->op on t (inputs, then the output). */
static dg_status run_op(dg_device *dev, const dg_spec *s, const dg_tensor *const *t)
{
	switch (s->op) {
	case DG_OP_ROPE_FWD: {
		dg_rope_fwd_args a = { t[0], t[1], t[2] };
		return dg_rope_fwd(dev, s, &a);
	}
	case DG_OP_ROPE_BWD: {
		dg_rope_bwd_args a = { t[0], t[1], t[2] };
		return dg_rope_bwd(dev, s, &a);
	}
	case DG_OP_ATTENTION_SCORES: {
		dg_attention_scores_args a = { t[0], t[1], t[2] };
		return dg_attention_scores(dev, s, &a);
	}
	case DG_OP_ATTENTION_OUT: {
		dg_attention_out_args a = { t[0], t[1], t[2] };
		return dg_attention_out(dev, s, &a);
	}
	case DG_OP_ATTENTION_GRAD_SCORES: {
		dg_attention_grad_scores_args a = { t[0], t[1], t[2] };
		return dg_attention_grad_scores(dev, s, &a);
	}
	case DG_OP_ATTENTION_GRAD_V: {
		dg_attention_grad_v_args a = { t[0], t[1], t[2] };
		return dg_attention_grad_v(dev, s, &a);
	}
	default: {
		/* epi=mask: t[3] is dxs, t[4] mask_xs */
		bool mask = s->epi == DG_EPI_MASK;
		dg_attention_grad_xs_args a = { t[0], t[1], t[2], mask ? NULL : t[3], mask ? t[3] : NULL,
						mask ? t[4] : NULL };
		return dg_attention_grad_xs(dev, s, &a);
	}
	}
}

/* Runs s on inputs in[0..n_in) into a fresh 0xff output `out` (the
 * tensor's data is replaced), twice; returns the first result's bytes. */
static void *run_twice(dg_device *dev, const dg_spec *s, const dg_tensor *in, int n_in, dg_tensor out,
		       size_t bytes)
{
	const dg_tensor *t[4] = { NULL, NULL, NULL, NULL };
	void *r[2];
	for (int k = 0; k < 2; k++) {
		out.data = FF(bytes);
		for (int i = 0; i < n_in; i++)
			t[i] = &in[i];
		t[n_in] = &out;
		cr_assert_eq(run_op(dev, s, t), DG_OK, "%s: %s", dg_op_name(s->op), dg_device_errmsg(dev));
		r[k] = gh_xmalloc(bytes);
		gh_download(dev, r[k], out.data, bytes);
	}
	cr_assert_eq(memcmp(r[0], r[1], bytes), 0, "%s: two runs differ", dg_op_name(s->op));
	free(r[1]);
	return r[0];
}

/* n = B·H·T·T scores of act: exactly 0 on and above the diagonal. */
static void expect_causal(dg_fmt act, const void *scores, size_t bh, int T)
{
	float *gs = widen(act, scores, bh * T * T);
	for (size_t z = 0; z < bh; z++)
		for (int i = 0; i < T; i++)
			for (int j = i; j < T; j++)
				cr_assert_eq(gs[z * T * T + (size_t)i * T + j], 0.0f, "scores[%zu][%d][%d]", z, i, j);
	free(gs);
}

/* attention_scores sp (act) at shape s on in2 = { xs, rope }, twice: the
 * reference on the host xs into want (B·H·T·T values of act), compared by
 * act's bound, and exactly 0 on and above the diagonal. */
static void check_scores(dg_device *dev, const dg_spec *sp, dg_fmt act, const shape *s, const dg_tensor *in2,
			 const void *xs, const float *rope, void *want, const char *what)
{
	int B = s->B, H = s->H, T = s->T;
	size_t ns = (size_t)B * H * T * T;
	void *got = run_twice(dev, sp, in2, 2, dg_tensor_4d("scores", act, 0, B, H, T, T), ns * act_size(act));
	cr_assert_eq(dg_ref_attention_scores(sp, xs, rope, want, B, T), DG_OK);
	expect_close(what, act, act, got, want, ns);
	expect_causal(act, got, (size_t)B * H, T);
	free(got);
}

/* The RoPE table of T positions at latent N (dg_ref_rope_pairs; malloc'd). */
static float *rope_table(int T, int N)
{
	float *rope = gh_xmalloc((size_t)T * N * 4);
	dg_ref_rope_pairs(T, N, rope);
	return rope;
}

/* The inputs most cases share, drawn in this order from the test's
 * stream: the RoPE table (no draw), grad (B, H, T, D) f32 in [-1, 1),
 * with_gx a grad_x (B, H, T, N) f32 likewise, xs (B, H, T, N) act in
 * [0, 1) (xs_mask: rand_mask's, a ReLU's output with zeros and
 * negatives), v (B, 1, T, D) act in [-1, 1); each uploaded as a tensor. */
typedef struct inputs {
	float *rope, *g, *gx; /* gx NULL without with_gx */
	void *xs, *v;
	dg_tensor t_xs, t_rope, t_v, t_g, t_gx;
} inputs;

static void *rand_mask(dg_fmt act, size_t n);

static void inputs_make(dg_device *dev, dg_fmt act, const shape *s, bool with_gx, bool xs_mask, inputs *in)
{
	int B = s->B, H = s->H, T = s->T, N = s->N, D = s->D;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D, as = act_size(act);
	memset(in, 0, sizeof(*in));
	in->rope = rope_table(T, N);
	in->g = gh_xmalloc(ng * 4);
	for (size_t i = 0; i < ng; i++)
		in->g[i] = gh_uniform(-1.0f, 1.0f);
	if (with_gx) {
		in->gx = gh_xmalloc(nx * 4);
		for (size_t i = 0; i < nx; i++)
			in->gx[i] = gh_uniform(-1.0f, 1.0f);
	}
	in->xs = xs_mask ? rand_mask(act, nx) : rand_act(act, nx, 0.0f, NULL);
	in->v = rand_act(act, nv, -1.0f, NULL);
	in->t_xs = dg_tensor_4d("xs", act, UP(in->xs, nx * as), B, H, T, N);
	in->t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(in->rope, (size_t)T * N * 4), T, N);
	in->t_v = dg_tensor_4d("v", act, UP(in->v, nv * as), B, 1, T, D);
	in->t_g = dg_tensor_4d("grad", DG_FMT_F32, UP(in->g, ng * 4), B, H, T, D);
	if (with_gx)
		in->t_gx = dg_tensor_4d("grad", DG_FMT_F32, UP(in->gx, nx * 4), B, H, T, N);
}

static void inputs_free(inputs *in)
{
	free(in->rope), free(in->g), free(in->gx), free(in->xs), free(in->v);
}

/* The chains' spec: it carries every size of the step (heads, latent,
 * embd), which normalizing to one op's fields would drop; pre: the sm_90a
 * warpgroup path with rope=pre. */
static dg_spec chain_spec(dg_fmt act, const shape *s, bool pre)
{
	dg_spec sp = spec_of(DG_OP_ATTENTION_SCORES, act, s, NULL);
	sp.embd = s->D;
	if (pre) {
		sp.arch = 90;
		sp.arch_specific = true;
		sp.rope_pre = true;
	}
	return sp;
}

/* The shape the chain tests run. */
static const shape chain_shape = { 2, 2, 65, 128, 64 };

/* The outputs of the chains at shape s, each 0xff: scores and out in act,
 * grad_xs and grad_v f32. */
typedef struct chain_out {
	dg_tensor s, o, gx, gv;
} chain_out;

static chain_out chain_outputs(dg_device *dev, dg_fmt act, const shape *s)
{
	int B = s->B, H = s->H, T = s->T, N = s->N, D = s->D;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D;
	size_t ns = (size_t)B * H * T * T, as = act_size(act);
	chain_out c;
	c.s = dg_tensor_4d("scores", act, FF(ns * as), B, H, T, T);
	c.o = dg_tensor_4d("out", act, FF(ng * as), B, H, T, D);
	c.gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
	c.gv = dg_tensor_4d("grad_v", DG_FMT_F32, FF(nv * 4), B, 1, T, D);
	return c;
}

/* dg_attention_fwd then _bwd at chain_spec(act, s, pre) on in into co.
 * Each workspace is the size its query gives (the forward's: none with
 * rope on the load, qr with rope=pre; the backward's: the gradient of the
 * scores, and qr with rope=pre); a workspace 256 bytes short is refused
 * by name before the call with the full one (the forward's where it has
 * one, and the backward's). */
static void chain_run(dg_device *dev, dg_fmt act, const shape *s, bool pre, const inputs *in, const chain_out *co)
{
	size_t nx = (size_t)s->B * s->H * s->T * s->N, ns = (size_t)s->B * s->H * s->T * s->T;
	size_t qr = pre ? (nx * 2 + 255) / 256 * 256 : 0;
	dg_spec sp = chain_spec(act, s, pre);
	dg_attention_fwd_args fa = { .xs = &in->t_xs, .v = &in->t_v, .rope = &in->t_rope, .scores = &co->s,
				     .out = &co->o };
	size_t need = 0;
	cr_assert_eq(dg_attention_fwd_workspace(&sp, &fa, &need), DG_OK);
	cr_assert_eq(need, qr);
	if (need) {
		fa.ws = gh_workspace(dev, need - 256);
		cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_ERR_INVALID_ARG);
		cr_assert(strstr(dg_device_errmsg(dev), "ws"), "%s", dg_device_errmsg(dev));
		fa.ws = gh_workspace(dev, need);
	}
	cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_OK, "%s", dg_device_errmsg(dev));
	dg_attention_bwd_args ba = { .grad = &in->t_g, .xs = &in->t_xs, .v = &in->t_v, .rope = &in->t_rope,
				     .scores = &co->s, .grad_xs = &co->gx, .grad_v = &co->gv };
	cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need), DG_OK);
	cr_assert_eq(need, pre ? (ns * 2 + 255) / 256 * 256 + qr : ns * 2);
	ba.ws = gh_workspace(dev, need - 256);
	cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "ws"), "%s", dg_device_errmsg(dev));
	ba.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_OK, "%s", dg_device_errmsg(dev));
}

/* add_mask: dxs (out) += other (f32) where xs (act) > 0, at H heads of
 * latent N. */
static dg_spec add_mask_spec(dg_fmt act, dg_fmt out, int H, int N)
{
	dg_spec ms;
	dg_spec_init(&ms, DG_OP_ADD_MASK);
	ms.act = act;
	ms.out = out;
	ms.src = DG_FMT_F32;
	ms.heads = H;
	ms.latent = N;
	dg_spec_normalize(&ms);
	return ms;
}

static void small_case(dg_device *dev, dg_fmt act, const shape *s, const dg_tile *tile)
{
	int B = s->B, H = s->H, T = s->T, N = s->N, D = s->D;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D;
	size_t ns = (size_t)B * H * T * T, as = act_size(act);
	inputs in;
	inputs_make(dev, act, s, true, false, &in);
	const float *rope = in.rope, *g = in.g, *gx = in.gx;
	const void *xs = in.xs, *v = in.v;
	dg_tensor t_xs = in.t_xs, t_rope = in.t_rope, t_v = in.t_v, t_g = in.t_g, t_gx = in.t_gx;
	void *want_x = gh_xmalloc(nx * 4), *want_s = gh_xmalloc(ns * as), *want_c = gh_xmalloc(ns * as);
	void *want_o = gh_xmalloc(ng * as);
	float *want_gv = gh_xmalloc(nv * 4), *want_gx = gh_xmalloc(nx * 4);

	/* rope, bit for bit */
	dg_spec sp = spec_of(DG_OP_ROPE_FWD, act, s, NULL);
	dg_tensor in2[4] = { t_xs, t_rope };
	void *got = run_twice(dev, &sp, in2, 2, dg_tensor_4d("out", act, 0, B, H, T, N), nx * as);
	cr_assert_eq(dg_ref_rope_op(&sp, xs, rope, want_x, B, T), DG_OK);
	gh_expect_bytes("rope_fwd", got, want_x, nx * as);
	free(got);
	sp = spec_of(DG_OP_ROPE_BWD, act, s, NULL);
	in2[0] = t_gx;
	got = run_twice(dev, &sp, in2, 2, dg_tensor_4d("grad_x", DG_FMT_F32, 0, B, H, T, N), nx * 4);
	cr_assert_eq(dg_ref_rope_op(&sp, gx, rope, want_x, B, T), DG_OK);
	gh_expect_bytes("rope_bwd", got, want_x, nx * 4);
	free(got);

	/* scores: exactly 0 on and above the diagonal */
	sp = spec_of(DG_OP_ATTENTION_SCORES, act, s, tile);
	in2[0] = t_xs;
	check_scores(dev, &sp, act, s, in2, xs, rope, want_s, "attention_scores");

	/* out, from the reference's scores */
	dg_tensor t_s = dg_tensor_4d("scores", act, UP(want_s, ns * as), B, H, T, T);
	sp = spec_of(DG_OP_ATTENTION_OUT, act, s, tile);
	dg_tensor in_o[2] = { t_s, t_v };
	got = run_twice(dev, &sp, in_o, 2, dg_tensor_4d("out", act, 0, B, H, T, D), ng * as);
	cr_assert_eq(dg_ref_attention_out(&sp, want_s, v, want_o, B, T), DG_OK);
	expect_close("attention_out", act, act, got, want_o, ng);
	free(got);

	/* grad_scores: symmetric, zero diagonal, exactly */
	sp = spec_of(DG_OP_ATTENTION_GRAD_SCORES, act, s, tile);
	dg_tensor in_c[2] = { t_g, t_v };
	got = run_twice(dev, &sp, in_c, 2, dg_tensor_4d("grad_scores", act, 0, B, H, T, T), ns * as);
	cr_assert_eq(dg_ref_attention_grad_scores(&sp, g, v, want_c, B, T), DG_OK);
	expect_close("attention_grad_scores", act, act, got, want_c, ns);
	float *gs = widen(act, got, ns);
	for (size_t z = 0; z < (size_t)B * H; z++)
		for (int i = 0; i < T; i++)
			for (int j = 0; j <= i; j++) {
				float a = gs[z * T * T + (size_t)i * T + j], b = gs[z * T * T + (size_t)j * T + i];
				cr_assert(a == b && (i != j || a == 0.0f), "grad_scores[%zu][%d][%d]: %g vs %g", z, i, j,
					  (double)a, (double)b);
			}
	free(gs);
	free(got);

	/* grad_v from the reference's scores; heads summed in order */
	sp = spec_of(DG_OP_ATTENTION_GRAD_V, act, s, tile);
	dg_tensor in_v[2] = { t_s, t_g };
	got = run_twice(dev, &sp, in_v, 2, dg_tensor_4d("grad_v", DG_FMT_F32, 0, B, 1, T, D), nv * 4);
	cr_assert_eq(dg_ref_attention_grad_v(&sp, want_s, g, want_gv, B, T), DG_OK);
	expect_close("attention_grad_v", act, DG_FMT_F32, got, want_gv, nv);
	free(got);

	/* grad_xs from the reference's grad_scores */
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, UP(want_c, ns * as), B, H, T, T);
	sp = spec_of(DG_OP_ATTENTION_GRAD_XS, act, s, tile);
	dg_tensor in_x[3] = { t_c, t_xs, t_rope };
	got = run_twice(dev, &sp, in_x, 3, dg_tensor_4d("grad_xs", DG_FMT_F32, 0, B, H, T, N), nx * 4);
	cr_assert_eq(dg_ref_attention_grad_xs(&sp, want_c, xs, rope, want_gx, B, T), DG_OK);
	expect_close("attention_grad_xs", act, DG_FMT_F32, got, want_gx, nx);
	free(got);

	inputs_free(&in);
	free(want_x), free(want_s), free(want_c), free(want_o), free(want_gv), free(want_gx);
}

static const shape small_shapes[] = {
	{ 2, 2, 1, 64, 32 }, { 2, 2, 7, 128, 64 }, { 2, 2, 65, 64, 32 }, { 2, 2, 130, 128, 64 },
};

/* The default; a tensor-core tile (16x32 warp tiles, one buffer); a SIMT
 * tile (BK 8). */
static const dg_tile small_tiles[] = {
	{ 0, 0, 0, 0, 0, 0, 0 },
	{ 32, 64, 16, 2, 2, 1, 0 },
	{ 64, 32, 8, 2, 2, 2, 0 },
};

static void small_all(dg_fmt act)
{
	dg_device *dev = gh_open();
	gh_seed(act == DG_FMT_BF16 ? 0xbf16 : 0xf32);
	for (size_t i = 0; i < sizeof(small_shapes) / sizeof(small_shapes[0]); i++)
		for (size_t k = 0; k < sizeof(small_tiles) / sizeof(small_tiles[0]); k++)
			small_case(dev, act, &small_shapes[i], &small_tiles[k]);
	gh_close(dev);
}

Test(gpu_attention, small_shapes_f32)
{
	small_all(DG_FMT_F32);
}

Test(gpu_attention, small_shapes_bf16)
{
	small_all(DG_FMT_BF16);
}

/* rope_fwd (act) and rope_bwd (f32) at shape s, bit for bit the
 * reference. */
static void rope_case(dg_device *dev, dg_fmt act, const shape *s)
{
	int B = s->B, H = s->H, T = s->T, N = s->N;
	size_t nx = (size_t)B * H * T * N, as = act_size(act);
	char what[96];
	inputs in;
	inputs_make(dev, act, s, true, false, &in);
	void *want = gh_xmalloc(nx * 4);
	dg_spec sp = spec_of(DG_OP_ROPE_FWD, act, s, NULL);
	dg_tensor in2[2] = { in.t_xs, in.t_rope };
	void *got = run_twice(dev, &sp, in2, 2, dg_tensor_4d("out", act, 0, B, H, T, N), nx * as);
	cr_assert_eq(dg_ref_rope_op(&sp, in.xs, in.rope, want, B, T), DG_OK);
	snprintf(what, sizeof(what), "rope_fwd %s (%d,%d,%d,%d)", dg_fmt_name(act), B, H, T, N);
	gh_expect_bytes(what, got, want, nx * as);
	free(got);
	sp = spec_of(DG_OP_ROPE_BWD, act, s, NULL);
	in2[0] = in.t_gx;
	got = run_twice(dev, &sp, in2, 2, dg_tensor_4d("grad_x", DG_FMT_F32, 0, B, H, T, N), nx * 4);
	cr_assert_eq(dg_ref_rope_op(&sp, in.gx, in.rope, want, B, T), DG_OK);
	snprintf(what, sizeof(what), "rope_bwd (%d,%d,%d,%d)", B, H, T, N);
	gh_expect_bytes(what, got, want, nx * 4);
	free(got);
	free(want);
	inputs_free(&in);
}

/* RoPE's schedule (templates/rope.lua: a thread a table column over the
 * B·H rows, 8 or 4 rows in flight; the grid's y over row groups where the
 * columns are few): B·H not a multiple of the row group (9, 20, 3 rows),
 * row groups split over y (short T), odd T, the pair path (latent 36 and
 * 100: L % 8 != 0), and a long row at one T (latent 8192, 64 positions). */
Test(gpu_attention, rope_schedules)
{
	static const shape shapes[] = {
		{ 3, 3, 5, 64, 8 }, { 3, 3, 5, 36, 8 }, { 5, 4, 300, 128, 8 }, { 1, 3, 77, 100, 8 },
		{ 1, 4, 64, 8192, 8 }, { 2, 1, 1, 8, 8 },
	};
	dg_device *dev = gh_open();
	gh_seed(0x40be);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		rope_case(dev, DG_FMT_F32, &shapes[i]);
		rope_case(dev, DG_FMT_BF16, &shapes[i]);
	}
	gh_close(dev);
}

/* ---- the chains ------------------------------------------------------------------ */

Test(gpu_attention, chains_are_the_ops)
{
	dg_device *dev = gh_open();
	gh_seed(0xc4a1);
	shape s = chain_shape;
	int B = s.B, H = s.H, T = s.T, N = s.N, D = s.D;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D;
	size_t ns = (size_t)B * H * T * T;
	inputs in;
	inputs_make(dev, act, &s, false, false, &in);
	dg_tensor t_xs = in.t_xs, t_rope = in.t_rope, t_v = in.t_v, t_g = in.t_g;
	chain_out co = chain_outputs(dev, act, &s);
	dg_tensor t_s = co.s, t_o = co.o, t_gx = co.gx, t_gv = co.gv;
	chain_run(dev, act, &s, false, &in, &co);

	/* the ops one by one, on the chain's own intermediates */
	dg_tensor in2[3] = { t_xs, t_rope };
	dg_spec so = spec_of(DG_OP_ATTENTION_SCORES, act, &s, NULL);
	void *sc = run_twice(dev, &so, in2, 2, dg_tensor_4d("scores", act, 0, B, H, T, T), ns * 2);
	void *got = gh_xmalloc(nx * 4);
	gh_download(dev, got, t_s.data, ns * 2);
	gh_expect_bytes("dg_attention_fwd scores", got, sc, ns * 2);
	so = spec_of(DG_OP_ATTENTION_OUT, act, &s, NULL);
	dg_tensor in_o[2] = { t_s, t_v };
	void *o = run_twice(dev, &so, in_o, 2, dg_tensor_4d("out", act, 0, B, H, T, D), ng * 2);
	gh_download(dev, got, t_o.data, ng * 2);
	gh_expect_bytes("dg_attention_fwd out", got, o, ng * 2);
	so = spec_of(DG_OP_ATTENTION_GRAD_V, act, &s, NULL);
	dg_tensor in_v[2] = { t_s, t_g };
	void *gv = run_twice(dev, &so, in_v, 2, dg_tensor_4d("grad_v", DG_FMT_F32, 0, B, 1, T, D), nv * 4);
	gh_download(dev, got, t_gv.data, nv * 4);
	gh_expect_bytes("dg_attention_bwd grad_v", got, gv, nv * 4);
	so = spec_of(DG_OP_ATTENTION_GRAD_SCORES, act, &s, NULL);
	dg_tensor in_c[2] = { t_g, t_v };
	void *c = run_twice(dev, &so, in_c, 2, dg_tensor_4d("grad_scores", act, 0, B, H, T, T), ns * 2);
	so = spec_of(DG_OP_ATTENTION_GRAD_XS, act, &s, NULL);
	dg_tensor in_x[3] = { dg_tensor_4d("grad_scores", act, UP(c, ns * 2), B, H, T, T), t_xs, t_rope };
	void *gx = run_twice(dev, &so, in_x, 3, dg_tensor_4d("grad_xs", DG_FMT_F32, 0, B, H, T, N), nx * 4);
	gh_download(dev, got, t_gx.data, nx * 4);
	gh_expect_bytes("dg_attention_bwd grad_xs", got, gx, nx * 4);
	inputs_free(&in);
	free(sc), free(got), free(o), free(gv), free(c), free(gx);
	gh_close(dev);
}

/* ---- the BDH shape ----------------------------------------------------------------- */

typedef struct timed {
	dg_device *dev;
	dg_spec spec;
	const dg_tensor *t[5];
} timed;

static dg_status timed_call(void *user)
{
	timed *u = user;
	return run_op(u->dev, &u->spec, u->t);
}

typedef struct add_mask_call {
	dg_device *dev;
	const dg_spec *spec;
	const dg_add_mask_args *a;
} add_mask_call;

static dg_status add_mask_timed(void *user)
{
	add_mask_call *u = user;
	return dg_add_mask(u->dev, u->spec, u->a);
}

/* The median of 10 timed runs of fn(user) (cold L2). */
static double median_us(dg_device *dev, dg_timed_fn fn, void *user)
{
	dg_timer *tm = NULL;
	dg_timing r;
	cr_assert_eq(dg_timer_create(dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(dev));
	dg_timer_opts o = { .reps = 10 };
	cr_assert_eq(dg_timer_run(tm, &o, fn, user, &r), DG_OK, "%s", dg_device_errmsg(dev));
	dg_timer_destroy(tm);
	return r.median_us;
}

/* The (b, h) slices of the BDH shape (B 8, H 4) the references check. */
static const int bdh_samples[][2] = { { 0, 0 }, { 7, 3 }, { 3, 1 } };
#define N_BDH_SAMPLES 3

/* Times s on t and prints the rate of `flop` useful operations. */
static void report(dg_device *dev, const dg_spec *s, const dg_tensor *const *t, int n, double flop)
{
	timed u = { .dev = dev, .spec = *s };
	for (int i = 0; i < n; i++)
		u.t[i] = t[i];
	double us = median_us(dev, timed_call, &u);
	printf("bdh %-22s %9.1f us  %7.1f TFLOP/s  %5.1f%% of 790 (useful flops, cold L2)\n", dg_op_name(s->op),
	       us, flop / us * 1e-6, flop / us * 1e-6 / 790 * 100);
	fflush(stdout);
}

Test(gpu_attention, bdh_shape_sampled_bf16)
{
	dg_device *dev = gh_open();
	gh_seed(0xbd4);
	shape s = { 8, 4, 512, 8192, 256 };
	int B = s.B, H = s.H, T = s.T, N = s.N, D = s.D;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D;
	size_t ns = (size_t)B * H * T * T, tn = (size_t)T * N, tt = (size_t)T * T, td = (size_t)T * D;
	inputs in;
	inputs_make(dev, act, &s, false, false, &in);
	const float *rope = in.rope, *g = in.g;
	void *xs = in.xs, *v = in.v;
	dg_tensor t_xs = in.t_xs, t_rope = in.t_rope, t_v = in.t_v, t_g = in.t_g;
	dg_tensor t_s = dg_tensor_4d("scores", act, FF(ns * 2), B, H, T, T);
	dg_tensor t_o = dg_tensor_4d("out", act, FF(ng * 2), B, H, T, D);
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, FF(ns * 2), B, H, T, T);
	dg_tensor t_gv = dg_tensor_4d("grad_v", DG_FMT_F32, FF(nv * 4), B, 1, T, D);
	dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
	const dg_tensor *a_s[4] = { &t_xs, &t_rope, &t_s }, *a_o[4] = { &t_s, &t_v, &t_o };
	const dg_tensor *a_c[4] = { &t_g, &t_v, &t_c }, *a_v[4] = { &t_s, &t_g, &t_gv };
	const dg_tensor *a_x[4] = { &t_c, &t_xs, &t_rope, &t_gx };
	dg_spec s_s = spec_of(DG_OP_ATTENTION_SCORES, act, &s, NULL), s_o = spec_of(DG_OP_ATTENTION_OUT, act, &s, NULL);
	dg_spec s_c = spec_of(DG_OP_ATTENTION_GRAD_SCORES, act, &s, NULL);
	dg_spec s_v = spec_of(DG_OP_ATTENTION_GRAD_V, act, &s, NULL), s_x = spec_of(DG_OP_ATTENTION_GRAD_XS, act, &s, NULL);
	cr_assert_eq(run_op(dev, &s_s, a_s), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_o, a_o), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_c, a_c), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_v, a_v), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_x, a_x), DG_OK, "%s", dg_device_errmsg(dev));
	uint16_t *sc = gh_xmalloc(ns * 2), *o = gh_xmalloc(ng * 2), *c = gh_xmalloc(ns * 2);
	float *gv = gh_xmalloc(nv * 4), *gx = gh_xmalloc(nx * 4);
	gh_download(dev, sc, t_s.data, ns * 2);
	gh_download(dev, o, t_o.data, ng * 2);
	gh_download(dev, c, t_c.data, ns * 2);
	gh_download(dev, gv, t_gv.data, nv * 4);
	gh_download(dev, gx, t_gx.data, nx * 4);

	/* sampled slices: each op judged on its own GPU inputs */
	void *want = gh_xmalloc(tn * 4);
	shape one = { 1, 1, T, N, D };
	for (size_t k = 0; k < N_BDH_SAMPLES; k++) {
		const int *sl = bdh_samples[k];
		size_t z = (size_t)sl[0] * H + (size_t)sl[1], b = (size_t)sl[0];
		char what[64];
		dg_spec r = spec_of(DG_OP_ATTENTION_SCORES, act, &one, NULL);
		cr_assert_eq(dg_ref_attention_scores(&r, (uint16_t *)xs + z * tn, rope, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "scores (b %zu, h %d)", b, sl[1]);
		expect_close(what, act, act, sc + z * tt, want, tt);
		r = spec_of(DG_OP_ATTENTION_OUT, act, &one, NULL);
		cr_assert_eq(dg_ref_attention_out(&r, sc + z * tt, (uint16_t *)v + b * td, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "out (b %zu, h %d)", b, sl[1]);
		expect_close(what, act, act, o + z * td, want, td);
		r = spec_of(DG_OP_ATTENTION_GRAD_SCORES, act, &one, NULL);
		cr_assert_eq(dg_ref_attention_grad_scores(&r, g + z * td, (uint16_t *)v + b * td, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "grad_scores (b %zu, h %d)", b, sl[1]);
		expect_close(what, act, act, c + z * tt, want, tt);
		r = spec_of(DG_OP_ATTENTION_GRAD_XS, act, &one, NULL);
		cr_assert_eq(dg_ref_attention_grad_xs(&r, c + z * tt, (uint16_t *)xs + z * tn, rope, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "grad_xs (b %zu, h %d)", b, sl[1]);
		expect_close(what, act, DG_FMT_F32, gx + z * tn, want, tn);
		r = spec_of(DG_OP_ATTENTION_GRAD_V, act, &s, NULL); /* every head of batch row b */
		cr_assert_eq(dg_ref_attention_grad_v(&r, sc + b * H * tt, g + b * H * td, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "grad_v (b %zu)", b);
		expect_close(what, act, DG_FMT_F32, gv + b * td, want, td);
	}

	/* times: the useful flops (the strictly lower triangle where there is one) */
	double bh = (double)B * H, tri = (double)T * (T - 1) / 2;
	report(dev, &s_s, a_s, 3, bh * tri * N * 2);
	report(dev, &s_o, a_o, 3, bh * tri * D * 2);
	report(dev, &s_c, a_c, 3, bh * tri * D * 2);
	report(dev, &s_v, a_v, 3, bh * tri * D * 2);
	report(dev, &s_x, a_x, 4, bh * (double)T * T * N * 2);
	inputs_free(&in);
	free(sc), free(o), free(c), free(gv), free(gx), free(want);
	gh_close(dev);
}

/* ---- the sm_90a warpgroup path (rope=pre) ------------------------------------------ */

static dg_spec wg_spec(dg_op op, const shape *s, const dg_tile *tile)
{
	dg_spec sp = spec_of(op, DG_FMT_BF16, s, NULL);
	sp.arch = 90;
	sp.arch_specific = true;
	sp.rope_pre = true;
	if (tile)
		sp.tile = *tile;
	dg_spec_normalize(&sp);
	return sp;
}

/* The plan of sp names the warpgroup path: the warp-specialized form for an
 * auto tile where rows of L are a tensor map's (L % 8 == 0) or a ring of 5
 * to 8 stages, else the cp.async ring. */
static void expect_wgmma(const dg_spec *sp)
{
	const bool autot = dg_tile_is_auto(&sp->tile);
	bool ws = autot ? sp->latent % 8 == 0 : sp->tile.stages >= 5;
	/* attention_grad_xs at 4 stages and BN up to 128, its auto tile where
	 * the warp-specialized path runs: the persistent form */
	bool persistent = sp->op == DG_OP_ATTENTION_GRAD_XS && sp->latent % 8 == 0 &&
			  (autot || (sp->tile.stages == 4 && sp->tile.bn <= 128));
	gh_expect_path(sp, persistent ? "wgmma tma persistent" : ws ? "wgmma tma" : "wgmma bf16");
}

/* RoPE(xs) in act at shape s, the operand of rope=pre (malloc'd). */
static void *rope_of(dg_fmt act, const shape *s, const void *xs, const float *rope)
{
	size_t nx = (size_t)s->B * s->H * s->T * s->N;
	void *qr = gh_xmalloc(nx * act_size(act));
	dg_spec rs = spec_of(DG_OP_ROPE_FWD, act, s, NULL);
	cr_assert_eq(dg_ref_rope_op(&rs, xs, rope, qr, s->B, s->T), DG_OK);
	return qr;
}

static void wg_case(dg_device *dev, const shape *s, const dg_tile *tile)
{
	int B = s->B, H = s->H, T = s->T, N = s->N;
	size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T;
	dg_fmt act = DG_FMT_BF16;
	float *rope = rope_table(T, N);
	void *xs = rand_act(act, nx, 0.0f, NULL), *c = rand_act(act, ns, -1.0f, NULL);
	void *qr = rope_of(act, s, xs, rope), *want_s = gh_xmalloc(ns * 2);
	float *want_gx = gh_xmalloc(nx * 4);
	dg_tensor t_qr = dg_tensor_4d("xs", act, UP(qr, nx * 2), B, H, T, N);
	dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, (size_t)T * N * 4), T, N);
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, UP(c, ns * 2), B, H, T, T);

	dg_spec sp = wg_spec(DG_OP_ATTENTION_SCORES, s, tile);
	expect_wgmma(&sp);
	dg_tensor in2[2] = { t_qr, t_rope };
	check_scores(dev, &sp, act, s, in2, qr, rope, want_s, "attention_scores (wgmma)");

	sp = wg_spec(DG_OP_ATTENTION_GRAD_XS, s, tile);
	expect_wgmma(&sp);
	dg_tensor in3[3] = { t_c, t_qr, t_rope };
	void *got = run_twice(dev, &sp, in3, 3, dg_tensor_4d("grad_xs", DG_FMT_F32, 0, B, H, T, N), nx * 4);
	cr_assert_eq(dg_ref_attention_grad_xs(&sp, c, qr, rope, want_gx, B, T), DG_OK);
	expect_close("attention_grad_xs (wgmma)", act, DG_FMT_F32, got, want_gx, nx);
	/* out=bf16: the same sums, rounded once: the f32 output's bf16, bit for bit */
	sp.out = DG_FMT_BF16;
	dg_spec_normalize(&sp);
	void *gb = run_twice(dev, &sp, in3, 3, dg_tensor_4d("grad_xs", DG_FMT_BF16, 0, B, H, T, N), nx * 2);
	uint16_t *rb = gh_xmalloc(nx * 2);
	for (size_t i = 0; i < nx; i++)
		rb[i] = dg_f32_to_bf16(((const float *)got)[i]);
	gh_expect_bytes("attention_grad_xs out=bf16 (wgmma)", gb, rb, nx * 2);
	free(gb);
	free(rb);
	free(got);
	free(rope), free(xs), free(c), free(qr), free(want_s), free(want_gx);
}

/* T 1 and 7 (rows of C not 16-byte aligned: guarded element loads), 65,
 * 130 and 200 (ragged tiles). */
static const shape wg_shapes[] = {
	{ 2, 2, 1, 64, 32 }, { 2, 2, 7, 128, 64 }, { 2, 2, 65, 64, 32 }, { 1, 2, 130, 128, 64 },
	{ 1, 1, 200, 256, 32 },
};

/* The default tile and three others. */
static const dg_tile wg_tiles[] = {
	{ 0, 0, 0, 0, 0, 0, 0 },        { 64, 64, 64, 4, 1, 3, 0 },
	{ 128, 256, 64, 8, 1, 4, 0 },   { 64, 128, 64, 4, 1, 4, 0 },
};

#define N_WG_SHAPES (sizeof(wg_shapes) / sizeof(wg_shapes[0]))
#define N_WG_TILES (sizeof(wg_tiles) / sizeof(wg_tiles[0]))

/* fn on each of wg_shapes with each of tiles[0..n_tiles), shapes outer. */
static void each_wg_shape(dg_device *dev, const dg_tile *tiles, size_t n_tiles,
			  void (*fn)(dg_device *, const shape *, const dg_tile *))
{
	for (size_t i = 0; i < N_WG_SHAPES; i++)
		for (size_t k = 0; k < n_tiles; k++)
			fn(dev, &wg_shapes[i], &tiles[k]);
}

Test(gpu_attention, warpgroup_path_small_shapes)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0x90a);
	each_wg_shape(dev, wg_tiles, N_WG_TILES, wg_case);
	gh_close(dev);
}

/* attention_scores on the warp-specialized path (a ring of 5 to 8 stages,
 * TMA along L, templates/attention_tma.lua): against the reference, zero on
 * and above the diagonal, on the shapes above (T 1 and 7: rows past T
 * zero-filled by the tensor map) and the BDH one. */
static void ws_scores_case(dg_device *dev, const shape *s, const dg_tile *tile)
{
	int B = s->B, H = s->H, T = s->T, N = s->N;
	size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T;
	dg_fmt act = DG_FMT_BF16;
	float *rope = rope_table(T, N);
	void *xs = rand_act(act, nx, 0.0f, NULL), *qr = rope_of(act, s, xs, rope), *want = gh_xmalloc(ns * 2);
	dg_tensor in2[2] = { dg_tensor_4d("xs", act, UP(qr, nx * 2), B, H, T, N),
			     dg_tensor_2d("rope", DG_FMT_F32, UP(rope, (size_t)T * N * 4), T, N) };
	dg_spec sp = wg_spec(DG_OP_ATTENTION_SCORES, s, tile);
	gh_expect_path(&sp, "wgmma tma");
	check_scores(dev, &sp, act, s, in2, qr, rope, want, "attention_scores (warp-specialized)");
	free(rope), free(xs), free(qr), free(want);
}

Test(gpu_attention, warp_specialized_scores)
{
	static const dg_tile tiles[] = {
		{ 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 }, { 64, 128, 64, 4, 1, 8, 0 },
		{ 64, 64, 64, 4, 1, 8, 0 },
	};
	dg_device *dev = gh_open_sm90();
	gh_seed(0x75a);
	each_wg_shape(dev, tiles, sizeof(tiles) / sizeof(tiles[0]), ws_scores_case);
	shape bdh = { 2, 4, 512, 8192, 256 };
	ws_scores_case(dev, &bdh, &tiles[1]);
	gh_close(dev);
}

/* The chains with rope=pre against the rope-on-the-load chains: the same
 * math on the same bf16 operands (rope_fwd rounds qr as the load does),
 * sums in another order. */
Test(gpu_attention, warpgroup_chains)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xc4a2);
	shape s = chain_shape;
	dg_fmt act = DG_FMT_BF16;
	inputs in;
	inputs_make(dev, act, &s, false, false, &in);
	size_t nx = (size_t)s.B * s.H * s.T * s.N, nv = (size_t)s.B * s.T * s.D;
	size_t ng = (size_t)s.B * s.H * s.T * s.D, ns = (size_t)s.B * s.H * s.T * s.T;
	void *res[2][4];
	for (int pre = 0; pre < 2; pre++) {
		chain_out co = chain_outputs(dev, act, &s);
		chain_run(dev, act, &s, pre, &in, &co);
		size_t bytes[4] = { ns * 2, ng * 2, nx * 4, nv * 4 };
		dg_dptr at[4] = { co.s.data, co.o.data, co.gx.data, co.gv.data };
		for (int k = 0; k < 4; k++) {
			res[pre][k] = gh_xmalloc(bytes[k]);
			gh_download(dev, res[pre][k], at[k], bytes[k]);
		}
	}
	expect_close("chain scores (rope=pre vs load)", act, act, res[1][0], res[0][0], ns);
	expect_close("chain out (rope=pre vs load)", act, act, res[1][1], res[0][1], ng);
	expect_close("chain grad_xs (rope=pre vs load)", act, DG_FMT_F32, res[1][2], res[0][2], nx);
	expect_close("chain grad_v (rope=pre vs load)", act, DG_FMT_F32, res[1][3], res[0][3], nv);
	for (int pre = 0; pre < 2; pre++)
		for (int k = 0; k < 4; k++)
			free(res[pre][k]);
	inputs_free(&in);
	gh_close(dev);
}

/* The BDH shape on the warpgroup path: sampled slices against the
 * reference, and the times of rope_fwd (what rope=pre adds, twice a
 * step), scores and grad_xs. */
Test(gpu_attention, bdh_shape_warpgroup)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xbd5);
	shape s = { 8, 4, 512, 8192, 256 };
	int B = s.B, H = s.H, T = s.T, N = s.N;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T, tn = (size_t)T * N, tt = (size_t)T * T;
	float *rope = rope_table(T, N);
	void *xs = rand_act(act, nx, 0.0f, NULL), *c = rand_act(act, ns, -1.0f, NULL);
	dg_tensor t_xs = dg_tensor_4d("xs", act, UP(xs, nx * 2), B, H, T, N);
	dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, tn * 4), T, N);
	dg_tensor t_qr = dg_tensor_4d("qr", act, FF(nx * 2), B, H, T, N);
	dg_tensor t_s = dg_tensor_4d("scores", act, FF(ns * 2), B, H, T, T);
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, UP(c, ns * 2), B, H, T, T);
	dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
	const dg_tensor *a_r[4] = { &t_xs, &t_rope, &t_qr }, *a_s[4] = { &t_qr, &t_rope, &t_s };
	const dg_tensor *a_x[4] = { &t_c, &t_qr, &t_rope, &t_gx };
	dg_spec s_r = spec_of(DG_OP_ROPE_FWD, act, &s, NULL);
	dg_spec s_s = wg_spec(DG_OP_ATTENTION_SCORES, &s, NULL), s_x = wg_spec(DG_OP_ATTENTION_GRAD_XS, &s, NULL);
	expect_wgmma(&s_s);
	expect_wgmma(&s_x);
	cr_assert_eq(run_op(dev, &s_r, a_r), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_s, a_s), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(run_op(dev, &s_x, a_x), DG_OK, "%s", dg_device_errmsg(dev));
	uint16_t *qr = gh_xmalloc(nx * 2), *sc = gh_xmalloc(ns * 2);
	float *gx = gh_xmalloc(nx * 4);
	gh_download(dev, qr, t_qr.data, nx * 2);
	gh_download(dev, sc, t_s.data, ns * 2);
	gh_download(dev, gx, t_gx.data, nx * 4);
	void *want = gh_xmalloc(tn * 4);
	shape one = { 1, 1, T, N, s.D };
	for (size_t k = 0; k < N_BDH_SAMPLES; k++) {
		const int *sl = bdh_samples[k];
		size_t z = (size_t)sl[0] * H + (size_t)sl[1];
		char what[64];
		dg_spec r = wg_spec(DG_OP_ATTENTION_SCORES, &one, NULL);
		cr_assert_eq(dg_ref_attention_scores(&r, qr + z * tn, rope, want, 1, T), DG_OK);
		snprintf(what, sizeof(what), "scores wgmma (b %d, h %d)", sl[0], sl[1]);
		expect_close(what, act, act, sc + z * tt, want, tt);
		r = wg_spec(DG_OP_ATTENTION_GRAD_XS, &one, NULL);
		cr_assert_eq(dg_ref_attention_grad_xs(&r, (uint16_t *)c + z * tt, qr + z * tn, rope, want, 1, T),
			     DG_OK);
		snprintf(what, sizeof(what), "grad_xs wgmma (b %d, h %d)", sl[0], sl[1]);
		expect_close(what, act, DG_FMT_F32, gx + z * tn, want, tn);
	}
	double bh = (double)B * H, tri = (double)T * (T - 1) / 2;
	report(dev, &s_r, a_r, 3, 0.0);
	report(dev, &s_s, a_s, 3, bh * tri * N * 2);
	report(dev, &s_x, a_x, 4, bh * (double)T * T * N * 2);
	free(rope), free(xs), free(c), free(qr), free(sc), free(gx), free(want);
	gh_close(dev);
}

/* ---- epi=mask: the model's add_mask fused into grad_xs ---------------------------- */

/* The fused op's spec: s's act and tile, the gradient dxs in gf. */
static dg_spec mask_spec(dg_spec s, dg_fmt gf)
{
	s.epi = DG_EPI_MASK;
	s.out = gf;
	dg_spec_normalize(&s);
	return s;
}

/* mask_xs: the ReLU's output in act, with zeros (every fifth) and
 * negatives (which a ReLU never writes: the mask must test > 0, not != 0). */
static void *rand_mask(dg_fmt act, size_t n)
{
	void *m = rand_act(act, n, -1.0f, NULL);
	for (size_t i = 0; i < n; i += 5) {
		if (act == DG_FMT_BF16)
			((uint16_t *)m)[i] = 0;
		else
			((float *)m)[i] = 0.0f;
	}
	return m;
}

/* The fused op sp (epi=mask, gradient sp->out) at shape s on operand xs
 * (RoPE(xs) with rope=pre) against: its reference (grad_xs in f32, then
 * add_mask); the unfused pair on the GPU — grad_xs epi=store f32 on the
 * same tile, then add_mask (src f32) — bit for bit (the same sums, the
 * same roundings); exactly 0 where mask_xs <= 0; a second run from the
 * same dxs, the same bytes. */
static void mask_case(dg_device *dev, const dg_spec *spec, const shape *s, const char *what)
{
	/* an auto tile as the template's default, written out: the unfused
	 * grad_xs must run the same tile (a tuning record of either spec
	 * would otherwise pick another, with sums in another order) */
	dg_spec fs = *spec;
	if (dg_tile_is_auto(&fs.tile)) {
		dg_codegen *cg = NULL;
		dg_plan p;
		cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
		cr_assert_eq(dg_codegen_plan(cg, &fs, &p), DG_OK, "%s: %s", what, dg_codegen_errmsg(cg));
		fs.tile = p.spec.tile;
		dg_codegen_destroy(cg);
		/* the runtime's own choice where C's rows are no tensor map's */
		if (fs.tile.stages >= 5 && s->T % 8 != 0)
			fs.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 };
	}
	const dg_spec *sp = &fs;
	int B = s->B, H = s->H, T = s->T, N = s->N;
	dg_fmt act = sp->act, gf = sp->out;
	size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T, as = act_size(act), gs = act_size(gf);
	float *rope = rope_table(T, N);
	void *xs = rand_act(act, nx, 0.0f, NULL), *c = rand_act(act, ns, -1.0f, NULL);
	void *dxs = rand_act(gf, nx, -1.0f, NULL), *mx = rand_mask(act, nx);
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, UP(c, ns * as), B, H, T, T);
	dg_tensor t_xs = dg_tensor_4d("xs", act, UP(xs, nx * as), B, H, T, N);
	dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, (size_t)T * N * 4), T, N);
	dg_tensor t_m = dg_tensor_4d("mask_xs", act, UP(mx, nx * as), B, H, T, N);
	void *got[2];
	for (int k = 0; k < 2; k++) {
		dg_tensor t_d = dg_tensor_4d("dxs", gf, UP(dxs, nx * gs), B, H, T, N);
		const dg_tensor *t[5] = { &t_c, &t_xs, &t_rope, &t_d, &t_m };
		cr_assert_eq(run_op(dev, sp, t), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		got[k] = gh_xmalloc(nx * gs);
		gh_download(dev, got[k], t_d.data, nx * gs);
	}
	cr_assert_eq(memcmp(got[0], got[1], nx * gs), 0, "%s: two runs differ", what);

	/* the reference */
	void *want = gh_xmalloc(nx * gs);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(sp, c, xs, rope, dxs, mx, want, B, T), DG_OK);
	/* bf16 anywhere (operands or dxs) takes bf16's bound: a sum within
	 * rounding of a bf16 tie may round either way */
	expect_close(what, act == DG_FMT_BF16 || gf == DG_FMT_BF16 ? DG_FMT_BF16 : DG_FMT_F32, gf, got[0], want, nx);
	float *g = widen(gf, got[0], nx), *m = widen(act, mx, nx);
	for (size_t i = 0; i < nx; i++)
		if (!(m[i] > 0.0f))
			cr_assert_eq(g[i], 0.0f, "%s: [%zu] masked (%g) but %g", what, i, (double)m[i], (double)g[i]);

	/* the unfused pair on the GPU, same tile */
	dg_spec ss = *sp;
	ss.epi = DG_EPI_STORE;
	ss.out = DG_FMT_F32;
	dg_spec_normalize(&ss);
	dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
	const dg_tensor *t4[4] = { &t_c, &t_xs, &t_rope, &t_gx };
	cr_assert_eq(run_op(dev, &ss, t4), DG_OK, "%s (unfused): %s", what, dg_device_errmsg(dev));
	dg_spec ms = add_mask_spec(act, gf, H, N);
	dg_tensor t_d = dg_tensor_4d("dxs", gf, UP(dxs, nx * gs), B, H, T, N);
	dg_tensor t_o = dg_tensor_4d("other", DG_FMT_F32, t_gx.data, B, H, T, N);
	dg_add_mask_args am = { .dxs = &t_d, .other = &t_o, .xs = &t_m };
	cr_assert_eq(dg_add_mask(dev, &ms, &am), DG_OK, "%s (add_mask): %s", what, dg_device_errmsg(dev));
	void *pair = gh_xmalloc(nx * gs);
	gh_download(dev, pair, t_d.data, nx * gs);
	char w2[160];
	snprintf(w2, sizeof(w2), "%s: fused vs grad_xs + add_mask", what);
	gh_expect_bytes(w2, got[0], pair, nx * gs);
	free(rope), free(xs), free(c), free(dxs), free(mx), free(got[0]), free(got[1]), free(want);
	free(g), free(m), free(pair);
}

/* T 64 (whole tiles) and 100 (ragged rows: not a multiple of 64), latent
 * 128 and 100 (L % 8 != 0: the staged epilogue's pair-by-pair columns). */
static const shape mask_shapes[] = {
	{ 2, 2, 64, 128, 32 }, { 1, 2, 100, 256, 32 }, { 1, 2, 100, 100, 32 },
};

/* The sm_90a warpgroup path (rope=pre: xs is qr), its staged epilogue on
 * four tiles, dxs bf16 and f32. */
Test(gpu_attention, epi_mask_warpgroup)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xe9a);
	for (size_t i = 0; i < sizeof(mask_shapes) / sizeof(mask_shapes[0]); i++)
		for (size_t k = 0; k < N_WG_TILES; k++)
			for (int b = 0; b < 2; b++) {
				dg_spec sp = mask_spec(wg_spec(DG_OP_ATTENTION_GRAD_XS, &mask_shapes[i], &wg_tiles[k]),
						       b ? DG_FMT_BF16 : DG_FMT_F32);
				expect_wgmma(&sp);
				char what[96];
				snprintf(what, sizeof(what), "epi=mask wgmma T%d L%d tile %zu dxs %s", mask_shapes[i].T,
					 mask_shapes[i].N, k, b ? "bf16" : "f32");
				mask_case(dev, &sp, &mask_shapes[i], what);
			}
	gh_close(dev);
}

/* The other paths, any device: mma.sync (act bf16, the default tile and
 * one buffer), fp32 FMA (act f32; and act bf16 on a BK 8 tile), rope on
 * the load; dxs bf16 and f32. */
Test(gpu_attention, epi_mask_other_paths)
{
	static const struct {
		dg_fmt act;
		dg_tile tile;
	} cases[] = {
		{ DG_FMT_BF16, { 0, 0, 0, 0, 0, 0, 0 } },
		{ DG_FMT_BF16, { 32, 64, 16, 2, 2, 1, 0 } },
		{ DG_FMT_BF16, { 64, 32, 8, 2, 2, 2, 0 } },
		{ DG_FMT_F32, { 0, 0, 0, 0, 0, 0, 0 } },
	};
	dg_device *dev = gh_open();
	gh_seed(0xe9b);
	for (size_t i = 0; i < sizeof(mask_shapes) / sizeof(mask_shapes[0]); i++)
		for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++)
			for (int b = 0; b < 2; b++) {
				const dg_tile *tl = dg_tile_is_auto(&cases[k].tile) ? NULL : &cases[k].tile;
				dg_spec sp = mask_spec(spec_of(DG_OP_ATTENTION_GRAD_XS, cases[k].act, &mask_shapes[i], tl),
						       b ? DG_FMT_BF16 : DG_FMT_F32);
				char what[96];
				snprintf(what, sizeof(what), "epi=mask %s T%d L%d case %zu dxs %s",
					 dg_fmt_name(cases[k].act), mask_shapes[i].T, mask_shapes[i].N, k,
					 b ? "bf16" : "f32");
				mask_case(dev, &sp, &mask_shapes[i], what);
			}
	gh_close(dev);
}

/* The backward chain with dxs (grad_xs's epi=mask, xs the mask) is the
 * chain with grad_xs followed by add_mask, bit for bit; grad_xs and dxs
 * both given is refused. rope=load (any device) and, on sm_90, rope=pre
 * (the warpgroup path). */
Test(gpu_attention, epi_mask_chain)
{
	dg_device *dev = gh_open();
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	gh_seed(0xe9c);
	shape s = { 2, 2, 65, 128, 64 };
	int B = s.B, H = s.H, T = s.T, N = s.N, D = s.D;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D;
	size_t ns = (size_t)B * H * T * T;
	inputs in;
	inputs_make(dev, act, &s, false, true, &in);
	void *sc = rand_act(act, ns, -1.0f, NULL);
	void *dxs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL);
	dg_tensor t_xs = in.t_xs, t_rope = in.t_rope, t_v = in.t_v, t_g = in.t_g;
	dg_tensor t_s = dg_tensor_4d("scores", act, UP(sc, ns * 2), B, H, T, T);
	for (int pre = 0; pre < (di.sm == 90 ? 2 : 1); pre++) {
		dg_spec sp = chain_spec(act, &s, pre);
		/* unfused: grad_xs f32, then add_mask */
		dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
		dg_tensor t_gv = dg_tensor_4d("grad_v", DG_FMT_F32, FF(nv * 4), B, 1, T, D);
		dg_attention_bwd_args ba = { .grad = &t_g, .xs = &t_xs, .v = &t_v, .rope = &t_rope,
					     .scores = &t_s, .grad_xs = &t_gx, .grad_v = &t_gv };
		size_t need = 0;
		cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need), DG_OK);
		ba.ws = gh_workspace(dev, need);
		cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_OK, "%s", dg_device_errmsg(dev));
		dg_spec ms = add_mask_spec(act, DG_FMT_BF16, H, N);
		dg_tensor t_d0 = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs, nx * 2), B, H, T, N);
		dg_tensor t_o = dg_tensor_4d("other", DG_FMT_F32, t_gx.data, B, H, T, N);
		dg_add_mask_args am = { .dxs = &t_d0, .other = &t_o, .xs = &t_xs };
		cr_assert_eq(dg_add_mask(dev, &ms, &am), DG_OK, "%s", dg_device_errmsg(dev));
		/* fused: the same workspace size; both tensors given is refused */
		dg_tensor t_d1 = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs, nx * 2), B, H, T, N);
		dg_tensor t_gv1 = dg_tensor_4d("grad_v", DG_FMT_F32, FF(nv * 4), B, 1, T, D);
		ba.grad_v = &t_gv1;
		ba.dxs = &t_d1;
		cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_ERR_INVALID_ARG);
		cr_assert(strstr(dg_device_errmsg(dev), "grad_xs and dxs both given"), "%s", dg_device_errmsg(dev));
		ba.grad_xs = NULL;
		size_t need2 = 0;
		cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need2), DG_OK);
		cr_assert_eq(need2, need);
		cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_OK, "%s", dg_device_errmsg(dev));
		void *a0 = gh_xmalloc(nx * 2), *a1 = gh_xmalloc(nx * 2), *v0 = gh_xmalloc(nv * 4), *v1 = gh_xmalloc(nv * 4);
		gh_download(dev, a0, t_d0.data, nx * 2);
		gh_download(dev, a1, t_d1.data, nx * 2);
		gh_download(dev, v0, t_gv.data, nv * 4);
		gh_download(dev, v1, t_gv1.data, nv * 4);
		gh_expect_bytes(pre ? "chain dxs (rope=pre)" : "chain dxs", a1, a0, nx * 2);
		gh_expect_bytes(pre ? "chain grad_v (rope=pre)" : "chain grad_v", v1, v0, nv * 4);
		free(a0), free(a1), free(v0), free(v1);
	}
	inputs_free(&in);
	free(sc), free(dxs);
	gh_close(dev);
}

/* The BDH shape on the warpgroup path with epi=mask (what the model runs
 * on sm_90 for bf16): sampled slices against the reference, its time
 * beside the unfused grad_xs's (f32 out) and add_mask's. */
Test(gpu_attention, bdh_shape_epi_mask_warpgroup)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xbd6);
	shape s = { 8, 4, 512, 8192, 256 };
	int B = s.B, H = s.H, T = s.T, N = s.N;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T, tn = (size_t)T * N, tt = (size_t)T * T;
	float *rope = rope_table(T, N);
	void *qr = rand_act(act, nx, -1.0f, NULL), *c = rand_act(act, ns, -1.0f, NULL);
	void *dxs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *mx = rand_mask(act, nx);
	dg_tensor t_qr = dg_tensor_4d("xs", act, UP(qr, nx * 2), B, H, T, N);
	dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, tn * 4), T, N);
	dg_tensor t_c = dg_tensor_4d("grad_scores", act, UP(c, ns * 2), B, H, T, T);
	dg_tensor t_d = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs, nx * 2), B, H, T, N);
	dg_tensor t_m = dg_tensor_4d("mask_xs", act, UP(mx, nx * 2), B, H, T, N);
	dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), B, H, T, N);
	const dg_tensor *a_m[5] = { &t_c, &t_qr, &t_rope, &t_d, &t_m }, *a_x[4] = { &t_c, &t_qr, &t_rope, &t_gx };
	dg_spec s_x = wg_spec(DG_OP_ATTENTION_GRAD_XS, &s, NULL), s_m = mask_spec(s_x, DG_FMT_BF16);
	expect_wgmma(&s_m);
	cr_assert_eq(run_op(dev, &s_m, a_m), DG_OK, "%s", dg_device_errmsg(dev));
	uint16_t *got = gh_xmalloc(nx * 2);
	gh_download(dev, got, t_d.data, nx * 2);
	void *want = gh_xmalloc(tn * 2);
	shape one = { 1, 1, T, N, s.D };
	for (size_t k = 0; k < N_BDH_SAMPLES; k++) {
		const int *sl = bdh_samples[k];
		size_t z = (size_t)sl[0] * H + (size_t)sl[1];
		char what[64];
		dg_spec r = mask_spec(wg_spec(DG_OP_ATTENTION_GRAD_XS, &one, NULL), DG_FMT_BF16);
		cr_assert_eq(dg_ref_attention_grad_xs_mask(&r, (uint16_t *)c + z * tt, (uint16_t *)qr + z * tn, rope,
							   (uint16_t *)dxs + z * tn, (uint16_t *)mx + z * tn, want, 1, T),
			     DG_OK);
		snprintf(what, sizeof(what), "epi=mask wgmma (b %d, h %d)", sl[0], sl[1]);
		expect_close(what, act, DG_FMT_BF16, got + z * tn, want, tn);
	}
	/* times: the fused op (dxs read and written, mask_xs read), and the
	 * pair it replaces: grad_xs to f32, then add_mask */
	double bh = (double)B * H;
	report(dev, &s_m, a_m, 5, bh * (double)T * T * N * 2);
	report(dev, &s_x, a_x, 4, bh * (double)T * T * N * 2);
	dg_spec ms = add_mask_spec(act, DG_FMT_BF16, H, N);
	dg_tensor t_o = dg_tensor_4d("other", DG_FMT_F32, t_gx.data, B, H, T, N);
	dg_add_mask_args am = { .dxs = &t_d, .other = &t_o, .xs = &t_m };
	add_mask_call u = { dev, &ms, &am };
	printf("bdh %-22s %9.1f us  (the unfused pair's second kernel: dxs bf16, other f32, cold L2)\n", "add_mask",
	       median_us(dev, add_mask_timed, &u));
	fflush(stdout);
	free(rope), free(qr), free(c), free(dxs), free(mx), free(got), free(want);
	gh_close(dev);
}

/* attention_grad_xs on the warp-specialized path (every operand by TMA,
 * templates/attention_tma.lua): store (f32 and bf16 out, with scores on the
 * same tile: wg_case) and epi=mask (mask_case: the reference, the unfused
 * pair on the same tile bit for bit) at T % 8 == 0, whole and ragged tiles;
 * a tile of that path at another T is refused naming T, an auto tile there
 * runs the cp.async ring. 128 x 128 at 6 stages runs in a 2 x 2 cluster
 * (A's and B's boxes multicast), the grid padded to whole clusters (T 8,
 * 136 and 200 and L 64 leave blocks past T or L). 4 stages at BN 128 or
 * 64 is the persistent form (a grid of the SMs' blocks, each walking
 * tiles, the epilogue beside the ring under the next tile's loads).
 * Then the BDH shape's epi=mask time on each tile. */
Test(gpu_attention, warp_specialized_grad_xs)
{
	static const shape shapes[] = {
		{ 2, 2, 8, 64, 32 }, { 2, 2, 64, 128, 64 }, { 1, 2, 136, 256, 32 }, { 1, 1, 200, 64, 32 },
	};
	static const dg_tile tiles[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },      { 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 },
		{ 64, 128, 64, 4, 1, 8, 0 },  { 64, 64, 64, 4, 1, 8, 0 },   { 64, 256, 64, 4, 1, 5, 0 },
		{ 128, 128, 64, 8, 1, 7, 0 }, { 128, 128, 64, 8, 1, 4, 0 }, { 64, 128, 64, 4, 1, 4, 0 },
	};
	dg_device *dev = gh_open_sm90();
	gh_seed(0x75b);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++) {
			wg_case(dev, &shapes[i], &tiles[k]);
			for (int b = 0; b < 2; b++) {
				dg_spec sp = mask_spec(wg_spec(DG_OP_ATTENTION_GRAD_XS, &shapes[i], &tiles[k]),
						       b ? DG_FMT_BF16 : DG_FMT_F32);
				expect_wgmma(&sp);
				char what[96];
				snprintf(what, sizeof(what), "epi=mask tma T%d L%d tile %zu dxs %s", shapes[i].T, shapes[i].N,
					 k, b ? "bf16" : "f32");
				mask_case(dev, &sp, &shapes[i], what);
			}
		}

	/* T 65: the path's tile refused naming T; the auto tile runs (the
	 * cp.async ring) and matches the reference */
	shape odd = { 1, 2, 65, 64, 32 };
	int T = odd.T, N = odd.N;
	size_t nx = (size_t)odd.B * odd.H * T * N, ns = (size_t)odd.B * odd.H * T * T;
	float *rope = gh_xmalloc((size_t)T * N * 4);
	dg_ref_rope_pairs(T, N, rope);
	void *qr = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *c = rand_act(DG_FMT_BF16, ns, -1.0f, NULL);
	dg_tensor t_c = dg_tensor_4d("grad_scores", DG_FMT_BF16, UP(c, ns * 2), odd.B, odd.H, T, T);
	dg_tensor t_qr = dg_tensor_4d("xs", DG_FMT_BF16, UP(qr, nx * 2), odd.B, odd.H, T, N);
	dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, (size_t)T * N * 4), T, N);
	dg_tensor t_gx = dg_tensor_4d("grad_xs", DG_FMT_F32, FF(nx * 4), odd.B, odd.H, T, N);
	const dg_tensor *a_x[4] = { &t_c, &t_qr, &t_rope, &t_gx };
	dg_spec sp = wg_spec(DG_OP_ATTENTION_GRAD_XS, &odd, &tiles[1]);
	cr_assert_eq(run_op(dev, &sp, a_x), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "T = 65") && strstr(dg_device_errmsg(dev), "T % 8 == 0"), "%s",
		  dg_device_errmsg(dev));
	sp = wg_spec(DG_OP_ATTENTION_GRAD_XS, &odd, NULL);
	cr_assert_eq(run_op(dev, &sp, a_x), DG_OK, "%s", dg_device_errmsg(dev));
	float *got = gh_xmalloc(nx * 4), *want = gh_xmalloc(nx * 4);
	gh_download(dev, got, t_gx.data, nx * 4);
	cr_assert_eq(dg_ref_attention_grad_xs(&sp, c, qr, rope, want, odd.B, T), DG_OK);
	expect_close("attention_grad_xs T 65 (auto tile)", DG_FMT_BF16, DG_FMT_F32, got, want, nx);
	free(rope), free(qr), free(c), free(got), free(want);

	/* the BDH shape, epi=mask dxs bf16 (the model's op): time a tile */
	shape s = { 8, 4, 512, 8192, 256 };
	nx = (size_t)s.B * s.H * s.T * s.N, ns = (size_t)s.B * s.H * s.T * s.T;
	size_t tn = (size_t)s.T * s.N;
	rope = gh_xmalloc(tn * 4);
	dg_ref_rope_pairs(s.T, s.N, rope);
	qr = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), c = rand_act(DG_FMT_BF16, ns, -1.0f, NULL);
	void *dxs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *mx = rand_mask(DG_FMT_BF16, nx);
	dg_tensor b_c = dg_tensor_4d("grad_scores", DG_FMT_BF16, UP(c, ns * 2), s.B, s.H, s.T, s.T);
	dg_tensor b_qr = dg_tensor_4d("xs", DG_FMT_BF16, UP(qr, nx * 2), s.B, s.H, s.T, s.N);
	dg_tensor b_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, tn * 4), s.T, s.N);
	dg_tensor b_d = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs, nx * 2), s.B, s.H, s.T, s.N);
	dg_tensor b_m = dg_tensor_4d("mask_xs", DG_FMT_BF16, UP(mx, nx * 2), s.B, s.H, s.T, s.N);
	const dg_tensor *a_m[5] = { &b_c, &b_qr, &b_rope, &b_d, &b_m };
	static const dg_tile timed_tiles[] = {
		{ 128, 128, 64, 8, 1, 3, 0 }, { 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 },
		{ 64, 256, 64, 4, 1, 5, 0 },  { 64, 128, 64, 4, 1, 8, 0 },  { 128, 256, 64, 8, 1, 3, 0 },
		{ 128, 256, 64, 8, 1, 4, 0 },  { 128, 128, 64, 8, 1, 7, 0 }, { 128, 128, 64, 8, 1, 4, 0 },
		{ 64, 128, 64, 4, 1, 4, 0 },
	};
	double flop = (double)s.B * s.H * (double)s.T * s.T * s.N * 2;
	for (size_t k = 0; k < sizeof(timed_tiles) / sizeof(timed_tiles[0]); k++) {
		dg_spec ms = mask_spec(wg_spec(DG_OP_ATTENTION_GRAD_XS, &s, &timed_tiles[k]), DG_FMT_BF16);
		const dg_tile *t = &timed_tiles[k];
		printf("tile %dx%dx%d/%dx%d/%d: ", t->bm, t->bn, t->bk, t->wm, t->wn, t->stages);
		report(dev, &ms, a_m, 5, flop);
	}
	free(rope), free(qr), free(c), free(dxs), free(mx);
	gh_close(dev);
}

/* rope=load on attention_grad_xs's persistent form (4 stages: the
 * producer warpgroup's turners RoPE each stage's boxes of xs by the table,
 * templates/attention_tma.lua TURN): the bytes of rope=pre on rope_fwd's
 * RoPE(xs) on the same tile, both epilogues (epi=mask's dxs bf16 in place,
 * store's f32), T 136 and 512 and L 192 (a ragged column of tiles); then
 * at the BDH shape the time of rope=load against rope_fwd then rope=pre
 * (what it saves: the RoPE(xs) pass and its 268 MB a layer). */
Test(gpu_attention, persistent_grad_xs_rope_load)
{
	static const shape shapes[] = { { 1, 2, 136, 192, 32 }, { 2, 2, 512, 256, 32 } };
	static const dg_tile tiles[] = { { 128, 128, 64, 8, 1, 4, 0 }, { 64, 128, 64, 4, 1, 4, 0 } };
	dg_device *dev = gh_open_sm90();
	gh_seed(0x10ad);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++)
			for (int epi = 0; epi < 2; epi++) {
				const shape *sh = &shapes[i];
				const int B = sh->B, H = sh->H, T = sh->T, N = sh->N;
				const size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T, ob = epi ? 2 : 4;
				float *rope = rope_table(T, N);
				void *xs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *c = rand_act(DG_FMT_BF16, ns, -1.0f, NULL);
				void *mx = rand_mask(DG_FMT_BF16, nx), *dxs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL);
				void *qr = rope_of(DG_FMT_BF16, sh, xs, rope);
				dg_tensor t_c = dg_tensor_4d("grad_scores", DG_FMT_BF16, UP(c, ns * 2), B, H, T, T);
				dg_tensor t_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, (size_t)T * N * 4), T, N);
				dg_tensor t_m = dg_tensor_4d("mask_xs", DG_FMT_BF16, UP(mx, nx * 2), B, H, T, N);
				void *got[2];
				for (int load = 0; load < 2; load++) {
					dg_spec sp = wg_spec(DG_OP_ATTENTION_GRAD_XS, sh, &tiles[k]);
					sp.rope_pre = !load;
					if (epi)
						sp = mask_spec(sp, DG_FMT_BF16);
					dg_spec_normalize(&sp);
					gh_expect_path(&sp, "wgmma tma persistent");
					dg_tensor t_x = dg_tensor_4d("xs", DG_FMT_BF16, UP(load ? xs : qr, nx * 2), B, H, T, N);
					dg_tensor t_o = dg_tensor_4d(epi ? "dxs" : "grad_xs", epi ? DG_FMT_BF16 : DG_FMT_F32,
								     epi ? UP(dxs, nx * 2) : FF(nx * 4), B, H, T, N);
					const dg_tensor *a[5] = { &t_c, &t_x, &t_rope, &t_o, &t_m };
					cr_assert_eq(run_op(dev, &sp, a), DG_OK, "%s", dg_device_errmsg(dev));
					got[load] = gh_xmalloc(nx * ob);
					gh_download(dev, got[load], t_o.data, nx * ob);
				}
				cr_assert_eq(memcmp(got[0], got[1], nx * ob), 0,
					     "T %d tile %zu epi %d: rope=load is not rope=pre on rope_fwd's bytes", T, k, epi);
				free(rope), free(xs), free(c), free(mx), free(dxs), free(qr), free(got[0]), free(got[1]);
			}

	/* the BDH shape, epi=mask dxs bf16: rope=load against rope_fwd then rope=pre */
	shape s = { 8, 4, 512, 8192, 256 };
	const size_t nx = (size_t)s.B * s.H * s.T * s.N, ns = (size_t)s.B * s.H * s.T * s.T, tn = (size_t)s.T * s.N;
	float *rope = rope_table(s.T, s.N);
	void *xs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *c = rand_act(DG_FMT_BF16, ns, -1.0f, NULL);
	void *dxs = rand_act(DG_FMT_BF16, nx, -1.0f, NULL), *mx = rand_mask(DG_FMT_BF16, nx);
	dg_tensor b_c = dg_tensor_4d("grad_scores", DG_FMT_BF16, UP(c, ns * 2), s.B, s.H, s.T, s.T);
	dg_tensor b_x = dg_tensor_4d("xs", DG_FMT_BF16, UP(xs, nx * 2), s.B, s.H, s.T, s.N);
	dg_tensor b_q = dg_tensor_4d("qr", DG_FMT_BF16, FF(nx * 2), s.B, s.H, s.T, s.N);
	dg_tensor b_rope = dg_tensor_2d("rope", DG_FMT_F32, UP(rope, tn * 4), s.T, s.N);
	dg_tensor b_d = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs, nx * 2), s.B, s.H, s.T, s.N);
	dg_tensor b_m = dg_tensor_4d("mask_xs", DG_FMT_BF16, UP(mx, nx * 2), s.B, s.H, s.T, s.N);
	const double flop = (double)s.B * s.H * (double)s.T * s.T * s.N * 2;
	const dg_tile *t = &tiles[0];
	dg_spec rs = spec_of(DG_OP_ROPE_FWD, DG_FMT_BF16, &s, NULL);
	const dg_tensor *a_r[3] = { &b_x, &b_rope, &b_q };
	printf("rope_fwd (what rope=load saves): ");
	report(dev, &rs, a_r, 3, 0.0);
	for (int load = 0; load < 2; load++) {
		dg_spec ms = wg_spec(DG_OP_ATTENTION_GRAD_XS, &s, t);
		ms.rope_pre = !load;
		ms = mask_spec(ms, DG_FMT_BF16);
		dg_spec_normalize(&ms);
		const dg_tensor *a_m[5] = { &b_c, load ? &b_x : &b_q, &b_rope, &b_d, &b_m };
		printf("tile %dx%dx%d/%dx%d/%d rope=%s: ", t->bm, t->bn, t->bk, t->wm, t->wn, t->stages,
		       load ? "load" : "pre");
		report(dev, &ms, a_m, 5, flop);
	}
	free(rope), free(xs), free(c), free(dxs), free(mx);
	gh_close(dev);
}

/* The chains with qr given (rope=pre): the forward writes RoPE(xs) there
 * (rope_fwd's bytes) and needs no workspace, the backward reads it instead
 * of making it again, and every output is the same bits as the chains
 * that make qr in their workspace; qr with rope=load is refused by name. */
Test(gpu_attention, chains_take_a_kept_qr)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xc4a3);
	shape s = { 2, 2, 64, 128, 64 };
	int B = s.B, H = s.H, T = s.T, N = s.N, D = s.D;
	dg_fmt act = DG_FMT_BF16;
	size_t nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, ng = (size_t)B * H * T * D;
	size_t ns = (size_t)B * H * T * T;
	inputs in;
	inputs_make(dev, act, &s, false, true, &in);
	void *dxs0 = rand_act(DG_FMT_BF16, nx, -1.0f, NULL);
	dg_spec sp = chain_spec(act, &s, true);
	void *got[2][5];
	for (int k = 0; k < 2; k++) {
		dg_tensor t_s = dg_tensor_4d("scores", act, FF(ns * 2), B, H, T, T);
		dg_tensor t_o = dg_tensor_4d("out", act, FF(ng * 2), B, H, T, D);
		dg_tensor t_q = dg_tensor_4d("qr", act, FF(nx * 2), B, H, T, N);
		dg_tensor t_d = dg_tensor_4d("dxs", DG_FMT_BF16, UP(dxs0, nx * 2), B, H, T, N);
		dg_tensor t_gv = dg_tensor_4d("grad_v", DG_FMT_F32, FF(nv * 4), B, 1, T, D);
		dg_attention_fwd_args fa = { .xs = &in.t_xs, .v = &in.t_v, .rope = &in.t_rope, .scores = &t_s,
					     .out = &t_o, .qr = k ? &t_q : NULL };
		size_t need = 1;
		cr_assert_eq(dg_attention_fwd_workspace(&sp, &fa, &need), DG_OK);
		cr_assert_eq(need, k ? 0 : (nx * 2 + 255) / 256 * 256);
		fa.ws = gh_workspace(dev, need);
		cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_OK, "%s", dg_device_errmsg(dev));
		dg_attention_bwd_args ba = { .grad = &in.t_g, .xs = &in.t_xs, .v = &in.t_v, .rope = &in.t_rope,
					     .scores = &t_s, .grad_v = &t_gv, .dxs = &t_d, .qr = k ? &t_q : NULL };
		size_t need_b = 0, c_bytes = ns * 2;
		cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need_b), DG_OK);
		cr_assert_eq(need_b, k ? c_bytes : (c_bytes + 255) / 256 * 256 + (nx * 2 + 255) / 256 * 256);
		ba.ws = gh_workspace(dev, need_b);
		cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_OK, "%s", dg_device_errmsg(dev));
		const dg_tensor *outs[4] = { &t_s, &t_o, &t_d, &t_gv };
		for (int i = 0; i < 4; i++) {
			size_t n = dg_tensor_bytes(outs[i]);
			got[k][i] = gh_xmalloc(n);
			gh_download(dev, got[k][i], outs[i]->data, n);
		}
		got[k][4] = gh_xmalloc(nx * 2);
		gh_download(dev, got[k][4], k ? t_q.data : fa.ws.ptr, nx * 2);
	}
	static const char *const names[5] = { "scores", "out", "dxs", "grad_v", "qr" };
	for (int i = 0; i < 5; i++) {
		size_t n = i == 0 ? ns * 2 : i == 1 ? ng * 2 : i == 2 ? nx * 2 : i == 3 ? nv * 4 : nx * 2;
		char what[64];
		snprintf(what, sizeof(what), "chains with a kept qr: %s", names[i]);
		gh_expect_bytes(what, got[1][i], got[0][i], n);
		free(got[0][i]), free(got[1][i]);
	}
	/* rope=load has no qr */
	dg_spec sl = chain_spec(act, &s, false);
	dg_tensor t_q = dg_tensor_4d("qr", act, FF(nx * 2), B, H, T, N);
	dg_tensor t_s = dg_tensor_4d("scores", act, FF(ns * 2), B, H, T, T);
	dg_tensor t_o = dg_tensor_4d("out", act, FF(ng * 2), B, H, T, D);
	dg_attention_fwd_args fa = { .xs = &in.t_xs, .v = &in.t_v, .rope = &in.t_rope, .scores = &t_s, .out = &t_o,
				     .qr = &t_q };
	cr_assert_eq(dg_attention_fwd(dev, &sl, &fa), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "qr: given, but the spec's rope is load"), "%s", dg_device_errmsg(dev));
	inputs_free(&in);
	free(dxs0);
	gh_close(dev);
}
