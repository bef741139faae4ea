/*
 * The BDH step recorded as a tape (runtime/train/bdh_tape.h).
 *
 * Forward, per layer l (x_l the layer's input, a slice of the stack x_all):
 *   xs_l  = PROJ(x_l, encoder)            relu(x·enc − t_x)
 *   att   = ATTN(xs_l, x_l)               tril(RoPE(xs)·RoPE(xs)ᵀ, −1)·x
 *   a_l   = LN(att)
 *   ys_l  = PROJ(a_l, encoder_v)
 *   xy_l  = GATE(xs_l, ys_l)              dropout(xs·ys)
 *   yd    = DEC(xy_l, decoder)
 *   y_l   = LN(yd)
 *   x_l+1 = RESID_LN(x_l, y_l)            LN(x + y)
 * Backward, layers in reverse, then the three weight gradients over all
 * layers' rows and the embedding's. Activation gradients overwrite
 * (dxs_l is written by the gate's backward, then the attention's adds to
 * it and applies the ReLU mask); parameter gradients are each written by
 * one node.
 */
#include "runtime/train/bdh_tape.h"

#include <stdio.h>
#include <string.h>

#define F32 DG_FMT_F32

static int buf(dg__tape *t, const char *name, dg__bucket k, int ndim, int64_t a, int64_t b,
	       int64_t c, int64_t d)
{
	int64_t sh[4] = { a, b, c, d };
	return dg__tape_buf(t, name, F32, k, ndim, sh);
}

static int view(dg__tape *t, int parent, int i, int n, const char *name, int ndim, int64_t a,
		int64_t b, int64_t c, int64_t d)
{
	int64_t sh[4] = { a, b, c, d };
	return dg__tape_view(t, parent, i, n, name, ndim, sh);
}

static void node(dg__tape *t, dg__nkind k, int layer, int i0, int i1, int i2, int i3, int o0,
		 int o1, int arg)
{
	int in[4] = { i0, i1, i2, i3 }, out[2] = { o0, o1 };
	int ni = i3 >= 0 ? 4 : i2 >= 0 ? 3 : i1 >= 0 ? 2 : i0 >= 0 ? 1 : 0;
	dg__tape_node(t, k, layer, in, ni, out, o1 >= 0 ? 2 : 1, arg);
}

dg_status dg__bdh_tape_build(dg__tape *t, dg__bdh_ids *id)
{
	const dg_model_config *c = &t->config;
	const int64_t B = t->B, T = t->T, H = c->heads, D = c->embd, N = c->neurons, V = c->vocab;
	const int64_t Ly = c->layers, LB = Ly * B;
	char nm[64];

	memset(id, -1, sizeof(*id));
	/* parameters, the reference's layouts */
	id->params[DG_PARAM_EMBED] = buf(t, "embed.weight", DG__B_PARAMS, 2, V, D, 0, 0);
	id->params[DG_PARAM_ENCODER] = buf(t, "encoder", DG__B_PARAMS, 3, H, D, N, 0);
	id->params[DG_PARAM_ENCODER_V] = buf(t, "encoder_v", DG__B_PARAMS, 3, H, D, N, 0);
	id->params[DG_PARAM_DECODER] = buf(t, "decoder", DG__B_PARAMS, 2, H * N, D, 0, 0);
	id->params[DG_PARAM_LM_HEAD] = buf(t, "lm_head", DG__B_PARAMS, 2, D, V, 0, 0);
	for (int p = 0; p < DG_MODEL_N_PARAMS; p++) {
		const dg__tbuf *b = &t->bufs[id->params[p] >= 0 ? id->params[p] : 0];
		snprintf(nm, sizeof(nm), "grad.%.32s", b->name);
		id->grads[p] = dg__tape_buf(t, nm, F32, DG__B_GRADS, b->ndim, b->shape);
	}
	/* the execution copies and their gradients */
	id->exec[0] = buf(t, "encoder.exec", DG__B_LOWBIT, 3, H, N, D, 0);
	id->exec[1] = buf(t, "encoder_v.exec", DG__B_LOWBIT, 3, H, N, D, 0);
	id->exec[2] = buf(t, "decoder.exec", DG__B_LOWBIT, 2, D, H * N, 0, 0);
	id->gexec[0] = buf(t, "grad.encoder.exec", DG__B_TEMP, 3, H, N, D, 0);
	id->gexec[1] = buf(t, "grad.encoder_v.exec", DG__B_TEMP, 3, H, N, D, 0);
	id->gexec[2] = buf(t, "grad.decoder.exec", DG__B_TEMP, 2, D, H * N, 0, 0);
	id->tokens = buf(t, "tokens", DG__B_SAVED, 2, B, T, 0, 0);
	id->targets = buf(t, "targets", DG__B_SAVED, 2, B, T, 0, 0);
	id->cos = buf(t, "rope.cos", DG__B_LOWBIT, 2, T, N / 2, 0, 0);
	id->sin = buf(t, "rope.sin", DG__B_LOWBIT, 2, T, N / 2, 0, 0);
	id->loss = buf(t, "loss", DG__B_SAVED, 1, 1, 0, 0, 0);

	/* the stacks the weight gradients read as one GEMM each */
	int x_all = buf(t, "x.all", DG__B_SAVED, 4, LB, 1, T, D);
	int a_all = buf(t, "a.all", DG__B_SAVED, 4, LB, H, T, D);
	int xy_all = buf(t, "xy.all", DG__B_SAVED, 4, LB, H, T, N);
	int dxs_all = buf(t, "dxs.all", DG__B_TEMP, 4, LB, H, T, N);
	int dys_all = buf(t, "dys.all", DG__B_TEMP, 4, LB, H, T, N);
	int dyd_all = buf(t, "dyd.all", DG__B_TEMP, 4, LB, 1, T, D);

	/* forward */
	int emb = buf(t, "emb", DG__B_TEMP, 4, B, 1, T, D);
	int x0_rstd = buf(t, "x0.rstd", DG__B_SAVED, 1, B * T, 0, 0, 0);
	int *x = NULL;
	int xl[257], xsl[256], svl[256], al[256], arl[256], ysl[256], xyl[256], yl[256], yrl[256],
		orl[256];
	if (Ly > 256)
		return DG_ERR_INVALID_ARG;
	x = xl;
	for (int l = 0; l < Ly; l++) {
		snprintf(nm, sizeof(nm), "x.%d", l);
		xl[l] = view(t, x_all, l, (int)Ly, nm, 4, B, 1, T, D);
	}
	int x_final = buf(t, "x.final", DG__B_SAVED, 4, B, 1, T, D);
	xl[Ly] = x_final;
	node(t, DG__N_EMBED, -1, id->params[DG_PARAM_EMBED], id->tokens, -1, -1, emb, -1, 0);
	node(t, DG__N_LN, -1, emb, -1, -1, -1, x[0], x0_rstd, 0);
	for (int l = 0; l < Ly; l++) {
		snprintf(nm, sizeof(nm), "xs.%d", l);
		xsl[l] = buf(t, nm, DG__B_SAVED, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "attn.saved.%d", l);
		svl[l] = buf(t, nm, DG__B_SAVED, 4, B, H, T, N); /* the CPU's RoPE'd queries */
		int att = buf(t, "att", DG__B_TEMP, 4, B, H, T, D);
		snprintf(nm, sizeof(nm), "a.%d", l);
		al[l] = view(t, a_all, l, (int)Ly, nm, 4, B, H, T, D);
		snprintf(nm, sizeof(nm), "a.rstd.%d", l);
		arl[l] = buf(t, nm, DG__B_SAVED, 1, B * H * T, 0, 0, 0);
		snprintf(nm, sizeof(nm), "ys.%d", l);
		ysl[l] = buf(t, nm, DG__B_SAVED, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "xy.%d", l);
		xyl[l] = view(t, xy_all, l, (int)Ly, nm, 4, B, H, T, N);
		int yd = buf(t, "yd", DG__B_TEMP, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "y.%d", l);
		yl[l] = buf(t, nm, DG__B_SAVED, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "y.rstd.%d", l);
		yrl[l] = buf(t, nm, DG__B_SAVED, 1, B * T, 0, 0, 0);
		snprintf(nm, sizeof(nm), "out.rstd.%d", l);
		orl[l] = buf(t, nm, DG__B_SAVED, 1, B * T, 0, 0, 0);

		node(t, DG__N_PROJ, l, x[l], id->exec[0], -1, -1, xsl[l], -1, 0);
		node(t, DG__N_ATTN, l, xsl[l], x[l], id->cos, id->sin, att, svl[l], 0);
		node(t, DG__N_LN, l, att, -1, -1, -1, al[l], arl[l], 0);
		node(t, DG__N_PROJ, l, al[l], id->exec[1], -1, -1, ysl[l], -1, 1);
		node(t, DG__N_GATE, l, xsl[l], ysl[l], -1, -1, xyl[l], -1, 0);
		node(t, DG__N_DEC, l, xyl[l], id->exec[2], -1, -1, yd, -1, 0);
		node(t, DG__N_LN, l, yd, -1, -1, -1, yl[l], yrl[l], 0);
		node(t, DG__N_RESID_LN, l, x[l], yl[l], -1, -1, x[l + 1], orl[l], 0);
	}
	node(t, DG__N_CE, -1, x_final, id->params[DG_PARAM_LM_HEAD], id->targets, -1, id->loss, -1, 0);

	/* backward */
	int dx = buf(t, "dx", DG__B_TEMP, 4, B, 1, T, D);
	node(t, DG__N_CE_BWD, -1, x_final, id->params[DG_PARAM_LM_HEAD], id->targets, -1, dx,
	     id->grads[DG_PARAM_LM_HEAD], 0);
	for (int l = (int)Ly - 1; l >= 0; l--) {
		int ds = buf(t, "ds", DG__B_TEMP, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "dyd.%d", l);
		int dyd = view(t, dyd_all, l, (int)Ly, nm, 4, B, 1, T, D);
		int dxy = buf(t, "dxy", DG__B_TEMP, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "dxs.%d", l);
		int dxs = view(t, dxs_all, l, (int)Ly, nm, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "dys.%d", l);
		int dys = view(t, dys_all, l, (int)Ly, nm, 4, B, H, T, N);
		int da = buf(t, "da", DG__B_TEMP, 4, B, H, T, D);
		int datt = buf(t, "datt", DG__B_TEMP, 4, B, H, T, D);
		int dv = buf(t, "dv", DG__B_TEMP, 4, B, 1, T, D);
		int dxe = buf(t, "dxe", DG__B_TEMP, 4, B, 1, T, D);
		int dxn = buf(t, "dx", DG__B_TEMP, 4, B, 1, T, D);

		node(t, DG__N_LN_BWD, l, dx, x[l + 1], orl[l], -1, ds, -1, 0);   /* d(x + y) */
		node(t, DG__N_LN_BWD, l, ds, yl[l], yrl[l], -1, dyd, -1, 0);     /* y = LN(yd) */
		node(t, DG__N_DEC_IN, l, dyd, id->exec[2], -1, -1, dxy, -1, 0);
		node(t, DG__N_GATE_BWD, l, dxy, xsl[l], ysl[l], -1, dxs, dys, 0);
		node(t, DG__N_PROJ_IN, l, dys, id->exec[1], -1, -1, da, -1, 1);
		node(t, DG__N_LN_BWD, l, da, al[l], arl[l], -1, datt, -1, 0);
		node(t, DG__N_ATTN_BWD, l, datt, svl[l], x[l], xsl[l], dxs, dv, 0);
		node(t, DG__N_PROJ_IN, l, dxs, id->exec[0], -1, -1, dxe, -1, 0);
		node(t, DG__N_ADD3, l, ds, dv, dxe, -1, dxn, -1, 0);
		dx = dxn;
	}
	/* the shared weights: one GEMM each over every layer's rows */
	node(t, DG__N_PROJ_W, -1, dxs_all, x_all, -1, -1, id->gexec[0], -1, 0);
	node(t, DG__N_PROJ_W, -1, dys_all, a_all, -1, -1, id->gexec[1], -1, 1);
	node(t, DG__N_DEC_W, -1, dyd_all, xy_all, -1, -1, id->gexec[2], -1, 0);
	node(t, DG__N_TO_MASTER, -1, id->gexec[0], -1, -1, -1, id->grads[DG_PARAM_ENCODER], -1,
	     DG_PARAM_ENCODER);
	node(t, DG__N_TO_MASTER, -1, id->gexec[1], -1, -1, -1, id->grads[DG_PARAM_ENCODER_V], -1,
	     DG_PARAM_ENCODER_V);
	node(t, DG__N_TO_MASTER, -1, id->gexec[2], -1, -1, -1, id->grads[DG_PARAM_DECODER], -1,
	     DG_PARAM_DECODER);
	/* x0 = LN(embed[idx]) */
	int demb = buf(t, "demb", DG__B_TEMP, 4, B, 1, T, D);
	node(t, DG__N_LN_BWD, -1, dx, x[0], x0_rstd, -1, demb, -1, 0);
	node(t, DG__N_EMBED_BWD, -1, demb, id->tokens, -1, -1, id->grads[DG_PARAM_EMBED], -1, 0);
	return dg__tape_plan(t);
}
