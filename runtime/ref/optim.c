/*
 * The optimizer's reference (runtime/ref/ref_ops.h dg_ref_adamw): AdamW in PyTorch's
 * single-tensor order, every operation in f32 and rounded once, so the
 * GPU's update (templates/optim.lua) given the same control block is this
 * bit for bit. The host optimizer (runtime/train/optim.c) runs it too, and
 * the control block's host half is filled here (dg_adamw_ctl_fill), and
 * the loss scaler's rule is written here once for the tests to hold
 * dg_grad_clip to (dg_ref_loss_scale_update).
 */
#include <math.h>
#include <string.h>

#include "dragon/fmt.h"
#include "dragon/optim.h"
#include "dragon/ref.h"
#include "runtime/ref/ref_ops.h"

void dg_ref_adamw(const dg_adamw_ctl *ctl, bool decay, float *p, const float *grad, float *m,
		  float *v, uint16_t *copy, size_t n)
{
	if (ctl->skip)
		return;
	const float scale = ctl->scale, d = ctl->d, w = ctl->w, b2 = ctl->b2, w2 = ctl->w2;
	const float s = ctl->s, cs = ctl->cs, eps = ctl->eps;
	for (size_t i = 0; i < n; i++) {
		const float g = grad[i] * scale;
		float x = p[i];
		if (decay)
			x = x * d;
		/* torch.lerp: a + w·(b − a) for w < 0.5, b − (b − a)·(1 − w) else */
		const float mi = w < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.0f - w);
		const float vi = v[i] * b2 + (w2 * g) * g;
		const float den = sqrtf(vi) / cs + eps;
		x = x + (-s) * (mi / den);
		m[i] = mi;
		v[i] = vi;
		p[i] = x;
		if (copy)
			copy[i] = dg_f32_to_bf16(x);
	}
}

void dg_adamw_ctl_fill(const dg_adamw_config *c, int64_t t, float lr, dg_adamw_ctl *out)
{
	memset(out, 0, sizeof(*out));
	const double step = (double)(t + 1);
	const double bc1 = 1.0 - pow((double)c->beta1, step), bc2 = 1.0 - pow((double)c->beta2, step);
	out->lr = lr;
	out->d = (float)(1.0 - (double)lr * c->weight_decay);
	out->s = (float)((double)lr / bc1);
	out->cs = (float)sqrt(bc2);
	out->w = (float)(1.0 - (double)c->beta1);
	out->b2 = c->beta2;
	out->w2 = (float)(1.0 - (double)c->beta2);
	out->eps = c->eps;
	out->clip = c->clip;
	out->step = (uint32_t)t;
	out->scale = 1.0f;
	out->loss_scale = 1.0f;
}

void dg_ref_loss_scale_update(dg_loss_scaler *ls, bool finite)
{
	if (ls->mode == DG_LOSS_SCALE_OFF)
		return;
	if (!finite) {
		ls->scale *= 0.5f;
		ls->good_steps = 0;
	} else if (++ls->good_steps >= ls->growth_interval) {
		const float up = ls->scale * 2.0f;
		if (isfinite(up))
			ls->scale = up;
		ls->good_steps = 0;
	}
}

void dg_ref_adamw_default_ctl(dg_adamw_ctl *ctl)
{
	/* dg_adamw_defaults' values, without the clip */
	dg_adamw_config c = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
			      .weight_decay = 0.1f, .clip = 0.0f, .warmup = 0, .steps = 1,
			      .lr_floor = 1e-4f };
	dg_adamw_ctl_fill(&c, 0, c.lr, ctl);
}
