/*
 * dragon — a training run's data: a corpus of bytes (bytes are tokens,
 * vocab 256), its first 90% to train and its last 10% to validate, and
 * seeded batches of rows drawn from either split.
 *
 * The built-in corpus is Shakespeare's complete works as scripts/corpus.sh
 * assembles it (5,057,198 bytes, SHA-256 DG_CORPUS_SHA256); it is found at
 * $DRAGON_CORPUS, else in the install's data folder (share/dragon/ of the
 * prefix libdragon is installed in, where `cmake --install` puts a corpus
 * set up in the source tree), else at data/shakespeare.txt under the
 * working folder, and held to its digest.
 */
#ifndef DRAGON_DATA_H
#define DRAGON_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_CORPUS_SHA256 "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"
#define DG_CORPUS_BYTES 5057198

typedef struct dg_corpus {
	uint8_t *bytes;   /* the whole file (owned) */
	size_t len;
	size_t train_len; /* bytes [0, train_len) train, [train_len, len) validate:
			   * train_len = len − len/10 */
	char path[4096];  /* where it was read */
} dg_corpus;

/* Reads path whole. DG_ERR_NOT_FOUND / DG_ERR_IO naming it; a path that
 * is not a regular file (a directory, a FIFO, a socket, a device) is
 * DG_ERR_IO saying which, refused before anything is read and without
 * waiting on a FIFO for a writer. */
dg_status dg_corpus_open(const char *path, dg_corpus **out, char *msg, size_t msg_size);
/* The built-in corpus: $DRAGON_CORPUS when set (there only), else the
 * install's share/dragon/shakespeare.txt, else data/shakespeare.txt,
 * with its digest checked. DG_ERR_NOT_FOUND naming the places and how to
 * set it up (scripts/corpus.sh) when it is in none; DG_ERR_CORRUPT when
 * its SHA-256 is not DG_CORPUS_SHA256. */
dg_status dg_corpus_builtin(dg_corpus **out, char *msg, size_t msg_size);
void dg_corpus_destroy(dg_corpus *c); /* NULL is fine */

/* Whether both splits hold a row of t tokens and its targets (t + 1
 * bytes): DG_ERR_INVALID_ARG naming the split, its bytes and the bytes
 * needed otherwise. */
dg_status dg_corpus_check(const dg_corpus *c, int t, char *msg, size_t msg_size);

/* A batch of b rows of t tokens from the train split (val false) or the
 * validation split: row r starts at offset dg_rng_u64(rng) % (split − t)
 * of the split, the draws in row order; idx[r·t + j] its bytes, tgt the
 * next ones. Deterministic in rng's state (a run's position is that state
 * and how many batches it drew). dg_corpus_check(c, t) must have passed. */
void dg_corpus_batch(const dg_corpus *c, bool val, dg_rng *rng, int b, int t, int32_t *idx,
		     int32_t *tgt);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_DATA_H */
