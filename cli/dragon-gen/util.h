/*
 * dragon-gen — what every subcommand shares: exit codes, one-line errors,
 * the option scanner, TTY-aware progress, file helpers (a staging
 * folder's files, recursive remove; a file that must appear whole is
 * published with base/publish.h), JSON output. Private to cli/dragon-gen/.
 */
#ifndef DG_GEN_UTIL_H
#define DG_GEN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dragon/status.h"

/* Exit codes (STYLE §14). */
enum {
	DG__GEN_OK = 0,    /* success */
	DG__GEN_FAIL = 1,  /* the work failed: a compile, a bad bundle, I/O */
	DG__GEN_USAGE = 2, /* the command line is wrong: flag, value, spec */
};

/* Process exit code for a library status: spec and argument errors are
 * the user's to fix (usage), everything else is a failure. */
int dg__gen_exit_for(dg_status st);

/* "dragon-gen: <msg>" on stderr, one line: the message is cut at its first
 * newline. Returns `code`, so a command can `return dg__gen_err(2, ...)`.
 * The status a --json error object names is DG_ERR_INTERNAL for code 1,
 * else DG_ERR_INVALID_ARG (a usage error): dg__gen_errs names its own. */
int dg__gen_err(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Same, with the library status the failure came from. */
int dg__gen_errs(int code, dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* dg__gen_errs with the exit code of st (dg__gen_exit_for). */
int dg__gen_fail(dg_status st, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Same, only with --verbose; no return value. */
void dg__gen_note(bool verbose, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Length of s up to its first newline. */
int dg__gen_first_line_len(const char *s);

/* ---- option scanner -------------------------------------------------------- */

/* One accepted option: --name (with or without a value), or -c. */
typedef struct dg__gen_opt {
	const char *name; /* long name without "--", or NULL */
	char short_name;  /* 0 if none */
	bool has_arg;
	int id;           /* returned by dg__gen_scan; > 0 */
} dg__gen_opt;

typedef struct dg__gen_scan_state {
	int argc;
	char **argv;
	int i;          /* next argv index */
	bool only_args; /* after "--" */
	const char *cmd; /* "build", for messages */
} dg__gen_scan_state;

/* Scan results besides an option id. */
enum {
	DG__GEN_SCAN_END = 0,
	DG__GEN_SCAN_ARG = -1,   /* a positional argument in *arg */
	DG__GEN_SCAN_ERROR = -2, /* already reported on stderr: exit 2 */
};

/* argv[0] is the command name (it is skipped). */
void dg__gen_scan_init(dg__gen_scan_state *s, int argc, char **argv,
		       const char *cmd);
/* Next option from opts (terminated by an entry with id 0): its id and
 * *arg for its value; --name=value, --name value, -cVALUE and -c VALUE are
 * all accepted. Unknown options and missing values are reported in one
 * line naming the command's --help. */
int dg__gen_scan(dg__gen_scan_state *s, const dg__gen_opt *opts,
		 const char **arg);

/* Strict decimal parse of a flag value into [lo, hi]; reports
 * "<flag> <value>: ..." and returns false when it is not one. */
bool dg__gen_parse_u64(const char *flag, const char *v, uint64_t lo,
		       uint64_t hi, uint64_t *out);

/* ---- progress -------------------------------------------------------------- */

/* One status line on stderr, redrawn in place, shown only when enabled
 * (stderr is a TTY, or --progress) and only once the work has run for a
 * second, so quick runs and pipes stay quiet. Not thread-safe: callers
 * hold their own lock around tick. */
typedef struct dg__gen_progress {
	bool enabled;
	bool tty;      /* redraw with \r; else print a line every update */
	bool shown;
	double t0_ms;
	double last_ms;
	size_t total;
} dg__gen_progress;

void dg__gen_progress_init(dg__gen_progress *p, bool force, size_t total);
void dg__gen_progress_tick(dg__gen_progress *p, size_t done,
			   const char *what);
void dg__gen_progress_end(dg__gen_progress *p);

double dg__gen_now_ms(void);

/* ---- files ------------------------------------------------------------------ */

/* "dir/name" into buf; false (buf truncated) if it does not fit. */
bool dg__gen_join(char *buf, size_t size, const char *dir, const char *name);

/* Writes size bytes to path (created or truncated, 0644), fsyncs it.
 * On failure removes the file and writes "<path>: <reason>" into err. */
dg_status dg__gen_write_file(const char *path, const void *data, size_t size,
			     char *err, size_t esz);
/* Reads a whole regular file (at most max bytes) into *out (malloc'd,
 * NUL-terminated past *size). DG_ERR_NOT_FOUND if it does not exist. */
dg_status dg__gen_read_file(const char *path, size_t max, uint8_t **out,
			    size_t *size, char *err, size_t esz);
/* Removes path and everything under it (does not follow symlinks). */
void dg__gen_remove_tree(const char *path);
/* mkdir -p. top (size bytes) gets the outermost folder it made, "" if
 * path existed, so dg__gen_rmdirs can undo exactly that. */
dg_status dg__gen_mkdirs(const char *path, char *top, size_t size, char *err,
			 size_t esz);
/* Removes the empty folder path and its parents up to and including top
 * (as set by dg__gen_mkdirs); nothing when top is "". */
void dg__gen_rmdirs(const char *path, const char *top);

/* ---- JSON ------------------------------------------------------------------- */

/* Prints j, indented, and a newline to stdout; deletes j. 1 if out of
 * memory (reported), else 0. */
int dg__gen_json_print(cJSON *j);

/*
 * --json mode: a command that fails prints one JSON object on stdout,
 *   {"error": "<the first error line>", "status": "<dg_status_str>", "exit": N}
 * besides its line on stderr, unless it already printed its own JSON
 * (dg__gen_json_print). main turns the mode on when a command that takes
 * --json finds it among its arguments, and calls dg__gen_json_finish with
 * the exit code.
 */
void dg__gen_json_mode(bool on);
void dg__gen_json_finish(int code);

#endif
