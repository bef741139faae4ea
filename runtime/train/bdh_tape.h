/*
 * The BDH step as a tape (runtime/train/tape.h): the buffers and nodes of
 * dragon/model.h's model, forward then backward, for a config and (B, T).
 *
 * Shared weights: every layer reads the same execution copies, and each
 * weight's gradient is one node over all layers' rows (the layers' inputs
 * and gradients are slices of stacks (L·B, ...)), at the end of the
 * backward. The CPU target keeps f32 everywhere, the encoders' copies as
 * (H, N, D) and the decoder's as (D, H·N) (the layouts the kernels read),
 * and the attention's RoPE'd queries for its backward.
 */
#ifndef DG_RUNTIME_TRAIN_BDH_TAPE_H
#define DG_RUNTIME_TRAIN_BDH_TAPE_H

#include "runtime/train/tape.h"

/* Ids of the buffers a backend fills or reads outside the nodes. */
typedef struct dg__bdh_ids {
	int params[DG_MODEL_N_PARAMS]; /* the masters, reference layouts */
	int grads[DG_MODEL_N_PARAMS];  /* their gradients */
	int exec[DG_PROJ__COUNT];      /* encoder, encoder_v (H,N,D); decoder (D,H·N);
					* a low-bit recipe's codes carry their scales */
	int exec_f32;                  /* low-bit: a transposed f32 master (H·N·D) */
	int exec_codes;                /* low-bit: its codes, one a byte, before packing */
	int exec_bf16[DG_PROJ__COUNT]; /* bf16_grads: the encoders' codes × scales (H,N,D)
					* bf16, what their input gradients read; dec_gate:
					* the decoder's (D,H·N), what DEC_GATE reads */
	int dec_fwd;                   /* dec_fwd_gemm: the decoder's bf16 copy in the
					* master's layout [H·N, D], what its forward reads */
	int gexec[DG_PROJ__COUNT];     /* the execution copies' gradients */
	int tokens, targets;           /* (B, T) int32 (4-byte buffers) */
	int cos, sin;                  /* the CPU's RoPE tables (T, N/2) */
	int rope;                      /* the GPU's: (T, N) f32, cos at 2p, sin at 2p+1 */
	int x_final;                   /* the last hidden state (B,1,T,D), in act: what
					* the loss's lm_head reads (the logits') */
	int loss;                      /* one float */
	int bad;                       /* the GPU's out-of-vocabulary flag (an int32) */
} dg__bdh_ids;

/* Where the tape runs: the CPU references (f32, RoPE'd queries saved for
 * the attention's backward) or the GPU ops (activations in `act`, the
 * attention's scores saved; the (B,H,T,N) gradients dxs, dys in `act` too). */
typedef struct dg__bdh_target {
	bool gpu;
	dg_fmt act;  /* activations: f32 | bf16 (the CPU: f32) */
	bool lowbit; /* the GPU: the recipe's integer weights and activations
		      * (a scale a token for activations) */
	/* the GPU's low-bit on sm_90: the projections' gradient GEMMs read
	 * bf16 operands (their warpgroup path): the encoders' dequantized
	 * copies (exec_bf16) and, made by a dequantize node before each
	 * weight gradient, the saved input codes dequantized (a temporary) */
	bool bf16_grads;
	/* the GPU's bf16 activations on sm_90: the decoder's input gradient
	 * and the gate's backward are one node (DEC_GATE, decoder_gate_bwd),
	 * which reads the decoder's weight in bf16 (a low-bit recipe's
	 * dequantized copy, exec_bf16[DG_PROJ_DECODER]) */
	bool dec_gate;
	/* the GPU's float bf16 recipe on sm_90: the decoder's forward as the
	 * projection's input-gradient GEMM (lowrank_grad_input's warpgroup
	 * path: xy (B,H,T,N) bf16 · [H·N, D] bf16 summed over the heads, f32
	 * out) from a bf16 copy of the master (dec_fwd); its output yd is
	 * f32, which the layer norm after it reads */
	bool dec_fwd_gemm;
	/* the GPU's gradient accumulation: the projections' execution-layout
	 * weight gradients (gexec) kept in the gradients' arena, summed over
	 * a step's micro-batches, not temporaries */
	bool keep_gexec;
	/* the GPU's rope=pre attention (bf16 on sm_90): the forward keeps
	 * RoPE(xs) for the backward, which then makes no RoPE pass; the
	 * layer's saved attention buffer holds the scores, then (256-byte
	 * aligned) RoPE(xs) (B,H,T,N) act, one buffer of bytes */
	bool keep_qr;
	bool proj_rope;    /* with keep_qr: the forward's encoder projection
			    * writes RoPE(xs) into the layer's attention buffer
			    * too (its second output, so that buffer lives
			    * from the projection on) */
	/* the GPU: the encoders' (B,H,T,N) gradients dxs and dys of every
	 * layer kept, stacked (L·B, H, T, N) in act, so each encoder's weight
	 * gradient is one GEMM over all layers' rows after the backward (as
	 * the decoder's is), not a GEMM a layer that reads and writes the
	 * whole f32 gradient each time: L·B·H·T·N act bytes each, against
	 * L - 1 read-modify-writes of H·N·D floats each (gpu_model.c
	 * pgrads_stackable says where that pays) */
	bool stack_pgrads;
	/* either target: the projections' outputs xs and ys are not saved
	 * (temporaries of the forward), and each layer's backward makes them
	 * again, first, by the same projections of the same saved inputs (x
	 * and a, or their codes): the same bits, 2·B·H·T·N act bytes a layer
	 * fewer saved, two projections a layer more (gpu_model.c: where the
	 * plan would not fit otherwise; DRAGON_RECOMPUTE) */
	bool recompute;
	/* either target, where recompute is not set: ys alone not saved and
	 * made again by its layer's backward (one projection a layer more,
	 * B·H·T·N act bytes a layer fewer saved); xs, which the attention's
	 * backward reads too, saved. The middle rung between saving both
	 * and recompute (gpu_model.c build_fit; DRAGON_RECOMPUTE=ys) */
	bool recompute_ys;
	/* the GPU's, with recompute_ys (or recompute) and dec_gate on a
	 * low-bit recipe whose encoder_v takes int8 weights: ys is made again
	 * inside DEC_GATE (decoder_gate_bwd_ys: its tile's ys from the layer's
	 * saved codes aq and the encoder_v's execution copy), not by a
	 * projection node: the same bits, no (B,H,T,N) ys pass */
	bool gate_ys;
	/* the GPU's low-bit recipes whose decoder input has a scale a token:
	 * the gate and that quantizer one node (GATE_Q, gate_quant), so the
	 * product xy is never in memory */
	bool gate_quant;
	/* the GPU's chunked attention (gpu_model.c attn_chunk_for): 0, the
	 * quadratic form, its saved scores (B,H,T,T); C, the chunked form,
	 * its saved scores the chunks' (B,H,T,C) */
	int attn_chunk;
} dg__bdh_target;

/* The keep_qr attention buffer's layout: the scores (B,H,T,S) in act (S
 * = T, or the chunk C of the chunked form), then RoPE(xs) (B,H,T,N) at
 * dg__bdh_attn_qr_offset (256-byte aligned); its bytes. */
int64_t dg__bdh_attn_qr_offset(int64_t B, int64_t H, int64_t T, int64_t S, dg_fmt act);
int64_t dg__bdh_attn_saved_bytes(int64_t B, int64_t H, int64_t T, int64_t S, int64_t N, dg_fmt act);

/* Records the step into t (initialized by the caller with c, B, T); the
 * caller adds workspaces (dg__tape_buf + node.ws) and plans. DG_ERR_NOMEM
 * when a declaration runs out of memory. */
dg_status dg__bdh_tape_build(dg__tape *t, dg__bdh_ids *ids, const dg__bdh_target *tg);

/* Whether node nd adds into its output instead of writing it: a layer's
 * share of a projection's weight gradient, except the backward's first
 * layer's (the last), which writes. A step's later micro-batches add
 * besides (the backends' rule). */
bool dg__bdh_grad_adds(const dg__tape *t, const dg__tnode *nd);

#endif
