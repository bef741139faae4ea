/*
 * GPU tests of the forward GEMM ops (runtime/ops/lowrank.c, decoder.c;
 * templates lowrank*.lua, mma.lua, wgmma.lua, decoder.lua) against the CPU
 * references:
 *
 *   lowrank_fwd  every weight × act × relu {none, 0, 0.25} × out × in_heads
 *                {1, H} on small odd shapes (B 2, T 1/3/127, L 200, E 96 or
 *                64), default tiles (tensor cores for integer × integer) and
 *                a dp4a tile; then the BDH shape (H 4, E 256, L 8192,
 *                B·T 4096) with the reference on sampled rows;
 *   relu_mask    the same formats, grad and grad_out separate and aliased;
 *   bf16 × bf16  the sm_90a warpgroup path (sm_90 devices): every out ×
 *                relu × in_heads on small odd shapes, the other warpgroup
 *                tiles, runs of 1 to 5 n-tiles a block, the BDH shape
 *                (and a ragged one: L 8112, B·T 4000) on sampled rows;
 *                a shape the path refuses runs fp32;
 *   codes        the sm_90a warpgroup path of integer codes (int8, ternary,
 *                sign1 weights): every warpgroup tile, runs of 1 to 5
 *                n-tiles a block, the BDH shape, bit for bit;
 *   decoder_fwd  every weight × act × out, heads 1 and 3, SIMT and tensor-
 *                core tiles, in a workspace the op sizes (_workspace); the
 *                BDH shape (sampled rows); a missing or short workspace is
 *                refused by name and launches nothing.
 *
 * Integer paths compare bit for bit (codes, and f32 / bf16 outputs too: the
 * int32 sums are exact and the epilogue rounds like the reference); float
 * paths within atol + rtol·|ref|. Outputs are filled with 0xff first, so an
 * element the kernel never writes cannot pass. Tests skip without a GPU.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"

/* Compares n outputs of format f: bytes when exact, else within a
 * tolerance (codes within 1: a float sum may round across a code edge).
 * An unwritten f32 / bf16 element is NaN (0xff bytes) and fails. */
static void compare_out(const char *what, dg_fmt f, const void *got, const void *want, size_t n,
			bool exact)
{
	char why[512];

	if (exact) {
		gh_expect_bytes(what, got, want, gh_bytes(f, n));
		return;
	}
	float atol = dg_fmt_is_code(f) ? 1.0f : 2e-3f, rtol = f == DG_FMT_BF16 ? 1e-2f : 2e-3f;
	cr_assert(dg_ref_close(f, got, want, n, atol, rtol, why, sizeof(why)), "%s: %s", what, why);
}

/* ---- lowrank_fwd / relu_mask: one spec, small shapes ---------------------- */

struct lr_shape {
	int H, Hin, E, L, B, T;
};

/* Runs lowrank_fwd (or relu_mask) for spec on random data of shape sh and
 * compares with the reference. */
static void run_lowrank(dg_device *dev, const dg_spec *spec0, int B, int T)
{
	dg_spec spec = *spec0;
	const bool mask = spec.op == DG_OP_RELU_MASK;
	const int H = spec.heads, Hin = spec.in_heads, E = spec.embd, L = spec.latent;
	size_t nx = (size_t)B * Hin * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
	size_t xb, wb;
	void *xh = gh_rand_storage(spec.act, nx, &xb);
	void *wh = gh_rand_storage(spec.weight, nw, &wb);
	float sa = gh_uniform(0.001f, 0.01f), sw = gh_uniform(0.01f, 0.1f);
	char what[DG_SPEC_TEXT_MAX + 64];
	char canon[DG_SPEC_TEXT_MAX];

	dg_spec_to_string(&spec, canon, sizeof(canon));
	snprintf(what, sizeof(what), "%s B=%d T=%d", canon, B, T);

	/* The reference y (f32, with the spec's relu) sets a scale `so` that
	 * spans the code range with some clamping at the top. */
	dg_spec fs = spec;
	fs.op = DG_OP_LOWRANK_FWD;
	fs.out = DG_FMT_F32;
	if (mask)
		fs.relu = false;
	float *yref = gh_xmalloc(no * 4);
	dg_ref_lowrank_args ra = { .x = xh, .w = wh, .sa = sa, .sw = sw, .out = yref,
				   .batch = B, .time = T };
	cr_assert_eq(dg_ref_lowrank_fwd(&fs, &ra), DG_OK);
	float ymax = 0.0f;
	for (size_t i = 0; i < no; i++)
		ymax = fmaxf(ymax, fabsf(yref[i]));
	float so = ymax > 0 ? ymax / 100.0f : 1.0f;

	dg_dptr xd = gh_upload(dev, xh, xb), wd = gh_upload(dev, wh, wb);
	dg_tensor x = dg_tensor_4d("x", spec.act, xd, B, Hin, T, E);
	dg_tensor w = dg_tensor_3d("w", spec.weight, wd, H, L, E);
	if (dg_fmt_is_code(spec.act))
		x.scale = gh_scalar(dev, sa);
	if (dg_fmt_is_code(spec.weight))
		w.scale = gh_scalar(dev, sw);
	bool exact = dg_fmt_is_code(spec.act) && dg_fmt_is_code(spec.weight);

	if (!mask) {
		size_t ob = gh_bytes(spec.out, no);
		dg_dptr od = gh_alloc_ff(dev, ob);
		dg_tensor out = dg_tensor_4d("out", spec.out, od, B, H, T, L);
		if (dg_fmt_is_code(spec.out))
			out.scale = gh_scalar(dev, so);
		dg_dptr absum = gh_scalar(dev, 0.0f);
		dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out, .out_absum = absum };
		/* epi=rope: the table and qr (B,H,T,L) bf16, 16 bytes of 0xff past it */
		const bool rope = spec.epi == DG_EPI_ROPE;
		float *table = rope ? gh_xmalloc((size_t)T * L * 4) : NULL;
		dg_tensor tt, qt;
		if (rope) {
			dg_ref_rope_pairs(T, L, table);
			tt = dg_tensor_2d("rope", DG_FMT_F32, gh_upload(dev, table, (size_t)T * L * 4), T, L);
			qt = dg_tensor_4d("qr", DG_FMT_BF16, gh_alloc_ff(dev, no * 2 + 16), B, H, T, L);
			a.rope = &tt;
			a.qr = &qt;
		}
		cr_assert_eq(dg_lowrank_fwd(dev, &spec, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		void *got = gh_xmalloc(ob), *want = gh_xmalloc(ob);
		gh_download(dev, got, od, ob);
		if (rope) { /* qr: rope_fwd's of the out it wrote, bit for bit */
			unsigned char *gq = gh_xmalloc(no * 2 + 16);
			uint16_t *wq = gh_xmalloc(no * 2);
			gh_download(dev, gq, qt.data, no * 2 + 16);
			dg_spec rs;
			dg_spec_init(&rs, DG_OP_ROPE_FWD);
			rs.act = DG_FMT_BF16, rs.heads = H, rs.latent = L;
			cr_assert_eq(dg_ref_rope_op(&rs, got, table, wq, B, T), DG_OK);
			gh_expect_bytes(what, gq, wq, no * 2);
			for (size_t i = no * 2; i < no * 2 + 16; i++)
				cr_assert_eq(gq[i], 0xff, "%s: written past qr", what);
			free(gq);
			free(wq);
			free(table);
		}
		double want_absum = 0;
		ra.out = want;
		ra.so = so;
		ra.out_absum = &want_absum;
		cr_assert_eq(dg_ref_lowrank_fwd(&spec, &ra), DG_OK);
		compare_out(what, spec.out, got, want, no, exact);
		float got_absum = gh_read_scalar(dev, absum);
		cr_assert(fabs((double)got_absum - want_absum) <= 1e-3 * want_absum + 1e-3,
			  "%s: out_absum %.9g, want %.9g", what, (double)got_absum, want_absum);
		free(got);
		free(want);
	} else {
		float *g = gh_xmalloc(no * 4), *want = gh_xmalloc(no * 4), *got = gh_xmalloc(no * 4);
		for (size_t i = 0; i < no; i++)
			g[i] = gh_uniform(-1.0f, 1.0f);
		cr_assert_eq(dg_ref_relu_mask(&spec, xh, wh, sa, sw, g, want, B, T), DG_OK);
		dg_dptr gd = gh_upload(dev, g, no * 4), god = gh_alloc_ff(dev, no * 4);
		dg_tensor gt = dg_tensor_4d("grad", DG_FMT_F32, gd, B, H, T, L);
		dg_tensor got_t = dg_tensor_4d("grad_out", DG_FMT_F32, god, B, H, T, L);
		dg_relu_mask_args a = { .x = &x, .w = &w, .grad = &gt, .grad_out = &got_t };
		cr_assert_eq(dg_relu_mask(dev, &spec, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, got, god, no * 4);
		if (exact) {
			gh_expect_bytes(what, got, want, no * 4);
		} else {
			/* float sums: the mask may differ where y is within rounding
			 * of thr; count those, allow a few */
			size_t off = 0;
			for (size_t i = 0; i < no; i++)
				if (memcmp(&got[i], &want[i], 4) != 0) {
					cr_assert(got[i] == 0.0f || got[i] == g[i], "%s[%zu]: %g not grad or 0",
						  what, i, (double)got[i]);
					off++;
				}
			cr_assert_leq(off, no / 1000 + 2, "%s: %zu mask differences", what, off);
		}
		/* aliased: grad_out = grad, in place */
		got_t.data = gd;
		cr_assert_eq(dg_relu_mask(dev, &spec, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		float *inplace = gh_xmalloc(no * 4);
		gh_download(dev, inplace, gd, no * 4);
		gh_expect_bytes("relu_mask in place", inplace, got, no * 4);
		free(inplace);
		free(g);
		free(want);
		free(got);
	}
	free(yref);
	free(xh);
	free(wh);
}

static const dg_fmt W_FMTS[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt A_FMTS[5] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
static const dg_fmt O_FMTS[4] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8, DG_FMT_UINT8POS };

/* Every act × relu × out × in_heads for one weight format. */
static void lowrank_weight(dg_fmt weight, dg_op op)
{
	dg_device *dev = gh_open();
	const int Ts[3] = { 1, 3, 127 };

	gh_seed(1000 + (uint64_t)weight * 10 + (uint64_t)op);
	for (int ai = 0; ai < 5; ai++)
		for (int r = 0; r < 3; r++)
			for (int oi = 0; oi < (op == DG_OP_RELU_MASK ? 1 : 4); oi++)
				for (int hin = 0; hin < 2; hin++) {
					dg_spec s;
					dg_spec_init(&s, op);
					s.heads = 3;
					s.in_heads = hin ? 3 : 1;
					s.embd = (ai + r) % 2 ? 64 : 96;
					s.latent = 200;
					s.weight = weight;
					s.act = A_FMTS[ai];
					s.out = O_FMTS[oi];
					s.relu = r > 0;
					s.relu_thr = r == 2 ? 0.25f : 0.0f;
					if (op == DG_OP_RELU_MASK && !s.relu)
						continue;
					if (dg_spec_validate(&s, NULL, 0) != DG_OK)
						continue; /* uint8pos without relu */
					for (int ti = 0; ti < 3; ti++)
						run_lowrank(dev, &s, 2, Ts[ti]);
				}
	gh_close(dev);
}

Test(gpu_lowrank, weight_f32) { lowrank_weight(DG_FMT_F32, DG_OP_LOWRANK_FWD); }
Test(gpu_lowrank, weight_bf16) { lowrank_weight(DG_FMT_BF16, DG_OP_LOWRANK_FWD); }
Test(gpu_lowrank, weight_int8) { lowrank_weight(DG_FMT_INT8, DG_OP_LOWRANK_FWD); }
Test(gpu_lowrank, weight_ternary) { lowrank_weight(DG_FMT_TERNARY, DG_OP_LOWRANK_FWD); }
Test(gpu_lowrank, weight_sign1) { lowrank_weight(DG_FMT_SIGN1, DG_OP_LOWRANK_FWD); }

Test(gpu_relu_mask, every_format)
{
	for (int wi = 0; wi < 5; wi++)
		lowrank_weight(W_FMTS[wi], DG_OP_RELU_MASK);
}

/* Explicit tiles: the dp4a path (tiles the tensor cores cannot take), a
 * single-stage tile, a BK = 128 tensor-core tile, a 32-wide K step. */
Test(gpu_lowrank, explicit_tiles)
{
	static const char *texts[] = {
		"op=lowrank_fwd;heads=3;embd=64;latent=200;weight=int8;act=int8;out=int8;tile=64x64x16/2x2/2",
		"op=lowrank_fwd;heads=3;embd=64;latent=200;weight=ternary;act=uint8pos;relu=0;out=uint8pos;tile=32x32x16/4x2/1",
		"op=lowrank_fwd;heads=2;embd=256;latent=200;weight=sign1;act=int8;relu=0.25;out=f32;tile=64x128x128/2x2/3",
		"op=lowrank_fwd;heads=2;in_heads=2;embd=96;latent=200;weight=int8;act=int4;out=bf16;tile=64x64x32/2x2/1",
		"op=lowrank_fwd;heads=2;embd=48;latent=200;weight=int8;act=int8;out=int8",
		"op=relu_mask;heads=2;embd=64;latent=200;weight=int8;act=int8;relu=0;tile=64x64x16/2x2/2",
	};
	dg_device *dev = gh_open();
	gh_seed(77);
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		dg_spec s;
		char m[256];
		cr_assert_eq(dg_spec_parse(texts[i], &s, m, sizeof(m)), DG_OK, "%s", m);
		run_lowrank(dev, &s, 2, 127);
		run_lowrank(dev, &s, 3, 1);
	}
	gh_close(dev);
}

/* ---- BDH shape: full GPU run, reference on sampled rows ------------------ */

#define BDH_B 2
#define BDH_T 2048
#define SAMPLE_ROWS 8

/* wg: the sm_90a warpgroup path (dev an sm_90), else the default tile's. */
static void lowrank_bdh_on(dg_device *dev, dg_fmt weight, dg_fmt act, dg_op op, bool wg)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.weight = weight;
	s.act = act;
	s.relu = true;
	s.relu_thr = 0.0f;
	s.out = act == DG_FMT_UINT8POS ? DG_FMT_UINT8POS : DG_FMT_INT8;
	if (wg) {
		/* int8 weights: the warp-specialized form (the auto tile where
		 * it fits); the packed ones: the resident kernel */
		s.arch = 90;
		s.arch_specific = true;
		gh_expect_path(&s, weight == DG_FMT_INT8 && op == DG_OP_LOWRANK_FWD ? "wgmma tma" : "wgmma");
	}
	cr_assert_eq(dg_spec_validate(&s, NULL, 0), DG_OK);
	const int H = s.heads, E = s.embd, L = s.latent, B = BDH_B, T = BDH_T;
	size_t nx = (size_t)B * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
	size_t xb, wb;
	gh_seed(4242 + (uint64_t)weight);
	void *xh = gh_rand_storage(act, nx, &xb), *wh = gh_rand_storage(weight, nw, &wb);
	float sa = 0.01f, sw = 0.02f, so = 0.5f;
	dg_dptr xd = gh_upload(dev, xh, xb), wd = gh_upload(dev, wh, wb);
	dg_tensor x = dg_tensor_4d("x", act, xd, B, 1, T, E);
	dg_tensor w = dg_tensor_3d("w", weight, wd, H, L, E);
	x.scale = gh_scalar(dev, sa);
	w.scale = gh_scalar(dev, sw);
	float *g = NULL;
	dg_dptr od, gd = 0;
	size_t ob = op == DG_OP_RELU_MASK ? no * 4 : no;
	od = gh_alloc_ff(dev, ob);
	if (op == DG_OP_RELU_MASK) {
		g = gh_xmalloc(no * 4);
		for (size_t i = 0; i < no; i++)
			g[i] = (float)(i % 1000) + 1.0f;
		gd = gh_upload(dev, g, no * 4);
		dg_tensor gt = dg_tensor_4d("grad", DG_FMT_F32, gd, B, H, T, L);
		dg_tensor got = dg_tensor_4d("grad_out", DG_FMT_F32, od, B, H, T, L);
		dg_relu_mask_args a = { .x = &x, .w = &w, .grad = &gt, .grad_out = &got };
		cr_assert_eq(dg_relu_mask(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	} else {
		/* so: a typical |y| at these scales lands mid-range */
		dg_tensor out = dg_tensor_4d("out", s.out, od, B, H, T, L);
		out.scale = gh_scalar(dev, so);
		dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out };
		cr_assert_eq(dg_lowrank_fwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	}
	unsigned char *got = gh_xmalloc(ob);
	gh_download(dev, got, od, ob);

	/* Sampled rows: (b, t0..t0+SAMPLE_ROWS) at the start, middle, end. */
	const int starts[3][2] = { { 0, 0 }, { 1, T / 2 - 3 }, { 1, T - SAMPLE_ROWS } };
	size_t eb = op == DG_OP_RELU_MASK ? 4 : 1;
	size_t slice = (size_t)H * SAMPLE_ROWS * L;
	unsigned char *want = gh_xmalloc(slice * eb);
	float *gs = gh_xmalloc(slice * 4);
	for (int si = 0; si < 3; si++) {
		int b = starts[si][0], t0 = starts[si][1];
		const unsigned char *xs = (const unsigned char *)xh + ((size_t)b * T + t0) * E;
		if (op == DG_OP_RELU_MASK) {
			for (int h = 0; h < H; h++)
				memcpy(gs + (size_t)h * SAMPLE_ROWS * L,
				       g + (((size_t)b * H + h) * T + t0) * L, (size_t)SAMPLE_ROWS * L * 4);
			cr_assert_eq(dg_ref_relu_mask(&s, xs, wh, sa, sw, gs, (float *)want, 1, SAMPLE_ROWS),
				     DG_OK);
		} else {
			dg_ref_lowrank_args ra = { .x = xs, .w = wh, .sa = sa, .sw = sw, .so = so,
						   .out = want, .batch = 1, .time = SAMPLE_ROWS };
			cr_assert_eq(dg_ref_lowrank_fwd(&s, &ra), DG_OK);
		}
		for (int h = 0; h < H; h++)
			gh_expect_bytes("BDH rows", got + (((size_t)b * H + h) * T + t0) * L * eb,
					want + (size_t)h * SAMPLE_ROWS * L * eb, (size_t)SAMPLE_ROWS * L * eb);
	}
	/* every element written: no 0xff f32 pattern (NaN) / count of 0xff codes
	 * is plausible only for clamped uint8pos; check f32 for NaN */
	if (op == DG_OP_RELU_MASK)
		for (size_t i = 0; i < no; i++)
			cr_assert(!isnan(((float *)got)[i]), "grad_out[%zu] never written", i);
	free(got);
	free(want);
	free(gs);
	free(g);
	free(xh);
	free(wh);
	gh_close(dev);
}

static void lowrank_bdh(dg_fmt weight, dg_fmt act, dg_op op)
{
	lowrank_bdh_on(gh_open(), weight, act, op, false);
}

Test(gpu_bdh, lowrank_int8_int8) { lowrank_bdh(DG_FMT_INT8, DG_FMT_INT8, DG_OP_LOWRANK_FWD); }
Test(gpu_bdh, lowrank_ternary_int8) { lowrank_bdh(DG_FMT_TERNARY, DG_FMT_INT8, DG_OP_LOWRANK_FWD); }
Test(gpu_bdh, lowrank_sign1_uint8pos) { lowrank_bdh(DG_FMT_SIGN1, DG_FMT_UINT8POS, DG_OP_LOWRANK_FWD); }
Test(gpu_bdh, lowrank_ternary_uint8pos) { lowrank_bdh(DG_FMT_TERNARY, DG_FMT_UINT8POS, DG_OP_LOWRANK_FWD); }
Test(gpu_bdh, relu_mask_ternary_int8) { lowrank_bdh(DG_FMT_TERNARY, DG_FMT_INT8, DG_OP_RELU_MASK); }

/* ---- bf16 × bf16 on the sm_90a warpgroup path ----------------------------
 * templates/lowrank_wgmma.lua with bf16 operands (plan path "wgmma bf16"),
 * against the reference within the float tolerance (compare_out). Skips
 * unless the device is an sm_90 (the path is sm_90a's). */

/* lowrank_fwd with weight × act at H heads of latent L, in_heads Hin, embd
 * E; out bf16, relu at 0, on the sm_90a path. */
static dg_spec codes_spec(dg_fmt weight, dg_fmt act, int H, int Hin, int E, int L)
{
	dg_spec s = dg_test_spec_sized(DG_OP_LOWRANK_FWD, H, E, L);
	s.in_heads = Hin;
	s.weight = weight;
	s.act = act;
	s.out = DG_FMT_BF16;
	s.relu = true;
	s.relu_thr = 0.0f;
	s.arch = 90;
	s.arch_specific = true;
	return s;
}

static dg_spec bf16_spec(int H, int Hin, int E, int L)
{
	return codes_spec(DG_FMT_BF16, DG_FMT_BF16, H, Hin, E, L);
}

/* run_lowrank of s at B·T 2×127 (a ragged last m-tile), 3×1 and 1×300:
 * what each warpgroup tile runs. */
static void run_tile_shapes(dg_device *dev, const dg_spec *s)
{
	run_lowrank(dev, s, 2, 127);
	run_lowrank(dev, s, 3, 1);
	run_lowrank(dev, s, 1, 300);
}

/* The warpgroup tiles: the default (128x64), one warpgroup, four, n128. */
static const dg_tile WG_TILES[] = {
	{ 128, 64, 64, 8, 1, 2, 0 },
	{ 64, 64, 64, 4, 1, 2, 0 },
	{ 256, 64, 64, 16, 1, 2, 0 },
	{ 128, 128, 64, 8, 1, 2, 0 },
	{ 64, 128, 64, 4, 1, 2, 0 },
};
#define N_WG_TILES (sizeof(WG_TILES) / sizeof(WG_TILES[0]))

/* The pipeline over a block's run of n-tiles at E 256, H 4, in_heads {1, 4},
 * L 128, 256, 384 and 640 (1, 2, 3 and 5 n-tiles a block: the prologue
 * alone, an even and odd count, the buffers' rotation; see the tests for
 * the B·T each needs), for each of the n weight × act pairs w[i] × a[i]
 * (out bf16, or out_hin at in_heads 4) on the plan path `path`, B·T
 * B × 1024; the reference on every output. */
static void pipeline_depths(uint64_t seed, const dg_fmt *w, const dg_fmt *a, int n, dg_fmt out_hin,
			    const char *path, int B)
{
	static const int Ls[] = { 128, 256, 384, 640 };
	dg_device *dev = gh_open_sm90();

	gh_seed(seed);
	for (size_t i = 0; i < sizeof(Ls) / sizeof(Ls[0]); i++)
		for (int f = 0; f < n; f++)
			for (int hin = 0; hin < 2; hin++) {
				dg_spec s = codes_spec(w[f], a[f], 4, hin ? 4 : 1, 256, Ls[i]);
				s.out = hin ? out_hin : DG_FMT_BF16;
				/* the resident kernel's tile (the auto tile of int8
				 * and bf16 weights is the warp-specialized form here:
				 * gpu_lowrank_ws, gpu_bdh/lowrank_bf16_bf16) */
				if (w[f] == DG_FMT_INT8 || w[f] == DG_FMT_BF16)
					s.tile = (dg_tile){ 128, 64, 64, 8, 1, 2, 0 };
				gh_expect_path(&s, path);
				run_lowrank(dev, &s, B, 1024);
			}
	gh_close(dev);
}

/* Every out × relu {none, 0, 0.25} × in_heads {1, H} at the auto tile on
 * small odd shapes: E 96 (12 K steps) and 64, L 208 (a last n-tile of 16
 * columns), B 2 and T 1, 3, 127 (rows past the last m-tile, most blocks
 * with one or no tile); E = L = 16; and L 200, which the path refuses: the
 * auto tile is fp32's there. */
Test(gpu_lowrank_bf16, small_shapes)
{
	dg_device *dev = gh_open_sm90();
	const int Ts[3] = { 1, 3, 127 };

	gh_seed(9090);
	for (int e = 0; e < 2; e++)
		for (int r = 0; r < 3; r++)
			for (int oi = 0; oi < 4; oi++)
				for (int hin = 0; hin < 2; hin++) {
					dg_spec s = bf16_spec(3, hin ? 3 : 1, e ? 64 : 96, 208);
					s.out = O_FMTS[oi];
					s.relu = r > 0;
					s.relu_thr = r == 2 ? 0.25f : 0.0f;
					if (dg_spec_validate(&s, NULL, 0) != DG_OK)
						continue; /* uint8pos without relu */
					gh_expect_path(&s, "wgmma bf16");
					for (int ti = 0; ti < 3; ti++)
						run_lowrank(dev, &s, 2, Ts[ti]);
				}
	dg_spec t = bf16_spec(2, 1, 16, 16);
	gh_expect_path(&t, "wgmma bf16");
	run_lowrank(dev, &t, 2, 127);
	run_lowrank(dev, &t, 1, 1);
	dg_spec f = bf16_spec(3, 3, 96, 200);
	gh_expect_path(&f, "fp32");
	run_lowrank(dev, &f, 2, 127);
	gh_close(dev);
}

/* The warpgroup tiles other than the default: one warpgroup, four, n128. */
Test(gpu_lowrank_bf16, tiles)
{
	dg_device *dev = gh_open_sm90();

	gh_seed(9191);
	for (size_t i = 1; i < N_WG_TILES; i++)
		for (int hin = 0; hin < 2; hin++) {
			dg_spec s = bf16_spec(2, hin ? 2 : 1, 64, 208);
			s.tile = WG_TILES[i];
			s.out = hin ? DG_FMT_F32 : DG_FMT_BF16;
			gh_expect_path(&s, "wgmma bf16");
			run_tile_shapes(dev, &s);
		}
	gh_close(dev);
}

/* The pipeline over a block's run of n-tiles: at E 256 (one block an SM)
 * and B·T 2048, H 4, each block gets about L/64/2 n-tiles in a row, so
 * L 128, 256, 384, 640 run 1, 2, 3 and 5 tiles a block. */
Test(gpu_lowrank_bf16, pipeline_depths)
{
	static const dg_fmt bf16[1] = { DG_FMT_BF16 };
	pipeline_depths(9292, bf16, bf16, 1, DG_FMT_BF16, "wgmma bf16", 2);
}

/* The BDH shape (H 4, E 256, B·T 4096; L 8192: the auto tile is the
 * warp-specialized form, 128x128x64/8x1/6, or L 8112: the resident one,
 * 127 n-tiles of 64 a block, the last one 48 columns wide, with B·T 4000:
 * a last m-tile of 32 rows) on the full GPU run, the reference on sampled
 * rows (the start, middle and end), within the float tolerance; every
 * output written (0xffff, the fill, is a NaN). */
static void bdh_bf16(int Hin, int L, int B, int T)
{
	dg_device *dev = gh_open_sm90();
	dg_spec s = bf16_spec(4, Hin, 256, L);
	gh_expect_path(&s, L % 128 == 0 ? "wgmma bf16 tma" : "wgmma bf16");
	const int H = s.heads, E = s.embd;
	size_t nx = (size_t)B * Hin * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
	size_t xb, wb;
	gh_seed(5151 + (uint64_t)Hin * 7 + (uint64_t)L);
	uint16_t *xh = gh_rand_storage(DG_FMT_BF16, nx, &xb), *wh = gh_rand_storage(DG_FMT_BF16, nw, &wb);
	dg_dptr xd = gh_upload(dev, xh, xb), wd = gh_upload(dev, wh, wb);
	dg_tensor x = dg_tensor_4d("x", DG_FMT_BF16, xd, B, Hin, T, E);
	dg_tensor w = dg_tensor_3d("w", DG_FMT_BF16, wd, H, L, E);
	dg_dptr od = gh_alloc_ff(dev, no * 2);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_BF16, od, B, H, T, L);
	dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out };
	cr_assert_eq(dg_lowrank_fwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	uint16_t *got = gh_xmalloc(no * 2);
	gh_download(dev, got, od, no * 2);
	for (size_t i = 0; i < no; i++)
		cr_assert((got[i] & 0x7fffu) <= 0x7f80u, "out[%zu] never written (0x%04x)", i, got[i]);

	const int starts[3][2] = { { 0, 0 }, { B - 1, T / 2 - 3 }, { B - 1, T - SAMPLE_ROWS } };
	uint16_t *xs = gh_xmalloc((size_t)Hin * SAMPLE_ROWS * E * 2);
	uint16_t *want = gh_xmalloc((size_t)H * SAMPLE_ROWS * L * 2);
	uint16_t *gs = gh_xmalloc((size_t)H * SAMPLE_ROWS * L * 2);
	for (int si = 0; si < 3; si++) {
		int b = starts[si][0], t0 = starts[si][1];
		for (int hi = 0; hi < Hin; hi++)
			memcpy(xs + (size_t)hi * SAMPLE_ROWS * E, xh + (((size_t)b * Hin + hi) * T + t0) * E,
			       (size_t)SAMPLE_ROWS * E * 2);
		dg_ref_lowrank_args ra = { .x = xs, .w = wh, .sa = 1.0f, .sw = 1.0f, .so = 1.0f,
					   .out = want, .batch = 1, .time = SAMPLE_ROWS };
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &ra), DG_OK);
		for (int h = 0; h < H; h++)
			memcpy(gs + (size_t)h * SAMPLE_ROWS * L, got + (((size_t)b * H + h) * T + t0) * L,
			       (size_t)SAMPLE_ROWS * L * 2);
		char what[128];
		snprintf(what, sizeof(what), "BDH bf16 in_heads %d L %d rows b %d t %d..%d", Hin, L, b, t0,
			 t0 + SAMPLE_ROWS - 1);
		compare_out(what, DG_FMT_BF16, gs, want, (size_t)H * SAMPLE_ROWS * L, false);
	}
	free(xs);
	free(want);
	free(gs);
	free(got);
	free(xh);
	free(wh);
	gh_close(dev);
}

Test(gpu_bdh, lowrank_bf16_bf16) { bdh_bf16(1, 8192, 2, 2048); }
Test(gpu_bdh, lowrank_bf16_bf16_in_heads) { bdh_bf16(4, 8192, 2, 2048); }
Test(gpu_bdh, lowrank_bf16_bf16_ragged) { bdh_bf16(1, 8112, 1, 4000); }

/* ---- integer codes on the sm_90a warpgroup path -----------------------------
 * The codes' wgmma kernels (templates/lowrank_wgmma.lua: the pipeline of
 * MMAs, weight loads and epilogue over a block's run of n-tiles), bit for
 * bit against the reference: every warpgroup tile at E 256 (int8 and
 * ternary weights by cp.async and by the register decode, sign1 × uint8pos),
 * runs of 1 to 5 n-tiles a block, and the BDH shape. */

static const dg_fmt CODE_W[3] = { DG_FMT_INT8, DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt CODE_A[3] = { DG_FMT_INT8, DG_FMT_INT8, DG_FMT_UINT8POS };

/* The warpgroup tiles: the default, one warpgroup, four, n128; every out
 * format once across them. */
Test(gpu_lowrank_codes, tiles)
{
	dg_device *dev = gh_open_sm90();

	gh_seed(9393);
	for (size_t i = 0; i < N_WG_TILES; i++)
		for (int f = 0; f < 3; f++)
			for (int hin = 0; hin < 2; hin++) {
				dg_spec s = codes_spec(CODE_W[f], CODE_A[f], 2, hin ? 2 : 1, 256, 208);
				s.tile = WG_TILES[i];
				s.out = O_FMTS[(i + (size_t)f + (size_t)hin) % 4];
				if (dg_spec_validate(&s, NULL, 0) != DG_OK)
					continue; /* a combination the spec rules refuse */
				gh_expect_path(&s, "wgmma");
				run_tile_shapes(dev, &s);
			}
	gh_close(dev);
}

/* Runs of 1, 2, 3 and 5 n-tiles a block (L 128 .. 640 at B·T 4096, H 4:
 * 128 (head, m-tile) rows, two blocks an SM of the 132 of an H200 split
 * each into two runs; the prologue alone, even and odd counts, the
 * buffers' rotation). */
Test(gpu_lowrank_codes, pipeline_depths)
{
	pipeline_depths(9494, CODE_W, CODE_A, 3, DG_FMT_INT8, "wgmma", 4);
}

Test(gpu_bdh, lowrank_int8_int8_wgmma)
{
	lowrank_bdh_on(gh_open_sm90(), DG_FMT_INT8, DG_FMT_INT8, DG_OP_LOWRANK_FWD, true);
}
Test(gpu_bdh, lowrank_ternary_int8_wgmma)
{
	lowrank_bdh_on(gh_open_sm90(), DG_FMT_TERNARY, DG_FMT_INT8, DG_OP_LOWRANK_FWD, true);
}
Test(gpu_bdh, lowrank_sign1_uint8pos_wgmma)
{
	lowrank_bdh_on(gh_open_sm90(), DG_FMT_SIGN1, DG_FMT_UINT8POS, DG_OP_LOWRANK_FWD, true);
}

/* ---- the K-streaming form of the sm_90a warpgroup path ---------------------
 * templates/lowrank_wgmma.lua KERNEL_STREAM (plan paths "wgmma stream" and
 * "wgmma bf16 stream"): bf16's auto tile where its rows of E do not fit
 * resident (past E 352), any E with an explicit tile (the codes' only
 * way: their auto tile there is mma.sync's). Integer codes bit for bit,
 * bf16 operands within the float tolerance (run_lowrank, the reference on
 * every output). */

/* weight × act pairs: int8 × int8, int8 × uint8pos, bf16 × bf16 */
static const dg_fmt STREAM_W[3] = { DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16 };
static const dg_fmt STREAM_A[3] = { DG_FMT_INT8, DG_FMT_UINT8POS, DG_FMT_BF16 };

static const char *stream_path(dg_fmt w)
{
	return w == DG_FMT_BF16 ? "wgmma bf16 stream" : "wgmma stream";
}

/* Pair f's spec (codes_spec) at tile t, whose bk counts codes: a bf16
 * slice of the same bytes has half the elements. */
static dg_spec stream_spec(int f, int H, int Hin, int E, int L, dg_tile t)
{
	dg_spec s = codes_spec(STREAM_W[f], STREAM_A[f], H, Hin, E, L);
	if (STREAM_W[f] == DG_FMT_BF16)
		t.bk /= 2;
	s.tile = t;
	return s;
}

/* At E 768 (12 slices of 64 bytes), H 3, L 208 (a last n-tile of 80
 * columns), in_heads {1, H}, every out format: bf16's auto tile, the
 * codes' default stream tile; B·T 2×127, 3×1, 1×300. */
Test(gpu_lowrank_stream, wide_rows)
{
	dg_device *dev = gh_open_sm90();

	gh_seed(9595);
	for (int f = 0; f < 3; f++)
		for (int oi = 0; oi < 4; oi++)
			for (int hin = 0; hin < 2; hin++) {
				dg_spec s = codes_spec(STREAM_W[f], STREAM_A[f], 3, hin ? 3 : 1, 768, 208);
				if (STREAM_W[f] != DG_FMT_BF16)
					s.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
				s.out = O_FMTS[oi];
				if (dg_spec_validate(&s, NULL, 0) != DG_OK)
					continue;
				gh_expect_path(&s, stream_path(STREAM_W[f]));
				run_tile_shapes(dev, &s);
			}
	gh_close(dev);
}

/* Explicit tiles (bk in elements: a bf16 slice is twice the bytes): the
 * codes' default, one warpgroup with one slice in flight, 128-byte slices,
 * BN 256, six slices in flight; at E 256 and at E 64 (one slice a tile, so
 * the ring runs across tiles every step). */
Test(gpu_lowrank_stream, tiles)
{
	static const dg_tile T8[] = {
		{ 128, 128, 64, 8, 1, 5, 0 }, { 64, 64, 64, 4, 1, 3, 0 }, { 128, 64, 128, 8, 1, 4, 0 },
		{ 128, 256, 64, 8, 1, 3, 0 }, { 64, 128, 64, 4, 1, 8, 0 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(9696);
	for (size_t i = 0; i < sizeof(T8) / sizeof(T8[0]); i++)
		for (int f = 0; f < 3; f++)
			for (int e = 0; e < 2; e++) {
				const int E = e ? 64 : 256;
				dg_spec s = stream_spec(f, 2, (i + (size_t)e) % 2 ? 2 : 1, E, 208, T8[i]);
				if (E % s.tile.bk)
					continue;
				s.out = O_FMTS[(i + (size_t)f) % 4];
				if (dg_spec_validate(&s, NULL, 0) != DG_OK)
					continue;
				gh_expect_path(&s, stream_path(STREAM_W[f]));
				run_tile_shapes(dev, &s);
			}
	gh_close(dev);
}

/* Many tiles a block, the ring running across their boundaries: H 4,
 * L 512, B·T 2048 (E 128: 2 slices a tile; E 64: 1) at the 64x64 tile
 * (1024 tiles for at most 264 blocks) and 128x128x64/8x1/5. */
Test(gpu_lowrank_stream, many_tiles_a_block)
{
	static const dg_tile T8[] = { { 64, 64, 64, 4, 1, 3, 0 }, { 128, 128, 64, 8, 1, 5, 0 } };
	dg_device *dev = gh_open_sm90();

	gh_seed(9797);
	for (size_t i = 0; i < 2; i++)
		for (int f = 0; f < 3; f += 2)
			for (int e = 0; e < 2; e++) {
				dg_spec s = stream_spec(f, 4, e ? 4 : 1, e ? 64 : 128, 512, T8[i]);
				s.out = f ? DG_FMT_BF16 : DG_FMT_INT8;
				gh_expect_path(&s, stream_path(STREAM_W[f]));
				run_lowrank(dev, &s, 2, 1024);
			}
	gh_close(dev);
}

/* ---- the warp-specialized form of the sm_90a warpgroup path ---------------
 * templates/lowrank_wgmma.lua KERNEL_WSP (plan paths "wgmma tma" and
 * "wgmma bf16 tma": a tile of 5 to 8 stages of 128-byte slices): x and the
 * weights by TMA from a producer warpgroup, the weight rows in boxes of
 * 2 x 4 rows. Every out format, x shared and a head's own, E 1280 (10
 * slices of codes, 20 of bf16) and 256, B·T 2×64, 1×192 and 3×128 (a last
 * m-tile of 64 rows at BM 128); integer codes bit for bit. At a T that is
 * no multiple of 64 an explicit tile is refused naming T and an auto one
 * (a tuning record's) runs its 4-stage stream twin (runtime/ops/lowrank.c). */

static const char *ws_path(dg_fmt w)
{
	return w == DG_FMT_BF16 ? "wgmma bf16 tma" : "wgmma tma";
}

Test(gpu_lowrank_ws, tiles)
{
	static const dg_tile T8[] = {
		{ 128, 128, 128, 8, 1, 6, 0 }, { 64, 64, 128, 4, 1, 5, 0 }, { 128, 64, 128, 8, 1, 8, 0 },
		{ 64, 128, 128, 4, 1, 7, 0 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(9898);
	for (size_t i = 0; i < sizeof(T8) / sizeof(T8[0]); i++)
		for (int f = 0; f < 3; f++)
			for (int e = 0; e < 2; e++) {
				const int E = e ? 256 : 1280;
				dg_spec s = stream_spec(f, 2, (i + (size_t)e) % 2 ? 2 : 1, E, 256, T8[i]);
				s.out = O_FMTS[(i + (size_t)f + (size_t)e) % 4];
				if (dg_spec_validate(&s, NULL, 0) != DG_OK)
					continue;
				gh_expect_path(&s, ws_path(STREAM_W[f]));
				run_lowrank(dev, &s, 2, 64);
				run_lowrank(dev, &s, 1, 192);
				run_lowrank(dev, &s, 3, 128);
			}
	gh_close(dev);
}

/* An explicit warp-specialized tile at T % 64 != 0: refused, naming T. */
Test(gpu_lowrank_ws, refuses_ragged_t)
{
	dg_device *dev = gh_open_sm90();
	dg_spec s = stream_spec(0, 2, 1, 256, 128, (dg_tile){ 128, 128, 128, 8, 1, 6, 0 });
	const int B = 1, T = 100;
	dg_tensor x = dg_tensor_4d("x", s.act, gh_alloc_ff(dev, (size_t)B * T * 256), B, 1, T, 256);
	dg_tensor w = dg_tensor_3d("w", s.weight, gh_alloc_ff(dev, (size_t)2 * 128 * 256), 2, 128, 256);
	dg_tensor out = dg_tensor_4d("out", s.out, gh_alloc_ff(dev, (size_t)B * 2 * T * 128 * 2), B, 2, T, 128);
	x.scale = gh_scalar(dev, 0.01f);
	w.scale = gh_scalar(dev, 0.01f);
	dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out };
	cr_assert_eq(dg_lowrank_fwd(dev, &s, &a), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "T = 100") && strstr(dg_device_errmsg(dev), "T % 64 == 0"), "%s",
		  dg_device_errmsg(dev));
	gh_close(dev);
}

/* int8 weights' auto tile (the warp-specialized 128x128x128/8x1/6 where it
 * fits) at T % 64 != 0: its 4-stage stream twin runs, against the reference
 * on every output (codes bit for bit); and at T % 64 == 0 the form itself,
 * x shared and a head's own, bf16 and codes out. */
Test(gpu_lowrank_ws, auto_tile_any_t)
{
	dg_device *dev = gh_open_sm90();

	gh_seed(9797);
	for (int f = 0; f < 2; f++) {
		dg_spec s = codes_spec(STREAM_W[f], STREAM_A[f], 2, f ? 2 : 1, 256, 256);
		s.out = f ? DG_FMT_UINT8POS : DG_FMT_BF16;
		gh_expect_path(&s, "wgmma tma");
		run_lowrank(dev, &s, 1, 100);
		run_lowrank(dev, &s, 2, 65);
		run_lowrank(dev, &s, 2, 128);
	}
	gh_close(dev);
}

/* epi=rope (the projection writes RoPE(out) into qr too: the attention's
 * rope=pre operand, no rope_fwd pass): the model's encoder spec (int8
 * codes a scale a token, int8 weights a scale a channel, bf16 out, x
 * shared by the heads) on its warp-specialized tile and, at a T off 64,
 * its stream twin; a head's own x; bf16 operands; out bit for bit the
 * plain call's reference and qr rope_fwd's of that out. Then, at the BDH
 * shape (B 8, T 512, H 4, E 256, L 8192), the projection with and without
 * the rope epilogue beside rope_fwd, timed in the same run. */
typedef struct timed {
	const dg_prepared *p;
	const void *a;
} timed;

static dg_status timed_launch(void *u)
{
	const timed *t = u;
	return dg_prepared_launch(t->p, t->a);
}

Test(gpu_lowrank_ws, rope_epilogue)
{
	dg_device *dev = gh_open_sm90();

	gh_seed(7171);
	for (int f = 0; f < 2; f++) {
		dg_spec s = f ? bf16_spec(2, 1, 256, 256) : codes_spec(DG_FMT_INT8, DG_FMT_INT8, 2, 1, 256, 256);
		s.out = DG_FMT_BF16;
		s.epi = DG_EPI_ROPE;
		dg_spec_normalize(&s);
		run_lowrank(dev, &s, 2, 128);
		run_lowrank(dev, &s, 1, 100); /* the stream twin */
		s.in_heads = 2;
		run_lowrank(dev, &s, 2, 64);
	}
	/* timed: the BDH encoder */
	dg_spec s = codes_spec(DG_FMT_INT8, DG_FMT_INT8, 4, 1, 256, 8192);
	s.out = DG_FMT_BF16;
	const int B = 8, T = 512, H = 4, L = 8192, E = 256;
	const size_t no = (size_t)B * H * T * L;
	float *table = gh_xmalloc((size_t)T * L * 4);
	dg_ref_rope_pairs(T, L, table);
	dg_tensor x = dg_tensor_4d("x", DG_FMT_INT8, gh_alloc_ff(dev, (size_t)B * T * E), B, 1, T, E);
	dg_tensor w = dg_tensor_3d("w", DG_FMT_INT8, gh_alloc_ff(dev, (size_t)H * L * E), H, L, E);
	x.scale = gh_alloc_ff(dev, (size_t)B * T * 4);
	w.scale = gh_alloc_ff(dev, (size_t)H * L * 4);
	cr_assert_eq(dg_memset8(dev, x.data, 0x11, (size_t)B * T * E), DG_OK);
	cr_assert_eq(dg_memset8(dev, w.data, 0x03, (size_t)H * L * E), DG_OK);
	cr_assert_eq(dg_memset8(dev, x.scale, 0x3c, (size_t)B * T * 4), DG_OK); /* ~0.012 a scale */
	cr_assert_eq(dg_memset8(dev, w.scale, 0x3c, (size_t)H * L * 4), DG_OK);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_BF16, gh_alloc_ff(dev, no * 2), B, H, T, L);
	dg_tensor qr = dg_tensor_4d("qr", DG_FMT_BF16, gh_alloc_ff(dev, no * 2), B, H, T, L);
	dg_tensor tt = dg_tensor_2d("rope", DG_FMT_F32, gh_upload(dev, table, (size_t)T * L * 4), T, L);
	double us[3];
	for (int v = 0; v < 3; v++) {
		dg_spec vs = s;
		dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out };
		dg_rope_fwd_args ra = { .x = &out, .rope = &tt, .out = &qr };
		if (v == 1) {
			vs.epi = DG_EPI_ROPE;
			a.rope = &tt;
			a.qr = &qr;
		}
		if (v == 2) {
			dg_spec_init(&vs, DG_OP_ROPE_FWD);
			vs.act = DG_FMT_BF16, vs.heads = H, vs.latent = L, vs.arch = 90, vs.arch_specific = true;
		}
		dg_spec_normalize(&vs);
		dg_prepared *p;
		cr_assert_eq(dg_prepare(dev, &vs, v == 2 ? (const void *)&ra : (const void *)&a, &p), DG_OK, "%s",
			     dg_device_errmsg(dev));
		timed tc = { p, v == 2 ? (const void *)&ra : (const void *)&a };
		dg_timer *tm;
		dg_timing tr;
		cr_assert_eq(dg_timer_create(dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_opts o = { .reps = 20 };
		cr_assert_eq(dg_timer_run(tm, &o, timed_launch, &tc, &tr), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_destroy(tm);
		us[v] = tr.median_us;
		dg_prepared_destroy(p);
	}
	printf("lowrank_fwd epi=rope B8 T512 H4 E256 L8192 w8a8 encoder: %.1f us against %.1f (epi=store) + rope_fwd "
	       "%.1f = %.1f\n", us[1], us[0], us[2], us[0] + us[2]);
	free(table);
	gh_close(dev);
}

/* ---- decoder_fwd ---------------------------------------------------------- */

/* The workspace a's call needs (its split-K slices), as the op sizes it. */
static dg_workspace decoder_workspace(dg_device *dev, const dg_spec *spec,
				      const dg_decoder_fwd_args *a)
{
	size_t need = 0;
	cr_assert_eq(dg_decoder_fwd_workspace(dev, spec, a, &need), DG_OK, "%s",
		     dg_device_errmsg(dev));
	cr_assert_gt(need, 0, "decoder_fwd always writes its partial sums to the workspace");
	return gh_workspace(dev, need);
}

/* dg_decoder_fwd with the workspace ws (gh_expect_bad_workspaces'). */
static dg_status decoder_fwd_ws(dg_device *dev, const dg_spec *s, void *args, dg_workspace ws)
{
	dg_decoder_fwd_args *a = args;
	a->ws = ws;
	return dg_decoder_fwd(dev, s, a);
}

static void run_decoder(dg_device *dev, const dg_spec *spec, int B, int T)
{
	const int H = spec->heads, L = spec->latent, E = spec->embd;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;
	size_t yb, wb, ob = gh_bytes(spec->out, no);
	void *yh = gh_rand_storage(spec->act, ny, &yb), *wh = gh_rand_storage(spec->weight, nw, &wb);
	float sa = gh_uniform(0.001f, 0.01f), sw = gh_uniform(0.01f, 0.1f);
	char canon[DG_SPEC_TEXT_MAX], what[DG_SPEC_TEXT_MAX + 64];
	dg_spec_to_string(spec, canon, sizeof(canon));
	snprintf(what, sizeof(what), "%s B=%d T=%d", canon, B, T);

	dg_dptr yd = gh_upload(dev, yh, yb), wd = gh_upload(dev, wh, wb), od = gh_alloc_ff(dev, ob);
	dg_tensor y = dg_tensor_4d("y", spec->act, yd, B, H, T, L);
	dg_tensor w = dg_tensor_2d("w", spec->weight, wd, E, (int64_t)H * L);
	dg_tensor out = dg_tensor_4d("out", spec->out, od, B, 1, T, E);
	if (dg_fmt_is_code(spec->act))
		y.scale = gh_scalar(dev, sa);
	if (dg_fmt_is_code(spec->weight))
		w.scale = gh_scalar(dev, sw);
	dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &out };
	a.ws = decoder_workspace(dev, spec, &a);
	cr_assert_eq(dg_decoder_fwd(dev, spec, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	void *got = gh_xmalloc(ob), *want = gh_xmalloc(ob);
	gh_download(dev, got, od, ob);
	dg_ref_decoder_args ra = { .y = yh, .w = wh, .sa = sa, .sw = sw, .out = want, .batch = B, .time = T };
	cr_assert_eq(dg_ref_decoder_fwd(spec, &ra), DG_OK);
	compare_out(what, spec->out, got, want, no, dg_fmt_is_code(spec->act) && dg_fmt_is_code(spec->weight));
	/* run twice: the split-K slices are rewritten, the result identical */
	cr_assert_eq(dg_decoder_fwd(dev, spec, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	void *again = gh_xmalloc(ob);
	gh_download(dev, again, od, ob);
	gh_expect_bytes("decoder rerun", again, got, ob);
	free(again);
	free(got);
	free(want);
	free(yh);
	free(wh);
}

static void decoder_weight(dg_fmt weight)
{
	dg_device *dev = gh_open();
	gh_seed(2000 + (uint64_t)weight);
	for (int ai = 0; ai < 5; ai++)
		for (int oi = 0; oi < 2; oi++)
			for (int hi = 0; hi < 2; hi++)
				for (int li = 0; li < 2; li++) {
					dg_spec s;
					dg_spec_init(&s, DG_OP_DECODER_FWD);
					s.heads = hi ? 3 : 1;
					s.latent = li ? 224 : 200; /* 224: tensor cores; 200: SIMT */
					s.embd = (ai + oi) % 2 ? 64 : 96;
					s.weight = weight;
					s.act = A_FMTS[ai];
					s.out = oi ? DG_FMT_BF16 : DG_FMT_F32;
					if (dg_spec_validate(&s, NULL, 0) != DG_OK)
						continue; /* ternary / sign1 with latent 200 */
					run_decoder(dev, &s, 2, 3);
					run_decoder(dev, &s, 2, 127);
					run_decoder(dev, &s, 1, 1);
				}
	gh_close(dev);
}

Test(gpu_decoder, weight_f32) { decoder_weight(DG_FMT_F32); }
Test(gpu_decoder, weight_bf16) { decoder_weight(DG_FMT_BF16); }
Test(gpu_decoder, weight_int8) { decoder_weight(DG_FMT_INT8); }
Test(gpu_decoder, weight_ternary) { decoder_weight(DG_FMT_TERNARY); }
Test(gpu_decoder, weight_sign1) { decoder_weight(DG_FMT_SIGN1); }

static void decoder_bdh(dg_fmt weight, dg_fmt act)
{
	dg_device *dev = gh_open();
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_FWD);
	s.weight = weight;
	s.act = act;
	s.out = DG_FMT_F32;
	const int H = s.heads, L = s.latent, E = s.embd, B = BDH_B, T = BDH_T;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;
	size_t yb, wb;
	gh_seed(99 + (uint64_t)weight);
	unsigned char *yh = gh_rand_storage(act, ny, &yb);
	void *wh = gh_rand_storage(weight, nw, &wb);
	float sa = 0.01f, sw = 0.02f;
	dg_dptr yd = gh_upload(dev, yh, yb), wd = gh_upload(dev, wh, wb), od = gh_alloc_ff(dev, no * 4);
	dg_tensor y = dg_tensor_4d("y", act, yd, B, H, T, L);
	dg_tensor w = dg_tensor_2d("w", weight, wd, E, (int64_t)H * L);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_F32, od, B, 1, T, E);
	y.scale = gh_scalar(dev, sa);
	w.scale = gh_scalar(dev, sw);
	dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &out };
	a.ws = decoder_workspace(dev, &s, &a);
	cr_assert_eq(dg_decoder_fwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	float *got = gh_xmalloc(no * 4);
	gh_download(dev, got, od, no * 4);
	/* sampled rows: copy (b, t0..t0+n) of every head into a (1, H, n, L) slice */
	const int starts[3][2] = { { 0, 0 }, { 1, T / 2 - 1 }, { 1, T - SAMPLE_ROWS } };
	unsigned char *ys = gh_xmalloc((size_t)H * SAMPLE_ROWS * L);
	float *want = gh_xmalloc((size_t)SAMPLE_ROWS * E * 4);
	for (int si = 0; si < 3; si++) {
		int b = starts[si][0], t0 = starts[si][1];
		for (int h = 0; h < H; h++)
			memcpy(ys + (size_t)h * SAMPLE_ROWS * L, yh + (((size_t)b * H + h) * T + t0) * L,
			       (size_t)SAMPLE_ROWS * L);
		dg_ref_decoder_args ra = { .y = ys, .w = wh, .sa = sa, .sw = sw, .out = want,
					   .batch = 1, .time = SAMPLE_ROWS };
		cr_assert_eq(dg_ref_decoder_fwd(&s, &ra), DG_OK);
		gh_expect_bytes("decoder BDH rows", got + ((size_t)b * T + t0) * E, want,
				(size_t)SAMPLE_ROWS * E * 4);
	}
	for (size_t i = 0; i < no; i++)
		cr_assert(!isnan(got[i]), "out[%zu] never written", i);
	free(ys);
	free(want);
	free(got);
	free(yh);
	free(wh);
	gh_close(dev);
}

/* ---- decoder_fwd's warp-specialized form (templates/decoder.lua KERNEL_WS) --
 * int8 weights, int8 or uint8pos codes, a tile of 5 to 8 stages and BK 128:
 * a TMA producer warpgroup, the items (tile, split) walked by a persistent
 * grid. Exact against the CPU reference (int32 sums, the same convert
 * entry): heads 1 and 3, latent 128 and 384 (one and three K steps a head),
 * embd 64, 96 and 320 (B tiles past E: zeros), B 1 to 3, T 64 and 128 (rows
 * past M in the last tile), out f32 and bf16, every tile below; and a
 * larger one (H 4, L 1024, E 256, B 2, T 128: several splits a tile). An
 * explicit tile at T % 64 != 0 is refused, naming T. */
static const dg_tile dec_ws_tiles[] = {
	{ 128, 128, 128, 8, 1, 6, 0 },
	{ 64, 256, 128, 4, 1, 5, 0 },
	{ 128, 64, 128, 8, 1, 8, 0 },
};

static dg_spec dec_ws_spec(int H, int L, int E, dg_fmt act, dg_fmt out, const dg_tile *tile)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_FWD);
	s.heads = H;
	s.latent = L;
	s.embd = E;
	s.weight = DG_FMT_INT8;
	s.act = act;
	s.out = out;
	s.arch = 90;
	s.arch_specific = true;
	s.tile = *tile;
	dg_spec_normalize(&s);
	gh_expect_path(&s, "wgmma tma");
	return s;
}

Test(gpu_decoder, wgmma_tma)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(2100);
	int n = 0;
	for (size_t ti = 0; ti < sizeof(dec_ws_tiles) / sizeof(dec_ws_tiles[0]); ti++)
		for (int ai = 0; ai < 2; ai++)
			for (int hi = 0; hi < 2; hi++) {
				const int E = n % 3 == 0 ? 64 : (n % 3 == 1 ? 96 : 320);
				n++;
				dg_spec s = dec_ws_spec(hi ? 3 : 1, hi ? 384 : 128, E, ai ? DG_FMT_UINT8POS : DG_FMT_INT8,
							(ai + hi) % 2 ? DG_FMT_BF16 : DG_FMT_F32, &dec_ws_tiles[ti]);
				run_decoder(dev, &s, 1, 64);
				run_decoder(dev, &s, 3, 128);
			}
	dg_spec big = dec_ws_spec(4, 1024, 256, DG_FMT_UINT8POS, DG_FMT_F32, &dec_ws_tiles[0]);
	run_decoder(dev, &big, 2, 128);

	/* T 65 on an explicit tile: refused before anything runs */
	dg_spec s = dec_ws_spec(1, 128, 64, DG_FMT_INT8, DG_FMT_F32, &dec_ws_tiles[0]);
	dg_tensor y = dg_tensor_4d("y", DG_FMT_INT8, gh_alloc_ff(dev, 65 * 128), 1, 1, 65, 128);
	dg_tensor w = dg_tensor_2d("w", DG_FMT_INT8, gh_alloc_ff(dev, 64 * 128), 64, 128);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_F32, gh_alloc_ff(dev, 65 * 64 * 4), 1, 1, 65, 64);
	y.scale = gh_scalar(dev, 0.01f);
	w.scale = gh_scalar(dev, 0.01f);
	dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &out };
	size_t need = 0;
	cr_assert_eq(dg_decoder_fwd_workspace(dev, &s, &a, &need), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "T = 65") && strstr(dg_device_errmsg(dev), "T % 64 == 0"), "%s",
		  dg_device_errmsg(dev));
	gh_close(dev);
}

Test(gpu_bdh, decoder_int8_int8) { decoder_bdh(DG_FMT_INT8, DG_FMT_INT8); }
Test(gpu_bdh, decoder_ternary_uint8pos) { decoder_bdh(DG_FMT_TERNARY, DG_FMT_UINT8POS); }

/* ---- checks: nothing launched on bad tensors ----------------------------- */

Test(gpu_forward_checks, bad_tensors_are_named)
{
	dg_spec s;
	char msg[512];
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_tensor x = dg_tensor_4d("x", DG_FMT_INT8, 256, 2, 1, 3, 256);
	dg_tensor w = dg_tensor_3d("w", DG_FMT_INT8, 512, 4, 8192, 256);
	dg_tensor out = dg_tensor_4d("out", DG_FMT_INT8, 1024, 2, 4, 3, 8192);
	x.scale = w.scale = out.scale = 2048;
	dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &out };
	cr_assert_eq(dg_lowrank_fwd_check(&s, &a, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_tensor bad = dg_tensor_3d("w", DG_FMT_INT8, 512, 4, 256, 8192);
	bad.scale = 2048;
	a.w = &bad;
	cr_assert_eq(dg_lowrank_fwd_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "w"), "%s", msg);
	a.w = &w;
	out.shape[2] = 4; /* T differs from x */
	cr_assert_eq(dg_lowrank_fwd_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	out.shape[2] = 3;
	out.scale = 0; /* int8 out needs its scale */
	cr_assert_eq(dg_lowrank_fwd_check(&s, &a, msg, sizeof(msg)), DG_ERR_INVALID_ARG);

	dg_spec d;
	dg_spec_init(&d, DG_OP_DECODER_FWD);
	d.out = DG_FMT_F32;
	dg_tensor y = dg_tensor_4d("y", DG_FMT_INT8, 256, 2, 4, 3, 8192);
	dg_tensor wd = dg_tensor_2d("w", DG_FMT_INT8, 512, 256, 4 * 8192);
	dg_tensor od = dg_tensor_4d("out", DG_FMT_F32, 1024, 2, 1, 3, 256);
	y.scale = wd.scale = 2048;
	dg_decoder_fwd_args da = { .y = &y, .w = &wd, .out = &od };
	cr_assert_eq(dg_decoder_fwd_check(&d, &da, msg, sizeof(msg)), DG_OK, "%s", msg);
	od.fmt = DG_FMT_BF16;
	cr_assert_eq(dg_decoder_fwd_check(&d, &da, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	od.fmt = DG_FMT_F32;
	cr_assert_eq(dg_decoder_fwd_check(&s, &da, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);

	dg_spec r;
	dg_spec_init(&r, DG_OP_RELU_MASK);
	r.relu = true;
	dg_tensor g = dg_tensor_4d("grad", DG_FMT_F32, 4096, 2, 4, 3, 8192);
	dg_relu_mask_args ra = { .x = &x, .w = &w, .grad = &g, .grad_out = &g };
	cr_assert_eq(dg_relu_mask_check(&r, &ra, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_tensor g2 = g;
	g2.fmt = DG_FMT_BF16;
	g2.name = "grad_out";
	ra.grad_out = &g2;
	cr_assert_eq(dg_relu_mask_check(&r, &ra, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "grad_out"), "%s", msg);
}

/* ---- the decoder's workspace --------------------------------------------- */

/* A workspace that is missing or one byte short is refused with a message
 * naming the op and "ws", before anything runs: out keeps its 0xff. */
Test(gpu_decoder, workspace_is_checked)
{
	dg_device *dev = gh_open();
	dg_spec s;
	dg_spec_init(&s, DG_OP_DECODER_FWD); /* int8 · int8 → bf16 */
	s.latent = 256;
	const int H = s.heads, L = s.latent, E = s.embd, B = 2, T = 33;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, ob = gh_bytes(s.out, (size_t)B * T * E);
	gh_seed(5);
	void *yh = gh_rand_storage(s.act, ny, NULL), *wh = gh_rand_storage(s.weight, nw, NULL);
	dg_tensor y = dg_tensor_4d("y", s.act, gh_upload(dev, yh, ny), B, H, T, L);
	dg_tensor w = dg_tensor_2d("w", s.weight, gh_upload(dev, wh, nw), E, (int64_t)H * L);
	dg_tensor out = dg_tensor_4d("out", s.out, gh_alloc_ff(dev, ob), B, 1, T, E);
	y.scale = gh_scalar(dev, 0.01f);
	w.scale = gh_scalar(dev, 0.02f);
	dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &out };
	size_t need = 0;
	cr_assert_eq(dg_decoder_fwd_workspace(dev, &s, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_gt(need, 0);
	dg_workspace big = gh_workspace(dev, need);
	gh_expect_bad_workspaces(dev, &s, &a, big, decoder_fwd_ws, "dg_decoder_fwd", "out", out.data, ob, 0);
	unsigned char *got = gh_xmalloc(ob);
	a.ws = big;
	cr_assert_eq(dg_decoder_fwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, out.data, ob);
	void *want = gh_xmalloc(ob);
	dg_ref_decoder_args ra = { .y = yh, .w = wh, .sa = 0.01f, .sw = 0.02f, .out = want,
				   .batch = B, .time = T };
	cr_assert_eq(dg_ref_decoder_fwd(&s, &ra), DG_OK);
	gh_expect_bytes("decoder with its workspace", got, want, ob);
	free(yh);
	free(wh);
	free(got);
	free(want);
	gh_close(dev);
}
