/*
 * Scales a token and a channel on the GPU: every integer op and quantizer
 * with ascale=token and / or wscale=channel, on each of its paths (the
 * wgmma and mma.sync tensor cores, dp4a, SIMT float; the backward tensor-
 * core and SIMT paths; the quantizers' rows entry), against the CPU
 * reference through the tuner's harness (autotune/harness.c: random codes
 * and random positive scales a row / a channel between half and one and a
 * half times the tensor's, so a wrong row or channel shows; the output prefilled with
 * 0xff). The judgement is the op's check kind: integer forward paths and
 * the quantizers bit for bit, float paths within atol + rtol·|ref|,
 * gradients by their norm error (bf16 tensor cores).
 *
 * Shapes: B = 1, T = rows (odd ones for the ragged edges) at a reduced
 * latent, and the BDH shape (H 4, E 256, L 8192) at a few rows. Skips
 * without a device; fails instead with DRAGON_REQUIRE_GPU=1.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/sweep_int.h"
#include "gpu_helpers.h"
#include "runtime/ops/ops_int.h"
#include "runtime/ref/ref_ops.h"

static void check_spec(dg_device *dev, const char *text, int rows)
{
	char msg[1024], why[1024];
	dg_spec s;
	dg__at_case *c = NULL;
	dg__at_verdict v;

	cr_assert_eq(dg_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	cr_assert_eq(dg__at_case_create(dev, &s, rows, true, 0x5ca1e5u + (uint64_t)rows, &c), DG_OK,
		     "%s rows %d: %s", text, rows, dg_device_errmsg(dev));
	cr_assert_eq(dg__at_case_check(c, &s, &v, why, sizeof(why)), DG_OK, "%s rows %d: %s", text,
		     rows, dg_device_errmsg(dev));
	cr_assert_eq(v, DG__AT_RIGHT, "%s rows %d: %s: %s", text, rows,
		     v == DG__AT_REFUSED ? "refused" : "wrong", why);
	dg__at_case_destroy(c);
}

static void check_all(const char *const *texts, size_t n, const int *rows, size_t nrows)
{
	dg_device *dev = gh_open();
	for (size_t i = 0; i < n; i++)
		for (size_t r = 0; r < nrows; r++)
			check_spec(dev, texts[i], rows[r]);
	gh_close(dev);
}

#define SMALL "heads=4;embd=256;latent=512;"

Test(gpu_scales, forward)
{
	static const char *const texts[] = {
		/* w8a8: int8 weights a channel, int8 activations a token */
		"op=lowrank_fwd;" SMALL "arch=sm_90a;ascale=token;wscale=channel;out=bf16;relu=0",
		"op=lowrank_fwd;" SMALL "arch=sm_90a;in_heads=4;ascale=token;wscale=channel;out=f32",
		"op=lowrank_fwd;" SMALL "ascale=token;wscale=channel;out=bf16;relu=0",
		"op=lowrank_fwd;" SMALL "in_heads=4;ascale=token;wscale=channel;out=f32;relu=0.25",
		"op=lowrank_fwd;" SMALL "ascale=token;wscale=channel;out=bf16;tile=64x64x16/2x2/2",
		/* the warpgroup path's K-streaming form (explicit tiles) */
		"op=lowrank_fwd;heads=4;embd=768;latent=512;arch=sm_90a;ascale=token;wscale=channel;out=bf16;relu=0;"
		"tile=128x128x64/8x1/5",
		"op=lowrank_fwd;heads=4;embd=768;latent=512;arch=sm_90a;in_heads=4;ascale=token;wscale=channel;out=f32;"
		"tile=128x256x128/8x1/3",
		"op=lowrank_fwd;" SMALL "arch=sm_90a;ascale=token;wscale=channel;out=bf16;relu=0;tile=128x128x64/8x1/5",
		"op=lowrank_fwd;" SMALL "arch=sm_90a;in_heads=4;ascale=token;wscale=channel;out=f32;tile=64x64x128/4x1/3",
		/* bitnet: ternary weights a tensor, int8 activations a token */
		"op=lowrank_fwd;" SMALL "weight=ternary;ascale=token;out=bf16;relu=0",
		"op=lowrank_fwd;" SMALL "arch=sm_90a;weight=ternary;ascale=token;out=bf16;relu=0",
		/* one operand float */
		"op=lowrank_fwd;" SMALL "weight=bf16;ascale=token;out=f32",
		"op=lowrank_fwd;" SMALL "act=bf16;wscale=channel;out=f32",
		"op=relu_mask;" SMALL "ascale=token;wscale=channel",
		"op=relu_mask;" SMALL "in_heads=4;ascale=token;wscale=channel;tile=64x64x16/2x2/2",
		/* the decoder: a token b·T + t over every head, a channel d */
		"op=decoder_fwd;" SMALL "act=uint8pos;ascale=token;wscale=channel",
		"op=decoder_fwd;" SMALL "act=uint8pos;weight=ternary;ascale=token",
		"op=decoder_fwd;" SMALL "act=uint8pos;ascale=token;wscale=channel;tile=64x64x16/2x2/2",
		"op=decoder_fwd;" SMALL "act=bf16;wscale=channel;out=f32",
	};
	static const int rows[] = { 1, 77, 256 };
	check_all(texts, sizeof(texts) / sizeof(texts[0]), rows, sizeof(rows) / sizeof(rows[0]));
}

Test(gpu_scales, backward)
{
	static const char *const texts[] = {
		"op=lowrank_grad_input;" SMALL "wscale=channel",
		"op=lowrank_grad_input;" SMALL "in_heads=4;wscale=channel",
		"op=lowrank_grad_input;" SMALL "weight=sign1;wscale=channel;tile=64x64x8/2x2/2",
		"op=lowrank_grad_weight;" SMALL "ascale=token",
		"op=lowrank_grad_weight;" SMALL "in_heads=4;ascale=token",
		"op=lowrank_grad_weight;" SMALL "ascale=token;tile=64x64x8/2x2/2",
		"op=decoder_grad_input;" SMALL "wscale=channel",
		"op=decoder_grad_input;" SMALL "weight=ternary;wscale=channel;tile=64x64x8/2x2/2",
		"op=decoder_grad_weight;" SMALL "act=uint8pos;ascale=token",
		"op=decoder_grad_weight;" SMALL "act=uint8pos;ascale=token;tile=64x64x8/2x2/2",
	};
	static const int rows[] = { 33, 256 };
	check_all(texts, sizeof(texts) / sizeof(texts[0]), rows, sizeof(rows) / sizeof(rows[0]));
}

Test(gpu_scales, quantizers)
{
	static const char *const texts[] = {
		"op=quantize_act;ascale=token",
		"op=quantize_act;ascale=token;src=bf16",
		"op=quantize_act;ascale=token;act=uint8pos",
		"op=quantize_act;ascale=token;act=int4;tile=t128",
		"op=quantize_weight;wscale=channel",
		"op=quantize_weight;wscale=channel;weight=ternary",
		"op=quantize_weight;wscale=channel;weight=sign1;src=bf16",
	};
	static const int rows[] = { 3, 64 };
	check_all(texts, sizeof(texts) / sizeof(texts[0]), rows, sizeof(rows) / sizeof(rows[0]));
}

/* The BDH shape, the w8a8 and bitnet recipes' specs, at a few rows. */
Test(gpu_scales, bdh_shape)
{
	static const char *const texts[] = {
		"op=lowrank_fwd;arch=sm_90a;ascale=token;wscale=channel;out=bf16;relu=0",
		"op=lowrank_fwd;ascale=token;wscale=channel;out=bf16;relu=0",
		"op=lowrank_fwd;in_heads=4;ascale=token;wscale=channel;out=bf16;relu=0",
		"op=relu_mask;ascale=token;wscale=channel",
		"op=decoder_fwd;act=uint8pos;ascale=token;wscale=channel",
		"op=lowrank_grad_input;wscale=channel",
		"op=lowrank_grad_weight;ascale=token",
		"op=decoder_grad_input;wscale=channel",
		"op=decoder_grad_weight;act=uint8pos;ascale=token",
	};
	static const int rows[] = { 40 };
	check_all(texts, sizeof(texts) / sizeof(texts[0]), rows, 1);
}

/* ---- the rows entries at given shapes, straight through the ops ------------------ */

/* One call of a quantizer a scale a row, for the timer. */
typedef struct rows_call {
	dg_device *dev;
	dg_spec spec;
	dg_tensor x, codes;
} rows_call;

static dg_status rows_run(void *user)
{
	rows_call *u = user;
	if (u->spec.op == DG_OP_QUANTIZE_ACT) {
		dg_quantize_act_args a = { .x = &u->x, .codes = &u->codes };
		return dg_quantize_act(u->dev, &u->spec, &a);
	}
	dg_quantize_weight_args a = { .w = &u->x, .codes = &u->codes };
	return dg_quantize_weight(u->dev, &u->spec, &a);
}

/* Runs u into its codes and scales, first set to 0xff bytes (so a code or
 * scale left unwritten shows), and downloads them. */
static void rows_once(rows_call *u, const char *what, void *codes, size_t code_bytes, float *scales,
		      size_t rows)
{
	cr_assert_eq(dg_memset8(u->dev, u->codes.data, 0xff, code_bytes), DG_OK);
	cr_assert_eq(dg_memset8(u->dev, u->codes.scale, 0xff, rows * sizeof(float)), DG_OK);
	cr_assert_eq(rows_run(u), DG_OK, "%s: %s", what, dg_device_errmsg(u->dev));
	gh_download(u->dev, codes, u->codes.data, code_bytes);
	gh_download(u->dev, scales, u->codes.scale, rows * sizeof(float));
}

/* Prints the median time of u (cold L2) and the rate of `bytes` moved. */
static void rows_time(rows_call *u, const char *what, const char *entry, double bytes)
{
	dg_timer *tm = NULL;
	dg_timing r;
	dg_timer_opts o = { .reps = 20 };
	cr_assert_eq(dg_timer_create(u->dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(u->dev));
	cr_assert_eq(dg_timer_run(tm, &o, rows_run, u, &r), DG_OK, "%s", dg_device_errmsg(u->dev));
	dg_timer_destroy(tm);
	printf("%-46s %-28s %8.1f us  %6.2f TB/s (cold L2)\n", what, entry, r.median_us,
	       bytes / r.median_us * 1e-6);
	fflush(stdout);
}

/* What a rows check reads back: the codes (n bytes) and scales (rows
 * floats) of the launch, the reference's, and a second launch's. */
typedef struct rows_out {
	void *got, *want, *again;
	float *gs, *ws, *gs2;
} rows_out;

static rows_out rows_out_make(size_t n, size_t rows)
{
	rows_out o = { gh_xmalloc(n), gh_xmalloc(n), gh_xmalloc(n),
		       gh_xmalloc(rows * 4), gh_xmalloc(rows * 4), gh_xmalloc(rows * 4) };
	return o;
}

/* The end of a rows check: u timed when `time` (the bytes it moves: n
 * values of esz read, n codes and `rows` scales written), o freed. */
static void rows_done(rows_call *u, const char *what, const char *entry, bool time, size_t n, size_t esz,
		      size_t rows, rows_out *o)
{
	if (time)
		rows_time(u, what, entry, (double)n * esz + (double)n + (double)rows * 4);
	free(o->got);
	free(o->want);
	free(o->again);
	free(o->gs);
	free(o->ws);
	free(o->gs2);
}

/* n floats into storage of src (f32 | bf16), malloc'd. */
static void *rows_store(dg_fmt src, const float *v, size_t n)
{
	void *p = gh_xmalloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		if (src == DG_FMT_BF16)
			((uint16_t *)p)[i] = dg_f32_to_bf16(v[i]);
		else
			((float *)p)[i] = v[i];
	}
	return p;
}

/* Values of row r (r·cols + c of n): uniform in ±2^e with e from -6 to 6
 * by row, so a row read with another row's scale is off, and one value
 * ±1.5·2^e, the row's only maximum, at a place that moves from row to row
 * (bf16 rounds so many values to the top of ±2^e that a reduction which
 * drops a lane, a warp or a segment would still find one); row 1 all
 * zeros (scale 0, every code 0) and one NaN in row 2 (ignored by the max,
 * code 0; the weights' sums have none). */
static float *rows_values(size_t rows, size_t cols, bool nan)
{
	float *v = gh_xmalloc(rows * cols * sizeof(float));
	for (size_t r = 0; r < rows; r++) {
		int e = (int)(r * 7 % 13) - 6;
		for (size_t c = 0; c < cols; c++)
			v[r * cols + c] = r == 1 ? 0.0f : ldexpf(gh_uniform(-1.0f, 1.0f), e);
		if (r != 1)
			v[r * cols + (r * 7919 + 13) % cols] = ldexpf(r % 2 ? -1.5f : 1.5f, e);
	}
	if (nan && rows > 2)
		v[2 * cols + cols / 2] = NAN;
	return v;
}

/* Values of row r whose quotients by the row's scale fall on and around
 * half-integers: the row's maximum qmax·2^e (so s = 2^e exactly) at a
 * place that moves, and (k + 1/2 + d)·2^e for k uniform in [-qmax, qmax)
 * with d cycling through 0, ±1 ulp of the value and ±2^-10, ±2^-13 (bf16
 * storage rounds the small ones back to the half-integer): the codes the
 * token quantizer's reciprocal rule must send to the division (ties to
 * even) and those just outside its 2^-12 margin, which it must not. */
static float *rows_halves(size_t rows, size_t cols, int qmax)
{
	static const float d[] = { 0.0f, 1.0f / 1024, -1.0f / 1024, 1.0f / 8192, -1.0f / 8192 };
	float *v = gh_xmalloc(rows * cols * sizeof(float));
	for (size_t r = 0; r < rows; r++) {
		int e = (int)(r % 9) - 4;
		for (size_t c = 0; c < cols; c++) {
			float k = floorf(gh_uniform(-(float)qmax, (float)qmax));
			float h = k + 0.5f, x = ldexpf(h + (c % 7 < 5 ? d[c % 7] : 0.0f), e);
			if (c % 7 == 5)
				x = nextafterf(x, INFINITY);
			else if (c % 7 == 6)
				x = nextafterf(x, -INFINITY);
			v[r * cols + c] = fabsf(x) < ldexpf((float)qmax, e) ? x : ldexpf(h, e);
		}
		v[r * cols + (r * 131 + 7) % cols] = ldexpf((float)qmax, e);
	}
	return v;
}

/* quantize_act ascale=token (spec text) of x (B, G, T, C): scales and
 * codes bit for bit those of dg_ref_quantize_act_rows; timed when time.
 * halves: rows_halves's values in place of rows_values's. */
static void act_rows_of(dg_device *dev, const char *text, int B, int G, int T, int C, bool time, bool halves)
{
	char msg[512], what[160];
	dg_spec s;
	cr_assert_eq(dg_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	size_t n = (size_t)B * G * T * C, rows = (size_t)B * T, esz = s.src == DG_FMT_BF16 ? 2 : 4;
	const char *entry = dg__quantize_rows_entry(&s, (long long)G * C);
	snprintf(what, sizeof(what), "%s (%d,%d,%d,%d)", text + strlen("op=quantize_act;ascale=token;"), B, G,
		 T, C);

	/* the values by token b·T + t: (B, G, T, C) read as (B, G·T... ) is not
	 * token-major, so fill token-major and scatter */
	float *tok = halves ? rows_halves(rows, (size_t)G * C, dg_ref_qmax(s.act)) : rows_values(rows, (size_t)G * C, true),
	      *v = gh_xmalloc(n * sizeof(float));
	for (size_t r = 0; r < rows; r++)
		for (size_t g = 0; g < (size_t)G; g++)
			memcpy(v + (((r / T) * G + g) * T + r % T) * C, tok + (r * G + g) * C,
			       (size_t)C * sizeof(float));
	void *xs = rows_store(s.src, v, n);
	int64_t sh[4] = { B, G, T, C };
	rows_call u = { .dev = dev, .spec = s };
	u.x = dg_tensor_make("x", s.src, gh_upload(dev, xs, n * esz), 4, sh);
	u.codes = dg_tensor_make("codes", s.act, gh_alloc(dev, n), 4, sh);
	u.codes.scale = gh_alloc(dev, rows * sizeof(float));

	rows_out o = rows_out_make(n, rows);
	uint8_t *got = o.got, *want = o.want, *again = o.again;
	float *gs = o.gs, *ws = o.ws, *gs2 = o.gs2;
	rows_once(&u, what, got, n, gs, rows);
	cr_assert_eq(dg_ref_quantize_act_rows(s.src, s.act, xs, (size_t)B, (size_t)G, (size_t)T, (size_t)C,
					      want, ws), DG_OK);
	snprintf(msg, sizeof(msg), "%s, %s: scales", what, entry);
	gh_expect_bytes(msg, gs, ws, rows * sizeof(float));
	snprintf(msg, sizeof(msg), "%s, %s: codes", what, entry);
	gh_expect_bytes(msg, got, want, n);
	rows_once(&u, what, again, n, gs2, rows);
	snprintf(msg, sizeof(msg), "%s, %s: a second launch", what, entry);
	gh_expect_bytes(msg, again, got, n);
	rows_done(&u, what, entry, time, n, esz, rows, &o);
	free(tok);
	free(v);
	free(xs);
}

static void act_rows(dg_device *dev, const char *text, int B, int G, int T, int C, bool time)
{
	act_rows_of(dev, text, B, G, T, C, time, false);
}

/* A case of act_rows: the spec's text, the shape, whether it is timed. */
typedef struct act_case {
	const char *text;
	int B, G, T, C;
	bool time;
} act_case;

#define AQ "op=quantize_act;ascale=token;"

/* act_rows of each case on one device, the stream seeded first. */
static void act_rows_all(uint64_t seed, const act_case *c, size_t n)
{
	dg_device *dev = gh_open();
	gh_seed(seed);
	for (size_t i = 0; i < n; i++)
		act_rows(dev, c[i].text, c[i].B, c[i].G, c[i].T, c[i].C, c[i].time);
	gh_close(dev);
}

/* The token quantizer at the BDH xy shape (a token 4 heads × 8192) at
 * B 2, T 64, and the paths around it: a block a token with its 16
 * vectors a thread in registers (bf16) or half of them streamed (f32), a
 * warp a token (256 values, one or four segments), more vectors than a
 * warp keeps, and the scalar paths (C not whole 16-byte vectors). Bit for
 * bit the CPU reference; the BDH shapes are timed. */
Test(gpu_scales, quantize_act_rows_paths)
{
	static const act_case cases[] = {
		{ AQ "src=bf16;act=int8", 2, 4, 64, 8192, true },
		{ AQ "src=bf16;act=uint8pos", 2, 4, 64, 8192, true },
		{ AQ "src=f32;act=int8", 2, 4, 8, 8192, false },
		{ AQ "src=bf16;act=int8", 4, 1, 64, 256, true },
		{ AQ "src=bf16;act=int8", 2, 4, 16, 64, false },
		{ AQ "src=f32;act=int4", 2, 2, 8, 512, false },
		{ AQ "src=bf16;act=int8;tile=t128", 2, 4, 8, 8192, false },
		{ AQ "src=bf16;act=int8", 2, 3, 8, 100, false },
		{ AQ "src=f32;act=uint8pos", 1, 3, 8, 1001, false },
		/* more tokens than the block entry's resident blocks (its stage
		 * prefetches a block's next token): a token of 512 vectors (part
		 * of the stage), of 8192 f32 vectors (half streamed past it), and
		 * rows not a multiple of the grid */
		{ AQ "src=bf16;act=uint8pos", 4, 4, 201, 1024, false },
		{ AQ "src=f32;act=int8", 2, 4, 301, 8192, false },
		{ AQ "src=bf16;act=int8", 3, 4, 171, 8192, true },
		/* the warp entry's rows of a vector a lane at most, 8 a warp at a
		 * time: rows not a multiple of 8, rows of fewer vectors than lanes */
		{ AQ "src=bf16;act=uint8pos", 3, 1, 37, 128, false },
		{ AQ "src=f32;act=int8", 1, 1, 77, 128, false },
		{ AQ "src=bf16;act=int4", 2, 2, 13, 48, false },
	};
	act_rows_all(0x7a11, cases, sizeof(cases) / sizeof(cases[0]));
}

/* Quotients on and around half-integers (rows_halves) on both entries,
 * each source and code format: the token quantizer's multiply by the
 * row's reciprocal gives the division's codes, ties to even included. */
Test(gpu_scales, quantize_act_rows_half_integers)
{
	static const act_case cases[] = {
		{ AQ "src=bf16;act=int8", 2, 4, 8, 8192, false },
		{ AQ "src=f32;act=int8", 2, 4, 8, 8192, false },
		{ AQ "src=bf16;act=uint8pos", 2, 1, 16, 256, false },
		{ AQ "src=f32;act=int4", 2, 2, 8, 256, false },
		{ AQ "src=f32;act=uint8pos", 1, 3, 8, 1001, false },
	};
	dg_device *dev = gh_open();
	gh_seed(0x4a1f);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		act_rows_of(dev, cases[i].text, cases[i].B, cases[i].G, cases[i].T, cases[i].C, false, true);
	gh_close(dev);
}

/* The three token quantizers of a BDH w8a8 layer at the full step (B 8,
 * T 512, D 256, H 4, N 8192): x (B,1,T,D), a (B·H,1,T,D), xy (B,H,T,N),
 * bf16, checked and timed. The xy one moves 402 MB: ~0.1 ms at the
 * H200's bandwidth. */
Test(gpu_scales, quantize_act_rows_bdh_step)
{
	static const act_case cases[] = {
		{ AQ "src=bf16;act=int8", 8, 1, 512, 256, true },
		{ AQ "src=bf16;act=int8", 32, 1, 512, 256, true },
		{ AQ "src=bf16;act=uint8pos", 8, 4, 512, 8192, true },
	};
	act_rows_all(0xbd8, cases, sizeof(cases) / sizeof(cases[0]));
}

/* quantize_weight wscale=channel of w (rows, cols) f32 | bf16: scales
 * those of dg_ref_quantize_weight_rows (int8 exactly; ternary / sign1
 * within one ulp: a double sum in another order), the codes of every row
 * whose scale is the reference's exactly the reference's, and a second
 * launch the same bytes (the sums' order is fixed). */
static void weight_rows(dg_device *dev, const char *text, int rows, int cols, bool time)
{
	char msg[512], what[160];
	dg_spec s;
	cr_assert_eq(dg_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	size_t n = (size_t)rows * cols, esz = s.src == DG_FMT_BF16 ? 2 : 4;
	const char *entry = dg__quantize_rows_entry(&s, cols);
	snprintf(what, sizeof(what), "%s (%d,%d)", text + strlen("op=quantize_weight;wscale=channel;"), rows,
		 cols);
	float *v = rows_values((size_t)rows, (size_t)cols, false);
	void *xs = rows_store(s.src, v, n);
	if (s.src == DG_FMT_BF16) /* the reference reads floats: the stored values */
		for (size_t i = 0; i < n; i++)
			v[i] = dg_bf16_to_f32(((const uint16_t *)xs)[i]);
	rows_call u = { .dev = dev, .spec = s };
	u.x = dg_tensor_2d("w", s.src, gh_upload(dev, xs, n * esz), rows, cols);
	u.codes = dg_tensor_2d("codes", DG_FMT_INT8, gh_alloc(dev, n), rows, cols);
	u.codes.scale = gh_alloc(dev, (size_t)rows * sizeof(float));

	rows_out o = rows_out_make(n, (size_t)rows);
	int8_t *got = o.got, *want = o.want, *again = o.again;
	float *gs = o.gs, *ws = o.ws, *gs2 = o.gs2;
	rows_once(&u, what, got, n, gs, (size_t)rows);
	cr_assert_eq(dg_ref_quantize_weight_rows(s.weight, v, (size_t)rows, (size_t)cols, want, ws), DG_OK);
	int off = 0;
	for (int r = 0; r < rows; r++) {
		float g = gs[r], w = ws[r];
		if (s.weight == DG_FMT_INT8 || memcmp(&g, &w, 4) != 0) {
			cr_assert(s.weight != DG_FMT_INT8 ? fabsf(g - w) <= nextafterf(w, INFINITY) - w
							  : memcmp(&g, &w, 4) == 0,
				  "%s, %s: scale of row %d %.9g, reference %.9g", what, entry, r, (double)g,
				  (double)w);
			if (memcmp(&g, &w, 4) != 0) {
				off++;
				continue; /* one ulp away: its codes may differ at |w| == s */
			}
		}
		snprintf(msg, sizeof(msg), "%s, %s: codes of row %d", what, entry, r);
		gh_expect_bytes(msg, got + (size_t)r * cols, want + (size_t)r * cols, (size_t)cols);
	}
	cr_assert_leq(off, rows / 8 + 1, "%s, %s: %d of %d scales one ulp off the reference", what, entry, off,
		      rows);
	rows_once(&u, what, again, n, gs2, (size_t)rows);
	snprintf(msg, sizeof(msg), "%s, %s: a second launch's scales", what, entry);
	gh_expect_bytes(msg, gs2, gs, (size_t)rows * sizeof(float));
	snprintf(msg, sizeof(msg), "%s, %s: a second launch's codes", what, entry);
	gh_expect_bytes(msg, again, got, n);
	rows_done(&u, what, entry, time, n, esz, (size_t)rows, &o);
	free(v);
	free(xs);
}

/* The channel quantizer on each path: the BDH execution weights (encoder
 * rows of 256, decoder rows of 4·8192: a block a row with half its
 * vectors streamed), the double sums of ternary / sign1 on both entries,
 * and the scalar paths. */
Test(gpu_scales, quantize_weight_rows_paths)
{
#define WQ "op=quantize_weight;wscale=channel;"
	static const struct {
		const char *text;
		int rows, cols;
		bool time;
	} cases[] = {
		{ WQ "src=f32;weight=int8", 4 * 8192, 256, true },
		{ WQ "src=f32;weight=int8", 256, 4 * 8192, true },
		{ WQ "src=f32;weight=ternary", 64, 8192, false },
		{ WQ "src=f32;weight=ternary", 300, 256, false },
		{ WQ "src=bf16;weight=sign1", 16, 4 * 8192, false },
		{ WQ "src=f32;weight=ternary", 33, 1002, false },
		{ WQ "src=bf16;weight=int8", 5, 3001, false },
		/* more rows than the block entry's resident blocks: each block's
		 * next row staged while its codes go out (sm_80 on), part of the
		 * stage (512 vectors) and past it (8192, half streamed) */
		{ WQ "src=bf16;weight=int8", 700, 4096, false },
		{ WQ "src=f32;weight=ternary", 600, 32768, false },
		/* the warp entry's short rows, 8 a warp at a time (the same sums) */
		{ WQ "src=bf16;weight=int8", 301, 256, false },
		{ WQ "src=f32;weight=sign1", 45, 96, false },
	};
#undef WQ
	dg_device *dev = gh_open();
	gh_seed(0x3e1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		weight_rows(dev, cases[i].text, cases[i].rows, cases[i].cols, cases[i].time);
	gh_close(dev);
}
