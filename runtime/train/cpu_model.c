/*
 * The BDH model on the CPU references (dragon/model.h dg_model_cpu_step):
 * the forward of DESIGN.md's model, every layer's activations kept, and the
 * backward in reverse — the oracle the GPU model is checked against, and a
 * model CI can check by finite differences at tiny sizes.
 *
 * The projections run through the same references that check the GPU
 * kernels (dg_ref_lowrank_fwd, dg_ref_decoder_fwd and their gradients), on
 * the execution layouts the kernels read: the encoders as (H, N, D), K-major
 * along D, the decoder as (D, H·N). The masters keep the reference's
 * layouts ([H, D, N] and [H·N, D]); the copies are made once a step, as
 * the optimizer will write the low-bit copies, and the weight gradients
 * are turned back. The layers share their weights, so each weight's
 * gradient is the sum over layers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "dragon/model.h"
#include "dragon/ref.h"
#include "dragon/spec.h"

/* One layer's activations, kept for the backward. */
typedef struct layer_acts {
	float *x;        /* (B,1,T,D) the layer's input */
	float *xs;       /* (B,H,T,N) relu(x·enc − t_x) */
	float *qr;       /* (B,H,T,N) RoPE(xs) */
	float *a;        /* (B,H,T,D) LN(att) */
	float *a_rstd;   /* B·H·T */
	float *ys;       /* (B,H,T,N) relu(a·enc_v − t_y) */
	float *xy;       /* (B,H,T,N) dropout(xs·ys) */
	float *y;        /* (B,1,T,D) LN(xy·dec) */
	float *y_rstd;   /* B·T */
	float *out_rstd; /* B·T, of LN(x + y) */
} layer_acts;

typedef struct step {
	const dg_model_config *c;
	int B, T, H, D, N, V;
	int64_t bt, btd, bhtn, bhtd;
	float *enc, *encv, *dec; /* execution layouts */
	float *cos_t, *sin_t;
	float *x0_rstd;          /* LN of the embedding */
	float *x_final;          /* the last layer's output (B,1,T,D) */
	layer_acts *L;
} step;

static void step_free(step *s)
{
	if (s->L)
		for (int l = 0; l < s->c->layers; l++) {
			layer_acts *a = &s->L[l];
			free(a->x), free(a->xs), free(a->qr), free(a->a), free(a->a_rstd);
			free(a->ys), free(a->xy), free(a->y), free(a->y_rstd), free(a->out_rstd);
		}
	free(s->L);
	free(s->enc), free(s->encv), free(s->dec), free(s->cos_t), free(s->sin_t);
	free(s->x0_rstd), free(s->x_final);
}

static float *falloc(int64_t n, bool *oom)
{
	float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
	if (!p)
		*oom = true;
	return p;
}

/* enc [H, D, N] → (H, N, D); dec [H·N, D] → (D, H·N); and back. */
static void to_hnd(const float *src, float *dst, int H, int D, int N)
{
	for (int h = 0; h < H; h++)
		for (int d = 0; d < D; d++)
			for (int n = 0; n < N; n++)
				dst[((int64_t)h * N + n) * D + d] = src[((int64_t)h * D + d) * N + n];
}

static void add_from_hnd(const float *src, float *dst, int H, int D, int N)
{
	for (int h = 0; h < H; h++)
		for (int d = 0; d < D; d++)
			for (int n = 0; n < N; n++)
				dst[((int64_t)h * D + d) * N + n] += src[((int64_t)h * N + n) * D + d];
}

static void transpose(const float *src, float *dst, int64_t rows, int64_t cols)
{
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = 0; c < cols; c++)
			dst[c * rows + r] = src[r * cols + c];
}

/* A float spec of op for the shape. */
static dg_spec fspec(const step *s, dg_op op, int in_heads, float thr, bool relu)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.heads = s->H;
	sp.in_heads = in_heads;
	sp.embd = s->D;
	sp.latent = s->N;
	sp.weight = DG_FMT_F32;
	sp.act = DG_FMT_F32;
	sp.out = DG_FMT_F32;
	sp.relu = relu;
	sp.relu_thr = relu ? thr : 0.0f;
	return sp;
}

static dg_status forward(step *s, const dg_model_weights *w, const dg_model_batch *bt,
			 double *loss, char *msg, size_t size)
{
	const dg_model_config *c = s->c;
	bool oom = false;
	dg_status st;

	float *emb = falloc(s->btd, &oom);
	if (oom)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	int64_t badpos = 0;
	st = dg_ref_embed_fwd(w->params[DG_PARAM_EMBED], s->V, s->D, bt->idx, s->bt, emb, &badpos);
	if (st) {
		free(emb);
		return dg__msgf(st, msg, size, "idx[%lld] = %d: outside the vocabulary 0..%d",
				(long long)badpos, bt->idx[badpos], s->V - 1);
	}
	float *x = falloc(s->btd, &oom);
	s->x0_rstd = falloc(s->bt, &oom);
	float *att = falloc(s->bhtd, &oom), *ylat = falloc(s->bhtn, &oom), *yd = falloc(s->btd, &oom);
	float *sum = falloc(s->btd, &oom);
	if (oom) {
		st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
		goto out;
	}
	dg_ref_layernorm_fwd(emb, s->bt, s->D, c->ln_eps, x, NULL, s->x0_rstd);
	dg_spec se = fspec(s, DG_OP_LOWRANK_FWD, 1, c->thr_x, true);
	dg_spec sv = fspec(s, DG_OP_LOWRANK_FWD, s->H, c->thr_y, true);
	dg_spec sd = fspec(s, DG_OP_DECODER_FWD, 1, 0, false);
	for (int l = 0; l < c->layers && !st; l++) {
		layer_acts *a = &s->L[l];
		a->x = falloc(s->btd, &oom);
		a->xs = falloc(s->bhtn, &oom), a->qr = falloc(s->bhtn, &oom);
		a->a = falloc(s->bhtd, &oom), a->a_rstd = falloc((int64_t)s->bt * s->H, &oom);
		a->ys = falloc(s->bhtn, &oom), a->xy = falloc(s->bhtn, &oom);
		a->y = falloc(s->btd, &oom), a->y_rstd = falloc(s->bt, &oom);
		a->out_rstd = falloc(s->bt, &oom);
		if (oom) {
			st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
			break;
		}
		memcpy(a->x, x, (size_t)s->btd * sizeof(float));
		dg_ref_lowrank_args pe = { .x = x, .w = s->enc, .sa = 1, .sw = 1, .so = 1, .out = a->xs,
					   .batch = s->B, .time = s->T };
		st = dg_ref_lowrank_fwd(&se, &pe);
		if (st)
			break;
		dg_ref_rope_fwd(a->xs, s->cos_t, s->sin_t, (int64_t)s->B * s->H, s->T, s->N, a->qr);
		dg_ref_attention_fwd(a->qr, x, s->B, s->H, s->T, s->N, s->D, att);
		dg_ref_layernorm_fwd(att, (int64_t)s->bt * s->H, s->D, c->ln_eps, a->a, NULL, a->a_rstd);
		dg_ref_lowrank_args pv = { .x = a->a, .w = s->encv, .sa = 1, .sw = 1, .so = 1,
					   .out = a->ys, .batch = s->B, .time = s->T };
		st = dg_ref_lowrank_fwd(&sv, &pv);
		if (st)
			break;
		dg_ref_gate_fwd(a->xs, a->ys, s->bhtn, bt->train ? c->dropout : 0.0f, bt->seed, bt->step,
				(uint32_t)l, a->xy);
		dg_ref_decoder_args pd = { .y = a->xy, .w = s->dec, .sa = 1, .sw = 1, .out = yd,
					   .batch = s->B, .time = s->T };
		st = dg_ref_decoder_fwd(&sd, &pd);
		if (st)
			break;
		dg_ref_layernorm_fwd(yd, s->bt, s->D, c->ln_eps, a->y, NULL, a->y_rstd);
		for (int64_t i = 0; i < s->btd; i++)
			sum[i] = x[i] + a->y[i];
		dg_ref_layernorm_fwd(sum, s->bt, s->D, c->ln_eps, x, NULL, a->out_rstd);
	}
	(void)ylat;
	if (st) {
		dg__msgf(st, msg, size, "a reference refused the model's shapes (%s)", dg_status_str(st));
		goto out;
	}
	s->x_final = x;
	x = NULL;
	st = dg_ref_lmhead_ce(s->x_final, w->params[DG_PARAM_LM_HEAD], bt->targets, s->bt, s->D, s->V,
			      loss, NULL, NULL, false, &badpos);
	if (st)
		dg__msgf(st, msg, size, "targets[%lld] = %d: outside the vocabulary 0..%d",
			 (long long)badpos, bt->targets[badpos], s->V - 1);
out:
	free(emb), free(x), free(att), free(ylat), free(yd), free(sum);
	return st;
}

static dg_status backward(step *s, const dg_model_weights *w, const dg_model_batch *bt,
			  dg_model_weights *g, char *msg, size_t size)
{
	const dg_model_config *c = s->c;
	bool oom = false;
	double loss;
	dg_status st;

	float *dx = falloc(s->btd, &oom), *ds = falloc(s->btd, &oom), *dyd = falloc(s->btd, &oom);
	float *dxy = falloc(s->bhtn, &oom), *dxs = falloc(s->bhtn, &oom), *dys = falloc(s->bhtn, &oom);
	float *dqr = falloc(s->bhtn, &oom), *dxs_r = falloc(s->bhtn, &oom);
	float *da = falloc(s->bhtd, &oom), *datt = falloc(s->bhtd, &oom);
	float *dxv = falloc(s->btd, &oom), *dxe = falloc(s->btd, &oom);
	float *gw_hnd = falloc((int64_t)s->H * s->N * s->D, &oom);
	float *gw_dec = falloc((int64_t)s->D * s->H * s->N, &oom);
	float *gdec_acc = falloc((int64_t)s->D * s->H * s->N, &oom);
	float *emb = falloc(s->btd, &oom), *xhat0 = falloc(s->btd, &oom);
	if (oom) {
		st = dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
		goto out;
	}
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		int nd;
		int64_t sh[3];
		memset(g->params[p], 0,
		       (size_t)dg_model_param_shape(c, (dg_model_param)p, &nd, sh) * sizeof(float));
	}
	st = dg_ref_lmhead_ce(s->x_final, w->params[DG_PARAM_LM_HEAD], bt->targets, s->bt, s->D, s->V,
			      &loss, dx, g->params[DG_PARAM_LM_HEAD], false, NULL);
	if (st)
		goto out;
	dg_spec se = fspec(s, DG_OP_LOWRANK_GRAD_INPUT, 1, 0, false);
	dg_spec sew = fspec(s, DG_OP_LOWRANK_GRAD_WEIGHT, 1, 0, false);
	dg_spec sv = fspec(s, DG_OP_LOWRANK_GRAD_INPUT, s->H, 0, false);
	dg_spec svw = fspec(s, DG_OP_LOWRANK_GRAD_WEIGHT, s->H, 0, false);
	dg_spec sd = fspec(s, DG_OP_DECODER_GRAD_INPUT, 1, 0, false);
	dg_spec sdw = fspec(s, DG_OP_DECODER_GRAD_WEIGHT, 1, 0, false);
	float p = bt->train ? c->dropout : 0.0f;
	for (int l = c->layers - 1; l >= 0 && !st; l--) {
		layer_acts *a = &s->L[l];
		/* x_out = LN(x + y): ds = d(x + y) */
		const float *xout = l + 1 < c->layers ? s->L[l + 1].x : s->x_final;
		dg_ref_layernorm_bwd(dx, xout, a->out_rstd, s->bt, s->D, ds, false);
		/* y = LN(yd) */
		dg_ref_layernorm_bwd(ds, a->y, a->y_rstd, s->bt, s->D, dyd, false);
		/* yd = xy·dec */
		st = dg_ref_decoder_grad_input(&sd, dyd, s->dec, 1, dxy, s->B, s->T);
		if (!st)
			st = dg_ref_decoder_grad_weight(&sdw, dyd, a->xy, 1, gw_dec, s->B, s->T);
		if (st)
			break;
		for (int64_t i = 0; i < (int64_t)s->D * s->H * s->N; i++)
			gdec_acc[i] += gw_dec[i];
		/* xy = dropout(xs·ys) */
		dg_ref_gate_bwd(dxy, a->xs, a->ys, s->bhtn, p, bt->seed, bt->step, (uint32_t)l, dxs, dys);
		/* ys = relu(a·enc_v − t_y): the mask from ys itself */
		for (int64_t i = 0; i < s->bhtn; i++)
			if (!(a->ys[i] > 0.0f))
				dys[i] = 0.0f;
		st = dg_ref_lowrank_grad_input(&sv, dys, s->encv, 1, da, s->B, s->T);
		if (!st)
			st = dg_ref_lowrank_grad_weight(&svw, dys, a->a, 1, gw_hnd, s->B, s->T);
		if (st)
			break;
		add_from_hnd(gw_hnd, g->params[DG_PARAM_ENCODER_V], s->H, s->D, s->N);
		/* a = LN(att) */
		dg_ref_layernorm_bwd(da, a->a, a->a_rstd, (int64_t)s->bt * s->H, s->D, datt, false);
		/* att = tril(qr·qrᵀ, −1)·x; qr = RoPE(xs) */
		dg_ref_attention_bwd(datt, a->qr, a->x, s->B, s->H, s->T, s->N, s->D, dqr, dxv);
		dg_ref_rope_bwd(dqr, s->cos_t, s->sin_t, (int64_t)s->B * s->H, s->T, s->N, dxs_r);
		/* xs = relu(x·enc − t_x), used by the gate and by RoPE */
		for (int64_t i = 0; i < s->bhtn; i++)
			dxs[i] = a->xs[i] > 0.0f ? dxs[i] + dxs_r[i] : 0.0f;
		st = dg_ref_lowrank_grad_input(&se, dxs, s->enc, 1, dxe, s->B, s->T);
		if (!st)
			st = dg_ref_lowrank_grad_weight(&sew, dxs, a->x, 1, gw_hnd, s->B, s->T);
		if (st)
			break;
		add_from_hnd(gw_hnd, g->params[DG_PARAM_ENCODER], s->H, s->D, s->N);
		/* the layer's input feeds the residual, the values and the encoder */
		for (int64_t i = 0; i < s->btd; i++)
			dx[i] = ds[i] + dxv[i] + dxe[i];
	}
	if (st) {
		dg__msgf(st, msg, size, "a reference refused the model's shapes (%s)", dg_status_str(st));
		goto out;
	}
	/* decoder (D, H·N) → [H·N, D] */
	transpose(gdec_acc, g->params[DG_PARAM_DECODER], s->D, (int64_t)s->H * s->N);
	/* x0 = LN(embed[idx]) */
	dg_ref_embed_fwd(w->params[DG_PARAM_EMBED], s->V, s->D, bt->idx, s->bt, emb, NULL);
	dg_ref_layernorm_fwd(emb, s->bt, s->D, c->ln_eps, xhat0, NULL, NULL);
	dg_ref_layernorm_bwd(dx, xhat0, s->x0_rstd, s->bt, s->D, ds, false);
	dg_ref_embed_bwd(ds, s->D, bt->idx, s->bt, g->params[DG_PARAM_EMBED]);
out:
	free(dx), free(ds), free(dyd), free(dxy), free(dxs), free(dys), free(dqr), free(dxs_r);
	free(da), free(datt), free(dxv), free(dxe), free(gw_hnd), free(gw_dec), free(gdec_acc);
	free(emb), free(xhat0);
	return st;
}

dg_status dg_model_cpu_step(const dg_model_weights *w, const dg_model_batch *batch,
			    double *loss, dg_model_weights *grads, char *msg, size_t size)
{
	step s;
	bool oom = false;
	dg_status st;

	if (!w || !batch || !loss || !batch->idx || !batch->targets)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_cpu_step: NULL argument");
	const dg_model_config *c = &w->config;
	if ((st = dg_model_config_check(c, msg, size)))
		return st;
	const dg_proj_recipe *r[3] = { &c->encoder, &c->encoder_v, &c->decoder };
	for (int i = 0; i < 3; i++)
		if (r[i]->weight != DG_FMT_F32 || r[i]->act != DG_FMT_F32)
			return dg__msgf(DG_ERR_UNSUPPORTED, msg, size,
					"preset %s: the CPU model runs f32 recipes (the low-bit ones on the GPU)",
					c->preset[0] ? c->preset : "(custom)");
	if (batch->b < 1 || batch->t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "batch %dx%d: B and T must be at least 1",
				batch->b, batch->t);
	memset(&s, 0, sizeof(s));
	s.c = c;
	s.B = batch->b, s.T = batch->t, s.H = c->heads, s.D = c->embd, s.N = c->neurons, s.V = c->vocab;
	s.bt = (int64_t)s.B * s.T;
	s.btd = s.bt * s.D;
	s.bhtn = s.bt * s.H * s.N;
	s.bhtd = s.bt * s.H * s.D;
	for (int64_t i = 0; i < s.bt; i++)
		if (batch->targets[i] < 0 || batch->targets[i] >= s.V)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
					"targets[%lld] = %d: outside the vocabulary 0..%d", (long long)i,
					batch->targets[i], s.V - 1);
	s.L = calloc((size_t)c->layers, sizeof(*s.L));
	s.enc = falloc((int64_t)s.H * s.N * s.D, &oom);
	s.encv = falloc((int64_t)s.H * s.N * s.D, &oom);
	s.dec = falloc((int64_t)s.D * s.H * s.N, &oom);
	s.cos_t = falloc((int64_t)s.T * s.N / 2, &oom);
	s.sin_t = falloc((int64_t)s.T * s.N / 2, &oom);
	if (oom || !s.L) {
		step_free(&s);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	}
	to_hnd(w->params[DG_PARAM_ENCODER], s.enc, s.H, s.D, s.N);
	to_hnd(w->params[DG_PARAM_ENCODER_V], s.encv, s.H, s.D, s.N);
	transpose(w->params[DG_PARAM_DECODER], s.dec, (int64_t)s.H * s.N, s.D);
	dg_ref_rope_table(s.T, s.N, s.cos_t, s.sin_t);
	st = forward(&s, w, batch, loss, msg, size);
	if (!st && grads)
		st = backward(&s, w, batch, grads, msg, size);
	step_free(&s);
	return st;
}
