/*
 * The quantizers a scale a row (templates/qrows.lua) at the BDH shapes,
 * without a GPU: for each spec the model builds (runtime/train/gpu_model.c:
 * the x and a tokens, rows of 256 bf16 → int8; the xy token, 4 × 8192
 * bf16 → uint8pos; the execution weights a channel, rows of 256 and of
 * 32768 f32 → int8):
 *   - the tile that runs is the template's default t256 (no built-in
 *     tuning record moves it): the register cache of the block entry is
 *     sized for 256 threads (16 uint4 a thread = one 32768-value token);
 *   - the host (dg__quantize_rows_entry) sends the row length to the warp
 *     entry (256 values; bf16 tokens up to 2048: 1B's 1280) or the block
 *     entry (32768);
 *   - that entry compiles for sm_90 with no spills (ptxas -v through
 *     NVRTC), and the block entry within 128 registers a thread, so two
 *     256-thread blocks (128 KiB of loads in flight) share an SM;
 *   - the token quantizer's codes by a multiply with the row's reciprocal
 *     and, near a half-integer, an exact test in double (templates/
 *     quantize.lua dg_quant_vec) are the division's: every bf16 value of a
 *     row (and a NaN) against scales from many row maxima (random, powers
 *     of two, values whose quotients land on half-integers, subnormal and
 *     huge scales, a scale that rounds to 0), for each code format, in
 *     this file's C with the same float operations; the exact test is
 *     taken, and rarely.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/spec.h"
#include "dragon/tune.h"
#include "runtime/ops/ops_int.h"
#include "runtime/ref/ref_ops.h"
#include "runtime/store/nvrtc.h"

/* ptxas's figures of one entry, read from the -v log. */
typedef struct ptxas_fig {
	int regs, stack, spill_st, spill_ld;
} ptxas_fig;

/* Reads entry's "Function properties" and "Used N registers" lines of
 * log (ptxas -v); false when either is missing. */
static bool ptxas_figures(const char *log, const char *entry, ptxas_fig *f)
{
	char key[128];
	snprintf(key, sizeof(key), "Function properties for %s\n", entry);
	const char *p = strstr(log, key);
	if (!p)
		return false;
	p += strlen(key);
	p += strcspn(p, "0123456789"); /* NVRTC prefixes the line with "ptxas   ." */
	if (sscanf(p, "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &f->stack,
		   &f->spill_st, &f->spill_ld) != 3)
		return false;
	snprintf(key, sizeof(key), "Compiling entry function '%s'", entry);
	p = strstr(log, key);
	const char *u = p ? strstr(p, "Used ") : NULL;
	return u && sscanf(u, "Used %d registers", &f->regs) == 1;
}

/* The spec of a quantizer as gpu_model.c builds it on an H200. */
static dg_spec model_spec(dg_op op, dg_fmt src, dg_fmt code)
{
	dg_spec s;
	dg_spec_init(&s, op);
	s.arch = 90;
	s.src = src;
	if (op == DG_OP_QUANTIZE_ACT) {
		s.act = code;
		s.ascale = DG_SCALE_TOKEN;
	} else {
		s.weight = code;
		s.wscale = DG_SCALE_CHANNEL;
	}
	dg_spec_normalize(&s);
	return s;
}

Test(nvrtc_quantize, rows_at_the_bdh_shapes)
{
	static const struct {
		const char *what;
		dg_op op;
		dg_fmt src, code;
		long long values; /* G·C of a row */
		const char *entry;
	} cases[] = {
		{ "x, a tokens (B,1,T,256)", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_INT8, 256,
		  "dg_quantize_act_rows_warp" },
		{ "1B's a tokens (B·16,1,T,1280)", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_INT8, 1280,
		  "dg_quantize_act_rows_warp" },
		{ "bf16 tokens of 2048, the most a warp keeps", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_INT8, 2048,
		  "dg_quantize_act_rows_warp" },
		{ "bf16 tokens of 2056", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_INT8, 2056, "dg_quantize_act_rows" },
		{ "f32 tokens of 1280", DG_OP_QUANTIZE_ACT, DG_FMT_F32, DG_FMT_INT8, 1280, "dg_quantize_act_rows" },
		{ "xy token (B,4,T,8192)", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_UINT8POS, 4 * 8192,
		  "dg_quantize_act_rows" },
		{ "xy token, int8 codes", DG_OP_QUANTIZE_ACT, DG_FMT_BF16, DG_FMT_INT8, 4 * 8192,
		  "dg_quantize_act_rows" },
		{ "f32 model, xy token", DG_OP_QUANTIZE_ACT, DG_FMT_F32, DG_FMT_UINT8POS, 4 * 8192,
		  "dg_quantize_act_rows" },
		{ "encoder weights (4·8192, 256)", DG_OP_QUANTIZE_WEIGHT, DG_FMT_F32, DG_FMT_INT8, 256,
		  "dg_quantize_weight_rows_warp" },
		{ "decoder weights (256, 4·8192)", DG_OP_QUANTIZE_WEIGHT, DG_FMT_F32, DG_FMT_INT8, 4 * 8192,
		  "dg_quantize_weight_rows" },
	};
	char e[8192], text[DG_SPEC_TEXT_MAX];
	dg_codegen *cg = NULL;
	dg_tune_db *db = NULL;
	dg_tune_db_opts o = { .path = "builtin", .device = "NVIDIA H200", .sm = 90 };
	dg__nvrtc_target t;

	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", cg ? dg_codegen_errmsg(cg) : "no memory");
	cr_assert_eq(dg_tune_db_open(&db, &o), DG_OK);
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, e, sizeof(e)), DG_OK, "%s", e);
	cr_assert_lt(t.n_opts, DG__NVRTC_MAX_OPTS);
	snprintf(t.opts[t.n_opts++], sizeof(t.opts[0]), "--ptxas-options=-v");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dg_spec s = model_spec(cases[i].op, cases[i].src, cases[i].code);
		dg_tune_choice ch;
		dg_source *src = NULL;
		dg__nvrtc_result res;
		ptxas_fig f;

		dg_spec_to_string(&s, text, sizeof(text));
		cr_assert_eq(dg_tune_resolve(cg, db, &s, "NVIDIA H200", 90, &ch), DG_OK, "%s: %s", text,
			     dg_codegen_errmsg(cg));
		cr_assert_eq(ch.spec.tile.threads, 256,
			     "%s: %s runs with %d threads (%s); qrows.lua sizes its register cache for t256",
			     cases[i].what, text, ch.spec.tile.threads, ch.tuned ? ch.record : ch.why);
		cr_assert_str_eq(dg__quantize_rows_entry(&s, cases[i].values), cases[i].entry, "%s",
				 cases[i].what);
		cr_assert_eq(dg_codegen_render(cg, &ch.spec, &src), DG_OK, "%s: %s", text,
			     dg_codegen_errmsg(cg));
		bool listed = false;
		for (int k = 0; k < src->n_entries; k++)
			if (strcmp(src->entries[k], cases[i].entry) == 0)
				listed = src->block_threads[k] == 256;
		cr_assert(listed, "%s: %s is not an entry of 256 threads", text, cases[i].entry);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s", text, e);
		if (!res.log || !strstr(res.log, "ptxas")) {
			/* an NVRTC that keeps ptxas's -v to itself (the GPU machine's
			 * image: an empty log); the build machine's prints it, so CI
			 * checks the figures */
			printf("note: %s: this NVRTC prints no ptxas figures; register check not made here\n",
			       cases[i].what);
			dg__nvrtc_result_free(&res);
			dg_source_destroy(src);
			continue;
		}
		cr_assert(ptxas_figures(res.log, cases[i].entry, &f), "%s: no ptxas figures for %s in:\n%s",
			  text, cases[i].entry, res.log);
		cr_assert(f.spill_st == 0 && f.spill_ld == 0 && f.stack == 0,
			  "%s: %s spills (%d bytes stack, %d stored, %d loaded; %d registers)", text,
			  cases[i].entry, f.stack, f.spill_st, f.spill_ld, f.regs);
		bool block = strstr(cases[i].entry, "_warp") == NULL;
		cr_assert(!block || f.regs <= 128, "%s: %s uses %d registers; at most 128 keep two blocks an SM",
			  text, cases[i].entry, f.regs);
		cr_log_info("%s: %s %s, %d registers", cases[i].what, text, cases[i].entry, f.regs);
		dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	dg_tune_db_close(db);
	dg_codegen_destroy(cg);
}

/* dg_quant_inv (templates/quantize.lua): the row's (si, f). */
static void fast_inv(float s, float *si, float *f)
{
	if (!(s > 0.0f) || s > 3.40282347e38f) {
		*si = *f = 0.0f;
		return;
	}
	*f = s < 1.17549435e-38f ? 4294967296.0f : (s > 4.25352959e37f ? 2.32830644e-10f : 1.0f);
	volatile float sf = s * *f;
	*si = 1.0f / sf;
}

/* dg_quant_near: v and s already scaled by f, y within 2^-12 of a
 * half-integer. */
static int near_code(float v, float s, float y, int lo, int hi)
{
	if (v != v)
		return 0;
	volatile float kf = floorf(y), h = kf + 0.5f;
	volatile double d = (double)v - (double)h * (double)s;
	int32_t hb;
	memcpy(&hb, (const void *)&h, 4);
	hb = (hb & 0x7f800000) - (23 << 23);
	float ulp;
	memcpy(&ulp, &hb, 4);
	double half = (double)s * (double)ulp * 0.5;
	int k = (int)kf;
	int c = fabs(d) <= half ? k + (k & 1) : (d > 0.0 ? k + 1 : k);
	return c < lo ? lo : (c > hi ? hi : c);
}

/* dg_quant_vec's code of one value, the same float operations in C:
 * v·f·si rounded to an integer by adding 1.5·2^23 and clamped, or where y
 * is within 2^-12 of a half-integer (*near set) near_code's. */
static int fast_code(float v, float s, float si, float f, int lo, int hi, bool *near)
{
	volatile float vf = v * f, y = vf * si, t = y + 12582912.0f, k = t - 12582912.0f;
	*near = !(fabsf(y - k) < 0.499755859375f);
	if (*near)
		return near_code(vf, s * f, y, lo, hi);
	int32_t b;
	memcpy(&b, (const void *)&t, 4);
	b = b < 0x4b400000 + lo ? 0x4b400000 + lo : b;
	return (b > 0x4b400000 + hi ? 0x4b400000 + hi : b) - 0x4b400000;
}

/* dg_quant: the division's code (0 where s is 0 or the quotient NaN). */
static int div_code(float v, float s, int lo, int hi)
{
	if (s == 0.0f || v == 0.0f)
		return 0;
	float q = rintf(v / s);
	if (q != q)
		return 0;
	return q < (float)lo ? lo : (q > (float)hi ? hi : (int)q);
}

/* Every bf16 v with |v| ≤ m (and a NaN) at s = m/qmax: the rule's code is
 * the division's; returns the values it decided near a half-integer. */
static long check_row_max(float m, int qmax, int lo, long *checked)
{
	const float s = m / (float)qmax;
	float si, f;
	fast_inv(s, &si, &f);
	long near_n = 0;
	for (uint32_t hb = 0; hb < 0x10000u; hb++) {
		float v = dg_ref_bf16_to_f32((uint16_t)hb);
		if (!(fabsf(v) <= m) && v == v)
			continue;
		bool near;
		int c = fast_code(v, s, si, f, lo, qmax, &near);
		(*checked)++;
		near_n += near;
		cr_assert_eq(c, div_code(v, s, lo, qmax),
			     "m %a (s %a), qmax %d: v %a: the rule gives %d%s, the division %d", (double)m,
			     (double)s, qmax, (double)v, c, near ? " (near a half-integer)" : "",
			     div_code(v, s, lo, qmax));
	}
	return near_n;
}

Test(nvrtc_quantize, the_reciprocal_rule_gives_the_divisions_codes)
{
	static const int qmaxes[][2] = { { 127, -127 }, { 255, 0 }, { 7, -7 } };
	uint64_t x = 0x9e3779b97f4a7c15ull;
	long checked = 0, near_n = 0;
	for (size_t q = 0; q < sizeof(qmaxes) / sizeof(qmaxes[0]); q++) {
		const int qmax = qmaxes[q][0], lo = qmaxes[q][1];
		/* random row maxima over the bf16 range (the kernel's m is a bf16
		 * value), powers of two, and maxima that are qmax·(k + 1/2)·2^e,
		 * whose quotients fall on half-integers exactly */
		for (int i = 0; i < 160; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			uint16_t h = (uint16_t)(x & 0x7fffu);
			float m = dg_ref_bf16_to_f32(h);
			if (!(m > 0.0f) || isinf(m))
				continue;
			near_n += check_row_max(m, qmax, lo, &checked);
		}
		for (int e = -130; e <= 127; e += 11)
			near_n += check_row_max(ldexpf(1.0f, e), qmax, lo, &checked);
		for (int k = 0; k < 8; k++)
			for (int e = -20; e <= 20; e += 5)
				near_n += check_row_max(ldexpf((float)qmax * ((float)k + 0.5f), e), qmax, lo,
							&checked);
		/* the largest and smallest maxima: s past 2^125, s subnormal
		 * (coarse ones too), s rounding to 0 */
		near_n += check_row_max(3.38953139e38f, qmax, lo, &checked);
		near_n += check_row_max(1.0e-38f, qmax, lo, &checked);
		for (int e = -149; e <= -120; e++)
			near_n += check_row_max(ldexpf(1.5f, e), qmax, lo, &checked);
		near_n += check_row_max(ldexpf(1.0f, -149), qmax, lo, &checked);
	}
	cr_log_info("%ld values checked, %ld decided near a half-integer", checked, near_n);
	cr_assert_gt(checked, 1000000);
	cr_assert_gt(near_n, 0, "no value near a half-integer: the exact branch went untested");
	cr_assert_lt(near_n * 50, checked, "%ld of %ld values near a half-integer: the rule is no faster",
		     near_n, checked);
}
