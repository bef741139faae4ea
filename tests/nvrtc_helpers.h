/*
 * Helpers shared by the suites that render and compile kernels without a
 * GPU (tests/test_nvrtc_*.c): a code generator, one spec rendered and
 * compiled with NVRTC, and a spec refused naming its field. Each fails the
 * test with the generator's or the compiler's message. Names start with
 * nh_ (nvrtc helpers).
 */
#ifndef DG_TESTS_NVRTC_HELPERS_H
#define DG_TESTS_NVRTC_HELPERS_H

#include "dragon/codegen.h"
#include "dragon/spec.h"

/* A code generator on the source tree's templates (dg_codegen_destroy it). */
dg_codegen *nh_codegen(void);

/* Renders spec: one entry, dg_<op>; the generated-code banner ("do not
 * edit"), naming `path` (NULL: any); then compiles it for sm_<sm>
 * (sm_<sm>a where the spec is arch-specific) to an ELF cubin. */
void nh_compile(dg_codegen *cg, const dg_spec *spec, const char *path, int sm);

/* spec is refused (dg_spec_validate, else dg_codegen_plan) with
 * DG_ERR_INVALID_SPEC and a message holding `field`. */
void nh_expect_refused(dg_codegen *cg, const dg_spec *spec, const char *field);

/* A _check's refusal: DG_ERR_INVALID_ARG, a message that starts with
 * "<name>: " and holds `also` (NULL: anything). */
void nh_expect_named(dg_status st, const char *msg, const char *name, const char *also);

#endif
