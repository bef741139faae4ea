/*
 * dragon — autotuning: the sweeps that time a spec's candidate tiles on
 * the device and make a tuning record of them (dragon/tune.h: the
 * records, the DB, how a tile is resolved), and the set of specs
 * `dragon-gen tune` tunes. Implemented in autotune/, above the ops: a
 * sweep runs them and checks them against their CPU references.
 */
#ifndef DRAGON_AUTOTUNE_H
#define DRAGON_AUTOTUNE_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "runtime.h"
#include "spec.h"
#include "status.h"
#include "tune.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- what `dragon-gen tune` tunes ---------------------------------------------- */

/*
 * The ops the BDH training step runs, one spec each, at H=4, D=256,
 * N=8192 (the set `dragon-gen tune` tunes without spec flags):
 *   lowrank_fwd ternary·int8 → int8 relu=0, and → bf16 relu=0;
 *   relu_mask ternary·int8 relu=0; decoder_fwd int8·int8 → bf16 and
 *   ternary·int8 → bf16; lowrank_grad_input ternary; lowrank_grad_weight
 *   int8; decoder_grad_input ternary; decoder_grad_weight int8;
 *   quantize_act f32 → int8; quantize_weight f32 → ternary;
 *   pack_ternary; pack_i8x4.
 * Writes up to max specs into out (may be NULL) and returns how many
 * there are.
 */
DG_API size_t dg_tune_bdh_set(dg_spec *out, size_t max);

/* ---- sweeps ------------------------------------------------------------------------ */

typedef enum dg_tune_phase {
	DG_TUNE_PHASE_COMPILE, /* compiling and loading candidates */
	DG_TUNE_PHASE_REFERENCE, /* computing the CPU reference */
	DG_TUNE_PHASE_TIME,    /* checking and timing candidates */
} dg_tune_phase;

/* Progress: done of total in the phase, an estimate of the seconds left
 * in the sweep (< 0: unknown). */
typedef void (*dg_tune_progress_fn)(void *user, const dg_spec *spec,
				    dg_tune_phase phase, size_t done,
				    size_t total, double eta_s);

/* The most candidates a space holds. */
#define DG_TUNE_MAX_CANDIDATES 256

typedef struct dg_tune_opts {
	double budget_s;    /* wall-clock budget of the sweep; 0: 60 */
	int rows;           /* B·T timed at; 0: 4096 */
	int check_rows;     /* B·T checked at; 0: 64 */
	int warmup;         /* untimed calls before the reps; 0: 3 */
	int reps;           /* timed calls; 0: 25 */
	int jobs;           /* compile threads; 0: online CPUs */
	double tie_band;    /* 0: DG_TUNE_TIE_BAND */
	int max_candidates; /* first N of the space only; 0: all (at most
			     * DG_TUNE_MAX_CANDIDATES) */
	uint64_t seed;      /* inputs; 0: a fixed default */
	dg_tune_progress_fn progress; /* may be NULL */
	void *user;
} dg_tune_opts;

/*
 * Sweeps spec (its tile ignored) on dev. On DG_OK *out is the record (a
 * new one: dg_tune_record_destroy; winner -1 when no candidate passed).
 * Failures of the sweep itself (the spec, memory, the device) return the
 * status with the message on dev; failures of candidates are recorded in
 * the record, not returned. opts may be NULL.
 */
DG_API dg_status dg_tune_sweep(dg_device *dev, const dg_spec *spec,
			       const dg_tune_opts *opts, dg_tune_record **out);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_AUTOTUNE_H */
