/*
 * Runtime internals shared by runtime/ files: the device's message, its
 * scratch buffer, and the one-call kernel launch ops use. Nothing outside
 * runtime/ (and tests/bench, which may include anything) looks here.
 */
#ifndef DG_RUNTIME_INT_H
#define DG_RUNTIME_INT_H

#include <stdarg.h>
#include <stddef.h>

#include "dragon/ops.h"
#include "dragon/runtime.h"
#include "dragon/tensor.h"

/* Sets the device's message (printf format) and returns st. dev may be
 * NULL (the message is then dropped). */
dg_status dg__dev_fail(dg_device *dev, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The spec as dg_kernel_get runs it on dev: an auto tile resolved (the
 * tuning DB's, else the default, on the target it picks). Ops size their
 * launches from it. spec must be valid (the op's _check ran). */
dg_status dg__spec_as_run(dg_device *dev, const dg_spec *spec, dg_spec *out);

/* Copies a _check's message onto the device and returns st. */
dg_status dg__dev_fail_msg(dg_device *dev, dg_status st, const char *msg);

/*
 * Scratch device memory owned by the device (partials, split-K
 * workspaces): at least `bytes`, 256-byte aligned, valid until the next
 * call that asks for more (it only grows, so a CUDA graph captured after a
 * first, eager run keeps valid pointers). One buffer a slot (0..3), so one
 * op can hold two at once.
 */
dg_status dg__dev_scratch(dg_device *dev, int slot, size_t bytes,
			  dg_dptr *out);

/* dg_kernel_get + dg_kernel_launch, the message on dev. entry NULL: the
 * spec's first entry. */
dg_status dg__op_launch(dg_device *dev, const dg_spec *spec, const char *entry,
			const dg_launch *launch, void **args);

/* The device's info, cached at open (never fails on an open device). */
const dg_device_info *dg__dev_info(const dg_device *dev);

#endif
