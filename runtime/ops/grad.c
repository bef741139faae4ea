/*
 * The gradient GEMMs of the lowrank and decoder families (kernels of
 * templates/grad*.lua): their grids, the split of the grad_weight
 * reduction over B·T, and the split of lowrank_grad_input's over K.
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
 * lowrank_grad_input reduces over K = (H/Hin)·L (32768 at the BDH encoder)
 * onto B·T x E outputs, a few dozen tiles: the same split over grid z,
 * with the count picked from the grid and the SM count
 * (dg__grad_input_splits).
 */
#include <string.h>

#include "runtime/ops/ops_int.h"

#define MAX_SPLITS 64 /* grad_weight's */
#define MIN_STEPS_A_SPLIT 4 /* K steps each split sums at least */
#define REDUCE_THREADS 256  /* RNT in templates/grad_ops.lua */

/* A GEMM's grid; its block is the plan's threads (block 0x0x0: the
 * tile's warps, and the producer warpgroup on the warp-specialized form). */
static dg_launch gemm_launch(unsigned gx, unsigned gy, unsigned gz)
{
	dg_launch l;

	memset(&l, 0, sizeof(l));
	l.grid[0] = gx;
	l.grid[1] = gy;
	l.grid[2] = gz;
	return l;
}

/* The reduce entries' launch over n partial sums a split: float4s
 * grid-stride, REDUCE_THREADS a block. */
static dg_launch reduce_launch(dg_device *dev, int64_t n)
{
	dg_launch r;

	memset(&r, 0, sizeof(r));
	r.grid[0] = dg__op_grid(n / 4, REDUCE_THREADS, 8LL * dg__dev_info(dev)->sm_count);
	r.grid[1] = r.grid[2] = 1;
	r.block[0] = REDUCE_THREADS;
	r.block[1] = r.block[2] = 1;
	return r;
}

/* Blocks of kernel k an SM for the split model: 1 or 2. Estimated from its
 * shared memory (the device's opt-in limit plus the 1 KiB a block reserves
 * stand in for an SM's: 228 KiB on sm_90, 164 on sm_80) and its registers
 * (64 Ki a block, which is also an SM's there); more than two resident
 * blocks share the same tensor cores, so the model counts two. */
static int64_t resident_of(dg_device *dev, const dg_kernel *k)
{
	const dg_device_info *di = dg__dev_info(dev);
	dg_kernel_info ki;

	if (dg_kernel_info_get(k, &ki) != DG_OK)
		return 1;
	int64_t r = 2;
	int64_t smem = (int64_t)ki.dyn_smem + ki.static_smem + 1024;
	if (((int64_t)di->smem_optin + 1024) / smem < r)
		r = ((int64_t)di->smem_optin + 1024) / smem;
	int64_t regs = (int64_t)ki.regs * (ki.block_threads > 0 ? ki.block_threads : 1);
	if (regs > 0 && di->regs_per_block / regs < r)
		r = di->regs_per_block / regs;
	return r < 1 ? 1 : r;
}

/* ---- the warp-specialized form (templates/grad_wgmma.lua) -----------------
 * Its kernels (lowrank_grad_input and _weight, bf16, a tile of 5 to 8
 * stages) have a producer warpgroup beside the tile's warps, which loads
 * both operands by TMA, and take two tensor maps after the op's arguments;
 * at T % 64 != 0 an auto tile takes the cp.async ring's 3 stages
 * (dg__tma_rows_tile). */

/* decoder_grad_weight's sm_90a kernels (the ring and the warp-specialized
 * form) read their A, the f32 gradient's bf16 copy (B·T·E values, made by
 * the module's _cast entry first), at the end of the workspace: its bytes,
 * 256-aligned. */
size_t dg__grad_copy_bytes(const dg_prepared *p)
{
	return (size_t)dg__op_align256((size_t)p->shape.b * (size_t)p->shape.t * (size_t)p->spec.embd * 2);
}

dg_status dg__prep_grad_cast(dg_prepared *p, dg_kernel *kc, int64_t ws_off)
{
	const int64_t n8 = p->shape.b * p->shape.t * p->spec.embd / 8;
	dg_launch lc = reduce_launch(p->dev, 4 * n8);
	dg_status st;
	dg__prep_launch *L = dg__prep_add(p, kc, &lc, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);
	dg__arg_ws(p, L, ws_off);
	dg__arg_i64(p, L, n8);
	return DG_OK;
}

/* The maps of a warp-specialized call, bf16 rank 3, boxes of 64 x 64:
 * ma over grad (L, T, B·H); mb over x (E, T, B·Hin) for grad_weight, over
 * w (E, H·L, 1) for grad_input. decoder_grad_weight: ma over the
 * gradient's bf16 copy (E, T, B), mb the same (its kernel loads y itself). */
static dg_status ws_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	const dg_spec *s = &p->spec;
	const uint64_t B = (uint64_t)p->shape.b, T = (uint64_t)p->shape.t, H = (uint64_t)s->heads,
		       L = (uint64_t)s->latent, E = (uint64_t)s->embd;
	const uint32_t box[2] = { 64, 64 };
	if (s->op == DG_OP_DECODER_GRAD_WEIGHT) {
		/* (a call that only sizes the workspace has none: the trial map
		 * of the prepare goes over grad's bytes, as many or more) */
		const uint64_t dg[3] = { E, T, B };
		const dg_dptr at = c->ws.ptr ? c->ws.ptr + (p->ws_bytes - dg__grad_copy_bytes(p)) : c->t[0]->data;
		dg_status st = dg__tmap_bf16(p->dev, &maps[0], at, dg, box);
		if (!st)
			maps[1] = maps[0];
		return st;
	}
	const uint64_t da[3] = { L, T, B * H };
	dg_status st = dg__tmap_bf16(p->dev, &maps[0], c->t[0]->data, da, box);
	if (st)
		return st;
	if (s->op == DG_OP_LOWRANK_GRAD_WEIGHT) {
		const uint64_t dx[3] = { E, T, B * (uint64_t)s->in_heads };
		return dg__tmap_bf16(p->dev, &maps[1], c->t[1]->data, dx, box);
	}
	const uint64_t dw[3] = { E, H * L, 1 };
	return dg__tmap_bf16(p->dev, &maps[1], c->t[1]->data, dw, box);
}

/* Whether kernel k is of the warp-specialized form; if so the call's maps,
 * made once here (a driver that cannot make them refuses the prepare, not
 * a launch). The launch's block is the plan's threads (gemm_launch), the
 * producer warpgroup's included. */
static dg_status ws_maps(dg_prepared *p, const dg__op_call *c, const dg_kernel *k, bool *ws)
{
	*ws = dg__tma_abi(k);
	if (!*ws)
		return DG_OK;
	dg__tmap maps[DG__PREP_TMAPS];
	dg_status st = ws_tmaps(p, c, maps);
	if (!st)
		p->tmaps = ws_tmaps;
	return st;
}

/* The count that finishes soonest in a model of the GPU as `slots` blocks
 * running at once (SMs · resident_of): s splits of per = ceil(steps / s)
 * steps take ceil(blocks·s / slots) rounds of per steps. A larger count
 * must win by more than 1/32 of that time, as its partials (4 MiB a split
 * at the BDH shape, written once and read once) are not free; each split
 * keeps at least MIN_STEPS_A_SPLIT steps, and none is empty. At the BDH
 * shape on 132 SMs: the warpgroup path's 128x128 tile (two blocks an SM,
 * 264 slots) splits the encoder (Hin 1: 64 tiles, 512 steps) in 4 (256
 * blocks of 128 steps, one round) and encoder_v (Hin 4: 256 tiles, 128
 * steps) not at all; the mma.sync default 64x128 (116 KiB, one block an
 * SM; 128 tiles) not at all. */
int dg__grad_input_splits(int64_t blocks, int64_t steps, int64_t slots, int want, int *per)
{
	if (steps < 1)
		steps = 1;
	if (slots < 1)
		slots = 1;
	int splits = 1;
	if (want > 0) {
		splits = want; /* forced: the last splits may be empty */
	} else {
		int64_t best = dg__op_cdiv(blocks, slots) * steps;
		for (int s = 2; s <= DG__GRAD_INPUT_MAX_SPLITS && steps >= (int64_t)s * MIN_STEPS_A_SPLIT;
		     s++) {
			int64_t p = dg__op_cdiv(steps, s), eff = dg__op_cdiv(steps, p); /* no empty split */
			int64_t cost = dg__op_cdiv(blocks * eff, slots) * p;
			if (cost * 32 < best * 31) {
				best = cost;
				splits = (int)eff;
			}
		}
	}
	*per = (int)dg__op_cdiv(steps, splits);
	return splits;
}

/* The kernel of a grad_input call, its grid without the split, and its
 * split (reduce NULL: none, the kernel takes no split). */
static dg_status gi_plan(dg_prepared *p, const char *entry,
			 const char *reduce, int64_t bt, int64_t n_cols, unsigned gz, int64_t k_len,
			 int want, dg_kernel **k, dg_launch *l, int *splits, int *per)
{
	dg_device *dev = p->dev;
	dg_status st = dg_kernel_get(dev, &p->spec, entry, k);
	if (!st)
		st = dg__tma_rows_tile(p, entry, 3, k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(*k)->tile;
	*l = gemm_launch((unsigned)dg__op_cdiv(n_cols, t->bn), (unsigned)dg__op_cdiv(bt, t->bm), gz);
	if (l->grid[1] > 65535)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: batch·time = %lld rows need %u row blocks of %d, more than the grid's 65535",
				    entry, (long long)bt, l->grid[1], t->bm);
	*splits = 1;
	*per = (int)dg__op_cdiv(k_len, t->bk);
	if (reduce) {
		const int sms = dg__dev_info(dev)->sm_count;
		*splits = dg__grad_input_splits((int64_t)l->grid[0] * l->grid[1] * gz,
						dg__op_cdiv(k_len, t->bk),
						(int64_t)(sms > 0 ? sms : 1) * resident_of(dev, *k), want, per);
	}
	return DG_OK;
}

dg_status dg__grad_input_prep(dg_prepared *p, const dg__op_call *c, const char *entry,
			      const char *reduce, int64_t n_cols, unsigned gz, int64_t k_len, int want)
{
	dg_device *dev = p->dev;
	const dg_spec *spec = &p->spec;
	int64_t bt = p->shape.b * p->shape.t;
	int64_t nx = bt * gz * n_cols; /* elements of out (one partial) */
	dg_kernel *k = NULL, *kr = NULL;
	dg_launch l;
	int splits = 1, per = 1;

	if (bt == 0)
		return DG_OK; /* nothing to compute */
	bool ws;
	dg_status st = gi_plan(p, entry, reduce, bt, n_cols, gz, k_len, want, &k, &l, &splits, &per);
	if (!st)
		st = ws_maps(p, c, k, &ws);
	if (st)
		return st;
	if (!reduce) {
		dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
		if (!L)
			return st;
		dg__arg_data(p, L, 0);
		dg__arg_data(p, L, 1);
		dg__arg_scale(p, L, 1);
		dg__arg_data(p, L, 2);
		dg__arg_i32(p, L, p->shape.b);
		dg__arg_i32(p, L, p->shape.t);
		return DG_OK;
	}
	if (splits > 1) {
		p->ws_bytes = (size_t)splits * (size_t)nx * 4;
		if ((st = dg_kernel_get(dev, spec, reduce, &kr)))
			return st;
	}
	l.grid[2] = gz * (unsigned)splits;
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);
	dg__arg_data(p, L, 1);
	dg__arg_scale(p, L, 1);
	if (splits > 1)
		dg__arg_ws(p, L, 0);
	else
		dg__arg_data(p, L, 2);
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	dg__arg_i32(p, L, splits);
	dg__arg_i32(p, L, per);
	if (ws) {
		dg__arg_tmap(p, L, 0);
		dg__arg_tmap(p, L, 1);
	}
	if (splits == 1)
		return DG_OK;

	/* Second pass: out = s · Σ partials, in split order. */
	dg_launch r = reduce_launch(dev, nx);
	if (!(L = dg__prep_add(p, kr, &r, &st)))
		return st;
	dg__arg_ws(p, L, 0);
	dg__arg_i32(p, L, splits);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 2);
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	return DG_OK;
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

/* Whether decoder_grad_weight's kernel k reads the gradient's bf16 copy:
 * its module has the _cast entry that makes it (templates/grad_wgmma.lua;
 * the mma.sync and SIMT paths read the f32 gradient). */
static bool dgw_reads_copy(const dg_kernel *k)
{
	return dg_kernel_entry_named(k, "dg_decoder_grad_weight_cast") != NULL;
}

dg_status dg__grad_weight_prep(dg_prepared *p, const dg__op_call *c, const char *entry,
			       const char *reduce, int64_t rows, int64_t cols)
{
	dg_device *dev = p->dev;
	const dg_spec *spec = &p->spec;
	dg_kernel *k = NULL, *kr = NULL;
	int64_t H = spec->heads;
	int64_t nw = H * rows * cols; /* elements of grad_w */
	int per;

	dg_status st = dg_kernel_get(dev, spec, entry, &k);
	if (!st)
		st = dg__tma_rows_tile(p, entry, 3, &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	int splits = splits_of(dev, t, H, p->shape.b * p->shape.t, rows, cols, &per);
	if (splits > 1) {
		p->ws_bytes = (size_t)splits * (size_t)nw * 4;
		if ((st = dg_kernel_get(dev, spec, reduce, &kr)))
			return st;
	}
	dg_launch l = gemm_launch((unsigned)dg__op_cdiv(cols, t->bn),
				  (unsigned)dg__op_cdiv(rows, t->bm), (unsigned)(H * splits));
	dg__prep_launch *L;
	const bool dgw_copy = spec->op == DG_OP_DECODER_GRAD_WEIGHT && dgw_reads_copy(k);
	if (dgw_copy) {
		/* the gradient's bf16 copy after the partials: 8 values a thread a
		 * step, at most 8 blocks an SM */
		dg_kernel *kc;
		if ((st = dg_kernel_get(dev, spec, "dg_decoder_grad_weight_cast", &kc)))
			return st;
		p->ws_bytes = (size_t)dg__op_align256(p->ws_bytes) + dg__grad_copy_bytes(p);
		if ((st = dg__prep_grad_cast(p, kc, (int64_t)(p->ws_bytes - dg__grad_copy_bytes(p)))))
			return st;
	}
	bool ws;
	if ((st = ws_maps(p, c, k, &ws)))
		return st;
	if (!(L = dg__prep_add(p, k, &l, &st)))
		return st;
	if (dgw_copy) /* grad: its copy */
		dg__arg_ws(p, L, (int64_t)(p->ws_bytes - dg__grad_copy_bytes(p)));
	else
		dg__arg_data(p, L, 0);
	dg__arg_data(p, L, 1);
	dg__arg_scale(p, L, 1);
	if (splits > 1)
		dg__arg_ws(p, L, 0);
	else
		dg__arg_data(p, L, 2);
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	dg__arg_i32(p, L, splits);
	dg__arg_i32(p, L, per);
	DG__FLAG_OF(p, L, accumulate);
	if (ws) {
		dg__arg_tmap(p, L, 0);
		dg__arg_tmap(p, L, 1);
	}
	if (splits == 1)
		return DG_OK;

	/* Second pass: grad_w (+)= s · Σ partials, in split order. */
	dg_launch r = reduce_launch(dev, nw);
	if (!(L = dg__prep_add(p, kr, &r, &st)))
		return st;
	dg__arg_ws(p, L, 0);
	dg__arg_i32(p, L, splits);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 2);
	DG__FLAG_OF(p, L, accumulate);
	return DG_OK;
}
