/*
 * CPU reference of the loss family (runtime/ref/ref_ops.h): lm_head and softmax
 * cross-entropy fused — logits a row at a time, never all of them — with
 * the mean over rows PyTorch's F.cross_entropy takes, and its backward.
 * Sums in double.
 */
#include <math.h>
#include <stdlib.h>

#include "runtime/ref/ref_int.h"

dg_status dg_ref_lmhead_ce(const float *x, const float *w, const int32_t *targets, int64_t rows,
			   int d, int vocab, double *loss, float *dx, float *dw, bool accumulate,
			   int64_t *bad)
{
	for (int64_t r = 0; r < rows; r++) {
		if (targets[r] < 0 || targets[r] >= vocab) {
			if (bad)
				*bad = r;
			return DG_ERR_INVALID_ARG;
		}
	}
	double *z = malloc((size_t)vocab * sizeof(double));
	double *gw = dw ? calloc((size_t)d * vocab, sizeof(double)) : NULL;
	if (!z || (dw && !gw)) {
		free(z);
		free(gw);
		return DG_ERR_NOMEM;
	}
	double total = 0.0;
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * d;
		/* z[v] = Σ_k x[k]·w[k][v], each sum over k in order; k outer, so
		 * w is read along its rows (a vocabulary of 50304 read down its
		 * columns missed the cache at every term) */
		for (int v = 0; v < vocab; v++)
			z[v] = 0.0;
		for (int k = 0; k < d; k++) {
			const double xk = xr[k];
			const float *wk = w + (int64_t)k * vocab;
			for (int v = 0; v < vocab; v++)
				z[v] += xk * wk[v];
		}
		double m = -INFINITY;
		for (int v = 0; v < vocab; v++)
			if (z[v] > m)
				m = z[v];
		double se = 0.0;
		for (int v = 0; v < vocab; v++)
			se += exp(z[v] - m);
		double lse = m + log(se);
		total += lse - z[targets[r]];
		if (!dx && !dw)
			continue;
		/* dlogits = (softmax − onehot) / rows */
		for (int v = 0; v < vocab; v++)
			z[v] = (exp(z[v] - lse) - (v == targets[r])) / (double)rows;
		if (dx)
			for (int k = 0; k < d; k++) {
				double s = 0.0;
				for (int v = 0; v < vocab; v++)
					s += z[v] * w[(int64_t)k * vocab + v];
				dx[r * d + k] = (float)s;
			}
		if (gw)
			for (int k = 0; k < d; k++)
				for (int v = 0; v < vocab; v++)
					gw[(int64_t)k * vocab + v] += (double)xr[k] * z[v];
	}
	if (gw)
		for (int64_t i = 0; i < (int64_t)d * vocab; i++)
			dw[i] = accumulate ? dw[i] + (float)gw[i] : (float)gw[i];
	*loss = total / (double)rows;
	free(z);
	free(gw);
	return DG_OK;
}

void dg_ref_lmhead_logits(const float *x, const float *w, int64_t rows, int d, int vocab, float *out)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * d;
		for (int v = 0; v < vocab; v++) {
			double z = 0.0;
			for (int k = 0; k < d; k++)
				z += (double)xr[k] * (double)w[(int64_t)k * vocab + v];
			out[r * vocab + v] = (float)z;
		}
	}
}
