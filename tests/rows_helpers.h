/*
 * Helpers of the GPU tests of the row ops (embed, norm, loss): floats in
 * and out of f32 | bf16 storage, random rows, a comparison of stored
 * floats through gh_expect_close, and a line that reports a kernel's
 * registers, spills and time at a shape (for the lead's GPU runs; it
 * asserts nothing about speed).
 */
#ifndef DG_TESTS_ROWS_HELPERS_H
#define DG_TESTS_ROWS_HELPERS_H

#include <stddef.h>

#include "dragon/dragon.h"

/* Bytes of one element of a float format (f32 4, bf16 2). */
size_t rw_size(dg_fmt f);
/* n floats into f32 | bf16 storage (bf16 rounded half to even). */
void rw_store(dg_fmt f, const float *v, size_t n, void *dst);
/* n stored floats back as f32. */
void rw_load(dg_fmt f, const void *p, size_t n, float *out);
/* n floats uniform in [lo, hi), malloc'd (gh_xmalloc). */
float *rw_rand(size_t n, float lo, float hi);
/* n values of got and want in format f, within atol + rtol·|want|. */
void rw_expect_close(const char *what, dg_fmt f, const void *got, const void *want, size_t n,
		     float atol, float rtol);
/* max |v| over n floats. */
float rw_absmax(const float *v, size_t n);

/* Prints "<label>: <regs> regs, <spill> B spilled, <us> us a call" for
 * the kernel `entry` of spec (NULL: its first) after timing `reps` calls
 * of run(ctx) on dev (a warm-up call first). */
void rw_report(dg_device *dev, const dg_spec *spec, const char *entry, const char *label,
	       void (*run)(void *ctx), void *ctx, int reps);

#endif
