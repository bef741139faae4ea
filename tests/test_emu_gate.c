/*
 * gate_quant (templates/gate_quant.lua) run on the CPU (tests/emu_helpers.h:
 * the rendered kernel compiled for the host, its blocks' threads as OS
 * threads), both forms — the register form (the default t512, and t64:
 * past the registers, a token's vectors made again) and the staged one
 * (t256/1, t128/1: the token's xy in shared memory) — against the
 * references (dg_ref_gate_fwd_op, then dg_ref_quantize_act_rows), codes
 * and scales bit for bit: src f32 and bf16, codes uint8pos and int8,
 * dropout off and on (p 0.1 at elem0 13: not whole Philox blocks; p 0.3 at
 * elem0 8: whole ones), a grid
 * of 3 blocks (each strides over tokens), shapes of whole vectors, of a
 * vector a thread and of odd heads, and inputs one element off 16 bytes
 * (the element path of both forms). The GPU suite (test_gpu_gate) checks
 * the same on the device with its times; this one checks the forms'
 * logic where no GPU is. And gate_fwd's dropout bits (templates/gate.lua's
 * dg_keep_at and dg_keep1) against dg_dropout_keep at every kind of elem0.
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
	/* off; on at an elem0 of whole Philox blocks (the draws compared as
	 * they are) and at one that is not (dg_keep_at's bits) */
	static const drop drops[3] = { { 0.0f, 1, 0, 0, 0 }, { 0.1f, 42, 13, 7, 3 }, { 0.3f, 5, 8, 2, 1 } };
	for (int d = 0; d < 3; d++) {
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
	/* the staged form where a head's vectors are whole batches (L / 8 a
	 * multiple of U·NT = 4·64: a batch's vectors from one head's offset,
	 * as at the BDH shape with t256/1) */
	check(cg, &rng, DG_FMT_BF16, DG_FMT_UINT8POS, 1, 2, 3, 2048, 64, 1, false);
	check(cg, &rng, DG_FMT_BF16, DG_FMT_INT8, 2, 3, 2, 2048, 64, 1, false);
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

/* gate_fwd (templates/gate.lua) run on the CPU against dg_ref_gate_fwd_op,
 * bit for bit: its vectors' dropout bits (dg_keep_at: 8 draws a Philox
 * block, 16 bits each) and its tail's (dg_keep1) are dg_dropout_keep's at
 * every elem0 — whole blocks, half a block, and one that has a vector
 * straddle two — for f32 (4 values a vector) and bf16 (8). */
typedef void (*gate_fwd_fn)(unsigned grid, unsigned nt, const void *xs, const void *ys, void *xy, int B, int T,
			    float p, unsigned long long seed, unsigned step, unsigned layer,
			    unsigned long long elem0);

static const char GLUE_FWD[] =
	"extern \"C\" void dg_emu_gate_fwd(unsigned grid, unsigned nt, const void *xs, const void *ys, void *xy,\n"
	"	int B, int T, float p, unsigned long long seed, unsigned step, unsigned layer,\n"
	"	unsigned long long elem0)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, 0, [&] {\n"
	"		dg_gate_fwd((const XT *)xs, (const XT *)ys, (XT *)xy, B, T, p, seed, step, layer, nullptr,\n"
	"			    elem0);\n"
	"	});\n"
	"}\n";

Test(emu_gate, gate_fwd_draws_the_reference_masks, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 23);
	const dg_fmt acts[2] = { DG_FMT_F32, DG_FMT_BF16 };
	for (int a = 0; a < 2; a++) {
		/* 2 · 3 · 67 values: a tail past the tensor's whole vectors (dg_keep1) */
		const int B = 2, H = 1, T = 3, L = 67;
		dg_spec s;
		dg_spec_init(&s, DG_OP_GATE_FWD);
		s.act = acts[a], s.heads = H, s.latent = L;
		dg_plan plan;
		cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
		gate_fwd_fn fn = (gate_fwd_fn)eh_build(cg, &s, GLUE_FWD, "dg_emu_gate_fwd");
		const size_t n = (size_t)B * H * T * L + 3, e = esz(acts[a]);
		unsigned char *xs = malloc(n * e), *ys = malloc(n * e), *got = malloc(n * e), *want = malloc(n * e);
		cr_assert(xs && ys && got && want);
		dg_rng_fill(&rng, acts[a], xs, n);
		dg_rng_fill(&rng, acts[a], ys, n);
		static const unsigned long long elem0s[] = { 0, 4, 13, 16 };
		for (size_t k = 0; k < sizeof(elem0s) / sizeof(elem0s[0]); k++) {
			/* the kernel's B·H·T·L values, then 3 it must not touch */
			memset(got, 0xee, n * e);
			fn(3, (unsigned)plan.entries[0].threads, xs, ys, got, B, T, 0.3f, 77, 5, 2, elem0s[k]);
			cr_assert_eq(dg_ref_gate_fwd_op(acts[a], xs, ys, (int64_t)(n - 3), 0.3f, 77, 5, 2, elem0s[k], want),
				     DG_OK);
			cr_assert_eq(memcmp(got, want, (n - 3) * e), 0, "%s elem0 %llu: xy differs from the reference",
				     plan.canonical, elem0s[k]);
			for (size_t i = (n - 3) * e; i < n * e; i++)
				cr_assert_eq(got[i], 0xee, "%s: a byte written past xy", plan.canonical);
		}
		free(xs), free(ys), free(got), free(want);
	}
	dg_codegen_destroy(cg);
}
