/*
 * Helpers shared by the CPU reference suites; see tests/ref_helpers.h.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/rng.h"
#include "ref_helpers.h"

uint32_t rh_fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/* The suite's stream: dragon's one generator (dragon/rng.h). */
static dg_rng rh_rng;

void rh_rng_seed(uint64_t s)
{
	dg_rng_seed(&rh_rng, s);
}

uint32_t rh_rng_u32(void)
{
	return (uint32_t)(dg_rng_u64(&rh_rng) >> 32);
}

int rh_rng_int(int lo, int hi)
{
	return dg_rng_int(&rh_rng, lo, hi);
}

void *rh_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	cr_assert_not_null(p, "out of memory");
	return p;
}

double rh_rand_value(dg_fmt f)
{
	switch (f) {
	case DG_FMT_INT8:
		return rh_rng_int(-127, 127);
	case DG_FMT_INT4:
		return rh_rng_int(-7, 7);
	case DG_FMT_UINT8POS:
		return rh_rng_int(0, 255);
	case DG_FMT_TERNARY:
		return rh_rng_int(-1, 1);
	case DG_FMT_SIGN1:
		return rh_rng_int(0, 1) ? 1 : -1;
	default:
		return rh_rng_int(-64, 64) / 8.0;
	}
}
