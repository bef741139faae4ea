/*
 * The CPU references of the single ops and of the model's other layers,
 * one function each: what dg_ref_run (dragon/ref.h) dispatches to, what
 * the CPU model (runtime/train/cpu_model.c) is made of, and what the
 * tests hold each kernel to. Private to the library and its tests.
 *
 * Each function computes exactly what the generated kernel of the same op
 * computes, on the same layouts (dragon/spec.h): integer paths bit for
 * bit, float paths within atol + rtol·|ref|. Shapes come from the spec
 * where the kernel has them as compile-time constants; run-time sizes are
 * arguments.
 *
 * Rounding: every float → code conversion is round-half-to-even (rintf in
 * the default rounding mode, __float2int_rn on the GPU), then clamped.
 * bf16 is stored as uint16_t and converted with round-half-to-even.
 */
#ifndef DG_RUNTIME_REF_OPS_H
#define DG_RUNTIME_REF_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/optim.h"
#include "dragon/ref.h"
#include "dragon/spec.h"
#include "dragon/status.h"

/* bf16 <-> f32 (round-half-to-even; NaN stays NaN). */
uint16_t dg_ref_f32_to_bf16(float x);
float dg_ref_bf16_to_f32(uint16_t x);

/* Largest code magnitude of an integer format: int8 127, int4 7,
 * uint8pos 255, ternary and sign1 1; 0 for float formats. */
int dg_ref_qmax(dg_fmt fmt);

/*
 * Activation quantize, as quantize_act: scale = 2·mean|x| / qmax (0 when
 * every x is 0), code = clamp(rint(x / scale), lo, qmax) with lo = -qmax,
 * or 0 for uint8pos (so codes never wrap); code 0 when scale is 0.
 * x is n floats (src f32) or n bf16 (src bf16); codes is n bytes (int8_t,
 * or uint8_t for uint8pos). The mean is accumulated in double.
 */
dg_status dg_ref_quantize_act(dg_fmt src, dg_fmt act, const void *x, size_t n,
			      void *codes, float *scale);

/* The apply step alone with a given scale (what the GPU apply kernel does
 * with the scale it computed). */
dg_status dg_ref_quantize_act_apply(dg_fmt src, dg_fmt act, const void *x,
				    size_t n, float scale, void *codes);

/*
 * Per token (ascale=token), as quantize_act's rows entry: x (B, G, T, C)
 * f32 or bf16; token r = b·T + t is its G·C values x[b, g, t, :];
 * scales[r] = max|x| / qmax (a float division; 0 when every value is 0),
 * codes as dg_ref_quantize_act_apply with that scale (no value clips).
 */
dg_status dg_ref_quantize_act_rows(dg_fmt src, dg_fmt act, const void *x, size_t batch,
				   size_t groups, size_t time, size_t cols, void *codes,
				   float *scales);

/*
 * Dequantize, as the dequantize op: codes (rows, cols), one a byte (int8_t
 * for int8 / int4, uint8_t for uint8pos), scale one float (gran tensor)
 * or one a row (token) → dst (rows, cols) out (f32 | bf16): the f32
 * product code × s, bf16 rounded to nearest even once.
 * DG_ERR_INVALID_ARG for another format or granularity.
 */
dg_status dg_ref_dequantize(dg_fmt act, dg_fmt out, dg_scale_gran gran, const void *codes,
			    int64_t rows, int64_t cols, const float *scale, void *dst);

/*
 * Weight quantize to codes (one int8 a value) and scale:
 *   int8    scale 2·mean|w|/127, code clamp(rint(w/scale), ±127)
 *   ternary scale mean|w|, code 0 where |w| < scale, else sign(w)
 *   sign1   scale mean|w|, code +1 where w >= 0, else -1
 */
dg_status dg_ref_quantize_weight(dg_fmt weight, const float *w, size_t n,
				 int8_t *codes, float *scale);

/*
 * Per output channel (wscale=channel): w (rows, cols), a scale a row:
 *   int8    max|w_row| / 127 (a float division), codes as above
 *   ternary mean|w_row| (summed in double), codes as above
 *   sign1   mean|w_row|
 */
dg_status dg_ref_quantize_weight_rows(dg_fmt weight, const float *w, size_t rows,
				      size_t cols, int8_t *codes, float *scales);

/* pack_i8x4: codes (R, K, C) int8 → packed (R, C, K/4) int32, the four
 * codes k..k+3 of column c in one word, code k in the low byte. */
dg_status dg_ref_pack_i8x4(const int8_t *codes, int32_t *packed, size_t rows,
			   int k, int c);
/* unpack_i8x4: the inverse. */
dg_status dg_ref_unpack_i8x4(const int32_t *packed, int8_t *codes,
			     size_t rows, int k, int c);

/* Weight storage packing along the reduction axis of contiguous rows of k
 * codes: ternary 16 a uint32 (2 bits: 00 0, 01 +1, 11 -1, code j at bits
 * 2j..2j+1), sign1 32 a uint32 (bit j set: +1). words must hold
 * rows·k/16 (ternary) or rows·k/32 (sign1). */
dg_status dg_ref_pack_ternary(const int8_t *codes, uint32_t *words,
			      size_t rows, int k);
dg_status dg_ref_pack_sign1(const int8_t *codes, uint32_t *words, size_t rows,
			    int k);

/*
 * lowrank_fwd for spec (op lowrank_fwd; heads H, in_heads Hin, embd E,
 * latent L; formats from the spec), batch B, time T:
 *
 *   y[b,h,t,l] = s · Σ_e x[b,hin(h),t,e] · w[h,l,e]   hin(h) = Hin==1 ? 0 : h
 *   out = relu ? max(y - thr, 0) : y, stored in the out format
 *
 * x: (B, Hin, T, E) in the act storage: i8x4 int32 (B,Hin,T,E/4) for int8,
 *    int4 and uint8pos (uint8pos lanes unsigned), else f32 / bf16.
 * w: (H, L, E) in the weight storage: int8 i8x4 (H,L,E/4); ternary uint32
 *    (H,L,E/16); sign1 uint32 (H,L,E/32); else f32 / bf16 (H,L,E).
 * s: sa·sw computed as a float product when both are integer formats (the
 *    sum is an exact int32); sa alone when only act is integer, sw alone
 *    when only weight is, 1 for float × float (the reference sums in
 *    double and rounds once; the kernels' float sums run in another
 *    order: compare with a tolerance).
 * out: (B, H, T, L): f32, bf16, or codes for int8 (±127) and uint8pos
 *    (0..255): v = fmaf(sum, a, b) with a = s·r, b = relu ? -thr·r : 0,
 *    r = 1.0f / so (each one rounded float); v = max(v, 0) with relu;
 *    code = clamp(rint(v)); code 0 when so <= 0. That is out / so, rounded
 *    once from the exact sum.
 * out_absum (may be NULL): set to Σ|out| over all outputs before they are
 *    quantized, accumulated in double (the GPU accumulates the same sum
 *    with float atomics: compare with a tolerance).
 */
typedef struct dg_ref_lowrank_args {
	const void *x;
	const void *w;
	float sa, sw, so;
	/* The spec's ascale=token: sa_v holds one scale a row of x
	 * ((b·Hin + hin)·T + t) in place of sa; wscale=channel: sw_v one a
	 * channel (h·L + l) in place of sw. Then s = sa_v[row]·sw_v[col] (the
	 * float product) an element, and out must be f32 or bf16. */
	const float *sa_v, *sw_v;
	void *out;
	double *out_absum;
	int batch, time;
} dg_ref_lowrank_args;

dg_status dg_ref_lowrank_fwd(const dg_spec *spec,
			     const dg_ref_lowrank_args *args);


/*
 * Scales in the ops below follow lowrank_fwd: an integer operand's codes
 * count times its scale (sa for act/x/y, sw for the weight); a float
 * operand is its own value (its scale argument is ignored). Gradients are
 * f32 and sums are accumulated in double (the GPU sums in float: compare
 * with a tolerance).
 */

/* relu_mask: y as lowrank_fwd computes it before the ReLU (same inputs and
 * scales); grad_out[i] = y[i] > thr ? grad[i] : 0, both (B,H,T,L) f32
 * (they may alias). spec op relu_mask (relu set). */
dg_status dg_ref_relu_mask(const dg_spec *spec, const void *x, const void *w,
			   float sa, float sw, const float *grad,
			   float *grad_out, int batch, int time);

/*
 * decoder_fwd (spec op decoder_fwd: heads H, latent L, embd E = D):
 *   out[b,0,t,d] = s · Σ_h Σ_l y[b,h,t,l] · w[d, h·L + l]
 * y: (B,H,T,L) in the act storage (i8x4 words along L for codes);
 * w: (E, H·L) in the weight storage, packed along H·L;
 * out: (B,1,T,E) f32 or bf16. s as lowrank_fwd.
 */
typedef struct dg_ref_decoder_args {
	const void *y;
	const void *w;
	float sa, sw;
	/* ascale=token: sa_v one a token b·T + t (over every head);
	 * wscale=channel: sw_v one an output channel d. s as lowrank_fwd's. */
	const float *sa_v, *sw_v;
	void *out;
	int batch, time;
} dg_ref_decoder_args;
dg_status dg_ref_decoder_fwd(const dg_spec *spec,
			     const dg_ref_decoder_args *args);

/* The gradients' formats are dragon/spec.h's "gradient formats": the
 * lowrank ops read grad in spec->src (f32 | bf16, widened exactly),
 * decoder_grad_input writes grad_y in spec->out (f32 | bf16: the f32
 * result rounded to nearest even once); every other gradient f32. */
/* lowrank_grad_input: grad_x[b,i,t,e] = sw · Σ_{h: hin(h)=i} Σ_l
 * grad[b,h,t,l] · w[h,l,e]; grad (B,H,T,L) src, grad_x (B,Hin,T,E) f32. */
dg_status dg_ref_lowrank_grad_input(const dg_spec *spec, const void *grad,
				    const void *w, float sw, float *grad_x,
				    int batch, int time);
/* lowrank_grad_weight: grad_w[h,l,e] = sa · Σ_{b,t} grad[b,h,t,l] ·
 * x[b,hin(h),t,e]; grad src, x in the act storage, grad_w (H,L,E) f32. */
dg_status dg_ref_lowrank_grad_weight(const dg_spec *spec, const void *grad,
				     const void *x, float sa, float *grad_w,
				     int batch, int time);
/* decoder_grad_input: grad_y[b,h,t,l] = sw · Σ_d grad[b,0,t,d] ·
 * w[d, h·L + l]; grad (B,1,T,E) f32, grad_y (B,H,T,L) out. */
dg_status dg_ref_decoder_grad_input(const dg_spec *spec, const float *grad,
				    const void *w, float sw, void *grad_y,
				    int batch, int time);
/* decoder_grad_weight: grad_w[d, h·L + l] = sa · Σ_{b,t} grad[b,0,t,d] ·
 * y[b,h,t,l]; y in the act storage, grad_w (E, H·L). */
dg_status dg_ref_decoder_grad_weight(const dg_spec *spec, const float *grad,
				     const void *y, float sa, float *grad_w,
				     int batch, int time);

/* The inverse of dg_ref_pack_ternary / dg_ref_pack_sign1: words → one
 * int8 code a byte (rows of k codes). A ternary pair 10 is refused
 * (DG_ERR_CORRUPT). */
dg_status dg_ref_unpack_ternary(const uint32_t *words, int8_t *codes,
				size_t rows, int k);
dg_status dg_ref_unpack_sign1(const uint32_t *words, int8_t *codes,
			      size_t rows, int k);

/* ---- the rest of the BDH model, in f32 ------------------------------------------
 * Shapes as DESIGN.md's model: B batch, T time, H heads, D = embd, N = latent
 * (neurons a head). Row-major, f32; sums in double. Each backward takes
 * what its forward saved and overwrites its input gradients, except where
 * "accumulate" says +=. */

/* Embedding: out[i, :] = table[idx[i], :] for n tokens of a (vocab, d)
 * table. A token outside 0..vocab-1 is DG_ERR_INVALID_ARG (*bad, may be
 * NULL, gets its position). The backward adds dout's rows into dtable in
 * token order (deterministic). */
dg_status dg_ref_embed_fwd(const float *table, int vocab, int d, const int32_t *idx, int64_t n,
			   float *out, int64_t *bad);
void dg_ref_embed_bwd(const float *dout, int d, const int32_t *idx, int64_t n, float *dtable);

/* Layer norm over the last d of each row, no affine (PyTorch's LayerNorm
 * with elementwise_affine=False): y = (x - mean) · rstd, rstd =
 * 1/sqrt(var + eps), var biased. Saves mean and rstd a row (may be NULL). */
void dg_ref_layernorm_fwd(const float *x, int64_t rows, int d, float eps, float *y,
			  float *mean, float *rstd);
/* dx (+)= rstd · (dy − mean(dy) − y · mean(dy · y)), y the forward's output. */
void dg_ref_layernorm_bwd(const float *dy, const float *y, const float *rstd, int64_t rows,
			  int d, float *dx, bool accumulate);

/* RoPE of the reference (bdh.py): freq_i = 1 / θ^(2·floor(i/2)/n) / 2π with
 * θ = 2^16; phase(t, i) = (t·freq_i mod 1)·2π in f32, as PyTorch computes
 * it; the tables hold cos and sin of pair p = i/2 at (t, p), (t_len, n/2)
 * each. rot(v)[2p] = −v[2p+1], rot(v)[2p+1] = v[2p];
 * out = v·cos + rot(v)·sin over (rows = B·H, t_len, n). */
void dg_ref_rope_table(int t_len, int n, float *cos_t, float *sin_t);
/* Row t of the tables alone (n/2 values each): the same values, any t. */
void dg_ref_rope_row(int t, int n, float *cos_t, float *sin_t);
void dg_ref_rope_fwd(const float *v, const float *cos_t, const float *sin_t, int64_t rows,
		     int t_len, int n, float *out);
/* The transpose: dv = dout·cos + rotᵀ(dout·sin). */
void dg_ref_rope_bwd(const float *dout, const float *cos_t, const float *sin_t, int64_t rows,
		     int t_len, int n, float *dv);

/* BDH attention: qr (B,H,T,N), v (B,1,T,D) shared by every head;
 * S = tril(qr·qrᵀ, −1) (no softmax, no scaling); out (B,H,T,D) = S·v. */
void dg_ref_attention_fwd(const float *qr, const float *v, int b, int h, int t, int n, int d,
			  float *out);
/* dS = tril(dout·vᵀ, −1); dqr = (dS + dSᵀ)·qr; dv = Σ_h Sᵀ·dout
 * (dqr (B,H,T,N) and dv (B,1,T,D) overwritten). */
void dg_ref_attention_bwd(const float *dout, const float *qr, const float *v, int b, int h, int t,
			  int n, int d, float *dqr, float *dv);

/* The chunked (linear-attention) form of the two above, chunks of `chunk`
 * rows (runtime/ref/attention_chunked.c): per (b, h) a state S (N × D, f32)
 * of the rows before the chunk; out_c = qr_c·S + tril(qr_c qr_cᵀ, −1)·v_c,
 * then S += qr_cᵀ v_c. Equal to the quadratic form up to f32 rounding of
 * the state; chunk 1 is the token-by-token recurrence, chunk ≥ T the
 * quadratic form. The backward recomputes the states. */
void dg_ref_attention_chunked_fwd(const float *qr, const float *v, int b, int h, int t, int n, int d,
				  int chunk, float *out);
void dg_ref_attention_chunked_bwd(const float *dout, const float *qr, const float *v, int b, int h,
				  int t, int n, int d, int chunk, float *dqr, float *dv);
/* The GPU chain's pieces (templates/attention_chunk.lua), T % chunk == 0,
 * the states (B·H·T/chunk, 2N, D) bf16 each the f32 sum split in two (hi,
 * then lo = the rounding's remainder, rows N..2N-1):
 *   _state: chunk c's state the sums of qrᵀ·v over the chunks before it
 *     (reverse: after it; v (B,1,T,D) for vh 1, (B,H,T,D) for vh h);
 *   _out:   out (B,H,T,D) += qr_c·state_c (the walk's first chunk, whose
 *     state is zero, untouched: 0, or the last for reverse states);
 *   _dq:    dqr (B,H,T,N) += cc_c·qr_c + dout_c·Sᵀ_c + v_c·Rᵀ_c, cc (B·H·T/chunk,
 *     chunk, chunk) the chunks' dS + dSᵀ (before RoPE's transpose and the
 *     ReLU's mask, which the kernel's epilogue applies). */
void dg_ref_attention_chunk_state(const float *qr, const float *v, int b, int h, int t, int n, int d,
				  int chunk, int vh, bool reverse, uint16_t *states);
void dg_ref_attention_chunk_out(const float *qr, const uint16_t *states, int b, int h, int t, int n, int d,
				int chunk, bool reverse, float *out);
void dg_ref_attention_chunk_dq(const float *cc, const float *qr, const float *dout, const float *v,
			       const uint16_t *s_states, const uint16_t *r_states, int b, int h, int t, int n,
			       int d, int chunk, float *dqr);
/* One chunk of c rows of one (b, h) against its state (N × D f32, updated
 * in place): out (c × D) = qr·S + tril(qr qrᵀ, −1)·v, then S += qrᵀ v. A
 * sampler keeps S per layer and head and feeds one token (c = 1) a step. */
void dg_ref_attention_state_chunk(float *state, const float *qr, const float *v, int c, int n, int d,
				  float *out);

/* ---- the attention ops (templates/rope.lua, templates/attention.lua) ----------
 * The tensors of the op table's rows: act tensors in f32 or bf16 storage
 * (spec->act), gradients f32; heads, latent L (= N) and embd E (= D) from
 * the spec, b and t the call's. The rope table (t, L) f32 holds (cos, sin)
 * of pair p of row t at columns 2p, 2p+1: dg_ref_rope_table's values
 * interleaved (dg_ref_rope_pairs writes it; rows of a longer table are the
 * same, so the first t rows of one table serve every shorter T). Sums in
 * double; act outputs rounded once. */
/* rope_fwd (x act → out act) or rope_bwd (grad f32 → grad_x f32) by spec->op,
 * (b, H, t, L). */
dg_status dg_ref_rope_op(const dg_spec *spec, const void *x, const float *rope, void *out, int b,
			 int t);
/* scores (b,H,t,t) = tril(qr·qrᵀ, −1), qr = RoPE(xs (b,H,t,L)) in f32. */
dg_status dg_ref_attention_scores(const dg_spec *spec, const void *xs, const float *rope,
				  void *scores, int b, int t);
/* out (b,H,t,E) = tril(scores, −1)·v, v (b,1,t,E). */
/* attention_step (dragon/ops.h): xs (B,H,T,N) act, pos (B) f32, freq (N)
 * f32, v (B,1,T,D) act; token by token (token t at pos + t): out (B,H,T,D)
 * act = qr·S (sums in double), then state (B,H,N,D) f32 += qrᵀ·v (fmaf,
 * one rounding an entry), stored in dragon/ops.h's groups of 8 columns
 * (D % 8 == 0, else DG_ERR_INVALID_ARG). */
dg_status dg_ref_attention_step(const dg_spec *spec, const void *xs, const float *pos, const float *freq,
				const void *v, float *state, void *out, int b, int t);
/* Pair p's RoPE frequency (dg_ref_rope_table's) at 2p and 2p+1, n values. */
void dg_ref_rope_freq(int n, float *freq);
/* Rows t0 .. t1-1 of dg_ref_rope_pairs's table (rows of n floats from
 * table's start), freq dg_ref_rope_freq's n values: the same bits, rows
 * apart, so threads can share a long table. */
void dg_ref_rope_pairs_rows(int t0, int t1, int n, const float *freq, float *table);
dg_status dg_ref_attention_out(const dg_spec *spec, const void *scores, const void *v, void *out,
			       int b, int t);
/* grad_scores (b,H,t,t) = dS + dSᵀ, dS = tril(grad·vᵀ, −1), grad (b,H,t,E). */
dg_status dg_ref_attention_grad_scores(const dg_spec *spec, const float *grad, const void *v,
				       void *grad_scores, int b, int t);
/* grad_v (b,1,t,E) = Σ_h tril(scores, −1)ᵀ·grad. */
dg_status dg_ref_attention_grad_v(const dg_spec *spec, const void *scores, const float *grad,
				  float *grad_v, int b, int t);
/* grad_xs (b,H,t,L) in spec->out (f32 | bf16) = RoPEᵀ(grad_scores·RoPE(xs))
 * (dqr rounded to f32 first, RoPEᵀ in f32, then one rounding to out).
 * spec->epi must be store (epi=mask's is the next). */
dg_status dg_ref_attention_grad_xs(const dg_spec *spec, const void *grad_scores, const void *xs,
				   const float *rope, void *grad_xs, int b, int t);
/* epi=mask: out (b,H,t,L) = mask_xs > 0 ? dxs + g : 0 with g the f32
 * grad_xs above (at out=f32): dg_ref_attention_grad_xs, then
 * dg_ref_add_mask(act, out, f32, ...). dxs and out in spec->out (f32 |
 * bf16), mask_xs in act; out may be dxs. */
dg_status dg_ref_attention_grad_xs_mask(const dg_spec *spec, const void *grad_scores,
					const void *xs, const float *rope, const void *dxs,
					const void *mask_xs, void *out, int b, int t);

/* The gate and its dropout: xy = xs · ys · keep / (1 − p), keep from
 * dg_dropout_keep(seed, step, layer, elem0 + i, p) for element i of the
 * (B,H,T,N) tensor (p 0: no dropout). elem0 is the tensor's first element
 * in a larger one's stream (0: its own): rows row0 .. of a global batch
 * pass row0·H·T·N and draw the global batch's masks of those rows. The
 * backward regenerates the mask: dxs = dxy · keep/(1−p) · ys,
 * dys = dxy · keep/(1−p) · xs. */
void dg_ref_gate_fwd(const float *xs, const float *ys, int64_t n, float p, uint64_t seed,
		     uint32_t step, uint32_t layer, uint64_t elem0, float *xy);
void dg_ref_gate_bwd(const float *dxy, const float *xs, const float *ys, int64_t n, float p,
		     uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, float *dxs,
		     float *dys);

/* The gate ops (dragon/ops.h gate_fwd, gate_bwd) on act storage (f32 or
 * bf16: widened exactly, results rounded once): gate_fwd is dg_ref_gate_fwd;
 * gate_bwd is dg_ref_gate_bwd with the ReLU mask of ys on dys
 * (dys = ys > 0 ? g·xs : 0), its gradients dxy, dys and dxs in `grad`
 * (the spec's out: f32 | bf16, read exactly, written rounded once). dys
 * may be NULL (not kept) or dxy itself (in place, as the kernel writes
 * it). DG_ERR_INVALID_ARG for another act or grad. */
dg_status dg_ref_gate_fwd_op(dg_fmt act, const void *xs, const void *ys, int64_t n, float p,
			     uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, void *xy);
dg_status dg_ref_gate_bwd_op(dg_fmt act, dg_fmt grad, const void *dxy, const void *xs,
			     const void *ys, int64_t n, float p, uint64_t seed, uint32_t step,
			     uint32_t layer, uint64_t elem0, void *dxs, void *dys);
/* decoder_gate_bwd (dragon/ops.h): dxy = Σ_d grad[b,0,t,d]·w[d, h·L + l]
 * in f32 (dg_ref_decoder_grad_input's sums, w spec->weight f32 | bf16),
 * then gate_bwd's arithmetic on it; xs, ys spec->act, dxs and dys
 * spec->out. */
dg_status dg_ref_decoder_gate_bwd(const dg_spec *spec, const float *grad, const void *w,
				  const void *xs, const void *ys, int batch, int time, float p,
				  uint64_t seed, uint32_t step, uint32_t layer, uint64_t elem0, void *dxs,
				  void *dys);
/* decoder_gate_bwd_ys (dragon/ops.h): ys = dg_ref_lowrank_fwd of aq
 * (B,H,T,E) spec->act and ev (H,L,E) spec->weight (in_heads = heads; the
 * spec's scales and relu; out spec->src), then dg_ref_decoder_gate_bwd on
 * it (w bf16, xs and ys spec->src, dxs and dys spec->out): the two ops'
 * arithmetic by construction. sa: one float a row (b·H + h)·T + t with
 * ascale=token, else one; sw: H·L floats with wscale=channel, else one.
 * DG_ERR_INVALID_ARG for a bad spec or argument, DG_ERR_NOMEM when ys's
 * buffer cannot be had. */
dg_status dg_ref_decoder_gate_bwd_ys(const dg_spec *spec, const float *grad, const void *w,
				     const void *xs, const void *aq, const float *sa, const void *ev,
				     const float *sw, int batch, int time, float p, uint64_t seed,
				     uint32_t step, uint32_t layer, uint64_t elem0, void *dxs, void *dys);

/* The step ops (dragon/ops.h), n elements: add_mask out = xs > 0 ? dxs +
 * other : 0 (out may be dxs; xs act, dxs and out `grad` (the spec's out),
 * other `other` (its src); each f32 | bf16, the f32 sum rounded once);
 * add3 out = (a + b) + c (out may be a); transpose in (r, e, l) f32 → out
 * (r, l, e) act (bf16 rounded to nearest even). */
dg_status dg_ref_add_mask(dg_fmt act, dg_fmt grad, dg_fmt other_fmt, const void *dxs,
			  const void *other, const void *xs, int64_t n, void *out);
void dg_ref_add3(const float *a, const float *b, const float *c, int64_t n, float *out);
dg_status dg_ref_transpose(dg_fmt act, const float *in, int64_t r, int e, int l, void *out);

/*
 * adamw (templates/optim.lua): one AdamW update of n parameters in place
 * on p, m and v from grad, the step's scalars in ctl (dragon/optim.h
 * dg_adamw_ctl): nothing when ctl->skip, else in f32, each operation
 * rounded once, in PyTorch's single-tensor order
 *   g = grad·scale; p = p·d (decay only); m = lerp(m, g, w);
 *   v = v·b2 + (w2·g)·g; p = p + (−s)·(m/(sqrt(v)/cs + eps)).
 * copy (may be NULL): p's new values rounded to bf16 (what a bf16 GEMM
 * reads), written as p is.
 */
void dg_ref_adamw(const dg_adamw_ctl *ctl, bool decay, float *p, const float *grad, float *m,
		  float *v, uint16_t *copy, size_t n);
/* The ctl of the generic calls without one (the tuner's, the bench's, the
 * registry's): step 0 of dg_adamw_defaults at lr 1e-3, scale 1. */
void dg_ref_adamw_default_ctl(dg_adamw_ctl *ctl);
/* The loss scaler's rule after one step (dragon/optim.h dg_loss_scaler;
 * templates/optim.lua dg_grad_clip applies it on the device): a norm
 * that is not finite halves S and zeroes good_steps; a finite one counts
 * a good step, and at growth_interval doubles S (kept when 2S is not
 * finite) and zeroes the count. Nothing when the scaler is off. */
void dg_ref_loss_scale_update(dg_loss_scaler *ls, bool finite);

/* lm_head and cross-entropy fused: logits = x·w over rows of d (w (d,
 * vocab)); loss = mean over rows of logsumexp(logits) − logits[target];
 * dlogits = (softmax − onehot)/rows, dx = dlogits·wᵀ, dw (+)= xᵀ·dlogits.
 * dx and dw may be NULL (no backward). A target outside 0..vocab-1 is
 * DG_ERR_INVALID_ARG (*bad its row). */
dg_status dg_ref_lmhead_ce(const float *x, const float *w, const int32_t *targets, int64_t rows,
			   int d, int vocab, double *loss, float *dx, float *dw, bool accumulate,
			   int64_t *bad);

/* A decoder's logits: out[r][v] = Σ_k x[r][k]·w[k][v] over rows of d (w
 * (d, vocab)), each sum in double with k increasing, rounded once to f32
 * (the order dg_model_logits sums in; lmhead_logits on the GPU matches it
 * bit for bit: each product of two floats is exact in double). */
void dg_ref_lmhead_logits(const float *x, const float *w, int64_t rows, int d, int vocab, float *out);

#endif /* DG_RUNTIME_REF_OPS_H */
