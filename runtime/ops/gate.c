/*
 * The gate family (dragon/ops.h): BDH's xy = dropout(xs · ys) and its
 * backward (templates/gate.lua), element-wise over the flat (B,H,T,L)
 * tensors. The dropout's p, seed, step, layer and elem0 travel in the
 * call (dg__op_call) and reach the kernel as arguments, so a kernel is
 * compiled once a spec, whatever the step or the rank, and a prepared op
 * reads them from each launch's call. Nothing here allocates, frees or
 * synchronizes.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

/* Vectors a thread of gate_fwd / gate_bwd an iteration (templates/gate.lua
 * M.UNROLL): only the grid's size depends on it. */
#define GATE_UNROLL 2

/* The rules of the family on a call's own values, which a prepared op
 * checks again at every launch (it reads them from the call): the drop
 * probability, step_at's alignment (the kernel reads a uint32 there: a
 * misaligned address would fault the context instead of being refused),
 * and the outputs that must alias no other tensor — gate_bwd's dxs (dys
 * is written over dxy), decoder_gate_bwd's dxs and dys (its kernel reads
 * xs and ys after other blocks wrote them), and decoder_gate_bwd_ys's
 * (xs, and aq and ev that ys is made from, the same). c passed the op
 * table's check. */
static dg_status call_rules(dg_op op, const char *fn, const dg__op_call *c, char *msg,
			    size_t size)
{
	if (!(c->p >= 0.0f && c->p < 1.0f)) {
		snprintf(msg, size, "%s: p=%g: the drop probability must be in [0, 1) (0: no dropout)",
			 fn, (double)c->p);
		return DG_ERR_INVALID_ARG;
	}
	if (c->step_at & 3u) {
		snprintf(msg, size, "step_at: %s: 0x%llx is not 4-byte aligned (a device uint32)", fn,
			 (unsigned long long)c->step_at);
		return DG_ERR_INVALID_ARG;
	}
	if (op == DG_OP_GATE_QUANT && (c->t[2]->data == c->t[0]->data || c->t[2]->data == c->t[1]->data)) {
		snprintf(msg, size, "codes: %s: must not alias xs or ys (a token's values are read again for its codes)",
			 fn);
		return DG_ERR_INVALID_ARG;
	}
	if (op == DG_OP_GATE_BWD && c->t[3]->data == c->t[0]->data) {
		snprintf(msg, size, "dxs: %s: must not alias dxy (dys is written over dxy)", fn);
		return DG_ERR_INVALID_ARG;
	}
	if (op == DG_OP_DECODER_GATE_BWD || op == DG_OP_DECODER_GATE_BWD_YS) {
		/* the outputs dxs and dys are the last two of the row */
		const dg_op_info *row = dg_op_info_of(op);
		const int n = row->n_args;
		for (int o = n - 2; o < n; o++)
			for (int i = 0; i < n; i++)
				if (i != o && c->t[i]->data == c->t[o]->data) {
					snprintf(msg, size, "%s: %s: %s: must not alias %s", row->args[o].name,
						 c->t[o]->name ? c->t[o]->name : "(unnamed)", fn,
						 row->args[i].name);
					return DG_ERR_INVALID_ARG;
				}
	}
	return DG_OK;
}

/* The op table's check, then the family's rules (call_rules). */
static dg_status gate_check(const dg_spec *spec, dg_op op, const char *fn, const dg__op_call *c,
			    char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, op, fn, c, NULL, msg, size);
	return st ? st : call_rules(op, fn, c, msg, size);
}

/* The rules a prepared gate op checks at every launch. */
static dg_status gate_ptrs(const dg_prepared *p, const dg__op_call *c, char *msg,
			   size_t msg_size)
{
	return call_rules(p->spec.op, p->fn, c, msg, msg_size);
}

/* The dropout's arguments after (int B, int T), as every kernel of the
 * family takes them: float p, unsigned long long seed, unsigned step,
 * unsigned layer, const unsigned *step_at, unsigned long long elem0, each
 * read from the launch's call. */
static void dropout_args(dg_prepared *p, dg__prep_launch *L)
{
	DG__ARG_OF(p, L, p);       /* float */
	DG__ARG_OF(p, L, seed);    /* uint64_t */
	DG__ARG_OF(p, L, step);    /* uint32_t */
	DG__ARG_OF(p, L, layer);   /* uint32_t */
	DG__ARG_OF(p, L, step_at); /* dg_dptr */
	DG__ARG_OF(p, L, elem0);   /* uint64_t */
}

/* gate_fwd or gate_bwd: the op's tensors in the table's order, (int B,
 * int T), the dropout's arguments; grid-stride over vectors. */
static dg_status gate_prep(dg_prepared *p, const char *entry)
{
	const dg_spec *spec = &p->spec;
	int64_t B = p->shape.b, T = p->shape.t;

	p->ptrs = gate_ptrs;
	long long n = (long long)B * spec->heads * T * spec->latent;
	if (n == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	/* elements a thread's vector: 16 bytes of the narrowest tensor, and
	 * GATE_UNROLL vectors a thread an iteration (templates/gate.lua VE,
	 * M.UNROLL); the loop is grid-stride, so this only sizes the grid */
	bool bf = spec->act == DG_FMT_BF16 || (spec->op == DG_OP_GATE_BWD && spec->out == DG_FMT_BF16);
	long long ve = bf ? 8 : 4;
	dg_launch l = { { dg__op_grid(dg__op_cdiv(n, ve), (long long)nt * GATE_UNROLL,
				      8LL * dg__dev_info(p->dev)->sm_count),
			  1, 1 },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	const dg_op_info *row = dg_op_info_of(spec->op);
	for (int i = 0; i < row->n_args; i++)
		dg__arg_data(p, L, i);
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	dropout_args(p, L);
	return DG_OK;
}

/* ---- gate_fwd, gate_bwd ------------------------------------------------------------ */

dg_status dg__prep_gate_fwd(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return gate_prep(p, "dg_gate_fwd");
}

dg_status dg__check_gate_fwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			     size_t msg_size)
{
	return gate_check(spec, DG_OP_GATE_FWD, "dg_gate_fwd", c, msg, msg_size);
}

dg_status dg__prep_gate_bwd(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return gate_prep(p, "dg_gate_bwd");
}

dg_status dg__check_gate_bwd(const dg_spec *spec, const dg__op_call *c, char *msg,
			     size_t msg_size)
{
	return gate_check(spec, DG_OP_GATE_BWD, "dg_gate_bwd", c, msg, msg_size);
}

/* ---- gate_quant ---------------------------------------------------------------------
 * A block a token, grid-stride (templates/gate_quant.lua): xs, ys, (long
 * long rows, int T), the dropout's arguments, the scales (codes' scale),
 * the codes. The grid: 4 blocks an SM, or one a token where there are
 * fewer; the staged form (tile t<N>/1: the token's xy in shared memory,
 * a few blocks an SM) a block a token, which the scheduler balances. Its
 * dropout rules are gate_fwd's (gate_check); outputs over an input are
 * refused there too. */

dg_status dg__prep_gate_quant(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const dg_spec *spec = &p->spec;
	const int64_t B = p->shape.b, T = p->shape.t;
	p->ptrs = gate_ptrs;
	const long long rows = (long long)B * T;
	if (rows == 0)
		return DG_OK;
	if (T > INT32_MAX)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG, "%s: T = %lld: at most 2^31 - 1 tokens a row",
				    p->fn, (long long)T);
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, "dg_gate_quant", &k);
	if (st)
		return st;
	const dg_tile *tile = &dg_kernel_spec(k)->tile;
	const int nt = tile->threads, sms = dg__dev_info(p->dev)->sm_count;
	const long long cap = tile->stages ? INT32_MAX : 4LL * (sms > 0 ? sms : 1);
	dg_launch l = { { dg__op_grid(rows, 1, cap), 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* xs */
	dg__arg_data(p, L, 1); /* ys */
	dg__arg_i64(p, L, rows);
	dg__arg_i32(p, L, T);
	dropout_args(p, L);
	dg__arg_scale(p, L, 2); /* scales: one a token */
	dg__arg_data(p, L, 2);  /* codes */
	return DG_OK;
}

dg_status dg__check_gate_quant(const dg_spec *spec, const dg__op_call *c, char *msg, size_t msg_size)
{
	return gate_check(spec, DG_OP_GATE_QUANT, "dg_gate_quant", c, msg, msg_size);
}

/* ---- decoder_gate_bwd, decoder_gate_bwd_ys ----------------------------------------
 * decoder_grad_input with gate_bwd in its epilogue (templates/decoder_gate.lua):
 * a GEMM grid (ceil(B·T/BM), ceil(L/BN), H) of the kernel's tile, the
 * row tiles fastest, so that the blocks resident at once share the
 * decoder weight's columns through L2 (at D 1280, H 16, N 16384 the
 * weight is 0.7 GB a layer: read once, not once a row tile); the
 * dropout's arguments as gate_bwd's. The _ys form makes ys in the tile
 * from the encoder_v projection's codes (aq, ev and their scales). */

/* The kernel `entry` of the spec and its launch on the GEMM grid (the
 * plan's block and shared memory), or NULL with *st (0: no rows, nothing
 * to launch). */
static dg__prep_launch *decoder_gate_launch(dg_prepared *p, const char *entry, dg_status *st)
{
	const dg_spec *spec = &p->spec;
	int64_t B = p->shape.b, T = p->shape.t;

	p->ptrs = gate_ptrs;
	*st = DG_OK;
	if (B * T == 0)
		return NULL;
	dg_kernel *k;
	*st = dg_kernel_get(p->dev, spec, entry, &k);
	if (*st)
		return NULL;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	dg_launch l;
	memset(&l, 0, sizeof(l)); /* block and shared memory: the plan's */
	l.grid[0] = (unsigned)dg__op_cdiv(B * T, t->bm);
	l.grid[1] = (unsigned)dg__op_cdiv(spec->latent, t->bn); /* <= 1024: L <= 65536, BN >= 64 */
	l.grid[2] = (unsigned)spec->heads;
	return dg__prep_add(p, k, &l, st);
}

/* ---- decoder_gate_bwd's persistent form (templates/decoder_gate_tma.lua) --
 * A tile of 5 to 8 stages (DG__DEC_GATE_TMA_TILE the model's) names it: its
 * module has the _cast entry, launched first, which writes the gradient's
 * bf16 copy (B·T·E values) at the start of the workspace; the kernel walks
 * its tiles on a grid of one block an SM and takes six maps after the op's
 * arguments: ma over the copy (E, T, B), boxes 64 x BM; mb over w (H·L, E,
 * 1), boxes 64 x 64; mx, my, md, me over xs, ys, dxs, dys (L, T, B·H),
 * boxes 32 x BM (the 64-byte swizzle). iv[0] holds BM. */
#define DGB_BM 0

static dg_status dgb_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	const uint64_t B = (uint64_t)p->shape.b, T = (uint64_t)p->shape.t, H = (uint64_t)p->spec.heads,
		       L = (uint64_t)p->spec.latent, E = (uint64_t)p->spec.embd;
	const uint32_t bm = (uint32_t)p->iv[DGB_BM];
	/* (a call that only sizes the workspace has none: grad's bytes, more,
	 * stand in for the trial map) */
	const dg_dptr copy = c->ws.ptr ? c->ws.ptr : c->t[0]->data;
	dg_status st = dg__tmap_bf16(p->dev, &maps[0], copy, (const uint64_t[3]){ E, T, B },
				     (const uint32_t[2]){ 64, bm });
	if (!st)
		st = dg__tmap_bf16(p->dev, &maps[1], c->t[1]->data, (const uint64_t[3]){ H * L, E, 1 },
				   (const uint32_t[2]){ 64, 64 });
	for (int i = 0; i < 4 && !st; i++) /* xs, ys, dxs, dys */
		st = dg__tmap_rows(p->dev, &maps[2 + i], c->t[2 + i]->data, 2, (const uint64_t[3]){ L, T, B * H },
				   (const uint32_t[2]){ 32, bm });
	return st;
}

/* The cast, then the kernel k over its tiles. */
static dg_status dgb_prep_tma(dg_prepared *p, const dg__op_call *c, dg_kernel *k)
{
	dg_device *dev = p->dev;
	const dg_spec *spec = &p->spec;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	const int64_t B = p->shape.b, T = p->shape.t;
	dg_kernel *kc;
	dg_status st = dg_kernel_get(dev, spec, "dg_decoder_gate_bwd_cast", &kc);
	if (st)
		return st;
	p->ws_bytes = dg__grad_copy_bytes(p);
	p->iv[DGB_BM] = t->bm;
	p->tmaps = dgb_tmaps;
	dg__tmap maps[DG__PREP_TMAPS];
	if ((st = dgb_tmaps(p, c, maps))) /* the shapes' maps encode, or the message names why */
		return st;
	if ((st = dg__prep_grad_cast(p, kc, 0))) /* E % 64 == 0 on this path */
		return st;
	dg__prep_launch *L;
	const int64_t tiles = B * dg__op_cdiv(T, t->bm) * dg__op_cdiv(spec->latent, t->bn) * spec->heads;
	const int64_t sms = dg__dev_info(dev)->sm_count;
	dg_launch l;
	memset(&l, 0, sizeof(l)); /* block and shared memory: the plan's */
	l.grid[0] = (unsigned)(tiles < sms ? tiles : sms);
	l.grid[1] = l.grid[2] = 1;
	if (!(L = dg__prep_add(p, k, &l, &st)))
		return st;
	for (int i = 0; i < 6; i++) /* grad, w, xs, ys, dxs, dys: the maps carry them */
		dg__arg_data(p, L, i);
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	dropout_args(p, L);
	for (int i = 0; i < 6; i++)
		dg__arg_tmap(p, L, i);
	return DG_OK;
}

/* The six tensors, (int B, int T), the dropout's arguments (the persistent
 * form: and its maps). */
dg_status dg__prep_decoder_gate_bwd(dg_prepared *p, const dg__op_call *c)
{
	if (p->shape.b * p->shape.t > 0) {
		dg_kernel *k;
		dg_status st = dg_kernel_get(p->dev, &p->spec, "dg_decoder_gate_bwd", &k);
		if (st)
			return st;
		if (dg_kernel_entry_named(k, "dg_decoder_gate_bwd_cast")) {
			p->ptrs = gate_ptrs;
			return dgb_prep_tma(p, c, k);
		}
	}
	dg_status st;
	dg__prep_launch *L = decoder_gate_launch(p, "dg_decoder_gate_bwd", &st);
	if (!L)
		return st;
	for (int i = 0; i < 6; i++) /* grad, w, xs, ys, dxs, dys */
		dg__arg_data(p, L, i);
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	dropout_args(p, L);
	return DG_OK;
}

dg_status dg__check_decoder_gate_bwd(const dg_spec *spec, const dg__op_call *c, char *msg,
				     size_t msg_size)
{
	return gate_check(spec, DG_OP_DECODER_GATE_BWD, "dg_decoder_gate_bwd", c, msg, msg_size);
}

/* grad, w, xs, aq and its scale sa, ev and its scale sw, dxs, dys, (int
 * B, int T), the dropout's arguments: sa a float a row (b·H + h)·T + t
 * with ascale=token, else one; sw H·N floats with wscale=channel, else
 * one. */
dg_status dg__prep_decoder_gate_bwd_ys(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	dg_status st;
	dg__prep_launch *L = decoder_gate_launch(p, "dg_decoder_gate_bwd_ys", &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);  /* grad */
	dg__arg_data(p, L, 1);  /* w */
	dg__arg_data(p, L, 2);  /* xs */
	dg__arg_data(p, L, 3);  /* aq */
	dg__arg_scale(p, L, 3); /* sa */
	dg__arg_data(p, L, 4);  /* ev */
	dg__arg_scale(p, L, 4); /* sw */
	dg__arg_data(p, L, 5);  /* dxs */
	dg__arg_data(p, L, 6);  /* dys */
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	dropout_args(p, L);
	return DG_OK;
}

dg_status dg__check_decoder_gate_bwd_ys(const dg_spec *spec, const dg__op_call *c, char *msg,
					size_t msg_size)
{
	return gate_check(spec, DG_OP_DECODER_GATE_BWD_YS, "dg_decoder_gate_bwd_ys", c, msg, msg_size);
}
