/*
 * Decoding from a state on the GPU (runtime/train/model_int.h
 * dg__model_decoder_create, dg__model_decode): the GPU model planned for
 * (b, 1) — every op of its forward works a token at a time — with its
 * attention nodes running attention_step (templates/attention_step.lua)
 * against each layer's state (L × b × H × N × D f32 on the device) at each
 * row's own position, instead of the quadratic chain. A prompt is consumed
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
 * stream. Nothing is allocated after create.
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
};

static void decode_free(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	if (!dc)
		return;
	dg_graph_destroy(dc->graph);
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

dg_status dg__model_decoder_create(dg_device *dev, const dg_model_weights *w, int b, dg_model **out)
{
	dg_status st = dg__gm_create(dev, w, b, 1, 1, true, false, out);
	if (st)
		return st;
	dg_model *m = *out;
	/* the bad flag is never read here (tokens are checked on the host):
	 * cleared once, not every token */
	st = decode_open(m);
	if (!st)
		st = dg_memset8(dev, dg__gm_addr(m, m->id.bad), 0, 4);
	if (st) {
		dg_model_destroy(m);
		*out = NULL;
	}
	return st;
}

dg_status dg__model_decode_graph(dg_model *m, bool on)
{
	if (!m || !m->dc)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg__model_decode_graph: not a decoder")
			 : DG_ERR_INVALID_ARG;
	m->dc->use_graph = on;
	return DG_OK;
}

/* A token's work on the device (see the top): the tokens into the tape's
 * buffer, the forward but its loss, the logits. */
static dg_status body(dg_model *m)
{
	struct dg__gm_decode *dc = m->dc;
	const size_t row4 = (size_t)m->B * 4;
	dg_status st = dg_memcpy_dtod(m->dev, dg__gm_addr(m, m->id.tokens), m->pos_d + row4, row4);
	for (int k = 0; k < m->t.n_forward && !st; k++)
		if (m->t.nodes[k].kind != DG__N_CE)
			st = dg__gm_run_node(m, &m->t.nodes[k], &dc->bt, NULL);
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
	for (int k = 0; k < n && !st; k++)
		st = token(m, tokens, n, k);
	if (!st)
		st = dg_memcpy_dtoh(dev, logits, m->dc->logits, (size_t)m->B * m->V * sizeof(float));
	return st;
}
