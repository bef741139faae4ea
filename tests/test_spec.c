/*
 * Spec: defaults, canonical text round trip, and what the parser and
 * dg_spec_validate own: the fields each op reads, the formats each field
 * takes and the packing of its axes (all from the op table), the tile's
 * syntax and kind. Every refusal names its field. Whether a tile's values
 * can run is the template's rule (test_codegen.c).
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
	/* a thread count with stages (an op that stages its rows: gate_quant) */
	s = parsed("op=gate_quant;tile=t256/1");
	cr_assert_eq(s.tile.threads, 256);
	cr_assert_eq(s.tile.stages, 1);
	cr_assert(strstr(canon(&s), "tile=t256/1;"), "%s", canon(&s));
	cr_assert_eq(parsed(canon(&s)).tile.stages, 1, "round trip");
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
	refused("op=lowrank_fwd;weight=int3", "weight=int3: op lowrank_fwd takes one of f32|bf16|int8|ternary|sign1");
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

/* The parser and validation own the tile's syntax and kind only; whether a
 * tile's values can run is the template's (test_codegen.c, plan_refuses_*). */
Test(spec, tile_syntax_and_kind)
{
	refused("op=lowrank_fwd;tile=7x7", "tile=7x7: must be auto");
	refused("op=lowrank_fwd;tile=64x64x64/0x2/2", "tile=64x64x64/0x2/2: must be auto");
	refused("op=lowrank_fwd;tile=64x64x64/2x2/2x", "must be auto");
	refused("op=lowrank_fwd;tile=t", "tile=t: must be auto");
	refused("op=gate_quant;tile=t256/", "tile=t256/: must be auto");
	refused("op=gate_quant;tile=t256/0", "tile=t256/0: must be auto");
	refused("op=gate_quant;tile=t/1", "tile=t/1: must be auto");
	refused("op=gate_quant;tile=t256/1/2", "tile=t256/1/2: must be auto");
	refused("op=gate_quant;tile=t256/65", "tile=t256/65: must be auto");
	refused("op=lowrank_fwd;tile=t256/1", "takes a block tile");
	refused("op=lowrank_fwd;relu=1e-60", "relu=1e-60");
	refused("op=lowrank_fwd;tile=t256", "takes a block tile");
	refused("op=quantize_act;tile=64x64x64/2x2/2", "takes a thread count");
	/* values a template refuses still parse: the plan judges them */
	cr_assert_eq(parsed("op=lowrank_fwd;tile=48x64x64/2x2/2").tile.bm, 48);
	cr_assert_eq(parsed("op=quantize_act;tile=t100").tile.threads, 100);
	cr_assert_eq(parsed("op=pack_i8x4;tile=t2048").tile.threads, 2048);
	/* the kind is the op table's, for every op */
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *row = dg_op_info_of((dg_op)i);
		dg_spec s;
		dg_spec_init(&s, (dg_op)i);
		if (!(row->fields & DG_FIELD_TILE))
			continue;
		dg_tile gemm = { 64, 64, 64, 2, 2, 2, 0 }, thr = { .threads = 256 };
		s.tile = row->tile == DG_TILE_GEMM ? thr : gemm;
		cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC,
			     "%s took the other tile kind", dg_op_name((dg_op)i));
		cr_assert(strstr(msg, row->tile == DG_TILE_GEMM ? "takes a block tile" : "takes a thread count"),
			  "%s: %s", dg_op_name((dg_op)i), msg);
		s.tile = row->tile == DG_TILE_GEMM ? gemm : thr;
		cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s: %s",
			     dg_op_name((dg_op)i), msg);
	}
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

/* ---- what the op table says, the parser and validation enforce -------------- */

static const struct {
	const char *key;
	dg_field field;
	const char *value; /* a valid value for the default spec */
} keys[] = {
	{ "act", DG_FIELD_ACT, "int8" },      { "arch", DG_FIELD_ARCH, "sm_80" },
	{ "embd", DG_FIELD_EMBD, "512" },     { "heads", DG_FIELD_HEADS, "4" },
	{ "in_heads", DG_FIELD_IN_HEADS, "1" }, { "latent", DG_FIELD_LATENT, "256" },
	{ "out", DG_FIELD_OUT, "f32" },       { "relu", DG_FIELD_RELU, "0.5" },
	{ "src", DG_FIELD_SRC, "bf16" },      { "tile", DG_FIELD_TILE, "auto" },
	{ "vocab", DG_FIELD_VOCAB, "300" },   { "weight", DG_FIELD_WEIGHT, "int8" },
	{ "chunk", DG_FIELD_CHUNK, "128" },
};

/* Every key an op reads parses; every other key is refused by name, and
 * the canonical text holds exactly the keys the op reads. */
Test(spec, each_op_takes_exactly_its_fields)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_op op = (dg_op)i;
		const dg_op_info *row = dg_op_info_of(op);
		cr_assert_eq(dg_spec_uses(op), row->fields);
		dg_spec d;
		dg_spec_init(&d, op);
		char c[DG_SPEC_TEXT_MAX]; /* canon's buffer is reused below */
		snprintf(c, sizeof(c), "%s", canon(&d));
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
			char text[128], key_eq[32];
			snprintf(key_eq, sizeof(key_eq), "%s=", keys[k].key);
			const char *v = keys[k].value;
			/* a value the op takes: its own default format for format keys */
			if (keys[k].field == DG_FIELD_OUT)
				v = dg_fmt_name(d.out);
			else if (keys[k].field == DG_FIELD_ACT)
				v = dg_fmt_name(d.act);
			else if (keys[k].field == DG_FIELD_WEIGHT)
				v = dg_fmt_name(d.weight);
			snprintf(text, sizeof(text), "op=%s;%s=%s", dg_op_name(op), keys[k].key, v);
			bool reads = row->fields & keys[k].field;
			/* a leading "key=" or ";key=" in the canonical text */
			char semi[40];
			snprintf(semi, sizeof(semi), ";%s", key_eq);
			bool in_text = strncmp(c, key_eq, strlen(key_eq)) == 0 || strstr(c, semi);
			/* a quiet field (dg_op_info.quiet: the gradient formats) is
			 * named only off its default */
			bool quiet = (row->quiet & keys[k].field) != 0;
			cr_assert_eq(in_text, reads && !quiet, "%s: canonical %s and the op table disagree on %s",
				     dg_op_name(op), c, keys[k].key);
			if (quiet) {
				cr_assert(reads, "%s: quiet %s, a field it does not read", dg_op_name(op), keys[k].key);
				dg_spec q = d;
				if (keys[k].field == DG_FIELD_OUT)
					q.out = DG_FMT_BF16;
				else
					q.src = DG_FMT_BF16;
				cr_assert_neq(keys[k].field == DG_FIELD_OUT ? d.out : d.src, DG_FMT_BF16);
				cr_assert_eq(dg_spec_validate(&q, NULL, 0), DG_OK);
				char bf[40];
				snprintf(bf, sizeof(bf), ";%sbf16;", key_eq);
				cr_assert(strstr(canon(&q), bf), "%s: %s off its default, not named: %s", dg_op_name(op),
					  keys[k].key, canon(&q));
			}
			if (reads) {
				parsed(text);
			} else {
				char want[96];
				snprintf(want, sizeof(want), "%s: op %s does not take it", keys[k].key,
					 dg_op_name(op));
				refused(text, want);
			}
		}
	}
}

static const char *const fmt_keys[] = { "weight", "act", "out", "src" };
static const dg_field fmt_fields[] = { DG_FIELD_WEIGHT, DG_FIELD_ACT, DG_FIELD_OUT, DG_FIELD_SRC };

static unsigned row_fmts(const dg_op_info *row, dg_field f)
{
	return f == DG_FIELD_WEIGHT ? row->weight_fmts
	       : f == DG_FIELD_ACT  ? row->act_fmts
	       : f == DG_FIELD_OUT  ? row->out_fmts
				    : row->src_fmts;
}

static void set_fmt(dg_spec *s, dg_field f, dg_fmt v)
{
	if (f == DG_FIELD_WEIGHT)
		s->weight = v;
	else if (f == DG_FIELD_ACT)
		s->act = v;
	else if (f == DG_FIELD_OUT)
		s->out = v;
	else
		s->src = v;
}

/* Each format field of each op takes exactly the op table's formats, in
 * the parser and in dg_spec_validate, and a refusal lists them. */
Test(spec, formats_per_op_are_the_op_tables)
{
	int accepted = 0, refusals = 0;
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_op op = (dg_op)i;
		const dg_op_info *row = dg_op_info_of(op);
		for (int k = 0; k < 4; k++) {
			unsigned mask = row_fmts(row, fmt_fields[k]);
			cr_assert_eq(mask != 0, (row->fields & fmt_fields[k]) != 0,
				     "%s: %s formats given for a field it does not read, or none for one it does",
				     dg_op_name(op), fmt_keys[k]);
			if (!mask)
				continue;
			char list[96];
			dg_fmt_list(mask, list, sizeof(list));
			for (int f = 0; f < DG_FMT__COUNT; f++) {
				char text[128];
				/* uint8pos outputs need relu; give every op that reads relu one */
				snprintf(text, sizeof(text), "op=%s;%s=%s%s", dg_op_name(op), fmt_keys[k],
					 dg_fmt_name((dg_fmt)f), (row->fields & DG_FIELD_RELU) ? ";relu=0" : "");
				dg_spec s;
				dg_spec_init(&s, op);
				s.relu = (row->fields & DG_FIELD_RELU) != 0;
				/* the packing of a wide format must fit: embd and latent are 256, 8192 */
				set_fmt(&s, fmt_fields[k], (dg_fmt)f);
				if (mask & DG_FMT_BIT(f)) {
					dg_spec p = parsed(text);
					cr_assert(dg_spec_equal(&p, &s), "%s", text);
					cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s: %s",
						     text, msg);
					accepted++;
				} else {
					char want[160];
					snprintf(want, sizeof(want), "%s=%s: op %s takes one of %s", fmt_keys[k],
						 dg_fmt_name((dg_fmt)f), dg_op_name(op), list);
					refused(text, want);
					cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC,
						     "validate took %s", text);
					cr_assert(strstr(msg, want), "validate: '%s' lacks '%s'", msg, want);
					refusals++;
				}
			}
		}
	}
	/* lowrank_fwd alone: 5 weights, 5 acts, 4 outs */
	cr_assert_gt(accepted, 14);
	cr_assert_gt(refusals, 20);
}

/* A weight packed along embd or latent must fill whole words of its
 * format; pack_ternary and pack_sign1 pack along embd whatever the spec's
 * weight says. */
Test(spec, packing_rules)
{
	refused("op=pack_ternary;embd=8", "embd=8: op=pack_ternary packs 16 codes a word along embd");
	refused("op=pack_sign1;embd=48", "embd=48: op=pack_sign1 packs 32 codes a word along embd");
	parsed("op=pack_ternary;embd=16");
	parsed("op=pack_sign1;embd=32");
	refused("op=decoder_fwd;weight=ternary;latent=8200", "latent=8200: weight=ternary packs 16");
	refused("op=decoder_grad_input;weight=sign1;latent=8208", "latent=8208: weight=sign1 packs 32");
	refused("op=lowrank_grad_input;weight=sign1;embd=272", "embd=272: weight=sign1 packs 32");
	/* the weight's axis only: decoder packs latent, so embd needs only 4 */
	parsed("op=decoder_fwd;weight=sign1;embd=12");
	parsed("op=lowrank_fwd;weight=sign1;latent=12");
	/* i8x4 ops pack four along embd; pack_i8x4's latent is free */
	refused("op=pack_i8x4;embd=6", "embd=6: must be a multiple of 4");
	parsed("op=pack_i8x4;latent=7");
	refused("op=lowrank_fwd;latent=7", "latent=7: must be a multiple of 4");
	/* every op's rule, from the op table, on the validator */
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *row = dg_op_info_of((dg_op)i);
		for (int f = 0; f < DG_FMT__COUNT; f++) {
			int per = dg_fmt_per_word((dg_fmt)f);
			bool packs = row->weight_axis && (row->weight_fmts & DG_FMT_BIT(f));
			bool op_packs = row->pack_fmt == (dg_fmt)f;
			if ((!packs && !op_packs) || per <= 4)
				continue;
			dg_spec s;
			dg_spec_init(&s, (dg_op)i);
			s.relu = row->needs_relu;
			if (packs)
				s.weight = (dg_fmt)f;
			int *len = (packs ? row->weight_axis : DG_FIELD_EMBD) == DG_FIELD_EMBD ? &s.embd
											: &s.latent;
			*len = per * 3;
			cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s %s: %s",
				     dg_op_name((dg_op)i), dg_fmt_name((dg_fmt)f), msg);
			*len = per * 3 + 4;
			cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC,
				     "%s %s accepted %d", dg_op_name((dg_op)i), dg_fmt_name((dg_fmt)f), *len);
			char want[64];
			snprintf(want, sizeof(want), "must be a multiple of %d", per);
			cr_assert(strstr(msg, want), "%s", msg);
		}
	}
}

/* vocab (embed, lmhead_ce): 2..65536, in the canonical text between tile
 * and weight; ops that do not read it refuse it by name. */
Test(spec, vocab_rules)
{
	refused("op=embed_fwd;vocab=1", "vocab=1: must be between 2 and 65536");
	refused("op=lmhead_ce;vocab=65537", "vocab=65537: must be between 2 and 65536");
	refused("op=embed_fwd;vocab=-3", "vocab=-3: must be a positive decimal integer");
	refused("op=layernorm_fwd;vocab=256", "vocab: op layernorm_fwd does not take it");
	cr_assert_eq(parsed("op=embed_bwd;vocab=2").vocab, 2);
	cr_assert_eq(parsed("op=lmhead_ce").vocab, 256, "the BDH byte vocabulary by default");
	dg_spec s = parsed("op=lmhead_ce;vocab=65536;src=bf16");
	cr_assert_str_eq(canon(&s), "arch=sm_90;embd=256;op=lmhead_ce;src=bf16;tile=auto;vocab=65536;weight=f32;");
	refused("op=layernorm_fwd;out=int8", "out=int8: op layernorm_fwd takes one of f32|bf16");
	refused("op=embed_fwd;out=i32", "out=i32: op embed_fwd takes one of f32|bf16");
}

/* rope= (attention_scores, attention_grad_xs): load is the default and
 * not printed, so the texts (and cache keys) of rope-on-the-load specs
 * are the ones they always were; pre is printed; other ops refuse it. */
Test(spec, rope_rules)
{
	dg_spec s = parsed("op=attention_scores;rope=pre");
	cr_assert(s.rope_pre);
	cr_assert(strstr(canon(&s), ";rope=pre;"), "%s", canon(&s));
	s = parsed("op=attention_grad_xs;rope=load");
	cr_assert(!s.rope_pre);
	cr_assert_null(strstr(canon(&s), "rope="), "%s", canon(&s));
	cr_assert(parsed("op=attention_grad_xs;rope=pre").rope_pre);
	refused("op=attention_scores;rope=yes", "rope=yes: must be load (RoPE on the GEMM's load) or pre");
	refused("op=attention_out;rope=pre", "rope: op attention_out does not take it");
	refused("op=lowrank_fwd;rope=load", "rope: op lowrank_fwd does not take it");
	/* grad_xs's out: f32 by default and then not printed */
	cr_assert_null(strstr(canon(&s), "out="), "%s", canon(&s));
	s = parsed("op=attention_grad_xs;out=bf16");
	cr_assert(strstr(canon(&s), ";out=bf16;"), "%s", canon(&s));
	refused("op=attention_grad_xs;out=int8", "out=int8: op attention_grad_xs takes one of f32|bf16");
}

/* epi= (attention_grad_xs): store is the default and not printed, so
 * the texts (and cache keys) of the grad_xs specs of before keep theirs;
 * mask is printed, in sorted place (after embd, before heads), and reads
 * back; other ops refuse it; a value outside the enum is refused by
 * dg_spec_validate; normalizing another op's spec resets it. */
Test(spec, epi_rules)
{
	dg_spec s = parsed("op=attention_grad_xs;epi=mask;out=bf16;act=bf16;rope=pre;arch=sm_90a");
	cr_assert_eq(s.epi, DG_EPI_MASK);
	cr_assert_str_eq(canon(&s),
			 "act=bf16;arch=sm_90a;epi=mask;heads=4;latent=8192;op=attention_grad_xs;out=bf16;rope=pre;tile=auto;");
	dg_spec back = parsed(canon(&s));
	cr_assert(dg_spec_equal(&back, &s));
	s = parsed("op=attention_grad_xs;epi=store");
	cr_assert_eq(s.epi, DG_EPI_STORE);
	cr_assert_null(strstr(canon(&s), "epi="), "%s", canon(&s));
	dg_spec d;
	dg_spec_init(&d, DG_OP_ATTENTION_GRAD_XS);
	cr_assert(dg_spec_equal(&d, &s), "epi=store is the default");
	refused("op=attention_grad_xs;epi=add", "epi=add: must be store (write the output), mask");
	refused("op=attention_grad_xs;epi=rope", "epi=rope: must be store (write grad_xs) or mask");
	refused("op=lowrank_fwd;epi=mask", "epi=mask: lowrank_fwd's must be store (out alone) or rope");
	s = parsed("op=lowrank_fwd;epi=rope;out=bf16");
	cr_assert_eq(s.epi, DG_EPI_ROPE);
	refused("op=attention_scores;epi=mask", "epi: op attention_scores does not take it");
	refused("op=add_mask;epi=store", "epi: op add_mask does not take it");
	s = parsed("op=attention_grad_xs");
	s.epi = (dg_epi)7;
	cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "epi=7: must be store"), "%s", msg);
	dg_spec o;
	dg_spec_init(&o, DG_OP_ATTENTION_SCORES);
	o.epi = DG_EPI_MASK;
	dg_spec_normalize(&o);
	cr_assert_eq(o.epi, DG_EPI_STORE, "a field the op does not read is reset");
	cr_assert_str_eq(dg_epi_name(DG_EPI_MASK), "mask");
	cr_assert_str_eq(dg_epi_name((dg_epi)9), "?");
}

Test(spec, relu_rules)
{
	refused("op=relu_mask;relu=none", "relu=none: op relu_mask needs the forward's threshold");
	cr_assert(parsed("op=relu_mask").relu, "relu_mask's default has relu");
	refused("op=lowrank_fwd;out=uint8pos;relu=none", "out=uint8pos: needs relu");
	parsed("op=lowrank_fwd;out=uint8pos;relu=0");
	refused("op=decoder_fwd;out=int8", "out=int8: op decoder_fwd takes one of f32|bf16");
	cr_assert_eq(parsed("op=decoder_fwd").out, DG_FMT_BF16, "decoder_fwd writes bf16 by default");
}
