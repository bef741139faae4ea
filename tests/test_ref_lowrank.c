/*
 * Tests of the lowrank_fwd CPU reference (runtime/ref/lowrank.c): hand
 * cases for every storage format and epilogue, then every weight × act
 * format against a naive double loop with its own decoders and packers,
 * in_heads = 1 against a replicated input, the relu threshold, and bad
 * arguments.
 *
 * The reference is the contract the GPU kernel is compared against, so it
 * must be right on its own: the hand cases are worked in the comments, and
 * the naive loop has its own decoders and packers and sums in double.
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

/* A lowrank_fwd spec: every field not named here zero, ReLU off, sm_90. */
static dg_spec lowrank_spec(int heads, int in_heads, int embd, int latent,
			    dg_fmt weight, dg_fmt act, dg_fmt out)
{
	return (dg_spec){ .op = DG_OP_LOWRANK_FWD, .heads = heads, .in_heads = in_heads, .embd = embd,
			  .latent = latent, .weight = weight, .act = act, .out = out, .src = DG_FMT_F32,
			  .relu = false, .arch = 90 };
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

/* One row of hand_int8_code_outs: the output format and scale, the relu,
 * and the two codes y = 0.75, -1.25 must come out as. */
struct code_out_case {
	const char *what;
	dg_fmt out;
	bool relu;
	float relu_thr, so;
	int want[2];
};

/* Code i of a two-code output buffer of format f. */
static int code_at(const void *buf, dg_fmt f, int i)
{
	if (f == DG_FMT_BF16)
		return ((const uint16_t *)buf)[i];
	if (f == DG_FMT_UINT8POS)
		return ((const uint8_t *)buf)[i];
	return ((const int8_t *)buf)[i];
}

Test(lowrank, hand_int8_code_outs)
{
	static const struct code_out_case cases[] = {
		/* int8 codes with so = 0.25: 0.75/0.25 = 3, -1.25/0.25 = -5. */
		{ "int8", DG_FMT_INT8, false, 0.0f, 0.25f, { 3, -5 } },
		/* uint8pos after relu(y - 0.25) = 0.5, 0 with so = 0.125: 4, 0. */
		{ "uint8pos relu", DG_FMT_UINT8POS, true, 0.25f, 0.125f, { 4, 0 } },
		/* uint8pos without relu clamps at 0 (y = 0.75, -1.25; so = 0.125):
		 * 6, 0 — a negative y never wraps into a large code. */
		{ "uint8pos", DG_FMT_UINT8POS, false, 0.25f, 0.125f, { 6, 0 } },
		/* bf16 without relu: 0.75 = 0x3f40, -1.25 = 0xbfa0. */
		{ "bf16", DG_FMT_BF16, false, 0.25f, 0.125f, { 0x3f40, 0xbfa0 } },
		/* so <= 0: code 0. */
		{ "int8 so 0", DG_FMT_INT8, false, 0.25f, 0.0f, { 0, 0 } },
	};
	int32_t x, w[2];
	uint16_t buf[2]; /* two codes of the widest format, bf16 */

	hand_int8_setup(&x, w);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct code_out_case *c = &cases[i];
		dg_spec s = lowrank_spec(1, 1, 4, 2, DG_FMT_INT8, DG_FMT_INT8, c->out);
		dg_ref_lowrank_args a = { .x = &x, .w = w, .sa = 0.5f, .sw = 0.25f,
					  .so = c->so, .out = buf, .batch = 1, .time = 1 };

		s.relu = c->relu;
		s.relu_thr = c->relu_thr;
		memset(buf, 0x55, sizeof(buf)); /* no expected code: a code left unwritten fails */
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK, "%s", c->what);
		for (int k = 0; k < 2; k++)
			cr_assert_eq(code_at(buf, c->out, k), c->want[k], "%s: code %d is %d, want %d", c->what, k,
				     code_at(buf, c->out, k), c->want[k]);
	}
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
	/* the formats, x, w and scales of each run, and its y */
	const struct {
		const char *what;
		dg_fmt act, weight;
		const void *x, *w;
		float sa, sw, want;
	} runs[] = {
		{ "f32 x int8 w", DG_FMT_F32, DG_FMT_INT8, xf, &w8, 7.0f, 0.5f, -2.0f },
		{ "bf16 x int8 w", DG_FMT_BF16, DG_FMT_INT8, xh, &w8, 7.0f, 0.5f, -2.0f },
		/* sw unused: the weight is float */
		{ "int8 x f32 w", DG_FMT_INT8, DG_FMT_F32, &x8, wf, 0.25f, 9.0f, -2.0f },
		{ "f32 x f32 w", DG_FMT_F32, DG_FMT_F32, xf, wf, 0.25f, 9.0f, -4.0f },
	};
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		s.act = runs[i].act;
		s.weight = runs[i].weight;
		a.x = runs[i].x;
		a.w = runs[i].w;
		a.sa = runs[i].sa;
		a.sw = runs[i].sw;
		out = NAN;
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK, "%s", runs[i].what);
		cr_assert_eq(out, runs[i].want, "%s: y %g, want %g", runs[i].what, out, runs[i].want);
	}
}

/* --- lowrank_fwd: every format against a naive double loop ---------------- */

/* The storage of n values (one row-major tensor) in format f. */
static void *to_storage(dg_fmt f, const double *v, size_t n)
{
	void *p;

	switch (f) {
	case DG_FMT_F32:
		p = rh_xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			((float *)p)[i] = (float)v[i];
		return p;
	case DG_FMT_BF16:
		p = rh_xmalloc(n * sizeof(uint16_t));
		for (size_t i = 0; i < n; i++)
			((uint16_t *)p)[i] = (uint16_t)(rh_fbits((float)v[i]) >> 16); /* exact */
		return p;
	case DG_FMT_TERNARY:
	case DG_FMT_SIGN1: {
		int8_t *c = rh_xmalloc(n);

		for (size_t i = 0; i < n; i++)
			c[i] = (int8_t)v[i];
		p = rh_xmalloc(n / 4 + 4); /* 2 bits a ternary code at most */
		if (f == DG_FMT_TERNARY)
			pack_ternary_naive(c, p, n);
		else
			pack_sign1_naive(c, p, n);
		free(c);
		return p;
	}
	default: { /* i8x4 words of bytes, uint8pos unsigned */
		uint8_t *b = rh_xmalloc(n);

		for (size_t i = 0; i < n; i++)
			b[i] = (uint8_t)(int)v[i];
		p = rh_xmalloc(n);
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
	float *acc;    /* the exact sum of each y, (B,H,T,L) */
	float s;       /* the scale y = acc · s */
};

static void lr_case_make(struct lr_case *c, dg_fmt weight, dg_fmt act, int Hin)
{
	size_t nx, nw, ny;

	*c = (struct lr_case){ .H = 3, .Hin = Hin, .E = 64, .L = 7, .B = 2, .T = 3, .weight = weight, .act = act };
	/* one statement each: the draws' order is the seed's */
	c->sa = (float)rh_rng_int(1, 1000) / 3000.0f;
	c->sw = (float)rh_rng_int(1, 1000) / 7000.0f;
	nx = (size_t)c->B * c->Hin * c->T * c->E;
	nw = (size_t)c->H * c->L * c->E;
	ny = (size_t)c->B * c->H * c->T * c->L;
	c->x = rh_xmalloc(nx * sizeof(double));
	c->w = rh_xmalloc(nw * sizeof(double));
	c->y = rh_xmalloc(ny * sizeof(float));
	c->acc = rh_xmalloc(ny * sizeof(float));
	for (size_t i = 0; i < nx; i++)
		c->x[i] = rh_rand_value(act);
	for (size_t i = 0; i < nw; i++)
		c->w[i] = rh_rand_value(weight);
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
					if (dg_fmt_is_code(act) && dg_fmt_is_code(weight))
						s = c->sa * c->sw;
					else if (dg_fmt_is_code(act))
						s = c->sa;
					else if (dg_fmt_is_code(weight))
						s = c->sw;
					else
						s = 1.0f;
					y = (float)acc * s;
					c->y[(((size_t)b * c->H + h) * c->T + t) * c->L + l] = y;
					c->acc[(((size_t)b * c->H + h) * c->T + t) * c->L + l] = (float)acc;
					c->s = s;
				}
}

static void lr_case_free(struct lr_case *c)
{
	free(c->x);
	free(c->w);
	free(c->xs);
	free(c->ws);
	free(c->y);
	free(c->acc);
}

/* The epilogue, written independently: relu(y - thr), then the code. */
static float ep_relu(float y, bool relu, float thr)
{
	if (!relu)
		return y;
	y = y - thr;
	return y > 0.0f ? y : 0.0f;
}

/* The code of one output as ref.h states it, from the exact sum: v =
 * fmaf(acc, s·r, relu ? -thr·r : 0) with r = 1/so (each a rounded float),
 * v = max(v, 0) with relu, then rint and clamp; 0 when so <= 0. (y / so in
 * float would round twice: at an exact tie such as 62.5 it can differ.) */
static int ep_code(float acc, float s, bool relu, float thr, float so, int lo, int hi)
{
	double q;

	if (so <= 0.0f)
		return 0;
	float r = 1.0f / so;
	float v = fmaf(acc, s * r, relu ? -thr * r : 0.0f);
	if (relu && v < 0.0f)
		v = 0.0f;
	q = nearbyint((double)v); /* ties to even */
	return q < lo ? lo : q > hi ? hi : (int)q;
}

static void check_case(struct lr_case *c, dg_fmt out, bool relu, float thr)
{
	size_t ny = (size_t)c->B * c->H * c->T * c->L;
	size_t osz = out == DG_FMT_F32 ? 4 : out == DG_FMT_BF16 ? 2 : 1;
	unsigned char *o = rh_xmalloc(ny * osz);
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
			cr_assert_eq(rh_fbits(got), rh_fbits(y), "w=%s a=%s Hin=%d relu=%d: out[%zu] %a != %a",
				     dg_fmt_name(c->weight), dg_fmt_name(c->act), c->Hin, relu, i,
				     (double)got, (double)y);
			break;
		}
		case DG_FMT_BF16: {
			uint16_t got;

			memcpy(&got, o + 2 * i, 2);
			cr_assert_eq(got, dg_ref_f32_to_bf16(y), "w=%s a=%s bf16 out[%zu]",
				     dg_fmt_name(c->weight), dg_fmt_name(c->act), i);
			break;
		}
		case DG_FMT_INT8:
			cr_assert_eq((int)(int8_t)o[i], ep_code(c->acc[i], c->s, relu, thr, so, -127, 127),
				     "w=%s a=%s int8 out[%zu] y=%a", dg_fmt_name(c->weight),
				     dg_fmt_name(c->act), i, (double)y);
			break;
		default:
			cr_assert_eq((int)o[i], ep_code(c->acc[i], c->s, relu, thr, so, 0, 255),
				     "w=%s a=%s uint8pos out[%zu] y=%a", dg_fmt_name(c->weight),
				     dg_fmt_name(c->act), i, (double)y);
			break;
		}
	}
	cr_assert_eq(absum, want_absum, "w=%s a=%s absum %.17g != %.17g", dg_fmt_name(c->weight),
		     dg_fmt_name(c->act), absum, want_absum);
	free(o);
}

static const dg_fmt all_weights[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt all_acts[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };

Test(lowrank, every_format_against_naive)
{
	rh_rng_seed(7);
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

	rh_rng_seed(8);
	for (int i = 0; i < B * T * E; i++)
		x1[i] = (int8_t)rh_rng_int(-127, 127);
	for (int i = 0; i < H * L * E; i++)
		wc[i] = rh_rng_int(0, 1) ? 1 : -1;
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

	rh_rng_seed(9);
	for (int i = 0; i < E; i++)
		xc[i] = (int8_t)rh_rng_int(-5, 5);
	for (int i = 0; i < L * E; i++)
		wc[i] = (int8_t)rh_rng_int(-5, 5);
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
	/* copies of a and s, each with one thing the reference refuses */
	static const char *const args_why[] = { "x NULL", "w NULL", "out NULL", "batch -1", "time -2" };
	dg_ref_lowrank_args ba[] = { a, a, a, a, a };
	static const char *const spec_why[] = {
		"op quantize_act",
		"in_heads 3 (neither 1 nor heads)",
		"heads 0",
		"embd 6 (i8x4 needs a multiple of 4)",
		"embd 8 ternary (16 a word)",
		"embd 16 sign1 (32 a word)",
		"weight int4",
		"act ternary",
		"out int4",
		"out past the formats",
	};
	dg_spec bad[] = { s, s, s, s, s, s, s, s, s, s };

	ba[0].x = NULL;
	ba[1].w = NULL;
	ba[2].out = NULL;
	ba[3].batch = -1;
	ba[4].time = -2;
	bad[0].op = DG_OP_QUANTIZE_ACT;
	bad[1].in_heads = 3;
	bad[2].heads = 0;
	bad[3].embd = 6;
	bad[4].embd = 8, bad[4].weight = DG_FMT_TERNARY;
	bad[5].embd = 16, bad[5].weight = DG_FMT_SIGN1;
	bad[6].weight = DG_FMT_INT4;
	bad[7].act = DG_FMT_TERNARY;
	bad[8].out = DG_FMT_INT4;
	bad[9].out = DG_FMT__COUNT;

	cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
	cr_assert_eq(dg_ref_lowrank_fwd(NULL, &a), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_lowrank_fwd(&s, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(sizeof(ba) / sizeof(ba[0]), sizeof(args_why) / sizeof(args_why[0]));
	for (size_t i = 0; i < sizeof(ba) / sizeof(ba[0]); i++)
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &ba[i]), DG_ERR_INVALID_ARG, "args with %s accepted", args_why[i]);
	cr_assert_eq(sizeof(bad) / sizeof(bad[0]), sizeof(spec_why) / sizeof(spec_why[0]));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(dg_ref_lowrank_fwd(&bad[i], &a), DG_ERR_INVALID_ARG, "spec with %s accepted", spec_why[i]);
}

/* --- relu_mask ------------------------------------------------------------ */

/* grad_out = grad where the forward's y - thr > 0: checked against the
 * forward's own f32 output (out > 0 exactly where the mask is set), on
 * every format pair, with grad and grad_out aliased in one of the runs. */
Test(relu_mask, equals_the_forward_mask)
{
	rh_rng_seed(21);
	for (int wi = 0; wi < 5; wi++)
		for (int ai = 0; ai < 5; ai++) {
			struct lr_case c;
			size_t ny;

			lr_case_make(&c, all_weights[wi], all_acts[ai], 1);
			ny = (size_t)c.B * c.H * c.T * c.L;
			for (int k = 0; k < 2; k++) {
				float thr = k ? 0.25f : 0.0f;
				float *fwd = rh_xmalloc(ny * 4), *g = rh_xmalloc(ny * 4), *go = rh_xmalloc(ny * 4);
				dg_spec s = lowrank_spec(c.H, c.Hin, c.E, c.L, c.weight, c.act, DG_FMT_F32);
				dg_ref_lowrank_args a = { .x = c.xs, .w = c.ws, .sa = c.sa, .sw = c.sw,
							  .out = fwd, .batch = c.B, .time = c.T };
				size_t set = 0;

				s.relu = true;
				s.relu_thr = thr;
				cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
				for (size_t i = 0; i < ny; i++)
					g[i] = (float)rh_rng_int(1, 1000) / 10.0f;
				s.op = DG_OP_RELU_MASK;
				cr_assert_eq(dg_ref_relu_mask(&s, c.xs, c.ws, c.sa, c.sw, g, go, c.B, c.T), DG_OK);
				for (size_t i = 0; i < ny; i++) {
					cr_assert_eq(go[i], fwd[i] > 0.0f ? g[i] : 0.0f, "w=%s a=%s [%zu]",
						     dg_fmt_name(c.weight), dg_fmt_name(c.act), i);
					set += fwd[i] > 0.0f;
				}
				/* aliased: the same result in place */
				cr_assert_eq(dg_ref_relu_mask(&s, c.xs, c.ws, c.sa, c.sw, g, g, c.B, c.T), DG_OK);
				cr_assert_eq(memcmp(g, go, ny * 4), 0);
				/* at thr 0 both kinds of element occur (the test can tell a mask
				 * of all ones or all zeros) */
				if (k == 0)
					cr_assert(set > 0 && set < ny, "mask trivially %zu of %zu", set, ny);
				free(fwd);
				free(g);
				free(go);
			}
			lr_case_free(&c);
		}
}

Test(relu_mask, bad_args)
{
	int32_t x[16] = { 0 }, w[64] = { 0 };
	float g[16] = { 0 }, go[16];
	dg_spec s = lowrank_spec(2, 1, 32, 2, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32);

	s.op = DG_OP_RELU_MASK;
	s.relu = true;
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, g, go, 1, 1), DG_OK);
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, NULL, go, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, g, NULL, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_relu_mask(&s, NULL, w, 1, 1, g, go, 1, 1), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, g, go, -1, 1), DG_ERR_INVALID_ARG);
	s.relu = false; /* the mask needs the threshold */
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, g, go, 1, 1), DG_ERR_INVALID_ARG);
	s.relu = true;
	s.op = DG_OP_LOWRANK_FWD;
	cr_assert_eq(dg_ref_relu_mask(&s, x, w, 1, 1, g, go, 1, 1), DG_ERR_INVALID_ARG);
}
