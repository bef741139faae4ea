/*
 * The runtime on a GPU, through the public API alone: memory round trips,
 * arenas, the per-thread stream, the kernel map (one build however many
 * threads ask; dg_device_stats_get says where each kernel came from),
 * launch-info opt-in above 48 KiB, launch checks, and quantize_act /
 * pack_i8x4 / unpack_i8x4 against the CPU references, quantize_act's
 * workspace checked. Skips without a device (DRAGON_REQUIRE_GPU=1: fails).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "dragon/ref.h"
#include "gpu_helpers.h"
#include "helpers.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/ref/ref_ops.h"

/* Kernels the device holds (distinct spec + entry: dg_device_stats). */
static size_t kernels_loaded(dg_device *dev)
{
	dg_device_stats s = { 0 };
	return dg_device_stats_get(dev, &s) == DG_OK ? s.kernels : 0;
}


static bool own_cache(void)
{
	const char *e = getenv("DRAGON_CACHE_DIR");
	return !(e && *e);
}

static dg_device_stats stats_of(dg_device *dev)
{
	dg_device_stats st;
	cr_assert_eq(dg_device_stats_get(dev, &st), DG_OK, "%s", dg_device_errmsg(dev));
	return st;
}

/* Specs built since open: compiled by NVRTC or read from the disk cache
 * (which of the two depends on whether DRAGON_CACHE_DIR is shared). */
static size_t built(dg_device *dev)
{
	dg_device_stats st = stats_of(dev);
	return st.compiled + st.cached;
}

/* dg_quantize_act with the workspace ws (gh_expect_bad_workspaces'). */
static dg_status quantize_act_ws(dg_device *dev, const dg_spec *s, void *args, dg_workspace ws)
{
	dg_quantize_act_args *a = args;
	a->ws = ws;
	return dg_quantize_act(dev, s, a);
}

Test(gpu_runtime, device_info)
{
	dg_device *dev = gh_open();
	dg_device_info in;
	cr_assert_eq(dg_device_info_get(dev, &in), DG_OK, "%s", dg_device_errmsg(dev));
	fprintf(stderr, "device: %s sm_%d, %d SMs, driver %d, %zu bytes, smem opt-in %d, L2 %d\n",
		in.name, in.sm, in.sm_count, in.driver_version, in.total_mem, in.smem_optin,
		in.l2_bytes);
	cr_assert_gt(strlen(in.name), 0);
	cr_assert_geq(in.sm, 50);
	cr_assert_gt(in.sm_count, 0);
	cr_assert_geq(in.driver_version, 12000);
	cr_assert_gt(in.total_mem, (size_t)1 << 30);
	cr_assert_geq(in.smem_optin, 49152);
	cr_assert_gt(in.l2_bytes, 0);
	cr_assert_not_null(dg_device_stream(dev));
	cr_assert_not_null(dg_device_jit(dev));
	int n = 0;
	char why[128];
	cr_assert_eq(dg_device_count(&n, why, sizeof(why)), DG_OK);
	cr_assert_geq(n, 1, "%s", why);
	gh_close(dev);
}

Test(gpu_runtime, memory_round_trips)
{
	dg_device *dev = gh_open();
	const size_t n = (1 << 20) + 3;
	unsigned char *h = malloc(n), *back = malloc(n);
	cr_assert(h && back);
	gh_seed(1);
	for (size_t i = 0; i < n; i++)
		h[i] = (unsigned char)gh_u64();

	dg_dptr a = gh_upload(dev, h, n);
	cr_assert_eq(a % 256, 0, "allocations are 256-byte aligned");
	gh_download(dev, back, a, n);
	gh_expect_bytes("htod/dtoh", back, h, n);

	dg_dptr b = gh_alloc(dev, n);
	cr_assert_eq(dg_memcpy_dtod(dev, b, a, n), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_memset8(dev, b + 100, 0xA5, 1000), DG_OK, "%s", dg_device_errmsg(dev));
	memset(h + 100, 0xA5, 1000);
	gh_download(dev, back, b, n);
	gh_expect_bytes("dtod + memset8", back, h, n);

	cr_assert_eq(dg_free(dev, 0), DG_OK);
	dg_dptr z = 1;
	cr_assert_eq(dg_malloc(dev, 0, &z), DG_ERR_INVALID_ARG);
	cr_assert_eq(z, 0);
	cr_assert(strstr(dg_device_errmsg(dev), "0 bytes"), "%s", dg_device_errmsg(dev));

	/* Far more than any GPU has: a clear failure, not a crash. */
	dg_dptr huge = 1;
	dg_status st = dg_malloc(dev, (size_t)1 << 50, &huge);
	cr_assert(st == DG_ERR_NOMEM || st == DG_ERR_CUDA, "%s", dg_status_str(st));
	cr_assert_eq(huge, 0);
	cr_assert(strstr(dg_device_errmsg(dev), "cuMemAlloc"), "%s", dg_device_errmsg(dev));

	cr_assert_eq(dg_memcpy_htod(dev, 0, h, 16), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "dg_memcpy_htod: dst is NULL"), "%s",
		  dg_device_errmsg(dev));
	free(h);
	free(back);
	gh_close(dev);
}

/* dg_device_stats' allocated and peak_allocated follow dg_malloc and
 * dg_free, and dg__dev_mem_mark resets the peak to what is held. */
Test(gpu_runtime, stats_count_the_bytes_held)
{
	dg_device *dev = gh_open();
	const size_t mb = (size_t)1 << 20;
	const size_t held0 = dg__dev_mem_mark(dev);
	dg_device_stats s0 = stats_of(dev);
	cr_assert_eq(s0.allocated, held0);
	cr_assert_eq(s0.peak_allocated, held0, "the mark resets the peak to what is held");
	/* dg_malloc itself: gh_close frees what gh_alloc made */
	dg_dptr a = 0, b = 0, c = 0;
	cr_assert_eq(dg_malloc(dev, 3 * mb, &a), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_malloc(dev, 5 * mb + 7, &b), DG_OK, "%s", dg_device_errmsg(dev));
	dg_device_stats s1 = stats_of(dev);
	cr_assert_eq(s1.allocated, held0 + 8 * mb + 7, "%zu held, %zu before", s1.allocated, held0);
	cr_assert_eq(s1.peak_allocated, s1.allocated);
	cr_assert_eq(dg_free(dev, b), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_malloc(dev, mb, &c), DG_OK, "%s", dg_device_errmsg(dev));
	dg_device_stats s2 = stats_of(dev);
	cr_assert_eq(s2.allocated, held0 + 4 * mb, "a free gives its bytes back");
	cr_assert_eq(s2.peak_allocated, held0 + 8 * mb + 7, "the peak stays");
	cr_assert_eq(dg__dev_mem_high(dev), s2.peak_allocated);
	cr_assert_eq(dg__dev_mem_mark(dev), held0 + 4 * mb);
	cr_assert_eq(stats_of(dev).peak_allocated, held0 + 4 * mb);
	cr_assert_eq(dg_free(dev, a), DG_OK);
	cr_assert_eq(dg_free(dev, c), DG_OK);
	cr_assert_eq(stats_of(dev).allocated, held0);
	gh_close(dev);
}

Test(gpu_runtime, arena)
{
	dg_device *dev = gh_open();
	dg_arena *ar = NULL;
	cr_assert_eq(dg_arena_create(dev, 8192, &ar), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_arena_capacity(ar), 8192);
	dg_dptr p1, p2, p3, p4;
	cr_assert_eq(dg_arena_alloc(ar, 100, 0, &p1), DG_OK);
	cr_assert_eq(p1 % 256, 0);
	cr_assert_eq(dg_arena_alloc(ar, 1, 16, &p2), DG_OK);
	cr_assert_eq(p2 % 16, 0);
	cr_assert_geq(p2, p1 + 100);
	cr_assert_eq(dg_arena_alloc(ar, 64, 1024, &p3), DG_OK);
	cr_assert_eq(p3 % 1024, 0);
	cr_assert_gt(p3, p2);
	cr_assert_eq(dg_arena_used(ar), (size_t)(p3 + 64 - p1));

	/* The memory is real: write and read a block. */
	unsigned char buf[64], back[64];
	for (int i = 0; i < 64; i++)
		buf[i] = (unsigned char)(i * 7);
	cr_assert_eq(dg_memcpy_htod(dev, p3, buf, 64), DG_OK);
	gh_download(dev, back, p3, 64);
	gh_expect_bytes("arena block", back, buf, 64);

	cr_assert_eq(dg_arena_alloc(ar, 16, 8, &p4), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "align=8"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_arena_alloc(ar, 3, 48, &p4), DG_ERR_INVALID_ARG, "48 is no power of two");

	size_t used = dg_arena_used(ar);
	cr_assert_eq(dg_arena_alloc(ar, 8192, 0, &p4), DG_ERR_NOMEM);
	cr_assert_eq(p4, 0);
	cr_assert(strstr(dg_device_errmsg(dev), "arena full: 8192 bytes"), "%s",
		  dg_device_errmsg(dev));
	cr_assert_eq(dg_arena_used(ar), used, "a failed alloc takes nothing");

	dg_arena_reset(ar);
	cr_assert_eq(dg_arena_used(ar), 0);
	cr_assert_eq(dg_arena_alloc(ar, 8192, 0, &p4), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(p4, p1, "reset hands out the same addresses");
	dg_arena_destroy(ar);
	gh_close(dev);
}

static dg_spec pack_spec(int embd, int latent)
{
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	s.embd = embd;
	s.latent = latent;
	return s;
}

Test(gpu_runtime, kernel_get_twice_loads_once)
{
	dg_device *dev = gh_open();
	dg_spec s = pack_spec(64, 32);
	dg_kernel *k1 = NULL, *k2 = NULL, *k3 = NULL;
	cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k1), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_kernel_get(dev, &s, "dg_pack_i8x4", &k2), DG_OK, "%s",
		     dg_device_errmsg(dev));
	/* The default tile written out names the same kernel. */
	dg_spec t = s;
	t.tile.threads = 256;
	cr_assert_eq(dg_kernel_get(dev, &t, NULL, &k3), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(k1, k2);
	cr_assert_eq(k1, k3);
	cr_assert_eq(built(dev), 1);
	cr_assert_eq(kernels_loaded(dev), 1);
	dg_device_stats st = stats_of(dev);
	cr_assert_eq(st.modules, 1);
	cr_assert_eq(st.kernels, 1);
	cr_assert_eq(st.bundled, 0);
	cr_assert_eq(st.planned, 1, "planned once: the entry and the written-out default are hits");
	cr_assert_eq(dg_kernel_entry_count(k1), 1);
	cr_assert_eq(dg_kernel_entry(k1, 0), k1);
	cr_assert_null(dg_kernel_entry(k1, 1));
	cr_assert_eq(dg_kernel_entry_named(k1, "dg_pack_i8x4"), k1);
	cr_assert_null(dg_kernel_entry_named(k1, "dg_pack_i8x4_rows"), "no entry of that name");
	cr_assert_null(dg_kernel_entry_named(k1, NULL));
	cr_assert_eq(dg_kernel_spec(k1)->tile.threads, 256, "the resolved tile");

	dg_kernel_info in;
	cr_assert_eq(dg_kernel_info_get(k1, &in), DG_OK);
	cr_assert_str_eq(in.entry, "dg_pack_i8x4");
	cr_assert(strstr(in.canonical, "op=pack_i8x4;"), "%s", in.canonical);
	cr_assert(strstr(in.canonical, "tile=t256;"), "tile resolved: %s", in.canonical);
	cr_assert_gt(in.regs, 0);
	cr_assert_geq(in.max_threads, 256);
	cr_assert_gt(in.static_smem, 0, "pack stages a tile in shared memory");
	cr_assert_gt(in.load_ms, 0.0);
	if (own_cache())
		cr_assert_not(in.cache_hit, "a fresh cache cannot hit");

	dg_kernel *none = (dg_kernel *)0x1;
	cr_assert_eq(dg_kernel_get(dev, &s, "dg_nope", &none), DG_ERR_NOT_FOUND);
	cr_assert_null(none);
	cr_assert(strstr(dg_device_errmsg(dev), "no entry 'dg_nope' (entries: dg_pack_i8x4)"),
		  "%s", dg_device_errmsg(dev));

	dg_spec bad = s;
	bad.embd = 6;
	cr_assert_eq(dg_kernel_get(dev, &bad, NULL, &none), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(dg_device_errmsg(dev), "embd=6"), "%s", dg_device_errmsg(dev));

	dg_device_info di;
	dg_device_info_get(dev, &di);
	dg_spec future = s;
	future.arch = di.sm + 10;
	cr_assert_eq(dg_kernel_get(dev, &future, NULL, &none), DG_ERR_UNSUPPORTED);
	cr_assert(strstr(dg_device_errmsg(dev), "does not run on"), "%s", dg_device_errmsg(dev));
	cr_assert_eq(built(dev), 1);
	gh_close(dev);
}

typedef struct getter {
	dg_device *dev;
	const dg_spec *spec;
	pthread_barrier_t *go;
	dg_kernel *k;
	dg_status st;
	char msg[512];
} getter;

static void *get_one(void *arg)
{
	getter *g = arg;
	pthread_barrier_wait(g->go);
	g->st = dg_kernel_get(g->dev, g->spec, "dg_quantize_act_apply", &g->k);
	if (g->st)
		snprintf(g->msg, sizeof(g->msg), "%s", dg_device_errmsg(g->dev));
	return NULL;
}

/* n threads ask for spec at once; returns the status all of them got. */
static void get_in_threads(dg_device *dev, const dg_spec *spec, getter *g, int n)
{
	pthread_t th[16];
	pthread_barrier_t go;
	cr_assert_leq(n, 16);
	pthread_barrier_init(&go, NULL, (unsigned)n);
	for (int i = 0; i < n; i++) {
		g[i] = (getter){ .dev = dev, .spec = spec, .go = &go };
		cr_assert_eq(pthread_create(&th[i], NULL, get_one, &g[i]), 0);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&go);
}

Test(gpu_runtime, eight_threads_compile_once)
{
	dg_device *dev = gh_open();
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.src = DG_FMT_BF16;
	s.act = DG_FMT_INT4;
	getter g[8];
	get_in_threads(dev, &s, g, 8);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(g[i].st, DG_OK, "thread %d: %s", i, g[i].msg);
		cr_assert_eq(g[i].k, g[0].k, "thread %d got another kernel", i);
	}
	cr_assert_eq(built(dev), 1, "one build for eight threads");
	cr_assert_eq(kernels_loaded(dev), 3, "absum, scale, apply");
	dg_kernel_info in;
	dg_kernel_info_get(g[0].k, &in);
	cr_assert_str_eq(in.entry, "dg_quantize_act_apply");
	if (own_cache())
		cr_assert_not(in.cache_hit);
	gh_close(dev);
}

/* Where kernels came from: a fresh cache compiles, a second device on the
 * same cache reads it, a device without a cache compiles again. */
Test(gpu_runtime, stats_say_where_kernels_came_from)
{
	dg_device *main_dev = gh_open(); /* skips without a GPU */
	char *cache = dg_test_tmpdir();
	dg_spec s = pack_spec(64, 32);
	dg_kernel *k = NULL;
	for (int round = 0; round < 3; round++) {
		dg_ctx_opts jit = { .cache_dir = cache, .no_cache = round == 2 };
		dg_device_opts o = { .ordinal = 0, .jit = &jit };
		dg_device *dev = NULL;
		cr_assert_eq(dg_device_open(&dev, &o), DG_OK, "%s", dg_device_errmsg(dev));
		dg_device_stats st = stats_of(dev);
		cr_assert_eq(st.kernels + st.modules + st.compiled + st.cached + st.bundled + st.planned, 0,
			     "a new device has loaded nothing");
		cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_OK, "%s", dg_device_errmsg(dev));
		dg_kernel_info in;
		cr_assert_eq(dg_kernel_info_get(k, &in), DG_OK);
		st = stats_of(dev);
		cr_assert_eq(st.modules, 1);
		cr_assert_eq(st.kernels, 1);
		cr_assert_eq(st.planned, 1);
		cr_assert_eq(st.bundled, 0);
		cr_assert_eq(st.compiled, round == 1 ? 0 : 1, "round %d", round);
		cr_assert_eq(st.cached, round == 1 ? 1 : 0, "round %d", round);
		cr_assert_eq(in.origin, round == 1 ? DG_KERNEL_CACHED : DG_KERNEL_COMPILED);
		cr_assert_eq(in.cache_hit, round == 1);
		dg_device_close(dev);
	}
	gh_close(main_dev);
	dg_test_rmtree(cache);
}

typedef struct streamer {
	dg_device *dev;
	void *set;  /* what this thread sets (NULL: nothing) */
	void *seen; /* what dg_device_stream then says on this thread */
	pthread_barrier_t *go;
} streamer;

static void *stream_thread(void *arg)
{
	streamer *t = arg;
	if (t->set && dg_device_set_stream(t->dev, t->set) != DG_OK)
		t->seen = NULL;
	else
		t->seen = dg_device_stream(t->dev);
	pthread_barrier_wait(t->go); /* both have set theirs before either reads again */
	if (dg_device_stream(t->dev) != t->seen)
		t->seen = NULL;
	return NULL;
}

/* The stream is per thread: a thread that sets one sees it, another keeps
 * the device's own; NULL gives the own stream back. Nothing is launched on
 * the stand-in handle. */
Test(gpu_runtime, the_stream_is_per_thread)
{
	dg_device *dev = gh_open();
	void *own = dg_device_stream(dev);
	cr_assert_not_null(own);
	void *fake = (void *)(uintptr_t)0x1230; /* a stand-in handle, never used */
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, 2);
	streamer a = { .dev = dev, .set = fake, .go = &go }, b = { .dev = dev, .go = &go };
	pthread_t ta, tb;
	cr_assert_eq(pthread_create(&ta, NULL, stream_thread, &a), 0);
	cr_assert_eq(pthread_create(&tb, NULL, stream_thread, &b), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	pthread_barrier_destroy(&go);
	cr_assert_eq(a.seen, fake, "the setting thread sees its stream");
	cr_assert_eq(b.seen, own, "another thread keeps the device's own");
	cr_assert_eq(dg_device_stream(dev), own, "and so does this one");
	cr_assert_eq(dg_device_set_stream(dev, fake), DG_OK);
	cr_assert_eq(dg_device_stream(dev), fake);
	cr_assert_eq(dg_device_set_stream(dev, NULL), DG_OK);
	cr_assert_eq(dg_device_stream(dev), own, "NULL is the device's own stream again");
	gh_sync(dev);
	gh_close(dev);
}

/* A template folder for device-level tests of launch info and failures:
 * dragon.lua plans every spec as one kernel k_big of 128 threads and 64 KiB
 * of dynamic shared memory, and renders garbage for embd=8; the op modules
 * the op table names are empty tables (the host loads them at create). */
static const char *smem_tpl =
	"local SRC = [[\n"
	"extern \"C\" __global__ void k_big(int *p)\n"
	"{\n"
	"\textern __shared__ int s[];\n"
	"\tconst int n = 65536 / 4;\n"
	"\tfor (int i = threadIdx.x; i < n; i += blockDim.x)\n"
	"\t\ts[i] = i;\n"
	"\t__syncthreads();\n"
	"\tp[threadIdx.x] = s[n - 1 - threadIdx.x] + (int)blockDim.x;\n"
	"}\n"
	"]]\n"
	"local M = {}\n"
	"function M.plan(spec)\n"
	"  return { tile = { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 128 },\n"
	"           path = 'simt', arch_specific = false, name = 'k.cu',\n"
	"           entries = { { name = 'k_big', threads = 128, smem = 65536 } } }\n"
	"end\n"
	"function M.render(spec)\n"
	"  if spec.embd == 8 then\n"
	"    return '// ' .. spec.canonical .. '\\n' .. 'this is not CUDA;\\n'\n"
	"  end\n"
	"  return '// ' .. spec.canonical .. '\\n' .. SRC\n"
	"end\n"
	"return M\n";

/* A template folder of smem_tpl (malloc'd path; dg_test_rmtree it). */
static char *write_templates(void)
{
	char *tpl = dg_test_tmpdir();
	dg_test_write_file(tpl, "dragon.lua", smem_tpl);
	for (int i = 0; i < DG_OP__COUNT; i++) {
		char name[64];
		snprintf(name, sizeof(name), "%s.lua", dg_op_info_of((dg_op)i)->module);
		dg_test_write_file(tpl, name, "return {}\n");
	}
	return tpl;
}

static dg_device *open_with_templates(const char *tpl, const char *cache)
{
	dg_ctx_opts jit = { .cache_dir = cache, .template_dir = tpl };
	dg_device_opts o = { .ordinal = 0, .jit = &jit };
	dg_device *dev = NULL;
	dg_status st = dg_device_open(&dev, &o);
	cr_assert_eq(st, DG_OK, "open: %s", dg_device_errmsg(dev));
	return dev;
}

Test(gpu_runtime, launch_info_opts_in_to_64k_of_smem)
{
	dg_device *main_dev = gh_open(); /* skips without a GPU */
	char *tpl = write_templates(), *cache = dg_test_tmpdir();
	dg_device *dev = open_with_templates(tpl, cache);
	dg_device_info di;
	dg_device_info_get(dev, &di);
	if (di.smem_optin < 65536 + 1024) {
		fprintf(stderr, "skipped: %s opts in to only %d bytes\n", di.name, di.smem_optin);
	} else {
		dg_spec s = pack_spec(64, 32);
		dg_kernel *k = NULL;
		cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_OK, "%s", dg_device_errmsg(dev));
		dg_kernel_info in;
		dg_kernel_info_get(k, &in);
		cr_assert_eq(in.block_threads, 128);
		cr_assert_eq(in.dyn_smem, 65536);
		dg_dptr out = gh_alloc(main_dev, 128 * sizeof(int));
		/* block 0x0x0 and smem 0: the template's 128 threads, 64 KiB. */
		dg_launch l = { { 1, 1, 1 }, { 0, 0, 0 }, 0 };
		void *args[] = { &out };
		cr_assert_eq(dg_kernel_launch(dev, k, &l, args), DG_OK, "%s", dg_device_errmsg(dev));
		cr_assert_eq(dg_device_sync(dev), DG_OK, "%s", dg_device_errmsg(dev));
		int got[128], want[128];
		gh_download(dev, got, out, sizeof(got));
		for (int i = 0; i < 128; i++)
			want[i] = 16384 - 1 - i + 128;
		gh_expect_bytes("k_big output", got, want, sizeof(got));

		/* More than the device allows is refused before the driver. */
		dg_launch big = { { 1, 1, 1 }, { 128, 1, 1 }, (unsigned)di.smem_optin + 1 };
		cr_assert_eq(dg_kernel_launch(dev, k, &big, args), DG_ERR_INVALID_ARG);
		cr_assert(strstr(dg_device_errmsg(dev), "smem="), "%s", dg_device_errmsg(dev));
	}
	dg_device_close(dev);
	gh_close(main_dev);
	dg_test_rmtree(tpl);
	dg_test_rmtree(cache);
}

Test(gpu_runtime, a_failed_build_reaches_every_waiter_and_is_retried)
{
	dg_device *main_dev = gh_open();
	char *tpl = write_templates(), *cache = dg_test_tmpdir();
	dg_device *dev = open_with_templates(tpl, cache);
	dg_spec s = pack_spec(8, 32); /* embd 8: the template renders garbage */
	getter g[4];
	get_in_threads(dev, &s, g, 4);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(g[i].st, DG_ERR_COMPILE, "thread %d: %s", i, dg_status_str(g[i].st));
		cr_assert(strstr(g[i].msg, "this is not CUDA") || strstr(g[i].msg, "error"),
			  "thread %d: %s", i, g[i].msg);
	}
	cr_assert_eq(built(dev), 0);
	cr_assert_eq(kernels_loaded(dev), 0);
	/* Not remembered as broken: the next call builds (and fails) again. */
	dg_kernel *k = NULL;
	cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_ERR_COMPILE);
	cr_assert_null(k);
	/* Per-thread messages: the threads' failures left this one alone
	 * until it failed itself. */
	cr_assert_neq(strlen(dg_device_errmsg(dev)), 0);
	dg_device_close(dev);
	gh_close(main_dev);
	dg_test_rmtree(tpl);
	dg_test_rmtree(cache);
}

Test(gpu_runtime, launch_checks_name_the_dimension)
{
	dg_device *dev = gh_open();
	dg_spec s = pack_spec(64, 32);
	dg_kernel *k = NULL;
	cr_assert_eq(dg_kernel_get(dev, &s, NULL, &k), DG_OK, "%s", dg_device_errmsg(dev));
	dg_dptr a = gh_alloc(dev, 64 * 32), b = gh_alloc(dev, 64 * 32);
	long long rows = 1;
	void *args[] = { &a, &b, &rows };
	struct {
		dg_launch l;
		const char *want;
	} cases[] = {
		{ { { 1, 70000, 1 }, { 256, 1, 1 }, 0 }, "grid.y=70000 exceeds the device limit of 65535" },
		{ { { 1, 1, 70000 }, { 256, 1, 1 }, 0 }, "grid.z=70000" },
		{ { { 0, 1, 1 }, { 256, 1, 1 }, 0 }, "grid.x=0" },
		{ { { 1, 1, 1 }, { 2048, 1, 1 }, 0 }, "block.x=2048 exceeds the device limit of 1024" },
		{ { { 1, 1, 1 }, { 1, 1, 65 }, 0 }, "block.z=65" },
		{ { { 1, 1, 1 }, { 64, 0, 1 }, 0 }, "block.y=0" },
		{ { { 1, 1, 1 }, { 512, 4, 1 }, 0 }, "is 2048 threads" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_assert_eq(dg_kernel_launch(dev, k, &cases[i].l, args), DG_ERR_INVALID_ARG,
			     "case %zu launched", i);
		cr_assert(strstr(dg_device_errmsg(dev), cases[i].want), "case %zu: \"%s\" lacks \"%s\"",
			  i, dg_device_errmsg(dev), cases[i].want);
	}
	/* And a good launch still works after all that; block 0x0x0 is the
	 * plan's 256 threads. */
	dg_launch ok = { { 1, 1, 1 }, { 0, 0, 0 }, 0 };
	cr_assert_eq(dg_kernel_launch(dev, k, &ok, args), DG_OK, "%s", dg_device_errmsg(dev));
	gh_sync(dev);
	gh_close(dev);
}

/* ---- ops against the CPU references ---------------------------------------- */

static void quantize_case(dg_device *dev, dg_fmt src, dg_fmt act, size_t rows, size_t cols,
			  bool zeros)
{
	const size_t n = rows * cols;
	float *xf = gh_xmalloc(n * sizeof(float));
	uint16_t *xb = gh_xmalloc(n * sizeof(uint16_t));
	uint8_t *got = gh_xmalloc(n), *want = gh_xmalloc(n);
	for (size_t i = 0; i < n; i++) {
		float v = zeros ? 0.0f : gh_uniform(-2.0f, 2.0f);
		if (!zeros && i % 17 == 0)
			v *= 40.0f; /* outliers clamp */
		xf[i] = v;
		xb[i] = dg_f32_to_bf16(v);
	}
	const void *xh = src == DG_FMT_BF16 ? (const void *)xb : (const void *)xf;
	size_t xbytes = n * (src == DG_FMT_BF16 ? 2 : 4);

	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	s.src = src;
	s.act = act;
	dg_dptr xd = gh_upload(dev, xh, xbytes);
	dg_dptr cd = gh_alloc_ff(dev, n);
	dg_dptr sd = gh_scalar(dev, -1.0f);
	dg_tensor x = dg_tensor_2d("x", src, xd, (int64_t)rows, (int64_t)cols);
	dg_tensor c = dg_tensor_2d("codes", act, cd, (int64_t)rows, (int64_t)cols);
	c.scale = sd;
	dg_quantize_act_args a = { .x = &x, .codes = &c };
	size_t need = 0;
	cr_assert_eq(dg_quantize_act_workspace(dev, &s, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_gt(need, 0, "the |x| partials live in the workspace");
	a.ws = gh_workspace(dev, need);
	cr_assert_eq(dg_quantize_act(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	gh_sync(dev);
	float gs = gh_read_scalar(dev, sd);
	gh_download(dev, got, cd, n);

	float rs = -1.0f;
	cr_assert_eq(dg_ref_quantize_act(src, act, xh, n, want, &rs), DG_OK);
	char what[96];
	snprintf(what, sizeof(what), "scale %s→%s n=%zu", dg_fmt_name(src), dg_fmt_name(act), n);
	gh_expect_close(what, &gs, &rs, 1, 0.0f, 1e-5f);
	/* Codes exactly, from the scale the GPU computed. */
	cr_assert_eq(dg_ref_quantize_act_apply(src, act, xh, n, gs, want), DG_OK);
	snprintf(what, sizeof(what), "codes %s→%s n=%zu", dg_fmt_name(src), dg_fmt_name(act), n);
	gh_expect_bytes(what, got, want, n);
	free(xf);
	free(xb);
	free(got);
	free(want);
}

Test(gpu_ops, quantize_act_matches_the_reference)
{
	dg_device *dev = gh_open();
	gh_seed(42);
	const dg_fmt srcs[] = { DG_FMT_F32, DG_FMT_BF16 };
	const dg_fmt acts[] = { DG_FMT_INT8, DG_FMT_INT4, DG_FMT_UINT8POS };
	for (int i = 0; i < 2; i++) {
		for (int j = 0; j < 3; j++) {
			quantize_case(dev, srcs[i], acts[j], 3, 1001, false); /* vector tail */
			quantize_case(dev, srcs[i], acts[j], 64, 4096, false); /* many blocks */
		}
	}
	quantize_case(dev, DG_FMT_F32, DG_FMT_INT8, 2, 64, true); /* scale 0, codes 0 */
	gh_close(dev);
}

static void pack_case(dg_device *dev, size_t rows, int k, int c)
{
	const size_t n = rows * (size_t)k * (size_t)c;
	int8_t *codes = gh_xmalloc(n), *back = gh_xmalloc(n);
	int32_t *want = gh_xmalloc(n), *got = gh_xmalloc(n); /* n/4 words; n bytes is plenty */
	for (size_t i = 0; i < n; i++)
		codes[i] = (int8_t)gh_int(-127, 127);
	cr_assert_eq(dg_ref_pack_i8x4(codes, want, rows, k, c), DG_OK);

	dg_spec ps = pack_spec(k, c);
	dg_spec us = ps;
	us.op = DG_OP_UNPACK_I8X4;
	dg_dptr cd = gh_upload(dev, codes, n);
	dg_dptr pd = gh_alloc_ff(dev, n);
	dg_dptr bd = gh_alloc_ff(dev, n);
	dg_tensor ct = dg_tensor_3d("codes", DG_FMT_INT8, cd, (int64_t)rows, k, c);
	dg_tensor pt = dg_tensor_3d("packed", DG_FMT_INT8, pd, (int64_t)rows, c, k);
	dg_tensor bt = dg_tensor_3d("codes", DG_FMT_INT8, bd, (int64_t)rows, k, c);
	dg_pack_i8x4_args pa = { .codes = &ct, .packed = &pt };
	dg_pack_i8x4_args ua = { .codes = &bt, .packed = &pt };
	cr_assert_eq(dg_pack_i8x4(dev, &ps, &pa), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_eq(dg_pack_i8x4(dev, &us, &ua), DG_OK, "%s", dg_device_errmsg(dev));
	gh_download(dev, got, pd, n);
	gh_download(dev, back, bd, n);
	char what[64];
	snprintf(what, sizeof(what), "pack (%zu, %d, %d)", rows, k, c);
	gh_expect_bytes(what, got, want, n);
	snprintf(what, sizeof(what), "unpack (%zu, %d, %d)", rows, k, c);
	gh_expect_bytes(what, back, codes, n);
	free(codes);
	free(back);
	free(want);
	free(got);
}

Test(gpu_ops, pack_and_unpack_match_the_reference)
{
	dg_device *dev = gh_open();
	gh_seed(7);
	pack_case(dev, 4, 256, 8192 / 8); /* BDH-like, whole tiles */
	pack_case(dev, 3, 260, 100);      /* partial tiles along K and C */
	pack_case(dev, 1, 4, 1);          /* the smallest */
	gh_close(dev);
}

Test(gpu_ops, bad_input_launches_nothing)
{
	dg_device *dev = gh_open();
	const size_t n = 4096;
	dg_dptr xd = gh_alloc(dev, n * 4), cd = gh_alloc(dev, n), sd = gh_scalar(dev, 3.0f);
	cr_assert_eq(dg_memset8(dev, cd, 0x5A, n), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	dg_tensor x = dg_tensor_2d("x", DG_FMT_F32, xd, 64, 64);
	dg_tensor c = dg_tensor_2d("codes", DG_FMT_INT8, cd, 32, 128);
	c.scale = sd;
	dg_quantize_act_args qa = { .x = &x, .codes = &c, .ws = { xd, n * 4 } };
	cr_assert_eq(dg_quantize_act(dev, &s, &qa), DG_ERR_INVALID_ARG);
	cr_assert_str_eq(dg_device_errmsg(dev), "codes: expected int8 (64, 64), got int8 (32, 128)");

	dg_spec ps = pack_spec(64, 64);
	dg_tensor ct = dg_tensor_3d("codes", DG_FMT_INT8, xd, 1, 64, 64);
	dg_tensor pt = dg_tensor_3d("packed", DG_FMT_INT8, cd, 1, 64, 32);
	dg_pack_i8x4_args pa = { .codes = &ct, .packed = &pt };
	cr_assert_eq(dg_pack_i8x4(dev, &ps, &pa), DG_ERR_INVALID_ARG);
	cr_assert(strstr(dg_device_errmsg(dev), "packed: expected int8 (1, 64, 64)"), "%s",
		  dg_device_errmsg(dev));

	gh_sync(dev);
	unsigned char *back = malloc(n), *want = malloc(n);
	memset(want, 0x5A, n);
	gh_download(dev, back, cd, n);
	gh_expect_bytes("codes after refused calls", back, want, n);
	cr_assert_eq(gh_read_scalar(dev, sd), 3.0f, "scale untouched");
	cr_assert_eq(built(dev), 0, "nothing was even compiled");
	cr_assert_eq(stats_of(dev).planned, 0, "nor planned");
	free(back);
	free(want);
	gh_close(dev);
}

/* quantize_act's |x| partials live in the caller's workspace: missing or
 * one byte short, the call is refused naming the op and "ws", and neither
 * codes nor scale changes; the right size works. */
Test(gpu_ops, quantize_act_workspace_is_checked)
{
	dg_device *dev = gh_open();
	const size_t rows = 64, cols = 4096, n = rows * cols;
	gh_seed(43);
	float *xh = gh_rand_storage(DG_FMT_F32, n, NULL);
	int8_t *codes = gh_xmalloc(n); /* the reference's */
	dg_spec s;
	dg_spec_init(&s, DG_OP_QUANTIZE_ACT);
	dg_dptr cd = gh_alloc_ff(dev, n), sd = gh_scalar(dev, -1.0f);
	dg_tensor x = dg_tensor_2d("x", DG_FMT_F32, gh_upload(dev, xh, n * 4), rows, cols);
	dg_tensor c = dg_tensor_2d("codes", DG_FMT_INT8, cd, rows, cols);
	c.scale = sd;
	dg_quantize_act_args a = { .x = &x, .codes = &c };
	size_t need = 0;
	cr_assert_eq(dg_quantize_act_workspace(dev, &s, &a, &need), DG_OK, "%s", dg_device_errmsg(dev));
	cr_assert_gt(need, 0);
	dg_workspace ok = gh_workspace(dev, need);
	gh_expect_bad_workspaces(dev, &s, &a, ok, quantize_act_ws, "dg_quantize_act", "codes", cd, n, sd);
	a.ws = ok;
	cr_assert_eq(dg_quantize_act(dev, &s, &a), DG_OK, "%s", dg_device_errmsg(dev));
	float gs = gh_read_scalar(dev, sd), rs = 0;
	cr_assert_eq(dg_ref_quantize_act(DG_FMT_F32, DG_FMT_INT8, xh, n, codes, &rs), DG_OK);
	gh_expect_close("scale", &gs, &rs, 1, 0.0f, 1e-5f);
	free(xh);
	free(codes);
	gh_close(dev);
}

/* ---- thread records: with or without a device --------------------------- */

struct rec_arg {
	dg_device *dev;
	pthread_barrier_t *made, *go;
	bool failed_ok; /* a failed open: the thread saw its own message */
};

static void *rec_thread(void *p)
{
	struct rec_arg *a = p;
	/* on an open device a record for the stream; on a failed one the
	 * failure's message, the thread's own */
	dg_status st = dg_device_set_stream(a->dev, NULL);
	a->failed_ok = st == DG_OK || dg_device_errmsg(a->dev)[0] != '\0';
	pthread_barrier_wait(a->made);
	pthread_barrier_wait(a->go);
	return NULL;
}

/* Short-lived threads (the model's sizing starts one a node) leave no
 * record behind: a device's records are those of its living threads. */
Test(gpu_runtime, thread_records_end_with_their_threads)
{
	enum { THREADS = 48, ROUNDS = 4 };
	dg_device *dev = NULL;
	(void)dg_device_open(&dev, NULL); /* no GPU: the failed handle, as good here */
	cr_assert_not_null(dev);
	(void)dg_device_errmsg(dev);
	size_t base = dg__dev_thread_count(dev);
	for (int r = 0; r < ROUNDS; r++) {
		pthread_barrier_t made, go;
		pthread_barrier_init(&made, NULL, THREADS + 1);
		pthread_barrier_init(&go, NULL, THREADS + 1);
		pthread_t th[THREADS];
		struct rec_arg args[THREADS];
		for (int i = 0; i < THREADS; i++) {
			args[i] = (struct rec_arg){ .dev = dev, .made = &made, .go = &go };
			cr_assert_eq(pthread_create(&th[i], NULL, rec_thread, &args[i]), 0);
		}
		pthread_barrier_wait(&made);
		size_t living = dg__dev_thread_count(dev);
		pthread_barrier_wait(&go);
		for (int i = 0; i < THREADS; i++) {
			pthread_join(th[i], NULL);
			cr_assert(args[i].failed_ok, "thread %d: no message of its own", i);
		}
		pthread_barrier_destroy(&made);
		pthread_barrier_destroy(&go);
		cr_assert_eq(living, base + THREADS, "round %d: %zu records for %d living threads", r,
			     living, THREADS);
		cr_assert_eq(dg__dev_thread_count(dev), base, "round %d: %zu records after the threads ended",
			     r, dg__dev_thread_count(dev));
	}
	dg_device_close(dev);
}

static void *close_under_thread(void *p)
{
	struct rec_arg *a = p;
	(void)dg_device_set_stream(a->dev, NULL);
	pthread_barrier_wait(a->made);
	pthread_barrier_wait(a->go); /* the device closed meanwhile */
	dg_device *again = NULL;
	(void)dg_device_open(&again, NULL); /* its lookup frees the closed one's record */
	(void)dg_device_errmsg(again);
	dg_device_close(again);
	return NULL;
}

/* A device closed while a thread that used it lives: the thread frees its
 * record later (ASan's build checks nobody touches it twice). */
Test(gpu_runtime, close_leaves_living_threads_their_records)
{
	dg_device *dev = NULL;
	(void)dg_device_open(&dev, NULL);
	cr_assert_not_null(dev);
	pthread_barrier_t made, go;
	pthread_barrier_init(&made, NULL, 2);
	pthread_barrier_init(&go, NULL, 2);
	struct rec_arg a = { .dev = dev, .made = &made, .go = &go };
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, close_under_thread, &a), 0);
	pthread_barrier_wait(&made);
	cr_assert_geq(dg__dev_thread_count(dev), 1);
	dg_device_close(dev);
	pthread_barrier_wait(&go);
	pthread_join(th, NULL);
	pthread_barrier_destroy(&made);
	pthread_barrier_destroy(&go);
}
