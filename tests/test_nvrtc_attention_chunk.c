/*
 * The chunked attention without a GPU (templates/attention_chunk.lua,
 * runtime/ops/attention_chunk.c, the chunked chains of
 * runtime/ops/attention.c):
 *   - each of the six ops renders and compiles with NVRTC (the three GEMMs
 *     for sm_90a, the helpers for sm_90) at the BDH shape, at chunks 64,
 *     128 and 512, at a ragged latent (136), at embd an odd number of 64s
 *     (192, 320) and on the tiles the plan takes (BM 64 and 128, BN 64 to
 *     256, 5 to 8 stages);
 *   - what the plan refuses, naming the field: the GEMMs off sm_90a, D not
 *     a multiple of 64, a chunk the tile's rows do not divide, a tile off
 *     the warp-specialized form; the spec's chunk off its range;
 *   - the ops' checks refuse by name: T not a multiple of the chunk, the
 *     states' shape, an output over an input, another op's spec;
 *   - the chains with a chunk, run with no device (an op runner that only
 *     lists the specs: what a model would prepare), run exactly the ops of
 *     the chunked form in order, each op's check passing on the chain's
 *     tensors, every listed spec compiling; their workspaces are the sum
 *     of the parts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "dragon/spec.h"
#include "nvrtc_helpers.h"
#include "runtime/ops/checks.h"
#include "runtime/ops/ops_int.h"

static const dg_op chunk_ops[] = { DG_OP_ATTENTION_CHUNK_STATE, DG_OP_ATTENTION_CHUNK_OUT, DG_OP_ATTENTION_CHUNK_DQ,
				   DG_OP_ATTENTION_CHUNK_VREP, DG_OP_ATTENTION_CHUNK_CAST,
				   DG_OP_ATTENTION_CHUNK_HSUM };
#define N_OPS 6

static dg_spec op_spec(dg_op op, int heads, int latent, int embd, int chunk)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = heads;
	s.latent = latent;
	s.embd = embd;
	s.chunk = chunk;
	dg_spec_normalize(&s);
	return s;
}

Test(nvrtc_attention_chunk, every_op_compiles_at_the_bdh_shape_and_small_ones)
{
	dg_codegen *cg = nh_codegen();
	/* heads, latent, embd, chunk: embd an odd number of 64s takes 64-wide
	 * columns (state, out) */
	static const int shapes[][4] = { { 4, 8192, 256, 256 }, { 2, 128, 64, 64 }, { 3, 136, 128, 128 },
					 { 16, 16384, 1280, 512 }, { 3, 2048, 192, 256 }, { 5, 6144, 320, 128 } };
	for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++)
		for (int i = 0; i < N_OPS; i++) {
			dg_spec s = op_spec(chunk_ops[i], shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3]);
			nh_compile(cg, &s, "templates/attention_chunk.lua", 90);
			if (dg_spec_uses(s.op) & DG_FIELD_OUT) { /* the other output format */
				s.out = s.out == DG_FMT_F32 ? DG_FMT_BF16 : DG_FMT_F32;
				nh_compile(cg, &s, NULL, 90);
			}
			if (dg_spec_uses(s.op) & DG_FIELD_IN_HEADS) { /* the gradient's heads */
				s.in_heads = s.heads;
				nh_compile(cg, &s, NULL, 90);
			}
		}
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention_chunk, gemms_on_other_tiles)
{
	dg_codegen *cg = nh_codegen();
	static const dg_tile tiles[] = {
		{ 64, 128, 64, 4, 1, 5, 0 }, { 64, 64, 64, 4, 1, 8, 0 }, { 128, 64, 64, 8, 1, 6, 0 },
		{ 128, 64, 64, 8, 1, 8, 0 }, { 64, 256, 64, 4, 1, 5, 0 },
	};
	for (size_t k = 0; k < sizeof(tiles) / sizeof(tiles[0]); k++)
		for (int i = 0; i < 3; i++) {
			dg_spec s = op_spec(chunk_ops[i], 4, 8192, 256, 128);
			s.tile = tiles[k];
			dg_plan p;
			cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", dg_op_name(s.op), dg_codegen_errmsg(cg));
			cr_assert_str_eq(p.path, "wgmma tma");
			nh_compile(cg, &s, NULL, 90);
		}
	dg_codegen_destroy(cg);
}

Test(nvrtc_attention_chunk, bad_specs_are_refused_naming_the_field)
{
	dg_codegen *cg = nh_codegen();
	for (int i = 0; i < 3; i++) {
		dg_spec s = op_spec(chunk_ops[i], 4, 8192, 256, 256);
		s.arch_specific = false; /* sm_90 without its arch-specific features */
		nh_expect_refused(cg, &s, "sm_90a");
		s = op_spec(chunk_ops[i], 4, 8192, 96, 256);
		nh_expect_refused(cg, &s, "embd=96");
		s = op_spec(chunk_ops[i], 4, 8192, 256, 256);
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 3, 0 }; /* three stages: not the warp-specialized form */
		nh_expect_refused(cg, &s, "warp-specialized");
		s.chunk = 96;
		nh_expect_refused(cg, &s, "chunk=96");
		s.chunk = 8192;
		nh_expect_refused(cg, &s, "chunk=8192");
	}
	/* a 64-row chunk and a 128-row tile: the output's and dq's tiles would
	 * straddle two chunks */
	for (int i = 1; i < 3; i++) {
		dg_spec s = op_spec(chunk_ops[i], 4, 8192, 256, 64);
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 6, 0 };
		nh_expect_refused(cg, &s, "chunk 64");
	}
	/* the values copied 16 bytes at a time */
	dg_spec s = op_spec(DG_OP_ATTENTION_CHUNK_VREP, 4, 8192, 100, 256);
	nh_expect_refused(cg, &s, "embd=100");
	dg_codegen_destroy(cg);
}

/* ---- the checks ------------------------------------------------------------------ */

#define AT(i) ((dg_dptr)0x10000000 * (dg_dptr)(i + 1))

Test(nvrtc_attention_chunk, checks_refuse_by_name)
{
	char msg[512];
	const int B = 2, H = 4, T = 512, N = 256, D = 64, C = 128;
	dg_spec s = op_spec(DG_OP_ATTENTION_CHUNK_STATE, H, N, D, C);
	dg_tensor qr = dg_tensor_4d("qr", DG_FMT_BF16, AT(0), B, H, T, N);
	dg_tensor v = dg_tensor_4d("v", DG_FMT_BF16, AT(1), B, 1, T, D);
	dg_tensor st = dg_tensor_4d("states", DG_FMT_BF16, AT(2), B, H, 2 * N * (T / C), D);
	dg_attention_chunk_state_args a = { .qr = &qr, .src = &v, .states = &st };
	cr_assert_eq(dg_attention_chunk_state_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* T not a multiple of the chunk: said before the states' shape */
	dg_tensor qr2 = dg_tensor_4d("qr", DG_FMT_BF16, AT(0), B, H, T - 64, N);
	dg_tensor v2 = dg_tensor_4d("v", DG_FMT_BF16, AT(1), B, 1, T - 64, D);
	dg_attention_chunk_state_args a2 = { .qr = &qr2, .src = &v2, .states = &st };
	nh_expect_named(dg_attention_chunk_state_check(&s, &a2, msg, sizeof(msg)), msg, "dg_attention_chunk_state",
			"chunk=128");
	/* the states of another chunk */
	dg_tensor st2 = dg_tensor_4d("states", DG_FMT_BF16, AT(2), B, H, 2 * N * (T / 64), D);
	a.states = &st2;
	nh_expect_named(dg_attention_chunk_state_check(&s, &a, msg, sizeof(msg)), msg, "states", NULL);
	a.states = &st;
	/* the gradient's heads with in_heads 1 */
	dg_tensor g = dg_tensor_4d("src", DG_FMT_BF16, AT(1), B, H, T, D);
	a.src = &g;
	nh_expect_named(dg_attention_chunk_state_check(&s, &a, msg, sizeof(msg)), msg, "src", NULL);
	a.src = &v;
	/* states over qr */
	dg_tensor st3 = dg_tensor_4d("states", DG_FMT_BF16, AT(0) + 4096, B, H, 2 * N * (T / C), D);
	a.states = &st3;
	dg_status rc = dg_attention_chunk_state_check(&s, &a, msg, sizeof(msg));
	cr_assert_eq(rc, DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "states: overlaps qr"), "%s", msg);
	/* another op's spec */
	dg_spec o = op_spec(DG_OP_ATTENTION_CHUNK_OUT, H, N, D, C);
	a.states = &st;
	cr_assert_neq(dg_attention_chunk_state_check(&o, &a, msg, sizeof(msg)), DG_OK);
	/* dq: dxs over mask_xs */
	dg_spec q = op_spec(DG_OP_ATTENTION_CHUNK_DQ, H, N, D, C);
	dg_tensor cc = dg_tensor_4d("grad_scores", DG_FMT_BF16, AT(3), B, H, T, C);
	dg_tensor gb = dg_tensor_4d("grad", DG_FMT_BF16, AT(4), B, H, T, D);
	dg_tensor rs = dg_tensor_4d("rstates", DG_FMT_BF16, AT(5), B, H, 2 * N * (T / C), D);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, AT(6), T, N);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_F32, AT(7), B, H, T, N);
	dg_tensor mask = dg_tensor_4d("mask_xs", DG_FMT_BF16, AT(8), B, H, T, N);
	dg_attention_chunk_dq_args qa = { .grad_scores = &cc, .qr = &qr, .grad = &gb, .v = &v, .states = &st,
					  .rstates = &rs, .rope = &rope, .dxs = &dxs, .mask_xs = &mask };
	cr_assert_eq(dg_attention_chunk_dq_check(&q, &qa, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_tensor mask2 = dg_tensor_4d("mask_xs", DG_FMT_BF16, AT(7), B, H, T, N);
	qa.mask_xs = &mask2;
	rc = dg_attention_chunk_dq_check(&q, &qa, msg, sizeof(msg));
	cr_assert_eq(rc, DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "dxs: overlaps mask_xs"), "%s", msg);
	/* the chunks' C of another chunk */
	qa.mask_xs = &mask;
	dg_tensor cc2 = dg_tensor_4d("grad_scores", DG_FMT_BF16, AT(3), B, H, T, T);
	qa.grad_scores = &cc2;
	nh_expect_named(dg_attention_chunk_dq_check(&q, &qa, msg, sizeof(msg)), msg, "grad_scores", NULL);
}

/* ---- the chains, listed --------------------------------------------------------- */

typedef struct listed {
	dg_spec s[32];
	int n;
} listed;

static dg_status collect(void *user, const dg_spec *spec)
{
	listed *l = user;
	cr_assert_lt(l->n, 32);
	l->s[l->n++] = *spec;
	return DG_OK;
}

/* The model's chain spec on sm_90 (gpu_nodes.c attn_spec). */
static dg_spec chain_spec(int H, int N, int D)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_ATTENTION_SCORES);
	s.heads = H, s.latent = N, s.embd = D;
	s.act = DG_FMT_BF16;
	s.arch = 90;
	s.arch_specific = s.rope_pre = true;
	return s;
}

static void expect_ops(const listed *l, const dg_op *want, int n, const char *what)
{
	cr_assert_eq(l->n, n, "%s: %d ops listed, not %d", what, l->n, n);
	for (int i = 0; i < n; i++)
		cr_assert_eq(l->s[i].op, want[i], "%s: op %d is %s, not %s", what, i, dg_op_name(l->s[i].op),
			     dg_op_name(want[i]));
}

Test(nvrtc_attention_chunk, chains_list_the_chunked_ops)
{
	const int B = 2, H = 4, T = 1024, N = 256, D = 64, C = 256;
	dg_spec sp = chain_spec(H, N, D);
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, AT(0), B, H, T, N);
	dg_tensor v = dg_tensor_4d("v", DG_FMT_BF16, AT(1), B, 1, T, D);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, AT(2), T, N);
	dg_tensor sc = dg_tensor_4d("scores", DG_FMT_BF16, AT(3), B, H, T, C);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_BF16, AT(4), B, H, T, D);
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, AT(5), B, H, T, D);
	dg_tensor gv = dg_tensor_4d("grad_v", DG_FMT_F32, AT(6), B, 1, T, D);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_BF16, AT(7), B, H, T, N);
	dg_tensor qr = dg_tensor_4d("qr", DG_FMT_BF16, AT(8), B, H, T, N);
	dg_codegen *cg = nh_codegen();
	for (int kept = 0; kept < 2; kept++) {
		listed l = { .n = 0 };
		dg__op_exec x = dg__exec_eager(NULL);
		x.sink = collect;
		x.sink_user = &l;
		dg__exec_begin(&x, true);
		dg_attention_fwd_args fa = { .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .out = &out,
					     .qr = kept ? &qr : NULL, .chunk = C, .ws = { AT(9), 1u << 30 } };
		cr_assert_eq(dg__attention_fwd_exec(&x, &sp, &fa), DG_OK);
		/* the forward makes RoPE(xs) either way: into the kept qr, which
		 * the backward then reads, or into its workspace */
		const dg_op fwd[] = { DG_OP_ROPE_FWD, DG_OP_ATTENTION_CHUNK_VREP, DG_OP_ATTENTION_SCORES,
				      DG_OP_ATTENTION_OUT, DG_OP_ATTENTION_CHUNK_STATE, DG_OP_ATTENTION_CHUNK_OUT };
		expect_ops(&l, fwd, 6, kept ? "forward, qr kept" : "forward");
		/* the quadratic ops fold the chunks into sequences of one head */
		cr_assert_eq(l.s[2].heads, 1);
		cr_assert_eq(l.s[3].heads, 1);
		cr_assert_eq(l.s[4].in_heads, 1);
		cr_assert_eq(l.s[4].chunk, C);
		cr_assert_eq(l.s[5].out, DG_FMT_BF16);
		int nf = l.n;
		dg_attention_bwd_args ba = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc,
					     .grad_v = &gv, .dxs = &dxs, .qr = kept ? &qr : NULL, .chunk = C,
					     .ws = { AT(10), 1u << 30 } };
		cr_assert_eq(dg__attention_bwd_exec(&x, &sp, &ba), DG_OK);
		const dg_op bwd[] = { DG_OP_ROPE_FWD,		  DG_OP_ATTENTION_CHUNK_CAST,  DG_OP_ATTENTION_CHUNK_VREP,
				      DG_OP_ATTENTION_GRAD_SCORES, DG_OP_ATTENTION_GRAD_V,	 DG_OP_ATTENTION_CHUNK_STATE,
				      DG_OP_ATTENTION_CHUNK_STATE, DG_OP_ATTENTION_CHUNK_OUT,	 DG_OP_ATTENTION_CHUNK_HSUM,
				      DG_OP_ATTENTION_CHUNK_DQ };
		listed lb = { .n = l.n - nf };
		memcpy(lb.s, l.s + nf, sizeof(dg_spec) * (size_t)lb.n);
		expect_ops(&lb, bwd + kept, 10 - kept, kept ? "backward, qr kept" : "backward");
		const int o = 1 - kept;
		cr_assert_eq(lb.s[o + 4].in_heads, 1); /* S from v */
		cr_assert_eq(lb.s[o + 5].in_heads, H); /* R from the gradient */
		cr_assert_eq(lb.s[o + 6].out, DG_FMT_F32); /* dv's per-head f32 sums */
		cr_assert_eq(lb.s[o + 8].out, DG_FMT_BF16); /* dxs's format */
		/* every spec the chains list compiles */
		for (int i = 0; kept == 0 && i < l.n; i++)
			nh_compile(cg, &l.s[i], NULL, 90);
		dg__exec_free(&x);
	}
	dg_codegen_destroy(cg);
	/* the workspaces: the parts, 256-byte aligned */
	size_t need = 0;
	dg_attention_fwd_args fa = { .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .out = &out, .chunk = C };
	cr_assert_eq(dg_attention_fwd_workspace(&sp, &fa, &need), DG_OK);
	const size_t bht = (size_t)B * H * T, states = (size_t)B * H * 2 * N * (T / C) * D * 2;
	cr_assert_eq(need, bht * N * 2 + bht * D * 2 + states);
	dg_attention_bwd_args ba = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .grad_v = &gv,
				     .dxs = &dxs, .qr = &qr, .chunk = C };
	cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need), DG_OK);
	cr_assert_eq(need, bht * D * 2 * 2 + bht * C * 2 + bht * D * 4 + 2 * states);
	/* refused with no device: T not a multiple of the chunk */
	listed l = { .n = 0 };
	dg__op_exec x = dg__exec_eager(NULL);
	x.sink = collect;
	x.sink_user = &l;
	dg__exec_begin(&x, true);
	fa.chunk = 384;
	fa.ws = (dg_workspace){ AT(9), 1u << 30 };
	cr_assert_eq(dg__attention_fwd_exec(&x, &sp, &fa), DG_ERR_INVALID_ARG);
	cr_assert_eq(l.n, 0);
	dg__exec_free(&x);
}

/* The quadratic backward's chain (no device: its ops listed): with
 * rope=pre and no qr it makes RoPE(xs) first (rope_fwd after C, in its
 * workspace); given the persistent form's tile (dragon/ops.h: the model's
 * DRAGON_ATTN_TURN) it makes none and grad_xs takes xs with rope=load on
 * that tile, the workspace C's alone; another tile changes nothing. */
Test(nvrtc_attention_chunk, quadratic_backward_turns_xs_on_the_persistent_tile)
{
	const int B = 2, H = 4, T = 512, N = 256, D = 64;
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, AT(0), B, H, T, N);
	dg_tensor v = dg_tensor_4d("v", DG_FMT_BF16, AT(1), B, 1, T, D);
	dg_tensor rope = dg_tensor_2d("rope", DG_FMT_F32, AT(2), T, N);
	dg_tensor sc = dg_tensor_4d("scores", DG_FMT_BF16, AT(3), B, H, T, T);
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, AT(5), B, H, T, D);
	dg_tensor gv = dg_tensor_4d("grad_v", DG_FMT_F32, AT(6), B, 1, T, D);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_BF16, AT(7), B, H, T, N);
	const size_t c_bytes = (size_t)B * H * T * T * 2, qr_bytes = (size_t)B * H * T * N * 2;
	for (int turn = 0; turn < 3; turn++) {
		dg_spec sp = chain_spec(H, N, D);
		if (turn == 1)
			sp.tile = (dg_tile){ 128, 128, 64, 8, 1, 4, 0 };
		if (turn == 2) /* not the persistent form: as without a tile */
			sp.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
		dg_attention_bwd_args ba = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc,
					     .grad_v = &gv, .dxs = &dxs, .ws = { AT(10), 1u << 30 } };
		size_t need = 0;
		cr_assert_eq(dg_attention_bwd_workspace(&sp, &ba, &need), DG_OK);
		cr_assert_eq(need, turn == 1 ? c_bytes : c_bytes + qr_bytes, "turn %d: %zu bytes", turn, need);
		listed l = { .n = 0 };
		dg__op_exec x = dg__exec_eager(NULL);
		x.sink = collect;
		x.sink_user = &l;
		dg__exec_begin(&x, true);
		cr_assert_eq(dg__attention_bwd_exec(&x, &sp, &ba), DG_OK);
		if (turn == 1) {
			const dg_op ops[] = { DG_OP_ATTENTION_GRAD_SCORES, DG_OP_ATTENTION_GRAD_V, DG_OP_ATTENTION_GRAD_XS };
			expect_ops(&l, ops, 3, "turning");
			const dg_spec *gx = &l.s[2];
			cr_assert(!gx->rope_pre && gx->epi == DG_EPI_MASK && gx->tile.stages == 4, "grad_xs: rope %s, stages %d",
				  gx->rope_pre ? "pre" : "load", gx->tile.stages);
		} else {
			const dg_op ops[] = { DG_OP_ROPE_FWD, DG_OP_ATTENTION_GRAD_SCORES, DG_OP_ATTENTION_GRAD_V,
					      DG_OP_ATTENTION_GRAD_XS };
			expect_ops(&l, ops, 4, turn ? "another tile" : "no tile");
			cr_assert(l.s[3].rope_pre && dg_tile_is_auto(&l.s[3].tile));
		}
		dg__exec_free(&x);
	}
}
