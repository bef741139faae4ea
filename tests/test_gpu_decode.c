/*
 * Decoding from a state on the GPU (runtime/train/gpu_decode.c): a decoder
 * of b rows against the GPU model's full forward recomputed over the
 * whole context for every token (dg_model_logits at (b, T), T past the
 * context), at a tiny config (2 layers, D 32, H 2, N 64) with weights
 * scaled as a trained model's (peaked logits):
 *
 *   - f32: greedy decoding of 200 tokens after a prompt of 9 gives the same
 *     ids, the logits within 1e-3 of the largest; and the CPU decoder's
 *     logits (dg_model_decode on the CPU) within the same bound;
 *   - bf16 and w8a8: the same 40 tokens fed to both (teacher forcing), the
 *     logits within 5e-2 of the largest (bf16 rounding, and codes that may
 *     round the other way between the two forms' sums);
 *   - three rows at once, restarted with their prompts, then in lock-step,
 *     each row its own full forward's; a restart empties the state;
 *   - refusals: a model planned for batches, a token outside the
 *     vocabulary.
 * Skip without a device (gh_open); fail instead with DRAGON_REQUIRE_GPU=1.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/rng.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/train/model_int.h"

enum { V = 256, TMAX = 256 };

static double rel_err(const float *a, const float *b)
{
	double e = 0, m = 1e-30;
	for (int i = 0; i < V; i++) {
		e = fmax(e, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return e / m;
}

/* The full model's logits after the first n tokens of each of B rows
 * (ctx row r at ctx + r·TMAX), the tail padded. */
static void full_logits(dg_device *dev, dg_model *full, int B, const int32_t *ctx, int n, float *z)
{
	static int32_t row[4 * TMAX];
	memset(row, 0, sizeof(row));
	for (int r = 0; r < B; r++)
		memcpy(row + r * TMAX, ctx + r * TMAX, (size_t)n * sizeof(int32_t));
	dg_model_batch bt = { .idx = row, .b = B, .t = TMAX };
	cr_assert_eq(dg_model_logits(full, &bt, n - 1, z), DG_OK, "%s", dg_device_errmsg(dev));
}

/* len tokens after a prompt of np: greedy (tokens from the decoder,
 * checked to be the full forward's), else teacher-forced random ones. */
static void run_case(dg_device *dev, const char *preset, int np, int len, bool greedy, double tol)
{
	char msg[512];
	dg_model_weights *w = dg_test_tiny_weights(preset, 5, 25.0f);
	dg_model *full, *dec;
	cr_assert_eq(dg_model_create(dev, w, 1, TMAX, &full), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decoder_create(dev, w, 1, &dec), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	const bool cpu = strcmp(preset, "f32") == 0;
	dg_model_state *cs = NULL;
	if (cpu)
		cr_assert_eq(dg_model_state_create(NULL, w, 1, &cs, msg, sizeof(msg)), DG_OK, "%s", msg);
	static int32_t ctx[TMAX];
	static float zd[V], zf[V], zc[V];
	dg_rng r;
	dg_rng_seed(&r, 23);
	for (int i = 0; i < np + len; i++)
		ctx[i] = dg_rng_int(&r, 0, V - 1);
	cr_assert_eq(dg__model_decode(dec, ctx, np, true, zd), DG_OK, "%s", dg_device_errmsg(dev));
	if (cpu)
		cr_assert_eq(dg_model_decode(cs, 0, ctx, np, true, zc, msg, sizeof(msg)), DG_OK, "%s", msg);
	double worst = 0;
	for (int k = np; k < np + len; k++) {
		full_logits(dev, full, 1, ctx, k, zf);
		double e = rel_err(zd, zf);
		worst = fmax(worst, e);
		cr_assert_lt(e, tol, "%s after %d tokens: the decoder's logits %g off the full forward's", preset, k, e);
		if (cpu)
			cr_assert_lt(rel_err(zc, zf), tol, "%s after %d tokens: the CPU decoder's %g off", preset, k,
				     rel_err(zc, zf));
		if (greedy) {
			int a = dg_test_argmax(zd, V), b = dg_test_argmax(zf, V);
			cr_assert_eq(a, b, "%s token %d: the decoder %d, the full forward %d", preset, k - np, a, b);
			ctx[k] = a;
		}
		cr_assert_eq(dg__model_decode(dec, &ctx[k], 1, false, zd), DG_OK, "%s", dg_device_errmsg(dev));
		if (cpu)
			cr_assert_eq(dg_model_decode(cs, -1, &ctx[k], 1, false, zc, msg, sizeof(msg)), DG_OK, "%s", msg);
	}
	printf("gpu decode %s: %d tokens after %d, worst relative logit error %.3g\n", preset, len, np, worst);
	dg_model_state_destroy(cs);
	dg_model_destroy(dec);
	dg_model_destroy(full);
	dg_model_weights_destroy(w);
}

Test(gpu_decode, greedy_f32_equals_full_recompute, .timeout = 600)
{
	dg_device *dev = gh_open();
	run_case(dev, "f32", 9, 200, true, 1e-3);
	gh_close(dev);
}

Test(gpu_decode, bf16_and_w8a8_logits, .timeout = 600)
{
	dg_device *dev = gh_open();
	run_case(dev, "bf16", 9, 40, false, 5e-2);
	run_case(dev, "w8a8", 9, 40, false, 5e-2);
	gh_close(dev);
}

Test(gpu_decode, batched_rows_and_restart, .timeout = 600)
{
	dg_device *dev = gh_open();
	enum { B = 3, NP = 7, LEN = 12 };
	dg_model_weights *w = dg_test_tiny_weights("f32", 9, 25.0f);
	dg_model *full, *dec;
	cr_assert_eq(dg_model_create(dev, w, B, TMAX, &full), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decoder_create(dev, w, B, &dec), DG_OK, "%s", dg_device_errmsg(dev));
	static int32_t ctx[B * TMAX], prompt[B * NP], tok[B];
	static float zd[B * V], zf[B * V];
	dg_rng r;
	dg_rng_seed(&r, 29);
	for (int i = 0; i < B * TMAX; i++)
		ctx[i] = dg_rng_int(&r, 0, V - 1);
	for (int b = 0; b < B; b++)
		memcpy(prompt + b * NP, ctx + b * TMAX, NP * sizeof(int32_t));
	/* a first run left behind: the restart empties it */
	cr_assert_eq(dg__model_decode(dec, prompt, NP, true, zd), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode(dec, prompt, NP, true, zd), DG_OK, "%s", dg_device_errmsg(dev));
	for (int k = NP; k < NP + LEN; k++) {
		full_logits(dev, full, B, ctx, k, zf);
		for (int b = 0; b < B; b++) {
			double e = rel_err(zd + b * V, zf + b * V);
			cr_assert_lt(e, 1e-3, "row %d after %d tokens: %g off", b, k, e);
			tok[b] = ctx[b * TMAX + k];
		}
		cr_assert_eq(dg__model_decode(dec, tok, 1, false, zd), DG_OK, "%s", dg_device_errmsg(dev));
	}
	/* refusals */
	tok[1] = V;
	cr_assert_eq(dg__model_decode(dec, tok, 1, false, zd), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "tokens[1]"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode(full, tok, 1, false, zd), DG_ERR_INVALID_ARG);
	dg_model_destroy(dec);
	dg_model_destroy(full);
	dg_model_weights_destroy(w);
	gh_close(dev);
}
