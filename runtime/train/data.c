/*
 * A training run's data (dragon/data.h): the corpus read whole, its
 * 90/10 split, the built-in one found and held to its digest, and seeded
 * batches of rows.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/msg.h"
#include "base/sha256.h"
#include "dragon/data.h"

void dg_corpus_destroy(dg_corpus *c)
{
	if (!c)
		return;
	free(c->bytes);
	free(c);
}

dg_status dg_corpus_open(const char *path, dg_corpus **out, char *msg, size_t msg_size)
{
	if (!path || !out)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size, "dg_corpus_open: NULL argument");
	*out = NULL;
	FILE *f;
	uint64_t n;
	dg_status st = dg__file_open_regular(path, &f, &n, msg, msg_size);
	if (st)
		return st;
	dg_corpus *c = calloc(1, sizeof(*c));
	if (!c || n >= SIZE_MAX) {
		fclose(f);
		free(c);
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "%s: %llu bytes: out of memory", path,
				(unsigned long long)n);
	}
	c->len = (size_t)n;
	c->bytes = malloc(c->len + 1);
	if (!c->bytes) {
		fclose(f);
		free(c);
		return dg__msgf(DG_ERR_NOMEM, msg, msg_size, "%s: %zu bytes: out of memory", path, (size_t)n);
	}
	size_t got = fread(c->bytes, 1, c->len, f);
	fclose(f);
	if (got != c->len) {
		dg_corpus_destroy(c);
		return dg__msgf(DG_ERR_IO, msg, msg_size, "%s: read %zu of %zu bytes", path, got, (size_t)n);
	}
	c->train_len = c->len - c->len / 10;
	snprintf(c->path, sizeof(c->path), "%s", path);
	*out = c;
	return DG_OK;
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
	uint8_t d[32];
	char hex[65];
	dg__sha256_digest(c->bytes, c->len, d);
	dg__sha256_hex(d, hex);
	if (strcmp(hex, DG_CORPUS_SHA256) != 0) {
		st = dg__msgf(DG_ERR_CORRUPT, msg, msg_size,
			      "%s: %zu bytes of SHA-256 %s, not the built-in corpus (%d bytes, %s): run scripts/corpus.sh again",
			      c->path, c->len, hex, DG_CORPUS_BYTES, DG_CORPUS_SHA256);
		dg_corpus_destroy(c);
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
	if (c->train_len < need)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: its train split (the first 90%%) is %zu bytes; rows of %d tokens need %zu", c->path,
				c->train_len, t, need);
	if (val < need)
		return dg__msgf(DG_ERR_INVALID_ARG, msg, msg_size,
				"%s: its validation split (the last 10%%) is %zu bytes; rows of %d tokens need %zu (a file of at least %zu bytes)",
				c->path, val, t, need, need * 10);
	return DG_OK;
}

void dg_corpus_batch(const dg_corpus *c, bool val, dg_rng *rng, int b, int t, int32_t *idx,
		     int32_t *tgt)
{
	const uint8_t *s = val ? c->bytes + c->train_len : c->bytes;
	size_t len = val ? c->len - c->train_len : c->train_len;
	for (int r = 0; r < b; r++) {
		size_t o = (size_t)(dg_rng_u64(rng) % (uint64_t)(len - (size_t)t));
		for (int j = 0; j < t; j++) {
			idx[(size_t)r * t + j] = s[o + j];
			tgt[(size_t)r * t + j] = s[o + j + 1];
		}
	}
}
