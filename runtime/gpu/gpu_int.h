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

#include "dragon/runtime.h"

/* Sets the calling thread's message on dev (printf format) and returns st.
 * dev may be NULL (the message is then dropped). */
dg_status dg__dev_fail(dg_device *dev, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Copies a message (a _check's) onto the device and returns st. */
dg_status dg__dev_fail_msg(dg_device *dev, dg_status st, const char *msg);

/* The device's info, cached at open (dev must be open). */
const dg_device_info *dg__dev_info(const dg_device *dev);

#endif
