/*
 * dragon — train, evaluate and sample BDH models (train, sample, plot, eval,
 * devices).
 *
 * The entry point: global --help and --version, then dispatch to one
 * subcommand (cmd.h). Output written to stdout is checked at exit, so a
 * full disk or a closed pipe is a failure, not silence. SIGXFSZ is
 * ignored, so a write past the file-size limit (ulimit -f) fails with
 * EFBIG and is reported naming its file, as a full disk is, instead of
 * killing the process without a word. A command given
 * --json answers a failure with a JSON object on stdout too (util.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/dragon/cmd.h"
#include "cli/dragon/util.h"
#include "dragon/codegen.h"
#include "dragon/jit.h"

typedef struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} command;

static const command commands[] = {
	{ "train", dg__cli_cmd_train, "train a model on a corpus (AdamW, checkpoints, resume)" },
	{ "sample", dg__cli_cmd_sample, "generate text from a checkpoint (temperature, top-k, seeded)" },
	{ "plot", dg__cli_cmd_plot, "draw the loss curves of training logs to a PNG (gnuplot)" },
	{ "eval", dg__cli_cmd_eval, "the loss of a weights file on held-out bytes (and its gradients)" },
	{ "devices", dg__cli_cmd_devices, "the CUDA devices dragon can use (train, eval, sample: GPU 0)" },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *to)
{
	fputs("usage: dragon <command> [flags]\n"
	      "       dragon --help | --version\n\n"
	      "Trains, samples and evaluates BDH models with dragon's kernels (dragon-gen\n"
	      "builds them ahead of time).\n\n"
	      "Commands:\n",
	      to);
	for (size_t i = 0; i < N_COMMANDS; i++)
		fprintf(to, "  %-8s %s\n", commands[i].name, commands[i].summary);
	fputs("\n`dragon <command> --help` describes each one.\n"
	      "Exit status: 0 ok, 1 failure, 2 usage error.\n"
	      "Environment: DRAGON_CACHE_DIR (kernel cache), DRAGON_KERNELS (bundles to load).\n",
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
	dg__cli_json_finish(code);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		int e = errno;
		return dg__cli_err(DG__CLI_FAIL, DG_ERR_IO, "writing output: %s",
				   e ? strerror(e) : "write error");
	}
	return code;
}

int main(int argc, char **argv)
{
	signal(SIGXFSZ, SIG_IGN);
	if (argc < 2) {
		usage(stderr);
		return DG__CLI_USAGE;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		if (strcmp(cmd, "help") == 0 && argc > 2) {
			char help[] = "--help";
			char *sub[] = { argv[2], help, NULL };
			for (size_t i = 0; i < N_COMMANDS; i++)
				if (strcmp(argv[2], commands[i].name) == 0)
					return finish(commands[i].run(2, sub));
			return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
					   "help: unknown command '%s'; see `dragon --help`", argv[2]);
		}
		usage(stdout);
		return finish(DG__CLI_OK);
	}
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
		printf("dragon %s (generator %s, NVRTC %s)\n", DG_VERSION, DG_GENERATOR_VERSION,
		       dg_nvrtc_version());
		return finish(DG__CLI_OK);
	}
	for (size_t i = 0; i < N_COMMANDS; i++) {
		if (strcmp(cmd, commands[i].name) != 0)
			continue;
		dg__cli_json_mode(wants_json(argc - 1, argv + 1));
		return finish(commands[i].run(argc - 1, argv + 1));
	}
	if (cmd[0] == '-')
		return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
				   "unknown flag %s before the command; see `dragon --help`", cmd);
	return dg__cli_err(DG__CLI_USAGE, DG_ERR_INVALID_ARG,
			   "unknown command '%s'; commands are train, sample, plot, eval, devices (see `dragon --help`)", cmd);
}
