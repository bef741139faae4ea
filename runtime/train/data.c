/*
 * A training run's data (dragon/data.h): a corpus opened (its files by
 * data_files.c, its tokens scanned by data_scan.c), the built-in one
 * found and held to its digest, its split checked against a row, and
 * seeded batches of rows from the stream of its files.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/msg.h"
#include "base/sha256.h"
#include "dragon/data.h"
#include "runtime/train/data_int.h"

void dg_corpus_close(dg_corpus *c)
{
	if (!c)
		return;
	dg__corpus_files_close(c->files);
	free(c->bytes);
	free(c);
}

dg_status dg_corpus_open_with(const char *data, const dg_corpus_opts *o, dg_corpus **out, char *msg,
			      size_t msg_size)
{
	if (!data || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_corpus_open: NULL argument");
	*out = NULL;
	dg_corpus *c = calloc(1, sizeof(*c));
	if (!c)
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "out of memory");
	dg_status st = dg__corpus_files_open(c, data, o ? o->vocab : 0, msg, msg_size);
	if (!st)
		st = dg__corpus_scan(c, msg, msg_size);
	if (st) {
		dg_corpus_close(c);
		return st;
	}
	*out = c;
	return DG_OK;
}

dg_status dg_corpus_open(const char *path, dg_corpus **out, char *msg, size_t msg_size)
{
	return dg_corpus_open_with(path, NULL, out, msg, msg_size);
}

/* The built-in corpus in the install's data folder: DG_DATA_FROM_LIB
 * (CMake's data folder, relative to the folder it installs libdragon in;
 * the program's folder for a static libdragon) from the folder this code
 * was loaded from, so an install found there relocates with its prefix.
 * Written into path as an absolute path without "..", or "" when the
 * loader cannot say where that is. */
static void install_corpus(char *path, size_t size)
{
	Dl_info info;
	char from[PATH_MAX], dir[PATH_MAX];

	path[0] = 0;
	if (!dladdr((void *)dg_corpus_builtin, &info) || !info.dli_fname || !info.dli_fname[0])
		return;
	const char *slash = strrchr(info.dli_fname, '/');
	if (!slash)
		snprintf(from, sizeof(from), ".");
	else /* its folder; "/" for "/lib.so" */
		snprintf(from, sizeof(from), "%.*s", slash == info.dli_fname ? 1 : (int)(slash - info.dli_fname),
			 info.dli_fname);
	if (!realpath(from, dir))
		return;
	const char *rel = DG_DATA_FROM_LIB;
	while (strncmp(rel, "../", 3) == 0) { /* up from the folder, which is resolved */
		char *up = strrchr(dir, '/');
		if (!up)
			return;
		up[up == dir] = 0; /* "/x" goes up to "/" */
		rel += 3;
	}
	snprintf(path, size, "%s%s%s/shakespeare.txt", dir, strcmp(dir, "/") ? "/" : "", rel);
}

dg_status dg_corpus_builtin(dg_corpus **out, char *msg, size_t msg_size)
{
	if (!out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_corpus_builtin: NULL argument");
	*out = NULL;
	const char *env = getenv("DRAGON_CORPUS");
	char installed[PATH_MAX + 64];
	const char *path;
	dg_corpus *c;
	dg_status st;
	if (env && env[0]) {
		path = env;
		st = dg_corpus_open(path, &c, msg, msg_size);
		if (st == DG_ERR_NOT_FOUND)
			return dg__msgf(st, msg, msg_size,
					"the built-in corpus is not at %s ($DRAGON_CORPUS): run scripts/corpus.sh (or give a file with --data)",
					path);
	} else {
		install_corpus(installed, sizeof(installed));
		path = installed;
		st = installed[0] ? dg_corpus_open(path, &c, msg, msg_size) : DG_ERR_NOT_FOUND;
		if (st == DG_ERR_NOT_FOUND) {
			path = "data/shakespeare.txt";
			st = dg_corpus_open(path, &c, msg, msg_size);
		}
		char cwd[PATH_MAX];
		if (st == DG_ERR_NOT_FOUND)
			return dg__msgf(st, msg, msg_size,
					"the built-in corpus is in none of $DRAGON_CORPUS (unset), %s%sdata/shakespeare.txt (under %s): run scripts/corpus.sh (or set $DRAGON_CORPUS, or give a file with --data)",
					installed, installed[0] ? ", " : "", getcwd(cwd, sizeof(cwd)) ? cwd : ".");
	}
	if (st)
		return st;
	char hex[65] = "";
	if (c->kind == DG_CORPUS_KIND_BYTES)
		st = dg_corpus_digest(c, hex, msg, msg_size);
	if (!st && strcmp(hex, DG_CORPUS_SHA256) != 0)
		st = dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
			      "%s: %zu %s of SHA-256 %s, not the built-in corpus (%d bytes, %s): run scripts/corpus.sh again",
			      path, c->len, c->kind == DG_CORPUS_KIND_BYTES ? "bytes" : "tokens",
			      hex[0] ? hex : "(not computed)", DG_CORPUS_BYTES, DG_CORPUS_SHA256);
	if (st) {
		dg_corpus_close(c);
		return st;
	}
	*out = c;
	return DG_OK;
}

dg_status dg_corpus_check(const dg_corpus *c, int t, char *msg, size_t msg_size)
{
	if (!c || t < 1)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_corpus_check: %s", c ? "t < 1" : "NULL corpus");
	size_t need = (size_t)t + 1, val = c->len - c->train_len;
	const char *unit = c->kind == DG_CORPUS_KIND_BYTES ? "bytes" : "tokens";
	const bool tail = c->n_val_files == 0; /* the 90/10 split */
	if (c->train_len < need)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: its train split (%s) is %zu %s; rows of %d tokens need %zu", c->path,
				tail ? "the first 90%" : "the train files", c->train_len, unit, t, need);
	if (val < need && tail)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: its validation split (the last 10%%) is %zu %s; rows of %d tokens need %zu (a file of at least %zu %s)",
				c->path, val, unit, t, need, need * 10, unit);
	if (val < need)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: its validation split (%s) is %zu %s; rows of %d tokens need %zu", c->path,
				c->split, val, unit, t, need);
	return DG_OK;
}

/* Tokens [pos, pos + n) of c's stream into out: from the file holding
 * pos on, into the next ones. */
static void tokens_at(const dg_corpus *c, size_t pos, int n, int32_t *out)
{
	const struct dg_corpus_files *fs = c->files;
	int lo = 0, hi = fs->n - 1; /* the last file starting at or before pos */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (fs->f[mid].start <= pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	const dg__corpus_file *f = &fs->f[lo];
	size_t o = pos - f->start;
	for (int j = 0; j < n; j++) {
		while (o >= f->n) { /* the next file (empty ones skipped) */
			f++;
			o = 0;
		}
		out[j] = (int32_t)dg__corpus_tok(f, o++);
	}
}

void dg_corpus_batch(const dg_corpus *c, bool val, dg_rng *rng, int b, int t, int32_t *idx,
		     int32_t *tgt)
{
	const size_t first = val ? c->train_len : 0;
	const size_t len = val ? c->len - c->train_len : c->train_len;
	for (int r = 0; r < b; r++) {
		size_t o = first + (size_t)(dg_rng_u64(rng) % (uint64_t)(len - (size_t)t));
		int32_t *ir = idx + (size_t)r * t, *tr = tgt + (size_t)r * t;
		if (c->bytes) { /* one file of bytes: the row as it always was read */
			const uint8_t *s = c->bytes + o;
			for (int j = 0; j < t; j++) {
				ir[j] = s[j];
				tr[j] = s[j + 1];
			}
			continue;
		}
		tokens_at(c, o, t, ir);
		memcpy(tr, ir + 1, (size_t)(t - 1) * sizeof(*tr));
		tokens_at(c, o + (size_t)t, 1, tr + t - 1);
	}
}
