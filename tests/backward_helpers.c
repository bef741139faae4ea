/*
 * Helpers shared by the GPU backward suites; see tests/backward_helpers.h.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backward_helpers.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"

void *bh_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	cr_assert_not_null(p);
	return p;
}

/* Storage bytes of n values of format f. */
size_t bh_storage_bytes(dg_fmt f, size_t n)
{
	switch (f) {
	case DG_FMT_F32:
		return 4 * n;
	case DG_FMT_BF16:
		return 2 * n;
	case DG_FMT_TERNARY:
		return n / 4;
	case DG_FMT_SIGN1:
		return n / 8;
	default:
		return n;
	}
}

/* Random storage of n values of format f (packed along the flat order,
 * which is the last axis: n is whole rows). */
void *bh_make_storage(dg_fmt f, size_t n)
{
	size_t bytes = bh_storage_bytes(f, n);
	uint8_t *p = bh_xmalloc(bytes + 16);

	memset(p, 0, bytes + 16);
	for (size_t i = 0; i < n; i++) {
		switch (f) {
		case DG_FMT_F32:
			((float *)p)[i] = gh_uniform(-1, 1);
			break;
		case DG_FMT_BF16:
			((uint16_t *)p)[i] = dg_ref_f32_to_bf16(gh_uniform(-1, 1));
			break;
		case DG_FMT_TERNARY: {
			int c = gh_int(-1, 1);
			uint32_t bits = c == 1 ? 1u : c == -1 ? 3u : 0u;
			((uint32_t *)p)[i / 16] |= bits << (2 * (i % 16));
			break;
		}
		case DG_FMT_SIGN1:
			if (gh_int(0, 1))
				((uint32_t *)p)[i / 32] |= 1u << (i % 32);
			break;
		case DG_FMT_INT4:
			p[i] = (uint8_t)gh_int(-7, 7);
			break;
		case DG_FMT_UINT8POS:
			p[i] = (uint8_t)gh_int(0, 255);
			break;
		default:
			p[i] = (uint8_t)gh_int(-127, 127);
			break;
		}
	}
	return p;
}

/* A scale that keeps decoded values about 1. */
float bh_scale_of(dg_fmt f)
{
	int q = dg_ref_qmax(f);

	return q ? 1.0f / (float)q : 1.0f;
}

float *bh_rand_f32(size_t n)
{
	float *p = bh_xmalloc(n * 4);

	for (size_t i = 0; i < n; i++)
		p[i] = gh_uniform(-1, 1);
	return p;
}

/* The elementwise factor c of the bound: the gradient is rounded (2^-8),
 * and an f32 operand too (another 2^-8); one unit of c to spare for the
 * f32 sums (K·2^-24 <= 2^-8 for K <= 2^16). */
double bh_bound_c(dg_fmt f)
{
	return f == DG_FMT_F32 ? 3.0 : 2.0;
}

/* The two rules of the header comment, elementwise first. */
bool bh_bf16_ok(const char *what, const float *got, const float *want, const float *absum,
		size_t n, double c, char *why, size_t why_size)
{
	double ss = 0, se = 0;
	size_t bad = 0, first = 0;

	for (size_t i = 0; i < n; i++) {
		double d = (double)got[i] - want[i];
		double tol = c * BH_BF16_U * absum[i] + 1e-6 * (1.0 + fabs((double)want[i]));
		ss += (double)want[i] * want[i];
		se += d * d;
		if (fabs(d) <= tol)
			continue;
		if (bad < 4)
			fprintf(stderr, "%s[%zu]: got %.9g, want %.9g, |diff| %.3g > %.3g (Σ|terms| %.6g)\n",
				what, i, (double)got[i], (double)want[i], fabs(d), tol, (double)absum[i]);
		if (!bad)
			first = i;
		bad++;
	}
	if (bad) {
		snprintf(why, why_size, "%s: %zu of %zu values outside %g·2^-8·Σ|terms| (first at %zu)",
			 what, bad, n, c, first);
		return false;
	}
	if (se > BH_BF16_REL * BH_BF16_REL * ss + 1e-12) {
		snprintf(why, why_size, "%s: relative-to-norm error %.3g, more than %g", what,
			 ss > 0 ? sqrt(se / ss) : sqrt(se), BH_BF16_REL);
		return false;
	}
	return true;
}

void bh_expect_bf16(const char *what, const float *got, const float *want, const float *absum,
		    size_t n, double c)
{
	char why[256];

	cr_assert(bh_bf16_ok(what, got, want, absum, n, c, why, sizeof(why)), "%s", why);
}

/* |values| of a storage of n values of format f (same layout), so that a
 * reference run on it and on |grad| gives Σ|terms| (malloc'd). */
void *bh_abs_storage(dg_fmt f, const void *src, size_t n)
{
	size_t bytes = bh_storage_bytes(f, n);
	uint8_t *p = bh_xmalloc(bytes + 16);

	memcpy(p, src, bytes);
	for (size_t i = 0; i < n; i++) {
		switch (f) {
		case DG_FMT_F32:
			((float *)p)[i] = fabsf(((float *)p)[i]);
			break;
		case DG_FMT_BF16:
			((uint16_t *)p)[i] &= 0x7fff;
			break;
		case DG_FMT_TERNARY: { /* -1 (11) → +1 (01) */
			uint32_t *wd = (uint32_t *)p + i / 16;
			*wd &= ~(2u << (2 * (i % 16)));
			break;
		}
		case DG_FMT_SIGN1: /* every value +1 */
			((uint32_t *)p)[i / 32] |= 1u << (i % 32);
			break;
		case DG_FMT_INT8:
		case DG_FMT_INT4:
			p[i] = (uint8_t)abs((int8_t)p[i]);
			break;
		default: /* uint8pos: already >= 0 */
			break;
		}
	}
	return p;
}

float *bh_abs_f32(const float *v, size_t n)
{
	float *p = bh_xmalloc(n * 4);

	for (size_t i = 0; i < n; i++)
		p[i] = fabsf(v[i]);
	return p;
}
