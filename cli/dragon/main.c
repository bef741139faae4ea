/*
 * dragon — train, evaluate and sample BDH models (train, sample, plot, eval,
 * devices).
 *
 * The entry point: the program's subcommands (cmd.h), handed to the
 * programs' shared main (cli/common/cli.h: --help, --version, a checked
 * stdout, SIGXFSZ ignored). A command given --json answers a failure with
 * a JSON object on stdout too.
 */
#include "cli/common/cli.h"
#include "cli/dragon/cmd.h"

static const dg__cli_command commands[] = {
	{ "train", dg__cli_cmd_train, true, "train a model on a corpus (AdamW, checkpoints, resume)" },
	{ "sample", dg__cli_cmd_sample, true, "generate text from a checkpoint (temperature, top-k, seeded)" },
	{ "plot", dg__cli_cmd_plot, true, "draw the loss curves of training logs to a PNG (gnuplot)" },
	{ "eval", dg__cli_cmd_eval, true, "the loss of a weights file on held-out bytes (and its gradients)" },
	{ "devices", dg__cli_cmd_devices, true, "the CUDA devices dragon can use (train, eval, sample: GPU 0)" },
};

static const dg__cli_program program = {
	.name = "dragon",
	.about = "Trains, samples and evaluates BDH models with dragon's kernels (dragon-gen\n"
		 "builds them ahead of time).",
	.environment = "Environment: DRAGON_CACHE_DIR (kernel cache), DRAGON_KERNELS (bundles to load).\n",
	.commands = commands,
	.n_commands = sizeof(commands) / sizeof(commands[0]),
};

int main(int argc, char **argv)
{
	return dg__cli_main(&program, argc, argv);
}
