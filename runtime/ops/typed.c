/*
 * The typed calls of dragon/ops.h and their device-free checks
 * (runtime/ops/checks.h), each one line: the generic doors of registry.c
 * (dg__op_typed_run, dg__op_typed_workspace, dg__op_typed_check) read the
 * op's arguments struct through args_layout.c's table, check the call
 * (the op table's rules, then its family's own: DG__OP_OWN_CHECKS) and
 * prepare and launch the op (its family file's dg__prep_<name>). In the
 * order of dragon/ops.h.
 *
 * Elsewhere, for they do more than that: dg_pack_weight and dg_pack_i8x4
 * with their checks (pack.c: one call for two ops), dg_lmhead_ce_check and
 * dg_lmhead_ce_workspace (loss.c: the workspace's rule, no device needed),
 * the attention chains (attention.c) and dg_grad_norm (optim.c).
 */
#include "runtime/ops/ops_int.h"

/* ---- projection ---------------------------------------------------------- */

dg_status dg_lowrank_fwd_check(const dg_spec *spec, const dg_lowrank_fwd_args *a, char *msg,
			       size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LOWRANK_FWD, spec, a, msg, msg_size);
}

dg_status dg_lowrank_fwd(dg_device *dev, const dg_spec *spec, const dg_lowrank_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LOWRANK_FWD, spec, a);
}

dg_status dg_relu_mask_check(const dg_spec *spec, const dg_relu_mask_args *a, char *msg,
			     size_t msg_size)
{
	return dg__op_typed_check(DG_OP_RELU_MASK, spec, a, msg, msg_size);
}

dg_status dg_relu_mask(dg_device *dev, const dg_spec *spec, const dg_relu_mask_args *a)
{
	return dg__op_typed_run(dev, DG_OP_RELU_MASK, spec, a);
}

dg_status dg_lowrank_grad_input_check(const dg_spec *spec, const dg_lowrank_grad_input_args *a,
				      char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LOWRANK_GRAD_INPUT, spec, a, msg, msg_size);
}

dg_status dg_lowrank_grad_input_workspace(dg_device *dev, const dg_spec *spec,
					  const dg_lowrank_grad_input_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_LOWRANK_GRAD_INPUT, spec, a, bytes);
}

dg_status dg_lowrank_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_lowrank_grad_input_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LOWRANK_GRAD_INPUT, spec, a);
}

dg_status dg_lowrank_grad_weight_check(const dg_spec *spec, const dg_lowrank_grad_weight_args *a,
				       char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LOWRANK_GRAD_WEIGHT, spec, a, msg, msg_size);
}

dg_status dg_lowrank_grad_weight_workspace(dg_device *dev, const dg_spec *spec,
					   const dg_lowrank_grad_weight_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_LOWRANK_GRAD_WEIGHT, spec, a, bytes);
}

dg_status dg_lowrank_grad_weight(dg_device *dev, const dg_spec *spec,
				 const dg_lowrank_grad_weight_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LOWRANK_GRAD_WEIGHT, spec, a);
}

/* ---- decoder tail -------------------------------------------------------- */

dg_status dg_decoder_fwd_check(const dg_spec *spec, const dg_decoder_fwd_args *a, char *msg,
			       size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DECODER_FWD, spec, a, msg, msg_size);
}

dg_status dg_decoder_fwd_workspace(dg_device *dev, const dg_spec *spec,
				   const dg_decoder_fwd_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_DECODER_FWD, spec, a, bytes);
}

dg_status dg_decoder_fwd(dg_device *dev, const dg_spec *spec, const dg_decoder_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DECODER_FWD, spec, a);
}

dg_status dg_decoder_grad_input_check(const dg_spec *spec, const dg_decoder_grad_input_args *a,
				      char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DECODER_GRAD_INPUT, spec, a, msg, msg_size);
}

dg_status dg_decoder_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_decoder_grad_input_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DECODER_GRAD_INPUT, spec, a);
}

dg_status dg_decoder_grad_weight_check(const dg_spec *spec, const dg_decoder_grad_weight_args *a,
				       char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DECODER_GRAD_WEIGHT, spec, a, msg, msg_size);
}

dg_status dg_decoder_grad_weight_workspace(dg_device *dev, const dg_spec *spec,
					   const dg_decoder_grad_weight_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_DECODER_GRAD_WEIGHT, spec, a, bytes);
}

dg_status dg_decoder_grad_weight(dg_device *dev, const dg_spec *spec,
				 const dg_decoder_grad_weight_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DECODER_GRAD_WEIGHT, spec, a);
}

/* ---- quantize (and pack: pack.c) ----------------------------------------- */

dg_status dg_quantize_act_check(const dg_spec *spec, const dg_quantize_act_args *a, char *msg,
				size_t msg_size)
{
	return dg__op_typed_check(DG_OP_QUANTIZE_ACT, spec, a, msg, msg_size);
}

dg_status dg_quantize_act_workspace(dg_device *dev, const dg_spec *spec,
				    const dg_quantize_act_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_QUANTIZE_ACT, spec, a, bytes);
}

dg_status dg_quantize_act(dg_device *dev, const dg_spec *spec, const dg_quantize_act_args *a)
{
	return dg__op_typed_run(dev, DG_OP_QUANTIZE_ACT, spec, a);
}

dg_status dg_dequantize_check(const dg_spec *spec, const dg_dequantize_args *a, char *msg,
			      size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DEQUANTIZE, spec, a, msg, msg_size);
}

dg_status dg_dequantize(dg_device *dev, const dg_spec *spec, const dg_dequantize_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DEQUANTIZE, spec, a);
}

dg_status dg_quantize_weight_check(const dg_spec *spec, const dg_quantize_weight_args *a, char *msg,
				   size_t msg_size)
{
	return dg__op_typed_check(DG_OP_QUANTIZE_WEIGHT, spec, a, msg, msg_size);
}

dg_status dg_quantize_weight_workspace(dg_device *dev, const dg_spec *spec,
				       const dg_quantize_weight_args *a, size_t *bytes)
{
	return dg__op_typed_workspace(dev, DG_OP_QUANTIZE_WEIGHT, spec, a, bytes);
}

dg_status dg_quantize_weight(dg_device *dev, const dg_spec *spec, const dg_quantize_weight_args *a)
{
	return dg__op_typed_run(dev, DG_OP_QUANTIZE_WEIGHT, spec, a);
}

/* ---- attention ----------------------------------------------------------- */

dg_status dg_rope_fwd_check(const dg_spec *spec, const dg_rope_fwd_args *a, char *msg,
			    size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ROPE_FWD, spec, a, msg, msg_size);
}

dg_status dg_rope_fwd(dg_device *dev, const dg_spec *spec, const dg_rope_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ROPE_FWD, spec, a);
}

dg_status dg_rope_bwd_check(const dg_spec *spec, const dg_rope_bwd_args *a, char *msg,
			    size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ROPE_BWD, spec, a, msg, msg_size);
}

dg_status dg_rope_bwd(dg_device *dev, const dg_spec *spec, const dg_rope_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ROPE_BWD, spec, a);
}

dg_status dg_attention_scores_check(const dg_spec *spec, const dg_attention_scores_args *a,
				    char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_SCORES, spec, a, msg, msg_size);
}

dg_status dg_attention_scores(dg_device *dev, const dg_spec *spec,
			      const dg_attention_scores_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_SCORES, spec, a);
}

dg_status dg_attention_out_check(const dg_spec *spec, const dg_attention_out_args *a, char *msg,
				 size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_OUT, spec, a, msg, msg_size);
}

dg_status dg_attention_out(dg_device *dev, const dg_spec *spec, const dg_attention_out_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_OUT, spec, a);
}

dg_status dg_attention_grad_scores_check(const dg_spec *spec,
					 const dg_attention_grad_scores_args *a, char *msg,
					 size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_GRAD_SCORES, spec, a, msg, msg_size);
}

dg_status dg_attention_grad_scores(dg_device *dev, const dg_spec *spec,
				   const dg_attention_grad_scores_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_GRAD_SCORES, spec, a);
}

dg_status dg_attention_grad_v_check(const dg_spec *spec, const dg_attention_grad_v_args *a,
				    char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_GRAD_V, spec, a, msg, msg_size);
}

dg_status dg_attention_grad_v(dg_device *dev, const dg_spec *spec,
			      const dg_attention_grad_v_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_GRAD_V, spec, a);
}

dg_status dg_attention_step_check(const dg_spec *spec, const dg_attention_step_args *a, char *msg,
				  size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_STEP, spec, a, msg, msg_size);
}

dg_status dg_attention_step(dg_device *dev, const dg_spec *spec, const dg_attention_step_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_STEP, spec, a);
}

dg_status dg_attention_grad_xs_check(const dg_spec *spec, const dg_attention_grad_xs_args *a,
				     char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_GRAD_XS, spec, a, msg, msg_size);
}

dg_status dg_attention_grad_xs(dg_device *dev, const dg_spec *spec,
			       const dg_attention_grad_xs_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_GRAD_XS, spec, a);
}

dg_status dg_attention_chunk_state_check(const dg_spec *spec, const dg_attention_chunk_state_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_STATE, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_state(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_state_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_STATE, spec, a);
}

dg_status dg_attention_chunk_out_check(const dg_spec *spec, const dg_attention_chunk_out_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_OUT, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_out(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_out_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_OUT, spec, a);
}

dg_status dg_attention_chunk_dq_check(const dg_spec *spec, const dg_attention_chunk_dq_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_DQ, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_dq(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_dq_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_DQ, spec, a);
}

dg_status dg_attention_chunk_vrep_check(const dg_spec *spec, const dg_attention_chunk_vrep_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_VREP, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_vrep(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_vrep_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_VREP, spec, a);
}

dg_status dg_attention_chunk_cast_check(const dg_spec *spec, const dg_attention_chunk_cast_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_CAST, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_cast(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_cast_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_CAST, spec, a);
}

dg_status dg_attention_chunk_hsum_check(const dg_spec *spec, const dg_attention_chunk_hsum_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ATTENTION_CHUNK_HSUM, spec, a, msg, msg_size);
}

dg_status dg_attention_chunk_hsum(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_hsum_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ATTENTION_CHUNK_HSUM, spec, a);
}

/* ---- embed --------------------------------------------------------------- */

dg_status dg_embed_fwd_check(const dg_spec *spec, const dg_embed_fwd_args *a, char *msg,
			     size_t msg_size)
{
	return dg__op_typed_check(DG_OP_EMBED_FWD, spec, a, msg, msg_size);
}

dg_status dg_embed_fwd(dg_device *dev, const dg_spec *spec, const dg_embed_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_EMBED_FWD, spec, a);
}

dg_status dg_embed_bwd_check(const dg_spec *spec, const dg_embed_bwd_args *a, char *msg,
			     size_t msg_size)
{
	return dg__op_typed_check(DG_OP_EMBED_BWD, spec, a, msg, msg_size);
}

dg_status dg_embed_bwd(dg_device *dev, const dg_spec *spec, const dg_embed_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_EMBED_BWD, spec, a);
}

/* ---- layer norm ---------------------------------------------------------- */

dg_status dg_layernorm_fwd_check(const dg_spec *spec, const dg_layernorm_fwd_args *a, char *msg,
				 size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LAYERNORM_FWD, spec, a, msg, msg_size);
}

dg_status dg_layernorm_fwd(dg_device *dev, const dg_spec *spec, const dg_layernorm_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LAYERNORM_FWD, spec, a);
}

dg_status dg_layernorm_bwd_check(const dg_spec *spec, const dg_layernorm_bwd_args *a, char *msg,
				 size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LAYERNORM_BWD, spec, a, msg, msg_size);
}

dg_status dg_layernorm_bwd(dg_device *dev, const dg_spec *spec, const dg_layernorm_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LAYERNORM_BWD, spec, a);
}

dg_status dg_resid_ln_fwd_check(const dg_spec *spec, const dg_resid_ln_fwd_args *a, char *msg,
				size_t msg_size)
{
	return dg__op_typed_check(DG_OP_RESID_LN_FWD, spec, a, msg, msg_size);
}

dg_status dg_resid_ln_fwd(dg_device *dev, const dg_spec *spec, const dg_resid_ln_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_RESID_LN_FWD, spec, a);
}

dg_status dg_resid_ln_bwd_check(const dg_spec *spec, const dg_resid_ln_bwd_args *a, char *msg,
				size_t msg_size)
{
	return dg__op_typed_check(DG_OP_RESID_LN_BWD, spec, a, msg, msg_size);
}

dg_status dg_resid_ln_bwd(dg_device *dev, const dg_spec *spec, const dg_resid_ln_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_RESID_LN_BWD, spec, a);
}

/* ---- lm_head + softmax cross-entropy (its _check, _workspace: loss.c) ---- */

dg_status dg_lmhead_ce(dg_device *dev, const dg_spec *spec, const dg_lmhead_ce_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LMHEAD_CE, spec, a);
}

dg_status dg_lmhead_logits_check(const dg_spec *spec, const dg_lmhead_logits_args *a, char *msg,
				 size_t msg_size)
{
	return dg__op_typed_check(DG_OP_LMHEAD_LOGITS, spec, a, msg, msg_size);
}

dg_status dg_lmhead_logits(dg_device *dev, const dg_spec *spec, const dg_lmhead_logits_args *a)
{
	return dg__op_typed_run(dev, DG_OP_LMHEAD_LOGITS, spec, a);
}

/* ---- gate ---------------------------------------------------------------- */

dg_status dg_gate_fwd_check(const dg_spec *spec, const dg_gate_fwd_args *a, char *msg,
			    size_t msg_size)
{
	return dg__op_typed_check(DG_OP_GATE_FWD, spec, a, msg, msg_size);
}

dg_status dg_gate_fwd(dg_device *dev, const dg_spec *spec, const dg_gate_fwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_GATE_FWD, spec, a);
}

dg_status dg_gate_bwd_check(const dg_spec *spec, const dg_gate_bwd_args *a, char *msg,
			    size_t msg_size)
{
	return dg__op_typed_check(DG_OP_GATE_BWD, spec, a, msg, msg_size);
}

dg_status dg_gate_bwd(dg_device *dev, const dg_spec *spec, const dg_gate_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_GATE_BWD, spec, a);
}

dg_status dg_gate_quant_check(const dg_spec *spec, const dg_gate_quant_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_GATE_QUANT, spec, a, msg, msg_size);
}

dg_status dg_gate_quant(dg_device *dev, const dg_spec *spec, const dg_gate_quant_args *a)
{
	return dg__op_typed_run(dev, DG_OP_GATE_QUANT, spec, a);
}

dg_status dg_decoder_gate_bwd_check(const dg_spec *spec, const dg_decoder_gate_bwd_args *a,
				    char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DECODER_GATE_BWD, spec, a, msg, msg_size);
}

dg_status dg_decoder_gate_bwd(dg_device *dev, const dg_spec *spec,
			      const dg_decoder_gate_bwd_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DECODER_GATE_BWD, spec, a);
}

dg_status dg_decoder_gate_bwd_ys_check(const dg_spec *spec, const dg_decoder_gate_bwd_ys_args *a,
				       char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_DECODER_GATE_BWD_YS, spec, a, msg, msg_size);
}

dg_status dg_decoder_gate_bwd_ys(dg_device *dev, const dg_spec *spec,
				 const dg_decoder_gate_bwd_ys_args *a)
{
	return dg__op_typed_run(dev, DG_OP_DECODER_GATE_BWD_YS, spec, a);
}

/* ---- step ---------------------------------------------------------------- */

dg_status dg_add_mask_check(const dg_spec *spec, const dg_add_mask_args *a, char *msg,
			    size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ADD_MASK, spec, a, msg, msg_size);
}

dg_status dg_add_mask(dg_device *dev, const dg_spec *spec, const dg_add_mask_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ADD_MASK, spec, a);
}

dg_status dg_add3_check(const dg_spec *spec, const dg_add3_args *a, char *msg, size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ADD3, spec, a, msg, msg_size);
}

dg_status dg_add3(dg_device *dev, const dg_spec *spec, const dg_add3_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ADD3, spec, a);
}

dg_status dg_transpose_check(const dg_spec *spec, const dg_transpose_args *a, char *msg,
			     size_t msg_size)
{
	return dg__op_typed_check(DG_OP_TRANSPOSE, spec, a, msg, msg_size);
}

dg_status dg_transpose(dg_device *dev, const dg_spec *spec, const dg_transpose_args *a)
{
	return dg__op_typed_run(dev, DG_OP_TRANSPOSE, spec, a);
}

/* ---- optim --------------------------------------------------------------- */

dg_status dg_adamw_update_check(const dg_spec *spec, const dg_adamw_update_args *a, char *msg,
				size_t msg_size)
{
	return dg__op_typed_check(DG_OP_ADAMW_UPDATE, spec, a, msg, msg_size);
}

dg_status dg_adamw_update(dg_device *dev, const dg_spec *spec, const dg_adamw_update_args *a)
{
	return dg__op_typed_run(dev, DG_OP_ADAMW_UPDATE, spec, a);
}
