/*
 * The device-free twins of the typed ops of dragon/ops.h: each runs the
 * checks its op runs before a launch (the spec, every tensor's format,
 * shape and scale against the op table's signature, the op's own rules)
 * and writes the one-line message into msg instead of the device. The
 * tests hold each op's refusals to them; a program outside the library
 * has the same checks for any op in dragon/ffi.h's dg_ffi_op_check.
 * Private to the library (runtime/ops/) and its tests.
 */
#ifndef DG_RUNTIME_OPS_CHECKS_H
#define DG_RUNTIME_OPS_CHECKS_H

#include <stddef.h>

#include "dragon/ops.h"
#include "dragon/spec.h"
#include "dragon/status.h"

dg_status dg_lowrank_fwd_check(const dg_spec *spec,
			       const dg_lowrank_fwd_args *a, char *msg,
			       size_t msg_size);
dg_status dg_relu_mask_check(const dg_spec *spec, const dg_relu_mask_args *a,
			     char *msg, size_t msg_size);
dg_status dg_lowrank_grad_input_check(const dg_spec *spec,
				      const dg_lowrank_grad_input_args *a,
				      char *msg, size_t msg_size);
dg_status dg_lowrank_grad_weight_check(const dg_spec *spec,
				       const dg_lowrank_grad_weight_args *a,
				       char *msg, size_t msg_size);
dg_status dg_decoder_fwd_check(const dg_spec *spec,
			       const dg_decoder_fwd_args *a, char *msg,
			       size_t msg_size);
dg_status dg_decoder_grad_input_check(const dg_spec *spec,
				      const dg_decoder_grad_input_args *a,
				      char *msg, size_t msg_size);
dg_status dg_decoder_grad_weight_check(const dg_spec *spec,
				       const dg_decoder_grad_weight_args *a,
				       char *msg, size_t msg_size);
dg_status dg_quantize_act_check(const dg_spec *spec, const dg_quantize_act_args *a,
				char *msg, size_t msg_size);
dg_status dg_dequantize_check(const dg_spec *spec, const dg_dequantize_args *a, char *msg,
			      size_t msg_size);
dg_status dg_quantize_weight_check(const dg_spec *spec, const dg_quantize_weight_args *a,
				   char *msg, size_t msg_size);
dg_status dg_pack_weight_check(const dg_spec *spec, const dg_pack_weight_args *a,
			       char *msg, size_t msg_size);
dg_status dg_pack_i8x4_check(const dg_spec *spec, const dg_pack_i8x4_args *a,
			     char *msg, size_t msg_size);
dg_status dg_rope_fwd_check(const dg_spec *spec, const dg_rope_fwd_args *a, char *msg,
			    size_t msg_size);
dg_status dg_rope_bwd_check(const dg_spec *spec, const dg_rope_bwd_args *a, char *msg,
			    size_t msg_size);
dg_status dg_attention_scores_check(const dg_spec *spec, const dg_attention_scores_args *a,
				    char *msg, size_t msg_size);
dg_status dg_attention_out_check(const dg_spec *spec, const dg_attention_out_args *a, char *msg,
				 size_t msg_size);
dg_status dg_attention_grad_scores_check(const dg_spec *spec,
					 const dg_attention_grad_scores_args *a, char *msg,
					 size_t msg_size);
dg_status dg_attention_grad_v_check(const dg_spec *spec, const dg_attention_grad_v_args *a,
				    char *msg, size_t msg_size);
dg_status dg_attention_step_check(const dg_spec *spec, const dg_attention_step_args *a, char *msg,
				  size_t msg_size);
/* attention_grad_xs's persistent form (templates/attention_tma.lua
 * M.persistent_ok): a bf16 tile of 4 stages, BN at most 128, on the
 * warp-specialized path; the grid walks the tiles (attention.c gemm_prep).
 * DG__ATTN_PERSISTENT_TILE: the one the backward chain names to have
 * grad_xs turn xs itself (dragon/ops.h). */
bool dg__attn_persistent_tile(const dg_tile *t);
#define DG__ATTN_PERSISTENT_TILE ((dg_tile){ 128, 128, 64, 8, 1, 4, 0 })
/* decoder_gate_bwd's persistent form by TMA (templates/decoder_gate_tma.lua,
 * gate.c dgb_prep_tma): the tile the model names for it, 5 stages (and 4
 * epilogue slots beside them). */
#define DG__DEC_GATE_TMA_TILE ((dg_tile){ 128, 128, 64, 8, 1, 5, 0 })
dg_status dg_attention_grad_xs_check(const dg_spec *spec, const dg_attention_grad_xs_args *a,
				     char *msg, size_t msg_size);
/* The chunked form's ops in one call (prepare and launch), for the
 * library's own callers and the tests: the public door is dg_prepare. */
dg_status dg_attention_chunk_state(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_state_args *a);
dg_status dg_attention_chunk_out(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_out_args *a);
dg_status dg_attention_chunk_dq(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_dq_args *a);
dg_status dg_attention_chunk_vrep(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_vrep_args *a);
dg_status dg_attention_chunk_cast(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_cast_args *a);
dg_status dg_attention_chunk_hsum(dg_device *dev, const dg_spec *spec, const dg_attention_chunk_hsum_args *a);
dg_status dg_attention_chunk_state_check(const dg_spec *spec, const dg_attention_chunk_state_args *a, char *msg, size_t msg_size);
dg_status dg_attention_chunk_out_check(const dg_spec *spec, const dg_attention_chunk_out_args *a, char *msg, size_t msg_size);
dg_status dg_attention_chunk_dq_check(const dg_spec *spec, const dg_attention_chunk_dq_args *a, char *msg, size_t msg_size);
dg_status dg_attention_chunk_vrep_check(const dg_spec *spec, const dg_attention_chunk_vrep_args *a, char *msg, size_t msg_size);
dg_status dg_attention_chunk_cast_check(const dg_spec *spec, const dg_attention_chunk_cast_args *a, char *msg, size_t msg_size);
dg_status dg_attention_chunk_hsum_check(const dg_spec *spec, const dg_attention_chunk_hsum_args *a, char *msg, size_t msg_size);
dg_status dg_embed_fwd_check(const dg_spec *spec, const dg_embed_fwd_args *a, char *msg,
			     size_t msg_size);
dg_status dg_embed_bwd_check(const dg_spec *spec, const dg_embed_bwd_args *a, char *msg,
			     size_t msg_size);
dg_status dg_layernorm_fwd_check(const dg_spec *spec, const dg_layernorm_fwd_args *a,
				 char *msg, size_t msg_size);
dg_status dg_layernorm_bwd_check(const dg_spec *spec, const dg_layernorm_bwd_args *a,
				 char *msg, size_t msg_size);
dg_status dg_resid_ln_fwd_check(const dg_spec *spec, const dg_resid_ln_fwd_args *a,
				char *msg, size_t msg_size);
dg_status dg_resid_ln_bwd_check(const dg_spec *spec, const dg_resid_ln_bwd_args *a,
				char *msg, size_t msg_size);
dg_status dg_lmhead_logits_check(const dg_spec *spec, const dg_lmhead_logits_args *a, char *msg,
				 size_t msg_size);
/* lmhead_logits's one-call form (prepare and launch), for the library's
 * own callers and the tests: the public door is dg_prepare. */
dg_status dg_lmhead_logits(dg_device *dev, const dg_spec *spec, const dg_lmhead_logits_args *a);
dg_status dg_lmhead_ce_check(const dg_spec *spec, const dg_lmhead_ce_args *a, char *msg,
			     size_t msg_size);
dg_status dg_gate_fwd_check(const dg_spec *spec, const dg_gate_fwd_args *a, char *msg,
			    size_t msg_size);
dg_status dg_gate_bwd_check(const dg_spec *spec, const dg_gate_bwd_args *a, char *msg,
			    size_t msg_size);
dg_status dg_gate_quant_check(const dg_spec *spec, const dg_gate_quant_args *a, char *msg,
			      size_t msg_size);
/* gate_quant in one call (prepare and launch), for the library's own
 * callers and the tests: the public door is dg_prepare. */
dg_status dg_gate_quant(dg_device *dev, const dg_spec *spec, const dg_gate_quant_args *a);
dg_status dg_decoder_gate_bwd_check(const dg_spec *spec, const dg_decoder_gate_bwd_args *a,
				    char *msg, size_t msg_size);
dg_status dg_decoder_gate_bwd_ys_check(const dg_spec *spec, const dg_decoder_gate_bwd_ys_args *a,
				       char *msg, size_t msg_size);
/* decoder_gate_bwd_ys in one call (prepare and launch), for the library's
 * own callers and the tests: the public door is dg_prepare. */
dg_status dg_decoder_gate_bwd_ys(dg_device *dev, const dg_spec *spec,
				 const dg_decoder_gate_bwd_ys_args *a);
dg_status dg_add_mask_check(const dg_spec *spec, const dg_add_mask_args *a, char *msg,
			    size_t msg_size);
dg_status dg_add3_check(const dg_spec *spec, const dg_add3_args *a, char *msg, size_t msg_size);
dg_status dg_transpose_check(const dg_spec *spec, const dg_transpose_args *a, char *msg,
			     size_t msg_size);
dg_status dg_adamw_update_check(const dg_spec *spec, const dg_adamw_update_args *a, char *msg,
				size_t msg_size);

#endif /* DG_RUNTIME_OPS_CHECKS_H */
