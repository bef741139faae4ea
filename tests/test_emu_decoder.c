/*
 * decoder_fwd's warp-specialized integer path (templates/decoder.lua
 * KERNEL_WS: codes by TMA in 128-byte-swizzled boxes of 128 codes, a
 * producer warpgroup and a ring of mbarrier-guarded stages, wgmma
 * m64nNk32 u8·s8 with s32 sums into split-K int32 slices, then
 * dg_decoder_fwd_out summing the slices with the scales) run on the CPU
 * (tests/emu_helpers.h) against the reference bit for bit (the op's check
 * is exact): uint8pos codes with a scale a token, int8 weights with a
 * tensor scale, two heads, two row tiles, two K splits, a grid of 3 blocks
 * over the (tile, split) items. The kernel passes on the H200; here it
 * ties the emulated integer MMA on swizzled bytes to the hardware.
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

typedef void (*dec_fn)(unsigned grid, unsigned nt, size_t smem, size_t smem2, const void *y, const void *w,
		       void *ws, int B, int T, int nsplit, const eh_tmap *ma, const eh_tmap *mb, const float *sa,
		       const float *sw, void *out);

static const char GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned grid, unsigned nt, size_t smem, size_t smem2, const void *y,\n"
	"	const void *w, void *ws, int B, int T, int nsplit, const void *ma, const void *mb, const float *sa,\n"
	"	const float *sw, void *out)\n"
	"{\n"
	"	dg_tmap a, b;\n"
	"	memcpy(&a, ma, sizeof(dg_emu_tmap)), memcpy(&b, mb, sizeof(dg_emu_tmap));\n"
	"	dg_emu_launch(grid, nt, smem, [&] { dg_decoder_fwd((const int *)y, (const int *)w, ws, B, T, nsplit, a, b); });\n"
	"	const long long n = (long long)B * T * E;\n"
	"	dg_emu_launch(2, 256, smem2, [&] {\n"
	"		dg_decoder_fwd_out(ws, sa, sw, (unsigned short *)out, n, nsplit);\n"
	"	});\n"
	"}\n";

Test(emu_decoder, warp_specialized_codes_against_the_reference, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 12);
	const int B = 1, T = 128, H = 2, L = 256, E = 256, nsplit = 2;
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_FWD);
	s.weight = DG_FMT_INT8, s.act = DG_FMT_UINT8POS, s.out = DG_FMT_BF16;
	s.ascale = DG_SCALE_TOKEN;
	s.heads = H, s.latent = L, s.embd = E;
	s.arch = 90, s.arch_specific = true;
	s.tile = (dg_tile){ 64, 256, 128, 4, 1, 5, 0 };
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(plan.path, "wgmma tma", "%s", plan.canonical);
	dec_fn fn = (dec_fn)eh_build(cg, &s, GLUE, "dg_emu_entry");
	const size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;
	unsigned char *y = malloc(ny + 16), *w = malloc(nw + 16);
	float *f = malloc((ny > nw ? ny : nw) * sizeof(float)), *sa = malloc((size_t)B * T * sizeof(float));
	cr_assert(y && w && f && sa);
	dg_rng_fill(&r, DG_FMT_F32, f, ny);
	for (size_t i = 0; i < ny; i++) /* uint8pos: 0..255, some zeros (the gate's dropout) */
		y[i] = f[i] < -0.8f ? 0 : (unsigned char)((f[i] + 1.0f) * 127.9f);
	dg_rng_fill(&r, DG_FMT_F32, f, nw);
	for (size_t i = 0; i < nw; i++)
		w[i] = (unsigned char)(signed char)(int)(f[i] * 127.0f);
	dg_rng_fill(&r, DG_FMT_F32, sa, (size_t)B * T);
	for (int i = 0; i < B * T; i++)
		sa[i] = 0.001f + 0.0005f * (sa[i] + 1.0f);
	const float sw = 0.02f;
	int *ws = malloc((size_t)nsplit * no * sizeof(int));
	uint16_t *got = malloc(no * 2 + 16), *want = malloc(no * 2);
	cr_assert(ws && got && want);
	memset(got, 0xee, no * 2 + 16);
	/* the runtime's maps (runtime/ops/decoder.c ws_tmaps) */
	const eh_tmap ma = eh_tmap3(y, 1, (uint64_t)L, (uint64_t)T, (uint64_t)B * H, 128, 64),
		      mb = eh_tmap3(w, 1, (uint64_t)H * L, (uint64_t)E, 1, 128, (unsigned)plan.spec.tile.bn);
	fn(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, (size_t)plan.entries[1].smem, y, w, ws,
	   B, T, nsplit, &ma, &mb, sa, &sw, got);
	dg_ref_call c;
	memset(&c, 0, sizeof(c));
	c.in[0] = y, c.in[1] = w;
	c.scale_v[0] = sa, c.scale[1] = sw;
	c.out = want;
	c.b = B, c.t = T;
	cr_assert_eq(dg_ref_run(&plan.spec, &c), DG_OK);
	char why[512];
	cr_assert(dg_ref_same_bytes(got, want, no * 2, why, sizeof(why)), "%s: %s", plan.canonical, why);
	for (size_t i = no; i < no + 8; i++)
		cr_assert_eq(got[i], 0xeeee, "%s: written past the output", plan.canonical);
	free(y), free(w), free(f), free(sa), free(ws), free(got), free(want);
	dg_codegen_destroy(cg);
}
