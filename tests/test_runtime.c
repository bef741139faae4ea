/*
 * The runtime without a GPU: "0 devices" with the reason, a device handle
 * that explains its failure, tensors and every dg_tensor_expect message,
 * the _check twins of every op (each wrong tensor named: test_optable.c
 * holds every op's signature against its check), and the launch info a
 * template's plan gives, carried through codegen, the JIT and the disk
 * cache; a prepared op's layout past its arrays refused in the op's own
 * state, whichever threads lay out ops at once.
 *
 * The no-device tests skip on a machine that has a GPU.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <cjson/cJSON.h>

#include "dragon/dragon.h"
#include "dragon/ops.h"
#include "dragon/runtime.h"
#include "dragon/tensor.h"
#include "helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ops/checks.h"
#include "runtime/ops/ops_int.h"

/* Kernels the device holds (distinct spec + entry: dg_device_stats). */
static size_t kernels_loaded(dg_device *dev)
{
	dg_device_stats s = { 0 };
	return dg_device_stats_get(dev, &s) == DG_OK ? s.kernels : 0;
}


/* ---- no device --------------------------------------------------------- */

static void skip_if_gpu(void)
{
	int n = 0;
	char why[256];
	cr_assert_eq(dg_device_count(&n, why, sizeof(why)), DG_OK, "%s", why);
	if (n > 0)
		cr_skip_test("a CUDA device is present (%s)", why);
}

static bool says_why(const char *msg)
{
	return strstr(msg, "libcuda.so.1 not found") ||
	       strstr(msg, "the driver reports no CUDA device");
}

Test(runtime_nodev, count_is_zero_with_the_reason)
{
	skip_if_gpu();
	int n = 42;
	char why[256] = "";
	cr_assert_eq(dg_device_count(&n, why, sizeof(why)), DG_OK);
	cr_assert_eq(n, 0);
	cr_assert(says_why(why), "reason: %s", why);
	/* Same answer the second time (the loader keeps its outcome). */
	n = 7;
	cr_assert_eq(dg_device_count(&n, NULL, 0), DG_OK);
	cr_assert_eq(n, 0);
	cr_assert_eq(dg_device_count(NULL, NULL, 0), DG_ERR_INVALID_ARG);
}

Test(runtime_nodev, open_fails_with_a_handle_that_says_why)
{
	skip_if_gpu();
	dg_device *dev = NULL;
	dg_status st = dg_device_open(&dev, NULL);
	cr_assert_eq(st, DG_ERR_NO_DEVICE, "%s", dg_status_str(st));
	cr_assert_not_null(dev, "the handle is handed out so errmsg works");
	cr_assert(says_why(dg_device_errmsg(dev)), "errmsg: %s", dg_device_errmsg(dev));

	/* Every call on it fails the same way, never crashes. */
	dg_dptr p = 123;
	cr_assert_eq(dg_malloc(dev, 64, &p), DG_ERR_NO_DEVICE);
	cr_assert_eq(p, 0);
	cr_assert_eq(dg_device_sync(dev), DG_ERR_NO_DEVICE);
	dg_device_info info;
	cr_assert_eq(dg_device_info_get(dev, &info), DG_ERR_NO_DEVICE);
	dg_arena *a = (dg_arena *)0x1;
	cr_assert_eq(dg_arena_create(dev, 1024, &a), DG_ERR_NO_DEVICE);
	cr_assert_null(a);
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	dg_kernel *k = (dg_kernel *)0x1;
	cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_ERR_NO_DEVICE);
	cr_assert_null(k);
	cr_assert_eq(kernels_loaded(dev), 0);
	cr_assert(says_why(dg_device_errmsg(dev)), "errmsg: %s", dg_device_errmsg(dev));
	dg_device_close(dev);
}

Test(runtime_nodev, null_handles_are_fine)
{
	dg_device_close(NULL);
	dg_arena_destroy(NULL);
	cr_assert_str_eq(dg_device_errmsg(NULL), "device is NULL");
	cr_assert_eq(dg_device_open(NULL, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_malloc(NULL, 16, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_arena_alloc(NULL, 16, 0, NULL), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_arena_used(NULL), 0);
	cr_assert_eq(dg_arena_capacity(NULL), 0);
	cr_assert_null(dg_device_jit(NULL));
		cr_assert_eq(dg_kernel_info_get(NULL, NULL), DG_ERR_INVALID_ARG);
}

/* ---- tensors ----------------------------------------------------------- */

Test(tensor, constructors_and_sizes)
{
	dg_tensor t = dg_tensor_4d("x", DG_FMT_F32, 256, 2, 1, 3, 256);
	cr_assert_str_eq(t.name, "x");
	cr_assert_eq(t.ndim, 4);
	cr_assert_eq(t.shape[0], 2);
	cr_assert_eq(t.shape[3], 256);
	cr_assert_eq(t.data, 256);
	cr_assert_eq(t.scale, 0);
	cr_assert_eq(dg_tensor_numel(&t), 2 * 3 * 256);
	cr_assert_eq(dg_tensor_bytes(&t), 2 * 3 * 256 * 4);
	cr_assert(dg_tensor_is_contiguous(&t));

	dg_tensor b = dg_tensor_2d("b", DG_FMT_BF16, 0, 3, 10);
	cr_assert_eq(dg_tensor_bytes(&b), 3 * 10 * 2);
	dg_tensor i = dg_tensor_3d("w", DG_FMT_INT8, 0, 4, 8, 256);
	cr_assert_eq(dg_tensor_bytes(&i), 4 * 8 * 256);
	dg_tensor tern = dg_tensor_2d("w", DG_FMT_TERNARY, 0, 8, 256);
	cr_assert_eq(dg_tensor_bytes(&tern), 8 * 256 / 4);
	dg_tensor sg = dg_tensor_1d("w", DG_FMT_SIGN1, 0, 64);
	cr_assert_eq(dg_tensor_bytes(&sg), 8);

	dg_test_expect_row_bytes();

	int64_t shape[2] = { 7, 9 };
	dg_tensor m = dg_tensor_make(NULL, DG_FMT_F32, 0, 2, shape);
	cr_assert_eq(dg_tensor_numel(&m), 63);
	dg_tensor bad = dg_tensor_make("bad", DG_FMT_F32, 0, 5, NULL);
	cr_assert_eq(dg_tensor_numel(&bad), 0);
	cr_assert_eq(dg_tensor_bytes(&bad), 0);
	cr_assert_not(dg_tensor_is_contiguous(&bad));
	cr_assert_eq(dg_tensor_numel(NULL), 0);
}

Test(tensor, contiguity)
{
	dg_tensor t = dg_tensor_3d("x", DG_FMT_F32, 256, 2, 3, 4);
	int64_t ok[3] = { 12, 4, 1 };
	memcpy(t.stride, ok, sizeof(ok));
	cr_assert(dg_tensor_is_contiguous(&t));
	int64_t trans[3] = { 12, 1, 3 };
	memcpy(t.stride, trans, sizeof(trans));
	cr_assert_not(dg_tensor_is_contiguous(&t));
	/* An extent-1 dimension's stride does not matter. */
	dg_tensor u = dg_tensor_3d("u", DG_FMT_F32, 256, 2, 1, 4);
	int64_t any[3] = { 4, 999, 1 };
	memcpy(u.stride, any, sizeof(any));
	cr_assert(dg_tensor_is_contiguous(&u));
}

Test(tensor, describe)
{
	char buf[128];
	dg_tensor t = dg_tensor_4d("x", DG_FMT_INT8, 256, 2, 1, 3, 256);
	cr_assert_str_eq(dg_tensor_describe(&t, buf, sizeof(buf)), "x (int8, 2x1x3x256)");
	dg_tensor u = dg_tensor_1d(NULL, DG_FMT_BF16, 0, 5);
	cr_assert_str_eq(dg_tensor_describe(&u, buf, sizeof(buf)), "tensor (bf16, 5)");
	cr_assert_str_eq(dg_tensor_describe(NULL, buf, sizeof(buf)), "(null tensor)");
}

static const int64_t W_SHAPE[3] = { 4, 8192, 256 };

static void expect_msg(const dg_tensor *t, const char *role, dg_fmt fmt, int ndim,
		       const int64_t *shape, bool need_scale, const char *want)
{
	char msg[256] = "";
	dg_status st = dg_tensor_expect(t, role, fmt, ndim, shape, need_scale, msg,
					sizeof(msg));
	cr_assert_eq(st, DG_ERR_INVALID_ARG, "want failure \"%s\", got %s", want,
		     dg_status_str(st));
	cr_assert_str_eq(msg, want);
}

Test(tensor, expect_accepts_a_good_tensor)
{
	char msg[256] = "untouched";
	dg_tensor w = dg_tensor_3d("w", DG_FMT_INT8, 0x1000, 4, 8192, 256);
	w.scale = 0x2000;
	cr_assert_eq(dg_tensor_expect(&w, "w", DG_FMT_INT8, 3, W_SHAPE, true, msg,
				      sizeof(msg)),
		     DG_OK, "%s", msg);
	int64_t any[3] = { -1, 8192, -1 };
	cr_assert_eq(dg_tensor_expect(&w, "w", DG_FMT_INT8, 3, any, true, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	/* Float formats need no scale. */
	dg_tensor x = dg_tensor_2d("x", DG_FMT_F32, 0x1000, 3, 5);
	int64_t xs[2] = { 3, 5 };
	cr_assert_eq(dg_tensor_expect(&x, "x", DG_FMT_F32, 2, xs, true, msg, sizeof(msg)),
		     DG_OK, "%s", msg);
	/* NULL msg is fine. */
	cr_assert_eq(dg_tensor_expect(NULL, "x", DG_FMT_F32, 2, xs, false, NULL, 0),
		     DG_ERR_INVALID_ARG);
}

Test(tensor, expect_messages)
{
	dg_tensor w = dg_tensor_3d("w", DG_FMT_INT8, 0x1000, 4, 256, 8192);
	w.scale = 0x2000;
	expect_msg(&w, "w", DG_FMT_INT8, 3, W_SHAPE, true,
		   "w: expected int8 (4, 8192, 256), got int8 (4, 256, 8192)");
	expect_msg(NULL, "x", DG_FMT_INT8, 3, W_SHAPE, true,
		   "x: missing (expected int8 (4, 8192, 256))");

	/* The role names a tensor without a name. */
	dg_tensor anon = dg_tensor_3d(NULL, DG_FMT_F32, 0x1000, 4, 8192, 256);
	expect_msg(&anon, "grad", DG_FMT_INT8, 3, W_SHAPE, true,
		   "grad: expected int8 (4, 8192, 256), got f32 (4, 8192, 256)");

	dg_tensor two = dg_tensor_2d("x", DG_FMT_F32, 0x1000, 4, 8192);
	int64_t wild[3] = { -1, 4, 8192 };
	expect_msg(&two, "x", DG_FMT_F32, 3, wild, false,
		   "x: expected f32 (*, 4, 8192), got f32 (4, 8192)");

	dg_tensor five = dg_tensor_make("x", DG_FMT_F32, 0x1000, 5, NULL);
	expect_msg(&five, "x", DG_FMT_F32, 3, wild, false,
		   "x: ndim=5, must be 1..4 (expected f32 (*, 4, 8192))");

	dg_tensor neg = dg_tensor_2d("x", DG_FMT_F32, 0x1000, -3, 8);
	int64_t any2[2] = { -1, 8 };
	expect_msg(&neg, "x", DG_FMT_F32, 2, any2, false,
		   "x: extent -3 in dimension 0 of (-3, 8) is negative");

	dg_tensor mis = dg_tensor_3d("w", DG_FMT_INT8, 0x1004, 4, 8192, 256);
	mis.scale = 0x2000;
	expect_msg(&mis, "w", DG_FMT_INT8, 3, W_SHAPE, true,
		   "w: data pointer 0x1004 is not 16-byte aligned (allocations and arena blocks are)");

	dg_tensor null_data = dg_tensor_3d("w", DG_FMT_INT8, 0, 4, 8192, 256);
	null_data.scale = 0x2000;
	expect_msg(&null_data, "w", DG_FMT_INT8, 3, W_SHAPE, true,
		   "w: data pointer is 0 (int8 (4, 8192, 256))");

	dg_tensor noscale = dg_tensor_3d("w", DG_FMT_INT8, 0x1000, 4, 8192, 256);
	expect_msg(&noscale, "w", DG_FMT_INT8, 3, W_SHAPE, true,
		   "w: int8 codes need their scale (dg_tensor.scale is 0; point it at one float on the device)");
	/* ... unless the op does not need it. */
	cr_assert_eq(dg_tensor_expect(&noscale, "w", DG_FMT_INT8, 3, W_SHAPE, false, NULL, 0),
		     DG_OK);

	dg_tensor odd_scale = noscale;
	odd_scale.scale = 0x2002;
	expect_msg(&odd_scale, "w", DG_FMT_INT8, 3, W_SHAPE, true,
		   "w: scale pointer 0x2002 is not 4-byte aligned");

	dg_tensor strided = dg_tensor_2d("x", DG_FMT_F32, 0x1000, 4, 8);
	strided.stride[0] = 1;
	strided.stride[1] = 4;
	int64_t xs[2] = { 4, 8 };
	expect_msg(&strided, "x", DG_FMT_F32, 2, xs, false,
		   "x: strides (1, 4) of (4, 8) are not contiguous; ops take contiguous row-major tensors (copy it first)");

	dg_tensor tern = dg_tensor_2d("w", DG_FMT_TERNARY, 0x1000, 4, 24);
	tern.scale = 0x2000;
	int64_t ts[2] = { 4, 24 };
	expect_msg(&tern, "w", DG_FMT_TERNARY, 2, ts, true,
		   "w: last dimension 24 of ternary (4, 24) does not fill whole words (ternary stores 16 codes a word: a multiple of 16)");
}

/* ---- op checks --------------------------------------------------------- */

static dg_spec quant_spec(dg_fmt src, dg_fmt act)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.src = src;
	s.act = act;
	return s;
}

static void check_quant(const dg_spec *s, const dg_tensor *x, const dg_tensor *c,
			dg_status want_st, const char *want)
{
	char msg[512] = "";
	dg_quantize_act_args a = { .x = x, .codes = c };
	dg_status st = dg_quantize_act_check(s, &a, msg, sizeof(msg));
	cr_assert_eq(st, want_st, "got %s: %s", dg_status_str(st), msg);
	if (want)
		cr_assert(strstr(msg, want), "message \"%s\" lacks \"%s\"", msg, want);
}

Test(ops_check, quantize_act)
{
	dg_spec s = quant_spec(DG_FMT_F32, DG_FMT_INT8);
	dg_tensor x = dg_tensor_3d("x", DG_FMT_F32, 0x1000, 2, 3, 256);
	dg_tensor c = dg_tensor_3d("codes", DG_FMT_INT8, 0x9000, 2, 3, 256);
	c.scale = 0x8000;
	check_quant(&s, &x, &c, DG_OK, NULL);

	/* Odd lengths store fine: one code a byte. */
	dg_tensor xo = dg_tensor_1d("x", DG_FMT_F32, 0x1000, 7);
	dg_tensor co = dg_tensor_1d("codes", DG_FMT_INT8, 0x9000, 7);
	co.scale = 0x8000;
	check_quant(&s, &xo, &co, DG_OK, NULL);

	check_quant(NULL, &x, &c, DG_ERR_INVALID_ARG, "spec is NULL");
	char m0[256];
	cr_assert_eq(dg_quantize_act_check(&s, NULL, m0, sizeof(m0)), DG_ERR_INVALID_ARG);
	cr_assert(strstr(m0, "args is NULL"), "%s", m0);
	dg_spec other;
	dg_spec_init(&other, DG_OP_PACK_I8X4);
	check_quant(&other, &x, &c, DG_ERR_INVALID_SPEC,
		    "dg_quantize_act: spec op=pack_i8x4, expected op=quantize_act");
	dg_spec bad = quant_spec(DG_FMT_F32, DG_FMT_TERNARY);
	check_quant(&bad, &x, &c, DG_ERR_INVALID_SPEC, "act");

	check_quant(&s, NULL, &c, DG_ERR_INVALID_ARG, "x: missing (expected f32, any shape)");
	dg_tensor xb = x;
	xb.fmt = DG_FMT_BF16;
	check_quant(&s, &xb, &c, DG_ERR_INVALID_ARG, "x: expected f32 3-d, got bf16 (2, 3, 256)");
	check_quant(&s, &x, NULL, DG_ERR_INVALID_ARG, "codes: missing (expected int8 (2, 3, 256))");
	dg_tensor cshape = dg_tensor_3d("codes", DG_FMT_INT8, 0x9000, 2, 256, 3);
	cshape.scale = 0x8000;
	check_quant(&s, &x, &cshape, DG_ERR_INVALID_ARG,
		    "codes: expected int8 (2, 3, 256), got int8 (2, 256, 3)");
	dg_tensor cfmt = c;
	cfmt.fmt = DG_FMT_UINT8POS;
	check_quant(&s, &x, &cfmt, DG_ERR_INVALID_ARG,
		    "codes: expected int8 (2, 3, 256), got uint8pos (2, 3, 256)");
	dg_tensor cnoscale = c;
	cnoscale.scale = 0;
	check_quant(&s, &x, &cnoscale, DG_ERR_INVALID_ARG, "codes: int8 codes need their scale");

	dg_spec u8 = quant_spec(DG_FMT_BF16, DG_FMT_UINT8POS);
	dg_tensor cu8 = c;
	cu8.fmt = DG_FMT_UINT8POS;
	check_quant(&u8, &xb, &cu8, DG_OK, NULL);
}

static void check_pack(const dg_spec *s, const dg_tensor *c, const dg_tensor *p,
		       dg_status want_st, const char *want)
{
	char msg[512] = "";
	dg_pack_i8x4_args a = { .codes = c, .packed = p };
	dg_status st = dg_pack_i8x4_check(s, &a, msg, sizeof(msg));
	cr_assert_eq(st, want_st, "got %s: %s", dg_status_str(st), msg);
	if (want)
		cr_assert(strstr(msg, want), "message \"%s\" lacks \"%s\"", msg, want);
}

Test(ops_check, pack_i8x4)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	s.embd = 256;
	s.latent = 96;
	dg_tensor c = dg_tensor_3d("codes", DG_FMT_INT8, 0x1000, 4, 256, 96);
	dg_tensor p = dg_tensor_3d("packed", DG_FMT_INT8, 0x9000, 4, 96, 256);
	check_pack(&s, &c, &p, DG_OK, NULL);
	dg_spec un = s;
	un.op = DG_OP_UNPACK_I8X4;
	check_pack(&un, &c, &p, DG_OK, NULL);

	dg_spec q = quant_spec(DG_FMT_F32, DG_FMT_INT8);
	check_pack(&q, &c, &p, DG_ERR_INVALID_SPEC,
		   "dg_pack_i8x4: spec op=quantize_act, expected op=pack_i8x4 or op=unpack_i8x4");
	dg_tensor ck = dg_tensor_3d("codes", DG_FMT_INT8, 0x1000, 4, 96, 256);
	check_pack(&s, &ck, &p, DG_ERR_INVALID_ARG,
		   "codes: expected int8 (*, 256, 96), got int8 (4, 96, 256)");
	dg_tensor pr = dg_tensor_3d("packed", DG_FMT_INT8, 0x9000, 3, 96, 256);
	check_pack(&s, &c, &pr, DG_ERR_INVALID_ARG,
		   "packed: expected int8 (4, 96, 256), got int8 (3, 96, 256)");
	check_pack(&s, &c, NULL, DG_ERR_INVALID_ARG, "packed: missing");
	dg_tensor pf = p;
	pf.fmt = DG_FMT_F32;
	check_pack(&s, &c, &pf, DG_ERR_INVALID_ARG, "packed: expected int8");

	/* latent need not be a multiple of 4 for pack: codes are bytes. */
	dg_spec odd = s;
	odd.latent = 6;
	dg_tensor c6 = dg_tensor_3d("codes", DG_FMT_INT8, 0x1000, 2, 256, 6);
	dg_tensor p6 = dg_tensor_3d("packed", DG_FMT_INT8, 0x9000, 2, 6, 256);
	check_pack(&odd, &c6, &p6, DG_OK, NULL);
}

Test(ops_check, ops_refuse_before_touching_the_device)
{
	dg_spec s = quant_spec(DG_FMT_F32, DG_FMT_INT8);
	dg_tensor x = dg_tensor_1d("x", DG_FMT_F32, 0x1000, 8);
	dg_quantize_act_args qa = { .x = &x };
	dg_pack_i8x4_args pa = { .codes = &x };
	cr_assert_eq(dg_quantize_act(NULL, &s, &qa), DG_ERR_INVALID_ARG);
	cr_assert_eq(dg_pack_i8x4(NULL, &s, &pa), DG_ERR_INVALID_ARG);

	skip_if_gpu();
	dg_device *dev = NULL;
	cr_assert_eq(dg_device_open(&dev, NULL), DG_ERR_NO_DEVICE);
	/* The check runs first: its message, not the missing device's. */
	cr_assert_eq(dg_quantize_act(dev, &s, &qa), DG_ERR_INVALID_ARG);
	cr_assert_str_eq(dg_device_errmsg(dev), "codes: missing (expected int8 (8))");
	dg_tensor c = dg_tensor_1d("codes", DG_FMT_INT8, 0x2000, 8);
	c.scale = 0x3000;
	qa.codes = &c;
	cr_assert_eq(dg_quantize_act(dev, &s, &qa), DG_ERR_NO_DEVICE);
	cr_assert(says_why(dg_device_errmsg(dev)), "%s", dg_device_errmsg(dev));
	size_t bytes = 7;
	cr_assert_eq(dg_quantize_act_workspace(dev, &s, &qa, &bytes), DG_ERR_NO_DEVICE);
	dg_device_close(dev);
}

/* Each op's arguments struct as args_layout.c lays it out: a tensor field
 * of each argument's name in the op table's order, within the struct, and
 * each option within it too; the call made of a struct carries them. */
Test(ops_check, args_layout_follows_the_op_table)
{
	for (int op = 0; op < DG_OP__COUNT; op++) {
		const char *name = dg_op_name((dg_op)op);
		const dg_op_info *row = dg_op_info_of((dg_op)op);
		const dg__args_layout *l = dg__op_args_layout((dg_op)op);
		cr_assert(l && l->size > 0, "%s: no layout", name);
		for (int i = 0; i < DG_OP_MAX_ARGS; i++) {
			if (i >= row->n_args) {
				cr_assert_eq(l->t[i].at, 0, "%s: a tensor %d past the op table's %d", name,
					     i, row->n_args);
				continue;
			}
			cr_assert(l->t[i].at, "%s: no field for %s", name, row->args[i].name);
			cr_assert_str_eq(l->t[i].name, row->args[i].name, "%s: tensor %d", name, i);
			size_t off = l->t[i].at - 1u;
			cr_assert(off % sizeof(void *) == 0 && off + sizeof(void *) <= l->size,
				  "%s: %s at %zu", name, l->t[i].name, off);
		}
#define DG_TEST_OPTION_WITHIN(f)                                                            \
		cr_assert(!l->f || l->f - 1u + sizeof(((dg__op_call *)0)->f) <= l->size,       \
			  "%s: option " #f " past the struct", name);
		DG__CALL_OPTIONS(DG_TEST_OPTION_WITHIN)
#undef DG_TEST_OPTION_WITHIN
	}
	cr_assert_null(dg__op_args_layout(DG_OP__COUNT));

	dg_tensor x = dg_tensor_1d("x", DG_FMT_F32, 0x1000, 8);
	dg_tensor w = dg_tensor_1d("w", DG_FMT_F32, 0x2000, 8);
	dg_lowrank_fwd_args fa = { .x = &x, .w = &w, .out = &x, .out_absum = 0x40 };
	dg__op_call c = dg__op_call_from_args(DG_OP_LOWRANK_FWD, &fa);
	cr_assert(c.t[0] == &x && c.t[1] == &w && c.t[2] == &x && !c.t[3]);
	cr_assert_eq(c.absum, 0x40);
	/* unpack_i8x4 takes pack_i8x4's struct, its tensors the other way */
	dg_pack_i8x4_args pa = { .codes = &x, .packed = &w };
	c = dg__op_call_from_args(DG_OP_UNPACK_I8X4, &pa);
	cr_assert(c.t[0] == &w && c.t[1] == &x);
	c = dg__op_call_from_args(DG_OP_PACK_I8X4, &pa);
	cr_assert(c.t[0] == &x && c.t[1] == &w);
	dg_pack_weight_args wa = { .codes = &x, .packed = &w, .unpack = true };
	c = dg__op_call_from_args(DG_OP_PACK_SIGN1, &wa);
	cr_assert(c.t[0] == &x && c.t[1] == &w && c.unpack);
	dg_gate_bwd_args ga = { .dxy = &x, .xs = &w, .ys = &x, .dxs = &w, .p = 0.25f, .seed = 7,
				.step = 3, .layer = 2, .step_at = 0x80, .elem0 = 99 };
	c = dg__op_call_from_args(DG_OP_GATE_BWD, &ga);
	cr_assert(c.t[3] == &w && c.p == 0.25f && c.seed == 7 && c.step == 3 && c.layer == 2 &&
		  c.step_at == 0x80 && c.elem0 == 99);
	dg_lmhead_ce_args la = { .x = &x, .dw = &w, .backward = true, .accumulate = true,
				 .ws = { 0x100, 512 }, .bad = 0x200, .grad_scale = 0x300 };
	c = dg__op_call_from_args(DG_OP_LMHEAD_CE, &la);
	cr_assert(c.t[0] == &x && !c.t[4] && c.t[5] == &w && c.backward && c.accumulate);
	cr_assert(c.ws.ptr == 0x100 && c.ws.bytes == 512 && c.bad == 0x200 && c.grad_scale == 0x300);
	cr_assert(!c.eps && !c.splits && !c.unpack && !c.ctl);
	/* no struct, or no op: the empty call */
	dg__op_call zero;
	memset(&zero, 0, sizeof(zero));
	c = dg__op_call_from_args(DG_OP_LOWRANK_FWD, NULL);
	cr_assert(!memcmp(&c, &zero, sizeof(c)));
	c = dg__op_call_from_args(DG_OP__COUNT, &fa);
	cr_assert(!memcmp(&c, &zero, sizeof(c)));
}

/* ---- launch info: template plan → codegen → JIT → cache -------------------- */

/* A template set whose plan gives k1 128 threads and 64 KiB of dynamic
 * shared memory and k2 32 threads and none. */
static const char *launch_tpl =
	"local SRC = [[\n"
	"extern \"C\" __global__ void k1(int *p)\n"
	"{\n"
	"\textern __shared__ int s[];\n"
	"\ts[threadIdx.x] = (int)threadIdx.x;\n"
	"\t__syncthreads();\n"
	"\tif (p) p[threadIdx.x] = s[threadIdx.x];\n"
	"}\n"
	"extern \"C\" __global__ void k2(int *p) { if (p) *p = 2; }\n"
	"]]\n"
	"return {\n"
	"  plan = function(spec)\n"
	"    return { tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 128 },\n"
	"             path = 'test', name = 'k.cu',\n"
	"             entries = { { name = 'k1', threads = 128, smem = 65536 }, { name = 'k2', threads = 32 } } }\n"
	"  end,\n"
	"  render = function(spec) return '// ' .. spec.canonical .. '\\n' .. SRC end,\n"
	"}\n";

static dg_ctx *jit_ctx(const char *cache, const char *tpl)
{
	dg_ctx_opts o = { .cache_dir = cache, .template_dir = tpl };
	dg_ctx *ctx = NULL;
	dg_status st = dg_ctx_create(&ctx, &o);
	cr_assert_eq(st, DG_OK, "ctx: %s", ctx ? dg_ctx_errmsg(ctx) : dg_status_str(st));
	return ctx;
}

static dg_spec small_spec(void)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	s.embd = 64;
	s.latent = 32;
	return s;
}

Test(launch_info, carried_through_codegen_jit_and_cache)
{
	char *tpl = dg_test_template_dir(launch_tpl, NULL);
	char *cache = dg_test_tmpdir();
	dg_spec s = small_spec();

	/* plan and codegen */
	dg_codegen_opts co = { .template_dir = tpl };
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	dg_plan p;
	cr_assert_eq(dg_codegen_create(&cg, &co), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(dg_codegen_plan(cg, &s, &p), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(p.n_entries, 2);
	cr_assert_str_eq(p.entries[1].name, "k2");
	cr_assert_eq(p.entries[0].threads, 128);
	cr_assert_eq(p.entries[0].smem, 65536);
	cr_assert_eq(p.entries[1].threads, 32);
	cr_assert_eq(p.entries[1].smem, 0, "smem left out is 0");
	cr_assert_str_eq(p.path, "test");
	cr_assert_str_eq(p.program, "k.cu");
	cr_assert_eq(p.spec.tile.threads, 128, "the plan's tile");
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(src->n_entries, 2);
	cr_assert_eq(src->block_threads[0], 128);
	cr_assert_eq(src->dyn_smem[0], 65536);
	cr_assert_eq(src->block_threads[1], 32);
	cr_assert_eq(src->dyn_smem[1], 0);
	cr_assert(strstr(src->canonical, "tile=t128;"), "%s", src->canonical);
	dg_source_destroy(src);
	dg_codegen_destroy(cg);

	/* JIT miss, then a hit in a fresh context: same launch info. */
	dg_binary *a = NULL, *b = NULL;
	dg_ctx *c1 = jit_ctx(cache, tpl);
	cr_assert_eq(dg_jit_compile(c1, &s, &a), DG_OK, "%s", dg_ctx_errmsg(c1));
	cr_assert_not(a->cache_hit);
	cr_assert_eq(a->n_entries, 2);
	cr_assert_str_eq(a->entries[0], "k1");
	cr_assert_eq(a->block_threads[0], 128);
	cr_assert_eq(a->dyn_smem[0], 65536);
	cr_assert_eq(a->block_threads[1], 32);
	cr_assert_eq(a->dyn_smem[1], 0);

	dg_ctx *c2 = jit_ctx(cache, tpl);
	cr_assert_eq(dg_jit_compile(c2, &s, &b), DG_OK, "%s", dg_ctx_errmsg(c2));
	cr_assert(b->cache_hit);
	cr_assert_eq(b->block_threads[0], 128);
	cr_assert_eq(b->dyn_smem[0], 65536);
	cr_assert_eq(b->block_threads[1], 32);
	cr_assert_eq(b->dyn_smem[1], 0);

	cJSON *m = cJSON_Parse(b->meta);
	cr_assert_not_null(m);
	const cJSON *k1 = cJSON_GetObjectItem(cJSON_GetObjectItem(m, "launch"), "k1");
	cr_assert_not_null(k1, "meta: %s", b->meta);
	cr_assert_eq(cJSON_GetObjectItem(k1, "threads")->valueint, 128);
	cr_assert_eq(cJSON_GetObjectItem(k1, "smem")->valueint, 65536);
	const cJSON *k2 = cJSON_GetObjectItem(cJSON_GetObjectItem(m, "launch"), "k2");
	cr_assert_not_null(k2, "meta: %s", b->meta);
	cr_assert_eq(cJSON_GetObjectItem(k2, "threads")->valueint, 32);
	cJSON_Delete(m);

	dg_binary_destroy(a);
	dg_binary_destroy(b);
	dg_ctx_destroy(c1);
	dg_ctx_destroy(c2);
	dg_test_rmtree(tpl);
	dg_test_rmtree(cache);
}

/* The real templates: the binary's launch info is its spec's plan. */
Test(launch_info, real_templates_compile_what_they_plan)
{
	dg_ctx_opts o = { .no_cache = true };
	dg_ctx *ctx = NULL;
	cr_assert_eq(dg_ctx_create(&ctx, &o), DG_OK, "%s", dg_ctx_errmsg(ctx));
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.tile.threads = 512;
	dg_plan p;
	cr_assert_eq(dg_codegen_plan(dg_ctx_codegen(ctx), &s, &p), DG_OK, "%s",
		     dg_codegen_errmsg(dg_ctx_codegen(ctx)));
	dg_binary *b = NULL;
	cr_assert_eq(dg_jit_compile(ctx, &s, &b), DG_OK, "%s", dg_ctx_errmsg(ctx));
	cr_assert_str_eq(b->canonical, p.canonical);
	cr_assert_eq(b->n_entries, p.n_entries);
	for (int i = 0; i < p.n_entries; i++) {
		cr_assert_str_eq(b->entries[i], p.entries[i].name);
		cr_assert_eq(b->block_threads[i], p.entries[i].threads);
		cr_assert_eq(b->block_threads[i], 512);
		cr_assert_eq(b->dyn_smem[i], p.entries[i].smem);
	}
	dg_binary_destroy(b);
	dg_ctx_destroy(ctx);
}

/* ---- a prepared op's layout past its arrays ------------------------------------ */

struct overflow_arg {
	dg_prepared *p;
	int64_t v;
};

static void *overflow_layout(void *arg)
{
	struct overflow_arg *a = arg;
	dg__prep_launch *L = &a->p->launch[0];
	for (int i = 0; i < 1000; i++) {
		dg__arg_i64(a->p, L, a->v);        /* past the end: the op's sink */
		dg__arg_i64(a->p, NULL, a->v + 1); /* no launch: the sink too */
		dg__arg_i64(a->p, L, a->v);
	}
	return NULL;
}

/* The arguments past a launch's end are refused (overflow) and written
 * where only that op's prepare looks: ops prepared on several threads at
 * once (the model's sizing) do not write into one another's, nor into
 * anything shared. */
Test(prepared_layout, past_the_end_lands_in_the_ops_own_sink)
{
	enum { THREADS = 8 };
	dg_prepared *p = calloc(THREADS, sizeof(*p));
	cr_assert_not_null(p);
	pthread_t th[THREADS];
	struct overflow_arg a[THREADS];
	for (int t = 0; t < THREADS; t++) {
		p[t].n_launch = 1;
		p[t].launch[0].n_args = DG__PREP_ARGS; /* full */
		a[t] = (struct overflow_arg){ &p[t], 1000 * (t + 1) };
		cr_assert_eq(pthread_create(&th[t], NULL, overflow_layout, &a[t]), 0);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	for (int t = 0; t < THREADS; t++) {
		cr_assert(p[t].overflow, "op %d: not refused", t);
		cr_assert_eq(p[t].launch[0].n_args, DG__PREP_ARGS, "op %d: the launch grew", t);
		cr_assert_eq(p[t].sink.imm, 1000 * (t + 1), "op %d: its sink holds %lld", t,
			     (long long)p[t].sink.imm);
	}
	free(p);
}
