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
 *     entry (256 values) or the block entry (32768);
 *   - that entry compiles for sm_90 with no spills (ptxas -v through
 *     NVRTC), and the block entry within 128 registers a thread, so two
 *     256-thread blocks (128 KiB of loads in flight) share an SM.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/spec.h"
#include "dragon/tune.h"
#include "runtime/ops/ops_int.h"
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
