/*
 * The GPU model's nodes (runtime/train/gpu_model_int.h): each kind of the
 * tape's nodes as the GPU ops it runs, with the specs that pick their
 * kernels (the recipes' formats, the sm_90 warpgroup paths, the fused
 * backward ops), and the sizing pass that asks each op its workspace and
 * prepares its kernels before the arenas are planned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ref.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/checks.h"
#include "runtime/train/gpu_model_int.h"

/* A buffer's device address; while sizing, a distinct placeholder a
 * buffer, so the ops' aliasing checks see what the plan will give
 * (distinct buffers, views inside their parents): the root buffers laid
 * end to end (gpu_model.c dg__gm_fake_layout), so no two share a byte at
 * any size (a fixed stride a buffer once made a workspace past it, the
 * quadratic attention's scores at a long T, seem to overlap the next
 * buffer, and refused the shape as aliasing instead of by its memory),
 * and a view at its place in its root. Not the root's arena offset: build
 * plans the tape before sizing (its memory check), and that offset added
 * to the placeholder moved buffers onto others (the 25M w8a8 step was
 * refused as dxs overlapping the attention's workspace). */
dg_dptr dg__gm_addr(const dg_model *m, int id)
{
	if (m->sizing) {
		const int root = dg__tape_root(&m->t, id);
		const size_t in_root = dg__tape_offset(&m->t, id) - m->t.bufs[root].offset;
		return (root < m->n_fake ? m->fake[root] : FAKE_BASE) + in_root;
	}
	return m->base[dg__tape_arena_of(&m->t, id)] + dg__tape_offset(&m->t, id);
}

/* Buffer id as a tensor; codes carry their scales' address. */
dg_tensor dg__gm_tn(const dg_model *m, int id)
{
	const dg__tbuf *b = &m->t.bufs[id];
	dg_tensor x = dg_tensor_make(b->name, b->fmt, dg__gm_addr(m, id), b->ndim, b->shape);
	if (b->scale >= 0)
		x.scale = dg__gm_addr(m, b->scale);
	return x;
}

/* The buffer as rows of width w: (R, w). */
static dg_tensor rows(const dg_model *m, int id, int64_t w)
{
	dg_tensor x = dg__gm_tn(m, id);
	int64_t n = dg_tensor_numel(&x);
	return dg_tensor_2d(x.name, x.fmt, x.data, n / w, w);
}

static dg_tensor flat(const dg_model *m, int id)
{
	dg_tensor x = dg__gm_tn(m, id);
	return dg_tensor_1d(x.name, x.fmt, x.data, dg_tensor_numel(&x));
}

/* A node's workspace; while sizing (none yet), a placeholder address its
 * ops can be prepared with. */
static dg_workspace ws_of(const dg_model *m, const dg__tnode *nd)
{
	dg_workspace w = { 0, 0 };
	if (m->sizing && nd->ws < 0) {
		w.ptr = m->fake ? m->fake[m->n_fake] : FAKE_BASE;
		return w;
	}
	if (nd->ws >= 0) {
		w.ptr = dg__gm_tn(m, nd->ws).data;
		w.bytes = m->t.bufs[nd->ws].bytes;
	}
	return w;
}

/* ---- specs ------------------------------------------------------------------- */

dg_spec dg__gm_base_spec(const dg_model *m, dg_op op)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = m->H;
	s.embd = m->D;
	s.latent = m->N;
	s.vocab = m->V;
	s.weight = m->act;
	s.act = m->act;
	s.out = m->act;
	s.src = m->act;
	if (m->sm > 0)
		s.arch = m->sm;
	return s;
}

/* The format of the (B,H,T,N) gradients (the tape's dxs.l, dys.l): the
 * activations' (dragon/spec.h "gradient formats"). */
static dg_fmt grad_fmt(const dg_model *m)
{
	return m->act;
}

/* add_mask's spec: dxs (the gradient) in grad_fmt, the attention's grad_xs
 * (other) f32 in the node's workspace (measured: written as bf16 from the
 * accumulator layout, half-sector stores made the attention's backward
 * slower, 8.8 ms against 8.0), xs in the activations' format. Where the
 * warpgroup path runs (attn_fused) grad_xs's epi=mask does it instead. */
static dg_spec add_mask_spec(const dg_model *m)
{
	dg_spec s = dg__gm_base_spec(m, DG_OP_ADD_MASK);
	s.out = grad_fmt(m);
	s.src = DG_FMT_F32;
	dg_spec_normalize(&s);
	return s;
}

/* The recipe of projection which. */
const dg_proj_recipe *dg__gm_recipe(const dg_model *m, dg_proj which)
{
	return dg__proj_recipe(&m->c, which);
}

/* A spec with projection which's formats and scales (a float recipe: the
 * activations' format, no scales). */
static void set_recipe(const dg_model *m, dg_spec *s, dg_proj which)
{
	if (!m->lowbit)
		return;
	const dg_proj_recipe *r = dg__gm_recipe(m, which);
	s->weight = r->weight;
	s->act = r->act;
	s->wscale = r->wscale;
	s->ascale = r->ascale;
}

/* The f32 recipe is the parity one: its gradient GEMMs take the fp32
 * SIMT path (a K step of 8, which the bf16 tensor cores do not take), not
 * the default tensor-core tiles, which round the f32 gradient to bf16. A
 * K step divides the GEMMs' compile-time reductions (the neurons a head,
 * the embd): 4 where either is not a multiple of 8 (N 1004, say). */
static void exact_tile(const dg_model *m, dg_spec *s)
{
	if (m->act != DG_FMT_F32)
		return;
	if (s->op == DG_OP_LOWRANK_GRAD_INPUT || s->op == DG_OP_LOWRANK_GRAD_WEIGHT ||
	    s->op == DG_OP_DECODER_GRAD_INPUT || s->op == DG_OP_DECODER_GRAD_WEIGHT) {
		const int bk = m->N % 8 || m->D % 8 ? 4 : 8;
		dg_tile t = { .bm = 64, .bn = 64, .bk = bk, .wm = 2, .wn = 2, .stages = 2 };
		s->tile = t;
	}
}

static dg_spec proj_spec(const dg_model *m, dg_op op, dg_proj which)
{
	dg_spec s = dg__gm_base_spec(m, op);
	set_recipe(m, &s, which);
	s.out = m->act;
	s.in_heads = which == DG_PROJ_ENCODER_V ? m->H : 1;
	if (op == DG_OP_LOWRANK_FWD) {
		s.relu = true;
		s.relu_thr = which == DG_PROJ_ENCODER_V ? m->c.thr_y : m->c.thr_x;
		/* integer codes, or bf16 activations × bf16 weights, on sm_90:
		 * the warpgroup (wgmma) path */
		bool bf16 = s.act == DG_FMT_BF16 && s.weight == DG_FMT_BF16;
		s.arch_specific = (m->lowbit || bf16) && s.arch == 90;
	}
	if (m->bf16_grads && (op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_LOWRANK_GRAD_WEIGHT)) {
		/* the dequantized copies (exec_bf16, the DEQUANT nodes' stacks):
		 * bf16 operands on sm_90a, which the warpgroup path takes */
		s.weight = DG_FMT_BF16;
		s.wscale = DG_SCALE_TENSOR;
		s.act = DG_FMT_BF16;
		s.ascale = DG_SCALE_TENSOR;
		s.arch_specific = true;
	}
	exact_tile(m, &s);
	dg_spec_normalize(&s);
	return s;
}

/* dequantize's spec: codes of act with the granularity g, to bf16. */
dg_spec dg__gm_dequant_spec(const dg_model *m, dg_fmt act, dg_scale_gran g)
{
	dg_spec s = dg__gm_base_spec(m, DG_OP_DEQUANTIZE);
	s.act = act;
	s.ascale = g;
	s.out = DG_FMT_BF16;
	dg_spec_normalize(&s);
	return s;
}

dg_spec dg__gm_op_spec(const dg_model *m, dg_op op)
{
	dg_spec s = dg__gm_base_spec(m, op);
	dg_spec_normalize(&s);
	return s;
}

/* ---- the nodes ---------------------------------------------------------------- */

/* One op of a node through its prepared slots (dg__op_exec): prepared
 * while sizing, its workspace bytes into *need (NULL: none wanted), then
 * launched from the slot with only its tensors compared. */
static dg_status node_op(dg__op_exec *x, const dg_spec *s, const void *args, size_t *need)
{
	dg_status st = dg__exec_args(x, s, args);
	if (!st && need)
		*need = dg__exec_last_ws(x);
	return st;
}

/* An attention op's spec: bf16 on sm_90 takes the warpgroup GEMMs, which
 * read RoPE(xs) made by the chain (rope=pre, arch=sm_90a). */
static dg_spec attn_spec(const dg_model *m, dg_op op)
{
	dg_spec s = dg__gm_base_spec(m, op);
	if (m->act == DG_FMT_BF16 && s.arch == 90) {
		s.arch_specific = true;
		s.rope_pre = true;
	}
	return s; /* not normalized: the chains read embd and latent */
}

/* The layer's saved attention buffer: the scores (B,H,T,T), and with
 * keep_qr RoPE(xs) (B,H,T,N) after them (runtime/train/bdh_tape.h), which
 * the forward writes and the backward reads (qr NULL: not kept). */
static dg_tensor attn_saved(const dg_model *m, int id, dg_tensor *qr)
{
	dg_tensor all = dg__gm_tn(m, id);
	if (!m->keep_qr) {
		if (qr)
			qr->data = 0;
		return all;
	}
	const int cols = m->attn_chunk ? m->attn_chunk : m->T;
	dg_tensor sc = dg_tensor_4d("scores", m->act, all.data, m->B, m->H, m->T, cols);
	if (qr)
		*qr = dg_tensor_4d("qr", m->act,
				   all.data + (dg_dptr)dg__bdh_attn_qr_offset(m->B, m->H, m->T, cols, m->act), m->B,
				   m->H, m->T, m->N);
	return sc;
}

/* Whether the attention's backward adds its grad_xs into dxs in grad_xs's
 * own epilogue (epi=mask, the chain given dxs): where the warpgroup path
 * runs, whose staged epilogue moves dxs and xs in whole lines; so the f32
 * grad_xs (B·H·T·N floats, 537 MB at B 8, T 512) and add_mask's pass over
 * it are gone. The other paths keep the pair: their fused epilogue stores
 * from the accumulator layout (half-sector bf16 pairs), not yet measured
 * against it. */
static bool attn_fused(const dg_model *m)
{
	return attn_spec(m, DG_OP_ATTENTION_GRAD_XS).arch_specific;
}

/* A decoder's attention node (gpu_decode.c): attention_step on layer
 * nd->layer's state, xs (B,H,1,N), v = the layer's input x (B,1,1,D) and
 * att (B,H,1,D), all in act, at the rows' positions in pos_d. */
static dg_status attn_step(dg_model *m, dg__op_exec *ex, const dg__tnode *nd, size_t *need)
{
	const int *in = nd->in, *out = nd->out;
	dg_fmt f = m->t.bufs[out[0]].fmt;
	if (m->t.bufs[in[0]].fmt != f || m->t.bufs[in[1]].fmt != f)
		return dg__dev_fail(m->dev, DG_ERR_UNSUPPORTED,
				    "decoding: the attention's xs, x and output in one format (%s, %s, %s)",
				    dg_fmt_name(m->t.bufs[in[0]].fmt), dg_fmt_name(m->t.bufs[in[1]].fmt),
				    dg_fmt_name(f));
	dg_spec s = dg__gm_base_spec(m, DG_OP_ATTENTION_STEP);
	s.act = f;
	dg_spec_normalize(&s);
	const dg_dptr layer = (dg_dptr)m->B * m->H * m->N * m->D * sizeof(float);
	dg_tensor xs = dg__gm_tn(m, in[0]), v = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
	dg_tensor pos = dg_tensor_1d("pos", DG_FMT_F32, m->pos_d, m->B);
	dg_tensor freq = dg_tensor_1d("freq", DG_FMT_F32, m->freq_d, m->N);
	dg_tensor st = dg_tensor_4d("state", DG_FMT_F32, m->state + (dg_dptr)nd->layer * layer, m->B, m->H, m->N,
				    m->D);
	dg_attention_step_args a = { .xs = &xs, .pos = &pos, .freq = &freq, .v = &v, .state = &st, .out = &o };
	return node_op(ex, &s, &a, need);
}

/* DEC_GATE with ys made in its tiles (gate_ys where ys is made again:
 * decoder_gate_bwd_ys): in[3] is the layer's encoder_v codes aq with their
 * scales, the weight the encoder_v's execution copy (codes, (H, N, D),
 * its scales); ys is relu(aq·evᵀ·sa·sw − thr_y) rounded to act, what the
 * projection wrote. */
static dg_status dec_gate_ys(dg_model *m, dg__op_exec *ex, const dg__tnode *nd, float p, uint64_t seed,
			     uint32_t step, uint64_t elem0)
{
	const int *in = nd->in, *out = nd->out;
	dg_spec s = dg__gm_op_spec(m, DG_OP_DECODER_GATE_BWD_YS);
	const dg_proj_recipe *r = dg__gm_recipe(m, DG_PROJ_ENCODER_V);
	s.act = r->act;
	s.weight = r->weight;
	s.ascale = r->ascale;
	s.wscale = r->wscale;
	s.relu = true;
	s.relu_thr = m->c.thr_y;
	s.src = m->act;
	s.out = grad_fmt(m); /* dxs, dys */
	dg_spec_normalize(&s);
	dg_tensor g = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), xs = dg__gm_tn(m, in[2]), aq = dg__gm_tn(m, in[3]),
		  ev = dg__gm_tn(m, m->id.exec[DG_PROJ_ENCODER_V]), dxs = dg__gm_tn(m, out[0]),
		  dys = dg__gm_tn(m, out[1]);
	w.scale = 0;
	dg_decoder_gate_bwd_ys_args a = { .grad = &g, .w = &w, .xs = &xs, .aq = &aq, .ev = &ev, .dxs = &dxs,
					  .dys = &dys, .p = p, .seed = seed, .step = step,
					  .layer = (uint32_t)nd->layer, .step_at = m->step_at, .elem0 = elem0 };
	return node_op(ex, &s, &a, NULL);
}

/* One node on the device; sizing: *need gets its workspace bytes instead
 * (nothing launched). */
dg_status dg__gm_run_node(dg_model *m, const dg__tnode *nd, const dg_model_batch *bt, size_t *need)
{
	dg_device *dev = m->dev;
	const int *in = nd->in, *out = nd->out;
	const int64_t D = m->D;
	const float eps = m->c.ln_eps;
	dg_workspace ws = ws_of(m, nd);
	dg__op_exec *ex = &m->ex[nd - m->t.nodes];
	dg__exec_begin(ex, need != NULL);
	float p = bt && bt->train ? m->c.dropout : 0.0f;
	uint64_t seed = bt ? bt->seed : 0;
	uint32_t step = bt ? bt->step : 0;
	/* data parallel: the gate's first element in the global batch's
	 * (B,H,T,N) tensor, so a rank draws the masks of its rows there */
	const uint64_t elem0 = bt ? (uint64_t)bt->row0 * (uint64_t)m->H * (uint64_t)m->T * (uint64_t)m->N : 0;

	switch (nd->kind) {
	case DG__N_EMBED: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_EMBED_FWD);
		dg_tensor idx = flat(m, in[1]), tab = dg__gm_tn(m, in[0]), o = rows(m, out[0], D);
		dg_embed_fwd_args a = { .idx = &idx, .table = &tab, .out = &o, .bad = dg__gm_tn(m, m->id.bad).data };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_LN: {
		dg_spec s = dg__gm_base_spec(m, DG_OP_LAYERNORM_FWD);
		s.src = m->t.bufs[in[0]].fmt; /* the decoder's f32 yd, else act */
		dg_spec_normalize(&s);
		dg_tensor x = rows(m, in[0], D), y = rows(m, out[0], D), r = flat(m, out[1]);
		dg_layernorm_fwd_args a = { .x = &x, .y = &y, .rstd = &r, .eps = eps };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_PROJ: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_FWD, (dg_proj)nd->arg);
		dg_tensor x = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &o };
		dg_tensor qr, rope;
		if (out[1] >= 0) { /* proj_rope (bdh_tape.c): RoPE(xs) into the layer's kept qr too */
			attn_saved(m, out[1], &qr);
			rope = dg__gm_tn(m, m->id.rope);
			s.epi = DG_EPI_ROPE;
			dg_spec_normalize(&s);
			a.rope = &rope;
			a.qr = &qr;
		}
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_ATTN: {
		if (m->decode) /* a token a row against the layer's state */
			return attn_step(m, ex, nd, need);
		dg_spec s = attn_spec(m, DG_OP_ATTENTION_SCORES);
		dg_tensor qr, sc = attn_saved(m, out[1], &qr);
		dg_tensor xs = dg__gm_tn(m, in[0]), v = dg__gm_tn(m, in[1]), rope = dg__gm_tn(m, in[2]),
			  o = dg__gm_tn(m, out[0]);
		dg_attention_fwd_args a = { .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .out = &o,
					    .ws = ws, .qr = m->keep_qr ? &qr : NULL, .chunk = m->attn_chunk,
					    .qr_made = m->proj_rope };
		if (need) {
			dg_status st = dg_attention_fwd_workspace(&s, &a, need);
			if (st)
				return dg__dev_fail(dev, st, "the attention: no workspace size");
		}
		return dg__attention_fwd_exec(ex, &s, &a);
	}
	case DG__N_GATE: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_GATE_FWD);
		dg_tensor xs = dg__gm_tn(m, in[0]), ys = dg__gm_tn(m, in[1]), xy = dg__gm_tn(m, out[0]);
		dg_gate_fwd_args a = { .xs = &xs, .ys = &ys, .xy = &xy, .p = p, .seed = seed,
				       .step = step, .layer = (uint32_t)nd->layer, .step_at = m->step_at,
				       .elem0 = elem0 };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_GATE_Q: {
		/* xy (B,H,T,N) = the gate's product, quantized a token over its
		 * heads (the decoder's recipe), never in memory */
		dg_spec s = dg__gm_base_spec(m, DG_OP_GATE_QUANT);
		const dg_proj_recipe *r = dg__gm_recipe(m, DG_PROJ_DECODER);
		s.src = m->act;
		s.act = r->act;
		dg_spec_normalize(&s);
		dg_tensor xs = dg__gm_tn(m, in[0]), ys = dg__gm_tn(m, in[1]), q = dg__gm_tn(m, out[0]);
		dg_gate_quant_args a = { .xs = &xs, .ys = &ys, .codes = &q, .p = p, .seed = seed, .step = step,
					 .layer = (uint32_t)nd->layer, .step_at = m->step_at, .elem0 = elem0 };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_QUANT: {
		/* a token a row: x (B,1,T,D), a (B·H,1,T,D), xy (B,H,T,N) over its heads */
		dg_spec s = dg__gm_base_spec(m, DG_OP_QUANTIZE_ACT);
		const dg_proj_recipe *r = dg__gm_recipe(m, (dg_proj)nd->arg);
		s.src = m->act;
		s.act = r->act;
		s.ascale = r->ascale;
		dg_spec_normalize(&s);
		dg_tensor x = dg__gm_tn(m, in[0]), q = dg__gm_tn(m, out[0]);
		if (nd->arg == DG_PROJ_ENCODER_V) {
			int64_t sh[4] = { (int64_t)m->B * m->H, 1, m->T, D };
			x = dg_tensor_make(x.name, x.fmt, x.data, 4, sh);
			dg_dptr sc = q.scale;
			q = dg_tensor_make(q.name, q.fmt, q.data, 4, sh);
			q.scale = sc;
		}
		dg_quantize_act_args a = { .x = &x, .codes = &q, .ws = ws };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_DEC: {
		if (in[1] == m->id.dec_fwd) {
			/* yd (B,1,T,D) f32 = Σ_h xy_h (B,T,N) · dec_h (N,D): the
			 * projection's input-gradient GEMM on the warpgroup path */
			dg_spec s = dg__gm_base_spec(m, DG_OP_LOWRANK_GRAD_INPUT);
			s.in_heads = 1;
			s.src = m->act;
			s.weight = DG_FMT_BF16;
			s.arch_specific = true;
			dg_spec_normalize(&s);
			dg_tensor g = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
			dg_lowrank_grad_input_args a = { .grad = &g, .w = &w, .grad_x = &o, .ws = ws };
			return node_op(ex, &s, &a, need);
		}
		dg_spec s = dg__gm_op_spec(m, DG_OP_DECODER_FWD);
		set_recipe(m, &s, DG_PROJ_DECODER);
		s.out = m->act;
		dg_spec_normalize(&s);
		dg_tensor y = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &o, .ws = ws };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_RESID_LN: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_RESID_LN_FWD);
		dg_tensor x = rows(m, in[0], D), y = rows(m, in[1], D), o = rows(m, out[0], D),
			  r = flat(m, out[1]);
		dg_resid_ln_fwd_args a = { .x = &x, .y = &y, .out = &o, .rstd = &r, .eps = eps };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_CE:
	case DG__N_CE_BWD: {
		bool bwd = nd->kind == DG__N_CE_BWD;
		dg_spec s = dg__gm_op_spec(m, DG_OP_LMHEAD_CE);
		s.weight = DG_FMT_F32; /* the f32 master */
		dg_spec_normalize(&s);
		dg_tensor x = rows(m, in[0], D), w = dg__gm_tn(m, in[1]), tg = flat(m, in[2]),
			  loss = flat(m, m->id.loss);
		dg_tensor dx, dw;
		dg_lmhead_ce_args a = { .x = &x, .w = &w, .targets = &tg, .loss = &loss,
					.backward = bwd, .ws = ws, .bad = dg__gm_tn(m, m->id.bad).data };
		if (bwd) {
			dx = rows(m, out[0], D);
			dw = dg__gm_tn(m, out[1]);
			a.dx = &dx;
			a.dw = &dw;
			a.accumulate = m->micro > 0; /* a later micro-batch adds */
			a.grad_scale = m->grad_scale_at;
		}
		/* its kernels prepared while sizing: a vocab they cannot serve
		 * (its logits row past shared memory) is refused by field at
		 * create, before the arenas are allocated */
		return node_op(ex, &s, &a, need);
	}
	case DG__N_LN_BWD: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_LAYERNORM_BWD);
		dg_tensor dy = rows(m, in[0], D), y = rows(m, in[1], D), r = flat(m, in[2]),
			  dx = rows(m, out[0], D);
		dg_layernorm_bwd_args a = { .dy = &dy, .y = &y, .rstd = &r, .dx = &dx };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_DEC_IN: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_DECODER_GRAD_INPUT);
		set_recipe(m, &s, DG_PROJ_DECODER);
		s.out = grad_fmt(m); /* dxy, written into dys's bytes */
		exact_tile(m, &s);
		dg_spec_normalize(&s);
		dg_tensor g = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_decoder_grad_input_args a = { .grad = &g, .w = &w, .grad_y = &o };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_GATE_BWD: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_GATE_BWD);
		s.out = grad_fmt(m); /* dxy, dys over it, dxs */
		dg_spec_normalize(&s);
		dg_tensor dxy = dg__gm_tn(m, in[0]), xs = dg__gm_tn(m, in[1]), ys = dg__gm_tn(m, in[2]), dxs = dg__gm_tn(m, out[0]);
		dg_gate_bwd_args a = { .dxy = &dxy, .xs = &xs, .ys = &ys, .dxs = &dxs, .p = p,
				       .seed = seed, .step = step, .layer = (uint32_t)nd->layer,
				       .step_at = m->step_at, .elem0 = elem0 };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_DEC_GATE: {
		/* the tape's choice (bdh_tape.c ys_in_gate): the codes aq in ys's place */
		if (dg_fmt_is_code(m->t.bufs[in[3]].fmt))
			return dec_gate_ys(m, ex, nd, p, seed, step, elem0);
		/* the decoder's bf16 weight (D, H·N): the bf16 recipe's copy or
		 * a low-bit one's dequantized codes; sm_90a picks the warpgroup
		 * path (dg_codegen_plan_for) */
		dg_spec s = dg__gm_op_spec(m, DG_OP_DECODER_GATE_BWD);
		s.weight = DG_FMT_BF16;
		s.act = m->act;
		s.out = grad_fmt(m); /* dxs, dys */
		if (m->gate_tma) { /* the persistent form by TMA (gpu_model.c): a
				    * named tile is planned as asked, so sm_90a too */
			s.tile = DG__DEC_GATE_TMA_TILE;
			s.arch_specific = true;
		}
		dg_spec_normalize(&s);
		dg_tensor g = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), xs = dg__gm_tn(m, in[2]), ys = dg__gm_tn(m, in[3]),
			  dxs = dg__gm_tn(m, out[0]), dys = dg__gm_tn(m, out[1]);
		w.scale = 0;
		dg_decoder_gate_bwd_args a = { .grad = &g, .w = &w, .xs = &xs, .ys = &ys, .dxs = &dxs,
					       .dys = &dys, .p = p, .seed = seed, .step = step,
					       .layer = (uint32_t)nd->layer, .step_at = m->step_at, .elem0 = elem0,
					       .ws = ws };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_PROJ_IN: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_GRAD_INPUT, (dg_proj)nd->arg);
		s.src = grad_fmt(m); /* dys (encoder_v) or dxs (encoder) */
		dg_tensor g = dg__gm_tn(m, in[0]), w = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_lowrank_grad_input_args a = { .grad = &g, .w = &w, .grad_x = &o, .ws = ws };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_ATTN_BWD: {
		/* dxs = (dxs + grad_xs)·[xs > 0]: fused, the chain given dxs
		 * (grad_xs's epi=mask; the workspace holds C and qr only), or
		 * the chain's grad_xs into the workspace's tail, then add_mask */
		dg_spec s = attn_spec(m, DG_OP_ATTENTION_SCORES);
		if (m->attn_turn) /* grad_xs's persistent form turns xs itself (dragon/ops.h) */
			s.tile = DG__ATTN_PERSISTENT_TILE;
		dg_tensor qr, sc = attn_saved(m, in[1], &qr);
		dg_tensor g = dg__gm_tn(m, in[0]), v = dg__gm_tn(m, in[2]), xs = dg__gm_tn(m, in[3]),
			  dxs = dg__gm_tn(m, out[0]), dv = dg__gm_tn(m, out[1]), rope = dg__gm_tn(m, m->id.rope);
		bool fused = attn_fused(m);
		size_t c_bytes = 0, gx_bytes = fused ? 0 : (size_t)dg_tensor_numel(&xs) * sizeof(float);
		dg_attention_bwd_args a = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc,
					    .grad_v = &dv, .dxs = fused ? &dxs : NULL,
					    .qr = m->keep_qr ? &qr : NULL, .chunk = m->attn_chunk };
		dg_status st = dg_attention_bwd_workspace(&s, &a, &c_bytes);
		if (st)
			return dg__dev_fail(dev, st, "the attention's backward: no workspace size");
		c_bytes = (c_bytes + 255) / 256 * 256;
		if (need)
			*need = c_bytes + gx_bytes;
		a.ws.ptr = ws.ptr;
		a.ws.bytes = c_bytes;
		if (fused)
			return dg__attention_bwd_exec(ex, &s, &a);
		dg_tensor gx = dg_tensor_make("grad_xs (ws)", DG_FMT_F32, ws.ptr + c_bytes, xs.ndim, xs.shape);
		a.grad_xs = &gx;
		st = dg__attention_bwd_exec(ex, &s, &a);
		if (st)
			return st;
		dg_spec ms = add_mask_spec(m);
		dg_add_mask_args am = { .dxs = &dxs, .other = &gx, .xs = &xs };
		return node_op(ex, &ms, &am, NULL);
	}
	case DG__N_ADD3: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_ADD3);
		dg_tensor a0 = dg__gm_tn(m, in[0]), a1 = dg__gm_tn(m, in[1]), a2 = dg__gm_tn(m, in[2]), o = dg__gm_tn(m, out[0]);
		dg_add3_args a = { .a = &a0, .b = &a1, .c = &a2, .out = &o };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_PROJ_W: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_GRAD_WEIGHT, (dg_proj)nd->arg);
		s.src = grad_fmt(m); /* the layer's dxs or dys */
		dg_tensor g = dg__gm_tn(m, in[0]), x = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_lowrank_grad_weight_args a = { .grad = &g, .x = &x, .grad_w = &o, .ws = ws,
						  .accumulate = m->micro > 0 || dg__bdh_grad_adds(&m->t, nd) };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_DEC_W: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_DECODER_GRAD_WEIGHT);
		set_recipe(m, &s, DG_PROJ_DECODER);
		/* y bf16 (the bf16 preset) or 8-bit codes (w8a8, bitnet, seed:
		 * uint8pos) on sm_90: the warpgroup path (templates/grad_wgmma.lua) */
		if (s.arch == 90 && (s.act == DG_FMT_BF16 || s.act == DG_FMT_UINT8POS || s.act == DG_FMT_INT8))
			s.arch_specific = true;
		exact_tile(m, &s);
		dg_spec_normalize(&s);
		dg_tensor g = dg__gm_tn(m, in[0]), y = dg__gm_tn(m, in[1]), o = dg__gm_tn(m, out[0]);
		dg_decoder_grad_weight_args a = { .grad = &g, .y = &y, .grad_w = &o, .ws = ws,
						  .accumulate = m->micro > 0 };
		return node_op(ex, &s, &a, need);
	}
	case DG__N_DEQUANT: {
		/* a stack of saved codes as its rows, a scale a row — the QUANT
		 * node's tokens: x (L·B, 1, T, D) row (l·B + b)·T + t, a
		 * (L·B, H, T, D) row ((l·B + b)·H + h)·T + t — to bf16 */
		const dg_proj_recipe *r = dg__gm_recipe(m, (dg_proj)nd->arg);
		dg_spec s = dg__gm_dequant_spec(m, r->act, r->ascale);
		dg_tensor c = rows(m, in[0], D), o = rows(m, out[0], D);
		c.scale = dg__gm_tn(m, in[0]).scale;
		dg_dequantize_args a = { .codes = &c, .out = &o };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_EMBED_BWD: {
		dg_spec s = dg__gm_op_spec(m, DG_OP_EMBED_BWD);
		s.src = DG_FMT_F32; /* the gradient */
		dg_spec_normalize(&s);
		dg_tensor idx = flat(m, in[1]), d = rows(m, in[0], D), o = dg__gm_tn(m, out[0]);
		dg_embed_bwd_args a = { .idx = &idx, .dout = &d, .dtable = &o, .accumulate = m->micro > 0 };
		return node_op(ex, &s, &a, NULL);
	}
	case DG__N_TO_MASTER: {
		/* the execution layout's f32 gradient back to the reference's:
		 * (H, N, D) → (H, D, N); (D, H·N) → (H·N, D); accumulating,
		 * once the last micro-batch has added its share */
		if (!m->last && !need)
			return DG_OK;
		dg_spec s = dg__gm_op_spec(m, DG_OP_TRANSPOSE);
		bool dec = nd->arg == DG_PARAM_DECODER;
		int64_t R = dec ? 1 : m->H, E = dec ? D : m->N, L = dec ? (int64_t)m->H * m->N : D;
		s.embd = (int)E;
		s.latent = (int)L;
		s.act = DG_FMT_F32;
		dg_spec_normalize(&s);
		dg_tensor i = dg__gm_tn(m, in[0]), o = dg__gm_tn(m, out[0]);
		dg_tensor i3 = dg_tensor_3d(i.name, DG_FMT_F32, i.data, R, E, L);
		dg_tensor o3 = dg_tensor_3d(o.name, DG_FMT_F32, o.data, R, L, E);
		dg_transpose_args a = { .in = &i3, .out = &o3 };
		return node_op(ex, &s, &a, NULL);
	}
	default:
		return dg__dev_fail(dev, DG_ERR_INTERNAL, "gpu model: node kind %d has no GPU form",
				    (int)nd->kind);
	}
}
