/*
 * kernels — dragon's BDH kernels on the GPU, against the floor and against
 * cuBLASLt, at training shapes (H=4, N=8192, D=256; M = B·T rows):
 *
 *   lowrank_fwd  x (1,1,M,256) int8, w (4,8192,256) ternary, relu thr 0
 *                → out (1,4,M,8192) bf16 | int8 codes   (K=256, N=32768)
 *                and the bf16 preset's: x bf16, w bf16 → out bf16
 *   decoder_fwd  y (1,4,M,8192) int8, w (256,32768) ternary | int8
 *                → out (1,1,M,256) bf16                 (K=32768, N=256)
 *
 * and the gradient GEMMs (f32 gradients; the GEMM is gemm_m × N × K):
 *
 *   lowrank_grad_input   grad (1,4,M,8192) f32, w (4,8192,256) ternary
 *                        → grad_x (1,1,M,256) f32     (M × 256 × 32768)
 *   lowrank_grad_weight  grad (1,4,M,8192) f32, x (1,1,M,256) int8
 *                        → grad_w (4,8192,256) f32    (32768 × 256 × M)
 *   decoder_grad_input   grad (1,1,M,256) f32, w (256,32768) int8
 *                        → grad_y (1,4,M,8192) f32    (M × 32768 × 256)
 *   decoder_grad_weight  grad (1,1,M,256) f32, y (1,4,M,8192) int8
 *                        → grad_w (256,32768) f32     (256 × 32768 × M)
 *
 * named <op>.<weight>.<act>.f32.m<M> (the weight of a grad_weight case is
 * the layer's, which that kernel does not read), and the training step's
 * lowrank_grad_input on sm_90 (a bf16 gradient and bf16 w, the warpgroup
 * path where the device has it; its name ends .src_bf16):
 *
 *   lowrank_grad_input   grad (1,4,M,8192) bf16, w (4,8192,256) bf16
 *                        → grad_x (1,1,M,256) f32     (M × 256 × 32768)
 *
 * lowrank_grad_input splits its reduction (dragon/ops.h): the runtime
 * picks the count unless --splits forces it (a manual sweep), and its
 * partials are not counted in the floor's bytes either.
 *
 * Every call, ours and cuBLASLt's, is timed by the one timer (dg_timer,
 * dragon/runtime.h): --warmup untimed calls (the first compiles the
 * kernel), then --reps calls, each between two CUDA events on the calling
 * thread's stream (the device's own; cuBLASLt is given that stream too),
 * after a write of a buffer four times the L2 outside the events; median,
 * p10 and p90. The host-side cost of an op (checks, kernel lookup) is
 * hidden behind the flush, so the figures are device time. Inputs are
 * dg_rng's (dragon/rng.h), the data the tuner and the tests draw.
 *
 * Anchors, same run and shapes: a cuBLASLt bf16 GEMM (bf16 in and out, fp32
 * compute, the heuristic's first algo, 32 MiB workspace), and for the
 * projection that GEMM followed by a separate relu(y − thr) kernel on its
 * output (bf16, 16-byte vectors, compiled here with NVRTC). The decoder has
 * no ReLU, so it gets no such anchor (null in the JSON).
 *
 * floor_us = max(bytes / copy bandwidth, 2·M·N·K / tensor-core peak), bytes
 * = inputs + weights (as stored) + outputs, each read or written once (a
 * grad_weight's split partials are not counted), the copy bandwidth
 * measured here (dg_memcpy_dtod of 1 GiB, read + write), the peak from
 * a table keyed by sm and name (int8 peak for integer × integer kernels,
 * else bf16; the gradient GEMMs run bf16 tensor cores and use the
 * measured bf16 peak where the table has one); a device not in the table
 * gets "unknown peak" and a bytes-only floor. Each result names the peak
 * it used (floor_peak_ops_per_s).
 *
 * The driver functions the bench needs beyond libdragon (loading and
 * launching the anchor's ReLU kernel) are looked up in the libcuda.so.1
 * that dg_device_open already loaded: linking libcuda would keep the binary
 * from starting at all on a machine without a driver, where it must print
 * "skipped: no CUDA device". cuBLASLt and NVRTC are linked; every dg_ call
 * makes the device's primary context current on the calling thread, which
 * is the context cuBLASLt (the CUDA runtime) and the module loads use.
 * Setup and timing: bench/kernels_run.c; the anchors: bench/kernels_cublas.c.
 *
 * Usage: kernels [--out FILE] [--reps N] [--warmup N] [--case TEXT]...
 *                [--arch sm_XX[a]] [--tile T] [--splits N] [--require-gpu]
 * Exit: 0 ok (or skipped), 1 a case or the setup failed, 2 usage.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench/bench.h"
#include "runtime/gpu/gpu_int.h"

#define MAX_FILTERS 16

/* ---- our kernels ---------------------------------------------------------- */
typedef struct bcase {
	dg_op op;
	dg_fmt weight, act, out;
	int m;
	dg_fmt src; /* the lowrank grads' gradient (0: f32; bf16 named in the case) */
} bcase;

static const bcase cases[] = {
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 4096, DG_FMT_F32 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_INT8, 4096, DG_FMT_F32 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 16384, DG_FMT_F32 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_INT8, 16384, DG_FMT_F32 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_BF16, DG_FMT_BF16, DG_FMT_BF16, 4096, DG_FMT_F32 },
	{ DG_OP_DECODER_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 4096, DG_FMT_F32 },
	{ DG_OP_DECODER_FWD, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 4096, DG_FMT_F32 },
	{ DG_OP_DECODER_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 16384, DG_FMT_F32 },
	{ DG_OP_DECODER_FWD, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 16384, DG_FMT_F32 },
	{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 4096, DG_FMT_F32 },
	{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 16384, DG_FMT_F32 },
	{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_BF16, DG_FMT_BF16, DG_FMT_F32, 4096, DG_FMT_BF16 },
	{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 4096, DG_FMT_F32 },
	{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 16384, DG_FMT_F32 },
	{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 4096, DG_FMT_F32 },
	{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 16384, DG_FMT_F32 },
	{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 4096, DG_FMT_F32 },
	{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 16384, DG_FMT_F32 },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static void case_name(const bcase *c, char *buf, size_t size)
{
	snprintf(buf, size, "%s.%s.%s.%s.m%d%s", dg_op_name(c->op), dg_fmt_name(c->weight),
		 dg_fmt_name(c->act), dg_fmt_name(c->out), c->m,
		 c->src == DG_FMT_BF16 ? ".src_bf16" : "");
}

static bool is_grad(dg_op op)
{
	return op == DG_OP_LOWRANK_GRAD_INPUT || op == DG_OP_LOWRANK_GRAD_WEIGHT ||
	       op == DG_OP_DECODER_GRAD_INPUT || op == DG_OP_DECODER_GRAD_WEIGHT;
}

/* The GEMM of case c: gemm_m × n × k. */
static void case_gemm(const bcase *c, int64_t *gm, int64_t *n, int64_t *k)
{
	const int64_t hl = (int64_t)BDH_H * BDH_L;
	switch (c->op) {
	case DG_OP_LOWRANK_FWD:
		*gm = c->m, *n = hl, *k = BDH_E;
		break;
	case DG_OP_LOWRANK_GRAD_INPUT:
		*gm = c->m, *n = BDH_E, *k = hl;
		break;
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		*gm = hl, *n = BDH_E, *k = c->m;
		break;
	case DG_OP_DECODER_GRAD_INPUT:
		*gm = c->m, *n = hl, *k = BDH_E;
		break;
	case DG_OP_DECODER_GRAD_WEIGHT:
		*gm = BDH_E, *n = hl, *k = c->m;
		break;
	default: /* decoder_fwd */
		*gm = c->m, *n = BDH_E, *k = hl;
		break;
	}
}

/* The tensors of one case, their memory, and the op's arguments. The
 * gradient GEMMs put the gradient in x, the other operand (weight, or the
 * forward's input codes) in w, and the gradient they make in out. */
typedef struct run_case {
	dg_spec spec;
	dg_tensor x, w, out;
	dg_dptr mem[7]; /* x, w, out, their three scales, the workspace */
	dg_workspace ws; /* what the op asks for (decoder_fwd, the grad splits) */
	size_t bytes;   /* x + w + out as stored (not the workspace) */
} run_case;

/* --splits: lowrank_grad_input's K splits (0: the runtime's choice). */
static int bench_splits;

/* Enqueues r's op, or (ws_bytes non-NULL) asks it for its workspace. */
static bool call_ours(bench *b, run_case *r, size_t *ws_bytes)
{
	dg_status st = DG_OK;
	if (ws_bytes)
		*ws_bytes = 0;
	switch (r->spec.op) {
	case DG_OP_LOWRANK_FWD: {
		dg_lowrank_fwd_args a = { .x = &r->x, .w = &r->w, .out = &r->out, .out_absum = 0 };
		if (!ws_bytes)
			st = dg_lowrank_fwd(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_LOWRANK_GRAD_INPUT: {
		dg_lowrank_grad_input_args a = { .grad = &r->x, .w = &r->w, .grad_x = &r->out,
						 .ws = r->ws, .splits = bench_splits };
		st = ws_bytes ? dg_lowrank_grad_input_workspace(b->dev, &r->spec, &a, ws_bytes)
			      : dg_lowrank_grad_input(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_LOWRANK_GRAD_WEIGHT: {
		dg_lowrank_grad_weight_args a = { .grad = &r->x, .x = &r->w, .grad_w = &r->out,
						  .accumulate = false, .ws = r->ws };
		st = ws_bytes ? dg_lowrank_grad_weight_workspace(b->dev, &r->spec, &a, ws_bytes)
			      : dg_lowrank_grad_weight(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_DECODER_GRAD_INPUT: {
		dg_decoder_grad_input_args a = { .grad = &r->x, .w = &r->w, .grad_y = &r->out };
		if (!ws_bytes)
			st = dg_decoder_grad_input(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_DECODER_GRAD_WEIGHT: {
		dg_decoder_grad_weight_args a = { .grad = &r->x, .y = &r->w, .grad_w = &r->out,
						  .accumulate = false, .ws = r->ws };
		st = ws_bytes ? dg_decoder_grad_weight_workspace(b->dev, &r->spec, &a, ws_bytes)
			      : dg_decoder_grad_weight(b->dev, &r->spec, &a);
		break;
	}
	default: {
		dg_decoder_fwd_args a = { .y = &r->x, .w = &r->w, .out = &r->out, .ws = r->ws };
		st = ws_bytes ? dg_decoder_fwd_workspace(b->dev, &r->spec, &a, ws_bytes)
			      : dg_decoder_fwd(b->dev, &r->spec, &a);
		break;
	}
	}
	return bk_dg_ok(b, st, dg_op_name(r->spec.op));
}

static bool run_ours(bench *b, void *arg)
{
	return call_ours(b, arg, NULL);
}

/* RMS of an integer code of format f, drawn as dg_rng_fill draws it. */
static double code_rms(dg_fmt f)
{
	return f == DG_FMT_TERNARY ? sqrt(2.0 / 3.0) : 127.0 / sqrt(3.0);
}

/* The workspace r's op asks for on this device (its tile resolved), made
 * once outside the timing: the same one serves every rep. */
static bool case_workspace(bench *b, run_case *r)
{
	size_t need = 0;
	if (!call_ours(b, r, &need))
		return false;
	if (need && !bk_dg_ok(b, dg_malloc(b->dev, need, &r->mem[6]), "dg_malloc (workspace)"))
		return false;
	r->ws.ptr = r->mem[6];
	r->ws.bytes = need;
	return true;
}

/* Builds the spec and tensors of c (random data), nothing launched. */
/* --tile: one tile for every case run (a manual sweep; NULL: the spec's
 * auto tile). */
static const char *bench_tile;

static bool case_setup(bench *b, const bcase *c, const char *arch, run_case *r)
{
	char msg[512];
	int64_t m = c->m;
	dg_spec *s = &r->spec;
	dg_spec_init(s, c->op);
	s->heads = BDH_H;
	s->in_heads = 1;
	s->embd = BDH_E;
	s->latent = BDH_L;
	s->weight = c->weight;
	s->act = c->act;
	s->out = c->out;
	s->relu = c->op == DG_OP_LOWRANK_FWD;
	s->relu_thr = 0.0f;
	if (c->src == DG_FMT_BF16)
		s->src = c->src; /* the gradient of a lowrank grad (else the op's default) */
	s->arch = b->info.sm;
	s->arch_specific = false;
	if (arch && dg_spec_set(s, "arch", arch, msg, sizeof(msg))) {
		snprintf(b->err, sizeof(b->err), "--arch: %s", msg);
		return false;
	}
	if (bench_tile && dg_spec_set(s, "tile", bench_tile, msg, sizeof(msg))) {
		snprintf(b->err, sizeof(b->err), "--tile: %s", msg);
		return false;
	}
	dg_spec_normalize(s);
	if (dg_spec_validate(s, msg, sizeof(msg))) {
		snprintf(b->err, sizeof(b->err), "spec: %s", msg);
		return false;
	}
	const int64_t hl = (int64_t)BDH_H * BDH_L;
	switch (c->op) {
	case DG_OP_LOWRANK_FWD:
		r->x = dg_tensor_4d("x", c->act, 0, 1, 1, m, BDH_E);
		r->w = dg_tensor_3d("w", c->weight, 0, BDH_H, BDH_L, BDH_E);
		r->out = dg_tensor_4d("out", c->out, 0, 1, BDH_H, m, BDH_L);
		break;
	case DG_OP_LOWRANK_GRAD_INPUT:
		r->x = dg_tensor_4d("grad", c->src, 0, 1, BDH_H, m, BDH_L);
		r->w = dg_tensor_3d("w", c->weight, 0, BDH_H, BDH_L, BDH_E);
		r->out = dg_tensor_4d("grad_x", DG_FMT_F32, 0, 1, 1, m, BDH_E);
		break;
	case DG_OP_LOWRANK_GRAD_WEIGHT:
		r->x = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, BDH_H, m, BDH_L);
		r->w = dg_tensor_4d("x", c->act, 0, 1, 1, m, BDH_E);
		r->out = dg_tensor_3d("grad_w", DG_FMT_F32, 0, BDH_H, BDH_L, BDH_E);
		break;
	case DG_OP_DECODER_GRAD_INPUT:
		r->x = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, 1, m, BDH_E);
		r->w = dg_tensor_2d("w", c->weight, 0, BDH_E, hl);
		r->out = dg_tensor_4d("grad_y", DG_FMT_F32, 0, 1, BDH_H, m, BDH_L);
		break;
	case DG_OP_DECODER_GRAD_WEIGHT:
		r->x = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, 1, m, BDH_E);
		r->w = dg_tensor_4d("y", c->act, 0, 1, BDH_H, m, BDH_L);
		r->out = dg_tensor_2d("grad_w", DG_FMT_F32, 0, BDH_E, hl);
		break;
	default:
		r->x = dg_tensor_4d("y", c->act, 0, 1, BDH_H, m, BDH_L);
		r->w = dg_tensor_2d("w", c->weight, 0, BDH_E, hl);
		r->out = dg_tensor_4d("out", c->out, 0, 1, 1, m, BDH_E);
		break;
	}
	dg_tensor *t[3] = { &r->x, &r->w, &r->out };
	r->bytes = 0;
	for (int i = 0; i < 3; i++) {
		size_t n = dg_tensor_bytes(t[i]);
		r->bytes += n;
		if (!bk_dg_ok(b, dg_malloc(b->dev, n, &r->mem[i]), "dg_malloc"))
			return false;
		t[i]->data = r->mem[i];
		if (i < 2 && !bk_fill_random(b, t[i]->data, n, t[i]->fmt))
			return false;
		if (dg_fmt_is_code(t[i]->fmt)) {
			if (!bk_dg_ok(b, dg_malloc(b->dev, sizeof(float), &r->mem[3 + i]), "dg_malloc"))
				return false;
			t[i]->scale = r->mem[3 + i];
		}
	}
	/* Scales: x codes ±127 ↔ ±1; w about mean|w|; out ≈ 2·mean|y|/127 for
	 * these inputs (half-normal y after the ReLU), so codes are not all
	 * saturated or zero. */
	double sx = 1.0 / 127, sw = 0.02;
	if (is_grad(c->op)) /* only the operand in w is integer: its scale */
		return (!r->w.scale ||
			bk_put_float(b, r->w.scale, (float)(r->w.fmt == DG_FMT_INT8 ? sx : sw))) &&
		       case_workspace(b, r);
	double y_rms = code_rms(c->act) * code_rms(c->weight) * sqrt((double)BDH_E) * sx * sw;
	/* (float operands carry no scale) */
	if ((r->x.scale && !bk_put_float(b, r->x.scale, (float)sx)) ||
	    (r->w.scale && !bk_put_float(b, r->w.scale, (float)sw)))
		return false;
	if (r->out.scale && !bk_put_float(b, r->out.scale, (float)(2 * 0.3989 * y_rms / 127)))
		return false;
	return case_workspace(b, r);
}

static void case_free(bench *b, run_case *r)
{
	for (int i = 0; i < 7; i++)
		dg_free(b->dev, r->mem[i]);
}

/* ---- peaks ------------------------------------------------------------------ */
typedef struct peak {
	int sm;
	const char *name_has, *name_not; /* substrings of the device name */
	double int8_ops, bf16_flops;     /* dense tensor-core peaks, per second */
	double bf16_measured;            /* measured dense bf16 rate (0: none) */
	const char *source;
} peak;

static const peak peaks[] = {
	{ 90, "H200", "NVL", 1979e12, 989e12, 790e12, "H200 SXM datasheet, dense; bf16 measured 790e12" },
	{ 90, "H100 80GB HBM3", NULL, 1979e12, 989e12, 0, "H100 SXM datasheet, dense" },
};

static const peak *peak_find(const dg_device_info *info)
{
	for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]); i++) {
		const peak *p = &peaks[i];
		if (p->sm == info->sm && strstr(info->name, p->name_has) &&
		    !(p->name_not && strstr(info->name, p->name_not)))
			return p;
	}
	return NULL;
}

/* ---- one case --------------------------------------------------------------- */
static void add_num_or_null(cJSON *o, const char *key, double v, bool have)
{
	if (have)
		cJSON_AddNumberToObject(o, key, v);
	else
		cJSON_AddNullToObject(o, key);
}

static bool case_run(bench *b, const bcase *c, const char *arch, double copy_bps,
		     const peak *pk, anchor *an, cJSON *results)
{
	run_case r;
	memset(&r, 0, sizeof(r));
	char name[128], canonical[DG_SPEC_TEXT_MAX] = "";
	dg_timing s;
	memset(&s, 0, sizeof(s));
	case_name(c, name, sizeof(name));
	fprintf(stderr, "kernels: %s\n", name);
	bool ok = case_setup(b, c, arch, &r);
	if (ok)
		dg_spec_to_string(&r.spec, canonical, sizeof(canonical));
	ok = ok && bk_time_op(b, run_ours, &r, false, b->reps, &s);
	/* The kernel that ran: its tile resolved, registers, shared memory
	 * (a cache lookup now: the op above loaded it). */
	dg_kernel_info ki;
	dg_kernel *kern = NULL;
	bool have_ki = ok && dg_kernel_get(b->dev, &r.spec, NULL, &kern) == DG_OK &&
		       dg_kernel_info_get(kern, &ki) == DG_OK;
	case_free(b, &r);

	int64_t m = c->m, gm, k, n;
	case_gemm(c, &gm, &n, &k);
	cJSON *o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "kernel", dg_op_name(c->op));
	cJSON_AddStringToObject(o, "weight", dg_fmt_name(c->weight));
	cJSON_AddStringToObject(o, "act", dg_fmt_name(c->act));
	cJSON_AddStringToObject(o, "out", dg_fmt_name(c->out));
	cJSON_AddNumberToObject(o, "M", (double)m); /* B·T rows, as in the name */
	cJSON_AddNumberToObject(o, "N", (double)n);
	cJSON_AddNumberToObject(o, "K", (double)k);
	cJSON_AddNumberToObject(o, "gemm_m", (double)gm); /* the GEMM is gemm_m × N × K */
	cJSON_AddStringToObject(o, "spec", canonical);
	if (have_ki) {
		cJSON_AddStringToObject(o, "kernel_spec", ki.canonical);
		cJSON_AddNumberToObject(o, "regs", ki.regs);
		cJSON_AddNumberToObject(o, "dyn_smem", ki.dyn_smem);
		cJSON_AddNumberToObject(o, "static_smem", ki.static_smem);
		cJSON_AddNumberToObject(o, "local_bytes", ki.local_bytes);
		fprintf(stderr, "kernels: %s ran %s (%d regs, %d+%d B smem, %d B local)\n",
			name, ki.canonical, ki.regs, ki.static_smem, ki.dyn_smem,
			ki.local_bytes);
	}
	cJSON_AddItemToArray(results, o);
	if (!ok) {
		fprintf(stderr, "kernels: %s: %s\n", name, b->err);
		cJSON_AddStringToObject(o, "error", b->err);
		printf("%-40s error: %s\n", name, b->err);
		return false;
	}

	/* The anchor for this shape, measured once. */
	if (!an->done) {
		an->m = gm, an->n = n, an->k = k, an->relu = c->op == DG_OP_LOWRANK_FWD;
		bk_anchor_run(b, an);
		if (an->err[0])
			fprintf(stderr, "kernels: cuBLASLt %lldx%lldx%lld: %s\n", (long long)m,
				(long long)n, (long long)k, an->err);
	}
	double ops = 2.0 * (double)gm * (double)n * (double)k;
	/* the gradient GEMMs are bf16 tensor-core GEMMs on an f32 gradient */
	bool int_kernel = !is_grad(c->op) && dg_fmt_is_code(c->act) && dg_fmt_is_code(c->weight);
	double peak_ops = pk ? (int_kernel ? pk->int8_ops : pk->bf16_flops) : 0;
	if (pk && is_grad(c->op) && pk->bf16_measured > 0)
		peak_ops = pk->bf16_measured;
	double floor_us = (double)r.bytes / copy_bps * 1e6;
	if (peak_ops > 0 && ops / peak_ops * 1e6 > floor_us)
		floor_us = ops / peak_ops * 1e6;
	bool have_lt = !an->failed, have_relu = have_lt && an->relu_us > 0;

	cJSON_AddNumberToObject(o, "median_us", s.median_us);
	cJSON_AddNumberToObject(o, "p10_us", s.p10_us);
	cJSON_AddNumberToObject(o, "p90_us", s.p90_us);
	cJSON_AddNumberToObject(o, "bytes", (double)r.bytes);
	cJSON_AddNumberToObject(o, "ops", ops);
	cJSON_AddNumberToObject(o, "floor_us", floor_us);
	cJSON_AddStringToObject(o, "floor_basis",
				!pk ? "bytes only (unknown peak)"
				: int_kernel ? "bytes, int8 peak"
				: is_grad(c->op) && pk->bf16_measured > 0 ? "bytes, bf16 peak (measured)"
				: "bytes, bf16 peak");
	add_num_or_null(o, "floor_peak_ops_per_s", peak_ops, peak_ops > 0);
	add_num_or_null(o, "cublas_bf16_us", an->us, have_lt);
	add_num_or_null(o, "cublas_bf16_relu_us", an->relu_us, have_relu);
	if (an->err[0])
		cJSON_AddStringToObject(o, "cublas_error", an->err);
	cJSON_AddNumberToObject(o, "GBps", (double)r.bytes / s.median_us * 1e-3);
	cJSON_AddNumberToObject(o, "TOPS", ops / s.median_us * 1e-6);
	cJSON_AddNumberToObject(o, "fraction_of_floor", floor_us / s.median_us);
	cJSON_AddNumberToObject(o, "ratio_to_floor", s.median_us / floor_us);
	add_num_or_null(o, "speedup_vs_cublas_bf16", an->us / s.median_us, have_lt);
	add_num_or_null(o, "speedup_vs_cublas_bf16_relu", an->relu_us / s.median_us, have_relu);

	char lt[16] = "-", ltr[16] = "-";
	if (have_lt)
		snprintf(lt, sizeof(lt), "%.1f", an->us);
	if (have_relu)
		snprintf(ltr, sizeof(ltr), "%.1f", an->relu_us);
	printf("%-40s %9.1f %9.1f %9.1f %9.1f %6.2f %9s %9s %7.2f %7.1f\n", name, s.median_us, s.p10_us,
	       s.p90_us, floor_us, floor_us / s.median_us, lt, ltr,
	       have_relu ? an->relu_us / s.median_us : have_lt ? an->us / s.median_us : 0,
	       ops / s.median_us * 1e-6);
	fflush(stdout);
	return !an->failed;
}

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: kernels [--out FILE] [--reps N] [--warmup N] [--case TEXT]... "
			"[--arch sm_XX[a]] [--tile BMxBNxBK/WMxWN/S] [--splits N] [--require-gpu]\n"
			"  --splits N   lowrank_grad_input's K splits, 1 to 64 (default: the runtime's choice)\n"
			"  --case TEXT  run the cases whose name holds TEXT (names: "
			"lowrank_fwd.ternary.int8.bf16.m4096, decoder_grad_weight.int8.int8.f32.m16384, ...)\n");
	return code;
}

static bool case_selected(const bcase *c, const char **filters, int nfilters)
{
	char name[128];
	case_name(c, name, sizeof(name));
	for (int i = 0; i < nfilters; i++)
		if (strstr(name, filters[i]))
			return true;
	return nfilters == 0;
}

/* kernels' own options */
typedef struct kernels_opts {
	const char *out_path, *arch, *filters[MAX_FILTERS];
	int nfilters;
} kernels_opts;

static int kernels_option(void *user, const char *a, const char *v)
{
	kernels_opts *o = user;
	if (!v)
		return 0;
	if (strcmp(a, "--out") == 0)
		o->out_path = v;
	else if (strcmp(a, "--arch") == 0)
		o->arch = v;
	else if (strcmp(a, "--tile") == 0)
		bench_tile = v;
	else if (strcmp(a, "--splits") == 0)
		bench_splits = atoi(v);
	else if (strcmp(a, "--case") == 0 && o->nfilters < MAX_FILTERS)
		o->filters[o->nfilters++] = v;
	else
		return 0;
	return 2;
}

int main(int argc, char **argv)
{
	kernels_opts o = { 0 };
	bench b = { .reps = 30, .warmup = 3 };
	int rc = 0;
	if (!bk_args(&b, argc, argv, kernels_option, &o, usage, &rc))
		return rc;
	if (bench_splits < 0 || bench_splits > 64)
		return usage(stderr, 2);
	const char *out_path = o.out_path, *arch = o.arch, **filters = o.filters;
	int nfilters = o.nfilters;

	if (!bk_open(&b, "kernels", &rc))
		return rc;
	cJSON *j = cJSON_CreateObject(), *results = NULL;
	if (!bk_init(&b)) {
		fprintf(stderr, "kernels: setup: %s\n", b.err);
		rc = 1;
		goto out;
	}
	bk_relu_load(&b); /* a failure is kept in b.relu_err, the anchor left out */
	double copy_bps = bk_copy_bandwidth(&b);
	if (copy_bps <= 0) {
		fprintf(stderr, "kernels: copy bandwidth: %s\n", b.err);
		rc = 1;
		goto out;
	}
	const peak *pk = peak_find(&b.info);
	char date[16];
	time_t now = time(NULL);
	strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
	int lt_ver = (int)cublasLtGetVersion();

	cJSON_AddStringToObject(j, "bench", "kernels");
	cJSON_AddStringToObject(j, "device", b.info.name);
	cJSON_AddNumberToObject(j, "sm", b.info.sm);
	cJSON_AddNumberToObject(j, "sm_count", b.info.sm_count);
	cJSON_AddNumberToObject(j, "driver", b.info.driver_version);
	cJSON_AddStringToObject(j, "date", date);
	cJSON_AddStringToObject(j, "nvrtc_version", dg_nvrtc_version());
	cJSON_AddNumberToObject(j, "cublaslt_version", lt_ver);
	cJSON_AddNumberToObject(j, "copy_GBps", copy_bps * 1e-9);
	cJSON *pj = cJSON_AddObjectToObject(j, "peaks");
	if (pk) {
		cJSON_AddNumberToObject(pj, "int8_ops_per_s", pk->int8_ops);
		cJSON_AddNumberToObject(pj, "bf16_flops_per_s", pk->bf16_flops);
		add_num_or_null(pj, "bf16_measured_flops_per_s", pk->bf16_measured, pk->bf16_measured > 0);
		cJSON_AddStringToObject(pj, "source", pk->source);
	} else {
		cJSON_AddStringToObject(pj, "unknown", "unknown peak for this device: floors are bytes only");
	}
	cJSON *tj = cJSON_AddObjectToObject(j, "timing");
	cJSON_AddNumberToObject(tj, "reps", b.reps);
	cJSON_AddNumberToObject(tj, "warmup", b.warmup);
	cJSON_AddNumberToObject(tj, "l2_flush_bytes", (double)dg_timer_flush_bytes(b.timer));
	cJSON_AddStringToObject(tj, "method", "dg_timer: CUDA events around each call on the calling "
					      "thread's stream (cuBLASLt on it too); L2 flushed by a "
					      "write before each rep, outside the events");
	cJSON_AddNumberToObject(tj, "seed", SEED);
	if (!b.relu_fn)
		cJSON_AddStringToObject(tj, "relu_kernel_error", b.relu_err);
	results = cJSON_AddArrayToObject(j, "results");

	printf("kernels on %s (sm_%d, %d SMs, driver %d), %s; copy %.0f GB/s; peak %s; "
	       "%d reps, L2 flushed\n",
	       b.info.name, b.info.sm, b.info.sm_count, b.info.driver_version, date, copy_bps * 1e-9,
	       pk ? pk->source : "unknown peak", b.reps);
	printf("%-40s %9s %9s %9s %9s %6s %9s %9s %7s %7s\n", "case (times in us)", "median", "p10",
	       "p90", "floor", "floor/", "cublas", "+relu", "speedup", "TOPS");
	anchor anchors[NCASES];
	memset(anchors, 0, sizeof(anchors));
	int nrun = 0;
	for (size_t i = 0; i < NCASES; i++) {
		const bcase *c = &cases[i];
		if (!case_selected(c, filters, nfilters))
			continue;
		nrun++;
		/* One anchor per (op, M): the cases differ only in formats. */
		anchor *an = NULL;
		for (size_t k = 0; k < i && !an; k++)
			if (cases[k].op == c->op && cases[k].m == c->m && anchors[k].done)
				an = &anchors[k];
		if (!case_run(&b, c, arch, copy_bps, pk, an ? an : &anchors[i], results))
			rc = 1;
	}
	if (nrun == 0) {
		fprintf(stderr, "kernels: no case matches --case\n");
		rc = 2;
	}
	printf("speedup: over cuBLASLt bf16 + ReLU for lowrank_fwd, over the plain GEMM (same gemm_m x N x K) "
	       "for the others\n");
out:;
	char *text = cJSON_Print(j);
	if (out_path && results) {
		FILE *f = fopen(out_path, "w");
		if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f)) {
			fprintf(stderr, "kernels: cannot write %s\n", out_path);
			rc = 1;
		} else {
			fprintf(stderr, "kernels: wrote %s\n", out_path);
		}
	}
	cJSON_free(text);
	cJSON_Delete(j);
	bk_fini(&b);
	return rc;
}
