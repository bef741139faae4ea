/*
 * dragon-gen — build CUDA kernel bundles ahead of time.
 *
 * The entry point: the program's subcommands (gen.h), handed to the
 * programs' shared main (cli/common/cli.h: --help, --version, a checked
 * stdout, SIGXFSZ ignored). A command that takes --json and was given it
 * answers a failure with a JSON object on stdout too.
 */
#include "cli/common/cli.h"
#include "cli/dragon-gen/gen.h"

static const dg__cli_command commands[] = {
	{ "build", dg__gen_cmd_build, true, "compile specs into a kernel bundle (cubins + manifest.json)" },
	{ "render", dg__gen_cmd_render, false, "print the CUDA source (or canonical text) of one spec" },
	{ "list", dg__gen_cmd_list, true, "ops, the spec keys each takes, formats, the default set" },
	{ "cache", dg__gen_cmd_cache, true, "stat, verify, gc or clear the kernel cache" },
	{ "inspect", dg__gen_cmd_inspect, true, "check a bundle, or say which tile a spec runs with" },
	{ "tune", dg__gen_cmd_tune, true, "time candidate tiles on the GPU, record the winners" },
};

static const dg__cli_program program = {
	.name = "dragon-gen",
	.about = "Generates, compiles and checks dragon's specialized CUDA kernels.",
	.environment = "Environment: DRAGON_CACHE_DIR (kernel cache), DRAGON_TEMPLATE_DIR\n"
		       "(templates from a folder instead of the built-in ones), DRAGON_TUNE_DB\n"
		       "(tuning records: a file or folder, default <cache>/tune, above the\n"
		       "built-in ones; builtin: those alone; none: no records).\n",
	.commands = commands,
	.n_commands = sizeof(commands) / sizeof(commands[0]),
};

int main(int argc, char **argv)
{
	return dg__cli_main(&program, argc, argv);
}
