/*
 * The lowrank family: the projection (lowrank_fwd), its ReLU mask applied
 * to a gradient (relu_mask, y recomputed from the codes), and its input
 * and weight gradients (the GEMMs of grad.c). Kernels: templates/lowrank.lua
 * and templates/grad.lua.
 *
 * The projection's kernels walk their tiles with a grid stride, so the
 * grid does not depend on the tile: a multiple of the SM count, capped by
 * the most tiles any valid tile (16x16 at least) can make; on the wgmma
 * path (sm_90a) as many blocks as an SM holds at once (two for the codes'
 * 128x64 tile, one for bf16's, whose 160 KiB of shared memory at E 256
 * leave room for one), each a run of (head, m-tile) tiles.
 * A tile of 5 to 8 stages of 128-byte K slices names the warp-specialized
 * form (TMA operands, templates/lowrank_wgmma.lua KERNEL_WSP): its block is
 * two consumer warpgroups and the producer's, it takes two tensor maps
 * after T (ws_tmaps), and it needs T % 64 == 0 (at another T an auto tile
 * runs its 4-stage stream twin: dg__ws_rows_tile).
 * At B·T <= 8 (decoding) the module's few-rows entry runs instead where
 * it has one (templates/lowrank_rows.lua), its warps over the columns.
 * epi=rope (the warpgroup paths, bf16 out): the RoPE table and qr follow
 * T (before the maps), and qr gets RoPE(out) as rope_fwd makes it.
 * Block size and dynamic shared memory come from the plan (launch.block /
 * launch.smem left 0).
 */
#include "base/msg.h"
#include "runtime/ops/ops_int.h"

/* Blocks for a grid-stride walk over `work` tiles: at most 16 an SM. */
static unsigned tile_grid(long long work, int sms)
{
	return dg__op_grid(work, 1, 16LL * (sms > 0 ? sms : 1));
}

/* Blocks of kernel k an SM holds at once, 1 or 2 (the wgmma path's
 * blocks do not use more): its shared memory (and the 1 KiB the driver
 * reserves a block) against the SM's, its registers against the file. */
static long long blocks_per_sm(const dg_kernel *k, const dg_device_info *di)
{
	dg_kernel_info ki;
	if (dg_kernel_info_get(k, &ki) != DG_OK || ki.block_threads <= 0)
		return 1;
	long long smem = (long long)ki.dyn_smem + ki.static_smem + 1024;
	long long sm_smem = (long long)di->smem_optin + 1024;
	long long regs = (long long)((ki.regs + 7) / 8 * 8) * ki.block_threads;
	long long file = di->regs_per_block > 0 ? di->regs_per_block : 65536;
	return 2 * smem <= sm_smem && 2 * regs <= file ? 2 : 1;
}

/* ---- lowrank_fwd ---------------------------------------------------------- */

/* B·T up to which the few-rows entry runs (decoding: a token a sequence)
 * where the spec's module has one (templates/lowrank_rows.lua): a GEMM
 * tile of 64 to 256 rows for one useful row reads the weights through
 * shared memory at a fraction of the HBM's rate. */
#define DG_LOWRANK_ROWS 8

/* The maps of the warp-specialized form (templates/lowrank_wgmma.lua
 * KERNEL_WSP), 128-byte slices of K with the 128-byte swizzle: ma over x
 * (E, T, B·Hin), boxes of 64 rows; mb over w's rows of a group of 64 as
 * (E, r 2, q 4, j 8, H·L/64) at row strides (1, 16, 2, 64), boxes of a
 * whole group: row 8j + 2q + r of the box is the group's row 16q + 2j +
 * r, the column order dg_bcol (one copy a group where it took eight).
 * iv[0]: bytes an element (bf16 2, codes 1). */
static dg_status ws_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	const dg_spec *s = &p->spec;
	const int es = (int)p->iv[0];
	const uint64_t E = (uint64_t)s->embd;
	const uint64_t dx[3] = { E, (uint64_t)p->shape.t, (uint64_t)p->shape.b * (uint64_t)s->in_heads };
	const uint64_t row = E * (uint64_t)es;
	const uint64_t dw[5] = { E, 2, 4, 8, (uint64_t)s->heads * (uint64_t)s->latent / 64 };
	const uint64_t sw[4] = { row, 16 * row, 2 * row, 64 * row };
	const uint32_t box_x[3] = { 128u / (uint32_t)es, 64, 1 }, box_w[5] = { 128u / (uint32_t)es, 2, 4, 8, 1 };
	dg_status st = dg__tmap_box3(p->dev, &maps[0], c->t[0]->data, es, dx, box_x);
	return st ? st : dg__tmap_rank5(p->dev, &maps[1], c->t[1]->data, es, dw, sw, box_w);
}

/* Whether k is the warp-specialized form (templates/lowrank_wgmma.lua
 * M.ws_form: 5 to 8 stages of 128-byte K slices on the sm_90a target; a
 * block of two consumer warpgroups and the producer's, at BM 64 too). */
static bool ws_kernel(const dg_kernel *k)
{
	const dg_spec *s = dg_kernel_spec(k);
	const int es = s->act == DG_FMT_BF16 ? 2 : 1;
	dg_kernel_info ki;
	return s->arch_specific && s->tile.stages >= 5 && s->tile.bk * es == 128 &&
	       dg_kernel_info_get(k, &ki) == DG_OK && ki.block_threads == 384;
}

dg_status dg__prep_lowrank_fwd(dg_prepared *p, const dg__op_call *c)
{
	int64_t B = p->shape.b, T = p->shape.t;
	if (B * T == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, "dg_lowrank_fwd", &k);
	if (st)
		return st;
	const dg_device_info *di = dg__dev_info(p->dev);
	const int sms = di->sm_count;
	const dg_kernel *kr = B * T <= DG_LOWRANK_ROWS ? dg_kernel_entry_named(k, "dg_lowrank_fwd_rows") : NULL;
	/* the warp-specialized form reads 64 rows of T a box: at another T
	 * its tile's 4-stage stream twin (the few-rows entry needs neither) */
	const bool ws = !kr && ws_kernel(k);
	if ((st = dg__ws_rows_tile(p, "dg_lowrank_fwd", 4, ws, &k)))
		return st;
	const bool tma = ws && p->shape.t % 64 == 0;
	if (tma) {
		/* the maps of the call prepared with, made once here: a driver
		 * that cannot make them refuses the prepare, not a launch */
		p->iv[0] = p->spec.act == DG_FMT_BF16 ? 2 : 1;
		dg__tmap maps[DG__PREP_TMAPS];
		if ((st = ws_tmaps(p, c, maps)))
			return st;
		p->tmaps = ws_tmaps;
	}
	/* the wgmma path (an arch-specific spec with a warpgroup tile; an
	 * auto tile the path refuses resolves to another): (head, m-tile) rows
	 * of tiles, split into as many runs along n as the SMs hold blocks at
	 * once (templates/lowrank_wgmma.lua) */
	const dg_spec *ks = dg_kernel_spec(k);
	const dg_tile *t = &ks->tile;
	bool wg = ks->arch_specific && t->wn == 1 && t->wm % 4 == 0 && t->bm == 16 * t->wm;
	long long work = wg ? blocks_per_sm(k, di) * sms
			    : dg__op_cdiv(B * T, 16) * dg__op_cdiv(p->spec.latent, 16) *
				      p->spec.heads;
	/* the few-rows entry: a warp per group of 1 to 8 columns, so a block of
	 * 8 warps for every 32 columns at most */
	if (kr)
		work = dg__op_cdiv(p->spec.heads * p->spec.latent, 32);
	dg_launch l = { { tile_grid(work, sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, kr ? kr : k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);  /* x */
	dg__arg_data(p, L, 1);  /* w */
	dg__arg_scale(p, L, 0);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 2);  /* out */
	dg__arg_scale(p, L, 2);
	DG__ARG_OF(p, L, absum);
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	if (p->spec.epi == DG_EPI_ROPE) { /* the table, and qr (its kernels have no few-rows entry) */
		dg__arg_data(p, L, 3);
		dg__arg_data(p, L, 4);
	}
	if (tma) {
		dg__arg_tmap(p, L, 0);
		dg__arg_tmap(p, L, 1);
	}
	return DG_OK;
}

/* ---- relu_mask ------------------------------------------------------------ */

dg_status dg__prep_relu_mask(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	int64_t B = p->shape.b, T = p->shape.t;
	if (B * T == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, "dg_relu_mask", &k);
	if (st)
		return st;
	long long work = dg__op_cdiv(B * T, 16) * dg__op_cdiv(p->spec.latent, 16) * p->spec.heads;
	dg_launch l = { { tile_grid(work, dg__dev_info(p->dev)->sm_count), 1, 1 }, { 0, 0, 0 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0);  /* x */
	dg__arg_data(p, L, 1);  /* w */
	dg__arg_scale(p, L, 0);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 2);  /* grad */
	dg__arg_data(p, L, 3);  /* grad_out */
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	return DG_OK;
}

/* ---- lowrank_grad_input ----------------------------------------------------- */

/* The call's K splits: 0 (the runtime's choice) or 1 to the most. */
static dg_status gi_splits_ok(const char *fn, int splits, char *msg, size_t msg_size)
{
	if (splits < 0 || splits > DG__GRAD_INPUT_MAX_SPLITS)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: splits %d: must be 0 (the runtime picks) or 1 to %d", fn, splits,
				DG__GRAD_INPUT_MAX_SPLITS);
	return DG_OK;
}

/* The tensors' check, then the splits'. */
dg_status dg__check_lowrank_grad_input(const dg_spec *spec, const dg__op_call *c, char *msg,
				       size_t msg_size)
{
	static const char fn[] = "dg_lowrank_grad_input";
	dg_status st = dg__op_check(spec, DG_OP_LOWRANK_GRAD_INPUT, fn, c, NULL, msg, msg_size);
	return st ? st : gi_splits_ok(fn, c->splits, msg, msg_size);
}

/* K = (H/Hin)·L: block z's heads, their latents in order. */
static int64_t gi_k(const dg_spec *spec)
{
	return (int64_t)(spec->heads / spec->in_heads) * spec->latent;
}

dg_status dg__prep_lowrank_grad_input(dg_prepared *p, const dg__op_call *c)
{
	return dg__grad_input_prep(p, c, "dg_lowrank_grad_input", "dg_lowrank_grad_input_reduce",
				   p->spec.embd, (unsigned)p->spec.in_heads, gi_k(&p->spec),
				   c->splits);
}

/* ---- lowrank_grad_weight ---------------------------------------------------- */

dg_status dg__prep_lowrank_grad_weight(dg_prepared *p, const dg__op_call *c)
{
	/* per head: rows l (L), cols e (E) */
	return dg__grad_weight_prep(p, c, "dg_lowrank_grad_weight", "dg_lowrank_grad_weight_reduce",
				    p->spec.latent, p->spec.embd);
}
