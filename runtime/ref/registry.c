/*
 * The references by number (dg_ref_run): an adapter an op of DG_OP_LIST,
 * named after it, from the op table's argument order to the op's own
 * reference (dragon/ref.h). An op without one fails to link.
 */
#include <stdlib.h>

#include "runtime/ref/ref_int.h"

dg_status dg__ref_lowrank_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	dg_ref_lowrank_args a = { .x = c->in[0], .w = c->in[1], .sa = c->scale[0],
				  .sw = c->scale[1], .so = c->scale[2], .sa_v = c->scale_v[0],
				  .sw_v = c->scale_v[1], .out = c->out, .batch = (int)c->b,
				  .time = (int)c->t };
	return dg_ref_lowrank_fwd(spec, &a);
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

dg_status dg__ref_attention_grad_xs(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_attention_grad_xs(spec, c->in[0], c->in[1], c->in[2], c->out, (int)c->b,
					(int)c->t);
}

static int64_t bhtl(const dg_spec *spec, const dg_ref_call *c)
{
	return c->b * spec->heads * c->t * spec->latent;
}

dg_status dg__ref_gate_fwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_gate_fwd_op(spec->act, c->in[0], c->in[1], bhtl(spec, c), c->p, c->seed, c->step,
				  c->layer, c->out);
}

dg_status dg__ref_gate_bwd(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_gate_bwd_op(spec->act, c->in[0], c->in[1], c->in[2], bhtl(spec, c), c->p, c->seed,
				  c->step, c->layer, c->out, c->out2);
}

dg_status dg__ref_add_mask(const dg_spec *spec, const dg_ref_call *c)
{
	return dg_ref_add_mask(spec->act, c->in[0], c->in[1], c->in[2], bhtl(spec, c), c->out);
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
