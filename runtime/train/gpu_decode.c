/*
 * Decoding from a state on the GPU (runtime/train/model_int.h
 * dg__model_decoder_create, dg__model_decode): the GPU model planned for
 * (b, 1) — every op of its forward works a token at a time — with its
 * attention nodes running attention_step (templates/attention_step.lua)
 * against each layer's state (L × b × H × N × D f32 on the device) at each
 * row's own position, instead of the quadratic chain. A prompt is consumed
 * a token at a time; each token costs the same at any position (no
 * window). The logits come back as dg_model_logits gives them (x_final's
 * rows read back, times lm_head on the host in double).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/train/gpu_model_int.h"

dg_status dg__model_decoder_create(dg_device *dev, const dg_model_weights *w, int b, dg_model **out)
{
	dg_status st = dg__gm_create(dev, w, b, 1, 1, true, out);
	if (st)
		return st;
	/* lm_head stays on the host too: the logits need not read it back */
	dg_model *m = *out;
	size_t n = (size_t)m->D * m->V;
	if (!(m->lm_host = malloc(n * sizeof(float)))) {
		dg_model_destroy(m);
		*out = NULL;
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	}
	memcpy(m->lm_host, w->params[DG_PARAM_LM_HEAD], n * sizeof(float));
	return DG_OK;
}

dg_status dg__model_decode(dg_model *m, const int32_t *tokens, int n, bool restart, float *logits)
{
	if (!m || !tokens || !logits)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg__model_decode: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (!m->decode)
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
	int32_t *row = malloc((size_t)m->B * sizeof(int32_t));
	if (!st && !row)
		st = dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	for (int k = 0; k < n && !st; k++) {
		for (int r = 0; r < m->B; r++) {
			row[r] = tokens[(int64_t)r * n + k];
			m->pos_f[r] = (float)m->pos[r];
		}
		st = dg_memcpy_htod(dev, m->pos_d, m->pos_f, (size_t)m->B * sizeof(float));
		dg_model_batch bt = { .idx = row, .b = m->B, .t = 1 };
		if (!st)
			st = dg_model_logits(m, &bt, 0, logits);
		for (int r = 0; r < m->B && !st; r++)
			m->pos[r]++;
	}
	free(row);
	return st;
}
