/*
 * CPU references of BDH attention's chunked (linear-attention) form
 * (runtime/ref/ref_ops.h; the quadratic form: attention_model.c). With no softmax
 * the attention is exactly linear attention with Q = K = qr and V = v:
 *
 *   o_t = Σ_{j<t} (qr_t·qr_j) v_j = qr_t·S_{t−1},   S_t = S_{t−1} + qr_tᵀ v_t
 *
 * (RoPE is a per-position rotation of qr, so it commutes with the sum). In
 * chunks of c rows: o_c = qr_c·S + tril(qr_c qr_cᵀ, −1)·v_c, then
 * S += qr_cᵀ v_c, with a state S of N × D per (b, h). The state is f32 (the
 * form the GPU keeps); a chunk's sums are in double. Chunk 1 is the
 * recurrence sampling uses (one token at a time); chunk ≥ T is the
 * quadratic form. Memory O(N·D + c²) per (b, h), never O(T²).
 *
 * The backward recomputes the states (it stores none): dS_c = tril(dout_c
 * v_cᵀ, −1) within a chunk; the reverse state R = Σ over later chunks of
 * qr_kᵀ dout_k (N × D) carries the gradient to earlier chunks:
 *   dqr_c = dout_c·S_{c−1}ᵀ + v_c·Rᵀ + (dS_c + dS_cᵀ)·qr_c
 *   dv_c  = Σ_h qr_c·R + tril(qr_c qr_cᵀ, −1)ᵀ·dout_c
 * where S_{c−1} holds the chunks before c and R the chunks after it.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

void dg_ref_attention_state_chunk(float *state, const float *qr, const float *v, int c, int n, int d,
				  float *out)
{
	double *acc = malloc((size_t)(d > 0 ? d : 1) * sizeof(double));
	if (!acc)
		return;
	for (int i = 0; i < c; i++) {
		const float *qi = qr + (int64_t)i * n;
		memset(acc, 0, (size_t)d * sizeof(double));
		/* qr_i·S: the rows before the chunk */
		for (int k = 0; k < n; k++) {
			if (qi[k] == 0.0f)
				continue;
			const float *sk = state + (int64_t)k * d;
			for (int e = 0; e < d; e++)
				acc[e] += (double)qi[k] * sk[e];
		}
		/* tril(qr qrᵀ, −1)·v: the rows of the chunk before i */
		for (int j = 0; j < i; j++) {
			const float *qj = qr + (int64_t)j * n;
			double s = 0.0;
			for (int k = 0; k < n; k++)
				s += (double)qi[k] * qj[k];
			for (int e = 0; e < d; e++)
				acc[e] += s * v[(int64_t)j * d + e];
		}
		for (int e = 0; e < d; e++)
			out[(int64_t)i * d + e] = (float)acc[e];
	}
	/* S += qr_cᵀ v_c, each entry summed over the chunk in double, then
	 * added to the f32 state once */
	for (int k = 0; k < n; k++)
		for (int e = 0; e < d; e++) {
			double s = 0.0;
			for (int i = 0; i < c; i++)
				s += (double)qr[(int64_t)i * n + k] * v[(int64_t)i * d + e];
			float *p = state + (int64_t)k * d + e;
			*p = (float)((double)*p + s);
		}
	free(acc);
}

void dg_ref_attention_chunked_fwd(const float *qr, const float *v, int b, int h, int t, int n, int d,
				  int chunk, float *out)
{
	if (chunk < 1)
		chunk = 1;
	float *state = malloc((size_t)(n > 0 ? n : 1) * (size_t)(d > 0 ? d : 1) * sizeof(float));
	if (!state)
		return;
	for (int bi = 0; bi < b; bi++)
		for (int hi = 0; hi < h; hi++) {
			const float *q = qr + ((int64_t)bi * h + hi) * t * n;
			const float *vb = v + (int64_t)bi * t * d;
			float *o = out + ((int64_t)bi * h + hi) * t * d;
			memset(state, 0, (size_t)n * d * sizeof(float));
			for (int t0 = 0; t0 < t; t0 += chunk) {
				int c = t - t0 < chunk ? t - t0 : chunk;
				dg_ref_attention_state_chunk(state, q + (int64_t)t0 * n, vb + (int64_t)t0 * d, c, n,
							     d, o + (int64_t)t0 * d);
			}
		}
	free(state);
}

/* S (n × d) = Σ_{i<rows} qr_iᵀ v_i in double, stored f32 (the forward's
 * state before row `rows`, rebuilt chunk by chunk as the forward adds). */
static void state_before(const float *q, const float *vb, int rows, int chunk, int n, int d, float *s)
{
	memset(s, 0, (size_t)n * d * sizeof(float));
	for (int t0 = 0; t0 < rows; t0 += chunk) {
		int c = rows - t0 < chunk ? rows - t0 : chunk;
		for (int k = 0; k < n; k++)
			for (int e = 0; e < d; e++) {
				double acc = 0.0;
				for (int i = t0; i < t0 + c; i++)
					acc += (double)q[(int64_t)i * n + k] * vb[(int64_t)i * d + e];
				float *p = s + (int64_t)k * d + e;
				*p = (float)((double)*p + acc);
			}
	}
}

void dg_ref_attention_chunked_bwd(const float *dout, const float *qr, const float *v, int b, int h,
				  int t, int n, int d, int chunk, float *dqr, float *dv)
{
	if (chunk < 1)
		chunk = 1;
	size_t nd = (size_t)(n > 0 ? n : 1) * (size_t)(d > 0 ? d : 1);
	float *s = malloc(nd * sizeof(float)), *r = malloc(nd * sizeof(float));
	double *gv = malloc((size_t)(t > 0 ? t : 1) * (size_t)(d > 0 ? d : 1) * sizeof(double));
	double *ds = malloc((size_t)chunk * chunk * sizeof(double));
	if (!s || !r || !gv || !ds)
		goto out;
	for (int bi = 0; bi < b; bi++) {
		const float *vb = v + (int64_t)bi * t * d;
		memset(gv, 0, (size_t)t * d * sizeof(double));
		for (int hi = 0; hi < h; hi++) {
			const float *q = qr + ((int64_t)bi * h + hi) * t * n;
			const float *g = dout + ((int64_t)bi * h + hi) * t * d;
			float *gq = dqr + ((int64_t)bi * h + hi) * t * n;
			memset(r, 0, nd * sizeof(float));
			int last = ((t - 1) / chunk) * chunk;
			/* chunks from the last: R holds the chunks after this one */
			for (int t0 = t > 0 ? last : -1; t0 >= 0; t0 -= chunk) {
				int c = t - t0 < chunk ? t - t0 : chunk;
				state_before(q, vb, t0, chunk, n, d, s);
				/* dS = tril(dout vᵀ, −1) within the chunk */
				for (int i = 0; i < c; i++)
					for (int j = 0; j < c; j++) {
						double acc = 0.0;
						if (j < i)
							for (int e = 0; e < d; e++)
								acc += (double)g[(int64_t)(t0 + i) * d + e] *
								       vb[(int64_t)(t0 + j) * d + e];
						ds[(int64_t)i * c + j] = acc;
					}
				for (int i = 0; i < c; i++) {
					const int ti = t0 + i;
					for (int k = 0; k < n; k++) {
						double acc = 0.0;
						/* dout_i·S_kᵀ + v_i·R_kᵀ */
						for (int e = 0; e < d; e++)
							acc += (double)g[(int64_t)ti * d + e] * s[(int64_t)k * d + e] +
							       (double)vb[(int64_t)ti * d + e] * r[(int64_t)k * d + e];
						/* (dS + dSᵀ)·qr */
						for (int j = 0; j < c; j++) {
							double cc = ds[(int64_t)i * c + j] + ds[(int64_t)j * c + i];
							if (cc != 0.0)
								acc += cc * q[(int64_t)(t0 + j) * n + k];
						}
						gq[(int64_t)ti * n + k] = (float)acc;
					}
					/* dv_i += qr_i·R + Σ_{j>i} (qr_j·qr_i) dout_j */
					for (int e = 0; e < d; e++) {
						double acc = 0.0;
						for (int k = 0; k < n; k++)
							acc += (double)q[(int64_t)ti * n + k] * r[(int64_t)k * d + e];
						gv[(int64_t)ti * d + e] += acc;
					}
					for (int j = i + 1; j < c; j++) {
						double sc = 0.0;
						for (int k = 0; k < n; k++)
							sc += (double)q[(int64_t)(t0 + j) * n + k] * q[(int64_t)ti * n + k];
						for (int e = 0; e < d; e++)
							gv[(int64_t)ti * d + e] += sc * g[(int64_t)(t0 + j) * d + e];
					}
				}
				/* R += qr_cᵀ dout_c */
				for (int k = 0; k < n; k++)
					for (int e = 0; e < d; e++) {
						double acc = 0.0;
						for (int i = 0; i < c; i++)
							acc += (double)q[(int64_t)(t0 + i) * n + k] *
							       g[(int64_t)(t0 + i) * d + e];
						float *p = r + (int64_t)k * d + e;
						*p = (float)((double)*p + acc);
					}
			}
		}
		float *ov = dv + (int64_t)bi * t * d;
		for (int64_t k = 0; k < (int64_t)t * d; k++)
			ov[k] = (float)gv[k];
	}
out:
	free(s);
	free(r);
	free(gv);
	free(ds);
}

/* ---- the GPU chain's pieces (templates/attention_chunk.lua) -------------- */

static void split_store(uint16_t *hi, uint16_t *lo, float x)
{
	*hi = dg_ref_f32_to_bf16(x);
	*lo = dg_ref_f32_to_bf16(x - dg_ref_bf16_to_f32(*hi));
}

void dg_ref_attention_chunk_state(const float *qr, const float *v, int b, int h, int t, int n, int d,
				  int chunk, int vh, bool reverse, uint16_t *states)
{
	const int nc = t / chunk;
	const size_t nd = (size_t)n * d;
	float *acc = malloc(nd * sizeof(float) + 4);
	if (!acc)
		return;
	for (int bi = 0; bi < b; bi++)
		for (int hi = 0; hi < h; hi++) {
			const int z = bi * h + hi;
			const float *q = qr + (int64_t)z * t * n;
			const float *vz = v + (int64_t)(vh == 1 ? bi : z) * t * d;
			memset(acc, 0, nd * sizeof(float));
			for (int w = 0; w < nc; w++) {
				const int c = reverse ? nc - 1 - w : w;
				uint16_t *st = states + ((int64_t)z * nc + c) * 2 * (int64_t)nd;
				for (size_t i = 0; i < nd; i++)
					split_store(st + i, st + nd + i, acc[i]);
				/* then the chunk's rows, each entry's sum in double */
				for (int k = 0; k < n; k++)
					for (int e = 0; e < d; e++) {
						double s = 0.0;
						for (int i = c * chunk; i < (c + 1) * chunk; i++)
							s += (double)q[(int64_t)i * n + k] * vz[(int64_t)i * d + e];
						float *p = acc + (int64_t)k * d + e;
						*p = (float)((double)*p + s);
					}
			}
		}
	free(acc);
}

/* The chunk's state (2N, D) bf16 hi + lo at row k, column e. */
static double state_at(const uint16_t *st, int n, int d, int k, int e)
{
	return (double)dg_ref_bf16_to_f32(st[(int64_t)k * d + e]) +
	       (double)dg_ref_bf16_to_f32(st[((int64_t)n + k) * d + e]);
}

void dg_ref_attention_chunk_out(const float *qr, const uint16_t *states, int b, int h, int t, int n, int d,
				int chunk, bool reverse, float *out)
{
	const int nc = t / chunk;
	for (int64_t z = 0; z < (int64_t)b * h; z++)
		for (int c = 0; c < nc; c++) {
			if (c == (reverse ? nc - 1 : 0))
				continue; /* the walk's first chunk: its state is zero */
			const uint16_t *st = states + (z * nc + c) * 2 * (int64_t)n * d;
			for (int i = c * chunk; i < (c + 1) * chunk; i++)
				for (int e = 0; e < d; e++) {
					double s = 0.0;
					for (int k = 0; k < n; k++)
						s += (double)qr[(z * t + i) * n + k] * state_at(st, n, d, k, e);
					float *p = out + (z * t + i) * d + e;
					*p = (float)((double)*p + s);
				}
		}
}

void dg_ref_attention_chunk_dq(const float *cc, const float *qr, const float *dout, const float *v,
			       const uint16_t *s_states, const uint16_t *r_states, int b, int h, int t, int n,
			       int d, int chunk, float *dqr)
{
	const int nc = t / chunk;
	for (int64_t z = 0; z < (int64_t)b * h; z++) {
		const int64_t bi = z / h;
		for (int c = 0; c < nc; c++) {
			const int64_t zc = z * nc + c;
			const uint16_t *ss = s_states + zc * 2 * (int64_t)n * d;
			const uint16_t *rs = r_states + zc * 2 * (int64_t)n * d;
			const float *cz = cc + zc * chunk * chunk;
			for (int i = c * chunk; i < (c + 1) * chunk; i++)
				for (int k = 0; k < n; k++) {
					double s = 0.0;
					for (int j = 0; j < chunk; j++) /* within the chunk */
						s += (double)cz[(int64_t)(i - c * chunk) * chunk + j] *
						     qr[(z * t + c * chunk + j) * n + k];
					for (int e = 0; e < d; e++) /* the chunks before and after */
						s += (double)dout[(z * t + i) * d + e] * state_at(ss, n, d, k, e) +
						     (double)v[(bi * t + i) * d + e] * state_at(rs, n, d, k, e);
					float *p = dqr + (z * t + i) * n + k;
					*p = (float)((double)*p + s);
				}
		}
	}
}
