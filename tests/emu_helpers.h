/*
 * Generated kernels run on the CPU (tests/emu/cuda_emu.hpp): a spec's
 * rendered source, its `extern __shared__` array made a pointer into the
 * launch's dynamic shared memory and its other `__shared__` arrays static,
 * compiled by the system's C++ compiler with a glue of the test's (the
 * entry it calls, which launches the kernel by dg_emu_launch) into a
 * shared object, loaded. A test of a kernel's logic where no GPU is: its
 * indexing, barriers and arithmetic against the C references, bit for
 * bit. Names start with eh_ (emulation helpers).
 */
#ifndef DG_TESTS_EMU_HELPERS_H
#define DG_TESTS_EMU_HELPERS_H

#include "dragon/codegen.h"
#include "dragon/spec.h"

/* spec rendered by cg, with glue (C++ after the kernel: the kernel's
 * typedefs and constants are in scope) compiled and loaded; the address
 * of the glue's extern "C" symbol `entry`. Fails the test with the
 * compiler's output. The object stays loaded until the process ends. */
void *eh_build(dg_codegen *cg, const dg_spec *spec, const char *glue, const char *entry);

#endif
