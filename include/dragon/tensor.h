/*
 * dragon — tensors: a format, a shape and a device pointer.
 *
 * A dg_tensor describes memory, it does not own it (arenas and dg_malloc
 * do). Shapes are logical, in elements (codes for integer formats); the
 * storage of the last dimension depends on the format:
 *   f32 4 bytes an element, bf16 2,
 *   int8 / int4 / uint8pos one code a byte (i8x4: four codes an int32
 *     word, little-endian lanes; the last dimension a multiple of 4),
 *   ternary 2 bits a code (16 a uint32 word; last dim a multiple of 16),
 *   sign1 1 bit a code (32 a word; last dim a multiple of 32).
 * Integer formats carry their scale as one float on the device (`scale`),
 * which kernels read there (so a scale computed on the GPU is never copied
 * to the host). Ops take contiguous, row-major tensors (stride all zero or
 * equal to the contiguous strides); anything else is refused by name.
 */
#ifndef DRAGON_TENSOR_H
#define DRAGON_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "runtime.h"
#include "spec.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_TENSOR_MAX_DIMS 4

typedef struct dg_tensor {
	const char *name; /* for messages ("x", "w", "grad_out"); may be NULL */
	dg_fmt fmt;
	int ndim;
	int64_t shape[DG_TENSOR_MAX_DIMS];
	int64_t stride[DG_TENSOR_MAX_DIMS]; /* elements; all 0: contiguous */
	dg_dptr data;
	dg_dptr scale; /* float on the device, for integer formats; else 0 */
} dg_tensor;

/* A contiguous tensor. ndim 1..4; shape copied. */
DG_API dg_tensor dg_tensor_make(const char *name, dg_fmt fmt, dg_dptr data,
			 int ndim, const int64_t *shape);
/* Same, shape as arguments: dg_tensor_4d("x", DG_FMT_INT8, p, B, 1, T, D). */
DG_API dg_tensor dg_tensor_1d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0);
DG_API dg_tensor dg_tensor_2d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1);
DG_API dg_tensor dg_tensor_3d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1, int64_t d2);
DG_API dg_tensor dg_tensor_4d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1, int64_t d2, int64_t d3);

DG_API int64_t dg_tensor_numel(const dg_tensor *t);
/* Storage bytes of a contiguous tensor of this format and shape (0 when the
 * last dimension does not fill whole words of the format). */
DG_API size_t dg_tensor_bytes(const dg_tensor *t);
DG_API bool dg_tensor_is_contiguous(const dg_tensor *t);

/* "x (int8, 2x1x3x256)" into buf; returns buf. */
DG_API const char *dg_tensor_describe(const dg_tensor *t, char *buf, size_t size);

/*
 * Checks t against what an op expects: not NULL, the format, the number of
 * dimensions and each extent (-1: any), contiguity, a non-zero data pointer
 * aligned to 16 bytes, a scale pointer when the format is an integer one
 * (need_scale). On failure, one line naming the tensor, what was expected
 * and what it got, e.g.
 *   "w: expected int8 (4, 8192, 256), got int8 (4, 256, 8192)"
 * `role` names the tensor when t->name is NULL.
 */
DG_API dg_status dg_tensor_expect(const dg_tensor *t, const char *role, dg_fmt fmt,
				  int ndim, const int64_t *shape, bool need_scale,
				  char *msg, size_t msg_size);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_TENSOR_H */
