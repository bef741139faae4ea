/*
 * NVRTC: target selection, every rendered kernel compiles to a cubin for
 * sm_90, a compile error points at the generated line, and the prefetch
 * of NVRTC's libraries reads them whole into the page cache.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <nvrtc.h>

#include "dragon/codegen.h"
#include "dragon/jit.h"
#include "helpers.h"
#include "runtime/store/nvrtc.h"

static char err[8192];

Test(nvrtc, version_and_archs)
{
	int archs[64];
	int n = dg_nvrtc_archs(archs, 64);
	cr_assert_gt(n, 3);
	int has90 = 0;
	for (int i = 0; i < n; i++) {
		has90 |= archs[i] == 90;
		if (i)
			cr_assert_gt(archs[i], archs[i - 1], "ascending");
	}
	cr_assert(has90, "NVRTC must emit sm_90");
	cr_assert_neq(strcmp(dg_nvrtc_version(), "unknown"), 0);
}

/* The fraction of path's pages in the page cache (mincore over a map). */
static double resident(const char *path)
{
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "%s", path);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert_neq(p, MAP_FAILED);
	const long pg = sysconf(_SC_PAGESIZE);
	const size_t n = ((size_t)st.st_size + (size_t)pg - 1) / (size_t)pg;
	unsigned char *v = malloc(n);
	cr_assert_not_null(v);
	cr_assert_eq(mincore(p, (size_t)st.st_size, v), 0);
	size_t in = 0;
	for (size_t i = 0; i < n; i++)
		in += v[i] & 1;
	free(v);
	munmap(p, (size_t)st.st_size);
	close(fd);
	return (double)in / (double)n;
}

/* The prefetch finds libnvrtc and its builtins and asks for every page of
 * them, not just a readahead window's worth: the library's pages this
 * process has not mapped in are dropped from the cache first, and after
 * the prefetch nearly all of the file is back. */
Test(nvrtc, prefetch_reads_the_whole_library)
{
	Dl_info info;
	cr_assert(dladdr((void *)nvrtcVersion, &info) && info.dli_fname);
	char path[4096];
	snprintf(path, sizeof(path), "%s", info.dli_fname);
	int fd = open(path, O_RDONLY);
	cr_assert_geq(fd, 0, "%s", path);
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	const double before = resident(path);
	cr_assert_eq(dg__nvrtc_prefetch_now(), 2, "libnvrtc and libnvrtc-builtins beside it");
	double after = 0;
	for (int i = 0; i < 200 && (after = resident(path)) < 0.95; i++)
		usleep(50 * 1000); /* the reads are queued: at most 10 s */
	printf("nvrtc prefetch: %s resident %.0f%% before, %.0f%% after\n", path, 100 * before, 100 * after);
	cr_expect_geq(after, 0.95, "%s: %.0f%% resident after the prefetch", path, 100 * after);
	dg__nvrtc_prefetch(); /* the background form, twice: once a process */
	dg__nvrtc_prefetch();
}

Test(nvrtc, target_selection)
{
	int archs[64];
	int n = dg_nvrtc_archs(archs, 64);
	dg__nvrtc_target t;
	char opts[512];

	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, err, sizeof(err)), DG_OK, "%s", err);
	cr_assert(!t.ptx && t.arch == 90);
	dg__nvrtc_opts_string(&t, opts, sizeof(opts));
	cr_assert(strstr(opts, "--gpu-architecture=sm_90 "), "%s", opts);

	cr_assert_eq(dg__nvrtc_target_for(90, true, &t, err, sizeof(err)), DG_OK, "%s", err);
	dg__nvrtc_opts_string(&t, opts, sizeof(opts));
	cr_assert(strstr(opts, "--gpu-architecture=sm_90a"), "%s", opts);

	/* sm_91 does not exist: a cubin of the same major runs there */
	cr_assert_eq(dg__nvrtc_target_for(91, false, &t, err, sizeof(err)), DG_OK);
	cr_assert(!t.ptx && t.arch == 90);

	/* past the newest arch: PTX of the newest, finished by the driver */
	cr_assert_eq(dg__nvrtc_target_for(archs[n - 1] / 10 * 10 + 100, false, &t, err, sizeof(err)), DG_OK);
	cr_assert(t.ptx && t.arch == archs[n - 1]);
	dg__nvrtc_opts_string(&t, opts, sizeof(opts));
	cr_assert(strstr(opts, "--gpu-architecture=compute_"), "%s", opts);

	/* older than NVRTC targets: a spec error, like every usage error */
	cr_assert_eq(dg__nvrtc_target_for(50, false, &t, err, sizeof(err)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(err, "arch=sm_50"), "%s", err);
	char m[256];
	cr_assert_eq(dg_jit_check_arch(50, false, m, sizeof(m)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(m, "arch=sm_50: NVRTC"), "%s", m);
	cr_assert_eq(dg_jit_check_arch(90, true, m, sizeof(m)), DG_OK, "%s", m);
	cr_assert_eq(dg_jit_check_arch(80, false, NULL, 0), DG_OK);
	cr_assert_eq(dg_jit_check_arch(91, true, m, sizeof(m)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(m, "sm_91a"), "%s", m);
	/* arch-specific code cannot fall back to another minor: a spec error */
	cr_assert_eq(dg__nvrtc_target_for(91, true, &t, err, sizeof(err)), DG_ERR_INVALID_SPEC);
	cr_assert(strstr(err, "sm_91a"), "%s", err);
}

/* ---- every kernel compiles ------------------------------------------------- */

typedef struct work {
	dg_spec_list *list;
	size_t next;
	size_t step;
	pthread_mutex_t mu;
	int failures;
	char first_failure[8400];
	double ms;
	size_t done;
} work;

static void *compile_worker(void *arg)
{
	work *w = arg;
	dg_codegen *cg = NULL;
	char e[8192];
	dg__nvrtc_target t;

	if (dg_codegen_create(&cg, NULL))
		return NULL;
	dg__nvrtc_target_for(90, false, &t, e, sizeof(e));
	for (;;) {
		pthread_mutex_lock(&w->mu);
		size_t i = w->next;
		w->next += w->step;
		pthread_mutex_unlock(&w->mu);
		if (i >= w->list->n)
			break;
		dg_source *src = NULL;
		dg__nvrtc_result res;
		dg_status st = dg_codegen_render(cg, &w->list->specs[i], &src);
		if (st == DG_OK)
			st = dg__nvrtc_compile(src, &t, &res, e, sizeof(e));
		else
			snprintf(e, sizeof(e), "%s", dg_codegen_errmsg(cg));
		pthread_mutex_lock(&w->mu);
		if (st) {
			if (!w->failures++)
				snprintf(w->first_failure, sizeof(w->first_failure), "%s", e);
		} else {
			w->ms += res.ms;
			w->done++;
			if (res.size < 64 || memcmp(res.image, "\177ELF", 4) != 0) {
				if (!w->failures++)
					snprintf(w->first_failure, sizeof(w->first_failure),
						 "%s: not an ELF cubin", src->canonical);
			}
		}
		pthread_mutex_unlock(&w->mu);
		if (st == DG_OK)
			dg__nvrtc_result_free(&res);
		dg_source_destroy(src);
	}
	dg_codegen_destroy(cg);
	return NULL;
}

Test(nvrtc, every_rendered_kernel_compiles_for_sm90)
{
	dg_spec_list list;
	dg_test_all_specs(&list);
	work w = { .list = &list, .step = 1 };
	pthread_mutex_init(&w.mu, NULL);
	/* The sanitizer run compiles a deterministic sample: NVRTC itself is not
	 * instrumented, and the full set already ran in the plain build. */
	if (dg_test_quick())
		w.step = 23;
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, compile_worker, &w);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(w.failures, 0, "%d of %zu kernels failed; first: %s", w.failures,
		     list.n, w.first_failure);
	cr_assert_eq(w.done, (list.n + w.step - 1) / w.step);
	cr_log_info("compiled %zu kernels, mean NVRTC %.0f ms", w.done, w.ms / (double)w.done);
	free(list.specs);
}

/* ---- a compile error points at the generated line ------------------------ */

/* The start of a dragon.lua whose plan keeps the spec's tile (or a fixed
 * one for an auto tile) and names one entry k in program `name`. */
#define PLAN_K(name)                                                                     \
	"return { plan = function(spec)\n"                                              \
	"  local t = spec.module == 'lowrank' and { bm = 64, bn = 64, bk = 64, wm = 2, wn = 2, stages = 2, threads = 0 }\n" \
	"    or { bm = 0, bn = 0, bk = 0, wm = 0, wn = 0, stages = 0, threads = 256 }\n" \
	"  return { tile = t, path = 'p', name = '" name "', entries = { { name = 'k', threads = 64 } } }\n" \
	"end,\n"

/* Renders the default spec of op with a template set whose dragon.lua is
 * lua, and compiles it for sm_90 expecting DG_ERR_COMPILE: NVRTC's message
 * is left in err and its result in *res (the caller frees it). */
static void compile_broken(const char *lua, dg_op op, dg__nvrtc_result *res)
{
	char *dir = dg_test_template_dir(lua, NULL);
	dg_codegen_opts o = { .template_dir = dir };
	dg_codegen *cg = NULL;
	dg_source *src = NULL;
	dg__nvrtc_target t;
	dg_spec s;

	cr_assert_eq(dg_codegen_create(&cg, &o), DG_OK, "%s", dg_codegen_errmsg(cg));
	dg_spec_init(&s, op);
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK, "%s", dg_codegen_errmsg(cg));
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, err, sizeof(err)), DG_OK);
	cr_assert_eq(dg__nvrtc_compile(src, &t, res, err, sizeof(err)), DG_ERR_COMPILE);
	dg_source_destroy(src);
	dg_codegen_destroy(cg);
	dg_test_rmtree(dir);
}

Test(nvrtc, compile_error_names_the_generated_line)
{
	dg__nvrtc_result res;

	compile_broken(PLAN_K("broken.cu") "render = function(spec)\n"
		       "  return '// ' .. spec.canonical .. '\\n'\n"
		       "      .. 'extern \"C\" __global__ void k(float *p)\\n'\n"
		       "      .. '{\\n'\n"
		       "      .. '  p[0] = undefined_thing;\\n'\n"
		       "      .. '}\\n'\n"
		       "end }\n",
		       DG_OP_LOWRANK_FWD, &res);
	cr_assert(strstr(err, "compile error in act=int8;"), "spec missing: %s", err);
	cr_assert(strstr(err, "broken.cu(4)"), "NVRTC location missing: %s", err);
	cr_assert(strstr(err, "undefined_thing"), "%s", err);
	cr_assert(strstr(err, ">    4 |   p[0] = undefined_thing;"), "marked line missing: %s", err);
	cr_assert(strstr(err, "     3 | {"), "context missing: %s", err);
	cr_assert(strstr(res.log, "undefined_thing"), "the log is kept: %s", res.log);
	cr_assert_null(res.image);
	dg__nvrtc_result_free(&res);
}

Test(nvrtc, catastrophic_error_names_the_generated_line)
{
	dg__nvrtc_result res;

	compile_broken(PLAN_K("cat.cu") "render = function(spec)\n"
		       "  return '// ' .. spec.canonical .. '\\n'\n"
		       "      .. '#include <no_such_header.h>\\n'\n"
		       "      .. 'extern \"C\" __global__ void k() {}\\n'\n"
		       "end }\n",
		       DG_OP_PACK_I8X4, &res);
	cr_assert(strstr(err, "no_such_header.h"), "%s", err);
	cr_assert(strstr(err, ">    2 | #include <no_such_header.h>"), "marked line missing: %s", err);
	dg__nvrtc_result_free(&res);
}

/* The same kernel compiles to the same bytes from any working directory:
 * bundles are reproducible and a cache entry does not depend on where its
 * builder ran. */
Test(nvrtc, bytes_do_not_depend_on_the_working_directory)
{
	unsetenv("DRAGON_NVRTC_LINEINFO");
	dg_codegen *cg = NULL;
	cr_assert_eq(dg_codegen_create(&cg, NULL), DG_OK);
	dg_spec s;
	dg_spec_init(&s, DG_OP_PACK_I8X4);
	dg_source *src = NULL;
	cr_assert_eq(dg_codegen_render(cg, &s, &src), DG_OK);
	dg__nvrtc_target t;
	cr_assert_eq(dg__nvrtc_target_for(90, false, &t, err, sizeof(err)), DG_OK);
	dg__nvrtc_result r[2];
	char *dirs[2] = { dg_test_tmpdir(), dg_test_tmpdir() };
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(chdir(dirs[i]), 0);
		cr_assert_eq(dg__nvrtc_compile(src, &t, &r[i], err, sizeof(err)), DG_OK, "%s", err);
	}
	cr_assert_eq(r[0].size, r[1].size);
	cr_assert(memcmp(r[0].image, r[1].image, r[0].size) == 0,
		  "cubin bytes differ between working directories");
	for (int i = 0; i < 2; i++) {
		dg__nvrtc_result_free(&r[i]);
		dg_test_rmtree(dirs[i]);
	}
	dg_source_destroy(src);
	dg_codegen_destroy(cg);
}
