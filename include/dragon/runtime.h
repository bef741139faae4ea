/*
 * dragon — the GPU runtime: device, streams, memory, kernels, launch.
 *
 * The CUDA driver is opened with dlopen("libcuda.so.1") the first time a
 * device is asked for; a machine without a driver or without a device gets
 * DG_ERR_NO_DEVICE with a message saying which, never a crash, and every
 * other part of dragon (specs, codegen, NVRTC, cache) works without one.
 *
 * A dg_device is one GPU's primary context (the one the CUDA runtime,
 * cuBLAS and PyTorch use, so pointers interoperate), a stream, a JIT
 * context (dg_ctx) and an in-memory map spec → loaded kernel in front of
 * the disk cache: the first request for a spec renders, compiles, caches
 * and loads it; later ones cost a hash lookup. Concurrent requests for one
 * spec from several threads compile it once (the others wait for it).
 * Launches go to the device's current stream (dg_device_set_stream).
 *
 * Device pointers are dg_dptr (CUdeviceptr). Messages: every call that
 * fails leaves a message on the device (dg_device_errmsg), per thread.
 */
#ifndef DRAGON_RUNTIME_H
#define DRAGON_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jit.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t dg_dptr; /* a device address (CUdeviceptr) */

typedef struct dg_device dg_device;

typedef struct dg_device_opts {
	int ordinal;            /* CUDA device number; default 0 */
	const dg_ctx_opts *jit; /* cache dir, templates; NULL: defaults */
} dg_device_opts;

typedef struct dg_device_info {
	char name[128];
	int ordinal;
	int sm;          /* 90 for sm_90 */
	int sm_count;    /* multiprocessors */
	int driver_version;      /* 13000 for 13.0 */
	size_t total_mem;
	int smem_optin;  /* most shared memory a block may opt in to, bytes */
	int clock_khz;   /* SM clock */
	int l2_bytes;
} dg_device_info;

/*
 * Number of CUDA devices. No driver library, or a driver that finds no
 * device, is *n = 0 and DG_OK (msg, if non-NULL, says why there are none);
 * a driver that fails otherwise is DG_ERR_CUDA with its message.
 */
dg_status dg_device_count(int *n, char *msg, size_t msg_size);

/*
 * Opens a device. Like dg_ctx_create, *out is set even on failure (unless
 * out is NULL or memory ran out), so dg_device_errmsg can say why; close it
 * either way. DG_ERR_NO_DEVICE: no driver or no such device.
 */
dg_status dg_device_open(dg_device **out, const dg_device_opts *opts);
void dg_device_close(dg_device *dev); /* NULL is fine */
const char *dg_device_errmsg(const dg_device *dev);
dg_status dg_device_info_get(dg_device *dev, dg_device_info *info);
/* The JIT context kernels are compiled with (for tools and tests). */
dg_ctx *dg_device_jit(dg_device *dev);

/* The stream launches and copies go to: a CUstream, or NULL for the
 * device's own stream (created at open, non-blocking). */
dg_status dg_device_set_stream(dg_device *dev, void *cu_stream);
void *dg_device_stream(dg_device *dev);
/* Waits for the device's stream. */
dg_status dg_device_sync(dg_device *dev);

/* ---- memory ---------------------------------------------------------------
 * Allocations are 256-byte aligned (every kernel's 16-byte alignment rule
 * holds for whole allocations). Copies and memset are ordered on the
 * device's stream; the _sync forms of copies to the host wait for it. */
dg_status dg_malloc(dg_device *dev, size_t bytes, dg_dptr *out);
dg_status dg_free(dg_device *dev, dg_dptr ptr); /* 0 is fine */
dg_status dg_memcpy_htod(dg_device *dev, dg_dptr dst, const void *src,
			 size_t bytes);
dg_status dg_memcpy_dtoh(dg_device *dev, void *dst, dg_dptr src,
			 size_t bytes); /* waits for the stream */
dg_status dg_memcpy_dtod(dg_device *dev, dg_dptr dst, dg_dptr src,
			 size_t bytes);
dg_status dg_memset8(dg_device *dev, dg_dptr dst, uint8_t value,
		     size_t bytes);

/*
 * Arena: one allocation handed out by bumping an offset (parameters,
 * gradients, activations), so pointers are stable for CUDA graphs and a
 * whole step's activations are released by one reset.
 */
typedef struct dg_arena dg_arena;
dg_status dg_arena_create(dg_device *dev, size_t bytes, dg_arena **out);
void dg_arena_destroy(dg_arena *arena); /* NULL is fine */
/* align: a power of two, at least 16 (0: 256). DG_ERR_NOMEM with the
 * sizes in the message when the arena is full. */
dg_status dg_arena_alloc(dg_arena *arena, size_t bytes, size_t align,
			 dg_dptr *out);
void dg_arena_reset(dg_arena *arena);
size_t dg_arena_used(const dg_arena *arena);
size_t dg_arena_capacity(const dg_arena *arena);

/* ---- kernels -------------------------------------------------------------
 * A dg_kernel is one entry point of one spec's loaded module. It belongs
 * to the device and stays valid until dg_device_close. */
typedef struct dg_kernel dg_kernel;

typedef struct dg_kernel_info {
	const char *entry;
	char canonical[DG_SPEC_TEXT_MAX];
	int block_threads;  /* from the template (0: the launch must say) */
	int dyn_smem;       /* dynamic shared memory the template asks for */
	int static_smem;    /* from the cubin */
	int regs;           /* registers a thread */
	int local_bytes;    /* local memory a thread (spills) */
	int max_threads;    /* most threads a block can have */
	bool cache_hit;     /* the binary came from the disk cache */
	double load_ms;     /* render + compile/cache + load, first request */
} dg_kernel_info;

/*
 * The kernel `entry` of spec (NULL: the spec's first entry). JIT at first
 * use; an auto tile is resolved first (tuning DB, else the heuristic
 * default). Kernels with more than 48 KiB of dynamic shared memory are
 * opted in here.
 */
dg_status dg_kernel_get(dg_device *dev, const dg_spec *spec,
			const char *entry, dg_kernel **out);
dg_status dg_kernel_info_get(const dg_kernel *k, dg_kernel_info *info);

typedef struct dg_launch {
	unsigned grid[3];
	unsigned block[3];  /* 0,0,0: the template's block_threads */
	unsigned smem;      /* 0: the template's dyn_smem */
} dg_launch;

/* Launches on the device's current stream. args as cuLaunchKernel's
 * kernelParams. Checks the grid and block against the device's limits
 * first (message names the dimension). */
dg_status dg_kernel_launch(dg_device *dev, const dg_kernel *k,
			   const dg_launch *launch, void **args);

/* Number of kernels loaded (distinct spec+entry). */
size_t dg_device_kernel_count(const dg_device *dev);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_RUNTIME_H */
