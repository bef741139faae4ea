/*
 * GPU test helpers (gpu_helpers.h): open the device or skip, tracked
 * allocations and workspaces, data from one dg_rng, the comparisons of
 * dragon/ref.h.
 *
 * Criterion runs each test in its own process, so the state here (the
 * allocation list, the cache folder, the random stream) is per test.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "gpu_helpers.h"
#include "helpers.h"

static dg_dptr *allocs;
static size_t n_allocs, cap_allocs;
static char *cache_dir; /* ours, removed at gh_close; NULL with DRAGON_CACHE_DIR */
static dg_rng rng = { 0x9e3779b97f4a7c15ull }; /* the test's stream (gh_seed) */

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

dg_device *gh_open_sm90(void)
{
	dg_device *dev = gh_open();
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	if (di.sm != 90) {
		gh_close(dev);
		fprintf(stderr, "skipped: the warpgroup path needs sm_90 (device is sm_%d)\n", di.sm);
		cr_skip_test("skipped: the warpgroup path needs sm_90");
	}
	return dev;
}

void gh_expect_path(const dg_spec *sp, const char *path)
{
	dg_codegen *cg = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	cr_assert_eq(dg_codegen_plan(cg, sp, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_str_eq(p.path, path, "%s", p.canonical);
	dg_codegen_destroy(cg);
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

dg_dptr gh_alloc_ff(dg_device *dev, size_t bytes)
{
	dg_dptr p = gh_alloc(dev, bytes);
	cr_assert_eq(dg_memset8(dev, p, 0xff, bytes), DG_OK, "dg_memset8: %s",
		     dg_device_errmsg(dev));
	return p;
}

dg_workspace gh_workspace(dg_device *dev, size_t bytes)
{
	dg_workspace ws = { 0, 0 };
	if (bytes) {
		ws.ptr = gh_alloc(dev, bytes);
		ws.bytes = bytes;
	}
	return ws;
}

size_t gh_bytes(dg_fmt f, size_t n)
{
	const dg_fmt_info *fi = dg_fmt_info_of(f);
	cr_assert_not_null(fi, "format %d", (int)f);
	cr_assert(fi->bits >= 8 || n % (size_t)fi->per_word == 0,
		  "%zu %s values do not fill whole words of %d", n, fi->name, fi->per_word);
	return n * (size_t)fi->bits / 8;
}

void *gh_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	cr_assert_not_null(p, "out of memory (%zu bytes)", n);
	return p;
}

void *gh_rand_storage(dg_fmt f, size_t n, size_t *bytes)
{
	size_t b = gh_bytes(f, n);
	void *p = gh_xmalloc(b + 16);
	memset(p, 0, b + 16);
	dg_rng_fill(&rng, f, p, n);
	if (bytes)
		*bytes = b;
	return p;
}

dg_rng *gh_rng(void)
{
	return &rng;
}

void gh_seed(uint64_t seed)
{
	dg_rng_seed(&rng, seed);
}

uint64_t gh_u64(void)
{
	return dg_rng_u64(&rng);
}

float gh_uniform(float lo, float hi)
{
	return dg_rng_uniform(&rng, lo, hi);
}

int gh_int(int lo, int hi)
{
	return dg_rng_int(&rng, lo, hi);
}

void gh_expect_bytes(const char *what, const void *got, const void *want, size_t n)
{
	char why[512];
	cr_assert(dg_ref_same_bytes(got, want, n, why, sizeof(why)), "%s: %s", what, why);
}

void gh_expect_close(const char *what, const float *got, const float *want,
		     size_t n, float atol, float rtol)
{
	char why[512];
	cr_assert(dg_ref_close(DG_FMT_F32, got, want, n, atol, rtol, why, sizeof(why)), "%s: %s",
		  what, why);
}

void gh_expect_bad_workspaces(dg_device *dev, const dg_spec *s, void *args, dg_workspace ok, gh_ws_call call,
			      const char *fn, const char *out_name, dg_dptr out, size_t out_bytes, dg_dptr scale)
{
	const dg_workspace bad[3] = { { 0, 0 }, { ok.ptr, ok.bytes - 1 }, { 0, ok.bytes } };
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(call(dev, s, args, bad[i]), DG_ERR_INVALID_ARG, "case %d ran", i);
		const char *m = dg_device_errmsg(dev);
		cr_assert(strstr(m, fn) && strstr(m, "ws"), "case %d: %s", i, m);
	}
	unsigned char *got = gh_xmalloc(out_bytes), *ff = gh_xmalloc(out_bytes);
	memset(ff, 0xff, out_bytes);
	gh_download(dev, got, out, out_bytes);
	char what[128];
	snprintf(what, sizeof(what), "%s after refused calls", out_name);
	gh_expect_bytes(what, got, ff, out_bytes);
	if (scale)
		cr_assert_eq(gh_read_scalar(dev, scale), -1.0f, "scale untouched");
	free(got);
	free(ff);
}
