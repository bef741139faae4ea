/*
 * Helpers shared by the GPU suites of the gradient GEMMs; see tests/grad_helpers.h.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_helpers.h"
#include "dragon/fmt.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"

float gr_scale_of(dg_fmt f)
{
	int q = dg_fmt_info_of(f)->qmax;

	return q ? 1.0f / (float)q : 1.0f;
}

float *gr_rand_f32(size_t n)
{
	return gh_rand_storage(DG_FMT_F32, n, NULL);
}

double gr_bound_c(dg_fmt f)
{
	return f == DG_FMT_F32 ? 3.0 : 2.0;
}

/* The two rules of the header comment, elementwise first. */
bool gr_bf16_ok(const char *what, const float *got, const float *want, const float *absum,
		size_t n, double c, char *why, size_t why_size)
{
	float *bound = gh_xmalloc(n * sizeof(float));
	char r[400];
	bool ok;

	for (size_t i = 0; i < n; i++)
		bound[i] = (float)(c * GR_BF16_U * absum[i] + 1e-6 * (1.0 + fabs((double)want[i])));
	ok = dg_ref_within(got, want, bound, n, r, sizeof(r));
	free(bound);
	if (!ok) {
		snprintf(why, why_size, "%s: outside %g·2^-8·Σ|terms|: %s", what, c, r);
		return false;
	}
	/* the norm rule alone: the element rule is dg_ref_within's above */
	if (!dg_ref_close_norm(got, want, n, GR_BF16_REL, FLT_MAX, r, sizeof(r))) {
		snprintf(why, why_size, "%s: relative-to-norm: %s", what, r);
		return false;
	}
	return true;
}

void gr_expect_bf16(const char *what, const float *got, const float *want, const float *absum,
		    size_t n, double c)
{
	char why[512];

	cr_assert(gr_bf16_ok(what, got, want, absum, n, c, why, sizeof(why)), "%s", why);
}

void *gr_abs_storage(dg_fmt f, const void *src, size_t n)
{
	size_t bytes = gh_bytes(f, n);
	uint8_t *p = gh_xmalloc(bytes + 16);

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

float *gr_abs_f32(const float *v, size_t n)
{
	float *p = gh_xmalloc(n * 4);

	for (size_t i = 0; i < n; i++)
		p[i] = fabsf(v[i]);
	return p;
}

void gr_expect_written(const char *what, const float *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cr_assert(!isnan(v[i]), "%s[%zu] never written (still 0xff)", what, i);
}

size_t gr_grad_input(dg_device *dev, const dg_spec *sp, dg_lowrank_grad_input_args *a,
		     const char *what)
{
	size_t need = 0;
	cr_assert_eq(dg_lowrank_grad_input_workspace(dev, sp, a, &need), DG_OK, "%s: %s", what,
		     dg_device_errmsg(dev));
	a->ws = gh_workspace(dev, need);
	if (need)
		cr_assert_eq(dg_memset8(dev, a->ws.ptr, 0xff, need), DG_OK, "%s: %s", what,
			     dg_device_errmsg(dev));
	cr_assert_eq(dg_lowrank_grad_input(dev, sp, a), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	return need;
}

dg_status gr_lowrank_grad_weight(dg_device *dev, const dg_spec *sp, dg_lowrank_grad_weight_args *a,
				 size_t *ws_bytes)
{
	size_t need = 0;
	cr_assert_eq(dg_lowrank_grad_weight_workspace(dev, sp, a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	a->ws = gh_workspace(dev, need);
	if (ws_bytes)
		*ws_bytes = need;
	return dg_lowrank_grad_weight(dev, sp, a);
}

dg_status gr_decoder_grad_weight(dg_device *dev, const dg_spec *sp, dg_decoder_grad_weight_args *a,
				 size_t *ws_bytes)
{
	size_t need = 0;
	cr_assert_eq(dg_decoder_grad_weight_workspace(dev, sp, a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	a->ws = gh_workspace(dev, need);
	if (ws_bytes)
		*ws_bytes = need;
	return dg_decoder_grad_weight(dev, sp, a);
}

dg_spec gr_spec(dg_op op, const gr_shape *s, dg_fmt f, const dg_tile *tile)
{
	dg_spec sp = dg_test_spec_sized(op, s->H, s->E, s->L);

	sp.in_heads = s->Hin;
	if (op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_DECODER_GRAD_INPUT)
		sp.weight = f;
	else
		sp.act = f;
	if (tile)
		sp.tile = *tile;
	return sp;
}
