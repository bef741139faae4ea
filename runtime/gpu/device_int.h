/*
 * The device handle's insides, shared by the files of runtime/gpu/ alone:
 * thread.c (each thread's message and stream, the entry check), device.c
 * (open, close, memory, events), kernel.c (the kernel map, builds,
 * launches, tile resolution), bundle.c (bundles into the map) and graph.c
 * (capture and replay). Nothing outside runtime/gpu/ includes it; the
 * layers above use runtime/gpu/gpu_int.h and the public headers.
 *
 * Locking: dev->mu guards the kernel map (entries and modules), the JIT
 * context pool, the counters and each kernel's smem_opted; dev->tune_mu
 * the tuning DB; dev->thr_mu the list of thread records. Builds (plan,
 * render, NVRTC, module load) run outside dev->mu; threads that ask for a
 * spec being built wait on dev->cv.
 */
#ifndef DG_RUNTIME_GPU_DEVICE_INT_H
#define DG_RUNTIME_GPU_DEVICE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/runtime.h"
#include "dragon/tune.h"
#include "runtime/gpu/cu_loader.h"

#define DG__MSG_SIZE 8192

struct dg__module;

struct dg_kernel {
	struct dg__module *mod;
	char *entry;
	CUfunction fn;
	int block_threads; /* from the plan; 0: the launch says */
	int dyn_smem;      /* from the plan */
	int static_smem;
	int regs;
	int local_bytes;
	int max_threads;
	int smem_opted;    /* MAX_DYNAMIC_SHARED_SIZE_BYTES set so far (dev->mu) */
	int cluster[3];    /* the blocks of a cluster the kernel was compiled for
			    * (__cluster_dims__; 1, 1, 1 without): a launch's
			    * grid is a multiple of them */
};

typedef enum dg__mod_state {
	DG__MOD_BUILDING,
	DG__MOD_READY,
	DG__MOD_FAILED,
} dg__mod_state;

/* One spec's loaded binary: every entry of it as a dg_kernel. */
typedef struct dg__module {
	struct dg__module *next; /* every module of the device (dev->modules) */
	dg_spec spec;               /* what it was built for: the tile resolved */
	char key[DG_SPEC_TEXT_MAX]; /* spec's canonical text */
	dg__mod_state state;
	int waiters;   /* threads waiting for this build (dev->mu) */
	dg_status st;  /* FAILED: why, and err the message */
	char *err;
	CUlibrary lib; /* the library API, or ... */
	CUmodule cumod; /* ... the module API */
	dg_kernel *kernels;
	int n_kernels;
	dg_kernel_origin origin;
	double load_ms;
} dg__module;

/* The kernel map: the canonical text of a spec as asked for (an auto tile)
 * or as resolved → its module. Several entries may name one module. */
typedef struct dg__kentry {
	struct dg__kentry *next; /* hash chain */
	uint64_t hash;
	char key[DG_SPEC_TEXT_MAX];
	dg__module *mod;
} dg__kentry;

/* A thread's state on one device: its message and its stream. It is on
 * two lists: the device's (under thread.c's lock; close walks it) and
 * its thread's (that thread's alone; the thread frees its records when it
 * exits, and those of a closed device on its next lookup). */
typedef struct dg__thread {
	struct dg__thread *next, *prev; /* the device's list */
	struct dg__thread *mine;        /* the thread's list */
	_Atomic(struct dg_device *) dev; /* NULL once the device closed */
	CUstream stream;  /* NULL: the device's own stream */
	char text[DG__MSG_SIZE];
} dg__thread;

struct dg_device {
	const dg__cu *cu;       /* NULL when open failed before loading */
	dg_status init_status;  /* open's failure, repeated by every call */
	char init_msg[1024];
	int ordinal;
	CUdevice cudev;
	CUcontext ctx;          /* the primary context, retained */
	bool ctx_retained;
	CUstream own_stream;    /* created at open, non-blocking */
	dg_device_info info;
	int max_grid[3], max_block[3];

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
	dg__kentry **buckets;
	size_t n_buckets, n_entries;
	dg__module *modules;    /* every module, built or loaded */
	dg_device_stats stats;  /* but its allocated and peak_allocated: */
	/* The bytes dg_malloc holds now (dg_free's taken off) and the most
	 * it held since open or since dg__dev_mem_mark. */
	_Atomic size_t mem_live, mem_high;

	/* The tuning DB (kernel.c), read at the first auto tile and kept
	 * until close; tune_mu guards both fields (not dev->mu: reading the
	 * records must not stall kernel lookups). */
	pthread_mutex_t tune_mu;
	bool tune_loaded;
	struct dg_tune_db *tune_db; /* NULL: none (or it could not be made) */

	/* The records of the threads that use the device and have not
	 * exited (thread.c); thr_shared when a record could not be made. */
	dg__thread *threads;
	size_t n_threads;
	dg__thread thr_shared;
};

/* ---- thread.c ------------------------------------------------------------- */

/* Checks dev is usable (non-NULL, opened) and makes its context current
 * on the calling thread; the message is on dev on failure. */
dg_status dg__dev_enter(dg_device *dev);

/* CUDA failure of `call` → status, message on dev. */
dg_status dg__dev_cu_fail(dg_device *dev, CUresult rc, const char *call);

/* The calling thread's record on dev, made on first use (never NULL). */
dg__thread *dg__dev_thread(dg_device *dev);

/* The stream the calling thread's work goes to. */
CUstream dg__dev_stream(dg_device *dev);

/* Lets go of every thread record (device.c, at close): the calling
 * thread's are freed, the others' freed by their threads. */
void dg__dev_threads_destroy(dg_device *dev);

/* ---- kernel.c ------------------------------------------------------------- */

/* Unloads every module and frees the map (called by dg_device_close with
 * the context current). */
void dg__dev_kernels_destroy(dg_device *dev);

/* Frees the tuning DB (called by dg_device_close). */
void dg__dev_tune_destroy(dg_device *dev);

/*
 * Puts a ready binary into the map under spec's canonical text (spec: the
 * tile resolved), as a bundle loads it: image (a cubin or PTX), its entry
 * names with their block sizes and dynamic shared memory. A spec already
 * in the map is left as it is (*added false). Runs with the context
 * current; the message is in err.
 */
dg_status dg__dev_module_add(dg_device *dev, const dg_spec *spec, const void *image,
			     char *const *entries, const int *threads, const int *smem,
			     int n_entries, dg_kernel_origin origin, bool *added, char *err,
			     size_t err_size);

#endif
