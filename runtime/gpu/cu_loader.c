/*
 * The CUDA driver loader: the only place dragon calls dlopen or
 * cuGetProcAddress.
 *
 * Loading happens once per process under pthread_once, the first time a
 * device is asked for, and its outcome (the table, or the reason there is
 * none) is kept: a machine without a driver answers "0 devices" with the
 * same message on every call. Functions are resolved with
 * cuGetProcAddress at an explicit CUDA version (12.0), so a newer driver
 * hands out the ABI these call sites were written against; a driver
 * without cuGetProcAddress falls back to dlsym of the versioned names.
 * The library handle is never closed (drivers do not like being unloaded,
 * and the table lives as long as the process).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/gpu/cu_loader.h"

/* The ABI version the call sites are written against. */
#define DG_CU_API_VERSION 12000

typedef CUresult(CUDAAPI *get_proc_v2_fn)(const char *, void **, int,
					  cuuint64_t,
					  CUdriverProcAddressQueryResult *);
typedef CUresult(CUDAAPI *get_proc_v1_fn)(const char *, void **, int,
					  cuuint64_t);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static dg__cu cu_table;
static dg_status load_status;
static char load_msg[512];

/* One function: cuGetProcAddress when the driver has it, else dlsym. */
static void *resolve(void *lib, get_proc_v2_fn gp2, get_proc_v1_fn gp1,
		     const char *name, const char *sym)
{
	void *fn = NULL;

	if (gp2) {
		CUdriverProcAddressQueryResult q;
		if (gp2(name, &fn, DG_CU_API_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
			&q) == CUDA_SUCCESS &&
		    q == CU_GET_PROC_ADDRESS_SUCCESS && fn)
			return fn;
		fn = NULL;
	} else if (gp1) {
		if (gp1(name, &fn, DG_CU_API_VERSION,
			CU_GET_PROC_ADDRESS_DEFAULT) == CUDA_SUCCESS &&
		    fn)
			return fn;
		fn = NULL;
	}
	return dlsym(lib, sym);
}

/* ---- failures on demand -----------------------------------------------------
 * $DRAGON_FAULT (a test's tool, docs/environment.md) names driver calls to
 * fail, comma-separated, so the failures a real GPU rarely shows can be
 * driven through every layer up to the CLI: alloc (cuMemAlloc: out of
 * memory), launch (cuLaunchKernel: too many resources requested), sync
 * (the synchronizations: an illegal address, as a kernel's fault reports
 * itself), load (loading a module: an invalid image). */

static CUresult CUDAAPI fault_alloc(CUdeviceptr *p, size_t n)
{
	(void)p, (void)n;
	return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult CUDAAPI fault_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
				     unsigned bx, unsigned by, unsigned bz, unsigned smem,
				     CUstream s, void **args, void **extra)
{
	(void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
	(void)s, (void)args, (void)extra;
	return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
}

static CUresult CUDAAPI fault_stream_sync(CUstream s)
{
	(void)s;
	return CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult CUDAAPI fault_ctx_sync(void)
{
	return CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult CUDAAPI fault_event_sync(CUevent e)
{
	(void)e;
	return CUDA_ERROR_ILLEGAL_ADDRESS;
}

static CUresult CUDAAPI fault_load(CUmodule *m, const void *image)
{
	(void)m, (void)image;
	return CUDA_ERROR_INVALID_IMAGE;
}

static bool fault_named(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; (p = strstr(p, name)); p += n)
		if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
			return true;
	return false;
}

static void apply_faults(dg__cu *cu)
{
	const char *f = getenv("DRAGON_FAULT");
	if (!f || !f[0])
		return;
	if (fault_named(f, "alloc"))
		cu->MemAlloc = fault_alloc;
	if (fault_named(f, "launch"))
		cu->LaunchKernel = fault_launch;
	if (fault_named(f, "sync")) {
		cu->StreamSynchronize = fault_stream_sync;
		cu->CtxSynchronize = fault_ctx_sync;
		cu->EventSynchronize = fault_event_sync;
	}
	if (fault_named(f, "load")) {
		cu->ModuleLoadData = fault_load;
		cu->has_library = false;
	}
}

static void load_driver(void)
{
	void *lib;
	get_proc_v2_fn gp2;
	get_proc_v1_fn gp1 = NULL;
	void *p;

	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *e = dlerror();
		snprintf(load_msg, sizeof(load_msg),
			 "libcuda.so.1 not found: %s (no NVIDIA driver on this machine?)",
			 e ? e : "unknown dlopen error");
		load_status = DG_ERR_NO_DEVICE;
		return;
	}
	/* Object pointer → function pointer: POSIX guarantees this works
	 * for dlsym; memcpy keeps -Wpedantic quiet about it. */
	p = dlsym(lib, "cuGetProcAddress_v2");
	memcpy(&gp2, &p, sizeof(p));
	if (!gp2) {
		p = dlsym(lib, "cuGetProcAddress");
		memcpy(&gp1, &p, sizeof(p));
	}
#define DG__CU_RESOLVE(f, name, sym, req, params)                             \
	p = resolve(lib, gp2, gp1, name, sym);                                \
	memcpy(&cu_table.f, &p, sizeof(p));                                   \
	if (!p && (req)) {                                                    \
		snprintf(load_msg, sizeof(load_msg),                          \
			 "libcuda.so.1 lacks %s: the driver is too old (CUDA 12.0 or newer is needed)", \
			 name);                                               \
		load_status = DG_ERR_CUDA;                                    \
		return;                                                       \
	}
	DG_CU_FUNCS(DG__CU_RESOLVE)
#undef DG__CU_RESOLVE
	cu_table.has_library = cu_table.LibraryLoadData &&
			       cu_table.LibraryUnload &&
			       cu_table.LibraryGetKernel &&
			       cu_table.KernelGetFunction;

	CUresult rc = cu_table.Init(0);
	if (rc == CUDA_ERROR_NO_DEVICE) {
		snprintf(load_msg, sizeof(load_msg),
			 "the driver reports no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)");
		load_status = DG_ERR_NO_DEVICE;
		return;
	}
	if (rc != CUDA_SUCCESS) {
		load_status = dg__cu_error(&cu_table, rc, "cuInit", load_msg,
					   sizeof(load_msg));
		if (load_status == DG_OK || load_status == DG_ERR_NOMEM)
			load_status = DG_ERR_CUDA;
		return;
	}
	apply_faults(&cu_table);
	load_status = DG_OK;
}

dg_status dg__cu_load(const dg__cu **out, char *msg, size_t msg_size)
{
	pthread_once(&load_once, load_driver);
	if (load_status) {
		if (msg && msg_size)
			snprintf(msg, msg_size, "%s", load_msg);
		if (out)
			*out = NULL;
		return load_status;
	}
	if (out)
		*out = &cu_table;
	if (msg && msg_size)
		msg[0] = '\0';
	return DG_OK;
}

dg_status dg__cu_error(const dg__cu *cu, CUresult rc, const char *call,
		       char *msg, size_t msg_size)
{
	const char *name = NULL, *str = NULL;

	if (rc == CUDA_SUCCESS)
		return DG_OK;
	if (cu && cu->GetErrorName)
		(void)cu->GetErrorName(rc, &name);
	if (cu && cu->GetErrorString)
		(void)cu->GetErrorString(rc, &str);
	if (msg && msg_size) {
		if (name)
			snprintf(msg, msg_size, "%s: %s (%s)", call, name,
				 str ? str : "no description");
		else
			snprintf(msg, msg_size, "%s: CUDA error %d", call,
				 (int)rc);
	}
	switch (rc) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return DG_ERR_NOMEM;
	case CUDA_ERROR_NO_DEVICE:
		return DG_ERR_NO_DEVICE;
	default:
		return DG_ERR_CUDA;
	}
}
