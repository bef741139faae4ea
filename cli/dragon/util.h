/*
 * dragon — what its subcommands share: exit codes, one-line errors (and
 * their JSON form under --json), the option scanner, strict number
 * parsing. Private to cli/dragon/.
 *
 * A small copy of the manners of cli/dragon-gen/util.h (same exit codes,
 * same scanner rules, same JSON error object) with "dragon:" as the
 * prefix: dragon-gen's helpers carry its name in their prefix and its
 * file helpers, which dragon does not need, so sharing them would mean
 * renaming every dragon-gen call for ~150 lines.
 */
#ifndef DG_CLI_UTIL_H
#define DG_CLI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dragon/model.h"
#include "dragon/runtime.h"
#include "dragon/status.h"

/* Exit codes (STYLE §14). */
enum {
	DG__CLI_OK = 0,    /* success */
	DG__CLI_FAIL = 1,  /* the work failed: a file, a tensor, the data, the device */
	DG__CLI_USAGE = 2, /* the command line is wrong: a flag or its value */
};

/* "dragon: <msg>" on stderr, one line (cut at its first newline).
 * Returns code. Under --json the first one is kept for the JSON error
 * object, with status st (DG_OK: DG_ERR_INTERNAL for code 1, else
 * DG_ERR_INVALID_ARG). */
int dg__cli_err(int code, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- option scanner (as dragon-gen's) ------------------------------------- */

typedef struct dg__cli_opt {
	const char *name; /* long name without "--", or NULL */
	char short_name;  /* 0 if none */
	bool has_arg;
	int id;           /* > 0 */
} dg__cli_opt;

typedef struct dg__cli_scan_state {
	int argc;
	char **argv;
	int i;
	bool only_args;  /* after "--" */
	const char *cmd; /* "eval", for messages */
} dg__cli_scan_state;

enum {
	DG__CLI_SCAN_END = 0,
	DG__CLI_SCAN_ARG = -1,   /* a positional argument in *arg */
	DG__CLI_SCAN_ERROR = -2, /* reported: exit 2 */
};

/* argv[0] is the command name (skipped). */
void dg__cli_scan_init(dg__cli_scan_state *s, int argc, char **argv, const char *cmd);
/* The next option of opts (ended by id 0): its id, *arg its value;
 * --name=value, --name value, -cVALUE, -c VALUE. */
int dg__cli_scan(dg__cli_scan_state *s, const dg__cli_opt *opts, const char **arg);

/* Strict decimal parse of a flag's value into [lo, hi]; reports
 * "<flag> <value>: ..." (usage) and returns false otherwise. */
bool dg__cli_parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi,
		       uint64_t *out);

double dg__cli_now_s(void);

/* Whether paths a and b name one file: the same device and inode when
 * both exist; else the same canonical path (the file's real path when it
 * exists, else its folder's real path and its name), so an output not
 * made yet is matched too. For "outputs never overwrite inputs". */
bool dg__cli_same_file(const char *a, const char *b);

/* ---- JSON ------------------------------------------------------------------ */

/* Prints j (indented) and a newline on stdout; deletes j. 1 (reported)
 * when out of memory, else 0. */
int dg__cli_json_print(cJSON *j);
/* --json mode: a command that fails without printing its own JSON prints
 *   {"error": "<the first error line>", "status": "<dg_status_str>", "exit": N}
 * on stdout besides its line on stderr (at dg__cli_json_finish). */
void dg__cli_json_mode(bool on);
void dg__cli_json_finish(int code);

/* The device a model of c runs on: GPU `ordinal` (opened into *dev, its
 * name into name) unless cpu or there is none; a recipe the CPU model
 * cannot run without one is refused. Without a GPU, `next` (NULL: none)
 * is what to run instead: it ends the refusal, and when it is given a
 * recipe the CPU model runs is run there with a note on stderr saying so
 * and why there is no GPU. Returns the exit code (reported). */
int dg__cli_device_of(bool cpu, const dg_model_config *c, int ordinal, dg_device **dev, char *name,
		      size_t size, const char *next);

#endif
