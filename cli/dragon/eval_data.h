/*
 * dragon eval — where its batches come from. Private to cli/dragon/.
 *
 *   --data FILE  bytes are tokens (vocab 256); the last 10% of the file
 *                (size / 10 bytes, rounded down) is the validation split.
 *                Row b of batch k starts at a seeded offset into it:
 *                dg_rng seeded with --seed, one dg_rng_u64() % (len − T)
 *                per row, in the order (k, b); targets are the next bytes.
 *   built-in     no corpus yet: a stream of K·B·T + 1 bytes, byte i the
 *                top 8 bits of the i-th dg_rng_u64() of --seed; row b of
 *                batch k reads it from (k·B + b)·T. (A later issue puts the
 *                built-in corpus here.)
 */
#ifndef DG_CLI_EVAL_DATA_H
#define DG_CLI_EVAL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/rng.h"
#include "dragon/status.h"

typedef struct dg__eval_data {
	uint8_t *bytes;   /* the validation split, or the built-in stream (owned) */
	size_t len;
	uint64_t file_size; /* the file's bytes; 0 built-in */
	bool builtin;
	uint64_t seed;
	dg_rng rng;      /* the offsets' stream (--data) */
} dg__eval_data;

/* The validation split of path for rows of t tokens: DG_ERR_NOT_FOUND /
 * DG_ERR_IO for the file, DG_ERR_INVALID_ARG when its split is shorter
 * than t + 1 bytes (saying how many the file has and needs). *t_inout 0:
 * t is 512 capped to what the split allows. */
dg_status dg__eval_data_open(dg__eval_data *d, const char *path, int *t_inout, uint64_t seed,
			     char *msg, size_t size);
/* The built-in stream for k batches of b×t. */
dg_status dg__eval_data_builtin(dg__eval_data *d, int k, int b, int t, uint64_t seed, char *msg,
				size_t size);
/* Batch k (called for k = 0, 1, ... in order) into idx and tgt (b×t). */
void dg__eval_data_batch(dg__eval_data *d, int k, int b, int t, int32_t *idx, int32_t *tgt);
void dg__eval_data_close(dg__eval_data *d);

#endif
