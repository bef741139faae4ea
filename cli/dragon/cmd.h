/*
 * dragon — the subcommands. Each takes its argv (argv[0] is the
 * subcommand's name), prints its own --help, and returns the process exit
 * code (cli/common/cli.h: 0 ok, 1 failure, 2 usage). Private to
 * cli/dragon/.
 */
#ifndef DG_CLI_CMD_H
#define DG_CLI_CMD_H

int dg__cli_cmd_eval(int argc, char **argv);
int dg__cli_cmd_train(int argc, char **argv);
int dg__cli_cmd_plot(int argc, char **argv);
int dg__cli_cmd_sample(int argc, char **argv);
int dg__cli_cmd_devices(int argc, char **argv);

/* dragon train --gpus N (launch.c): runs argv (the subcommand's) as N
 * ranks, each this program with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
 * and MASTER_PORT set; out_dir names the newest checkpoint when one fails.
 * Returns the exit code. */
int dg__cli_launch(int argc, char **argv, int n, const char *out_dir);

#endif
