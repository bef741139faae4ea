/*
 * The references by number (dg_ref_run): an adapter an op of DG_OP_LIST,
 * named after it, from the op table's argument order to the op's own
 * reference (dragon/ref.h). An op without one fails to link.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

/* epi=rope: out into outs[2] (else scratch), then qr = rope_fwd's of it
 * into outs[4] (else `out`, the last output the spec uses). */
dg_status dg__ref_lowrank_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	const bool rope = spec->epi == DG_EPI_ROPE;
	const size_t n = (size_t)c->b * (size_t)spec->heads * (size_t)c->t * (size_t)spec->latent;
	void *out = rope ? (c->outs[2] ? c->outs[2] : malloc(n * sizeof(uint16_t) + 1)) : c->out;
	if (!out)
		return DG_ERR_NOMEM;
	dg_ref_lowrank_args a = { .x = c->in[0], .w = c->in[1], .sa = c->scale[0],
				  .sw = c->scale[1], .so = c->scale[2], .sa_v = c->scale_v[0],
				  .sw_v = c->scale_v[1], .out = out, .batch = (int)c->b,
				  .time = (int)c->t };
	dg_status st = dg_ref_lowrank_fwd(spec, &a);
	if (!st && rope) {
		dg_spec r;
		dg_spec_init(&r, DG_OP_ROPE_FWD);
		r.act = spec->out;
		r.heads = spec->heads;
		r.latent = spec->latent;
		st = !c->in[3] ? DG_ERR_INVALID_ARG
			       : dg_ref_rope_op(&r, out, c->in[3], c->outs[4] ? c->outs[4] : c->out, (int)c->b,
						(int)c->t);
	}
	if (rope && out != c->outs[2])
		free(out);
	return st;
}

dg_status dg__ref_relu_mask(const dg_spec *spec, const dg_ref_call *c)
{
	return dg__ref_relu_mask_v(spec, c->in[0], c->in[1], c->scale[0], c->scale[1],
				   c->scale_v[0], c->scale_v[1], c->in[2], c->out, (int)c->b,
				   (int)c->t);
}

dg_status dg__ref_lowrank_grad_input(const dg_spec *spec, const dg_ref_call *c)
{
	return dg__ref_lowrank_grad_input_v(spec, c->in[0], c->in[1], c->scale[1], c->scale_v[1],
					    c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_lowrank_grad_weight(const dg_spec *spec, const dg_ref_call *c)
{
	return dg__ref_lowrank_grad_weight_v(spec, c->in[0], c->in[1], c->scale[1], c->scale_v[1],
					     c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_decoder_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	dg_ref_decoder_args a = { .y = c->in[0], .w = c->in[1], .sa = c->scale[0],
				  .sw = c->scale[1], .sa_v = c->scale_v[0], .sw_v = c->scale_v[1],
				  .out = c->out, .batch = (int)c->b, .time = (int)c->t };
	return dg_ref_decoder_fwd(spec, &a);
}

dg_status dg__ref_decoder_grad_input(const dg_spec *spec, const dg_ref_call *c)
{
	return dg__ref_decoder_grad_input_v(spec, c->in[0], c->in[1], c->scale[1], c->scale_v[1],
					    c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_decoder_grad_weight(const dg_spec *spec, const dg_ref_call *c)
{
	return dg__ref_decoder_grad_weight_v(spec, c->in[0], c->in[1], c->scale[1], c->scale_v[1],
					     c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_quantize_act(const dg_spec *spec, const dg_ref_call *c)
{
	float s = 0;
	if (spec->ascale == DG_SCALE_TOKEN) {
		/* x (b, groups, t, cols): a scale a token into out_scale */
		if (!c->out_scale)
			return DG_ERR_INVALID_ARG;
		return dg_ref_quantize_act_rows(spec->src, spec->act, c->in[0], (size_t)c->b,
						(size_t)c->groups, (size_t)c->t, (size_t)c->cols,
						c->out, c->out_scale);
	}
	dg_status st = dg_ref_quantize_act(spec->src, spec->act, c->in[0], (size_t)c->n, c->out, &s);
	if (c->out_scale)
		*c->out_scale = s;
	return st;
}

dg_status dg__ref_quantize_weight(const dg_spec *spec, const dg_ref_call *c)
{
	size_t n = (size_t)c->n;
	const float *w = c->in[0];
	float *conv = NULL, s = 0;
	if (spec->src == DG_FMT_BF16) {
		conv = malloc(n * sizeof(float) + 1);
		if (!conv)
			return DG_ERR_NOMEM;
		for (size_t i = 0; i < n; i++)
			conv[i] = dg_bf16_to_f32(((const uint16_t *)c->in[0])[i]);
		w = conv;
	}
	dg_status st;
	if (spec->wscale == DG_SCALE_CHANNEL) /* rows of cols: a scale a row into out_scale */
		st = c->out_scale && c->cols > 0
			     ? dg_ref_quantize_weight_rows(spec->weight, w, n / (size_t)c->cols,
							   (size_t)c->cols, c->out, c->out_scale)
			     : DG_ERR_INVALID_ARG;
	else
		st = dg_ref_quantize_weight(spec->weight, w, n, c->out, &s);
	free(conv);
	if (spec->wscale == DG_SCALE_CHANNEL)
		return st;
	if (c->out_scale)
		*c->out_scale = s;
	return st;
}

static dg_status pack_weight(const dg_spec *spec, const dg_ref_call *c, bool tern)
{
	size_t rows = (size_t)c->r;
	if (c->unpack)
		return tern ? dg_ref_unpack_ternary(c->in[1], c->out, rows, spec->embd)
			    : dg_ref_unpack_sign1(c->in[1], c->out, rows, spec->embd);
	return tern ? dg_ref_pack_ternary(c->in[0], c->out, rows, spec->embd)
		    : dg_ref_pack_sign1(c->in[0], c->out, rows, spec->embd);
}

dg_status dg__ref_pack_ternary(const dg_spec *spec, const dg_ref_call *c)
{
	return pack_weight(spec, c, true);
}

dg_status dg__ref_pack_sign1(const dg_spec *spec, const dg_ref_call *c)
{
	return pack_weight(spec, c, false);
}

dg_status dg__ref_pack_i8x4(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_pack_i8x4(c->in[0], c->out, (size_t)c->r, spec->embd, spec->latent);
}

dg_status dg__ref_unpack_i8x4(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_unpack_i8x4(c->in[0], c->out, (size_t)c->r, spec->embd, spec->latent);
}

dg_status dg__ref_rope_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_rope_op(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_rope_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_rope_op(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_attention_scores(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_attention_scores(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_attention_out(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_attention_out(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_attention_grad_scores(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_attention_grad_scores(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

dg_status dg__ref_attention_grad_v(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_attention_grad_v(spec, c->in[0], c->in[1], c->out, (int)c->b, (int)c->t);
}

/* epi=mask: dxs (argument 4) in and out (out holds the new dxs), mask_xs 5 */
dg_status dg__ref_attention_grad_xs(const dg_spec *spec, const dg_ref_call *c)
{
	if (spec->epi == DG_EPI_MASK)
		return dg_ref_attention_grad_xs_mask(spec, c->in[0], c->in[1], c->in[2], c->in[4],
						     c->in[5], c->out, (int)c->b, (int)c->t);
	return dg_ref_attention_grad_xs(spec, c->in[0], c->in[1], c->in[2], c->out, (int)c->b,
					(int)c->t);
}

/* ---- embed, norm, loss: rows R of width D -------------------------------------- */

/* n values of a float tensor (f32 | bf16) as f32, malloc'd (NULL: no memory). */
static float *floats_of(dg_fmt f, const void *p, size_t n)
{
	float *o = malloc(n * sizeof(float) + 1);
	for (size_t i = 0; o && i < n; i++)
		o[i] = dg__ref_plain_at(f, p, i);
	return o;
}

/* f32 values into a tensor's storage of format f (f32 | bf16). */
static void store_floats(dg_fmt f, const float *v, size_t n, void *dst)
{
	if (f == DG_FMT_BF16)
		for (size_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = dg_f32_to_bf16(v[i]);
	else
		memcpy(dst, v, n * sizeof(float));
}

/* Output i's storage: outs[i], else `out` for the last output the spec
 * uses (dg_op_arg_used), else NULL. */
static void *out_at(const dg_spec *spec, const dg_ref_call *c, int i)
{
	const dg_op_info *row = dg_op_info_of(spec->op);
	int last = -1;
	for (int j = 0; j < row->n_args; j++)
		if (row->args[j].output && dg_op_arg_used(spec, j))
			last = j;
	return c->outs[i] ? c->outs[i] : i == last ? c->out : NULL;
}

static bool tokens_ok(const int32_t *idx, int64_t n, int vocab)
{
	for (int64_t i = 0; i < n; i++)
		if (idx[i] < 0 || idx[i] >= vocab)
			return false;
	return true;
}

dg_status dg__ref_embed_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	size_t n = (size_t)c->r * (size_t)spec->embd;
	float *o = malloc(n * sizeof(float) + 1);
	void *dst = out_at(spec, c, 2);
	if (!o)
		return DG_ERR_NOMEM;
	dg_status st = dg_ref_embed_fwd(c->in[1], spec->vocab, spec->embd, c->in[0], c->r, o, NULL);
	if (!st && dst)
		store_floats(spec->out, o, n, dst);
	free(o);
	return st;
}

dg_status dg__ref_embed_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	size_t n = (size_t)c->r * (size_t)spec->embd;
	float *dtable = out_at(spec, c, 2);
	if (!tokens_ok(c->in[0], c->r, spec->vocab))
		return DG_ERR_INVALID_ARG;
	float *dout = floats_of(spec->src, c->in[1], n);
	if (!dout)
		return DG_ERR_NOMEM;
	if (!c->accumulate)
		memset(dtable, 0, (size_t)spec->vocab * (size_t)spec->embd * sizeof(float));
	dg_ref_embed_bwd(dout, spec->embd, c->in[0], c->r, dtable);
	free(dout);
	return DG_OK;
}

/* The forwards: h = x (+ y), LN(h) into the output of argument iy, rstd
 * into argument iy + 1. */
static dg_status ln_fwd(const dg_spec *spec, const dg_ref_call *c, bool resid)
{
	size_t n = (size_t)c->r * (size_t)spec->embd;
	int iy = resid ? 2 : 1;
	float *h = floats_of(spec->src, c->in[0], n), *y = malloc(n * sizeof(float) + 1);
	float *rstd = malloc((size_t)c->r * sizeof(float) + 1);
	float *yb = resid ? floats_of(spec->src, c->in[1], n) : NULL;
	dg_status st = DG_ERR_NOMEM;
	if (h && y && rstd && (!resid || yb)) {
		for (size_t i = 0; resid && i < n; i++)
			h[i] = h[i] + yb[i];
		dg_ref_layernorm_fwd(h, c->r, spec->embd, c->eps, y, NULL, rstd);
		void *dy = out_at(spec, c, iy), *dr = out_at(spec, c, iy + 1);
		if (dy)
			store_floats(spec->out, y, n, dy);
		if (dr)
			memcpy(dr, rstd, (size_t)c->r * sizeof(float));
		st = DG_OK;
	}
	free(h);
	free(y);
	free(rstd);
	free(yb);
	return st;
}

/* The backwards: g = LN gradient of in[0] at the saved output in[1] and
 * rstd in[2]; dx (argument 3) (+)= g; resid: dy (argument 4) = g. */
static dg_status ln_bwd(const dg_spec *spec, const dg_ref_call *c, bool resid)
{
	size_t n = (size_t)c->r * (size_t)spec->embd;
	float *y = floats_of(spec->src, c->in[1], n);
	float *dx = out_at(spec, c, 3), *dy = resid ? out_at(spec, c, 4) : NULL;
	if (!y)
		return DG_ERR_NOMEM;
	if (dx)
		dg_ref_layernorm_bwd(c->in[0], y, c->in[2], c->r, spec->embd, dx, c->accumulate);
	if (dy)
		dg_ref_layernorm_bwd(c->in[0], y, c->in[2], c->r, spec->embd, dy, false);
	free(y);
	return DG_OK;
}

dg_status dg__ref_layernorm_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	return ln_fwd(spec, c, false);
}

dg_status dg__ref_layernorm_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	return ln_bwd(spec, c, false);
}

dg_status dg__ref_resid_ln_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	return ln_fwd(spec, c, true);
}

dg_status dg__ref_resid_ln_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	return ln_bwd(spec, c, true);
}

/* x (R,D) src, w (D,V) f32 → logits (R,V) f32 (argument 2). */
dg_status dg__ref_lmhead_logits(const dg_spec *spec, const dg_ref_call *c)
{
	size_t nx = (size_t)c->r * (size_t)spec->embd;
	float *o = out_at(spec, c, 2);
	float *x = floats_of(spec->src, c->in[0], nx);
	if (!x)
		return DG_ERR_NOMEM;
	if (o)
		dg_ref_lmhead_logits(x, c->in[1], c->r, spec->embd, spec->vocab, o);
	free(x);
	return DG_OK;
}

/* x (R,D) src, w (D,V) weight, targets (R) → loss (1) f32 (argument 3),
 * dx (4), dw (5, accumulate). */
dg_status dg__ref_lmhead_ce(const dg_spec *spec, const dg_ref_call *c)
{
	size_t nx = (size_t)c->r * (size_t)spec->embd, nw = (size_t)spec->embd * (size_t)spec->vocab;
	float *lossp = out_at(spec, c, 3), *dx = out_at(spec, c, 4), *dw = out_at(spec, c, 5);
	bool backward = c->backward || dx || dw;
	float *x = floats_of(spec->src, c->in[0], nx), *w = floats_of(spec->weight, c->in[1], nw);
	float *sdx = backward && !dx ? malloc(nx * sizeof(float) + 1) : NULL;
	float *sdw = backward && !dw ? calloc(nw + 1, sizeof(float)) : NULL;
	dg_status st = DG_ERR_NOMEM;
	if (x && w && (!backward || ((dx || sdx) && (dw || sdw)))) {
		double loss = 0.0;
		st = dg_ref_lmhead_ce(x, w, c->in[2], c->r, spec->embd, spec->vocab, &loss,
				      backward ? (dx ? dx : sdx) : NULL, backward ? (dw ? dw : sdw) : NULL,
				      c->accumulate, NULL);
		if (!st && lossp)
			*lossp = (float)loss;
	}
	free(x);
	free(w);
	free(sdx);
	free(sdw);
	return st;
}

static int64_t bhtl(const dg_spec *spec, const dg_ref_call *c)
{
	return c->b * spec->heads * c->t * spec->latent;
}

dg_status dg__ref_gate_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_gate_fwd_op(spec->act, c->in[0], c->in[1], bhtl(spec, c), c->p, c->seed, c->step,
				  c->layer, c->elem0, c->out);
}

/* gate_fwd's xy (src), then quantize_act ascale=token of it: the codes
 * and a scale a token (out_scale) gate_quant gives bit for bit. */
dg_status dg__ref_gate_quant(const dg_spec *spec, const dg_ref_call *c)
{
	if (!c->out_scale)
		return DG_ERR_INVALID_ARG;
	const int64_t n = bhtl(spec, c);
	void *xy = malloc((size_t)n * (spec->src == DG_FMT_BF16 ? 2 : 4) + 4);
	if (!xy)
		return DG_ERR_NOMEM;
	dg_status st = dg_ref_gate_fwd_op(spec->src, c->in[0], c->in[1], n, c->p, c->seed, c->step, c->layer,
					  c->elem0, xy);
	if (!st)
		st = dg_ref_quantize_act_rows(spec->src, spec->act, xy, (size_t)c->b, (size_t)spec->heads,
					      (size_t)c->t, (size_t)spec->latent, c->out, c->out_scale);
	free(xy);
	return st;
}

dg_status dg__ref_gate_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_gate_bwd_op(spec->act, spec->out, c->in[0], c->in[1], c->in[2], bhtl(spec, c), c->p,
				  c->seed, c->step, c->layer, c->elem0, c->out, c->out2);
}

dg_status dg__ref_decoder_gate_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	void *dxs = out_at(spec, c, 4), *dys = out_at(spec, c, 5);
	size_t n = (size_t)bhtl(spec, c) * (spec->out == DG_FMT_BF16 ? 2 : 4);
	void *scratch = NULL;
	if (!dxs && !(dxs = scratch = malloc(n + 1)))
		return DG_ERR_NOMEM;
	dg_status st = dg_ref_decoder_gate_bwd(spec, c->in[0], c->in[1], c->in[2], c->in[3], (int)c->b,
					       (int)c->t, c->p, c->seed, c->step, c->layer, c->elem0, dxs, dys);
	free(scratch);
	return st;
}

/* aq's scale (3) and ev's (4): scale[i], or scale_v[i] with ascale=token /
 * wscale=channel. */
dg_status dg__ref_decoder_gate_bwd_ys(const dg_spec *spec, const dg_ref_call *c)
{
	void *dxs = out_at(spec, c, 5), *dys = out_at(spec, c, 6);
	size_t n = (size_t)bhtl(spec, c) * (spec->out == DG_FMT_BF16 ? 2 : 4);
	const float *sa = spec->ascale == DG_SCALE_TOKEN ? c->scale_v[3] : &c->scale[3];
	const float *sw = spec->wscale == DG_SCALE_CHANNEL ? c->scale_v[4] : &c->scale[4];
	void *scratch = NULL;
	if (!dxs && !(dxs = scratch = malloc(n + 1)))
		return DG_ERR_NOMEM;
	dg_status st = dg_ref_decoder_gate_bwd_ys(spec, c->in[0], c->in[1], c->in[2], c->in[3], sa, c->in[4],
						  sw, (int)c->b, (int)c->t, c->p, c->seed, c->step, c->layer,
						  c->elem0, dxs, dys);
	free(scratch);
	return st;
}

dg_status dg__ref_attention_step(const dg_spec *spec, const dg_ref_call *c)
{
	/* state: read, then written (outs[4], else scratch; in[4] its old value) */
	size_t n = (size_t)c->b * spec->heads * spec->latent * spec->embd;
	float *state = out_at(spec, c, 4), *scratch = NULL;
	if (!state && !(state = scratch = malloc(n * sizeof(float) + 4)))
		return DG_ERR_NOMEM;
	if (c->in[4] && c->in[4] != state)
		memcpy(state, c->in[4], n * sizeof(float));
	else if (!c->in[4])
		memset(state, 0, n * sizeof(float));
	dg_status st = dg_ref_attention_step(spec, c->in[0], c->in[1], c->in[2], c->in[3], state, c->out,
					     (int)c->b, (int)c->t);
	free(scratch);
	return st;
}

/* ---- the chunked form (dg_ref_attention_chunk_*: f32 operands) ------------------- */

static size_t bhtd(const dg_spec *spec, const dg_ref_call *c)
{
	return (size_t)c->b * (size_t)spec->heads * (size_t)c->t * (size_t)spec->embd;
}

dg_status dg__ref_attention_chunk_state(const dg_spec *spec, const dg_ref_call *c)
{
	const size_t nq = (size_t)bhtl(spec, c);
	const size_t nv = (size_t)c->b * (size_t)spec->in_heads * (size_t)c->t * (size_t)spec->embd;
	if (spec->chunk < 1 || c->t % spec->chunk)
		return DG_ERR_INVALID_ARG;
	float *qr = floats_of(spec->act, c->in[0], nq), *src = floats_of(spec->act, c->in[1], nv);
	dg_status st = qr && src ? DG_OK : DG_ERR_NOMEM;
	if (!st)
		dg_ref_attention_chunk_state(qr, src, (int)c->b, spec->heads, (int)c->t, spec->latent, spec->embd,
					     spec->chunk, spec->in_heads, c->backward, c->out);
	free(qr);
	free(src);
	return st;
}

/* out: read (in[2]), then written: the old value plus the states' term,
 * rounded once to the spec's out */
dg_status dg__ref_attention_chunk_out(const dg_spec *spec, const dg_ref_call *c)
{
	const size_t no = bhtd(spec, c);
	if (spec->chunk < 1 || c->t % spec->chunk || !c->in[2])
		return DG_ERR_INVALID_ARG;
	float *qr = floats_of(spec->act, c->in[0], (size_t)bhtl(spec, c)), *o = floats_of(spec->out, c->in[2], no);
	dg_status st = qr && o ? DG_OK : DG_ERR_NOMEM;
	if (!st) {
		dg_ref_attention_chunk_out(qr, c->in[1], (int)c->b, spec->heads, (int)c->t, spec->latent, spec->embd,
					   spec->chunk, c->backward, o);
		store_floats(spec->out, o, no, c->out);
	}
	free(qr);
	free(o);
	return st;
}

/* dxs: read (in[7]), then written: (dxs + RoPEᵀ(the three terms in f32))
 * · [mask_xs > 0], epi=mask's arithmetic (dg_ref_add_mask) */
dg_status dg__ref_attention_chunk_dq(const dg_spec *spec, const dg_ref_call *c)
{
	const size_t nq = (size_t)bhtl(spec, c), nd = bhtd(spec, c);
	const size_t ncc = (size_t)c->b * (size_t)spec->heads * (size_t)c->t * (size_t)spec->chunk;
	if (spec->chunk < 1 || c->t % spec->chunk || !c->in[7])
		return DG_ERR_INVALID_ARG;
	float *cc = floats_of(spec->act, c->in[0], ncc), *qr = floats_of(spec->act, c->in[1], nq);
	float *g = floats_of(spec->act, c->in[2], nd);
	float *v = floats_of(spec->act, c->in[3], (size_t)c->b * (size_t)c->t * (size_t)spec->embd);
	float *dq = calloc(nq + 1, sizeof(float)), *gx = malloc(nq * sizeof(float) + 1);
	dg_status st = cc && qr && g && v && dq && gx ? DG_OK : DG_ERR_NOMEM;
	if (!st) {
		dg_ref_attention_chunk_dq(cc, qr, g, v, c->in[4], c->in[5], (int)c->b, spec->heads, (int)c->t,
					  spec->latent, spec->embd, spec->chunk, dq);
		dg_spec rs;
		dg_spec_init(&rs, DG_OP_ROPE_BWD);
		rs.heads = spec->heads;
		rs.latent = spec->latent;
		st = dg_ref_rope_op(&rs, dq, c->in[6], gx, (int)c->b, (int)c->t);
	}
	if (!st)
		st = dg_ref_add_mask(spec->act, spec->out, DG_FMT_F32, c->in[7], gx, c->in[8], (int64_t)nq, c->out);
	free(cc);
	free(qr);
	free(g);
	free(v);
	free(dq);
	free(gx);
	return st;
}

dg_status dg__ref_attention_chunk_vrep(const dg_spec *spec, const dg_ref_call *c)
{
	const size_t row = (size_t)spec->embd * (spec->act == DG_FMT_BF16 ? 2 : 4);
	for (int64_t b = 0; b < c->b; b++)
		for (int h = 0; h < spec->heads; h++)
			memcpy((char *)c->out + ((size_t)(b * spec->heads + h) * (size_t)c->t) * row,
			       (const char *)c->in[0] + (size_t)b * (size_t)c->t * row, (size_t)c->t * row);
	return DG_OK;
}

dg_status dg__ref_attention_chunk_cast(const dg_spec *spec, const dg_ref_call *c)
{
	store_floats(spec->act, c->in[0], bhtd(spec, c), c->out);
	return DG_OK;
}

/* the heads in order, f32 sums from 0 (the kernel's) */
dg_status dg__ref_attention_chunk_hsum(const dg_spec *spec, const dg_ref_call *c)
{
	const int64_t per = c->t * spec->embd;
	const float *g = c->in[0];
	float *o = c->out;
	for (int64_t b = 0; b < c->b; b++)
		for (int64_t i = 0; i < per; i++) {
			float s = 0.0f;
			for (int h = 0; h < spec->heads; h++)
				s += g[(b * spec->heads + h) * per + i];
			o[b * per + i] = s;
		}
	return DG_OK;
}

dg_status dg__ref_add_mask(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_add_mask(spec->act, spec->out, spec->src, c->in[0], c->in[1], c->in[2], bhtl(spec, c),
			       c->out);
}

dg_status dg__ref_add3(const dg_spec *spec, const dg_ref_call *c)
{
	(void)spec;
	if (!c->in[0] || !c->in[1] || !c->in[2] || !c->out || c->n < 0)
		return DG_ERR_INVALID_ARG;
	dg_ref_add3(c->in[0], c->in[1], c->in[2], c->n, c->out);
	return DG_OK;
}

dg_status dg__ref_transpose(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_transpose(spec->act, c->in[0], c->r, spec->embd, spec->latent, c->out);
}

/* codes (R, C) of n codes: C = cols when given, else R = the call's rows
 * r; the scale one (scale[0]) or one a row (scale_v[0], ascale=token). */
dg_status dg__ref_dequantize(const dg_spec *spec, const dg_ref_call *c)
{
	int64_t rows = c->cols > 0 ? c->n / c->cols : c->r;
	int64_t cols = c->cols > 0 ? c->cols : rows > 0 ? c->n / rows : 0;
	const float *sc = spec->ascale == DG_SCALE_TOKEN ? c->scale_v[0] : &c->scale[0];
	if (!sc || rows < 0 || cols < 0 || rows * cols != c->n)
		return DG_ERR_INVALID_ARG;
	return dg_ref_dequantize(spec->act, spec->out, spec->ascale, c->in[0], rows, cols, sc, c->out);
}

/* adamw_update: p, grad, m, v (n elements); the outputs p, m, v get the
 * inputs' values updated in place (scratch for the ones without storage);
 * the default control block (dg_ref_adamw_default_ctl), the decay on. */
dg_status dg__ref_adamw_update(const dg_spec *spec, const dg_ref_call *c)
{
	if (!c->in[0] || !c->in[1] || !c->in[2] || !c->in[3] || c->n < 0)
		return DG_ERR_INVALID_ARG;
	size_t n = (size_t)c->n, bytes = n * sizeof(float);
	float *o[3] = { out_at(spec, c, 0), out_at(spec, c, 2), out_at(spec, c, 3) };
	const void *src[3] = { c->in[0], c->in[2], c->in[3] };
	float *scratch[3] = { NULL, NULL, NULL };
	for (int k = 0; k < 3; k++) {
		if (!o[k] && !(o[k] = scratch[k] = malloc(bytes + 1))) {
			free(scratch[0]);
			free(scratch[1]);
			return DG_ERR_NOMEM;
		}
		memmove(o[k], src[k], bytes);
	}
	dg_adamw_ctl ctl;
	dg_ref_adamw_default_ctl(&ctl);
	dg_ref_adamw(&ctl, true, o[0], c->in[1], o[1], o[2], NULL, n);
	for (int k = 0; k < 3; k++)
		free(scratch[k]);
	return DG_OK;
}

typedef dg_status (*ref_fn)(const dg_spec *, const dg_ref_call *);

static const ref_fn refs[DG_OP__COUNT] = {
#define DG__REF(e, name) [e] = dg__ref_##name,
	DG_OP_LIST(DG__REF)
#undef DG__REF
};

dg_status dg_ref_run(const dg_spec *spec, const dg_ref_call *call)
{
	if (!spec || !call || (unsigned)spec->op >= DG_OP__COUNT)
		return DG_ERR_INVALID_ARG;
	return refs[spec->op](spec, call);
}
