/*
 * Decoding from a state on the CPU (runtime/train/decode.c, dg_model_decode): greedy
 * decoding of 200 tokens after a prompt gives the same token ids as the
 * full forward recomputed over the whole context for every token
 * (dg_model_cpu_logits, no window: the context passes the T a model
 * trains at), and logits within f32 rounding of it, from the 0.02 init and
 * from weights scaled up as a trained model's are (peaked logits, sparse
 * activations); batched rows of different prompts and positions each as
 * their own sequence (every row at once, or one row continued alone); a
 * low-bit recipe's logits; and the refusals.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/rng.h"
#include "helpers.h"

/* The largest |a − b| over v logits, relative to the largest |b|. */
static double rel_err(const float *a, const float *b, int v)
{
	double e = 0, m = 1e-30;
	for (int i = 0; i < v; i++) {
		e = fmax(e, fabs((double)a[i] - b[i]));
		m = fmax(m, fabs((double)b[i]));
	}
	return e / m;
}

/* The logits after the n tokens of ctx by the full forward. */
static void full_logits(const dg_model_weights *w, const int32_t *ctx, int n, float *z)
{
	char msg[512];
	dg_model_batch b = { .idx = ctx, .b = 1, .t = n };
	cr_assert_eq(dg_model_cpu_logits(w, &b, n - 1, z, msg, sizeof(msg)), DG_OK, "%s", msg);
}

/* Greedy decoding of `len` tokens after a prompt of `np`, by the state
 * and by the full recompute: the same ids, logits within tol. */
static void greedy_equal(const dg_model_weights *w, int np, int len, double tol, uint64_t seed)
{
	char msg[512];
	const int V = w->config.vocab, n = np + len;
	int32_t *ctx = malloc((size_t)n * sizeof(int32_t));
	float *zs = malloc((size_t)V * sizeof(float)), *zf = malloc((size_t)V * sizeof(float));
	cr_assert(ctx && zs && zf);
	dg_rng r;
	dg_rng_seed(&r, seed);
	for (int i = 0; i < np; i++)
		ctx[i] = dg_rng_int(&r, 0, V - 1);
	dg_model_state *s;
	cr_assert_eq(dg_model_state_create(NULL, w, 1, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_decode(s, 0, ctx, np, true, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	double worst = 0;
	for (int k = np; k < n; k++) {
		full_logits(w, ctx, k, zf);
		double e = rel_err(zs, zf, V);
		worst = fmax(worst, e);
		cr_assert_lt(e, tol, "after %d tokens: the state's logits are %g off the full forward's", k, e);
		int a = dg_test_argmax(zs, V), b = dg_test_argmax(zf, V);
		cr_assert_eq(a, b, "token %d (context %d): the state decodes %d, the full forward %d", k - np,
			     k, a, b);
		ctx[k] = a;
		if (k + 1 < n)
			cr_assert_eq(dg_model_decode(s, -1, &ctx[k], 1, false, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	}
	cr_log_info("greedy %d tokens after %d: worst relative logit error %.3g", len, np, worst);
	dg_model_state_destroy(s);
	free(ctx);
	free(zs);
	free(zf);
}

Test(model_decode, greedy_equals_full_recompute_init)
{
	dg_model_weights *w = dg_test_tiny_weights("f32", 3, 1.0f);
	greedy_equal(w, 9, 200, 1e-4, 11);
	dg_model_weights_destroy(w);
}

Test(model_decode, greedy_equals_full_recompute_trained_like, .timeout = 600)
{
	/* past a training T (the prompt alone is longer than a chunk of the
	 * prefill: two chunks and a part) */
	dg_model_weights *w = dg_test_tiny_weights("f32", 5, 25.0f);
	greedy_equal(w, 150, 200, 1e-4, 13);
	dg_model_weights_destroy(w);
}

Test(model_decode, lowbit_recipe_logits)
{
	/* w8a8: activations quantized a token; a code may round the other way
	 * where the state's sums differ in their last bits, so the logits are
	 * compared loosely, at a short context */
	char msg[512];
	dg_model_weights *w = dg_test_tiny_weights("w8a8", 7, 25.0f);
	const int V = w->config.vocab, n = 24;
	int32_t ctx[24];
	float zs[256], zf[256];
	dg_rng r;
	dg_rng_seed(&r, 17);
	for (int i = 0; i < n; i++)
		ctx[i] = dg_rng_int(&r, 0, V - 1);
	dg_model_state *s;
	cr_assert_eq(dg_model_state_create(NULL, w, 1, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_decode(s, 0, ctx, 12, true, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int k = 12; k <= n; k++) {
		full_logits(w, ctx, k, zf);
		double e = rel_err(zs, zf, V);
		cr_assert_lt(e, 0.05, "w8a8, after %d tokens: logits %g off", k, e);
		if (k < n)
			cr_assert_eq(dg_model_decode(s, -1, &ctx[k], 1, false, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	}
	dg_model_state_destroy(s);
	dg_model_weights_destroy(w);
}

Test(model_decode, batched_rows_are_their_own_sequences)
{
	/* three rows, prompts of 3, 40 and 70 tokens (the last in two chunks),
	 * then 20 tokens each in lock-step: every row's logits as its own
	 * context's full forward */
	char msg[512];
	dg_model_weights *w = dg_test_tiny_weights("f32", 9, 25.0f);
	const int V = w->config.vocab, B = 3, len = 20;
	const int np[3] = { 3, 40, 70 };
	int32_t ctx[3][96], tok[3];
	float *zs = malloc((size_t)B * V * sizeof(float)), zf[256];
	cr_assert(zs);
	dg_rng r;
	dg_rng_seed(&r, 19);
	dg_model_state *s;
	cr_assert_eq(dg_model_state_create(NULL, w, B, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int b = 0; b < B; b++) {
		for (int i = 0; i < np[b] + len; i++)
			ctx[b][i] = dg_rng_int(&r, 0, V - 1);
		/* a row prefilled twice restarts: the first prompt leaves nothing */
		cr_assert_eq(dg_model_decode(s, b, ctx[b] + 1, 5, true, zs + (size_t)b * V, msg, sizeof(msg)), DG_OK, "%s",
			     msg);
		cr_assert_eq(dg_model_decode(s, b, ctx[b], np[b], true, zs + (size_t)b * V, msg, sizeof(msg)),
			     DG_OK, "%s", msg);
	}
	for (int k = 0; k <= len; k++) {
		for (int b = 0; b < B; b++) {
			full_logits(w, ctx[b], np[b] + k, zf);
			double e = rel_err(zs + (size_t)b * V, zf, V);
			cr_assert_lt(e, 1e-4, "row %d after %d tokens: %g off", b, np[b] + k, e);
			tok[b] = ctx[b][np[b] + k];
		}
		if (k < len)
			cr_assert_eq(dg_model_decode(s, -1, tok, 1, false, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	}
	dg_model_state_destroy(s);
	dg_model_weights_destroy(w);
	free(zs);
}

Test(model_decode, every_row_at_once_and_a_row_continued)
{
	/* two rows restarted together with prompts of 10 (row -1, n 10), row
	 * 1 continued with 3 more tokens alone, then a token each: each row's
	 * logits as its own context's full forward */
	char msg[512];
	dg_model_weights *w = dg_test_tiny_weights("f32", 21, 25.0f);
	const int V = w->config.vocab;
	int32_t ctx[2][16], tok[2];
	float zs[2 * 256], zf[256];
	dg_rng r;
	dg_rng_seed(&r, 23);
	for (int b = 0; b < 2; b++)
		for (int i = 0; i < 16; i++)
			ctx[b][i] = dg_rng_int(&r, 0, V - 1);
	int32_t prompts[2][10];
	memcpy(prompts[0], ctx[0], sizeof(prompts[0]));
	memcpy(prompts[1], ctx[1], sizeof(prompts[1]));
	dg_model_state *s;
	cr_assert_eq(dg_model_state_create(NULL, w, 2, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_decode(s, -1, &prompts[0][0], 10, true, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	for (int b = 0; b < 2; b++) {
		full_logits(w, ctx[b], 10, zf);
		cr_assert_lt(rel_err(zs + b * V, zf, V), 1e-4, "row %d after its prompt", b);
	}
	cr_assert_eq(dg_model_decode(s, 1, &ctx[1][10], 3, false, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	full_logits(w, ctx[1], 13, zf);
	cr_assert_lt(rel_err(zs, zf, V), 1e-4, "row 1 continued");
	tok[0] = ctx[0][10];
	tok[1] = ctx[1][13];
	cr_assert_eq(dg_model_decode(s, -1, tok, 1, false, zs, msg, sizeof(msg)), DG_OK, "%s", msg);
	full_logits(w, ctx[0], 11, zf);
	cr_assert_lt(rel_err(zs, zf, V), 1e-4, "row 0 at 11");
	full_logits(w, ctx[1], 14, zf);
	cr_assert_lt(rel_err(zs + V, zf, V), 1e-4, "row 1 at 14");
	dg_model_state_destroy(s);
	dg_model_weights_destroy(w);
}

Test(model_decode, refusals)
{
	char msg[512];
	dg_model_weights *w = dg_test_tiny_weights("f32", 1, 1.0f), *bf = dg_test_tiny_weights("bf16", 1, 1.0f);
	dg_model_state *s;
	float z[2 * 256];
	int32_t tok[2] = { 1, 256 };
	cr_assert_eq(dg_model_state_create(NULL, w, 0, &s, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_model_state_create(NULL, bf, 1, &s, msg, sizeof(msg)), DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "bf16"), "%s", msg);
	cr_assert_eq(dg_model_state_create(NULL, w, 2, &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_model_decode(s, -1, tok, 1, false, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "tokens[1] = 256"), "%s", msg);
	cr_assert_eq(dg_model_decode(s, 2, tok, 1, true, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_model_decode(s, 0, tok, 0, true, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_model_decode(s, -2, tok, 1, true, z, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	dg_model_state_destroy(s);
	dg_model_state_destroy(NULL);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(bf);
}
