/*
 * The option scanner of every subcommand of dragon and dragon-gen, and
 * strict number parsing of a flag's value: --name=value, --name value,
 * -cVALUE and -c VALUE, "--" ends the flags; an unknown flag or a missing
 * value is one usage line naming the subcommand's --help. Private to cli/.
 */
#ifndef DG_CLI_COMMON_SCAN_H
#define DG_CLI_COMMON_SCAN_H

#include <stdbool.h>
#include <stdint.h>

/* One accepted option: --name (with or without a value), or -c. */
typedef struct dg__cli_opt {
	const char *name; /* long name without "--", or NULL */
	char short_name;  /* 0 if none */
	bool has_arg;
	int id;           /* returned by dg__cli_scan; > 0 */
} dg__cli_opt;

typedef struct dg__cli_scan_state {
	int argc;
	char **argv;
	int i;           /* next argv index */
	bool only_args;  /* after "--" */
	const char *cmd; /* "build", for messages */
} dg__cli_scan_state;

/* Scan results besides an option id. */
enum {
	DG__CLI_SCAN_END = 0,
	DG__CLI_SCAN_ARG = -1,   /* a positional argument in *arg */
	DG__CLI_SCAN_ERROR = -2, /* already reported on stderr: exit 2 */
};

/* argv[0] is the command name (it is skipped). */
void dg__cli_scan_init(dg__cli_scan_state *s, int argc, char **argv, const char *cmd);
/* Next option from opts (terminated by an entry with id 0): its id and
 * *arg for its value. Unknown options and missing values are reported in
 * one line naming the command's --help. */
int dg__cli_scan(dg__cli_scan_state *s, const dg__cli_opt *opts, const char **arg);

/* Strict decimal parse of a flag value into [lo, hi]; reports
 * "<flag> <value>: ..." (usage) and returns false when it is not one. */
bool dg__cli_parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out);

#endif
