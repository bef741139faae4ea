/*
 * The programs' manners (cli/common/cli.h): an error is one line on
 * stderr that starts with the program's name; under --json a failure is
 * also one JSON object on stdout; main dispatches to the subcommands.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/common/cli.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"

/* Set once by dg__cli_main, before anything can fail. */
static const char *program = "dragon";

const char *dg__cli_name(void)
{
	return program;
}

int dg__cli_exit_for(dg_status st)
{
	switch (st) {
	case DG_OK:
		return DG__CLI_OK;
	case DG_ERR_INVALID_ARG:
	case DG_ERR_INVALID_SPEC:
		return DG__CLI_USAGE;
	default:
		return DG__CLI_FAIL;
	}
}

int dg__cli_first_line_len(const char *s)
{
	const char *nl = strchr(s, '\n');
	size_t n = nl ? (size_t)(nl - s) : strlen(s);
	return n > 4096 ? 4096 : (int)n;
}

/* --json mode (cli.h): the first error, kept for dg__cli_json_finish. */
static struct {
	bool on, printed, have;
	dg_status st;
	char msg[4096];
} json_err;

static void vline(const char *fmt, va_list ap)
{
	char buf[4096];
	vsnprintf(buf, sizeof(buf), fmt, ap);
	fprintf(stderr, "%s: %.*s\n", program, dg__cli_first_line_len(buf), buf);
}

static void verr(int code, dg_status st, const char *fmt, va_list ap)
{
	va_list copy;
	va_copy(copy, ap);
	if (json_err.on && !json_err.have) {
		char buf[4096];
		vsnprintf(buf, sizeof(buf), fmt, copy);
		snprintf(json_err.msg, sizeof(json_err.msg), "%.*s", dg__cli_first_line_len(buf), buf);
		/* a usage error (2, or the scanner's, reported before its 2) */
		json_err.st = st ? st : (code == DG__CLI_FAIL ? DG_ERR_INTERNAL : DG_ERR_INVALID_ARG);
		json_err.have = true;
	}
	va_end(copy);
	vline(fmt, ap);
}

int dg__cli_err(int code, dg_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	verr(code, st, fmt, ap);
	va_end(ap);
	return code;
}

int dg__cli_fail(dg_status st, const char *fmt, ...)
{
	int code = dg__cli_exit_for(st);
	va_list ap;
	va_start(ap, fmt);
	verr(code, st, fmt, ap);
	va_end(ap);
	return code;
}

void dg__cli_note(bool verbose, const char *fmt, ...)
{
	if (!verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	vline(fmt, ap);
	va_end(ap);
}

/* ---- JSON ------------------------------------------------------------------- */

int dg__cli_json_print(cJSON *j)
{
	char *text = j ? cJSON_Print(j) : NULL;
	cJSON_Delete(j);
	if (!text)
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_NOMEM, "out of memory printing JSON");
	fputs(text, stdout);
	fputc('\n', stdout);
	cJSON_free(text);
	json_err.printed = true;
	return DG__CLI_OK;
}

void dg__cli_json_mode(bool on)
{
	json_err.on = on;
}

void dg__cli_json_finish(int code)
{
	if (!json_err.on || json_err.printed || code == DG__CLI_OK)
		return;
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return;
	dg_status st = json_err.have ? json_err.st
				     : code == DG__CLI_USAGE ? DG_ERR_INVALID_ARG : DG_ERR_INTERNAL;
	cJSON_AddStringToObject(j, "error", json_err.have ? json_err.msg : "failed");
	cJSON_AddStringToObject(j, "status", dg_status_str(st));
	cJSON_AddNumberToObject(j, "exit", code);
	json_err.on = false; /* a failure to print is reported once, as text */
	dg__cli_json_print(j);
}

/* ---- main ------------------------------------------------------------------- */

static void usage(const dg__cli_program *p, FILE *to)
{
	fprintf(to, "usage: %s <command> [flags]\n       %s --help | --version\n\n%s\n\nCommands:\n", p->name,
		p->name, p->about);
	for (size_t i = 0; i < p->n_commands; i++)
		fprintf(to, "  %-8s %s\n", p->commands[i].name, p->commands[i].summary);
	fprintf(to, "\n`%s <command> --help` describes each one.\nExit status: 0 ok, 1 failure, 2 usage error.\n%s",
		p->name, p->environment);
}

/* --json among a command's flags (before a "--"). */
static bool wants_json(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			return false;
		if (strcmp(argv[i], "--json") == 0)
			return true;
	}
	return false;
}

static int finish(int code)
{
	dg__cli_json_finish(code);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno;
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "writing output: %s", e ? strerror(e) : "write error");
	}
	return code;
}

/* "build, render, list" */
static void command_list(const dg__cli_program *p, char *buf, size_t size)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < p->n_commands && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", p->commands[i].name);
}

int dg__cli_main(const dg__cli_program *p, int argc, char **argv)
{
	program = p->name;
	signal(SIGXFSZ, SIG_IGN);
	if (argc < 2) {
		usage(p, stderr);
		return DG__CLI_USAGE;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		if (strcmp(cmd, "help") == 0 && argc > 2) {
			char help[] = "--help";
			char *sub[] = { argv[2], help, NULL };
			for (size_t i = 0; i < p->n_commands; i++)
				if (strcmp(argv[2], p->commands[i].name) == 0)
					return finish(p->commands[i].run(2, sub));
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "help: unknown command '%s'; see `%s --help`", argv[2], p->name);
		}
		usage(p, stdout);
		return finish(DG__CLI_OK);
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
		printf("%s %s (generator %s, NVRTC %s)\n", p->name, DG_VERSION, DG_GENERATOR_VERSION,
		       dg_nvrtc_version());
		return finish(DG__CLI_OK);
	}
	for (size_t i = 0; i < p->n_commands; i++) {
		if (strcmp(cmd, p->commands[i].name) != 0)
			continue;
		dg__cli_json_mode(p->commands[i].json && wants_json(argc - 1, argv + 1));
		return finish(p->commands[i].run(argc - 1, argv + 1));
	}
	if (cmd[0] == '-')
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "unknown flag %s before the command; see `%s --help`", cmd, p->name);
	char names[512];
	command_list(p, names, sizeof(names));
	return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG, "unknown command '%s'; commands are %s (see `%s --help`)",
			   cmd, names, p->name);
}
