/*
 * Spec internals shared by codegen/spec.c (validation) and
 * codegen/spec_text.c (the parser, which names an op's formats in its
 * messages). Only those two files look here.
 */
#ifndef DG_CODEGEN_SPEC_INT_H
#define DG_CODEGEN_SPEC_INT_H

#include "dragon/spec.h"

/* The formats the op of `row` takes in a format field (DG_FIELD_WEIGHT,
 * _ACT, _OUT, _SRC) as a DG_FMT_BIT mask; 0 for any other field. */
unsigned dg__spec_fmts(const dg_op_info *row, dg_field field);

#endif
