/*
 * CPU reference of the gate and its dropout (dragon/ref.h): xy = xs·ys,
 * dropped and rescaled by the counter-based mask of dragon/rng.h, which
 * the backward regenerates instead of storing.
 */
#include "dragon/rng.h"
#include "runtime/ref/ref_int.h"

void dg_ref_gate_fwd(const float *xs, const float *ys, int64_t n, float p, uint64_t seed,
		     uint32_t step, uint32_t layer, float *xy)
{
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, (uint64_t)i, p);
		xy[i] = keep ? xs[i] * ys[i] * scale : 0.0f;
	}
}

void dg_ref_gate_bwd(const float *dxy, const float *xs, const float *ys, int64_t n, float p,
		     uint64_t seed, uint32_t step, uint32_t layer, float *dxs, float *dys)
{
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, (uint64_t)i, p);
		float g = keep ? dxy[i] * scale : 0.0f;
		dxs[i] = g * ys[i];
		dys[i] = g * xs[i];
	}
}
