/*
 * Autotune internals shared by autotune/ files: the candidate space and
 * the resource check of a sweep (autotune/space.c), and the per-op harness
 * a sweep runs candidates through (autotune/harness.c). Private to
 * autotune/ and its tests.
 */
#ifndef DG_AUTOTUNE_INT_H
#define DG_AUTOTUNE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/codegen.h"
#include "dragon/runtime.h"
#include "dragon/spec.h"
#include "dragon/status.h"
#include "dragon/autotune.h"
#include "dragon/tune.h"

/* ---- candidate spaces (space.c) ---------------------------------------------- */

/*
 * The candidates for tuning spec (its tile ignored) on a device of SM
 * device_sm (0: the spec's arch): every tile of the op family's grid that
 * the op's template plans (dg_codegen_plan on cg), the template's default
 * first; for a spec whose arch equals device_sm (sm_90 or newer, not
 * already arch-specific) each tile again on the arch-specific target
 * (arch_specific true), which enables other tiles. At most
 * DG_TUNE_MAX_CANDIDATES.
 *
 * *out is malloc'd (the caller frees it with free()), *n its length.
 * DG_ERR_INVALID_SPEC when spec itself is invalid or its op takes no tile;
 * DG_ERR_NOMEM.
 */
dg_status dg_tune_space(dg_codegen *cg, const dg_spec *spec, int device_sm, dg_spec **out,
			size_t *n, char *msg, size_t msg_size);

/* What a compiled kernel entry uses, and what the device allows. */
typedef struct dg_tune_resources {
	int threads;     /* a block, from the template's launch info */
	int dyn_smem;    /* dynamic shared memory, bytes (launch info) */
	int static_smem; /* static shared memory, bytes (cubin) */
	int regs;        /* registers a thread (cubin) */
	int local_bytes; /* local memory a thread: spills (cubin) */
	int max_threads; /* threads a block the compiled kernel allows */
} dg_tune_resources;

typedef struct dg_tune_limits {
	int max_threads;    /* threads a block (1024) */
	int smem_optin;     /* shared memory a block may opt in to, bytes */
	int regs_per_block; /* registers a block (65536) */
} dg_tune_limits;

/* true when a kernel of these resources can be launched; otherwise false
 * and one line in why naming the resource, e.g. "256 threads a block x 255
 * registers = 65280 ... more than the 65536 a block has". */
bool dg_tune_fits(const dg_tune_resources *r, const dg_tune_limits *lim,
		  char *why, size_t why_size);

/* ---- the harness (harness.c) -------------------------------------------------- */

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
