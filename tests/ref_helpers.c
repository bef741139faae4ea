/*
 * Helpers shared by the CPU reference suites; see tests/ref_helpers.h.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ref_helpers.h"

uint32_t rh_fbits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static uint64_t rh_rng_state;

void rh_rng_seed(uint64_t s)
{
	rh_rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

uint32_t rh_rng_u32(void)
{
	/* xorshift64* */
	rh_rng_state ^= rh_rng_state >> 12;
	rh_rng_state ^= rh_rng_state << 25;
	rh_rng_state ^= rh_rng_state >> 27;
	return (uint32_t)((rh_rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

int rh_rng_int(int lo, int hi)
{
	return lo + (int)(rh_rng_u32() % (uint32_t)(hi - lo + 1));
}

void *rh_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	cr_assert_not_null(p, "out of memory");
	return p;
}
