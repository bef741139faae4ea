/*
 * The host optimizer (dragon/optim.h, runtime/train/optim.c):
 *   - the schedule: linear warm-up to lr, a cosine from lr to the floor,
 *     the floor past the end; no warm-up; monotone after the warm-up;
 *   - the clip factor of clip_grad_norm_;
 *   - AdamW by hand: the first step moves every parameter by lr (m/√v is
 *     ±1 then), a zero gradient with decay scales by exactly 1 − lr·wd and
 *     without decay leaves p as it was, the clip scale multiplies g;
 *   - AdamW against a float64 evaluation of the same formulas over 20
 *     steps of the schedule (relative 2e-6), and — where python3 can
 *     import torch — against torch.optim.AdamW (foreach=False) on the same
 *     tensors and per-step learning rates (relative 1e-5; PyTorch's
 *     vectorized kernels may fuse a multiply-add), else "skipped: no torch";
 *   - refusals name the field.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dragon/optim.h"
#include "dragon/rng.h"
#include "helpers.h"

static dg_adamw_config cfg(int64_t steps, int64_t warmup)
{
	dg_adamw_config c;
	dg_adamw_defaults(&c, steps);
	c.warmup = warmup;
	return c;
}

Test(optim, schedule_warmup_cosine_floor)
{
	dg_adamw_config c = cfg(1000, 100);
	cr_assert_float_eq(dg_adamw_lr(&c, 0), 1e-5f, 1e-12);
	cr_assert_float_eq(dg_adamw_lr(&c, 49), 5e-4f, 1e-9);
	cr_assert_eq(dg_adamw_lr(&c, 99), c.lr);
	cr_assert_eq(dg_adamw_lr(&c, 100), c.lr); /* the cosine starts at lr */
	cr_assert_float_eq(dg_adamw_lr(&c, 550), (c.lr + c.lr_floor) / 2, 1e-9);
	cr_assert_eq(dg_adamw_lr(&c, 1000), c.lr_floor);
	cr_assert_eq(dg_adamw_lr(&c, 5000), c.lr_floor);
	for (int64_t t = 100; t < 1000; t++)
		cr_assert_geq(dg_adamw_lr(&c, t), dg_adamw_lr(&c, t + 1), "step %lld", (long long)t);
	dg_adamw_config z = cfg(10, 0);
	cr_assert_eq(dg_adamw_lr(&z, 0), z.lr);
	cr_assert_eq(dg_adamw_lr(&z, 10), z.lr_floor);
	dg_adamw_config d;
	dg_adamw_defaults(&d, 1500);
	cr_assert_eq(d.warmup, 100);
	cr_assert_eq(d.steps, 1500);
	cr_assert_eq(dg_adamw_check(&d, NULL, 0), DG_OK);
}

Test(optim, clip_scale)
{
	dg_adamw_config c = cfg(10, 1);
	cr_assert_eq(dg_adamw_clip_scale(&c, 0.5), 1.0f);
	cr_assert_float_eq(dg_adamw_clip_scale(&c, 4.0), (float)(1.0 / (4.0 + 1e-6)), 1e-9);
	c.clip = 0;
	cr_assert_eq(dg_adamw_clip_scale(&c, 1e9), 1.0f);
	float g[3] = { 3, 4, 0 };
	cr_assert_eq(dg_adamw_sq_sum(g, 3), 25.0);
}

Test(optim, adamw_by_hand)
{
	dg_adamw_config c = cfg(10, 1);
	float p[4] = { 1.0f, -2.0f, 0.5f, 3.0f }, g[4] = { 0.3f, -7.0f, 1e-3f, 0.0f };
	float m[4] = { 0 }, v[4] = { 0 };
	const float p0[4] = { 1.0f, -2.0f, 0.5f, 3.0f };
	dg_adamw_step(&c, 0, c.lr, 1.0f, false, p, g, m, v, 4);
	for (int i = 0; i < 3; i++) /* |g| >> eps: the first step is lr·sign(g) */
		cr_assert_float_eq(p0[i] - p[i], g[i] > 0 ? c.lr : -c.lr, 1e-7, "p[%d] moved %g", i,
				   (double)(p0[i] - p[i]));
	cr_assert_eq(p[3], p0[3], "a zero gradient without decay moved p");
	/* decay alone: p·(1 − lr·wd) exactly */
	float q[1] = { 3.0f }, zg[1] = { 0 }, zm[1] = { 0 }, zv[1] = { 0 };
	dg_adamw_step(&c, 0, c.lr, 1.0f, true, q, zg, zm, zv, 1);
	cr_assert_eq(q[0], 3.0f * (float)(1.0 - (double)c.lr * c.weight_decay));
	/* the clip scale multiplies the gradient (m of the first step: (1 − β1)·g·s) */
	float r[1] = { 0 }, rg[1] = { 2.0f }, rm[1] = { 0 }, rv[1] = { 0 };
	dg_adamw_step(&c, 0, c.lr, 0.25f, false, r, rg, rm, rv, 1);
	cr_assert_float_eq(rm[0], (1.0f - c.beta1) * 0.5f, 1e-9);
	cr_assert_float_eq(rv[0], (1.0f - c.beta2) * 0.25f, 1e-9);
}

/* n parameters over `steps` steps of the schedule, random gradients. */
typedef struct run {
	size_t n;
	int steps;
	float *p, *g; /* p (n), g (steps·n) */
} run;

static run make_run(size_t n, int steps, uint64_t seed)
{
	dg_rng r;
	dg_rng_seed(&r, seed);
	run u = { n, steps, malloc(n * 4), malloc((size_t)steps * n * 4) };
	for (size_t i = 0; i < n; i++)
		u.p[i] = dg_rng_uniform(&r, -1.0f, 1.0f);
	for (size_t i = 0; i < (size_t)steps * n; i++)
		u.g[i] = dg_rng_uniform(&r, -1.0f, 1.0f) * (i % 7 == 0 ? 1e-3f : 1.0f);
	return u;
}

Test(optim, adamw_against_float64)
{
	dg_adamw_config c = cfg(20, 5);
	run u = make_run(257, 20, 7);
	float *p = malloc(u.n * 4), *m = calloc(u.n, 4), *v = calloc(u.n, 4);
	double *dp = malloc(u.n * 8), *dm = calloc(u.n, 8), *dv = calloc(u.n, 8);
	memcpy(p, u.p, u.n * 4);
	for (size_t i = 0; i < u.n; i++)
		dp[i] = u.p[i];
	for (int t = 0; t < u.steps; t++) {
		float lr = dg_adamw_lr(&c, t);
		dg_adamw_step(&c, t, lr, 1.0f, true, p, u.g + (size_t)t * u.n, m, v, u.n);
		double bc1 = 1 - pow(c.beta1, t + 1), bc2 = 1 - pow(c.beta2, t + 1);
		for (size_t i = 0; i < u.n; i++) {
			double g = u.g[(size_t)t * u.n + i];
			dp[i] *= 1 - (double)lr * c.weight_decay;
			dm[i] = c.beta1 * dm[i] + (1 - (double)c.beta1) * g;
			dv[i] = c.beta2 * dv[i] + (1 - (double)c.beta2) * g * g;
			dp[i] -= lr / bc1 * dm[i] / (sqrt(dv[i]) / sqrt(bc2) + c.eps);
		}
	}
	for (size_t i = 0; i < u.n; i++)
		cr_assert(fabs(p[i] - dp[i]) <= 2e-6 * fabs(dp[i]) + 1e-9, "p[%zu] %.9g, float64 %.9g", i,
			  (double)p[i], dp[i]);
	free(p), free(m), free(v), free(dp), free(dm), free(dv), free(u.p), free(u.g);
}

Test(optim, adamw_against_torch)
{
	if (!dg_test_need(system("python3 -c 'import torch' >/dev/null 2>&1") == 0, "no torch",
			  "python3 cannot import torch: scripts/test.sh installs it into .venv"))
		return;
	dg_adamw_config c = cfg(12, 3);
	run u = make_run(301, 12, 11);
	char dir[] = "/tmp/dg-optim-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char in[300], out[300], py[300], cmd[1200];
	snprintf(in, sizeof(in), "%s/in.bin", dir);
	snprintf(out, sizeof(out), "%s/out.bin", dir);
	snprintf(py, sizeof(py), "%s/adamw.py", dir);
	float lrs[12];
	for (int t = 0; t < u.steps; t++)
		lrs[t] = dg_adamw_lr(&c, t);
	FILE *f = fopen(in, "wb");
	cr_assert_not_null(f);
	fwrite(u.p, 4, u.n, f);
	fwrite(u.g, 4, (size_t)u.steps * u.n, f);
	fwrite(lrs, 4, (size_t)u.steps, f);
	fclose(f);
	f = fopen(py, "w");
	cr_assert_not_null(f);
	fprintf(f,
		"import sys, torch\n"
		"n, s = %zu, %d\n"
		"a = torch.frombuffer(bytearray(open(sys.argv[1], 'rb').read()), dtype=torch.float32)\n"
		"p = torch.nn.Parameter(a[:n].clone())\n"
		"g = a[n:n + s * n].view(s, n)\n"
		"lr = a[n + s * n:]\n"
		"opt = torch.optim.AdamW([p], lr=float(lr[0]), betas=(%.9g, %.9g), eps=%.9g,\n"
		"                        weight_decay=%.9g, foreach=False, fused=False)\n"
		"for t in range(s):\n"
		"    opt.param_groups[0]['lr'] = float(lr[t])\n"
		"    p.grad = g[t].clone()\n"
		"    opt.step()\n"
		"open(sys.argv[2], 'wb').write(bytes(p.detach().contiguous().untyped_storage()))\n",
		u.n, u.steps, (double)c.beta1, (double)c.beta2, (double)c.eps, (double)c.weight_decay);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "python3 %s %s %s", py, in, out);
	cr_assert_eq(system(cmd), 0, "%s failed", cmd);
	float *want = malloc(u.n * 4), *p = malloc(u.n * 4), *m = calloc(u.n, 4), *v = calloc(u.n, 4);
	f = fopen(out, "rb");
	cr_assert_not_null(f);
	cr_assert_eq(fread(want, 4, u.n, f), u.n);
	fclose(f);
	memcpy(p, u.p, u.n * 4);
	for (int t = 0; t < u.steps; t++)
		dg_adamw_step(&c, t, lrs[t], 1.0f, true, p, u.g + (size_t)t * u.n, m, v, u.n);
	size_t same = 0;
	for (size_t i = 0; i < u.n; i++) {
		cr_assert(fabsf(p[i] - want[i]) <= 1e-5f * fabsf(want[i]) + 1e-9f, "p[%zu] %.9g, torch %.9g", i,
			  (double)p[i], (double)want[i]);
		same += p[i] == want[i];
	}
	printf("adamw against torch.optim.AdamW: %zu of %zu bit-equal after %d steps\n", same, u.n, u.steps);
	unlink(in), unlink(out), unlink(py), rmdir(dir);
	free(want), free(p), free(m), free(v), free(u.p), free(u.g);
}

Test(optim, refusals_name_the_field)
{
	char msg[256];
	dg_adamw_config c;
	static const char *const fields[] = { "lr", "beta1", "beta2", "eps", "weight_decay", "clip", "steps",
					      "warmup", "lr_floor" };
	for (int k = 0; k < 9; k++) {
		dg_adamw_defaults(&c, 100);
		switch (k) {
		case 0: c.lr = 0; break;
		case 1: c.beta1 = 1; break;
		case 2: c.beta2 = -0.1f; break;
		case 3: c.eps = 0; break;
		case 4: c.weight_decay = -1; break;
		case 5: c.clip = NAN; break;
		case 6: c.steps = 0; break;
		case 7: c.warmup = 101; break;
		default: c.lr_floor = 1; break;
		}
		cr_assert_eq(dg_adamw_check(&c, msg, sizeof(msg)), DG_ERR_INVALID_ARG, "%s accepted", fields[k]);
		char want[64];
		snprintf(want, sizeof(want), "adamw: %s=", fields[k]);
		cr_assert(strstr(msg, want) == msg, "%s: %s", fields[k], msg);
	}
}
