/*
 * dragon — the GPU runtime: device, streams, memory, kernels, events, graphs.
 *
 * The CUDA driver is opened with dlopen("libcuda.so.1") the first time a
 * device is asked for; a machine without a driver or without a device gets
 * DG_ERR_NO_DEVICE with a message saying which, never a crash, and every
 * other part of dragon (specs, codegen, NVRTC, cache) works without one.
 *
 * A dg_device is one GPU's primary context (the one the CUDA runtime,
 * cuBLAS and PyTorch use, so pointers interoperate; a call that touches
 * the GPU leaves it current on the calling thread, so cuBLAS or the
 * driver can be called next with no context set-up), a stream, a JIT
 * context (dg_ctx) and an in-memory map spec → loaded kernel in front of
 * the disk cache: the first request for a spec plans, renders, compiles,
 * caches and loads it (or finds it in a loaded bundle: dg_device_load_bundle,
 * $DRAGON_KERNELS); later ones cost a hash lookup. Concurrent requests for
 * one spec from several threads compile it once (the others wait for it).
 * Work goes to the calling thread's stream (dg_device_set_stream), as
 * PyTorch's current stream does; nothing on a launch path allocates,
 * frees or synchronizes, so a sequence of ops captures into a CUDA graph
 * (dg_graph_begin).
 *
 * Device pointers are dg_dptr (CUdeviceptr). Messages: every call that
 * fails leaves a message on the device (dg_device_errmsg), per thread.
 */
#ifndef DRAGON_RUNTIME_H
#define DRAGON_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
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
	int max_block_threads; /* threads a block */
	int regs_per_block;
} dg_device_info;

/*
 * Number of CUDA devices. No driver library, or a driver that finds no
 * device, is *n = 0 and DG_OK (msg, if non-NULL, says why there are none);
 * a driver that fails otherwise is DG_ERR_CUDA with its message.
 */
DG_API dg_status dg_device_count(int *n, char *msg, size_t msg_size);

/*
 * Opens a device. Like dg_ctx_create, *out is set even on failure (unless
 * out is NULL or memory ran out), so dg_device_errmsg can say why; close it
 * either way. DG_ERR_NO_DEVICE: no driver or no such device.
 */
DG_API dg_status dg_device_open(dg_device **out, const dg_device_opts *opts);
DG_API void dg_device_close(dg_device *dev); /* NULL is fine */
DG_API const char *dg_device_errmsg(const dg_device *dev);
DG_API dg_status dg_device_info_get(dg_device *dev, dg_device_info *info);
/* The JIT context kernels are compiled with (for tools and tests). */
DG_API dg_ctx *dg_device_jit(dg_device *dev);

/* The stream the calling thread's launches and copies go to: a CUstream
 * (PyTorch's current stream, say), DG_STREAM_LEGACY for the legacy
 * default stream, or NULL for the device's own stream (created at open,
 * non-blocking: it does not wait for the default stream, nor it for
 * dragon). Per thread: another thread keeps its own. */
DG_API dg_status dg_device_set_stream(dg_device *dev, void *cu_stream);
/* The legacy default stream (the driver's CU_STREAM_LEGACY): what a
 * framework's stream handle 0 means — PyTorch's default stream is it, so
 * a caller passing torch.cuda.current_stream() passes this for handle 0,
 * never NULL (which would be dragon's own stream, racing torch's work). */
#define DG_STREAM_LEGACY ((void *)0x1)
DG_API void *dg_device_stream(dg_device *dev); /* the calling thread's */
/* Waits for the calling thread's stream. */
DG_API dg_status dg_device_sync(dg_device *dev);

/* Where the device's kernels came from, since open, and the device
 * memory dragon holds on it. */
typedef struct dg_device_stats {
	size_t kernels;   /* entries loaded (distinct spec + entry) */
	size_t modules;   /* specs loaded */
	size_t compiled;  /* specs compiled by NVRTC */
	size_t cached;    /* specs read from the disk cache */
	size_t bundled;   /* specs loaded from bundles */
	size_t planned;   /* specs planned to find their kernel (no compile) */
	size_t allocated;      /* bytes dg_malloc holds now (not yet dg_free'd) */
	size_t peak_allocated; /* the most it held at once (PyTorch's
				  max_memory_allocated; the driver's own
				  memory, modules and graphs not counted) */
} dg_device_stats;
DG_API dg_status dg_device_stats_get(dg_device *dev, dg_device_stats *out);

/*
 * Loads the kernels of a `dragon-gen build` bundle (DIR/manifest.json and
 * its cubins) into the device's kernel map, so a process whose kernels are
 * all in it compiles nothing. Every file is checked against the manifest
 * (size, SHA-256, the cubin's SM) before it is loaded; a manifest made by
 * another generator or other templates is refused (its kernels would not
 * match what this library plans). Kernels for another SM than the device's
 * are skipped and counted. Specs already in the map are kept. *loaded
 * (may be NULL) gets how many specs were added. $DRAGON_KERNELS=DIR (':'
 * joins several) loads bundles at dg_device_open, a failure there failing
 * the open.
 */
DG_API dg_status dg_device_load_bundle(dg_device *dev, const char *dir, size_t *loaded);

/* ---- building a bundle (no device needed) -----------------------------------
 * What `dragon-gen build` makes and dg_device_load_bundle loads: one
 * <op>-<key16>.cubin (.ptx past what NVRTC emits SASS for) per kernel and
 * manifest.json (dragon/manifest.h), built with NVRTC through the kernel
 * cache. */

/* The default build set: for every op, the product of its op table's
 * build lists at the op's default shape (dg_op_info.build), each
 * combination checked as a user's spec is and those an op's rules or its
 * template refuse left out: every kernel of a BDH training step, forward
 * and backward. *out (malloc'd, the caller frees it) gets *n specs,
 * distinct, normalized, tiles auto. */
DG_API dg_status dg_bundle_default_specs(dg_spec **out, size_t *n, char *msg, size_t msg_size);

/* Which step of a build failed (dg_bundle_summary.step). */
typedef enum dg_bundle_step {
	DG_BUNDLE_STEP_NONE,    /* nothing failed */
	DG_BUNDLE_STEP_ARGS,    /* the options: the folder, a spec, the device */
	DG_BUNDLE_STEP_PLAN,    /* resolving the specs for the device */
	DG_BUNDLE_STEP_FOLDER,  /* making the folder, or its private temp folder */
	DG_BUNDLE_STEP_COMPILE, /* a kernel: its compile, check or file */
	DG_BUNDLE_STEP_PUBLISH, /* moving the files in, the manifest */
} dg_bundle_step;

struct dg_tune_db;

typedef struct dg_bundle_opts {
	const char *out;        /* the bundle folder; made with its parents if missing */
	const dg_spec *specs;   /* n_specs specs; NULL: the default build set */
	size_t n_specs;
	int jobs;               /* kernels compiled at a time; 0: the online CPUs */
	const dg_ctx_opts *jit; /* each compiling thread's JIT context (cache,
				 * templates); NULL: defaults */
	/* The tuning records auto tiles resolve through; NULL: opened as the
	 * runtime opens them ($DRAGON_TUNE_DB, else the cache's tune/, the
	 * built-in records below). */
	const struct dg_tune_db *tune_db;
	/* The device the bundle is for, with its SM (10..999): auto tiles
	 * resolve for it as the runtime resolves them there. NULL: for each
	 * spec's SM, the one device the records name (none when they name
	 * none or several); "": no device (the templates' defaults). */
	const char *device;
	int sm;
	/* Also copy the records used into DIR/tune/, and say in the
	 * manifest's "tuning" array where each auto tile came from. */
	bool tuned;
	/* Called, one call at a time, from the compiling threads:
	 * progress(user, 0, total, NULL) before the first kernel, then once
	 * a kernel with its file's name. May be NULL. */
	void (*progress)(void *user, size_t done, size_t total, const char *file);
	/* Lines worth a user's eye (a tuning record skipped); detail 1: what
	 * a verbose listing shows (each auto tile's choice). May be NULL. */
	void (*note)(void *user, int detail, const char *line);
	/* Polled between kernels: non-zero stops the build
	 * (DG_ERR_INTERRUPTED, the folder as it was). May be NULL. */
	int (*stop)(void *user);
	void *user; /* handed to the three above */
} dg_bundle_opts;

typedef struct dg_bundle_summary {
	size_t specs;      /* specs asked for (the default set's, expanded) */
	size_t dropped;    /* the default set: combinations left out */
	size_t kernels;    /* kernels built: specs that resolve alike are one */
	size_t cache_hits; /* of them, found in the kernel cache */
	int jobs;          /* threads that compiled */
	double wall_ms;    /* the compile and the publish */
	char device[128];  /* the device the bundle is for; "" none */
	int sm;            /* its SM; 0 likewise */
	dg_bundle_step step;            /* on failure: where */
	char failed[DG_SPEC_TEXT_MAX];  /* on a kernel's failure: its spec (what runs) */
} dg_bundle_summary;

/*
 * Compiles the specs (or the default build set), each auto tile resolved
 * for the device as the runtime resolves it there and specs that resolve
 * to one kernel built once, into the folder opts->out: kernels, then
 * manifest.json published whole (temp file, fsync, rename, fsync of the
 * folder). The folder changes only if every kernel builds: they are
 * compiled into a private temp folder inside it and moved in once all
 * passed dg_cubin_check, the manifest last (the commit); files an earlier
 * bundle there listed and this one does not are then removed. On any
 * failure before the commit the folder is as it was (and folders this
 * call made are gone). summary (may be NULL) says what was built, or
 * where it failed.
 *
 * DG_ERR_INVALID_ARG: no folder, an empty list (specs non-NULL, n_specs
 * 0), a device without an SM; DG_ERR_INVALID_SPEC: a spec the op's rules,
 * NVRTC's arch range or its template refuse ("specs[2]: latent=8190:
 * ..."); DG_ERR_TEMPLATE, DG_ERR_COMPILE: a kernel that does not render
 * or compile (msg: one line, the compile's log on the lines after it);
 * DG_ERR_IO: a file or folder, named; DG_ERR_INTERRUPTED: opts->stop.
 */
DG_API dg_status dg_bundle_build(const dg_bundle_opts *opts, dg_bundle_summary *summary, char *msg,
			  size_t msg_size);

/* ---- memory ---------------------------------------------------------------
 * Allocations are 256-byte aligned (every kernel's 16-byte alignment rule
 * holds for whole allocations). Copies and memset are ordered on the
 * device's stream; the _sync forms of copies to the host wait for it. */
DG_API dg_status dg_malloc(dg_device *dev, size_t bytes, dg_dptr *out);
DG_API dg_status dg_free(dg_device *dev, dg_dptr ptr); /* 0 is fine */
DG_API dg_status dg_memcpy_htod(dg_device *dev, dg_dptr dst, const void *src,
				size_t bytes);
DG_API dg_status dg_memcpy_dtoh(dg_device *dev, void *dst, dg_dptr src,
				size_t bytes); /* waits for the stream */
DG_API dg_status dg_memcpy_dtod(dg_device *dev, dg_dptr dst, dg_dptr src,
				size_t bytes);
/* As dg_memcpy_dtoh without the wait: dst must be page-locked
 * (dg_host_alloc) and stay valid until the copy has run (an event recorded
 * after it says when). */
DG_API dg_status dg_memcpy_dtoh_async(dg_device *dev, void *dst, dg_dptr src, size_t bytes);
/* Page-locked host memory (cuMemHostAlloc), what an asynchronous copy to
 * the host needs; dg_host_free releases it (NULL is fine). */
DG_API dg_status dg_host_alloc(dg_device *dev, size_t bytes, void **out);
DG_API void dg_host_free(dg_device *dev, void *p);
DG_API dg_status dg_memset8(dg_device *dev, dg_dptr dst, uint8_t value,
			    size_t bytes);
/* The device's free and total memory now (cuMemGetInfo), bytes. */
DG_API dg_status dg_device_mem_info(dg_device *dev, size_t *free_bytes, size_t *total_bytes);

/* ---- kernels -------------------------------------------------------------
 * A dg_kernel is one entry point of one spec's loaded module: the ops
 * fetch and launch them; here a program asks which kernel a spec gets,
 * where it came from and what it uses. It belongs to the device and stays
 * valid until dg_device_close. */
typedef struct dg_kernel dg_kernel;

typedef enum dg_kernel_origin {
	DG_KERNEL_COMPILED, /* NVRTC, in this process */
	DG_KERNEL_CACHED,   /* the disk cache */
	DG_KERNEL_BUNDLED,  /* a bundle (dg_device_load_bundle) */
} dg_kernel_origin;

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
	dg_kernel_origin origin;
	double load_ms;     /* render + compile/cache + load, first request */
	int cluster[3];     /* blocks of a cluster along x, y, z (the kernel's
			     * __cluster_dims__; 1, 1, 1 without): a launch's
			     * grid must be a multiple of them */
} dg_kernel_info;

/*
 * The kernel `entry` of spec (NULL: the spec's first entry). JIT at first
 * use; an auto tile is resolved first (the tuning DB, else the template's
 * default for this device: dg_tune_resolve). A spec already asked for is
 * a hash lookup: no planning, no allocation. Kernels with more than 48 KiB
 * of dynamic shared memory are opted in here.
 */
DG_API dg_status dg_kernel_get(dg_device *dev, const dg_spec *spec,
			       const char *entry, dg_kernel **out);
DG_API dg_status dg_kernel_info_get(const dg_kernel *k, dg_kernel_info *info);


/* ---- events --------------------------------------------------------------
 * Events on the calling thread's stream. Messages on the device. */
typedef struct dg_event dg_event;

DG_API dg_status dg_event_create(dg_device *dev, dg_event **out);
DG_API void dg_event_destroy(dg_event *ev); /* NULL is fine */
/* Records ev on the calling thread's stream. */
DG_API dg_status dg_event_record(dg_event *ev);
/* Waits until the work before ev's last record has run. */
DG_API dg_status dg_event_synchronize(dg_event *ev);
/* The calling thread's stream waits (on the device, the host goes on)
 * for the work before ev's last record: a fork or a join between two
 * streams, which a capture records as an edge of the graph. */
DG_API dg_status dg_event_wait(dg_event *ev);

/* A stream of dev's own beside the device's (non-blocking), for work that
 * overlaps the calling thread's (dg_device_set_stream to queue on it).
 * dg_stream_destroy after the work on it is done or joined. */
DG_API dg_status dg_stream_create(dg_device *dev, void **out);
DG_API void dg_stream_destroy(dg_device *dev, void *stream); /* NULL is fine */
/* Milliseconds between two recorded (and completed) events. */
DG_API dg_status dg_event_elapsed_ms(const dg_event *start, const dg_event *end,
				     float *ms);

/* ---- CUDA graphs ---------------------------------------------------------
 * dg_graph_begin starts capturing the calling thread's stream (which must
 * not be the legacy default stream; the device's own is fine): the ops and
 * copies that follow are recorded, not run, until dg_graph_end turns them
 * into an executable graph that dg_graph_launch replays on the calling
 * thread's stream. Capture is thread-local: a call on this thread that
 * CUDA forbids during capture fails it (the message names the call), and
 * dg_graph_end then reports that. Pointers in the graph are the ones the
 * ops were given: keep them valid and unchanged while the graph lives. */
typedef struct dg_graph dg_graph;

DG_API dg_status dg_graph_begin(dg_device *dev);
DG_API dg_status dg_graph_end(dg_device *dev, dg_graph **out);
DG_API dg_status dg_graph_launch(dg_graph *g);
DG_API void dg_graph_destroy(dg_graph *g); /* NULL is fine */

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_RUNTIME_H */
