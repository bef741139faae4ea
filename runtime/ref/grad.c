/*
 * CPU references of the four gradient GEMMs (runtime/ref/ref_ops.h) and of the
 * ternary / sign1 unpackers:
 *
 *   lowrank_grad_input   grad_x[b,i,t,e] = sw · Σ_{h: hin(h)=i} Σ_l grad[b,h,t,l] · w[h,l,e]
 *   lowrank_grad_weight  grad_w[h,l,e]   = sa · Σ_{b,t} grad[b,h,t,l] · x[b,hin(h),t,e]
 *   decoder_grad_input   grad_y[b,h,t,l] = sw · Σ_d grad[b,0,t,d] · w[d, h·L + l]
 *   decoder_grad_weight  grad_w[d,h·L+l] = sa · Σ_{b,t} grad[b,0,t,d] · y[b,h,t,l]
 *
 * The operand in a storage format is first decoded to one float a value
 * (exact: codes are small integers, bf16 widens exactly), then every sum
 * runs in double and is scaled in double (by the integer operand's scale,
 * 1 for a float operand) and rounded to float once: exact math, the
 * kernels' target. The GPU differs in two ways (templates/grad.lua):
 * its sums are f32, and on the tensor-core path (sm_80+, the default
 * tiles) the f32 gradient — and an f32 operand — is rounded to bf16 (round
 * to nearest even, at most 2^-9 relative a term) before the products. So
 * compare relative to the norm of the reference: the tensor-core error is
 * about 1e-3 · RMS(ref) an element; tests accept 1e-2 · RMS(ref)
 * (tests/test_gpu_grad.c); the SIMT path (f32 FMA, before sm_80 or on
 * odd tiles) is within f32 rounding of the sum.
 *
 * Gradient formats (dragon/spec.h): the lowrank ops read grad in
 * spec->src (bf16 widened exactly), decoder_grad_input writes grad_y in
 * spec->out (bf16: the f32 result rounded to nearest even once, where the
 * kernel rounds its f32 sum); the other gradients are f32.
 *
 * Storage walked here is the kernels' (dragon/spec.h): i8x4 words for
 * int8 / int4 / uint8pos (uint8pos lanes unsigned), 16 ternary codes a
 * uint32 (00 0, 01 +1, 11 -1, the unused 10 decodes as 0 like the kernels),
 * 32 sign1 codes a uint32 (bit set +1), packed along the last axis.
 * Bad pointers, shapes and formats give DG_ERR_INVALID_ARG and leave the
 * outputs untouched.
 */
#include "runtime/ref/ref_ops.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

/* --- decoding ------------------------------------------------------------ */

static bool weight_ok(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16 || f == DG_FMT_INT8 ||
	       f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

static bool act_ok(dg_fmt f)
{
	return f == DG_FMT_F32 || f == DG_FMT_BF16 || dg__ref_is_act_code(f);
}

static bool is_code(dg_fmt f)
{
	return f != DG_FMT_F32 && f != DG_FMT_BF16;
}

/* Values a storage word holds along the packed axis (1 for f32). */
static int per_word(dg_fmt f)
{
	switch (f) {
	case DG_FMT_F32:
		return 1;
	case DG_FMT_BF16:
		return 2;
	case DG_FMT_TERNARY:
		return 16;
	case DG_FMT_SIGN1:
		return 32;
	default:
		return 4;
	}
}

/* Value i of a tensor in storage format f, as a float (codes unscaled). */
static float value_at(dg_fmt f, const void *p, size_t i)
{
	if (f == DG_FMT_F32 || f == DG_FMT_BF16)
		return dg__ref_plain_at(f, p, i);
	return (float)dg__ref_code_at(f, p, i);
}

/* n values of p decoded into a malloc'd float array (NULL: no memory). */
static float *decode_all(dg_fmt f, const void *p, size_t n)
{
	float *out = malloc((n ? n : 1) * sizeof(*out));

	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++)
		out[i] = value_at(f, p, i);
	return out;
}

/* --- argument checks ------------------------------------------------------ */

static bool mul_ok(size_t *acc, size_t f)
{
	if (f && *acc > SIZE_MAX / f / sizeof(double))
		return false;
	*acc *= f;
	return true;
}

/* Common checks of the four ops: op, H, Hin, E, L, B, T, the operand's
 * format and its packing along `packed_len` (E or L). Every index below is
 * a size_t product of H·L·E and B·T. */
static dg_status check(const dg_spec *spec, dg_op op, const void *a,
		       const void *b, const void *out, dg_fmt fmt,
		       bool fmt_is_weight, int batch, int time)
{
	size_t n = 1;

	if (!spec || !a || !b || !out || spec->op != op)
		return DG_ERR_INVALID_ARG;
	if (spec->heads <= 0 || spec->latent <= 0 || spec->embd <= 0)
		return DG_ERR_INVALID_ARG;
	if ((op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_LOWRANK_GRAD_WEIGHT) &&
	    spec->in_heads != 1 && spec->in_heads != spec->heads)
		return DG_ERR_INVALID_ARG;
	if (fmt_is_weight ? !weight_ok(fmt) : !act_ok(fmt))
		return DG_ERR_INVALID_ARG;
	int packed_len = (op == DG_OP_LOWRANK_GRAD_INPUT ||
			  op == DG_OP_LOWRANK_GRAD_WEIGHT)
				 ? spec->embd
				 : spec->latent;
	if (packed_len % per_word(fmt))
		return DG_ERR_INVALID_ARG;
	/* the gradients' formats (a field the op does not read is left at
	 * its f32 default by dg_spec_normalize, but a caller may not have
	 * normalized: only the fields the op reads are judged) */
	if ((op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_LOWRANK_GRAD_WEIGHT) &&
	    spec->src != DG_FMT_F32 && spec->src != DG_FMT_BF16)
		return DG_ERR_INVALID_ARG;
	if (op == DG_OP_DECODER_GRAD_INPUT && spec->out != DG_FMT_F32 && spec->out != DG_FMT_BF16)
		return DG_ERR_INVALID_ARG;
	if (batch < 0 || time < 0)
		return DG_ERR_INVALID_ARG;
	if (!mul_ok(&n, (size_t)batch) || !mul_ok(&n, (size_t)time) ||
	    !mul_ok(&n, (size_t)spec->heads) ||
	    !mul_ok(&n, (size_t)spec->latent) ||
	    !mul_ok(&n, (size_t)spec->embd))
		return DG_ERR_INVALID_ARG;
	return DG_OK;
}

/* --- the four GEMMs ------------------------------------------------------- */

/* What the four ops share before their sums: the call checked, the sizes,
 * whether a scale vector runs along the reduction (vec), the scalar scale
 * s (1 for a float operand or with vec), the operand decoded to floats and
 * the double accumulator. */
typedef struct gemm {
	size_t H, Hin, E, L, B, T;
	bool vec;
	double s;
	float *v;    /* the decoded operand */
	double *acc; /* its length is the op's (see gemm_begin) */
} gemm;

/* Checks the call of op (the operand `a` in spec->weight with a channel
 * scale, or in spec->act with a token scale), then decodes it and
 * allocates the accumulator. DG_OK: g holds both (free with gemm_end). */
static dg_status gemm_begin(const dg_spec *spec, dg_op op, const void *grad, const void *a,
		       const void *out, float scale, const float *sv, int batch, int time, gemm *g)
{
	const bool w_side = op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_DECODER_GRAD_INPUT;
	dg_status st = check(spec, op, grad, a, out,
			     spec ? (w_side ? spec->weight : spec->act) : DG_FMT_F32, w_side, batch,
			     time);
	size_t n, acc_n;

	if (st)
		return st;
	g->H = (size_t)spec->heads;
	g->Hin = (size_t)spec->in_heads;
	g->E = (size_t)spec->embd;
	g->L = (size_t)spec->latent;
	g->B = (size_t)batch;
	g->T = (size_t)time;
	const dg_fmt f = w_side ? spec->weight : spec->act;
	g->vec = is_code(f) && (w_side ? spec->wscale == DG_SCALE_CHANNEL
				       : spec->ascale == DG_SCALE_TOKEN);
	if (g->vec && !sv)
		return DG_ERR_INVALID_ARG;
	g->s = is_code(f) && !g->vec ? (double)scale : 1.0;
	switch (op) {
	case DG_OP_LOWRANK_GRAD_INPUT: /* w (H, L, E); acc one row of E */
		n = g->H * g->L * g->E;
		acc_n = g->E;
		break;
	case DG_OP_LOWRANK_GRAD_WEIGHT: /* x (B, Hin, T, E); acc one head's (L, E) */
		n = g->B * g->Hin * g->T * g->E;
		acc_n = g->L * g->E;
		break;
	case DG_OP_DECODER_GRAD_INPUT: /* w (E, H·L); acc one row of H·L */
		n = g->E * g->H * g->L;
		acc_n = g->H * g->L;
		break;
	default: /* y (B, H, T, L); acc (E, H·L) */
		n = g->B * g->H * g->T * g->L;
		acc_n = g->E * g->H * g->L;
		break;
	}
	g->v = decode_all(f, a, n);
	g->acc = malloc(acc_n * sizeof(*g->acc));
	if (!g->v || !g->acc) {
		free(g->v);
		free(g->acc);
		return DG_ERR_NOMEM;
	}
	return DG_OK;
}

static void gemm_end(gemm *g)
{
	free(g->v);
	free(g->acc);
}

dg_status dg_ref_lowrank_grad_input(const dg_spec *spec, const void *grad,
				    const void *w, float sw, float *grad_x,
				    int batch, int time)
{
	return dg__ref_lowrank_grad_input_v(spec, grad, w, sw, NULL, grad_x, batch, time);
}

/* A scale a channel (wscale=channel, sv one a row h·L + l of w) runs along
 * the reduction: each term's gradient is multiplied by it, in double. */
dg_status dg__ref_lowrank_grad_input_v(const dg_spec *spec, const void *grad, const void *w,
				       float sw, const float *sv, float *grad_x, int batch,
				       int time)
{
	gemm m;
	dg_status st = gemm_begin(spec, DG_OP_LOWRANK_GRAD_INPUT, grad, w, grad_x, sw, sv, batch,
			     time, &m);

	if (st)
		return st;
	const size_t H = m.H, Hin = m.Hin, E = m.E, L = m.L, B = m.B, T = m.T;
	const bool vec = m.vec;
	const double s = m.s;
	const float *wf = m.v; /* (H, L, E) */
	double *acc = m.acc;

	for (size_t b = 0; b < B; b++) {
		for (size_t i = 0; i < Hin; i++) {
			for (size_t t = 0; t < T; t++) {
				memset(acc, 0, E * sizeof(*acc));
				for (size_t h = 0; h < H; h++) {
					if (Hin != 1 && h != i)
						continue;
					const size_t g = ((b * H + h) * T + t) * L;

					for (size_t l = 0; l < L; l++) {
						const float *wr = wf + (h * L + l) * E;
						const float gl = dg__ref_plain_at(spec->src, grad, g + l);
						double gv = vec ? (double)gl * sv[h * L + l] : gl;

						for (size_t e = 0; e < E; e++)
							acc[e] += gv * wr[e];
					}
				}
				float *o = grad_x + ((b * Hin + i) * T + t) * E;

				for (size_t e = 0; e < E; e++)
					o[e] = (float)(s * acc[e]);
			}
		}
	}
	gemm_end(&m);
	return DG_OK;
}

dg_status dg_ref_lowrank_grad_weight(const dg_spec *spec, const void *grad,
				     const void *x, float sa, float *grad_w,
				     int batch, int time)
{
	return dg__ref_lowrank_grad_weight_v(spec, grad, x, sa, NULL, grad_w, batch, time);
}

/* A scale a token (ascale=token, sv one a row (b·Hin + hin)·T + t of x)
 * runs along the reduction: each term times it, in double. */
dg_status dg__ref_lowrank_grad_weight_v(const dg_spec *spec, const void *grad, const void *x,
					float sa, const float *sv, float *grad_w, int batch,
					int time)
{
	gemm m;
	dg_status st = gemm_begin(spec, DG_OP_LOWRANK_GRAD_WEIGHT, grad, x, grad_w, sa, sv, batch,
			     time, &m);

	if (st)
		return st;
	const size_t H = m.H, Hin = m.Hin, E = m.E, L = m.L, B = m.B, T = m.T;
	const bool vec = m.vec;
	const double s = m.s;
	const float *xf = m.v; /* (B, Hin, T, E) */
	double *acc = m.acc;   /* one head's (L, E) */

	for (size_t h = 0; h < H; h++) {
		size_t hin = Hin == 1 ? 0 : h;

		memset(acc, 0, L * E * sizeof(*acc));
		for (size_t b = 0; b < B; b++) {
			for (size_t t = 0; t < T; t++) {
				const size_t g = ((b * H + h) * T + t) * L;
				const float *xr = xf + ((b * Hin + hin) * T + t) * E;
				const double sr = vec ? (double)sv[(b * Hin + hin) * T + t] : 1.0;

				for (size_t l = 0; l < L; l++) {
					double gv = sr * dg__ref_plain_at(spec->src, grad, g + l);
					double *a = acc + l * E;

					for (size_t e = 0; e < E; e++)
						a[e] += gv * xr[e];
				}
			}
		}
		for (size_t i = 0; i < L * E; i++)
			grad_w[h * L * E + i] = (float)(s * acc[i]);
	}
	gemm_end(&m);
	return DG_OK;
}

dg_status dg_ref_decoder_grad_input(const dg_spec *spec, const float *grad,
				    const void *w, float sw, void *grad_y,
				    int batch, int time)
{
	return dg__ref_decoder_grad_input_v(spec, grad, w, sw, NULL, grad_y, batch, time);
}

/* wscale=channel: sv one an output channel d of w (E, H·L). */
dg_status dg__ref_decoder_grad_input_v(const dg_spec *spec, const float *grad, const void *w,
				       float sw, const float *sv, void *grad_y, int batch,
				       int time)
{
	gemm m;
	dg_status st = gemm_begin(spec, DG_OP_DECODER_GRAD_INPUT, grad, w, grad_y, sw, sv, batch,
			     time, &m);

	if (st)
		return st;
	const size_t H = m.H, E = m.E, L = m.L, B = m.B, T = m.T, HL = H * L;
	const bool vec = m.vec;
	const double s = m.s;
	const float *wf = m.v; /* (E, H·L) */
	double *acc = m.acc;

	for (size_t b = 0; b < B; b++) {
		for (size_t t = 0; t < T; t++) {
			const float *g = grad + (b * T + t) * E;

			memset(acc, 0, HL * sizeof(*acc));
			for (size_t d = 0; d < E; d++) {
				const float *wr = wf + d * HL;
				double gv = vec ? (double)g[d] * sv[d] : g[d];

				for (size_t j = 0; j < HL; j++)
					acc[j] += gv * wr[j];
			}
			for (size_t h = 0; h < H; h++) {
				const size_t o = ((b * H + h) * T + t) * L;

				for (size_t l = 0; l < L; l++) /* f32, then (bf16) once more */
					dg__ref_plain_store(spec->out, grad_y, o + l,
							    (float)(s * acc[h * L + l]));
			}
		}
	}
	gemm_end(&m);
	return DG_OK;
}

dg_status dg_ref_decoder_grad_weight(const dg_spec *spec, const float *grad,
				     const void *y, float sa, float *grad_w,
				     int batch, int time)
{
	return dg__ref_decoder_grad_weight_v(spec, grad, y, sa, NULL, grad_w, batch, time);
}

/* ascale=token: sv one a token b·T + t of y (over every head). */
dg_status dg__ref_decoder_grad_weight_v(const dg_spec *spec, const float *grad, const void *y,
					float sa, const float *sv, float *grad_w, int batch,
					int time)
{
	gemm m;
	dg_status st = gemm_begin(spec, DG_OP_DECODER_GRAD_WEIGHT, grad, y, grad_w, sa, sv, batch,
			     time, &m);

	if (st)
		return st;
	const size_t H = m.H, E = m.E, L = m.L, B = m.B, T = m.T, HL = H * L;
	const bool vec = m.vec;
	const double s = m.s;
	const float *yf = m.v; /* (B, H, T, L) */
	double *acc = m.acc;   /* (E, H·L) */

	memset(acc, 0, E * HL * sizeof(*acc));
	for (size_t b = 0; b < B; b++) {
		for (size_t t = 0; t < T; t++) {
			const float *g = grad + (b * T + t) * E;

			const double sr = vec ? (double)sv[b * T + t] : 1.0;

			for (size_t d = 0; d < E; d++) {
				double gv = sr * g[d];
				double *a = acc + d * HL;

				for (size_t h = 0; h < H; h++) {
					const float *yr = yf + ((b * H + h) * T + t) * L;

					for (size_t l = 0; l < L; l++)
						a[h * L + l] += gv * yr[l];
				}
			}
		}
	}
	for (size_t i = 0; i < E * HL; i++)
		grad_w[i] = (float)(s * acc[i]);
	gemm_end(&m);
	return DG_OK;
}

/* --- unpacking ------------------------------------------------------------ */

dg_status dg_ref_unpack_ternary(const uint32_t *words, int8_t *codes,
				size_t rows, int k)
{
	size_t nw;

	if (!words || !codes || k <= 0 || k % 16)
		return DG_ERR_INVALID_ARG;
	if (rows > SIZE_MAX / (size_t)k)
		return DG_ERR_INVALID_ARG;
	nw = rows * (size_t)k / 16;
	/* Refuse the pair 10 before writing anything. */
	for (size_t i = 0; i < nw; i++) {
		uint32_t u = words[i];

		if ((u >> 1) & ~u & 0x55555555u)
			return DG_ERR_CORRUPT;
	}
	for (size_t i = 0; i < nw; i++) {
		for (unsigned j = 0; j < 16; j++) {
			uint32_t bits = (words[i] >> (2 * j)) & 3u;

			codes[16 * i + j] = (int8_t)(bits == 1u ? 1 : bits == 3u ? -1 : 0);
		}
	}
	return DG_OK;
}

dg_status dg_ref_unpack_sign1(const uint32_t *words, int8_t *codes,
			      size_t rows, int k)
{
	size_t nw;

	if (!words || !codes || k <= 0 || k % 32)
		return DG_ERR_INVALID_ARG;
	if (rows > SIZE_MAX / (size_t)k)
		return DG_ERR_INVALID_ARG;
	nw = rows * (size_t)k / 32;
	for (size_t i = 0; i < nw; i++)
		for (unsigned j = 0; j < 32; j++)
			codes[32 * i + j] =
				(int8_t)((words[i] >> j) & 1u ? 1 : -1);
	return DG_OK;
}
