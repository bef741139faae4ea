/*
 * AdamW, its schedule and its clip on the host (dragon/optim.h): the
 * reference of the GPU's fused update and the CPU model's optimizer.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dragon/optim.h"
#include "dragon/ref.h"
#include "runtime/ref/ref_ops.h"

void dg_adamw_defaults(dg_adamw_config *c, int64_t steps)
{
	c->lr = 1e-3f;
	c->beta1 = 0.9f;
	c->beta2 = 0.95f;
	c->eps = 1e-8f;
	c->weight_decay = 0.1f;
	c->clip = 1.0f;
	c->steps = steps > 0 ? steps : 1;
	c->warmup = c->steps / 10 < 100 ? c->steps / 10 : 100;
	c->lr_floor = c->lr / 10;
}

void dg_loss_scaler_defaults(dg_loss_scaler *ls, bool on)
{
	ls->mode = on ? DG_LOSS_SCALE_DYNAMIC : DG_LOSS_SCALE_OFF;
	ls->growth_interval = DG_LOSS_SCALE_GROWTH_INTERVAL;
	ls->scale = on ? DG_LOSS_SCALE_INIT : 1.0f;
	ls->good_steps = 0;
}

static dg_status bad(char *msg, size_t size, const char *field, const char *why, double v)
{
	if (msg && size)
		snprintf(msg, size, "adamw: %s=%g: %s", field, v, why);
	return DG_ERR_INVALID_ARG;
}

dg_status dg_adamw_check(const dg_adamw_config *c, char *msg, size_t msg_size)
{
	if (!c)
		return bad(msg, msg_size, "config", "NULL", 0);
	if (!(c->lr > 0.0f) || !isfinite(c->lr))
		return bad(msg, msg_size, "lr", "must be finite and > 0", c->lr);
	if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
		return bad(msg, msg_size, "beta1", "must be in [0, 1)", c->beta1);
	if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
		return bad(msg, msg_size, "beta2", "must be in [0, 1)", c->beta2);
	if (!(c->eps > 0.0f) || !isfinite(c->eps))
		return bad(msg, msg_size, "eps", "must be finite and > 0", c->eps);
	if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
		return bad(msg, msg_size, "weight_decay", "must be finite and >= 0", c->weight_decay);
	if (!(c->clip >= 0.0f) || !isfinite(c->clip))
		return bad(msg, msg_size, "clip", "must be finite and >= 0 (0: no clipping)", c->clip);
	if (c->steps < 1)
		return bad(msg, msg_size, "steps", "must be at least 1", (double)c->steps);
	if (c->warmup < 0 || c->warmup > c->steps)
		return bad(msg, msg_size, "warmup", "must be in [0, steps]", (double)c->warmup);
	if (!(c->lr_floor >= 0.0f && c->lr_floor <= c->lr))
		return bad(msg, msg_size, "lr_floor", "must be in [0, lr]", c->lr_floor);
	return DG_OK;
}

float dg_adamw_lr(const dg_adamw_config *c, int64_t t)
{
	if (t < 0)
		t = 0;
	if (t < c->warmup)
		return (float)((double)c->lr * (double)(t + 1) / (double)c->warmup);
	int64_t span = c->steps - c->warmup;
	double p = span > 0 ? (double)(t - c->warmup) / (double)span : 1.0;
	if (p > 1.0)
		p = 1.0;
	const double pi = 3.14159265358979323846;
	return (float)(c->lr_floor + ((double)c->lr - c->lr_floor) * (1.0 + cos(pi * p)) / 2.0);
}

float dg_adamw_clip_scale(const dg_adamw_config *c, double norm)
{
	if (!(c->clip > 0.0f))
		return 1.0f;
	double s = (double)c->clip / (norm + 1e-6);
	return s < 1.0 ? (float)s : 1.0f;
}

double dg_adamw_sq_sum(const float *g, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	return s;
}

void dg_adamw_step(const dg_adamw_config *c, int64_t t, float lr, float scale, bool decay, float *p,
		   const float *grad, float *m, float *v, size_t n)
{
	dg_adamw_ctl ctl;
	dg_adamw_ctl_fill(c, t, lr, &ctl);
	ctl.scale = scale;
	dg_ref_adamw(&ctl, decay, p, grad, m, v, NULL, n);
}
