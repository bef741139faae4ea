/*
 * The device a command of dragon (train, eval, sample) runs a model on.
 * Private to cli/dragon/.
 */
#ifndef DG_CLI_DRAGON_DEVICE_H
#define DG_CLI_DRAGON_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "dragon/model.h"
#include "dragon/runtime.h"

/* The device a model of c runs on: GPU `ordinal` (opened into *dev, its
 * name into name) unless cpu or there is none; a recipe the CPU model
 * cannot run without one is refused. Without a GPU, `next` (NULL: none)
 * is what to run instead: it ends the refusal, and when it is given a
 * recipe the CPU model runs is run there with a note on stderr saying so
 * and why there is no GPU. Returns the exit code (reported). */
int dg__cli_device_of(bool cpu, const dg_model_config *c, int ordinal, dg_device **dev, char *name,
		      size_t size, const char *next);

#endif
