/*
 * The one tolerance check (dragon/ref.h): bytes, atol + rtol, norm and
 * element bounds, per-element bounds. Tests, the tuner and the bench judge
 * every result with these, so a tolerance means one thing everywhere.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

static void say(char *why, size_t size, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(char *why, size_t size, const char *fmt, ...)
{
	va_list ap;

	if (!why || !size)
		return;
	va_start(ap, fmt);
	vsnprintf(why, size, fmt, ap);
	va_end(ap);
}

bool dg_ref_same_bytes(const void *got, const void *want, size_t n, char *why, size_t size)
{
	const uint8_t *g = got, *w = want;
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++)
		if (g[i] != w[i] && bad++ == 0)
			first = i;
	if (bad)
		say(why, size, "%zu of %zu bytes differ from the reference; first at byte %zu: 0x%02x, want 0x%02x",
		    bad, n, first, g[first], w[first]);
	return bad == 0;
}

static float value(dg_fmt f, const void *p, size_t i)
{
	switch (f) {
	case DG_FMT_F32:
		return ((const float *)p)[i];
	case DG_FMT_BF16:
		return dg_bf16_to_f32(((const uint16_t *)p)[i]);
	case DG_FMT_UINT8POS:
		return (float)((const uint8_t *)p)[i];
	default:
		return (float)((const int8_t *)p)[i];
	}
}

bool dg_ref_close(dg_fmt f, const void *got, const void *want, size_t n, float atol, float rtol,
		  char *why, size_t size)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		float g = value(f, got, i), w = value(f, want, i);
		bool ok = fabsf(g - w) <= atol + rtol * fabsf(w) || (isnan(g) && isnan(w));
		if (!ok && bad++ == 0)
			first = i;
	}
	if (bad)
		say(why, size, "%zu of %zu values outside atol %g + rtol %g; first [%zu]: %.9g, want %.9g",
		    bad, n, (double)atol, (double)rtol, first, (double)value(f, got, first),
		    (double)value(f, want, first));
	return bad == 0;
}

bool dg_ref_close_norm(const float *got, const float *want, size_t n, double rel, float elem,
		       char *why, size_t size)
{
	double d2 = 0.0, w2 = 0.0;
	float wmax = 0.0f, dmax = 0.0f;
	size_t at = 0;

	for (size_t i = 0; i < n; i++) {
		float d = fabsf(got[i] - want[i]);
		if (isnan(got[i]) != isnan(want[i]))
			d = INFINITY;
		d2 += (double)d * d;
		w2 += (double)want[i] * want[i];
		if (fabsf(want[i]) > wmax)
			wmax = fabsf(want[i]);
		if (!(d <= dmax)) {
			dmax = d;
			at = i;
		}
	}
	double err = w2 > 0.0 ? sqrt(d2 / w2) : sqrt(d2);
	if (err <= rel && dmax <= elem * wmax)
		return true;
	say(why, size,
	    "norm error %.3g (at most %.3g), largest difference %.3g at [%zu]: %.9g, want %.9g (at most %.3g)",
	    err, rel, (double)dmax, at, n ? (double)got[at] : 0.0, n ? (double)want[at] : 0.0,
	    (double)(elem * wmax));
	return false;
}

bool dg_ref_within(const float *got, const float *want, const float *bound, size_t n,
		   char *why, size_t size)
{
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		float d = fabsf(got[i] - want[i]);
		bool ok = d <= bound[i] || (isnan(got[i]) && isnan(want[i]));
		if (!ok && bad++ == 0)
			first = i;
	}
	if (bad)
		say(why, size, "%zu of %zu values outside their bound; first [%zu]: %.9g, want %.9g (bound %.3g)",
		    bad, n, first, (double)got[first], (double)want[first], (double)bound[first]);
	return bad == 0;
}
