/*
 * GPU tests of the norm family (layernorm_fwd/_bwd, resid_ln_fwd/_bwd;
 * templates/norm.lua, runtime/ops/norm.c) against the CPU references
 * (dg_ref_layernorm_fwd/_bwd through dg_ref_run), at small odd shapes
 * (E 32, 96; R 1, 7, 37) and at BDH's (R 4096, E 256), every src × out
 * pair. Outputs start as 0xff (NaN), so an element never written fails.
 *
 * Bounds (the reference sums in double; the kernels in f32, fixed order):
 *   rstd          |Δ| ≤ 1e-5·|ref|
 *   y, out (f32)  |Δ| ≤ 2e-5 + 2e-5·|ref|
 *   y, out (bf16) |Δ| ≤ 1e-5 + 2^-7·|ref| (one bf16 ulp: an f32 value
 *                 within rounding of a bf16 midpoint may round either way)
 *   dx, dy        |Δ| ≤ 1e-5·max|ref| + 1e-5·|ref| (f32 out; a bf16 y
 *                 input is decoded exactly, as the reference reads it)
 * Inputs are uniform in [-2, 2) plus a per-row offset in [-1, 1), so the
 * mean does not vanish. Two runs are bitwise equal; resid_ln_bwd's dx
 * (overwrite) is bitwise its dy. Skips without a device (gh_open).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "rows_helpers.h"
#include "runtime/ref/ref_ops.h"

#define EPS 1e-5f

static const dg_fmt FL[2] = { DG_FMT_F32, DG_FMT_BF16 };

/* R rows of E: uniform [-2, 2) plus a row offset, stored in f. */
static void *rows_in(dg_fmt f, int64_t R, int E)
{
	size_t n = (size_t)R * (size_t)E;
	float *v = rw_rand(n, -2.0f, 2.0f);
	for (int64_t r = 0; r < R; r++) {
		float off = gh_uniform(-1.0f, 1.0f);
		for (int e = 0; e < E; e++)
			v[r * E + e] += off;
	}
	void *s = gh_xmalloc(n * 4);
	rw_store(f, v, n, s);
	free(v);
	return s;
}

static dg_spec norm_spec(dg_op op, dg_fmt src, dg_fmt out, int E)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.src = src;
	s.embd = E;
	if (op == DG_OP_LAYERNORM_FWD || op == DG_OP_RESID_LN_FWD)
		s.out = out;
	return s;
}

/* ---- forwards ------------------------------------------------------------------ */

typedef struct fwd_run {
	dg_device *dev;
	dg_spec s;
	dg_tensor x, y, out, rstd;
} fwd_run;

static void fwd_call(void *ctx)
{
	fwd_run *f = ctx;
	dg_status st;
	if (f->s.op == DG_OP_LAYERNORM_FWD) {
		dg_layernorm_fwd_args a = { .x = &f->x, .y = &f->out, .rstd = &f->rstd, .eps = EPS };
		st = dg_layernorm_fwd(f->dev, &f->s, &a);
	} else {
		dg_resid_ln_fwd_args a = { .x = &f->x, .y = &f->y, .out = &f->out, .rstd = &f->rstd, .eps = EPS };
		st = dg_resid_ln_fwd(f->dev, &f->s, &a);
	}
	cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(f->dev));
}

static void fwd_case(dg_device *dev, dg_op op, dg_fmt src, dg_fmt out, int E, int64_t R, bool report)
{
	bool resid = op == DG_OP_RESID_LN_FWD;
	size_t n = (size_t)R * (size_t)E, ob = n * rw_size(out);
	void *x = rows_in(src, R, E), *y = resid ? rows_in(src, R, E) : NULL;
	void *want = gh_xmalloc(ob), *got = gh_xmalloc(ob), *got2 = gh_xmalloc(ob);
	float *wr = gh_xmalloc((size_t)R * 4), *gr = gh_xmalloc((size_t)R * 4), *gr2 = gh_xmalloc((size_t)R * 4);
	char what[128];

	fwd_run f = { .dev = dev, .s = norm_spec(op, src, out, E) };
	f.x = dg_tensor_2d("x", src, gh_upload(dev, x, n * rw_size(src)), R, E);
	if (resid)
		f.y = dg_tensor_2d("y", src, gh_upload(dev, y, n * rw_size(src)), R, E);
	f.out = dg_tensor_2d(resid ? "out" : "y", out, gh_alloc_ff(dev, ob), R, E);
	f.rstd = dg_tensor_1d("rstd", DG_FMT_F32, gh_alloc_ff(dev, (size_t)R * 4), R);
	fwd_call(&f);
	gh_download(dev, got, f.out.data, ob);
	gh_download(dev, gr, f.rstd.data, (size_t)R * 4);

	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	rc.in[0] = x;
	rc.in[1] = y;
	rc.r = R;
	rc.eps = EPS;
	rc.outs[resid ? 2 : 1] = want;
	rc.outs[resid ? 3 : 2] = wr;
	cr_assert_eq(dg_ref_run(&f.s, &rc), DG_OK);
	snprintf(what, sizeof(what), "%s %s->%s E=%d R=%lld", dg_op_name(op), dg_fmt_name(src),
		 dg_fmt_name(out), E, (long long)R);
	gh_expect_close(what, gr, wr, (size_t)R, 0.0f, 1e-5f);
	if (out == DG_FMT_BF16)
		rw_expect_close(what, out, got, want, n, 1e-5f, 0.0078125f);
	else
		rw_expect_close(what, out, got, want, n, 2e-5f, 2e-5f);

	/* the same bits again, from outputs refilled with 0xff */
	cr_assert_eq(dg_memset8(dev, f.out.data, 0xff, ob), DG_OK);
	cr_assert_eq(dg_memset8(dev, f.rstd.data, 0xff, (size_t)R * 4), DG_OK);
	fwd_call(&f);
	gh_download(dev, got2, f.out.data, ob);
	gh_download(dev, gr2, f.rstd.data, (size_t)R * 4);
	cr_assert(memcmp(got, got2, ob) == 0 && memcmp(gr, gr2, (size_t)R * 4) == 0, "%s: two runs differ", what);
	if (report)
		rw_report(dev, &f.s, NULL, what, fwd_call, &f, 20);
	free(x);
	free(y);
	free(want);
	free(got);
	free(got2);
	free(wr);
	free(gr);
	free(gr2);
}

static void fwd_all(dg_op op)
{
	static const int E[] = { 32, 96, 256 };
	static const int64_t R[] = { 1, 7, 37 };
	dg_device *dev = gh_open();
	gh_seed(10 + (uint64_t)op);
	for (int a = 0; a < 2; a++)
		for (int b = 0; b < 2; b++) {
			for (int e = 0; e < 3; e++)
				for (int r = 0; r < 3; r++)
					fwd_case(dev, op, FL[a], FL[b], E[e], R[r], false);
			fwd_case(dev, op, FL[a], FL[b], 256, 4096, true); /* BDH */
		}
	fwd_case(dev, op, DG_FMT_F32, DG_FMT_F32, 2048, 33, false); /* the widest row */
	gh_close(dev);
}

Test(gpu_norm, layernorm_fwd)
{
	fwd_all(DG_OP_LAYERNORM_FWD);
}

Test(gpu_norm, resid_ln_fwd)
{
	fwd_all(DG_OP_RESID_LN_FWD);
}

/* ---- backwards ----------------------------------------------------------------- */

typedef struct bwd_run {
	dg_device *dev;
	dg_spec s;
	dg_tensor g, y, rstd, dx, dy;
	bool accumulate;
} bwd_run;

static void bwd_call(void *ctx)
{
	bwd_run *b = ctx;
	dg_status st;
	if (b->s.op == DG_OP_LAYERNORM_BWD) {
		dg_layernorm_bwd_args a = { .dy = &b->g, .y = &b->y, .rstd = &b->rstd, .dx = &b->dx,
					    .accumulate = b->accumulate };
		st = dg_layernorm_bwd(b->dev, &b->s, &a);
	} else {
		dg_resid_ln_bwd_args a = { .dout = &b->g, .out = &b->y, .rstd = &b->rstd, .dx = &b->dx,
					   .dy = &b->dy, .accumulate = b->accumulate };
		st = dg_resid_ln_bwd(b->dev, &b->s, &a);
	}
	cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(b->dev));
}

static void bwd_case(dg_device *dev, dg_op op, dg_fmt src, int E, int64_t R, bool accumulate, bool report)
{
	bool resid = op == DG_OP_RESID_LN_BWD;
	size_t n = (size_t)R * (size_t)E;
	float *g = rw_rand(n, -1.0f, 1.0f), *prior = rw_rand(n, -1.0f, 1.0f);
	float *yf = gh_xmalloc(n * 4), *rs = gh_xmalloc((size_t)R * 4), *xf = gh_xmalloc(n * 4);
	void *ys = gh_xmalloc(n * 4);
	float *want = gh_xmalloc(n * 4), *wdy = gh_xmalloc(n * 4);
	float *got = gh_xmalloc(n * 4), *gdy = gh_xmalloc(n * 4), *again = gh_xmalloc(n * 4);
	char what[128];

	/* a real forward's y and rstd, y stored in src */
	void *x = rows_in(DG_FMT_F32, R, E);
	memcpy(xf, x, n * 4);
	dg_ref_layernorm_fwd(xf, R, E, EPS, yf, NULL, rs);
	rw_store(src, yf, n, ys);

	bwd_run b = { .dev = dev, .s = norm_spec(op, src, DG_FMT_F32, E), .accumulate = accumulate };
	b.g = dg_tensor_2d(resid ? "dout" : "dy", DG_FMT_F32, gh_upload(dev, g, n * 4), R, E);
	b.y = dg_tensor_2d(resid ? "out" : "y", src, gh_upload(dev, ys, n * rw_size(src)), R, E);
	b.rstd = dg_tensor_1d("rstd", DG_FMT_F32, gh_upload(dev, rs, (size_t)R * 4), R);
	b.dx = dg_tensor_2d("dx", DG_FMT_F32, accumulate ? gh_upload(dev, prior, n * 4) : gh_alloc_ff(dev, n * 4), R, E);
	if (resid)
		b.dy = dg_tensor_2d("dy", DG_FMT_F32, gh_alloc_ff(dev, n * 4), R, E);
	bwd_call(&b);
	gh_download(dev, got, b.dx.data, n * 4);
	if (resid)
		gh_download(dev, gdy, b.dy.data, n * 4);

	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	rc.in[0] = g;
	rc.in[1] = ys;
	rc.in[2] = rs;
	rc.r = R;
	rc.accumulate = accumulate;
	memcpy(want, prior, n * 4);
	rc.outs[3] = want;
	rc.outs[4] = resid ? wdy : NULL;
	cr_assert_eq(dg_ref_run(&b.s, &rc), DG_OK);
	snprintf(what, sizeof(what), "%s %s E=%d R=%lld%s", dg_op_name(op), dg_fmt_name(src), E, (long long)R,
		 accumulate ? " accumulate" : "");
	gh_expect_close(what, got, want, n, 1e-5f * rw_absmax(want, n), 1e-5f);
	if (resid) {
		gh_expect_close(what, gdy, wdy, n, 1e-5f * rw_absmax(wdy, n), 1e-5f);
		if (!accumulate)
			cr_assert(memcmp(got, gdy, n * 4) == 0, "%s: dx and dy differ", what);
	}
	/* run to run: the same bits */
	cr_assert_eq(dg_memcpy_htod(dev, b.dx.data, prior, n * 4), DG_OK);
	bwd_call(&b);
	gh_download(dev, again, b.dx.data, n * 4);
	cr_assert(memcmp(got, again, n * 4) == 0, "%s: two runs (from the same dx) differ", what);
	if (report) {
		b.accumulate = false;
		rw_report(dev, &b.s, NULL, what, bwd_call, &b, 20);
	}
	free(g);
	free(prior);
	free(yf);
	free(rs);
	free(xf);
	free(ys);
	free(x);
	free(want);
	free(wdy);
	free(got);
	free(gdy);
	free(again);
}

static void bwd_all(dg_op op)
{
	static const int E[] = { 32, 96, 256 };
	static const int64_t R[] = { 1, 7, 37 };
	dg_device *dev = gh_open();
	gh_seed(20 + (uint64_t)op);
	for (int a = 0; a < 2; a++) {
		for (int e = 0; e < 3; e++)
			for (int r = 0; r < 3; r++)
				bwd_case(dev, op, FL[a], E[e], R[r], r == 1, false);
		bwd_case(dev, op, FL[a], 256, 4096, false, true); /* BDH */
		bwd_case(dev, op, FL[a], 256, 4096, true, false);
	}
	bwd_case(dev, op, DG_FMT_BF16, 2048, 33, false, false);
	gh_close(dev);
}

Test(gpu_norm, layernorm_bwd)
{
	bwd_all(DG_OP_LAYERNORM_BWD);
}

Test(gpu_norm, resid_ln_bwd)
{
	bwd_all(DG_OP_RESID_LN_BWD);
}

/* Zero rows launch nothing and succeed; a bad eps is refused on the device
 * too, before anything runs. */
Test(gpu_norm, zero_rows_and_bad_eps)
{
	dg_device *dev = gh_open();
	dg_dptr p = gh_alloc_ff(dev, 256 * 4 * 4), q = gh_alloc_ff(dev, 256 * 4 * 4), r = gh_alloc_ff(dev, 64);
	dg_spec s = norm_spec(DG_OP_LAYERNORM_FWD, DG_FMT_F32, DG_FMT_F32, 256);
	dg_tensor x = dg_tensor_2d("x", DG_FMT_F32, p, 0, 256), y = dg_tensor_2d("y", DG_FMT_F32, q, 0, 256);
	dg_tensor rs = dg_tensor_1d("rstd", DG_FMT_F32, r, 0);
	dg_layernorm_fwd_args a = { .x = &x, .y = &y, .rstd = &rs, .eps = EPS };
	cr_assert_eq(dg_layernorm_fwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	x.shape[0] = y.shape[0] = rs.shape[0] = 4;
	a.eps = -1.0f;
	cr_assert_eq(dg_layernorm_fwd(dev, &s, &a), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "eps="), "%s", dg_device_errmsg(dev));
	uint32_t w[4];
	gh_download(dev, w, q, sizeof(w));
	cr_assert_eq(w[0], 0xffffffffu, "y was written by a refused call");
	gh_close(dev);
}
