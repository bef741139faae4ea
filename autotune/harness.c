/*
 * The sweep's harness: for any op, the tensors of one call at a shape —
 * read from the op table's signature (dg_op_info.args) — random inputs
 * (dragon/rng.h), the call through the ops' one door (dg__op_run), and the
 * comparison with the CPU reference (dg_ref_run) by the op's check kind:
 * integer outputs bit for bit, float outputs within atol + rtol·|ref|,
 * gradients by their norm error (bf16 tensor cores), the quantizers by
 * their scale and then their codes — the tolerance checks of dragon/ref.h,
 * the ones the GPU tests use.
 *
 * Shapes at R rows: the B·T ops take B = 1, T = R (H, Hin, E, L from the
 * spec); the ops without B·T take the op table's case rule
 * (dg_op_info.tune: the pack ops R·8 or the BDH heads, the quantizers
 * (R', cols) with the BDH latent or weight width), so their timings speak
 * of a training step.
 *
 * Large inputs of a timing case are made from a 16 MiB random block
 * uploaded again and again (the values do not change the speed); a check
 * case keeps its whole host inputs for the reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/sweep_int.h"
#include "runtime/ref/ref_ops.h"
#include "dragon/rng.h"
#include "runtime/ops/ops_int.h"

#define FILL_BLOCK ((size_t)16 << 20)

typedef struct tbuf {
	dg_fmt fmt;
	size_t n;      /* elements */
	size_t bytes;  /* storage */
	void *host;    /* check cases: the data */
	dg_dptr d;
	dg_dptr scale; /* device float(s), code formats */
	float sval;
	size_t nscale; /* 1, or a scale a row / a channel (ascale=token, wscale=channel) */
	float *svec;   /* their host values (vector scales, even of one row) */
} tbuf;

struct dg__at_case {
	dg_device *dev;
	dg_spec spec;
	const dg_op_info *row;
	int rows;
	bool check;
	dg_rng rng;
	tbuf buf[DG_OP_MAX_ARGS];
	dg_tensor t[DG_OP_MAX_ARGS];
	int out;          /* the index of the output */
	dg__op_call call;
	dg_dptr ws;       /* the workspace of the call */
	size_t ws_bytes;
	void *want;       /* reference output (check), buf[out].bytes */
	float want_scale; /* quantizers: the reference scale */
	float *want_svec; /* quantizers a scale a row: the reference scales */
	int64_t b, t_len, r, n;
	size_t dev_bytes;
};

static int64_t extent(const dg__at_case *c, dg_dim d)
{
	return dg_op_dim_extent(&c->spec, d, c->b, c->t_len, c->r);
}

/* The case's sizes from the op table: B = 1, T = rows (a chunked op's:
 * rows up to a whole number of chunks, which its T must be); R and the
 * quantizers' (R, cols) from the case rule. */
static void sizes(dg__at_case *c)
{
	const dg_op_case *k = &c->row->tune;
	if (c->spec.chunk > 0 && c->rows % c->spec.chunk)
		c->rows += c->spec.chunk - c->rows % c->spec.chunk;
	int64_t r = k->r_div > 0 ? (int64_t)c->rows * (k->r_mul > 0 ? k->r_mul : 1) / k->r_div
				 : c->rows;
	if (r < 1)
		r = 1;
	if (k->r_max > 0 && r > k->r_max)
		r = k->r_max;
	c->b = 1;
	c->t_len = c->rows;
	c->r = r;
	c->n = r * (k->cols > 0 ? k->cols : 1);
}

/* Allocates b on the device and fills it (fill) from the case's stream;
 * keep: the host copy stays. */
static dg_status buf_make(dg__at_case *c, tbuf *b, dg_fmt f, size_t n, size_t nscale, bool fill,
			  bool keep)
{
	dg_status st;

	b->fmt = f;
	b->n = n;
	b->nscale = nscale ? nscale : 1; /* 0: a tensor's one scale */
	b->bytes = dg_fmt_row_bytes(f, (int64_t)n);
	st = dg_malloc(c->dev, b->bytes ? b->bytes : 1, &b->d);
	if (st)
		return st;
	c->dev_bytes += b->bytes;
	if (dg_fmt_is_code(f)) {
		b->sval = dg_fmt_info_of(f)->per_word == 4 ? 1.0f / (float)dg_fmt_info_of(f)->qmax
							     : 0.05f;
		st = dg_malloc(c->dev, b->nscale * sizeof(float), &b->scale);
		if (!st && nscale == 0) {
			st = dg_memcpy_htod(c->dev, b->scale, &b->sval, sizeof(float));
		} else if (!st) {
			/* a scale a row / a channel: random, between half and
			 * one and a half times the tensor's, so a wrong index shows */
			b->svec = malloc(b->nscale * sizeof(float));
			if (!b->svec)
				return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory: %zu scales",
						    b->nscale);
			for (size_t i = 0; i < b->nscale; i++)
				b->svec[i] = b->sval *
					     (0.5f + (float)(dg_rng_u64(&c->rng) >> 40) * 0x1p-24f);
			st = dg_memcpy_htod(c->dev, b->scale, b->svec, b->nscale * sizeof(float));
		}
		if (st)
			return st;
	}
	if (!fill)
		return DG_OK;
	/* A block of whole 32-value groups (packed words stay aligned). */
	size_t block_vals = keep ? n : (FILL_BLOCK / 4) / 32 * 32;
	if (block_vals > n)
		block_vals = n;
	size_t block_bytes = dg_fmt_row_bytes(f, (int64_t)block_vals);
	void *h = malloc(block_bytes ? block_bytes : 1);
	if (!h)
		return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory: %zu bytes of host inputs",
				    block_bytes);
	dg_rng_fill(&c->rng, f, h, block_vals);
	if (f == DG_FMT_I32) /* token ids of the spec's vocabulary */
		for (size_t i = 0; i < block_vals; i++)
			((int32_t *)h)[i] %= c->spec.vocab;
	for (size_t off = 0; off < b->bytes && !st; off += block_bytes) {
		size_t k = b->bytes - off < block_bytes ? b->bytes - off : block_bytes;
		st = dg_memcpy_htod(c->dev, b->d + off, h, k);
	}
	if (st || !keep)
		free(h);
	else
		b->host = h;
	return st;
}

/* The codes a pack op reads must be codes its packed format holds:
 * random storage of that format, unpacked. */
static dg_status pack_codes(dg__at_case *c, tbuf *b)
{
	dg_fmt pf = c->row->pack_fmt;
	size_t n = b->n, rows = n / (size_t)c->spec.embd;
	void *words = malloc(dg_fmt_row_bytes(pf, (int64_t)n) + 4);
	int8_t *codes = malloc(n + 1);
	dg_status st;

	if (!words || !codes) {
		free(words);
		free(codes);
		return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory: %zu codes", n);
	}
	dg_rng_fill(&c->rng, pf, words, n);
	st = pf == DG_FMT_TERNARY ? dg_ref_unpack_ternary(words, codes, rows, c->spec.embd)
				  : dg_ref_unpack_sign1(words, codes, rows, c->spec.embd);
	free(words);
	if (st)
		st = dg__dev_fail(c->dev, DG_ERR_INTERNAL, "random %s storage does not unpack",
				  dg_fmt_name(pf));
	if (!st)
		st = dg_memcpy_htod(c->dev, b->d, codes, n);
	if (st || !c->check)
		free(codes);
	else
		b->host = codes;
	return st;
}

/* The scales argument a of shape (ndim) carries under c's spec: 0 (one, a
 * tensor's), or a
 * scale a row of the GEMM that reads it (ascale=token: the decoder's y
 * (B,H,T,N) one a token b·T + t, any other all but the last dimension) or
 * an output channel (wscale=channel: the rows of the last dimension); the
 * quantizers' codes one a row they quantize. */
static size_t n_scales(const dg__at_case *c, const dg_op_arg *a, int ndim, const int64_t *shape)
{
	const dg_spec *s = &c->spec;
	bool token = s->ascale == DG_SCALE_TOKEN &&
		     (a->fmt == DG_ARG_ACT || (s->op == DG_OP_QUANTIZE_ACT && a->output));
	bool channel = s->wscale == DG_SCALE_CHANNEL &&
		       (a->fmt == DG_ARG_WEIGHT || (s->op == DG_OP_QUANTIZE_WEIGHT && a->output));
	if (s->op == DG_OP_GATE_QUANT && a->output && a->scale)
		return (size_t)(shape[0] * shape[2]); /* its codes: a scale a token (b, t) */
	if (!a->scale || !(token || channel))
		return 0;
	if (token && ndim == 4 && strcmp(c->row->family, "decoder") == 0)
		return (size_t)(shape[0] * shape[2]);
	if (token && s->op == DG_OP_QUANTIZE_ACT)
		return (size_t)(shape[0] * shape[2]); /* (B, G, T, C): a token (b, t) */
	int64_t n = 1;
	for (int d = 0; d < ndim - 1; d++)
		n *= shape[d];
	return (size_t)n;
}

/* Makes every argument of c->spec at c->rows, and the workspace. */
static dg_status setup(dg__at_case *c)
{
	dg_status st = DG_OK;

	sizes(c);
	c->out = -1;
	for (int i = 0; i < c->row->n_args && !st; i++) {
		const dg_op_arg *a = &c->row->args[i];
		if (!dg_op_arg_used(&c->spec, i))
			continue; /* another epilogue's (attention_grad_xs): left NULL */
		dg_fmt f = dg_op_arg_fmt(&c->spec, a->fmt);
		int64_t shape[4] = { c->r, c->n / c->r, 1, 1 };
		int ndim = a->ndim ? a->ndim : 2;
		if (!a->ndim && c->spec.op == DG_OP_QUANTIZE_ACT && c->spec.ascale == DG_SCALE_TOKEN) {
			/* a scale a token: (1, 1, R, cols) */
			int64_t tok[4] = { 1, 1, c->r, c->n / c->r };
			memcpy(shape, tok, sizeof(tok));
			ndim = 4;
		}
		for (int d = 0; d < a->ndim; d++)
			shape[d] = extent(c, a->dims[d]);
		int64_t n = 1;
		for (int d = 0; d < ndim; d++)
			n *= shape[d];
		if (a->output)
			c->out = i;
		bool packs = c->row->pack_fmt != DG_FMT__COUNT && !a->output &&
			     f == DG_FMT_INT8;
		bool inout = (c->row->inout >> i) & 1u; /* read too: filled like an input */
		st = buf_make(c, &c->buf[i], f, (size_t)n, n_scales(c, a, ndim, shape),
			      (!a->output || inout) && !packs, c->check);
		if (!st && packs)
			st = pack_codes(c, &c->buf[i]);
		c->t[i] = dg_tensor_make(a->name, f, c->buf[i].d, ndim, shape);
		c->t[i].scale = a->scale ? c->buf[i].scale : 0;
		c->call.t[i] = &c->t[i];
	}
	/* optional outputs (lmhead_ce's dx and dw) are made, so they are asked for */
	for (int i = 0; i < c->row->n_args; i++)
		c->call.backward |= c->row->args[i].optional && dg_op_arg_used(&c->spec, i);
	/* the gate's dropout: a rate that drops, a stream of the case's seed */
	c->call.p = 0.1f;
	c->call.seed = dg_rng_u64(&c->rng);
	c->call.step = 7;
	c->call.layer = 2;
	if (!st && c->out < 0)
		st = dg__dev_fail(c->dev, DG_ERR_INTERNAL, "op %s: the op table names no output",
				  dg_op_name(c->spec.op));
	if (!st)
		st = dg__op_workspace(c->dev, &c->spec, &c->call, &c->ws_bytes);
	if (!st && c->ws_bytes)
		st = dg_malloc(c->dev, c->ws_bytes, &c->ws);
	c->call.ws.ptr = c->ws;
	c->call.ws.bytes = c->ws_bytes;
	return st;
}

/* ---- the reference ---------------------------------------------------------------- */

static dg_status reference(dg__at_case *c)
{
	const dg_spec *s = &c->spec;
	tbuf *o = &c->buf[c->out];
	dg_ref_call rc;
	dg_status st;

	memset(&rc, 0, sizeof(rc));
	for (int i = 0; i < c->row->n_args; i++) {
		bool inout = (c->row->inout >> i) & 1u;
		rc.in[i] = i == c->out && !inout ? NULL : c->buf[i].host;
		rc.scale[i] = c->buf[i].sval;
		rc.scale_v[i] = i == c->out ? NULL : c->buf[i].svec;
	}
	rc.b = c->b;
	rc.t = c->t_len;
	rc.r = c->r;
	rc.n = c->n;
	rc.p = c->call.p;
	rc.seed = c->call.seed;
	rc.step = c->call.step;
	rc.layer = c->call.layer;
	rc.elem0 = c->call.elem0;
	rc.out_scale = &c->want_scale;
	if (o->svec) {
		/* a scale a row: the quantizers' (1, 1, R, cols) tokens, R rows;
		 * gate_quant's a token (b, t) of its (B, H, T, N) codes */
		c->want_svec = malloc(o->nscale * sizeof(float));
		if (!c->want_svec)
			return DG_ERR_NOMEM;
		rc.out_scale = c->want_svec;
		if (s->op != DG_OP_GATE_QUANT) {
			rc.b = 1;
			rc.t = c->r;
			rc.groups = 1;
			rc.cols = c->n / c->r;
		}
	}
	rc.backward = c->call.backward;
	c->want = malloc(o->bytes + 16);
	if (!c->want)
		return DG_ERR_NOMEM;
	if (s->op == DG_OP_LOWRANK_FWD && dg_fmt_is_code(o->fmt)) {
		/* an out scale that spans the codes, some clamped */
		dg_spec fs = *s;
		float *y = malloc(o->n * 4 + 4), ymax = 0;
		if (!y)
			return DG_ERR_NOMEM;
		fs.out = DG_FMT_F32;
		rc.out = y;
		st = dg_ref_run(&fs, &rc);
		for (size_t i = 0; !st && i < o->n; i++)
			ymax = fmaxf(ymax, fabsf(y[i]));
		free(y);
		if (st)
			return st;
		o->sval = ymax > 0 ? ymax / 100.0f : 1.0f;
		rc.scale[c->out] = o->sval;
		st = dg_memcpy_htod(c->dev, o->scale, &o->sval, sizeof(float));
		if (st)
			return st;
	}
	rc.out = c->want;
	return dg_ref_run(s, &rc);
}

dg_status dg__at_case_create(dg_device *dev, const dg_spec *spec, int rows, bool check,
			     uint64_t seed, dg__at_case **out)
{
	dg_status st;

	*out = NULL;
	dg__at_case *c = calloc(1, sizeof(*c));
	if (!c)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	c->dev = dev;
	c->spec = *spec;
	memset(&c->spec.tile, 0, sizeof(c->spec.tile));
	c->row = dg_op_info_of(spec->op);
	c->rows = rows;
	c->check = check;
	dg_rng_seed(&c->rng, seed);
	st = setup(c);
	if (!st && check) {
		st = reference(c);
		if (st == DG_ERR_NOMEM)
			dg__dev_fail(dev, st, "out of memory computing the reference");
		else if (st)
			dg__dev_fail(dev, st, "the CPU reference of %s failed: %s",
				     dg_op_name(spec->op), dg_status_str(st));
	}
	if (st) {
		dg__at_case_destroy(c);
		return st;
	}
	*out = c;
	return DG_OK;
}

void dg__at_case_destroy(dg__at_case *c)
{
	if (!c)
		return;
	for (int i = 0; i < DG_OP_MAX_ARGS; i++) {
		(void)dg_free(c->dev, c->buf[i].d);
		(void)dg_free(c->dev, c->buf[i].scale);
		free(c->buf[i].host);
		free(c->buf[i].svec);
	}
	(void)dg_free(c->dev, c->ws);
	free(c->want);
	free(c->want_svec);
	free(c);
}

size_t dg__at_case_bytes(const dg__at_case *c)
{
	return c ? c->dev_bytes + c->ws_bytes : 0;
}

/* ---- run and compare ------------------------------------------------------------- */

dg_status dg__at_case_run(dg__at_case *c, const dg_spec *k)
{
	/* the workspace was sized for the default tile: a candidate's may need
	 * more (its splits), so it is asked again and grown outside timing */
	size_t need = 0;
	dg_status st = dg__op_workspace(c->dev, k, &c->call, &need);
	if (!st && need > c->ws_bytes) {
		(void)dg_free(c->dev, c->ws);
		c->ws = 0;
		c->ws_bytes = 0;
		st = dg_malloc(c->dev, need, &c->ws);
		if (!st)
			c->ws_bytes = need;
		c->call.ws.ptr = c->ws;
		c->call.ws.bytes = c->ws_bytes;
	}
	return st ? st : dg__op_run(c->dev, k, &c->call);
}

/* The quantize rule of a weight format with a given scale. */
static int8_t weight_code(dg_fmt f, float v, float s)
{
	if (f == DG_FMT_INT8) {
		if (s == 0.0f)
			return 0;
		float r = rintf(v / s);
		return (int8_t)(r < -127.0f ? -127 : r > 127.0f ? 127 : (int)r);
	}
	if (f == DG_FMT_TERNARY)
		return (int8_t)(fabsf(v) < s ? 0 : (v > 0.0f) - (v < 0.0f));
	return (int8_t)(v >= 0.0f ? 1 : -1);
}

/* The quantizers a scale a row: every scale (activations: max|x|/qmax,
 * exact; weights: one ulp for the double sums of ternary / sign1), then
 * each row's codes exactly the reference's for the GPU's scale. */
static bool compare_rows(dg__at_case *c, const void *got, const float *gsv, char *why,
			 size_t size)
{
	const dg_spec *s = &c->spec;
	const tbuf *o = &c->buf[c->out];
	size_t rows = o->nscale, cols = o->n / rows;
	bool act = s->op == DG_OP_QUANTIZE_ACT;
	for (size_t r = 0; r < rows; r++) {
		float g = gsv[r], w = c->want_svec[r];
		bool ok = act || s->weight == DG_FMT_INT8 ? g == w
							   : fabsf(g - w) <= nextafterf(w, INFINITY) - w;
		if (!ok) {
			snprintf(why, size, "scale of row %zu: %.9g, reference %.9g", r, (double)g,
				 (double)w);
			return false;
		}
	}
	int8_t *want = c->want;
	size_t esz = s->src == DG_FMT_BF16 ? 2 : 4;
	for (size_t r = 0; r < rows; r++) {
		const char *x = (const char *)c->buf[0].host + r * cols * esz;
		if (act) {
			if (dg_ref_quantize_act_apply(s->src, s->act, x, cols, gsv[r], want + r * cols)) {
				snprintf(why, size, "the reference apply step failed");
				return false;
			}
			continue;
		}
		for (size_t j = 0; j < cols; j++) {
			float v = s->src == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)x)[j])
							: ((const float *)x)[j];
			want[r * cols + j] = weight_code(s->weight, v, gsv[r]);
		}
	}
	return dg_ref_same_bytes(got, want, o->bytes, why, size);
}

/* DG_CHECK_NORM of n bf16 values (the attention ops' act outputs,
 * gradients written in bf16): widened exactly, then the same bound. */
static bool close_norm_bf16(const void *got, const void *want, size_t n, char *why, size_t size)
{
	float *g = malloc(n * sizeof(float) + 1), *w = malloc(n * sizeof(float) + 1);
	bool ok = false;
	if (!g || !w) {
		snprintf(why, size, "out of memory widening %zu bf16 values", n);
	} else {
		for (size_t i = 0; i < n; i++) {
			g[i] = dg_bf16_to_f32(((const uint16_t *)got)[i]);
			w[i] = dg_bf16_to_f32(((const uint16_t *)want)[i]);
		}
		ok = dg_ref_close_norm(g, w, n, 1e-2, 5e-2f, why, size);
	}
	free(g);
	free(w);
	return ok;
}

static bool compare(dg__at_case *c, const void *got, const float *gsv, char *why, size_t size)
{
	const float gscale = gsv[0];
	const dg_spec *s = &c->spec;
	const tbuf *o = &c->buf[c->out];
	bool ints = dg_fmt_is_code(s->act) && dg_fmt_is_code(s->weight);

	switch (c->row->check) {
	case DG_CHECK_EXACT:
		/* integer sums are exact, and the epilogue rounds like the
		 * reference; packing is exact */
		if (ints || !(s->op == DG_OP_LOWRANK_FWD || s->op == DG_OP_DECODER_FWD))
			return dg_ref_same_bytes(got, c->want, o->bytes, why, size);
		return dg_ref_close(o->fmt, got, c->want, o->n, dg_fmt_is_code(o->fmt) ? 1.0f : 2e-3f,
				    o->fmt == DG_FMT_BF16 ? 1e-2f : 2e-3f, why, size);
	case DG_CHECK_MASK: {
		if (ints)
			return dg_ref_same_bytes(got, c->want, o->bytes, why, size);
		/* float sums: y within rounding of thr may flip the mask */
		const float *g = got, *w = c->want, *grad = c->buf[2].host;
		size_t off = 0;
		for (size_t i = 0; i < o->n; i++) {
			if (memcmp(&g[i], &w[i], 4) == 0)
				continue;
			if (g[i] != 0.0f && g[i] != grad[i]) {
				snprintf(why, size, "grad_out[%zu] = %.9g is neither grad nor 0", i,
					 (double)g[i]);
				return false;
			}
			off++;
		}
		if (off > o->n / 1000 + 2) {
			snprintf(why, size, "%zu of %zu mask values differ from the reference", off, o->n);
			return false;
		}
		return true;
	}
	case DG_CHECK_NORM:
		/* The tensor-core path rounds the gradient to bf16 (2^-9
		 * relative a term), so a sum that cancels can be off by 1% of
		 * itself: judge the whole result by its norm error, as the GPU
		 * tests do, plus a bound on any one element; an indexing error
		 * is off by about 100% of the norm. */
		if (o->fmt == DG_FMT_BF16)
			return close_norm_bf16(got, c->want, o->n, why, size);
		return dg_ref_close_norm(got, c->want, o->n, 1e-2, 5e-2f, why, size);
	case DG_CHECK_SCALED_CODES:
		break;
	}
	if (s->op == DG_OP_GATE_QUANT) {
		/* the gate and quantize_act's rule, bit for bit: a token's scale
		 * (over its heads), then the codes */
		for (size_t r = 0; r < o->nscale; r++)
			if (memcmp(&gsv[r], &c->want_svec[r], sizeof(float)) != 0) {
				snprintf(why, size, "scale of token %zu: %.9g, reference %.9g", r,
					 (double)gsv[r], (double)c->want_svec[r]);
				return false;
			}
		return dg_ref_same_bytes(got, c->want, o->bytes, why, size);
	}
	if (c->want_svec)
		return compare_rows(c, got, gsv, why, size);
	/* the quantizers: the scale within float summation error (weights:
	 * one ulp), then the codes exactly the reference's for the GPU's scale */
	float ws = c->want_scale;
	if (s->op == DG_OP_QUANTIZE_ACT) {
		if (!(fabsf(gscale - ws) <= 1e-5f * fabsf(ws))) {
			snprintf(why, size, "scale %.9g, reference %.9g", (double)gscale, (double)ws);
			return false;
		}
		if (dg_ref_quantize_act_apply(s->src, s->act, c->buf[0].host, o->n, gscale, c->want)) {
			snprintf(why, size, "the reference apply step failed");
			return false;
		}
		return dg_ref_same_bytes(got, c->want, o->bytes, why, size);
	}
	if (!(fabsf(gscale - ws) <= nextafterf(ws, INFINITY) - ws)) {
		snprintf(why, size, "scale %.9g, reference %.9g (more than one ulp)", (double)gscale,
			 (double)ws);
		return false;
	}
	int8_t *want = c->want;
	for (size_t i = 0; i < o->n; i++) {
		float v = s->src == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)c->buf[0].host)[i])
						: ((const float *)c->buf[0].host)[i];
		want[i] = weight_code(s->weight, v, gscale);
	}
	return dg_ref_same_bytes(got, want, o->bytes, why, size);
}

dg_status dg__at_case_check(dg__at_case *c, const dg_spec *cand, dg__at_verdict *verdict,
			    char *why, size_t why_size)
{
	dg_status st;
	const tbuf *o;

	*verdict = DG__AT_REFUSED;
	why[0] = '\0';
	if (!c->check || !c->want)
		return dg__dev_fail(c->dev, DG_ERR_INTERNAL, "not a check case");
	o = &c->buf[c->out];
	st = dg_memset8(c->dev, o->d, 0xff, o->bytes);
	/* an earlier run overwrote the in-place arguments: their inputs again */
	for (int i = 0; i < c->row->n_args && !st; i++)
		if (((c->row->inout >> i) & 1u) && c->buf[i].host)
			st = dg_memcpy_htod(c->dev, c->buf[i].d, c->buf[i].host, c->buf[i].bytes);
	if (!st)
		st = dg__at_case_run(c, cand);
	if (st) {
		/* a refusal of this candidate, not of the device */
		if (st == DG_ERR_INVALID_ARG || st == DG_ERR_INVALID_SPEC ||
		    st == DG_ERR_UNSUPPORTED || st == DG_ERR_COMPILE) {
			snprintf(why, why_size, "%s", dg_device_errmsg(c->dev));
			return DG_OK;
		}
		return st;
	}
	void *got = malloc(o->bytes + 16);
	float *gsv = calloc(o->nscale, sizeof(float));
	if (!got || !gsv) {
		free(got);
		free(gsv);
		return dg__dev_fail(c->dev, DG_ERR_NOMEM, "out of memory");
	}
	st = dg_memcpy_dtoh(c->dev, got, o->d, o->bytes);
	if (!st && o->scale && c->row->check == DG_CHECK_SCALED_CODES)
		st = dg_memcpy_dtoh(c->dev, gsv, o->scale, o->nscale * sizeof(float));
	if (!st)
		*verdict = compare(c, got, gsv, why, why_size) ? DG__AT_RIGHT : DG__AT_WRONG;
	free(got);
	free(gsv);
	return st;
}
