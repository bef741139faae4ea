/*
 * Decoding from a state on the GPU (runtime/train/model_int.h
 * dg__model_decoder_create, dg__model_decode): the GPU model planned for
 * (b, 1) — every op of its forward works a token at a time — with its
 * attention nodes running attention_step (templates/attention_step.lua)
 * against each layer's state (L × b × H × N × D f32 on the device, a (row,
 * head)'s N × D in dragon/ops.h's groups of 8 columns) at each row's own
 * position, instead of the quadratic chain. A prompt is consumed
 * a token at a time; each token costs the same at any position (no
 * window).
 *
 * A token's work on the device (the body): the tokens copied from the
 * upload block into the tape's token buffer, the forward's nodes but the
 * loss (embed, LN; per layer the projections, attention_step, the norms,
 * the gate, the decoder), then the lm_head's logits of x_final into a (B,
 * V) f32 buffer (lmhead_logits: each a double sum in k order, so they are
 * dg_model_logits's host sums bit for bit). Every address it reads is
 * fixed when the decoder is made, the positions and tokens among them
 * (read from pos_d when the kernels run), so the body is captured once
 * into a CUDA graph and replayed for every later token: the first token
 * runs it eagerly (every kernel loaded), the second captures it.
 *
 * On the host a token is: the rows' positions and tokens staged (B f32,
 * B i32) and copied up in one copy, one graph launch; and after a call's
 * last token one copy of the (B, V) logits down, which waits for the
 * stream.
 *
 * A prompt (a call of n > 1 tokens a row) is consumed by windows of P
 * tokens a row before its last token: a second model, planned for (B, P)
 * on this decoder's state, positions, frequencies and parameters
 * (dg__gm_create_window, made at the first such call), runs its forward
 * once a window, its attention nodes taking the P tokens in one launch
 * (attention_step's window: the bytes of P one-token steps). Every other
 * node works a token at a time, so a window is its P tokens; the
 * remainder (fewer than P) and the last token go one at a time, the last
 * one giving the logits. P = DRAGON_PREFILL_WINDOW (0: every token one at
 * a time), else 4096 / B within 16..256, a multiple of 16.
 */
#include <stdlib.h>
#include <string.h>

#include "dragon/ops.h"
#include "runtime/train/gpu_model_int.h"

struct dg__gm_decode {
	uint32_t *in_h;          /* (2B) host: the staging of pos_d (positions f32, tokens i32) */
	dg_dptr logits;          /* (B, V) f32: the last token's logits */
	dg_prepared *lm;         /* lmhead_logits of x_final into logits */
	dg_tensor x, w, z;       /* its tensors: x_final (B, D), lm_head (D, V), logits */
	dg_lmhead_logits_args la;
	dg_model_batch bt;       /* the nodes' batch: no dropout */
	bool use_graph;          /* replay the captured body (default), else run it eagerly */
	bool warm;               /* the body has run once (its kernels loaded) */
	dg_graph *graph;         /* the captured body, or NULL */
	/* the prefill's windows (see the top) */
	int win_t;               /* P: tokens a row a window; 0: none */
	dg_model *win;           /* the window model, or NULL until a prompt needs it */
	int32_t *win_tok;        /* (B, P) host: a window's tokens */
};

static void decode_free(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	if (!dc)
		return;
	dg_graph_destroy(dc->graph);
	dg_model_destroy(dc->win);
	free(dc->win_tok);
	dg_prepared_destroy(dc->lm);
	(void)dg_free(m->dev, dc->logits);
	free(dc->in_h);
	free(dc);
	m->dc = NULL;
}

/* The per-token parts: the staging, the logits buffer and their op. */
static dg_status decode_open(dg_model *m)
{
	dg_device *dev = m->dev;
	struct dg__gm_decode *dc = calloc(1, sizeof(*dc));
	if (!dc)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	m->dc = dc;
	m->dc_free = decode_free;
	dc->use_graph = true;
	dc->bt = (dg_model_batch){ .b = m->B, .t = 1, .train = false };
	if (!(dc->in_h = calloc((size_t)m->B * 2, sizeof(uint32_t))))
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	dg_status st = dg_malloc(dev, (size_t)m->B * m->V * sizeof(float), &dc->logits);
	if (st)
		return st;
	const int xf = m->id.x_final;
	dg_spec s = dg__gm_op_spec(m, DG_OP_LMHEAD_LOGITS);
	s.src = m->t.bufs[xf].fmt;
	dg_spec_normalize(&s);
	dc->x = dg_tensor_2d("x_final", m->t.bufs[xf].fmt, dg__gm_addr(m, xf), m->B, m->D);
	dc->w = dg_tensor_2d("lm_head", DG_FMT_F32, dg__gm_addr(m, m->id.params[DG_PARAM_LM_HEAD]), m->D, m->V);
	dc->z = dg_tensor_2d("logits", DG_FMT_F32, dc->logits, m->B, m->V);
	dc->la = (dg_lmhead_logits_args){ .x = &dc->x, .w = &dc->w, .logits = &dc->z };
	return dg_prepare(dev, &s, &dc->la, &dc->lm);
}

/* P (see the top): DRAGON_PREFILL_WINDOW, else 4096 / B within 16..256, a
 * multiple of 16; -1 for a value that is not 0 or 2..4096. */
static int window_tokens(int B)
{
	const char *e = getenv("DRAGON_PREFILL_WINDOW");
	if (e && *e) {
		char *end;
		long v = strtol(e, &end, 10);
		return *end || v < 0 || v == 1 || v > 4096 ? -1 : (int)v;
	}
	int p = 4096 / B;
	p = p > 256 ? 256 : p < 16 ? 16 : p;
	return p - p % 16;
}

dg_status dg__model_decoder_create(dg_device *dev, const dg_model_weights *w, int b, dg_model **out)
{
	const int win_t = b >= 1 ? window_tokens(b) : 0;
	if (win_t < 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "DRAGON_PREFILL_WINDOW=%s: a prompt's window is 0 (a token at a time) or 2..4096 tokens a row",
				    getenv("DRAGON_PREFILL_WINDOW"));
	dg_status st = dg__gm_create(dev, w, b, 1, 1, true, false, out);
	if (st)
		return st;
	dg_model *m = *out;
	/* the bad flag is never read here (tokens are checked on the host):
	 * cleared once, not every token */
	st = decode_open(m);
	if (!st) {
		m->dc->win_t = win_t;
		st = dg_memset8(dev, dg__gm_addr(m, m->id.bad), 0, 4);
	}
	if (st) {
		dg_model_destroy(m);
		*out = NULL;
	}
	return st;
}

int dg__model_decode_window(const dg_model *m)
{
	return m && m->dc ? m->dc->win_t : 0;
}

dg_status dg__model_decode_graph(dg_model *m, bool on)
{
	if (!m || !m->dc)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg__model_decode_graph: not a decoder")
			 : DG_ERR_INVALID_ARG;
	m->dc->use_graph = on;
	return DG_OK;
}

/* m's forward but its loss, on batch bt (the decoder's, or a window
 * model's). */
static dg_status forward(dg_model *m, const dg_model_batch *bt)
{
	dg_status st = DG_OK;
	for (int k = 0; k < m->t.n_forward && !st; k++)
		if (m->t.nodes[k].kind != DG__N_CE)
			st = dg__gm_run_node(m, &m->t.nodes[k], bt, NULL);
	return st;
}

/* A token's work on the device (see the top): the tokens into the tape's
 * buffer, the forward but its loss, the logits. */
static dg_status body(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	const size_t row4 = (size_t)m->B * 4;
	dg_status st = dg_memcpy_dtod(m->dev, dg__gm_addr(m, m->id.tokens), m->pos_d + row4, row4);
	if (!st)
		st = forward(m, &dc->bt);
	if (!st)
		st = dg_prepared_launch(dc->lm, &dc->la);
	return st;
}

static dg_status capture(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	dg_status st = dg_graph_begin(m->dev);
	if (st)
		return st;
	st = body(m);
	dg_graph *g = NULL;
	dg_status end = dg_graph_end(m->dev, &g);
	if (st || end) {
		dg_graph_destroy(g);
		return st ? st : end;
	}
	dc->graph = g;
	return DG_OK;
}

/* Token k of each row (tokens (B, n)) at the rows' positions: staged, one
 * copy up, the body (replayed, or eagerly the first time or with the
 * graph off); the positions advance. */
static dg_status token(dg_model *m, const int32_t *tokens, int n, int k)
{
	struct dg__gm_decode *dc = m->dc;
	const int B = m->B;
	for (int r = 0; r < B; r++) {
		float p = (float)m->pos[r];
		int32_t t = tokens[(int64_t)r * n + k];
		memcpy(&dc->in_h[r], &p, 4);
		memcpy(&dc->in_h[B + r], &t, 4);
	}
	/* pageable: staged by the driver before the call returns, so the
	 * next token may overwrite in_h at once */
	dg_status st = dg_memcpy_htod(m->dev, m->pos_d, dc->in_h, (size_t)B * 8);
	/* the legacy default stream (a framework's stream 0) cannot be
	 * captured: there the body runs op by op */
	const bool graph = dc->use_graph && dg_device_stream(m->dev) != DG_STREAM_LEGACY;
	if (!st && graph && dc->warm && !dc->graph)
		st = capture(m);
	if (!st)
		st = graph && dc->graph ? dg_graph_launch(dc->graph) : body(m);
	if (st)
		return st;
	dc->warm = true;
	for (int r = 0; r < B; r++)
		m->pos[r]++;
	return DG_OK;
}

/* The window model, made at the first prompt that has a window: its bad
 * flag cleared once, as the decoder's. */
static dg_status window_open(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	if (dc->win)
		return DG_OK;
	/* kept when the model's creation fails: a later prompt tries again */
	if (!dc->win_tok && !(dc->win_tok = malloc((size_t)m->B * dc->win_t * sizeof(int32_t))))
		return dg__dev_fail(m->dev, DG_ERR_NOMEM, "out of memory");
	dg_status st = dg__gm_create_window(m->dev, m, dc->win_t, &dc->win);
	if (!st)
		st = dg_memset8(m->dev, dg__gm_addr(dc->win, dc->win->id.bad), 0, 4);
	if (st) {
		dg_model_destroy(dc->win);
		dc->win = NULL;
	}
	return st;
}

/* Tokens k0 .. k0 + P - 1 of each row (tokens (B, n)) through the window
 * model: the rows' positions up (pos_d's first half, which the decoder's
 * body reads too), the window's tokens into its token buffer, its forward
 * but the loss; the positions advance by P. */
static dg_status window(dg_model *m, const int32_t *tokens, int n, int k0)
{
	struct dg__gm_decode *dc = m->dc;
	dg_model *win = dc->win;
	const int B = m->B, P = dc->win_t;
	for (int r = 0; r < B; r++) {
		float p = (float)m->pos[r];
		memcpy(&dc->in_h[r], &p, 4);
		memcpy(dc->win_tok + (size_t)r * P, tokens + (int64_t)r * n + k0, (size_t)P * sizeof(int32_t));
	}
	dg_status st = dg_memcpy_htod(m->dev, m->pos_d, dc->in_h, (size_t)B * 4);
	if (!st)
		st = dg_memcpy_htod(m->dev, dg__gm_addr(win, win->id.tokens), dc->win_tok,
				    (size_t)B * P * sizeof(int32_t));
	const dg_model_batch bt = { .b = B, .t = P, .train = false };
	if (!st)
		st = forward(win, &bt);
	for (int r = 0; r < B && !st; r++)
		m->pos[r] += P;
	return st;
}

dg_status dg__model_decode(dg_model *m, const int32_t *tokens, int n, bool restart, float *logits)
{
	if (!m || !tokens || !logits)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg__model_decode: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (!m->decode || !m->dc)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "the model was planned for batches of %dx%d, not as a decoder", m->B, m->T);
	if (n < 1)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%d tokens a row: at least 1", n);
	for (int64_t i = 0; i < (int64_t)m->B * n; i++)
		if (tokens[i] < 0 || tokens[i] >= m->V)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "tokens[%lld] = %d: outside the vocabulary 0..%d",
					    (long long)i, tokens[i], m->V - 1);
	dg_status st = DG_OK;
	if (restart) {
		size_t bytes = (size_t)m->c.layers * m->B * m->H * m->N * m->D * sizeof(float);
		st = dg_memset8(dev, m->state, 0, bytes);
		memset(m->pos, 0, (size_t)m->B * sizeof(int64_t));
	}
	/* a prompt: windows of P tokens before its last token, the rest one
	 * at a time (see the top) */
	int k = 0;
	const int P = m->dc->win_t;
	if (!st && P > 1 && n - 1 >= P)
		st = window_open(m);
	for (; !st && P > 1 && k + P <= n - 1; k += P)
		st = window(m, tokens, n, k);
	for (; k < n && !st; k++)
		st = token(m, tokens, n, k);
	if (!st)
		st = dg_memcpy_dtoh(dev, logits, m->dc->logits, (size_t)m->B * m->V * sizeof(float));
	return st;
}
