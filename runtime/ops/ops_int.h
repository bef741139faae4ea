/*
 * Op internals shared by the files of runtime/ops/: the generic call every
 * typed op is turned into, the one check of its tensors against the op
 * table's signature, the launch helpers, and the per-op dispatch the tuner
 * and the bench use (registry.c). The layers above (autotune/, the
 * training step) reach ops through dg__op_run and dg__op_workspace, the
 * FFI's device-free checks through dg__op_check_call.
 */
#ifndef DG_RUNTIME_OPS_INT_H
#define DG_RUNTIME_OPS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/ops.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/checks.h"

/* One call of an op: its tensors in the op table's order
 * (dg_op_info_of(op)->args), and the few non-tensor arguments. */
typedef struct dg__op_call {
	const dg_tensor *t[DG_OP_MAX_ARGS];
	dg_workspace ws;
	dg_dptr absum;   /* lowrank_fwd: Σ|y| accumulator, or 0 */
	int splits;      /* lowrank_grad_input: K splits, 0 the runtime's choice */
	bool accumulate; /* the grad_weight ops; embed_bwd, layernorm_bwd,
			  * resid_ln_bwd (dx), lmhead_ce (dw) */
	bool unpack;     /* pack_ternary / pack_sign1: packed → codes */
	bool backward;   /* lmhead_ce: dx and dw too */
	float eps;       /* layernorm_fwd, resid_ln_fwd: inside the sqrt */
	dg_dptr bad;     /* embed_fwd, lmhead_ce: an int32 set to 1 on a token
			  * outside 0..V-1, or 0 */
	dg_dptr grad_scale; /* lmhead_ce: 0, or a device float dlogits are
			     * multiplied by */
	/* gate_fwd / gate_bwd / decoder_gate_bwd: the dropout of dragon/rng.h
	 * (p 0: none) */
	float p;
	uint64_t seed;
	uint32_t step, layer;
	dg_dptr step_at; /* 0, or a device uint32 added to step */
	uint64_t elem0;  /* added to each element's index before its draw (0:
			  * the tensor's own masks; dg_gate_fwd_args) */
	/* adamw_update: the step's control block (0: the default scalars),
	 * the bf16 copy of p (0: none), the weight decay */
	dg_dptr ctl, copy;
	bool decay;
} dg__op_call;

/* The sizes a checked call has: B and T of its first tensor with them, R
 * of the pack ops, n the elements of the quantizers' input. */
typedef struct dg__op_shape {
	int64_t b, t, r, n;
} dg__op_shape;

/*
 * Checks spec (op op, valid) and c's tensors against the op table: every
 * argument's format, shape (B, T and R bound by the first tensor that has
 * them) and scale, the row limits of the kernels. fn names the call in
 * messages. *shape (may be NULL) gets the sizes.
 */
dg_status dg__op_check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
		       dg__op_shape *shape, char *msg, size_t msg_size);

/* The check of a typed call with the message put on dev. */
dg_status dg__op_check_dev(dg_device *dev, const dg_spec *spec, dg_op op, const char *fn,
			   const dg__op_call *c, dg__op_shape *shape);

/* Refuses a workspace smaller than need (its message names the call). */
dg_status dg__op_workspace_ok(dg_device *dev, const char *fn, const dg_workspace *ws,
			      size_t need);

/* Blocks for a grid-stride walk over `work` items of per_block each: at
 * least 1, at most cap. */
unsigned dg__op_grid(long long work, long long per_block, long long cap);

long long dg__op_cdiv(long long a, long long b);

/* A call of up to four tensors in the op table's order (the rest zero). */
dg__op_call dg__op_call_of(const dg_tensor *t0, const dg_tensor *t1, const dg_tensor *t2,
			   const dg_tensor *t3);

/* The workspace entry of an op that takes none. */
dg_status dg__op_no_workspace(size_t *bytes);

/* The workspace query of an op that needs none: 0 bytes. */
#define DG__OP_NO_WORKSPACE(name)                                                            \
	dg_status dg__workspace_##name(dg_device *dev, const dg_spec *spec, const dg__op_call *c, \
				       size_t *bytes)                                        \
	{                                                                                    \
		(void)dev, (void)spec, (void)c;                                              \
		return dg__op_no_workspace(bytes);                                           \
	}

/*
 * The typed calls of an op whose args struct is its tensors alone: the
 * _check twin and the call, the tensors T0..T3 (expressions of `a`, NULL
 * for unused) in the op table's order; RUN(dev, spec, op, call) runs it.
 */
#define DG__OP_TYPED(name, OP, RUN, T0, T1, T2, T3)                                          \
	dg_status dg_##name##_check(const dg_spec *spec, const dg_##name##_args *a, char *msg, \
				    size_t msg_size)                                          \
	{                                                                                     \
		dg__op_call c = a ? dg__op_call_of(T0, T1, T2, T3)                            \
				  : dg__op_call_of(NULL, NULL, NULL, NULL);                   \
		return dg__op_check(spec, OP, "dg_" #name, a ? &c : NULL, NULL, msg, msg_size); \
	}                                                                                     \
	dg_status dg_##name(dg_device *dev, const dg_spec *spec, const dg_##name##_args *a)     \
	{                                                                                     \
		dg__op_call c = a ? dg__op_call_of(T0, T1, T2, T3)                            \
				  : dg__op_call_of(NULL, NULL, NULL, NULL);                   \
		return RUN(dev, spec, OP, a ? &c : NULL);                                     \
	}

/* ---- per-op entries (registry.c) -------------------------------------------- */

/* Runs op spec->op with c (checked first). */
dg_status dg__op_run(dg_device *dev, const dg_spec *spec, const dg__op_call *c);
/* The workspace c needs on dev (0 for ops that take none). */
dg_status dg__op_workspace(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
			   size_t *bytes);
/*
 * The whole check of c as op spec->op, without a device: dg__op_check's,
 * then the rules the op's family file adds (the ones its typed _check and
 * its run apply: an alias, an option's range, a pointer's alignment), so
 * what the run still refuses past it is the workspace and the limits of
 * the kernel the device loads (grids, a rows entry's row length). The
 * message goes into msg (NULL or msg_size 0: none). The door of
 * dg_ffi_op_check: the generic check alone passes calls the run refuses.
 */
dg_status dg__op_check_call(const dg_spec *spec, const dg__op_call *c, char *msg,
			    size_t msg_size);

/* The generic entries of each op of DG_OP_LIST, defined in its family's
 * file as dg__run_<name> and dg__workspace_<name>. */
#define DG__OP_ENTRY(e, name)                                                 \
	dg_status dg__run_##name(dg_device *dev, const dg_spec *spec,          \
				 const dg__op_call *c);                        \
	dg_status dg__workspace_##name(dg_device *dev, const dg_spec *spec,    \
				       const dg__op_call *c, size_t *bytes);
DG_OP_LIST(DG__OP_ENTRY)
#undef DG__OP_ENTRY

/*
 * The ops whose family file has rules of its own beyond the op table's
 * (dg__op_check_call's table): each defines dg__check_<name>, the static
 * check its typed _check and its run share, under the generic call (msg
 * NULL or msg_size 0: no message). An op not listed is checked by
 * dg__op_check alone; one listed without its entry fails to link, and an
 * entry defined but not listed has no prototype (-Wmissing-prototypes).
 */
#define DG__OP_OWN_CHECKS(X)                                                  \
	X(DG_OP_QUANTIZE_ACT, quantize_act)                                   \
	X(DG_OP_LOWRANK_GRAD_INPUT, lowrank_grad_input)                       \
	X(DG_OP_ATTENTION_GRAD_XS, attention_grad_xs)                         \
	X(DG_OP_EMBED_FWD, embed_fwd)                                         \
	X(DG_OP_EMBED_BWD, embed_bwd)                                         \
	X(DG_OP_LAYERNORM_FWD, layernorm_fwd)                                 \
	X(DG_OP_RESID_LN_FWD, resid_ln_fwd)                                   \
	X(DG_OP_LMHEAD_CE, lmhead_ce)                                         \
	X(DG_OP_GATE_FWD, gate_fwd)                                           \
	X(DG_OP_GATE_BWD, gate_bwd)                                           \
	X(DG_OP_DEQUANTIZE, dequantize)                                       \
	X(DG_OP_DECODER_GATE_BWD, decoder_gate_bwd)                           \
	X(DG_OP_ADAMW_UPDATE, adamw_update)

#define DG__OP_CHECK_ENTRY(e, name)                                           \
	dg_status dg__check_##name(const dg_spec *spec, const dg__op_call *c,  \
				   char *msg, size_t msg_size);
DG__OP_OWN_CHECKS(DG__OP_CHECK_ENTRY)
#undef DG__OP_CHECK_ENTRY

/* n rounded up to 256 bytes: where a workspace's parts start. */
static inline size_t dg__op_align256(size_t n)
{
	return (n + 255) / 256 * 256;
}

/* ---- the quantizers (quantize.c) -------------------------------------------- */

/* The entry of templates/qrows.lua that a scale a row (quantize_act
 * ascale=token, quantize_weight wscale=channel) runs for rows of `values`
 * values (G·C): "<prefix>_rows_warp" for short rows, "<prefix>_rows" for
 * long ones. A static string. */
const char *dg__quantize_rows_entry(const dg_spec *spec, long long values);

/* ---- the gradient GEMMs (grad.c), shared by the lowrank and decoder ---- */

/* The most K splits lowrank_grad_input takes (dg_lowrank_grad_input_args). */
#define DG__GRAD_INPUT_MAX_SPLITS 64

/* The K split of a grad_input GEMM of `blocks` output tiles (every grid
 * z's) and `steps` K steps on a GPU that runs `slots` blocks at once:
 * want 1..DG__GRAD_INPUT_MAX_SPLITS forces the count, 0 picks it (grad.c
 * has the model). Returns the count; *per gets the K steps of a split
 * (split p sums [p·per, (p+1)·per) clipped to steps). */
int dg__grad_input_splits(int64_t blocks, int64_t steps, int64_t slots, int want, int *per);

/* grad_input: out (rows B·T, n_cols) per grid z of kernel `entry`, a
 * reduction of k_len (a multiple of the tile's BK). reduce names the
 * second pass of a kernel that takes a K split (lowrank_grad_input: its
 * partials in ws, `want` splits or 0 for the runtime's choice); NULL for
 * one that takes none (decoder_grad_input, whose K = E is a few steps). */
dg_status dg__grad_input_workspace(dg_device *dev, const dg_spec *spec, const char *entry,
				   const char *reduce, int64_t bt, int64_t n_cols, unsigned gz,
				   int64_t k_len, int want, size_t *bytes);
dg_status dg__grad_input_launch(dg_device *dev, const dg_spec *spec, const char *entry,
				const char *reduce, const dg_tensor *grad, const dg_tensor *w,
				const dg_tensor *out, int64_t n_cols, unsigned gz, int64_t k_len,
				int want, const dg_workspace *ws);
/* grad_weight: grad_w (H, rows, cols) reduced over B·T, split when the
 * tiles are few; ws holds the splits' partials. */
dg_status dg__grad_weight_workspace(dg_device *dev, const dg_spec *spec, const char *entry,
				    int64_t bt, int64_t rows, int64_t cols, size_t *bytes);
dg_status dg__grad_weight_launch(dg_device *dev, const dg_spec *spec, const char *entry,
				 const char *reduce, const dg_tensor *grad, const dg_tensor *x,
				 const dg_tensor *grad_w, bool accumulate, const dg_workspace *ws,
				 int64_t rows, int64_t cols);

#endif
