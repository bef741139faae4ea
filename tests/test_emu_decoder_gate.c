/*
 * decoder_gate_bwd's sm_90a warpgroup path (templates/decoder_gate.lua:
 * the gradient rounded to bf16 as the threads stage it, the weight by
 * cp.async MN-major, wgmma bf16 with f32 sums, the dxy tile staged in the
 * ring, the gate's backward with its Philox mask in the epilogue) run on
 * the CPU (tests/emu_helpers.h) against the reference (dg_ref_decoder_
 * gate_bwd) by the GPU suite's kind of bound (the gradient bf16-exact, so
 * the GEMM is exact up to its sums' order; dxs and dys bf16): dropout off
 * and on, B·T and L not whole tiles (L 200), two heads. The kernel passes
 * on the H200 (test_gpu_decoder_gate); here it is the base a change of it
 * (ys made in its tile from the codes: the banner's next step) is checked
 * on before it meets a GPU.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "nvrtc_helpers.h"
#include "runtime/ref/ref_ops.h"

typedef void (*dgb_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const float *grad,
		       const void *w, const void *xs, const void *ys, void *dxs, void *dys, int B, int T, float p,
		       unsigned long long seed, unsigned step, unsigned layer, unsigned long long elem0);

static const char GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const float *grad, const void *w, const void *xs, const void *ys, void *dxs, void *dys, int B, int T,\n"
	"	float p, unsigned long long seed, unsigned step, unsigned layer, unsigned long long elem0)\n"
	"{\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_decoder_gate_bwd(grad, (const WT *)w, (const XT *)xs, (const XT *)ys, (GT *)dxs, (GT *)dys, B, T,\n"
	"				    p, seed, step, layer, nullptr, elem0);\n"
	"	});\n"
	"}\n";

static uint16_t *rand_bf16(dg_rng *r, size_t n)
{
	uint16_t *p = calloc(n + 8, 2);
	cr_assert_not_null(p);
	dg_rng_fill(r, DG_FMT_BF16, p, n);
	return p;
}

static float *widen(const uint16_t *p, size_t n)
{
	float *f = malloc(n * sizeof(float) + 16);
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		f[i] = dg_ref_bf16_to_f32(p[i]);
	return f;
}

static void expect_close(const char *what, const uint16_t *got, const uint16_t *want, size_t n)
{
	char why[512];
	float *g = widen(got, n), *w = widen(want, n);
	cr_assert(dg_ref_close_norm(g, w, n, 1e-2, 2e-2f, why, sizeof(why)), "%s: %s", what, why);
	free(g), free(w);
}

static void check(dg_codegen *cg, dg_rng *r, int B, int T, int H, int L, int E, float p)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD);
	s.weight = DG_FMT_BF16, s.act = DG_FMT_BF16, s.out = DG_FMT_BF16;
	s.heads = H, s.latent = L, s.embd = E;
	s.arch = 90, s.arch_specific = true;
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(plan.path, "wgmma bf16", "%s", plan.canonical);
	dgb_fn fn = (dgb_fn)eh_build(cg, &s, GLUE, "dg_emu_entry");
	const size_t ng = (size_t)B * T * E, nw = (size_t)E * H * L, nx = (size_t)B * H * T * L;
	uint16_t *gb = rand_bf16(r, ng), *w = rand_bf16(r, nw), *xs = rand_bf16(r, nx), *ys = rand_bf16(r, nx);
	float *grad = widen(gb, ng); /* bf16-exact: the path's rounding of it is exact */
	uint16_t *dxs = malloc(nx * 2 + 16), *dys = malloc(nx * 2 + 16), *wx = malloc(nx * 2), *wy = malloc(nx * 2);
	cr_assert(dxs && dys && wx && wy);
	memset(dxs, 0xff, nx * 2 + 16), memset(dys, 0xff, nx * 2 + 16);
	const dg_tile *t = &plan.spec.tile;
	const unsigned long long seed = 42, elem0 = 0;
	const unsigned step = 7, layer = 3;
	fn((unsigned)((L + t->bn - 1) / t->bn), (unsigned)((B * T + t->bm - 1) / t->bm), (unsigned)H,
	   (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, grad, w, xs, ys, dxs, dys, B, T, p, seed, step,
	   layer, elem0);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&plan.spec, grad, w, xs, ys, B, T, p, seed, step, layer, elem0, wx, wy),
		     DG_OK);
	char what[700];
	snprintf(what, sizeof(what), "%s p %g: dxs", plan.canonical, (double)p);
	expect_close(what, dxs, wx, nx);
	snprintf(what, sizeof(what), "%s p %g: dys", plan.canonical, (double)p);
	expect_close(what, dys, wy, nx);
	free(gb), free(w), free(xs), free(ys), free(grad), free(dxs), free(dys), free(wx), free(wy);
}

Test(emu_decoder_gate, warpgroup_path_against_the_reference, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 4);
	check(cg, &r, 1, 136, 2, 200, 64, 0.0f);
	check(cg, &r, 1, 136, 2, 200, 64, 0.1f);
	dg_codegen_destroy(cg);
}
