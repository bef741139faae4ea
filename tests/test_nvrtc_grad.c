/*
 * Every kernel variant of templates/grad.lua and templates/qweight.lua
 * renders and compiles to an sm_90 cubin: each gradient GEMM × each weight /
 * act format × in_heads 1 / H at the BDH shape (the default tiles: the
 * tensor-core path, mma.sync m16n8k16 bf16), the same for sm_80 and for
 * sm_75 (the fp32 SIMT path), odd tiles of both paths (SIMT: single
 * buffer, bn 16 so a sign1 unit is half a word, staging guards; tensor
 * cores: 16x16 and 16x32 warp tiles, BK 16 to 128, stages 1 to 4, staging
 * guards, latent / embd not multiples of the tile), quantize_weight src ×
 * weight, pack_ternary / pack_sign1; bf16 gradients (src=bf16 of the
 * lowrank grads, out=bf16 of decoder_grad_input) on both paths and odd
 * tiles, latent 100 and 36 (the 8-byte chunks of a bf16 row aligned to 8
 * bytes only), the canonical text naming them only when bf16, a format
 * they do not take refused by field; the sm_90a warpgroup path of the
 * lowrank grads with bf16 gradient and operand (templates/grad_wgmma.lua:
 * its default and other tiles, small shapes, the plan's path, the
 * promotion of plan_for, its refusals, mma.sync for other tiles) and of
 * decoder_grad_weight with an f32 gradient and y bf16 / 8-bit codes (its
 * tiles and formats, the scale where it belongs, the fallbacks);
 * lowrank_grad_input's K split on every path (the split ABI and the
 * _reduce entry in the source, the scale where it belongs, both entries
 * in an sm_90a and an sm_80 cubin); and the render and the spec refuse
 * tiles and shapes they cannot run (the template's plan for tile values,
 * the op table's validation for the tile's kind and the packing of axes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/cubin.h"
#include "dragon/spec.h"
#include "runtime/store/nvrtc.h"
#include "nvrtc_helpers.h"

static const dg_fmt weights[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
				  DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt acts[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
			       DG_FMT_INT4, DG_FMT_UINT8POS };

/* Renders spec and compiles it for sm_90 (sm_90a for an arch-specific
 * spec); fails the test with the message.
 * Checks the entries the template declares are in the source. */
static void compile_one(dg_codegen *cg, const dg_spec *spec,
			const char *const *entries, int n_entries)
{
	char e[8192];
	dg__nvrtc_target t;
	dg__nvrtc_result res;
	dg_source *src = NULL;
	char text[DG_SPEC_TEXT_MAX];

	dg_spec_to_string(spec, text, sizeof(text));
	cr_assert_eq(dg__nvrtc_target_for(90, spec->arch_specific, &t, e, sizeof(e)), DG_OK, "%s", e);
	dg_status st = dg_codegen_render(cg, spec, &src);
	cr_assert_eq(st, DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_eq(src->n_entries, n_entries, "%s: %d entries", text, src->n_entries);
	for (int i = 0; i < n_entries; i++) {
		cr_assert_str_eq(src->entries[i], entries[i], "%s", text);
		cr_assert(strstr(src->text, entries[i]), "%s: %s not in the source", text,
			  entries[i]);
	}
	st = dg__nvrtc_compile(src, &t, &res, e, sizeof(e));
	cr_assert_eq(st, DG_OK, "%s: %s", text, e);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0,
		  "%s: not an ELF cubin", text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

static dg_spec bdh(dg_op op)
{
	dg_spec s;

	dg_spec_init(&s, op);
	return s; /* H 4, E 256, L 8192 */
}

static const char *gi_entries[] = { "dg_lowrank_grad_input", "dg_lowrank_grad_input_reduce" };
static const char *dgi_entries[] = { "dg_decoder_grad_input" };
static const char *gw_entries[] = { "dg_lowrank_grad_weight",
				    "dg_lowrank_grad_weight_reduce" };
static const char *dgw_entries[] = { "dg_decoder_grad_weight", "dg_decoder_grad_weight_reduce",
				     "dg_decoder_grad_weight_cast" };

Test(nvrtc_grad, lowrank_grad_input_every_weight_and_in_heads)
{
	dg_codegen *cg = nh_codegen();

	for (int f = 0; f < 5; f++)
		for (int hin = 0; hin < 2; hin++) {
			dg_spec s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
			s.weight = weights[f];
			s.in_heads = hin ? s.heads : 1;
			compile_one(cg, &s, gi_entries, 2);
		}
	dg_codegen_destroy(cg);
}

Test(nvrtc_grad, lowrank_grad_weight_every_act_and_in_heads)
{
	dg_codegen *cg = nh_codegen();

	for (int f = 0; f < 5; f++)
		for (int hin = 0; hin < 2; hin++) {
			dg_spec s = bdh(DG_OP_LOWRANK_GRAD_WEIGHT);
			s.act = acts[f];
			s.in_heads = hin ? s.heads : 1;
			compile_one(cg, &s, gw_entries, 2);
		}
	dg_codegen_destroy(cg);
}

/* Renders spec and checks the path its banner names. */
static void expect_path(dg_codegen *cg, const dg_spec *spec, const char *path)
{
	dg_source *src = NULL;
	char text[DG_SPEC_TEXT_MAX];

	dg_spec_to_string(spec, text, sizeof(text));
	cr_assert_eq(dg_codegen_render(cg, spec, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, path), "%s: expected '%s' in the banner", text, path);
	dg_source_destroy(src);
}

/* The default tiles take the tensor cores from sm_80 on and the SIMT path
 * before; both compile for every format (an sm_75 spec still compiles for
 * the sm_90 target here: the SIMT source has nothing newer than sm_50). */
Test(nvrtc_grad, paths_by_arch)
{
	static const dg_op ops[] = { DG_OP_LOWRANK_GRAD_INPUT, DG_OP_LOWRANK_GRAD_WEIGHT,
				     DG_OP_DECODER_GRAD_INPUT, DG_OP_DECODER_GRAD_WEIGHT };
	static const char *const *ens[] = { gi_entries, gw_entries, dgi_entries, dgw_entries };
	static const int nen[] = { 2, 2, 1, 2 };
	dg_codegen *cg = nh_codegen();

	for (int o = 0; o < 4; o++) {
		dg_spec s = bdh(ops[o]);
		expect_path(cg, &s, "path: tensor cores");
		for (int a = 0; a < 2; a++)
			for (int f = 0; f < 5; f++) {
				s = bdh(ops[o]);
				s.arch = a ? 75 : 80;
				s.weight = weights[f];
				s.act = acts[f];
				dg_spec_normalize(&s);
				expect_path(cg, &s, a ? "path: fp32 FMA" : "path: tensor cores");
				compile_one(cg, &s, ens[o], nen[o]);
			}
	}
	dg_codegen_destroy(cg);
}

/* A gradient GEMM's spec on a tile off the default: the operand format under
 * test (the other operand int8), heads 3, latent / embd, the tile. */
typedef struct odd_tile {
	dg_op op;
	dg_fmt f;
	int latent, embd;
	dg_tile tile;
} odd_tile;

static dg_spec odd_tile_spec(const odd_tile *c, int in_heads)
{
	dg_spec s;

	dg_spec_init(&s, c->op);
	s.heads = 3;
	s.in_heads = in_heads;
	s.latent = c->latent;
	s.embd = c->embd;
	s.weight = c->f;
	s.act = c->f;
	if (s.op == DG_OP_LOWRANK_GRAD_WEIGHT || s.op == DG_OP_DECODER_GRAD_WEIGHT)
		s.weight = DG_FMT_INT8;
	else
		s.act = DG_FMT_INT8;
	s.tile = c->tile;
	return s;
}

/* Checks spec's banner names `path`, then compiles it with its op's
 * entries. */
static void compile_on_path(dg_codegen *cg, const dg_spec *s, const char *path)
{
	const char *const *en = s->op == DG_OP_LOWRANK_GRAD_INPUT ? gi_entries
			      : s->op == DG_OP_DECODER_GRAD_INPUT ? dgi_entries
			      : s->op == DG_OP_LOWRANK_GRAD_WEIGHT ? gw_entries
								   : dgw_entries;
	/* the others have a _reduce; decoder_grad_weight's warpgroup forms
	 * also the gradient's bf16 copy (_cast) */
	int n = s->op == DG_OP_DECODER_GRAD_INPUT ? 1
	      : s->op == DG_OP_DECODER_GRAD_WEIGHT && strstr(path, "warpgroup") ? 3
										 : 2;

	expect_path(cg, s, path);
	compile_one(cg, s, en, n);
}

/* Tensor-core tiles off the default: 16x16 and 16x32 warp tiles (one or
 * two ldmatrix.x4 a k16 step), BK 16..128, stages 1 (run as 2) to 4, unit
 * and chunk counts that do not divide the threads (staging guards),
 * sign1 units of half a word (bn 16), latent / embd smaller than or not a
 * multiple of the block tile, in_heads 1 and H. */
Test(nvrtc_grad, mma_odd_tiles)
{
	static const odd_tile cases[] = {
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_SIGN1, 48, 64, { 16, 16, 16, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, 128, 48, { 32, 32, 128, 2, 1, 2, 0 } },
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_F32, 96, 40, { 64, 64, 32, 4, 2, 3, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_SIGN1, 32, 16, { 16, 16, 16, 1, 1, 4, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_BF16, 44, 64, { 128, 64, 64, 4, 2, 2, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, 100, 32, { 256, 128, 32, 8, 2, 2, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_INT4, 20, 12, { 16, 32, 16, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_F32, 100, 20, { 64, 128, 16, 2, 4, 2, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_UINT8POS, 36, 256, { 32, 256, 64, 1, 8, 3, 0 } },
		{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_UINT8POS, 20, 12, { 32, 16, 16, 2, 1, 2, 0 } },
		{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_BF16, 132, 40, { 128, 128, 16, 4, 4, 4, 0 } },
		{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_INT8, 8192, 256, { 64, 64, 128, 2, 2, 2, 0 } },
	};
	dg_codegen *cg = nh_codegen();

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s = odd_tile_spec(&cases[i], i % 2 ? 3 : 1);
		dg_spec_normalize(&s);
		compile_on_path(cg, &s, "path: tensor cores");
	}
	dg_codegen_destroy(cg);
}

Test(nvrtc_grad, decoder_grads_every_format)
{
	dg_codegen *cg = nh_codegen();

	for (int f = 0; f < 5; f++) {
		dg_spec s = bdh(DG_OP_DECODER_GRAD_INPUT);
		s.weight = weights[f];
		compile_one(cg, &s, dgi_entries, 1);
		s = bdh(DG_OP_DECODER_GRAD_WEIGHT);
		s.act = acts[f];
		compile_one(cg, &s, dgw_entries, 2);
	}
	dg_codegen_destroy(cg);
}

/* Renders spec and checks its source holds `what`. */
static void expect_text(dg_codegen *cg, const dg_spec *spec, const char *what, bool present)
{
	dg_source *src = NULL;
	char text[DG_SPEC_TEXT_MAX];

	dg_spec_to_string(spec, text, sizeof(text));
	cr_assert_eq(dg_codegen_render(cg, spec, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_eq(strstr(src->text, what) != NULL, present, "%s: '%s' %s the source", text, what,
		     present ? "not in" : "in");
	dg_source_destroy(src);
}

/* bf16 gradients (dragon/spec.h "gradient formats"): the lowrank grads
 * read grad in src, decoder_grad_input writes grad_y in out. Every path:
 * the default tiles (tensor cores; the bf16 gradient copied straight into
 * the A tiles), sm_75 (SIMT, widened as loaded), odd tensor-core tiles
 * with latent 100 / 36 (8-byte chunks) and 96 (16-byte), in_heads 1 and H. */
Test(nvrtc_grad, bf16_gradients_every_path)
{
	dg_codegen *cg = nh_codegen();
	static const dg_op lows[] = { DG_OP_LOWRANK_GRAD_INPUT, DG_OP_LOWRANK_GRAD_WEIGHT };
	char text[DG_SPEC_TEXT_MAX];

	for (int o = 0; o < 2; o++)
		for (int f = 0; f < 5; f++)
			for (int a = 0; a < 2; a++) {
				dg_spec s = bdh(lows[o]);
				s.src = DG_FMT_BF16;
				s.weight = weights[f];
				s.act = acts[f];
				s.in_heads = f % 2 ? s.heads : 1;
				s.arch = a ? 75 : 90;
				dg_spec_normalize(&s);
				dg_spec_to_string(&s, text, sizeof(text));
				cr_assert(strstr(text, "src=bf16;"), "%s", text);
				expect_text(cg, &s, "const unsigned short *__restrict__ grad", true);
				expect_text(cg, &s, a ? "path: fp32 FMA" : "copied by cp.async into the A tiles", true);
				compile_on_path(cg, &s, a ? "path: fp32 FMA" : "path: tensor cores");
			}
	for (int f = 0; f < 5; f++)
		for (int a = 0; a < 2; a++) {
			dg_spec s = bdh(DG_OP_DECODER_GRAD_INPUT);
			s.out = DG_FMT_BF16;
			s.weight = weights[f];
			s.arch = a ? 75 : 90;
			dg_spec_normalize(&s);
			expect_text(cg, &s, "unsigned short *__restrict__ grad_y", true);
			expect_text(cg, &s, a ? "dg_f32_to_bf16(" : "dg_bf16x2(__fmul_rn(acc", a ? true : f >= 2);
			compile_on_path(cg, &s, a ? "path: fp32 FMA" : "path: tensor cores");
		}
	/* odd tensor-core tiles: 8-byte chunks where latent % 8 != 0 */
	static const odd_tile cases[] = {
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_INT8, 100, 20, { 64, 128, 16, 2, 4, 2, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_UINT8POS, 36, 256, { 32, 256, 64, 1, 8, 3, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_INT4, 20, 12, { 16, 32, 16, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_SIGN1, 48, 64, { 16, 16, 16, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_F32, 96, 40, { 64, 64, 32, 4, 2, 3, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, 100, 32, { 256, 128, 32, 8, 2, 2, 0 } },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s = odd_tile_spec(&cases[i], i % 2 ? 3 : 1);
		if (s.op == DG_OP_DECODER_GRAD_INPUT)
			s.out = DG_FMT_BF16;
		else
			s.src = DG_FMT_BF16;
		dg_spec_normalize(&s);
		if (s.op != DG_OP_DECODER_GRAD_INPUT)
			expect_text(cg, &s, "dg_cp8(sbase", s.latent % 8 != 0);
		compile_on_path(cg, &s, "path: tensor cores");
	}
	dg_codegen_destroy(cg);
}

/* The gradient formats in the spec: f32 by default and then absent from
 * the canonical text (a tuning record's text still names the kernel),
 * bf16 named; a format an op does not take, and a gradient field an op
 * does not read, refused by name. */
Test(nvrtc_grad, gradient_format_fields)
{
	char text[DG_SPEC_TEXT_MAX], msg[256];
	dg_spec s;

	dg_spec_init(&s, DG_OP_DECODER_GRAD_INPUT);
	s.weight = DG_FMT_TERNARY;
	cr_assert_eq(s.out, DG_FMT_F32);
	dg_spec_to_string(&s, text, sizeof(text));
	cr_assert_str_eq(text, "arch=sm_90;embd=256;heads=4;latent=8192;op=decoder_grad_input;tile=auto;weight=ternary;");
	dg_spec p;
	cr_assert_eq(dg_spec_parse("op=decoder_grad_input;weight=ternary;out=f32", &p, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	cr_assert(dg_spec_equal(&p, &s), "out=f32 is the default kernel");
	s.out = DG_FMT_BF16;
	dg_spec_to_string(&s, text, sizeof(text));
	cr_assert(strstr(text, "out=bf16;"), "%s", text);
	cr_assert_eq(dg_spec_parse(text, &p, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert(dg_spec_equal(&p, &s));
	s.out = DG_FMT_INT8;
	cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "out=int8") && strstr(msg, "f32|bf16"), "%s", msg);
	cr_assert_eq(dg_spec_parse("op=lowrank_grad_input;src=uint8pos", &p, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "src=uint8pos"), "%s", msg);
	cr_assert_eq(dg_spec_parse("op=lowrank_grad_weight;out=bf16", &p, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "out"), "%s", msg);
	cr_assert_eq(dg_spec_parse("op=decoder_grad_input;src=bf16", &p, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "src"), "%s", msg);
	cr_assert_eq(dg_spec_parse("op=lowrank_grad_weight;src=bf16;act=int8", &p, msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	cr_assert_eq(p.src, DG_FMT_BF16);
}

/* SIMT tiles off the default path (sm_75, so every one takes it): single
 * buffer, bn 16 (sign1 half words), unit counts that do not divide the
 * threads (staging guards), 1-warp blocks, latent not a multiple of the
 * block tile. */
Test(nvrtc_grad, odd_tiles)
{
	static const odd_tile cases[] = {
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_SIGN1, 36, 64, { 16, 16, 4, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, 20, 48, { 32, 16, 4, 2, 2, 2, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_SIGN1, 32, 12, { 16, 16, 4, 1, 2, 2, 0 } },
		{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_BF16, 44, 8, { 128, 64, 8, 4, 2, 2, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_INT4, 20, 12, { 16, 32, 16, 1, 1, 1, 0 } },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_F32, 100, 20, { 64, 128, 16, 2, 4, 2, 0 } },
		{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_UINT8POS, 20, 12, { 32, 16, 8, 2, 1, 2, 0 } },
		{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_BF16, 132, 40, { 128, 128, 8, 4, 4, 2, 0 } },
	};
	dg_codegen *cg = nh_codegen();

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s = odd_tile_spec(&cases[i], i % 2 ? 3 : 1);
		s.arch = 75;
		compile_on_path(cg, &s, "path: fp32 FMA");
	}
	dg_codegen_destroy(cg);
}

Test(nvrtc_grad, quantize_weight_and_packers)
{
	static const char *q_entries[] = { "dg_quantize_weight_absum",
					   "dg_quantize_weight_scale",
					   "dg_quantize_weight_apply" };
	static const char *t_entries[] = { "dg_pack_ternary", "dg_unpack_ternary" };
	static const char *s_entries[] = { "dg_pack_sign1", "dg_unpack_sign1" };
	static const dg_fmt wq[] = { DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	dg_codegen *cg = nh_codegen();

	for (int src = 0; src < 2; src++)
		for (int f = 0; f < 3; f++) {
			dg_spec s = bdh(DG_OP_QUANTIZE_WEIGHT);
			s.src = src ? DG_FMT_BF16 : DG_FMT_F32;
			s.weight = wq[f];
			s.tile.threads = f == 1 ? 96 : 0; /* a non power of two */
			compile_one(cg, &s, q_entries, 3);
		}
	dg_spec s = bdh(DG_OP_PACK_TERNARY);
	compile_one(cg, &s, t_entries, 2);
	s.embd = 48;
	s.tile.threads = 64;
	compile_one(cg, &s, t_entries, 2);
	s = bdh(DG_OP_PACK_SIGN1);
	compile_one(cg, &s, s_entries, 2);
	s.embd = 96;
	compile_one(cg, &s, s_entries, 2);
	dg_codegen_destroy(cg);
}

/* What the templates refuse, with the field named. */
Test(nvrtc_grad, render_refusals)
{
	dg_codegen *cg = nh_codegen();
	dg_source *src = NULL;

	/* SIMT (sm_70): one buffer of 128x128x64 floats does not fit 48 KiB */
	dg_spec s = bdh(DG_OP_LOWRANK_GRAD_WEIGHT);
	s.act = DG_FMT_F32;
	s.arch = 70;
	s.tile = (dg_tile){ 128, 128, 64, 4, 4, 1, 0 };
	cr_assert_neq(dg_codegen_render(cg, &s, &src), DG_OK);
	cr_assert(strstr(dg_codegen_errmsg(cg), "needs 65536 bytes of shared memory, more than the 49152"), "%s",
		  dg_codegen_errmsg(cg));
	/* the same tile at bk 32: single-buffered, renders */
	s.tile.bk = 32;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "NBUF = 1"), "expected a single buffer");
	dg_source_destroy(src);
	src = NULL;
	/* the same tile on sm_90 takes the tensor cores (dynamic shared memory) */
	s.arch = 90;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "path: tensor cores"), "expected the tensor-core path");
	dg_source_destroy(src);
	src = NULL;
	/* pack_ternary rows of 24 codes do not fill words of 16: the op
	 * table's packing rule, refused before the template is asked */
	s = bdh(DG_OP_PACK_TERNARY);
	s.embd = 24;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "embd=24: op=pack_ternary packs 16 codes a word"), "%s",
		  dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
}

/* What the template's plan refuses of a gradient GEMM's tile, per path, with the
 * rule named (the spec itself is valid: only its tile cannot run). */
Test(nvrtc_grad, plan_refusals)
{
	dg_codegen *cg = nh_codegen();
	dg_plan p;
	dg_spec s = bdh(DG_OP_DECODER_GRAD_WEIGHT);
	const char *m;

	/* tensor cores: 128x128 warp tiles are 512 accumulators a thread */
	s.tile = (dg_tile){ 256, 256, 32, 2, 2, 2, 0 };
	cr_assert_eq(dg_spec_validate(&s, NULL, 0), DG_OK);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	m = dg_codegen_errmsg(cg);
	cr_assert(strstr(m, "tile=256x256x32/2x2/2: ") && strstr(m, "accumulators"), "%s", m);
	/* tensor cores: 4 stages of 256x256x128 exceed 227 KiB */
	s.tile = (dg_tile){ 256, 256, 128, 8, 2, 4, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "shared memory"), "%s", dg_codegen_errmsg(cg));
	/* the default fits both rules, and plans again to itself */
	s.tile = (dg_tile){ 0, 0, 0, 0, 0, 0, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_spec r = p.spec;
	cr_assert_eq(dg_codegen_plan(cg, &r, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	/* SIMT (BK 8): 64x64 warp tiles are 128 outputs a thread */
	s.tile = (dg_tile){ 128, 128, 8, 2, 2, 2, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "outputs per thread"), "%s", dg_codegen_errmsg(cg));
	/* grad_input: BK must divide the reduction (latent 8192 / embd 256) */
	s = bdh(DG_OP_DECODER_GRAD_INPUT);
	s.embd = 48;
	s.tile = (dg_tile){ 64, 64, 32, 2, 2, 2, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "embd=48"), "%s", dg_codegen_errmsg(cg));
	/* a thread count is not a GEMM tile: the op table's rule, before the plan */
	s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
	s.tile = (dg_tile){ 0, 0, 0, 0, 0, 0, 256 };
	char msg[512];
	cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "block tile"), "%s", msg);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "block tile"), "%s", dg_codegen_errmsg(cg));
	/* default tiles: the tensor-core path from sm_80 (BK dividing the
	 * reduction), the SIMT default before it or when 16 does not divide */
	s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
	s.latent = 48;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.tile.bk == 16 && p.spec.tile.bm == 64 && p.spec.tile.bn == 128, "%s", p.canonical);
	cr_assert_str_eq(p.path, "mma.sync bf16");
	s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
	s.latent = 100;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.tile.bk == 4 && p.spec.tile.bm == 64 && p.spec.tile.bn == 64, "%s", p.canonical);
	cr_assert_str_eq(p.path, "fp32");
	s = bdh(DG_OP_LOWRANK_GRAD_WEIGHT);
	s.arch = 75;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.tile.bm == 64 && p.spec.tile.bn == 64, "%s", p.canonical);
	cr_assert_str_eq(p.path, "fp32");
	dg_codegen_destroy(cg);
}

/* --- the sm_90a warpgroup path (templates/grad_wgmma.lua) --------------- */

/* A lowrank grad spec that the path applies to: sm_90a, bf16 gradient and
 * bf16 weight (grad_input) / act (grad_weight). */
static dg_spec wg_spec(dg_op op, int heads, int in_heads, int embd, int latent)
{
	dg_spec s = bdh(op);
	s.heads = heads;
	s.in_heads = in_heads;
	s.embd = embd;
	s.latent = latent;
	s.src = DG_FMT_BF16;
	if (op == DG_OP_LOWRANK_GRAD_INPUT)
		s.weight = DG_FMT_BF16;
	else
		s.act = DG_FMT_BF16;
	s.arch = 90;
	s.arch_specific = true;
	return s;
}

static void expect_plan_path(dg_codegen *cg, const dg_spec *s, const char *path, bool arch_specific)
{
	dg_plan p;
	char text[DG_SPEC_TEXT_MAX];

	dg_spec_to_string(s, text, sizeof(text));
	cr_assert_eq(dg_codegen_plan(cg, s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s", text);
	cr_assert_eq(p.needs_arch_specific, arch_specific, "%s", text);
}

/* The default and three other warpgroup tiles (one and two warpgroups,
 * BN 64 to 256, stages 3 and 4) render and compile for sm_90a at the BDH
 * shape and small ones (latent 64 / 128, embd 32 / 64: smaller than BN,
 * heads 2 / 4, in_heads 1 and H); each plan names the path. */
Test(nvrtc_grad, wgmma_bf16_tiles_and_shapes)
{
	static const dg_tile tiles[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },
		{ 128, 64, 64, 8, 1, 4, 0 },
		{ 64, 256, 64, 4, 1, 3, 0 },
		{ 128, 256, 64, 8, 1, 4, 0 },
	};
	static const int shapes[][3] = { /* heads, embd, latent */
		{ 4, 256, 8192 }, { 2, 32, 64 }, { 4, 64, 128 }, { 2, 64, 128 }, { 4, 32, 64 },
	};
	dg_codegen *cg = nh_codegen();

	for (int o = 0; o < 2; o++) {
		dg_op op = o ? DG_OP_LOWRANK_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_INPUT;
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			for (int k = 0; k < 4; k++) {
				/* the BDH shape on every tile, the small ones on two each */
				if (i > 0 && k % 2 != (int)i % 2)
					continue;
				int H = shapes[i][0];
				dg_spec s = wg_spec(op, H, (int)(i + (size_t)k) % 2 ? H : 1, shapes[i][1], shapes[i][2]);
				s.tile = tiles[k];
				/* the default is the warp-specialized form (rows of
				 * whole 16 bytes at every shape here) */
				bool ws = k == 0;
				expect_plan_path(cg, &s, ws ? "wgmma tma" : "wgmma bf16", true);
				compile_on_path(cg, &s, ws ? "path: warp-specialized warpgroup tensor cores"
							   : "path: warpgroup tensor cores");
			}
	}
	dg_codegen_destroy(cg);
}

/* The warp-specialized form (tiles of 5 to 8 stages; TMA producer
 * warpgroup): renders and compiles for sm_90a at the BDH shape and small
 * ones (rows of whole 16 bytes), its plan a producer warpgroup's threads
 * more and its banner the maps' ABI; refused where a row is not 16 bytes
 * whole (embd 36) or for decoder_grad_weight (staged through registers). */
Test(nvrtc_grad, wgmma_tma_tiles_and_refusals)
{
	static const dg_tile tiles[] = {
		{ 128, 128, 64, 8, 1, 6, 0 },
		{ 64, 256, 64, 4, 1, 5, 0 },
		{ 128, 64, 64, 8, 1, 8, 0 },
	};
	static const int shapes[][3] = { { 4, 256, 8192 }, { 2, 40, 64 }, { 4, 64, 128 } };
	dg_codegen *cg = nh_codegen();

	for (int o = 0; o < 2; o++) {
		dg_op op = o ? DG_OP_LOWRANK_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_INPUT;
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			for (int k = 0; k < 3; k++) {
				if (i > 0 && k != (int)i)
					continue;
				int H = shapes[i][0];
				dg_spec s = wg_spec(op, H, (int)(i + (size_t)k) % 2 ? H : 1, shapes[i][1], shapes[i][2]);
				s.tile = tiles[k];
				dg_plan p;
				cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
				cr_assert_str_eq(p.path, "wgmma tma");
				cr_assert(p.needs_arch_specific);
				cr_assert_eq(p.entries[0].threads, tiles[k].wm * 32 + 128);
				compile_on_path(cg, &s, "path: warp-specialized warpgroup tensor cores");
			}
	}
	dg_plan p;
	dg_spec s = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, 2, 1, 36, 64);
	s.tile = tiles[0];
	cr_assert_neq(dg_codegen_plan(cg, &s, &p), DG_OK, "embd 36: rows of 72 bytes are no tensor map's");
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages"), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
}

/* op's default at the BDH shape is the warp-specialized form: two
 * consumer warpgroups and the producer's, six stages and their 12
 * mbarriers; its reduce entry (named reduce) takes no shared memory. */
static void expect_ws_default(dg_codegen *cg, dg_op op, const char *reduce)
{
	dg_plan p;
	dg_spec s = wg_spec(op, 4, 1, 256, 8192);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma tma");
	cr_assert(p.needs_arch_specific);
	cr_assert(strstr(p.canonical, "tile=128x128x64/8x1/6;"), "%s", p.canonical);
	cr_assert_eq(p.n_entries, 2);
	cr_assert_str_eq(p.entries[1].name, reduce);
	cr_assert_eq(p.entries[1].smem, 0);
	cr_assert_eq(p.entries[0].threads, 384);
	cr_assert_eq(p.entries[0].smem, 6 * (128 + 128) * 64 * 2 + 1024 + 16 * 6);
}

/* The default tiles (templates/grad_wgmma.lua M.default_tile), the
 * promotion of an sm_90 spec by plan_for, and what stays on mma.sync: a
 * non-warpgroup tile, an int8 operand, an f32 gradient, sm_90 without a. */
Test(nvrtc_grad, wgmma_bf16_defaults_and_mma_fallback)
{
	dg_codegen *cg = nh_codegen();
	dg_plan p;

	expect_ws_default(cg, DG_OP_LOWRANK_GRAD_INPUT, "dg_lowrank_grad_input_reduce");
	expect_ws_default(cg, DG_OP_LOWRANK_GRAD_WEIGHT, "dg_lowrank_grad_weight_reduce");
	/* rows of 72 bytes (embd 36) are no tensor map's: the ring's tile */
	dg_spec s = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, 2, 1, 36, 64);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16");
	cr_assert(strstr(p.canonical, "tile=128x128x64/8x1/3;"), "%s", p.canonical);

	for (int o = 0; o < 2; o++) {
		dg_op op = o ? DG_OP_LOWRANK_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_INPUT;
		/* sm_90 (no a): mma.sync; plan_for on an sm_90 device promotes it */
		s = wg_spec(op, 4, 1, 256, 8192);
		s.arch_specific = false;
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "wgmma tma");
		cr_assert(p.spec.arch_specific && p.needs_arch_specific);
		/* a non-warpgroup tile on the same sm_90a spec: mma.sync */
		s = wg_spec(op, 4, 1, 256, 8192);
		s.tile = (dg_tile){ 128, 128, 32, 2, 2, 4, 0 };
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		compile_on_path(cg, &s, "path: tensor cores");
		/* a warpgroup-shaped tile of 2 stages is an mma.sync one too */
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 2, 0 };
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		/* an int8 operand or an f32 gradient: mma.sync, not promoted */
		s = wg_spec(op, 4, 1, 256, 8192);
		if (o)
			s.act = DG_FMT_INT8;
		else
			s.weight = DG_FMT_INT8;
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		s = wg_spec(op, 4, 1, 256, 8192);
		s.src = DG_FMT_F32;
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		s.arch_specific = false;
		cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "mma.sync bf16");
		cr_assert(!p.spec.arch_specific);
	}
	/* grad_input's reduction 96 is no multiple of BK 64: the default is
	 * mma.sync's, and a warpgroup tile is refused by the BK rule */
	s = wg_spec(DG_OP_LOWRANK_GRAD_INPUT, 2, 1, 64, 96);
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	s.tile = (dg_tile){ 64, 128, 64, 4, 1, 4, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "tile=64x128x64/4x1/4: BK=64 must divide latent=96"), "%s",
		  dg_codegen_errmsg(cg));
	/* grad_weight reduces over B·T (run time): latent 96 is a ragged M */
	s = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, 2, 2, 40, 96);
	expect_plan_path(cg, &s, "wgmma tma", true);
	compile_on_path(cg, &s, "path: warp-specialized warpgroup tensor cores");
	/* stages past the ring's 4 name the warp-specialized form; past its 8
	 * are refused */
	s = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, 4, 1, 256, 8192);
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
	expect_plan_path(cg, &s, "wgmma tma", true);
	s.tile = (dg_tile){ 128, 64, 64, 8, 1, 9, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages must be 1 to 8"), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
}

/* --- decoder_grad_weight on the warpgroup path (grad_wgmma.lua render_dgw) */

/* A decoder_grad_weight spec the path applies to: sm_90a, y of format f
 * (bf16, int8, uint8pos), a scale a token or a tensor. */
static dg_spec dgw_wg_spec(int heads, int embd, int latent, dg_fmt f, bool token)
{
	dg_spec s = bdh(DG_OP_DECODER_GRAD_WEIGHT);
	s.heads = heads;
	s.embd = embd;
	s.latent = latent;
	s.act = f;
	s.ascale = token ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
	s.arch = 90;
	s.arch_specific = true;
	dg_spec_normalize(&s);
	return s;
}

/* The default and three other tiles (one and two warpgroups, BN 64 to 256,
 * stages 2 to 4) × y bf16 / uint8pos (a scale a token and a tensor) /
 * int8 render and compile for sm_90a at the BDH shape and small ones (embd
 * 40 / 32 below BM, latent 96 / 136 / 200 ragged), each plan on the path;
 * the source holds the staging's conversions and the scale where the
 * mma.sync path applies it. */
Test(nvrtc_grad, wgmma_decoder_grad_weight_tiles_and_formats)
{
	static const dg_tile tiles[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },
		{ 128, 64, 64, 8, 1, 3, 0 },
		{ 64, 256, 64, 4, 1, 2, 0 },
		{ 128, 256, 64, 8, 1, 4, 0 },
	};
	static const int shapes[][3] = { /* heads, embd, latent */
		{ 4, 256, 8192 }, { 2, 40, 96 }, { 2, 64, 136 }, { 4, 32, 64 }, { 1, 136, 200 },
	};
	static const struct {
		dg_fmt f;
		bool token;
	} fmts[] = { { DG_FMT_BF16, false }, { DG_FMT_UINT8POS, true }, { DG_FMT_UINT8POS, false },
		     { DG_FMT_INT8, true } };
	dg_codegen *cg = nh_codegen();

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int k = 0; k < 4; k++)
			for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
				/* the BDH shape on every tile, the small ones on two each */
				if (i > 0 && k % 2 != (int)(i + f) % 2)
					continue;
				dg_spec s = dgw_wg_spec(shapes[i][0], shapes[i][1], shapes[i][2], fmts[f].f,
							fmts[f].token);
				s.tile = tiles[k];
				expect_plan_path(cg, &s, "wgmma bf16", true);
				compile_on_path(cg, &s, "path: warpgroup tensor cores");
				dg_source *src = NULL;
				cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
				/* the gradient's bf16 copy (the module's _cast) staged
				 * as read; a scale a token into B's rows, one a tensor on
				 * the sum (and the reduce) */
				cr_assert(strstr(src->text, "dg_decoder_grad_weight_cast(const float *"));
				cr_assert(strstr(src->text, "ra[s] = __ldg((const uint4 *)(ar[s % KR] + m));"));
				cr_assert(src->n_entries == 3 && strcmp(src->entries[2], "dg_decoder_grad_weight_cast") == 0,
					  "%d entries", src->n_entries);
				bool token = fmts[f].token, code = fmts[f].f != DG_FMT_BF16;
				cr_assert_eq(strstr(src->text, "rs[j] = k < K ? dg_b_scale(sa, k, h, T)") != NULL, token);
				cr_assert_eq(strstr(src->text, "__fmul_rn(c0, s)") != NULL, code && !token);
				cr_assert_eq(strstr(src->text, "sum.x = __fmul_rn(sum.x, s);") != NULL, code && !token);
				dg_source_destroy(src);
			}
	dg_codegen_destroy(cg);
}

/* The default tile and its plan (at E % 256 == 0 256x128x64/16x1/3, every
 * d in one block; else BN 256 past 4096 neurons a head, else 128, two
 * stages, 97 KiB at BN 256; three entries), the
 * promotion of an sm_90 spec by plan_for, and what stays on mma.sync: an
 * f32 / int4 y, embd or latent not a multiple of 8, a non-warpgroup tile,
 * sm_90 without a. */
Test(nvrtc_grad, wgmma_decoder_grad_weight_defaults_and_mma_fallback)
{
	dg_codegen *cg = nh_codegen();
	dg_plan p;

	for (int f = 0; f < 2; f++) {
		dg_spec s = dgw_wg_spec(4, 256, 8192, f ? DG_FMT_UINT8POS : DG_FMT_BF16, f == 1);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "wgmma bf16");
		cr_assert(p.needs_arch_specific);
		cr_assert(strstr(p.canonical, "tile=256x128x64/16x1/3;"), "%s", p.canonical);
		cr_assert_eq(p.n_entries, 3);
		cr_assert_str_eq(p.entries[1].name, "dg_decoder_grad_weight_reduce");
		cr_assert_str_eq(p.entries[2].name, "dg_decoder_grad_weight_cast");
		cr_assert_eq(p.entries[0].threads, 512);
		cr_assert_eq(p.entries[0].smem, 3 * (256 + 128) * 64 * 2 + 1024);
		compile_on_path(cg, &s, "path: warpgroup tensor cores");
		/* E 128 (not a multiple of 256): 128 rows, BN 256 past 4096
		 * neurons a head, 128 at 4096 and fewer */
		dg_spec s8 = dgw_wg_spec(4, 128, 8192, f ? DG_FMT_UINT8POS : DG_FMT_BF16, f == 1);
		cr_assert_eq(dg_codegen_plan(cg, &s8, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert(strstr(p.canonical, "tile=128x256x64/8x1/2;"), "%s", p.canonical);
		cr_assert_eq(p.entries[0].threads, 256);
		cr_assert_eq(p.entries[0].smem, 2 * (128 + 256) * 64 * 2 + 1024);
		dg_spec s4 = dgw_wg_spec(4, 128, 4096, f ? DG_FMT_UINT8POS : DG_FMT_BF16, f == 1);
		cr_assert_eq(dg_codegen_plan(cg, &s4, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert(strstr(p.canonical, "tile=128x128x64/8x1/2;"), "%s", p.canonical);
		cr_assert_eq(p.entries[0].smem, 2 * (128 + 128) * 64 * 2 + 1024);
		/* sm_90 (no a): mma.sync; plan_for on an sm_90 device promotes it */
		s.arch_specific = false;
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "wgmma bf16");
		cr_assert(p.spec.arch_specific && p.needs_arch_specific);
		/* a non-warpgroup tile on the sm_90a spec: mma.sync */
		s.arch_specific = true;
		s.tile = (dg_tile){ 128, 128, 32, 2, 2, 4, 0 };
		expect_plan_path(cg, &s, "mma.sync bf16", false);
		compile_on_path(cg, &s, "path: tensor cores");
	}
	/* y f32 or int4: mma.sync (f32: the operand would be rounded; int4 is
	 * no preset's decoder activation) */
	dg_spec s = dgw_wg_spec(4, 256, 8192, DG_FMT_F32, false);
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	s = dgw_wg_spec(4, 256, 8192, DG_FMT_INT4, true);
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	/* embd 36 / latent 100: not whole 8-value chunks, mma.sync */
	s = dgw_wg_spec(2, 36, 96, DG_FMT_UINT8POS, true);
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	s = dgw_wg_spec(2, 40, 100, DG_FMT_BF16, false);
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	/* a ring of 1 stage is not the path's; 5 stages at BN 256 is no
	 * tile's (the warp-specialized form's ring would not fit) */
	s = dgw_wg_spec(4, 256, 8192, DG_FMT_UINT8POS, true);
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 1, 0 };
	expect_plan_path(cg, &s, "mma.sync bf16", false);
	s.tile = (dg_tile){ 128, 256, 64, 8, 1, 5, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	dg_codegen_destroy(cg);
}

/* The warp-specialized form (tiles of 5 to 8 stages, BN 64 or 128): every
 * y format at the BDH shape and a small ragged one renders and compiles
 * for sm_90a on path "wgmma tma" with three entries (the kernel, the
 * reduce, the gradient's cast), a producer warpgroup more a block, and
 * shared memory within the block's (bf16 y's wider raw slots fewer); the
 * source loads A by TMA from the copy and decodes y's chunks from its raw
 * slots (a scale a token folded in there). */
Test(nvrtc_grad, wgmma_tma_decoder_grad_weight_tiles_and_formats)
{
	static const dg_tile tiles[] = {
		{ 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 }, { 64, 128, 64, 4, 1, 8, 0 },
		{ 128, 64, 64, 8, 1, 8, 0 },
	};
	static const int shapes[][3] = { { 4, 256, 8192 }, { 2, 40, 200 } };
	static const struct {
		dg_fmt f;
		bool token;
	} fmts[] = { { DG_FMT_BF16, false }, { DG_FMT_UINT8POS, true }, { DG_FMT_INT8, false } };
	static const char *const ens[] = { "dg_decoder_grad_weight", "dg_decoder_grad_weight_reduce",
					   "dg_decoder_grad_weight_cast" };
	dg_codegen *cg = nh_codegen();
	for (size_t i = 0; i < 2; i++)
		for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++)
			for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
				if (i > 0 && (k + f) % 2)
					continue;
				dg_spec s = dgw_wg_spec(shapes[i][0], shapes[i][1], shapes[i][2], fmts[f].f, fmts[f].token);
				s.tile = tiles[k];
				dg_plan p;
				cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
				cr_assert_str_eq(p.path, "wgmma tma", "%s", p.canonical);
				cr_assert_eq(p.n_entries, 3, "%s", p.canonical);
				for (int e = 0; e < 3; e++)
					cr_assert_str_eq(p.entries[e].name, ens[e], "%s", p.canonical);
				cr_assert_eq(p.entries[0].threads, tiles[k].wm * 32 + 128, "%s", p.canonical);
				cr_assert_leq(p.entries[0].smem, 227 * 1024, "%s", p.canonical);
				cr_assert_gt(p.entries[0].smem, tiles[k].stages * (tiles[k].bm + tiles[k].bn) * 64 * 2,
					     "%s: the ring and the raw slots", p.canonical);
				compile_one(cg, &s, ens, 3);
				dg_source *src = NULL;
				cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
				cr_assert(strstr(src->text, "dg_tma_load(as + 8192 * gg, &ma, full, m0 + 64 * gg, t, b)"));
				cr_assert(strstr(src->text, "dg_cp_wait<R - 1>()"));
				cr_assert_eq(strstr(src->text, "dg_cp4(sslot + j * 4, sa + k)") != NULL, fmts[f].token);
				cr_assert_eq(strstr(src->text, "__fmul_rn(c0, s)") != NULL,
					     fmts[f].f != DG_FMT_BF16 && !fmts[f].token);
				dg_source_destroy(src);
			}
	dg_codegen_destroy(cg);
}

/* --- lowrank_grad_input's K split (templates/grad_mma.lua M.GI_SPLIT) --- */

/* Whether the n bytes at p hold the NUL-terminated name (a symbol's). */
static bool image_has(const uint8_t *p, size_t n, const char *name)
{
	size_t len = strlen(name) + 1;
	for (size_t i = 0; i + len <= n; i++)
		if (memcmp(p + i, name, len) == 0)
			return true;
	return false;
}

/* Renders s (on `path`), checks the split's ABI in the source — the
 * kernel's splits and kt_per_split, grid z as split·Hin + input head, the
 * reduce entry's signature, a per-tensor scale (scaled) on grad_x and in
 * the reduce and on no partial — then compiles it for s's arch and finds
 * both entries in the cubin. */
static void expect_split_kernel(dg_codegen *cg, const dg_spec *s, const char *path, bool scaled)
{
	char text[DG_SPEC_TEXT_MAX], e[8192];
	dg_source *src = NULL;
	dg__nvrtc_target t;
	dg__nvrtc_result res;

	dg_spec_to_string(s, text, sizeof(text));
	cr_assert_eq(dg_codegen_render(cg, s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_eq(src->n_entries, 2, "%s: %d entries", text, src->n_entries);
	cr_assert_str_eq(src->entries[0], "dg_lowrank_grad_input", "%s", text);
	cr_assert_str_eq(src->entries[1], "dg_lowrank_grad_input_reduce", "%s", text);
	static const char *const always[] = {
		"float *__restrict__ dst, int B, int T, int splits, int kt_per_split",
		"const int z = blockIdx.z % HIN, sp = blockIdx.z / HIN;",
		"const int k_begin = min(sp * kt_per_split, KT);",
		"float *const out = splits == 1 ? dst : dst + (long long)sp * M * HIN * E;",
		"dg_lowrank_grad_input_reduce(const float *__restrict__ part, int splits, const float *__restrict__ sw,\n"
		"\t\tfloat *__restrict__ grad_x, int B, int T)",
		"(part + (long long)q * NX)",
	};
	for (size_t i = 0; i < sizeof(always) / sizeof(always[0]); i++)
		cr_assert(strstr(src->text, always[i]), "%s: '%s' not in the source", text, always[i]);
	cr_assert(strstr(src->text, path), "%s: expected '%s' in the banner", text, path);
	cr_assert_eq(strstr(src->text, "const float s = splits == 1 ? *sw : 1.0f;") != NULL, scaled,
		     "%s: grad_x's scale %s", text, scaled ? "missing" : "applied to a float operand");
	cr_assert_eq(strstr(src->text, "sum.x = __fmul_rn(sum.x, s);") != NULL, scaled,
		     "%s: the reduce's scale %s", text, scaled ? "missing" : "applied to a float operand");
	cr_assert_eq(dg__nvrtc_target_for(s->arch, s->arch_specific, &t, e, sizeof(e)), DG_OK, "%s", e);
	cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s", text, e);
	cr_assert_eq(dg_cubin_check(res.image, res.size, t.arch, e, sizeof(e)), DG_OK, "%s: %s", text, e);
	cr_assert(image_has(res.image, res.size, "dg_lowrank_grad_input"), "%s: no kernel in the cubin", text);
	cr_assert(image_has(res.image, res.size, "dg_lowrank_grad_input_reduce"), "%s: no reduce in the cubin", text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

/* Every path of lowrank_grad_input takes the split and has the reduce:
 * the warpgroup path for sm_90a (its default tile, in_heads 1 and H), the
 * mma.sync path for sm_80 (int8 a tensor, scaled once at the end; a channel,
 * scaled as B is staged; ternary; f32; a bf16 gradient) and the SIMT path
 * for sm_80 (BK 8). */
Test(nvrtc_grad, lowrank_grad_input_split_every_path)
{
	dg_codegen *cg = nh_codegen();

	for (int hin = 0; hin < 2; hin++) {
		dg_spec s = wg_spec(DG_OP_LOWRANK_GRAD_INPUT, 4, hin ? 4 : 1, 256, 8192);
		dg_spec_normalize(&s);
		expect_split_kernel(cg, &s, "path: warp-specialized warpgroup tensor cores", false);
		/* and the cp.async ring's tile */
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 };
		expect_split_kernel(cg, &s, "path: warpgroup tensor cores", false);
	}
	static const struct {
		dg_fmt w, src;
		dg_scale_gran ws;
		bool scaled;
	} mma[] = {
		{ DG_FMT_INT8, DG_FMT_F32, DG_SCALE_TENSOR, true },
		{ DG_FMT_INT8, DG_FMT_F32, DG_SCALE_CHANNEL, false },
		{ DG_FMT_TERNARY, DG_FMT_F32, DG_SCALE_TENSOR, true },
		{ DG_FMT_F32, DG_FMT_F32, DG_SCALE_TENSOR, false },
		{ DG_FMT_TERNARY, DG_FMT_BF16, DG_SCALE_TENSOR, true },
	};
	for (size_t i = 0; i < sizeof(mma) / sizeof(mma[0]); i++) {
		dg_spec s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
		s.arch = 80;
		s.weight = mma[i].w;
		s.src = mma[i].src;
		s.wscale = mma[i].ws;
		s.in_heads = i % 2 ? s.heads : 1;
		dg_spec_normalize(&s);
		expect_split_kernel(cg, &s, "path: tensor cores", mma[i].scaled);
	}
	dg_spec s = bdh(DG_OP_LOWRANK_GRAD_INPUT);
	s.arch = 80;
	s.tile = (dg_tile){ 64, 64, 8, 2, 2, 2, 0 };
	dg_spec_normalize(&s);
	expect_split_kernel(cg, &s, "path: fp32 FMA", true);
	dg_codegen_destroy(cg);
}
