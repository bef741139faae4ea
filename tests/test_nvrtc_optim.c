/*
 * The optim family without a GPU (templates/optim.lua, runtime/ops/optim.c,
 * runtime/ref/optim.c):
 *   - adamw_update's defaults (sm_90, tile auto: t256) and canonical text;
 *     fields not the op's are refused;
 *   - it renders and compiles to a cubin for sm_90 and sm_80 at t256 (the
 *     default), t32 and t1024, with its three entries dg_adamw_update,
 *     dg_grad_sumsq, dg_grad_clip; a tile whose threads are not a power of
 *     two (t96, t480, t992) is refused saying so (the tree sums halve the
 *     block), and one outside 32..1024 or not a multiple of 32 by the
 *     common rule (as a spec error, not a template error);
 *   - the rendered PARTS is the runtime's (dg_grad_norm_workspace(n) =
 *     n·PARTS·8, PARTS 264), and the rendered control block is
 *     dragon/optim.h's dg_adamw_ctl field for field (80 bytes), so neither
 *     pair can drift apart silently;
 *   - dg_adamw_update_check refuses by name: a wrong format, mismatched
 *     shapes, a missing or misaligned tensor, p aliasing m or grad (and m
 *     aliasing v), a misaligned copy or control block; a spec of another op;
 *     dg_gate_fwd_check / _bwd_check refuse a misaligned step_at;
 *   - dg_ref_adamw by hand (one step from zero moments) and against
 *     dg_adamw_step bit for bit over a run of steps (scale and ctl from
 *     dg_adamw_ctl_fill, decay on and off, β1 either side of the lerp's
 *     switch); skip leaves p, m, v and the copy untouched; the copy is
 *     dg_f32_to_bf16 of the new p; the default control block.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/fmt.h"
#include "dragon/ops.h"
#include "dragon/optim.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "dragon/spec.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"
#include "runtime/store/nvrtc.h"
#include "nvrtc_helpers.h"

static dg_spec spec_of(int arch, int threads)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_ADAMW_UPDATE);
	s.arch = arch;
	s.tile.threads = threads;
	return s;
}

Test(nvrtc_optim, defaults_and_text)
{
	dg_spec s;
	char text[DG_SPEC_TEXT_MAX], m[256];
	dg_spec_init(&s, DG_OP_ADAMW_UPDATE);
	cr_assert_eq(s.arch, 90);
	cr_assert_eq(s.tile.threads, 0, "the tile is auto");
	cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
	dg_spec_to_string(&s, text, sizeof(text));
	cr_assert_str_eq(text, "arch=sm_90;op=adamw_update;tile=auto;");
	dg_spec p;
	cr_assert_eq(dg_spec_parse("op=adamw_update;tile=t128;arch=sm_80", &p, m, sizeof(m)), DG_OK, "%s", m);
	dg_spec_to_string(&p, text, sizeof(text));
	cr_assert_str_eq(text, "arch=sm_80;op=adamw_update;tile=t128;");
	/* the auto tile plans to t256 */
	dg_codegen *cg = nh_codegen();
	dg_plan pl;
	cr_assert_eq(dg_codegen_plan(cg, &s, &pl), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(pl.spec.tile.threads, 256);
	cr_assert_str_eq(pl.path, "element-wise");
	cr_assert_eq(pl.n_entries, 3);
	dg_codegen_destroy(cg);
	/* the op has no shape, format or epilogue fields */
	static const char *const not_its[] = { "op=adamw_update;embd=128", "op=adamw_update;act=bf16",
					       "op=adamw_update;heads=4", "op=adamw_update;out=bf16" };
	for (size_t i = 0; i < sizeof(not_its) / sizeof(not_its[0]); i++)
		cr_assert_neq(dg_spec_parse(not_its[i], &p, m, sizeof(m)), DG_OK, "%s accepted", not_its[i]);
}

/* The value of "constexpr int NAME = v;" in text; -1 when absent. */
static int constexpr_of(const char *text, const char *name)
{
	char key[64];
	snprintf(key, sizeof(key), "constexpr int %s = ", name);
	const char *at = strstr(text, key);
	int v = -1;
	if (!at || sscanf(at + strlen(key), "%d;", &v) != 1)
		return -1;
	return v;
}

/* s (its NUL left out) somewhere in the n bytes at p. */
static bool has_bytes(const uint8_t *p, size_t n, const char *s)
{
	const size_t k = strlen(s);
	for (size_t i = 0; i + k <= n; i++)
		if (p[i] == (uint8_t)s[0] && memcmp(p + i, s, k) == 0)
			return true;
	return false;
}

Test(nvrtc_optim, renders_and_compiles_for_sm90_and_sm80)
{
	static const char *const entries[] = { "dg_adamw_update", "dg_grad_sumsq", "dg_grad_clip" };
	static const int arches[] = { 90, 80 }, threads[] = { 0, 32, 1024 };
	char e[8192], text[DG_SPEC_TEXT_MAX], m[512];
	dg_codegen *cg = nh_codegen();
	int n = 0;
	for (int a = 0; a < 2; a++) {
		dg__nvrtc_target t;
		cr_assert_eq(dg__nvrtc_target_for(arches[a], false, &t, e, sizeof(e)), DG_OK, "%s", e);
		for (int th = 0; th < 3; th++) {
			dg_spec s = spec_of(arches[a], threads[th]);
			cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
			dg_spec_to_string(&s, text, sizeof(text));
			dg_source *src = NULL;
			cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
			cr_assert_eq(src->n_entries, 3, "%s", text);
			for (int k = 0; k < 3; k++)
				cr_assert_str_eq(src->entries[k], entries[k], "%s: entry %d", text, k);
			cr_assert(strstr(src->text, "do not edit"), "%s: no generated-code banner", text);
			cr_assert(strstr(src->text, "optim.lua"), "%s: the banner names no template", text);
			cr_assert(strstr(src->text, "op=adamw_update;"), "%s: the banner holds no spec", text);
			const int nt = threads[th] ? threads[th] : 256;
			cr_assert_eq(constexpr_of(src->text, "NT"), nt, "%s", text);
			dg__nvrtc_result res;
			dg_status st = dg__nvrtc_compile(src, &t, &res, e, sizeof(e));
			cr_assert_eq(st, DG_OK, "%s: %s", text, e);
			cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not a cubin", text);
			/* every entry is in the image */
			for (int k = 0; k < 3; k++)
				cr_assert(has_bytes(res.image, res.size, entries[k]),
					  "%s: %s is not in the cubin", text, entries[k]);
			dg__nvrtc_result_free(&res);
			dg_source_destroy(src);
			n++;
		}
	}
	cr_assert_eq(n, 6);
	dg_codegen_destroy(cg);
}

Test(nvrtc_optim, threads_not_a_power_of_two_are_refused)
{
	dg_codegen *cg = nh_codegen();
	static const int bad[] = { 96, 480, 992 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dg_spec s = spec_of(90, bad[i]);
		char msg[512] = "";
		dg_plan p;
		dg_status st = dg_spec_validate(&s, msg, sizeof(msg));
		if (st == DG_OK) {
			st = dg_codegen_plan(cg, &s, &p);
			snprintf(msg, sizeof(msg), "%s", dg_codegen_errmsg(cg));
		}
		cr_assert_eq(st, DG_ERR_INVALID_SPEC, "t%d accepted", bad[i]);
		cr_assert(strstr(msg, "threads") && strstr(msg, "power of two"), "t%d: '%s' does not say why",
			  bad[i], msg);
		dg_source *src = NULL;
		cr_assert_neq(dg_codegen_render(cg, &s, &src), DG_OK, "t%d rendered", bad[i]);
		cr_assert_null(src);
	}
	/* and the common rule (a multiple of 32 in 32..1024) is refused as
	 * cleanly, not as a template error */
	static const int outside[] = { 16, 48, 2048 };
	for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
		dg_spec s = spec_of(90, outside[i]);
		dg_plan p;
		char msg[512] = "";
		dg_status st = dg_spec_validate(&s, msg, sizeof(msg));
		if (st == DG_OK) {
			st = dg_codegen_plan(cg, &s, &p);
			snprintf(msg, sizeof(msg), "%s", dg_codegen_errmsg(cg));
		}
		cr_assert_eq(st, DG_ERR_INVALID_SPEC, "t%d: %s: %s", outside[i], dg_status_str(st), msg);
		cr_assert(strstr(msg, "threads") && !strstr(msg, "traceback"), "t%d: %s", outside[i], msg);
	}
	dg_codegen_destroy(cg);
}

/* One rule, two copies: the template's PARTS (the grid of dg_grad_sumsq)
 * and runtime/ops/optim.c's (the launch and the workspace). */
Test(nvrtc_optim, parts_and_control_block_agree_with_the_runtime)
{
	dg_codegen *cg = nh_codegen();
	const size_t parts = dg_grad_norm_workspace(1) / sizeof(double);
	cr_assert_eq(parts, 264);
	for (int n = -1; n <= 0; n++)
		cr_assert_eq(dg_grad_norm_workspace(n), 0, "n=%d", n);
	static const int ns[] = { 1, 2, 3, 7, 100 };
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
		cr_assert_eq(dg_grad_norm_workspace(ns[i]), (size_t)ns[i] * 264 * 8, "n=%d", ns[i]);
	static const int threads[] = { 0, 64, 1024 };
	for (int th = 0; th < 3; th++) {
		dg_spec s = spec_of(90, threads[th]);
		dg_source *src = NULL;
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_eq(constexpr_of(src->text, "PARTS"), (int)parts,
			     "templates/optim.lua's PARTS is not runtime/ops/optim.c's %zu", parts);
		char grid[32];
		snprintf(grid, sizeof(grid), "grid %zu,", parts);
		cr_assert(strstr(src->text, grid), "the banner does not say '%s'", grid);
		/* the control block: dragon/optim.h's layout, field for field */
		const char *fields[] = { "float lr, d, s, cs, w, b2, w2, eps, clip;",
					 "unsigned step, scaler, growth_interval;", "float scale;",
					 "unsigned skip;", "float loss_scale;", "unsigned good_steps;",
					 "double sq, norm;", "static_assert(sizeof(dg_adamw_ctl_t) == 80" };
		const char *at = strstr(src->text, "struct dg_adamw_ctl_t {");
		cr_assert_not_null(at, "no dg_adamw_ctl_t in the rendered text");
		for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
			const char *f = strstr(at, fields[k]);
			cr_assert_not_null(f, "'%s' is not in the rendered control block (or out of order)",
					   fields[k]);
			at = f + strlen(fields[k]);
		}
		dg_source_destroy(src);
	}
	cr_assert_eq(sizeof(dg_adamw_ctl), 80);
	cr_assert_eq(sizeof(dg_adamw_ctl) % 8, 0);
	cr_assert_eq(offsetof(dg_adamw_ctl, lr), 0);
	cr_assert_eq(offsetof(dg_adamw_ctl, clip), 32);
	cr_assert_eq(offsetof(dg_adamw_ctl, step), 36);
	cr_assert_eq(offsetof(dg_adamw_ctl, scaler), 40);
	cr_assert_eq(offsetof(dg_adamw_ctl, growth_interval), 44);
	/* the host's half ends where the device's begins */
	cr_assert_eq(DG_ADAMW_CTL_HOST_BYTES, 48);
	cr_assert_eq(offsetof(dg_adamw_ctl, scale), 48);
	cr_assert_eq(offsetof(dg_adamw_ctl, skip), 52);
	cr_assert_eq(offsetof(dg_adamw_ctl, loss_scale), 56);
	cr_assert_eq(offsetof(dg_adamw_ctl, good_steps), 60);
	cr_assert_eq(offsetof(dg_adamw_ctl, sq), 64);
	cr_assert_eq(offsetof(dg_adamw_ctl, norm), 72);
	dg_codegen_destroy(cg);
}

/* ---- the check, without a device ------------------------------------------------ */

#define P(i) ((dg_dptr)0x100000 * (i))

Test(nvrtc_optim, check_refuses_by_name)
{
	char msg[512];
	dg_spec s = spec_of(90, 0);
	dg_tensor p = dg_tensor_2d("p", DG_FMT_F32, P(1), 64, 33);
	dg_tensor g = dg_tensor_2d("grad", DG_FMT_F32, P(2), 64, 33);
	dg_tensor m = dg_tensor_2d("m", DG_FMT_F32, P(3), 64, 33);
	dg_tensor v = dg_tensor_2d("v", DG_FMT_F32, P(4), 64, 33);
	dg_adamw_update_args a = { .p = &p, .grad = &g, .m = &m, .v = &v, .ctl = P(5), .copy = P(6),
				   .decay = true };
	cr_assert_eq(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	a.ctl = 0; /* the default scalars */
	a.copy = 0;
	cr_assert_eq(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_adamw_update_check(&s, &a, NULL, 0), DG_OK);
	/* any shape, one shape: 1-d */
	dg_tensor p1 = dg_tensor_1d("p", DG_FMT_F32, P(1), 1000003), g1 = dg_tensor_1d("grad", DG_FMT_F32, P(2), 1000003),
		  m1 = dg_tensor_1d("m", DG_FMT_F32, P(3), 1000003), v1 = dg_tensor_1d("v", DG_FMT_F32, P(4), 1000003);
	dg_adamw_update_args a1 = { .p = &p1, .grad = &g1, .m = &m1, .v = &v1 };
	cr_assert_eq(dg_adamw_update_check(&s, &a1, msg, sizeof(msg)), DG_OK, "%s", msg);

	/* formats: every tensor is f32 */
	g.fmt = DG_FMT_BF16;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "grad", "f32");
	g.fmt = DG_FMT_F32;
	p.fmt = DG_FMT_BF16;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "p", "f32");
	p.fmt = DG_FMT_F32;
	v.fmt = DG_FMT_INT8;
	v.scale = P(7);
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "v", "f32");
	v.fmt = DG_FMT_F32;
	v.scale = 0;
	/* shapes: p's */
	dg_tensor m2 = dg_tensor_2d("m", DG_FMT_F32, P(3), 64, 32);
	a.m = &m2;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "m", "64, 33");
	dg_tensor v1d = dg_tensor_1d("v", DG_FMT_F32, P(4), 64 * 33); /* the same count, another shape */
	a.m = &m;
	a.v = &v1d;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "v", "64, 33");
	a.v = &v;
	dg_tensor g2 = dg_tensor_2d("grad", DG_FMT_F32, P(2), 33, 64);
	a.grad = &g2;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "grad", "64, 33");
	a.grad = &g;
	/* missing, misaligned */
	a.v = NULL;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "v", "missing");
	a.v = &v;
	a.p = NULL;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "p", "missing");
	a.p = &p;
	m.data += 8;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "m", "aligned");
	m.data = P(3);
	/* aliasing: p, m and v are each written */
	m.data = p.data;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "m", "alias p");
	m.data = P(3);
	g.data = p.data;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "grad", "alias p");
	g.data = P(2);
	v.data = m.data;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "v", "alias m");
	v.data = g.data;
	nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "v", "alias grad");
	v.data = P(4);
	/* the copy 16-byte aligned (its stores are 8-byte vectors), the
	 * control block 8-byte aligned (it holds doubles) */
	static const unsigned offs[] = { 2, 8 };
	for (int k = 0; k < 2; k++) {
		a.copy = P(6) + offs[k];
		nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "copy", "16-byte aligned");
	}
	a.copy = P(6);
	static const unsigned coffs[] = { 4, 2, 1 };
	for (int k = 0; k < 3; k++) {
		a.ctl = P(5) + coffs[k];
		nh_expect_named(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), msg, "ctl", "8-byte aligned");
	}
	a.ctl = P(5) + 8;
	cr_assert_eq(dg_adamw_update_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* no args, another op's spec, a bad spec */
	cr_assert_eq(dg_adamw_update_check(&s, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_adamw_update_check(NULL, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	dg_spec q;
	dg_spec_init(&q, DG_OP_GATE_FWD);
	cr_assert_eq(dg_adamw_update_check(&q, &a, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "adamw_update"), "%s", msg);
}

/* A gate op at 2 heads of latent 64 (normalized: its default formats). */
static dg_spec gate_spec(dg_op op)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = 2;
	s.latent = 64;
	dg_spec_normalize(&s);
	return s;
}

/* The gate kernels read their device step as a uint32. */
Test(nvrtc_optim, gate_checks_refuse_a_misaligned_step_at)
{
	char msg[512];
	dg_spec s = gate_spec(DG_OP_GATE_FWD);
	dg_tensor xs = dg_tensor_4d("xs", s.act, P(1), 2, 2, 8, 64);
	dg_tensor ys = dg_tensor_4d("ys", s.act, P(2), 2, 2, 8, 64);
	dg_tensor xy = dg_tensor_4d("xy", s.act, P(3), 2, 2, 8, 64);
	dg_gate_fwd_args f = { .xs = &xs, .ys = &ys, .xy = &xy, .p = 0.1f, .seed = 1, .step = 2,
			       .layer = 3, .step_at = P(4) };
	cr_assert_eq(dg_gate_fwd_check(&s, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	f.step_at = P(4) + 4;
	cr_assert_eq(dg_gate_fwd_check(&s, &f, msg, sizeof(msg)), DG_OK, "%s", msg);
	f.step_at = P(4) + 2;
	nh_expect_named(dg_gate_fwd_check(&s, &f, msg, sizeof(msg)), msg, "step_at", "4-byte aligned");

	dg_spec sb = gate_spec(DG_OP_GATE_BWD);
	dg_tensor dxy = dg_tensor_4d("dxy", sb.out, P(5), 2, 2, 8, 64);
	dg_tensor dxs = dg_tensor_4d("dxs", sb.out, P(6), 2, 2, 8, 64);
	dg_tensor bxs = dg_tensor_4d("xs", sb.act, P(1), 2, 2, 8, 64);
	dg_tensor bys = dg_tensor_4d("ys", sb.act, P(2), 2, 2, 8, 64);
	dg_gate_bwd_args b = { .dxy = &dxy, .xs = &bxs, .ys = &bys, .dxs = &dxs, .p = 0.1f, .step_at = P(4) };
	cr_assert_eq(dg_gate_bwd_check(&sb, &b, msg, sizeof(msg)), DG_OK, "%s", msg);
	b.step_at = P(4) + 1;
	nh_expect_named(dg_gate_bwd_check(&sb, &b, msg, sizeof(msg)), msg, "step_at", "4-byte aligned");
}

/* ---- the reference --------------------------------------------------------------- */

static float *rand_f32(dg_rng *r, size_t n, float lo, float hi)
{
	float *p = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = dg_rng_uniform(r, lo, hi);
	return p;
}

static float *dup_f32(const float *a, size_t n)
{
	float *p = malloc(n * sizeof(float) + 1);
	cr_assert_not_null(p);
	memcpy(p, a, n * sizeof(float));
	return p;
}

/* dg_adamw_ctl_fill by hand at t = 0 and t = 2 (defaults: β1 0.9, β2 0.95,
 * eps 1e-8, wd 0.1): s = lr/(1 − β1ᵗ⁺¹), cs = sqrt(1 − β2ᵗ⁺¹), computed in
 * double and rounded once. */
Test(nvrtc_optim, ctl_fill_by_hand)
{
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	dg_adamw_ctl k;
	memset(&k, 0x5a, sizeof(k));
	dg_adamw_ctl_fill(&c, 0, 2e-3f, &k);
	cr_assert_eq(k.lr, 2e-3f);
	cr_assert_eq(k.d, (float)(1.0 - (double)2e-3f * (double)0.1f));
	cr_assert_eq(k.s, (float)((double)2e-3f / (1.0 - (double)0.9f)));
	cr_assert_float_eq(k.s, 2e-2f, 1e-8); /* lr/0.1 */
	cr_assert_eq(k.cs, (float)sqrt(1.0 - (double)0.95f));
	cr_assert_eq(k.w, (float)(1.0 - (double)0.9f));
	cr_assert_eq(k.b2, 0.95f);
	cr_assert_eq(k.w2, (float)(1.0 - (double)0.95f));
	cr_assert_eq(k.eps, 1e-8f);
	cr_assert_eq(k.clip, 1.0f);
	cr_assert_eq(k.step, 0);
	cr_assert_eq(k.scale, 1.0f);
	cr_assert_eq(k.skip, 0);
	cr_assert_eq(k.sq, 0.0);
	cr_assert_eq(k.norm, 0.0);
	dg_adamw_ctl_fill(&c, 2, 1e-3f, &k);
	const double b1 = 0.9f, b2 = 0.95f, s3 = (double)1e-3f / (1.0 - b1 * b1 * b1), c3 = sqrt(1.0 - b2 * b2 * b2);
	cr_assert_float_eq((double)k.s, s3, 1e-7 * s3, "s = %.9g, want %.9g", (double)k.s, s3);
	cr_assert_float_eq((double)k.cs, c3, 1e-7 * c3, "cs = %.9g, want %.9g", (double)k.cs, c3);
	cr_assert_eq(k.step, 2);
	/* the default control block: step 0 of the defaults at lr 1e-3, no clip */
	dg_adamw_ctl def, want;
	dg_ref_adamw_default_ctl(&def);
	c.clip = 0.0f;
	dg_adamw_ctl_fill(&c, 0, 1e-3f, &want);
	cr_assert_eq(memcmp(&def, &want, sizeof(def)), 0, "the default control block is not step 0 of the defaults");
	cr_assert_eq(def.scale, 1.0f);
	cr_assert_eq(def.skip, 0);
}

/* One update from zero moments moves each parameter by lr·sign(g) (m/√v is
 * ±1 then, up to eps), after p·(1 − lr·wd) with decay; the copy is the
 * new p in bf16. */
Test(nvrtc_optim, ref_adamw_by_hand)
{
	dg_adamw_config c;
	dg_adamw_defaults(&c, 100);
	dg_adamw_ctl k;
	dg_adamw_ctl_fill(&c, 0, 1e-2f, &k);
	float p[4] = { 1.0f, -2.0f, 0.5f, 3.0f }, g[4] = { 0.5f, -4.0f, 0.25f, 0.0f };
	float m[4] = { 0 }, v[4] = { 0 };
	uint16_t copy[4] = { 0, 0, 0, 0 };
	const float p0[4] = { 1.0f, -2.0f, 0.5f, 3.0f };
	dg_ref_adamw(&k, true, p, g, m, v, copy, 4);
	for (int i = 0; i < 4; i++) {
		const double dec = (double)p0[i] * (1.0 - 1e-2 * 0.1);
		const double step = g[i] > 0 ? -1e-2 : g[i] < 0 ? 1e-2 : 0.0;
		cr_assert_float_eq((double)p[i], dec + step, 1e-6, "p[%d] = %.9g, want %.9g", i, (double)p[i],
				   dec + step);
		cr_assert_eq(m[i], k.w * g[i], "m[%d]", i); /* 0 + w·(g − 0) */
		cr_assert_eq(v[i], (k.w2 * g[i]) * g[i], "v[%d]", i);
		cr_assert_eq(copy[i], dg_f32_to_bf16(p[i]), "copy[%d]", i);
	}
	/* the clip scale multiplies g: scale 0 moves nothing but the decay */
	float q[2] = { 1.0f, -1.0f }, qg[2] = { 5.0f, -5.0f }, qm[2] = { 0 }, qv[2] = { 0 };
	k.scale = 0.0f;
	dg_ref_adamw(&k, false, q, qg, qm, qv, NULL, 2);
	cr_assert_eq(q[0], 1.0f);
	cr_assert_eq(q[1], -1.0f);
	cr_assert_eq(qm[0], 0.0f);
	cr_assert_eq(qv[0], 0.0f);
}

/* dg_ref_adamw with dg_adamw_ctl_fill's block and the scale is the host
 * optimizer's dg_adamw_step, bit for bit, step after step; the copy is
 * the bf16 of the new p; skip touches nothing. */
Test(nvrtc_optim, ref_adamw_is_adamw_step)
{
	enum { N = 4099 };
	static const struct {
		int64_t t;
		float lr, scale;
	} steps[] = { { 0, 1e-3f, 1.0f }, { 1, 3e-4f, 0.37f }, { 7, 2e-2f, 1.0f }, { 500, 5e-5f, 0.37f } };
	dg_rng r = { 0x0f7 };
	for (int cfg = 0; cfg < 2; cfg++)
		for (int decay = 0; decay < 2; decay++) {
			dg_adamw_config c;
			dg_adamw_defaults(&c, 1000);
			if (cfg)
				c.beta1 = 0.3f; /* w = 0.7: the lerp's other form */
			float *p = rand_f32(&r, N, -1, 1), *pa = dup_f32(p, N);
			float *m = calloc(N, sizeof(float)), *ma = calloc(N, sizeof(float));
			float *v = calloc(N, sizeof(float)), *va = calloc(N, sizeof(float));
			uint16_t *copy = malloc(N * sizeof(uint16_t));
			cr_assert(m && ma && v && va && copy);
			for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
				float *g = rand_f32(&r, N, -1, 1);
				g[s] = 0.0f;
				dg_adamw_ctl k;
				dg_adamw_ctl_fill(&c, steps[s].t, steps[s].lr, &k);
				k.scale = steps[s].scale;
				memset(copy, 0xff, N * sizeof(uint16_t));
				float *before = dup_f32(p, N);
				dg_ref_adamw(&k, decay, p, g, m, v, copy, N);
				dg_adamw_step(&c, steps[s].t, steps[s].lr, steps[s].scale, decay, pa, g, ma, va, N);
				cr_assert_eq(memcmp(p, pa, N * sizeof(float)), 0, "cfg %d decay %d t %lld: p",
					     cfg, decay, (long long)steps[s].t);
				cr_assert_eq(memcmp(m, ma, N * sizeof(float)), 0, "m at t %lld", (long long)steps[s].t);
				cr_assert_eq(memcmp(v, va, N * sizeof(float)), 0, "v at t %lld", (long long)steps[s].t);
				cr_assert_neq(memcmp(p, before, N * sizeof(float)), 0, "the step moved nothing");
				for (size_t i = 0; i < N; i++)
					cr_assert_eq(copy[i], dg_f32_to_bf16(p[i]), "copy[%zu] at t %lld", i,
						     (long long)steps[s].t);
				/* skip: nothing moves, the copy included */
				float *ps = dup_f32(p, N), *ms = dup_f32(m, N), *vs = dup_f32(v, N);
				uint16_t c0 = copy[0];
				copy[0] = (uint16_t)~c0;
				k.skip = 1;
				k.lr = k.s = 1.0f;
				dg_ref_adamw(&k, decay, p, g, m, v, copy, N);
				cr_assert_eq(memcmp(p, ps, N * sizeof(float)), 0, "skip moved p");
				cr_assert_eq(memcmp(m, ms, N * sizeof(float)), 0, "skip moved m");
				cr_assert_eq(memcmp(v, vs, N * sizeof(float)), 0, "skip moved v");
				cr_assert_eq(copy[0], (uint16_t)~c0, "skip wrote the copy");
				copy[0] = c0;
				free(ps), free(ms), free(vs), free(before), free(g);
			}
			free(p), free(pa), free(m), free(ma), free(v), free(va), free(copy);
		}
}

/* The loss scaler's rule by hand (interval 3): finite steps count up and
 * the third doubles S and restarts the count; a non-finite one halves S
 * and zeroes it; a doubling past FLT_MAX keeps S; off moves nothing. */
Test(nvrtc_optim, loss_scale_rule_by_hand)
{
	dg_loss_scaler ls;
	dg_loss_scaler_defaults(&ls, true);
	cr_assert_eq(ls.mode, DG_LOSS_SCALE_DYNAMIC);
	cr_assert_eq(ls.scale, 65536.0f);
	cr_assert_eq(ls.growth_interval, 2000u);
	cr_assert_eq(ls.good_steps, 0u);
	ls.growth_interval = 3;
	static const struct {
		bool finite;
		float scale;
		uint32_t good;
	} seq[] = { { true, 65536.0f, 1 },  { true, 65536.0f, 2 },  { true, 131072.0f, 0 },
		    { true, 131072.0f, 1 }, { false, 65536.0f, 0 }, { false, 32768.0f, 0 },
		    { true, 32768.0f, 1 },  { true, 32768.0f, 2 },  { false, 16384.0f, 0 } };
	for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
		dg_ref_loss_scale_update(&ls, seq[i].finite);
		cr_assert_eq(ls.scale, seq[i].scale, "step %zu: S %g, want %g", i, (double)ls.scale,
			     (double)seq[i].scale);
		cr_assert_eq(ls.good_steps, seq[i].good, "step %zu: good %u, want %u", i, ls.good_steps,
			     seq[i].good);
	}
	ls.scale = 0x1p127f; /* 2S is infinite: kept */
	ls.good_steps = 2;
	dg_ref_loss_scale_update(&ls, true);
	cr_assert_eq(ls.scale, 0x1p127f);
	cr_assert_eq(ls.good_steps, 0u);
	dg_loss_scaler off;
	dg_loss_scaler_defaults(&off, false);
	cr_assert_eq(off.scale, 1.0f);
	dg_ref_loss_scale_update(&off, false);
	cr_assert_eq(off.scale, 1.0f);
	cr_assert_eq(off.good_steps, 0u);
}
