/*
 * Helpers shared by the GPU suites of the gradient GEMMs
 * (tests/test_gpu_grad.c, tests/test_gpu_grad_bdh.c): |values| of an
 * operand storage for the Σ|terms| reference, and the bf16 tolerance the
 * gradients are checked with. Names start with gr_ (grad helpers).
 * Random operands come from gpu_helpers (gh_rand_storage, the test's
 * dg_rng).
 *
 * Tolerance (gr_expect_bf16). The references are exact (double sums of the
 * f32 gradient times the decoded operand). The tensor-core path rounds the
 * gradient (and an f32 operand) to bf16, round to nearest even — a
 * relative error of at most 2^-8 a value — and sums exact products in f32,
 * so an output's error is at most (2^-8 + K·2^-24)·Σ_k |a_k·b_k| (twice
 * the first term with an f32 operand). Each check asks for both:
 *   - elementwise |got − want| <= c·2^-8·Σ_k |a_k·b_k| + 1e-6·(1 + |want|),
 *     c = 2 (3 with an f32 operand), the Σ|terms| from the same CPU
 *     reference run on |grad| and |operand| (gr_abs_storage) — a bound the
 *     rounding can never exceed, so the test cannot flake (dg_ref_within);
 *   - ‖got − want‖ <= 1e-2·‖want‖ (the rounding gives about 1e-3): on long
 *     reductions the elementwise bound grows like K while a wrong element
 *     is off by about √K, so this is what keeps a wrong index, a
 *     transposed or shifted tile, a lost K step or a missing scale failing
 *     loudly (dg_ref_close_norm; tolerance_catches_layout_errors in
 *     tests/test_gpu_grad.c proves it without a device).
 * The SIMT path (f32 sums) passes both with room to spare.
 */
#ifndef DG_TESTS_GRAD_HELPERS_H
#define DG_TESTS_GRAD_HELPERS_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/ops.h"
#include "dragon/spec.h"

#define GR_BF16_REL 1e-2 /* relative-to-norm bound of a bf16-rounded gradient */
#define GR_BF16_U (1.0 / 256) /* 2^-8: bf16's unit roundoff (round to nearest even) */

/* A gradient GEMM's shape: heads, in_heads, embd, latent, batch, time. */
typedef struct gr_shape {
	int H, Hin, E, L, B, T;
} gr_shape;

/* op's spec (not normalized) at s: the operand format f is the weight of a
 * grad_input op, the act of a grad_weight one; tile NULL: the auto tile. */
dg_spec gr_spec(dg_op op, const gr_shape *s, dg_fmt f, const dg_tile *tile);

/* |values| of a storage of n values of format f (same layout), so that a
 * reference run on it and on |grad| gives Σ|terms| (malloc'd). */
void *gr_abs_storage(dg_fmt f, const void *src, size_t n);
/* A scale that keeps decoded values about 1: 1/qmax of a code format. */
float gr_scale_of(dg_fmt f);

/* n uniform floats in [-1, 1) from the test's stream (malloc'd). */
float *gr_rand_f32(size_t n);
/* |v[i]| of n floats (malloc'd). */
float *gr_abs_f32(const float *v, size_t n);

/* The elementwise factor c of the bound: the gradient is rounded (2^-8),
 * and an f32 operand too (another 2^-8); one unit of c to spare for the
 * f32 sums (K·2^-24 <= 2^-8 for K <= 2^16). */
double gr_bound_c(dg_fmt f);

/* Whether got matches want within the bounds above; absum[i] is
 * Σ_k |a_k·b_k| of output i (scale included). `why` gets the failed rule
 * and its worst or first element. */
bool gr_bf16_ok(const char *what, const float *got, const float *want, const float *absum,
		size_t n, double c, char *why, size_t why_size);
/* gr_bf16_ok, failing the test with its reason. */
void gr_expect_bf16(const char *what, const float *got, const float *want, const float *absum,
		    size_t n, double c);

/* Fails the test when any of n outputs is NaN: never written (the tests
 * fill outputs with 0xff bytes, a NaN, first). */
void gr_expect_written(const char *what, const float *v, size_t n);

/* Runs lowrank_grad_input with a (a->splits as given: 0 the runtime's
 * choice) in a workspace of the size its _workspace call asks for, every
 * byte 0xff first (a NaN: a split that writes nothing fails
 * gr_expect_written); a->ws is set to it (freed by gh_close). Fails the
 * test naming `what` on an error. Returns the workspace bytes (0: the op
 * did not split). */
size_t gr_grad_input(dg_device *dev, const dg_spec *sp, dg_lowrank_grad_input_args *a,
		     const char *what);

/* Runs lowrank_grad_weight (decoder_grad_weight) with a in a workspace
 * of the size its _workspace call asks for (a->ws set, freed by
 * gh_close; a failed _workspace call fails the test); *ws_bytes (may be
 * NULL) gets that size. Returns the op's status. */
dg_status gr_lowrank_grad_weight(dg_device *dev, const dg_spec *sp, dg_lowrank_grad_weight_args *a,
				 size_t *ws_bytes);
dg_status gr_decoder_grad_weight(dg_device *dev, const dg_spec *sp, dg_decoder_grad_weight_args *a,
				 size_t *ws_bytes);

#endif
