/*
 * What the GPU layer lends the layers above it inside libdragon (the ops,
 * the tuning sweep, the training step): a kernel's spec, its entries and
 * its launch, arenas, the timer of the tuner and the bench, setting the
 * device's message and reading its cached info. Nothing outside libdragon
 * (but its tests and benches) includes it; the device's insides stay in
 * runtime/gpu/device_int.h.
 */
#ifndef DG_RUNTIME_GPU_INT_H
#define DG_RUNTIME_GPU_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/runtime.h"
#include "dragon/tune.h"

/* ---- kernels: what the ops launch with (runtime/gpu/kernel.c) ---------------- */

/* The spec k was built for: the tile and target resolved (ops size their
 * grids and workspaces from it). Valid while the device is open. */
const dg_spec *dg_kernel_spec(const dg_kernel *k);
/* The entries of k's spec (k is one of them): how many, and the i-th. */
int dg_kernel_entry_count(const dg_kernel *k);
const dg_kernel *dg_kernel_entry(const dg_kernel *k, int i); /* NULL out of range */
/* The entry of k's module named `entry`, or NULL where it has none (a
 * template's optional entry: lowrank_fwd's few-rows one, ...). */
const dg_kernel *dg_kernel_entry_named(const dg_kernel *k, const char *entry);

typedef struct dg_launch {
	unsigned grid[3];
	unsigned block[3];  /* 0,0,0: the template's block_threads */
	unsigned smem;      /* 0: the template's dyn_smem */
} dg_launch;

/* Launches on the calling thread's stream. args as cuLaunchKernel's
 * kernelParams. Checks the grid and block against the device's limits
 * first (message names the dimension). */
dg_status dg_kernel_launch(dg_device *dev, const dg_kernel *k,
			   const dg_launch *launch, void **args);

/* What dg_kernel_get does with spec on dev, and why: the device's tuning
 * DB (loaded once, at the first kernel an auto tile asks for) or the
 * heuristic default. */
dg_status dg_device_tile_choice(dg_device *dev, const dg_spec *spec, dg_tune_choice *out);

/* ---- arenas (runtime/gpu/device.c) ------------------------------------------ */

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

/* ---- timing (runtime/gpu/timer.c) -------------------------------------------
 * The one way dragon times a call (the tuner, the bench): warm-up calls,
 * then for each rep a write of a buffer four times the L2 (at least 256
 * MiB, outside the timing, so every rep starts with a cold L2) and a pair
 * of CUDA events around the call, all on the calling thread's stream;
 * the median, p10 and p90 of the reps. */
typedef struct dg_timer dg_timer;

typedef struct dg_timer_opts {
	int warmup;   /* untimed calls first; 0: 3 (negative: none) */
	int reps;     /* timed calls; 0: 25 */
	bool warm_l2; /* do not flush the L2 between reps */
} dg_timer_opts;

typedef struct dg_timing {
	double median_us, p10_us, p90_us, min_us;
	int reps;
} dg_timing;

/* Enqueues one call on the calling thread's stream. */
typedef dg_status (*dg_timed_fn)(void *user);

/* A timer of up to max_reps reps (0: 1000): its events and flush buffer. */
dg_status dg_timer_create(dg_device *dev, int max_reps, dg_timer **out);
void dg_timer_destroy(dg_timer *t); /* NULL is fine */
/* Bytes the timer writes to flush the L2. */
size_t dg_timer_flush_bytes(const dg_timer *t);
/* Times fn (opts may be NULL). A failure of fn is returned as it is (its
 * message on the device); a failure of the timing itself likewise. */
dg_status dg_timer_run(dg_timer *t, const dg_timer_opts *opts, dg_timed_fn fn, void *user,
		       dg_timing *out);

/* ---- the device's message and info ------------------------------------------ */

/* Sets the calling thread's message on dev (printf format) and returns st.
 * dev may be NULL (the message is then dropped). */
dg_status dg__dev_fail(dg_device *dev, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Copies a message (a _check's) onto the device and returns st. */
dg_status dg__dev_fail_msg(dg_device *dev, dg_status st, const char *msg);

/* The device's info, cached at open (dev must be open). */
const dg_device_info *dg__dev_info(const dg_device *dev);

/* The device memory dg_malloc holds now (what dg_free has not given
 * back), which becomes the high-water mark: dg__dev_mem_high is then the
 * most held since this call, as PyTorch's reset_peak_memory_stats and
 * max_memory_allocated. Driver memory (contexts, modules, graphs) is not
 * counted. 0 when dev is not open. */
size_t dg__dev_mem_mark(dg_device *dev);
size_t dg__dev_mem_high(dg_device *dev);

/* How many threads hold a message record on dev now: each holds one from
 * its first call on dev until it exits (runtime/gpu/thread.c). */
size_t dg__dev_thread_count(dg_device *dev);

/* The device's tuning DB (the records of its name and SM: the user's,
 * then the built-in ones), read at the first call; NULL without one. */
const dg_tune_db *dg__dev_tune_db(dg_device *dev);

/* A launch's geometry resolved for kernel k (the block and shared memory
 * it leaves 0 taken from the template) and checked against k and the
 * device's limits, the kernel opted in to its shared memory: what a
 * prepared op keeps, so its launches skip the checks. Message on dev. */
dg_status dg__kernel_geometry(dg_device *dev, const dg_kernel *k, const dg_launch *launch,
			      dg_launch *out);

/* Launches k with a geometry dg__kernel_geometry resolved, on the calling
 * thread's stream (the device's context current). */
dg_status dg__kernel_launch_raw(dg_device *dev, const dg_kernel *k, const dg_launch *l,
				void **args);

/* Makes dev's context current on the calling thread (a launch's first
 * step); fails with the device's open error. */
dg_status dg__dev_enter(dg_device *dev);

/* A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte
 * aligned), which a kernel takes by value as a __grid_constant__
 * parameter (templates/attention_tma.lua's dg_tmap). */
typedef struct dg__tmap {
	_Alignas(64) unsigned char bytes[128];
} dg__tmap;

/* The tiled map of a row-major bf16 tensor of rank 3, dims[0] innermost
 * (elements; rows dims[0]·2 bytes apart, planes dims[0]·dims[1]·2), whose
 * boxes are box[0] x box[1] x 1 elements with the 128-byte swizzle
 * (box[0]·2 <= 128) and zeros past the edges. DG_ERR_UNSUPPORTED when the
 * driver has no cuTensorMapEncodeTiled; DG_ERR_INVALID_ARG when the shape
 * breaks TMA's rules (base 16-byte aligned, dims[0]·2 a multiple of 16),
 * naming which. */
dg_status dg__tmap_bf16(dg_device *dev, dg__tmap *out, dg_dptr base, const uint64_t dims[3],
			const uint32_t box[2]);
/* The same for a tensor of bytes (8-bit codes: rows dims[0] bytes apart,
 * box[0] <= 128). */
dg_status dg__tmap_u8(dg_device *dev, dg__tmap *out, dg_dptr base, const uint64_t dims[3],
		      const uint32_t box[2]);
/* Either (es 2: bf16, 1: bytes) with boxes of box[0] x box[1] x box[2]
 * elements (box[2] planes a box, at most 256): the projection's x rows
 * (runtime/ops/lowrank.c). */
dg_status dg__tmap_box3(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[3],
			const uint32_t box[3]);
/* A rank-5 map whose dims 1 to 4 have strides of their own (bytes,
 * multiples of 16, in any order: a box gathers rows in a permuted order),
 * dim 0 contiguous, the 128-byte swizzle: the projection's weight rows, a
 * group of 64 in its column order a box (runtime/ops/lowrank.c). */
dg_status dg__tmap_rank5(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[5],
			 const uint64_t strides[4], const uint32_t box[5]);
/* A packed rank-3 map (as dg__tmap_box3's) of f32 (es 4), bf16 or bytes
 * whose boxes of box[0] x box[1] x 1 have rows of 64 bytes or fewer (the
 * 64-byte swizzle) or up to 128 (the 128-byte one): a kernel's epilogue
 * subtiles, loaded and stored (templates/attention_tma.lua M.tma_epi). */
dg_status dg__tmap_rows(dg_device *dev, dg__tmap *out, dg_dptr base, int es, const uint64_t dims[3],
			const uint32_t box[2]);

#endif
