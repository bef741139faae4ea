/*
 * Spec internals shared by codegen/spec.c (names, validation) and
 * codegen/spec_text.c (canonical text, parser): the formats each key
 * accepts, and how they are named in messages. Only those two files look
 * here.
 */
#ifndef DG_CODEGEN_SPEC_INT_H
#define DG_CODEGEN_SPEC_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/spec.h"

/* Formats a key accepts, as masks of 1 << dg_fmt. quantize_act's act takes
 * only the integer codes (dg__spec_quant_fmts); other ops' act takes
 * dg__spec_act_fmts. */
extern const unsigned dg__spec_weight_fmts;
extern const unsigned dg__spec_act_fmts;
extern const unsigned dg__spec_quant_fmts;
extern const unsigned dg__spec_out_fmts;
extern const unsigned dg__spec_src_fmts;
extern const unsigned dg__spec_wquant_fmts; /* quantize_weight's weight */

/* Is f a format in mask? False for an out-of-range f. */
bool dg__spec_fmt_in(dg_fmt f, unsigned mask);

/* The mask's names, "f32|bf16|int8", into buf (cut to fit); returns buf. */
const char *dg__spec_fmt_list(unsigned mask, char *buf, size_t size);

#endif
