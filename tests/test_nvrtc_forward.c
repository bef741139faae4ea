/*
 * The forward GEMM kernels (lowrank_fwd, relu_mask, decoder_fwd) render and
 * NVRTC-compile to sm_90 cubins on every path — tensor cores (mma.sync),
 * dp4a, SIMT integer, fp32 — and each spec takes the path the templates
 * and codegen/spec.c promise (the source names its instruction), with the
 * launch info (threads, dynamic shared memory) reaching dg_source; and
 * bf16 × bf16 projections on the sm_90a warpgroup path (sm_90a cubins), or
 * fp32 where that path does not apply.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "runtime/store/nvrtc.h"

static char err[8192];

enum path { P_MMA, P_DP4A, P_FLOAT, P_SIMT_INT };

struct fcase {
	const char *text; /* spec text */
	enum path path;
};

static void spec_of(const char *text, dg_spec *s)
{
	cr_assert_eq(dg_spec_parse(text, s, err, sizeof(err)), DG_OK, "%s: %s", text, err);
}

/* Renders and compiles; checks the path by the instructions in the source
 * and the launch info of the first entry. */
static void compile_case(dg_codegen *cg, const struct fcase *c)
{
	dg_spec s;
	dg_source *src = NULL;
	dg__nvrtc_target t;
	dg__nvrtc_result res;

	spec_of(c->text, &s);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", c->text,
		     dg_codegen_errmsg(cg));
	/* the path's kernel: the text before the few-rows entry, which lowrank_fwd
	 * modules append (templates/lowrank_rows.lua: dp4a or fmaf of its own) */
	const char *rows = strstr(src->text, "\n// ---- dg_lowrank_fwd_rows");
	char *code = strndup(src->text, rows ? (size_t)(rows - src->text) : strlen(src->text));
	cr_assert_not_null(code);
	bool mma = strstr(code, "mma.sync.aligned.m16n8k32") != NULL;
	bool dp4a = strstr(code, "dp4a.") != NULL;
	switch (c->path) {
	case P_MMA:
		cr_assert(mma && !dp4a, "%s: expected the tensor-core path", c->text);
		break;
	case P_DP4A:
		cr_assert(dp4a && !mma, "%s: expected the dp4a path", c->text);
		break;
	case P_SIMT_INT:
		cr_assert(!mma && strstr(code, "acc[i][j] += av * bv[j]"),
			  "%s: expected the SIMT integer path", c->text);
		break;
	default:
		cr_assert(!mma && !dp4a && strstr(code, "fmaf("), "%s: expected the fp32 path",
			  c->text);
		break;
	}
	free(code);
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, err, sizeof(err)), DG_OK, "%s", err);
	dg_status st = dg__nvrtc_compile(src, &t, &res, err, sizeof(err));
	cr_assert_eq(st, DG_OK, "%s: %s", c->text, err);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", c->text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

static void compile_all(const struct fcase *cases, size_t n)
{
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < n; i++)
		compile_case(cg, &cases[i]);
	dg_codegen_destroy(cg);
}

Test(nvrtc_forward, lowrank_every_path)
{
	static const struct fcase cases[] = {
		/* default tile at BDH: tensor cores, every integer format pair */
		{ "op=lowrank_fwd;weight=int8;act=int8;out=int8", P_MMA },
		{ "op=lowrank_fwd;weight=ternary;act=int8;relu=0;out=uint8pos", P_MMA },
		{ "op=lowrank_fwd;weight=sign1;act=uint8pos;relu=0.25;out=f32", P_MMA },
		{ "op=lowrank_fwd;weight=int8;act=int4;out=bf16;in_heads=4", P_MMA },
		{ "op=lowrank_fwd;weight=ternary;act=uint8pos;out=int8;latent=200;embd=96", P_MMA },
		{ "op=lowrank_fwd;weight=sign1;act=int8;out=f32;embd=64;tile=64x64x32/2x2/1", P_MMA },
		{ "op=lowrank_fwd;weight=int8;act=int8;out=int8;tile=64x128x128/2x2/3", P_MMA },
		/* tiles the tensor cores cannot take: dp4a */
		{ "op=lowrank_fwd;weight=int8;act=int8;out=int8;tile=64x64x16/2x2/2", P_DP4A },
		{ "op=lowrank_fwd;weight=ternary;act=uint8pos;relu=0;out=uint8pos;tile=32x32x16/4x2/2", P_DP4A },
		{ "op=lowrank_fwd;weight=int8;act=int4;out=f32;embd=48", P_DP4A },
		/* any float operand */
		{ "op=lowrank_fwd;weight=f32;act=int8;out=int8", P_FLOAT },
		{ "op=lowrank_fwd;weight=ternary;act=bf16;relu=0;out=bf16", P_FLOAT },
	};
	compile_all(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(nvrtc_forward, relu_mask_every_path)
{
	static const struct fcase cases[] = {
		{ "op=relu_mask;weight=int8;act=int8;relu=0", P_MMA },
		{ "op=relu_mask;weight=ternary;act=uint8pos;relu=0.25;in_heads=4", P_MMA },
		{ "op=relu_mask;weight=sign1;act=int4;relu=0;embd=96;latent=200", P_MMA },
		{ "op=relu_mask;weight=int8;act=int8;relu=0;tile=64x64x16/2x2/2", P_DP4A },
		{ "op=relu_mask;weight=bf16;act=f32;relu=0", P_FLOAT },
	};
	compile_all(cases, sizeof(cases) / sizeof(cases[0]));
}

Test(nvrtc_forward, decoder_every_path)
{
	static const struct fcase cases[] = {
		{ "op=decoder_fwd;weight=int8;act=int8;out=f32", P_MMA },
		{ "op=decoder_fwd;weight=ternary;act=uint8pos;out=bf16", P_MMA },
		{ "op=decoder_fwd;weight=sign1;act=int4;out=f32;embd=96;latent=224", P_MMA },
		{ "op=decoder_fwd;weight=int8;act=int8;out=bf16;embd=64;latent=200", P_SIMT_INT },
		{ "op=decoder_fwd;weight=ternary;act=int8;out=f32;tile=64x64x16/2x2/2", P_SIMT_INT },
		{ "op=decoder_fwd;weight=f32;act=int8;out=f32", P_FLOAT },
		{ "op=decoder_fwd;weight=bf16;act=bf16;out=bf16;latent=200", P_FLOAT },
		{ "op=decoder_fwd;weight=sign1;act=f32;out=f32", P_FLOAT },
	};
	compile_all(cases, sizeof(cases) / sizeof(cases[0]));
}

/* The tensor-core kernels use dynamic shared memory: the template's launch
 * info must reach dg_source (templates/dragon.lua passes render's 4th value
 * through), else they would launch with none. */
Test(nvrtc_forward, launch_info_reaches_the_source)
{
	static const char *texts[] = {
		"op=lowrank_fwd;weight=int8;act=int8;out=int8",
		"op=relu_mask;weight=ternary;act=int8;relu=0",
		"op=decoder_fwd;weight=int8;act=int8;out=f32",
	};
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		dg_spec s;
		dg_source *src = NULL;

		spec_of(texts[i], &s);
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_not_null(src->block_threads, "%s: no launch info (threads)", texts[i]);
		cr_assert_not_null(src->dyn_smem, "%s: no launch info (smem)", texts[i]);
		cr_assert_eq(src->block_threads[0], s.op == DG_OP_DECODER_FWD ? 128 : 256, "%s", texts[i]);
		cr_assert_geq(src->dyn_smem[0], 48 * 1024, "%s", texts[i]);
		if (s.op == DG_OP_DECODER_FWD) {
			cr_assert_eq(src->n_entries, 2);
			cr_assert_str_eq(src->entries[1], "dg_decoder_fwd_out");
			cr_assert_eq(src->block_threads[1], 256);
			cr_assert_eq(src->dyn_smem[1], 0);
		}
		dg_source_destroy(src);
	}
	dg_codegen_destroy(cg);
}

/* ---- bf16 × bf16 on the sm_90a warpgroup path (templates/lowrank_wgmma.lua) --
 * The projection of the bf16 preset: the BDH shape (in_heads 1 and H) at
 * the default tile and the other warpgroup tiles, every out format, relu
 * none / 0 / 0.25, small odd shapes (E 96, L 208; E = L = 16); each plans
 * "wgmma bf16" (the source names wgmma m64nNk16 f32.bf16.bf16), with its
 * launch info (128 threads a warpgroup, E·2·(BM + 3·BN) bytes of dynamic
 * shared memory), and compiles for sm_90a. What the path does not take (L
 * or E not a multiple of 16, relu_mask, one operand f32) plans fp32 at the
 * auto tile, never fails. */
struct wgcase {
	const char *text;
	int threads, smem; /* 0: not checked */
};

static void compile_wgmma_bf16(dg_codegen *cg, const struct wgcase *c)
{
	dg_spec s;
	dg_plan p;
	dg_source *src = NULL;
	dg__nvrtc_target t;
	dg__nvrtc_result res;

	spec_of(c->text, &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", c->text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma bf16", "%s: plan %s", c->text, p.canonical);
	cr_assert(p.needs_arch_specific && p.spec.arch_specific, "%s", p.canonical);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", c->text, dg_codegen_errmsg(cg));
	char inst[64];
	snprintf(inst, sizeof(inst), "wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16", p.spec.tile.bn);
	cr_assert(strstr(src->text, inst), "%s: no %s", p.canonical, inst);
	cr_assert(!strstr(src->text, "k32.s32."), "%s: an integer wgmma", p.canonical);
	cr_assert_not_null(src->block_threads, "%s: no launch info", c->text);
	cr_assert_eq(src->block_threads[0], p.spec.tile.bm / 64 * 128, "%s", p.canonical);
	cr_assert_eq(src->dyn_smem[0], s.embd * 2 * (p.spec.tile.bm + 3 * p.spec.tile.bn), "%s",
		     p.canonical);
	if (c->threads)
		cr_assert_eq(src->block_threads[0], c->threads, "%s", p.canonical);
	if (c->smem)
		cr_assert_eq(src->dyn_smem[0], c->smem, "%s", p.canonical);
	cr_assert_eq(dg__nvrtc_target_for(90, true, &t, err, sizeof(err)), DG_OK, "%s", err);
	dg_status st = dg__nvrtc_compile(src, &t, &res, err, sizeof(err));
	cr_assert_eq(st, DG_OK, "%s: %s", p.canonical, err);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", c->text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

#define BF "op=lowrank_fwd;weight=bf16;act=bf16;arch=sm_90a;"
#define BDH "heads=4;embd=256;latent=8192;"
#define R128 "tile=128x64x64/8x1/2"

Test(nvrtc_forward, lowrank_bf16_wgmma)
{
	static const struct wgcase cases[] = {
		/* the resident kernel at the bf16 preset's projections' shape (their
		 * auto tile is the warp-specialized form: lowrank_ws_default):
		 * encoder (in_heads 1), encoder_v (H) */
		{ BF BDH "in_heads=1;out=bf16;relu=0;" R128, 256, 163840 },
		{ BF BDH "in_heads=4;out=bf16;relu=0;" R128, 256, 163840 },
		{ BF BDH "out=f32;relu=0.25;" R128, 256, 163840 },
		{ BF BDH "out=int8;relu=0;" R128, 256, 163840 },
		{ BF BDH "in_heads=4;out=uint8pos;relu=0;" R128, 256, 163840 },
		{ BF BDH "out=bf16;" R128, 256, 163840 },
		/* the other warpgroup tiles that fit at E 256 */
		{ BF BDH "out=bf16;relu=0;tile=64x64x64/4x1/2", 128, 131072 },
		{ BF BDH "out=bf16;relu=0;tile=256x64x64/16x1/2", 512, 229376 },
		{ BF BDH "in_heads=4;out=f32;tile=64x128x64/4x1/2", 128, 229376 },
		/* a small odd shape: 12 K steps, L past the last 64-wide tile */
		{ BF "heads=3;in_heads=3;embd=96;latent=208;out=bf16;relu=0", 256, 61440 },
		{ BF "heads=3;embd=96;latent=208;out=f32;relu=0.25;tile=128x128x32/8x1/2", 256, 98304 },
		{ BF "heads=2;embd=16;latent=16;out=bf16;relu=0", 0, 0 },
	};
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		compile_wgmma_bf16(cg, &cases[i]);
	dg_codegen_destroy(cg);
}

Test(nvrtc_forward, lowrank_bf16_fallbacks)
{
	static const struct fcase cases[] = {
		/* shapes the warpgroup path refuses: the auto tile is fp32's */
		{ BF "heads=3;embd=96;latent=200;out=bf16;relu=0", P_FLOAT },
		{ BF "heads=2;embd=40;latent=64;out=f32;relu=0", P_FLOAT },
		/* the mask recomputes y on the fp32 path */
		{ "op=relu_mask;weight=bf16;act=bf16;arch=sm_90a;relu=0", P_FLOAT },
		/* one float operand is not bf16 × bf16 */
		{ "op=lowrank_fwd;weight=bf16;act=f32;arch=sm_90a;" BDH "out=bf16;relu=0", P_FLOAT },
	};
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s;
		dg_plan p;
		spec_of(cases[i].text, &s);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", cases[i].text,
			     dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "fp32", "%s: plan %s", cases[i].text, p.canonical);
		cr_assert_not(p.needs_arch_specific, "%s", p.canonical);
		compile_case(cg, &cases[i]);
	}
	dg_codegen_destroy(cg);
}

/* ---- integer codes on the sm_90a warpgroup path (templates/lowrank_wgmma.lua) --
 * The projections of the w8a8 preset (int8 weights a channel × int8 codes a
 * token) and of bitnet (ternary weights a tensor × int8 codes a token) as
 * runtime/train/gpu_nodes.c builds them at 25M (encoder: in_heads 1,
 * encoder_v: H; out the activations' bf16, relu 0), at the auto tile and
 * every warpgroup tile the tuner offers that the path takes; sign1 and
 * other outputs once. Each plans "wgmma", names the integer wgmma and
 * compiles for sm_90a; where NVRTC prints ptxas's -v log, ptxas must keep
 * the MMAs asynchronous: no "wgmma.mma_async instructions are serialized"
 * (C7511 .. C7514), and no spills for the presets' specs (sign1's decode
 * spills a few bytes at 128 registers). 256x128 (BN registers of
 * accumulators at 512 threads) plans another path. */
/* src compiled for sm_90a into a cubin with ptxas's -v log, which must
 * show the MMAs asynchronous (no "wgmma.mma_async instructions are
 * serialized", C7511 .. C7518) and, with no_spills, no spills. */
static void compile_sm90a_checked(dg_source *src, const char *canon, bool no_spills)
{
	dg__nvrtc_target t;
	dg__nvrtc_result res;

	cr_assert_eq(dg__nvrtc_target_for(90, true, &t, err, sizeof(err)), DG_OK, "%s", err);
	cr_assert_lt(t.n_opts, DG__NVRTC_MAX_OPTS);
	snprintf(t.opts[t.n_opts++], sizeof(t.opts[0]), "--ptxas-options=-v");
	cr_assert_eq(dg__nvrtc_compile(src, &t, &res, err, sizeof(err)), DG_OK, "%s: %s", canon, err);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", canon);
	if (res.log && strstr(res.log, "ptxas")) {
		cr_assert(!strstr(res.log, "serialized"), "%s: ptxas serializes the MMAs:\n%s", canon, res.log);
		cr_assert(!no_spills || strstr(res.log, " 0 bytes spill stores, 0 bytes spill loads"),
			  "%s: spills:\n%s", canon, res.log);
	} else {
		/* an NVRTC that keeps ptxas's -v to itself (an empty log) */
		printf("note: %s: this NVRTC prints no ptxas log; serialization not checked\n", canon);
	}
	dg__nvrtc_result_free(&res);
}

/* The plan of spec text takes path. */
static void expect_plan_path(dg_codegen *cg, const char *text, const char *path)
{
	dg_spec s;
	dg_plan p;
	spec_of(text, &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s", p.canonical);
}

static void compile_wgmma_codes(dg_codegen *cg, const char *text, bool no_spills)
{
	dg_spec s;
	dg_plan p;
	dg_source *src = NULL;

	spec_of(text, &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "wgmma", "%s: plan %s", text, p.canonical);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	char inst[64];
	snprintf(inst, sizeof(inst), "wgmma.mma_async.sync.aligned.m64n%dk32.s32.", p.spec.tile.bn);
	cr_assert(strstr(src->text, inst), "%s: no %s", p.canonical, inst);
	cr_assert_eq(src->block_threads[0], p.spec.tile.bm / 64 * 128, "%s", p.canonical);
	cr_assert_eq(src->dyn_smem[0], s.embd * (p.spec.tile.bm + 3 * p.spec.tile.bn), "%s", p.canonical);
	compile_sm90a_checked(src, p.canonical, no_spills);
	dg_source_destroy(src);
}

#define W8A8 "op=lowrank_fwd;weight=int8;act=int8;wscale=channel;ascale=token;arch=sm_90a;out=bf16;relu=0;"
#define BITNET "op=lowrank_fwd;weight=ternary;act=int8;ascale=token;arch=sm_90a;out=bf16;relu=0;"

Test(nvrtc_forward, lowrank_codes_wgmma)
{
	static const char *const tiles[] = { "", "tile=64x64x64/4x1/2;", "tile=64x128x64/4x1/2;",
					     "tile=128x128x64/8x1/2;", "tile=256x64x64/16x1/2;" };
	static const char *const others[] = {
		"op=lowrank_fwd;weight=sign1;act=uint8pos;arch=sm_90a;" BDH "out=uint8pos;relu=0",
		"op=lowrank_fwd;weight=int8;act=int8;arch=sm_90a;" BDH "in_heads=4;out=int8;relu=0.25;tile=128x64x64/8x1/2",
		"op=lowrank_fwd;weight=ternary;act=uint8pos;arch=sm_90a;" BDH "out=f32",
		"op=lowrank_fwd;weight=sign1;act=int8;arch=sm_90a;heads=3;embd=128;latent=208;out=bf16;relu=0;"
		"tile=128x128x64/8x1/2",
	};
	char text[512];
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (int preset = 0; preset < 2; preset++)
		for (int hin = 0; hin < 2; hin++)
			for (size_t i = 0; i < sizeof(tiles) / sizeof(tiles[0]); i++) {
				/* int8 weights' auto tile: the warp-specialized form
				 * (lowrank_ws_default, below) */
				if (preset == 0 && !*tiles[i])
					continue;
				snprintf(text, sizeof(text), "%s" BDH "in_heads=%d;%s", preset ? BITNET : W8A8,
					 hin ? 4 : 1, tiles[i]);
				text[strlen(text) - 1] = '\0'; /* the last ';' */
				compile_wgmma_codes(cg, text, true);
			}
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
		compile_wgmma_codes(cg, others[i], false);
	/* both accumulator sets of 256x128 do not fit 128 registers a thread */
	dg_spec s;
	dg_plan p;
	spec_of(W8A8 BDH "tile=256x128x64/16x1/2", &s);
	if (dg_codegen_plan(cg, &s, &p) == DG_OK)
		cr_assert_str_neq(p.path, "wgmma", "%s", p.canonical);
	dg_codegen_destroy(cg);
}

/* ---- the K-streaming form of the warpgroup path (lowrank_wgmma.lua) --------
 * Where the bf16 rows of E do not fit resident (past E 352 at 128x64), the
 * auto tile of the bf16 preset's projections is the K-streaming form:
 * 128x256, 64-byte slices, 4 stages (256 threads, 4·384·64 = 98304
 * bytes); codes take it by an explicit tile at any E (their
 * auto tile past E 704 is mma.sync's, measured faster). Each plans
 * "wgmma stream" / "wgmma bf16 stream", names its wgmma, and compiles with
 * no serialized MMAs and no spills. Below those widths the auto tile stays
 * resident, and ternary weights (decoded, not copied) never stream. */
static void compile_stream(dg_codegen *cg, const char *text, const char *path, int smem)
{
	dg_spec s;
	dg_plan p;
	dg_source *src = NULL;

	spec_of(text, &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s: plan %s", text, p.canonical);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	const bool bf = strstr(path, "bf16") != NULL;
	char inst[64];
	snprintf(inst, sizeof(inst), "wgmma.mma_async.sync.aligned.m64n%d%s", p.spec.tile.bn,
		 bf ? "k16.f32.bf16.bf16" : "k32.s32.");
	cr_assert(strstr(src->text, inst), "%s: no %s", p.canonical, inst);
	cr_assert_eq(src->block_threads[0], p.spec.tile.bm / 64 * 128, "%s", p.canonical);
	const dg_tile *tl = &p.spec.tile;
	cr_assert_eq(src->dyn_smem[0], tl->stages * (tl->bm + tl->bn) * tl->bk * (bf ? 2 : 1), "%s", p.canonical);
	if (smem)
		cr_assert_eq(src->dyn_smem[0], smem, "%s", p.canonical);
	compile_sm90a_checked(src, p.canonical, true);
	dg_source_destroy(src);
}

Test(nvrtc_forward, lowrank_stream_wgmma)
{
	static const struct {
		const char *text, *path;
		int smem;
	} cases[] = {
		/* w8a8 at D 768 (H 12, N 8192) and D 1280 (H 16, N 16384) */
		{ W8A8 "heads=12;embd=768;latent=8192;in_heads=1;tile=128x128x64/8x1/5", "wgmma stream", 81920 },
		{ W8A8 "heads=12;embd=768;latent=8192;in_heads=12;tile=128x128x64/8x1/5", "wgmma stream", 81920 },
		{ W8A8 "heads=16;embd=1280;latent=16384;in_heads=1;tile=128x128x128/8x1/3", "wgmma stream", 98304 },
		/* bf16 at D 512 and 768 on the stream tile that was their auto one
		 * (128x256x32/8x1/4, 4·384·64 bytes; now the warp-specialized form's) */
		{ BF "heads=8;embd=512;latent=4096;in_heads=1;out=bf16;relu=0;tile=128x256x32/8x1/4", "wgmma bf16 stream",
		  98304 },
		{ BF "heads=12;embd=768;latent=8192;in_heads=12;out=bf16;relu=0;tile=128x256x32/8x1/4",
		  "wgmma bf16 stream", 98304 },
		/* explicit tiles, other outputs, a ragged L */
		{ W8A8 BDH "tile=64x64x64/4x1/3", "wgmma stream", 0 },
		{ W8A8 BDH "in_heads=4;tile=128x64x128/8x1/4", "wgmma stream", 0 },
		{ "op=lowrank_fwd;weight=int8;act=uint8pos;arch=sm_90a;heads=3;embd=4096;latent=208;out=uint8pos;"
		  "relu=0.25;tile=128x256x64/8x1/3", "wgmma stream", 0 },
		{ BF "heads=3;embd=96;latent=208;out=f32;relu=0.25;tile=64x128x32/4x1/8", "wgmma bf16 stream", 0 },
		{ BF BDH "out=int8;relu=0;tile=128x128x64/8x1/4", "wgmma bf16 stream", 0 },
	};
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		compile_stream(cg, cases[i].text, cases[i].path, cases[i].smem);
	/* resident while the rows fit (codes at E 704, which is no whole
	 * number of 128-code slices, bf16 at E 352, no whole number of 64);
	 * int8 weights at E a multiple of 128 (bf16 of 64) take the
	 * warp-specialized form at any E */
	static const char *const resident[][2] = {
		{ W8A8 "heads=4;embd=704;latent=8192", "wgmma" },
		{ BF "heads=4;embd=352;latent=8192;out=bf16;relu=0", "wgmma bf16" },
		{ W8A8 "heads=12;embd=768;latent=8192", "wgmma tma" },
	};
	for (size_t i = 0; i < 3; i++)
		expect_plan_path(cg, resident[i][0], resident[i][1]);
	/* ternary weights never stream; a stream tile for them is refused */
	dg_spec s;
	dg_plan p;
	spec_of(BITNET "heads=12;embd=768;latent=8192", &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, "mma.sync", "%s", p.canonical);
	spec_of(BITNET BDH "tile=128x128x64/8x1/5", &s);
	if (dg_codegen_plan(cg, &s, &p) == DG_OK)
		cr_assert(strncmp(p.path, "wgmma", 5) != 0, "%s", p.canonical);
	dg_codegen_destroy(cg);
}

/* ---- the projection's warp-specialized form (templates/lowrank_wgmma.lua
 * KERNEL_WSP): int8 weights' auto tile on sm_90a wherever it fits (L a
 * multiple of 128, E of 128 codes) — at the BDH shape, D 768 and 1B, x
 * shared or a head's own, every out — plans 128x128x128/8x1/6 "wgmma tma"
 * with a producer warpgroup (384 threads) and its ring, and compiles for
 * sm_90a without spills or serialized MMAs; bf16 operands likewise at
 * 128x128x64/8x1/6 "wgmma bf16 tma" (E a multiple of 64); the packed
 * weights keep the resident kernel. */
/* text plans the warp-specialized default: path, 128x128 with BK bk and 6
 * stages, 384 threads, the ring, its 2·6 barriers, the scales' 4 and two
 * slots of 256 floats and 1 KiB of alignment; its source has the rank-5
 * weight copy and the wgmma inst, and with compile it compiles for sm_90a
 * without spills or serialized MMAs. */
static void ws_default(dg_codegen *cg, const char *text, const char *path, int bk, const char *inst, bool compile)
{
	dg_spec s;
	dg_plan p;
	dg_source *src = NULL;
	spec_of(text, &s);
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s", p.canonical);
	const dg_tile *tl = &p.spec.tile;
	cr_assert(tl->bm == 128 && tl->bn == 128 && tl->bk == bk && tl->stages == 6, "%s", p.canonical);
	cr_assert_eq(p.entries[0].threads, 384, "%s", p.canonical);
	cr_assert_eq(p.entries[0].smem, 6 * 256 * 128 + 16 * 6 + 32 + 2 * 256 * 4 + 1024, "%s", p.canonical);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert(strstr(src->text, "cp.async.bulk.tensor.5d"), "%s: no rank-5 TMA copy", p.canonical);
	cr_assert(strstr(src->text, inst), "%s: no %s", p.canonical, inst);
	if (compile)
		compile_sm90a_checked(src, p.canonical, true);
	dg_source_destroy(src);
}

Test(nvrtc_forward, lowrank_ws_default)
{
	static const char *const shapes[] = { BDH, "heads=12;embd=768;latent=8192;", "heads=16;embd=1280;latent=16384;" };
	static const int heads[] = { 4, 12, 16 };
	static const char *const outs[] = { "out=bf16;relu=0", "out=int8;relu=0.25", "out=f32;relu=0" };
	char text[512];
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < 3; i++)
		for (int hin = 0; hin < 2; hin++) {
			for (size_t o = 0; o < 3; o++) { /* one compile a shape and x (the outs share the main loop) */
				snprintf(text, sizeof(text), "op=lowrank_fwd;weight=int8;act=%s;arch=sm_90a;%sin_heads=%d;%s",
					 hin ? "uint8pos" : "int8", shapes[i], hin ? heads[i] : 1, outs[o]);
				ws_default(cg, text, "wgmma tma", 128, "wgmma.mma_async.sync.aligned.m64n128k32.s32.", o == 0);
			}
			snprintf(text, sizeof(text), BF "%sin_heads=%d;out=bf16;relu=0", shapes[i], hin ? heads[i] : 1);
			ws_default(cg, text, "wgmma bf16 tma", 64, "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
				   hin == 0);
		}
	static const char *const resident[][2] = {
		{ "op=lowrank_fwd;weight=ternary;act=int8;arch=sm_90a;" BDH "out=bf16;relu=0", "wgmma" },
		{ "op=lowrank_fwd;weight=int8;act=int8;arch=sm_90a;heads=4;embd=256;latent=8144;out=bf16;relu=0",
		  "wgmma" },
		{ BF BDH "out=bf16;relu=0;" R128, "wgmma bf16" },
		{ BF "heads=4;embd=352;latent=8192;out=bf16;relu=0", "wgmma bf16" },
	};
	for (size_t i = 0; i < 4; i++)
		expect_plan_path(cg, resident[i][0], resident[i][1]);
	dg_codegen_destroy(cg);
}

/* ---- decoder_fwd's warp-specialized form (templates/decoder.lua KERNEL_WS) --
 * int8 weights and 8-bit codes (int8, uint8pos) with a tile of 5 to 8
 * stages and BK 128: plans "wgmma tma" (a producer warpgroup's 128 threads
 * more, the ring, its 2·S mbarriers and 1 KiB of alignment), names the
 * integer wgmma and the TMA copy, takes the two maps after nsplit, and
 * compiles for sm_90a, at the BDH shape and at 1B's; a ternary weight or a
 * BK of 64 stays on the cp.async ring's path ("wgmma"). */
Test(nvrtc_forward, decoder_wgmma_tma)
{
	static const struct {
		const char *text;
		const char *path;
	} cases[] = {
		{ "op=decoder_fwd;weight=int8;act=uint8pos;out=bf16;arch=sm_90a;tile=128x128x128/8x1/6", "wgmma tma" },
		{ "op=decoder_fwd;weight=int8;act=int8;out=f32;arch=sm_90a;tile=64x256x128/4x1/5", "wgmma tma" },
		{ "op=decoder_fwd;weight=int8;act=uint8pos;out=bf16;arch=sm_90a;heads=16;embd=1280;latent=16384;"
		  "tile=128x64x128/8x1/8",
		  "wgmma tma" },
		{ "op=decoder_fwd;weight=ternary;act=uint8pos;out=bf16;arch=sm_90a;tile=128x128x128/8x1/6", "wgmma" },
		{ "op=decoder_fwd;weight=int8;act=uint8pos;out=bf16;arch=sm_90a;tile=128x128x64/8x1/6", "wgmma" },
	};
	dg_codegen *cg = NULL;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s;
		dg_plan p;
		dg_source *src = NULL;
		dg__nvrtc_target t;
		dg__nvrtc_result res;

		spec_of(cases[i].text, &s);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", cases[i].text, dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, cases[i].path, "%s", p.canonical);
		bool ws = strcmp(cases[i].path, "wgmma tma") == 0;
		const dg_tile *tl = &p.spec.tile;
		cr_assert_eq(p.entries[0].threads, tl->bm / 64 * 128 + (ws ? 128 : 0), "%s", p.canonical);
		if (ws)
			cr_assert_eq(p.entries[0].smem, tl->stages * (tl->bm + tl->bn) * 128 + 16 * tl->stages + 1024,
				     "%s", p.canonical);
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", cases[i].text, dg_codegen_errmsg(cg));
		char inst[64];
		snprintf(inst, sizeof(inst), "wgmma.mma_async.sync.aligned.m64n%dk32.s32", tl->bn);
		cr_assert(strstr(src->text, inst), "%s: no %s", p.canonical, inst);
		cr_assert_eq(strstr(src->text, "cp.async.bulk.tensor.3d") != NULL, ws, "%s: TMA", p.canonical);
		cr_assert_eq(strstr(src->text, "int nsplit,\n\t       const __grid_constant__ dg_tmap ma, "
					       "const __grid_constant__ dg_tmap mb)") != NULL,
			     ws, "%s: the maps' ABI", p.canonical);
		cr_assert_eq(dg__nvrtc_target_for(90, true, &t, err, sizeof(err)), DG_OK, "%s", err);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, err, sizeof(err)), DG_OK, "%s: %s", p.canonical, err);
		cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", p.canonical);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	dg_codegen_destroy(cg);
}
