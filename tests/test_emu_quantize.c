/*
 * quantize_act's token entries (templates/qrows.lua: dg_quantize_act_rows,
 * a block a token, and dg_quantize_act_rows_warp, a warp a token) run on
 * the CPU (tests/emu_helpers.h: the rendered kernel compiled for the host,
 * its blocks' threads as OS threads) against dg_ref_quantize_act_rows,
 * codes and scales bit for bit: src f32 and bf16, codes int8 and uint8pos,
 * a grid of 3 blocks (each strides over the tokens), and the shapes that
 * pick each path of the warp entry — tokens of a vector a lane at most
 * (the BDH x and a tokens: several a warp at a time, a token count that
 * is not a multiple of them), longer tokens (vectors streamed), odd rows
 * (the scalar path) — and the block entry's (its stage of the next token).
 * The GPU suite (test_gpu_scales) checks the same on the device.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "nvrtc_helpers.h"
#include "runtime/ref/ref_ops.h"

typedef void (*rows_fn)(unsigned grid, unsigned nt, size_t smem, const void *x, long long rows, int G, int T, int C,
			float *scales, void *codes);

static const char GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned grid, unsigned nt, size_t smem, const void *x, long long rows,\n"
	"	int G, int T, int C, float *scales, void *codes)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, smem, [&] {\n"
	"		%s((const %s *)x, rows, G, T, C, scales, (%s *)codes);\n"
	"	});\n"
	"}\n";

/* entry (warp: _rows_warp, else _rows) at x (B, G, T, C) against the
 * reference */
static void check(dg_codegen *cg, dg_rng *rng, dg_fmt src, dg_fmt act, bool warp, int B, int G, int T, int C)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.src = src, s.act = act, s.ascale = DG_SCALE_TOKEN;
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const char *entry = warp ? "dg_quantize_act_rows_warp" : "dg_quantize_act_rows";
	int ei = -1;
	for (int i = 0; i < plan.n_entries; i++)
		if (strcmp(plan.entries[i].name, entry) == 0)
			ei = i;
	cr_assert(ei >= 0, "%s: no entry %s", plan.canonical, entry);
	char glue[1024];
	snprintf(glue, sizeof(glue), GLUE, entry, src == DG_FMT_BF16 ? "unsigned short" : "float",
		 act == DG_FMT_UINT8POS ? "unsigned char" : "signed char");
	rows_fn fn = (rows_fn)eh_build(cg, &s, glue, "dg_emu_entry");
	const size_t n = (size_t)B * G * T * C, rows = (size_t)B * T, e = src == DG_FMT_BF16 ? 2 : 4;
	unsigned char *x = calloc(n + 16, e), *got = malloc(n + 16), *want = malloc(n);
	float *gs = malloc((rows + 4) * sizeof(float)), *ws = malloc(rows * sizeof(float));
	cr_assert(x && got && want && gs && ws);
	dg_rng_fill(rng, src, x, n);
	memset(got, 0xee, n + 16);
	for (size_t i = 0; i < rows + 4; i++)
		gs[i] = -1.0f;
	fn(3, (unsigned)plan.entries[ei].threads, (size_t)plan.entries[ei].smem, x, (long long)rows, G, T, C, gs, got);
	cr_assert_eq(dg_ref_quantize_act_rows(src, act, x, (size_t)B, (size_t)G, (size_t)T, (size_t)C, want, ws), DG_OK);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(got[i], want[i], "%s %s (B %d, G %d, T %d, C %d): byte %zu: %u, the reference %u",
			     plan.canonical, entry, B, G, T, C, i, got[i], want[i]);
	cr_assert_eq(memcmp(gs, ws, rows * sizeof(float)), 0, "%s %s (B %d, G %d, T %d, C %d): the scales differ",
		     plan.canonical, entry, B, G, T, C);
	for (size_t i = n; i < n + 16; i++)
		cr_assert_eq(got[i], 0xee, "%s %s: a byte written past the codes", plan.canonical, entry);
	for (size_t i = rows; i < rows + 4; i++)
		cr_assert_eq(gs[i], -1.0f, "%s %s: a scale written past the tokens", plan.canonical, entry);
	free(x), free(got), free(want), free(gs), free(ws);
}

/* the warp entry: tokens of a vector a lane at most (G·C 256 bf16 or 128
 * f32, and four heads of 64 / 32), 2 x 13 and 13 tokens (the second not
 * a multiple of the tokens a warp takes at a time); longer tokens (G·C
 * 1024); odd ones */
Test(emu_quantize, rows_warp_against_the_reference, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 21);
	for (int sf = 0; sf < 2; sf++)
		for (int af = 0; af < 2; af++) {
			const dg_fmt src = sf ? DG_FMT_BF16 : DG_FMT_F32, act = af ? DG_FMT_INT8 : DG_FMT_UINT8POS;
			const int ve = sf ? 8 : 4;
			check(cg, &rng, src, act, true, 2, 1, 13, 32 * ve);
			check(cg, &rng, src, act, true, 1, 1, 13, 32 * ve);
			check(cg, &rng, src, act, true, 2, 4, 13, 8 * ve);
			check(cg, &rng, src, act, true, 1, 2, 5, 512);
			check(cg, &rng, src, act, true, 2, 3, 3, 13);
			if (sf) { /* bf16 tokens up to the 2048 values a warp keeps (1B's a: 1280) */
				check(cg, &rng, src, act, true, 1, 1, 5, 1280);
				check(cg, &rng, src, act, true, 1, 2, 3, 1024);
			}
		}
	dg_codegen_destroy(cg);
}

/* the block entry: long tokens (4 heads of 512: its vectors and the stage
 * of the next token), and odd ones */
Test(emu_quantize, rows_block_against_the_reference, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 22);
	for (int sf = 0; sf < 2; sf++) {
		const dg_fmt src = sf ? DG_FMT_BF16 : DG_FMT_F32;
		check(cg, &rng, src, DG_FMT_UINT8POS, false, 2, 4, 5, 512);
		check(cg, &rng, src, DG_FMT_INT8, false, 1, 3, 4, 13);
	}
	dg_codegen_destroy(cg);
}
