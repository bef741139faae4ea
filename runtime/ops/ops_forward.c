/*
 * The forward GEMM ops: lowrank_fwd (the projection), relu_mask (its ReLU
 * mask applied to a gradient, recomputed from the codes) and decoder_fwd
 * (the decoder tail, split-K into per-split slices of partial sums that a
 * second launch adds and converts).
 *
 * Each op runs its _check first (no device needed) and launches nothing
 * when it fails; the message then sits on the device. The kernels walk
 * their tiles with a grid stride (templates/lowrank.lua, decoder.lua), so
 * the grid here does not depend on the tile the runtime resolves: a
 * multiple of the SM count, capped by the most tiles any valid tile (16x16
 * at least) can make. Block size and dynamic shared memory come from the
 * template's launch info (launch.block / launch.smem left 0).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>


#include "runtime/gpu/gpu_int.h"

/* Rows B·T a kernel takes: int arithmetic inside, with tile padding. */
#define DG_MAX_ROWS (1LL << 30)

static bool is_code(dg_fmt f)
{
	return f == DG_FMT_INT8 || f == DG_FMT_INT4 || f == DG_FMT_UINT8POS ||
	       f == DG_FMT_TERNARY || f == DG_FMT_SIGN1;
}

static dg_status spec_check(const dg_spec *spec, const char *fn, dg_op op,
			    const void *args, char *msg, size_t msg_size)
{
	if (!spec || !args) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s: %s is NULL", fn,
				 !spec ? "spec" : "args");
		return DG_ERR_INVALID_ARG;
	}
	if (spec->op != op) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s: spec op=%s, expected op=%s", fn,
				 dg_op_name(spec->op), dg_op_name(op));
		return DG_ERR_INVALID_SPEC;
	}
	return dg_spec_validate(spec, msg, msg_size);
}

static dg_status rows_check(const char *fn, int64_t b, int64_t t, char *msg,
			    size_t msg_size)
{
	if (b * t > DG_MAX_ROWS || b > INT_MAX || t > INT_MAX) {
		if (msg && msg_size)
			snprintf(msg, msg_size,
				 "%s: B·T = %lld·%lld rows; at most %lld (split the batch)",
				 fn, (long long)b, (long long)t, DG_MAX_ROWS);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

/* Blocks for a grid-stride walk over `work` items: at most 16 an SM. */
static unsigned grid_for(long long work, int sms)
{
	long long cap = 16LL * (sms > 0 ? sms : 1);
	long long g = work < cap ? work : cap;
	return (unsigned)(g < 1 ? 1 : g);
}

static long long cdiv(long long a, long long b)
{
	return (a + b - 1) / b;
}

/* x (B,Hin,T,E) act and w (H,L,E) weight of lowrank_fwd / relu_mask;
 * *b, *t from x. */
static dg_status check_xw(const dg_spec *spec, const dg_tensor *x,
			  const dg_tensor *w, int64_t *b, int64_t *t, char *msg,
			  size_t msg_size)
{
	const int64_t xs[4] = { -1, spec->in_heads, -1, spec->embd };
	dg_status st = dg_tensor_expect(x, "x", spec->act, 4, xs,
					is_code(spec->act), msg, msg_size);
	if (st)
		return st;
	const int64_t ws[3] = { spec->heads, spec->latent, spec->embd };
	st = dg_tensor_expect(w, "w", spec->weight, 3, ws, is_code(spec->weight),
			      msg, msg_size);
	if (st)
		return st;
	*b = x->shape[0];
	*t = x->shape[2];
	return DG_OK;
}

/* ---- lowrank_fwd ---------------------------------------------------------- */

dg_status dg_lowrank_fwd_check(const dg_spec *spec, const dg_lowrank_fwd_args *a,
			       char *msg, size_t msg_size)
{
	int64_t b, t;
	dg_status st = spec_check(spec, "dg_lowrank_fwd", DG_OP_LOWRANK_FWD, a,
				  msg, msg_size);
	if (st)
		return st;
	st = check_xw(spec, a->x, a->w, &b, &t, msg, msg_size);
	if (st)
		return st;
	const int64_t os[4] = { b, spec->heads, t, spec->latent };
	bool out_code = spec->out == DG_FMT_INT8 || spec->out == DG_FMT_UINT8POS;
	st = dg_tensor_expect(a->out, "out", spec->out, 4, os, out_code, msg,
			      msg_size);
	if (st)
		return st;
	return rows_check("dg_lowrank_fwd", b, t, msg, msg_size);
}

dg_status dg_lowrank_fwd(dg_device *dev, const dg_spec *spec,
			 const dg_lowrank_fwd_args *a)
{
	char msg[512];
	dg_status st;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	st = dg_lowrank_fwd_check(spec, a, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	int B = (int)a->x->shape[0], T = (int)a->x->shape[2];
	long long m = (long long)B * T;
	if (m == 0)
		return DG_OK;
	const int sms = dg__dev_info(dev)->sm_count;
	long long work = cdiv(m, 16) * cdiv(spec->latent, 16) * spec->heads;
	dg_spec r; /* what runs: the tuned or the default tile */
	st = dg__spec_as_run(dev, spec, &r);
	if (st)
		return st;
	dg_dptr w = a->w->data;
	if (r.arch_specific) {
		/* wgmma path: (head, m-tile) rows of tiles, split into as many
		 * runs along n as two blocks an SM take (templates/
		 * lowrank_wgmma.lua) */
		work = 2LL * sms;
		if (r.tile.stages == 1 && (r.weight == DG_FMT_TERNARY || r.weight == DG_FMT_SIGN1)) {
			/* stages 1: the packed weights are unpacked to s8 codes once
			 * (2 or 1 bits → 8 a code), and the int8 kernel streams
			 * them, instead of every block decoding every tile */
			bool tern = r.weight == DG_FMT_TERNARY;
			int64_t rows = (int64_t)spec->heads * spec->latent;
			dg_spec u;
			dg_spec_init(&u, tern ? DG_OP_PACK_TERNARY : DG_OP_PACK_SIGN1);
			u.embd = spec->embd;
			u.arch = r.arch;
			st = dg__dev_scratch(dev, 1, (size_t)rows * (size_t)spec->embd, &w);
			if (st)
				return st;
			dg_tensor codes = dg_tensor_2d("w (unpacked)", DG_FMT_INT8, w, rows, spec->embd);
			dg_tensor packed = dg_tensor_2d("w", r.weight, a->w->data, rows, spec->embd);
			st = dg_pack_weight(dev, &u, &codes, &packed, true);
			if (st)
				return st;
			r.weight = DG_FMT_INT8;
		}
	}
	dg_launch l = { { grid_for(work, sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg_dptr x = a->x->data, out = a->out->data;
	dg_dptr sa = a->x->scale, sw = a->w->scale, so = a->out->scale;
	dg_dptr absum = a->out_absum;
	void *args[] = { &x, &w, &sa, &sw, &out, &so, &absum, &B, &T };
	return dg__op_launch(dev, &r, "dg_lowrank_fwd", &l, args);
}

/* ---- relu_mask ------------------------------------------------------------ */

dg_status dg_relu_mask_check(const dg_spec *spec, const dg_relu_mask_args *a,
			     char *msg, size_t msg_size)
{
	int64_t b, t;
	dg_status st = spec_check(spec, "dg_relu_mask", DG_OP_RELU_MASK, a, msg,
				  msg_size);
	if (st)
		return st;
	st = check_xw(spec, a->x, a->w, &b, &t, msg, msg_size);
	if (st)
		return st;
	const int64_t gs[4] = { b, spec->heads, t, spec->latent };
	st = dg_tensor_expect(a->grad, "grad", DG_FMT_F32, 4, gs, false, msg,
			      msg_size);
	if (st)
		return st;
	st = dg_tensor_expect(a->grad_out, "grad_out", DG_FMT_F32, 4, gs, false,
			      msg, msg_size);
	if (st)
		return st;
	return rows_check("dg_relu_mask", b, t, msg, msg_size);
}

dg_status dg_relu_mask(dg_device *dev, const dg_spec *spec,
		       const dg_relu_mask_args *a)
{
	char msg[512];
	dg_status st;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	st = dg_relu_mask_check(spec, a, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	int B = (int)a->x->shape[0], T = (int)a->x->shape[2];
	long long m = (long long)B * T;
	if (m == 0)
		return DG_OK;
	long long work = cdiv(m, 16) * cdiv(spec->latent, 16) * spec->heads;
	dg_launch l = { { grid_for(work, dg__dev_info(dev)->sm_count), 1, 1 },
			{ 0, 0, 0 }, 0 };
	dg_dptr x = a->x->data, w = a->w->data;
	dg_dptr sa = a->x->scale, sw = a->w->scale;
	dg_dptr grad = a->grad->data, grad_out = a->grad_out->data;
	void *args[] = { &x, &w, &sa, &sw, &grad, &grad_out, &B, &T };
	return dg__op_launch(dev, spec, "dg_relu_mask", &l, args);
}

/* ---- decoder_fwd ---------------------------------------------------------- */

dg_status dg_decoder_fwd_check(const dg_spec *spec, const dg_decoder_fwd_args *a,
			       char *msg, size_t msg_size)
{
	dg_status st = spec_check(spec, "dg_decoder_fwd", DG_OP_DECODER_FWD, a,
				  msg, msg_size);
	if (st)
		return st;
	const int64_t ys[4] = { -1, spec->heads, -1, spec->latent };
	st = dg_tensor_expect(a->y, "y", spec->act, 4, ys, is_code(spec->act),
			      msg, msg_size);
	if (st)
		return st;
	const int64_t ws[2] = { spec->embd, (int64_t)spec->heads * spec->latent };
	st = dg_tensor_expect(a->w, "w", spec->weight, 2, ws,
			      is_code(spec->weight), msg, msg_size);
	if (st)
		return st;
	int64_t b = a->y->shape[0], t = a->y->shape[2];
	const int64_t os[4] = { b, 1, t, spec->embd };
	st = dg_tensor_expect(a->out, "out", spec->out, 4, os, false, msg,
			      msg_size);
	if (st)
		return st;
	return rows_check("dg_decoder_fwd", b, t, msg, msg_size);
}

/* K splits of the integer path: enough (tile, split) items for two a SM
 * with the default tile (one a SM, one wave, on the wgmma path: a block
 * fills its SM), each split at least 256 codes of K, at most 32. The
 * float path sums K in one item (deterministic): 1. *tiles gets the
 * output tiles of the tile the runtime resolves by default. */
static int decoder_splits(const dg_spec *spec, const dg_spec *r, long long m,
			  int sms, long long *tiles)
{
	const dg_tile t = r->tile;
	*tiles = cdiv(m, t.bm > 0 ? t.bm : 128) * cdiv(spec->embd, t.bn > 0 ? t.bn : 128);
	if (!is_code(spec->act) || !is_code(spec->weight))
		return 1;
	if (sms < 1)
		sms = 1;
	long long want = r->arch_specific ? (sms / *tiles > 1 ? sms / *tiles : 1)
					 : cdiv(2LL * sms, *tiles);
	long long most = (long long)spec->heads * spec->latent / 256;
	if (want > most)
		want = most;
	if (want > 32)
		want = 32;
	return want < 1 ? 1 : (int)want;
}

dg_status dg_decoder_fwd(dg_device *dev, const dg_spec *spec,
			 const dg_decoder_fwd_args *a)
{
	char msg[512];
	dg_status st;

	if (!dev)
		return DG_ERR_INVALID_ARG;
	st = dg_decoder_fwd_check(spec, a, msg, sizeof(msg));
	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	int B = (int)a->y->shape[0], T = (int)a->y->shape[2];
	long long m = (long long)B * T, n = m * spec->embd;
	if (m == 0)
		return DG_OK;
	const int sms = dg__dev_info(dev)->sm_count;
	long long tiles = 0;
	dg_spec r; /* what runs: the tuned or the default tile */
	st = dg__spec_as_run(dev, spec, &r);
	if (st)
		return st;
	int nsplit = decoder_splits(spec, &r, m, sms, &tiles);
	/* One slice of partial sums a split (int32; f32 for the float path,
	 * which runs one split): every element written, nothing to zero. */
	dg_dptr ws = 0;
	st = dg__dev_scratch(dev, 0, (size_t)nsplit * (size_t)n * 4, &ws);
	if (st)
		return st;
	long long work = tiles * nsplit; /* the kernel strides over any grid */
	dg_launch l1 = { { grid_for(work, sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg_dptr y = a->y->data, w = a->w->data;
	void *a1[] = { &y, &w, &ws, &B, &T, &nsplit };
	st = dg__op_launch(dev, &r, "dg_decoder_fwd", &l1, a1);
	if (st)
		return st;

	dg_launch l2 = { { grid_for(cdiv(n, 1024), sms / 2 > 0 ? sms / 2 : 1), 1, 1 },
			 { 256, 1, 1 }, 0 };
	dg_dptr sa = a->y->scale, sw = a->w->scale, out = a->out->data;
	void *a2[] = { &ws, &sa, &sw, &out, &n, &nsplit };
	return dg__op_launch(dev, &r, "dg_decoder_fwd_out", &l2, a2);
}
