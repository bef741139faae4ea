/*
 * dragon — the specialization key.
 *
 * A dg_spec names one kernel: the op, the BDH shape constants (heads, input
 * heads, embd, latent), the data formats, the ReLU threshold, the tile and
 * the target arch. Every field is a compile-time constant in the generated
 * kernel; batch and time are run-time arguments.
 *
 * The canonical text form is what gets hashed, logged, written to JSON and
 * shown to users: the op's relevant keys only, sorted, each `key=value;`.
 *
 *   act=int8;arch=sm_90;embd=256;heads=4;in_heads=1;latent=8192;
 *   op=lowrank_fwd;out=int8;relu=0;tile=auto;weight=ternary;
 *
 * (one line; wrapped here). Floats are written in the shortest decimal form
 * that reads back to the same float, so the text round-trips exactly.
 *
 * Which fields an op reads, the formats each takes and the packing rules
 * of its axes are the op table's (dg_op_info_of, codegen/optable.c); data
 * formats are dragon/fmt.h's. Whether a tile can run is the rule of the
 * template that renders the op: dg_codegen_plan (dragon/codegen.h) asks it,
 * and resolves an auto tile to its default there.
 */
#ifndef DRAGON_SPEC_H
#define DRAGON_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "fmt.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(enum, name): the name is a bare token (stringified for the text form;
 * the ops layer names each op's entries after it). */
#define DG_OP_LIST(X)                                                         \
	X(DG_OP_LOWRANK_FWD, lowrank_fwd)                                   \
	X(DG_OP_QUANTIZE_ACT, quantize_act)                                 \
	X(DG_OP_PACK_I8X4, pack_i8x4)                                       \
	X(DG_OP_UNPACK_I8X4, unpack_i8x4)                                   \
	X(DG_OP_QUANTIZE_WEIGHT, quantize_weight)                           \
	X(DG_OP_PACK_TERNARY, pack_ternary)                                 \
	X(DG_OP_PACK_SIGN1, pack_sign1)                                     \
	X(DG_OP_RELU_MASK, relu_mask)                                       \
	X(DG_OP_DECODER_FWD, decoder_fwd)                                   \
	X(DG_OP_LOWRANK_GRAD_INPUT, lowrank_grad_input)                     \
	X(DG_OP_LOWRANK_GRAD_WEIGHT, lowrank_grad_weight)                   \
	X(DG_OP_DECODER_GRAD_INPUT, decoder_grad_input)                     \
	X(DG_OP_DECODER_GRAD_WEIGHT, decoder_grad_weight)                   \
	X(DG_OP_ROPE_FWD, rope_fwd)                                         \
	X(DG_OP_ROPE_BWD, rope_bwd)                                         \
	X(DG_OP_ATTENTION_SCORES, attention_scores)                         \
	X(DG_OP_ATTENTION_OUT, attention_out)                               \
	X(DG_OP_ATTENTION_GRAD_SCORES, attention_grad_scores)               \
	X(DG_OP_ATTENTION_GRAD_V, attention_grad_v)                         \
	X(DG_OP_ATTENTION_GRAD_XS, attention_grad_xs) \
	X(DG_OP_ATTENTION_STEP, attention_step)                             \
	X(DG_OP_ATTENTION_CHUNK_STATE, attention_chunk_state)               \
	X(DG_OP_ATTENTION_CHUNK_OUT, attention_chunk_out)                   \
	X(DG_OP_ATTENTION_CHUNK_DQ, attention_chunk_dq)                     \
	X(DG_OP_ATTENTION_CHUNK_VREP, attention_chunk_vrep)                 \
	X(DG_OP_ATTENTION_CHUNK_CAST, attention_chunk_cast)                 \
	X(DG_OP_ATTENTION_CHUNK_HSUM, attention_chunk_hsum)                 \
	X(DG_OP_EMBED_FWD, embed_fwd)                                       \
	X(DG_OP_EMBED_BWD, embed_bwd)                                       \
	X(DG_OP_LAYERNORM_FWD, layernorm_fwd)                               \
	X(DG_OP_LAYERNORM_BWD, layernorm_bwd)                               \
	X(DG_OP_RESID_LN_FWD, resid_ln_fwd)                                 \
	X(DG_OP_RESID_LN_BWD, resid_ln_bwd)                                 \
	X(DG_OP_LMHEAD_CE, lmhead_ce)                                       \
	X(DG_OP_LMHEAD_LOGITS, lmhead_logits)                               \
	X(DG_OP_GATE_FWD, gate_fwd)                                         \
	X(DG_OP_GATE_BWD, gate_bwd)                                         \
	X(DG_OP_GATE_QUANT, gate_quant)                                     \
	X(DG_OP_ADD_MASK, add_mask)                                         \
	X(DG_OP_ADD3, add3)                                                 \
	X(DG_OP_TRANSPOSE, transpose)                                       \
	X(DG_OP_DEQUANTIZE, dequantize)                                     \
	X(DG_OP_DECODER_GATE_BWD, decoder_gate_bwd)                         \
	X(DG_OP_DECODER_GATE_BWD_YS, decoder_gate_bwd_ys)                   \
	X(DG_OP_ADAMW_UPDATE, adamw_update)

typedef enum dg_op {
#define DG__OP_ENUM(e, s) e,
	DG_OP_LIST(DG__OP_ENUM)
#undef DG__OP_ENUM
	DG_OP__COUNT
} dg_op;

/* The spec fields a user can set; each op uses a subset (dg_spec_uses). */
typedef enum dg_field {
	DG_FIELD_ACT = 1 << 0,
	DG_FIELD_ARCH = 1 << 1,
	DG_FIELD_EMBD = 1 << 2,
	DG_FIELD_HEADS = 1 << 3,
	DG_FIELD_IN_HEADS = 1 << 4,
	DG_FIELD_LATENT = 1 << 5,
	DG_FIELD_OUT = 1 << 6,
	DG_FIELD_RELU = 1 << 7,
	DG_FIELD_SRC = 1 << 8,
	DG_FIELD_TILE = 1 << 9,
	DG_FIELD_WEIGHT = 1 << 10,
	DG_FIELD_ASCALE = 1 << 11,
	DG_FIELD_WSCALE = 1 << 12,
	DG_FIELD_VOCAB = 1 << 13,
	DG_FIELD_ROPE = 1 << 14,
	DG_FIELD_EPI = 1 << 15,
	DG_FIELD_CHUNK = 1 << 16,
} dg_field;

/*
 * attention_grad_xs's epilogue (text key epi=), a compile-time constant of
 * the kernel like the formats:
 *   store  (the default, left out of the canonical text, so the specs,
 *          cache keys and tuning records of before keep theirs) writes
 *          grad_xs in the spec's out;
 *   mask   writes no grad_xs: it adds it into the gradient dxs in place and
 *          applies the ReLU's mask, dxs = (dxs + grad_xs) · [mask_xs > 0]
 *          (add_mask fused, dxs in out, mask_xs in act), so the f32 grad_xs
 *          never goes through memory.
 */
typedef enum dg_epi {
	DG_EPI_STORE,
	DG_EPI_MASK,
	/* lowrank_fwd: out, and RoPE(out) into qr (B,H,T,N) bf16 by the rope
	 * table (T,N) f32, as rope_fwd would make it from out: the attention's
	 * rope=pre operand without a pass of its own (the sm_90a warpgroup
	 * path, out=bf16) */
	DG_EPI_ROPE,
} dg_epi;

/* "store", "mask", "rope"; "?" outside the enum. */
DG_API const char *dg_epi_name(dg_epi e);

/*
 * The granularity of an integer operand's scale (docs/formats.md, "Data
 * formats"), a compile-time constant of the kernel like the formats:
 *   tensor   one float (the seed's recipe);
 *   token    activations: one float a row of the GEMM that reads the codes
 *            (lowrank x (B,Hin,T,D): B·Hin·T of them, row (b·Hin + hin)·T + t;
 *            decoder y (B,H,T,N): B·T, row b·T + t, over every head);
 *   channel  weights: one float an output channel (lowrank w (H,N,D): H·N,
 *            channel h·N + n; decoder w (D,H·N): D).
 * The scales are applied in the epilogue as a row and a column multiply,
 * or (the gradients, where they run along the reduction) to the f32
 * operand as it is loaded. Text keys ascale= (tensor|token) and wscale=
 * (tensor|channel); the canonical text names them only when not tensor,
 * so a per-tensor spec keeps the text (and cache key) it always had, or
 * always where the op's default is not tensor (decoder_gate_bwd_ys), so
 * the text reads back to the same spec.
 */
typedef enum dg_scale_gran {
	DG_SCALE_TENSOR,
	DG_SCALE_TOKEN,
	DG_SCALE_CHANNEL,
} dg_scale_gran;

/* "tensor", "token", "channel"; "?" outside the enum. */
DG_API const char *dg_scale_name(dg_scale_gran g);

/*
 * Tile. All zero means "auto" (tuning DB, else the heuristic default).
 * GEMM-like ops (lowrank_fwd) use bm, bn, bk (block tile, K step in
 * elements), wm x wn warps per block and `stages` shared-memory buffers;
 * text form `BMxBNxBK/WMxWN/S`, e.g. `64x64x32/2x2/2`.
 * Element-wise ops use `threads` per block; text form `t256`. An op
 * whose kernel can stage its rows in shared memory (gate_quant) also
 * takes `stages` with it, text form `t256/1`: the template says what it
 * makes of them and refuses them where it makes nothing.
 */
typedef struct dg_tile {
	int bm, bn, bk;
	int wm, wn;
	int stages;
	int threads;
} dg_tile;

typedef struct dg_spec {
	dg_op op;
	int heads;    /* H: output heads */
	int in_heads; /* Hin: 1 (input shared by all heads) or H */
	int embd;     /* D: model width; reduction length of lowrank_fwd */
	int latent;   /* N: latent width per head (the model's neurons a head) */
	dg_fmt weight;
	dg_fmt act;
	dg_fmt out; /* what a forward op writes; a backward op's gradients (below) */
	dg_fmt src; /* a float input's format (quantize_act, the norms); a
		     * backward op's gradients (below) */
	dg_scale_gran ascale; /* the act's scale: tensor | token */
	dg_scale_gran wscale; /* the weight's scale: tensor | channel */
	bool relu;       /* false: no ReLU */
	float relu_thr;  /* out = relu(y - relu_thr); finite; -0 kept as +0 */
	dg_tile tile;
	int arch;           /* SM version times ten plus minor: 90 for sm_90 */
	bool arch_specific; /* sm_90a: arch-specific features (wgmma) */
	int vocab;          /* V: token ids 0..V-1 (embed, lmhead_ce); 2..65536 */
	/* attention_scores, attention_grad_xs: where RoPE is applied to xs.
	 * false (text rope=load, the default): on the GEMM's load, from the
	 * rope table; true (rope=pre): xs is RoPE(xs) already (the chain's
	 * rope_fwd made it) and the GEMM reads it raw, as the sm_90a
	 * warpgroup path needs (grad_xs's epilogue still applies RoPE^T). */
	bool rope_pre;
	dg_epi epi; /* attention_grad_xs: its epilogue (above) */
	/* C: the chunked attention's chunk (text key chunk=; the
	 * attention_chunk_* ops): the rows of T a state covers, a multiple
	 * of 64 from 64 to 4096, 256 by default. The chunk's rows are the
	 * intra-chunk scores' columns (DG_DIM_C). */
	int chunk;
} dg_spec;

/*
 * Gradient formats. A backward op whose gradients may be bf16 reads two
 * fields for them (the op table's rows say which):
 *   src  the format of a gradient the op only reads;
 *   out  the format of every gradient the op writes, an in-place one
 *        included (it is read in that format first).
 * Both take f32 | bf16 and default to f32. The ops and their gradients:
 *   decoder_grad_input   out: grad_y            (grad (B,1,T,D) stays f32)
 *   gate_bwd             out: dxy, dys over it, dxs
 *   decoder_gate_bwd     out: dxs, dys          (grad stays f32; its own
 *                        op, out defaults to bf16)
 *   decoder_gate_bwd_ys  out: dxs, dys; src: xs and the ys it makes
 *                        (its own op, both bf16 by default)
 *   add_mask             out: dxs (read, then overwritten); src: other
 *   lowrank_grad_input   src: grad              (grad_x stays f32)
 *   lowrank_grad_weight  src: grad              (grad_w stays f32)
 * A bf16 gradient is the f32 result rounded to nearest even once, where
 * the op writes it; one read is widened exactly. The canonical text names
 * these fields only when they are not f32 (dg_op_info.quiet), so a spec
 * of an f32 gradient keeps the text, cache key and tuning records it had
 * before the fields existed: op=gate_bwd;act=bf16 is the f32-gradient
 * kernel, op=gate_bwd;act=bf16;out=bf16 the bf16 one.
 */

/* ---- the op table --------------------------------------------------------
 * One row an op (codegen/optable.c; its name is DG_OP_LIST's): every part of dragon that needs to
 * know an op — validation, defaults, the parser, `dragon-gen list` and
 * help, the default build set, tuning, the bench — reads it here. */

typedef enum dg_tile_kind {
	DG_TILE_GEMM,    /* a block tile BMxBNxBK/WMxWN/S */
	DG_TILE_THREADS, /* a thread count t<N> */
} dg_tile_kind;

/* The dimensions of an op's tensors, in the spec's sizes and the call's. */
typedef enum dg_dim {
	DG_DIM_B = 1, /* batch: the call's (the first tensor that has it) */
	DG_DIM_T,     /* time: the call's */
	DG_DIM_R,     /* rows: the call's (pack ops) */
	DG_DIM_H,     /* the spec's heads */
	DG_DIM_HIN,   /* the spec's in_heads */
	DG_DIM_D,     /* the spec's embd */
	DG_DIM_N,     /* the spec's latent */
	DG_DIM_HN,    /* heads · latent */
	DG_DIM_ONE,   /* 1 */
	DG_DIM_V,     /* the spec's vocab */
	DG_DIM_C,     /* the spec's chunk */
	DG_DIM_S,     /* a (b, h)'s chunk states: 2·N·(T/C) rows, the hi and
		       * lo rows of each chunk's N x D state (the spec's latent
		       * and chunk, the call's T) */
} dg_dim;

/* Where an argument's format comes from. */
typedef enum dg_arg_fmt {
	DG_ARG_ACT,    /* the spec's act */
	DG_ARG_WEIGHT, /* the spec's weight */
	DG_ARG_OUT,    /* the spec's out */
	DG_ARG_SRC,    /* the spec's src */
	DG_ARG_F32,
	DG_ARG_INT8,   /* one code a byte */
	DG_ARG_PACK,   /* the op's pack_fmt */
	DG_ARG_I32,    /* int32 token ids (DG_FMT_I32) */
	DG_ARG_BF16,   /* bf16 whatever the spec says (decoder_gate_bwd_ys's w) */
} dg_arg_fmt;

#define DG_OP_MAX_ARGS 10

/* One tensor argument of an op, in call order. ndim 0: any shape, the
 * first such argument's (the quantizers). */
typedef struct dg_op_arg {
	const char *name; /* "x", "w", "out": as messages name it */
	bool output;
	dg_arg_fmt fmt;
	bool scale;       /* an integer format carries its scale */
	int ndim;
	dg_dim dims[4];
	bool optional;    /* may be NULL when the call's flags do not use it
			   * (lmhead_ce's dx and dw without backward); the
			   * op's own check says when it must be there */
	unsigned epi;     /* the epilogues (1u << dg_epi) whose calls take it
			   * (attention_grad_xs: grad_xs with epi=store, dxs
			   * and mask_xs with epi=mask); 0: every call. A call
			   * leaves the others NULL (dg_op_arg_used). */
} dg_op_arg;

/* How the tuner and the bench shape an op without B·T (a rows count R
 * and, for the any-shape quantizers, a width): at `rows` rows of a case,
 * R = clamp(rows · r_mul / r_div, 1, r_max (0: no cap)), and the
 * quantizers take (R, cols). */
typedef struct dg_op_case {
	int r_mul, r_div, r_max;
	int cols;
} dg_op_case;

/* How a result is judged against the CPU reference (tests, tuner). */
typedef enum dg_op_check {
	DG_CHECK_EXACT,        /* integer paths bit for bit, floats within atol + rtol */
	DG_CHECK_MASK,         /* relu_mask: floats may flip within rounding of thr */
	DG_CHECK_NORM,         /* bf16 tensor-core gradients: norm and element bounds */
	DG_CHECK_SCALED_CODES, /* quantizers: the scale, then the codes for it */
} dg_op_check;

/* Fields of an op's defaults that differ from the common ones. */
typedef struct dg_op_defaults {
	unsigned fields; /* the dg_field mask of the values below that apply */
	dg_fmt weight, act, out, src;
	dg_scale_gran ascale, wscale;
	bool relu;
	float relu_thr;
	bool arch_specific; /* with DG_FIELD_ARCH: sm_90a (an op of sm_90a alone) */
} dg_op_defaults;

typedef struct dg_op_info {
	const char *family;  /* lowrank | decoder | quantize | pack | norm |
			      * embed | loss | gate | step | optim: the name of
			      * its ops file, references and tests */
	const char *module;  /* templates/<module>.lua plans and renders it */
	const char *about;   /* one line: what it computes, with shapes */
	unsigned fields;     /* the dg_field mask it reads */
	dg_tile_kind tile;
	/* Formats each format field takes (DG_FMT_BIT masks; 0: not read). */
	unsigned weight_fmts, act_fmts, out_fmts, src_fmts;
	/* Packing: the spec's weight format is packed along this length
	 * (DG_FIELD_EMBD or DG_FIELD_LATENT; 0: not packed), which must then
	 * be a multiple of its codes a word. pack_fmt: a format the op packs
	 * along embd whatever the spec says (pack_ternary), or DG_FMT__COUNT. */
	unsigned weight_axis;
	dg_fmt pack_fmt;
	bool latent_any;     /* latent need not be a multiple of 4 */
	bool needs_relu;     /* relu=none is refused */
	dg_op_defaults defaults;
	/* Format fields the canonical text leaves out while they hold the
	 * op's default (the gradient formats above, at f32): fields an op
	 * gained after its specs were published. The parser still takes them. */
	unsigned quiet;
	int n_args;
	dg_op_arg args[DG_OP_MAX_ARGS];
	dg_op_case tune;
	dg_op_check check;
	/* The default build set: for each field a comma list, the product is
	 * built ("weight=int8,ternary;relu=0"); "" is the op's defaults. */
	const char *build;
	/* A bit an argument (1u << i) read and then overwritten in place: an
	 * input that the op also writes (gate_bwd's dxy becomes dys), or an
	 * output it reads first (add_mask's dxs). Callers that run an op
	 * twice (the tuner's check, the tests) restore these arguments
	 * between runs; the reference reads their input from dg_ref_call.in. */
	unsigned inout;
} dg_op_info;

/* The row of op; NULL for a value outside the enum. */
DG_API const dg_op_info *dg_op_info_of(dg_op op);
/* The format an argument of s's op has under s (f: the argument's
 * dg_op_arg.fmt): s's act, weight, out or src, int8 codes, the op's
 * pack_fmt, int32 token ids, bf16, or f32. */
DG_API dg_fmt dg_op_arg_fmt(const dg_spec *s, dg_arg_fmt f);

/* The extent of dimension d under s: B, T and R the call's (b, t, r),
 * the others the spec's (H, Hin, D, N, H·N, V; 1 for DG_DIM_ONE). */
DG_API int64_t dg_op_dim_extent(const dg_spec *s, dg_dim d, int64_t b, int64_t t, int64_t r);

/* Whether argument i of s's op is one of a call under s (its epi; see
 * dg_op_arg.epi): the checks refuse the others given, the kernels never
 * see them, and the tuner and the tests make only these. */
DG_API bool dg_op_arg_used(const dg_spec *s, int i);

/* Longest canonical text, terminator included. */
#define DG_SPEC_TEXT_MAX 512

DG_API const char *dg_op_name(dg_op op); /* "?" outside the enum */
/* Name → enum; false when unknown. */
DG_API bool dg_op_from_name(const char *name, dg_op *out);

/* Fields that `op` reads (a mask of dg_field). */
DG_API unsigned dg_spec_uses(dg_op op);

/* The defaults of `op`: BDH's shape (H=4, D=256, N=8192, V=256), int8 weights
 * and activations, int8 out, no ReLU, per-tensor scales, auto tile, sm_90,
 * then the op's own (dg_op_info.defaults: decoder_fwd writes bf16,
 * relu_mask has relu=0, decoder_gate_bwd_ys a scale a token and a channel).
 * Always a valid spec. */
DG_API void dg_spec_init(dg_spec *spec, dg_op op);

/* Resets the fields `spec->op` does not read to their defaults, so two specs
 * that name the same kernel compare (and print) equal. */
DG_API void dg_spec_normalize(dg_spec *spec);

/*
 * Checks every field the op reads against the op table: ranges, formats,
 * the packing of each axis, the combination (out=uint8pos needs relu), and
 * the kind of the tile (a block tile or a thread count). On failure
 * returns DG_ERR_INVALID_SPEC and writes one line into msg (if non-NULL)
 * naming the field, the bad value and what is allowed, e.g.
 * "latent=8190: must be a multiple of 4 (codes are packed four to a word)".
 * Fields the op does not read are ignored. Whether the tile's values can
 * run is the template's to say: dg_codegen_plan.
 */
DG_API dg_status dg_spec_validate(const dg_spec *spec, char *msg, size_t msg_size);

/* Canonical text into buf (DG_SPEC_TEXT_MAX is always enough). Returns
 * DG_ERR_INVALID_ARG if buf is too small. Does not validate. */
DG_API dg_status dg_spec_to_string(const dg_spec *spec, char *buf, size_t size);

/*
 * Parses the text form: `key=value;` pairs in any order, the trailing `;`
 * optional, spaces around tokens ignored, `op` required; missing keys keep
 * the op's defaults. Unknown keys, keys the op does not read, duplicates
 * and bad values are refused with a message naming them. The result is
 * validated. On failure *out is untouched.
 */
DG_API dg_status dg_spec_parse(const char *text, dg_spec *out, char *msg,
			       size_t msg_size);

/* Parses one value of the key named `key` ("weight", "relu", "tile",
 * "heads", ...) into spec; the same rules as dg_spec_parse. Used by the CLI
 * flags. */
DG_API dg_status dg_spec_set(dg_spec *spec, const char *key, const char *value,
			     char *msg, size_t msg_size);

/* Text of one tile / threshold / arch, as the canonical form writes it. */
DG_API void dg_tile_to_string(const dg_tile *tile, char *buf, size_t size);
DG_API bool dg_tile_is_auto(const dg_tile *tile);

/* Equality of the canonical forms. */
DG_API bool dg_spec_equal(const dg_spec *a, const dg_spec *b);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_SPEC_H */
