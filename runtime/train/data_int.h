/*
 * A corpus's files (dragon/data.h), between data.c (the corpus, its
 * splits and batches), data_files.c (what a --data names, each file
 * opened, its header checked, mapped) and data_scan.c (every token held
 * below the vocabulary, and the digest, both over pieces of files on
 * every core). Private to runtime/train/.
 */
#ifndef DG_TRAIN_DATA_INT_H
#define DG_TRAIN_DATA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dragon/data.h"

/* Tokens a piece: the unit of the scan's and the digest's work (the
 * digest's definition: changing it changes every token corpus's digest). */
#define DG__CORPUS_PIECE ((size_t)1 << 24)

typedef struct dg__corpus_file {
	char *path;          /* as found (owned) */
	void *map;           /* the whole file mapped read-only; NULL for bytes or none */
	size_t map_bytes;
	const uint8_t *tok;  /* its first token */
	size_t n;            /* its tokens */
	size_t start;        /* its first token's index in the corpus's stream */
	uint32_t off;        /* byte offset of its first token in the file: a
			      * shard's header, else 0 */
	uint8_t width;       /* bytes a token: 1 (bytes) or 2 (uint16, little-endian) */
	uint8_t role;        /* 0 train, 1 validate, 2 both (the 90/10 split) */
} dg__corpus_file;

struct dg_corpus_files {
	int n;
	dg__corpus_file f[]; /* n of them, the train split's first */
};

/* The token at index i of file f. */
static inline uint32_t dg__corpus_tok(const dg__corpus_file *f, size_t i)
{
	if (f->width == 1)
		return f->tok[i];
	return (uint32_t)f->tok[2 * i] | (uint32_t)f->tok[2 * i + 1] << 8;
}

/* Opens what data names (dg_corpus_open_with's rules) into c: its files
 * mapped and checked, its split, kind, vocab and path set; every token
 * not yet scanned. */
dg_status dg__corpus_files_open(dg_corpus *c, const char *data, int vocab, char *msg, size_t size);
void dg__corpus_files_close(struct dg_corpus_files *fs); /* NULL is fine */

/* Holds every token of c's files below c->vocab, on every core: the
 * first that is not (in file order) refused as DG_ERR_CORRUPT naming its
 * file and byte offset. */
dg_status dg__corpus_scan(const dg_corpus *c, char *msg, size_t size);

#endif
