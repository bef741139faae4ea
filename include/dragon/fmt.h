/*
 * dragon — data formats, and the one table of what each is.
 *
 *   f32, bf16      floats, 4 and 2 bytes an element
 *   int8           signed codes ±127, one a byte (i8x4: four a 32-bit word)
 *   int4           signed codes ±7, one a byte (i8x4 words)
 *   uint8pos       unsigned codes 0..255 of a post-ReLU tensor (never wrapped
 *                  into a signed byte), one a byte (i8x4 words)
 *   ternary        codes -1, 0, +1, 2 bits a code, 16 a uint32 word
 *                  (00 = 0, 01 = +1, 11 = -1)
 *   sign1          codes ±1, 1 bit a code, 32 a uint32 word (1 = +1)
 *   i32            int32 indices (token ids), 4 bytes an element; not a
 *                  code (no scale), never a spec's weight/act/out/src
 *
 * Integer storage is packed along the reduction axis, little-endian lanes.
 * Every predicate and size of a format anywhere in dragon comes from
 * dg_fmt_info (base/fmt.c): the templates' own table (templates/formats.lua
 * M.formats) describes the same storage for the generated code, and a test
 * holds the two equal.
 */
#ifndef DRAGON_FMT_H
#define DRAGON_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(enum, text) */
#define DG_FMT_LIST(X)                                                        \
	X(DG_FMT_F32, "f32")                                                  \
	X(DG_FMT_BF16, "bf16")                                                \
	X(DG_FMT_INT8, "int8")                                                \
	X(DG_FMT_TERNARY, "ternary")                                          \
	X(DG_FMT_SIGN1, "sign1")                                              \
	X(DG_FMT_INT4, "int4")                                                \
	X(DG_FMT_UINT8POS, "uint8pos")                                        \
	X(DG_FMT_I32, "i32")

typedef enum dg_fmt {
#define DG__FMT_ENUM(e, s) e,
	DG_FMT_LIST(DG__FMT_ENUM)
#undef DG__FMT_ENUM
	DG_FMT__COUNT
} dg_fmt;

/* A mask of formats: bit 1 << dg_fmt. */
#define DG_FMT_BIT(f) (1u << (f))

typedef struct dg_fmt_info {
	const char *name;   /* "ternary" */
	bool code;          /* integer codes (carry a scale) */
	bool is_unsigned;   /* uint8pos */
	int qmax;           /* largest code magnitude: 127, 7, 255, 1; 0 for floats */
	int bits;           /* storage bits an element: 32, 16, 8, 2, 1 */
	int per_word;       /* codes a 32-bit storage word holds along the packed
			     * axis: 4 (i8x4), 16, 32; 1 for floats */
} dg_fmt_info;

/* The row of fmt; NULL for a value outside the enum. */
DG_API const dg_fmt_info *dg_fmt_info_of(dg_fmt fmt);

DG_API const char *dg_fmt_name(dg_fmt fmt); /* "?" outside the enum */
/* Name → enum; false when unknown. */
DG_API bool dg_fmt_from_name(const char *name, dg_fmt *out);

/* Predicates and sizes (false / 0 outside the enum). */
DG_API bool dg_fmt_is_code(dg_fmt fmt);
DG_API int dg_fmt_per_word(dg_fmt fmt);
/* Bytes n elements of the packed axis take (0 when n does not fill whole
 * words: ternary 16, sign1 32, other codes 4). */
DG_API size_t dg_fmt_row_bytes(dg_fmt fmt, int64_t n);

/* bf16 <-> f32: round half to even; a NaN keeps its sign and top payload
 * and gets the quiet bit (never becomes inf). The kernels' conversion. */
DG_API uint16_t dg_f32_to_bf16(float x);
DG_API float dg_bf16_to_f32(uint16_t x);

/* The mask's names, "f32|bf16|int8", into buf (cut to fit); returns buf. */
DG_API const char *dg_fmt_list(unsigned mask, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_FMT_H */
