/*
 * GPU tests of the sm_90a warpgroup path of lowrank_grad_input and
 * lowrank_grad_weight (templates/grad_wgmma.lua): a bf16 gradient
 * (src=bf16) with a bf16 w / x, on small odd shapes against the CPU
 * references (runtime/ref/ref_ops.h, the bf16 storages read as they are);
 * and of decoder_grad_weight's (f32 gradient, y bf16 or uint8pos codes a
 * scale a token or a tensor: the section before its tests). Skip
 * without a device (gh_open) or unless it is an sm_90 (the path is
 * sm_90a's), saying why.
 *
 *   - T 1, 7, 65, 130 and B 1 to 3 (rows of M or K past the tile, K steps
 *     that straddle a batch, a last K step of a few rows), embd 32 / 36 /
 *     40 / 64 (a B tile wider than E; rows of 72 bytes, not 16-byte
 *     aligned: the guarded element staging), latent 64 / 128 (grad_input:
 *     BK 64 divides it) and 96 / 100 for grad_weight (a ragged M; rows of
 *     200 bytes), in_heads 1 and H;
 *   - the default tile and three others (two warpgroups of n64; one of
 *     n256; two of n256, 4 stages), each plan checked to be the path;
 *   - grad_weight with accumulate off and on, and B·T long enough that the
 *     op splits it (its workspace > 0: partials, then the reduce entry);
 *   - every output starts as 0xff bytes (NaN) unless accumulated into, so
 *     an element never written fails; a second run gives the same bytes.
 *
 * Tolerance: bf16 operands are exact and their products exact in f32, so
 * the error is the f32 sums' (K·2^-24·Σ|terms|); gr_expect_bf16 with
 * c = 1 (2^-8·Σ|terms| elementwise, 1e-2 of the norm: the check that
 * fails a wrong layout, tests/test_gpu_grad.c
 * tolerance_catches_layout_errors).
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_helpers.h"
#include "runtime/ref/ref_ops.h"
#include "gpu_helpers.h"
#include "runtime/ref/ref_int.h"

typedef gr_shape shape;

/* The default and three other warpgroup tiles. */
static const dg_tile tiles[] = {
	{ 0, 0, 0, 0, 0, 0, 0 },
	{ 128, 64, 64, 8, 1, 4, 0 },
	{ 64, 256, 64, 4, 1, 3, 0 },
	{ 128, 256, 64, 8, 1, 4, 0 },
};
#define N_TILES 4

static dg_spec wg_spec(dg_op op, const shape *s, const dg_tile *tile)
{
	dg_spec sp = gr_spec(op, s, DG_FMT_BF16, tile);

	sp.src = DG_FMT_BF16;
	sp.arch = 90;
	sp.arch_specific = true;
	dg_spec_normalize(&sp);
	return sp;
}

/* The plan of sp names the warpgroup path: the warp-specialized form for
 * a tile of 5 to 8 stages, and for the lowrank grads' auto tile where
 * rows are whole 16 bytes (E, L multiples of 8; at a T % 64 != 0 the
 * runtime then takes the cp.async ring's tile, which these shapes test). */
static void expect_wgmma(const dg_spec *sp)
{
	bool ws = sp->tile.stages >= 5 || (dg_tile_is_auto(&sp->tile) && sp->op != DG_OP_DECODER_GRAD_WEIGHT &&
					   sp->embd % 8 == 0 && sp->latent % 8 == 0);
	gh_expect_path(sp, ws ? "wgmma tma" : "wgmma bf16");
}

/* n random bf16 values (malloc'd) and their |values| (*abs, malloc'd). */
static uint16_t *rand_bf16(size_t n, uint16_t **abs)
{
	float *f = gr_rand_f32(n);
	uint16_t *h = gh_xmalloc(n * 2 + 16), *a = gh_xmalloc(n * 2 + 16);
	for (size_t i = 0; i < n; i++) {
		h[i] = dg_f32_to_bf16(f[i]);
		a[i] = h[i] & 0x7fffu;
	}
	free(f);
	*abs = a;
	return h;
}

static void check_grad_input(dg_device *dev, const shape *s, const dg_tile *tile)
{
	char what[128];
	dg_spec sp = wg_spec(DG_OP_LOWRANK_GRAD_INPUT, s, tile);
	expect_wgmma(&sp);
	snprintf(what, sizeof(what), "wgmma grad_input H %d Hin %d E %d L %d B %d T %d tile %dx%d", s->H, s->Hin,
		 s->E, s->L, s->B, s->T, tile->bm, tile->bn);
	size_t ng = (size_t)s->B * s->H * s->T * s->L, nw = (size_t)s->H * s->L * s->E,
	       nx = (size_t)s->B * s->Hin * s->T * s->E;
	uint16_t *ga, *wa, *g = rand_bf16(ng, &ga), *w = rand_bf16(nw, &wa);
	float *want = gh_xmalloc(nx * 4), *absum = gh_xmalloc(nx * 4);
	float *got = gh_xmalloc(nx * 4), *again = gh_xmalloc(nx * 4);

	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_BF16, gh_upload(dev, g, ng * 2), s->B, s->H, s->T, s->L);
	dg_tensor tw = dg_tensor_3d("w", DG_FMT_BF16, gh_upload(dev, w, nw * 2), s->H, s->L, s->E);
	for (int run = 0; run < 2; run++) {
		dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), s->B, s->Hin, s->T,
					    s->E);
		dg_lowrank_grad_input_args a = { .grad = &tg, .w = &tw, .grad_x = &tx };
		gr_grad_input(dev, &sp, &a, what);
		gh_download(dev, run ? again : got, tx.data, nx * 4);
	}
	cr_assert_eq(dg_ref_lowrank_grad_input(&sp, g, w, 1.0f, want, s->B, s->T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_input(&sp, ga, wa, 1.0f, absum, s->B, s->T), DG_OK);
	gr_expect_written(what, got, nx);
	gr_expect_bf16(what, got, want, absum, nx, 1.0);
	gh_expect_bytes(what, again, got, nx * 4);
	free(g), free(ga), free(w), free(wa), free(want), free(absum), free(got), free(again);
}

/* grad_weight on tile; accumulate: grad_w starts random, the expectation
 * is start + reference. Returns the workspace the op asked for. */
static size_t check_grad_weight(dg_device *dev, const shape *s, const dg_tile *tile, bool accumulate)
{
	char what[160];
	dg_spec sp = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, s, tile);
	expect_wgmma(&sp);
	snprintf(what, sizeof(what), "wgmma grad_weight H %d Hin %d E %d L %d B %d T %d tile %dx%d acc %d", s->H,
		 s->Hin, s->E, s->L, s->B, s->T, tile->bm, tile->bn, accumulate);
	size_t ng = (size_t)s->B * s->H * s->T * s->L, nx = (size_t)s->B * s->Hin * s->T * s->E,
	       nw = (size_t)s->H * s->L * s->E, need = 0;
	uint16_t *ga, *xa, *g = rand_bf16(ng, &ga), *x = rand_bf16(nx, &xa);
	float *start = gr_rand_f32(nw), *want = gh_xmalloc(nw * 4), *absum = gh_xmalloc(nw * 4);
	float *got = gh_xmalloc(nw * 4), *again = gh_xmalloc(nw * 4);

	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_BF16, gh_upload(dev, g, ng * 2), s->B, s->H, s->T, s->L);
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_BF16, gh_upload(dev, x, nx * 2), s->B, s->Hin, s->T, s->E);
	for (int run = 0; run < 2; run++) {
		dg_dptr dw = accumulate ? gh_upload(dev, start, nw * 4) : gh_alloc_ff(dev, nw * 4);
		dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, dw, s->H, s->L, s->E);
		dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw, .accumulate = accumulate };
		cr_assert_eq(dg_lowrank_grad_weight_workspace(dev, &sp, &a, &need), DG_OK, "%s: %s", what,
			     dg_device_errmsg(dev));
		/* partials start as NaN too: a split that writes nothing fails */
		a.ws = gh_workspace(dev, need);
		if (need)
			cr_assert_eq(dg_memset8(dev, a.ws.ptr, 0xff, need), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_lowrank_grad_weight(dev, &sp, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, run ? again : got, dw, nw * 4);
	}
	cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, g, x, 1.0f, want, s->B, s->T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, ga, xa, 1.0f, absum, s->B, s->T), DG_OK);
	if (accumulate) /* the one f32 add: inside the bound's 1e-6·(1 + |want|) */
		for (size_t i = 0; i < nw; i++)
			want[i] += start[i];
	gr_expect_written(what, got, nw);
	gr_expect_bf16(what, got, want, absum, nw, 1.0);
	gh_expect_bytes(what, again, got, nw * 4);
	free(g), free(ga), free(x), free(xa), free(start), free(want), free(absum), free(got), free(again);
	return need;
}

/* Every shape with every tile: grad_input, or grad_weight (accumulating
 * on the odd tiles). */
static void each_grad_input(dg_device *dev, const shape *shapes, size_t ns, const dg_tile *ts, int nt)
{
	for (size_t i = 0; i < ns; i++)
		for (int k = 0; k < nt; k++)
			check_grad_input(dev, &shapes[i], &ts[k]);
}

static void each_grad_weight(dg_device *dev, const shape *shapes, size_t ns, const dg_tile *ts, int nt)
{
	for (size_t i = 0; i < ns; i++)
		for (int k = 0; k < nt; k++)
			check_grad_weight(dev, &shapes[i], &ts[k], k % 2 == 1);
}

Test(gpu_grad, wgmma_grad_input_small)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 1 }, { 2, 2, 36, 128, 2, 7 }, { 4, 1, 40, 64, 3, 65 }, { 4, 4, 64, 128, 2, 130 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(90);
	each_grad_input(dev, shapes, sizeof(shapes) / sizeof(shapes[0]), tiles, N_TILES);
	gh_close(dev);
}

Test(gpu_grad, wgmma_grad_weight_small)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 1 }, { 2, 2, 36, 100, 2, 7 }, { 4, 1, 40, 96, 3, 65 }, { 4, 4, 64, 128, 2, 130 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(91);
	each_grad_weight(dev, shapes, sizeof(shapes) / sizeof(shapes[0]), tiles, N_TILES);
	gh_close(dev);
}

/* B·T 2000 (31.25 K steps of 64) over a few output tiles: the op splits
 * it (workspace > 0; the last split's last step is 16 rows), accumulate
 * off and on, every tile. */
Test(gpu_grad, wgmma_grad_weight_split)
{
	static const shape s = { 2, 1, 40, 100, 2, 1000 };
	dg_device *dev = gh_open_sm90();

	gh_seed(92);
	for (int k = 0; k < N_TILES; k++)
		for (int acc = 0; acc < 2; acc++) {
			size_t need = check_grad_weight(dev, &s, &tiles[k], acc);
			cr_assert_gt(need, 0, "tile %d: B·T 2000 is not split", k);
		}
	gh_close(dev);
}

/* ---- the warp-specialized form (templates/grad_wgmma.lua KERNEL_WS) ----------
 * A producer warpgroup loads both operands by TMA (64 x 64 boxes, zeros
 * past the maps' edges) into a ring of 5 to 8 stages. It needs T % 64 == 0
 * and rows of whole 16 bytes (E, L multiples of 8): E 40 and 72 (a B tile
 * wider than E, a ragged one), latent 64 / 128 for grad_input and 104 for
 * grad_weight (a ragged M tile), B 1 to 3, in_heads 1 and H; tiles of one
 * and two consumer warpgroups, BN 64 to 256. An explicit one at T % 64 !=
 * 0 is refused, naming T. */
static const dg_tile ws_tiles[] = {
	{ 128, 128, 64, 8, 1, 6, 0 },
	{ 128, 64, 64, 8, 1, 5, 0 },
	{ 64, 256, 64, 4, 1, 5, 0 },
	{ 64, 128, 64, 4, 1, 8, 0 },
};
#define N_WS_TILES 4

Test(gpu_grad, wgmma_tma_grad_input)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 64 }, { 2, 2, 40, 128, 2, 128 }, { 4, 1, 72, 64, 3, 64 }, { 4, 4, 64, 128, 2, 192 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(96);
	each_grad_input(dev, shapes, sizeof(shapes) / sizeof(shapes[0]), ws_tiles, N_WS_TILES);
	gh_close(dev);
}

Test(gpu_grad, wgmma_tma_grad_weight)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 64 }, { 2, 2, 40, 104, 2, 128 }, { 4, 1, 72, 104, 3, 64 }, { 4, 4, 64, 128, 2, 192 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(97);
	each_grad_weight(dev, shapes, sizeof(shapes) / sizeof(shapes[0]), ws_tiles, N_WS_TILES);
	/* B·T 2048 over a few output tiles: split (partials, then the reduce) */
	static const shape split = { 2, 1, 40, 104, 2, 1024 };
	for (int k = 0; k < N_WS_TILES; k++) {
		size_t need = check_grad_weight(dev, &split, &ws_tiles[k], k % 2 == 0);
		cr_assert_gt(need, 0, "ws tile %d: B·T 2048 is not split", k);
	}
	gh_close(dev);
}

/* An explicit warp-specialized tile at T % 64 != 0: refused, naming T. */
Test(gpu_grad, wgmma_tma_refuses_ragged_t)
{
	static const shape s = { 2, 1, 64, 64, 1, 65 };
	dg_device *dev = gh_open_sm90();
	dg_spec sp = wg_spec(DG_OP_LOWRANK_GRAD_WEIGHT, &s, &ws_tiles[0]);
	size_t ng = (size_t)s.B * s.H * s.T * s.L, nx = (size_t)s.B * s.Hin * s.T * s.E,
	       nw = (size_t)s.H * s.L * s.E;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_BF16, gh_alloc_ff(dev, ng * 2), s.B, s.H, s.T, s.L);
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_BF16, gh_alloc_ff(dev, nx * 2), s.B, s.Hin, s.T, s.E);
	dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), s.H, s.L, s.E);
	dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw };
	size_t need = 0;
	cr_assert_eq(dg_lowrank_grad_weight_workspace(dev, &sp, &a, &need), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "T = 65") && strstr(dg_device_errmsg(dev), "T % 64 == 0"), "%s",
		  dg_device_errmsg(dev));
	gh_close(dev);
}

/* ---- decoder_grad_weight (templates/grad_wgmma.lua render_dgw) ---------------
 * grad f32 (B, 1, T, E) rounded to bf16 as staged, y bf16 or uint8pos codes
 * (the presets' decoder activations: bf16; w8a8 and bitnet a scale a token,
 * seed one a tensor), E and L multiples of 8. Tolerance as the mma.sync
 * path's (tests/grad_helpers.h): the gradient rounded (c = 2), and with a
 * scale a token B(k, l) = bf16(code · sa[k]) rounded too (c = 3). */

typedef struct dshape {
	int H, E, L, B, T;
} dshape;

/* The default and three other warpgroup tiles of decoder_grad_weight
 * (a ring of 2 to 4 stages: one step waits in registers). */
static const dg_tile dgw_tiles[] = {
	{ 0, 0, 0, 0, 0, 0, 0 },
	{ 128, 64, 64, 8, 1, 3, 0 },
	{ 64, 256, 64, 4, 1, 2, 0 },
	{ 128, 256, 64, 8, 1, 4, 0 },
};

static dg_spec dgw_spec(const dshape *s, dg_fmt y, bool token, const dg_tile *tile)
{
	dg_spec sp;

	dg_spec_init(&sp, DG_OP_DECODER_GRAD_WEIGHT);
	sp.heads = s->H;
	sp.embd = s->E;
	sp.latent = s->L;
	sp.act = y;
	sp.ascale = token ? DG_SCALE_TOKEN : DG_SCALE_TENSOR;
	sp.arch = 90;
	sp.arch_specific = true;
	sp.tile = *tile;
	dg_spec_normalize(&sp);
	return sp;
}

/* decoder_grad_weight with y of format f (token: a scale a token) on tile;
 * accumulate: grad_w starts random, the expectation is start + reference.
 * Returns the workspace the op asked for (> 0: it split B·T). */
static size_t check_dgw(dg_device *dev, const dshape *s, dg_fmt f, bool token, const dg_tile *tile,
			bool accumulate)
{
	char what[192];
	dg_spec sp = dgw_spec(s, f, token, tile);
	expect_wgmma(&sp);
	snprintf(what, sizeof(what), "wgmma decoder_grad_weight %s%s H %d E %d L %d B %d T %d tile %dx%d acc %d",
		 dg_fmt_name(f), token ? " token" : "", s->H, s->E, s->L, s->B, s->T, tile->bm, tile->bn,
		 accumulate);
	size_t ng = (size_t)s->B * s->T * s->E, ny = (size_t)s->B * s->H * s->T * s->L,
	       nw = (size_t)s->E * s->H * s->L, nt = (size_t)s->B * s->T, need = 0;
	float *g = gr_rand_f32(ng), *ga = gr_abs_f32(g, ng), *start = gr_rand_f32(nw);
	void *y = gh_rand_storage(f, ny, NULL), *ya = gr_abs_storage(f, y, ny);
	float sa = gr_scale_of(f);
	/* a scale a token: positive, about sa, each its own */
	float *sv = gr_rand_f32(nt);
	for (size_t i = 0; i < nt; i++)
		sv[i] = sa * (0.5f + (sv[i] < 0 ? -sv[i] : sv[i]));
	float *want = gh_xmalloc(nw * 4), *absum = gh_xmalloc(nw * 4);
	float *got = gh_xmalloc(nw * 4), *again = gh_xmalloc(nw * 4);

	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), s->B, 1, s->T, s->E);
	dg_tensor ty = dg_tensor_4d("y", f, gh_upload(dev, y, gh_bytes(f, ny)), s->B, s->H, s->T, s->L);
	if (f != DG_FMT_BF16)
		ty.scale = token ? gh_upload(dev, sv, nt * 4) : gh_scalar(dev, sa);
	for (int run = 0; run < 2; run++) {
		dg_dptr dw = accumulate ? gh_upload(dev, start, nw * 4) : gh_alloc_ff(dev, nw * 4);
		dg_tensor tw = dg_tensor_2d("grad_w", DG_FMT_F32, dw, s->E, (int64_t)s->H * s->L);
		dg_decoder_grad_weight_args a = { .grad = &tg, .y = &ty, .grad_w = &tw, .accumulate = accumulate };
		cr_assert_eq(dg_decoder_grad_weight_workspace(dev, &sp, &a, &need), DG_OK, "%s: %s", what,
			     dg_device_errmsg(dev));
		/* partials start as NaN too: a split that writes nothing fails */
		a.ws = gh_workspace(dev, need);
		if (need)
			cr_assert_eq(dg_memset8(dev, a.ws.ptr, 0xff, need), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_decoder_grad_weight(dev, &sp, &a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, run ? again : got, dw, nw * 4);
	}
	cr_assert_eq(dg__ref_decoder_grad_weight_v(&sp, g, y, sa, sv, want, s->B, s->T), DG_OK);
	cr_assert_eq(dg__ref_decoder_grad_weight_v(&sp, ga, ya, sa, sv, absum, s->B, s->T), DG_OK);
	if (accumulate) /* the one f32 add: inside the bound's 1e-6·(1 + |want|) */
		for (size_t i = 0; i < nw; i++)
			want[i] += start[i];
	gr_expect_written(what, got, nw);
	gr_expect_bf16(what, got, want, absum, nw, token ? 3.0 : 2.0);
	gh_expect_bytes(what, again, got, nw * 4);
	free(g), free(ga), free(start), free(y), free(ya), free(sv), free(want), free(absum), free(got),
		free(again);
	return need;
}

/* The y formats of the presets: bf16; uint8pos a scale a token and one a
 * tensor. */
static const struct {
	dg_fmt f;
	bool token;
} dgw_fmts[] = { { DG_FMT_BF16, false }, { DG_FMT_UINT8POS, true }, { DG_FMT_UINT8POS, false } };

/* Small odd shapes: E 40 / 32 (fewer rows than BM), L 96 / 136 / 200 (a
 * ragged last N tile), T 1, 7, 65, 130 and B 1 to 3 (a K step that straddles
 * a batch, a last K step of a few rows); every tile, accumulate off and on. */
Test(gpu_grad, wgmma_decoder_grad_weight_small)
{
	static const dshape shapes[] = {
		{ 2, 40, 96, 1, 1 }, { 2, 64, 136, 2, 7 }, { 4, 32, 64, 3, 65 }, { 1, 136, 200, 2, 130 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(93);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int k = 0; k < 4; k++)
			for (size_t f = 0; f < sizeof(dgw_fmts) / sizeof(dgw_fmts[0]); f++)
				check_dgw(dev, &shapes[i], dgw_fmts[f].f, dgw_fmts[f].token, &dgw_tiles[k],
					  (k + (int)f) % 2 == 1);
	gh_close(dev);
}

/* B·T 2000 (31.25 K steps of 64) over a few output tiles: the op splits it
 * (workspace > 0; the reduce entry adds the partials and, for a scale a
 * tensor, scales), accumulate off and on, every tile and format. */
Test(gpu_grad, wgmma_decoder_grad_weight_split)
{
	static const dshape s = { 2, 40, 96, 2, 1000 };
	dg_device *dev = gh_open_sm90();

	gh_seed(94);
	for (int k = 0; k < 4; k++)
		for (size_t f = 0; f < sizeof(dgw_fmts) / sizeof(dgw_fmts[0]); f++)
			for (int acc = 0; acc < 2; acc++) {
				size_t need = check_dgw(dev, &s, dgw_fmts[f].f, dgw_fmts[f].token, &dgw_tiles[k], acc);
				cr_assert_gt(need, 0, "tile %d: B·T 2000 is not split", k);
			}
	gh_close(dev);
}

/* The BDH shape (H 4, E 256, L 8192: 512 blocks of the default tile, no
 * split) on a short B·T of 130 (a ragged last K step), the default tile,
 * each format, accumulate off and on. */
Test(gpu_grad, wgmma_decoder_grad_weight_bdh, .timeout = 600)
{
	static const dshape s = { 4, 256, 8192, 2, 65 };
	dg_device *dev = gh_open_sm90();

	gh_seed(95);
	for (size_t f = 0; f < sizeof(dgw_fmts) / sizeof(dgw_fmts[0]); f++)
		check_dgw(dev, &s, dgw_fmts[f].f, dgw_fmts[f].token, &dgw_tiles[0], f == 1);
	gh_close(dev);
}

/* The warp-specialized form (tiles of 5 to 8 stages, BN up to 128: the
 * gradient's bf16 copy by TMA, y decoded by the producer warpgroup) at T %
 * 64 == 0 (its A boxes), small and ragged in E and L, with a split, each
 * format, accumulate off and on, against the reference; and its sums the
 * bits of the ring form's (128x128x64/8x1/2) at the same shape. At T % 64
 * != 0 the tile is refused naming T. */
Test(gpu_grad, wgmma_tma_decoder_grad_weight, .timeout = 600)
{
	static const dshape shapes[] = {
		{ 2, 40, 96, 1, 64 }, { 2, 64, 136, 2, 128 }, { 4, 136, 200, 3, 64 }, { 2, 40, 96, 2, 1024 },
	};
	static const dg_tile dgw_tma_tiles[] = {
		{ 128, 128, 64, 8, 1, 5, 0 }, { 64, 128, 64, 4, 1, 6, 0 }, { 128, 64, 64, 8, 1, 8, 0 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(96);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (size_t k = 0; k < sizeof(dgw_tma_tiles) / sizeof(dgw_tma_tiles[0]); k++)
			for (size_t f = 0; f < sizeof(dgw_fmts) / sizeof(dgw_fmts[0]); f++) {
				size_t need = check_dgw(dev, &shapes[i], dgw_fmts[f].f, dgw_fmts[f].token, &dgw_tma_tiles[k],
							(k + f) % 2 == 1);
				cr_assert_gt(need, 0, "the gradient's bf16 copy lives in the workspace");
			}
	/* the ring form's bits, at the BDH widths on a short B·T */
	static const dshape bdh = { 4, 256, 8192, 2, 128 };
	static const dg_tile ring = { 128, 128, 64, 8, 1, 2, 0 }, wst = { 128, 128, 64, 8, 1, 5, 0 };
	for (size_t f = 0; f < sizeof(dgw_fmts) / sizeof(dgw_fmts[0]); f++) {
		const size_t ng = (size_t)bdh.B * bdh.T * bdh.E, ny = (size_t)bdh.B * bdh.H * bdh.T * bdh.L,
			     nw = (size_t)bdh.E * bdh.H * bdh.L, nt = (size_t)bdh.B * bdh.T;
		float *g = gr_rand_f32(ng), *sv = gr_rand_f32(nt);
		for (size_t i = 0; i < nt; i++)
			sv[i] = (0.5f + (sv[i] < 0 ? -sv[i] : sv[i])) / 255.0f;
		void *y = gh_rand_storage(dgw_fmts[f].f, ny, NULL);
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), bdh.B, 1, bdh.T, bdh.E);
		dg_tensor ty = dg_tensor_4d("y", dgw_fmts[f].f, gh_upload(dev, y, gh_bytes(dgw_fmts[f].f, ny)), bdh.B,
					    bdh.H, bdh.T, bdh.L);
		if (dgw_fmts[f].f != DG_FMT_BF16)
			ty.scale = dgw_fmts[f].token ? gh_upload(dev, sv, nt * 4) : gh_scalar(dev, 0.01f);
		float *out[2];
		for (int w = 0; w < 2; w++) {
			dg_spec sp = dgw_spec(&bdh, dgw_fmts[f].f, dgw_fmts[f].token, w ? &wst : &ring);
			dg_tensor tw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), bdh.E,
						    (int64_t)bdh.H * bdh.L);
			dg_decoder_grad_weight_args a = { .grad = &tg, .y = &ty, .grad_w = &tw };
			size_t need = 0;
			cr_assert_eq(dg_decoder_grad_weight_workspace(dev, &sp, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
			a.ws = gh_workspace(dev, need);
			cr_assert_eq(dg_decoder_grad_weight(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
			out[w] = gh_xmalloc(nw * 4);
			gh_download(dev, out[w], tw.data, nw * 4);
		}
		gh_expect_bytes("decoder_grad_weight: warp-specialized against the ring", out[1], out[0], nw * 4);
		free(g), free(sv), free(y), free(out[0]), free(out[1]);
	}
	/* T % 64 != 0: the tile asked for is refused, naming T */
	static const dshape ragged = { 2, 40, 96, 2, 65 };
	dg_spec sp = dgw_spec(&ragged, DG_FMT_UINT8POS, true, &dgw_tma_tiles[0]);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_alloc(dev, 2 * 65 * 40 * 4), 2, 1, 65, 40);
	dg_tensor ty = dg_tensor_4d("y", DG_FMT_UINT8POS, gh_alloc(dev, 2 * 2 * 65 * 96), 2, 2, 65, 96);
	ty.scale = gh_alloc(dev, 2 * 65 * 4);
	dg_tensor tw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc(dev, 40 * 2 * 96 * 4), 40, 2 * 96);
	dg_decoder_grad_weight_args a = { .grad = &tg, .y = &ty, .grad_w = &tw };
	size_t need = 0;
	dg_status st = dg_decoder_grad_weight_workspace(dev, &sp, &a, &need);
	if (!st) {
		a.ws = gh_workspace(dev, need);
		st = dg_decoder_grad_weight(dev, &sp, &a);
	}
	cr_assert_neq(st, DG_OK, "T 65 on the warp-specialized tile");
	cr_assert(strstr(dg_device_errmsg(dev), "T = 65"), "%s", dg_device_errmsg(dev));
	gh_close(dev);
}

