/*
 * The next token from logits (dragon/sample.h dg_sample_draw), the rule
 * `dragon sample` and the Python package's generate share:
 *   - temperature 0 takes the largest logit, the smaller id of a tie, and
 *     draws nothing from the stream; top-k 1 takes it too, with one draw;
 *   - a draw at temperature 1 over logits ln 1, ln 3 takes the second 3/4
 *     of the time (4000 draws, within 0.03), and a top-k of 1 among them
 *     never the first; a temperature of 2 flattens it to 1/(1 + √3);
 *   - the same stream state gives the same token;
 *   - a logit that is not finite is refused naming it, and so are bad
 *     arguments.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "dragon/sample.h"

static char msg[256];

Test(sample, greedy_top_k_and_ties)
{
	const float z[5] = { 0.5f, 2.0f, -1.0f, 2.0f, 1.0f };
	dg_rng r, r0;
	dg_rng_seed(&r, 3);
	r0 = r;
	int32_t t = -1;
	cr_assert_eq(dg_sample_draw(z, 5, 0.0, 40, &r, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(t, 1, "the smaller id of the tie, got %d", t);
	cr_assert_eq(r.state, r0.state, "greedy drew from the stream");
	cr_assert_eq(dg_sample_draw(z, 5, 1.0, 1, &r, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(t, 1);
	cr_assert_neq(r.state, r0.state, "a draw takes one value of the stream");
}

Test(sample, draws_follow_the_softmax)
{
	const float z[3] = { 0.0f, (float)log(3.0), -50.0f };
	dg_rng r;
	dg_rng_seed(&r, 11);
	int n1 = 0, n1_t2 = 0, n0_k2 = 0;
	for (int i = 0; i < 4000; i++) {
		int32_t t;
		cr_assert_eq(dg_sample_draw(z, 3, 1.0, 0, &r, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
		n1 += t == 1;
		cr_assert_eq(dg_sample_draw(z, 3, 2.0, 0, &r, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
		n1_t2 += t == 1;
		cr_assert_eq(dg_sample_draw(z, 3, 1.0, 2, &r, &t, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_neq(t, 2, "top-k 2 drew the third");
		n0_k2 += t == 0;
	}
	cr_expect(fabs(n1 / 4000.0 - 0.75) < 0.03, "p(1) = %g, want 0.75", n1 / 4000.0);
	cr_expect(fabs(n1_t2 / 4000.0 - sqrt(3.0) / (1 + sqrt(3.0))) < 0.03, "p(1) at 2 = %g", n1_t2 / 4000.0);
	cr_expect(fabs(n0_k2 / 4000.0 - 0.25) < 0.03, "p(0) among 2 = %g", n0_k2 / 4000.0);
	/* the same state, the same token */
	dg_rng a, b;
	dg_rng_seed(&a, 99);
	b = a;
	int32_t ta, tb;
	cr_assert_eq(dg_sample_draw(z, 3, 0.7, 0, &a, &ta, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_sample_draw(z, 3, 0.7, 0, &b, &tb, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(ta, tb);
}

Test(sample, refusals)
{
	float z[4] = { 0, 1, NAN, 2 };
	dg_rng r;
	dg_rng_seed(&r, 1);
	int32_t t;
	cr_assert_eq(dg_sample_draw(z, 4, 1.0, 0, &r, &t, msg, sizeof(msg)), DG_ERR_NUMERIC);
	cr_assert(strstr(msg, "logit 2 is nan"), "%s", msg);
	z[2] = 0;
	cr_assert_eq(dg_sample_draw(z, 0, 1.0, 0, &r, &t, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_sample_draw(z, 4, -1.0, 0, &r, &t, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_sample_draw(z, 4, 1.0, -1, &r, &t, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_sample_draw(z, 4, NAN, 0, &r, &t, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
}
