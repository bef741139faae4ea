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
 * Backward, layers in reverse, then the embedding's gradient and the three
 * weight gradients over all layers' rows, each turned into its master's
 * layout right after its GEMM. The (B,H,T,N) gradients — dxs and dys,
 * stacked over the layers for the weight GEMMs (3.2 GB each in f32 at the
 * 25M shape, B 8, T 512) — are in the activations' format: bf16 on the
 * GPU's bf16 recipes (bf16, w8a8, bitnet: the ops round each to bf16 once,
 * dragon/spec.h "gradient formats"), f32 on the f32 one and on the CPU.
 * The (B,1,T,D) and (B,H,T,D) gradients stay f32. The GPU's low-bit tape
 * on sm_90 (bf16_grads) feeds the encoders' gradient GEMMs bf16: the input
 * gradients read exec_bf16 (the codes × scales, beside the codes), the
 * weight gradients a dequantize node's copy of the saved codes, made right
 * before and dead right after. Activation gradients overwrite
 * (dxs_l is written by the gate's backward, then the attention's adds to
 * it and applies the ReLU mask); parameter gradients are each written by
 * one node.
 */
#include "runtime/train/bdh_tape.h"
#include "runtime/train/model_int.h"

#include <stdio.h>
#include <string.h>

#define F32 DG_FMT_F32

static int buf(dg__tape *t, const char *name, dg__bucket k, int ndim, int64_t a, int64_t b,
	       int64_t c, int64_t d)
{
	int64_t sh[4] = { a, b, c, d };
	return dg__tape_buf(t, name, F32, k, ndim, sh);
}

/* An activation, in the target's format. */
static int abuf(dg__tape *t, dg_fmt act, const char *name, dg__bucket k, int ndim, int64_t a,
		int64_t b, int64_t c, int64_t d)
{
	int64_t sh[4] = { a, b, c, d };
	return dg__tape_buf(t, name, act, k, ndim, sh);
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

/* A node with a third output (the cross-entropy's backward rewrites the
 * loss: it must stay the loss's bytes until then). */
static void node3(dg__tape *t, dg__nkind k, int i0, int i1, int i2, int o0, int o1, int o2)
{
	int in[3] = { i0, i1, i2 }, out[3] = { o0, o1, o2 };
	dg__tape_node(t, k, -1, in, 3, out, 3, 0);
}

/* Layer l's projection k (an encoder) of in (its input, or its codes)
 * into out: the forward's, and recompute's again in the backward. */
static void proj(dg__tape *t, const dg__bdh_ids *id, int l, int in, dg_proj k, int out)
{
	node(t, DG__N_PROJ, l, in, id->exec[k], -1, -1, out, -1, k);
}

/* Layer l's share of projection k's weight gradient: gexec[k] (+)= the
 * rows of grad (B,H,T,N)ᵀ · in (its input: x, a, or their saved codes),
 * written by the backward's first layer and added by the others
 * (dg__bdh_grad_adds); bf16g: through a bf16 copy of the codes made right
 * before, a temporary. A layer at a time, so the (B,H,T,N) gradients are
 * a layer's, not a stack of every layer's (3.2 GB at 25M, B 8, T 512). */
static void grad_w(dg__tape *t, const dg__bdh_ids *id, bool bf16g, int l, int grad, int in, dg_proj k)
{
	if (bf16g) {
		const dg__tbuf *c = &t->bufs[in];
		int w = abuf(t, DG_FMT_BF16, k == DG_PROJ_ENCODER ? "xq.bf16" : "aq.bf16", DG__B_TEMP, 4,
			     c->shape[0], c->shape[1], c->shape[2], c->shape[3]);
		node(t, DG__N_DEQUANT, l, in, -1, -1, -1, w, -1, k);
		in = w;
	}
	node(t, DG__N_PROJ_W, l, grad, in, -1, -1, id->gexec[k], -1, k);
}

bool dg__bdh_grad_adds(const dg__tape *t, const dg__tnode *nd)
{
	return nd->kind == DG__N_PROJ_W && nd->layer >= 0 && nd->layer != t->config.layers - 1;
}

int64_t dg__bdh_attn_qr_offset(int64_t B, int64_t H, int64_t T, int64_t S, dg_fmt act)
{
	int64_t sc = B * H * T * S * (int64_t)dg_fmt_row_bytes(act, 1);
	return (sc + 255) / 256 * 256;
}

int64_t dg__bdh_attn_saved_bytes(int64_t B, int64_t H, int64_t T, int64_t S, int64_t N, dg_fmt act)
{
	return dg__bdh_attn_qr_offset(B, H, T, S, act) + B * H * T * N * (int64_t)dg_fmt_row_bytes(act, 1);
}

dg_status dg__bdh_tape_build(dg__tape *t, dg__bdh_ids *id, const dg__bdh_target *tg)
{
	const bool gpu = tg && tg->gpu;
	const dg_fmt act = gpu ? tg->act : DG_FMT_F32;
	/* a low-bit recipe: the GPU's codes with their scales, the CPU's the
	 * same values dequantized to f32 (fake quantization) */
	const bool lowbit = tg && tg->lowbit, codes = lowbit && gpu;
	/* the projections' gradient GEMMs read bf16 copies of the codes */
	const bool bf16g = codes && tg->bf16_grads;
	/* the decoder's input gradient fused with the gate's backward (a GPU
	 * node: the CPU model runs the two) */
	const bool dgate = gpu && tg->dec_gate && act == DG_FMT_BF16;
	/* the gate and the decoder's input quantizer as one node (gate_quant
	 * takes a scale a token) */
	const bool gq = codes && tg->gate_quant && t->config.decoder.ascale == DG_SCALE_TOKEN &&
			(t->config.decoder.act == DG_FMT_UINT8POS || t->config.decoder.act == DG_FMT_INT8);
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
	/* the execution copies (a low-bit recipe's: codes and their scales,
	 * one a channel or one a tensor) and their gradients */
	for (int k = 0; k < DG_PROJ__COUNT; k++) {
		const dg_proj_recipe *rc = dg__proj_recipe(c, k);
		const bool dec = k == DG_PROJ_DECODER;
		dg_fmt wf = codes ? rc->weight : act;
		int64_t sh[3] = { H, N, D }, dsh[2] = { D, H * N };
		snprintf(nm, sizeof(nm), "%s.exec", dg__proj_name(k));
		id->exec[k] = dg__tape_buf(t, nm, wf, DG__B_LOWBIT, dec ? 2 : 3, dec ? dsh : sh);
		if (codes) {
			int64_t ns = rc->wscale == DG_SCALE_CHANNEL ? (dec ? D : H * N) : 1;
			snprintf(nm, sizeof(nm), "%s.scale", dg__proj_name(k));
			dg__tape_set_scale(t, id->exec[k], buf(t, nm, DG__B_LOWBIT, 1, ns, 0, 0, 0));
		}
	}
	if (codes) { /* the transposed f32 master a copy is quantized from, and
		       * the codes a packed format is packed from */
		id->exec_f32 = buf(t, "exec.f32", DG__B_LOWBIT, 1, H * N * D, 0, 0, 0);
		int64_t n1[1] = { H * N * D };
		id->exec_codes = dg__tape_buf(t, "exec.codes", DG_FMT_INT8, DG__B_LOWBIT, 1, n1);
	}
	for (int k = 0; k < DG_PROJ__COUNT; k++) { /* 16 MiB each at the 25M shape */
		const bool dec = k == DG_PROJ_DECODER;
		int64_t sh[3] = { H, N, D }, dsh[2] = { D, H * N };
		if (!(dec ? codes && dgate : bf16g))
			continue;
		snprintf(nm, sizeof(nm), "%s.exec.bf16", dg__proj_name(k));
		id->exec_bf16[k] = dg__tape_buf(t, nm, DG_FMT_BF16, DG__B_LOWBIT, dec ? 2 : 3, dec ? dsh : sh);
	}
	const bool dfwd = gpu && tg->dec_fwd_gemm && !lowbit && act == DG_FMT_BF16;
	if (dfwd) { /* 16 MiB at the 25M shape */
		int64_t sh[3] = { H, N, D };
		id->dec_fwd = dg__tape_buf(t, "decoder.fwd.bf16", DG_FMT_BF16, DG__B_LOWBIT, 3, sh);
	}
	const dg__bucket gb = gpu && tg->keep_gexec ? DG__B_GRADS : DG__B_TEMP;
	id->gexec[DG_PROJ_ENCODER] = buf(t, "grad.encoder.exec", gb, 3, H, N, D, 0);
	id->gexec[DG_PROJ_ENCODER_V] = buf(t, "grad.encoder_v.exec", gb, 3, H, N, D, 0);
	id->gexec[DG_PROJ_DECODER] = buf(t, "grad.decoder.exec", gb, 2, D, H * N, 0, 0);
	int64_t bt2[2] = { B, T }, one[1] = { 1 };
	/* the batch is written before the first node and the loss read after
	 * the last: they live the whole step, beside the copies (a lifetime
	 * the nodes alone would give them is too short) */
	id->tokens = dg__tape_buf(t, "tokens", DG_FMT_I32, DG__B_LOWBIT, 2, bt2);
	id->targets = dg__tape_buf(t, "targets", DG_FMT_I32, DG__B_LOWBIT, 2, bt2);
	if (gpu) {
		id->rope = buf(t, "rope", DG__B_LOWBIT, 2, T, N, 0, 0);
		id->bad = dg__tape_buf(t, "bad", DG_FMT_I32, DG__B_LOWBIT, 1, one);
	} else {
		id->cos = buf(t, "rope.cos", DG__B_LOWBIT, 2, T, N / 2, 0, 0);
		id->sin = buf(t, "rope.sin", DG__B_LOWBIT, 2, T, N / 2, 0, 0);
	}
	id->loss = buf(t, "loss", DG__B_LOWBIT, 1, 1, 0, 0, 0);

	/* every layer's x and a, stacked (saved: the weight gradients read them) */
	int x_all = abuf(t, act, "x.all", DG__B_SAVED, 4, LB, 1, T, D);
	int a_all = abuf(t, act, "a.all", DG__B_SAVED, 4, LB, H, T, D);
	int xy_all = lowbit ? -1 : abuf(t, act, "xy.all", DG__B_SAVED, 4, LB, H, T, N);
	/* a low-bit recipe's quantized inputs, and their scales a token: the
	 * encoder's x (b, t), the encoder_v's a (b, h, t), the decoder's xy
	 * (b, t) over every head */
	int xq_all = -1, aq_all = -1, xyq_all = -1, xqs_all = -1, aqs_all = -1, xyqs_all = -1;
	if (lowbit) {
		int64_t s4a[4] = { LB, 1, T, D }, s4b[4] = { LB, H, T, D }, s4c[4] = { LB, H, T, N };
		xq_all = dg__tape_buf(t, "xq.all", codes ? c->encoder.act : F32, DG__B_SAVED, 4, s4a);
		aq_all = dg__tape_buf(t, "aq.all", codes ? c->encoder_v.act : F32, DG__B_SAVED, 4, s4b);
		xyq_all = dg__tape_buf(t, "xyq.all", codes ? c->decoder.act : F32, DG__B_SAVED, 4, s4c);
		if (codes) {
			xqs_all = buf(t, "xq.scale.all", DG__B_SAVED, 1, LB * T, 0, 0, 0);
			aqs_all = buf(t, "aq.scale.all", DG__B_SAVED, 1, LB * H * T, 0, 0, 0);
			xyqs_all = buf(t, "xyq.scale.all", DG__B_SAVED, 1, LB * T, 0, 0, 0);
			dg__tape_set_scale(t, xq_all, xqs_all);
			dg__tape_set_scale(t, aq_all, aqs_all);
			dg__tape_set_scale(t, xyq_all, xyqs_all);
		}
	}
	/* the decoder's output gradients of every layer, which its weight
	 * gradient reads as one GEMM ((L·B, 1, T, D), small) */
	int dyd_all = buf(t, "dyd.all", DG__B_TEMP, 4, LB, 1, T, D);
	/* stack_pgrads: the encoders' gradients of every layer, likewise */
	const bool spg = gpu && tg->stack_pgrads;
	int dxs_all = spg ? abuf(t, act, "dxs.all", DG__B_TEMP, 4, LB, H, T, N) : -1;
	int dys_all = spg ? abuf(t, act, "dys.all", DG__B_TEMP, 4, LB, H, T, N) : -1;

	/* forward */
	int emb = abuf(t, act, "emb", DG__B_TEMP, 4, B, 1, T, D);
	int x0_rstd = buf(t, "x0.rstd", DG__B_SAVED, 1, B * T, 0, 0, 0);
	int *x = NULL;
	int xl[257], xsl[256], svl[256], al[256], arl[256], ysl[256], xyl[256], yl[256], yrl[256],
		orl[256], xql[256], aql[256];
	if (Ly > 256)
		return DG_ERR_INVALID_ARG;
	x = xl;
	for (int l = 0; l < Ly; l++) {
		snprintf(nm, sizeof(nm), "x.%d", l);
		xl[l] = view(t, x_all, l, (int)Ly, nm, 4, B, 1, T, D);
	}
	int x_final = abuf(t, act, "x.final", DG__B_SAVED, 4, B, 1, T, D);
	xl[Ly] = x_final;
	id->x_final = x_final;
	node(t, DG__N_EMBED, -1, id->params[DG_PARAM_EMBED], id->tokens, -1, -1, emb, -1, 0);
	node(t, DG__N_LN, -1, emb, -1, -1, -1, x[0], x0_rstd, 0);
	/* recompute: xs and ys live through their layer's forward only;
	 * recompute_ys: ys alone */
	const bool rec = tg && tg->recompute, rec_ys = rec || (tg && tg->recompute_ys);
	/* ys made again inside DEC_GATE (decoder_gate_bwd_ys), from aq */
	const bool ys_in_gate = rec_ys && dgate && codes && tg->gate_ys;
	/* the GPU's saved scores: (B,H,T,T), or the chunks' (B,H,T,C) */
	const int64_t sc_cols = gpu && tg->attn_chunk > 0 ? tg->attn_chunk : T;
	const dg__bucket xs_bucket = rec ? DG__B_TEMP : DG__B_SAVED, ys_bucket = rec_ys ? DG__B_TEMP : DG__B_SAVED;
	for (int l = 0; l < Ly; l++) {
		snprintf(nm, sizeof(nm), "xs.%d", l);
		xsl[l] = abuf(t, act, nm, xs_bucket, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "attn.saved.%d", l);
		/* what the attention's backward reads: the CPU's RoPE'd
		 * queries, the GPU's scores */
		if (gpu && tg->keep_qr) /* scores, then RoPE(xs) (dg__bdh_target) */
			svl[l] = abuf(t, DG_FMT_INT8, nm, DG__B_SAVED, 1,
				      dg__bdh_attn_saved_bytes(B, H, T, sc_cols, N, act), 0, 0, 0);
		else
			svl[l] = gpu ? abuf(t, act, nm, DG__B_SAVED, 4, B, H, T, sc_cols)
				     : buf(t, nm, DG__B_SAVED, 4, B, H, T, N);
		int att = abuf(t, act, "att", DG__B_TEMP, 4, B, H, T, D);
		snprintf(nm, sizeof(nm), "a.%d", l);
		al[l] = view(t, a_all, l, (int)Ly, nm, 4, B, H, T, D);
		snprintf(nm, sizeof(nm), "a.rstd.%d", l);
		arl[l] = buf(t, nm, DG__B_SAVED, 1, B * H * T, 0, 0, 0);
		snprintf(nm, sizeof(nm), "ys.%d", l);
		ysl[l] = abuf(t, act, nm, ys_bucket, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "xy.%d", l);
		/* a low-bit recipe keeps xy's codes, not xy */
		xyl[l] = lowbit ? abuf(t, act, nm, DG__B_TEMP, 4, B, H, T, N)
				: view(t, xy_all, l, (int)Ly, nm, 4, B, H, T, N);
		int yd = abuf(t, dfwd ? F32 : act, "yd", DG__B_TEMP, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "y.%d", l);
		yl[l] = abuf(t, act, nm, DG__B_SAVED, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "y.rstd.%d", l);
		yrl[l] = buf(t, nm, DG__B_SAVED, 1, B * T, 0, 0, 0);
		snprintf(nm, sizeof(nm), "out.rstd.%d", l);
		orl[l] = buf(t, nm, DG__B_SAVED, 1, B * T, 0, 0, 0);

		int xq = -1, aq = -1, xyq = -1;
		if (lowbit) {
			snprintf(nm, sizeof(nm), "xq.%d", l);
			xq = view(t, xq_all, l, (int)Ly, nm, 4, B, 1, T, D);
			snprintf(nm, sizeof(nm), "aq.%d", l);
			aq = view(t, aq_all, l, (int)Ly, nm, 4, B, H, T, D);
			snprintf(nm, sizeof(nm), "xyq.%d", l);
			xyq = view(t, xyq_all, l, (int)Ly, nm, 4, B, H, T, N);
			if (codes) {
				dg__tape_set_scale(t, xq, view(t, xqs_all, l, (int)Ly, "xq.scale", 1, B * T, 0, 0, 0));
				dg__tape_set_scale(t, aq, view(t, aqs_all, l, (int)Ly, "aq.scale", 1, B * H * T, 0,
								 0, 0));
				dg__tape_set_scale(t, xyq, view(t, xyqs_all, l, (int)Ly, "xyq.scale", 1, B * T, 0,
								  0, 0));
			}
			node(t, DG__N_QUANT, l, x[l], -1, -1, -1, xq, -1, DG_PROJ_ENCODER);
		}
		xql[l] = xq;
		aql[l] = aq;
		/* proj_rope: RoPE(xs) into the layer's attention buffer as well,
		 * its second output (so that buffer lives from here on) */
		node(t, DG__N_PROJ, l, lowbit ? xq : x[l], id->exec[DG_PROJ_ENCODER], -1, -1, xsl[l],
		     gpu && tg->keep_qr && tg->proj_rope ? svl[l] : -1, DG_PROJ_ENCODER);
		node(t, DG__N_ATTN, l, xsl[l], x[l], gpu ? id->rope : id->cos, gpu ? -1 : id->sin, att,
		     svl[l], 0);
		node(t, DG__N_LN, l, att, -1, -1, -1, al[l], arl[l], 0);
		if (lowbit)
			node(t, DG__N_QUANT, l, al[l], -1, -1, -1, aq, -1, DG_PROJ_ENCODER_V);
		proj(t, id, l, lowbit ? aq : al[l], DG_PROJ_ENCODER_V, ysl[l]);
		if (gq) { /* the product never in memory: xyl[l] is left untouched */
			node(t, DG__N_GATE_Q, l, xsl[l], ysl[l], -1, -1, xyq, -1, DG_PROJ_DECODER);
		} else {
			node(t, DG__N_GATE, l, xsl[l], ysl[l], -1, -1, xyl[l], -1, 0);
			if (lowbit)
				node(t, DG__N_QUANT, l, xyl[l], -1, -1, -1, xyq, -1, DG_PROJ_DECODER);
		}
		node(t, DG__N_DEC, l, lowbit ? xyq : xyl[l], dfwd ? id->dec_fwd : id->exec[DG_PROJ_DECODER], -1,
		     -1, yd, -1, 0);
		node(t, DG__N_LN, l, yd, -1, -1, -1, yl[l], yrl[l], 0);
		node(t, DG__N_RESID_LN, l, x[l], yl[l], -1, -1, x[l + 1], orl[l], 0);
	}
	node(t, DG__N_CE, -1, x_final, id->params[DG_PARAM_LM_HEAD], id->targets, -1, id->loss, -1, 0);

	/* backward */
	int dx = buf(t, "dx", DG__B_TEMP, 4, B, 1, T, D);
	node3(t, DG__N_CE_BWD, x_final, id->params[DG_PARAM_LM_HEAD], id->targets, dx,
	      id->grads[DG_PARAM_LM_HEAD], id->loss);
	for (int l = (int)Ly - 1; l >= 0; l--) {
		int ds = buf(t, "ds", DG__B_TEMP, 4, B, 1, T, D);
		snprintf(nm, sizeof(nm), "dyd.%d", l);
		int dyd = view(t, dyd_all, l, (int)Ly, nm, 4, B, 1, T, D);
		/* the layer's (B,H,T,N) gradients in the activations' format (the
		 * CPU's and the f32 recipe's: f32), dead after the layer's weight
		 * gradients: the next layer's reuse their bytes */
		snprintf(nm, sizeof(nm), "dxs.%d", l);
		int dxs = spg ? view(t, dxs_all, l, (int)Ly, nm, 4, B, H, T, N)
			      : abuf(t, act, nm, DG__B_TEMP, 4, B, H, T, N);
		snprintf(nm, sizeof(nm), "dys.%d", l);
		int dys = spg ? view(t, dys_all, l, (int)Ly, nm, 4, B, H, T, N)
			      : abuf(t, act, nm, DG__B_TEMP, 4, B, H, T, N);
		int da = buf(t, "da", DG__B_TEMP, 4, B, H, T, D);
		int datt = buf(t, "datt", DG__B_TEMP, 4, B, H, T, D);
		int dv = buf(t, "dv", DG__B_TEMP, 4, B, 1, T, D);
		int dxe = buf(t, "dxe", DG__B_TEMP, 4, B, 1, T, D);
		int dxn = buf(t, "dx", DG__B_TEMP, 4, B, 1, T, D);

		/* recompute: the layer's xs and ys again, as its forward made
		 * them (the same projections of the same saved inputs);
		 * recompute_ys: ys alone */
		int xs = xsl[l], ys = ysl[l];
		if (rec) {
			snprintf(nm, sizeof(nm), "xs.again.%d", l);
			xs = abuf(t, act, nm, DG__B_TEMP, 4, B, H, T, N);
			proj(t, id, l, lowbit ? xql[l] : x[l], DG_PROJ_ENCODER, xs);
		}
		if (rec_ys && !ys_in_gate) {
			snprintf(nm, sizeof(nm), "ys.again.%d", l);
			ys = abuf(t, act, nm, DG__B_TEMP, 4, B, H, T, N);
			proj(t, id, l, lowbit ? aql[l] : al[l], DG_PROJ_ENCODER_V, ys);
		}
		node(t, DG__N_LN_BWD, l, dx, x[l + 1], orl[l], -1, ds, -1, 0);   /* d(x + y) */
		node(t, DG__N_LN_BWD, l, ds, yl[l], yrl[l], -1, dyd, -1, 0);     /* y = LN(yd) */
		/* dxy lands in dys's bytes; the gate's backward turns it into
		 * dys in place (dgate: one node writes dxs and dys, no dxy) */
		if (dgate) {
			/* ys_in_gate: the layer's codes aq in ys's place (the
			 * encoder_v's copy, a weight, is the node's own read) */
			node(t, DG__N_DEC_GATE, l, dyd,
			     codes ? id->exec_bf16[DG_PROJ_DECODER] : id->exec[DG_PROJ_DECODER], xs,
			     ys_in_gate ? aql[l] : ys, dxs, dys, 0);
		} else {
			node(t, DG__N_DEC_IN, l, dyd, id->exec[DG_PROJ_DECODER], -1, -1, dys, -1, 0);
			node(t, DG__N_GATE_BWD, l, dys, xs, ys, -1, dxs, dys, 0);
		}
		node(t, DG__N_PROJ_IN, l, dys,
		     bf16g ? id->exec_bf16[DG_PROJ_ENCODER_V] : id->exec[DG_PROJ_ENCODER_V], -1, -1, da, -1,
		     DG_PROJ_ENCODER_V);
		if (!spg)
			grad_w(t, id, bf16g, l, dys, lowbit ? aql[l] : al[l], DG_PROJ_ENCODER_V);
		node(t, DG__N_LN_BWD, l, da, al[l], arl[l], -1, datt, -1, 0);
		node(t, DG__N_ATTN_BWD, l, datt, svl[l], x[l], xs, dxs, dv, 0);
		node(t, DG__N_PROJ_IN, l, dxs, bf16g ? id->exec_bf16[DG_PROJ_ENCODER] : id->exec[DG_PROJ_ENCODER],
		     -1, -1, dxe, -1, DG_PROJ_ENCODER);
		if (!spg)
			grad_w(t, id, bf16g, l, dxs, lowbit ? xql[l] : x[l], DG_PROJ_ENCODER);
		node(t, DG__N_ADD3, l, ds, dv, dxe, -1, dxn, -1, 0);
		dx = dxn;
	}
	/* x0 = LN(embed[idx]) first: the embedding's gradient is then done
	 * (and on its way to the other ranks, data parallel) while the three
	 * weight GEMMs run */
	int demb = buf(t, "demb", DG__B_TEMP, 4, B, 1, T, D);
	node(t, DG__N_LN_BWD, -1, dx, x[0], x0_rstd, -1, demb, -1, 0);
	node(t, DG__N_EMBED_BWD, -1, demb, id->tokens, -1, -1, id->grads[DG_PARAM_EMBED], -1, 0);
	/* the encoders' gradients are whole (each layer's added by grad_w, or
	 * stack_pgrads: one GEMM each over every layer's rows, here); each
	 * master's right after its last GEMM, so a bucket's all-reduce runs
	 * beside the next one; the decoder's weight gradient: one GEMM over
	 * every layer's rows */
	if (spg)
		grad_w(t, id, bf16g, -1, dys_all, lowbit ? aq_all : a_all, DG_PROJ_ENCODER_V);
	node(t, DG__N_TO_MASTER, -1, id->gexec[DG_PROJ_ENCODER_V], -1, -1, -1, id->grads[DG_PARAM_ENCODER_V], -1,
	     DG_PARAM_ENCODER_V);
	if (spg)
		grad_w(t, id, bf16g, -1, dxs_all, lowbit ? xq_all : x_all, DG_PROJ_ENCODER);
	node(t, DG__N_TO_MASTER, -1, id->gexec[DG_PROJ_ENCODER], -1, -1, -1, id->grads[DG_PARAM_ENCODER], -1,
	     DG_PARAM_ENCODER);
	node(t, DG__N_DEC_W, -1, dyd_all, lowbit ? xyq_all : xy_all, -1, -1, id->gexec[DG_PROJ_DECODER], -1, 0);
	node(t, DG__N_TO_MASTER, -1, id->gexec[DG_PROJ_DECODER], -1, -1, -1, id->grads[DG_PARAM_DECODER], -1,
	     DG_PARAM_DECODER);
	return t->oom ? DG_ERR_NOMEM : DG_OK;
}
