/*
 * dragon — the one random stream of test and benchmark data: splitmix64
 * (Steele, Lea, Flood 2014). The tuner's inputs, the bench's and the
 * tests' all come from here, so "seed 42" means the same data everywhere.
 * Not for anything that must resist prediction.
 */
#ifndef DRAGON_RNG_H
#define DRAGON_RNG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "fmt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_rng {
	uint64_t state;
} dg_rng;

DG_API void dg_rng_seed(dg_rng *r, uint64_t seed);
DG_API uint64_t dg_rng_u64(dg_rng *r);
/* Uniform in [lo, hi), from 53 random bits. */
DG_API float dg_rng_uniform(dg_rng *r, float lo, float hi);
/* Uniform integer in [lo, hi]. */
DG_API int dg_rng_int(dg_rng *r, int lo, int hi);

/*
 * n random values of format fmt in its storage layout (dragon/fmt.h):
 * floats uniform in [-1, 1) (bf16 rounded from them), int8 codes in
 * -127..127, int4 in -7..7, uint8pos in 0..255 (one a byte), ternary codes
 * -1, 0, +1 packed 16 a word, sign1 bits 32 a word (n a multiple of the
 * codes a word), i32 token ids in 0..255 (the default vocab). storage holds dg_fmt_row_bytes(fmt, n) bytes.
 */
DG_API void dg_rng_fill(dg_rng *r, dg_fmt fmt, void *storage, size_t n);

/* ---- dropout: a counter-based stream, the same on the CPU and the GPU ----
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw 2011): four 32-bit outputs of
 * a counter under a key, 10 rounds. A dropout mask is never stored: the
 * forward and the backward (and the GPU's kernels, in the same integer
 * arithmetic) regenerate it from (seed, step, layer, element). */
DG_API void dg_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The integer threshold of drop probability p in [0, 1): an element is
 * dropped when its 16-bit draw is below it (floor(p·65536), 0 .. 65535;
 * 65536 for p >= 1: every element dropped). The survival probability is
 * 1 − floor(p·65536)/65536, within 2^-16 of 1 − p. */
DG_API uint32_t dg_dropout_threshold(float p);

/* Whether element i of (seed, step, layer) survives dropout p: its draw is
 * the 16-bit half i % 2 (low first) of word (i / 2) % 4 of Philox at counter
 * (i/8 low, i/8 high, step, layer) under key (seed low, seed high): one
 * Philox block draws 8 elements. */
DG_API bool dg_dropout_keep(uint64_t seed, uint32_t step, uint32_t layer, uint64_t i, float p);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_RNG_H */
