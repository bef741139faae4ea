/*
 * Every op against its CPU reference on the GPU, from one table: the
 * default build set (dg_bundle_default_specs: each op of the table at the
 * BDH shape, in every format the model uses), each spec a check case of
 * the tuner's harness (autotune/harness.c: the op's tensors read from the
 * op table, random inputs, the call through the ops' one door, the
 * comparison by the op's check kind) at a few rows. And the prepared form
 * of an op (dg_prepare, dg_prepared_launch): the same bytes as the one
 * call, launched again on other buffers, and a call of another shape
 * refused by name.
 * Without a GPU each test prints "skipped: no CUDA device".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "autotune/sweep_int.h"
#include "gpu_helpers.h"

/* The default set's specs are checked in SHARDS tests (spec i in shard
 * i % SHARDS), which Criterion runs side by side (tests/CMakeLists.txt
 * gives this suite more jobs): the CPU references at the BDH shape take
 * seconds each, and one test of all of them ran for minutes. */
enum { SHARDS = 8 };

ParameterizedTestParameters(gpu_ops, default_set_shard)
{
	static int shard[SHARDS];
	for (int i = 0; i < SHARDS; i++)
		shard[i] = i;
	return cr_make_param_array(int, shard, SHARDS);
}

ParameterizedTest(int *shard, gpu_ops, default_set_shard, .timeout = 1200)
{
	dg_device *dev = gh_open();
	dg_device_info info;
	cr_assert_eq(dg_device_info_get(dev, &info), DG_OK);
	char msg[1024], why[1024], text[DG_SPEC_TEXT_MAX];
	dg_spec *specs = NULL;
	size_t n = 0;
	cr_assert_eq(dg_bundle_default_specs(&specs, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	int checked = 0;
	for (size_t i = (size_t)*shard; i < n; i += SHARDS) {
		dg_spec *s = &specs[i];
		if (s->arch > info.sm)
			continue; /* a newer GPU's kernel */
		cr_assert_eq(dg_spec_to_string(s, text, sizeof(text)), DG_OK);
		/* which spec ran last, should one crash the process */
		fprintf(stderr, "gpu_ops: %zu/%zu %s\n", i + 1, n, text);
		fflush(stderr);
		static const int rows[] = { 32, 80 };
		/* a chunked op's T is a whole number of chunks: both rows are
		 * one chunk (the harness rounds them up), checked once */
		const size_t n_rows = s->chunk > 0 ? 1 : sizeof(rows) / sizeof(rows[0]);
		for (size_t r = 0; r < n_rows; r++) {
			dg__at_case *c = NULL;
			dg__at_verdict v;
			cr_assert_eq(dg__at_case_create(dev, s, rows[r], true, 0x0b5u + i, &c), DG_OK,
				     "%s rows %d: %s", text, rows[r], dg_device_errmsg(dev));
			cr_assert_eq(dg__at_case_check(c, s, &v, why, sizeof(why)), DG_OK,
				     "%s rows %d: %s", text, rows[r], dg_device_errmsg(dev));
			cr_expect_eq(v, DG__AT_RIGHT, "%s rows %d: %s: %s", text, rows[r],
				     v == DG__AT_REFUSED ? "refused" : "wrong", why);
			dg__at_case_destroy(c);
		}
		checked++;
	}
	printf("gpu_ops: shard %d of %d: %d specs of the default set checked\n", *shard, SHARDS, checked);
	free(specs);
	gh_close(dev);
}

/* The default set holds every op of the table (what the shards check
 * between them), and more specs than shards. No GPU needed. */
Test(gpu_ops, the_default_set_covers_every_op)
{
	char msg[1024];
	dg_spec *specs = NULL;
	size_t n = 0;
	cr_assert_eq(dg_bundle_default_specs(&specs, &n, msg, sizeof(msg)), DG_OK, "%s", msg);
	cr_assert_gt(n, 30, "the default set has %zu specs", n);
	bool seen[DG_OP__COUNT] = { false };
	for (size_t i = 0; i < n; i++)
		seen[specs[i].op] = true;
	for (int op = 0; op < DG_OP__COUNT; op++)
		cr_expect(seen[op], "the default set has no spec of op %s", dg_op_name((dg_op)op));
	free(specs);
}

/* A projection, prepared once, launched on two sets of buffers: each the
 * one call's bytes; a call of another T is refused naming the tensor. */
Test(gpu_ops, a_prepared_op_launches_as_the_one_call_does)
{
	dg_device *dev = gh_open();
	char msg[512];
	dg_spec s;
	cr_assert_eq(dg_spec_parse("op=lowrank_fwd;weight=int8;act=int8;out=int8;relu=1;heads=2;"
				   "in_heads=1;embd=64;latent=128",
				   &s, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	enum { B = 2, T = 24, H = 2, E = 64, L = 128 };
	const size_t nx = (size_t)B * T * E, nw = (size_t)H * L * E, no = (size_t)B * H * T * L;
	int8_t *hx = malloc(nx), *hw = malloc(nw), *eager = malloc(no), *prep = malloc(no);
	cr_assert(hx && hw && eager && prep);
	for (int round = 0; round < 2; round++) {
		gh_seed(7 + (uint64_t)round);
		dg_rng_fill(gh_rng(), DG_FMT_INT8, hx, nx);
		dg_rng_fill(gh_rng(), DG_FMT_INT8, hw, nw);
		dg_dptr x = gh_upload(dev, hx, nx), w = gh_upload(dev, hw, nw);
		dg_dptr o1 = gh_alloc_ff(dev, no), o2 = gh_alloc_ff(dev, no);
		dg_tensor tx = dg_tensor_4d("x", DG_FMT_INT8, x, B, 1, T, E);
		dg_tensor tw = dg_tensor_3d("w", DG_FMT_INT8, w, H, L, E);
		dg_tensor t1 = dg_tensor_4d("out", DG_FMT_INT8, o1, B, H, T, L);
		dg_tensor t2 = t1;
		t2.data = o2;
		tx.scale = gh_scalar(dev, 0.01f);
		tw.scale = gh_scalar(dev, 0.02f);
		t1.scale = gh_scalar(dev, 0.05f);
		t2.scale = t1.scale;
		dg_lowrank_fwd_args a1 = { .x = &tx, .w = &tw, .out = &t1 };
		dg_lowrank_fwd_args a2 = { .x = &tx, .w = &tw, .out = &t2 };
		cr_assert_eq(dg_lowrank_fwd(dev, &s, &a1), DG_OK, "%s", dg_device_errmsg(dev));
		static dg_prepared *p;
		if (round == 0) {
			cr_assert_eq(dg_prepare(dev, &s, &a2, &p), DG_OK, "%s", dg_device_errmsg(dev));
			cr_assert_eq(dg_prepared_workspace(p), 0);
		}
		cr_assert_eq(dg_prepared_launch(p, &a2), DG_OK, "%s", dg_device_errmsg(dev));
		gh_sync(dev);
		gh_download(dev, eager, o1, no);
		gh_download(dev, prep, o2, no);
		cr_assert(memcmp(eager, prep, no) == 0, "round %d: the prepared launch differs", round);
		if (round == 1) {
			dg_tensor shorter = dg_tensor_4d("x", DG_FMT_INT8, x, B, 1, T - 8, E);
			shorter.scale = tx.scale;
			dg_lowrank_fwd_args bad = { .x = &shorter, .w = &tw, .out = &t2 };
			cr_assert_eq(dg_prepared_launch(p, &bad), DG_ERR_INVALID_ARG);
			cr_expect(strstr(dg_device_errmsg(dev), "x: prepared for int8 (2,1,24,64)"),
				  "%s", dg_device_errmsg(dev));
			dg_prepared_destroy(p);
		}
	}
	free(hx);
	free(hw);
	free(eager);
	free(prep);
	gh_close(dev);
}
