/*
 * The step bench's rows from other programs (bench/step.c): the floor of
 * each node kind (bench/step_floor.py), the PyTorch anchor's training step
 * (bench/torch_bdh_step.py), any command that prints JSON lines. Names
 * start with bs_. Nothing here touches the GPU.
 */
#ifndef DG_BENCH_STEP_ROWS_H
#define DG_BENCH_STEP_ROWS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "dragon/model.h"

/* Runs cmd through the shell, its stderr into a temporary file that is
 * then copied to ours; each line of its stdout that is a JSON object is
 * appended to out (the caller's array, which owns them). true when it
 * exited 0 having printed one and no {"error": ...}; else why (size bytes)
 * says what went wrong: that error, or its stderr's last line ("sh: 1:
 * python3: not found", a Python exception) and how it ended ("(exit 1)"). */
bool bs_run_json(const char *cmd, cJSON *out, char *why, size_t size);

/* cmd with the model's shape (c) and B, T as --layers --embd --heads
 * --neurons --vocab --batch --time: bench/step_floor.py's object (the
 * caller owns it: {"presets": {preset: {kind: {count, floor_ms, how}}},
 * ...}), or NULL with why. */
cJSON *bs_run_floor(const char *cmd, const dg_model_config *c, int B, int T, char *why, size_t size);

/* A preset's row ({preset, breakdown: [{what, count, ms}]}) against the
 * floor (bs_run_floor's; NULL: floor_why, if any, becomes the row's
 * floor_error): each breakdown entry whose kind the floor has for that
 * preset, with the same count of nodes, gains floor_ms, floor_how and
 * ratio (ms / floor_ms); any other gains floor_how saying why it has no
 * floor. The row gains floor_ms, the sum, when every entry has one, else
 * floor_error naming those without. */
void bs_attach_floor(cJSON *row, const cJSON *floor_doc, const char *floor_why);

/* A row's breakdown on stderr: each kind's count, time, share, floor,
 * ratio and how the floor is made. */
void bs_print_breakdown(const cJSON *row);

/* cmd with the model's shape and B, T (--layers --embd --heads --neurons
 * --batch --time) and --steps reps: the whole training step of the
 * PyTorch anchor as a row (the caller owns it) {impl "torch.compile",
 * preset "bf16", mode "train", B, T, step_ms, peak_bytes, torch}, or with
 * "error" (why) in place of the numbers. */
cJSON *bs_run_anchor(const char *cmd, const dg_model_config *c, int B, int T, int reps);

/* On stderr, for each of rows' dragon training steps (mode train_graph):
 * "torch.compile train step X ms; dragon P train step Y ms: ratio X/Y";
 * nothing when the anchor has no step_ms. */
void bs_print_anchor(const cJSON *rows, const cJSON *anchor);

#endif
