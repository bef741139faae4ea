/*
 * GPU tests of the sm_90a warpgroup path of lowrank_grad_input and
 * lowrank_grad_weight (templates/grad_wgmma.lua): a bf16 gradient
 * (src=bf16) with a bf16 w / x, on small odd shapes against the CPU
 * references (runtime/ref/ref_ops.h, the bf16 storages read as they are). Skip
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
#include "runtime/ref/ref_ops.h"

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

/* The plan of sp names the warpgroup path. */
static void expect_wgmma(const dg_spec *sp)
{
	gh_expect_path(sp, "wgmma bf16");
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

Test(gpu_grad, wgmma_grad_input_small)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 1 }, { 2, 2, 36, 128, 2, 7 }, { 4, 1, 40, 64, 3, 65 }, { 4, 4, 64, 128, 2, 130 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(90);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int k = 0; k < N_TILES; k++)
			check_grad_input(dev, &shapes[i], &tiles[k]);
	gh_close(dev);
}

Test(gpu_grad, wgmma_grad_weight_small)
{
	static const shape shapes[] = {
		{ 2, 1, 64, 64, 1, 1 }, { 2, 2, 36, 100, 2, 7 }, { 4, 1, 40, 96, 3, 65 }, { 4, 4, 64, 128, 2, 130 },
	};
	dg_device *dev = gh_open_sm90();

	gh_seed(91);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int k = 0; k < N_TILES; k++)
			check_grad_weight(dev, &shapes[i], &tiles[k], k % 2 == 1);
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
