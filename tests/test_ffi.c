/*
 * dragon/ffi.h, the flat door foreign callers use:
 *   - specs parse into handles, with the parser's messages;
 *   - dg_ffi_op_args lists each op's tensors with the spec's formats and
 *     the call's shapes (every op of the table, at two sizes);
 *   - dg_ffi_op_check refuses a wrong shape, format, count or a
 *     non-contiguous tensor by name, and passes a right call, without a
 *     device; it is the op's whole check, the rules of its family file
 *     too (quantize_act ascale=token's 4-D x, dequantize's 2-D codes, the
 *     gate's p and step_at), and judges no workspace (lmhead_ce);
 *   - the CPU model: its params are the reference's names and shapes, a
 *     run's loss and gradients are dg_model_cpu_step's, a master changed
 *     in place is what the next run sees, bad tokens and presets the CPU
 *     does not run are refused;
 *   - bundles: texts build into a folder the reader checks, a text that
 *     does not parse is named by its place, the default set is listed
 *     whole (a buffer too small says the size it needs);
 *   - on a GPU: a run of the model (host and device tokens) gives
 *     dg_model_step's loss and gradients, and after the masters are
 *     changed on the device, the run equals a model made from the changed
 *     weights (the execution copies remade: w8a8, bitnet and bf16); an op
 *     through the door equals the typed op;
 *   - prepared ops through the door: a prepare refuses a NULL argument, a
 *     bad spec, a wrong count or shape by name without a device, and a
 *     right call is the device's failure there (a NULL handle's run is
 *     refused too); on a GPU a prepared op launched twice equals the typed
 *     op each time and refuses a launch of another shape, count, pointer
 *     or workspace by name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/dragon.h"
#include "dragon/ffi.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/store/specset.h"
#include "runtime/ops/checks.h"

Test(ffi, version_and_specs)
{
	cr_assert_eq(dg_ffi_version(), DG_FFI_VERSION);
	dg_spec *s = NULL;
	char msg[512], text[DG_SPEC_TEXT_MAX];
	cr_assert_eq(dg_ffi_spec_parse("op=lowrank_fwd;heads=2;latent=64;embd=32;relu=0", &s, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_assert_eq(dg_ffi_spec_text(s, text, sizeof(text)), DG_OK);
	cr_assert(strstr(text, "op=lowrank_fwd") && strstr(text, "heads=2"), "%s", text);
	dg_ffi_spec_destroy(s);
	s = (dg_spec *)1;
	cr_assert_eq(dg_ffi_spec_parse("op=lowrank_fwd;latent=8190", &s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "latent=8190"), "%s", msg);
	cr_assert_null(s);
	cr_assert_eq(dg_ffi_spec_parse("op=lowrank_fwd;heads=4;latent=8192;embd=256;weight=ternary;act=int8;relu=0",
				       &s, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	char path[64];
	cr_assert_eq(dg_ffi_spec_plan(s, 90, path, sizeof(path), text, sizeof(text), msg, sizeof(msg)), DG_OK, "%s",
		     msg);
	cr_assert(path[0] && strstr(text, "tile=") && !strstr(text, "tile=auto"), "%s: %s", path, text);
	dg_ffi_spec_destroy(s);
	cr_assert_eq(dg_ffi_spec_parse("op=lowrank_fwd;tile=48x64x64/2x2/2", &s, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(dg_ffi_spec_plan(s, 90, path, sizeof(path), NULL, 0, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "48"), "%s", msg);
	dg_ffi_spec_destroy(s);
	cr_assert_eq(dg_ffi_spec_parse("op=frob", &s, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(msg, "frob"), "%s", msg);
	dg_ffi_spec_destroy(NULL);
}

Test(ffi, bundles)
{
	char *root = dg_test_tmpdir();
	char out[600], cache[600], msg[2048], lines[4096];
	const char *specs[] = { "op=pack_i8x4;latent=256", "op=unpack_i8x4;latent=256" };
	dg_ffi_bundle_summary sum;
	uint64_t need = 0;
	int32_t n = 0;

	snprintf(out, sizeof(out), "%s/bundle", root);
	snprintf(cache, sizeof(cache), "%s/cache", root);
	cr_assert_eq(dg_ffi_bundle_build(out, specs, 2, "", 0, 2, cache, 0, "none", 0, &sum, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	cr_expect_eq(sum.kernels, 2);
	cr_expect_eq(sum.specs, 2);
	cr_expect_eq(sum.step, 0);
	cr_expect_str_empty(sum.device);
	cr_assert_eq(dg_ffi_bundle_check(out, lines, sizeof(lines), &need, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_expect_eq(n, 2);
	cr_expect_eq(need, strlen(lines) + 1);
	cr_expect(strstr(lines, "op=pack_i8x4;") && strstr(lines, "op=unpack_i8x4;") && !strstr(lines, "tile=auto"),
		  "%s", lines);
	cr_expect_eq(dg_ffi_bundle_check(out, lines, 8, &need, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_expect_eq(need, strlen(lines) + 1, "a short buffer still learns the size");

	const char *bad[] = { "op=pack_i8x4;latent=256", "op=frob" };
	char other[700];
	snprintf(other, sizeof(other), "%s/other", root);
	cr_expect_eq(dg_ffi_bundle_build(other, bad, 2, "", 0, 0, cache, 0, NULL, 0, &sum, msg, sizeof(msg)),
		     DG_ERR_INVALID_SPEC);
	cr_expect(strstr(msg, "specs[1]: ") && strstr(msg, "frob"), "%s", msg);
	cr_expect_eq(dg_ffi_bundle_build(other, bad, 0, "", 0, 0, cache, 0, NULL, 0, &sum, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG, "an empty list");
	cr_expect_eq(dg_ffi_bundle_check(other, lines, sizeof(lines), &need, &n, msg, sizeof(msg)),
		     DG_ERR_NOT_FOUND, "nothing was written: %s", msg);

	need = 0;
	cr_expect_eq(dg_ffi_bundle_default_specs(NULL, 0, &need, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_expect_eq(n, DG__SPECSET_DEFAULT_SIZE);
	char *all = malloc(need);
	cr_assert_eq(dg_ffi_bundle_default_specs(all, need, &need, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	size_t rows = 0;
	for (const char *c = all; *c; c++)
		rows += *c == '\n';
	cr_expect_eq(rows, DG__SPECSET_DEFAULT_SIZE);
	free(all);
	dg_test_rmtree(root);
}

Test(ffi, op_args_are_the_op_tables)
{
	char msg[512];
	for (int op = 0; op < DG_OP__COUNT; op++) {
		dg_spec s;
		dg_spec_init(&s, (dg_op)op);
		const dg_op_info *info = dg_op_info_of((dg_op)op);
		for (int size = 1; size <= 2; size++) {
			dg_ffi_tensor a[DG_OP_MAX_ARGS];
			int32_t out[DG_OP_MAX_ARGS], opt[DG_OP_MAX_ARGS], n = -1;
			/* a chunked op's T: whole chunks */
			const int64_t T = (info->fields & DG_FIELD_CHUNK) ? (int64_t)s.chunk * size : 3 * size;
			cr_assert_eq(dg_ffi_op_args(&s, 2 * size, T, 5 * size, a, out, opt, &n, msg, sizeof(msg)),
				     DG_OK, "%s: %s", dg_op_name((dg_op)op), msg);
			int k = 0;
			for (int i = 0; i < info->n_args; i++) {
				if (!dg_op_arg_used(&s, i))
					continue;
				cr_assert_str_eq(a[k].name, info->args[i].name);
				cr_assert_eq(out[k], info->args[i].output);
				cr_assert_eq(opt[k], info->args[i].optional);
				cr_assert_eq(a[k].fmt, (int32_t)dg_op_arg_fmt(&s, info->args[i].fmt));
				cr_assert_eq(a[k].ndim, info->args[i].ndim);
				for (int d = 0; d < a[k].ndim; d++) {
					dg_dim dd = info->args[i].dims[d];
					int64_t want = dd == DG_DIM_B ? 2 * size : dd == DG_DIM_T ? T
						       : dd == DG_DIM_R ? 5 * size : -1;
					if (want > 0)
						cr_assert_eq(a[k].shape[d], want, "%s %s dim %d", dg_op_name((dg_op)op),
							     a[k].name, d);
					else
						cr_assert_geq(a[k].shape[d], 1);
				}
				k++;
			}
			cr_assert_eq(n, k, "%s", dg_op_name((dg_op)op));
		}
	}
	dg_spec s;
	dg_spec_init(&s, DG_OP_LOWRANK_FWD);
	dg_ffi_tensor a[DG_OP_MAX_ARGS];
	int32_t n;
	cr_assert_eq(dg_ffi_op_args(&s, 0, 3, 1, a, NULL, NULL, &n, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "B is 0"), "%s", msg);
}

/* lowrank_fwd's three tensors at B 2, T 3 (H 2, E 32, L 64, int8), at
 * aligned placeholder addresses (the check reads no memory). */
static dg_spec *lowrank(dg_ffi_tensor a[3])
{
	dg_spec *s;
	char msg[512];
	cr_assert_eq(dg_ffi_spec_parse("op=lowrank_fwd;heads=2;latent=64;embd=32;relu=0", &s, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	int32_t n;
	cr_assert_eq(dg_ffi_op_args(s, 2, 3, 1, a, NULL, NULL, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_eq(n, 3);
	for (int i = 0; i < 3; i++) {
		a[i].data = (uint64_t)(1u << 20) * (uint64_t)(i + 1);
		a[i].scale = a[i].data + 4096;
	}
	return s;
}

Test(ffi, op_check_names_what_is_wrong)
{
	char msg[512];
	dg_ffi_tensor a[3];
	dg_spec *s = lowrank(a);
	cr_assert_eq(dg_ffi_op_check(s, a, 3, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);

	dg_ffi_tensor b[3];
	memcpy(b, a, sizeof(b));
	b[1].shape[2] = 31;
	cr_assert_eq(dg_ffi_op_check(s, b, 3, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "w") && strstr(msg, "31"), "%s", msg);

	memcpy(b, a, sizeof(b));
	b[0].fmt = DG_FMT_F32;
	cr_assert_eq(dg_ffi_op_check(s, b, 3, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "x") && strstr(msg, "int8"), "%s", msg);

	memcpy(b, a, sizeof(b));
	b[2].stride[0] = 1;
	b[2].stride[1] = 1;
	b[2].stride[2] = 1;
	b[2].stride[3] = 1;
	cr_assert_eq(dg_ffi_op_check(s, b, 3, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "out") && strstr(msg, "contiguous"), "%s", msg);

	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "takes 3 tensors (x, w, out), got 2"), "%s", msg);

	memcpy(b, a, sizeof(b));
	b[0].fmt = 99;
	cr_assert_eq(dg_ffi_op_check(s, b, 3, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "format 99"), "%s", msg);
	dg_ffi_spec_destroy(s);
}

/* text's op's tensors at B b, T t, R r (dg_ffi_op_args), the ones a call
 * must give at aligned placeholder addresses, the optional left out. */
static dg_spec *placed(const char *text, int64_t b, int64_t t, int64_t r, dg_ffi_tensor *a, int32_t *n)
{
	dg_spec *s;
	char msg[512];
	int32_t opt[DG_OP_MAX_ARGS];
	cr_assert_eq(dg_ffi_spec_parse(text, &s, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	cr_assert_eq(dg_ffi_op_args(s, b, t, r, a, NULL, opt, n, msg, sizeof(msg)), DG_OK, "%s: %s", text, msg);
	for (int i = 0; i < *n; i++) {
		if (opt[i])
			continue;
		a[i].data = (uint64_t)(1u << 20) * (uint64_t)(i + 1);
		a[i].scale = a[i].data + 4096;
	}
	return s;
}

/* A tensor of an any-shape argument (ndim 0 in the op table: the
 * quantizers', dequantize's) of ndim extents shape, at placeholder slot's
 * aligned address. */
static dg_ffi_tensor any_shape(const char *name, dg_fmt fmt, int ndim, const int64_t *shape, int slot)
{
	dg_ffi_tensor t = { .name = name, .fmt = fmt, .ndim = ndim };
	for (int d = 0; d < ndim; d++)
		t.shape[d] = shape[d];
	t.data = (uint64_t)(1u << 20) * (uint64_t)(slot + 1);
	t.scale = t.data + 4096;
	return t;
}

/* quantize_act ascale=token reads tokens (b, t) of a (B, G, T, C) x: a
 * 2-D x passes the op table (any shape) but not the op, through the door
 * and the typed check alike; a scale a tensor takes any shape. */
Test(ffi, op_check_quantize_act_token_needs_4d)
{
	char msg[512];
	dg_spec *s;
	cr_assert_eq(dg_ffi_spec_parse("op=quantize_act;src=f32;act=int8;ascale=token", &s, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	const int64_t flat[2] = { 6, 64 }, tok[4] = { 1, 1, 6, 64 };
	dg_ffi_tensor a[2] = { any_shape("x", DG_FMT_F32, 2, flat, 0), any_shape("codes", DG_FMT_INT8, 2, flat, 1) };
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "dg_quantize_act: x: ascale=token reads a (B, G, T, C) tensor, a token (b, t) over its G heads; got 2 dimensions"),
		  "%s", msg);
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, NULL, 0), DG_ERR_INVALID_ARG, "no message buffer");

	dg_tensor tx = dg_tensor_2d("x", DG_FMT_F32, a[0].data, 6, 64);
	dg_tensor tc = dg_tensor_2d("codes", DG_FMT_INT8, a[1].data, 6, 64);
	tc.scale = a[1].scale;
	dg_quantize_act_args qa = { .x = &tx, .codes = &tc };
	cr_assert_eq(dg_quantize_act_check(s, &qa, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "got 2 dimensions"), "%s", msg);

	a[0] = any_shape("x", DG_FMT_F32, 4, tok, 0);
	a[1] = any_shape("codes", DG_FMT_INT8, 4, tok, 1);
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	tx = dg_tensor_4d("x", DG_FMT_F32, a[0].data, 1, 1, 6, 64);
	tc = dg_tensor_4d("codes", DG_FMT_INT8, a[1].data, 1, 1, 6, 64);
	tc.scale = a[1].scale;
	cr_assert_eq(dg_quantize_act_check(s, &qa, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_ffi_spec_destroy(s);

	cr_assert_eq(dg_ffi_spec_parse("op=quantize_act;src=f32;act=int8;ascale=tensor", &s, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	a[0] = any_shape("x", DG_FMT_F32, 2, flat, 0);
	a[1] = any_shape("codes", DG_FMT_INT8, 2, flat, 1);
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_ffi_spec_destroy(s);
}

/* Rules of the family files the op table cannot say, each a call the
 * table's check alone passes: dequantize's 2-D codes (its rows are a
 * scale's), the gate's drop probability and step_at's alignment (options,
 * not tensors). lmhead_ce is checked without its workspace: a check comes
 * before the workspace is sized. */
Test(ffi, op_check_is_the_ops_own)
{
	char msg[512];
	dg_spec *s;
	cr_assert_eq(dg_ffi_spec_parse("op=dequantize;act=int8;ascale=tensor;out=f32", &s, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	const int64_t rows[2] = { 6, 64 }, stack[3] = { 2, 3, 64 };
	dg_ffi_tensor a[DG_OP_MAX_ARGS] = { any_shape("codes", DG_FMT_INT8, 2, rows, 0),
					    any_shape("out", DG_FMT_F32, 2, rows, 1) };
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	a[0] = any_shape("codes", DG_FMT_INT8, 3, stack, 0);
	a[1] = any_shape("out", DG_FMT_F32, 3, stack, 1);
	cr_assert_eq(dg_ffi_op_check(s, a, 2, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "codes: dg_dequantize: expected (R, C) codes, got 3 dimensions"), "%s", msg);
	dg_ffi_spec_destroy(s);

	int32_t n;
	s = placed("op=gate_fwd;heads=2;latent=64;act=f32", 2, 3, 1, a, &n);
	cr_assert_eq(n, 3);
	dg_ffi_opts o = { .p = 0.1f, .seed = 7 };
	cr_assert_eq(dg_ffi_op_check(s, a, n, &o, msg, sizeof(msg)), DG_OK, "%s", msg);
	o.p = 1.5f;
	cr_assert_eq(dg_ffi_op_check(s, a, n, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "dg_gate_fwd: p=1.5"), "%s", msg);
	o.p = 0.1f;
	o.step_at = a[0].data + 2;
	cr_assert_eq(dg_ffi_op_check(s, a, n, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "step_at") && strstr(msg, "4-byte aligned"), "%s", msg);
	dg_ffi_spec_destroy(s);

	s = placed("op=lmhead_ce;embd=32;vocab=64", 1, 1, 5, a, &n);
	cr_assert_eq(n, 6);
	cr_assert_eq(dg_ffi_op_check(s, a, n, NULL, msg, sizeof(msg)), DG_OK, "%s", msg);
	o = (dg_ffi_opts){ .bad = a[0].data + 1 };
	cr_assert_eq(dg_ffi_op_check(s, a, n, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "bad") && strstr(msg, "4-byte aligned"), "%s", msg);
	dg_ffi_spec_destroy(s);
}

#define SIZES (&(dg_ffi_model_sizes){ .layers = 2, .embd = 32, .heads = 2, .neurons = 64, .vocab = 0, .dropout = 0.1f })

/* B 2, T 8 tokens and targets. */
static void tokens(int32_t *idx, int32_t *tgt, int n, int vocab, int salt)
{
	for (int i = 0; i < n; i++) {
		idx[i] = (i * 37 + salt * 11 + 5) % vocab;
		tgt[i] = (i * 53 + salt * 7 + 1) % vocab;
	}
}

Test(ffi, cpu_model_is_dg_model_cpu_step)
{
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	cr_assert_eq(c->embd, 32);
	static const char *names[5] = { "embed.weight", "encoder", "encoder_v", "decoder", "lm_head" };
	float *master[5], *grad[5];
	for (int p = 0; p < 5; p++) {
		const char *name;
		int32_t nd;
		int64_t sh[3];
		uint64_t mp, gp;
		cr_assert_eq(dg_ffi_model_param(m, p, &name, &nd, sh, &mp, &gp), DG_OK);
		cr_assert_str_eq(name, names[p]);
		int ndw;
		int64_t shw[3];
		dg_model_param_shape(c, (dg_model_param)p, &ndw, shw);
		cr_assert_eq(nd, ndw);
		for (int d = 0; d < nd; d++)
			cr_assert_eq(sh[d], shw[d]);
		master[p] = (float *)(uintptr_t)mp;
		grad[p] = (float *)(uintptr_t)gp;
	}
	cr_assert_eq(dg_ffi_model_param(m, 5, NULL, NULL, NULL, NULL, NULL), DG_ERR_INVALID_ARG);

	int32_t idx[16], tgt[16];
	tokens(idx, tgt, 16, 256, 1);
	dg_model_weights *w, *g;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(c, 7, &g, msg, sizeof(msg)), DG_OK);
	for (int round = 0; round < 2; round++) {
		if (round) { /* a master changed in place: the next run sees it */
			master[DG_PARAM_ENCODER][3] += 0.25f;
			w->params[DG_PARAM_ENCODER][3] += 0.25f;
		}
		cr_assert_eq(dg_ffi_model_run(m, (uint64_t)(uintptr_t)idx, (uint64_t)(uintptr_t)tgt, 0, 9, 4, 1, 1,
					      msg, sizeof(msg)),
			     DG_OK, "%s", msg);
		dg_model_batch bt = { .idx = idx, .targets = tgt, .b = 2, .t = 8, .seed = 9, .step = 4, .train = true };
		double want;
		cr_assert_eq(dg_model_cpu_step(w, &bt, &want, g, msg, sizeof(msg)), DG_OK, "%s", msg);
		float got = *(float *)(uintptr_t)dg_ffi_model_loss(m);
		cr_assert_eq(got, (float)want, "round %d: loss %.9g, want %.9g", round, got, want);
		for (int p = 0; p < 5; p++) {
			int nd;
			int64_t sh[3];
			int64_t n = dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
			cr_assert_eq(memcmp(grad[p], g->params[p], (size_t)n * 4), 0, "round %d: %s's gradient", round,
				     names[p]);
		}
	}
	idx[5] = 256;
	cr_assert_eq(dg_ffi_model_run(m, (uint64_t)(uintptr_t)idx, (uint64_t)(uintptr_t)tgt, 0, 9, 4, 1, 1, msg,
				      sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "idx[5] = 256"), "%s", msg);
	cr_assert_eq(dg_ffi_model_run(m, 1, 1, 1, 0, 0, 1, 1, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "CPU"), "%s", msg);
	cr_assert_eq(dg_ffi_model_bad(m), 0);
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg_ffi_model_destroy(m);

	m = (dg_ffi_model *)1;
	cr_assert_eq(dg_ffi_model_create(NULL, "bf16", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_ERR_UNSUPPORTED);
	cr_assert(strstr(msg, "needs a GPU"), "%s", msg);
	cr_assert_null(m);
	cr_assert_eq(dg_ffi_model_create(NULL, "fp4", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "fp4"), "%s", msg);
	dg_ffi_model_sizes bad = *SIZES;
	bad.neurons = 63;
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", &bad, 2, 8, 7, &m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "neurons=63"), "%s", msg);
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", SIZES, 0, 8, 7, &m, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	dg_ffi_model_destroy(NULL);
}

/* dg_ffi_model_logits is dg_model_cpu_logits of the model's masters (a
 * vocabulary of 512), a token past it refused by name. */
Test(ffi, cpu_model_logits)
{
	char msg[512];
	dg_ffi_model *m;
	dg_ffi_model_sizes sz = *SIZES;
	sz.vocab = 512;
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", &sz, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	int32_t idx[16], tgt[16];
	tokens(idx, tgt, 16, 512, 2);
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	static float got[2 * 512], want[2 * 512];
	dg_model_batch bt = { .idx = idx, .b = 2, .t = 8 };
	for (int pos = 0; pos < 8; pos += 7) {
		cr_assert_eq(dg_ffi_model_logits(m, (uint64_t)(uintptr_t)idx, pos, (uint64_t)(uintptr_t)got, msg,
						 sizeof(msg)),
			     DG_OK, "%s", msg);
		cr_assert_eq(dg_model_cpu_logits(w, &bt, pos, want, msg, sizeof(msg)), DG_OK, "%s", msg);
		cr_assert_eq(memcmp(got, want, sizeof(got)), 0, "pos %d: the logits differ", pos);
	}
	idx[3] = 512;
	cr_assert_eq(dg_ffi_model_logits(m, (uint64_t)(uintptr_t)idx, 7, (uint64_t)(uintptr_t)got, msg, sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "idx[3] = 512"), "%s", msg);
	cr_assert_eq(dg_ffi_model_logits(m, 0, 7, (uint64_t)(uintptr_t)got, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	dg_model_weights_destroy(w);
	dg_ffi_model_destroy(m);
}

/* dg_ffi_model_decode: rows restarted with their prompts, then a token a
 * row, the logits as the full forward's over every token so far (within
 * the f32 state's rounding); continuing without a state, or another
 * number of rows, refused. */
Test(ffi, cpu_model_decode)
{
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(NULL, "f32", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	const int V = c->vocab;
	int32_t idx[24], tgt[24], ctx[12], two[2];
	tokens(idx, tgt, 24, V, 3);
	float *got = malloc(2 * (size_t)V * sizeof(float)), *want = malloc((size_t)V * sizeof(float));
	cr_assert(got && want);
	dg_model_weights *w;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)idx, 2, 1, 0, (uint64_t)(uintptr_t)got, msg,
					 sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "restart"), "%s", msg);
	/* rows of 10 prompt tokens: idx[0..9], idx[10..19]; then idx[20], idx[21] */
	cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)idx, 2, 10, 1, (uint64_t)(uintptr_t)got, msg,
					 sizeof(msg)),
		     DG_OK, "%s", msg);
	for (int k = 0; k < 2; k++) {
		for (int r = 0; r < 2; r++) {
			memcpy(ctx, idx + 10 * r, 10 * sizeof(int32_t));
			if (k)
				ctx[10] = idx[20 + r];
			dg_model_batch bt = { .idx = ctx, .b = 1, .t = 10 + k };
			cr_assert_eq(dg_model_cpu_logits(w, &bt, 9 + k, want, msg, sizeof(msg)), DG_OK, "%s", msg);
			for (int v = 0; v < V; v++)
				cr_assert_float_eq(got[r * V + v], want[v], 1e-5, "row %d, step %d, logit %d", r, k, v);
		}
		two[0] = idx[20], two[1] = idx[21];
		if (!k)
			cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)two, 2, 1, 0,
							 (uint64_t)(uintptr_t)got, msg, sizeof(msg)),
				     DG_OK, "%s", msg);
	}
	cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)two, 1, 1, 0, (uint64_t)(uintptr_t)got, msg,
					 sizeof(msg)),
		     DG_ERR_INVALID_ARG);
	dg_model_weights_destroy(w);
	dg_ffi_model_destroy(m);
	free(got);
	free(want);
}

/* The GPU model through the door against dg_model_step, before and after
 * its masters are changed on the device. */
static void gpu_model_case(const char *preset)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(dev, preset, SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s: %s", preset,
		     msg);
	const dg_model_config *c = dg_ffi_model_config(m);
	dg_model_weights *w, *g;
	cr_assert_eq(dg_model_weights_create(c, 7, &w, msg, sizeof(msg)), DG_OK);
	cr_assert_eq(dg_model_weights_create(c, 7, &g, msg, sizeof(msg)), DG_OK);
	int32_t idx[16], tgt[16];
	tokens(idx, tgt, 16, 256, 2);
	dg_dptr didx = gh_upload(dev, idx, sizeof(idx)), dtgt = gh_upload(dev, tgt, sizeof(tgt));
	for (int round = 0; round < 3; round++) {
		if (round == 1) { /* every master moved on the device, and in w */
			for (int p = 0; p < 5; p++) {
				int nd;
				int64_t sh[3];
				int64_t n = dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
				uint64_t mp;
				cr_assert_eq(dg_ffi_model_param(m, p, NULL, NULL, NULL, &mp, NULL), DG_OK);
				for (int64_t i = 0; i < n; i++)
					w->params[p][i] += 0.01f * (float)((i * 7 + p) % 5 - 2);
				cr_assert_eq(dg_memcpy_htod(dev, mp, w->params[p], (size_t)n * 4), DG_OK);
			}
		}
		const int on_dev = round == 2;
		cr_assert_eq(dg_ffi_model_run(m, on_dev ? didx : (uint64_t)(uintptr_t)idx,
					      on_dev ? dtgt : (uint64_t)(uintptr_t)tgt, on_dev, 9, 4, 1, 1, msg,
					      sizeof(msg)),
			     DG_OK, "%s: %s", preset, msg);
		float got = gh_read_scalar(dev, dg_ffi_model_loss(m));
		dg_model *ref;
		cr_assert_eq(dg_model_create(dev, w, 2, 8, &ref), DG_OK, "%s", dg_device_errmsg(dev));
		dg_model_batch bt = { .idx = idx, .targets = tgt, .b = 2, .t = 8, .seed = 9, .step = 4, .train = true };
		double want;
		cr_assert_eq(dg_model_step(ref, &bt, &want, g), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(got, (float)want, "%s round %d: loss %.9g, want %.9g", preset, round, got, want);
		for (int p = 0; p < 5; p++) {
			int nd;
			int64_t sh[3];
			int64_t n = dg_model_param_shape(c, (dg_model_param)p, &nd, sh);
			uint64_t gp;
			cr_assert_eq(dg_ffi_model_param(m, p, NULL, NULL, NULL, NULL, &gp), DG_OK);
			float *h = gh_xmalloc((size_t)n * 4);
			gh_download(dev, h, gp, (size_t)n * 4);
			gh_expect_bytes(dg_model_param_name((dg_model_param)p), h, g->params[p], (size_t)n * 4);
			free(h);
		}
		dg_model_destroy(ref);
	}
	dg_model_weights_destroy(w);
	dg_model_weights_destroy(g);
	dg_ffi_model_destroy(m);
	gh_close(dev);
}

Test(ffi, gpu_model_w8a8)
{
	gpu_model_case("w8a8");
}

Test(ffi, gpu_model_bitnet)
{
	gpu_model_case("bitnet");
}

Test(ffi, gpu_model_bf16)
{
	gpu_model_case("bf16");
}

/* dg_ffi_model_decode on a GPU model (f32): its rows' logits after their
 * prompts, and after one more token each, are the model's own full
 * forward's (dg_ffi_model_logits at the same positions, the tail of the
 * batch padded), within the two forms' f32 sums. */
Test(ffi, gpu_model_decode)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_ffi_model *m;
	cr_assert_eq(dg_ffi_model_create(dev, "f32", SIZES, 2, 8, 7, &m, msg, sizeof(msg)), DG_OK, "%s", msg);
	const int V = dg_ffi_model_config(m)->vocab;
	int32_t idx[16], tgt[16], prompts[10], two[2];
	tokens(idx, tgt, 16, V, 5);
	memcpy(prompts, idx, 5 * sizeof(int32_t));
	memcpy(prompts + 5, idx + 8, 5 * sizeof(int32_t));
	float *got = malloc(2 * (size_t)V * sizeof(float)), *want = malloc(2 * (size_t)V * sizeof(float));
	cr_assert(got && want);
	cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)prompts, 2, 5, 1, (uint64_t)(uintptr_t)got, msg,
					 sizeof(msg)),
		     DG_OK, "%s", msg);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(dg_ffi_model_logits(m, (uint64_t)(uintptr_t)idx, 4 + k, (uint64_t)(uintptr_t)want, msg,
						 sizeof(msg)),
			     DG_OK, "%s", msg);
		for (int i = 0; i < 2 * V; i++)
			cr_assert_float_eq(got[i], want[i], 1e-3, "step %d, logit %d", k, i);
		two[0] = idx[5], two[1] = idx[13];
		if (!k)
			cr_assert_eq(dg_ffi_model_decode(m, (uint64_t)(uintptr_t)two, 2, 1, 0, (uint64_t)(uintptr_t)got,
							 msg, sizeof(msg)),
				     DG_OK, "%s", msg);
	}
	free(got);
	free(want);
	dg_ffi_model_destroy(m);
	gh_close(dev);
}

/* One call through the door: prepared, launched, destroyed. */
static dg_status run_once(dg_device *dev, const dg_spec *s, const dg_ffi_tensor *t, int32_t n,
			  const dg_ffi_opts *o)
{
	dg_prepared *p = NULL;
	dg_status st = dg_ffi_op_prepare(dev, s, t, n, o, &p, NULL, 0);
	if (!st)
		st = dg_ffi_prepared_run(p, t, n, o, NULL, 0);
	dg_prepared_destroy(p);
	return st;
}

/* quantize_act through the door: the codes and scales of the typed op. */
Test(ffi, gpu_op_is_the_typed_op)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_spec *s;
	cr_assert_eq(dg_ffi_spec_parse("op=quantize_act;src=f32;act=int8;ascale=token", &s, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	const int rows = 6, cols = 64;
	float x[6 * 64];
	for (int i = 0; i < rows * cols; i++)
		x[i] = sinf((float)i * 0.37f) * (float)(i % 7);
	dg_dptr dx = gh_upload(dev, x, sizeof(x));
	dg_dptr c1 = gh_alloc(dev, rows * cols), s1 = gh_alloc(dev, rows * 4);
	dg_dptr c2 = gh_alloc(dev, rows * cols), s2 = gh_alloc(dev, rows * 4);
	/* ascale=token reads (B, G, T, C): the rows as T tokens of one head */
	dg_ffi_tensor a[2] = {
		{ .name = "x", .fmt = DG_FMT_F32, .ndim = 4, .shape = { 1, 1, rows, cols }, .data = dx },
		{ .name = "codes", .fmt = DG_FMT_INT8, .ndim = 4, .shape = { 1, 1, rows, cols }, .data = c1,
		  .scale = s1 },
	};
	dg_prepared *p = NULL;
	cr_assert_eq(dg_ffi_op_prepare(dev, s, a, 2, NULL, &p, msg, sizeof(msg)), DG_OK, "%s", msg);
	size_t ws = dg_prepared_workspace(p);
	dg_prepared_destroy(p);
	dg_workspace w = gh_workspace(dev, ws);
	dg_ffi_opts o = { .ws = w.ptr, .ws_bytes = w.bytes };
	cr_assert_eq(run_once(dev, s, a, 2, &o), DG_OK, "%s", dg_device_errmsg(dev));
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_F32, dx, 1, 1, rows, cols);
	dg_tensor tc = dg_tensor_4d("codes", DG_FMT_INT8, c2, 1, 1, rows, cols);
	tc.scale = s2;
	dg_quantize_act_args qa = { .x = &tx, .codes = &tc, .ws = w };
	cr_assert_eq(dg_quantize_act(dev, s, &qa), DG_OK, "%s", dg_device_errmsg(dev));
	int8_t h1[6 * 64], h2[6 * 64];
	float f1[6], f2[6];
	gh_download(dev, h1, c1, sizeof(h1));
	gh_download(dev, h2, c2, sizeof(h2));
	gh_download(dev, f1, s1, sizeof(f1));
	gh_download(dev, f2, s2, sizeof(f2));
	gh_expect_bytes("codes", h1, h2, sizeof(h1));
	gh_expect_bytes("scales", f1, f2, sizeof(f1));
	a[1].shape[3] = 60;
	cr_assert_eq(run_once(dev, s, a, 2, &o), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "codes"), "%s", dg_device_errmsg(dev));
	dg_ffi_spec_destroy(s);
	gh_close(dev);
}

/* ---- prepared ops ------------------------------------------------------------ */

Test(ffi, prepare_refuses_bad_calls_by_name)
{
	char msg[512];
	dg_ffi_tensor a[3], b[3];
	dg_spec *s = lowrank(a);
	dg_device *dev = NULL;
	dg_status opened = dg_device_open(&dev, NULL); /* no GPU: the failed handle, which still checks */
	cr_assert_not_null(dev);
	dg_prepared *p = (dg_prepared *)(uintptr_t)1;

	cr_assert_eq(dg_ffi_op_prepare(NULL, s, a, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_null(p);
	cr_assert(strstr(msg, "dev is NULL"), "%s", msg);
	cr_assert_eq(dg_ffi_op_prepare(dev, NULL, a, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "spec is NULL"), "%s", msg);
	cr_assert_str_eq(dg_device_errmsg(dev), msg, "the message is on the device too");
	cr_assert_eq(dg_ffi_op_prepare(dev, s, a, 3, NULL, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "out is NULL"), "%s", msg);

	dg_spec bad = *s;
	bad.op = (dg_op)DG_OP__COUNT;
	cr_assert_eq(dg_ffi_op_prepare(dev, &bad, a, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_SPEC);
	cr_assert_null(p);
	cr_assert(strstr(msg, "no such op"), "%s", msg);

	cr_assert_eq(dg_ffi_op_prepare(dev, s, a, 2, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "takes 3 tensors (x, w, out), got 2"), "%s", msg);
	cr_assert_eq(dg_ffi_op_prepare(dev, s, NULL, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);

	memcpy(b, a, sizeof(b));
	b[1].shape[2] = 31;
	cr_assert_eq(dg_ffi_op_prepare(dev, s, b, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert_null(p);
	cr_assert(strstr(msg, "w") && strstr(msg, "31"), "%s", msg);
	cr_assert_str_eq(dg_device_errmsg(dev), msg);
	memcpy(b, a, sizeof(b));
	b[0].fmt = 99;
	cr_assert_eq(dg_ffi_op_prepare(dev, s, b, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "format 99"), "%s", msg);
	memcpy(b, a, sizeof(b));
	b[2].stride[0] = b[2].stride[1] = b[2].stride[2] = b[2].stride[3] = 1;
	cr_assert_eq(dg_ffi_op_prepare(dev, s, b, 3, NULL, &p, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "out") && strstr(msg, "contiguous"), "%s", msg);

	/* a right call: the device's own failure without one (the checks passed) */
	msg[0] = '\0';
	dg_status st = dg_ffi_op_prepare(dev, s, a, 3, NULL, &p, msg, sizeof(msg));
	if (opened) {
		cr_assert_eq(st, opened, "%s", msg);
		cr_assert_null(p);
		cr_assert_gt(strlen(msg), 0);
	} else {
		cr_assert_eq(st, DG_OK, "%s", msg);
		cr_assert_not_null(p);
	}
	dg_prepared_destroy(p);

	cr_assert_eq(dg_ffi_prepared_run(NULL, a, 3, NULL, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "NULL"), "%s", msg);
	cr_assert_eq(dg_ffi_prepared_run(NULL, a, 3, NULL, NULL, 0), DG_ERR_INVALID_ARG, "no message buffer");
	cr_assert_eq(dg_prepared_workspace(NULL), 0);
	dg_prepared_destroy(NULL);
	dg_device_close(dev);
	dg_ffi_spec_destroy(s);
}

/* quantize_act prepared once through the door, launched twice into other
 * buffers: the typed op's codes and scales each time; a launch of another
 * shape, count, pointer or too small a workspace refused by name. */
Test(ffi, gpu_prepared_op_launches_and_refuses_mismatches)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_spec *s;
	cr_assert_eq(dg_ffi_spec_parse("op=quantize_act;src=f32;act=int8;ascale=token", &s, msg, sizeof(msg)), DG_OK,
		     "%s", msg);
	const int rows = 6, cols = 64;
	float x[6 * 64];
	for (int i = 0; i < rows * cols; i++)
		x[i] = cosf((float)i * 0.29f) * (float)(i % 5 + 1);
	dg_dptr dx = gh_upload(dev, x, sizeof(x));
	dg_dptr cref = gh_alloc(dev, rows * cols), sref = gh_alloc(dev, rows * 4);
	dg_ffi_tensor a[2] = {
		{ .name = "x", .fmt = DG_FMT_F32, .ndim = 4, .shape = { 1, 1, rows, cols }, .data = dx },
		{ .name = "codes", .fmt = DG_FMT_INT8, .ndim = 4, .shape = { 1, 1, rows, cols }, .data = cref,
		  .scale = sref },
	};
	dg_prepared *p = NULL;
	cr_assert_eq(dg_ffi_op_prepare(dev, s, a, 2, NULL, &p, msg, sizeof(msg)), DG_OK, "%s", msg);
	dg_workspace w = gh_workspace(dev, dg_prepared_workspace(p));
	dg_tensor tx = dg_tensor_4d("x", DG_FMT_F32, dx, 1, 1, rows, cols);
	dg_tensor tc = dg_tensor_4d("codes", DG_FMT_INT8, cref, 1, 1, rows, cols);
	tc.scale = sref;
	dg_quantize_act_args qa = { .x = &tx, .codes = &tc, .ws = w };
	cr_assert_eq(dg_quantize_act(dev, s, &qa), DG_OK, "%s", dg_device_errmsg(dev));
	int8_t want_c[6 * 64], got_c[6 * 64];
	float want_s[6], got_s[6];
	gh_download(dev, want_c, cref, sizeof(want_c));
	gh_download(dev, want_s, sref, sizeof(want_s));
	dg_ffi_opts o = { .ws = w.ptr, .ws_bytes = w.bytes };
	for (int k = 0; k < 2; k++) {
		dg_dptr c = gh_alloc(dev, rows * cols), sc = gh_alloc(dev, rows * 4);
		a[1].data = c;
		a[1].scale = sc;
		cr_assert_eq(dg_ffi_prepared_run(p, a, 2, &o, msg, sizeof(msg)), DG_OK, "launch %d: %s", k, msg);
		gh_download(dev, got_c, c, sizeof(got_c));
		gh_download(dev, got_s, sc, sizeof(got_s));
		gh_expect_bytes("codes", got_c, want_c, sizeof(got_c));
		gh_expect_bytes("scales", got_s, want_s, sizeof(got_s));
	}
	dg_ffi_tensor b[2];
	memcpy(b, a, sizeof(b));
	b[1].shape[3] = 60;
	cr_assert_eq(dg_ffi_prepared_run(p, b, 2, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "codes") && strstr(msg, "prepared for"), "%s", msg);
	cr_assert_str_eq(dg_device_errmsg(dev), msg);
	cr_assert_eq(dg_ffi_prepared_run(p, a, 1, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "takes 2 tensors"), "%s", msg);
	memcpy(b, a, sizeof(b));
	b[0].data = 0;
	cr_assert_eq(dg_ffi_prepared_run(p, b, 2, &o, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(msg, "x: data pointer"), "%s", msg);
	if (w.bytes) {
		dg_ffi_opts small = { .ws = w.ptr, .ws_bytes = w.bytes - 1 };
		cr_assert_eq(dg_ffi_prepared_run(p, a, 2, &small, msg, sizeof(msg)), DG_ERR_INVALID_ARG);
		cr_assert(strstr(msg, "ws"), "%s", msg);
	}
	dg_prepared_destroy(p);
	dg_ffi_spec_destroy(s);
	gh_close(dev);
}
