/*
 * The step bench's floor. bench/step_floor.py's node table is the tape's:
 * for each GPU preset, its node kinds, their counts and the bytes of their
 * inputs and outputs are what runtime/train/bdh_tape.c records on sm_90 (at
 * an odd shape, where every dimension differs, and at the 25M one), and
 * every node kind a profile can name has a floor in some preset, so a new
 * kind without one fails here. And bench/step_rows.c: a command's JSON and
 * why it failed, the floor attached to a breakdown, the anchor's row.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/step_rows.h"
#include "dragon/model.h"
#include "runtime/train/bdh_tape.h"

#define FLOOR "python3 '" DG_SOURCE_DIR "/bench/step_floor.py' --shapes"

static const char *const presets[] = { "f32", "bf16", "w8a8", "bitnet" };
enum { N_PRESETS = sizeof(presets) / sizeof(presets[0]) };

typedef struct shape {
	int L, B, T, D, H, N, V;
} shape;

static void need_python(void)
{
	if (system("command -v python3 >/dev/null 2>&1") != 0)
		cr_skip_test("no python3 on the PATH");
}

/* bench/step_floor.py --shapes at s: its "presets" object (owned by *doc). */
static const cJSON *floor_shapes(const shape *s, cJSON **doc)
{
	char cmd[512], why[512];
	snprintf(cmd, sizeof(cmd), FLOOR " --layers %d --batch %d --time %d --embd %d --heads %d --neurons %d --vocab %d",
		 s->L, s->B, s->T, s->D, s->H, s->N, s->V);
	*doc = cJSON_CreateArray();
	cr_assert(bs_run_json(cmd, *doc, why, sizeof(why)), "%s: %s", cmd, why);
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(*doc, 0), "presets");
	cr_assert(cJSON_IsObject(p), "%s: no presets", cmd);
	return p;
}

/* The GPU model's tape of preset on sm_90, as gpu_model.c's build sets it:
 * a low-bit recipe (a projection's formats not the precision) reads bf16
 * copies in its gradient GEMMs and fuses the gate with the decoder input's
 * quantizer; bf16 activations fuse the decoder's input gradient with the
 * gate's backward; the float bf16 recipe's decoder forward reads a bf16
 * copy. */
static void gpu_tape(const char *preset, const shape *s, dg__tape *t)
{
	dg_model_config c;
	char msg[256];
	cr_assert_eq(dg_model_preset(preset, &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	c.layers = s->L, c.embd = s->D, c.heads = s->H, c.neurons = s->N, c.vocab = s->V;
	const dg_proj_recipe *r[3] = { &c.encoder, &c.encoder_v, &c.decoder };
	bool lowbit = false;
	for (int i = 0; i < 3; i++)
		lowbit |= r[i]->weight != c.precision || r[i]->act != c.precision;
	bool bf16 = c.precision == DG_FMT_BF16;
	dg__bdh_target tg = { .gpu = true, .act = c.precision, .lowbit = lowbit, .bf16_grads = lowbit,
			      .dec_gate = bf16, .dec_fwd_gemm = bf16 && !lowbit, .gate_quant = lowbit };
	dg__bdh_ids id;
	dg__tape_init(t, &c, s->B, s->T);
	cr_assert_eq(dg__bdh_tape_build(t, &id, &tg), DG_OK, "%s", preset);
}

/* A buffer's bytes with its scales' (codes carry them). */
static size_t tensor_bytes(const dg__tape *t, int id)
{
	if (id < 0)
		return 0;
	const dg__tbuf *b = &t->bufs[id];
	return b->bytes + (b->scale >= 0 ? t->bufs[b->scale].bytes : 0);
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	cr_assert(cJSON_IsNumber(v), "no number %s", key);
	return v->valuedouble;
}

/* Each preset's kinds in the floor are the tape's, node for node and byte
 * for byte (the floor's bytes less what it adds beyond the node's inputs
 * and outputs); returns nothing, fails on the first difference. */
static void floor_is_the_tape(const shape *s)
{
	cJSON *doc;
	const cJSON *fp = floor_shapes(s, &doc);
	for (int p = 0; p < N_PRESETS; p++) {
		dg__tape t;
		gpu_tape(presets[p], s, &t);
		const cJSON *kinds = cJSON_GetObjectItemCaseSensitive(fp, presets[p]);
		cr_assert(cJSON_IsObject(kinds), "the floor has no preset %s", presets[p]);
		int count[DG__N__COUNT] = { 0 };
		size_t bytes[DG__N__COUNT] = { 0 };
		for (int n = 0; n < t.n_nodes; n++) {
			const dg__tnode *nd = &t.nodes[n];
			count[nd->kind]++;
			for (int i = 0; i < DG__TAPE_IN; i++)
				bytes[nd->kind] += tensor_bytes(&t, nd->in[i]);
			for (int o = 0; o < DG__TAPE_OUT; o++)
				bytes[nd->kind] += tensor_bytes(&t, nd->out[o]);
		}
		int kinds_in_tape = 0;
		for (int k = 0; k < DG__N__COUNT; k++) {
			if (!count[k])
				continue;
			kinds_in_tape++;
			const char *what = dg__nkind_name((dg__nkind)k);
			const cJSON *e = cJSON_GetObjectItemCaseSensitive(kinds, what);
			cr_assert(e, "%s: the step runs %d \"%s\" nodes; the floor has none", presets[p], count[k], what);
			cr_assert_eq((int)num(e, "count"), count[k], "%s %s: the floor counts %d nodes, the tape %d",
				     presets[p], what, (int)num(e, "count"), count[k]);
			double fb = num(e, "bytes") - num(e, "extra_bytes");
			cr_assert_eq(fb, (double)bytes[k], "%s %s (L %d B %d T %d D %d H %d N %d V %d): the floor's "
				     "bytes %.0f, the tape's inputs and outputs %zu", presets[p], what, s->L, s->B,
				     s->T, s->D, s->H, s->N, s->V, fb, bytes[k]);
			cr_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "how")), "%s %s: no how",
				  presets[p], what);
		}
		cr_assert_eq(cJSON_GetArraySize(kinds), kinds_in_tape,
			     "%s: the floor has %d kinds, the tape %d", presets[p], cJSON_GetArraySize(kinds),
			     kinds_in_tape);
		dg__tape_free(&t);
	}
	cJSON_Delete(doc);
}

Test(step_floor, is_the_tape_at_an_odd_shape)
{
	need_python();
	shape s = { .L = 3, .B = 2, .T = 24, .D = 40, .H = 3, .N = 112, .V = 72 };
	floor_is_the_tape(&s);
}

Test(step_floor, is_the_tape_at_25m)
{
	need_python();
	shape s = { .L = 6, .B = 8, .T = 512, .D = 256, .H = 4, .N = 8192, .V = 256 };
	floor_is_the_tape(&s);
}

/* Every kind runtime/train's profile can name (tape.c's table) has a floor
 * in some preset. */
Test(step_floor, every_node_kind_has_a_floor)
{
	need_python();
	shape s = { .L = 2, .B = 2, .T = 16, .D = 32, .H = 2, .N = 64, .V = 64 };
	cJSON *doc;
	const cJSON *fp = floor_shapes(&s, &doc);
	for (int k = 0; k < DG__N__COUNT; k++) {
		const char *what = dg__nkind_name((dg__nkind)k);
		cr_assert_str_neq(what, "?", "node kind %d has no name", k);
		bool found = false;
		for (int p = 0; p < N_PRESETS && !found; p++)
			found = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fp, presets[p]), what);
		cr_assert(found, "node kind \"%s\" has no floor in bench/step_floor.py", what);
	}
	cJSON_Delete(doc);
}

/* ---- bench/step_rows.c -------------------------------------------------------- */

Test(step_rows, json_lines_and_why_not)
{
	char why[512];
	cJSON *a = cJSON_CreateArray();
	cr_assert(bs_run_json("echo '{\"x\": 1}'; echo not json; echo '[1]'", a, why, sizeof(why)), "%s", why);
	cr_assert_eq(cJSON_GetArraySize(a), 1);
	cr_assert_eq(num(cJSON_GetArrayItem(a, 0), "x"), 1);
	cJSON_Delete(a);

	a = cJSON_CreateArray();
	cr_assert_not(bs_run_json("echo starting >&2; echo 'ModuleNotFoundError: torch' >&2; exit 3", a, why,
				  sizeof(why)));
	cr_assert_str_eq(why, "ModuleNotFoundError: torch (exit 3)");
	cr_assert_not(bs_run_json("dg-no-such-program-anywhere --x", a, why, sizeof(why)));
	cr_assert(strstr(why, "not found") && strstr(why, "(exit 127)"), "%s", why);
	cr_assert_not(bs_run_json("echo '{\"error\": \"torch 2.11 sees no CUDA device\"}'; exit 1", a, why,
				  sizeof(why)));
	cr_assert_str_eq(why, "torch 2.11 sees no CUDA device");
	cr_assert_not(bs_run_json("echo hello", a, why, sizeof(why)));
	cr_assert_str_eq(why, "no JSON object on its output");
	cr_assert_not(bs_run_json("kill -9 $$", a, why, sizeof(why)));
	cr_assert(strstr(why, "signal 9") || strstr(why, "(exit 137)"), "%s", why);
	cJSON_Delete(a);
}

/* A row of preset w8a8 whose breakdown is kinds (what, count, ms). */
static cJSON *row_of(const char *kinds)
{
	char text[1024];
	snprintf(text, sizeof(text), "{\"impl\": \"dragon\", \"preset\": \"w8a8\", \"breakdown\": %s}", kinds);
	cJSON *r = cJSON_Parse(text);
	cr_assert(r);
	return r;
}

static const cJSON *entry(const cJSON *row, int i)
{
	return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(row, "breakdown"), i);
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

Test(step_rows, floor_on_a_breakdown)
{
	cJSON *fl = cJSON_Parse("{\"presets\": {\"w8a8\": {"
				"\"gate\": {\"count\": 6, \"floor_ms\": 0.25, \"how\": \"6 x gate: HBM\"},"
				"\"decoder\": {\"count\": 6, \"floor_ms\": 0.5, \"how\": \"6 x decoder: GEMM\"}},"
				"\"bf16\": {\"quantize_act\": {\"count\": 18, \"floor_ms\": 1, \"how\": \"\"}}}}");
	cr_assert(fl);
	cJSON *r = row_of("[{\"what\": \"gate\", \"count\": 6, \"ms\": 1.0},"
			  " {\"what\": \"decoder\", \"count\": 6, \"ms\": 0.75}]");
	bs_attach_floor(r, fl, NULL);
	cr_assert_eq(num(entry(r, 0), "floor_ms"), 0.25);
	cr_assert_eq(num(entry(r, 0), "ratio"), 4.0);
	cr_assert_str_eq(str(entry(r, 0), "floor_how"), "6 x gate: HBM");
	cr_assert_eq(num(entry(r, 1), "ratio"), 1.5);
	cr_assert_eq(num(r, "floor_ms"), 0.75);
	cr_assert_null(str(r, "floor_error"));
	bs_print_breakdown(r);
	cJSON_Delete(r);

	/* a count that differs, a kind the floor lacks (for this preset):
	 * no floor for them, said, and none for the row */
	r = row_of("[{\"what\": \"gate\", \"count\": 5, \"ms\": 1.0}, {\"what\": \"decoder\", \"count\": 6, \"ms\": 1},"
		   " {\"what\": \"quantize_act\", \"count\": 18, \"ms\": 2}]");
	bs_attach_floor(r, fl, NULL);
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(entry(r, 0), "floor_ms"));
	cr_assert_str_eq(str(entry(r, 0), "floor_how"), "no floor: the step ran 5 gate nodes, the floor counts 6");
	cr_assert_eq(num(entry(r, 1), "floor_ms"), 0.5);
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(entry(r, 2), "floor_ms"));
	cr_assert_str_eq(str(entry(r, 2), "floor_how"), "no floor: the floor has no quantize_act node for preset w8a8");
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(r, "floor_ms"));
	cr_assert_str_eq(str(r, "floor_error"), "no floor for: gate, quantize_act");
	bs_print_breakdown(r);
	cJSON_Delete(r);

	/* no floor at all: why, on the row */
	r = row_of("[{\"what\": \"gate\", \"count\": 6, \"ms\": 1.0}]");
	bs_attach_floor(r, NULL, "no torch (exit 1)");
	cr_assert_str_eq(str(r, "floor_error"), "no torch (exit 1)");
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(entry(r, 0), "floor_ms"));
	cJSON_Delete(r);
	/* --no-floor: nothing said */
	r = row_of("[{\"what\": \"gate\", \"count\": 6, \"ms\": 1.0}]");
	bs_attach_floor(r, NULL, NULL);
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(r, "floor_error"));
	cJSON_Delete(r);
	cJSON_Delete(fl);
}

static dg_model_config shape_25m(void)
{
	dg_model_config c;
	char msg[256];
	cr_assert_eq(dg_model_preset("bf16", &c, msg, sizeof(msg)), DG_OK, "%s", msg);
	return c;
}

Test(step_rows, floor_gets_the_shape)
{
	dg_model_config c = shape_25m();
	char why[512] = "";
	cJSON *f = bs_run_floor("f() { printf '{\"presets\": {}, \"args\": \"%s\"}\\n' \"$*\"; }; f", &c, 8, 512, why,
				sizeof(why));
	cr_assert(f, "%s", why);
	cr_assert_str_eq(str(f, "args"), "--layers 6 --embd 256 --heads 4 --neurons 8192 --vocab 256 --batch 8 --time 512");
	cJSON_Delete(f);
	cr_assert_null(bs_run_floor("echo '{\"x\": 1}'; f() { :; }; f", &c, 8, 512, why, sizeof(why)));
	cr_assert_str_eq(why, "no \"presets\" in its output");
	cr_assert_null(bs_run_floor("f() { echo 'sh: 1: python3: not found' >&2; return 127; }; f", &c, 8, 512, why,
				    sizeof(why)));
	cr_assert_str_eq(why, "sh: 1: python3: not found (exit 127)");
}

Test(step_rows, anchor_row)
{
	dg_model_config c = shape_25m();
	/* the anchor answers only to the shape it should get */
	cJSON *r = bs_run_anchor("f() { [ \"$*\" = '--layers 6 --embd 256 --heads 4 --neurons 8192 --batch 2 --time 2048 "
				 "--steps 7' ] || { echo \"bad arguments: $*\" >&2; return 2; }; "
				 "echo '{\"impl\": \"torch.compile\", \"mode\": \"default\", \"step_ms\": 32.5, "
				 "\"peak_bytes\": 8900000000, \"torch\": \"2.11.0\"}'; }; f",
				 &c, 2, 2048, 7);
	cr_assert_null(str(r, "error"), "%s", str(r, "error"));
	cr_assert_str_eq(str(r, "impl"), "torch.compile");
	cr_assert_str_eq(str(r, "preset"), "bf16");
	cr_assert_str_eq(str(r, "mode"), "train");
	cr_assert_eq(num(r, "B"), 2);
	cr_assert_eq(num(r, "T"), 2048);
	cr_assert_eq(num(r, "step_ms"), 32.5);
	cr_assert_eq(num(r, "peak_bytes"), 8.9e9);
	cr_assert_str_eq(str(r, "torch"), "2.11.0");
	cJSON *rows = cJSON_Parse("[{\"impl\": \"dragon\", \"preset\": \"w8a8\", \"mode\": \"train_graph\", \"step_ms\": 13},"
				  " {\"impl\": \"dragon\", \"preset\": \"w8a8\", \"mode\": \"train_eager\", \"step_ms\": 14}]");
	bs_print_anchor(rows, r);
	cJSON_Delete(rows);
	cJSON_Delete(r);

	r = bs_run_anchor("f() { echo \"ModuleNotFoundError: No module named 'torch'\" >&2; return 1; }; f", &c, 8, 512, 10);
	cr_assert_str_eq(str(r, "error"), "ModuleNotFoundError: No module named 'torch' (exit 1)");
	cr_assert_str_eq(str(r, "mode"), "train");
	cr_assert_eq(num(r, "B"), 8);
	cr_assert_null(cJSON_GetObjectItemCaseSensitive(r, "step_ms"));
	cJSON_Delete(r);
}
