/*
 * The bench `kernels`: its setup (the driver table, the timer, cuBLASLt),
 * random inputs from dg_rng, the one timer, and the copy bandwidth its
 * floors divide by. See bench/bench.h.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "runtime/gpu/gpu_int.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* the exported name: cuda.h maps some to _v2 */

bk_cu_table bk_cu;

/* ---- small helpers ------------------------------------------------------ */

bool bk_cu_ok(bench *b, CUresult rc, const char *call)
{
	if (rc == CUDA_SUCCESS)
		return true;
	const char *name = "?";
	if (bk_cu.cuGetErrorName)
		bk_cu.cuGetErrorName(rc, &name);
	snprintf(b->err, sizeof(b->err), "%s: %s (%d)", call, name, (int)rc);
	return false;
}

bool bk_lt_ok(bench *b, cublasStatus_t st, const char *call)
{
	if (st == CUBLAS_STATUS_SUCCESS)
		return true;
	snprintf(b->err, sizeof(b->err), "%s: %s", call, cublasLtGetStatusName(st));
	return false;
}

bool bk_dg_ok(bench *b, dg_status st, const char *call)
{
	if (st == DG_OK)
		return true;
	snprintf(b->err, sizeof(b->err), "%s: %s: %s", call, dg_status_str(st),
		 dg_device_errmsg(b->dev));
	return false;
}

/* Fills bytes of device memory with values of format fmt from the bench's
 * dg_rng (int8 codes in -127..127, ternary codes -1, 0, +1, floats in
 * [-1, 1)): a 16 MiB host block is drawn once per call and uploaded again
 * and again (the values do not change the speed). */
bool bk_fill_random(bench *b, dg_dptr dst, size_t bytes, dg_fmt fmt)
{
	const dg_fmt_info *fi = dg_fmt_info_of(fmt);
	size_t n = bytes * 8 / (size_t)fi->bits;        /* values */
	size_t block_vals = FILL_BLOCK * 8 / (size_t)fi->bits / 32 * 32; /* whole words */
	if (block_vals > n)
		block_vals = n;
	size_t block = block_vals * (size_t)fi->bits / 8;
	uint8_t *h = malloc(block ? block : 1);
	if (!h) {
		snprintf(b->err, sizeof(b->err), "out of host memory (%zu bytes)", block);
		return false;
	}
	dg_rng_fill(&b->rng, fmt, h, block_vals);
	bool ok = true;
	for (size_t off = 0; ok && off < bytes; off += block) {
		size_t k = bytes - off < block ? bytes - off : block;
		ok = bk_dg_ok(b, dg_memcpy_htod(b->dev, dst + off, h, k), "dg_memcpy_htod");
	}
	free(h);
	return ok;
}

bool bk_put_float(bench *b, dg_dptr dst, float v)
{
	return bk_dg_ok(b, dg_memcpy_htod(b->dev, dst, &v, sizeof(v)), "dg_memcpy_htod");
}

/* ---- timing --------------------------------------------------------------- */

typedef struct timed_call {
	bench *b;
	run_fn fn;
	void *arg;
} timed_call;

static dg_status timed_trampoline(void *user)
{
	timed_call *t = user;
	return t->fn(t->b, t->arg) ? DG_OK : DG_ERR_CUDA;
}

/* Times fn with the one timer: --warmup calls, reps reps, the L2 flushed
 * before each unless warm_l2. */
bool bk_time_op(bench *b, run_fn fn, void *arg, bool warm_l2, int reps, dg_timing *out)
{
	timed_call t = { b, fn, arg };
	dg_timer_opts o = { .warmup = b->warmup > 0 ? b->warmup : -1, .reps = reps,
			    .warm_l2 = warm_l2 };
	b->err[0] = '\0';
	dg_status st = dg_timer_run(b->timer, &o, timed_trampoline, &t, out);
	if (st && !b->err[0]) /* the timer's own failure, or an op's (its message on the device) */
		bk_dg_ok(b, st, "dg_timer_run");
	return st == DG_OK;
}

/* ---- copy bandwidth -------------------------------------------------------- */
typedef struct copy_arg {
	dg_dptr src, dst;
} copy_arg;

static bool run_copy(bench *b, void *arg)
{
	copy_arg *c = arg;
	return bk_dg_ok(b, dg_memcpy_dtod(b->dev, c->dst, c->src, COPY_BYTES), "dg_memcpy_dtod");
}

/* Bytes read + written per second; 0 on failure. */
double bk_copy_bandwidth(bench *b)
{
	copy_arg c = { 0, 0 };
	dg_timing s;
	bool ok = bk_dg_ok(b, dg_malloc(b->dev, COPY_BYTES, &c.src), "dg_malloc") &&
		  bk_dg_ok(b, dg_malloc(b->dev, COPY_BYTES, &c.dst), "dg_malloc") &&
		  bk_dg_ok(b, dg_memset8(b->dev, c.src, 1, COPY_BYTES), "dg_memset8") &&
		  bk_time_op(b, run_copy, &c, true, b->ncopy, &s);
	dg_free(b->dev, c.src);
	dg_free(b->dev, c.dst);
	return ok ? 2.0 * (double)COPY_BYTES / (s.median_us * 1e-6) : 0;
}

/* ---- setup ------------------------------------------------------------------ */
bool bk_args(bench *b, int argc, char **argv, bk_opt_fn own, void *user, int (*usage)(FILE *f, int code),
	     int *rc)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int took = 0;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			*rc = usage(stdout, 0);
			return false;
		}
		if (!strcmp(a, "--require-gpu"))
			b->require = true, took = 1;
		else if (v && !strcmp(a, "--reps"))
			b->reps = atoi(v), took = 2;
		else if (v && !strcmp(a, "--warmup"))
			b->warmup = atoi(v), took = 2;
		else
			took = own(user, a, v);
		if (!took) {
			*rc = usage(stderr, 2);
			return false;
		}
		i += took - 1;
	}
	if (b->reps < 1 || b->reps > 10000 || b->warmup < 0 || b->warmup > 1000) {
		*rc = usage(stderr, 2);
		return false;
	}
	return true;
}

bool bk_open(bench *b, const char *prog, int *rc)
{
	dg_device_opts opts = { .ordinal = 0, .jit = NULL };
	dg_status st = dg_device_open(&b->dev, &opts);
	if (st == DG_ERR_NO_DEVICE) {
		printf("skipped: no CUDA device (%s)\n", b->dev ? dg_device_errmsg(b->dev) : "");
		if (b->require)
			fprintf(stderr, "%s: --require-gpu: no CUDA device\n", prog);
		*rc = b->require ? 1 : 0;
	} else if (st == DG_OK && (st = dg_device_info_get(b->dev, &b->info)) == DG_OK) {
		return true;
	} else {
		fprintf(stderr, "%s: opening the device: %s: %s\n", prog, dg_status_str(st),
			b->dev ? dg_device_errmsg(b->dev) : "");
		*rc = 1;
	}
	dg_device_close(b->dev);
	b->dev = NULL;
	return false;
}

bool bk_init(bench *b)
{
	static const struct {
		const char *name;
		void **slot;
	} syms[] = {
#define BENCH_CU_SYM(f) { STR(f), (void **)&bk_cu.f },
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
	b->stream = (CUstream)dg_device_stream(b->dev);
	b->ncopy = b->reps < 10 ? 10 : b->reps;
	dg_rng_seed(&b->rng, SEED);
	/* cuBLASLt before the module load: the CUDA runtime it starts binds
	 * this thread to the device's primary context (dg_device_open's) */
	if (!bk_dg_ok(b, dg_timer_create(b->dev, b->ncopy, &b->timer), "dg_timer_create") ||
	    !bk_dg_ok(b, dg_malloc(b->dev, LT_WORKSPACE, &b->lt_ws), "dg_malloc") ||
	    !bk_lt_ok(b, cublasLtCreate(&b->lt), "cublasLtCreate"))
		return false;
	return true;
}

void bk_fini(bench *b)
{
	if (b->relu_mod)
		bk_cu.cuModuleUnload(b->relu_mod);
	if (b->lt)
		cublasLtDestroy(b->lt);
	dg_timer_destroy(b->timer);
	if (b->dev)
		dg_free(b->dev, b->lt_ws);
	dg_device_close(b->dev);
}

