/*
 * GPU tests of the chunked attention (templates/attention_chunk.lua;
 * runtime/ops/attention_chunk.c, the chunked chains of
 * runtime/ops/attention.c) against the CPU references (dg_ref_run: the
 * ops' adapters over runtime/ref/attention_chunked.c, which
 * tests/test_ref_attention.c holds to the quadratic form). sm_90 only
 * (gh_open_sm90: the state GEMMs are warp-specialized wgmma).
 *
 *   - each of the six ops against its reference at small shapes (B 2,
 *     H 2, T 256, latent 128 and 136, embd 64 and 128, chunks 64 and 128;
 *     the default tile and, for a chunk of 64, BM 64), twice (the same
 *     bytes); the states compared as hi + lo, every output starting as
 *     0xff bytes (NaN: an unwritten element fails), the helpers bit for
 *     bit;
 *   - the chunked chains (dg_attention_fwd / _bwd with chunk C) against
 *     the quadratic chains on the same inputs: out, dxs (the masked sum,
 *     from the same start) and grad_v; and with RoPE(xs) kept between the
 *     forward and the backward in a buffer of the caller's (the model's
 *     keep_qr, starting as NaN bytes: the forward writes it) the same bytes
 *     as without;
 *   - what they refuse, by name: T not a multiple of C, a spec off
 *     sm_90a, grad_xs in place of dxs, a short workspace.
 *
 * Tolerance (dg_ref_close_norm): states f32 sums of bf16 products, 3e-5
 * and 1e-4 against the reference's double sums; bf16 outputs 1e-2 and
 * 2e-2; f32 outputs of bf16 operands 1e-3 and 1e-2 (a state's use reads
 * hi + lo, to 2^-16 of the f32 sum). The chains against each other: the
 * bf16 bounds (the quadratic form's scores are bf16, the chunked form's
 * intra-chunk ones too, but its states are not).
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/ops/ops_int.h"
#include "runtime/ref/ref_ops.h"

typedef struct shape {
	int B, H, T, N, D, C;
} shape;

/* The op's spec at shape s (tile: NULL auto). */
static dg_spec chunk_spec(dg_op op, const shape *s, int in_heads, dg_fmt out, const dg_tile *tile)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.heads = s->H;
	sp.latent = s->N;
	sp.embd = s->D;
	sp.chunk = s->C;
	sp.in_heads = in_heads;
	if (dg_spec_uses(op) & DG_FIELD_OUT)
		sp.out = out;
	if (tile)
		sp.tile = *tile;
	dg_spec_normalize(&sp);
	char msg[256];
	cr_assert_eq(dg_spec_validate(&sp, msg, sizeof(msg)), DG_OK, "%s", msg);
	return sp;
}

static float *widen(dg_fmt f, const void *p, size_t n)
{
	float *o = gh_xmalloc(n * 4);
	for (size_t i = 0; i < n; i++)
		o[i] = f == DG_FMT_BF16 ? dg_ref_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
	return o;
}

static void expect_norm(const char *what, const float *got, const float *want, size_t n, double rel, float el)
{
	char why[512];
	cr_assert(dg_ref_close_norm(got, want, n, rel, el, why, sizeof(why)), "%s: %s", what, why);
}

/* Storage of n values of f, random in [lo, 1) (bf16 rounded once). */
static void *rand_vals(dg_fmt f, size_t n, float lo)
{
	void *p = gh_xmalloc(n * (f == DG_FMT_BF16 ? 2 : 4));
	for (size_t i = 0; i < n; i++) {
		float v = gh_uniform(lo, 1.0f);
		if (f == DG_FMT_BF16)
			((uint16_t *)p)[i] = dg_ref_f32_to_bf16(v);
		else
			((float *)p)[i] = v;
	}
	return p;
}

/* A ReLU's output in bf16: a third zeros, a tenth negative (not > 0, so
 * masked), the rest in (0, 1). */
static void *rand_relu(size_t n)
{
	uint16_t *p = gh_xmalloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		int k = gh_int(0, 29);
		float v = k < 10 ? 0.0f : k < 13 ? -gh_uniform(0.01f, 1.0f) : gh_uniform(0.01f, 1.0f);
		p[i] = dg_ref_f32_to_bf16(v);
	}
	return p;
}

/* One op on the GPU through its typed call, twice into fresh outputs (the
 * in-place output reloaded from `inout` before each), the two results
 * the same bytes; the reference through dg_ref_run on the host inputs.
 * args: the op's tensors in the table's order (outputs' data replaced). */
typedef struct op_run {
	const dg_spec *s;
	dg_tensor t[DG_OP_MAX_ARGS];
	void *host[DG_OP_MAX_ARGS]; /* each input's host storage (the in-place output's old value) */
	size_t bytes[DG_OP_MAX_ARGS];
	bool backward;
	int b, t_len;
} op_run;

static dg_status call_op(dg_device *dev, const op_run *r, const dg_tensor *const *t)
{
	const dg_spec *s = r->s;
	switch (s->op) {
	case DG_OP_ATTENTION_CHUNK_STATE: {
		dg_attention_chunk_state_args a = { t[0], t[1], t[2], r->backward };
		return dg_attention_chunk_state(dev, s, &a);
	}
	case DG_OP_ATTENTION_CHUNK_OUT: {
		dg_attention_chunk_out_args a = { t[0], t[1], t[2], r->backward };
		return dg_attention_chunk_out(dev, s, &a);
	}
	case DG_OP_ATTENTION_CHUNK_DQ: {
		dg_attention_chunk_dq_args a = { t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8] };
		return dg_attention_chunk_dq(dev, s, &a);
	}
	case DG_OP_ATTENTION_CHUNK_VREP: {
		dg_attention_chunk_vrep_args a = { t[0], t[1] };
		return dg_attention_chunk_vrep(dev, s, &a);
	}
	case DG_OP_ATTENTION_CHUNK_CAST: {
		dg_attention_chunk_cast_args a = { t[0], t[1] };
		return dg_attention_chunk_cast(dev, s, &a);
	}
	default: {
		dg_attention_chunk_hsum_args a = { t[0], t[1] };
		return dg_attention_chunk_hsum(dev, s, &a);
	}
	}
}

/* Runs r (its last argument the output, index o) on the GPU twice and
 * the reference once; returns the GPU's bytes in *got and the
 * reference's in *want (both malloc'd). */
static void run_both(dg_device *dev, op_run *r, int o, void **got, void **want)
{
	const dg_op_info *row = dg_op_info_of(r->s->op);
	const bool inout = (row->inout >> o) & 1u;
	const dg_tensor *tp[DG_OP_MAX_ARGS];
	void *res[2];
	for (int k = 0; k < 2; k++) {
		for (int i = 0; i < row->n_args; i++)
			tp[i] = &r->t[i];
		r->t[o].data = inout ? gh_upload(dev, r->host[o], r->bytes[o]) : gh_alloc_ff(dev, r->bytes[o]);
		cr_assert_eq(call_op(dev, r, tp), DG_OK, "%s: %s", dg_op_name(r->s->op), dg_device_errmsg(dev));
		res[k] = gh_xmalloc(r->bytes[o]);
		gh_download(dev, res[k], r->t[o].data, r->bytes[o]);
	}
	gh_expect_bytes(dg_op_name(r->s->op), res[1], res[0], r->bytes[o]);
	free(res[1]);
	*got = res[0];
	dg_ref_call c;
	memset(&c, 0, sizeof(c));
	for (int i = 0; i < row->n_args; i++)
		if (!row->args[i].output || inout)
			c.in[i] = r->host[i];
	*want = gh_xmalloc(r->bytes[o]);
	memset(*want, 0xff, r->bytes[o]);
	c.out = *want;
	c.b = r->b;
	c.t = r->t_len;
	c.backward = r->backward;
	cr_assert_eq(dg_ref_run(r->s, &c), DG_OK, "%s: reference", dg_op_name(r->s->op));
}

/* Fills argument i of r with random host values of its format and shape
 * (lo: the lower bound; relu: a ReLU's output) and uploads it. */
static void arg_make(dg_device *dev, op_run *r, int i, float lo, bool relu)
{
	const dg_op_info *row = dg_op_info_of(r->s->op);
	const dg_op_arg *a = &row->args[i];
	int64_t dims[4];
	size_t n = 1;
	for (int d = 0; d < a->ndim; d++) {
		dims[d] = dg_op_dim_extent(r->s, a->dims[d], r->b, r->t_len, 0);
		n *= (size_t)dims[d];
	}
	dg_fmt f = dg_op_arg_fmt(r->s, a->fmt);
	r->bytes[i] = n * (f == DG_FMT_BF16 ? 2 : 4);
	r->host[i] = relu ? rand_relu(n) : rand_vals(f, n, lo);
	r->t[i] = dg_tensor_make(a->name, f, gh_upload(dev, r->host[i], r->bytes[i]), a->ndim, dims);
}

/* A state tensor's values as hi + lo: (B·H·T/C) chunks of (2N, D) bf16 →
 * (B·H·T/C, N, D) f32. */
static float *states_f32(const void *st, size_t chunks, int N, int D)
{
	const uint16_t *u = st;
	const size_t nd = (size_t)N * D;
	float *o = gh_xmalloc(chunks * nd * 4);
	for (size_t c = 0; c < chunks; c++)
		for (size_t i = 0; i < nd; i++)
			o[c * nd + i] = dg_ref_bf16_to_f32(u[c * 2 * nd + i]) + dg_ref_bf16_to_f32(u[c * 2 * nd + nd + i]);
	return o;
}

static void free_run(op_run *r)
{
	for (int i = 0; i < DG_OP_MAX_ARGS; i++)
		free(r->host[i]);
}

/* The six ops at shape s (tile for the GEMMs; NULL auto). */
static void ops_case(dg_device *dev, const shape *s, const dg_tile *tile)
{
	char what[160];
	const size_t chunks = (size_t)s->B * s->H * (s->T / s->C);
	/* state: v (in_heads 1) forward, dout (in_heads H) reversed */
	for (int back = 0; back < 2; back++) {
		dg_spec sp = chunk_spec(DG_OP_ATTENTION_CHUNK_STATE, s, back ? s->H : 1, DG_FMT_BF16, tile);
		op_run r = { .s = &sp, .backward = back, .b = s->B, .t_len = s->T };
		arg_make(dev, &r, 0, 0.0f, false);
		arg_make(dev, &r, 1, -1.0f, false);
		arg_make(dev, &r, 2, 0.0f, false); /* the output's shape; its values unused */
		void *got, *want;
		run_both(dev, &r, 2, &got, &want);
		float *g = states_f32(got, chunks, s->N, s->D), *w = states_f32(want, chunks, s->N, s->D);
		snprintf(what, sizeof(what), "attention_chunk_state%s (T %d, N %d, D %d, C %d)",
			 back ? " reversed" : "", s->T, s->N, s->D, s->C);
		expect_norm(what, g, w, chunks * s->N * s->D, 3e-5, 1e-4f);
		/* out from these states, into bf16 and f32 */
		for (int of = 0; of < 2; of++) {
			dg_fmt out = of ? DG_FMT_F32 : DG_FMT_BF16;
			dg_spec so = chunk_spec(DG_OP_ATTENTION_CHUNK_OUT, s, 1, out, tile);
			op_run q = { .s = &so, .backward = back, .b = s->B, .t_len = s->T };
			q.t[0] = r.t[0];
			q.host[0] = NULL;
			q.bytes[0] = r.bytes[0];
			q.t[1] = dg_tensor_make("states", DG_FMT_BF16, gh_upload(dev, want, r.bytes[2]), 4,
						r.t[2].shape);
			arg_make(dev, &q, 2, -1.0f, false);
			void *host0 = r.host[0];
			q.host[0] = host0;
			q.host[1] = want;
			void *og, *ow;
			run_both(dev, &q, 2, &og, &ow);
			const size_t n = (size_t)s->B * s->H * s->T * s->D;
			float *a = widen(out, og, n), *b = widen(out, ow, n);
			snprintf(what, sizeof(what), "attention_chunk_out%s out=%s (T %d, N %d, D %d, C %d)",
				 back ? " reversed" : "", dg_fmt_name(out), s->T, s->N, s->D, s->C);
			if (out == DG_FMT_BF16)
				expect_norm(what, a, b, n, 1e-2, 2e-2f);
			else
				expect_norm(what, a, b, n, 1e-3, 1e-2f);
			free(a), free(b), free(og), free(ow), free(q.host[2]);
		}
		free(g), free(w), free(got), free(want);
		free_run(&r);
	}
	/* dq: every input random (the states too: the op reads them as given) */
	for (int of = 0; of < 2; of++) {
		dg_fmt out = of ? DG_FMT_F32 : DG_FMT_BF16;
		dg_spec sp = chunk_spec(DG_OP_ATTENTION_CHUNK_DQ, s, 1, out, tile);
		op_run r = { .s = &sp, .b = s->B, .t_len = s->T };
		static const float lo[9] = { -1, 0, -1, -1, -1, -1, 0, -1, 0 };
		for (int i = 0; i < 9; i++)
			if (i == 6) { /* the RoPE table */
				const size_t n = (size_t)s->T * s->N;
				float *rope = gh_xmalloc(n * 4);
				dg_ref_rope_pairs(s->T, s->N, rope);
				r.host[6] = rope;
				r.bytes[6] = n * 4;
				r.t[6] = dg_tensor_2d("rope", DG_FMT_F32, gh_upload(dev, rope, n * 4), s->T, s->N);
			} else {
				arg_make(dev, &r, i, lo[i], i == 8);
			}
		void *got, *want;
		run_both(dev, &r, 7, &got, &want);
		const size_t n = (size_t)s->B * s->H * s->T * s->N;
		float *a = widen(out, got, n), *b = widen(out, want, n);
		snprintf(what, sizeof(what), "attention_chunk_dq out=%s (T %d, N %d, D %d, C %d)", dg_fmt_name(out),
			 s->T, s->N, s->D, s->C);
		expect_norm(what, a, b, n, out == DG_FMT_BF16 ? 1e-2 : 1e-3, out == DG_FMT_BF16 ? 2e-2f : 1e-2f);
		/* masked: 0 where mask_xs is not > 0 */
		const uint16_t *mask = r.host[8];
		for (size_t i = 0; i < n; i++)
			if (!(dg_ref_bf16_to_f32(mask[i]) > 0.0f))
				cr_assert_eq(a[i], 0.0f, "%s: [%zu] = %g where the mask is not > 0", what, i, (double)a[i]);
		free(a), free(b), free(got), free(want);
		free_run(&r);
	}
	/* the helpers, bit for bit */
	static const dg_op ew[] = { DG_OP_ATTENTION_CHUNK_VREP, DG_OP_ATTENTION_CHUNK_CAST,
				    DG_OP_ATTENTION_CHUNK_HSUM };
	for (size_t k = 0; k < sizeof(ew) / sizeof(ew[0]); k++) {
		dg_spec sp = chunk_spec(ew[k], s, 1, DG_FMT_BF16, NULL);
		op_run r = { .s = &sp, .b = s->B, .t_len = s->T };
		arg_make(dev, &r, 0, -1.0f, false);
		arg_make(dev, &r, 1, 0.0f, false);
		void *got, *want;
		run_both(dev, &r, 1, &got, &want);
		gh_expect_bytes(dg_op_name(ew[k]), got, want, r.bytes[1]);
		free(got), free(want);
		free_run(&r);
	}
}

static const shape op_shapes[] = {
	{ 2, 2, 256, 128, 64, 64 },
	{ 2, 2, 256, 136, 128, 128 }, /* latent not a multiple of 64: ragged state rows */
	{ 1, 3, 384, 128, 64, 128 },
	{ 1, 2, 256, 128, 192, 128 }, /* embd an odd number of 64s: 64-wide columns */
};

Test(gpu_attention_chunk, ops_are_their_references)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xc4a);
	for (size_t i = 0; i < sizeof(op_shapes) / sizeof(op_shapes[0]); i++)
		ops_case(dev, &op_shapes[i], NULL);
	/* a chunk of 64 rows on a 64-row tile, five stages */
	const dg_tile t64 = { 64, 128, 64, 4, 1, 5, 0 };
	ops_case(dev, &op_shapes[0], &t64);
	gh_close(dev);
}

/* ---- the chains ------------------------------------------------------------------- */

typedef struct chain {
	dg_tensor xs, v, rope, g, scores, out, dxs, gv;
	dg_workspace fws, bws;
} chain;

/* The model's chain spec on sm_90 (gpu_nodes.c attn_spec): bf16,
 * arch=sm_90a, rope=pre. */
static dg_spec chain_spec(const shape *s)
{
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_ATTENTION_SCORES);
	sp.heads = s->H;
	sp.latent = s->N;
	sp.embd = s->D;
	sp.act = DG_FMT_BF16;
	sp.arch = 90;
	sp.arch_specific = true;
	sp.rope_pre = true;
	return sp;
}

/* Runs the forward and the backward (dxs from dxs0, the masked sum) of
 * form C (0: quadratic) on the shared inputs; outputs downloaded. kept:
 * RoPE(xs) kept between the two in a buffer of the caller's (the model's
 * keep_qr), which starts as NaN bytes: the forward must write it. */
static void chain_run(dg_device *dev, const shape *s, int C, const chain *in, const void *dxs0, void *out,
		      void *dxs, void *gv, bool kept)
{
	const int B = s->B, H = s->H, T = s->T, N = s->N, D = s->D;
	const size_t no = (size_t)B * H * T * D, nx = (size_t)B * H * T * N, nv = (size_t)B * T * D;
	const int cols = C ? C : T;
	dg_spec sp = chain_spec(s);
	dg_tensor sc = dg_tensor_4d("scores", DG_FMT_BF16, gh_alloc_ff(dev, (size_t)B * H * T * cols * 2), B, H, T,
				    cols);
	dg_tensor o = dg_tensor_4d("out", DG_FMT_BF16, gh_alloc_ff(dev, no * 2), B, H, T, D);
	dg_tensor dx = dg_tensor_4d("dxs", DG_FMT_BF16, gh_upload(dev, dxs0, nx * 2), B, H, T, N);
	dg_tensor g = dg_tensor_4d("grad_v", DG_FMT_F32, gh_alloc_ff(dev, nv * 4), B, 1, T, D);
	dg_tensor qr = dg_tensor_4d("qr", DG_FMT_BF16, gh_alloc_ff(dev, nx * 2), B, H, T, N);
	dg_attention_fwd_args fa = { .xs = &in->xs, .v = &in->v, .rope = &in->rope, .scores = &sc, .out = &o,
				     .chunk = C, .qr = kept ? &qr : NULL };
	size_t need = 0;
	cr_assert_eq(dg_attention_fwd_workspace(&sp, &fa, &need), DG_OK);
	if (C) { /* a short workspace is refused by name */
		fa.ws = gh_workspace(dev, need - 256);
		cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_ERR_INVALID_ARG);
		cr_assert(strstr(dg_device_errmsg(dev), "ws"), "%s", dg_device_errmsg(dev));
	}
	fa.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_OK, "chunk %d: %s", C, dg_device_errmsg(dev));
	dg_attention_bwd_args ba = { .grad = &in->g, .xs = &in->xs, .v = &in->v, .rope = &in->rope,
				     .scores = &sc, .grad_v = &g, .dxs = &dx, .chunk = C, .qr = kept ? &qr : NULL };
	cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need), DG_OK);
	ba.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_OK, "chunk %d: %s", C, dg_device_errmsg(dev));
	gh_download(dev, out, o.data, no * 2);
	gh_download(dev, dxs, dx.data, nx * 2);
	gh_download(dev, gv, g.data, nv * 4);
}

static void chains_case(dg_device *dev, const shape *s)
{
	const int B = s->B, H = s->H, T = s->T, N = s->N, D = s->D;
	const size_t no = (size_t)B * H * T * D, nx = (size_t)B * H * T * N, nv = (size_t)B * T * D;
	chain in;
	void *xs = rand_relu(nx), *v = rand_vals(DG_FMT_BF16, nv, -1.0f), *g = rand_vals(DG_FMT_F32, no, -1.0f);
	void *dxs0 = rand_vals(DG_FMT_BF16, nx, -1.0f);
	float *rope = gh_xmalloc((size_t)T * N * 4);
	dg_ref_rope_pairs(T, N, rope);
	in.xs = dg_tensor_4d("xs", DG_FMT_BF16, gh_upload(dev, xs, nx * 2), B, H, T, N);
	in.v = dg_tensor_4d("v", DG_FMT_BF16, gh_upload(dev, v, nv * 2), B, 1, T, D);
	in.rope = dg_tensor_2d("rope", DG_FMT_F32, gh_upload(dev, rope, (size_t)T * N * 4), T, N);
	in.g = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, no * 4), B, H, T, D);
	void *o[3], *d[3], *gv[3];
	for (int k = 0; k < 3; k++) { /* quadratic, chunked, chunked with RoPE(xs) kept */
		o[k] = gh_xmalloc(no * 2), d[k] = gh_xmalloc(nx * 2), gv[k] = gh_xmalloc(nv * 4);
		chain_run(dev, s, k ? s->C : 0, &in, dxs0, o[k], d[k], gv[k], k == 2);
	}
	/* the kept RoPE(xs) is the one the chains make: the same bytes */
	cr_assert_eq(memcmp(o[2], o[1], no * 2), 0, "chunk %d, qr kept: out differs", s->C);
	cr_assert_eq(memcmp(d[2], d[1], nx * 2), 0, "chunk %d, qr kept: dxs differs", s->C);
	cr_assert_eq(memcmp(gv[2], gv[1], nv * 4), 0, "chunk %d, qr kept: grad_v differs", s->C);
	char what[128];
	float *a = widen(DG_FMT_BF16, o[1], no), *b = widen(DG_FMT_BF16, o[0], no);
	snprintf(what, sizeof(what), "chunked (C %d) out against quadratic, T %d", s->C, T);
	expect_norm(what, a, b, no, 1e-2, 2e-2f);
	free(a), free(b);
	a = widen(DG_FMT_BF16, d[1], nx), b = widen(DG_FMT_BF16, d[0], nx);
	snprintf(what, sizeof(what), "chunked (C %d) dxs against quadratic, T %d", s->C, T);
	expect_norm(what, a, b, nx, 1e-2, 2e-2f);
	free(a), free(b);
	snprintf(what, sizeof(what), "chunked (C %d) grad_v against quadratic, T %d", s->C, T);
	expect_norm(what, gv[1], gv[0], nv, 1e-2, 2e-2f);
	for (int k = 0; k < 3; k++)
		free(o[k]), free(d[k]), free(gv[k]);
	free(xs), free(v), free(g), free(dxs0), free(rope);
}

Test(gpu_attention_chunk, chains_equal_the_quadratic_form)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0xc4b);
	static const shape shapes[] = {
		{ 2, 2, 256, 128, 64, 64 },
		{ 1, 4, 512, 256, 128, 128 },
		{ 2, 2, 256, 136, 64, 256 }, /* one chunk: no states to add */
	};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		chains_case(dev, &shapes[i]);
	gh_close(dev);
}

Test(gpu_attention_chunk, refusals_name_the_field)
{
	dg_device *dev = gh_open_sm90();
	const shape s = { 1, 2, 192, 128, 64, 128 }; /* T 192: not a multiple of 128 */
	const size_t nx = (size_t)s.H * s.T * s.N, no = (size_t)s.H * s.T * s.D;
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, gh_alloc(dev, nx * 2), 1, s.H, s.T, s.N);
	dg_tensor v = dg_tensor_4d("v", DG_FMT_BF16, gh_alloc(dev, (size_t)s.T * s.D * 2), 1, 1, s.T, s.D);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, gh_alloc(dev, (size_t)s.T * s.N * 4), s.T, s.N);
	dg_tensor sc = dg_tensor_4d("scores", DG_FMT_BF16, gh_alloc(dev, (size_t)s.H * s.T * s.C * 2), 1, s.H, s.T,
				    s.C);
	dg_tensor o = dg_tensor_4d("out", DG_FMT_BF16, gh_alloc(dev, no * 2), 1, s.H, s.T, s.D);
	dg_spec sp = chain_spec(&s);
	dg_attention_fwd_args fa = { .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .out = &o, .chunk = s.C,
				     .ws = gh_workspace(dev, 64 << 20) };
	cr_assert_eq(dg_attention_fwd(dev, &sp, &fa), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "T = 192"), "%s", dg_device_errmsg(dev));
	/* off sm_90a */
	dg_spec plain = sp;
	plain.arch_specific = false;
	plain.rope_pre = false;
	fa.chunk = 64;
	cr_assert_eq(dg_attention_fwd(dev, &plain, &fa), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_device_errmsg(dev), "sm_90a"), "%s", dg_device_errmsg(dev));
	/* the backward takes dxs, not grad_xs */
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, gh_alloc(dev, no * 4), 1, s.H, s.T, s.D);
	dg_tensor gx = dg_tensor_4d("grad_xs", DG_FMT_F32, gh_alloc(dev, nx * 4), 1, s.H, s.T, s.N);
	dg_tensor gv = dg_tensor_4d("grad_v", DG_FMT_F32, gh_alloc(dev, (size_t)s.T * s.D * 4), 1, 1, s.T, s.D);
	dg_attention_bwd_args ba = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .grad_xs = &gx,
				     .grad_v = &gv, .chunk = 64, .ws = gh_workspace(dev, 64 << 20) };
	cr_assert_eq(dg_attention_bwd(dev, &sp, &ba), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "give dxs"), "%s", dg_device_errmsg(dev));
	/* an op's own T check, by the typed call */
	dg_spec ss = chunk_spec(DG_OP_ATTENTION_CHUNK_STATE, &s, 1, DG_FMT_BF16, NULL);
	dg_tensor st = dg_tensor_4d("states", DG_FMT_BF16, gh_alloc(dev, (size_t)s.H * 2 * s.N * s.D * 2), 1, s.H,
				    2 * s.N, s.D);
	dg_attention_chunk_state_args sa = { .qr = &xs, .src = &v, .states = &st };
	cr_assert_eq(dg_attention_chunk_state(dev, &ss, &sa), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "chunk=128"), "%s", dg_device_errmsg(dev));
	gh_close(dev);
}
