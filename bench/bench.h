/*
 * The benches `kernels` (bench/kernels.c) and `attention`
 * (bench/attention.c): their handle, the device and the timing they share
 * with the cuBLASLt anchors (bench/kernels_cublas.c) and the setup
 * (bench/kernels_run.c). Names start with bk_.
 */
#ifndef DG_BENCH_BENCH_H
#define DG_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda.h>
/* cublasLt.h declares cublasLtLoggerForceDisable() without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "dragon/dragon.h"
#include "runtime/gpu/gpu_int.h"

enum { BDH_H = 4, BDH_L = 8192, BDH_E = 256 };
#define LT_WORKSPACE (32u << 20)
#define COPY_BYTES ((size_t)1 << 30)
#define FILL_BLOCK ((size_t)16 << 20)
#define SEED 42 /* dg_rng's seed of every input */

/* Driver entry points beyond libdragon, typed by cuda.h's own prototypes,
 * looked up in the libcuda.so.1 dg_device_open loaded (bk_init). */
#define BENCH_CU_FUNCS(X)                                                     \
	X(cuGetErrorName) X(cuModuleLoadData) X(cuModuleUnload)               \
	X(cuModuleGetFunction) X(cuLaunchKernel)

typedef struct bk_cu_table {
#define BENCH_CU_FIELD(f) __typeof__(&f) f;
	BENCH_CU_FUNCS(BENCH_CU_FIELD)
#undef BENCH_CU_FIELD
} bk_cu_table;

extern bk_cu_table bk_cu;

typedef struct bench {
	dg_device *dev;
	dg_device_info info;
	CUstream stream;    /* the calling thread's: dg_device_stream */
	int reps, warmup;
	bool require;       /* --require-gpu: no device is a failure */
	int ncopy;          /* max(reps, 10): the copy is timed 10 times at least */
	dg_timer *timer;    /* of ncopy reps */
	dg_rng rng;
	cublasLtHandle_t lt;
	dg_dptr lt_ws; /* LT_WORKSPACE bytes */
	CUmodule relu_mod;
	CUfunction relu_fn;
	char relu_err[512]; /* why there is no ReLU kernel, if there is none */
	char err[1024];     /* the last failure */
} bench;


/* Enqueues one call on b->stream; false with b->err on failure. */
typedef bool (*run_fn)(bench *b, void *arg);

/* One cuBLASLt anchor shape (gemm_m × N × K), measured once. */
typedef struct anchor {
	int64_t m, n, k;
	bool relu;
	bool done, failed;
	double us, relu_us; /* medians; relu_us < 0: none */
	char err[1024];
} anchor;

/* A bf16 GEMM through cuBLASLt (bf16 in and out, f32 compute, the
 * heuristic's first algo, LT_WORKSPACE of workspace), in row-major terms:
 * for each of batch matrices, C (M,N) = op(A)·op(B), A stored (M,K) or,
 * ta, (K,M); B stored (K,N) or, tb, (N,K); the batch's matrices back to
 * back (strides M·K, K·N, M·N). */
typedef struct bk_gemm {
	int64_t m, n, k, batch; /* batch 0 is 1 */
	bool ta, tb;
	dg_dptr a, b, c;
	/* bk_gemm_open's */
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulHeuristicResult_t algo;
} bk_gemm;

/* Each false/0 on failure with b->err set. */
bool bk_cu_ok(bench *b, CUresult rc, const char *call);
bool bk_lt_ok(bench *b, cublasStatus_t st, const char *call);
bool bk_dg_ok(bench *b, dg_status st, const char *call);
/* bytes of device memory with random values of fmt from b->rng. */
bool bk_fill_random(bench *b, dg_dptr dst, size_t bytes, dg_fmt fmt);
bool bk_put_float(bench *b, dg_dptr dst, float v);
/* fn timed by b->timer: --warmup calls, reps reps, the L2 flushed before
 * each unless warm_l2. */
bool bk_time_op(bench *b, run_fn fn, void *arg, bool warm_l2, int reps, dg_timing *out);
/* Device copy bandwidth, bytes read + written a second; 0 on failure. */
double bk_copy_bandwidth(bench *b);

/* A bench's own option a, with the next entry v (NULL at the end): the
 * count of entries it takes (1 or 2), 0 when a is not one of its own. */
typedef int (*bk_opt_fn)(void *user, const char *a, const char *v);
/* Reads argv: --reps N (1..10000), --warmup N (0..1000) and
 * --require-gpu into b, --help, and own's options. false when main is
 * to return *rc: 0 after --help (usage on stdout), 2 for a bad option or
 * value (usage on stderr). */
bool bk_args(bench *b, int argc, char **argv, bk_opt_fn own, void *user, int (*usage)(FILE *f, int code),
	     int *rc);
/* Opens device 0 into b->dev and b->info. false: no device ("skipped: no
 * CUDA device" on stdout; *rc 0, or 1 under --require-gpu) or a failure
 * to open it (on stderr, *rc 1); prog names the bench in the messages. */
bool bk_open(bench *b, const char *prog, int *rc);
/* The driver table, the timer and cuBLASLt of b->dev (open); then
 * bk_relu_load the ReLU anchor's kernel; bk_fini releases them and closes the device. */
bool bk_init(bench *b);
void bk_fini(bench *b);

/* Compiles and loads the anchor's relu_bf16 (b->relu_fn), or says why not
 * in b->relu_err. */
void bk_relu_load(bench *b);
/* The descriptors and the algorithm of g (bk_gemm_close releases them;
 * on failure nothing is held); bk_gemm_run, a run_fn, enqueues g. */
bool bk_gemm_open(bench *b, bk_gemm *g);
bool bk_gemm_run(bench *b, void *g);
void bk_gemm_close(bk_gemm *g);
/* Times cuBLASLt bf16 at a's shape (and + ReLU when a->relu). */
void bk_anchor_run(bench *b, anchor *a);

#endif
