/*
 * Decoding from a state (dragon/model.h dg_model_state, dg_model_decode):
 * on a device, the GPU decoder of runtime/train/gpu_decode.c; on the CPU,
 * here: the forward of dg_model_cpu_logits, a token a row,
 * with the attention in its linear form. Every op but the attention works
 * a token at a time, so it runs on the rows at hand (R tokens, each as a
 * batch row of time 1) by the same references as the CPU model, in the
 * same order: embed, LN; per layer the encoder (fake-quantized input for
 * a low-bit recipe), RoPE at each token's own position, the attention
 * against the row's state (runtime/ref/attention_chunked.c: qr·S, the
 * chunk's own lower triangle, then S += qrᵀ·x), LN, encoder_v, the gate
 * (no dropout), the decoder, LN, the residual's LN; then x·lm_head in
 * double. The state is what a layer's attention has seen: per layer and
 * head an N × D f32 sum, so a token costs the same at any position.
 */
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "dragon/model.h"
#include "dragon/runtime.h"
#include "dragon/spec.h"
#include "runtime/ref/ref_ops.h"
#include "runtime/train/model_int.h"

struct dg_model_state {
	dg_model_config c;
	const dg_model_weights *w; /* the CPU decoder's weights */
	dg_model *gpu;             /* the GPU decoder, or NULL */
	dg_device *dev;
	int batch;
	int64_t *pos;  /* a row's consumed tokens */
	float *S;      /* (batch, layers, H, N, D) */
	size_t per_row; /* floats of S a row */
};

/* Tokens a prefill runs at once: the scratch is O(chunk·H·N). */
#define PREFILL_CHUNK 64

dg_status dg_model_state_create(dg_device *dev, const dg_model_weights *w, int batch, dg_model_state **out,
				char *msg, size_t size)
{
	if (!w || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_state_create: NULL argument");
	*out = NULL;
	const dg_model_config *c = &w->config;
	dg_status st = dg_model_config_check(c, msg, size);
	if (st)
		return st;
	if (batch < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "batch %d: a state holds at least 1 row", batch);
	bool lowbit;
	const char *no = dev ? NULL : dg__cpu_recipe(c, &lowbit);
	if (no)
		return dg__msgf(DG_ERR_UNSUPPORTED, msg, size, "preset %s: %s", c->preset[0] ? c->preset : "(custom)",
				no);
	dg_model_state *s = calloc(1, sizeof(*s));
	if (!s)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory");
	s->c = *c;
	s->w = w;
	s->dev = dev;
	s->batch = batch;
	s->per_row = (size_t)c->layers * (size_t)c->heads * (size_t)c->neurons * (size_t)c->embd;
	if (dev) {
		if ((st = dg__model_decoder_create(dev, w, batch, &s->gpu))) {
			dg__msgf(st, msg, size, "%s", dg_device_errmsg(dev));
			dg_model_state_destroy(s);
			return st;
		}
		*out = s;
		return DG_OK;
	}
	s->pos = calloc((size_t)batch, sizeof(int64_t));
	s->S = calloc((size_t)batch * s->per_row, sizeof(float));
	if (!s->pos || !s->S) {
		dg_model_state_destroy(s);
		return dg__msgf(DG_ERR_NOMEM, msg, size,
				"a decoder state of %d rows: %.1f MB do not fit in memory", batch,
				(double)batch * (double)(c->layers * c->heads) * c->neurons * c->embd * 4e-6);
	}
	*out = s;
	return DG_OK;
}

void dg_model_state_destroy(dg_model_state *s)
{
	if (!s)
		return;
	dg_model_destroy(s->gpu);
	free(s->pos);
	free(s->S);
	free(s);
}

/* ---- the forward of R tokens ------------------------------------------------ */

typedef struct run {
	const dg_model_weights *w;
	const dg_model_config *c;
	dg_model_state *s;
	bool lowbit;
	int H, D, N, V, R; /* R: the rows the scratch holds */
	float *exec[DG_PROJ__COUNT];
	float *x, *xq, *xs, *qr, *att, *a, *aq, *ys, *xy, *xyq, *yd, *y, *sum, *cs, *sn, *qh, *oh;
	uint8_t *codes;
	float *scales;
} run;

static void run_free(run *r)
{
	for (int k = 0; k < DG_PROJ__COUNT; k++)
		free(r->exec[k]);
	float *f[] = { r->x, r->xq, r->xs, r->qr, r->att, r->a, r->aq, r->ys, r->xy, r->xyq,
		       r->yd, r->y, r->sum, r->cs, r->sn, r->qh, r->oh, r->scales };
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		free(f[i]);
	free(r->codes);
}

/* Checks w against s, makes the execution copies and the scratch of R rows. */
static dg_status run_open(run *r, const dg_model_weights *w, dg_model_state *s, int R, const char *fn,
			  char *msg, size_t size)
{
	memset(r, 0, sizeof(*r));
	if (!w || !s)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s: NULL argument", fn);
	const dg_model_config *c = &w->config;
	const char *no = dg__cpu_recipe(c, &r->lowbit);
	if (no)
		return dg__msgf(DG_ERR_UNSUPPORTED, msg, size, "preset %s: %s",
				c->preset[0] ? c->preset : "(custom)", no);
	r->w = w, r->c = c, r->s = s, r->R = R;
	r->H = c->heads, r->D = c->embd, r->N = c->neurons, r->V = c->vocab;
	const size_t hnd = (size_t)r->H * r->N * r->D, rd = (size_t)R * r->D, rhd = rd * r->H,
		     rhn = (size_t)R * r->H * r->N;
	bool ok = true;
	for (int k = 0; k < DG_PROJ__COUNT; k++)
		ok = (r->exec[k] = malloc(hnd * sizeof(float))) && ok;
#define A(p, n) ok = ((p) = malloc((n) * sizeof(float) + 4)) && ok
	A(r->x, rd), A(r->xq, rd), A(r->xs, rhn), A(r->qr, rhn), A(r->att, rhd), A(r->a, rhd);
	A(r->aq, rhd), A(r->ys, rhn), A(r->xy, rhn), A(r->xyq, rhn), A(r->yd, rd), A(r->y, rd);
	A(r->sum, rd), A(r->cs, (size_t)R * r->N / 2), A(r->sn, (size_t)R * r->N / 2);
	A(r->qh, (size_t)R * r->N), A(r->oh, rd), A(r->scales, (size_t)R * r->H);
#undef A
	ok = (r->codes = malloc(rhn + 1)) && ok;
	dg_status st = ok ? DG_OK : DG_ERR_NOMEM;
	if (!st)
		st = dg__cpu_exec_copies(w, r->lowbit, r->exec);
	return st ? dg__msgf(st, msg, size, "%s: the execution copies: %s", fn, dg_status_str(st)) : DG_OK;
}

/* A float spec of op for the model's shape (cpu_model.c's). */
static dg_spec fspec(const run *r, dg_op op, int in_heads, float thr, bool relu)
{
	return dg__cpu_fspec(op, (int)r->H, (int)r->D, (int)r->N, in_heads, thr, relu);
}

/* x (rows, G, 1, C) replaced by projection k's fake-quantized codes a
 * token (cpu_model.c's QUANT node at T = 1) into o. */
static dg_status fake_act(run *r, dg_proj k, const float *x, size_t rows, size_t G, size_t C, float *o)
{
	const dg_proj_recipe *rc = dg__proj_recipe(r->c, k);
	dg_status st = dg_ref_quantize_act_rows(DG_FMT_F32, rc->act, x, rows, G, 1, C, r->codes, r->scales);
	for (size_t i = 0; !st && i < rows * G * C; i++) {
		int code = rc->act == DG_FMT_UINT8POS ? r->codes[i] : (int8_t)r->codes[i];
		o[i] = (float)code * r->scales[i / (G * C)];
	}
	return st;
}

/* The forward of n tokens (n <= R): token i of state row row[i] at
 * position pos[i]. Runs of one row are consecutive tokens of its sequence
 * (a prefill's chunk: one run; a decode: n runs of one). Hidden states
 * x_final into r->x; the state rows advanced. */
static dg_status forward(run *r, const int32_t *tok, const int *row, const int64_t *pos, int n)
{
	const dg_model_config *c = r->c;
	const int H = r->H, D = r->D, N = r->N;
	const float eps = c->ln_eps;
	dg_status st;

	int64_t bad = 0;
	if ((st = dg_ref_embed_fwd(r->w->params[DG_PARAM_EMBED], r->V, D, tok, n, r->sum, &bad)))
		return st;
	dg_ref_layernorm_fwd(r->sum, n, D, eps, r->x, NULL, NULL);
	for (int i = 0; i < n; i++)
		dg_ref_rope_row((int)pos[i], N, r->cs + (int64_t)i * (N / 2), r->sn + (int64_t)i * (N / 2));
	for (int l = 0; l < c->layers; l++) {
		/* xs = relu(x·encoder − t_x) (n, H, 1, N) */
		const float *xin = r->x;
		if (r->lowbit) {
			if ((st = fake_act(r, DG_PROJ_ENCODER, r->x, (size_t)n, 1, (size_t)D, r->xq)))
				return st;
			xin = r->xq;
		}
		dg_spec sp = fspec(r, DG_OP_LOWRANK_FWD, 1, c->thr_x, true);
		dg_ref_lowrank_args pa = { .x = xin, .w = r->exec[DG_PROJ_ENCODER], .sa = 1, .sw = 1, .so = 1,
					   .out = r->xs, .batch = n, .time = 1 };
		if ((st = dg_ref_lowrank_fwd(&sp, &pa)))
			return st;
		/* qr = RoPE(xs), each token at its position */
		for (int i = 0; i < n; i++)
			dg_ref_rope_fwd(r->xs + (int64_t)i * H * N, r->cs + (int64_t)i * (N / 2),
					r->sn + (int64_t)i * (N / 2), H, 1, N, r->qr + (int64_t)i * H * N);
		/* att = the attention against each run's state, head by head */
		for (int i0 = 0; i0 < n;) {
			int i1 = i0 + 1;
			while (i1 < n && row[i1] == row[i0])
				i1++;
			const int m = i1 - i0;
			for (int h = 0; h < H; h++) {
				float *S = r->s->S + (size_t)row[i0] * r->s->per_row +
					   ((size_t)l * H + h) * (size_t)N * D;
				for (int i = 0; i < m; i++)
					memcpy(r->qh + (int64_t)i * N, r->qr + ((int64_t)(i0 + i) * H + h) * N,
					       (size_t)N * sizeof(float));
				dg_ref_attention_state_chunk(S, r->qh, r->x + (int64_t)i0 * D, m, N, D, r->oh);
				for (int i = 0; i < m; i++)
					memcpy(r->att + ((int64_t)(i0 + i) * H + h) * D, r->oh + (int64_t)i * D,
					       (size_t)D * sizeof(float));
			}
			i0 = i1;
		}
		/* ys = relu(LN(att)·encoder_v − t_y) */
		dg_ref_layernorm_fwd(r->att, (int64_t)n * H, D, eps, r->a, NULL, NULL);
		const float *ain = r->a;
		if (r->lowbit) {
			if ((st = fake_act(r, DG_PROJ_ENCODER_V, r->a, (size_t)n * H, 1, (size_t)D, r->aq)))
				return st;
			ain = r->aq;
		}
		sp = fspec(r, DG_OP_LOWRANK_FWD, H, c->thr_y, true);
		pa = (dg_ref_lowrank_args){ .x = ain, .w = r->exec[DG_PROJ_ENCODER_V], .sa = 1, .sw = 1, .so = 1,
					    .out = r->ys, .batch = n, .time = 1 };
		if ((st = dg_ref_lowrank_fwd(&sp, &pa)))
			return st;
		/* xy = xs·ys (no dropout), y = LN(xy·decoder), x = LN(x + y) */
		dg_ref_gate_fwd(r->xs, r->ys, (int64_t)n * H * N, 0.0f, 0, 0, (uint32_t)l, 0, r->xy);
		const float *xyin = r->xy;
		if (r->lowbit) {
			if ((st = fake_act(r, DG_PROJ_DECODER, r->xy, (size_t)n, (size_t)H, (size_t)N, r->xyq)))
				return st;
			xyin = r->xyq;
		}
		sp = fspec(r, DG_OP_DECODER_FWD, 1, 0, false);
		dg_ref_decoder_args da = { .y = xyin, .w = r->exec[DG_PROJ_DECODER], .sa = 1, .sw = 1,
					   .out = r->yd, .batch = n, .time = 1 };
		if ((st = dg_ref_decoder_fwd(&sp, &da)))
			return st;
		dg_ref_layernorm_fwd(r->yd, n, D, eps, r->y, NULL, NULL);
		for (int64_t i = 0; i < (int64_t)n * D; i++)
			r->sum[i] = r->x[i] + r->y[i];
		dg_ref_layernorm_fwd(r->sum, n, D, eps, r->x, NULL, NULL);
	}
	for (int i = 0; i < n; i++)
		r->s->pos[row[i]] = pos[i] + 1;
	return DG_OK;
}

/* The logits of hidden state x (D) into out (V): x·lm_head in double. */
static void logits_of(const run *r, const float *x, float *out)
{
	const float *lm = r->w->params[DG_PARAM_LM_HEAD];
	for (int v = 0; v < r->V; v++) {
		double z = 0.0;
		for (int k = 0; k < r->D; k++)
			z += (double)x[k] * lm[(int64_t)k * r->V + v];
		out[v] = (float)z;
	}
}

static dg_status check_tokens(const dg_model_config *c, const int32_t *tok, int n, const char *what,
			      char *msg, size_t size)
{
	for (int i = 0; i < n; i++)
		if (tok[i] < 0 || tok[i] >= c->vocab)
			return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "%s[%d] = %d: outside the vocabulary 0..%d",
					what, i, tok[i], c->vocab - 1);
	return DG_OK;
}

/* Row `row` consumes n tokens in chunks (restart: emptied first); logits
 * (may be NULL) after the last. */
static dg_status consume(dg_model_state *s, int row, const int32_t *tokens, int n, bool restart, float *logits,
			 char *msg, size_t size)
{
	run r;
	const int R = n < PREFILL_CHUNK ? n : PREFILL_CHUNK;
	int rows[PREFILL_CHUNK];
	int64_t pos[PREFILL_CHUNK];
	dg_status st = run_open(&r, s->w, s, R, "dg_model_decode", msg, size);
	if (!st && restart) {
		s->pos[row] = 0;
		memset(s->S + (size_t)row * s->per_row, 0, s->per_row * sizeof(float));
	}
	for (int i0 = 0; !st && i0 < n; i0 += R) {
		int m = n - i0 < R ? n - i0 : R;
		for (int i = 0; i < m; i++) {
			rows[i] = row;
			pos[i] = s->pos[row] + i;
		}
		st = forward(&r, tokens + i0, rows, pos, m);
		if (!st && logits && i0 + m == n)
			logits_of(&r, r.x + (int64_t)(m - 1) * r.D, logits);
	}
	run_free(&r);
	return st;
}

/* One token for every row, each at its own position, in one pass. */
static dg_status step_rows(dg_model_state *s, const int32_t *tokens, float *logits, char *msg, size_t size)
{
	run r = { 0 };
	int *rows = malloc((size_t)s->batch * sizeof(int));
	int64_t *pos = malloc((size_t)s->batch * sizeof(int64_t));
	dg_status st = rows && pos ? run_open(&r, s->w, s, s->batch, "dg_model_decode", msg, size) : DG_ERR_NOMEM;
	if (!st) {
		for (int i = 0; i < s->batch; i++) {
			rows[i] = i;
			pos[i] = s->pos[i];
		}
		st = forward(&r, tokens, rows, pos, s->batch);
		for (int i = 0; !st && i < s->batch; i++)
			logits_of(&r, r.x + (int64_t)i * r.D, logits + (int64_t)i * r.V);
	}
	run_free(&r);
	free(rows);
	free(pos);
	return st;
}

dg_status dg_model_decode(dg_model_state *s, int row, const int32_t *tokens, int n, bool restart, float *logits,
			  char *msg, size_t size)
{
	if (!s || !tokens || !logits)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size, "dg_model_decode: NULL argument");
	if (row < -1 || row >= s->batch || n < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"row %d, %d tokens: a row of 0..%d (or -1: every row), at least 1 token", row, n,
				s->batch - 1);
	const int rows = row < 0 ? s->batch : 1;
	dg_status st = check_tokens(&s->c, tokens, rows * n, "tokens", msg, size);
	if (st)
		return st;
	if (s->gpu) {
		if (row >= 0)
			return dg__msgf(DG_ERR_UNSUPPORTED, msg, size,
					"row %d: the GPU decoder takes every row at once (row -1)", row);
		st = dg__model_decode(s->gpu, tokens, n, restart, logits);
		return st ? dg__msgf(st, msg, size, "%s", dg_device_errmsg(s->dev)) : DG_OK;
	}
	if (row < 0 && n == 1 && !restart)
		st = step_rows(s, tokens, logits, msg, size);
	else if (row >= 0)
		st = consume(s, row, tokens, n, restart, logits, msg, size);
	for (int r = 0; row < 0 && !(n == 1 && !restart) && r < s->batch && !st; r++)
		st = consume(s, r, tokens + (int64_t)r * n, n, restart, logits + (int64_t)r * s->c.vocab, msg, size);
	if (st && !(msg && msg[0]))
		dg__msgf(st, msg, size, "dg_model_decode: %s", dg_status_str(st));
	return st;
}
