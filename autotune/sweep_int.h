/*
 * Autotune internals shared by autotune/ files: the per-op harness a sweep
 * runs candidates through (autotune/harness.c). Private to autotune/.
 */
#ifndef DG_AUTOTUNE_INT_H
#define DG_AUTOTUNE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/runtime.h"
#include "dragon/spec.h"
#include "dragon/status.h"

/*
 * One op's tensors at one shape (rows = B·T, B = 1), filled with random
 * data from seed; a check case also keeps the host inputs and the CPU
 * reference output of the spec. Owned by the caller: dg__at_case_destroy.
 * Messages (failures of the device or of memory) are on dev.
 */
typedef struct dg__at_case dg__at_case;

dg_status dg__at_case_create(dg_device *dev, const dg_spec *spec, int rows,
			     bool check, uint64_t seed, dg__at_case **out);
void dg__at_case_destroy(dg__at_case *c);

/* Enqueues one call of the op with spec `cand` (the case's spec with a
 * tile) on the device's stream, through the public ops API. */
dg_status dg__at_case_run(dg__at_case *c, const dg_spec *cand);

/* What a check found. */
typedef enum dg__at_verdict {
	DG__AT_RIGHT,   /* equals the reference */
	DG__AT_WRONG,   /* differs (why names the first difference) */
	DG__AT_REFUSED, /* the op refused to launch it (why: its message) */
} dg__at_verdict;

/* Check cases: fills the outputs with 0xff, runs cand, waits, compares
 * with the reference. A status only when the device failed. */
dg_status dg__at_case_check(dg__at_case *c, const dg_spec *cand,
			    dg__at_verdict *verdict, char *why,
			    size_t why_size);

/* Bytes of device memory the case holds (for messages). */
size_t dg__at_case_bytes(const dg__at_case *c);

#endif
