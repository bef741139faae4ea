/*
 * GPU tests of decoder_gate_bwd (templates/decoder_gate.lua, runtime/ops/
 * gate.c) against its CPU reference (dg_ref_decoder_gate_bwd). Skip
 * without a device (gh_open); fail instead with DRAGON_REQUIRE_GPU=1.
 *
 * The inputs make the GEMM exact up to the order of its f32 sums: grad
 * holds bf16 values (the warpgroup path rounds grad to bf16 as it stages
 * it, which is then exact), w is bf16. So each result is held to the
 * reference's f32 value within one bf16 rounding of the output (2^-8
 * relative, out=bf16; none for f32) plus the reordered sum's bound
 * 2·E·2^-24·Σ_d|grad·w|·|s·y| (or ·|s·x|), element by element:
 *
 *   - both paths (warpgroup on sm_90, fp32 FMA anywhere), act f32 and bf16,
 *     out f32 and bf16, w f32 on the fp32 path;
 *   - ragged shapes: B·T not a multiple of BM, L = 200 (a partial column
 *     tile) and L = 100 (rows that are not whole 8-element vectors: the
 *     scalar epilogue and the element loads of w);
 *   - p = 0 and p = 0.1, two (seed, step, layer): the mask is the gate's;
 *   - every output starts as 0xff bytes (NaN): an unwritten element fails;
 *     a second run gives the same bytes;
 *   - the BDH shape (B 8, T 512, H 4, E 256, L 8192) on sampled rows, timed
 *     (cold L2) against the traffic floor (xs, ys in, dxs, dys out);
 *   - step_at: step s0 and a device word k at step_at give the bytes of
 *     step s0 + k without one (uint32, wrapping past 2^32 too), within the
 *     bounds of the reference at s0 + k, and not step s0's;
 *   - elem0 (a data-parallel rank's rows): a batch's second half run with
 *     elem0 = its first half's elements draws the full batch's masks
 *     there, on both paths, whole rows of vectors and not, an elem0 that
 *     is whole Philox blocks and ones that are not (the warpgroup
 *     epilogue element by element), past 2^32 elements too: within the
 *     bounds of the reference at elem0, the fp32 path the full run's
 *     bytes, and elem0 0 another mask;
 *   - bad calls: an output aliasing an input, p = 1, a wrong format;
 *   - decoder_gate_bwd_ys (ys made in the tile from the encoder_v's codes):
 *     the same bytes as the pair it replaces — lowrank_fwd's ys, then
 *     decoder_gate_bwd on it — at ragged shapes and the BDH shape, timed
 *     there against the pair's decoder_gate_bwd.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/ops.h"
#include "dragon/ref.h"
#include "dragon/rng.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/checks.h"
#include "runtime/ref/ref_ops.h"

typedef struct shape {
	int B, T, H, E, L;
} shape;

typedef struct fmts {
	dg_fmt w, act, out;
	bool wgmma; /* the warpgroup path (sm_90a); else the fp32 tile */
} fmts;

static size_t esz(dg_fmt f)
{
	return f == DG_FMT_BF16 ? 2 : 4;
}

static float at(dg_fmt f, const void *p, size_t i)
{
	return f == DG_FMT_BF16 ? dg_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static bool device_sm90(dg_device *dev)
{
	dg_device_info di;
	return dg_device_info_get(dev, &di) == DG_OK && di.sm == 90;
}

static dg_spec spec_of(const shape *sh, const fmts *f, int dev_sm)
{
	dg_spec s = dg_test_spec_sized(DG_OP_DECODER_GATE_BWD, sh->H, sh->E, sh->L);
	s.weight = f->w;
	s.act = f->act;
	s.out = f->out;
	if (f->wgmma) {
		s.arch = 90;
		s.arch_specific = true;
	} else {
		s.arch = dev_sm;
		dg_tile t = { .bm = 64, .bn = 64, .bk = 32, .wm = 4, .wn = 2, .stages = 1 };
		s.tile = t;
	}
	dg_spec_normalize(&s);
	return s;
}

/* n values in [-1, 1) that bf16 holds exactly, as f32 or bf16 storage. */
static void *rand_exact(dg_fmt f, size_t n)
{
	void *p = gh_xmalloc(n * esz(f) + 1);
	for (size_t i = 0; i < n; i++) {
		uint16_t b = dg_f32_to_bf16(gh_uniform(-1.0f, 1.0f));
		if (f == DG_FMT_BF16)
			((uint16_t *)p)[i] = b;
		else
			((float *)p)[i] = dg_bf16_to_f32(b);
	}
	return p;
}

typedef struct run {
	dg_device *dev;
	dg_spec spec;
	dg_decoder_gate_bwd_args a;
} run;

static dg_status call(void *u)
{
	run *r = u;
	return dg_decoder_gate_bwd(r->dev, &r->spec, &r->a);
}

/*
 * Rows `rows` (indices m = b·T + t; NULL: all) of the GPU's dxs and dys
 * against the reference computed here for those rows (double sums, then
 * the reference's f32 gate): within one output rounding and the sums'
 * reordering, element by element.
 */
static void check_rows_at(const char *what, const shape *sh, const fmts *f, float p, uint64_t seed,
			  uint32_t step, uint32_t layer, uint64_t elem0, const float *grad, const void *w,
			  const void *xs, const void *ys, const void *gdxs, const void *gdys, const int *rows,
			  int nrows)
{
	const int H = sh->H, T = sh->T, E = sh->E, L = sh->L, HL = H * L;
	const float scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
	const double ulp = f->out == DG_FMT_BF16 ? 1.0 / 256 : 0.0;
	int bad = 0;
	for (int ri = 0; ri < nrows; ri++) {
		int m = rows ? rows[ri] : ri, b = m / T, t = m % T;
		for (int h = 0; h < H; h++)
			for (int l = 0; l < L; l++) {
				double sum = 0, abs = 0;
				for (int d = 0; d < E; d++) {
					double v = (double)grad[(size_t)m * E + d] *
						   at(f->w, w, (size_t)d * HL + (size_t)h * L + l);
					sum += v;
					abs += fabs(v);
				}
				size_t i = (((size_t)b * H + h) * T + t) * L + l;
				bool keep = dg_dropout_keep(seed, step, layer, elem0 + i, p);
				float g = keep ? (float)sum * scale : 0.0f;
				float x = at(f->act, xs, i), y = at(f->act, ys, i);
				float wx = g * y, wy = y > 0.0f ? g * x : 0.0f;
				double sb = keep ? 2.0 * E * 0x1p-24 * abs * scale : 0.0;
				float gx = at(f->out, gdxs, i), gy = at(f->out, gdys, i);
				double ex = ulp * fabs(wx) + sb * fabs(y) + 1e-30;
				double ey = ulp * fabs(wy) + (y > 0.0f ? sb * fabs(x) : 0.0) + 1e-30;
				if (!(fabs((double)gx - wx) <= ex) || !(fabs((double)gy - wy) <= ey)) {
					if (bad++ < 5)
						fprintf(stderr,
							"%s: (b %d, h %d, t %d, l %d): dxs %g want %g (bound %g), dys %g want %g (bound %g)\n",
							what, b, h, t, l, (double)gx, (double)wx, ex, (double)gy,
							(double)wy, ey);
				}
			}
	}
	cr_assert_eq(bad, 0, "%s: %d elements outside their bounds", what, bad);
}

static void check_rows(const char *what, const shape *sh, const fmts *f, float p, uint64_t seed,
		       uint32_t step, uint32_t layer, const float *grad, const void *w, const void *xs,
		       const void *ys, const void *gdxs, const void *gdys, const int *rows, int nrows)
{
	check_rows_at(what, sh, f, p, seed, step, layer, 0, grad, w, xs, ys, gdxs, gdys, rows, nrows);
}

static void check_case(dg_device *dev, const shape *sh, const fmts *f, float p, uint64_t seed,
		       uint32_t step, uint32_t layer)
{
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	char what[200];
	snprintf(what, sizeof(what), "decoder_gate_bwd %s B%d T%d H%d E%d L%d w %s act %s out %s p=%g",
		 f->wgmma ? "wgmma" : "fp32", sh->B, sh->T, sh->H, sh->E, sh->L, dg_fmt_name(f->w),
		 dg_fmt_name(f->act), dg_fmt_name(f->out), (double)p);
	const int M = sh->B * sh->T;
	const size_t n = (size_t)M * sh->H * sh->L, nw = (size_t)sh->E * sh->H * sh->L;
	float *grad = rand_exact(DG_FMT_F32, (size_t)M * sh->E);
	void *w = rand_exact(f->w, nw), *xs = gh_rand_storage(f->act, n, NULL),
	     *ys = gh_rand_storage(f->act, n, NULL);
	size_t ab = n * esz(f->act), ob = n * esz(f->out);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32,
				    gh_upload(dev, grad, (size_t)M * sh->E * 4), sh->B, 1, sh->T, sh->E);
	int64_t wsh[2] = { sh->E, (int64_t)sh->H * sh->L };
	dg_tensor tw = dg_tensor_make("w", f->w, gh_upload(dev, w, nw * esz(f->w)), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", f->act, gh_upload(dev, xs, ab), sh->B, sh->H, sh->T, sh->L);
	dg_tensor ty = dg_tensor_4d("ys", f->act, gh_upload(dev, ys, ab), sh->B, sh->H, sh->T, sh->L);
	dg_tensor tdx = dg_tensor_4d("dxs", f->out, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor tdy = dg_tensor_4d("dys", f->out, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	run r = { dev, spec_of(sh, f, di.sm),
		  { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &tdx, .dys = &tdy, .p = p,
		    .seed = seed, .step = step, .layer = layer } };
	cr_assert_eq(call(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	void *gx = gh_xmalloc(ob), *gy = gh_xmalloc(ob), *gx2 = gh_xmalloc(ob), *gy2 = gh_xmalloc(ob);
	gh_download(dev, gx, tdx.data, ob);
	gh_download(dev, gy, tdy.data, ob);
	cr_assert_eq(call(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	gh_download(dev, gx2, tdx.data, ob);
	gh_download(dev, gy2, tdy.data, ob);
	cr_assert(memcmp(gx, gx2, ob) == 0 && memcmp(gy, gy2, ob) == 0, "%s: a second run differs", what);
	check_rows(what, sh, f, p, seed, step, layer, grad, w, xs, ys, gx, gy, NULL, M);
	/* and the op's reference agrees with the one here at the first row */
	void *rx = gh_xmalloc(ob), *ry = gh_xmalloc(ob);
	cr_assert_eq(dg_ref_decoder_gate_bwd(&r.spec, grad, w, xs, ys, sh->B, sh->T, p, seed, step, layer, 0,
					     rx, ry), DG_OK, "%s: the reference", what);
	check_rows(what, sh, f, p, seed, step, layer, grad, w, xs, ys, rx, ry, NULL, M);
	free(grad), free(w), free(xs), free(ys), free(gx), free(gy), free(gx2), free(gy2);
	free(rx), free(ry);
}

Test(gpu_decoder_gate, small_shapes_both_paths)
{
	dg_device *dev = gh_open();
	gh_seed(0xdec6a7e);
	bool wg = device_sm90(dev);
	if (!wg)
		printf("decoder_gate_bwd: not an sm_90 device: the warpgroup path is not run\n");
	static const shape shapes[] = { { 2, 37, 2, 64, 200 }, { 1, 130, 3, 128, 100 }, { 2, 64, 1, 256, 256 } };
	static const fmts fs[] = {
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, true },
		{ DG_FMT_BF16, DG_FMT_F32, DG_FMT_F32, true },
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, false },
		{ DG_FMT_F32, DG_FMT_F32, DG_FMT_BF16, false },
	};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (size_t j = 0; j < sizeof(fs) / sizeof(fs[0]); j++) {
			if (fs[j].wgmma && !wg)
				continue;
			check_case(dev, &shapes[i], &fs[j], 0.0f, 0, 0, 0);
			check_case(dev, &shapes[i], &fs[j], 0.1f, 0x5eed, 7, 3);
		}
	gh_close(dev);
}

Test(gpu_decoder_gate, bdh_shape_sampled)
{
	dg_device *dev = gh_open();
	gh_seed(0xbd4);
	if (!device_sm90(dev))
		printf("decoder_gate_bwd: not an sm_90 device: the BDH shape runs the fp32 path\n");
	shape sh = { 8, 512, 4, 256, 8192 };
	fmts f = { DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, device_sm90(dev) };
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	const int M = sh.B * sh.T;
	const size_t n = (size_t)M * sh.H * sh.L, nw = (size_t)sh.E * sh.H * sh.L;
	float *grad = rand_exact(DG_FMT_F32, (size_t)M * sh.E);
	void *w = rand_exact(f.w, nw), *xs = gh_rand_storage(f.act, n, NULL),
	     *ys = gh_rand_storage(f.act, n, NULL);
	size_t ab = n * 2, ob = n * 2;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, grad, (size_t)M * sh.E * 4), sh.B, 1,
				    sh.T, sh.E);
	int64_t wsh[2] = { sh.E, (int64_t)sh.H * sh.L };
	dg_tensor tw = dg_tensor_make("w", f.w, gh_upload(dev, w, nw * 2), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", f.act, gh_upload(dev, xs, ab), sh.B, sh.H, sh.T, sh.L);
	dg_tensor ty = dg_tensor_4d("ys", f.act, gh_upload(dev, ys, ab), sh.B, sh.H, sh.T, sh.L);
	dg_tensor tdx = dg_tensor_4d("dxs", f.out, gh_alloc_ff(dev, ob), sh.B, sh.H, sh.T, sh.L);
	dg_tensor tdy = dg_tensor_4d("dys", f.out, gh_alloc_ff(dev, ob), sh.B, sh.H, sh.T, sh.L);
	run r = { dev, spec_of(&sh, &f, di.sm),
		  { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &tdx, .dys = &tdy, .p = 0.1f,
		    .seed = 99, .step = 5, .layer = 2 } };
	cr_assert_eq(call(&r), DG_OK, "%s", dg_device_errmsg(dev));
	void *gx = gh_xmalloc(ob), *gy = gh_xmalloc(ob);
	gh_download(dev, gx, tdx.data, ob);
	gh_download(dev, gy, tdy.data, ob);
	int rows[12];
	for (int i = 0; i < 12; i++)
		rows[i] = i < 2 ? (i ? M - 1 : 0) : gh_int(0, M - 1);
	check_rows("decoder_gate_bwd bdh", &sh, &f, 0.1f, 99, 5, 2, grad, w, xs, ys, gx, gy, rows, 12);

	dg_timer *tm;
	dg_timing tr;
	cr_assert_eq(dg_timer_create(dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(dev));
	dg_timer_opts o = { .reps = 10 };
	cr_assert_eq(dg_timer_run(tm, &o, call, &r, &tr), DG_OK, "%s", dg_device_errmsg(dev));
	dg_timer_destroy(tm);
	double bytes = 4.0 * (double)n * 2, flop = 2.0 * M * sh.E * (double)sh.H * sh.L;
	printf("bdh decoder_gate_bwd (%s) %9.1f us  %6.2f TB/s of its traffic (xs, ys, dxs, dys)  %6.1f TFLOP/s\n",
	       f.wgmma ? "wgmma" : "fp32", tr.median_us, bytes / tr.median_us * 1e-6,
	       flop / tr.median_us * 1e-6);
	fflush(stdout);
	free(grad), free(w), free(xs), free(ys), free(gx), free(gy);
	gh_close(dev);
}

/*
 * The persistent form by TMA (templates/decoder_gate_tma.lua; the tile of
 * 5 stages the model names, DG__DEC_GATE_TMA_TILE) against the ring form
 * (the default tile), byte for byte: the same MMAs on the same bf16
 * operands and the gate's roundings (the gradient here is not bf16-exact,
 * so the cast's rounding counts too). The BDH shape (timed, both forms,
 * the same run: the figure the model's step gains), ragged shapes (T and
 * L not whole tiles, L not whole subtiles), the 1B model's heads and embd
 * at a short batch, dropout on and off, and an elem0 that is not whole
 * Philox blocks (each element drawn by itself).
 */
static void tma_case(dg_device *dev, const shape *sh, float p, uint64_t elem0, bool timed)
{
	char what[200];
	snprintf(what, sizeof(what), "decoder_gate_bwd persistent B%d T%d H%d E%d L%d p=%g elem0 %llu", sh->B, sh->T,
		 sh->H, sh->E, sh->L, (double)p, (unsigned long long)elem0);
	const int M = sh->B * sh->T;
	const size_t n = (size_t)M * sh->H * sh->L, nw = (size_t)sh->E * sh->H * sh->L, ng = (size_t)M * sh->E;
	float *grad = gh_xmalloc(ng * 4);
	for (size_t i = 0; i < ng; i++)
		grad[i] = gh_uniform(-1.0f, 1.0f);
	void *w = rand_exact(DG_FMT_BF16, nw), *xs = gh_rand_storage(DG_FMT_BF16, n, NULL),
	     *ys = gh_rand_storage(DG_FMT_BF16, n, NULL);
	const size_t ob = n * 2;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, grad, ng * 4), sh->B, 1, sh->T, sh->E);
	int64_t wsh[2] = { sh->E, (int64_t)sh->H * sh->L };
	dg_tensor tw = dg_tensor_make("w", DG_FMT_BF16, gh_upload(dev, w, nw * 2), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", DG_FMT_BF16, gh_upload(dev, xs, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor ty = dg_tensor_4d("ys", DG_FMT_BF16, gh_upload(dev, ys, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor tdx = dg_tensor_4d("dxs", DG_FMT_BF16, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor tdy = dg_tensor_4d("dys", DG_FMT_BF16, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor rdx = dg_tensor_4d("dxs", DG_FMT_BF16, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	dg_tensor rdy = dg_tensor_4d("dys", DG_FMT_BF16, gh_alloc_ff(dev, ob), sh->B, sh->H, sh->T, sh->L);
	fmts f = { DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, true };
	run ring = { dev, spec_of(sh, &f, 90),
		     { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &rdx, .dys = &rdy, .p = p, .seed = 77,
		       .step = 4, .layer = 1, .elem0 = elem0 } };
	run tma = ring;
	tma.a.dxs = &tdx, tma.a.dys = &tdy;
	tma.spec.tile = (dg_tile){ 128, 128, 64, 8, 1, 5, 0 };
	dg_prepared *pp = NULL;
	cr_assert_eq(dg_prepare(dev, &tma.spec, &tma.a, &pp), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	const size_t need = dg_prepared_workspace(pp);
	dg_prepared_destroy(pp);
	cr_assert_eq(need, ((size_t)M * sh->E * 2 + 255) / 256 * 256, "%s: the copy's bytes", what);
	/* without its workspace: refused, naming it */
	cr_assert_neq(call(&tma), DG_OK, "%s: ran without its workspace", what);
	cr_assert(strstr(dg_device_errmsg(dev), "ws"), "%s: %s", what, dg_device_errmsg(dev));
	tma.a.ws.ptr = gh_alloc_ff(dev, need), tma.a.ws.bytes = need;
	cr_assert_eq(call(&ring), DG_OK, "%s: ring: %s", what, dg_device_errmsg(dev));
	cr_assert_eq(call(&tma), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
	void *gx = gh_xmalloc(ob), *gy = gh_xmalloc(ob), *wx = gh_xmalloc(ob), *wy = gh_xmalloc(ob);
	gh_download(dev, gx, tdx.data, ob);
	gh_download(dev, gy, tdy.data, ob);
	gh_download(dev, wx, rdx.data, ob);
	gh_download(dev, wy, rdy.data, ob);
	size_t dx = 0, dy = 0;
	for (size_t i = 0; i < n; i++)
		dx += ((uint16_t *)gx)[i] != ((uint16_t *)wx)[i], dy += ((uint16_t *)gy)[i] != ((uint16_t *)wy)[i];
	cr_assert(dx == 0 && dy == 0, "%s: %zu of dxs and %zu of dys differ from the ring form's", what, dx, dy);
	if (timed) {
		dg_timer *tm;
		dg_timing tr, tt;
		cr_assert_eq(dg_timer_create(dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_opts o = { .reps = 20 };
		cr_assert_eq(dg_timer_run(tm, &o, call, &ring, &tr), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_timer_run(tm, &o, call, &tma, &tt), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_destroy(tm);
		const double bytes = 4.0 * (double)n * 2;
		printf("%s: ring %9.1f us (%5.2f TB/s), persistent %9.1f us (%5.2f TB/s of xs, ys, dxs, dys)\n", what,
		       tr.median_us, bytes / tr.median_us * 1e-6, tt.median_us, bytes / tt.median_us * 1e-6);
		fflush(stdout);
	}
	free(grad), free(w), free(xs), free(ys), free(gx), free(gy), free(wx), free(wy);
}

Test(gpu_decoder_gate, persistent_form_is_the_ring_form)
{
	dg_device *dev = gh_open();
	gh_seed(0x7a4);
	if (!device_sm90(dev)) {
		printf("decoder_gate_bwd: not an sm_90 device: the persistent form is not run\n");
		gh_close(dev);
		return;
	}
	static const shape shapes[] = { { 2, 136, 2, 128, 200 }, { 1, 72, 3, 64, 136 }, { 2, 128, 16, 1280, 256 } };
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		tma_case(dev, &shapes[i], 0.1f, 0, false);
		tma_case(dev, &shapes[i], 0.0f, 8, false);
	}
	tma_case(dev, &shapes[0], 0.1f, 3, false);
	shape bdh = { 8, 512, 4, 256, 8192 };
	tma_case(dev, &bdh, 0.1f, 0, true);
	gh_close(dev);
}

Test(gpu_decoder_gate, step_at_adds_the_device_step)
{
	dg_device *dev = gh_open();
	gh_seed(0x57e9);
	shape sh = { 2, 37, 2, 64, 200 };
	fmts f = { DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, false }; /* the fp32 path: any device */
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	const int M = sh.B * sh.T;
	const size_t n = (size_t)M * sh.H * sh.L, nw = (size_t)sh.E * sh.H * sh.L, ob = n * 2;
	float *grad = rand_exact(DG_FMT_F32, (size_t)M * sh.E);
	void *w = rand_exact(f.w, nw), *xs = gh_rand_storage(f.act, n, NULL),
	     *ys = gh_rand_storage(f.act, n, NULL);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, grad, (size_t)M * sh.E * 4), sh.B, 1,
				    sh.T, sh.E);
	int64_t wsh[2] = { sh.E, (int64_t)sh.H * sh.L };
	dg_tensor tw = dg_tensor_make("w", f.w, gh_upload(dev, w, nw * 2), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", f.act, gh_upload(dev, xs, n * 2), sh.B, sh.H, sh.T, sh.L);
	dg_tensor ty = dg_tensor_4d("ys", f.act, gh_upload(dev, ys, n * 2), sh.B, sh.H, sh.T, sh.L);
	dg_tensor tdx = dg_tensor_4d("dxs", f.out, gh_alloc_ff(dev, ob), sh.B, sh.H, sh.T, sh.L);
	dg_tensor tdy = dg_tensor_4d("dys", f.out, gh_alloc_ff(dev, ob), sh.B, sh.H, sh.T, sh.L);
	dg_dptr at = gh_alloc(dev, sizeof(uint32_t));
	run r = { dev, spec_of(&sh, &f, di.sm),
		  { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &tdx, .dys = &tdy, .p = 0.1f,
		    .seed = 0x5eed, .layer = 3 } };
	void *gx = gh_xmalloc(ob), *gy = gh_xmalloc(ob), *px = gh_xmalloc(ob), *py = gh_xmalloc(ob);
	static const uint32_t cases[][2] = { { 7, 5 }, { 0xfffffff0u, 0x20u } };
	for (int c = 0; c < 2; c++) {
		const uint32_t s0 = cases[c][0], k = cases[c][1], sum = s0 + k;
		char what[96];
		snprintf(what, sizeof(what), "decoder_gate_bwd step %u + *step_at %u", s0, k);
		cr_assert_eq(dg_memcpy_htod(dev, at, &k, sizeof(k)), DG_OK, "%s", dg_device_errmsg(dev));
		r.a.step = s0;
		r.a.step_at = at;
		cr_assert_eq(call(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, gx, tdx.data, ob);
		gh_download(dev, gy, tdy.data, ob);
		check_rows(what, &sh, &f, 0.1f, 0x5eed, sum, 3, grad, w, xs, ys, gx, gy, NULL, M);
		r.a.step = sum;
		r.a.step_at = 0;
		cr_assert_eq(call(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, px, tdx.data, ob);
		gh_download(dev, py, tdy.data, ob);
		cr_assert(memcmp(px, gx, ob) == 0 && memcmp(py, gy, ob) == 0, "%s: not step %u's bytes", what, sum);
		r.a.step = s0;
		cr_assert_eq(call(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));
		gh_download(dev, px, tdx.data, ob);
		cr_assert_neq(memcmp(px, gx, ob), 0, "%s: step %u's mask: step_at was not read", what, s0);
	}
	free(grad), free(w), free(xs), free(ys), free(gx), free(gy), free(px), free(py);
	gh_close(dev);
}

Test(gpu_decoder_gate, bad_calls)
{
	dg_device *dev = gh_open();
	shape sh = { 1, 16, 2, 64, 64 };
	fmts f = { DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, false };
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	size_t n = (size_t)sh.B * sh.T * sh.H * sh.L;
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_alloc(dev, (size_t)sh.T * sh.E * 4), 1, 1, sh.T, sh.E);
	int64_t wsh[2] = { sh.E, (int64_t)sh.H * sh.L };
	dg_tensor tw = dg_tensor_make("w", DG_FMT_BF16, gh_alloc(dev, (size_t)sh.E * sh.H * sh.L * 2), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", DG_FMT_BF16, gh_alloc(dev, n * 2), 1, sh.H, sh.T, sh.L);
	dg_tensor ty = dg_tensor_4d("ys", DG_FMT_BF16, gh_alloc(dev, n * 2), 1, sh.H, sh.T, sh.L);
	dg_tensor tdx = dg_tensor_4d("dxs", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), 1, sh.H, sh.T, sh.L);
	dg_tensor tdy = dg_tensor_4d("dys", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), 1, sh.H, sh.T, sh.L);
	dg_spec s = spec_of(&sh, &f, di.sm);
	dg_decoder_gate_bwd_args a = { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &tdx, .dys = &ty };
	cr_assert_eq(dg_decoder_gate_bwd(dev, &s, &a), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "must not alias ys"), "%s", dg_device_errmsg(dev));
	a.dys = &tdy;
	a.p = 1.0f;
	cr_assert_eq(dg_decoder_gate_bwd(dev, &s, &a), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "drop probability"), "%s", dg_device_errmsg(dev));
	a.p = 0.0f;
	dg_tensor tx32 = dg_tensor_4d("xs", DG_FMT_F32, tx.data, 1, sh.H, sh.T, sh.L);
	a.xs = &tx32;
	cr_assert_neq(dg_decoder_gate_bwd(dev, &s, &a), DG_OK, "an f32 xs under act=bf16 ran");
	/* nothing was written */
	uint16_t *back = gh_xmalloc(n * 2);
	gh_download(dev, back, tdy.data, n * 2);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(back[i], 0xffff, "dys[%zu] written by a refused call", i);
	free(back);
	gh_close(dev);
}

/* One run of rows rows0 .. of the host batch (grad, xs, ys of sh) as a
 * batch of its own of b rows of T (b·T of sh's), elem0 its first element's
 * draw: dxs and dys (malloc'd) into *gx, *gy. */
static void run_rows(dg_device *dev, const shape *sh, const fmts *f, int b, int b0, float p, uint64_t seed,
		     uint32_t step, uint32_t layer, uint64_t elem0, const float *grad, const void *w,
		     const void *xs, const void *ys, void **gx, void **gy)
{
	dg_device_info di;
	cr_assert_eq(dg_device_info_get(dev, &di), DG_OK);
	shape hs = *sh;
	hs.B = b;
	const size_t per = (size_t)sh->H * sh->T * sh->L, n = (size_t)b * per, nw = (size_t)sh->E * sh->H * sh->L;
	const size_t ab = n * esz(f->act), ob = n * esz(f->out), off = (size_t)b0 * per * esz(f->act);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32,
				    gh_upload(dev, grad + (size_t)b0 * sh->T * sh->E, (size_t)b * sh->T * sh->E * 4), b,
				    1, sh->T, sh->E);
	int64_t wsh[2] = { sh->E, (int64_t)sh->H * sh->L };
	dg_tensor tw = dg_tensor_make("w", f->w, gh_upload(dev, w, nw * esz(f->w)), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", f->act, gh_upload(dev, (const char *)xs + off, ab), b, sh->H, sh->T, sh->L);
	dg_tensor ty = dg_tensor_4d("ys", f->act, gh_upload(dev, (const char *)ys + off, ab), b, sh->H, sh->T, sh->L);
	dg_tensor tdx = dg_tensor_4d("dxs", f->out, gh_alloc_ff(dev, ob), b, sh->H, sh->T, sh->L);
	dg_tensor tdy = dg_tensor_4d("dys", f->out, gh_alloc_ff(dev, ob), b, sh->H, sh->T, sh->L);
	run r = { dev, spec_of(&hs, f, di.sm),
		  { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &tdx, .dys = &tdy, .p = p,
		    .seed = seed, .step = step, .layer = layer, .elem0 = elem0 } };
	cr_assert_eq(call(&r), DG_OK, "decoder_gate_bwd b%d elem0 %llu: %s", b, (unsigned long long)elem0,
		     dg_device_errmsg(dev));
	*gx = gh_xmalloc(ob);
	*gy = gh_xmalloc(ob);
	gh_download(dev, *gx, tdx.data, ob);
	gh_download(dev, *gy, tdy.data, ob);
}

Test(gpu_decoder_gate, elem0_draws_the_global_batchs_masks)
{
	dg_device *dev = gh_open();
	gh_seed(0xe1e0);
	bool wg = device_sm90(dev);
	/* L 200: whole rows of vectors; L 100: the scalar epilogue */
	static const shape shapes[] = { { 4, 37, 2, 64, 200 }, { 2, 130, 3, 128, 100 } };
	static const fmts fs[] = {
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, true },
		{ DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, false },
		{ DG_FMT_F32, DG_FMT_F32, DG_FMT_F32, false },
	};
	const float p = 0.1f;
	const uint64_t seed = 0x5eed;
	const uint32_t step = 7, layer = 3;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (size_t j = 0; j < sizeof(fs) / sizeof(fs[0]); j++) {
			const shape *sh = &shapes[i];
			const fmts *f = &fs[j];
			if (f->wgmma && !wg)
				continue;
			char what[200];
			snprintf(what, sizeof(what), "decoder_gate_bwd %s B%d T%d H%d L%d act %s out %s",
				 f->wgmma ? "wgmma" : "fp32", sh->B, sh->T, sh->H, sh->L, dg_fmt_name(f->act),
				 dg_fmt_name(f->out));
			const int hb = sh->B / 2, M = sh->B * sh->T;
			const size_t per = (size_t)sh->H * sh->T * sh->L, n = (size_t)sh->B * per;
			const size_t hob = (size_t)hb * per * esz(f->out);
			float *grad = rand_exact(DG_FMT_F32, (size_t)M * sh->E);
			void *w = rand_exact(f->w, (size_t)sh->E * sh->H * sh->L);
			void *xs = gh_rand_storage(f->act, n, NULL), *ys = gh_rand_storage(f->act, n, NULL);
			void *fx, *fy, *hx, *hy, *zx, *zy;
			run_rows(dev, sh, f, sh->B, 0, p, seed, step, layer, 0, grad, w, xs, ys, &fx, &fy);
			run_rows(dev, sh, f, hb, hb, p, seed, step, layer, (uint64_t)hb * per, grad, w, xs, ys, &hx, &hy);
			/* the half's inputs: the full batch's from row hb on */
			const size_t aoff = (size_t)hb * per * esz(f->act);
			shape hs = *sh;
			hs.B = hb;
			check_rows_at(what, &hs, f, p, seed, step, layer, (uint64_t)hb * per,
				      grad + (size_t)hb * sh->T * sh->E, w, (const char *)xs + aoff,
				      (const char *)ys + aoff, hx, hy, NULL, hb * sh->T);
			if (!f->wgmma) /* one FMA chain an output, whatever its row: the same bytes */
				cr_assert(memcmp(hx, (char *)fx + hob, hob) == 0 && memcmp(hy, (char *)fy + hob, hob) == 0,
					  "%s: the second half is not the full batch's", what);
			run_rows(dev, sh, f, hb, hb, p, seed, step, layer, 0, grad, w, xs, ys, &zx, &zy);
			cr_assert_neq(memcmp(zx, (char *)fx + hob, hob), 0, "%s: elem0 0 drew the global masks", what);
			free(hx), free(hy), free(zx), free(zy);
			/* elem0 not whole Philox blocks, and past 2^32 elements */
			static const uint64_t offs[] = { 13, 6, (1ull << 34) + 8, (1ull << 34) + 2 };
			for (size_t k = 0; k < sizeof(offs) / sizeof(offs[0]); k++) {
				char w2[240];
				snprintf(w2, sizeof(w2), "%s elem0 %llu", what, (unsigned long long)offs[k]);
				run_rows(dev, sh, f, sh->B, 0, p, seed, step, layer, offs[k], grad, w, xs, ys, &hx, &hy);
				check_rows_at(w2, sh, f, p, seed, step, layer, offs[k], grad, w, xs, ys, hx, hy, NULL, M);
				free(hx), free(hy);
			}
			free(grad), free(w), free(xs), free(ys), free(fx), free(fy);
		}
	gh_close(dev);
}

/* ---- decoder_gate_bwd_ys -------------------------------------------------------- */

typedef struct ys_run {
	dg_device *dev;
	dg_spec spec;
	dg_decoder_gate_bwd_ys_args a;
} ys_run;

static dg_status call_ys(void *u)
{
	ys_run *r = u;
	return dg_decoder_gate_bwd_ys(r->dev, &r->spec, &r->a);
}

/* n random scales in [lo, 2·lo] on the device */
static dg_dptr rand_scales(dg_device *dev, size_t n, float lo)
{
	float *s = gh_xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		s[i] = gh_uniform(lo, 2.0f * lo);
	dg_dptr d = gh_upload(dev, s, n * sizeof(float));
	free(s);
	return d;
}

/* The fused op against lowrank_fwd's ys then decoder_gate_bwd (both on
 * sm_90a), byte for byte; timed (BDH: cold L2) beside the pair's second
 * op when `timed`. */
static void ys_case(dg_device *dev, const shape *sh, float p, bool timed)
{
	const int B = sh->B, T = sh->T, H = sh->H, E = sh->E, L = sh->L, M = B * T;
	const size_t n = (size_t)M * H * L, nw = (size_t)E * H * L, na = (size_t)M * H * E, ne = (size_t)H * L * E;
	const float thr = 0.0625f;
	char what[160];
	snprintf(what, sizeof(what), "decoder_gate_bwd_ys B%d T%d H%d E%d L%d p=%g", B, T, H, E, L, (double)p);
	float *grad = rand_exact(DG_FMT_F32, (size_t)M * E);
	void *w = rand_exact(DG_FMT_BF16, nw), *xs = gh_rand_storage(DG_FMT_BF16, n, NULL);
	size_t ab, eb;
	void *aq = gh_rand_storage(DG_FMT_INT8, na, &ab), *ev = gh_rand_storage(DG_FMT_INT8, ne, &eb);
	dg_tensor tg = dg_tensor_4d("grad", DG_FMT_F32, gh_upload(dev, grad, (size_t)M * E * 4), B, 1, T, E);
	int64_t wsh[2] = { E, (int64_t)H * L };
	dg_tensor tw = dg_tensor_make("w", DG_FMT_BF16, gh_upload(dev, w, nw * 2), 2, wsh);
	dg_tensor tx = dg_tensor_4d("xs", DG_FMT_BF16, gh_upload(dev, xs, n * 2), B, H, T, L);
	dg_tensor ta = dg_tensor_4d("aq", DG_FMT_INT8, gh_upload(dev, aq, ab), B, H, T, E);
	dg_tensor te = dg_tensor_3d("ev", DG_FMT_INT8, gh_upload(dev, ev, eb), H, L, E);
	/* y of order 1: |acc| ~ 4e4 · sqrt(E / 256) for codes of ±127 */
	ta.scale = rand_scales(dev, (size_t)M * H, 2e-3f);
	te.scale = rand_scales(dev, (size_t)H * L, 6e-3f);
	dg_tensor ty = dg_tensor_4d("ys", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), B, H, T, L);
	dg_tensor d0x = dg_tensor_4d("dxs", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), B, H, T, L);
	dg_tensor d0y = dg_tensor_4d("dys", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), B, H, T, L);
	dg_tensor d1x = dg_tensor_4d("dxs", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), B, H, T, L);
	dg_tensor d1y = dg_tensor_4d("dys", DG_FMT_BF16, gh_alloc_ff(dev, n * 2), B, H, T, L);

	dg_spec lr = dg_test_spec_sized(DG_OP_LOWRANK_FWD, H, E, L);
	lr.in_heads = H;
	lr.act = DG_FMT_INT8, lr.weight = DG_FMT_INT8, lr.out = DG_FMT_BF16;
	lr.ascale = DG_SCALE_TOKEN, lr.wscale = DG_SCALE_CHANNEL;
	lr.relu = true, lr.relu_thr = thr;
	lr.arch = 90, lr.arch_specific = true;
	dg_spec_normalize(&lr);
	dg_lowrank_fwd_args la = { .x = &ta, .w = &te, .out = &ty };
	cr_assert_eq(dg_lowrank_fwd(dev, &lr, &la), DG_OK, "%s: the projection: %s", what, dg_device_errmsg(dev));
	fmts f = { DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, true };
	run pair = { dev, spec_of(sh, &f, 90),
		     { .grad = &tg, .w = &tw, .xs = &tx, .ys = &ty, .dxs = &d0x, .dys = &d0y, .p = p, .seed = 31,
		       .step = 4, .layer = 1 } };
	cr_assert_eq(call(&pair), DG_OK, "%s: the pair's decoder_gate_bwd: %s", what, dg_device_errmsg(dev));

	ys_run r = { dev, dg_test_spec_sized(DG_OP_DECODER_GATE_BWD_YS, H, E, L),
		     { .grad = &tg, .w = &tw, .xs = &tx, .aq = &ta, .ev = &te, .dxs = &d1x, .dys = &d1y, .p = p,
		       .seed = 31, .step = 4, .layer = 1 } };
	r.spec.act = DG_FMT_INT8, r.spec.weight = DG_FMT_INT8, r.spec.src = DG_FMT_BF16, r.spec.out = DG_FMT_BF16;
	r.spec.ascale = DG_SCALE_TOKEN, r.spec.wscale = DG_SCALE_CHANNEL;
	r.spec.relu = true, r.spec.relu_thr = thr;
	r.spec.arch = 90, r.spec.arch_specific = true;
	dg_spec_normalize(&r.spec);
	cr_assert_eq(call_ys(&r), DG_OK, "%s: %s", what, dg_device_errmsg(dev));

	const size_t ob = n * 2;
	uint16_t *ysh = gh_xmalloc(ob), *ax = gh_xmalloc(ob), *ay = gh_xmalloc(ob), *bx = gh_xmalloc(ob),
		 *by = gh_xmalloc(ob);
	gh_download(dev, ysh, ty.data, ob);
	gh_download(dev, ax, d0x.data, ob);
	gh_download(dev, ay, d0y.data, ob);
	gh_download(dev, bx, d1x.data, ob);
	gh_download(dev, by, d1y.data, ob);
	size_t pos = 0;
	for (size_t i = 0; i < n; i++)
		pos += ysh[i] != 0 && !(ysh[i] & 0x8000);
	cr_assert(pos > n / 5 && pos < n - n / 5, "%s: ys has %zu positive of %zu: the ReLU must cut some", what,
		  pos, n);
	size_t bad = 0, first = n;
	for (size_t i = 0; i < n; i++)
		if (ax[i] != bx[i] || ay[i] != by[i]) {
			if (!bad)
				first = i;
			bad++;
		}
	cr_assert_eq(bad, 0, "%s: %zu elements differ from the pair's, the first at %zu: dxs %04x / %04x, dys %04x / %04x",
		     what, bad, first, first < n ? ax[first] : 0, first < n ? bx[first] : 0, first < n ? ay[first] : 0,
		     first < n ? by[first] : 0);
	if (timed) {
		dg_timer *tm;
		dg_timing t0, t1;
		cr_assert_eq(dg_timer_create(dev, 0, &tm), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_opts o = { .reps = 10 };
		cr_assert_eq(dg_timer_run(tm, &o, call, &pair, &t0), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_timer_run(tm, &o, call_ys, &r, &t1), DG_OK, "%s", dg_device_errmsg(dev));
		dg_timer_destroy(tm);
		printf("bdh decoder_gate_bwd_ys %9.1f us (ys made in the tile: xs in, dxs, dys out %.2f TB/s); "
		       "decoder_gate_bwd %9.1f us (ys read)\n",
		       t1.median_us, 3.0 * (double)n * 2 / t1.median_us * 1e-6, t0.median_us);
		fflush(stdout);
	}
	free(grad), free(w), free(xs), free(aq), free(ev), free(ysh), free(ax), free(ay), free(bx), free(by);
}

Test(gpu_decoder_gate, ys_made_in_the_tile_is_the_pair)
{
	dg_device *dev = gh_open_sm90();
	gh_seed(0x95);
	static const shape shapes[] = { { 2, 37, 2, 128, 200 }, { 1, 130, 3, 256, 104 } };
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		ys_case(dev, &shapes[i], 0.0f, false);
		ys_case(dev, &shapes[i], 0.1f, false);
	}
	shape bdh = { 8, 512, 4, 256, 8192 };
	ys_case(dev, &bdh, 0.1f, true);
	gh_close(dev);
}
