/*
 * Any BDH shape: every op spec the GPU model's training step would prepare
 * for a shape on an H200 (sm_90; runtime/train/gpu_model.c
 * dg__gm_step_specs: each node's ops, the execution copies' and the
 * optimizer's, listed without a device) validates, plans, renders and
 * compiles with NVRTC for its arch (sm_90a where the spec is
 * arch-specific), at shapes past the 25M one:
 *   - D 768, H 12, N 8192 (K = H·N = 98304, which once passed through
 *     the embd field's 65536 cap and was refused);
 *   - D 1280, H 16, N 16384 (3·D·H·N ≈ 1.0B parameters);
 *   - H·N = 2^20 (H 16, N 65536: the largest K, N the largest a head);
 *   - D 4096 (H 8, N 8192: the widest row the layer norms hold);
 *   - an odd small one (D 64, H 3, N 96, vocab 300);
 *   - a sweep of odd shapes (heads 1 to 64, D 64 to 4096, N 64 to 65536,
 *     vocab 2 to 65536) at T 1 to 5000, every preset: every spec plans;
 *   - the 25M model at T 16384 and 65536 (B 1), where the attention takes
 *     its chunked form (chunks of 256 and 512), and at T 4096 the
 *     quadratic one with DRAGON_ATTN_CHUNK=0;
 * for the w8a8 and bf16 presets. Distinct specs compile once, with
 * ptxas's -v log: no kernel's wgmma serialized at any shape, and no kernel
 * of the 25M w8a8 and bitnet steps spilling. And the
 * config past the ranges is refused naming the field before anything is
 * listed (H·N above 2^20, N above 65536, vocab above 65536, and bitnet's
 * N off a multiple of 16).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/model.h"
#include "helpers.h"
#include "runtime/store/nvrtc.h"
#include "runtime/train/gpu_model_int.h"

#define MAX_SPECS 512

typedef struct seen {
	dg_codegen *cg;
	char (*text)[DG_SPEC_TEXT_MAX];
	int n, compiled;
	int ops[DG_OP__COUNT];
	const char *shape;
	bool no_spills; /* a shape whose kernels must all stay in registers */
} seen;

/* Each distinct spec: validated, planned, rendered and compiled, with
 * ptxas's -v log where NVRTC gives it: at no shape may ptxas serialize a
 * kernel's wgmma ("wgmma.mma_async instructions are serialized", C7511 ..
 * C7518: every MMA then waits for the one before), and at a no_spills
 * shape (the 25M step) no kernel spills. */
static dg_status check_spec(void *user, const dg_spec *spec)
{
	seen *z = user;
	char text[DG_SPEC_TEXT_MAX], e[8192];
	dg_spec s = *spec;
	cr_assert_eq(dg_spec_validate(&s, e, sizeof(e)), DG_OK, "%s: %s: %s", z->shape, dg_op_name(s.op), e);
	dg_spec_to_string(&s, text, sizeof(text));
	for (int i = 0; i < z->n; i++)
		if (strcmp(z->text[i], text) == 0)
			return DG_OK;
	cr_assert_lt(z->n, MAX_SPECS);
	snprintf(z->text[z->n++], sizeof(text), "%s", text);
	z->ops[s.op]++;
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(z->cg, &s, &p), DG_OK, "%s: %s: %s", z->shape, text, dg_codegen_errmsg(z->cg));
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(z->cg, &s, &src), DG_OK, "%s: %s: %s", z->shape, text,
		     dg_codegen_errmsg(z->cg));
	dg__nvrtc_target t;
	cr_assert_eq(dg__nvrtc_target_for(s.arch, s.arch_specific, &t, e, sizeof(e)), DG_OK, "%s", e);
	cr_assert_lt(t.n_opts, DG__NVRTC_MAX_OPTS);
	snprintf(t.opts[t.n_opts++], sizeof(t.opts[0]), "--ptxas-options=-v");
	dg__nvrtc_result res;
	cr_assert_eq(dg__nvrtc_compile(src, &t, &res, e, sizeof(e)), DG_OK, "%s: %s: %s", z->shape, text, e);
	cr_assert(res.size > 64, "%s", text);
	if (res.log && strstr(res.log, "ptxas")) {
		cr_expect(!strstr(res.log, "serialized"), "%s: %s: ptxas serializes the MMAs:\n%s", z->shape, text,
			  res.log);
		for (const char *l = strstr(res.log, "bytes spill stores"); l && z->no_spills;
		     l = strstr(l + 1, "bytes spill stores")) {
			const char *b = l;
			while (b > res.log && b[-1] != '\n' && b[-1] != ',')
				b--;
			cr_expect_eq(atoi(b), 0, "%s: %s: spills:\n%s", z->shape, text, res.log);
		}
	} else {
		/* an NVRTC that keeps ptxas's -v to itself (an empty log) */
		printf("note: %s: %s: this NVRTC prints no ptxas log; serialization and spills not checked\n", z->shape,
		       text);
	}
	dg__nvrtc_result_free(&res);
	dg_source_destroy(src);
	z->compiled++;
	return DG_OK;
}

static dg_model_config shape(const char *preset, int D, int H, int N, int V)
{
	dg_model_config c = dg_test_model(preset, 0, D, H, N);
	c.vocab = V;
	return c;
}

/* Each listed spec's op counted into user's int[DG_OP__COUNT]. */
static dg_status count_ops(void *user, const dg_spec *s)
{
	((int *)user)[s->op]++;
	return DG_OK;
}

/* The specs of one shape's step, each compiled; z's counts stay (the
 * caller frees z.text and the generator). */
static void step_compiles_into(seen *z, const char *preset, int D, int H, int N, int V, int B, int T)
{
	char msg[1024];
	z->text = calloc(MAX_SPECS, sizeof(*z->text));
	cr_assert_not_null(z->text);
	cr_assert_eq(dg_codegen_create(&z->cg, NULL), DG_OK);
	dg_model_config c = shape(preset, D, H, N, V);
	cr_assert_eq(dg__gm_step_specs(&c, B, T, 90, NULL, NULL, check_spec, z, msg, sizeof(msg)), DG_OK, "%s: %s", z->shape, msg);
}

static void step_compiles(const char *preset, int D, int H, int N, int V, int B, int T)
{
	char name[128], msg[1024];
	snprintf(name, sizeof(name), "%s D %d H %d N %d V %d", preset, D, H, N, V);
	seen z = { .shape = name };
	z.text = calloc(MAX_SPECS, sizeof(*z.text));
	cr_assert_not_null(z.text);
	cr_assert_eq(dg_codegen_create(&z.cg, NULL), DG_OK);
	dg_model_config c = shape(preset, D, H, N, V);
	cr_assert_eq(dg__gm_step_specs(&c, B, T, 90, NULL, NULL, check_spec, &z, msg, sizeof(msg)), DG_OK, "%s: %s", name, msg);
	printf("nvrtc_shapes %s: %d distinct specs of the step compiled for sm_90/sm_90a\n", name, z.compiled);
	/* the step's families, each there: the projections, the decoder's
	 * copies (a row of K = H·N), attention, norms, the loss, AdamW */
	cr_expect_gt(z.ops[DG_OP_LOWRANK_FWD], 0, "%s", name);
	cr_expect_gt(z.ops[DG_OP_TRANSPOSE], 0, "%s", name);
	cr_expect_gt(z.ops[DG_OP_ATTENTION_SCORES], 0, "%s", name);
	cr_expect_gt(z.ops[DG_OP_LAYERNORM_FWD], 0, "%s", name);
	cr_expect_gt(z.ops[DG_OP_LMHEAD_CE], 0, "%s", name);
	cr_expect_gt(z.ops[DG_OP_ADAMW_UPDATE], 0, "%s", name);
	bool k_row = false; /* a transpose of the decoder: a row of H·N */
	for (int i = 0; i < z.n; i++) {
		char want[64];
		snprintf(want, sizeof(want), "embd=%d;", H * N);
		if (strstr(z.text[i], "op=transpose;") && strstr(z.text[i], want))
			k_row = true;
	}
	cr_expect(k_row, "%s: no transpose of a row of K = %d", name, H * N);
	dg_codegen_destroy(z.cg);
	free(z.text);
}

/* ys made again (DRAGON_RECOMPUTE=ys): inside the decoder's input
 * gradient (decoder_gate_bwd_ys; DRAGON_GATE_YS unset or 1), or
 * (DRAGON_GATE_YS=0) by a projection node a layer: the 25M w8a8 step lists
 * a decoder_gate_bwd_ys a layer and no backward projection (two lowrank_fwd
 * a layer, the forward's), and every spec of it compiles; bitnet (ternary
 * encoder_v weights, which the kernel does not read) keeps the projection. */
static void ys_made_in_gate_case(const char *preset, const char *gate_ys, int want_ys)
{
	char name[96];
	snprintf(name, sizeof(name), "%s DRAGON_RECOMPUTE=ys DRAGON_GATE_YS=%s", preset, gate_ys ? gate_ys : "(unset)");
	setenv("DRAGON_RECOMPUTE", "ys", 1);
	if (gate_ys)
		setenv("DRAGON_GATE_YS", gate_ys, 1);
	seen z = { .shape = name, .no_spills = true };
	step_compiles_into(&z, preset, 256, 4, 8192, 256, 8, 512);
	int ops[DG_OP__COUNT] = { 0 };
	char msg[1024];
	dg_model_config c = shape(preset, 256, 4, 8192, 256);
	cr_assert_eq(dg__gm_step_specs(&c, 8, 512, 90, NULL, NULL, count_ops, ops, msg, sizeof(msg)), DG_OK, "%s", msg);
	unsetenv("DRAGON_RECOMPUTE");
	unsetenv("DRAGON_GATE_YS");
	printf("nvrtc_shapes %s: %d lowrank_fwd, %d decoder_gate_bwd_ys, %d decoder_gate_bwd listed\n", name,
	       ops[DG_OP_LOWRANK_FWD], ops[DG_OP_DECODER_GATE_BWD_YS], ops[DG_OP_DECODER_GATE_BWD]);
	cr_expect_eq(ops[DG_OP_DECODER_GATE_BWD_YS], want_ys ? c.layers : 0, "%s", name);
	cr_expect_eq(ops[DG_OP_DECODER_GATE_BWD], want_ys ? 0 : c.layers, "%s", name);
	cr_expect_eq(ops[DG_OP_LOWRANK_FWD], (want_ys ? 2 : 3) * c.layers, "%s", name);
	dg_codegen_destroy(z.cg);
	free(z.text);
}

Test(nvrtc_shapes, ys_made_in_the_gate_lists_no_projection, .timeout = 1200)
{
	ys_made_in_gate_case("w8a8", NULL, 1);
	ys_made_in_gate_case("w8a8", "1", 1);
	ys_made_in_gate_case("w8a8", "0", 0);
	ys_made_in_gate_case("bitnet", NULL, 0);
}

/* The decoder's input gradient by its persistent form by TMA (gpu_model.c
 * gate_tma, the default): the 25M w8a8 step lists decoder_gate_bwd on the
 * model's tile, arch-specific (a named tile is planned as asked: without
 * sm_90a the op once took the fp32 path's check and the model refused the
 * tile), and that spec compiles with no spill; DRAGON_GATE_TMA=0 lists the
 * template's default (the ring form) instead. */
typedef struct gate_seen {
	int n;
	dg_spec spec;
} gate_seen;

static dg_status keep_gate(void *user, const dg_spec *s)
{
	gate_seen *g = user;
	if (s->op == DG_OP_DECODER_GATE_BWD) {
		g->n++;
		g->spec = *s;
	}
	return DG_OK;
}

static void gate_specs(const char *env, const char *want, const char *want2)
{
	char name[64], msg[1024], text[DG_SPEC_TEXT_MAX];
	snprintf(name, sizeof(name), "w8a8 DRAGON_GATE_TMA=%s", env ? env : "(unset)");
	if (env)
		setenv("DRAGON_GATE_TMA", env, 1);
	gate_seen g = { 0 };
	dg_model_config c = shape("w8a8", 256, 4, 8192, 256);
	dg_status st = dg__gm_step_specs(&c, 8, 512, 90, NULL, NULL, keep_gate, &g, msg, sizeof(msg));
	unsetenv("DRAGON_GATE_TMA");
	cr_assert_eq(st, DG_OK, "%s: %s", name, msg);
	cr_assert_eq(g.n, c.layers, "%s: %d decoder_gate_bwd listed", name, g.n);
	dg_spec_to_string(&g.spec, text, sizeof(text));
	cr_expect(strstr(text, want) && strstr(text, want2), "%s: %s", name, text);
	seen z = { .shape = name, .no_spills = true };
	z.text = calloc(MAX_SPECS, sizeof(*z.text));
	cr_assert_not_null(z.text);
	cr_assert_eq(dg_codegen_create(&z.cg, NULL), DG_OK);
	check_spec(&z, &g.spec);
	cr_expect_eq(z.compiled, 1, "%s", name);
	dg_codegen_destroy(z.cg);
	free(z.text);
}

Test(nvrtc_shapes, decoder_gate_by_tma_lists_sm90a, .timeout = 600)
{
	gate_specs(NULL, "arch=sm_90a;", "tile=128x128x64/8x1/5;");
	gate_specs("0", "arch=sm_90;", "tile=auto;"); /* the template's default: the ring */
}

Test(nvrtc_shapes, d768_h12_n8192_w8a8, .timeout = 1200)
{
	step_compiles("w8a8", 768, 12, 8192, 256, 4, 512);
}

Test(nvrtc_shapes, d1280_h16_n16384_w8a8, .timeout = 1200)
{
	step_compiles("w8a8", 1280, 16, 16384, 256, 2, 512);
}

Test(nvrtc_shapes, d1280_h16_n16384_bf16, .timeout = 1200)
{
	step_compiles("bf16", 1280, 16, 16384, 256, 2, 512);
}

Test(nvrtc_shapes, hn_2p20_w8a8, .timeout = 1200)
{
	step_compiles("w8a8", 256, 16, 65536, 256, 1, 256);
}

Test(nvrtc_shapes, d4096_w8a8, .timeout = 1200)
{
	step_compiles("w8a8", 4096, 8, 8192, 256, 1, 256);
}

/* A long context: the attention's chunked form (gpu_model.c
 * attn_chunk_for: from T 4096, a chunk of 512 from T 32768), its ops in
 * the step's list and compiled, the quadratic scores not; and with
 * DRAGON_ATTN_CHUNK=0 the quadratic form at the same T. */
Test(nvrtc_shapes, long_context_takes_the_chunked_form, .timeout = 1200)
{
	static const struct {
		int T, chunk;
	} cases[] = { { 16384, 256 }, { 65536, 512 } };
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		seen z = { .shape = "w8a8 25M, long T" };
		step_compiles_into(&z, "w8a8", 256, 4, 8192, 256, 1, cases[k].T);
		printf("nvrtc_shapes T %d: %d distinct specs of the step compiled\n", cases[k].T, z.compiled);
		cr_expect_gt(z.ops[DG_OP_ATTENTION_CHUNK_STATE], 0, "T %d", cases[k].T);
		cr_expect_gt(z.ops[DG_OP_ATTENTION_CHUNK_DQ], 0, "T %d", cases[k].T);
		char want[32];
		snprintf(want, sizeof(want), "chunk=%d;", cases[k].chunk);
		bool chunk_seen = false;
		for (int i = 0; i < z.n; i++)
			chunk_seen |= strstr(z.text[i], "op=attention_chunk_state;") && strstr(z.text[i], want);
		cr_expect(chunk_seen, "T %d: no attention_chunk_state of %s", cases[k].T, want);
		dg_codegen_destroy(z.cg);
		free(z.text);
	}
	setenv("DRAGON_ATTN_CHUNK", "0", 1);
	dg_model_config c = shape("w8a8", 256, 4, 8192, 256);
	int ops[DG_OP__COUNT] = { 0 };
	char msg[512];
	cr_assert_eq(dg__gm_step_specs(&c, 1, 4096, 90, NULL, NULL, count_ops, ops, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_eq(ops[DG_OP_ATTENTION_CHUNK_STATE], 0);
	cr_expect_gt(ops[DG_OP_ATTENTION_SCORES], 0);
	setenv("DRAGON_ATTN_CHUNK", "96", 1);
	cr_expect_eq(dg__gm_step_specs(&c, 1, 4096, 90, NULL, NULL, count_ops, ops, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	unsetenv("DRAGON_ATTN_CHUNK");
}

/* The plan of every spec of the step for a sweep of shapes no other test
 * names (odd heads, widths and vocabularies, N not a power of two, T from
 * 1 to past the attention's chunked form, which T = 5000 does not divide)
 * and every preset: each validates and its template plans an
 * auto tile (what the first step would compile), nothing refused. Plans
 * only: the compiles of the shapes above stand for the kernels. */
typedef struct sweep {
	dg_codegen *cg;
	const char *shape;
	int failures;
} sweep;

static dg_status plan_only(void *user, const dg_spec *spec)
{
	sweep *w = user;
	dg_spec s = *spec;
	char e[512], text[DG_SPEC_TEXT_MAX];
	dg_plan p;
	dg_spec_to_string(&s, text, sizeof(text));
	if (dg_spec_validate(&s, e, sizeof(e)) != DG_OK) {
		cr_log_error("%s: %s: %s", w->shape, text, e);
		w->failures++;
	} else if (dg_codegen_plan(w->cg, &s, &p) != DG_OK) {
		cr_log_error("%s: %s: %s", w->shape, text, dg_codegen_errmsg(w->cg));
		w->failures++;
	}
	return DG_OK;
}

Test(nvrtc_shapes, a_sweep_of_odd_shapes_plans)
{
	static const char *const presets[] = { "w8a8", "bf16", "bitnet", "f32" };
	static const int shapes[][6] = {
		/* layers, D, H, N, V, B */
		{ 3, 320, 5, 6144, 1000, 2 },	{ 2, 64, 1, 64, 256, 1 },	{ 4, 192, 3, 2048, 50304, 4 },
		{ 2, 128, 2, 1024, 65536, 2 },	{ 1, 4096, 1, 4096, 256, 1 },	{ 2, 448, 7, 7168, 32000, 2 },
		{ 2, 576, 9, 1536, 512, 2 },	{ 2, 256, 64, 16384, 256, 1 },	{ 2, 128, 4, 112, 300, 3 },
		{ 2, 64, 2, 65536, 256, 1 },	{ 2, 832, 13, 4992, 2, 2 },	{ 2, 960, 3, 320, 777, 2 },
	};
	static const int times[] = { 1, 7, 64, 100, 512, 1000, 4096, 5000 };
	sweep w = { .failures = 0 };
	cr_assert_eq(dg_codegen_create(&w.cg, NULL), DG_OK);
	char name[160], msg[512];
	for (size_t p = 0; p < sizeof(presets) / sizeof(presets[0]); p++)
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
			for (size_t k = 0; k < sizeof(times) / sizeof(times[0]); k++) {
				dg_model_config c = shape(presets[p], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4]);
				c.layers = shapes[i][0];
				snprintf(name, sizeof(name), "%s L %d D %d H %d N %d V %d B %d T %d", presets[p], c.layers,
					 c.embd, c.heads, c.neurons, c.vocab, shapes[i][5], times[k]);
				w.shape = name;
				cr_expect_eq(dg__gm_step_specs(&c, shapes[i][5], times[k], 90, NULL, NULL, plan_only, &w, msg, sizeof(msg)),
					     DG_OK, "%s: %s", name, msg);
			}
	cr_expect_eq(w.failures, 0, "%d specs of the sweep did not plan (above)", w.failures);
	dg_codegen_destroy(w.cg);
}

/* Shapes drawn at random over the whole range the config takes (layers
 * 1-64, D a multiple of 64 up to 4096, H 1-64, N a multiple of 4, 16 or
 * 64 with H·N up to 2^20 (bitnet: of 16), vocab 2-65536, B 1-8, T 1 to
 * 70000) and every preset: each step lists its specs and every spec plans,
 * nothing refused. What it found: the f32 recipe's gradient GEMMs took a
 * K step of 8 that N 1004 does not divide; the chunked attention was
 * taken at N not a multiple of 8, which its kernels refuse; and past
 * 64 GiB a buffer (the quadratic attention's scores at a T the chunked
 * form cannot serve) the sizing pass's placeholders overlapped and the
 * step was refused as aliasing (runtime/train/gpu_nodes.c dg__gm_addr). */
static uint64_t draw(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

Test(nvrtc_shapes, random_shapes_in_range_plan)
{
	static const char *const presets[] = { "w8a8", "bf16", "bitnet", "f32" };
	uint64_t x = 0x9e3779b97f4a7c15ull;
	sweep w = { .failures = 0 };
	cr_assert_eq(dg_codegen_create(&w.cg, NULL), DG_OK);
	char name[200], msg[1024];
	const int n = getenv("DRAGON_TEST_QUICK") ? 300 : 1500;
	for (int i = 0; i < n; i++) {
		const char *pr = presets[draw(&x) % 4];
		const bool bitnet = strcmp(pr, "bitnet") == 0;
		const int D = 64 * (int)(1 + draw(&x) % 64), H = (int)(1 + draw(&x) % 64);
		const int most = (1 << 20) / H < 65536 ? (1 << 20) / H : 65536;
		const int unit = bitnet ? 16 : (int[]){ 4, 16, 64 }[draw(&x) % 3];
		const int N = unit * (int)(1 + draw(&x) % (uint64_t)(most / unit));
		const int V = (int)(2 + draw(&x) % 65535), B = (int)(1 + draw(&x) % 8);
		const int T = (int)(1 + draw(&x) % (draw(&x) % 2 ? 4096 : 70000));
		dg_model_config c = shape(pr, D, H, N, V);
		c.layers = (int)(1 + draw(&x) % 64);
		snprintf(name, sizeof(name), "%s L %d D %d H %d N %d V %d B %d T %d", pr, c.layers, D, H, N, V, B, T);
		w.shape = name;
		cr_expect_eq(dg__gm_step_specs(&c, B, T, 90, NULL, NULL, plan_only, &w, msg, sizeof(msg)), DG_OK, "%s: %s",
			     name, msg);
	}
	cr_expect_eq(w.failures, 0, "%d specs of the random shapes did not plan (above)", w.failures);
	dg_codegen_destroy(w.cg);
}

/* The f32 recipe at N 1004 (not a multiple of 8): its gradient GEMMs'
 * fp32 tiles take a K step of 4 (runtime/train/gpu_nodes.c exact_tile),
 * and every kernel of the step compiles. */
Test(nvrtc_shapes, f32_neurons_not_a_multiple_of_8, .timeout = 1200)
{
	step_compiles("f32", 64, 3, 1004, 256, 2, 32);
}

Test(nvrtc_shapes, odd_small_bf16, .timeout = 1200)
{
	step_compiles("bf16", 64, 3, 96, 300, 2, 32);
}

static dg_status count_spec(void *user, const dg_spec *s)
{
	(void)s;
	(*(int *)user)++;
	return DG_OK;
}

Test(nvrtc_shapes, shapes_past_the_ranges_are_refused_by_field)
{
	static const struct {
		int D, H, N, V;
		const char *want;
	} bad[] = {
		{ 256, 32, 65536, 256, "heads=32, neurons=65536" }, /* H·N = 2^21 */
		{ 256, 1, 131072, 256, "neurons=131072" },
		{ 256, 4, 8192, 65537, "vocab=65537" },
		{ 256, 65, 64, 256, "heads=65" },
		{ 258, 4, 64, 256, "embd=258" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char msg[1024];
		int n = 0;
		dg_model_config c = shape("w8a8", bad[i].D, bad[i].H, bad[i].N, bad[i].V);
		cr_expect_eq(dg__gm_step_specs(&c, 1, 16, 90, NULL, NULL, count_spec, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG,
			     "%s", bad[i].want);
		cr_expect(strstr(msg, bad[i].want), "%s: %s", bad[i].want, msg);
		cr_expect_eq(n, 0, "%s: %d specs listed before the refusal", bad[i].want, n);
	}
	/* bitnet's ternary weights pack 16 codes a word along the neurons:
	 * N 1000 is refused naming neurons, not a kernel's latent field */
	char msg[1024];
	int n = 0;
	dg_model_config c = shape("bitnet", 256, 3, 1000, 256);
	cr_expect_neq(dg__gm_step_specs(&c, 1, 16, 90, NULL, NULL, count_spec, &n, msg, sizeof(msg)), DG_OK, "bitnet N 1000");
	cr_expect(strstr(msg, "neurons=1000") && strstr(msg, "multiple of 16"), "%s", msg);
	cr_expect_eq(n, 0, "bitnet N 1000: %d specs listed before the refusal", n);
	c = shape("bitnet", 256, 3, 1008, 256);
	cr_expect_eq(dg__gm_step_specs(&c, 1, 16, 90, NULL, NULL, count_spec, &n, msg, sizeof(msg)), DG_OK, "N 1008: %s", msg);
}
