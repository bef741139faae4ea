/*
 * The test harness every suite, the tuner and the bench share, tested as
 * an oracle:
 *   - the one tolerance check (dg_ref_same_bytes, dg_ref_close,
 *     dg_ref_close_norm, dg_ref_within) passes the true result and fails
 *     the same result shifted by one element, read transposed, or missing
 *     an operand's scale, each with a message saying how many differ;
 *   - dg_rng is splitmix64 (its published first value), deterministic, and
 *     dg_rng_fill writes only codes each format holds (never a ternary
 *     pair 10, int8 never -128, int4 within ±7, ...);
 *   - dg_ref_run reaches every op's reference in the op table's argument
 *     order: the same bytes as calling the reference directly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/ref.h"
#include "dragon/rng.h"
#include "dragon/spec.h"
#include "helpers.h"
#include "ref_helpers.h"
#include "runtime/ref/ref_ops.h"

/* ---- the tolerance check ------------------------------------------------------ */

/* A lowrank_grad_weight case: (H, L, E) = (2, 40, 36) from B = 2 and T
 * steps of int8 x. want: the exact gradient; ok: the one a bf16 tensor
 * core computes (grad rounded to bf16 first); bound: 2·2^-8·Σ|grad·x|, the
 * rounding model's per-element bound. */
typedef struct gw_case {
	dg_spec spec;
	int T;
	size_t n, plane; /* H·L·E, L·E */
	float sa;
	float *want, *ok, *bound, *bad;
} gw_case;

static void gw_make(gw_case *c, int T, uint64_t seed)
{
	dg_rng r;
	const int B = 2, H = 2, L = 40, E = 36;
	dg_spec_init(&c->spec, DG_OP_LOWRANK_GRAD_WEIGHT);
	c->spec.heads = H;
	c->spec.in_heads = 1;
	c->spec.latent = L;
	c->spec.embd = E;
	c->spec.act = DG_FMT_INT8;
	c->T = T;
	c->sa = 0.0123f;
	c->n = (size_t)H * L * E;
	c->plane = (size_t)L * E;
	size_t ng = (size_t)B * H * T * L, nx = (size_t)B * T * E;
	float *g = rh_xmalloc(ng * 4), *gr = rh_xmalloc(ng * 4), *ga = rh_xmalloc(ng * 4);
	int8_t *x = rh_xmalloc(nx), *xa = rh_xmalloc(nx);
	dg_rng_seed(&r, seed);
	dg_rng_fill(&r, DG_FMT_F32, g, ng);
	dg_rng_fill(&r, DG_FMT_INT8, x, nx);
	for (size_t i = 0; i < ng; i++) {
		gr[i] = dg_bf16_to_f32(dg_f32_to_bf16(g[i]));
		ga[i] = fabsf(g[i]);
	}
	for (size_t i = 0; i < nx; i++)
		xa[i] = (int8_t)abs(x[i]);
	c->want = rh_xmalloc(c->n * 4);
	c->ok = rh_xmalloc(c->n * 4);
	c->bound = rh_xmalloc(c->n * 4);
	c->bad = rh_xmalloc(c->n * 4);
	cr_assert_eq(dg_ref_lowrank_grad_weight(&c->spec, g, x, c->sa, c->want, B, T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_weight(&c->spec, gr, x, c->sa, c->ok, B, T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_weight(&c->spec, ga, xa, c->sa, c->bound, B, T), DG_OK);
	for (size_t i = 0; i < c->n; i++)
		c->bound[i] *= 2.0f / 256.0f;
	free(g);
	free(gr);
	free(ga);
	free(x);
	free(xa);
}

static void gw_free(gw_case *c)
{
	free(c->want);
	free(c->ok);
	free(c->bound);
	free(c->bad);
}

/* The three wrong layouts of ok into c->bad: 0 shifted by one element,
 * 1 each head's (L, E) read as (E, L), 2 the scale sa forgotten. */
static const char *const wrong_names[] = { "shifted", "transposed", "unscaled" };

static void gw_wrong(gw_case *c, int how)
{
	size_t E = (size_t)c->spec.embd, L = (size_t)c->spec.latent;
	for (size_t i = 0; i < c->n; i++) {
		size_t h = i / c->plane, rr = i % c->plane, l = rr / E, e = rr % E;
		c->bad[i] = how == 0 ? c->ok[(i + 1) % c->n]
			    : how == 1 ? c->ok[h * c->plane + e * L + l]
				       : c->ok[i] / c->sa;
	}
}

/* Every check on a short reduction (T = 3) and a long one (T = 2000),
 * where the elementwise bound alone is near the RMS and the norm is what
 * fails. */
Test(compare, tolerance_catches_layout_errors)
{
	static const int Ts[] = { 3, 2000 };
	char why[512];

	for (int ti = 0; ti < 2; ti++) {
		gw_case c;
		gw_make(&c, Ts[ti], 50 + (uint64_t)ti);
		/* the true result passes every check */
		cr_assert(dg_ref_close_norm(c.ok, c.want, c.n, 1e-2, 2e-2f, why, sizeof(why)), "T=%d: %s", c.T, why);
		cr_assert(dg_ref_within(c.ok, c.want, c.bound, c.n, why, sizeof(why)), "T=%d: %s", c.T, why);
		float wmax = 0.0f;
		for (size_t i = 0; i < c.n; i++)
			wmax = fmaxf(wmax, fabsf(c.want[i]));
		const float atol = 2e-2f * wmax; /* a rounded sum that cancels is off by a part of the largest */
		cr_assert(dg_ref_close(DG_FMT_F32, c.ok, c.want, c.n, atol, 0.0f, why, sizeof(why)), "T=%d: %s",
			  c.T, why);
		cr_assert(dg_ref_close(DG_FMT_F32, c.want, c.want, c.n, 0.0f, 0.0f, why, sizeof(why)));
		cr_assert(dg_ref_same_bytes(c.want, c.want, c.n * 4, why, sizeof(why)));
		for (int how = 0; how < 3; how++) {
			gw_wrong(&c, how);
			why[0] = '\0';
			cr_assert_not(dg_ref_close_norm(c.bad, c.want, c.n, 1e-2, 2e-2f, why, sizeof(why)),
				      "T=%d: close_norm passed %s", c.T, wrong_names[how]);
			cr_assert(strstr(why, "norm error"), "%s", why);
			cr_assert_not(dg_ref_within(c.bad, c.want, c.bound, c.n, why, sizeof(why)),
				      "T=%d: within passed %s", c.T, wrong_names[how]);
			cr_assert(strstr(why, "outside their bound"), "%s", why);
			cr_assert_not(dg_ref_close(DG_FMT_F32, c.bad, c.want, c.n, atol, 0.0f, why, sizeof(why)),
				      "T=%d: close passed %s", c.T, wrong_names[how]);
			cr_assert(strstr(why, "values outside atol"), "%s", why);
			cr_assert_not(dg_ref_same_bytes(c.bad, c.ok, c.n * 4, why, sizeof(why)),
				      "T=%d: same_bytes passed %s", c.T, wrong_names[how]);
			cr_assert(strstr(why, "bytes differ"), "%s", why);
		}
		gw_free(&c);
	}
}

/* The same on codes and bf16 outputs of the projection: bit for bit for
 * codes (a wrong layout differs), atol + rtol for bf16. */
Test(compare, codes_and_bf16_outputs)
{
	const int B = 2, H = 2, T = 6, L = 20, E = 64;
	dg_spec s;
	dg_rng r;
	char why[512];
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	s.heads = H;
	s.latent = L;
	s.embd = E;
	s.relu = true;
	size_t nx = (size_t)B * T * E, nw = (size_t)H * L * E, ny = (size_t)B * H * T * L;
	int8_t *x = rh_xmalloc(nx), *w = rh_xmalloc(nw);
	dg_rng_seed(&r, 7);
	dg_rng_fill(&r, DG_FMT_INT8, x, nx);
	dg_rng_fill(&r, DG_FMT_INT8, w, nw);
	const float sa = 0.02f, sw = 0.03f, so = 0.05f;
	for (int f = 0; f < 2; f++) {
		s.out = f ? DG_FMT_BF16 : DG_FMT_INT8;
		size_t es = f ? 2 : 1;
		unsigned char *want = rh_xmalloc(ny * es), *bad = rh_xmalloc(ny * es), *un = rh_xmalloc(ny * es);
		dg_ref_lowrank_args a = { .x = x, .w = w, .sa = sa, .sw = sw, .so = so, .out = want,
					  .batch = B, .time = T };
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
		a.sw = 1.0f; /* the weight's scale forgotten */
		a.out = un;
		cr_assert_eq(dg_ref_lowrank_fwd(&s, &a), DG_OK);
		/* shifted by one element, and each (T, L) plane read as (L, T) */
		memcpy(bad, want + es, (ny - 1) * es);
		memcpy(bad + (ny - 1) * es, want, es);
		bool ok_same = dg_ref_same_bytes(want, want, ny * es, why, sizeof(why));
		cr_assert(ok_same);
		cr_assert(dg_ref_close(s.out, want, want, ny, 0.0f, 0.0f, why, sizeof(why)));
		cr_assert_not(dg_ref_same_bytes(bad, want, ny * es, why, sizeof(why)), "shifted");
		cr_assert_not(dg_ref_close(s.out, bad, want, ny, f ? 0.0f : 1.0f, 1e-2f, why, sizeof(why)),
			      "%s shifted", dg_fmt_name(s.out));
		cr_assert_not(dg_ref_same_bytes(un, want, ny * es, why, sizeof(why)), "unscaled");
		cr_assert_not(dg_ref_close(s.out, un, want, ny, f ? 0.0f : 1.0f, 1e-2f, why, sizeof(why)),
			      "%s unscaled", dg_fmt_name(s.out));
		for (size_t p = 0; p < (size_t)B * H; p++)
			for (int t = 0; t < T; t++)
				for (int l = 0; l < L; l++) {
					size_t flat = (size_t)t * L + (size_t)l;
					size_t tt = flat % T, ll = flat / T; /* (L, T) order */
					memcpy(bad + (p * T * L + flat) * es, want + (p * T * L + tt * L + ll) * es, es);
				}
		cr_assert_not(dg_ref_same_bytes(bad, want, ny * es, why, sizeof(why)), "transposed");
		cr_assert_not(dg_ref_close(s.out, bad, want, ny, f ? 0.0f : 1.0f, 1e-2f, why, sizeof(why)),
			      "%s transposed", dg_fmt_name(s.out));
		/* a code one off passes atol 1, not bit for bit */
		memcpy(bad, want, ny * es);
		if (!f) {
			bad[3] = (unsigned char)((int8_t)bad[3] == 127 ? 126 : (int8_t)bad[3] + 1);
			cr_assert(dg_ref_close(DG_FMT_INT8, bad, want, ny, 1.0f, 0.0f, why, sizeof(why)), "%s", why);
			cr_assert_not(dg_ref_same_bytes(bad, want, ny, why, sizeof(why)));
			cr_assert(strstr(why, "1 of") && strstr(why, "byte 3"), "%s", why);
		}
		free(want);
		free(bad);
		free(un);
	}
	/* NaN matches NaN, and nothing else */
	float nan2[2] = { NAN, 1.0f }, one2[2] = { 1.0f, 1.0f };
	cr_assert(dg_ref_close(DG_FMT_F32, nan2, nan2, 2, 0.0f, 0.0f, why, sizeof(why)));
	cr_assert_not(dg_ref_close(DG_FMT_F32, nan2, one2, 2, 1.0f, 1.0f, why, sizeof(why)));
	cr_assert_not(dg_ref_close_norm(nan2, one2, 2, 1.0, 1.0f, why, sizeof(why)));
	free(x);
	free(w);
}

/* ---- dg_rng ----------------------------------------------------------------------- */

Test(rng, splitmix64_and_determinism)
{
	dg_rng a, b;
	dg_rng_seed(&a, 0);
	/* the first value of splitmix64 from state 0 (Vigna's reference code) */
	cr_assert_eq(dg_rng_u64(&a), 0xe220a8397b1dcdafull);
	dg_rng_seed(&a, 42);
	dg_rng_seed(&b, 42);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(dg_rng_u64(&a), dg_rng_u64(&b));
	dg_rng_seed(&b, 43);
	int same = 0;
	for (int i = 0; i < 100; i++)
		same += dg_rng_u64(&a) == dg_rng_u64(&b);
	cr_assert_eq(same, 0, "seeds 42 and 43 give the same stream");
	/* fill is deterministic too */
	uint8_t x[256], y[256];
	dg_rng_seed(&a, 9);
	dg_rng_seed(&b, 9);
	dg_rng_fill(&a, DG_FMT_TERNARY, x, 1024);
	dg_rng_fill(&b, DG_FMT_TERNARY, y, 1024);
	cr_assert_eq(memcmp(x, y, sizeof(x)), 0);
}

Test(rng, ranges)
{
	dg_rng r;
	dg_rng_seed(&r, 1);
	bool lo = false, hi = false;
	for (int i = 0; i < 10000; i++) {
		int v = dg_rng_int(&r, -3, 3);
		cr_assert(v >= -3 && v <= 3, "%d", v);
		lo |= v == -3;
		hi |= v == 3;
		float u = dg_rng_uniform(&r, -2.0f, 5.0f);
		cr_assert(u >= -2.0f && u < 5.0f, "%g", (double)u);
	}
	cr_assert(lo && hi, "both ends of an int range are drawn");
	cr_assert_eq(dg_rng_int(&r, 7, 7), 7);
	cr_assert_eq(dg_rng_int(&r, -2147483647 - 1, 2147483647) <= 2147483647, 1);
}

/* Each format's storage holds only its codes, and every code shows up. */
Test(rng, fill_writes_only_codes_each_format_holds)
{
	enum { N = 4096 };
	static uint8_t buf[N * 4 + 16];
	dg_rng r;
	dg_rng_seed(&r, 2026);
	for (int f = 0; f < DG_FMT__COUNT; f++) {
		const dg_fmt_info *fi = dg_fmt_info_of((dg_fmt)f);
		size_t bytes = dg_fmt_row_bytes((dg_fmt)f, N);
		cr_assert_gt(bytes, 0);
		memset(buf, 0xa5, sizeof(buf));
		dg_rng_fill(&r, (dg_fmt)f, buf, N);
		cr_assert_eq(buf[bytes], 0xa5, "%s: wrote past %zu bytes", fi->name, bytes);
		int seen[512] = { 0 };
		for (size_t i = 0; i < N; i++) {
			int v;
			if (f == DG_FMT_F32 || f == DG_FMT_BF16) {
				float x;
				if (f == DG_FMT_F32)
					memcpy(&x, buf + 4 * i, 4);
				else
					x = dg_bf16_to_f32((uint16_t)(buf[2 * i] | buf[2 * i + 1] << 8));
				cr_assert(x >= -1.0f && x <= 1.0f, "%s: %g", fi->name, (double)x);
				cr_assert(f == DG_FMT_BF16 || x < 1.0f);
				continue;
			} else if (f == DG_FMT_I32) {
				/* token ids of the default vocab */
				int32_t id;
				memcpy(&id, buf + 4 * i, 4);
				cr_assert(id >= 0 && id < 256, "i32: token %d outside 0..255", id);
				continue;
			} else if (f == DG_FMT_TERNARY) {
				unsigned pair = (buf[i / 4] >> (2 * (i % 4))) & 3u;
				cr_assert_neq(pair, 2u, "ternary pair 10 at code %zu", i);
				v = pair == 0 ? 0 : pair == 1 ? 1 : -1;
			} else if (f == DG_FMT_SIGN1) {
				v = (buf[i / 8] >> (i % 8)) & 1u ? 1 : -1;
			} else if (f == DG_FMT_UINT8POS) {
				v = buf[i];
			} else {
				v = (int8_t)buf[i];
			}
			int lo = fi->is_unsigned ? 0 : -fi->qmax;
			cr_assert(v >= lo && v <= fi->qmax, "%s: code %d outside %d..%d", fi->name, v, lo, fi->qmax);
			seen[v + 256]++;
		}
		if (!fi->code)
			continue;
		/* every code of a small format appears; the ends of a large one */
		int lo = fi->is_unsigned ? 0 : -fi->qmax;
		if (fi->qmax <= 7) {
			for (int v = lo; v <= fi->qmax; v++)
				cr_assert(seen[v + 256] || (f == DG_FMT_SIGN1 && v == 0), "%s: code %d never drawn",
					  fi->name, v);
		} else {
			cr_assert(seen[lo + 256] && seen[fi->qmax + 256], "%s: an end never drawn", fi->name);
		}
	}
}

/* ---- dg_ref_run: every op by the op table's arguments ---------------------------- */

enum { RUN_B = 2, RUN_T = 3, RUN_R = 5, RUN_N = 192, RUN_COLS = 64 };

/* T of a run: a chunked op's two whole chunks, else RUN_T. */
static int run_t(const dg_spec *s)
{
	return (dg_spec_uses(s->op) & DG_FIELD_CHUNK) ? 2 * s->chunk : RUN_T;
}

static int64_t run_extent(const dg_spec *s, dg_dim d)
{
	return dg_test_dim_extent(s, d, RUN_B, run_t(s), RUN_R);
}

static size_t arg_elems(const dg_spec *s, const dg_op_arg *a)
{
	if (a->ndim == 0)
		return RUN_N;
	size_t n = 1;
	for (int d = 0; d < a->ndim; d++)
		n *= (size_t)run_extent(s, a->dims[d]);
	return n;
}

/* Output bytes: codes and f32 one a byte / four, packed formats whole words. */
static size_t arg_bytes(dg_fmt f, size_t n)
{
	return dg_fmt_row_bytes(f, (int64_t)n);
}

/* n values of a float tensor (f32 | bf16) as f32, into buf. */
static float *as_f32(dg_fmt f, const void *p, size_t n, float *buf)
{
	for (size_t i = 0; i < n; i++)
		buf[i] = f == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
	return buf;
}

/* The row ops (embed, norm, loss) by their own references: the last output
 * of each (out, dtable, rstd, dx, rstd, dy, dw), eps 0, no accumulate. */
static dg_status direct_rows(const dg_spec *s, const dg_ref_call *c, void *out)
{
	enum { MAXN = 1 << 16 };
	static float a[MAXN], b[MAXN], y[MAXN], g[MAXN];
	const int E = s->embd, V = s->vocab;
	const size_t n = (size_t)RUN_R * (size_t)E;
	double loss;
	cr_assert_leq((size_t)V * (size_t)E, (size_t)MAXN);
	switch (s->op) {
	case DG_OP_EMBED_FWD: {
		dg_status st = dg_ref_embed_fwd(c->in[1], V, E, c->in[0], RUN_R, y, NULL);
		for (size_t i = 0; i < n; i++) {
			if (s->out == DG_FMT_BF16)
				((uint16_t *)out)[i] = dg_f32_to_bf16(y[i]);
			else
				((float *)out)[i] = y[i];
		}
		return st;
	}
	case DG_OP_EMBED_BWD:
		memset(out, 0, (size_t)V * (size_t)E * sizeof(float));
		dg_ref_embed_bwd(as_f32(s->src, c->in[1], n, a), E, c->in[0], RUN_R, out);
		return DG_OK;
	case DG_OP_LAYERNORM_FWD:
		dg_ref_layernorm_fwd(as_f32(s->src, c->in[0], n, a), RUN_R, E, 0.0f, y, NULL, out);
		return DG_OK;
	case DG_OP_RESID_LN_FWD:
		as_f32(s->src, c->in[0], n, a);
		as_f32(s->src, c->in[1], n, b);
		for (size_t i = 0; i < n; i++)
			a[i] = a[i] + b[i];
		dg_ref_layernorm_fwd(a, RUN_R, E, 0.0f, y, NULL, out);
		return DG_OK;
	case DG_OP_LAYERNORM_BWD:
	case DG_OP_RESID_LN_BWD:
		dg_ref_layernorm_bwd(c->in[0], as_f32(s->src, c->in[1], n, a), c->in[2], RUN_R, E, out, false);
		return DG_OK;
	case DG_OP_LMHEAD_CE:
		as_f32(s->src, c->in[0], n, a);
		as_f32(s->weight, c->in[1], (size_t)E * (size_t)V, b);
		return dg_ref_lmhead_ce(a, b, c->in[2], RUN_R, E, V, &loss, g, out, false, NULL);
	case DG_OP_LMHEAD_LOGITS:
		dg_ref_lmhead_logits(as_f32(s->src, c->in[0], n, a), c->in[1], RUN_R, E, V, out);
		return DG_OK;
	default:
		return DG_ERR_INTERNAL;
	}
}

/* The chunked form's ops by the references of runtime/ref/attention_chunked.c
 * (f32 operands, the states' bf16 as stored), and the helpers' rules
 * written out: the values a head each, the cast, the head sum in order. */
static dg_status direct_chunk(const dg_spec *s, const dg_ref_call *c, void *out, int b, int t)
{
	const int H = s->heads, N = s->latent, D = s->embd, C = s->chunk;
	const size_t nq = (size_t)b * H * t * N, nd = (size_t)b * H * t * D, nv = (size_t)b * t * D;
	float *q = rh_xmalloc(nq * 4 + 16), *g = rh_xmalloc(nd * 4 + 16), *v = rh_xmalloc(nd * 4 + 16);
	float *cc = rh_xmalloc((size_t)b * H * t * C * 4 + 16), *acc = rh_xmalloc(nq * 4 + 16);
	dg_status st = DG_OK;
	switch (s->op) {
	case DG_OP_ATTENTION_CHUNK_STATE:
		dg_ref_attention_chunk_state(as_f32(s->act, c->in[0], nq, q),
					     as_f32(s->act, c->in[1], (size_t)b * s->in_heads * t * D, g), b, H, t, N, D,
					     C, s->in_heads, c->backward, out);
		break;
	case DG_OP_ATTENTION_CHUNK_OUT:
		as_f32(s->out, c->in[2], nd, g);
		dg_ref_attention_chunk_out(as_f32(s->act, c->in[0], nq, q), c->in[1], b, H, t, N, D, C, c->backward, g);
		for (size_t i = 0; i < nd; i++) {
			if (s->out == DG_FMT_BF16)
				((uint16_t *)out)[i] = dg_f32_to_bf16(g[i]);
			else
				((float *)out)[i] = g[i];
		}
		break;
	case DG_OP_ATTENTION_CHUNK_DQ: {
		memset(acc, 0, nq * 4);
		dg_ref_attention_chunk_dq(as_f32(s->act, c->in[0], (size_t)b * H * t * C, cc),
					  as_f32(s->act, c->in[1], nq, q), as_f32(s->act, c->in[2], nd, g),
					  as_f32(s->act, c->in[3], nv, v), c->in[4], c->in[5], b, H, t, N, D, C, acc);
		/* RoPE's transpose by the table (q reused), then epi=mask's sum */
		dg_spec r;
		dg_spec_init(&r, DG_OP_ROPE_BWD);
		r.heads = H;
		r.latent = N;
		st = dg_ref_rope_op(&r, acc, c->in[6], q, b, t);
		if (!st)
			st = dg_ref_add_mask(s->act, s->out, DG_FMT_F32, c->in[7], q, c->in[8], (int64_t)nq, out);
		break;
	}
	case DG_OP_ATTENTION_CHUNK_VREP:
		for (size_t i = 0; i < nd; i++) {
			const size_t e = i % (size_t)D, row = i / (size_t)D, tt = row % (size_t)t, bb = row / ((size_t)H * t);
			((uint16_t *)out)[i] = ((const uint16_t *)c->in[0])[(bb * t + tt) * D + e];
		}
		break;
	case DG_OP_ATTENTION_CHUNK_CAST:
		for (size_t i = 0; i < nd; i++)
			((uint16_t *)out)[i] = dg_f32_to_bf16(((const float *)c->in[0])[i]);
		break;
	default: /* hsum */
		for (size_t i = 0; i < nv; i++) {
			const size_t bb = i / ((size_t)t * D), r = i % ((size_t)t * D);
			float sum = 0.0f;
			for (int h = 0; h < H; h++)
				sum += ((const float *)c->in[0])[(bb * H + (size_t)h) * t * D + r];
			((float *)out)[i] = sum;
		}
		break;
	}
	free(q);
	free(g);
	free(v);
	free(cc);
	free(acc);
	return st;
}

/* The op's own reference, called directly with the same storages. */
static dg_status direct(const dg_spec *s, const dg_ref_call *c, void *out, float *oscale)
{
	int b = RUN_B, t = run_t(s);
	switch (s->op) {
	case DG_OP_LOWRANK_FWD: {
		dg_ref_lowrank_args a = { .x = c->in[0], .w = c->in[1], .sa = c->scale[0], .sw = c->scale[1],
					  .so = c->scale[2], .out = out, .batch = b, .time = t };
		return dg_ref_lowrank_fwd(s, &a);
	}
	case DG_OP_RELU_MASK:
		return dg_ref_relu_mask(s, c->in[0], c->in[1], c->scale[0], c->scale[1], c->in[2], out, b, t);
	case DG_OP_LOWRANK_GRAD_INPUT:
		return dg_ref_lowrank_grad_input(s, c->in[0], c->in[1], c->scale[1], out, b, t);
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		return dg_ref_lowrank_grad_weight(s, c->in[0], c->in[1], c->scale[1], out, b, t);
	case DG_OP_DECODER_FWD: {
		dg_ref_decoder_args a = { .y = c->in[0], .w = c->in[1], .sa = c->scale[0], .sw = c->scale[1],
					  .out = out, .batch = b, .time = t };
		return dg_ref_decoder_fwd(s, &a);
	}
	case DG_OP_DECODER_GRAD_INPUT:
		return dg_ref_decoder_grad_input(s, c->in[0], c->in[1], c->scale[1], out, b, t);
	case DG_OP_DECODER_GRAD_WEIGHT:
		return dg_ref_decoder_grad_weight(s, c->in[0], c->in[1], c->scale[1], out, b, t);
	case DG_OP_QUANTIZE_ACT:
		return dg_ref_quantize_act(s->src, s->act, c->in[0], RUN_N, out, oscale);
	case DG_OP_GATE_QUANT: { /* gate_fwd's xy, then a scale a token (oscale: b·t of them) */
		const int64_t n = (int64_t)b * s->heads * t * s->latent;
		void *xy = rh_xmalloc((size_t)n * 4 + 4);
		dg_status st = dg_ref_gate_fwd_op(s->src, c->in[0], c->in[1], n, c->p, c->seed, c->step, c->layer,
						  c->elem0, xy);
		if (!st)
			st = dg_ref_quantize_act_rows(s->src, s->act, xy, (size_t)b, (size_t)s->heads, (size_t)t,
						      (size_t)s->latent, out, oscale);
		free(xy);
		return st;
	}
	case DG_OP_QUANTIZE_WEIGHT: {
		float w[RUN_N];
		for (int i = 0; i < RUN_N; i++)
			w[i] = s->src == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)c->in[0])[i])
						     : ((const float *)c->in[0])[i];
		return dg_ref_quantize_weight(s->weight, w, RUN_N, out, oscale);
	}
	case DG_OP_PACK_TERNARY:
		return c->unpack ? dg_ref_unpack_ternary(c->in[1], out, RUN_R, s->embd)
				 : dg_ref_pack_ternary(c->in[0], out, RUN_R, s->embd);
	case DG_OP_PACK_SIGN1:
		return c->unpack ? dg_ref_unpack_sign1(c->in[1], out, RUN_R, s->embd)
				 : dg_ref_pack_sign1(c->in[0], out, RUN_R, s->embd);
	case DG_OP_PACK_I8X4:
		return dg_ref_pack_i8x4(c->in[0], out, RUN_R, s->embd, s->latent);
	case DG_OP_UNPACK_I8X4:
		return dg_ref_unpack_i8x4(c->in[0], out, RUN_R, s->embd, s->latent);
	case DG_OP_ROPE_FWD:
	case DG_OP_ROPE_BWD:
		return dg_ref_rope_op(s, c->in[0], c->in[1], out, b, t);
	case DG_OP_ATTENTION_SCORES:
		return dg_ref_attention_scores(s, c->in[0], c->in[1], out, b, t);
	case DG_OP_ATTENTION_OUT:
		return dg_ref_attention_out(s, c->in[0], c->in[1], out, b, t);
	case DG_OP_ATTENTION_GRAD_SCORES:
		return dg_ref_attention_grad_scores(s, c->in[0], c->in[1], out, b, t);
	case DG_OP_ATTENTION_GRAD_V:
		return dg_ref_attention_grad_v(s, c->in[0], c->in[1], out, b, t);
	case DG_OP_ATTENTION_GRAD_XS:
		if (s->epi == DG_EPI_MASK) /* dxs (4) in place, mask_xs (5) */
			return dg_ref_attention_grad_xs_mask(s, c->in[0], c->in[1], c->in[2], c->in[4], c->in[5],
							     out, b, t);
		return dg_ref_attention_grad_xs(s, c->in[0], c->in[1], c->in[2], out, b, t);
	case DG_OP_ATTENTION_STEP: { /* the state (4) read and written: a copy */
		size_t n = (size_t)b * s->heads * s->latent * s->embd;
		float *state = malloc(n * sizeof(float));
		if (!state)
			return DG_ERR_NOMEM;
		memcpy(state, c->in[4], n * sizeof(float));
		dg_status st = dg_ref_attention_step(s, c->in[0], c->in[1], c->in[2], c->in[3], state, out, b, t);
		free(state);
		return st;
	}
	case DG_OP_GATE_FWD:
		return dg_ref_gate_fwd_op(s->act, c->in[0], c->in[1], (int64_t)b * s->heads * t * s->latent,
					  c->p, c->seed, c->step, c->layer, c->elem0, out);
	case DG_OP_GATE_BWD:
		return dg_ref_gate_bwd_op(s->act, s->out, c->in[0], c->in[1], c->in[2],
					  (int64_t)b * s->heads * t * s->latent, c->p, c->seed, c->step,
					  c->layer, c->elem0, out, NULL);
	case DG_OP_ADD_MASK:
		return dg_ref_add_mask(s->act, s->out, s->src, c->in[0], c->in[1], c->in[2],
				       (int64_t)b * s->heads * t * s->latent, out);
	case DG_OP_ADD3:
		dg_ref_add3(c->in[0], c->in[1], c->in[2], RUN_N, out);
		return DG_OK;
	case DG_OP_TRANSPOSE:
		return dg_ref_transpose(s->act, c->in[0], RUN_R, s->embd, s->latent, out);
	case DG_OP_DEQUANTIZE: /* rows of RUN_COLS (run_both's cols) */
		return dg_ref_dequantize(s->act, s->out, s->ascale, c->in[0], RUN_N / RUN_COLS, RUN_COLS,
					 &c->scale[0], out);
	case DG_OP_DECODER_GATE_BWD: { /* out: dys, the last output; dxs to scratch */
		void *dxs = rh_xmalloc((size_t)b * s->heads * t * s->latent * 4 + 16);
		dg_status st = dg_ref_decoder_gate_bwd(s, c->in[0], c->in[1], c->in[2], c->in[3], b, t, c->p,
						       c->seed, c->step, c->layer, c->elem0, dxs, out);
		free(dxs);
		return st;
	}
	case DG_OP_DECODER_GATE_BWD_YS: { /* out: dys, the last output; dxs to scratch */
		void *dxs = rh_xmalloc((size_t)b * s->heads * t * s->latent * 4 + 16);
		const float *sa = s->ascale == DG_SCALE_TOKEN ? c->scale_v[3] : &c->scale[3];
		const float *sw = s->wscale == DG_SCALE_CHANNEL ? c->scale_v[4] : &c->scale[4];
		dg_status st = dg_ref_decoder_gate_bwd_ys(s, c->in[0], c->in[1], c->in[2], c->in[3], sa, c->in[4],
							  sw, b, t, c->p, c->seed, c->step, c->layer, c->elem0, dxs,
							  out);
		free(dxs);
		return st;
	}
	case DG_OP_ADAMW_UPDATE: { /* out: v, the last output; p and m to scratch */
		float p[RUN_N], m[RUN_N];
		memcpy(p, c->in[0], sizeof(p));
		memcpy(m, c->in[2], sizeof(m));
		memcpy(out, c->in[3], sizeof(p));
		dg_adamw_ctl ctl;
		dg_ref_adamw_default_ctl(&ctl);
		dg_ref_adamw(&ctl, true, p, c->in[1], m, out, NULL, RUN_N);
		return DG_OK;
	}
	case DG_OP_ATTENTION_CHUNK_STATE:
	case DG_OP_ATTENTION_CHUNK_OUT:
	case DG_OP_ATTENTION_CHUNK_DQ:
	case DG_OP_ATTENTION_CHUNK_VREP:
	case DG_OP_ATTENTION_CHUNK_CAST:
	case DG_OP_ATTENTION_CHUNK_HSUM:
		return direct_chunk(s, c, out, b, t);
	default:
		return direct_rows(s, c, out);
	}
}

/* Runs spec both ways on random inputs and compares the outputs' bytes
 * (and the quantizers' scale). unpack: pack_ternary / pack_sign1 from
 * packed words to codes. */
static void run_both(dg_spec *s, bool unpack)
{
	const dg_op_info *r = dg_op_info_of(s->op);
	dg_ref_call c;
	void *store[DG_OP_MAX_ARGS] = { 0 };
	float *scales[DG_OP_MAX_ARGS] = { 0 };
	dg_rng g;
	int out_i = -1;
	memset(&c, 0, sizeof(c));
	dg_rng_seed(&g, 1000 + (uint64_t)s->op);
	for (int i = 0; i < r->n_args; i++) {
		const dg_op_arg *a = &r->args[i];
		if (!dg_op_arg_used(s, i))
			continue; /* another epilogue's: NULL in the call */
		dg_fmt f = dg_op_arg_fmt(s, a->fmt);
		size_t n = arg_elems(s, a);
		store[i] = rh_xmalloc(arg_bytes(f, n) + 16);
		c.scale[i] = 0.01f * (float)(i + 1);
		if (a->scale && dg_fmt_is_code(f) && !a->output && a->ndim > 0 &&
		    ((a->fmt == DG_ARG_ACT && s->ascale == DG_SCALE_TOKEN) ||
		     (a->fmt == DG_ARG_WEIGHT && s->wscale == DG_SCALE_CHANNEL))) {
			/* a scale a row or a channel: one a row of the last
			 * dimension (at least the token's B·T), each its own */
			size_t rows = n / (size_t)run_extent(s, a->dims[a->ndim - 1]);
			scales[i] = rh_xmalloc(rows * sizeof(float));
			for (size_t k = 0; k < rows; k++)
				scales[i][k] = c.scale[i] * (1.0f + 0.125f * (float)(k % 7));
			c.scale_v[i] = scales[i];
		}
		bool is_out = unpack ? !a->output : a->output; /* unpack: packed in, codes out */
		if (is_out) {
			out_i = i;
			if (!((r->inout >> i) & 1u))
				continue; /* an in-place output is read too: filled */
		}
		if (r->pack_fmt != DG_FMT__COUNT && a->fmt == DG_ARG_INT8) {
			/* the codes a pack packs: -1, 0, +1 or ±1, one a byte */
			int8_t *b = store[i];
			for (size_t k = 0; k < n; k++)
				b[k] = (int8_t)(r->pack_fmt == DG_FMT_SIGN1 ? (dg_rng_int(&g, 0, 1) ? 1 : -1)
									    : dg_rng_int(&g, -1, 1));
		} else {
			dg_rng_fill(&g, f, store[i], n);
		}
		c.in[i] = store[i];
	}
	cr_assert_geq(out_i, 0);
	const dg_op_arg *oa = &r->args[out_i];
	dg_fmt of = dg_op_arg_fmt(s, oa->fmt);
	size_t ob = arg_bytes(of, arg_elems(s, oa));
	cr_assert_gt(ob, 0, "%s: output of no bytes", dg_op_name(s->op));
	void *want = rh_xmalloc(ob);
	bool in_place = (r->inout >> out_i) & 1u;
	void *obuf = in_place ? rh_xmalloc(ob) : store[out_i]; /* in place: its input kept */
	memset(obuf, 0x5a, ob);
	memset(want, 0x5a, ob);
	float got_scale = -1.0f, want_scale = -2.0f;
	/* gate_quant: a scale a token */
	const bool rows = s->op == DG_OP_GATE_QUANT;
	const size_t nrows = (size_t)RUN_B * (size_t)run_t(s);
	float *got_rows = rows ? rh_xmalloc(nrows * sizeof(float)) : NULL;
	float *want_rows = rows ? rh_xmalloc(nrows * sizeof(float)) : NULL;
	c.out = obuf;
	c.p = 0.25f; /* the gate's dropout */
	c.seed = 99;
	c.step = 4;
	c.layer = 1;
	c.elem0 = 13; /* a rank's offset, not whole Philox blocks: dg_ref_run passes it */
	c.out_scale = rows ? got_rows : &got_scale;
	c.b = RUN_B;
	c.t = run_t(s);
	c.r = RUN_R;
	c.n = RUN_N;
	if (s->op == DG_OP_DEQUANTIZE)
		c.cols = RUN_COLS; /* its (R, C): R does not divide RUN_N */
	c.unpack = unpack;
	char text[DG_SPEC_TEXT_MAX], why[256];
	dg_spec_to_string(s, text, sizeof(text));
	cr_assert_eq(dg_ref_run(s, &c), DG_OK, "%s", text);
	cr_assert_eq(direct(s, &c, want, rows ? want_rows : &want_scale), DG_OK, "%s", text);
	cr_assert(dg_ref_same_bytes(c.out, want, ob, why, sizeof(why)), "%s%s: %s", text,
		  unpack ? " (unpack)" : "", why);
	if (rows)
		cr_assert_eq(memcmp(got_rows, want_rows, nrows * sizeof(float)), 0, "%s: the scales a token", text);
	else if (r->check == DG_CHECK_SCALED_CODES)
		cr_assert_eq(got_scale, want_scale, "%s: scale %g, directly %g", text, (double)got_scale,
			     (double)want_scale);
	free(got_rows);
	free(want_rows);
	/* the output was written (not left as the fill) */
	unsigned char *o = c.out;
	size_t untouched = 0;
	for (size_t i = 0; i < ob; i++)
		untouched += o[i] == 0x5a;
	cr_assert_lt(untouched, ob, "%s: dg_ref_run wrote nothing", text);
	for (int i = 0; i < r->n_args; i++) {
		free(store[i]);
		free(scales[i]);
	}
	if (in_place)
		free(obuf);
	free(want);
}

Test(ref_run, every_op_is_its_reference)
{
	int runs = 0;
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *r = dg_op_info_of((dg_op)i);
		dg_spec s;
		dg_spec_init(&s, (dg_op)i);
		s.heads = 2;
		s.embd = 64;
		s.latent = 32;
		if (r->fields & DG_FIELD_CHUNK)
			s.chunk = 64;
		/* every weight, act and out format the op takes, one at a time */
		for (int f = 0; f < DG_FMT__COUNT; f++) {
			dg_spec t = s;
			bool any = false;
			if (r->weight_fmts & DG_FMT_BIT(f))
				t.weight = (dg_fmt)f, any = true;
			if (r->act_fmts & DG_FMT_BIT(f))
				t.act = (dg_fmt)f, any = true;
			if (r->out_fmts & DG_FMT_BIT(f))
				t.out = (dg_fmt)f, any = true;
			if (r->src_fmts & DG_FMT_BIT(f))
				t.src = (dg_fmt)f, any = true;
			if (!any && f > 0)
				continue;
			if (r->fields & DG_FIELD_RELU)
				t.relu = true;
			cr_assert_eq(dg_spec_validate(&t, NULL, 0), DG_OK, "%s %s", dg_op_name(t.op), dg_fmt_name((dg_fmt)f));
			run_both(&t, false);
			runs++;
			if (t.op == DG_OP_PACK_TERNARY || t.op == DG_OP_PACK_SIGN1)
				run_both(&t, true);
			if (r->fields & DG_FIELD_EPI) { /* the fused epilogue's call too */
				t.epi = DG_EPI_MASK;
				run_both(&t, false);
				runs++;
			}
		}
	}
	cr_assert_gt(runs, 40);
	dg_ref_call c;
	memset(&c, 0, sizeof(c));
	cr_assert_eq(dg_ref_run(NULL, &c), DG_ERR_INVALID_ARG);
	dg_spec bad;
	dg_spec_init(&bad, DG_OP_LOWRANK_FWD);
	bad.op = DG_OP__COUNT;
	cr_assert_eq(dg_ref_run(&bad, &c), DG_ERR_INVALID_ARG);
}
