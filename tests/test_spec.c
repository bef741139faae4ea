/*
 * Spec: defaults, canonical text round trip, and every validation error
 * naming its field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/spec.h"

static char msg[512];

static dg_spec parsed(const char *text)
{
	dg_spec s;
	dg_status st = dg_spec_parse(text, &s, msg, sizeof(msg));
	cr_assert_eq(st, DG_OK, "parse '%s': %s", text, msg);
	return s;
}

static const char *canon(const dg_spec *s)
{
	static char buf[DG_SPEC_TEXT_MAX];
	cr_assert_eq(dg_spec_to_string(s, buf, sizeof(buf)), DG_OK);
	return buf;
}

/* Expects text to be refused and the message to contain want. */
static void refused(const char *text, const char *want)
{
	dg_spec s;
	memset(&s, 0x5a, sizeof(s));
	dg_spec before = s;
	msg[0] = '\0';
	dg_status st = dg_spec_parse(text, &s, msg, sizeof(msg));
	cr_assert_eq(st, DG_ERR_INVALID_SPEC, "'%s' was accepted", text);
	cr_assert(strstr(msg, want), "'%s': message '%s' lacks '%s'", text, msg,
		  want);
	cr_assert(memcmp(&s, &before, sizeof(s)) == 0,
		  "'%s': output touched on failure", text);
}

Test(spec, default_canonical_text)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	cr_assert_str_eq(canon(&s),
			 "act=int8;arch=sm_90;embd=256;heads=4;in_heads=1;latent=8192;"
			 "op=lowrank_fwd;out=int8;relu=none;tile=auto;weight=int8;");
	cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s", msg);
}

Test(spec, canonical_holds_only_the_keys_the_op_reads)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	cr_assert_str_eq(canon(&s), "act=int8;arch=sm_90;op=quantize_act;src=f32;tile=auto;");
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	cr_assert_str_eq(canon(&s), "arch=sm_90;embd=256;latent=8192;op=pack_i8x4;tile=auto;");
}

Test(spec, round_trip_every_lowrank_combination)
{
	const char *w[] = { "f32", "bf16", "int8", "ternary", "sign1" };
	const char *a[] = { "f32", "bf16", "int8", "int4", "uint8pos" };
	const char *o[] = { "f32", "bf16", "int8", "uint8pos" };
	const char *r[] = { "none", "0", "0.25", "-1.5", "1e-07", "0.1" };
	int n = 0;
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < 5; j++)
			for (int k = 0; k < 4; k++)
				for (int l = 0; l < 6; l++) {
					char text[256];
					snprintf(text, sizeof(text),
						 "op=lowrank_fwd;weight=%s;act=%s;out=%s;relu=%s;embd=512",
						 w[i], a[j], o[k], r[l]);
					dg_spec s;
					dg_status st = dg_spec_parse(text, &s, msg, sizeof(msg));
					if (k == 3 && l == 0) {
						cr_assert_eq(st, DG_ERR_INVALID_SPEC);
						continue;
					}
					cr_assert_eq(st, DG_OK, "%s: %s", text, msg);
					char c1[DG_SPEC_TEXT_MAX];
					strcpy(c1, canon(&s));
					dg_spec t = parsed(c1);
					cr_assert_str_eq(canon(&t), c1);
					cr_assert(memcmp(&s, &t, sizeof(s)) == 0,
						  "struct differs after round trip of %s", c1);
					n++;
				}
	cr_assert_eq(n, 5 * 5 * 4 * 6 - 5 * 5);
}

Test(spec, thresholds_round_trip_exactly)
{
	/* Random floats, including awkward ones, keep every bit. */
	srand(12345);
	for (int i = 0; i < 2000; i++) {
		union { unsigned u; float f; } v;
		v.u = ((unsigned)rand() << 16) ^ (unsigned)rand();
		if (!isfinite(v.f))
			continue;
		dg_spec s;
		dg_spec_init(&s, DG_OP_LOWRANK_FWD);
		s.relu = true;
		s.relu_thr = v.f;
		char c[DG_SPEC_TEXT_MAX];
		strcpy(c, canon(&s));
		dg_spec t = parsed(c);
		float want = v.f == 0.0f ? 0.0f : v.f;
		cr_assert(memcmp(&t.relu_thr, &want, sizeof(float)) == 0,
			  "%a → %s → %a", (double)v.f, c, (double)t.relu_thr);
	}
}

Test(spec, shortest_threshold_text)
{
	dg_spec s = parsed("op=lowrank_fwd;relu=0.1");
	cr_assert(strstr(canon(&s), "relu=0.1;"), "%s", canon(&s));
	s = parsed("op=lowrank_fwd;relu=-0");
	cr_assert(strstr(canon(&s), "relu=0;"), "-0 must print as 0: %s", canon(&s));
	s = parsed("op=lowrank_fwd;relu=0x1p-2");
	cr_assert(strstr(canon(&s), "relu=0.25;"), "%s", canon(&s));
}

Test(spec, parse_is_order_and_space_insensitive)
{
	dg_spec a = parsed("op=lowrank_fwd;weight=ternary;relu=0;latent=512;");
	dg_spec b = parsed("  latent = 512 ; relu=0;weight=ternary ; op=lowrank_fwd");
	cr_assert(dg_spec_equal(&a, &b));
	cr_assert_str_eq(canon(&a), canon(&b));
}

Test(spec, tile_forms)
{
	dg_spec s = parsed("op=lowrank_fwd;tile=128x64x32/4x2/2");
	cr_assert_eq(s.tile.bm, 128);
	cr_assert_eq(s.tile.bn, 64);
	cr_assert_eq(s.tile.bk, 32);
	cr_assert_eq(s.tile.wm, 4);
	cr_assert_eq(s.tile.wn, 2);
	cr_assert_eq(s.tile.stages, 2);
	cr_assert(strstr(canon(&s), "tile=128x64x32/4x2/2;"));
	s = parsed("op=quantize_act;tile=t512");
	cr_assert_eq(s.tile.threads, 512);
	cr_assert(strstr(canon(&s), "tile=t512;"));
}

Test(spec, default_tile_is_valid_for_every_format)
{
	const dg_fmt w[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
	const dg_fmt a[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	const int embd[] = { 32, 64, 96, 256, 4096 };
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < 5; j++)
			for (int e = 0; e < 5; e++) {
				dg_spec s;
				dg_spec_init(&s, DG_OP_LOWRANK_FWD);
				s.weight = w[i];
				s.act = a[j];
				s.embd = embd[e];
				if (dg_spec_validate(&s, msg, sizeof(msg)))
					continue; /* e.g. embd=96 with sign1 */
				dg_spec_default_tile(&s, &s.tile);
				cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK,
					     "default tile for %s: %s", canon(&s), msg);
			}
}

Test(spec, validation_names_the_field)
{
	refused("op=lowrank_fwd;latent=8190", "latent=8190: must be a multiple of 4");
	refused("op=lowrank_fwd;latent=0", "latent=0");
	refused("op=lowrank_fwd;heads=0", "heads=0");
	refused("op=lowrank_fwd;heads=65", "heads=65");
	refused("op=lowrank_fwd;heads=4;in_heads=3", "in_heads=3");
	refused("op=lowrank_fwd;embd=6", "embd=6: must be a multiple of 4");
	refused("op=lowrank_fwd;embd=48;weight=sign1", "embd=48: weight=sign1");
	refused("op=lowrank_fwd;embd=40;weight=ternary", "multiple of 16");
	refused("op=lowrank_fwd;weight=int3", "weight=int3: must be one of f32|bf16|int8|ternary|sign1");
	refused("op=lowrank_fwd;weight=int4", "weight=int4");
	refused("op=lowrank_fwd;act=sign1", "act=sign1");
	refused("op=lowrank_fwd;out=ternary", "out=ternary");
	refused("op=lowrank_fwd;out=uint8pos", "out=uint8pos: needs relu");
	refused("op=lowrank_fwd;relu=nan", "relu=nan");
	refused("op=lowrank_fwd;relu=inf", "relu=inf");
	refused("op=lowrank_fwd;relu=1e99", "relu=1e99");
	refused("op=lowrank_fwd;relu=", "relu=");
	refused("op=lowrank_fwd;relu=0.5x", "relu=0.5x");
	refused("op=lowrank_fwd;arch=sm_20", "arch=sm_20: must be between sm_50 and sm_999");
	cr_assert_eq(parsed("op=lowrank_fwd;arch=sm_200").arch, 200);
	refused("op=lowrank_fwd;arch=sm_80a", "arch-specific");
	refused("op=lowrank_fwd;arch=gfx90", "arch=gfx90");
	refused("op=quantize_act;act=f32", "act=f32: op quantize_act takes one of int8|int4|uint8pos");
	refused("op=quantize_act;src=int8", "src=int8");
	refused("op=quantize_act;weight=int8", "weight: op quantize_act does not take it");
	refused("op=lowrank_fwd;heads=-4", "heads=-4");
	refused("op=lowrank_fwd;heads=4x", "heads=4x");
	refused("op=lowrank_fwd;heads=99999999999", "heads=99999999999");
	refused("op=lowrank_fwd;colour=red", "colour: unknown key");
	refused("op=lowrank_fwd;heads=4;heads=4", "heads: given twice");
	refused("weight=int8", "op is missing");
	refused("op=conv2d", "op=conv2d: unknown");
	refused("op=lowrank_fwd;garbage", "'garbage': expected key=value");
	refused("op=lowrank_fwd;=3", "missing key");
	refused("", "op is missing");
}

Test(spec, tile_validation)
{
	refused("op=lowrank_fwd;tile=7x7", "tile=7x7: must be auto");
	refused("op=lowrank_fwd;tile=48x64x64/2x2/2", "BM and BN must be powers of two");
	refused("op=lowrank_fwd;tile=64x64x64/2x2/2;embd=96", "BK=64 must divide embd=96");
	refused("op=lowrank_fwd;tile=64x64x16/2x2/2;weight=sign1", "BK must be a multiple of 32");
	refused("op=lowrank_fwd;tile=64x64x64/3x2/2", "WM and WN");
	refused("op=lowrank_fwd;tile=256x256x64/1x1/2", "outputs per thread");
	refused("op=lowrank_fwd;tile=128x128x128/4x4/2;weight=f32;act=f32", "shared memory");
	refused("op=lowrank_fwd;relu=1e-60", "relu=1e-60");
	refused("op=lowrank_fwd;tile=64x64x64/2x2/5", "stages");
	refused("op=lowrank_fwd;tile=t256", "takes a block tile");
	refused("op=quantize_act;tile=64x64x64/2x2/2", "takes a thread count");
	refused("op=quantize_act;tile=t100", "multiple of 32");
	refused("op=pack_i8x4;tile=t2048", "between 32 and 1024");
}

Test(spec, null_and_small_buffers)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	char tiny[8];
	cr_assert_eq(dg_spec_to_string(&s, tiny, sizeof(tiny)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_spec_parse(NULL, &s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert_eq(dg_spec_validate(NULL, NULL, 0), DG_ERR_INVALID_SPEC);
	/* msg may be NULL */
	cr_assert_eq(dg_spec_parse("op=nope", &s, NULL, 0), DG_ERR_INVALID_SPEC);
}

Test(spec, set_and_normalize)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.weight = DG_FMT_TERNARY; /* not read by quantize_act */
	s.heads = 9;
	dg_spec t;
	dg_spec_init(&t, DG_OP_QUANTIZE_ACT);
	cr_assert(dg_spec_equal(&s, &t), "unused fields must not matter");
	cr_assert_eq(dg_spec_set(&s, "act", "uint8pos", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(s.act, DG_FMT_UINT8POS);
	cr_assert_eq(dg_spec_set(&s, "latent", "64", msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "does not take it"));
	cr_assert_eq(dg_spec_set(&s, "op", "lowrank_fwd", msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_spec_set(&s, "arch", "sm_90a", msg, sizeof(msg)), DG_OK);
	cr_assert(s.arch == 90 && s.arch_specific);
}

Test(spec, names)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_op op;
		cr_assert(dg_op_from_name(dg_op_name((dg_op)i), &op));
		cr_assert_eq(op, (dg_op)i);
	}
	for (int i = 0; i < DG_FMT__COUNT; i++) {
		dg_fmt f;
		cr_assert(dg_fmt_from_name(dg_fmt_name((dg_fmt)i), &f));
		cr_assert_eq(f, (dg_fmt)i);
	}
	dg_op op;
	cr_assert_not(dg_op_from_name("LOWRANK_FWD", &op));
	cr_assert_not(dg_op_from_name(NULL, &op));
}
