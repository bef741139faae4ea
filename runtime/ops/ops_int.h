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
	/* the gate family (gate_*, decoder_gate_bwd*): the dropout of dragon/rng.h
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

/* Refuses a workspace smaller than need (its message names the call). */
dg_status dg__op_workspace_ok(dg_device *dev, const char *fn, const dg_workspace *ws,
			      size_t need);

/* Blocks for a grid-stride walk over `work` items of per_block each: at
 * least 1, at most cap. */
unsigned dg__op_grid(long long work, long long per_block, long long cap);

long long dg__op_cdiv(long long a, long long b);


/* ---- prepared ops (prepared.c) ---------------------------------------------- */

/* What a prepared op (dg_prepared) keeps: up to DG__PREP_LAUNCHES kernel
 * launches, each with its geometry resolved and its argument layout, a
 * list of where each parameter comes from, so a launch only reads the
 * call's pointers and scalars into place. */
#define DG__PREP_LAUNCHES 8
#define DG__PREP_ARGS 20 /* the most a kernel takes: decoder_gate_bwd_ys's 17 */
#define DG__PREP_BLOB 128

typedef enum dg__arg_kind {
	DG__ARG_DATA,  /* the call's tensor i: data + imm bytes (0 when not given) */
	DG__ARG_SCALE, /* the call's tensor i: its scale pointer (0 when not given) */
	DG__ARG_WS,    /* the call's workspace pointer + imm bytes */
	DG__ARG_I32,   /* imm as an int */
	DG__ARG_I64,   /* imm as a long long */
	DG__ARG_F32,   /* f */
	DG__ARG_FIELD, /* `size` bytes of the call at offset off (a scalar option) */
	DG__ARG_FLAG,  /* the call's bool at offset off, as an int 0 or 1 */
	DG__ARG_BLOB,  /* `size` bytes of the prepared op's blob at off (a struct) */
	DG__ARG_TMAP,  /* TMA map imm (0 .. DG__PREP_TMAPS - 1) of the op's tmaps function */
} dg__arg_kind;

typedef struct dg__arg {
	uint8_t kind; /* dg__arg_kind */
	uint8_t i;    /* DATA, SCALE: the tensor's index in the call */
	uint16_t off; /* FIELD, FLAG: the call's field; BLOB: the blob's bytes */
	uint16_t size;
	int64_t imm;
	float f;
} dg__arg;

typedef struct dg__prep_launch {
	const dg_kernel *k;
	dg_launch l; /* resolved (dg__kernel_geometry) */
	int n_args;
	dg__arg args[DG__PREP_ARGS];
} dg__prep_launch;

/* One tensor argument as the op was prepared: given or not, its format,
 * shape and whether its scale is read. A launch's tensors must match. */
typedef struct dg__prep_sig {
	bool given, scale;
	dg_fmt fmt;
	int ndim;
	int64_t shape[DG_TENSOR_MAX_DIMS];
} dg__prep_sig;

/* The TMA maps of a launch, made from the call's pointers (the
 * warp-specialized paths): maps[i] for DG__ARG_TMAP i. */
#define DG__PREP_TMAPS 6
typedef dg_status (*dg__tmaps_fn)(const dg_prepared *p, const dg__op_call *c,
				  dg__tmap maps[DG__PREP_TMAPS]);

/* The rules of an op on the call's pointers (no aliasing of an output it
 * writes in place, ...), checked at every launch: msg gets why. */
typedef dg_status (*dg__ptrs_fn)(const dg_prepared *p, const dg__op_call *c, char *msg,
				 size_t msg_size);

struct dg_prepared {
	dg_device *dev;
	dg_spec spec;       /* as asked, checked */
	const char *fn;     /* "dg_<op>", in messages */
	dg__op_shape shape; /* the call's sizes */
	int n_sig;          /* the op table's arguments */
	dg__prep_sig sig[DG_OP_MAX_ARGS];
	uint64_t opts;      /* the call's options and which optional pointers
			     * it gives (opts_of in prepared.c) */
	size_t ws_bytes;    /* the workspace a launch needs */
	int n_launch;       /* 0: nothing to compute (an empty batch) */
	dg__prep_launch launch[DG__PREP_LAUNCHES];
	dg__tmaps_fn tmaps;
	dg__ptrs_fn ptrs;
	int64_t iv[5];      /* what tmaps reads (sizes) */
	uint16_t blob_used;
	bool overflow;      /* a launch or argument past the arrays: refused */
	dg__arg sink;       /* where the arguments past the end are written
			     * (this op's own: ops are prepared on several
			     * threads at once) */
	bool heap;          /* made by dg_prepare (dg_prepared_destroy frees it) */
	_Alignas(16) unsigned char blob[DG__PREP_BLOB];
};

/*
 * Prepares op spec->op for calls shaped like c (its tensors' formats and
 * shapes, which it gives, its options; pointers need only pass the checks)
 * into *p: the whole check, the kernels fetched (JIT or cache), the
 * geometry resolved, the workspace sized, the argument layout written.
 * Nothing is launched. The message is on dev.
 */
dg_status dg__prepare(dg_device *dev, const dg_spec *spec, const dg__op_call *c,
		      dg_prepared *p);

/* Launches a prepared op with c: c's tensors are checked against the
 * prepared ones (format, shape, pointers), its workspace against
 * ws_bytes, nothing else. */
dg_status dg__prepared_launch(const dg_prepared *p, const dg__op_call *c);

/* ---- the typed arguments structs (args_layout.c) ----------------------------- */

/* The options of dg__op_call an op's arguments struct may carry, by the
 * call's field name. */
#define DG__CALL_OPTIONS(X)                                                   \
	X(ws) X(absum) X(splits) X(accumulate) X(unpack) X(backward) X(eps)   \
	X(bad) X(grad_scale) X(p) X(seed) X(step) X(layer) X(step_at)         \
	X(elem0) X(ctl) X(copy) X(decay)

/*
 * Where the arguments struct of an op's typed call (dg_<name>_args, or
 * the one its call shares: dg_pack_weight_args, dg_pack_i8x4_args) keeps
 * what dg__op_call takes: its size, each tensor's field in the op table's
 * order (dg_op_info_of(op)->args; the field has the argument's name), and
 * each option the struct has. Offsets are stored plus one, so 0 is a
 * field the struct lacks.
 */
typedef struct dg__args_layout {
	uint16_t size;
	struct {
		uint16_t at;
		const char *name;
	} t[DG_OP_MAX_ARGS];
#define DG__OPTION_AT(f) uint16_t f;
	DG__CALL_OPTIONS(DG__OPTION_AT)
#undef DG__OPTION_AT
} dg__args_layout;

/* op's row of the table (NULL past the ops). */
const dg__args_layout *dg__op_args_layout(dg_op op);

/* The call of op's typed arguments struct, read through its row: its
 * tensors and options, the rest zero (all zero for args NULL). */
dg__op_call dg__op_call_from_args(dg_op op, const void *args);

/* The options c is prepared with (flags, splits, which optional pointers
 * it gives), and p's record of c's tensors and options. */
uint64_t dg__prep_opts(const dg__op_call *c);
void dg__prep_sign(dg_prepared *p, const dg__op_call *c);

/*
 * An op caller that holds its ops prepared (the model's nodes): a run of
 * ops through dg__exec either prepares each into the next of its slots
 * (preparing; nothing launched) or launches the slot's prepared op, with
 * only the tensors compared, in the same order. With no slots (plans
 * NULL) each op is prepared on the stack and launched: the eager path.
 */
typedef struct dg__op_exec {
	dg_device *dev;
	dg_prepared *plans; /* cap slots, or NULL */
	int n, cap;         /* slots prepared, slots there are */
	int next;           /* the slot of the next op (dg__exec_begin zeroes it) */
	bool preparing;
	/* NULL, or (preparing) each op's spec handed to sink instead of
	 * prepared: nothing compiled, loaded or launched, no device needed
	 * (what a shape's step would prepare, listed; workspaces 0) */
	dg_status (*sink)(void *user, const dg_spec *spec);
	void *sink_user;
} dg__op_exec;

/* An eager caller of dev's ops. */
dg__op_exec dg__exec_eager(dg_device *dev);
/* Starts a run of x's ops: preparing (the slots emptied) or launching. */
void dg__exec_begin(dg__op_exec *x, bool preparing);
/* Op spec->op with call c through x. Typed args: dg__exec_args. */
dg_status dg__exec(dg__op_exec *x, const dg_spec *spec, const dg__op_call *c);
dg_status dg__exec_args(dg__op_exec *x, const dg_spec *spec, const void *args);
/* The workspace bytes of x's last prepared op (0 when x launches). */
size_t dg__exec_last_ws(const dg__op_exec *x);
void dg__exec_free(dg__op_exec *x);

/* The attention chains (dg_attention_fwd, dg_attention_bwd) through x:
 * preparing, x's slots get their ops (rope, the GEMMs; the workspace not
 * yet checked: a caller sizing it gives any aligned pointer). */
dg_status dg__attention_fwd_exec(dg__op_exec *x, const dg_spec *spec,
				 const dg_attention_fwd_args *a);
dg_status dg__attention_bwd_exec(dg__op_exec *x, const dg_spec *spec,
				 const dg_attention_bwd_args *a);

/* Adds a launch of k to p (block {0,0,0} and smem 0: the template's) with
 * its geometry resolved; NULL (and the message on p->dev, *st set) when
 * the geometry breaks a limit or the launches are full. */
dg__prep_launch *dg__prep_add(dg_prepared *p, const dg_kernel *k, const dg_launch *l,
			      dg_status *st);

/* The parameters of a launch, in the kernel's order. */
void dg__arg_data(dg_prepared *p, dg__prep_launch *L, int i);
void dg__arg_data_at(dg_prepared *p, dg__prep_launch *L, int i, int64_t byte_off);
void dg__arg_scale(dg_prepared *p, dg__prep_launch *L, int i);
void dg__arg_ws(dg_prepared *p, dg__prep_launch *L, int64_t byte_off);
void dg__arg_i32(dg_prepared *p, dg__prep_launch *L, int64_t v);
void dg__arg_i64(dg_prepared *p, dg__prep_launch *L, int64_t v);
void dg__arg_f32(dg_prepared *p, dg__prep_launch *L, float v);
void dg__arg_field(dg_prepared *p, dg__prep_launch *L, size_t off, size_t size);
void dg__arg_flag(dg_prepared *p, dg__prep_launch *L, size_t off);
void dg__arg_blob(dg_prepared *p, dg__prep_launch *L, const void *bytes, size_t size);
void dg__arg_tmap(dg_prepared *p, dg__prep_launch *L, int which);
/* Whether k is of a warp-specialized path (templates/wgmma_bf16.lua
 * WS_HEAD: attention_tma.lua's, grad_wgmma.lua's and decoder.lua's): its
 * plan asks for a producer warpgroup beside the tile's warps (threads
 * wm·wn·32 + 128), and its kernel takes two TMA maps (DG__ARG_TMAP). */
bool dg__tma_abi(const dg_kernel *k);
/* Such a kernel's maps read boxes of 64 rows (b, t) or K steps of 64 t,
 * which lie within one b only at T % 64 == 0: at another T (the prepared
 * shape's) an auto tile's kernel *k becomes the cp.async ring's, the same
 * tile with ring_stages stages (`entry` of it), and a tile asked for is
 * refused, naming T. Nothing changes for another kernel. */
dg_status dg__tma_rows_tile(dg_prepared *p, const char *entry, int ring_stages, dg_kernel **k);
/* The same for a kernel the caller knows to be of such a path (ws), whose
 * block dg__tma_abi does not describe (lowrank_fwd's ping-pong tiles). */
dg_status dg__ws_rows_tile(dg_prepared *p, const char *entry, int ring_stages, bool ws, dg_kernel **k);
/* Kernel `entry` of k's own spec with `tile` instead of k's (a ring that
 * stands in for a warp-specialized tile a call's T cannot serve): k's
 * spec, not the call's, so an auto tile planned arch-specific keeps it. */
dg_status dg__kernel_retiled(dg_prepared *p, const dg_kernel *k, dg_tile tile, const char *entry, dg_kernel **out);

/* A scalar field of dg__op_call as a parameter: DG__ARG_OF(p, L, eps). */
#define DG__ARG_OF(p, L, field) \
	dg__arg_field((p), (L), offsetof(dg__op_call, field), sizeof(((dg__op_call *)0)->field))
/* A bool field of dg__op_call as an int parameter. */
#define DG__FLAG_OF(p, L, field) dg__arg_flag((p), (L), offsetof(dg__op_call, field))

/* ---- per-op entries (registry.c) -------------------------------------------- */

/* The op table's entries by number (registry.c): "dg_<op>", the family's
 * own check of op spec->op (DG_OK where the family adds none), and its
 * launch layout (dg__prep_<name>). */
const char *dg__op_fn_name(dg_op op);
dg_status dg__op_own_check(const dg_spec *spec, const dg__op_call *c, char *msg, size_t msg_size);
dg_status dg__op_prep(dg_prepared *p, const dg__op_call *c);

/* Runs op spec->op with c (checked first). */
dg_status dg__op_run(dg_device *dev, const dg_spec *spec, const dg__op_call *c);
/* A typed op's call (dg_<op>, dg_<op>_workspace; typed.c), args its
 * arguments struct (dg__op_call_from_args; NULL refused): spec must be
 * op's (the table's message says why not), then dg__op_run /
 * dg__op_workspace, which prepare the op and launch it (or read its
 * workspace). */
dg_status dg__op_typed_run(dg_device *dev, dg_op op, const dg_spec *spec, const void *args);
dg_status dg__op_typed_workspace(dg_device *dev, dg_op op, const dg_spec *spec,
				 const void *args, size_t *bytes);
/* A typed op's device-free check (dg_<op>_check, checks.h): the family's
 * dg__check_<name> for the ops of DG__OP_OWN_CHECKS, else the table's
 * (dg__op_check, its messages naming dg_<op>). */
dg_status dg__op_typed_check(dg_op op, const dg_spec *spec, const void *args, char *msg,
			     size_t msg_size);
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

/* The entry of each op of DG_OP_LIST, defined in its family's file:
 * dg__prep_<name> lays out the launches of a checked call (dg__prepare
 * has done the checks and filled p's spec, shape and signature; it fetches
 * the kernels, sets the workspace size and lists each kernel parameter's
 * source). Its typed arguments struct becomes its call through the
 * table (dg__op_call_from_args). */
#define DG__OP_ENTRY(e, name)                                                 \
	dg_status dg__prep_##name(dg_prepared *p, const dg__op_call *c);
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
	X(DG_OP_ATTENTION_CHUNK_STATE, attention_chunk_state)                 \
	X(DG_OP_ATTENTION_CHUNK_OUT, attention_chunk_out)                     \
	X(DG_OP_ATTENTION_CHUNK_DQ, attention_chunk_dq)                       \
	X(DG_OP_EMBED_FWD, embed_fwd)                                         \
	X(DG_OP_EMBED_BWD, embed_bwd)                                         \
	X(DG_OP_LAYERNORM_FWD, layernorm_fwd)                                 \
	X(DG_OP_RESID_LN_FWD, resid_ln_fwd)                                   \
	X(DG_OP_LMHEAD_CE, lmhead_ce)                                         \
	X(DG_OP_GATE_FWD, gate_fwd)                                           \
	X(DG_OP_GATE_BWD, gate_bwd)                                           \
	X(DG_OP_GATE_QUANT, gate_quant)                                       \
	X(DG_OP_DEQUANTIZE, dequantize)                                       \
	X(DG_OP_DECODER_GATE_BWD, decoder_gate_bwd)                           \
	X(DG_OP_DECODER_GATE_BWD_YS, decoder_gate_bwd_ys)                     \
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
/* The f32 gradient's bf16 copy (B·T·E values, grad.c): its workspace bytes
 * (256-aligned), and the launch of cast kernel kc (a module's _cast entry:
 * grad, the copy, n8) writing it at workspace offset ws_off. decoder_grad_
 * weight's sm_90a kernels and decoder_gate_bwd's persistent form read it. */
size_t dg__grad_copy_bytes(const dg_prepared *p);
dg_status dg__prep_grad_cast(dg_prepared *p, dg_kernel *kc, int64_t ws_off);

/* grad_input: out (rows B·T, n_cols) per grid z of kernel `entry`, a
 * reduction of k_len (a multiple of the tile's BK). reduce names the
 * second pass of a kernel that takes a K split (lowrank_grad_input: its
 * partials in ws, `want` splits or 0 for the runtime's choice); NULL for
 * one that takes none (decoder_grad_input, whose K = E is a few steps).
 * c: the call prepared with (the warp-specialized form's tensor maps). */
dg_status dg__grad_input_prep(dg_prepared *p, const dg__op_call *c, const char *entry,
			      const char *reduce, int64_t n_cols, unsigned gz, int64_t k_len, int want);
/* grad_weight: grad_w (H, rows, cols) reduced over B·T, split when the
 * tiles are few; ws holds the splits' partials. The call's tensors: grad,
 * x (its scale the codes'), grad_w; accumulate adds into grad_w. */
dg_status dg__grad_weight_prep(dg_prepared *p, const dg__op_call *c, const char *entry,
			       const char *reduce, int64_t rows, int64_t cols);

#endif
