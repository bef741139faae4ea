/*
 * A tensor map as the CPU emulation reads it (tests/emu/cuda_emu.hpp, whose
 * TMA copies take it where the kernel takes a CUtensorMap, and the tests
 * that make one: tests/emu_helpers.h eh_tmap3): the driver's map is
 * opaque, so the emulated one is the test's own. C and C++.
 */
#ifndef DG_TESTS_EMU_TMAP_H
#define DG_TESTS_EMU_TMAP_H

typedef struct eh_tmap {
	unsigned long long base;
	unsigned long long dims[5];    /* ranks below 5: the rest 1 */
	unsigned long long strides[4]; /* bytes, dims 1 to 4, in any order */
	unsigned box[5];
	unsigned es;      /* element bytes */
	unsigned swizzle; /* 128, 64 or 0 (none) */
} eh_tmap;

#endif
