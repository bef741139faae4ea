/*
 * Ops: the four backward GEMMs (dragon/ops.h) — lowrank_grad_input,
 * lowrank_grad_weight, decoder_grad_input, decoder_grad_weight. Each call
 * checks the tensors against the spec (the _check twins run the same checks
 * without a device), fetches the kernel of templates/backward.lua and
 * launches it on the device's stream.
 *
 * The grid depends on the tile the kernel was compiled with, which the JIT
 * resolves (an auto tile gets the tuning DB's or the default one): it is
 * read back from the loaded kernel's canonical spec, never guessed. The
 * tile also picks the kernel's path (bf16 tensor cores from sm_80 with the
 * default tiles, templates/backward_mma.lua; fp32 SIMT otherwise,
 * templates/backward.lua): the grid and block are the same for both, and
 * the tensor-core path's dynamic shared memory comes from the template's
 * launch info (launch.smem 0).
 *
 * The grad_weight ops reduce over B·T, a run-time length: when the output
 * tiles alone would leave the GPU idle, the reduction is split over grid z
 * into partials (device scratch slot 0) that a second kernel sums in a
 * fixed order — no float atomics, so results are reproducible on a device.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/spec.h"
#include "dragon/tensor.h"
#include "runtime/gpu/gpu_int.h"

#define MAX_SPLITS 64
#define MIN_STEPS_A_SPLIT 4 /* K steps each split sums at least */

/* ---- checks ---------------------------------------------------------------- */

static dg_status spec_ok(const dg_spec *spec, dg_op op, char *msg,
			 size_t size)
{
	if (!spec) {
		snprintf(msg, size, "spec is NULL");
		return DG_ERR_INVALID_SPEC;
	}
	if (spec->op != op) {
		snprintf(msg, size, "op=%s: this call runs op %s",
			 dg_op_name(spec->op), dg_op_name(op));
		return DG_ERR_INVALID_SPEC;
	}
	return dg_spec_validate(spec, msg, size);
}

/* B·T: both positive or zero, the product an int the kernels can index
 * with (their row offsets are 64-bit). */
static dg_status bt_ok(const dg_tensor *grad, int64_t b, int64_t t,
		       char *msg, size_t size)
{
	if (b > 0 && t > INT_MAX / b) {
		snprintf(msg, size,
			 "%s: batch·time = %lld·%lld is more than %d rows",
			 grad->name ? grad->name : "grad", (long long)b,
			 (long long)t, INT_MAX);
		return DG_ERR_INVALID_ARG;
	}
	return DG_OK;
}

dg_status dg_lowrank_grad_input_check(const dg_spec *spec,
				      const dg_lowrank_grad_input_args *a,
				      char *msg, size_t msg_size)
{
	char local[512];
	dg_status st;

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, DG_OP_LOWRANK_GRAD_INPUT, msg, msg_size);
	if (st)
		return st;
	if (!a) {
		snprintf(msg, msg_size, "lowrank_grad_input: args are NULL");
		return DG_ERR_INVALID_ARG;
	}
	int64_t H = spec->heads, Hin = spec->in_heads, E = spec->embd,
		L = spec->latent;
	int64_t gs[4] = { -1, H, -1, L };
	st = dg_tensor_expect(a->grad, "grad", DG_FMT_F32, 4, gs, false, msg,
			      msg_size);
	if (st)
		return st;
	int64_t B = a->grad->shape[0], T = a->grad->shape[2];
	int64_t ws[3] = { H, L, E };
	st = dg_tensor_expect(a->w, "w", spec->weight, 3, ws, true, msg,
			      msg_size);
	if (st)
		return st;
	int64_t xs[4] = { B, Hin, T, E };
	st = dg_tensor_expect(a->grad_x, "grad_x", DG_FMT_F32, 4, xs, false,
			      msg, msg_size);
	if (st)
		return st;
	return bt_ok(a->grad, B, T, msg, msg_size);
}

dg_status dg_lowrank_grad_weight_check(const dg_spec *spec,
				       const dg_lowrank_grad_weight_args *a,
				       char *msg, size_t msg_size)
{
	char local[512];
	dg_status st;

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, DG_OP_LOWRANK_GRAD_WEIGHT, msg, msg_size);
	if (st)
		return st;
	if (!a) {
		snprintf(msg, msg_size, "lowrank_grad_weight: args are NULL");
		return DG_ERR_INVALID_ARG;
	}
	int64_t H = spec->heads, Hin = spec->in_heads, E = spec->embd,
		L = spec->latent;
	int64_t gs[4] = { -1, H, -1, L };
	st = dg_tensor_expect(a->grad, "grad", DG_FMT_F32, 4, gs, false, msg,
			      msg_size);
	if (st)
		return st;
	int64_t B = a->grad->shape[0], T = a->grad->shape[2];
	int64_t xs[4] = { B, Hin, T, E };
	st = dg_tensor_expect(a->x, "x", spec->act, 4, xs, true, msg,
			      msg_size);
	if (st)
		return st;
	int64_t ws[3] = { H, L, E };
	st = dg_tensor_expect(a->grad_w, "grad_w", DG_FMT_F32, 3, ws, false,
			      msg, msg_size);
	if (st)
		return st;
	return bt_ok(a->grad, B, T, msg, msg_size);
}

dg_status dg_decoder_grad_input_check(const dg_spec *spec,
				      const dg_decoder_grad_input_args *a,
				      char *msg, size_t msg_size)
{
	char local[512];
	dg_status st;

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, DG_OP_DECODER_GRAD_INPUT, msg, msg_size);
	if (st)
		return st;
	if (!a) {
		snprintf(msg, msg_size, "decoder_grad_input: args are NULL");
		return DG_ERR_INVALID_ARG;
	}
	int64_t H = spec->heads, E = spec->embd, L = spec->latent;
	int64_t gs[4] = { -1, 1, -1, E };
	st = dg_tensor_expect(a->grad, "grad", DG_FMT_F32, 4, gs, false, msg,
			      msg_size);
	if (st)
		return st;
	int64_t B = a->grad->shape[0], T = a->grad->shape[2];
	int64_t ws[2] = { E, H * L };
	st = dg_tensor_expect(a->w, "w", spec->weight, 2, ws, true, msg,
			      msg_size);
	if (st)
		return st;
	int64_t ys[4] = { B, H, T, L };
	st = dg_tensor_expect(a->grad_y, "grad_y", DG_FMT_F32, 4, ys, false,
			      msg, msg_size);
	if (st)
		return st;
	return bt_ok(a->grad, B, T, msg, msg_size);
}

dg_status dg_decoder_grad_weight_check(const dg_spec *spec,
				       const dg_decoder_grad_weight_args *a,
				       char *msg, size_t msg_size)
{
	char local[512];
	dg_status st;

	if (!msg || !msg_size) { /* the caller wants no message */
		msg = local;
		msg_size = sizeof(local);
	}
	st = spec_ok(spec, DG_OP_DECODER_GRAD_WEIGHT, msg, msg_size);
	if (st)
		return st;
	if (!a) {
		snprintf(msg, msg_size, "decoder_grad_weight: args are NULL");
		return DG_ERR_INVALID_ARG;
	}
	int64_t H = spec->heads, E = spec->embd, L = spec->latent;
	int64_t gs[4] = { -1, 1, -1, E };
	st = dg_tensor_expect(a->grad, "grad", DG_FMT_F32, 4, gs, false, msg,
			      msg_size);
	if (st)
		return st;
	int64_t B = a->grad->shape[0], T = a->grad->shape[2];
	int64_t ys[4] = { B, H, T, L };
	st = dg_tensor_expect(a->y, "y", spec->act, 4, ys, true, msg,
			      msg_size);
	if (st)
		return st;
	int64_t ws[2] = { E, H * L };
	st = dg_tensor_expect(a->grad_w, "grad_w", DG_FMT_F32, 2, ws, false,
			      msg, msg_size);
	if (st)
		return st;
	return bt_ok(a->grad, B, T, msg, msg_size);
}

/* ---- launch helpers -------------------------------------------------------- */

/* The kernel `entry` of spec and the tile it was compiled with. */
static dg_status kernel_and_tile(dg_device *dev, const dg_spec *spec_in,
				 const char *entry, dg_kernel **k,
				 dg_tile *tile)
{
	dg_kernel_info info;
	dg_spec ks;
	char msg[256];
	/* an auto tile: the JIT resolves it (tuning DB, else the default,
	 * whose BK divides the reduction) and the tile is read back */
	const dg_spec *spec = spec_in;
	dg_status st = dg_kernel_get(dev, spec, entry, k);

	if (st)
		return st;
	memset(&info, 0, sizeof(info));
	st = dg_kernel_info_get(*k, &info);
	if (st == DG_OK)
		st = dg_spec_parse(info.canonical, &ks, msg, sizeof(msg));
	if (st || ks.tile.bm <= 0 || ks.tile.bn <= 0 || ks.tile.bk <= 0 ||
	    ks.tile.wm <= 0 || ks.tile.wn <= 0)
		return dg__dev_fail(dev, DG_ERR_INTERNAL,
				    "%s: the loaded kernel's tile cannot be read back from '%s'",
				    entry, info.canonical);
	*tile = ks.tile;
	return DG_OK;
}

static unsigned cdiv(int64_t a, int64_t b)
{
	return (unsigned)((a + b - 1) / b);
}

static dg_launch gemm_launch(const dg_tile *t, unsigned gx, unsigned gy,
			     unsigned gz)
{
	dg_launch l;

	memset(&l, 0, sizeof(l));
	l.grid[0] = gx;
	l.grid[1] = gy;
	l.grid[2] = gz;
	l.block[0] = (unsigned)(t->wm * t->wn * 32);
	l.block[1] = 1;
	l.block[2] = 1;
	return l;
}

/* grad_input: grid (ceil(N/bn), ceil(B·T/bm), gz). */
static dg_status launch_grad_input(dg_device *dev, const dg_spec *spec,
				   const char *entry, const dg_tensor *grad,
				   const dg_tensor *w, const dg_tensor *out,
				   int64_t n_cols, unsigned gz)
{
	dg_kernel *k = NULL;
	dg_tile t;
	int B = (int)grad->shape[0], T = (int)grad->shape[2];
	dg_status st;

	if ((int64_t)B * T == 0)
		return DG_OK; /* nothing to compute */
	st = kernel_and_tile(dev, spec, entry, &k, &t);
	if (st)
		return st;
	dg_launch l = gemm_launch(&t, cdiv(n_cols, t.bn),
				  cdiv((int64_t)B * T, t.bm), gz);
	if (l.grid[1] > 65535)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: batch·time = %d rows need %u row blocks of %d, more than the grid's 65535",
				    grad->name ? grad->name : "grad", B * T,
				    l.grid[1], t.bm);
	dg_dptr g = grad->data, wp = w->data, s = w->scale, o = out->data;
	void *args[] = { &g, &wp, &s, &o, &B, &T };
	return dg_kernel_launch(dev, k, &l, args);
}

/* grad_weight: the output (H, MM, N) of MM x N per head, reduced over
 * B·T; split over grid z when the tiles alone are few. */
static dg_status launch_grad_weight(dg_device *dev, const dg_spec *spec,
				    const char *entry, const char *reduce,
				    const dg_tensor *grad, const dg_tensor *x,
				    const dg_tensor *grad_w, bool accumulate,
				    int64_t rows, int64_t cols)
{
	dg_kernel *k = NULL, *kr = NULL;
	dg_tile t;
	int B = (int)grad->shape[0], T = (int)grad->shape[2];
	int64_t H = spec->heads;
	int64_t nw = H * rows * cols; /* elements of grad_w */
	dg_status st = kernel_and_tile(dev, spec, entry, &k, &t);

	if (st)
		return st;
	int64_t steps = ((int64_t)B * T + t.bk - 1) / t.bk;
	int64_t blocks = (int64_t)cdiv(cols, t.bn) * cdiv(rows, t.bm) * H;
	int64_t target = 2 * (int64_t)dg__dev_info(dev)->sm_count;
	int splits = 1;
	while (splits * 2 <= MAX_SPLITS && blocks * splits < target &&
	       steps >= (int64_t)splits * 2 * MIN_STEPS_A_SPLIT)
		splits *= 2;
	int per = (int)((steps + splits - 1) / splits);
	if (per < 1)
		per = 1;
	splits = (int)((steps + per - 1) / per);
	if (splits < 1)
		splits = 1;

	dg_dptr dst = grad_w->data;
	if (splits > 1) {
		st = dg__dev_scratch(dev, 0, (size_t)splits * (size_t)nw * 4,
				     &dst);
		if (st)
			return st;
		st = kernel_and_tile(dev, spec, reduce, &kr, &t);
		if (st)
			return st;
	}
	dg_launch l = gemm_launch(&t, cdiv(cols, t.bn), cdiv(rows, t.bm),
				  (unsigned)(H * splits));
	dg_dptr g = grad->data, xp = x->data, s = x->scale;
	int acc = accumulate ? 1 : 0;
	void *args[] = { &g, &xp, &s, &dst, &B, &T, &splits, &per, &acc };
	st = dg_kernel_launch(dev, k, &l, args);
	if (st || splits == 1)
		return st;

	/* Second pass: grad_w (+)= s · Σ partials, in split order. */
	dg_launch r;
	memset(&r, 0, sizeof(r));
	int64_t nv = nw / 4, rb = (nv + 255) / 256,
		cap = 8 * (int64_t)dg__dev_info(dev)->sm_count;
	r.grid[0] = (unsigned)(rb < cap ? (rb > 0 ? rb : 1) : cap);
	r.grid[1] = r.grid[2] = 1;
	r.block[0] = 256; /* RNT in templates/backward.lua */
	r.block[1] = r.block[2] = 1;
	dg_dptr part = dst, out = grad_w->data;
	void *rargs[] = { &part, &splits, &s, &out, &acc };
	return dg_kernel_launch(dev, kr, &r, rargs);
}

/* ---- ops ------------------------------------------------------------------- */

dg_status dg_lowrank_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_lowrank_grad_input_args *a)
{
	char msg[512];
	dg_status st = dg_lowrank_grad_input_check(spec, a, msg, sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	return launch_grad_input(dev, spec, "dg_lowrank_grad_input", a->grad,
				 a->w, a->grad_x, spec->embd,
				 (unsigned)spec->in_heads);
}

dg_status dg_decoder_grad_input(dg_device *dev, const dg_spec *spec,
				const dg_decoder_grad_input_args *a)
{
	char msg[512];
	dg_status st = dg_decoder_grad_input_check(spec, a, msg, sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	return launch_grad_input(dev, spec, "dg_decoder_grad_input", a->grad,
				 a->w, a->grad_y, spec->latent,
				 (unsigned)spec->heads);
}

dg_status dg_lowrank_grad_weight(dg_device *dev, const dg_spec *spec,
				 const dg_lowrank_grad_weight_args *a)
{
	char msg[512];
	dg_status st = dg_lowrank_grad_weight_check(spec, a, msg, sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	/* per head: rows l (L), cols e (E) */
	return launch_grad_weight(dev, spec, "dg_lowrank_grad_weight",
				  "dg_lowrank_grad_weight_reduce", a->grad,
				  a->x, a->grad_w, a->accumulate, spec->latent,
				  spec->embd);
}

dg_status dg_decoder_grad_weight(dg_device *dev, const dg_spec *spec,
				 const dg_decoder_grad_weight_args *a)
{
	char msg[512];
	dg_status st = dg_decoder_grad_weight_check(spec, a, msg, sizeof(msg));

	if (st)
		return dg__dev_fail_msg(dev, st, msg);
	/* per head: rows d (E), cols l (L) */
	return launch_grad_weight(dev, spec, "dg_decoder_grad_weight",
				  "dg_decoder_grad_weight_reduce", a->grad,
				  a->y, a->grad_w, a->accumulate, spec->embd,
				  spec->latent);
}
