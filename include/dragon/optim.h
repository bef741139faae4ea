/*
 * dragon — the optimizer of a training run, on the host: AdamW as PyTorch's
 * torch.optim.AdamW computes it (decoupled weight decay, bias correction),
 * the global gradient-norm clip of torch.nn.utils.clip_grad_norm_, and the
 * learning-rate schedule (linear warm-up, then a cosine down to a floor).
 *
 * This is the CPU reference the GPU's fused update is held to, and the
 * CPU model's optimizer. Every tensor operation is in f32, in the order
 * written below, each rounded once (sqrtf is correctly rounded), and the
 * per-step scalars are computed in double and rounded once, so a GPU
 * kernel given the same scalars reproduces it bit for bit.
 */
#ifndef DRAGON_OPTIM_H
#define DRAGON_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_adamw_config {
	float lr;           /* the peak learning rate (1e-3) */
	float beta1, beta2; /* 0.9, 0.95 */
	float eps;          /* 1e-8 */
	float weight_decay; /* 0.1: applied to matrices only (the caller says
			     * which tensors: dg_adamw_step's decay) */
	float clip;         /* max global gradient norm (1.0); 0: no clipping */
	int64_t warmup;     /* steps of linear warm-up (lr·(t+1)/warmup) */
	int64_t steps;      /* the run's length: the cosine reaches lr_floor there */
	float lr_floor;     /* the learning rate the cosine ends at (lr/10) */
} dg_adamw_config;

/* The defaults above for a run of `steps` steps (warm-up min(100, steps/10)). */
DG_API void dg_adamw_defaults(dg_adamw_config *c, int64_t steps);
/* A config dg_adamw_step can run: finite positive lr, betas in [0, 1),
 * eps > 0, weight decay and clip >= 0, 0 <= warmup <= steps, 0 <= floor
 * <= lr. DG_ERR_INVALID_ARG with the field named otherwise. */
DG_API dg_status dg_adamw_check(const dg_adamw_config *c, char *msg, size_t msg_size);

/* The learning rate of step t (0-based): lr·(t+1)/warmup during the
 * warm-up, then floor + (lr − floor)·(1 + cos(π·p))/2 with p = (t −
 * warmup)/(steps − warmup) (1 past the end), in double, rounded once. */
DG_API float dg_adamw_lr(const dg_adamw_config *c, int64_t t);

/* The clip factor of a gradient whose global L2 norm is `norm` (the
 * square root of the sum of every tensor's squares): min(1, clip/(norm +
 * 1e-6)) as clip_grad_norm_ takes it; 1 when clip is 0. */
DG_API float dg_adamw_clip_scale(const dg_adamw_config *c, double norm);

/* Σ g² of n floats, in double (the norm's partial of one tensor). */
DG_API double dg_adamw_sq_sum(const float *g, size_t n);

/*
 * The dynamic loss scaler (PyTorch's torch.amp.GradScaler): the loss's
 * gradient is multiplied by S before the backward (lm_head's dlogits, so
 * every gradient is S times the true one), the norm and the update divide
 * it out, and S adapts: halved (and the update skipped) on a step whose
 * gradient norm is not finite, doubled after growth_interval consecutive
 * steps with a finite one. S is always a power of two, so scaling and
 * unscaling are exact: a run that never overflows is bitwise the run
 * without the scaler. A doubling that would overflow f32 keeps S.
 */
enum { DG_LOSS_SCALE_OFF = 0, DG_LOSS_SCALE_DYNAMIC = 1 };
#define DG_LOSS_SCALE_INIT 65536.0f      /* 2^16, GradScaler's init_scale */
#define DG_LOSS_SCALE_GROWTH_INTERVAL 2000u

typedef struct dg_loss_scaler {
	uint32_t mode;            /* DG_LOSS_SCALE_OFF or _DYNAMIC */
	uint32_t growth_interval; /* finite steps before S doubles (>= 1) */
	float scale;              /* S, the next step's (1 when off) */
	uint32_t good_steps;      /* finite steps since S last changed */
} dg_loss_scaler;

/* A fresh scaler: on, S 2^16, the interval 2000, no good steps; off: S 1. */
DG_API void dg_loss_scaler_defaults(dg_loss_scaler *ls, bool on);

/*
 * The scalars of one step's update, as the GPU's kernels read them from
 * device memory (a step's control block, updated by one small copy a step,
 * so a captured CUDA graph replays every step), and as the CPU reference
 * of adamw_update takes them. 80 bytes, this layout exactly
 * (templates/optim.lua mirrors it).
 * The host writes the first twelve fields, DG_ADAMW_CTL_HOST_BYTES, every
 * step (dg_adamw_ctl_fill, then the scaler's config); the rest is the
 * device's: the gradient norm (dg_grad_norm on the GPU) writes scale,
 * skip, sq and norm each step and carries loss_scale and good_steps from
 * step to step (the host writes them once, when the optimizer is set up),
 * or the host does (scale from dg_adamw_clip_scale, skip 0) for an update
 * on the host.
 */
typedef struct dg_adamw_ctl {
	float lr;      /* the step's learning rate */
	float d;       /* 1 − lr·wd (the decay factor) */
	float s;       /* lr / (1 − β1ᵗ⁺¹) */
	float cs;      /* sqrt(1 − β2ᵗ⁺¹) */
	float w;       /* 1 − β1 (the lerp weight of m) */
	float b2;      /* β2 */
	float w2;      /* 1 − β2 */
	float eps;
	float clip;    /* the global norm clip; 0: none */
	uint32_t step; /* t, 0-based (also the dropout's step) */
	uint32_t scaler;          /* DG_LOSS_SCALE_OFF / _DYNAMIC */
	uint32_t growth_interval; /* the scaler's (dg_loss_scaler) */
	/* ---- the device's half ---- */
	float scale;   /* what the update multiplies the gradient by: the
			* clip factor, over S with the scaler on */
	uint32_t skip; /* 1: the gradient norm is not finite: no update */
	float loss_scale;    /* S: what the loss's gradient is multiplied by
			      * (1 with the scaler off); after a step, the next
			      * step's */
	uint32_t good_steps; /* the scaler's count of finite steps */
	double sq;     /* Σ g² over every gradient (unscaled) */
	double norm;   /* sqrt(sq) (unscaled) */
} dg_adamw_ctl;

/* The bytes of the host's half: the per-step copy writes these alone. */
#define DG_ADAMW_CTL_HOST_BYTES offsetof(dg_adamw_ctl, scale)

/* The host's half of step t is filled by dg_adamw_ctl_fill (dragon/ref.h:
 * the references of the update and its default control block make it with
 * the same rule, below this layer). */

/*
 * One AdamW update of n parameters at step t (0-based; the bias
 * corrections use t + 1), in place on p, m and v, in PyTorch's
 * single-tensor order:
 *   g  = grad·scale                       (scale: the clip factor)
 *   p  = p·d, d = 1 − lr·wd               (decay: only when `decay`)
 *   m  = m + w·(g − m), w = 1 − β1        (lerp; m − (m − g)·... for w ≥ 0.5)
 *   v  = v·β2 + ((1 − β2)·g)·g
 *   p  = p + (−s)·(m/(sqrt(v)/c + eps)),  s = lr/bc1, c = sqrt(bc2)
 * with bc = 1 − βᵗ⁺¹. The scalars d, w, s and c are computed in double
 * (as PyTorch's Python floats) and rounded to f32 once; every tensor
 * operation is f32, rounded once. lr is the step's (dg_adamw_lr). m and v
 * start at zero.
 */
DG_API void dg_adamw_step(const dg_adamw_config *c, int64_t t, float lr, float scale, bool decay, float *p,
			  const float *grad, float *m, float *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_OPTIM_H */
