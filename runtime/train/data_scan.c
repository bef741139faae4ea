/*
 * The passes over a token corpus's every token (dragon/data.h): the scan
 * that holds them below the vocabulary, at open, and the digest a
 * checkpoint records. Both split the files into pieces of
 * DG__CORPUS_PIECE tokens and take them on every core (the calling thread
 * and one thread a further core, each taking the next piece until none is
 * left), so 10^9 tokens take seconds, not minutes; the results are the
 * pieces', combined in file order, the same on any number of cores.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/sha256.h"
#include "runtime/train/data_int.h"

#define MAX_THREADS 64
#define BLOCK 4096 /* tokens the scan tests at once, without a branch */

typedef struct piece {
	int file;
	size_t begin, n; /* tokens [begin, begin + n) of the file */
} piece;

typedef struct pass {
	const dg_corpus *c;
	piece *p;
	size_t np;
	atomic_size_t next; /* the next piece to take */
	bool digest;        /* the digest's pass, else the scan's */
	size_t *bad;        /* the scan: a piece's first token not below the
			     * vocabulary (its index in the file), SIZE_MAX none */
	uint8_t (*dig)[32]; /* the digest: a piece's SHA-256 */
} pass;

/* The first of tok's n uint16 tokens that is not below v, SIZE_MAX none:
 * whole blocks tested with no branch (so the compiler vectorizes them),
 * searched only where one holds such a token. */
static size_t first_bad(const uint8_t *tok, size_t n, uint32_t v)
{
	dg__corpus_file f = { .tok = tok, .width = 2 };
	for (size_t b = 0; b < n; b += BLOCK) {
		size_t m = n - b < BLOCK ? n - b : BLOCK;
		unsigned any = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		const uint16_t *p = (const uint16_t *)(const void *)tok + b; /* 2-aligned: a page, + 0 or 1024 */
		if (m == BLOCK)
			for (size_t i = 0; i < BLOCK; i++)
				any |= p[i] >= v;
		else
			for (size_t i = 0; i < m; i++)
				any |= p[i] >= v;
#else
		for (size_t i = 0; i < m; i++)
			any |= dg__corpus_tok(&f, b + i) >= v;
#endif
		if (any)
			for (size_t i = b; i < b + m; i++)
				if (dg__corpus_tok(&f, i) >= v)
					return i;
	}
	return SIZE_MAX;
}

static void *worker(void *arg)
{
	pass *ps = arg;
	for (;;) {
		size_t k = atomic_fetch_add(&ps->next, 1);
		if (k >= ps->np)
			return NULL;
		const piece *p = &ps->p[k];
		const dg__corpus_file *f = &ps->c->files->f[p->file];
		const uint8_t *at = f->tok + p->begin * f->width;
		if (ps->digest) {
			dg__sha256_digest(at, p->n * f->width, ps->dig[k]);
		} else {
			size_t i = first_bad(at, p->n, (uint32_t)ps->c->vocab);
			ps->bad[k] = i == SIZE_MAX ? SIZE_MAX : p->begin + i;
		}
	}
}

/* Runs the pass over the pieces on every core. */
static void run(pass *ps)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	size_t nt = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (size_t)cores;
	if (nt > ps->np)
		nt = ps->np ? ps->np : 1;
	pthread_t th[MAX_THREADS];
	size_t made = 0;
	/* a thread that cannot be made leaves its pieces to the others */
	for (size_t i = 1; i < nt; i++)
		if (pthread_create(&th[made], NULL, worker, ps) == 0)
			made++;
	worker(ps);
	for (size_t i = 0; i < made; i++)
		pthread_join(th[i], NULL);
}

/* The pieces of c's files (those of width 2 only for the scan). */
static dg_status pieces_of(const dg_corpus *c, bool digest, pass *ps, char *msg, size_t size)
{
	const struct dg_corpus_files *fs = c->files;
	size_t np = 0;
	for (int i = 0; i < fs->n; i++)
		np += (fs->f[i].n + DG__CORPUS_PIECE - 1) / DG__CORPUS_PIECE;
	memset(ps, 0, sizeof(*ps));
	ps->c = c;
	ps->digest = digest;
	ps->p = malloc((np ? np : 1) * sizeof(*ps->p));
	ps->bad = digest ? NULL : malloc((np ? np : 1) * sizeof(*ps->bad));
	ps->dig = digest ? malloc((np ? np : 1) * sizeof(*ps->dig)) : NULL;
	if (!ps->p || !(digest ? (void *)ps->dig : (void *)ps->bad)) {
		free(ps->p), free(ps->bad), free(ps->dig);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "out of memory (%zu pieces of tokens)", np);
	}
	for (int i = 0; i < fs->n; i++)
		for (size_t b = 0; b < fs->f[i].n; b += DG__CORPUS_PIECE)
			ps->p[ps->np++] = (piece){ i, b, fs->f[i].n - b < DG__CORPUS_PIECE ? fs->f[i].n - b
											 : DG__CORPUS_PIECE };
	atomic_init(&ps->next, 0);
	return DG_OK;
}

dg_status dg__corpus_scan(const dg_corpus *c, char *msg, size_t size)
{
	if (c->kind == DG_CORPUS_KIND_BYTES || c->vocab >= DG_CORPUS_MAX_VOCAB)
		return DG_OK; /* every token is below it */
	pass ps;
	dg_status st = pieces_of(c, false, &ps, msg, size);
	if (st)
		return st;
	run(&ps);
	for (size_t k = 0; k < ps.np && !st; k++) {
		if (ps.bad[k] == SIZE_MAX)
			continue;
		const dg__corpus_file *f = &c->files->f[ps.p[k].file];
		size_t i = ps.bad[k];
		st = dg__msgf(DG_ERR_CORRUPT, msg, size,
			      "%s: byte offset %llu: token %u is outside the vocabulary 0..%d (token %zu of the file; "
			      "a larger vocab takes it)",
			      f->path, (unsigned long long)f->off + 2ull * i, dg__corpus_tok(f, i), c->vocab - 1, i);
	}
	free(ps.p);
	free(ps.bad);
	return st;
}

dg_status dg_corpus_digest(const dg_corpus *c, char hex[65], char *msg, size_t msg_size)
{
	uint8_t d[32];
	if (!c || !hex)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_corpus_digest: NULL argument");
	if (c->kind == DG_CORPUS_KIND_BYTES) {
		dg__sha256_digest(c->bytes, c->len, d); /* the file's SHA-256, as it always was */
		dg__sha256_hex(d, hex);
		return DG_OK;
	}
	pass ps;
	dg_status st = pieces_of(c, true, &ps, msg, msg_size);
	if (st)
		return st;
	run(&ps);
	dg__sha256 s;
	dg__sha256_init(&s);
	size_t k = 0;
	for (int i = 0; i < c->files->n; i++) {
		const dg__corpus_file *f = &c->files->f[i];
		uint8_t head[9] = { f->role };
		for (int j = 0; j < 8; j++)
			head[1 + j] = (uint8_t)((uint64_t)f->n >> (8 * j));
		dg__sha256_update(&s, head, sizeof(head));
		for (; k < ps.np && ps.p[k].file == i; k++)
			dg__sha256_update(&s, ps.dig[k], 32);
	}
	dg__sha256_final(&s, d);
	dg__sha256_hex(d, hex);
	free(ps.p);
	free(ps.dig);
	return DG_OK;
}
