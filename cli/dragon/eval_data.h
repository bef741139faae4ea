/*
 * dragon eval — where its batches come from. Private to cli/dragon/.
 *
 *   --data D     a corpus as `dragon train --data` reads it (dragon/data.h
 *                dg_corpus_open_with), its tokens held below the model's
 *                vocabulary, which also says what a plain file holds
 *                (bytes for a vocabulary of 256, else uint16 tokens); its
 *                validation split is read (a byte file's last 10%: size
 *                / 10 bytes, rounded down). Row b of batch k starts at a
 *                seeded offset into it: dg_rng seeded with --seed, one
 *                dg_rng_u64() % (len − T) per row, in the order (k, b);
 *                targets are the next tokens (dg_corpus_batch's rows).
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

#include "dragon/data.h"
#include "dragon/rng.h"
#include "dragon/status.h"

typedef struct dg__eval_data {
	dg_corpus *corpus; /* --data (owned); NULL built-in */
	uint8_t *bytes;    /* the built-in stream (owned) */
	size_t len;        /* tokens of the validation split, or of the built-in stream */
	uint64_t file_size; /* the files' bytes; 0 built-in */
	bool builtin;
	uint64_t seed;
	dg_rng rng;      /* the offsets' stream (--data) */
} dg__eval_data;

/* The validation split of path for rows of t tokens below vocab:
 * dg_corpus_open_with's errors, DG_ERR_INVALID_ARG when its split is
 * shorter than t + 1 tokens (saying how many the data has and needs).
 * *t_inout 0: t is 512 capped to what the split allows. */
dg_status dg__eval_data_open(dg__eval_data *d, const char *path, int vocab, int *t_inout, uint64_t seed,
			     char *msg, size_t size);
/* The built-in stream for k batches of b×t. */
dg_status dg__eval_data_builtin(dg__eval_data *d, int k, int b, int t, uint64_t seed, char *msg,
				size_t size);
/* Batch k (called for k = 0, 1, ... in order) into idx and tgt (b×t). */
void dg__eval_data_batch(dg__eval_data *d, int k, int b, int t, int32_t *idx, int32_t *tgt);
void dg__eval_data_close(dg__eval_data *d);

#endif
