/*
 * dragon — ops: one call validates the tensors against the spec, fetches
 * the specialized kernel (JIT at first use) and launches it on the calling
 * thread's stream. Nothing is launched when a check fails: the status is
 * DG_ERR_INVALID_ARG (tensors) or DG_ERR_INVALID_SPEC (spec), and the
 * device's message names the tensor and the expected shape.
 *
 * Each op's tensors, their formats and shapes are the op table's
 * (dg_op_info_of(op)->args); the checks read them there. The same checks
 * without a device, for any op (a tool that plans ahead), are
 * dg_ffi_op_check's (dragon/ffi.h).
 *
 * Graph-safe: no op allocates, frees or synchronizes once its kernels are
 * loaded. An op that needs scratch memory takes a caller-owned workspace,
 * sized ahead by its _workspace twin (like cuBLASLt's): a workspace too
 * small is refused by name. Plan it once per shape; the size depends on
 * the tile the device resolves, so ask on the device that runs the op.
 *
 * Shapes (BDH; docs/formats.md, "Dimensions"): B batch, T time, H heads,
 * Hin input heads (1 or H), D embd, N latent — H, Hin, D, N come from the
 * spec (heads, in_heads, embd, latent), B and T from the tensors. Integer tensors carry their scale (dg_tensor.scale). Gradients
 * are f32. The straight-through estimator: gradients w.r.t. a quantized
 * weight are the gradients of its float master, and are returned as such.
 *
 *   lowrank_fwd          x (B,Hin,T,D) act, w (H,N,D) weight
 *                        → out (B,H,T,N) out      relu(s·x·wᵀ − thr)
 *   relu_mask            x, w as lowrank_fwd; grad (B,H,T,N) f32
 *                        → grad_out (B,H,T,N) f32 = grad · [y > thr],
 *                          y recomputed from the codes (may alias grad)
 *   lowrank_grad_input   grad (B,H,T,N) f32 (masked), w (H,N,D) weight
 *                        → grad_x (B,Hin,T,D) f32 (head sum when Hin = 1)
 *   lowrank_grad_weight  grad (B,H,T,N) f32 (masked), x (B,Hin,T,D) act
 *                        → grad_w (H,N,D) f32
 *   decoder_fwd          y (B,H,T,N) act, w (D,H·N) weight
 *                        → out (B,1,T,D) f32|bf16 (head sum fused)
 *   decoder_grad_input   grad (B,1,T,D) f32, w (D,H·N) weight
 *                        → grad_y (B,H,T,N) f32
 *   decoder_grad_weight  grad (B,1,T,D) f32, y (B,H,T,N) act
 *                        → grad_w (D,H·N) f32
 *   quantize_act         x (any) f32|bf16 → codes (same shape) act, scale
 *   dequantize           codes (R,C) act, scale a tensor or a row → out (R,C)
 *                        bf16|f32 = code × s
 *   quantize_weight      w (any) f32|bf16 → codes (same shape) int8 bytes
 *                        (one code a byte) and scale, per the weight format
 *   pack_ternary / pack_sign1   codes (R,K) int8 → packed (R,K) ternary|sign1
 *   unpack_ternary / unpack_sign1   packed (R,K) → codes (R,K) int8 (i8x4)
 *   pack_i8x4 / unpack_i8x4      codes (R,K,C) int8 ↔ packed (R,C,K) int8
 *
 * Rows R (= B·T, the call's) of width D, V the spec's vocab; float
 * activations f32|bf16 (src in, out out), statistics, losses and
 * gradients f32; every sum in a fixed order (bitwise reproducible, any
 * grid):
 *   embed_fwd      idx (R) i32, table (V,D) f32 → out (R,D) out
 *   embed_bwd      idx (R) i32, dout (R,D) src → dtable (V,D) f32 (+)=
 *   layernorm_fwd  x (R,D) src → y (R,D) out, rstd (R) f32
 *   layernorm_bwd  dy (R,D) f32, y (R,D) src, rstd → dx (R,D) f32 (+)=
 *   resid_ln_fwd   x, y (R,D) src → out (R,D) out = LN(x + y), rstd
 *   resid_ln_bwd   dout (R,D) f32, out (R,D) src, rstd → dx (+)=, dy
 *   lmhead_ce      x (R,D) src, w (D,V) weight (f32|bf16), targets (R) i32
 *                  → loss (1) f32; backward: dx (R,D) f32, dw (D,V) f32 (+)=
 *   lmhead_logits  x (R,D) src, w (D,V) f32 → logits (R,V) f32 (double sums)
 * A token id outside 0..V-1 (embed_fwd's idx, lmhead_ce's targets) is never
 * read through: the op cannot see device data without a sync, so the
 * kernel makes that row harmless (a zero embedding row; row loss 0 and no
 * gradient) and sets the caller's `bad` flag, which the caller checks with
 * the loss (as PyTorch users expect an error, not silent garbage; the
 * model checks tokens on the host before it uploads them).
 */
#ifndef DRAGON_OPS_H
#define DRAGON_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "optim.h"
#include "runtime.h"
#include "spec.h"
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch device memory an op may use during the call (and, in a graph,
 * during every replay): ptr 0 and bytes 0 when the op needs none. 256-byte
 * aligned (dg_malloc and arena allocations are). */
typedef struct dg_workspace {
	dg_dptr ptr;
	size_t bytes;
} dg_workspace;

/* ---- prepared ops ------------------------------------------------------
 * An op prepared once for a spec, a device and the shapes of its call, and
 * launched many times: dg_prepare does every check, fetches the kernels
 * (JIT or cache), resolves the tile, the launch geometry, the workspace
 * size and each kernel parameter's place; dg_prepared_launch then checks
 * only that the call's tensors have the prepared formats and shapes (and
 * usable pointers) and launches. args points at the op's own arguments
 * struct, the dg_<op>_args of spec->op (dg_lowrank_fwd_args for
 * op=lowrank_fwd, ...), its tensors' data pointers any that pass the
 * checks; a launch takes the same struct with the pointers of the day.
 * The ops' one-call forms below are dg_prepare + dg_prepared_launch. A
 * prepared op holds no device memory and may be launched from any thread
 * (not at once from two with the same workspace). Messages on the
 * device. The attention chains (dg_attention_fwd, dg_attention_bwd) and
 * dg_grad_norm are several ops: prepare their ops one by one. */
typedef struct dg_prepared dg_prepared;

DG_API dg_status dg_prepare(dg_device *dev, const dg_spec *spec, const void *args,
		     dg_prepared **out);
DG_API dg_status dg_prepared_launch(const dg_prepared *p, const void *args);
/* The workspace bytes a launch needs (0: none; args' ws must hold them). */
DG_API size_t dg_prepared_workspace(const dg_prepared *p);
DG_API void dg_prepared_destroy(dg_prepared *p); /* NULL is fine */

/* ---- projection -------------------------------------------------------- */
typedef struct dg_lowrank_fwd_args {
	const dg_tensor *x;
	const dg_tensor *w;
	const dg_tensor *out;
	dg_dptr out_absum; /* 0, or a float that gets += Σ|y| (caller zeroes) */
	/* epi=rope only (NULL otherwise): the RoPE table (T, N) f32 and
	 * qr (B,H,T,N) bf16, which gets RoPE(out) as rope_fwd makes it */
	const dg_tensor *rope;
	const dg_tensor *qr;
} dg_lowrank_fwd_args;
DG_API dg_status dg_lowrank_fwd(dg_device *dev, const dg_spec *spec,
				const dg_lowrank_fwd_args *a);

typedef struct dg_relu_mask_args {
	const dg_tensor *x;
	const dg_tensor *w;
	const dg_tensor *grad;
	const dg_tensor *grad_out;
} dg_relu_mask_args;
DG_API dg_status dg_relu_mask(dg_device *dev, const dg_spec *spec,
			      const dg_relu_mask_args *a);

/* The gradient GEMMs' gradient formats: dragon/spec.h "gradient formats"
 * (lowrank_grad_input and _weight read grad in spec->src, decoder_grad_input
 * writes grad_y in spec->out; f32 | bf16; everything else f32). */
/* lowrank_grad_input reduces over K = (H/Hin)·N, a long reduction onto
 * few output tiles (B·T x D): split over grid z into partial sums in the
 * workspace, which a second pass adds in split order (no float atomics:
 * bitwise reproducible for a fixed split count and tile). splits 0 lets
 * the runtime pick the count from the grid and the SM count; 1 to 64
 * forces it (a split past the reduction's K steps sums nothing), for
 * tests and manual sweeps. */
typedef struct dg_lowrank_grad_input_args {
	const dg_tensor *grad;   /* (B,H,T,N) spec->src */
	const dg_tensor *w;
	const dg_tensor *grad_x; /* (B,Hin,T,D) f32 */
	dg_workspace ws;         /* partial sums of a split reduction over K */
	int splits;              /* 0: the runtime's choice; 1..64: forced */
} dg_lowrank_grad_input_args;
/* The workspace a call with a's tensors and splits needs on dev (a->ws is
 * ignored): splits · B·Hin·T·D floats when split, else 0. */
DG_API dg_status dg_lowrank_grad_input_workspace(dg_device *dev, const dg_spec *spec,
					  const dg_lowrank_grad_input_args *a,
					  size_t *bytes);
DG_API dg_status dg_lowrank_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_lowrank_grad_input_args *a);

typedef struct dg_lowrank_grad_weight_args {
	const dg_tensor *grad; /* (B,H,T,N) spec->src */
	const dg_tensor *x;
	const dg_tensor *grad_w;
	bool accumulate; /* grad_w += instead of = */
	dg_workspace ws; /* partial sums of a split reduction over B·T */
} dg_lowrank_grad_weight_args;
/* The workspace a call with a's tensors needs on dev (a->ws is ignored). */
DG_API dg_status dg_lowrank_grad_weight_workspace(dg_device *dev, const dg_spec *spec,
						  const dg_lowrank_grad_weight_args *a,
						  size_t *bytes);
DG_API dg_status dg_lowrank_grad_weight(dg_device *dev, const dg_spec *spec,
					const dg_lowrank_grad_weight_args *a);

/* ---- decoder tail ------------------------------------------------------ */
typedef struct dg_decoder_fwd_args {
	const dg_tensor *y;
	const dg_tensor *w;
	const dg_tensor *out;
	dg_workspace ws; /* one slice of partial sums a K split */
} dg_decoder_fwd_args;
DG_API dg_status dg_decoder_fwd_workspace(dg_device *dev, const dg_spec *spec,
					  const dg_decoder_fwd_args *a, size_t *bytes);
DG_API dg_status dg_decoder_fwd(dg_device *dev, const dg_spec *spec,
				const dg_decoder_fwd_args *a);

typedef struct dg_decoder_grad_input_args {
	const dg_tensor *grad;   /* (B,1,T,D) f32 */
	const dg_tensor *w;
	const dg_tensor *grad_y; /* (B,H,T,N) spec->out */
} dg_decoder_grad_input_args;
DG_API dg_status dg_decoder_grad_input(dg_device *dev, const dg_spec *spec,
				       const dg_decoder_grad_input_args *a);

typedef struct dg_decoder_grad_weight_args {
	const dg_tensor *grad;
	const dg_tensor *y;
	const dg_tensor *grad_w;
	bool accumulate;
	dg_workspace ws; /* partial sums of a split reduction over B·T */
} dg_decoder_grad_weight_args;
DG_API dg_status dg_decoder_grad_weight_workspace(dg_device *dev, const dg_spec *spec,
						  const dg_decoder_grad_weight_args *a,
						  size_t *bytes);
DG_API dg_status dg_decoder_grad_weight(dg_device *dev, const dg_spec *spec,
					const dg_decoder_grad_weight_args *a);

/* ---- quantize and pack ------------------------------------------------- */
/* quantize_act: codes->scale receives the scale (2·mean|x|/qmax). */
typedef struct dg_quantize_act_args {
	const dg_tensor *x;
	const dg_tensor *codes;
	dg_workspace ws; /* the |x| partial sums */
} dg_quantize_act_args;
DG_API dg_status dg_quantize_act_workspace(dg_device *dev, const dg_spec *spec,
					   const dg_quantize_act_args *a, size_t *bytes);
DG_API dg_status dg_quantize_act(dg_device *dev, const dg_spec *spec,
				 const dg_quantize_act_args *a);

/* dequantize: codes (R,C) act (int8 | int4 | uint8pos) with their scale —
 * codes->scale one float (ascale=tensor) or R floats, one a row
 * (ascale=token) — → out (R,C) spec->out (bf16 | f32): out = code × s in
 * f32, bf16 rounded to nearest even once (dg_ref_run's, bit for bit).
 * Both tensors 2-D (view a stack as its rows). */
typedef struct dg_dequantize_args {
	const dg_tensor *codes;
	const dg_tensor *out;
} dg_dequantize_args;
DG_API dg_status dg_dequantize(dg_device *dev, const dg_spec *spec, const dg_dequantize_args *a);

/* quantize_weight: codes is int8 (one code a byte, same shape as w) and
 * codes->scale receives the weight scale of spec->weight. */
typedef struct dg_quantize_weight_args {
	const dg_tensor *w;
	const dg_tensor *codes;
	dg_workspace ws; /* the |w| partial sums */
} dg_quantize_weight_args;
DG_API dg_status dg_quantize_weight_workspace(dg_device *dev, const dg_spec *spec,
					      const dg_quantize_weight_args *a, size_t *bytes);
DG_API dg_status dg_quantize_weight(dg_device *dev, const dg_spec *spec,
				    const dg_quantize_weight_args *a);

/* spec op pack_ternary or pack_sign1; unpack=false: codes → packed,
 * unpack=true: packed → codes (i8x4). The scale pointer is carried over by
 * the caller (it is the same float). */
typedef struct dg_pack_weight_args {
	const dg_tensor *codes;
	const dg_tensor *packed;
	bool unpack;
} dg_pack_weight_args;
DG_API dg_status dg_pack_weight(dg_device *dev, const dg_spec *spec,
				const dg_pack_weight_args *a);

/* spec op pack_i8x4 (codes → packed) or unpack_i8x4 (packed → codes). */
typedef struct dg_pack_i8x4_args {
	const dg_tensor *codes;
	const dg_tensor *packed;
} dg_pack_i8x4_args;
DG_API dg_status dg_pack_i8x4(dg_device *dev, const dg_spec *spec,
			      const dg_pack_i8x4_args *a);

/* ---- attention (BDH: quadratic form, no softmax, strictly causal) ---------
 * xs (B,H,T,N) act (post-ReLU), v (B,1,T,D) act shared by every head,
 * rope (T,N) f32: (cos, sin) of pair p of row t at columns 2p, 2p+1
 * (dg_ref_rope_pairs; upload once for the longest T: the first T rows of
 * it, a (T,N) view, serve any shorter T). act f32 (fp32 FMA) or bf16 (tensor
 * cores, f32 sums); gradients f32.
 *   rope_fwd               x → out = x·cos + rot(x)·sin          (B,H,T,N) act
 *   rope_bwd               grad → grad_x = its transpose          (B,H,T,N) f32
 *   attention_scores       xs, rope → scores S = tril(qr·qrᵀ, −1), qr = RoPE(xs)
 *                          (B,H,T,T) act (zeros on and above the diagonal)
 *   attention_out          scores, v → out = tril(S, −1)·v      (B,H,T,D) act
 *   attention_grad_scores  grad (B,H,T,D), v → grad_scores C = dS + dSᵀ,
 *                          dS = tril(grad·vᵀ, −1)                (B,H,T,T) act
 *   attention_grad_v       scores, grad → grad_v = Σ_h tril(S, −1)ᵀ·grad
 *                          (B,1,T,D) f32, heads summed in order (deterministic)
 *   attention_grad_xs      grad_scores, xs, rope → grad_xs = RoPEᵀ(C·RoPE(xs))
 *                          (B,H,T,N) out (f32 | bf16; before the ReLU mask)
 *                          epi=mask: no grad_xs; dxs (B,H,T,N) out, in place,
 *                          and mask_xs (B,H,T,N) act (the ReLU's output) →
 *                          dxs = (dxs + grad_xs) · [mask_xs > 0], grad_xs in
 *                          f32 and the sum rounded once, as add_mask's
 *                          (src=f32) after the f32 grad_xs; dxs must not
 *                          overlap any input
 * dg_attention_fwd / dg_attention_bwd run the chains; the backward's C
 * lives in the caller's workspace. */
typedef struct dg_rope_fwd_args {
	const dg_tensor *x, *rope, *out;
} dg_rope_fwd_args;
DG_API dg_status dg_rope_fwd(dg_device *dev, const dg_spec *spec, const dg_rope_fwd_args *a);

typedef struct dg_rope_bwd_args {
	const dg_tensor *grad, *rope, *grad_x;
} dg_rope_bwd_args;
DG_API dg_status dg_rope_bwd(dg_device *dev, const dg_spec *spec, const dg_rope_bwd_args *a);

typedef struct dg_attention_scores_args {
	const dg_tensor *xs, *rope, *scores;
} dg_attention_scores_args;
DG_API dg_status dg_attention_scores(dg_device *dev, const dg_spec *spec,
				     const dg_attention_scores_args *a);

typedef struct dg_attention_out_args {
	const dg_tensor *scores, *v, *out;
} dg_attention_out_args;
DG_API dg_status dg_attention_out(dg_device *dev, const dg_spec *spec, const dg_attention_out_args *a);

typedef struct dg_attention_grad_scores_args {
	const dg_tensor *grad, *v, *grad_scores;
} dg_attention_grad_scores_args;
DG_API dg_status dg_attention_grad_scores(dg_device *dev, const dg_spec *spec,
					  const dg_attention_grad_scores_args *a);

typedef struct dg_attention_grad_v_args {
	const dg_tensor *scores, *grad, *grad_v;
} dg_attention_grad_v_args;
DG_API dg_status dg_attention_grad_v(dg_device *dev, const dg_spec *spec,
				     const dg_attention_grad_v_args *a);

typedef struct dg_attention_grad_xs_args {
	const dg_tensor *grad_scores, *xs, *rope;
	const dg_tensor *grad_xs;        /* epi=store: written; epi=mask: NULL */
	const dg_tensor *dxs, *mask_xs;  /* epi=mask (else NULL): dxs read and
					  * written, mask_xs read */
} dg_attention_grad_xs_args;
DG_API dg_status dg_attention_grad_xs(dg_device *dev, const dg_spec *spec,
				      const dg_attention_grad_xs_args *a);

/* attention_step: decoding from a state (dragon/model.h dg_model_state),
 * T tokens a row in order (T 1: a decoded token; more: a prompt's window,
 * one launch): for token t, qr = RoPE(xs) at the row's position pos + t
 * (pos (B) f32, exact integers below 2^24; freq (N) f32, pair p's
 * frequency 1/θ^(2p/N)/2π at 2p and 2p+1), out (B,H,T,D) act = qr·S with
 * S the state before the token, then state (B,H,N,D) f32 += qrᵀ·v, v
 * (B,1,T,D) act; xs (B,H,T,N) act. The state's N·D values a (row, head)
 * are stored in groups of 8 columns, each group's N rows contiguous:
 * S[k, e] of (b, h) at ((b·H + h)·D/8 + e/8)·N·8 + k·8 + e%8.
 * Deterministic (sums in a fixed order), and a window of T tokens gives
 * the bytes of T calls of one token at the same tile; pairs whose xs are
 * both 0 are skipped (their rows neither add nor change). */
typedef struct dg_attention_step_args {
	const dg_tensor *xs, *pos, *freq, *v, *state, *out;
} dg_attention_step_args;
DG_API dg_status dg_attention_step(dg_device *dev, const dg_spec *spec, const dg_attention_step_args *a);

/*
 * The chunked form (DESIGN.md, "Long context"): BDH's attention is linear
 * attention with Q = K = qr = RoPE(xs); in chunks of C rows of T (the
 * spec's chunk; T % C == 0), per (b, h),
 *   out_c = tril(qr_c·qr_cᵀ, −1)·v_c + qr_c·S_c,   S_c = Σ_{k<c} qr_kᵀ·v_k,
 * and the backward adds dout_c·S_cᵀ + v_c·R_cᵀ to dqr_c and Σ_h qr_c·R_c
 * to dv_c, R_c = Σ_{k>c} qr_kᵀ·dout_k. The intra-chunk terms are the
 * quadratic ops run at T = C on the B·H·T/C chunks as sequences of one
 * head (a (B,H,T,·) tensor is the same memory as (B·H·T/C,1,C,·)); these
 * ops make and use the states. sm_90a (arch=sm_90a) for the three GEMMs,
 * act bf16, their sums f32. A state is kept as two bf16 matrices, the f32
 * sum's rounding (hi) and the rounding's remainder (lo): (B,H,S,D) holds
 * for each chunk its 2N rows (hi, then lo), S = 2·N·T/C.
 *   attention_chunk_state  qr (B,H,T,N), src (B,Hin,T,D) → states: S_c of
 *                          src = v (in_heads 1); backward: the reversed walk,
 *                          R_c of src = dout (in_heads H, bf16)
 *   attention_chunk_out    qr, states → out (B,H,T,D) out (f32 | bf16) +=
 *                          qr_c·(hi + lo) of chunk c (the walk's first chunk,
 *                          whose state is zero, adds nothing); backward: the
 *                          reversed states (dv's Σ over the heads comes after,
 *                          attention_chunk_hsum)
 *   attention_chunk_dq     grad_scores C (B,H,T,C) (the chunks' dS + dSᵀ),
 *                          qr, grad (B,H,T,D) bf16, v (B,1,T,D), states S,
 *                          rstates R, rope (T,N) → dxs (B,H,T,N) out, in
 *                          place: (dxs + RoPEᵀ(C_c·qr_c + grad_c·S_cᵀ +
 *                          v_c·R_cᵀ))·[mask_xs > 0]; dxs must not overlap an
 *                          input
 *   attention_chunk_vrep   v (B,1,T,D) → vr (B,H,T,D): the values a head each
 *   attention_chunk_cast   grad (B,H,T,D) f32 → out (B,H,T,D) bf16
 *   attention_chunk_hsum   grad (B,H,T,D) f32 → grad_v (B,1,T,D) f32 = Σ_h,
 *                          the heads in order
 * The chains below run them (dg_attention_fwd_args.chunk); a caller of
 * its own reaches each through the op door (dg_prepare with its args
 * struct, or dragon/ffi.h).
 */
typedef struct dg_attention_chunk_state_args {
	const dg_tensor *qr, *src, *states;
	bool backward; /* the reversed walk: R_c, the chunks after c */
} dg_attention_chunk_state_args;

typedef struct dg_attention_chunk_out_args {
	const dg_tensor *qr, *states, *out;
	bool backward; /* states made by the reversed walk */
} dg_attention_chunk_out_args;

typedef struct dg_attention_chunk_dq_args {
	const dg_tensor *grad_scores, *qr, *grad, *v, *states, *rstates, *rope, *dxs, *mask_xs;
} dg_attention_chunk_dq_args;

typedef struct dg_attention_chunk_vrep_args {
	const dg_tensor *v, *vr;
} dg_attention_chunk_vrep_args;

typedef struct dg_attention_chunk_cast_args {
	const dg_tensor *grad, *out;
} dg_attention_chunk_cast_args;

typedef struct dg_attention_chunk_hsum_args {
	const dg_tensor *grad, *grad_v;
} dg_attention_chunk_hsum_args;

/* The chains. spec: any attention op's spec (heads, embd, latent, act,
 * arch, rope are read; each step runs its own op with an auto tile: the
 * tuning DB's or the template's default). Forward: scores, then out.
 * Backward: grad_scores into ws, then grad_v and grad_xs; ws holds C,
 * B·H·T·T act values (dg_attention_bwd_workspace). With rope=pre (what the
 * sm_90a warpgroup GEMMs need: spec arch=sm_90a, act=bf16) each chain
 * first writes qr = RoPE(xs) (rope_fwd, B·H·T·N act values) into its
 * workspace, after C in the backward's, and the GEMMs read it raw.
 * The backward takes grad_xs (written, out = its format) or dxs (the
 * ReLU's gradient, f32 | bf16, in place: dxs = (dxs + grad_xs)·[xs > 0],
 * grad_xs's epi=mask with xs the mask, out = dxs's format), not both.
 * The backward's spec->tile (auto: every step's own) is attention_grad_xs's
 * where it names the persistent form (4 stages, BN 64 or 128:
 * templates/attention_tma.lua): with rope=pre and no qr given, that
 * kernel then turns xs by the table on its stages itself (rope=load), so
 * no RoPE(xs) is made and the workspace holds C alone; the same bytes. */
typedef struct dg_attention_fwd_args {
	const dg_tensor *xs, *v, *rope;
	const dg_tensor *scores; /* (B,H,T,T) act: saved for the backward */
	const dg_tensor *out;
	dg_workspace ws; /* rope=pre: qr (unless qr is given); else unused */
	/* rope=pre: where RoPE(xs) ((B,H,T,L) act) is written, to be given
	 * to the backward, which then makes no RoPE pass; NULL: in the
	 * workspace. rope=load: must be NULL. */
	const dg_tensor *qr;
	/* 0: the quadratic form; C (a multiple of 64 dividing T): the chunked
	 * form (dragon/ops.h, "The chunked form"; rope=pre, arch=sm_90a, act
	 * bf16), scores then (B,H,T,C): each chunk's C x C block, the
	 * workspace the values a head each and the states */
	int chunk;
	/* rope=pre, qr given, the quadratic form: qr holds RoPE(xs) already
	 * (the projection's epi=rope made it), so no RoPE pass is run */
	bool qr_made;
} dg_attention_fwd_args;
DG_API dg_status dg_attention_fwd_workspace(const dg_spec *spec, const dg_attention_fwd_args *a,
					    size_t *bytes);
DG_API dg_status dg_attention_fwd(dg_device *dev, const dg_spec *spec, const dg_attention_fwd_args *a);

typedef struct dg_attention_bwd_args {
	const dg_tensor *grad, *xs, *v, *rope, *scores;
	const dg_tensor *grad_xs, *grad_v;
	dg_workspace ws;
	const dg_tensor *dxs; /* in place of grad_xs: the masked sum into it */
	/* rope=pre: RoPE(xs) as the forward wrote it (its args' qr), read
	 * instead of made again in the workspace; NULL: made. rope=load: NULL. */
	const dg_tensor *qr;
	/* the forward's chunk (0: quadratic): scores (B,H,T,C) as it saved
	 * them; the chunked backward takes dxs (not grad_xs), and its
	 * workspace holds the gradient in bf16, the values a head each, the
	 * chunks' C, the per-head value gradients (f32) and both states */
	int chunk;
} dg_attention_bwd_args;
DG_API dg_status dg_attention_bwd_workspace(const dg_spec *spec, const dg_attention_bwd_args *a,
					    size_t *bytes);
DG_API dg_status dg_attention_bwd(dg_device *dev, const dg_spec *spec, const dg_attention_bwd_args *a);

/* ---- embed ------------------------------------------------------------- */
/* bad: 0, or an int32 on the device that gets 1 when a token is outside
 * 0..V-1 (that row of out is written as zeros). The op never clears it:
 * zero it once, read it when the loss is read. */
typedef struct dg_embed_fwd_args {
	const dg_tensor *idx;   /* (R) i32 */
	const dg_tensor *table; /* (V, D) f32 */
	const dg_tensor *out;   /* (R, D) spec->out */
	dg_dptr bad;
} dg_embed_fwd_args;
DG_API dg_status dg_embed_fwd(dg_device *dev, const dg_spec *spec, const dg_embed_fwd_args *a);

/* dtable[v] (accumulate: +)= the rows of dout whose token is v, added in
 * token order (exactly the CPU reference's f32 sums); tokens outside
 * 0..V-1 add nothing. */
typedef struct dg_embed_bwd_args {
	const dg_tensor *idx;    /* (R) i32 */
	const dg_tensor *dout;   /* (R, D) spec->src */
	const dg_tensor *dtable; /* (V, D) f32 */
	bool accumulate;
} dg_embed_bwd_args;
DG_API dg_status dg_embed_bwd(dg_device *dev, const dg_spec *spec, const dg_embed_bwd_args *a);

/* ---- layer norm (no affine; biased variance; eps inside the sqrt) ------- */
typedef struct dg_layernorm_fwd_args {
	const dg_tensor *x;    /* (R, D) spec->src */
	const dg_tensor *y;    /* (R, D) spec->out; must not alias x */
	const dg_tensor *rstd; /* (R) f32: 1/sqrt(var + eps), for the backward */
	float eps;             /* finite, >= 0 (PyTorch's default 1e-5) */
} dg_layernorm_fwd_args;
DG_API dg_status dg_layernorm_fwd(dg_device *dev, const dg_spec *spec,
				  const dg_layernorm_fwd_args *a);

/* dx (accumulate: +)= rstd·(dy − mean(dy) − y·mean(dy·y)). */
typedef struct dg_layernorm_bwd_args {
	const dg_tensor *dy;   /* (R, D) f32 */
	const dg_tensor *y;    /* (R, D) spec->src: the forward's output */
	const dg_tensor *rstd; /* (R) f32: the forward's */
	const dg_tensor *dx;   /* (R, D) f32 */
	bool accumulate;
} dg_layernorm_bwd_args;
DG_API dg_status dg_layernorm_bwd(dg_device *dev, const dg_spec *spec,
				  const dg_layernorm_bwd_args *a);

/* out = LN(x + y): x the residual stream, y the block's output (the add
 * rounded once in f32), one pass. */
typedef struct dg_resid_ln_fwd_args {
	const dg_tensor *x;    /* (R, D) spec->src */
	const dg_tensor *y;    /* (R, D) spec->src */
	const dg_tensor *out;  /* (R, D) spec->out; must not alias x or y */
	const dg_tensor *rstd; /* (R) f32 */
	float eps;
} dg_resid_ln_fwd_args;
DG_API dg_status dg_resid_ln_fwd(dg_device *dev, const dg_spec *spec,
				 const dg_resid_ln_fwd_args *a);

/* g = the layer norm gradient of dout; dx (accumulate: +)= g (the residual
 * stream's gradient), dy = g (the block output's). */
typedef struct dg_resid_ln_bwd_args {
	const dg_tensor *dout; /* (R, D) f32 */
	const dg_tensor *out;  /* (R, D) spec->src: the forward's output */
	const dg_tensor *rstd; /* (R) f32 */
	const dg_tensor *dx;   /* (R, D) f32 */
	const dg_tensor *dy;   /* (R, D) f32 */
	bool accumulate;
} dg_resid_ln_bwd_args;
DG_API dg_status dg_resid_ln_bwd(dg_device *dev, const dg_spec *spec,
				 const dg_resid_ln_bwd_args *a);

/* ---- lm_head + softmax cross-entropy ------------------------------------ */
/* loss = mean over the R rows of logsumexp(x·w) − (x·w)[target], written
 * to loss (a device float). backward: also dx = dlogits·wᵀ and dw
 * (accumulate: +)= xᵀ·dlogits with dlogits = (softmax − onehot)/R (dx and
 * dw needed then, NULL allowed without). Logits never reach global memory;
 * ws holds the per-row losses and, for the backward, dlogits (f32, bf16 on
 * the src=bf16 path), sized by dg_lmhead_ce_workspace (no device needed:
 * it depends on R, V, src and backward only). R >= 1. A target outside
 * 0..V-1: row loss 0, no gradient, *bad = 1 (see embed_fwd). */
typedef struct dg_lmhead_ce_args {
	const dg_tensor *x;       /* (R, D) spec->src */
	const dg_tensor *w;       /* (D, V) spec->weight (f32 | bf16) */
	const dg_tensor *targets; /* (R) i32 */
	const dg_tensor *loss;    /* (1) f32 */
	const dg_tensor *dx;      /* (R, D) f32, or NULL without backward */
	const dg_tensor *dw;      /* (D, V) f32, or NULL without backward */
	bool backward;
	bool accumulate;          /* dw += */
	dg_workspace ws;
	dg_dptr bad;
	/* 0, or a device float S (4-byte aligned) the backward multiplies
	 * dlogits by (the loss scaler's; a power of two: exact); read when
	 * the kernel runs, so a captured step reads its control block */
	dg_dptr grad_scale;
} dg_lmhead_ce_args;
/* dev may be NULL (the size needs none); a->ws is ignored. */
DG_API dg_status dg_lmhead_ce_workspace(dg_device *dev, const dg_spec *spec,
					const dg_lmhead_ce_args *a, size_t *bytes);
DG_API dg_status dg_lmhead_ce(dg_device *dev, const dg_spec *spec, const dg_lmhead_ce_args *a);

/* ---- lm_head logits (decoding) -------------------------------------------
 * logits (R, V) f32 = x (R, D) spec->src · w (D, V) f32, each logit summed
 * in double with k increasing and rounded once to f32: bit for bit the
 * host's double sum in that order (dg_ref_lmhead_logits, dg_model_logits).
 * What a decoder reads back a token; R is its few rows. No workspace.
 * Launched through dg_prepare / dg_prepared_launch with these arguments
 * (no one-call form among the exports). */
typedef struct dg_lmhead_logits_args {
	const dg_tensor *x;      /* (R, D) spec->src */
	const dg_tensor *w;      /* (D, V) f32 */
	const dg_tensor *logits; /* (R, V) f32 */
} dg_lmhead_logits_args;

/* ---- gate (BDH's xy = dropout(xs · ys)) -----------------------------------
 * (B,H,T,N) tensors, H and N the spec's, B and T the call's; act f32 or bf16,
 * gradients f32. The dropout mask is dg_dropout_keep(seed, step, layer,
 * elem0 + i, p) of dragon/rng.h for flat element i, regenerated (never
 * stored); p in [0, 1) (0: every element kept, scale 1), the scale
 * 1/(1 − p) rounded once. elem0 (0: the tensor's own masks) places the
 * tensor in a larger one's stream: a data-parallel rank running rows
 * row0 .. of the global batch passes row0·H·T·N and draws what one
 * process running the whole batch draws for those rows (any value: one
 * that is not a multiple of 8, whole Philox blocks, costs the vectors a
 * block more and decoder_gate_bwd's warpgroup epilogue its vectors). p, seed,
 * step, layer and elem0 are kernel arguments: one kernel a spec serves
 * every step, layer, rate and rank.
 *   gate_fwd  xs, ys → xy = keep ? (xs·ys)·(1/(1−p)) : 0          act
 *   gate_bwd  dxy, xs, ys → g = keep ? dxy·(1/(1−p)) : 0;
 *             dxs = g·ys, and dys = ys > 0 ? g·xs : 0 (ys's ReLU mask)
 *             written over dxy (in place)              spec->out: dxy,
 *             dys and dxs (f32 | bf16, dragon/spec.h's gradient formats)
 * Results are the CPU reference's bit for bit (dg_ref_run). */
typedef struct dg_gate_fwd_args {
	const dg_tensor *xs, *ys, *xy;
	float p;       /* drop probability, 0 <= p < 1 */
	uint64_t seed; /* the run's dropout seed */
	uint32_t step, layer;
	/* 0, or a device uint32 added to step when the kernel runs: a step
	 * captured into a CUDA graph reads it from its control block */
	dg_dptr step_at;
	/* added to each element's index before its draw: the first element's
	 * index in the global batch's (B,H,T,N) tensor (row0·H·T·N), 0 alone */
	uint64_t elem0;
} dg_gate_fwd_args;
DG_API dg_status dg_gate_fwd(dg_device *dev, const dg_spec *spec, const dg_gate_fwd_args *a);

typedef struct dg_gate_bwd_args {
	const dg_tensor *dxy; /* in: dxy; out: dys */
	const dg_tensor *xs, *ys, *dxs;
	float p;
	uint64_t seed;
	uint32_t step, layer;
	dg_dptr step_at; /* as gate_fwd's */
	uint64_t elem0;  /* as gate_fwd's: the forward's, so the masks match */
} dg_gate_bwd_args;
DG_API dg_status dg_gate_bwd(dg_device *dev, const dg_spec *spec, const dg_gate_bwd_args *a);

/* gate_quant: gate_fwd and quantize_act ascale=token in one pass (a
 * low-bit recipe's forward): codes (B,H,T,N) spec->act (uint8pos | int8)
 * with a scale a token (codes->scale, B·T f32) are those quantize_act
 * gives gate_fwd's xy (xs, ys (B,H,T,N) spec->src, the same dropout), bit
 * for bit, without xy in memory. */
typedef struct dg_gate_quant_args {
	const dg_tensor *xs, *ys, *codes;
	float p;
	uint64_t seed;
	uint32_t step, layer;
	dg_dptr step_at; /* as gate_fwd's */
	uint64_t elem0;  /* as gate_fwd's */
} dg_gate_quant_args;

/* decoder_gate_bwd: decoder_grad_input and gate_bwd in one kernel (no dxy
 * in memory), the model's backward on sm_90a:
 *   dxy = grad (B,1,T,D) f32 · w (D, H·N) (head h: columns h·N ..), f32;
 *   g = keep ? dxy·(1/(1−p)) : 0; dxs = g·ys, dys = ys > 0 ? g·xs : 0.
 * w spec->weight f32 | bf16 (no scale: a low-bit recipe passes its bf16
 * copy), xs and ys act, dxs and dys spec->out (bf16 by default); dxs and
 * dys alias nothing. Within the GEMM tolerance of the CPU reference
 * (dg_ref_run: its sums; the gate's rounding is the same). */
typedef struct dg_decoder_gate_bwd_args {
	const dg_tensor *grad, *w, *xs, *ys;
	const dg_tensor *dxs, *dys; /* out */
	float p;
	uint64_t seed;
	uint32_t step, layer;
	dg_dptr step_at; /* as gate_fwd's */
	uint64_t elem0;  /* as gate_fwd's: the forward's, so the masks match */
	dg_workspace ws; /* the persistent form's (a tile of 5 to 8 stages on
			  * sm_90a): grad's bf16 copy, B·T·D values
			  * (dg_prepare, dg_prepared_workspace) */
} dg_decoder_gate_bwd_args;
DG_API dg_status dg_decoder_gate_bwd(dg_device *dev, const dg_spec *spec,
				     const dg_decoder_gate_bwd_args *a);

/* decoder_gate_bwd_ys: decoder_gate_bwd on a ys it makes itself, so the
 * step need not keep ys from the forward to the backward: the tile
 * recomputes it from the encoder_v projection's codes,
 *   ys[b,h,t,n] = relu(Σ_d aq[b,h,t,d]·ev[h,n,d] · sa·sw − thr)
 * rounded to spec->src: bit for bit what the lowrank_fwd projection
 * (in_heads = heads, the spec's act, weight, scales and relu, out = src)
 * wrote. Then decoder_gate_bwd's arithmetic on it:
 *   dxy = grad (B,1,T,D) f32 · w (D, H·N) bf16 (head h: columns h·N ..);
 *   g = keep ? dxy·(1/(1−p)) : 0; dxs = g·ys, dys = ys > 0 ? g·xs : 0.
 * w is bf16 whatever the spec (the decoder's copy; spec->weight is ev's);
 * xs spec->src; aq (B,H,T,D) spec->act int8 | uint8pos with its scale
 * (ascale=token: one a row (b·H + h)·T + t, the default; tensor: one);
 * ev (H,N,D) spec->weight int8 with its scale (wscale=channel: one a
 * channel h·N + n, the default; tensor: one), a ternary recipe's codes
 * passed as int8; dxs and dys spec->out (bf16 by default) alias nothing.
 * Within the GEMM tolerance of the CPU reference (dg_ref_run: lowrank_fwd's
 * ys, then decoder_gate_bwd's). Launched through dg_prepare /
 * dg_prepared_launch with these arguments (no one-call form among the
 * exports). */
typedef struct dg_decoder_gate_bwd_ys_args {
	const dg_tensor *grad, *w, *xs, *aq, *ev;
	const dg_tensor *dxs, *dys; /* out */
	float p;
	uint64_t seed;
	uint32_t step, layer;
	dg_dptr step_at; /* as gate_fwd's */
	uint64_t elem0;  /* as gate_fwd's: the forward's, so the masks match */
} dg_decoder_gate_bwd_ys_args;

/* ---- step (the training step's element-wise glue and layout change) ------
 *   add_mask   dxs (B,H,T,N) in/out spec->out, other spec->src, xs act:
 *              dxs = xs > 0 ? dxs + other : 0 (xs = relu(·) from two consumers)
 *   add3       a, b, c → out = (a + b) + c, f32, any shape (all the same);
 *              out may alias a
 *   transpose  in (R,D,N) f32 → out (R,N,D) act (bf16: rounded to nearest
 *              even), R the call's, D and N the spec's embd and latent:
 *              the master encoders [H,D,N] to (H,N,D) (R = H), the
 *              decoder [H·N,D] to (D,H·N) (R = 1, embd H·N, latent D); the
 *              way back swaps embd and latent with act=f32.
 * Exact: the CPU references' bits (dg_ref_run). */
typedef struct dg_add_mask_args {
	const dg_tensor *dxs; /* in and out */
	const dg_tensor *other, *xs;
} dg_add_mask_args;
DG_API dg_status dg_add_mask(dg_device *dev, const dg_spec *spec, const dg_add_mask_args *a);

typedef struct dg_add3_args {
	const dg_tensor *a, *b, *c, *out;
} dg_add3_args;
DG_API dg_status dg_add3(dg_device *dev, const dg_spec *spec, const dg_add3_args *a);

typedef struct dg_transpose_args {
	const dg_tensor *in, *out;
} dg_transpose_args;
DG_API dg_status dg_transpose(dg_device *dev, const dg_spec *spec, const dg_transpose_args *a);

/* ---- optim (the optimizer on the device: templates/optim.lua) -------------
 *   adamw_update  p, m, v (any shape, one shape) f32 in place, grad f32:
 *                 one AdamW update with the step's scalars from ctl, a
 *                 dg_adamw_ctl (dragon/optim.h) in device memory, which a
 *                 captured step's host side rewrites by one small copy a
 *                 step; nothing when its skip is set. Bit for bit
 *                 the CPU reference (dg_ref_run). ctl 0: default
 *                 scalars (step 0 of dg_adamw_defaults at lr 1e-3, no
 *                 clip: the tuner's and the bench's calls). copy (0:
 *                 none): bf16 storage of p's element count, p's new value
 *                 rounded to nearest even as it is written (a float
 *                 recipe's GEMM operand in the master's own layout).
 *   grad_norm     the gradients' global L2 norm (Σ g² in double, in an
 *                 order fixed by the data's sizes alone) and its clip
 *                 factor min(1, clip/(norm + 1e-6)) into ctl (sq, norm,
 *                 scale; skip when the norm is not finite), so the update
 *                 that follows reads them on the device. spec: an
 *                 adamw_update spec (its module holds both). */
typedef struct dg_adamw_update_args {
	const dg_tensor *p, *grad, *m, *v;
	dg_dptr ctl;  /* a dg_adamw_ctl on the device, or 0 */
	dg_dptr copy; /* 0, or p's elements in bf16 */
	bool decay;   /* the decoupled weight decay (a matrix's) */
} dg_adamw_update_args;
DG_API dg_status dg_adamw_update(dg_device *dev, const dg_spec *spec, const dg_adamw_update_args *a);

typedef struct dg_grad_norm_args {
	const dg_tensor *const *grads; /* n f32 gradients, any shapes */
	int n;
	dg_dptr ctl;     /* the dg_adamw_ctl to write (its clip is read) */
	dg_workspace ws; /* dg_grad_norm_workspace's bytes */
} dg_grad_norm_args;
/* The workspace of n gradients' norm: a partial sum each of their blocks. */
DG_API size_t dg_grad_norm_workspace(int n);
DG_API dg_status dg_grad_norm(dg_device *dev, const dg_spec *spec, const dg_grad_norm_args *a);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_OPS_H */
