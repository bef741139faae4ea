/*
 * Tests of the CPU references (runtime/ref.c, runtime/ref_lowrank.c): the
 * contracts the GPU kernels are compared against, so they must be right on
 * their own. Hand-computed cases (worked in the comments) pin the layouts
 * and the rounding; random property tests check the references against
 * independent naive implementations written here (their own decoders and
 * packers, double sums). Random data comes from a fixed-seed generator, so
 * every run sees the same inputs.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"

/* --- helpers ------------------------------------------------------------- */

static const char *const fmt_names[] = {
#define X(e, s) s,
	DG_FMT_LIST(X)
#undef X
};

static uint32_t fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bitsf(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
	rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

static uint32_t rng_u32(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* Uniform integer in [lo, hi]. */
static int rng_int(int lo, int hi)
{
	return lo + (int)(rng_u32() % (uint32_t)(hi - lo + 1));
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	cr_assert_not_null(p, "out of memory");
	return p;
}

/* Little-endian i8x4 words from bytes (n a multiple of 4). */
static void pack_bytes(const uint8_t *b, int32_t *w, size_t n)
{
	for (size_t i = 0; i < n / 4; i++) {
		uint32_t u = (uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
			     (uint32_t)b[4 * i + 2] << 16 |
			     (uint32_t)b[4 * i + 3] << 24;

		memcpy(&w[i], &u, sizeof(u));
	}
}

/* The documented ternary / sign1 layouts, written independently of ref.c. */
static void pack_ternary_naive(const int8_t *c, uint32_t *w, size_t n)
{
	memset(w, 0, n / 16 * sizeof(*w));
	for (size_t i = 0; i < n; i++) {
		uint32_t bits = c[i] == 1 ? 1u : c[i] == -1 ? 3u : 0u;

		w[i / 16] |= bits << (2 * (i % 16));
	}
}

static void pack_sign1_naive(const int8_t *c, uint32_t *w, size_t n)
{
	memset(w, 0, n / 32 * sizeof(*w));
	for (size_t i = 0; i < n; i++)
		if (c[i] == 1)
			w[i / 32] |= 1u << (i % 32);
}

static dg_spec lowrank_spec(int heads, int in_heads, int embd, int latent,
			    dg_fmt weight, dg_fmt act, dg_fmt out)
{
	dg_spec s;

	memset(&s, 0, sizeof(s));
	s.op = DG_OP_LOWRANK_FWD;
	s.heads = heads;
	s.in_heads = in_heads;
	s.embd = embd;
	s.latent = latent;
	s.weight = weight;
	s.act = act;
	s.out = out;
	s.src = DG_FMT_F32;
	s.relu = false;
	s.arch = 90;
	return s;
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

		cr_assert_eq(fbits(f), h << 16);
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
	rng_seed(1);
	for (int i = 0; i < 200000; i++) {
		uint32_t u = rng_u32();
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

	rng_seed(2);
	for (int i = 0; i < N; i++) {
		xb[i] = dg_ref_f32_to_bf16((float)rng_int(-100000, 100000) / 997.0f);
		xf[i] = dg_ref_bf16_to_f32(xb[i]);
	}
	for (dg_fmt act = DG_FMT_INT8; act <= DG_FMT_UINT8POS; act++) {
		if (act == DG_FMT_TERNARY || act == DG_FMT_SIGN1)
			continue;
		cr_assert_eq(dg_ref_quantize_act(DG_FMT_BF16, act, xb, N, cb, &sb), DG_OK);
		cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, act, xf, N, cf, &sf), DG_OK);
		cr_assert_eq(sb, sf, "%s", fmt_names[act]);
		cr_assert_eq(memcmp(cb, cf, N), 0, "%s", fmt_names[act]);
	}
}

Test(quantize_act, random_codes_in_range)
{
	enum { N = 4096 };
	static const dg_fmt acts[3] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	float *x = xmalloc(N * sizeof(*x));
	uint8_t *c = xmalloc(N);

	rng_seed(3);
	for (int rep = 0; rep < 6; rep++) {
		double sum = 0.0;

		for (int i = 0; i < N; i++) {
			/* heavy-tailed: some values far past the mean */
			x[i] = (float)rng_int(-1000, 1000) / 100.0f *
			       (rng_int(0, 50) == 0 ? 40.0f : 1.0f);
			sum += fabs((double)x[i]);
		}
		for (int a = 0; a < 3; a++) {
			dg_fmt act = acts[a];
			int qmax = dg_ref_qmax(act);
			int lo = act == DG_FMT_UINT8POS ? 0 : -qmax;
			float s;

			cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, act, x, N, c, &s), DG_OK);
			cr_assert_eq(s, (float)(2.0 * sum / ((double)N * qmax)), "%s", fmt_names[act]);
			for (int i = 0; i < N; i++) {
				int code = act == DG_FMT_UINT8POS ? (int)c[i] : (int)(int8_t)c[i];
				double q = (double)(x[i] / s);

				cr_assert(code >= lo && code <= qmax, "%s code %d", fmt_names[act], code);
				if (act == DG_FMT_UINT8POS && x[i] <= 0.0f)
					cr_assert_eq(code, 0, "uint8pos of %g", (double)x[i]);
				if (q > lo && q < qmax) /* not clamped: nearest */
					cr_assert(fabs(code - q) <= 0.5, "%s %g → %d", fmt_names[act], q, code);
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
	float *w = xmalloc(N * sizeof(*w));
	int8_t *c = xmalloc(N);
	double sum = 0.0;
	float s;

	rng_seed(4);
	for (int i = 0; i < N; i++) {
		w[i] = (float)rng_int(-30000, 30000) / 7919.0f;
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

	rng_seed(5);
	for (size_t rows = 1; rows <= 3; rows++)
		for (int ki = 0; ki < 3; ki++)
			for (int ci = 0; ci < 3; ci++) {
				int K = ks[ki], C = cs[ci];
				size_t n = rows * (size_t)K * (size_t)C;
				int8_t *codes = xmalloc(n), *back = xmalloc(n);
				int32_t *packed = xmalloc(n);

				for (size_t i = 0; i < n; i++)
					codes[i] = (int8_t)rng_int(-128, 127);
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

	rng_seed(6);
	for (int i = 0; i < N; i++) {
		t[i] = (int8_t)rng_int(-1, 1);
		s[i] = rng_int(0, 1) ? 1 : -1;
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

/* --- lowrank_fwd: hand cases --------------------------------------------- */

/* H = Hin = 1, E = 4, L = 2, B = T = 1, int8 × int8:
 *   x = 1 2 3 4;  w[l=0] = 1 0 -1 2 → Σ = 1 - 3 + 8 = 6
 *                 w[l=1] = -1 -1 -1 -1 → Σ = -10
 *   sa·sw = 0.5·0.25 = 0.125 → y = 0.75, -1.25. */
static void hand_int8_setup(int32_t *x, int32_t w[2])
{
	const uint8_t xb[4] = { 1, 2, 3, 4 };
	const int8_t wc[8] = { 1, 0, -1, 2, -1, -1, -1, -1 };

	pack_bytes(xb, x, 4);
	pack_bytes((const uint8_t *)wc, w, 8);
}

Test(lowrank, hand_int8_f32_out)
{
	int32_t x, w[2];
	float out[2];
	double absum = -1;
	dg_spec s = lowrank_spec(1, 1, 4, 2, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = &x, .w = w, .sa = 0.5f, .sw = 0.25f,
				  .out = out, .out_absum = &absum, .batch = 1, .time = 1 };

	hand_int8_setup(&x, w);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out[0], 0.75f);
	cr_assert_eq(out[1], -1.25f);
	cr_assert_eq(absum, 2.0);
	/* relu(y - 0.25): 0.5, 0; Σ|out| = 0.5. */
	s.relu = true;
	s.relu_thr = 0.25f;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out[0], 0.5f);
	cr_assert_eq(out[1], 0.0f);
	cr_assert_eq(absum, 0.5);
}

Test(lowrank, hand_int8_code_outs)
{
	int32_t x, w[2];
	int8_t o8[2];
	uint8_t u8[2];
	uint16_t ob[2];
	dg_spec s = lowrank_spec(1, 1, 4, 2, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_INT8);
	dg_ref_lowrank_args a = { .x = &x, .w = w, .sa = 0.5f, .sw = 0.25f,
				  .so = 0.25f, .out = o8, .batch = 1, .time = 1 };

	hand_int8_setup(&x, w);
	/* int8 codes with so = 0.25: 0.75/0.25 = 3, -1.25/0.25 = -5. */
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(o8[0], 3);
	cr_assert_eq(o8[1], -5);
	/* uint8pos after relu(y - 0.25) = 0.5, 0 with so = 0.125: 4, 0. */
	s.out = DG_FMT_UINT8POS;
	s.relu = true;
	s.relu_thr = 0.25f;
	a.so = 0.125f;
	a.out = u8;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(u8[0], 4);
	cr_assert_eq(u8[1], 0);
	/* uint8pos without relu clamps at 0 (y = 0.75, -1.25; so = 0.125):
	 * 6, 0 — a negative y never wraps into a large code. */
	s.relu = false;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(u8[0], 6);
	cr_assert_eq(u8[1], 0);
	/* bf16 without relu: 0.75 = 0x3f40, -1.25 = 0xbfa0. */
	s.out = DG_FMT_BF16;
	s.relu = false;
	a.out = ob;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(ob[0], 0x3f40);
	cr_assert_eq(ob[1], 0xbfa0);
	/* so <= 0: code 0. */
	s.out = DG_FMT_INT8;
	a.out = o8;
	a.so = 0.0f;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(o8[0], 0);
	cr_assert_eq(o8[1], 0);
}

Test(lowrank, hand_uint8pos_lanes_are_unsigned)
{
	/* x (uint8pos) = 200 255 0 1, w = 1 -1 2 127:
	 * 200 - 255 + 0 + 127 = 72. Read as signed bytes, 255 would be -1
	 * and the sum 200 + 1 + 127 = 328. */
	const uint8_t xb[4] = { 200, 255, 0, 1 };
	const int8_t wc[4] = { 1, -1, 2, 127 };
	int32_t x, w;
	float out;
	dg_spec s = lowrank_spec(1, 1, 4, 1, DG_FMT_INT8, DG_FMT_UINT8POS, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = &x, .w = &w, .sa = 1.0f, .sw = 1.0f,
				  .out = &out, .batch = 1, .time = 1 };

	pack_bytes(xb, &x, 4);
	pack_bytes((const uint8_t *)wc, &w, 4);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, 72.0f);
}

Test(lowrank, hand_ternary_and_sign1_weights)
{
	/* E = 32, L = 1, x = 1, 2, ..., 32 (int8).
	 * ternary w: +1 at e=0, -1 at e=1, +1 at e=3, -1 at e=31, else 0:
	 *   1 - 2 + 4 - 32 = -29.
	 * sign1 w: +1 at e=0 and e=3, else -1:
	 *   (1 + 4) - (528 - 1 - 4) = -518   (Σ 1..32 = 528). */
	uint8_t xb[32];
	int32_t x[8];
	uint32_t wt[2], ws = 0x00000009u;
	float out;
	dg_spec s = lowrank_spec(1, 1, 32, 1, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = x, .w = wt, .sa = 1.0f, .sw = 1.0f,
				  .out = &out, .batch = 1, .time = 1 };

	for (int e = 0; e < 32; e++)
		xb[e] = (uint8_t)(e + 1);
	pack_bytes(xb, x, 32);
	/* e=0: 01, e=1: 11 (bits 2-3), e=3: 01 (bits 6-7) → 0x4d; e=31 is
	 * code 15 of word 1: 11 at bits 30-31. */
	wt[0] = 0x0000004du;
	wt[1] = 0xc0000000u;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -29.0f);
	s.weight = DG_FMT_SIGN1;
	a.w = &ws;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -518.0f);
}

Test(lowrank, hand_float_and_mixed)
{
	/* x = 0.5 -1 2 0, w = 2 3 -1 5 → Σ = 1 - 3 - 2 + 0 = -4.
	 * f32 × int8 (sw = 0.5): y = -2. bf16 × int8: the same values are
	 * exact in bf16. int8 × f32 with x codes 1 -2 4 0 and sa = 0.25,
	 * w = 2 3 -1 5: Σ = 2 - 6 - 4 = -8, y = -2. f32 × f32: y = Σ = -4. */
	const float xf[4] = { 0.5f, -1.0f, 2.0f, 0.0f };
	const float wf[4] = { 2.0f, 3.0f, -1.0f, 5.0f };
	const int8_t wc[4] = { 2, 3, -1, 5 };
	const int8_t xc[4] = { 1, -2, 4, 0 };
	uint16_t xh[4];
	int32_t w8, x8;
	float out;
	dg_spec s = lowrank_spec(1, 1, 4, 1, DG_FMT_INT8, DG_FMT_F32, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = xf, .w = &w8, .sa = 7.0f, .sw = 0.5f,
				  .out = &out, .batch = 1, .time = 1 };

	pack_bytes((const uint8_t *)wc, &w8, 4);
	pack_bytes((const uint8_t *)xc, &x8, 4);
	for (int i = 0; i < 4; i++)
		xh[i] = dg_ref_f32_to_bf16(xf[i]);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -2.0f);
	s.act = DG_FMT_BF16;
	a.x = xh;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -2.0f);
	s.act = DG_FMT_INT8;
	s.weight = DG_FMT_F32;
	a.x = &x8;
	a.w = wf;
	a.sa = 0.25f;
	a.sw = 9.0f; /* unused: the weight is float */
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -2.0f);
	s.act = DG_FMT_F32;
	a.x = xf;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(out, -4.0f);
}

/* --- lowrank_fwd: every format against a naive double loop ---------------- */

static bool is_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_INT4 || f == DG_FMT_UINT8POS ||
	       f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

/* A random value of format f: integer codes in range, float values k/8
 * (|k| <= 64, exact in bf16), so that every float-path sum is exact too. */
static double rand_value(dg_fmt f)
{
	switch (f) {
	case DG_FMT_INT8:
		return rng_int(-127, 127);
	case DG_FMT_INT4:
		return rng_int(-7, 7);
	case DG_FMT_UINT8POS:
		return rng_int(0, 255);
	case DG_FMT_TERNARY:
		return rng_int(-1, 1);
	case DG_FMT_SIGN1:
		return rng_int(0, 1) ? 1 : -1;
	default:
		return rng_int(-64, 64) / 8.0;
	}
}

/* The storage of n values (one row-major tensor) in format f. */
static void *to_storage(dg_fmt f, const double *v, size_t n)
{
	void *p;

	switch (f) {
	case DG_FMT_F32:
		p = xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			((float *)p)[i] = (float)v[i];
		return p;
	case DG_FMT_BF16:
		p = xmalloc(n * sizeof(uint16_t));
		for (size_t i = 0; i < n; i++)
			((uint16_t *)p)[i] = (uint16_t)(fbits((float)v[i]) >> 16); /* exact */
		return p;
	case DG_FMT_TERNARY:
	case DG_FMT_SIGN1: {
		int8_t *c = xmalloc(n);

		for (size_t i = 0; i < n; i++)
			c[i] = (int8_t)v[i];
		p = xmalloc(n / 4 + 4); /* 2 bits a ternary code at most */
		if (f == DG_FMT_TERNARY)
			pack_ternary_naive(c, p, n);
		else
			pack_sign1_naive(c, p, n);
		free(c);
		return p;
	}
	default: { /* i8x4 words of bytes, uint8pos unsigned */
		uint8_t *b = xmalloc(n);

		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int)v[i];
		p = xmalloc(n);
		pack_bytes(b, p, n);
		free(b);
		return p;
	}
	}
}

struct lr_case {
	int H, Hin, E, L, B, T;
	dg_fmt weight, act;
	float sa, sw;
	double *x, *w; /* values, (B,Hin,T,E) and (H,L,E) */
	void *xs, *ws; /* their storage */
	float *y;      /* expected pre-relu y, (B,H,T,L) */
};

static void lr_case_make(struct lr_case *c, dg_fmt weight, dg_fmt act, int Hin)
{
	size_t nx, nw, ny;

	c->H = 3;
	c->Hin = Hin;
	c->E = 64;
	c->L = 7;
	c->B = 2;
	c->T = 3;
	c->weight = weight;
	c->act = act;
	c->sa = (float)rng_int(1, 1000) / 3000.0f;
	c->sw = (float)rng_int(1, 1000) / 7000.0f;
	nx = (size_t)c->B * c->Hin * c->T * c->E;
	nw = (size_t)c->H * c->L * c->E;
	ny = (size_t)c->B * c->H * c->T * c->L;
	c->x = xmalloc(nx * sizeof(double));
	c->w = xmalloc(nw * sizeof(double));
	c->y = xmalloc(ny * sizeof(float));
	for (size_t i = 0; i < nx; i++)
		c->x[i] = rand_value(act);
	for (size_t i = 0; i < nw; i++)
		c->w[i] = rand_value(weight);
	c->xs = to_storage(act, c->x, nx);
	c->ws = to_storage(weight, c->w, nw);

	/* Naive: the double sum is exact (integers, or multiples of 1/64 far
	 * below 2^24), so rounding it to float gives the exact sum; then one
	 * float multiply by the format's scale. */
	for (int b = 0; b < c->B; b++)
		for (int h = 0; h < c->H; h++)
			for (int t = 0; t < c->T; t++)
				for (int l = 0; l < c->L; l++) {
					int hin = c->Hin == 1 ? 0 : h;
					double acc = 0.0;
					float s, y;

					for (int e = 0; e < c->E; e++)
						acc += c->x[(((size_t)b * c->Hin + hin) * c->T + t) * c->E + e] *
						       c->w[((size_t)h * c->L + l) * c->E + e];
					if (is_code(act) && is_code(weight))
						s = c->sa * c->sw;
					else if (is_code(act))
						s = c->sa;
					else if (is_code(weight))
						s = c->sw;
					else
						s = 1.0f;
					y = (float)acc * s;
					c->y[(((size_t)b * c->H + h) * c->T + t) * c->L + l] = y;
				}
}

static void lr_case_free(struct lr_case *c)
{
	free(c->x);
	free(c->w);
	free(c->xs);
	free(c->ws);
	free(c->y);
}

/* The epilogue, written independently: relu(y - thr), then the code. */
static float ep_relu(float y, bool relu, float thr)
{
	if (!relu)
		return y;
	y = y - thr;
	return y > 0.0f ? y : 0.0f;
}

static int ep_code(float y, float so, int lo, int hi)
{
	double q;

	if (so <= 0.0f)
		return 0;
	q = nearbyint((double)(y / so)); /* y/so in float, then ties to even */
	return q < lo ? lo : q > hi ? hi : (int)q;
}

static void check_case(struct lr_case *c, dg_fmt out, bool relu, float thr)
{
	size_t ny = (size_t)c->B * c->H * c->T * c->L;
	size_t osz = out == DG_FMT_F32 ? 4 : out == DG_FMT_BF16 ? 2 : 1;
	unsigned char *o = xmalloc(ny * osz);
	dg_spec s = lowrank_spec(c->H, c->Hin, c->E, c->L, c->weight, c->act, out);
	const float so = 0.0371f;
	double absum = -1.0, want_absum = 0.0;
	dg_ref_lowrank_args a = { .x = c->xs, .w = c->ws, .sa = c->sa, .sw = c->sw,
				  .so = so, .out = o, .out_absum = &absum,
				  .batch = c->B, .time = c->T };

	s.relu = relu;
	s.relu_thr = thr;
	memset(o, 0xa5, ny * osz);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	for (size_t i = 0; i < ny; i++) {
		float y = ep_relu(c->y[i], relu, thr);

		want_absum += fabs((double)y);
		switch (out) {
		case DG_FMT_F32: {
			float got;

			memcpy(&got, o + 4 * i, 4);
			cr_assert_eq(fbits(got), fbits(y), "w=%s a=%s Hin=%d relu=%d: out[%zu] %a != %a",
				     fmt_names[c->weight], fmt_names[c->act], c->Hin, relu, i,
				     (double)got, (double)y);
			break;
		}
		case DG_FMT_BF16: {
			uint16_t got;

			memcpy(&got, o + 2 * i, 2);
			cr_assert_eq(got, dg_ref_f32_to_bf16(y), "w=%s a=%s bf16 out[%zu]",
				     fmt_names[c->weight], fmt_names[c->act], i);
			break;
		}
		case DG_FMT_INT8:
			cr_assert_eq((int)(int8_t)o[i], ep_code(y, so, -127, 127),
				     "w=%s a=%s int8 out[%zu] y=%a", fmt_names[c->weight],
				     fmt_names[c->act], i, (double)y);
			break;
		default:
			cr_assert_eq((int)o[i], ep_code(y, so, 0, 255),
				     "w=%s a=%s uint8pos out[%zu] y=%a", fmt_names[c->weight],
				     fmt_names[c->act], i, (double)y);
			break;
		}
	}
	cr_assert_eq(absum, want_absum, "w=%s a=%s absum %.17g != %.17g", fmt_names[c->weight],
		     fmt_names[c->act], absum, want_absum);
	free(o);
}

static const dg_fmt all_weights[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt all_acts[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };

Test(lowrank, every_format_against_naive)
{
	rng_seed(7);
	for (int wi = 0; wi < 5; wi++)
		for (int ai = 0; ai < 5; ai++)
			for (int hin = 1; hin <= 3; hin += 2) {
				struct lr_case c;

				lr_case_make(&c, all_weights[wi], all_acts[ai], hin);
				check_case(&c, DG_FMT_F32, false, 0.0f);
				check_case(&c, DG_FMT_F32, true, 0.0f);
				check_case(&c, DG_FMT_F32, true, 0.25f);
				check_case(&c, DG_FMT_BF16, false, 0.0f);
				check_case(&c, DG_FMT_BF16, true, 0.25f);
				check_case(&c, DG_FMT_INT8, false, 0.0f);
				check_case(&c, DG_FMT_INT8, true, 0.25f);
				check_case(&c, DG_FMT_UINT8POS, true, 0.0f);
				check_case(&c, DG_FMT_UINT8POS, true, 0.25f);
				lr_case_free(&c);
			}
}

Test(lowrank, in_heads_one_equals_replicated_input)
{
	/* Hin = 1 reads the same x for every head: it must equal Hin = H with
	 * x copied into every input head. */
	enum { H = 3, E = 32, L = 5, B = 2, T = 4 };
	int8_t x1[B * T * E], xh[B * H * T * E];
	int8_t wc[H * L * E];
	int32_t x1s[B * T * E / 4], xhs[B * H * T * E / 4];
	uint32_t ws[H * L * E / 32];
	float o1[B * H * T * L], oh[B * H * T * L];
	dg_spec s = lowrank_spec(H, 1, E, L, DG_FMT_SIGN1, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_lowrank_args a = { .w = ws, .sa = 0.01f, .sw = 0.3f, .batch = B, .time = T };

	rng_seed(8);
	for (int i = 0; i < B * T * E; i++)
		x1[i] = (int8_t)rng_int(-127, 127);
	for (int i = 0; i < H * L * E; i++)
		wc[i] = rng_int(0, 1) ? 1 : -1;
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			memcpy(&xh[((b * H + h) * T) * E], &x1[(b * T) * E], T * E);
	pack_bytes((const uint8_t *)x1, x1s, sizeof(x1));
	pack_bytes((const uint8_t *)xh, xhs, sizeof(xh));
	pack_sign1_naive(wc, ws, H * L * E);
	a.x = x1s;
	a.out = o1;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	s.in_heads = H;
	a.x = xhs;
	a.out = oh;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(memcmp(o1, oh, sizeof(o1)), 0);
	/* ... and the heads differ (the weights do), so the test would see a
	 * kernel that always read head 0's weights. */
	cr_assert_neq(memcmp(o1, o1 + T * L, T * L * sizeof(float)), 0);
}

Test(lowrank, relu_threshold_semantics)
{
	/* relu(y - thr) on int8 × int8 with unit scales: y is the exact dot
	 * product; every output is max(y - thr, 0) and never negative. */
	enum { E = 16, L = 9 };
	int8_t xc[E], wc[L * E];
	int32_t xs[E / 4], wsv[L * E / 4];
	float o[L];
	dg_spec s = lowrank_spec(1, 1, E, L, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = xs, .w = wsv, .sa = 1.0f, .sw = 1.0f, .out = o,
				  .batch = 1, .time = 1 };

	rng_seed(9);
	for (int i = 0; i < E; i++)
		xc[i] = (int8_t)rng_int(-5, 5);
	for (int i = 0; i < L * E; i++)
		wc[i] = (int8_t)rng_int(-5, 5);
	pack_bytes((const uint8_t *)xc, xs, E);
	pack_bytes((const uint8_t *)wc, wsv, L * E);
	s.relu = true;
	for (float thr = -20.0f; thr <= 20.0f; thr += 2.5f) {
		s.relu_thr = thr;
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
		for (int l = 0; l < L; l++) {
			int y = 0;

			for (int e = 0; e < E; e++)
				y += xc[e] * wc[l * E + e];
			cr_assert_eq(o[l], (float)y - thr > 0 ? (float)y - thr : 0.0f,
				     "thr %g l %d y %d", (double)thr, l, y);
			cr_assert(!signbit(o[l]));
		}
	}
}

Test(lowrank, bad_args)
{
	int32_t x[16] = { 0 }, w[64] = { 0 };
	float o[16];
	dg_spec s = lowrank_spec(2, 1, 32, 2, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_lowrank_args a = { .x = x, .w = w, .sa = 1, .sw = 1, .out = o, .batch = 1, .time = 1 };
	dg_spec bad;
	dg_ref_lowrank_args ba;

	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(dg_ref_lowrank_fwd(NULL, &a), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, NULL), DG_ERR_INVALID_ARG);
	ba = a, ba.x = NULL;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.w = NULL;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.out = NULL;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.batch = -1;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.time = -2;
	cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	bad = s, bad.op = DG_OP_QUANTIZE_ACT;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.in_heads = 3; /* neither 1 nor heads */
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.heads = 0;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.embd = 6; /* i8x4 needs a multiple of 4 */
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.embd = 8, bad.weight = DG_FMT_TERNARY; /* 16 a word */
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.embd = 16, bad.weight = DG_FMT_SIGN1; /* 32 a word */
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.weight = DG_FMT_INT4;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.act = DG_FMT_TERNARY;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.out = DG_FMT_INT4;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.out = DG_FMT__COUNT;
	cr_assert_eq(dg_ref_lowrank_fwd(&bad, &a), DG_ERR_INVALID_ARG);
}
