/*
 * Tests of the element-wise CPU references (runtime/ref/quantize.c,
 * pack.c): bf16 <-> f32, qmax, activation and weight quantize, and the
 * i8x4, ternary and sign1 packings. lowrank_fwd's reference is tested in tests/test_ref_lowrank.c.
 *
 * The references are the contracts the GPU kernels are compared against,
 * so they must be right on their own. Hand-computed cases (worked in the
 * comments) pin the layouts and the rounding; random property tests check
 * the references against independent naive implementations written here.
 * Random data comes from a fixed-seed generator (tests/ref_helpers.h), so
 * every run sees the same inputs.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "ref_helpers.h"
#include "runtime/ref/ref_ops.h"

/* --- helpers ------------------------------------------------------------- */

static float bitsf(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* --- bf16 ---------------------------------------------------------------- */

Test(bf16, hand_cases)
{
	/* 1.0 = 0x3f800000: exact. */
	cr_assert_eq(dg_ref_f32_to_bf16(1.0f), 0x3f80);
	/* 0x3f808000 is halfway between 0x3f80 and 0x3f81: ties to even
	 * keeps 0x3f80. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80);
	/* 0x3f818000 is halfway between 0x3f81 and 0x3f82: even is 0x3f82. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82);
	/* Just above / below the half: 0x3f808001 up, 0x3f807fff down. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x3f808001u)), 0x3f81);
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x3f807fffu)), 0x3f80);
	/* Negative tie: 0xbf818000 → 0xbf82 (magnitude rounds the same). */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0xbf818000u)), 0xbf82);
	/* -0 keeps its sign. */
	cr_assert_eq(dg_ref_f32_to_bf16(-0.0f), 0x8000);
	/* Subnormals: 0x00008000 ties to 0x0000, 0x00018000 ties to 0x0002. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x00008000u)), 0x0000);
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x00018000u)), 0x0002);
	/* FLT_MAX 0x7f7fffff: dropped bits 0xffff > half, rounds up into the
	 * exponent: +inf (0x7f80), as round-to-nearest must. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80);
	/* bf16 → f32 is a shift: 0xc0a0 → 0xc0a00000 = -5.0. */
	cr_assert_eq(dg_ref_bf16_to_f32(0xc0a0), -5.0f);
}

Test(bf16, nan_and_inf)
{
	cr_assert_eq(dg_ref_f32_to_bf16(INFINITY), 0x7f80);
	cr_assert_eq(dg_ref_f32_to_bf16(-INFINITY), 0xff80);
	/* Quiet NaN 0x7fc00000 → 0x7fc0; -NaN keeps its sign. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x7fc00000u)), 0x7fc0);
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0xffc00000u)), 0xffc0);
	/* A NaN whose payload lives only in the dropped 16 bits must stay a
	 * NaN (truncation would give inf 0x7f80): quiet bit set → 0x7fc0. */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x7f800001u)), 0x7fc0);
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0xff80ffffu)), 0xffc0);
	/* Top payload bits are kept: 0x7fa12345 → 0x7fe1 (0x7fa1 | 0x0040). */
	cr_assert_eq(dg_ref_f32_to_bf16(bitsf(0x7fa12345u)), 0x7fe1);
	/* Every NaN stays NaN, with its sign. */
	for (uint32_t m = 1; m < (1u << 23); m += 4099) {
		uint32_t u = 0x7f800000u | m;
		uint16_t h = dg_ref_f32_to_bf16(bitsf(u));
		uint16_t hn = dg_ref_f32_to_bf16(bitsf(u | 0x80000000u));

		cr_assert(isnan(dg_ref_bf16_to_f32(h)), "0x%08x → 0x%04x", u, h);
		cr_assert_eq(hn & 0x8000, 0x8000);
		cr_assert(isnan(dg_ref_bf16_to_f32(hn)));
	}
}

Test(bf16, roundtrip_every_value)
{
	/* bf16 → f32 → bf16 is the identity for every non-NaN pattern, and
	 * keeps NaNs NaN. */
	for (uint32_t h = 0; h <= 0xffff; h++) {
		float f = dg_ref_bf16_to_f32((uint16_t)h);
		uint16_t back = dg_ref_f32_to_bf16(f);

		cr_assert_eq(rh_fbits(f), h << 16);
		if (isnan(f))
			cr_assert(isnan(dg_ref_bf16_to_f32(back)), "0x%04x", h);
		else
			cr_assert_eq(back, h, "0x%04x → 0x%04x", h, back);
	}
}

Test(bf16, nearest_ties_to_even_random)
{
	/* For finite x, the result is one of the two bf16 neighbours around
	 * the truncation, the nearer one in exact (double) arithmetic, and
	 * the even one on a tie. */
	rh_rng_seed(1);
	for (int i = 0; i < 200000; i++) {
		uint32_t u = rh_rng_u32();
		float x = bitsf(u);
		uint16_t lo, hi, r;
		double dlo, dhi, dx;

		if (i % 4 == 0) /* plenty of exact ties */
			u = (u & 0xffff0000u) | 0x8000u, x = bitsf(u);
		if (!isfinite(x))
			continue;
		lo = (uint16_t)(u >> 16);
		hi = (uint16_t)(lo + 1); /* next magnitude away from zero */
		r = dg_ref_f32_to_bf16(x);
		cr_assert(r == lo || r == hi, "0x%08x → 0x%04x", u, r);
		dx = fabs((double)x);
		dlo = fabs((double)dg_ref_bf16_to_f32(lo));
		/* hi may be inf (past FLT_MAX): the overflow threshold is
		 * 0x7f7f8000, halfway to 2^128. */
		dhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1.0, 128)
					      : fabs((double)dg_ref_bf16_to_f32(hi));
		if (dx - dlo < dhi - dx)
			cr_assert_eq(r, lo, "0x%08x", u);
		else if (dx - dlo > dhi - dx)
			cr_assert_eq(r, hi, "0x%08x", u);
		else
			cr_assert_eq(r, (lo & 1) ? hi : lo, "tie 0x%08x", u);
	}
}

/* --- qmax ---------------------------------------------------------------- */

Test(qmax, table)
{
	cr_assert_eq(dg_ref_qmax(DG_FMT_INT8), 127);
	cr_assert_eq(dg_ref_qmax(DG_FMT_INT4), 7);
	cr_assert_eq(dg_ref_qmax(DG_FMT_UINT8POS), 255);
	cr_assert_eq(dg_ref_qmax(DG_FMT_TERNARY), 1);
	cr_assert_eq(dg_ref_qmax(DG_FMT_SIGN1), 1);
	cr_assert_eq(dg_ref_qmax(DG_FMT_F32), 0);
	cr_assert_eq(dg_ref_qmax(DG_FMT_BF16), 0);
	cr_assert_eq(dg_ref_qmax(DG_FMT__COUNT), 0);
}

/* --- activation quantize ------------------------------------------------- */

Test(quantize_act, hand_int8)
{
	/* Σ|x| = 10, n = 4: scale = 2·10 / (4·127) = 20/508 ≈ 0.0393701.
	 * x/scale = 25.4, -50.8, 76.2, -101.6 → 25, -51, 76, -102. */
	const float x[4] = { 1.0f, -2.0f, 3.0f, -4.0f };
	const int8_t want[4] = { 25, -51, 76, -102 };
	int8_t c[4];
	float s = -1.0f;

	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, x, 4, c, &s),
		     DG_OK);
	cr_assert_eq(s, (float)(20.0 / 508.0));
	for (int i = 0; i < 4; i++)
		cr_assert_eq(c[i], want[i], "code %d: %d", i, c[i]);
}

Test(quantize_act, hand_int4)
{
	/* Σ|x| = 17.5, n = 4, qmax 7: scale = 35/28 = 1.25 exactly.
	 * x/scale = 5.6, -5.6, 2.8, 0 → 6, -6, 3, 0. */
	const float x[4] = { 7.0f, -7.0f, 3.5f, 0.0f };
	const int8_t want[4] = { 6, -6, 3, 0 };
	int8_t c[4];
	float s;

	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT4, x, 4, c, &s),
		     DG_OK);
	cr_assert_eq(s, 1.25f);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(c[i], want[i], "code %d: %d", i, c[i]);
}

Test(quantize_act, apply_ties_to_even_and_clamp)
{
	/* scale 1.25: 0.5 → 0, 1.5 → 2, 2.5 → 2, -0.5 → 0, -1.5 → -2 (ties to
	 * even), ±80 → clamped to ±7 (int4). */
	const float x[7] = { 0.625f, 1.875f, 3.125f, -0.625f, -1.875f, 100.0f,
			     -100.0f };
	const int8_t want[7] = { 0, 2, 2, 0, -2, 7, -7 };
	int8_t c[7];

	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_INT4, x, 7,
					       1.25f, c),
		     DG_OK);
	for (int i = 0; i < 7; i++)
		cr_assert_eq(c[i], want[i], "code %d: %d", i, c[i]);
}

Test(quantize_act, apply_uint8pos_never_negative)
{
	/* scale 0.5: -6 → 0 (clamped at 0, never a wrapped byte), 0.5 → 0,
	 * 1.5 → 2, 2.5 → 2, 400 → 255, -0 → 0. */
	const float x[6] = { -3.0f, 0.25f, 0.75f, 1.25f, 200.0f, -0.0f };
	const uint8_t want[6] = { 0, 0, 2, 2, 255, 0 };
	uint8_t c[6];

	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_UINT8POS, x,
					       6, 0.5f, c),
		     DG_OK);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(c[i], want[i], "code %d: %d", i, c[i]);
}

Test(quantize_act, apply_nan_inf)
{
	/* NaN → 0 (as __float2int_rn), ±inf → clamped. */
	const float x[3] = { NAN, INFINITY, -INFINITY };
	int8_t c[3];
	uint8_t u[3];

	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_INT8, x, 3,
					       1.0f, c),
		     DG_OK);
	cr_assert_eq(c[0], 0);
	cr_assert_eq(c[1], 127);
	cr_assert_eq(c[2], -127);
	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_UINT8POS, x,
					       3, 1.0f, u),
		     DG_OK);
	cr_assert_eq(u[0], 0);
	cr_assert_eq(u[1], 255);
	cr_assert_eq(u[2], 0);
}

Test(quantize_act, zero_scale_gives_zero_codes)
{
	const float z[5] = { 0 };
	const float x[3] = { 1.0f, -2.0f, 300.0f };
	int8_t c[5] = { 9, 9, 9, 9, 9 };
	float s = -1.0f;

	/* Every x is 0 → scale 0, codes 0. */
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, z, 5, c, &s),
		     DG_OK);
	cr_assert_eq(s, 0.0f);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(c[i], 0);
	/* Apply with scale 0: code 0 whatever x is. */
	memset(c, 9, sizeof(c));
	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_INT8, x, 3,
					       0.0f, c),
		     DG_OK);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(c[i], 0);
}

Test(quantize_act, bf16_src_equals_f32_of_same_values)
{
	enum { N = 1000 };
	uint16_t xb[N];
	float xf[N];
	int8_t cb[N], cf[N];
	float sb, sf;

	rh_rng_seed(2);
	for (int i = 0; i < N; i++) {
		xb[i] = dg_ref_f32_to_bf16((float)rh_rng_int(-100000, 100000) / 997.0f);
		xf[i] = dg_ref_bf16_to_f32(xb[i]);
	}
	for (dg_fmt act = DG_FMT_INT8; act <= DG_FMT_UINT8POS; act++) {
		if (act == DG_FMT_TERNARY || act == DG_FMT_SIGN1)
			continue;
		cr_assert_eq(dg_ref_quantize_act(DG_FMT_BF16, act, xb, N, cb, &sb), DG_OK);
		cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, act, xf, N, cf, &sf), DG_OK);
		cr_assert_eq(sb, sf, "%s", dg_fmt_name(act));
		cr_assert_eq(memcmp(cb, cf, N), 0, "%s", dg_fmt_name(act));
	}
}

Test(quantize_act, random_codes_in_range)
{
	enum { N = 4096 };
	static const dg_fmt acts[3] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	float *x = rh_xmalloc(N * sizeof(*x));
	uint8_t *c = rh_xmalloc(N);

	rh_rng_seed(3);
	for (int rep = 0; rep < 6; rep++) {
		double sum = 0.0;

		for (int i = 0; i < N; i++) {
			/* heavy-tailed: some values far past the mean */
			x[i] = (float)rh_rng_int(-1000, 1000) / 100.0f *
			       (rh_rng_int(0, 50) == 0 ? 40.0f : 1.0f);
			sum += fabs((double)x[i]);
		}
		for (int a = 0; a < 3; a++) {
			dg_fmt act = acts[a];
			int qmax = dg_ref_qmax(act);
			int lo = act == DG_FMT_UINT8POS ? 0 : -qmax;
			float s;

			cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, act, x, N, c, &s), DG_OK);
			cr_assert_eq(s, (float)(2.0 * sum / ((double)N * qmax)), "%s", dg_fmt_name(act));
			for (int i = 0; i < N; i++) {
				int code = act == DG_FMT_UINT8POS ? (int)c[i] : (int)(int8_t)c[i];
				double q = (double)(x[i] / s);

				cr_assert(code >= lo && code <= qmax, "%s code %d", dg_fmt_name(act), code);
				if (act == DG_FMT_UINT8POS && x[i] <= 0.0f)
					cr_assert_eq(code, 0, "uint8pos of %g", (double)x[i]);
				if (q > lo && q < qmax) /* not clamped: nearest */
					cr_assert(fabs(code - q) <= 0.5, "%s %g → %d", dg_fmt_name(act), q, code);
				else
					cr_assert_eq(code, q <= lo ? lo : qmax);
			}
		}
	}
	free(x);
	free(c);
}

Test(quantize_act, bad_args)
{
	float x[4] = { 1, 2, 3, 4 }, s;
	int8_t c[4];

	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, NULL, 4, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, x, 4, NULL, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, x, 4, c, NULL), DG_ERR_INVALID_ARG);
	s = 42.0f; /* a refused call leaves the outputs alone */
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_INT8, DG_FMT_INT8, x, 4, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(s, 42.0f);
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_F32, x, 4, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_TERNARY, x, 4, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT__COUNT, x, 4, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_F32, DG_FMT_SIGN1, x, 4, 1.0f, c), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_act_apply(DG_FMT_BF16, DG_FMT_INT8, NULL, 4, 1.0f, c), DG_ERR_INVALID_ARG);
}

/* --- weight quantize ----------------------------------------------------- */

Test(quantize_weight, hand_int8)
{
	/* Σ|w| = 254, n = 2: scale = 2·254 / (2·127) = 2; w/scale = ±63.5
	 * ties to even: ±64. */
	const float w[2] = { 127.0f, -127.0f };
	/* Σ|w| = 4, n = 2: scale = 8/254; 1/s = 31.75 → 32, 3/s = 95.25 → 95. */
	const float v[2] = { 1.0f, 3.0f };
	int8_t c[2];
	float s;

	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, w, 2, c, &s), DG_OK);
	cr_assert_eq(s, 2.0f);
	cr_assert_eq(c[0], 64);
	cr_assert_eq(c[1], -64);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, v, 2, c, &s), DG_OK);
	cr_assert_eq(s, (float)(8.0 / 254.0));
	cr_assert_eq(c[0], 32);
	cr_assert_eq(c[1], 95);
}

Test(quantize_weight, hand_ternary_and_sign1)
{
	/* Σ|w| = 3.825, n = 6: scale = 0.6375. |0.25|, |0.625| < scale → 0;
	 * 1, -1, -0.7 → sign. */
	const float w[6] = { 1.0f, -1.0f, 0.25f, -0.25f, 0.625f, -0.7f };
	const int8_t want_t[6] = { 1, -1, 0, 0, 0, -1 };
	/* sign1: +1 where w >= 0 (0 included), else -1; scale mean|w| =
	 * 2.25/4 = 0.5625. */
	const float v[4] = { 1.0f, -1.0f, 0.0f, -0.25f };
	const int8_t want_s[4] = { 1, -1, 1, -1 };
	int8_t c[6];
	float s;

	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_TERNARY, w, 6, c, &s), DG_OK);
	cr_assert_eq(s, (float)(3.825 / 6.0));
	for (int i = 0; i < 6; i++)
		cr_assert_eq(c[i], want_t[i], "ternary %d: %d", i, c[i]);
	/* |w| equal to the scale is not below it: w = 1 -1 1 -1, scale 1 →
	 * codes stay ±1. */
	{
		const float e[4] = { 1.0f, -1.0f, 1.0f, -1.0f };

		cr_assert_eq(dg_ref_quantize_weight(DG_FMT_TERNARY, e, 4, c, &s), DG_OK);
		cr_assert_eq(s, 1.0f);
		for (int i = 0; i < 4; i++)
			cr_assert_eq(c[i], e[i] > 0 ? 1 : -1, "ternary at the scale %d", i);
	}
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_SIGN1, v, 4, c, &s), DG_OK);
	cr_assert_eq(s, 0.5625f);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(c[i], want_s[i], "sign1 %d: %d", i, c[i]);
}

Test(quantize_weight, random_properties)
{
	enum { N = 3000 };
	float *w = rh_xmalloc(N * sizeof(*w));
	int8_t *c = rh_xmalloc(N);
	double sum = 0.0;
	float s;

	rh_rng_seed(4);
	for (int i = 0; i < N; i++) {
		w[i] = (float)rh_rng_int(-30000, 30000) / 7919.0f;
		sum += fabs((double)w[i]);
	}
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, w, N, c, &s), DG_OK);
	cr_assert_eq(s, (float)(2.0 * sum / (N * 127.0)));
	for (int i = 0; i < N; i++) {
		cr_assert(c[i] >= -127 && c[i] <= 127);
		if (fabsf(w[i] / s) < 127.0f)
			cr_assert(fabs(c[i] - (double)(w[i] / s)) <= 0.5, "%d", i);
	}
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_TERNARY, w, N, c, &s), DG_OK);
	cr_assert_eq(s, (float)(sum / N));
	for (int i = 0; i < N; i++) {
		int want = fabsf(w[i]) < s ? 0 : w[i] > 0 ? 1 : -1;

		cr_assert_eq(c[i], want, "ternary %d", i);
	}
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_SIGN1, w, N, c, &s), DG_OK);
	for (int i = 0; i < N; i++)
		cr_assert_eq(c[i], w[i] >= 0 ? 1 : -1, "sign1 %d", i);
	free(w);
	free(c);
}

Test(quantize_weight, bad_args)
{
	float w[2] = { 1, 2 }, s;
	int8_t c[2];

	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT4, w, 2, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_F32, w, 2, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_UINT8POS, w, 2, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, NULL, 2, c, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, w, 2, NULL, &s), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_quantize_weight(DG_FMT_INT8, w, 2, c, NULL), DG_ERR_INVALID_ARG);
}

/* --- packing ------------------------------------------------------------- */

Test(pack, i8x4_hand)
{
	/* One row, K = 4, C = 2; codes (k, c):
	 *   k0: 1  2 | k1: 3  4 | k2: 5  6 | k3: -1 -2
	 * column 0 = 1, 3, 5, -1 → bytes 01 03 05 ff → word 0xff050301;
	 * column 1 = 2, 4, 6, -2 → bytes 02 04 06 fe → word 0xfe060402. */
	const int8_t codes[8] = { 1, 2, 3, 4, 5, 6, -1, -2 };
	int32_t packed[2];
	int8_t back[8];

	cr_assert_eq(dg_ref_pack_i8x4(codes, packed, 1, 4, 2), DG_OK);
	cr_assert_eq((uint32_t)packed[0], 0xff050301u, "0x%08x", (uint32_t)packed[0]);
	cr_assert_eq((uint32_t)packed[1], 0xfe060402u, "0x%08x", (uint32_t)packed[1]);
	cr_assert_eq(dg_ref_unpack_i8x4(packed, back, 1, 4, 2), DG_OK);
	cr_assert_eq(memcmp(back, codes, 8), 0);
}

Test(pack, i8x4_random_roundtrip_and_layout)
{
	static const int ks[3] = { 4, 8, 36 }, cs[3] = { 1, 3, 8 };

	rh_rng_seed(5);
	for (size_t rows = 1; rows <= 3; rows++)
		for (int ki = 0; ki < 3; ki++)
			for (int ci = 0; ci < 3; ci++) {
				int K = ks[ki], C = cs[ci];
				size_t n = rows * (size_t)K * (size_t)C;
				int8_t *codes = rh_xmalloc(n), *back = rh_xmalloc(n);
				int32_t *packed = rh_xmalloc(n);

				for (size_t i = 0; i < n; i++)
					codes[i] = (int8_t)rh_rng_int(-128, 127);
				cr_assert_eq(dg_ref_pack_i8x4(codes, packed, rows, K, C), DG_OK);
				/* word (r, c, k/4), byte j = codes (r, k + j, c) */
				for (size_t r = 0; r < rows; r++)
					for (int c = 0; c < C; c++)
						for (int k = 0; k < K; k++) {
							uint32_t u = (uint32_t)packed[(r * C + c) * (K / 4) + k / 4];
							int8_t b = (int8_t)(uint8_t)(u >> (8 * (k % 4)));

							cr_assert_eq(b, codes[(r * K + k) * C + c],
								     "rows %zu K %d C %d at (%zu,%d,%d)", rows, K, C, r, k, c);
						}
				memset(back, 0x55, n);
				cr_assert_eq(dg_ref_unpack_i8x4(packed, back, rows, K, C), DG_OK);
				cr_assert_eq(memcmp(back, codes, n), 0, "rows %zu K %d C %d", rows, K, C);
				free(codes);
				free(back);
				free(packed);
			}
}

Test(pack, i8x4_bad_args)
{
	int8_t c[16] = { 0 };
	int32_t p[4] = { 0 };

	cr_assert_eq(dg_ref_pack_i8x4(c, p, 1, 6, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(c, p, 1, 0, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(c, p, 1, 4, 0), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(c, p, 1, -4, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(NULL, p, 1, 4, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(c, NULL, 1, 4, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_i8x4(c, p, SIZE_MAX / 2, 4, 4), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_i8x4(p, c, 1, 2, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_i8x4(NULL, c, 1, 4, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_unpack_i8x4(p, NULL, 1, 4, 1), DG_ERR_INVALID_ARG);
}

Test(pack, ternary_hand)
{
	/* codes 0..3 = +1, -1, 0, +1 → bits 01, 11, 00, 01 at 0..7:
	 * 0b01001101 = 0x4d; code 15 = -1 → bits 30..31 = 11: 0xc0000000.
	 * Word: 0xc000004d. */
	int8_t c[16] = { 1, -1, 0, 1 };
	uint32_t w = 0;

	c[15] = -1;
	cr_assert_eq(dg_ref_pack_ternary(c, &w, 1, 16), DG_OK);
	cr_assert_eq(w, 0xc000004du, "0x%08x", w);
}

Test(pack, sign1_hand)
{
	/* +1 at codes 0, 3 and 31, -1 elsewhere → bits 0, 3, 31: 0x80000009. */
	int8_t c[32];
	uint32_t w = 0;

	memset(c, -1, sizeof(c));
	c[0] = c[3] = c[31] = 1;
	cr_assert_eq(dg_ref_pack_sign1(c, &w, 1, 32), DG_OK);
	cr_assert_eq(w, 0x80000009u, "0x%08x", w);
}

Test(pack, ternary_sign1_random_layout)
{
	enum { ROWS = 5, K = 64, N = ROWS * K };
	int8_t t[N], s[N];
	uint32_t wt[N / 16], ws[N / 32];

	rh_rng_seed(6);
	for (int i = 0; i < N; i++) {
		t[i] = (int8_t)rh_rng_int(-1, 1);
		s[i] = rh_rng_int(0, 1) ? 1 : -1;
	}
	cr_assert_eq(dg_ref_pack_ternary(t, wt, ROWS, K), DG_OK);
	cr_assert_eq(dg_ref_pack_sign1(s, ws, ROWS, K), DG_OK);
	for (int i = 0; i < N; i++) {
		uint32_t tb = (wt[i / 16] >> (2 * (i % 16))) & 3u;
		uint32_t sb = (ws[i / 32] >> (i % 32)) & 1u;

		cr_assert_eq(tb, t[i] == 1 ? 1u : t[i] == -1 ? 3u : 0u, "ternary %d", i);
		cr_assert_eq(sb, s[i] == 1 ? 1u : 0u, "sign1 %d", i);
	}
}

Test(pack, ternary_sign1_bad_args)
{
	int8_t c[32] = { 0 };
	uint32_t w[2] = { 0x12345678u, 0x12345678u };

	cr_assert_eq(dg_ref_pack_ternary(c, w, 1, 8), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_ternary(c, w, 1, 0), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_ternary(NULL, w, 1, 16), DG_ERR_INVALID_ARG);
	c[5] = 2; /* not a ternary code: refused, output untouched */
	cr_assert_eq(dg_ref_pack_ternary(c, w, 1, 16), DG_ERR_INVALID_ARG);
	cr_assert_eq(w[0], 0x12345678u);
	memset(c, 1, sizeof(c));
	c[7] = 0; /* 0 is not a sign1 code */
	cr_assert_eq(dg_ref_pack_sign1(c, w, 1, 32), DG_ERR_INVALID_ARG);
	cr_assert_eq(w[0], 0x12345678u);
	cr_assert_eq(dg_ref_pack_sign1(c, w, 1, 16), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_pack_sign1(c, NULL, 1, 32), DG_ERR_INVALID_ARG);
}
