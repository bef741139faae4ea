/*
 * Generated kernels run on the CPU (tests/emu/cuda_emu.hpp): a spec's
 * rendered source, its `extern __shared__` array made a pointer into the
 * launch's dynamic shared memory, its other `__shared__` arrays static and
 * each inline PTX statement a call of the emulation (one it does not know
 * stops the launch that reaches it, naming it), compiled by the system's C++ compiler with a
 * glue of the test's (the entry it calls, which launches the kernel by
 * dg_emu_launch / dg_emu_launch3) into a shared object, loaded. A test of a
 * kernel's logic where no GPU is: its indexing, barriers, layouts and
 * arithmetic against the C references. Names start with eh_ (emulation
 * helpers).
 */
#ifndef DG_TESTS_EMU_HELPERS_H
#define DG_TESTS_EMU_HELPERS_H

#include "dragon/codegen.h"
#include "dragon/spec.h"

#include <stdint.h>
#include <string.h>

#include "emu/tmap.h"

/* A rank-3 map of elements of es bytes over base, dims (d0, d1, d2) with
 * d0 contiguous, boxes of b0 x b1 x 1, the 128-byte swizzle (as
 * runtime/gpu/tmap.c makes them). */
static inline eh_tmap eh_tmap3(const void *base, int es, uint64_t d0, uint64_t d1, uint64_t d2, unsigned b0,
			       unsigned b1)
{
	eh_tmap m;
	memset(&m, 0, sizeof(m));
	m.base = (unsigned long long)(uintptr_t)base;
	m.dims[0] = d0, m.dims[1] = d1, m.dims[2] = d2, m.dims[3] = 1, m.dims[4] = 1;
	m.strides[0] = d0 * (uint64_t)es, m.strides[1] = d0 * d1 * (uint64_t)es;
	m.box[0] = b0, m.box[1] = b1, m.box[2] = 1, m.box[3] = 1, m.box[4] = 1;
	m.es = (unsigned)es;
	m.swizzle = 128;
	return m;
}

/* spec rendered by cg, with glue (C++ after the kernel: the kernel's
 * typedefs and constants are in scope) compiled and loaded; the address
 * of the glue's extern "C" symbol `entry`. Fails the test with the
 * compiler's output. The object stays loaded until the process ends. */
void *eh_build(dg_codegen *cg, const dg_spec *spec, const char *glue, const char *entry);

#endif
