/*
 * dragon-gen — the subcommands. Each takes its argv (argv[0] is the
 * subcommand's name), prints its own --help, and returns the process exit
 * code (util.h: 0 ok, 1 failure, 2 usage). Private to cli/dragon-gen/.
 */
#ifndef DG_GEN_GEN_H
#define DG_GEN_GEN_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/spec.h"
#include "dragon/status.h"
#include "dragon/tune.h"

struct cJSON;
struct dg__specset;

int dg__gen_cmd_build(int argc, char **argv);
int dg__gen_cmd_render(int argc, char **argv);
int dg__gen_cmd_list(int argc, char **argv);
int dg__gen_cmd_cache(int argc, char **argv);
int dg__gen_cmd_inspect(int argc, char **argv);
int dg__gen_cmd_tune(int argc, char **argv);

/* ---- the tuning DB, for inspect and build --tuned (cmd_tune.c) ---------------- */

/* An open DB and the device its records are looked up for. */
typedef struct dg__gen_tune {
	dg_tune_db *db;
	char device[128]; /* "" when none is named and the DB has none */
	int sm;           /* 0 likewise */
} dg__gen_tune;

/*
 * Opens the DB (db_path: --tune-db, NULL for $DRAGON_TUNE_DB or the
 * cache's tune/ under cache_dir) for the device --device/--sm name (both
 * or neither; NULL when not given), else the one device its records name.
 * Skipped records are reported on stderr. Returns the exit code (reported).
 */
int dg__gen_tune_open(const char *db_path, const char *cache_dir, const char *device,
		      const char *sm_text, const char *cmd, bool verbose,
		      dg__gen_tune *out);
void dg__gen_tune_close(dg__gen_tune *t);
/* dg_tune_resolve for t's device. */
void dg__gen_tune_resolve(const dg__gen_tune *t, const dg_spec *spec,
			  dg_tune_choice *out);
/* "tile: 128x128x64/2x4/4 (tuned: /path/record.json)" or
 * "tile: 64x64x32/2x2/2 (default heuristic: <why>)". */
void dg__gen_tile_line(const dg_tune_choice *ch, char *buf, size_t size);

/* ---- build --tuned (build_tuned.c) -------------------------------------------- */

/* The tuning records a --tuned build used. Zero-initialize; free with
 * dg__gen_tuned_free (which leaves it zeroed). */
typedef struct dg__gen_tuned {
	char **paths;       /* distinct record files, n of them (owned) */
	char **names;       /* their names in the bundle's tune/ folder (owned) */
	size_t n;
	struct cJSON *json; /* the manifest's "tuning" array (owned), or NULL */
} dg__gen_tuned;

void dg__gen_tuned_free(dg__gen_tuned *ts);
/*
 * Resolves every auto tile of set from the DB (db_path, cache_dir, device,
 * sm_text: as dg__gen_tune_open takes them), replacing the spec with the
 * one that runs; fills ts with the records used and the "tuning" array
 * (verbose: each choice on stderr). Returns the exit code (reported).
 */
int dg__gen_tuned_resolve(const char *db_path, const char *cache_dir, const char *device,
			  const char *sm_text, bool verbose, struct dg__specset *set,
			  dg__gen_tuned *ts);
/* Copies the records into tmp/tune/ (nothing without records). */
dg_status dg__gen_tuned_copy_records(const dg__gen_tuned *ts, const char *tmp, char *msg,
				     size_t msz);
/* Adds the "tuning" array to the manifest text *json (malloc'd; replaced
 * by a new malloc'd text, the old one freed); nothing when ts has none. */
dg_status dg__gen_tuned_manifest(const dg__gen_tuned *ts, char **json, char *msg, size_t msz);
/* Moves tmp/tune/<names> into dir/tune/ (made if needed); on failure
 * unlinks what it moved that was not there before. ts may be NULL. */
dg_status dg__gen_tuned_publish_records(const dg__gen_tuned *ts, const char *tmp,
					const char *dir, char *msg, size_t msz);

#endif
