/*
 * The attention family (dragon/ops.h): RoPE (templates/rope.lua) and the
 * five GEMMs of BDH's attention (templates/attention.lua), each an op of
 * the table, and the forward and backward chains over them.
 *
 * The GEMMs' grid depends on the tile the device resolved for the kernel,
 * read off the loaded kernel (dg_kernel_spec), never guessed: x the column
 * blocks (N = T, E or L), y the row blocks of T, z the (b, h) pairs (the
 * batch alone for attention_grad_v, whose K loop walks the heads in order,
 * so its head sum is deterministic). No op allocates, frees or
 * synchronizes; the backward chain's C = dS + dSᵀ is the caller's
 * workspace. attention_grad_xs's call is its epilogue's (the op table's
 * dg_op_arg.epi): grad_xs, or with epi=mask dxs and mask_xs, which its
 * kernel takes in grad_xs's place; the chain given dxs runs that one.
 *
 * Each op lays its launch out for prepare (dg__prep_<name>): the chains
 * call the typed ops, which prepare and launch.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/ops/ops_int.h"

/* ---- rope ------------------------------------------------------------------------ */

/* Either direction: (src, rope, dst, int B, int T). The kernel
 * (templates/rope.lua) takes any grid: x strides over the table's columns
 * (t, unit: 4 pairs where L % 8 == 0, else one), reading a column's
 * (cos, sin) once for every (b, h) row; y splits the B·H rows in groups
 * of 8, and is more than 1 only where the columns alone give fewer than
 * four blocks an SM (short T): this only sizes the grid. */
static dg_status rope_prep(dg_prepared *p, const char *entry)
{
	int64_t B = p->shape.b, T = p->shape.t;
	const long long rows = (long long)B * p->spec.heads;
	const long long cols = (long long)T * (p->spec.latent / 2) / (p->spec.latent % 8 == 0 ? 4 : 1);
	if (rows * cols == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, &p->spec, entry, &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	const long long sms = dg__dev_info(p->dev)->sm_count > 0 ? dg__dev_info(p->dev)->sm_count : 1;
	unsigned gx = dg__op_grid(cols, nt, 8LL * sms);
	unsigned gy = dg__op_grid(4LL * sms, gx, dg__op_cdiv(rows, 8));
	if (gy > 65535)
		gy = 65535;
	dg_launch l = { { gx, gy, 1 }, { (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	dg__arg_data(p, L, 0); /* x | grad */
	dg__arg_data(p, L, 1); /* rope */
	dg__arg_data(p, L, 2); /* out | grad_x */
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	return DG_OK;
}

dg_status dg__prep_rope_fwd(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return rope_prep(p, "dg_rope_fwd");
}

dg_status dg__prep_rope_bwd(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	return rope_prep(p, "dg_rope_bwd");
}

/* ---- the GEMMs -------------------------------------------------------------------- */

/* attention_grad_xs's dxs in the op table's order (codegen/optable.c). */
#define GX_DXS 4
#define GX_ROPE 2 /* and mask_xs GX_DXS + 1 */

/* The columns N of op's GEMM and whether its grid z is B·H (else B). */
static int64_t gemm_cols(const dg_spec *spec, int64_t t, bool *per_head)
{
	*per_head = spec->op != DG_OP_ATTENTION_GRAD_V;
	switch (spec->op) {
	case DG_OP_ATTENTION_SCORES:
	case DG_OP_ATTENTION_GRAD_SCORES:
		return t;
	case DG_OP_ATTENTION_GRAD_XS:
		return spec->latent;
	default:
		return spec->embd;
	}
}

/* Whether the bytes of a and b overlap (either NULL: no). */
static bool overlap(const dg_tensor *a, const dg_tensor *b)
{
	if (!a || !b)
		return false;
	dg_dptr a1 = a->data + dg_tensor_bytes(a), b1 = b->data + dg_tensor_bytes(b);
	return a->data < b1 && b->data < a1;
}

/* attention_grad_xs epi=mask's rule on the call's pointers: a dxs that
 * overlaps an input is refused, for its blocks write dxs in place while
 * others still read grad_scores, xs and rope, and the mask read must see
 * the ReLU's output, not a sum written over it. c passed the op table's
 * check (its tensors have their shapes). */
static dg_status grad_xs_dxs_ok(const char *fn, const dg__op_call *c, char *msg, size_t size)
{
	const dg_op_info *row = dg_op_info_of(DG_OP_ATTENTION_GRAD_XS);
	for (int i = 0; i < row->n_args; i++)
		if (!row->args[i].output && overlap(c->t[GX_DXS], c->t[i])) {
			const dg_tensor *d = c->t[GX_DXS], *o = c->t[i];
			snprintf(msg, size,
				 "dxs: %s: overlaps %s, which the kernel reads while it writes dxs in place; give dxs its own buffer (dxs: %zu bytes at 0x%llx, %s: %zu at 0x%llx)",
				 fn, row->args[i].name, dg_tensor_bytes(d), (unsigned long long)d->data, row->args[i].name,
				 dg_tensor_bytes(o), (unsigned long long)o->data);
			return DG_ERR_INVALID_ARG;
		}
	return DG_OK;
}

/* attention_grad_xs's whole check: the op table's, then with epi=mask
 * dxs's overlaps (grad_xs_dxs_ok). */
dg_status dg__check_attention_grad_xs(const dg_spec *spec, const dg__op_call *c, char *msg,
				      size_t size)
{
	static const char fn[] = "dg_attention_grad_xs";
	char local[512];
	if (!msg || !size) {
		msg = local;
		size = sizeof(local);
	}
	dg_status st = dg__op_check(spec, DG_OP_ATTENTION_GRAD_XS, fn, c, NULL, msg, size);
	if (st || spec->epi != DG_EPI_MASK)
		return st;
	return grad_xs_dxs_ok(fn, c, msg, size);
}

/* The rule a prepared attention_grad_xs epi=mask checks at every launch. */
static dg_status grad_xs_ptrs(const dg_prepared *p, const dg__op_call *c, char *msg,
			      size_t msg_size)
{
	return grad_xs_dxs_ok(p->fn, c, msg, msg_size);
}

/* The two maps of a warp-specialized kernel (the path's ABI,
 * templates/attention_tma.lua), bf16 rank 3: attention_scores' A and B over
 * RoPE(xs) (L, T, B·H), boxes of 64 columns by bm and bn rows (the kernel's
 * tile); attention_grad_xs's A over C (T, T, B·H), boxes of 64 columns by
 * bm rows (the tile's, or a block's share in a cluster of blocks along N),
 * and its B over RoPE(xs), boxes of 64 columns by 64 rows. */
static dg_status tma_maps(dg_device *dev, const dg_spec *spec, int64_t bm, int64_t bn, dg_dptr c_ptr,
			  dg_dptr qr, int64_t b, int64_t tl, dg__tmap *ma, dg__tmap *mb)
{
	const uint64_t dims[3] = { (uint64_t)spec->latent, (uint64_t)tl, (uint64_t)(b * spec->heads) };
	if (spec->op == DG_OP_ATTENTION_SCORES) {
		const uint32_t box_a[2] = { 64, (uint32_t)bm }, box_b[2] = { 64, (uint32_t)bn };
		dg_status st = dg__tmap_bf16(dev, ma, qr, dims, box_a);
		return st ? st : dg__tmap_bf16(dev, mb, qr, dims, box_b);
	}
	const uint64_t dims_c[3] = { (uint64_t)tl, (uint64_t)tl, (uint64_t)(b * spec->heads) };
	const uint32_t box_c[2] = { 64, (uint32_t)bm }, box[2] = { 64, 64 };
	dg_status st = dg__tmap_bf16(dev, ma, c_ptr, dims_c, box_c);
	return st ? st : dg__tmap_bf16(dev, mb, qr, dims, box);
}

/* The iv of a prepared GEMM on the warp-specialized path: what its maps
 * are made of besides the call's pointer (IV_TEPI: the epilogue's three). */
enum { IV_B, IV_T, IV_BM, IV_BN, IV_TEPI };

/* Whether kernel k of attention_grad_xs takes its epilogue's operands by
 * TMA (templates/attention_tma.lua M.tma_epi: the persistent form with
 * epi=mask, dxs and mask_xs bf16), so its ABI ends in three maps more. */
static bool grad_xs_tma_epi(const dg_kernel *k)
{
	const dg_spec *s = dg_kernel_spec(k);
	return s->op == DG_OP_ATTENTION_GRAD_XS && s->epi == DG_EPI_MASK && s->out == DG_FMT_BF16 &&
	       s->act == DG_FMT_BF16 && dg__tma_abi(k) && dg__attn_persistent_tile(&s->tile);
}

/* The epilogue's maps (rank 3, boxes of 32 columns by bm rows): md over
 * dxs and mx over mask_xs, bf16 (L, T, B·H), and mr over the RoPE table,
 * f32 (L, T, 1). */
static dg_status epi_maps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[3])
{
	const uint64_t L = (uint64_t)p->spec.latent, T = (uint64_t)p->iv[IV_T];
	const uint64_t dims[3] = { L, T, (uint64_t)(p->iv[IV_B] * p->spec.heads) }, dims_r[3] = { L, T, 1 };
	const uint32_t box[2] = { 32, (uint32_t)p->iv[IV_BM] };
	dg_status st = dg__tmap_rows(p->dev, &maps[0], c->t[GX_DXS]->data, 2, dims, box);
	if (!st)
		st = dg__tmap_rows(p->dev, &maps[1], c->t[GX_DXS + 1]->data, 2, dims, box);
	return st ? st : dg__tmap_rows(p->dev, &maps[2], c->t[GX_ROPE]->data, 4, dims_r, box);
}

/* A prepared GEMM's maps over the call's tensors: RoPE(xs) is scores'
 * operand 0 and grad_xs' operand 1 (C its operand 0). */
static dg_status gemm_tmaps(const dg_prepared *p, const dg__op_call *c, dg__tmap maps[DG__PREP_TMAPS])
{
	bool scores = p->spec.op == DG_OP_ATTENTION_SCORES;
	dg_dptr qr = c->t[scores ? 0 : 1]->data, cp = scores ? 0 : c->t[0]->data;
	dg_status st = tma_maps(p->dev, &p->spec, p->iv[IV_BM], p->iv[IV_BN], cp, qr, p->iv[IV_B], p->iv[IV_T],
				&maps[0], &maps[1]);
	return st || !p->iv[IV_TEPI] ? st : epi_maps(p, c, &maps[2]);
}

/* attention_grad_xs's C by TMA needs rows of T bf16 of a multiple of 16
 * bytes. At another T an auto tile becomes the cp.async ring's (the
 * default of templates/attention.lua's wgmma path: 128 x 128 x 64, 8 warps,
 * 3 stages), and the persistent form's tile (4 stages, the auto one where
 * T allows) the ring of its BM x BN at 3 stages; k the kernel of that
 * tile. Another warp-specialized tile asked for is refused. */
static dg_status grad_xs_tile(dg_prepared *p, int64_t T, dg_kernel **k)
{
	if (p->spec.op != DG_OP_ATTENTION_GRAD_XS || T % 8 == 0 || !dg__tma_abi(*k))
		return DG_OK;
	const dg_tile *kt = &dg_kernel_spec(*k)->tile;
	const bool persistent = dg__attn_persistent_tile(kt);
	if (!dg_tile_is_auto(&p->spec.tile) && !persistent)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: T = %lld: the warp-specialized tile (stages %d) reads C by TMA, which needs T %% 8 == 0; take the cp.async ring's tile (3 stages) or an auto tile",
				    p->fn, (long long)T, kt->stages);
	return dg__kernel_retiled(p, *k,
				  persistent ? (dg_tile){ kt->bm, kt->bn, kt->bk, kt->wm, kt->wn, 3, 0 }
					     : (dg_tile){ 128, 128, 64, 8, 1, 3, 0 },
				  p->fn, k);
}

/* Any of the five: the op's tensors its epilogue uses in the table's
 * order, then (int B, int T), then on the warp-specialized path its two
 * maps (a producer warpgroup of 128 threads more a block). */
static dg_status gemm_prep(dg_prepared *p, const dg__op_call *c)
{
	const dg_spec *spec = &p->spec;
	int64_t B = p->shape.b, T = p->shape.t;

	if (spec->op == DG_OP_ATTENTION_GRAD_XS && spec->epi == DG_EPI_MASK)
		p->ptrs = grad_xs_ptrs;
	if (B * T == 0)
		return DG_OK;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, p->fn, &k);
	if (!st)
		st = grad_xs_tile(p, T, &k);
	if (st)
		return st;
	const dg_tile *t = &dg_kernel_spec(k)->tile;
	bool per_head;
	int64_t n = gemm_cols(spec, T, &per_head);
	int64_t gy = dg__op_cdiv(T, t->bm), gz = per_head ? B * spec->heads : B;
	/* the persistent form (templates/attention_tma.lua M.persistent_ok: a
	 * warp-specialized kernel of 4 stages, BN up to 128; rope=pre or
	 * load, the same maps) walks the tiles itself: a grid of the blocks
	 * the SMs hold at once (one: its ring and staged tile take most of an
	 * SM's shared memory), none past the tiles */
	const bool tma = dg__tma_abi(k), persistent = tma && dg__attn_persistent_tile(t);
	int64_t gx = dg__op_cdiv(n, t->bn);
	if (persistent) {
		const int sm_count = dg__dev_info(p->dev)->sm_count;
		const int64_t sms = sm_count > 0 ? sm_count : 1, tiles = gx * gy * gz;
		gx = tiles < sms ? tiles : sms;
		gy = gz = 1;
	}
	if (gy > 65535 || gz > 65535)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG,
				    "%s: T = %lld and B = %lld need a grid of %lld x %lld blocks (y, z); at most 65535 each",
				    p->fn, (long long)T, (long long)B, (long long)gy, (long long)gz);
	/* a kernel made for a cluster (templates/attention_tma.lua M.cluster)
	 * gets a grid of whole clusters: its blocks past T or L load zeros
	 * (TMA fills past the edges) and store nothing, and its map of A has
	 * boxes of the rows each block loads for its cluster row */
	dg_kernel_info ki;
	if ((st = dg_kernel_info_get(k, &ki)))
		return st;
	gx = dg__op_cdiv(gx, ki.cluster[0]) * ki.cluster[0];
	gy = dg__op_cdiv(gy, ki.cluster[1]) * ki.cluster[1];
	if (gy > 65535)
		return dg__dev_fail(p->dev, DG_ERR_INVALID_ARG, "%s: T = %lld needs %lld row blocks; at most 65535",
				    p->fn, (long long)T, (long long)gy);
	dg_launch l;
	memset(&l, 0, sizeof(l));
	l.grid[0] = (unsigned)gx;
	l.grid[1] = (unsigned)gy;
	l.grid[2] = (unsigned)gz;
	l.block[0] = (unsigned)(t->wm * t->wn * 32);
	l.block[1] = l.block[2] = 1;
	if (tma) {
		l.block[0] += 128;
		p->iv[IV_B] = B;
		p->iv[IV_T] = T;
		p->iv[IV_BM] = t->bm / ki.cluster[0];
		p->iv[IV_BN] = t->bn;
		p->iv[IV_TEPI] = grad_xs_tma_epi(k);
		/* the maps of the call prepared with, made once here: a driver
		 * that cannot make them refuses the prepare, not a launch */
		dg__tmap maps[DG__PREP_TMAPS];
		if ((st = gemm_tmaps(p, c, maps)))
			return st;
		p->tmaps = gemm_tmaps;
	}
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	const dg_op_info *row = dg_op_info_of(spec->op);
	for (int i = 0; i < row->n_args; i++)
		if (dg_op_arg_used(spec, i)) /* else another epilogue's: not in this kernel's ABI */
			dg__arg_data(p, L, i);
	dg__arg_i32(p, L, B);
	dg__arg_i32(p, L, T);
	if (tma)
		for (int i = 0; i < (p->iv[IV_TEPI] ? 5 : 2); i++)
			dg__arg_tmap(p, L, i);
	return DG_OK;
}

/* ---- attention_step (templates/attention_step.lua) -------------------------------- */

/* The op's six tensors in the table's order, then (int B): a token a row
 * (T 1) is dg_attention_step, grid (D/8, H, B); a window of T > 1 is
 * dg_attention_window, (int B, int T), grid (D/4, H, B) and its entry's
 * shared memory. */
dg_status dg__prep_attention_step(dg_prepared *p, const dg__op_call *c)
{
	(void)c;
	const dg_spec *spec = &p->spec;
	int64_t B = p->shape.b, T = p->shape.t;
	if (B == 0 || T == 0)
		return DG_OK;
	const bool window = T > 1;
	dg_kernel *k;
	dg_status st = dg_kernel_get(p->dev, spec, window ? "dg_attention_window" : "dg_attention_step", &k);
	if (st)
		return st;
	int nt = dg_kernel_spec(k)->tile.threads;
	dg_launch l = { { (unsigned)(spec->embd / (window ? 4 : 8)), (unsigned)spec->heads, (unsigned)B },
			{ (unsigned)nt, 1, 1 }, 0 };
	dg__prep_launch *L = dg__prep_add(p, k, &l, &st);
	if (!L)
		return st;
	const dg_op_info *row = dg_op_info_of(spec->op);
	for (int i = 0; i < row->n_args; i++)
		dg__arg_data(p, L, i);
	dg__arg_i32(p, L, B);
	if (window)
		dg__arg_i32(p, L, T);
	return DG_OK;
}

/* ---- the GEMMs' entries ------------------------------------------------------------ */

dg_status dg__prep_attention_scores(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c);
}

dg_status dg__prep_attention_out(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c);
}

dg_status dg__prep_attention_grad_scores(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c);
}

dg_status dg__prep_attention_grad_v(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c);
}

dg_status dg__prep_attention_grad_xs(dg_prepared *p, const dg__op_call *c)
{
	return gemm_prep(p, c);
}

/* ---- the chains ------------------------------------------------------------------- */

/* spec as op `op` with an auto tile (the other fields kept). */
static dg_spec step_spec(const dg_spec *spec, dg_op op)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.heads = spec->heads;
	s.embd = spec->embd;
	s.latent = spec->latent;
	s.act = spec->act;
	s.arch = spec->arch;
	s.arch_specific = spec->arch_specific;
	s.rope_pre = spec->rope_pre; /* kept by the ops that take it */
	dg_spec_normalize(&s);
	return s;
}

static bool is_attention_gemm(const dg_spec *spec)
{
	return spec && (spec->op == DG_OP_ATTENTION_SCORES || spec->op == DG_OP_ATTENTION_OUT ||
			spec->op == DG_OP_ATTENTION_GRAD_SCORES || spec->op == DG_OP_ATTENTION_GRAD_V ||
			spec->op == DG_OP_ATTENTION_GRAD_XS);
}

/* rope=pre: the chains' qr = RoPE(xs), (B,H,T,L) act at ws + off. */
static size_t qr_bytes(const dg_spec *spec, const dg_tensor *xs)
{
	return spec->rope_pre && xs ? dg__op_align256(dg_tensor_bytes(xs)) : 0;
}

static dg_tensor qr_tensor(const dg_tensor *xs, dg_dptr at)
{
	dg_tensor t = dg_tensor_make("qr (ws)", xs->fmt, at, xs->ndim, xs->shape);
	return t;
}

/* qr = RoPE(xs) into qr (rope_fwd with spec's shape and act) through x;
 * x NULL: only its check, into msg. */
static dg_status rope_into(dg__op_exec *x, const dg_spec *spec, const dg_tensor *xs,
			   const dg_tensor *rope, const dg_tensor *qr, char *msg, size_t size)
{
	dg_spec rs = step_spec(spec, DG_OP_ROPE_FWD);
	dg_rope_fwd_args ra = { .x = xs, .rope = rope, .out = qr };
	return x ? dg__exec_args(x, &rs, &ra) : dg_rope_fwd_check(&rs, &ra, msg, size);
}

/* Whether a chain through x checks its calls before it launches any: an
 * eager or a preparing run; a prepared one compares each op's tensors. */
static bool checks_first(const dg__op_exec *x)
{
	return !x->plans || x->preparing;
}

/* ---- the chunked form (dragon/ops.h, "The chunked form") ---------------------------- */

static bool same_layout(const dg_tensor *a, const dg_tensor *b);

/* Where the chunked chains keep their parts in the workspace, 256-byte
 * aligned, in this order: qr (when made), the values a head each (vr);
 * the backward's gradient in bf16 (gb), the chunks' C (cc), the per-head
 * value gradients f32 (gv); the states S (and the backward's R). */
typedef struct chunk_ws {
	size_t qr, vr, gb, cc, gv, s, r, total;
} chunk_ws;

static void chunk_layout(const dg_spec *spec, int64_t B, int64_t T, int chunk, bool bwd, bool make_qr,
			 chunk_ws *w)
{
	const size_t bht = (size_t)B * (size_t)spec->heads * (size_t)T;
	const size_t states = (size_t)B * (size_t)spec->heads * (size_t)(2 * (int64_t)spec->latent * (T / chunk)) *
			      (size_t)spec->embd * 2;
	size_t at = 0;
	memset(w, 0, sizeof(*w));
	w->qr = at;
	at += make_qr ? dg__op_align256(bht * (size_t)spec->latent * 2) : 0;
	w->vr = at;
	at += dg__op_align256(bht * (size_t)spec->embd * 2);
	if (bwd) {
		w->gb = at;
		at += dg__op_align256(bht * (size_t)spec->embd * 2);
		w->cc = at;
		at += dg__op_align256(bht * (size_t)chunk * 2);
		w->gv = at;
		at += dg__op_align256(bht * (size_t)spec->embd * 4);
	}
	w->s = at;
	at += dg__op_align256(states);
	if (bwd) {
		w->r = at;
		at += dg__op_align256(states);
	}
	w->total = at;
}

/* What the chunked form needs of the chains' spec and call: refused by
 * name before anything runs. */
static dg_status chunk_ok(dg_device *dev, const char *fn, const dg_spec *spec, int chunk, const dg_tensor *xs)
{
	if (chunk < 64 || chunk % 64)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: chunk=%d: a multiple of 64 (0: the quadratic form)", fn,
				    chunk);
	if (!spec->rope_pre || spec->arch != 90 || !spec->arch_specific || spec->act != DG_FMT_BF16)
		return dg__dev_fail(dev, DG_ERR_INVALID_SPEC,
				    "%s: chunk=%d: the chunked form runs on sm_90a with rope=pre and act=bf16 (arch=sm_90a;rope=pre;act=bf16)",
				    fn, chunk);
	if (!xs || xs->ndim != 4)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: xs: (B, H, T, N) needed", fn);
	if (xs->shape[2] % chunk)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: T = %lld: the chunked form needs T a multiple of the chunk (chunk=%d)", fn,
				    (long long)xs->shape[2], chunk);
	return DG_OK;
}

/* spec as chunked op `op` with chunk C (an auto tile); quadratic op `op`
 * folded: one head, the chunks as sequences. */
static dg_spec chunk_spec(const dg_spec *spec, dg_op op, int chunk)
{
	dg_spec s = step_spec(spec, op);
	s.chunk = chunk;
	dg_spec_normalize(&s);
	return s;
}

static dg_spec folded_spec(const dg_spec *spec, dg_op op)
{
	dg_spec s = step_spec(spec, op);
	s.heads = 1;
	dg_spec_normalize(&s);
	return s;
}

/* (B, H, T, X) at p as the B·H·T/C chunks of one head: (B·H·T/C, 1, C, X). */
static dg_tensor fold(const char *name, dg_fmt f, dg_dptr p, int64_t B, int64_t H, int64_t T, int64_t C,
		      int64_t X)
{
	return dg_tensor_4d(name, f, p, B * H * (T / C), 1, C, X);
}

static dg_status fwd_chunked(dg__op_exec *x, const dg_spec *spec, const dg_attention_fwd_args *a)
{
	static const char fn[] = "dg_attention_fwd";
	dg_device *dev = x->dev;
	const int C = a->chunk;
	dg_status st = chunk_ok(dev, fn, spec, C, a->xs);
	if (st)
		return st;
	if (!a->v || !a->rope || !a->scores || !a->out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: v, rope, scores and out are needed", fn);
	const int64_t B = a->xs->shape[0], H = spec->heads, T = a->xs->shape[2], N = spec->latent,
		      D = spec->embd;
	chunk_ws w;
	chunk_layout(spec, B, T, C, false, !a->qr, &w);
	if (!x->preparing && (st = dg__op_workspace_ok(dev, fn, &a->ws, w.total)))
		return st;
	const dg_dptr ws = a->ws.ptr;
	dg_tensor qr = a->qr ? *a->qr : qr_tensor(a->xs, ws + w.qr);
	dg_tensor vr = dg_tensor_4d("vr (ws)", DG_FMT_BF16, ws + w.vr, B, H, T, D);
	dg_tensor states = dg_tensor_4d("states (ws)", DG_FMT_BF16, ws + w.s, B, H, 2 * N * (T / C), D);
	dg_tensor qf = fold("qr (chunks)", DG_FMT_BF16, qr.data, B, H, T, C, N);
	dg_tensor sf = fold("scores (chunks)", a->scores->fmt, a->scores->data, B, H, T, C, C);
	dg_tensor vf = fold("vr (chunks)", DG_FMT_BF16, vr.data, B, H, T, C, D);
	dg_tensor of = fold("out (chunks)", a->out->fmt, a->out->data, B, H, T, C, D);
	dg_tensor rc = dg_tensor_2d("rope (a chunk's rows)", DG_FMT_F32, a->rope->data, C, N);
	dg_spec sv = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_VREP, C);
	dg_spec s1 = folded_spec(spec, DG_OP_ATTENTION_SCORES), s2 = folded_spec(spec, DG_OP_ATTENTION_OUT);
	dg_spec ss = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_STATE, C);
	dg_spec so = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_OUT, C);
	ss.in_heads = 1;
	so.out = a->out->fmt == DG_FMT_F32 ? DG_FMT_F32 : DG_FMT_BF16;
	dg_spec_normalize(&ss);
	dg_spec_normalize(&so);
	dg_attention_chunk_vrep_args va = { .v = a->v, .vr = &vr };
	dg_attention_scores_args sa = { .xs = &qf, .rope = &rc, .scores = &sf };
	dg_attention_out_args oa = { .scores = &sf, .v = &vf, .out = &of };
	dg_attention_chunk_state_args ta = { .qr = &qr, .src = a->v, .states = &states };
	dg_attention_chunk_out_args ca = { .qr = &qr, .states = &states, .out = a->out };
	char msg[512];
	/* RoPE(xs) is made here either way: into the workspace, or into the
	 * caller's qr, which the backward then reads instead of making it (as
	 * the quadratic form's forward does) */
	if (checks_first(x)) {
		st = rope_into(NULL, spec, a->xs, a->rope, &qr, msg, sizeof(msg));
		if (!st && a->scores->ndim == 4 && (a->scores->shape[2] != T || a->scores->shape[3] != C))
			snprintf(msg, sizeof(msg), "%s: scores: (B, H, T, C) = (%lld, %lld, %lld, %d) for the chunked form",
				 fn, (long long)B, (long long)H, (long long)T, C),
				st = DG_ERR_INVALID_ARG;
		if (!st)
			st = dg_attention_chunk_vrep_check(&sv, &va, msg, sizeof(msg));
		if (!st)
			st = dg_attention_scores_check(&s1, &sa, msg, sizeof(msg));
		if (!st)
			st = dg_attention_out_check(&s2, &oa, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_state_check(&ss, &ta, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_out_check(&so, &ca, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(dev, st, msg);
	}
	st = rope_into(x, spec, a->xs, a->rope, &qr, NULL, 0);
	if (!st)
		st = dg__exec_args(x, &sv, &va);
	if (!st)
		st = dg__exec_args(x, &s1, &sa);
	if (!st)
		st = dg__exec_args(x, &s2, &oa);
	if (!st)
		st = dg__exec_args(x, &ss, &ta);
	return st ? st : dg__exec_args(x, &so, &ca);
}

static dg_status bwd_chunked(dg__op_exec *x, const dg_spec *spec, const dg_attention_bwd_args *a)
{
	static const char fn[] = "dg_attention_bwd";
	dg_device *dev = x->dev;
	const int C = a->chunk;
	dg_status st = chunk_ok(dev, fn, spec, C, a->xs);
	if (st)
		return st;
	if (!a->dxs || a->grad_xs)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: chunk=%d: the chunked backward adds into dxs (masked by xs > 0); give dxs, not grad_xs",
				    fn, C);
	if (!a->grad || !a->v || !a->rope || !a->scores || !a->grad_v)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: grad, v, rope, scores and grad_v are needed", fn);
	const int64_t B = a->xs->shape[0], H = spec->heads, T = a->xs->shape[2], N = spec->latent,
		      D = spec->embd;
	chunk_ws w;
	chunk_layout(spec, B, T, C, true, !a->qr, &w);
	if (!x->preparing && (st = dg__op_workspace_ok(dev, fn, &a->ws, w.total)))
		return st;
	const dg_dptr ws = a->ws.ptr;
	const int64_t S = 2 * N * (T / C);
	dg_tensor qr = a->qr ? *a->qr : qr_tensor(a->xs, ws + w.qr);
	dg_tensor vr = dg_tensor_4d("vr (ws)", DG_FMT_BF16, ws + w.vr, B, H, T, D);
	dg_tensor gb = dg_tensor_4d("grad bf16 (ws)", DG_FMT_BF16, ws + w.gb, B, H, T, D);
	dg_tensor cc = dg_tensor_4d("grad_scores (ws)", DG_FMT_BF16, ws + w.cc, B, H, T, C);
	dg_tensor gv = dg_tensor_4d("grad_v per head (ws)", DG_FMT_F32, ws + w.gv, B, H, T, D);
	dg_tensor sst = dg_tensor_4d("states (ws)", DG_FMT_BF16, ws + w.s, B, H, S, D);
	dg_tensor rst = dg_tensor_4d("rstates (ws)", DG_FMT_BF16, ws + w.r, B, H, S, D);
	dg_tensor gf = fold("grad (chunks)", a->grad->fmt, a->grad->data, B, H, T, C, D);
	dg_tensor vf = fold("vr (chunks)", DG_FMT_BF16, vr.data, B, H, T, C, D);
	dg_tensor cf = fold("grad_scores (chunks)", DG_FMT_BF16, cc.data, B, H, T, C, C);
	dg_tensor sf = fold("scores (chunks)", a->scores->fmt, a->scores->data, B, H, T, C, C);
	dg_tensor gvf = fold("grad_v per head (chunks)", DG_FMT_F32, gv.data, B, H, T, C, D);
	dg_spec sc = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_CAST, C), sv = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_VREP, C);
	dg_spec s1 = folded_spec(spec, DG_OP_ATTENTION_GRAD_SCORES), s2 = folded_spec(spec, DG_OP_ATTENTION_GRAD_V);
	dg_spec ss = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_STATE, C), sr = ss;
	dg_spec so = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_OUT, C), sh = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_HSUM, C);
	dg_spec sq = chunk_spec(spec, DG_OP_ATTENTION_CHUNK_DQ, C);
	ss.in_heads = 1;
	sr.in_heads = spec->heads;
	so.out = DG_FMT_F32;
	sq.out = a->dxs->fmt == DG_FMT_BF16 ? DG_FMT_BF16 : DG_FMT_F32;
	dg_spec_normalize(&ss);
	dg_spec_normalize(&sr);
	dg_spec_normalize(&so);
	dg_spec_normalize(&sq);
	dg_attention_chunk_cast_args ka = { .grad = a->grad, .out = &gb };
	dg_attention_chunk_vrep_args va = { .v = a->v, .vr = &vr };
	dg_attention_grad_scores_args ga = { .grad = &gf, .v = &vf, .grad_scores = &cf };
	dg_attention_grad_v_args gva = { .scores = &sf, .grad = &gf, .grad_v = &gvf };
	dg_attention_chunk_state_args ta = { .qr = &qr, .src = a->v, .states = &sst };
	dg_attention_chunk_state_args ra = { .qr = &qr, .src = &gb, .states = &rst, .backward = true };
	dg_attention_chunk_out_args oa = { .qr = &qr, .states = &rst, .out = &gv, .backward = true };
	dg_attention_chunk_hsum_args ha = { .grad = &gv, .grad_v = a->grad_v };
	dg_attention_chunk_dq_args qa = { .grad_scores = &cc, .qr = &qr, .grad = &gb, .v = a->v, .states = &sst,
					  .rstates = &rst, .rope = a->rope, .dxs = a->dxs, .mask_xs = a->xs };
	char msg[512];
	if (checks_first(x)) {
		if (!a->qr)
			st = rope_into(NULL, spec, a->xs, a->rope, &qr, msg, sizeof(msg));
		else if (!same_layout(a->qr, a->xs))
			snprintf(msg, sizeof(msg), "qr: not of xs's shape and format (RoPE(xs), as the forward wrote it)"),
				st = DG_ERR_INVALID_ARG;
		if (!st && (a->scores->ndim != 4 || a->scores->shape[2] != T || a->scores->shape[3] != C))
			snprintf(msg, sizeof(msg), "%s: scores: (B, H, T, C) = (%lld, %lld, %lld, %d) for the chunked form",
				 fn, (long long)B, (long long)H, (long long)T, C),
				st = DG_ERR_INVALID_ARG;
		if (!st)
			st = dg_attention_chunk_cast_check(&sc, &ka, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_vrep_check(&sv, &va, msg, sizeof(msg));
		if (!st)
			st = dg_attention_grad_scores_check(&s1, &ga, msg, sizeof(msg));
		if (!st)
			st = dg_attention_grad_v_check(&s2, &gva, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_state_check(&ss, &ta, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_state_check(&sr, &ra, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_out_check(&so, &oa, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_hsum_check(&sh, &ha, msg, sizeof(msg));
		if (!st)
			st = dg_attention_chunk_dq_check(&sq, &qa, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(dev, st, msg);
	}
	if (!a->qr)
		st = rope_into(x, spec, a->xs, a->rope, &qr, NULL, 0);
	const struct {
		const dg_spec *s;
		const void *a;
	} steps[] = { { &sc, &ka }, { &sv, &va }, { &s1, &ga }, { &s2, &gva }, { &ss, &ta },
		      { &sr, &ra }, { &so, &oa }, { &sh, &ha }, { &sq, &qa } };
	for (size_t i = 0; !st && i < sizeof(steps) / sizeof(steps[0]); i++)
		st = dg__exec_args(x, steps[i].s, steps[i].a);
	return st;
}

dg_status dg_attention_fwd_workspace(const dg_spec *spec, const dg_attention_fwd_args *a,
				     size_t *bytes)
{
	if (!bytes)
		return DG_ERR_INVALID_ARG;
	*bytes = 0;
	if (!is_attention_gemm(spec) || !a || (spec->rope_pre && !a->xs))
		return DG_ERR_INVALID_ARG;
	if (a->chunk) {
		if (!a->xs || a->xs->ndim != 4 || a->chunk < 1)
			return DG_ERR_INVALID_ARG;
		chunk_ws w;
		chunk_layout(spec, a->xs->shape[0], a->xs->shape[2], a->chunk, false, !a->qr, &w);
		*bytes = w.total;
		return DG_OK;
	}
	*bytes = a->qr ? 0 : qr_bytes(spec, a->xs);
	return DG_OK;
}

/* Whether a and b have one format and shape (strides: the op checks). */
static bool same_layout(const dg_tensor *a, const dg_tensor *b)
{
	if (!a || !b || a->fmt != b->fmt || a->ndim != b->ndim)
		return false;
	for (int i = 0; i < a->ndim; i++)
		if (a->shape[i] != b->shape[i])
			return false;
	return true;
}

/* A chain's qr given with rope=load, which has none: refused by name. */
static dg_status qr_given_ok(dg_device *dev, const char *fn, const dg_spec *spec, const dg_tensor *qr)
{
	if (qr && !spec->rope_pre)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "%s: qr: given, but the spec's rope is load (RoPE on the GEMMs' loads: no qr); pass NULL or take rope=pre",
				    fn);
	return DG_OK;
}

dg_status dg__attention_fwd_exec(dg__op_exec *x, const dg_spec *spec, const dg_attention_fwd_args *a)
{
	dg_device *dev = x->dev;
	if (!dev && !x->sink) /* a listing of specs needs none */
		return DG_ERR_INVALID_ARG;
	if (!is_attention_gemm(spec) || !a)
		return dg__dev_fail(dev, !a ? DG_ERR_INVALID_ARG : DG_ERR_INVALID_SPEC,
				    "dg_attention_fwd: %s", !a ? "args is NULL"
							       : "spec must be an attention op's (op=attention_scores, ...)");
	if (a->chunk)
		return fwd_chunked(x, spec, a);
	dg_spec s1 = step_spec(spec, DG_OP_ATTENTION_SCORES), s2 = step_spec(spec, DG_OP_ATTENTION_OUT);
	dg_tensor qr;
	const dg_tensor *xs = a->xs;
	dg_status st = qr_given_ok(dev, "dg_attention_fwd", spec, a->qr);
	if (st)
		return st;
	if (spec->rope_pre) {
		if (!a->xs)
			return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_attention_fwd: xs is NULL");
		st = x->preparing || a->qr ? DG_OK
					   : dg__op_workspace_ok(dev, "dg_attention_fwd", &a->ws,
								 qr_bytes(spec, a->xs));
		if (st)
			return st;
		if (a->qr)
			xs = a->qr;
		else {
			qr = qr_tensor(a->xs, a->ws.ptr);
			xs = &qr;
		}
	}
	dg_attention_scores_args sa = { .xs = xs, .rope = a->rope, .scores = a->scores };
	dg_attention_out_args oa = { .scores = a->scores, .v = a->v, .out = a->out };
	char msg[512];
	/* all checked before anything is launched */
	/* qr_made: the projection's epi=rope wrote RoPE(xs) into qr */
	const bool made = spec->rope_pre && a->qr && a->qr_made;
	if (checks_first(x)) {
		if (spec->rope_pre && !made)
			st = rope_into(NULL, spec, a->xs, a->rope, xs, msg, sizeof(msg));
		if (!st)
			st = dg_attention_scores_check(&s1, &sa, msg, sizeof(msg));
		if (!st)
			st = dg_attention_out_check(&s2, &oa, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(dev, st, msg);
	}
	if (spec->rope_pre && !made)
		st = rope_into(x, spec, a->xs, a->rope, xs, NULL, 0);
	if (!st)
		st = dg__exec_args(x, &s1, &sa);
	return st ? st : dg__exec_args(x, &s2, &oa);
}

dg_status dg_attention_fwd(dg_device *dev, const dg_spec *spec, const dg_attention_fwd_args *a)
{
	dg__op_exec x = dg__exec_eager(dev);
	return dg__attention_fwd_exec(&x, spec, a);
}

/* C's tensor over the workspace: (B, H, T, T) act, the shape of scores. */
static dg_tensor c_tensor(const dg_spec *spec, const dg_attention_bwd_args *a)
{
	const dg_tensor *sc = a->scores;
	dg_tensor t = dg_tensor_4d("grad_scores (ws)", spec->act, a->ws.ptr, sc->shape[0], sc->shape[1],
				   sc->shape[2], sc->shape[3]);
	return t;
}

/* Whether the backward's grad_xs turns xs itself (dragon/ops.h: the
 * chain's tile names the persistent form, rope=pre, no qr given): its
 * kernel rope=load on that tile, no RoPE(xs) made. */
static bool bwd_turns(const dg_spec *spec, const dg_attention_bwd_args *a)
{
	return spec->rope_pre && spec->arch_specific && !a->qr && !a->chunk && dg__attn_persistent_tile(&spec->tile);
}

bool dg__attn_persistent_tile(const dg_tile *t)
{
	return t->stages == 4 && t->bn > 0 && t->bn <= 128 && !t->threads;
}

dg_status dg_attention_bwd_workspace(const dg_spec *spec, const dg_attention_bwd_args *a,
				     size_t *bytes)
{
	if (!bytes)
		return DG_ERR_INVALID_ARG;
	*bytes = 0;
	if (!is_attention_gemm(spec) || !a || !a->scores || a->scores->ndim != 4 ||
	    (spec->rope_pre && !a->xs))
		return DG_ERR_INVALID_ARG;
	if (a->chunk) {
		if (!a->xs || a->xs->ndim != 4 || a->chunk < 1)
			return DG_ERR_INVALID_ARG;
		chunk_ws w;
		chunk_layout(spec, a->xs->shape[0], a->xs->shape[2], a->chunk, true, !a->qr, &w);
		*bytes = w.total;
		return DG_OK;
	}
	dg_tensor t = c_tensor(spec, a);
	size_t qb = a->qr || bwd_turns(spec, a) ? 0 : qr_bytes(spec, a->xs);
	*bytes = (qb ? dg__op_align256(dg_tensor_bytes(&t)) : dg_tensor_bytes(&t)) + qb;
	return DG_OK;
}

dg_status dg__attention_bwd_exec(dg__op_exec *x, const dg_spec *spec, const dg_attention_bwd_args *a)
{
	dg_device *dev = x->dev;
	if (!dev && !x->sink) /* a listing of specs needs none */
		return DG_ERR_INVALID_ARG;
	if (!is_attention_gemm(spec) || !a || !a->scores)
		return dg__dev_fail(dev, !is_attention_gemm(spec) ? DG_ERR_INVALID_SPEC : DG_ERR_INVALID_ARG,
				    "dg_attention_bwd: %s", !is_attention_gemm(spec)
				    ? "spec must be an attention op's (op=attention_grad_xs, ...)"
				    : "args or scores is NULL");
	if (a->chunk)
		return bwd_chunked(x, spec, a);
	dg_spec s1 = step_spec(spec, DG_OP_ATTENTION_GRAD_SCORES);
	dg_spec s2 = step_spec(spec, DG_OP_ATTENTION_GRAD_V);
	dg_spec s3 = step_spec(spec, DG_OP_ATTENTION_GRAD_XS);
	if (a->grad_xs && a->dxs)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_attention_bwd: grad_xs and dxs both given; give grad_xs (written) or dxs (grad_xs added into it, masked by xs > 0)");
	/* the gradient's format is the op's out; dxs: the fused masked sum */
	const dg_tensor *gt = a->dxs ? a->dxs : a->grad_xs;
	if (a->dxs)
		s3.epi = DG_EPI_MASK;
	if (gt && (gt->fmt == DG_FMT_F32 || gt->fmt == DG_FMT_BF16))
		s3.out = gt->fmt;
	const bool turns = bwd_turns(spec, a);
	if (turns) { /* the persistent grad_xs RoPEs xs on its stages */
		s3.tile = spec->tile;
		s3.rope_pre = false;
	}
	dg_spec_normalize(&s3);
	size_t need = 0;
	dg_status st = qr_given_ok(dev, "dg_attention_bwd", spec, a->qr);
	if (st)
		return st;
	st = dg_attention_bwd_workspace(spec, a, &need);
	if (st)
		return dg__dev_fail(dev, st, "dg_attention_bwd: scores must be (B, H, T, T)%s",
				    spec->rope_pre ? " and xs given" : "");
	st = x->preparing ? DG_OK : dg__op_workspace_ok(dev, "dg_attention_bwd", &a->ws, need);
	if (st)
		return st;
	dg_tensor ct = c_tensor(spec, a), qr;
	const dg_tensor *xs = a->xs;
	/* rope=pre: RoPE(xs) given (the forward's), or made after C, or
	 * (turns) made by grad_xs on its stages */
	const bool make_qr = spec->rope_pre && !a->qr && !turns;
	if (a->qr)
		xs = a->qr;
	else if (make_qr) {
		qr = qr_tensor(a->xs, a->ws.ptr + dg__op_align256(dg_tensor_bytes(&ct)));
		xs = &qr;
	}
	dg_attention_grad_scores_args ga = { .grad = a->grad, .v = a->v, .grad_scores = &ct };
	dg_attention_grad_v_args va = { .scores = a->scores, .grad = a->grad, .grad_v = a->grad_v };
	dg_attention_grad_xs_args xa = { .grad_scores = &ct, .xs = xs, .rope = a->rope,
					 .grad_xs = a->grad_xs, .dxs = a->dxs,
					 .mask_xs = a->dxs ? a->xs : NULL };
	char msg[512];
	if (checks_first(x)) {
		if (make_qr)
			st = rope_into(NULL, spec, a->xs, a->rope, xs, msg, sizeof(msg));
		else if (a->qr && !same_layout(a->qr, a->xs))
			snprintf(msg, sizeof(msg), "qr: not of xs's shape and format (RoPE(xs), as the forward wrote it)"),
				st = DG_ERR_INVALID_ARG;
		if (!st)
			st = dg_attention_grad_scores_check(&s1, &ga, msg, sizeof(msg));
		if (!st)
			st = dg_attention_grad_v_check(&s2, &va, msg, sizeof(msg));
		if (!st)
			st = dg_attention_grad_xs_check(&s3, &xa, msg, sizeof(msg));
		if (st)
			return dg__dev_fail_msg(dev, st, msg);
	}
	if (make_qr)
		st = rope_into(x, spec, a->xs, a->rope, xs, NULL, 0);
	if (!st)
		st = dg__exec_args(x, &s1, &ga);
	if (!st)
		st = dg__exec_args(x, &s2, &va);
	if (!st)
		st = dg__exec_args(x, &s3, &xa);
	return st;
}

dg_status dg_attention_bwd(dg_device *dev, const dg_spec *spec, const dg_attention_bwd_args *a)
{
	dg__op_exec x = dg__exec_eager(dev);
	return dg__attention_bwd_exec(&x, spec, a);
}
