/*
 * What the programs dragon and dragon-gen share about being a program:
 * exit codes, one-line errors on stderr that start with the program's
 * name (and their JSON form under --json), and main's dispatch to the
 * subcommands. The option scanner is cli/common/scan.h, files
 * cli/common/files.h, progress and clocks cli/common/progress.h.
 * Private to cli/.
 */
#ifndef DG_CLI_COMMON_CLI_H
#define DG_CLI_COMMON_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "dragon/status.h"

/* Exit codes (STYLE §14). */
enum {
	DG__CLI_OK = 0,    /* success */
	DG__CLI_FAIL = 1,  /* the work failed: a compile, a file, the data, the device */
	DG__CLI_USAGE = 2, /* the command line is wrong: a flag, its value, a spec */
};

/* Process exit code for a library status: spec and argument errors are
 * the user's to fix (usage), everything else is a failure. */
int dg__cli_exit_for(dg_status st);

/* The program's name ("dragon-gen"), as dg__cli_main was given it. */
const char *dg__cli_name(void);

/*
 * "<program>: <msg>" on stderr, one line (cut at its first newline).
 * Returns code, so a command can `return dg__cli_err(2, ...)`. Under
 * --json the first one is kept for the JSON error object, with status st
 * (DG_OK: DG_ERR_INTERNAL for code 1, else DG_ERR_INVALID_ARG).
 */
int dg__cli_err(int code, dg_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* dg__cli_err with the exit code of st (dg__cli_exit_for). */
int dg__cli_fail(dg_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same line, only with --verbose, and not an error. */
void dg__cli_note(bool verbose, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Length of s up to its first newline (at most 4096). */
int dg__cli_first_line_len(const char *s);

/* ---- JSON ------------------------------------------------------------------- */

/* Prints j, indented, and a newline to stdout; deletes j. 1 if out of
 * memory (reported), else 0. */
int dg__cli_json_print(cJSON *j);

/*
 * --json mode: a command that fails prints one JSON object on stdout,
 *   {"error": "<the first error line>", "status": "<dg_status_str>", "exit": N}
 * besides its line on stderr, unless it already printed its own JSON
 * (dg__cli_json_print). dg__cli_main turns the mode on when a command
 * that takes --json finds it among its arguments, and calls
 * dg__cli_json_finish with the exit code.
 */
void dg__cli_json_mode(bool on);
void dg__cli_json_finish(int code);

/* ---- main ------------------------------------------------------------------- */

/* One subcommand. run takes its argv (argv[0] is the subcommand's name),
 * prints its own --help, and returns the exit code. */
typedef struct dg__cli_command {
	const char *name;
	int (*run)(int argc, char **argv);
	bool json; /* takes --json */
	const char *summary;
} dg__cli_command;

typedef struct dg__cli_program {
	const char *name;  /* "dragon-gen": the prefix of every error */
	const char *about; /* the paragraph under the usage lines */
	const char *environment; /* the last lines of --help, "Environment: ...\n" */
	const dg__cli_command *commands;
	size_t n_commands;
} dg__cli_program;

/*
 * The entry point of a program: --help, -h, help [CMD], --version, then
 * the subcommand named by argv[1]. Output written to stdout is checked at
 * exit, so a full disk or a closed pipe is a failure, not silence.
 * SIGXFSZ is ignored, so a write past the file-size limit (ulimit -f)
 * fails with EFBIG and is reported naming its file, as a full disk is,
 * instead of killing the process without a word. Returns the exit code.
 */
int dg__cli_main(const dg__cli_program *p, int argc, char **argv);

#endif
