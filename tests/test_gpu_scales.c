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

#include <stdio.h>
#include <string.h>

#include "autotune/sweep_int.h"
#include "gpu_helpers.h"

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
