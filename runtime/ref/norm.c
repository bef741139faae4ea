/*
 * CPU references of the norm family (runtime/ref/ref_ops.h): layer norm over the
 * last dimension without affine parameters, forward and backward, as
 * PyTorch's nn.LayerNorm(d, elementwise_affine=False) computes them (the
 * biased variance, eps inside the square root). Sums in double.
 */
#include <math.h>

#include "runtime/ref/ref_int.h"

void dg_ref_layernorm_fwd(const float *x, int64_t rows, int d, float eps, float *y, float *mean,
			  float *rstd)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *xr = x + r * d;
		float *yr = y + r * d;
		double s = 0.0, s2 = 0.0;
		for (int i = 0; i < d; i++)
			s += xr[i];
		double mu = s / d;
		for (int i = 0; i < d; i++)
			s2 += ((double)xr[i] - mu) * ((double)xr[i] - mu);
		double rs = 1.0 / sqrt(s2 / d + (double)eps);
		for (int i = 0; i < d; i++)
			yr[i] = (float)(((double)xr[i] - mu) * rs);
		if (mean)
			mean[r] = (float)mu;
		if (rstd)
			rstd[r] = (float)rs;
	}
}

void dg_ref_layernorm_bwd(const float *dy, const float *y, const float *rstd, int64_t rows,
			  int d, float *dx, bool accumulate)
{
	for (int64_t r = 0; r < rows; r++) {
		const float *g = dy + r * d, *yr = y + r * d;
		float *o = dx + r * d;
		double sg = 0.0, sgy = 0.0;
		for (int i = 0; i < d; i++) {
			sg += g[i];
			sgy += (double)g[i] * yr[i];
		}
		double mg = sg / d, mgy = sgy / d;
		for (int i = 0; i < d; i++) {
			float v = (float)((double)rstd[r] * ((double)g[i] - mg - (double)yr[i] * mgy));
			o[i] = accumulate ? o[i] + v : v;
		}
	}
}
