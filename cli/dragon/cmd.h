/*
 * dragon — the subcommands. Each takes its argv (argv[0] is the
 * subcommand's name), prints its own --help, and returns the process exit
 * code (util.h: 0 ok, 1 failure, 2 usage). Private to cli/dragon/.
 */
#ifndef DG_CLI_CMD_H
#define DG_CLI_CMD_H

int dg__cli_cmd_eval(int argc, char **argv);
int dg__cli_cmd_train(int argc, char **argv);
int dg__cli_cmd_plot(int argc, char **argv);
int dg__cli_cmd_sample(int argc, char **argv);
int dg__cli_cmd_devices(int argc, char **argv);

#endif
