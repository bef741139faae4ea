/*
 * dragon — a training run's data: a corpus of tokens, its train and
 * validation splits, and seeded batches of rows drawn from either split.
 *
 * A corpus is one of three kinds (dragon/data.h dg_corpus_open_with says
 * how a --data names each):
 *   - bytes: a plain file whose bytes are the tokens (vocab 256); its
 *     first 90% trains, its last 10% validates;
 *   - llm.c's token shards: each a header of 256 int32 (magic 20240520,
 *     version 1, the token count, the rest 0) then that many uint16
 *     tokens, little-endian; shards named *_train_*.bin train and the
 *     *_val_*.bin ones beside them validate;
 *   - raw uint16 tokens (nanoGPT's train.bin and val.bin), little-endian.
 * Every token is checked against the vocabulary once, at open, and a file
 * that is cut short, a header that is not llm.c's, or a token outside the
 * vocabulary is refused naming the file and the byte offset.
 *
 * The splits are ranges of one stream of tokens: the files in order,
 * the train split's first; tokens [0, train_len) train and [train_len,
 * len) validate. A row may run from one file into the next one of its
 * split (llm.c's shards each start with an end-of-text token).
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

#include "export.h"
#include "rng.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_CORPUS_SHA256 "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"
#define DG_CORPUS_BYTES 5057198

/* llm.c's token shards (dev/data/data_common.py write_datafile) */
#define DG_SHARD_MAGIC 20240520
#define DG_SHARD_VERSION 1
#define DG_SHARD_HEADER_BYTES 1024 /* 256 int32 */
/* the vocabulary of llm.c's shards when none is given: GPT-2's 50257
 * tokens padded to a multiple of 128, as llm.c's model pads it */
#define DG_SHARD_VOCAB 50304
#define DG_CORPUS_MAX_VOCAB 65536 /* uint16 tokens */

typedef enum dg_corpus_kind {
	DG_CORPUS_KIND_BYTES,  /* a plain file of bytes */
	DG_CORPUS_KIND_SHARDS, /* llm.c's token shards */
	DG_CORPUS_KIND_TOKENS, /* raw uint16 tokens */
} dg_corpus_kind;

struct dg_corpus_files;

typedef struct dg_corpus {
	uint8_t *bytes;   /* a byte corpus: the whole file (owned); NULL otherwise */
	size_t len;       /* tokens, both splits */
	size_t train_len; /* tokens [0, train_len) train, [train_len, len) validate */
	char path[4096];  /* what was opened (a file, a folder, a list or a glob) */
	int vocab;        /* every token is below it: 256 for bytes */
	int kind;         /* dg_corpus_kind */
	int n_files;      /* files read, the train split's first */
	int n_val_files;  /* the last n_val_files validate; 0: the split is 90/10 */
	uint64_t file_bytes; /* the files' bytes together */
	char split[160];  /* how the split was made, for messages: "the last
			   * 10%", "val.bin", "3 val shards beside the train ones" */
	struct dg_corpus_files *files; /* the files, mapped (private) */
} dg_corpus;

typedef struct dg_corpus_opts {
	/* token ids are below it, each checked at open: 2..65536, or 0 for
	 * the data's own (bytes 256, llm.c's shards DG_SHARD_VOCAB). It also
	 * says what a plain file holds: bytes at 0 or 256, uint16 tokens at
	 * any other vocabulary. */
	int vocab;
} dg_corpus_opts;

/*
 * Opens a corpus; data names it as --data does:
 *   - a list of llm.c shards, comma-separated, each a path or a glob
 *     (a glob's files sorted by name), or one glob: every file must be a
 *     shard (a path that is there is a path, commas and * ? [ in its name
 *     or not);
 *   - a folder: train.bin (and val.bin) of raw uint16 tokens, else the
 *     llm.c shards in it (*_train_*.bin, *_val_*.bin);
 *   - a file: an llm.c shard when it starts with the shard magic or is
 *     named as llm.c names them (*_train_*.bin, *_val_*.bin); else raw
 *     uint16 tokens when o->vocab is neither 0 nor 256; else bytes.
 * The split: shards named *_val_* among those given validate; given only
 * *_train_* shards, the *_val_* shards beside them (the same folder and
 * prefix) validate; a train.bin's val.bin beside it validates; else the
 * last 10% of the tokens (len/10, rounded down) validates.
 * Files are mapped, not read (a byte file is read whole), and every
 * token is checked below the vocabulary, on every core (a few tenths of
 * a second for 10^8 tokens). Errors (one line, naming the file):
 * DG_ERR_NOT_FOUND for a missing path or a glob of no file, DG_ERR_IO
 * for one that is not a regular file (refused before a byte is read,
 * never waiting on a FIFO), DG_ERR_CORRUPT with the byte offset for a
 * file cut short (a header's count past its bytes, an odd size of uint16
 * tokens), a bad magic or version, and a token not below the vocabulary;
 * DG_ERR_INVALID_ARG for a vocab out of range or raw tokens without one.
 * o may be NULL (vocab 0). *out is NULL on failure.
 */
DG_API dg_status dg_corpus_open_with(const char *data, const dg_corpus_opts *o, dg_corpus **out, char *msg,
				     size_t msg_size);
/* dg_corpus_open_with(path, NULL, ...). */
DG_API dg_status dg_corpus_open(const char *path, dg_corpus **out, char *msg, size_t msg_size);
/* The built-in corpus: $DRAGON_CORPUS when set (there only), else the
 * install's share/dragon/shakespeare.txt, else data/shakespeare.txt,
 * with its digest checked. DG_ERR_NOT_FOUND naming the places and how to
 * set it up (scripts/corpus.sh) when it is in none; DG_ERR_CORRUPT when
 * its SHA-256 is not DG_CORPUS_SHA256. */
DG_API dg_status dg_corpus_builtin(dg_corpus **out, char *msg, size_t msg_size);
DG_API void dg_corpus_close(dg_corpus *c); /* NULL is fine */

/*
 * The corpus's digest, 64 hex digits into hex: what a checkpoint records
 * and a resume compares. A byte corpus: the SHA-256 of its bytes. A token
 * corpus: the SHA-256 of, for each file in order, its split (a byte, 0
 * train, 1 validate, the 90/10 split 2), its tokens (8 bytes,
 * little-endian) and the SHA-256 of each piece of 2^24 of its tokens
 * (their little-endian bytes; headers left out), hashed on every core.
 * DG_ERR_NOMEM when no thread could be made.
 */
DG_API dg_status dg_corpus_digest(const dg_corpus *c, char hex[65], char *msg, size_t msg_size);

/* Whether both splits hold a row of t tokens and its targets (t + 1
 * tokens): DG_ERR_INVALID_ARG naming the split, its tokens and the
 * tokens needed otherwise. */
DG_API dg_status dg_corpus_check(const dg_corpus *c, int t, char *msg, size_t msg_size);

/* A batch of b rows of t tokens from the train split (val false) or the
 * validation split: row r starts at offset dg_rng_u64(rng) % (split − t)
 * of the split, the draws in row order; idx[r·t + j] its tokens, tgt the
 * next ones. Deterministic in rng's state (a run's position is that state
 * and how many batches it drew). dg_corpus_check(c, t) must have passed. */
DG_API void dg_corpus_batch(const dg_corpus *c, bool val, dg_rng *rng, int b, int t, int32_t *idx,
			    int32_t *tgt);

#ifdef __cplusplus
}
#endif
#endif /* DRAGON_DATA_H */
