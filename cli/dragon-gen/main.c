/*
 * dragon-gen — build CUDA kernel bundles ahead of time.
 *
 * The entry point: global --help and --version, then dispatch to one
 * subcommand (gen.h). Output written to stdout is checked at exit, so a
 * full disk or a closed pipe is a failure, not silence. SIGXFSZ is
 * ignored, so a write past the file-size limit (ulimit -f) fails with
 * EFBIG and is reported naming its file, as a full disk is, instead of
 * killing the process without a word. A command that
 * takes --json and was given it answers a failure with a JSON object on
 * stdout too (util.h dg__gen_json_mode).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/dragon-gen/gen.h"
#include "cli/dragon-gen/util.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"

typedef struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	bool json; /* takes --json */
	const char *summary;
} command;

static const command commands[] = {
	{ "build", dg__gen_cmd_build, true, "compile specs into a kernel bundle (cubins + manifest.json)" },
	{ "render", dg__gen_cmd_render, false, "print the CUDA source (or canonical text) of one spec" },
	{ "list", dg__gen_cmd_list, true, "ops, the spec keys each takes, formats, the default set" },
	{ "cache", dg__gen_cmd_cache, true, "stat, verify, gc or clear the kernel cache" },
	{ "inspect", dg__gen_cmd_inspect, true, "check a bundle, or say which tile a spec runs with" },
	{ "tune", dg__gen_cmd_tune, true, "time candidate tiles on the GPU, record the winners" },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *to)
{
	fputs("usage: dragon-gen <command> [flags]\n"
	      "       dragon-gen --help | --version\n\n"
	      "Generates, compiles and checks dragon's specialized CUDA kernels.\n\n"
	      "Commands:\n",
	      to);
	for (size_t i = 0; i < N_COMMANDS; i++)
		fprintf(to, "  %-8s %s\n", commands[i].name, commands[i].summary);
	fputs("\n`dragon-gen <command> --help` describes each one.\n"
	      "Exit status: 0 ok, 1 failure, 2 usage error.\n"
	      "Environment: DRAGON_CACHE_DIR (kernel cache), DRAGON_TEMPLATE_DIR\n"
	      "(templates from a folder instead of the built-in ones), DRAGON_TUNE_DB\n"
	      "(tuning records: a file or folder, default <cache>/tune, above the\n"
	      "built-in ones; builtin: those alone; none: no records).\n",
	      to);
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
	dg__gen_json_finish(code);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno;
		return dg__gen_err(DG__GEN_FAIL, "writing output: %s",
				   e ? strerror(e) : "write error");
	}
	return code;
}

int main(int argc, char **argv)
{
	signal(SIGXFSZ, SIG_IGN);
	if (argc < 2) {
		usage(stderr);
		return DG__GEN_USAGE;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
	    strcmp(cmd, "help") == 0) {
		if (strcmp(cmd, "help") == 0 && argc > 2) {
			char help[] = "--help";
			char *sub[] = { argv[2], help, NULL };
			for (size_t i = 0; i < N_COMMANDS; i++)
				if (strcmp(argv[2], commands[i].name) == 0)
					return finish(commands[i].run(2, sub));
			return dg__gen_err(DG__GEN_USAGE,
					   "help: unknown command '%s'; see `dragon-gen --help`",
					   argv[2]);
		}
		usage(stdout);
		return finish(DG__GEN_OK);
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
		printf("dragon-gen %s (generator %s, NVRTC %s)\n", DG_VERSION,
		       DG_GENERATOR_VERSION, dg_nvrtc_version());
		return finish(DG__GEN_OK);
	}
	for (size_t i = 0; i < N_COMMANDS; i++) {
		if (strcmp(cmd, commands[i].name) != 0)
			continue;
		dg__gen_json_mode(commands[i].json && wants_json(argc - 1, argv + 1));
		return finish(commands[i].run(argc - 1, argv + 1));
	}
	if (cmd[0] == '-')
		return dg__gen_err(DG__GEN_USAGE,
				   "unknown flag %s before the command; see `dragon-gen --help`",
				   cmd);
	return dg__gen_err(DG__GEN_USAGE,
			   "unknown command '%s'; commands are build, render, list, cache, inspect, tune (see `dragon-gen --help`)",
			   cmd);
}
