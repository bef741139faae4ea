/*
 * GPU test helpers: open the device or skip, move data, workspaces,
 * random data, compare.
 *
 * gh_open() opens device 0 and returns it; without a driver or device it
 * prints "skipped: no CUDA device (<why>)" and skips the calling test
 * (cr_skip_test), so the same binary passes in CI and runs for real on a
 * GPU. Set DRAGON_REQUIRE_GPU=1 to turn that skip into a failure (the GPU
 * command does, so a broken driver cannot pass as "skipped").
 *
 * Every helper asserts on failure (cr_assert with the device's message);
 * allocations are tracked and freed by gh_close().
 *
 * The random stream is one dg_rng (dragon/rng.h) per test process: gh_seed
 * restarts it, gh_rng() hands it to dg_rng_fill. The comparisons are
 * dragon/ref.h's (dg_ref_same_bytes, dg_ref_close), failing the test with
 * their one-line reason.
 */
#ifndef DG_TESTS_GPU_HELPERS_H
#define DG_TESTS_GPU_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/dragon.h"

dg_device *gh_open(void);
void gh_close(dg_device *dev); /* frees every gh_ allocation, closes */
/* gh_open, then skips the test (printing "skipped: the warpgroup path
 * needs sm_90 (device is sm_<n>)") unless the device is an sm_90. */
dg_device *gh_open_sm90(void);
/* The code generator's plan of sp takes the path `path` (dg_plan.path;
 * no device needed). */
void gh_expect_path(const dg_spec *sp, const char *path);

dg_dptr gh_alloc(dg_device *dev, size_t bytes);          /* zeroed */
dg_dptr gh_alloc_ff(dg_device *dev, size_t bytes);       /* every byte 0xff */
dg_dptr gh_upload(dg_device *dev, const void *host, size_t bytes);
void gh_download(dg_device *dev, void *host, dg_dptr src, size_t bytes);
dg_dptr gh_scalar(dg_device *dev, float v);              /* one float */
float gh_read_scalar(dg_device *dev, dg_dptr p);
void gh_sync(dg_device *dev);
/* A workspace of `bytes` (none for 0), freed by gh_close. */
dg_workspace gh_workspace(dg_device *dev, size_t bytes);

/* One call of an op on its arguments struct args with the workspace ws
 * in place of the struct's. */
typedef dg_status (*gh_ws_call)(dg_device *dev, const dg_spec *s, void *args, dg_workspace ws);
/* call refuses with DG_ERR_INVALID_ARG, its message naming fn and "ws",
 * each of the three workspaces that are not ok (which holds all the op
 * needs): none, one byte short, and ok's size at a null pointer; and
 * writes nothing: the out_bytes at out (named out_name) keep their 0xff,
 * the float at scale (unless 0) its -1. */
void gh_expect_bad_workspaces(dg_device *dev, const dg_spec *s, void *args, dg_workspace ok, gh_ws_call call,
			      const char *fn, const char *out_name, dg_dptr out, size_t out_bytes, dg_dptr scale);

/* Storage bytes of n values of format f in the layout of dragon/fmt.h:
 * one-a-byte codes any n, sub-byte codes n a multiple of their codes a
 * word (asserted). */
size_t gh_bytes(dg_fmt f, size_t n);
/* malloc(n ? n : 1), failing the test when it returns NULL. */
void *gh_xmalloc(size_t n);
/* n random values of format f in its storage (dg_rng_fill on the test's
 * stream); malloc'd with 16 spare zero bytes, *bytes (may be NULL) gets
 * gh_bytes(f, n). */
void *gh_rand_storage(dg_fmt f, size_t n, size_t *bytes);

/* The test's random stream (dragon/rng.h). */
dg_rng *gh_rng(void);
void gh_seed(uint64_t seed);
uint64_t gh_u64(void);
float gh_uniform(float lo, float hi);
int gh_int(int lo, int hi); /* inclusive */

/* Compares; on mismatch fails the test naming `what` with the reason
 * dg_ref_same_bytes / dg_ref_close (f32) give. */
void gh_expect_bytes(const char *what, const void *got, const void *want,
		     size_t n);
void gh_expect_close(const char *what, const float *got, const float *want,
		     size_t n, float atol, float rtol);

#endif
