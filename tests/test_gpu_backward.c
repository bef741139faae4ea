/*
 * GPU tests of the four backward GEMMs (templates/backward.lua,
 * runtime/ops_backward.c). Skip without a device (gh_open).
 *
 *   - each op × each storage format × in_heads 1 / H on small odd shapes
 *     (T = 1, 3, 127; B = 2; latent and embd not multiples of the tile)
 *     against the CPU references, on three tiles: the default (tensor
 *     cores on sm_80+), an odd tensor-core tile (16x32 warp tiles, 3
 *     stages) and a SIMT tile (BK 8: the fp32 FMA path);
 *   - grad_weight: accumulate (+=), a reduction long enough to be split
 *     over grid z (the deterministic second pass), and bitwise
 *     reproducibility;
 *   - the BDH shape (H 4, E 256, L 8192, B·T 4096): grad_input on sampled
 *     rows, grad_weight in full with sampled output rows checked against
 *     sums over those rows only;
 *   - finite differences of the GPU forwards (dg_lowrank_fwd,
 *     dg_decoder_fwd, f32, no ReLU: the loss Σ r·out is bilinear) against
 *     the GPU gradients (shapes whose default tiles take the tensor cores).
 *
 * Tolerance (expect_bf16). The references are exact (double sums of the
 * f32 gradient times the decoded operand). The tensor-core path rounds the
 * gradient (and an f32 operand) to bf16, round to nearest even — a
 * relative error of at most 2^-8 a value — and sums exact products in f32,
 * so an output's error is at most (2^-8 + K·2^-24)·Σ_k |a_k·b_k| (twice
 * the first term with an f32 operand). Each check asks for both:
 *   - elementwise |got − want| <= c·2^-8·Σ_k |a_k·b_k| + 1e-6·(1 + |want|),
 *     c = 2 (3 with an f32 operand), the Σ|terms| from the same CPU
 *     reference run on |grad| and |operand| (abs_sum) — a bound the
 *     rounding can never exceed, so the test cannot flake;
 *   - ‖got − want‖ <= 1e-2·‖want‖ (the rounding gives about 1e-3): on long
 *     reductions the elementwise bound grows like K while a wrong element
 *     is off by about √K, so this is what keeps a wrong index, a
 *     transposed or shifted tile, a lost K step or a missing scale failing
 *     loudly (tolerance_catches_layout_errors proves it without a device).
 * The SIMT path (f32 sums) passes both with room to spare.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"

static const dg_fmt weights[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
				  DG_FMT_TERNARY, DG_FMT_SIGN1 };
static const dg_fmt acts[] = { DG_FMT_F32, DG_FMT_BF16, DG_FMT_INT8,
			       DG_FMT_INT4, DG_FMT_UINT8POS };

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	cr_assert_not_null(p);
	return p;
}

/* Storage bytes of n values of format f. */
static size_t storage_bytes(dg_fmt f, size_t n)
{
	switch (f) {
	case DG_FMT_F32:
		return 4 * n;
	case DG_FMT_BF16:
		return 2 * n;
	case DG_FMT_TERNARY:
		return n / 4;
	case DG_FMT_SIGN1:
		return n / 8;
	default:
		return n;
	}
}

/* Random storage of n values of format f (packed along the flat order,
 * which is the last axis: n is whole rows). */
static void *make_storage(dg_fmt f, size_t n)
{
	size_t bytes = storage_bytes(f, n);
	uint8_t *p = xmalloc(bytes + 16);

	memset(p, 0, bytes + 16);
	for (size_t i = 0; i < n; i++) {
		switch (f) {
		case DG_FMT_F32:
			((float *)p)[i] = gh_uniform(-1, 1);
			break;
		case DG_FMT_BF16:
			((uint16_t *)p)[i] = dg_ref_f32_to_bf16(gh_uniform(-1, 1));
			break;
		case DG_FMT_TERNARY: {
			int c = gh_int(-1, 1);
			uint32_t bits = c == 1 ? 1u : c == -1 ? 3u : 0u;
			((uint32_t *)p)[i / 16] |= bits << (2 * (i % 16));
			break;
		}
		case DG_FMT_SIGN1:
			if (gh_int(0, 1))
				((uint32_t *)p)[i / 32] |= 1u << (i % 32);
			break;
		case DG_FMT_INT4:
			p[i] = (uint8_t)gh_int(-7, 7);
			break;
		case DG_FMT_UINT8POS:
			p[i] = (uint8_t)gh_int(0, 255);
			break;
		default:
			p[i] = (uint8_t)gh_int(-127, 127);
			break;
		}
	}
	return p;
}

/* A scale that keeps decoded values about 1. */
static float scale_of(dg_fmt f)
{
	int q = dg_ref_qmax(f);

	return q ? 1.0f / (float)q : 1.0f;
}

static float *rand_f32(size_t n)
{
	float *p = xmalloc(n * 4);

	for (size_t i = 0; i < n; i++)
		p[i] = gh_uniform(-1, 1);
	return p;
}

#define BF16_REL 1e-2 /* relative-to-norm bound of a bf16-rounded gradient */
#define BF16_U (1.0 / 256) /* 2^-8: bf16's unit roundoff (round to nearest even) */

/* RMS of n floats (0 for n = 0). */
static double rms_of(const float *v, size_t n)
{
	double ss = 0;

	for (size_t i = 0; i < n; i++)
		ss += (double)v[i] * v[i];
	return n ? sqrt(ss / (double)n) : 0;
}

/* The elementwise factor c of the bound: the gradient is rounded (2^-8),
 * and an f32 operand too (another 2^-8); one unit of c to spare for the
 * f32 sums (K·2^-24 <= 2^-8 for K <= 2^16). */
static double bound_c(dg_fmt f)
{
	return f == DG_FMT_F32 ? 3.0 : 2.0;
}

/* Whether got matches want within the bounds of the file comment; absum[i]
 * is Σ_k |a_k·b_k| of output i (scale included). Prints the first misses;
 * `why` gets the first failed rule. */
static bool bf16_ok(const char *what, const float *got, const float *want, const float *absum,
		    size_t n, double c, char *why, size_t why_size)
{
	double ss = 0, se = 0;
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		double d = (double)got[i] - want[i];
		double tol = c * BF16_U * absum[i] + 1e-6 * (1.0 + fabs((double)want[i]));
		ss += (double)want[i] * want[i];
		se += d * d;
		if (fabs(d) <= tol)
			continue;
		if (bad < 4)
			fprintf(stderr, "%s[%zu]: got %.9g, want %.9g, |diff| %.3g > %.3g (Σ|terms| %.6g)\n",
				what, i, (double)got[i], (double)want[i], fabs(d), tol, (double)absum[i]);
		if (!bad)
			first = i;
		bad++;
	}
	if (bad) {
		snprintf(why, why_size, "%s: %zu of %zu values outside %g·2^-8·Σ|terms| (first at %zu)",
			 what, bad, n, c, first);
		return false;
	}
	if (se > BF16_REL * BF16_REL * ss + 1e-12) {
		snprintf(why, why_size, "%s: relative-to-norm error %.3g, more than %g", what,
			 ss > 0 ? sqrt(se / ss) : sqrt(se), BF16_REL);
		return false;
	}
	return true;
}

static void expect_bf16(const char *what, const float *got, const float *want, const float *absum,
			size_t n, double c)
{
	char why[256];

	cr_assert(bf16_ok(what, got, want, absum, n, c, why, sizeof(why)), "%s", why);
}

/* |values| of a storage of n values of format f (same layout), so that a
 * reference run on it and on |grad| gives Σ|terms| (malloc'd). */
static void *abs_storage(dg_fmt f, const void *src, size_t n)
{
	size_t bytes = storage_bytes(f, n);
	uint8_t *p = xmalloc(bytes + 16);

	memcpy(p, src, bytes);
	for (size_t i = 0; i < n; i++) {
		switch (f) {
		case DG_FMT_F32:
			((float *)p)[i] = fabsf(((float *)p)[i]);
			break;
		case DG_FMT_BF16:
			((uint16_t *)p)[i] &= 0x7fff;
			break;
		case DG_FMT_TERNARY: { /* -1 (11) → +1 (01) */
			uint32_t *wd = (uint32_t *)p + i / 16;
			*wd &= ~(2u << (2 * (i % 16)));
			break;
		}
		case DG_FMT_SIGN1: /* every value +1 */
			((uint32_t *)p)[i / 32] |= 1u << (i % 32);
			break;
		case DG_FMT_INT8:
		case DG_FMT_INT4:
			p[i] = (uint8_t)abs((int8_t)p[i]);
			break;
		default: /* uint8pos: already >= 0 */
			break;
		}
	}
	return p;
}

static float *abs_f32(const float *v, size_t n)
{
	float *p = xmalloc(n * 4);

	for (size_t i = 0; i < n; i++)
		p[i] = fabsf(v[i]);
	return p;
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

typedef struct shape {
	int H, Hin, E, L, B, T;
} shape;

static dg_spec spec_of(dg_op op, const shape *s, dg_fmt f, const dg_tile *tile)
{
	dg_spec sp;

	dg_spec_init(&sp, op);
	sp.heads = s->H;
	sp.in_heads = s->Hin;
	sp.embd = s->E;
	sp.latent = s->L;
	if (op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_DECODER_GRAD_INPUT)
		sp.weight = f;
	else
		sp.act = f;
	if (tile)
		sp.tile = *tile;
	return sp;
}

static void check_lowrank_grad_input(dg_device *dev, const shape *s, dg_fmt f, const dg_tile *tile)
{
	dg_spec sp = spec_of(DG_OP_LOWRANK_GRAD_INPUT, s, f, tile);
	size_t ng = (size_t)s->B * s->H * s->T * s->L, nw = (size_t)s->H * s->L * s->E,
	       nx = (size_t)s->B * s->Hin * s->T * s->E;
	float *g = rand_f32(ng), *got = xmalloc(nx * 4), *want = xmalloc(nx * 4);
	void *w = make_storage(f, nw);
	float sw = scale_of(f);

	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), s->B, s->H, s->T, s->L);
	dg_tensor tw = dg_tensor_3d("w", f, gh_upload(dev, w, storage_bytes(f, nw)), s->H, s->L, s->E);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc(dev, nx * 4), s->B, s->Hin, s->T, s->E);
	dg_lowrank_grad_input_args a = { &tg, &tw, &tx };
	cr_assert_eq(dg_lowrank_grad_input(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tx.data, nx * 4);
	cr_assert_eq(dg_ref_lowrank_grad_input(&sp, g, w, sw, want, s->B, s->T), DG_OK);
	float *ga = abs_f32(g, ng), *absum = xmalloc(nx * 4);
	void *wa = abs_storage(f, w, nw);
	cr_assert_eq(dg_ref_lowrank_grad_input(&sp, ga, wa, sw, absum, s->B, s->T), DG_OK);
	expect_bf16(dg_fmt_name(f), got, want, absum, nx, bound_c(f));
	free(g);
	free(got);
	free(want);
	free(w);
	free(ga);
	free(wa);
	free(absum);
}

static void check_decoder_grad_input(dg_device *dev, const shape *s, dg_fmt f, const dg_tile *tile)
{
	dg_spec sp = spec_of(DG_OP_DECODER_GRAD_INPUT, s, f, tile);
	size_t ng = (size_t)s->B * s->T * s->E, nw = (size_t)s->E * s->H * s->L,
	       ny = (size_t)s->B * s->H * s->T * s->L;
	float *g = rand_f32(ng), *got = xmalloc(ny * 4), *want = xmalloc(ny * 4);
	void *w = make_storage(f, nw);
	float sw = scale_of(f);

	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), s->B, 1, s->T, s->E);
	dg_tensor tw = dg_tensor_2d("w", f, gh_upload(dev, w, storage_bytes(f, nw)), s->E,
				    (int64_t)s->H * s->L);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor ty = dg_tensor_4d("grad_y", DG_FMT_F32, gh_alloc(dev, ny * 4), s->B, s->H, s->T, s->L);
	dg_decoder_grad_input_args a = { &tg, &tw, &ty };
	cr_assert_eq(dg_decoder_grad_input(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, ty.data, ny * 4);
	cr_assert_eq(dg_ref_decoder_grad_input(&sp, g, w, sw, want, s->B, s->T), DG_OK);
	float *ga = abs_f32(g, ng), *absum = xmalloc(ny * 4);
	void *wa = abs_storage(f, w, nw);
	cr_assert_eq(dg_ref_decoder_grad_input(&sp, ga, wa, sw, absum, s->B, s->T), DG_OK);
	expect_bf16(dg_fmt_name(f), got, want, absum, ny, bound_c(f));
	free(g);
	free(got);
	free(want);
	free(w);
	free(ga);
	free(wa);
	free(absum);
}

/* grad_weight of either op; with accumulate, grad_w starts random and the
 * expectation is start + reference. Returns the result (malloc'd). */
static float *check_grad_weight(dg_device *dev, dg_op op, const shape *s, dg_fmt f,
				bool accumulate, const dg_tile *tile)
{
	bool lowrank = op == DG_OP_LOWRANK_GRAD_WEIGHT;
	dg_spec sp = spec_of(op, s, f, tile);
	size_t ng = lowrank ? (size_t)s->B * s->H * s->T * s->L : (size_t)s->B * s->T * s->E;
	size_t nx = lowrank ? (size_t)s->B * s->Hin * s->T * s->E : (size_t)s->B * s->H * s->T * s->L;
	size_t nw = (size_t)s->H * s->L * s->E;
	float *g = rand_f32(ng), *start = rand_f32(nw);
	float *got = xmalloc(nw * 4), *want = xmalloc(nw * 4), *absum = xmalloc(nw * 4);
	void *x = make_storage(f, nx);
	float *ga = abs_f32(g, ng);
	void *xa = abs_storage(f, x, nx);
	float sa = scale_of(f);

	dg_dptr dg_ = gh_upload(dev, g, ng * 4), dx = gh_upload(dev, x, storage_bytes(f, nx));
	dg_dptr dw = accumulate ? gh_upload(dev, start, nw * 4) : gh_alloc(dev, nw * 4);
	dg_status st;
	if (lowrank) {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dg_, s->B, s->H, s->T, s->L);
		dg_tensor tx = dg_tensor_4d("x", f, dx, s->B, s->Hin, s->T, s->E);
		tx.scale = gh_scalar(dev, sa);
		dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, dw, s->H, s->L, s->E);
		dg_lowrank_grad_weight_args a = { &tg, &tx, &tw, accumulate };
		st = dg_lowrank_grad_weight(dev, &sp, &a);
		cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, g, x, sa, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, ga, xa, sa, absum, s->B, s->T), DG_OK);
	} else {
		dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, dg_, s->B, 1, s->T, s->E);
		dg_tensor ty = dg_tensor_4d("y", f, dx, s->B, s->H, s->T, s->L);
		ty.scale = gh_scalar(dev, sa);
		dg_tensor tw = dg_tensor_2d("grad_w", DG_FMT_F32, dw, s->E, (int64_t)s->H * s->L);
		dg_decoder_grad_weight_args a = { &tg, &ty, &tw, accumulate };
		st = dg_decoder_grad_weight(dev, &sp, &a);
		cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_ref_decoder_grad_weight(&sp, g, x, sa, want, s->B, s->T), DG_OK);
		cr_assert_eq(dg_ref_decoder_grad_weight(&sp, ga, xa, sa, absum, s->B, s->T), DG_OK);
	}
	if (accumulate)
		for (size_t i = 0; i < nw; i++)
			want[i] += start[i];
	gh_download(dev, got, dw, nw * 4);
	expect_bf16(dg_fmt_name(f), got, want, absum, nw, bound_c(f));
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

Test(gpu_backward, lowrank_grad_input_small, .timeout = 600)
{
	dg_device *dev = gh_open();

	gh_seed(10);
	for (int hin = 0; hin < 2; hin++)
		for (int ti = 0; ti < 3; ti++)
			for (int f = 0; f < 5; f++)
				for (int k = 0; k < N_SMALL_TILES; k++) {
					/* E 96: a multiple of sign1's 32, not of the 128 tile;
					 * L 112: a multiple of 16, not of 32 */
					shape s = { 3, hin ? 3 : 1, 96, 112, 2, times[ti] };
					check_lowrank_grad_input(dev, &s, weights[f], &small_tiles[k]);
				}
	gh_close(dev);
}

Test(gpu_backward, decoder_grad_input_small, .timeout = 600)
{
	dg_device *dev = gh_open();

	gh_seed(11);
	for (int ti = 0; ti < 3; ti++)
		for (int f = 0; f < 5; f++)
			for (int k = 0; k < N_SMALL_TILES; k++) {
				/* L 96: a multiple of sign1's 32, not of the 128 tile;
				 * E 48: a multiple of 16, not of 32 */
				shape s = { 3, 1, 48, 96, 2, times[ti] };
				check_decoder_grad_input(dev, &s, weights[f], &small_tiles[k]);
			}
	gh_close(dev);
}

Test(gpu_backward, lowrank_grad_weight_small, .timeout = 600)
{
	dg_device *dev = gh_open();

	gh_seed(12);
	for (int hin = 0; hin < 2; hin++)
		for (int ti = 0; ti < 3; ti++)
			for (int f = 0; f < 5; f++)
				for (int k = 0; k < N_SMALL_TILES; k++) {
					shape s = { 3, hin ? 3 : 1, 40, 100, 2, times[ti] };
					free(check_grad_weight(dev, DG_OP_LOWRANK_GRAD_WEIGHT, &s, acts[f],
							       f == 2, &small_tiles[k]));
				}
	gh_close(dev);
}

Test(gpu_backward, decoder_grad_weight_small, .timeout = 600)
{
	dg_device *dev = gh_open();

	gh_seed(13);
	for (int ti = 0; ti < 3; ti++)
		for (int f = 0; f < 5; f++)
			for (int k = 0; k < N_SMALL_TILES; k++) {
				shape s = { 3, 1, 40, 100, 2, times[ti] };
				free(check_grad_weight(dev, DG_OP_DECODER_GRAD_WEIGHT, &s, acts[f], f == 3,
						       &small_tiles[k]));
			}
	gh_close(dev);
}

/* A long reduction over few output tiles is split over grid z and summed
 * by the second pass; the result is bitwise the same run to run. */
Test(gpu_backward, grad_weight_split_and_reproducible, .timeout = 600)
{
	dg_device *dev = gh_open();
	shape s = { 2, 1, 40, 36, 2, 1000 };
	size_t nw = (size_t)s.H * s.L * s.E;

	for (int op = 0; op < 2; op++) {
		dg_op o = op ? DG_OP_DECODER_GRAD_WEIGHT : DG_OP_LOWRANK_GRAD_WEIGHT;
		for (int acc = 0; acc < 2; acc++) {
			gh_seed(14);
			float *a = check_grad_weight(dev, o, &s, DG_FMT_INT8, acc, NULL);
			gh_seed(14);
			float *b = check_grad_weight(dev, o, &s, DG_FMT_INT8, acc, NULL);
			gh_expect_bytes("run to run", a, b, nw * 4);
			free(a);
			free(b);
		}
	}
	gh_close(dev);
}

/* The tolerance fails a wrong layout: no device; a bf16-rounded gradient
 * (what the tensor cores compute) passes, while the same result shifted by
 * one element, read transposed, or missing the operand's scale fails — on
 * a short reduction and on a long one, where the elementwise bound alone is
 * near the RMS and the norm check is what fails. */
Test(gpu_backward, tolerance_catches_layout_errors)
{
	static const int Ts[] = { 3, 2000 };

	for (int ti = 0; ti < 2; ti++) {
		shape s = { 2, 1, 40, 36, 2, Ts[ti] };
		dg_spec sp = spec_of(DG_OP_LOWRANK_GRAD_WEIGHT, &s, DG_FMT_INT8, NULL);
		size_t ng = (size_t)s.B * s.H * s.T * s.L, nx = (size_t)s.B * s.T * s.E,
		       nw = (size_t)s.H * s.L * s.E, pl = (size_t)s.L * s.E;
		gh_seed(50 + (uint64_t)ti);
		float *g = rand_f32(ng), *gr = xmalloc(ng * 4);
		void *x = make_storage(DG_FMT_INT8, nx);
		float *ga = abs_f32(g, ng);
		void *xa = abs_storage(DG_FMT_INT8, x, nx);
		float *want = xmalloc(nw * 4), *absum = xmalloc(nw * 4), *ok = xmalloc(nw * 4),
		      *bad = xmalloc(nw * 4);
		const float sa = scale_of(DG_FMT_INT8);
		char why[256];

		for (size_t i = 0; i < ng; i++)
			gr[i] = dg_ref_bf16_to_f32(dg_ref_f32_to_bf16(g[i]));
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, g, x, sa, want, s.B, s.T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, ga, xa, sa, absum, s.B, s.T), DG_OK);
		cr_assert_eq(dg_ref_lowrank_grad_weight(&sp, gr, x, sa, ok, s.B, s.T), DG_OK);
		cr_assert(bf16_ok("bf16-rounded", ok, want, absum, nw, 2.0, why, sizeof(why)), "%s", why);
		for (size_t i = 0; i < nw; i++) /* shifted by one element */
			bad[i] = ok[(i + 1) % nw];
		cr_assert_not(bf16_ok("shifted", bad, want, absum, nw, 2.0, why, sizeof(why)));
		for (size_t i = 0; i < nw; i++) { /* each head's (L, E) read as (E, L) */
			size_t h = i / pl, r = i % pl, l = r / (size_t)s.E, e = r % (size_t)s.E;
			bad[i] = ok[h * pl + e * (size_t)s.L + l];
		}
		cr_assert_not(bf16_ok("transposed", bad, want, absum, nw, 2.0, why, sizeof(why)));
		for (size_t i = 0; i < nw; i++) /* the scale forgotten */
			bad[i] = ok[i] / sa;
		cr_assert_not(bf16_ok("unscaled", bad, want, absum, nw, 2.0, why, sizeof(why)));
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

/* --- the BDH shape ------------------------------------------------------------ */

#define BDH_H 4
#define BDH_E 256
#define BDH_L 8192
#define BDH_B 2
#define BDH_T 2048
#define SAMPLES 12

/* Value i of an i8x4 int8 storage. */
static double i8_at(const int8_t *p, size_t i)
{
	return p[i];
}

Test(gpu_backward, bdh_lowrank_grad_input_sampled, .timeout = 600)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_INPUT); /* H 4, Hin 1, E 256, L 8192, int8 */

	gh_seed(20);
	float *g = rand_f32(ng);
	int8_t *w = make_storage(DG_FMT_INT8, nw);
	float *got = xmalloc(nx * 4);
	const float sw = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tw = dg_tensor_3d("w", DG_FMT_INT8, gh_upload(dev, w, nw), BDH_H, BDH_L, BDH_E);
	tw.scale = gh_scalar(dev, sw);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc(dev, nx * 4), BDH_B, 1, BDH_T, BDH_E);
	dg_lowrank_grad_input_args a = { &tg, &tw, &tx };
	cr_assert_eq(dg_lowrank_grad_input(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tx.data, nx * 4);

	float want[BDH_E], absum[BDH_E];
	for (int smp = 0; smp < SAMPLES; smp++) {
		int b = gh_int(0, BDH_B - 1), t = smp == 0 ? BDH_T - 1 : gh_int(0, BDH_T - 1);
		double acc[BDH_E] = { 0 }, aacc[BDH_E] = { 0 };
		for (int h = 0; h < BDH_H; h++)
			for (int l = 0; l < BDH_L; l++) {
				double gv = g[(((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l];
				for (int e = 0; e < BDH_E; e++) {
					double term = gv * i8_at(w, ((size_t)h * BDH_L + l) * BDH_E + e);
					acc[e] += term;
					aacc[e] += fabs(term);
				}
			}
		for (int e = 0; e < BDH_E; e++) {
			want[e] = (float)(sw * acc[e]);
			absum[e] = (float)(sw * aacc[e]);
		}
		expect_bf16("bdh grad_x row", got + ((size_t)b * BDH_T + t) * BDH_E, want, absum, BDH_E,
			    bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(got);
	gh_close(dev);
}

Test(gpu_backward, bdh_lowrank_grad_weight_sampled, .timeout = 600)
{
	dg_device *dev = gh_open();
	const size_t ng = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_H * BDH_L * BDH_E,
		     nx = (size_t)BDH_B * BDH_T * BDH_E;
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_LOWRANK_GRAD_WEIGHT); /* act int8 */

	gh_seed(21);
	float *g = rand_f32(ng);
	int8_t *x = make_storage(DG_FMT_INT8, nx);
	float *got = xmalloc(nw * 4);
	const float sa = 1.0f / 127;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_INT8, gh_upload(dev, x, nx), BDH_B, 1, BDH_T, BDH_E);
	tx.scale = gh_scalar(dev, sa);
	dg_tensor tw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc(dev, nw * 4), BDH_H, BDH_L, BDH_E);
	dg_lowrank_grad_weight_args a = { &tg, &tx, &tw, false };
	cr_assert_eq(dg_lowrank_grad_weight(dev, &sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tw.data, nw * 4);

	float want[BDH_E], absum[BDH_E];
	for (int smp = 0; smp < SAMPLES; smp++) {
		int h = gh_int(0, BDH_H - 1), l = smp == 0 ? BDH_L - 1 : gh_int(0, BDH_L - 1);
		double acc[BDH_E] = { 0 }, aacc[BDH_E] = { 0 };
		for (int b = 0; b < BDH_B; b++)
			for (int t = 0; t < BDH_T; t++) {
				double gv = g[(((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l];
				const int8_t *xr = x + ((size_t)b * BDH_T + t) * BDH_E;
				for (int e = 0; e < BDH_E; e++) {
					acc[e] += gv * xr[e];
					aacc[e] += fabs(gv * xr[e]);
				}
			}
		for (int e = 0; e < BDH_E; e++) {
			want[e] = (float)(sa * acc[e]);
			absum[e] = (float)(sa * aacc[e]);
		}
		expect_bf16("bdh grad_w row", got + ((size_t)h * BDH_L + l) * BDH_E, want, absum, BDH_E,
			    bound_c(DG_FMT_INT8));
	}
	free(g);
	free(x);
	free(got);
	gh_close(dev);
}

Test(gpu_backward, bdh_decoder_grads_sampled, .timeout = 600)
{
	dg_device *dev = gh_open();
	const size_t HL = (size_t)BDH_H * BDH_L, ng = (size_t)BDH_B * BDH_T * BDH_E,
		     ny = (size_t)BDH_B * BDH_H * BDH_T * BDH_L, nw = (size_t)BDH_E * HL;
	const float s = 1.0f / 127;

	gh_seed(22);
	float *g = rand_f32(ng);
	int8_t *w = make_storage(DG_FMT_INT8, nw), *y = make_storage(DG_FMT_INT8, ny);
	float *gy = xmalloc(ny * 4), *gw = xmalloc(nw * 4);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, g, ng * 4), BDH_B, 1, BDH_T, BDH_E);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_INT8, gh_upload(dev, w, nw), BDH_E, (int64_t)HL);
	tw.scale = gh_scalar(dev, s);
	dg_tensor tgy = dg_tensor_4d("grad_y", DG_FMT_F32, gh_alloc(dev, ny * 4), BDH_B, BDH_H, BDH_T, BDH_L);
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_INPUT);
	dg_decoder_grad_input_args ai = { &tg, &tw, &tgy };
	cr_assert_eq(dg_decoder_grad_input(dev, &sp, &ai), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gy, tgy.data, ny * 4);

	dg_tensor ty = dg_tensor_4d("y", DG_FMT_INT8, gh_upload(dev, y, ny), BDH_B, BDH_H, BDH_T, BDH_L);
	ty.scale = gh_scalar(dev, s);
	dg_tensor tgw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc(dev, nw * 4), BDH_E, (int64_t)HL);
	dg_spec_init(&sp, DG_OP_DECODER_GRAD_WEIGHT);
	dg_decoder_grad_weight_args aw = { &tg, &ty, &tgw, false };
	cr_assert_eq(dg_decoder_grad_weight(dev, &sp, &aw), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gw, tgw.data, nw * 4);

	for (int smp = 0; smp < SAMPLES; smp++) {
		/* grad_y[b, h, t, l0 .. l0+255] */
		int b = gh_int(0, BDH_B - 1), h = gh_int(0, BDH_H - 1), t = gh_int(0, BDH_T - 1);
		int l0 = 256 * gh_int(0, BDH_L / 256 - 1);
		float want[256], absum[256];
		for (int j = 0; j < 256; j++) {
			double acc = 0, aacc = 0;
			for (int d = 0; d < BDH_E; d++) {
				double term = (double)g[((size_t)b * BDH_T + t) * BDH_E + d] *
					      w[(size_t)d * HL + (size_t)h * BDH_L + l0 + j];
				acc += term;
				aacc += fabs(term);
			}
			want[j] = (float)(s * acc);
			absum[j] = (float)(s * aacc);
		}
		expect_bf16("bdh grad_y row", gy + (((size_t)b * BDH_H + h) * BDH_T + t) * BDH_L + l0,
			    want, absum, 256, bound_c(DG_FMT_INT8));
		/* grad_w[d, c0 .. c0+255] */
		int d = smp == 0 ? BDH_E - 1 : gh_int(0, BDH_E - 1);
		size_t c0 = 256 * (size_t)gh_int(0, (int)(HL / 256) - 1);
		double acc[256] = { 0 }, aacc[256] = { 0 };
		for (int bb = 0; bb < BDH_B; bb++)
			for (int tt = 0; tt < BDH_T; tt++) {
				double gv = g[((size_t)bb * BDH_T + tt) * BDH_E + d];
				for (int j = 0; j < 256; j++) {
					size_t c = c0 + (size_t)j, hh = c / BDH_L, l = c % BDH_L;
					double term = gv * y[(((size_t)bb * BDH_H + hh) * BDH_T + tt) * BDH_L + l];
					acc[j] += term;
					aacc[j] += fabs(term);
				}
			}
		for (int j = 0; j < 256; j++) {
			want[j] = (float)(s * acc[j]);
			absum[j] = (float)(s * aacc[j]);
		}
		expect_bf16("bdh decoder grad_w row", gw + (size_t)d * HL + c0, want, absum, 256,
			    bound_c(DG_FMT_INT8));
	}
	free(g);
	free(w);
	free(y);
	free(gy);
	free(gw);
	gh_close(dev);
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

Test(gpu_backward, finite_differences_lowrank, .timeout = 600)
{
	dg_device *dev = gh_open();
	/* L 48: the default grad_input tile (BK 16) takes the tensor cores */
	const int H = 2, E = 32, L = 48, B = 2, T = 3;
	const float eps = 0.125f;

	for (int hin_i = 0; hin_i < 2; hin_i++) {
		int Hin = hin_i ? H : 1;
		size_t nx = (size_t)B * Hin * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
		gh_seed(30 + (uint64_t)Hin);
		float *x = rand_f32(nx), *w = rand_f32(nw), *r = rand_f32(no), *buf = xmalloc(no * 4);
		float *gx = xmalloc(nx * 4), *gw = xmalloc(nw * 4);
		dg_dptr dx = gh_upload(dev, x, nx * 4), dw = gh_upload(dev, w, nw * 4);
		dg_dptr dout = gh_alloc(dev, no * 4), dr = gh_upload(dev, r, no * 4);
		dg_tensor tx = dg_tensor_4d("x", DG_FMT_F32, dx, B, Hin, T, E);
		dg_tensor tw = dg_tensor_3d("w", DG_FMT_F32, dw, H, L, E);
		dg_tensor to = dg_tensor_4d("out", DG_FMT_F32, dout, B, H, T, L);
		dg_tensor tr = dg_tensor_4d("grad", DG_FMT_F32, dr, B, H, T, L);
		dg_tensor tgx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc(dev, nx * 4), B, Hin, T, E);
		dg_tensor tgw = dg_tensor_3d("grad_w", DG_FMT_F32, gh_alloc(dev, nw * 4), H, L, E);
		dg_spec fs, gis, gws;
		dg_spec_init(&fs, DG_OP_LOWRANK_FWD);
		fs.heads = H;
		fs.in_heads = Hin;
		fs.embd = E;
		fs.latent = L;
		fs.weight = fs.act = fs.out = DG_FMT_F32;
		gis = fs;
		gis.op = DG_OP_LOWRANK_GRAD_INPUT;
		gws = fs;
		gws.op = DG_OP_LOWRANK_GRAD_WEIGHT;
		dg_lowrank_fwd_args fa = { &tx, &tw, &to, 0 };
		dg_lowrank_grad_input_args ia = { &tr, &tw, &tgx };
		dg_lowrank_grad_weight_args wa = { &tr, &tx, &tgw, false };
		cr_assert_eq(dg_lowrank_grad_input(dev, &gis, &ia), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_lowrank_grad_weight(dev, &gws, &wa), DG_OK, "%s", dg_device_errmsg(dev));
		gh_download(dev, gx, tgx.data, nx * 4);
		gh_download(dev, gw, tgw.data, nw * 4);

		for (int k = 0; k < 16; k++) {
			bool on_x = k % 2 == 0;
			float *p = on_x ? x : w;
			size_t n = on_x ? nx : nw, i = (size_t)gh_int(0, (int)n - 1);
			dg_dptr dp = on_x ? dx : dw;
			float v = p[i], fd[1], an[1];

			p[i] = v + eps;
			put(dev, dp, i, p[i]);
			cr_assert_eq(dg_lowrank_fwd(dev, &fs, &fa), DG_OK, "%s", dg_device_errmsg(dev));
			double lp = loss_of(dev, dout, r, buf, no);
			p[i] = v - eps;
			put(dev, dp, i, p[i]);
			cr_assert_eq(dg_lowrank_fwd(dev, &fs, &fa), DG_OK, "%s", dg_device_errmsg(dev));
			double lm = loss_of(dev, dout, r, buf, no);
			p[i] = v;
			put(dev, dp, i, p[i]);
			fd[0] = (float)((lp - lm) / (2.0 * eps));
			an[0] = on_x ? gx[i] : gw[i];
			/* the gradient is bf16-rounded on the tensor cores:
			 * BF16_REL of its RMS, plus the differences' rounding */
			gh_expect_close(on_x ? "grad_x vs finite differences" : "grad_w vs finite differences",
					an, fd, 1,
					(float)(BF16_REL * rms_of(on_x ? gx : gw, n)) + 1e-3f, 0.0f);
		}
		free(x);
		free(w);
		free(r);
		free(buf);
		free(gx);
		free(gw);
	}
	gh_close(dev);
}

Test(gpu_backward, finite_differences_decoder, .timeout = 600)
{
	dg_device *dev = gh_open();
	/* E 48: the default grad_input tile (BK 16) takes the tensor cores */
	const int H = 2, E = 48, L = 20, B = 2, T = 3;
	const float eps = 0.125f;
	size_t ny = (size_t)B * H * T * L, nw = (size_t)E * H * L, no = (size_t)B * T * E;

	gh_seed(40);
	float *y = rand_f32(ny), *w = rand_f32(nw), *r = rand_f32(no), *buf = xmalloc(no * 4);
	float *gy = xmalloc(ny * 4), *gw = xmalloc(nw * 4);
	dg_dptr dy = gh_upload(dev, y, ny * 4), dw = gh_upload(dev, w, nw * 4);
	dg_dptr dout = gh_alloc(dev, no * 4), dr = gh_upload(dev, r, no * 4);
	dg_tensor ty = dg_tensor_4d("y", DG_FMT_F32, dy, B, H, T, L);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_F32, dw, E, (int64_t)H * L);
	dg_tensor to = dg_tensor_4d("out", DG_FMT_F32, dout, B, 1, T, E);
	dg_tensor tr = dg_tensor_4d("grad", DG_FMT_F32, dr, B, 1, T, E);
	dg_tensor tgy = dg_tensor_4d("grad_y", DG_FMT_F32, gh_alloc(dev, ny * 4), B, H, T, L);
	dg_tensor tgw = dg_tensor_2d("grad_w", DG_FMT_F32, gh_alloc(dev, nw * 4), E, (int64_t)H * L);
	dg_spec fs, gis, gws;
	dg_spec_init(&fs, DG_OP_DECODER_FWD);
	fs.heads = H;
	fs.embd = E;
	fs.latent = L;
	fs.weight = fs.act = fs.out = DG_FMT_F32;
	gis = fs;
	gis.op = DG_OP_DECODER_GRAD_INPUT;
	gws = fs;
	gws.op = DG_OP_DECODER_GRAD_WEIGHT;
	dg_decoder_fwd_args fa = { &ty, &tw, &to };
	dg_decoder_grad_input_args ia = { &tr, &tw, &tgy };
	dg_decoder_grad_weight_args wa = { &tr, &ty, &tgw, false };
	cr_assert_eq(dg_decoder_grad_input(dev, &gis, &ia), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_decoder_grad_weight(dev, &gws, &wa), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, gy, tgy.data, ny * 4);
	gh_download(dev, gw, tgw.data, nw * 4);

	for (int k = 0; k < 16; k++) {
		bool on_y = k % 2 == 0;
		float *p = on_y ? y : w;
		size_t n = on_y ? ny : nw, i = (size_t)gh_int(0, (int)n - 1);
		dg_dptr dp = on_y ? dy : dw;
		float v = p[i], fd[1], an[1];

		p[i] = v + eps;
		put(dev, dp, i, p[i]);
		cr_assert_eq(dg_decoder_fwd(dev, &fs, &fa), DG_OK, "%s", dg_device_errmsg(dev));
		double lp = loss_of(dev, dout, r, buf, no);
		p[i] = v - eps;
		put(dev, dp, i, p[i]);
		cr_assert_eq(dg_decoder_fwd(dev, &fs, &fa), DG_OK, "%s", dg_device_errmsg(dev));
		double lm = loss_of(dev, dout, r, buf, no);
		p[i] = v;
		put(dev, dp, i, p[i]);
		fd[0] = (float)((lp - lm) / (2.0 * eps));
		an[0] = on_y ? gy[i] : gw[i];
		gh_expect_close(on_y ? "grad_y vs finite differences" : "grad_w vs finite differences",
				an, fd, 1, (float)(BF16_REL * rms_of(on_y ? gy : gw, n)) + 1e-3f,
				0.0f);
	}
	free(y);
	free(w);
	free(r);
	free(buf);
	free(gy);
	free(gw);
	gh_close(dev);
}
