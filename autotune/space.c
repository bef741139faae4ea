/*
 * Candidate spaces: the tiles a sweep tries for a spec, the resource rule
 * that rejects a compiled candidate before it is timed, and the BDH set
 * `dragon-gen tune` tunes by default.
 *
 * The grids are small on purpose: a sweep compiles every candidate (NVRTC
 * takes 1-3 s a kernel) and must finish in about a minute on a 16-core
 * host. Which tiles a template takes is its plan's business
 * (dg_codegen_plan: every template owns its rules, and the arch-specific
 * target may enable more): the grid here only proposes, the plan
 * disposes, so a rule change there needs no change here.
 *
 *   GEMM ops (the default tile has a block tile):
 *     BMxBN/WMxWN  64x64/2x2, 64x128/2x2, 64x128/2x4, 128x64/2x2,
 *                  128x64/4x2, 128x128/2x2, 128x128/2x4, 128x128/4x2,
 *                  128x256/2x4, 128x256/4x4, 256x128/4x2, 256x128/4x4
 *     BK           the default's and twice it (integer tensor-core paths
 *                  default to 64, the others to 32 or less)
 *     stages       the default's and half of it (at least 1)
 *   warpgroup tiles (sm_90a target only, warpgroup_grid): BM 64, 128,
 *     256 with WM = BM/16, WN = 1; BN 64, 128, 256; BK the default's, 64,
 *     128 (lowrank's resident tiles, stages 2: the default's; its
 *     K-streaming ones take them all); stages 1, 2, 3, 4, 6, 8 (the plans
 *     keep what their paths take)
 *   element-wise ops: t64, t128, t256, t512, t1024.
 * 12·2·2 = 48 GEMM tiles (fewer once validated) plus the default, on each
 * target, and on sm_90a the warpgroup tiles that apply: about 80
 * candidates for the projection, 120 for the decoder.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/sweep_int.h"

static const struct {
	int bm, bn, wm, wn;
} gemm_blocks[] = {
	{ 64, 64, 2, 2 },    { 64, 128, 2, 2 },  { 64, 128, 2, 4 },
	{ 128, 64, 2, 2 },   { 128, 64, 4, 2 },  { 128, 128, 2, 2 },
	{ 128, 128, 2, 4 },  { 128, 128, 4, 2 }, { 128, 256, 2, 4 },
	{ 128, 256, 4, 4 },  { 256, 128, 4, 2 }, { 256, 128, 4, 4 },
};

static const int elem_threads[] = { 64, 128, 256, 512, 1024 };

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct list {
	dg_codegen *cg; /* plans every candidate */
	dg_spec *v;
	size_t n, cap;
} list;

static bool same_candidate(const dg_spec *a, const dg_spec *b)
{
	return memcmp(&a->tile, &b->tile, sizeof(a->tile)) == 0 &&
	       a->arch_specific == b->arch_specific;
}

/* Appends s if its template plans it and it is new; false only when out
 * of memory. */
static bool add(list *l, const dg_spec *s)
{
	dg_plan p;
	if (dg_codegen_plan(l->cg, s, &p) != DG_OK)
		return true;
	for (size_t i = 0; i < l->n; i++)
		if (same_candidate(&l->v[i], s))
			return true;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		dg_spec *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return false;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *s;
	return true;
}

/*
 * Warpgroup tiles (the wgmma paths of sm_90a, templates/lowrank_wgmma.lua
 * and decoder.lua):
 * WM = BM/16 warps in whole warpgroups, WN = 1, BN 64..256; the K step and
 * the stages mean what each template makes of them (lowrank: 2 stages,
 * the K step unused as the whole E is resident, so it stays the
 * default's; decoder: K step 64 or 128, 3 to 8 stages, BN 256 only up to
 * BM 128 for the accumulators' registers). The plan keeps the ones that
 * apply.
 */
static bool warpgroup_grid(list *l, const dg_spec *base, const dg_tile *def)
{
	static const int bms[] = { 64, 128, 256 }, bns[] = { 64, 128, 256 };
	static const int stages[] = { 1, 2, 3, 4, 6, 8 };
	const int bks[] = { def->bk, 64, 128 };
	dg_spec s = *base;

	for (size_t m = 0; m < N_OF(bms); m++)
		for (size_t n = 0; n < N_OF(bns); n++)
			for (size_t k = 0; k < N_OF(bks); k++)
				for (size_t st = 0; st < N_OF(stages); st++) {
					if (base->op == DG_OP_LOWRANK_FWD && k > 0 && stages[st] <= 2)
						continue; /* resident: the whole E, BK unused */
					memset(&s.tile, 0, sizeof(s.tile));
					s.tile.bm = bms[m];
					s.tile.bn = bns[n];
					s.tile.bk = bks[k];
					s.tile.wm = bms[m] / 16;
					s.tile.wn = 1;
					s.tile.stages = stages[st];
					if (!add(l, &s))
						return false;
				}
	return true;
}

/* The grid of one target into l, the template's default first (none
 * when the template plans no default for it). */
static bool grid(list *l, const dg_spec *base)
{
	dg_spec s = *base;
	dg_plan p;

	memset(&s.tile, 0, sizeof(s.tile));
	if (dg_codegen_plan(l->cg, &s, &p) != DG_OK)
		return true;
	const dg_tile def = p.spec.tile;
	s.tile = def;
	if (!add(l, &s))
		return false;
	if (def.threads) {
		/* each thread count, alone and staged (t<N>/1: the ops whose
		 * kernels stage their rows in shared memory; the others' plans
		 * refuse it) */
		for (int st = 0; st < 2; st++)
			for (size_t i = 0; i < N_OF(elem_threads); i++) {
				memset(&s.tile, 0, sizeof(s.tile));
				s.tile.threads = elem_threads[i];
				s.tile.stages = st;
				if (!add(l, &s))
					return false;
			}
		return true;
	}
	if (base->arch_specific && !warpgroup_grid(l, base, &def))
		return false;
	const int bks[2] = { def.bk, def.bk * 2 };
	const int stages[2] = { def.stages, def.stages / 2 > 0 ? def.stages / 2 : 1 };
	for (size_t b = 0; b < N_OF(gemm_blocks); b++)
		for (int k = 0; k < 2; k++)
			for (int st = 0; st < 2; st++) {
				memset(&s.tile, 0, sizeof(s.tile));
				s.tile.bm = gemm_blocks[b].bm;
				s.tile.bn = gemm_blocks[b].bn;
				s.tile.wm = gemm_blocks[b].wm;
				s.tile.wn = gemm_blocks[b].wn;
				s.tile.bk = bks[k];
				s.tile.stages = stages[st];
				if (!add(l, &s))
					return false;
			}
	return true;
}

dg_status dg_tune_space(dg_codegen *cg, const dg_spec *spec, int device_sm, dg_spec **out,
			size_t *n, char *msg, size_t msg_size)
{
	char why[512];
	list port = { cg, NULL, 0, 0 }, spec_a = { cg, NULL, 0, 0 }, all = { cg, NULL, 0, 0 };
	dg_status st = DG_OK;

	if (out)
		*out = NULL;
	if (n)
		*n = 0;
	if (!cg || !spec || !out || !n) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "dg_tune_space: cg, spec, out and n must not be NULL");
		return DG_ERR_INVALID_ARG;
	}
	dg_spec base = *spec;
	memset(&base.tile, 0, sizeof(base.tile));
	dg_spec_normalize(&base);
	if (dg_spec_validate(&base, why, sizeof(why)) != DG_OK) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s", why);
		return DG_ERR_INVALID_SPEC;
	}
	if (!(dg_spec_uses(base.op) & DG_FIELD_TILE)) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "op %s takes no tile: there is nothing to tune",
				 dg_op_name(base.op));
		return DG_ERR_INVALID_SPEC;
	}
	dg_plan bp;
	if (dg_codegen_plan(cg, &base, &bp) != DG_OK) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s", dg_codegen_errmsg(cg));
		return DG_ERR_INVALID_SPEC;
	}
	if (device_sm <= 0)
		device_sm = base.arch;
	bool both = !base.arch_specific && base.arch >= 90 && base.arch == device_sm;
	bool ok = grid(base.arch_specific ? &spec_a : &port, &base);
	if (ok && both) {
		dg_spec a = base;
		a.arch_specific = true;
		ok = grid(&spec_a, &a);
	}
	/* Defaults of both targets first, then the portable grid, then the
	 * arch-specific one (so a truncated space still has both defaults). */
	if (ok && port.n)
		ok = add(&all, &port.v[0]);
	if (ok && spec_a.n)
		ok = add(&all, &spec_a.v[0]);
	for (size_t i = 1; ok && i < port.n; i++)
		ok = add(&all, &port.v[i]);
	for (size_t i = 1; ok && i < spec_a.n; i++)
		ok = add(&all, &spec_a.v[i]);
	if (!ok) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "out of memory listing candidates");
		st = DG_ERR_NOMEM;
		free(all.v);
		all.v = NULL;
		all.n = 0;
	}
	free(port.v);
	free(spec_a.v);
	if (all.n > DG_TUNE_MAX_CANDIDATES)
		all.n = DG_TUNE_MAX_CANDIDATES;
	*out = all.v;
	*n = all.n;
	return st;
}

bool dg_tune_fits(const dg_tune_resources *r, const dg_tune_limits *lim,
		  char *why, size_t why_size)
{
	char dummy[1];

	if (!why || !why_size) {
		why = dummy;
		why_size = sizeof(dummy);
	}
	why[0] = '\0';
	if (!r || !lim) {
		snprintf(why, why_size, "no resources to check");
		return false;
	}
	if (r->threads > lim->max_threads) {
		snprintf(why, why_size, "%d threads a block; the device runs at most %d",
			 r->threads, lim->max_threads);
		return false;
	}
	if (r->max_threads > 0 && r->threads > r->max_threads) {
		snprintf(why, why_size,
			 "%d threads a block, but with %d registers a thread the compiled kernel runs at most %d",
			 r->threads, r->regs, r->max_threads);
		return false;
	}
	if (lim->regs_per_block > 0 &&
	    (long)r->regs * r->threads > (long)lim->regs_per_block) {
		snprintf(why, why_size,
			 "%d registers a thread x %d threads = %ld registers a block, more than the %d a block has",
			 r->regs, r->threads, (long)r->regs * r->threads, lim->regs_per_block);
		return false;
	}
	if ((long)r->static_smem + r->dyn_smem > (long)lim->smem_optin) {
		snprintf(why, why_size,
			 "%d bytes of static + %d of dynamic shared memory, more than the %d a block may opt in to",
			 r->static_smem, r->dyn_smem, lim->smem_optin);
		return false;
	}
	return true;
}

/* The BDH set, in the order a training step runs the ops (tune.h). */
static const char *const bdh_set[] = {
	"op=lowrank_fwd;weight=ternary;act=int8;out=int8;relu=0",
	"op=lowrank_fwd;weight=ternary;act=int8;out=bf16;relu=0",
	"op=decoder_fwd;weight=int8;act=int8;out=bf16",
	"op=decoder_fwd;weight=ternary;act=int8;out=bf16",
	"op=relu_mask;weight=ternary;act=int8;relu=0",
	"op=decoder_grad_input;weight=ternary",
	"op=decoder_grad_weight;act=int8",
	"op=lowrank_grad_input;weight=ternary",
	"op=lowrank_grad_weight;act=int8",
	"op=quantize_act;src=f32;act=int8",
	"op=quantize_weight;src=f32;weight=ternary",
	"op=pack_ternary",
	"op=pack_i8x4",
};

size_t dg_tune_bdh_set(dg_spec *out, size_t max)
{
	size_t k = 0;

	for (size_t i = 0; i < N_OF(bdh_set); i++) {
		dg_spec s;
		/* Defaults are H=4, D=256, N=8192, sm_90 (dg_spec_init); a
		 * text that stops parsing is a defect the tests catch. */
		if (dg_spec_parse(bdh_set[i], &s, NULL, 0) != DG_OK)
			continue;
		if (out && k < max)
			out[k] = s;
		k++;
	}
	return k;
}
