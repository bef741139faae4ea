/*
 * Each op's typed arguments struct (dragon/ops.h) as data: where its
 * tensors and options lie, so one converter (dg__op_call_from_args) turns
 * any of them into the generic call, for the typed calls (typed.c), the
 * prepared ops (dg_prepare, dg_prepared_launch) and the chains
 * (dg__exec_args).
 *
 * Every op's call is its struct's fields copied as they are: no rule needs
 * a hook of its own. What looks like one is a row or another file's:
 *   - unpack_i8x4 shares pack_i8x4's struct, its tensors in the other
 *     order (the op table's: packed, codes): its own row says so;
 *   - pack_ternary and pack_sign1 share dg_pack_weight_args, unpack
 *     included (which kernel it picks is dg__prep_pack_*'s);
 *   - attention_grad_xs gives all six tensors: which its epilogue reads is
 *     the op table's (dg_op_arg.epi), and dg__op_check refuses another
 *     epilogue's;
 *   - lmhead_ce gives dx, dw and grad_scale whatever backward says: its
 *     check refuses dx or dw given without it, and its prepare passes
 *     grad_scale only with it.
 */
#include <stddef.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

/* Field f of dg_<s>_args, of type `type`, as a stored offset (plus one);
 * a field of another type does not compile (_Generic has no match). */
#define AT(s, f, type)                                                        \
	((uint16_t)(offsetof(dg_##s##_args, f) + 1 +                          \
		    0 * _Generic(((dg_##s##_args *)0)->f, type: 0)))

/* A tensor of the op table's order: the field of its name. */
#define TENSOR(s, f) { AT(s, f, const dg_tensor *), #f }
#define T2(s, a, b) TENSOR(s, a), TENSOR(s, b)
#define T3(s, a, b, c) T2(s, a, b), TENSOR(s, c)
#define T4(s, a, b, c, d) T3(s, a, b, c), TENSOR(s, d)
#define T5(s, a, b, c, d, e) T4(s, a, b, c, d), TENSOR(s, e)
#define T6(s, a, b, c, d, e, f) T5(s, a, b, c, d, e), TENSOR(s, f)
#define T7(s, a, b, c, d, e, f, g) T6(s, a, b, c, d, e, f), TENSOR(s, g)
#define T9(s, a, b, c, d, e, f, g, h, i) T6(s, a, b, c, d, e, f), TENSOR(s, g), TENSOR(s, h), TENSOR(s, i)

/* Option `opt` of the call from field f of dg_<s>_args; both of `type`. */
#define OPT_AS(opt, s, f, type)                                               \
	.opt = (uint16_t)(AT(s, f, type) + 0 * _Generic(((dg__op_call *)0)->opt, type: 0))
#define OPT(s, f, type) OPT_AS(f, s, f, type)

#define SIZE(s) .size = sizeof(dg_##s##_args)

/* The dropout's options (gate_fwd, gate_bwd, gate_quant, decoder_gate_bwd, _ys). */
#define DROPOUT(s)                                                            \
	OPT(s, p, float), OPT(s, seed, uint64_t), OPT(s, step, uint32_t),     \
	OPT(s, layer, uint32_t), OPT(s, step_at, dg_dptr), OPT(s, elem0, uint64_t)

static const dg__args_layout layouts[DG_OP__COUNT] = {
	/* projection */
	[DG_OP_LOWRANK_FWD] = { SIZE(lowrank_fwd), .t = { T5(lowrank_fwd, x, w, out, rope, qr) },
				OPT_AS(absum, lowrank_fwd, out_absum, dg_dptr) },
	[DG_OP_RELU_MASK] = { SIZE(relu_mask), .t = { T4(relu_mask, x, w, grad, grad_out) } },
	[DG_OP_LOWRANK_GRAD_INPUT] = { SIZE(lowrank_grad_input),
				       .t = { T3(lowrank_grad_input, grad, w, grad_x) },
				       OPT(lowrank_grad_input, ws, dg_workspace),
				       OPT(lowrank_grad_input, splits, int) },
	[DG_OP_LOWRANK_GRAD_WEIGHT] = { SIZE(lowrank_grad_weight),
					.t = { T3(lowrank_grad_weight, grad, x, grad_w) },
					OPT(lowrank_grad_weight, accumulate, bool),
					OPT(lowrank_grad_weight, ws, dg_workspace) },
	/* decoder tail */
	[DG_OP_DECODER_FWD] = { SIZE(decoder_fwd), .t = { T3(decoder_fwd, y, w, out) },
				OPT(decoder_fwd, ws, dg_workspace) },
	[DG_OP_DECODER_GRAD_INPUT] = { SIZE(decoder_grad_input),
				       .t = { T3(decoder_grad_input, grad, w, grad_y) } },
	[DG_OP_DECODER_GRAD_WEIGHT] = { SIZE(decoder_grad_weight),
					.t = { T3(decoder_grad_weight, grad, y, grad_w) },
					OPT(decoder_grad_weight, accumulate, bool),
					OPT(decoder_grad_weight, ws, dg_workspace) },
	/* quantize and pack */
	[DG_OP_QUANTIZE_ACT] = { SIZE(quantize_act), .t = { T2(quantize_act, x, codes) },
				 OPT(quantize_act, ws, dg_workspace) },
	[DG_OP_DEQUANTIZE] = { SIZE(dequantize), .t = { T2(dequantize, codes, out) } },
	[DG_OP_QUANTIZE_WEIGHT] = { SIZE(quantize_weight), .t = { T2(quantize_weight, w, codes) },
				    OPT(quantize_weight, ws, dg_workspace) },
	[DG_OP_PACK_TERNARY] = { SIZE(pack_weight), .t = { T2(pack_weight, codes, packed) },
				 OPT(pack_weight, unpack, bool) },
	[DG_OP_PACK_SIGN1] = { SIZE(pack_weight), .t = { T2(pack_weight, codes, packed) },
			       OPT(pack_weight, unpack, bool) },
	[DG_OP_PACK_I8X4] = { SIZE(pack_i8x4), .t = { T2(pack_i8x4, codes, packed) } },
	[DG_OP_UNPACK_I8X4] = { SIZE(pack_i8x4), .t = { T2(pack_i8x4, packed, codes) } },
	/* attention */
	[DG_OP_ROPE_FWD] = { SIZE(rope_fwd), .t = { T3(rope_fwd, x, rope, out) } },
	[DG_OP_ROPE_BWD] = { SIZE(rope_bwd), .t = { T3(rope_bwd, grad, rope, grad_x) } },
	[DG_OP_ATTENTION_SCORES] = { SIZE(attention_scores),
				     .t = { T3(attention_scores, xs, rope, scores) } },
	[DG_OP_ATTENTION_OUT] = { SIZE(attention_out), .t = { T3(attention_out, scores, v, out) } },
	[DG_OP_ATTENTION_GRAD_SCORES] = { SIZE(attention_grad_scores),
					  .t = { T3(attention_grad_scores, grad, v, grad_scores) } },
	[DG_OP_ATTENTION_GRAD_V] = { SIZE(attention_grad_v),
				     .t = { T3(attention_grad_v, scores, grad, grad_v) } },
	[DG_OP_ATTENTION_STEP] = { SIZE(attention_step),
				   .t = { T6(attention_step, xs, pos, freq, v, state, out) } },
	[DG_OP_ATTENTION_GRAD_XS] = { SIZE(attention_grad_xs),
				      .t = { T6(attention_grad_xs, grad_scores, xs, rope, grad_xs,
						dxs, mask_xs) } },
	[DG_OP_ATTENTION_CHUNK_STATE] = { SIZE(attention_chunk_state),
					  .t = { T3(attention_chunk_state, qr, src, states) },
					  OPT(attention_chunk_state, backward, bool) },
	[DG_OP_ATTENTION_CHUNK_OUT] = { SIZE(attention_chunk_out),
					.t = { T3(attention_chunk_out, qr, states, out) },
					OPT(attention_chunk_out, backward, bool) },
	[DG_OP_ATTENTION_CHUNK_DQ] = { SIZE(attention_chunk_dq),
				       .t = { T9(attention_chunk_dq, grad_scores, qr, grad, v, states,
						 rstates, rope, dxs, mask_xs) } },
	[DG_OP_ATTENTION_CHUNK_VREP] = { SIZE(attention_chunk_vrep), .t = { T2(attention_chunk_vrep, v, vr) } },
	[DG_OP_ATTENTION_CHUNK_CAST] = { SIZE(attention_chunk_cast),
					 .t = { T2(attention_chunk_cast, grad, out) } },
	[DG_OP_ATTENTION_CHUNK_HSUM] = { SIZE(attention_chunk_hsum),
					 .t = { T2(attention_chunk_hsum, grad, grad_v) } },
	/* embed */
	[DG_OP_EMBED_FWD] = { SIZE(embed_fwd), .t = { T3(embed_fwd, idx, table, out) },
			      OPT(embed_fwd, bad, dg_dptr) },
	[DG_OP_EMBED_BWD] = { SIZE(embed_bwd), .t = { T3(embed_bwd, idx, dout, dtable) },
			      OPT(embed_bwd, accumulate, bool) },
	/* layer norm */
	[DG_OP_LAYERNORM_FWD] = { SIZE(layernorm_fwd), .t = { T3(layernorm_fwd, x, y, rstd) },
				  OPT(layernorm_fwd, eps, float) },
	[DG_OP_LAYERNORM_BWD] = { SIZE(layernorm_bwd), .t = { T4(layernorm_bwd, dy, y, rstd, dx) },
				  OPT(layernorm_bwd, accumulate, bool) },
	[DG_OP_RESID_LN_FWD] = { SIZE(resid_ln_fwd), .t = { T4(resid_ln_fwd, x, y, out, rstd) },
				 OPT(resid_ln_fwd, eps, float) },
	[DG_OP_RESID_LN_BWD] = { SIZE(resid_ln_bwd),
				 .t = { T5(resid_ln_bwd, dout, out, rstd, dx, dy) },
				 OPT(resid_ln_bwd, accumulate, bool) },
	/* lm_head + softmax cross-entropy */
	[DG_OP_LMHEAD_CE] = { SIZE(lmhead_ce),
			      .t = { T6(lmhead_ce, x, w, targets, loss, dx, dw) },
			      OPT(lmhead_ce, backward, bool), OPT(lmhead_ce, accumulate, bool),
			      OPT(lmhead_ce, ws, dg_workspace), OPT(lmhead_ce, bad, dg_dptr),
			      OPT(lmhead_ce, grad_scale, dg_dptr) },
	[DG_OP_LMHEAD_LOGITS] = { SIZE(lmhead_logits), .t = { T3(lmhead_logits, x, w, logits) } },
	/* gate */
	[DG_OP_GATE_FWD] = { SIZE(gate_fwd), .t = { T3(gate_fwd, xs, ys, xy) }, DROPOUT(gate_fwd) },
	[DG_OP_GATE_QUANT] = { SIZE(gate_quant), .t = { T3(gate_quant, xs, ys, codes) }, DROPOUT(gate_quant) },
	[DG_OP_GATE_BWD] = { SIZE(gate_bwd), .t = { T4(gate_bwd, dxy, xs, ys, dxs) },
			     DROPOUT(gate_bwd) },
	[DG_OP_DECODER_GATE_BWD] = { SIZE(decoder_gate_bwd),
				     .t = { T6(decoder_gate_bwd, grad, w, xs, ys, dxs, dys) },
				     DROPOUT(decoder_gate_bwd), OPT(decoder_gate_bwd, ws, dg_workspace) },
	[DG_OP_DECODER_GATE_BWD_YS] = { SIZE(decoder_gate_bwd_ys),
					.t = { T7(decoder_gate_bwd_ys, grad, w, xs, aq, ev, dxs, dys) },
					DROPOUT(decoder_gate_bwd_ys) },
	/* step */
	[DG_OP_ADD_MASK] = { SIZE(add_mask), .t = { T3(add_mask, dxs, other, xs) } },
	[DG_OP_ADD3] = { SIZE(add3), .t = { T4(add3, a, b, c, out) } },
	[DG_OP_TRANSPOSE] = { SIZE(transpose), .t = { T2(transpose, in, out) } },
	/* optim */
	[DG_OP_ADAMW_UPDATE] = { SIZE(adamw_update), .t = { T4(adamw_update, p, grad, m, v) },
				 OPT(adamw_update, ctl, dg_dptr), OPT(adamw_update, copy, dg_dptr),
				 OPT(adamw_update, decay, bool) },
};

const dg__args_layout *dg__op_args_layout(dg_op op)
{
	return (unsigned)op < DG_OP__COUNT ? &layouts[op] : NULL;
}

dg__op_call dg__op_call_from_args(dg_op op, const void *args)
{
	dg__op_call c;
	memset(&c, 0, sizeof(c));
	if ((unsigned)op >= DG_OP__COUNT || !args)
		return c;
	const dg__args_layout *l = &layouts[op];
	const unsigned char *a = args;
	for (int i = 0; i < DG_OP_MAX_ARGS && l->t[i].at; i++)
		memcpy(&c.t[i], a + l->t[i].at - 1, sizeof(c.t[i]));
#define DG__COPY(f)                                                           \
	if (l->f)                                                             \
		memcpy(&c.f, a + l->f - 1, sizeof(c.f));
	DG__CALL_OPTIONS(DG__COPY)
#undef DG__COPY
	return c;
}
