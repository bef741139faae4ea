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
 *     vocabulary;
 *   - the token's work replayed as a CUDA graph (the default) against the
 *     same decoder run op by op (dg__model_decode_graph off): the logits
 *     bit for bit, a prompt and 30 tokens of 3 rows, f32 and bf16; and
 *     each the host's double sum of x_final times lm_head bit for bit
 *     (dg_model_logits's numbers);
 *   - a prompt consumed by windows (DRAGON_PREFILL_WINDOW=16: 4 windows, then
 *     12 tokens one at a time, the last giving the logits) against the same
 *     prompt a token at a time (=0), 3 rows, f32, bf16 and w8a8: the logits after it and after 20
 *     more tokens within 1e-4 (f32) or 5e-2 of the largest (how many are
 *     equal bit for bit is printed), and the full forward's after the
 *     prompt within the same; a window of 1 refused by name;
 *   - lmhead_logits (the logits op) against dg_ref_lmhead_logits bit for
 *     bit, f32 and bf16 x, rows 1 to 130, a vocabulary not a multiple of
 *     the block; the reference by hand first (a sum f32 would lose).
 * Skip without a device (gh_open); fail instead with DRAGON_REQUIRE_GPU=1.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/fmt.h"
#include "dragon/model.h"
#include "dragon/ops.h"
#include "dragon/rng.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"
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

/* B rows: a prompt of NP tokens by windows of 16 and a token at a time,
 * then LEN tokens more, both against each other; the full forward's after
 * the prompt. */
static void window_case(dg_device *dev, const char *preset, double tol)
{
	enum { B = 3, NP = 76, LEN = 20 };
	dg_model_weights *w = dg_test_tiny_weights(preset, 7, 25.0f);
	dg_model *full, *win, *one;
	cr_assert_eq(dg_model_create(dev, w, B, TMAX, &full), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	cr_assert_eq(setenv("DRAGON_PREFILL_WINDOW", "16", 1), 0);
	cr_assert_eq(dg__model_decoder_create(dev, w, B, &win), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	cr_assert_eq(setenv("DRAGON_PREFILL_WINDOW", "0", 1), 0);
	cr_assert_eq(dg__model_decoder_create(dev, w, B, &one), DG_OK, "%s: %s", preset, dg_device_errmsg(dev));
	unsetenv("DRAGON_PREFILL_WINDOW");
	static int32_t ctx[B * TMAX], prompt[B * NP], tok[B];
	static float za[B * V], zb[B * V], zf[B * V];
	dg_rng r;
	dg_rng_seed(&r, 29);
	for (int i = 0; i < B * TMAX; i++)
		ctx[i] = dg_rng_int(&r, 0, V - 1);
	for (int b = 0; b < B; b++)
		memcpy(prompt + b * NP, ctx + b * TMAX, NP * sizeof(int32_t));
	cr_assert_eq(dg__model_decode(win, prompt, NP, true, za), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode(one, prompt, NP, true, zb), DG_OK, "%s", dg_device_errmsg(dev));
	full_logits(dev, full, B, ctx, NP, zf);
	int same = 0, all = 0;
	double worst = 0;
	for (int k = 0; k <= LEN; k++) {
		for (int b = 0; b < B; b++) {
			double e = rel_err(za + b * V, zb + b * V);
			worst = fmax(worst, e);
			cr_assert_lt(e, tol, "%s row %d, %d tokens after the prompt: windows and tokens %g apart", preset,
				     b, k, e);
			if (k == 0)
				cr_assert_lt(rel_err(za + b * V, zf + b * V), tol, "%s row %d: the windows' logits off the full forward's",
					     preset, b);
			same += memcmp(za + b * V, zb + b * V, V * sizeof(float)) == 0;
			all++;
			tok[b] = ctx[b * TMAX + NP + k];
		}
		if (k == LEN)
			break;
		cr_assert_eq(dg__model_decode(win, tok, 1, false, za), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg__model_decode(one, tok, 1, false, zb), DG_OK, "%s", dg_device_errmsg(dev));
	}
	printf("gpu decode %s: a prompt of %d by windows of 16 against a token at a time: worst %.3g, %d of %d logit rows bit for bit\n",
	       preset, NP, worst, same, all);
	dg_model_destroy(win);
	dg_model_destroy(one);
	dg_model_destroy(full);
	dg_model_weights_destroy(w);
}

Test(gpu_decode, prompt_windows_equal_tokens, .timeout = 600)
{
	dg_device *dev = gh_open();
	window_case(dev, "f32", 1e-4);
	window_case(dev, "bf16", 5e-2);
	window_case(dev, "w8a8", 5e-2);
	/* a window of one token is refused, naming the variable */
	dg_model_weights *w = dg_test_tiny_weights("f32", 7, 25.0f);
	dg_model *m = NULL;
	cr_assert_eq(setenv("DRAGON_PREFILL_WINDOW", "1", 1), 0);
	cr_assert_eq(dg__model_decoder_create(dev, w, 1, &m), DG_ERR_INVALID_ARG);
	unsetenv("DRAGON_PREFILL_WINDOW");
	cr_assert(strstr(dg_device_errmsg(dev), "DRAGON_PREFILL_WINDOW"), "%s", dg_device_errmsg(dev));
	dg_model_weights_destroy(w);
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

/* The host's logits of decoder m's x_final (B rows): Σ_k x·lm_head in
 * double, k in order (dg_model_logits's sums). */
static void host_logits(dg_device *dev, dg_model *m, const dg_model_weights *w, int B, float *z)
{
	enum { DMAX = 64 };
	const int D = w->config.embd;
	cr_assert_leq(D, DMAX);
	dg_fmt f;
	dg_dptr xd = dg_model_hidden_addr(m, &f);
	const size_t es = f == DG_FMT_BF16 ? 2 : 4;
	uint8_t raw[4 * DMAX * 4];
	float x[4 * DMAX];
	cr_assert_leq(B, 4);
	gh_download(dev, raw, xd, (size_t)B * D * es);
	for (int i = 0; i < B * D; i++) {
		if (es == 2) {
			uint16_t h;
			memcpy(&h, raw + 2 * i, 2);
			x[i] = dg_bf16_to_f32(h);
		} else {
			memcpy(&x[i], raw + 4 * i, 4);
		}
	}
	dg_ref_lmhead_logits(x, w->params[DG_PARAM_LM_HEAD], B, D, V, z);
}

static void graph_against_eager(dg_device *dev, const char *preset)
{
	enum { B = 3, NP = 7, LEN = 30 };
	dg_model_weights *w = dg_test_tiny_weights(preset, 31, 25.0f);
	dg_model *eager, *graph;
	cr_assert_eq(dg__model_decoder_create(dev, w, B, &eager), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decoder_create(dev, w, B, &graph), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode_graph(eager, false), DG_OK);
	cr_assert_eq(dg__model_decode_graph(graph, true), DG_OK);
	static int32_t prompt[B * NP], tok[B];
	static float ze[B * V], zg[B * V], zh[B * V];
	dg_rng r;
	dg_rng_seed(&r, 37);
	for (int i = 0; i < B * NP; i++)
		prompt[i] = dg_rng_int(&r, 0, V - 1);
	/* the prompt: token 1 eager, the graph captured at token 2, then replayed */
	cr_assert_eq(dg__model_decode(eager, prompt, NP, true, ze), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode(graph, prompt, NP, true, zg), DG_OK, "%s", dg_device_errmsg(dev));
	for (int k = 0; k <= LEN; k++) {
		cr_assert(memcmp(ze, zg, sizeof(ze)) == 0, "%s after %d tokens: the graph's logits are not the eager ones",
			  preset, NP + k);
		host_logits(dev, graph, w, B, zh);
		cr_assert(memcmp(zg, zh, sizeof(zh)) == 0,
			  "%s after %d tokens: the device's logits are not the host's double sums of x_final", preset,
			  NP + k);
		for (int b = 0; b < B; b++)
			tok[b] = dg_rng_int(&r, 0, V - 1);
		if (k == LEN)
			break;
		cr_assert_eq(dg__model_decode(eager, tok, 1, false, ze), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg__model_decode(graph, tok, 1, false, zg), DG_OK, "%s", dg_device_errmsg(dev));
	}
	/* a restart replays the same graph from an empty state */
	cr_assert_eq(dg__model_decode(eager, prompt, NP, true, ze), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg__model_decode(graph, prompt, NP, true, zg), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert(memcmp(ze, zg, sizeof(ze)) == 0, "%s: after a restart the graph's logits are not the eager ones",
		  preset);
	printf("gpu decode %s: graph replay = eager, bit for bit, %d tokens of %d rows\n", preset, NP + LEN, B);
	dg_model_destroy(eager);
	dg_model_destroy(graph);
	dg_model_weights_destroy(w);
}

Test(gpu_decode, graph_replay_equals_eager_bit_for_bit, .timeout = 600)
{
	dg_device *dev = gh_open();
	graph_against_eager(dev, "f32");
	graph_against_eager(dev, "bf16");
	gh_close(dev);
}

/* lmhead_logits of rows R of E against the reference, bit for bit. */
static void logits_case(dg_device *dev, dg_fmt src, int R, int E, int NV)
{
	size_t xb;
	void *x = gh_rand_storage(src, (size_t)R * E, &xb);
	float *w = gh_rand_storage(DG_FMT_F32, (size_t)E * NV, NULL);
	float *xf = gh_xmalloc((size_t)R * E * sizeof(float));
	float *want = gh_xmalloc((size_t)R * NV * sizeof(float)), *got = gh_xmalloc((size_t)R * NV * sizeof(float));
	for (size_t i = 0; i < (size_t)R * E; i++)
		xf[i] = src == DG_FMT_BF16 ? dg_bf16_to_f32(((uint16_t *)x)[i]) : ((float *)x)[i];
	dg_ref_lmhead_logits(xf, w, R, E, NV, want);
	dg_spec s;
	dg_spec_init(&s, DG_OP_LMHEAD_LOGITS);
	s.src = src;
	s.embd = E;
	s.vocab = NV;
	dg_device_info info;
	dg_device_info_get(dev, &info);
	s.arch = info.sm;
	dg_spec_normalize(&s);
	dg_tensor tx = dg_tensor_2d("x", src, gh_upload(dev, x, xb), R, E);
	dg_tensor tw = dg_tensor_2d("w", DG_FMT_F32, gh_upload(dev, w, (size_t)E * NV * 4), E, NV);
	dg_tensor tz = dg_tensor_2d("logits", DG_FMT_F32, gh_alloc_ff(dev, (size_t)R * NV * 4), R, NV);
	dg_lmhead_logits_args a = { .x = &tx, .w = &tw, .logits = &tz };
	cr_assert_eq(dg_lmhead_logits(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, tz.data, (size_t)R * NV * 4);
	char what[96];
	snprintf(what, sizeof(what), "lmhead_logits %s R=%d E=%d V=%d", dg_fmt_name(src), R, E, NV);
	gh_expect_bytes(what, got, want, (size_t)R * NV * 4);
	free(x);
	free(w);
	free(xf);
	free(want);
	free(got);
}

/* (the suite's one timeout: a test of another timeout in the same binary
 * makes Criterion leak 48 bytes under ASan) */
Test(gpu_decode, lmhead_logits_is_the_double_sum, .timeout = 600)
{
	dg_device *dev = gh_open();
	/* by hand: (1, 2)·((3, 4), (5, 6)) = (13, 16); and 1·1e8 + 1·1 + 1·(−1e8)
	 * = 1 in double, where f32 would give 0 (1e8 + 1 rounds to 1e8) */
	const float x[3] = { 1, 2, 0 }, w[6] = { 3, 4, 5, 6, 0, 0 };
	float z[2];
	dg_ref_lmhead_logits(x, w, 1, 3, 2, z);
	cr_assert(z[0] == 13.0f && z[1] == 16.0f, "(%g, %g), not (13, 16)", z[0], z[1]);
	const float x1[3] = { 1, 1, 1 }, w1[3] = { 1e8f, 1.0f, -1e8f };
	dg_ref_lmhead_logits(x1, w1, 1, 3, 1, z);
	cr_assert(z[0] == 1.0f, "%g, not 1: the sum is not in double", z[0]);

	gh_seed(41);
	const int rows[] = { 1, 3, 64, 130 };
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		logits_case(dev, DG_FMT_F32, rows[i], 256, 256);
		logits_case(dev, DG_FMT_BF16, rows[i], 256, 256);
	}
	logits_case(dev, DG_FMT_BF16, 5, 32, 50); /* V past the last block's columns */
	logits_case(dev, DG_FMT_F32, 2, 4, 300);
	gh_close(dev);
}
