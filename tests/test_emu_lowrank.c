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

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/fmt.h"
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

/* ---- the few-rows entry (templates/lowrank_rows.lua) ------------------------
 * dg_lowrank_fwd_rows beside the path's kernel: warps over the output
 * columns, lanes of a column over its weight row, x's rows in registers.
 * Shapes cover one lane a chunk and several (E 20, 1280), columns that are
 * not whole groups, x shared by the heads and a head's own, row passes
 * (E 1280 holds 4 rows a pass, B·T 7 takes two; sign1 2 rows a pass, B·T 6
 * three), ternary and sign1 weights decoded to i8x4 words. Integer sums
 * against the reference bit for bit; float sums in another order, by a
 * tolerance. */

struct rcase {
	dg_fmt act, weight, out;
	int B, T, H, hin, N, E;
	float thr; /* < 0: no ReLU */
	bool vec;  /* a scale a token and a channel (codes) */
};

static const char *ctype_of(dg_fmt f)
{
	switch (f) {
	case DG_FMT_F32: return "float";
	case DG_FMT_BF16: return "unsigned short";
	case DG_FMT_INT8: return "signed char";
	case DG_FMT_UINT8POS: return "unsigned char";
	default: return "int";
	}
}

static const char RGLUE[] =
	"extern \"C\" void dg_emu_rows(unsigned grid, unsigned nt, const void *x, const void *w,\n"
	"	const float *sa, const float *sw, void *out, const float *so, float *absum, int B, int T)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, 0, [&] {\n"
	"		dg_lowrank_fwd_rows((const %s *)x, (const %s *)w, sa, sw, (%s *)out, so, absum, B, T);\n"
	"	});\n"
	"}\n";

typedef void (*rows_fn)(unsigned grid, unsigned nt, const void *x, const void *w, const float *sa,
			const float *sw, void *out, const float *so, float *absum, int B, int T);

/* The projection's spec for the emulation's cases: vec, a scale a token
 * and a channel (else one a tensor); thr < 0, no ReLU. */
static dg_spec case_spec(dg_fmt act, dg_fmt weight, dg_fmt out, int H, int hin, int N, int E, float thr, bool vec,
			 dg_tile tile)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.act = act, s.weight = weight, s.out = out;
	s.heads = H, s.in_heads = hin, s.latent = N, s.embd = E;
	s.relu = thr >= 0.0f, s.relu_thr = thr >= 0.0f ? thr : 0.0f;
	s.ascale = vec ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
	s.wscale = vec ? DG_SCALE_CHANNEL : DG_SCALE_TENSOR;
	s.arch = 90, s.arch_specific = true;
	s.tile = tile;
	dg_spec_normalize(&s);
	return s;
}

/* got (no outputs of ob bytes, 16 bytes of 0xee after them) against the
 * reference's run of plan's spec on the same inputs: bit for bit where
 * exact, else within bf16's or f32's rounding. */
static void expect_ref(const dg_plan *plan, const void *x, const void *w, float *sa, float *sw, float so, bool vec,
		       int B, int T, const unsigned char *got, size_t no, size_t ob, bool exact)
{
	unsigned char *want = malloc(no * ob);
	cr_assert_not_null(want);
	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	rc.in[0] = x, rc.in[1] = w;
	if (vec)
		rc.scale_v[0] = sa, rc.scale_v[1] = sw;
	else
		rc.scale[0] = sa[0], rc.scale[1] = sw[0];
	rc.scale[2] = so;
	rc.out = want;
	rc.b = B, rc.t = T;
	cr_assert_eq(dg_ref_run(&plan->spec, &rc), DG_OK);
	char why[512];
	const dg_fmt out = plan->spec.out;
	if (exact)
		cr_assert(dg_ref_same_bytes(got, want, no * ob, why, sizeof(why)), "%s: %s", plan->canonical, why);
	else if (out == DG_FMT_BF16)
		cr_assert(dg_ref_close(out, got, want, no, 1e-3f, 8e-3f, why, sizeof(why)), "%s: %s", plan->canonical,
			  why);
	else
		cr_assert(dg_ref_close(out, got, want, no, 1e-4f, 1e-4f, why, sizeof(why)), "%s: %s", plan->canonical,
			  why);
	for (size_t i = no * ob; i < no * ob + 16; i++)
		cr_assert_eq(got[i], 0xee, "%s: written past the output", plan->canonical);
	free(want);
}

static void check_rows(dg_codegen *cg, dg_rng *r, const struct rcase *c)
{
	dg_spec s = case_spec(c->act, c->weight, c->out, c->H, c->hin, c->N, c->E, c->thr, c->vec, (dg_tile){ 0 });
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const dg_plan_entry *e = &plan.entries[plan.n_entries - 1];
	cr_assert_str_eq(e->name, "dg_lowrank_fwd_rows", "%s: no few-rows entry", plan.canonical);
	const bool codes = c->act != DG_FMT_F32 && c->act != DG_FMT_BF16;
	const bool code_out = c->out == DG_FMT_INT8 || c->out == DG_FMT_UINT8POS;
	char glue[1024];
	const bool packed = c->weight == DG_FMT_TERNARY || c->weight == DG_FMT_SIGN1;
	snprintf(glue, sizeof(glue), RGLUE, codes ? "int" : ctype_of(c->act),
		 packed ? "unsigned" : codes ? "int" : ctype_of(c->weight), ctype_of(c->out));
	rows_fn fn = (rows_fn)eh_build(cg, &s, glue, "dg_emu_rows");

	const int64_t M = (int64_t)c->B * c->T, xrows = (int64_t)c->B * c->hin * c->T;
	const size_t xb = dg_fmt_row_bytes(c->act, (int64_t)c->E) * (size_t)xrows;
	const size_t wb = dg_fmt_row_bytes(c->weight, (int64_t)c->E) * (size_t)c->H * (size_t)c->N;
	const size_t no = (size_t)M * (size_t)c->H * (size_t)c->N, ob = c->out == DG_FMT_F32 ? 4 : c->out == DG_FMT_BF16 ? 2 : 1;
	void *x = malloc(xb + 16), *w = malloc(wb + 16);
	cr_assert(x && w);
	dg_rng_fill(r, c->act, x, (size_t)xrows * (size_t)c->E);
	dg_rng_fill(r, c->weight, w, (size_t)c->H * (size_t)c->N * (size_t)c->E);
	float *sa = rand_scales(r, (size_t)xrows), *sw = rand_scales(r, (size_t)c->H * c->N), so = 0.05f;
	unsigned char *got = malloc(no * ob + 16);
	cr_assert_not_null(got);
	memset(got, 0xee, no * ob + 16);
	float absum = 0.0f;
	fn(3, (unsigned)e->threads, x, w, sa, sw, got, code_out ? &so : NULL, &absum, c->B, c->T);
	expect_ref(&plan, x, w, sa, sw, so, c->vec, c->B, c->T, got, no, ob, codes);
	/* Σ|y| over the outputs (before codes): the float outputs' own sum
	 * (the outputs themselves checked above) */
	if (c->out == DG_FMT_F32) {
		double ref = 0.0;
		for (size_t i = 0; i < no; i++)
			ref += fabs((double)((const float *)got)[i]);
		cr_assert(fabs((double)absum - ref) <= 1e-4 * ref + 1e-4, "%s: absum %g, want %g", plan.canonical,
			  (double)absum, ref);
	}
	free(x), free(w), free(sa), free(sw), free(got);

}

Test(emu_lowrank, rows_entry_against_the_reference, .timeout = 900)
{
	static const struct rcase cases[] = {
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 1, 1, 2, 1, 96, 64, 0.0f, false },
		{ DG_FMT_F32, DG_FMT_BF16, DG_FMT_F32, 2, 3, 2, 2, 40, 48, -1.0f, false },
		{ DG_FMT_BF16, DG_FMT_F32, DG_FMT_F32, 1, 2, 1, 1, 36, 36, 0.1f, false },
		{ DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, 8, 1, 2, 1, 12, 20, -1.0f, false },
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 1, 1, 3, 1, 52, 64, 0.25f, true },
		{ DG_FMT_UINT8POS, DG_FMT_INT8, DG_FMT_UINT8POS, 2, 2, 2, 2, 68, 96, 0.0f, false },
		{ DG_FMT_INT4, DG_FMT_INT8, DG_FMT_INT8, 1, 5, 2, 1, 20, 32, -1.0f, false },
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 1, 7, 1, 1, 24, 1280, -1.0f, true },
		{ DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_BF16, 1, 1, 3, 1, 52, 128, 0.0f, true },
		{ DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_INT8, 1, 1, 4, 4, 64, 256, -1.0f, false },
		{ DG_FMT_UINT8POS, DG_FMT_SIGN1, DG_FMT_F32, 2, 3, 2, 2, 20, 256, 0.25f, false },
	};
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 11);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_rows(cg, &r, &cases[i]);
	dg_codegen_destroy(cg);
}

/* Which specs the plan gives the few-rows entry: float × float and codes ×
 * codes whose weight rows are whole 16-byte chunks (not ternary at E 96) and
 * whose x row fits a lane's registers (not bf16 at E 4096); not relu_mask,
 * not float × codes. */
Test(emu_lowrank, rows_entry_where_it_serves, .timeout = 900)
{
	static const struct {
		const char *text;
		bool rows;
	} cases[] = {
		{ "op=lowrank_fwd;weight=bf16;act=bf16;out=bf16;relu=0;embd=2048;arch=sm_90a", true },
		{ "op=lowrank_fwd;weight=bf16;act=bf16;out=bf16;relu=0;embd=4096;arch=sm_90a", false },
		{ "op=lowrank_fwd;weight=int8;act=int8;out=bf16;relu=0;embd=4096;arch=sm_90a", true },
		{ "op=lowrank_fwd;weight=sign1;act=uint8pos;out=f32;relu=0;embd=256", true },
		{ "op=lowrank_fwd;weight=ternary;act=int8;out=f32;relu=0;embd=96", false },
		{ "op=lowrank_fwd;weight=int8;act=bf16;out=bf16;relu=0", false },
		{ "op=relu_mask;weight=int8;act=int8;relu=0", false },
	};
	dg_codegen *cg = nh_codegen();
	char err[512];
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s;
		cr_assert_eq(dg_spec_parse(cases[i].text, &s, err, sizeof(err)), DG_OK, "%s: %s", cases[i].text, err);
		dg_plan plan;
		cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s: %s", cases[i].text, dg_codegen_errmsg(cg));
		bool has = strcmp(plan.entries[plan.n_entries - 1].name, "dg_lowrank_fwd_rows") == 0;
		cr_assert_eq(has, cases[i].rows, "%s: the few-rows entry %s", cases[i].text,
			     cases[i].rows ? "missing" : "where it does not serve");
	}
	dg_codegen_destroy(cg);
}

/* ---- the warp-specialized form (templates/lowrank_wgmma.lua KERNEL_WSP) ----
 * A TMA producer warpgroup, the consumers' ring of mbarrier-guarded
 * stages of 128-byte K slices with the 128-byte swizzle, the weight rows
 * loaded in dg_bcol's column order by boxes of 2 x 4 rows, the other
 * forms' epilogue: int8 and uint8pos codes × int8 weights (bf16 out with
 * a scale a token and a channel, codes out with tensor scales) bit for
 * bit, bf16 × bf16 within rounding; several tiles a block (a grid of 3
 * blocks), a last m-tile past B·T (its boxes zeros), x shared by the
 * heads and a head's own, one K slice a tile and several, both consumer
 * warpgroups on a tile (BM 128) and each its own tiles (BM 64, ping-pong).
 * The maps are the runtime's (runtime/ops/lowrank.c ws_tmaps). */

struct wcase {
	dg_fmt act, weight, out;
	int B, T, H, hin, N, E;
	dg_tile tile;
	float thr;
	bool vec;
	bool rope; /* epi=rope: qr = RoPE(out) too */
};

static const char WGLUE[] =
	"extern \"C\" void dg_emu_ws(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w,\n"
	"	const float *sa, const float *sw, void *out, const float *so, float *absum, int B, int T,\n"
	"	const void *ma, const void *mb)\n"
	"{\n"
	"	dg_tmap a, b;\n"
	"	memcpy(&a, ma, sizeof(dg_emu_tmap)), memcpy(&b, mb, sizeof(dg_emu_tmap));\n"
	"	dg_emu_launch(grid, nt, smem, [&] {\n"
	"		dg_lowrank_fwd((const %s *)x, (const %s *)w, sa, sw, (%s *)out, so, absum, B, T, a, b);\n"
	"	});\n"
	"}\n";

/* epi=rope: the table and qr before the maps */
static const char WGLUE_ROPE[] =
	"extern \"C\" void dg_emu_ws(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w,\n"
	"	const float *sa, const float *sw, void *out, const float *so, float *absum, int B, int T,\n"
	"	const void *ma, const void *mb, const float *rope, unsigned short *qr)\n"
	"{\n"
	"	dg_tmap a, b;\n"
	"	memcpy(&a, ma, sizeof(dg_emu_tmap)), memcpy(&b, mb, sizeof(dg_emu_tmap));\n"
	"	dg_emu_launch(grid, nt, smem, [&] {\n"
	"		dg_lowrank_fwd((const %s *)x, (const %s *)w, sa, sw, (%s *)out, so, absum, B, T, rope, qr, a, b);\n"
	"	});\n"
	"}\n";

typedef void (*ws_rope_fn)(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w, const float *sa,
			   const float *sw, void *out, const float *so, float *absum, int B, int T, const eh_tmap *ma,
			   const eh_tmap *mb, const float *rope, uint16_t *qr);

typedef void (*ws_fn)(unsigned grid, unsigned nt, size_t smem, const void *x, const void *w, const float *sa,
		      const float *sw, void *out, const float *so, float *absum, int B, int T, const eh_tmap *ma,
		      const eh_tmap *mb);

static void check_ws(dg_codegen *cg, dg_rng *r, const struct wcase *c)
{
	dg_spec s = case_spec(c->act, c->weight, c->out, c->H, c->hin, c->N, c->E, c->thr, c->vec, c->tile);
	if (c->rope) {
		s.epi = DG_EPI_ROPE;
		dg_spec_normalize(&s);
	}
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const bool bf = c->act == DG_FMT_BF16;
	cr_assert_str_eq(plan.path, bf ? "wgmma bf16 tma" : "wgmma tma", "%s", plan.canonical);
	cr_assert_eq(plan.entries[0].threads, 384, "%s: two consumer warpgroups and the producer", plan.canonical);
	const bool code_out = c->out == DG_FMT_INT8 || c->out == DG_FMT_UINT8POS;
	char glue[1024];
	snprintf(glue, sizeof(glue), c->rope ? WGLUE_ROPE : WGLUE, bf ? "unsigned short" : "int",
		 bf ? "unsigned short" : "int", ctype_of(c->out));
	void *built = eh_build(cg, &s, glue, "dg_emu_ws");

	const int es = bf ? 2 : 1;
	const int64_t M = (int64_t)c->B * c->T, xrows = (int64_t)c->B * c->hin * c->T;
	const size_t xb = (size_t)es * (size_t)c->E * (size_t)xrows, wb = (size_t)es * (size_t)c->E * c->H * c->N;
	const size_t no = (size_t)M * (size_t)c->H * (size_t)c->N, ob = c->out == DG_FMT_BF16 ? 2 : 1;
	void *x = malloc(xb + 16), *w = malloc(wb + 16);
	cr_assert(x && w);
	dg_rng_fill(r, c->act, x, (size_t)xrows * (size_t)c->E);
	dg_rng_fill(r, c->weight, w, (size_t)c->H * (size_t)c->N * (size_t)c->E);
	float *sa = rand_scales(r, (size_t)xrows), *sw = rand_scales(r, (size_t)c->H * c->N), so = 0.05f;
	unsigned char *got = malloc(no * ob + 16);
	cr_assert_not_null(got);
	memset(got, 0xee, no * ob + 16);
	/* the runtime's maps */
	const unsigned ke = 128u / (unsigned)es;
	const eh_tmap ma = eh_tmap3(x, es, (uint64_t)c->E, (uint64_t)c->T, (uint64_t)c->B * c->hin, ke, 64);
	eh_tmap mb = eh_tmap3(w, es, (uint64_t)c->E, 2, 4, ke, 2);
	const uint64_t row = (uint64_t)es * (uint64_t)c->E;
	mb.dims[3] = 8, mb.dims[4] = (uint64_t)c->H * c->N / 64;
	mb.strides[0] = row, mb.strides[1] = 16 * row, mb.strides[2] = 2 * row, mb.strides[3] = 64 * row;
	mb.box[2] = 4, mb.box[3] = 8;
	float absum = 0.0f;
	if (!c->rope) {
		((ws_fn)built)(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, x, w, sa, sw, got,
			       code_out ? &so : NULL, &absum, c->B, c->T, &ma, &mb);
		expect_ref(&plan, x, w, sa, sw, so, c->vec, c->B, c->T, got, no, ob, !bf);
		free(x), free(w), free(sa), free(sw), free(got);
		return;
	}
	/* epi=rope: out as the plain form's (the reference, the same
	 * spec with epi=store), and qr rope_fwd's of that out bit for bit */
	float *table = malloc((size_t)c->T * (size_t)c->N * sizeof(float));
	uint16_t *qr = malloc(no * 2 + 16), *want = malloc(no * 2);
	cr_assert(table && qr && want);
	dg_ref_rope_pairs(c->T, c->N, table);
	memset(qr, 0xee, no * 2 + 16);
	((ws_rope_fn)built)(3, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, x, w, sa, sw, got,
			    code_out ? &so : NULL, &absum, c->B, c->T, &ma, &mb, table, qr);
	dg_plan store = plan;
	store.spec.epi = DG_EPI_STORE;
	expect_ref(&store, x, w, sa, sw, so, c->vec, c->B, c->T, got, no, ob, !bf);
	dg_spec rs;
	dg_spec_init(&rs, DG_OP_ROPE_FWD);
	rs.act = DG_FMT_BF16, rs.heads = c->H, rs.latent = c->N;
	dg_spec_normalize(&rs);
	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	rc.in[0] = got, rc.in[1] = table;
	rc.out = want;
	rc.b = c->B, rc.t = c->T;
	cr_assert_eq(dg_ref_run(&rs, &rc), DG_OK);
	char why[512];
	cr_assert(dg_ref_same_bytes(qr, want, no * 2, why, sizeof(why)), "%s: qr: %s", plan.canonical, why);
	for (size_t i = no * 2; i < no * 2 + 16; i++)
		cr_assert_eq(((unsigned char *)qr)[i], 0xee, "%s: written past qr", plan.canonical);
	/* the reference's own epi=rope (out then rope_fwd of it) on exact paths */
	if (!bf) {
		memset(&rc, 0, sizeof(rc));
		rc.in[0] = x, rc.in[1] = w, rc.in[3] = table;
		if (c->vec)
			rc.scale_v[0] = sa, rc.scale_v[1] = sw;
		else
			rc.scale[0] = sa[0], rc.scale[1] = sw[0];
		rc.out = want;
		rc.b = c->B, rc.t = c->T;
		cr_assert_eq(dg_ref_run(&plan.spec, &rc), DG_OK);
		cr_assert(dg_ref_same_bytes(qr, want, no * 2, why, sizeof(why)), "%s: qr against dg_ref_run: %s",
			  plan.canonical, why);
	}
	free(x), free(w), free(sa), free(sw), free(got), free(table), free(qr), free(want);
}

Test(emu_lowrank, warp_specialized_against_the_reference, .timeout = 900)
{
	static const struct wcase cases[] = {
		/* 2 x 2 tiles of 128 x 64 for 3 blocks, 2 K slices a tile */
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 2, 64, 2, 1, 128, 256, { 128, 64, 128, 8, 1, 5, 0 }, 0.0f, true, false },
		/* three m-tiles of 64, a head's own x, 3 slices, codes out */
		{ DG_FMT_UINT8POS, DG_FMT_INT8, DG_FMT_UINT8POS, 1, 192, 2, 2, 64, 384, { 64, 64, 128, 4, 1, 6, 0 },
		  0.0f, false, false },
		/* bf16: 64-element slices, the ReLU at 0.25 */
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 1, 128, 2, 1, 128, 128, { 128, 128, 64, 8, 1, 5, 0 }, 0.25f,
		  false, false },
		/* ping-pong (BM 64): 16 tiles over 3 blocks, a warpgroup 2 or 3 of them */
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 2, 128, 2, 1, 256, 256, { 64, 128, 128, 4, 1, 8, 0 }, 0.0f,
		  true, false },
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 1, 256, 1, 1, 128, 192, { 64, 128, 64, 4, 1, 5, 0 }, 0.0f,
		  false, false },
		/* ping-pong bf16 with more slices a tile than stages (E 1280: 20 of 8),
		 * two tiles a block for the first */
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 1, 128, 1, 1, 256, 1280, { 64, 128, 64, 4, 1, 8, 0 }, 0.0f,
		  false, false },
		/* a head's own x with scales a token and a channel (the encoder_v's):
		 * the loader warp's act-scale rows (b·Hin + h)·T + t */
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 2, 64, 2, 2, 128, 256, { 128, 128, 128, 8, 1, 6, 0 }, 0.0f,
		  true, false },
		/* the last m-tile half past B·T (zeros from the map), one slice a tile */
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_INT8, 3, 64, 1, 1, 128, 128, { 128, 64, 128, 8, 1, 8, 0 }, 0.0f,
		  false, false },
		/* epi=rope: the model's encoder (x shared by the heads, scales a
		 * token and a channel, 128x128 of 6 stages), T not a multiple of
		 * the tile (rows past B·T), and bf16 operands with a threshold */
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 2, 64, 2, 1, 256, 256, { 128, 128, 128, 8, 1, 6, 0 }, 0.0f,
		  true, true },
		{ DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 3, 64, 2, 2, 128, 128, { 128, 128, 128, 8, 1, 6, 0 }, 0.0f,
		  true, true },
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 1, 128, 2, 1, 128, 128, { 128, 128, 64, 8, 1, 5, 0 }, 0.25f,
		  false, true },
	};
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 13);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_ws(cg, &r, &cases[i]);
	dg_codegen_destroy(cg);
}
