/*
 * CPU references of the model's attention (runtime/ref/ref_ops.h), what the CPU
 * model runs: the RoPE tables and rotation of bdh.py, and BDH's attention
 * — no softmax, no scaling, strictly causal (tril(·, −1)), the values
 * shared by every head — forward and backward. Sums in double; S is
 * recomputed, never stored. Its chunked form: attention_chunked.c; the
 * references of the attention ops, on the kernels' tensors: attention.c.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

#define ROPE_THETA 65536.0f

/* Pair p's frequency at 2p and 2p+1 (the reference's f32 arithmetic:
 * quantize(i) = 2·floor(i/2)). */
static float rope_freq_of(int p, int n)
{
	const float two_pi = (float)(2.0 * M_PI);
	float expo = (float)(2 * p) / (float)n;
	return 1.0f / powf(ROPE_THETA, expo) / two_pi;
}

/* cos and sin of the phase (t·freq mod 1)·2π, in f32. */
static void rope_at(int t, float freq, float *c, float *s)
{
	const float two_pi = (float)(2.0 * M_PI);
	float ph = (float)t * freq;
	ph = (ph - floorf(ph)) * two_pi;
	*c = cosf(ph);
	*s = sinf(ph);
}

void dg_ref_rope_freq(int n, float *freq)
{
	for (int p = 0; p < n / 2; p++)
		freq[2 * p] = freq[2 * p + 1] = rope_freq_of(p, n);
}

void dg_ref_rope_row(int t, int n, float *cos_t, float *sin_t)
{
	for (int p = 0; p < n / 2; p++)
		rope_at(t, rope_freq_of(p, n), &cos_t[p], &sin_t[p]);
}

void dg_ref_rope_pairs_rows(int t0, int t1, int n, const float *freq, float *table)
{
	for (int t = t0; t < t1; t++) {
		float *row = table + (int64_t)t * n;
		for (int p = 0; p < n / 2; p++)
			rope_at(t, freq[2 * p], &row[2 * p], &row[2 * p + 1]);
	}
}

void dg_ref_rope_table(int t_len, int n, float *cos_t, float *sin_t)
{
	for (int t = 0; t < t_len; t++)
		dg_ref_rope_row(t, n, cos_t + (int64_t)t * (n / 2), sin_t + (int64_t)t * (n / 2));
}

void dg_ref_rope_fwd(const float *v, const float *cos_t, const float *sin_t, int64_t rows,
		     int t_len, int n, float *out)
{
	for (int64_t r = 0; r < rows; r++)
		for (int t = 0; t < t_len; t++) {
			const float *a = v + (r * t_len + t) * n;
			float *o = out + (r * t_len + t) * n;
			const float *c = cos_t + (int64_t)t * (n / 2), *s = sin_t + (int64_t)t * (n / 2);
			for (int p = 0; p < n / 2; p++) {
				float e = a[2 * p], od = a[2 * p + 1];
				o[2 * p] = e * c[p] - od * s[p];
				o[2 * p + 1] = od * c[p] + e * s[p];
			}
		}
}

void dg_ref_rope_bwd(const float *dout, const float *cos_t, const float *sin_t, int64_t rows,
		     int t_len, int n, float *dv)
{
	for (int64_t r = 0; r < rows; r++)
		for (int t = 0; t < t_len; t++) {
			const float *g = dout + (r * t_len + t) * n;
			float *o = dv + (r * t_len + t) * n;
			const float *c = cos_t + (int64_t)t * (n / 2), *s = sin_t + (int64_t)t * (n / 2);
			for (int p = 0; p < n / 2; p++) {
				float ge = g[2 * p], go = g[2 * p + 1];
				o[2 * p] = ge * c[p] + go * s[p];
				o[2 * p + 1] = go * c[p] - ge * s[p];
			}
		}
}

/* S[i, j] = qr_i · qr_j for j < i (one head of one batch row). */
static double score(const float *qr, int n, int i, int j)
{
	double s = 0.0;
	for (int k = 0; k < n; k++)
		s += (double)qr[(int64_t)i * n + k] * qr[(int64_t)j * n + k];
	return s;
}

void dg_ref_attention_fwd(const float *qr, const float *v, int b, int h, int t, int n, int d,
			  float *out)
{
	double *acc = malloc((size_t)d * sizeof(double));
	if (!acc)
		return;
	for (int bi = 0; bi < b; bi++)
		for (int hi = 0; hi < h; hi++) {
			const float *q = qr + ((int64_t)bi * h + hi) * t * n;
			const float *vb = v + (int64_t)bi * t * d;
			float *o = out + ((int64_t)bi * h + hi) * t * d;
			for (int i = 0; i < t; i++) {
				memset(acc, 0, (size_t)d * sizeof(double));
				for (int j = 0; j < i; j++) {
					double s = score(q, n, i, j);
					for (int k = 0; k < d; k++)
						acc[k] += s * vb[(int64_t)j * d + k];
				}
				for (int k = 0; k < d; k++)
					o[(int64_t)i * d + k] = (float)acc[k];
			}
		}
	free(acc);
}

void dg_ref_attention_bwd(const float *dout, const float *qr, const float *v, int b, int h, int t,
			  int n, int d, float *dqr, float *dv)
{
	double *ds = malloc((size_t)t * t * sizeof(double));
	double *gq = malloc((size_t)t * n * sizeof(double));
	double *gv = malloc((size_t)t * d * sizeof(double));
	if (!ds || !gq || !gv)
		goto out;
	for (int bi = 0; bi < b; bi++) {
		const float *vb = v + (int64_t)bi * t * d;
		memset(gv, 0, (size_t)t * d * sizeof(double));
		for (int hi = 0; hi < h; hi++) {
			const float *q = qr + ((int64_t)bi * h + hi) * t * n;
			const float *g = dout + ((int64_t)bi * h + hi) * t * d;
			/* dS = tril(dout·vᵀ, −1) */
			for (int i = 0; i < t; i++)
				for (int j = 0; j < t; j++) {
					double s = 0.0;
					if (j < i)
						for (int k = 0; k < d; k++)
							s += (double)g[(int64_t)i * d + k] * vb[(int64_t)j * d + k];
					ds[(int64_t)i * t + j] = s;
				}
			/* dqr_i = Σ_j (dS[i,j] + dS[j,i]) qr_j */
			memset(gq, 0, (size_t)t * n * sizeof(double));
			for (int i = 0; i < t; i++)
				for (int j = 0; j < t; j++) {
					double c = ds[(int64_t)i * t + j] + ds[(int64_t)j * t + i];
					if (c == 0.0)
						continue;
					for (int k = 0; k < n; k++)
						gq[(int64_t)i * n + k] += c * q[(int64_t)j * n + k];
				}
			float *oq = dqr + ((int64_t)bi * h + hi) * t * n;
			for (int64_t k = 0; k < (int64_t)t * n; k++)
				oq[k] = (float)gq[k];
			/* dv_j += Σ_{i > j} S[i,j] dout_i */
			for (int i = 0; i < t; i++)
				for (int j = 0; j < i; j++) {
					double s = score(q, n, i, j);
					for (int k = 0; k < d; k++)
						gv[(int64_t)j * d + k] += s * g[(int64_t)i * d + k];
				}
		}
		float *ov = dv + (int64_t)bi * t * d;
		for (int64_t k = 0; k < (int64_t)t * d; k++)
			ov[k] = (float)gv[k];
	}
out:
	free(ds);
	free(gq);
	free(gv);
}
