/*
 * dragon — CPU references: what each op's kernel computes, in plain C.
 *
 * dg_ref_run computes any op of the op table (dragon/spec.h) on the host,
 * on the same layouts as its kernel, from the same tensors the op takes
 * (dragon/ops.h), so a program can hold a GPU result to it: integer paths
 * bit for bit, float paths within a tolerance (the comparisons below).
 * The tuner checks every candidate kernel this way before it times it.
 *
 * Rounding: every float → code conversion is round-half-to-even (rintf in
 * the default rounding mode, __float2int_rn on the GPU), then clamped.
 * bf16 is stored as uint16_t and converted with round-half-to-even.
 */
#ifndef DRAGON_REF_H
#define DRAGON_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "optim.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rope table of the attention ops (dragon/ops.h rope_fwd, rope_bwd,
 * attention_scores, attention_grad_xs): (t_len, n) f32, the (cos, sin) of
 * pair p of row t at columns 2p, 2p+1, for the RoPE of the reference
 * (bdh.py): freq_i = 1 / θ^(2·floor(i/2)/n) / 2π with θ = 2^16, phase(t,
 * i) = (t·freq_i mod 1)·2π in f32, as PyTorch computes it. Rows of a
 * longer table are the same, so the first t rows of one table serve
 * every shorter T. */
DG_API void dg_ref_rope_pairs(int t_len, int n, float *table);

/* The AdamW control block's host fields of step t at learning rate lr
 * (dragon/optim.h dg_adamw_ctl; each computed in double and rounded once,
 * as dg_adamw_step always has), the scaler off; scale 1, skip 0,
 * loss_scale 1, good_steps, sq and norm 0 until a norm is taken. The
 * update's reference, its default control block and the trainers make it
 * with this one rule. */
DG_API void dg_adamw_ctl_fill(const dg_adamw_config *c, int64_t t, float lr, dg_adamw_ctl *out);

/* ---- any op by the op table's arguments ---------------------------------
 * The reference of spec->op with its tensors in the op table's order
 * (dg_op_info_of(op)->args): the tuner, the tests and a caller checking
 * a kernel reach every op's reference through this one entry. */
typedef struct dg_ref_call {
	const void *in[DG_OP_MAX_ARGS]; /* each input's host storage (outputs: NULL,
					 * but an in-place one's input, dg_op_info.inout;
					 * arguments the spec does not use, dg_op_arg_used:
					 * NULL) */
	float scale[DG_OP_MAX_ARGS];    /* each code argument's scale (an output's
					 * when the op writes codes with it) */
	const float *scale_v[DG_OP_MAX_ARGS]; /* a scale a row or a channel, in place
					 * of scale[i], where the spec's ascale=token
					 * or wscale=channel says so */
	void *out;                      /* the output's host storage (of the last
					 * output the spec uses: epi=mask's dxs) */
	float *out_scale;               /* the quantizers: gets the scale (one a row
					 * with ascale=token / wscale=channel) */
	int64_t groups, cols;           /* quantize_act per token: x (b, groups, t,
					 * cols); quantize_weight per channel: rows of
					 * cols */
	int64_t b, t, r, n;             /* the call's B, T (B·T ops), R (pack
					 * and row ops), n (the quantizers' elements) */
	bool unpack;                    /* pack_ternary / pack_sign1 */
	/* Ops with several outputs (layernorm_fwd's y and rstd, ...): output
	 * i's host storage by argument index; NULL: `out` for the last
	 * output, scratch for the others. An accumulating output's storage
	 * holds its old value. */
	void *outs[DG_OP_MAX_ARGS];
	float eps;                      /* layernorm_fwd, resid_ln_fwd */
	bool accumulate;                /* embed_bwd, *_bwd dx, lmhead_ce dw */
	bool backward;                  /* lmhead_ce: also dx and dw (implied
					 * when storage for either is given) */
	/* the gate family (gate_*, decoder_gate_bwd*): the dropout (p 0: none);
	 * elem0 the first element's index in the mask's stream (0: the
	 * tensor's own) */
	float p;
	uint64_t seed;
	uint32_t step, layer;
	uint64_t elem0;
	void *out2;                     /* gate_bwd: gets dys, dxy's new value
					 * (NULL: not kept); out gets dxs */
} dg_ref_call;

DG_API dg_status dg_ref_run(const dg_spec *spec, const dg_ref_call *call);

/* ---- comparing a result with its reference ---------------------------------
 * The one tolerance check of the tests, the tuner and the bench. Each
 * returns true when got is within bounds of want, else false with one line
 * in why (may be NULL) naming how many differ and the worst or first one. */

/* Bit for bit (integer paths). */
DG_API bool dg_ref_same_bytes(const void *got, const void *want, size_t n, char *why,
			      size_t why_size);

/* n values of format fmt (f32, bf16, or one-a-byte codes), each within
 * atol + rtol·|want| (NaN matches NaN). */
DG_API bool dg_ref_close(dg_fmt fmt, const void *got, const void *want, size_t n, float atol,
			 float rtol, char *why, size_t why_size);

/* The whole result by its norm, ‖got − want‖ ≤ rel·‖want‖, and every
 * element: |got − want| ≤ elem·max|want| (rounded tensor-core sums: a sum
 * that cancels can be off by a percent of itself, an indexing error by
 * the whole norm). */
DG_API bool dg_ref_close_norm(const float *got, const float *want, size_t n, double rel,
			      float elem, char *why, size_t why_size);

/* Every element within its own bound: |got[i] − want[i]| ≤ bound[i] (a
 * rounding model's per-element bound, e.g. 2·2^-8·Σ|a·b|). */
DG_API bool dg_ref_within(const float *got, const float *want, const float *bound, size_t n,
			  char *why, size_t why_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_REF_H */
