/*
 * What the bundle builder's two files share (dg_bundle_build,
 * dragon/runtime.h): bundle_build.c plans, compiles with a pool of
 * threads and publishes; bundle_tuned.c resolves each spec's tile for the
 * device the bundle is for and carries the tuning records behind them.
 * Nothing outside runtime/gpu/ includes it.
 */
#ifndef DG_RUNTIME_GPU_BUNDLE_INT_H
#define DG_RUNTIME_GPU_BUNDLE_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/codegen.h"
#include "dragon/runtime.h"
#include "dragon/spec.h"
#include "dragon/tune.h"

struct cJSON;

/* A line for opts->note (printf format); nothing without a callback. */
void dg__bundle_note(const dg_bundle_opts *o, int detail, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- the device the specs resolve for ------------------------------------------- */

typedef enum dg__bundle_dev_mode {
	DG__BUNDLE_DEV_AUTO,  /* for each spec's SM, the one device the records name */
	DG__BUNDLE_DEV_NAMED, /* opts->device and opts->sm */
	DG__BUNDLE_DEV_NONE,  /* no device */
} dg__bundle_dev_mode;

#define DG__BUNDLE_MAX_DEVICES 32

typedef struct dg__bundle_tune {
	const dg_tune_db *db;
	dg_tune_db *owned; /* db, when opened here */
	dg__bundle_dev_mode mode;
	char device[128];  /* DG__BUNDLE_DEV_NAMED */
	int sm;
	dg_tune_device devs[DG__BUNDLE_MAX_DEVICES]; /* the devices the records name */
	size_t n_devs;
} dg__bundle_tune;

/* Reads opts' device and SM and takes its DB, or opens the runtime's
 * (problems and ambiguous devices as notes). */
dg_status dg__bundle_tune_open(const dg_bundle_opts *opts, dg__bundle_tune *out, char *msg,
			       size_t msz);
void dg__bundle_tune_close(dg__bundle_tune *t);

/* ---- the kernels a build compiles ------------------------------------------------ */

/* The specs resolved for the device, deduplicated by what runs.
 * Zero-initialize; free with dg__bundle_resolved_free. */
typedef struct dg__bundle_resolved {
	dg_spec *specs;     /* n, tile and target resolved (owned) */
	char **canonical;   /* their canonical texts (owned) */
	size_t n;
	char device[128];   /* the device they resolve for; "" none */
	int sm;             /* 0 likewise */
	/* tuned: the records used and the manifest's "tuning" array */
	char **rec_paths;   /* distinct record paths ("built-in:<file>" too), owned */
	char **rec_names;   /* their names in the bundle's tune/ folder, owned */
	char **rec_json;    /* a built-in record's JSON text, NULL for a file; owned */
	size_t n_recs;
	struct cJSON *tuning; /* owned, or NULL unless tuned */
} dg__bundle_resolved;

void dg__bundle_resolved_free(dg__bundle_resolved *r);
/*
 * Resolves the n specs (canonical: their texts, tiles as given) on cg for
 * t's devices into *out, merging specs that resolve to one kernel; with
 * tuned, notes the records used and each choice. Each auto tile's choice
 * is a detail note. DG_ERR_INVALID_ARG when the specs resolve for two
 * devices; a spec that cannot be planned: the status with cg's message.
 */
dg_status dg__bundle_resolve(const dg_bundle_opts *opts, const dg__bundle_tune *t, dg_codegen *cg,
			     const dg_spec *specs, char *const *canonical, size_t n, bool tuned,
			     dg__bundle_resolved *out, char *msg, size_t msz);
/* Writes the records of r into tmp/tune/ (nothing without records): a
 * file's bytes as they are, a built-in record from its JSON. */
dg_status dg__bundle_records_write(const dg__bundle_resolved *r, const char *tmp, char *msg,
				   size_t msz);
/* Adds the "tuning" array to the manifest text *json (malloc'd; replaced
 * by a new malloc'd text, the old one freed); nothing when r has none. */
dg_status dg__bundle_tuning_manifest(const dg__bundle_resolved *r, char **json, char *msg,
				     size_t msz);
/* Moves tmp/tune/<names> into dir/tune/ (made if needed) and syncs that
 * folder; on failure unlinks what it moved that was not there before. */
dg_status dg__bundle_records_publish(const dg__bundle_resolved *r, const char *tmp,
				     const char *dir, char *msg, size_t msz);

#endif
