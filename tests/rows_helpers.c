/*
 * Helpers of the GPU tests of the row ops (rows_helpers.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "gpu_helpers.h"
#include "rows_helpers.h"

size_t rw_size(dg_fmt f)
{
	return f == DG_FMT_BF16 ? 2 : 4;
}

void rw_store(dg_fmt f, const float *v, size_t n, void *dst)
{
	if (f == DG_FMT_BF16)
		for (size_t i = 0; i < n; i++)
			((uint16_t *)dst)[i] = dg_f32_to_bf16(v[i]);
	else
		memcpy(dst, v, n * sizeof(float));
}

void rw_load(dg_fmt f, const void *p, size_t n, float *out)
{
	if (f == DG_FMT_BF16)
		for (size_t i = 0; i < n; i++)
			out[i] = dg_bf16_to_f32(((const uint16_t *)p)[i]);
	else
		memcpy(out, p, n * sizeof(float));
}

float *rw_rand(size_t n, float lo, float hi)
{
	float *v = gh_xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		v[i] = gh_uniform(lo, hi);
	return v;
}

void rw_expect_close(const char *what, dg_fmt f, const void *got, const void *want, size_t n,
		     float atol, float rtol)
{
	float *g = gh_xmalloc(n * sizeof(float)), *w = gh_xmalloc(n * sizeof(float));
	rw_load(f, got, n, g);
	rw_load(f, want, n, w);
	gh_expect_close(what, g, w, n, atol, rtol);
	free(g);
	free(w);
}

float rw_absmax(const float *v, size_t n)
{
	float m = 0.0f;
	for (size_t i = 0; i < n; i++)
		m = v[i] > m ? v[i] : -v[i] > m ? -v[i] : m;
	return m;
}

void rw_report(dg_device *dev, const dg_spec *spec, const char *entry, const char *label,
	       void (*run)(void *ctx), void *ctx, int reps)
{
	dg_kernel *k = NULL;
	dg_kernel_info ki;
	dg_event *a = NULL, *b = NULL;
	float ms = 0.0f;

	cr_assert_eq(dg_kernel_get(dev, spec, entry, &k), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_kernel_info_get(k, &ki), DG_OK);
	run(ctx);
	cr_assert_eq(dg_event_create(dev, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_event_create(dev, &b), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_event_record(a), DG_OK);
	for (int i = 0; i < reps; i++)
		run(ctx);
	cr_assert_eq(dg_event_record(b), DG_OK);
	cr_assert_eq(dg_event_synchronize(b), DG_OK);
	cr_assert_eq(dg_event_elapsed_ms(a, b, &ms), DG_OK);
	fprintf(stderr, "%s: %s %d regs, %d B spilled, %.2f us a call\n", label, ki.entry, ki.regs,
		ki.local_bytes, 1000.0 * (double)ms / reps);
	dg_event_destroy(a);
	dg_event_destroy(b);
}
