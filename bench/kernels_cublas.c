/*
 * The cuBLASLt anchors: a bf16 GEMM, batched, of any of the row-major
 * shapes our ops compute (bk_gemm: the attention bench's floor), and the
 * bench `kernels`' anchor, that GEMM on our projection's shapes, followed
 * for the projection by a separate relu(y − thr) kernel compiled here with
 * NVRTC. All run on b->stream (the calling thread's, dg_device_stream) and
 * are timed by the same timer as ours.
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

/* ---- a cuBLASLt bf16 GEMM, batched --------------------------------------------
 * Row-major C (M,N) = op(A)·op(B) (see bench.h bk_gemm). In cuBLASLt's
 * column-major terms a row-major (r, c) matrix is its transpose (c × r):
 * Cᵀ (N×M) = op(B)ᵀ · op(A)ᵀ, so B is cuBLASLt's first operand (N×K: a
 * stored (K,N) as it is, a stored (N,K) transposed) and A its second (K×M:
 * a stored (M,K) as it is, a stored (K,M) transposed). */
static bool layout(bench *b, cublasLtMatrixLayout_t *l, int64_t rows, int64_t cols, int64_t batch)
{
	int32_t n = (int32_t)batch;
	int64_t stride = rows * cols;
	return bk_lt_ok(b, cublasLtMatrixLayoutCreate(l, CUDA_R_16BF, (uint64_t)rows, (uint64_t)cols, rows),
			"cublasLtMatrixLayoutCreate") &&
	       (batch == 1 ||
		(bk_lt_ok(b, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)),
			  "cublasLtMatrixLayoutSetAttribute") &&
		 bk_lt_ok(b, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
							      sizeof(stride)),
			  "cublasLtMatrixLayoutSetAttribute")));
}

bool bk_gemm_open(bench *b, bk_gemm *g)
{
	cublasLtMatmulPreference_t pref = NULL;
	uint64_t ws = LT_WORKSPACE;
	cublasOperation_t ta = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
	int found = 0;
	int64_t batch = g->batch > 0 ? g->batch : 1;
	g->desc = NULL;
	g->la = g->lb = g->lc = NULL;
	bool ok = bk_lt_ok(b, cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
			   "cublasLtMatmulDescCreate") &&
		  bk_lt_ok(b, cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
			   "cublasLtMatmulDescSetAttribute") &&
		  bk_lt_ok(b, cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
			   "cublasLtMatmulDescSetAttribute") &&
		  (g->tb ? layout(b, &g->la, g->k, g->n, batch) : layout(b, &g->la, g->n, g->k, batch)) &&
		  (g->ta ? layout(b, &g->lb, g->m, g->k, batch) : layout(b, &g->lb, g->k, g->m, batch)) &&
		  layout(b, &g->lc, g->n, g->m, batch) &&
		  bk_lt_ok(b, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate") &&
		  bk_lt_ok(b, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
								   sizeof(ws)),
			   "cublasLtMatmulPreferenceSetAttribute") &&
		  bk_lt_ok(b, cublasLtMatmulAlgoGetHeuristic(b->lt, g->desc, g->la, g->lb, g->lc, g->lc, pref, 1,
							     &g->algo, &found),
			   "cublasLtMatmulAlgoGetHeuristic");
	if (ok && found < 1) {
		snprintf(b->err, sizeof(b->err), "cuBLASLt has no algorithm for bf16 %lld x (%lldx%lldx%lld)",
			 (long long)batch, (long long)g->m, (long long)g->n, (long long)g->k);
		ok = false;
	}
	cublasLtMatmulPreferenceDestroy(pref);
	if (!ok)
		bk_gemm_close(g);
	return ok;
}

bool bk_gemm_run(bench *b, void *arg)
{
	bk_gemm *g = arg;
	const float alpha = 1.0f, beta = 0.0f;
	return bk_lt_ok(b, cublasLtMatmul(b->lt, g->desc, &alpha, (const void *)g->b, g->la, (const void *)g->a,
					  g->lb, &beta, (const void *)g->c, g->lc, (void *)g->c, g->lc, &g->algo.algo,
					  (void *)b->lt_ws, LT_WORKSPACE, b->stream),
			"cublasLtMatmul");
}

void bk_gemm_close(bk_gemm *g)
{
	cublasLtMatrixLayoutDestroy(g->la);
	cublasLtMatrixLayoutDestroy(g->lb);
	cublasLtMatrixLayoutDestroy(g->lc);
	cublasLtMatmulDescDestroy(g->desc);
	g->la = g->lb = g->lc = NULL;
	g->desc = NULL;
}

/* ---- the anchor: Y (M,N) = X (M,K) · Wᵀ, W (N,K) as our weights are
 * stored, then (for the projection) relu(Y − thr) ------------------------------ */
typedef struct relu_gemm {
	bk_gemm g; /* a = x, b = w (tb), c = y */
	float thr;
} relu_gemm;

static bool run_gemm_relu(bench *b, void *arg)
{
	relu_gemm *r = arg;
	if (!bk_gemm_run(b, &r->g))
		return false;
	unsigned long long n8 = (unsigned long long)(r->g.m * r->g.n / 8);
	unsigned grid = (unsigned)((n8 + 255) / 256);
	void *args[] = { &r->g.c, &r->g.c, &n8, &r->thr };
	return bk_cu_ok(b, bk_cu.cuLaunchKernel(b->relu_fn, grid, 1, 1, 256, 1, 1, 0, b->stream,
					  args, NULL),
		     "cuLaunchKernel (relu_bf16)");
}

/* Times the GEMM (and GEMM + ReLU when a->relu) for a's shape. */
void bk_anchor_run(bench *b, anchor *a)
{
	relu_gemm r = { .g = { .m = a->m, .n = a->n, .k = a->k, .batch = 1, .tb = true }, .thr = 0.0f };
	bk_gemm *g = &r.g;
	dg_timing s;
	a->done = true;
	a->relu_us = -1;
	bool ok = bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g->m * g->k * 2), &g->a), "dg_malloc") &&
		  bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g->n * g->k * 2), &g->b), "dg_malloc") &&
		  bk_dg_ok(b, dg_malloc(b->dev, (size_t)(g->m * g->n * 2), &g->c), "dg_malloc") &&
		  bk_fill_random(b, g->a, (size_t)(g->m * g->k * 2), DG_FMT_BF16) &&
		  bk_fill_random(b, g->b, (size_t)(g->n * g->k * 2), DG_FMT_BF16) && bk_gemm_open(b, g);
	if (ok && (ok = bk_time_op(b, bk_gemm_run, g, false, b->reps, &s)))
		a->us = s.median_us;
	if (ok && a->relu && b->relu_fn && (ok = bk_time_op(b, run_gemm_relu, &r, false, b->reps, &s)))
		a->relu_us = s.median_us;
	if (!ok) {
		a->failed = true;
		snprintf(a->err, sizeof(a->err), "%s", b->err);
	} else if (a->relu && !b->relu_fn) {
		snprintf(a->err, sizeof(a->err), "no ReLU kernel: %s", b->relu_err);
	}
	bk_gemm_close(g);
	dg_free(b->dev, g->a);
	dg_free(b->dev, g->b);
	dg_free(b->dev, g->c);
}
