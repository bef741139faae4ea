/*
 * GPU tests of lowrank_grad_input's K split (templates/grad_mma.lua
 * M.GI_SPLIT, the same on every path, and the dg_lowrank_grad_input_reduce
 * entry of templates/grad.lua; runtime/ops/grad.c picks the count and
 * launches both). The count is forced through
 * dg_lowrank_grad_input_args.splits and every result is checked against the
 * CPU reference (dg_ref_lowrank_grad_input: the math is the same whatever
 * the split). Skip without a device (gh_open); the warpgroup cases also
 * unless the device is an sm_90, saying why.
 *
 *   - splits 1 (grad_x written directly, no workspace asked), 2, 3 and 5
 *     (over 8 K steps: 4+4; 3+3+2, ragged; 2+2+2+2 and an empty fifth
 *     split, which writes a partial of zeros), 8, and 0 (the runtime's
 *     choice), on
 *       the warpgroup path (sm_90a, bf16 grad and w): its default tile and
 *         a 64-row one, in_heads 1 (K = 4·128, 8 steps of 64) and H (K =
 *         128 a z: 2 steps, so most splits are empty);
 *       the mma.sync path (f32 grad rounded to bf16; int8 w, whose
 *         per-tensor scale the reduce entry applies once, and ternary):
 *         the default tile and an odd one (16x32 warp tiles, 3 stages);
 *       the SIMT path (BK 8: exact f32 sums);
 *     with rows (B·T 130) and columns (E 40 / 96) that do not fill a tile;
 *   - every output and every partial starts as 0xff bytes (NaN): a split
 *     that writes nothing, or an element the reduce entry misses, fails;
 *   - the workspace asked is splits · B·Hin·T·E floats (0 for one split);
 *   - a split result run twice is the same bytes (no atomics: the partials
 *     are added in split order), and on the SIMT path (exact f32 products)
 *     1 and 2 splits agree to the f32 sums' rounding;
 *   - bad input: no workspace, one a byte short, splits 65 or -1: each
 *     DG_ERR_INVALID_ARG naming the call (and, for the workspace, the
 *     bytes needed), and grad_x keeps its 0xff bytes (nothing ran).
 *
 * Without a device: the runtime's choice (dg__grad_input_splits, its model
 * of the GPU as slots of blocks) at the BDH shape, a forced count kept as
 * given (empty splits and all), and over a sweep of grids and K lengths
 * the invariants every launch relies on.
 *
 * Tolerance: tests/grad_helpers.h (gr_expect_bf16): a split changes
 * only the order of the f32 sums, which the bound's K·2^-24·Σ|terms|
 * covers; c = 1 on the warpgroup path (bf16 operands are exact), else
 * gr_bound_c.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_helpers.h"
#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "runtime/ops/ops_int.h"
#include "runtime/ref/ref_ops.h"

typedef gr_shape shape;

/* The forced counts of every check (0: the runtime's). */
static const int split_counts[] = { 1, 2, 3, 5, 8, 0 };
#define N_SPLIT_COUNTS 6

/* One lowrank_grad_input operand set on the device and its reference. */
typedef struct gi_case {
	dg_spec sp;
	shape s;
	size_t nx;           /* elements of grad_x */
	dg_tensor grad, w;
	float *want, *absum; /* the reference and its Σ|terms| (nx each) */
	double c;            /* the bound's factor */
} gi_case;

/* Random grad (gf) and w (wf) of shape s on dev, the spec with tile (for
 * sm_90a on the warpgroup path, else the device's arch), and the
 * reference's answer. */
static gi_case make_case(dg_device *dev, const shape *s, dg_fmt gf, dg_fmt wf, const dg_tile *tile,
			 bool warpgroup)
{
	gi_case k;
	dg_device_info di;
	memset(&k, 0, sizeof(k));
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	k.s = *s;
	dg_spec_init(&k.sp, DG_OP_LOWRANK_GRAD_INPUT);
	k.sp.heads = s->H;
	k.sp.in_heads = s->Hin;
	k.sp.embd = s->E;
	k.sp.latent = s->L;
	k.sp.src = gf;
	k.sp.weight = wf;
	k.sp.arch = warpgroup ? 90 : di.sm;
	k.sp.arch_specific = warpgroup;
	k.sp.tile = *tile;
	dg_spec_normalize(&k.sp);

	size_t ng = (size_t)s->B * s->H * s->T * s->L, nw = (size_t)s->H * s->L * s->E;
	k.nx = (size_t)s->B * s->Hin * s->T * s->E;
	void *g = gh_rand_storage(gf, ng, NULL), *w = gh_rand_storage(wf, nw, NULL);
	void *ga = gr_abs_storage(gf, g, ng), *wa = gr_abs_storage(wf, w, nw);
	float sw = gr_scale_of(wf);
	k.grad = dg_tensor_4d("grad", gf, gh_upload(dev, g, gh_bytes(gf, ng)), s->B, s->H, s->T, s->L);
	k.w = dg_tensor_3d("w", wf, gh_upload(dev, w, gh_bytes(wf, nw)), s->H, s->L, s->E);
	if (dg_fmt_is_code(wf))
		k.w.scale = gh_scalar(dev, sw);
	k.want = gh_xmalloc(k.nx * 4);
	k.absum = gh_xmalloc(k.nx * 4);
	cr_assert_eq(dg_ref_lowrank_grad_input(&k.sp, g, w, sw, k.want, s->B, s->T), DG_OK);
	cr_assert_eq(dg_ref_lowrank_grad_input(&k.sp, ga, wa, sw, k.absum, s->B, s->T), DG_OK);
	k.c = warpgroup ? 1.0 : gr_bound_c(wf);
	free(g), free(w), free(ga), free(wa);
	return k;
}

static void free_case(gi_case *k)
{
	free(k->want);
	free(k->absum);
}

/* k with `splits` into a fresh 0xff grad_x, twice; checks the first
 * against the reference, the second's bytes against the first and the
 * workspace size. Returns the first result (malloc'd). */
static float *run_split(dg_device *dev, const gi_case *k, int splits, const char *label)
{
	char what[192];
	snprintf(what, sizeof(what), "%s: H %d Hin %d E %d L %d B %d T %d splits %d", label, k->s.H, k->s.Hin,
		 k->s.E, k->s.L, k->s.B, k->s.T, splits);
	float *got = gh_xmalloc(k->nx * 4), *again = gh_xmalloc(k->nx * 4);
	size_t need[2] = { 0, 0 };
	for (int run = 0; run < 2; run++) {
		dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, gh_alloc_ff(dev, k->nx * 4), k->s.B, k->s.Hin,
					    k->s.T, k->s.E);
		dg_lowrank_grad_input_args a = { .grad = &k->grad, .w = &k->w, .grad_x = &tx, .splits = splits };
		need[run] = gr_grad_input(dev, &k->sp, &a, what);
		gh_download(dev, run ? again : got, tx.data, k->nx * 4);
	}
	if (splits == 1)
		cr_assert_eq(need[0], 0, "%s: one split asked for %zu bytes of workspace", what, need[0]);
	else if (splits > 1)
		cr_assert_eq(need[0], (size_t)splits * k->nx * 4, "%s: %zu bytes of workspace, want %d partials of %zu",
			     what, need[0], splits, k->nx * 4);
	cr_assert_eq(need[1], need[0], "%s", what);
	gr_expect_written(what, got, k->nx);
	gr_expect_bf16(what, got, k->want, k->absum, k->nx, k->c);
	gh_expect_bytes(what, again, got, k->nx * 4);
	free(again);
	return got;
}

/* Every count of split_counts on k. */
static void run_all_splits(dg_device *dev, const gi_case *k, const char *label)
{
	for (int i = 0; i < N_SPLIT_COUNTS; i++)
		free(run_split(dev, k, split_counts[i], label));
}

/* The warpgroup path: its default tile (the warp-specialized form's,
 * which T 65 sends to the cp.async ring's 128x128 tile) and a 64-row ring
 * one, in_heads 1 (8 K steps) and H (2 a z); and the warp-specialized
 * form itself at T 64 (its default and a 64-row tile). */
Test(gpu_grad, grad_input_split_wgmma)
{
	static const dg_tile tiles[] = { { 0, 0, 0, 0, 0, 0, 0 }, { 64, 128, 64, 4, 1, 4, 0 },
					 { 64, 128, 64, 4, 1, 5, 0 } };
	static const shape shapes[] = { { 4, 1, 40, 128, 2, 65 }, { 4, 4, 64, 128, 2, 65 },
					{ 4, 1, 40, 128, 2, 64 }, { 4, 4, 64, 128, 2, 64 } };
	static const char *const labels[] = { "wgmma default", "wgmma 64x128", "wgmma tma 64x128" };
	dg_device *dev = gh_open_sm90();

	gh_seed(93);
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < 4; i++) {
			bool ws_shape = i >= 2;
			if (t == 1 && ws_shape)
				continue; /* the ring's tile: at T 65 */
			if (t == 2 && !ws_shape)
				continue; /* an explicit warp-specialized tile needs T % 64 == 0 */
			gi_case k = make_case(dev, &shapes[i], DG_FMT_BF16, DG_FMT_BF16, &tiles[t], true);
			gh_expect_path(&k.sp, t == 1 ? "wgmma bf16" : "wgmma tma");
			run_all_splits(dev, &k, labels[t]);
			free_case(&k);
		}
	gh_close(dev);
}

/* The mma.sync path (sm_80 and later): an f32 gradient, int8 w (a scale
 * the reduce applies once) and ternary, the default tile (BK 16: L 112 is
 * no multiple of 32, so 21 K steps at Hin 1, 7 at Hin H) and an odd one. */
Test(gpu_grad, grad_input_split_mma)
{
	static const dg_tile tiles[] = { { 0, 0, 0, 0, 0, 0, 0 }, { 32, 32, 16, 2, 1, 3, 0 } };
	static const dg_fmt fmts[] = { DG_FMT_INT8, DG_FMT_TERNARY };
	dg_device *dev = gh_open();
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	if (di.sm < 80) {
		gh_close(dev);
		fprintf(stderr, "skipped: the tensor-core path needs sm_80 (device is sm_%d)\n", di.sm);
		cr_skip_test("skipped: the tensor-core path needs sm_80");
	}

	gh_seed(94);
	for (int t = 0; t < 2; t++)
		for (int f = 0; f < 2; f++)
			for (int hin = 0; hin < 2; hin++) {
				shape s = { 3, hin ? 3 : 1, 96, 112, 2, 65 };
				gi_case k = make_case(dev, &s, DG_FMT_F32, fmts[f], &tiles[t], false);
				gh_expect_path(&k.sp, "mma.sync bf16");
				run_all_splits(dev, &k, dg_fmt_name(fmts[f]));
				free_case(&k);
			}
	gh_close(dev);
}

/* The SIMT path (BK 8: 42 K steps at Hin 1): f32 sums of exact products
 * (int8 codes times f32, fused), so one and two splits differ only by the
 * rounding of the sums: each is within (K + 1)·2^-24·Σ|terms| of the exact
 * value (K additions and the scale's multiply). */
Test(gpu_grad, grad_input_split_simt)
{
	static const dg_tile tile = { 64, 64, 8, 2, 2, 2, 0 };
	dg_device *dev = gh_open();

	gh_seed(95);
	for (int hin = 0; hin < 2; hin++) {
		shape s = { 3, hin ? 3 : 1, 96, 112, 2, 65 };
		gi_case k = make_case(dev, &s, DG_FMT_F32, DG_FMT_INT8, &tile, false);
		gh_expect_path(&k.sp, "fp32");
		run_all_splits(dev, &k, "simt");
		float *one = run_split(dev, &k, 1, "simt"), *two = run_split(dev, &k, 2, "simt");
		const double K = (double)(s.H / s.Hin) * s.L;
		for (size_t i = 0; i < k.nx; i++)
			cr_assert(fabs((double)one[i] - two[i]) <= 2 * (K + 1) * 0x1p-24 * k.absum[i] + 1e-30,
				  "grad_x[%zu]: 1 split %g, 2 splits %g", i, one[i], two[i]);
		free(one);
		free(two);
		free_case(&k);
	}
	gh_close(dev);
}

/* Bad input leaves grad_x alone: no workspace, one a byte short (the
 * message names the bytes needed), splits out of range. */
Test(gpu_grad, grad_input_split_bad_input)
{
	dg_device *dev = gh_open();
	static const dg_tile tile = { 0, 0, 0, 0, 0, 0, 0 };
	shape s = { 3, 1, 96, 112, 2, 65 };

	gh_seed(96);
	gi_case k = make_case(dev, &s, DG_FMT_F32, DG_FMT_INT8, &tile, false);
	unsigned char *ff = gh_xmalloc(k.nx * 4), *got = gh_xmalloc(k.nx * 4);
	memset(ff, 0xff, k.nx * 4);
	dg_dptr dx = gh_alloc_ff(dev, k.nx * 4);
	dg_tensor tx = dg_tensor_4d("grad_x", DG_FMT_F32, dx, s.B, s.Hin, s.T, s.E);
	dg_lowrank_grad_input_args a = { .grad = &k.grad, .w = &k.w, .grad_x = &tx, .splits = 4 };
	size_t need = 0;
	cr_assert_eq(dg_lowrank_grad_input_workspace(dev, &k.sp, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(need, 4 * k.nx * 4, "%zu bytes for 4 splits", need);
	dg_workspace ok = gh_workspace(dev, need);
	char bytes[32];
	snprintf(bytes, sizeof(bytes), "%zu bytes", need);
	const dg_workspace bad[3] = { { 0, 0 }, { ok.ptr, need - 1 }, { 0, need } };
	for (int i = 0; i < 3; i++) {
		a.ws = bad[i];
		cr_assert_eq(dg_lowrank_grad_input(dev, &k.sp, &a), DG_ERR_INVALID_ARG, "workspace case %d ran", i);
		const char *m = dg_device_errmsg(dev);
		cr_assert(strstr(m, "dg_lowrank_grad_input") && strstr(m, "ws") && strstr(m, bytes),
			  "workspace case %d: '%s' lacks the call, ws or '%s'", i, m, bytes);
	}
	static const int bad_splits[2] = { 65, -1 };
	a.ws = ok;
	for (int i = 0; i < 2; i++) {
		a.splits = bad_splits[i];
		size_t n = 1;
		cr_assert_eq(dg_lowrank_grad_input_workspace(dev, &k.sp, &a, &n), DG_ERR_INVALID_ARG);
		cr_assert_eq(n, 0, "a refused query sizes nothing");
		cr_assert_eq(dg_lowrank_grad_input(dev, &k.sp, &a), DG_ERR_INVALID_ARG, "splits %d ran",
			     bad_splits[i]);
		const char *m = dg_device_errmsg(dev);
		char want[32];
		snprintf(want, sizeof(want), "splits %d", bad_splits[i]);
		cr_assert(strstr(m, "dg_lowrank_grad_input") && strstr(m, want) && strstr(m, "1 to 64"), "%s", m);
	}
	gh_sync(dev);
	gh_download(dev, got, dx, k.nx * 4);
	gh_expect_bytes("grad_x after refused calls", got, ff, k.nx * 4);
	/* the right workspace runs */
	a.splits = 4;
	cr_assert_eq(dg_lowrank_grad_input(dev, &k.sp, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, dx, k.nx * 4);
	gr_expect_written("grad_x", (const float *)got, k.nx);
	gr_expect_bf16("grad_x, 4 splits", (const float *)got, k.want, k.absum, k.nx, k.c);
	free(ff);
	free(got);
	free_case(&k);
	gh_close(dev);
}

/* ---- the runtime's choice (no device) ---------------------------------------------- */

/* The model's picks where grad.c's comment states them (132 SMs), and a
 * forced count taken as given. */
Test(grad_input_split, picks_at_the_bdh_shape)
{
	int per = 0;
	/* warpgroup 128x128, two blocks an SM (264 slots): the encoder's 64
	 * tiles of 512 K steps in 4 splits of 128 (256 blocks, one round) */
	cr_assert_eq(dg__grad_input_splits(64, 512, 264, 0, &per), 4);
	cr_assert_eq(per, 128);
	/* encoder_v: 256 tiles already fill the slots */
	cr_assert_eq(dg__grad_input_splits(256, 128, 264, 0, &per), 1);
	cr_assert_eq(per, 128);
	/* the mma.sync default 64x128, one block an SM: 128 tiles for 132 */
	cr_assert_eq(dg__grad_input_splits(128, 512, 132, 0, &per), 1);
	/* the old warpgroup 64x128 (two an SM): two splits of 256 */
	cr_assert_eq(dg__grad_input_splits(128, 512, 264, 0, &per), 2);
	cr_assert_eq(per, 256);
	/* a single tile and 8 steps: 2 splits of 4 (the least a split takes) */
	cr_assert_eq(dg__grad_input_splits(1, 8, 264, 0, &per), 2);
	cr_assert_eq(per, 4);
	cr_assert_eq(dg__grad_input_splits(1, 7, 264, 0, &per), 1);
	/* forced: kept, the fifth of 5 over 8 steps (per 2) empty */
	cr_assert_eq(dg__grad_input_splits(64, 8, 264, 5, &per), 5);
	cr_assert_eq(per, 2);
	cr_assert_eq(dg__grad_input_splits(64, 2, 264, 64, &per), 64);
	cr_assert_eq(per, 1);
}

/* Over grids of 1..300 tiles, K of 1..700 steps and 1..600 slots: the
 * choice covers every step once with no empty split (split p sums [p·per,
 * (p+1)·per) ∩ [0, steps)), each split at least 4 steps, at most 64
 * splits, and never a slower model time than one split. */
Test(grad_input_split, choice_invariants)
{
	for (int64_t blocks = 1; blocks <= 300; blocks += 7)
		for (int64_t steps = 1; steps <= 700; steps += 13)
			for (int64_t slots = 1; slots <= 600; slots += 37) {
				int per = 0;
				int s = dg__grad_input_splits(blocks, steps, slots, 0, &per);
				cr_assert(s >= 1 && s <= 64, "%d splits", s);
				cr_assert((int64_t)(s - 1) * per < steps && (int64_t)s * per >= steps,
					  "blocks %lld steps %lld slots %lld: %d splits of %d", (long long)blocks,
					  (long long)steps, (long long)slots, s, per);
				if (s > 1)
					cr_assert_geq(per, 4, "a split of %d steps", per);
				int64_t one = (blocks + slots - 1) / slots * steps;
				int64_t mine = (blocks * s + slots - 1) / slots * per;
				cr_assert_leq(mine, one, "blocks %lld steps %lld slots %lld: %d splits slower",
					      (long long)blocks, (long long)steps, (long long)slots, s);
			}
}
