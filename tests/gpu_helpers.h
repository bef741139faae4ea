/*
 * GPU test helpers: open the device or skip, move data, compare.
 *
 * gh_open() opens device 0 and returns it; without a driver or device it
 * prints "skipped: no CUDA device (<why>)" and skips the calling test
 * (cr_skip_test), so the same binary passes in CI and runs for real on a
 * GPU. Set DRAGON_REQUIRE_GPU=1 to turn that skip into a failure (the GPU
 * command does, so a broken driver cannot pass as "skipped").
 *
 * Every helper asserts on failure (cr_assert with the device's message);
 * allocations are tracked and freed by gh_close().
 */
#ifndef DG_TESTS_GPU_HELPERS_H
#define DG_TESTS_GPU_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/dragon.h"
#include "dragon/ops.h"
#include "dragon/runtime.h"
#include "dragon/tensor.h"

dg_device *gh_open(void);
void gh_close(dg_device *dev); /* frees every gh_ allocation, closes */

dg_dptr gh_alloc(dg_device *dev, size_t bytes);          /* zeroed */
dg_dptr gh_upload(dg_device *dev, const void *host, size_t bytes);
void gh_download(dg_device *dev, void *host, dg_dptr src, size_t bytes);
dg_dptr gh_scalar(dg_device *dev, float v);              /* one float */
float gh_read_scalar(dg_device *dev, dg_dptr p);
void gh_sync(dg_device *dev);

/* Deterministic random data (splitmix64). */
void gh_seed(uint64_t seed);
uint64_t gh_u64(void);
float gh_uniform(float lo, float hi);
int gh_int(int lo, int hi); /* inclusive */

/* Compares; on mismatch prints the first few differing indices with both
 * values and fails the test naming `what`. */
void gh_expect_bytes(const char *what, const void *got, const void *want,
		     size_t n);
void gh_expect_close(const char *what, const float *got, const float *want,
		     size_t n, float atol, float rtol);

#endif
