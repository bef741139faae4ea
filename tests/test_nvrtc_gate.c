/*
 * The gate and step families' kernels (templates/gate.lua, templates/step.lua,
 * templates/decoder_gate.lua) render and compile to sm_90 cubins without a
 * GPU (decoder_gate_bwd: both paths, sm_90a and sm_80 / sm_75):
 *   - each op for act f32 and bf16 at the BDH shape, at a small odd one
 *     (heads 3, latent 13: the scalar tail of the vector loop; transpose
 *     embd 36, latent 13: partial tiles), and on non-default thread counts
 *     (t64, t1024);
 *   - the gradients' formats (dragon/spec.h): gate_bwd's out (dxy, dys,
 *     dxs) and add_mask's out (dxs) and src (other), f32 | bf16 in every
 *     combination with either act, at both shapes; f32 left out of the
 *     canonical text (the texts the op had before the fields);
 *   - bad specs are refused naming the field (act, out, src, threads, a
 *     block tile);
 *   - the _checks refuse wrong tensors by name, a drop probability outside
 *     [0, 1) and a dxs that aliases dxy, with no device; decoder_gate_bwd_ys's
 *     a dxs or dys over any other tensor, codes without their scale, a w
 *     that is not bf16, step_at misaligned.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "dragon/spec.h"
#include "runtime/ops/checks.h"
#include "runtime/store/nvrtc.h"
#include "helpers.h"
#include "nvrtc_helpers.h"

static const dg_op ops[] = { DG_OP_GATE_FWD, DG_OP_GATE_BWD, DG_OP_ADD_MASK, DG_OP_ADD3,
			     DG_OP_TRANSPOSE };
#define N_OPS 5

static dg_spec spec_of(dg_op op, dg_fmt act)
{
	dg_spec s;
	dg_spec_init(&s, op);
	if (dg_spec_uses(op) & DG_FIELD_ACT)
		s.act = act;
	return s;
}

static const char *path_of(dg_op op)
{
	return op == DG_OP_TRANSPOSE ? "path: 32x32 tiles" : "path: element-wise";
}

Test(nvrtc_gate, every_op_act_and_shape)
{
	dg_codegen *cg = nh_codegen();
	for (int o = 0; o < N_OPS; o++)
		for (int a = 0; a < 2; a++)
			for (int small = 0; small < 2; small++) {
				dg_spec s = spec_of(ops[o], a ? DG_FMT_BF16 : DG_FMT_F32);
				if (small)
					s.heads = 3, s.latent = 13, s.embd = 36;
				s.tile.threads = small ? 64 : 0;
				char m[512];
				cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
				nh_compile(cg, &s, path_of(ops[o]), 90);
			}
	/* the decoder's transpose (E = H·N) and the largest block */
	dg_spec t = spec_of(DG_OP_TRANSPOSE, DG_FMT_BF16);
	t.embd = 32768, t.latent = 256, t.tile.threads = 1024;
	nh_compile(cg, &t, path_of(DG_OP_TRANSPOSE), 90);
	t = spec_of(DG_OP_GATE_BWD, DG_FMT_BF16);
	t.tile.threads = 1024;
	nh_compile(cg, &t, path_of(DG_OP_GATE_BWD), 90);
	dg_codegen_destroy(cg);
}

/* gate_quant (templates/gate_quant.lua): src f32 | bf16 × codes uint8pos |
 * int8, at the BDH token (4 × 8192: every vector in registers), a small
 * odd one (3 × 13: the element path), one of a vector a thread (1 × 64),
 * the widest token (16 × 65536: past the registers), on t64 and t1024
 * too; its auto tile by the token's size; an int4 code or an f32 act
 * refused. */
Test(nvrtc_gate, gate_quant_formats_and_shapes)
{
	dg_codegen *cg = nh_codegen();
	static const int HL[][2] = { { 4, 8192 }, { 3, 13 }, { 1, 64 }, { 16, 65536 } };
	for (int src = 0; src < 2; src++)
		for (int act = 0; act < 2; act++)
			for (int i = 0; i < 4; i++)
				for (int th = 0; th < 3; th++) {
					if (th && i != 0)
						continue;
					dg_spec s;
					dg_spec_init(&s, DG_OP_GATE_QUANT);
					s.src = src ? DG_FMT_BF16 : DG_FMT_F32;
					s.act = act ? DG_FMT_INT8 : DG_FMT_UINT8POS;
					s.heads = HL[i][0], s.latent = HL[i][1];
					s.tile.threads = th == 1 ? 64 : th == 2 ? 1024 : 0;
					char m[512];
					cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
					nh_compile(cg, &s, "a block a token", 90);
				}
	/* the auto tile: the staged t256/1 where the token fills 256 threads
	 * with vectors and fits three blocks an SM (4 × 8192 bf16: 64 KiB),
	 * else the register form's 512 threads (f32's 128 KiB, a token past
	 * shared memory, a token of a few vectors) */
	static const struct {
		int h, l, src;
		const char *tile;
	} AUTO[] = { { 4, 8192, DG_FMT_BF16, "tile=t256/1;" }, { 4, 8192, DG_FMT_F32, "tile=t512;" },
		     { 16, 65536, DG_FMT_BF16, "tile=t512;" }, { 1, 64, DG_FMT_BF16, "tile=t512;" },
		     { 1, 2048, DG_FMT_BF16, "tile=t256/1;" } };
	dg_spec s;
	char m[512];
	for (size_t i = 0; i < sizeof(AUTO) / sizeof(AUTO[0]); i++) {
		dg_spec_init(&s, DG_OP_GATE_QUANT);
		s.heads = AUTO[i].h, s.latent = AUTO[i].l, s.src = AUTO[i].src;
		dg_source *src = NULL;
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert(strstr(src->text, AUTO[i].tile), "%d x %d: the auto tile is %s", AUTO[i].h, AUTO[i].l,
			  AUTO[i].tile);
		dg_source_destroy(src);
	}
	dg_spec_init(&s, DG_OP_GATE_QUANT);
	s.act = DG_FMT_INT4;
	cr_assert_neq(dg_spec_validate(&s, m, sizeof(m)), DG_OK);
	cr_assert(strstr(m, "act"), "%s", m);
	dg_spec_init(&s, DG_OP_GATE_QUANT);
	s.src = DG_FMT_INT8;
	cr_assert_neq(dg_spec_validate(&s, m, sizeof(m)), DG_OK);
	cr_assert(strstr(m, "src"), "%s", m);
	dg_codegen_destroy(cg);
}

/* gate_quant's staged form (tile t<N>/1: the token's xy in shared
 * memory): compiles for both srcs and codes at the BDH token, a vector a
 * thread (1 × 64) and 3 × 1000, at 128, 256 and 512 threads, with the
 * token's bytes as its dynamic shared memory; refused naming why where
 * a head is not whole vectors (latent 13), where the token passes the
 * arch's shared memory (16 × 65536; f32 4 × 8192 on sm_86, 99 KiB), and
 * for any other element-wise op (quantize_act: nothing to stage). */
Test(nvrtc_gate, gate_quant_staged_form)
{
	dg_codegen *cg = nh_codegen();
	static const int HL[][2] = { { 4, 8192 }, { 1, 64 }, { 3, 1000 } };
	static const int threads[] = { 128, 256, 512 };
	for (int src = 0; src < 2; src++)
		for (int act = 0; act < 2; act++)
			for (int i = 0; i < 3; i++)
				for (int th = 0; th < 3; th++) {
					if (th != 1 && i != 0)
						continue;
					dg_spec s;
					dg_spec_init(&s, DG_OP_GATE_QUANT);
					s.src = src ? DG_FMT_BF16 : DG_FMT_F32;
					s.act = act ? DG_FMT_INT8 : DG_FMT_UINT8POS;
					s.heads = HL[i][0], s.latent = HL[i][1];
					s.tile.threads = threads[th], s.tile.stages = 1;
					char m[512];
					cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
					dg_plan p;
					cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
					cr_assert_eq(p.entries[0].smem, s.heads * s.latent * (src ? 2 : 4), "smem %d",
						     p.entries[0].smem);
					cr_assert_eq(p.entries[0].threads, threads[th]);
					nh_compile(cg, &s, "staged in", 90);
				}
	static const struct {
		int h, l, src_bf16, arch;
		const char *why;
	} bad[] = { { 3, 13, 1, 90, "latent 13 is not a multiple of 8" },
		    { 3, 13, 0, 90, "latent 13 is not a multiple of 4" },
		    { 16, 65536, 1, 90, "2097152 bytes, more than the 232448" },
		    { 4, 8192, 0, 86, "131072 bytes, more than the 101376 an sm_86" } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		dg_spec s;
		dg_spec_init(&s, DG_OP_GATE_QUANT);
		s.src = bad[i].src_bf16 ? DG_FMT_BF16 : DG_FMT_F32;
		s.heads = bad[i].h, s.latent = bad[i].l, s.arch = bad[i].arch;
		s.tile.threads = 256, s.tile.stages = 1;
		dg_plan p;
		cr_assert_neq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s planned", bad[i].why);
		cr_assert(strstr(dg_codegen_errmsg(cg), bad[i].why) && strstr(dg_codegen_errmsg(cg), "tile=t256/1"),
			  "%s", dg_codegen_errmsg(cg));
	}
	dg_spec q;
	dg_spec_init(&q, DG_OP_QUANTIZE_ACT);
	q.tile.threads = 256, q.tile.stages = 1;
	dg_plan p;
	cr_assert_neq(dg_codegen_plan(cg, &q, &p), DG_OK);
	cr_assert(strstr(dg_codegen_errmsg(cg), "stages nothing"), "%s", dg_codegen_errmsg(cg));
	dg_codegen_destroy(cg);
}

/* Every combination of act, the gradient (out) and add_mask's other
 * (src) compiles; the kernel's types follow them. */
Test(nvrtc_gate, gradient_formats)
{
	dg_codegen *cg = nh_codegen();
	char text[DG_SPEC_TEXT_MAX];
	for (int k = 0; k < 8; k++)
		for (int small = 0; small < 2; small++)
			for (int o = 0; o < 2; o++) {
				dg_fmt act = k & 1 ? DG_FMT_BF16 : DG_FMT_F32, gf = k & 2 ? DG_FMT_BF16 : DG_FMT_F32,
				       of = k & 4 ? DG_FMT_BF16 : DG_FMT_F32;
				dg_spec s = spec_of(o ? DG_OP_ADD_MASK : DG_OP_GATE_BWD, act);
				if (!o && of == DG_FMT_BF16)
					continue; /* gate_bwd reads no src */
				s.out = gf;
				if (o)
					s.src = of;
				if (small)
					s.heads = 3, s.latent = 13;
				char m[512];
				cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
				dg_spec_to_string(&s, text, sizeof(text));
				cr_assert_eq(strstr(text, "out=bf16;") != NULL, gf == DG_FMT_BF16, "%s", text);
				cr_assert_eq(strstr(text, "src=bf16;") != NULL, of == DG_FMT_BF16, "%s", text);
				if (act == DG_FMT_BF16) /* an f32 gradient is not named */
					cr_assert_null(strstr(text, "=f32;"), "%s", text);
				dg_source *src = NULL;
				cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
				char want[96];
				snprintf(want, sizeof(want), "typedef %s GT;", gf == DG_FMT_BF16 ? "unsigned short" : "float");
				cr_assert(strstr(src->text, want), "%s: no '%s'", text, want);
				bool any = act == DG_FMT_BF16 || gf == DG_FMT_BF16 || (o && of == DG_FMT_BF16);
				cr_assert(strstr(src->text, any ? "VE = 8;" : "VE = 4;"), "%s: vector width", text);
				dg_source_destroy(src);
				nh_compile(cg, &s, path_of(s.op), 90);
			}
	dg_codegen_destroy(cg);
}

Test(nvrtc_gate, bad_specs_are_refused_naming_the_field)
{
	dg_codegen *cg = nh_codegen();
	for (int o = 0; o < N_OPS; o++) {
		dg_spec s = spec_of(ops[o], DG_FMT_BF16);
		if (dg_spec_uses(ops[o]) & DG_FIELD_ACT) {
			s.act = DG_FMT_INT8;
			nh_expect_refused(cg, &s, "act");
		}
		s = spec_of(ops[o], DG_FMT_BF16);
		s.tile.threads = 48;
		nh_expect_refused(cg, &s, "threads");
		s.tile.threads = 2048;
		nh_expect_refused(cg, &s, "threads");
		s.tile = (dg_tile){ 64, 64, 32, 2, 2, 2, 0 };
		nh_expect_refused(cg, &s, "tile");
	}
	dg_spec t = spec_of(DG_OP_TRANSPOSE, DG_FMT_F32);
	t.embd = 30; /* embd is a multiple of 4 for every op */
	nh_expect_refused(cg, &t, "embd");
	/* a gradient format the ops do not take */
	t = spec_of(DG_OP_GATE_BWD, DG_FMT_BF16);
	t.out = DG_FMT_INT8;
	nh_expect_refused(cg, &t, "out=int8");
	t = spec_of(DG_OP_ADD_MASK, DG_FMT_BF16);
	t.out = DG_FMT_UINT8POS;
	nh_expect_refused(cg, &t, "out=uint8pos");
	t = spec_of(DG_OP_ADD_MASK, DG_FMT_BF16);
	t.src = DG_FMT_INT8;
	nh_expect_refused(cg, &t, "src=int8");
	dg_codegen_destroy(cg);
}

/* ---- the checks, without a device ------------------------------------------------ */

/* A _check refused the call naming `name`. */
#define expect_named(st, msg, name) nh_expect_named(st, msg, name, NULL)

#define P(i) ((dg_dptr)0x100000 * (i))

Test(nvrtc_gate, gate_checks_refuse_wrong_tensors_and_rates)
{
	dg_spec s = spec_of(DG_OP_GATE_FWD, DG_FMT_BF16);
	s.heads = 2, s.latent = 13;
	char msg[512];
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, P(1), 2, 2, 7, 13);
	dg_tensor ys = dg_tensor_4d("ys", DG_FMT_BF16, P(2), 2, 2, 7, 13);
	dg_tensor xy = dg_tensor_4d("xy", DG_FMT_BF16, P(3), 2, 2, 7, 13);
	dg_gate_fwd_args a = { .xs = &xs, .ys = &ys, .xy = &xy, .p = 0.1f, .seed = 5 };
	cr_assert_eq(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	ys.shape[2] = 8; /* T differs from xs' */
	expect_named(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), msg, "ys");
	ys.shape[2] = 7;
	xy.fmt = DG_FMT_F32; /* not the spec's act */
	expect_named(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), msg, "xy");
	xy.fmt = DG_FMT_BF16;
	xs.shape[3] = 16; /* not the spec's latent */
	expect_named(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), msg, "xs");
	xs.shape[3] = 13;
	const float bad_p[] = { 1.0f, -0.1f, 1.5f, NAN };
	for (size_t i = 0; i < sizeof(bad_p) / sizeof(bad_p[0]); i++) {
		a.p = bad_p[i];
		cr_assert_eq(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG, "p=%g accepted",
			     (double)bad_p[i]);
		cr_assert(strstr(msg, "p=") && strstr(msg, "[0, 1)"), "%s", msg);
	}
	a.p = 0.0f;
	cr_assert_eq(dg_gate_fwd_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);

	dg_spec b = spec_of(DG_OP_GATE_BWD, DG_FMT_F32);
	b.heads = 2, b.latent = 13;
	dg_tensor dxy = dg_tensor_4d("dxy", DG_FMT_F32, P(4), 2, 2, 7, 13);
	dg_tensor fx = dg_tensor_4d("xs", DG_FMT_F32, P(1), 2, 2, 7, 13);
	dg_tensor fy = dg_tensor_4d("ys", DG_FMT_F32, P(2), 2, 2, 7, 13);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_F32, P(5), 2, 2, 7, 13);
	dg_gate_bwd_args ba = { .dxy = &dxy, .xs = &fx, .ys = &fy, .dxs = &dxs, .p = 0.1f };
	cr_assert_eq(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), DG_OK, "%s", msg);
	dxy.fmt = DG_FMT_BF16; /* the spec's gradients are f32 (out) */
	expect_named(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), msg, "dxy");
	dxy.fmt = DG_FMT_F32;
	dxs.fmt = DG_FMT_BF16;
	expect_named(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), msg, "dxs");
	/* out=bf16: every gradient bf16 */
	b.out = DG_FMT_BF16;
	expect_named(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), msg, "dxy");
	cr_assert(strstr(msg, "bf16"), "%s", msg);
	dxy.fmt = DG_FMT_BF16;
	cr_assert_eq(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), DG_OK, "%s", msg);
	dxs.fmt = DG_FMT_F32;
	expect_named(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), msg, "dxs");
	b.out = DG_FMT_F32;
	dxy.fmt = DG_FMT_F32;
	dxs.data = dxy.data; /* dys is written over dxy */
	expect_named(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), msg, "dxs");
	dxs.data = P(5);
	ba.p = 1.0f;
	cr_assert_eq(dg_gate_bwd_check(&b, &ba, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	/* a spec of another op */
	cr_assert_eq(dg_gate_bwd_check(&s, &ba, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "gate_fwd"), "%s", msg);
}

Test(nvrtc_gate, step_checks_refuse_wrong_tensors)
{
	char msg[512];
	dg_spec m = spec_of(DG_OP_ADD_MASK, DG_FMT_BF16);
	m.heads = 2, m.latent = 13;
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_F32, P(1), 1, 2, 5, 13);
	dg_tensor other = dg_tensor_4d("other", DG_FMT_F32, P(2), 1, 2, 5, 13);
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, P(3), 1, 2, 5, 13);
	dg_add_mask_args ma = { .dxs = &dxs, .other = &other, .xs = &xs };
	cr_assert_eq(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), DG_OK, "%s", msg);
	other.shape[0] = 2; /* B differs from dxs' */
	expect_named(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), msg, "other");
	other.shape[0] = 1;
	xs.fmt = DG_FMT_F32;
	expect_named(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), msg, "xs");
	xs.fmt = DG_FMT_BF16;
	/* the gradients: dxs in out, other in src */
	m.out = DG_FMT_BF16;
	expect_named(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), msg, "dxs");
	dxs.fmt = DG_FMT_BF16;
	cr_assert_eq(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), DG_OK, "%s", msg);
	m.src = DG_FMT_BF16;
	expect_named(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), msg, "other");
	other.fmt = DG_FMT_BF16;
	cr_assert_eq(dg_add_mask_check(&m, &ma, msg, sizeof(msg)), DG_OK, "%s", msg);

	dg_spec s3 = spec_of(DG_OP_ADD3, DG_FMT_F32);
	dg_tensor a = dg_tensor_2d("a", DG_FMT_F32, P(1), 3, 100);
	dg_tensor b = dg_tensor_2d("b", DG_FMT_F32, P(2), 3, 100);
	dg_tensor c = dg_tensor_2d("c", DG_FMT_F32, P(3), 3, 100);
	dg_tensor out = dg_tensor_2d("out", DG_FMT_F32, P(1), 3, 100); /* aliases a: allowed */
	dg_add3_args aa = { .a = &a, .b = &b, .c = &c, .out = &out };
	cr_assert_eq(dg_add3_check(&s3, &aa, msg, sizeof(msg)), DG_OK, "%s", msg);
	c.shape[1] = 101; /* the shape is a's */
	expect_named(dg_add3_check(&s3, &aa, msg, sizeof(msg)), msg, "c");
	c.shape[1] = 100;
	out.fmt = DG_FMT_BF16;
	expect_named(dg_add3_check(&s3, &aa, msg, sizeof(msg)), msg, "out");
	out.fmt = DG_FMT_F32;
	aa.b = NULL;
	expect_named(dg_add3_check(&s3, &aa, msg, sizeof(msg)), msg, "b");

	dg_spec t = spec_of(DG_OP_TRANSPOSE, DG_FMT_BF16);
	t.embd = 256, t.latent = 8192;
	dg_tensor in = dg_tensor_3d("in", DG_FMT_F32, P(1), 4, 256, 8192);
	dg_tensor to = dg_tensor_3d("out", DG_FMT_BF16, P(2), 4, 8192, 256);
	dg_transpose_args ta = { .in = &in, .out = &to };
	cr_assert_eq(dg_transpose_check(&t, &ta, msg, sizeof(msg)), DG_OK, "%s", msg);
	to.shape[1] = 256, to.shape[2] = 8192; /* not transposed */
	expect_named(dg_transpose_check(&t, &ta, msg, sizeof(msg)), msg, "out");
	to.shape[1] = 8192, to.shape[2] = 256;
	in.fmt = DG_FMT_BF16; /* masters are f32 */
	expect_named(dg_transpose_check(&t, &ta, msg, sizeof(msg)), msg, "in");
	in.fmt = DG_FMT_F32;
	to.shape[0] = 3; /* R is in's */
	expect_named(dg_transpose_check(&t, &ta, msg, sizeof(msg)), msg, "out");
}

/* ---- decoder_gate_bwd (templates/decoder_gate.lua) ------------------------------ */

/* decoder_gate_bwd at (H, E, L) for arch (sm_90a: specific), its banner
 * naming path, compiled for that target with no spills. */
static void compile_dg(dg_codegen *cg, int H, int E, int L, dg_fmt w, dg_fmt act, dg_fmt out, int arch,
		       bool specific, const char *path)
{
	char e[8192], text[DG_SPEC_TEXT_MAX];
	dg__nvrtc_target t;
	dg__nvrtc_result res;
	dg_source *src = NULL;
	dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, H, E, L);
	s.weight = w;
	s.act = act;
	s.out = out;
	s.arch = arch;
	s.arch_specific = specific;
	dg_spec_to_string(&s, text, sizeof(text));
	cr_assert_eq(dg__nvrtc_target_for(arch, specific, &t, e, sizeof(e)), DG_OK, "%s", e);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
	cr_assert_eq(src->n_entries, 1, "%s", text);
	cr_assert_str_eq(src->entries[0], "dg_decoder_gate_bwd", "%s", text);
	cr_assert(strstr(src->text, path), "%s: expected '%s' in the banner", text, path);
	cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s", text, e);
	cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not an ELF cubin", text);
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
}

Test(nvrtc_gate, decoder_gate_bwd_both_paths)
{
	dg_codegen *cg = nh_codegen();
	static const dg_fmt F[2] = { DG_FMT_F32, DG_FMT_BF16 };
	/* the warpgroup path: bf16 w, any act and out; the BDH shape and
	 * ragged ones (L 100: rows that are not whole vectors) */
	for (int a = 0; a < 2; a++)
		for (int o = 0; o < 2; o++) {
			compile_dg(cg, 4, 256, 8192, DG_FMT_BF16, F[a], F[o], 90, true, "path: warpgroup");
			compile_dg(cg, 3, 64, 100, DG_FMT_BF16, F[a], F[o], 90, true, "path: warpgroup");
		}
	/* the fp32 path: elsewhere, f32 w, or E not a multiple of 64 */
	compile_dg(cg, 4, 256, 8192, DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 80, false, "path: fp32");
	compile_dg(cg, 4, 256, 8192, DG_FMT_F32, DG_FMT_BF16, DG_FMT_BF16, 90, true, "path: fp32");
	compile_dg(cg, 3, 36, 13, DG_FMT_BF16, DG_FMT_F32, DG_FMT_F32, 90, true, "path: fp32");
	compile_dg(cg, 2, 32, 64, DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, 75, false, "path: fp32");
	dg_codegen_destroy(cg);
}

/* The persistent form by TMA (templates/decoder_gate_tma.lua): a tile of
 * 5 stages names it where the formats and L allow; its module has the
 * _cast entry; the shared memory (ring, slots, barriers) within sm_90's
 * limit; it compiles, at the BDH shape, the 1B one and a ragged one.
 * Elsewhere (f32 act, L % 8 != 0) the tile is refused naming it. */
Test(nvrtc_gate, decoder_gate_bwd_persistent_form)
{
	dg_codegen *cg = nh_codegen();
	char e[8192];
	static const int SH[3][3] = { { 4, 256, 8192 }, { 16, 1280, 16384 }, { 2, 64, 200 } };
	for (int i = 0; i < 3; i++) {
		dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, SH[i][0], SH[i][1], SH[i][2]);
		s.weight = s.act = s.out = DG_FMT_BF16;
		s.arch = 90, s.arch_specific = true;
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
		dg_plan p;
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_str_eq(p.path, "wgmma tma persistent", "%s", p.canonical);
		cr_assert_eq(p.n_entries, 2, "%s", p.canonical);
		cr_assert_str_eq(p.entries[0].name, "dg_decoder_gate_bwd");
		cr_assert_str_eq(p.entries[1].name, "dg_decoder_gate_bwd_cast");
		cr_assert_eq(p.entries[0].threads, 384, "%s", p.canonical);
		cr_assert(p.entries[0].smem > 200 * 1024 && p.entries[0].smem <= 232448, "%s: %d bytes", p.canonical,
			  p.entries[0].smem);
		dg_source *src = NULL;
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
		cr_assert_eq(src->n_entries, 2);
		cr_assert(strstr(src->text, "dg_tmap ma") && strstr(src->text, "dg_tmap me"), "%s: six maps", p.canonical);
		dg__nvrtc_target t;
		dg__nvrtc_result res;
		cr_assert_eq(dg__nvrtc_target_for(90, true, &t, e, sizeof(e)), DG_OK, "%s", e);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s", p.canonical, e);
		cr_assert(res.size > 64 && memcmp(res.image, "\177ELF", 4) == 0, "%s: not an ELF cubin", p.canonical);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	/* f32 activations, or rows of L that no tensor map takes: refused */
	for (int i = 0; i < 2; i++) {
		dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, 2, 64, i ? 100 : 128);
		s.weight = s.act = s.out = DG_FMT_BF16;
		if (!i)
			s.act = DG_FMT_F32;
		s.arch = 90, s.arch_specific = true;
		s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
		dg_plan p;
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC, "%s", p.canonical);
		cr_assert(strstr(dg_codegen_errmsg(cg), "tile=128x128x64/8x1/5"), "%s", dg_codegen_errmsg(cg));
	}
	dg_codegen_destroy(cg);
}

Test(nvrtc_gate, decoder_gate_bwd_refusals)
{
	dg_codegen *cg = nh_codegen();
	char e[512];
	dg_spec s;
	/* a low-bit weight: the op reads a float copy */
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD);
	dg_status st = dg_spec_set(&s, "weight", "int8", e, sizeof(e));
	if (st == DG_OK)
		st = dg_spec_validate(&s, e, sizeof(e));
	cr_assert_neq(st, DG_OK, "weight=int8 accepted");
	cr_assert(strstr(e, "weight"), "%s", e);
	/* a tile neither path runs */
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD);
	s.arch = 80;
	dg_tile t = { .bm = 128, .bn = 128, .bk = 32, .wm = 2, .wn = 2, .stages = 2 };
	s.tile = t;
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_codegen_errmsg(cg), "tile=128x128x32/2x2/2"), "%s", dg_codegen_errmsg(cg));
	/* the default on sm_90a is the warpgroup path, elsewhere fp32 */
	dg_spec_init(&s, DG_OP_DECODER_GATE_BWD);
	s.arch = 90;
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 90, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(p.spec.arch_specific && p.spec.tile.bn == 128 && p.spec.tile.bk == 64, "%s", p.canonical);
	s.arch = 80;
	cr_assert_eq(dg_codegen_plan_for(cg, &s, 80, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert(!p.spec.arch_specific && p.spec.tile.bm == 64 && p.spec.tile.bk == 32, "%s", p.canonical);
	dg_codegen_destroy(cg);
}

/* decoder_gate_bwd_ys's check, without a device: the call of its defaults
 * (int8 codes, a scale a row and a channel, bf16 xs, w, dxs and dys)
 * passes; dxs or dys over any other tensor is refused naming the output
 * and the tensor, as are codes without their scale, a w that is not bf16
 * (whatever the spec's weight), p outside [0, 1), a misaligned step_at and
 * another op's spec. */
Test(nvrtc_gate, decoder_gate_bwd_ys_checks)
{
	enum { B = 2, T = 7, H = 3, E = 32, L = 13 };
	char msg[512];
	dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD_YS, H, E, L);
	cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_tensor grad = dg_tensor_4d("grad", DG_FMT_F32, P(1), B, 1, T, E);
	dg_tensor w = dg_tensor_2d("w", DG_FMT_BF16, P(2), E, (int64_t)H * L);
	dg_tensor xs = dg_tensor_4d("xs", DG_FMT_BF16, P(3), B, H, T, L);
	dg_tensor aq = dg_tensor_4d("aq", DG_FMT_INT8, P(4), B, H, T, E);
	dg_tensor ev = dg_tensor_3d("ev", DG_FMT_INT8, P(5), H, L, E);
	dg_tensor dxs = dg_tensor_4d("dxs", DG_FMT_BF16, P(6), B, H, T, L);
	dg_tensor dys = dg_tensor_4d("dys", DG_FMT_BF16, P(7), B, H, T, L);
	aq.scale = P(8);
	ev.scale = P(9);
	dg_decoder_gate_bwd_ys_args a = { .grad = &grad, .w = &w, .xs = &xs, .aq = &aq, .ev = &ev,
					  .dxs = &dxs, .dys = &dys, .p = 0.1f };
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* an output over each other tensor */
	dg_tensor *ins[] = { &grad, &w, &xs, &aq, &ev };
	static const char *const in_names[] = { "grad", "w", "xs", "aq", "ev" };
	dg_tensor *outs[] = { &dxs, &dys };
	static const char *const out_names[] = { "dxs", "dys" };
	char also[48];
	for (int o = 0; o < 2; o++) {
		const dg_dptr own = outs[o]->data;
		for (int i = 0; i < 5; i++) {
			outs[o]->data = ins[i]->data;
			snprintf(also, sizeof(also), "must not alias %s", in_names[i]);
			nh_expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, out_names[o],
					also);
		}
		/* the two outputs one tensor: dxs is the first checked */
		outs[o]->data = outs[1 - o]->data;
		nh_expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "dxs",
				"must not alias dys");
		outs[o]->data = own;
	}
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* codes without their scale */
	aq.scale = 0;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "aq");
	aq.scale = P(8);
	ev.scale = 0;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "ev");
	ev.scale = P(9);
	/* w is bf16 whatever the spec's weight (ev's int8) */
	w.fmt = DG_FMT_INT8;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "w");
	w.fmt = DG_FMT_F32;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "w");
	w.fmt = DG_FMT_BF16;
	/* xs is src's, aq act's */
	xs.fmt = DG_FMT_F32;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "xs");
	s.src = DG_FMT_F32;
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	aq.fmt = DG_FMT_UINT8POS;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "aq");
	s.act = DG_FMT_UINT8POS;
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	/* the family's rules on the call's values */
	a.p = 1.0f;
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "[0, 1)"), "%s", msg);
	a.p = 0.1f;
	a.step_at = P(10) + 2;
	expect_named(dg_decoder_gate_bwd_ys_check(&s, &a, msg, sizeof(msg)), msg, "step_at");
	a.step_at = 0;
	/* a spec of another op */
	dg_spec other = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, H, E, L);
	cr_assert_eq(dg_decoder_gate_bwd_ys_check(&other, &a, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "decoder_gate_bwd_ys"), "%s", msg);
}
