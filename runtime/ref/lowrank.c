/*
 * CPU reference of lowrank_fwd (runtime/ref/ref_ops.h):
 *
 *   y[b,h,t,l] = s · Σ_e x[b,hin(h),t,e] · w[h,l,e]     hin(h) = Hin==1 ? 0 : h
 *   out = relu ? max(y - thr, 0) : y, stored in the out format (f32, bf16),
 *   or as codes from one fused multiply-add of the sum (store_code)
 *
 * It walks the same storage the kernel reads (templates/lowrank.lua): i8x4
 * words for integer activations and int8 weights, 16 ternary codes a uint32
 * (00 0, 01 +1, 11 -1; the unused pattern 10 decodes as 0, like the kernel),
 * 32 sign1 codes a uint32 (bit set +1), f32 / bf16 plain.
 *
 * Integer × integer: exact integer sum (kept to int32 like the kernel's
 * dp4a accumulator), y = (float)sum · (sa·sw). Otherwise each operand is
 * converted to float and summed in float in e order, y = sum · (sa | sw | 1).
 * The epilogue is written as separate float operations, in the kernel's
 * order, so that it rounds exactly like __fmul_rn/__fsub_rn/__fdiv_rn (the
 * build is ISO C, so no multiply-add is contracted).
 *
 * relu_mask (dg_ref_relu_mask) runs the same loop and keeps grad where the
 * forward's y - thr is > 0 (grad and grad_out may alias: each element is
 * read before it is written, once).
 */
#include "runtime/ref/ref_ops.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

static bool weight_is_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

static bool act_ok(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16 || dg__ref_is_act_code(f);
}

static bool weight_ok(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16 || weight_is_code(f);
}

static bool out_ok(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16 || f == DG_FMT_INT8 ||
	       f == DG_FMT_UINT8POS;
}

static bool mul_ok(size_t *acc, size_t f)
{
	if (f && *acc > SIZE_MAX / f)
		return false;
	*acc *= f;
	return true;
}

/* mask: relu_mask (no out; grad and grad_out checked by the caller). */
static dg_status check(const dg_spec *spec, const dg_ref_lowrank_args *a,
		       bool mask)
{
	size_t n = 1;

	if (!spec || !a || !a->x || !a->w || (!mask && !a->out))
		return DG_ERR_INVALID_ARG;
	if (spec->op != (mask ? DG_OP_RELU_MASK : DG_OP_LOWRANK_FWD))
		return DG_ERR_INVALID_ARG;
	if (mask && !spec->relu)
		return DG_ERR_INVALID_ARG;
	if (spec->heads <= 0 || spec->latent <= 0 || spec->embd <= 0)
		return DG_ERR_INVALID_ARG;
	if (spec->in_heads != 1 && spec->in_heads != spec->heads)
		return DG_ERR_INVALID_ARG;
	if (!act_ok(spec->act) || !weight_ok(spec->weight) ||
	    (!mask && !out_ok(spec->out)))
		return DG_ERR_INVALID_ARG;
	if ((dg__ref_is_act_code(spec->act) || spec->weight == DG_FMT_INT8) &&
	    spec->embd % 4)
		return DG_ERR_INVALID_ARG;
	if (spec->weight == DG_FMT_TERNARY && spec->embd % 16)
		return DG_ERR_INVALID_ARG;
	if (spec->weight == DG_FMT_SIGN1 && spec->embd % 32)
		return DG_ERR_INVALID_ARG;
	if (a->batch < 0 || a->time < 0)
		return DG_ERR_INVALID_ARG;
	/* a scale a row or a channel: its vector, and float outputs only */
	bool sa_vec = dg__ref_is_act_code(spec->act) && spec->ascale == DG_SCALE_TOKEN;
	bool sw_vec = weight_is_code(spec->weight) && spec->wscale == DG_SCALE_CHANNEL;
	if ((sa_vec && !a->sa_v) || (sw_vec && !a->sw_v))
		return DG_ERR_INVALID_ARG;
	if ((sa_vec || sw_vec) && !mask && (spec->out == DG_FMT_INT8 || spec->out == DG_FMT_UINT8POS))
		return DG_ERR_INVALID_ARG;
	/* Every index below is a size_t product of these. */
	if (!mul_ok(&n, (size_t)a->batch) || !mul_ok(&n, (size_t)a->time) ||
	    !mul_ok(&n, (size_t)spec->heads) ||
	    !mul_ok(&n, (size_t)spec->latent) ||
	    !mul_ok(&n, (size_t)spec->embd))
		return DG_ERR_INVALID_ARG;
	return DG_OK;
}

/* out[i] = y in the out format (f32, bf16). */
static void store_float(dg_fmt fmt, void *out, size_t i, float y)
{
	if (fmt == DG_FMT_F32)
		((float *)out)[i] = y;
	else
		((uint16_t *)out)[i] = dg_ref_f32_to_bf16(y);
}

/*
 * Codes out (int8, uint8pos): a saturating fused multiply-add from the
 * accumulator, then a rounding one; with lo..hi the code range (relu int8
 * 0..127, int8 -127..127, uint8pos 0..255) and R = hi - lo:
 *   r = 1/so, ca = s·r, cb = relu ? -thr·r : 0       (each a rounded float)
 *   a1 = ca / R, b1 = (cb - lo) / R                   (rounded)
 *   u = clamp(fmaf(acc, a1, b1), 0, 1)                (NaN → 0)
 *   code = lo + rint(u · R)                           (half to even, one rounding)
 * That is clamp(rint((acc·s - thr) / so)) up to the rounding of a1, b1 and
 * u (a code can differ by one next to a tie), computed the way the
 * tensor-core epilogue does it: two FMAs an output on the FP32 pipe, the
 * clamp for free (FFMA.SAT), the rounding by adding 1.5·2^23. so <= 0
 * gives r = 0 and so code 0.
 */
typedef struct code_map {
	float a1, b1, r, lo;
} code_map;

static code_map code_map_of(dg_fmt fmt, bool relu, float relu_thr, float s,
			    float so)
{
	code_map c;
	float so_r = so > 0.0f ? 1.0f / so : 0.0f;
	float ca = s * so_r;
	float cb = relu ? -relu_thr * so_r : 0.0f;

	c.lo = fmt == DG_FMT_INT8 && !relu ? -127.0f : 0.0f;
	c.r = (fmt == DG_FMT_INT8 ? 127.0f : 255.0f) - c.lo;
	c.a1 = ca / c.r;
	c.b1 = (cb - c.lo) / c.r;
	return c;
}

static void store_code(dg_fmt fmt, void *out, size_t i, float acc,
		       const code_map *c)
{
	float u = fmaf(acc, c->a1, c->b1);
	float t;

	u = u > 0.0f ? (u < 1.0f ? u : 1.0f) : 0.0f;
	t = fmaf(u, c->r, 12582912.0f + c->lo); /* rounds to an integer */
	int code = (int)t - 12582912;
	if (fmt == DG_FMT_INT8)
		((int8_t *)out)[i] = (int8_t)code;
	else
		((uint8_t *)out)[i] = (uint8_t)code;
}

/* Σ_e x[e]·w[e] exactly; int32 wrap like the kernel's dp4a accumulator
 * (never reached for E < 66000). */
static int32_t dot_int(const int32_t *x, const int32_t *w, size_t n)
{
	int64_t acc = 0;
	uint32_t u;
	int32_t r;

	for (size_t e = 0; e < n; e++)
		acc += (int64_t)x[e] * w[e];
	u = (uint32_t)acc;
	memcpy(&r, &u, sizeof(r));
	return r;
}

/* Σ_e x[e]·w[e] in double (the products of two floats are exact there),
 * rounded to float once: the kernels' float sums run in another order, so
 * the closest value is the one to compare with. A float running sum lost
 * ~1e-4 of the decoder's K = H·L = 32768 terms, which the 6-layer model
 * turned into 1e-3 of its gradients against PyTorch. */
static float dot_float(const float *x, const float *w, size_t n)
{
	double acc = 0.0;

	for (size_t e = 0; e < n; e++)
		acc += (double)x[e] * w[e];
	return (float)acc;
}

/* The forward, or (grad_out non-NULL) relu_mask: grad_out = grad where
 * y - thr > 0, else 0, y exactly as the forward computes it. */
static dg_status lowrank_run(const dg_spec *spec,
			     const dg_ref_lowrank_args *args,
			     const float *grad, float *grad_out)
{
	dg_status st = check(spec, args, grad_out != NULL);
	size_t H, Hin, E, L, B, T;
	bool int_path, act_code_fmt, w_code_fmt, out_code;
	float s;
	code_map cm = { 0 }; /* codes out: store_code */
	double absum = 0.0;
	int32_t *xi = NULL, *wi = NULL; /* (E) and (L, E) decoded, int path */
	float *xf = NULL, *wf = NULL;   /* the same, float path */

	if (st)
		return st;
	H = (size_t)spec->heads;
	Hin = (size_t)spec->in_heads;
	E = (size_t)spec->embd;
	L = (size_t)spec->latent;
	B = (size_t)args->batch;
	T = (size_t)args->time;
	act_code_fmt = dg__ref_is_act_code(spec->act);
	w_code_fmt = weight_is_code(spec->weight);
	int_path = act_code_fmt && w_code_fmt;
	const float *sa_v = act_code_fmt && spec->ascale == DG_SCALE_TOKEN ? args->sa_v : NULL;
	const float *sw_v = w_code_fmt && spec->wscale == DG_SCALE_CHANNEL ? args->sw_v : NULL;

	if (int_path) {
		s = args->sa * args->sw;
		xi = malloc(E * sizeof(*xi));
		wi = malloc(L * E * sizeof(*wi));
	} else {
		s = act_code_fmt ? args->sa : w_code_fmt ? args->sw : 1.0f;
		xf = malloc(E * sizeof(*xf));
		wf = malloc(L * E * sizeof(*wf));
	}
	out_code = !grad_out && (spec->out == DG_FMT_INT8 ||
				 spec->out == DG_FMT_UINT8POS);
	if (out_code)
		cm = code_map_of(spec->out, spec->relu, spec->relu_thr, s,
				 args->so);
	if (int_path ? !xi || !wi : !xf || !wf) {
		st = DG_ERR_NOMEM;
		goto out;
	}

	for (size_t h = 0; h < H; h++) {
		size_t hin = Hin == 1 ? 0 : h;

		/* Decode the head's weights once: w[h] is (L, E). */
		for (size_t i = 0; i < L * E; i++) {
			size_t gi = h * L * E + i;

			if (int_path)
				wi[i] = dg__ref_code_at(spec->weight, args->w, gi);
			else if (w_code_fmt)
				wf[i] = (float)dg__ref_code_at(spec->weight,
							   args->w, gi);
			else
				wf[i] = dg__ref_plain_at(spec->weight,
							 args->w, gi);
		}
		for (size_t bt = 0; bt < B * T; bt++) {
			size_t b = bt / T, t = bt % T;
			size_t xrow = ((b * Hin + hin) * T + t) * E;
			size_t orow = ((b * H + h) * T + t) * L;

			for (size_t e = 0; e < E; e++) {
				if (int_path)
					xi[e] = dg__ref_code_at(spec->act, args->x,
							 xrow + e);
				else if (act_code_fmt)
					xf[e] = (float)dg__ref_code_at(spec->act,
								args->x, xrow + e);
				else
					xf[e] = dg__ref_plain_at(spec->act,
								 args->x,
								 xrow + e);
			}
			/* this row's act scale (per token: x row's) */
			const float sa_r = sa_v ? sa_v[xrow / E] : args->sa;

			for (size_t l = 0; l < L; l++) {
				float acc, y, s_e = s;

				if (sa_v || sw_v) {
					const float sw_c = sw_v ? sw_v[h * L + l] : args->sw;
					s_e = int_path ? sa_r * sw_c : act_code_fmt ? sa_r : sw_c;
				}
				if (int_path)
					acc = (float)dot_int(xi, wi + l * E, E);
				else
					acc = dot_float(xf, wf + l * E, E);
				y = acc * s_e;
				if (grad_out) {
					y = y - spec->relu_thr;
					grad_out[orow + l] =
						y > 0.0f ? grad[orow + l] : 0.0f;
					continue;
				}
				if (spec->relu) {
					y = y - spec->relu_thr;
					y = y > 0.0f ? y : 0.0f;
				}
				absum += fabs((double)y);
				if (out_code)
					store_code(spec->out, args->out, orow + l,
						   acc, &cm);
				else
					store_float(spec->out, args->out,
						    orow + l, y);
			}
		}
	}
	if (args->out_absum && !grad_out)
		*args->out_absum = absum;
out:
	free(xi);
	free(wi);
	free(xf);
	free(wf);
	return st;
}

dg_status dg_ref_lowrank_fwd(const dg_spec *spec,
			     const dg_ref_lowrank_args *args)
{
	return lowrank_run(spec, args, NULL, NULL);
}

dg_status dg_ref_relu_mask(const dg_spec *spec, const void *x, const void *w,
			   float sa, float sw, const float *grad,
			   float *grad_out, int batch, int time)
{
	return dg__ref_relu_mask_v(spec, x, w, sa, sw, NULL, NULL, grad, grad_out, batch, time);
}

dg_status dg__ref_relu_mask_v(const dg_spec *spec, const void *x, const void *w, float sa,
			      float sw, const float *sa_v, const float *sw_v, const float *grad,
			      float *grad_out, int batch, int time)
{
	dg_ref_lowrank_args a = { .x = x, .w = w, .sa = sa, .sw = sw, .sa_v = sa_v,
				  .sw_v = sw_v, .batch = batch, .time = time };

	if (!grad || !grad_out)
		return DG_ERR_INVALID_ARG;
	return lowrank_run(spec, &a, grad, grad_out);
}
