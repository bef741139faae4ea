/*
 * dequantize's CPU reference (runtime/ref/dequantize.c), exact:
 *   - hand-worked cases, their arithmetic in comments: a product bf16
 *     holds, one it rounds half to even (127 × 3 = 381 → 380), f32 keeping
 *     381, uint8pos 255 not read as -1, int8 -128, a zero scale;
 *   - a scale a row reads scale[r] for every code of row r;
 *   - against a loop of code × s (f32), then rounded once, over random
 *     codes of every format, both outputs, both granularities;
 *   - dg_ref_run (the harness's door) is the same call;
 *   - formats and granularities it does not take are refused.
 */
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/ref.h"
#include "dragon/rng.h"
#include "runtime/ref/ref_ops.h"

Test(ref_dequantize, hand_worked)
{
	/* int8, one scale 3: 127·3 = 381 lies halfway between the bf16
	 * neighbours 380 and 382 (spacing 2 in [256, 512)); to even: 380
	 * (0x43BE, mantissa 0111110). -128·3 = -384 = -1.5·2^8 (0xC3C0).
	 * 1·3 = 3 (0x4040). 0 → 0. */
	const int8_t c8[4] = { 127, -128, 1, 0 };
	const float s3 = 3.0f;
	uint16_t b[4];
	float f[4];
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TENSOR, c8, 1, 4, &s3, b), DG_OK);
	cr_assert_eq(b[0], 0x43BE, "127·3: 0x%04x", b[0]);
	cr_assert_eq(b[1], 0xC3C0, "-128·3: 0x%04x", b[1]);
	cr_assert_eq(b[2], 0x4040);
	cr_assert_eq(b[3], 0x0000);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, c8, 2, 2, &s3, f), DG_OK);
	cr_assert_eq(f[0], 381.0f); /* f32 keeps the product */
	cr_assert_eq(f[1], -384.0f);
	/* uint8pos 255 is 255, not -1: 255·0.5 = 127.5 (bf16 0x42FF) */
	const uint8_t cu[2] = { 255, 2 };
	const float half = 0.5f;
	cr_assert_eq(dg_ref_dequantize(DG_FMT_UINT8POS, DG_FMT_BF16, DG_SCALE_TENSOR, cu, 1, 2, &half, b), DG_OK);
	cr_assert_eq(b[0], 0x42FF, "255·0.5: 0x%04x", b[0]);
	cr_assert_eq(b[1], 0x3F80); /* 1.0 */
	/* a scale a row: rows {3, -2} with scales {0.5, 4}: 1.5, -1; 12, -8 */
	const int8_t cr[4] = { 3, -2, 3, -2 };
	const float sr[2] = { 0.5f, 4.0f };
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TOKEN, cr, 2, 2, sr, f), DG_OK);
	cr_assert_eq(f[0], 1.5f);
	cr_assert_eq(f[1], -1.0f);
	cr_assert_eq(f[2], 12.0f);
	cr_assert_eq(f[3], -8.0f);
	/* the same codes with the tensor's one scale read only sr[0] */
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, cr, 2, 2, sr, f), DG_OK);
	cr_assert_eq(f[2], 1.5f);
	/* a zero scale: zeros */
	const float z = 0.0f;
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TENSOR, c8, 1, 4, &z, b), DG_OK);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b[i] & 0x7fff, 0);
}

Test(ref_dequantize, random_codes_every_format)
{
	enum { R = 7, C = 37 };
	static const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	dg_rng g;
	dg_rng_seed(&g, 5);
	uint8_t codes[R * C];
	float sc[R], f[R * C], want[R * C];
	uint16_t b[R * C];
	for (int a = 0; a < 3; a++) {
		dg_rng_fill(&g, DG_FMT_UINT8POS, codes, R * C); /* any byte */
		for (int r = 0; r < R; r++)
			sc[r] = dg_rng_uniform(&g, 1e-3f, 0.05f);
		for (int gr = 0; gr < 2; gr++) {
			dg_scale_gran gran = gr ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
			for (int i = 0; i < R * C; i++) {
				float code = acts[a] == DG_FMT_UINT8POS ? (float)codes[i] : (float)(int8_t)codes[i];
				want[i] = code * sc[gr ? i / C : 0];
			}
			cr_assert_eq(dg_ref_dequantize(acts[a], DG_FMT_F32, gran, codes, R, C, sc, f), DG_OK);
			cr_assert_eq(memcmp(f, want, sizeof(f)), 0, "%s f32 %s", dg_fmt_name(acts[a]),
				     dg_scale_name(gran));
			cr_assert_eq(dg_ref_dequantize(acts[a], DG_FMT_BF16, gran, codes, R, C, sc, b), DG_OK);
			for (int i = 0; i < R * C; i++)
				cr_assert_eq(b[i], dg_f32_to_bf16(want[i]), "%s bf16 %s [%d]", dg_fmt_name(acts[a]),
					     dg_scale_name(gran), i);
			/* dg_ref_run: the op table's call, (R, C) from r and n */
			dg_spec s;
			dg_spec_init(&s, DG_OP_DEQUANTIZE);
			s.act = acts[a];
			s.out = DG_FMT_BF16;
			s.ascale = gran;
			uint16_t rb[R * C];
			dg_ref_call c;
			memset(&c, 0, sizeof(c));
			c.in[0] = codes;
			c.scale[0] = sc[0];
			c.scale_v[0] = gr ? sc : NULL;
			c.out = rb;
			c.r = R;
			c.n = R * C;
			cr_assert_eq(dg_ref_run(&s, &c), DG_OK);
			cr_assert_eq(memcmp(rb, b, sizeof(rb)), 0, "dg_ref_run %s %s", dg_fmt_name(acts[a]),
				     dg_scale_name(gran));
			if (gr) { /* a scale a row without them */
				c.scale_v[0] = NULL;
				cr_assert_eq(dg_ref_run(&s, &c), DG_ERR_INVALID_ARG);
			}
		}
	}
}

Test(ref_dequantize, refuses_what_it_does_not_take)
{
	const int8_t c[1] = { 1 };
	const float s = 1.0f;
	float o[1];
	cr_assert_eq(dg_ref_dequantize(DG_FMT_BF16, DG_FMT_F32, DG_SCALE_TENSOR, c, 1, 1, &s, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_TERNARY, DG_FMT_F32, DG_SCALE_TENSOR, c, 1, 1, &s, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_INT8, DG_SCALE_TENSOR, c, 1, 1, &s, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_CHANNEL, c, 1, 1, &s, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, c, 1, 1, NULL, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, c, -1, 1, &s, o), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_dequantize(DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, NULL, 0, 0, NULL, NULL), DG_OK);
}
