/*
 * The gradient GEMMs' references with bf16 gradients (runtime/ref/grad.c;
 * dragon/spec.h "gradient formats"), no device needed:
 *   - lowrank_grad_input / _weight with src=bf16 read grad exactly: the
 *     same bytes as the f32 reference of its widened values, every weight
 *     and act format, Hin 1 and H;
 *   - decoder_grad_input with out=bf16 writes the f32 result rounded to
 *     nearest even once (each element checked), every weight format;
 *   - a hand case: grad 1 + 2^-7 (exact in bf16) times w 3;
 *   - a gradient format the op does not take is refused, output untouched.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "dragon/rng.h"
#include "ref_helpers.h"
#include "runtime/ref/ref_ops.h"

static void *fill(dg_rng *r, dg_fmt f, size_t n)
{
	void *p = rh_xmalloc(n * 4 + 16);
	dg_rng_fill(r, f, p, n);
	return p;
}

static dg_spec spec_of(dg_op op, int hin)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = 2;
	s.in_heads = hin;
	s.embd = 64;
	s.latent = 32;
	return s;
}

Test(grad_refs_bf16, bf16_grad_reads_exactly_and_bf16_out_rounds_once)
{
	static const dg_fmt ws[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	static const dg_fmt as[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	const int B = 2, T = 3;
	dg_rng r;
	dg_rng_seed(&r, 77);
	for (int f = 0; f < 5; f++)
		for (int hin = 1; hin <= 2; hin++) {
			dg_spec gi = spec_of(DG_OP_LOWRANK_GRAD_INPUT, hin), gw = spec_of(DG_OP_LOWRANK_GRAD_WEIGHT, hin);
			gi.weight = ws[f];
			gw.act = as[f];
			size_t ng = (size_t)B * 2 * T * 32, nw = (size_t)2 * 32 * 64, nx = (size_t)B * hin * T * 64;
			uint16_t *g = fill(&r, DG_FMT_BF16, ng);
			float *wide = rh_xmalloc(ng * 4);
			for (size_t i = 0; i < ng; i++)
				wide[i] = dg_bf16_to_f32(g[i]);
			void *w = fill(&r, ws[f], nw), *x = fill(&r, as[f], nx);
			float *a = rh_xmalloc(nw * 4), *b = rh_xmalloc(nw * 4);
			cr_assert_eq(dg_ref_lowrank_grad_input(&gi, wide, w, 0.5f, a, B, T), DG_OK);
			gi.src = DG_FMT_BF16;
			cr_assert_eq(dg_ref_lowrank_grad_input(&gi, g, w, 0.5f, b, B, T), DG_OK);
			cr_assert_eq(memcmp(a, b, nx * 4), 0, "lowrank_grad_input %s Hin %d", dg_fmt_name(ws[f]), hin);
			cr_assert_eq(dg_ref_lowrank_grad_weight(&gw, wide, x, 0.5f, a, B, T), DG_OK);
			gw.src = DG_FMT_BF16;
			cr_assert_eq(dg_ref_lowrank_grad_weight(&gw, g, x, 0.5f, b, B, T), DG_OK);
			cr_assert_eq(memcmp(a, b, nw * 4), 0, "lowrank_grad_weight %s Hin %d", dg_fmt_name(as[f]), hin);
			free(g), free(wide), free(w), free(x), free(a), free(b);
		}
	for (int f = 0; f < 5; f++) {
		dg_spec di = spec_of(DG_OP_DECODER_GRAD_INPUT, 1);
		di.weight = ws[f];
		size_t ng = (size_t)B * T * 64, nw = (size_t)64 * 2 * 32, ny = (size_t)B * 2 * T * 32;
		float *g = fill(&r, DG_FMT_F32, ng), *y = rh_xmalloc(ny * 4);
		void *w = fill(&r, ws[f], nw);
		uint16_t *yb = rh_xmalloc(ny * 2);
		cr_assert_eq(dg_ref_decoder_grad_input(&di, g, w, 0.25f, y, B, T), DG_OK);
		di.out = DG_FMT_BF16;
		cr_assert_eq(dg_ref_decoder_grad_input(&di, g, w, 0.25f, yb, B, T), DG_OK);
		size_t nonzero = 0;
		for (size_t i = 0; i < ny; i++) {
			cr_assert_eq(yb[i], dg_f32_to_bf16(y[i]), "decoder_grad_input %s grad_y[%zu]", dg_fmt_name(ws[f]),
				     i);
			nonzero += y[i] != 0.0f;
		}
		cr_assert_gt(nonzero, ny / 2);
		free(g), free(y), free(w), free(yb);
	}
}

/* Hand-worked: one head, latent 4, embd 4, B = T = 1. grad (1, 1, 1, 4)
 * bf16 = (1 + 2^-7, 0, 0, 0) (0x3f81, exact), w f32 = 3 everywhere:
 * grad_x = 3·(1 + 2^-7) = 3.0234375 exactly. Decoder: grad (1,1,1,4) f32
 * = (1, 2^-8, 0, 0), w (4, 4) f32 = 1 everywhere: grad_y = 1 + 2^-8 in
 * f32, half a bf16 ulp (2^-7) above 1: a tie, to even, 1 (0x3f80); with
 * 3·2^-8 it is 1.5 ulps, a tie between 0x3f81 and 0x3f82: to even, up. */
Test(grad_refs_bf16, hand_worked)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_GRAD_INPUT);
	s.heads = 1, s.in_heads = 1, s.embd = 4, s.latent = 4, s.weight = DG_FMT_F32, s.src = DG_FMT_BF16;
	const uint16_t g[4] = { 0x3f81, 0, 0, 0 };
	const float w[16] = { 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3 };
	float gx[4];
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1.0f, gx, 1, 1), DG_OK);
	for (int e = 0; e < 4; e++)
		cr_assert_eq(gx[e], 3.0234375f, "grad_x[%d] = %.9g", e, (double)gx[e]);
	dg_spec d;
	dg_spec_init(&d, DG_OP_DECODER_GRAD_INPUT);
	d.heads = 1, d.embd = 4, d.latent = 4, d.weight = DG_FMT_F32, d.out = DG_FMT_BF16;
	const float ones[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	float gd[4] = { 1.0f, 0x1p-8f, 0, 0 };
	uint16_t gy[4];
	cr_assert_eq(dg_ref_decoder_grad_input(&d, gd, ones, 1.0f, gy, 1, 1), DG_OK);
	for (int l = 0; l < 4; l++)
		cr_assert_eq(gy[l], 0x3f80, "1 + 2^-8: a tie, to even (down): grad_y[%d] = 0x%04x", l, gy[l]);
	gd[1] = 3 * 0x1p-8f;
	cr_assert_eq(dg_ref_decoder_grad_input(&d, gd, ones, 1.0f, gy, 1, 1), DG_OK);
	for (int l = 0; l < 4; l++)
		cr_assert_eq(gy[l], 0x3f82, "1 + 3·2^-8: a tie, to even (up): grad_y[%d] = 0x%04x", l, gy[l]);
}

Test(grad_refs_bf16, formats_it_does_not_take)
{
	float g[64] = { 0 }, out[256];
	uint32_t w[256] = { 0 };
	memset(out, 0x5a, sizeof(out));
	unsigned char before[sizeof(out)];
	memcpy(before, out, sizeof(out));
	dg_spec s = spec_of(DG_OP_LOWRANK_GRAD_INPUT, 1);
	s.heads = 1, s.embd = 4, s.latent = 4, s.weight = DG_FMT_F32;
	s.src = DG_FMT_INT8;
	cr_assert_eq(dg_ref_lowrank_grad_input(&s, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	dg_spec t = s;
	t.op = DG_OP_LOWRANK_GRAD_WEIGHT;
	t.act = DG_FMT_F32;
	t.src = DG_FMT_UINT8POS;
	cr_assert_eq(dg_ref_lowrank_grad_weight(&t, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	dg_spec d;
	dg_spec_init(&d, DG_OP_DECODER_GRAD_INPUT);
	d.heads = 1, d.embd = 4, d.latent = 4, d.weight = DG_FMT_F32, d.out = DG_FMT_INT8;
	cr_assert_eq(dg_ref_decoder_grad_input(&d, g, w, 1, out, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(memcmp(out, before, sizeof(out)), 0, "a refused call wrote its output");
	d.out = DG_FMT_F32;
	cr_assert_eq(dg_ref_decoder_grad_input(&d, g, w, 1, out, 1, 1), DG_OK);
}
