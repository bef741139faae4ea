/*
 * The template's plan is the one owner of a tile's rules (templates/: the
 * op's module and tiles.lua): a sweep of random tiles over every op holds
 * plan and render to the same answer. For each sample (a spec
 * dg_spec_validate takes; a random tile BMxBNxBK/WMxWN/S from plausible
 * ranges, powers of two and some not, warpgroup shapes BM = 16·WM,
 * WN = 1, an auto tile now and then; t<N> for the element-wise ops; every
 * weight × act × out (× src) the op takes, relu none / 0, in_heads 1 / H,
 * sm_80 / sm_90 / sm_90a, small and BDH shapes):
 *   - dg_codegen_plan succeeds exactly when dg_codegen_render does, and a
 *     refusal of either is the same status and message;
 *   - the rendered source's launch info (dg_source entries, block_threads,
 *     dyn_smem), program name and canonical text are the plan's, and each
 *     entry is defined in the text;
 *   - the plan's resolved spec plans again to the same kernel.
 * Each distinct planned kernel is rendered once (the same canonical spec
 * renders the same source). Then NVRTC compiles a deterministic sample of
 * planned specs, the tile of each op and path that presses hardest on the
 * registers or shared memory, which catches what a plan let through that
 * the compiler refuses (static shared memory, registers).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/fnv.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"
#include "dragon/rng.h"
#include "dragon/spec.h"
#include "helpers.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- sampling ---------------------------------------------------------------- */

static int pick(dg_rng *r, const int *v, size_t n)
{
	return v[dg_rng_int(r, 0, (int)n - 1)];
}

/* The i-th set bit of mask (i taken modulo their count). */
static dg_fmt nth_fmt(unsigned mask, unsigned i)
{
	int n = __builtin_popcount(mask);
	unsigned k = n ? i % (unsigned)n : 0;
	for (int f = 0; f < DG_FMT__COUNT; f++)
		if ((mask & DG_FMT_BIT(f)) && k-- == 0)
			return (dg_fmt)f;
	return DG_FMT_F32;
}

static int popc(unsigned m)
{
	return m ? __builtin_popcount(m) : 1;
}

static void random_gemm_tile(dg_rng *r, dg_tile *t)
{
	static const int p2[] = { 16, 32, 64, 128, 256 }, odd[] = { 24, 48, 80, 96, 192, 320 };
	static const int bk2[] = { 8, 16, 32, 64, 128, 256 }, bko[] = { 4, 12, 24, 48, 96 };
	static const int w2[] = { 1, 2, 4, 8 }, wo[] = { 3, 6, 16 };
	static const int wg_bm[] = { 64, 128, 256 }, wg_bn[] = { 64, 128, 256 };
	static const int wg_bk[] = { 32, 64, 128 }, wg_s[] = { 1, 2, 3, 4, 6, 8 };

	memset(t, 0, sizeof(*t));
	int kind = dg_rng_int(r, 0, 99);
	if (kind < 4)
		return; /* auto */
	if (kind < 30) { /* a warpgroup shape */
		t->bm = pick(r, wg_bm, N_OF(wg_bm));
		t->wm = t->bm / 16;
		t->wn = 1;
		t->bn = pick(r, wg_bn, N_OF(wg_bn));
		t->bk = pick(r, wg_bk, N_OF(wg_bk));
		t->stages = pick(r, wg_s, N_OF(wg_s));
		return;
	}
	bool odd_ok = kind >= 90; /* one in ten: values a template should refuse */
	t->bm = odd_ok && dg_rng_int(r, 0, 1) ? pick(r, odd, N_OF(odd)) : pick(r, p2, N_OF(p2));
	t->bn = odd_ok && dg_rng_int(r, 0, 1) ? pick(r, odd, N_OF(odd)) : pick(r, p2, N_OF(p2));
	t->bk = odd_ok && dg_rng_int(r, 0, 1) ? pick(r, bko, N_OF(bko)) : pick(r, bk2, N_OF(bk2));
	t->wm = odd_ok && dg_rng_int(r, 0, 3) == 0 ? pick(r, wo, N_OF(wo)) : pick(r, w2, N_OF(w2));
	t->wn = odd_ok && dg_rng_int(r, 0, 3) == 0 ? pick(r, wo, N_OF(wo)) : pick(r, w2, N_OF(w2));
	t->stages = odd_ok && dg_rng_int(r, 0, 3) == 0 ? dg_rng_int(r, 5, 9) : dg_rng_int(r, 1, 4);
}

/* Sample i of op: formats cycle through every combination the op takes
 * (i indexes them), the rest is drawn from r. */
static void sample(dg_rng *r, dg_op op, unsigned i, dg_spec *s)
{
	/* 48 and 100 do not fill the words of every format: some invalid specs */
	static const int heads[] = { 1, 2, 4 }, embds[] = { 32, 48, 64, 96, 128, 256, 512 };
	static const int latents[] = { 32, 64, 96, 100, 256, 1024, 8192 };
	static const int threads[] = { 32, 64, 96, 128, 256, 512, 768, 1024 }, bad_threads[] = { 16, 48, 100,
												  2048 };
	const dg_op_info *row = dg_op_info_of(op);

	dg_spec_init(s, op);
	unsigned nw = (unsigned)popc(row->weight_fmts), na = (unsigned)popc(row->act_fmts);
	unsigned no = (unsigned)popc(row->out_fmts);
	if (row->weight_fmts)
		s->weight = nth_fmt(row->weight_fmts, i);
	if (row->act_fmts)
		s->act = nth_fmt(row->act_fmts, i / nw);
	if (row->out_fmts)
		s->out = nth_fmt(row->out_fmts, i / nw / na);
	if (row->src_fmts)
		s->src = nth_fmt(row->src_fmts, i / nw / na / no);
	if (dg_rng_int(r, 0, 3) == 0) { /* the BDH shape */
		s->heads = 4;
		s->embd = 256;
		s->latent = 8192;
	} else {
		s->heads = pick(r, heads, N_OF(heads));
		s->embd = pick(r, embds, N_OF(embds));
		s->latent = pick(r, latents, N_OF(latents));
	}
	s->in_heads = dg_rng_int(r, 0, 1) ? s->heads : 1;
	if (row->fields & DG_FIELD_RELU) {
		s->relu = row->needs_relu || s->out == DG_FMT_UINT8POS || dg_rng_int(r, 0, 1);
		s->relu_thr = 0.0f;
	}
	int arch = dg_rng_int(r, 0, 2);
	s->arch = arch ? 90 : 80;
	s->arch_specific = arch == 2;
	if (row->tile == DG_TILE_GEMM) {
		random_gemm_tile(r, &s->tile);
	} else {
		memset(&s->tile, 0, sizeof(s->tile));
		int k = dg_rng_int(r, 0, 19);
		if (k > 0)
			s->tile.threads = k < 18 ? pick(r, threads, N_OF(threads))
						 : pick(r, bad_threads, N_OF(bad_threads));
	}
}

/* ---- the sweep ----------------------------------------------------------------- */

typedef struct counts {
	size_t samples, invalid, planned, refused, rendered, disagree;
	char first[2048];
} counts;

static void disagree(counts *c, const char *fmt_, const char *a, const char *b)
{
	if (c->disagree++ < 1)
		snprintf(c->first, sizeof(c->first), fmt_, a, b);
}

/* A set of canonical texts already rendered (open addressing, grows). */
typedef struct seen {
	char **v;
	size_t cap, n;
} seen;

/* true when text was not in the set (and now is). */
static bool seen_add(seen *s, const char *text)
{
	if (2 * (s->n + 1) > s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 4096;
		char **v = calloc(cap, sizeof(*v));
		cr_assert_not_null(v);
		for (size_t i = 0; i < s->cap; i++) {
			if (!s->v[i])
				continue;
			size_t j = dg__fnv1a(s->v[i]) & (cap - 1);
			while (v[j])
				j = (j + 1) & (cap - 1);
			v[j] = s->v[i];
		}
		free(s->v);
		s->v = v;
		s->cap = cap;
	}
	size_t j = dg__fnv1a(text) & (s->cap - 1);
	for (; s->v[j]; j = (j + 1) & (s->cap - 1))
		if (strcmp(s->v[j], text) == 0)
			return false;
	s->v[j] = strdup(text);
	cr_assert_not_null(s->v[j]);
	s->n++;
	return true;
}

static void seen_free(seen *s)
{
	for (size_t i = 0; i < s->cap; i++)
		free(s->v[i]);
	free(s->v);
}

/* The source is the plan's: program, canonical text, entries and their
 * launch info, each entry defined in the text. */
static void same_as_plan(counts *c, const dg_plan *p, const dg_source *src)
{
	if (strcmp(src->canonical, p->canonical) != 0) {
		disagree(c, "canonical: render %s, plan %s", src->canonical, p->canonical);
		return;
	}
	if (strcmp(src->name, p->program) != 0 || src->n_entries != p->n_entries) {
		disagree(c, "%s: program or entry count differs from the plan's (%s)", p->canonical, src->name);
		return;
	}
	if (!strstr(src->text, p->canonical)) {
		disagree(c, "%s: the source does not carry its spec%s", p->canonical, "");
		return;
	}
	for (int i = 0; i < p->n_entries; i++) {
		char def[80];
		snprintf(def, sizeof(def), "%s(", p->entries[i].name);
		if (strcmp(src->entries[i], p->entries[i].name) != 0 ||
		    src->block_threads[i] != p->entries[i].threads || src->dyn_smem[i] != p->entries[i].smem) {
			disagree(c, "%s: entry %s: launch info differs from the plan's", p->canonical,
				 p->entries[i].name);
			return;
		}
		if (!strstr(src->text, def)) {
			disagree(c, "%s: entry %s is not defined in the source", p->canonical, p->entries[i].name);
			return;
		}
	}
}

static bool same_plan(const dg_plan *a, const dg_plan *b)
{
	if (strcmp(a->canonical, b->canonical) || strcmp(a->path, b->path) ||
	    strcmp(a->program, b->program) || a->n_entries != b->n_entries ||
	    a->needs_arch_specific != b->needs_arch_specific)
		return false;
	for (int i = 0; i < a->n_entries; i++)
		if (strcmp(a->entries[i].name, b->entries[i].name) || a->entries[i].threads != b->entries[i].threads ||
		    a->entries[i].smem != b->entries[i].smem)
			return false;
	return true;
}

static void sweep_one(dg_codegen *cg, seen *done, const dg_spec *s, counts *c)
{
	char text[DG_SPEC_TEXT_MAX], pmsg[1024];
	dg_plan p, q;
	dg_source *src = NULL;

	c->samples++;
	dg_spec_to_string(s, text, sizeof(text));
	bool valid = dg_spec_validate(s, NULL, 0) == DG_OK;
	dg_status ps = dg_codegen_plan(cg, s, &p);
	snprintf(pmsg, sizeof(pmsg), "%s", dg_codegen_errmsg(cg));
	if (!valid) {
		c->invalid++;
		if (ps != DG_ERR_INVALID_SPEC)
			disagree(c, "%s: invalid, but planned (%s)", text, dg_status_str(ps));
		return;
	}
	if (ps == DG_OK) {
		c->planned++;
		if (!seen_add(done, p.canonical))
			return; /* rendered already: the same canonical spec renders the same */
	} else {
		c->refused++;
		if (ps != DG_ERR_INVALID_SPEC) {
			disagree(c, "%s: plan failed: %s", text, pmsg);
			return;
		}
		if (dg_tile_is_auto(&s->tile)) {
			disagree(c, "%s: the template refuses its own default: %s", text, pmsg);
			return;
		}
	}
	dg_status rs = dg_codegen_render(cg, s, &src);
	if ((ps == DG_OK) != (rs == DG_OK)) {
		disagree(c, "%s: plan and render disagree: %s", text,
			 ps == DG_OK ? dg_codegen_errmsg(cg) : pmsg);
	} else if (ps != DG_OK) {
		if (rs != ps || strcmp(pmsg, dg_codegen_errmsg(cg)) != 0)
			disagree(c, "%s: render refuses otherwise: %s", text, dg_codegen_errmsg(cg));
	} else {
		c->rendered++;
		same_as_plan(c, &p, src);
		if (dg_codegen_plan(cg, &p.spec, &q) != DG_OK || !same_plan(&p, &q))
			disagree(c, "%s: the resolved spec plans otherwise: %s", p.canonical, dg_codegen_errmsg(cg));
	}
	dg_source_destroy(src);
}

/* Samples an op the sweep draws: formats cycle, so every combination the
 * op takes shows up many times. Fewer under
 * DRAGON_TEST_QUICK (a twentieth). */
static size_t samples_of(dg_op op)
{
	size_t n = dg_op_info_of(op)->tile == DG_TILE_GEMM ? 50000 : 6000;
	return dg_test_quick() ? n / 20 : n;
}

static void sweep(dg_op op)
{
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_rng r;
	dg_rng_seed(&r, 0x5eed0000u + (uint64_t)op);
	counts c = { 0 };
	seen done = { 0 };
	size_t n = samples_of(op);
	for (size_t i = 0; i < n; i++) {
		dg_spec s;
		sample(&r, op, (unsigned)i, &s);
		sweep_one(cg, &done, &s, &c);
	}
	printf("plan sweep %s: %zu samples, %zu planned, %zu refused, %zu invalid, %zu rendered, %zu disagreements\n",
	       dg_op_name(op), c.samples, c.planned, c.refused, c.invalid, c.rendered, c.disagree);
	fflush(stdout);
	cr_assert_eq(c.disagree, 0, "%s: %zu of %zu samples disagree; first: %s", dg_op_name(op), c.disagree,
		     c.samples, c.first);
	/* the sweep reaches both answers, and the plans are not all one */
	cr_assert_gt(c.planned, n / 20, "%s: only %zu of %zu planned", dg_op_name(op), c.planned, n);
	if (dg_op_info_of(op)->tile == DG_TILE_GEMM)
		cr_assert_gt(c.refused, n / 20, "%s: only %zu refused", dg_op_name(op), c.refused);
	cr_assert_gt(done.n, 10);
	seen_free(&done);
	dg_codegen_destroy(cg);
}

#define SWEEP(name, e)                                                                   \
	Test(plan_sweep, name) { sweep(e); }
SWEEP(lowrank_fwd, DG_OP_LOWRANK_FWD)
SWEEP(relu_mask, DG_OP_RELU_MASK)
SWEEP(decoder_fwd, DG_OP_DECODER_FWD)
SWEEP(lowrank_grad_input, DG_OP_LOWRANK_GRAD_INPUT)
SWEEP(lowrank_grad_weight, DG_OP_LOWRANK_GRAD_WEIGHT)
SWEEP(decoder_grad_input, DG_OP_DECODER_GRAD_INPUT)
SWEEP(decoder_grad_weight, DG_OP_DECODER_GRAD_WEIGHT)
SWEEP(quantize_act, DG_OP_QUANTIZE_ACT)
SWEEP(quantize_weight, DG_OP_QUANTIZE_WEIGHT)
SWEEP(pack_ternary, DG_OP_PACK_TERNARY)
SWEEP(pack_sign1, DG_OP_PACK_SIGN1)
SWEEP(pack_i8x4, DG_OP_PACK_I8X4)
SWEEP(unpack_i8x4, DG_OP_UNPACK_I8X4)
SWEEP(rope_fwd, DG_OP_ROPE_FWD)
SWEEP(rope_bwd, DG_OP_ROPE_BWD)
SWEEP(attention_scores, DG_OP_ATTENTION_SCORES)
SWEEP(attention_out, DG_OP_ATTENTION_OUT)
SWEEP(attention_grad_scores, DG_OP_ATTENTION_GRAD_SCORES)
SWEEP(attention_grad_v, DG_OP_ATTENTION_GRAD_V)
SWEEP(attention_grad_xs, DG_OP_ATTENTION_GRAD_XS)
#undef SWEEP

/* ---- NVRTC compiles what the plans let through ----------------------------------- */

/* One bucket: an op and a path family; keeps its largest planned tile. */
typedef struct bucket {
	dg_op op;
	const char *path; /* a prefix of dg_plan.path */
	dg_spec best;
	long score;       /* -1: none yet */
	char canonical[DG_SPEC_TEXT_MAX];
	char err[8192];
	dg_status st;
} bucket;

/* How hard a planned tile presses on the block's registers and shared
 * memory, in per mille of an sm_90 block's: accumulators BM·BN against the
 * 64 Ki registers, and the staged operands (at most 4 bytes a value) plus
 * the dynamic shared memory against 227 KiB. The tiles that press hardest
 * are the ones whose limits a plan can get wrong. */
static long pressure(const dg_plan *p)
{
	const dg_tile *t = &p->spec.tile;
	if (t->threads)
		return t->threads;
	long regs = 1000L * t->bm * t->bn / 65536;
	long mem = 1000L * ((long)(t->bm + t->bn) * t->bk * t->stages * 4 + p->entries[0].smem) / (227 * 1024);
	return (regs > mem ? regs : mem) * 1000000L + (long)t->bm * t->bn * t->bk * t->stages / 1024;
}

typedef struct compile_work {
	bucket *b;
	size_t n, next;
	pthread_mutex_t mu;
} compile_work;

static void *compile_worker(void *arg)
{
	compile_work *w = arg;
	dg_ctx_opts o = { .no_cache = true };
	dg_ctx *ctx = NULL;
	if (dg_ctx_create(&ctx, &o)) {
		dg_ctx_destroy(ctx);
		return NULL;
	}
	for (;;) {
		pthread_mutex_lock(&w->mu);
		size_t i = w->next++;
		pthread_mutex_unlock(&w->mu);
		if (i >= w->n)
			break;
		bucket *b = &w->b[i];
		if (b->score < 0)
			continue;
		dg_binary *bin = NULL;
		b->st = dg_jit_compile(ctx, &b->best, &bin);
		if (b->st)
			snprintf(b->err, sizeof(b->err), "%s", dg_ctx_errmsg(ctx));
		else if (bin->is_ptx || bin->image_size < 64 || memcmp(bin->image, "\177ELF", 4) != 0)
			b->st = DG_ERR_COMPILE, snprintf(b->err, sizeof(b->err), "not a cubin");
		dg_binary_destroy(bin);
	}
	dg_ctx_destroy(ctx);
	return NULL;
}

Test(plan_sweep, nvrtc_compiles_the_hardest_planned_tile_of_each_path)
{
	static const struct {
		dg_op op;
		const char *path;
	} want[] = {
		{ DG_OP_LOWRANK_FWD, "wgmma" },		{ DG_OP_LOWRANK_FWD, "wgmma bf16" },
		{ DG_OP_LOWRANK_FWD, "mma.sync" },
		{ DG_OP_LOWRANK_FWD, "dp4a" },		{ DG_OP_LOWRANK_FWD, "fp32" },
		/* the mask recomputes y on warp tensor cores or SIMT */
		{ DG_OP_RELU_MASK, "mma.sync" },	{ DG_OP_RELU_MASK, "dp4a" },
		{ DG_OP_RELU_MASK, "fp32" },
		/* the decoder's SIMT path is one for codes and floats */
		{ DG_OP_DECODER_FWD, "wgmma" },		{ DG_OP_DECODER_FWD, "mma.sync" },
		{ DG_OP_DECODER_FWD, "simt" },
		{ DG_OP_LOWRANK_GRAD_INPUT, "mma.sync bf16" },	{ DG_OP_LOWRANK_GRAD_INPUT, "fp32" },
		{ DG_OP_LOWRANK_GRAD_WEIGHT, "mma.sync bf16" }, { DG_OP_LOWRANK_GRAD_WEIGHT, "fp32" },
		{ DG_OP_DECODER_GRAD_INPUT, "mma.sync bf16" },	{ DG_OP_DECODER_GRAD_INPUT, "fp32" },
		{ DG_OP_DECODER_GRAD_WEIGHT, "mma.sync bf16" }, { DG_OP_DECODER_GRAD_WEIGHT, "fp32" },
		{ DG_OP_QUANTIZE_ACT, "element-wise" },	{ DG_OP_QUANTIZE_WEIGHT, "element-wise" },
		{ DG_OP_PACK_TERNARY, "element-wise" },	{ DG_OP_PACK_SIGN1, "element-wise" },
		{ DG_OP_PACK_I8X4, "element-wise" },	{ DG_OP_UNPACK_I8X4, "element-wise" },
		{ DG_OP_ROPE_FWD, "element-wise" },	{ DG_OP_ROPE_BWD, "element-wise" },
		{ DG_OP_ATTENTION_SCORES, "mma.sync bf16" },	{ DG_OP_ATTENTION_SCORES, "fp32" },
		{ DG_OP_ATTENTION_OUT, "mma.sync bf16" },	{ DG_OP_ATTENTION_OUT, "fp32" },
		{ DG_OP_ATTENTION_GRAD_SCORES, "mma.sync bf16" }, { DG_OP_ATTENTION_GRAD_SCORES, "fp32" },
		{ DG_OP_ATTENTION_GRAD_V, "mma.sync bf16" },	{ DG_OP_ATTENTION_GRAD_V, "fp32" },
		{ DG_OP_ATTENTION_GRAD_XS, "mma.sync bf16" },	{ DG_OP_ATTENTION_GRAD_XS, "fp32" },
	};
	enum { N = sizeof(want) / sizeof(want[0]) };
	bucket b[N];
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	memset(b, 0, sizeof(b));
	for (size_t i = 0; i < N; i++) {
		b[i].op = want[i].op;
		b[i].path = want[i].path;
		b[i].score = -1;
	}
	/* the same streams as the sweep, planned only, DRAGON_TEST_QUICK or
	 * not (the same specs compile either way); the small shapes only (the
	 * BDH shape's grids take a while to compile and test nothing more) */
	for (int op = 0; op < DG_OP__COUNT; op++) {
		dg_rng r;
		dg_rng_seed(&r, 0x5eed0000u + (uint64_t)op);
		size_t n = dg_op_info_of((dg_op)op)->tile == DG_TILE_GEMM ? 25000 : 3000;
		for (size_t i = 0; i < n; i++) {
			dg_spec s;
			dg_plan p;
			sample(&r, (dg_op)op, (unsigned)i, &s);
			if (s.latent > 1024 || dg_codegen_plan(cg, &s, &p) != DG_OK)
				continue;
			for (size_t k = 0; k < N; k++) {
				size_t len = strlen(b[k].path);
				if (b[k].op != (dg_op)op || strncmp(p.path, b[k].path, len) != 0 ||
				    (p.path[len] && p.path[len] != ' '))
					continue;
				/* "mma.sync" is not "mma.sync bf16", "wgmma" not "wgmma bf16" */
				if ((strcmp(b[k].path, "mma.sync") == 0 || strcmp(b[k].path, "wgmma") == 0) &&
				    strcmp(p.path, b[k].path) != 0)
					continue;
				long f = pressure(&p);
				if (f > b[k].score) {
					b[k].score = f;
					b[k].best = p.spec;
					snprintf(b[k].canonical, sizeof(b[k].canonical), "%s", p.canonical);
				}
			}
		}
	}
	dg_codegen_destroy(cg);
	/* every path of every op */
	for (size_t k = 0; k < N; k++)
		cr_assert_geq(b[k].score, 0, "no planned %s on the %s path", dg_op_name(b[k].op), b[k].path);
	size_t found = N;
	compile_work w = { .b = b, .n = N };
	pthread_mutex_init(&w.mu, NULL);
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, compile_worker, &w);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	int failed = 0;
	for (size_t k = 0; k < N; k++) {
		if (b[k].score < 0)
			continue;
		printf("plan sweep nvrtc: %s %s: %s\n", b[k].path, b[k].canonical, b[k].st ? "FAILED" : "ok");
		if (b[k].st) {
			failed++;
			cr_log_error("%s (%s): %s", b[k].canonical, b[k].path, b[k].err);
		}
	}
	fflush(stdout);
	cr_assert_eq(failed, 0, "%d of %zu planned specs do not compile (see the log)", failed, found);
}
