/*
 * The attention family's kernels (templates/rope.lua, templates/attention.lua)
 * render and compile to sm_90 cubins without a GPU:
 *   - each op at its defaults, act f32 (fp32 FMA) and bf16 (tensor cores),
 *     at the BDH shape and at a small odd one (latent 100: 4-element bf16
 *     units; embd 48), and bf16 on sm_75 (the fp32 path);
 *   - each GEMM op on tiles off the default: one buffer (stages 1), BK 16
 *     and 64, 16x16 and 32x64 warp tiles, a tensor-core tile whose warp
 *     tile the tensor cores cannot run (the fp32 path takes it);
 *   - bad specs are refused naming the field (act, tile's BK, stages, the
 *     warp tile), by dg_spec_validate or the template's plan;
 *   - the _checks refuse wrong tensors by name, with no device;
 *   - scores and grad_xs with rope=pre on sm_90a take the warpgroup path
 *     (wgmma bf16) at its default and on other tiles (BM 64 and 128, BN 64
 *     to 256, BK 64, 3 and 4 stages), at the BDH shape and a small
 *     one; its tiles are refused off that path by name;
 *   - grad_xs epi=mask (add_mask fused) on the warpgroup path (sm_90a, its
 *     tiles, latent 8192, 64 and 100, dxs bf16 and f32: the plan's shared
 *     memory holds the staged tile) and on mma.sync and fp32 for sm_80;
 *     its checks: dxs and mask_xs needed, grad_xs refused, formats and
 *     shapes by name, dxs overlapping an input refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "dragon/spec.h"
#include "runtime/ops/checks.h"
#include "runtime/store/nvrtc.h"
#include "nvrtc_helpers.h"

static const dg_op gemms[] = { DG_OP_ATTENTION_SCORES, DG_OP_ATTENTION_OUT, DG_OP_ATTENTION_GRAD_SCORES,
			       DG_OP_ATTENTION_GRAD_V, DG_OP_ATTENTION_GRAD_XS };
#define N_GEMMS 5

static dg_spec spec_of(dg_op op, dg_fmt act, int arch)
{
	dg_spec s;
	dg_spec_init(&s, op);
	if (dg_spec_uses(op) & DG_FIELD_ACT)
		s.act = act;
	s.arch = arch;
	return s;
}

Test(nvrtc_attention, rope_every_act_and_shape)
{
	dg_codegen *cg = nh_codegen();
	for (int a = 0; a < 2; a++)
		for (int small = 0; small < 2; small++) {
			dg_spec s = spec_of(DG_OP_ROPE_FWD, a ? DG_FMT_BF16 : DG_FMT_F32, 90);
			if (small)
				s.heads = 3, s.latent = 100;
			nh_compile(cg, &s, "path: element-wise", 90);
			s = spec_of(DG_OP_ROPE_BWD, DG_FMT_F32, 90);
			if (small)
				s.heads = 3, s.latent = 100;
			s.tile.threads = a ? 128 : 0;
			nh_compile(cg, &s, "path: element-wise", 90);
		}
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention, gemms_at_their_defaults)
{
	dg_codegen *cg = nh_codegen();
	for (int o = 0; o < N_GEMMS; o++) {
		/* bf16 on tensor cores; f32 and sm_75 bf16 on the fp32 path */
		dg_spec s = spec_of(gemms[o], DG_FMT_BF16, 90);
		nh_compile(cg, &s, "path: tensor cores", 90);
		s = spec_of(gemms[o], DG_FMT_F32, 90);
		nh_compile(cg, &s, "path: fp32 FMA", 90);
		s = spec_of(gemms[o], DG_FMT_BF16, 75);
		nh_compile(cg, &s, "path: fp32 FMA", 90);
		/* small odd shape: 4-element bf16 units along latent */
		for (int a = 0; a < 2; a++) {
			s = spec_of(gemms[o], a ? DG_FMT_BF16 : DG_FMT_F32, 80);
			s.heads = 3;
			s.latent = 100;
			s.embd = 48;
			nh_compile(cg, &s, a ? "path: tensor cores" : "path: fp32 FMA", 90);
		}
	}
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention, gemms_on_other_tiles)
{
	static const struct {
		dg_tile tile;
		bool mma; /* the bf16 spec takes the tensor cores */
	} tiles[] = {
		{ { 64, 64, 16, 2, 2, 1, 0 }, true },	/* one buffer, 32x32 warp tiles */
		{ { 32, 64, 64, 2, 1, 2, 0 }, true },	/* 16x64 warp tiles, BK 64 */
		{ { 128, 64, 32, 4, 1, 2, 0 }, true },	/* 32x64 */
		{ { 64, 32, 8, 2, 2, 2, 0 }, false },	/* BK 8: fp32 path for bf16 too */
		{ { 32, 32, 16, 4, 2, 2, 0 }, false },	/* warp tile 8x16: fp32 */
	};
	dg_codegen *cg = nh_codegen();
	for (int o = 0; o < N_GEMMS; o++)
		for (size_t i = 0; i < sizeof(tiles) / sizeof(tiles[0]); i++)
			for (int a = 0; a < 2; a++) {
				dg_spec s = spec_of(gemms[o], a ? DG_FMT_BF16 : DG_FMT_F32, 90);
				s.heads = 2;
				s.latent = 128;
				s.embd = 64;
				s.tile = tiles[i].tile;
				nh_compile(cg, &s, a && tiles[i].mma ? "path: tensor cores" : "path: fp32 FMA", 90);
			}
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention, bad_specs_are_refused_naming_the_field)
{
	dg_codegen *cg = nh_codegen();
	for (int o = 0; o < N_GEMMS; o++) {
		dg_spec s = spec_of(gemms[o], DG_FMT_BF16, 90);
		s.act = DG_FMT_INT8;
		nh_expect_refused(cg, &s, "act");
		s = spec_of(gemms[o], DG_FMT_BF16, 90);
		s.tile = (dg_tile){ 64, 64, 256, 2, 2, 2, 0 };
		nh_expect_refused(cg, &s, "BK");
		s.tile = (dg_tile){ 64, 64, 32, 2, 2, 3, 0 };
		nh_expect_refused(cg, &s, "stages");
		s.tile = (dg_tile){ 64, 64, 32, 2, 8, 2, 0 }; /* warp tile 32x8 */
		nh_expect_refused(cg, &s, "warp's tile");
		s.tile = (dg_tile){ 0, 0, 0, 0, 0, 0, 128 };
		nh_expect_refused(cg, &s, "tile");
	}
	dg_spec r = spec_of(DG_OP_ROPE_FWD, DG_FMT_BF16, 90);
	r.tile.threads = 48;
	nh_expect_refused(cg, &r, "threads");
	r = spec_of(DG_OP_ROPE_FWD, DG_FMT_UINT8POS, 90);
	nh_expect_refused(cg, &r, "act");
	dg_codegen_destroy(cg);
}

/* ---- the checks, without a device ------------------------------------------------ */

/* A _check refused the call naming `name`. */
#define expect_named(st, msg, name) nh_expect_named(st, msg, name, NULL)

#define P(i) ((dg_dptr)0x100000 * (i))

Test(nvrtc_attention, checks_refuse_wrong_tensors_by_name)
{
	dg_spec s = spec_of(DG_OP_ATTENTION_SCORES, DG_FMT_BF16, 90);
	s.heads = 2;
	s.latent = 64;
	char msg[512];
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, P(1), 2, 2, 7, 64);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, P(2), 7, 64);
	dg_tensor sc = dg_tensor_4d("scores", DG_FMT_BF16, P(3), 2, 2, 7, 7);
	dg_attention_scores_args a = { .xs = &xs, .rope = &rope, .scores = &sc };
	cr_assert_eq(dg_attention_scores_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	sc.shape[3] = 8; /* not square */
	expect_named(dg_attention_scores_check(&s, &a, msg, sizeof(msg)), msg, "scores");
	sc.shape[3] = 7;
	rope.shape[1] = 32; /* the table is (T, L): cos and sin interleaved */
	expect_named(dg_attention_scores_check(&s, &a, msg, sizeof(msg)), msg, "rope");
	rope.shape[1] = 64;
	rope.fmt = DG_FMT_BF16;
	expect_named(dg_attention_scores_check(&s, &a, msg, sizeof(msg)), msg, "rope");
	rope.fmt = DG_FMT_F32;
	xs.fmt = DG_FMT_F32; /* not the spec's act */
	expect_named(dg_attention_scores_check(&s, &a, msg, sizeof(msg)), msg, "xs");

	dg_spec v = spec_of(DG_OP_ATTENTION_GRAD_V, DG_FMT_F32, 90);
	v.heads = 2;
	v.embd = 32;
	dg_tensor s2 = dg_tensor_4d("scores", DG_FMT_F32, P(1), 2, 2, 5, 5);
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, P(2), 2, 2, 5, 32);
	dg_tensor gv = dg_tensor_4d("grad_v", DG_FMT_F32, P(3), 2, 2, 5, 32); /* heads: 1 */
	dg_attention_grad_v_args va = { .scores = &s2, .grad = &g, .grad_v = &gv };
	expect_named(dg_attention_grad_v_check(&v, &va, msg, sizeof(msg)), msg, "grad_v");
	gv.shape[1] = 1;
	cr_assert_eq(dg_attention_grad_v_check(&v, &va, msg, sizeof(msg)), DG_OK, "%s", msg);
	g.shape[2] = 6; /* T differs from the scores' */
	expect_named(dg_attention_grad_v_check(&v, &va, msg, sizeof(msg)), msg, "grad");

	/* a spec of another op */
	dg_spec other = spec_of(DG_OP_ATTENTION_OUT, DG_FMT_F32, 90);
	cr_assert_eq(dg_attention_grad_v_check(&other, &va, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "attention_out"), "%s", msg);
}

/* ---- the sm_90a warpgroup path ----------------------------------------------------- */

static dg_spec wg_spec(dg_op op, int heads, int latent)
{
	dg_spec s = spec_of(op, DG_FMT_BF16, 90);
	s.arch_specific = true;
	s.rope_pre = true;
	s.heads = heads;
	s.latent = latent;
	return s;
}

Test(nvrtc_attention, warpgroup_path_on_its_tiles)
{
	static const dg_tile tiles[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },          { 64, 64, 64, 4, 1, 3, 0 },
		{ 128, 256, 64, 8, 1, 4, 0 },     { 64, 128, 64, 4, 1, 3, 0 },
	};
	dg_codegen *cg = nh_codegen();
	const dg_op ops[2] = { DG_OP_ATTENTION_SCORES, DG_OP_ATTENTION_GRAD_XS };
	for (int o = 0; o < 2; o++)
		for (int small = 0; small < 2; small++)
			for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++) {
				dg_spec s = wg_spec(ops[o], small ? 2 : 4, small ? 64 : 8192);
				s.tile = tiles[k];
				dg_plan p;
				cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
				/* the auto tile: the warp-specialized path (L % 8 == 0),
				 * grad_xs's persistent form */
				bool ws = dg_tile_is_auto(&tiles[k]);
				const char *wpath = o ? "wgmma tma persistent" : "wgmma tma";
				cr_assert_str_eq(p.path, ws ? wpath : "wgmma bf16", "%s", p.canonical);
				cr_assert(p.needs_arch_specific);
				cr_assert_eq(p.entries[0].threads, p.spec.tile.wm * 32 + (ws ? 128 : 0), "%s", p.canonical);
				nh_compile(cg, &s, ws ? "path: warp-specialized wgmma" : "path: warpgroup tensor cores (wgmma",
					   90);
			}
	/* a ring of 5 to 8 stages: the warp-specialized form of attention_scores
	 * and attention_grad_xs (a producer warpgroup beside the tile's warps,
	 * every operand by TMA), on tiles whose ring fits shared memory; not
	 * where rows of L are no tensor map's (L % 8 != 0) */
	static const dg_tile deep[] = {
		{ 128, 128, 64, 8, 1, 5, 0 }, { 128, 128, 64, 8, 1, 6, 0 }, { 64, 128, 64, 4, 1, 8, 0 },
		{ 64, 64, 64, 4, 1, 8, 0 },   { 128, 256, 64, 8, 1, 4, 0 },
	};
	for (int o = 0; o < 2; o++)
	for (int small = 0; small < 2; small++)
		for (size_t k = 0; k < sizeof(deep) / sizeof(deep[0]); k++) {
			dg_spec s = wg_spec(ops[o], small ? 2 : 4, small ? 64 : 8192);
			s.tile = deep[k];
			dg_plan p;
			cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
			bool ws = deep[k].stages >= 5;
			cr_assert_str_eq(p.path, ws ? "wgmma tma" : "wgmma bf16", "%s", p.canonical);
			cr_assert_eq(p.entries[0].threads, p.spec.tile.wm * 32 + (ws ? 128 : 0), "%s", p.canonical);
			nh_compile(cg, &s, ws ? "path: warp-specialized wgmma" : "path: warpgroup tensor cores (wgmma", 90);
		}
	for (int o = 0; o < 2; o++) {
		dg_spec s = wg_spec(ops[o], 2, 100);
		s.tile = deep[0];
		dg_plan p;
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC, "%s", dg_codegen_errmsg(cg));
	}
	/* 128 x 256 with 5 stages: 240 KiB of ring, past shared memory */
	dg_spec big = wg_spec(DG_OP_ATTENTION_SCORES, 4, 8192);
	big.tile = (dg_tile){ 128, 256, 64, 8, 1, 5, 0 };
	dg_plan bp;
	cr_assert_eq(dg_codegen_plan(cg, &big, &bp), DG_ERR_INVALID_SPEC);
	/* grad_xs out=bf16 on both tensor-core paths and the fp32 one */
	dg_spec gb = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
	gb.out = DG_FMT_BF16;
	nh_compile(cg, &gb, "path: warp-specialized wgmma", 90);
	gb.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 };
	nh_compile(cg, &gb, "path: warpgroup tensor cores (wgmma", 90);
	gb.tile = (dg_tile){ 128, 128, 32, 2, 4, 2, 0 };
	nh_compile(cg, &gb, "path: tensor cores (mma.sync", 90);
	gb = spec_of(DG_OP_ATTENTION_GRAD_XS, DG_FMT_F32, 90);
	gb.out = DG_FMT_BF16;
	nh_compile(cg, &gb, "path: fp32", 90);
	/* rope=pre on an mma.sync tile: the warp tensor cores read it raw */
	dg_spec s = wg_spec(DG_OP_ATTENTION_SCORES, 4, 8192);
	s.tile = (dg_tile){ 128, 128, 32, 2, 4, 2, 0 };
	nh_compile(cg, &s, "path: tensor cores (mma.sync", 90);
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention, warpgroup_tiles_off_its_path_are_refused)
{
	dg_codegen *cg = nh_codegen();
	dg_plan p;
	/* stages 3: the warpgroup path's, which rope=load cannot take */
	dg_spec s = wg_spec(DG_OP_ATTENTION_SCORES, 4, 8192);
	s.rope_pre = false;
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages must be 1 to 2"), "%s", dg_codegen_errmsg(cg));
	/* a 3-stage tile that is not a warpgroup one, on the warpgroup op */
	s.rope_pre = true;
	s.tile = (dg_tile){ 128, 128, 64, 2, 4, 3, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages 3 and 4 are the sm_90a warpgroup path's"), "%s",
		  dg_codegen_errmsg(cg));
	/* 5 stages on a tile that is not a warpgroup one: the warp-specialized
	 * path's rule; 9: past its ring of 8 */
	s.tile = (dg_tile){ 128, 128, 64, 2, 4, 5, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages 5 to 8 are the warp-specialized sm_90a path's"), "%s",
		  dg_codegen_errmsg(cg));
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 9, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	/* nor attention_out (its mask is applied on the load) */
	s = wg_spec(DG_OP_ATTENTION_OUT, 4, 8192);
	s.rope_pre = false;
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 4, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	/* a warpgroup tile on sm_90 without the a: the mma.sync path, so 3 stages are refused */
	s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
	s.arch_specific = false;
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 };
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	dg_codegen_destroy(cg);
}

/* ---- epi=mask: add_mask fused into grad_xs ----------------------------------------- */

/* The fused epilogue compiles on every path: the warpgroup one (sm_90a,
 * its staged epilogue) on its tiles, at the BDH shape and at latent 64
 * and 100 (L % 8 != 0: the pair-by-pair columns), dxs bf16 and f32; the
 * mma.sync and fp32 ones for sm_80 (their pair store). Its kernel takes
 * dxs and mask_xs where the store's takes grad_xs. The plan's shared
 * memory holds the staged f32 tile (BM x (BN + 8) floats and the 1 KiB
 * alignment), and the ring's where that is larger: the store's (the
 * persistent form, the auto tile, keeps the staged tile beside its ring). */
Test(nvrtc_attention, epi_mask_on_every_path)
{
	static const dg_tile tiles[] = {
		{ 0, 0, 0, 0, 0, 0, 0 },          { 64, 64, 64, 4, 1, 3, 0 },
		{ 128, 256, 64, 8, 1, 4, 0 },     { 64, 128, 64, 4, 1, 3, 0 },
	};
	static const int latents[] = { 8192, 64, 100 };
	dg_codegen *cg = nh_codegen();
	for (size_t li = 0; li < sizeof(latents) / sizeof(latents[0]); li++)
		for (int ob = 0; ob < 2; ob++)
			for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++) {
				if (li > 0 && k > 1)
					continue; /* the small shapes: two tiles */
				dg_spec s = wg_spec(DG_OP_ATTENTION_GRAD_XS, latents[li] == 8192 ? 4 : 2, latents[li]);
				s.epi = DG_EPI_MASK;
				s.out = ob ? DG_FMT_BF16 : DG_FMT_F32;
				s.tile = tiles[k];
				dg_plan p, ps;
				cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
				/* the auto tile where L % 8 == 0: the warp-specialized
				 * path's persistent form, whose staged tile lies beside
				 * its ring (so the mask's plan is the larger) */
				bool ws = dg_tile_is_auto(&tiles[k]) && latents[li] % 8 == 0;
				cr_assert_str_eq(p.path, ws ? "wgmma tma persistent" : "wgmma bf16", "%s", p.canonical);
				dg_spec st = s;
				st.epi = DG_EPI_STORE;
				cr_assert_eq(dg_codegen_plan(cg, &st, &ps), DG_OK, "%s", dg_codegen_errmsg(cg));
				int bm = p.spec.tile.bm, bn = p.spec.tile.bn;
				cr_assert_geq(p.entries[0].smem, bm * (bn + 8) * 4 + 1024, "%s", p.canonical);
				if (ws)
					cr_assert_gt(p.entries[0].smem, ps.entries[0].smem, "%s: the staged tile beside the ring",
						     p.canonical);
				else
					cr_assert_eq(p.entries[0].smem, ps.entries[0].smem, "%s: the ring is the larger",
						     p.canonical);
				cr_assert(strstr(p.canonical, ";epi=mask;"), "%s", p.canonical);
				nh_compile(cg, &s, "epi=mask: dxs", 90);
			}
	/* the ABI in the banner: dxs and mask_xs, no grad_xs */
	dg_spec s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
	s.epi = DG_EPI_MASK;
	s.out = DG_FMT_BF16;
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text,
			 "OT *dxs, const XT *mask_xs, int B, int T, const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb, const __grid_constant__ dg_tmap md, const __grid_constant__ dg_tmap mx, const __grid_constant__ dg_tmap mr)"),
		  "the banner's ABI: the epilogue's maps after the ring's");
	cr_assert_null(strstr(src->text, "grad_xs, int B"), "epi=mask writes no grad_xs");
	/* bf16 dxs on the persistent form: the epilogue's operands by TMA
	 * (templates/attention_tma.lua M.tma_epi), dxs stored back by TMA */
	cr_assert(strstr(src->text, "dg_tma_store(&md, ebase + s * ESLOT + ER_BYTES, n0 + EC * e, m0, z);"),
		  "the epilogue by TMA");
	cr_assert_null(strstr(src->text, "dg_mask_chunk(po, pm, rope, m, n, v)"), "no staged epilogue");
	dg_source_destroy(src);
	/* f32 dxs: the staged epilogue, two maps */
	s.out = DG_FMT_F32;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "OT *dxs, const XT *mask_xs, int B, int T, const __grid_constant__ dg_tmap ma, const __grid_constant__ dg_tmap mb)"),
		  "the banner's ABI");
	cr_assert(strstr(src->text, "dg_mask_chunk(po, pm, rope, m, n, v)"), "the staged epilogue");
	cr_assert_null(strstr(src->text, "dg_tma_store"), "no epilogue by TMA");
	dg_source_destroy(src);
	/* sm_80: mma.sync (bf16) and fp32 (f32, and a SIMT tile), either dxs */
	for (int ob = 0; ob < 2; ob++)
		for (int small = 0; small < 2; small++) {
			dg_spec m = spec_of(DG_OP_ATTENTION_GRAD_XS, DG_FMT_BF16, 80);
			m.epi = DG_EPI_MASK;
			m.out = ob ? DG_FMT_BF16 : DG_FMT_F32;
			if (small)
				m.heads = 3, m.latent = 100;
			nh_compile(cg, &m, "path: tensor cores (mma.sync", 80);
			m.rope_pre = true;
			nh_compile(cg, &m, "epi=mask: dxs", 80);
			m.act = DG_FMT_F32;
			m.rope_pre = false;
			nh_compile(cg, &m, "path: fp32 FMA", 80);
			m.act = DG_FMT_BF16;
			m.tile = (dg_tile){ 64, 32, 8, 2, 2, 2, 0 };
			nh_compile(cg, &m, "path: fp32 FMA", 80);
		}
	dg_codegen_destroy(cg);
}

/* The fused call's checks, no device: dxs and mask_xs needed, grad_xs
 * refused, dxs in the spec's out, mask_xs in act and of xs's shape, and
 * dxs overlapping any input (xs, mask_xs, grad_scores, rope) refused by
 * name. */
Test(nvrtc_attention, epi_mask_checks)
{
	dg_spec s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 2, 64);
	s.epi = DG_EPI_MASK;
	s.out = DG_FMT_BF16;
	char msg[512];
	dg_tensor c = dg_tensor_4d("grad_scores", DG_FMT_BF16, P(1), 2, 2, 7, 7);
	dg_tensor qr = dg_tensor_4d("xs", DG_FMT_BF16, P(2), 2, 2, 7, 64);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, P(3), 7, 64);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_BF16, P(4), 2, 2, 7, 64);
	dg_tensor mx = dg_tensor_4d("mask_xs", DG_FMT_BF16, P(5), 2, 2, 7, 64);
	dg_tensor gx = dg_tensor_4d("grad_xs", DG_FMT_BF16, P(6), 2, 2, 7, 64);
	dg_attention_grad_xs_args a = { .grad_scores = &c, .xs = &qr, .rope = &rope, .dxs = &dxs, .mask_xs = &mx };
	cr_assert_eq(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	a.grad_xs = &gx;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "grad_xs");
	cr_assert(strstr(msg, "epi=mask does not take it"), "%s", msg);
	a.grad_xs = NULL;
	a.dxs = NULL;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "dxs");
	a.dxs = &dxs;
	a.mask_xs = NULL;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "mask_xs");
	a.mask_xs = &mx;
	dxs.fmt = DG_FMT_F32; /* out=bf16 */
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "dxs");
	dxs.fmt = DG_FMT_BF16;
	mx.shape[2] = 8;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "mask_xs");
	mx.shape[2] = 7;
	/* overlaps: the same buffer, and a view that starts inside it */
	dg_dptr at[4] = { mx.data, qr.data, c.data + 64, rope.data };
	const char *name[4] = { "mask_xs", "xs", "grad_scores", "rope" };
	for (int i = 0; i < 4; i++) {
		dxs.data = at[i];
		cr_assert_eq(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG, "over %s",
			     name[i]);
		cr_assert(strncmp(msg, "dxs: ", 5) == 0 && strstr(msg, name[i]) && strstr(msg, "overlaps"), "%s",
			  msg);
	}
	dxs.data = P(4);
	cr_assert_eq(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* epi=store: the other way round */
	s.epi = DG_EPI_STORE;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "grad_xs");
	a.grad_xs = &gx;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "dxs");
	a.dxs = NULL;
	expect_named(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), msg, "mask_xs");
	a.mask_xs = NULL;
	cr_assert_eq(dg_attention_grad_xs_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
}

/* attention_grad_xs's persistent form (templates/attention_tma.lua
 * M.persistent_ok): 4 stages at BN 128 or 64 where rows of L are a tensor
 * map's, both epilogues, both heights; its threads are the warp-specialized
 * form's, its shared memory the ring, the barriers and (epi=mask) the
 * epilogue's slots (bf16 dxs) or the f32 tile (f32 dxs) beside them; at BN 256, at L % 8 != 0 and for attention_scores a
 * ring of 4 stages stays the cp.async ring. */
Test(nvrtc_attention, persistent_grad_xs)
{
	static const dg_tile tiles[] = { { 128, 128, 64, 8, 1, 4, 0 }, { 64, 128, 64, 4, 1, 4, 0 },
					 { 128, 64, 64, 8, 1, 4, 0 } };
	dg_codegen *cg = nh_codegen();
	for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++)
		for (int mask = 0; mask < 2; mask++) {
			dg_spec s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
			s.tile = tiles[k];
			if (mask)
				s.epi = DG_EPI_MASK, s.out = DG_FMT_BF16;
			dg_plan p;
			cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
			cr_assert_str_eq(p.path, "wgmma tma persistent", "%s", p.canonical);
			const dg_tile *t = &tiles[k];
			cr_assert_eq(p.entries[0].threads, t->wm * 32 + 128, "%s", p.canonical);
			int ring = 4 * (t->bm + t->bn) * 64 * 2 + 24 * 4; /* full, empty, ready */
			/* epi=mask, bf16: 3 slots of the epilogue's subtiles (BM x 32:
			 * f32 table, bf16 dxs and mask_xs) and their barriers */
			int want = (mask ? (ring + 1023) / 1024 * 1024 + 3 * t->bm * 256 + 16 * 3 : ring) + 1024;
			cr_assert_eq(p.entries[0].smem, want, "%s: %d bytes", p.canonical, p.entries[0].smem);
			nh_compile(cg, &s, mask ? "subtiles of 32 columns by TMA into 3 slots" : "persistent: the producer fills the ring", 90);
			if (mask) { /* f32 dxs: the staged f32 tile beside the ring */
				s.out = DG_FMT_F32;
				cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
				want = (ring + 1023) / 1024 * 1024 + t->bm * (t->bn + 8) * 4 + 1024;
				cr_assert_eq(p.entries[0].smem, want, "%s: %d bytes", p.canonical, p.entries[0].smem);
				nh_compile(cg, &s, "the f32 tile staged through shared memory", 90);
			}
		}
	dg_spec s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
	s.tile = (dg_tile){ 128, 256, 64, 8, 1, 4, 0 };
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16", "BN 256: %s", p.canonical);
	s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 2, 100);
	s.tile = tiles[0];
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16", "L 100: %s", p.canonical);
	s = wg_spec(DG_OP_ATTENTION_SCORES, 4, 8192);
	s.tile = tiles[0];
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16", "scores: %s", p.canonical);
	/* rope=load: the persistent form with its turners (the stages' RoPE),
	 * both epilogues; the block's own rings are rope=pre's alone */
	for (int mask = 0; mask < 2; mask++) {
		s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
		s.rope_pre = false;
		s.tile = tiles[0];
		if (mask)
			s.epi = DG_EPI_MASK, s.out = DG_FMT_BF16;
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "wgmma tma persistent", "%s", p.canonical);
		nh_compile(cg, &s, "dg_turn", 90);
	}
	s = wg_spec(DG_OP_ATTENTION_GRAD_XS, 4, 8192);
	s.rope_pre = false;
	s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
	cr_assert_neq(dg_codegen_plan(cg, &s, &p), DG_OK, "rope=load at 5 stages: %s", p.canonical);
	dg_codegen_destroy(cg);
}
