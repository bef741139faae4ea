/*
 * GPU tests of the four gradient GEMMs (templates/grad.lua,
 * grad_mma.lua; runtime/ops/grad.c, lowrank.c, decoder.c). Skip without
 * a device (gh_open).
 *
 *   - each op × each storage format × in_heads 1 / H on small odd shapes
 *     (T = 1, 3, 127; B = 2; latent and embd not multiples of the tile)
 *     against the CPU references, on three tiles: the default (tensor
 *     cores on sm_80+), an odd tensor-core tile (16x32 warp tiles, 3
 *     stages) and a SIMT tile (BK 8: the fp32 FMA path);
 *   - grad_weight: accumulate (+=), a reduction long enough to be split
 *     over grid z (the deterministic second pass, its partials in the
 *     caller's workspace: the op's _workspace size, and a missing or short
 *     one refused by name with nothing launched), and bitwise
 *     reproducibility;
 *   - bf16 gradients (dragon/spec.h "gradient formats": src=bf16 of the
 *     lowrank grads, out=bf16 of decoder_grad_input) on the same shapes
 *     and tiles, latent 100 (8-byte chunks on the tensor cores) and 96:
 *     the bf16 input is exact, so the reference is the f32 one of its
 *     widened values; a bf16 output is compared widened with the f32
 *     reference, its one rounding (2^-9 relative) inside the same bound
 *     (c·2^-8·Σ|terms|, c >= 2, of which the gradient's staging takes at
 *     most 2^-8); the reference's own bf16 path is checked to be that
 *     rounding;
 *   - finite differences of the GPU forwards (dg_lowrank_fwd,
 *     dg_decoder_fwd, f32, no ReLU: the loss Σ r·out is bilinear) against
 *     the GPU gradients (shapes whose default tiles take the tensor cores).
 *
 * The BDH shape is in tests/test_gpu_grad_bdh.c.
 *
 * Tolerance: tests/grad_helpers.h (gr_expect_bf16, the elementwise
 * Σ|terms| bound and the relative-to-norm bound);
 * tolerance_catches_layout_errors proves without a device that it fails a
 * wrong index, a transposed or shifted tile or a missing scale.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_helpers.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/ref/ref_ops.h"

static const dg_fmt weights[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
				  DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt acts[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
			       DG_FMT_INT4, DG_FMT_UINT8POS };

/* RMS of n floats (0 for n = 0). */
static double rms_of(const float *v, size_t n)
{
	double ss = 0;

	for (size_t i = 0; i < n; i++)
		ss += (double)v[i] * v[i];
	return n ? sqrt(ss / (double)n) : 0;
}

/* The tiles a small-shape check runs on: the default, an odd tensor-core
 * tile (warp tiles 16x32, three stages, BK 16) and a SIMT tile (BK 8). */
static const dg_tile small_tiles[] = {
	{ 0, 0, 0, 0, 0, 0, 0 },
	{ 32, 32, 16, 2, 1, 3, 0 },
	{ 64, 64, 8, 2, 2, 2, 0 },
};
#define N_SMALL_TILES 3

/* --- small odd shapes against the references -------------------------------- */

typedef gr_shape shape;

/* The CPU reference of a grad_input op (lowrank_ or decoder_). */
static dg_status ref_grad_input(const dg_spec *sp, const float *g, const void *w, float sw, float *out,
				int B, int T)
{
	if (sp->op == DG_OP_LOWRANK_GRAD_INPUT)
		return dg_ref_lowrank_grad_input(sp, g, w, sw, out, B, T);
	return dg_ref_decoder_grad_input(sp, g, w, sw, out, B, T);
}

/* lowrank_grad_input sp at shape s through gr_grad_input (what names it):
 * grad (B, H, T, L) in gf at grad, w (H, L, E) in f at w with scale sw,
 * into grad_x (B, Hin, T, E) f32 at out. */
static void run_lowrank_gi(dg_device *dev, const dg_spec *sp, const shape *s, dg_fmt gf, dg_dptr grad, dg_fmt f,
			   dg_dptr w, float sw, dg_dptr out, const char *what)
{
	dg_tensor tg = dg_tensor_4d("grad", gf, grad, s->B, s->H, s->T, s->L);
	dg_tensor tw = dg_tensor_3d("w", f, w, s->H, s->L, s->E);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, out, s->B, s->Hin, s->T, s->E);
	dg_lowrank_grad_input_args a = { .grad = &tg, .w = &tw, .grad_x = &tx };
	gr_grad_input(dev, sp, &a, what);
}

/* lowrank_grad_input (grad (B, H, T, L), w (H, L, E) -> grad_x (B, Hin, T,
 * E)) or decoder_grad_input (grad (B, 1, T, E), w (E, H·L) -> grad_y (B,
 * H, T, L)), w in f, against the reference. */
static void check_grad_input(dg_device *dev, dg_op op, const shape *s, dg_fmt f, const dg_tile *tile)
{
	bool lowrank = op == DG_OP_LOWRANK_GRAD_INPUT;
	dg_spec sp = gr_spec(op, s, f, tile);
	size_t ng = lowrank ? (size_t)s->B * s->H * s->T * s->L : (size_t)s->B * s->T * s->E;
	size_t nw = (size_t)s->H * s->L * s->E;
	size_t no = lowrank ? (size_t)s->B * s->Hin * s->T * s->E : (size_t)s->B * s->H * s->T * s->L;
	float *g = gr_rand_f32(ng), *got = gh_xmalloc(no * 4), *want = gh_xmalloc(no * 4);
	void *w = gh_rand_storage(f, nw, NULL);
	float sw = gr_scale_of(f);

	dg_dptr dgr = gh_upload(dev, g, ng * 4), dw = gh_upload(dev, w, gh_bytes(f, nw));
	dg_dptr dout = gh_alloc_ff(dev, no * 4);
	if (lowrank) {
		run_lowrank_gi(dev, &sp, s, DG_FMT_F32, dgr, f, dw, sw, dout, dg_fmt_name(f));
	} else {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dgr, s->B, 1, s->T, s->E);
		dg_tensor tw = dg_tensor_2d("w", f, dw, s->E, (int64_t)s->H * s->L);
		tw.scale = gh_scalar(dev, sw);
		dg_tensor ty = dg_tensor_4d("grad_y", DG_FMT_F32, dout, s->B, s->H, s->T, s->L);
		dg_decoder_grad_input_args a = { .grad = &tg, .w = &tw, .grad_y = &ty };
		cr_assert_eq(dg_decoder_grad_input(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	}
	gh_download(dev, got, dout, no * 4);
	cr_assert_eq(ref_grad_input(&sp, g, w, sw, want, s->B, s->T), DG_OK);
	float *ga = gr_abs_f32(g, ng), *absum = gh_xmalloc(no * 4);
	void *wa = gr_abs_storage(f, w, nw);
	cr_assert_eq(ref_grad_input(&sp, ga, wa, sw, absum, s->B, s->T), DG_OK);
	gr_expect_bf16(dg_fmt_name(f), got, want, absum, no, gr_bound_c(f));
	free(g);
	free(got);
	free(want);
	free(w);
	free(ga);
	free(wa);
	free(absum);
}

/* grad_weight of either op; with accumulate, grad_w starts random and the
 * expectation is start + reference. The workspace is the size the op asks
 * for (*ws_bytes, may be NULL). Returns the result (malloc'd). */
static float *check_grad_weight(dg_device *dev, dg_op op, const shape *s, dg_fmt f,
				bool accumulate, const dg_tile *tile, size_t *ws_bytes)
{
	bool lowrank = op == DG_OP_LOWRANK_GRAD_WEIGHT;
	dg_spec sp = gr_spec(op, s, f, tile);
	size_t ng = lowrank ? (size_t)s->B * s->H * s->T * s->L : (size_t)s->B * s->T * s->E;
	size_t nx = lowrank ? (size_t)s->B * s->Hin * s->T * s->E : (size_t)s->B * s->H * s->T * s->L;
	size_t nw = (size_t)s->H * s->L * s->E, need = 0;
	float *g = gr_rand_f32(ng), *start = gr_rand_f32(nw);
	float *got = gh_xmalloc(nw * 4), *want = gh_xmalloc(nw * 4), *absum = gh_xmalloc(nw * 4);
	void *x = gh_rand_storage(f, nx, NULL);
	float *ga = gr_abs_f32(g, ng);
	void *xa = gr_abs_storage(f, x, nx);
	float sa = gr_scale_of(f);

	dg_dptr dg_ = gh_upload(dev, g, ng * 4), dx = gh_upload(dev, x, gh_bytes(f, nx));
	dg_dptr dw = accumulate ? gh_upload(dev, start, nw * 4) : gh_alloc_ff(dev, nw * 4);
	if (lowrank) {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dg_, s->B, s->H, s->T, s->L);
		dg_tensor tx = dg_tensor_4d("x", f, dx, s->B, s->Hin, s->T, s->E);
		tx.scale = gh_scalar(dev, sa);
		dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, dw, s->H, s->L, s->E);
		dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw,
						  .accumulate = accumulate };
		cr_assert_eq(gr_lowrank_grad_weight(dev, &sp, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, g, x, sa, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, ga, xa, sa, absum, s->B, s->T), DG_OK);
	} else {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dg_, s->B, 1, s->T, s->E);
		dg_tensor ty = dg_tensor_4d("y", f, dx, s->B, s->H, s->T, s->L);
		ty.scale = gh_scalar(dev, sa);
		dg_tensor tw = dg_tensor_2d("grad_w", DG_FMT_F32, dw, s->E, (int64_t)s->H * s->L);
		dg_decoder_grad_weight_args a = { .grad = &tg, .y = &ty, .grad_w = &tw,
						  .accumulate = accumulate };
		cr_assert_eq(gr_decoder_grad_weight(dev, &sp, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_decoder_grad_weight(&sp, g, x, sa, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_decoder_grad_weight(&sp, ga, xa, sa, absum, s->B, s->T), DG_OK);
	}
	if (accumulate)
		for (size_t i = 0; i < nw; i++)
			want[i] += start[i];
	gh_download(dev, got, dw, nw * 4);
	gr_expect_bf16(dg_fmt_name(f), got, want, absum, nw, gr_bound_c(f));
	if (ws_bytes)
		*ws_bytes = need;
	free(g);
	free(start);
	free(want);
	free(x);
	free(ga);
	free(xa);
	free(absum);
	return got;
}

static const int times[] = { 1, 3, 127 };

/* n random gradient values in bf16 storage (returned, malloc'd) and their
 * exact f32 widening (*wide, malloc'd). */
static uint16_t *bf16_grad(size_t n, float **wide)
{
	float *g = gr_rand_f32(n);
	uint16_t *h = gh_xmalloc(n * 2 + 16);
	for (size_t i = 0; i < n; i++) {
		h[i] = dg_f32_to_bf16(g[i]);
		g[i] = dg_bf16_to_f32(h[i]);
	}
	*wide = g;
	return h;
}

/* One of the three ops with a bf16 gradient against the f32 reference:
 * lowrank_grad_input / _weight read grad bf16 (src), decoder_grad_input
 * writes grad_y bf16 (out). f: the other operand's format. */
static void check_bf16_grad(dg_device *dev, dg_op op, const shape *s, dg_fmt f, const dg_tile *tile)
{
	char what[96];
	dg_spec sp = gr_spec(op, s, f, tile), sf;
	if (op == DG_OP_DECODER_GRAD_INPUT)
		sp.out = DG_FMT_BF16;
	else
		sp.src = DG_FMT_BF16;
	sf = sp; /* the f32 reference's spec */
	sf.out = sf.src = DG_FMT_F32;
	snprintf(what, sizeof(what), "%s %s bf16 gradient Hin %d T %d L %d", dg_op_name(op), dg_fmt_name(f),
		 s->Hin, s->T, s->L);
	size_t ng, nb, no; /* grad, the other operand, the output */
	bool gi = op == DG_OP_LOWRANK_GRAD_INPUT, dgi = op == DG_OP_DECODER_GRAD_INPUT;
	ng = dgi ? (size_t)s->B * s->T * s->E : (size_t)s->B * s->H * s->T * s->L;
	nb = gi || dgi ? (size_t)s->H * s->L * s->E : (size_t)s->B * s->Hin * s->T * s->E;
	no = gi ? (size_t)s->B * s->Hin * s->T * s->E
		: dgi ? (size_t)s->B * s->H * s->T * s->L : (size_t)s->H * s->L * s->E;
	float *gw = NULL, *want = gh_xmalloc(no * 4), *absum = gh_xmalloc(no * 4), *got = gh_xmalloc(no * 4);
	uint16_t *gh = dgi ? NULL : bf16_grad(ng, &gw);
	if (dgi)
		gw = gr_rand_f32(ng);
	void *b = gh_rand_storage(f, nb, NULL), *ba = gr_abs_storage(f, b, nb);
	float *ga = gr_abs_f32(gw, ng), sc = gr_scale_of(f);
	dg_dptr dgr = dgi ? gh_upload(dev, gw, ng * 4) : gh_upload(dev, gh, ng * 2);
	dg_dptr db = gh_upload(dev, b, gh_bytes(f, nb));
	size_t ob = dgi ? no * 2 : no * 4;
	dg_dptr dout = gh_alloc_ff(dev, ob);
	dg_status st;
	if (gi) {
		run_lowrank_gi(dev, &sp, s, DG_FMT_BF16, dgr, f, db, sc, dout, what);
		cr_assert_eq(dg_ref_lowrank_grad_input(&sp, gh, b, sc, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_input(&sf, gw, b, sc, got, s->B, s->T), DG_OK);
		gh_expect_bytes("the reference's bf16 grad is its widened f32", want, got, no * 4);
		cr_assert_eq(dg_ref_lowrank_grad_input(&sf, ga, ba, sc, absum, s->B, s->T), DG_OK);
	} else if (dgi) {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dgr, s->B, 1, s->T, s->E);
		dg_tensor tw = dg_tensor_2d("w", f, db, s->E, (int64_t)s->H * s->L);
		tw.scale = gh_scalar(dev, sc);
		dg_tensor ty = dg_tensor_4d("grad_y", DG_FMT_BF16, dout, s->B, s->H, s->T, s->L);
		dg_decoder_grad_input_args a = { .grad = &tg, .w = &tw, .grad_y = &ty };
		st = dg_decoder_grad_input(dev, &sp, &a);
		cr_assert_eq(st, DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		uint16_t *rb = gh_xmalloc(no * 2);
		cr_assert_eq(dg_ref_decoder_grad_input(&sf, gw, b, sc, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_decoder_grad_input(&sp, gw, b, sc, rb, s->B, s->T), DG_OK);
		for (size_t i = 0; i < no; i++)
			cr_assert_eq(rb[i], dg_f32_to_bf16(want[i]), "%s: the reference's grad_y[%zu] is not its f32 rounded once",
				     what, i);
		free(rb);
		cr_assert_eq(dg_ref_decoder_grad_input(&sf, ga, ba, sc, absum, s->B, s->T), DG_OK);
	} else {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_BF16, dgr, s->B, s->H, s->T, s->L);
		dg_tensor tx = dg_tensor_4d("x", f, db, s->B, s->Hin, s->T, s->E);
		tx.scale = gh_scalar(dev, sc);
		dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, dout, s->H, s->L, s->E);
		dg_lowrank_grad_weight_args a = { .grad = &tg, .x = &tx, .grad_w = &tw };
		st = gr_lowrank_grad_weight(dev, &sp, &a, NULL);
		cr_assert_eq(st, DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, gh, b, sc, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sf, gw, b, sc, got, s->B, s->T), DG_OK);
		gh_expect_bytes("the reference's bf16 grad is its widened f32", want, got, no * 4);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sf, ga, ba, sc, absum, s->B, s->T), DG_OK);
	}
	if (dgi) { /* the bf16 output, widened */
		uint16_t *h = gh_xmalloc(ob);
		gh_download(dev, h, dout, ob);
		for (size_t i = 0; i < no; i++)
			got[i] = dg_bf16_to_f32(h[i]);
		free(h);
	} else {
		gh_download(dev, got, dout, ob);
	}
	gr_expect_written(what, got, no);
	gr_expect_bf16(what, got, want, absum, no, gr_bound_c(f));
	free(gw), free(gh), free(want), free(absum), free(got), free(b), free(ba), free(ga);
}

Test(gpu_grad, bf16_gradients_small)
{
	dg_device *dev = gh_open();

	gh_seed(16);
	for (int ti = 0; ti < 3; ti++)
		for (int f = 0; f < 5; f++)
			for (int k = 0; k < N_SMALL_TILES; k++) {
				for (int hin = 0; hin < 2; hin++) {
					shape a = { 3, hin ? 3 : 1, 96, 112, 2, times[ti] };
					check_bf16_grad(dev, DG_OP_LOWRANK_GRAD_INPUT, &a, weights[f], &small_tiles[k]);
					/* L 100: 8-byte chunks of a bf16 row; 96: 16-byte */
					shape w = { 3, hin ? 3 : 1, 40, hin ? 96 : 100, 2, times[ti] };
					check_bf16_grad(dev, DG_OP_LOWRANK_GRAD_WEIGHT, &w, acts[f], &small_tiles[k]);
				}
				shape d = { 3, 1, 48, 96, 2, times[ti] };
				check_bf16_grad(dev, DG_OP_DECODER_GRAD_INPUT, &d, weights[f], &small_tiles[k]);
			}
	gh_close(dev);
}

/* One op's small shapes: every format (the weights of a grad_input op,
 * the acts of a grad_weight one) x T 1, 3, 127 x the small tiles, at
 * in_heads 1 (and H where hins is 2); a grad_weight op runs format acc_f
 * with accumulate. */
typedef struct small_suite {
	dg_op op;
	uint64_t seed;
	int hins, E, L, acc_f;
} small_suite;

static void run_small(const small_suite *u)
{
	bool gi = u->op == DG_OP_LOWRANK_GRAD_INPUT || u->op == DG_OP_DECODER_GRAD_INPUT;
	dg_device *dev = gh_open();

	gh_seed(u->seed);
	for (int hin = 0; hin < u->hins; hin++)
		for (int ti = 0; ti < 3; ti++)
			for (int f = 0; f < 5; f++)
				for (int k = 0; k < N_SMALL_TILES; k++) {
					shape s = { 3, hin ? 3 : 1, u->E, u->L, 2, times[ti] };
					if (gi)
						check_grad_input(dev, u->op, &s, weights[f], &small_tiles[k]);
					else
						free(check_grad_weight(dev, u->op, &s, acts[f], f == u->acc_f,
								       &small_tiles[k], NULL));
				}
	gh_close(dev);
}

/* E 96: a multiple of sign1's 32, not of the 128 tile; L 112: a multiple
 * of 16, not of 32 */
Test(gpu_grad, lowrank_grad_input_small)
{
	static const small_suite u = { DG_OP_LOWRANK_GRAD_INPUT, 10, 2, 96, 112, -1 };
	run_small(&u);
}

/* L 96: a multiple of sign1's 32, not of the 128 tile; E 48: a multiple
 * of 16, not of 32 */
Test(gpu_grad, decoder_grad_input_small)
{
	static const small_suite u = { DG_OP_DECODER_GRAD_INPUT, 11, 1, 48, 96, -1 };
	run_small(&u);
}

/* int8 (acts[2]) accumulates */
Test(gpu_grad, lowrank_grad_weight_small)
{
	static const small_suite u = { DG_OP_LOWRANK_GRAD_WEIGHT, 12, 2, 40, 100, 2 };
	run_small(&u);
}

/* int4 (acts[3]) accumulates */
Test(gpu_grad, decoder_grad_weight_small)
{
	static const small_suite u = { DG_OP_DECODER_GRAD_WEIGHT, 13, 1, 40, 100, 3 };
	run_small(&u);
}

/* A long reduction over few output tiles is split over grid z (its
 * partials in the workspace, so the op asks for one) and summed by the
 * second pass; the result is bitwise the same run to run. */
Test(gpu_grad, grad_weight_split_and_reproducible)
{
	dg_device *dev = gh_open();
	shape s = { 2, 1, 40, 36, 2, 1000 };
	size_t nw = (size_t)s.H * s.L * s.E;

	for (int op = 0; op < 2; op++) {
		dg_op o = op ? DG_OP_DECODER_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_WEIGHT;
		for (int acc = 0; acc < 2; acc++) {
			size_t wa = 0, wb = 0;
			gh_seed(14);
			float *a = check_grad_weight(dev, o, &s, DG_FMT_INT8, acc, NULL, &wa);
			gh_seed(14);
			float *b = check_grad_weight(dev, o, &s, DG_FMT_INT8, acc, NULL, &wb);
			cr_assert_gt(wa, 0, "%s: B·T %d over 2 output tiles is not split", dg_op_name(o),
				     s.B * s.T);
			cr_assert_eq(wa % (nw * 4), 0, "a whole grad_w of partials a split: %zu", wa);
			cr_assert_eq(wa, wb);
			gh_expect_bytes("run to run", a, b, nw * 4);
			free(a);
			free(b);
		}
	}
	gh_close(dev);
}

/* The split's workspace is the caller's: missing or one byte short, the
 * call is refused with a message naming the op and "ws", and nothing runs
 * (grad_w keeps its 0xff bytes). */
Test(gpu_grad, grad_weight_workspace_is_checked)
{
	dg_device *dev = gh_open();
	shape s = { 2, 1, 40, 36, 2, 1000 };
	size_t nw = (size_t)s.H * s.L * s.E;
	unsigned char *ff = gh_xmalloc(nw * 4), *got = gh_xmalloc(nw * 4);
	memset(ff, 0xff, nw * 4);

	gh_seed(15);
	for (int op = 0; op < 2; op++) {
		bool lowrank = op == 0;
		dg_op o = lowrank ? DG_OP_LOWRANK_GRAD_WEIGHT : DG_OP_DECODER_GRAD_WEIGHT;
		dg_spec sp = gr_spec(o, &s, DG_FMT_INT8, NULL);
		size_t ng = lowrank ? (size_t)s.B * s.H * s.T * s.L : (size_t)s.B * s.T * s.E;
		size_t nx = lowrank ? (size_t)s.B * s.T * s.E : (size_t)s.B * s.H * s.T * s.L;
		float *g = gr_rand_f32(ng);
		void *x = gh_rand_storage(DG_FMT_INT8, nx, NULL);
		dg_dptr dw = gh_alloc_ff(dev, nw * 4);
		dg_tensor tg = lowrank ? dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), s.B, s.H, s.T, s.L)
				       : dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), s.B, 1, s.T, s.E);
		dg_tensor tx = lowrank ? dg_tensor_4d("x", DG_FMT_INT8, gh_upload(dev, x, nx), s.B, 1, s.T, s.E)
				       : dg_tensor_4d("y", DG_FMT_INT8, gh_upload(dev, x, nx), s.B, s.H, s.T, s.L);
		tx.scale = gh_scalar(dev, 1.0f / 127);
		dg_tensor tw = lowrank ? dg_tensor_3d("grad_w", DG_FMT_F32, dw, s.H, s.L, s.E)
				       : dg_tensor_2d("grad_w", DG_FMT_F32, dw, s.E, (int64_t)s.H * s.L);
		dg_lowrank_grad_weight_args la = { .grad = &tg, .x = &tx, .grad_w = &tw };
		dg_decoder_grad_weight_args da = { .grad = &tg, .y = &tx, .grad_w = &tw };
		size_t need = 0;
		dg_status st = lowrank ? dg_lowrank_grad_weight_workspace(dev, &sp, &la, &need)
				       : dg_decoder_grad_weight_workspace(dev, &sp, &da, &need);
		cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_gt(need, 0, "%s: not split", dg_op_name(o));
		dg_workspace ok = gh_workspace(dev, need);
		const dg_workspace bad[3] = { { 0, 0 }, { ok.ptr, need - 1 }, { 0, need } };
		for (int i = 0; i < 3; i++) {
			la.ws = da.ws = bad[i];
			st = lowrank ? dg_lowrank_grad_weight(dev, &sp, &la)
				     : dg_decoder_grad_weight(dev, &sp, &da);
			cr_assert_eq(st, DG_ERR_INVALID_ARG, "%s: case %d ran", dg_op_name(o), i);
			const char *m = dg_device_errmsg(dev);
			cr_assert(strstr(m, dg_op_name(o)) && strstr(m, "ws"), "case %d: %s", i, m);
		}
		gh_download(dev, got, dw, nw * 4);
		gh_expect_bytes("grad_w after refused calls", got, ff, nw * 4);
		la.ws = da.ws = ok;
		st = lowrank ? dg_lowrank_grad_weight(dev, &sp, &la) : dg_decoder_grad_weight(dev, &sp, &da);
		cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(dev));
		gh_download(dev, got, dw, nw * 4);
		for (size_t i = 0; i < nw; i++)
			cr_assert(!isnan(((float *)got)[i]), "grad_w[%zu] never written", i);
		free(g);
		free(x);
	}
	free(ff);
	free(got);
	gh_close(dev);
}

/* The tolerance fails a wrong layout: no device; a bf16-rounded gradient
 * (what the tensor cores compute) passes, while the same result shifted by
 * one element, read transposed, or missing the operand's scale fails — on
 * a short reduction and on a long one, where the elementwise bound alone is
 * near the RMS and the norm check is what fails. */
Test(gpu_grad, tolerance_catches_layout_errors)
{
	static const int Ts[] = { 3, 2000 };

	for (int ti = 0; ti < 2; ti++) {
		shape s = { 2, 1, 40, 36, 2, Ts[ti] };
		dg_spec sp = gr_spec(DG_OP_LOWRANK_GRAD_WEIGHT, &s, DG_FMT_INT8, NULL);
		size_t ng = (size_t)s.B * s.H * s.T * s.L, nx = (size_t)s.B * s.T * s.E,
		       nw = (size_t)s.H * s.L * s.E, pl = (size_t)s.L * s.E;
		gh_seed(50 + (uint64_t)ti);
		float *g = gr_rand_f32(ng), *gr = gh_xmalloc(ng * 4);
		void *x = gh_rand_storage(DG_FMT_INT8, nx, NULL);
		float *ga = gr_abs_f32(g, ng);
		void *xa = gr_abs_storage(DG_FMT_INT8, x, nx);
		float *want = gh_xmalloc(nw * 4), *absum = gh_xmalloc(nw * 4), *ok = gh_xmalloc(nw * 4),
		      *bad = gh_xmalloc(nw * 4);
		const float sa = gr_scale_of(DG_FMT_INT8);
		char why[256];

		for (size_t i = 0; i < ng; i++)
			gr[i] = dg_bf16_to_f32(dg_f32_to_bf16(g[i]));
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, g, x, sa, want, s.B, s.T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, ga, xa, sa, absum, s.B, s.T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, gr, x, sa, ok, s.B, s.T), DG_OK);
		cr_assert(gr_bf16_ok("bf16-rounded", ok, want, absum, nw, 2.0, why, sizeof(why)), "%s", why);
		/* and its output rounded to bf16 once more (out=bf16) still passes */
		for (size_t i = 0; i < nw; i++)
			bad[i] = dg_bf16_to_f32(dg_f32_to_bf16(ok[i]));
		cr_assert(gr_bf16_ok("bf16 output", bad, want, absum, nw, 2.0, why, sizeof(why)), "%s", why);
		for (size_t i = 0; i < nw; i++) /* shifted by one element */
			bad[i] = ok[(i + 1) % nw];
		cr_assert_not(gr_bf16_ok("shifted", bad, want, absum, nw, 2.0, why, sizeof(why)));
		for (size_t i = 0; i < nw; i++) { /* each head's (L, E) read as (E, L) */
			size_t h = i / pl, r = i % pl, l = r / (size_t)s.E, e = r % (size_t)s.E;
			bad[i] = ok[h * pl + e * (size_t)s.L + l];
		}
		cr_assert_not(gr_bf16_ok("transposed", bad, want, absum, nw, 2.0, why, sizeof(why)));
		for (size_t i = 0; i < nw; i++) /* the scale forgotten */
			bad[i] = ok[i] / sa;
		cr_assert_not(gr_bf16_ok("unscaled", bad, want, absum, nw, 2.0, why, sizeof(why)));
		free(g);
		free(gr);
		free(x);
		free(ga);
		free(xa);
		free(want);
		free(absum);
		free(ok);
		free(bad);
	}
}

/* --- finite differences of the GPU forwards ------------------------------------ */

/* Float i of the device array at p := v. */
static void put(dg_device *dev, dg_dptr p, size_t i, float v)
{
	cr_assert_eq(dg_memcpy_htod(dev, p + 4 * i, &v, 4), DG_OK, "%s", dg_device_errmsg(dev));
}

/* loss = Σ r·out, out downloaded from the device. */
static double loss_of(dg_device *dev, dg_dptr out, const float *r, float *buf, size_t n)
{
	double l = 0;

	gh_download(dev, buf, out, n * 4);
	for (size_t i = 0; i < n; i++)
		l += (double)r[i] * buf[i];
	return l;
}

/* A forward of the finite differences: dg_lowrank_fwd or dg_decoder_fwd
 * on its args. */
typedef dg_status (*fwd_fn)(dg_device *dev, const dg_spec *s, const void *args);

static dg_status lowrank_fwd(dg_device *dev, const dg_spec *s, const void *args)
{
	return dg_lowrank_fwd(dev, s, args);
}

static dg_status decoder_fwd(dg_device *dev, const dg_spec *s, const void *args)
{
	return dg_decoder_fwd(dev, s, args);
}

/* The forward's two operands (host copies and their device arrays), its
 * output and the loss weights r, and the GPU's gradients of Σ r·out. */
typedef struct fd_case {
	fwd_fn fwd;
	const dg_spec *spec;
	const void *args;
	float *in, *w;       /* host copies, restored after each probe */
	dg_dptr d_in, d_w;
	size_t n_in, n_w, n_out;
	dg_dptr out;
	float *r;
	float *g_in, *g_w;   /* the GPU gradients */
	const char *in_what; /* "grad_x vs finite differences" */
} fd_case;

/* c's data: in (n_in), w (n_w) and r (n_out), random f32 drawn in that
 * order from the test's stream; in and w uploaded (d_in, d_w), out zeroed,
 * r uploaded into *d_r; the host buffers of the two gradients. */
static void fd_data(dg_device *dev, fd_case *c, size_t n_in, size_t n_w, size_t n_out, dg_dptr *d_r)
{
	c->n_in = n_in;
	c->n_w = n_w;
	c->n_out = n_out;
	c->in = gr_rand_f32(n_in);
	c->w = gr_rand_f32(n_w);
	c->r = gr_rand_f32(n_out);
	c->g_in = gh_xmalloc(n_in * 4);
	c->g_w = gh_xmalloc(n_w * 4);
	c->d_in = gh_upload(dev, c->in, n_in * 4);
	c->d_w = gh_upload(dev, c->w, n_w * 4);
	c->out = gh_alloc(dev, n_out * 4);
	*d_r = gh_upload(dev, c->r, n_out * 4);
}

static void fd_free(fd_case *c)
{
	free(c->in);
	free(c->w);
	free(c->r);
	free(c->g_in);
	free(c->g_w);
}

/* The f32 specs of a forward (fwd: op fwd) and its two gradients (gi,
 * gw: ops gi_op, gw_op) at H heads of latent L, embd E. */
static void f32_specs(dg_op fwd_op, dg_op gi_op, dg_op gw_op, int H, int E, int L, dg_spec *fwd, dg_spec *gi,
		      dg_spec *gw)
{
	dg_spec_init(fwd, fwd_op);
	fwd->heads = H;
	fwd->embd = E;
	fwd->latent = L;
	fwd->weight = fwd->act = fwd->out = DG_FMT_F32;
	*gi = *fwd;
	gi->op = gi_op;
	*gw = *fwd;
	gw->op = gw_op;
}

/* 16 probes, on in and w in turn, of a random element: the central
 * difference (eps 0.125: the loss is bilinear, so exact but for rounding)
 * against the GPU gradient, within GR_BF16_REL of the gradient's RMS (it
 * is bf16-rounded on the tensor cores) plus the differences' rounding. */
static void fd_probe(dg_device *dev, const fd_case *c)
{
	const float eps = 0.125f;
	float *buf = gh_xmalloc(c->n_out * 4);

	for (int k = 0; k < 16; k++) {
		bool on_in = k % 2 == 0;
		float *p = on_in ? c->in : c->w;
		size_t n = on_in ? c->n_in : c->n_w, i = (size_t)gh_int(0, (int)n - 1);
		dg_dptr dp = on_in ? c->d_in : c->d_w;
		float v = p[i], fd[1], an[1];

		p[i] = v + eps;
		put(dev, dp, i, p[i]);
		cr_assert_eq(c->fwd(dev, c->spec, c->args), DG_OK, "%s", dg_device_errmsg(dev));
		double lp = loss_of(dev, c->out, c->r, buf, c->n_out);
		p[i] = v - eps;
		put(dev, dp, i, p[i]);
		cr_assert_eq(c->fwd(dev, c->spec, c->args), DG_OK, "%s", dg_device_errmsg(dev));
		double lm = loss_of(dev, c->out, c->r, buf, c->n_out);
		p[i] = v;
		put(dev, dp, i, p[i]);
		fd[0] = (float)((lp - lm) / (2.0 * eps));
		an[0] = on_in ? c->g_in[i] : c->g_w[i];
		gh_expect_close(on_in ? c->in_what : "grad_w vs finite differences", an, fd, 1,
				(float)(GR_BF16_REL * rms_of(on_in ? c->g_in : c->g_w, n)) + 1e-3f, 0.0f);
	}
	free(buf);
}

/* The GPU's gradients (at g_in, g_w on the device) into c, then fd_probe
 * of the forward spec on args; frees c's data. */
static void fd_check(dg_device *dev, fd_case *c, const dg_spec *spec, const void *args, dg_dptr g_in, dg_dptr g_w)
{
	gh_download(dev, c->g_in, g_in, c->n_in * 4);
	gh_download(dev, c->g_w, g_w, c->n_w * 4);
	c->spec = spec;
	c->args = args;
	fd_probe(dev, c);
	fd_free(c);
}

Test(gpu_grad, finite_differences_lowrank)
{
	dg_device *dev = gh_open();
	/* L 48: the default grad_input tile (BK 16) takes the tensor cores */
	const int H = 2, E = 32, L = 48, B = 2, T = 3;

	for (int hin_i = 0; hin_i < 2; hin_i++) {
		int Hin = hin_i ? H : 1;
		size_t nx = (size_t)B * Hin * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
		gh_seed(30 + (uint64_t)Hin);
		fd_case c = { .fwd = lowrank_fwd, .in_what = "grad_x vs finite differences" };
		dg_dptr dr;
		fd_data(dev, &c, nx, nw, no, &dr);
		dg_tensor tx = dg_tensor_4d("x", DG_FMT_F32, c.d_in, B, Hin, T, E);
		dg_tensor tw = dg_tensor_3d("w", DG_FMT_F32, c.d_w, H, L, E);
		dg_tensor to = dg_tensor_4d("out", DG_FMT_F32, c.out, B, H, T, L);
		dg_tensor tr = dg_tensor_4d("grad", DG_FMT_F32, dr, B, H, T, L);
		dg_tensor tgx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc_ff(dev, nx * 4), B, Hin, T, E);
		dg_tensor tgw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), H, L, E);
		dg_spec fs, gis, gws;
		f32_specs(DG_OP_LOWRANK_FWD, DG_OP_LOWRANK_GRAD_INPUT, DG_OP_LOWRANK_GRAD_WEIGHT, H, E, L, &fs, &gis,
			  &gws);
		fs.in_heads = gis.in_heads = gws.in_heads = Hin;
		dg_lowrank_fwd_args fa = { .x = &tx, .w = &tw, .out = &to };
		dg_lowrank_grad_input_args ia = { .grad = &tr, .w = &tw, .grad_x = &tgx };
		dg_lowrank_grad_weight_args wa = { .grad = &tr, .x = &tx, .grad_w = &tgw };
		gr_grad_input(dev, &gis, &ia, "lowrank_grad_input");
		cr_assert_eq(gr_lowrank_grad_weight(dev, &gws, &wa, NULL), DG_OK, "%s", dg_device_errmsg(dev));
		fd_check(dev, &c, &fs, &fa, tgx.data, tgw.data);
	}
	gh_close(dev);
}

Test(gpu_grad, finite_differences_decoder)
{
	dg_device *dev = gh_open();
	/* E 48: the default grad_input tile (BK 16) takes the tensor cores */
	const int H = 2, E = 48, L = 20, B = 2, T = 3;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;

	gh_seed(40);
	fd_case c = { .fwd = decoder_fwd, .in_what = "grad_y vs finite differences" };
	dg_dptr dr;
	fd_data(dev, &c, ny, nw, no, &dr);
	dg_tensor ty = dg_tensor_4d("y", DG_FMT_F32, c.d_in, B, H, T, L);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_F32, c.d_w, E, (int64_t)H * L);
	dg_tensor to = dg_tensor_4d("out", DG_FMT_F32, c.out, B, 1, T, E);
	dg_tensor tr = dg_tensor_4d("grad", DG_FMT_F32, dr, B, 1, T, E);
	dg_tensor tgy = dg_tensor_4d("grad_y", DG_FMT_F32, gh_alloc_ff(dev, ny * 4), B, H, T, L);
	dg_tensor tgw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc_ff(dev, nw * 4), E, (int64_t)H * L);
	dg_spec fs, gis, gws;
	f32_specs(DG_OP_DECODER_FWD, DG_OP_DECODER_GRAD_INPUT, DG_OP_DECODER_GRAD_WEIGHT, H, E, L, &fs, &gis, &gws);
	dg_decoder_fwd_args fa = { .y = &ty, .w = &tw, .out = &to };
	dg_decoder_grad_input_args ia = { .grad = &tr, .w = &tw, .grad_y = &tgy };
	dg_decoder_grad_weight_args wa = { .grad = &tr, .y = &ty, .grad_w = &tgw };
	size_t need = 0;
	cr_assert_eq(dg_decoder_fwd_workspace(dev, &fs, &fa, &need), DG_OK, "%s", dg_device_errmsg(dev));
	fa.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_decoder_grad_input(dev, &gis, &ia), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(gr_decoder_grad_weight(dev, &gws, &wa, NULL), DG_OK, "%s", dg_device_errmsg(dev));
	fd_check(dev, &c, &fs, &fa, tgy.data, tgw.data);
	gh_close(dev);
}
