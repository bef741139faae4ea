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
 * Data formats and layouts (the kernel ABI; CPU references mirror it):
 *   weight  f32 | bf16 | int8 (scale 2·mean|w|/127, codes ±127)
 *           | ternary (scale mean|w|, code 0 where |w| < scale, else sign;
 *             stored 2 bits a value: 00 = 0, 01 = +1, 11 = -1)
 *           | sign1 (scale mean|w|, code ±1; stored 1 bit a value, 1 = +1)
 *   act     f32 | bf16 | int8 (scale 2·mean|x|/127, per tensor, codes ±127)
 *           | int4 (qmax 7, one code a byte) | uint8pos (qmax 255, unsigned)
 *   out     f32 | bf16 | int8 | uint8pos (codes with a caller-owned scale)
 * Integer storage is packed along the reduction axis, little-endian lanes:
 * i8x4 (four codes an int32), ternary 16 codes a word, sign1 32 a word.
 */
#ifndef DRAGON_SPEC_H
#define DRAGON_SPEC_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(enum, text) */
#define DG_OP_LIST(X)                                                         \
	X(DG_OP_LOWRANK_FWD, "lowrank_fwd")                                   \
	X(DG_OP_QUANTIZE_ACT, "quantize_act")                                 \
	X(DG_OP_PACK_I8X4, "pack_i8x4")                                       \
	X(DG_OP_UNPACK_I8X4, "unpack_i8x4")                                   \
	X(DG_OP_QUANTIZE_WEIGHT, "quantize_weight")                           \
	X(DG_OP_PACK_TERNARY, "pack_ternary")                                 \
	X(DG_OP_PACK_SIGN1, "pack_sign1")                                     \
	X(DG_OP_RELU_MASK, "relu_mask")                                       \
	X(DG_OP_DECODER_FWD, "decoder_fwd")                                   \
	X(DG_OP_LOWRANK_GRAD_INPUT, "lowrank_grad_input")                     \
	X(DG_OP_LOWRANK_GRAD_WEIGHT, "lowrank_grad_weight")                   \
	X(DG_OP_DECODER_GRAD_INPUT, "decoder_grad_input")                     \
	X(DG_OP_DECODER_GRAD_WEIGHT, "decoder_grad_weight")

typedef enum dg_op {
#define DG__OP_ENUM(e, s) e,
	DG_OP_LIST(DG__OP_ENUM)
#undef DG__OP_ENUM
	DG_OP__COUNT
} dg_op;

#define DG_FMT_LIST(X)                                                        \
	X(DG_FMT_F32, "f32")                                                  \
	X(DG_FMT_BF16, "bf16")                                                \
	X(DG_FMT_INT8, "int8")                                                \
	X(DG_FMT_TERNARY, "ternary")                                          \
	X(DG_FMT_SIGN1, "sign1")                                              \
	X(DG_FMT_INT4, "int4")                                                \
	X(DG_FMT_UINT8POS, "uint8pos")

typedef enum dg_fmt {
#define DG__FMT_ENUM(e, s) e,
	DG_FMT_LIST(DG__FMT_ENUM)
#undef DG__FMT_ENUM
	DG_FMT__COUNT
} dg_fmt;

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
} dg_field;

/*
 * Tile. All zero means "auto" (tuning DB, else the heuristic default).
 * GEMM-like ops (lowrank_fwd) use bm, bn, bk (block tile, K step in
 * elements), wm x wn warps per block and `stages` shared-memory buffers;
 * text form `BMxBNxBK/WMxWN/S`, e.g. `64x64x32/2x2/2`.
 * Element-wise ops use `threads` per block; text form `t256`.
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
	int embd;     /* E: model width; reduction length of lowrank_fwd */
	int latent;   /* L: latent width per head */
	dg_fmt weight;
	dg_fmt act;
	dg_fmt out;
	dg_fmt src; /* quantize_act: the float format it reads (f32 | bf16) */
	bool relu;       /* false: no ReLU */
	float relu_thr;  /* out = relu(y - relu_thr); finite; -0 kept as +0 */
	dg_tile tile;
	int arch;           /* SM version times ten plus minor: 90 for sm_90 */
	bool arch_specific; /* sm_90a: arch-specific features (wgmma) */
} dg_spec;

/* Longest canonical text, terminator included. */
#define DG_SPEC_TEXT_MAX 512

const char *dg_op_name(dg_op op);
const char *dg_fmt_name(dg_fmt fmt);
/* Name → enum; false when unknown. */
bool dg_op_from_name(const char *name, dg_op *out);
bool dg_fmt_from_name(const char *name, dg_fmt *out);

/* Fields that `op` reads (a mask of dg_field). */
unsigned dg_spec_uses(dg_op op);

/* The built-in default of every field, for `op` (BDH: H=4, E=256, L=8192,
 * int8 weights and activations, int8 out, no ReLU, auto tile, sm_90). */
void dg_spec_init(dg_spec *spec, dg_op op);

/* Resets the fields `spec->op` does not read to their defaults, so two specs
 * that name the same kernel compare (and print) equal. */
void dg_spec_normalize(dg_spec *spec);

/*
 * Checks every field and the combination. On failure returns
 * DG_ERR_INVALID_SPEC and writes one line into msg (if non-NULL) naming the
 * field, the bad value and what is allowed, e.g.
 * "latent=8190: must be a multiple of 4 (codes are packed four to a word)".
 * Fields the op does not read are ignored.
 */
dg_status dg_spec_validate(const dg_spec *spec, char *msg, size_t msg_size);

/* Fills an auto tile with the heuristic default for the spec (tile set by
 * the caller is kept). The spec must be valid. */
void dg_spec_default_tile(const dg_spec *spec, dg_tile *tile);

/*
 * What the runtime runs for a spec on a device of SM `device_sm` when no
 * tuning record names a tile: on a device of exactly the spec's arch, an
 * op with an arch-specific path (wgmma on sm_90a) and an auto tile is
 * moved to that target; then an auto tile gets dg_spec_default_tile's
 * default for the (possibly moved) arch. Explicit tiles and archs other
 * than the device's are kept. The spec must be valid.
 */
void dg_spec_default_resolve(dg_spec *spec, int device_sm);

/* Canonical text into buf (DG_SPEC_TEXT_MAX is always enough). Returns
 * DG_ERR_INVALID_ARG if buf is too small. Does not validate. */
dg_status dg_spec_to_string(const dg_spec *spec, char *buf, size_t size);

/*
 * Parses the text form: `key=value;` pairs in any order, the trailing `;`
 * optional, spaces around tokens ignored, `op` required; missing keys keep
 * the op's defaults. Unknown keys, keys the op does not read, duplicates
 * and bad values are refused with a message naming them. The result is
 * validated. On failure *out is untouched.
 */
dg_status dg_spec_parse(const char *text, dg_spec *out, char *msg,
			size_t msg_size);

/* Parses one value of the key named `key` ("weight", "relu", "tile",
 * "heads", ...) into spec; the same rules as dg_spec_parse. Used by the CLI
 * flags. */
dg_status dg_spec_set(dg_spec *spec, const char *key, const char *value,
		      char *msg, size_t msg_size);

/* Text of one tile / threshold / arch, as the canonical form writes it. */
void dg_tile_to_string(const dg_tile *tile, char *buf, size_t size);
bool dg_tile_is_auto(const dg_tile *tile);

/* Equality of the canonical forms. */
bool dg_spec_equal(const dg_spec *a, const dg_spec *b);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_SPEC_H */
