/*
 * What the GPU layer lends the layers above it inside libdragon (the ops,
 * the tuning sweep, the training step): setting the device's message and
 * reading its cached info. Nothing outside libdragon includes it; the
 * device's insides stay in runtime/gpu/device_int.h.
 */
#ifndef DG_RUNTIME_GPU_INT_H
#define DG_RUNTIME_GPU_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/runtime.h"

/* Sets the calling thread's message on dev (printf format) and returns st.
 * dev may be NULL (the message is then dropped). */
dg_status dg__dev_fail(dg_device *dev, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Copies a message (a _check's) onto the device and returns st. */
dg_status dg__dev_fail_msg(dg_device *dev, dg_status st, const char *msg);

/* The device's info, cached at open (dev must be open). */
const dg_device_info *dg__dev_info(const dg_device *dev);

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
 * parameter (templates/tma.lua's dg_tmap). */
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

#endif
