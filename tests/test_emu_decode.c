/*
 * The decoder's kernels (runtime/train/gpu_decode.c) run on the CPU
 * (tests/emu_helpers.h: the rendered kernel built for the host, its blocks'
 * threads as OS threads).
 *
 * attention_step (templates/attention_step.lua): the one-token entry
 * against the reference (dg_ref_attention_step: out within a bf16 rounding
 * or f32's sums, the state bit for bit — one fmaf an entry in both), and
 * the window entry against T one-token launches from the same state, out
 * and state bit for bit — the two entries' per-column arithmetic must stay
 * one. Shapes of 1 to 40 pairs a thread, and pairs that do not fill the
 * last round of threads; xs sparse in whole zero pairs (a ReLU's),
 * positions 0, 1000 and 65530 onwards. The GPU suite
 * (test_gpu_attention_step) checks the same on the device with its times.
 *
 * lmhead_logits (templates/logits.lua) against dg_ref_lmhead_logits bit
 * for bit (each logit one double sum in k order), x f32 and bf16, rows
 * that fill a unit and rows that do not, E past a chunk and not a whole
 * number of chunks, V not a whole number of column blocks, a grid smaller
 * than the units (test_gpu_decode checks it on the device).
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/fmt.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "helpers.h"
#include "nvrtc_helpers.h"
#include "runtime/ref/ref_ops.h"

typedef void (*logits_fn)(unsigned grid, unsigned nt, const void *x, const float *w, float *logits, long long rows);

/* the kernel names x's type itself (no typedef): %s is it */
static const char LOGITS_GLUE[] =
	"extern \"C\" void dg_emu_logits(unsigned grid, unsigned nt, const void *x, const float *w, float *logits,\n"
	"	long long rows)\n"
	"{\n"
	"	dg_emu_launch(grid, nt, 0, [&] { dg_lmhead_logits((const %s *)x, w, logits, rows); });\n"
	"}\n";

typedef void (*step_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const void *xs,
			const float *pos, const float *freq, const void *v, float *state, void *out, int B, int T);

static const char GLUE[] =
	"extern \"C\" void dg_emu_step(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const void *xs, const float *pos, const float *freq, const void *v, float *state, void *out,\n"
	"	int B, int T)\n"
	"{\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		if (T == 0)\n"
	"			dg_attention_step((const XT *)xs, pos, freq, (const XT *)v, state, (XT *)out, B);\n"
	"		else\n"
	"			dg_attention_window((const XT *)xs, pos, freq, (const XT *)v, state, (XT *)out, B, T);\n"
	"	});\n"
	"}\n";

static size_t esz(dg_fmt f)
{
	return f == DG_FMT_BF16 ? 2 : 4;
}

static float as_f32(dg_fmt f, const void *p, size_t i)
{
	return f == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void check(dg_codegen *cg, dg_rng *rng, dg_fmt act, int B, int H, int N, int D, int threads, int T)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_ATTENTION_STEP);
	s.act = act, s.heads = H, s.latent = N, s.embd = D, s.tile.threads = threads;
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	step_fn fn = (step_fn)eh_build(cg, &s, GLUE, "dg_emu_step");
	const unsigned nt = (unsigned)plan.entries[0].threads;
	const size_t e = esz(act), nx = (size_t)B * H * T * N, nv = (size_t)B * T * D, no = (size_t)B * H * T * D,
		     ns = (size_t)B * H * N * D, nx1 = (size_t)B * H * N, nv1 = (size_t)B * D, no1 = (size_t)B * H * D;
	float *freq = malloc((size_t)N * sizeof(float)), *pos = malloc((size_t)B * sizeof(float)),
	      *p1 = malloc((size_t)B * sizeof(float));
	float *s0 = malloc(ns * sizeof(float)), *want_s = malloc(ns * sizeof(float)), *step_s = malloc(ns * sizeof(float)),
	      *win_s = malloc(ns * sizeof(float));
	unsigned char *want = malloc(no * e), *step_o = malloc(no * e), *win_o = malloc(no * e), *x1 = malloc(nx1 * e),
		      *v1 = malloc(nv1 * e), *o1 = malloc(no1 * e);
	cr_assert(freq && pos && p1 && s0 && want_s && step_s && win_s && want && step_o && win_o && x1 && v1 && o1);
	dg_ref_rope_freq(N, freq);
	for (size_t i = 0; i < ns; i++)
		s0[i] = 0.1f * dg_rng_uniform(rng, -1.0f, 1.0f);
	for (int b = 0; b < B; b++)
		pos[b] = (float)(b == 0 ? 0 : b == 1 ? 1000 : 65530 + 7 * b);
	unsigned char *xs = dg_test_sparse_pairs(rng, act, nx, 0.3f), *v = malloc(nv * e);
	cr_assert(v);
	dg_rng_fill(rng, act, v, nv);

	memcpy(want_s, s0, ns * sizeof(float));
	cr_assert_eq(dg_ref_attention_step(&s, xs, pos, freq, v, want_s, want, B, T), DG_OK);

	/* T one-token launches */
	memcpy(step_s, s0, ns * sizeof(float));
	for (int t = 0; t < T; t++) {
		for (int b = 0; b < B; b++) {
			p1[b] = pos[b] + (float)t;
			memcpy(v1 + (size_t)b * D * e, v + ((size_t)b * T + t) * D * e, (size_t)D * e);
			for (int h = 0; h < H; h++)
				memcpy(x1 + ((size_t)b * H + h) * N * e, xs + (((size_t)b * H + h) * T + t) * N * e,
				       (size_t)N * e);
		}
		memset(o1, 0xff, no1 * e);
		fn((unsigned)D / 8, (unsigned)H, (unsigned)B, nt, 0, x1, p1, freq, v1, step_s, o1, B, 0);
		for (int b = 0; b < B; b++)
			for (int h = 0; h < H; h++)
				memcpy(step_o + (((size_t)b * H + h) * T + t) * D * e, o1 + ((size_t)b * H + h) * D * e,
				       (size_t)D * e);
	}
	const float tol = act == DG_FMT_BF16 ? 1e-2f : 1e-5f;
	for (size_t i = 0; i < no; i++) {
		const float g = as_f32(act, step_o, i), w = as_f32(act, want, i);
		cr_assert(fabsf(g - w) <= tol * (1.0f + fabsf(w)), "%s: out %zu of %zu: %g, the reference %g",
			  plan.canonical, i, no, (double)g, (double)w);
	}
	cr_assert_eq(memcmp(step_s, want_s, ns * sizeof(float)), 0, "%s: the state differs from the reference's",
		     plan.canonical);

	/* the window: the same tokens in one launch, the same bits */
	memcpy(win_s, s0, ns * sizeof(float));
	memset(win_o, 0xff, no * e);
	fn((unsigned)D / 4, (unsigned)H, (unsigned)B, (unsigned)plan.entries[1].threads, (size_t)plan.entries[1].smem,
	   xs, pos, freq, v, win_s, win_o, B, T);
	cr_assert_eq(memcmp(win_o, step_o, no * e), 0, "%s: the window's out differs from %d one-token launches",
		     plan.canonical, T);
	cr_assert_eq(memcmp(win_s, step_s, ns * sizeof(float)), 0,
		     "%s: the window's state differs from %d one-token launches", plan.canonical, T);
	free(freq), free(pos), free(p1), free(s0), free(want_s), free(step_s), free(win_s), free(want), free(step_o),
		free(win_o), free(x1), free(v1), free(o1), free(xs), free(v);
}

/* pairs a thread (N/2 over 32 or 64 threads): 1, 6, 40, and 100 pairs over
 * 64 threads (the last round part-filled) — whole and part chunks and
 * batches of loads for the template's PC and UB at the sizes tried (1, 4,
 * 16); D 16 and 8: two groups of the state, one */
Test(emu_decode, attention_step_one_token_and_window_against_the_reference, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 83);
	for (int f = 0; f < 2; f++) {
		const dg_fmt act = f ? DG_FMT_BF16 : DG_FMT_F32;
		check(cg, &rng, act, 3, 2, 64, 16, 32, 3);
		check(cg, &rng, act, 2, 2, 384, 8, 32, 2);
		check(cg, &rng, act, 1, 1, 2560, 16, 32, 2);
		check(cg, &rng, act, 2, 1, 200, 8, 64, 3);
	}
	dg_codegen_destroy(cg);
}

static void check_logits(dg_codegen *cg, dg_rng *rng, dg_fmt src, int rows, int E, int V, unsigned grid)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_LMHEAD_LOGITS);
	s.src = src, s.embd = E, s.vocab = V;
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &s, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	char glue[sizeof(LOGITS_GLUE) + 32];
	snprintf(glue, sizeof(glue), LOGITS_GLUE, src == DG_FMT_BF16 ? "unsigned short" : "float");
	logits_fn fn = (logits_fn)eh_build(cg, &s, glue, "dg_emu_logits");
	const size_t nx = (size_t)rows * E, nw = (size_t)E * V, no = (size_t)rows * V;
	unsigned char *x = malloc(nx * esz(src));
	float *xf = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)), *got = malloc(no * sizeof(float)),
	      *want = malloc(no * sizeof(float));
	cr_assert(x && xf && w && got && want);
	dg_rng_fill(rng, src, x, nx);
	dg_rng_fill(rng, DG_FMT_F32, w, nw);
	for (size_t i = 0; i < nx; i++)
		xf[i] = as_f32(src, x, i);
	dg_ref_lmhead_logits(xf, w, rows, E, V, want);
	memset(got, 0xff, no * sizeof(float));
	fn(grid, (unsigned)plan.entries[0].threads, x, w, got, rows);
	for (size_t i = 0; i < no; i++)
		cr_assert_eq(memcmp(&got[i], &want[i], sizeof(float)), 0, "%s: logit %zu of %zu: %a, the reference %a",
			     plan.canonical, i, no, (double)got[i], (double)want[i]);
	free(x), free(xf), free(w), free(got), free(want);
}

/* (the suite's other test's timeout: two timeouts in one binary make
 * Criterion 2.4.1 leak 48 bytes under ASan) */
Test(emu_decode, lmhead_logits_is_the_double_sum, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng rng;
	dg_rng_seed(&rng, 89);
	for (int f = 0; f < 2; f++) {
		const dg_fmt src = f ? DG_FMT_BF16 : DG_FMT_F32;
		check_logits(cg, &rng, src, 1, 256, 256, 4);
		check_logits(cg, &rng, src, 6, 160, 100, 3);
		check_logits(cg, &rng, src, 4, 40, 70, 2);
	}
	dg_codegen_destroy(cg);
}
