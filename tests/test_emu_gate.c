/*
 * gate_quant (templates/gate_quant.lua) run on the CPU (tests/emu_helpers.h:
 * the rendered kernel compiled for the host, its blocks' threads as OS
 * threads), both forms — the register form (the default t512, and t64:
 * past the registers, a token's vectors made again) and the staged one
 * (t256/1, t128/1: the token's xy in shared memory) — against the
 * references (dg_ref_gate_fwd_op, then dg_ref_quantize_act_rows), codes
 * and scales bit for bit: src f32 and bf16, codes uint8pos and int8,
 * dropout off and on (p 0.1, elem0 13: not whole Philox blocks), a grid
 * of 3 blocks (each strides over tokens), shapes of whole vectors, of a
 * vector a thread and of odd heads, and inputs one element off 16 bytes
 * (the element path of both forms). The GPU suite (test_gpu_gate) checks
 * the same on the device with its times; this one checks the forms'
 * logic where no GPU is.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "nvrtc_helpers.h"
#include "runtime/ref/ref_ops.h"

typedef void (*gate_quant_fn)(unsigned grid, unsigned nt, size_t smem, const void *xs, const void *ys,
			      long long rows, int T, float p, unsigned long long seed, unsigned step, unsigned layer,
			      const unsigned *step_at, unsigned long long elem0, float *scales, void *codes);

static const char GLUE[] =
	"extern \"C\" void dg_emu_gate_quant(unsigned grid, unsigned nt, size_t smem, const void *xs, const void *ys,\n"
	"	long long rows, int T, float p, unsigned long long seed, unsigned step, unsigned layer,\n"
	"	const unsigned *step_at, unsigned long long elem0, float *scales, void *codes)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, smem, [&] {\n"
	"		dg_gate_quant((const XT *)xs, (const XT *)ys, rows, T, p, seed, step, layer, step_at, elem0,\n"
	"			      scales, (CT *)codes);\n"
	"	});\n"
	"}\n";

typedef struct drop {
	float p;
	unsigned long long seed, elem0;
	unsigned step, layer;
} drop;

static size_t esz(dg_fmt f)
{
	return f == DG_FMT_BF16 ? 2 : 4;
}

/* One form (threads, stages) at (B, H, T, L) against the references;
 * off: the inputs and codes one element past 16-byte alignment. */
static void check(dg_codegen *cg, dg_rng *rng, dg_fmt src, dg_fmt act, int B, int H, int T, int L, int threads,
		  int stages, bool off)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_GATE_QUANT);
	s.src = src, s.act = act, s.heads = H, s.latent = L, s.tile.threads = threads, s.tile.stages = stages;
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	gate_quant_fn fn = (gate_quant_fn)eh_build(cg, &s, GLUE, "dg_emu_gate_quant");
	const size_t n = (size_t)B * H * T * L, rows = (size_t)B * T, e = esz(src);
	unsigned char *xs = calloc(n + 16, e), *ys = calloc(n + 16, e);
	unsigned char *got = calloc(n + 16, 1), *want = malloc(n), *xy = malloc(n * e);
	float *gs = calloc(rows, sizeof(float)), *ws = calloc(rows, sizeof(float));
	cr_assert(xs && ys && got && want && xy && gs && ws);
	const size_t k = off ? 1 : 0; /* elements past the allocation's alignment */
	dg_rng_fill(rng, src, xs + k * e, n);
	dg_rng_fill(rng, src, ys + k * e, n);
	static const drop drops[2] = { { 0.0f, 1, 0, 0, 0 }, { 0.1f, 42, 13, 7, 3 } };
	for (int d = 0; d < 2; d++) {
		const drop *dr = &drops[d];
		memset(got, 0xff, n + 16);
		fn(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, xs + k * e, ys + k * e,
		   (long long)rows, T, dr->p, dr->seed, dr->step, dr->layer, NULL, dr->elem0, gs, got + k);
		cr_assert_eq(dg_ref_gate_fwd_op(src, xs + k * e, ys + k * e, (int64_t)n, dr->p, dr->seed, dr->step,
						 dr->layer, dr->elem0, xy),
			     DG_OK);
		cr_assert_eq(dg_ref_quantize_act_rows(src, act, xy, (size_t)B, (size_t)H, (size_t)T, (size_t)L, want, ws),
			     DG_OK);
		for (size_t i = 0; i < n; i++)
			cr_assert_eq(got[k + i], want[i],
				     "%s: byte %zu of %zu: %u, the reference %u (p %g%s)", plan.canonical, i, n, got[k + i],
				     want[i], (double)dr->p, off ? ", off 16 bytes" : "");
		cr_assert_eq(memcmp(gs, ws, rows * sizeof(float)), 0, "%s: the scales differ (p %g)", plan.canonical,
			     (double)dr->p);
		for (size_t i = n + k; i < n + 16; i++)
			cr_assert_eq(got[i], 0xff, "%s: a byte written past the codes", plan.canonical);
	}
	free(xs), free(ys), free(got), free(want), free(xy), free(gs), free(ws);
}

/* both srcs and codes, at a shape of whole vectors (H 3, L 64: 24 or 48
 * vectors a token, fewer than a block's threads) and at the register
 * form's recomputing shape (t64 over 4 × 256: 128 or 256 vectors) */
Test(emu_gate, gate_quant_forms_against_the_references, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 7);
	static const int forms[][2] = { { 0, 0 }, { 64, 0 }, { 256, 1 }, { 128, 1 } };
	for (int sf = 0; sf < 2; sf++)
		for (int af = 0; af < 2; af++)
			for (int f = 0; f < 4; f++) {
				const dg_fmt src = sf ? DG_FMT_BF16 : DG_FMT_F32, act = af ? DG_FMT_INT8 : DG_FMT_UINT8POS;
				check(cg, &rng, src, act, 2, 3, 3, 64, forms[f][0], forms[f][1], false);
				if (af == 0)
					check(cg, &rng, src, act, 1, 4, 3, 256, forms[f][0], forms[f][1], false);
			}
	dg_codegen_destroy(cg);
}

/* the element path: odd latent (13: the register form only; the staged
 * one refuses it) and inputs off 16 bytes (both forms) */
Test(emu_gate, gate_quant_element_path, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 11);
	check(cg, &rng, DG_FMT_BF16, DG_FMT_UINT8POS, 2, 3, 3, 13, 0, 0, false);
	check(cg, &rng, DG_FMT_F32, DG_FMT_INT8, 2, 3, 3, 13, 64, 0, false);
	check(cg, &rng, DG_FMT_BF16, DG_FMT_UINT8POS, 2, 2, 3, 64, 0, 0, true);
	check(cg, &rng, DG_FMT_BF16, DG_FMT_UINT8POS, 2, 2, 3, 64, 256, 1, true);
	check(cg, &rng, DG_FMT_F32, DG_FMT_INT8, 2, 2, 3, 64, 128, 1, true);
	dg_codegen_destroy(cg);
}
