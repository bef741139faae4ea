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
	fn((unsigned)((B * T + t->bm - 1) / t->bm), (unsigned)((L + t->bn - 1) / t->bn), (unsigned)H,
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

static void persistent_tma_form_is_the_ring_form(dg_codegen *cg);
static void ys_made_in_the_tile_is_the_pair(dg_codegen *cg);

Test(emu_decoder_gate, warpgroup_path_against_the_reference, .timeout = 2400)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 4);
	check(cg, &r, 1, 136, 2, 200, 64, 0.0f);
	check(cg, &r, 1, 136, 2, 200, 64, 0.1f);
	/* and the persistent form by TMA against this ring form, and ys made
	 * in the tile against the pair */
	persistent_tma_form_is_the_ring_form(cg);
	ys_made_in_the_tile_is_the_pair(cg);
	dg_codegen_destroy(cg);
}

/* ---- the persistent form by TMA (templates/decoder_gate_tma.lua) ----------
 * Its _cast entry, then the kernel on 3 blocks that walk the tiles (the
 * ring's and the slots' phases running on from tile to tile), with the
 * six maps as runtime/ops/gate.c makes them, against the ring form's
 * kernel run the same way: the same MMAs in the same order on the same
 * bf16 operands and the gate's roundings, so the same bytes, dropout's
 * bits included (drawn a block by one quad thread and shuffled here, by
 * each vector's thread there). Shapes: T not whole tiles (rows past T
 * clipped by the maps), L not whole tiles nor subtiles (L 200: the last
 * subtile 8 columns wide), several K steps; elem0 whole Philox blocks
 * and not (each element drawn by itself). Checked to fail with the quad's
 * masks taken unswapped and with the dys box stored over dxs's. */

typedef void (*dgt_fn)(unsigned g, unsigned nt, size_t smem, const float *grad, void *copy, const void *w,
		       const void *xs, const void *ys, void *dxs, void *dys, int B, int T, float p,
		       unsigned long long seed, unsigned step, unsigned layer, unsigned long long elem0,
		       const eh_tmap *maps);

static const char GLUE_TMA[] =
	"extern \"C\" void dg_emu_entry_tma(unsigned g, unsigned nt, size_t smem, const float *grad, void *copy,\n"
	"	const void *w, const void *xs, const void *ys, void *dxs, void *dys, int B, int T, float p,\n"
	"	unsigned long long seed, unsigned step, unsigned layer, unsigned long long elem0, const dg_emu_tmap *m)\n"
	"{\n"
	"	dg_tmap ma, mb, mx, my, md, me;\n"
	"	memcpy(&ma, &m[0], sizeof(dg_emu_tmap)), memcpy(&mb, &m[1], sizeof(dg_emu_tmap));\n"
	"	memcpy(&mx, &m[2], sizeof(dg_emu_tmap)), memcpy(&my, &m[3], sizeof(dg_emu_tmap));\n"
	"	memcpy(&md, &m[4], sizeof(dg_emu_tmap)), memcpy(&me, &m[5], sizeof(dg_emu_tmap));\n"
	"	const long long n8 = (long long)B * T * E / 8;\n"
	"	dg_emu_launch3({ 2, 1, 1 }, 256, 0, [&] { dg_decoder_gate_bwd_cast(grad, (unsigned short *)copy, n8); });\n"
	"	dg_emu_launch3({ g, 1, 1 }, nt, smem, [&] {\n"
	"		dg_decoder_gate_bwd(grad, (const WT *)w, (const XT *)xs, (const XT *)ys, (GT *)dxs, (GT *)dys, B, T,\n"
	"				    p, seed, step, layer, nullptr, elem0, ma, mb, mx, my, md, me);\n"
	"	});\n"
	"}\n";

static void check_tma(dg_codegen *cg, dg_rng *r, int B, int T, int H, int L, int E, float p,
		      unsigned long long elem0)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD);
	s.weight = DG_FMT_BF16, s.act = DG_FMT_BF16, s.out = DG_FMT_BF16;
	s.heads = H, s.latent = L, s.embd = E;
	s.arch = 90, s.arch_specific = true;
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(plan.path, "wgmma tma persistent", "%s", plan.canonical);
	cr_assert_eq(plan.n_entries, 2, "%s: the kernel and its _cast", plan.canonical);
	cr_assert_str_eq(plan.entries[1].name, "dg_decoder_gate_bwd_cast");
	dgt_fn ft = (dgt_fn)eh_build(cg, &s, GLUE_TMA, "dg_emu_entry_tma");
	/* the ring form (the default tile) */
	dg_spec rs = s;
	rs.tile = (dg_tile){ 0 };
	dg_spec_normalize(&rs);
	dg_plan rp;
	cr_assert_eq(dg_codegen_plan(cg, &rs, &rp), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(rp.path, "wgmma bf16", "%s", rp.canonical);
	dgb_fn fr = (dgb_fn)eh_build(cg, &rs, GLUE, "dg_emu_entry");

	const size_t ng = (size_t)B * T * E, nw = (size_t)E * H * L, nx = (size_t)B * H * T * L;
	uint16_t *w = rand_bf16(r, nw), *xs = rand_bf16(r, nx), *ys = rand_bf16(r, nx);
	float *grad = malloc(ng * sizeof(float));
	uint16_t *copy = malloc(ng * 2 + 16);
	uint16_t *dxs = malloc(nx * 2 + 16), *dys = malloc(nx * 2 + 16), *wx = malloc(nx * 2 + 16), *wy = malloc(nx * 2 + 16);
	cr_assert(grad && copy && dxs && dys && wx && wy);
	dg_rng_fill(r, DG_FMT_F32, grad, ng); /* f32, not bf16-exact: the cast rounds it */
	memset(dxs, 0xff, nx * 2 + 16), memset(dys, 0xff, nx * 2 + 16);
	memset(wx, 0xee, nx * 2 + 16), memset(wy, 0xee, nx * 2 + 16);
	const unsigned bm = (unsigned)plan.spec.tile.bm;
	eh_tmap m[6] = {
		eh_tmap3(copy, 2, (uint64_t)E, (uint64_t)T, (uint64_t)B, 64, bm),
		eh_tmap3(w, 2, (uint64_t)H * L, (uint64_t)E, 1, 64, 64),
		eh_tmap3(xs, 2, (uint64_t)L, (uint64_t)T, (uint64_t)B * H, 32, bm),
		eh_tmap3(ys, 2, (uint64_t)L, (uint64_t)T, (uint64_t)B * H, 32, bm),
		eh_tmap3(dxs, 2, (uint64_t)L, (uint64_t)T, (uint64_t)B * H, 32, bm),
		eh_tmap3(dys, 2, (uint64_t)L, (uint64_t)T, (uint64_t)B * H, 32, bm),
	};
	for (int i = 2; i < 6; i++)
		m[i].swizzle = 64;
	const unsigned long long seed = 5;
	const unsigned step = 3, layer = 2;
	ft(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, grad, copy, w, xs, ys, dxs, dys, B, T, p,
	   seed, step, layer, elem0, m);
	const dg_tile *t = &rp.spec.tile;
	fr((unsigned)((B * T + t->bm - 1) / t->bm), (unsigned)((L + t->bn - 1) / t->bn), (unsigned)H,
	   (unsigned)rp.entries[0].threads, (size_t)rp.entries[0].smem, grad, w, xs, ys, wx, wy, B, T, p, seed, step,
	   layer, elem0);
	char why[512];
	cr_assert(dg_ref_same_bytes(dxs, wx, nx * 2, why, sizeof(why)), "%s p %g elem0 %llu: dxs against the ring form: %s",
		  plan.canonical, (double)p, elem0, why);
	cr_assert(dg_ref_same_bytes(dys, wy, nx * 2, why, sizeof(why)), "%s p %g elem0 %llu: dys against the ring form: %s",
		  plan.canonical, (double)p, elem0, why);
	for (size_t i = nx; i < nx + 8; i++)
		cr_assert(dxs[i] == 0xffff && dys[i] == 0xffff, "%s: written past the output", plan.canonical);
	free(w), free(xs), free(ys), free(grad), free(copy), free(dxs), free(dys), free(wx), free(wy);
}

/* (run by warpgroup_path_against_the_reference, below the ring form's own
 * checks, as ys_made_in_the_tile_is_the_pair is: this suite's checks in
 * parallel Tests left Criterion's runner leaking 48 bytes under
 * LeakSanitizer) */
static void persistent_tma_form_is_the_ring_form(dg_codegen *cg)
{
	dg_rng r;
	dg_rng_seed(&r, 17);
	check_tma(cg, &r, 2, 136, 2, 200, 128, 0.1f, 0);
	check_tma(cg, &r, 1, 72, 1, 136, 64, 0.1f, 3);
	check_tma(cg, &r, 1, 64, 2, 64, 192, 0.0f, 16);
}

/* ---- ys made in the tile (op decoder_gate_bwd_ys) ---------------------------
 * The fused kernel against the pair it replaces, bit for bit: ys as the
 * encoder_v projection writes it (dg_ref_run of lowrank_fwd, which every
 * projection path matches bit for bit), then decoder_gate_bwd's kernel of
 * the same path reading that ys. The dxy sums run the same MMAs (or FMAs)
 * in the same order, so dxs and dys must be the same bytes; a ys off by
 * one bf16 unit anywhere shows. Shapes: B·T and L not whole tiles, a
 * ReLU threshold that zeroes part of ys, per-token and per-channel scales
 * and per-tensor ones, int8 and uint8pos codes. */

typedef void (*dgy_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const float *grad,
		       const void *w, const void *xs, const void *aq, const float *sa, const void *ev,
		       const float *sw, void *dxs, void *dys, int B, int T, float p, unsigned long long seed,
		       unsigned step, unsigned layer, unsigned long long elem0);

static const char GLUE_YS[] =
	"extern \"C\" void dg_emu_entry_ys(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const float *grad, const void *w, const void *xs, const void *aq, const float *sa, const void *ev,\n"
	"	const float *sw, void *dxs, void *dys, int B, int T, float p, unsigned long long seed, unsigned step,\n"
	"	unsigned layer, unsigned long long elem0)\n"
	"{\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_decoder_gate_bwd_ys(grad, (const WT *)w, (const XT *)xs, (const AT *)aq, sa, (const VT *)ev, sw,\n"
	"				       (GT *)dxs, (GT *)dys, B, T, p, seed, step, layer, nullptr, elem0);\n"
	"	});\n"
	"}\n";

/* n codes: int8 in [-127, 127], or (u8) uint8pos in [0, 255] */
static uint8_t *rand_codes(dg_rng *r, size_t n, bool u8)
{
	uint8_t *c = malloc(n + 16);
	float *f = malloc(n * sizeof(float));
	cr_assert(c && f);
	dg_rng_fill(r, DG_FMT_F32, f, n);
	for (size_t i = 0; i < n; i++) {
		int v = (int)((f[i] + 1.0f) * 127.5f); /* 0 .. 255 */
		v = v > 255 ? 255 : v;
		c[i] = u8 ? (uint8_t)v : (uint8_t)(int8_t)(v - 128 < -127 ? -127 : v - 128);
	}
	free(f);
	return c;
}

/* n scales in [lo, 2·lo] */
static float *rand_scales(dg_rng *r, size_t n, float lo)
{
	float *s = malloc(n * sizeof(float));
	cr_assert_not_null(s);
	dg_rng_fill(r, DG_FMT_F32, s, n);
	for (size_t i = 0; i < n; i++)
		s[i] = lo + 0.5f * lo * (s[i] + 1.0f);
	return s;
}

static void check_ys(dg_codegen *cg, dg_rng *r, int B, int T, int H, int L, int E, float p, dg_fmt act,
		     bool vec_scales, int sm)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD_YS);
	s.act = act, s.weight = DG_FMT_INT8, s.src = DG_FMT_BF16, s.out = DG_FMT_BF16;
	s.ascale = vec_scales ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
	s.wscale = vec_scales ? DG_SCALE_CHANNEL : DG_SCALE_TENSOR;
	s.relu = true, s.relu_thr = 0.125f;
	s.heads = H, s.latent = L, s.embd = E;
	s.arch = sm, s.arch_specific = sm == 90;
	dg_spec_normalize(&s);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(plan.path, sm == 90 ? "wgmma s8 + bf16" : "fp32", "%s", plan.canonical);
	dgy_fn fy = (dgy_fn)eh_build(cg, &s, GLUE_YS, "dg_emu_entry_ys");

	/* the pair: lowrank_fwd's ys, then decoder_gate_bwd on the same path */
	dg_spec lr;
	dg_spec_init(&lr, DG_OP_LOWRANK_FWD);
	lr.heads = H, lr.in_heads = H, lr.latent = L, lr.embd = E;
	lr.act = act, lr.weight = DG_FMT_INT8, lr.out = DG_FMT_BF16, lr.ascale = s.ascale, lr.wscale = s.wscale;
	lr.relu = true, lr.relu_thr = s.relu_thr;
	dg_spec_normalize(&lr);
	dg_spec g;
	dg_spec_init(&g, DG_OP_DECODER_GATE_BWD);
	g.weight = DG_FMT_BF16, g.act = DG_FMT_BF16, g.out = DG_FMT_BF16;
	g.heads = H, g.latent = L, g.embd = E;
	g.arch = sm, g.arch_specific = sm == 90;
	dg_spec_normalize(&g);
	dg_plan gp;
	cr_assert_eq(dg_codegen_plan(cg, &g, &gp), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(gp.spec.tile.bm, plan.spec.tile.bm);
	cr_assert_eq(gp.spec.tile.bn, plan.spec.tile.bn);
	dgb_fn fg = (dgb_fn)eh_build(cg, &g, GLUE, "dg_emu_entry");

	const size_t ng = (size_t)B * T * E, nw = (size_t)E * H * L, nx = (size_t)B * H * T * L;
	const size_t na = (size_t)B * H * T * E, ne = (size_t)H * L * E;
	uint16_t *gb = rand_bf16(r, ng), *w = rand_bf16(r, nw), *xs = rand_bf16(r, nx);
	float *grad = widen(gb, ng);
	uint8_t *aq = rand_codes(r, na, act == DG_FMT_UINT8POS), *ev = rand_codes(r, ne, false);
	/* y = acc·sa·sw − thr of order 1 (|acc| about 7e4 at E 256) */
	const size_t nsa = vec_scales ? (size_t)B * H * T : 1, nsw = vec_scales ? (size_t)H * L : 1;
	float *sa = rand_scales(r, nsa, 2e-3f), *sw = rand_scales(r, nsw, 3e-3f);
	uint16_t *ys = malloc(nx * 2 + 16);
	uint16_t *dxs = malloc(nx * 2 + 16), *dys = malloc(nx * 2 + 16), *wx = malloc(nx * 2 + 16), *wy = malloc(nx * 2 + 16);
	cr_assert(ys && dxs && dys && wx && wy);
	dg_ref_call c;
	memset(&c, 0, sizeof(c));
	c.in[0] = aq, c.in[1] = ev;
	if (vec_scales)
		c.scale_v[0] = sa, c.scale_v[1] = sw;
	else
		c.scale[0] = sa[0], c.scale[1] = sw[0];
	c.out = ys;
	c.b = B, c.t = T;
	cr_assert_eq(dg_ref_run(&lr, &c), DG_OK);
	size_t pos = 0, zero = 0;
	for (size_t i = 0; i < nx; i++)
		pos += ys[i] != 0 && !(ys[i] & 0x8000), zero += ys[i] == 0;
	cr_assert(pos > nx / 5 && zero > nx / 5, "ys: %zu positive, %zu zero of %zu: the ReLU must cut", pos, zero, nx);

	memset(dxs, 0xff, nx * 2 + 16), memset(dys, 0xff, nx * 2 + 16);
	memset(wx, 0xee, nx * 2 + 16), memset(wy, 0xee, nx * 2 + 16);
	const unsigned long long seed = 9, elem0 = 0;
	const unsigned step = 2, layer = 1;
	const dg_tile *t = &plan.spec.tile;
	fy((unsigned)((B * T + t->bm - 1) / t->bm), (unsigned)((L + t->bn - 1) / t->bn), (unsigned)H,
	   (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, grad, w, xs, aq, sa, ev, sw, dxs, dys, B,
	   T, p, seed, step, layer, elem0);
	fg((unsigned)((B * T + t->bm - 1) / t->bm), (unsigned)((L + t->bn - 1) / t->bn), (unsigned)H,
	   (unsigned)gp.entries[0].threads, (size_t)gp.entries[0].smem, grad, w, xs, ys, wx, wy, B, T, p, seed, step,
	   layer, elem0);
	char why[512];
	cr_assert(dg_ref_same_bytes(dxs, wx, nx * 2, why, sizeof(why)), "%s p %g: dxs against the pair: %s",
		  plan.canonical, (double)p, why);
	cr_assert(dg_ref_same_bytes(dys, wy, nx * 2, why, sizeof(why)), "%s p %g: dys against the pair: %s",
		  plan.canonical, (double)p, why);
	for (size_t i = nx; i < nx + 8; i++)
		cr_assert(dxs[i] == 0xffff && dys[i] == 0xffff, "%s: written past the output", plan.canonical);
	/* and the pair's kernel against the reference, as the test above */
	cr_assert_eq(dg_ref_decoder_gate_bwd(&gp.spec, grad, w, xs, ys, B, T, p, seed, step, layer, elem0, wx, wy),
		     DG_OK);
	char what[700];
	snprintf(what, sizeof(what), "%s p %g: dxs (reference)", plan.canonical, (double)p);
	expect_close(what, dxs, wx, nx);
	snprintf(what, sizeof(what), "%s p %g: dys (reference)", plan.canonical, (double)p);
	expect_close(what, dys, wy, nx);
	free(gb), free(w), free(xs), free(grad), free(aq), free(ev), free(sa), free(sw), free(ys);
	free(dxs), free(dys), free(wx), free(wy);
}

static void ys_made_in_the_tile_is_the_pair(dg_codegen *cg)
{
	dg_rng r;
	dg_rng_seed(&r, 11);
	check_ys(cg, &r, 1, 136, 2, 200, 256, 0.1f, DG_FMT_INT8, true, 90);
	check_ys(cg, &r, 2, 40, 1, 136, 192, 0.0f, DG_FMT_UINT8POS, false, 90);
	check_ys(cg, &r, 1, 72, 2, 100, 256, 0.1f, DG_FMT_INT8, true, 80);
}
