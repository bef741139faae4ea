/*
 * NVRTC compile.
 *
 * The options are built in dg__nvrtc_target_for alone, because they are
 * part of every cache key. The log is kept even on success (warnings). A
 * compile error is reported the way a user can act on it: NVRTC's first
 * error, the generated lines around it, and the spec that produced them.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "dragon/jit.h"
#include "runtime/store/nvrtc.h"

#define MAX_ARCHS 64

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char nvrtc_version[32];
static pthread_once_t nvrtc_version_once = PTHREAD_ONCE_INIT;

static void read_nvrtc_version(void)
{
	int major = 0, minor = 0;

	if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
		snprintf(nvrtc_version, sizeof(nvrtc_version), "%d.%d", major, minor);
	else
		snprintf(nvrtc_version, sizeof(nvrtc_version), "unknown");
}

/* Thread-safe: build workers ask for it concurrently. */
const char *dg_nvrtc_version(void)
{
	pthread_once(&nvrtc_version_once, read_nvrtc_version);
	return nvrtc_version;
}

int dg_nvrtc_archs(int *archs, int max)
{
	int n = 0;
	int all[MAX_ARCHS];

	if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 ||
	    n > MAX_ARCHS)
		return 0;
	if (nvrtcGetSupportedArchs(all) != NVRTC_SUCCESS)
		return 0;
	for (int i = 0; archs && i < n && i < max; i++)
		archs[i] = all[i];
	return n;
}

/* The file libnvrtc was loaded from (dladdr on one of its functions) into
 * file; the length of its folder's part, 0 where it cannot be told. */
static int nvrtc_file(char *file, size_t size)
{
	Dl_info info;
	if (!dladdr((void *)nvrtcVersion, &info) || !info.dli_fname)
		return 0;
	const char *slash = strrchr(info.dli_fname, '/');
	if (!slash || strlen(info.dli_fname) >= size)
		return 0;
	snprintf(file, size, "%s", info.dli_fname);
	return (int)(slash - info.dli_fname);
}

/* libnvrtc-builtins.so.<major>.<minor> beside libnvrtc into path; false
 * where that cannot be told. */
static bool builtins_path(char *path, size_t size)
{
	char lib[4096];
	int major = 0, minor = 0;
	const int dir = nvrtc_file(lib, sizeof(lib));
	if (!dir || nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
		return false;
	const int n = snprintf(path, size, "%.*s/libnvrtc-builtins.so.%d.%d", dir, lib, major, minor);
	return n > 0 && (size_t)n < size;
}

/*
 * NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name at its first
 * compile, which finds it only through the loader's search path: a toolkit
 * outside ld.so.conf (a tarball, a wheel, a bind mount) fails with "failed
 * to open libnvrtc-builtins". Loading it first from the folder libnvrtc
 * itself came from makes the later by-name open match the loaded soname.
 * This is NVRTC's own companion library, not the CUDA driver (which only
 * runtime/gpu/cu_loader.c opens). The handle is kept for the process.
 */
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static void preload_builtins(void)
{
	char path[4096];

	if (!builtins_path(path, sizeof(path)))
		return;
	/* Failure is fine: NVRTC then searches as it always does and reports. */
	dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

/* POSIX_FADV_WILLNEED over the whole file, a chunk a call: Linux reads at
 * most the device's readahead window (a few MB) for one call, so a single
 * call over the file would bring in only its start. The reads are queued
 * and the calls return. Whether the file was there. */
static bool prefetch_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	struct stat st;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		const off_t chunk = (off_t)2 << 20;
		for (off_t o = 0; o < st.st_size; o += chunk)
			(void)posix_fadvise(fd, o, chunk, POSIX_FADV_WILLNEED);
	}
	close(fd);
	return true;
}

int dg__nvrtc_prefetch_now(void)
{
	char path[4096];
	int found = 0;
	/* the library under the name it was loaded by (a link is read
	 * through to its target), then the builtins */
	if (nvrtc_file(path, sizeof(path)) && prefetch_file(path))
		found++;
	if (builtins_path(path, sizeof(path)) && prefetch_file(path))
		found++;
	return found;
}

static void *prefetch_main(void *arg)
{
	(void)arg;
	(void)dg__nvrtc_prefetch_now();
	return NULL;
}

static pthread_once_t prefetch_once = PTHREAD_ONCE_INIT;

static void prefetch_start(void)
{
	pthread_t th;
	pthread_attr_t a;
	const bool attr = pthread_attr_init(&a) == 0;
	/* no detached thread: the same reads, queued from here */
	if (!attr || pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED) ||
	    pthread_create(&th, &a, prefetch_main, NULL))
		(void)prefetch_main(NULL);
	if (attr)
		pthread_attr_destroy(&a);
}

void dg__nvrtc_prefetch(void)
{
	pthread_once(&prefetch_once, prefetch_start);
}

static void add_opt(dg__nvrtc_target *t, const char *o)
{
	snprintf(t->opts[t->n_opts++], sizeof(t->opts[0]), "%s", o);
}

dg_status dg__nvrtc_target_for(int arch, bool arch_specific,
			       dg__nvrtc_target *t, char *err, size_t esz)
{
	int archs[MAX_ARCHS];
	int n = dg_nvrtc_archs(archs, MAX_ARCHS);
	char o[48];

	memset(t, 0, sizeof(*t));
	if (n <= 0) {
		snprintf(err, esz, "NVRTC %s did not list its supported archs",
			 dg_nvrtc_version());
		return DG_ERR_COMPILE;
	}
	if (arch < archs[0]) {
		snprintf(err, esz,
			 "arch=sm_%d: NVRTC %s targets sm_%d to sm_%d; pick one of those",
			 arch, dg_nvrtc_version(), archs[0], archs[n - 1]);
		return DG_ERR_INVALID_SPEC; /* a usage error, like every spec error */
	}
	int best = archs[0];
	for (int i = 0; i < n; i++)
		if (archs[i] <= arch)
			best = archs[i];
	if (arch_specific && best != arch) {
		snprintf(err, esz,
			 "arch=sm_%da: NVRTC %s cannot target it (arch-specific code cannot fall back); newest is sm_%d",
			 arch, dg_nvrtc_version(), archs[n - 1]);
		return DG_ERR_INVALID_SPEC;
	}
	t->arch = best;
	t->arch_specific = arch_specific;
	/* Same major: a cubin for an older minor runs. Otherwise hand the driver
	 * PTX of the newest arch we can name, which it compiles forward. */
	t->ptx = best / 10 != arch / 10;
	snprintf(o, sizeof(o), "--gpu-architecture=%s_%d%s",
		 t->ptx ? "compute" : "sm", best, arch_specific ? "a" : "");
	add_opt(t, o);
	add_opt(t, "--std=c++17");
	/* Line info embeds the compiling process's working directory in the
	 * cubin, so the same key would give different bytes from different
	 * folders (and leak the path into bundles). Opt-in, for profiling;
	 * being an option, it is part of the key. */
	const char *li = getenv("DRAGON_NVRTC_LINEINFO");
	if (li && *li && strcmp(li, "0") != 0)
		add_opt(t, "--generate-line-info");
	return DG_OK;
}

void dg__nvrtc_opts_string(const dg__nvrtc_target *t, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (int i = 0; i < t->n_opts; i++) {
		int w = snprintf(buf + n, size - n, "%s%s", i ? " " : "",
				 t->opts[i]);
		if (w < 0 || (size_t)w >= size - n)
			return;
		n += (size_t)w;
	}
}

void dg__nvrtc_result_free(dg__nvrtc_result *res)
{
	if (!res)
		return;
	free(res->image);
	free(res->log);
	memset(res, 0, sizeof(*res));
}

/* Appends line `no` (1-based) of text to buf, with a gutter. */
static size_t append_line(char *buf, size_t size, size_t n, const char *text,
			  int no, bool mark)
{
	const char *p = text;
	for (int i = 1; i < no && p; i++) {
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	if (!p || !*p || n >= size)
		return n;
	const char *e = strchr(p, '\n');
	int len = e ? (int)(e - p) : (int)strlen(p);
	int w = snprintf(buf + n, size - n, "\n%s%5d | %.*s", mark ? ">" : " ",
			 no, len > 160 ? 160 : len, p);
	return w > 0 ? n + (size_t)w : n;
}

/* "compile error in <spec>: <first error>" + the source around it. */
static void describe_error(const dg_source *src, const char *log, char *err,
			   size_t esz)
{
	/* NVRTC writes "name(line): error: ..." or "...: catastrophic error: ...". */
	const char *line = strstr(log, ": error");
	const char *cat = strstr(log, ": catastrophic error");
	if (cat && (!line || cat < line))
		line = cat;
	const char *start = line;
	int no = 0;

	while (start && start > log && start[-1] != '\n')
		start--;
	if (start) {
		const char *paren = strchr(start, '(');
		if (paren && paren < line)
			no = atoi(paren + 1);
	}
	const char *end = line ? strchr(line, '\n') : NULL;
	int len = start ? (end ? (int)(end - start) : (int)strlen(start)) : 0;
	size_t n;
	int w;
	if (start)
		w = snprintf(err, esz, "compile error in %s: %.*s", src->canonical,
			     len > 400 ? 400 : len, start);
	else
		w = snprintf(err, esz, "compile error in %s: %.400s",
			     src->canonical, log[0] ? log : "NVRTC gave no log");
	n = w > 0 ? (size_t)w : 0;
	for (int i = no - 2; no > 0 && i <= no + 2; i++)
		if (i >= 1)
			n = append_line(err, esz, n, src->text, i, i == no);
}

dg_status dg__nvrtc_compile(const dg_source *src, const dg__nvrtc_target *t,
			    dg__nvrtc_result *res, char *err, size_t esz)
{
	nvrtcProgram prog;
	const char *opts[DG__NVRTC_MAX_OPTS];
	size_t log_size = 0;
	nvrtcResult rc;
	dg_status st = DG_OK;

	memset(res, 0, sizeof(*res));
	pthread_once(&builtins_once, preload_builtins);
	rc = nvrtcCreateProgram(&prog, src->text, src->name, 0, NULL, NULL);
	if (rc != NVRTC_SUCCESS) {
		snprintf(err, esz, "nvrtcCreateProgram: %s", nvrtcGetErrorString(rc));
		return rc == NVRTC_ERROR_OUT_OF_MEMORY ? DG_ERR_NOMEM
						       : DG_ERR_COMPILE;
	}
	for (int i = 0; i < t->n_opts; i++)
		opts[i] = t->opts[i];
	double t0 = now_ms();
	nvrtcResult crc = nvrtcCompileProgram(prog, t->n_opts, opts);
	res->ms = now_ms() - t0;

	if (nvrtcGetProgramLogSize(prog, &log_size) != NVRTC_SUCCESS)
		log_size = 1;
	res->log = calloc(1, log_size + 1);
	if (!res->log) {
		st = DG_ERR_NOMEM;
		goto out;
	}
	if (log_size > 1)
		nvrtcGetProgramLog(prog, res->log);
	if (crc != NVRTC_SUCCESS) {
		describe_error(src, res->log, err, esz);
		st = DG_ERR_COMPILE;
		goto out;
	}
	size_t size = 0;
	rc = t->ptx ? nvrtcGetPTXSize(prog, &size) : nvrtcGetCUBINSize(prog, &size);
	if (rc != NVRTC_SUCCESS || size == 0) {
		snprintf(err, esz, "NVRTC produced no %s for %s: %s",
			 t->ptx ? "PTX" : "cubin", src->canonical,
			 nvrtcGetErrorString(rc));
		st = DG_ERR_COMPILE;
		goto out;
	}
	res->image = malloc(size);
	if (!res->image) {
		st = DG_ERR_NOMEM;
		goto out;
	}
	rc = t->ptx ? nvrtcGetPTX(prog, (char *)res->image)
		    : nvrtcGetCUBIN(prog, (char *)res->image);
	if (rc != NVRTC_SUCCESS) {
		snprintf(err, esz, "NVRTC: %s", nvrtcGetErrorString(rc));
		st = DG_ERR_COMPILE;
		goto out;
	}
	res->size = size;
out:
	nvrtcDestroyProgram(&prog);
	if (st == DG_ERR_NOMEM)
		snprintf(err, esz, "out of memory compiling %s", src->canonical);
	if (st) {
		free(res->image);
		res->image = NULL;
		res->size = 0;
	}
	return st;
}
