/*
 * The BDH model on the GPU (dragon/model.h dg_model_*): the step's tape
 * (runtime/train/bdh_tape.c, the CPU model's) run by the GPU ops.
 *
 * create: record the tape for (B, T) with the activations in the
 * recipe's precision, size each node's workspace by asking its op (with a
 * placeholder address a buffer: sizes depend on shapes and tiles, never
 * on data) and prepare its kernels (so a shape the templates refuse is
 * refused here, by field), plan the arenas, allocate each once. Nothing
 * is allocated after. set_weights: upload the masters, make the execution
 * copies (the transpose op: [H, D, N] → (H, N, D), [H·N, D] → (D, H·N), in
 * the activations' format; a low-bit recipe's then quantized — int8 a
 * scale a channel, ternary a scale a tensor, packed — with their scales)
 * and the RoPE table. step: upload the batch, run every node in order on
 * the calling thread's stream, read the loss (and the gradients) back.
 *
 * Recipes: float (f32, bf16) and low-bit with activations a scale a token
 * (w8a8, bitnet): quantize nodes before each projection and the decoder,
 * their codes (with scales) saved for the weight gradients. On sm_90 the
 * projections' gradient GEMMs read bf16 operands instead (their warpgroup
 * path): the encoders' input gradients a bf16 copy of each encoder's codes
 * × scales (exec_bf16, made with the copy, 16 MiB each at the 25M shape),
 * their weight gradients the saved codes dequantized by a node just before
 * (a temporary the plan reuses). The decoder keeps its codes. The f32
 * recipe is the parity one: its gradient GEMMs take the exact fp32 path.
 * The (B,H,T,N) gradients (dxy, dxs, dys and their stacks) are in the
 * activations' format (grad_fmt): the bf16 recipes halve their bytes, the
 * f32 one keeps f32 everywhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/model.h"
#include "dragon/ops.h"
#include "dragon/ref.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/train/bdh_tape.h"
#include "runtime/train/model_int.h"

#define FAKE_BASE ((dg_dptr)1 << 20) /* sizing: any aligned non-zero address */

struct dg_model {
	dg_device *dev;
	dg_model_config c;
	int B, T, H, D, N, V;
	dg_fmt act;
	bool lowbit;
	bool bf16_grads;            /* low-bit on sm_90: bf16 gradient GEMM operands */
	bool dec_gate;              /* bf16 activations on sm_90: decoder_gate_bwd */
	dg__tape t;
	dg__bdh_ids id;
	int qw_ws;                  /* quantize_weight's workspace (a per-tensor scale), or -1 */
	bool sizing;                /* build: buffers at placeholder addresses */
	dg_dptr base[DG__B__COUNT]; /* arena bases (FAKE_BASE while sizing) */
	dg_dptr alloc[DG__B__COUNT];
};

/* A buffer's device address; while sizing (nothing planned), a distinct
 * placeholder a buffer, so the ops' aliasing checks see what the plan will
 * give (distinct buffers, views inside their parents). */
static dg_dptr addr(const dg_model *m, int id)
{
	if (m->sizing)
		return FAKE_BASE + ((dg_dptr)dg__tape_root(&m->t, id) << 36) + dg__tape_offset(&m->t, id);
	return m->base[dg__tape_arena_of(&m->t, id)] + dg__tape_offset(&m->t, id);
}

/* Buffer id as a tensor; codes carry their scales' address. */
static dg_tensor tn(const dg_model *m, int id)
{
	const dg__tbuf *b = &m->t.bufs[id];
	dg_tensor x = dg_tensor_make(b->name, b->fmt, addr(m, id), b->ndim, b->shape);
	if (b->scale >= 0)
		x.scale = addr(m, b->scale);
	return x;
}

/* The buffer as rows of width w: (R, w). */
static dg_tensor rows(const dg_model *m, int id, int64_t w)
{
	dg_tensor x = tn(m, id);
	int64_t n = dg_tensor_numel(&x);
	return dg_tensor_2d(x.name, x.fmt, x.data, n / w, w);
}

static dg_tensor flat(const dg_model *m, int id)
{
	dg_tensor x = tn(m, id);
	return dg_tensor_1d(x.name, x.fmt, x.data, dg_tensor_numel(&x));
}

static dg_workspace ws_of(const dg_model *m, const dg__tnode *nd)
{
	dg_workspace w = { 0, 0 };
	if (nd->ws >= 0) {
		w.ptr = tn(m, nd->ws).data;
		w.bytes = m->t.bufs[nd->ws].bytes;
	}
	return w;
}

/* ---- specs ------------------------------------------------------------------- */

static dg_spec base_spec(const dg_model *m, dg_op op)
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
	const dg_device_info *di = dg__dev_info(m->dev);
	if (di && di->sm > 0)
		s.arch = di->sm;
	return s;
}

/* The format of the (B,H,T,N) gradients (the tape's dxs.all, dys.all and
 * their views): the activations' (dragon/spec.h "gradient formats"). */
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
	dg_spec s = base_spec(m, DG_OP_ADD_MASK);
	s.out = grad_fmt(m);
	s.src = DG_FMT_F32;
	dg_spec_normalize(&s);
	return s;
}

/* The recipe of projection which (0 encoder, 1 encoder_v, 2 decoder). */
static const dg_proj_recipe *recipe(const dg_model *m, int which)
{
	return which == 0 ? &m->c.encoder : which == 1 ? &m->c.encoder_v : &m->c.decoder;
}

/* A spec with projection which's formats and scales (a float recipe: the
 * activations' format, no scales). */
static void set_recipe(const dg_model *m, dg_spec *s, int which)
{
	if (!m->lowbit)
		return;
	const dg_proj_recipe *r = recipe(m, which);
	s->weight = r->weight;
	s->act = r->act;
	s->wscale = r->wscale;
	s->ascale = r->ascale;
}

/* The f32 recipe is the parity one: its gradient GEMMs take the fp32
 * SIMT path (a K step of 8, which the bf16 tensor cores do not take), not
 * the default tensor-core tiles, which round the f32 gradient to bf16. */
static void exact_tile(const dg_model *m, dg_spec *s)
{
	if (m->act != DG_FMT_F32)
		return;
	if (s->op == DG_OP_LOWRANK_GRAD_INPUT || s->op == DG_OP_LOWRANK_GRAD_WEIGHT ||
	    s->op == DG_OP_DECODER_GRAD_INPUT || s->op == DG_OP_DECODER_GRAD_WEIGHT) {
		dg_tile t = { .bm = 64, .bn = 64, .bk = 8, .wm = 2, .wn = 2, .stages = 2 };
		s->tile = t;
	}
}

static dg_spec proj_spec(const dg_model *m, dg_op op, int which)
{
	dg_spec s = base_spec(m, op);
	set_recipe(m, &s, which);
	s.out = m->act;
	s.in_heads = which ? m->H : 1;
	if (op == DG_OP_LOWRANK_FWD) {
		s.relu = true;
		s.relu_thr = which ? m->c.thr_y : m->c.thr_x;
		/* integer codes on sm_90: the warpgroup (wgmma) path */
		s.arch_specific = m->lowbit && s.arch == 90;
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
static dg_spec dequant_spec(const dg_model *m, dg_fmt act, dg_scale_gran g)
{
	dg_spec s = base_spec(m, DG_OP_DEQUANTIZE);
	s.act = act;
	s.ascale = g;
	s.out = DG_FMT_BF16;
	dg_spec_normalize(&s);
	return s;
}

static dg_spec op_spec(const dg_model *m, dg_op op)
{
	dg_spec s = base_spec(m, op);
	dg_spec_normalize(&s);
	return s;
}

/* ---- the nodes ---------------------------------------------------------------- */

/* Sizing: a node's check (st, its message cm), then its kernels prepared
 * (JIT or cache, and the template's refusal of a shape it cannot serve,
 * naming the field), so a model that creates runs. */
static dg_status sized(dg_model *m, const dg_spec *s, dg_status st, const char *cm)
{
	if (st)
		return dg__dev_fail(m->dev, st, "%s", cm);
	dg_kernel *k;
	return dg_kernel_get(m->dev, s, NULL, &k);
}

/* An attention op's spec: bf16 on sm_90 takes the warpgroup GEMMs, which
 * read RoPE(xs) made by the chain (rope=pre, arch=sm_90a). */
static dg_spec attn_spec(const dg_model *m, dg_op op)
{
	dg_spec s = base_spec(m, op);
	if (m->act == DG_FMT_BF16 && s.arch == 90) {
		s.arch_specific = true;
		s.rope_pre = true;
	}
	return s; /* not normalized: the chains read embd and latent */
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

/* The attention chains' ops, prepared, grad_xs as the backward runs it
 * (epi=mask into grad_fmt, or f32 then add_mask). */
static dg_status prep_attention(dg_model *m)
{
	static const dg_op ops[] = { DG_OP_ATTENTION_SCORES, DG_OP_ATTENTION_OUT,
				     DG_OP_ATTENTION_GRAD_SCORES, DG_OP_ATTENTION_GRAD_V,
				     DG_OP_ATTENTION_GRAD_XS, DG_OP_ROPE_FWD, DG_OP_ADD_MASK };
	dg_status st = DG_OK;
	bool fused = attn_fused(m);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]) && !st; i++) {
		if (ops[i] == DG_OP_ADD_MASK && fused)
			continue;
		dg_spec s = ops[i] == DG_OP_ADD_MASK ? add_mask_spec(m) : attn_spec(m, ops[i]);
		if (ops[i] == DG_OP_ATTENTION_GRAD_XS) {
			s.epi = fused ? DG_EPI_MASK : DG_EPI_STORE;
			s.out = fused ? grad_fmt(m) : DG_FMT_F32;
		}
		dg_spec_normalize(&s);
		st = sized(m, &s, DG_OK, "");
	}
	return st;
}

/* One node on the device; sizing: *need gets its workspace bytes instead
 * (nothing launched). */
static dg_status run_node(dg_model *m, const dg__tnode *nd, const dg_model_batch *bt, size_t *need)
{
	char cm[512];
	dg_device *dev = m->dev;
	const int *in = nd->in, *out = nd->out;
	const int64_t D = m->D;
	const float eps = m->c.ln_eps;
	dg_workspace ws = ws_of(m, nd);
	float p = bt && bt->train ? m->c.dropout : 0.0f;
	uint64_t seed = bt ? bt->seed : 0;
	uint32_t step = bt ? bt->step : 0;

	switch (nd->kind) {
	case DG__N_EMBED: {
		dg_spec s = op_spec(m, DG_OP_EMBED_FWD);
		dg_tensor idx = flat(m, in[1]), tab = tn(m, in[0]), o = rows(m, out[0], D);
		dg_embed_fwd_args a = { .idx = &idx, .table = &tab, .out = &o, .bad = tn(m, m->id.bad).data };
		return need ? sized(m, &s, dg_embed_fwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_embed_fwd(dev, &s, &a);
	}
	case DG__N_LN: {
		dg_spec s = op_spec(m, DG_OP_LAYERNORM_FWD);
		dg_tensor x = rows(m, in[0], D), y = rows(m, out[0], D), r = flat(m, out[1]);
		dg_layernorm_fwd_args a = { .x = &x, .y = &y, .rstd = &r, .eps = eps };
		return need ? sized(m, &s, dg_layernorm_fwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_layernorm_fwd(dev, &s, &a);
	}
	case DG__N_PROJ: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_FWD, nd->arg);
		dg_tensor x = tn(m, in[0]), w = tn(m, in[1]), o = tn(m, out[0]);
		dg_lowrank_fwd_args a = { .x = &x, .w = &w, .out = &o };
		return need ? sized(m, &s, dg_lowrank_fwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_lowrank_fwd(dev, &s, &a);
	}
	case DG__N_ATTN: {
		dg_spec s = attn_spec(m, DG_OP_ATTENTION_SCORES);
		dg_tensor xs = tn(m, in[0]), v = tn(m, in[1]), rope = tn(m, in[2]), sc = tn(m, out[1]),
			  o = tn(m, out[0]);
		dg_attention_fwd_args a = { .xs = &xs, .v = &v, .rope = &rope, .scores = &sc, .out = &o,
					    .ws = ws };
		if (need) {
			dg_status st = dg_attention_fwd_workspace(&s, &a, need);
			return st ? dg__dev_fail(dev, st, "the attention: no workspace size") : prep_attention(m);
		}
		return dg_attention_fwd(dev, &s, &a);
	}
	case DG__N_GATE: {
		dg_spec s = op_spec(m, DG_OP_GATE_FWD);
		dg_tensor xs = tn(m, in[0]), ys = tn(m, in[1]), xy = tn(m, out[0]);
		dg_gate_fwd_args a = { .xs = &xs, .ys = &ys, .xy = &xy, .p = p, .seed = seed,
				       .step = step, .layer = (uint32_t)nd->layer };
		return need ? sized(m, &s, dg_gate_fwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_gate_fwd(dev, &s, &a);
	}
	case DG__N_QUANT: {
		/* a token a row: x (B,1,T,D), a (B·H,1,T,D), xy (B,H,T,N) over its heads */
		dg_spec s = base_spec(m, DG_OP_QUANTIZE_ACT);
		const dg_proj_recipe *r = recipe(m, nd->arg);
		s.src = m->act;
		s.act = r->act;
		s.ascale = r->ascale;
		dg_spec_normalize(&s);
		dg_tensor x = tn(m, in[0]), q = tn(m, out[0]);
		if (nd->arg == 1) {
			int64_t sh[4] = { (int64_t)m->B * m->H, 1, m->T, D };
			x = dg_tensor_make(x.name, x.fmt, x.data, 4, sh);
			dg_dptr sc = q.scale;
			q = dg_tensor_make(q.name, q.fmt, q.data, 4, sh);
			q.scale = sc;
		}
		dg_quantize_act_args a = { .x = &x, .codes = &q, .ws = ws };
		return need ? dg_quantize_act_workspace(dev, &s, &a, need)
			    : dg_quantize_act(dev, &s, &a);
	}
	case DG__N_DEC: {
		dg_spec s = op_spec(m, DG_OP_DECODER_FWD);
		set_recipe(m, &s, 2);
		s.out = m->act;
		dg_spec_normalize(&s);
		dg_tensor y = tn(m, in[0]), w = tn(m, in[1]), o = tn(m, out[0]);
		dg_decoder_fwd_args a = { .y = &y, .w = &w, .out = &o, .ws = ws };
		return need ? dg_decoder_fwd_workspace(dev, &s, &a, need)
			    : dg_decoder_fwd(dev, &s, &a);
	}
	case DG__N_RESID_LN: {
		dg_spec s = op_spec(m, DG_OP_RESID_LN_FWD);
		dg_tensor x = rows(m, in[0], D), y = rows(m, in[1], D), o = rows(m, out[0], D),
			  r = flat(m, out[1]);
		dg_resid_ln_fwd_args a = { .x = &x, .y = &y, .out = &o, .rstd = &r, .eps = eps };
		return need ? sized(m, &s, dg_resid_ln_fwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_resid_ln_fwd(dev, &s, &a);
	}
	case DG__N_CE:
	case DG__N_CE_BWD: {
		bool bwd = nd->kind == DG__N_CE_BWD;
		dg_spec s = op_spec(m, DG_OP_LMHEAD_CE);
		s.weight = DG_FMT_F32; /* the f32 master */
		dg_spec_normalize(&s);
		dg_tensor x = rows(m, in[0], D), w = tn(m, in[1]), tg = flat(m, in[2]),
			  loss = flat(m, m->id.loss);
		dg_tensor dx, dw;
		dg_lmhead_ce_args a = { .x = &x, .w = &w, .targets = &tg, .loss = &loss,
					.backward = bwd, .ws = ws, .bad = tn(m, m->id.bad).data };
		if (bwd) {
			dx = rows(m, out[0], D);
			dw = tn(m, out[1]);
			a.dx = &dx;
			a.dw = &dw;
		}
		return need ? dg_lmhead_ce_workspace(dev, &s, &a, need)
			    : dg_lmhead_ce(dev, &s, &a);
	}
	case DG__N_LN_BWD: {
		dg_spec s = op_spec(m, DG_OP_LAYERNORM_BWD);
		dg_tensor dy = rows(m, in[0], D), y = rows(m, in[1], D), r = flat(m, in[2]),
			  dx = rows(m, out[0], D);
		dg_layernorm_bwd_args a = { .dy = &dy, .y = &y, .rstd = &r, .dx = &dx };
		return need ? sized(m, &s, dg_layernorm_bwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_layernorm_bwd(dev, &s, &a);
	}
	case DG__N_DEC_IN: {
		dg_spec s = op_spec(m, DG_OP_DECODER_GRAD_INPUT);
		set_recipe(m, &s, 2);
		s.out = grad_fmt(m); /* dxy, written into dys's bytes */
		exact_tile(m, &s);
		dg_spec_normalize(&s);
		dg_tensor g = tn(m, in[0]), w = tn(m, in[1]), o = tn(m, out[0]);
		dg_decoder_grad_input_args a = { .grad = &g, .w = &w, .grad_y = &o };
		return need ? sized(m, &s, dg_decoder_grad_input_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_decoder_grad_input(dev, &s, &a);
	}
	case DG__N_GATE_BWD: {
		dg_spec s = op_spec(m, DG_OP_GATE_BWD);
		s.out = grad_fmt(m); /* dxy, dys over it, dxs */
		dg_spec_normalize(&s);
		dg_tensor dxy = tn(m, in[0]), xs = tn(m, in[1]), ys = tn(m, in[2]), dxs = tn(m, out[0]);
		dg_gate_bwd_args a = { .dxy = &dxy, .xs = &xs, .ys = &ys, .dxs = &dxs, .p = p,
				       .seed = seed, .step = step, .layer = (uint32_t)nd->layer };
		return need ? sized(m, &s, dg_gate_bwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_gate_bwd(dev, &s, &a);
	}
	case DG__N_DEC_GATE: {
		/* the decoder's bf16 weight (D, H·N): the bf16 recipe's copy or
		 * a low-bit one's dequantized codes; sm_90a picks the warpgroup
		 * path (dg_codegen_plan_for) */
		dg_spec s = op_spec(m, DG_OP_DECODER_GATE_BWD);
		s.weight = DG_FMT_BF16;
		s.act = m->act;
		s.out = grad_fmt(m); /* dxs, dys */
		dg_spec_normalize(&s);
		dg_tensor g = tn(m, in[0]), w = tn(m, in[1]), xs = tn(m, in[2]), ys = tn(m, in[3]),
			  dxs = tn(m, out[0]), dys = tn(m, out[1]);
		w.scale = 0;
		dg_decoder_gate_bwd_args a = { .grad = &g, .w = &w, .xs = &xs, .ys = &ys, .dxs = &dxs,
					       .dys = &dys, .p = p, .seed = seed, .step = step,
					       .layer = (uint32_t)nd->layer };
		return need ? sized(m, &s, dg_decoder_gate_bwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_decoder_gate_bwd(dev, &s, &a);
	}
	case DG__N_PROJ_IN: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_GRAD_INPUT, nd->arg);
		s.src = grad_fmt(m); /* dys (encoder_v) or dxs (encoder) */
		dg_tensor g = tn(m, in[0]), w = tn(m, in[1]), o = tn(m, out[0]);
		dg_lowrank_grad_input_args a = { .grad = &g, .w = &w, .grad_x = &o, .ws = ws };
		return need ? dg_lowrank_grad_input_workspace(dev, &s, &a, need)
			    : dg_lowrank_grad_input(dev, &s, &a);
	}
	case DG__N_ATTN_BWD: {
		/* dxs = (dxs + grad_xs)·[xs > 0]: fused, the chain given dxs
		 * (grad_xs's epi=mask; the workspace holds C and qr only), or
		 * the chain's grad_xs into the workspace's tail, then add_mask */
		dg_spec s = attn_spec(m, DG_OP_ATTENTION_SCORES);
		dg_tensor g = tn(m, in[0]), sc = tn(m, in[1]), v = tn(m, in[2]), xs = tn(m, in[3]),
			  dxs = tn(m, out[0]), dv = tn(m, out[1]), rope = tn(m, m->id.rope);
		bool fused = attn_fused(m);
		size_t c_bytes = 0, gx_bytes = fused ? 0 : (size_t)dg_tensor_numel(&xs) * sizeof(float);
		dg_attention_bwd_args a = { .grad = &g, .xs = &xs, .v = &v, .rope = &rope, .scores = &sc,
					    .grad_v = &dv, .dxs = fused ? &dxs : NULL };
		dg_status st = dg_attention_bwd_workspace(&s, &a, &c_bytes);
		if (st)
			return dg__dev_fail(dev, st, "the attention's backward: no workspace size");
		c_bytes = (c_bytes + 255) / 256 * 256;
		if (need) {
			*need = c_bytes + gx_bytes;
			return prep_attention(m);
		}
		a.ws.ptr = ws.ptr;
		a.ws.bytes = c_bytes;
		if (fused)
			return dg_attention_bwd(dev, &s, &a);
		dg_tensor gx = dg_tensor_make("grad_xs (ws)", DG_FMT_F32, ws.ptr + c_bytes, xs.ndim, xs.shape);
		a.grad_xs = &gx;
		st = dg_attention_bwd(dev, &s, &a);
		if (st)
			return st;
		dg_spec ms = add_mask_spec(m);
		dg_add_mask_args am = { .dxs = &dxs, .other = &gx, .xs = &xs };
		return dg_add_mask(dev, &ms, &am);
	}
	case DG__N_ADD3: {
		dg_spec s = op_spec(m, DG_OP_ADD3);
		dg_tensor a0 = tn(m, in[0]), a1 = tn(m, in[1]), a2 = tn(m, in[2]), o = tn(m, out[0]);
		dg_add3_args a = { .a = &a0, .b = &a1, .c = &a2, .out = &o };
		return need ? sized(m, &s, dg_add3_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_add3(dev, &s, &a);
	}
	case DG__N_PROJ_W: {
		dg_spec s = proj_spec(m, DG_OP_LOWRANK_GRAD_WEIGHT, nd->arg);
		s.src = grad_fmt(m); /* the stacks dxs.all, dys.all */
		dg_tensor g = tn(m, in[0]), x = tn(m, in[1]), o = tn(m, out[0]);
		dg_lowrank_grad_weight_args a = { .grad = &g, .x = &x, .grad_w = &o, .ws = ws };
		return need ? dg_lowrank_grad_weight_workspace(dev, &s, &a, need)
			    : dg_lowrank_grad_weight(dev, &s, &a);
	}
	case DG__N_DEC_W: {
		dg_spec s = op_spec(m, DG_OP_DECODER_GRAD_WEIGHT);
		set_recipe(m, &s, 2);
		exact_tile(m, &s);
		dg_spec_normalize(&s);
		dg_tensor g = tn(m, in[0]), y = tn(m, in[1]), o = tn(m, out[0]);
		dg_decoder_grad_weight_args a = { .grad = &g, .y = &y, .grad_w = &o, .ws = ws };
		return need ? dg_decoder_grad_weight_workspace(dev, &s, &a, need)
			    : dg_decoder_grad_weight(dev, &s, &a);
	}
	case DG__N_DEQUANT: {
		/* a stack of saved codes as its rows, a scale a row — the QUANT
		 * node's tokens: x (L·B, 1, T, D) row (l·B + b)·T + t, a
		 * (L·B, H, T, D) row ((l·B + b)·H + h)·T + t — to bf16 */
		const dg_proj_recipe *r = recipe(m, nd->arg);
		dg_spec s = dequant_spec(m, r->act, r->ascale);
		dg_tensor c = rows(m, in[0], D), o = rows(m, out[0], D);
		c.scale = tn(m, in[0]).scale;
		dg_dequantize_args a = { .codes = &c, .out = &o };
		return need ? sized(m, &s, dg_dequantize_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_dequantize(dev, &s, &a);
	}
	case DG__N_EMBED_BWD: {
		dg_spec s = op_spec(m, DG_OP_EMBED_BWD);
		s.src = DG_FMT_F32; /* the gradient */
		dg_spec_normalize(&s);
		dg_tensor idx = flat(m, in[1]), d = rows(m, in[0], D), o = tn(m, out[0]);
		dg_embed_bwd_args a = { .idx = &idx, .dout = &d, .dtable = &o };
		return need ? sized(m, &s, dg_embed_bwd_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_embed_bwd(dev, &s, &a);
	}
	case DG__N_TO_MASTER: {
		/* the execution layout's f32 gradient back to the reference's:
		 * (H, N, D) → (H, D, N); (D, H·N) → (H·N, D) */
		dg_spec s = op_spec(m, DG_OP_TRANSPOSE);
		bool dec = nd->arg == DG_PARAM_DECODER;
		int64_t R = dec ? 1 : m->H, E = dec ? D : m->N, L = dec ? (int64_t)m->H * m->N : D;
		s.embd = (int)E;
		s.latent = (int)L;
		s.act = DG_FMT_F32;
		dg_spec_normalize(&s);
		dg_tensor i = tn(m, in[0]), o = tn(m, out[0]);
		dg_tensor i3 = dg_tensor_3d(i.name, DG_FMT_F32, i.data, R, E, L);
		dg_tensor o3 = dg_tensor_3d(o.name, DG_FMT_F32, o.data, R, L, E);
		dg_transpose_args a = { .in = &i3, .out = &o3 };
		return need ? sized(m, &s, dg_transpose_check(&s, &a, cm, sizeof(cm)), cm)
			    : dg_transpose(dev, &s, &a);
	}
	default:
		return dg__dev_fail(dev, DG_ERR_INTERNAL, "gpu model: node kind %d has no GPU form",
				    (int)nd->kind);
	}
}

/* ---- create, plan ----------------------------------------------------------- */

static bool float_recipe(const dg_model_config *c)
{
	const dg_proj_recipe *r[3] = { &c->encoder, &c->encoder_v, &c->decoder };
	for (int i = 0; i < 3; i++)
		if (r[i]->weight != c->precision || r[i]->act != c->precision)
			return false;
	return true;
}

/* A low-bit recipe the GPU model runs: integer weights and activations,
 * the activations a scale a token (the weight gradients are one GEMM over
 * every layer's rows, which one scale a layer cannot be), bf16 elsewhere;
 * else one line naming the field. */
static const char *lowbit_refusal(const dg_model_config *c, char *buf, size_t size)
{
	const char *no = dg__model_lowbit_why(c, buf, size);
	if (no)
		return no;
	if (c->precision != DG_FMT_BF16) {
		snprintf(buf, size, "precision=%s: a low-bit recipe keeps the rest in bf16", dg_fmt_name(c->precision));
		return buf;
	}
	return NULL;
}

/* Records the tape, sizes the workspaces, plans. */
static dg_status build(dg_model *m, dg_device *dev, const dg_model_config *c, int b, int t)
{
	char msg[512];
	dg_status st = dg_model_config_check(c, msg, sizeof(msg));
	if (st)
		return dg__dev_fail(dev, st, "%s", msg);
	char why[256];
	const char *no = float_recipe(c) ? NULL : lowbit_refusal(c, why, sizeof(why));
	if (no)
		return dg__dev_fail(dev, DG_ERR_UNSUPPORTED, "preset %s: %s",
				    c->preset[0] ? c->preset : "(custom)", no);
	if (b < 1 || t < 1)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "batch %dx%d: B and T must be at least 1", b, t);
	m->dev = dev;
	m->c = *c;
	m->B = b, m->T = t, m->H = c->heads, m->D = c->embd, m->N = c->neurons, m->V = c->vocab;
	m->act = c->precision;
	m->lowbit = !float_recipe(c);
	const dg_device_info *di = dg__dev_info(dev);
	m->bf16_grads = m->lowbit && di && di->sm == 90;
	m->dec_gate = m->act == DG_FMT_BF16 && di && di->sm == 90;
	m->qw_ws = -1;
	dg__tape_init(&m->t, c, b, t);
	dg__bdh_target tg = { .gpu = true, .act = m->act, .lowbit = m->lowbit,
			      .bf16_grads = m->bf16_grads, .dec_gate = m->dec_gate };
	st = dg__bdh_tape_build(&m->t, &m->id, &tg);
	if (st)
		return dg__dev_fail(dev, st, "the step's tape: %s", dg_status_str(st));
	m->sizing = true;
	int n_nodes = m->t.n_nodes;
	for (int n = 0; n < n_nodes; n++) {
		size_t need = 0;
		st = run_node(m, &m->t.nodes[n], NULL, &need);
		if (st)
			return st;
		if (need) {
			char nm[40];
			snprintf(nm, sizeof(nm), "ws.%d", n);
			int64_t sh[1] = { (int64_t)need };
			int id = dg__tape_buf(&m->t, nm, DG_FMT_INT8, DG__B_WORKSPACE, 1, sh);
			if (id < 0)
				return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
			m->t.nodes[n].ws = id;
		}
	}
	/* a per-tensor weight scale's partial sums (the largest copy's) */
	for (int k = 0; m->lowbit && k < 3 && !st; k++) {
		const dg_proj_recipe *r = recipe(m, k);
		if (r->wscale == DG_SCALE_CHANNEL)
			continue;
		dg_spec q = base_spec(m, DG_OP_QUANTIZE_WEIGHT);
		q.weight = r->weight;
		q.src = DG_FMT_F32;
		dg_spec_normalize(&q);
		int64_t E = k == 2 ? (int64_t)m->H * m->N : m->D, R = (int64_t)m->H * m->N * m->D / E;
		dg_tensor wf = dg_tensor_2d("w", DG_FMT_F32, FAKE_BASE, R, E);
		dg_tensor cd = dg_tensor_2d("codes", DG_FMT_INT8, FAKE_BASE, R, E);
		cd.scale = FAKE_BASE;
		dg_quantize_weight_args qa = { .w = &wf, .codes = &cd };
		size_t need = 0;
		st = dg_quantize_weight_workspace(dev, &q, &qa, &need);
		if (!st && need && (m->qw_ws < 0 || m->t.bufs[m->qw_ws].bytes < need)) {
			int64_t sh[1] = { (int64_t)need };
			m->qw_ws = dg__tape_buf(&m->t, "exec.ws", DG_FMT_INT8, DG__B_LOWBIT, 1, sh);
		}
	}
	if (st)
		return st;
	m->sizing = false;
	st = dg__tape_plan(&m->t);
	if (st)
		return dg__dev_fail(dev, st, "the step's arena plan: %s", dg_status_str(st));
	return DG_OK;
}

dg_status dg_model_plan(dg_device *dev, const dg_model_config *c, int b, int t, dg_model_memory *out)
{
	if (!dev || !c || !out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_plan: NULL argument")
			   : DG_ERR_INVALID_ARG;
	dg_model m;
	memset(&m, 0, sizeof(m));
	dg_status st = build(&m, dev, c, b, t);
	if (!st)
		dg__tape_report(&m.t, out);
	dg__tape_free(&m.t);
	return st;
}

void dg_model_destroy(dg_model *m)
{
	if (!m)
		return;
	for (int k = 0; k < DG__B__COUNT; k++)
		(void)dg_free(m->dev, m->alloc[k]);
	dg__tape_free(&m->t);
	free(m);
}

void dg_model_memory_of(const dg_model *m, dg_model_memory *out)
{
	if (m && out)
		dg__tape_report(&m->t, out);
}

/* Execution copy k (0 encoder, 1 encoder_v, 2 decoder) from its master. */
static dg_status make_copy(dg_model *m, int k)
{
	dg_device *dev = m->dev;
	bool dec = k == 2;
	int64_t R = dec ? 1 : m->H, E = dec ? (int64_t)m->H * m->N : m->D, L = dec ? m->D : m->N;
	dg_spec s = op_spec(m, DG_OP_TRANSPOSE);
	s.embd = (int)E;
	s.latent = (int)L;
	if (m->lowbit)
		s.act = DG_FMT_F32;
	dg_spec_normalize(&s);
	int src = m->id.params[k == 0 ? DG_PARAM_ENCODER : k == 1 ? DG_PARAM_ENCODER_V : DG_PARAM_DECODER];
	dg_tensor i = tn(m, src), o = tn(m, m->lowbit ? m->id.exec_f32 : m->id.exec[k]);
	dg_tensor i3 = dg_tensor_3d(i.name, DG_FMT_F32, i.data, R, E, L);
	dg_tensor o3 = dg_tensor_3d(o.name, m->lowbit ? DG_FMT_F32 : m->act, o.data, R, L, E);
	dg_transpose_args a = { .in = &i3, .out = &o3 };
	dg_status st = dg_transpose(dev, &s, &a);
	if (st || !m->lowbit)
		return st;
	/* quantize the (R·L, E) rows: a scale a channel is a scale a row */
	const dg_proj_recipe *r = recipe(m, k);
	dg_tensor exec = tn(m, m->id.exec[k]);
	bool packed = r->weight != DG_FMT_INT8;
	dg_spec q = base_spec(m, DG_OP_QUANTIZE_WEIGHT);
	q.weight = r->weight;
	q.wscale = r->wscale;
	q.src = DG_FMT_F32;
	dg_spec_normalize(&q);
	dg_tensor wf = dg_tensor_2d("w (f32, execution layout)", DG_FMT_F32, o.data, R * L, E);
	dg_tensor codes = dg_tensor_2d("codes", DG_FMT_INT8,
				       packed ? addr(m, m->id.exec_codes) : exec.data, R * L, E);
	codes.scale = exec.scale;
	dg_quantize_weight_args qa = { .w = &wf, .codes = &codes };
	if (m->qw_ws >= 0) {
		qa.ws.ptr = addr(m, m->qw_ws);
		qa.ws.bytes = m->t.bufs[m->qw_ws].bytes;
	}
	st = dg_quantize_weight(dev, &q, &qa);
	if (!st && m->bf16_grads && (!dec || m->dec_gate)) {
		/* the input gradient's bf16 copy: the codes (before packing)
		 * times their scale, a channel's a row (the decoder's: what
		 * decoder_gate_bwd reads) */
		dg_spec ds = dequant_spec(m, DG_FMT_INT8,
					  r->wscale == DG_SCALE_CHANNEL ? DG_SCALE_TOKEN : DG_SCALE_TENSOR);
		dg_tensor bf = dg_tensor_2d("w (bf16, dequantized)", DG_FMT_BF16,
					    addr(m, m->id.exec_bf16[k]), R * L, E);
		dg_dequantize_args da = { .codes = &codes, .out = &bf };
		st = dg_dequantize(dev, &ds, &da);
	}
	if (st || !packed)
		return st;
	dg_spec ps = base_spec(m, r->weight == DG_FMT_TERNARY ? DG_OP_PACK_TERNARY : DG_OP_PACK_SIGN1);
	ps.embd = (int)E;
	dg_spec_normalize(&ps);
	dg_tensor pk = dg_tensor_2d("packed", r->weight, exec.data, R * L, E);
	dg_pack_weight_args pa = { .codes = &codes, .packed = &pk };
	return dg_pack_weight(dev, &ps, &pa);
}

dg_status dg_model_set_weights(dg_model *m, const dg_model_weights *w)
{
	if (!m || !w)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_set_weights: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	if (memcmp(&w->config, &m->c, sizeof(m->c)) != 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_model_set_weights: the weights' config is not the model's");
	dg_status st = DG_OK;
	for (int p = 0; p < DG_MODEL_N_PARAMS && !st; p++)
		st = dg_memcpy_htod(dev, tn(m, m->id.params[p]).data, w->params[p],
				    m->t.bufs[m->id.params[p]].bytes);
	/* the execution copies: [H, D, N] → (H, N, D); [H·N, D] → (D, H·N), in
	 * the activations' format, or (low-bit) in f32, then quantized (and
	 * packed) with their scales */
	for (int k = 0; k < 3 && !st; k++)
		st = make_copy(m, k);
	if (st)
		return st;
	float *rope = malloc((size_t)m->T * m->N * sizeof(float) + 4);
	if (!rope)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	dg_ref_rope_pairs(m->T, m->N, rope);
	st = dg_memcpy_htod(dev, tn(m, m->id.rope).data, rope, (size_t)m->T * m->N * sizeof(float));
	free(rope);
	return st;
}

dg_status dg_model_create(dg_device *dev, const dg_model_weights *w, int b, int t, dg_model **out)
{
	if (!dev || !w || !out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_model_create: NULL argument")
			   : DG_ERR_INVALID_ARG;
	*out = NULL;
	dg_model *m = calloc(1, sizeof(*m));
	if (!m)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory");
	dg_status st = build(m, dev, &w->config, b, t);
	for (int k = 0; !st && k < DG__B__COUNT; k++) {
		m->base[k] = 0;
		if (m->t.arena[k])
			st = dg_malloc(dev, m->t.arena[k], &m->alloc[k]);
		m->base[k] = m->alloc[k];
	}
	if (!st)
		st = dg_model_set_weights(m, w);
	if (st) {
		dg_model_destroy(m);
		return st;
	}
	*out = m;
	return DG_OK;
}

/* The batch's checks and upload (nothing runs). */
static dg_status upload(dg_model *m, const dg_model_batch *bt)
{
	dg_device *dev = m->dev;
	if (bt->b != m->B || bt->t != m->T)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "batch %dx%d: the model was planned for %dx%d (B x T)", bt->b, bt->t,
				    m->B, m->T);
	int64_t n = (int64_t)m->B * m->T;
	for (int64_t i = 0; i < n; i++) {
		if (bt->idx[i] < 0 || bt->idx[i] >= m->V)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "idx[%lld] = %d: outside the vocabulary 0..%d",
					    (long long)i, bt->idx[i], m->V - 1);
		if (bt->targets[i] < 0 || bt->targets[i] >= m->V)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
					    "targets[%lld] = %d: outside the vocabulary 0..%d", (long long)i,
					    bt->targets[i], m->V - 1);
	}
	dg_status st = dg_memcpy_htod(dev, tn(m, m->id.tokens).data, bt->idx, (size_t)n * 4);
	if (!st)
		st = dg_memcpy_htod(dev, tn(m, m->id.targets).data, bt->targets, (size_t)n * 4);
	if (!st)
		st = dg_memset8(dev, tn(m, m->id.bad).data, 0, 4);
	return st;
}

/* The batch uploaded, then the nodes. */
static dg_status run(dg_model *m, const dg_model_batch *bt, bool backward)
{
	dg_status st = upload(m, bt);
	int end = backward ? m->t.n_nodes : m->t.n_forward;
	for (int k = 0; k < end && !st; k++)
		st = run_node(m, &m->t.nodes[k], bt, NULL);
	return st;
}

static dg_status upload(dg_model *m, const dg_model_batch *bt);

dg_status dg_model_profile(dg_model *m, const dg_model_batch *bt, dg_model_time *out, int cap,
			   int *n)
{
	if (!m || !bt || !bt->idx || !bt->targets || !out || !n)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_profile: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	*n = 0;
	/* the batch, then the nodes one by one */
	dg_status st = upload(m, bt);
	dg_event *e0 = NULL, *e1 = NULL;
	if (!st)
		st = dg_event_create(dev, &e0);
	if (!st)
		st = dg_event_create(dev, &e1);
	int kind_row[DG__N__COUNT];
	for (int k = 0; k < DG__N__COUNT; k++)
		kind_row[k] = -1;
	for (int i = 0; i < m->t.n_nodes && !st; i++) {
		const dg__tnode *nd = &m->t.nodes[i];
		float ms = 0;
		st = dg_event_record(e0);
		if (!st)
			st = run_node(m, nd, bt, NULL);
		if (!st)
			st = dg_event_record(e1);
		if (!st)
			st = dg_event_synchronize(e1);
		if (!st)
			st = dg_event_elapsed_ms(e0, e1, &ms);
		if (st)
			break;
		int r = kind_row[nd->kind];
		if (r < 0 && *n < cap) {
			r = kind_row[nd->kind] = (*n)++;
			out[r].what = dg__nkind_name(nd->kind);
			out[r].count = 0;
			out[r].ms = 0;
		}
		if (r >= 0) {
			out[r].count++;
			out[r].ms += ms;
		}
	}
	dg_event_destroy(e0);
	dg_event_destroy(e1);
	return st;
}

dg_status dg_model_run(dg_model *m, const dg_model_batch *bt, bool backward)
{
	if (!m || !bt || !bt->idx || !bt->targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_run: NULL argument")
			 : DG_ERR_INVALID_ARG;
	return run(m, bt, backward);
}

dg_status dg_model_step(dg_model *m, const dg_model_batch *bt, double *loss, dg_model_weights *grads)
{
	if (!m || !bt || !loss || !bt->idx || !bt->targets)
		return m ? dg__dev_fail(m->dev, DG_ERR_INVALID_ARG, "dg_model_step: NULL argument")
			 : DG_ERR_INVALID_ARG;
	dg_device *dev = m->dev;
	dg_status st = run(m, bt, grads != NULL);
	float l = 0;
	int32_t bad = 0;
	if (!st)
		st = dg_memcpy_dtoh(dev, &l, tn(m, m->id.loss).data, sizeof(l));
	if (!st)
		st = dg_memcpy_dtoh(dev, &bad, tn(m, m->id.bad).data, sizeof(bad));
	if (!st && bad)
		st = dg__dev_fail(dev, DG_ERR_INTERNAL, "a token reached the GPU outside the vocabulary");
	if (!st)
		*loss = l;
	for (int p = 0; grads && !st && p < DG_MODEL_N_PARAMS; p++)
		st = dg_memcpy_dtoh(dev, grads->params[p], tn(m, m->id.grads[p]).data,
				    m->t.bufs[m->id.grads[p]].bytes);
	return st;
}
