/*
 * dragon-gen — the subcommands. Each takes its argv (argv[0] is the
 * subcommand's name), prints its own --help, and returns the process exit
 * code (util.h: 0 ok, 1 failure, 2 usage). Private to codegen/gen/.
 */
#ifndef DG_GEN_GEN_H
#define DG_GEN_GEN_H

int dg__gen_cmd_build(int argc, char **argv);
int dg__gen_cmd_render(int argc, char **argv);
int dg__gen_cmd_list(int argc, char **argv);
int dg__gen_cmd_cache(int argc, char **argv);
int dg__gen_cmd_inspect(int argc, char **argv);

#endif
