/*
 * Tensors: construction, sizes in each storage format, and the one check
 * every op runs on its arguments (dg_tensor_expect), whose messages name
 * the tensor and say what was expected and what came.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dragon/tensor.h"

dg_tensor dg_tensor_make(const char *name, dg_fmt fmt, dg_dptr data, int ndim,
			 const int64_t *shape)
{
	dg_tensor t;

	memset(&t, 0, sizeof(t));
	t.name = name;
	t.fmt = fmt;
	t.ndim = ndim;
	t.data = data;
	for (int i = 0; shape && i < ndim && i < DG_TENSOR_MAX_DIMS; i++)
		t.shape[i] = shape[i];
	return t;
}

dg_tensor dg_tensor_1d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0)
{
	int64_t s[1] = { d0 };
	return dg_tensor_make(name, fmt, data, 1, s);
}

dg_tensor dg_tensor_2d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1)
{
	int64_t s[2] = { d0, d1 };
	return dg_tensor_make(name, fmt, data, 2, s);
}

dg_tensor dg_tensor_3d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1, int64_t d2)
{
	int64_t s[3] = { d0, d1, d2 };
	return dg_tensor_make(name, fmt, data, 3, s);
}

dg_tensor dg_tensor_4d(const char *name, dg_fmt fmt, dg_dptr data, int64_t d0,
		       int64_t d1, int64_t d2, int64_t d3)
{
	int64_t s[4] = { d0, d1, d2, d3 };
	return dg_tensor_make(name, fmt, data, 4, s);
}

static bool ndim_ok(int ndim)
{
	return ndim >= 1 && ndim <= DG_TENSOR_MAX_DIMS;
}

int64_t dg_tensor_numel(const dg_tensor *t)
{
	if (!t || !ndim_ok(t->ndim))
		return 0;
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++) {
		if (t->shape[i] < 0)
			return 0;
		n *= t->shape[i];
	}
	return n;
}

size_t dg_tensor_bytes(const dg_tensor *t)
{
	if (!t || !ndim_ok(t->ndim))
		return 0;
	size_t rows = 1;
	for (int i = 0; i < t->ndim - 1; i++) {
		if (t->shape[i] < 0)
			return 0;
		rows *= (size_t)t->shape[i];
	}
	return rows * dg_fmt_row_bytes(t->fmt, t->shape[t->ndim - 1]);
}

/* Contiguous strides in elements; dimensions of extent 1 may have any
 * stride (they are never stepped along). */
bool dg_tensor_is_contiguous(const dg_tensor *t)
{
	if (!t || !ndim_ok(t->ndim))
		return false;
	bool all_zero = true;
	for (int i = 0; i < t->ndim; i++)
		all_zero = all_zero && t->stride[i] == 0;
	if (all_zero)
		return true;
	int64_t want = 1;
	for (int i = t->ndim - 1; i >= 0; i--) {
		if (t->shape[i] != 1 && t->stride[i] != want)
			return false;
		want *= t->shape[i];
	}
	return true;
}

/* "(4, 8192, 256)"; with wild, negative extents (any) print as "*". */
static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape,
		      bool wild)
{
	size_t used = 0;
	int w = snprintf(buf, size, "(");
	for (int i = 0; w >= 0 && i < ndim && i < DG_TENSOR_MAX_DIMS; i++) {
		used += (size_t)w;
		if (used >= size)
			return;
		if (wild && shape[i] < 0)
			w = snprintf(buf + used, size - used, "%s*", i ? ", " : "");
		else
			w = snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "",
				     shape[i]);
	}
	if (w >= 0 && (used += (size_t)w) < size)
		snprintf(buf + used, size - used, ")");
}

static const char *fmt_str(dg_fmt f)
{
	const char *s = (unsigned)f < DG_FMT__COUNT ? dg_fmt_name(f) : NULL;
	return s ? s : "?";
}

const char *dg_tensor_describe(const dg_tensor *t, char *buf, size_t size)
{
	if (!buf || !size)
		return buf;
	if (!t) {
		snprintf(buf, size, "(null tensor)");
		return buf;
	}
	char dims[128] = "";
	size_t used = 0;
	int n = ndim_ok(t->ndim) ? t->ndim : 0;
	for (int i = 0; i < n && used < sizeof(dims); i++) {
		int w = snprintf(dims + used, sizeof(dims) - used, "%s%" PRId64,
				 i ? "x" : "", t->shape[i]);
		if (w < 0)
			break;
		used += (size_t)w;
	}
	if (!ndim_ok(t->ndim))
		snprintf(dims, sizeof(dims), "ndim %d", t->ndim);
	snprintf(buf, size, "%s (%s, %s)", t->name ? t->name : "tensor",
		 fmt_str(t->fmt), dims);
	return buf;
}

static dg_status fail(char *msg, size_t size, const char *f, ...)
	__attribute__((format(printf, 3, 4)));

static dg_status fail(char *msg, size_t size, const char *f, ...)
{
	if (msg && size) {
		va_list ap;
		va_start(ap, f);
		vsnprintf(msg, size, f, ap);
		va_end(ap);
	}
	return DG_ERR_INVALID_ARG;
}

dg_status dg_tensor_expect(const dg_tensor *t, const char *role, dg_fmt fmt,
			   int ndim, const int64_t *shape, bool need_scale,
			   char *msg, size_t msg_size)
{
	const char *name = t && t->name ? t->name : role ? role : "tensor";
	char want[160], got[160];

	shape_str(want, sizeof(want), shape ? ndim : 0, shape, true);
	if (!shape) /* any shape of ndim dimensions */
		snprintf(want, sizeof(want), "%d-d", ndim);
	if (!t)
		return fail(msg, msg_size, "%s: missing (expected %s %s)", name,
			    fmt_str(fmt), want);
	if (!ndim_ok(t->ndim))
		return fail(msg, msg_size, "%s: ndim=%d, must be 1..%d (expected %s %s)",
			    name, t->ndim, DG_TENSOR_MAX_DIMS, fmt_str(fmt), want);
	shape_str(got, sizeof(got), t->ndim, t->shape, false);
	bool match = t->fmt == fmt && t->ndim == ndim;
	for (int i = 0; match && shape && i < ndim; i++)
		match = shape[i] < 0 || shape[i] == t->shape[i];
	if (!match)
		return fail(msg, msg_size, "%s: expected %s %s, got %s %s", name,
			    fmt_str(fmt), want, fmt_str(t->fmt), got);
	for (int i = 0; i < t->ndim; i++)
		if (t->shape[i] < 0)
			return fail(msg, msg_size,
				    "%s: extent %" PRId64 " in dimension %d of %s is negative",
				    name, t->shape[i], i, got);
	/* Sub-byte formats pack along the last dimension, so it must fill
	 * whole words. Byte codes are one a byte whatever their i8x4 reading
	 * (pack_i8x4 packs along another axis), so any length stores. */
	int64_t last = t->shape[t->ndim - 1];
	int cpw = dg_fmt_per_word(fmt);
	if (cpw > 4 && last % cpw)
		return fail(msg, msg_size,
			    "%s: last dimension %" PRId64 " of %s %s does not fill whole words (%s stores %d codes a word: a multiple of %d)",
			    name, last, fmt_str(fmt), got, fmt_str(fmt), cpw, cpw);
	if (!dg_tensor_is_contiguous(t)) {
		char st[160];
		shape_str(st, sizeof(st), t->ndim, t->stride, false);
		return fail(msg, msg_size,
			    "%s: strides %s of %s are not contiguous; ops take contiguous row-major tensors (copy it first)",
			    name, st, got);
	}
	if (!t->data)
		return fail(msg, msg_size, "%s: data pointer is 0 (%s %s)", name,
			    fmt_str(fmt), got);
	if (t->data % 16)
		return fail(msg, msg_size,
			    "%s: data pointer 0x%" PRIx64 " is not 16-byte aligned (allocations and arena blocks are)",
			    name, t->data);
	if (need_scale && dg_fmt_is_code(fmt)) {
		if (!t->scale)
			return fail(msg, msg_size,
				    "%s: %s codes need their scale (dg_tensor.scale is 0; point it at one float on the device)",
				    name, fmt_str(fmt));
		if (t->scale % 4)
			return fail(msg, msg_size,
				    "%s: scale pointer 0x%" PRIx64 " is not 4-byte aligned",
				    name, t->scale);
	}
	return DG_OK;
}
