/*
 * dragon eval's batches (eval_data.h): the validation split of a corpus
 * at seeded offsets, or the built-in deterministic stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/msg.h"
#include "cli/dragon/eval_data.h"

#define DEFAULT_T 512

dg_status dg__eval_data_open(dg__eval_data *d, const char *path, int vocab, int *t_inout, uint64_t seed,
			     char *msg, size_t size)
{
	char why[1024];
	memset(d, 0, sizeof(*d));
	dg_corpus_opts o = { .vocab = vocab };
	dg_status st = dg_corpus_open_with(path, &o, &d->corpus, why, sizeof(why));
	if (st)
		return dg__msgf(st, msg, size, "--data %s", why);
	const dg_corpus *c = d->corpus;
	const bool bytes = c->kind == DG_CORPUS_KIND_BYTES;
	uint64_t len = c->len - c->train_len;
	int t = *t_inout;
	if (!t)
		t = len > DEFAULT_T ? DEFAULT_T : len > 1 ? (int)(len - 1) : 1;
	if (len < (uint64_t)t + 1) {
		if (bytes) /* the split is n/10: t + 1 bytes need a file of 10·(t + 1) */
			st = dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				      "--data %s: %llu bytes, too short: eval reads rows of T+1 = %d bytes "
				      "from its last 10%% (%llu bytes), so it needs at least %llu bytes "
				      "(a longer file, or a smaller --time)",
				      path, (unsigned long long)c->len, t + 1, (unsigned long long)len,
				      (unsigned long long)(10 * ((uint64_t)t + 1)));
		else
			st = dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				      "--data %s: too short: eval reads rows of T+1 = %d tokens from its validation "
				      "split (%s), which holds %llu (more data, or a smaller --time)",
				      path, t + 1, c->split, (unsigned long long)len);
		dg__eval_data_close(d);
		return st;
	}
	d->len = (size_t)len;
	d->file_size = c->file_bytes;
	d->seed = seed;
	dg_rng_seed(&d->rng, seed);
	*t_inout = t;
	return DG_OK;
}

dg_status dg__eval_data_builtin(dg__eval_data *d, int k, int b, int t, uint64_t seed, char *msg,
				size_t size)
{
	memset(d, 0, sizeof(*d));
	size_t len = (size_t)k * (size_t)b * (size_t)t + 1;
	d->bytes = malloc(len);
	if (!d->bytes)
		return dg__msgf(DG_ERR_NOMEM, msg, size, "built-in data: out of memory (%zu bytes)", len);
	dg_rng r;
	dg_rng_seed(&r, seed);
	for (size_t i = 0; i < len; i++)
		d->bytes[i] = (uint8_t)(dg_rng_u64(&r) >> 56);
	d->len = len;
	d->builtin = true;
	d->seed = seed;
	return DG_OK;
}

void dg__eval_data_batch(dg__eval_data *d, int k, int b, int t, int32_t *idx, int32_t *tgt)
{
	if (d->corpus) {
		dg_corpus_batch(d->corpus, true, &d->rng, b, t, idx, tgt);
		return;
	}
	for (int row = 0; row < b; row++) {
		size_t off = ((size_t)k * (size_t)b + (size_t)row) * (size_t)t;
		for (int i = 0; i < t; i++) {
			idx[(size_t)row * t + i] = d->bytes[off + (size_t)i];
			tgt[(size_t)row * t + i] = d->bytes[off + (size_t)i + 1];
		}
	}
}

void dg__eval_data_close(dg__eval_data *d)
{
	dg_corpus_close(d->corpus);
	free(d->bytes);
	memset(d, 0, sizeof(*d));
}
