/*
 * decoder_grad_weight's warp-specialized form (templates/grad_wgmma.lua
 * DGW_WS_KERNEL: the gradient's bf16 copy made by the module's _cast entry
 * (which the ring form reads too, through registers) and loaded by TMA, y's chunks by cp.async into raw slots a producer
 * thread decodes itself, full / empty mbarriers, two consumer
 * warpgroups) run on the CPU (tests/emu_helpers.h) against the ring form
 * (the same module family's 128x128x64/8x1/2, which the GPU suite checks
 * against the reference) bit for bit: the same roundings, the same sums
 * step for step. y as uint8pos codes with a scale a token (w8a8's
 * decoder), int8 codes with a tensor scale, and bf16; eight K steps (the
 * ring of 5 stages and the 4 raw slots wrap), two heads, two column
 * tiles, with and without a K split (the partials then compared); and the
 * ring form's BM 256 tile (four warpgroups, rows past E) likewise. A
 * swapped raw slot, a decode of another thread's chunk or a missing
 * arrival fails or hangs it.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "nvrtc_helpers.h"

typedef void (*dgw_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const float *grad,
		       const void *y, const float *sa, float *dst, int B, int T, int splits, int per, void *copy,
		       const eh_tmap *ma);

/* The ring form: the cast into copy, then the kernel on the copy. */
static const char GLUE_RING[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const float *grad, const void *y, const float *sa, float *dst, int B, int T, int splits, int per,\n"
	"	void *copy, const void *ma)\n"
	"{\n"
	"	(void)ma;\n"
	"	const long long n8 = (long long)B * T * E / 8;\n"
	"	dg_emu_launch(2, 256, 0, [&] { dg_decoder_grad_weight_cast(grad, (unsigned short *)copy, n8); });\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_decoder_grad_weight((const GT *)copy, (const %s *)y, sa, dst, B, T, splits, per, 0);\n"
	"	});\n"
	"}\n";

/* The warp-specialized form: the cast into copy, then the kernel with the
 * map over it (runtime/ops/grad.c ws_tmaps). */
static const char GLUE_WS[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const float *grad, const void *y, const float *sa, float *dst, int B, int T, int splits, int per,\n"
	"	void *copy, const void *ma)\n"
	"{\n"
	"	const long long n8 = (long long)B * T * E / 8;\n"
	"	dg_emu_launch(2, 256, 0, [&] { dg_decoder_grad_weight_cast(grad, (unsigned short *)copy, n8); });\n"
	"	dg_tmap a;\n"
	"	memcpy(&a, ma, sizeof(dg_emu_tmap));\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_decoder_grad_weight((const GT *)copy, (const %s *)y, sa, dst, B, T, splits, per, 0, a, a);\n"
	"	});\n"
	"}\n";

enum { B = 2, T = 256, H = 2, E = 128, L = 256 };

static void run_form(dg_codegen *cg, const dg_spec *base, dg_tile tile, const float *grad, const void *y,
		     const float *sa, int splits, float *dst)
{
	dg_spec s = *base;
	s.tile = tile;
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const bool ws = tile.stages >= 5;
	cr_assert_str_eq(plan.path, ws ? "wgmma tma" : "wgmma bf16", "%s", plan.canonical);
	const char *yt = s.act == DG_FMT_BF16 ? "unsigned short" : "int";
	char glue[2048];
	snprintf(glue, sizeof(glue), ws ? GLUE_WS : GLUE_RING, yt);
	dgw_fn fn = (dgw_fn)eh_build(cg, &s, glue, "dg_emu_entry");
	unsigned short *copy = malloc((size_t)B * T * E * 2);
	cr_assert_not_null(copy);
	const eh_tmap ma = eh_tmap3(copy, 2, E, T, B, 64, 64);
	const int steps = B * T / 64, per = (steps + splits - 1) / splits;
	fn(L / tile.bn, (E + tile.bm - 1) / tile.bm, (unsigned)(H * splits), (unsigned)plan.entries[0].threads,
	   (size_t)plan.entries[0].smem, grad, y, sa, dst, B, T, splits, per, copy, &ma);
	free(copy);
}

static void case_of(dg_fmt act, dg_scale_gran ascale, uint64_t seed)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, seed);
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_GRAD_WEIGHT);
	s.act = act, s.ascale = ascale;
	s.heads = H, s.latent = L, s.embd = E;
	s.arch = 90, s.arch_specific = true;
	const size_t ng = (size_t)B * T * E, ny = (size_t)B * H * T * L, nw = (size_t)H * L * E;
	float *grad = malloc(ng * sizeof(float)), *f = malloc(ny * sizeof(float));
	float *sa = malloc((size_t)B * T * sizeof(float));
	unsigned char *y = malloc(ny * 2 + 16);
	cr_assert(grad && f && sa && y);
	dg_rng_fill(&r, DG_FMT_F32, grad, ng);
	dg_rng_fill(&r, DG_FMT_F32, f, ny);
	if (act == DG_FMT_BF16) {
		uint16_t *yb = (uint16_t *)y;
		for (size_t i = 0; i < ny; i++) { /* bf16 of [0, 2), a third zeros (the ReLU) */
			const float v = f[i] < -0.33f ? 0.0f : f[i] + 1.0f;
			uint32_t u;
			memcpy(&u, &v, 4);
			yb[i] = (uint16_t)(u >> 16);
		}
	} else {
		for (size_t i = 0; i < ny; i++)
			y[i] = act == DG_FMT_UINT8POS ? (f[i] < -0.8f ? 0 : (unsigned char)((f[i] + 1.0f) * 127.9f))
						      : (unsigned char)(signed char)(int)(f[i] * 127.0f);
	}
	dg_rng_fill(&r, DG_FMT_F32, sa, (size_t)B * T);
	for (int i = 0; i < B * T; i++)
		sa[i] = 0.001f + 0.0005f * (sa[i] + 1.0f);
	for (int splits = 1; splits <= 2; splits++) {
		const size_t n = (size_t)splits * nw;
		float *ring = malloc(n * sizeof(float) + 64), *wsf = malloc(n * sizeof(float) + 64),
		      *tall = malloc(n * sizeof(float) + 64), *low = malloc(n * sizeof(float) + 64);
		cr_assert(ring && wsf && tall && low);
		memset(ring, 0xee, n * sizeof(float) + 64);
		memset(wsf, 0xee, n * sizeof(float) + 64);
		memset(tall, 0xee, n * sizeof(float) + 64);
		run_form(cg, &s, (dg_tile){ 128, 128, 64, 8, 1, 2, 0 }, grad, y, sa, splits, ring);
		run_form(cg, &s, (dg_tile){ 128, 128, 64, 8, 1, 5, 0 }, grad, y, sa, splits, wsf);
		/* BM 256 (four warpgroups; E = 128: half its rows past E) */
		run_form(cg, &s, (dg_tile){ 256, 128, 64, 16, 1, 3, 0 }, grad, y, sa, splits, tall);
		for (size_t i = 0; i < n + 16; i++)
			if (memcmp(&ring[i], &tall[i], 4) != 0)
				cr_assert_fail("act %d, splits %d: word %zu: ring %.9g, BM 256 %.9g", (int)act, splits, i,
					       (double)ring[i], (double)tall[i]);
		/* BM 64, both forms: two m-tiles by two n-tiles a head, the
		 * blocks' tiles taken m fastest (tiles.lua M_FASTEST) */
		for (int st = 2; st <= 5; st += 3) {
			memset(low, 0xee, n * sizeof(float) + 64);
			run_form(cg, &s, (dg_tile){ 64, 128, 64, 4, 1, st, 0 }, grad, y, sa, splits, low);
			for (size_t i = 0; i < n + 16; i++)
				if (memcmp(&ring[i], &low[i], 4) != 0)
					cr_assert_fail("act %d, splits %d: word %zu: ring %.9g, BM 64 stages %d %.9g", (int)act,
						       splits, i, (double)ring[i], st, (double)low[i]);
		}
		free(low);
		size_t nz = 0;
		for (size_t i = 0; i < n; i++)
			nz += ring[i] != 0.0f;
		cr_assert_gt(nz, n / 2, "the ring form wrote %zu nonzero sums of %zu", nz, n);
		for (size_t i = 0; i < n; i++)
			if (memcmp(&ring[i], &wsf[i], 4) != 0)
				cr_assert_fail("act %d, splits %d: sum %zu (d %zu, h·L + l %zu): ring %.9g, warp-specialized %.9g",
					       (int)act, splits, i, (i % nw) / ((size_t)H * L), i % ((size_t)H * L),
					       (double)ring[i], (double)wsf[i]);
		const unsigned char *tail = (const unsigned char *)(wsf + n);
		for (int i = 0; i < 64; i++)
			cr_assert_eq(tail[i], 0xee, "written past the output");
		free(ring), free(wsf), free(tall);
	}
	free(grad), free(f), free(sa), free(y);
	dg_codegen_destroy(cg);
}

Test(emu_grad, dgw_warp_specialized_codes_a_scale_a_token, .timeout = 900)
{
	case_of(DG_FMT_UINT8POS, DG_SCALE_TOKEN, 31);
}

Test(emu_grad, dgw_warp_specialized_int8_a_tensor_scale, .timeout = 900)
{
	case_of(DG_FMT_INT8, DG_SCALE_TENSOR, 32);
}

Test(emu_grad, dgw_warp_specialized_bf16, .timeout = 900)
{
	case_of(DG_FMT_BF16, DG_SCALE_TENSOR, 33);
}

/* The w8a8 decode of y (templates/grad_wgmma.lua dg_u8x4_bf16_scaled: a
 * code times its token's scale by one fma, (2^23 + c)·s − 2^23·s) against
 * the two steps it replaces (dg_u8x4_bf16, then __fmul_rn and bf16) and
 * against the C product rounded to bf16 (nearest even), bit for bit: every
 * code, at scales of every kind — ordinary, 1/255, subnormal, the largest
 * whose 2^23·s is finite (just under 2^105), 2^105 and past it (the two
 * steps' branch), infinite and zero. */
static const char GLUE_DECODE[] =
	"extern \"C\" void dg_emu_entry(const unsigned *w, const float *s, unsigned *fast, unsigned *slow, int n)\n"
	"{\n"
	"	for (int i = 0; i < n; i++) {\n"
	"		const uint2 a = dg_u8x4_bf16_scaled(w[i], s[i]), v = dg_u8x4_bf16(w[i]);\n"
	"		fast[2 * i] = a.x, fast[2 * i + 1] = a.y;\n"
	"		slow[2 * i] = dg_bf16x2(__fmul_rn(__uint_as_float(v.x << 16), s[i]),\n"
	"					__fmul_rn(__uint_as_float(v.x & 0xffff0000u), s[i]));\n"
	"		slow[2 * i + 1] = dg_bf16x2(__fmul_rn(__uint_as_float(v.y << 16), s[i]),\n"
	"					    __fmul_rn(__uint_as_float(v.y & 0xffff0000u), s[i]));\n"
	"	}\n"
	"}\n";

typedef void (*decode_fn)(const unsigned *w, const float *s, unsigned *fast, unsigned *slow, int n);

static uint16_t bf16_rne(float v)
{
	uint32_t u;
	memcpy(&u, &v, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

Test(emu_grad, dgw_scaled_decode_bit_for_bit, .timeout = 300)
{
	dg_codegen *cg = nh_codegen();
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_WEIGHT);
	sp.act = DG_FMT_UINT8POS, sp.ascale = DG_SCALE_TOKEN;
	sp.heads = H, sp.latent = L, sp.embd = E;
	sp.arch = 90, sp.arch_specific = true;
	sp.tile = (dg_tile){ 128, 128, 64, 8, 1, 2, 0 };
	dg_spec_normalize(&sp);
	decode_fn fn = (decode_fn)eh_build(cg, &sp, GLUE_DECODE, "dg_emu_entry");
	const float scales[] = { 0.00123f, 1.0f / 255.0f, 0.5f, 3.0e-39f, 1.0e-45f, 0x1.fffffep104f, 0x1p105f, 0x1p110f,
				 1.0e36f, INFINITY, 0.0f, 7.77e-3f };
	enum { NS = sizeof(scales) / sizeof(scales[0]), NW = 64 * NS };
	unsigned w[NW], fast[2 * NW], slow[2 * NW];
	float s[NW];
	for (int i = 0; i < NW; i++) { /* the 256 codes, 4 a word, at each scale */
		const unsigned c = (unsigned)(i % 64) * 4;
		w[i] = c | (c + 1) << 8 | (c + 2) << 16 | (c + 3) << 24;
		s[i] = scales[i / 64];
	}
	fn(w, s, fast, slow, NW);
	int slow_branch = 0;
	for (int i = 0; i < NW; i++) {
		slow_branch += isinf(8388608.0f * s[i]) != 0;
		for (int k = 0; k < 4; k++) {
			const unsigned c = (w[i] >> (8 * k)) & 0xffu;
			const unsigned got = (fast[2 * i + k / 2] >> (16 * (k & 1))) & 0xffffu,
				       two = (slow[2 * i + k / 2] >> (16 * (k & 1))) & 0xffffu;
			cr_assert_eq(got, two, "code %u at scale %a: one fma 0x%04x, two steps 0x%04x", c, (double)s[i], got,
				     two);
			const float p = (float)c * s[i];
			if (!isnan(p))
				cr_assert_eq(got, bf16_rne(p), "code %u at scale %a: 0x%04x, the product's bf16 0x%04x", c,
					     (double)s[i], got, bf16_rne(p));
		}
	}
	cr_assert_eq(slow_branch, 4 * 64, "scales of 2^105 and more take the two steps (%d words)", slow_branch);
	dg_codegen_destroy(cg);
}
