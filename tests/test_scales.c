/*
 * Scales a token and a channel (dragon/spec.h dg_scale_gran) without a GPU:
 *
 *   spec      ascale= / wscale= parse, print (only when not tensor, so a
 *             per-tensor spec keeps its text; always for an op whose
 *             default is not tensor), and are refused where they
 *             cannot apply (a float operand, codes out, a bad value, an op
 *             that does not read them), each message naming the key;
 *   refs      every op's reference with a scale a row / a channel against
 *             the math written out here (the operands dequantized in
 *             double, each row and channel indexed as spec.h says), so an
 *             index in the references that is off cannot pass; a vector
 *             of equal scales gives the per-tensor result bit for bit;
 *   quantize  per token over every head (max|x|/qmax), per channel
 *             (int8 max|w|/127, ternary and sign1 mean|w|);
 *   kernels   every path (wgmma, mma.sync, dp4a, SIMT float; the backward
 *             tensor-core and SIMT paths; the quantizers' rows entry)
 *             renders and NVRTC-compiles with the vector scales.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "runtime/ref/ref_ops.h"
#include "runtime/store/nvrtc.h"

static char msg[8192];
static dg_rng rng;

static dg_spec parse(const char *text)
{
	dg_spec s;
	cr_assert_eq(dg_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	return s;
}

static float unif(float lo, float hi)
{
	return lo + (hi - lo) * (float)(dg_rng_u64(&rng) >> 40) * 0x1p-24f;
}

/* n random positive scales around s. */
static float *scales(size_t n, float s)
{
	float *v = malloc(n * sizeof(float) + 4);
	cr_assert(v);
	for (size_t i = 0; i < n; i++)
		v[i] = s * unif(0.5f, 2.0f);
	return v;
}

/* Storage of n random values of f, and the same values dequantized
 * unscaled (codes as integers) into *vals. */
static void *rand_tensor(dg_fmt f, size_t n, double **vals, bool is_weight)
{
	size_t bytes = dg_fmt_row_bytes(f, (int64_t)n);
	void *p = calloc(1, bytes + 16);
	double *v = malloc(n * sizeof(double) + 8);
	cr_assert(p && v);
	dg_rng_fill(&rng, f, p, n);
	/* decode with the references' own unpackers where packed */
	for (size_t i = 0; i < n; i++) {
		switch (f) {
		case DG_FMT_F32:
			v[i] = ((const float *)p)[i];
			break;
		case DG_FMT_BF16:
			v[i] = dg_ref_bf16_to_f32(((const uint16_t *)p)[i]);
			break;
		case DG_FMT_UINT8POS:
			v[i] = ((const uint8_t *)p)[i];
			break;
		case DG_FMT_TERNARY: {
			uint32_t bits = (((const uint32_t *)p)[i / 16] >> (2 * (i % 16))) & 3u;
			v[i] = bits == 1u ? 1 : bits == 3u ? -1 : 0;
			break;
		}
		case DG_FMT_SIGN1:
			v[i] = (((const uint32_t *)p)[i / 32] >> (i % 32)) & 1u ? 1 : -1;
			break;
		default:
			v[i] = ((const int8_t *)p)[i];
			break;
		}
	}
	(void)is_weight;
	*vals = v;
	return p;
}

/* ---- spec ------------------------------------------------------------------ */

Test(scales, spec_text_and_refusals)
{
	dg_spec s = parse("op=lowrank_fwd;ascale=token;wscale=channel;out=bf16;relu=0");
	char t[DG_SPEC_TEXT_MAX];
	cr_assert_eq(s.ascale, DG_SCALE_TOKEN);
	cr_assert_eq(s.wscale, DG_SCALE_CHANNEL);
	cr_assert_eq(dg_spec_to_string(&s, t, sizeof(t)), DG_OK);
	cr_assert(strstr(t, "ascale=token;") && strstr(t, "wscale=channel"), "%s", t);
	dg_spec back = parse(t);
	cr_assert(dg_spec_equal(&s, &back), "%s does not round-trip", t);

	/* per tensor: the text it always had */
	s = parse("op=lowrank_fwd;ascale=tensor;wscale=tensor");
	cr_assert_eq(dg_spec_to_string(&s, t, sizeof(t)), DG_OK);
	cr_assert(!strstr(t, "scale"), "%s names a per-tensor scale", t);
	dg_spec d;
	dg_spec_init(&d, DG_OP_LOWRANK_FWD);
	cr_assert(dg_spec_equal(&s, &d));

	/* an op whose defaults are a scale a token and a channel
	 * (decoder_gate_bwd_ys) names both always, tensor too, so that
	 * ascale=tensor reads back as itself and not as the default */
	dg_spec_init(&d, DG_OP_DECODER_GATE_BWD_YS);
	cr_assert_eq(d.ascale, DG_SCALE_TOKEN);
	cr_assert_eq(d.wscale, DG_SCALE_CHANNEL);
	cr_assert_eq(dg_spec_to_string(&d, t, sizeof(t)), DG_OK);
	cr_assert(strstr(t, "ascale=token;") && strstr(t, "wscale=channel;"), "%s", t);
	s = parse("op=decoder_gate_bwd_ys;ascale=tensor;wscale=tensor");
	cr_assert_eq(dg_spec_to_string(&s, t, sizeof(t)), DG_OK);
	cr_assert(strstr(t, "ascale=tensor;") && strstr(t, "wscale=tensor;"), "%s", t);
	back = parse(t);
	cr_assert(back.ascale == DG_SCALE_TENSOR && back.wscale == DG_SCALE_TENSOR, "%s read back other scales", t);
	cr_assert(dg_spec_equal(&s, &back), "%s does not round-trip", t);
	cr_assert(!dg_spec_equal(&s, &d), "%s equals the default", t);

	static const struct {
		const char *text, *want;
	} bad[] = {
		{ "op=lowrank_fwd;act=bf16;ascale=token;out=bf16", "ascale=token: act=bf16 has no scale" },
		{ "op=lowrank_fwd;weight=f32;wscale=channel;out=bf16", "wscale=channel: weight=f32" },
		{ "op=lowrank_fwd;ascale=token;relu=0;out=uint8pos", "out=uint8pos: output codes need per-tensor" },
		{ "op=lowrank_fwd;wscale=channel;out=int8", "out=int8: output codes need per-tensor" },
		{ "op=lowrank_fwd;ascale=channel", "ascale=channel: must be tensor or token" },
		{ "op=lowrank_fwd;wscale=token", "wscale=token: must be tensor or channel" },
		{ "op=pack_i8x4;ascale=token", "ascale" },
		{ "op=lowrank_grad_input;ascale=token", "ascale" },
		{ "op=quantize_act;wscale=channel", "wscale" },
		{ "op=decoder_fwd;act=f32;ascale=token", "ascale=token: act=f32 has no scale" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		msg[0] = '\0';
		cr_assert_eq(dg_spec_parse(bad[i].text, &d, msg, sizeof(msg)), DG_ERR_INVALID_SPEC,
			     "%s was accepted", bad[i].text);
		cr_assert(strstr(msg, bad[i].want), "%s: message \"%s\" lacks \"%s\"", bad[i].text, msg,
			  bad[i].want);
	}
}

/* ---- the forward references -------------------------------------------------- */

struct lr {
	const char *text;
	int B, T;
};

/* lowrank_fwd with a scale a row of x and a channel of w, against the
 * dequantized double math (relu(Σ_e sa[row]·x · sw[ch]·w − thr)). */
static void check_lowrank(const struct lr *c)
{
	dg_spec s = parse(c->text);
	const int H = s.heads, Hin = s.in_heads, E = s.embd, L = s.latent, B = c->B, T = c->T;
	double *xv, *wv;
	void *x = rand_tensor(s.act, (size_t)B * Hin * T * E, &xv, false);
	void *w = rand_tensor(s.weight, (size_t)H * L * E, &wv, true);
	bool ac = dg_fmt_is_code(s.act), wc = dg_fmt_is_code(s.weight);
	bool av = s.ascale == DG_SCALE_TOKEN, wvv = s.wscale == DG_SCALE_CHANNEL;
	float sa = 0.01f, sw = 0.03f;
	float *sav = scales((size_t)B * Hin * T, sa), *swv = scales((size_t)H * L, sw);
	size_t no = (size_t)B * H * T * L;
	float *out = malloc(no * 4 + 4);
	dg_spec fs = s;
	fs.out = DG_FMT_F32;
	dg_ref_lowrank_args a = { .x = x, .w = w, .sa = sa, .sw = sw, .sa_v = sav, .sw_v = swv,
				  .out = out, .batch = B, .time = T };
	cr_assert_eq(dg_ref_lowrank_fwd(&fs, &a), DG_OK, "%s", c->text);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int t = 0; t < T; t++) {
				int hin = Hin == 1 ? 0 : h;
				size_t xrow = (size_t)(b * Hin + hin) * T + t;
				double ra = ac ? (av ? sav[xrow] : sa) : 1.0;
				for (int l = 0; l < L; l++) {
					double rw = wc ? (wvv ? swv[h * L + l] : sw) : 1.0, y = 0, mag = 0;
					for (int e = 0; e < E; e++) {
						double p = xv[xrow * E + e] * wv[((size_t)h * L + l) * E + e];
						y += p;
						mag += fabs(p);
					}
					y *= ra * rw;
					mag *= ra * rw;
					if (s.relu) {
						y -= s.relu_thr;
						y = y > 0 ? y : 0;
					}
					float got = out[(((size_t)b * H + h) * T + t) * L + l];
					cr_assert(fabs(got - y) <= 1e-5 * mag + 1e-30, "%s: out[%d,%d,%d,%d] = %.9g, want %.9g",
						  c->text, b, h, t, l, (double)got, y);
				}
			}
	/* relu_mask from the same codes and scales keeps grad exactly where
	 * the forward's y − thr is > 0 */
	if (s.relu) {
		dg_spec ms = s;
		ms.op = DG_OP_RELU_MASK;
		dg_spec_normalize(&ms);
		float *g = malloc(no * 4 + 4), *go = malloc(no * 4 + 4);
		for (size_t i = 0; i < no; i++)
			g[i] = unif(-1, 1);
		dg_ref_call rc = { .in = { x, w, g }, .scale = { sa, sw }, .scale_v = { sav, swv },
				   .out = go, .b = B, .t = T };
		cr_assert_eq(dg_ref_run(&ms, &rc), DG_OK);
		for (size_t i = 0; i < no; i++)
			cr_assert_eq(go[i], out[i] > 0.0f ? g[i] : 0.0f, "%s: relu_mask[%zu]", c->text, i);
		free(g);
		free(go);
	}
	/* a vector of equal scales is the per-tensor spec, bit for bit */
	if (ac && wc) {
		dg_spec ts = fs;
		ts.ascale = DG_SCALE_TENSOR;
		ts.wscale = DG_SCALE_TENSOR;
		float *o2 = malloc(no * 4 + 4);
		for (int i = 0; i < B * Hin * T; i++)
			sav[i] = sa;
		for (int i = 0; i < H * L; i++)
			swv[i] = sw;
		cr_assert_eq(dg_ref_lowrank_fwd(&fs, &a), DG_OK);
		dg_ref_lowrank_args a2 = a;
		a2.out = o2;
		cr_assert_eq(dg_ref_lowrank_fwd(&ts, &a2), DG_OK);
		cr_assert(memcmp(out, o2, no * 4) == 0, "%s: equal scales differ from the tensor scale",
			  c->text);
		free(o2);
	}
	/* the vectors are required */
	if (av && ac)
		a.sa_v = NULL;
	else
		a.sw_v = NULL;
	if ((av && ac) || (wvv && wc))
		cr_assert_eq(dg_ref_lowrank_fwd(&fs, &a), DG_ERR_INVALID_ARG, "%s without its vector",
			     c->text);
	free(x);
	free(w);
	free(xv);
	free(wv);
	free(sav);
	free(swv);
	free(out);
}

Test(scales, lowrank_and_relu_mask_refs)
{
	dg_rng_seed(&rng, 11);
	static const struct lr cases[] = {
		{ "op=lowrank_fwd;heads=2;embd=32;latent=12;ascale=token;wscale=channel;out=f32;relu=0", 2, 5 },
		{ "op=lowrank_fwd;heads=3;in_heads=3;embd=32;latent=8;ascale=token;wscale=channel;out=f32;relu=0.25", 2, 3 },
		{ "op=lowrank_fwd;heads=2;embd=32;latent=8;weight=ternary;ascale=token;out=f32", 1, 4 },
		{ "op=lowrank_fwd;heads=2;embd=64;latent=8;weight=sign1;act=uint8pos;wscale=channel;out=f32;relu=0", 2, 2 },
		{ "op=lowrank_fwd;heads=2;embd=16;latent=8;weight=bf16;act=int8;ascale=token;out=f32", 2, 3 },
		{ "op=lowrank_fwd;heads=2;in_heads=2;embd=16;latent=8;weight=int8;act=f32;wscale=channel;out=f32", 2, 3 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_lowrank(&cases[i]);
}

Test(scales, decoder_ref)
{
	dg_rng_seed(&rng, 12);
	static const char *const texts[] = {
		"op=decoder_fwd;heads=3;embd=8;latent=16;act=uint8pos;ascale=token;wscale=channel;out=f32",
		"op=decoder_fwd;heads=2;embd=8;latent=32;weight=ternary;act=int8;ascale=token;out=f32",
		"op=decoder_fwd;heads=2;embd=8;latent=16;weight=int8;act=bf16;wscale=channel;out=f32",
	};
	for (size_t k = 0; k < sizeof(texts) / sizeof(texts[0]); k++) {
		dg_spec s = parse(texts[k]);
		const int H = s.heads, E = s.embd, L = s.latent, B = 2, T = 3;
		double *yv, *wv;
		void *y = rand_tensor(s.act, (size_t)B * H * T * L, &yv, false);
		void *w = rand_tensor(s.weight, (size_t)E * H * L, &wv, true);
		bool ac = dg_fmt_is_code(s.act), wc = dg_fmt_is_code(s.weight);
		float sa = 0.002f, sw = 0.05f, *sav = scales((size_t)B * T, sa), *swv = scales((size_t)E, sw);
		float *out = malloc((size_t)B * T * E * 4);
		dg_ref_decoder_args a = { .y = y, .w = w, .sa = sa, .sw = sw, .sa_v = sav, .sw_v = swv,
					  .out = out, .batch = B, .time = T };
		cr_assert_eq(dg_ref_decoder_fwd(&s, &a), DG_OK, "%s", texts[k]);
		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++)
				for (int d = 0; d < E; d++) {
					double acc = 0, mag = 0;
					for (int h = 0; h < H; h++)
						for (int l = 0; l < L; l++) {
							double p = yv[(((size_t)b * H + h) * T + t) * L + l] *
								   wv[(size_t)d * H * L + h * L + l];
							acc += p;
							mag += fabs(p);
						}
					double r = (ac ? (s.ascale == DG_SCALE_TOKEN ? sav[b * T + t] : sa) : 1.0) *
						   (wc ? (s.wscale == DG_SCALE_CHANNEL ? swv[d] : sw) : 1.0);
					float got = out[((size_t)b * T + t) * E + d];
					cr_assert(fabs(got - acc * r) <= 1e-5 * mag * r + 1e-30,
						  "%s: out[%d,%d,%d] = %.9g, want %.9g", texts[k], b, t, d,
						  (double)got, acc * r);
				}
		free(y);
		free(w);
		free(yv);
		free(wv);
		free(sav);
		free(swv);
		free(out);
	}
}

/* ---- the gradient GEMMs' references ---------------------------------------------- */

Test(scales, backward_refs)
{
	dg_rng_seed(&rng, 13);
	const int H = 2, E = 32, L = 16, B = 2, T = 3;
	for (int hin = 1; hin <= H; hin += H - 1) {
		char t1[256], t2[256];
		snprintf(t1, sizeof(t1), "op=lowrank_grad_input;heads=%d;in_heads=%d;embd=%d;latent=%d;wscale=channel",
			 H, hin, E, L);
		snprintf(t2, sizeof(t2), "op=lowrank_grad_weight;heads=%d;in_heads=%d;embd=%d;latent=%d;ascale=token",
			 H, hin, E, L);
		dg_spec gi = parse(t1), gw = parse(t2);
		double *wv, *xv;
		void *w = rand_tensor(DG_FMT_INT8, (size_t)H * L * E, &wv, true);
		void *x = rand_tensor(DG_FMT_INT8, (size_t)B * hin * T * E, &xv, false);
		size_t ng = (size_t)B * H * T * L;
		float *g = malloc(ng * 4), *swv = scales((size_t)H * L, 0.02f),
		      *sav = scales((size_t)B * hin * T, 0.01f);
		for (size_t i = 0; i < ng; i++)
			g[i] = unif(-1, 1);
		float *gx = malloc((size_t)B * hin * T * E * 4), *gwo = malloc((size_t)H * L * E * 4);
		dg_ref_call c1 = { .in = { g, w }, .scale = { 0, 1 }, .scale_v = { NULL, swv }, .out = gx,
				   .b = B, .t = T };
		dg_ref_call c2 = { .in = { g, x }, .scale = { 0, 1 }, .scale_v = { NULL, sav }, .out = gwo,
				   .b = B, .t = T };
		cr_assert_eq(dg_ref_run(&gi, &c1), DG_OK);
		cr_assert_eq(dg_ref_run(&gw, &c2), DG_OK);
		for (int b = 0; b < B; b++)
			for (int i = 0; i < hin; i++)
				for (int t = 0; t < T; t++)
					for (int e = 0; e < E; e++) {
						double want = 0;
						for (int h = 0; h < H; h++) {
							if (hin != 1 && h != i)
								continue;
							for (int l = 0; l < L; l++)
								want += g[(((size_t)b * H + h) * T + t) * L + l] *
									(double)swv[h * L + l] * wv[((size_t)h * L + l) * E + e];
						}
						float got = gx[(((size_t)b * hin + i) * T + t) * E + e];
						cr_assert(fabs(got - want) <= 1e-6 * (fabs(want) + 1), "grad_x %.9g want %.9g",
							  (double)got, want);
					}
		for (int h = 0; h < H; h++)
			for (int l = 0; l < L; l++)
				for (int e = 0; e < E; e++) {
					double want = 0;
					int i = hin == 1 ? 0 : h;
					for (int b = 0; b < B; b++)
						for (int t = 0; t < T; t++) {
							size_t row = (size_t)(b * hin + i) * T + t;
							want += g[(((size_t)b * H + h) * T + t) * L + l] * (double)sav[row] *
								xv[row * E + e];
						}
					float got = gwo[((size_t)h * L + l) * E + e];
					cr_assert(fabs(got - want) <= 1e-6 * (fabs(want) + 1), "grad_w %.9g want %.9g",
						  (double)got, want);
				}
		/* without the vector: refused */
		c1.scale_v[1] = NULL;
		cr_assert_eq(dg_ref_run(&gi, &c1), DG_ERR_INVALID_ARG);
		free(w);
		free(x);
		free(wv);
		free(xv);
		free(g);
		free(swv);
		free(sav);
		free(gx);
		free(gwo);
	}
	/* the decoder's: sw a channel d, sa a token b·T + t */
	dg_spec di = parse("op=decoder_grad_input;heads=2;embd=8;latent=16;wscale=channel");
	dg_spec dw = parse("op=decoder_grad_weight;heads=2;embd=8;latent=16;act=uint8pos;ascale=token");
	const int DE = 8, DL = 16;
	double *wv, *yv;
	void *w = rand_tensor(DG_FMT_INT8, (size_t)DE * H * DL, &wv, true);
	void *y = rand_tensor(DG_FMT_UINT8POS, (size_t)B * H * T * DL, &yv, false);
	float *g = malloc((size_t)B * T * DE * 4), *swv = scales(DE, 0.02f), *sav = scales((size_t)B * T, 0.004f);
	for (int i = 0; i < B * T * DE; i++)
		g[i] = unif(-1, 1);
	float *gy = malloc((size_t)B * H * T * DL * 4), *gwo = malloc((size_t)DE * H * DL * 4);
	dg_ref_call c1 = { .in = { g, w }, .scale_v = { NULL, swv }, .out = gy, .b = B, .t = T };
	dg_ref_call c2 = { .in = { g, y }, .scale_v = { NULL, sav }, .out = gwo, .b = B, .t = T };
	cr_assert_eq(dg_ref_run(&di, &c1), DG_OK);
	cr_assert_eq(dg_ref_run(&dw, &c2), DG_OK);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int t = 0; t < T; t++)
				for (int l = 0; l < DL; l++) {
					double want = 0;
					for (int d = 0; d < DE; d++)
						want += g[((size_t)b * T + t) * DE + d] * (double)swv[d] *
							wv[(size_t)d * H * DL + h * DL + l];
					float got = gy[(((size_t)b * H + h) * T + t) * DL + l];
					cr_assert(fabs(got - want) <= 1e-6 * (fabs(want) + 1));
				}
	for (int d = 0; d < DE; d++)
		for (int k = 0; k < H * DL; k++) {
			double want = 0;
			for (int b = 0; b < B; b++)
				for (int t = 0; t < T; t++)
					want += g[((size_t)b * T + t) * DE + d] * (double)sav[b * T + t] *
						yv[(((size_t)b * H + k / DL) * T + t) * DL + k % DL];
			float got = gwo[(size_t)d * H * DL + k];
			cr_assert(fabs(got - want) <= 1e-6 * (fabs(want) + 1));
		}
	free(w);
	free(y);
	free(wv);
	free(yv);
	free(g);
	free(swv);
	free(sav);
	free(gy);
	free(gwo);
}

/* ---- the quantizers ---------------------------------------------------------------- */

Test(scales, quantize_per_token_and_channel)
{
	dg_rng_seed(&rng, 14);
	/* (B, G, T, C): a token over its G heads */
	const size_t B = 2, G = 3, T = 4, C = 40, n = B * G * T * C;
	float *x = malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		x[i] = unif(-1, 1) * (float)(1 + i % 7);
	static const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	for (size_t k = 0; k < 3; k++) {
		int8_t *codes = malloc(n);
		float sc[8];
		cr_assert_eq(dg_ref_quantize_act_rows(DG_FMT_F32, acts[k], x, B, G, T, C, codes, sc), DG_OK);
		const int qmax = dg_ref_qmax(acts[k]);
		for (size_t b = 0; b < B; b++)
			for (size_t t = 0; t < T; t++) {
				float m = 0;
				for (size_t g = 0; g < G; g++)
					for (size_t c = 0; c < C; c++)
						m = fmaxf(m, fabsf(x[((b * G + g) * T + t) * C + c]));
				float s = sc[b * T + t];
				cr_assert_eq(s, m / (float)qmax, "token (%zu, %zu): scale %g, max %g", b, t,
					     (double)s, (double)m);
				int top = 0;
				for (size_t g = 0; g < G; g++)
					for (size_t c = 0; c < C; c++) {
						size_t i = ((b * G + g) * T + t) * C + c;
						int q = acts[k] == DG_FMT_UINT8POS ? ((uint8_t *)codes)[i] : codes[i];
						float want = x[i] / s;
						if (acts[k] == DG_FMT_UINT8POS && want < 0)
							want = 0;
						cr_assert(fabsf((float)q - want) <= 0.5f + 1e-4f, "code %d of %g", q,
							  (double)want);
						top = abs(q) > top ? abs(q) : top;
					}
				/* absmax: the largest value takes the top code, none clips */
				if (acts[k] != DG_FMT_UINT8POS)
					cr_assert_eq(top, qmax);
			}
		free(codes);
	}
	/* a token of zeros: scale 0, codes 0 */
	float z[8] = { 0 };
	int8_t zc[8];
	float zs = 1;
	cr_assert_eq(dg_ref_quantize_act_rows(DG_FMT_F32, DG_FMT_INT8, z, 1, 1, 1, 8, zc, &zs), DG_OK);
	cr_assert(zs == 0.0f && zc[0] == 0 && zc[7] == 0);

	/* per channel: rows of cols */
	const size_t R = 5, K = 48;
	float *w = malloc(R * K * 4);
	for (size_t i = 0; i < R * K; i++)
		w[i] = unif(-1, 1) * (float)(1 + i / K);
	int8_t *wc = malloc(R * K);
	float ws[5];
	cr_assert_eq(dg_ref_quantize_weight_rows(DG_FMT_INT8, w, R, K, wc, ws), DG_OK);
	for (size_t r = 0; r < R; r++) {
		float m = 0;
		int top = 0;
		for (size_t c = 0; c < K; c++) {
			m = fmaxf(m, fabsf(w[r * K + c]));
			top = abs(wc[r * K + c]) > top ? abs(wc[r * K + c]) : top;
		}
		cr_assert_eq(ws[r], m / 127.0f);
		cr_assert_eq(top, 127, "row %zu: no code reaches 127", r);
	}
	cr_assert_eq(dg_ref_quantize_weight_rows(DG_FMT_TERNARY, w, R, K, wc, ws), DG_OK);
	for (size_t r = 0; r < R; r++) {
		double sum = 0;
		for (size_t c = 0; c < K; c++)
			sum += fabs((double)w[r * K + c]);
		cr_assert_eq(ws[r], (float)(sum / (double)K));
		for (size_t c = 0; c < K; c++) {
			float v = w[r * K + c];
			cr_assert_eq(wc[r * K + c], fabsf(v) < ws[r] ? 0 : (v > 0 ? 1 : -1));
		}
	}
	cr_assert_eq(dg_ref_quantize_weight_rows(DG_FMT_BF16, w, R, K, wc, ws), DG_ERR_INVALID_ARG);
	free(w);
	free(wc);
	free(x);
}

/* ---- every kernel path compiles --------------------------------------------------- */

Test(scales, every_path_compiles)
{
	static const struct {
		const char *text, *marker; /* a string the path's source holds */
		bool sm90a;
	} cases[] = {
		{ "op=lowrank_fwd;arch=sm_90a;ascale=token;wscale=channel;out=bf16;relu=0", "wgmma.mma_async", true },
		{ "op=lowrank_fwd;arch=sm_90a;in_heads=4;ascale=token;out=f32", "wgmma.mma_async", true },
		{ "op=lowrank_fwd;ascale=token;wscale=channel;out=bf16;relu=0", "mma.sync.aligned.m16n8k32", false },
		{ "op=lowrank_fwd;in_heads=4;weight=ternary;ascale=token;out=f32", "mma.sync.aligned.m16n8k32", false },
		{ "op=lowrank_fwd;ascale=token;wscale=channel;out=bf16;tile=64x64x16/2x2/2", "dp4a.", false },
		{ "op=lowrank_fwd;weight=bf16;ascale=token;out=bf16", "fmaf(", false },
		{ "op=relu_mask;ascale=token;wscale=channel;in_heads=4", "mma.sync.aligned.m16n8k32", false },
		{ "op=decoder_fwd;act=uint8pos;ascale=token;wscale=channel", "sa_m", false },
		{ "op=decoder_fwd;act=uint8pos;ascale=token;tile=64x64x16/2x2/2", "sa_m", false },
		{ "op=lowrank_grad_input;wscale=channel", "dg_b_scale", false },
		{ "op=lowrank_grad_input;wscale=channel;in_heads=4;tile=64x64x8/2x2/2", "rbs[s]", false },
		{ "op=lowrank_grad_weight;ascale=token;in_heads=4", "dg_b_scale", false },
		{ "op=lowrank_grad_weight;ascale=token;tile=64x64x8/2x2/2", "rbs[s]", false },
		{ "op=decoder_grad_input;weight=ternary;wscale=channel", "dg_b_scale", false },
		{ "op=decoder_grad_weight;act=uint8pos;ascale=token", "dg_b_scale", false },
		{ "op=decoder_grad_weight;act=uint8pos;ascale=token;tile=64x64x8/2x2/2", "rbs[s]", false },
		{ "op=quantize_act;ascale=token;src=bf16", "dg_quantize_act_rows", false },
		{ "op=quantize_act;ascale=token;act=uint8pos", "dg_quantize_act_rows", false },
		{ "op=quantize_weight;wscale=channel;weight=ternary", "dg_quantize_weight_rows", false },
		{ "op=quantize_weight;wscale=channel;weight=int8;src=bf16", "dg_quantize_weight_rows", false },
	};
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s = parse(cases[i].text);
		dg_source *src = NULL;
		dg__nvrtc_target t;
		dg__nvrtc_result res;
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", cases[i].text,
			     dg_codegen_errmsg(cg));
		cr_assert(strstr(src->text, cases[i].marker), "%s: the source lacks %s", cases[i].text,
			  cases[i].marker);
		cr_assert_eq(dg__nvrtc_target_for(90, cases[i].sm90a, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, msg, sizeof(msg)), DG_OK, "%s: %s",
			     cases[i].text, msg);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	dg_codegen_destroy(cg);
}
