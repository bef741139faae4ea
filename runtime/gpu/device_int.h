/*
 * The device handle's insides, shared by runtime/gpu/device.c (context,
 * stream, memory, messages) and runtime/gpu/kernel.c (spec → loaded kernel
 * map, launch). Private to those two files and the GPU tests.
 *
 * Locking: dev->mu guards the kernel map, the JIT context pool, the
 * build counter, the scratch slots and each kernel's smem_opted;
 * dev->tune_mu the tuning DB. Builds
 * (render, NVRTC, module load) run outside it; threads that ask for a
 * spec being built wait on dev->cv.
 */
#ifndef DG_RUNTIME_DEVICE_INT_H
#define DG_RUNTIME_DEVICE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/runtime.h"
#include "runtime/gpu/cu_loader.h"

#define DG__SCRATCH_SLOTS 4
#define DG__MSG_SIZE 8192

struct dg__module;

struct dg_kernel {
	struct dg__module *mod;
	char *entry;
	CUfunction fn;
	int block_threads; /* from the template; 0: the launch says */
	int dyn_smem;      /* from the template */
	int static_smem;
	int regs;
	int local_bytes;
	int max_threads;
	int smem_opted;    /* MAX_DYNAMIC_SHARED_SIZE_BYTES set so far (dev->mu) */
};

typedef enum dg__mod_state {
	DG__MOD_BUILDING,
	DG__MOD_READY,
	DG__MOD_FAILED,
} dg__mod_state;

/* One spec's loaded binary: every entry of it as a dg_kernel. */
typedef struct dg__module {
	struct dg__module *next; /* hash chain */
	uint64_t hash;
	char key[DG_SPEC_TEXT_MAX]; /* canonical spec, tile resolved */
	dg__mod_state state;
	int waiters;   /* threads waiting for this build (dev->mu) */
	dg_status st;  /* FAILED: why, and err the message */
	char *err;
	CUlibrary lib; /* the library API, or ... */
	CUmodule cumod; /* ... the module API */
	dg_kernel *kernels;
	int n_kernels;
	bool cache_hit;
	double load_ms;
} dg__module;

/* A thread's message buffer on one device (kept in a list so close frees
 * the buffers of every thread, living or gone). */
typedef struct dg__msg {
	struct dg__msg *next;
	char text[DG__MSG_SIZE];
} dg__msg;

struct dg_device {
	const dg__cu *cu;       /* NULL when open failed before loading */
	dg_status init_status;  /* open's failure, repeated by every call */
	char init_msg[1024];
	int ordinal;
	CUdevice cudev;
	CUcontext ctx;          /* the primary context, retained */
	bool ctx_retained;
	CUstream own_stream;    /* created at open, non-blocking */
	CUstream stream;        /* where work goes: own_stream or the user's */
	dg_device_info info;
	int max_grid[3], max_block[3], max_block_threads;

	/* JIT: the context made at open (dg_device_jit) and a pool of idle
	 * ones; a build takes one, so builds of different specs overlap. */
	char *jit_cache_dir, *jit_template_dir;
	dg_ctx_opts jit_opts;   /* points at the copies above */
	dg_ctx *jit;
	dg_ctx **jit_all;       /* every context made, for close */
	size_t n_jit_all;
	dg_ctx **jit_idle;
	size_t n_jit_idle;
	size_t jit_cap;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	dg__module **buckets;
	size_t n_buckets, n_modules;
	size_t n_kernels;       /* kernels of READY modules */
	size_t n_builds;        /* modules built (compiled or cached + loaded) */

	/* The tuning DB (kernel.c), read at the first auto tile and kept
	 * until close; tune_mu guards both fields (not dev->mu: reading the
	 * records must not stall kernel lookups of explicit tiles). */
	pthread_mutex_t tune_mu;
	bool tune_loaded;
	struct dg_tune_db *tune_db; /* NULL: none (or it could not be made) */

	dg_dptr scratch[DG__SCRATCH_SLOTS];
	size_t scratch_size[DG__SCRATCH_SLOTS];

	/* Messages: one buffer a thread (pthread key); msg_shared when the
	 * key or a buffer could not be made. */
	pthread_key_t msg_key;
	bool msg_key_ok;
	pthread_mutex_t msg_mu;
	dg__msg *msgs;
	char msg_shared[DG__MSG_SIZE];
};

/* Checks dev is usable (non-NULL, opened) and makes its context current
 * on the calling thread; the message is on dev on failure. */
dg_status dg__dev_enter(dg_device *dev);

/* CUDA failure of `call` → status, message on dev. */
dg_status dg__dev_cu_fail(dg_device *dev, CUresult rc, const char *call);

/* Unloads every module (kernel.c; called by dg_device_close with the
 * context current). */
void dg__dev_kernels_destroy(dg_device *dev);

/* The JIT context pool (kernel.c): a context for one build, and back. */
dg_status dg__dev_jit_take(dg_device *dev, dg_ctx **out, char *err,
			   size_t err_size);
void dg__dev_jit_give(dg_device *dev, dg_ctx *ctx);

/* Frees the tuning DB (kernel.c; called by dg_device_close). */
void dg__dev_tune_destroy(dg_device *dev);

/* Modules built on dev so far (a spec asked for by many threads at once
 * counts once): for tests. */
size_t dg__dev_build_count(dg_device *dev);

#endif
