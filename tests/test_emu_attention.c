/*
 * The sm_90a warp-specialized attention GEMMs (templates/attention_tma.lua:
 * TMA loads into a ring of mbarrier-guarded stages, a producer warpgroup,
 * wgmma consumers) run on the CPU (tests/emu_helpers.h: the rendered
 * kernel built for the host, its inline PTX emulated — the tensor maps,
 * the 128-byte swizzle, the mbarriers' phases and transaction bytes, the
 * warpgroup MMA's descriptors and accumulator layout), against the C
 * references by the GPU suite's bound (test_gpu_attention: the norm
 * within 1e-2, each element within 2e-2 of the largest): attention_scores
 * and attention_grad_xs (epi=store, f32, and epi=mask, bf16 in place) at
 * a tile of each height (BM 128: two consumer warpgroups; BM 64: one),
 * and on the cp.async ring (templates/attention_wgmma.lua: the threads
 * stage the operands, swizzled by the kernel's own arithmetic),
 * over T that is not a multiple of the tile (the maps' zero fill, the
 * edges' guards, the skipped blocks above the diagonal) and two heads.
 * These kernels pass on the H200 (test_gpu_attention); here they show that
 * the emulation reads the same layouts the hardware does, so a kernel of
 * this machinery can be checked before it meets a GPU.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/codegen.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "emu_helpers.h"
#include "nvrtc_helpers.h"
#include "runtime/ref/ref_ops.h"

typedef void (*scores_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const void *xs,
			  const float *rope, void *scores, int B, int T, const eh_tmap *ma, const eh_tmap *mb);
typedef void (*grad_xs_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const void *c,
			   const void *xs, const float *rope, void *out, const void *mask, int B, int T,
			   const eh_tmap *ma, const eh_tmap *mb, const eh_tmap *me);

/* The glue's call: the warp-specialized kernels take the two maps after
 * the op's arguments, the cp.async ring's none. */
static bool tma_tile(const dg_tile *t)
{
	return t->stages >= 5 || t->stages == 4;
}

static const char *maps_of(const dg_tile *t)
{
	return tma_tile(t) ? ", a, b" : "";
}

/* the glue's maps from the test's bytes (none on the ring) */
static const char *maps_in(const dg_tile *t)
{
	return tma_tile(t) ? "dg_tmap a, b; memcpy(&a, ma, sizeof(dg_emu_tmap)), memcpy(&b, mb, sizeof(dg_emu_tmap));"
			      : "(void)ma; (void)mb;";
}

static const char SCORES_GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const void *xs, const float *rope, void *scores, int B, int T, const void *ma, const void *mb)\n"
	"{\n"
	"	%s\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_attention_scores((const XT *)xs, rope, (XT *)scores, B, T%s);\n"
	"	});\n"
	"}\n";

/* me: the epilogue's three maps (dxs, mask_xs, the RoPE table) of the
 * persistent form with epi=mask (templates/attention_tma.lua M.tma_epi) */
static const char GRAD_XS_GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const void *c, const void *xs, const float *rope, void *out, const void *mask, int B, int T,\n"
	"	const void *ma, const void *mb, const dg_emu_tmap *me)\n"
	"{\n"
	"	(void)me;\n"
	"	%s\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_attention_grad_xs((const XT *)c, (const XT *)xs, rope, (OT *)out,%s B, T%s);\n"
	"	});\n"
	"}\n";

typedef struct shape {
	int B, H, T, N, E;
} shape;

static float *widen(dg_fmt f, const void *p, size_t n)
{
	float *w = malloc(n * sizeof(float));
	cr_assert_not_null(w);
	for (size_t i = 0; i < n; i++)
		w[i] = f == DG_FMT_BF16 ? dg_ref_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
	return w;
}

static void expect_close(const char *what, dg_fmt f, const void *got, const void *want, size_t n)
{
	char why[512];
	float *g = widen(f, got, n), *w = widen(f, want, n);
	cr_assert(dg_ref_close_norm(g, w, n, 1e-2, 2e-2f, why, sizeof(why)), "%s: %s", what, why);
	free(g), free(w);
}

static dg_spec spec_of(dg_op op, const shape *s, const dg_tile *t)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.act = DG_FMT_BF16, sp.heads = s->H, sp.latent = s->N, sp.embd = s->E;
	sp.arch = 90, sp.arch_specific = true, sp.rope_pre = true, sp.tile = *t;
	dg_spec_normalize(&sp);
	return sp;
}

/* n random bf16 values (dg_rng_fill: [-1, 1)) */
static uint16_t *rand_bf16(dg_rng *r, size_t n)
{
	uint16_t *p = calloc(n + 8, 2);
	cr_assert_not_null(p);
	dg_rng_fill(r, DG_FMT_BF16, p, n);
	return p;
}

/* The sm_80 path's spec (mma.sync bf16, RoPE on the load): op at shape s,
 * its auto tile. */
static dg_spec mma_spec(dg_op op, const shape *s)
{
	dg_spec sp;
	dg_spec_init(&sp, op);
	sp.act = DG_FMT_BF16, sp.heads = s->H, sp.latent = s->N, sp.embd = s->E;
	sp.arch = 80;
	dg_spec_normalize(&sp);
	return sp;
}

static void check_scores_spec(dg_codegen *cg, dg_rng *r, const shape *s, dg_spec sp);

static void check_scores(dg_codegen *cg, dg_rng *r, const shape *s, const dg_tile *t)
{
	check_scores_spec(cg, r, s, spec_of(DG_OP_ATTENTION_SCORES, s, t));
}

static void check_scores_spec(dg_codegen *cg, dg_rng *r, const shape *s, dg_spec sp)
{
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &sp, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const dg_tile *t = &plan.spec.tile;
	const bool mma = !sp.arch_specific;
	cr_assert_str_eq(plan.path, mma ? "mma.sync bf16" : t->stages >= 5 ? "wgmma tma" : "wgmma bf16", "%s",
			 plan.canonical);
	char glue[2048];
	snprintf(glue, sizeof(glue), SCORES_GLUE, maps_in(t), maps_of(t));
	scores_fn fn = (scores_fn)eh_build(cg, &sp, glue, "dg_emu_entry");
	const int B = s->B, H = s->H, T = s->T, N = s->N;
	const size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T;
	uint16_t *qr = rand_bf16(r, nx), *got = malloc(ns * 2), *want = malloc(ns * 2);
	float *rope = malloc((size_t)T * N * 4);
	cr_assert(got && want && rope);
	dg_ref_rope_pairs(T, N, rope);
	memset(got, 0xff, ns * 2);
	const eh_tmap ma = eh_tmap3(qr, 2, (uint64_t)N, (uint64_t)T, (uint64_t)B * H, 64, (unsigned)t->bm),
		      mb = eh_tmap3(qr, 2, (uint64_t)N, (uint64_t)T, (uint64_t)B * H, 64, (unsigned)t->bn);
	fn((unsigned)((T + t->bn - 1) / t->bn), (unsigned)((T + t->bm - 1) / t->bm), (unsigned)(B * H),
	   (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, qr, rope, got, B, T, &ma, &mb);
	cr_assert_eq(dg_ref_attention_scores(&plan.spec, qr, rope, want, B, T), DG_OK);
	expect_close(plan.canonical, DG_FMT_BF16, got, want, ns);
	free(qr), free(got), free(want), free(rope);
}

/* epi: 0 store (f32 out), 1 mask (bf16 dxs in place); load: rope=load
 * (xs raw, RoPE'd on the stages; else qr is RoPE(xs) already). With
 * given inputs (qr, c, mask, dxs: NULL draws them), the output is kept in
 * *out (malloc'd; NULL: freed). */
static void run_grad_xs(dg_codegen *cg, dg_rng *r, const shape *s, const dg_tile *t, int epi, bool load,
			const uint16_t *qr_in, const uint16_t *c_in, const uint16_t *mask_in, const uint16_t *dxs_in,
			void **out);

static void check_grad_xs(dg_codegen *cg, dg_rng *r, const shape *s, const dg_tile *t, int epi)
{
	run_grad_xs(cg, r, s, t, epi, false, NULL, NULL, NULL, NULL, NULL);
}

static uint16_t *copy_or_rand(dg_rng *r, const uint16_t *in, size_t n)
{
	uint16_t *p = calloc(n + 8, 2);
	cr_assert_not_null(p);
	if (in)
		memcpy(p, in, n * 2);
	else
		dg_rng_fill(r, DG_FMT_BF16, p, n);
	return p;
}

static void run_grad_xs(dg_codegen *cg, dg_rng *r, const shape *s, const dg_tile *t, int epi, bool load,
			const uint16_t *qr_in, const uint16_t *c_in, const uint16_t *mask_in, const uint16_t *dxs_in,
			void **out)
{
	dg_spec sp = spec_of(DG_OP_ATTENTION_GRAD_XS, s, t);
	sp.rope_pre = !load;
	sp.out = epi ? DG_FMT_BF16 : DG_FMT_F32;
	sp.epi = epi ? DG_EPI_MASK : DG_EPI_STORE;
	dg_spec_normalize(&sp);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &sp, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	const bool persistent = t->stages == 4;
	cr_assert_str_eq(plan.path, persistent ? "wgmma tma persistent" : t->stages >= 5 ? "wgmma tma" : "wgmma bf16", "%s",
			 plan.canonical);
	/* the epilogue by TMA: three maps more, as runtime/ops/attention.c
	 * makes them (boxes of 32 columns by BM rows) */
	const bool tepi = persistent && epi;
	char glue[2048], maps[512];
	snprintf(maps, sizeof(maps), "%s%s", maps_in(t),
		 tepi ? " dg_tmap d, x, rt; memcpy(&d, &me[0], sizeof(dg_emu_tmap)), memcpy(&x, &me[1], sizeof(dg_emu_tmap)), memcpy(&rt, &me[2], sizeof(dg_emu_tmap));"
		      : "");
	snprintf(glue, sizeof(glue), GRAD_XS_GLUE, maps, epi ? " (const XT *)mask," : "",
		 tepi ? ", a, b, d, x, rt" : maps_of(t));
	grad_xs_fn fn = (grad_xs_fn)eh_build(cg, &sp, glue, "dg_emu_entry");
	const int B = s->B, H = s->H, T = s->T, N = s->N;
	const size_t nx = (size_t)B * H * T * N, ns = (size_t)B * H * T * T, ob = epi ? 2 : 4;
	uint16_t *qr = copy_or_rand(r, qr_in, nx), *c = copy_or_rand(r, c_in, ns), *mask = copy_or_rand(r, mask_in, nx);
	void *got = malloc(nx * ob), *want = malloc(nx * ob), *dxs = epi ? copy_or_rand(r, dxs_in, nx) : NULL;
	float *rope = malloc((size_t)T * N * 4);
	cr_assert(got && want && rope);
	dg_ref_rope_pairs(T, N, rope);
	if (epi)
		memcpy(got, dxs, nx * 2);
	else
		memset(got, 0xff, nx * ob);
	const eh_tmap ma = eh_tmap3(c, 2, (uint64_t)T, (uint64_t)T, (uint64_t)B * H, 64, (unsigned)t->bm),
		      mb = eh_tmap3(qr, 2, (uint64_t)N, (uint64_t)T, (uint64_t)B * H, 64, 64);
	eh_tmap me[3] = { eh_tmap3(got, 2, (uint64_t)N, (uint64_t)T, (uint64_t)B * H, 32, (unsigned)t->bm),
			  eh_tmap3(mask, 2, (uint64_t)N, (uint64_t)T, (uint64_t)B * H, 32, (unsigned)t->bm),
			  eh_tmap3(rope, 4, (uint64_t)N, (uint64_t)T, 1, 32, (unsigned)t->bm) };
	me[0].swizzle = me[1].swizzle = 64;
	/* the persistent form: 3 blocks walk the tiles (several each, the ring
	 * running on from one to the next) */
	if (persistent)
		fn(3, 1, 1, (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, c, qr, rope, got, mask, B, T,
		   &ma, &mb, me);
	else
		fn((unsigned)((N + t->bn - 1) / t->bn), (unsigned)((T + t->bm - 1) / t->bm), (unsigned)(B * H),
		   (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, c, qr, rope, got, mask, B, T, &ma,
		   &mb, me);
	if (epi)
		cr_assert_eq(dg_ref_attention_grad_xs_mask(&sp, c, qr, rope, dxs, mask, want, B, T), DG_OK);
	else
		cr_assert_eq(dg_ref_attention_grad_xs(&sp, c, qr, rope, want, B, T), DG_OK);
	expect_close(plan.canonical, epi ? DG_FMT_BF16 : DG_FMT_F32, got, want, nx);
	if (out)
		*out = got;
	else
		free(got);
	free(qr), free(c), free(mask), free(want), free(dxs), free(rope);
}

/* the warp-specialized form at each height, and the cp.async ring (its
 * operands staged by the threads with the swizzle computed in the kernel,
 * dg_wb_kmaj / dg_wb_mnmaj: the layout the hardware reads, which the
 * emulated descriptor must read the same) */
static const dg_tile TILES[3] = { { 128, 128, 64, 8, 1, 5, 0 }, { 64, 128, 64, 4, 1, 6, 0 },
				  { 128, 128, 64, 8, 1, 3, 0 } };

/* attention_grad_xs's persistent form (templates/attention_tma.lua
 * M.persistent_ok: 4 stages) at each height */
static const dg_tile PERSISTENT[2] = { { 128, 128, 64, 8, 1, 4, 0 }, { 64, 128, 64, 4, 1, 4, 0 } };

Test(emu_attention, warp_specialized_scores, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 5);
	const shape s = { 1, 2, 200, 128, 64 };
	for (int i = 0; i < 3; i++)
		check_scores(cg, &r, &s, &TILES[i]);
	dg_codegen_destroy(cg);
}

/* attention_grad_xs at shape s on each of n tiles, both epilogues */
static void grad_xs_tiles(uint64_t seed, const shape *s, const dg_tile *tiles, int n)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, seed);
	for (int i = 0; i < n; i++)
		for (int epi = 0; epi < 2; epi++)
			check_grad_xs(cg, &r, s, &tiles[i], epi);
	dg_codegen_destroy(cg);
}

/* T 136 (3 steps a tile: a ring of 4 wraps inside a tile and from tile to
 * tile), L 192 (BN 128 leaves a ragged column of tiles), two heads */
static const shape GRAD_XS_SHAPE = { 1, 2, 136, 192, 64 };

Test(emu_attention, warp_specialized_grad_xs, .timeout = 900)
{
	grad_xs_tiles(6, &GRAD_XS_SHAPE, TILES, 3);
}

/* the persistent form: 3 blocks over 2 x 2 x 2 tiles (BM 128) or 3 x 2 x 2
 * (BM 64) */
Test(emu_attention, persistent_grad_xs, .timeout = 900)
{
	grad_xs_tiles(8, &GRAD_XS_SHAPE, PERSISTENT, 2);
}

/* the persistent walk over more heads than a group (8): B 3 x H 4 = 12
 * heads, a group of 8 and one of 4, two columns of tiles (the second
 * ragged), 3 blocks over the 24 tiles: every tile once, both epilogues */
Test(emu_attention, persistent_grad_xs_head_groups, .timeout = 900)
{
	const shape s = { 3, 4, 72, 192, 64 };
	grad_xs_tiles(12, &s, PERSISTENT, 1);
}

/* rope=load on the persistent form (its turners RoPE each stage's boxes
 * of xs by the table): within the reference's bound, and the bytes of
 * rope=pre on rope_fwd's RoPE(xs) (dg_ref_rope_op: rope.lua's arithmetic),
 * both epilogues, both heights */
Test(emu_attention, persistent_grad_xs_rope_load, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 9);
	const shape s = { 1, 2, 136, 192, 64 };
	const size_t nx = (size_t)s.B * s.H * s.T * s.N, ns = (size_t)s.B * s.H * s.T * s.T;
	for (int i = 0; i < 2; i++)
		for (int epi = 0; epi < 2; epi++) {
			uint16_t *xs = rand_bf16(&r, nx), *c = rand_bf16(&r, ns), *mask = rand_bf16(&r, nx);
			uint16_t *dxs = rand_bf16(&r, nx), *qr = calloc(nx + 8, 2);
			float *rope = malloc((size_t)s.T * s.N * 4);
			cr_assert(qr && rope);
			dg_ref_rope_pairs(s.T, s.N, rope);
			dg_spec rs = spec_of(DG_OP_ROPE_FWD, &s, &(dg_tile){ 0 });
			rs.tile = (dg_tile){ 0 };
			rs.arch_specific = false;
			dg_spec_normalize(&rs);
			cr_assert_eq(dg_ref_rope_op(&rs, xs, rope, qr, s.B, s.T), DG_OK);
			void *load = NULL, *pre = NULL;
			run_grad_xs(cg, &r, &s, &PERSISTENT[i], epi, true, xs, c, mask, dxs, &load);
			run_grad_xs(cg, &r, &s, &PERSISTENT[i], epi, false, qr, c, mask, dxs, &pre);
			cr_assert_eq(memcmp(load, pre, nx * (epi ? 2 : 4)), 0,
				     "tile %d epi %d: rope=load is not rope=pre on rope_fwd's bytes", i, epi);
			free(xs), free(c), free(mask), free(dxs), free(qr), free(rope), free(load), free(pre);
		}
	dg_codegen_destroy(cg);
}

/* attention_chunk_dq (templates/attention_chunk.lua: the chunk's C·qr
 * with B N-major, then dout·S and v·R K-major, each form a loop of its
 * own) by its six maps, as runtime/ops/attention_chunk.c makes them: C
 * (C, C, chunks), qr (N, T, B·H), dout (D, T, B·H), v (D, T, B), S and R
 * (D, 2N, chunks); then its epilogue into dxs (bf16, masked) against the
 * reference (dg_ref_run: the three terms in f32, RoPEᵀ, epi=mask's add).
 * T 256 in chunks of 128 (two chunks a head, each a tile's rows), N 192
 * (a ragged column of tiles), D 64, two heads: both loops, the ring of 6
 * stages wrapping. */
static const char CHUNK_DQ_GLUE[] =
	"extern \"C\" void dg_emu_entry(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem,\n"
	"	const void *const *maps, const float *rope, void *dxs, const void *mask, int B, int T)\n"
	"{\n"
	"	dg_tmap m[6];\n"
	"	for (int i = 0; i < 6; i++)\n"
	"		memcpy(&m[i], maps[i], sizeof(dg_emu_tmap));\n"
	"	dg_emu_launch3({ gx, gy, gz }, nt, smem, [&] {\n"
	"		dg_attention_chunk_dq(m[0], m[1], m[2], m[3], m[4], m[5], rope, (OT *)dxs,\n"
	"				      (const unsigned short *)mask, B, T);\n"
	"	});\n"
	"}\n";

typedef void (*chunk_dq_fn)(unsigned gx, unsigned gy, unsigned gz, unsigned nt, size_t smem, const void *const *maps,
			    const float *rope, void *dxs, const void *mask, int B, int T);

Test(emu_attention, chunk_dq_two_loops, .timeout = 900)
{
	enum { B = 1, H = 2, T = 256, N = 192, D = 64, C = 128 };
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 14);
	dg_spec sp;
	dg_spec_init(&sp, DG_OP_ATTENTION_CHUNK_DQ);
	sp.act = DG_FMT_BF16, sp.out = DG_FMT_BF16, sp.heads = H, sp.latent = N, sp.embd = D, sp.chunk = C;
	sp.arch = 90, sp.arch_specific = true;
	dg_spec_normalize(&sp);
	dg_plan plan;
	cr_assert_eq(dg_codegen_plan(cg, &sp, &plan), DG_OK, "%s", dg_codegen_errmsg(cg));
	chunk_dq_fn fn = (chunk_dq_fn)eh_build(cg, &sp, CHUNK_DQ_GLUE, "dg_emu_entry");
	const size_t chunks = (size_t)B * H * (T / C), nq = (size_t)B * H * T * N;
	uint16_t *cc = rand_bf16(&r, chunks * C * C), *qr = rand_bf16(&r, nq);
	uint16_t *dout = rand_bf16(&r, (size_t)B * H * T * D), *v = rand_bf16(&r, (size_t)B * T * D);
	uint16_t *st = rand_bf16(&r, chunks * 2 * N * D), *rt = rand_bf16(&r, chunks * 2 * N * D);
	uint16_t *dxs = rand_bf16(&r, nq), *mask = rand_bf16(&r, nq), *got = malloc(nq * 2), *want = malloc(nq * 2);
	float *rope = malloc((size_t)T * N * 4);
	cr_assert(got && want && rope);
	dg_ref_rope_pairs(T, N, rope);
	memcpy(got, dxs, nq * 2);
	const eh_tmap m[6] = {
		eh_tmap3(cc, 2, C, C, chunks, 64, 64),
		eh_tmap3(qr, 2, N, T, (uint64_t)B * H, 64, 64),
		eh_tmap3(dout, 2, D, T, (uint64_t)B * H, 64, 64),
		eh_tmap3(v, 2, D, T, B, 64, 64),
		eh_tmap3(st, 2, D, 2 * N, chunks, 64, 64),
		eh_tmap3(rt, 2, D, 2 * N, chunks, 64, 64),
	};
	const void *maps[6] = { &m[0], &m[1], &m[2], &m[3], &m[4], &m[5] };
	const dg_tile *t = &plan.spec.tile;
	fn((unsigned)((N + t->bn - 1) / t->bn), (unsigned)(T / t->bm), (unsigned)(B * H),
	   (unsigned)plan.entries[0].threads, (size_t)plan.entries[0].smem, maps, rope, got, mask, B, T);
	dg_ref_call rc;
	memset(&rc, 0, sizeof(rc));
	const void *in[9] = { cc, qr, dout, v, st, rt, rope, dxs, mask };
	memcpy(rc.in, in, sizeof(in));
	rc.b = B, rc.t = T, rc.out = want;
	cr_assert_eq(dg_ref_run(&plan.spec, &rc), DG_OK);
	expect_close(plan.canonical, DG_FMT_BF16, got, want, nq);
	size_t changed = 0;
	for (size_t i = 0; i < nq; i++)
		changed += got[i] != dxs[i];
	cr_assert_gt(changed, nq / 4, "the kernel changed %zu of %zu values of dxs", changed, nq);
	free(cc), free(qr), free(dout), free(v), free(st), free(rt), free(dxs), free(mask), free(got), free(want);
	free(rope);
	dg_codegen_destroy(cg);
}

/* the sm_80 path (mma.sync bf16 with ldmatrix, RoPE on the load from the
 * table, the block's cp.async buffers) on its auto tile: the warp's
 * fragments exchanged as the hardware's are */
Test(emu_attention, mma_sync_scores, .timeout = 900)
{
	dg_codegen *cg = nh_codegen();
	dg_rng r;
	dg_rng_seed(&r, 10);
	const shape s = { 1, 2, 136, 128, 64 };
	check_scores_spec(cg, &r, &s, mma_spec(DG_OP_ATTENTION_SCORES, &s));
	dg_codegen_destroy(cg);
}
