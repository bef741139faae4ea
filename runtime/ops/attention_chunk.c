/*
 * The chunked attention's ops (dragon/ops.h, "The chunked form";
 * templates/attention_chunk.lua): the state GEMMs, the output and input
 * gradient terms the states give, and the element-wise helpers the chains
 * of runtime/ops/attention.c need to run the quadratic ops on the chunks.
 *
 * The three GEMMs are warp-specialized (a TMA producer warpgroup beside
 * the tile's consumer warpgroups): their operands come through bf16 rank-3
 * tensor maps made from the call's pointers (boxes of 64 x 64), x the
 * column blocks, y the row blocks, z the (b, h) pairs. No op allocates or
 * synchronizes.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

/* ---- checks -------------------------------------------------------------------- */

/* T of the call when every tensor given with a T dimension agrees on it,
 * else -1 (the op table's check then names the one that differs). */
static int64_t call_t(dg_op op, const dg__op_call *c)
{
	const dg_op_info *row = dg_op_info_of(op);
	int64_t T = -1;
	for (int i = 0; i < row->n_args; i++) {
		const dg_op_arg *a = &row->args[i];
		const dg_tensor *t = c->t[i];
		for (int d = 0; t && d < a->ndim; d++) {
			if (a->dims[d] != DG_DIM_T)
				continue;
			if (t->ndim != a->ndim || (T >= 0 && t->shape[d] != T))
				return -1;
			T = t->shape[d];
		}
	}
	return T;
}

/* Whether the bytes of a and b overlap (either NULL: no). */
static bool overlap(const dg_tensor *a, const dg_tensor *b)
{
	if (!a || !b)
		return false;
	dg_dptr a1 = a->data + dg_tensor_bytes(a), b1 = b->data + dg_tensor_bytes(b);
	return a->data < b1 && b->data < a1;
}

/* The op table's check after T's: a multiple of the chunk (named before
 * the states' shape, which follows from it, is judged), then no output
 * over an input. */
static dg_status chunk_check(dg_op op, const dg_spec *spec, const dg__op_call *c, char *msg, size_t size)
{
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	const char *fn = dg__op_fn_name(op);
	const int64_t T = spec && spec->op == op ? call_t(op, c) : -1;
	if (T > 0 && spec->chunk > 0 && T % spec->chunk) {
		snprintf(msg, size,
			 "%s: T = %lld: the chunked form needs T a multiple of the chunk (chunk=%d); take a chunk that divides T or the quadratic form",
			 fn, (long long)T, spec->chunk);
		return DG_ERR_INVALID_ARG;
	}
	dg_status st = dg__op_check(spec, op, fn, c, NULL, msg, size);
	if (st)
		return st;
	/* an output written in place while other blocks still read the inputs */
	const dg_op_info *row = dg_op_info_of(op);
	for (int o = 0; o < row->n_args; o++) {
		if (!row->args[o].output)
			continue;
		for (int i = 0; i < row->n_args; i++)
			if (!row->args[i].output && overlap(c->t[o], c->t[i])) {
				snprintf(msg, size, "%s: %s: overlaps %s, which the kernel reads while it writes %s; give %s its own buffer",
					 fn, row->args[o].name, row->args[i].name, row->args[o].name,
					 row->args[o].name);
				return DG_ERR_INVALID_ARG;
			}
	}
	return DG_OK;
}

dg_status dg__check_attention_chunk_state(const dg_spec *spec, const dg__op_call *c, char *msg,
					  size_t size)
{
	return chunk_check(DG_OP_ATTENTION_CHUNK_STATE, spec, c, msg, size);
}

dg_status dg__check_attention_chunk_out(const dg_spec *spec, const dg__op_call *c, char *msg,
					size_t size)
{
	return chunk_check(DG_OP_ATTENTION_CHUNK_OUT, spec, c, msg, size);
}

dg_status dg__check_attention_chunk_dq(const dg_spec *spec, const dg__op_call *c, char *msg,
				       size_t size)
{
	return chunk_check(DG_OP_ATTENTION_CHUNK_DQ, spec, c, msg, size);
}

/* The rule a prepared chunk op checks at every launch (the pointers). */
static dg_status chunk_ptrs(const dg_prepared *p, const dg__op_call *c, char *msg, size_t msg_size)
{
	return chunk_check(p->spec.op, &p->spec, c, msg, msg_size);
}

/* ---- the GEMMs --------------------------------------------------------------------- */

/* The call's argument indices (the op table's order). */
enum { ST_QR, ST_SRC, ST_STATES };
enum { OUT_QR, OUT_STATES, OUT_OUT };
enum { DQ_C, DQ_QR, DQ_GRAD, DQ_V, DQ_S, DQ_R, DQ_ROPE, DQ_DXS, DQ_MASK };

/* A bf16 map of rows of `cols` values, `rows` a matrix, `mats` matrices,
 * boxes of 64 x 64. */
static dg_status map3(dg_device *dev, dg__tmap *m, const dg_tensor *t, int64_t cols, int64_t rows,
		      int64_t mats)
{
	const uint64_t dims[3] = { (uint64_t)cols, (uint64_t)rows, (uint64_t)mats };
	const uint32_t box[2] = { 64, 64 };
	return dg__tmap_bf16(dev, m, t->data, dims, box);
}

/* The maps of each GEMM over the call's tensors (templates/attention_chunk.lua's
 * ABI): qr (N, T, B·H); v (D, T, B) or the gradient (D, T, B·H); a
 * chunk's states (D, 2N, B·H·T/C); the chunks' C (C, C, B·H·T/C). */
static dg_status chunk_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	const dg_spec *s = &p->spec;
	const int64_t B = p->shape.b, T = p->shape.t, H = s->heads, N = s->latent, D = s->embd,
		      C = s->chunk, chunks = B * H * (T / C);
	dg_device *dev = p->dev;
	dg_status st;
	switch (s->op) {
	case DG_OP_ATTENTION_CHUNK_STATE:
		st = map3(dev, &maps[0], c->t[ST_QR], N, T, B * H);
		return st ? st : map3(dev, &maps[1], c->t[ST_SRC], D, T, B * s->in_heads);
	case DG_OP_ATTENTION_CHUNK_OUT:
		st = map3(dev, &maps[0], c->t[OUT_QR], N, T, B * H);
		return st ? st : map3(dev, &maps[1], c->t[OUT_STATES], D, 2 * N, chunks);
	default:
		if ((st = map3(dev, &maps[0], c->t[DQ_C], C, C, chunks)) ||
		    (st = map3(dev, &maps[1], c->t[DQ_QR], N, T, B * H)) ||
		    (st = map3(dev, &maps[2], c->t[DQ_GRAD], D, T, B * H)) ||
		    (st = map3(dev, &maps[3], c->t[DQ_V], D, T, B)) ||
		    (st = map3(dev, &maps[4], c->t[DQ_S], D, 2 * N, chunks)))
			return st;
		return map3(dev, &maps[5], c->t[DQ_R], D, 2 * N, chunks);
	}
}

/* Any of the three: grid (columns / BN, rows / BM, B·H); the tile's
 * warps and a producer warpgroup a block. state's columns are D and its
 * rows the state's N; out's D and T; dq's N and T. */
static dg_status gemm_prep(dg_prepared *p, const dg__op_call *c, const char *entry)
{
	const dg_spec *spec = &p->spec;
	const int64_t B = p->shape.b, T = p->shape.t;
	p->ptrs = chunk_ptrs;
	if (B * T == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, entry, &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	int64_t cols = spec->embd, rows = T;
	if (spec->op == DG_OP_ATTENTION_CHUNK_STATE)
		rows = spec->latent;
	else if (spec->op == DG_OP_ATTENTION_CHUNK_DQ)
		cols = spec->latent;
	const int64_t gx = dg__op_cdiv(cols, t->bn), gy = dg__op_cdiv(rows, t->bm), gz = B * spec->heads;
	if (gy > 65535 || gz > 65535)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: T = %lld and B = %lld need a grid of %lld x %lld blocks (y, z); at most 65535 each",
				    p->fn, (long long)T, (long long)B, (long long)gy, (long long)gz);
	dg_launch l;
	memset(&l, 0, sizeof(l));
	l.grid[0] = (unsigned)gx;
	l.grid[1] = (unsigned)gy;
	l.grid[2] = (unsigned)gz;
	l.block[0] = (unsigned)(t->wm * t->wn * 32 + 128);
	l.block[1] = l.block[2] = 1;
	/* the maps of the call prepared with, made once here: a driver that
	 * cannot make them refuses the prepare, not a launch */
	dg__tmap maps[DG__PREP_TMAPS];
	if ((st = chunk_tmaps(p, c, maps)))
		return st;
	p->tmaps = chunk_tmaps;
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	switch (spec->op) {
	case DG_OP_ATTENTION_CHUNK_STATE:
	case DG_OP_ATTENTION_CHUNK_OUT:
		dg__arg_tmap(p, L, 0);
		dg__arg_tmap(p, L, 1);
		dg__arg_data(p, L, 2); /* states | out */
		dg__arg_i32(p, L, B);
		dg__arg_i32(p, L, T);
		DG__FLAG_OF(p, L, backward);
		break;
	default:
		for (int i = 0; i < 6; i++)
			dg__arg_tmap(p, L, i);
		dg__arg_data(p, L, DQ_ROPE);
		dg__arg_data(p, L, DQ_DXS);
		dg__arg_data(p, L, DQ_MASK);
		dg__arg_i32(p, L, B);
		dg__arg_i32(p, L, T);
		break;
	}
	return DG_OK;
}

dg_status dg__prep_attention_chunk_state(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c, "dg_attention_chunk_state");
}

dg_status dg__prep_attention_chunk_out(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c, "dg_attention_chunk_out");
}

dg_status dg__prep_attention_chunk_dq(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c, "dg_attention_chunk_dq");
}

/* ---- the element-wise helpers ------------------------------------------------------ */

/* A grid-stride kernel over `work` items: (in, out, B, T), or cast's (in,
 * out, n). */
static dg_status ew_prep(dg_prepared *p, const char *entry, long long work, bool count)
{
	const int64_t B = p->shape.b, T = p->shape.t;
	if (work == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, entry, &k);
	if (st)
		return st;
	const int nt = dg_kernel_spec(k)->tile.threads;
	const long long sms = dg__dev_info(p->dev)->sm_count > 0 ? dg__dev_info(p->dev)->sm_count : 1;
	dg_launch l = { { dg__op_grid(work, nt, 8LL * sms), 1, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);
	dg__arg_data(p, L, 1);
	if (count) {
		dg__arg_i64(p, L, work);
	} else {
		dg__arg_i32(p, L, B);
		dg__arg_i32(p, L, T);
	}
	return DG_OK;
}

dg_status dg__prep_attention_chunk_vrep(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const long long work = (long long)p->shape.b * p->spec.heads * p->shape.t * (p->spec.embd / 8);
	return ew_prep(p, "dg_attention_chunk_vrep", work, false);
}

dg_status dg__prep_attention_chunk_cast(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const long long work = (long long)p->shape.b * p->spec.heads * p->shape.t * p->spec.embd;
	return ew_prep(p, "dg_attention_chunk_cast", work, true);
}

dg_status dg__prep_attention_chunk_hsum(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const long long work = (long long)p->shape.b * p->shape.t * p->spec.embd;
	return ew_prep(p, "dg_attention_chunk_hsum", work, false);
}
