/*
 * The decoder family: the decoder tail (decoder_fwd: split-K into
 * per-split slices of partial sums in the caller's workspace, which a
 * second launch adds and converts) and its input and weight gradients (the
 * GEMMs of grad.c). Kernels: templates/decoder.lua, templates/grad.lua.
 */
#include "runtime/ops/ops_int.h"

/* ---- decoder_fwd ---------------------------------------------------------- */

/* K splits: enough (tile, split) items for two a SM (one a SM, one wave,
 * on the wgmma path: a block fills its SM), each split at least 256 codes
 * of K, at most 32. The float path sums K in one item (deterministic): 1.
 * r: the spec the kernel was built for (its tile). */
static int splits_of(const dg_spec *r, long long m, int sms, long long *tiles)
{
	*tiles = dg__op_cdiv(m, r->tile.bm) * dg__op_cdiv(r->embd, r->tile.bn);
	if (!dg_fmt_is_code(r->act) || !dg_fmt_is_code(r->weight))
		return 1;
	if (sms < 1)
		sms = 1;
	long long want = r->arch_specific ? (sms / *tiles > 1 ? sms / *tiles : 1)
					  : dg__op_cdiv(2LL * sms, *tiles);
	long long most = (long long)r->heads * r->latent / 256;
	if (want > most)
		want = most;
	if (want > 32)
		want = 32;
	return want < 1 ? 1 : (int)want;
}

/* The warp-specialized form (templates/decoder.lua KERNEL_WS): its maps,
 * bytes of rank 3: ma over y (L, T, B·H), boxes of 128 codes by 64 rows
 * (b, t) of one b; mb over w (H·L, E, 1), boxes of 128 codes by BN rows. */
static dg_status ws_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	const dg_spec *s = &p->spec;
	const uint64_t L = (uint64_t)s->latent, H = (uint64_t)s->heads;
	const uint64_t dy[3] = { L, (uint64_t)p->shape.t, (uint64_t)p->shape.b * H };
	const uint64_t dw[3] = { H * L, (uint64_t)s->embd, 1 };
	const uint32_t box_a[2] = { 128, 64 }, box_b[2] = { 128, (uint32_t)p->iv[0] };
	dg_status st = dg__tmap_u8(p->dev, &maps[0], c->t[0]->data, dy, box_a);
	return st ? st : dg__tmap_u8(p->dev, &maps[1], c->t[1]->data, dw, box_b);
}

dg_status dg__prep_decoder_fwd(dg_prepared *p, const dg__op_call *c)
{
	dg_device *dev = p->dev;
	dg_kernel *k, *k2;
	long long tiles;
	long long m = p->shape.b * p->shape.t, n = m * p->spec.embd;

	if (m == 0)
		return DG_OK;
	dg_status st = dg_kernel_get(dev, &p->spec, "dg_decoder_fwd", &k);
	if (!st)
		st = dg__tma_rows_tile(p, "dg_decoder_fwd", 4, &k);
	if (!st)
		st = dg_kernel_get(dev, &p->spec, "dg_decoder_fwd_out", &k2);
	if (st)
		return st;
	bool ws = dg__tma_abi(k);
	if (ws) {
		/* the maps of the call prepared with, made once here: a driver
		 * that cannot make them refuses the prepare, not a launch */
		p->iv[0] = dg_kernel_spec(k)->tile.bn;
		dg__tmap maps[DG__PREP_TMAPS];
		if ((st = ws_tmaps(p, c, maps)))
			return st;
		p->tmaps = ws_tmaps;
	}
	const int sms = dg__dev_info(dev)->sm_count;
	int nsplit = splits_of(dg_kernel_spec(k), m, sms, &tiles);
	if (ws) {
		/* a persistent grid of one block an SM walks the items: the
		 * count whose rounds of items finish soonest (grad.c's model;
		 * each split writes a slice of M·E int32, read once more) */
		int per;
		const dg_tile *t = &dg_kernel_spec(k)->tile;
		nsplit = dg__grad_input_splits(tiles, (long long)p->spec.heads * p->spec.latent / t->bk,
					       sms > 0 ? sms : 1, 0, &per);
	}
	/* one slice of partial sums a split (int32; f32 for the float path,
	 * which runs one split): every element written, nothing to zero */
	p->ws_bytes = (size_t)nsplit * (size_t)m * (size_t)p->spec.embd * 4;
	long long work = tiles * nsplit; /* the kernel strides over any grid */
	dg_launch l1 = { { dg__op_grid(work, 1, (ws ? 1LL : 16LL) * sms), 1, 1 }, { 0, 0, 0 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l1, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* y */
	dg__arg_data(p, L, 1); /* w */
	dg__arg_ws(p, L, 0);
	dg__arg_i32(p, L, p->shape.b);
	dg__arg_i32(p, L, p->shape.t);
	dg__arg_i32(p, L, nsplit);
	if (ws) {
		dg__arg_tmap(p, L, 0);
		dg__arg_tmap(p, L, 1);
	}

	dg_launch l2 = { { dg__op_grid(n, 1024, 16LL * (sms / 2 > 0 ? sms / 2 : 1)), 1, 1 },
			 { 256, 1, 1 }, 0 };
	if (!(L = dg__prep_add(p, k2, &l2, &st)))
		return st;
	dg__arg_ws(p, L, 0);
	dg__arg_scale(p, L, 0);
	dg__arg_scale(p, L, 1);
	dg__arg_data(p, L, 2); /* out */
	dg__arg_i64(p, L, n);
	dg__arg_i32(p, L, nsplit);
	return DG_OK;
}

/* ---- decoder_grad_input ----------------------------------------------------- */

dg_status dg__prep_decoder_grad_input(dg_prepared *p, const dg__op_call *c)
{
	/* K = E: a few steps, never split (no reduce entry) */
	return dg__grad_input_prep(p, c, "dg_decoder_grad_input", NULL, p->spec.latent,
				   (unsigned)p->spec.heads, p->spec.embd, 0);
}

/* ---- decoder_grad_weight ---------------------------------------------------- */

dg_status dg__prep_decoder_grad_weight(dg_prepared *p, const dg__op_call *c)
{
	/* per head: rows d (E), cols l (L) */
	return dg__grad_weight_prep(p, c, "dg_decoder_grad_weight", "dg_decoder_grad_weight_reduce",
				    p->spec.embd, p->spec.latent);
}
