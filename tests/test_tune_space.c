/*
 * Candidate spaces, the resource rule and the winner chooser
 * (autotune/space.c, runtime/tunedb/choose.c), no GPU needed:
 *   - every candidate is valid, planned by its template (to its own tile),
 *     distinct, the template's default comes first, and a
 *     device of the spec's arch from sm_90 on gets the arch-specific
 *     target too (and only then);
 *   - dg_tune_fits rejects threads, registers and shared memory a block
 *     cannot have, naming the resource;
 *   - the chooser picks the simplest tile within the tie band, the same
 *     one whatever the order of the candidates, and -1 when none was
 *     timed;
 *   - the BDH set parses, is valid, and has one spec per op it lists.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/sweep_int.h"
#include "dragon/autotune.h"
#include "dragon/tune.h"
#include "helpers.h"
#include "runtime/tunedb/choose.h"

/* The template's default tile of s on its target (arch_specific or not). */
static dg_tile default_tile(dg_codegen *cg, const dg_spec *s, bool arch_specific)
{
	dg_spec a = *s;
	dg_plan p;
	memset(&a.tile, 0, sizeof(a.tile));
	a.arch_specific = arch_specific;
	cr_assert_eq(dg_codegen_plan(cg, &a, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	return p.spec.tile;
}

static void check_space(const char *text, int device_sm, bool want_specific)
{
	dg_codegen *cg = dg_test_codegen();
	dg_spec s = dg_test_spec_parse(text), *c = NULL;
	size_t n = 0;
	char msg[256];

	cr_assert_eq(dg_tune_space(cg, &s, device_sm, &c, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_gt(n, 1, "%s: %zu candidates", text, n);
	cr_assert_leq(n, DG_TUNE_MAX_CANDIDATES);
	dg_tile def = default_tile(cg, &s, false);
	cr_assert_eq(memcmp(&c[0].tile, &def, sizeof(def)), 0, "%s: the default is not first", text);
	cr_assert(!c[0].arch_specific);
	size_t specific = 0;
	for (size_t i = 0; i < n; i++) {
		dg_plan p;
		cr_assert_eq(dg_spec_validate(&c[i], msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
		cr_assert_eq(dg_codegen_plan(cg, &c[i], &p), DG_OK, "%s: candidate %zu: %s", text, i,
			     dg_codegen_errmsg(cg));
		cr_assert_eq(memcmp(&p.spec.tile, &c[i].tile, sizeof(dg_tile)), 0,
			     "%s: candidate %zu plans to another tile", text, i);
		cr_assert(!dg_tile_is_auto(&c[i].tile));
		cr_assert_eq(c[i].op, s.op);
		cr_assert_eq(c[i].weight, s.weight);
		specific += c[i].arch_specific;
		for (size_t j = 0; j < i; j++)
			cr_assert(memcmp(&c[i].tile, &c[j].tile, sizeof(dg_tile)) ||
					  c[i].arch_specific != c[j].arch_specific,
				  "%s: candidates %zu and %zu are the same", text, j, i);
	}
	if (want_specific) {
		cr_assert_gt(specific, 0, "%s: no sm_90a candidates on an sm_90 device", text);
		cr_assert(c[1].arch_specific, "the arch-specific default comes second");
		dg_tile def_a = default_tile(cg, &s, true);
		cr_assert_eq(memcmp(&c[1].tile, &def_a, sizeof(def_a)), 0, "%s", text);
	} else {
		cr_assert_eq(specific, 0, "%s: sm_90a candidates for sm_%d", text, device_sm);
	}
	free(c);
	dg_codegen_destroy(cg);
}

Test(tune_space, every_candidate_is_valid_and_distinct)
{
	check_space("op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0", 90, true);
	check_space("op=lowrank_fwd;weight=f32;act=bf16;out=f32", 90, true);
	check_space("op=decoder_fwd;weight=int8;act=int8;out=bf16", 90, true);
	check_space("op=lowrank_grad_weight;act=int8", 90, true);
	check_space("op=quantize_act", 90, true);
	/* another device: the spec's target only */
	check_space("op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0", 100, false);
	check_space("op=lowrank_fwd;arch=sm_80", 80, false);
}

Test(tune_space, sizes_stay_small)
{
	dg_codegen *cg = dg_test_codegen();
	dg_spec set[32], *c = NULL;
	size_t n = dg_tune_bdh_set(set, 32), k = 0;
	char msg[256];

	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(dg_tune_space(cg, &set[i], 90, &c, &k, msg, sizeof(msg)), DG_OK, "%s", msg);
		/* about 2 x 49 GEMM tiles (plus up to 80 warpgroup tiles on
		 * sm_90a) or 2 x 5 thread counts: a sweep compiles them all */
		cr_assert_leq(k, 180, "%s: %zu candidates", dg_op_name(set[i].op), k);
		free(c);
	}
	dg_spec e = dg_test_spec_parse("op=pack_i8x4");
	cr_assert_eq(dg_tune_space(cg, &e, 90, &c, &k, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(k, 10, "t64..t1024 on sm_90 and sm_90a: %zu", k);
	free(c);
	/* gate_quant stages its token too: t64..t1024 and t64/1..t1024/1 on
	 * both targets, the BDH token's 64 KiB within every one's limit */
	e = dg_test_spec_parse("op=gate_quant;src=bf16;act=uint8pos");
	cr_assert_eq(dg_tune_space(cg, &e, 90, &c, &k, msg, sizeof(msg)), DG_OK, "%s", msg);
	size_t staged = 0;
	for (size_t i = 0; i < k; i++)
		staged += c[i].tile.stages == 1;
	cr_assert_eq(k, 20, "gate_quant: %zu candidates", k);
	cr_assert_eq(staged, 10, "gate_quant: %zu staged", staged);
	free(c);
	dg_codegen_destroy(cg);
}

Test(tune_space, bad_specs_are_refused)
{
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd"), *c = (dg_spec *)1;
	size_t n = 7;
	char msg[256];

	dg_codegen *cg = dg_test_codegen();
	s.latent = 8190;
	cr_assert_eq(dg_tune_space(cg, &s, 90, &c, &n, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert_null(c);
	cr_assert_eq(n, 0);
	cr_assert(strstr(msg, "latent=8190"), "%s", msg);
	/* its tile is ignored: a tile the template refuses still has a space */
	s = dg_test_spec_parse("op=lowrank_fwd;tile=48x64x64/2x2/2");
	cr_assert_eq(dg_tune_space(cg, &s, 90, &c, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_gt(n, 1);
	free(c);
	cr_assert_eq(dg_tune_space(cg, NULL, 90, &c, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_tune_space(NULL, &s, 90, &c, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	dg_codegen_destroy(cg);
}

Test(tune_space, fits_rejects_with_the_reason)
{
	const dg_tune_limits lim = { .max_threads = 1024, .smem_optin = 232448,
				     .regs_per_block = 65536 };
	dg_tune_resources ok = { .threads = 256, .dyn_smem = 98304, .static_smem = 0,
				 .regs = 128, .local_bytes = 0, .max_threads = 512 };
	char why[512];

	cr_assert(dg_tune_fits(&ok, &lim, why, sizeof(why)), "%s", why);
	cr_assert_str_empty(why);

	dg_tune_resources r = ok;
	r.dyn_smem = 240000;
	cr_assert(!dg_tune_fits(&r, &lim, why, sizeof(why)));
	cr_assert(strstr(why, "shared memory") && strstr(why, "232448"), "%s", why);

	r = ok;
	r.threads = 512;
	r.max_threads = 256; /* 255 registers a thread: only 256 threads run */
	r.regs = 255;
	cr_assert(!dg_tune_fits(&r, &lim, why, sizeof(why)));
	cr_assert(strstr(why, "registers") && strstr(why, "at most 256"), "%s", why);

	r = ok;
	r.threads = 1024;
	r.max_threads = 0; /* unknown: the register product decides */
	r.regs = 128;
	cr_assert(!dg_tune_fits(&r, &lim, why, sizeof(why)));
	cr_assert(strstr(why, "131072") && strstr(why, "65536"), "%s", why);

	r = ok;
	r.threads = 2048;
	cr_assert(!dg_tune_fits(&r, &lim, why, sizeof(why)));
	cr_assert(strstr(why, "2048 threads"), "%s", why);
	cr_assert(!dg_tune_fits(NULL, &lim, why, sizeof(why)));
}

/* ---- the chooser ------------------------------------------------------------- */

static dg_tune_cand cand(const char *tile, bool specific, double us, int smem)
{
	dg_tune_cand c;
	dg_spec s = dg_test_spec_parse("op=lowrank_fwd");
	memset(&c, 0, sizeof(c));
	cr_assert_eq(dg_spec_set(&s, "tile", tile, NULL, 0), DG_OK);
	c.tile = s.tile;
	c.arch_specific = specific;
	c.state = us >= 0 ? DG_TUNE_TIMED : DG_TUNE_REJECTED;
	c.median_us = us;
	c.smem = smem;
	return c;
}

static int choose_shuffled(dg_tune_cand *c, size_t n, int rounds, double band)
{
	/* the same winner whatever the order */
	char want[64] = "", got[64];
	bool want_a = false;
	uint64_t seed = 12345;
	for (int r = 0; r < rounds; r++) {
		for (size_t i = n - 1; i > 0; i--) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			size_t j = (size_t)(seed >> 33) % (i + 1);
			dg_tune_cand t = c[i];
			c[i] = c[j];
			c[j] = t;
		}
		int w = dg_tune_choose(c, n, band);
		cr_assert_geq(w, 0);
		dg_tile_to_string(&c[w].tile, got, sizeof(got));
		if (r == 0) {
			snprintf(want, sizeof(want), "%s", got);
			want_a = c[w].arch_specific;
		}
		cr_assert_str_eq(got, want, "round %d: %s, before %s", r, got, want);
		cr_assert_eq(c[w].arch_specific, want_a);
	}
	for (size_t i = 0; i < n; i++) {
		char t[64];
		dg_tile_to_string(&c[i].tile, t, sizeof(t));
		if (strcmp(t, want) == 0 && c[i].arch_specific == want_a)
			return (int)i;
	}
	return -1;
}

Test(tune_choose, simplest_within_the_band_deterministically)
{
	dg_tune_cand c[6] = {
		cand("128x128x64/2x4/4", false, 100.0, 98304),  /* fastest, 256 threads */
		cand("128x128x64/2x2/4", false, 101.5, 98304),  /* within 2%, 128 threads */
		cand("128x128x64/2x2/2", false, 101.9, 65536),  /* within 2%, 128 threads, 2 stages */
		cand("128x128x64/2x2/2", true, 101.0, 65536),   /* same, arch-specific */
		cand("64x64x64/2x2/2", false, 102.5, 32768),    /* 2.5%: outside */
		cand("64x64x32/1x1/1", false, -1, 0),           /* rejected */
	};
	int w = choose_shuffled(c, 6, 20, DG_TUNE_TIE_BAND);
	char t[64];
	dg_tile_to_string(&c[w].tile, t, sizeof(t));
	cr_assert_str_eq(t, "128x128x64/2x2/2");
	cr_assert(!c[w].arch_specific, "the portable target wins a tie");

	/* no band: the fastest */
	int f = dg_tune_choose(c, 6, 0.0);
	dg_tile_to_string(&c[f].tile, t, sizeof(t));
	cr_assert_str_eq(t, "128x128x64/2x4/4");

	/* wide band: the fewest threads, then stages, then smem */
	w = choose_shuffled(c, 6, 20, 0.10);
	dg_tile_to_string(&c[w].tile, t, sizeof(t));
	cr_assert_str_eq(t, "64x64x64/2x2/2");
}

Test(tune_choose, nothing_timed)
{
	dg_tune_cand c[2] = { cand("64x64x32/2x2/2", false, -1, 0), cand("64x64x64/2x2/2", false, -1, 0) };
	c[1].state = DG_TUNE_SKIPPED;
	cr_assert_eq(dg_tune_choose(c, 2, DG_TUNE_TIE_BAND), -1);
	cr_assert_eq(dg_tune_choose(NULL, 0, DG_TUNE_TIE_BAND), -1);
}

Test(tune_space, bdh_set)
{
	dg_spec set[32];
	size_t n = dg_tune_bdh_set(set, 32);
	static const dg_op want[] = {
		DG_OP_LOWRANK_FWD, DG_OP_DECODER_FWD, DG_OP_RELU_MASK,
		DG_OP_LOWRANK_GRAD_INPUT, DG_OP_LOWRANK_GRAD_WEIGHT, DG_OP_DECODER_GRAD_INPUT,
		DG_OP_DECODER_GRAD_WEIGHT, DG_OP_QUANTIZE_ACT, DG_OP_QUANTIZE_WEIGHT,
		DG_OP_PACK_TERNARY, DG_OP_PACK_I8X4,
	};
	cr_assert_eq(n, 13);
	cr_assert_eq(dg_tune_bdh_set(NULL, 0), 13);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		bool found = false;
		for (size_t k = 0; k < n; k++)
			found |= set[k].op == want[i];
		cr_assert(found, "op %s missing", dg_op_name(want[i]));
	}
	for (size_t k = 0; k < n; k++) {
		cr_assert_eq(dg_spec_validate(&set[k], NULL, 0), DG_OK);
		cr_assert(dg_tile_is_auto(&set[k].tile));
		cr_assert_eq(set[k].arch, 90);
		if (dg_spec_uses(set[k].op) & DG_FIELD_HEADS)
			cr_assert_eq(set[k].heads, 4);
		if (dg_spec_uses(set[k].op) & DG_FIELD_LATENT)
			cr_assert_eq(set[k].latent, 8192);
		if (dg_spec_uses(set[k].op) & DG_FIELD_EMBD)
			cr_assert_eq(set[k].embd, 256);
	}
	cr_assert_eq(set[0].weight, DG_FMT_TERNARY);
	cr_assert_eq(set[0].out, DG_FMT_INT8);
	cr_assert(set[0].relu);
	cr_assert_eq(set[1].out, DG_FMT_BF16);
}

/* On a device of the spec's arch (sm_90), the sm_90a warpgroup tiles of
 * the projection and the decoder are candidates. */
Test(tune_space, warpgroup_tiles_on_sm_90a)
{
	const char *texts[] = { "op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0",
				"op=decoder_fwd;weight=int8;act=int8;out=bf16" };
	char msg[256];
	dg_codegen *cg = dg_test_codegen();

	for (size_t t = 0; t < 2; t++) {
		dg_spec s = dg_test_spec_parse(texts[t]), *c = NULL;
		size_t n = 0, wg = 0;

		cr_assert_eq(dg_tune_space(cg, &s, 90, &c, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
		for (size_t i = 0; i < n; i++)
			if (c[i].arch_specific && c[i].tile.wn == 1 && c[i].tile.bm == 16 * c[i].tile.wm)
				wg++;
		cr_assert_geq(wg, 8, "%s: %zu warpgroup tiles of %zu", texts[t], wg, n);
		free(c);
		/* on an sm_80 device there is no sm_90a target */
		s.arch = 80;
		cr_assert_eq(dg_tune_space(cg, &s, 80, &c, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
		for (size_t i = 0; i < n; i++)
			cr_assert(!c[i].arch_specific);
		free(c);
	}
	dg_codegen_destroy(cg);
}
