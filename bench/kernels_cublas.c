/*
 * The anchors of the bench `kernels`: a cuBLASLt bf16 GEMM on our shapes,
 * and for the projection that GEMM followed by a separate relu(y − thr)
 * kernel compiled here with NVRTC. Both run on b->stream (the calling
 * thread's, dg_device_stream) and are timed by the same timer as ours.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "bench/bench.h"
#include "runtime/gpu/gpu_int.h"

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
void bk_relu_load(bench *b)
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
	if (!bk_cu_ok(b, bk_cu.cuModuleLoadData(&b->relu_mod, cubin), "cuModuleLoadData") ||
	    !bk_cu_ok(b, bk_cu.cuModuleGetFunction(&b->relu_fn, b->relu_mod, "relu_bf16"),
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
	return bk_lt_ok(b, cublasLtMatmul(b->lt, g->desc, &alpha, (const void *)g->w, g->la,
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
	return bk_cu_ok(b, bk_cu.cuLaunchKernel(b->relu_fn, grid, 1, 1, 256, 1, 1, 0, b->stream,
					  args, NULL),
		     "cuLaunchKernel (relu_bf16)");
}


/* Times the GEMM (and GEMM + ReLU when a->relu) for a's shape. */
void bk_anchor_run(bench *b, anchor *a)
{
	gemm g = { .m = a->m, .n = a->n, .k = a->k, .thr = 0.0f };
	cublasLtMatmulPreference_t pref = NULL;
	dg_timing s;
	uint64_t ws = LT_WORKSPACE;
	cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
	int found = 0;
	a->done = true;
	a->relu_us = -1;
	bool ok = bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g.m * g.k * 2), &g.x), "dg_malloc") &&
		  bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g.n * g.k * 2), &g.w), "dg_malloc") &&
		  bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g.m * g.n * 2), &g.y), "dg_malloc") &&
		  bk_fill_random(b, g.x, (size_t)(g.m * g.k * 2), DG_FMT_BF16) &&
		  bk_fill_random(b, g.w, (size_t)(g.n * g.k * 2), DG_FMT_BF16);
	ok = ok && bk_lt_ok(b, cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
			 "cublasLtMatmulDescCreate") &&
	     bk_lt_ok(b, cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
		   "cublasLtMatmulDescSetAttribute") &&
	     bk_lt_ok(b, cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
		   "cublasLtMatmulDescSetAttribute") &&
	     bk_lt_ok(b, cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, (uint64_t)g.k, (uint64_t)g.n, g.k),
		   "cublasLtMatrixLayoutCreate") &&
	     bk_lt_ok(b, cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, (uint64_t)g.k, (uint64_t)g.m, g.k),
		   "cublasLtMatrixLayoutCreate") &&
	     bk_lt_ok(b, cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, (uint64_t)g.n, (uint64_t)g.m, g.n),
		   "cublasLtMatrixLayoutCreate") &&
	     bk_lt_ok(b, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate") &&
	     bk_lt_ok(b, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
							   &ws, sizeof(ws)),
		   "cublasLtMatmulPreferenceSetAttribute") &&
	     bk_lt_ok(b, cublasLtMatmulAlgoGetHeuristic(b->lt, g.desc, g.la, g.lb, g.lc, g.lc, pref, 1,
						     &g.algo, &found),
		   "cublasLtMatmulAlgoGetHeuristic");
	if (ok && found < 1) {
		snprintf(b->err, sizeof(b->err), "cuBLASLt has no algorithm for bf16 %lldx%lldx%lld",
			 (long long)g.m, (long long)g.n, (long long)g.k);
		ok = false;
	}
	if (ok && (ok = bk_time_op(b, run_gemm, &g, false, b->reps, &s)))
		a->us = s.median_us;
	if (ok && a->relu && b->relu_fn && (ok = bk_time_op(b, run_gemm_relu, &g, false, b->reps, &s)))
		a->relu_us = s.median_us;
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

