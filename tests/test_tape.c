/*
 * The step's tape and its arena plan (runtime/train/tape.c, bdh_tape.c):
 * every node names buffers that exist, views lie inside their parents, no
 * two buffers that are alive at the same node share a byte, offsets are
 * 256-byte aligned, buffers whose lifetimes do not overlap do reuse bytes,
 * the (B,H,T,N) gradient stacks take the activations' format (bf16 on the
 * GPU's bf16 tapes, f32 on the CPU's and the f32 one), and the memory
 * report adds up (dg_model_cpu_memory at the 25M shape).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "dragon/model.h"
#include "helpers.h"
#include "runtime/train/bdh_tape.h"
#include "runtime/train/gpu_model_int.h"

static void build_for(const char *preset, int layers, int D, int H, int N, int B, int T,
		      const dg__bdh_target *tg, dg__tape *t, dg__bdh_ids *id)
{
	dg_model_config c = dg_test_model(preset, layers, D, H, N);
	dg__tape_init(t, &c, B, T);
	cr_assert_eq(dg__bdh_tape_build(t, id, tg), DG_OK);
	cr_assert_eq(dg__tape_plan(t), DG_OK);
}

static void build(const char *preset, int layers, int D, int H, int N, int B, int T, dg__tape *t,
		  dg__bdh_ids *id)
{
	build_for(preset, layers, D, H, N, B, T, NULL, t, id);
}

static int root(const dg__tape *t, int i)
{
	while (t->bufs[i].parent >= 0)
		i = t->bufs[i].parent;
	return i;
}

static void invariants(dg__tape *t_, int layers, int B);

static int find(const dg__tape *t, const char *name)
{
	for (int i = 0; i < t->n_bufs; i++)
		if (strcmp(t->bufs[i].name, name) == 0)
			return i;
	return -1;
}

/* Each layer's dxs.l and dys.l in fmt, (B, H, T, N), buffers of their
 * own (no stack of every layer). */
static void expect_layer_grads(const dg__tape *t, dg_fmt fmt, int L, int64_t B, int64_t H, int64_t T, int64_t N)
{
	static const char *const names[] = { "dxs", "dys" };
	cr_assert_eq(find(t, "dxs.all"), -1, "a stack of every layer's dxs");
	cr_assert_eq(find(t, "dys.all"), -1, "a stack of every layer's dys");
	size_t want = (size_t)(B * H * T * N) * (fmt == DG_FMT_BF16 ? 2 : 4);
	for (int k = 0; k < 2; k++)
		for (int l = 0; l < L; l++) {
			char nm[40];
			snprintf(nm, sizeof(nm), "%s.%d", names[k], l);
			int s = find(t, nm);
			cr_assert(s >= 0, "no %s", nm);
			const dg__tbuf *b = &t->bufs[s];
			cr_assert_eq(b->fmt, fmt, "%s: %s, not %s", nm, dg_fmt_name(b->fmt), dg_fmt_name(fmt));
			cr_assert_eq(b->bytes, want, "%s: %zu bytes, not %zu", nm, b->bytes, want);
			cr_assert_eq(b->parent, -1, "%s: a view", nm);
		}
}

Test(tape, plan_invariants)
{
	dg__tape t;
	dg__bdh_ids id;
	build("f32", 3, 32, 2, 64, 2, 16, &t, &id);
	invariants(&t, 3, 2);
	expect_layer_grads(&t, DG_FMT_F32, 3, 2, 2, 16, 64); /* the CPU's: f32 */
	dg__tape_free(&t);
	/* the GPU's tapes: bf16 activations (and gradient stacks); w8a8's codes
	 * with their scales; the f32 recipe keeps f32 stacks */
	dg__bdh_target f = { .gpu = true, .act = DG_FMT_F32 };
	build_for("f32", 3, 32, 2, 64, 2, 16, &f, &t, &id);
	invariants(&t, 3, 2);
	expect_layer_grads(&t, DG_FMT_F32, 3, 2, 2, 16, 64);
	dg__tape_free(&t);
	dg__bdh_target bf = { .gpu = true, .act = DG_FMT_BF16 };
	build_for("bf16", 3, 32, 2, 64, 2, 16, &bf, &t, &id);
	invariants(&t, 3, 2);
	expect_layer_grads(&t, DG_FMT_BF16, 3, 2, 2, 16, 64);
	dg__tape_free(&t);
	dg__bdh_target lb = { .gpu = true, .act = DG_FMT_BF16, .lowbit = true };
	build_for("w8a8", 6, 256, 4, 8192, 8, 512, &lb, &t, &id);
	invariants(&t, 6, 8);
	/* 268 MB each at the 25M shape (a stack of six was 1.6 GB) */
	expect_layer_grads(&t, DG_FMT_BF16, 6, 8, 4, 512, 8192);
	/* and the arena holds a few layers' of them, not six: 4.83 GB, 4.24
	 * saved (7.48 with the stacks) */
	dg_model_memory mm;
	dg__tape_report(&t, &mm);
	const size_t bhtn = (size_t)8 * 4 * 512 * 8192 * 2;
	cr_assert_lt(mm.activations, mm.saved + 4 * bhtn, "arena %zu, saved %zu", mm.activations, mm.saved);
	int xyq = -1;
	for (int i = 0; i < t.n_bufs; i++)
		if (strcmp(t.bufs[i].name, "xyq.all") == 0)
			xyq = i;
	cr_assert(xyq >= 0 && t.bufs[xyq].fmt == DG_FMT_UINT8POS && t.bufs[xyq].scale >= 0);
	cr_assert_eq(t.bufs[t.bufs[xyq].scale].bytes, (size_t)6 * 8 * 512 * 4, "xy's codes: a scale a token");
	cr_assert_eq(t.bufs[id.exec[0]].fmt, DG_FMT_INT8);
	cr_assert_eq(t.bufs[t.bufs[id.exec[0]].scale].bytes, (size_t)4 * 8192 * 4, "a scale a channel");
	dg__tape_free(&t);
}

/* The GPU's low-bit tape on sm_90 (bf16_grads) against the one without, at
 * the 25M shape: the encoders' input gradients read their bf16 copies
 * (H,N,D) in the low-bit bucket, 16 MiB each; each layer's weight
 * gradient reads a dequantize node's bf16 copy of that layer's saved
 * codes, made by the node right before it and dead after it (a temporary
 * of the shared arena); the decoder and the forward are unchanged; the
 * low-bit bucket grows by the two copies exactly and the planned arena by
 * at most the temporaries. */
Test(tape, bf16_gradient_operands_on_sm90)
{
	static const char *const presets[] = { "w8a8", "bitnet" };
	const int64_t L = 6, B = 8, T = 512, D = 256, H = 4, N = 8192;
	const size_t copy = (size_t)H * N * D * 2, xb = (size_t)(L * B * T * D) * 2, ab = xb * H;
	for (int p = 0; p < 2; p++) {
		dg__tape t, u;
		dg__bdh_ids id, iu;
		dg__bdh_target lb = { .gpu = true, .act = DG_FMT_BF16, .lowbit = true };
		dg__bdh_target lg = lb;
		lg.bf16_grads = true;
		build_for(presets[p], (int)L, (int)D, (int)H, (int)N, (int)B, (int)T, &lb, &t, &id);
		build_for(presets[p], (int)L, (int)D, (int)H, (int)N, (int)B, (int)T, &lg, &u, &iu);
		invariants(&u, (int)L, (int)B);
		cr_assert_eq(id.exec_bf16[0], -1, "%s: a copy without bf16_grads", presets[p]);
		for (int k = 0; k < 2; k++) {
			const dg__tbuf *c = &u.bufs[iu.exec_bf16[k]];
			cr_assert_eq(c->fmt, DG_FMT_BF16, "%s", c->name);
			cr_assert_eq(c->bucket, DG__B_LOWBIT, "%s", c->name);
			cr_assert(c->ndim == 3 && c->shape[0] == H && c->shape[1] == N && c->shape[2] == D, "%s", c->name);
			cr_assert_eq(c->bytes, copy, "%s", c->name);
		}
		cr_assert_eq(u.n_forward, t.n_forward, "the forward changed");
		cr_assert_eq(u.n_nodes, t.n_nodes + 2 * L, "two dequantize nodes a layer, nothing else");
		int pin = 0, pw = 0, deq = 0;
		for (int n = 0; n < u.n_nodes; n++) {
			const dg__tnode *nd = &u.nodes[n];
			deq += nd->kind == DG__N_DEQUANT;
			if (nd->kind == DG__N_PROJ_IN) {
				cr_assert_eq(nd->in[1], iu.exec_bf16[nd->arg], "%s: node %d reads %s", presets[p], n,
					     u.bufs[nd->in[1]].name);
				pin++;
			}
			if (nd->kind == DG__N_DEC_IN || nd->kind == DG__N_DEC)
				cr_assert_eq(nd->in[1], iu.exec[2], "the decoder reads its codes");
			if (nd->kind != DG__N_PROJ_W)
				continue;
			pw++;
			const dg__tnode *dq = &u.nodes[n - 1];
			const dg__tbuf *x = &u.bufs[nd->in[1]], *codes = &u.bufs[dq->in[0]];
			cr_assert_eq(dq->kind, DG__N_DEQUANT, "node %d: no dequantize before the weight gradient", n);
			cr_assert_eq(dq->arg, nd->arg);
			cr_assert_eq(dq->out[0], nd->in[1]);
			char want[16];
			snprintf(want, sizeof(want), "%s.%d", nd->arg ? "aq" : "xq", nd->layer);
			cr_assert_str_eq(codes->name, want);
			cr_assert_eq(dq->layer, nd->layer);
			cr_assert(codes->scale >= 0, "%s: codes without scales", codes->name);
			/* a scale a row of the copy's (rows, D) */
			cr_assert_eq(u.bufs[codes->scale].bytes * D, codes->bytes * 4, "%s: a scale a row", codes->name);
			cr_assert_eq(x->fmt, DG_FMT_BF16);
			cr_assert_eq(x->bucket, DG__B_TEMP);
			cr_assert(x->parent < 0);
			cr_assert_eq(x->bytes, (nd->arg ? ab : xb) / L, "%s", x->name);
			cr_assert_eq(x->ndim, 4);
			for (int d = 0; d < 4; d++)
				cr_assert_eq(x->shape[d], codes->shape[d], "%s: not the codes' shape", x->name);
			cr_assert(x->first == n - 1 && x->last == n, "%s lives [%d, %d], not [%d, %d]", x->name,
				  x->first, x->last, n - 1, n);
		}
		cr_assert_eq(pin, 2 * L);
		cr_assert_eq(pw, 2 * L);
		cr_assert_eq(deq, 2 * L);
		dg_model_memory a, b;
		dg__tape_report(&t, &a);
		dg__tape_report(&u, &b);
		cr_assert_eq(b.lowbit, a.lowbit + 2 * copy, "%s: low-bit %zu, was %zu", presets[p], b.lowbit, a.lowbit);
		cr_assert_eq(b.temp, a.temp + xb + ab);
		cr_assert_leq(b.activations, a.activations + xb + ab, "%s: arena %zu, was %zu", presets[p],
			      b.activations, a.activations);
		dg__tape_free(&t);
		dg__tape_free(&u);
	}
}

/* dec_gate: a DEC_GATE node a layer in place of DEC_IN and GATE_BWD, which
 * writes what those two wrote (dxs, dys) from what they read (dyd, the
 * decoder's weight, xs, ys) — the bf16 copy (D, H·N) for a low-bit
 * recipe, 16 MiB at the 25M shape, the bf16 recipe's own copy else. */
Test(tape, decoder_gate_fused_on_sm90)
{
	static const char *const presets[] = { "bf16", "w8a8", "bitnet" };
	const int64_t L = 6, B = 8, T = 512, D = 256, H = 4, N = 8192;
	for (int p = 0; p < 3; p++) {
		bool low = p > 0;
		dg__tape t, u;
		dg__bdh_ids id, iu;
		dg__bdh_target a = { .gpu = true, .act = DG_FMT_BF16, .lowbit = low, .bf16_grads = low };
		dg__bdh_target b = a;
		b.dec_gate = true;
		build_for(presets[p], (int)L, (int)D, (int)H, (int)N, (int)B, (int)T, &a, &t, &id);
		build_for(presets[p], (int)L, (int)D, (int)H, (int)N, (int)B, (int)T, &b, &u, &iu);
		invariants(&u, (int)L, (int)B);
		cr_assert_eq(u.n_nodes, t.n_nodes - L, "%s: one node a layer less", presets[p]);
		if (low) {
			const dg__tbuf *c = &u.bufs[iu.exec_bf16[2]];
			cr_assert(c->fmt == DG_FMT_BF16 && c->bucket == DG__B_LOWBIT && c->ndim == 2 &&
				  c->shape[0] == D && c->shape[1] == H * N, "%s", c->name);
			cr_assert_eq(id.exec_bf16[2], -1);
		} else {
			cr_assert_eq(iu.exec_bf16[2], -1, "the bf16 recipe reads its own copy");
		}
		int fused = 0, k = 0;
		for (int n = 0; n < t.n_nodes; n++) {
			const dg__tnode *nd = &t.nodes[n];
			if (nd->kind != DG__N_DEC_IN)
				continue;
			const dg__tnode *gb = &t.nodes[n + 1];
			cr_assert_eq(gb->kind, DG__N_GATE_BWD);
			for (; k < u.n_nodes && u.nodes[k].kind != DG__N_DEC_GATE; k++)
				cr_assert(u.nodes[k].kind != DG__N_DEC_IN && u.nodes[k].kind != DG__N_GATE_BWD);
			cr_assert_lt(k, u.n_nodes);
			const dg__tnode *f = &u.nodes[k++];
			fused++;
			cr_assert_eq(f->layer, nd->layer);
			cr_assert_str_eq(u.bufs[f->in[0]].name, t.bufs[nd->in[0]].name); /* dyd */
			cr_assert_eq(f->in[1], low ? iu.exec_bf16[2] : iu.exec[2]);
			cr_assert_str_eq(u.bufs[f->in[2]].name, t.bufs[gb->in[1]].name); /* xs */
			cr_assert_str_eq(u.bufs[f->in[3]].name, t.bufs[gb->in[2]].name); /* ys */
			cr_assert_str_eq(u.bufs[f->out[0]].name, t.bufs[gb->out[0]].name); /* dxs */
			cr_assert_str_eq(u.bufs[f->out[1]].name, t.bufs[gb->out[1]].name); /* dys */
		}
		cr_assert_eq(fused, L);
		dg_model_memory ma, mb;
		dg__tape_report(&t, &ma);
		dg__tape_report(&u, &mb);
		cr_assert_eq(mb.lowbit, ma.lowbit + (low ? (size_t)D * H * N * 2 : 0), "%s", presets[p]);
		dg__tape_free(&t);
		dg__tape_free(&u);
	}
}

static void invariants(dg__tape *t_, int layers, int B)
{
	dg__tape t = *t_;
	cr_assert(t.planned && t.n_forward > 0 && t.n_forward < t.n_nodes);
	for (int n = 0; n < t.n_nodes; n++) {
		const dg__tnode *nd = &t.nodes[n];
		cr_assert_eq(nd->backward, n >= t.n_forward, "node %d: forward and backward interleave", n);
		for (int i = 0; i < DG__TAPE_IN; i++)
			cr_assert(nd->in[i] >= -1 && nd->in[i] < t.n_bufs);
		for (int i = 0; i < DG__TAPE_OUT; i++)
			cr_assert(nd->out[i] >= -1 && nd->out[i] < t.n_bufs);
		cr_assert(nd->out[0] >= 0, "node %d writes nothing", n);
	}
	size_t sum = 0;
	for (int i = 0; i < t.n_bufs; i++) {
		const dg__tbuf *b = &t.bufs[i];
		if (b->parent >= 0) {
			const dg__tbuf *p = &t.bufs[b->parent];
			cr_assert(b->view_off + b->bytes <= p->bytes, "%s outside %s", b->name, p->name);
			continue;
		}
		cr_assert_eq(b->offset % 256, 0, "%s at %zu", b->name, b->offset);
		cr_assert(b->offset + b->bytes <= t.arena[dg__tape_arena_of(&t, i)], "%s past its arena",
			  b->name);
		if (dg__tape_arena_of(&t, i) == DG__B_SAVED && b->first >= 0)
			sum += (b->bytes + 255) / 256 * 256;
	}
	/* no two roots alive together share a byte */
	for (int i = 0; i < t.n_bufs; i++)
		for (int j = i + 1; j < t.n_bufs; j++) {
			const dg__tbuf *a = &t.bufs[i], *b = &t.bufs[j];
			if (a->parent >= 0 || b->parent >= 0 || a->first < 0 || b->first < 0 ||
			    dg__tape_arena_of(&t, i) != dg__tape_arena_of(&t, j))
				continue;
			bool time = !(a->last < b->first || b->last < a->first);
			bool space = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
			cr_assert(!(time && space), "%s [%d, %d] @%zu and %s [%d, %d] @%zu overlap", a->name,
				  a->first, a->last, a->offset, b->name, b->first, b->last, b->offset);
		}
	/* and reuse happens: the arena is smaller than its buffers */
	cr_assert_lt(t.arena[DG__B_SAVED], sum, "arena %zu, buffers %zu: no reuse",
		     t.arena[DG__B_SAVED], sum);
	/* bytes are shared by buffers alive at different times, e.g. a
	 * layer's temporaries and the next layer's */
	int shared = 0;
	for (int i = 0; i < t.n_bufs; i++)
		for (int j = i + 1; j < t.n_bufs; j++) {
			const dg__tbuf *a = &t.bufs[i], *b = &t.bufs[j];
			if (a->parent < 0 && b->parent < 0 && a->first >= 0 && b->first >= 0 &&
			    dg__tape_arena_of(&t, i) == DG__B_SAVED && dg__tape_arena_of(&t, j) == DG__B_SAVED &&
			    a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes)
				shared++;
		}
	cr_assert_geq(shared, 10, "only %d pairs of buffers reuse bytes", shared);
	/* the encoders' weight gradients: a node a layer and projection, over
	 * the layer's B rows, the backward's first (the last layer) writing and
	 * the others adding, or (stack_pgrads) one node (layer -1) over the
	 * stack of every layer's L·B rows, writing; the decoder's: one node
	 * over the stack of every layer's L·B rows */
	int pw[DG_PROJ__COUNT] = { 0 }, pws[DG_PROJ__COUNT] = { 0 }, dw = 0;
	for (int n = 0; n < t.n_nodes; n++) {
		const dg__tnode *nd = &t.nodes[n];
		const dg__tbuf *g = &t.bufs[nd->in[0]];
		if (nd->kind == DG__N_DEC_W) {
			dw++;
			cr_assert_eq(g->shape[0], layers * B, "%s: not the stack of every layer", g->name);
			cr_assert_eq(root(&t, nd->in[0]), nd->in[0]);
			cr_assert(!dg__bdh_grad_adds(&t, nd));
		}
		if (nd->kind != DG__N_PROJ_W)
			continue;
		cr_assert(nd->arg >= 0 && nd->arg < DG_PROJ__COUNT);
		if (nd->layer < 0) {
			cr_assert_eq(g->shape[0], layers * B, "%s: not the stack of every layer", g->name);
			cr_assert_eq(root(&t, nd->in[0]), nd->in[0]);
			cr_assert(!dg__bdh_grad_adds(&t, nd));
			pws[nd->arg]++;
			continue;
		}
		cr_assert_eq(nd->layer, layers - 1 - pw[nd->arg], "node %d: layer %d out of turn", n, nd->layer);
		cr_assert_eq(g->shape[0], B, "%s: not one layer's rows", g->name);
		cr_assert_eq(dg__bdh_grad_adds(&t, nd), pw[nd->arg] > 0, "node %d (layer %d)", n, nd->layer);
		pw[nd->arg]++;
	}
	for (int k = DG_PROJ_ENCODER; k <= DG_PROJ_ENCODER_V; k++)
		cr_assert((pw[k] == layers && pws[k] == 0) || (pw[k] == 0 && pws[k] == 1),
			  "projection %d: %d nodes a layer, %d stacked", k, pw[k], pws[k]);
	cr_assert_eq(dw, 1);
}

Test(tape, memory_report_25m)
{
	dg_model_config c;
	dg_model_memory m;
	char msg[256];
	cr_assert_eq(dg_model_preset("f32", &c, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_cpu_memory(&c, 8, 512, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	size_t params = 4 * ((size_t)256 * 256 * 2 + (size_t)2 * 4 * 256 * 8192 + (size_t)32768 * 256);
	cr_assert_eq(m.params, params, "params %zu, want %zu", m.params, params);
	cr_assert_eq(m.grads, params);
	cr_assert_eq(m.total, m.params + m.lowbit + m.grads + m.activations);
	cr_assert(m.activations < m.saved + m.temp + m.workspace);
	/* the six layers' (B,H,T,N) f32 activations: xs, qr, ys, xy saved a
	 * layer (512 MiB each); dxs and dys a layer each, reused by the next */
	size_t bhtn = (size_t)8 * 4 * 512 * 8192 * 4;
	cr_assert_geq(m.saved, 6 * 4 * bhtn);
	cr_assert_geq(m.temp, 6 * 2 * bhtn);
	cr_assert_lt(m.activations, m.saved + 4 * bhtn, "the layers' gradients are not reused");
	cr_assert_eq(dg_model_cpu_memory(&c, 0, 512, &m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "batch 0x512"), "%s", msg);
}

/* stack_pgrads (the GPU's): each layer's dxs.l and dys.l are views of
 * (L·B, H, T, N) stacks, and each encoder's weight gradient is one node
 * after every layer's backward (layer -1, writing, not adding) reading its
 * stack and the stacked inputs (x.all, a.all, or through a dequantize of
 * the saved codes' stacks on sm_90's low-bit tape); without it, a node a
 * layer. */
Test(tape, stacked_projection_gradients)
{
	dg__tape t;
	dg__bdh_ids id;
	const int L = 3, B = 2, H = 2, T = 16, N = 64;
	for (int lb = 0; lb < 2; lb++)
		for (int spg = 0; spg < 2; spg++) {
			dg__bdh_target g = { .gpu = true, .act = DG_FMT_BF16, .lowbit = lb, .bf16_grads = lb,
					     .stack_pgrads = spg };
			build_for(lb ? "w8a8" : "bf16", L, 32, H, N, B, T, &g, &t, &id);
			invariants(&t, L, B);
			int stacks[2] = { find(&t, "dxs.all"), find(&t, "dys.all") };
			for (int k = 0; k < 2; k++) {
				cr_assert_eq(stacks[k] >= 0, spg, "stack %d: %d", k, stacks[k]);
				if (spg)
					cr_assert_eq(t.bufs[stacks[k]].bytes, (size_t)L * B * H * T * N * 2);
			}
			int pw = 0, last_layer_bwd = -1;
			for (int n = 0; n < t.n_nodes; n++) {
				const dg__tnode *nd = &t.nodes[n];
				if (nd->kind == DG__N_ADD3)
					last_layer_bwd = n;
				if (nd->kind != DG__N_PROJ_W)
					continue;
				pw++;
				cr_assert_eq(nd->layer >= 0, !spg, "node %d: layer %d", n, nd->layer);
				cr_assert_eq(dg__bdh_grad_adds(&t, nd), !spg && nd->layer != L - 1);
				if (spg) {
					cr_assert(n > last_layer_bwd, "node %d: before a layer's backward ended", n);
					cr_assert(root(&t, nd->in[0]) == stacks[0] || root(&t, nd->in[0]) == stacks[1]);
					cr_assert_eq(t.bufs[nd->in[0]].parent, -1, "node %d reads a layer's view", n);
				}
			}
			cr_assert_eq(pw, spg ? 2 : 2 * L);
			if (spg) {
				cr_assert_eq(t.bufs[find(&t, "dxs.1")].parent, stacks[0]);
				cr_assert_eq(t.bufs[find(&t, "dys.2")].parent, stacks[1]);
			}
			dg__tape_free(&t);
		}
}

/* recompute: xs.l and ys.l are temporaries of the forward (not saved);
 * each layer's backward starts with the two projections again, from the
 * saved inputs the forward's read (x.l / a.l, or xq.l / aq.l), into
 * xs.again.l and ys.again.l, which the gate's and the attention's
 * backward then read; those nodes count as the backward (the tape stays
 * forward then backward, n_forward the same), and at the 25M shape
 * (w8a8 on the GPU) the saved activations shrink by the twelve (B,H,T,N)
 * bf16 tensors, 3.2 GB. recompute_ys: ys.l alone (the encoder_v's
 * projection again, ys.again.l, which the gate's backward reads; xs.l
 * saved, read by the gate's and the attention's backward), the six ys
 * fewer: the step's plan under 4 GB (3.8 GB beside 5.2) at 25M, B 8,
 * T 512 — AdamW's moments (0.2 GB) and the ops' workspaces (the
 * attention's RoPE(xs), 0.27 GB, inside the arena's free bytes at its
 * node) not counted here. */
Test(tape, recompute_sparse_activations)
{
	dg__tape t;
	dg__bdh_ids id;
	size_t saved[3] = { 0, 0, 0 }, total[3] = { 0, 0, 0 };
	int n_fwd[3] = { 0, 0, 0 };
	static const char *const mode[3] = { "", " recomputing ys", " recomputing" };
	for (int rec = 0; rec < 3; rec++) {
		const bool all = rec == 2, ys_again = rec > 0;
		dg__bdh_target g = { .gpu = true, .act = DG_FMT_BF16, .lowbit = true, .bf16_grads = true,
				     .dec_gate = true, .gate_quant = true, .recompute = all, .recompute_ys = rec == 1 };
		build_for("w8a8", 6, 256, 4, 8192, 8, 512, &g, &t, &id);
		invariants(&t, 6, 8);
		dg_model_memory mm;
		dg__tape_report(&t, &mm);
		saved[rec] = mm.saved;
		total[rec] = mm.total;
		n_fwd[rec] = t.n_forward;
		printf("tape w8a8 25M%s: saved %zu, arena %zu, total %zu bytes\n", mode[rec], mm.saved, mm.activations,
		       mm.total);
		for (int l = 0; l < 6; l++) {
			char nm[40];
			snprintf(nm, sizeof(nm), "xs.%d", l);
			cr_assert_eq(t.bufs[find(&t, nm)].bucket, all ? DG__B_TEMP : DG__B_SAVED, "%s%s", nm, mode[rec]);
			snprintf(nm, sizeof(nm), "ys.%d", l);
			cr_assert_eq(t.bufs[find(&t, nm)].bucket, ys_again ? DG__B_TEMP : DG__B_SAVED, "%s%s", nm,
				     mode[rec]);
			snprintf(nm, sizeof(nm), "xs.again.%d", l);
			cr_assert_eq(find(&t, nm) >= 0, all, "%s%s", nm, mode[rec]);
			snprintf(nm, sizeof(nm), "ys.again.%d", l);
			cr_assert_eq(find(&t, nm) >= 0, ys_again, "%s%s", nm, mode[rec]);
		}
		int proj_bwd = 0;
		for (int n = t.n_forward; n < t.n_nodes; n++) {
			const dg__tnode *nd = &t.nodes[n];
			if (nd->kind != DG__N_PROJ)
				continue;
			proj_bwd++;
			char nm[40];
			snprintf(nm, sizeof(nm), "%s.again.%d", nd->arg == DG_PROJ_ENCODER ? "xs" : "ys", nd->layer);
			cr_assert_eq(nd->out[0], find(&t, nm), "node %d writes %s", n, t.bufs[nd->out[0]].name);
			snprintf(nm, sizeof(nm), "%s.%d", nd->arg == DG_PROJ_ENCODER ? "xq" : "aq", nd->layer);
			cr_assert_eq(nd->in[0], find(&t, nm), "node %d reads %s", n, t.bufs[nd->in[0]].name);
		}
		cr_assert_eq(proj_bwd, all ? 12 : ys_again ? 6 : 0, "%s: %d projections in the backward", mode[rec],
			     proj_bwd);
		/* the gate's and the attention's backward read the recomputed ones */
		for (int n = t.n_forward; n < t.n_nodes; n++) {
			const dg__tnode *nd = &t.nodes[n];
			if (nd->kind == DG__N_DEC_GATE || nd->kind == DG__N_ATTN_BWD) {
				int xs = nd->kind == DG__N_DEC_GATE ? nd->in[2] : nd->in[3];
				cr_assert_eq(strncmp(t.bufs[xs].name, "xs.again.", 9) == 0, all, "node %d reads %s%s", n,
					     t.bufs[xs].name, mode[rec]);
			}
			if (nd->kind == DG__N_DEC_GATE)
				cr_assert_eq(strncmp(t.bufs[nd->in[3]].name, "ys.again.", 9) == 0, ys_again,
					     "node %d reads %s%s", n, t.bufs[nd->in[3]].name, mode[rec]);
		}
		dg__tape_free(&t);
	}
	const size_t bhtn = (size_t)8 * 4 * 512 * 8192 * 2;
	cr_assert(n_fwd[0] == n_fwd[1] && n_fwd[0] == n_fwd[2]);
	cr_assert_eq(saved[0] - saved[1], 6 * bhtn, "saved %zu -> %zu", saved[0], saved[1]);
	cr_assert_eq(saved[0] - saved[2], 12 * bhtn, "saved %zu -> %zu", saved[0], saved[2]);
	cr_assert_lt(total[1], (size_t)3900 * 1000 * 1000, "recomputing ys: %zu bytes", total[1]);
	cr_assert_gt(total[0], (size_t)5000 * 1000 * 1000, "saving both: %zu bytes", total[0]);
}

/* Gradient accumulation (keep_gexec): the projections' execution-layout
 * weight gradients live in the gradients' arena, each its own bytes,
 * so a step's micro-batches add into them; without it they are
 * temporaries whose bytes other buffers reuse. */
Test(tape, accumulation_keeps_the_execution_gradients)
{
	dg__tape t;
	dg__bdh_ids id;
	for (int keep = 0; keep < 2; keep++) {
		dg__bdh_target f = { .gpu = true, .act = DG_FMT_BF16, .keep_gexec = keep };
		build_for("bf16", 2, 64, 2, 128, 2, 16, &f, &t, &id);
		invariants(&t, 2, 2);
		for (int k = 0; k < DG_PROJ__COUNT; k++) {
			int g = id.gexec[k];
			cr_assert_eq(t.bufs[g].bucket, keep ? DG__B_GRADS : DG__B_TEMP, "%s", t.bufs[g].name);
			for (int j = 0; keep && j < k; j++) { /* disjoint bytes */
				const dg__tbuf *a = &t.bufs[g], *b = &t.bufs[id.gexec[j]];
				cr_assert(a->offset + a->bytes <= b->offset || b->offset + b->bytes <= a->offset,
					  "%s overlaps %s", a->name, b->name);
			}
		}
		dg__tape_free(&t);
	}
}

/* The sizing pass's placeholder addresses (dg__gm_addr while sizing, over
 * dg__gm_fake_layout) of a planned tape — build plans before it sizes —
 * give no two root buffers a common byte, every view a place inside its
 * root, and the workspaces' placeholder a place past them all: the
 * aliasing checks the ops run while sizing see distinct buffers. (The
 * planned arena offset added to the placeholder once moved the 25M w8a8
 * step's dxs onto the attention's workspace, and the step was refused.) */
Test(tape, sizing_placeholders_are_distinct)
{
	dg__tape t;
	dg__bdh_ids id;
	const dg__bdh_target tg = { .gpu = true, .act = DG_FMT_BF16, .lowbit = true, .bf16_grads = true,
				    .dec_gate = true, .keep_qr = true, .stack_pgrads = true, .gate_quant = true };
	build_for("w8a8", 6, 256, 4, 8192, 8, 512, &tg, &t, &id);
	dg_model m;
	memset(&m, 0, sizeof(m));
	m.t = t; /* borrowed: t is freed below, not through m */
	cr_assert_eq(dg__gm_fake_layout(&m), DG_OK);
	m.sizing = true;
	int planned_apart = 0;
	for (int i = 0; i < t.n_bufs; i++) {
		const dg__tbuf *a = &t.bufs[i];
		const dg_dptr a0 = dg__gm_addr(&m, i), a1 = a0 + a->bytes;
		cr_assert_leq(a1, m.fake[m.n_fake], "%s: past the workspaces' placeholder", a->name);
		if (a->parent >= 0) {
			const int r = root(&t, i);
			const dg_dptr r0 = dg__gm_addr(&m, r);
			cr_assert(a0 >= r0 && a1 <= r0 + t.bufs[r].bytes, "%s: outside its root %s", a->name,
				  t.bufs[r].name);
			continue;
		}
		planned_apart += a->offset != 0;
		for (int j = i + 1; j < t.n_bufs; j++) {
			const dg__tbuf *b = &t.bufs[j];
			if (b->parent >= 0)
				continue;
			const dg_dptr b0 = dg__gm_addr(&m, j), b1 = b0 + b->bytes;
			cr_assert(a1 <= b0 || b1 <= a0, "%s [0x%llx, 0x%llx) and %s [0x%llx, 0x%llx) share bytes", a->name,
				  (unsigned long long)a0, (unsigned long long)a1, b->name, (unsigned long long)b0,
				  (unsigned long long)b1);
		}
	}
	cr_assert_gt(planned_apart, 0, "the tape was planned: its roots have arena offsets");
	free(m.fake);
	dg__tape_free(&t);
}
