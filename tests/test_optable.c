/*
 * The op table (codegen/optable.c) against everything that reads it:
 *   - every row is complete: family, module, about, fields, a tile kind, a
 *     tensor signature with an output, a check kind, the tuner's shape;
 *   - each row's module is a template the codegen loads (a set without it
 *     does not create) and each family has its ops file;
 *   - every op renders at its defaults: dg_spec_init validates, plans and
 *     renders, and its first entry is named after the op;
 *   - every op's default build set parses (every key a field the op reads)
 *     and expands to specs that validate and plan;
 *   - each op's tensor signature is what its _check takes: tensors of the
 *     signature's shapes pass, and one of them with a dimension off by one,
 *     the wrong format, no scale or missing fails naming that tensor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "dragon/codegen.h"
#include "dragon/ops.h"
#include "dragon/spec.h"
#include "helpers.h"
#include "runtime/ops/checks.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static bool file_exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* ---- every row is complete --------------------------------------------------- */

Test(optable, every_row_is_complete)
{
	static const char *const families[] = { "lowrank", "decoder", "quantize", "pack", "attention",
						"norm", "embed", "loss", "gate", "step", "optim" };
	cr_assert_null(dg_op_info_of(DG_OP__COUNT));
	cr_assert_null(dg_op_info_of((dg_op)-1));
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *r = dg_op_info_of((dg_op)i);
		const char *op = dg_op_name((dg_op)i);
		cr_assert_not_null(r, "%s has no row", op);
		bool known = false;
		for (size_t f = 0; f < N_OF(families); f++)
			known |= r->family && strcmp(r->family, families[f]) == 0;
		cr_assert(known, "%s: family %s", op, r->family ? r->family : "(null)");
		cr_assert(r->module && r->module[0], "%s: no template module", op);
		cr_assert(r->about && strlen(r->about) > 10, "%s: no about line", op);
		cr_assert_null(strchr(r->about, '\n'), "%s: about is one line", op);
		cr_assert(r->fields & DG_FIELD_ARCH, "%s: reads no arch", op);
		cr_assert(r->fields & DG_FIELD_TILE, "%s: reads no tile", op);
		cr_assert(r->tile == DG_TILE_GEMM || r->tile == DG_TILE_THREADS, "%s: tile kind", op);
		cr_assert(r->check >= DG_CHECK_EXACT && r->check <= DG_CHECK_SCALED_CODES, "%s: check", op);
		cr_assert_not_null(r->build, "%s: no build set", op);
		/* packing */
		cr_assert(r->weight_axis == 0 || r->weight_axis == DG_FIELD_EMBD ||
				  r->weight_axis == DG_FIELD_LATENT, "%s: weight_axis", op);
		cr_assert(r->weight_axis == 0 || (r->fields & r->weight_axis) != 0,
			  "%s: packs along a length it does not read", op);
		cr_assert(r->weight_axis == 0 || (r->fields & DG_FIELD_WEIGHT), "%s: packs no weight", op);
		cr_assert(r->pack_fmt == DG_FMT__COUNT || dg_fmt_per_word(r->pack_fmt) > 4,
			  "%s: pack_fmt %d", op, (int)r->pack_fmt);
		cr_assert(!r->needs_relu || (r->fields & DG_FIELD_RELU), "%s: needs a relu it does not read", op);
		/* defaults name only fields the op reads */
		cr_assert_eq(r->defaults.fields & ~r->fields, 0, "%s: defaults of unread fields", op);
		/* the signature: named tensors, at least one output, shapes from
		 * the spec's fields */
		cr_assert(r->n_args >= 2 && r->n_args <= DG_OP_MAX_ARGS, "%s: %d args", op, r->n_args);
		int outputs = 0;
		bool has_bt = false, has_r = false, any_shape = false;
		for (int a = 0; a < r->n_args; a++) {
			const dg_op_arg *g = &r->args[a];
			cr_assert(g->name && g->name[0], "%s: args[%d] has no name", op, a);
			for (int b = 0; b < a; b++)
				cr_assert_str_neq(g->name, r->args[b].name, "%s: two args named %s", op, g->name);
			outputs += g->output;
			cr_assert(g->ndim >= 0 && g->ndim <= 4, "%s.%s: ndim %d", op, g->name, g->ndim);
			any_shape |= g->ndim == 0;
			for (int d = 0; d < g->ndim; d++) {
				cr_assert(g->dims[d] >= DG_DIM_B && g->dims[d] <= DG_DIM_S, "%s.%s: dims[%d]", op,
					  g->name, d);
				has_bt |= g->dims[d] == DG_DIM_B;
				has_r |= g->dims[d] == DG_DIM_R;
				dg_field need = g->dims[d] == DG_DIM_H || g->dims[d] == DG_DIM_HN ? DG_FIELD_HEADS
						: g->dims[d] == DG_DIM_HIN			   ? DG_FIELD_IN_HEADS
						: g->dims[d] == DG_DIM_D			   ? DG_FIELD_EMBD
						: g->dims[d] == DG_DIM_N			   ? DG_FIELD_LATENT
						: g->dims[d] == DG_DIM_V			   ? DG_FIELD_VOCAB
						: g->dims[d] == DG_DIM_C || g->dims[d] == DG_DIM_S ? DG_FIELD_CHUNK
												   : 0;
				cr_assert(!need || (r->fields & need), "%s.%s: a dimension of a field it does not read",
					  op, g->name);
			}
			dg_field src = g->fmt == DG_ARG_ACT ? DG_FIELD_ACT
				       : g->fmt == DG_ARG_WEIGHT ? DG_FIELD_WEIGHT
				       : g->fmt == DG_ARG_OUT ? DG_FIELD_OUT
				       : g->fmt == DG_ARG_SRC ? DG_FIELD_SRC
							       : 0;
			cr_assert(!src || (r->fields & src), "%s.%s: format of a field it does not read", op, g->name);
			cr_assert(g->fmt != DG_ARG_PACK || r->pack_fmt != DG_FMT__COUNT, "%s.%s: no pack_fmt", op,
				  g->name);
			/* an epilogue's argument: of an op that reads epi, of a known one */
			cr_assert(!g->epi || (r->fields & DG_FIELD_EPI), "%s.%s: of an epilogue, but %s reads no epi",
				  op, g->name, op);
			cr_assert_eq(g->epi & ~((1u << DG_EPI_STORE) | (1u << DG_EPI_MASK) | (1u << DG_EPI_ROPE)), 0,
				     "%s.%s: epi bits", op, g->name);
		}
		cr_assert_geq(outputs, 1, "%s: no output", op);
		/* every epilogue's call has an output of its own */
		for (int e = DG_EPI_STORE; (r->fields & DG_FIELD_EPI) && e <= DG_EPI_ROPE; e++) {
			dg_spec es;
			dg_spec_init(&es, (dg_op)i);
			es.epi = (dg_epi)e;
			if ((e == DG_EPI_ROPE) != (i == DG_OP_LOWRANK_FWD) && e != DG_EPI_STORE)
				continue; /* rope is lowrank_fwd's, mask attention_grad_xs's */
			int outs = 0;
			for (int a = 0; a < r->n_args; a++)
				outs += r->args[a].output && dg_op_arg_used(&es, a);
			cr_assert_geq(outs, 1, "%s: epi=%s writes nothing", op, dg_epi_name((dg_epi)e));
		}
		cr_assert(!any_shape || r->args[0].ndim == 0, "%s: the any-shape tensor comes first", op);
		/* the call sizes: B·T, rows R, or the quantizers' any shape */
		cr_assert_eq((int)has_bt + (int)has_r + (int)any_shape, 1,
			     "%s: a signature sized by exactly one of B·T, R or any shape", op);
		/* the tuner shapes ops without B·T by rows, the quantizers by width */
		if (!has_bt)
			cr_assert(r->tune.r_mul > 0 && r->tune.r_div > 0, "%s: no tuning case", op);
		if (any_shape)
			cr_assert_gt(r->tune.cols, 0, "%s: no tuning width", op);
	}
}

Test(optable, each_family_has_its_ops_file_and_template)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *r = dg_op_info_of((dg_op)i);
		char path[1024];
		snprintf(path, sizeof(path), "%s/runtime/ops/%s.c", DG_SOURCE_DIR, r->family);
		cr_assert(file_exists(path), "%s: no %s", dg_op_name((dg_op)i), path);
		snprintf(path, sizeof(path), "%s/templates/%s.lua", DG_SOURCE_DIR, r->module);
		cr_assert(file_exists(path), "%s: no %s", dg_op_name((dg_op)i), path);
	}
}

/* The codegen loads every module the op table names: a template set
 * without one does not create, and says which. */
Test(optable, each_module_is_a_template_that_loads)
{
	const char *done[DG_OP__COUNT];
	size_t n_done = 0;
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const char *m = dg_op_info_of((dg_op)i)->module;
		bool seen = false;
		for (size_t j = 0; j < n_done; j++)
			seen |= strcmp(done[j], m) == 0;
		if (seen)
			continue;
		done[n_done++] = m;
		char *dir = dg_test_tmpdir();
		char cmd[2048];
		snprintf(cmd, sizeof(cmd), "cp %s/templates/*.lua %s/ && rm %s/%s.lua", DG_SOURCE_DIR, dir,
			 dir, m);
		cr_assert_eq(system(cmd), 0);
		dg_codegen_opts o = { .template_dir = dir };
		dg_codegen *cg = NULL;
		cr_assert_eq(dg_codegen_create(&cg, &o), DG_ERR_TEMPLATE, "a set without %s.lua created", m);
		char want[128];
		snprintf(want, sizeof(want), "no templates/%s.lua", m);
		cr_assert(strstr(dg_codegen_errmsg(cg), want), "%s: %s", m, dg_codegen_errmsg(cg));
		dg_codegen_destroy(cg);
		dg_test_rmtree(dir);
	}
	cr_assert_geq(n_done, 5);
}

/* ---- every op renders at its defaults --------------------------------------- */

Test(optable, every_op_renders_at_its_defaults)
{
	dg_codegen *cg = NULL;
	char msg[512];
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const char *op = dg_op_name((dg_op)i);
		dg_spec s;
		dg_plan p;
		dg_source *src = NULL;
		dg_spec_init(&s, (dg_op)i);
		cr_assert_eq(s.op, (dg_op)i);
		cr_assert(dg_tile_is_auto(&s.tile));
		cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s: %s", op, msg);
		cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", op, dg_codegen_errmsg(cg));
		cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s: %s", op, dg_codegen_errmsg(cg));
		char want[80];
		snprintf(want, sizeof(want), "dg_%s", op);
		cr_assert(strncmp(p.entries[0].name, want, strlen(want)) == 0, "%s: first entry %s", op,
			  p.entries[0].name);
		cr_assert_str_eq(src->canonical, p.canonical);
		cr_assert(strstr(src->text, p.canonical), "%s: the source does not say its spec", op);
		dg_source_destroy(src);
		/* the canonical text reads back to the defaults */
		char c[DG_SPEC_TEXT_MAX];
		dg_spec back;
		cr_assert_eq(dg_spec_to_string(&s, c, sizeof(c)), DG_OK);
		cr_assert_eq(dg_spec_parse(c, &back, msg, sizeof(msg)), DG_OK, "%s: %s", c, msg);
		cr_assert(dg_spec_equal(&back, &s), "%s", c);
		char bare[64];
		snprintf(bare, sizeof(bare), "op=%s", op);
		cr_assert_eq(dg_spec_parse(bare, &back, msg, sizeof(msg)), DG_OK, "%s: %s", bare, msg);
		cr_assert(dg_spec_equal(&back, &s), "%s: the parser's defaults are dg_spec_init's", op);
	}
	dg_codegen_destroy(cg);
}

/* ---- the default build sets ---------------------------------------------------- */

#define MAX_KEYS 8
#define MAX_VALS 8

typedef struct build_set {
	char key[MAX_KEYS][32];
	char val[MAX_KEYS][MAX_VALS][32];
	int n_val[MAX_KEYS];
	int n_keys;
} build_set;

/* Splits "k=a,b;k2=c" into set (fails the test on a malformed list). */
static void build_split(const char *op, const char *text, build_set *set)
{
	char buf[512];
	memset(set, 0, sizeof(*set));
	snprintf(buf, sizeof(buf), "%s", text);
	char *save = NULL;
	for (char *pair = strtok_r(buf, ";", &save); pair; pair = strtok_r(NULL, ";", &save)) {
		char *eq = strchr(pair, '=');
		cr_assert_not_null(eq, "%s: build '%s': '%s' is not key=values", op, text, pair);
		cr_assert_lt(set->n_keys, MAX_KEYS);
		*eq = '\0';
		int k = set->n_keys++;
		snprintf(set->key[k], sizeof(set->key[k]), "%s", pair);
		for (int j = 0; j < k; j++)
			cr_assert_str_neq(set->key[j], pair, "%s: build names %s twice", op, pair);
		char *vs = NULL;
		for (char *v = strtok_r(eq + 1, ",", &vs); v; v = strtok_r(NULL, ",", &vs)) {
			cr_assert_lt(set->n_val[k], MAX_VALS);
			snprintf(set->val[k][set->n_val[k]++], 32, "%s", v);
		}
		cr_assert_gt(set->n_val[k], 0, "%s: build key %s has no values", op, pair);
	}
}

Test(optable, every_build_set_parses_and_expands_to_specs_that_plan)
{
	static const struct {
		const char *key;
		dg_field field;
	} fields[] = {
		{ "act", DG_FIELD_ACT },	 { "arch", DG_FIELD_ARCH },     { "embd", DG_FIELD_EMBD },
		{ "heads", DG_FIELD_HEADS },	 { "in_heads", DG_FIELD_IN_HEADS }, { "latent", DG_FIELD_LATENT },
		{ "out", DG_FIELD_OUT },	 { "relu", DG_FIELD_RELU },     { "src", DG_FIELD_SRC },
		{ "tile", DG_FIELD_TILE },	 { "weight", DG_FIELD_WEIGHT }, { "ascale", DG_FIELD_ASCALE },
		{ "wscale", DG_FIELD_WSCALE },
	};
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK, "%s", dg_codegen_errmsg(cg));
	size_t total = 0;
	for (int i = 0; i < DG_OP__COUNT; i++) {
		const dg_op_info *r = dg_op_info_of((dg_op)i);
		const char *op = dg_op_name((dg_op)i);
		build_set set;
		build_split(op, r->build, &set);
		for (int k = 0; k < set.n_keys; k++) {
			dg_field f = 0;
			for (size_t j = 0; j < N_OF(fields); j++)
				if (strcmp(fields[j].key, set.key[k]) == 0)
					f = fields[j].field;
			cr_assert_neq(f, 0, "%s: build key %s is no spec field", op, set.key[k]);
			cr_assert(r->fields & f, "%s: build key %s is a field it does not read", op, set.key[k]);
		}
		/* the product, odometer order */
		int at[MAX_KEYS] = { 0 };
		size_t n = 0;
		for (;;) {
			dg_spec s;
			char msg[512], text[DG_SPEC_TEXT_MAX];
			dg_plan p;
			dg_spec_init(&s, (dg_op)i);
			for (int k = 0; k < set.n_keys; k++)
				cr_assert_eq(dg_spec_set(&s, set.key[k], set.val[k][at[k]], msg, sizeof(msg)), DG_OK,
					     "%s: build %s=%s: %s", op, set.key[k], set.val[k][at[k]], msg);
			dg_spec_to_string(&s, text, sizeof(text));
			cr_assert_eq(dg_spec_validate(&s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
			cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s: %s", text, dg_codegen_errmsg(cg));
			n++;
			int k = set.n_keys - 1;
			while (k >= 0 && ++at[k] == set.n_val[k])
				at[k--] = 0;
			if (k < 0)
				break;
		}
		size_t want = 1;
		for (int k = 0; k < set.n_keys; k++)
			want *= (size_t)set.n_val[k];
		cr_assert_eq(n, want);
		total += n;
	}
	/* lowrank_fwd alone: 2 in_heads x 3 weights x 2 outs */
	cr_assert_geq(total, 12 + DG_OP__COUNT);
	dg_codegen_destroy(cg);
}

/* ---- the tensor signature is what each op's _check takes --------------------- */

/* The tensors of one call, in the op table's order. */
typedef struct call {
	dg_op op;
	dg_tensor t[DG_OP_MAX_ARGS];
	const dg_tensor *p[DG_OP_MAX_ARGS]; /* &t[i], or NULL for a missing one */
	bool unpack;
} call;

static const dg_tensor *by_name(const call *c, const char *name)
{
	const dg_op_info *r = dg_op_info_of(c->op);
	for (int i = 0; i < r->n_args; i++)
		if (strcmp(r->args[i].name, name) == 0)
			return c->p[i];
	cr_assert_fail("%s has no tensor %s", dg_op_name(c->op), name);
	return NULL;
}

/* The op's typed _check with c's tensors, by name. */
static dg_status run_check(const dg_spec *s, const call *c, char *msg, size_t size)
{
	switch (c->op) {
	case DG_OP_LOWRANK_FWD: {
		dg_lowrank_fwd_args a = { .x = by_name(c, "x"), .w = by_name(c, "w"), .out = by_name(c, "out"),
					  .rope = by_name(c, "rope"), .qr = by_name(c, "qr") };
		return dg_lowrank_fwd_check(s, &a, msg, size);
	}
	case DG_OP_RELU_MASK: {
		dg_relu_mask_args a = { .x = by_name(c, "x"), .w = by_name(c, "w"), .grad = by_name(c, "grad"),
					.grad_out = by_name(c, "grad_out") };
		return dg_relu_mask_check(s, &a, msg, size);
	}
	case DG_OP_LOWRANK_GRAD_INPUT: {
		dg_lowrank_grad_input_args a = { .grad = by_name(c, "grad"), .w = by_name(c, "w"),
						 .grad_x = by_name(c, "grad_x") };
		return dg_lowrank_grad_input_check(s, &a, msg, size);
	}
	case DG_OP_LOWRANK_GRAD_WEIGHT: {
		dg_lowrank_grad_weight_args a = { .grad = by_name(c, "grad"), .x = by_name(c, "x"),
						  .grad_w = by_name(c, "grad_w") };
		return dg_lowrank_grad_weight_check(s, &a, msg, size);
	}
	case DG_OP_DECODER_FWD: {
		dg_decoder_fwd_args a = { .y = by_name(c, "y"), .w = by_name(c, "w"), .out = by_name(c, "out") };
		return dg_decoder_fwd_check(s, &a, msg, size);
	}
	case DG_OP_DECODER_GRAD_INPUT: {
		dg_decoder_grad_input_args a = { .grad = by_name(c, "grad"), .w = by_name(c, "w"),
						 .grad_y = by_name(c, "grad_y") };
		return dg_decoder_grad_input_check(s, &a, msg, size);
	}
	case DG_OP_DECODER_GRAD_WEIGHT: {
		dg_decoder_grad_weight_args a = { .grad = by_name(c, "grad"), .y = by_name(c, "y"),
						  .grad_w = by_name(c, "grad_w") };
		return dg_decoder_grad_weight_check(s, &a, msg, size);
	}
	case DG_OP_QUANTIZE_ACT: {
		dg_quantize_act_args a = { .x = by_name(c, "x"), .codes = by_name(c, "codes") };
		return dg_quantize_act_check(s, &a, msg, size);
	}
	case DG_OP_QUANTIZE_WEIGHT: {
		dg_quantize_weight_args a = { .w = by_name(c, "w"), .codes = by_name(c, "codes") };
		return dg_quantize_weight_check(s, &a, msg, size);
	}
	case DG_OP_PACK_TERNARY:
	case DG_OP_PACK_SIGN1: {
		dg_pack_weight_args a = { .codes = by_name(c, "codes"), .packed = by_name(c, "packed"),
					  .unpack = c->unpack };
		return dg_pack_weight_check(s, &a, msg, size);
	}
	case DG_OP_PACK_I8X4:
	case DG_OP_UNPACK_I8X4: {
		dg_pack_i8x4_args a = { .codes = by_name(c, "codes"), .packed = by_name(c, "packed") };
		return dg_pack_i8x4_check(s, &a, msg, size);
	}
	case DG_OP_ROPE_FWD: {
		dg_rope_fwd_args a = { .x = by_name(c, "x"), .rope = by_name(c, "rope"), .out = by_name(c, "out") };
		return dg_rope_fwd_check(s, &a, msg, size);
	}
	case DG_OP_ROPE_BWD: {
		dg_rope_bwd_args a = { .grad = by_name(c, "grad"), .rope = by_name(c, "rope"),
				       .grad_x = by_name(c, "grad_x") };
		return dg_rope_bwd_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_SCORES: {
		dg_attention_scores_args a = { .xs = by_name(c, "xs"), .rope = by_name(c, "rope"),
					       .scores = by_name(c, "scores") };
		return dg_attention_scores_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_OUT: {
		dg_attention_out_args a = { .scores = by_name(c, "scores"), .v = by_name(c, "v"),
					    .out = by_name(c, "out") };
		return dg_attention_out_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_GRAD_SCORES: {
		dg_attention_grad_scores_args a = { .grad = by_name(c, "grad"), .v = by_name(c, "v"),
						    .grad_scores = by_name(c, "grad_scores") };
		return dg_attention_grad_scores_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_GRAD_V: {
		dg_attention_grad_v_args a = { .scores = by_name(c, "scores"), .grad = by_name(c, "grad"),
					       .grad_v = by_name(c, "grad_v") };
		return dg_attention_grad_v_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_GRAD_XS: {
		dg_attention_grad_xs_args a = { .grad_scores = by_name(c, "grad_scores"), .xs = by_name(c, "xs"),
						.rope = by_name(c, "rope"), .grad_xs = by_name(c, "grad_xs"),
						.dxs = by_name(c, "dxs"), .mask_xs = by_name(c, "mask_xs") };
		return dg_attention_grad_xs_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_STEP: {
		dg_attention_step_args a = { .xs = by_name(c, "xs"), .pos = by_name(c, "pos"),
					     .freq = by_name(c, "freq"), .v = by_name(c, "v"),
					     .state = by_name(c, "state"), .out = by_name(c, "out") };
		return dg_attention_step_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_STATE: {
		dg_attention_chunk_state_args a = { .qr = by_name(c, "qr"), .src = by_name(c, "src"),
						    .states = by_name(c, "states"), .backward = true };
		return dg_attention_chunk_state_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_OUT: {
		dg_attention_chunk_out_args a = { .qr = by_name(c, "qr"), .states = by_name(c, "states"),
						  .out = by_name(c, "out") };
		return dg_attention_chunk_out_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_DQ: {
		dg_attention_chunk_dq_args a = { .grad_scores = by_name(c, "grad_scores"), .qr = by_name(c, "qr"),
						 .grad = by_name(c, "grad"), .v = by_name(c, "v"),
						 .states = by_name(c, "states"), .rstates = by_name(c, "rstates"),
						 .rope = by_name(c, "rope"), .dxs = by_name(c, "dxs"),
						 .mask_xs = by_name(c, "mask_xs") };
		return dg_attention_chunk_dq_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_VREP: {
		dg_attention_chunk_vrep_args a = { .v = by_name(c, "v"), .vr = by_name(c, "vr") };
		return dg_attention_chunk_vrep_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_CAST: {
		dg_attention_chunk_cast_args a = { .grad = by_name(c, "grad"), .out = by_name(c, "out") };
		return dg_attention_chunk_cast_check(s, &a, msg, size);
	}
	case DG_OP_ATTENTION_CHUNK_HSUM: {
		dg_attention_chunk_hsum_args a = { .grad = by_name(c, "grad"), .grad_v = by_name(c, "grad_v") };
		return dg_attention_chunk_hsum_check(s, &a, msg, size);
	}
	case DG_OP_EMBED_FWD: {
		dg_embed_fwd_args a = { .idx = by_name(c, "idx"), .table = by_name(c, "table"),
					.out = by_name(c, "out") };
		return dg_embed_fwd_check(s, &a, msg, size);
	}
	case DG_OP_EMBED_BWD: {
		dg_embed_bwd_args a = { .idx = by_name(c, "idx"), .dout = by_name(c, "dout"),
					.dtable = by_name(c, "dtable") };
		return dg_embed_bwd_check(s, &a, msg, size);
	}
	case DG_OP_LAYERNORM_FWD: {
		dg_layernorm_fwd_args a = { .x = by_name(c, "x"), .y = by_name(c, "y"), .rstd = by_name(c, "rstd"),
					    .eps = 1e-5f };
		return dg_layernorm_fwd_check(s, &a, msg, size);
	}
	case DG_OP_LAYERNORM_BWD: {
		dg_layernorm_bwd_args a = { .dy = by_name(c, "dy"), .y = by_name(c, "y"), .rstd = by_name(c, "rstd"),
					    .dx = by_name(c, "dx") };
		return dg_layernorm_bwd_check(s, &a, msg, size);
	}
	case DG_OP_RESID_LN_FWD: {
		dg_resid_ln_fwd_args a = { .x = by_name(c, "x"), .y = by_name(c, "y"), .out = by_name(c, "out"),
					   .rstd = by_name(c, "rstd"), .eps = 1e-5f };
		return dg_resid_ln_fwd_check(s, &a, msg, size);
	}
	case DG_OP_RESID_LN_BWD: {
		dg_resid_ln_bwd_args a = { .dout = by_name(c, "dout"), .out = by_name(c, "out"),
					   .rstd = by_name(c, "rstd"), .dx = by_name(c, "dx"), .dy = by_name(c, "dy") };
		return dg_resid_ln_bwd_check(s, &a, msg, size);
	}
	case DG_OP_LMHEAD_CE: {
		/* the backward form (dx and dw needed), a workspace that fits any call here */
		dg_lmhead_ce_args a = { .x = by_name(c, "x"), .w = by_name(c, "w"), .targets = by_name(c, "targets"),
					.loss = by_name(c, "loss"), .dx = by_name(c, "dx"), .dw = by_name(c, "dw"),
					.backward = true, .ws = { (dg_dptr)0x4000000, (size_t)1 << 20 } };
		return dg_lmhead_ce_check(s, &a, msg, size);
	}
	case DG_OP_LMHEAD_LOGITS: {
		dg_lmhead_logits_args a = { .x = by_name(c, "x"), .w = by_name(c, "w"),
					    .logits = by_name(c, "logits") };
		return dg_lmhead_logits_check(s, &a, msg, size);
	}
	case DG_OP_GATE_FWD: {
		dg_gate_fwd_args a = { .xs = by_name(c, "xs"), .ys = by_name(c, "ys"), .xy = by_name(c, "xy"),
				       .p = 0.1f, .seed = 1, .step = 2, .layer = 3 };
		return dg_gate_fwd_check(s, &a, msg, size);
	}
	case DG_OP_GATE_QUANT: {
		dg_gate_quant_args a = { .xs = by_name(c, "xs"), .ys = by_name(c, "ys"), .codes = by_name(c, "codes"),
					 .p = 0.1f, .seed = 1, .step = 2, .layer = 3 };
		return dg_gate_quant_check(s, &a, msg, size);
	}
	case DG_OP_GATE_BWD: {
		dg_gate_bwd_args a = { .dxy = by_name(c, "dxy"), .xs = by_name(c, "xs"), .ys = by_name(c, "ys"),
				       .dxs = by_name(c, "dxs"), .p = 0.1f, .seed = 1, .step = 2, .layer = 3 };
		return dg_gate_bwd_check(s, &a, msg, size);
	}
	case DG_OP_ADD_MASK: {
		dg_add_mask_args a = { .dxs = by_name(c, "dxs"), .other = by_name(c, "other"), .xs = by_name(c, "xs") };
		return dg_add_mask_check(s, &a, msg, size);
	}
	case DG_OP_ADD3: {
		dg_add3_args a = { .a = by_name(c, "a"), .b = by_name(c, "b"), .c = by_name(c, "c"),
				   .out = by_name(c, "out") };
		return dg_add3_check(s, &a, msg, size);
	}
	case DG_OP_TRANSPOSE: {
		dg_transpose_args a = { .in = by_name(c, "in"), .out = by_name(c, "out") };
		return dg_transpose_check(s, &a, msg, size);
	}
	case DG_OP_DEQUANTIZE: {
		dg_dequantize_args a = { .codes = by_name(c, "codes"), .out = by_name(c, "out") };
		return dg_dequantize_check(s, &a, msg, size);
	}
	case DG_OP_DECODER_GATE_BWD: {
		dg_decoder_gate_bwd_args a = { .grad = by_name(c, "grad"), .w = by_name(c, "w"),
					       .xs = by_name(c, "xs"), .ys = by_name(c, "ys"),
					       .dxs = by_name(c, "dxs"), .dys = by_name(c, "dys"), .p = 0.1f,
					       .seed = 1, .step = 2, .layer = 3 };
		return dg_decoder_gate_bwd_check(s, &a, msg, size);
	}
	case DG_OP_DECODER_GATE_BWD_YS: {
		dg_decoder_gate_bwd_ys_args a = { .grad = by_name(c, "grad"), .w = by_name(c, "w"),
						  .xs = by_name(c, "xs"), .aq = by_name(c, "aq"),
						  .ev = by_name(c, "ev"), .dxs = by_name(c, "dxs"),
						  .dys = by_name(c, "dys"), .p = 0.1f, .seed = 1, .step = 2,
						  .layer = 3 };
		return dg_decoder_gate_bwd_ys_check(s, &a, msg, size);
	}
	case DG_OP_ADAMW_UPDATE: {
		dg_adamw_update_args a = { .p = by_name(c, "p"), .grad = by_name(c, "grad"),
					   .m = by_name(c, "m"), .v = by_name(c, "v"), .decay = true };
		return dg_adamw_update_check(s, &a, msg, size);
	}
	default:
		cr_assert_fail("op %d has no check here", (int)c->op);
		return DG_ERR_INTERNAL;
	}
}

/* An argument's format, written out here apart from the library's
 * dg_op_arg_fmt, which the test below holds to it. */
static dg_fmt fmt_of(const dg_spec *s, const dg_op_info *r, dg_arg_fmt f)
{
	switch (f) {
	case DG_ARG_ACT:
		return s->act;
	case DG_ARG_WEIGHT:
		return s->weight;
	case DG_ARG_OUT:
		return s->out;
	case DG_ARG_SRC:
		return s->src;
	case DG_ARG_INT8:
		return DG_FMT_INT8;
	case DG_ARG_PACK:
		return r->pack_fmt;
	case DG_ARG_I32:
		return DG_FMT_I32;
	case DG_ARG_BF16:
		return DG_FMT_BF16;
	default:
		return DG_FMT_F32;
	}
}

enum { CALL_B = 2, CALL_T = 3, CALL_R = 5 };

/* A dimension's extent in the calls built here (the tests' own copy of
 * the rule, not dg_op_dim_extent's). */
static int64_t extent_of(const dg_spec *s, dg_dim d)
{
	/* a chunked op's T: two whole chunks */
	const int64_t t = (dg_spec_uses(s->op) & DG_FIELD_CHUNK) ? 2 * (int64_t)s->chunk : CALL_T;
	return dg_test_dim_extent(s, d, CALL_B, t, CALL_R);
}

/* The call the signature describes: every tensor the spec uses at its
 * shape (any-shape ones 3x64), its format, a scale where its codes carry
 * one, aligned (fake) device pointers; another epilogue's NULL. */
static void make_call(const dg_spec *s, call *c)
{
	const dg_op_info *r = dg_op_info_of(s->op);
	memset(c, 0, sizeof(*c));
	c->op = s->op;
	for (int i = 0; i < r->n_args; i++) {
		const dg_op_arg *a = &r->args[i];
		if (!dg_op_arg_used(s, i))
			continue;
		int64_t shape[4] = { 3, 64, 0, 0 };
		int nd = a->ndim ? a->ndim : 2;
		for (int d = 0; d < a->ndim; d++)
			shape[d] = extent_of(s, a->dims[d]);
		c->t[i] = dg_tensor_make(a->name, fmt_of(s, r, a->fmt), (dg_dptr)0x100000 * (dg_dptr)(i + 1),
					 nd, shape);
		if (a->scale && dg_fmt_is_code(c->t[i].fmt))
			c->t[i].scale = (dg_dptr)0x900000 + 256 * (dg_dptr)i;
		c->p[i] = &c->t[i];
	}
}

/* A small spec of op, with a weight format that packs (ternary) where the
 * op takes one and in_heads = heads where it reads them, so every
 * dimension has its own extent. */
static dg_spec small_spec(dg_op op)
{
	dg_spec s;
	dg_spec_init(&s, op);
	const dg_op_info *r = dg_op_info_of(op);
	s.heads = 3;
	s.in_heads = (r->fields & DG_FIELD_IN_HEADS) ? 3 : 1;
	s.embd = 96;
	s.latent = 32;
	s.vocab = 40;
	if (r->weight_fmts & DG_FMT_BIT(DG_FMT_TERNARY))
		s.weight = DG_FMT_TERNARY;
	if (op == DG_OP_PACK_SIGN1)
		s.embd = 64;
	s.chunk = 64;
	char m[256];
	cr_assert_eq(dg_spec_validate(&s, m, sizeof(m)), DG_OK, "%s: %s", dg_op_name(op), m);
	return s;
}

/* Expects c refused with DG_ERR_INVALID_ARG and a message that starts
 * with "<name>: ". */
static void expect_names(const dg_spec *s, const call *c, const char *name, const char *what)
{
	char msg[512] = "", head[48];
	dg_status st = run_check(s, c, msg, sizeof(msg));
	cr_assert_eq(st, DG_ERR_INVALID_ARG, "%s, %s: accepted (%s)", dg_op_name(s->op), what, msg);
	snprintf(head, sizeof(head), "%s: ", name);
	cr_assert(strncmp(msg, head, strlen(head)) == 0, "%s, %s: '%s' does not name %s", dg_op_name(s->op),
		  what, msg, name);
}

/* The name of the first tensor of s's call after arg i that has dimension
 * d (B, T or R are bound by the first tensor that has them: a wrong one
 * shows there). */
static const char *next_with(const dg_spec *s, const dg_op_info *r, int i, dg_dim d)
{
	for (int j = i + 1; j < r->n_args; j++)
		for (int k = 0; k < r->args[j].ndim && dg_op_arg_used(s, j); k++)
			if (r->args[j].dims[k] == d)
				return r->args[j].name;
	return NULL;
}

static bool binds_first(const dg_spec *s, const dg_op_info *r, int i, dg_dim d)
{
	if (d != DG_DIM_B && d != DG_DIM_T && d != DG_DIM_R)
		return false;
	for (int j = 0; j < i; j++)
		for (int k = 0; k < r->args[j].ndim && dg_op_arg_used(s, j); k++)
			if (r->args[j].dims[k] == d)
				return false;
	return true;
}

/* Whether argument a has dimension d's size at another dimension too
 * ((B,H,T,T) scores): a change of one then shows in a itself. */
static bool twice(const dg_op_arg *a, int d)
{
	for (int k = 0; k < a->ndim; k++)
		if (k != d && a->dims[k] == a->dims[d])
			return true;
	return false;
}

static void check_signature(const dg_spec *s, bool unpack)
{
	const dg_op_info *r = dg_op_info_of(s->op);
	char msg[512], what[96];
	call c;
	int cases = 0;

	make_call(s, &c);
	c.unpack = unpack;
	cr_assert_eq(run_check(s, &c, msg, sizeof(msg)), DG_OK, "%s: the signature's call: %s",
		     dg_op_name(s->op), msg);
	for (int i = 0; i < r->n_args; i++) {
		const dg_op_arg *a = &r->args[i];
		if (!dg_op_arg_used(s, i)) {
			/* another epilogue's argument given: refused by name */
			make_call(s, &c);
			c.unpack = unpack;
			dg_spec u = *s;
			/* the op's other epilogue: lowrank_fwd's rope, attention_grad_xs's mask */
			const dg_epi other = s->op == DG_OP_LOWRANK_FWD ? DG_EPI_ROPE : DG_EPI_MASK;
			u.epi = u.epi == DG_EPI_STORE ? other : DG_EPI_STORE;
			call full;
			make_call(&u, &full);
			c.t[i] = full.t[i];
			c.p[i] = &c.t[i];
			snprintf(what, sizeof(what), "%s given with epi=%s", a->name, dg_epi_name(s->epi));
			expect_names(s, &c, a->name, what);
			cases++;
			continue;
		}
		/* each dimension off by one */
		int nd = c.t[i].ndim;
		for (int d = 0; d < nd; d++) {
			make_call(s, &c);
			c.unpack = unpack;
			c.t[i].shape[d] += 1;
			snprintf(what, sizeof(what), "%s dimension %d + 1", a->name, d);
			if (a->ndim == 0 && i == 0) {
				/* the any-shape input sets the shape: its codes differ */
				expect_names(s, &c, r->args[1].name, what);
			} else if (a->ndim && binds_first(s, r, i, a->dims[d]) && !twice(a, d)) {
				const char *next = next_with(s, r, i, a->dims[d]);
				if (!next)
					continue; /* nothing else has it: any extent is a call's */
				expect_names(s, &c, next, what);
			} else {
				expect_names(s, &c, a->name, what);
			}
			cases++;
		}
		/* a dimension too many */
		if (nd < 4) {
			make_call(s, &c);
			c.unpack = unpack;
			if (a->ndim == 0 && i == 0) {
				c.t[1].shape[c.t[1].ndim++] = 1;
				expect_names(s, &c, r->args[1].name, "codes with one more dimension");
			} else {
				c.t[i].shape[c.t[i].ndim++] = 1;
				snprintf(what, sizeof(what), "%s with one more dimension", a->name);
				expect_names(s, &c, a->name, what);
			}
			cases++;
		}
		/* missing */
		make_call(s, &c);
		c.unpack = unpack;
		c.p[i] = NULL;
		snprintf(what, sizeof(what), "%s missing", a->name);
		expect_names(s, &c, a->name, what);
		/* another format */
		make_call(s, &c);
		c.unpack = unpack;
		c.t[i].fmt = c.t[i].fmt == DG_FMT_F32 ? DG_FMT_BF16 : DG_FMT_F32;
		c.t[i].scale = (dg_dptr)0x900000;
		snprintf(what, sizeof(what), "%s as %s", a->name, dg_fmt_name(c.t[i].fmt));
		expect_names(s, &c, a->name, what);
		/* codes without their scale */
		make_call(s, &c);
		c.unpack = unpack;
		if (c.t[i].scale) {
			c.t[i].scale = 0;
			snprintf(what, sizeof(what), "%s without its scale", a->name);
			expect_names(s, &c, a->name, what);
		}
		/* misaligned data */
		make_call(s, &c);
		c.unpack = unpack;
		c.t[i].data += 4;
		snprintf(what, sizeof(what), "%s misaligned", a->name);
		expect_names(s, &c, a->name, what);
		cases += 3;
	}
	cr_assert_gt(cases, r->n_args * 3);
}

Test(optable, arg_formats_follow_the_spec)
{
	for (int op = 0; op < DG_OP__COUNT; op++) {
		const dg_op_info *r = dg_op_info_of((dg_op)op);
		dg_spec s;
		dg_spec_init(&s, (dg_op)op);
		/* formats that differ field from field, so a mix-up shows */
		s.act = DG_FMT_INT4;
		s.weight = DG_FMT_TERNARY;
		s.out = DG_FMT_BF16;
		s.src = DG_FMT_UINT8POS;
		for (int f = DG_ARG_ACT; f <= DG_ARG_BF16; f++)
			cr_assert_eq(dg_op_arg_fmt(&s, (dg_arg_fmt)f), fmt_of(&s, r, (dg_arg_fmt)f),
				     "%s: arg format %d", dg_op_name((dg_op)op), f);
	}
}

Test(optable, signatures_are_what_the_checks_take)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_spec s = small_spec((dg_op)i);
		check_signature(&s, false);
		if (s.op == DG_OP_PACK_TERNARY || s.op == DG_OP_PACK_SIGN1)
			check_signature(&s, true);
		/* the shared-input form of the projection */
		if (dg_op_info_of(s.op)->fields & DG_FIELD_IN_HEADS) {
			s.in_heads = 1;
			check_signature(&s, false);
		}
		/* the other epilogue's call (attention_grad_xs epi=mask,
		 * lowrank_fwd epi=rope: bf16 out) */
		if (dg_op_info_of(s.op)->fields & DG_FIELD_EPI) {
			s.epi = s.op == DG_OP_LOWRANK_FWD ? DG_EPI_ROPE : DG_EPI_MASK;
			s.out = DG_FMT_BF16;
			check_signature(&s, false);
		}
	}
}

/* The checks refuse a spec of another op, an invalid spec, NULL args. */
Test(optable, checks_refuse_the_wrong_spec)
{
	for (int i = 0; i < DG_OP__COUNT; i++) {
		dg_spec s = small_spec((dg_op)i);
		call c;
		char msg[512];
		make_call(&s, &c);
		dg_spec other = s;
		other.op = (dg_op)((i + 3) % DG_OP__COUNT);
		/* pack_i8x4 and unpack_i8x4 share a check */
		if ((s.op == DG_OP_PACK_I8X4 || s.op == DG_OP_UNPACK_I8X4) &&
		    (other.op == DG_OP_PACK_I8X4 || other.op == DG_OP_UNPACK_I8X4))
			other.op = DG_OP_LOWRANK_FWD;
		if ((s.op == DG_OP_PACK_TERNARY || s.op == DG_OP_PACK_SIGN1) &&
		    (other.op == DG_OP_PACK_TERNARY || other.op == DG_OP_PACK_SIGN1))
			other.op = DG_OP_LOWRANK_FWD;
		cr_assert_eq(run_check(&other, &c, msg, sizeof(msg)), DG_ERR_INVALID_SPEC, "%s took a %s spec",
			     dg_op_name(s.op), dg_op_name(other.op));
		cr_assert(strstr(msg, dg_op_name(other.op)), "%s", msg);
		dg_spec bad = s;
		bad.arch = 20; /* every op reads arch */
		cr_assert_eq(run_check(&bad, &c, msg, sizeof(msg)), DG_ERR_INVALID_SPEC, "%s: %s",
			     dg_op_name(s.op), msg);
		cr_assert_eq(run_check(NULL, &c, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	}
}
