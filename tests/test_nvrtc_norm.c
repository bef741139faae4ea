/*
 * The row ops of the norm, embed and loss families (templates/norm.lua,
 * embed.lua, loss.lua) without a GPU:
 *   - every op renders and NVRTC-compiles to an sm_90 cubin for f32 and
 *     bf16 (src, out, lm_head weight) at small odd widths (32, 96) and at
 *     BDH's (256), with vocabularies off the power of two (50, 1000), and
 *     each entry has the launch info the ops read (lmhead_ce: BR rows of
 *     E + V floats of dynamic shared memory, the dw kernel 256 threads);
 *   - the vocabularies of token corpora: embed_fwd, embed_bwd and lmhead_ce
 *     (f32 and bf16) compile at llm.c's padded GPT-2 vocabulary (50304)
 *     and at 65536; lmhead_ce takes its tensor-core path (templates/
 *     loss_tc.lua: eight entries, the GEMMs' 60 KiB ring) for a bf16 x from
 *     V 4096 and an f32 x past V 50304 (E a multiple of 8, sm_80 on),
 *     otherwise one row of E + V floats a block, whose limit it refuses
 *     naming vocab;
 *   - bad specs are refused naming the field (vocab range, formats the ops
 *     do not take, a width the warp-per-row kernels cannot hold, a vocab
 *     whose logits do not fit in shared memory, a thread count);
 *   - each op's _check refuses a call naming what is wrong: a misshapen or
 *     wrong-format tensor, eps, lmhead_ce's workspace (missing, short,
 *     misaligned), its backward tensors, zero rows, a misaligned bad flag;
 *     and dg_lmhead_ce_workspace sizes the workspace with no device;
 *   - lmhead_logits: its plan (one entry, t64 by default) and its compile
 *     for sm_90 and sm_90a at the decoder's shapes and large ones.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "runtime/ops/checks.h"
#include "runtime/store/nvrtc.h"

static char err[8192];

static dg_spec spec_of(const char *text)
{
	dg_spec s;
	cr_assert_eq(dg_spec_parse(text, &s, err, sizeof(err)), DG_OK, "%s: %s", text, err);
	return s;
}

/* Renders text, checks its entries' names and compiles it to a cubin. */
static void compile_one(dg_codegen *cg, const char *text)
{
	dg_spec s = spec_of(text);
	dg_source *src = NULL;
	dg__nvrtc_target t;
	dg__nvrtc_result res;

	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	char want[64];
	snprintf(want, sizeof(want), "dg_%s", dg_op_name(s.op));
	cr_assert_str_eq(src->entries[0], want, "%s", text);
	for (int i = 0; i < src->n_entries; i++) {
		char decl[96];
		snprintf(decl, sizeof(decl), "%s(", src->entries[i]);
		cr_assert(strstr(src->text, decl), "%s: no kernel %s", text, src->entries[i]);
	}
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, err, sizeof(err)), DG_OK, "%s", err);
	cr_assert_eq(dg__nvrtc_compile(src, &t, &res, err, sizeof(err)), DG_OK, "%s: %s", text, err);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

Test(nvrtc_norm, every_op_compiles_f32_and_bf16)
{
	static const char *const fl[] = { "f32", "bf16" };
	static const int embds[] = { 32, 96, 256 };
	static const int vocabs[] = { 50, 256, 1000 };
	dg_codegen *cg = NULL;
	char text[256];
	int n = 0;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	for (int e = 0; e < 3; e++) {
		for (int a = 0; a < 2; a++) {
			for (int b = 0; b < 2; b++) {
				snprintf(text, sizeof(text), "op=layernorm_fwd;src=%s;out=%s;embd=%d", fl[a], fl[b],
					 embds[e]);
				compile_one(cg, text), n++;
				snprintf(text, sizeof(text), "op=resid_ln_fwd;src=%s;out=%s;embd=%d", fl[a], fl[b],
					 embds[e]);
				compile_one(cg, text), n++;
			}
			snprintf(text, sizeof(text), "op=layernorm_bwd;src=%s;embd=%d", fl[a], embds[e]);
			compile_one(cg, text), n++;
			snprintf(text, sizeof(text), "op=resid_ln_bwd;src=%s;embd=%d", fl[a], embds[e]);
			compile_one(cg, text), n++;
			for (int v = 0; v < 3; v++) {
				snprintf(text, sizeof(text), "op=embed_fwd;out=%s;embd=%d;vocab=%d", fl[a], embds[e],
					 vocabs[v]);
				compile_one(cg, text), n++;
				snprintf(text, sizeof(text), "op=embed_bwd;src=%s;embd=%d;vocab=%d", fl[a], embds[e],
					 vocabs[v]);
				compile_one(cg, text), n++;
				for (int b = 0; b < 2; b++) {
					snprintf(text, sizeof(text), "op=lmhead_ce;src=%s;weight=%s;embd=%d;vocab=%d",
						 fl[a], fl[b], embds[e], vocabs[v]);
					compile_one(cg, text), n++;
				}
			}
		}
	}
	/* other thread counts, and the widest rows the norm kernels hold */
	compile_one(cg, "op=layernorm_fwd;tile=t32"), n++;
	compile_one(cg, "op=layernorm_bwd;tile=t1024;embd=2048"), n++;
	compile_one(cg, "op=resid_ln_fwd;tile=t64;embd=2048;src=bf16;out=bf16"), n++;
	compile_one(cg, "op=layernorm_fwd;embd=4096;src=bf16;out=bf16"), n++;
	compile_one(cg, "op=resid_ln_bwd;embd=4096;src=bf16"), n++;
	compile_one(cg, "op=embed_bwd;tile=t128;embd=1000;vocab=3"), n++;
	compile_one(cg, "op=lmhead_ce;tile=t512;vocab=30000"), n++;
	cr_assert_eq(n, 7 + 3 * 2 * (4 + 2 + 3 * 4));
	dg_codegen_destroy(cg);
}

/* The launch info the ops read: lmhead_ce's dynamic shared memory is BR
 * rows of E + V floats (runtime/ops/loss.c derives BR from it), BR the
 * most of 16, 8, ... that fits; the other entries as planned. */
Test(nvrtc_norm, launch_info)
{
	dg_codegen *cg = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	dg_spec s = spec_of("op=lmhead_ce");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.n_entries, 4);
	cr_assert_str_eq(p.entries[1].name, "dg_lmhead_ce_loss");
	cr_assert_str_eq(p.entries[2].name, "dg_lmhead_ce_dw");
	cr_assert_str_eq(p.entries[3].name, "dg_lmhead_ce_dw_sum");
	cr_assert_eq(p.entries[3].threads, 256);
	cr_assert_eq(p.entries[0].threads, 256);
	cr_assert_eq(p.entries[0].smem, 16 * (256 + 256) * 4);
	cr_assert_eq(p.entries[1].smem, 0);
	cr_assert_eq(p.entries[2].threads, 256);
	s = spec_of("op=lmhead_ce;vocab=30000;embd=256");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.entries[0].smem, 1 * (256 + 30000) * 4, "one row: %d", p.entries[0].smem);
	s = spec_of("op=lmhead_ce;vocab=3000;embd=256;arch=sm_80");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.entries[0].smem, 8 * (256 + 3000) * 4, "sm_80's 163 KiB: %d", p.entries[0].smem);
	s = spec_of("op=layernorm_fwd;tile=t128");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.n_entries, 1);
	cr_assert_eq(p.entries[0].threads, 128);
	cr_assert_eq(p.entries[0].smem, 0);
	dg_codegen_destroy(cg);
}

/* The vocabularies of llm.c's shards (GPT-2's 50257, padded to 50304) and
 * of uint16 tokens' largest (65536). */
Test(nvrtc_norm, large_vocabularies)
{
	dg_codegen *cg = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	compile_one(cg, "op=embed_fwd;out=bf16;embd=256;vocab=50304");
	compile_one(cg, "op=embed_bwd;src=bf16;embd=256;vocab=50304");
	compile_one(cg, "op=lmhead_ce;src=bf16;weight=f32;embd=256;vocab=50304"); /* the GPU model's */
	compile_one(cg, "op=lmhead_ce;src=f32;weight=f32;embd=256;vocab=50304");
	compile_one(cg, "op=lmhead_ce;src=bf16;weight=f32;embd=4096;vocab=50304");
	compile_one(cg, "op=embed_fwd;out=f32;embd=4096;vocab=65536");
	compile_one(cg, "op=embed_bwd;src=f32;embd=4096;vocab=65536");
	compile_one(cg, "op=lmhead_ce;src=f32;weight=bf16;embd=64;vocab=65536");
	compile_one(cg, "op=lmhead_ce;src=bf16;weight=f32;embd=4096;vocab=65536");
	static const int embds[] = { 256, 4096 };
	for (int i = 0; i < 2; i++) {
		/* a bf16 x from V 4096 on tensor cores (templates/loss_tc.lua), to V 65536 */
		static const int vocabs[] = { 4096, 50304, 65536 };
		for (int j = 0; j < 3; j++) {
			char text[128];
			snprintf(text, sizeof(text), "op=lmhead_ce;src=bf16;weight=f32;embd=%d;vocab=%d", embds[i],
				 vocabs[j]);
			dg_spec s = spec_of(text);
			cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
			cr_assert_str_eq(p.path, "tensor-core", "%s", text);
			cr_assert_eq(p.n_entries, 8, "%s", text);
			cr_assert_str_eq(p.entries[0].name, "dg_lmhead_ce");
			cr_assert_str_eq(p.entries[7].name, "dg_lmhead_ce_dw");
			cr_assert_eq(p.entries[0].smem, 61440, "%s: the GEMM's ring: %d", text, p.entries[0].smem);
			cr_assert_eq(p.entries[1].smem, 0);
		}
		/* f32 keeps f32 logits a row a block up to V 50304 */
		char text[128];
		snprintf(text, sizeof(text), "op=lmhead_ce;src=f32;weight=f32;embd=%d;vocab=50304", embds[i]);
		dg_spec s = spec_of(text);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "fused-rows", "%s", text);
		cr_assert_eq(p.entries[0].smem, (embds[i] + 50304) * 4, "%s: one row: %d", text, p.entries[0].smem);
		snprintf(text, sizeof(text), "op=lmhead_ce;src=bf16;weight=f32;embd=%d;vocab=4095", embds[i]);
		s = spec_of(text);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "fused-rows", "%s", text);
	}
	/* no tensor cores before sm_80 */
	dg_spec s8 = spec_of("op=lmhead_ce;src=bf16;embd=256;vocab=50304;arch=sm_75");
	cr_assert_eq(dg_codegen_plan(cg, &s8, &p), DG_ERR_INVALID_SPEC, "sm_75 planned");
	cr_assert(strstr(dg_codegen_errmsg(cg), "vocab=50304: the lm_head's tensor-core path"), "%s",
		  dg_codegen_errmsg(cg));
	/* an E that is not a multiple of 8 stays on the fused rows, which
	 * cannot hold a row of 65536 */
	dg_spec s = spec_of("op=lmhead_ce;embd=4;vocab=65536");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC, "embd 4, vocab 65536 planned");
	dg_codegen_destroy(cg);
}

static void refused_spec(const char *text, const char *want)
{
	dg_spec s;
	cr_assert_eq(dg_spec_parse(text, &s, err, sizeof(err)), DG_ERR_INVALID_SPEC, "%s was accepted", text);
	cr_assert(strstr(err, want), "%s: '%s' lacks '%s'", text, err, want);
}

/* A spec the template's plan refuses, with a message naming the field. */
static void refused_plan(dg_codegen *cg, const char *text, const char *want)
{
	dg_spec s = spec_of(text);
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC, "%s planned", text);
	cr_assert(strstr(dg_codegen_errmsg(cg), want), "%s: '%s' lacks '%s'", text, dg_codegen_errmsg(cg),
		  want);
}

Test(nvrtc_norm, bad_specs_name_the_field)
{
	refused_spec("op=embed_fwd;vocab=1", "vocab=1: must be between 2 and 65536");
	refused_spec("op=lmhead_ce;vocab=70000", "vocab=70000");
	refused_spec("op=embed_bwd;src=int8", "src=int8: op embed_bwd takes one of f32|bf16");
	refused_spec("op=layernorm_fwd;out=uint8pos", "out=uint8pos: op layernorm_fwd takes one of f32|bf16");
	refused_spec("op=resid_ln_bwd;src=ternary", "src=ternary");
	refused_spec("op=lmhead_ce;weight=int8", "weight=int8: op lmhead_ce takes one of f32|bf16");
	refused_spec("op=layernorm_bwd;embd=98", "embd=98: must be a multiple of 4");
	refused_spec("op=layernorm_fwd;tile=64x64x64/2x2/2", "takes a thread count");
	refused_spec("op=layernorm_fwd;vocab=256", "vocab: op layernorm_fwd does not take it");
	refused_spec("op=embed_fwd;relu=0", "relu: op embed_fwd does not take it");
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	refused_plan(cg, "op=layernorm_fwd;embd=4100", "embd=4100: layernorm_fwd holds a row");
	refused_plan(cg, "op=resid_ln_bwd;embd=8192", "embd=8192");
	refused_plan(cg, "op=lmhead_ce;embd=4;vocab=65536", "vocab=65536: a row of x and its logits");
	refused_plan(cg, "op=embed_bwd;tile=t48", "tile=t48: threads must be a multiple of 32");
	refused_plan(cg, "op=lmhead_ce;tile=t2048", "tile=t2048");
	dg_codegen_destroy(cg);
}

/* ---- the checks -------------------------------------------------------------- */

#define P(i) ((dg_dptr)0x1000000 * (dg_dptr)(i))

/* A check's refusal: DG_ERR_INVALID_ARG and a message starting with head. */
static void expect_refused(dg_status st, const char *head, const char *what)
{
	cr_assert_eq(st, DG_ERR_INVALID_ARG, "%s: accepted (%s)", what, err);
	cr_assert(strncmp(err, head, strlen(head)) == 0, "%s: '%s' does not start with '%s'", what, err, head);
}

Test(nvrtc_norm, checks_refuse_by_name)
{
	const int64_t R = 37;
	dg_spec s = spec_of("op=layernorm_fwd;embd=96;src=bf16");
	dg_tensor x = dg_tensor_2d("x", DG_FMT_BF16, P(1), R, 96);
	dg_tensor y = dg_tensor_2d("y", DG_FMT_F32, P(2), R, 96);
	dg_tensor rs = dg_tensor_1d("rstd", DG_FMT_F32, P(3), R);
	dg_layernorm_fwd_args ln = { .x = &x, .y = &y, .rstd = &rs, .eps = 1e-5f };
	cr_assert_eq(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), DG_OK, "%s", err);
	ln.eps = -1e-5f;
	expect_refused(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), "dg_layernorm_fwd: eps=", "eps < 0");
	ln.eps = NAN;
	expect_refused(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), "dg_layernorm_fwd: eps=", "eps NaN");
	ln.eps = 0.0f;
	cr_assert_eq(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), DG_OK, "eps 0: %s", err);
	x.fmt = DG_FMT_F32;
	expect_refused(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), "x: expected bf16", "x f32");
	x.fmt = DG_FMT_BF16;
	rs.shape[0] = R + 1;
	expect_refused(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), "rstd: expected f32 (37)", "rstd R+1");
	rs.shape[0] = R;
	y.shape[1] = 95;
	expect_refused(dg_layernorm_fwd_check(&s, &ln, err, sizeof(err)), "y: expected f32 (37, 96)", "y E-1");

	dg_spec sb = spec_of("op=resid_ln_bwd");
	dg_tensor d = dg_tensor_2d("dout", DG_FMT_F32, P(1), R, 256), o = dg_tensor_2d("out", DG_FMT_F32, P(2), R, 256);
	dg_tensor r2 = dg_tensor_1d("rstd", DG_FMT_F32, P(3), R), dx = dg_tensor_2d("dx", DG_FMT_F32, P(4), R, 256);
	dg_tensor dy = dg_tensor_2d("dy", DG_FMT_BF16, P(5), R, 256);
	dg_resid_ln_bwd_args rb = { .dout = &d, .out = &o, .rstd = &r2, .dx = &dx, .dy = &dy };
	expect_refused(dg_resid_ln_bwd_check(&sb, &rb, err, sizeof(err)), "dy: expected f32", "dy bf16");
	dy.fmt = DG_FMT_F32;
	cr_assert_eq(dg_resid_ln_bwd_check(&sb, &rb, err, sizeof(err)), DG_OK, "%s", err);
	rb.dx = NULL;
	expect_refused(dg_resid_ln_bwd_check(&sb, &rb, err, sizeof(err)), "dx: missing", "no dx");

	/* embed: the token ids are i32 */
	dg_spec se = spec_of("op=embed_fwd;vocab=50;embd=32");
	dg_tensor idx = dg_tensor_1d("idx", DG_FMT_F32, P(1), R), tab = dg_tensor_2d("table", DG_FMT_F32, P(2), 50, 32);
	dg_tensor out = dg_tensor_2d("out", DG_FMT_F32, P(3), R, 32);
	dg_embed_fwd_args ef = { .idx = &idx, .table = &tab, .out = &out };
	expect_refused(dg_embed_fwd_check(&se, &ef, err, sizeof(err)), "idx: expected i32 (*)", "idx f32");
	idx.fmt = DG_FMT_I32;
	cr_assert_eq(dg_embed_fwd_check(&se, &ef, err, sizeof(err)), DG_OK, "%s", err);
	tab.shape[0] = 256;
	expect_refused(dg_embed_fwd_check(&se, &ef, err, sizeof(err)), "table: expected f32 (50, 32)", "table V");
	tab.shape[0] = 50;
	ef.bad = P(4) + 2;
	expect_refused(dg_embed_fwd_check(&se, &ef, err, sizeof(err)), "dg_embed_fwd: bad:", "bad misaligned");
}

Test(nvrtc_norm, lmhead_ce_checks_and_workspace)
{
	const int64_t R = 37;
	dg_spec s = spec_of("op=lmhead_ce;embd=96;vocab=50;src=bf16");
	dg_tensor x = dg_tensor_2d("x", DG_FMT_BF16, P(1), R, 96), w = dg_tensor_2d("w", DG_FMT_F32, P(2), 96, 50);
	dg_tensor tg = dg_tensor_1d("targets", DG_FMT_I32, P(3), R), loss = dg_tensor_1d("loss", DG_FMT_F32, P(4), 1);
	dg_tensor dx = dg_tensor_2d("dx", DG_FMT_F32, P(5), R, 96), dw = dg_tensor_2d("dw", DG_FMT_F32, P(6), 96, 50);
	dg_lmhead_ce_args a = { .x = &x, .w = &w, .targets = &tg, .loss = &loss };
	size_t need = 0;

	/* forward only: the row losses, 256-byte aligned */
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_OK);
	cr_assert_eq(need, 256u, "37 floats round up to 256 bytes: %zu", need);
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "ws: 256 bytes of workspace needed, 0 given",
		       "no workspace");
	a.ws = (dg_workspace){ P(7), 255 };
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "ws: 256 bytes", "short workspace");
	a.ws = (dg_workspace){ P(7) + 128, 256 };
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "ws: ptr", "misaligned workspace");
	a.ws = (dg_workspace){ P(7), 256 };
	cr_assert_eq(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), DG_OK, "%s", err);
	a.dx = &dx;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "dx: given without backward", "dx, no backward");

	/* backward: dlogits too (bf16 on the bf16 path) */
	a.backward = true;
	a.dw = &dw;
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_OK);
	cr_assert_eq(need, 256u + (37 * 50 * 2 + 255) / 256 * 256, "%zu", need);
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "ws:", "forward-sized workspace");
	a.ws.bytes = need;
	cr_assert_eq(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), DG_OK, "%s", err);
	dg_spec sf = s;
	sf.src = DG_FMT_F32;
	x.fmt = DG_FMT_F32;
	size_t need32 = 0;
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &sf, &a, &need32), DG_OK);
	cr_assert_eq(need32, 256u + (37 * 50 * 4 + 255) / 256 * 256, "f32 dlogits: %zu", need32);
	x.fmt = DG_FMT_BF16;
	a.dw = NULL;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "dw: missing", "backward without dw");
	a.dw = &dw;
	dw.shape[1] = 256;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "dw: expected f32 (96, 50)", "dw V");
	dw.shape[1] = 50;
	loss.shape[0] = 2;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "loss: expected f32 (1)", "loss of 2");
	loss.shape[0] = 1;
	w.fmt = DG_FMT_BF16;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "w: expected f32", "w bf16 under weight=f32");
	w.fmt = DG_FMT_F32;
	a.bad = P(8) + 1;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "dg_lmhead_ce: bad:", "bad misaligned");
	a.bad = 0;
	/* zero rows: no mean */
	x.shape[0] = tg.shape[0] = dx.shape[0] = 0;
	expect_refused(dg_lmhead_ce_check(&s, &a, err, sizeof(err)), "targets: 0 rows", "R = 0");
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_ERR_INVALID_ARG);
	cr_assert_eq(need, 0u);
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, NULL), DG_ERR_INVALID_ARG);
}

/* The tensor-core path's workspace (runtime/ops/loss.c tc_of), with no
 * device: GPT-2's vocabulary at BDH's 4096 rows, a bf16 x. Each part
 * 256-byte aligned: the row losses (16 KiB), dlogits (4096 x 50304 bf16),
 * the tiles' statistics (4096 x 393 float2), lse and the target's logit
 * (16 KiB each), xb (4096 x 256 bf16), wb (256 x 50304 bf16) and dx's four
 * splits (4 x 4096 x 256 f32): 469647360 bytes, as the H200 run printed;
 * the forward alone has no dlogits and no splits. */
Test(nvrtc_norm, lmhead_ce_tensor_core_workspace)
{
	enum { R = 4096, E = 256, V = 50304 };
	dg_spec s = spec_of("op=lmhead_ce;embd=256;vocab=50304;src=bf16");
	dg_tensor x = dg_tensor_2d("x", DG_FMT_BF16, P(1), R, E), w = dg_tensor_2d("w", DG_FMT_F32, P(2), E, V),
		  tg = dg_tensor_1d("targets", DG_FMT_I32, P(3), R), loss = dg_tensor_1d("loss", DG_FMT_F32, P(4), 1);
	dg_tensor dx = dg_tensor_2d("dx", DG_FMT_F32, P(5), R, E), dw = dg_tensor_2d("dw", DG_FMT_F32, P(6), E, V);
	dg_lmhead_ce_args a = { .x = &x, .w = &w, .targets = &tg, .loss = &loss };
	size_t need = 0;
	const size_t rl = (size_t)R * 4, dl = (size_t)R * V * 2, st = (size_t)R * 393 * 8, xb = (size_t)R * E * 2,
		     wb = (size_t)E * V * 2, parts = (size_t)4 * R * E * 4;
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_OK);
	cr_assert_eq(need, rl + st + 2 * rl + xb + wb, "forward: %zu", need);
	a.backward = true;
	a.dx = &dx;
	a.dw = &dw;
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_OK);
	cr_assert_eq(need, rl + dl + st + 2 * rl + xb + wb + parts, "backward: %zu", need);
	cr_assert_eq(need, 469647360u);
	/* a vocabulary off 8 pads wb and dlogits' rows to a multiple of 8 */
	s.vocab = 50257;
	w.shape[1] = dw.shape[1] = 50257;
	cr_assert_eq(dg_lmhead_ce_workspace(NULL, &s, &a, &need), DG_OK);
	cr_assert_eq(need, rl + (size_t)R * 50264 * 2 + st + 2 * rl + xb + (size_t)E * 50264 * 2 + parts,
		     "V 50257 pads to 50264: %zu", need);
}

/* lmhead_logits (templates/logits.lua, a decoder's logits): one entry, t64
 * by default (a decoder's few rows over 256 columns on several SMs), any
 * thread count asked for; it compiles for sm_90 and sm_90a at the 25M
 * shape (the decoder's spec: bf16 x_final; f32 for the f32 recipe) and at
 * large vocabularies and widths. */
Test(nvrtc_norm, lmhead_logits_plans_and_compiles)
{
	dg_codegen *cg = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	dg_spec s = spec_of("op=lmhead_logits;src=bf16");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.n_entries, 1);
	cr_assert_str_eq(p.entries[0].name, "dg_lmhead_logits");
	cr_assert_eq(p.entries[0].threads, 64);
	cr_assert_eq(p.entries[0].smem, 0);
	s = spec_of("op=lmhead_logits;tile=t256");
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.entries[0].threads, 256);
	compile_one(cg, "op=lmhead_logits;src=bf16;embd=256;vocab=256");
	compile_one(cg, "op=lmhead_logits;src=f32;embd=256;vocab=256");
	compile_one(cg, "op=lmhead_logits;src=bf16;embd=4096;vocab=50304;tile=t1024");
	compile_one(cg, "op=lmhead_logits;src=f32;embd=32;vocab=50;tile=t32");
	/* sm_90a, as the GPU model's specs on an H200 ask */
	static const char *const a90[] = { "op=lmhead_logits;src=bf16;arch=sm_90a",
					   "op=lmhead_logits;src=f32;arch=sm_90a" };
	for (int i = 0; i < 2; i++) {
		dg_spec sa = spec_of(a90[i]);
		dg_source *src = NULL;
		dg__nvrtc_target t;
		dg__nvrtc_result res;
		cr_assert_eq(dg_codegen_render(cg, &sa, &src), DG_OK, "%s: %s", a90[i], dg_codegen_errmsg(cg));
		cr_assert_eq(dg__nvrtc_target_for(90, true, &t, err, sizeof(err)), DG_OK, "%s", err);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, err, sizeof(err)), DG_OK, "%s: %s", a90[i], err);
		cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", a90[i]);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	refused_spec("op=lmhead_logits;weight=int8", "weight");
	dg_codegen_destroy(cg);
}
