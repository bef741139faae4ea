/*
 * CPU references of the attention ops (runtime/ref/ref_ops.h; templates/rope.lua,
 * templates/attention.lua): the same tensors the kernels take, act tensors
 * in f32 or bf16 storage. RoPE in f32 exactly as the kernels round it
 * (dg_ref_rope_fwd / dg_ref_rope_bwd); the GEMMs sum in double from the
 * widened operands, so a GPU result is compared with a tolerance (f32: a
 * state bound; bf16: normwise). Outputs in the act format round to nearest
 * even once. Per (b, h) a T x T scratch at most; no quadratic memory in B.
 * The model's own attention, which the CPU model runs: attention_model.c.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

void dg_ref_rope_pairs(int t_len, int n, float *table)
{
	float *freq = malloc((n > 0 ? (size_t)n : 1) * sizeof(float));
	if (!freq)
		return;
	dg_ref_rope_freq(n, freq);
	dg_ref_rope_pairs_rows(0, t_len, n, freq, table);
	free(freq);
}

/* n values of act storage f (f32 | bf16) as floats (malloc'd). */
static float *widen(dg_fmt f, const void *p, size_t n)
{
	float *o = malloc((n ? n : 1) * sizeof(float));
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++)
		o[i] = dg__ref_plain_at(f, p, i);
	return o;
}

static void put(dg_fmt f, void *p, size_t i, double v)
{
	if (f == DG_FMT_BF16)
		((uint16_t *)p)[i] = dg_f32_to_bf16((float)v);
	else
		((float *)p)[i] = (float)v;
}

/* The rope table's pairs back in dg_ref_rope_fwd's (cos, sin) tables;
 * c and s are NULL after a failure (free them either way). */
static dg_status split_table(const float *rope, int t, int n, float **c, float **s)
{
	size_t half = (size_t)t * (size_t)(n / 2);
	*c = malloc((half ? half : 1) * sizeof(float));
	*s = malloc((half ? half : 1) * sizeof(float));
	if (!*c || !*s) {
		free(*c);
		free(*s);
		*c = *s = NULL;
		return DG_ERR_NOMEM;
	}
	for (size_t i = 0; i < half; i++) {
		(*c)[i] = rope[2 * i];
		(*s)[i] = rope[2 * i + 1];
	}
	return DG_OK;
}

static bool act_ok(const dg_spec *spec)
{
	return spec && (spec->act == DG_FMT_F32 || spec->act == DG_FMT_BF16) && spec->heads > 0 &&
	       spec->latent > 0 && spec->latent % 2 == 0 && spec->embd > 0;
}

static void *xmalloc(size_t n)
{
	return malloc(n ? n : 1);
}

dg_status dg_ref_rope_op(const dg_spec *spec, const void *x, const float *rope, void *out, int b,
			 int t)
{
	if (!spec || !x || !rope || !out || b < 0 || t < 0 || spec->latent % 2 ||
	    (spec->op != DG_OP_ROPE_FWD && spec->op != DG_OP_ROPE_BWD))
		return DG_ERR_INVALID_ARG;
	bool fwd = spec->op == DG_OP_ROPE_FWD;
	dg_fmt f = fwd ? spec->act : DG_FMT_F32;
	int n = spec->latent;
	int64_t rows = (int64_t)b * spec->heads;
	size_t total = (size_t)rows * (size_t)t * (size_t)n;
	float *c, *s;
	float *xf = widen(f, x, total), *of = xmalloc(total * sizeof(float));
	dg_status st = split_table(rope, t, n, &c, &s);
	if (!st && (!xf || !of))
		st = DG_ERR_NOMEM;
	if (!st) {
		if (fwd)
			dg_ref_rope_fwd(xf, c, s, rows, t, n, of);
		else
			dg_ref_rope_bwd(xf, c, s, rows, t, n, of);
		for (size_t i = 0; i < total; i++)
			put(f, out, i, of[i]);
	}
	free(c);
	free(s);
	free(xf);
	free(of);
	return st;
}

/* qr = RoPE(xs) of (b, h) = z: (t, n) floats into q (tmp: t·n scratch);
 * rope=pre: xs is qr already, copied. */
static void rope_rows(const dg_spec *spec, const void *xs, int64_t z, const float *c,
		      const float *s, int t, int n, float *tmp, float *q)
{
	size_t tn = (size_t)t * (size_t)n;
	for (size_t i = 0; i < tn; i++)
		tmp[i] = dg__ref_plain_at(spec->act, xs, (size_t)z * tn + i);
	if (spec->rope_pre)
		memcpy(q, tmp, tn * sizeof(float));
	else
		dg_ref_rope_fwd(tmp, c, s, 1, t, n, q);
}

dg_status dg_ref_attention_scores(const dg_spec *spec, const void *xs, const float *rope,
				  void *scores, int b, int t)
{
	if (!act_ok(spec) || !xs || !rope || !scores || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	int n = spec->latent;
	size_t tn = (size_t)t * (size_t)n, tt = (size_t)t * (size_t)t;
	float *c, *s, *tmp = xmalloc(tn * sizeof(float)), *q = xmalloc(tn * sizeof(float));
	dg_status st = split_table(rope, t, n, &c, &s);
	if (!st && (!tmp || !q))
		st = DG_ERR_NOMEM;
	for (int64_t z = 0; !st && z < (int64_t)b * spec->heads; z++) {
		rope_rows(spec, xs, z, c, s, t, n, tmp, q);
		for (int i = 0; i < t; i++)
			for (int j = 0; j < t; j++) {
				double acc = 0.0;
				for (int k = 0; j < i && k < n; k++)
					acc += (double)q[(size_t)i * n + k] * q[(size_t)j * n + k];
				put(spec->act, scores, (size_t)z * tt + (size_t)i * t + j, acc);
			}
	}
	free(c);
	free(s);
	free(tmp);
	free(q);
	return st;
}

dg_status dg_ref_attention_step(const dg_spec *spec, const void *xs, const float *pos, const float *freq,
				const void *v, float *state, void *out, int b, int t)
{
	if (!act_ok(spec) || !xs || !pos || !freq || !v || !state || !out || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	const int h = spec->heads, n = spec->latent, d = spec->embd;
	if (d % 8)
		return DG_ERR_INVALID_ARG; /* the state's groups of 8 columns */
	const float two_pi = (float)(2.0 * M_PI);
	float *x = widen(spec->act, xs, (size_t)b * h * t * n), *vv = widen(spec->act, v, (size_t)b * t * d);
	float *q = malloc((size_t)n * sizeof(float) + 4);
	double *acc = malloc((size_t)d * sizeof(double) + 8);
	dg_status st = x && vv && q && acc ? DG_OK : DG_ERR_NOMEM;
	for (int64_t z = 0; !st && z < (int64_t)b * h; z++) {
		float *S = state + z * n * d;
		for (int tok = 0; tok < t; tok++) { /* in order: each token sees the ones before */
			const float *xz = x + (z * t + tok) * n, *vz = vv + ((z / h) * t + tok) * d;
			const float tp = pos[z / h] + (float)tok;
			for (int p = 0; p < n / 2; p++) {
				float x0 = xz[2 * p], x1 = xz[2 * p + 1];
				float ph = tp * freq[2 * p];
				ph = (ph - floorf(ph)) * two_pi;
				float c = cosf(ph), s = sinf(ph);
				float a0 = x0 * c, b0 = x1 * s, a1 = x1 * c, b1 = x0 * s;
				q[2 * p] = a0 - b0;
				q[2 * p + 1] = a1 + b1;
			}
			memset(acc, 0, (size_t)d * sizeof(double));
			for (int k = 0; k < n; k++) {
				if (q[k] == 0.0f)
					continue;
				for (int e = 0; e < d; e++) {
					/* the state's groups of 8 columns (dragon/ops.h) */
					float *se = S + ((int64_t)(e / 8) * n + k) * 8 + e % 8;
					acc[e] += (double)q[k] * *se;
					*se = fmaf(q[k], vz[e], *se);
				}
			}
			for (int e = 0; e < d; e++)
				put(spec->act, out, (size_t)(z * t + tok) * d + e, acc[e]);
		}
	}
	free(x);
	free(vv);
	free(q);
	free(acc);
	return st;
}

dg_status dg_ref_attention_out(const dg_spec *spec, const void *scores, const void *v, void *out,
			       int b, int t)
{
	if (!act_ok(spec) || !scores || !v || !out || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	int d = spec->embd, h = spec->heads;
	size_t tt = (size_t)t * (size_t)t, td = (size_t)t * (size_t)d;
	double *acc = xmalloc((size_t)d * sizeof(double));
	if (!acc)
		return DG_ERR_NOMEM;
	for (int64_t z = 0; z < (int64_t)b * h; z++) {
		size_t vb = (size_t)(z / h) * td;
		for (int i = 0; i < t; i++) {
			memset(acc, 0, (size_t)d * sizeof(double));
			for (int j = 0; j < i; j++) {
				double sij = dg__ref_plain_at(spec->act, scores, (size_t)z * tt + (size_t)i * t + j);
				for (int e = 0; e < d; e++)
					acc[e] += sij * dg__ref_plain_at(spec->act, v, vb + (size_t)j * d + e);
			}
			for (int e = 0; e < d; e++)
				put(spec->act, out, (size_t)z * td + (size_t)i * d + e, acc[e]);
		}
	}
	free(acc);
	return DG_OK;
}

dg_status dg_ref_attention_grad_scores(const dg_spec *spec, const float *grad, const void *v,
				       void *grad_scores, int b, int t)
{
	if (!act_ok(spec) || !grad || !v || !grad_scores || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	int d = spec->embd, h = spec->heads;
	size_t tt = (size_t)t * (size_t)t, td = (size_t)t * (size_t)d;
	for (int64_t z = 0; z < (int64_t)b * h; z++) {
		const float *g = grad + (size_t)z * td;
		size_t vb = (size_t)(z / h) * td;
		for (int i = 0; i < t; i++)
			for (int j = 0; j < t; j++) {
				/* C[i][j] = dS[i][j] (j < i) or dS[j][i] (j > i), 0 on the diagonal */
				int r = i > j ? i : j, col = i > j ? j : i;
				double acc = 0.0;
				for (int e = 0; i != j && e < d; e++)
					acc += (double)g[(size_t)r * d + e] *
					       dg__ref_plain_at(spec->act, v, vb + (size_t)col * d + e);
				put(spec->act, grad_scores, (size_t)z * tt + (size_t)i * t + j, acc);
			}
	}
	return DG_OK;
}

dg_status dg_ref_attention_grad_v(const dg_spec *spec, const void *scores, const float *grad,
				  float *grad_v, int b, int t)
{
	if (!act_ok(spec) || !scores || !grad || !grad_v || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	int d = spec->embd, h = spec->heads;
	size_t tt = (size_t)t * (size_t)t, td = (size_t)t * (size_t)d;
	double *acc = xmalloc((size_t)d * sizeof(double));
	if (!acc)
		return DG_ERR_NOMEM;
	for (int bi = 0; bi < b; bi++)
		for (int j = 0; j < t; j++) {
			memset(acc, 0, (size_t)d * sizeof(double));
			for (int hi = 0; hi < h; hi++) {
				size_t z = (size_t)bi * h + hi;
				for (int i = j + 1; i < t; i++) {
					double sij = dg__ref_plain_at(spec->act, scores, z * tt + (size_t)i * t + j);
					const float *g = grad + z * td + (size_t)i * d;
					for (int e = 0; e < d; e++)
						acc[e] += sij * g[e];
				}
			}
			for (int e = 0; e < d; e++)
				grad_v[(size_t)bi * td + (size_t)j * d + e] = (float)acc[e];
		}
	free(acc);
	return DG_OK;
}

dg_status dg_ref_attention_grad_xs(const dg_spec *spec, const void *grad_scores, const void *xs,
				   const float *rope, void *grad_xs, int b, int t)
{
	if (!act_ok(spec) || !grad_scores || !xs || !rope || !grad_xs || b < 0 || t < 0 ||
	    (spec->out != DG_FMT_F32 && spec->out != DG_FMT_BF16) || spec->epi != DG_EPI_STORE)
		return DG_ERR_INVALID_ARG;
	int n = spec->latent;
	size_t tn = (size_t)t * (size_t)n, tt = (size_t)t * (size_t)t;
	float *c, *s, *tmp = xmalloc(tn * sizeof(float)), *q = xmalloc(tn * sizeof(float));
	float *gx = xmalloc(tn * sizeof(float));
	double *acc = xmalloc((size_t)n * sizeof(double));
	dg_status st = split_table(rope, t, n, &c, &s);
	if (!st && (!tmp || !q || !acc || !gx))
		st = DG_ERR_NOMEM;
	for (int64_t z = 0; !st && z < (int64_t)b * spec->heads; z++) {
		rope_rows(spec, xs, z, c, s, t, n, tmp, q);
		for (int i = 0; i < t; i++) {
			memset(acc, 0, (size_t)n * sizeof(double));
			for (int j = 0; j < t; j++) {
				double cij = dg__ref_plain_at(spec->act, grad_scores, (size_t)z * tt + (size_t)i * t + j);
				if (cij == 0.0)
					continue;
				for (int k = 0; k < n; k++)
					acc[k] += cij * q[(size_t)j * n + k];
			}
			for (int k = 0; k < n; k++)
				tmp[(size_t)i * n + k] = (float)acc[k]; /* dqr row i */
		}
		/* RoPEᵀ in f32, then the out format's one rounding */
		dg_ref_rope_bwd(tmp, c, s, 1, t, n, gx);
		for (size_t i = 0; i < tn; i++)
			put(spec->out, grad_xs, (size_t)z * tn + i, gx[i]);
	}
	free(c);
	free(s);
	free(tmp);
	free(q);
	free(gx);
	free(acc);
	return st;
}

/* epi=mask: the two ops it fuses, each by its own reference — grad_xs in
 * f32, then add_mask (other f32) — so the fused kernel is held to the
 * unfused pair. */
dg_status dg_ref_attention_grad_xs_mask(const dg_spec *spec, const void *grad_scores,
					const void *xs, const float *rope, const void *dxs,
					const void *mask_xs, void *out, int b, int t)
{
	if (!act_ok(spec) || spec->epi != DG_EPI_MASK || !dxs || !mask_xs || !out || b < 0 || t < 0)
		return DG_ERR_INVALID_ARG;
	size_t n = (size_t)b * (size_t)spec->heads * (size_t)t * (size_t)spec->latent;
	float *gx = xmalloc(n * sizeof(float));
	if (!gx)
		return DG_ERR_NOMEM;
	dg_spec g = *spec;
	g.epi = DG_EPI_STORE;
	g.out = DG_FMT_F32;
	dg_status st = dg_ref_attention_grad_xs(&g, grad_scores, xs, rope, gx, b, t);
	if (!st)
		st = dg_ref_add_mask(spec->act, spec->out, DG_FMT_F32, dxs, gx, mask_xs, (int64_t)n, out);
	free(gx);
	return st;
}
