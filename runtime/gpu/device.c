/*
 * The device: one GPU's primary context, its own stream, the JIT context,
 * device memory (plain allocations and arenas) and the CUDA events timing
 * uses. Each thread's message and stream are in runtime/gpu/thread.c, the
 * kernel map in kernel.c.
 *
 * The primary context is the one the CUDA runtime, cuBLAS and PyTorch use,
 * so device pointers pass between them and dragon unchanged. It is made
 * current at the start of every call that touches the GPU, because the
 * calling thread may differ from call to call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dragon/tensor.h"
#include "runtime/gpu/device_int.h"
#include "runtime/gpu/gpu_int.h"
#include "runtime/store/nvrtc.h"

#define SMEM_DEFAULT_LIMIT 49152

/* ---- open and close -------------------------------------------------------- */

dg_status dg_device_count(int *n, char *msg, size_t msg_size)
{
	const dg__cu *cu;
	dg_status st;

	if (!n)
		return DG_ERR_INVALID_ARG;
	*n = 0;
	st = dg__cu_load(&cu, msg, msg_size);
	if (st == DG_ERR_NO_DEVICE)
		return DG_OK; /* msg says why there are none */
	if (st)
		return st;
	int count = 0;
	CUresult rc = cu->DeviceGetCount(&count);
	if (rc == CUDA_ERROR_NO_DEVICE) {
		if (msg && msg_size)
			snprintf(msg, msg_size,
				 "the driver reports no CUDA device (cuDeviceGetCount: CUDA_ERROR_NO_DEVICE)");
		return DG_OK;
	}
	if (rc != CUDA_SUCCESS)
		return dg__cu_error(cu, rc, "cuDeviceGetCount", msg, msg_size);
	*n = count;
	if (msg && msg_size)
		snprintf(msg, msg_size, "%d CUDA device%s", count,
			 count == 1 ? "" : "s");
	return DG_OK;
}

/* An attribute that only describes the device: 0 when the driver
 * does not answer (a newer driver may retire one). */
static int attr(dg_device *dev, CUdevice_attribute a)
{
	int v = 0;
	if (dev->cu->DeviceGetAttribute(&v, a, dev->cudev) != CUDA_SUCCESS)
		return 0;
	return v;
}

static dg_status read_info(dg_device *dev)
{
	const dg__cu *cu = dev->cu;
	dg_device_info *in = &dev->info;
	CUresult rc;

	in->ordinal = dev->ordinal;
	rc = cu->DeviceGetName(in->name, (int)sizeof(in->name), dev->cudev);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDeviceGetName");
	in->name[sizeof(in->name) - 1] = '\0';
	int major = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
	int minor = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
	in->sm = major * 10 + minor;
	in->sm_count = attr(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
	rc = cu->DriverGetVersion(&in->driver_version);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDriverGetVersion");
	rc = cu->DeviceTotalMem(&in->total_mem, dev->cudev);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDeviceTotalMem");
	in->smem_optin = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
	if (in->smem_optin < SMEM_DEFAULT_LIMIT)
		in->smem_optin = SMEM_DEFAULT_LIMIT;
	in->clock_khz = attr(dev, CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
	in->l2_bytes = attr(dev, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);

	static const CUdevice_attribute grid[3] = {
		CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
		CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z
	};
	static const CUdevice_attribute block[3] = {
		CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
		CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z
	};
	/* Fallbacks: the limits of every GPU since sm_30. */
	static const int grid_def[3] = { 2147483647, 65535, 65535 };
	static const int block_def[3] = { 1024, 1024, 64 };
	for (int i = 0; i < 3; i++) {
		dev->max_grid[i] = attr(dev, grid[i]);
		if (dev->max_grid[i] <= 0)
			dev->max_grid[i] = grid_def[i];
		dev->max_block[i] = attr(dev, block[i]);
		if (dev->max_block[i] <= 0)
			dev->max_block[i] = block_def[i];
	}
	in->max_block_threads = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
	if (in->max_block_threads <= 0)
		in->max_block_threads = 1024;
	in->regs_per_block = attr(dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
	if (in->regs_per_block <= 0)
		in->regs_per_block = 65536;
	return DG_OK;
}

static char *dup_or_null(const char *s, bool *oom)
{
	if (!s)
		return NULL;
	char *d = strdup(s);
	if (!d)
		*oom = true;
	return d;
}

/* The bundles $DRAGON_KERNELS names (':' joins several). */
static dg_status load_env_bundles(dg_device *dev)
{
	const char *env = getenv("DRAGON_KERNELS");
	if (!env || !env[0])
		return DG_OK;
	char *list = strdup(env);
	if (!list)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory reading DRAGON_KERNELS");
	dg_status st = DG_OK;
	char *save = NULL;
	for (char *dir = strtok_r(list, ":", &save); dir && !st; dir = strtok_r(NULL, ":", &save)) {
		st = dg_device_load_bundle(dev, dir, NULL);
		if (st) {
			char m[DG__MSG_SIZE];
			snprintf(m, sizeof(m), "%s", dg_device_errmsg(dev));
			dg__dev_fail(dev, st, "DRAGON_KERNELS: %s", m);
		}
	}
	free(list);
	return st;
}

/* Everything open does once the handle exists; the message is on dev. */
static dg_status open_device(dg_device *dev, const dg_device_opts *opts)
{
	char why[512];
	dg_status st;
	CUresult rc;
	int count = 0;

	/* the compiler's pages read while the driver starts: the step's
	 * kernels compile as soon as the device is open */
	dg__nvrtc_prefetch();
	st = dg__cu_load(&dev->cu, why, sizeof(why));
	if (st)
		return dg__dev_fail(dev, st, "%s", why);
	rc = dev->cu->DeviceGetCount(&count);
	if (rc == CUDA_ERROR_NO_DEVICE)
		count = 0;
	else if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDeviceGetCount");
	if (dev->ordinal < 0 || dev->ordinal >= count) {
		if (count == 0)
			return dg__dev_fail(dev, DG_ERR_NO_DEVICE,
					    "the driver reports no CUDA device");
		return dg__dev_fail(dev, DG_ERR_NO_DEVICE,
				    "device %d requested, but the driver reports %d device%s (ordinals 0..%d)",
				    dev->ordinal, count, count == 1 ? "" : "s",
				    count - 1);
	}
	rc = dev->cu->DeviceGet(&dev->cudev, dev->ordinal);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDeviceGet");
	rc = dev->cu->DevicePrimaryCtxRetain(&dev->ctx, dev->cudev);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuDevicePrimaryCtxRetain");
	dev->ctx_retained = true;
	rc = dev->cu->CtxSetCurrent(dev->ctx);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuCtxSetCurrent");
	rc = dev->cu->StreamCreate(&dev->own_stream, CU_STREAM_NON_BLOCKING);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuStreamCreate");
	st = read_info(dev);
	if (st)
		return st;

	bool oom = false;
	if (opts && opts->jit) {
		dev->jit_opts = *opts->jit;
		dev->jit_cache_dir = dup_or_null(opts->jit->cache_dir, &oom);
		dev->jit_template_dir = dup_or_null(opts->jit->template_dir, &oom);
		dev->jit_opts.cache_dir = dev->jit_cache_dir;
		dev->jit_opts.template_dir = dev->jit_template_dir;
	}
	dev->jit_cap = 8;
	dev->jit_all = calloc(dev->jit_cap, sizeof(dg_ctx *));
	dev->jit_idle = calloc(dev->jit_cap, sizeof(dg_ctx *));
	dev->n_buckets = 64;
	dev->buckets = calloc(dev->n_buckets, sizeof(dg__kentry *));
	if (oom || !dev->jit_all || !dev->jit_idle || !dev->buckets)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory opening the device");
	st = dg_ctx_create(&dev->jit, &dev->jit_opts);
	if (st) {
		if (!dev->jit)
			return dg__dev_fail(dev, st, "creating the JIT context: %s",
					    dg_status_str(st));
		dg__dev_fail(dev, st, "JIT context: %s", dg_ctx_errmsg(dev->jit));
		dg_ctx_destroy(dev->jit);
		dev->jit = NULL;
		return st;
	}
	dev->jit_all[dev->n_jit_all++] = dev->jit;
	dev->jit_idle[dev->n_jit_idle++] = dev->jit;
	return load_env_bundles(dev);
}

dg_status dg_device_open(dg_device **out, const dg_device_opts *opts)
{
	dg_device *dev;
	dg_status st;

	if (!out)
		return DG_ERR_INVALID_ARG;
	*out = NULL;
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return DG_ERR_NOMEM;
	dev->ordinal = opts ? opts->ordinal : 0;
	pthread_mutex_init(&dev->mu, NULL);
	pthread_mutex_init(&dev->tune_mu, NULL);
	pthread_cond_init(&dev->cv, NULL);
	st = open_device(dev, opts);
	if (st) {
		/* Like sqlite3_open: hand the handle out so errmsg says why;
		 * every later call fails the same way. */
		dev->init_status = st;
		snprintf(dev->init_msg, sizeof(dev->init_msg), "%s",
			 dg_device_errmsg(dev));
	}
	*out = dev;
	return st;
}

void dg_device_close(dg_device *dev)
{
	if (!dev)
		return;
	if (dev->ctx_retained && dev->cu->CtxSetCurrent(dev->ctx) == CUDA_SUCCESS) {
		/* Work still queued must not outlive its kernels. */
		(void)dev->cu->CtxSynchronize();
		dg__dev_kernels_destroy(dev);
		if (dev->own_stream)
			(void)dev->cu->StreamDestroy(dev->own_stream);
	}
	if (dev->ctx_retained)
		(void)dev->cu->DevicePrimaryCtxRelease(dev->cudev);
	for (size_t i = 0; i < dev->n_jit_all; i++)
		dg_ctx_destroy(dev->jit_all[i]);
	free(dev->jit_all);
	free(dev->jit_idle);
	free(dev->buckets);
	free(dev->jit_cache_dir);
	free(dev->jit_template_dir);
	dg__dev_threads_destroy(dev);
	dg__dev_tune_destroy(dev);
	pthread_cond_destroy(&dev->cv);
	pthread_mutex_destroy(&dev->tune_mu);
	pthread_mutex_destroy(&dev->mu);
	free(dev);
}

dg_status dg_device_info_get(dg_device *dev, dg_device_info *info)
{
	if (!dev)
		return DG_ERR_INVALID_ARG;
	if (dev->init_status)
		return dg__dev_fail(dev, dev->init_status, "%s", dev->init_msg);
	if (!info)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_info_get: info is NULL");
	*info = dev->info;
	return DG_OK;
}

dg_ctx *dg_device_jit(dg_device *dev)
{
	return dev ? dev->jit : NULL;
}

/* ---- memory ---------------------------------------------------------------- */

dg_status dg_malloc(dg_device *dev, size_t bytes, dg_dptr *out)
{
	dg_status st;
	CUdeviceptr p = 0;

	if (out)
		*out = 0;
	st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_malloc: out is NULL");
	if (bytes == 0)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_malloc: 0 bytes asked for (allocations must be at least 1 byte)");
	CUresult rc = dev->cu->MemAlloc(&p, bytes);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
		size_t free_b = 0, total_b = 0;
		(void)dev->cu->MemGetInfo(&free_b, &total_b);
		return dg__dev_fail(dev, DG_ERR_NOMEM,
				    "cuMemAlloc(%zu bytes): CUDA_ERROR_OUT_OF_MEMORY (%zu of %zu bytes free on device %d)",
				    bytes, free_b, total_b, dev->ordinal);
	}
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemAlloc");
	*out = (dg_dptr)p;
	size_t live = atomic_fetch_add(&dev->mem_live, bytes) + bytes;
	size_t high = atomic_load(&dev->mem_high);
	while (high < live && !atomic_compare_exchange_weak(&dev->mem_high, &high, live))
		;
	return DG_OK;
}

size_t dg__dev_mem_mark(dg_device *dev)
{
	if (!dev || dev->init_status)
		return 0;
	size_t live = atomic_load(&dev->mem_live);
	atomic_store(&dev->mem_high, live);
	return live;
}

size_t dg__dev_mem_high(dg_device *dev)
{
	return dev && !dev->init_status ? atomic_load(&dev->mem_high) : 0;
}

dg_status dg_device_mem_info(dg_device *dev, size_t *free_bytes, size_t *total_bytes)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!free_bytes || !total_bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_device_mem_info: NULL argument");
	CUresult rc = dev->cu->MemGetInfo(free_bytes, total_bytes);
	return rc == CUDA_SUCCESS ? DG_OK : dg__dev_cu_fail(dev, rc, "cuMemGetInfo");
}

dg_status dg_free(dg_device *dev, dg_dptr ptr)
{
	if (!ptr)
		return dev ? DG_OK : DG_ERR_INVALID_ARG;
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	/* the allocation's size, for the bytes held (dg_device_stats) */
	CUdeviceptr base = 0;
	size_t bytes = 0;
	if (dev->cu->MemGetAddressRange(&base, &bytes, (CUdeviceptr)ptr) != CUDA_SUCCESS ||
	    base != (CUdeviceptr)ptr)
		bytes = 0; /* not one of dg_malloc's: freed all the same */
	CUresult rc = dev->cu->MemFree((CUdeviceptr)ptr);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemFree");
	size_t live = atomic_load(&dev->mem_live);
	while (!atomic_compare_exchange_weak(&dev->mem_live, &live, live > bytes ? live - bytes : 0))
		;
	return DG_OK;
}

/* Common argument checks of the copies; the message names the call. */
static dg_status copy_args(dg_device *dev, const char *call, bool dst_ok,
			   bool src_ok, size_t bytes)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	if (bytes && (!dst_ok || !src_ok))
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "%s: %s is NULL (%zu bytes)",
				    call, !dst_ok ? "dst" : "src", bytes);
	return DG_OK;
}

dg_status dg_memcpy_htod(dg_device *dev, dg_dptr dst, const void *src,
			 size_t bytes)
{
	dg_status st = copy_args(dev, "dg_memcpy_htod", dst != 0, src != NULL, bytes);
	if (st || !bytes)
		return st;
	CUresult rc = dev->cu->MemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemcpyHtoDAsync");
	return DG_OK;
}

dg_status dg_memcpy_dtoh(dg_device *dev, void *dst, dg_dptr src, size_t bytes)
{
	dg_status st = copy_args(dev, "dg_memcpy_dtoh", dst != NULL, src != 0, bytes);
	if (st || !bytes)
		return st;
	CUresult rc = dev->cu->MemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemcpyDtoHAsync");
	rc = dev->cu->StreamSynchronize(dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuStreamSynchronize (after a copy to the host)");
	return DG_OK;
}

dg_status dg_memcpy_dtod(dg_device *dev, dg_dptr dst, dg_dptr src, size_t bytes)
{
	dg_status st = copy_args(dev, "dg_memcpy_dtod", dst != 0, src != 0, bytes);
	if (st || !bytes)
		return st;
	CUresult rc = dev->cu->MemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src,
					       bytes, dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemcpyDtoDAsync");
	return DG_OK;
}

dg_status dg_memcpy_dtoh_async(dg_device *dev, void *dst, dg_dptr src, size_t bytes)
{
	dg_status st = copy_args(dev, "dg_memcpy_dtoh_async", dst != NULL, src != 0, bytes);
	if (st || !bytes)
		return st;
	CUresult rc = dev->cu->MemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemcpyDtoHAsync");
	return DG_OK;
}

dg_status dg_host_alloc(dg_device *dev, size_t bytes, void **out)
{
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!out || !bytes)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_host_alloc: %s",
				    out ? "0 bytes" : "NULL out");
	*out = NULL;
	CUresult rc = dev->cu->MemHostAlloc(out, bytes, 0);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemHostAlloc");
	return DG_OK;
}

void dg_host_free(dg_device *dev, void *p)
{
	if (dev && p && !dg__dev_enter(dev))
		(void)dev->cu->MemFreeHost(p);
}

dg_status dg_memset8(dg_device *dev, dg_dptr dst, uint8_t value, size_t bytes)
{
	dg_status st = copy_args(dev, "dg_memset8", dst != 0, true, bytes);
	if (st || !bytes)
		return st;
	CUresult rc = dev->cu->MemsetD8Async((CUdeviceptr)dst, value, bytes, dg__dev_stream(dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuMemsetD8Async");
	return DG_OK;
}

/* ---- arenas ---------------------------------------------------------------- */

struct dg_arena {
	dg_device *dev;
	dg_dptr base;   /* one dg_malloc allocation, capacity bytes */
	size_t capacity;
	size_t used;    /* bytes from base handed out, padding included */
};

dg_status dg_arena_create(dg_device *dev, size_t bytes, dg_arena **out)
{
	dg_arena *a;
	dg_status st;

	if (!out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_arena_create: out is NULL")
			   : DG_ERR_INVALID_ARG;
	*out = NULL;
	st = dg__dev_enter(dev);
	if (st)
		return st;
	a = calloc(1, sizeof(*a));
	if (!a)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory creating an arena");
	st = dg_malloc(dev, bytes, &a->base);
	if (st) {
		free(a);
		return st;
	}
	a->dev = dev;
	a->capacity = bytes;
	*out = a;
	return DG_OK;
}

void dg_arena_destroy(dg_arena *arena)
{
	if (!arena)
		return;
	(void)dg_free(arena->dev, arena->base);
	free(arena);
}

dg_status dg_arena_alloc(dg_arena *arena, size_t bytes, size_t align, dg_dptr *out)
{
	if (out)
		*out = 0;
	if (!arena)
		return DG_ERR_INVALID_ARG;
	dg_device *dev = arena->dev;
	if (!out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_arena_alloc: out is NULL");
	if (align == 0)
		align = 256;
	if (align < 16 || (align & (align - 1)))
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_arena_alloc: align=%zu must be a power of two, at least 16",
				    align);
	/* Align the address, not the offset: base is only 256-aligned. */
	uint64_t addr = arena->base + arena->used;
	uint64_t aligned = (addr + (align - 1)) & ~(uint64_t)(align - 1);
	size_t off = (size_t)(aligned - arena->base);
	if (off > arena->capacity || bytes > arena->capacity - off)
		return dg__dev_fail(dev, DG_ERR_NOMEM,
				    "arena full: %zu bytes (aligned to %zu) asked for, %zu of %zu bytes used, %zu free; create the arena larger",
				    bytes, align, arena->used, arena->capacity,
				    arena->capacity - arena->used);
	arena->used = off + bytes;
	*out = aligned;
	return DG_OK;
}

void dg_arena_reset(dg_arena *arena)
{
	if (arena)
		arena->used = 0;
}

size_t dg_arena_used(const dg_arena *arena)
{
	return arena ? arena->used : 0;
}

size_t dg_arena_capacity(const dg_arena *arena)
{
	return arena ? arena->capacity : 0;
}

/* ---- events ---------------------------------------------------------------- */

struct dg_event {
	dg_device *dev;
	CUevent ev;
};

dg_status dg_event_create(dg_device *dev, dg_event **out)
{
	dg_status st;

	if (out)
		*out = NULL;
	st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!out)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_event_create: out is NULL");
	dg_event *e = calloc(1, sizeof(*e));
	if (!e)
		return dg__dev_fail(dev, DG_ERR_NOMEM, "out of memory creating an event");
	CUresult rc = dev->cu->EventCreate(&e->ev, CU_EVENT_DEFAULT);
	if (rc != CUDA_SUCCESS) {
		free(e);
		return dg__dev_cu_fail(dev, rc, "cuEventCreate");
	}
	e->dev = dev;
	*out = e;
	return DG_OK;
}

void dg_event_destroy(dg_event *ev)
{
	if (!ev)
		return;
	if (dg__dev_enter(ev->dev) == DG_OK)
		(void)ev->dev->cu->EventDestroy(ev->ev);
	free(ev);
}

dg_status dg_event_record(dg_event *ev)
{
	if (!ev)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg__dev_enter(ev->dev);
	if (st)
		return st;
	CUresult rc = ev->dev->cu->EventRecord(ev->ev, dg__dev_stream(ev->dev));
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(ev->dev, rc, "cuEventRecord");
	return DG_OK;
}

dg_status dg_event_wait(dg_event *ev)
{
	if (!ev)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg__dev_enter(ev->dev);
	if (st)
		return st;
	CUresult rc = ev->dev->cu->StreamWaitEvent(dg__dev_stream(ev->dev), ev->ev, 0);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(ev->dev, rc, "cuStreamWaitEvent");
	return DG_OK;
}

dg_status dg_stream_create(dg_device *dev, void **out)
{
	if (!out)
		return dev ? dg__dev_fail(dev, DG_ERR_INVALID_ARG, "dg_stream_create: out is NULL")
			   : DG_ERR_INVALID_ARG;
	*out = NULL;
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	CUstream s = NULL;
	CUresult rc = dev->cu->StreamCreate(&s, CU_STREAM_NON_BLOCKING);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuStreamCreate");
	*out = (void *)s;
	return DG_OK;
}

void dg_stream_destroy(dg_device *dev, void *stream)
{
	if (stream && dg__dev_enter(dev) == DG_OK)
		(void)dev->cu->StreamDestroy((CUstream)stream);
}

dg_status dg_event_synchronize(dg_event *ev)
{
	if (!ev)
		return DG_ERR_INVALID_ARG;
	dg_status st = dg__dev_enter(ev->dev);
	if (st)
		return st;
	CUresult rc = ev->dev->cu->EventSynchronize(ev->ev);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(ev->dev, rc,
				       "cuEventSynchronize (a kernel before the event failed)");
	return DG_OK;
}

dg_status dg_event_elapsed_ms(const dg_event *start, const dg_event *end, float *ms)
{
	if (!start || !end)
		return DG_ERR_INVALID_ARG;
	dg_device *dev = start->dev;
	dg_status st = dg__dev_enter(dev);
	if (st)
		return st;
	if (!ms || end->dev != dev)
		return dg__dev_fail(dev, DG_ERR_INVALID_ARG,
				    "dg_event_elapsed_ms: %s", !ms ? "ms is NULL"
								   : "the events belong to two devices");
	CUresult rc = dev->cu->EventElapsedTime(ms, start->ev, end->ev);
	if (rc != CUDA_SUCCESS)
		return dg__dev_cu_fail(dev, rc, "cuEventElapsedTime");
	return DG_OK;
}
