/*
 * CPU reference of decoder_fwd (runtime/ref/ref_ops.h):
 *
 *   out[b,0,t,d] = s · Σ_h Σ_l y[b,h,t,l] · w[d, h·L + l]
 *
 * It walks the storage the kernel reads (templates/decoder.lua): y in the
 * act storage (i8x4 words along L for codes, uint8pos lanes unsigned), w in
 * the weight storage packed along H·L (i8x4, ternary 16 a word, sign1 32 a
 * word, f32, bf16).
 *
 * Integer × integer: the exact sum (kept to int32 like the kernel's
 * accumulators; it never wraps below 2^31 / 127² ≈ 133000 terms),
 * y = (float)sum · (sa·sw). Otherwise each operand is converted to float and
 * summed in double (exact products, one rounding to float at the end),
 * y = sum · (sa | sw | 1): the kernel's order differs, so compare with a
 * tolerance. (A float running sum over K = H·L = 32768 terms lost ~1e-4,
 * which the deep model amplified; see lowrank.c dot_float.)
 */
#include "runtime/ref/ref_ops.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/ref/ref_int.h"

static bool weight_is_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

static dg_status check(const dg_spec *spec, const dg_ref_decoder_args *a)
{
	if (!spec || !a || !a->y || !a->w || !a->out)
		return DG_ERR_INVALID_ARG;
	if (spec->op != DG_OP_DECODER_FWD)
		return DG_ERR_INVALID_ARG;
	if (spec->heads <= 0 || spec->latent <= 0 || spec->embd <= 0)
		return DG_ERR_INVALID_ARG;
	if (!(spec->act == DG_FMT_F32 || spec->act == DG_FMT_BF16 ||
	      dg__ref_is_act_code(spec->act)))
		return DG_ERR_INVALID_ARG;
	if (!(spec->weight == DG_FMT_F32 || spec->weight == DG_FMT_BF16 ||
	      weight_is_code(spec->weight)))
		return DG_ERR_INVALID_ARG;
	if (spec->out != DG_FMT_F32 && spec->out != DG_FMT_BF16)
		return DG_ERR_INVALID_ARG;
	if (dg__ref_is_act_code(spec->act) && spec->latent % 4)
		return DG_ERR_INVALID_ARG;
	if ((spec->weight == DG_FMT_INT8 && spec->latent % 4) ||
	    (spec->weight == DG_FMT_TERNARY && spec->latent % 16) ||
	    (spec->weight == DG_FMT_SIGN1 && spec->latent % 32))
		return DG_ERR_INVALID_ARG;
	if (a->batch < 0 || a->time < 0)
		return DG_ERR_INVALID_ARG;
	/* every index is a size_t product of these; keep them far from overflow */
	double n = (double)a->batch * a->time * spec->heads * spec->latent *
		   spec->embd;
	if (n > 1e17)
		return DG_ERR_INVALID_ARG;
	return DG_OK;
}

dg_status dg_ref_decoder_fwd(const dg_spec *spec,
			     const dg_ref_decoder_args *args)
{
	dg_status st = check(spec, args);
	size_t H, L, E, B, T, K;
	bool act_code, w_code, int_path;
	float s;
	int32_t *wi = NULL, *yi = NULL; /* (E, K) and (K) decoded, int path */
	float *wf = NULL, *yf = NULL;   /* the same, float path */

	if (st)
		return st;
	H = (size_t)spec->heads;
	L = (size_t)spec->latent;
	E = (size_t)spec->embd;
	B = (size_t)args->batch;
	T = (size_t)args->time;
	K = H * L;
	act_code = dg__ref_is_act_code(spec->act);
	w_code = weight_is_code(spec->weight);
	int_path = act_code && w_code;
	const float *sa_v = act_code && spec->ascale == DG_SCALE_TOKEN ? args->sa_v : NULL;
	const float *sw_v = w_code && spec->wscale == DG_SCALE_CHANNEL ? args->sw_v : NULL;
	if ((act_code && spec->ascale == DG_SCALE_TOKEN && !sa_v) ||
	    (w_code && spec->wscale == DG_SCALE_CHANNEL && !sw_v))
		return DG_ERR_INVALID_ARG;
	if (int_path) {
		s = args->sa * args->sw;
		wi = malloc(E * K * sizeof(*wi));
		yi = malloc(K * sizeof(*yi));
		if (!wi || !yi) {
			st = DG_ERR_NOMEM;
			goto out;
		}
	} else {
		s = act_code ? args->sa : w_code ? args->sw : 1.0f;
		wf = malloc(E * K * sizeof(*wf));
		yf = malloc(K * sizeof(*yf));
		if (!wf || !yf) {
			st = DG_ERR_NOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < E * K; i++) {
		if (int_path)
			wi[i] = dg__ref_code_at(spec->weight, args->w, i);
		else if (w_code)
			wf[i] = (float)dg__ref_code_at(spec->weight, args->w, i);
		else
			wf[i] = dg__ref_plain_at(spec->weight, args->w, i);
	}
	for (size_t b = 0; b < B; b++) {
		for (size_t t = 0; t < T; t++) {
			/* row (b, t) of A: the H segments of L codes */
			for (size_t h = 0; h < H; h++) {
				size_t base = ((b * H + h) * T + t) * L;

				for (size_t l = 0; l < L; l++) {
					size_t k = h * L + l;

					if (int_path)
						yi[k] = dg__ref_code_at(spec->act, args->y, base + l);
					else if (act_code)
						yf[k] = (float)dg__ref_code_at(spec->act, args->y, base + l);
					else
						yf[k] = dg__ref_plain_at(spec->act, args->y,
									 base + l);
				}
			}
			for (size_t d = 0; d < E; d++) {
				size_t o = (b * T + t) * E + d;
				float y, s_e = s;

				if (sa_v || sw_v) { /* a scale a token / a channel */
					const float sa_r = sa_v ? sa_v[b * T + t] : args->sa;
					const float sw_c = sw_v ? sw_v[d] : args->sw;
					s_e = int_path ? sa_r * sw_c : act_code ? sa_r : sw_c;
				}

				if (int_path) {
					int64_t acc = 0;
					uint32_t u;
					int32_t r;

					for (size_t k = 0; k < K; k++)
						acc += (int64_t)yi[k] * wi[d * K + k];
					u = (uint32_t)acc;
					memcpy(&r, &u, sizeof(r));
					y = (float)r * s_e;
				} else {
					double acc = 0.0;

					for (size_t k = 0; k < K; k++)
						acc += (double)yf[k] * wf[d * K + k];
					y = (float)acc * s_e;
				}
				if (spec->out == DG_FMT_F32)
					((float *)args->out)[o] = y;
				else
					((uint16_t *)args->out)[o] =
						dg_ref_f32_to_bf16(y);
			}
		}
	}
out:
	free(wi);
	free(yi);
	free(wf);
	free(yf);
	return st;
}
