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

#endif
