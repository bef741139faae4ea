/*
 * CPU reference of the gate and its dropout (runtime/ref/ref_ops.h): xy = xs·ys,
 * dropped and rescaled by the counter-based mask of dragon/rng.h, which
 * the backward regenerates instead of storing. elem0 is the first
 * element's index in the mask's stream (a data-parallel rank's rows of the
 * global batch draw its masks): element i draws at elem0 + i.
 * decoder_gate_bwd_ys is lowrank_fwd's reference, then decoder_gate_bwd's.
 */
#include <stdint.h>
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

/* ---- decoder_gate_bwd_ys (templates/decoder_gate.lua) ---------------------------
 * ys as the lowrank_fwd projection writes it (dg_ref_lowrank_fwd, out =
 * src), then dg_ref_decoder_gate_bwd on it: the two references chained,
 * so the op is their arithmetic by construction. */

/* Whether f is one of mask's formats (DG_FMT_BIT). */
static bool fmt_in(unsigned mask, dg_fmt f)
{
	return (unsigned)f < DG_FMT__COUNT && (mask & DG_FMT_BIT(f));
}

dg_status dg_ref_decoder_gate_bwd_ys(const dg_spec *spec, const float *grad, const void *w,
				     const void *xs, const void *aq, const float *sa, const void *ev,
				     const float *sw, int batch, int time, float p, uint64_t seed,
				     uint32_t step, uint32_t layer, uint64_t elem0, void *dxs, void *dys)
{
	if (!spec || spec->op != DG_OP_DECODER_GATE_BWD_YS || !grad || !w || !xs || !aq || !sa ||
	    !ev || !sw || !dxs || !dys || batch < 0 || time < 0 || !(p >= 0.0f && p < 1.0f))
		return DG_ERR_INVALID_ARG;
	/* the formats and scales the op table's row takes */
	const dg_op_info *row = dg_op_info_of(spec->op);
	if (!fmt_in(row->act_fmts, spec->act) || !fmt_in(row->weight_fmts, spec->weight) ||
	    !fmt_in(row->src_fmts, spec->src) || !fmt_in(row->out_fmts, spec->out) ||
	    (spec->ascale != DG_SCALE_TENSOR && spec->ascale != DG_SCALE_TOKEN) ||
	    (spec->wscale != DG_SCALE_TENSOR && spec->wscale != DG_SCALE_CHANNEL) ||
	    spec->heads <= 0 || spec->latent <= 0 || spec->embd <= 0)
		return DG_ERR_INVALID_ARG;
	/* ys (B,H,T,L): its bytes fit a size_t */
	const size_t ext[4] = { (size_t)batch, (size_t)spec->heads, (size_t)time, (size_t)spec->latent };
	size_t n = 1;
	for (int i = 0; i < 4; i++) {
		if (ext[i] && n > SIZE_MAX / 4 / ext[i])
			return DG_ERR_INVALID_ARG;
		n *= ext[i];
	}
	/* the projection: in_heads = heads, ys in src */
	dg_spec ly;
	dg_spec_init(&ly, DG_OP_LOWRANK_FWD);
	ly.heads = spec->heads;
	ly.in_heads = spec->heads;
	ly.embd = spec->embd;
	ly.latent = spec->latent;
	ly.act = spec->act;
	ly.weight = spec->weight;
	ly.ascale = spec->ascale;
	ly.wscale = spec->wscale;
	ly.relu = spec->relu;
	ly.relu_thr = spec->relu_thr;
	ly.out = spec->src;
	/* the gate's backward on it: w the decoder's bf16 copy */
	dg_spec dg;
	dg_spec_init(&dg, DG_OP_DECODER_GATE_BWD);
	dg.heads = spec->heads;
	dg.embd = spec->embd;
	dg.latent = spec->latent;
	dg.weight = DG_FMT_BF16;
	dg.act = spec->src;
	dg.out = spec->out;
	void *ys = malloc(n * (spec->src == DG_FMT_BF16 ? 2 : 4) + 1);
	if (!ys)
		return DG_ERR_NOMEM;
	/* a tensor's scale is sa[0] / sw[0]; a row's or a channel's the vector */
	dg_ref_lowrank_args a = { .x = aq, .w = ev, .sa = sa[0], .sw = sw[0],
				  .sa_v = spec->ascale == DG_SCALE_TOKEN ? sa : NULL,
				  .sw_v = spec->wscale == DG_SCALE_CHANNEL ? sw : NULL,
				  .out = ys, .batch = batch, .time = time };
	dg_status st = dg_ref_lowrank_fwd(&ly, &a);
	if (!st)
		st = dg_ref_decoder_gate_bwd(&dg, grad, w, xs, ys, batch, time, p, seed, step, layer,
					     elem0, dxs, dys);
	free(ys);
	return st;
}
