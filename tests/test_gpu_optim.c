/*
 * GPU tests of the optim family (templates/optim.lua, runtime/ops/optim.c)
 * against the host's optimizer (dragon/optim.h dg_adamw_step; runtime/ref/ref_ops.h
 * dg_ref_adamw, which tests/test_nvrtc_optim.c holds to it bit for bit).
 * Skip without a device (gh_open); fail instead with DRAGON_REQUIRE_GPU=1.
 *
 *   - adamw_update with its control block on the device (dg_adamw_ctl_fill
 *     on the host, one copy a step) over runs of steps t = 0, 1, 7, 500 at
 *     four learning rates, clip scales 1 and 0.37, decay on and off, β1 0.9
 *     and 0.3 (both forms of the lerp), tiles t256 and t64: p, m and v bit
 *     for bit dg_adamw_step's at n = 1, 7, 2^20 (whole vectors) and 1000003
 *     (a ragged tail); the bf16 copy bit for bit the bf16 of the host's p,
 *     and a step without a copy leaves the copy's memory as it was;
 *   - skip = 1 moves nothing (the copy neither); ctl = 0 runs
 *     dg_ref_adamw_default_ctl's scalars (dg_ref_adamw's bits);
 *   - grad_norm over three gradients (1000003, 5 and 3·2^20 elements): sq
 *     within 1e-12 relative of the compensated double sum (1e-11 of the
 *     serial one, whose rounding is biased: serial_sq), norm = sqrt(sq) and
 *     scale = dg_adamw_clip_scale(clip, norm) exactly, for clip 1 (scale <
 *     1), a clip above the norm and clip 0 (scale 1); the host's fields
 *     of the block untouched, the norm's overwritten; a second run gives
 *     the same bits; one tiny gradient alone is the serial sum exactly; a
 *     NaN or an infinity in one gradient sets skip, and the update that
 *     follows moves nothing;
 *   - grad_norm and three updates captured into a CUDA graph and replayed
 *     after new gradients and a new control block are copied in give the
 *     eager calls' bits, step by step (a step with a NaN skipped in both);
 *     the eager steps are the host's with the device's clip scale;
 *   - the loss scaler in grad_norm's clip (interval 3): gradients S times
 *     the unscaled ones give the unscaled norm, sq and clip factor bit for
 *     bit, scale = factor / S, and S and good_steps as
 *     dg_ref_loss_scale_update moves them; a NaN skips, halves S and zeroes
 *     the count;
 *   - bad calls (grad_norm: no gradients, no or a misaligned ctl, a short
 *     or missing workspace, a bf16 or missing gradient, another op's
 *     spec; adamw_update: aliasing, a misaligned ctl) are refused with a
 *     message, write nothing, and the device goes on.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/optim.h"
#include "dragon/ref.h"
#include "runtime/ref/ref_ops.h"
#include "gpu_helpers.h"
#include "runtime/ref/ref_ops.h"

static void ok(dg_device *dev, dg_status st, const char *what)
{
	cr_assert_eq(st, DG_OK, "%s: %s: %s", what, dg_status_str(st), dg_device_errmsg(dev));
}

/* The adamw_update spec for the device's arch; threads 0: the default. */
static dg_spec spec_for(dg_device *dev, int threads)
{
	dg_device_info di;
	ok(dev, dg_device_info_get(dev, &di), "dg_device_info_get");
	dg_spec s;
	dg_spec_init(&s, DG_OP_ADAMW_UPDATE);
	s.arch = di.sm;
	s.tile.threads = threads;
	char m[512];
	cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s", m);
	return s;
}

static float *rand_f32(size_t n, float lo, float hi)
{
	float *p = gh_xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = gh_uniform(lo, hi);
	return p;
}

static void *dup_of(const void *a, size_t bytes)
{
	void *p = gh_xmalloc(bytes);
	memcpy(p, a, bytes);
	return p;
}

static void upload_to(dg_device *dev, dg_dptr d, const void *host, size_t bytes)
{
	ok(dev, dg_memcpy_htod(dev, d, host, bytes), "dg_memcpy_htod");
}

/* A tensor of n f32 at d: (n/1024, 1024) when that divides, else 1-d. */
static dg_tensor f32_tensor(const char *name, dg_dptr d, size_t n)
{
	if (n % 1024 == 0)
		return dg_tensor_2d(name, DG_FMT_F32, d, (int64_t)(n / 1024), 1024);
	return dg_tensor_1d(name, DG_FMT_F32, d, (int64_t)n);
}

/* One tensor's optimizer state: the host's (the reference's) and the
 * device's, its gradient and bf16 copy on the device. */
typedef struct param {
	size_t n;
	float *p, *m, *v; /* host: (n) f32 each */
	dg_tensor tp, tg, tm, tv;
	dg_dptr copy; /* (n) bf16, 0xff bytes until written */
} param;

/* p uniform in [-1, 1); m, v zero (a run's start) or random (v >= 0). */
static void param_make(dg_device *dev, param *q, size_t n, bool zero_moments)
{
	q->n = n;
	q->p = rand_f32(n, -1.0f, 1.0f);
	q->m = zero_moments ? calloc(n, sizeof(float)) : rand_f32(n, -0.1f, 0.1f);
	q->v = zero_moments ? calloc(n, sizeof(float)) : rand_f32(n, 0.0f, 0.01f);
	cr_assert(q->m && q->v);
	const size_t b = n * sizeof(float);
	q->tp = f32_tensor("p", gh_upload(dev, q->p, b), n);
	q->tg = f32_tensor("grad", gh_alloc(dev, b), n);
	q->tm = f32_tensor("m", gh_upload(dev, q->m, b), n);
	q->tv = f32_tensor("v", gh_upload(dev, q->v, b), n);
	q->copy = gh_alloc_ff(dev, n * sizeof(uint16_t));
}

static void param_free(param *q)
{
	free(q->p), free(q->m), free(q->v);
}

/* The device's p, m and v are the host's, bit for bit. */
static void expect_state(dg_device *dev, const param *q, const char *what)
{
	const size_t b = q->n * sizeof(float);
	float *got = gh_xmalloc(b);
	char w[256];
	const dg_tensor *t[3] = { &q->tp, &q->tm, &q->tv };
	const float *want[3] = { q->p, q->m, q->v };
	static const char *const names[3] = { "p", "m", "v" };
	for (int k = 0; k < 3; k++) {
		gh_download(dev, got, t[k]->data, b);
		snprintf(w, sizeof(w), "%s: %s", what, names[k]);
		gh_expect_bytes(w, got, want[k], b);
	}
	free(got);
}

/* The device's copy, bit for bit `want` (n bf16). */
static void expect_copy(dg_device *dev, const param *q, const uint16_t *want, const char *what)
{
	uint16_t *got = gh_xmalloc(q->n * sizeof(uint16_t));
	char w[256];
	gh_download(dev, got, q->copy, q->n * sizeof(uint16_t));
	snprintf(w, sizeof(w), "%s: copy", what);
	gh_expect_bytes(w, got, want, q->n * sizeof(uint16_t));
	free(got);
}

/* ---- adamw_update ------------------------------------------------------------- */

typedef struct step_case {
	int64_t t;
	float lr, scale;
} step_case;

static const step_case steps[] = {
	{ 0, 1e-3f, 1.0f }, { 1, 3e-4f, 0.37f }, { 7, 2e-2f, 1.0f }, { 500, 5e-5f, 0.37f } };
#define N_STEPS ((int)(sizeof(steps) / sizeof(steps[0])))

/* The run of steps on one tensor of n from zero moments, a new gradient
 * each step: the device's update against dg_adamw_step after each. The
 * even steps write the copy, the odd ones pass none (the copy stays). */
static void run_steps(dg_device *dev, const dg_spec *s, const dg_adamw_config *c, size_t n,
		      bool decay)
{
	char what[200];
	param q;
	param_make(dev, &q, n, true);
	dg_dptr ctl = gh_alloc(dev, sizeof(dg_adamw_ctl));
	float *g = gh_xmalloc(n * sizeof(float));
	uint16_t *copy = gh_xmalloc(n * sizeof(uint16_t));
	memset(copy, 0xff, n * sizeof(uint16_t));
	for (int k = 0; k < N_STEPS; k++) {
		const step_case *sc = &steps[k];
		snprintf(what, sizeof(what), "adamw_update t%d n=%zu decay=%d beta1=%g: t=%lld lr=%g scale=%g",
			 s->tile.threads, n, (int)decay, (double)c->beta1, (long long)sc->t, (double)sc->lr,
			 (double)sc->scale);
		for (size_t i = 0; i < n; i++)
			g[i] = gh_uniform(-1.0f, 1.0f);
		g[(size_t)k % n] = 0.0f; /* a zero gradient: decay alone, or nothing */
		upload_to(dev, q.tg.data, g, n * sizeof(float));
		dg_adamw_ctl kc;
		dg_adamw_ctl_fill(c, sc->t, sc->lr, &kc);
		kc.scale = sc->scale;
		upload_to(dev, ctl, &kc, sizeof(kc));
		const bool with_copy = k % 2 == 0;
		dg_adamw_update_args a = { .p = &q.tp, .grad = &q.tg, .m = &q.tm, .v = &q.tv, .ctl = ctl,
					   .copy = with_copy ? q.copy : 0, .decay = decay };
		ok(dev, dg_adamw_update(dev, s, &a), what);
		float *before = dup_of(q.p, n * sizeof(float));
		dg_adamw_step(c, sc->t, sc->lr, sc->scale, decay, q.p, g, q.m, q.v, n);
		cr_assert(n < 4 || memcmp(before, q.p, n * sizeof(float)) != 0, "%s: the host step moved nothing",
			  what);
		free(before);
		expect_state(dev, &q, what);
		if (with_copy)
			for (size_t i = 0; i < n; i++)
				copy[i] = dg_f32_to_bf16(q.p[i]);
		expect_copy(dev, &q, copy, what);
	}
	free(g), free(copy);
	param_free(&q);
}

Test(gpu_optim, update_matches_the_host_step)
{
	dg_device *dev = gh_open();
	gh_seed(0x0b71);
	dg_spec s = spec_for(dev, 0);
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	static const size_t ns[] = { 1, 7, (size_t)1 << 20, 1000003 };
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
		for (int decay = 0; decay < 2; decay++)
			run_steps(dev, &s, &c, ns[i], decay);
	/* β1 0.3: w = 0.7, the lerp's other form; another decay */
	dg_adamw_config c2 = c;
	c2.beta1 = 0.3f;
	c2.weight_decay = 0.01f;
	run_steps(dev, &s, &c2, 1000003, true);
	/* another block size: the same bits */
	dg_spec s64 = spec_for(dev, 64);
	run_steps(dev, &s64, &c, 1000003, true);
	run_steps(dev, &s64, &c, 13, false);
	gh_close(dev);
}

Test(gpu_optim, skip_moves_nothing_and_ctl_0_is_the_default)
{
	dg_device *dev = gh_open();
	gh_seed(0x5c1f);
	dg_spec s = spec_for(dev, 0);
	const size_t n = 1000003;
	param q;
	param_make(dev, &q, n, false);
	float *g = rand_f32(n, -1.0f, 1.0f);
	upload_to(dev, q.tg.data, g, n * sizeof(float));
	uint16_t *ff = gh_xmalloc(n * sizeof(uint16_t)), *copy = gh_xmalloc(n * sizeof(uint16_t));
	memset(ff, 0xff, n * sizeof(uint16_t));

	/* skip: a block whose scalars would move everything */
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	dg_adamw_ctl kc;
	dg_adamw_ctl_fill(&c, 3, 1e-2f, &kc);
	kc.skip = 1;
	dg_dptr ctl = gh_upload(dev, &kc, sizeof(kc));
	dg_adamw_update_args a = { .p = &q.tp, .grad = &q.tg, .m = &q.tm, .v = &q.tv, .ctl = ctl,
				   .copy = q.copy, .decay = true };
	ok(dev, dg_adamw_update(dev, &s, &a), "adamw_update skip");
	expect_state(dev, &q, "skip");
	expect_copy(dev, &q, ff, "skip");
	/* the same block without skip moves them: the skip was what held */
	kc.skip = 0;
	upload_to(dev, ctl, &kc, sizeof(kc));
	param r = q;
	r.p = dup_of(q.p, n * sizeof(float));
	r.m = dup_of(q.m, n * sizeof(float));
	r.v = dup_of(q.v, n * sizeof(float));
	ok(dev, dg_adamw_update(dev, &s, &a), "adamw_update");
	dg_ref_adamw(&kc, true, r.p, g, r.m, r.v, copy, n);
	expect_state(dev, &r, "skip 0");
	expect_copy(dev, &r, copy, "skip 0");
	cr_assert_neq(memcmp(r.p, q.p, n * sizeof(float)), 0, "the step moved nothing");

	/* ctl 0: dg_ref_adamw_default_ctl's scalars, decay on, then off */
	dg_adamw_ctl def;
	dg_ref_adamw_default_ctl(&def);
	for (int decay = 1; decay >= 0; decay--) {
		a.ctl = 0;
		a.decay = decay;
		ok(dev, dg_adamw_update(dev, &s, &a), "adamw_update ctl 0");
		dg_ref_adamw(&def, decay, r.p, g, r.m, r.v, copy, n);
		expect_state(dev, &r, decay ? "ctl 0, decay" : "ctl 0");
		expect_copy(dev, &r, copy, "ctl 0");
	}
	free(g), free(ff), free(copy);
	param_free(&q);
	param_free(&r);
	gh_close(dev);
}

/* ---- grad_norm ---------------------------------------------------------------- */

#define MAX_GRADS 3

typedef struct grads {
	int n;
	size_t len[MAX_GRADS];
	float *h[MAX_GRADS]; /* host copies */
	dg_tensor t[MAX_GRADS];
	const dg_tensor *ptr[MAX_GRADS];
} grads;

static void grads_make(dg_device *dev, grads *G, int n, const size_t *len)
{
	static const char *const names[MAX_GRADS] = { "g0", "g1", "g2" };
	cr_assert_leq(n, MAX_GRADS);
	memset(G, 0, sizeof(*G));
	G->n = n;
	for (int i = 0; i < n; i++) {
		G->len[i] = len[i];
		G->h[i] = rand_f32(len[i], -1.0f, 1.0f);
		G->t[i] = f32_tensor(names[i], gh_upload(dev, G->h[i], len[i] * sizeof(float)), len[i]);
		G->ptr[i] = &G->t[i];
	}
}

static void grads_free(grads *G)
{
	for (int i = 0; i < G->n; i++)
		free(G->h[i]);
}

/* Σ g² over every gradient, one running double sum in order (as the host
 * trainer sums a tensor: dg_adamw_sq_sum). Its rounding errors do not
 * cancel: over these few million squares of dg_rng floats it is about
 * 5e-13 high, all of it bias, where the device's short sums are within
 * 2e-16 of the exact sum. */
static double serial_sq(const grads *G)
{
	double s = 0.0;
	for (int i = 0; i < G->n; i++)
		for (size_t j = 0; j < G->len[i]; j++)
			s += (double)G->h[i][j] * G->h[i][j];
	return s;
}

/* The same sum compensated (Neumaier): within a few units in the last
 * place of the exact sum, the yardstick of the device's. */
static double exact_sq(const grads *G)
{
	double s = 0.0, c = 0.0;
	for (int i = 0; i < G->n; i++)
		for (size_t j = 0; j < G->len[i]; j++) {
			const double q = (double)G->h[i][j] * G->h[i][j], t = s + q;
			c += fabs(s) >= fabs(q) ? (s - t) + q : (q - t) + s;
			s = t;
		}
	return s + c;
}

/* Step 3's host fields at clip; the norm's fields set to what the norm
 * never writes (so a field it leaves shows). */
static dg_adamw_ctl ctl_with_clip(float clip)
{
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	c.clip = clip;
	dg_adamw_ctl k;
	dg_adamw_ctl_fill(&c, 3, 1e-3f, &k);
	k.scale = -1.0f;
	k.skip = 7;
	k.sq = -1.0;
	k.norm = -1.0;
	return k;
}

/* grad_norm of G into the block `in` (copied to ctl first); the block it
 * leaves, whose host fields must be in's. */
static dg_adamw_ctl norm_of(dg_device *dev, const dg_spec *s, const grads *G, dg_dptr ctl,
			    dg_workspace ws, const dg_adamw_ctl *in)
{
	upload_to(dev, ctl, in, sizeof(*in));
	dg_grad_norm_args a = { .grads = G->ptr, .n = G->n, .ctl = ctl, .ws = ws };
	ok(dev, dg_grad_norm(dev, s, &a), "grad_norm");
	dg_adamw_ctl out;
	gh_download(dev, &out, ctl, sizeof(out));
	cr_assert_eq(memcmp(&out, in, offsetof(dg_adamw_ctl, scale)), 0,
		     "grad_norm changed the host's fields of the control block");
	return out;
}

/* sq, norm and scale as the host computes them from the same data: sq
 * within 1e-12 relative of the compensated sum and 1e-11 of the serial
 * one; norm and scale exactly. */
static void expect_norm(const dg_adamw_ctl *got, const grads *G, float clip, const char *what)
{
	const double want = exact_sq(G), serial = serial_sq(G);
	cr_assert(fabs(got->sq - want) <= 1e-12 * want, "%s: sq %.17g, the sum %.17g (rel %.3g)", what,
		  got->sq, want, fabs(got->sq - want) / want);
	cr_assert(fabs(got->sq - serial) <= 1e-11 * serial, "%s: sq %.17g, the serial sum %.17g (rel %.3g)",
		  what, got->sq, serial, fabs(got->sq - serial) / serial);
	cr_assert_eq(got->norm, sqrt(got->sq), "%s: norm %.17g is not sqrt(sq %.17g)", what, got->norm,
		     got->sq);
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	c.clip = clip;
	cr_assert_eq(got->scale, dg_adamw_clip_scale(&c, got->norm), "%s: scale %.9g, clip %g of norm %.17g",
		     what, (double)got->scale, (double)clip, got->norm);
	cr_assert_eq(got->skip, 0, "%s: skip", what);
}

Test(gpu_optim, grad_norm_matches_the_host_sum)
{
	dg_device *dev = gh_open();
	gh_seed(0x9a0d);
	dg_spec s = spec_for(dev, 0);
	static const size_t len[3] = { 1000003, 5, (size_t)3 << 20 };
	grads G;
	grads_make(dev, &G, 3, len);
	dg_dptr ctl = gh_alloc(dev, sizeof(dg_adamw_ctl));
	dg_workspace ws = gh_workspace(dev, dg_grad_norm_workspace(3));
	const double want = exact_sq(&G);
	cr_assert_gt(sqrt(want), 100.0, "the norm should be far above clip 1");
	const float clips[3] = { 1.0f, (float)(2.0 * sqrt(want)), 0.0f };
	dg_adamw_ctl first = { 0 };
	for (int ci = 0; ci < 3; ci++) {
		char what[64];
		snprintf(what, sizeof(what), "grad_norm clip %g", (double)clips[ci]);
		const dg_adamw_ctl blk = ctl_with_clip(clips[ci]);
		dg_adamw_ctl got = norm_of(dev, &s, &G, ctl, ws, &blk);
		expect_norm(&got, &G, clips[ci], what);
		if (ci == 0) {
			cr_assert(got.scale > 0.0f && got.scale < 1.0f, "%s: scale %g", what, (double)got.scale);
			first = got;
		} else {
			cr_assert_eq(got.scale, 1.0f, "%s: scale %g", what, (double)got.scale);
			cr_assert_eq(memcmp(&got.sq, &first.sq, sizeof(double)), 0, "%s: another sq", what);
		}
		/* again: the same bits */
		dg_adamw_ctl again = norm_of(dev, &s, &G, ctl, ws, &blk);
		cr_assert_eq(memcmp(&again, &got, sizeof(got)), 0, "%s: a second run differs", what);
	}
	/* another block size sums in another order: still the sum */
	dg_spec s1024 = spec_for(dev, 1024);
	dg_adamw_ctl in = ctl_with_clip(1.0f);
	dg_adamw_ctl got = norm_of(dev, &s1024, &G, ctl, ws, &in);
	expect_norm(&got, &G, 1.0f, "grad_norm t1024");

	/* the tiny gradient alone: one thread sums its five squares in order,
	 * the trees add zeros: the serial sum exactly */
	grads one = { .n = 1, .len = { 5 }, .h = { G.h[1] }, .t = { G.t[1] }, .ptr = { &G.t[1] } };
	got = norm_of(dev, &s, &one, ctl, ws, &in);
	cr_assert_eq(got.sq, serial_sq(&one), "one gradient of 5: sq %.17g, want %.17g", got.sq,
		     serial_sq(&one));

	/* a NaN, then an infinity, in the big gradient: skip, and the update
	 * that follows (reading this block) moves nothing */
	param q;
	param_make(dev, &q, 4099, false);
	float *g = rand_f32(q.n, -1.0f, 1.0f);
	upload_to(dev, q.tg.data, g, q.n * sizeof(float));
	uint16_t *ff = gh_xmalloc(q.n * sizeof(uint16_t));
	memset(ff, 0xff, q.n * sizeof(uint16_t));
	const size_t at = 123457;
	const float bad[2] = { NAN, INFINITY };
	for (int b = 0; b < 2; b++) {
		upload_to(dev, G.t[2].data + at * sizeof(float), &bad[b], sizeof(float));
		got = norm_of(dev, &s, &G, ctl, ws, &in);
		cr_assert_eq(got.skip, 1, "a %s gradient: skip %u", b ? "infinite" : "NaN", got.skip);
		cr_assert(b ? isinf(got.norm) : isnan(got.norm), "norm %g", got.norm);
		dg_adamw_update_args a = { .p = &q.tp, .grad = &q.tg, .m = &q.tm, .v = &q.tv, .ctl = ctl,
					   .copy = q.copy, .decay = true };
		ok(dev, dg_adamw_update(dev, &s, &a), "adamw_update after a non-finite norm");
		expect_state(dev, &q, "after a non-finite norm");
		expect_copy(dev, &q, ff, "after a non-finite norm");
	}
	/* the value back: the first bits again */
	upload_to(dev, G.t[2].data + at * sizeof(float), &G.h[2][at], sizeof(float));
	got = norm_of(dev, &s, &G, ctl, ws, &in);
	cr_assert_eq(memcmp(&got, &first, sizeof(got)), 0, "the gradient restored: another block");
	free(g), free(ff);
	param_free(&q);
	grads_free(&G);
	gh_close(dev);
}

/* ---- a captured step ----------------------------------------------------------- */

#define NP 3
#define GSTEPS 4
#define NAN_STEP 2

typedef struct gstep {
	dg_device *dev;
	const dg_spec *s;
	param q[NP];
	const dg_tensor *gp[NP];
	dg_dptr ctl;
	dg_workspace ws;
} gstep;

/* The step's device work: the norm, then an update a tensor (decay on
 * the first two, the first with its copy). */
static void gstep_enqueue(gstep *S)
{
	dg_grad_norm_args na = { .grads = S->gp, .n = NP, .ctl = S->ctl, .ws = S->ws };
	ok(S->dev, dg_grad_norm(S->dev, S->s, &na), "grad_norm");
	for (int i = 0; i < NP; i++) {
		param *q = &S->q[i];
		dg_adamw_update_args a = { .p = &q->tp, .grad = &q->tg, .m = &q->tm, .v = &q->tv,
					   .ctl = S->ctl, .copy = i == 0 ? q->copy : 0, .decay = i < 2 };
		ok(S->dev, dg_adamw_update(S->dev, S->s, &a), "adamw_update");
	}
}

/* The device state after a step: p, m, v of each tensor, the first's
 * copy, the control block. */
typedef struct snap {
	float *pmv[NP][3];
	uint16_t *copy;
	dg_adamw_ctl ctl;
} snap;

static void snap_take(gstep *S, snap *o)
{
	for (int i = 0; i < NP; i++) {
		const dg_tensor *t[3] = { &S->q[i].tp, &S->q[i].tm, &S->q[i].tv };
		for (int k = 0; k < 3; k++) {
			o->pmv[i][k] = gh_xmalloc(S->q[i].n * sizeof(float));
			gh_download(S->dev, o->pmv[i][k], t[k]->data, S->q[i].n * sizeof(float));
		}
	}
	o->copy = gh_xmalloc(S->q[0].n * sizeof(uint16_t));
	gh_download(S->dev, o->copy, S->q[0].copy, S->q[0].n * sizeof(uint16_t));
	gh_download(S->dev, &o->ctl, S->ctl, sizeof(o->ctl));
}

static void snap_free(snap *o)
{
	for (int i = 0; i < NP; i++)
		for (int k = 0; k < 3; k++)
			free(o->pmv[i][k]);
	free(o->copy);
}

Test(gpu_optim, captured_step_replays_with_new_scalars)
{
	dg_device *dev = gh_open();
	gh_seed(0x6a4f);
	dg_spec s = spec_for(dev, 0);
	static const size_t len[NP] = { 300001, 4096, 13 };
	static const float lrs[GSTEPS] = { 1e-3f, 5e-4f, 2e-3f, 1e-4f };
	gstep S = { .dev = dev, .s = &s };
	for (int i = 0; i < NP; i++) {
		param_make(dev, &S.q[i], len[i], true);
		S.gp[i] = &S.q[i].tg;
	}
	S.ctl = gh_alloc(dev, sizeof(dg_adamw_ctl));
	S.ws = gh_workspace(dev, dg_grad_norm_workspace(NP));
	dg_adamw_config c;
	dg_adamw_defaults(&c, 1000);
	/* each step's inputs: the gradients (a NaN in the smallest at
	 * NAN_STEP) and the host's half of the control block */
	float *gr[GSTEPS][NP];
	dg_adamw_ctl ctls[GSTEPS];
	for (int k = 0; k < GSTEPS; k++) {
		for (int i = 0; i < NP; i++)
			gr[k][i] = rand_f32(len[i], -1.0f, 1.0f);
		if (k == NAN_STEP)
			gr[k][2][5] = NAN;
		dg_adamw_ctl_fill(&c, 10 * k, lrs[k], &ctls[k]);
	}
	float *init[NP][3];
	for (int i = 0; i < NP; i++) {
		init[i][0] = dup_of(S.q[i].p, len[i] * sizeof(float));
		init[i][1] = dup_of(S.q[i].m, len[i] * sizeof(float));
		init[i][2] = dup_of(S.q[i].v, len[i] * sizeof(float));
	}

	/* eager, each step against the host's with the device's clip scale */
	snap eager[GSTEPS];
	for (int k = 0; k < GSTEPS; k++) {
		for (int i = 0; i < NP; i++)
			upload_to(dev, S.q[i].tg.data, gr[k][i], len[i] * sizeof(float));
		upload_to(dev, S.ctl, &ctls[k], sizeof(ctls[k]));
		gstep_enqueue(&S);
		snap_take(&S, &eager[k]);
		const dg_adamw_ctl *got = &eager[k].ctl;
		cr_assert_eq(got->skip, k == NAN_STEP ? 1u : 0u, "step %d: skip %u", k, got->skip);
		char what[64];
		snprintf(what, sizeof(what), "eager step %d", k);
		if (k != NAN_STEP) {
			grads G = { .n = NP };
			for (int i = 0; i < NP; i++) {
				G.len[i] = len[i];
				G.h[i] = gr[k][i];
			}
			expect_norm(got, &G, c.clip, what);
			cr_assert_lt(got->scale, 1.0f, "%s: the gradients were not clipped", what);
			for (int i = 0; i < NP; i++)
				dg_adamw_step(&c, 10 * k, lrs[k], got->scale, i < 2, S.q[i].p, gr[k][i], S.q[i].m,
					      S.q[i].v, len[i]);
		}
		for (int i = 0; i < NP; i++)
			expect_state(dev, &S.q[i], what);
	}

	/* back to the start; capture: nothing runs */
	for (int i = 0; i < NP; i++) {
		upload_to(dev, S.q[i].tp.data, init[i][0], len[i] * sizeof(float));
		upload_to(dev, S.q[i].tm.data, init[i][1], len[i] * sizeof(float));
		upload_to(dev, S.q[i].tv.data, init[i][2], len[i] * sizeof(float));
	}
	ok(dev, dg_memset8(dev, S.q[0].copy, 0xff, len[0] * sizeof(uint16_t)), "dg_memset8");
	gh_sync(dev);
	dg_graph *g = NULL;
	ok(dev, dg_graph_begin(dev), "dg_graph_begin");
	gstep_enqueue(&S);
	ok(dev, dg_graph_end(dev, &g), "dg_graph_end");
	cr_assert_not_null(g);
	gh_sync(dev);
	float *p0 = gh_xmalloc(len[0] * sizeof(float));
	gh_download(dev, p0, S.q[0].tp.data, len[0] * sizeof(float));
	gh_expect_bytes("p during the capture", p0, init[0][0], len[0] * sizeof(float));
	free(p0);

	/* replays: new gradients and block, one launch, the eager bits */
	for (int k = 0; k < GSTEPS; k++) {
		for (int i = 0; i < NP; i++)
			upload_to(dev, S.q[i].tg.data, gr[k][i], len[i] * sizeof(float));
		upload_to(dev, S.ctl, &ctls[k], sizeof(ctls[k]));
		ok(dev, dg_graph_launch(g), "dg_graph_launch");
		gh_sync(dev);
		snap r;
		snap_take(&S, &r);
		static const char *const names[3] = { "p", "m", "v" };
		char what[96];
		for (int i = 0; i < NP; i++)
			for (int j = 0; j < 3; j++) {
				snprintf(what, sizeof(what), "replay %d: tensor %d (%zu): %s", k, i, len[i], names[j]);
				gh_expect_bytes(what, r.pmv[i][j], eager[k].pmv[i][j], len[i] * sizeof(float));
			}
		snprintf(what, sizeof(what), "replay %d: copy", k);
		gh_expect_bytes(what, r.copy, eager[k].copy, len[0] * sizeof(uint16_t));
		if (k == NAN_STEP) /* the norm is NaN: compare the rest of the block */
			cr_assert_eq(memcmp(&r.ctl, &eager[k].ctl, offsetof(dg_adamw_ctl, sq)), 0,
				     "replay %d: the control block", k);
		else
			cr_assert_eq(memcmp(&r.ctl, &eager[k].ctl, sizeof(r.ctl)), 0, "replay %d: the control block",
				     k);
		snap_free(&r);
	}
	dg_graph_destroy(g);
	for (int k = 0; k < GSTEPS; k++) {
		snap_free(&eager[k]);
		for (int i = 0; i < NP; i++)
			free(gr[k][i]);
	}
	for (int i = 0; i < NP; i++) {
		for (int j = 0; j < 3; j++)
			free(init[i][j]);
		param_free(&S.q[i]);
	}
	gh_close(dev);
}

/* ---- bad calls ------------------------------------------------------------------ */

/* st is DG_ERR_INVALID_ARG (or `want`) with a message holding a and b. */
static void expect_refused(dg_device *dev, dg_status st, dg_status want, const char *a, const char *b)
{
	const char *m = dg_device_errmsg(dev);
	cr_assert_eq(st, want, "accepted (%s): %s", a, m);
	cr_assert(strstr(m, a) && (!b || strstr(m, b)), "'%s' does not say %s%s%s", m, a, b ? " and " : "",
		  b ? b : "");
}

Test(gpu_optim, bad_calls_are_refused)
{
	dg_device *dev = gh_open();
	gh_seed(0xbad0);
	dg_spec s = spec_for(dev, 0);
	static const size_t len[3] = { 1000, 5, 4096 };
	grads G;
	grads_make(dev, &G, 3, len);
	const size_t need = dg_grad_norm_workspace(3);
	dg_workspace ws = gh_workspace(dev, need);
	dg_adamw_ctl in = ctl_with_clip(1.0f), back;
	dg_dptr ctl = gh_upload(dev, &in, sizeof(in));
	dg_grad_norm_args a = { .grads = G.ptr, .n = 3, .ctl = ctl, .ws = ws };

	a.n = 0;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "n=0", "at least one");
	a.n = -1;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "n=-1", NULL);
	a.n = 3;
	a.grads = NULL;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "NULL", NULL);
	a.grads = G.ptr;
	a.ctl = 0;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "ctl: ", "aligned");
	a.ctl = ctl + 4;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "ctl: ", "aligned");
	a.ctl = ctl;
	a.ws.bytes = need - 8;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "ws: ", "workspace");
	a.ws = (dg_workspace){ 0, 0 };
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "ws: ", "workspace");
	a.ws = ws;
	dg_tensor gb = G.t[1];
	gb.fmt = DG_FMT_BF16;
	const dg_tensor *bad[3] = { G.ptr[0], &gb, G.ptr[2] };
	a.grads = bad;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "g1: ", "f32");
	bad[1] = NULL;
	expect_refused(dev, dg_grad_norm(dev, &s, &a), DG_ERR_INVALID_ARG, "grads[1]", NULL);
	a.grads = G.ptr;
	dg_spec other;
	dg_spec_init(&other, DG_OP_GATE_FWD);
	expect_refused(dev, dg_grad_norm(dev, &other, &a), DG_ERR_INVALID_SPEC, "adamw_update", NULL);
	cr_assert_eq(dg_grad_norm(NULL, &s, &a), DG_ERR_INVALID_ARG);
	gh_download(dev, &back, ctl, sizeof(back));
	cr_assert_eq(memcmp(&back, &in, sizeof(in)), 0, "a refused grad_norm wrote the control block");

	/* the device goes on: the right call gives the sum */
	dg_adamw_ctl got = norm_of(dev, &s, &G, ctl, ws, &in);
	expect_norm(&got, &G, 1.0f, "grad_norm after the refusals");

	/* adamw_update: aliasing, a misaligned block */
	param q;
	param_make(dev, &q, 1000, false);
	upload_to(dev, q.tg.data, G.h[0], 1000 * sizeof(float));
	dg_tensor alias = q.tp;
	alias.name = "m";
	dg_adamw_update_args u = { .p = &q.tp, .grad = &q.tg, .m = &alias, .v = &q.tv, .ctl = ctl,
				   .copy = q.copy, .decay = true };
	expect_refused(dev, dg_adamw_update(dev, &s, &u), DG_ERR_INVALID_ARG, "m: ", "alias p");
	u.m = &q.tm;
	u.grad = &q.tp;
	expect_refused(dev, dg_adamw_update(dev, &s, &u), DG_ERR_INVALID_ARG, "grad: ", "alias p");
	u.grad = &q.tg;
	u.ctl = ctl + 4;
	expect_refused(dev, dg_adamw_update(dev, &s, &u), DG_ERR_INVALID_ARG, "ctl: ", "aligned");
	u.ctl = ctl;
	u.copy = q.copy + 8;
	expect_refused(dev, dg_adamw_update(dev, &s, &u), DG_ERR_INVALID_ARG, "copy: ", "aligned");
	u.copy = q.copy;
	expect_state(dev, &q, "after refused updates");
	/* and the right one runs: the block the norm wrote (its scale) */
	ok(dev, dg_adamw_update(dev, &s, &u), "adamw_update after the refusals");
	dg_ref_adamw(&got, true, q.p, G.h[0], q.m, q.v, NULL, q.n);
	expect_state(dev, &q, "adamw_update after the refusals");
	param_free(&q);
	grads_free(&G);
	gh_close(dev);
}

/* ---- the loss scaler in dg_grad_clip ------------------------------------------ */

/* G's gradients times s (a power of two: exact) on the device, as a
 * backward from a loss scaled by s leaves them. */
static void upload_scaled(dg_device *dev, const grads *G, float s)
{
	for (int i = 0; i < G->n; i++) {
		float *x = gh_xmalloc(G->len[i] * sizeof(float));
		for (size_t j = 0; j < G->len[i]; j++)
			x[j] = G->h[i][j] * s;
		upload_to(dev, G->t[i].data, x, G->len[i] * sizeof(float));
		free(x);
	}
}

/* With the scaler on (interval 3) and the gradients S times G: the norm,
 * sq and clip factor are the unscaled run's bit for bit, scale is that
 * factor over S, and S and good_steps move as dg_ref_loss_scale_update
 * says, over eight finite steps (S doubles twice) and then a NaN (skip,
 * S halved, good 0) from a count of 1. */
Test(gpu_optim, grad_clip_runs_the_loss_scaler)
{
	dg_device *dev = gh_open();
	gh_seed(0x5ca1e);
	dg_spec s = spec_for(dev, 0);
	static const size_t len[2] = { 40009, 1000 };
	grads G;
	grads_make(dev, &G, 2, len);
	dg_dptr ctl = gh_alloc(dev, sizeof(dg_adamw_ctl));
	dg_workspace ws = gh_workspace(dev, dg_grad_norm_workspace(2));
	const dg_adamw_ctl off = ctl_with_clip(1.0f);
	const dg_adamw_ctl plain = norm_of(dev, &s, &G, ctl, ws, &off);
	cr_assert(plain.scale < 1.0f, "the norm %g should be clipped", plain.norm);
	dg_loss_scaler ref;
	dg_loss_scaler_defaults(&ref, true);
	ref.growth_interval = 3;
	dg_adamw_ctl blk = ctl_with_clip(1.0f);
	blk.scaler = DG_LOSS_SCALE_DYNAMIC;
	blk.growth_interval = ref.growth_interval;
	for (int k = 0; k < 8; k++) {
		blk.loss_scale = ref.scale;
		blk.good_steps = ref.good_steps;
		const float S = ref.scale;
		upload_scaled(dev, &G, S);
		dg_adamw_ctl got = norm_of(dev, &s, &G, ctl, ws, &blk);
		dg_ref_loss_scale_update(&ref, true);
		cr_assert_eq(got.skip, 0, "step %d: skip", k);
		cr_assert_eq(memcmp(&got.norm, &plain.norm, sizeof(double)), 0,
			     "step %d (S %g): norm %.17g, unscaled %.17g", k, (double)S, got.norm, plain.norm);
		cr_assert_eq(memcmp(&got.sq, &plain.sq, sizeof(double)), 0, "step %d: sq %.17g vs %.17g", k,
			     got.sq, plain.sq);
		cr_assert_eq(got.scale, plain.scale / S, "step %d: scale %.9g, want %.9g / %g", k,
			     (double)got.scale, (double)plain.scale, (double)S);
		cr_assert_eq(got.loss_scale, ref.scale, "step %d: S %g, the reference's %g", k,
			     (double)got.loss_scale, (double)ref.scale);
		cr_assert_eq(got.good_steps, ref.good_steps, "step %d: good %u, the reference's %u", k,
			     got.good_steps, ref.good_steps);
	}
	cr_assert_eq(ref.scale, 65536.0f * 4.0f, "eight finite steps at interval 3 double S twice");
	cr_assert_eq(ref.good_steps, 2u);
	/* a NaN: skipped, S halved, the count zeroed */
	blk.loss_scale = ref.scale;
	blk.good_steps = 1;
	ref.good_steps = 1;
	upload_scaled(dev, &G, ref.scale);
	const float nan = NAN;
	upload_to(dev, G.t[0].data + 77 * sizeof(float), &nan, sizeof(float));
	dg_adamw_ctl got = norm_of(dev, &s, &G, ctl, ws, &blk);
	dg_ref_loss_scale_update(&ref, false);
	cr_assert_eq(got.skip, 1, "a NaN gradient: skip %u", got.skip);
	cr_assert(isnan(got.norm), "norm %g", got.norm);
	cr_assert_eq(got.loss_scale, 131072.0f, "S %g after a skip from 2^18", (double)got.loss_scale);
	cr_assert_eq(got.loss_scale, ref.scale);
	cr_assert_eq(got.good_steps, 0u, "good %u after a skip", got.good_steps);
	grads_free(&G);
	gh_close(dev);
}
