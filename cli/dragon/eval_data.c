/*
 * dragon eval's batches (eval_data.h): the validation split of a byte
 * file at seeded offsets, or the built-in deterministic stream.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/msg.h"
#include "cli/dragon/eval_data.h"

#define DEFAULT_T 512

dg_status dg__eval_data_open(dg__eval_data *d, const char *path, int *t_inout, uint64_t seed,
			     char *msg, size_t size)
{
	char why[1024];
	uint64_t n;
	FILE *f;
	memset(d, 0, sizeof(*d));
	dg_status st = dg__file_open_regular(path, &f, &n, why, sizeof(why));
	if (st)
		return dg__msgf(st, msg, size, "--data %s", why);
	uint64_t len = n / 10;
	int t = *t_inout;
	if (!t)
		t = len > DEFAULT_T ? DEFAULT_T : len > 1 ? (int)(len - 1) : 1;
	if (len < (uint64_t)t + 1) {
		fclose(f);
		/* the split is n/10: t + 1 bytes need a file of 10·(t + 1) */
		return dg__msgf(DG_ERR_INVALID_ARG, msg, size,
				"--data %s: %llu bytes, too short: eval reads rows of T+1 = %d bytes "
				"from its last 10%% (%llu bytes), so it needs at least %llu bytes "
				"(a longer file, or a smaller --time)",
				path, (unsigned long long)n, t + 1, (unsigned long long)len,
				(unsigned long long)(10 * ((uint64_t)t + 1)));
	}
	d->bytes = malloc((size_t)len);
	if (!d->bytes) {
		fclose(f);
		return dg__msgf(DG_ERR_NOMEM, msg, size, "--data %s: out of memory (%llu bytes)", path,
				(unsigned long long)len);
	}
	if (fseeko(f, (off_t)(n - len), SEEK_SET) != 0 || fread(d->bytes, 1, (size_t)len, f) != len) {
		int e = ferror(f) ? errno : EIO;
		fclose(f);
		dg__eval_data_close(d);
		return dg__msgf(DG_ERR_IO, msg, size, "--data %s: reading: %s", path, strerror(e));
	}
	fclose(f);
	d->len = (size_t)len;
	d->file_size = n;
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
	for (int row = 0; row < b; row++) {
		size_t off = d->builtin ? ((size_t)k * (size_t)b + (size_t)row) * (size_t)t
					: (size_t)(dg_rng_u64(&d->rng) % (d->len - (size_t)t));
		for (int i = 0; i < t; i++) {
			idx[(size_t)row * t + i] = d->bytes[off + (size_t)i];
			tgt[(size_t)row * t + i] = d->bytes[off + (size_t)i + 1];
		}
	}
}

void dg__eval_data_close(dg__eval_data *d)
{
	free(d->bytes);
	memset(d, 0, sizeof(*d));
}
