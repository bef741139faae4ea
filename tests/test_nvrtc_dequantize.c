/*
 * dequantize (templates/dequantize.lua, runtime/ops/dequantize.c) without
 * a GPU:
 *   - every format renders and compiles to an sm_90 cubin: act int8, int4,
 *     uint8pos × out bf16, f32 × ascale tensor, token, at t256 (the
 *     default) and t64; the kernel's types and scale reads follow the spec;
 *   - the defaults (out=bf16, ascale=tensor) and the canonical text;
 *   - bad specs are refused naming the field (act, out, ascale, threads,
 *     a block tile);
 *   - the _check refuses wrong tensors by name: codes of another format,
 *     not 2-D, without their scale, missing; out of another format or
 *     shape, misaligned.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "dragon/spec.h"
#include "runtime/ops/checks.h"
#include "runtime/store/nvrtc.h"
#include "helpers.h"
#include "nvrtc_helpers.h"

Test(nvrtc_dequantize, defaults_and_text)
{
	dg_spec s;
	char text[DG_SPEC_TEXT_MAX];
	dg_spec_init(&s, DG_OP_DEQUANTIZE);
	cr_assert_eq(s.act, DG_FMT_INT8);
	cr_assert_eq(s.out, DG_FMT_BF16);
	cr_assert_eq(s.ascale, DG_SCALE_TENSOR);
	dg_spec_to_string(&s, text, sizeof(text));
	cr_assert_str_eq(text, "act=int8;arch=sm_90;op=dequantize;out=bf16;tile=auto;");
	dg_spec p;
	char m[256];
	cr_assert_eq(dg_spec_parse("op=dequantize;act=uint8pos;out=f32;ascale=token;tile=t64", &p, m,
				   sizeof(m)),
		     DG_OK, "%s", m);
	dg_spec_to_string(&p, text, sizeof(text));
	cr_assert_str_eq(text, "act=uint8pos;arch=sm_90;ascale=token;op=dequantize;out=f32;tile=t64;");
	/* the shape fields are not the op's: H, E, L are the call's rows */
	cr_assert_neq(dg_spec_parse("op=dequantize;embd=128", &p, m, sizeof(m)), DG_OK);
}

Test(nvrtc_dequantize, every_format_compiles)
{
	static const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	char e[8192], text[DG_SPEC_TEXT_MAX];
	dg__nvrtc_target t;
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, e, sizeof(e)), DG_OK, "%s", e);
	dg_codegen *cg = nh_codegen();
	int n = 0;
	for (int a = 0; a < 3; a++)
		for (int o = 0; o < 2; o++)
			for (int g = 0; g < 2; g++)
				for (int th = 0; th < 2; th++) {
					dg_spec s = dg_test_dequantize_spec(acts[a], o ? DG_FMT_F32 : DG_FMT_BF16,
							    g ? DG_SCALE_TOKEN : DG_SCALE_TENSOR, th ? 64 : 0);
					char m[512];
					cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
					dg_spec_to_string(&s, text, sizeof(text));
					dg_source *src = NULL;
					cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text,
						     dg_codegen_errmsg(cg));
					cr_assert_eq(src->n_entries, 1, "%s", text);
					cr_assert_str_eq(src->entries[0], "dg_dequantize", "%s", text);
					cr_assert(strstr(src->text, "do not edit"), "%s", text);
					cr_assert(strstr(src->text, th ? "NT = 64;" : "NT = 256;"), "%s", text);
					cr_assert(strstr(src->text, acts[a] == DG_FMT_UINT8POS ? "typedef unsigned char CT;"
											       : "typedef signed char CT;"),
						  "%s: code type", text);
					cr_assert(strstr(src->text, o ? "typedef float OT;" : "typedef unsigned short OT;"),
						  "%s: output type", text);
					/* a scale a row is read by row; one a tensor once */
					cr_assert_eq(strstr(src->text, "scale + i / cols") != NULL, g == 1, "%s", text);
					cr_assert_eq(strstr(src->text, "s0 = __ldg(scale)") != NULL, g == 0, "%s", text);
					dg__nvrtc_result res;
					dg_status st = dg__nvrtc_compile(src, &t, &res, e, sizeof(e));
					cr_assert_eq(st, DG_OK, "%s: %s", text, e);
					cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s", text);
					dg__nvrtc_result_free(&res);
					dg_source_destroy(src);
					n++;
				}
	cr_assert_eq(n, 24);
	dg_codegen_destroy(cg);
}

Test(nvrtc_dequantize, bad_specs_are_refused_naming_the_field)
{
	dg_codegen *cg = nh_codegen();
	static const dg_fmt not_codes[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	for (size_t i = 0; i < sizeof(not_codes) / sizeof(not_codes[0]); i++) {
		dg_spec s = dg_test_dequantize_spec(not_codes[i], DG_FMT_BF16, DG_SCALE_TENSOR, 0);
		nh_expect_refused(cg, &s, "act");
	}
	dg_spec s = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_INT8, DG_SCALE_TENSOR, 0);
	nh_expect_refused(cg, &s, "out");
	s = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_UINT8POS, DG_SCALE_TENSOR, 0);
	nh_expect_refused(cg, &s, "out");
	s = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_CHANNEL, 0);
	nh_expect_refused(cg, &s, "ascale");
	s = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TENSOR, 48);
	nh_expect_refused(cg, &s, "threads");
	s.tile.threads = 2048;
	nh_expect_refused(cg, &s, "threads");
	s.tile = (dg_tile){ 64, 64, 32, 2, 2, 2, 0 };
	nh_expect_refused(cg, &s, "tile");
	dg_codegen_destroy(cg);
}

/* ---- the check, without a device ------------------------------------------------ */

#define P(i) ((dg_dptr)0x100000 * (i))

Test(nvrtc_dequantize, check_refuses_wrong_tensors_by_name)
{
	char msg[512];
	for (int g = 0; g < 2; g++) {
		dg_spec s = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_BF16, g ? DG_SCALE_TOKEN : DG_SCALE_TENSOR, 0);
		dg_tensor codes = dg_tensor_2d("codes", DG_FMT_INT8, P(1), 96, 256);
		dg_tensor out = dg_tensor_2d("out", DG_FMT_BF16, P(2), 96, 256);
		codes.scale = P(3);
		dg_dequantize_args a = { .codes = &codes, .out = &out };
		cr_assert_eq(dg_dequantize_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
		codes.fmt = DG_FMT_UINT8POS; /* not the spec's act */
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "codes", "int8");
		codes.fmt = DG_FMT_INT8;
		codes.scale = 0;
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "codes", "scale");
		codes.scale = P(3);
		out.fmt = DG_FMT_F32; /* not the spec's out */
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "out", "bf16");
		out.fmt = DG_FMT_BF16;
		out.shape[1] = 255; /* not the codes' shape */
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "out", "96, 256");
		out.shape[1] = 256;
		out.data += 8;
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "out", "aligned");
		out.data = P(2);
		/* a stack not viewed as its rows */
		dg_tensor c4 = dg_tensor_4d("codes", DG_FMT_INT8, P(1), 2, 3, 16, 256);
		dg_tensor o4 = dg_tensor_4d("out", DG_FMT_BF16, P(2), 2, 3, 16, 256);
		c4.scale = P(3);
		dg_dequantize_args a4 = { .codes = &c4, .out = &o4 };
		nh_expect_named(dg_dequantize_check(&s, &a4, msg, sizeof(msg)), msg, "codes", "(R, C)");
		a.codes = NULL;
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "codes", "missing");
		a.codes = &codes;
		a.out = NULL;
		nh_expect_named(dg_dequantize_check(&s, &a, msg, sizeof(msg)), msg, "out", "missing");
		cr_assert_eq(dg_dequantize_check(&s, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
		/* a spec of another op */
		dg_spec q;
		dg_spec_init(&q, DG_OP_QUANTIZE_ACT);
		a.out = &out;
		cr_assert_eq(dg_dequantize_check(&q, &a, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
		cr_assert(strstr(msg, "quantize_act"), "%s", msg);
	}
}

/* The specs the GPU model's low-bit step runs on sm_90 with the copies
 * this op makes (runtime/train/gpu_model.c proj_spec): the encoders'
 * input gradients with bf16 weights, their weight gradients with bf16
 * activations, both of a bf16 gradient, on sm_90a; and the dequantize
 * specs it runs (weights a channel and a tensor, the stacks a row). Each
 * plans at its default tile, renders and compiles for sm_90a. */
Test(nvrtc_dequantize, the_models_bf16_gradient_specs_compile)
{
	char e[8192], text[DG_SPEC_TEXT_MAX], m[512];
	dg__nvrtc_target t;
	cr_assert_eq(dg__nvrtc_target_for(90, true, &t, e, sizeof(e)), DG_OK, "%s", e);
	dg_codegen *cg = nh_codegen();
	dg_spec specs[6];
	int n = 0;
	for (int w = 0; w < 2; w++)
		for (int hin = 0; hin < 2; hin++) {
			dg_spec s;
			dg_spec_init(&s, w ? DG_OP_LOWRANK_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_INPUT);
			s.in_heads = hin ? 4 : 1;
			s.weight = DG_FMT_BF16;
			s.act = DG_FMT_BF16;
			s.src = DG_FMT_BF16;
			s.arch_specific = true;
			dg_spec_normalize(&s);
			specs[n++] = s;
		}
	specs[n++] = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TOKEN, 0);
	specs[n++] = dg_test_dequantize_spec(DG_FMT_INT8, DG_FMT_BF16, DG_SCALE_TENSOR, 0);
	for (int i = 0; i < n; i++) {
		dg_spec *s = &specs[i];
		s->arch_specific = true;
		cr_assert_eq(dg_spec_validate(s, m, sizeof(m)), DG_OK, "%s", m);
		dg_spec_to_string(s, text, sizeof(text));
		cr_assert(strstr(text, "arch=sm_90a;"), "%s", text);
		if (s->op != DG_OP_DEQUANTIZE)
			cr_assert(strstr(text, "src=bf16;") && (strstr(text, "weight=bf16;") || strstr(text, "act=bf16;")),
				  "%s", text);
		dg_plan p;
		cr_assert_eq(dg_codegen_plan(cg, s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
		dg_source *src = NULL;
		cr_assert_eq(dg_codegen_render(cg, s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
		dg__nvrtc_result res;
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s", text, e);
		cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s", text);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	dg_codegen_destroy(cg);
}
