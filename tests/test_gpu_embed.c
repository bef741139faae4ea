/*
 * GPU tests of the embed family (embed_fwd, embed_bwd; templates/embed.lua,
 * runtime/ops/embed.c) against dg_ref_embed_fwd / dg_ref_embed_bwd, bit for
 * bit: the forward copies (and rounds to bf16 as the reference does), the
 * backward adds each vocab row's dout rows in token order in f32, the
 * reference's order. Shapes: E 32, 96, 256; V 50, 256, 1000; R 1, 37, and
 * BDH's 4096 x 256 x 256; a skewed batch (every token the same); outputs
 * start as 0xff so an unwritten element fails.
 *
 * Out-of-vocabulary tokens (-1, V, INT32_MAX, INT32_MIN): the forward
 * writes their rows as zeros and sets the caller's bad int32 to 1 (left
 * at 0 when every token is valid; bad = 0 passes no flag); the backward
 * adds nothing for them. Skips without a device (gh_open).
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "rows_helpers.h"
#include "runtime/ref/ref_ops.h"

static const dg_fmt FL[2] = { DG_FMT_F32, DG_FMT_BF16 };

static dg_spec embed_spec(dg_op op, dg_fmt f, int E, int V)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.embd = E;
	s.vocab = V;
	if (op == DG_OP_EMBED_FWD)
		s.out = f;
	else
		s.src = f;
	return s;
}

static int32_t *tokens(int64_t R, int V, int same)
{
	int32_t *t = gh_xmalloc((size_t)R * 4);
	for (int64_t i = 0; i < R; i++)
		t[i] = same >= 0 ? same : gh_int(0, V - 1);
	return t;
}

typedef struct emb_run {
	dg_device *dev;
	dg_spec s;
	dg_tensor idx, in, out;
	dg_dptr bad;
	bool accumulate;
} emb_run;

static void emb_call(void *ctx)
{
	emb_run *e = ctx;
	dg_status st;
	if (e->s.op == DG_OP_EMBED_FWD) {
		dg_embed_fwd_args a = { .idx = &e->idx, .table = &e->in, .out = &e->out, .bad = e->bad };
		st = dg_embed_fwd(e->dev, &e->s, &a);
	} else {
		dg_embed_bwd_args a = { .idx = &e->idx, .dout = &e->in, .dtable = &e->out, .accumulate = e->accumulate };
		st = dg_embed_bwd(e->dev, &e->s, &a);
	}
	cr_assert_eq(st, DG_OK, "%s", dg_device_errmsg(e->dev));
}

/* embed_fwd at (R, E, V) with out format f; bad_rows rows get tokens out
 * of the vocabulary. */
static void fwd_case(dg_device *dev, dg_fmt f, int E, int V, int64_t R, int bad_rows, bool report)
{
	static const int32_t oov[4] = { -1, 0, INT32_MAX, INT32_MIN };
	size_t n = (size_t)R * (size_t)E, ob = n * rw_size(f);
	int32_t *t = tokens(R, V, -1);
	float *table = rw_rand((size_t)V * (size_t)E, -1.0f, 1.0f), *wf = gh_xmalloc(n * 4);
	void *want = gh_xmalloc(ob), *got = gh_xmalloc(ob);
	char what[128];

	for (int i = 0; i < bad_rows; i++)
		t[(int64_t)i * 7 % R] = i % 4 == 1 ? V : oov[i % 4];
	/* the reference of the valid rows; the others are zero */
	for (int64_t r = 0; r < R; r++) {
		bool ok = t[r] >= 0 && t[r] < V;
		for (int e = 0; e < E; e++)
			wf[r * E + e] = ok ? table[(int64_t)t[r] * E + e] : 0.0f;
	}
	if (!bad_rows) {
		float *ref = gh_xmalloc(n * 4);
		cr_assert_eq(dg_ref_embed_fwd(table, V, E, t, R, ref, NULL), DG_OK);
		cr_assert(memcmp(ref, wf, n * 4) == 0);
		free(ref);
	}
	rw_store(f, wf, n, want);

	emb_run e = { .dev = dev, .s = embed_spec(DG_OP_EMBED_FWD, f, E, V) };
	e.idx = dg_tensor_1d("idx", DG_FMT_I32, gh_upload(dev, t, (size_t)R * 4), R);
	e.in = dg_tensor_2d("table", DG_FMT_F32, gh_upload(dev, table, (size_t)V * E * 4), V, E);
	e.out = dg_tensor_2d("out", f, gh_alloc_ff(dev, ob), R, E);
	e.bad = gh_alloc(dev, 4);
	emb_call(&e);
	gh_download(dev, got, e.out.data, ob);
	int32_t flag = -1;
	gh_download(dev, &flag, e.bad, 4);
	snprintf(what, sizeof(what), "embed_fwd %s E=%d V=%d R=%lld bad=%d", dg_fmt_name(f), E, V, (long long)R,
		 bad_rows);
	gh_expect_bytes(what, got, want, ob);
	cr_assert_eq(flag, bad_rows ? 1 : 0, "%s: bad flag %d", what, flag);
	/* no flag: the same rows, nothing else written */
	e.bad = 0;
	cr_assert_eq(dg_memset8(dev, e.out.data, 0xff, ob), DG_OK);
	emb_call(&e);
	gh_download(dev, got, e.out.data, ob);
	gh_expect_bytes(what, got, want, ob);
	if (report)
		rw_report(dev, &e.s, NULL, what, emb_call, &e, 20);
	free(t);
	free(table);
	free(wf);
	free(want);
	free(got);
}

Test(gpu_embed, fwd)
{
	static const int E[] = { 32, 96, 256 }, V[] = { 50, 256, 1000 };
	static const int64_t R[] = { 1, 37 };
	dg_device *dev = gh_open();
	gh_seed(31);
	for (int a = 0; a < 2; a++) {
		for (int e = 0; e < 3; e++)
			for (int v = 0; v < 3; v++)
				for (int r = 0; r < 2; r++)
					fwd_case(dev, FL[a], E[e], V[v], R[r], 0, false);
		fwd_case(dev, FL[a], 256, 256, 4096, 0, true); /* BDH */
	}
	gh_close(dev);
}

Test(gpu_embed, fwd_out_of_vocabulary)
{
	dg_device *dev = gh_open();
	gh_seed(32);
	fwd_case(dev, DG_FMT_F32, 96, 50, 37, 5, false);
	fwd_case(dev, DG_FMT_BF16, 256, 256, 4096, 9, false);
	fwd_case(dev, DG_FMT_F32, 32, 2, 1, 1, false);
	gh_close(dev);
}

/* embed_bwd at (R, E, V): dtable against the reference on the valid
 * tokens (same: every token that id; bad_rows out of the vocabulary). */
static void bwd_case(dg_device *dev, dg_fmt f, int E, int V, int64_t R, int same, int bad_rows,
		     bool accumulate, bool report)
{
	size_t n = (size_t)R * (size_t)E, nt = (size_t)V * (size_t)E;
	int32_t *t = tokens(R, V, same), *vt = gh_xmalloc((size_t)R * 4);
	float *d = rw_rand(n, -1.0f, 1.0f), *vd = gh_xmalloc(n * 4);
	float *prior = rw_rand(nt, -1.0f, 1.0f), *want = gh_xmalloc(nt * 4), *got = gh_xmalloc(nt * 4);
	void *ds = gh_xmalloc(n * 4);
	char what[160];

	for (int i = 0; i < bad_rows; i++)
		t[(int64_t)i * 5 % R] = i % 2 ? V + i : -1 - i;
	rw_store(f, d, n, ds);
	rw_load(f, ds, n, d); /* what the kernel reads */
	int64_t nv = 0;
	for (int64_t r = 0; r < R; r++)
		if (t[r] >= 0 && t[r] < V) {
			vt[nv] = t[r];
			memcpy(vd + nv * E, d + r * E, (size_t)E * 4);
			nv++;
		}
	if (accumulate)
		memcpy(want, prior, nt * 4);
	else
		memset(want, 0, nt * 4);
	dg_ref_embed_bwd(vd, E, vt, nv, want);

	emb_run e = { .dev = dev, .s = embed_spec(DG_OP_EMBED_BWD, f, E, V), .accumulate = accumulate };
	e.idx = dg_tensor_1d("idx", DG_FMT_I32, gh_upload(dev, t, (size_t)R * 4), R);
	e.in = dg_tensor_2d("dout", f, gh_upload(dev, ds, n * rw_size(f)), R, E);
	e.out = dg_tensor_2d("dtable", DG_FMT_F32, accumulate ? gh_upload(dev, prior, nt * 4) : gh_alloc_ff(dev, nt * 4),
			     V, E);
	emb_call(&e);
	gh_download(dev, got, e.out.data, nt * 4);
	snprintf(what, sizeof(what), "embed_bwd %s E=%d V=%d R=%lld same=%d bad=%d%s", dg_fmt_name(f), E, V,
		 (long long)R, same, bad_rows, accumulate ? " accumulate" : "");
	gh_expect_bytes(what, got, want, nt * 4);
	if (report) {
		e.accumulate = false;
		rw_report(dev, &e.s, NULL, what, emb_call, &e, 20);
	}
	free(t);
	free(vt);
	free(d);
	free(vd);
	free(prior);
	free(want);
	free(got);
	free(ds);
}

Test(gpu_embed, bwd)
{
	static const int E[] = { 32, 96, 256 }, V[] = { 50, 256, 1000 };
	static const int64_t R[] = { 1, 37 };
	dg_device *dev = gh_open();
	gh_seed(33);
	for (int a = 0; a < 2; a++) {
		for (int e = 0; e < 3; e++)
			for (int v = 0; v < 3; v++)
				for (int r = 0; r < 2; r++)
					bwd_case(dev, FL[a], E[e], V[v], R[r], -1, 0, (e + v + r) % 2, false);
		bwd_case(dev, FL[a], 256, 256, 4096, -1, 0, false, true); /* BDH */
		bwd_case(dev, FL[a], 256, 256, 4096, -1, 0, true, false);
	}
	/* every token one id: one block sums all the rows, in order */
	bwd_case(dev, DG_FMT_F32, 256, 256, 4096, 3, 0, false, false);
	/* wider rows than a block's threads (column chunks) */
	bwd_case(dev, DG_FMT_BF16, 1000, 3, 300, -1, 0, false, false);
	gh_close(dev);
}

/* Vocabularies whose units hold several vocab rows (templates/embed.lua
 * vocab_rows: 2 from V 2048, 32 from 32768): llm.c's 50304 at the BDH
 * rows (timed), a ragged last unit (5001: units of 4, the last of one
 * row), column chunks with units of 8 (E 1000, V 9000), every token the
 * last vocab row, and tokens outside the vocabulary. */
Test(gpu_embed, bwd_large_vocab)
{
	dg_device *dev = gh_open();
	gh_seed(35);
	for (int a = 0; a < 2; a++) {
		bwd_case(dev, FL[a], 256, 50304, 4096, -1, 0, false, true);
		bwd_case(dev, FL[a], 256, 50304, 4096, -1, 0, true, false);
	}
	bwd_case(dev, DG_FMT_BF16, 96, 5001, 300, -1, 0, true, false);
	bwd_case(dev, DG_FMT_F32, 1000, 9000, 300, -1, 0, false, false);
	bwd_case(dev, DG_FMT_F32, 256, 50304, 4096, 50303, 0, false, false);
	bwd_case(dev, DG_FMT_BF16, 256, 50304, 4096, -1, 9, true, false);
	gh_close(dev);
}

Test(gpu_embed, bwd_skips_out_of_vocabulary)
{
	dg_device *dev = gh_open();
	gh_seed(34);
	bwd_case(dev, DG_FMT_F32, 96, 50, 37, -1, 6, false, false);
	bwd_case(dev, DG_FMT_BF16, 256, 256, 4096, -1, 11, true, false);
	gh_close(dev);
}

/* Zero rows: the forward writes nothing; the backward still writes dtable
 * (zeros without accumulate). */
Test(gpu_embed, zero_rows)
{
	dg_device *dev = gh_open();
	dg_dptr p = gh_alloc(dev, 256), tab = gh_alloc_ff(dev, 50 * 32 * 4), o = gh_alloc_ff(dev, 256);
	dg_spec s = embed_spec(DG_OP_EMBED_BWD, DG_FMT_F32, 32, 50);
	dg_tensor idx = dg_tensor_1d("idx", DG_FMT_I32, p, 0), dout = dg_tensor_2d("dout", DG_FMT_F32, o, 0, 32);
	dg_tensor dt = dg_tensor_2d("dtable", DG_FMT_F32, tab, 50, 32);
	dg_embed_bwd_args a = { .idx = &idx, .dout = &dout, .dtable = &dt };
	cr_assert_eq(dg_embed_bwd(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	float *got = gh_xmalloc(50 * 32 * 4), *zero = gh_xmalloc(50 * 32 * 4);
	memset(zero, 0, 50 * 32 * 4);
	gh_download(dev, got, tab, 50 * 32 * 4);
	gh_expect_bytes("dtable of no tokens", got, zero, 50 * 32 * 4);
	dg_spec f = embed_spec(DG_OP_EMBED_FWD, DG_FMT_F32, 32, 50);
	dg_tensor out = dg_tensor_2d("out", DG_FMT_F32, o, 0, 32);
	dg_embed_fwd_args b = { .idx = &idx, .table = &dt, .out = &out };
	cr_assert_eq(dg_embed_fwd(dev, &f, &b), DG_OK, "%s", dg_device_errmsg(dev));
	free(got);
	free(zero);
	gh_close(dev);
}
