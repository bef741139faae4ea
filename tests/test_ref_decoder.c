/*
 * Tests of the decoder_fwd CPU reference (runtime/ref/decoder.c): a hand
 * case, every weight × act format and several head counts against a naive
 * double loop with its own packers (values chosen so every sum is exact, so
 * float paths compare bit for bit too), bf16 output, and bad arguments.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "helpers.h"
#include "ref_helpers.h"
#include "runtime/ref/ref_ops.h"

static dg_spec dec_spec(int heads, int latent, int embd, dg_fmt weight, dg_fmt act, dg_fmt out)
{
	dg_spec s = dg_test_spec_sized(DG_OP_DECODER_FWD, heads, embd, latent);

	s.weight = weight;
	s.act = act;
	s.out = out;
	return s;
}

/* The documented storage of n values (row-major, packed along rows). */
static void *to_storage(dg_fmt f, const double *v, size_t n)
{
	size_t i;
	void *p;

	switch (f) {
	case DG_FMT_F32:
		p = rh_xmalloc(n * 4);
		for (i = 0; i < n; i++)
			((float *)p)[i] = (float)v[i];
		return p;
	case DG_FMT_BF16:
		p = rh_xmalloc(n * 2);
		for (i = 0; i < n; i++)
			((uint16_t *)p)[i] = (uint16_t)(rh_fbits((float)v[i]) >> 16);
		return p;
	case DG_FMT_TERNARY: {
		uint32_t *w = rh_xmalloc(n / 16 * 4 + 4);

		memset(w, 0, n / 16 * 4 + 4);
		for (i = 0; i < n; i++) {
			uint32_t bits = v[i] == 1 ? 1u : v[i] == -1 ? 3u : 0u;

			w[i / 16] |= bits << (2 * (i % 16));
		}
		return w;
	}
	case DG_FMT_SIGN1: {
		uint32_t *w = rh_xmalloc(n / 32 * 4 + 4);

		memset(w, 0, n / 32 * 4 + 4);
		for (i = 0; i < n; i++)
			if (v[i] == 1)
				w[i / 32] |= 1u << (i % 32);
		return w;
	}
	default: { /* one byte a code, little-endian words */
		uint8_t *b = rh_xmalloc(n);

		for (i = 0; i < n; i++)
			b[i] = (uint8_t)(int)v[i];
		return b;
	}
	}
}

/* Checks the ref against a naive loop in double for one format pair. */
static void check_pair(dg_fmt weight, dg_fmt act, int H, int L, int E, int B, int T, dg_fmt out)
{
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;
	double *y = rh_xmalloc(ny * sizeof(double)), *w = rh_xmalloc(nw * sizeof(double));
	float sa = (float)rh_rng_int(1, 1000) / 3000.0f, sw = (float)rh_rng_int(1, 1000) / 7000.0f;
	dg_spec s = dec_spec(H, L, E, weight, act, out);
	unsigned char *o = rh_xmalloc(no * 4);

	for (size_t i = 0; i < ny; i++)
		y[i] = rh_rand_value(act);
	for (size_t i = 0; i < nw; i++)
		w[i] = rh_rand_value(weight);
	void *ys = to_storage(act, y, ny), *ws = to_storage(weight, w, nw);
	dg_ref_decoder_args a = { .y = ys, .w = ws, .sa = sa, .sw = sw, .out = o, .batch = B, .time = T };

	memset(o, 0xa5, no * 4);
	cr_assert_eq(dg_ref_decoder_fwd(&s, &a), DG_OK);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int d = 0; d < E; d++) {
				double acc = 0.0;
				float sc, want;

				for (int h = 0; h < H; h++)
					for (int l = 0; l < L; l++)
						acc += y[(((size_t)b * H + h) * T + t) * L + l] *
						       w[(size_t)d * H * L + (size_t)h * L + l];
				if (dg_fmt_is_code(act) && dg_fmt_is_code(weight))
					sc = sa * sw;
				else
					sc = dg_fmt_is_code(act) ? sa : dg_fmt_is_code(weight) ? sw : 1.0f;
				want = (float)acc * sc; /* acc is exact: far below 2^24 */
				size_t i = ((size_t)b * T + t) * E + d;
				if (out == DG_FMT_F32) {
					float got;

					memcpy(&got, o + 4 * i, 4);
					cr_assert_eq(rh_fbits(got), rh_fbits(want),
						     "w=%s a=%s H=%d out[%zu] %a != %a", dg_fmt_name(weight),
						     dg_fmt_name(act), H, i, (double)got, (double)want);
				} else {
					uint16_t got;

					memcpy(&got, o + 2 * i, 2);
					cr_assert_eq(got, dg_ref_f32_to_bf16(want), "w=%s a=%s bf16 out[%zu]",
						     dg_fmt_name(weight), dg_fmt_name(act), i);
				}
			}
	free(y);
	free(w);
	free(ys);
	free(ws);
	free(o);
}

Test(decoder, hand_int8)
{
	/* H = 2, L = 4, E = 2, B = T = 1:
	 * y head 0 = 1 2 3 4, head 1 = -1 0 0 5
	 * w[0] = 1 1 1 1 | 1 1 1 1 → 10 + 4 = 14
	 * w[1] = 0 0 0 1 | 2 0 0 -1 → 4 - 2 - 5 = -3
	 * sa·sw = 0.5 · 0.25 → 1.75, -0.375 */
	const int8_t yc[8] = { 1, 2, 3, 4, -1, 0, 0, 5 };
	const int8_t wc[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 2, 0, 0, -1 };
	float out[2];
	dg_spec s = dec_spec(2, 4, 2, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_decoder_args a = { .y = yc, .w = wc, .sa = 0.5f, .sw = 0.25f, .out = out,
				  .batch = 1, .time = 1 };

	cr_assert_eq(dg_ref_decoder_fwd(&s, &a), DG_OK);
	cr_assert_eq(out[0], 1.75f);
	cr_assert_eq(out[1], -0.375f);
}

Test(decoder, every_format_against_naive)
{
	static const dg_fmt ws[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	static const dg_fmt as[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };

	rh_rng_seed(11);
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < 5; j++) {
			check_pair(ws[i], as[j], 1, 64, 12, 2, 3, DG_FMT_F32);
			check_pair(ws[i], as[j], 3, 32, 8, 1, 5, DG_FMT_F32);
			check_pair(ws[i], as[j], 4, 32, 4, 2, 2, DG_FMT_BF16);
		}
}

Test(decoder, heads_are_summed_not_averaged)
{
	/* All ones: every output is H·L·sa·sw. */
	enum { H = 4, L = 16, E = 4 };
	int8_t yc[H * L], wc[E * H * L];
	float out[E];
	dg_spec s = dec_spec(H, L, E, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_decoder_args a = { .y = yc, .w = wc, .sa = 1.0f, .sw = 1.0f, .out = out,
				  .batch = 1, .time = 1 };

	memset(yc, 1, sizeof(yc));
	memset(wc, 1, sizeof(wc));
	cr_assert_eq(dg_ref_decoder_fwd(&s, &a), DG_OK);
	for (int d = 0; d < E; d++)
		cr_assert_eq(out[d], (float)(H * L));
}

Test(decoder, bad_args)
{
	int8_t y[64] = { 0 }, w[256] = { 0 };
	float o[8];
	dg_spec s = dec_spec(2, 32, 4, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);
	dg_ref_decoder_args a = { .y = y, .w = w, .sa = 1, .sw = 1, .out = o, .batch = 1, .time = 1 };
	dg_ref_decoder_args ba;
	dg_spec bad;

	cr_assert_eq(dg_ref_decoder_fwd(&s, &a), DG_OK);
	cr_assert_eq(dg_ref_decoder_fwd(NULL, &a), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_decoder_fwd(&s, NULL), DG_ERR_INVALID_ARG);
	ba = a, ba.y = NULL;
	cr_assert_eq(dg_ref_decoder_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.w = NULL;
	cr_assert_eq(dg_ref_decoder_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.out = NULL;
	cr_assert_eq(dg_ref_decoder_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	ba = a, ba.batch = -1;
	cr_assert_eq(dg_ref_decoder_fwd(&s, &ba), DG_ERR_INVALID_ARG);
	bad = s, bad.op = DG_OP_LOWRANK_FWD;
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.out = DG_FMT_INT8;
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.latent = 6; /* i8x4 along L */
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.latent = 16, bad.weight = DG_FMT_SIGN1; /* 32 a word */
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.weight = DG_FMT_INT4;
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
	bad = s, bad.heads = 0;
	cr_assert_eq(dg_ref_decoder_fwd(&bad, &a), DG_ERR_INVALID_ARG);
}
