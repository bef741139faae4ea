/*
 * GPU test helpers (gpu_helpers.h): open the device or skip, tracked
 * allocations, deterministic data, comparisons that print the first
 * differences.
 *
 * Criterion runs each test in its own process, so the state here (the
 * allocation list, the cache folder, the random stream) is per test.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gpu_helpers.h"
#include "helpers.h"

static dg_dptr *allocs;
static size_t n_allocs, cap_allocs;
static char *cache_dir; /* ours, removed at gh_close; NULL with DRAGON_CACHE_DIR */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static bool require_gpu(void)
{
	const char *v = getenv("DRAGON_REQUIRE_GPU");
	return v && *v && strcmp(v, "0") != 0;
}

dg_device *gh_open(void)
{
	dg_device *dev = NULL;
	dg_ctx_opts jit = { 0 };
	dg_device_opts o = { .ordinal = 0, .jit = &jit };
	char why[512];
	int n = 0;

	/* A cache per test process, so runs never share compiled kernels
	 * unless DRAGON_CACHE_DIR asks for one. */
	const char *env = getenv("DRAGON_CACHE_DIR");
	if (env && *env) {
		jit.cache_dir = env;
	} else {
		cache_dir = dg_test_tmpdir();
		jit.cache_dir = cache_dir;
	}
	dg_status st = dg_device_count(&n, why, sizeof(why));
	if (st == DG_OK && n > 0)
		st = dg_device_open(&dev, &o);
	if (st == DG_OK && n > 0)
		return dev;
	if (n > 0 || st != DG_OK) {
		char tmp[sizeof(why)];
		snprintf(tmp, sizeof(tmp), "%s", dev ? dg_device_errmsg(dev) : why);
		snprintf(why, sizeof(why), "%s: %.400s", dg_status_str(st), tmp);
	}
	dg_device_close(dev);
	if (cache_dir) {
		dg_test_rmtree(cache_dir);
		cache_dir = NULL;
	}
	if (require_gpu())
		cr_assert_fail("DRAGON_REQUIRE_GPU is set but no CUDA device opened: %s", why);
	fprintf(stderr, "skipped: no CUDA device (%s)\n", why);
	cr_skip_test("skipped: no CUDA device (%s)", why);
	return NULL;
}

void gh_close(dg_device *dev)
{
	for (size_t i = 0; i < n_allocs; i++)
		cr_expect_eq(dg_free(dev, allocs[i]), DG_OK, "dg_free: %s",
			     dg_device_errmsg(dev));
	free(allocs);
	allocs = NULL;
	n_allocs = cap_allocs = 0;
	dg_device_close(dev);
	if (cache_dir) {
		dg_test_rmtree(cache_dir);
		cache_dir = NULL;
	}
}

dg_dptr gh_alloc(dg_device *dev, size_t bytes)
{
	dg_dptr p = 0;
	cr_assert_eq(dg_malloc(dev, bytes, &p), DG_OK, "dg_malloc(%zu): %s", bytes,
		     dg_device_errmsg(dev));
	if (n_allocs == cap_allocs) {
		cap_allocs = cap_allocs ? cap_allocs * 2 : 16;
		allocs = realloc(allocs, cap_allocs * sizeof(*allocs));
		cr_assert_not_null(allocs);
	}
	allocs[n_allocs++] = p;
	cr_assert_eq(dg_memset8(dev, p, 0, bytes), DG_OK, "dg_memset8: %s",
		     dg_device_errmsg(dev));
	return p;
}

dg_dptr gh_upload(dg_device *dev, const void *host, size_t bytes)
{
	dg_dptr p = gh_alloc(dev, bytes);
	cr_assert_eq(dg_memcpy_htod(dev, p, host, bytes), DG_OK, "htod: %s",
		     dg_device_errmsg(dev));
	return p;
}

void gh_download(dg_device *dev, void *host, dg_dptr src, size_t bytes)
{
	cr_assert_eq(dg_memcpy_dtoh(dev, host, src, bytes), DG_OK, "dtoh: %s",
		     dg_device_errmsg(dev));
}

dg_dptr gh_scalar(dg_device *dev, float v)
{
	return gh_upload(dev, &v, sizeof(v));
}

float gh_read_scalar(dg_device *dev, dg_dptr p)
{
	float v = 0;
	gh_download(dev, &v, p, sizeof(v));
	return v;
}

void gh_sync(dg_device *dev)
{
	cr_assert_eq(dg_device_sync(dev), DG_OK, "sync: %s", dg_device_errmsg(dev));
}

void gh_seed(uint64_t seed)
{
	rng_state = seed;
}

uint64_t gh_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float gh_uniform(float lo, float hi)
{
	double u = (double)(gh_u64() >> 11) / 9007199254740992.0; /* [0, 1) */
	return (float)(lo + (hi - lo) * u);
}

int gh_int(int lo, int hi)
{
	uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
	return (int)((int64_t)lo + (int64_t)(gh_u64() % span));
}

void gh_expect_bytes(const char *what, const void *got, const void *want, size_t n)
{
	const unsigned char *g = got, *w = want;
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		if (g[i] == w[i])
			continue;
		if (bad < 8)
			fprintf(stderr, "%s: byte %zu: got 0x%02x, want 0x%02x\n", what,
				i, g[i], w[i]);
		bad++;
	}
	cr_assert_eq(bad, 0, "%s: %zu of %zu bytes differ", what, bad, n);
}

void gh_expect_close(const char *what, const float *got, const float *want,
		     size_t n, float atol, float rtol)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		float tol = atol + rtol * fabsf(want[i]);
		bool ok = fabsf(got[i] - want[i]) <= tol ||
			  (isnan(got[i]) && isnan(want[i]));
		if (ok)
			continue;
		if (bad < 8)
			fprintf(stderr, "%s[%zu]: got %.9g, want %.9g (tolerance %.3g)\n",
				what, i, (double)got[i], (double)want[i], (double)tol);
		bad++;
	}
	cr_assert_eq(bad, 0, "%s: %zu of %zu values outside atol %g + rtol %g", what,
		     bad, n, (double)atol, (double)rtol);
}
