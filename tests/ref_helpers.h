/*
 * Helpers shared by the CPU reference suites (tests/test_ref.c,
 * tests/test_ref_lowrank.c, ...): float bits, a fixed-seed stream of
 * dg_rng so every run sees the same inputs, and a checked malloc. Names start with rh_
 * (ref helpers).
 */
#ifndef DG_TESTS_REF_HELPERS_H
#define DG_TESTS_REF_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "dragon/spec.h"

/* The IEEE bits of f. */
uint32_t rh_fbits(float f);

/* One stream of dragon's generator (dg_rng, splitmix64), seeded per test
 * (Criterion forks each, so tests do not see each other's draws). */
void rh_rng_seed(uint64_t s);
uint32_t rh_rng_u32(void);
/* Uniform integer in [lo, hi]. */
int rh_rng_int(int lo, int hi);

/* A random value of format f from the stream: an integer code in range
 * (codes unscaled), or a float k/8 (|k| <= 64, exact in bf16) so that every
 * float-path sum of a few such products is exact too. */
double rh_rand_value(dg_fmt f);

/* malloc(n ? n : 1), failing the test when it returns NULL. */
void *rh_xmalloc(size_t n);

#endif
