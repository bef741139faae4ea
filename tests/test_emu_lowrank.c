/*
 * lowrank_fwd's sm_90a warpgroup path with integer codes (templates/
 * lowrank_wgmma.lua: the whole E resident in shared memory in the
 * no-swizzle core-matrix layout, wgmma m64nNk32 s8 with s32 sums, the
 * codes' epilogue) run on the CPU (tests/emu_helpers.h), against the C
 * reference bit for bit, as the GPU suite holds it (the op's check is
 * exact): int8 codes × int8 weights with ReLU into bf16 (a scale a token
 * and a channel) and into uint8pos codes (tensor scales), over rows and
 * neurons that
 * are not whole tiles, on a grid of 3 blocks striding over the units. The
 * kernel passes on the H200; here it ties the emulation's integer MMA and
 * its layout without swizzle to what the hardware reads.
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

typedef void (*fwd_fn)(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w, const float *sa,
		       const float *sw, void *out, const float *so, float *absum, int B, int T);

static const char GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w,\n"
	"	const float *sa, const float *sw, void *out, const float *so, float *absum, int B, int T)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, smem, [&] {\n"
	"		dg_lowrank_fwd((const int *)x, (const int *)w, sa, sw, (%s *)out, so, absum, B, T);\n"
	"	});\n"
	"}\n";

/* codes of n random int8 values in [-lo, hi] */
static int8_t *rand_codes(dg_rng *r, size_t n, int lo, int hi)
{
	int8_t *p = malloc(n + 16);
	float *f = malloc(n * sizeof(float));
	cr_assert(p && f);
	dg_rng_fill(r, DG_FMT_F32, f, n);
	for (size_t i = 0; i < n; i++) {
		int v = (int)((f[i] + 1.0f) * 0.5f * (float)(hi + lo + 1)) - lo;
		p[i] = (int8_t)(v > hi ? hi : v < -lo ? -lo : v);
	}
	free(f);
	return p;
}

static float *rand_scales(dg_rng *r, size_t n)
{
	float *s = malloc(n * sizeof(float));
	cr_assert_not_null(s);
	dg_rng_fill(r, DG_FMT_F32, s, n);
	for (size_t i = 0; i < n; i++)
		s[i] = 0.01f + 0.005f * (s[i] + 1.0f);
	return s;
}

/* out: bf16 or uint8pos codes (a scale of the output), the ReLU at thr;
 * sm 90: the warpgroup path, 80: mma.sync */
static void check_thr(dg_codegen *cg, dg_rng *r, dg_fmt out, int B, int T, int H, int N, int E, int sm, float thr)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.weight = DG_FMT_INT8, s.act = DG_FMT_INT8, s.out = out;
	s.heads = H, s.latent = N, s.embd = E;
	s.relu = true, s.relu_thr = thr;
	/* bf16: a scale a token and a channel; codes out take tensor scales */
	const bool codes = out != DG_FMT_BF16;
	s.ascale = codes ? DG_SCALE_TENSOR : DG_SCALE_TOKEN, s.wscale = codes ? DG_SCALE_TENSOR : DG_SCALE_CHANNEL;
	s.arch = sm, s.arch_specific = sm == 90;
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(plan.path, sm == 90 ? "wgmma" : "mma.sync", "%s", plan.canonical);
	char glue[1024];
	snprintf(glue, sizeof(glue), GLUE, out == DG_FMT_BF16 ? "unsigned short" : "unsigned char");
	fwd_fn fn = (fwd_fn)eh_build(cg, &s, glue, "dg_emu_entry");
	const size_t nx = (size_t)B * T * E, nw = (size_t)H * N * E, no = (size_t)B * H * T * N, ob = out == DG_FMT_BF16 ? 2 : 1;
	int8_t *x = rand_codes(r, nx, 127, 127), *w = rand_codes(r, nw, 127, 127);
	float *sa = rand_scales(r, (size_t)B * T), *sw = rand_scales(r, (size_t)H * N), so = 0.05f;
	unsigned char *got = malloc(no * ob + 16), *want = malloc(no * ob);
	cr_assert(got && want);
	memset(got, 0xee, no * ob + 16);
	fn(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, x, w, sa, sw, got,
	   out == DG_FMT_BF16 ? NULL : &so, NULL, B, T);
	dg_ref_call c;
	memset(&c, 0, sizeof(c));
	c.in[0] = x, c.in[1] = w;
	if (codes)
		c.scale[0] = sa[0], c.scale[1] = sw[0];
	else
		c.scale_v[0] = sa, c.scale_v[1] = sw;
	c.scale[2] = so;
	c.out = want;
	c.b = B, c.t = T;
	cr_assert_eq(dg_ref_run(&plan.spec, &c), DG_OK);
	char why[512];
	cr_assert(dg_ref_same_bytes(got, want, no * ob, why, sizeof(why)), "%s: %s", plan.canonical, why);
	for (size_t i = no * ob; i < no * ob + 16; i++)
		cr_assert_eq(got[i], 0xee, "%s: written past the output", plan.canonical);
	free(x), free(w), free(sa), free(sw), free(got), free(want);
}

static void check(dg_codegen *cg, dg_rng *r, dg_fmt out, int B, int T, int H, int N, int E, int sm)
{
	check_thr(cg, r, out, B, T, H, N, E, sm, 0.0f);
}

/* both outputs at two shapes on a path (sm 90: the warpgroup one, 80:
 * mma.sync, whose m16n8k32 s8 fragments are exchanged within the warp) */
static void both_outputs(uint64_t seed, int sm)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, seed);
	check(cg, &r, DG_FMT_BF16, 1, 130, 2, sm == 90 ? 96 : 160, 64, sm);
	check(cg, &r, DG_FMT_UINT8POS, 2, 40, 1, sm == 90 ? 160 : 96, 128, sm);
	/* a threshold other than 0 (the epilogue subtracts it; at 0 it does not) */
	check_thr(cg, &r, DG_FMT_BF16, 1, 70, 2, 96, 64, sm, 0.25f);
	dg_codegen_destroy(cg);
}

Test(emu_lowrank, warpgroup_codes_against_the_reference, .timeout = 900)
{
	both_outputs(3, 90);
}

Test(emu_lowrank, mma_sync_codes_against_the_reference, .timeout = 900)
{
	both_outputs(5, 80);
}
