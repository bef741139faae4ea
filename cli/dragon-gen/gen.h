/*
 * dragon-gen — the subcommands. Each takes its argv (argv[0] is the
 * subcommand's name), prints its own --help, and returns the process exit
 * code (cli/common/cli.h: 0 ok, 1 failure, 2 usage). Private to
 * cli/dragon-gen/.
 */
#ifndef DG_GEN_GEN_H
#define DG_GEN_GEN_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/codegen.h"
#include "dragon/spec.h"
#include "dragon/status.h"
#include "dragon/autotune.h"
#include "dragon/tune.h"

int dg__gen_cmd_build(int argc, char **argv);
int dg__gen_cmd_render(int argc, char **argv);
int dg__gen_cmd_list(int argc, char **argv);
int dg__gen_cmd_cache(int argc, char **argv);
int dg__gen_cmd_inspect(int argc, char **argv);
int dg__gen_cmd_tune(int argc, char **argv);

/* ---- the tuning DB and the device a spec resolves for (cmd_tune.c) ------------- */

/* How the device of each spec is chosen: --device NAME --sm N; --device
 * none; or, without them, the one device the DB's records name for the
 * spec's SM (none when there are none or several). */
typedef enum dg__gen_dev_mode {
	DG__GEN_DEV_AUTO,
	DG__GEN_DEV_NAMED,
	DG__GEN_DEV_NONE,
} dg__gen_dev_mode;

#define DG__GEN_MAX_DEVICES 32

typedef struct dg__gen_tune {
	dg_tune_db *db;
	dg__gen_dev_mode mode;
	char device[128]; /* DG__GEN_DEV_NAMED */
	int sm;
	dg_tune_device devs[DG__GEN_MAX_DEVICES]; /* the devices the records name */
	size_t n_devs;
} dg__gen_tune;

/*
 * Opens the DB (db_path: --tune-db, NULL for $DRAGON_TUNE_DB or the
 * cache's tune/ under cache_dir, with the built-in records below) and
 * reads --device / --sm (NULL when not given; both or neither, "none"
 * alone). Skipped records are reported on stderr. Returns the exit code
 * (reported).
 */
int dg__gen_tune_open(const char *db_path, const char *cache_dir, const char *device,
		      const char *sm_text, const char *cmd, bool verbose,
		      dg__gen_tune *out);
void dg__gen_tune_close(dg__gen_tune *t);
/* The device spec resolves for: name "" and *sm 0 for none. */
void dg__gen_tune_device_for(const dg__gen_tune *t, const dg_spec *spec, char *name,
			     size_t size, int *sm);
/* dg_tune_resolve on cg for that device: the tile and target spec runs
 * with, as the runtime would choose them. The status, with cg's message,
 * when the spec cannot be planned. */
dg_status dg__gen_tune_resolve(const dg__gen_tune *t, dg_codegen *cg, const dg_spec *spec,
			       dg_tune_choice *out);
/* "tile: 128x128x64/2x4/4 (tuned: /path/record.json)" or
 * "tile: 64x64x32/2x2/2 (template default: <why>)". */
void dg__gen_tile_line(const dg_tune_choice *ch, char *buf, size_t size);

#endif
