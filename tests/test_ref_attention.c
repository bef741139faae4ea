/*
 * The attention ops' references (runtime/ref/attention.c) against the
 * model's own attention references (dg_ref_attention_fwd / _bwd, which the
 * CPU model and the PyTorch comparison use): the op chain — scores, out;
 * grad_scores, grad_v, grad_xs — gives the same out, dv and dxs = RoPEᵀ(dqr)
 * on small odd shapes (f32, within double-sum rounding), the rope table's
 * pairs are dg_ref_rope_table's, grad_scores is symmetric with a zero
 * diagonal, scores is zero on and above it, and a bf16 act rounds its
 * outputs once; grad_xs's epi=mask reference is the model's dxs added into
 * a gradient and masked by the ReLU's output (add_mask's rounding).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/ref.h"
#include "dragon/rng.h"
#include "helpers.h"
#include "runtime/ref/ref_ops.h"

static float *rnd(dg_rng *r, size_t n, float lo)
{
	float *v = malloc((n ? n : 1) * sizeof(float));
	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++)
		v[i] = dg_rng_uniform(r, lo, 1.0f);
	return v;
}

static void expect_near(const char *what, const float *got, const float *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cr_assert(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])), "%s[%zu]: %g, want %g",
			  what, i, (double)got[i], (double)want[i]);
}

static dg_spec spec_of(dg_op op, int h, int n, int d)
{
	dg_spec s = dg_test_spec_sized(op, h, d, n);
	s.act = DG_FMT_F32;
	return s;
}

Test(ref_attention, rope_pairs_interleave_the_tables)
{
	int t = 9, n = 64;
	float *c = malloc(sizeof(float) * t * n / 2), *s = malloc(sizeof(float) * t * n / 2);
	float *p = malloc(sizeof(float) * t * n);
	dg_ref_rope_table(t, n, c, s);
	dg_ref_rope_pairs(t, n, p);
	for (int i = 0; i < t * n / 2; i++) {
		cr_assert_eq(p[2 * i], c[i]);
		cr_assert_eq(p[2 * i + 1], s[i]);
	}
	cr_assert_eq(p[0], 1.0f); /* t = 0: cos 1, sin 0 */
	cr_assert_eq(p[1], 0.0f);
	free(c);
	free(s);
	free(p);
}

/* Rows made a block at a time (dg_ref_rope_pairs_rows, as the model's
 * threads make a long table) are the whole table's bits, and both are the
 * reference's f32 arithmetic written out here: the frequency of each pair
 * made per element (bdh.py's order), then the phase mod 1 times 2π. */
Test(ref_attention, rope_rows_in_blocks_are_the_table)
{
	int t = 37, n = 96;
	float *p = malloc(sizeof(float) * t * n), *q = malloc(sizeof(float) * t * n), *f = malloc(sizeof(float) * n);
	memset(q, 0xff, sizeof(float) * t * n);
	dg_ref_rope_pairs(t, n, p);
	dg_ref_rope_freq(n, f);
	for (int t0 = 0; t0 < t; t0 += 5)
		dg_ref_rope_pairs_rows(t0, t0 + 5 < t ? t0 + 5 : t, n, f, q);
	cr_assert_eq(memcmp(p, q, sizeof(float) * t * n), 0);
	const float two_pi = (float)(2.0 * M_PI);
	for (int r = 0; r < t; r++)
		for (int k = 0; k < n / 2; k++) {
			float expo = (float)(2 * k) / (float)n;
			float fr = 1.0f / powf(65536.0f, expo) / two_pi;
			float ph = (float)r * fr;
			ph = (ph - floorf(ph)) * two_pi;
			float c = cosf(ph), s = sinf(ph);
			cr_assert_eq(memcmp(&p[(size_t)r * n + 2 * k], &c, 4), 0, "cos at t %d, pair %d", r, k);
			cr_assert_eq(memcmp(&p[(size_t)r * n + 2 * k + 1], &s, 4), 0, "sin at t %d, pair %d", r, k);
		}
	free(p);
	free(q);
	free(f);
}

static void chain(int b, int h, int t, int n, int d)
{
	dg_rng r;
	dg_rng_seed(&r, 0xa77e0000u + (uint64_t)t);
	size_t nx = (size_t)b * h * t * n, nv = (size_t)b * t * d, no = (size_t)b * h * t * d;
	size_t ns = (size_t)b * h * t * t;
	float *xs = rnd(&r, nx, 0.0f), *v = rnd(&r, nv, -1.0f), *dout = rnd(&r, no, -1.0f);
	float *rope = malloc(sizeof(float) * t * n), *qr = malloc(sizeof(float) * nx);
	float *c = malloc(sizeof(float) * t * n / 2), *sn = malloc(sizeof(float) * t * n / 2);
	float *sc = malloc(sizeof(float) * ns), *cs = malloc(sizeof(float) * ns);
	float *out = malloc(sizeof(float) * no), *want_out = malloc(sizeof(float) * no);
	float *dv = malloc(sizeof(float) * nv), *want_dv = malloc(sizeof(float) * nv);
	float *dxs = malloc(sizeof(float) * nx), *dqr = malloc(sizeof(float) * nx), *want_dxs = malloc(sizeof(float) * nx);

	dg_ref_rope_pairs(t, n, rope);
	dg_ref_rope_table(t, n, c, sn);
	dg_ref_rope_fwd(xs, c, sn, (int64_t)b * h, t, n, qr);
	dg_ref_attention_fwd(qr, v, b, h, t, n, d, want_out);
	dg_ref_attention_bwd(dout, qr, v, b, h, t, n, d, dqr, want_dv);
	dg_ref_rope_bwd(dqr, c, sn, (int64_t)b * h, t, n, want_dxs);

	dg_spec s = spec_of(DG_OP_ATTENTION_SCORES, h, n, d);
	cr_assert_eq(dg_ref_attention_scores(&s, xs, rope, sc, b, t), DG_OK);
	s = spec_of(DG_OP_ATTENTION_OUT, h, n, d);
	cr_assert_eq(dg_ref_attention_out(&s, sc, v, out, b, t), DG_OK);
	s = spec_of(DG_OP_ATTENTION_GRAD_SCORES, h, n, d);
	cr_assert_eq(dg_ref_attention_grad_scores(&s, dout, v, cs, b, t), DG_OK);
	s = spec_of(DG_OP_ATTENTION_GRAD_V, h, n, d);
	cr_assert_eq(dg_ref_attention_grad_v(&s, sc, dout, dv, b, t), DG_OK);
	s = spec_of(DG_OP_ATTENTION_GRAD_XS, h, n, d);
	cr_assert_eq(dg_ref_attention_grad_xs(&s, cs, xs, rope, dxs, b, t), DG_OK);

	expect_near("out", out, want_out, no);
	expect_near("dv", dv, want_dv, nv);
	expect_near("dxs", dxs, want_dxs, nx);
	for (size_t z = 0; z < (size_t)b * h; z++)
		for (int i = 0; i < t; i++)
			for (int j = 0; j < t; j++) {
				size_t ij = z * t * t + (size_t)i * t + j, ji = z * t * t + (size_t)j * t + i;
				if (j >= i)
					cr_assert_eq(sc[ij], 0.0f, "scores[%d][%d] on or above the diagonal", i, j);
				cr_assert_eq(cs[ij], cs[ji], "grad_scores not symmetric at %d, %d", i, j);
				if (i == j)
					cr_assert_eq(cs[ij], 0.0f);
			}
	free(xs), free(v), free(dout), free(rope), free(qr), free(c), free(sn), free(sc), free(cs);
	free(out), free(want_out), free(dv), free(want_dv), free(dxs), free(dqr), free(want_dxs);
}

Test(ref_attention, the_op_chain_is_the_model_attention)
{
	chain(2, 2, 1, 8, 4);
	chain(2, 2, 7, 16, 8);
	chain(1, 3, 13, 32, 12);
}

Test(ref_attention, rope_op_is_the_table_rope_and_rounds_bf16_once)
{
	dg_rng r;
	dg_rng_seed(&r, 7);
	int b = 2, h = 2, t = 5, n = 16;
	size_t nx = (size_t)b * h * t * n;
	float *x = rnd(&r, nx, -1.0f), *rope = malloc(sizeof(float) * t * n), *got = malloc(sizeof(float) * nx);
	float *c = malloc(sizeof(float) * t * n / 2), *sn = malloc(sizeof(float) * t * n / 2);
	float *want = malloc(sizeof(float) * nx);
	uint16_t *xb = malloc(2 * nx), *ob = malloc(2 * nx);
	dg_ref_rope_pairs(t, n, rope);
	dg_ref_rope_table(t, n, c, sn);
	dg_spec s = spec_of(DG_OP_ROPE_FWD, h, n, 4);
	cr_assert_eq(dg_ref_rope_op(&s, x, rope, got, b, t), DG_OK);
	dg_ref_rope_fwd(x, c, sn, (int64_t)b * h, t, n, want);
	cr_assert_eq(memcmp(got, want, sizeof(float) * nx), 0);
	s = spec_of(DG_OP_ROPE_BWD, h, n, 4);
	cr_assert_eq(dg_ref_rope_op(&s, x, rope, got, b, t), DG_OK);
	dg_ref_rope_bwd(x, c, sn, (int64_t)b * h, t, n, want);
	cr_assert_eq(memcmp(got, want, sizeof(float) * nx), 0);
	/* bf16: widened exactly, turned in f32, rounded once */
	for (size_t i = 0; i < nx; i++) {
		xb[i] = dg_ref_f32_to_bf16(x[i]);
		x[i] = dg_ref_bf16_to_f32(xb[i]);
	}
	s = spec_of(DG_OP_ROPE_FWD, h, n, 4);
	s.act = DG_FMT_BF16;
	cr_assert_eq(dg_ref_rope_op(&s, xb, rope, ob, b, t), DG_OK);
	dg_ref_rope_fwd(x, c, sn, (int64_t)b * h, t, n, want);
	for (size_t i = 0; i < nx; i++)
		cr_assert_eq(ob[i], dg_ref_f32_to_bf16(want[i]), "element %zu", i);
	free(x), free(rope), free(got), free(c), free(sn), free(want), free(xb), free(ob);
}

/* rope=pre: scores and grad_xs of qr = RoPE(xs) given as xs are the
 * rope-on-the-load results, bit for bit (f32: the same values summed in
 * the same order). */
Test(ref_attention, rope_pre_reads_the_rotated_operand)
{
	const int b = 2, h = 2, t = 9, n = 16;
	dg_rng r;
	dg_rng_seed(&r, 0x40be);
	size_t nx = (size_t)b * h * t * n, ns = (size_t)b * h * t * t;
	float *xs = rnd(&r, nx, 0.0f), *c = rnd(&r, ns, -1.0f), *qr = malloc(nx * 4);
	float *rope = malloc((size_t)t * n * 4), *s0 = malloc(ns * 4), *s1 = malloc(ns * 4);
	float *g0 = malloc(nx * 4), *g1 = malloc(nx * 4);
	cr_assert(qr && rope && s0 && s1 && g0 && g1);
	dg_ref_rope_pairs(t, n, rope);
	dg_spec rs = spec_of(DG_OP_ROPE_FWD, h, n, 8);
	cr_assert_eq(dg_ref_rope_op(&rs, xs, rope, qr, b, t), DG_OK);
	dg_spec load = spec_of(DG_OP_ATTENTION_SCORES, h, n, 8), pre = load;
	pre.rope_pre = true;
	cr_assert_eq(dg_ref_attention_scores(&load, xs, rope, s0, b, t), DG_OK);
	cr_assert_eq(dg_ref_attention_scores(&pre, qr, rope, s1, b, t), DG_OK);
	cr_assert_eq(memcmp(s0, s1, ns * 4), 0, "scores: rope=pre differs from rope=load");
	load = spec_of(DG_OP_ATTENTION_GRAD_XS, h, n, 8), pre = load;
	pre.rope_pre = true;
	cr_assert_eq(dg_ref_attention_grad_xs(&load, c, xs, rope, g0, b, t), DG_OK);
	cr_assert_eq(dg_ref_attention_grad_xs(&pre, c, qr, rope, g1, b, t), DG_OK);
	cr_assert_eq(memcmp(g0, g1, nx * 4), 0, "grad_xs: rope=pre differs from rope=load");
	/* and it is not a no-op: xs itself (unrotated) as qr gives other scores */
	dg_spec ps = spec_of(DG_OP_ATTENTION_SCORES, h, n, 8);
	ps.rope_pre = true;
	cr_assert_eq(dg_ref_attention_scores(&ps, xs, rope, s1, b, t), DG_OK);
	cr_assert_neq(memcmp(s0, s1, ns * 4), 0);
	free(xs), free(c), free(qr), free(rope), free(s0), free(s1), free(g0), free(g1);
}

/* epi=mask (the model's add_mask fused into grad_xs): out = (dxs + g)·[xs
 * > 0] with g the model's own dxs = RoPEᵀ(dqr) (dg_ref_attention_bwd, not
 * the op's reference): dxs nonzero, the mask with zeros and negatives
 * (both give exactly 0), in place (out = dxs) too; f32 within the double
 * sums' rounding, bf16 dxs the f32 sum of its widened value rounded once
 * (bit for bit); the refusals of the wrong epilogue. */
Test(ref_attention, epi_mask_is_grad_xs_then_add_mask)
{
	const int b = 2, h = 2, t = 7, n = 16, d = 8;
	dg_rng r;
	dg_rng_seed(&r, 0xe91);
	size_t nx = (size_t)b * h * t * n, nv = (size_t)b * t * d, no = (size_t)b * h * t * d;
	size_t ns = (size_t)b * h * t * t;
	float *xs = rnd(&r, nx, 0.0f), *v = rnd(&r, nv, -1.0f), *dout = rnd(&r, no, -1.0f);
	float *dxs = rnd(&r, nx, -1.0f), *mx = rnd(&r, nx, -1.0f);
	float *rope = malloc(nx * 4), *qr = malloc(nx * 4), *c = malloc(sizeof(float) * t * n / 2);
	float *sn = malloc(sizeof(float) * t * n / 2), *cs = malloc(ns * 4), *dqr = malloc(nx * 4);
	float *dv = malloc(nv * 4), *g = malloc(nx * 4), *got = malloc(nx * 4), *gx = malloc(nx * 4);
	cr_assert(rope && qr && c && sn && cs && dqr && dv && g && got && gx);
	size_t zeros = 0, negs = 0;
	for (size_t i = 0; i < nx; i++) {
		if (i % 5 == 0)
			mx[i] = 0.0f; /* the ReLU's zeros */
		zeros += mx[i] == 0.0f;
		negs += mx[i] < 0.0f;
	}
	cr_assert(zeros > 0 && negs > 0);
	dg_ref_rope_pairs(t, n, rope);
	dg_ref_rope_table(t, n, c, sn);
	dg_ref_rope_fwd(xs, c, sn, (int64_t)b * h, t, n, qr);
	dg_ref_attention_bwd(dout, qr, v, b, h, t, n, d, dqr, dv);
	dg_ref_rope_bwd(dqr, c, sn, (int64_t)b * h, t, n, g);
	dg_spec s = spec_of(DG_OP_ATTENTION_GRAD_SCORES, h, n, d);
	cr_assert_eq(dg_ref_attention_grad_scores(&s, dout, v, cs, b, t), DG_OK);

	s = spec_of(DG_OP_ATTENTION_GRAD_XS, h, n, d);
	s.epi = DG_EPI_MASK;
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&s, cs, xs, rope, dxs, mx, got, b, t), DG_OK);
	for (size_t i = 0; i < nx; i++) {
		float want = mx[i] > 0.0f ? dxs[i] + g[i] : 0.0f;
		if (mx[i] <= 0.0f)
			cr_assert_eq(got[i], 0.0f, "[%zu]: masked (%g) but %g", i, (double)mx[i], (double)got[i]);
		cr_assert(fabsf(got[i] - want) <= 1e-5f * (1.0f + fabsf(want)), "[%zu]: %g, want %g", i,
			  (double)got[i], (double)want);
	}
	/* in place: the same bytes */
	memcpy(gx, dxs, nx * 4);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&s, cs, xs, rope, gx, mx, gx, b, t), DG_OK);
	cr_assert_eq(memcmp(gx, got, nx * 4), 0);
	/* rope=pre: qr given as xs, the mask still the ReLU's output */
	dg_spec pre = s;
	pre.rope_pre = true;
	memcpy(gx, dxs, nx * 4);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&pre, cs, qr, rope, gx, mx, gx, b, t), DG_OK);
	cr_assert_eq(memcmp(gx, got, nx * 4), 0, "rope=pre differs from rope=load");

	/* bf16 dxs: its widened value plus the f32 grad_xs, rounded once */
	dg_spec sf = spec_of(DG_OP_ATTENTION_GRAD_XS, h, n, d);
	cr_assert_eq(dg_ref_attention_grad_xs(&sf, cs, xs, rope, gx, b, t), DG_OK);
	uint16_t *db = malloc(nx * 2), *ob = malloc(nx * 2);
	cr_assert(db && ob);
	for (size_t i = 0; i < nx; i++)
		db[i] = dg_ref_f32_to_bf16(dxs[i]);
	dg_spec sb = s;
	sb.out = DG_FMT_BF16;
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&sb, cs, xs, rope, db, mx, ob, b, t), DG_OK);
	for (size_t i = 0; i < nx; i++) {
		uint16_t want = dg_ref_f32_to_bf16(mx[i] > 0.0f ? dg_ref_bf16_to_f32(db[i]) + gx[i] : 0.0f);
		cr_assert_eq(ob[i], want, "bf16 [%zu]: 0x%04x, want 0x%04x", i, ob[i], want);
	}

	/* the wrong epilogue for each reference; no dxs or mask */
	cr_assert_eq(dg_ref_attention_grad_xs(&s, cs, xs, rope, gx, b, t), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&sf, cs, xs, rope, dxs, mx, gx, b, t), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&s, cs, xs, rope, NULL, mx, gx, b, t), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_attention_grad_xs_mask(&s, cs, xs, rope, dxs, NULL, gx, b, t), DG_ERR_INVALID_ARG);
	free(xs), free(v), free(dout), free(dxs), free(mx), free(rope), free(qr), free(c), free(sn);
	free(cs), free(dqr), free(dv), free(g), free(got), free(gx), free(db), free(ob);
}

/* Normwise ‖got − want‖ / ‖want‖. */
static double rel_err(const float *got, const float *want, size_t n)
{
	double num = 0.0, den = 0.0;
	for (size_t i = 0; i < n; i++) {
		double e = (double)got[i] - want[i];
		num += e * e;
		den += (double)want[i] * want[i];
	}
	return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* The chunked form is the quadratic one, forward and backward, for chunks
 * that divide T, that do not, of 1 (the recurrence) and past T; within f32
 * rounding of the state (the quadratic form sums in double). */
Test(ref_attention, chunked_is_the_quadratic_form)
{
	const int b = 2, h = 3, n = 24, d = 5;
	const int ts[] = { 1, 7, 33 }, chunks[] = { 1, 3, 8, 16, 40 };
	dg_rng r;
	dg_rng_seed(&r, 11);
	for (size_t ti = 0; ti < sizeof(ts) / sizeof(ts[0]); ti++) {
		int t = ts[ti];
		size_t nq = (size_t)b * h * t * n, nv = (size_t)b * t * d, no = (size_t)b * h * t * d;
		/* post-ReLU, RoPE'd queries: signed, a share of zeros */
		float *qr = rnd(&r, nq, -1.0f), *v = rnd(&r, nv, -1.0f), *g = rnd(&r, no, -1.0f);
		for (size_t i = 0; i < nq; i += 3)
			qr[i] = 0.0f;
		float *o1 = calloc(no, sizeof(float)), *o2 = calloc(no, sizeof(float));
		float *q1 = calloc(nq, sizeof(float)), *q2 = calloc(nq, sizeof(float));
		float *v1 = calloc(nv, sizeof(float)), *v2 = calloc(nv, sizeof(float));
		dg_ref_attention_fwd(qr, v, b, h, t, n, d, o1);
		dg_ref_attention_bwd(g, qr, v, b, h, t, n, d, q1, v1);
		for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
			int c = chunks[ci];
			memset(o2, 0xff, no * sizeof(float)); /* NaN: every element written */
			memset(q2, 0xff, nq * sizeof(float));
			memset(v2, 0xff, nv * sizeof(float));
			dg_ref_attention_chunked_fwd(qr, v, b, h, t, n, d, c, o2);
			dg_ref_attention_chunked_bwd(g, qr, v, b, h, t, n, d, c, q2, v2);
			double eo = rel_err(o2, o1, no), eq = rel_err(q2, q1, nq), ev = rel_err(v2, v1, nv);
			cr_assert(eo < 1e-6, "T %d chunk %d: out off by %g", t, c, eo);
			cr_assert(eq < 1e-6, "T %d chunk %d: dqr off by %g", t, c, eq);
			cr_assert(ev < 1e-6, "T %d chunk %d: dv off by %g", t, c, ev);
		}
		free(qr), free(v), free(g), free(o1), free(o2), free(q1), free(q2), free(v1), free(v2);
	}
}

/* The oracle can fail: a state that starts at the chunk (the rows before it
 * forgotten) or a diagonal kept (tril(·, 0)) is far from the quadratic
 * form, so the bound above tells them apart. */
Test(ref_attention, chunked_bound_sees_a_lost_state)
{
	const int h = 1, n = 16, d = 4, t = 12, c = 4;
	dg_rng r;
	dg_rng_seed(&r, 5);
	float *qr = rnd(&r, (size_t)t * n, -1.0f), *v = rnd(&r, (size_t)t * d, -1.0f);
	float *want = calloc((size_t)t * d, sizeof(float)), *got = calloc((size_t)t * d, sizeof(float));
	float *state = calloc((size_t)n * d, sizeof(float));
	dg_ref_attention_fwd(qr, v, 1, h, t, n, d, want);
	for (int t0 = 0; t0 < t; t0 += c) { /* the state reset at every chunk */
		memset(state, 0, (size_t)n * d * sizeof(float));
		dg_ref_attention_state_chunk(state, qr + (size_t)t0 * n, v + (size_t)t0 * d, c, n, d,
					     got + (size_t)t0 * d);
	}
	cr_assert(rel_err(got, want, (size_t)t * d) > 1e-2);
	/* and kept across chunks, it is the quadratic form */
	memset(state, 0, (size_t)n * d * sizeof(float));
	for (int t0 = 0; t0 < t; t0 += c)
		dg_ref_attention_state_chunk(state, qr + (size_t)t0 * n, v + (size_t)t0 * d, c, n, d,
					     got + (size_t)t0 * d);
	cr_assert(rel_err(got, want, (size_t)t * d) < 1e-6);
	/* row 0 sees nothing: exactly 0 */
	for (int e = 0; e < d; e++)
		cr_assert_eq(got[e], 0.0f);
	free(qr), free(v), free(want), free(got), free(state);
}

/* attention_step, token by token, is the model's attention: RoPE at each
 * token's position (dg_ref_rope_row), then the chunk-1 recurrence
 * (dg_ref_attention_state_chunk) — out and the state, whose columns the
 * step keeps in groups of 8 (D 16: two groups) — and so the quadratic
 * form's rows; its zero pairs (a ReLU's) change nothing. */
Test(ref_attention, step_is_the_recurrence)
{
	enum { B = 2, H = 2, T = 9, N = 16, D = 16 };
	dg_spec s = spec_of(DG_OP_ATTENTION_STEP, H, N, D);
	dg_spec_normalize(&s);
	dg_rng r;
	dg_rng_seed(&r, 31);
	static float xs[B][H][T][N], v[B][T][D], qr[B][H][T][N], want[B][H][T][D];
	static float state[B][H][N][D], ref_state[B][H][N][D], out[B][H][D];
	float freq[N], c[N / 2], sn[N / 2];
	dg_ref_rope_freq(N, freq);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			for (int e = 0; e < D; e++)
				v[b][t][e] = dg_rng_uniform(&r, -1.0f, 1.0f);
			for (int h = 0; h < H; h++)
				for (int k = 0; k < N; k++) {
					float x = dg_rng_uniform(&r, -1.0f, 1.0f);
					xs[b][h][t][k] = x > 0.3f ? x : 0.0f; /* sparse, pairs of zeros too */
				}
		}
	/* the rotated rows and the quadratic form */
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			dg_ref_rope_row(t, N, c, sn);
			for (int h = 0; h < H; h++)
				dg_ref_rope_fwd(xs[b][h][t], c, sn, 1, 1, N, qr[b][h][t]);
		}
	dg_ref_attention_fwd(&qr[0][0][0][0], &v[0][0][0], B, H, T, N, D, &want[0][0][0][0]);
	memset(state, 0, sizeof(state));
	memset(ref_state, 0, sizeof(ref_state));
	for (int t = 0; t < T; t++) {
		float x1[B][H][N], v1[B][D], pos[B];
		for (int b = 0; b < B; b++) {
			pos[b] = (float)t;
			memcpy(v1[b], v[b][t], sizeof(v1[b]));
			for (int h = 0; h < H; h++)
				memcpy(x1[b][h], xs[b][h][t], sizeof(x1[b][h]));
		}
		cr_assert_eq(dg_ref_attention_step(&s, x1, pos, freq, v1, &state[0][0][0][0], out, B, 1), DG_OK);
		for (int b = 0; b < B; b++)
			for (int h = 0; h < H; h++) {
				float o1[D];
				dg_ref_attention_state_chunk(&ref_state[b][h][0][0], qr[b][h][t], v[b][t], 1, N, D, o1);
				for (int e = 0; e < D; e++) {
					cr_assert_float_eq(out[b][h][e], o1[e], 1e-5f, "t %d b %d h %d e %d", t, b, h, e);
					cr_assert_float_eq(out[b][h][e], want[b][h][t][e], 1e-4f, "t %d: the quadratic form", t);
				}
			}
	}
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int k = 0; k < N; k++)
				for (int e = 0; e < D; e++) /* S[k, e] at (e/8·N + k)·8 + e%8 of its (b, h) */
					cr_assert_float_eq((&state[b][h][0][0])[(e / 8 * N + k) * 8 + e % 8],
							   ref_state[b][h][k][e], 1e-5f, "state b %d h %d k %d e %d", b, h,
							   k, e);
	/* refusals */
	cr_assert_eq(dg_ref_attention_step(&s, NULL, NULL, freq, v, &state[0][0][0][0], out, B, 1), DG_ERR_INVALID_ARG);
}

/* A window of T tokens a row (xs (B,H,T,N), v (B,1,T,D), out (B,H,T,D),
 * token t at pos + t) is T calls of one token, out and state bit for bit,
 * from a state with a past and at positions past 2^16. */
Test(ref_attention, step_window_is_its_tokens)
{
	enum { B = 2, H = 3, T = 7, N = 12, D = 8 };
	dg_spec s = spec_of(DG_OP_ATTENTION_STEP, H, N, D);
	dg_spec_normalize(&s);
	dg_rng r;
	dg_rng_seed(&r, 37);
	static float xs[B][H][T][N], v[B][T][D], out[B][H][T][D], one[B][H][D];
	static float st_win[B][H][N][D], st_tok[B][H][N][D];
	float freq[N], pos[B] = { 5.0f, 70000.0f };
	dg_ref_rope_freq(N, freq);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			for (int e = 0; e < D; e++)
				v[b][t][e] = dg_rng_uniform(&r, -1.0f, 1.0f);
			for (int h = 0; h < H; h++)
				for (int k = 0; k < N; k++) {
					float x = dg_rng_uniform(&r, -1.0f, 1.0f);
					xs[b][h][t][k] = x > 0.2f ? x : 0.0f;
				}
		}
	for (int i = 0; i < B * H * N * D; i++)
		(&st_win[0][0][0][0])[i] = (&st_tok[0][0][0][0])[i] = dg_rng_uniform(&r, -0.1f, 0.1f);
	cr_assert_eq(dg_ref_attention_step(&s, xs, pos, freq, v, &st_win[0][0][0][0], out, B, T), DG_OK);
	for (int t = 0; t < T; t++) {
		float x1[B][H][N], v1[B][D], p1[B];
		for (int b = 0; b < B; b++) {
			p1[b] = pos[b] + (float)t;
			memcpy(v1[b], v[b][t], sizeof(v1[b]));
			for (int h = 0; h < H; h++)
				memcpy(x1[b][h], xs[b][h][t], sizeof(x1[b][h]));
		}
		cr_assert_eq(dg_ref_attention_step(&s, x1, p1, freq, v1, &st_tok[0][0][0][0], one, B, 1), DG_OK);
		for (int b = 0; b < B; b++)
			for (int h = 0; h < H; h++)
				cr_assert_eq(memcmp(one[b][h], out[b][h][t], sizeof(one[b][h])), 0, "token %d row %d head %d", t,
					     b, h);
	}
	cr_assert_eq(memcmp(st_win, st_tok, sizeof(st_win)), 0, "the state after the window");
}

/* The chunked form as the GPU runs it (templates/attention_chunk.lua and
 * the quadratic kernels on the chunks as sequences of one head), each
 * piece by its CPU reference: the quadratic form at T = C over the B·H·T/C
 * chunks with the values a head each, the states as bf16 hi + lo, the
 * inter-chunk terms added, dq's intra term from the chunks' grad_scores,
 * the heads' value gradients summed. Equal to
 * the quadratic form over the whole T, forward and backward, within the
 * states' split (2^-16 of a state). */
Test(ref_attention, chunk_pieces_make_the_quadratic_form)
{
	const int b = 2, h = 3, n = 16, d = 8;
	const int cases[][2] = { { 8, 2 }, { 12, 4 }, { 16, 16 }, { 24, 8 } }; /* (T, C) */
	dg_rng r;
	dg_rng_seed(&r, 23);
	for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
		const int t = cases[ci][0], c = cases[ci][1], nc = t / c, g = b * h * nc;
		size_t nq = (size_t)b * h * t * n, nv = (size_t)b * t * d, no = (size_t)b * h * t * d;
		size_t nst = (size_t)b * h * nc * 2 * n * d;
		float *qr = rnd(&r, nq, -1.0f), *v = rnd(&r, nv, -1.0f), *dout = rnd(&r, no, -1.0f);
		for (size_t i = 0; i < nq; i += 3)
			qr[i] = 0.0f;
		float *vr = malloc(no * sizeof(float)); /* the values a head each */
		for (int bi = 0; bi < b; bi++)
			for (int hi = 0; hi < h; hi++)
				memcpy(vr + ((size_t)bi * h + hi) * t * d, v + (size_t)bi * t * d, (size_t)t * d * sizeof(float));
		uint16_t *s_st = malloc(nst * sizeof(uint16_t)), *r_st = malloc(nst * sizeof(uint16_t));
		/* forward */
		float *o1 = calloc(no, sizeof(float)), *o2 = calloc(no, sizeof(float));
		dg_ref_attention_fwd(qr, v, b, h, t, n, d, o1);
		dg_ref_attention_fwd(qr, vr, g, 1, c, n, d, o2); /* intra */
		dg_ref_attention_chunk_state(qr, v, b, h, t, n, d, c, 1, false, s_st);
		dg_ref_attention_chunk_out(qr, s_st, b, h, t, n, d, c, false, o2);
		double eo = rel_err(o2, o1, no);
		/* backward */
		float *q1 = calloc(nq, sizeof(float)), *q2 = calloc(nq, sizeof(float));
		float *v1 = calloc(nv, sizeof(float)), *v2 = calloc(nv, sizeof(float)), *gvh = calloc(no, sizeof(float));
		float *cc = malloc((size_t)g * c * c * sizeof(float)), *dq_intra = malloc(nq * sizeof(float));
		dg_spec gs;
		dg_spec_init(&gs, DG_OP_ATTENTION_GRAD_SCORES);
		gs.act = DG_FMT_F32;
		gs.heads = 1;
		gs.embd = d;
		dg_ref_attention_bwd(dout, qr, v, b, h, t, n, d, q1, v1);
		/* intra: grad_v's a head's dv each (its dqr is dq's, below), grad_scores' C */
		dg_ref_attention_bwd(dout, qr, vr, g, 1, c, n, d, dq_intra, gvh);
		cr_assert_eq(dg_ref_attention_grad_scores(&gs, dout, vr, cc, g, c), DG_OK);
		dg_ref_attention_chunk_state(qr, dout, b, h, t, n, d, c, h, true, r_st);
		dg_ref_attention_chunk_dq(cc, qr, dout, v, s_st, r_st, b, h, t, n, d, c, q2);
		dg_ref_attention_chunk_out(qr, r_st, b, h, t, n, d, c, true, gvh);
		for (int bi = 0; bi < b; bi++) /* the heads in order */
			for (size_t i = 0; i < (size_t)t * d; i++) {
				float s = 0.0f;
				for (int hi = 0; hi < h; hi++)
					s += gvh[((size_t)bi * h + hi) * t * d + i];
				v2[(size_t)bi * t * d + i] = s;
			}
		double eq = rel_err(q2, q1, nq), ev = rel_err(v2, v1, nv);
		cr_expect(eo < 1e-4, "T %d C %d: out off by %g", t, c, eo);
		cr_expect(eq < 1e-4, "T %d C %d: dqr off by %g", t, c, eq);
		cr_expect(ev < 1e-4, "T %d C %d: dv off by %g", t, c, ev);
		printf("chunk pieces T %d C %d: out %.2g, dqr %.2g, dv %.2g off the quadratic form\n", t, c, eo, eq, ev);
		free(qr), free(v), free(dout), free(vr), free(s_st), free(r_st), free(o1), free(o2);
		free(q1), free(q2), free(v1), free(v2), free(gvh), free(cc), free(dq_intra);
	}
}
