/*
 * kernels — dragon's BDH kernels on the GPU, against the floor and against
 * cuBLASLt, at training shapes (H=4, L=8192, E=256; M = B·T rows):
 *
 *   lowrank_fwd  x (1,1,M,256) int8, w (4,8192,256) ternary, relu thr 0
 *                → out (1,4,M,8192) bf16 | int8 codes   (K=256, N=32768)
 *   decoder_fwd  y (1,4,M,8192) int8, w (256,32768) ternary | int8
 *                → out (1,1,M,256) bf16                 (K=32768, N=256)
 *
 * and the backward GEMMs (f32 gradients; the GEMM is gemm_m × N × K):
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
 * the layer's, which that kernel does not read).
 *
 * Each call is timed with CUDA events on the device's stream, after
 * --warmup untimed calls (the first compiles the kernel), with the L2
 * flushed before every rep (a cuMemsetD8Async over a buffer larger than the
 * L2, outside the events); median, p10 and p90 of --reps. The host-side
 * cost of an op (checks, kernel lookup) is hidden behind the flush, so the
 * figures are device time.
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
 * measured here (cuMemcpyDtoDAsync of 1 GiB, read + write), the peak from
 * a table keyed by sm and name (int8 peak for integer × integer kernels,
 * else bf16; the backward kernels run bf16 tensor cores and use the
 * measured bf16 peak where the table has one); a device not in the table
 * gets "unknown peak" and a bytes-only floor. Each result names the peak
 * it used (floor_peak_ops_per_s).
 *
 * The driver functions the bench needs beyond libdragon (events, module
 * loading for the ReLU kernel) are looked up in the libcuda.so.1 that
 * dg_device_open already loaded: linking libcuda would keep the binary from
 * starting at all on a machine without a driver, where it must print
 * "skipped: no CUDA device". cuBLASLt and NVRTC are linked.
 *
 * Usage: kernels [--out FILE] [--reps N] [--warmup N] [--case TEXT]...
 *                [--arch sm_XX[a]] [--require-gpu]
 * Exit: 0 ok (or skipped), 1 a case or the setup failed, 2 usage.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <cuda.h>
/* cublasLt.h declares cublasLtLoggerForceDisable() without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <nvrtc.h>

#include "dragon/dragon.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* the exported name: cuda.h maps some to _v2 */

/* Driver entry points, typed by cuda.h's own prototypes. */
#define BENCH_CU_FUNCS(X)                                                     \
	X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
	X(cuCtxSetCurrent) X(cuGetErrorName) X(cuEventCreate)                 \
	X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)              \
	X(cuEventElapsedTime) X(cuMemcpyDtoDAsync) X(cuMemsetD8Async)         \
	X(cuStreamSynchronize) X(cuModuleLoadData) X(cuModuleUnload)          \
	X(cuModuleGetFunction) X(cuLaunchKernel)

static struct {
#define BENCH_CU_FIELD(f) __typeof__(&f) f;
	BENCH_CU_FUNCS(BENCH_CU_FIELD)
#undef BENCH_CU_FIELD
} cu;

enum { BDH_H = 4, BDH_L = 8192, BDH_E = 256 };
#define LT_WORKSPACE (32u << 20)
#define COPY_BYTES ((size_t)1 << 30)
#define MAX_FILTERS 16

typedef struct stats {
	double median, p10, p90; /* microseconds */
} stats;

typedef struct bench {
	dg_device *dev;
	dg_device_info info;
	CUstream stream;
	CUdevice cudev;
	bool ctx_retained;
	int reps, warmup;
	int nev;            /* max(reps, 10): the copy is timed 10 times at least */
	CUevent *ev0, *ev1; /* [nev] */
	double *us;         /* [nev] */
	dg_dptr flush;      /* flush_bytes, written before every rep */
	size_t flush_bytes;
	cublasLtHandle_t lt;
	dg_dptr lt_ws; /* LT_WORKSPACE bytes */
	CUmodule relu_mod;
	CUfunction relu_fn;
	char relu_err[512]; /* why there is no ReLU kernel, if there is none */
	char err[1024];     /* the last failure */
} bench;

/* ---- small helpers ------------------------------------------------------ */

static bool cu_ok(bench *b, CUresult rc, const char *call)
{
	if (rc == CUDA_SUCCESS)
		return true;
	const char *name = "?";
	if (cu.cuGetErrorName)
		cu.cuGetErrorName(rc, &name);
	snprintf(b->err, sizeof(b->err), "%s: %s (%d)", call, name, (int)rc);
	return false;
}

static bool lt_ok(bench *b, cublasStatus_t st, const char *call)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return true;
	snprintf(b->err, sizeof(b->err), "%s: %s", call, cublasLtGetStatusName(st));
	return false;
}

static bool dg_ok(bench *b, dg_status st, const char *call)
{
	if (st == DG_OK)
		return true;
	snprintf(b->err, sizeof(b->err), "%s: %s: %s", call, dg_status_str(st),
		 dg_device_errmsg(b->dev));
	return false;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Quantile of sorted v by linear interpolation. */
static double quantile(const double *v, int n, double q)
{
	double pos = q * (n - 1);
	int i = (int)pos;
	if (i >= n - 1)
		return v[n - 1];
	return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rng(void) /* splitmix64 */
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

/* Fills bytes of device memory with random data of format fmt: int8 codes
 * in [-127, 127], ternary 2-bit fields in {0, +1, -1}, bf16 and f32 in
 * [-1, 1]. A 16 MiB host block is made once per call and uploaded
 * repeatedly. */
static bool fill_random(bench *b, dg_dptr dst, size_t bytes, dg_fmt fmt)
{
	size_t block = bytes < ((size_t)16 << 20) ? bytes : ((size_t)16 << 20);
	uint8_t *h = malloc(block);
	if (!h) {
		snprintf(b->err, sizeof(b->err), "out of host memory (%zu bytes)", block);
		return false;
	}
	for (size_t i = 0; i < block; i++) {
		uint64_t r = rng();
		if (fmt == DG_FMT_TERNARY) {
			static const uint8_t code[3] = { 0x0, 0x1, 0x3 };
			h[i] = (uint8_t)(code[r % 3] | code[(r >> 8) % 3] << 2 |
					 code[(r >> 16) % 3] << 4 | code[(r >> 24) % 3] << 6);
		} else if (fmt == DG_FMT_F32 && i % 4 == 0 && i + 3 < block) {
			float f = (float)((double)(r >> 40) / (double)(1u << 23) - 1.0);
			memcpy(h + i, &f, sizeof(f));
			i += 3;
		} else if (fmt == DG_FMT_BF16 && i % 2 == 0 && i + 1 < block) {
			float f = (float)((double)(r >> 40) / (double)(1u << 23) - 1.0);
			uint32_t u;
			memcpy(&u, &f, sizeof(u));
			h[i] = (uint8_t)(u >> 16);
			h[i + 1] = (uint8_t)(u >> 24);
			i++;
		} else {
			h[i] = (uint8_t)(int8_t)((int)(r % 255) - 127);
		}
	}
	bool ok = true;
	for (size_t off = 0; ok && off < bytes; off += block) {
		size_t n = bytes - off < block ? bytes - off : block;
		ok = dg_ok(b, dg_memcpy_htod(b->dev, dst + off, h, n), "dg_memcpy_htod");
	}
	free(h);
	return ok;
}

static bool put_float(bench *b, dg_dptr dst, float v)
{
	return dg_ok(b, dg_memcpy_htod(b->dev, dst, &v, sizeof(v)), "dg_memcpy_htod");
}

/* ---- timing ---------------------------------------------------------------
 * A run_fn enqueues one call on b->stream; false with b->err on failure. */
typedef bool (*run_fn)(bench *b, void *arg);

static bool time_op(bench *b, run_fn fn, void *arg, bool flush, int reps, stats *out)
{
	for (int i = 0; i < b->warmup; i++)
		if (!fn(b, arg))
			return false;
	for (int i = 0; i < reps; i++) {
		if (flush && !cu_ok(b, cu.cuMemsetD8Async(b->flush, (unsigned char)i,
							  b->flush_bytes, b->stream),
				    "cuMemsetD8Async"))
			return false;
		if (!cu_ok(b, cu.cuEventRecord(b->ev0[i], b->stream), "cuEventRecord"))
			return false;
		if (!fn(b, arg))
			return false;
		if (!cu_ok(b, cu.cuEventRecord(b->ev1[i], b->stream), "cuEventRecord"))
			return false;
	}
	if (!cu_ok(b, cu.cuStreamSynchronize(b->stream), "cuStreamSynchronize (a kernel failed)"))
		return false;
	for (int i = 0; i < reps; i++) {
		float ms;
		if (!cu_ok(b, cu.cuEventElapsedTime(&ms, b->ev0[i], b->ev1[i]), "cuEventElapsedTime"))
			return false;
		b->us[i] = ms * 1e3;
	}
	qsort(b->us, (size_t)reps, sizeof(double), cmp_double);
	out->median = quantile(b->us, reps, 0.5);
	out->p10 = quantile(b->us, reps, 0.1);
	out->p90 = quantile(b->us, reps, 0.9);
	return true;
}

/* ---- copy bandwidth -------------------------------------------------------- */
typedef struct copy_arg {
	dg_dptr src, dst;
} copy_arg;

static bool run_copy(bench *b, void *arg)
{
	copy_arg *c = arg;
	return cu_ok(b, cu.cuMemcpyDtoDAsync(c->dst, c->src, COPY_BYTES, b->stream),
		     "cuMemcpyDtoDAsync");
}

/* Bytes read + written per second; 0 on failure. */
static double copy_bandwidth(bench *b)
{
	copy_arg c = { 0, 0 };
	stats s = { 0, 0, 0 };
	bool ok = dg_ok(b, dg_malloc(b->dev, COPY_BYTES, &c.src), "dg_malloc") &&
		  dg_ok(b, dg_malloc(b->dev, COPY_BYTES, &c.dst), "dg_malloc") &&
		  dg_ok(b, dg_memset8(b->dev, c.src, 1, COPY_BYTES), "dg_memset8") &&
		  time_op(b, run_copy, &c, false, b->nev, &s);
	dg_free(b->dev, c.src);
	dg_free(b->dev, c.dst);
	return ok ? 2.0 * (double)COPY_BYTES / (s.median * 1e-6) : 0;
}

/* ---- the ReLU kernel of the anchor ---------------------------------------- */
static const char relu_src[] =
	"__device__ unsigned int bf16_rne(float f)\n"
	"{\n"
	"\tunsigned int u = __float_as_uint(f);\n"
	"\treturn (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n"
	"}\n"
	"/* out = relu(in - thr), bf16, eight a thread (n8 = n / 8) */\n"
	"extern \"C\" __global__ void relu_bf16(const uint4 *in, uint4 *out,\n"
	"\tunsigned long long n8, float thr)\n"
	"{\n"
	"\tunsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
	"\tif (i >= n8)\n"
	"\t\treturn;\n"
	"\tuint4 v = in[i];\n"
	"\tunsigned int w[4] = { v.x, v.y, v.z, v.w };\n"
	"#pragma unroll\n"
	"\tfor (int k = 0; k < 4; k++) {\n"
	"\t\tfloat lo = fmaxf(__uint_as_float(w[k] << 16) - thr, 0.f);\n"
	"\t\tfloat hi = fmaxf(__uint_as_float(w[k] & 0xffff0000u) - thr, 0.f);\n"
	"\t\tw[k] = bf16_rne(lo) | (bf16_rne(hi) << 16);\n"
	"\t}\n"
	"\tuint4 r;\n"
	"\tr.x = w[0]; r.y = w[1]; r.z = w[2]; r.w = w[3];\n"
	"\tout[i] = r;\n"
	"}\n";

/* Compiles and loads relu_bf16 for the device's arch; on failure leaves
 * b->relu_fn NULL and says why in b->relu_err (the anchor is then null). */
static void relu_load(bench *b)
{
	nvrtcProgram prog = NULL;
	char arch[32], *cubin = NULL, *log = NULL;
	size_t n = 0;
	snprintf(arch, sizeof(arch), "--gpu-architecture=sm_%d", b->info.sm);
	const char *opts[] = { arch, "-default-device" };
	nvrtcResult rc = nvrtcCreateProgram(&prog, relu_src, "relu_bf16.cu", 0, NULL, NULL);
	if (rc == NVRTC_SUCCESS)
		rc = nvrtcCompileProgram(prog, 2, opts);
	if (rc != NVRTC_SUCCESS) {
		size_t ln = 0;
		if (prog && nvrtcGetProgramLogSize(prog, &ln) == NVRTC_SUCCESS && ln > 1 &&
		    (log = malloc(ln)) && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS)
			snprintf(b->relu_err, sizeof(b->relu_err), "NVRTC (%s): %.400s",
				 nvrtcGetErrorString(rc), log);
		else
			snprintf(b->relu_err, sizeof(b->relu_err), "NVRTC: %s", nvrtcGetErrorString(rc));
		goto out;
	}
	if (nvrtcGetCUBINSize(prog, &n) != NVRTC_SUCCESS || !(cubin = malloc(n)) ||
	    nvrtcGetCUBIN(prog, cubin) != NVRTC_SUCCESS) {
		snprintf(b->relu_err, sizeof(b->relu_err), "NVRTC: no cubin for %s", arch);
		goto out;
	}
	if (!cu_ok(b, cu.cuModuleLoadData(&b->relu_mod, cubin), "cuModuleLoadData") ||
	    !cu_ok(b, cu.cuModuleGetFunction(&b->relu_fn, b->relu_mod, "relu_bf16"),
		   "cuModuleGetFunction")) {
		snprintf(b->relu_err, sizeof(b->relu_err), "%.400s", b->err);
		b->relu_fn = NULL;
	}
out:
	free(log);
	free(cubin);
	nvrtcDestroyProgram(&prog);
}

/* ---- cuBLASLt anchor ------------------------------------------------------
 * Row-major Y (M,N) = X (M,K) · Wᵀ, W (N,K) as our weights are stored: in
 * cuBLASLt's column-major terms Yᵀ (N×M) = op_T(W: K×N) · Xᵀ (K×M), "TN". */
typedef struct gemm {
	int64_t m, n, k;
	dg_dptr x, w, y; /* bf16 (M,K), (N,K), (M,N) */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulHeuristicResult_t algo;
	float thr;
} gemm;

static bool run_gemm(bench *b, void *arg)
{
	gemm *g = arg;
	const float alpha = 1.0f, beta = 0.0f;
	return lt_ok(b, cublasLtMatmul(b->lt, g->desc, &alpha, (const void *)g->w, g->la,
				       (const void *)g->x, g->lb, &beta, (const void *)g->y,
				       g->lc, (void *)g->y, g->lc, &g->algo.algo,
				       (void *)b->lt_ws, LT_WORKSPACE, b->stream),
		     "cublasLtMatmul");
}

static bool run_gemm_relu(bench *b, void *arg)
{
	gemm *g = arg;
	if (!run_gemm(b, arg))
		return false;
	unsigned long long n8 = (unsigned long long)(g->m * g->n / 8);
	unsigned grid = (unsigned)((n8 + 255) / 256);
	void *args[] = { &g->y, &g->y, &n8, &g->thr };
	return cu_ok(b, cu.cuLaunchKernel(b->relu_fn, grid, 1, 1, 256, 1, 1, 0, b->stream,
					  args, NULL),
		     "cuLaunchKernel (relu_bf16)");
}

typedef struct anchor {
	int64_t m, n, k;
	bool relu;
	bool done, failed;
	double us, relu_us; /* medians; relu_us < 0: none */
	char err[1024];
} anchor;

/* Times the GEMM (and GEMM + ReLU when a->relu) for a's shape. */
static void anchor_run(bench *b, anchor *a)
{
	gemm g = { .m = a->m, .n = a->n, .k = a->k, .thr = 0.0f };
	cublasLtMatmulPreference_t pref = NULL;
	stats s;
	uint64_t ws = LT_WORKSPACE;
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	int found = 0;
	a->done = true;
	a->relu_us = -1;
	bool ok = dg_ok(b, dg_malloc(b->dev, (size_t)(g.m * g.k * 2), &g.x), "dg_malloc") &&
		  dg_ok(b, dg_malloc(b->dev, (size_t)(g.n * g.k * 2), &g.w), "dg_malloc") &&
		  dg_ok(b, dg_malloc(b->dev, (size_t)(g.m * g.n * 2), &g.y), "dg_malloc") &&
		  fill_random(b, g.x, (size_t)(g.m * g.k * 2), DG_FMT_BF16) &&
		  fill_random(b, g.w, (size_t)(g.n * g.k * 2), DG_FMT_BF16);
	ok = ok && lt_ok(b, cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
			 "cublasLtMatmulDescCreate") &&
	     lt_ok(b, cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
		   "cublasLtMatmulDescSetAttribute") &&
	     lt_ok(b, cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
		   "cublasLtMatmulDescSetAttribute") &&
	     lt_ok(b, cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, (uint64_t)g.k, (uint64_t)g.n, g.k),
		   "cublasLtMatrixLayoutCreate") &&
	     lt_ok(b, cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, (uint64_t)g.k, (uint64_t)g.m, g.k),
		   "cublasLtMatrixLayoutCreate") &&
	     lt_ok(b, cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, (uint64_t)g.n, (uint64_t)g.m, g.n),
		   "cublasLtMatrixLayoutCreate") &&
	     lt_ok(b, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate") &&
	     lt_ok(b, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
							   &ws, sizeof(ws)),
		   "cublasLtMatmulPreferenceSetAttribute") &&
	     lt_ok(b, cublasLtMatmulAlgoGetHeuristic(b->lt, g.desc, g.la, g.lb, g.lc, g.lc, pref, 1,
						     &g.algo, &found),
		   "cublasLtMatmulAlgoGetHeuristic");
	if (ok && found < 1) {
		snprintf(b->err, sizeof(b->err), "cuBLASLt has no algorithm for bf16 %lldx%lldx%lld",
			 (long long)g.m, (long long)g.n, (long long)g.k);
		ok = false;
	}
	if (ok && (ok = time_op(b, run_gemm, &g, true, b->reps, &s)))
		a->us = s.median;
	if (ok && a->relu && b->relu_fn && (ok = time_op(b, run_gemm_relu, &g, true, b->reps, &s)))
		a->relu_us = s.median;
	if (!ok) {
		a->failed = true;
		snprintf(a->err, sizeof(a->err), "%s", b->err);
	} else if (a->relu && !b->relu_fn) {
		snprintf(a->err, sizeof(a->err), "no ReLU kernel: %s", b->relu_err);
	}
	cublasLtMatmulPreferenceDestroy(pref);
	cublasLtMatrixLayoutDestroy(g.la);
	cublasLtMatrixLayoutDestroy(g.lb);
	cublasLtMatrixLayoutDestroy(g.lc);
	cublasLtMatmulDescDestroy(g.desc);
	dg_free(b->dev, g.x);
	dg_free(b->dev, g.w);
	dg_free(b->dev, g.y);
}

/* ---- our kernels ---------------------------------------------------------- */
typedef struct bcase {
	dg_op op;
	dg_fmt weight, act, out;
	int m;
} bcase;

static const bcase cases[] = {
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 4096 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_INT8, 4096 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 16384 },
	{ DG_OP_LOWRANK_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_INT8, 16384 },
	{ DG_OP_DECODER_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 4096 },
	{ DG_OP_DECODER_FWD, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 4096 },
	{ DG_OP_DECODER_FWD, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_BF16, 16384 },
	{ DG_OP_DECODER_FWD, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_BF16, 16384 },
	{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 4096 },
	{ DG_OP_LOWRANK_GRAD_INPUT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 16384 },
	{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 4096 },
	{ DG_OP_LOWRANK_GRAD_WEIGHT, DG_FMT_TERNARY, DG_FMT_INT8, DG_FMT_F32, 16384 },
	{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 4096 },
	{ DG_OP_DECODER_GRAD_INPUT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 16384 },
	{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 4096 },
	{ DG_OP_DECODER_GRAD_WEIGHT, DG_FMT_INT8, DG_FMT_INT8, DG_FMT_F32, 16384 },
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static void case_name(const bcase *c, char *buf, size_t size)
{
	snprintf(buf, size, "%s.%s.%s.%s.m%d", dg_op_name(c->op), dg_fmt_name(c->weight),
		 dg_fmt_name(c->act), dg_fmt_name(c->out), c->m);
}

static bool is_int_fmt(dg_fmt f)
{
	return f != DG_FMT_F32 && f != DG_FMT_BF16;
}

static bool is_backward(dg_op op)
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
 * backward ops put the gradient in x, the other operand (weight, or the
 * forward's input codes) in w, and the gradient they make in out. */
typedef struct run_case {
	dg_spec spec;
	dg_tensor x, w, out;
	dg_dptr mem[6]; /* x, w, out, and their three scales */
	size_t bytes;   /* x + w + out as stored */
} run_case;

static bool run_ours(bench *b, void *arg)
{
	run_case *r = arg;
	dg_status st;
	switch (r->spec.op) {
	case DG_OP_LOWRANK_FWD: {
		dg_lowrank_fwd_args a = { .x = &r->x, .w = &r->w, .out = &r->out, .out_absum = 0 };
		st = dg_lowrank_fwd(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_LOWRANK_GRAD_INPUT: {
		dg_lowrank_grad_input_args a = { .grad = &r->x, .w = &r->w, .grad_x = &r->out };
		st = dg_lowrank_grad_input(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_LOWRANK_GRAD_WEIGHT: {
		dg_lowrank_grad_weight_args a = { .grad = &r->x, .x = &r->w, .grad_w = &r->out,
						  .accumulate = false };
		st = dg_lowrank_grad_weight(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_DECODER_GRAD_INPUT: {
		dg_decoder_grad_input_args a = { .grad = &r->x, .w = &r->w, .grad_y = &r->out };
		st = dg_decoder_grad_input(b->dev, &r->spec, &a);
		break;
	}
	case DG_OP_DECODER_GRAD_WEIGHT: {
		dg_decoder_grad_weight_args a = { .grad = &r->x, .y = &r->w, .grad_w = &r->out,
						  .accumulate = false };
		st = dg_decoder_grad_weight(b->dev, &r->spec, &a);
		break;
	}
	default: {
		dg_decoder_fwd_args a = { .y = &r->x, .w = &r->w, .out = &r->out };
		st = dg_decoder_fwd(b->dev, &r->spec, &a);
		break;
	}
	}
	return dg_ok(b, st, dg_op_name(r->spec.op));
}

/* RMS of an integer code of format f, drawn as fill_random draws it. */
static double code_rms(dg_fmt f)
{
	return f == DG_FMT_TERNARY ? sqrt(2.0 / 3.0) : 127.0 / sqrt(3.0);
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
		r->x = dg_tensor_4d("grad", DG_FMT_F32, 0, 1, BDH_H, m, BDH_L);
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
		if (!dg_ok(b, dg_malloc(b->dev, n, &r->mem[i]), "dg_malloc"))
			return false;
		t[i]->data = r->mem[i];
		if (i < 2 && !fill_random(b, t[i]->data, n, t[i]->fmt))
			return false;
		if (is_int_fmt(t[i]->fmt)) {
			if (!dg_ok(b, dg_malloc(b->dev, sizeof(float), &r->mem[3 + i]), "dg_malloc"))
				return false;
			t[i]->scale = r->mem[3 + i];
		}
	}
	/* Scales: x codes ±127 ↔ ±1; w about mean|w|; out ≈ 2·mean|y|/127 for
	 * these inputs (half-normal y after the ReLU), so codes are not all
	 * saturated or zero. */
	double sx = 1.0 / 127, sw = 0.02;
	if (is_backward(c->op)) /* only the operand in w is integer: its scale */
		return !r->w.scale || put_float(b, r->w.scale, (float)(r->w.fmt == DG_FMT_INT8 ? sx : sw));
	double y_rms = code_rms(c->act) * code_rms(c->weight) * sqrt((double)BDH_E) * sx * sw;
	if (!put_float(b, r->x.scale, (float)sx) || !put_float(b, r->w.scale, (float)sw))
		return false;
	if (r->out.scale && !put_float(b, r->out.scale, (float)(2 * 0.3989 * y_rms / 127)))
		return false;
	return true;
}

static void case_free(bench *b, run_case *r)
{
	for (int i = 0; i < 6; i++)
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
	stats s = { 0, 0, 0 };
	case_name(c, name, sizeof(name));
	fprintf(stderr, "kernels: %s\n", name);
	bool ok = case_setup(b, c, arch, &r);
	if (ok)
		dg_spec_to_string(&r.spec, canonical, sizeof(canonical));
	ok = ok && time_op(b, run_ours, &r, true, b->reps, &s);
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
		anchor_run(b, an);
		if (an->err[0])
			fprintf(stderr, "kernels: cuBLASLt %lldx%lldx%lld: %s\n", (long long)m,
				(long long)n, (long long)k, an->err);
	}
	double ops = 2.0 * (double)gm * (double)n * (double)k;
	/* the backward kernels are bf16 tensor-core GEMMs on an f32 gradient */
	bool int_kernel = !is_backward(c->op) && is_int_fmt(c->act) && is_int_fmt(c->weight);
	double peak_ops = pk ? (int_kernel ? pk->int8_ops : pk->bf16_flops) : 0;
	if (pk && is_backward(c->op) && pk->bf16_measured > 0)
		peak_ops = pk->bf16_measured;
	double floor_us = (double)r.bytes / copy_bps * 1e6;
	if (peak_ops > 0 && ops / peak_ops * 1e6 > floor_us)
		floor_us = ops / peak_ops * 1e6;
	bool have_lt = !an->failed, have_relu = have_lt && an->relu_us > 0;

	cJSON_AddNumberToObject(o, "median_us", s.median);
	cJSON_AddNumberToObject(o, "p10_us", s.p10);
	cJSON_AddNumberToObject(o, "p90_us", s.p90);
	cJSON_AddNumberToObject(o, "bytes", (double)r.bytes);
	cJSON_AddNumberToObject(o, "ops", ops);
	cJSON_AddNumberToObject(o, "floor_us", floor_us);
	cJSON_AddStringToObject(o, "floor_basis",
				!pk ? "bytes only (unknown peak)"
				: int_kernel ? "bytes, int8 peak"
				: is_backward(c->op) && pk->bf16_measured > 0 ? "bytes, bf16 peak (measured)"
				: "bytes, bf16 peak");
	add_num_or_null(o, "floor_peak_ops_per_s", peak_ops, peak_ops > 0);
	add_num_or_null(o, "cublas_bf16_us", an->us, have_lt);
	add_num_or_null(o, "cublas_bf16_relu_us", an->relu_us, have_relu);
	if (an->err[0])
		cJSON_AddStringToObject(o, "cublas_error", an->err);
	cJSON_AddNumberToObject(o, "GBps", (double)r.bytes / s.median * 1e-3);
	cJSON_AddNumberToObject(o, "TOPS", ops / s.median * 1e-6);
	cJSON_AddNumberToObject(o, "fraction_of_floor", floor_us / s.median);
	cJSON_AddNumberToObject(o, "ratio_to_floor", s.median / floor_us);
	add_num_or_null(o, "speedup_vs_cublas_bf16", an->us / s.median, have_lt);
	add_num_or_null(o, "speedup_vs_cublas_bf16_relu", an->relu_us / s.median, have_relu);

	char lt[16] = "-", ltr[16] = "-";
	if (have_lt)
		snprintf(lt, sizeof(lt), "%.1f", an->us);
	if (have_relu)
		snprintf(ltr, sizeof(ltr), "%.1f", an->relu_us);
	printf("%-40s %9.1f %9.1f %9.1f %9.1f %6.2f %9s %9s %7.2f %7.1f\n", name, s.median, s.p10,
	       s.p90, floor_us, floor_us / s.median, lt, ltr,
	       have_relu ? an->relu_us / s.median : have_lt ? an->us / s.median : 0,
	       ops / s.median * 1e-6);
	fflush(stdout);
	return !an->failed;
}

/* ---- setup and main ----------------------------------------------------------- */
static bool bench_init(bench *b)
{
	static const struct {
		const char *name;
		void **slot;
	} syms[] = {
#define BENCH_CU_SYM(f) { STR(f), (void **)&cu.f },
		BENCH_CU_FUNCS(BENCH_CU_SYM)
#undef BENCH_CU_SYM
	};
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(b->err, sizeof(b->err), "dlopen libcuda.so.1: %s", dlerror());
		return false;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (!*syms[i].slot) {
			snprintf(b->err, sizeof(b->err), "libcuda.so.1 lacks %s", syms[i].name);
			return false;
		}
	}
	CUcontext ctx;
	/* dg_device_open retained the primary context; make it current here too
	 * (cuBLASLt and our events use the current context). */
	if (!cu_ok(b, cu.cuDeviceGet(&b->cudev, b->info.ordinal), "cuDeviceGet") ||
	    !cu_ok(b, cu.cuDevicePrimaryCtxRetain(&ctx, b->cudev), "cuDevicePrimaryCtxRetain"))
		return false;
	b->ctx_retained = true;
	if (!cu_ok(b, cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
		return false;
	b->stream = (CUstream)dg_device_stream(b->dev);
	b->nev = b->reps < 10 ? 10 : b->reps;
	b->ev0 = calloc((size_t)b->nev, sizeof(CUevent));
	b->ev1 = calloc((size_t)b->nev, sizeof(CUevent));
	b->us = calloc((size_t)b->nev, sizeof(double));
	if (!b->ev0 || !b->ev1 || !b->us) {
		snprintf(b->err, sizeof(b->err), "out of host memory");
		return false;
	}
	for (int i = 0; i < b->nev; i++)
		if (!cu_ok(b, cu.cuEventCreate(&b->ev0[i], CU_EVENT_DEFAULT), "cuEventCreate") ||
		    !cu_ok(b, cu.cuEventCreate(&b->ev1[i], CU_EVENT_DEFAULT), "cuEventCreate"))
			return false;
	b->flush_bytes = (size_t)b->info.l2_bytes * 4;
	if (b->flush_bytes < ((size_t)256 << 20))
		b->flush_bytes = (size_t)256 << 20;
	if (!dg_ok(b, dg_malloc(b->dev, b->flush_bytes, &b->flush), "dg_malloc") ||
	    !dg_ok(b, dg_malloc(b->dev, LT_WORKSPACE, &b->lt_ws), "dg_malloc") ||
	    !lt_ok(b, cublasLtCreate(&b->lt), "cublasLtCreate"))
		return false;
	relu_load(b);
	return true;
}

static void bench_fini(bench *b)
{
	for (int i = 0; b->ev0 && i < b->nev; i++) {
		if (b->ev0[i])
			cu.cuEventDestroy(b->ev0[i]);
		if (b->ev1[i])
			cu.cuEventDestroy(b->ev1[i]);
	}
	free(b->ev0);
	free(b->ev1);
	free(b->us);
	if (b->relu_mod)
		cu.cuModuleUnload(b->relu_mod);
	if (b->lt)
		cublasLtDestroy(b->lt);
	if (b->dev) {
		dg_free(b->dev, b->flush);
		dg_free(b->dev, b->lt_ws);
	}
	if (b->ctx_retained)
		cu.cuDevicePrimaryCtxRelease(b->cudev);
	dg_device_close(b->dev);
}

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: kernels [--out FILE] [--reps N] [--warmup N] [--case TEXT]... "
			"[--arch sm_XX[a]] [--tile BMxBNxBK/WMxWN/S] [--require-gpu]\n"
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

int main(int argc, char **argv)
{
	const char *out_path = NULL, *arch = NULL, *filters[MAX_FILTERS];
	int nfilters = 0;
	bool require = false;
	bench b;
	memset(&b, 0, sizeof(b));
	b.reps = 30;
	b.warmup = 3;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--require-gpu") == 0)
			require = true;
		else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
			return usage(stdout, 0);
		else if (!v)
			return usage(stderr, 2);
		else if (strcmp(a, "--out") == 0)
			out_path = v, i++;
		else if (strcmp(a, "--reps") == 0)
			b.reps = atoi(v), i++;
		else if (strcmp(a, "--warmup") == 0)
			b.warmup = atoi(v), i++;
		else if (strcmp(a, "--arch") == 0)
			arch = v, i++;
		else if (strcmp(a, "--tile") == 0)
			bench_tile = v, i++;
		else if (strcmp(a, "--case") == 0 && nfilters < MAX_FILTERS)
			filters[nfilters++] = v, i++;
		else
			return usage(stderr, 2);
	}
	if (b.reps < 1 || b.reps > 10000 || b.warmup < 0 || b.warmup > 1000)
		return usage(stderr, 2);

	dg_device_opts opts = { .ordinal = 0, .jit = NULL };
	dg_status st = dg_device_open(&b.dev, &opts);
	if (st == DG_ERR_NO_DEVICE) {
		printf("skipped: no CUDA device (%s)\n", b.dev ? dg_device_errmsg(b.dev) : "");
		dg_device_close(b.dev);
		if (require)
			fprintf(stderr, "kernels: --require-gpu: no CUDA device\n");
		return require ? 1 : 0;
	}
	if (st == DG_OK)
		st = dg_device_info_get(b.dev, &b.info);
	if (st) {
		fprintf(stderr, "kernels: opening the device: %s: %s\n", dg_status_str(st),
			b.dev ? dg_device_errmsg(b.dev) : "");
		dg_device_close(b.dev);
		return 1;
	}
	int rc = 0;
	cJSON *j = cJSON_CreateObject(), *results = NULL;
	if (!bench_init(&b)) {
		fprintf(stderr, "kernels: setup: %s\n", b.err);
		rc = 1;
		goto out;
	}
	double copy_bps = copy_bandwidth(&b);
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
	cJSON_AddNumberToObject(tj, "l2_flush_bytes", (double)b.flush_bytes);
	cJSON_AddStringToObject(tj, "method", "CUDA events around each call; L2 flushed by "
					      "cuMemsetD8Async before each rep, outside the events");
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
	bench_fini(&b);
	return rc;
}
