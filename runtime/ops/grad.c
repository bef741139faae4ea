/*
 * The gradient GEMMs of the lowrank and decoder families (kernels of
 * templates/backward.lua): their grids, and the split of the grad_weight
 * reduction over B·T.
 *
 * The grid depends on the tile the kernel was built with, which the device
 * resolves (an auto tile gets the tuning DB's or the template's default):
 * it is read off the loaded kernel (dg_kernel_spec), never guessed. The
 * tile also picks the kernel's path (bf16 tensor cores or fp32 SIMT); the
 * grid and block are the same for both, and the dynamic shared memory is
 * the plan's (launch.smem 0).
 *
 * The grad_weight ops reduce over B·T, a run-time length: when the output
 * tiles alone would leave the GPU idle, the reduction is split over grid z
 * into partials (the caller's workspace) that a second kernel sums in a
 * fixed order — no float atomics, so results are reproducible on a device.
 */
#include <string.h>

#include "runtime/ops/ops_int.h"

#define MAX_SPLITS 64
#define MIN_STEPS_A_SPLIT 4 /* K steps each split sums at least */
#define REDUCE_THREADS 256  /* RNT in templates/backward.lua */

static dg_launch gemm_launch(const dg_tile *t, unsigned gx, unsigned gy, unsigned gz)
{
	dg_launch l;

	memset(&l, 0, sizeof(l));
	l.grid[0] = gx;
	l.grid[1] = gy;
	l.grid[2] = gz;
	l.block[0] = (unsigned)(t->wm * t->wn * 32);
	l.block[1] = l.block[2] = 1;
	return l;
}

dg_status dg__grad_input_launch(dg_device *dev, const dg_spec *spec, const char *entry,
				const dg_tensor *grad, const dg_tensor *w, const dg_tensor *out,
				int64_t n_cols, unsigned gz)
{
	int B = (int)grad->shape[0], T = (int)grad->shape[2];
	dg_kernel *k = NULL;

	if ((int64_t)B * T == 0)
		return DG_OK; /* nothing to compute */
	dg_status st = dg_kernel_get(dev, spec, entry, &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	dg_launch l = gemm_launch(t, (unsigned)dg__op_cdiv(n_cols, t->bn),
				  (unsigned)dg__op_cdiv((int64_t)B * T, t->bm), gz);
	if (l.grid[1] > 65535)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: batch·time = %d rows need %u row blocks of %d, more than the grid's 65535",
				    grad->name ? grad->name : "grad", B * T, l.grid[1], t->bm);
	dg_dptr g = grad->data, wp = w->data, s = w->scale, o = out->data;
	void *args[] = { &g, &wp, &s, &o, &B, &T };
	return dg_kernel_launch(dev, k, &l, args);
}

/* The split of a grad_weight reduction of bt rows with tile t: enough
 * (tile, split) blocks for two an SM, each split at least
 * MIN_STEPS_A_SPLIT K steps. *per gets the K steps of a split. */
static int splits_of(dg_device *dev, const dg_tile *t, int64_t heads, int64_t bt,
		     int64_t rows, int64_t cols, int *per)
{
	int64_t steps = (bt + t->bk - 1) / t->bk;
	int64_t blocks = dg__op_cdiv(cols, t->bn) * dg__op_cdiv(rows, t->bm) * heads;
	int64_t target = 2 * (int64_t)dg__dev_info(dev)->sm_count;
	int splits = 1;
	while (splits * 2 <= MAX_SPLITS && blocks * splits < target &&
	       steps >= (int64_t)splits * 2 * MIN_STEPS_A_SPLIT)
		splits *= 2;
	int p = (int)((steps + splits - 1) / splits);
	if (p < 1)
		p = 1;
	splits = (int)((steps + p - 1) / p);
	*per = p;
	return splits < 1 ? 1 : splits;
}

dg_status dg__grad_weight_workspace(dg_device *dev, const dg_spec *spec, const char *entry,
				    int64_t bt, int64_t rows, int64_t cols, size_t *bytes)
{
	dg_kernel *k = NULL;
	int per;

	*bytes = 0;
	dg_status st = dg_kernel_get(dev, spec, entry, &k);
	if (st)
		return st;
	int splits = splits_of(dev, &dg_kernel_spec(k)->tile, spec->heads, bt, rows, cols, &per);
	if (splits > 1)
		*bytes = (size_t)splits * (size_t)(spec->heads * rows * cols) * 4;
	return DG_OK;
}

dg_status dg__grad_weight_launch(dg_device *dev, const dg_spec *spec, const char *entry,
				 const char *reduce, const dg_tensor *grad, const dg_tensor *x,
				 const dg_tensor *grad_w, bool accumulate, const dg_workspace *ws,
				 int64_t rows, int64_t cols)
{
	dg_kernel *k = NULL, *kr = NULL;
	int B = (int)grad->shape[0], T = (int)grad->shape[2];
	int64_t H = spec->heads;
	int64_t nw = H * rows * cols; /* elements of grad_w */
	int per;

	dg_status st = dg_kernel_get(dev, spec, entry, &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	int splits = splits_of(dev, t, H, (int64_t)B * T, rows, cols, &per);
	dg_dptr dst = grad_w->data;
	if (splits > 1) {
		st = dg__op_workspace_ok(dev, entry, ws, (size_t)splits * (size_t)nw * 4);
		if (!st)
			st = dg_kernel_get(dev, spec, reduce, &kr);
		if (st)
			return st;
		dst = ws->ptr;
	}
	dg_launch l = gemm_launch(t, (unsigned)dg__op_cdiv(cols, t->bn),
				  (unsigned)dg__op_cdiv(rows, t->bm), (unsigned)(H * splits));
	dg_dptr g = grad->data, xp = x->data, s = x->scale;
	int acc = accumulate ? 1 : 0;
	void *args[] = { &g, &xp, &s, &dst, &B, &T, &splits, &per, &acc };
	st = dg_kernel_launch(dev, k, &l, args);
	if (st || splits == 1)
		return st;

	/* Second pass: grad_w (+)= s · Σ partials, in split order. */
	dg_launch r;
	memset(&r, 0, sizeof(r));
	r.grid[0] = dg__op_grid(nw / 4, REDUCE_THREADS, 8LL * dg__dev_info(dev)->sm_count);
	r.grid[1] = r.grid[2] = 1;
	r.block[0] = REDUCE_THREADS;
	r.block[1] = r.block[2] = 1;
	dg_dptr part = dst, out = grad_w->data;
	void *rargs[] = { &part, &splits, &s, &out, &acc };
	return dg_kernel_launch(dev, kr, &r, rargs);
}
