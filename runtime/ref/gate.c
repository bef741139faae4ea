/*
 * CPU reference of the gate and its dropout (runtime/ref/ref_ops.h): xy = xs·ys,
 * dropped and rescaled by the counter-based mask of dragon/rng.h, which
 * the backward regenerates instead of storing. elem0 is the first
 * element's index in the mask's stream (a data-parallel rank's rows of the
 * global batch draw its masks): element i draws at elem0 + i.
 */
#include <stdlib.h>

#include "dragon/rng.h"
#include "runtime/ref/ref_int.h"

void dg_ref_gate_fwd(const float *xs, const float *ys, int64_t n, float p, uint64_t seed,
		     uint32_t step, uint32_t layer, uint64_t elem0, float *xy)
{
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, elem0 + (uint64_t)i, p);
		xy[i] = keep ? xs[i] * ys[i] * scale : 0.0f;
	}
}

void dg_ref_gate_bwd(const float *dxy, const float *xs, const float *ys, int64_t n, float p,
		     uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, float *dxs, float *dys)
{
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, elem0 + (uint64_t)i, p);
		float g = keep ? dxy[i] * scale : 0.0f;
		dxs[i] = g * ys[i];
		dys[i] = g * xs[i];
	}
}

/* ---- the gate ops (templates/gate.lua) --------------------------------------------
 * The same arithmetic as dg_ref_gate_fwd / _bwd on act storage (and
 * gate_bwd's gradients on theirs): f32 read as is, bf16 widened exactly;
 * bf16 results rounded once (dg__ref_plain_store). */

dg_status dg_ref_gate_fwd_op(dg_fmt act, const void *xs, const void *ys, int64_t n, float p,
			     uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, void *xy)
{
	if ((act != DG_FMT_F32 && act != DG_FMT_BF16) || !xs || !ys || !xy || n < 0)
		return DG_ERR_INVALID_ARG;
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, elem0 + (uint64_t)i, p);
		float x = dg__ref_plain_at(act, xs, (size_t)i), y = dg__ref_plain_at(act, ys, (size_t)i);
		dg__ref_plain_store(act, xy, (size_t)i, keep ? x * y * scale : 0.0f);
	}
	return DG_OK;
}

dg_status dg_ref_gate_bwd_op(dg_fmt act, dg_fmt grad, const void *dxy, const void *xs,
			     const void *ys, int64_t n, float p, uint64_t seed, uint32_t step,
			     uint32_t layer, uint64_t elem0, void *dxs, void *dys)
{
	if ((act != DG_FMT_F32 && act != DG_FMT_BF16) || (grad != DG_FMT_F32 && grad != DG_FMT_BF16) ||
	    !dxy || !xs || !ys || !dxs || n < 0)
		return DG_ERR_INVALID_ARG;
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, elem0 + (uint64_t)i, p);
		float x = dg__ref_plain_at(act, xs, (size_t)i), y = dg__ref_plain_at(act, ys, (size_t)i);
		float g = keep ? dg__ref_plain_at(grad, dxy, (size_t)i) * scale : 0.0f;
		dg__ref_plain_store(grad, dxs, (size_t)i, g * y);
		if (dys) /* after the read of dxy[i]: dys may be dxy */
			dg__ref_plain_store(grad, dys, (size_t)i, y > 0.0f ? g * x : 0.0f);
	}
	return DG_OK;
}

/* ---- decoder_gate_bwd (templates/decoder_gate.lua) ------------------------------
 * decoder_grad_input's f32 result (its sums: dg_ref_decoder_grad_input),
 * then gate_bwd's arithmetic on it, the results stored in spec->out. */
dg_status dg_ref_decoder_gate_bwd(const dg_spec *spec, const float *grad, const void *w,
				  const void *xs, const void *ys, int batch, int time, float p,
				  uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, void *dxs,
				  void *dys)
{
	if (!spec || spec->op != DG_OP_DECODER_GATE_BWD || !grad || !w || !xs || !ys || !dxs ||
	    !dys || batch < 0 || time < 0 || !(p >= 0.0f && p < 1.0f))
		return DG_ERR_INVALID_ARG;
	dg_fmt act = spec->act, grd = spec->out;
	if ((act != DG_FMT_F32 && act != DG_FMT_BF16) || (grd != DG_FMT_F32 && grd != DG_FMT_BF16))
		return DG_ERR_INVALID_ARG;
	dg_spec d = *spec;
	d.op = DG_OP_DECODER_GRAD_INPUT;
	d.out = DG_FMT_F32;
	d.act = DG_FMT_F32;
	d.wscale = DG_SCALE_TENSOR;
	int64_t n = (int64_t)batch * spec->heads * time * spec->latent;
	float *dxy = malloc((size_t)n * sizeof(float) + 1);
	if (!dxy)
		return DG_ERR_NOMEM;
	dg_status st = dg_ref_decoder_grad_input(&d, grad, w, 1.0f, dxy, batch, time);
	float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	for (int64_t i = 0; !st && i < n; i++) {
		bool keep = dg_dropout_keep(seed, step, layer, elem0 + (uint64_t)i, p);
		float x = dg__ref_plain_at(act, xs, (size_t)i), y = dg__ref_plain_at(act, ys, (size_t)i);
		float g = keep ? dxy[i] * scale : 0.0f;
		dg__ref_plain_store(grd, dxs, (size_t)i, g * y);
		dg__ref_plain_store(grd, dys, (size_t)i, y > 0.0f ? g * x : 0.0f);
	}
	free(dxy);
	return st;
}
